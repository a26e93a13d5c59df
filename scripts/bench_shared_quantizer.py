"""Side by side: IVF shards that share one trained quantizer against shards trained alone.

Loads two (or more) alternative FAISS layouts of one ``bench_scale.py`` work folder (the
``alt-*`` folders its dense stage leaves with ``--keep``, e.g. ``IVF2048,PQ48x4fs`` and
``IVF2048,PQ48x4fs+own``; a suffix ``@N`` loads the same folder with FAISS's fast-scan
``implem`` N instead of its default 0), and times one query at a time through
:class:`drgym.index.dense.DenseIndex` with each, alternating the layouts query by query
and the order between passes, so that both see the same machine state. Writes medians,
p99, the median of the per-query ratios and recall@10 against the exact top 10 of the
work folder. Run it with ``OMP_NUM_THREADS=1`` (one FAISS thread a shard, shards side by
side on the shard threads), as ``bench_scale.py``'s search stages do::

    OMP_NUM_THREADS=1 python scripts/bench_shared_quantizer.py --work WORK/n21015324 \\
        --factories IVF2048,PQ48x4fs+own IVF2048,PQ48x4fs --nprobe 384 512 --repeat 3 \\
        --out scripts/results/bench_shared_quantizer_wiki18.json
"""

from __future__ import annotations


import numpy as np

def main() -> None:
    from bench_scale import (add_run, alt_folder, finish_record, median_ratio, side_by_side_parser, side_by_side_record,
                             time_in_turns, turn_stats)

    import faiss

    from drgym.index.dense import DenseIndex
    from drgym.index.manifest import IndexManifest

    ap = side_by_side_parser(__doc__)
    ap.add_argument("--factories", nargs="+", required=True, help="alt layouts to compare (bench_scale factory labels)")
    ap.add_argument("--nprobe", type=int, nargs="+", default=[384, 512])
    ap.add_argument("--rerank", type=int, default=100)
    a = ap.parse_args()
    m = IndexManifest.read(a.work / "indexes" / "bench")
    q = np.load(a.work / "queries.npy")
    truth = np.load(a.work / "truth.npy")
    res = side_by_side_record(n_passages=m.n_passages, shards=len(m.shards), queries=len(q), k=10, runs=[])
    for repeat, nprobe in [(r, p) for r in range(a.repeat) for p in a.nprobe]:
        idx = {f: DenseIndex(alt_folder(a.work, f.split("@")[0]),
                             m.shards, m.dim, m.n_passages, device="cpu", mmap=True,
                             search_params={"nprobe": nprobe, "rerank": a.rerank}) for f in a.factories}
        for f in a.factories:
            if "@" in f:  # another FAISS fast-scan implementation than its default (0, chosen by batch)
                for index in idx[f]._indexes:
                    faiss.downcast_index(index).implem = int(f.split("@")[1])
        times, rows, loads = time_in_turns(idx, q, a.passes)
        base = a.factories[0]
        run = {"repeat": repeat, "nprobe": nprobe, "rerank": a.rerank, "load_avg_1min": [round(x, 2) for x in loads], "layouts": {}}
        for f in a.factories:
            run["layouts"][f] = {"coarse_searches": idx[f].coarse_searches, **turn_stats(times[f], rows[f], truth),
                                 "ratio_to_first_p50": median_ratio(times[f], times[base])}
            idx[f].close()
        add_run(res, run)
    finish_record(res, a.out)


if __name__ == "__main__":
    main()
