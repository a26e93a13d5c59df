"""What a rollout run leaves for a person: ``answers.md`` (each question beside the
agent's answer and the gold, with its line in ``trajectories.jsonl``), the summary's
list of files, wall-time shares that a resume does not change, no ``run.lock`` after
the run, and plain progress lines when the output is not a terminal.

Runs the scripted policy (search the question, fetch the top hit, answer a span) on the
first HotpotQA questions of ``hotpotqa-dev`` over the small bm25 test backend (seconds).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from drgym.cli import app
from drgym.envs.task_loaders import load_tasks
from drgym.errors import ConfigError
from drgym.evaluation.runner import RolloutConfig, RunDirectory, RunLockedError, run_rollout
from drgym.rewards.qa import exact_match, token_f1

ROW = re.compile(r"^\| (\d+) \| (.*) \| (.*) \| (.*) \| (yes|no|-) \| ([0-9.]+|-) \| (\d+) \| (\d+) \|$")


def _rows(path: Path) -> list[tuple[str, ...]]:
    return [m.groups() for line in path.read_text(encoding="utf-8").splitlines() if (m := ROW.match(line))]


def _unescape(cell: str) -> str:
    return cell.replace("&lt;", "<").replace("\\|", "|").replace("\\\\", "\\")


def test_answers_md_has_one_row_per_question_and_is_regenerated_on_resume(bm25_backend, tmp_path):
    out = tmp_path / "run"
    tasks = load_tasks("hotpotqa-dev")[:6]
    res = run_rollout(RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=4, out=str(out), batch_size=2, plots=False),
                      backend=bm25_backend, progress=False)
    assert [p.name for p in res.files] == ["config.json", "trajectories.jsonl", "metrics.json", "answers.md"]
    text = (out / "answers.md").read_text(encoding="utf-8")
    assert text.startswith("# Answers: scripted on hotpotqa-dev (drgym/SearchQA-v0)\n")
    rows = _rows(out / "answers.md")
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
    lines = (out / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    for (idx, question, answer, gold, correct, f1, searches, line), task in zip(rows, tasks):
        rec = json.loads(lines[int(line) - 1])  # the row's line is that task's episode
        assert rec["task_id"] == task.task_id
        assert _unescape(question) == " ".join(task.question.split())
        assert _unescape(answer) == " ".join(rec["final_answer"].split())
        assert _unescape(gold) == " / ".join(task.answers)
        assert correct == ("yes" if exact_match(rec["final_answer"], task.answers) == 1.0 else "no")
        assert float(f1) == pytest.approx(token_f1(rec["final_answer"], task.answers), abs=0.005)
        assert int(searches) == 1  # the scripted policy searches once
    # task 0 of hotpotqa-dev asks which demon Lilu is; its gold is "a spirit"
    assert rows[0][3] == "a spirit"
    right = sum(r[4] == "yes" for r in rows)
    assert f"4 of 4 questions answered by an episode; {right} of 4 correct (exact match)" in text

    # a resume rewrites the file whole: every task of the run, the new ones' lines after the old
    res2 = run_rollout(RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=6, out=str(out), batch_size=2, plots=False),
                       backend=bm25_backend, progress=False)
    assert res2.skipped == 4 and res2.new_episodes == 2
    rows2 = _rows(out / "answers.md")
    assert [int(r[0]) for r in rows2] == [1, 2, 3, 4, 5, 6]
    assert rows2[:4] == rows
    lines = (out / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(int(r[7]) for r in rows2[4:]) == [5, 6]
    assert {json.loads(lines[int(r[7]) - 1])["task_id"] for r in rows2[4:]} == {tasks[4].task_id, tasks[5].task_id}
    assert "6 of 6 questions answered" in (out / "answers.md").read_text(encoding="utf-8")

    # a rerun with nothing to do gives the same wall-time shares as the run it read (one source: the records)
    m_before = json.loads((out / "metrics.json").read_text())
    res3 = run_rollout(RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=6, out=str(out), batch_size=2, plots=False),
                       backend=bm25_backend, progress=False)
    assert res3.new_episodes == 0 and [p.name for p in res3.files] == ["metrics.json", "answers.md"]
    m_after = json.loads((out / "metrics.json").read_text())
    assert m_after["wall_share"] == m_before["wall_share"] and m_after["wall_share_episodes"] == 6
    assert sum(m_after["wall_share"].values()) == pytest.approx(1.0)
    assert m_after["wall_phases_s"]["search"] > 0 and m_after["wall_phases_s"]["generation"] >= 0
    # the phases add up to the run's wall time (both shared out of the same flushes)
    assert sum(m_after["wall_phases_s"].values()) == pytest.approx(m_after["wall_s"], rel=1e-3, abs=1e-3)


def test_answers_md_marks_cells_that_would_break_the_table(tmp_path):
    from drgym.evaluation.answers import render_answers

    rows = [{"index": 1, "task_id": "t", "question": "a | b\nc <b>", "answer": None, "gold": [], "em": None,
             "f1": None, "searches": 0, "line": 3, "failed": []},
            {"index": 2, "task_id": "u", "question": "q", "answer": "x" * 500, "gold": ["g1", "g2"], "em": 1.0,
             "f1": 1.0, "searches": 2, "line": 1, "failed": ["search AuthError (HTTP 401)"]}]
    text = render_answers(rows, title="p on t", total=3)
    parsed = [m.groups() for line in text.splitlines() if (m := ROW.match(line))]
    assert parsed[0] == ("1", "a \\| b c &lt;b>", "(no answer)", "-", "-", "-", "0", "3")
    assert parsed[1] == ("2", "q", "(failed: search AuthError (HTTP 401))", "g1 / g2", "yes", "1.00", "2", "1")
    assert "2 of 3 questions answered by an episode; 1 of 1 correct (exact match), mean F1 1.000." in text


def test_no_lock_file_after_a_run_finished_or_failed(bm25_backend, tmp_path):
    out = tmp_path / "run"
    run_rollout(RolloutConfig(policy="scripted", n=2, out=str(out), batch_size=2, plots=False),
                backend=bm25_backend, progress=False)
    assert not (out / "run.lock").exists()
    # an error inside the held directory (another run's options) removes it too
    with pytest.raises(ConfigError, match="holds a different run"):
        run_rollout(RolloutConfig(policy="scripted", n=2, out=str(out), batch_size=2, plots=False, seed=7),
                    backend=bm25_backend, progress=False)
    assert not (out / "run.lock").exists()
    # while a run holds it, the file is there with its pid, and a second writer is refused
    with RunDirectory(out) as held:
        assert held.lock_path.read_text().strip().isdigit()
        with pytest.raises(RunLockedError):
            RunDirectory(out)
    assert not (out / "run.lock").exists()


def test_a_lock_on_a_removed_lock_file_is_not_taken(tmp_path, monkeypatch):
    """A run that ends between another's open and its flock removes the file the other
    opened; if a third run has meanwhile made a new file there and locked it, the second
    must not count its lock on the old file as holding the directory."""
    import fcntl
    import os

    out = tmp_path / "run"
    out.mkdir()
    lock = out / "run.lock"
    lock.write_text("")
    real_flock = fcntl.flock
    third: list[int] = []

    def racing_flock(fd, op):
        if not third and op & fcntl.LOCK_EX:
            lock.unlink()  # the first run ends and removes its file ...
            fd3 = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)  # ... and a third run takes a new one
            real_flock(fd3, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.pwrite(fd3, b"424242\n", 0)
            third.append(fd3)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", racing_flock)
    try:
        with pytest.raises(RunLockedError, match="process 424242") as ei:
            RunDirectory(out)
        assert ei.value.pid == 424242
    finally:
        monkeypatch.undo()
        for fd in third:
            os.close(fd)


def test_progress_lines_when_the_output_is_not_a_terminal(bm25_backend, tmp_path, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    buf = io.StringIO()
    console = Console(file=buf, markup=False)
    assert not console.is_terminal
    run_rollout(RolloutConfig(policy="scripted", n=7, out=str(tmp_path / "run"), batch_size=1, plots=False),
                backend=bm25_backend, progress=True, console=console)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("[start] scripted: 0/7 episodes, ")
    progress = [ln for ln in lines if ln.startswith("[progress] ")]
    assert progress and progress[0].startswith("[progress] scripted: 5/7 episodes, ")
    assert "left" in progress[0] and "F1 " in progress[0]
    assert lines[-1].startswith("[end] scripted: 7/7 episodes, ")
    assert not any("\x1b[" in ln for ln in lines)  # plain text, no terminal codes


def test_cli_summary_lists_the_files_and_progress_reaches_a_pipe(bm25_backend, tmp_path, monkeypatch):
    import drgym.evaluation.rollout_loop as rollout_loop

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.setattr(rollout_loop, "get_backend", lambda spec: bm25_backend)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["rollout", "--policy", "scripted", "--n", "6", "--batch-size", "2",
                                   "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    assert ("Wrote: config.json (how to rerun it), trajectories.jsonl (every episode, one per line), "
            "metrics.json (the scores and counts above), answers.md (each question, the answer, the gold).") \
        in " ".join(res.output.split())
    assert "[progress] scripted: " in res.output and "[end] scripted: 6/6 episodes" in res.output
    assert not (out / "run.lock").exists() and (out / "answers.md").exists()


def test_progress_gives_no_estimate_before_a_batch_has_ended(monkeypatch):
    """Episodes stepped together end together: an estimate from the first one to end
    would be the batch size times too long."""
    from types import SimpleNamespace

    from drgym.evaluation import rollout_loop

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setattr(rollout_loop, "PROGRESS_EVERY_S", 0.0)  # a line at every episode
    buf = io.StringIO()
    bar = rollout_loop._Progress(16, 0, enabled=True, console=Console(file=buf, markup=False), label="p", batch=8)
    bar.start()
    for _ in range(8):
        bar.advance(SimpleNamespace(reward_components={"f1": 0.5}))
    bar.stop()
    lines = buf.getvalue().splitlines()
    assert lines[1].startswith("[progress] p: 1/16 episodes") and "left" not in lines[1]
    assert lines[7].startswith("[progress] p: 7/16 episodes") and "left" not in lines[7]
    assert lines[8].startswith("[progress] p: 8/16 episodes") and "left" in lines[8] and "F1 0.500" in lines[8]
    assert lines[-1].startswith("[end] p: 8/16 episodes")


def test_an_interrupted_run_lists_the_files_it_wrote(tmp_path, monkeypatch):
    """Ctrl-C: the summary of what was saved still names the files."""
    import drgym.evaluation.runner as runner
    from drgym.evaluation.rollout_loop import RunResult

    out = tmp_path / "run"
    result = RunResult(out_dir=out, metrics={"episodes": 2}, trajectories=[], new_episodes=2,
                       files=[out / "trajectories.jsonl", out / "metrics.json", out / "answers.md"])

    def interrupted(*a, **k):
        raise KeyboardInterrupt(result)

    monkeypatch.setattr(runner, "run_rollout", interrupted)
    res = CliRunner().invoke(app, ["rollout", "--policy", "scripted", "--n", "2", "--out", str(out), "--no-plots"])
    assert res.exit_code == 130, res.output
    assert ("Wrote: trajectories.jsonl (every episode, one per line), metrics.json (the scores and counts above), "
            "answers.md (each question, the answer, the gold).") in " ".join(res.output.split())


def test_fresh_discards_the_old_answers_with_the_old_episodes(bm25_backend, tmp_path):
    out = tmp_path / "run"
    run_rollout(RolloutConfig(policy="scripted", n=2, out=str(out), batch_size=2, plots=False),
                backend=bm25_backend, progress=False)
    assert (out / "answers.md").exists()
    with RunDirectory(out, fresh=True):
        assert not (out / "answers.md").exists() and not (out / "trajectories.jsonl").exists()
