"""The ``nprobe`` an IVF index records for itself, checked on held-out queries.

For one ``bench_scale.py`` work folder and FAISS layout (an ``alt-*`` folder its dense
stage leaves with ``--keep``): runs :func:`drgym.index.calibrate.calibrate_nprobe` (the
index's own rows as queries, the step a build runs), then times the work folder's 200
held-out queries one at a time through :class:`drgym.index.dense.DenseIndex` at the
calibrated ``nprobe`` and at :func:`drgym.index.search_params.auto_nprobe`'s quarter of the lists,
in turns query by query (the order alternating between passes), and measures recall@10
of both against the queries' exact top 10. Writes JSON. Run it with
``OMP_NUM_THREADS=1``, as ``bench_scale.py``'s search stages::

    OMP_NUM_THREADS=1 python scripts/bench_calibrate.py --work WORK/n21015324 \\
        --factory IVF2048,PQ48x4fs --repeat 3 --out scripts/results/bench_calibrate_wiki18.json
"""

from __future__ import annotations

import json
import os

import numpy as np

def main() -> None:
    from bench_scale import (add_run, alt_folder, finish_record, median_ratio, side_by_side_parser, side_by_side_record,
                             time_in_turns, turn_stats)

    from drgym.index.calibrate import calibrate_nprobe
    from drgym.index.dense import DenseIndex
    from drgym.index.search_params import auto_nprobe
    from drgym.index.manifest import IndexManifest

    ap = side_by_side_parser(__doc__)
    ap.add_argument("--factory", required=True, help="the alt layout (bench_scale factory label)")
    ap.add_argument("--target", type=float, default=0.95)
    a = ap.parse_args()
    m = IndexManifest.read(a.work / "indexes" / "bench")
    folder = alt_folder(a.work, a.factory)
    q = np.load(a.work / "queries.npy").astype(np.float32)
    truth = np.load(a.work / "truth.npy")
    load0 = os.getloadavg()[0]
    cal = calibrate_nprobe(folder, m.shards, m.dim, m.n_passages, target=a.target)
    if cal is None:
        raise SystemExit(f"{folder} is not an IVF layout with float16 rows")
    print(json.dumps(cal), flush=True)
    settings = {"calibrated": cal["search_params"]["nprobe"], "quarter": auto_nprobe(cal["nlist"])}
    res = side_by_side_record(n_passages=m.n_passages, shards=len(m.shards), factory=a.factory, queries=len(q), k=10,
                              calibration=cal, calibration_load_avg_1min=round(load0, 2), runs=[])
    for repeat in range(a.repeat):
        idx = {name: DenseIndex(folder, m.shards, m.dim, m.n_passages, device="cpu", mmap=True,
                                search_params={"nprobe": p}) for name, p in settings.items()}
        times, rows, loads = time_in_turns(idx, q, a.passes)
        run = {"repeat": repeat, "load_avg_1min": [round(x, 2) for x in loads], "settings": {}}
        for name in settings:
            run["settings"][name] = {"nprobe": settings[name], **turn_stats(times[name], rows[name], truth),
                                     "ratio_to_quarter_p50": median_ratio(times[name], times["quarter"])}
            idx[name].close()
        add_run(res, run)
    finish_record(res, a.out)


if __name__ == "__main__":
    main()
