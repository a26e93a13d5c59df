"""In-process search over a built index: :class:`LocalSearchEngine`.

    >>> from drgym.search.local import LocalSearchEngine
    >>> engine = LocalSearchEngine.from_corpus("wiki-default")      # builds once, then loads
    >>> engine.search("Who wrote Hamlet?", k=5)[0].url
    >>> engine.fetch("https://en.wikipedia.org/wiki/Hamlet")       # the whole document

Three methods share one index folder:

* ``"dense"``: the query embedding (same encoder as the passages) against the FAISS
  shards; score = inner product of unit vectors (cosine).
* ``"bm25"``: BM25 lexical scores: bm25s in memory (:mod:`drgym.index.bm25`), or
  SQLite FTS5 on disk for an index built with ``bm25_engine="fts5"`` (:mod:`drgym.index.fts5`).
* ``"hybrid"``: reciprocal rank fusion (k=60) of the dense and BM25 top ``D``, where
  ``D = max(rrf_depth, max_k)`` (100 by default) is fixed per engine: it does not change
  with the ``k`` of a call nor with the over-fetch of document collapse, so a passage's
  fused score is the same at every ``k`` and the top 10 at ``k=10`` is the first 10 at
  ``k=100``. Hybrid ranks only the passages in either top ``D``; with document collapse a
  ``k`` near ``max_k`` can therefore give fewer than ``k`` documents when those passages
  hold fewer.

Results are collapsed to documents by default (``collapse="document"``): the k best
*documents*, each shown by its best-scoring passage (max-score aggregation), as
DeepResearchGym's API returns distinct documents. The engine over-fetches passages
(:data:`OVERFETCH` x k, then more while the index has more) until k documents are found.
``collapse="passage"`` gives the k best passages, several possibly from one document
(Search-R1's retriever over wiki-18 passages).

A batch costs one encoder call for all queries and one FAISS search per shard. Equal
scores are ordered by passage_id, so rankings are deterministic: the same index gives
the same ranking in every process. One caveat: a query encoded inside a larger batch
(e.g. by the server's micro-batcher) can get scores that differ by ~1e-7 (padding and
BLAS blocking), which could only swap passages whose scores are that close; on 40
HotpotQA questions no ranking changed.

Loading checks every index file's size and sampled checksum (``verify=False``, the
default: files up to 64 MiB are hashed whole) or full checksum (``verify=True``); see
:mod:`drgym.index.manifest`. A garbled file found while searching (FAISS or BM25 arrays
out of range, a malformed docstore page) raises :class:`~drgym.errors.CorruptIndexError`
naming the file, with ``drgym index verify`` / ``drgym index build --force`` as the fix.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from drgym.docstore import DocStore
from drgym.embedding import resolve_model
from drgym.errors import ConfigError, CorruptIndexError, DocumentNotFoundError, DrgymError, unknown_name
from drgym.index import build as index_build  # get_encoder and build_index looked up when called (tests replace them)
from drgym.index.bm25 import BM25Index, rrf_fuse
from drgym.index.build import DEFAULT_FACTORY, DEFAULT_SHARD_SIZE, IndexSpec, bm25_engine_of
from drgym.index.dense import DenseIndex
from drgym.index.fts5 import FTS5BM25Index
from drgym.index.manifest import FolderPin, IndexManifest, corrupt_file_error
from drgym.index.ranking import load_tie_rank
from drgym.paths import indexes_dir
from drgym.search.base import DEFAULT_COLLAPSE, SearchBackend, check_collapse, collapse_to_documents
from drgym.types import Document, SearchResult

log = logging.getLogger(__name__)

METHODS = ("dense", "bm25", "hybrid")
DEFAULT_METHOD = "hybrid"
"""Best supporting-paragraph recall@10 on the HotpotQA and MuSiQue questions over
wiki-default (scripts/bench_search.py)."""

MAX_QUERY_CHARS = 16_384
"""Queries are cut to this many characters before tokenisation (the encoder then keeps
its own window, 256 tokens for MiniLM): long queries are truncated, never rejected."""


RRF_DEPTH = 100
"""Least number of candidates taken from each of dense and BM25 before reciprocal rank
fusion; an engine fuses at :attr:`LocalSearchEngine.fusion_depth` (this or ``max_k``,
the larger)."""

OVERFETCH = 4
"""Passages fetched per wanted document when collapsing to documents; the depth grows by
this factor again while fewer than k documents are found and the index has more rows."""

_ENCODE_LOCKS: "weakref.WeakKeyDictionary[object, threading.Lock]" = weakref.WeakKeyDictionary()
_ENCODE_LOCKS_GUARD = threading.Lock()


def _encode_lock(encoder) -> threading.Lock:
    with _ENCODE_LOCKS_GUARD:
        lock = _ENCODE_LOCKS.get(encoder)
        if lock is None:
            lock = _ENCODE_LOCKS[encoder] = threading.Lock()
        return lock


class _Shared:
    """Resources of one loaded index, shared by engines that differ only in method."""

    def __init__(self, folder: Path, encoder, device, search_params, verify: bool | str = False,
                 gpu: dict[str, bool] | None = None, encoder_backend: str | None = None) -> None:
        self.folder = folder
        # the folder is pinned first: a part loaded later (now or lazily) is checked to come
        # from the same folder, not from an index rebuilt and renamed to this path since
        self.pin = FolderPin(folder)
        self.docstore = None
        try:
            self.manifest = IndexManifest.read(folder)
            self.manifest.check_files(folder, _verify_mode(verify))
            self.device = device
            self.search_params = search_params
            self.gpu = dict(gpu or {})
            self.docstore = DocStore(folder / "docs.sqlite")  # pinned to its file (drgym.docstore.PinnedSQLite)
            if self.docstore.n_passages != self.manifest.n_passages:
                raise CorruptIndexError(
                    f"{folder}/docs.sqlite holds {self.docstore.n_passages} passages, the manifest says {self.manifest.n_passages}."
                )
            self.tie_rank = load_tie_rank(folder, self.manifest.n_passages)
            self.pin.check("its load finished")
        except BaseException:
            if self.docstore is not None:
                self.docstore.close()
            self.pin.close()
            raise
        self._encoder = encoder  # an Encoder, or None to load the manifest's on first use
        self.encoder_backend = encoder_backend
        self._dense = None
        self._bm25 = None
        self._lock = threading.Lock()

    @property
    def encoder(self):
        with self._lock:
            if self._encoder is None:
                enc = index_build.get_encoder(self.manifest.encoder, self.device, self.encoder_backend)
                self.manifest.check_encoder(enc.name, enc.revision, enc.dim)
                self._encoder = enc
            return self._encoder

    @property
    def dense(self):
        with self._lock:
            if self._dense is None:
                m = self.manifest
                self.pin.check("its dense index was first used")
                dense = DenseIndex.from_manifest(self.folder, m, device=self.device,
                                                 search_params=self.search_params, **self.gpu)
                if not self.pin.unchanged():  # replaced while the files were opened
                    dense.close()
                    self.pin.check("its dense index was first used")
                self._dense = dense
            return self._dense

    @property
    def bm25(self):
        with self._lock:
            if self._bm25 is None:
                if self.manifest.bm25 is None:
                    raise ConfigError(f"Index {self.folder} has no BM25 index; rebuild it with BM25 to use method 'bm25' or 'hybrid'.")

                cls = FTS5BM25Index if bm25_engine_of(self.manifest.bm25) == "fts5" else BM25Index
                self.pin.check("its BM25 index was first used")
                bm25 = cls(self.folder, self.manifest.n_passages, self.manifest.bm25.get("tokenizer"))
                if not self.pin.unchanged():  # replaced while the files were opened
                    if hasattr(bm25, "close"):
                        bm25.close()
                    self.pin.check("its BM25 index was first used")
                self._bm25 = bm25
            return self._bm25

    def close(self) -> None:
        if self._dense is not None:  # the shard threads of a DenseIndex
            self._dense.close()
        if self._bm25 is not None and hasattr(self._bm25, "close"):
            self._bm25.close()
        self.docstore.close()
        self.pin.close()


def _verify_mode(verify: bool | str) -> str:
    """``verify=`` of :class:`LocalSearchEngine` -> a :data:`drgym.index.manifest.VERIFY_MODES` mode."""
    if verify is True:
        return "full"
    if verify is False or verify is None:
        return "sample"
    return str(verify)


def resolve_index_folder(name_or_folder: str | Path) -> Path:
    """The index folder that :meth:`LocalSearchEngine.open` and ``drgym index verify``
    take ``name_or_folder`` to be: a folder holding ``manifest.json``, else an index name
    under ``$DRGYM_HOME/indexes``, else its corpus part when exactly one built index
    starts with ``<name>--``; else the path itself (whose loading then raises
    :class:`~drgym.errors.IndexNotFoundError`).

    Raises:
        ConfigError: a corpus name matches several built indexes (they are listed).
    """

    p = Path(name_or_folder).expanduser()
    if not (p / "manifest.json").exists():
        root = indexes_dir()
        name = str(name_or_folder)
        if (root / name / "manifest.json").exists():
            p = root / name
        elif "/" not in name and name not in ("", ".", ".."):
            found = sorted(d.name for d in root.glob(f"{glob.escape(name)}--*") if (d / "manifest.json").exists())
            if len(found) > 1:
                raise ConfigError(f"index name {name!r} matches {len(found)} built indexes: "
                                  f"{', '.join(found)}; give the full name.")
            if found:
                p = root / found[0]
    return p


class LocalSearchEngine(SearchBackend):
    """Search an index folder in-process (thread-safe).

    Args:
        folder: an index folder (holding ``manifest.json``).
        method: ``"dense"``, ``"bm25"`` or ``"hybrid"`` (default :data:`DEFAULT_METHOD`).
        encoder: None (use the manifest's encoder, loaded on first dense query), a model
            name, or a loaded :class:`drgym.embedding.Encoder`; it must be the encoder
            the index was built with.
        device: ``"cpu"`` or ``"cuda"`` for the encoder and FAISS; None picks a GPU if any.
        search_params: FAISS search parameters to change from
            :data:`drgym.index.search_params.DEFAULT_SEARCH_PARAMS`; each shard is searched with
            :func:`drgym.index.search_params.search_params_for` of them (the rule ``drgym serve``
            and ``drgym serve-ray`` use too).
        max_k: largest accepted ``k``.
        rrf_depth: least candidates per method fused by hybrid search; hybrid fuses the
            top ``max(rrf_depth, max_k)`` of each (:attr:`fusion_depth`), at every ``k``.
        collapse: ``"document"`` (default: k distinct documents, best passage each) or
            ``"passage"`` (k best passages); see :data:`drgym.search.base.COLLAPSE_MODES`.
        verify: False (default): check each index file's size and sampled checksum
            (files up to 64 MiB whole); True: its full checksum (reads the whole index,
            about 1.2 s per GB); ``"size"``: sizes only.
        gpu_shard: on GPUs, split each dense shard's rows across all GPUs instead of a
            whole copy per GPU (:func:`drgym.index.faiss_build.gpu_cloner_options`).
        gpu_float16: on GPUs, store the vectors in float16 (half the GPU memory).
        mmap: memory-map the dense shards' FAISS files instead of reading them into memory
            (:class:`drgym.index.dense.DenseIndex`; with faiss 1.15 this covers Flat and SQ
            codes, IVF inverted lists and HNSW's storage, measured): they stay in the page
            cache, shared by processes and evictable, and an index larger than RAM loads
            (its searches then read from disk).
        encoder_backend: runtime of the query encoder when it is loaded here (``encoder``
            None or a name): ``"torch"`` (float32, as the passages were encoded), ``"onnx"``
            (ONNX Runtime on the CPU, the same float32 weights) or ``"onnx-int8"`` (those
            weights quantised to int8 by ONNX Runtime; query vectors and rankings move a
            little, the index's passage vectors do not change;
            :data:`drgym.embedding.ENCODER_BACKENDS`); None (default):
            :data:`drgym.embedding.DEFAULT_ENCODER_BACKEND` (``onnx-int8``) on the CPU,
            ``torch`` on a GPU (:func:`drgym.embedding.resolve_encoder_backend`). The
            backend used is part of :meth:`identity`.
        search_threads: CPU threads one search call's query encoding and FAISS search
            use, whatever the batch size; None (default) uses the process's thread count
            for large batches and one thread for small ones. ``drgym serve`` sets 1: its
            micro-batches then cost less CPU per query, and its event loop runs on another
            core (measured in ``scripts/bench_search.py``).

    Raises:
        IndexNotFoundError: no index in ``folder``.
        IndexMismatchError: ``encoder`` differs from the manifest's (both names given).
        CorruptIndexError: an index file is missing, truncated, unreadable or fails its
            checksum (named in one line with the fix); also raised by searches that
            meet a garbled file.
        ConfigError: unknown method.
        BadQueryError: unknown collapse mode.
    """

    name = "local"
    deterministic = True

    def __init__(
        self,
        folder: str | Path,
        *,
        method: str = DEFAULT_METHOD,
        encoder=None,
        device: str | None = None,
        search_params: dict[str, int] | None = None,
        max_k: int = 100,
        rrf_depth: int = RRF_DEPTH,
        collapse: str = DEFAULT_COLLAPSE,
        verify: bool | str = False,
        gpu_shard: bool = False,
        gpu_float16: bool = False,
        mmap: bool = False,
        encoder_backend: str | None = None,
        search_threads: int | None = None,
        _shared: _Shared | None = None,
    ) -> None:
        if method not in METHODS:
            raise unknown_name("search method", method, METHODS)
        if search_threads is not None and int(search_threads) < 1:
            raise ConfigError(f"search_threads must be >= 1, got {search_threads}.")
        self.search_threads = None if search_threads is None else int(search_threads)
        self.method = method
        self.collapse = check_collapse(collapse)
        self.max_k = int(max_k)
        self.rrf_depth = int(rrf_depth)
        if _shared is None:
            folder = Path(folder)
            enc = encoder
            if isinstance(encoder, str):
                IndexManifest.read(folder).check_encoder(resolve_model(encoder)[0])

                enc = index_build.get_encoder(encoder, device, encoder_backend)
            _shared = _Shared(folder, enc, device, search_params, verify,
                              {"gpu_shard": bool(gpu_shard), "gpu_float16": bool(gpu_float16), "mmap": bool(mmap)},
                              encoder_backend)
            if enc is not None:
                try:
                    _shared.manifest.check_encoder(enc.name, enc.revision, enc.dim)
                except BaseException:
                    _shared.close()
                    raise
        self._shared = _shared
        self.folder = _shared.folder
        self.manifest = _shared.manifest
        self.docstore = _shared.docstore

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_corpus(
        cls,
        corpus: str = "wiki-default",
        *,
        method: str = DEFAULT_METHOD,
        encoder: str = "all-MiniLM-L6-v2",
        factory: str | None = None,
        shard_size: int | None = None,
        format: str | None = None,
        name: str | None = None,
        root: str | Path | None = None,
        rebuild: bool = False,
        progress: bool = False,
        device: str | None = None,
        search_params: dict[str, int] | None = None,
        max_k: int = 100,
        collapse: str = DEFAULT_COLLAPSE,
        verify: bool | str = False,
        bm25_tokenizer: str | None = None,
        bm25_engine: str = "bm25s",
        gpu_shard: bool = False,
        gpu_float16: bool = False,
        mmap: bool = False,
        encoder_backend: str | None = None,
        search_threads: int | None = None,
    ) -> "LocalSearchEngine":
        """Build the index of ``corpus`` if it is missing or outdated, then load it.

        Args:
            corpus: a named corpus (``"wiki-default"``, ``"hotpotqa"``...) or a corpus path.
            factory: FAISS factory string (default :data:`drgym.index.build.DEFAULT_FACTORY`).
            shard_size: rows per dense shard (default 25M, i.e. one shard).
            format: corpus format for a path; None sniffs it.
            name: index folder name; None derives it.
            root: folder of index folders (default ``$DRGYM_HOME/indexes``).
            rebuild: rebuild even when an identical index exists.
            progress: show progress bars while building.
            bm25_tokenizer: BM25 tokens (:class:`drgym.index.build.IndexSpec`): None
                (CJK bigrams) or ``"bm25s"`` to reproduce rankings measured with bm25s's own.
            bm25_engine: ``"bm25s"`` (in memory) or ``"fts5"`` (SQLite FTS5 on disk, for
                corpora whose BM25 does not fit in memory; :mod:`drgym.index.fts5`).
            Other arguments as for :class:`LocalSearchEngine`.

        Raises:
            As :func:`drgym.index.build.build_index` and :class:`LocalSearchEngine`.
        """

        enc = index_build.get_encoder(encoder, device, encoder_backend)
        spec = IndexSpec(corpus=corpus, format=format, encoder=encoder, factory=factory or DEFAULT_FACTORY,
                         shard_size=shard_size or DEFAULT_SHARD_SIZE, name=name, bm25_tokenizer=bm25_tokenizer,
                         bm25_engine=bm25_engine)
        res = index_build.build_index(spec, root=root, encoder=enc, force=rebuild, progress=progress)
        # build_index has just checked the sizes and sampled checksums (of the index it
        # reused, or of the one it built): loading checks sizes again, the full hashes if asked
        mode = _verify_mode(verify)
        return cls(res.folder, method=method, encoder=enc, device=device, search_params=search_params, max_k=max_k,
                   collapse=collapse, verify=mode if mode == "full" else "size", gpu_shard=gpu_shard,
                   gpu_float16=gpu_float16, mmap=mmap, encoder_backend=encoder_backend, search_threads=search_threads)

    @classmethod
    def open(cls, name_or_folder: str | Path, **kwargs) -> "LocalSearchEngine":
        """Load an existing index by folder path or by name under ``$DRGYM_HOME/indexes``.

        A name may be the full index name (``hotpotqa--all-MiniLM-L6-v2--Flat``) or its
        corpus part (``hotpotqa``) when exactly one built index starts with ``hotpotqa--``.

        Raises:
            IndexNotFoundError: neither exists.
            ConfigError: a corpus name matches several built indexes (they are listed).
        """
        return cls(resolve_index_folder(name_or_folder), **kwargs)

    def with_method(self, method: str, *, collapse: str | None = None) -> "LocalSearchEngine":
        """Another engine on the same loaded index (no reload) with a different method
        (and collapse mode; None keeps this engine's)."""
        return LocalSearchEngine(self.folder, method=method, max_k=self.max_k, rrf_depth=self.rrf_depth,
                                 collapse=collapse or self.collapse, search_threads=self.search_threads,
                                 _shared=self._shared)

    # -- properties ----------------------------------------------------------------------
    @property
    def encoder(self):
        """The query encoder (loaded on first use)."""
        return self._shared.encoder

    @property
    def fusion_depth(self) -> int:
        """Candidates hybrid search takes from each of dense and BM25 before fusing them:
        ``max(rrf_depth, max_k)``, the same for every ``k`` and every collapse depth, so
        hybrid's ranking of a query does not depend on how many results are asked for."""
        return max(self.rrf_depth, self.max_k)

    @property
    def n_passages(self) -> int:
        """Rows in the index."""
        return self.manifest.n_passages

    def identity(self) -> dict[str, Any]:
        """The engine's identity (see :meth:`SearchBackend.identity`): the index (name,
        ``manifest_fingerprint``: sha256 of the manifest's :meth:`~drgym.index.manifest.IndexManifest.identity`,
        first 16 hex digits, the corpus fingerprint, passages), the method, the encoder,
        ``max_k``, the collapse mode and the ranking settings (``rrf_depth``, FAISS
        ``search_params``), and ``encoder_backend``: the query encoder's runtime
        (:data:`drgym.embedding.ENCODER_BACKENDS`; it moves rankings, so a run resumed
        against another is refused), None for ``method="bm25"``, which encodes no query.
        Loads the query encoder if it is not loaded yet (dense and hybrid)."""

        m = self.manifest
        fp = hashlib.sha256(json.dumps(m.identity(), sort_keys=True, default=str).encode()).hexdigest()[:16]
        return {"kind": "local", "index": m.name, "manifest_fingerprint": fp, "corpus_fingerprint": m.corpus_fingerprint,
                "n_passages": m.n_passages, "method": self.method, "encoder": m.encoder,
                "encoder_revision": m.encoder_revision, "max_k": self.max_k, "collapse": self.collapse,
                "rrf_depth": self.rrf_depth, "search_params": self._shared.search_params,
                "encoder_backend": None if self.method == "bm25" else getattr(self.encoder, "backend", None)}

    def __repr__(self) -> str:
        m = self.manifest
        return (f"LocalSearchEngine({m.name!r}, method={self.method!r}, collapse={self.collapse!r}, passages={m.n_passages}, "
                f"encoder={m.encoder!r}, factory={m.factory!r}, shards={len(m.shards)})")

    # -- search --------------------------------------------------------------------------
    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Embed queries (serialised across threads).

        Queries longer than :data:`MAX_QUERY_CHARS` characters are cut first; the
        encoder then truncates to its window.

        Returns:
            float32 ``(len(queries), dim)`` unit vectors.
        """
        enc = self.encoder
        cut = [q[:MAX_QUERY_CHARS] for q in queries]
        with _encode_lock(enc):
            if self.search_threads is None:  # an encoder given by the caller may take no threads
                return enc.encode_queries(cut)
            return enc.encode_queries(cut, threads=self.search_threads)

    def search_rows(self, queries: list[str], k: int, method: str | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Rankings as index rows (no docstore lookup).

        Hybrid fuses the top :attr:`fusion_depth` of dense and of BM25 whatever ``k`` is,
        and returns the first ``k`` rows of that fusion: fewer when the two lists hold
        fewer distinct rows (at most ``2 * fusion_depth``).

        Returns:
            Per query ``(scores, rows)``: float32 and int64 arrays of length <= k, best first.
        """
        method = method or self.method
        if method not in METHODS:
            raise unknown_name("search method", method, METHODS)
        sh = self._shared
        cut = [q[:MAX_QUERY_CHARS] for q in queries]
        dense_runs = bm25_runs = None
        depth = k if method != "hybrid" else self.fusion_depth  # fixed: never k's over-fetch
        if method in ("dense", "hybrid"):
            qv = self.encode_queries(cut)
            S, R = sh.dense.search(qv, depth, threads=self.search_threads)
            dense_runs = [(S[i][R[i] >= 0], R[i][R[i] >= 0]) for i in range(len(cut))]
        if method in ("bm25", "hybrid"):
            bm25 = sh.bm25
            try:
                bm25_runs = bm25.search(cut, depth, sh.tie_rank)
            except (IndexError, ValueError, TypeError) as e:  # a garbled array that the column checks missed

                if isinstance(e, DrgymError):  # CorruptIndexError (a ValueError) already names the file
                    raise

                raise corrupt_file_error(bm25.path, f"is unreadable ({type(e).__name__} while ranking: {e})",
                                         self.folder) from e
        if method == "dense":
            return dense_runs
        if method == "bm25":
            return bm25_runs

        return [rrf_fuse([dense_runs[i][1], bm25_runs[i][1]], k, sh.tie_rank) for i in range(len(cut))]

    def search_batch(self, queries: list[str], k: int = 10, *, method: str | None = None,
                     collapse: str | None = None) -> list[list[SearchResult]]:
        """Top-``k`` documents (or passages) of each query (see :meth:`SearchBackend.search_batch`).

        Args:
            queries: non-empty strings; longer than the encoder window is fine (truncated).
            k: 1 <= k <= max_k.
            method: override the engine's method for this call.
            collapse: override the engine's collapse mode for this call: ``"document"``
                (k distinct documents, each its best passage; fewer only when the method
                ranks fewer, e.g. BM25 ranks only passages sharing a query term, hybrid only
                the passages in the dense or BM25 top :attr:`fusion_depth`) or
                ``"passage"`` (k best passages).

        Returns:
            One list per query of at most ``k`` :class:`SearchResult` (``doc_id`` is the
            passage id, ``url``/``title`` the parent document's, ``text`` the passage,
            ``score`` cosine / BM25 / RRF score of that passage, ``rank`` 1-based), best
            first. ``metadata`` holds ``parent_doc_id`` and ``method``.

        Raises:
            BadQueryError: empty query, k outside 1..max_k, or unknown collapse mode.
        """
        self.check_request(queries, k)
        method = method or self.method
        collapse = check_collapse(collapse or self.collapse)
        queries = list(queries)
        if collapse == "passage":
            return self._results(self.search_rows(queries, k, method), method)
        n_rows = self.n_passages
        out: list[list[SearchResult] | None] = [None] * len(queries)
        todo = list(range(len(queries)))
        depth = min(n_rows, k * OVERFETCH)
        while todo:
            runs = self.search_rows([queries[i] for i in todo], depth, method)
            more = []
            for i, passages in zip(todo, self._results(runs, method)):
                docs = collapse_to_documents(passages, k)
                # done: k documents, or every passage the method can rank was seen
                if len(docs) == k or len(passages) < depth or depth >= n_rows:
                    out[i] = docs
                else:
                    more.append(i)
            todo, depth = more, min(n_rows, depth * OVERFETCH)
        return out  # type: ignore[return-value]

    def _results(self, runs: list[tuple[np.ndarray, np.ndarray]], method: str) -> list[list[SearchResult]]:
        """Ranked index rows -> :class:`SearchResult` lists (one docstore lookup)."""
        all_rows = {int(r) for _, rows in runs for r in rows}
        recs = self.docstore.passages(sorted(all_rows))
        out: list[list[SearchResult]] = []
        for scores, rows in runs:
            res = []
            for score, row in zip(scores, rows):
                rec = recs.get(int(row))
                if rec is None:
                    raise CorruptIndexError(f"Index row {int(row)} has no passage in {self.docstore.path}; rebuild the index.")
                res.append(SearchResult(
                    doc_id=rec.passage_id, url=rec.url, title=rec.title, text=rec.text,
                    score=float(score), rank=len(res) + 1, source=rec.source,
                    metadata={"parent_doc_id": rec.doc_id, "method": method},
                ))
            out.append(res)
        return out

    # -- documents -----------------------------------------------------------------------
    def fetch(self, url: str) -> Document:
        """The whole document at ``url`` (exact, normalised, then fragment-less match).

        Raises:
            DocumentNotFoundError: no document has that URL.
            CorruptIndexError: the docstore is malformed.
        """
        return self.docstore.fetch(url)

    def get(self, doc_id: str) -> Document:
        """The whole document with this doc_id (or the parent of a passage id).

        Raises:
            DocumentNotFoundError: unknown doc_id.
            CorruptIndexError: the docstore is malformed.
        """
        return self.docstore.get(doc_id)

    def close(self) -> None:
        """Close the docstore connections. Idempotent; engines from :meth:`with_method`
        share them, so close the last one only."""
        self._shared.close()


__all__ = ["DEFAULT_METHOD", "METHODS", "LocalSearchEngine", "DocumentNotFoundError"]
