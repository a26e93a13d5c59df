"""Private memory of loading a FAISS index read into memory against memory-mapped
(``drgym serve --mmap``: ``faiss.IO_FLAG_MMAP_IFC``), per index kind.

    python scripts/bench_mmap.py --out scripts/results/bench_mmap.json

Each index is written to a temporary folder, then loaded in a fresh process both ways;
the figure is the growth of that process's ``RssAnon`` (private, anonymous memory, in
/proc/self/status) across ``read_index`` and one search, and the check that both ways
return the same top 10. Indexes: ``IVF256,PQ16`` over 2x10^6 and ``HNSW16`` over 10^5
random 64-d vectors (seeded), and ``Flat`` over 10^5 384-d vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = r"""
import json, sys
import faiss, numpy as np

def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

path, how, dim = sys.argv[1], sys.argv[2], int(sys.argv[3])
flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if how == "mmap" else 0
before = anon_kib()
index = faiss.read_index(path, flags)
if hasattr(index, "nprobe"):
    index.nprobe = 16
q = np.random.default_rng(0).standard_normal((5, dim)).astype("float32")
_, rows = index.search(q, 10)
print(json.dumps({"anon_growth_mib": round((anon_kib() - before) / 1024, 1), "rows": rows.tolist()}))
"""

KINDS = [("IVF256,PQ16", 64, 2_000_000), ("HNSW16", 64, 100_000), ("Flat", 384, 100_000)]


def build(factory: str, dim: int, n: int, path: Path) -> None:
    import faiss
    import numpy as np

    rng = np.random.default_rng(1)
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(rng.standard_normal((20_000, dim)).astype("float32"))
    for start in range(0, n, 200_000):
        index.add(rng.standard_normal((min(200_000, n - start), dim)).astype("float32"))
    faiss.write_index(index, str(path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_mmap.json")
    a = ap.parse_args()
    import faiss

    out = {"command": "python scripts/bench_mmap.py " + " ".join(sys.argv[1:]), "faiss": faiss.__version__,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "indexes": []}
    with tempfile.TemporaryDirectory(prefix="drgym-mmap-") as tmp:
        for factory, dim, n in KINDS:
            path = Path(tmp) / "index.faiss"
            build(factory, dim, n, path)
            row = {"factory": factory, "dim": dim, "n": n, "file_mib": round(os.path.getsize(path) / 2**20, 1)}
            results = {}
            for how in ("read", "mmap"):
                proc = subprocess.run([sys.executable, "-c", PROBE, str(path), how, str(dim)], capture_output=True,
                                      text=True, check=True, timeout=600)
                results[how] = json.loads(proc.stdout.strip().splitlines()[-1])
                row[f"{how}_anon_growth_mib"] = results[how]["anon_growth_mib"]
            row["same_top10"] = results["read"]["rows"] == results["mmap"]["rows"]
            out["indexes"].append(row)
            print(json.dumps(row), flush=True)
    from drgym.atomic import atomic_write_json

    atomic_write_json(a.out, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
