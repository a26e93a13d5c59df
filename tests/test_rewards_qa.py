"""Short-answer metrics (hand-checked), format and length rewards, registry, TRL adapter, soft match."""

from __future__ import annotations

import pytest
from drgym.rewards import Episode, build_reward, get_reward
from drgym.rewards.length import LengthGuard
from drgym.rewards.qa import (
    F1,
    FormatReward,
    SoftMatch,
    cover_exact_match,
    exact_match,
    normalize_answer,
    token_f1,
)
from drgym.rewards.registry import WeightedReward
from drgym.training.trl_adapter import (
    TRLReward,
    trl_reward_funcs,
    trl_reward_weights,
)

from drgym.errors import ConfigError
from drgym.judges.openai import OpenAIJudge
from drgym.records import Step, Task, ToolCall, Trajectory


def ep(answer, golds, **kw):
    return Episode(task=Task(task_id="t", question=kw.pop("question", "q?"), answers=golds, **kw), answer=answer)


def test_squad_normalisation():
    assert normalize_answer("The Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("  A  cat,   an apple ") == "cat apple"
    assert normalize_answer("U.S.A.") == "usa"


def test_exact_match_over_aliases():
    assert exact_match("the Eiffel tower", ["Eiffel Tower"]) == 1.0
    assert exact_match("NYC", ["New York City", "nyc"]) == 1.0
    assert exact_match("New York", ["New York City"]) == 0.0
    assert exact_match("", ["x"]) == 0.0
    assert exact_match("x", []) == 0.0


def test_cover_em():
    assert cover_exact_match("The answer is Paris, France.", ["paris"]) == 1.0
    assert cover_exact_match("Parisian cafes", ["Paris"]) == 0.0  # whole words only
    assert cover_exact_match("born in 1889 in Paris", ["1889", "1890"]) == 1.0
    assert cover_exact_match("anything", ["the"]) == 0.0  # gold normalises to empty


def test_token_f1_hand_checked():
    # pred "gustave eiffel engineer" (3) vs gold "gustave eiffel" (2): P=2/3, R=1, F1=0.8
    assert token_f1("Gustave Eiffel, the engineer", ["Gustave Eiffel"]) == pytest.approx(0.8)
    # max over aliases: "new york city" vs "new york" -> 0.8, vs "nyc" -> 0
    assert token_f1("New York City", ["NYC", "New York"]) == pytest.approx(0.8)
    # multiset overlap: "x x y" vs "x y y": common {x:1, y:1}=2, P=R=2/3
    assert token_f1("x x y", ["x y y"]) == pytest.approx(2 / 3)
    assert token_f1("red", ["blue"]) == 0.0
    assert token_f1("", ["the"]) == 0.0  # both normalise to empty: no common token (HotpotQA script)
    assert token_f1("", ["x"]) == 0.0


def test_string_rewards_batch_and_no_gold():
    out = F1().score([ep("Gustave Eiffel the engineer", ["Gustave Eiffel"]), ep("x", [])])
    assert out.scores[0] == pytest.approx(0.8) and out.scores[1] is None
    assert out.components["f1"] == out.scores and out.failures == 0


def test_format_and_length():
    traj = Trajectory(episode_id="e", task_id="t", terminated=True,
                      steps=[Step(action="bad", tool_calls=[ToolCall(name="invalid", error="no tag")]), Step(action="<answer>x</answer>")])
    e1 = Episode(task=Task("t", "q", ["x"]), answer="x", trajectory=traj)
    e2 = Episode(task=Task("t", "q", ["x"]), answer="", trajectory=Trajectory(episode_id="e2", task_id="t", truncated=True))
    assert FormatReward(invalid_penalty=0.25).score([e1, e2]).scores == [0.75, 0.0]
    g = LengthGuard(max_tokens=10, rate=1.0, max_penalty=1.0)
    out = g.score([ep("w " * 8, []), ep("w " * 15, []), ep("w " * 40, [])])
    assert out.scores == [0.0, -0.5, -1.0]
    assert out.components["length_tokens"] == [8.0, 15.0, 40.0]
    with pytest.raises(ConfigError):
        LengthGuard(max_tokens=0)


def test_registry_names_configs_and_weighted_sum():
    assert isinstance(build_reward("f1"), F1)
    assert isinstance(get_reward("length", max_tokens=5), LengthGuard)
    r = build_reward({"weighted": {"f1": 1.0, "em": 0.5, "format": 0.1}})
    assert isinstance(r, WeightedReward) and r.name == "f1+em+format"
    out = r.score([ep("Gustave Eiffel the engineer", ["Gustave Eiffel"]), ep("Paris", ["paris"])])
    assert out.scores[0] == pytest.approx(0.8 + 0.0 + 0.1)
    assert out.scores[1] == pytest.approx(1.0 + 0.5 + 0.1)
    assert out.components["em"] == [0.0, 1.0] and out.components["format"] == [1.0, 1.0]
    r2 = build_reward({"weighted": [{"name": "f1", "weight": 2.0}, {"name": "length", "weight": 1.0, "kwargs": {"max_tokens": 4}}]})
    # F1 of "w x y z paris" vs "paris": P=1/5, R=1 -> 1/3; 5 words, budget 4 -> -1/4
    assert r2.score([ep("w x y z paris", ["paris"])]).scores[0] == pytest.approx(2 / 3 - 0.25)
    with pytest.raises(ConfigError, match="Did you mean 'kpr'"):
        build_reward("kpc")
    with pytest.raises(ConfigError, match="one key"):
        build_reward({"f1": {}, "em": {}})
    with pytest.raises(ConfigError, match="backend"):
        build_reward({"citation": {"judge": "openai:m@http://127.0.0.1:9/v1", "mode": "precision"}})
    with pytest.raises(ConfigError, match="Bad options"):
        build_reward({"f1": {"nonsense": 1}})


def test_trl_adapter_strings_messages_and_gold_columns():
    f = TRLReward(F1())
    assert f.__name__ == "f1"
    prompts = [[{"role": "user", "content": "Who built it?"}]] * 3
    completions = [
        [{"role": "assistant", "content": "<answer>Gustave Eiffel, the engineer</answer>"}],
        "<answer>nobody</answer>",
        [{"role": "assistant", "content": "Gustave Eiffel"}],
    ]
    assert f(prompts=prompts, completions=completions, answers=[["Gustave Eiffel"]] * 3) == pytest.approx([0.8, 0.0, 1.0])
    assert f(prompts=prompts, completions=completions, golds=["Gustave Eiffel"] * 3) == pytest.approx([0.8, 0.0, 1.0])
    assert f(prompts=prompts, completions=completions) == [None, None, None]  # no gold column
    eps = f.episodes(prompts, completions, answers=[["x"]] * 3)
    assert eps[0].task.question == "Who built it?"
    funcs = trl_reward_funcs({"weighted": {"f1": 1.0, "format": 0.2}})
    assert [fn.__name__ for fn in funcs] == ["f1", "format"]
    assert trl_reward_weights({"weighted": {"f1": 1.0, "format": 0.2}}) == [1.0, 0.2]


def test_soft_match_via_loopback_judge(chat_server, tmp_path):
    def responder(body):
        user = body["messages"][1]["content"]
        if "Predicted answer: broken" in user:
            return "no idea"
        return '{"score": 1, "justification": "same"}' if "Predicted answer: G. Eiffel" in user else '{"score": 0}'

    chat_server.responder = responder
    judge = OpenAIJudge("j", chat_server.url, cache=tmp_path / "c.sqlite", retry={"backoff_s": 0.0, "attempts": 2})
    r = SoftMatch(judge)
    out = r.score([ep("G. Eiffel", ["Gustave Eiffel"]), ep("Gustave Eiffel", ["Gustave Eiffel"]), ep("Rome", ["Paris"]),
                   ep("broken", ["x"]), ep("", ["x"]), ep("y", [])])
    assert out.scores == [1.0, 1.0, 0.0, None, 0.0, None]
    assert out.failures == 1
    # EM shortcut, empty answer and no-gold rows make no call; "broken" is tried twice
    assert len(chat_server.requests) == 1 + 1 + 2
    graded = SoftMatch(judge, graded=True)
    chat_server.responder = lambda body: '{"score": 0.5}'
    assert graded.score([ep("Eiffel", ["Gustave Eiffel"])]).scores == [0.5]


def test_ascore_runs_reward_off_the_event_loop():
    import asyncio

    from drgym.rewards import ascore

    out = asyncio.run(ascore(F1(), [ep("Gustave Eiffel", ["Gustave Eiffel"])]))
    assert out.scores == [1.0]
