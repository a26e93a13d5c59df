"""``enable_thinking``: the chat-template switch of thinking models, in configs, policies and records.

No Qwen3 weights here: the chat templates are the originals TRL 1.16 ships byte for byte
(``trl/chat_templates/qwen3.jinja``, ``deepseek_r1_distill.jinja``), installed on the
bundled SmolLM2 tokenizer (ChatML tokens, like Qwen's).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

MESSAGES = [{"role": "system", "content": "You answer questions using a search engine."},
            {"role": "user", "content": "Question: What is the capital of Germany?"}]
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm

    return load_pretrained(AutoTokenizer, resolve_lm("smollm2"))


def _with_template(tok, name: str):
    import trl

    t = copy.deepcopy(tok)
    t.chat_template = (Path(trl.__file__).parent / "chat_templates" / name).read_text(encoding="utf-8")
    return t


@pytest.fixture(scope="module")
def qwen3(smol):
    return _with_template(smol, "qwen3.jinja")


def test_the_template_default_is_read_from_the_template(smol, qwen3):
    from drgym.policies.generation import resolve_thinking, template_thinking_default

    assert template_thinking_default(qwen3) is True  # Qwen3 model card: thinking on unless disabled
    assert template_thinking_default(smol) is None  # SmolLM2: no switch
    # DeepSeek-R1 distills always open <think> in the prompt; the switch does not exist there
    assert template_thinking_default(_with_template(smol, "deepseek_r1_distill.jinja")) is None
    assert resolve_thinking(qwen3, None) is True and resolve_thinking(qwen3, False) is False
    assert resolve_thinking(smol, True) is None


def test_render_chat_passes_the_switch(qwen3, smol):
    from drgym.policies.generation import render_chat

    off = render_chat(qwen3, MESSAGES, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert render_chat(qwen3, MESSAGES, enable_thinking=True) == render_chat(qwen3, MESSAGES) \
        == off[: -len(EMPTY_THINK)]
    assert render_chat(smol, MESSAGES, enable_thinking=False) == render_chat(smol, MESSAGES)


def test_grpo_prompts_sft_examples_and_the_hf_policy_render_the_same_prompt(qwen3, tmp_path):
    """Training (dataset rows, rollout prompt ids, SFT examples) and evaluation (``hf:``) agree."""
    from drgym.policies.hf import HFPolicy
    from drgym.training.rollout import prompt_token_ids

    for thinking in (False, True):
        ids = prompt_token_ids(qwen3, MESSAGES, enable_thinking=thinking)
        pol = HFPolicy(_TinyLM(str(tmp_path)), tokenizer=qwen3, layout="continuation", enable_thinking=thinking)
        assert pol.describe()["enable_thinking"] is thinking
        text = pol.render(MESSAGES)
        assert list(qwen3(text, add_special_tokens=False)["input_ids"]) == ids
        assert text.endswith(EMPTY_THINK) is (not thinking)


class _TinyLM:
    """Enough of a causal LM for ``HFPolicy.__init__`` (nothing is generated)."""

    training = False

    def __init__(self, name: str) -> None:
        import torch

        self._p = torch.nn.Parameter(torch.zeros(1))
        self.config = type("Cfg", (), {"_name_or_path": name})()

    def parameters(self):
        return iter([self._p])

    def generate(self, *a, **kw):  # pragma: no cover - never called
        raise AssertionError


def test_a_drgym_trained_folder_keeps_its_thinking_mode(qwen3, tmp_path):
    """``drgym_training.json`` records ``enable_thinking``; ``hf:`` on that folder uses it by default."""
    from drgym.models import TRAINING_RECORD
    from drgym.policies.factory import describe_policy
    from drgym.policies.hf import HFPolicy
    from drgym.training.callbacks import write_training_record
    from drgym.training.config import load_config

    cfg = load_config("searchqa_qwen3_1p7b_gpu", {"enable_thinking": False})
    folder = tmp_path / "final"
    folder.mkdir()
    write_training_record(folder, cfg, "grpo")
    assert json.loads((folder / TRAINING_RECORD).read_text())["enable_thinking"] is False
    pol = HFPolicy(_TinyLM(str(folder)), tokenizer=qwen3)
    assert pol.enable_thinking is False and pol.render(MESSAGES).endswith(EMPTY_THINK)
    assert describe_policy(pol)["enable_thinking"] is False  # what a rollout's config.json records
    # an explicit value wins over the record
    assert HFPolicy(_TinyLM(str(folder)), tokenizer=qwen3, enable_thinking=True).enable_thinking is True


def test_configs_carry_enable_thinking():
    from drgym.errors import ConfigError
    from drgym.training.config import build_grpo_args, load_config

    for name in ("searchqa_qwen3_1p7b_gpu", "searchqa_qwen3_1p7b_vllm_server"):
        cfg = load_config(name)
        assert cfg.enable_thinking is True  # Qwen3's model-card default, written out
        assert cfg.rollout_settings().enable_thinking is True
        assert build_grpo_args(cfg, validate_only=True).chat_template_kwargs == {"enable_thinking": True}
    smol = load_config("searchqa_smollm2_cpu")
    assert smol.enable_thinking is None and not build_grpo_args(smol, validate_only=True).chat_template_kwargs
    with pytest.raises(ConfigError, match="enable_thinking must be true, false or null"):
        load_config("searchqa_smollm2_cpu", {"enable_thinking": "yes"})
    with pytest.raises(ConfigError, match="enable_thinking is a top-level key"):
        load_config("searchqa_smollm2_cpu", {"rollout": {"enable_thinking": False}})
    with pytest.raises(ConfigError, match="differs from enable_thinking"):
        build_grpo_args(load_config("searchqa_qwen3_1p7b_gpu", {"grpo": {"chat_template_kwargs": {"enable_thinking": False}}}),
                        validate_only=True)


def test_the_openai_policy_sends_the_switch_to_the_server():
    from drgym.policies.openai import OpenAIPolicy

    p = OpenAIPolicy("qwen3", "http://127.0.0.1:9/v1", enable_thinking=False, extra_body={"top_k": 1})
    assert p.extra_body == {"top_k": 1, "chat_template_kwargs": {"enable_thinking": False}}
    assert p.describe()["enable_thinking"] is False
    assert "chat_template_kwargs" not in OpenAIPolicy("m", "http://127.0.0.1:9/v1").extra_body


# -- what a thinking model writes, and how the one parser reads it ----------------------------
def test_a_thinking_turn_with_a_closed_think_block_parses_to_its_action():
    """Qwen3 with thinking on writes ``<think>...</think>`` and then the action; a tag inside
    the reasoning is not an action."""
    from drgym.envs.parsing import Parser

    calls = Parser().parse("<think>I could <search>capital of Germany</search>, but I know it.</think>\n"
                           "<answer>Berlin</answer>").calls
    assert [(c.name, c.arguments) for c in calls] == [("answer", {"answer": "Berlin"})]
    calls = Parser().parse(EMPTY_THINK + "<search>capital of Germany</search>").calls  # thinking off
    assert [(c.name, c.arguments) for c in calls] == [("search", {"query": "capital of Germany"})]


def test_reasoning_opened_by_the_template_is_not_parsed_as_actions():
    """Templates that open ``<think>`` in the prompt (DeepSeek-R1 distills, Qwen3 thinking-only
    releases) leave the completion with only ``... </think>`` before the action."""
    from drgym.envs.parsing import Parser

    for text in ("The format says to put the answer in <answer></answer> tags. Berlin is the capital.</think>\n"
                 "<answer>Berlin</answer>",
                 "Maybe <search>old query</search> would help, but I know it.</think>\n<answer>Berlin</answer>"):
        calls = Parser().parse(text).calls
        assert [(c.name, c.arguments) for c in calls] == [("answer", {"answer": "Berlin"})]
