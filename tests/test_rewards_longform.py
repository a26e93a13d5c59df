"""DeepResearchGym long-form rewards: KPR/KPC (incl. reproducing the official mini results),
key point extraction + merge, citation precision/recall, report quality.

Judge verdicts come from the real OpenAI-compatible client talking to a loopback
server (``chat_server``) whose answers are fixed per test, so the expected scores are
hand-checked. The official DeepResearchGym labels are read from ``../shared`` and never
copied into the project.
"""

from __future__ import annotations

import json
import re

import pytest
from drgym.rewards import Episode
from drgym.rewards.citation import CitationReward, find_urls
from drgym.rewards.keypoints import (
    KeyPointExtractor,
    KeyPointRecall,
    aggregate_kpr,
    label_rates,
)
from drgym.rewards.quality import ReportQuality, quality_score

from drgym.errors import ConfigError, DocumentNotFoundError
from drgym.judges.openai import OpenAIJudge
from drgym.records import Task
from drgym.search.base import SearchBackend
from drgym.types import Document

MINI_SYSTEMS = {
    # system: (KPR, KPC) = mean of the official per-query rates over the 10 mini queries
    "GPTResearcher": (64.5515, 4.0616),
    "GPTResearcher_custom": (72.8799, 5.5911),
    "gpt-4o-search-preview": (54.7420, 3.6596),
    "hf_deepresearch_gpt-4o-mini": (41.9038, 3.9920),
    "open_deep_search": (42.7138, 2.9656),
}


def judge_for(server, tmp_path=None, **kw):
    kw["retry"] = {"backoff_s": 0.0, **kw.get("retry", {})}
    kw.setdefault("max_concurrency", 8)
    return OpenAIJudge("j", server.url, cache=(tmp_path / "c.sqlite") if tmp_path else False, **kw)


def user_text(body) -> str:
    return body["messages"][1]["content"]


# ---------------------------------------------------------------------------------------
# KPR / KPC
# ---------------------------------------------------------------------------------------


def test_label_rates_and_macro_aggregate_hand_checked():
    r = label_rates(["Supported", "Supported", "Omitted", "Contradicted"])
    assert (r["support_rate"], r["omitted_rate"], r["contradicted_rate"], r["n"]) == (50.0, 25.0, 25.0, 4)
    empty = label_rates([])
    assert empty["support_rate"] == 0.0 and empty["n"] == 0
    # a query with no key points still counts in the denominator
    agg = aggregate_kpr([r, empty, label_rates(["Supported"])])
    assert agg["kpr"] == pytest.approx((50 + 0 + 100) / 3)
    assert agg["kpc"] == pytest.approx(25 / 3)
    assert agg["n_queries"] == 3
    with pytest.raises(ConfigError, match="label"):
        label_rates(["supported?"])


def _mini(shared_data):
    root = shared_data / "deepresearchgym" / "results" / "mini"
    kps = {r["id"]: r["key_points"] for r in map(json.loads, open(root / "key_points_deduplicated_at_3322d305.jsonl"))}
    res = {s: json.load(open(root / s / "evaluation_results_kpr_gpt-4.1-mini.json")) for s in MINI_SYSTEMS}
    return kps, res


def test_official_mini_kpr_kpc_reproduced_from_labels(shared_data):
    """Per-key-point verdicts of 5 systems x 10 queries give the official rates through our aggregation."""
    kps, res = _mini(shared_data)
    for system, (kpr, kpc) in MINI_SYSTEMS.items():
        per_query = {}
        assert len(res[system]) == 10
        for qid, row in res[system].items():
            # one label per key point of the 3322d305 key points, numbered 1..n
            assert sorted(map(int, row["labels"])) == [p["point_number"] for p in kps[qid]]
            ours = label_rates([row["labels"][str(p["point_number"])][0] for p in kps[qid]])
            assert ours["support_rate"] == pytest.approx(row["support_rate"], abs=1e-9)
            assert ours["omitted_rate"] == pytest.approx(row["ommitted_rate"], abs=1e-9)
            assert ours["contradicted_rate"] == pytest.approx(row["contradicted_rate"], abs=1e-9)
            per_query[qid] = ours
        agg = aggregate_kpr(per_query)
        assert agg["kpr"] == pytest.approx(kpr, abs=5e-5), system
        assert agg["kpc"] == pytest.approx(kpc, abs=5e-5), system
        assert agg["kpr"] == pytest.approx(aggregate_kpr(res[system])["kpr"], abs=1e-9)


def test_kpr_reward_end_to_end_replays_official_labels(shared_data, chat_server):
    """The KPR reward (template -> HTTP judge -> parsing -> rates) reproduces the official numbers
    when the judge answers with the official labels."""
    kps, res = _mini(shared_data)
    for system in ("GPTResearcher", "open_deep_search"):
        table = {}
        for qid, row in res[system].items():
            for p in kps[qid]:
                table[(qid, p["point_content"])] = row["labels"][str(p["point_number"])][0]

        def responder(body, table=table):
            u = user_text(body)
            kp = u.split("Key point: ", 1)[1].split("\n\nReport:\n", 1)[0]
            qid = re.search(r"Report for query (\d+)", u).group(1)
            return json.dumps({"label": table[(qid, kp)], "justification": "official"})

        chat_server.responder = responder
        eps = [
            Episode(task=Task(task_id=qid, question="q", kind="research", key_points=kps[qid]), answer=f"Report for query {qid}.")
            for qid in res[system]
        ]
        out = KeyPointRecall(judge_for(chat_server)).score(eps)
        assert out.failures == 0
        for e, kpr, kpc in zip(eps, out.components["kpr"], out.components["kpc"]):
            assert 100 * kpr == pytest.approx(res[system][e.task.task_id]["support_rate"], abs=1e-9)
            assert 100 * kpc == pytest.approx(res[system][e.task.task_id]["contradicted_rate"], abs=1e-9)
        assert 100 * sum(out.scores) / len(out.scores) == pytest.approx(MINI_SYSTEMS[system][0], abs=5e-5)


def test_kpr_reward_edge_cases(chat_server):
    def responder(body):
        kp = user_text(body).split("Key point: ", 1)[1].split("\n", 1)[0]
        return {"A": '{"label": "Supported"}', "B": '{"label": "contradicted"}', "C": '{"label": "Omitted"}'}.get(kp, "refuse")

    chat_server.responder = responder
    kp = [{"point": "A"}, {"point_content": "B"}, {"point": "C"}, {"point": "A"}]
    eps = [
        Episode(Task("t1", "q", kind="research", key_points=kp), "some report"),
        Episode(Task("t2", "q", kind="research", key_points=[]), "report with nothing to check"),
        Episode(Task("t3", "q", kind="research", key_points=kp), ""),
        Episode(Task("t4", "q", kind="research", key_points=[{"point": "A"}, {"point": "Z"}]), "r"),
    ]
    out = KeyPointRecall(judge_for(chat_server, retry={"attempts": 2}), contradiction_weight=1.0).score(eps)
    # t1: 2 Supported, 1 Contradicted, 1 Omitted of 4 -> KPR 0.5, KPC 0.25, score 0.5 - 0.25
    assert out.components["kpr"][0] == 0.5 and out.components["kpc"][0] == 0.25 and out.scores[0] == 0.25
    # t2: no key points -> KPR undefined: None, flagged, not a judge failure (failures stays 1 below)
    assert out.scores[1] is None and out.components["n_key_points"][1] == 0.0 and out.components["kp_undefined"] == [0.0, 1.0, 0.0, 0.0]
    assert out.components["kpr"][1] is None
    # t3: empty report -> all Omitted without calls
    assert out.scores[2] == 0.0 and out.components["kp_omitted"][2] == 1.0
    # t4: one key point's verdict failed after retries -> excluded and counted, not 0
    assert out.scores[3] is None and out.components["kp_failed"][3] == 1.0 and out.failures == 1


def test_key_point_extraction_and_merge(chat_server, tmp_path):
    docs = [("d1", "The tower is 330 m tall. It opened in 1889."), ("d2", "Opened in 1889, the tower draws 7 million visitors.")]

    def responder(body):
        u = user_text(body)
        if "Numbered key points" in u:
            assert "1. Tower height is 330 m" in u and "3. Opened in 1889 (2)" in u
            return json.dumps({"points": [
                {"point_number": 1, "point_content": "Tower height is 330 m", "original_point_number": [1]},
                {"point_number": 2, "point_content": "Opened in 1889", "original_point_number": [2, 3]},
            ]})
        if "330 m" in u:
            return json.dumps({"points": [
                {"point_number": 1, "point_content": "Tower height is 330 m", "spans": ["The tower is 330 m tall."]},
                {"point_number": 2, "point_content": "Opened in 1889", "spans": ["It opened in 1889."]},
            ]})
        return json.dumps({"points": [{"point_number": 1, "point_content": "Opened in 1889 (2)", "spans": ["Opened in 1889", "not in doc"]}]})

    chat_server.responder = responder
    ks = KeyPointExtractor(judge_for(chat_server, tmp_path)).build("Tell me about the tower", docs)
    assert not ks.failures
    assert [p["point"] for p in ks.points] == ["Tower height is 330 m", "Opened in 1889"]
    assert ks.points[1]["original_point_number"] == [2, 3]
    assert ks.points[1]["spans"] == ["It opened in 1889.", "Opened in 1889", "not in doc"]
    assert ks.points[0]["spans_verbatim"] and not ks.points[1]["spans_verbatim"]
    n = len(chat_server.requests)
    KeyPointExtractor(judge_for(chat_server, tmp_path)).build("Tell me about the tower", docs)
    assert len(chat_server.requests) == n  # rebuilt from the verdict cache


# ---------------------------------------------------------------------------------------
# Citation precision / recall
# ---------------------------------------------------------------------------------------


class DictBackend(SearchBackend):
    """A SearchBackend over a dict of pages (fetch only)."""

    name = "dict"

    def __init__(self, pages: dict[str, str]):
        self.pages = pages
        self.fetched: list[str] = []

    def search_batch(self, queries, k=10):
        self.check_request(queries, k)
        return [[] for _ in queries]

    def fetch(self, url):
        self.fetched.append(url)
        if url not in self.pages:
            raise DocumentNotFoundError(f"no document with URL {url!r}")
        return Document(doc_id=url, url=url, title="T", text=self.pages[url])


REPORT = (
    "The tower is 330 m tall [1]. It opened in 1889 ([source](https://b.org/open)). "
    "It is painted brown (https://missing.org/x). Many people love it.\n\n[1] https://a.org/height"
)


def test_find_urls():
    assert find_urls(REPORT) == ["https://b.org/open", "https://missing.org/x", "https://a.org/height"]
    assert find_urls("see www.example.com, and http://x.org/a).") == ["www.example.com", "http://x.org/a"]


def test_citation_precision_recall_hand_checked(chat_server):
    backend = DictBackend({"https://a.org/height": "Height: 330 m. See https://other.org", "https://b.org/open": "Opened in 1889."})

    def responder(body):
        u = user_text(body)
        if u.startswith("Report:"):
            return json.dumps({"claims": [
                {"claim": "The tower is 330 m tall", "sources": ["https://a.org/height"]},
                {"claim": "It opened in 1889", "sources": ["https://b.org/open"]},
                {"claim": "It is painted brown", "sources": ["https://missing.org/x"]},
                {"claim": "Many people love it", "sources": []},
            ]})
        assert "https://other.org" not in u  # URLs are stripped from page text
        if "330 m tall" in u:
            return '{"support": "full_support"}'
        return '{"support": "Partial Support"}'

    chat_server.responder = responder
    r = CitationReward(judge_for(chat_server), backend, mode="precision")
    out = r.score([Episode(Task("t", "q", kind="research"), REPORT), Episode(Task("t2", "q", kind="research"), "No links at all.")])
    # precision: (1 + 0.5 + 0 [page not fetchable]) / 3 cited claims; recall: 3 of 4 claims cite something
    assert out.scores[0] == pytest.approx(0.5)
    assert out.components["citation_precision"][0] == pytest.approx(0.5)
    assert out.components["citation_recall"][0] == pytest.approx(0.75)
    assert out.components["cite_fetch_failed"][0] == 1.0
    # no URL -> 0 for both, without any judge call
    assert out.scores[1] == 0.0 and out.components["citation_recall"][1] == 0.0
    assert len(chat_server.requests) == 1 + 2
    f1 = CitationReward(judge_for(chat_server), backend, mode="f1").score([Episode(Task("t", "q"), REPORT)])
    assert f1.scores[0] == pytest.approx(2 * 0.5 * 0.75 / 1.25)
    rec = CitationReward(judge_for(chat_server), mode="recall").score([Episode(Task("t", "q"), REPORT)])
    assert rec.scores[0] == pytest.approx(0.75)


def test_citation_extraction_failure_is_counted(chat_server):
    chat_server.responder = lambda body: "I cannot extract claims."
    out = CitationReward(judge_for(chat_server, retry={"attempts": 2}), DictBackend({})).score([Episode(Task("t", "q"), REPORT)])
    assert out.scores == [None] and out.failures == 1 and out.components["citation_recall"] == [None]


# ---------------------------------------------------------------------------------------
# Quality
# ---------------------------------------------------------------------------------------


def test_quality_hand_checked(chat_server):
    assert quality_score({"a": 6, "b": 4, "c": 5, "d": 7, "e": 3, "f": 5}) == pytest.approx(0.5)  # one scale: 0-1
    with pytest.raises(ConfigError):
        quality_score({"a": 11})
    given = {"Clarity": 6, "Depth": 4, "Balance": 5, "Breadth": 7, "Support": 3, "Insightfulness": 5}

    def responder(body):
        crit = user_text(body).split("Criterion: ", 1)[1].split(":", 1)[0]
        return json.dumps({"score": given[crit], "justification": "x"})

    chat_server.responder = responder
    out = ReportQuality(judge_for(chat_server)).score([Episode(Task("t", "q"), "A report."), Episode(Task("t", "q"), "  ")])
    assert out.scores == [pytest.approx(0.5), 0.0]
    assert out.components["quality_depth"] == [pytest.approx(0.4), 0.0]   # 4/10, the score's scale
    assert len(chat_server.requests) == 6
    with pytest.raises(ConfigError, match="Unknown quality"):
        ReportQuality(judge_for(chat_server), criteria=["Beauty"])


def test_kpr_batched_mode(chat_server):
    def responder(body):
        u = user_text(body)
        assert "1. A\n2. B\n3. C" in u
        if "short" in u:  # misses key point 3 -> that key point failed, episode excluded
            return json.dumps({"labels": [{"point_number": 1, "label": "Supported"}, {"point_number": 2, "label": "Omitted"}]})
        return json.dumps({"labels": [{"point_number": 1, "label": "Supported"}, {"point_number": 2, "label": "omitted"},
                                      {"point_number": 3, "label": "Contradicted"}]})

    chat_server.responder = responder
    kp = [{"point": "A"}, {"point": "B"}, {"point": "C"}]
    eps = [Episode(Task("t1", "q", kind="research", key_points=kp), "full report"),
           Episode(Task("t2", "q", kind="research", key_points=kp), "short report")]
    out = KeyPointRecall(judge_for(chat_server), batched=True).score(eps)
    assert out.scores[0] == pytest.approx(1 / 3) and out.components["kpc"][0] == pytest.approx(1 / 3)
    assert out.scores[1] is None and out.components["kp_failed"][1] == 1.0 and out.failures == 1
    assert len(chat_server.requests) == 2  # one call per report


def test_find_urls_keeps_balanced_parentheses():
    # Wikipedia titles often end in a parenthesised qualifier; a markdown link closes after it.
    text = "Lilu is a spirit [1](https://en.wikipedia.org/wiki/Lilu_(mythology)). See (https://x.org/a)."
    assert find_urls(text) == ["https://en.wikipedia.org/wiki/Lilu_(mythology)", "https://x.org/a"]
