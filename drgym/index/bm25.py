"""Lexical BM25 index (``bm25s``) and reciprocal rank fusion for hybrid search.

BM25 (Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework: BM25 and
Beyond", §3) with bm25s's defaults (``k1=1.5``, ``b=0.75``, Lucene IDF), no stemming,
and drgym's tokeniser :func:`tokenize` (:data:`TOKENIZER`), the same at index and query
time: lower-cased runs of two or more word characters, as bm25s's
``(?u)\\b\\w\\w+\\b`` (with its English stopword list), except that Chinese, Japanese and
Korean characters, which are written without spaces between words, are cut into
overlapping character bigrams (a run of one character is kept as a unigram), as Lucene's
``CJKBigramFilter`` does: ``低头思故乡`` -> ``低头 头思 思故 故乡``, so the query ``故乡``
finds it. Text without CJK characters gets exactly bm25s's tokens. The indexed text of a
passage is ``"title\\ntext"`` (:attr:`Passage.embed_text`), as for dense search.

An index built before CJK bigrams (its manifest's ``bm25`` has no ``"tokenizer"``) is
searched with bm25s's tokens, as it was built; ``drgym index build`` rebuilds it.

A loaded index checks each query's columns of the score matrix before summing them (the
column bounds, rows in range, finite scores): a garbled array raises
:class:`~drgym.errors.CorruptIndexError` naming the file, never ``IndexError``.

Hybrid search fuses the dense and BM25 rankings with reciprocal rank fusion (Cormack,
Clarke & Büttcher 2009, "Reciprocal Rank Fusion outperforms Condorcet and individual
Rank Learning Methods", SIGIR, eq. 1): ``score(p) = sum_r 1 / (k + rank_r(p))`` with
``k = 60`` and 1-based ranks.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
from pathlib import Path

import numpy as np

from drgym.errors import CorruptIndexError
from drgym.index.prealloc import open_memmap

log = logging.getLogger(__name__)

BM25_DIR = "bm25"
STOPWORDS = "en"
RRF_K = 60

TOKENIZER = "drgym-cjk-bigram-1"
"""Name of :func:`tokenize`'s scheme, recorded in the manifest (``bm25["tokenizer"]``);
changing the tokens changes this name, so that older indexes are rebuilt."""
LEGACY_TOKENIZER = "bm25s"
"""bm25s's own tokens (``\\b\\w\\w+\\b``, CJK runs kept whole): what indexes built before
:data:`TOKENIZER` hold. A build may ask for it (``bm25_tokenizer="bm25s"``) to reproduce
rankings measured with it; such an index's folder name ends in ``--bm25s``."""
TOKENIZERS = (TOKENIZER, LEGACY_TOKENIZER)

CJK_RANGES = (
    "\u1100-\u11ff"      # Hangul Jamo
    "\u3005-\u3007"      # 々 〆 〇 (iteration mark, closing mark, ideographic zero)
    "\u3040-\u309f"      # Hiragana
    "\u30a0-\u30ff"      # Katakana
    "\u3130-\u318f"      # Hangul compatibility Jamo
    "\u31f0-\u31ff"      # Katakana phonetic extensions
    "\u3400-\u4dbf"      # CJK unified ideographs extension A
    "\u4e00-\u9fff"      # CJK unified ideographs
    "\uac00-\ud7af"      # Hangul syllables
    "\uf900-\ufaff"      # CJK compatibility ideographs
    "\uff66-\uff9f"      # half-width Katakana
    "\U00020000-\U0003134f"  # CJK unified ideographs extensions B-G
)
"""Characters cut into bigrams: the scripts Lucene's ``CJKBigramFilter`` bigrams (Han,
Hiragana, Katakana, Hangul), word characters (``\\w``) only: punctuation in these blocks
(``・``, ``゠``) separates tokens, as elsewhere."""

_TOKEN_RE = re.compile(f"((?:(?=\\w)[{CJK_RANGES}])+)|([^\\W{CJK_RANGES}]{{2,}})")
"""Group 1: a run of CJK word characters; group 2: a run of two or more other word
characters (bm25s's ``\\b\\w\\w+\\b`` on text without CJK characters)."""

_CJK_RE = re.compile(f"[{CJK_RANGES}]")
_WORD_RE = re.compile(r"\w{2,}")
"""Text without a character of :data:`CJK_RANGES`: ``_TOKEN_RE``'s group 2 is then
``\\w{2,}``, so the common case takes one simpler pattern."""


@functools.cache
def _bm25s():
    """Import bm25s once, undoing its import-time ``logger.setLevel(DEBUG)`` (which would
    print "Building index" lines under any root handler)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s

@functools.cache
def _stopwords() -> frozenset[str]:
    from bm25s.tokenization import _infer_stopwords

    return frozenset(_infer_stopwords(STOPWORDS))


def tokenize(text: str) -> list[str]:
    """drgym's BM25 tokens of one text (:data:`TOKENIZER`), for passages and queries alike.

    Lower-cased; runs of two or more word characters other than CJK characters are
    tokens (bm25s's English stopwords dropped), exactly bm25s's ``\\b\\w\\w+\\b`` tokens
    for text without CJK characters; a run of CJK characters (:data:`CJK_RANGES`) gives
    its overlapping bigrams, or itself when it is one character long.

    >>> tokenize("The Moon, 低头思故乡 and 月")
    ['moon', '低头', '头思', '思故', '故乡', '月']
    """
    stop = _stopwords()
    low = text.lower()
    if _CJK_RE.search(low) is None:
        return list(itertools.filterfalse(stop.__contains__, _WORD_RE.findall(low)))
    out: list[str] = []
    for cjk, word in _TOKEN_RE.findall(low):
        if cjk:
            if len(cjk) == 1:
                out.append(cjk)
            else:
                out.extend(cjk[i : i + 2] for i in range(len(cjk) - 1))
        elif word not in stop:
            out.append(word)
    return out


def _legacy_tokenize(text: str) -> list[str]:
    """bm25s's own tokens (the scheme of indexes built before :data:`TOKENIZER`)."""
    toks = _bm25s().tokenize([text], stopwords=STOPWORDS, return_ids=False, show_progress=False)[0]
    return [t for t in toks if t]


class BM25Index:
    """A loaded bm25s index over the passage rows.

    Args:
        folder: the index folder (the BM25 files are in ``folder/bm25``).
        n_passages: expected number of rows.
        tokenizer: the manifest's ``bm25["tokenizer"]``: :data:`TOKENIZER`, or None for
            an index built before it (queries then get bm25s's own tokens).

    Raises:
        CorruptIndexError: the bm25s files are unreadable, hold another row count, or
            their arrays disagree in length; or an unknown ``tokenizer``.
    """

    def __init__(self, folder: str | Path, n_passages: int, tokenizer: str | None = TOKENIZER) -> None:
        bm25s = _bm25s()

        self.path = Path(folder) / BM25_DIR
        try:
            self.retriever = bm25s.BM25.load(str(self.path), mmap=True)
        except Exception as e:  # noqa: BLE001 - bm25s raises many kinds on bad files
            raise self._corrupt("", f"({type(e).__name__} from bm25s: {e})") from e
        n = int(self.retriever.scores.get("num_docs", -1))
        if n != n_passages:
            raise self._corrupt("params.index.json", f"(it holds {n} passages, the manifest says {n_passages})")
        self.n_passages = n
        if tokenizer == LEGACY_TOKENIZER:
            self._tokenize = _legacy_tokenize
        elif tokenizer is None:
            log.info("BM25 index %s was built before CJK bigram tokens: queries get bm25s's tokens, and Chinese, "
                     "Japanese or Korean words inside longer runs are not found; rebuild it (drgym index build --force)",
                     self.path)
            self._tokenize = _legacy_tokenize
        elif tokenizer == TOKENIZER:
            self._tokenize = tokenize
        else:
            raise CorruptIndexError(f"BM25 index {self.path} was built with tokenizer {tokenizer!r}, this drgym knows "
                                    f"{TOKENIZER!r}; rebuild the index (drgym index build --force).")
        self.tokenizer = tokenizer
        sc = self.retriever.scores
        self._data, self._indices, self._indptr = sc["data"], sc["indices"], sc["indptr"]
        nnz = len(self._data)
        vocab = len(self.retriever.vocab_dict)  # bm25s adds "" as a last term without a column
        if (self._indptr.ndim != 1 or not len(self._indptr) or len(self._indptr) not in (vocab, vocab + 1)
                or len(self._indices) != nnz or int(self._indptr[0]) != 0 or int(self._indptr[-1]) != nnz):
            raise self._corrupt("indptr.csc.index.npy",
                                f"disagrees with the other BM25 arrays ({len(self._indptr)} column pointers for "
                                f"{vocab} terms, {nnz} scores, {len(self._indices)} rows)")

    def _corrupt(self, name: str, problem: str) -> CorruptIndexError:
        from drgym.index.manifest import corrupt_file_error

        sep = " " if problem.startswith("(") else ": "
        return corrupt_file_error(self.path / name if name else self.path, f"is unreadable{sep}{problem}",
                                  self.path.parent)

    def tokenize(self, query: str) -> list[int]:
        """Vocabulary ids of a query's tokens (unknown words and stopwords dropped)."""
        return self.retriever.get_tokens_ids(self._tokenize(query))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query``: float32 ``(n_passages,)``, all zero
        when no query word is in the vocabulary.

        The sum is bm25s's (``np.add.at`` over each query token's column, in order), so
        the scores equal ``retriever.get_scores_from_ids``'s; each column is checked first.

        Raises:
            CorruptIndexError: a column's bounds, rows or scores are out of range (a
                garbled array), naming the file.
        """
        ids = self.tokenize(query)
        scores = np.zeros(self.n_passages, dtype=np.float32)
        if not ids:
            return scores
        indptr, nnz = self._indptr, len(self._data)
        try:
            for t in ids:
                if not 0 <= int(t) < len(indptr) - 1:
                    raise self._corrupt("vocab.index.json", f"maps a query word to term id {t}, outside "
                                        f"0..{len(indptr) - 2}")
                a, b = int(indptr[t]), int(indptr[t + 1])
                if not 0 <= a <= b <= nnz:
                    raise self._corrupt("indptr.csc.index.npy", f"the column of term {t} spans [{a}, {b}), outside "
                                        f"the {nnz} stored scores")
                rows, vals = np.asarray(self._indices[a:b]), np.asarray(self._data[a:b])
                if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= self.n_passages):
                    raise self._corrupt("indices.csc.index.npy", f"the column of term {t} holds passage rows outside "
                                        f"0..{self.n_passages - 1}")
                if not np.isfinite(vals).all() or (len(vals) and float(vals.min()) < 0):
                    raise self._corrupt("data.csc.index.npy", f"the column of term {t} holds negative or non-finite "
                                        "BM25 scores")
                np.add.at(scores, rows, vals)
        except CorruptIndexError:
            raise
        except (IndexError, ValueError, TypeError, OSError) as e:  # anything else a garbled array can raise
            raise self._corrupt("", f"gave {type(e).__name__} ({e}) while scoring") from e
        return scores

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


def _sorted_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_counts=True)`` by one sort (NumPy 2's hash-based unique is
    several times slower on the million-element int64 keys of a chunk).

    >>> _sorted_unique(np.array([3, 1, 3, 3]))
    (array([1, 3]), array([1, 3]))
    """
    a = np.sort(x)
    if not len(a):
        return a, np.zeros(0, dtype=np.int64)
    first = np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))
    return a[first], np.diff(np.append(first, len(a)))


def write_bm25(folder: Path, texts, *, max_memory: int | None = None, chunk: int = 10_000,
               tokenizer: str = TOKENIZER, streaming: bool | None = None) -> dict:
    """Build and save the BM25 index of ``texts`` (one per passage row) in ``folder/bm25``.

    The texts are streamed: tokenised ``chunk`` at a time (the same tokens as one call
    over the whole corpus) into a flat token-id file on disk, counting each term's
    document frequency. Then the score matrix is made one of two ways, with the same
    scores and the same files (bm25s's format, loaded memory-mapped by :class:`BM25Index`):

    - in memory, by bm25s, which needs about :data:`BM25_BYTES_PER_PAIR` bytes per
      (passage, distinct token) pair plus :data:`BM25_BYTES_PER_TERM` per vocabulary term
      (about 2.4 GB per million 100-word passages): the fastest way when it fits;
    - streaming (:func:`_write_csc_streaming`), when that estimate exceeds ``max_memory``
      (or ``streaming=True``): passages ``chunk`` at a time, each scored with bm25s's own
      per-document functions, written into the column-major arrays on disk, so memory
      stays bounded by the chunk whatever the corpus size (disk: 8 bytes per pair).

    Args:
        folder: the index build folder.
        texts: iterable of passage texts in row order (a list, or
            :meth:`drgym.docstore.DocStoreWriter.iter_embed_texts`).
        max_memory: bytes an in-memory build may use; None is :data:`BM25_MEMORY_FRACTION`
            of the memory available now.
        chunk: texts tokenised per batch, and passages scored per streaming step.
        tokenizer: :data:`TOKENIZER` (default) or :data:`LEGACY_TOKENIZER`.
        streaming: True or False to choose the way; None (default) by ``max_memory``.

    Returns:
        Settings recorded in the manifest (``k1``, ``b``, ``method``, ``stopwords``,
        ``vocab_size``, ``passage_term_pairs``, ``built``: ``"in memory"`` or ``"streaming"``).

    Raises:
        ConfigError: an unknown ``tokenizer``.
    """
    import shutil

    from drgym.errors import ConfigError

    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"bm25 tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}.")
    tok_fn = tokenize if tokenizer == TOKENIZER else _legacy_tokenize
    bm25s = _bm25s()
    out_dir = Path(folder) / BM25_DIR
    tmp = Path(folder) / ".bm25-tokens"
    tmp.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    lengths: list[int] = []
    df = np.zeros(1024, dtype=np.int64)  # documents per term id (grown as the vocabulary grows)
    pairs = 0
    try:
        with open(tmp / "ids.bin", "wb") as f:
            it = iter(texts)
            while batch := list(itertools.islice(it, chunk)):
                docs = list(map(tok_fn, batch))
                tokens = list(itertools.chain.from_iterable(docs))
                # ids in first-seen order, as one setdefault per token would give them
                new = [t for t in dict.fromkeys(tokens) if t not in vocab]
                vocab.update(zip(new, range(len(vocab), len(vocab) + len(new))))
                ids = np.fromiter(map(vocab.__getitem__, tokens), dtype=np.int32, count=len(tokens))
                f.write(ids.tobytes())
                lens = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
                lengths.extend(lens.tolist())
                if len(vocab) > len(df):
                    df = np.concatenate([df, np.zeros(max(len(df), len(vocab) - len(df)), dtype=np.int64)])
                # document frequencies: the distinct (passage, term) pairs of the chunk
                doc_of = np.repeat(np.arange(len(docs), dtype=np.int64), lens)
                terms = _sorted_unique(doc_of * len(vocab) + ids)[0] % len(vocab)
                u, c = _sorted_unique(terms)
                df[u] += c
                pairs += len(terms)
        need = BM25_BYTES_PER_PAIR * pairs + BM25_BYTES_PER_TERM * len(vocab)
        if max_memory is None:
            import psutil

            max_memory = int(BM25_MEMORY_FRACTION * psutil.virtual_memory().available)
        if streaming is None:
            streaming = need > max_memory
            if streaming:
                log.info("BM25 over %d passages (%d passage-term pairs) needs about %.1f GiB in memory, more than the "
                         "%.1f GiB available: building it streaming, with the same scores", len(lengths), pairs,
                         need / 2**30, max_memory / 2**30)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
        flat = np.memmap(tmp / "ids.bin", dtype=np.int32, mode="r") if offsets[-1] else np.zeros(0, np.int32)
        retriever = bm25s.BM25()
        n_terms = len(vocab)  # bm25s adds its empty token "" to the dict it is given
        if streaming:
            _write_csc_streaming(out_dir, retriever, flat, offsets, vocab, df[: len(vocab)], chunk=chunk)
        else:
            retriever.index(_TokenIds(flat, offsets, vocab), show_progress=False)
            retriever.save(str(out_dir))
        del flat
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "dir": BM25_DIR,
        "method": retriever.method,
        "k1": retriever.k1,
        "b": retriever.b,
        "stopwords": STOPWORDS,
        "tokenizer": tokenizer,
        "vocab_size": n_terms + 1,  # bm25s's empty token "" included
        "passage_term_pairs": int(pairs),
        "built": "streaming" if streaming else "in memory",
    }


def _write_csc_streaming(out_dir: Path, retriever, flat: np.ndarray, offsets: np.ndarray, vocab: dict[str, int],
                         df: np.ndarray, *, chunk: int) -> None:
    """bm25s's index files for ``retriever``'s settings, written with bounded memory.

    Scores are bm25s's to the bit: the IDF of each document frequency by bm25s's own
    function (stored as float32, as ``_build_idf_array`` does), and each passage's
    term-frequency component from its term counts (what bm25s's
    ``_get_counts_from_token_ids`` counts, here a chunk of passages at a time) by bm25s's
    tfc function, with the corpus's mean passage length, in the float64 arithmetic of
    bm25s's per-passage call. The column-major arrays are
    written in place on disk (:func:`drgym.index.prealloc.open_memmap`): the column pointers come
    from the document frequencies, and each chunk of passages is sorted by term and
    written at each term's cursor, so every column lists its passages in row order.
    Then the vocabulary (bm25s's empty token ``""`` last, without a column) and the
    parameters are written as ``BM25.save`` writes them.
    """
    import json

    import bm25s
    from bm25s import scoring

    n, v = len(offsets) - 1, len(vocab)
    dtype, int_dtype = np.dtype(retriever.dtype), np.dtype(retriever.int_dtype)
    idf_fn = scoring._select_idf_scorer(retriever.idf_method)
    tfc_fn = scoring._select_tfc_scorer(retriever.method)
    # the IDF depends only on the document frequency: bm25s's function once per distinct one
    # (0 for a term in no passage, as _build_idf_array leaves it), cast to float32 as it stores it
    freqs, which = np.unique(df, return_inverse=True)
    idf = np.asarray([idf_fn(int(d), N=n) if d else 0.0 for d in freqs], dtype=dtype)[which]
    avg_len = np.diff(offsets).mean() if n else 0.0
    indptr = np.zeros(v + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    out_dir.mkdir(parents=True, exist_ok=True)
    if nnz == 0:  # no passage has a token (an empty file cannot be memory-mapped)
        np.save(out_dir / "data.csc.index.npy", np.zeros(0, dtype=dtype))
        np.save(out_dir / "indices.csc.index.npy", np.zeros(0, dtype=int_dtype))
        data = indices = None
    else:
        # disk space reserved before writing through the maps: a full disk is ENOSPC, not SIGBUS
        data = open_memmap(out_dir / "data.csc.index.npy", dtype, (nnz,))
        indices = open_memmap(out_dir / "indices.csc.index.npy", int_dtype, (nnz,))
    cursor = indptr[:-1].copy()
    lengths = np.diff(offsets)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        if data is None or offsets[stop] == offsets[start]:
            continue
        # the chunk's (passage, term) pairs and their counts, by passage then term: what
        # bm25s's _get_counts_from_token_ids counts passage by passage
        ids = np.asarray(flat[offsets[start]: offsets[stop]], dtype=np.int64)
        doc_of = np.repeat(np.arange(start, stop, dtype=np.int64), lengths[start:stop])
        key, tf = _sorted_unique((doc_of - start) * v + ids)
        d_, t = key // v + start, (key % v).astype(int_dtype)
        # bm25s's tfc on each pair, in float64 as its per-passage call computes it (a
        # Python int l_d and numpy float64 l_avg), then idf (float32) times it, cast to float32
        tfc = tfc_fn(tf_array=tf.astype(dtype), l_d=lengths[d_].astype(np.float64), l_avg=np.float64(avg_len),
                     k1=retriever.k1, b=retriever.b, delta=retriever.delta)
        s_ = (idf[t] * tfc).astype(dtype)
        d_ = d_.astype(int_dtype)
        order = np.argsort(t, kind="stable")  # by term; rows stay ascending within a term
        t, d_, s_ = t[order], d_[order], s_[order]
        uniq, first, counts = np.unique(t, return_index=True, return_counts=True)
        pos = cursor[t] + (np.arange(len(t)) - np.repeat(first, counts))
        data[pos] = s_
        indices[pos] = d_
        cursor[uniq] += counts
    if not np.array_equal(cursor, indptr[1:]):
        raise RuntimeError("streaming BM25 build: the columns written disagree with the document frequencies")
    if data is not None:
        data.flush()
        indices.flush()
    del data, indices
    np.save(out_dir / "indptr.csc.index.npy", indptr)
    with open(out_dir / "vocab.index.json", "w", encoding="utf-8") as f:
        f.write(json.dumps({**vocab, "": v}, ensure_ascii=False))
    params = dict(k1=retriever.k1, b=retriever.b, delta=retriever.delta, method=retriever.method,
                  idf_method=retriever.idf_method, dtype=retriever.dtype, int_dtype=retriever.int_dtype, num_docs=n,
                  version=bm25s.__version__, backend=retriever.backend)
    with open(out_dir / "params.index.json", "w") as f:
        json.dump(params, f, indent=4)


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
