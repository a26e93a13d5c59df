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


BM25_BYTES_PER_PAIR = 40
"""Peak build memory of bm25s per (passage, distinct token) pair: its score, document
and vocabulary arrays (12 bytes), the scipy COO -> CSC conversion (about as much again)
and slack; measured by scripts/bench_scale.py (``bm25`` entries)."""

BM25_BYTES_PER_TERM = 400
"""Peak build memory per vocabulary term (Python dicts and sets of bm25s and drgym)."""

BM25_MEMORY_FRACTION = 0.8
"""A BM25 build may use this fraction of the memory available when it starts."""


class _TokenIds:
    """Token ids of every passage, kept in a flat int32 file (memory-mapped) and handed
    to bm25s as an iterable of lists, one passage at a time (bm25s reads it 3 times)."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, vocab: dict[str, int]) -> None:
        self.flat, self.offsets, self.vocab = flat, offsets, vocab

    @property
    def ids(self) -> "_TokenIds":
        return self

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __iter__(self):
        for a, b in zip(self.offsets[:-1], self.offsets[1:]):
            yield self.flat[a:b].tolist()


def write_bm25(folder: Path, texts, *, max_memory: int | None = None, chunk: int = 10_000) -> dict:
    """Build and save the BM25 index of ``texts`` (one per passage row) in ``folder/bm25``.

    The texts are streamed: tokenised ``chunk`` at a time with ``bm25s.tokenize``
    (the same tokens as one call over the whole corpus) into a flat token-id file on disk,
    then indexed by bm25s, whose score matrix is built in memory. That last step needs
    about :data:`BM25_BYTES_PER_PAIR` bytes per (passage, distinct token) pair plus
    :data:`BM25_BYTES_PER_TERM` per vocabulary term: about 2.4 GB per million 100-word
    passages. Before it starts, the need is estimated and compared with ``max_memory``.

    Args:
        folder: the index build folder.
        texts: iterable of passage texts in row order (a list, or
            :meth:`drgym.docstore.DocStoreWriter.iter_embed_texts`).
        max_memory: bytes the build may use; None is :data:`BM25_MEMORY_FRACTION` of the
            memory available now.
        chunk: texts tokenised per bm25s call.

    Returns:
        Settings recorded in the manifest (``k1``, ``b``, ``method``, ``stopwords``,
        ``vocab_size``, ``passage_term_pairs``).

    Raises:
        ConfigError: the estimated memory exceeds ``max_memory`` (the message gives both
            and the way out: build without BM25).
    """
    import itertools
    import shutil

    from drgym.errors import ConfigError

    bm25s = _bm25s()
    out_dir = Path(folder) / BM25_DIR
    tmp = Path(folder) / ".bm25-tokens"
    tmp.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    lengths: list[int] = []
    pairs = 0
    try:
        with open(tmp / "ids.bin", "wb") as f:
            it = iter(texts)
            while batch := list(itertools.islice(it, chunk)):
                toks = bm25s.tokenize(batch, stopwords=STOPWORDS, return_ids=False, show_progress=False)
                for doc in toks:
                    ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in doc), dtype=np.int32, count=len(doc))
                    f.write(ids.tobytes())
                    lengths.append(len(ids))
                    pairs += len(np.unique(ids))
        need = BM25_BYTES_PER_PAIR * pairs + BM25_BYTES_PER_TERM * len(vocab)
        if max_memory is None:
            import psutil

            max_memory = int(BM25_MEMORY_FRACTION * psutil.virtual_memory().available)
        if need > max_memory:
            raise ConfigError(
                f"BM25 over {len(lengths):,} passages ({pairs:,} passage-term pairs, {len(vocab):,} terms) needs about "
                f"{need / 2**30:.1f} GiB of memory, more than the {max_memory / 2**30:.1f} GiB available; "
                "build without BM25 (--no-bm25, dense search only) or on a machine with more memory."
            )
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
        flat = np.memmap(tmp / "ids.bin", dtype=np.int32, mode="r") if offsets[-1] else np.zeros(0, np.int32)
        retriever = bm25s.BM25()
        retriever.index(_TokenIds(flat, offsets, vocab), show_progress=False)
        del flat
        retriever.save(str(out_dir))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "dir": BM25_DIR,
        "method": retriever.method,
        "k1": retriever.k1,
        "b": retriever.b,
        "stopwords": STOPWORDS,
        "vocab_size": len(retriever.vocab_dict),
        "passage_term_pairs": int(pairs),
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
