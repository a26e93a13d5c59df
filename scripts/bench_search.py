"""Benchmark the search engine on wiki-default and write the figures as JSON.

    python scripts/bench_search.py --out bench_search.json [--quick] [--no-http]
    python scripts/bench_search.py --recall-only --out scripts/results/bench_search_recall.json

Measures, on the machine it runs on:

* build: live encoding speed (passages/s on a sample of real passages) and the total
  wall time of building the wiki-default index from the shipped embedding cache;
* latency of single queries (p50/p99, ms): end to end (``engine.search(q, 10)``:
  encode + search + docstore) per method, and search only (FAISS / BM25 given the
  query vector or text);
* ANN recall@10 of HNSW32 (efSearch 16..128) against exact Flat search;
* retrieval quality over wiki-default for dense, BM25 and hybrid on the HotpotQA and
  MuSiQue questions of HippoRAG (shipped as ``drgym/data/tasks/hipporag_*_train.json``):
  supporting-paragraph recall@5, recall@10 and nDCG@10 (binary gains, Järvelin &
  Kekäläinen 2002, "Cumulated gain-based evaluation of IR techniques", TOIS 20(4), §2.2),
  both with results collapsed to documents (the default: k distinct documents) and as
  the k best passages; plus how many real questions (hotpotqa-dev and drb-en) get the
  same URL twice in their top 10;
* HTTP throughput and errors at 1, 16 and 64 concurrent clients against
  ``drgym serve`` on a free loopback port (each level runs for a fixed time, result
  cache off so every request is searched).

All medians and ratios come from this one run. ``--recall-only`` measures only the
retrieval quality and repeated URLs, on the wiki-default index under ``$DRGYM_HOME``
(built when missing), in about 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = REPO / "drgym" / "data" / "tasks"  # HippoRAG's HotpotQA and MuSiQue questions (shipped)
COLLAPSES = ("passage", "document")


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


# -- questions and their supporting paragraphs --------------------------------------------


def load_questions(n_max: int | None) -> dict[str, list[dict]]:
    """HotpotQA and MuSiQue questions with supporting paragraphs as (title, text) keys."""
    out: dict[str, list[dict]] = {}
    hp = QUESTIONS / "hipporag_hotpotqa_train.json"
    if hp.exists():
        qs = []
        for r in json.loads(hp.read_text()):
            ctx = {t: "".join(s) for t, s in r["context"]}
            titles = {t for t, _ in r["supporting_facts"]}
            qs.append({"question": r["question"], "support": {(norm(t), norm(ctx[t])) for t in titles if t in ctx}})
        out["hotpotqa"] = qs[:n_max]
    mu = QUESTIONS / "hipporag_musique_train.json"
    if mu.exists():
        qs = []
        for r in json.loads(mu.read_text()):
            sup = {(norm(p["title"]), norm(p["paragraph_text"])) for p in r["paragraphs"] if p["is_supporting"]}
            qs.append({"question": r["question"], "support": sup})
        out["musique"] = qs[:n_max]
    return out


def quality(engine, questions: list[dict], method: str, doc_key, collapse: str) -> dict[str, float]:
    """Mean supporting-paragraph recall@5, recall@10 and nDCG@10 of one method, with results
    collapsed to documents (``collapse="document"``) or as passages (a supporting paragraph
    found twice counts once, and its second passage gains nothing)."""
    r5, r10, nd = [], [], []
    batch = [q["question"] for q in questions]
    results = []
    for i in range(0, len(batch), 32):
        results.extend(engine.search_batch(batch[i : i + 32], 10, method=method, collapse=collapse))
    for q, res in zip(questions, results):
        sup = q["support"]
        if not sup:
            continue
        found, gains = set(), []
        for r in res:
            key = doc_key(r)
            g = 1.0 if key in sup and key not in found else 0.0
            found.add(key) if g else None
            gains.append(g)
        hit5 = {doc_key(r) for r in res[:5]} & sup
        r5.append(len(hit5) / len(sup))
        r10.append(len(found) / len(sup))
        dcg = sum(g / np.log2(i + 2) for i, g in enumerate(gains))
        idcg = sum(1 / np.log2(i + 2) for i in range(min(len(sup), 10)))
        nd.append(dcg / idcg)
    return {"recall@5": round(float(np.mean(r5)), 4), "recall@10": round(float(np.mean(r10)), 4),
            "ndcg@10": round(float(np.mean(nd)), 4), "n_questions": len(r5)}


# -- retrieval quality, passages vs documents -----------------------------------------------


def norm_doc_key(engine):
    """Supporting-paragraph identity of a hit: its parent document's (title, text), normalised."""
    cache: dict[str, tuple[str, str]] = {}

    def doc_key(r):
        pid = r.metadata["parent_doc_id"]
        if pid not in cache:
            d = engine.get(pid)
            cache[pid] = (norm(d.title), norm(d.text))
        return cache[pid]

    return doc_key


def repeated_urls(engine, k: int = 10) -> dict:
    """Questions whose top-k holds a URL twice, per collapse mode, over the real questions of
    hotpotqa-dev (79) and drb-en (40) with the engine's method."""
    from drgym.envs.task_loaders import load_tasks

    qs = [t.question for name in ("hotpotqa-dev", "drb-en") for t in load_tasks(name)]
    out = {"questions": len(qs), "k": k, "method": engine.method}
    for collapse in COLLAPSES:
        res = engine.search_batch(qs, k, collapse=collapse)
        out[collapse] = {"questions_with_a_repeated_url": sum(len({h.url for h in r}) < len(r) for r in res),
                         "min_results": min(len(r) for r in res)}
    return out


def retrieval(engine, qsets: dict[str, list[dict]]) -> dict:
    """Recall@5/@10 and nDCG@10 per question set, method and collapse mode, plus repeated URLs."""
    doc_key = norm_doc_key(engine)
    qual: dict = {}
    for collapse in COLLAPSES:
        q: dict = {name: {method: quality(engine, qs, method, doc_key, collapse) for method in ("dense", "bm25", "hybrid")}
                   for name, qs in qsets.items()}
        if q:
            best = {m: float(np.mean([q[n][m]["recall@10"] for n in qsets])) for m in ("dense", "bm25", "hybrid")}
            q["mean_recall@10"] = {k: round(v, 4) for k, v in best.items()}
            q["best_method_by_recall@10"] = max(best, key=best.get)
        qual[collapse] = q
    qual["repeated_urls_top10"] = repeated_urls(engine)
    return qual


def recall_only(args) -> None:
    """``--recall-only``: retrieval quality both ways on the (cached) wiki-default index."""
    from drgym.atomic import atomic_write_json
    from drgym.search.local import LocalSearchEngine

    out: dict = {"command": " ".join(["python", "scripts/bench_search.py", *sys.argv[1:]]),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()]}
    kw = {"root": args.root} if args.root else {}
    engine = LocalSearchEngine.from_corpus("wiki-default", method="hybrid", **kw)
    out["index"] = repr(engine)
    qsets = load_questions(None)
    out["queries"] = {k: len(v) for k, v in qsets.items()}
    out["retrieval"] = retrieval(engine, qsets)
    engine.close()
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(args.out, out)
    print(json.dumps(out["retrieval"], indent=1), file=sys.stderr)
    print(args.out)


# -- HTTP load ------------------------------------------------------------------------------


def http_load(url: str, queries: list[str], clients: int, seconds: float) -> dict:
    """``clients`` threads each sending GET /search back to back for ``seconds``.

    Each thread keeps one ``http.client`` keep-alive connection: on a 2-core machine the
    load generator shares the CPU with the server, and http.client costs it far less per
    request than an httpx client. A request counts as done when it answers 200 with a
    non-empty ``results`` list (checked on the raw body, not a full JSON parse).
    """
    import http.client
    from urllib.parse import urlencode, urlsplit

    host = urlsplit(url)
    done, errors, lat = [0], [0], []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds
    start = threading.Barrier(clients + 1)

    def worker(w: int) -> None:
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
        i = w
        start.wait()
        try:
            while time.perf_counter() < stop_at:
                q = queries[i % len(queries)]
                i += clients
                t = time.perf_counter()
                try:
                    conn.request("GET", "/search?" + urlencode({"query": q, "k": 10}))
                    r = conn.getresponse()
                    body = r.read()
                    ok = r.status == 200 and b'"results":["' in body
                except Exception:  # noqa: BLE001 - every failure counts as an error
                    ok = False
                    conn.close()
                    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
                dt = time.perf_counter() - t
                with lock:
                    if ok:
                        done[0] += 1
                        lat.append(dt)
                    else:
                        errors[0] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"clients": clients, "seconds": round(elapsed, 2), "requests": done[0], "errors": errors[0],
            "throughput_rps": round(done[0] / elapsed, 1),
            "latency_p50_ms": round(pct(lat, 50) * 1e3, 1) if lat else None,
            "latency_p99_ms": round(pct(lat, 99) * 1e3, 1) if lat else None}


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_search.json", help="JSON output file.")
    ap.add_argument("--root", default=None, help="Index root (default: a fresh temporary folder).")
    ap.add_argument("--quick", action="store_true", help="Fewer queries and shorter HTTP runs.")
    ap.add_argument("--no-http", action="store_true", help="Skip the HTTP concurrency part.")
    ap.add_argument("--http-seconds", type=float, default=10.0, help="Seconds per concurrency level.")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and FAISS threads in this process and the server (default: their defaults).")
    ap.add_argument("--recall-only", action="store_true",
                    help="Only retrieval quality (passages vs documents) and repeated URLs, on the cached index.")
    args = ap.parse_args()
    if args.recall_only:
        recall_only(args)
        return
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the server subprocess

    import faiss
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)

    from drgym.atomic import atomic_write_json
    from drgym.corpus import load_named_corpus, split_documents
    from drgym.corpus.chunking import default_max_tokens
    from drgym.index.build import IndexSpec, build_index, get_encoder
    from drgym.search.local import LocalSearchEngine

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="drgym-bench-"))
    out: dict = {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "faiss_omp_threads": faiss.omp_get_max_threads(),
                    "platform": platform.platform(), "python": sys.version.split()[0], "gpu": torch.cuda.is_available()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    n_lat = 100 if args.quick else 300
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731

    # ---- build --------------------------------------------------------------------------
    t = time.perf_counter()
    enc = get_encoder("all-MiniLM-L6-v2", None)
    load_encoder_s = time.perf_counter() - t
    docs = load_named_corpus("wiki-default")
    passages = split_documents(docs, enc.tokenizer, max_tokens=default_max_tokens(enc.max_length), overlap=32)
    sample = [p.embed_text for p in passages[:: max(1, len(passages) // 256)][:256]]
    enc.encode_passages(sample[:16])  # warm-up
    t = time.perf_counter()
    enc.encode_passages(sample)
    live = len(sample) / (time.perf_counter() - t)
    t = time.perf_counter()
    flat = build_index(IndexSpec(corpus="wiki-default"), root=root, encoder=enc, force=True)
    build_s = time.perf_counter() - t
    out["build"] = {"passages": flat.manifest.n_passages, "documents": flat.manifest.n_documents,
                    "live_encoding_passages_per_s": round(live, 1), "live_sample": len(sample),
                    "estimated_live_build_s": round(flat.manifest.n_passages / live, 0),
                    "cached_build_total_s": round(build_s, 2), "encoder_load_s": round(load_encoder_s, 2),
                    "stages_s": flat.manifest.timings, "cached_build_passages_per_s": round(flat.manifest.n_passages / build_s, 0)}
    log("build", out["build"])
    t = time.perf_counter()
    hnsw = build_index(IndexSpec(corpus="wiki-default", factory="HNSW32", bm25=False), root=root, encoder=enc, force=True)
    out["build"]["hnsw32_build_total_s"] = round(time.perf_counter() - t, 2)

    engine = LocalSearchEngine(flat.folder, encoder=enc)
    hnsw_engine = LocalSearchEngine(hnsw.folder, encoder=enc, method="dense")

    # ---- queries ------------------------------------------------------------------------
    qsets = load_questions(None)
    questions = [q["question"] for qs in qsets.values() for q in qs]
    rng = np.random.default_rng(0)
    titled = [d for d in docs if d.title]
    extra = [f"Tell me about {titled[i].title}" for i in rng.choice(len(titled), 1000, replace=False)]
    lat_queries = (questions + extra)[:n_lat]
    out["queries"] = {"questions": {k: len(v) for k, v in qsets.items()}, "latency_queries": len(lat_queries),
                      "recall_queries": len(questions) + len(extra)}

    # ---- latency ------------------------------------------------------------------------
    lat: dict = {}
    for q in lat_queries[:20]:
        engine.search(q, 10)  # warm-up
    for method in ("dense", "bm25", "hybrid"):
        ts = []
        for q in lat_queries:
            t = time.perf_counter()
            engine.search_batch([q], 10, method=method)
            ts.append(time.perf_counter() - t)
        lat[f"end_to_end_{method}"] = {"p50_ms": round(pct(ts, 50) * 1e3, 2), "p99_ms": round(pct(ts, 99) * 1e3, 2)}
    qv = engine.encode_queries(lat_queries)
    sh = engine._shared
    for name, idx in (("flat", sh.dense), ("hnsw32_ef64", hnsw_engine._shared.dense)):
        ts = []
        for i in range(len(lat_queries)):
            t = time.perf_counter()
            idx.search(qv[i : i + 1], 10)
            ts.append(time.perf_counter() - t)
        lat[f"search_only_dense_{name}"] = {"p50_ms": round(pct(ts, 50) * 1e3, 3), "p99_ms": round(pct(ts, 99) * 1e3, 3)}
    ts = []
    for q in lat_queries:
        t = time.perf_counter()
        sh.bm25.search([q], 10, sh.tie_rank)
        ts.append(time.perf_counter() - t)
    lat["search_only_bm25"] = {"p50_ms": round(pct(ts, 50) * 1e3, 3), "p99_ms": round(pct(ts, 99) * 1e3, 3)}
    ts = []
    for q in lat_queries:
        t = time.perf_counter()
        engine.encode_queries([q])
        ts.append(time.perf_counter() - t)
    lat["encode_query_only"] = {"p50_ms": round(pct(ts, 50) * 1e3, 2), "p99_ms": round(pct(ts, 99) * 1e3, 2)}
    t = time.perf_counter()
    for i in range(0, len(lat_queries), 64):
        engine.search_batch(lat_queries[i : i + 64], 10)
    lat["batched_64_hybrid_queries_per_s"] = round(len(lat_queries) / (time.perf_counter() - t), 1)
    out["latency"] = lat
    log("latency", lat)

    # ---- ANN recall ---------------------------------------------------------------------
    rq = questions + extra
    qv = np.concatenate([engine.encode_queries(rq[i : i + 256]) for i in range(0, len(rq), 256)])
    _, exact = sh.dense.search(qv, 10)
    ann = {}
    from drgym.index.dense import DenseIndex

    m = hnsw.manifest
    for ef in (16, 32, 64, 128):
        idx = DenseIndex(hnsw.folder, m.shards, m.dim, m.n_passages, search_params={"efSearch": ef})
        _, rows = idx.search(qv, 10)
        ann[f"efSearch={ef}"] = round(float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, rows)])), 4)
    out["ann_recall@10_hnsw32_vs_flat"] = ann
    log("ann", ann)

    # ---- retrieval quality ---------------------------------------------------------------
    out["retrieval"] = retrieval(engine, qsets)
    log("retrieval", out["retrieval"])
    engine.close()
    hnsw_engine.close()

    # ---- HTTP ---------------------------------------------------------------------------
    if not args.no_http:
        try:
            from drgym.server.testing import running_server
        except ImportError:
            out["http"] = {"skipped": "drgym.server is not available"}
        else:
            secs = 4.0 if args.quick else args.http_seconds
            qpool = questions + extra
            with running_server(cli_args=["--index-dir", str(flat.folder), "--cache-size", "0"]) as srv:
                http_load(srv.url, qpool, 4, 2.0)  # warm-up
                levels = [http_load(srv.url, qpool, c, secs) for c in (1, 16, 64)]
            base = levels[0]["throughput_rps"] or float("nan")
            for lv in levels:
                lv["speedup_vs_1_client"] = round(lv["throughput_rps"] / base, 2)
            out["http"] = {"endpoint": "GET /search?k=10 (cache off)", "levels": levels}
            log("http", out["http"])

    # ---- targets ------------------------------------------------------------------------
    tg = {"end_to_end_p50_ms<=20": lat[f"end_to_end_{engine.method}"]["p50_ms"] <= 20,
          "ann_recall@10>=0.98 (efSearch=64)": ann["efSearch=64"] >= 0.98}
    if "levels" in out.get("http", {}):
        lv64 = out["http"]["levels"][-1]
        tg["64_clients_0_errors"] = lv64["errors"] == 0
        tg["64_clients>=4x_single"] = lv64["speedup_vs_1_client"] >= 4
    out["targets_met"] = tg
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(args.out, out)
    log(json.dumps(out["targets_met"]))
    print(args.out)


if __name__ == "__main__":
    main()
