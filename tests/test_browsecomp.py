"""BrowseComp-Plus: its corpus format, decrypted queries and qrels, end to end through a
drgym index and ``drgym search eval``; its answer format and calibration error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from drgym.errors import ConfigError, CorpusError
from drgym.rewards.calibration import (
    BROWSECOMP_TEMPLATE,
    accuracy_and_calibration,
    expected_calibration_error,
    parse_answer_confidence,
)

DOCS = [
    {"docid": "101", "url": "https://example.org/lyon",
     "text": "---\ntitle: Lyon\n---\n\nLyon is a city in France on the Rhone and Saone rivers."},
    {"docid": "102", "url": "https://example.org/bocuse",
     "text": "Paul Bocuse was a French chef whose restaurant near Lyon held three Michelin stars."},
    {"docid": "103", "url": "https://example.org/oslo", "text": "Oslo is the capital of Norway, on a fjord."},
    {"docid": "104", "url": "https://example.org/munch", "text": "Edvard Munch painted The Scream; his museum is in Oslo."},
    {"docid": "105", "url": "https://example.org/kiwi", "text": "The kiwi is a flightless bird of New Zealand."},
]
QUERIES = [
    {"query_id": "1", "query": "Which French chef's three-star restaurant was near Lyon?", "answer": "Paul Bocuse",
     "evidence_docs": [{"docid": "101"}, {"docid": "102"}], "gold_docs": [{"docid": "102"}]},
    {"query_id": "2", "query": "In which city is the museum of the painter of The Scream?", "answer": "Oslo",
     "evidence_docs": [{"docid": "103"}, {"docid": "104"}], "gold_docs": [{"docid": "104"}]},
]
EVIDENCE = "1 0 101 1\n1 0 102 1\n2 0 103 1\n2 0 104 1\n"
GOLDS = "1 0 102 1\n2 0 104 1\n"


@pytest.fixture
def bcp(tmp_path, monkeypatch):
    d = tmp_path / "shared" / "browsecomp-plus"
    d.mkdir(parents=True)
    (d / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in DOCS))
    (d / "browsecomp_plus_decrypted.jsonl").write_text("".join(json.dumps(r) + "\n" for r in QUERIES))
    (d / "qrel_evidence.txt").write_text(EVIDENCE)
    (d / "qrel_golds.txt").write_text(GOLDS)
    monkeypatch.setenv("DRGYM_SHARED_DATA", str(tmp_path / "shared"))
    return d


def test_corpus_format_is_sniffed_and_keeps_docids(bcp):
    from drgym.corpus.readers import read_corpus, sniff_format

    assert sniff_format(bcp / "corpus.jsonl") == "browsecomp-plus"
    docs = list(read_corpus(bcp / "corpus.jsonl"))
    assert [d.doc_id for d in docs] == ["101", "102", "103", "104", "105"]
    assert docs[0].title == "Lyon" and docs[1].title == "" and docs[3].url == "https://example.org/munch"
    (bcp / "bad.jsonl").write_text('{"docid": "1", "url": "u"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: BrowseComp-Plus rows need 'docid' and 'text'"):
        list(read_corpus(bcp / "bad.jsonl", format="browsecomp-plus"))


def test_loader_reads_queries_and_both_qrels(bcp):
    from drgym.envs.task_loaders import _CACHE, load_browsecomp_plus, load_tasks

    _CACHE.pop("browsecomp-plus", None)
    tasks = load_tasks("browsecomp-plus")
    _CACHE.pop("browsecomp-plus", None)
    assert [t.task_id for t in tasks] == ["browsecomp-plus-1", "browsecomp-plus-2"]
    assert tasks[1].answers == ["Oslo"] and tasks[1].gold_docs == ["103", "104"]
    assert tasks[1].metadata == {"query_id": "2", "answer_docs": ["104"], "gold_docs_kind": "doc_id"}
    # without qrels files, the rows' own evidence_docs / gold_docs
    alone = load_browsecomp_plus(bcp / "browsecomp_plus_decrypted.jsonl")
    assert [(t.gold_docs, t.metadata["answer_docs"]) for t in alone] == [(["101", "102"], ["102"]), (["103", "104"], ["104"])]
    enc = bcp / "encrypted.jsonl"
    enc.write_text(json.dumps({"query_id": "1", "query": "aGVsbG8=", "answer": "d29ybGQ=", "canary": "BENCHMARK DATA"}) + "\n")
    with pytest.raises(CorpusError, match="still encrypted.*decrypt step"):
        load_browsecomp_plus(enc)


def test_unshipped_without_shared_data(tmp_path, monkeypatch):
    from drgym.envs.task_loaders import _CACHE, load_tasks

    _CACHE.pop("browsecomp-plus", None)
    monkeypatch.setenv("DRGYM_SHARED_DATA", str(tmp_path))
    with pytest.raises(CorpusError, match="browsecomp_plus_decrypted.jsonl.*not shipped"):
        load_tasks("browsecomp-plus")


def test_indexed_searched_and_scored_end_to_end(bcp, tmp_path, session_drgym_home):
    from drgym.cli import app
    from drgym.evaluation.retrieval import read_run
    from drgym.search.local import LocalSearchEngine

    engine = LocalSearchEngine.from_corpus(str(bcp / "corpus.jsonl"), method="bm25", root=tmp_path / "idx", device="cpu")
    hits = engine.search("Munch painted The Scream museum", 2)
    assert hits[0].doc_id.split("#")[0] == "104" and hits[0].metadata["parent_doc_id"] == "104"
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"qid": q["query_id"], "query": q["query"]}) + "\n" for q in QUERIES))
    res = CliRunner().invoke(app, ["search", "eval", "--qrels", str(bcp / "qrel_evidence.txt"), "--queries",
                                   str(tmp_path / "q.jsonl"), "--index", str(engine.folder), "--method", "bm25,hybrid",
                                   "--run-out", str(tmp_path / "run.trec"), "--out", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    methods = json.loads((tmp_path / "m.json").read_text())["methods"]
    m, h = methods["bm25"], methods["hybrid"]
    run = read_run(tmp_path / "run.bm25.trec")
    assert set(run) == {"1", "2"} and all(len({d for d, _ in v}) == len(v) for v in run.values())
    assert m["judged_queries"] == 2 and m["run_file"] == str(tmp_path / "run.bm25.trec")
    # BM25 ranks only documents sharing a term: 103 (Oslo, Norway, fjord) shares none with
    # query 2, so its recall stays 1/2 at any depth; query 1 finds 101 (Lyon) and 102 (chef...)
    assert m["per_query"]["1"]["recall@100"] == 1.0 and m["per_query"]["2"]["recall@100"] == 0.5
    assert m["overall"]["recall@100"] == pytest.approx(0.75)
    # hybrid adds the dense ranking of all 5 documents: every evidence document is ranked
    assert h["overall"]["recall@100"] == pytest.approx(1.0) and len(read_run(tmp_path / "run.hybrid.trec")["2"]) == 5
    # "Scream" is only in 104: 104 first, MRR 1
    assert run["2"][0][0] == "104" and m["per_query"]["2"]["mrr@10"] == 1.0
    assert (tmp_path / "run.bm25.trec").read_text().splitlines()[0].split()[1::4] == ["Q0", "drgym-bm25"]
    engine.close()


def test_answer_confidence_parser():
    prompt = BROWSECOMP_TEMPLATE.format(question="Who?")
    assert prompt.startswith("Who?\n\n") and "Confidence: {your confidence score between 0% and 100%" in prompt
    r = parse_answer_confidence("Explanation: his restaurant, L'Auberge [102].\nExact Answer: Paul Bocuse\nConfidence: 90%")
    assert (r.explanation, r.answer, r.confidence) == ("his restaurant, L'Auberge [102].", "Paul Bocuse", 0.9)
    r = parse_answer_confidence("**Exact Answer:** Oslo\n**Confidence:** 35 %")
    assert (r.explanation, r.answer, r.confidence) == (None, "Oslo", 0.35)
    assert parse_answer_confidence("Exact Answer: A\nExact Answer: B\nConfidence: 120%").answer == "B"
    assert parse_answer_confidence("Exact Answer: A\nConfidence: 120%").confidence == 1.0
    assert parse_answer_confidence("Confidence: high").confidence is None



@pytest.mark.parametrize("text, answer, confidence", [
    ("Exact Answer:\nLyon\nConfidence: 85%", "Lyon", 0.85),  # the answer on the line after its label
    ("Exact Answer:\n\n  **Lyon**  \nConfidence: 85%", "Lyon", 0.85),
    ("Exact Answer:\n\nConfidence: 85%", None, 0.85),  # no answer: the next label is not one
    ("Exact Answer: Lyon Confidence: 80%", "Lyon", 0.8),  # the confidence on the answer's line
    ("Exact Answer: **Lyon** **Confidence:** 80%", "Lyon", 0.8),
    ("Exact Answer: Lyon (Confidence: 0.8)", "Lyon", 0.8),
    ("Exact Answer: Vote of Confidence: A Novel\nConfidence: 5%", "Vote of Confidence: A Novel", 0.05),
    ("- **Exact answer**: Paris\n- **Confidence**: 70%", "Paris", 0.7),
    ("Confidence: 0.9", None, 0.9),  # a bare number up to 1 is a fraction
    ("Confidence: 0.9.", None, 0.9),
    ("Confidence: .9", None, 0.9),
    ("Confidence: 0,9", None, 0.9),  # decimal comma
    ("Confidence: 1", None, 1.0),
    ("Confidence: 85%", None, 0.85),
    ("Confidence: 85", None, 0.85),  # above 1: a percentage
    ("Confidence: 85 percent", None, 0.85),
    ("Confidence: 0.9%", None, 0.009),  # an explicit percent sign is a percentage
    ("Confidence: 9/10", None, None),  # not read as 9 (0.09)
    ("Confidence: -5%", None, None),
    ("Confidence: 85%\nConfidence: high", None, 0.85),  # a later value that is no number keeps the last number
])
def test_answer_confidence_parser_layouts(text, answer, confidence):
    r = parse_answer_confidence(text)
    assert r.answer == answer
    assert r.confidence == (pytest.approx(confidence) if confidence is not None else None)


def test_calibration_error_by_hand():
    # bins of width 0.1: 0.95 -> [0.9, 1.0]; 0.85, 0.81 -> [0.8, 0.9); 0.55 -> [0.5, 0.6); 0.05 -> [0, 0.1)
    #   [0.9, 1]: acc 1,   conf .95 -> 1/5 * .05 = .010
    #   [0.8, .9): acc 1/2, conf .83 -> 2/5 * .33 = .132
    #   [0.5, .6): acc 1,   conf .55 -> 1/5 * .45 = .090
    #   [0, .1):   acc 0,   conf .05 -> 1/5 * .05 = .010      ECE = .242
    assert expected_calibration_error([0.95, 0.85, 0.81, 0.55, 0.05], [1, 1, 0, 1, 0]) == pytest.approx(0.242)
    # 1.0 falls in the last bin, 0.1 in the second: (0 + .1) / 2
    assert expected_calibration_error([1.0, 0.1], [True, False]) == pytest.approx(0.05)
    assert expected_calibration_error([0.5, 0.5], [True, False]) == 0.0
    # a response without a confidence counts as 100% (BrowseComp): bin [0.9, 1] with acc 0 -> 1/2 * 1
    out = accuracy_and_calibration(["Exact Answer: x\nConfidence: 50%", "Exact Answer: y"], [1, 0])
    assert out == {"accuracy": 0.5, "calibration_error": pytest.approx(0.75), "n": 2, "no_confidence": 1}
    with pytest.raises(ConfigError, match="in \\[0, 1\\]"):
        expected_calibration_error([85.0], [1])
    with pytest.raises(ConfigError, match="one truth value per confidence"):
        expected_calibration_error([0.5], [1, 0])


def test_rollout_scores_the_exact_answer_and_reports_calibration_error(bcp, tmp_path, session_drgym_home):
    """BrowseComp-Plus end to end through ``run_rollout``: the agent searches, answers in
    BrowseComp's format; EM is scored on the ``Exact Answer:`` line and ``metrics.json``
    holds evidence recall and the calibration error."""
    from drgym.envs.task_loaders import _CACHE
    from drgym.evaluation.runner import RolloutConfig, run_rollout
    from drgym.policies.base import Policy
    from drgym.search.local import LocalSearchEngine

    said = {"Which French chef": ("Paul Bocuse", "90%"), "In which city": ("Bergen", "80%")}

    class Answers(Policy):
        name = "browsecomp-format"

        def act(self, conversations, infos=None):
            out = []
            for conv in conversations:
                question = next(m["content"] for m in conv if m["role"] == "user")
                if not any("<information>" in str(m.get("content")) for m in conv if m["role"] != "system"):
                    out.append(f"<search>{question.split('Question: ')[-1]}</search>")
                    continue
                answer, conf = next(v for k, v in said.items() if k in question)
                out.append(f"<answer>Explanation: from the passages.\nExact Answer: {answer}\nConfidence: {conf}</answer>")
            return out

    engine = LocalSearchEngine.from_corpus(str(bcp / "corpus.jsonl"), method="bm25", root=tmp_path / "idx", device="cpu")
    _CACHE.pop("browsecomp-plus", None)
    try:
        cfg = RolloutConfig(policy="browsecomp-format", tasks="browsecomp-plus", out=str(tmp_path / "run"), batch_size=2,
                            plots=False)
        run_rollout(cfg, policy=Answers(), backend=engine, progress=False)
    finally:
        _CACHE.pop("browsecomp-plus", None)
        engine.close()
    trajs = {t["task_id"]: t for t in map(json.loads, (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines())}
    one, two = trajs["browsecomp-plus-1"], trajs["browsecomp-plus-2"]
    assert one["final_answer"] == "Paul Bocuse" and one["reward_components"]["em"] == 1.0
    assert one["metadata"]["answer_confidence"] == 0.9 and one["metadata"]["answer_explanation"] == "from the passages."
    assert two["final_answer"] == "Bergen" and two["reward_components"]["em"] == 0.0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["em"] == 0.5
    # bins: [0.9, 1.0] holds one right answer at 90% (|1 - 0.9| x 1/2), [0.8, 0.9) one wrong at 80% (0.8 x 1/2)
    assert metrics["calibration"] == {"episodes": 2, "accuracy": 0.5, "calibration_error": pytest.approx(0.45),
                                      "correct_by": "em", "no_confidence": 0, "unscored": 0}
    # the searches found the evidence: 101 and 102 share words with query 1; 104 ("Scream") with query 2, 103 none
    assert [r["retrieved"] for r in metrics["gold_evidence"]["per_episode"]] == [1.0, 0.5]
    assert one["steps"][0]["tool_calls"][0]["name"] == "search" and one["metadata"]["searches"] == 1
