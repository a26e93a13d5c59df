"""Retrieval evaluation (drgym.evaluation.retrieval): TREC files, ir-measures scores by hand,
the shipped HippoRAG qrels, and evidence recall in rollout metrics."""

from __future__ import annotations

import math

import pytest

from drgym.errors import ConfigError, CorpusError
from drgym.evaluation import retrieval as R

# Three judged queries and one unjudged, scored by hand:
#
# q1: relevant d1, d2 (rel 1). Run: d3, d1, d4, d2.
#     recall@5 = recall@10 = recall@100 = 2/2 = 1.
#     MRR@10 = 1/2 (first relevant at rank 2).
#     DCG@10 = 1/log2(3) + 1/log2(5) = 0.630930 + 0.430677 = 1.061606
#     IDCG@10 = 1/log2(2) + 1/log2(3) = 1.630930  ->  nDCG@10 = 0.650921
# q2: d5 rel 2, d6 rel 1, d7 rel 0 (judged, not relevant). Run: d5 d7 d8 d9 d10 d6.
#     recall@5 = 1/2 (d6 is 6th); recall@10 = recall@100 = 1.  MRR@10 = 1.
#     gains are the grades (trec_eval ndcg_cut): DCG@10 = 2/log2(2) + 1/log2(7) = 2.356207
#     IDCG@10 = 2/log2(2) + 1/log2(3) = 2.630930  ->  nDCG@10 = 0.895580
# q3: relevant d11; the run has no line for q3: every measure 0 (and it stays in the mean).
# q4: in the run, not in the qrels: not scored, counted as unjudged.
#
# overall: recall@5 = (1 + .5 + 0)/3 = .5; recall@10 = recall@100 = 2/3;
#          MRR@10 = (.5 + 1 + 0)/3 = .5; nDCG@10 = (.650921 + .895580 + 0)/3 = .515500
QRELS = "q1 0 d1 1\nq1 0 d2 1\nq2 0 d5 2\nq2 0 d6 1\nq2 0 d7 0\nq3 0 d11 1\n"
RUN = {
    "q1": [("d3", 4.0), ("d1", 3.0), ("d4", 2.0), ("d2", 1.0)],
    "q2": [("d5", 6.0), ("d7", 5.0), ("d8", 4.0), ("d9", 3.0), ("d10", 2.0), ("d6", 1.0)],
    "q4": [("d1", 1.0)],
}


def test_scores_match_hand_computed_values(tmp_path):
    (tmp_path / "qrels.txt").write_text(QRELS)
    R.write_run(tmp_path / "run.trec", RUN, tag="hand")
    assert (tmp_path / "run.trec").read_text().splitlines()[1] == "q1 Q0 d1 2 3.000000 hand"
    res = R.score_run(R.read_qrels(tmp_path / "qrels.txt"), R.read_run(tmp_path / "run.trec"))
    pq = res["per_query"]
    ndcg1 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    ndcg2 = (2 + 1 / math.log2(7)) / (2 + 1 / math.log2(3))
    assert ndcg1 == pytest.approx(0.650921, abs=1e-6) and ndcg2 == pytest.approx(0.895580, abs=1e-6)
    assert pq["q1"] == pytest.approx({"recall@5": 1.0, "recall@10": 1.0, "recall@100": 1.0, "ndcg@10": ndcg1, "mrr@10": 0.5})
    assert pq["q2"] == pytest.approx({"recall@5": 0.5, "recall@10": 1.0, "recall@100": 1.0, "ndcg@10": ndcg2, "mrr@10": 1.0})
    assert pq["q3"] == {"recall@5": 0.0, "recall@10": 0.0, "recall@100": 0.0, "ndcg@10": 0.0, "mrr@10": 0.0}
    assert res["overall"] == pytest.approx({"recall@5": 0.5, "recall@10": 2 / 3, "recall@100": 2 / 3,
                                            "ndcg@10": (ndcg1 + ndcg2) / 3, "mrr@10": 0.5})
    assert res["overall"]["ndcg@10"] == pytest.approx(0.515500, abs=1e-6)
    assert res["judged_queries"] == 3 and res["unanswered_queries"] == ["q3"] and res["unjudged_queries"] == 1


def test_bad_files_are_named(tmp_path):
    p = tmp_path / "q.txt"
    p.write_text("q1 0 d1 1\nq1 d2 1\n")
    with pytest.raises(CorpusError, match=r"q.txt:2: a qrels line is 'qid 0 docid rel' \(4 fields\), got 3"):
        R.read_qrels(p)
    p.write_text("q1 0 d1 yes\n")
    with pytest.raises(CorpusError, match="relevance must be an integer"):
        R.read_qrels(p)
    t = tmp_path / "queries.tsv"
    t.write_text("a\tfirst\nb second\n")
    with pytest.raises(CorpusError, match=r"queries.tsv:2: a TSV query line is 'qid<TAB>query'"):
        R.read_queries(t)
    j = tmp_path / "queries.jsonl"
    j.write_text('{"qid": "a", "query": "x"}\n{"qid": 2, "query": "y"}\n')
    assert R.read_queries(j) == {"a": "x", "2": "y"}
    j.write_text('{"id": "a", "query": "x"}\n')
    with pytest.raises(CorpusError, match=r"queries.jsonl:1: a JSONL query line"):
        R.read_queries(j)
    with pytest.raises(ConfigError, match="ranked twice"):
        R.write_run(tmp_path / "r", {"q": [("d", 2.0), ("d", 1.0)]}, tag="t")
    with pytest.raises(ConfigError, match="no relevant document"):
        R.score_run({"q": {"d": 0}}, {})


class _Hit:
    def __init__(self, doc, score):
        self.doc_id, self.score, self.metadata = doc + "#p0", score, {"parent_doc_id": doc}


class _Engine:
    def search_batch(self, queries, k, *, method, collapse):
        assert collapse == "document"
        return [[_Hit("b", 1.0), _Hit("a", 1.0), _Hit("c", 0.5)][:k] for _ in queries]


def test_run_engine_keeps_the_engine_order_on_tied_scores():
    # trec_eval orders tied scores by docid (descending: 'b' before 'a'), so use 'a' first
    class _Tied(_Engine):
        def search_batch(self, queries, k, *, method, collapse):
            return [[_Hit("a", 1.0), _Hit("b", 1.0), _Hit("c", 0.5)][:k] for _ in queries]

    run = R.run_engine(_Tied(), {"q": "x"}, method="bm25", k=3)
    assert run["q"] == [("a", 3.0), ("b", 2.0), ("c", 1.0)]
    assert R.score_run({"q": {"a": 1}}, run)["per_query"]["q"]["mrr@10"] == 1.0
    assert R.score_run({"q": {"b": 1}}, run)["per_query"]["q"]["recall@5"] == 1.0
    assert R.score_run({"q": {"a": 1}}, run)["per_query"]["q"]["ndcg@10"] == 1.0
    # with the engine's own tied scores, trec_eval (nDCG) puts 'b' first: DCG 1/log2(3);
    # the MRR provider keeps the given order: 1.0. Two measures, two rankings.
    tied = R.score_run({"q": {"a": 1}}, {"q": [("a", 1.0), ("b", 1.0)]})["per_query"]["q"]
    assert tied["ndcg@10"] == pytest.approx(1 / math.log2(3)) and tied["mrr@10"] == 1.0
    run = R.run_engine(_Engine(), {"q": "x"}, method="bm25", k=3)
    assert [d for d, _ in run["q"]] == ["b", "a", "c"]
    assert R.score_run({"q": {"b": 1}}, run)["per_query"]["q"]["mrr@10"] == 1.0
    assert R.score_run({"q": {"a": 1}}, run)["per_query"]["q"]["mrr@10"] == 0.5


def test_shipped_hipporag_qrels_cover_the_questions():
    from drgym.envs.task_loaders import TASKS_DIR, load_tasks

    qrels = R.read_qrels(TASKS_DIR / "hipporag_qrels.txt")
    queries = R.read_queries(TASKS_DIR / "hipporag_queries.tsv")
    tasks = load_tasks("hipporag")
    assert list(qrels) == list(queries) == [t.task_id for t in tasks]
    assert sum(len(v) for v in qrels.values()) == 351
    # each question judges as many documents as it has distinct supporting paragraphs
    t0 = tasks[0]
    assert len(qrels[t0.task_id]) == len(t0.gold_docs) == 2


# -- evidence recall in rollout metrics ---------------------------------------------------


def _traj(tid, results_per_step, citations=None):
    t = {"episode_id": f"e-{tid}", "task_id": tid, "steps": [{"results": r} for r in results_per_step], "metadata": {}}
    if citations is not None:
        t["metadata"]["citations"] = [{"claim": "c", "urls": u} for u in citations]
    return t


def test_evidence_recall_by_hand():
    from drgym.evaluation.metrics import evidence_recall
    from drgym.records import Task

    tasks = {
        # titles: "Lilu (mythology)" retrieved (case and spaces differ), "Gallu" never: 1/2
        "t": Task("t", "q", ["a"], gold_docs=["Lilu (mythology)", "Gallu"], metadata={"gold_docs_kind": "title"}),
        # doc ids: a passage id and a parent_doc_id name their documents: 2/3 retrieved;
        # cited: the URL of d1's result is cited, d3's URL is not a result: 1/3
        "d": Task("d", "q", [], kind="research", gold_docs=["d1", "d2", "d3"]),
        # URLs, normalised: http/www/trailing slash match; cited 1/1
        "u": Task("u", "q", [], gold_docs=["https://en.wikipedia.org/wiki/Oslo"], metadata={"gold_docs_kind": "url"}),
        "none": Task("none", "q", ["a"]),
    }
    trajs = [
        _traj("t", [[{"doc_id": "x#p0", "title": "lilu  (Mythology)", "url": "u1"}], []]),
        _traj("d", [[{"doc_id": "d1#p2", "url": "https://a.org/1", "title": "A"}],
                    [{"doc_id": "zz", "url": "https://a.org/2", "metadata": {"parent_doc_id": "d2"}}]],
              citations=[["https://a.org/1"], ["https://a.org/9"]]),
        _traj("u", [[{"doc_id": "o", "url": "http://www.en.wikipedia.org/wiki/Oslo/"}]],
              citations=[["https://en.wikipedia.org/wiki/Oslo"]]),
        _traj("none", [[{"doc_id": "d1"}]]),
    ]
    ev = evidence_recall(trajs, tasks)
    assert [(r["task_id"], r["gold"], r["retrieved"], r["cited"]) for r in ev["per_episode"]] == [
        ("t", 2, 0.5, None), ("d", 3, pytest.approx(2 / 3), pytest.approx(1 / 3)), ("u", 1, 1.0, 1.0)]
    assert ev["episodes"] == 3
    assert ev["retrieved"] == pytest.approx((0.5 + 2 / 3 + 1) / 3)
    assert ev["cited"] == pytest.approx((1 / 3 + 1) / 2)  # over the two episodes with citations
    assert evidence_recall([trajs[-1]], tasks) is None


def test_rollout_metrics_report_gold_evidence(bm25_backend, tmp_path):
    """The scripted policy (search the question, fetch the top hit, answer) on 3 hotpotqa-dev
    questions: metrics.json holds the share of gold titles in each episode's results."""
    import json

    from drgym.envs.task_loaders import load_tasks
    from drgym.evaluation.runner import RolloutConfig, run_rollout

    cfg = RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=3, out=str(tmp_path / "r"), rewards=["cover_em"])
    res = run_rollout(cfg, backend=bm25_backend, progress=False)
    ev = json.loads((res.out_dir / "metrics.json").read_text())["gold_evidence"]
    tasks = {t.task_id: t for t in load_tasks("hotpotqa-dev")[:3]}
    assert ev["episodes"] == 3 and [r["task_id"] for r in ev["per_episode"]] == list(tasks)
    for r, t in zip(ev["per_episode"], res.trajectories):
        seen = {" ".join(x["title"].split()).casefold() for s in t["steps"] for x in s.get("results") or []}
        gold = {g.casefold() for g in tasks[r["task_id"]].gold_docs}
        assert r["gold"] == len(gold) == 2 and r["retrieved"] == len(gold & seen) / 2 and r["cited"] is None
    assert ev["retrieved"] == pytest.approx(sum(r["retrieved"] for r in ev["per_episode"]) / 3)
    assert ev["retrieved"] > 0  # the question as query finds a supporting paragraph
