"""``drgym mcp``: the local engine as an MCP server (stdio or streamable HTTP).

Registered on the root app by :func:`register`. The engine is opened exactly as ``drgym
serve`` opens it (:func:`drgym.cli.serve.load_backend`, same settings and ``DRGYM_*``
environment variables); the tools are :func:`drgym.server.mcp.create_mcp_server`'s.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Optional

import typer

log = logging.getLogger(__name__)

TRANSPORTS = ("stdio", "http")


def mcp(
    transport: str = typer.Option("stdio", "--transport", help="stdio (the client starts this command and talks over "
                                  "its stdin/stdout) or http (streamable HTTP at http://HOST:PORT/mcp)."),
    corpus: Optional[str] = typer.Option(None, help="Named corpus or corpus path to serve (env DRGYM_CORPUS; default wiki-default)."),
    method: Optional[str] = typer.Option(None, help="dense, bm25 or hybrid (env DRGYM_METHOD; default: the engine's)."),
    index_dir: Optional[str] = typer.Option(None, "--index-dir", help="Serve this built index folder (or index name) instead of --corpus."),
    encoder: Optional[str] = typer.Option(None, help="Encoder name or path; must match the index (default: the index's)."),
    encoder_backend: Optional[str] = typer.Option(None, "--encoder-backend", help="Query encoder runtime: onnx-int8 (default on the CPU), onnx or torch (float32; default on a GPU), as drgym serve's (env DRGYM_ENCODER_BACKEND)."),
    host: Optional[str] = typer.Option(None, help="Address to bind with --transport http (env DRGYM_HOST; default 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, help="TCP port with --transport http (env DRGYM_PORT; default 8000)."),
    path: str = typer.Option("/mcp", "--path", help="Endpoint path with --transport http."),
    max_k: Optional[int] = typer.Option(None, "--max-k", help="Largest k the search tool accepts (default 100)."),
    collapse: Optional[str] = typer.Option(None, "--collapse", help="What search returns: document (k distinct documents, best passage each; default) or passage (k best passages)."),
    log_level: Optional[str] = typer.Option(None, "--log-level", help="uvicorn log level with --transport http (default warning)."),
    api_keys: Optional[str] = typer.Option(None, "--api-keys", help="With --transport http: comma-separated keys, one of which every request must send in x-api-key, else 401 (env DRGYM_API_KEYS, as drgym serve; default: no auth, and a warning on a non-loopback --host)."),
    allowed_hosts: Optional[str] = typer.Option(None, "--allowed-hosts", envvar="DRGYM_ALLOWED_HOSTS", help="With --transport http: comma-separated Host header values accepted besides the loopback names and --host (e.g. search.example.org, or search.example.org:8000 for one port); any other Host is answered 421."),
    allowed_origins: Optional[str] = typer.Option(None, "--allowed-origins", envvar="DRGYM_ALLOWED_ORIGINS", help="With --transport http: comma-separated browser origins accepted besides http(s):// of the accepted hosts (e.g. https://app.example.org); any other Origin is answered 403."),
) -> None:
    """Serve a local index as MCP tools: search(query, k), get_document(docid) and fetch(url).

    The rankings, limits and errors are drgym serve's. With --transport stdio nothing but
    the protocol goes to stdout (messages go to stderr). With --transport http every
    request's Host and Origin headers are checked (loopback names, --host and
    --allowed-hosts / --allowed-origins), and with --api-keys its x-api-key. Exits with
    status 2 and a one-line message when the index is missing, corrupt or was built with
    another encoder.
    """
    from pydantic import ValidationError

    from drgym.cli.serve import check_bindable_or_exit, load_backend
    from drgym.errors import DrgymError
    from drgym.search.wire import ServerSettings

    if transport not in TRANSPORTS:
        typer.echo(f"drgym mcp: error: --transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}.", err=True)
        raise typer.Exit(2)
    if not path.startswith("/"):
        typer.echo(f"drgym mcp: error: --path must start with '/', got {path!r}.", err=True)
        raise typer.Exit(2)
    if transport == "stdio" and api_keys is not None:
        typer.echo("drgym mcp: error: --api-keys applies to --transport http (a stdio server talks only to the "
                   "client that started it).", err=True)
        raise typer.Exit(2)
    given = dict(corpus=corpus, method=method, index_dir=index_dir, encoder=encoder, encoder_backend=encoder_backend,
                 host=host, port=port,
                 max_k=max_k, collapse=collapse, log_level=log_level, api_keys=api_keys)
    try:
        settings = ServerSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        typer.echo(f"drgym mcp: error: invalid settings: {msgs}", err=True)
        raise typer.Exit(2) from None
    if transport == "http":
        from drgym.server.mcp import is_loopback, transport_security

        try:
            accepted = [h for h in transport_security(settings.host, allowed_hosts, allowed_origins).allowed_hosts
                        if not h.endswith(":*")]
        except DrgymError as e:
            typer.echo(f"drgym mcp: error: {e}", err=True)
            raise typer.Exit(2) from None
        if not settings.key_set() and not is_loopback(settings.host):
            typer.echo(f"drgym mcp: WARNING: listening on {settings.host} without --api-keys: anyone who can reach "
                       f"port {settings.port} can use this server. Give --api-keys (or DRGYM_API_KEYS), or bind "
                       "127.0.0.1.", err=True)
        check_bindable_or_exit(settings, "drgym mcp")
    try:
        # stdout is the protocol channel under stdio: anything the loaders print goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            backend = load_backend(settings)
    except DrgymError as e:
        typer.echo(f"drgym mcp: error: {e}", err=True)
        raise typer.Exit(2) from None
    except Exception as e:  # a library error the engine did not wrap: still one line
        log.debug("backend load failed", exc_info=True)
        typer.echo(f"drgym mcp: error: could not load the index ({type(e).__name__}: {e})", err=True)
        raise typer.Exit(2) from None

    from drgym.server.mcp import create_mcp_server, streamable_http_app

    server = create_mcp_server(backend, settings)
    try:
        if transport == "stdio":
            typer.echo(f"drgym mcp: {backend!r} on stdio (max_k={settings.max_k})", err=True)
            server.run("stdio")
            return
        import uvicorn

        from drgym.server.app import uvicorn_options

        app = streamable_http_app(server, host=settings.host, path=path, api_keys=settings.key_set(),
                                  allowed_hosts=allowed_hosts, allowed_origins=allowed_origins)
        typer.echo(f"drgym mcp: {backend!r} on http://{settings.host}:{settings.port}{path} "
                   f"(max_k={settings.max_k}, auth={'on' if settings.key_set() else 'off'}, "
                   f"Host accepted: {', '.join(accepted)})", err=True)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
                    **uvicorn_options())
    finally:
        backend.close()


def register(app: typer.Typer) -> None:
    """Add ``drgym mcp`` to ``app``."""
    app.command("mcp")(mcp)
