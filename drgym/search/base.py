"""The one search interface every backend implements.

Environments, rewards and evaluators only ever see a :class:`SearchBackend`: the
in-process :class:`drgym.search.local.LocalSearchEngine`, the HTTP client
:class:`drgym.search.client.HTTPSearchClient` (a drgym server or the public
DeepResearchGym API), or a commercial web backend.
"""

from __future__ import annotations

import abc

from drgym.errors import BadQueryError
from drgym.types import Document, SearchResult


class PartialResults(list):
    """The hits of one query from a sharded backend when some shards did not answer:
    the best of the shards that did (a plain ``list`` of :class:`SearchResult`).

    The server passes it on as a ``partial`` field of the answer and never caches it.

    Attributes:
        missing_shards: numbers of the shards that did not answer.
        n_shards: shards of the index.
    """

    partial = True

    def __init__(self, hits=(), *, missing_shards=(), n_shards: int = 0) -> None:
        super().__init__(hits)
        self.missing_shards = tuple(int(s) for s in missing_shards)
        self.n_shards = int(n_shards)


class SearchBackend(abc.ABC):
    """Search and fetch over some collection of documents.

    Subclasses implement :meth:`search_batch` and :meth:`fetch`; :meth:`search` is a
    batch of one. Implementations must be thread-safe for concurrent calls.

    Attributes:
        name: short backend name used in logs and run configs (``"local"``, ``"serper"``).
        deterministic: True when the same query always gives the same ranking (local
            indexes); False for live web backends (their Gymnasium envs register as
            nondeterministic).
        max_k: the largest ``k`` accepted.
    """

    name: str = "backend"
    deterministic: bool = True
    max_k: int = 100

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        """Return the top-``k`` passages for ``query``, best first.

        Args:
            query: free text; must contain a non-space character. Text longer than the
                encoder's window is truncated, not rejected.
            k: number of results, 1 <= k <= ``max_k``.

        Returns:
            At most ``k`` results with ranks 1..n (fewer when the collection is smaller).

        Raises:
            BadQueryError: empty or whitespace-only query, or k outside 1..max_k.
            SearchError: the backend failed.
        """
        return self.search_batch([query], k)[0]

    @abc.abstractmethod
    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        """Search several queries at once (one encoder call and one ANN search locally).

        Returns:
            One result list per query, in the order of ``queries``.

        Raises:
            BadQueryError: any query is empty, or k outside 1..max_k.
        """

    @abc.abstractmethod
    def fetch(self, url: str) -> Document:
        """Return the whole document at ``url`` (not just the passage a search hit).

        Raises:
            DocumentNotFoundError: no document has that URL.
        """

    def __deepcopy__(self, memo: dict) -> "SearchBackend":
        """A backend is a shared, thread-safe service handle: deep copies return it as is.

        Gymnasium deep-copies an env spec's kwargs (``env.spec.make()``, ``check_env``),
        which hold the backend passed to ``gymnasium.make``; copying an index or an HTTP
        client there would be slow or impossible.
        """
        return self

    def close(self) -> None:
        """Release resources (HTTP connections, file handles). Idempotent."""

    def __enter__(self) -> "SearchBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shared validation -------------------------------------------------------------
    def check_request(self, queries: list[str], k: int) -> None:
        """Validate a batch request; raise :class:`BadQueryError` naming the problem."""
        if isinstance(k, bool) or not isinstance(k, int):
            raise BadQueryError(f"k must be an integer, got {k!r}.")
        if not 1 <= k <= self.max_k:
            raise BadQueryError(f"k must be between 1 and {self.max_k}, got {k}.")
        if isinstance(queries, str):
            raise BadQueryError("queries must be a list of strings, got a single string.")
        for i, q in enumerate(queries):
            if not isinstance(q, str):
                raise BadQueryError(f"query {i} must be a string, got {type(q).__name__}.")
            if not q.strip():
                raise BadQueryError(f"query {i} is empty: a query needs at least one non-space character.")
