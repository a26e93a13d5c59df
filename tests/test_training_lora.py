"""LoRA (PEFT) training on CPU with the bundled SmolLM2-135M: SFT, then GRPO on the SFT adapter.

Tiny settings (a rank-4 adapter on the top 2 decoder layers, 2 questions x 2 rollouts,
8-token turns) so both stages take seconds. The checks: only adapter weights move, the
saved adapters carry ``drgym_training.json`` and a portable base model, and ``hf:``
loads base + adapter (merged) to the same logits as the PEFT model.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PEFT = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"],
        "layers_to_transform": [28, 29]}


def lora_config(tmp_path, **over):
    from drgym.training.config import load_config

    g = {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "save_strategy": "no",
         "report_to": "none", "logging_steps": 1, "learning_rate": 1e-3, "shuffle_dataset": True}
    data = {
        "output_dir": str(tmp_path / "run"), "trainable_layers": None, "torch_threads": 1, "peft": PEFT,
        "tasks": {"train": {"set": "hotpotqa-dev", "start": 0, "limit": 4},
                  "eval": {"set": "hotpotqa-dev", "start": 60, "limit": 2}},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_completion_tokens": 256, "gen_batch_size": 4},
        "env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 1, "max_obs_tokens": 40, "max_fetches": 0}},
        "eval": {"every_steps": 0}, "grpo": g,
        "sft": {"max_steps": 1, "per_device_train_batch_size": 2, "learning_rate": 1e-3, "save_strategy": "no",
                "report_to": "none", "logging_steps": 1, "max_length": 384, "warmup_steps": 0},
    }
    data.update(over)
    return load_config("searchqa_smollm2_cpu", data)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def action_chars(prompts, completions, trajectory=None, **kw):
    """Characters the model wrote / 100: gives every GRPO group a reward spread."""
    return [sum(len(s["action"]) for s in t["steps"]) / 100 for t in trajectory]


class WeightWatch:
    """Trainer callback: snapshots every parameter at the start of training and, at the end,
    records which trainable ones moved and whether any frozen one did."""

    def __init__(self):
        from transformers import TrainerCallback

        watch = self

        class CB(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                watch.before = {n: p.detach().clone() for n, p in model.named_parameters()}

            def on_train_end(self, args, state, control, model=None, **kw):
                import torch

                params = dict(model.named_parameters())
                watch.trainable = {n for n, p in params.items() if p.requires_grad}
                watch.changed = {n for n, p in params.items() if not torch.equal(watch.before[n], p.detach())}

        self.callback = CB()


def test_peft_section_is_validated(tmp_path):
    from drgym.errors import ConfigError
    from drgym.training.config import build_peft_config

    cfg = lora_config(tmp_path)
    lc = build_peft_config(cfg)
    assert lc.r == 4 and lc.task_type == "CAUSAL_LM" and lc.layers_to_transform == [28, 29]
    with pytest.raises(ConfigError, match="lora_alph"):
        build_peft_config(lora_config(tmp_path, peft={"r": 4, "lora_alph": 8}))
    with pytest.raises(ConfigError, match="not both"):
        lora_config(tmp_path, trainable_layers=2)
    with pytest.raises(ConfigError, match="filter_group"):
        lora_config(tmp_path, zero_variance={"filter_group": True})
    from drgym.training.config import build_grpo_args

    for lt in ("grpo", "dr_grpo", "dapo"):
        for sr in ("group", "batch", "none"):
            c = lora_config(tmp_path)
            c.grpo.update(loss_type=lt, scale_rewards=sr)
            g = build_grpo_args(c, validate_only=True)
            assert (g.loss_type, g.scale_rewards) == (lt, sr)
    for key, bad in (("loss_type", "dr-grpo"), ("scale_rewards", "groups")):
        c = lora_config(tmp_path)
        c.grpo[key] = bad
        with pytest.raises(ConfigError, match=f"grpo.{key} must be one of"):
            build_grpo_args(c, validate_only=True)


def test_lora_sft_then_grpo_trains_only_adapters_and_saves_loadable_adapters(tmp_path, bm25_backend):
    import torch

    from drgym.models import ADAPTER_CONFIG, SMOLLM2_HUB_NAME, load_model, training_record
    from drgym.policies.hf import HFPolicy
    from drgym.training.grpo import run_grpo
    from drgym.training.sft import make_scripted_trajectories, run_sft

    # SFT: a fresh LoRA adapter on scripted trajectories of 4 questions (gold answers)
    cfg = lora_config(tmp_path)
    trajs = tmp_path / "scripted.jsonl"
    make_scripted_trajectories(cfg, trajs, limit=4, backend=bm25_backend)
    sft_watch = WeightWatch()
    sft_final = run_sft(cfg, [trajs], output_dir=str(tmp_path / "sft"), gold_answers=True,
                        extra_callbacks=[sft_watch.callback])
    for w in [sft_watch]:
        assert w.trainable and all("lora_" in n for n in w.trainable)
        assert {n.split(".layers.")[1].split(".")[0] for n in w.trainable} == {"28", "29"}
    # LoRA's B starts at 0, so one step moves every B and no A; nothing else moves
    assert sft_watch.changed and sft_watch.changed <= sft_watch.trainable
    assert all("lora_B" in n for n in sft_watch.changed)
    files = {p.name for p in sft_final.iterdir()}
    assert {"adapter_model.safetensors", ADAPTER_CONFIG, "drgym_training.json"} <= files
    assert "model.safetensors" not in files  # an adapter, not a full model
    rec = training_record(str(sft_final))
    assert rec["adapter"] is True and rec["base_model"] == "smollm2" and rec["stage"] == "sft"
    assert rec["layout"] == "continuation" and rec["peft"]["r"] == 4
    assert json.loads((sft_final / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == SMOLLM2_HUB_NAME
    summary = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    assert summary["global_step"] == 1 and 0 < summary["trainable_params"] < summary["total_params"] / 100

    # GRPO continues the SFT adapter for 2 steps: all its LoRA weights move, nothing else
    gcfg = lora_config(tmp_path, model=str(sft_final), output_dir=str(tmp_path / "grpo"))
    watch = WeightWatch()
    out = run_grpo(gcfg, backend=bm25_backend, extra_reward_funcs=[action_chars], extra_callbacks=[watch.callback])
    assert out["global_step"] == 2
    assert watch.trainable and all("lora_" in n for n in watch.trainable)
    assert watch.changed == watch.trainable

    # the saved adapter carries its record; hf: loads base + adapter
    final = tmp_path / "grpo" / "final"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    rec = training_record(str(final))
    assert rec["adapter"] and rec["base_model"] == "smollm2" and rec["stage"] == "grpo"
    assert rec["init_from"] == str(sft_final)
    merged = load_model(str(final))
    peft_model = load_model(str(final), adapter="frozen")
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1345]])
    with torch.no_grad():
        a = merged(ids).logits
        b = peft_model(ids).logits
        base = load_model("smollm2")(ids).logits
    assert torch.allclose(a, b, atol=1e-4)  # merging keeps the adapter's function
    assert not torch.allclose(a, base, atol=1e-4)  # and the adapter changed the base model
    pol = HFPolicy(str(final), max_new_tokens=4)
    assert pol.layout == "continuation" and pol.scaffold == "none"
    assert len(pol.act([[{"role": "user", "content": "Question: who wrote the Iliad?"}]])) == 1


# -- zero-variance groups ------------------------------------------------------------------------
def test_degenerate_rows_are_groups_with_equal_weighted_rewards():
    from collections import defaultdict, deque
    from types import SimpleNamespace

    import torch

    from drgym.training.grpo import degenerate_rows

    logs = {"rewards": defaultdict(lambda: deque(maxlen=16))}
    # 3 groups of 2: f1 equal within group 0, format differs in group 1, group 2 unscorable in one row
    for v in (0.5, 0.5, 0.0, 0.0, 1.0, float("nan")):
        logs["rewards"]["f1"].append(v)
    for v in (0.2, 0.2, 0.0, 0.2, 0.2, float("nan")):
        logs["rewards"]["format"].append(v)
    tr = SimpleNamespace(_logs=logs, reward_func_names=["f1", "format"], reward_weights=torch.tensor([1.0, 0.2]),
                         num_generations=2, accelerator=SimpleNamespace(num_processes=1, process_index=0))
    assert degenerate_rows(tr, 6) == [True, True, False, False, True, True]
    # a second process sees its own half of the gathered batch
    tr.accelerator = SimpleNamespace(num_processes=2, process_index=1)
    assert degenerate_rows(tr, 3) == [False, True, True]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_filtering_zero_variance_groups_only_renormalises_the_loss(tmp_path, bm25_backend, loss_type):
    """TRL's loss on a batch with one zero-variance group: with the filter, the gradient is the
    unfiltered one times N_all / N_informative (loss tokens for dapo, rows for grpo and
    dr_grpo), so dropping the group (and trimming the padding it leaves) changes the
    normaliser and nothing else; a batch of only zero-variance groups skips the forward pass."""
    import torch

    from drgym.training.grpo import INFORMATIVE, build_trainer

    cfg = lora_config(tmp_path, zero_variance={"filter_groups": True})
    cfg.grpo["loss_type"] = loss_type
    trainer, parts = build_trainer(cfg, backend=bm25_backend)
    tok = parts["tokenizer"]
    model = trainer.model
    texts = ["<search> Lilu mythology </search>", "<answer> a spirit </answer>",
             "<search> who was Gallu in Akkadian texts </search>", "<answer> demon </answer>"]
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, enc))
    completion_ids = torch.tensor([e + [tok.pad_token_id] * (width - len(e)) for e in enc])
    completion_mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in enc])
    prompt = tok("Question: If Gallu is a demon Lilu is what?", add_special_tokens=False)["input_ids"]
    # rows 0-1: an informative group; rows 2-3: a zero-variance group (advantage 0), with a longer prompt
    prompt_ids = torch.tensor([[tok.pad_token_id] * 3 + prompt] * 2 + [[11, 12, 13] + prompt] * 2)
    prompt_mask = torch.tensor([[0] * 3 + [1] * len(prompt)] * 2 + [[1] * (len(prompt) + 3)] * 2)
    base = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor([0.7, -0.7, 0.0, 0.0]),
            "tool_mask": torch.ones_like(completion_mask)}
    n_all = completion_mask.sum()
    n_inf = completion_mask[:2].sum()
    factor = float(n_all / n_inf) if loss_type == "dapo" else 2.0  # 4 rows -> 2 rows
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() before the first step

    def grads(inputs):
        model.zero_grad()
        loss = trainer._compute_loss(model, dict(inputs))
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain = grads({**base, "num_items_in_batch": n_all})
    filtered = grads({**base, "num_items_in_batch": n_inf, INFORMATIVE: torch.tensor([True, True, False, False])})
    assert any(g.abs().sum() > 0 for g in plain.values())
    for n in plain:
        assert torch.allclose(filtered[n], plain[n] * factor, rtol=1e-3, atol=1e-7), n

    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    loss = trainer._compute_loss(model, {**base, "num_items_in_batch": n_inf, INFORMATIVE: torch.zeros(4, dtype=torch.bool)})
    hook.remove()
    assert calls == [] and float(loss.detach()) == 0.0 and loss.requires_grad


def test_grpo_steps_with_only_zero_variance_groups_skip_the_update(tmp_path, bm25_backend):
    """The base model never answers in 8-token turns, so F1 and format are 0 in every rollout:
    with the filter on, each step logs filtered_frac 1 and runs no forward pass for the loss,
    and the adapter does not move."""
    from drgym.training.grpo import build_trainer

    cfg = lora_config(tmp_path, zero_variance={"filter_groups": True})
    trainer, _ = build_trainer(cfg, backend=bm25_backend)
    watch = WeightWatch()
    trainer.add_callback(watch.callback)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "zero_variance/filtered_frac" in h]
    assert len(logs) == 2 and all(h["zero_variance/filtered_frac"] == 1.0 for h in logs)
    assert all(h["guard/degenerate_group_frac"] == 1.0 and h["frac_reward_zero_std"] == 1.0 for h in logs)
    assert watch.trainable and not watch.changed
