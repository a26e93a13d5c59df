"""The drgym search engine as a Model Context Protocol (MCP) server.

:func:`create_mcp_server` wraps any :class:`~drgym.search.base.SearchBackend` (``drgym
mcp`` passes the same :class:`~drgym.search.local.LocalSearchEngine` that ``drgym serve``
opens) in an :class:`mcp.server.mcpserver.MCPServer` (the official MCP Python SDK, v2)
with three tools:

==================  =================================================================
``search``          ``query`` (must hold a non-space character), ``k`` (a JSON
                    integer 1..max_k, default 10; ``"5"`` and ``true`` are
                    refused, as ``drgym serve`` refuses them) -> ``{"query", "k",
                    "results": [{"rank", "doc_id", "title", "url", "text",
                    "score", "source", "metadata"}, ...]}``, best first:
                    the same hits as ``GET /search`` of ``drgym serve`` (k distinct
                    documents, each its best passage, unless the settings say
                    ``collapse="passage"``); ``text`` is the passage.
``get_document``    ``docid`` (a ``doc_id`` from ``search``; a passage id gives its
                    whole document) -> ``{"doc_id", "url", "title", "text", "source",
                    "metadata"}``.
``fetch``           ``url`` (a ``url`` from ``search``) -> the same document shape.
==================  =================================================================

``search`` and ``get_document`` are the names and argument names BrowseComp-Plus's MCP
server uses, so agents written for it work unchanged. The limits are those of ``drgym
serve`` (:class:`~drgym.search.wire.ServerSettings`: ``max_k``, ``default_k``,
``max_query_chars``, ``collapse``).

A bad call is a tool error (``isError`` result), never a crash of the server; its text
starts with the drgym error class, which :class:`drgym.search.mcp.MCPSearchBackend`
reads back as the same exception:

* ``BadQueryError: ...`` an empty query, or k outside 1..max_k;
* ``DocumentNotFoundError: No document with doc_id '...'.`` / ``... URL not found: '...'.``;
* ``CorruptIndexError: ...`` and other drgym errors: their message;
* any other failure: ``SearchError: <type>: <message>`` (logged with its traceback).

The server also offers the resource ``drgym://engine``: JSON of the backend's
:meth:`~drgym.search.base.SearchBackend.identity` plus ``max_k``, ``default_k`` and
``collapse``, which the ``mcp:`` client records as the engine a run is bound to.
"""

# No ``from __future__ import annotations``: the SDK evaluates the tool functions' annotations,
# which create_mcp_server specialises per server (k's maximum).
import functools
import inspect
import ipaddress
import json
import logging
from dataclasses import dataclass
from typing import Annotated, Any, Iterable

from fastapi.responses import JSONResponse
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from drgym import __version__
from drgym.errors import BadQueryError, ConfigError, DocumentNotFoundError, DrgymError, SearchError
from drgym.search.base import SearchBackend
from drgym.search.mcp import ENGINE_RESOURCE, tool_error_text
from drgym.search.wire import JsonInt, ServerSettings
from drgym.server.app import API_KEY_HEADER, BAD_KEY_DETAIL, api_key_accepted
from drgym.types import Document, SearchResult

log = logging.getLogger(__name__)

SERVER_NAME = "drgym"
EMPTY_QUERY_MESSAGE = "No query text in request: the query must contain a non-space character."
"""The message of an empty query (as ``drgym serve``'s 400 detail)."""


class SearchHit(BaseModel):
    """One hit of the ``search`` tool."""

    rank: int = Field(description="1-based rank, best first")
    doc_id: str = Field(description="passage id; pass it to get_document for the whole document")
    title: str = Field(description="title of the document")
    url: str = Field(description="URL of the document; pass it to fetch for the whole document")
    text: str = Field(description="the passage (snippet) that matched")
    score: float = Field(description="retrieval score, higher is better")
    source: str = Field("", description="corpus part the document came from")
    metadata: dict[str, Any] = Field(default_factory=dict,
                                     description="other fields of the hit (parent_doc_id: the document's id; method)")


class SearchOutput(BaseModel):
    """The ``search`` tool's answer."""

    query: str = Field(description="the query searched (cut to the server's max_query_chars)")
    k: int = Field(description="the number of results asked for")
    results: list[SearchHit] = Field(description="at most k hits, best first")
    partial: dict[str, Any] | None = Field(
        None, description="only when some index shards did not answer: which ones (the hits come from the others)")


class DocumentOutput(BaseModel):
    """A whole document (``get_document`` and ``fetch``)."""

    doc_id: str = Field(description="document id")
    url: str = Field(description="URL of the document")
    title: str = Field(description="title")
    text: str = Field(description="the whole text, without the title")
    source: str = Field("", description="corpus part the document came from")
    metadata: dict[str, Any] = Field(default_factory=dict, description="other fields of the source record")


def hit_record(r: SearchResult) -> SearchHit:
    """The ``search`` tool's record of one hit."""
    return SearchHit(rank=r.rank, doc_id=r.doc_id, title=r.title, url=r.url, text=r.text, score=float(r.score),
                     source=r.source, metadata=dict(r.metadata))


def document_output(d: Document) -> DocumentOutput:
    """The ``get_document`` / ``fetch`` tools' record of a document."""
    return DocumentOutput(doc_id=d.doc_id, url=d.url, title=d.title, text=d.text, source=d.source,
                          metadata=dict(d.metadata))


@dataclass
class MCPState:
    """What the tools of one MCP server read (:func:`create_mcp_server` binds it to them;
    a test can call a tool function with one directly).

    Attributes:
        backend: the served :class:`SearchBackend`.
        settings: the server's settings.
        max_k: the largest ``k``: ``settings.max_k``, or the backend's ``max_k`` when smaller.
        default_k: ``k`` when a call gives none: ``settings.default_k``, at most ``max_k``.
        collapses: whether ``backend.search_batch`` takes ``collapse=``.
    """

    backend: SearchBackend
    settings: ServerSettings
    max_k: int
    default_k: int
    collapses: bool = False

    @classmethod
    def build(cls, backend: SearchBackend, settings: ServerSettings) -> "MCPState":
        """The state of a server of ``backend`` under ``settings``."""
        max_k = min(settings.max_k, getattr(backend, "max_k", settings.max_k))
        try:
            collapses = "collapse" in inspect.signature(backend.search_batch).parameters
        except (TypeError, ValueError):
            collapses = False
        return cls(backend=backend, settings=settings, max_k=max_k, default_k=min(settings.default_k, max_k),
                   collapses=collapses)


def tool_failure(exc: BaseException) -> ToolError:
    """The SDK's :class:`ToolError` for a failed call (its text: :func:`tool_error_text`);
    a drgym error other than a bad query or a missing document is logged as a warning,
    any other exception with its traceback."""
    if not isinstance(exc, DrgymError):
        log.error("MCP tool call failed", exc_info=exc)
    elif not isinstance(exc, (BadQueryError, DocumentNotFoundError)):
        log.warning("MCP tool call failed: %s", exc)
    return ToolError(tool_error_text(exc))


# ---- the tools and the resource, over an MCPState. k's schema (its maximum) and default
# are each server's: create_mcp_server registers search with them (see bind_state). ----

def search(
    state: MCPState,
    query: Annotated[str, Field(description="free-text query; must contain a non-space character")],
    k: JsonInt | None = None,
) -> SearchOutput:
    """The ``search`` tool: up to ``k`` hits (None: ``default_k``) for ``query``, best first.

    Raises:
        ToolError: ``k`` outside 1..max_k (or a bool), an empty query, or a failed search
            (its text: :func:`tool_failure`).
    """
    k = state.default_k if k is None else k
    try:
        if isinstance(k, bool) or not 1 <= k <= state.max_k:
            raise BadQueryError(f"k must be between 1 and {state.max_k}, got {k}.")
        if not query.strip():
            raise BadQueryError(EMPTY_QUERY_MESSAGE)
        q = query[: state.settings.max_query_chars]
        if state.collapses:
            hits = state.backend.search_batch([q], k, collapse=state.settings.collapse)[0]
        else:
            hits = state.backend.search_batch([q], k)[0]
    except Exception as e:
        raise tool_failure(e) from e
    partial = None
    if getattr(hits, "partial", False):
        partial = {"missing_shards": list(hits.missing_shards), "shards": hits.n_shards}
    return SearchOutput(query=q, k=k, results=[hit_record(r) for r in hits], partial=partial)


def get_document(
    state: MCPState,
    docid: Annotated[str, Field(description="a doc_id from search results")],
) -> DocumentOutput:
    """The ``get_document`` tool: the whole document of ``docid`` (``backend.get``).

    Raises:
        ToolError: no such document, an empty ``docid``, or a backend without ``get``.
    """
    try:
        getter = getattr(state.backend, "get", None)
        if not callable(getter):
            raise SearchError(f"this server's backend ({type(state.backend).__name__}) cannot look documents up by "
                              "id; use fetch(url).")
        if not docid.strip():
            raise DocumentNotFoundError(f"No document with doc_id {docid!r} (empty doc_id).")
        return document_output(getter(docid))
    except Exception as e:
        raise tool_failure(e) from e


def fetch(
    state: MCPState,
    url: Annotated[str, Field(description="a url from search results; looked up in the collection, "
                                          "never downloaded")],
) -> DocumentOutput:
    """The ``fetch`` tool: the whole document at ``url`` (``backend.fetch``).

    Raises:
        ToolError: no such URL, or the lookup failed.
    """
    try:
        return document_output(state.backend.fetch(url))
    except Exception as e:
        raise tool_failure(e) from e


def engine(state: MCPState) -> str:
    """The ``drgym://engine`` resource: JSON of the backend's identity and the limits."""
    info = {"service": "drgym", "version": __version__, "identity": state.backend.identity(), "max_k": state.max_k,
            "default_k": state.default_k, "collapse": state.settings.collapse if state.collapses else None,
            "deterministic": bool(getattr(state.backend, "deterministic", True))}
    return json.dumps(info, sort_keys=True, default=str)


def bind_state(fn, state: MCPState, **params: tuple[Any, Any]):
    """``fn`` (a tool or resource function above) with ``state`` bound: a function of its
    other parameters, which the SDK reads (name, schema) from its signature.

    Args:
        fn: a function whose first parameter is ``state``.
        state: the server's :class:`MCPState`.
        **params: ``name=(annotation, default)`` replacing a parameter's annotation and
            default (a server's own limits in the schema).

    Raises:
        TypeError: a name in ``params`` that is not a parameter of ``fn``.
    """
    sig = inspect.signature(fn)
    unknown = set(params) - set(sig.parameters)
    if unknown:
        raise TypeError(f"{fn.__name__} has no parameter {', '.join(sorted(unknown))}.")
    rest = [p.replace(annotation=params[p.name][0], default=params[p.name][1]) if p.name in params else p
            for p in list(sig.parameters.values())[1:]]

    @functools.wraps(fn)
    def bound(*args, **kwargs):
        return fn(state, *args, **kwargs)

    bound.__signature__ = sig.replace(parameters=rest)  # type: ignore[attr-defined]
    bound.__annotations__ = {**{p.name: p.annotation for p in rest}, "return": sig.return_annotation}
    del bound.__wrapped__  # the SDK must see the bound signature only
    return bound


def create_mcp_server(backend: SearchBackend, settings: ServerSettings | None = None, *, name: str = SERVER_NAME):
    """Build the MCP server around ``backend``: its :class:`MCPState`, and the tools
    :func:`search`, :func:`get_document`, :func:`fetch` and the resource :func:`engine`
    bound to it.

    Args:
        backend: any thread-safe :class:`SearchBackend` (usually a ``LocalSearchEngine``).
            Its ``search_batch`` is called with ``collapse=`` when it accepts it; its
            ``get(doc_id)`` serves ``get_document`` (a backend without one answers
            ``get_document`` with a tool error).
        settings: the limits (``max_k``, ``default_k``, ``max_query_chars``, ``collapse``);
            None reads ``DRGYM_*`` env vars as ``drgym serve`` does.
        name: the server name sent to clients.

    Returns:
        An :class:`mcp.server.mcpserver.MCPServer`; ``.run("stdio")``, or serve
        ``.streamable_http_app()`` with uvicorn (what ``drgym mcp`` does).
    """
    state = MCPState.build(backend, settings or ServerSettings())
    max_k, default_k = state.max_k, state.default_k
    server = MCPServer(
        name=name, version=__version__, title="drgym search",
        instructions=("Search a fixed local document collection. `search` returns the top passages with their "
                      "doc_id, title and url; `get_document(docid)` or `fetch(url)` returns a whole document."),
        log_level="WARNING",
    )
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    k_param = Annotated[JsonInt, Field(description=f"number of results, 1..{max_k}",
                                       json_schema_extra={"minimum": 1, "maximum": max_k})]
    server.tool(name="search", annotations=read_only,
                description=(f"Search the collection. Returns up to k results (default {default_k}, at most "
                             f"{max_k}), best first, each with doc_id, title, url, the matching passage (text) "
                             "and score."))(bind_state(search, state, k=(k_param, default_k)))
    server.tool(name="get_document", annotations=read_only,
                description="Return the whole document with this doc_id (a doc_id from search results)."
                )(bind_state(get_document, state))
    server.tool(name="fetch", annotations=read_only,
                description="Return the whole document at this URL (a url from search results)."
                )(bind_state(fetch, state))
    server.resource(ENGINE_RESOURCE, name="engine", mime_type="application/json",
                    description="The engine behind the tools: its identity and limits (JSON)."
                    )(bind_state(engine, state))
    return server


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The Host names of this machine's loopback interface, always accepted."""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on the loopback interface only (``127.0.0.0/8``,
    ``::1``, ``localhost``); ``0.0.0.0``, ``::`` and other addresses and names are not."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _split_list(values: Iterable[str] | str | None) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = values.split(",")
    return [v.strip() for v in values if v and v.strip()]


def _has_port(host: str) -> bool:
    """Whether a Host value names a port (``name:8000``, ``[::1]:8000``, ``name:*``)."""
    return host.rsplit("]", 1)[-1].startswith(":") if host.startswith("[") else ":" in host


def transport_security(host: str, allowed_hosts: Iterable[str] | str | None = None,
                       allowed_origins: Iterable[str] | str | None = None):
    """The SDK's DNS-rebinding protection (``Host`` and ``Origin`` checks) for a server
    bound to ``host``: on for every bind address, loopback or not.

    Accepted ``Host`` values: the loopback names (``127.0.0.1``, ``localhost``, ``[::1]``),
    the bound address itself when it is not a wildcard (``0.0.0.0``, ``::``), and
    ``allowed_hosts``; each with any port (or none), unless an entry names its own
    (``name:8000``). Accepted ``Origin`` values: ``http://`` and ``https://`` of each
    accepted host, and ``allowed_origins`` (``https://app.example.org``: any port, or one
    with its port). A request without ``Origin`` (not from a browser) passes that check.
    The SDK answers a refused ``Host`` with 421 and a refused ``Origin`` with 403.

    Args:
        host: the bind address.
        allowed_hosts, allowed_origins: more accepted values: a list, or one
            comma-separated string.

    Returns:
        A :class:`mcp.server.transport_security.TransportSecuritySettings`.

    Raises:
        ConfigError: an entry with a scheme in ``allowed_hosts`` or without one in
            ``allowed_origins``, or one with a wildcard other than ``:*``.
    """
    extra_hosts, extra_origins = _split_list(allowed_hosts), _split_list(allowed_origins)
    for h in extra_hosts:
        if "/" in h or "*" in h.replace(":*", ""):
            raise ConfigError(f"allowed hosts are Host header values such as 'search.example.org' or "
                              f"'search.example.org:8000', got {h!r}.")
    for o in extra_origins:
        if "://" not in o or "/" in o.split("://", 1)[1] or "*" in o.replace(":*", ""):
            raise ConfigError(f"allowed origins are origins such as 'https://app.example.org' or "
                              f"'http://app.example.org:3000', got {o!r}.")
    names = list(LOOPBACK_NAMES)
    bound = host.strip()
    if bound and bound.strip("[]") not in ("0.0.0.0", "::"):
        names.append(f"[{bound.strip('[]')}]" if ":" in bound.strip("[]") else bound)
    hosts: list[str] = []
    for h in [*names, *extra_hosts]:
        hosts += [h] if _has_port(h) else [h, f"{h}:*"]
    origins = [f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")]
    for o in extra_origins:
        origins += [o] if _has_port(o.split("://", 1)[1]) else [o, f"{o}:*"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=list(dict.fromkeys(hosts)),
                                     allowed_origins=list(dict.fromkeys(origins)))


UNAUTHORIZED_BODY = {"jsonrpc": "2.0", "id": None,
                     "error": {"code": -32001, "message": f"AuthError: {BAD_KEY_DETAIL}"}}
"""The body of a 401: a JSON-RPC error, which MCP clients show as the request's error
(:class:`drgym.search.mcp.MCPSearchBackend` raises it as :class:`~drgym.errors.AuthError`)."""


class APIKeyMiddleware:
    """ASGI middleware: every HTTP request must carry one of ``keys`` in ``x-api-key``,
    else 401 with :data:`UNAUTHORIZED_BODY` (``drgym serve``'s header, message and
    constant-time comparison: :func:`drgym.server.app.api_key_accepted`). Other scopes
    (lifespan) pass.

    Args:
        app: the ASGI app to guard.
        keys: the accepted keys (non-empty).
    """

    def __init__(self, app: Any, keys: Iterable[str]) -> None:
        self.app = app
        self.keys = [k.encode("utf-8") for k in sorted(keys)]
        if not self.keys:
            raise ConfigError("APIKeyMiddleware needs at least one key.")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            name = API_KEY_HEADER.encode("latin-1")  # ASGI header names are lower-case bytes
            sent = next((v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() == name), None)
            if not api_key_accepted(self.keys, sent):
                response = JSONResponse(UNAUTHORIZED_BODY, status_code=401, headers={"WWW-Authenticate": API_KEY_HEADER})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def streamable_http_app(server, *, host: str = "127.0.0.1", path: str = "/mcp", api_keys: Iterable[str] = (),
                        allowed_hosts: Iterable[str] | str | None = None,
                        allowed_origins: Iterable[str] | str | None = None):
    """The ASGI app that serves ``server`` over streamable HTTP at ``path``.

    Args:
        server: from :func:`create_mcp_server`.
        host: the address it will be bound to; the ``Host``/``Origin`` checks accept it
            (:func:`transport_security`).
        path: the endpoint path.
        api_keys: keys of which every request must carry one in ``x-api-key`` (else 401),
            as ``drgym serve --api-keys``; empty: no authentication.
        allowed_hosts, allowed_origins: more ``Host`` and ``Origin`` values to accept
            (:func:`transport_security`): the names clients reach this server by.

    Returns:
        The SDK's Starlette app, wrapped in :class:`APIKeyMiddleware` when there are keys.

    Raises:
        ConfigError: a malformed allowed host or origin.
    """
    app = server.streamable_http_app(streamable_http_path=path, host=host,
                                     transport_security=transport_security(host, allowed_hosts, allowed_origins))
    keys = [k for k in api_keys if k]
    return APIKeyMiddleware(app, keys) if keys else app
