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


class Counting(Reward):
    """F1 that records the size of every batch it scores."""

    name = "f1"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def score(self, episodes):
        self.batches.append(len(episodes))
        return F1().score(episodes)


def test_the_merge_rule_is_one_and_score_batch_writes_it_into_trajectories():
    from drgym.records import Trajectory

    # scores under their labels, then components (a component named like a label wins over its score)
    comps = {"f1": 1.0, "em": 1.0}
    scored = Scorer([Fixed("kpr", [0.25], {"kpr": [0.5], "kpc": [0.25]}), Broken()]).score([Episode(PARIS, "x")])[0]
    assert scored.merge_into(comps) == {"f1": 1.0, "em": 1.0, "kpr": 0.5, "kpc": 0.25, "broken": None}
    # score_batch: the same rule into each trajectory, errors appended, time shared
    trajs = [Trajectory(episode_id=f"e{i}", task_id=t.task_id, reward_components={"f1": 0.5}) for i, t in enumerate([PARIS, EIFFEL])]
    out = Scorer([ExactMatch(), Broken()]).score_batch([Episode(t, a, tr) for t, a, tr in
                                                        zip([PARIS, EIFFEL], ["paris.", "Eiffel"], trajs)])
    assert [tr.reward_components for tr in trajs] == [{"f1": 0.5, "em": 1.0, "broken": None},
                                                      {"f1": 0.5, "em": 0.0, "broken": None}]
    assert [tr.metadata["reward_errors"] for tr in trajs] == [["broken: RuntimeError: judge down"]] * 2
    assert all(tr.timings["reward"] >= 0.0 for tr in trajs) and out[0].scores["em"] == 1.0
    with pytest.raises(ValueError, match="have none"):
        Scorer(ExactMatch()).score_batch([Episode(PARIS, "paris")])


def test_missing_only_scores_a_reward_only_where_the_trajectory_lacks_it():
    from drgym.records import Trajectory

    f1 = Counting()
    trajs = [Trajectory(episode_id="a", task_id="q1", reward_components={"f1": 0.25}),
             Trajectory(episode_id="b", task_id="q2")]
    Scorer([ExactMatch(), f1]).score_batch([Episode(PARIS, "paris.", trajs[0]), Episode(EIFFEL, "Gustave Eiffel", trajs[1])],
                                           missing_only=True)
    assert f1.batches == [1]  # only the episode without an f1
    assert trajs[0].reward_components == {"f1": 0.25, "em": 1.0}  # the recorded f1 is kept, not recomputed
    assert trajs[1].reward_components == {"f1": 1.0, "em": 1.0}
    f1.batches.clear()
    Scorer(f1).score_batch([Episode(PARIS, "x", trajs[0]), Episode(EIFFEL, "y", trajs[1])], missing_only=True)
    assert f1.batches == []  # every trajectory holds it: no call at all


def test_the_driver_scores_a_turns_finished_episodes_in_one_batch(bm25_backend):
    """Envs that share a reward object (a GRPO group's) are scored together, once per turn;
    the step rewards and components are what each env alone would give."""
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.envs.driver import BatchedDriver

    class Answer:
        name = "answer"

        def act(self, conversations, infos=None):
            return ["<answer>Gustave Eiffel</answer>" if "tower" in i["question"] else "<search>Paris</search>"
                    for i in infos]

    shared = Counting()
    envs = [gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[PARIS, EIFFEL], reward=shared, max_turns=2)
            for _ in range(4)]
    driver = BatchedDriver(envs)
    trajs = driver.run(Answer(), [{"task_id": "q2"}, {"task_id": "q1"}, {"task_id": "q2"}, {"task_id": "q1"}])
    # turn 1: the two tower episodes end (one batch); turn 2: the two Paris episodes are truncated (one batch)
    assert shared.batches == [2, 2]
    assert [t.reward_components["f1"] for t in trajs] == [1.0, 0.0, 1.0, 0.0]
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 0.0]
    # one env alone gives the same
    alone = gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[EIFFEL], reward=Counting())
    alone.reset(options={"task_id": "q2"})
    *_, r, _, _, info = alone.step("<answer>Gustave Eiffel</answer>")
    assert r == 1.0 and info["reward_components"] == {"f1": 1.0} and info["trajectory"].timings["reward"] >= 0.0
    # the driver's own step() scores too
    driver = BatchedDriver(envs[:2])
    driver.reset([{"task_id": "q2"}, {"task_id": "q2"}])
    out = driver.step(["<answer>Gustave Eiffel</answer>", "<answer>Eiffel</answer>"])
    assert [out[i][1] for i in (0, 1)] == [1.0, pytest.approx(2 / 3)]
    assert out[1][4]["reward_components"] == {"f1": pytest.approx(2 / 3)} and shared.batches[-1] == 2


def test_trl_reward_reads_the_env_score_and_falls_back_to_the_scorer(caplog):
    from drgym.training.trl_adapter import TRLReward

    f1 = Counting()
    trajs = [{"episode_id": "a", "task_id": "q1", "reward_components": {"f1": 0.5}},
             {"episode_id": "b", "task_id": "q2", "reward_components": {}}]
    tasks = {"q1": PARIS, "q2": EIFFEL}
    fn = TRLReward(f1, tasks_by_id=tasks, env_scored=True)
    out = fn(["Q", "Q"], ["<answer>Paris</answer>", "<answer>x</answer>"], task_id=["q1", "q2"],
             final_answer=["Paris", "Gustave Eiffel"], trajectory=trajs)
    assert out == [0.5, 1.0] and f1.batches == [1]  # the env's score read; the other scored from final_answer
    # without env_scored the recorded score is not trusted (the env's reward may differ): both are scored
    assert TRLReward(f1, tasks_by_id=tasks)(["Q", "Q"], ["", ""], task_id=["q1", "q2"],
                                            final_answer=["Paris", "Gustave Eiffel"], trajectory=trajs) == [1.0, 1.0]
    # the Scorer's failure policy: a reward that raises gives None (logged), never 0
    with caplog.at_level(logging.WARNING, logger="drgym.rewards.scorer"):
        assert TRLReward(Broken())(["Q"], ["<answer>Paris</answer>"], answers=[["Paris"]]) == [None]
    assert "reward broken failed" in caplog.text


def test_one_weighted_total_and_one_degenerate_rule():
    from drgym.rewards import degenerate_groups, weighted_total
    from drgym.rewards.registry import WeightedReward

    assert weighted_total([0.5, 1.0], [1.0, 0.2]) == pytest.approx(0.7)
    assert weighted_total([0.5, float("nan")], [1.0, 0.2]) is None
    assert weighted_total([None, None], [1.0, 0.2], skip_missing=True) is None
    with pytest.raises(ValueError, match="2 scores for 1 weights"):
        weighted_total([1.0, 1.0], [1.0])
    out = WeightedReward([(F1(), 1.0), (Fixed("half", [None, 1.0], {}), 0.5)]).score(eps())
    assert out.scores == [None, pytest.approx(0.8 + 0.5)]
    assert degenerate_groups([0.2, 0.2, 0.0, 1.0, None, 1.0, 0.5], 2) == [True, False, True, True]
    with pytest.raises(ValueError):
        degenerate_groups([1.0], 0)
