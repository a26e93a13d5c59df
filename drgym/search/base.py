"""The one search interface every backend implements.

Environments, rewards and evaluators only ever see a :class:`SearchBackend`: the
in-process :class:`drgym.search.local.LocalSearchEngine`, the HTTP client
:class:`drgym.search.client.HTTPSearchClient` (a drgym server or the public
DeepResearchGym API), or a commercial web backend.
"""

from __future__ import annotations

import abc
from dataclasses import replace
from typing import Any

from drgym.errors import BadQueryError
from drgym.types import Document, SearchResult

COLLAPSE_MODES: tuple[str, ...] = ("document", "passage")
"""How a passage index answers: ``"document"`` (k distinct documents, each shown by its
best-scoring passage: max-score aggregation, as DeepResearchGym's API returns distinct
documents) or ``"passage"`` (the k best passages, several possibly from one document,
as Search-R1's retriever over 100-word wiki-18 passages)."""

DEFAULT_COLLAPSE = "document"


def check_collapse(collapse: str) -> str:
    """Validate a collapse mode (:data:`COLLAPSE_MODES`).

    Raises:
        BadQueryError: any other value (named, with the accepted ones).
    """
    if collapse not in COLLAPSE_MODES:
        raise BadQueryError(f"collapse must be one of {', '.join(COLLAPSE_MODES)}, got {collapse!r}.")
    return collapse


def collapse_to_documents(results: list[SearchResult], k: int) -> list[SearchResult]:
    """Keep the first (best) hit of each document, re-ranked 1..n, at most ``k``.

    A document is named by ``metadata["parent_doc_id"]`` when the backend sets it (the
    local engine does), else by ``url``, else by ``doc_id``. ``results`` must be best
    first; the kept hit's passage text and score stand for its document (max-score
    aggregation).

    >>> from drgym.types import SearchResult
    >>> hits = [SearchResult(f"d{d}#p{p}", f"u{d}", "", "", s, r + 1)
    ...         for r, (d, p, s) in enumerate([(1, 0, .9), (1, 1, .8), (2, 0, .7)])]
    >>> [(h.doc_id, h.rank) for h in collapse_to_documents(hits, 2)]
    [('d1#p0', 1), ('d2#p0', 2)]
    """

    seen: set[str] = set()
    out: list[SearchResult] = []
    for r in results:
        key = str(r.metadata.get("parent_doc_id") or r.url or r.doc_id)
        if key in seen:
            continue
        seen.add(key)
        out.append(r if r.rank == len(out) + 1 else replace(r, rank=len(out) + 1))
        if len(out) == k:
            break
    return out


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

    def identity(self) -> dict[str, Any]:
        """What decides this backend's answers, as a JSON-ready dict (no secrets).

        A rollout run records it in ``config.json`` and refuses to resume against a
        backend whose identity differs (:func:`drgym.evaluation.runner.run_rollout`), so
        two sessions of one run never search different engines. Equal identities mean
        "the same engine"; subclasses return what changes their rankings (index
        fingerprint, method, provider...). Must be cheap and must not raise for a backend
        that works (a remote backend may ask its server once).

        Returns:
            Default: a wrapper that passes its calls to a backend in ``self.inner`` (a
            fault watch, a call counter) is that backend: ``self.inner.identity()``;
            anything else ``{"kind": "other", "name", "class", "max_k"}``.
        """
        inner = getattr(self, "inner", None)
        if isinstance(inner, SearchBackend) and inner is not self:
            return inner.identity()
        return {"kind": "other", "name": str(self.name), "class": type(self).__name__, "max_k": int(self.max_k)}

    def credentials(self) -> tuple[str, ...]:
        """The secret values this backend sends (API keys): never to be logged or stored.
        Recordings mask them (:mod:`drgym.redact`). Default: none."""
        return ()

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
