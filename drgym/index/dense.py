"""Dense passage index: float16 embedding shards plus one FAISS index per shard.

Layout inside an index folder (rows are passage rows of the docstore)::

    dense/emb-00000.npy     float16 (count, dim), unit rows, memory-mapped at load
    dense/faiss-00000.index FAISS index over those rows (local ids 0..count-1)
    dense/tie_rank.npy      int64 (n_passages,): rank of each row's passage_id in
                            sorted order, used to break score ties
    dense/trained.index     several IVF shards only: the empty trained index every
                            shard was cloned from (one coarse quantizer for all)

Every shard is searched, the candidates are merged by score and equal scores are
ordered by passage_id (which starts with the doc_id), so a ranking never depends on
the shard layout or on thread timing. DeepResearchGym shards its ClueWeb22 index the
same way (25M documents a shard); the default here keeps wiki-default in one shard.

FAISS indexes come from ``faiss.index_factory(dim, factory, METRIC_INNER_PRODUCT)``.
A shard is built from its memory-mapped float16 embeddings, so the build holds the FAISS
index plus one batch of :data:`ADD_BATCH` rows, never a float32 copy of the shard.
Indexes that need training (``IVF...``, ``PQ...``) are trained on a fixed random sample
(:func:`train_sample_rows`: all rows up to 65,536, then 64 per IVF list, at most
1,048,576): of their shard, or, for an IVF index in several shards, of all rows once
(:func:`write_trained`), every shard then being a clone of that trained index, so that
the shards share one coarse quantizer and a query is assigned to lists once
(:func:`coarse_assign`). HNSW graphs of up to 200k vectors are built single-threaded so that a
rebuild gives the same graph.
On a machine where faiss sees GPUs, IVF coarse quantizers are trained on the GPU and
shards are moved to the GPU for search (HNSW stays on CPU: faiss has no GPU HNSW): by
default each shard is copied whole onto every GPU; ``gpu_shard=True`` splits its rows
across the GPUs and ``gpu_float16=True`` stores them in float16, as Search-R1 serves
wiki-18 (:func:`gpu_cloner_options`).

Search parameters (``efSearch``, ``nprobe``, ``rerank``) come from one rule,
:func:`search_params_for`, used by every dense search: the library's
:class:`~drgym.search.local.LocalSearchEngine`, ``drgym serve`` and the shard servers of
``drgym serve-ray``, so the three rank alike on the same index.

An imported FAISS index (:mod:`drgym.index.importer`) may come without embedding
files: its :class:`ShardInfo` then has ``embeddings == ""``.

A search checks what FAISS returns: a FAISS error, a row outside the shard or a
non-finite score of a stored vector (a garbled file) raises
:class:`~drgym.errors.CorruptIndexError` naming the shard file; same-size corruption that
gives plausible numbers is caught by the manifest's checksums
(:meth:`drgym.index.manifest.IndexManifest.check_files`).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.manifest import ShardInfo, corrupt_file_error
from drgym.index.prealloc import open_memmap

log = logging.getLogger(__name__)

DENSE_DIR = "dense"
TIE_MARGIN = 16
"""Extra candidates fetched per shard so that exact score ties at the cut-off are
resolved by passage_id rather than by FAISS's internal order."""

DEFAULT_SEARCH_PARAMS: dict[str, int] = {"efSearch": 64, "nprobe": 0, "rerank": 100, "probe_groups": 4}
"""Search-time parameters, applied when the index has them. HNSW ``efSearch=64`` gives
ANN recall@10 of 0.997 against exact search on wiki-default (scripts/bench_search.py).
IVF ``nprobe=0`` means the index's own: the ``nprobe`` its build measured
(:func:`drgym.index.calibrate.calibrate_nprobe`, passed by
:meth:`DenseIndex.from_manifest`), else :func:`auto_nprobe` (a quarter of the lists, at
least 16); a number fixes it. ``rerank`` (drgym's, not FAISS's): shards whose codes are lossy (PQ, scalar
quantizers) return this many candidates per query in all, split between the shards by
their rows (:func:`rerank_depth`), which are re-scored exactly with the shards' float16
embeddings (memory-mapped, so RAM holds only the codes); the scores are
then the same inner products a ``Flat`` index gives. 0 turns it off. Measured on
synthetic 384-d vectors by scripts/bench_scale.py (docs/benchmarks/scale.md): at 10^6
vectors with IVF1024,PQ48x4fs (``auto``), recall@10 is 0.63 with the 4-bit codes'
own scores and 0.97 with the re-rank, both at the default nprobe 256. ``probe_groups``
(drgym's): see :data:`PROBE_GROUPS_KEY`."""

NPROBE_MIN = 16
NPROBE_FRACTION = 4
"""``auto_nprobe``: probe ``nlist / NPROBE_FRACTION`` lists, at least ``NPROBE_MIN``: the
smallest share that reached recall@10 >= 0.95 on the measured curve at every size
(``scripts/results/bench_ann_curve.json``)."""


def auto_nprobe(nlist: int) -> int:
    """IVF lists probed per query when the index has no measured ``nprobe``
    (:mod:`drgym.index.calibrate`): ``max(16, nlist // 4)`` (capped at nlist).

    Chosen from a measured recall/latency curve (``python scripts/bench_scale.py --curve``,
    IVF-PQ with the exact re-rank, topic-clustered MiniLM-like vectors): recall@10 is set
    by the share of lists probed, not by the re-rank depth (100, 300 and 1,000 candidates
    gave the same recall), and a quarter of the lists gave 0.965 at 10^5 vectors
    (IVF256) and 0.969 at 10^6 (IVF1024), where a sixteenth gave 0.84 and 0.82.

    >>> auto_nprobe(256), auto_nprobe(1024), auto_nprobe(4096)
    (64, 256, 1024)
    """
    return min(int(nlist), max(NPROBE_MIN, int(nlist) // NPROBE_FRACTION))


RERANK_KEY = "rerank"

PROBE_GROUPS_KEY = "probe_groups"
"""Search parameter (drgym's, not FAISS's): the FAISS calls one query's search of an IVF
index is split into at most, so that one query on an index of few, large shards keeps
several cores busy on the ``shard_workers`` threads. Each IVF shard with a flat
inner-product quantizer splits the query's probed lists into ``ceil(probe_groups /
shards)`` groups (``shards``: the whole index's, also in a ``drgym serve-ray`` shard
server), fewer where a group would scan under :data:`PROBE_GROUP_MIN_CODES` codes, and a
power of two (so that 2, 4, 8... cores share them evenly), dealt
round-robin by rank (group ``g`` of ``G`` holds the lists ranked ``g, g + G, ...``,
:func:`group_assign`), and searches each group as its own call: the shard is then searched
like ``G`` shards that each hold a share of the probed lists (each returns its share of
the re-rank, re-scored exactly, and :func:`merge_shard_results` merges them), but every
list is scanned once, where ``G`` shards of the rows would each scan every probed list (a
fast-scan search pays per list and shard). The split depends on the manifest and the
search parameters only, not on the machine's cores, so rankings are the same on every
machine, alone and in any batch. It costs CPU: at wiki-18 size in one shard, one query
took 0.69-0.96x the time in 2 groups on 2 cores, on 1.1-1.3x the CPU time
(scripts/bench_probe_groups.py, docs/benchmarks/scale.md). 1 turns it off (for a server
whose cores are all busy with other queries), as do shards without that shared
assignment (HNSW, Flat, OPQ, GPU)."""

PROBE_GROUP_MIN_CODES = 1_500_000
"""A probe group scans at least this many codes on average (its shard's rows x nprobe /
nlist, divided by the groups; 0 or 1: no minimum): below it, a FAISS call's fixed cost
(its set-up, its share of the re-rank, the merge) and the second core's slower memory
outweigh what the core saves. Measured one query at a time on 2 cores
(scripts/bench_probe_groups.py --min-codes 0, docs/benchmarks/scale.md), time in 2 groups
against 1: 1.55x at 10^5 rows (22,000 codes a query), 0.91-1.05x at 10^6 (219,000),
1.00-1.04x at 2.1x10^7 rows and nprobe 128 of 2,048 (1.3 million codes, 650,000 a group),
0.96x at 256 (2.6 million) and 0.87-0.91x at 448 (4.6 million), each on 1.15-1.3x the CPU
time."""

DRGYM_PARAMS = frozenset({RERANK_KEY, PROBE_GROUPS_KEY})
"""Search parameters that drgym applies itself; FAISS never sees them."""


def rerank_depth(rerank: int, shard_rows: int, all_rows: int, k: int) -> int:
    """Candidates one re-ranking shard returns (and re-scores exactly) per query.

    ``rerank`` is the number of candidates re-scored per query across the whole index,
    split between the shards in proportion to their rows, and never fewer than
    ``k + TIE_MARGIN`` a shard (nor more than it holds). One shard holding every row
    re-ranks ``rerank``; wiki-18 in 9 shards (8 of 2.5x10^6 rows, one of 1.0x10^6)
    re-ranks 26 a shard at k=10, so a query reads 234 float16 rows instead of 900 (100 a
    shard): a shard holds only its part of the true top k. Measured there
    (scripts/results/bench_ann_curve_wiki18.json, nprobe 512 of 2,048, 200 queries):
    recall@10 0.969 and one query p50 14.4 ms, against 0.973 and 15.7 ms with 100 a
    shard. The split depends only on the manifest,
    so a ``drgym serve-ray`` shard server (which loads one shard) re-ranks as the library.

    Args:
        rerank: the ``rerank`` search parameter (> 0).
        shard_rows, all_rows: rows of this shard and of the whole index.
        k: results asked for.

    Returns:
        the depth, in ``[min(shard_rows, k + TIE_MARGIN), shard_rows]``.

    >>> rerank_depth(100, 1_000_000, 1_000_000, 10), rerank_depth(100, 2_500_000, 21_015_324, 10)
    (100, 26)
    >>> rerank_depth(300, 2_500_000, 5_000_000, 10), rerank_depth(100, 5, 5, 10)
    (150, 5)
    """
    share = -(-int(rerank) * int(shard_rows) // max(1, int(all_rows)))  # ceil
    return min(int(shard_rows), max(int(k) + TIE_MARGIN, share))


def search_params_for(index, requested: dict[str, int] | None = None) -> dict[str, int]:
    """The search parameters one FAISS index is searched with: the one rule of every
    dense search (library, ``drgym serve``, ``drgym serve-ray`` shards).

    :data:`DEFAULT_SEARCH_PARAMS` updated with ``requested``, then fitted to ``index``:
    ``efSearch`` is kept for HNSW indexes only, ``nprobe`` for IVF indexes only (``0``
    becomes :func:`auto_nprobe` of the index's ``nlist``; a number larger than ``nlist``
    is cut to ``nlist``), ``probe_groups`` for IVF indexes only (:data:`PROBE_GROUPS_KEY`;
    0 counts as 1, and a number above ``nprobe`` is cut to it); ``rerank`` (drgym's exact
    re-scoring, see :data:`DEFAULT_SEARCH_PARAMS`) and any other FAISS parameter are kept
    as given.

    Args:
        index: a CPU FAISS index (a shard as read from disk).
        requested: parameters to change (None: the defaults).

    Returns:
        ``{name: int}`` to apply, e.g. ``{"nprobe": 128, "rerank": 100,
        "probe_groups": 4}`` for ``IVF512,PQ16``.

    Raises:
        ConfigError: a parameter that is not an integer >= 0.

    >>> import faiss
    >>> search_params_for(faiss.index_factory(8, "IVF512,Flat", faiss.METRIC_INNER_PRODUCT))
    {'nprobe': 128, 'rerank': 100, 'probe_groups': 4}
    """
    faiss = _faiss()
    params = {**DEFAULT_SEARCH_PARAMS, **(requested or {})}
    inner = faiss.downcast_index(index)
    out: dict[str, int] = {}
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ConfigError(f"search parameter {name} must be an integer >= 0, got {value!r}.")
        value = int(value)
        if name == "efSearch" and not hasattr(inner, "hnsw"):
            continue
        if name in ("nprobe", PROBE_GROUPS_KEY):
            try:
                nlist = int(faiss.extract_index_ivf(index).nlist)
            except RuntimeError:  # not an IVF index
                continue
            value = max(1, value) if name == PROBE_GROUPS_KEY else auto_nprobe(nlist) if not value else min(value, nlist)
        out[name] = value
    if PROBE_GROUPS_KEY in out:
        out[PROBE_GROUPS_KEY] = min(out[PROBE_GROUPS_KEY], out["nprobe"])
    return out


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
    faiss = _faiss()
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

ADD_BATCH = 262_144
"""Rows converted to float32 and added to a FAISS index at a time (384-d: 403 MB)."""

TRAIN_MIN = 65_536
TRAIN_PER_LIST = 64
TRAIN_MAX = 1_048_576
"""Training sample of an IVF/PQ shard: every row up to ``TRAIN_MIN``, else
``max(TRAIN_MIN, TRAIN_PER_LIST * nlist)`` rows capped at ``TRAIN_MAX`` (FAISS warns
below 39 points per centroid; 64 per list follows its wiki's guideline of 30-256)."""


FLAT_BLAS_THRESHOLD = 4 * 384
"""``faiss.cvar.distance_compute_blas_threshold`` that drgym sets. faiss 1.15 compares it
with queries x dimension: exact (``Flat``) inner products of fewer go through FAISS's
per-query loop, the others through BLAS. 1,536 sends 1 to 3 queries of 384 dimensions
(MiniLM), 1 of 768, through the loop and larger batches through BLAS (an IVF shard with a
flat inner-product quantizer is assigned its lists by drgym's :func:`coarse_assign`, not by
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
not keep them: a Flat shard's ``k +`` :data:`TIE_MARGIN` candidates are re-scored by
:func:`exact_scores`, so a query scores bit for bit alike alone and in a batch of any size
(``tests/test_scale_rules.py``). Either way the scores a query gets come from
:func:`exact_scores`, so the path FAISS takes never changes them."""


def _faiss():
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


def _last_line(e: BaseException) -> str:
    """The last line of a (FAISS C++) error message: the one that says what failed."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(e).__name__


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


def _search_on_threads(index, q: np.ndarray, k: int, threads: int = 1, assign=None):
    """``index.search(q, k)`` on ``threads`` OpenMP threads (the setting is the calling
    thread's, restored afterwards); with ``assign`` (:func:`coarse_assign`'s ``(D, I)``),
    ``index.search_preassigned``."""
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(int(threads))
    try:
        return _search(index, q, k, assign)
    finally:
        faiss.omp_set_num_threads(before)


def _search(index, q: np.ndarray, k: int, assign=None):
    if assign is None:
        return index.search(q, k)
    return index.search_preassigned(q, k, assign[1], assign[0])


def group_assign(assign: tuple[np.ndarray, np.ndarray], group: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """The lists of probe group ``group`` of ``groups`` (:data:`PROBE_GROUPS_KEY`): of each
    query's assigned lists, those ranked ``group, group + groups, ...``, first, and list
    ``-1`` after them (FAISS skips it), so the shape stays ``(nq, nprobe)`` as
    ``search_preassigned`` needs; the padding's distances repeat the group's last one so
    that they stay inside the range FAISS quantizes.

    Args:
        assign: :func:`coarse_assign`'s ``(D, I)``, ``(nq, nprobe)`` each.
        group, groups: ``0 <= group < groups <= nprobe``.

    Returns:
        ``(D, I)`` of the same shapes and dtypes.

    >>> D = np.array([[0.9, 0.8, 0.7, 0.6, 0.5]], dtype=np.float32)
    >>> I = np.array([[4, 2, 7, 1, 3]])
    >>> [group_assign((D, I), g, 2)[1].tolist() for g in (0, 1)]
    [[[4, 7, 3, -1, -1]], [[2, 1, -1, -1, -1]]]
    """
    D, I = assign
    mine_d, mine_i = D[:, group::groups], I[:, group::groups]
    m = mine_i.shape[1]
    Dg = np.empty_like(D)
    Ig = np.full_like(I, -1)
    Ig[:, :m], Dg[:, :m] = mine_i, mine_d
    Dg[:, m:] = mine_d[:, -1:]
    return Dg, Ig


def coarse_assign(centroids: np.ndarray, q: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``nprobe`` IVF lists of each query: those whose centroids have the largest
    inner products with it, best first, ties by list number.

    The one coarse search of drgym's IVF shards with a flat inner-product quantizer; the
    library, ``drgym serve`` and ``drgym serve-ray``'s shard servers all call it, so they
    probe the same lists, and shards cloned from one trained index (:func:`write_trained`)
    are assigned once for all. Each query is scored alone (numpy's matrix-vector product,
    ``centroids @ q``), so a query probes the same lists alone and in any batch: FAISS's
    own assignment multiplies a batch at once, whose rounding depends on the batch. The
    cost is one matrix-vector product a query (it reads the ``nlist x dim`` centroids
    once a query), also in a batch.

    Args:
        centroids: float32 ``(nlist, dim)`` coarse centroids (inner-product quantizer).
        q: float32 ``(nq, dim)`` queries.
        nprobe: lists per query, ``1 <= nprobe <= nlist``.

    Returns:
        ``(D, I)``: float32 inner products and int64 list numbers, ``(nq, nprobe)``.

    >>> c = np.eye(3, dtype=np.float32)
    >>> coarse_assign(c, np.array([[0.1, 0.9, 0.5]], dtype=np.float32), 2)[1].tolist()
    [[1, 2]]
    """
    nlist = len(centroids)
    D = np.empty((len(q), nprobe), dtype=np.float32)
    I = np.empty((len(q), nprobe), dtype=np.int64)
    for i in range(len(q)):
        s = centroids @ q[i]
        top = np.argpartition(-s, nprobe - 1)[:nprobe] if nprobe < nlist else np.arange(nlist)
        d = s[top]
        order = np.lexsort((top, -d))
        I[i], D[i] = top[order], d[order]
    return D, I


def new_faiss_index(dim: int, factory: str):
    """An empty FAISS index from ``index_factory`` (inner product; HNSW ``efConstruction``
    set to :data:`HNSW_EF_CONSTRUCTION`).

    Raises:
        ConfigError: the factory string is invalid.
    """
    faiss = _faiss()
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
    faiss = _faiss()
    try:
        nlist = int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:  # not an IVF index
        nlist = 0
    size = min(n, max(TRAIN_MIN, min(TRAIN_MAX, TRAIN_PER_LIST * nlist)))
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(0).choice(n, size, replace=False)).astype(np.int64)


def _train(index, x: np.ndarray, factory: str) -> None:
    faiss = _faiss()
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
    faiss = _faiss()
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


EXACT_CHUNK = 64
"""Queries re-scored at a time by :func:`exact_scores` (bounds its float64 temporaries to
``EXACT_CHUNK * m * dim * 8`` bytes, 19.7 MB for ``m = 100`` and 384-d vectors)."""


def exact_scores(emb: np.ndarray, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Inner products of queries with stored vectors, the same on every path.

    Each score is the float32 rounding of a float64 sum of exact products (a float16 or
    float32 row times a float32 query is exact in float64), summed over the one row alone.
    So a query's scores do not depend on the batch it came in, the shard layout, the
    thread count, the BLAS build or the device: FAISS's own scores differ between these
    in the last bit (OpenBLAS picks its kernel by matrix size and CPU). Two summation
    orders could round differently only where the float64 sum lies within about 1e-16
    (relative) of a float32 rounding boundary.

    Args:
        emb: ``(count, dim)`` shard vectors, float16 (memory-mapped embeddings) or float32
            (an imported Flat index's own storage).
        q: float32 ``(nq, dim)`` queries.
        ids: int64 ``(nq, m)`` shard-local rows; ``-1`` entries get ``-inf``.

    Returns:
        float32 ``(nq, m)`` scores.
    """
    ok = ids >= 0
    out = np.full(ids.shape, -np.inf, dtype=np.float32)
    for a in range(0, ids.shape[0], EXACT_CHUNK):
        part, mask = ids[a:a + EXACT_CHUNK], ok[a:a + EXACT_CHUNK]
        flat = np.where(mask, part, 0).ravel()
        order = np.argsort(flat, kind="stable")  # sorted reads from the memory map
        vecs = np.empty((flat.size, emb.shape[1]), dtype=np.float64)
        vecs[order] = emb[flat[order]]
        vecs = vecs.reshape(part.shape[0], part.shape[1], -1)
        vecs *= np.asarray(q[a:a + EXACT_CHUNK], dtype=np.float64)[:, None, :]
        scores = vecs.sum(axis=2).astype(np.float32)
        out[a:a + EXACT_CHUNK] = np.where(mask, scores, -np.inf)
    return out


def flat_storage(index) -> np.ndarray | None:
    """An exact (``IndexFlat``) FAISS index's float32 vectors as a zero-copy
    ``(ntotal, d)`` view (valid while ``index`` lives), else None."""
    faiss = _faiss()
    inner = faiss.downcast_index(index)
    if not isinstance(inner, faiss.IndexFlat) or inner.ntotal == 0:
        return None
    return faiss.rev_swig_ptr(inner.get_xb(), inner.ntotal * inner.d).reshape(inner.ntotal, inner.d)


TRAINED_FILE = f"{DENSE_DIR}/trained.index"
"""The empty, trained IVF index that every shard of a several-shard IVF index is cloned
from (:func:`write_trained`)."""


def advise_random(arr: np.ndarray) -> bool:
    """Tell the kernel that a memory-mapped array's rows are read at random
    (``madvise(MADV_RANDOM)``), so that a page fault reads its page and not the file's
    read-ahead window around it.

    The exact re-rank reads a few hundred scattered float16 rows a query. Without the
    advice, Linux reads ahead around each faulting page (up to ``read_ahead_kb``, 8 MiB on
    the benchmark machine's disk): where the embeddings are not in the page cache, a row
    missed costs far more I/O than its 768 bytes and pushes other pages out. Measured at
    wiki-18 size (2.1x10^7 rows, 16 GB of float16 rows, 200 queries from an empty page
    cache): 381 MB read with the advice against 15.5 GB without, mean 24-29 against 62-72
    ms a query (``scripts/bench_madvise.py``, ``scripts/results/bench_madvise_wiki18.json``).

    Returns:
        True when the advice was given; False for an array that is not memory-mapped, a
        platform without ``MADV_RANDOM`` (macOS has it, Windows not), or a kernel that
        refused it (logged at debug level).
    """
    import mmap

    mm = getattr(arr, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_RANDOM"):
        return False
    try:
        mm.madvise(mmap.MADV_RANDOM)
    except OSError as e:  # advice only: searching works without it, as before
        log.debug("madvise(MADV_RANDOM) refused for a memory-mapped array: %s", e)
        return False
    return True


def _open_part(path, rows: int, dim: int) -> np.ndarray:
    """An embedding part, memory-mapped; CorruptIndexError unless it is ``(rows, dim)``."""
    src = np.load(path, mmap_mode="r")
    if src.ndim != 2 or src.shape[1] != dim or len(src) != rows:
        raise CorruptIndexError(f"Embedding part {path} has shape {src.shape}, expected ({rows}, {dim}).")
    return src


def read_rows(parts, rows: np.ndarray, dim: int) -> np.ndarray:
    """Rows of an index's embedding parts, as float32 rounded through float16 (the
    values the shards store), so that training sees what search scores.

    Args:
        parts: ``(npy path, first global row, rows)`` in row order, float16 or float32
            ``(rows, dim)`` arrays (memory-mapped).
        rows: int64 sorted global rows.
        dim: embedding dimension.

    Returns:
        float32 ``(len(rows), dim)``.

    Raises:
        CorruptIndexError: a part has another shape than announced, or ``rows`` are not
            all covered by the parts.
    """
    out = np.empty((len(rows), dim), dtype=np.float32)
    done = 0
    for path, p0, pn in parts:
        a, b = np.searchsorted(rows, [p0, p0 + pn])
        if a == b:
            continue
        src = _open_part(path, pn, dim)
        out[a:b] = np.asarray(src[rows[a:b] - p0]).astype(np.float16)
        done += b - a
        del src
    if done != len(rows):
        raise CorruptIndexError(f"Embedding parts cover {done} of the {len(rows)} training rows asked for.")
    return out


def write_trained(folder: str | Path, parts, n: int, dim: int, factory: str) -> str:
    """Train an IVF ``factory`` once for all the shards of an index and write it, empty,
    to :data:`TRAINED_FILE` (through a temporary file; a resumed build reuses it).

    Every shard is then a clone of it plus its own rows (FAISS's recipe for building an
    IVF index in pieces), so the shards share one coarse quantizer and one set of codes:
    :class:`DenseIndex` assigns a query to its lists once, not once per shard. The sample
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
    faiss = _faiss()
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
    faiss = _faiss()
    n, dim = vectors.shape
    if trained:
        try:
            index = faiss.read_index(str(trained))
        except RuntimeError as e:
            raise corrupt_file_error(Path(trained), f"is unreadable (FAISS: {_last_line(e)})",
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
    faiss = _faiss()
    d = Path(folder) / DENSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    emb, fai = f"emb-{shard_no:05d}.npy", f"faiss-{shard_no:05d}.index"
    info = ShardInfo(embeddings=f"{DENSE_DIR}/{emb}", faiss=f"{DENSE_DIR}/{fai}", start=int(start), count=int(count))
    if (d / fai).exists() and (d / emb).exists():
        return info
    if not (d / emb).exists():  # a build killed during the FAISS step keeps its copied embeddings
        _copy_rows(d / emb, start, count, parts, dim)
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


def _copy_rows(dest: Path, start: int, count: int, parts, dim: int) -> None:
    """Write rows ``[start, start + count)`` of the parts to ``dest`` as float16 (via a
    temporary file renamed into place)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    out = open_memmap(tmp, np.float16, (count, dim))  # disk space reserved: a full disk is ENOSPC, not SIGBUS
    stop = start + count
    for path, p0, pn in parts:
        a, b = max(start, p0), min(stop, p0 + pn)
        if a >= b:
            continue
        src = _open_part(path, pn, dim)
        for c in range(a, b, ADD_BATCH):
            e = min(b, c + ADD_BATCH)
            out[c - start : e - start] = src[c - p0 : e - p0]
        del src
    out.flush()
    del out
    os.replace(tmp, dest)


def write_tie_rank(folder: Path, rows_in_id_order, n: int) -> None:
    """Write ``dense/tie_rank.npy``: int64 ``(n,)``, the rank of each row's passage_id in
    sorted order.

    Args:
        folder: the index build folder.
        rows_in_id_order: iterable of the ``n`` rows sorted by passage_id
            (:meth:`drgym.docstore.DocStoreWriter.iter_rows_by_passage_id`).
        n: number of passages.

    Raises:
        CorruptIndexError: the iterable does not give each row once.
    """
    d = Path(folder) / DENSE_DIR
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / ".tie_rank.npy.tmp"
    rank = open_memmap(tmp, np.int64, (n,))  # disk space reserved: a full disk is ENOSPC, not SIGBUS
    rank[:] = -1
    i = 0
    buf: list[int] = []
    for r in rows_in_id_order:
        buf.append(r)
        if len(buf) == 1 << 20:
            rank[np.asarray(buf, dtype=np.int64)] = np.arange(i, i + len(buf), dtype=np.int64)
            i += len(buf)
            buf = []
    if buf:
        rank[np.asarray(buf, dtype=np.int64)] = np.arange(i, i + len(buf), dtype=np.int64)
        i += len(buf)
    ok = i == n and (n == 0 or int(rank.min()) >= 0)
    rank.flush()
    del rank
    if not ok:
        tmp.unlink()
        raise CorruptIndexError(f"tie ranks cover {i} rows, expected each of {n} rows once.")
    os.replace(tmp, d / "tie_rank.npy")


def load_tie_rank(folder: Path, n: int) -> np.ndarray:
    """Load ``dense/tie_rank.npy`` (int64 ``(n,)``, memory-mapped).

    Raises:
        CorruptIndexError: missing, unreadable or of the wrong length.
    """
    p = Path(folder) / DENSE_DIR / "tie_rank.npy"
    try:
        rank = np.load(p, mmap_mode="r")  # 8 bytes a row: shared page cache, not private memory
    except (OSError, ValueError, EOFError) as e:
        raise corrupt_file_error(p, f"is unreadable ({e})", folder) from e
    if rank.shape != (n,) or rank.dtype != np.int64:
        raise corrupt_file_error(p, f"holds {rank.dtype} of shape {rank.shape}, expected int64 ({n},)", folder)
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


def merge_shard_results(parts_s: list[np.ndarray], parts_r: list[np.ndarray], tie_rank: np.ndarray, nq: int,
                        k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard candidates into the top ``k`` of each query (:func:`select_top`:
    score descending, ties by passage_id): the one merge of the local engine and of the
    sharded Ray Serve router, so both rank alike.

    Args:
        parts_s: per shard, float32 ``(nq, m_i)`` scores.
        parts_r: per shard, int64 ``(nq, m_i)`` global rows (``-1`` padding).
        tie_rank: int64 ``(n_passages,)`` passage_id ranks.
        nq: number of queries.
        k: results per query.

    Returns:
        ``(scores, rows)`` of shape ``(nq, k)``, padded with ``-inf`` / ``-1``.
    """
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_r = np.full((nq, k), -1, dtype=np.int64)
    if not parts_s:
        return out_s, out_r
    all_s, all_r = np.concatenate(parts_s, axis=1), np.concatenate(parts_r, axis=1)
    for i in range(nq):
        sc, rw = select_top(all_s[i], all_r[i], tie_rank, k)
        out_s[i, : len(sc)] = sc
        out_r[i, : len(rw)] = rw
    return out_s, out_r


class DenseIndex:
    """The dense shards of one index, loaded for search.

    Args:
        folder: the index folder.
        shards: shard descriptions from the manifest.
        dim: embedding dimension.
        n_passages: total rows.
        device: ``"cpu"`` forces CPU; None or ``"cuda"`` uses faiss GPUs when present.
        search_params: FAISS search parameters (``efSearch``, ``nprobe``...); each is
            applied to the shards that have it. Defaults: ``defaults``, then
            :data:`DEFAULT_SEARCH_PARAMS`.
        defaults: the index's own measured parameters, under ``search_params``
            (:attr:`drgym.index.manifest.IndexManifest.search_defaults`, e.g. the
            ``nprobe`` of :func:`drgym.index.calibrate.calibrate_nprobe`); load an
            index's shards with :meth:`from_manifest`, which passes them.
        shard_ids: load only these shards (a shard server of
            :mod:`drgym.distributed.serve`); rows stay global. None loads all.
        mmap: memory-map the shards' FAISS files (``IO_FLAG_MMAP_IFC``) instead of reading
            them into memory: with faiss 1.15, Flat and SQ codes, IVF inverted lists and
            HNSW's storage then live in the page cache (measured: loading a 45 MiB IVF256,PQ16
            file grows private memory by 1.9 MiB, against 48 MiB when read), shared by
            every process that maps the same file, and a shard larger than RAM still loads
            (searches then read from disk).
        gpu_shard, gpu_float16: on GPUs, split each shard's rows across the GPUs and
            store them in float16 (:func:`gpu_cloner_options`); ignored on CPU.
        shard_workers: threads that search several CPU shards, and the probe groups of
            IVF shards (:data:`PROBE_GROUPS_KEY`), side by side when each call runs on
            one thread (below :data:`SMALL_BATCH` queries, or ``threads=1``); None: the
            number of such jobs a query makes, at most :func:`drgym.cpu.thread_count`.
            1 searches them in turn. The results are the same either way.

    Attributes:
        shard_params: per loaded shard, the parameters :func:`search_params_for` chose.
        on_gpu: some shard is searched on GPU.
        gpu_errors: why shards stayed on CPU although GPUs were seen (also logged).

    Raises:
        CorruptIndexError: a shard file is unreadable or disagrees with the manifest.
        ConfigError: a bad search parameter, or GPU options with a CPU-only faiss on a
            machine with GPUs.
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
        shard_ids: list[int] | None = None,
        mmap: bool = False,
        gpu_shard: bool = False,
        gpu_float16: bool = False,
        shard_workers: int | None = None,
        defaults: dict[str, int] | None = None,
    ) -> None:
        faiss = _faiss()
        if shard_workers is not None and int(shard_workers) < 1:
            raise ConfigError(f"shard_workers must be >= 1, got {shard_workers}.")
        self.folder = Path(folder)
        all_rows = sum(s.count for s in shards)
        self._index_shards = len(shards)  # the whole index's, also where shard_ids loads some
        self.shards = list(shards) if shard_ids is None else [shards[i] for i in shard_ids]
        self.dim = int(dim)
        self.n_passages = int(n_passages)
        self.tie_rank = load_tie_rank(self.folder, self.n_passages)
        # a given nprobe of 0 means the index's own (its measured one, else auto_nprobe)
        given = {k: v for k, v in (search_params or {}).items()
                 if not (k == "nprobe" and isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v == 0)}
        self.search_params = {**DEFAULT_SEARCH_PARAMS, **(defaults or {}), **given}
        self.rerank = int(self.search_params[RERANK_KEY])
        self.shard_params: list[dict[str, int]] = []
        self.gpu_shard, self.gpu_float16 = bool(gpu_shard), bool(gpu_float16)
        self._indexes = []
        self._lossy: list[bool] = []
        self._lock = threading.Lock()
        self._pool = None  # the shard_workers threads, made on first use
        self._embeddings: list[np.ndarray | None] = []
        self._exact: list[np.ndarray | None] = []  # rows that exact_scores reads, per shard
        self._exact_owners: list = []  # CPU FAISS indexes whose storage _exact views (kept alive)
        self.on_gpu = False
        self.gpu_errors: list[str] = []  # why shards stayed on CPU on a GPU machine
        use_gpu = device != "cpu" and gpus_available() > 0
        total = 0
        for s in self.shards:
            ep, fp = self.folder / s.embeddings, self.folder / s.faiss
            emb = None
            if s.embeddings:  # an imported FAISS index may have no embedding file
                try:
                    emb = np.load(ep, mmap_mode="r")
                    advise_random(emb)
                except (OSError, ValueError, EOFError) as e:
                    raise corrupt_file_error(ep, f"is unreadable ({e})", self.folder) from e
                if emb.shape != (s.count, self.dim) or emb.dtype != np.float16:
                    raise corrupt_file_error(ep, f"has shape {emb.shape} and dtype {emb.dtype}, expected "
                                                 f"({s.count}, {self.dim}) float16", self.folder)
            try:
                index = faiss.read_index(str(fp), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mmap else 0)
            except (RuntimeError, MemoryError) as e:  # a garbled size field can ask for terabytes
                raise corrupt_file_error(fp, f"is unreadable (FAISS: {_last_line(e)})", self.folder) from e
            if index.ntotal != s.count or index.d != self.dim:
                raise corrupt_file_error(fp, f"holds {index.ntotal} vectors of dim {index.d}, expected {s.count} "
                                             f"of dim {self.dim}", self.folder)
            params = search_params_for(index, self.search_params)
            self._apply_params(index, params)
            self.shard_params.append(params)
            self._lossy.append(is_lossy(index))
            exact = emb
            if exact is None and (mmap or not use_gpu):
                # an imported Flat index's own vectors; kept only where that costs no second copy in RAM (a
                # GPU copy would otherwise leave the CPU index alive beside it, as large as the shard)
                exact = flat_storage(index)
                if exact is not None:
                    self._exact_owners.append(index)  # the view lives as long as this CPU index
            self._exact.append(exact)
            if use_gpu:
                index = self._to_gpu(index, params)
            self._indexes.append(index)
            self._embeddings.append(emb)
            total += s.count
        if all_rows != self.n_passages or (shard_ids is None and total != self.n_passages):
            raise CorruptIndexError(f"Dense shards hold {all_rows} rows, the manifest says {self.n_passages}.")
        self._coarse, self._coarse_of = self._coarse_groups()
        self._n_groups = [self._probe_groups(i) for i in range(len(self.shards))]
        if shard_workers is None:
            from drgym.cpu import thread_count

            shard_workers = min(sum(self._groups(i) for i in range(len(self.shards))), thread_count())
        self.shard_workers = max(1, int(shard_workers))

    @classmethod
    def from_manifest(cls, folder: str | Path, manifest, **kwargs) -> "DenseIndex":
        """The dense shards of the index in ``folder`` described by ``manifest`` (an
        :class:`~drgym.index.manifest.IndexManifest`), searched from its measured
        :attr:`~drgym.index.manifest.IndexManifest.search_defaults`: how the library,
        ``drgym serve`` and ``drgym serve-ray``'s shard servers load an index, so that
        they probe alike. ``kwargs`` are the constructor's (``search_params`` given there
        win over the measured ones).

        Raises:
            as the constructor; CorruptIndexError for a malformed calibration.
        """
        m = manifest
        return cls(folder, m.shards, m.dim, m.n_passages, defaults=m.search_defaults, **kwargs)

    @property
    def coarse_searches(self) -> int:
        """Coarse searches a query costs: one per distinct IVF quantizer among the loaded
        shards. Shards cloned from one trained index (:func:`write_trained`) share theirs,
        so a query is assigned to lists once for all of them."""
        return len(self._coarse)

    def _coarse_groups(self) -> tuple[list[tuple[np.ndarray, int]], list[int | None]]:
        """The distinct ``(centroids, nprobe)`` of the loaded CPU IVF shards whose
        quantizer is a flat inner-product index, and each shard's group (None: FAISS
        assigns the shard's queries itself, e.g. behind an OPQ pre-transform, or on GPU).
        Every such shard is probed through :func:`coarse_assign`, whether it shares its
        quantizer or not, so a shard server holding one shard probes the lists the whole
        index probes."""
        groups: list[tuple[np.ndarray, int]] = []
        of: list[int | None] = [None] * len(self._indexes)
        if self.on_gpu:
            return groups, of
        faiss = _faiss()
        for i, (index, params) in enumerate(zip(self._indexes, self.shard_params)):
            ivf = faiss.downcast_index(index)
            if not isinstance(ivf, faiss.IndexIVF):
                continue
            quantizer = faiss.downcast_index(ivf.quantizer)
            if not isinstance(quantizer, faiss.IndexFlat) or quantizer.metric_type != faiss.METRIC_INNER_PRODUCT:
                continue
            centroids = flat_storage(quantizer)
            if centroids is None:
                continue
            nprobe = int(params["nprobe"])
            for g, (c, p) in enumerate(groups):
                if p == nprobe and np.array_equal(c, centroids):
                    of[i] = g
                    break
            else:
                of[i] = len(groups)
                # a copy in anonymous memory (6 MiB at 4,096 x 384): numpy's matrix-vector product
                # over a view of a memory-mapped FAISS file took about twice as long a query
                groups.append((np.array(centroids, dtype=np.float32, order="C"), nprobe))
        return groups, of

    def close(self) -> None:
        """Stop the shard search threads, if any were started (searching again restarts them)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    @staticmethod
    def _apply_params(index, params: dict[str, int]) -> None:
        """Set ``params`` (from :func:`search_params_for`) on a CPU FAISS index; a GPU
        copy made afterwards inherits them (the cloner copies ``nprobe``)."""
        faiss = _faiss()
        ps = faiss.ParameterSpace()
        for name, value in params.items():
            if name in DRGYM_PARAMS:
                continue
            try:
                ps.set_index_parameter(index, name, value)
            except RuntimeError as e:
                raise ConfigError(f"FAISS search parameter {name}={value} rejected: {str(e).splitlines()[-1]}") from e

    def _to_gpu(self, index, params: dict[str, int]):
        """``index`` on all GPUs (:func:`gpu_cloner_options` of this index's options),
        with ``nprobe`` set again on the GPU copies; the CPU index when moving fails (logged)."""
        faiss = _faiss()
        if hasattr(faiss.downcast_index(index), "hnsw"):
            log.info("faiss has no GPU HNSW; keeping the HNSW shard on CPU")
            return index
        if "FastScan" in type(faiss.downcast_index(index)).__name__:
            log.info("faiss has no GPU fast-scan PQ; keeping the %s shard on CPU (build with --factory "
                     "IVF{nlist},PQ{m}, without x4fs, to search it on the GPU)", type(faiss.downcast_index(index)).__name__)
            return index
        co = gpu_cloner_options(self.gpu_shard, self.gpu_float16)  # a CPU-only faiss: ConfigError, not a fallback
        try:
            gpu = faiss.index_cpu_to_all_gpus(index) if co is None else faiss.index_cpu_to_all_gpus(index, co=co)
            if "nprobe" in params and hasattr(faiss, "GpuParameterSpace"):
                faiss.GpuParameterSpace().set_index_parameter(gpu, "nprobe", params["nprobe"])
            self.on_gpu = True
            return gpu
        except Exception as e:  # noqa: BLE001 - fall back to CPU, but say so
            log.warning("moving a FAISS shard to GPU failed (%s); searching on CPU", e)
            self.gpu_errors.append(f"{type(e).__name__}: {e}")
            return index

    def embeddings(self, rows: np.ndarray) -> np.ndarray:
        """Stored float16 vectors of global ``rows``, as float32 ``(len(rows), dim)``.

        Raises:
            IndexError: a row outside the loaded shards.
            CorruptIndexError: the row's shard has no embedding file (an imported index).
        """
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for i, r in enumerate(np.asarray(rows, dtype=np.int64)):
            for s, emb in zip(self.shards, self._embeddings):
                if s.start <= r < s.start + s.count:
                    if emb is None:
                        raise CorruptIndexError(f"Shard {s.faiss} was imported without embeddings.")
                    out[i] = emb[r - s.start]
                    break
            else:
                raise IndexError(f"row {r} out of range 0..{self.n_passages - 1}")
        return out

    def _reranks(self, i: int) -> bool:
        """Shard ``i``'s candidates are re-scored exactly (lossy codes, float16 rows, rerank > 0)."""
        return self._lossy[i] and self._embeddings[i] is not None and self.rerank > 0

    def _rescores(self, i: int) -> bool:
        """Shard ``i``'s scores come from :func:`exact_scores`, not from FAISS: a re-ranked
        lossy shard, or an exact one whose rows are at hand (float16 embeddings, or an
        imported Flat index's own vectors, unless that index was moved to a GPU from a
        file read into memory). Then a query scores alike alone and in any batch, on CPU
        and GPU."""
        return self._reranks(i) or (not self._lossy[i] and self._exact[i] is not None)

    def _groups(self, i: int) -> int:
        """Probe groups of shard ``i`` (:data:`PROBE_GROUPS_KEY`)."""
        return self._n_groups[i]

    def _probe_groups(self, i: int) -> int:
        """Shard ``i``'s probe groups: ``ceil(probe_groups / shards of the index)``, as
        many as leave each group :data:`PROBE_GROUP_MIN_CODES` codes to scan (the shard's
        rows x nprobe / nlist in all), at most ``nprobe``, at least 1, rounded down to a
        power of two; 1 unless its lists are assigned by :func:`coarse_assign`."""
        g = self._coarse_of[i]
        if g is None:
            return 1
        p = self.shard_params[i]
        nprobe, nlist = int(p["nprobe"]), len(self._coarse[g][0])
        wanted = -(-int(p.get(PROBE_GROUPS_KEY, 1)) // self._index_shards)
        codes = self.shards[i].count * nprobe // max(1, nlist)
        groups = max(1, min(wanted, nprobe, codes // max(1, PROBE_GROUP_MIN_CODES)))
        return 1 << (groups.bit_length() - 1)  # a power of two: the groups share 2^k cores evenly

    def _depth(self, i: int, k: int) -> int:
        """Candidates each probe group of shard ``i`` returns per query for a top-``k``
        search: ``k`` + :data:`TIE_MARGIN`, or where it re-ranks, its share of ``rerank``
        if larger (:func:`rerank_depth`; a group's share is the shard's over the groups)."""
        s = self.shards[i]
        if not self._reranks(i):
            return min(s.count, k + TIE_MARGIN)
        # n_passages: every shard's rows (checked); a group holds 1/groups of the shard's share
        return rerank_depth(self.rerank, s.count, self.n_passages * self._groups(i), k)

    def _shard_pool(self):
        with self._lock:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.shard_workers, thread_name_prefix="drgym-shard")
            return self._pool

    def _search_shard(self, i: int, q: np.ndarray, k: int, threads: int | None,
                      assign: tuple[np.ndarray, np.ndarray] | None = None,
                      group: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Shard ``i``'s candidates for ``q`` in probe group ``group`` (FAISS on ``threads``
        OpenMP threads, None: FAISS's setting; ``assign``: the lists to probe, from
        :func:`coarse_assign`, of which the group's are searched): scores and global rows
        (``-1`` padding)."""
        s, index, emb = self.shards[i], self._indexes[i], self._exact[i]
        rescore = self._rescores(i)
        kk = self._depth(i, k)
        groups = self._groups(i)
        if assign is not None and groups > 1:
            assign = group_assign(assign, group, groups)
        fp = self.folder / s.faiss
        try:
            if self.on_gpu:  # GPU indexes are not safe for concurrent calls
                with self._lock:
                    D, I = index.search(q, kk)
            elif threads is not None:
                D, I = _search_on_threads(index, q, kk, threads, assign)
            else:  # CPU FAISS search is const and thread-safe
                D, I = _search(index, q, kk, assign)
        except (RuntimeError, MemoryError) as e:
            raise corrupt_file_error(fp, f"is unreadable: FAISS search failed ({_last_line(e)})", self.folder) from e
        I = I.astype(np.int64)
        hit = I >= 0
        if ((I < -1) | (I >= s.count)).any():
            bad = int(I[(I < -1) | (I >= s.count)][0])
            raise corrupt_file_error(fp, f"is unreadable: FAISS returned row {bad}, outside the shard's "
                                         f"0..{s.count - 1}", self.folder)
        if rescore:
            D = exact_scores(emb, q, I)
            if not np.isfinite(D[hit]).all():
                bad = self.folder / (s.embeddings or s.faiss)
                raise corrupt_file_error(bad, "is unreadable: it holds NaN or infinite values", self.folder)
        elif not np.isfinite(D[hit]).all():
            raise corrupt_file_error(fp, "is unreadable: a stored vector scores NaN or infinity", self.folder)
        return D, np.where(hit, I + s.start, -1)

    def search(self, queries: np.ndarray, k: int, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows of every query across all shards.

        Args:
            queries: float32 ``(nq, dim)`` unit query vectors.
            k: results per query, >= 1.
            threads: OpenMP threads of each shard's FAISS call (CPU only); None: one
                thread below :data:`SMALL_BATCH` queries, else FAISS's setting. When each
                call runs on one thread, several shards and probe groups
                (:data:`PROBE_GROUPS_KEY`) are searched side by side on ``shard_workers``
                threads.

        Returns:
            ``(scores, rows)``: float32 and int64 arrays of shape ``(nq, k)``, best first,
            inner products (cosine); rows ``-1`` and scores ``-inf`` pad queries with
            fewer than ``k`` hits (a corpus smaller than ``k``).

        Raises:
            ConfigError: ``queries`` of another shape, or holding NaN/inf; ``threads < 1``.
            CorruptIndexError: FAISS failed, returned a row outside its shard, or scored
                a stored vector NaN/inf (a garbled shard file, named).
        """
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ConfigError(f"queries must have shape (n, {self.dim}), got {q.shape}.")
        if not np.isfinite(q).all():
            raise ConfigError("query vectors hold NaN or infinite values (a broken encoder?).")
        if threads is not None and int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}.")
        nq = q.shape[0]
        if threads is None and nq < SMALL_BATCH:
            threads = 1
        shards = [i for i in range(len(self.shards)) if self._depth(i, k) > 0]
        # each distinct quantizer assigns the queries to lists once, for all its shards
        assigns = {g: coarse_assign(self._coarse[g][0], q, self._coarse[g][1])
                   for g in sorted({self._coarse_of[i] for i in shards} - {None})} if nq else {}
        jobs = [(i, g) for i in shards for g in range(self._groups(i) if nq else 1)]

        def run(job: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
            i, g = job
            return self._search_shard(i, q, k, threads, assigns.get(self._coarse_of[i]), g)

        if threads == 1 and not self.on_gpu and len(jobs) > 1 and self.shard_workers > 1:
            # each call runs on one thread, so shards and probe groups search side by side
            # on shard_workers threads (FAISS and numpy release the GIL); same results
            parts = list(self._shard_pool().map(run, jobs))
        else:
            parts = [run(job) for job in jobs]
        parts_s = [d for d, _ in parts]
        parts_r = [r for _, r in parts]
        return merge_shard_results(parts_s, parts_r, self.tie_rank, nq, k)
