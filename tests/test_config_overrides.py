"""Dotted overrides (``--set KEY=VALUE``) over a run config: merged at any depth, validated by the typed models."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from drgym.cli import app
from drgym.config import dotted_overrides, merge_layers
from drgym.errors import ConfigError
from drgym.training.config import load_config


def test_values_are_read_as_yaml_scalars():
    got = dotted_overrides(["grpo.learning_rate=1e-5", "rollout.max_turns=3", "rollout.greedy=true",
                            "seed=null", "name=my run", "peft.target_modules=[q_proj, v_proj]"])
    assert got == {"grpo": {"learning_rate": 1e-5}, "rollout": {"max_turns": 3, "greedy": True}, "seed": None,
                   "name": "my run", "peft": {"target_modules": ["q_proj", "v_proj"]}}


@pytest.mark.parametrize("item", ["rollout", "rollout.=3", ".x=1", "=3"])
def test_an_item_without_a_dotted_key_is_refused(item):
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        dotted_overrides([item])


def test_a_key_set_both_as_a_value_and_as_a_section_is_refused():
    with pytest.raises(ConfigError, match="was set to a value above"):
        dotted_overrides(["env=x", "env.kwargs.top_k=5"])
    with pytest.raises(ConfigError, match="already has keys set inside it"):
        dotted_overrides(["env.kwargs.top_k=5", "env.kwargs=3"])


def test_merge_keeps_the_file_keys_beside_the_overridden_one():
    base = {"env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 3, "max_searches": 2}}, "rewards": [1, 2]}
    got = merge_layers(base, {"env": {"kwargs": {"top_k": 5}}, "rewards": [3]})
    assert got == {"env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 5, "max_searches": 2}}, "rewards": [3]}
    assert base["env"]["kwargs"]["top_k"] == 3  # not changed in place


def test_a_bundled_config_with_overrides_is_the_typed_config_with_those_values():
    plain = load_config("smollm2_breadth_cpu")
    cfg = load_config("smollm2_breadth_cpu", dotted_overrides(
        ["rollout.max_turns=2", "env.kwargs.top_k=5", "grpo.learning_rate=2e-5", "entropy_brake.z=2.0"]))
    assert cfg.rollout_settings().max_turns == 2
    assert cfg.env["kwargs"]["top_k"] == 5
    assert cfg.env["kwargs"]["max_obs_tokens"] == plain.env["kwargs"]["max_obs_tokens"]  # kept from the file
    assert cfg.grpo["learning_rate"] == 2e-5 and cfg.grpo["max_steps"] == plain.grpo["max_steps"]
    assert cfg.entropy_brake["z"] == 2.0


def test_an_override_is_validated_like_the_file():
    with pytest.raises(ConfigError, match="Did you mean 'max_turns'"):
        load_config("smollm2_breadth_cpu", dotted_overrides(["rollout.max_turn=2"]))


def test_the_cli_passes_set_through_to_the_launched_command():
    res = CliRunner().invoke(app, ["train", "grpo", "--config", "searchqa_qwen3_1p7b_gpu", "--launch", "--dry-run",
                                   "--set", "rollout.max_turns=2", "--set", "env.kwargs.top_k=4"])
    assert res.exit_code == 0, res.output
    assert res.output.strip().endswith("--set rollout.max_turns=2 --set env.kwargs.top_k=4")
    bad = CliRunner().invoke(app, ["train", "grpo", "--config", "searchqa_qwen3_1p7b_gpu", "--dry-run",
                                   "--set", "rollout.max_turn=2"])
    assert bad.exit_code == 2 and "Did you mean 'max_turns'" in bad.output
