"""FAISS indexes of dense shards: loading faiss, building, training, GPU placement.

FAISS indexes come from ``faiss.index_factory(dim, factory, METRIC_INNER_PRODUCT)``
(:func:`new_faiss_index`). A shard is built from its memory-mapped float16 embeddings
(:func:`write_dense_shard`, :func:`build_faiss`), so the build holds the FAISS index plus
one batch of :data:`~drgym.index.rows.ADD_BATCH` rows, never a float32 copy of the shard.
Indexes that need training (``IVF...``, ``PQ...``) are trained on a fixed random sample
(:func:`train_sample_rows`: all rows up to 65,536, then 64 per IVF list, at most
1,048,576): of their shard, or, for an IVF index in several shards, of all rows once
(:func:`write_trained`), every shard then being a clone of that trained index, so that
the shards share one coarse quantizer and a query is assigned to lists once
(:func:`~drgym.index.ranking.coarse_assign`). HNSW graphs of up to 200k vectors are built
single-threaded so that a rebuild gives the same graph.

On a machine where faiss sees GPUs (:func:`gpus_available`), IVF coarse quantizers are
trained on the GPU, and :class:`~drgym.index.dense.DenseIndex` moves shards to the GPUs
for search with :func:`gpu_cloner_options`. :func:`load_faiss` imports faiss for every
module of :mod:`drgym.index` (threads configured first, :data:`FLAT_BLAS_THRESHOLD` set);
:func:`is_lossy` and :func:`flat_storage` say how an index scores and where an exact
index keeps its vectors.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.manifest import ShardInfo, corrupt_file_error
from drgym.index.rows import ADD_BATCH, DENSE_DIR, copy_rows, read_rows

FLAT_BLAS_THRESHOLD = 4 * 384
"""``faiss.cvar.distance_compute_blas_threshold`` that drgym sets. faiss 1.15 compares it
with queries x dimension: exact (``Flat``) inner products of fewer go through FAISS's
per-query loop, the others through BLAS. 1,536 sends 1 to 3 queries of 384 dimensions
(MiniLM), 1 of 768, through the loop and larger batches through BLAS (an IVF shard with a
flat inner-product quantizer is assigned its lists by drgym's :func:`~drgym.index.ranking.coarse_assign`, not by
FAISS). faiss's default (128,000) sends any batch below 334 queries of 384 dimensions to the
loop, which reads all the vectors once per query; through BLAS a batch reads them once, but
OpenBLAS's ``sgemm`` packs the database block by block however few query rows it
multiplies, so with one row that packing is the work. Measured on wiki-default (21,126
vectors of 384 dimensions, top 116 as hybrid search asks, one thread, CPU ms a call;
``python scripts/bench_search.py --profile-default 300``,
``scripts/results/bench_search_profile_default.json``):

=========  ====  ====  ====  ====  =====
queries      1     2     4     8     16
=========  ====  ====  ====  ====  =====
loop       1.1   2.4   4.9   8.9   17.9
BLAS       6.2   6.4   5.7   6.8    8.5
=========  ====  ====  ====  ====  =====

So a one-query request (``drgym serve`` with one client) pays about 1.1 ms for its exact
search instead of 6.2, and the micro-batches of 16 and 64 clients keep BLAS. FAISS's scores
differ between the two paths by rounding (at most 3e-7 measured), and on some CPUs
between batch sizes in the last bit (OpenBLAS picks its kernel by matrix size); drgym does
not keep them: a Flat shard's ``k +`` :data:`~drgym.index.ranking.TIE_MARGIN` candidates are re-scored by
:func:`~drgym.index.ranking.exact_scores`, so a query scores bit for bit alike alone and in a batch of any size
(``tests/test_scale_rules.py``). Either way the scores a query gets come from
:func:`~drgym.index.ranking.exact_scores`, so the path FAISS takes never changes them."""


def load_faiss():
    from drgym.cpu import configure_threads

    configure_threads()  # before faiss's OpenMP runtime loads: thread count and wait policy
    try:
        import faiss
    except ImportError as e:  # pragma: no cover - faiss-cpu is a hard dependency
        from drgym.errors import DependencyNotInstalled

        raise DependencyNotInstalled("pip install faiss-cpu") from e
    if getattr(faiss, "cvar", None) is not None and hasattr(faiss.cvar, "distance_compute_blas_threshold"):
        faiss.cvar.distance_compute_blas_threshold = FLAT_BLAS_THRESHOLD
    return faiss


def last_line(e: BaseException) -> str:
    """The last line of a (FAISS C++) error message: the one that says what failed."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(e).__name__


def gpus_available() -> int:
    """Number of GPUs faiss can use (0 with faiss-cpu or without a CUDA device)."""
    faiss = load_faiss()
    get = getattr(faiss, "get_num_gpus", None)
    try:
        return int(get()) if get else 0
    except Exception:  # noqa: BLE001 - a broken CUDA setup means no GPU
        return 0


def gpu_cloner_options(shard: bool = False, float16: bool = False):
    """The ``faiss.GpuMultipleClonerOptions`` that moves an index onto all GPUs, or None
    for faiss's default (every GPU holds a float32 copy of the whole index).

    Args:
        shard: split the rows across the GPUs (``co.shard``): each GPU holds 1/n of the
            index, the results are merged by faiss.
        float16: store vectors (Flat, IVF-Flat) and lookup tables (IVF-PQ) in float16
            (``co.useFloat16``): half the GPU memory. The shards' stored embeddings are
            float16 already, so a Flat index loses nothing; its scores are computed from
            float16 operands (differences in the 4th decimal can reorder near-ties).

    Raises:
        ConfigError: the installed faiss has no GPU support.
    """
    if not (shard or float16):
        return None
    faiss = load_faiss()
    if not hasattr(faiss, "GpuMultipleClonerOptions"):
        raise ConfigError("gpu_shard/gpu_float16 need faiss with GPU support (faiss-gpu); this faiss is CPU-only.")
    co = faiss.GpuMultipleClonerOptions()
    co.shard = bool(shard)
    co.useFloat16 = bool(float16)
    return co


HNSW_EF_CONSTRUCTION = 200

HNSW_SINGLE_THREAD_MAX = 200_000
"""HNSW shards up to this size are built with one thread, so a rebuild gives the same
graph (and the same rankings); larger shards use all OpenMP threads (faster, but the
graph then depends on thread timing)."""


TRAIN_MIN = 65_536
TRAIN_PER_LIST = 64
TRAIN_MAX = 1_048_576
"""Training sample of an IVF/PQ shard: every row up to ``TRAIN_MIN``, else
``max(TRAIN_MIN, TRAIN_PER_LIST * nlist)`` rows capped at ``TRAIN_MAX`` (FAISS warns
below 39 points per centroid; 64 per list follows its wiki's guideline of 30-256)."""


TRAINED_FILE = f"{DENSE_DIR}/trained.index"
"""The empty, trained IVF index that every shard of a several-shard IVF index is cloned
from (:func:`write_trained`)."""


def new_faiss_index(dim: int, factory: str):
    """An empty FAISS index from ``index_factory`` (inner product; HNSW ``efConstruction``
    set to :data:`HNSW_EF_CONSTRUCTION`).

    Raises:
        ConfigError: the factory string is invalid.
    """
    faiss = load_faiss()
    try:
        index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ConfigError(f"Invalid FAISS factory string {factory!r}: {str(e).splitlines()[-1]}") from e
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None:
        hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    return index


def train_sample_rows(index, n: int) -> np.ndarray:
    """Rows a shard of ``n`` vectors is trained on (int64, sorted): all of them up to
    :data:`TRAIN_MIN`, else a sample drawn with seed 0 (so a rebuild trains alike)."""
    faiss = load_faiss()
    try:
        nlist = int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:  # not an IVF index
        nlist = 0
    size = min(n, max(TRAIN_MIN, min(TRAIN_MAX, TRAIN_PER_LIST * nlist)))
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(0).choice(n, size, replace=False)).astype(np.int64)


def _train(index, x: np.ndarray, factory: str) -> None:
    faiss = load_faiss()
    if gpus_available() > 0:  # train the IVF coarse quantizer's k-means on the GPUs
        try:
            ivf = faiss.extract_index_ivf(index)
            ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(ivf.d))
        except RuntimeError:
            pass
    try:
        index.train(x)
    except RuntimeError as e:
        raise ConfigError(f"Training FAISS index {factory!r} on {len(x)} vectors failed: {str(e).splitlines()[-1]}") from e


def is_lossy(index) -> bool:
    """Whether a FAISS index scores from lossy codes (PQ, scalar quantizers other than
    fp16/fp32, additive quantizers), so that its scores are approximations."""
    faiss = load_faiss()
    inner = faiss.downcast_index(index)
    for _ in range(4):  # unwrap IndexPreTransform / IDMap (.index), HNSW (.storage), refine (.base_index)
        sub = next((getattr(inner, a) for a in ("index", "storage", "base_index")
                    if getattr(inner, a, None) is not None), None)
        if sub is None:
            break
        inner = faiss.downcast_index(sub)
    name = type(inner).__name__
    if "ScalarQuantizer" in name:
        return int(inner.sq.qtype) not in (int(faiss.ScalarQuantizer.QT_fp16), int(faiss.ScalarQuantizer.QT_bf16))
    return any(t in name for t in ("PQ", "Quantizer", "LSH"))


def flat_storage(index) -> np.ndarray | None:
    """An exact (``IndexFlat``) FAISS index's float32 vectors as a zero-copy
    ``(ntotal, d)`` view (valid while ``index`` lives), else None."""
    faiss = load_faiss()
    inner = faiss.downcast_index(index)
    if not isinstance(inner, faiss.IndexFlat) or inner.ntotal == 0:
        return None
    return faiss.rev_swig_ptr(inner.get_xb(), inner.ntotal * inner.d).reshape(inner.ntotal, inner.d)


def write_trained(folder: str | Path, parts, n: int, dim: int, factory: str) -> str:
    """Train an IVF ``factory`` once for all the shards of an index and write it, empty,
    to :data:`TRAINED_FILE` (through a temporary file; a resumed build reuses it).

    Every shard is then a clone of it plus its own rows (FAISS's recipe for building an
    IVF index in pieces), so the shards share one coarse quantizer and one set of codes:
    :class:`~drgym.index.dense.DenseIndex` assigns a query to its lists once, not once per shard. The sample
    is :func:`train_sample_rows` of all ``n`` rows (seed 0), read from every part.

    Args:
        folder: the index build folder.
        parts: ``(npy path, first global row, rows)`` covering rows ``0..n-1``.
        n: rows of the whole index.
        dim: embedding dimension.
        factory: FAISS factory string.

    Returns:
        :data:`TRAINED_FILE`, or ``""`` when ``factory`` is not an IVF index that needs
        training (shards are then built alone, as :func:`build_faiss` does).

    Raises:
        ConfigError: bad factory or failed training.
        CorruptIndexError: a part is not as announced.
    """
    faiss = load_faiss()
    index = new_faiss_index(dim, factory)
    if index.is_trained or not isinstance(faiss.downcast_index(index), faiss.IndexIVF):
        return ""
    path = Path(folder) / TRAINED_FILE
    if path.exists():
        return TRAINED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    sample = read_rows(parts, train_sample_rows(index, n), dim)
    _train(index, sample, factory)
    del sample
    tmp = path.with_name(f".{path.name}.tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)
    return TRAINED_FILE


def build_faiss(vectors: np.ndarray, factory: str, trained: str | Path | None = None) -> "object":
    """Build a FAISS index over ``vectors`` with ``index_factory``.

    Args:
        vectors: ``(n, dim)`` unit rows, float32 or float16 (a memory-mapped array is
            read :data:`ADD_BATCH` rows at a time, converted to float32).
        factory: FAISS factory string, e.g. ``"Flat"``, ``"HNSW32"``, ``"IVF64,PQ16"``.
        trained: an empty trained index file of this factory (:func:`write_trained`) to
            start from instead of training on ``vectors``.

    Returns:
        A CPU FAISS index holding the ``n`` vectors with ids ``0..n-1``.

    Raises:
        ConfigError: the factory string is invalid, or training failed (e.g. fewer
            vectors than IVF lists).
        CorruptIndexError: ``trained`` is unreadable or not an empty trained index of
            this dimension.
    """
    faiss = load_faiss()
    n, dim = vectors.shape
    if trained:
        try:
            index = faiss.read_index(str(trained))
        except RuntimeError as e:
            raise corrupt_file_error(Path(trained), f"is unreadable (FAISS: {last_line(e)})",
                                     Path(trained).parent.parent) from e
        if index.d != dim or index.ntotal != 0 or not index.is_trained:
            raise corrupt_file_error(Path(trained), f"is not an empty trained index of dim {dim}",
                                     Path(trained).parent.parent)
    else:
        index = new_faiss_index(dim, factory)
    if not index.is_trained:
        rows = train_sample_rows(index, n)
        sample = vectors[:] if len(rows) == n else vectors[rows]
        _train(index, np.ascontiguousarray(sample, dtype=np.float32), factory)
        del sample
    if not n:
        return index
    hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
    if hnsw is not None and n <= HNSW_SINGLE_THREAD_MAX:
        # One call, one thread: HNSW insertion order (hence the graph) is then reproducible.
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            index.add(np.ascontiguousarray(vectors[:], dtype=np.float32))
        finally:
            faiss.omp_set_num_threads(threads)
        return index
    for a in range(0, n, ADD_BATCH):
        index.add(np.ascontiguousarray(vectors[a : a + ADD_BATCH], dtype=np.float32))
    return index


def write_dense_shard(
    folder: Path,
    shard_no: int,
    start: int,
    count: int,
    parts: list[tuple[str | Path, int, int]],
    dim: int,
    factory: str,
    trained: str = "",
) -> ShardInfo:
    """Assemble one dense shard from embedding parts and build its FAISS index.

    Writes ``dense/emb-%05d.npy`` (float16, copied from the parts through memory maps)
    and then ``dense/faiss-%05d.index``, each through a temporary file renamed into place,
    so a shard whose FAISS file exists is complete (a resumed build skips it).

    Args:
        folder: the index build folder.
        shard_no: shard number.
        start: first global row of the shard.
        count: rows in the shard.
        parts: ``(npy path, first global row, rows)`` of the embedding parts, in row
            order, covering ``[start, start + count)``; float16 or float32 ``(rows, dim)``.
        dim: embedding dimension.
        factory: FAISS factory string.
        trained: :data:`TRAINED_FILE` when the shards share one trained index
            (:func:`write_trained`), else ``""`` (the shard is trained on its own rows).

    Returns:
        The shard's :class:`ShardInfo`.

    Raises:
        ConfigError: bad factory or failed training.
        CorruptIndexError: a part has another shape than announced.
    """
    faiss = load_faiss()
    d = Path(folder) / DENSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    emb, fai = f"emb-{shard_no:05d}.npy", f"faiss-{shard_no:05d}.index"
    info = ShardInfo(embeddings=f"{DENSE_DIR}/{emb}", faiss=f"{DENSE_DIR}/{fai}", start=int(start), count=int(count))
    if (d / fai).exists() and (d / emb).exists():
        return info
    if not (d / emb).exists():  # a build killed during the FAISS step keeps its copied embeddings
        copy_rows(d / emb, start, count, parts, dim)
    vectors = np.load(d / emb, mmap_mode="r")
    if vectors.shape != (count, dim):
        raise CorruptIndexError(f"Embedding shard {d / emb} has shape {vectors.shape}, expected ({count}, {dim}).")
    # Built from the stored float16 values so that the FAISS scores equal those of the
    # memory-mapped embeddings (exact re-scoring and recall checks agree bit for bit).
    index = build_faiss(vectors, factory, Path(folder) / trained if trained else None)
    del vectors
    tmpf = d / f".{fai}.tmp"
    faiss.write_index(index, str(tmpf))
    os.replace(tmpf, d / fai)
    return info
