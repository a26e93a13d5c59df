"""Reliability of a resumed run: each episode is bound to its task's content (not only its
id), and run-file records refuse numbers that are not finite or out of range.

The runs drive the real runner (``run_rollout``) with the scripted policy over a plain
JSONL task file of the first hotpotqa-dev questions (a plain file's task ids are its line
numbers) and the HippoRAG BM25 backend.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from drgym.evaluation.run_directory import (
    REJECTED_FILE,
    InvalidEpisodeError,
    TasksChangedError,
    read_run_episodes,
    task_content_sha256,
)
from drgym.evaluation.runner import RolloutConfig, run_rollout
from drgym.records import Trajectory, trajectory_record_error


def _write_tasks(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def hotpot_rows() -> list[dict]:
    """The first 4 hotpotqa-dev questions with their golds, as plain task-file rows."""
    from drgym.envs.task_loaders import load_tasks

    return [{"question": t.question, "answers": list(t.answers)} for t in load_tasks("hotpotqa-dev")[:4]]


def _run(tasks: Path, out: Path, backend, **kw):
    cfg = RolloutConfig(policy="scripted", tasks=str(tasks), n=None, out=str(out), batch_size=4, plots=False)
    return run_rollout(cfg, backend=backend, progress=False, **kw)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]


# -- a resumed run is bound to its tasks' content ------------------------------------------------
def test_unchanged_resume_is_exact_and_records_each_tasks_hash(hotpot_rows, bm25_backend, tmp_path):
    tasks, out = tmp_path / "qs.jsonl", tmp_path / "run"
    _write_tasks(tasks, hotpot_rows)
    first = _run(tasks, out, bm25_backend)
    assert first.new_episodes == 4
    from drgym.envs.task_loaders import load_tasks

    want = {t.task_id: task_content_sha256(t) for t in load_tasks(str(tasks))}
    recs = _lines(out / "trajectories.jsonl")
    assert {r["task_id"]: r["metadata"]["task_sha256"] for r in recs} == want
    before = (out / "trajectories.jsonl").read_bytes()
    again = _run(tasks, out, bm25_backend)
    assert again.new_episodes == 0 and again.skipped == 4 and again.rejected == 0
    assert (out / "trajectories.jsonl").read_bytes() == before  # nothing rewritten or appended
    assert again.metrics["f1"] == first.metrics["f1"] and again.metrics["episodes"] == 4
    assert [t["task_id"] for t in again.trajectories] == [t["task_id"] for t in first.trajectories]


def test_reversed_task_file_is_refused_naming_the_moved_tasks(hotpot_rows, bm25_backend, tmp_path):
    tasks, out = tmp_path / "qs.jsonl", tmp_path / "run"
    _write_tasks(tasks, hotpot_rows)
    _run(tasks, out, bm25_backend)
    before = (out / "trajectories.jsonl").read_bytes()
    _write_tasks(tasks, hotpot_rows[::-1])  # same path, same ids (line numbers), other questions
    with pytest.raises(TasksChangedError) as e:
        _run(tasks, out, bm25_backend)
    assert e.value.task_ids == ["qs-0", "qs-1", "qs-2", "qs-3"]
    assert "4 task(s)" in str(e.value) and "qs-0, qs-1, qs-2, qs-3" in str(e.value) and "--fresh" in str(e.value)
    assert (out / "trajectories.jsonl").read_bytes() == before  # refused before anything was written
    res = _run(tasks, out, bm25_backend, fresh=True)
    assert res.new_episodes == 4
    by_id = {t["task_id"]: t for t in res.trajectories}
    assert by_id["qs-0"]["metadata"]["answers"] == hotpot_rows[3]["answers"]  # now the reversed file's questions


def test_an_edited_gold_is_refused_naming_that_task(hotpot_rows, bm25_backend, tmp_path):
    tasks, out = tmp_path / "qs.jsonl", tmp_path / "run"
    _write_tasks(tasks, hotpot_rows)
    _run(tasks, out, bm25_backend)
    edited = [dict(r) for r in hotpot_rows]
    edited[2]["answers"] = ["not the old gold"]
    _write_tasks(tasks, edited)
    with pytest.raises(TasksChangedError) as e:
        _run(tasks, out, bm25_backend)
    assert e.value.task_ids == ["qs-2"] and "1 task(s)" in str(e.value) and "(qs-2)" in str(e.value)


def test_same_question_other_golds_and_a_replaced_file_of_the_same_length(hotpot_rows, bm25_backend, tmp_path):
    # two tasks ask the same question with different golds; swapping their golds changes both
    tasks, out = tmp_path / "qs.jsonl", tmp_path / "run"
    rows = [hotpot_rows[0], {**hotpot_rows[0], "answers": ["another gold"]}, hotpot_rows[1]]
    _write_tasks(tasks, rows)
    _run(tasks, out, bm25_backend)
    _write_tasks(tasks, [rows[1], rows[0], rows[2]])
    with pytest.raises(TasksChangedError) as e:
        _run(tasks, out, bm25_backend)
    assert e.value.task_ids == ["qs-0", "qs-1"]
    # another file of the same length and name: every task differs
    _write_tasks(tasks, [{"question": f"Question number {i}?", "answers": [str(i)]} for i in range(3)])
    with pytest.raises(TasksChangedError) as e:
        _run(tasks, out, bm25_backend)
    assert e.value.task_ids == ["qs-0", "qs-1", "qs-2"]
    # a file that only grew keeps its finished episodes
    _write_tasks(tasks, rows + [hotpot_rows[2]])
    res = _run(tasks, out, bm25_backend)
    assert res.skipped == 3 and res.new_episodes == 1
    # other bytes, same tasks (JSON spacing, a question's surrounding blanks, which the loader strips): resumed
    tasks.write_text("".join(json.dumps({**r, "question": f"  {r['question']} "}, separators=(",", ":")) + "\n"
                             for r in rows + [hotpot_rows[2]]), encoding="utf-8")
    res = _run(tasks, out, bm25_backend)
    assert res.skipped == 4 and res.new_episodes == 0


def test_a_run_directory_of_an_older_drgym_is_refused(hotpot_rows, bm25_backend, tmp_path):
    tasks, out = tmp_path / "qs.jsonl", tmp_path / "run"
    _write_tasks(tasks, hotpot_rows[:2])
    _run(tasks, out, bm25_backend)
    path = out / "trajectories.jsonl"
    recs = _lines(path)
    for r in recs:
        del r["metadata"]["task_sha256"]  # as drgym wrote them before episodes recorded their task's content
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    with pytest.raises(TasksChangedError, match="record no task content hash .*older drgym") as e:
        _run(tasks, out, bm25_backend)
    assert e.value.task_ids == ["qs-0", "qs-1"]
    assert _run(tasks, out, bm25_backend, fresh=True).new_episodes == 2


# -- run-file records refuse non-finite and out-of-range numbers ---------------------------------
def _record(**over) -> dict:
    d = Trajectory(episode_id="e0", task_id="t0", reward=0.5, reward_components={"f1": 0.5},
                   timings={"search": 0.1}, metadata={"turns": 2, "usage": [{"prompt_tokens": 10}]}).to_dict()
    for path, value in over.items():
        *head, last = path.split("__")
        node = d
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[last] = value
    return d


@pytest.mark.parametrize("path, value, why", [
    ("reward", float("nan"), "reward: Input should be a finite number"),
    ("reward", float("inf"), "reward: Input should be a finite number"),
    ("reward", float("-inf"), "reward: Input should be a finite number"),
    ("reward", 1e308, "reward: Input should be less than or equal to 1000000"),
    ("reward", -1e7, "reward: Input should be greater than or equal to -1000000"),
    ("reward", 10**400, "reward: Input should be a valid number"),
    ("reward", "NaN", "reward: Input should be a valid number"),
    ("reward", True, "reward: Input should be a valid number"),
    ("reward_components__f1", float("nan"), "reward_components.f1: Input should be a finite number"),
    ("reward_components__f1", "0.5", "reward_components.f1: Input should be a valid number"),
    ("reward_components__f1", False, "reward_components.f1: Input should be a valid number"),
    ("timings__search", -0.5, "timings.search: Input should be greater than or equal to 0"),
    ("timings__search", float("inf"), "timings.search: Input should be a finite number"),
    ("metadata__turns", -1, "metadata.turns: Input should be greater than or equal to 0"),
    ("metadata__turns", 2.0, "metadata.turns: Input should be a valid integer"),
    ("metadata__usage__0__prompt_tokens", -3, "metadata.usage.0.prompt_tokens: Input should be greater than or equal to 0"),
    ("metadata__usage__0__prompt_tokens", 10**30, "metadata.usage.0.prompt_tokens: Input should be less than or equal to 1000000000"),
    ("metadata__latency_s", float("nan"), "metadata.latency_s: Input should be a finite number"),
    ("metadata__answer_confidence", 1.5, "metadata.answer_confidence: Input should be less than or equal to 1"),
    ("metadata__task_sha256", "abc", "metadata.task_sha256: String should match pattern"),
    ("metadata__usage", [5], "metadata.usage.0: Input should be a valid dictionary"),
    ("metadata__wall_phases_s", {"search": float("nan")}, "metadata.wall_phases_s.search: Input should be a finite number"),
    ("metadata__wall_share_s", "0.1", "metadata.wall_share_s: Input should be a valid number"),
    ("metadata__citations", ["https://x"], "metadata.citations.0: Input should be a valid dictionary"),
    ("metadata__citations", [{"urls": "https://x"}], "metadata.citations.0.urls: Input should be a valid list"),
    ("steps", [{"action": "a", "tool_calls": [], "observation": "", "results": [{"metadata": "x"}], "error": None}],
     "steps.0.results.0.metadata: Input should be a valid dictionary"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 and ":" not in v else (f"{str(v)[:8]}..." if len(str(v)) > 12 else str(v)))
def test_record_numbers_must_be_finite_and_in_range(path, value, why):
    assert trajectory_record_error(_record()) is None
    got = trajectory_record_error(_record(**{path: value}))
    assert got is not None and got.startswith(why), got


def test_negative_zero_and_bounds_are_accepted():
    for over in ({"reward": -0.0}, {"reward": 1_000_000}, {"reward": -1e6}, {"reward": None},
                 {"reward_components__f1": None}, {"timings__search": 0},
                 {"metadata__turns": 10**9}, {"metadata__answer_confidence": 0.0}):
        assert trajectory_record_error(_record(**over)) is None, over


def test_lines_with_absurd_numbers_are_moved_aside_and_never_reach_metrics(bm25_backend, tmp_path, caplog):
    cfg = RolloutConfig(policy="scripted", n=3, out=str(tmp_path / "run"), batch_size=3, plots=False)
    clean = run_rollout(cfg, backend=bm25_backend, progress=False)
    path = tmp_path / "run" / "trajectories.jsonl"
    good = path.read_bytes().splitlines(keepends=True)
    rec = json.loads(good[0])

    def raw(field: str, value: str) -> str:
        """The first record's line with ``field`` (``a.b``) holding ``value`` as raw JSON text."""
        d = json.loads(json.dumps(rec))
        *head, last = field.split(".")
        node = d
        for k in head:
            node = node[k]
        node[last] = "@@value@@"
        return json.dumps(d).replace('"@@value@@"', value)

    text = json.dumps(rec)
    bad = [raw("reward", "NaN"),          # the first task's only record: its episode is redone
           raw("reward", "1e308"),
           raw("reward", "Infinity"),
           raw("reward", "1e400"),        # JSON reads it as inf
           raw("reward", '"NaN"'),
           raw("reward", "1" + "0" * 5000),  # more digits than Python converts to an int
           raw("metadata.turns", "-3"),
           ]
    assert all(b != text for b in bad)
    path.write_bytes("\n".join(bad).encode() + b"\n" + b"".join(good[1:]))
    with caplog.at_level(logging.WARNING, logger="drgym.evaluation.runner"):
        res = run_rollout(cfg, backend=bm25_backend, progress=False)
    assert res.rejected == 7 and res.skipped == 2 and res.new_episodes == 1
    rejected = _lines(tmp_path / "run" / REJECTED_FILE)
    reasons = [r["reason"] for r in rejected]
    assert [r["line"] for r in rejected] == [1, 2, 3, 4, 5, 6, 7]
    assert reasons[0] == reasons[2] == reasons[3] == "reward: Input should be a finite number"
    assert reasons[1].startswith("reward: Input should be less than or equal to 1000000")
    assert reasons[4] == "reward: Input should be a valid number"
    assert reasons[5].startswith("not valid JSON (Exceeds the limit (4300 digits)")
    assert reasons[6].startswith("metadata.turns: Input should be greater than or equal to 0")
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["episodes"] == 3 and m["reward"] == clean.metrics["reward"] and m["f1"] == clean.metrics["f1"]
    assert len(_lines(path)) == 3
    # drgym report's reader leaves such lines out too
    path.write_bytes(path.read_bytes() + bad[1].encode() + b"\n" + bad[5].encode() + b"\n")
    with caplog.at_level(logging.WARNING, logger="drgym.evaluation.runner"):
        eps = read_run_episodes(path)
    assert len(eps) == 3 and all(e["reward"] == r["reward"] for e, r in zip(eps, res.trajectories))
    assert any("2 line(s) are not whole episode records and are left out" in r.getMessage() for r in caplog.records)


def test_an_episode_whose_reward_is_nan_is_not_written(bm25_backend, tmp_path):
    from drgym.records import Reward, RewardOutput

    class NaNReward(Reward):
        name = "nan_reward"

        def score(self, episodes):
            return RewardOutput(scores=[float("nan")] * len(episodes))

    cfg = RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=2, out=str(tmp_path / "run"), batch_size=2,
                        plots=False)
    with pytest.raises(InvalidEpisodeError, match=r"task hotpotqa-\w+\) was not written .*reward: Input should be a finite number"):
        run_rollout(cfg, backend=bm25_backend, progress=False, reward=NaNReward())
    path = tmp_path / "run" / "trajectories.jsonl"
    assert not path.exists() or path.read_bytes() == b""


def test_drgym_rollout_refuses_a_reversed_task_file_in_one_line(hotpot_rows, bm25_backend, monkeypatch, tmp_path):
    import drgym.search.registry as registry
    from typer.testing import CliRunner

    from drgym.cli import app

    # the CLI's "local" backend is the small BM25 engine (as the process cache would hold it)
    monkeypatch.setattr(registry, "_CACHE", {json.dumps(["local", {}], sort_keys=True, default=str): bm25_backend})
    tasks, out = tmp_path / "qs.jsonl", tmp_path / "run"
    _write_tasks(tasks, hotpot_rows[:3])
    args = ["rollout", "--policy", "scripted", "--tasks", str(tasks), "--n", "0", "--out", str(out), "--no-plots",
            "--no-progress"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "3 new episodes, 0 resumed" in first.output
    _write_tasks(tasks, hotpot_rows[:3][::-1])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    [line] = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert "episodes of 2 task(s)" in line and "(qs-0, qs-2)" in line  # the middle line stayed in place
    assert "Traceback" not in res.output


def test_task_hash_is_the_same_in_every_process():
    import os
    import subprocess
    import sys

    code = ("from drgym.records import Task; from drgym.evaluation.run_directory import task_content_sha256; "
            "print(task_content_sha256(Task(task_id='t-0', question='q?', answers=['a'], "
            "metadata={'kinds': {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}, 'n': 1.5})))")
    got = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2", "3")}
    assert len(got) == 1 and len(got.pop()) == 64


def test_report_reads_hand_made_records_but_not_their_absurd_numbers(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text('{"task_id": "t0", "final_answer": "Paris", "reward": 1.0}\n'   # fields missing: a hand-made run
                    '{"task_id": "t1", "reward": NaN}\n'
                    '{"task_id": "t2", "reward_components": {"f1": 1e308}}\n'
                    '{"task_id": "t3", "metadata": {"usage": [{"completion_tokens": -5}]}}\n'
                    '{"task_id": 4, "reward": 0.0}\n'
                    '{"reward": 0.0}\n', encoding="utf-8")
    assert [d["task_id"] for d in read_run_episodes(path)] == ["t0"]
