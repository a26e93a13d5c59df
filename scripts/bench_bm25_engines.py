"""BM25 engines side by side: bm25s (in memory) and SQLite FTS5 (on disk), same tokens.

The bm25s index is built twice, in memory (bm25s's own build) and streaming (drgym's
build for an index too large for memory), whose rankings must be the same. For each
corpus, each engine builds its index in a fresh process (build seconds, peak
resident memory of that process, index bytes on disk), then both answer the same queries
in this process (one query at a time, one thread: median latency) and their top-10 lists
are compared: overlap@10 (shared passages / 10, over the queries where both return 10)
and top-1 agreement. Corpora:

- ``wiki-default``: the default corpus (real Wikipedia text), queried with the first 300
  questions of ``hotpotqa-dev`` and ``nq-open``;
- ``synthetic``: N passages of 100 words drawn from a Zipf(1.1) vocabulary of 50,000
  pseudo-words (as ``scripts/bench_scale.py``), queried with 4 words of 300 random passages.

    python scripts/bench_bm25_engines.py --out scripts/results/bench_bm25_engines.json
    python scripts/bench_bm25_engines.py --synthetic 100000 --out ...   # the default size
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SEED = 20261202
N_QUERIES = 300


def synthetic_texts(n: int, seed: int = SEED) -> list[str]:
    """``n`` passages of 100 Zipf(1.1) pseudo-words (vocabulary 50,000), deterministic."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, size=L)) for L in rng.integers(3, 11, 50_000)])
    p = 1.0 / np.arange(1, 50_001) ** 1.1
    p /= p.sum()
    return [" ".join(words[rng.choice(50_000, size=100, p=p)]) for _ in range(n)]


def corpus(name: str, n_synthetic: int) -> tuple[list[str], list[str]]:
    """(passage texts in row order, queries) of a corpus."""
    if name == "synthetic":
        texts = synthetic_texts(n_synthetic)
        rng = np.random.default_rng(SEED + 1)
        queries = [" ".join(rng.choice(texts[i].split(), size=4, replace=False))
                   for i in rng.choice(len(texts), size=N_QUERIES, replace=False)]
        return texts, queries
    from drgym.envs.task_loaders import load_tasks
    from drgym.search.local import LocalSearchEngine

    import sqlite3

    from drgym.docstore import PASSAGE_TEXT

    engine = LocalSearchEngine.from_corpus("wiki-default", method="dense", device="cpu")
    con = sqlite3.connect(f"file:{engine.folder / 'docs.sqlite'}?mode=ro", uri=True)
    texts = [(f"{a}\n{b}" if a else b) for a, b in con.execute(
        f"SELECT d.title, {PASSAGE_TEXT} FROM passages p JOIN documents d ON d.doc_id = p.doc_id ORDER BY p.row")]
    con.close()
    queries = [t.question for t in load_tasks("hotpotqa-dev")[: N_QUERIES // 2]]
    queries += [t.question for t in load_tasks("nq-open")[: N_QUERIES - len(queries)]]
    return texts, queries


_BUILD = r"""
import json, sys, time
from pathlib import Path
engine, folder, texts_file = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
texts = (line.rstrip("\n").replace("\\n", "\n") for line in open(texts_file, encoding="utf-8"))
from drgym.index.fts5 import write_fts5
from drgym.index.bm25 import write_bm25
import psutil
before = psutil.Process().memory_info().rss / 2**20  # after the imports: what the build adds is the peak minus this
t = time.perf_counter()
if engine == "fts5":
    settings = write_fts5(folder, texts)
else:
    settings = write_bm25(folder, texts, streaming=(engine == "bm25s-streaming"))
secs = time.perf_counter() - t
# VmHWM: this process's peak resident memory (ru_maxrss would carry the parent's peak across exec)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"seconds": round(secs, 2), "rss_before_mb": round(before, 1), "peak_rss_mb": round(hwm, 1),
                  "settings": settings}))
"""


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench(name: str, n_synthetic: int, work: Path) -> dict:
    from drgym.index.bm25 import BM25Index
    from drgym.index.fts5 import FTS5BM25Index

    texts, queries = corpus(name, n_synthetic)
    texts_file = work / f"{name}.txt"
    texts_file.write_text("".join(t.replace("\n", "\\n") + "\n" for t in texts), encoding="utf-8")
    res: dict = {"passages": len(texts), "queries": len(queries), "engines": {}}
    tie = np.arange(len(texts), dtype=np.int64)
    ranked = {}
    for engine in ("bm25s", "bm25s-streaming", "fts5"):
        folder = work / f"{name}-{engine}"
        folder.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", _BUILD, engine, str(folder), str(texts_file)], capture_output=True,
                             text=True, check=True, env=env)
        built = json.loads(out.stdout.strip().splitlines()[-1])
        idx = (FTS5BM25Index if engine == "fts5" else BM25Index)(folder, len(texts), built["settings"]["tokenizer"])
        idx.search(queries[:5], 10, tie)  # warm the page cache and code paths
        lat, lists = [], []
        for q in queries:
            t = time.perf_counter()
            [(_, rows)] = idx.search([q], 10, tie)
            lat.append(time.perf_counter() - t)
            lists.append(rows.tolist())
        ranked[engine] = lists
        res["engines"][engine] = {"build_s": built["seconds"], "build_peak_rss_mb": built["peak_rss_mb"],
                                  "build_rss_added_mb": round(built["peak_rss_mb"] - built["rss_before_mb"], 1),
                                  "index_bytes": du(folder), "query_p50_ms": round(1000 * statistics.median(lat), 3),
                                  "query_p90_ms": round(1000 * float(np.percentile(lat, 90)), 3)}
        shutil.rmtree(folder)
    res["streaming_same_rankings_as_bm25s"] = ranked["bm25s-streaming"] == ranked["bm25s"]
    full = [(a, b) for a, b in zip(ranked["bm25s"], ranked["fts5"]) if len(a) == 10 and len(b) == 10]
    overlaps = [len(set(a) & set(b)) / 10 for a, b in full]
    res["agreement"] = {"queries_with_10_hits": len(full),
                        "overlap_at_10_mean": round(float(np.mean(overlaps)), 4) if overlaps else None,
                        "overlap_at_10_min": round(float(np.min(overlaps)), 4) if overlaps else None,
                        "top1_same": round(float(np.mean([a[0] == b[0] for a, b in full])), 4) if full else None,
                        "same_hit_count": round(float(np.mean([len(a) == len(b) for a, b in
                                                               zip(ranked["bm25s"], ranked["fts5"])])), 4)}
    texts_file.unlink()
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthetic", type=int, default=100_000, help="passages of the synthetic corpus (default 100,000)")
    ap.add_argument("--corpora", default="wiki-default,synthetic")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    info = {"benchmark": "bm25_engines", "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_1_5_15_at_start": list(os.getloadavg()),
            "cpu_count": os.cpu_count(), "corpora": {}}
    with tempfile.TemporaryDirectory(prefix="drgym-bm25-bench-") as tmp:
        for name in a.corpora.split(","):
            info["corpora"][name] = bench(name, a.synthetic, Path(tmp))
            print(name, json.dumps(info["corpora"][name]), flush=True)
    info["load_avg_1_5_15_at_end"] = list(os.getloadavg())
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
