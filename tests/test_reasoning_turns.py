"""Turns of thinking models in the GRPO rollout and the local policies (issue 2.3 item 1).

Two decisions are tested here (README, "Answers"; :mod:`drgym.policies.generation`):

- a stop string ends a turn wherever it occurs, inside reasoning too (vLLM and
  OpenAI-compatible servers apply stops server-side; the cut is the same on every
  backend). A turn stopped at a ``</search>`` rehearsed inside an unclosed ``<think>`` is
  reasoning only: invalid, nothing runs, and the episode goes on;
- a chat template that opens ``<think>`` in the prompt (DeepSeek-R1 distills) makes the
  first turn start inside reasoning: it is handed to the env behind ``<think>``, so the
  same rehearsed search, cut before ``</think>``, does not run either.

The templates are the originals TRL 1.16 ships (``trl/chat_templates``), installed on the
bundled SmolLM2 tokenizer; no other weights are needed.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from drgym.records import Task

GERMANY = Task(task_id="de", question="What is the capital of Germany?", answers=["Berlin"])


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm

    return load_pretrained(AutoTokenizer, resolve_lm("smollm2"))


@pytest.fixture(scope="module")
def r1(smol):
    """SmolLM2's tokenizer with the DeepSeek-R1-Distill chat template (prompt ends in ``<think>\\n``)."""
    import trl

    t = copy.deepcopy(smol)
    t.chat_template = (Path(trl.__file__).parent / "chat_templates" / "deepseek_r1_distill.jinja").read_text(encoding="utf-8")
    return t


def _step(tokenizer, turns: list[str]):
    """A generation step writing ``turns[t]`` on turn ``t``, cut like a real one."""
    from drgym.training.rollout import cut_generated_turn

    state = {"turn": 0}

    def step(contexts, keys):
        text = turns[state["turn"]]
        state["turn"] += 1
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out = [cut_generated_turn(tokenizer, ids)[0] for _ in contexts]
        return out, [[0.0] * len(x) for x in out]

    step.returns_logprobs = False
    return step


def _rollout(tokenizer, backend, turns: list[str]):
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.training.rollout import RolloutSettings, SearchRolloutFunc
    from envs_helpers import Counting

    counting = Counting(backend)

    def factory():
        return gym.make("drgym/SearchQA-v0", backend=counting, tasks=[GERMANY], reward="f1", max_turns=3,
                        top_k=1, max_obs_tokens=40).unwrapped

    env = factory()
    _, info = env.reset(options={"task": GERMANY})
    prompt = tokenizer.apply_chat_template(info["messages"], tokenize=False, add_generation_prompt=True)
    out = SearchRolloutFunc(factory, {prompt: GERMANY}, RolloutSettings(max_turns=3, max_new_tokens=64)).run(
        [prompt], tokenizer=tokenizer, step=_step(tokenizer, turns))
    return out, counting


def test_the_stop_cut_is_the_same_inside_reasoning(smol):
    """The token-level cut stops at the first ``</search>``, rehearsed or not (as vLLM's
    server-side stop strings do)."""
    from drgym.training.rollout import cut_generated_turn

    text = "<think>Maybe <search>old query</search> would help</think>\n<answer>Berlin</answer>"
    kept, eos = cut_generated_turn(smol, smol(text, add_special_tokens=False)["input_ids"])
    assert smol.decode(kept) == "<think>Maybe <search>old query</search>" and not eos


def test_a_turn_stopped_inside_reasoning_runs_nothing_and_the_episode_goes_on(smol, bm25_backend):
    out, counting = _rollout(smol, bm25_backend, ["<think>Maybe <search>old query</search> would help</think>",
                                                  "I know it.</think>\n<answer>Berlin</answer>"])
    traj = out["trajectory"][0]
    assert counting.batches == [] and out["num_searches"] == [0] and out["invalid_actions"] == [1]
    assert traj["steps"][0]["action"] == "<think>Maybe <search>old query</search>"
    assert "Close it with </think>, then act." in traj["steps"][0]["observation"]
    assert out["final_answer"] == ["Berlin"] and traj["reward"] == 1.0


def test_reasoning_opened_by_the_template_is_handed_over_behind_think(r1, smol, bm25_backend):
    from drgym.policies.generation import opened_reasoning

    # a rehearsed search stopped before </think>: with R1's template it is reasoning ...
    out, counting = _rollout(r1, bm25_backend, ["Maybe <search>old query</search> would help", "<answer>Berlin</answer>"])
    assert counting.batches == [] and out["invalid_actions"] == [1] and out["final_answer"] == ["Berlin"]
    assert out["trajectory"][0]["steps"][0]["action"] == "<think>Maybe <search>old query</search>"
    # ... the recorded tokens are the model's own (the template's <think> is in the prompt)
    assert r1.decode(out["prompt_ids"][0]).endswith("<｜Assistant｜><think>\n")
    assert r1.decode(out["completion_ids"][0]).startswith("Maybe <search>old query</search>")
    # ... while the same text after a prompt that opened nothing is a search
    out, counting = _rollout(smol, bm25_backend, ["Maybe <search>old query</search> would help", "<answer>Berlin</answer>"])
    assert counting.batches == [["old query"]] and out["invalid_actions"] == [0]
    # a turn that closes its reasoning reads the same with or without the tag
    for tok in (r1, smol):
        out, counting = _rollout(tok, bm25_backend, ["Berlin is the capital.</think>\n<answer>Berlin</answer>"])
        assert counting.batches == [] and out["final_answer"] == ["Berlin"] and out["trajectory"][0]["reward"] == 1.0
    msgs = [{"role": "user", "content": "Q"}]
    assert opened_reasoning(r1.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)) == "<think>"
    assert opened_reasoning(smol.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)) == ""
    assert opened_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n") == ""  # Qwen3 with thinking off


def test_the_hf_policy_hands_template_opened_turns_over_behind_think(r1, monkeypatch):
    """``hf:`` (chat layout) prefixes every turn whose rendered prompt ends inside ``<think>``."""
    from drgym.policies.hf import HFPolicy

    pol = HFPolicy.__new__(HFPolicy)  # act needs only render, generate and the settings
    pol.tokenizer, pol.prefill, pol.layout, pol.scaffold = r1, "", "chat", "none"
    monkeypatch.setattr(pol, "generate", lambda prompts: ["Maybe <search>q</search>"] * len(prompts), raising=False)
    conv = [{"role": "user", "content": "Question: Q"}]
    assert pol.act([conv]) == ["<think>Maybe <search>q</search>"]
    pol.layout = "continuation"
    later = conv + [{"role": "assistant", "content": "x</think><search>q</search>"}, {"role": "user", "content": "obs"}]
    assert pol.act([conv, later]) == ["<think>Maybe <search>q</search>", "Maybe <search>q</search>"]
