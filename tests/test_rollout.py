"""The rollout runner on real questions: scripted policy metrics, resume after a kill,
config/metrics files, and an OpenAI-compatible policy end to end through the env."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from drgym.atomic import read_jsonl
from drgym.errors import ConfigError
from drgym.evaluation.metrics import compute_metrics
from drgym.evaluation.runner import RolloutConfig, default_run_name, run_rollout


def test_default_run_name():
    assert default_run_name("drgym/SearchQA-v0", "hotpotqa-dev", "hf:smollm2") == "searchqa-hotpotqa-dev-hf-smollm2"
    assert default_run_name("drgym/DeepResearch-v0", "drb-en", "openai:gpt-4o@http://127.0.0.1:8000/v1") == \
        "deepresearch-drb-en-openai-gpt-4o-127.0.0.1-8000-v1"


def test_compute_metrics_by_hand():
    def traj(tid, answer, em, f1, names, usage, gen=1.0, search=0.5):
        steps = [{"action": "a", "tool_calls": [{"name": n}], "observation": "", "results": []} for n in names]
        return {"task_id": tid, "final_answer": answer, "terminated": answer is not None, "truncated": answer is None,
                "steps": steps, "reward_components": {"em": em, "f1": f1}, "reward": f1,
                "timings": {"generation": gen, "search": search, "env": 0.25, "reward": 0.25},
                "metadata": {"usage": [{"prompt_tokens": 100, "completion_tokens": c} for c in usage], "wall_share_s": 2.0}}

    ts = [traj("a", "Paris", 1.0, 1.0, ["search", "answer"], [10, 4]),
          traj("b", None, 0.0, 0.0, ["search", "invalid", "fetch", "search"], [10, 30, 20, 10]),
          traj("c", "1889", 0.0, 0.5, ["answer"], [6])]
    m = compute_metrics(ts, wall_s=6.0)
    assert m["episodes"] == 3
    assert m["em"] == pytest.approx(1 / 3) and m["f1"] == pytest.approx(0.5)
    assert m["answer_rate"] == pytest.approx(2 / 3)
    assert m["invalid_action_rate"] == pytest.approx(1 / 7)  # 1 invalid of 7 actions
    assert m["turns"] == pytest.approx(7 / 3) and m["searches"] == pytest.approx(1.0) and m["fetches"] == pytest.approx(1 / 3)
    assert m["completion_tokens"] == pytest.approx(90 / 3) and m["prompt_tokens"] == pytest.approx(700 / 3)
    assert m["wall_s_per_episode"] == pytest.approx(2.0) and m["episodes_per_min"] == pytest.approx(30.0)
    assert m["time_share"] == pytest.approx({"generation": 0.5, "search": 0.25, "env": 0.125, "reward": 0.125})
    assert compute_metrics([]) == {"episodes": 0}
    assert m["judge_failures"] == 0


def test_judge_failures_count_every_judged_reward():
    base = {"final_answer": "r", "terminated": True, "steps": [], "metadata": {}}
    ts = [{**base, "task_id": "a", "reward_components": {"race": 0.4, "citation": None}},
          {**base, "task_id": "b", "reward_components": {"race": None, "citation": None, "judge": 1.0}}]
    m = compute_metrics(ts)
    assert m["judge_failures"] == 3  # race once, citation twice; judged scores only
    assert m["scores"]["race"] == pytest.approx(0.4) and m["scores"]["citation"] is None
    # a KPR left undefined by a task without key points is counted apart, not as a judge failure
    ts = [{**base, "task_id": "c", "reward_components": {"kpr": None, "kp_undefined": 1.0}},
          {**base, "task_id": "d", "reward_components": {"kpr": None, "kp_undefined": 0.0}},
          {**base, "task_id": "e", "reward_components": {"kpr": 0.5, "kp_undefined": 0.0}}]
    m = compute_metrics(ts)
    assert m["judge_failures"] == 1 and m["kpr_undefined"] == 1 and m["scores"]["kpr"] == pytest.approx(0.5)


def test_a_judged_reward_needs_a_judge(tmp_path):
    from drgym.errors import ConfigError
    from drgym.rewards import build_reward

    for name in ("race", "kpr", "quality", "llm_match", "fact", "citation"):
        with pytest.raises(ConfigError, match="judge"):
            RolloutConfig(env="drgym/DeepResearch-v0", policy="scripted", rewards=[name], out=str(tmp_path / name)).validate()
        with pytest.raises(ConfigError, match="LLM judge"):
            build_reward({name: {"mode": "recall"}} if name == "citation" else name)
    RolloutConfig(env="drgym/DeepResearch-v0", policy="scripted", rewards=["race"], judge="hf:smollm2").validate()
    assert not (tmp_path / "race").exists()


@pytest.fixture(scope="module")
def scripted_run(default_engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "scripted"
    cfg = RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=8, out=str(out), batch_size=4)
    return run_rollout(cfg, backend=default_engine, progress=False)


def test_scripted_rollout_on_real_hotpotqa_questions(scripted_run):
    """The scripted policy (search the question, fetch the top hit, answer a span) on the
    first 8 HotpotQA questions of hotpotqa-dev over wiki-default."""
    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards.qa import exact_match, token_f1

    res = scripted_run
    out = res.out_dir
    tasks = load_tasks("hotpotqa-dev")[:8]
    lines = read_jsonl(out / "trajectories.jsonl", skip_bad=False)
    assert [d["task_id"] for d in res.trajectories] == [t.task_id for t in tasks]
    assert sorted(d["task_id"] for d in lines) == sorted(t.task_id for t in tasks)
    m = json.loads((out / "metrics.json").read_text())
    assert m["episodes"] == 8 and m["tasks_total"] == 8
    # protocol counts are fixed by the scripted policy: search, fetch, answer
    assert m["answer_rate"] == 1.0 and m["invalid_action_rate"] == 0.0
    assert m["turns"] == 3.0 and m["searches"] == 1.0 and m["fetches"] == 1.0
    assert m["completion_tokens"] == 0  # no model
    # EM/F1 in the metrics are the means of the SQuAD scores of the recorded answers
    ems = [exact_match(d["final_answer"], t.answers) for d, t in zip(res.trajectories, tasks)]
    f1s = [token_f1(d["final_answer"], t.answers) for d, t in zip(res.trajectories, tasks)]
    assert m["em"] == pytest.approx(sum(ems) / 8) and m["f1"] == pytest.approx(sum(f1s) / 8)
    # hand-checked: task 0 asks which demon Lilu is ("a spirit"); question 7 ("Are The
    # Woman's Viewpoint and Pick Me Up! both British publications?") has gold "no", which a
    # capitalised-span heuristic can never produce.
    assert tasks[0].answers == ["a spirit"] and tasks[7].answers == ["no"]
    assert ems[7] == 0.0 and f1s[7] == 0.0
    for d in res.trajectories:
        assert d["steps"][0]["action"] == f"<search> {d['metadata']['question']} </search>"
        assert d["steps"][1]["action"].startswith("<fetch> ") and d["steps"][2]["action"].startswith("<answer> ")
        assert d["metadata"]["answers"] and d["timings"]["search"] > 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["policy"] == "scripted" and cfg["tasks"]["n"] == 8
    assert cfg["backend"]["index"]["corpus"] == "wiki-default" and len(cfg["backend"]["index"]["manifest_fingerprint"]) == 16
    assert {"torch", "gymnasium", "drgym"} <= set(cfg["versions"])
    from drgym.cpu import thread_count

    assert cfg["threads"]["threads"] == thread_count() and cfg["threads"]["omp_wait_policy"]
    assert {p.name for p in out.glob("*.png")} == {"scores.png", "turns.png", "searches.png"}


def test_rerun_resumes_and_refuses_a_different_run(scripted_run, default_engine):
    out = scripted_run.out_dir
    before = (out / "trajectories.jsonl").read_bytes()
    res = run_rollout(RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=10, out=str(out), batch_size=4), backend=default_engine, progress=False)
    assert res.skipped == 8 and res.new_episodes == 2
    after = (out / "trajectories.jsonl").read_bytes()
    assert after.startswith(before) and len(read_jsonl(out / "trajectories.jsonl")) == 10
    with pytest.raises(ConfigError, match="differs in: policy"):
        run_rollout(RolloutConfig(tasks="hotpotqa-dev", policy="rag:smollm2", n=10, out=str(out)), backend=default_engine, progress=False)


def test_a_flagged_judge_is_recorded_in_metrics(default_engine, tmp_path):
    # hf:smollm2 is allowed but flagged; no judged reward runs here (cover_em), so no model loads
    cfg = RolloutConfig(policy="scripted", n=1, out=str(tmp_path / "r"), judge="hf:smollm2", rewards=["cover_em"])
    res = run_rollout(cfg, backend=default_engine, progress=False)
    jm = json.loads((res.out_dir / "metrics.json").read_text())["judge_model"]
    assert jm["spec"] == "hf:smollm2" and jm["valid"] is False and jm["note"].startswith("not a valid judge")
    cfg2 = RolloutConfig(policy="scripted", n=1, out=str(tmp_path / "r2"), judge="openai:m@http://127.0.0.1:9/v1", rewards=["cover_em"])
    jm2 = run_rollout(cfg2, backend=default_engine, progress=False).metrics["judge_model"]
    assert jm2 == {"spec": "openai:m@http://127.0.0.1:9/v1", "valid": True}


def test_bad_config_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="n must be a positive number of tasks"):
        run_rollout(RolloutConfig(policy="scripted", n=0, out=str(tmp_path)))
    with pytest.raises(ConfigError, match="Unknown environment"):
        run_rollout(RolloutConfig(env="drgym/Nope-v0", policy="scripted", out=str(tmp_path)))


def test_resume_after_killed_cli_run(default_engine, session_drgym_home, tmp_path):
    """Start ``drgym rollout`` as a subprocess, SIGKILL it mid-run, rerun: every task is
    present exactly once and every line parses."""
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "drgym", "rollout", "--policy", "scripted", "--n", "20", "--batch-size", "1",
           "--out", str(out), "--no-progress", "--no-plots"]
    env = {**os.environ, "DRGYM_HOME": str(session_drgym_home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    traj = out / "trajectories.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if traj.exists() and traj.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stdout.read().decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    n_killed = len(read_jsonl(traj))
    assert 3 <= n_killed < 20
    cmd[cmd.index("--batch-size") + 1] = "8"  # the batch size may change on resume
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    lines = traj.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]  # no torn line
    ids = [r["task_id"] for r in records]
    assert len(ids) == len(set(ids)) == 20
    from drgym.config import DEFAULT_QA_TASKS
    from drgym.envs.task_loaders import load_tasks

    assert set(ids) == {t.task_id for t in load_tasks(DEFAULT_QA_TASKS)[:20]}
    assert f"{20 - n_killed} new episodes, {n_killed} resumed" in rerun.stdout.replace("\n", " ")
    assert json.loads((out / "metrics.json").read_text())["episodes"] == 20


def test_openai_policy_rollout_through_the_env(default_engine, chat_server, tmp_path):
    """A whole rollout with the OpenAI-compatible policy in text mode against a loopback
    server: the fake model searches the question, then answers with the top title."""
    import re

    def responder(body):
        assert "tools" not in body
        last = body["messages"][-1]["content"]
        if "<information>" in last:
            title = re.search(r"Doc 1 \(Title: (.*?), URL:", last).group(1)
            return f"<answer> {title} </answer>"
        return "<search> " + last.removeprefix("Question: ") + " "  # stop string dropped by the server

    chat_server.responder = responder
    cfg = RolloutConfig(policy=f"openai:fake@{chat_server.url}", n=4, out=str(tmp_path / "oa"), batch_size=4,
                        policy_options={"tools": False})
    res = run_rollout(cfg, backend=default_engine, progress=False)
    m = res.metrics
    assert m["episodes"] == 4 and m["answer_rate"] == 1.0 and m["searches"] == 1.0 and m["invalid_action_rate"] == 0.0
    assert len(chat_server.requests) == 8
    for d in res.trajectories:
        assert d["steps"][0]["action"].endswith("</search>")
        assert d["final_answer"] == d["steps"][0]["results"][0]["title"]


def test_deepresearch_rollout_on_drb_tasks(default_engine, tmp_path):
    """DeepResearch Bench English tasks through drgym/DeepResearch-v0 (scripted policy,
    no judge-based reward so no model is needed): the runner records reports and counts."""
    from drgym.envs.task_loaders import load_tasks

    # No --judge and no --reward: reports are recorded but no judged reward runs.
    cfg = RolloutConfig(env="drgym/DeepResearch-v0", tasks="drb-en", policy="scripted", n=2,
                        out=str(tmp_path / "drb"))
    res = run_rollout(cfg, backend=default_engine, progress=False)
    tasks = load_tasks("drb-en")[:2]
    assert [d["task_id"] for d in res.trajectories] == [t.task_id for t in tasks]
    m = res.metrics
    assert m["episodes"] == 2 and m["answer_rate"] == 1.0 and m["em"] is None and m["f1"] is None
    assert m["searches"] == 1.0 and m["fetches"] == 1.0
    cfg_json = json.loads((tmp_path / "drb" / "config.json").read_text())
    assert cfg_json["env"]["kind"] == "research" and cfg_json["extra_rewards"] == []
    assert all(d["final_answer"] for d in res.trajectories)


def test_unknown_env_option_and_unreadable_tasks_are_named(default_engine, tmp_path):
    from drgym.errors import ConfigError, CorpusError

    cfg = RolloutConfig(policy="scripted", n=1, out=str(tmp_path / "a"), env_options={"nonsense": 1})
    with pytest.raises(ConfigError, match=r"drgym/SearchQA-v0 has no option 'nonsense'; env options: .*max_turns"):
        run_rollout(cfg, backend=default_engine, progress=False)
    junk = tmp_path / "t.jsonl"
    junk.write_text("junk\n")
    cfg = RolloutConfig(policy="scripted", n=1, out=str(tmp_path / "b"), tasks=str(junk))
    with pytest.raises(CorpusError, match=r"t\.jsonl:1 is not valid JSON \(Expecting value: column 1\)"):
        run_rollout(cfg, backend=default_engine, progress=False)


def test_rollout_reads_a_run_file_and_the_command_line_wins(tmp_path, monkeypatch, session_drgym_home, default_engine):
    """``drgym rollout --config run.yaml``: the file's fields are the run; options given on
    the command line override them, and -p adds to its policy_options."""
    from typer.testing import CliRunner

    from drgym.cli import app

    run = tmp_path / "run.yaml"
    run.write_text("policy: scripted\ntasks: hotpotqa-dev\nn: 3\nseed: 7\nplots: false\n"
                   f"out: {tmp_path / 'r'}\npolicy_options: {{fetch: false}}\nenv_options: {{top_k: 2}}\n")
    res = CliRunner().invoke(app, ["rollout", "--config", str(run), "--n", "2", "--no-progress"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["policy"]["name"] == "scripted" and cfg["config"]["n"] == 2 and cfg["config"]["seed"] == 7
    assert cfg["config"]["env_options"] == {"top_k": 2} and cfg["config"]["policy_options"] == {"fetch": False}
    assert not list((tmp_path / "r").glob("*.png"))
    run.write_text("polcy: scripted\n")
    res = CliRunner().invoke(app, ["rollout", "--config", str(run), "--no-progress"])
    assert res.exit_code == 2 and "Did you mean 'policy'" in res.output
    res = CliRunner().invoke(app, ["rollout", "--config", str(tmp_path / "none.yaml"), "--no-progress"])
    assert res.exit_code == 2 and "cannot be read" in res.output
