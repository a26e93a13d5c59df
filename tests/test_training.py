"""Training plumbing: configs, token layout and masks, degenerate-group guard, plots.

Model-free tests plus a few that load the bundled SmolLM2-135M tokenizer/model (fp32,
about 1 s). The multi-step GRPO runs live in ``test_training_grpo.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from drgym.errors import ConfigError

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

BUNDLED = ["searchqa_smollm2_cpu", "searchqa_qwen3_1p7b_gpu", "searchqa_qwen3_1p7b_vllm_server"]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from drgym.models import resolve_lm

    return AutoTokenizer.from_pretrained(resolve_lm("smollm2"))


# -- configs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_configs_build_trainer_arguments(name):
    import sys

    from drgym.training.config import (
        build_grpo_args,
        build_sft_args,
        bundled_configs,
        load_config,
    )

    assert name in bundled_configs()
    cfg = load_config(name)
    g = build_grpo_args(cfg, validate_only=True)
    s = build_sft_args(cfg, validate_only=True)
    assert g.generation_batch_size % g.num_generations == 0
    assert g.max_completion_length == cfg.rollout_settings().max_completion_tokens
    assert s.output_dir.endswith("sft")
    if "gpu" in name or "vllm" in name:
        assert g.use_vllm and g.vllm_mode == ("server" if "server" in name else "colocate")
        assert "vllm" not in sys.modules  # building the arguments never imports vllm
    else:
        assert not g.use_vllm and g.bf16 is False and g.num_generations >= 2


def test_cpu_config_values():
    from drgym.training.config import build_grpo_args, load_config

    cfg = load_config("searchqa_smollm2_cpu")
    g = build_grpo_args(cfg)
    # 8 rollouts per step = 2 questions x 4 generations; one generation per optimizer step
    assert (g.generation_batch_size, g.num_generations, g.steps_per_generation) == (8, 4, 1)
    assert cfg.rollout_settings().temperature == g.temperature == 1.0
    assert [r["name"] for r in cfg.rewards] == ["f1", "format"]
    assert cfg.tasks["train"].set == "hotpotqa-dev" and cfg.tasks["eval"].start == 60


def test_gpu_config_refused_for_real_training_on_cpu():
    import torch
    from drgym.training.config import build_grpo_args, load_config

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="need a GPU"):
        build_grpo_args(load_config("searchqa_qwen3_1p7b_gpu"))


def test_accelerate_launch_config_parses():
    from accelerate.commands.config.config_args import ClusterConfig
    from drgym.training.config import CONFIG_DIR

    c = ClusterConfig.from_yaml_file(str(CONFIG_DIR / "accelerate_zero2.yaml"))
    assert str(c.distributed_type).endswith("DEEPSPEED")
    assert c.deepspeed_config["zero_stage"] == 2 and c.num_processes == 8


@pytest.mark.parametrize("patch, match", [
    ({"nmae": "x"}, "Did you mean 'name'"),
    ({"grpo": {"learning_rte": 1e-5}}, "Did you mean 'learning_rate'"),
    ({"rollout": {"max_turn": 2}}, "Did you mean 'max_turns'"),
    ({"rollout": {"temperature": 0.7}}, "differs from grpo.temperature"),
    ({"tasks": {"final": "hotpotqa-dev"}}, r"tasks\.final: unknown tasks key\. Known: eval, test, train"),
    ({"protocol": "xml"}, "Unknown protocol"),
    ({"trainable_layers": -1}, "trainable_layers"),
])
def test_bad_configs_are_named(tmp_path, patch, match):
    import yaml
    from drgym.training.config import CONFIG_DIR, build_grpo_args, load_config

    data = yaml.safe_load((CONFIG_DIR / "searchqa_smollm2_cpu.yaml").read_text())
    data.update(patch)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=match):
        build_grpo_args(load_config(p))


def test_unknown_config_name():
    from drgym.training.config import load_config

    with pytest.raises(ConfigError, match="Did you mean 'searchqa_smollm2_cpu'"):
        load_config("searchqa_smollm2_cpuu")


# -- token layout -----------------------------------------------------------------------------
def test_cut_at_stop_drops_pad_eos_after_stop_string(tok):
    from drgym.training.rollout import cut_generated_turn

    act = tok("<search> Lilu demon </search>", add_special_tokens=False)["input_ids"]
    ids, eos = cut_generated_turn(tok, act + [2, 2, 2])  # SmolLM2 pads with its eos id 2
    assert ids == act and eos is False
    ids, eos = cut_generated_turn(tok, act + tok(" trailing", add_special_tokens=False)["input_ids"])
    assert ids == act
    plain = tok("I think it is Paris", add_special_tokens=False)["input_ids"]
    assert cut_generated_turn(tok, plain + [2, 2]) == (plain + [2], True)
    assert cut_generated_turn(tok, plain) == (plain, False)


def test_cut_ids_at_stop_keeps_the_completing_token_whole(tok):
    """SmolLM2 writes "</search>." as '</', 'search', '>.': the cut keeps '>.' (the token the
    model sampled); the cut is the same for drgym train and hf: policies."""
    from drgym.policies.generation import cut_ids_at_stop

    dotted = tok("<search> Lilu demon </search>.", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(dotted[-1]) == ">."
    more = tok(" and then more text", add_special_tokens=False)["input_ids"]
    assert cut_ids_at_stop(tok, dotted + more + [2, 2], eos_ids=(2,)) == (dotted, "stop")
    # the earliest stop string wins; a stop string after the first eos does not count
    ans = tok("<answer> 1889 </answer>", add_special_tokens=False)["input_ids"]
    assert cut_ids_at_stop(tok, ans + dotted, eos_ids=(2,)) == (ans, "stop")
    plain = tok("I think it is Paris", add_special_tokens=False)["input_ids"]
    assert cut_ids_at_stop(tok, plain + [2] + dotted, eos_ids=(2,)) == (plain + [2], "eos")
    assert cut_ids_at_stop(tok, plain, eos_ids=(2,)) == (plain, "length")
    assert cut_ids_at_stop(tok, [2, 2], eos_ids=(2,)) == ([2], "eos")


def test_sft_labels_mask_prompt_and_observations(tok):
    from drgym.training.sft import IGNORE_INDEX, encode_trajectory

    from drgym.records import Step, Trajectory

    obs = "\n\n<information>Doc 1 (Title: Lilu, URL: u) A lilu is an Akkadian spirit.</information>\n\n"
    traj = Trajectory(
        episode_id="e1", task_id="t1",
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "Question: Q?"},
                  {"role": "assistant", "content": "<search> Q? </search>"}],
        steps=[Step(action="<search> Q? </search>", observation=obs), Step(action="<answer> Akkadian </answer>")],
        final_answer="Akkadian", terminated=True)
    ex = encode_trajectory(tok, traj)
    ids, labels = ex["input_ids"], ex["labels"]
    assert len(ids) == len(labels)
    trained = [t for t, lab in zip(ids, labels) if lab != IGNORE_INDEX]
    assert tok.decode(trained) == "<search> Q? </search><answer> Akkadian </answer><|im_end|>"
    masked_tail = tok.decode([t for t, lab in zip(ids, labels) if lab == IGNORE_INDEX])
    assert masked_tail.startswith("<|im_start|>system\nS<|im_end|>") and masked_tail.endswith(obs)
    # the gold-answer rewrite changes only the answer span
    ex2 = encode_trajectory(tok, traj, gold_answer="a spirit")
    trained2 = [t for t, lab in zip(ex2["input_ids"], ex2["labels"]) if lab != IGNORE_INDEX]
    assert tok.decode(trained2) == "<search> Q? </search><answer> a spirit </answer><|im_end|>"


# -- collapse guard ---------------------------------------------------------------------------
def test_group_monitor_flags_degenerate_groups(tmp_path):
    from drgym.training.rewards import GroupMonitor

    m = GroupMonitor(["f1", "format"], [1.0, 0.2], num_generations=2, out_path=tmp_path / "deg.jsonl")
    # group 1 (t1): totals 1.2 and 1.2 -> degenerate; group 2 (t2): 0.0 and 0.7 -> fine
    m.record("f1", [1.0, 1.0, 0.0, 0.5], ["t1", "t1", "t2", "t2"], ["Paris", "Paris", "", "Lyon"])
    assert m.history == []  # waits for the last component
    m.record("format", [1.0, 1.0, 0.0, 1.0], ["t1", "t1", "t2", "t2"], ["Paris", "Paris", "", "Lyon"])
    assert m.history == [{"guard/degenerate_group_frac": 0.5, "guard/all_empty_group_frac": 0.0,
                          "guard/empty_answer_frac": 0.25}]
    rec = [json.loads(line) for line in (tmp_path / "deg.jsonl").read_text().splitlines()]
    assert len(rec) == 1 and rec[0]["task_id"] == "t1" and rec[0]["rewards"] == pytest.approx([1.2, 1.2])


def test_plot_run_writes_pngs(tmp_path):
    from drgym.training.plot import plot_run

    from drgym.atomic import append_jsonl

    for step, r in [(1, 0.1), (2, 0.3), (3, 0.2)]:
        append_jsonl(tmp_path / "metrics.jsonl", {"step": step, "reward": r, "rewards/f1/mean": r,
                                                  "kl": 0.0, "entropy": 0.5, "loss": 0.01 * step})
    append_jsonl(tmp_path / "metrics.jsonl", {"step": 2, "eval/reward": 0.25, "eval/f1": 0.2})
    paths = plot_run(tmp_path)
    assert (tmp_path / "plots" / "curves.png") in paths
    assert paths[0] == tmp_path / "plots" / "summary.png"  # reward, held-out F1, degenerate groups, length
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="metrics.jsonl"):
        plot_run(tmp_path / "nothing")


def test_plot_summary_panels_show_the_logged_series(tmp_path):
    """summary.png's four panels hold the train reward (with its mean of 10), held-out F1, the
    degenerate-group fraction and the response length, read from metrics.jsonl."""
    from unittest import mock

    from drgym.training import plot

    from drgym.atomic import append_jsonl

    for step in range(1, 13):
        append_jsonl(tmp_path / "metrics.jsonl", {"step": step, "reward": step / 10, "guard/degenerate_group_frac": 0.5,
                                                  "completions/mean_length": 20 + step})
    append_jsonl(tmp_path / "metrics.jsonl", {"step": 10, "eval/f1": 0.3, "eval/reward": 0.4})
    drawn = []
    real = plot._draw
    with mock.patch.object(plot, "_draw", side_effect=lambda ax, rows, title, keys, smooth=0: (
            drawn.append((title, keys, smooth)), real(ax, rows, title, keys, smooth))):
        plot.plot_run(tmp_path)
    assert drawn[:4] == [("train reward (per step, and mean of 10)", ["reward"], 10),
                         ("held-out F1 (greedy)", ["eval/f1"], 0),
                         ("degenerate (zero-variance) groups", ["guard/degenerate_group_frac"], 0),
                         ("response length (model tokens per episode)", ["completions/mean_length"], 0)]
