"""The drgym search service: a FastAPI app over any :class:`SearchBackend`.

Endpoints (shapes in :mod:`drgym.search.wire`):

=========================  ==========================================================
``GET /search``            DeepResearchGym search: ``query``, ``k`` (default 10),
                           ``with_distance`` (default false, as upstream; the drgym
                           client always asks for it), ``collapse`` (``document``:
                           k distinct documents, the default; ``passage``: k best
                           passages). Other upstream parameters (``complexity``,
                           ``shard_ids``, ``rerank``...) are ignored.
``GET /fineweb/search``    the same, with ``outlinks: null`` as upstream's FineWeb route.
``GET /fetch``             ``url`` -> the whole document; 404 ``URL not found.``
                           The URL is a key looked up in the local document store;
                           nothing is ever opened or downloaded (``file:``, ``../``,
                           loopback addresses are keys like any other).
``POST /retrieve``         Search-R1's batch retrieval; passages by default
                           (``--retrieve-collapse``); an empty query gets ``[]``.
``GET /health``            liveness, version, max_k, collapse defaults and counters (no auth).
``GET /docs``              OpenAPI UI; ``/openapi.json`` the schema, which states every
                           limit and error answer (checked by schemathesis).
=========================  ==========================================================

Errors are ``{"detail": ...}``: 400 empty or whitespace query on ``/search``, ``k``/``topk``
outside 1..max_k (``topk`` 0 or null: the default), too many queries; 401 bad API key
(only when keys are configured; keys are compared in constant time); 404 unknown URL;
422 missing or mistyped parameter, or a JSON body holding ``NaN``, ``Infinity``,
``-Infinity`` or a number too large for a float (``1e400``), anywhere in it (they are not
JSON, RFC 8259; the 422 body echoes the input with such numbers as strings, so it is
valid JSON); 429 (``Retry-After``: the estimated seconds to serve what waits) more than
``max_pending`` queries waiting, or more than ``max_request_pending`` in one request while
others wait; 500 backend failure. A failed request never stops the server, nor closes
its connection.

Slow clients are cut off (:func:`uvicorn_options`, used by ``drgym serve`` and
``drgym mcp``): a request head must arrive within ``header_timeout_s`` of
the connection (or of its first byte on a kept-alive connection), a request body within
``body_timeout_s`` of its head; else the server answers 408 and closes the connection.
An idle kept-alive connection is closed after ``keep_alive_s``.
"""

# No ``from __future__ import annotations`` here: FastAPI must resolve the parameter types
# that search_router builds per app (limits in the schema) when it registers the routes.
import asyncio
import functools
import hmac
import inspect
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

import h11
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader
from uvicorn.protocols.http.h11_impl import H11Protocol

from drgym import __version__
from drgym.config import ServeTimeouts
from drgym.cpu import thread_count
from drgym.errors import BadQueryError, CorruptIndexError, DocumentNotFoundError, DrgymError, SearchError
from drgym.redact import redact
from drgym.search.base import SearchBackend
from drgym.search.wire import (
    Collapse,
    ErrorResponse,
    FetchResponse,
    HealthResponse,
    RetrieveHit,
    RetrieveRequest,
    RetrieveResponse,
    SearchResponse,
    ServerSettings,
    b64_json,
    document_record,
    partial_info,
    result_record,
    retrieve_document,
    retrieve_request_model,
)
from drgym.server.batching import MicroBatcher, OverloadedError

log = logging.getLogger(__name__)

EMPTY_QUERY_DETAIL = "No query text in request: the query must contain a non-space character."
URL_NOT_FOUND_DETAIL = "URL not found."
BAD_KEY_DETAIL = "Invalid or missing API Key: send a key accepted by this server in the x-api-key header."
API_KEY_HEADER = "x-api-key"


def api_key_accepted(keys: list[bytes], given: str | None) -> bool:
    """Whether ``given`` (an ``x-api-key`` header value, None when absent) is one of
    ``keys`` (the server's keys, UTF-8 encoded). Used by ``drgym serve`` and ``drgym mcp``.

    Every key is compared, each in constant time (:func:`hmac.compare_digest`), so the
    answer time does not tell how much of a guess was right. Header values arrive latin-1
    decoded (RFC 9110); encoding them back gives the bytes sent.
    """
    sent = (given or "").encode("latin-1", "replace")  # a missing key is compared too: the same time
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(sent, k)
    return ok and given is not None


UVICORN_H11_MAX_EVENT = 1 << 20
"""Largest request head (bytes) uvicorn's h11 parser accepts; 10k-character queries need
more than its 16 KiB default once percent-encoded (httptools has no such limit)."""


DEFAULT_HEADER_TIMEOUT_S: float = ServeTimeouts.model_fields["header_timeout_s"].default
"""Seconds a client has to send a whole request head (``drgym serve --header-timeout``)."""
DEFAULT_BODY_TIMEOUT_S: float = ServeTimeouts.model_fields["body_timeout_s"].default
"""Seconds a client has to send a whole request body after its head (``--body-timeout``)."""
DEFAULT_KEEP_ALIVE_S: float = ServeTimeouts.model_fields["keep_alive_s"].default
"""Seconds an idle kept-alive connection stays open (``--keep-alive-timeout``; uvicorn's default)."""


@functools.lru_cache(maxsize=None)
def timed_h11_protocol(header_timeout_s: float, body_timeout_s: float) -> type:
    """uvicorn's h11 protocol with a request-head and a request-body deadline.

    uvicorn only times out idle kept-alive connections (and any byte received cancels
    that timer), so a client that sends a header line a second, or a body a byte a
    second, holds its connection forever. This protocol arms a timer when a connection
    opens (or when the first byte of a later request arrives) that is cancelled once the
    head is complete, and one from the end of the head that is cancelled once the body is
    complete. When one fires, the server answers ``408 Request Timeout`` (when no answer
    was started), closes the connection, and the app sees the client as disconnected.

    Args:
        header_timeout_s: seconds for a whole request head (> 0).
        body_timeout_s: seconds for a whole request body after the head (> 0).

    Returns:
        An ``asyncio.Protocol`` class for ``uvicorn.Config(http=...)``.

    Raises:
        ValueError: a timeout is not a positive number.
    """

    for name, value in (("header_timeout_s", header_timeout_s), ("body_timeout_s", body_timeout_s)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")

    class TimedH11Protocol(H11Protocol):
        """:class:`uvicorn.protocols.http.h11_impl.H11Protocol` with head and body deadlines."""

        def connection_made(self, transport) -> None:  # type: ignore[override]
            self._drgym_timers: dict[str, Any] = {}
            super().connection_made(transport)
            self._arm("head", header_timeout_s)  # a connection that never sends a head is closed too

        def handle_events(self) -> None:
            super().handle_events()
            self._update_deadlines()

        def connection_lost(self, exc) -> None:
            self._cancel("head")
            self._cancel("body")
            super().connection_lost(exc)

        def _arm(self, which: str, seconds: float) -> None:
            if which not in self._drgym_timers:
                self._drgym_timers[which] = self.loop.call_later(seconds, self._expired, which)

        def _cancel(self, which: str) -> None:
            timer = getattr(self, "_drgym_timers", {}).pop(which, None)
            if timer is not None:
                timer.cancel()

        def _update_deadlines(self) -> None:
            state = self.conn.their_state
            if state is h11.IDLE:  # waiting for a request head
                self._cancel("body")
                if self.conn.trailing_data[0]:  # part of a head came: its deadline runs
                    self._arm("head", header_timeout_s)
            elif state is h11.SEND_BODY:
                self._cancel("head")
                self._arm("body", body_timeout_s)
            else:  # the request is complete (or the connection is over)
                self._cancel("head")
                self._cancel("body")

        def _expired(self, which: str) -> None:
            self._drgym_timers.pop(which, None)
            if self.transport.is_closing():
                return
            limit = header_timeout_s if which == "head" else body_timeout_s
            what = "request head" if which == "head" else "request body"
            prefix = "%s:%d - " % tuple(self.client) if self.client else ""
            log.warning("%sclosed a connection that sent no whole %s within %g s", prefix, what, limit)
            cycle = self.cycle if which == "body" else None
            started = cycle is not None and cycle.response_started
            if cycle is not None:  # the app reading the body sees a disconnect; its answer is dropped
                cycle.disconnected = True
                cycle.message_event.set()
            if not started:
                msg = f"Request timeout: no whole {what} within {limit:g} s.".encode("ascii")
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                     b"connection: close\r\ncontent-length: " + str(len(msg)).encode("ascii")
                                     + b"\r\n\r\n" + msg)
            self.transport.close()

    TimedH11Protocol.__qualname__ = f"TimedH11Protocol[head={header_timeout_s:g}s, body={body_timeout_s:g}s]"
    return TimedH11Protocol


def uvicorn_options(*, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that every drgym server uses.

    The h11 protocol with head and body deadlines (:func:`timed_h11_protocol`), a request
    head limit large enough for 10k-character queries (:data:`UVICORN_H11_MAX_EVENT`) and
    the keep-alive timeout.

    Args:
        header_timeout_s: seconds for a whole request head (> 0).
        body_timeout_s: seconds for a whole request body after its head (> 0).
        keep_alive_s: seconds an idle kept-alive connection stays open (> 0).

    Returns:
        ``{"http", "h11_max_incomplete_event_size", "timeout_keep_alive"}``.

    Raises:
        ConfigError: a timeout is not a positive number of seconds
            (:class:`~drgym.config.ServeTimeouts`; a ``ValueError``).
    """
    t = ServeTimeouts(header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s, keep_alive_s=keep_alive_s)
    return {"http": timed_h11_protocol(t.header_timeout_s, t.body_timeout_s),
            "h11_max_incomplete_event_size": UVICORN_H11_MAX_EVENT,
            "timeout_keep_alive": t.keep_alive_s}


NON_FINITE_DETAIL = ("NaN, Infinity and numbers too large for a float (such as 1e400) are not valid JSON "
                     "numbers (RFC 8259)")


def _non_finite_path(value: Any) -> tuple | None:
    """The location (keys and indexes) of the first NaN or infinite float in a parsed JSON
    value, or None. Iterative: any nesting depth."""
    stack: list[tuple[tuple, Any]] = [((), value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return path
        elif isinstance(v, dict):
            stack.extend((path + (k,), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((path + (i,), x) for i, x in reversed(list(enumerate(v))))
    return None


def finite_json(value: Any, _depth: int = 0) -> Any:
    """``value`` with every NaN or infinite float replaced by its name (``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``), so it can be sent as JSON; containers nested more
    than 64 deep are replaced by ``"..."``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (dict, list, tuple)) and _depth >= 64:
        return "..."
    if isinstance(value, dict):
        return {k: finite_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v, _depth + 1) for v in value]
    return value


async def reject_non_finite_json(request: Request) -> None:
    """Dependency of JSON-body routes: a body holding NaN or +-Infinity (Python's JSON
    parser accepts them; ``1e400`` parses as infinity) is a 422 naming where.

    Raises:
        RequestValidationError: the body has a non-finite number (its location in ``loc``).
    """
    if not await request.body():
        return
    try:
        parsed = await request.json()  # parsed (and cached) by FastAPI already for a JSON body
    except Exception:  # not JSON: FastAPI's own validation answers for it
        return
    path = _non_finite_path(parsed)
    if path is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "the body"
        raise RequestValidationError([{
            "type": "value_error", "loc": ("body", *path),
            "msg": f"{where}: {NON_FINITE_DETAIL}; send a finite number.",
            "input": finite_json(_get_path(parsed, path)),
        }])


def _get_path(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def _error(description: str, **extra) -> dict:
    return {"model": ErrorResponse, "description": description, **extra}


_E400 = {400: _error("empty query, k/topk outside 1..max_k, or too many queries")}
_E401 = {401: _error("invalid or missing API key (only when the server has keys)")}
_E404 = {404: _error("URL not found.")}
_E429 = {429: _error("too many queries waiting; retry after the given seconds",
                     headers={"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}})}
_E500 = {500: _error("backend failure")}
# 422 (missing or mistyped parameter) is declared by FastAPI itself (HTTPValidationError).


def _backend_collapses(backend: SearchBackend) -> bool:
    """Whether ``backend.search_batch`` takes ``collapse=`` (the local engine does)."""
    try:
        return "collapse" in inspect.signature(backend.search_batch).parameters
    except (TypeError, ValueError):
        return False


def served_identity(backend: SearchBackend) -> dict[str, Any]:
    """What ``GET /health`` reports as ``engine``: ``backend.identity()`` without secrets,
    JSON-ready (asked at every ``/health``; a backend's identity is cheap).

    A backend whose ``identity()`` fails is logged and reported as
    ``{"kind": "unknown", "error": ...}``: clients then see an engine that matches no
    recorded one, so a run does not resume against it unnoticed.
    """
    try:
        ident = backend.identity()
    except Exception as e:  # logged and reported: /health must answer for a serving backend
        log.warning("the backend's identity() failed (%s: %s); /health reports it as unknown", type(e).__name__, e)
        return {"kind": "unknown", "error": f"{type(e).__name__}: {e}"}
    return jsonable_encoder(redact(ident))


@dataclass
class ServerState:
    """What the handlers of one app read: the backend, the settings and what follows from
    them. :func:`create_app` puts it on ``app.state.drgym``; handlers get it through the
    :func:`server_state` dependency (a test can call a handler with one directly).

    Attributes:
        backend: the served :class:`SearchBackend`.
        settings: the server's settings.
        batcher: the :class:`MicroBatcher` in front of ``backend.search_batch``
            (started and stopped by :func:`lifespan`).
        max_k: the largest ``k``/``topk`` served: ``settings.max_k``, or the backend's
            ``max_k`` when smaller.
        keys: the accepted API keys, UTF-8 encoded and sorted; empty: no authentication.
        collapses: whether ``backend.search_batch`` takes ``collapse=``.
        close_backend: whether :func:`lifespan` closes the backend on shutdown.
    """

    backend: SearchBackend
    settings: ServerSettings
    batcher: MicroBatcher
    max_k: int
    keys: list[bytes] = field(default_factory=list)
    collapses: bool = False
    close_backend: bool = False

    @classmethod
    def build(cls, backend: SearchBackend, settings: ServerSettings, *, close_backend: bool = False) -> "ServerState":
        """The state of a server of ``backend`` under ``settings``, with a new (not yet
        started) batcher; ``await state.batcher.start()`` before searching outside an app."""
        max_k = min(settings.max_k, getattr(backend, "max_k", settings.max_k))
        collapses = _backend_collapses(backend)

        def search_fn(queries: list[str], k: int, collapse: str) -> list:
            if collapses:
                return backend.search_batch(queries, k, collapse=collapse)
            return backend.search_batch(queries, k)

        batcher = MicroBatcher(search_fn, window_ms=settings.batch_window_ms,
                               max_batch_size=settings.max_batch_size, cache_size=settings.cache_size,
                               cache_bytes=int(settings.cache_mb * 2**20), max_pending=settings.max_pending,
                               max_request_pending=settings.max_request_pending)
        return cls(backend=backend, settings=settings, batcher=batcher, max_k=max_k,
                   keys=[k.encode("utf-8") for k in sorted(settings.key_set())], collapses=collapses,
                   close_backend=close_backend)


def server_state(request: Request) -> ServerState:
    """Dependency: the :class:`ServerState` of the app serving ``request``."""
    return request.app.state.drgym


StateDep = Annotated[ServerState, Depends(server_state)]


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Start the app's batcher and a worker pool for its lifetime; on shutdown stop them
    and, when ``close_backend``, close the backend."""
    state: ServerState = app.state.drgym
    # Worker threads (the batcher's search_batch calls, /fetch lookups) sized from the
    # cores this process may use, not from the machine's core count.
    executor = ThreadPoolExecutor(max_workers=min(32, thread_count() + 4), thread_name_prefix="drgym-serve")
    asyncio.get_running_loop().set_default_executor(executor)
    await state.batcher.start()
    try:
        yield
    finally:
        await state.batcher.stop()
        if state.close_backend:
            state.backend.close()
        executor.shutdown(wait=False, cancel_futures=True)


# ---- exception handlers: each turns one kind of failure into its HTTP answer ----

async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with the validation errors. FastAPI's own handler echoes the input, and its JSON
    encoder refuses NaN/Infinity (a 500 and a reset connection): the echo is made finite."""
    return JSONResponse(status_code=422, content={"detail": finite_json(jsonable_encoder(exc.errors()))})


async def bad_query(request: Request, exc: BadQueryError) -> JSONResponse:
    """400 with the message (empty query, k out of range, too many queries)."""
    return JSONResponse(status_code=400, content={"detail": str(exc)})


async def not_found(request: Request, exc: DocumentNotFoundError) -> JSONResponse:
    """404 ``URL not found.``"""
    return JSONResponse(status_code=404, content={"detail": URL_NOT_FOUND_DETAIL})


async def overloaded(request: Request, exc: OverloadedError) -> JSONResponse:
    """429 with ``Retry-After`` (the estimated seconds to serve what waits)."""
    return JSONResponse(status_code=429, content={"detail": str(exc)},
                        headers={"Retry-After": str(getattr(exc, "retry_after", 1))})


async def corrupt_index(request: Request, exc: CorruptIndexError) -> JSONResponse:
    """503 naming the file and the fix (``drgym index verify`` / ``build --force``): the
    index, not the request, is at fault; the batcher retries the rest of a micro-batch alone."""
    log.error("%s %s: %s", request.method, request.url.path, exc)
    backend = request.app.state.drgym.backend
    return JSONResponse(status_code=503, content={"detail": str(exc), "error": "corrupt_index",
                                                  "index": getattr(getattr(backend, "manifest", None), "name", None)})


async def drgym_error(request: Request, exc: DrgymError) -> JSONResponse:
    """500 with the message of any other drgym error (logged)."""
    log.warning("%s %s failed: %s", request.method, request.url.path, exc)
    return JSONResponse(status_code=500, content={"detail": str(exc)})


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """500 ``<type>: <message>`` for any other exception (logged with its traceback)."""
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}"})


EXCEPTION_HANDLERS: dict[type[Exception], Any] = {
    RequestValidationError: invalid_request,
    BadQueryError: bad_query,
    DocumentNotFoundError: not_found,
    OverloadedError: overloaded,
    CorruptIndexError: corrupt_index,
    DrgymError: drgym_error,
    Exception: unexpected_error,
}
"""The app's exception handlers, by exception class (the most specific class answers)."""


# ---- authentication ----

# Declared (an OpenAPI apiKey scheme) only on the routes of a server with keys.
api_key_header = APIKeyHeader(name=API_KEY_HEADER, auto_error=False,
                              description="API key; required because this server was started with --api-keys")


async def check_key(state: StateDep, x_api_key: Annotated[str | None, Security(api_key_header)]) -> None:
    """Dependency of the search routes of a server with keys: the ``x-api-key`` header
    must be one of them (:func:`api_key_accepted`).

    Raises:
        HTTPException: 401 with :data:`BAD_KEY_DETAIL`.
    """
    if not api_key_accepted(state.keys, x_api_key):
        raise HTTPException(status_code=401, detail=BAD_KEY_DETAIL)


# ---- helpers of the handlers ----

def check_k(state: ServerState, k: int, name: str = "k") -> None:
    """Raise :class:`BadQueryError` (400) unless ``1 <= k <= state.max_k``."""
    if not 1 <= k <= state.max_k:
        raise BadQueryError(f"{name} must be between 1 and {state.max_k}, got {k}.")


def clean_query(state: ServerState, q: str) -> str:
    """``q`` cut to ``max_query_chars``.

    Raises:
        BadQueryError: ``q`` holds no non-space character (400).
    """
    if not q.strip():
        raise BadQueryError(EMPTY_QUERY_DETAIL)
    return q[: state.settings.max_query_chars]


async def guarded(awaitable):
    """Await a backend call; an unexpected exception becomes a logged SearchError
    (answered 500 without uvicorn's second traceback)."""
    try:
        return await awaitable
    except DrgymError:
        raise
    except Exception as e:
        log.exception("backend call failed")
        raise SearchError(f"{type(e).__name__}: {e}") from e


async def run_search(state: ServerState, query: str, k: int | None, with_distance: bool, collapse: str | None,
                     outlinks: list | None) -> SearchResponse:
    """One ``/search`` through the batcher: ``k`` None is ``default_k``, ``collapse`` None
    the server's; ``outlinks`` is returned as given.

    Raises:
        BadQueryError: empty query or k outside 1..max_k.
        OverloadedError: too many queries waiting.
        DrgymError: the backend failed (anything else it raises becomes a SearchError).
    """
    settings = state.settings
    k = settings.default_k if k is None else k
    check_k(state, k)
    hits = await guarded(state.batcher.search(clean_query(state, query), k, collapse or settings.collapse))
    return SearchResponse(
        results=[b64_json(result_record(r)) for r in hits],
        distances=[float(r.score) for r in hits] if with_distance else None,
        outlinks=outlinks,
        partial=partial_info([hits]),
    )


# ---- handlers. The parameters whose schema states a server's limits (k, collapse, the
# /retrieve body) are annotated with the plain types here; search_router registers each
# handler with the annotations of its server (see with_annotations). ----

QueryParam = Annotated[str, Query(description="free-text query; must contain a non-space character (else 400)",
                                  json_schema_extra={"minLength": 1, "pattern": r"\S"})]
DistParam = Annotated[bool, Query(description="also return each hit's score (higher is better)")]
UrlParam = Annotated[str, Query(description="document URL, looked up in the local store (exact or normalised "
                                            "match); never opened or downloaded")]


async def search(state: StateDep, query: QueryParam, k: int | None = None, with_distance: DistParam = False,
                 collapse: Collapse | None = None) -> SearchResponse:
    """Top-k documents (or passages) for ``query`` in DeepResearchGym's shape (base64 JSON documents)."""
    return await run_search(state, query, k, with_distance, collapse, [])


async def fineweb_search(state: StateDep, query: QueryParam, k: int | None = None, with_distance: DistParam = False,
                         collapse: Collapse | None = None) -> SearchResponse:
    """Alias of ``/search`` (DeepResearchGym's FineWeb route; ``outlinks`` is null)."""
    return await run_search(state, query, k, with_distance, collapse, None)


async def fetch(state: StateDep, url: UrlParam) -> FetchResponse:
    """The whole document at ``url`` as base64 JSON (``{"clean_text": ...}``)."""
    url = url.rstrip("\n")
    if not url.strip():
        raise HTTPException(status_code=404, detail=URL_NOT_FOUND_DETAIL)
    doc = await guarded(asyncio.to_thread(state.backend.fetch, url))
    return FetchResponse(clean_text=b64_json(document_record(doc)))


async def retrieve(state: StateDep, req: RetrieveRequest) -> RetrieveResponse:
    """Search-R1 batch retrieval: ``{"queries", "topk", "return_scores"}`` ->
    ``{"result": [[{"document": {"id", "contents"}, "score"}, ...] per query]}``.

    As Search-R1's server: ``topk`` null or 0 is the server default, and an empty or
    whitespace query answers ``[]`` in its place (the other queries are searched).
    """
    settings = state.settings
    k = req.topk or settings.retrieve_topk
    check_k(state, k, "topk")
    if len(req.queries) > settings.max_batch_queries:
        raise BadQueryError(f"at most {settings.max_batch_queries} queries per request, got {len(req.queries)}.")
    live = [i for i, q in enumerate(req.queries) if q.strip()]
    found = await guarded(state.batcher.search_many([req.queries[i][: settings.max_query_chars] for i in live], k,
                                                    req.collapse or settings.retrieve_collapse)) if live else []
    hits: list[list] = [[] for _ in req.queries]
    for i, hs in zip(live, found):
        hits[i] = hs
    if req.return_scores:
        return RetrieveResponse(result=[[RetrieveHit(document=retrieve_document(r), score=float(r.score))
                                         for r in hs] for hs in hits], partial=partial_info(hits))
    return RetrieveResponse(result=[[retrieve_document(r) for r in hs] for hs in hits], partial=partial_info(hits))


async def health(state: StateDep) -> HealthResponse:
    """Liveness plus what clients need: ``service == "drgym"``, ``max_k``, collapse defaults, counters."""
    backend, settings = state.backend, state.settings
    engine = await asyncio.to_thread(served_identity, backend)  # a proxied backend may ask its own server
    return HealthResponse(version=__version__, backend=getattr(backend, "name", type(backend).__name__),
                          index=repr(backend),
                          deterministic=bool(getattr(backend, "deterministic", True)), max_k=state.max_k,
                          collapse=settings.collapse if state.collapses else None,
                          retrieve_collapse=settings.retrieve_collapse if state.collapses else None,
                          engine=engine, stats=state.batcher.stats())


def with_annotations(handler, **annotations):
    """``handler`` (an async function) as an endpoint whose named parameters carry the
    given annotations; name, docstring and the other parameters are ``handler``'s.

    FastAPI reads an endpoint's parameters, and so its OpenAPI schema, from the
    endpoint's signature; this is how one top-level handler states each server's limits.

    Raises:
        TypeError: a name that is not a parameter of ``handler``.
    """
    sig = inspect.signature(handler)
    unknown = set(annotations) - set(sig.parameters)
    if unknown:
        raise TypeError(f"{handler.__name__} has no parameter {', '.join(sorted(unknown))}.")

    @functools.wraps(handler)
    async def endpoint(*args, **kwargs):
        return await handler(*args, **kwargs)

    params = [p.replace(annotation=annotations.get(p.name, p.annotation)) for p in sig.parameters.values()]
    endpoint.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    endpoint.__annotations__ = {**handler.__annotations__, **annotations}
    return endpoint


def search_router(state: ServerState, router: APIRouter | None = None) -> APIRouter:
    """The routes of a server, with its limits (``max_k``, ``default_k``, the collapse
    defaults, ``max_batch_queries``) in the parameter schemas, and the API-key check
    (:func:`check_key`) and its 401 answer on the search routes when it has keys.

    Args:
        state: the server's :class:`ServerState` (only its limits and keys are read here;
            the handlers read the app's own state, ``app.state.drgym``, at each request).
        router: the router to add the routes to (:func:`create_app` passes ``app.router``);
            None: a new one, for ``app.include_router``.

    Returns:
        ``router`` (or the new :class:`fastapi.APIRouter`) with ``/search``,
        ``/fineweb/search``, ``/fetch``, ``/retrieve`` and ``/health``.
    """
    settings, max_k = state.settings, state.max_k
    auth = [Depends(check_key)] if state.keys else []
    e401 = _E401 if state.keys else {}
    k_param = Annotated[int | None, Query(
        description=f"number of results, 1..{max_k} (else 400; default {settings.default_k})",
        json_schema_extra={"minimum": 1, "maximum": max_k})]
    collapse_param = Annotated[Collapse | None, Query(
        description=f"document: k distinct documents, each its best passage; passage: k best passages "
                    f"(default {settings.collapse})")]
    limits = {"k": k_param, "collapse": collapse_param}
    search_errors = {**_E400, **e401, **_E429, **_E500}

    router = APIRouter() if router is None else router
    router.add_api_route("/search", with_annotations(search, **limits), methods=["GET"], response_model=SearchResponse,
                         responses=search_errors, dependencies=auth, tags=["search"])
    router.add_api_route("/fineweb/search", with_annotations(fineweb_search, **limits), methods=["GET"],
                         response_model=SearchResponse, responses=search_errors, dependencies=auth, tags=["search"])
    router.add_api_route("/fetch", fetch, methods=["GET"], response_model=FetchResponse, dependencies=auth,
                         tags=["search"], responses={**e401, **_E404, **_E500})
    router.add_api_route("/retrieve",
                         with_annotations(retrieve, req=retrieve_request_model(max_k, settings.max_batch_queries)),
                         methods=["POST"], response_model=RetrieveResponse,
                         responses={**_E400, **e401, **_E429, **_E500},
                         dependencies=[*auth, Depends(reject_non_finite_json)], tags=["search"])
    router.add_api_route("/health", health, methods=["GET"], response_model=HealthResponse, tags=["meta"])
    return router


def create_app(backend: SearchBackend, settings: ServerSettings | None = None, *,
               close_backend: bool = False) -> FastAPI:
    """Build the service around ``backend``: its :class:`ServerState`, exception handlers,
    lifespan and routes (:func:`search_router`).

    Args:
        backend: any thread-safe :class:`SearchBackend` (usually a ``LocalSearchEngine``);
            its ``search_batch`` is called from a worker thread, one call at a time, with
            ``collapse=`` when it accepts it (else the backend's own results are served).
        settings: limits, batching, collapse and cache settings; None reads ``DRGYM_*`` env vars.
        close_backend: call ``backend.close()`` on shutdown (the CLI owns its backend;
            tests that pass a shared one keep it open).

    Returns:
        The FastAPI app; its :class:`ServerState` is ``app.state.drgym``, and the backend,
        settings and batcher are also ``app.state.backend``, ``.settings`` and ``.batcher``.
        Each call builds an independent app (a Ray Serve replica or a test can make several).
    """
    state = ServerState.build(backend, settings or ServerSettings(), close_backend=close_backend)
    app = FastAPI(
        title="drgym search",
        version=__version__,
        description="DeepResearchGym-compatible /search and /fetch, Search-R1-compatible /retrieve, over a local index.",
        lifespan=lifespan,
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.drgym = state
    app.state.backend = state.backend
    app.state.settings = state.settings
    app.state.batcher = state.batcher
    search_router(state, app.router)
    return app
