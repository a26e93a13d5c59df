"""Which query encoder drgym uses by default: torch float32, ONNX float32 or ONNX int8,
measured on the questions the project ships, with paired bootstrap intervals.

    nice -n 5 python scripts/bench_encoder_choice.py --out scripts/results/bench_encoder_choice.json

On the wiki-default index (built under ``$DRGYM_HOME`` when missing; its passage vectors
are torch float32 whatever the query encoder), for each query encoder backend
(``torch``, ``onnx``, ``onnx-int8``, all on the CPU) and each method (``dense``, ``hybrid``):

* **qrels**: recall@10 and nDCG@10 at document level on the HippoRAG qrels shipped in
  ``drgym/data/tasks/hipporag_qrels.txt`` (159 queries; what ``drgym search eval``
  computes, through :func:`drgym.evaluation.retrieval.run_engine` and ``score_run``);
* **answer recall@k** (k = 1, 5, 10, 20): the share of questions with a gold answer in
  the text of one of the top k passages (SQuAD normalisation, whole words), on the
  shipped NQ-open dev questions (``nq-open``, 200), HotpotQA and MuSiQue dev questions
  (``hotpotqa-dev``, ``musique-dev``; yes/no answers left out), and with ``--nq-full``
  NQ-open's whole dev set (``nq-open-full``, 2,819; shared data, not shipped; about ten
  times the run time);
* **agreement** with torch: top-10 passage overlap, top-1 agreement and identical lists
  over the same questions.

Each figure of ``onnx`` and ``onnx-int8`` is compared with torch's on the same queries: the
mean per-query difference and its 95% paired bootstrap interval (``--boot`` resamples of the
queries, seed 0). A backend **ties** torch when, for every measure, the interval holds 0 and
its lower end is above ``-margin`` (``--margin``, default 0.02). The decision (``decision``)
is ``onnx-int8`` when it ties, else ``onnx`` when it ties, else ``torch``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]

BACKENDS = ("torch", "onnx", "onnx-int8")
METHODS = ("dense", "hybrid")
KS = (1, 5, 10, 20)
ANSWER_SETS = ("nq-open", "hotpotqa-dev", "musique-dev")
TASKS = REPO / "drgym" / "data" / "tasks"


def has_answer(texts: list[str], golds: list[str]) -> list[bool]:
    """For each prefix length i, whether a gold alias occurs as whole words in ``texts[:i+1]``
    (SQuAD normalisation of both). Returns one bool per text (cumulative)."""
    from drgym.rewards.qa import normalize_answer

    g = [f" {normalize_answer(a)} " for a in golds if normalize_answer(a)]
    out, hit = [], False
    for t in texts:
        if not hit:
            nt = f" {normalize_answer(t)} "
            hit = any(a in nt for a in g)
        out.append(hit)
    return out


def answer_questions(names: tuple[str, ...] = ANSWER_SETS) -> dict[str, list[tuple[str, list[str]]]]:
    """``{set: [(question, answers)]}`` of the task sets ``names`` (with answers that can
    occur in a passage: yes/no left out)."""
    from drgym.envs import load_tasks
    from drgym.rewards.qa import YES_NO_NOANSWER, normalize_answer

    out: dict[str, list[tuple[str, list[str]]]] = {}
    for name in names:
        tasks = load_tasks(name)
        rows = [(t.question, list(t.answers)) for t in tasks
                if t.answers and not all(normalize_answer(a) in YES_NO_NOANSWER for a in t.answers)]
        out[name] = rows
    return out


def bootstrap(diff: np.ndarray, boot: int, seed: int = 0) -> dict:
    """Mean of paired per-query differences and its 95% percentile bootstrap interval."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(boot, len(diff)))
    means = diff[idx].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": round(float(diff.mean()), 4), "ci95": [round(float(lo), 4), round(float(hi), 4)],
            "queries_changed": int((diff != 0).sum()), "queries": int(len(diff))}


def main() -> None:
    from bench_search import _overlap

    from drgym.atomic import atomic_write_json
    from drgym.evaluation.retrieval import read_qrels, read_queries, run_engine, score_run
    from drgym.search.local import LocalSearchEngine

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--boot", type=int, default=10_000, help="bootstrap resamples")
    ap.add_argument("--margin", type=float, default=0.02, help="largest loss a tie may hold in its interval")
    ap.add_argument("--root", default=None, help="index root (default: $DRGYM_HOME/indexes)")
    ap.add_argument("--nq-full", action="store_true", help="add NQ-open's whole dev set (shared data) to answer recall")
    a = ap.parse_args()

    t0 = time.time()
    rec: dict = {"command": " ".join(["python", "scripts/bench_encoder_choice.py", *sys.argv[1:]]),
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
                 "boot": a.boot, "margin": a.margin}
    qrels = read_qrels(TASKS / "hipporag_qrels.txt")
    queries = read_queries(TASKS / "hipporag_queries.tsv")
    qids = sorted(qrels)
    sets = answer_questions(ANSWER_SETS + (("nq-open-full",) if a.nq_full else ()))
    rec["answer_sets"] = {k: len(v) for k, v in sets.items()}
    kw = {"root": a.root} if a.root else {}

    per: dict = {}  # per[backend][method] = {"qrels": {measure: array}, "answer": {set: {k: array}}, "ids": {set: lists}}
    for backend in BACKENDS:
        engine = LocalSearchEngine.from_corpus("wiki-default", method="hybrid", device="cpu", encoder_backend=backend, **kw)
        rec.setdefault("index", repr(engine))
        if backend == "onnx-int8":
            import onnxruntime

            rec["onnx_int8"] = {"file": engine.encoder._onnx.path.name, "onnxruntime": onnxruntime.__version__,
                                "file_mb": round(engine.encoder._onnx.path.stat().st_size / 2**20, 1)}
        per[backend] = {}
        for method in METHODS:
            scored = score_run(qrels, run_engine(engine, queries, method=method, k=10))["per_query"]
            entry = {"qrels": {m: np.array([scored[q][m] for q in qids]) for m in ("recall@10", "ndcg@10")},
                     "answer": {}, "ids": {}}
            for name, rows in sets.items():
                qs = [q for q, _ in rows]
                res = []
                for i in range(0, len(qs), 32):
                    res.extend(engine.search_batch(qs[i:i + 32], max(KS), method=method, collapse="passage"))
                hits = [has_answer([r.text for r in rr], golds) for rr, (_, golds) in zip(res, rows)]
                entry["answer"][name] = {k: np.array([float(h[min(k, len(h)) - 1]) if h else 0.0 for h in hits])
                                         for k in KS}
                entry["ids"][name] = [[r.doc_id for r in rr[:10]] for rr in res]
            per[backend][method] = entry
            print(f"{backend} {method}: {time.time() - t0:.0f} s", file=sys.stderr)
        engine.close()

    out: dict = {}
    for backend in BACKENDS:
        b: dict = {}
        for method in METHODS:
            e, ref = per[backend][method], per["torch"][method]
            m: dict = {"qrels": {k: round(float(v.mean()), 4) for k, v in e["qrels"].items()},
                       "answer_recall": {s: {f"@{k}": round(float(v.mean()), 4) for k, v in d.items()}
                                         for s, d in e["answer"].items()}}
            all_ids = [x for s in sets for x in e["ids"][s]]
            all_ref = [x for s in sets for x in ref["ids"][s]]
            if backend != "torch":
                m["agreement_with_torch"] = _overlap(all_ref, all_ids) | {"questions": len(all_ids)}
                m["difference_to_torch"] = {
                    "qrels": {k: bootstrap(e["qrels"][k] - ref["qrels"][k], a.boot) for k in e["qrels"]},
                    "answer_recall_all_sets": {
                        f"@{k}": bootstrap(np.concatenate([e["answer"][s][k] for s in sets])
                                           - np.concatenate([ref["answer"][s][k] for s in sets]), a.boot)
                        for k in KS}}
            b[method] = m
        out[backend] = b
    rec["by_backend"] = out

    def ties(backend: str) -> bool:
        for method in METHODS:
            d = out[backend][method]["difference_to_torch"]
            for cell in [*d["qrels"].values(), *d["answer_recall_all_sets"].values()]:
                lo, hi = cell["ci95"]
                if not (lo <= 0 <= hi and lo >= -a.margin):
                    return False
        return True

    rec["ties_torch"] = {b: ties(b) for b in BACKENDS if b != "torch"}
    rec["decision"] = next((b for b in ("onnx-int8", "onnx") if rec["ties_torch"][b]), "torch")
    rec["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rec["seconds"] = round(time.time() - t0, 1)
    rec["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(a.out, rec)
    print(f"decision: {rec['decision']} (ties: {rec['ties_torch']}); {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
