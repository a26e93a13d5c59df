"""``drgym serve``: the search service on uvicorn. Registered on the root app by :func:`register`."""

from __future__ import annotations

import logging
from typing import Optional

import typer

log = logging.getLogger(__name__)

# The slow-client timeouts' defaults (drgym.server.app; repeated here so that `drgym --help`
# does not import FastAPI). tests/test_rel_server.py checks they agree.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_KEEP_ALIVE_S = 5.0


def load_backend(settings, *, gpu_shard: bool = False, gpu_float16: bool = False) -> "object":
    """Open the local engine the settings describe (building the index if needed) and
    run one warm-up query, so a broken index fails here and not on the first request.

    Args:
        settings: a :class:`drgym.search.wire.ServerSettings`.
        gpu_shard, gpu_float16: GPU placement of the dense shards (as
            :class:`~drgym.search.local.LocalSearchEngine`).

    Returns:
        A :class:`drgym.search.local.LocalSearchEngine`.

    Raises:
        IndexNotFoundError, CorruptIndexError, IndexMismatchError, ConfigError: as the engine.
    """
    from drgym.search.local import DEFAULT_METHOD, LocalSearchEngine

    method = settings.method or DEFAULT_METHOD
    kw = {"gpu_shard": gpu_shard, "gpu_float16": gpu_float16, "encoder_backend": settings.encoder_backend,
          "mmap": settings.mmap, "search_threads": settings.search_threads or None}
    if settings.search_params:
        kw["search_params"] = dict(settings.search_params)
    if settings.encoder:
        kw["encoder"] = settings.encoder
    if settings.index_dir:
        engine = LocalSearchEngine.open(settings.index_dir, method=method, max_k=settings.max_k, **kw)
    else:
        engine = LocalSearchEngine.from_corpus(settings.corpus, method=method, max_k=settings.max_k,
                                               progress=True, **kw)
    try:
        engine.search("warm up", k=1)
    except BaseException:
        engine.close()
        raise
    return engine


def serve(
    corpus: Optional[str] = typer.Option(None, help="Named corpus or corpus path to serve (env DRGYM_CORPUS; default wiki-default)."),
    method: Optional[str] = typer.Option(None, help="dense, bm25 or hybrid (env DRGYM_METHOD; default: the engine's)."),
    index_dir: Optional[str] = typer.Option(None, "--index-dir", help="Serve this built index folder (or index name) instead of --corpus."),
    encoder: Optional[str] = typer.Option(None, help="Encoder name or path; must match the index (default: the index's)."),
    encoder_backend: Optional[str] = typer.Option(None, "--encoder-backend", help="Query encoder runtime: onnx-int8 (the default on the CPU: the weights quantised to int8 by ONNX Runtime, about a fifth of torch's forward CPU, rankings move a little), onnx (ONNX Runtime, the same float32 weights) or torch (float32; the default on a GPU). The index is unchanged."),
    host: Optional[str] = typer.Option(None, help="Address to bind (env DRGYM_HOST; default 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, help="TCP port (env DRGYM_PORT; default 8000)."),
    max_k: Optional[int] = typer.Option(None, "--max-k", help="Largest k accepted (default 100)."),
    batch_window_ms: Optional[float] = typer.Option(None, "--batch-window-ms", help="Micro-batch wait after the first query, ms (default 1)."),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="Most queries per search_batch call (default 64)."),
    cache_mb: Optional[float] = typer.Option(None, "--cache-mb", help="LRU result cache budget in MiB, 0 = off (default 64)."),
    cache_size: Optional[int] = typer.Option(None, "--cache-size", help="Most LRU result cache entries besides --cache-mb, 0 = off (default: no entry bound)."),
    max_pending: Optional[int] = typer.Option(None, "--max-pending", help="Queries allowed to wait for a batch before answering 429 (default 16384)."),
    max_request_pending: Optional[int] = typer.Option(None, "--max-request-pending", help="Queries of one request allowed to wait while others wait, else 429 (default 4096)."),
    collapse: Optional[str] = typer.Option(None, "--collapse", help="What /search returns: document (k distinct documents, best passage each; default) or passage (k best passages)."),
    retrieve_collapse: Optional[str] = typer.Option(None, "--retrieve-collapse", help="The same for POST /retrieve (default passage, as Search-R1)."),
    api_keys: Optional[str] = typer.Option(None, "--api-keys", help="Comma-separated keys required in x-api-key (env DRGYM_API_KEYS; default: no auth)."),
    log_level: Optional[str] = typer.Option(None, "--log-level", help="uvicorn log level (default warning)."),
    header_timeout: float = typer.Option(DEFAULT_HEADER_TIMEOUT_S, "--header-timeout", envvar="DRGYM_HEADER_TIMEOUT",
                                         help="Seconds a client has to send a whole request head; then 408 and the connection is closed."),
    body_timeout: float = typer.Option(DEFAULT_BODY_TIMEOUT_S, "--body-timeout", envvar="DRGYM_BODY_TIMEOUT",
                                       help="Seconds a client has to send a whole request body after its head; then 408 and close."),
    keep_alive_timeout: float = typer.Option(DEFAULT_KEEP_ALIVE_S, "--keep-alive-timeout", envvar="DRGYM_KEEP_ALIVE_TIMEOUT",
                                             help="Seconds an idle kept-alive connection stays open."),
    mmap: Optional[bool] = typer.Option(None, "--mmap/--no-mmap", help="Memory-map the dense shards' FAISS files (Flat, SQ, IVF lists, HNSW) instead of reading them into memory: they stay in the page cache, and an index larger than RAM loads (default off)."),
    gpu_shard: bool = typer.Option(False, "--gpu-shard", help="On GPUs, split each dense shard across all GPUs instead of a whole copy on each (needs faiss-gpu)."),
    gpu_float16: bool = typer.Option(False, "--gpu-float16", help="On GPUs, store the dense vectors in float16: half the GPU memory (needs faiss-gpu)."),
    search_params: Optional[str] = typer.Option(None, "--search-params", help='Dense search parameters as JSON, e.g. \'{"probe_groups": 1}\' (nprobe, efSearch, rerank, probe_groups; default: the index\'s own).'),
    search_threads: Optional[int] = typer.Option(None, "--search-threads", help="CPU threads each micro-batch's query encoding and FAISS search run on (default 1: the least CPU per request, with HTTP and JSON on another core; 0: all of the process's threads for large batches)."),
) -> None:
    """Serve a local index over HTTP: DeepResearchGym /search, /fineweb/search and /fetch, Search-R1 POST /retrieve, /health and /docs.

    Every option can also come from a DRGYM_<OPTION> environment variable (e.g. DRGYM_PORT=9000). Exits with status 2 and a one-line message when the index is missing, corrupt or was built with another encoder.
    """
    from pydantic import ValidationError

    from drgym.errors import DrgymError
    from drgym.search.wire import ServerSettings

    params = None
    if search_params is not None:
        import json

        try:
            params = json.loads(search_params)
        except json.JSONDecodeError as e:
            typer.echo(f"drgym serve: error: --search-params is not JSON ({e}): {search_params!r}", err=True)
            raise typer.Exit(2) from None
    given = dict(corpus=corpus, method=method, index_dir=index_dir, encoder=encoder, encoder_backend=encoder_backend,
                 mmap=mmap, search_threads=search_threads, search_params=params, host=host, port=port,
                 max_k=max_k, batch_window_ms=batch_window_ms, max_batch_size=max_batch_size,
                 cache_mb=cache_mb, cache_size=cache_size, max_pending=max_pending,
                 max_request_pending=max_request_pending, collapse=collapse, retrieve_collapse=retrieve_collapse,
                 api_keys=api_keys, log_level=log_level)
    try:
        settings = ServerSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        typer.echo(f"drgym serve: error: invalid settings: {msgs}", err=True)
        raise typer.Exit(2) from None
    from drgym.server.app import uvicorn_options

    try:
        server_options = uvicorn_options(header_timeout_s=header_timeout, body_timeout_s=body_timeout,
                                         keep_alive_s=keep_alive_timeout)
    except ValueError as e:
        typer.echo(f"drgym serve: error: invalid settings: {e} (--header-timeout, --body-timeout, "
                   "--keep-alive-timeout)", err=True)
        raise typer.Exit(2) from None
    check_bindable_or_exit(settings, "drgym serve")
    try:
        backend = load_backend(settings, gpu_shard=gpu_shard, gpu_float16=gpu_float16)
    except DrgymError as e:
        typer.echo(f"drgym serve: error: {e}", err=True)
        raise typer.Exit(2) from None
    except Exception as e:  # a library error the engine did not wrap: still one line
        log.debug("backend load failed", exc_info=True)
        typer.echo(f"drgym serve: error: could not load the index ({type(e).__name__}: {e})", err=True)
        raise typer.Exit(2) from None

    import uvicorn

    from drgym.server.app import create_app

    app = create_app(backend, settings, close_backend=True)
    typer.echo(f"drgym serve: {backend!r} on http://{settings.host}:{settings.port} "
               f"(max_k={settings.max_k}, auth={'on' if settings.key_set() else 'off'}, "
               f"query encoder {getattr(getattr(backend, 'encoder', None), 'backend', settings.encoder_backend)}, search threads {settings.search_threads or 'all'}, "
               f"mmap {'on' if settings.mmap else 'off'})", err=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
                **server_options)


def check_bindable_or_exit(settings, prog: str) -> None:
    """Check that ``settings.host:settings.port`` can be bound, before the index loads;
    else print one line naming the address and exit with status 2 (``typer.Exit``)."""
    try:
        _check_bindable(settings.host, settings.port)
    except OSError as e:
        typer.echo(f"{prog}: error: cannot listen on {settings.host}:{settings.port}: {e.strerror or e} "
                   "(is another server running there? pick another --port)", err=True)
        raise typer.Exit(2) from None


def _check_bindable(host: str, port: int) -> None:
    """Bind ``(host, port)`` once and release it, so a busy port fails before the index loads.

    Raises:
        OSError: the address cannot be resolved or bound (e.g. ``EADDRINUSE``).
    """
    import socket

    if not port:  # port 0: the OS picks a free one
        return
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "busy"
        s.bind(addr)


def register(app: typer.Typer) -> None:
    """Add ``drgym serve`` to ``app``."""
    app.command("serve")(serve)
