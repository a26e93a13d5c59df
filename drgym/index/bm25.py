"""Lexical BM25 index (``bm25s``) and reciprocal rank fusion for hybrid search.

BM25 (Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework: BM25 and
Beyond", §3) with bm25s's defaults (``k1=1.5``, ``b=0.75``, Lucene IDF), lower-cased
``\\w\\w+`` tokens and bm25s's English stopword list, no stemming. The indexed text of a
passage is ``"title\\ntext"`` (:attr:`Passage.embed_text`), as for dense search.

Hybrid search fuses the dense and BM25 rankings with reciprocal rank fusion (Cormack,
Clarke & Büttcher 2009, "Reciprocal Rank Fusion outperforms Condorcet and individual
Rank Learning Methods", SIGIR, eq. 1): ``score(p) = sum_r 1 / (k + rank_r(p))`` with
``k = 60`` and 1-based ranks.
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path

import numpy as np

from drgym.errors import CorruptIndexError

BM25_DIR = "bm25"
STOPWORDS = "en"
RRF_K = 60



@functools.cache
def _bm25s():
    """Import bm25s once, undoing its import-time ``logger.setLevel(DEBUG)`` (which would
    print "Building index" lines under any root handler)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s

class BM25Index:
    """A loaded bm25s index over the passage rows.

    Args:
        folder: the index folder (the BM25 files are in ``folder/bm25``).
        n_passages: expected number of rows.

    Raises:
        CorruptIndexError: the bm25s files are unreadable or hold another row count.
    """

    def __init__(self, folder: str | Path, n_passages: int) -> None:
        bm25s = _bm25s()

        self.path = Path(folder) / BM25_DIR
        try:
            self.retriever = bm25s.BM25.load(str(self.path), mmap=True)
        except Exception as e:  # noqa: BLE001 - bm25s raises many kinds on bad files
            raise CorruptIndexError(f"BM25 index {self.path} is unreadable ({type(e).__name__}: {e}); rebuild the index.") from e
        n = int(self.retriever.scores.get("num_docs", -1))
        if n != n_passages:
            raise CorruptIndexError(f"BM25 index {self.path} holds {n} passages, the manifest says {n_passages}.")
        self.n_passages = n
        self._lock = threading.Lock()

    def tokenize(self, query: str) -> list[int]:
        """Vocabulary ids of a query's tokens (unknown words and stopwords dropped)."""
        bm25s = _bm25s()

        toks = bm25s.tokenize([query], stopwords=STOPWORDS, return_ids=False, show_progress=False)[0]
        return self.retriever.get_tokens_ids([t for t in toks if t])

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query``: float32 ``(n_passages,)``, all zero
        when no query word is in the vocabulary."""
        ids = self.tokenize(query)
        if not ids:
            return np.zeros(self.n_passages, dtype=np.float32)
        with self._lock:  # bm25s keeps per-call state on the retriever
            return np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float32)

    def search(self, queries: list[str], k: int, tie_rank: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` passages per query with a positive BM25 score.

        Args:
            queries: query strings.
            k: results per query.
            tie_rank: int64 ``(n_passages,)`` passage_id ranks for tie-breaks.

        Returns:
            Per query ``(scores, rows)``: float32 and int64 arrays of length <= k, best
            first, equal scores ordered by passage_id. Passages sharing no word with the
            query are never returned.
        """
        out = []
        for q in queries:
            s = self.scores(q)
            pos = np.flatnonzero(s > 0)
            if len(pos) > k + 64:
                # Partition on a margin so that ties at the cut-off are all kept.
                part = np.argpartition(-s[pos], k + 63)[: k + 64]
                thr = s[pos[part]].min()
                pos = pos[s[pos] >= thr]
            order = np.lexsort((tie_rank[pos], -s[pos]))[:k]
            rows = pos[order].astype(np.int64)
            out.append((s[rows], rows))
        return out


def write_bm25(folder: Path, texts: list[str]) -> dict:
    """Build and save the BM25 index of ``texts`` (one per passage row) in ``folder/bm25``.

    Returns:
        Settings recorded in the manifest (``k1``, ``b``, ``method``, ``stopwords``,
        ``vocab_size``).
    """
    bm25s = _bm25s()

    retriever = bm25s.BM25()
    tokens = bm25s.tokenize(texts, stopwords=STOPWORDS, show_progress=False)
    retriever.index(tokens, show_progress=False)
    retriever.save(str(Path(folder) / BM25_DIR))
    return {
        "dir": BM25_DIR,
        "method": retriever.method,
        "k1": retriever.k1,
        "b": retriever.b,
        "stopwords": STOPWORDS,
        "vocab_size": len(retriever.vocab_dict),
    }


def rrf_fuse(
    rankings: list[np.ndarray], k: int, tie_rank: np.ndarray, rrf_k: int = RRF_K
) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of several rankings of one query.

    Args:
        rankings: int64 row arrays, each best first (``-1`` entries ignored).
        k: results to keep.
        tie_rank: int64 passage_id ranks for tie-breaks.
        rrf_k: the RRF constant (60 in Cormack et al. 2009).

    Returns:
        ``(scores, rows)``: float32 RRF scores and int64 rows, best first, length <= k.
    """
    acc: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(ranking, 1):
            row = int(row)
            if row >= 0:
                acc[row] = acc.get(row, 0.0) + 1.0 / (rrf_k + rank)
    if not acc:
        return np.zeros(0, np.float32), np.zeros(0, np.int64)
    rows = np.fromiter(acc.keys(), dtype=np.int64, count=len(acc))
    scores = np.fromiter(acc.values(), dtype=np.float64, count=len(acc))
    order = np.lexsort((tie_rank[rows], -scores))[:k]
    return scores[order].astype(np.float32), rows[order]
