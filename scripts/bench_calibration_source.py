"""How far an IVF index's neighbours sit from real questions and from its own rows, and the
nprobe each set of calibration queries gives, on wiki-default built as IVF-PQ.

    nice -n 5 python scripts/bench_calibration_source.py --out scripts/results/bench_calibration_source.json

Builds wiki-default (21,126 passages, from the shipped embedding cache) with the IVF-PQ
layout that ``auto`` gives a shard of that size (:func:`drgym.index.build.ivfpq_factory`:
``IVF256,PQ48x4fs``) into ``--work`` (a temporary folder by default), as a user's build
would: calibrated, and its manifest's ``calibration`` (with its ``source``) is recorded.
Then, for each set of queries (the index's own rows, left out of their own top 10, as
``source: rows``; the shipped HippoRAG questions; the shipped NQ-open questions; both, as
``source: shipped-questions``), encoded by the default query encoder:

* the median cosine of each query's exact top-1 and 10th neighbour;
* the recall@10 curve over the nprobe grid of :func:`drgym.index.calibrate.nprobe_grid`
  (:func:`drgym.index.calibrate.calibrate_nprobe` with target 1, so every nprobe is tried),
  and recall@10 at a quarter of the lists;
* the nprobe each set would record at the default target (0.95 with 95% confidence).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

def main() -> None:
    from drgym.atomic import atomic_write_json
    from drgym.index.build import IndexSpec, build_index, get_encoder, ivfpq_factory
    from drgym.index.calibrate import TARGET_RECALL, calibrate_nprobe, exact_neighbours, shipped_questions
    from drgym.index.manifest import IndexManifest

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--work", type=Path, default=None, help="index root (default: a temporary folder, removed)")
    a = ap.parse_args()

    t0 = time.time()
    rec: dict = {"command": " ".join(["python", "scripts/bench_calibration_source.py", *sys.argv[1:]]),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    tmp = None
    root = a.work
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-calibration-source-")
        root = Path(tmp.name)
    try:
        enc = get_encoder("all-MiniLM-L6-v2", "cpu")
        factory = ivfpq_factory(21_126, enc.dim)
        res = build_index(IndexSpec(corpus="wiki-default", factory=factory, name="wiki-default-ivfpq"), root=root,
                          encoder=enc)
        m = IndexManifest.read(res.folder)
        rec.update(factory=factory, n_passages=m.n_passages, query_encoder_backend=enc.backend,
                   build_calibration={k: v for k, v in m.calibration.items() if k != "curve"})
        emb = np.concatenate([np.load(res.folder / s.embeddings).astype(np.float32) for s in m.shards])
        qs = shipped_questions()
        sets = {"rows": None, "hipporag": enc.encode_queries(qs[200:]), "nq-open": enc.encode_queries(qs[:200]),
                "shipped-questions": enc.encode_queries(qs)}
        out: dict = {}
        for name, q in sets.items():
            kw = {} if q is None else {"query_vectors": q}
            curve = calibrate_nprobe(res.folder, m.shards, m.dim, m.n_passages, target=1.0, **kw)
            chosen = calibrate_nprobe(res.folder, m.shards, m.dim, m.n_passages, target=TARGET_RECALL, **kw)
            if q is None:  # the drawn rows, each left out of its own neighbours (as calibrate does)
                rows = np.sort(np.random.default_rng(0).choice(m.n_passages, curve["queries"], replace=False))
                qv, top = emb[rows], exact_neighbours([emb], emb[rows], 11)
                top = np.array([[x for x in r if x != me][:10] for r, me in zip(top.tolist(), rows.tolist())])
            else:
                qv, top = q, exact_neighbours([emb], q, 10)
            cos = np.einsum("qd,qkd->qk", qv, emb[top])
            quarter = next(p for p in curve["curve"] if p["nprobe"] == m.calibration["nlist"] // 4)
            out[name] = {"queries": curve["queries"], "top1_cosine_median": round(float(np.median(cos[:, 0])), 3),
                         "tenth_cosine_median": round(float(np.median(cos[:, 9])), 3),
                         "recall_at_quarter": quarter["recall"], "curve": curve["curve"],
                         "nprobe_at_target": chosen["search_params"]["nprobe"], "recall_at_target": chosen["recall"],
                         "reached": chosen["reached"]}
            print(name, {k: v for k, v in out[name].items() if k != "curve"}, file=sys.stderr)
        rec["by_queries"] = out
    finally:
        if tmp is not None:
            tmp.cleanup()
    rec["target_recall"] = TARGET_RECALL
    rec["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rec["seconds"] = round(time.time() - t0, 1)
    rec["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(a.out, rec)
    print(a.out)


if __name__ == "__main__":
    main()
