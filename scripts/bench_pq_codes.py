"""8-bit PQ against 4-bit fast-scan PQ for drgym's IVF-PQ shards, side by side in one run.

    OMP_NUM_THREADS=1 python scripts/bench_pq_codes.py --out scripts/results/bench_pq_codes.json

N synthetic unit vectors (default 10^6, 384-d; the topic mixture fitted to drgym's
shipped MiniLM vectors that ``scripts/bench_scale.py`` uses, same seed and recipe, kept
in float16 as drgym's embedding shards are), 200 queries and their exact top-10. For
each factory (``IVF{nlist},PQ48`` and ``IVF{nlist},PQ48x4fs``, nlist as
:func:`drgym.index.build.ivfpq_factory` picks it): build time, index bytes, and over a
grid of nprobe x re-rank depth the single-query latency (p50, ms, one FAISS thread)
and recall@10 after the exact re-rank that :class:`drgym.index.dense.DenseIndex` does
(candidates re-scored with the float16 rows). Written to JSON with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DIM, K, N_QUERIES, SEED = 384, 10, 200, 0


def vectors(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(passages float16 (n, 384), queries float32 (200, 384))``: bench_scale's vector
    model (:func:`bench_scale.topic_mixture`), drawn in the same order as its gen stage."""
    from bench_scale import topic_mixture  # scripts/ is on sys.path when a script runs

    draw = topic_mixture(n, np.random.default_rng(SEED))
    q = draw(N_QUERIES).astype(np.float32)
    x = np.concatenate([draw(min(100_000, n - s)) for s in range(0, n, 100_000)])
    return x, q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--rerank", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--out", type=Path, default=REPO / "scripts/results/bench_pq_codes.json")
    a = ap.parse_args()
    import faiss

    from drgym.atomic import atomic_write_json
    from drgym.index.build import ivfpq_factory
    from drgym.index.faiss_build import build_faiss
    from drgym.index.ranking import exact_scores

    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    x, q = vectors(a.n)
    flat = faiss.IndexFlatIP(DIM)
    flat.add(x.astype(np.float32))
    _, truth = flat.search(q, K)
    del flat
    fast = ivfpq_factory(a.n, DIM)
    factories = [fast.replace("x4fs", ""), fast]
    res: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "started": started, "n": a.n, "dim": DIM,
                 "queries": N_QUERIES, "k": K,
                 "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "faiss": faiss.__version__,
                             "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                 "factories": {}}
    for factory in factories:
        t = time.perf_counter()
        index = build_faiss(x, factory)
        build_s = time.perf_counter() - t
        path = a.out.with_suffix(".tmp.index")
        faiss.write_index(index, str(path))
        size = path.stat().st_size
        path.unlink()
        ivf = faiss.extract_index_ivf(index)
        rows = {}
        for nprobe in a.nprobe:
            ivf.nprobe = nprobe
            for rerank in a.rerank:
                lat, hits = [], []
                for i in range(N_QUERIES):
                    t = time.perf_counter()
                    _, cand = index.search(q[i : i + 1], rerank)
                    scores = exact_scores(x, q[i : i + 1], cand)
                    order = np.argsort(-scores[0], kind="stable")[:K]
                    top = cand[0][order]
                    lat.append((time.perf_counter() - t) * 1000)
                    hits.append(len(set(top.tolist()) & set(truth[i].tolist())) / K)
                rows[f"nprobe {nprobe} rerank {rerank}"] = {
                    "nprobe": nprobe, "rerank": rerank, "single_ms_p50": round(float(np.median(lat)), 3),
                    "single_ms_p90": round(float(np.percentile(lat, 90)), 3), "recall@10": round(float(np.mean(hits)), 4)}
                print(factory, nprobe, rerank, rows[f"nprobe {nprobe} rerank {rerank}"], flush=True)
        res["factories"][factory] = {"build_s": round(build_s, 1), "index_bytes": size,
                                     "bytes_per_vector": round(size / a.n, 1), "search": rows,
                                     "load_avg": [round(v, 2) for v in os.getloadavg()]}
        del index
        atomic_write_json(a.out, res)
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    atomic_write_json(a.out, res)


if __name__ == "__main__":
    main()
