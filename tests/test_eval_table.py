"""drgym.evaluation.policy_table and scripts/eval_table.py: rows of a committed table stand in for a rerun only when they are the same work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drgym.errors import ConfigError
from drgym.evaluation import policy_table as pt
from envs_helpers import load_script

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "training" / "results" / "answerable_test_table.json"


def test_reuse_takes_the_committed_rows_of_the_same_policy_tasks_and_env():
    et = pt
    old = json.loads(TABLE.read_text())
    policies = {"start": ("hf:smollm2-drgym", {}), "scripted": ("scripted", {}),
                "start + GRPO": ("hf:/elsewhere/checkpoint-300", {}),
                "retrieve-then-read": ("rag:other-reader", {})}  # same label, another policy: runs
    rows = et.reusable_rows(TABLE, policies, old["tasks"], old["env"])
    assert sorted(rows) == ["scripted", "start"]
    assert rows["start"]["per_question"] == old["per_question"]["start"]
    assert len(rows["start"]["per_question"]) == 400
    # the scores the table is rebuilt from are the committed ones: the start row's F1 mean
    f1 = [q["f1"] for q in rows["start"]["per_question"].values()]
    assert sum(f1) / len(f1) == pytest.approx(old["rows"]["start"]["scores"]["f1"]["mean"], abs=1e-12)
    assert rows["start"]["metrics"]["answer_rate"] == old["rows"]["start"]["scores"]["answered"]["mean"]


def test_reuse_refuses_a_table_of_other_tasks_or_another_env():
    et = pt
    old = json.loads(TABLE.read_text())
    with pytest.raises(ConfigError, match="no row of it can be reused"):
        et.reusable_rows(TABLE, {"start": ("hf:smollm2-drgym", {})}, "hipporag-test", old["env"])
    with pytest.raises(ConfigError, match="no row of it can be reused"):
        et.reusable_rows(TABLE, {"start": ("hf:smollm2-drgym", {})}, old["tasks"], old["env"] + ", dtype bfloat16")


def test_trained_label_may_not_replace_another_row(capsys):
    et = load_script("eval_table")
    import sys

    argv = sys.argv
    sys.argv = ["eval_table.py", "--start", "smollm2-drgym", "--trained", "some/ckpt", "--trained-label", "start",
                "--tasks", "hipporag-test"]
    try:
        with pytest.raises(SystemExit):
            et.main()
    finally:
        sys.argv = argv
    assert "--trained-label 'start' is the label of another row" in capsys.readouterr().err


def test_also_pairs_another_tables_row_question_by_question(tmp_path, monkeypatch):
    """``--also LABEL=TABLE`` takes another run's row on the same questions (no rollout runs
    here: every row comes from the committed table) and pairs the top row with it."""
    et = load_script("eval_table")
    import sys

    old = json.loads(TABLE.read_text())
    out = tmp_path / "t.json"
    monkeypatch.setattr(sys, "argv", [
        "eval_table.py", "--start", "smollm2-drgym", "--config", "smollm2_answerable_cpu", "--dtype", "float32",
        "--tasks", "answerable-test", "--reuse", str(TABLE), "--only", "start;retrieve-then-read", "--partial",
        "--also", f"start + GRPO={TABLE}", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert et.main() == 0
    t = json.loads(out.read_text())
    assert sorted(t["rows"]) == ["retrieve-then-read", "start", "start + GRPO"]
    assert t["per_question"]["start + GRPO"] == old["per_question"]["start + GRPO"]
    d = t["paired"]["F1: start - start + GRPO"]
    want = old["paired"]["F1: start + GRPO - start"]
    assert d["n"] == 400 and d["mean"] == pytest.approx(-want["mean"], abs=1e-12)
    assert (d["wins"], d["losses"]) == (want["losses"], want["wins"])
    assert not (tmp_path / "runs").exists()  # nothing was run


def test_also_refuses_a_row_the_table_does_not_have(tmp_path):
    et = pt
    old = json.loads(TABLE.read_text())
    with pytest.raises(ConfigError, match="no row 'start \\+ GRPO \\(evidence\\)'"):
        et.other_row(TABLE, "start + GRPO (evidence)", old["tasks"], old["env"])
    with pytest.raises(ConfigError, match="cannot be paired"):
        et.other_row(TABLE, "start", "hipporag-test", old["env"])


def test_the_committed_table_is_what_score_table_makes_of_its_per_question_scores():
    """Means, intervals and paired differences of a committed table, recomputed by
    :func:`drgym.evaluation.policy_table.score_table` from its own per-question scores."""
    old = json.loads(TABLE.read_text())
    results = {label: pt._taken_row(old, label) for label in old["rows"]}
    t = pt.score_table(results, tasks=old["tasks"], env_desc=old["env"], env_name=old["env_name"],
                       command=old["made_by"], start=True, trained_label="start + GRPO", has_trained=True)
    for label, row in old["rows"].items():
        for m in ("em", "f1", "answered", "searches"):
            assert t["rows"][label]["scores"][m] == pytest.approx(row["scores"][m], abs=1e-12), (label, m)
    for name in ("F1: start + GRPO - start", "EM: start + GRPO - start", "F1: start + GRPO - retrieve-then-read"):
        assert t["paired"][name] == pytest.approx(old["paired"][name], abs=1e-12), name
    assert t["n_questions"] == 400


def test_per_question_scores_and_whether_the_gold_was_in_view():
    """``saw_gold`` reads the observations' visible text (a tag glued to the alias does not hide it);
    a yes/no gold is never "seen"."""
    steps = [{"action": "<search>x</search>", "tool_calls": [{"name": "search"}],
              "observation": "<information>Doc 1 The Iliad is attributed to Homer.</information>"},
             {"action": "<answer>Homer</answer>", "tool_calls": [{"name": "answer"}], "observation": ""}]
    trajs = [{"task_id": "a", "terminated": True, "reward_components": {"em": 1.0, "f1": 1.0}, "steps": steps},
             {"task_id": "b", "terminated": False, "reward_components": {"em": None}, "steps": steps}]
    pq = pt.per_question(trajs, {"a": ["Homer"], "b": ["yes"]})
    assert pq == {"a": {"em": 1.0, "f1": 1.0, "answered": 1.0, "searches": 1.0, "saw_gold": 1.0},
                  "b": {"em": 0.0, "f1": 0.0, "answered": 0.0, "searches": 1.0, "saw_gold": 0.0}}
