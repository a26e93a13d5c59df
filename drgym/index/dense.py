"""Dense passage index: float16 embedding shards plus one FAISS index per shard, loaded
for search (:class:`DenseIndex`).

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

The parts live by concern:

- :mod:`drgym.index.faiss_build`: loading faiss, building and training a shard's FAISS
  index (:func:`~drgym.index.faiss_build.write_dense_shard`,
  :func:`~drgym.index.faiss_build.write_trained`), GPU placement options;
- :mod:`drgym.index.rows`: the memory-mapped float16 embedding files;
- :mod:`drgym.index.ranking`: coarse assignment, exact scores, tie ranks, the merge of
  the shards' candidates;
- :mod:`drgym.index.search_params`: the one rule for search parameters
  (:func:`~drgym.index.search_params.search_params_for`).

On a machine where faiss sees GPUs, shards are moved to the GPU for search (HNSW stays on
CPU: faiss has no GPU HNSW): by default each shard is copied whole onto every GPU;
``gpu_shard=True`` splits its rows across the GPUs and ``gpu_float16=True`` stores them
in float16, as Search-R1 serves wiki-18
(:func:`~drgym.index.faiss_build.gpu_cloner_options`).

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
import threading
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.faiss_build import flat_storage, gpu_cloner_options, gpus_available, is_lossy, last_line, load_faiss
from drgym.index.manifest import ShardInfo, corrupt_file_error
from drgym.index.ranking import (
    TIE_MARGIN,
    coarse_assign,
    exact_scores,
    group_assign,
    load_tie_rank,
    merge_shard_results,
)
from drgym.index.rows import advise_random
from drgym.index.search_params import (
    DEFAULT_SEARCH_PARAMS,
    DRGYM_PARAMS,
    PROBE_GROUPS_KEY,
    RERANK_KEY,
    rerank_depth,
    search_params_for,
)

log = logging.getLogger(__name__)

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


SMALL_BATCH = 20
"""Below this many queries FAISS searches them one by one (its non-BLAS path), where an
OpenMP team only adds a barrier: on a busy 2-core machine a single-query Flat search over
wiki-default took 24 ms p50 with 2 OpenMP threads and 0.95 ms with 1, so small batches
run with one thread (the setting is per calling thread and restored afterwards)."""


def _search_on_threads(index, q: np.ndarray, k: int, threads: int = 1, assign=None):
    """``index.search(q, k)`` on ``threads`` OpenMP threads (the setting is the calling
    thread's, restored afterwards); with ``assign`` (:func:`coarse_assign`'s ``(D, I)``),
    ``index.search_preassigned``."""
    faiss = load_faiss()
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
        faiss = load_faiss()
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
                raise corrupt_file_error(fp, f"is unreadable (FAISS: {last_line(e)})", self.folder) from e
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
        shards. Shards cloned from one trained index (:func:`~drgym.index.faiss_build.write_trained`) share theirs,
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
        faiss = load_faiss()
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
        faiss = load_faiss()
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
        faiss = load_faiss()
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
            raise corrupt_file_error(fp, f"is unreadable: FAISS search failed ({last_line(e)})", self.folder) from e
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
