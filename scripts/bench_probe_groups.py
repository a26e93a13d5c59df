"""One query on an IVF index of few shards, searched as several jobs (``probe_groups``).

For one ``bench_scale.py`` work folder: loads FAISS layouts of the same rows (``alt-*``
folders its dense stage leaves with ``--keep``; a label ``...+s<rows>`` has its own shard
size, e.g. the whole of wiki-18 in one shard) through :class:`drgym.index.dense.DenseIndex`
at each ``nprobe`` given, once per ``probe_groups`` value (:data:`drgym.index.search_params.PROBE_GROUPS_KEY`),
and times the work folder's 200 held-out queries one at a time, every setting in turns
query by query (the order alternating between passes), with wall and process CPU time
per query, and recall@10 against the queries' exact top 10. ``--min-codes 0`` splits a
query however few codes a group scans (:data:`drgym.index.dense.PROBE_GROUP_MIN_CODES`),
to measure that minimum. With ``--calibrate LABEL ...`` it also runs
:func:`drgym.index.calibrate.calibrate_nprobe` on those layouts at the default
``probe_groups`` (the step a build runs) and times each at its ``nprobe`` in every
``--groups`` value too. Writes JSON. Run it with ``OMP_NUM_THREADS=1``, as
``bench_scale.py``'s search stages::

    OMP_NUM_THREADS=1 python scripts/bench_probe_groups.py --work WORK/n21015324 \\
        --layouts IVF2048,PQ48x4fs IVF2048,PQ48x4fs+s21015324 --groups 1 2 4 8 \\
        --nprobe 448 --out scripts/results/bench_probe_groups_wiki18.json
"""

from __future__ import annotations

import json
import os

import numpy as np

def main() -> None:
    from bench_scale import (add_run, alt_folder, alt_shards, finish_record, median_ratio, side_by_side_parser,
                             side_by_side_record, time_in_turns, turn_stats)

    import drgym.index.dense as dense_mod
    from drgym.index.calibrate import calibrate_nprobe
    from drgym.index.dense import DenseIndex
    from drgym.index.search_params import DEFAULT_SEARCH_PARAMS, PROBE_GROUPS_KEY
    from drgym.index.manifest import IndexManifest

    ap = side_by_side_parser(__doc__)
    ap.add_argument("--layouts", nargs="+", required=True, help="alt layouts (bench_scale factory labels)")
    ap.add_argument("--groups", nargs="+", type=int, default=[1, 2, 4, 8], help="probe_groups values")
    ap.add_argument("--nprobe", type=int, nargs="*", default=[], help="nprobe values (every layout at each)")
    ap.add_argument("--min-codes", type=int, default=None,
                    help="set drgym.index.dense.PROBE_GROUP_MIN_CODES (0: split however few codes a group scans)")
    ap.add_argument("--calibrate", nargs="*", default=[],
                    help="layouts to calibrate (at the default probe_groups), then time at their nprobe and each --groups")
    ap.add_argument("--target", type=float, default=0.95)
    a = ap.parse_args()
    if a.min_codes is not None:
        dense_mod.PROBE_GROUP_MIN_CODES = a.min_codes
    m = IndexManifest.read(a.work / "indexes" / "bench")
    q = np.load(a.work / "queries.npy").astype(np.float32)
    truth = np.load(a.work / "truth.npy")
    settings = {f"{lay} G{g} nprobe {p}": (lay, g, p) for lay in a.layouts for p in a.nprobe for g in a.groups}
    res = side_by_side_record(n_passages=m.n_passages, queries=len(q), k=10, nprobe=a.nprobe,
                              default_probe_groups=DEFAULT_SEARCH_PARAMS[PROBE_GROUPS_KEY],
                              min_codes=dense_mod.PROBE_GROUP_MIN_CODES,
                              layouts={lay: {"shards": len(alt_shards(a.work, lay))}
                                       for lay in dict.fromkeys([*a.layouts, *a.calibrate])},
                              calibrations={}, runs=[])
    for lay in a.calibrate:
        load0 = os.getloadavg()[0]
        cal = calibrate_nprobe(alt_folder(a.work, lay), alt_shards(a.work, lay), m.dim, m.n_passages, target=a.target)
        if cal is None:
            raise SystemExit(f"{lay} is not an IVF layout with float16 rows")
        cal["load_avg_1min"] = round(load0, 2)
        res["calibrations"][lay] = cal
        print(json.dumps(cal), flush=True)
        for g in a.groups:
            settings[f"{lay} G{g} calibrated"] = (lay, g, cal["search_params"]["nprobe"])
    if not settings:
        raise SystemExit("nothing to time: give --nprobe or --calibrate")
    for repeat in range(a.repeat):
        idx = {name: DenseIndex(alt_folder(a.work, lay), alt_shards(a.work, lay), m.dim, m.n_passages, device="cpu",
                                mmap=True, search_params={"nprobe": p, PROBE_GROUPS_KEY: g})
               for name, (lay, g, p) in settings.items()}
        cpu: dict = {}
        times, rows, loads = time_in_turns(idx, q, a.passes, cpu_ms=cpu)
        first = next(iter(settings))
        fewest = min(a.groups)
        base = {(lay, p): name for name, (lay, g, p) in settings.items() if g == fewest}
        run = {"repeat": repeat, "load_avg_1min": [round(x, 2) for x in loads], "settings": {}}
        for name, (lay, g, p) in settings.items():
            t = times[name]
            run["settings"][name] = {"layout": lay, "probe_groups": g, "nprobe": p,
                                     "jobs_per_query": sum(idx[name]._groups(i) for i in range(len(idx[name].shards))),
                                     "shard_workers": idx[name].shard_workers, **turn_stats(t, rows[name], truth),
                                     "cpu_ms_p50": round(float(np.median(cpu[name])), 3),
                                     "ratio_to_first_p50": median_ratio(t, times[first]),
                                     # to the fewest groups at the same layout and nprobe
                                     "ratio_to_fewest_groups_p50": median_ratio(t, times[base.get((lay, p), first)])}
            idx[name].close()
        add_run(res, run)
    finish_record(res, a.out)


if __name__ == "__main__":
    main()
