"""The drgym search service: a FastAPI app over any :class:`SearchBackend`.

Endpoints (shapes in :mod:`drgym.search.wire`):

=========================  ==========================================================
``GET /search``            DeepResearchGym search: ``query``, ``k`` (default 10),
                           ``with_distance`` (default false, as upstream; the drgym
                           client always asks for it). Other upstream parameters
                           (``complexity``, ``shard_ids``, ``rerank``...) are ignored.
``GET /fineweb/search``    the same, with ``outlinks: null`` as upstream's FineWeb route.
``GET /fetch``             ``url`` -> the whole document; 404 ``URL not found.``
``POST /retrieve``         Search-R1's batch retrieval.
``GET /health``            liveness, version, max_k and batching/cache counters (no auth).
``GET /docs``              OpenAPI UI; ``/openapi.json`` the schema.
=========================  ==========================================================

Errors are ``{"detail": ...}``: 400 empty or whitespace query, ``k``/``topk`` outside
1..max_k, too many queries; 401 bad API key (only when keys are configured); 404 unknown
URL; 422 missing or mistyped parameter; 429 (``Retry-After: 1``) more than
``max_pending`` queries waiting; 500 backend failure. A failed request never
stops the server.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from drgym.errors import BadQueryError, DocumentNotFoundError, DrgymError, SearchError
from drgym.search.base import SearchBackend
from drgym.search.wire import (
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
)
from drgym.server.batching import MicroBatcher, OverloadedError

log = logging.getLogger(__name__)

EMPTY_QUERY_DETAIL = "No query text in request: the query must contain a non-space character."
URL_NOT_FOUND_DETAIL = "URL not found."
BAD_KEY_DETAIL = "Invalid or missing API Key: send a key accepted by this server in the x-api-key header."

UVICORN_H11_MAX_EVENT = 1 << 20
"""Largest request head (bytes) uvicorn's h11 parser accepts; 10k-character queries need
more than its 16 KiB default once percent-encoded (httptools has no such limit)."""

_ERRORS = {
    400: {"model": ErrorResponse, "description": "empty query or k outside 1..max_k"},
    401: {"model": ErrorResponse, "description": "invalid or missing API key (when keys are configured)"},
    429: {"model": ErrorResponse, "description": "too many queries waiting (Retry-After: 1)"},
    500: {"model": ErrorResponse, "description": "backend failure"},
}


QueryParam = Annotated[str, Query(description="free-text query; must contain a non-space character")]
KParam = Annotated[int | None, Query(description="number of results, 1..max_k (default 10)")]
DistParam = Annotated[bool, Query(description="also return each hit's score (higher is better)")]
UrlParam = Annotated[str, Query(description="document URL (exact or normalised match)")]
ApiKeyHeader = Annotated[str | None, Header(description="API key (only checked when the server has keys)")]


def create_app(backend: SearchBackend, settings: ServerSettings | None = None, *,
               close_backend: bool = False) -> FastAPI:
    """Build the service around ``backend``.

    Args:
        backend: any thread-safe :class:`SearchBackend` (usually a ``LocalSearchEngine``);
            its ``search_batch`` is called from a worker thread, one call at a time.
        settings: limits, batching and cache settings; None reads ``DRGYM_*`` env vars.
        close_backend: call ``backend.close()`` on shutdown (the CLI owns its backend;
            tests that pass a shared one keep it open).

    Returns:
        The FastAPI app; the backend, settings and batcher are on ``app.state``.
    """
    settings = settings or ServerSettings()
    max_k = min(settings.max_k, getattr(backend, "max_k", settings.max_k))
    keys = settings.key_set()
    batcher = MicroBatcher(backend.search_batch, window_ms=settings.batch_window_ms,
                           max_batch_size=settings.max_batch_size, cache_size=settings.cache_size,
                           max_pending=settings.max_pending)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()
            if close_backend:
                backend.close()

    from drgym import __version__

    app = FastAPI(
        title="drgym search",
        version=__version__,
        description="DeepResearchGym-compatible /search and /fetch, Search-R1-compatible /retrieve, over a local index.",
        lifespan=lifespan,
    )
    app.state.backend = backend
    app.state.settings = settings
    app.state.batcher = batcher

    @app.exception_handler(BadQueryError)
    async def _bad_query(request: Request, exc: BadQueryError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    @app.exception_handler(DocumentNotFoundError)
    async def _not_found(request: Request, exc: DocumentNotFoundError) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": URL_NOT_FOUND_DETAIL})

    @app.exception_handler(OverloadedError)
    async def _overloaded(request: Request, exc: OverloadedError) -> JSONResponse:
        return JSONResponse(status_code=429, content={"detail": str(exc)}, headers={"Retry-After": "1"})

    @app.exception_handler(DrgymError)
    async def _drgym_error(request: Request, exc: DrgymError) -> JSONResponse:
        log.warning("%s %s failed: %s", request.method, request.url.path, exc)
        return JSONResponse(status_code=500, content={"detail": str(exc)})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}"})

    async def check_key(x_api_key: ApiKeyHeader = None) -> None:
        if keys and x_api_key not in keys:
            raise HTTPException(status_code=401, detail=BAD_KEY_DETAIL)

    Auth = Depends(check_key)

    def check_k(k: int, name: str = "k") -> None:
        if not 1 <= k <= max_k:
            raise BadQueryError(f"{name} must be between 1 and {max_k}, got {k}.")

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

    def clean_query(q: str) -> str:
        if not q.strip():
            raise BadQueryError(EMPTY_QUERY_DETAIL)
        return q[: settings.max_query_chars]

    async def run_search(query: str, k: int | None, with_distance: bool, outlinks: list | None) -> SearchResponse:
        k = settings.default_k if k is None else k
        check_k(k)
        hits = await guarded(batcher.search(clean_query(query), k))
        return SearchResponse(
            results=[b64_json(result_record(r)) for r in hits],
            distances=[float(r.score) for r in hits] if with_distance else None,
            outlinks=outlinks,
            partial=partial_info([hits]),
        )

    @app.get("/search", response_model=SearchResponse, responses=_ERRORS, dependencies=[Auth], tags=["search"])
    async def search(query: QueryParam, k: KParam = None, with_distance: DistParam = False) -> SearchResponse:
        """Top-k passages for ``query`` in DeepResearchGym's shape (base64 JSON documents)."""
        return await run_search(query, k, with_distance, [])

    @app.get("/fineweb/search", response_model=SearchResponse, responses=_ERRORS, dependencies=[Auth],
             tags=["search"])
    async def fineweb_search(query: QueryParam, k: KParam = None, with_distance: DistParam = False) -> SearchResponse:
        """Alias of ``/search`` (DeepResearchGym's FineWeb route; ``outlinks`` is null)."""
        return await run_search(query, k, with_distance, None)

    @app.get("/fetch", response_model=FetchResponse, dependencies=[Auth], tags=["search"],
             responses={**_ERRORS, 404: {"model": ErrorResponse, "description": "URL not found."}})
    async def fetch(url: UrlParam) -> FetchResponse:
        """The whole document at ``url`` as base64 JSON (``{"clean_text": ...}``)."""
        url = url.rstrip("\n")
        if not url.strip():
            raise HTTPException(status_code=404, detail=URL_NOT_FOUND_DETAIL)
        doc = await guarded(asyncio.to_thread(backend.fetch, url))
        return FetchResponse(clean_text=b64_json(document_record(doc)))

    @app.post("/retrieve", response_model=RetrieveResponse, responses=_ERRORS, dependencies=[Auth], tags=["search"])
    async def retrieve(req: RetrieveRequest) -> RetrieveResponse:
        """Search-R1 batch retrieval: ``{"queries", "topk", "return_scores"}`` ->
        ``{"result": [[{"document": {"id", "contents"}, "score"}, ...] per query]}``."""
        k = settings.retrieve_topk if req.topk is None else req.topk
        check_k(k, "topk")
        if len(req.queries) > settings.max_batch_queries:
            raise BadQueryError(f"at most {settings.max_batch_queries} queries per request, got {len(req.queries)}.")
        queries = []
        for i, q in enumerate(req.queries):
            if not q.strip():
                raise BadQueryError(f"query {i} is empty: a query needs at least one non-space character.")
            queries.append(q[: settings.max_query_chars])
        hits = await guarded(batcher.search_many(queries, k)) if queries else []
        if req.return_scores:
            return RetrieveResponse(result=[[RetrieveHit(document=retrieve_document(r), score=float(r.score))
                                             for r in hs] for hs in hits], partial=partial_info(hits))
        return RetrieveResponse(result=[[retrieve_document(r) for r in hs] for hs in hits], partial=partial_info(hits))

    @app.get("/health", response_model=HealthResponse, tags=["meta"])
    async def health() -> HealthResponse:
        """Liveness plus what clients need: ``service == "drgym"``, ``max_k``, counters."""
        return HealthResponse(version=__version__, backend=getattr(backend, "name", type(backend).__name__),
                              index=repr(backend),
                              deterministic=bool(getattr(backend, "deterministic", True)), max_k=max_k,
                              stats=batcher.stats())

    return app
