"""Dense passage index: float16 embedding shards plus one FAISS index per shard.

Layout inside an index folder (rows are passage rows of the docstore)::

    dense/emb-00000.npy     float16 (count, dim), unit rows, memory-mapped at load
    dense/faiss-00000.index FAISS index over those rows (local ids 0..count-1)
    dense/tie_rank.npy      int64 (n_passages,): rank of each row's passage_id in
                            sorted order, used to break score ties

Every shard is searched, the candidates are merged by score and equal scores are
ordered by passage_id (which starts with the doc_id), so a ranking never depends on
the shard layout or on thread timing. DeepResearchGym shards its ClueWeb22 index the
same way (25M documents a shard); the default here keeps wiki-default in one shard.

FAISS indexes come from ``faiss.index_factory(dim, factory, METRIC_INNER_PRODUCT)``.
Indexes that need training (``IVF...``, ``PQ...``) are trained on their shard's own
vectors. HNSW graphs of up to 200k vectors are built single-threaded so that a rebuild
gives the same graph.
On a machine where faiss sees GPUs, shards are moved to the GPU (HNSW stays on CPU:
faiss has no GPU HNSW).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.manifest import ShardInfo

log = logging.getLogger(__name__)

DENSE_DIR = "dense"
TIE_MARGIN = 16
"""Extra candidates fetched per shard so that exact score ties at the cut-off are
resolved by passage_id rather than by FAISS's internal order."""

DEFAULT_SEARCH_PARAMS: dict[str, int] = {"efSearch": 64, "nprobe": 16}
"""Search-time parameters, applied when the index has them. HNSW ``efSearch=64`` gives
ANN recall@10 of 0.997 against exact search on wiki-default (scripts/bench_search.py);
IVF ``nprobe=16``."""

HNSW_EF_CONSTRUCTION = 200

HNSW_SINGLE_THREAD_MAX = 200_000
"""HNSW shards up to this size are built with one thread, so a rebuild gives the same
graph (and the same rankings); larger shards use all OpenMP threads (faster, but the
graph then depends on thread timing)."""


def _faiss():
    from drgym.cpu import configure_threads

    configure_threads()  # before faiss's OpenMP runtime loads: thread count and wait policy
    try:
        import faiss
    except ImportError as e:  # pragma: no cover - faiss-cpu is a hard dependency
        from drgym.errors import DependencyNotInstalled

        raise DependencyNotInstalled("pip install faiss-cpu") from e
    return faiss


def gpus_available() -> int:
    """Number of GPUs faiss can use (0 with faiss-cpu or without a CUDA device)."""
    faiss = _faiss()
    get = getattr(faiss, "get_num_gpus", None)
    try:
        return int(get()) if get else 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup means no GPU
        return 0


SMALL_BATCH = 20
"""Below this many queries FAISS searches them one by one (its non-BLAS path), where an
OpenMP team only adds a barrier: on a busy 2-core machine a single-query Flat search over
wiki-default took 24 ms p50 with 2 OpenMP threads and 0.95 ms with 1, so small batches
run with one thread (the setting is per calling thread and restored afterwards)."""


def _search_one_thread(index, q: np.ndarray, k: int):
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return index.search(q, k)
    finally:
        faiss.omp_set_num_threads(before)


def build_faiss(vectors: np.ndarray, factory: str) -> "object":
    """Build a FAISS index over ``vectors`` with ``index_factory``.

    Args:
        vectors: float32 ``(n, dim)`` unit rows.
        factory: FAISS factory string, e.g. ``"Flat"``, ``"HNSW32"``, ``"IVF64,PQ16"``.

    Returns:
        A CPU FAISS index holding the ``n`` vectors with ids ``0..n-1``.

    Raises:
        ConfigError: the factory string is invalid, or training failed (e.g. fewer
            vectors than IVF lists).
    """
    faiss = _faiss()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = vectors.shape
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ConfigError(f"Invalid FAISS factory string {factory!r}: {str(e).splitlines()[-1]}") from e
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None:
        hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    if not index.is_trained:
        try:
            index.train(vectors)
        except RuntimeError as e:
            raise ConfigError(f"Training FAISS index {factory!r} on {n} vectors failed: {str(e).splitlines()[-1]}") from e
    if n:
        if hnsw is not None and n <= HNSW_SINGLE_THREAD_MAX:
            # One thread: HNSW insertion order (hence the graph) is then reproducible.
            threads = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(1)
            try:
                index.add(vectors)
            finally:
                faiss.omp_set_num_threads(threads)
        else:
            index.add(vectors)
    return index


def write_shard(folder: Path, shard_no: int, start: int, vectors: np.ndarray, factory: str) -> ShardInfo:
    """Write one shard (float16 embeddings + FAISS index) under ``folder/dense``.

    Args:
        folder: the index build folder.
        shard_no: shard number (file names ``emb-%05d.npy``, ``faiss-%05d.index``).
        start: first global row of the shard.
        vectors: float32 ``(count, dim)`` unit rows.
        factory: FAISS factory string.

    Returns:
        The shard's :class:`ShardInfo`.
    """
    faiss = _faiss()
    d = Path(folder) / DENSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    emb, fai = f"emb-{shard_no:05d}.npy", f"faiss-{shard_no:05d}.index"
    np.save(d / emb, vectors.astype(np.float16))
    # Build from the stored float16 values so that the FAISS scores equal those of the
    # memory-mapped embeddings (exact re-scoring and recall checks agree bit for bit).
    index = build_faiss(vectors.astype(np.float16).astype(np.float32), factory)
    faiss.write_index(index, str(d / fai))
    return ShardInfo(embeddings=f"{DENSE_DIR}/{emb}", faiss=f"{DENSE_DIR}/{fai}", start=int(start), count=int(len(vectors)))


def write_tie_rank(folder: Path, passage_ids: list[str]) -> None:
    """Write ``dense/tie_rank.npy``: int64 rank of each row's passage_id in sorted order."""
    d = Path(folder) / DENSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(passage_ids)), key=passage_ids.__getitem__)
    rank = np.empty(len(passage_ids), dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(passage_ids), dtype=np.int64)
    np.save(d / "tie_rank.npy", rank)


def load_tie_rank(folder: Path, n: int) -> np.ndarray:
    """Load ``dense/tie_rank.npy`` (int64 ``(n,)``).

    Raises:
        CorruptIndexError: missing, unreadable or of the wrong length.
    """
    p = Path(folder) / DENSE_DIR / "tie_rank.npy"
    try:
        rank = np.load(p)
    except (OSError, ValueError, EOFError) as e:
        raise CorruptIndexError(f"{p} is unreadable ({e}); rebuild the index.") from e
    if rank.shape != (n,):
        raise CorruptIndexError(f"{p} has shape {rank.shape}, expected ({n},); rebuild the index.")
    return rank


def select_top(scores: np.ndarray, rows: np.ndarray, tie_rank: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best ``k`` candidates of one query: by score descending, ties by passage_id.

    Args:
        scores: float ``(m,)`` candidate scores (higher is better).
        rows: int64 ``(m,)`` global rows; ``-1`` marks padding and is dropped.
        tie_rank: int64 ``(n_passages,)`` from :func:`write_tie_rank`.
        k: how many to keep.

    Returns:
        ``(scores, rows)`` of at most ``k`` candidates, best first.
    """
    keep = rows >= 0
    scores, rows = scores[keep], rows[keep]
    if len(rows) == 0:
        return scores, rows
    # Duplicated rows (possible with approximate indexes) keep their best score.
    order = np.lexsort((tie_rank[rows], -scores))
    rows, scores = rows[order], scores[order]
    _, first = np.unique(rows, return_index=True)
    if len(first) != len(rows):
        sel = np.sort(first)
        rows, scores = rows[sel], scores[sel]
    return scores[:k], rows[:k]


class DenseIndex:
    """The dense shards of one index, loaded for search.

    Args:
        folder: the index folder.
        shards: shard descriptions from the manifest.
        dim: embedding dimension.
        n_passages: total rows.
        device: ``"cpu"`` forces CPU; None or ``"cuda"`` uses faiss GPUs when present.
        search_params: FAISS search parameters (``efSearch``, ``nprobe``...); each is
            applied to the shards that have it. Defaults: :data:`DEFAULT_SEARCH_PARAMS`.

    Raises:
        CorruptIndexError: a shard file is unreadable or disagrees with the manifest.
    """

    def __init__(
        self,
        folder: str | Path,
        shards: list[ShardInfo],
        dim: int,
        n_passages: int,
        *,
        device: str | None = None,
        search_params: dict[str, int] | None = None,
    ) -> None:
        faiss = _faiss()
        self.folder = Path(folder)
        self.shards = list(shards)
        self.dim = int(dim)
        self.n_passages = int(n_passages)
        self.tie_rank = load_tie_rank(self.folder, self.n_passages)
        self.search_params = dict(DEFAULT_SEARCH_PARAMS if search_params is None else search_params)
        self._indexes = []
        self._lock = threading.Lock()
        self._embeddings: list[np.ndarray] = []
        self.on_gpu = False
        use_gpu = device != "cpu" and gpus_available() > 0
        total = 0
        for s in self.shards:
            ep, fp = self.folder / s.embeddings, self.folder / s.faiss
            try:
                emb = np.load(ep, mmap_mode="r")
            except (OSError, ValueError, EOFError) as e:
                raise CorruptIndexError(f"Embedding shard {ep} is unreadable ({e}); rebuild the index.") from e
            if emb.shape != (s.count, self.dim) or emb.dtype != np.float16:
                raise CorruptIndexError(
                    f"Embedding shard {ep} has shape {emb.shape} and dtype {emb.dtype}, "
                    f"expected ({s.count}, {self.dim}) float16; rebuild the index."
                )
            try:
                index = faiss.read_index(str(fp))
            except RuntimeError as e:
                raise CorruptIndexError(f"FAISS shard {fp} is unreadable ({str(e).splitlines()[-1]}); rebuild the index.") from e
            if index.ntotal != s.count or index.d != self.dim:
                raise CorruptIndexError(
                    f"FAISS shard {fp} holds {index.ntotal} vectors of dim {index.d}, expected {s.count} of dim {self.dim}."
                )
            self._apply_params(index)
            if use_gpu:
                index = self._to_gpu(index)
            self._indexes.append(index)
            self._embeddings.append(emb)
            total += s.count
        if total != self.n_passages:
            raise CorruptIndexError(f"Dense shards hold {total} rows, the manifest says {self.n_passages}.")

    def _apply_params(self, index) -> None:
        faiss = _faiss()
        inner = faiss.downcast_index(index)
        ps = faiss.ParameterSpace()
        for name, value in self.search_params.items():
            if name == "efSearch" and not hasattr(inner, "hnsw"):
                continue
            if name == "nprobe" and not hasattr(inner, "nprobe"):
                continue
            try:
                ps.set_index_parameter(index, name, value)
            except RuntimeError as e:
                raise ConfigError(f"FAISS search parameter {name}={value} rejected: {str(e).splitlines()[-1]}") from e

    def _to_gpu(self, index):
        faiss = _faiss()
        if hasattr(faiss.downcast_index(index), "hnsw"):
            log.info("faiss has no GPU HNSW; keeping the HNSW shard on CPU")
            return index
        try:
            gpu = faiss.index_cpu_to_all_gpus(index)
            self.on_gpu = True
            return gpu
        except Exception as e:  # noqa: BLE001 - fall back to CPU, but say so
            log.warning("moving a FAISS shard to GPU failed (%s); searching on CPU", e)
            return index

    def embeddings(self, rows: np.ndarray) -> np.ndarray:
        """Stored float16 vectors of global ``rows``, as float32 ``(len(rows), dim)``."""
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for i, r in enumerate(np.asarray(rows, dtype=np.int64)):
            for s, emb in zip(self.shards, self._embeddings):
                if s.start <= r < s.start + s.count:
                    out[i] = emb[r - s.start]
                    break
            else:
                raise IndexError(f"row {r} out of range 0..{self.n_passages - 1}")
        return out

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows of every query across all shards.

        Args:
            queries: float32 ``(nq, dim)`` unit query vectors.
            k: results per query, >= 1.

        Returns:
            ``(scores, rows)``: float32 and int64 arrays of shape ``(nq, k)``, best first,
            inner products (cosine); rows ``-1`` and scores ``-inf`` pad queries with
            fewer than ``k`` hits (a corpus smaller than ``k``).
        """
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ConfigError(f"queries must have shape (n, {self.dim}), got {q.shape}.")
        nq = q.shape[0]
        parts_s, parts_r = [], []
        for s, index in zip(self.shards, self._indexes):
            kk = min(s.count, k + TIE_MARGIN)
            if kk <= 0:
                continue
            if self.on_gpu:  # GPU indexes are not safe for concurrent calls
                with self._lock:
                    D, I = index.search(q, kk)
            elif nq < SMALL_BATCH:
                D, I = _search_one_thread(index, q, kk)
            else:  # CPU FAISS search is const and thread-safe
                D, I = index.search(q, kk)
            I = I.astype(np.int64)
            parts_s.append(D)
            parts_r.append(np.where(I >= 0, I + s.start, -1))
        out_s = np.full((nq, k), -np.inf, dtype=np.float32)
        out_r = np.full((nq, k), -1, dtype=np.int64)
        if not parts_s:
            return out_s, out_r
        all_s, all_r = np.concatenate(parts_s, axis=1), np.concatenate(parts_r, axis=1)
        for i in range(nq):
            sc, rw = select_top(all_s[i], all_r[i], self.tie_rank, k)
            out_s[i, : len(sc)] = sc
            out_r[i, : len(rw)] = rw
        return out_s, out_r


def build_dense_shards(
    folder: Path,
    n: int,
    shard_size: int,
    factory: str,
    embed: Callable[[int, int], np.ndarray],
    *,
    progress: bool = False,
) -> list[ShardInfo]:
    """Write all dense shards of an index.

    Args:
        folder: the index build folder.
        n: number of passages.
        shard_size: rows per shard, >= 1.
        factory: FAISS factory string.
        embed: ``embed(start, stop)`` returns float32 ``(stop - start, dim)`` unit vectors
            of rows ``start..stop-1`` (called once per shard, in order).
        progress: show a tqdm bar over shards.

    Returns:
        The shards in row order.

    Raises:
        ConfigError: ``shard_size < 1`` or a bad factory string.
    """
    if shard_size < 1:
        raise ConfigError(f"shard_size must be >= 1, got {shard_size}.")
    from tqdm.auto import tqdm

    starts = list(range(0, n, shard_size)) or [0]
    shards = []
    for no, start in enumerate(tqdm(starts, desc="dense shards", disable=not progress or len(starts) < 2)):
        stop = min(n, start + shard_size)
        vecs = embed(start, stop)
        shards.append(write_shard(folder, no, start, vecs, factory))
    return shards
