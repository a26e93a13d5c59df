"""Faults during a run: a search server, a policy endpoint or a judge endpoint that dies.

The rule (drgym.evaluation.faults): clients retry with backoff and wait for a server that
answered before (DRGYM_RECONNECT_S); if it stays down the run stops with exit status 75,
keeps every finished episode, writes none that saw the failure, and a rerun resumes.
The slow tests kill real ``drgym serve`` / judge processes with SIGKILL mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drgym.atomic import read_jsonl
from drgym.cli import app
from drgym.errors import ServiceUnavailableError
from drgym.evaluation.runner import RolloutConfig, run_rollout
from drgym.search.base import SearchBackend
from server_helpers import free_port

TESTS = Path(__file__).resolve().parent
JUDGE_SERVER = TESTS / "_judge_server.py"
DRB_SAMPLE = TESTS / "data" / "drb" / "claude-3-7-sonnet-latest_raw_sample.jsonl"


def _records(path: Path) -> list[dict]:
    """Every line of a JSONL file, parsed (a torn line fails the test)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _episode_view(d: dict) -> tuple:
    """What must be identical between an interrupted-and-resumed run and a clean one."""
    return (d["task_id"], d["final_answer"], d["reward_components"],
            [(s["action"], s["observation"], s["error"]) for s in d["steps"]])


# -- fast: the resume rule, in process --------------------------------------------------
class _DiesAfter(SearchBackend):
    """Passes calls to ``inner`` until ``budget`` calls were made, then raises
    ServiceUnavailableError (a search server that went away) until revived."""

    name = "dies-after"

    def __init__(self, inner: SearchBackend, budget: int) -> None:
        self.inner, self.budget, self.calls = inner, budget, 0

    def _tick(self) -> None:
        self.calls += 1
        if self.calls > self.budget:
            raise ServiceUnavailableError("http: could not reach http://127.0.0.1:1/retrieve (ConnectError) after 4 attempt(s).")

    def search_batch(self, queries, k=10):
        self._tick()
        return self.inner.search_batch(queries, k)

    def fetch(self, url):
        self._tick()
        return self.inner.fetch(url)


def test_search_service_failure_stops_the_run_and_a_rerun_redoes_the_unfinished(bm25_backend, tmp_path):
    cfg = dict(policy="scripted", n=12, batch_size=3, plots=False)
    clean = run_rollout(RolloutConfig(**cfg, out=str(tmp_path / "clean")), backend=bm25_backend, progress=False)
    out = tmp_path / "broken"
    dying = _DiesAfter(bm25_backend, budget=9)  # the scripted policy searches, then fetches: 2 calls per episode
    with pytest.raises(ServiceUnavailableError, match=r"could not reach .* The run stopped: (\d+) of 12 episodes are saved") as ei:
        run_rollout(RolloutConfig(**cfg, out=str(out)), backend=dying, progress=False)
    saved = _records(out / "trajectories.jsonl")
    n_saved = len(saved)
    assert 1 <= n_saved < 12 and f"The run stopped: {n_saved} of 12" in str(ei.value)
    assert all(s["error"] is None for d in saved for s in d["steps"])  # no episode that saw the failure
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == n_saved and metrics["errors"] == 0 and "ServiceUnavailableError" in metrics["stopped"]
    assert ei.value.result.new_episodes == n_saved
    # the service is back: the rerun runs exactly the episodes not written, and the run equals a clean one
    res = run_rollout(RolloutConfig(**cfg, out=str(out)), backend=bm25_backend, progress=False)
    assert res.skipped == n_saved and res.new_episodes == 12 - n_saved
    resumed = _records(out / "trajectories.jsonl")
    assert [d["task_id"] for d in resumed[:n_saved]] == [d["task_id"] for d in saved]
    assert len({d["task_id"] for d in resumed}) == len(resumed) == 12
    assert sorted(map(_episode_view, resumed)) == sorted(map(_episode_view, clean.trajectories))
    assert res.metrics["errors"] == 0 and res.metrics["stopped"] is None


def test_a_failing_query_is_still_an_observation_not_a_stop(bm25_backend, tmp_path):
    """A search error that is not the service going away (here a BackendUnavailableError
    from one batch, e.g. a web page that is down) is shown to the agent and counted."""
    from envs_helpers import FailingBackend

    from drgym.policies.base import Policy

    class Asks(Policy):
        name = "asks-fail"

        def act(self, conversations, infos=None):
            return ["<search> fail here </search>" if len(c) <= 2 else "<answer> x </answer>" for c in conversations]

    res = run_rollout(RolloutConfig(policy="asks-fail", n=2, out=str(tmp_path / "r"), plots=False),
                      policy=Asks(), backend=FailingBackend(bm25_backend), progress=False)
    assert res.metrics["episodes"] == 2 and res.metrics["errors"] == 2 and res.metrics["stopped"] is None


# -- fast: what a newcomer hit (issue 2.1) ---------------------------------------------
def _cli(args: list[str], monkeypatch, **env: str):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return CliRunner().invoke(app, args)


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def test_openai_policy_without_a_server_stops_and_records_nothing(monkeypatch, tmp_path):
    """``--policy openai:...@http://127.0.0.1:PORT/v1`` with nothing listening used to exit 0 with
    100% invalid actions and ``errors: 0``, and a rerun skipped the episodes as done."""
    dead = free_port()
    out = tmp_path / "run"
    args = ["rollout", "--policy", f"openai:Qwen/Qwen3-1.7B@http://127.0.0.1:{dead}/v1", "--backend",
            f"http://127.0.0.1:{free_port()}", "--n", "4", "--out", str(out), "--no-progress", "--no-plots"]
    for _ in range(2):  # the rerun does not skip anything: nothing was recorded as finished
        res = _cli(args, monkeypatch)
        assert res.exit_code == 75, res.output
        [line] = _error_lines(res.output)
        assert f"policy endpoint http://127.0.0.1:{dead}/v1 is not reachable: GET http://127.0.0.1:{dead}/v1/models" in line
        assert "The run stopped: 0 of 4 episodes are saved" in line and "Rerun the same command" in line
        assert "Traceback" not in res.output
        assert not (out / "trajectories.jsonl").exists()
        m = json.loads((out / "metrics.json").read_text())
        assert m["episodes"] == 0 and "ServiceUnavailableError" in m["stopped"]


def test_search_server_not_running_stops_the_run(monkeypatch, tmp_path):
    dead = free_port()
    res = _cli(["rollout", "--policy", "scripted", "--backend", f"http://127.0.0.1:{dead}", "--n", "3",
                "--out", str(tmp_path / "r"), "--no-progress", "--no-plots"], monkeypatch)
    assert res.exit_code == 75, res.output
    [line] = _error_lines(res.output)
    assert f"could not reach http://127.0.0.1:{dead}/health" in line and "0 of 3 episodes are saved" in line


def test_options_are_checked_before_anything_loads(monkeypatch, tmp_path):
    """A bad policy, option or k is refused before the index, the encoder or a model is
    loaded: the loaders fail the test if they are called."""
    import drgym.embedding
    import drgym.evaluation.compare
    import drgym.evaluation.judged
    import drgym.judges.local
    import drgym.models
    import drgym.policies.hf
    import drgym.rewards.registry
    import drgym.search.local
    import drgym.search.registry

    def must_not_load(*a, **k):
        raise AssertionError("loaded before the options were checked")

    # each loader is patched where it is defined and where a module imported it by name
    for module in (drgym.search.registry, drgym.evaluation.compare, drgym.evaluation.judged, drgym.rewards.registry):
        monkeypatch.setattr(module, "make_backend", must_not_load)
    monkeypatch.setattr(drgym.search.local.LocalSearchEngine, "from_corpus", must_not_load)
    monkeypatch.setattr(drgym.search.local.LocalSearchEngine, "open", must_not_load)
    for module in (drgym.models, drgym.policies.hf, drgym.judges.local):
        monkeypatch.setattr(module, "load_causal_lm", must_not_load)
    monkeypatch.setattr(drgym.models, "convert_smollm2", must_not_load)
    monkeypatch.setattr(drgym.embedding.Encoder, "__init__", must_not_load)
    out = str(tmp_path / "r")
    cases = [
        (["rollout", "--policy", "bogus:x"], "Unknown policy kind 'bogus'"),
        (["rollout", "--policy", "hf:smollm2", "-p", "max_tokens=8"], "HFPolicy has no option 'max_tokens'"),
        (["rollout", "--policy", "hf:/no/such/model"], "model folder '/no/such/model' does not exist"),
        (["rollout", "--policy", "hf:Qwen/Qwen3-1.7B"], "not in the local Hugging Face cache"),
        (["rollout", "--policy", "openai:m@ftp://x"], "must start with http:// or https://"),
        (["rollout", "--policy", "rag:smollm2", "-p", "k=2", "-p", "nope=1"], "HFPolicy has no option 'nope'"),
        (["rollout", "--policy", "scripted", "-e", "top_k=-1"], "top_k must be an integer >= 1, got -1"),
        (["rollout", "--policy", "scripted", "-e", "topk=3"], "has no option 'topk'"),
        (["rollout", "--policy", "scripted", "--backend", "bogus"], "Unknown search backend 'bogus'"),
        (["rollout", "--policy", "scripted", "--reward", "nope"], "Unknown reward 'nope'"),
        (["rollout", "--policy", "scripted", "--judge", "gpt4"], "Unknown judge backend"),
        (["search", "who wrote Hamlet", "-k", "-1"], "k must be between 1"),
        (["search", "who wrote Hamlet", "--method", "dense2"], "Unknown search method 'dense2'"),
        (["index", "build", "--corpus", "hotpotqa", "--encoder", "intfloat/e5-base-v2", "--root", out],
         "encoder 'intfloat/e5-base-v2' is not a local folder and not in the local Hugging Face cache"),
    ]
    for args, needle in cases:
        if args[0] == "rollout":
            args = [*args, "--n", "2", "--out", out, "--no-progress"]
        res = _cli(args, monkeypatch, HF_HUB_OFFLINE="1")
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output, (args, res.output)
        assert "Traceback" not in res.output and "loaded before" not in res.output, (args, res.output)
    assert not Path(out).exists()  # no empty run directory either


# -- slow: a real drgym serve killed mid-rollout -----------------------------------------
def _start_server(port: int, log: Path) -> subprocess.Popen:
    from server_helpers import _wait_healthy

    with open(log, "ab") as f:
        proc = subprocess.Popen([sys.executable, "-m", "drgym", "serve", "--corpus", "hotpotqa", "--port", str(port),
                                 "--cache-size", "0"], stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _wait_healthy(f"http://127.0.0.1:{port}", 600, lambda: proc.poll() is None)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def _wait_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"the rollout ended (or stalled) before {n} episodes: {proc.poll()}")


N_TASKS = 79  # every hotpotqa-dev question: a scripted episode over HTTP takes ~50 ms


@pytest.fixture(scope="module")
def reference_run(hotpotqa_engine, tmp_path_factory):
    """The same run without faults, in process over the same index."""
    out = tmp_path_factory.mktemp("ref") / "run"
    res = run_rollout(RolloutConfig(policy="scripted", backend="local:hotpotqa", n=N_TASKS, out=str(out), plots=False),
                      backend=hotpotqa_engine, progress=False)
    return {d["task_id"]: _episode_view(d) for d in res.trajectories}


def _rollout_cmd(port: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "drgym", "rollout", "--policy", "scripted", "--backend", f"http://127.0.0.1:{port}",
            "--n", str(N_TASKS), "--batch-size", "2", "--out", str(out), "--no-progress", "--no-plots"]


@pytest.mark.slow
def test_search_server_killed_mid_rollout_comes_back_and_the_run_goes_on(reference_run, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    server = _start_server(port, log)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DRGYM_RECONNECT_S": "300"}
    run = subprocess.Popen(_rollout_cmd(port, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        traj = out / "trajectories.jsonl"
        _wait_lines(traj, 5, run)
        _kill(server)
        at_kill = len(read_jsonl(traj))
        assert at_kill < N_TASKS and run.poll() is None
        time.sleep(2.0)  # the client meets a refused connection and backs off
        server = _start_server(port, log)  # same port; loads the index again
        stdout, stderr = run.communicate(timeout=900)
    finally:
        _kill(run)
        _kill(server)
    assert run.returncode == 0, stderr[-3000:]
    assert "attempt 1 failed" in stderr and "retrying" in stderr  # the outage was met, and waited out
    records = _records(traj)
    assert len(records) == len({d["task_id"] for d in records}) == N_TASKS  # none lost, none twice
    assert {d["task_id"]: _episode_view(d) for d in records} == reference_run
    assert json.loads((out / "metrics.json").read_text())["errors"] == 0


@pytest.mark.slow
def test_search_server_that_stays_down_stops_the_run_and_a_rerun_resumes(reference_run, tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    server = _start_server(port, log)
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DRGYM_RECONNECT_S": "3"}
    run = subprocess.Popen(_rollout_cmd(port, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        traj = out / "trajectories.jsonl"
        _wait_lines(traj, 5, run)
        _kill(server)
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 75, stderr[-3000:]
        [line] = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
        saved = _records(traj)
        n = len(saved)
        assert f"could not reach http://127.0.0.1:{port}" in line and f"The run stopped: {n} of {N_TASKS}" in line
        assert 5 <= n < N_TASKS and len({d["task_id"] for d in saved}) == n
        assert all(s["error"] is None for d in saved for s in d["steps"])
        server = _start_server(port, log)
        rerun = subprocess.run(_rollout_cmd(port, out), env=env, capture_output=True, text=True, timeout=900)
    finally:
        _kill(run)
        _kill(server)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"{N_TASKS - n} new episodes, {n} resumed" in rerun.stdout.replace("\n", " ")
    records = _records(traj)
    assert [d["task_id"] for d in records[:n]] == [d["task_id"] for d in saved]  # appended after, never rewritten
    assert len(records) == len({d["task_id"] for d in records}) == N_TASKS
    assert {d["task_id"]: _episode_view(d) for d in records} == reference_run


# -- a judge endpoint killed mid drgym evaluate -------------------------------------------
def _start_judge(port: int, log: Path, delay_s: float = 0.15) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen([sys.executable, str(JUDGE_SERVER), str(port), str(delay_s), str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError("the fake judge did not start")


def _evaluate(port: int, tmp: Path, name: str, reconnect_s: str) -> tuple[list[str], dict]:
    args = [sys.executable, "-m", "drgym", "evaluate", "--reports", str(DRB_SAMPLE), "--metrics", "quality",
            "--judge", f"openai:fake-judge@http://127.0.0.1:{port}/v1", "--cache", str(tmp / "cache.sqlite"),
            "--out", str(tmp / f"{name}.jsonl"), "--summary", str(tmp / f"{name}.json"), "--concurrency", "1",
            "--batch-size", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DRGYM_RECONNECT_S": reconnect_s}
    return args, env


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@pytest.mark.slow
def test_judge_killed_mid_evaluate_comes_back_and_evaluate_goes_on(tmp_path):
    port = free_port()
    requests = tmp_path / "requests.log"
    # reference: no fault, its own cache
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    judge = _start_judge(port, requests)
    try:
        args, env = _evaluate(port, ref_dir, "items", "300")
        ref = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert ref.returncode == 0, ref.stderr[-3000:]
        n_ref = _lines(requests)
        assert n_ref == 18  # 3 reports x 6 quality criteria
        args, env = _evaluate(port, tmp_path, "items", "300")
        run = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while _lines(requests) < n_ref + 6 and run.poll() is None:
            time.sleep(0.01)
        _kill(judge)
        assert run.poll() is None
        time.sleep(2.0)
        judge = _start_judge(port, requests)
        _, stderr = run.communicate(timeout=600)
    finally:
        _kill(judge)
    assert run.returncode == 0, stderr[-3000:]
    assert "failures 0" in stderr
    ref_rows = _records(ref_dir / "items.jsonl")
    assert _records(tmp_path / "items.jsonl") == ref_rows  # every report scored, as without the fault
    assert json.loads((tmp_path / "items.json").read_text())["summary"] == json.loads((ref_dir / "items.json").read_text())["summary"]


@pytest.mark.slow
def test_judge_that_stays_down_stops_evaluate_and_a_rerun_resumes_from_the_cache(tmp_path):
    port = free_port()
    requests = tmp_path / "requests.log"
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    judge = _start_judge(port, requests)
    try:
        args, env = _evaluate(port, ref_dir, "items", "2")
        assert subprocess.run(args, env=env, capture_output=True, timeout=600).returncode == 0
        n_ref = _lines(requests)
        args, env = _evaluate(port, tmp_path, "items", "2")
        run = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while _lines(requests) < n_ref + 8 and run.poll() is None:
            time.sleep(0.01)
        _kill(judge)
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 75, stderr[-3000:]
        assert "judge openai:fake-judge is unreachable" in stderr and "Rerun the same command" in stderr
        assert not (tmp_path / "items.jsonl").exists()  # no partial output file
        judged_before = _lines(requests) - n_ref
        judge = _start_judge(port, requests)
        before_rerun = _lines(requests)
        rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    finally:
        _kill(judge)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    # the verdicts judged before the kill come from the cache: only the rest is asked
    asked_again = _lines(requests) - before_rerun
    assert asked_again == n_ref - (judged_before - 1) or asked_again == n_ref - judged_before
    assert f"cache hits {n_ref - asked_again}" in rerun.stderr
    assert _records(tmp_path / "items.jsonl") == _records(ref_dir / "items.jsonl")


# -- drgym train grpo killed at step k, then --resume ------------------------------------------
def _grpo_yaml(tmp: Path) -> Path:
    """The tiniest GRPO run of tests/test_training_grpo.py (one trainable layer, 2 questions
    x 2 rollouts of 8-token turns) as a YAML file for the CLI, checkpointing every step."""
    import yaml

    from drgym.training.config import resolve_config_path

    data = yaml.safe_load(resolve_config_path("searchqa_smollm2_cpu").read_text(encoding="utf-8"))
    data.update({
        "trainable_layers": 1, "torch_threads": 1,
        "tasks": {"train": {"set": "hotpotqa-dev", "start": 0, "limit": 4}, "eval": {"set": "hotpotqa-dev", "start": 60, "limit": 2}},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_completion_tokens": 256, "gen_batch_size": 4},
        "env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 1, "max_obs_tokens": 40, "max_fetches": 0}},
        "eval": {"every_steps": 0, "num_tasks": 2, "max_turns": 2},
    })
    data["grpo"].update({"max_steps": 4, "per_device_train_batch_size": 4, "num_generations": 2, "save_strategy": "steps",
                         "save_steps": 1, "save_total_limit": None, "report_to": "none", "logging_steps": 1,
                         "learning_rate": 1e-4, "shuffle_dataset": True, "seed": 3})
    p = tmp / "tiny.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


def _train(cfg: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "drgym", "train", "grpo", "--config", str(cfg), "--output-dir", str(out), *extra]


def _steps(path: Path, key: str) -> dict[int, object]:
    """step -> the value of ``key`` in a JSONL log (the last record of a step wins, as drgym plot reads it)."""
    out: dict[int, object] = {}
    for r in read_jsonl(path):
        if key in r:
            out[r["step"]] = r[key]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])  # mid-epoch and at the epoch boundary (2 steps per epoch)
def test_grpo_killed_at_step_k_resumes_with_the_batch_an_uninterrupted_run_draws(hotpotqa_engine, tmp_path, k):
    cfg = _grpo_yaml(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    full = subprocess.run(_train(cfg, tmp_path / "full"), env=env, capture_output=True, text=True, timeout=1800)
    assert full.returncode == 0, full.stderr[-3000:]
    out = tmp_path / "killed"
    run = subprocess.Popen(_train(cfg, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 1800
        while not (out / f"checkpoint-{k}" / "trainer_state.json").exists():
            assert run.poll() is None and time.time() < deadline, "the run ended before its checkpoint"
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)  # not Ctrl-C: no handler runs
        run.wait(timeout=60)
    finally:
        _kill(run)
    assert not (out / "final").exists() and not (out / f"checkpoint-{k + 1}" / "trainer_state.json").exists()
    resumed = subprocess.run(_train(cfg, out, "--resume"), env=env, capture_output=True, text=True, timeout=1800)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["resumed_from"].endswith(f"checkpoint-{k}")
    # the step after the checkpoint drew the same questions, in the same order, as the uninterrupted run
    full_batches, batches = _steps(tmp_path / "full" / "batches.jsonl", "task_ids"), _steps(out / "batches.jsonl", "task_ids")
    assert list(full_batches) == [1, 2, 3, 4] and sorted(batches) == [1, 2, 3, 4]
    assert batches == full_batches
    assert full_batches[1] != full_batches[3]  # epochs are shuffled differently (seed 3): the check can fail
    # and logged the same rewards (the first logged after the resume, and the rest)
    for key in ("reward", "rewards/f1/mean", "rewards/format/mean", "completions/mean_length"):
        want, got = _steps(tmp_path / "full" / "metrics.jsonl", key), _steps(out / "metrics.jsonl", key)
        assert [got[s] for s in range(k + 1, 5)] == [want[s] for s in range(k + 1, 5)], key
