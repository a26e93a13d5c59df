"""Cold-cache search with and without ``MADV_RANDOM`` on the memory-mapped embeddings.

drgym's exact re-rank reads a few hundred scattered float16 rows a query from the
memory-mapped embedding shards. Without ``madvise(MADV_RANDOM)``
(:func:`drgym.index.rows.advise_random`), Linux reads the disk's read-ahead window around
each faulting page. This script empties the page cache (``sync``, then
``/proc/sys/vm/drop_caches``: it needs root), loads one layout of a ``bench_scale.py``
work folder in a fresh process through :class:`drgym.index.dense.DenseIndex` with the
advice given or withheld, and times the work folder's 200 queries one at a time from that cold start, then
once more warm. It records the bytes the process read from storage
(``/proc/self/io`` ``read_bytes``) and recall@10. The two modes alternate between runs.
Run it with ``OMP_NUM_THREADS=1`` as the other search benchmarks::

    OMP_NUM_THREADS=1 python scripts/bench_madvise.py --work WORK/n21015324 \\
        --factory IVF2048,PQ48x4fs --nprobe 448 --runs 2 --out scripts/results/bench_madvise_wiki18.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

def read_bytes() -> int:
    """Bytes this process has read from storage (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes line")


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def main() -> None:
    from bench_scale import alt_folder, finish_record, side_by_side_parser, side_by_side_record

    import drgym.index.dense as dense_mod
    from drgym.index.manifest import IndexManifest

    ap = side_by_side_parser(__doc__, timing=False)
    ap.add_argument("--factory", required=True, help="the alt layout (bench_scale factory label)")
    ap.add_argument("--nprobe", type=int, required=True)
    ap.add_argument("--runs", type=int, default=2, help="runs of both modes (order alternating)")
    ap.add_argument("--one", choices=["random", "default"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    m = IndexManifest.read(a.work / "indexes" / "bench")
    q = np.load(a.work / "queries.npy").astype(np.float32)
    truth = np.load(a.work / "truth.npy")
    real = dense_mod.advise_random
    res = side_by_side_record(n_passages=m.n_passages, shards=len(m.shards), factory=a.factory, nprobe=a.nprobe,
                              queries=len(q), k=10, runs=[])
    res["machine"]["mem_total_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    if a.one:  # one cold start in this fresh process (the caches were emptied before it started)
        dense_mod.advise_random = real if a.one == "random" else (lambda arr: False)
        before = read_bytes()
        idx = dense_mod.DenseIndex(alt_folder(a.work, a.factory), m.shards, m.dim, m.n_passages, device="cpu",
                                   mmap=True, search_params={"nprobe": a.nprobe})
        out = {"mode": a.one, "load_read_mb": round((read_bytes() - before) / 2**20, 1)}
        for phase in ("cold", "warm"):
            t, rows = [], []
            b0 = read_bytes()
            for i in range(len(q)):
                s = time.perf_counter()
                rows.append(idx.search(q[i:i + 1], 10)[1][0])
                t.append((time.perf_counter() - s) * 1000)
            t = np.asarray(t)
            out[phase] = {"single_ms_p50": round(float(np.median(t)), 3),
                          "single_ms_p99": round(float(np.percentile(t, 99)), 3),
                          "single_ms_mean": round(float(t.mean()), 3),
                          "read_mb": round((read_bytes() - b0) / 2**20, 1),
                          "recall@10": round(float(np.mean([len(set(r.tolist()) & set(g.tolist())) / 10
                                                            for r, g in zip(rows, truth)])), 4)}
        out["load_avg_1min"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out), flush=True)
        return
    for run in range(a.runs):
        for mode in (("random", "default") if run % 2 == 0 else ("default", "random")):
            drop_caches()  # and a fresh process: no page of an earlier run stays mapped
            p = subprocess.run([sys.executable, __file__, "--work", str(a.work), "--factory", a.factory, "--nprobe",
                                str(a.nprobe), "--out", str(a.out), "--one", mode], capture_output=True, text=True,
                               check=True)
            out = {"run": run, **json.loads(p.stdout.strip().splitlines()[-1])}
            res["runs"].append(out)
            print(json.dumps(out), flush=True)
    finish_record(res, a.out)


if __name__ == "__main__":
    main()
