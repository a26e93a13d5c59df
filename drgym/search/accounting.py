"""Per-backend cost and latency accounting.

Every commercial search API bills per request; a study that compares backends has to
say what each one cost and how fast it answered. :class:`SearchUsage` counts calls, errors
and wall-clock latencies (thread-safe) and prices the calls; :class:`MeteredBackend`
wraps any :class:`~drgym.search.base.SearchBackend` and fills a :class:`SearchUsage`.

Default prices are the providers' public pay-as-you-go list prices per search request
(USD) seen in 2025; they change, so pass ``price_per_search`` to override:

============== ======== ====================================================
backend         USD/call source
============== ======== ====================================================
serper          0.001    serper.dev pricing: 50k queries for $50
tavily          0.008    tavily.com pricing: $0.008 per credit, basic search = 1 credit
brave           0.005    brave.com/search/api: Data for AI, $5 per 1,000 requests
deepresearchgym 0.0      free academic API (key on request)
local           0.0      runs on your own machine
============== ======== ====================================================

Page fetches done by drgym itself (``fetch``) cost nothing at the provider.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from drgym.errors import BadQueryError
from drgym.search.base import SearchBackend
from drgym.types import Document, SearchResult

#: Default USD price of one search request, by backend name (see module docstring).
DEFAULT_PRICES: dict[str, float] = {
    "serper": 0.001,
    "tavily": 0.008,
    "brave": 0.005,
    "deepresearchgym": 0.0,
    "local": 0.0,
}


def default_price(backend_name: str) -> float:
    """List price of one search call for ``backend_name`` (0.0 when unknown), USD."""
    return DEFAULT_PRICES.get(backend_name.split(":")[0].lower(), 0.0)


def latency_summary(latencies_s: list[float]) -> dict[str, float | None]:
    """Summary statistics of a list of latencies in seconds.

    Returns:
        ``{"n", "mean_s", "median_s", "p95_s", "max_s"}``; the statistics are None when
        the list is empty. p95 is the nearest-rank 95th percentile.
    """
    n = len(latencies_s)
    if n == 0:
        return {"n": 0, "mean_s": None, "median_s": None, "p95_s": None, "max_s": None}
    xs = sorted(latencies_s)
    rank = max(1, -(-95 * n // 100))  # ceil(0.95 n), nearest-rank definition
    return {
        "n": n,
        "mean_s": statistics.fmean(xs),
        "median_s": statistics.median(xs),
        "p95_s": xs[rank - 1],
        "max_s": xs[-1],
    }


@dataclass
class SearchUsage:
    """Counters for one backend: calls, errors, latencies, cost.

    Attributes:
        backend: backend name.
        price_per_search: USD per search request (see :data:`DEFAULT_PRICES`).
        searches: number of queries sent (a batch of n queries counts n).
        fetches: number of page fetches.
        errors: queries and fetches that failed (a failed batch of n queries counts n).
        search_latencies_s: wall time of each search call, seconds (a batch call adds
            one entry per query, each the batch time divided by its size).
        fetch_latencies_s: wall time of each fetch, seconds.
    """

    backend: str
    price_per_search: float = 0.0
    searches: int = 0
    fetches: int = 0
    errors: int = 0
    search_latencies_s: list[float] = field(default_factory=list)
    fetch_latencies_s: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_search(self, n_queries: int, seconds: float, *, error: bool = False) -> None:
        """Count one search request of ``n_queries`` queries that took ``seconds``."""
        with self._lock:
            self.searches += n_queries
            self.errors += n_queries if error else 0
            if n_queries:
                self.search_latencies_s.extend([seconds / n_queries] * n_queries)

    def add_fetch(self, seconds: float, *, error: bool = False) -> None:
        """Count one page fetch that took ``seconds``."""
        with self._lock:
            self.fetches += 1
            self.errors += int(error)
            self.fetch_latencies_s.append(seconds)

    @property
    def cost_usd(self) -> float:
        """``searches * price_per_search`` in USD."""
        return self.searches * self.price_per_search

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: counts, cost and latency statistics (no raw lists)."""
        with self._lock:
            return {
                "backend": self.backend,
                "searches": self.searches,
                "fetches": self.fetches,
                "errors": self.errors,
                "price_per_search_usd": self.price_per_search,
                "cost_usd": self.cost_usd,
                "search_latency": latency_summary(self.search_latencies_s),
                "fetch_latency": latency_summary(self.fetch_latencies_s),
            }


class MeteredBackend(SearchBackend):
    """Wrap a backend and count its calls, errors and latencies into :attr:`usage`.

    Args:
        inner: the backend to wrap; ``name``, ``deterministic`` and ``max_k`` are copied.
        price_per_search: USD per query; default :func:`default_price` of ``inner.name``.
        close_inner: whether :meth:`close` closes ``inner`` (False when the caller keeps
            using ``inner`` after this wrapper, e.g. one backend shared by several runs).

    Errors raised by ``inner`` pass through unchanged (and are counted).
    """

    def __init__(self, inner: SearchBackend, price_per_search: float | None = None, *, close_inner: bool = True):
        self.inner = inner
        self.close_inner = close_inner
        self.name = inner.name
        self.deterministic = inner.deterministic
        self.max_k = inner.max_k
        price = default_price(inner.name) if price_per_search is None else float(price_per_search)
        self.usage = SearchUsage(backend=inner.name, price_per_search=price)

    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        t0 = time.perf_counter()
        try:
            out = self.inner.search_batch(queries, k)
        except BadQueryError:
            raise  # rejected before any request: not billed, not a backend error
        except Exception:
            self.usage.add_search(len(queries), time.perf_counter() - t0, error=True)
            raise
        self.usage.add_search(len(queries), time.perf_counter() - t0)
        return out

    def fetch(self, url: str) -> Document:
        t0 = time.perf_counter()
        try:
            doc = self.inner.fetch(url)
        except Exception:
            self.usage.add_fetch(time.perf_counter() - t0, error=True)
            raise
        self.usage.add_fetch(time.perf_counter() - t0)
        return doc

    def close(self) -> None:
        if self.close_inner:
            self.inner.close()
