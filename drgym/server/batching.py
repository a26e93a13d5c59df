"""Micro-batching of concurrent search requests, and the LRU result cache.

Many agents querying one server at once (a GRPO group of rollouts, say) each send one
query. Encoding 64 queries in one forward pass and searching them with one FAISS call is
far cheaper than 64 separate calls, so :class:`MicroBatcher` collects the queries that
arrive while the previous batch runs (plus a short window after the first one) and sends
them to ``backend.search_batch`` together, in a worker thread so the event loop keeps
accepting requests. Repeated ``(query, k, collapse)`` requests are answered by an LRU
cache without touching the backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from drgym.errors import BackendUnavailableError
from drgym.types import SearchResult

log = logging.getLogger(__name__)

SearchBatchFn = Callable[[list[str], int, "str | None"], list[list[SearchResult]]]
"""``search_fn(queries, k, collapse)``: one result list per query."""


class OverloadedError(BackendUnavailableError):
    """Too many queries are waiting; the server answers 429 with ``Retry-After``."""


class LRUCache:
    """A bounded least-recently-used map; used from the event loop thread only.

    Args:
        maxsize: most entries kept; 0 disables the cache (every ``get`` misses).
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any | None:
        """The value for ``key`` (marking it recently used), or None."""
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value``, evicting the least recently used entry when full."""
        if self.maxsize <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


@dataclass
class _Item:
    query: str
    k: int
    collapse: str | None
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """Coalesce concurrent ``(query, k, collapse)`` requests into ``search_batch`` calls.

    One worker task takes the first queued query, waits up to ``window_ms`` for more (or
    until ``max_batch_size`` are queued), groups them by ``(k, collapse)`` and runs one
    ``search_fn(queries, k, collapse)`` per group in a thread (``asyncio.to_thread``). Queries that
    arrive while a batch runs form the next batch, so batches grow with load. If a batch
    of several queries fails, each query is retried alone so one bad query cannot fail
    its neighbours.

    Args:
        search_fn: ``search_fn(queries, k, collapse)``, usually ``backend.search_batch``;
            called from a worker thread, one call at a time.
        window_ms: wait after the first query of a batch, in milliseconds.
        max_batch_size: most queries in one call.
        cache_size: LRU entries (0 disables the cache).
        max_pending: most queries waiting for a batch; a request that would exceed it
            raises :class:`OverloadedError` (429) instead of queueing without bound (a
            request finding the queue empty is always taken).

    Use ``await start()`` inside the running loop (the server's lifespan) and
    ``await stop()`` on shutdown.
    """

    def __init__(self, search_fn: SearchBatchFn, *, window_ms: float = 1.0, max_batch_size: int = 64,
                 cache_size: int = 4096, max_pending: int = 16384) -> None:
        self.search_fn = search_fn
        self.window_s = max(0.0, window_ms) / 1000.0
        self.max_batch_size = max(1, max_batch_size)
        self.cache = LRUCache(cache_size)
        self.max_pending = max(1, max_pending)
        self.rejected = 0
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task | None = None
        self.requests = 0
        self.batches = 0
        self.batched_queries = 0
        self.largest_batch = 0
        self.errors = 0

    async def start(self) -> None:
        """Start the worker task in the running event loop."""
        if self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._run(), name="drgym-microbatcher")

    async def stop(self) -> None:
        """Stop the worker; queued requests fail with ``RuntimeError``."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        while self._queue is not None and not self._queue.empty():
            item = self._queue.get_nowait()
            if not item.future.done():
                item.future.set_exception(RuntimeError("server is shutting down"))

    async def search(self, query: str, k: int, collapse: str | None = None) -> list[SearchResult]:
        """Top-``k`` results of one (already validated) query, from cache or a batch.

        Raises:
            Whatever ``search_fn`` raised for this query.
        """
        return (await self.search_many([query], k, collapse))[0]

    async def search_many(self, queries: list[str], k: int, collapse: str | None = None) -> list[list[SearchResult]]:
        """Results of several queries; cache hits are answered at once, misses batched."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not awaited")
        self.requests += len(queries)
        loop = asyncio.get_running_loop()
        out: list[list[SearchResult] | None] = [None] * len(queries)
        misses: list[int] = []
        for i, q in enumerate(queries):
            hit = self.cache.get((q, k, collapse))
            if hit is not None:
                out[i] = list(hit)
            else:
                misses.append(i)
        waiting = self._queue.qsize()
        if misses and waiting and waiting + len(misses) > self.max_pending:  # an idle server takes any request
            self.rejected += len(misses)
            raise OverloadedError(
                f"server overloaded: {waiting} queries are waiting and this request adds "
                f"{len(misses)} (max_pending={self.max_pending}); retry later."
            )
        pending: list[tuple[int, asyncio.Future]] = []
        for i in misses:
            fut = loop.create_future()
            self._queue.put_nowait(_Item(queries[i], k, collapse, fut))
            pending.append((i, fut))
        if pending:
            # return_exceptions: every future's outcome is retrieved (no "never retrieved"
            # warnings when several queries of one request fail); the first error is raised.
            results = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
            for res in results:
                if isinstance(res, BaseException):
                    raise res
            for (i, _), res in zip(pending, results):
                out[i] = res if getattr(res, "partial", False) else list(res)
        return out  # type: ignore[return-value]

    def stats(self) -> dict[str, int | float]:
        """Counters since start: requests, batches, mean/largest batch, cache hits."""
        return {
            "requests": self.requests,
            "batches": self.batches,
            "batched_queries": self.batched_queries,
            "mean_batch_size": round(self.batched_queries / self.batches, 3) if self.batches else 0.0,
            "largest_batch": self.largest_batch,
            "cache_hits": self.cache.hits,
            "cache_entries": len(self.cache),
            "errors": self.errors,
            "rejected_overloaded": self.rejected,
        }

    # -- worker ------------------------------------------------------------------------
    async def _collect(self) -> list[_Item]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.window_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            groups: dict[tuple[int, str | None], list[_Item]] = {}
            for item in batch:
                groups.setdefault((item.k, item.collapse), []).append(item)
            for (k, collapse), items in groups.items():
                try:
                    await self._run_group(k, collapse, items)
                except asyncio.CancelledError:
                    raise
                except BaseException as e:  # never let the worker die: fail this group only
                    log.exception("micro-batch worker error")
                    for it in items:
                        if not it.future.done():
                            it.future.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))

    async def _run_group(self, k: int, collapse: str | None, items: list[_Item]) -> None:
        live = [it for it in items if not it.future.done()]  # a cancelled request needs no answer
        if not live:
            return
        queries = list(dict.fromkeys(it.query for it in live))
        self.batches += 1
        self.batched_queries += len(queries)
        self.largest_batch = max(self.largest_batch, len(queries))
        try:
            results = await asyncio.to_thread(self.search_fn, queries, k, collapse)
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
