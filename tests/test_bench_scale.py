"""scripts/bench_scale.py end to end at a tiny size (slow: about two minutes on 2 cores):
every stage runs in its own process and the JSON holds real figures, BM25 and hybrid
included; the README renderers (table, sizing) read it. Also its layouts of their own
shard size, and scripts/bench_probe_groups.py over them (a few seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_scale_tiny_run_has_dense_bm25_and_hybrid_rows(tmp_path):
    out = tmp_path / "scale.json"
    subprocess.run([sys.executable, str(REPO / "scripts/bench_scale.py"), "--sizes", "20000", "--hnsw-max", "0",
                    "--bm25-max", "20000", "--gzip-above", "10000", "--budget", "1", "--work", str(tmp_path / "work"), "--out", str(out)],
                   check=True, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                                    "HOME": str(tmp_path)})
    res = json.loads(out.read_text())
    r = res["sizes"]["20000"]
    assert [k for k in ("gen", "import", "bm25") if "error" in r[k]] == []  # a stage that raised is recorded, not fatal
    assert r["gen"]["topics"] == 625 and r["gen"]["median_nn_cosine"] > 0.5
    assert r["gen"]["corpus_file"] == "corpus.jsonl.gz"  # above --gzip-above; the import reads it in spans
    assert not [k for k, v in r["search"].items() if "error" in v]
    assert r["dense"]["IVF-PQ"]["factory"] == "IVF256,PQ48x4fs"
    assert r["search"]["Flat"]["recall@10"] == 1.0
    assert r["search"]["IVF-PQ"]["recall@10"] >= 0.9  # the default nprobe (64 of 256) with the exact re-rank
    assert r["search"]["IVF-PQ rerank 0"]["recall@10"] < r["search"]["IVF-PQ"]["recall@10"]
    # question-like queries: real questions' distance profile (NQ-open dev on wiki-default: 0.499 / 0.355)
    qs = r["gen"]["questions"]
    assert abs(qs["median_nn_cosine"] - 0.499) < 0.03 and abs(qs["median_10th_cosine"] - 0.355) < 0.03
    assert r["search"]["Flat"]["questions"]["recall@10"] == 1.0 and r["search"]["Flat"]["questions"]["recall_queries"] == 200
    assert r["search"]["IVF-PQ"]["questions"]["recall@10"] < r["search"]["IVF-PQ"]["recall@10"]  # farther, spread out
    assert r["bm25"]["pairs"] > 20000 and r["bm25"]["peak_private_mb"] > 0
    assert r["search"]["BM25"]["mean_hits"] == 10  # 4-word queries from the corpus vocabulary
    hyb = r["search"]["hybrid (IVF-PQ + BM25)"]
    assert 0 < hyb["dense_top10_in_hybrid"] < 10  # fused: part dense, part BM25
    assert "hybrid (Flat + BM25)" in r["search"]  # Flat is what auto picks at this size
    from envs_helpers import load_script

    bench_scale = load_script("bench_scale")

    assert "IVF256,PQ48x4fs" in bench_scale.table(res)
    sizing = bench_scale.sizing(res)
    assert "BM25 files, disk GB" in sizing and "wiki-18" in sizing


@pytest.mark.slow
def test_bench_scale_ivf_import_is_searched_without_a_second_build(tmp_path):
    """Above --flat-max the import builds IVF-PQ; the dense stage takes those files (and the
    import's FAISS time) instead of building the same index again, and they search as built."""
    out = tmp_path / "scale.json"
    subprocess.run([sys.executable, str(REPO / "scripts/bench_scale.py"), "--sizes", "20000", "--hnsw-max", "0",
                    "--bm25-max", "0", "--flat-max", "10000", "--budget", "1", "--work", str(tmp_path / "work"),
                    "--out", str(out)],
                   check=True, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                                    "HOME": str(tmp_path)})
    r = json.loads(out.read_text())["sizes"]["20000"]
    assert r["import"]["factory"] == "IVF256,PQ48x4fs"
    dense = r["dense"]["IVF-PQ"]
    assert dense["built_by"] == "import" and dense["seconds"] == r["import"]["timings"]["faiss"]
    assert dense["index_bytes"] > 0 and dense["peak_rss_mb"] == r["import"]["peak_rss_mb"]
    assert "Flat" not in r["dense"]  # no Flat file above --flat-max
    assert r["search"]["IVF-PQ"]["recall@10"] >= 0.9  # exact top 10 from the gen stage


def test_a_layout_of_its_own_shard_size_and_the_probe_groups_benchmark(tmp_path):
    """``IVF64,PQ48x4fs+s20000`` cuts the 2 import shards' rows into one shard of its own
    (its own float16 rows, a copy of the 2-shard layout's trained index, so both probe the
    same lists; a second layout of that shard size links those rows), and
    scripts/bench_probe_groups.py times both layouts: one FAISS call a shard, or the one
    shard split in 4, at the same recall."""
    import numpy as np

    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    work = tmp_path / "work"

    def stage(*args):
        p = subprocess.run([sys.executable, str(REPO / "scripts/bench_scale.py"), "_stage", *args], check=True,
                           capture_output=True, text=True, env=env)
        return json.loads(p.stdout.strip().splitlines()[-1])

    stage("gen", "20000", str(work))
    assert stage("import", "20000", str(work), "10000", "Flat")["shards"] == 2
    two, one = "IVF64,PQ48x4fs", "IVF64,PQ48x4fs+s20000"
    assert len(stage("dense", str(work), two)["seconds_per_shard"]) == 2
    built = stage("dense", str(work), one)
    assert built["seconds_per_shard"] and len(built["seconds_per_shard"]) == 1
    assert built["trained_from"] == "indexes/alt-IVF64_PQ48x4fs/dense/trained.index"
    alt = work / "indexes" / "alt-IVF64_PQ48x4fs+s20000"
    shards = json.loads((alt / "shards.json").read_text())
    assert [(s["start"], s["count"]) for s in shards] == [(0, 20000)]
    rows = np.load(alt / shards[0]["embeddings"], mmap_mode="r")
    first = np.load(work / "indexes" / "bench" / "dense" / "emb-00001.npy", mmap_mode="r")
    assert not (alt / shards[0]["embeddings"]).is_symlink() and np.array_equal(rows[10000:], first)
    other = stage("dense", str(work), "IVF32,PQ48x4fs+s20000")  # the same rows: linked, not copied again
    assert other["embeddings_linked"] == ["indexes/alt-IVF64_PQ48x4fs+s20000/dense/emb-00000.npy"]
    assert other["trained_from"] is None and other["index_bytes"] > 0
    out = tmp_path / "groups.json"
    subprocess.run([sys.executable, str(REPO / "scripts/bench_probe_groups.py"), "--work", str(work), "--layouts", two,
                    one, "--groups", "1", "4", "--nprobe", "16", "--min-codes", "0", "--passes", "1", "--out",
                    str(out)], check=True, capture_output=True, text=True, env=env)
    res = json.loads(out.read_text())
    st = res["runs"][0]["settings"]
    assert res["layouts"] == {two: {"shards": 2}, one: {"shards": 1}} and res["min_codes"] == 0
    assert [st[f"{one} G{g} nprobe 16"]["jobs_per_query"] for g in (1, 4)] == [1, 4]
    assert [st[f"{two} G{g} nprobe 16"]["jobs_per_query"] for g in (1, 4)] == [2, 4]  # ceil(4 / 2) a shard
    assert all(s["recall@10"] >= 0.5 and s["n"] == 200 and s["cpu_ms_p50"] > 0 for s in st.values())
