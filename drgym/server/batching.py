"""Fair micro-batching of concurrent search requests, and the byte-bounded LRU result cache.

Many agents querying one server at once (a GRPO group of rollouts, say) each send one
query. Encoding 64 queries in one forward pass and searching them with one FAISS call is
far cheaper than 64 separate calls, so :class:`MicroBatcher` collects the queries that
arrive while the previous batch runs (plus a short window after the first one) and sends
them to ``backend.search_batch`` together, in a worker thread so the event loop keeps
accepting requests.

Batches are filled fairly: every waiting request gives one query in turn (round-robin)
until the batch is full, so a request of one query waits about one batch time even while
another client's request of thousands of queries is being served in batch-sized chunks.
Each request's results come back in its own order, exactly as a direct
``search_batch`` call would return them.

Repeated ``(query, k, collapse)`` requests are answered by an LRU cache without touching
the backend; the cache is bounded in (estimated) bytes, since one entry of ``k=100``
passages costs about a hundred times one of ``k=1``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from drgym.errors import BackendUnavailableError
from drgym.types import SearchResult

log = logging.getLogger(__name__)

SearchBatchFn = Callable[[list[str], int, "str | None"], list[list[SearchResult]]]
"""``search_fn(queries, k, collapse)``: one result list per query."""

DEFAULT_CACHE_MB = 64.0
"""Default byte budget of the server's result cache, in MiB (``drgym serve --cache-mb``)."""

MAX_RETRY_AFTER_S = 60
"""Largest ``Retry-After`` the batcher suggests, in seconds."""


class OverloadedError(BackendUnavailableError):
    """Too many queries are waiting; the server answers 429 with ``Retry-After``.

    Attributes:
        retry_after: whole seconds the client should wait before retrying (1..60), the
            batcher's estimate of how long the queries now waiting take to serve.
    """

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# Fixed per-object costs (CPython 3.11, 64-bit) added to the strings' own sizes: a
# SearchResult instance with its attribute dict, float score and int rank; a cache slot
# (OrderedDict node, key tuple, value tuple).
_RESULT_OVERHEAD = 56 + 104 + 24 + 28
_ENTRY_OVERHEAD = 104 + 64 + 56


def _deep_sizeof(value: Any, _depth: int = 0) -> int:
    """``sys.getsizeof`` of ``value`` plus that of what it holds (dicts, lists, tuples,
    sets; nested at most 4 deep; shared objects counted each time they are met)."""
    n = sys.getsizeof(value)
    if _depth >= 4:
        return n
    if isinstance(value, dict):
        n += sum(_deep_sizeof(k, _depth + 1) + _deep_sizeof(v, _depth + 1) for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        n += sum(_deep_sizeof(v, _depth + 1) for v in value)
    return n


def result_nbytes(result: SearchResult) -> int:
    """Estimated bytes held by one :class:`SearchResult`: its strings (``sys.getsizeof``,
    so non-ASCII text counts at its real width), its ``metadata`` and a fixed overhead."""
    n = _RESULT_OVERHEAD
    for name in ("doc_id", "url", "title", "text", "source"):
        n += sys.getsizeof(getattr(result, name, ""))
    md = getattr(result, "metadata", None)
    if md:
        n += _deep_sizeof(md)
    return n


def entry_nbytes(key: Hashable, value: Any) -> int:
    """Estimated bytes of one cache entry: the key (strings and numbers), each result of a
    tuple or list of :class:`SearchResult` (:func:`result_nbytes`), anything else by
    ``sys.getsizeof`` (shallow) and the cache's own per-entry overhead. Strings shared by
    several entries are counted in each, so the estimate errs high."""
    n = _ENTRY_OVERHEAD + _deep_sizeof(key)
    if isinstance(value, (tuple, list)):
        n += sys.getsizeof(value)
        for r in value:
            n += result_nbytes(r) if isinstance(r, SearchResult) else _deep_sizeof(r)
    else:
        n += _deep_sizeof(value)
    return n


class LRUCache:
    """A least-recently-used map bounded in entries and/or estimated bytes; used from the
    event loop thread only.

    Args:
        maxsize: most entries kept; None for no entry bound; 0 disables the cache (every
            ``get`` misses).
        max_bytes: most estimated bytes kept (``sizeof`` of every entry, summed); None for
            no byte bound; 0 disables the cache. An entry larger than the whole budget is
            not stored.
        sizeof: ``sizeof(key, value)`` -> estimated bytes; default :func:`entry_nbytes`.

    Attributes:
        nbytes: estimated bytes of the entries now held (always <= ``max_bytes``).
        hits, misses, evictions: counters since creation.
    """

    def __init__(self, maxsize: int | None = None, *, max_bytes: int | None = None,
                 sizeof: Callable[[Hashable, Any], int] = entry_nbytes) -> None:
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.sizeof = sizeof
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def enabled(self) -> bool:
        """False when either bound is 0 (nothing is ever stored)."""
        return self.maxsize != 0 and self.max_bytes != 0

    def get(self, key: Hashable) -> Any | None:
        """The value for ``key`` (marking it recently used), or None."""
        slot = self._data.get(key)
        if slot is not None:
            self._data.move_to_end(key)
            self.hits += 1
            return slot[0]
        self.misses += 1
        return None

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value``, evicting least recently used entries while either bound is exceeded."""
        if not self.enabled:
            return
        size = self.sizeof(key, value)
        if self.max_bytes is not None and size > self.max_bytes:
            return
        old = self._data.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._data[key] = (value, size)
        self.nbytes += size
        while self._data and ((self.maxsize is not None and len(self._data) > self.maxsize)
                              or (self.max_bytes is not None and self.nbytes > self.max_bytes)):
            _, (_, evicted) = self._data.popitem(last=False)
            self.nbytes -= evicted
            self.evictions += 1

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)


@dataclass(eq=False)
class _Item:
    query: str
    k: int
    collapse: str | None
    future: asyncio.Future = field(repr=False)


@dataclass(eq=False)
class _Request:
    """One ``search_many`` call's queries not yet sent to the backend (unique, in order)."""

    k: int
    collapse: str | None
    items: deque[_Item]


class MicroBatcher:
    """Coalesce concurrent ``(query, k, collapse)`` requests into fair ``search_batch`` calls.

    One worker task waits for the first queued query, then up to ``window_ms`` for more
    (or until ``max_batch_size`` are queued), and fills a batch round-robin: each waiting
    request with the same ``(k, collapse)`` as the oldest one gives its next query in
    turn until the batch holds ``max_batch_size``; then the oldest request goes to the
    back of the line. A large request is so served in chunks interleaved with everyone
    else's, and a one-query request waits about one batch time however much is queued.
    Each batch is one ``search_fn(queries, k, collapse)`` call in a thread
    (``asyncio.to_thread``); identical queries in a batch are searched once. If a batch
    of several queries fails, each query is retried alone so one bad query cannot fail
    its neighbours.

    Args:
        search_fn: ``search_fn(queries, k, collapse)``, usually ``backend.search_batch``;
            called from a worker thread, one call at a time.
        window_ms: wait after the first query of a batch, in milliseconds.
        max_batch_size: most queries in one call.
        cache_size: most LRU entries; None for no entry bound, 0 disables the cache.
        cache_bytes: byte budget of the LRU cache (estimated, see :func:`entry_nbytes`);
            None for no byte bound, 0 disables the cache.
        max_pending: most queries waiting for a batch, all requests together; a request
            that would exceed it raises :class:`OverloadedError` (429) instead of queueing
            without bound.
        max_request_pending: most queries one request may have waiting; a request with
            more (after cache hits and duplicates are removed) raises
            :class:`OverloadedError` while other queries wait.

    A request finding nothing waiting is always taken. Use ``await start()`` inside the
    running loop (the server's lifespan) and ``await stop()`` on shutdown.
    """

    def __init__(self, search_fn: SearchBatchFn, *, window_ms: float = 1.0, max_batch_size: int = 64,
                 cache_size: int | None = None, cache_bytes: int | None = int(DEFAULT_CACHE_MB * 2**20),
                 max_pending: int = 16384, max_request_pending: int = 4096) -> None:
        self.search_fn = search_fn
        self.window_s = max(0.0, window_ms) / 1000.0
        self.max_batch_size = max(1, max_batch_size)
        self.cache = LRUCache(cache_size, max_bytes=cache_bytes)
        self.max_pending = max(1, max_pending)
        self.max_request_pending = max(1, max_request_pending)
        self.rejected = 0
        self._active: deque[_Request] = deque()
        self._waiting = 0
        self._inflight: list[_Item] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._batch_s: float | None = None  # moving average of one search_fn call, seconds
        self.requests = 0
        self.batches = 0
        self.batched_queries = 0
        self.largest_batch = 0
        self.errors = 0

    @property
    def waiting(self) -> int:
        """Queries queued and not yet sent to the backend."""
        return self._waiting

    async def start(self) -> None:
        """Start the worker task in the running event loop."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name="drgym-microbatcher")

    async def stop(self) -> None:
        """Stop the worker; queued and running requests fail with ``RuntimeError``."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        items = list(self._inflight)
        for req in self._active:
            items.extend(req.items)
            req.items.clear()
        self._active.clear()
        self._inflight = []
        self._waiting = 0
        for item in items:
            if not item.future.done():
                item.future.set_exception(RuntimeError("server is shutting down"))

    async def search(self, query: str, k: int, collapse: str | None = None) -> list[SearchResult]:
        """Top-``k`` results of one (already validated) query, from cache or a batch.

        Raises:
            OverloadedError: too many queries are waiting (429).
            Whatever ``search_fn`` raised for this query.
        """
        return (await self.search_many([query], k, collapse))[0]

    def retry_after_s(self, ahead: int) -> int:
        """Whole seconds (1..60) to serve ``ahead`` queries at the recent batch time (1 before
        any batch has finished)."""
        if self._batch_s is None:
            return 1
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(math.ceil(ahead / self.max_batch_size) * self._batch_s)))

    def _admit(self, n: int) -> None:
        waiting = self._waiting
        if not n or not waiting:  # an idle server takes any request
            return
        if n > self.max_request_pending:
            self.rejected += n
            raise OverloadedError(
                f"server busy: this request has {n} queries to search and one request may have at most "
                f"{self.max_request_pending} waiting (max_request_pending) while {waiting} others wait; "
                "retry later or send fewer queries per request.", self.retry_after_s(waiting))
        if waiting + n > self.max_pending:
            self.rejected += n
            raise OverloadedError(
                f"server overloaded: {waiting} queries are waiting and this request adds "
                f"{n} (max_pending={self.max_pending}); retry later.",
                self.retry_after_s(waiting + n - self.max_pending))

    async def search_many(self, queries: list[str], k: int, collapse: str | None = None) -> list[list[SearchResult]]:
        """Results of several queries, in their order; cache hits are answered at once, the
        rest queued (each distinct query once) and served fairly with other requests.

        Raises:
            RuntimeError: :meth:`start` was not awaited.
            OverloadedError: too many queries are waiting (429), see the class.
            The first (in query order) exception ``search_fn`` raised for these queries.
        """
        if self._wake is None:
            raise RuntimeError("MicroBatcher.start() was not awaited")
        self.requests += len(queries)
        loop = asyncio.get_running_loop()
        out: list[list[SearchResult] | None] = [None] * len(queries)
        misses: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            hit = self.cache.get((q, k, collapse))
            if hit is not None:
                out[i] = list(hit)
            else:
                misses.setdefault(q, []).append(i)
        if not misses:
            return out  # type: ignore[return-value]
        self._admit(len(misses))
        futures = {q: loop.create_future() for q in misses}
        req = _Request(k, collapse, deque(_Item(q, k, collapse, f) for q, f in futures.items()))
        self._active.append(req)
        self._waiting += len(req.items)
        self._wake.set()
        try:
            # return_exceptions: every future's outcome is retrieved (no "never retrieved"
            # warnings when several queries of one request fail); the first error is raised.
            results = await asyncio.gather(*futures.values(), return_exceptions=True)
        finally:
            if req.items:  # cancelled: its queries not yet sent are dropped
                self._waiting -= len(req.items)
                req.items.clear()
        for res in results:
            if isinstance(res, BaseException):
                raise res
        for q, res in zip(futures, results):
            for i in misses[q]:
                out[i] = res if getattr(res, "partial", False) else list(res)
        return out  # type: ignore[return-value]

    def stats(self) -> dict[str, int | float]:
        """Counters since start: requests, batches, mean/largest batch, cache hits and
        bytes, queries waiting, errors, rejected queries."""
        return {
            "requests": self.requests,
            "batches": self.batches,
            "batched_queries": self.batched_queries,
            "mean_batch_size": round(self.batched_queries / self.batches, 3) if self.batches else 0.0,
            "largest_batch": self.largest_batch,
            "cache_hits": self.cache.hits,
            "cache_entries": len(self.cache),
            "cache_bytes": self.cache.nbytes,
            "cache_evictions": self.cache.evictions,
            "waiting": self._waiting,
            "errors": self.errors,
            "rejected_overloaded": self.rejected,
        }

    # -- worker ------------------------------------------------------------------------
    async def _wait_for_work(self) -> None:
        assert self._wake is not None
        while not self._waiting:
            self._wake.clear()
            await self._wake.wait()
        if self.window_s <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.window_s
        while self._waiting < self.max_batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except TimeoutError:
                return

    def _take(self) -> tuple[int, str | None, list[_Item]] | None:
        """The next batch, round-robin over the waiting requests with the oldest one's
        ``(k, collapse)``; the oldest request then goes to the back of the line."""
        active = self._active
        while active and not active[0].items:
            active.popleft()
        if not active:
            return None
        head = active[0]
        k, collapse = head.k, head.collapse
        turn = [r for r in active if r.items and r.k == k and r.collapse == collapse]
        batch: list[_Item] = []
        while turn and len(batch) < self.max_batch_size:
            for r in turn:
                if len(batch) >= self.max_batch_size:
                    break
                it = r.items.popleft()
                self._waiting -= 1
                if not it.future.done():  # a cancelled request needs no answer
                    batch.append(it)
            turn = [r for r in turn if r.items]
        active.rotate(-1)
        self._active = deque(r for r in active if r.items)
        return k, collapse, batch

    async def _run(self) -> None:
        while True:
            await self._wait_for_work()
            taken = self._take()
            if taken is None:
                continue
            k, collapse, items = taken
            self._inflight = items
            try:
                await self._run_group(k, collapse, items)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # never let the worker die: fail this batch only
                log.exception("micro-batch worker error")
                for it in items:
                    if not it.future.done():
                        it.future.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))
            finally:
                self._inflight = []

    def _timed_search(self, queries: list[str], k: int, collapse: str | None) -> list[list[SearchResult]]:
        t = time.perf_counter()
        results = self.search_fn(queries, k, collapse)
        dt = time.perf_counter() - t
        self._batch_s = dt if self._batch_s is None else 0.8 * self._batch_s + 0.2 * dt
        return results

    async def _run_group(self, k: int, collapse: str | None, items: list[_Item]) -> None:
        live = [it for it in items if not it.future.done()]  # a cancelled request needs no answer
        if not live:
            return
        queries = list(dict.fromkeys(it.query for it in live))
        self.batches += 1
        self.batched_queries += len(queries)
        self.largest_batch = max(self.largest_batch, len(queries))
        try:
            results = await asyncio.to_thread(self._timed_search, queries, k, collapse)
            if len(results) != len(queries):
                raise RuntimeError(f"backend returned {len(results)} result lists for {len(queries)} queries")
            by_query: dict[str, list[SearchResult] | BaseException] = dict(zip(queries, results))
        except Exception as e:  # isolate the failing query: retry one by one
            if len(queries) == 1:
                by_query = {queries[0]: e}
            else:
                log.warning("batch of %d queries failed (%s); retrying one by one", len(queries), e)
                by_query = {}
                for q in queries:
                    try:
                        by_query[q] = (await asyncio.to_thread(self.search_fn, [q], k, collapse))[0]
                    except Exception as e1:
                        by_query[q] = e1
        for q, res in by_query.items():
            if isinstance(res, BaseException):
                self.errors += 1
            else:
                if not getattr(res, "partial", False):  # shards missing: never cached
                    self.cache.put((q, k, collapse), tuple(res))
        for it in live:
            if it.future.done():
                continue
            res = by_query[it.query]
            if isinstance(res, BaseException):
                it.future.set_exception(res)
            else:
                it.future.set_result(res)
