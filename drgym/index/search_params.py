"""Search parameters of dense shards: the one rule every dense search applies.

:func:`search_params_for` fits :data:`DEFAULT_SEARCH_PARAMS` (and the changes asked for)
to one FAISS index: ``efSearch`` for HNSW, ``nprobe`` for IVF (:func:`auto_nprobe` when
the index has no measured one), and drgym's own parameters, which FAISS never sees
(:data:`DRGYM_PARAMS`): ``rerank``, the candidates re-scored exactly, split between the
shards by :func:`rerank_depth`, and ``probe_groups`` (:data:`PROBE_GROUPS_KEY`). The
library's :class:`~drgym.search.local.LocalSearchEngine`, ``drgym serve`` and the shard
servers of ``drgym serve-ray`` all load their shards through
:class:`~drgym.index.dense.DenseIndex`, which applies this rule, so the three rank alike.
"""

from __future__ import annotations

import numpy as np

from drgym.errors import ConfigError
from drgym.index.faiss_build import load_faiss
from drgym.index.ranking import TIE_MARGIN

DEFAULT_SEARCH_PARAMS: dict[str, int] = {"efSearch": 64, "nprobe": 0, "rerank": 100, "probe_groups": 4}
"""Search-time parameters, applied when the index has them. HNSW ``efSearch=64`` gives
ANN recall@10 of 0.997 against exact search on wiki-default (scripts/bench_search.py).
IVF ``nprobe=0`` means the index's own: the ``nprobe`` its build measured
(:func:`drgym.index.calibrate.calibrate_nprobe`, passed by
:meth:`DenseIndex.from_manifest <drgym.index.dense.DenseIndex.from_manifest>`), else
:func:`auto_nprobe` (a quarter of the lists, at least 16); a number fixes it. ``rerank``
(drgym's, not FAISS's): shards whose codes are lossy (PQ, scalar quantizers) return
this many candidates per query in all, split between the shards by their rows
(:func:`rerank_depth`), which are re-scored exactly with the shards' float16 embeddings
(memory-mapped, so RAM holds only the codes); the scores are then the same inner
products a ``Flat`` index gives. 0 turns it off. Measured on synthetic 384-d vectors by
scripts/bench_scale.py (docs/benchmarks/scale.md): at 10^6 vectors with
IVF1024,PQ48x4fs (``auto``), recall@10 is 0.63 with the 4-bit codes' own scores and
0.97 with the re-rank, both at the default nprobe 256. ``probe_groups`` (drgym's): see
:data:`PROBE_GROUPS_KEY`."""


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
server), fewer where a group would scan under :data:`~drgym.index.dense.PROBE_GROUP_MIN_CODES` codes, and a
power of two (so that 2, 4, 8... cores share them evenly), dealt
round-robin by rank (group ``g`` of ``G`` holds the lists ranked ``g, g + G, ...``,
:func:`~drgym.index.ranking.group_assign`), and searches each group as its own call: the shard is then searched
like ``G`` shards that each hold a share of the probed lists (each returns its share of
the re-rank, re-scored exactly, and :func:`~drgym.index.ranking.merge_shard_results` merges them), but every
list is scanned once, where ``G`` shards of the rows would each scan every probed list (a
fast-scan search pays per list and shard). The split depends on the manifest and the
search parameters only, not on the machine's cores, so rankings are the same on every
machine, alone and in any batch. It costs CPU: at wiki-18 size in one shard, one query
took 0.69-0.96x the time in 2 groups on 2 cores, on 1.1-1.3x the CPU time
(scripts/bench_probe_groups.py, docs/benchmarks/scale.md). 1 turns it off (for a server
whose cores are all busy with other queries), as do shards without that shared
assignment (HNSW, Flat, OPQ, GPU)."""


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
    faiss = load_faiss()
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
