"""drgym.training.long_run (scripts/long_run.py) keeps the dev evaluations of earlier machines: a restore puts the
committed ones into the new run folder, and a snapshot merges, never drops them."""

from __future__ import annotations

import json
from pathlib import Path

def _long_run(monkeypatch, root: Path):
    from drgym.training import long_run

    monkeypatch.setattr(long_run, "ROOT", root)
    return long_run


def test_evaluations_of_an_earlier_machine_survive_restore_and_snapshot(tmp_path, monkeypatch):
    lr = _long_run(monkeypatch, tmp_path)
    name = "arm"
    res = tmp_path / "training" / "results" / name
    res.mkdir(parents=True)
    (res / "eval_metrics.json").write_text(json.dumps({"step_0": {"f1": 0.3}, "step_25": {"f1": 0.221}}))
    ck = tmp_path / "training" / "checkpoints" / name / "checkpoint-40"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 40}))
    run = tmp_path / "run"
    assert lr.restore(name, run) == "checkpoint-40"
    assert json.loads((run / "eval" / "step_25" / "metrics.json").read_text()) == {"f1": 0.221}
    # this machine evaluates step 50 (and again step 25): the snapshot holds all three, this run's step 25
    for step, f1 in (("step_50", 0.25), ("step_25", 0.2)):
        (run / "eval" / step).mkdir(parents=True, exist_ok=True)
        (run / "eval" / step / "metrics.json").write_text(json.dumps({"f1": f1}))
    lr.snapshot(name, run)
    merged = json.loads((res / "eval_metrics.json").read_text())
    assert merged == {"step_0": {"f1": 0.3}, "step_25": {"f1": 0.2}, "step_50": {"f1": 0.25}}
    assert list(merged) == ["step_0", "step_25", "step_50"]


def test_supervise_restores_then_resumes_the_child_and_snapshots_when_it_ends(tmp_path, monkeypatch, capsys):
    """The command ``python scripts/long_run.py --config NAME`` runs: a checkpoint committed in the
    repository is restored into the empty run folder, so the child is ``drgym train grpo ... --resume``;
    its exit status is returned after a last snapshot."""
    lr = _long_run(monkeypatch, tmp_path / "repo")
    ck = tmp_path / "repo" / "training" / "checkpoints" / "smollm2_breadth_cpu" / "checkpoint-6"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    (ck / "adapter_config.json").write_text("{}")
    started = []

    class Child:
        returncode = 3

        def __init__(self, cmd):
            started.append(cmd)

        def poll(self):
            return self.returncode

    monkeypatch.setattr(lr.subprocess, "Popen", Child)
    run = tmp_path / "run"
    assert lr.supervise("smollm2_breadth_cpu", run_dir=run, max_steps=9) == 3
    assert started == [["drgym", "train", "grpo", "--config", "smollm2_breadth_cpu", "--output-dir", str(run),
                        "--resume", "--max-steps", "9"]]
    assert sorted(p.name for p in (run / "checkpoint-6").iterdir()) == ["adapter_config.json", "trainer_state.json"]
    err = capsys.readouterr().err
    assert "long_run: restored training/checkpoints/smollm2_breadth_cpu/checkpoint-6" in err
    assert 'long_run: snapshot {"step": null, "checkpoint": "checkpoint-6"' in err


def test_a_child_killed_by_sigkill_is_resumed_and_another_exit_ends_the_run(tmp_path, monkeypatch, capsys):
    """The out-of-memory killer ends the child with SIGKILL: it is started again with --resume,
    at most ``restarts`` times; an ordinary failure is not retried."""
    import signal

    lr = _long_run(monkeypatch, tmp_path / "repo")
    (tmp_path / "repo" / "training").mkdir(parents=True)  # a source checkout
    monkeypatch.setattr(lr, "RESTART_PAUSE_S", 0.0)
    codes, started = [-signal.SIGKILL, -signal.SIGKILL, 1, 0], []

    class Child:
        def __init__(self, cmd):
            started.append(cmd)
            self.returncode = codes[len(started) - 1]

        def poll(self):
            return self.returncode

    monkeypatch.setattr(lr.subprocess, "Popen", Child)
    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "checkpoint-4" / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    assert lr.supervise("smollm2_breadth_cpu", run_dir=run, restarts=3) == 1  # the third child failed: no retry
    assert len(started) == 3 and all(cmd[-1] == "--resume" for cmd in started)
    assert capsys.readouterr().err.count("long_run: the run was killed (SIGKILL") == 2
    started.clear()
    codes[:] = [-signal.SIGKILL, -signal.SIGKILL]
    assert lr.supervise("smollm2_breadth_cpu", run_dir=run, restarts=1) == -signal.SIGKILL  # out of restarts
    assert len(started) == 2


def test_drgym_train_long_run_snapshots_into_a_checkout_and_refuses_an_installed_copy(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from drgym.cli import app

    lr = _long_run(monkeypatch, tmp_path / "repo")
    run = tmp_path / "run"
    (run / "eval" / "step_5").mkdir(parents=True)
    (run / "eval" / "step_5" / "metrics.json").write_text(json.dumps({"f1": 0.25}))
    (tmp_path / "repo" / "training").mkdir(parents=True)
    res = CliRunner().invoke(app, ["train", "long-run", "--config", "smollm2_breadth_cpu", "--snapshot",
                                   "--run-dir", str(run)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"step": None, "checkpoint": None,
                                      "files": ["training/results/smollm2_breadth_cpu/eval_metrics.json"]}
    saved = tmp_path / "repo" / "training" / "results" / "smollm2_breadth_cpu" / "eval_metrics.json"
    assert json.loads(saved.read_text()) == {"step_5": {"f1": 0.25}}
    monkeypatch.setattr(lr, "ROOT", tmp_path / "site-packages")  # an installed copy: no training/ beside drgym/
    res = CliRunner().invoke(app, ["train", "long-run", "--config", "smollm2_breadth_cpu", "--snapshot"])
    assert res.exit_code == 2 and "not one: run it from a clone" in res.output
