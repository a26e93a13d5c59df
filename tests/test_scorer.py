"""drgym.rewards.Scorer: one failure policy and one merge for every place that scores
(the env's episode end, the rollout runner, ``drgym evaluate``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drgym.errors import ConfigError, ServiceUnavailableError
from drgym.records import Episode, Reward, RewardOutput, Task
from drgym.rewards import Scorer
from drgym.rewards.qa import F1, ExactMatch, cover_exact_match, exact_match, token_f1

SAMPLE = Path(__file__).parent / "data" / "drb" / "claude-3-7-sonnet-latest_raw_sample.jsonl"
PARIS = Task(task_id="q1", question="Capital of France?", answers=["Paris"])
EIFFEL = Task(task_id="q2", question="Who built the tower?", answers=["Gustave Eiffel"])


class Broken(Reward):
    name = "broken"

    def __init__(self, exc: Exception | None = None) -> None:
        self.exc = exc or RuntimeError("judge down")

    def score(self, episodes):
        raise self.exc


class Fixed(Reward):
    """Returns fixed scores and components (shapes as given)."""

    def __init__(self, name, scores, components):
        self.name, self.scores, self.components = name, scores, components

    def score(self, episodes):
        return RewardOutput(scores=list(self.scores), components=dict(self.components))


def eps():
    return [Episode(PARIS, "paris."), Episode(EIFFEL, "Gustave Eiffel, the engineer")]


def test_a_failing_reward_is_none_and_recorded_while_the_others_score(caplog):
    with caplog.at_level(logging.WARNING, logger="drgym.rewards.scorer"):
        out = Scorer([ExactMatch(), Broken(), F1()]).score(eps())
    assert [s.scores for s in out] == [{"em": 1.0, "broken": None, "f1": 1.0}, {"em": 0.0, "broken": None, "f1": 0.8}]
    assert [s.errors for s in out] == [{"broken": "RuntimeError: judge down"}] * 2
    assert out[0].components == {"em": 1.0, "f1": 1.0}  # nothing from the reward that raised
    [rec] = caplog.records
    assert "reward broken failed on 2 episode(s) (q1, q2): RuntimeError: judge down" in rec.getMessage()
    # a reward that returns the wrong number of scores is a failure too, not a shifted score
    [s] = Scorer(Fixed("short", [], {})).score([Episode(PARIS, "x")])
    assert s.scores == {"short": None} and s.errors == {"short": "ValueError: returned 0 scores for 1 episodes"}


def test_service_unavailable_propagates_unless_told_to_record_it():
    with pytest.raises(ServiceUnavailableError, match="endpoint down"):
        Scorer([ExactMatch(), Broken(ServiceUnavailableError("endpoint down"))]).score(eps())
    [s, _] = Scorer(Broken(ServiceUnavailableError("endpoint down")), stop_on=()).score(eps())
    assert s.scores == {"broken": None} and s.errors == {"broken": "ServiceUnavailableError: endpoint down"}
    with pytest.raises(ConfigError):
        Scorer(Broken(ConfigError("bad criteria")), stop_on=(ConfigError,)).score(eps())
    assert Scorer(Broken()).score([]) == []


def test_components_merge_in_reward_order_and_labels():
    a = Fixed("a", [0.5, 0.25], {"a": [0.9, 0.8], "shared": [1.0, 2.0]})
    b = Fixed("b", [None, 1.0], {"shared": [3.0, 4.0], "only_b": [7.0]})  # only_b is short: None, not dropped
    out = Scorer({"first": a, "second": b}).score(eps())
    assert [s.scores for s in out] == [{"first": 0.5, "second": None}, {"first": 0.25, "second": 1.0}]
    assert [s.components for s in out] == [{"a": 0.9, "shared": 3.0, "only_b": 7.0},
                                           {"a": 0.8, "shared": 4.0, "only_b": None}]
    assert Scorer([a, b]).names == ["a", "b"] and Scorer(a).names == ["a"]


def test_env_reward_keeps_its_components_and_records_errors(bm25_backend):
    import gymnasium as gym

    import drgym.envs  # noqa: F401  (registers the envs)

    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[EIFFEL],
                   reward=Fixed("kpr", [0.25], {"kpr": [0.5], "kpc": [0.25]}))
    env.reset(options={"task_id": "q2"})
    *_, r, _, _, info = env.step("<answer>Gustave Eiffel</answer>")
    # a component named like the reward wins over its score in the env (as before)
    assert r == 0.25 and info["reward_components"] == {"kpr": 0.5, "kpc": 0.25}
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[EIFFEL],
                   reward=Broken(ServiceUnavailableError("judge endpoint down")))
    env.reset(options={"task_id": "q2"})
    *_, r, _, _, info = env.step("<answer>Gustave Eiffel</answer>")
    assert r == 0.0 and info["reward_components"] == {"broken": None}
    assert info["trajectory"].reward is None
    assert info["trajectory"].metadata["reward_error"] == "ServiceUnavailableError: judge endpoint down"


def test_rollout_records_the_qa_metrics_and_extra_rewards_as_before(default_engine, tmp_path, monkeypatch):
    """``drgym rollout --policy scripted -n 3`` with two extra rewards, one failing: the
    recorded components equal the qa functions' values computed directly."""
    import drgym.evaluation.rollout_loop as rollout_loop
    import drgym.evaluation.runner as runner
    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards.length import LengthGuard

    monkeypatch.setattr(rollout_loop, "_reward_objects", lambda cfg, kind, backend=None: [LengthGuard(max_tokens=1), Broken()])
    cfg = runner.RolloutConfig(tasks="hotpotqa-dev", policy="scripted", n=3, out=str(tmp_path / "run"), batch_size=3)
    res = runner.run_rollout(cfg, backend=default_engine, progress=False)
    tasks = load_tasks("hotpotqa-dev")[:3]
    assert [d["task_id"] for d in res.trajectories] == [t.task_id for t in tasks]
    length = LengthGuard(max_tokens=1)
    for d, t in zip(res.trajectories, tasks):
        ans = d["final_answer"] or ""
        lo = length.score([Episode(t, ans)])
        assert d["reward_components"] == {
            "f1": token_f1(ans, t.answers), "em": exact_match(ans, t.answers), "cover_em": cover_exact_match(ans, t.answers),
            "length": lo.scores[0], "length_tokens": lo.components["length_tokens"][0],
            "length_penalty": lo.components["length_penalty"][0], "broken": None,
        }
        assert d["reward"] == token_f1(ans, t.answers)  # the env's default reward
        assert d["metadata"]["reward_errors"] == ["broken: RuntimeError: judge down"]
    assert all(d["final_answer"] for d in res.trajectories)  # the scripted policy answered a span each time
    assert any(d["reward_components"]["length_penalty"] < 0 for d in res.trajectories)
    m = json.loads((res.out_dir / "metrics.json").read_text())
    ems = [exact_match(d["final_answer"] or "", t.answers) for d, t in zip(res.trajectories, tasks)]
    assert m["em"] == pytest.approx(sum(ems) / 3)


def test_evaluate_records_a_failing_metric_and_scores_the_others(tmp_path, monkeypatch):
    from drgym.cli import app
    from drgym.judges.base import Judge

    class FakeJudge(Judge):
        model_id = "openai:fake"

        def complete(self, messages, **kw):
            return '{"score": 4}'

    import drgym.judges.factory as factory
    import drgym.rewards.registry as registry

    real = registry.build_reward
    monkeypatch.setattr(factory, "make_judge", lambda spec, **kw: FakeJudge(cache=False))
    monkeypatch.setattr(registry, "build_reward", lambda spec, **kw: Broken() if "race" in spec else real(spec, **kw))
    out = tmp_path / "items.jsonl"
    res = CliRunner().invoke(app, ["evaluate", "--reports", str(SAMPLE), "--metrics", "quality,race", "--judge",
                                   "openai:fake@http://127.0.0.1:9/v1", "--limit", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    row = json.loads(out.read_text())
    assert row["scores"] == {"quality": pytest.approx(0.4), "race": None}
    assert row["failed"] == {"quality": False, "race": True}
    assert row["errors"] == {"race": "RuntimeError: judge down"}
    assert row["components"]["quality_depth"] == pytest.approx(0.4)
