"""GRPO on CPU with the bundled SmolLM2-135M over real HotpotQA questions.

Tiny settings (one trainable decoder layer, 2 questions x 2 rollouts, 8-token turns) so
one step takes seconds. The base model rarely answers, so the task rewards are mostly
equal; a reward on the characters the model wrote gives every group a reward spread,
which the weight-change check needs.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def action_chars(prompts, completions, trajectory=None, **kw):
    """Characters the model wrote (all its actions, from the rollout's trajectory) / 100.

    Sampled 8-token turns differ in character count almost surely, so every group gets a
    reward spread (unlike a token count, which is 16 whenever both turns hit the cap)."""
    return [sum(len(s["action"]) for s in t["steps"]) / 100 for t in trajectory]


def tiny_config(tmp_path, eval_every: int = 0, **grpo):
    from drgym.training.config import load_config

    g = {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2, "save_strategy": "no",
         "report_to": "none", "logging_steps": 1, "learning_rate": 1e-4, "shuffle_dataset": True}
    g.update(grpo)
    return load_config("searchqa_smollm2_cpu", {
        "output_dir": str(tmp_path / "run"), "trainable_layers": 1, "torch_threads": 1,
        "tasks": {"train": {"set": "hotpotqa-dev", "start": 0, "limit": 4},
                  "eval": {"set": "hotpotqa-dev", "start": 60, "limit": 2}},
        "rollout": {"max_turns": 2, "max_new_tokens": 8, "max_completion_tokens": 256, "gen_batch_size": 4},
        "env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 1, "max_obs_tokens": 40, "max_fetches": 0}},
        "eval": {"every_steps": eval_every, "num_tasks": 2, "max_turns": 2}, "grpo": g,
    })


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """build_trainer applies the config's torch_threads (1) process-wide; restore it after."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def bm25(bm25_backend):
    """bm25s over HippoRAG's HotpotQA + MuSiQue paragraphs (tests/envs_helpers.py, ~2 s)."""
    return bm25_backend


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_grpo_two_steps_change_weights_and_mask_observations(tmp_path, bm25):
    import torch

    from drgym.training.grpo import build_trainer

    cfg = tiny_config(tmp_path, eval_every=2)
    trainer, parts = build_trainer(cfg, backend=bm25, extra_reward_funcs=[action_chars])
    before = _snapshot(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 2
    after = dict(trainer.model.named_parameters())
    trainable = {n for n, p in after.items() if p.requires_grad}
    changed = {n for n in trainable if not torch.equal(before[n], after[n].detach())}
    assert trainable and changed == trainable  # every trainable tensor moved
    frozen = [n for n in after if n not in trainable]
    assert frozen and all(torch.equal(before[n], after[n].detach()) for n in frozen)

    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    assert len(logs) == 2
    rollout = parts["rollout"]
    assert len(rollout.model_tokens) == 2 and all(len(x) == 4 for x in rollout.model_tokens)
    for h, counts in zip(logs, rollout.model_tokens):
        # TRL's completion length counts only env_mask=1 tokens: observations are excluded
        assert h["completions/mean_length"] == pytest.approx(sum(counts) / len(counts))
        assert "rewards/f1/mean" in h and "rewards/format/mean" in h and "rewards/action_chars/mean" in h
        assert "env/turns_mean" in h and "guard/degenerate_group_frac" in h
    # the rollouts really contained observation tokens (masked), not only model tokens
    assert any(h["env/obs_tokens_mean"] > 0 for h in logs)
    # metrics.jsonl: a training record per step, held-out evaluations at steps 0 and 2
    from drgym.training.callbacks import read_metrics

    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train_steps = [r["step"] for r in rows if "reward" in r]
    eval_steps = [r["step"] for r in rows if "eval/reward" in r]
    assert train_steps == [1, 2] and eval_steps == [0, 2]
    assert all("rewards/f1/std" in r and "entropy" in r for r in rows if "reward" in r)
    # each evaluation is a rollout run directory (drgym rollout's runner): 2 held-out episodes at step 2
    assert (tmp_path / "run" / "eval" / "step_2" / "trajectories.jsonl").read_text().count("\n") == 2
    import json

    rec = json.loads((tmp_path / "run" / "eval" / "step_2" / "config.json").read_text())
    assert rec["policy"]["name"] == "hf:run@step_2" and rec["policy"]["layout"] == "continuation"
    assert rec["env"]["max_turns"] == 2 and rec["env"]["top_k"] == 1


def test_observation_tokens_get_no_gradient(tmp_path, bm25):
    """TRL's GRPO loss with our env_mask: d loss / d hidden state is zero at the positions that
    predict observation tokens, and replacing the observation text (placed last, so nothing
    conditions on it) leaves the parameter gradients unchanged, while without the mask they
    change (so the check can fail)."""
    import torch

    from drgym.training.grpo import build_trainer

    cfg = tiny_config(tmp_path)
    trainer, parts = build_trainer(cfg, backend=bm25, extra_reward_funcs=[action_chars])
    tok = parts["tokenizer"]
    model = trainer.model
    prompt = tok("<|im_start|>user\nQuestion: Who wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n",
                 add_special_tokens=False)["input_ids"]
    act = tok("<search> Hamlet author </search>", add_special_tokens=False)["input_ids"]
    obs_a = tok("\n\n<information>Doc 1 (Title: Hamlet) Hamlet is a tragedy by William Shakespeare.</information>\n\n",
                add_special_tokens=False)["input_ids"]
    obs_b = tok("\n\n<information>Doc 1 (Title: Paris) Paris is the capital of France, on the Seine.</information>\n\n",
                add_special_tokens=False)["input_ids"]
    n = min(len(obs_a), len(obs_b))
    obs_a, obs_b = obs_a[:n], obs_b[:n]

    def loss_for(obs, tool_mask_on=True, capture=None):
        """Backpropagate TRL's loss; return the gradient of the trainable parameters (flat)."""
        comp = act + obs
        inputs = {
            "prompt_ids": torch.tensor([prompt]), "prompt_mask": torch.ones(1, len(prompt), dtype=torch.long),
            "completion_ids": torch.tensor([comp]), "completion_mask": torch.ones(1, len(comp), dtype=torch.long),
            "tool_mask": torch.tensor([[1] * len(act) + [0 if tool_mask_on else 1] * len(obs)]),
            "advantages": torch.tensor([1.0]), "num_items_in_batch": torch.tensor(float(len(act))),
        }
        handle = None
        if capture is not None:
            def hook(_m, _i, out):
                out.retain_grad()
                capture.append(out)
            handle = model.model.norm.register_forward_hook(hook)
        model.zero_grad()
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        if handle is not None:
            handle.remove()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad]).clone()

    logits = []
    loss_for(obs_a, capture=logits)
    assert len(logits) == 1
    # TRL fuses lm_head and the log-softmax, so the last per-position tensor is the final
    # norm's output: hidden state at input position q gives the logits that predict q+1.
    g = logits[0].grad[0]  # (positions, hidden)
    assert g.shape[0] == len(prompt) + len(act) + n
    a0 = len(prompt) - 1  # predicts the first action token
    a1 = a0 + len(act)
    assert g[a0:a1].abs().sum() > 0  # positions predicting model (action) tokens: gradient
    assert g[a1:a1 + n].abs().sum() == 0  # positions predicting observation tokens: none
    # (the GRPO loss value itself is -advantage x ratio with ratio 1 on-policy, whatever the
    # text, so the comparison is on gradients)
    assert torch.equal(loss_for(obs_a), loss_for(obs_b))
    assert not torch.allclose(loss_for(obs_a, tool_mask_on=False), loss_for(obs_b, tool_mask_on=False))


@pytest.mark.slow
@pytest.mark.parametrize("ckpt_step", [1, 2])  # mid-epoch and at an epoch boundary (2 steps per epoch)
def test_resume_continues_at_the_right_step_with_the_same_data(tmp_path, bm25, ckpt_step):
    from drgym.training.grpo import build_trainer

    g = {"max_steps": 3, "save_strategy": "steps", "save_steps": 1, "save_total_limit": None, "seed": 3}
    full, fparts = build_trainer(tiny_config(tmp_path, **g), backend=bm25, extra_reward_funcs=[action_chars])
    full.train()
    assert full.state.global_step == 3
    ckpt = tmp_path / "run" / f"checkpoint-{ckpt_step}"
    assert ckpt.is_dir()
    import json

    rec = json.loads((ckpt / "drgym_training.json").read_text())  # TrainingRecordCallback
    assert rec["stage"] == "grpo" and rec["layout"] == "continuation" and rec["protocol"] == "tags"

    res, rparts = build_trainer(tiny_config(tmp_path, **g), backend=bm25, extra_reward_funcs=[action_chars])
    res.train(resume_from_checkpoint=str(ckpt))
    assert res.state.global_step == 3
    # the resumed run generated for the remaining steps only, with the same questions in the same order
    assert rparts["rollout"].history == fparts["rollout"].history[ckpt_step:]
    # its log continues the checkpoint's (restored) log: each step once, none skipped
    assert [h["step"] for h in res.state.log_history if "loss" in h] == [1, 2, 3]
    # epochs differ in order with seed 3 (so the check above is not trivially true)
    assert fparts["rollout"].history[0] != fparts["rollout"].history[2]


class _Killed(Exception):
    """Stands in for a kill: raised by a callback mid-run, after a checkpoint."""


@pytest.mark.slow
def test_killed_run_resumes_exactly_weights_optimizer_data_order_and_logs(tmp_path, bm25):
    """A run stopped after step 3 (its last checkpoint is step 2) and resumed ends where an
    uninterrupted run ends: same step counter, the data order continued (not restarted),
    the same weights and AdamW moments, the same logged rewards and losses. The learning
    rate is high enough that the weights move at every step, so a lost optimizer or weight
    state would show."""
    import torch
    from transformers import TrainerCallback

    from drgym.training.callbacks import last_complete_checkpoint
    from drgym.training.grpo import build_trainer

    g = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "save_total_limit": None, "seed": 3,
         "learning_rate": 1e-3}

    def trainer_in(folder, callbacks=()):
        return build_trainer(tiny_config(folder, **g), backend=bm25, extra_reward_funcs=[action_chars],
                             extra_callbacks=list(callbacks))

    full, fparts = trainer_in(tmp_path / "full")
    start = _snapshot(full.model)
    moved = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            moved.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})

    full.add_callback(Watch())
    full.train()
    assert full.state.global_step == 4
    # the weights change at every step (so the comparison below can fail)
    prev = {n: start[n] for n in moved[0]}
    for snap in moved:
        assert any(not torch.equal(prev[n], snap[n]) for n in snap)
        prev = snap

    class KillAfterStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                raise _Killed()

    killed, _ = trainer_in(tmp_path / "killed", [KillAfterStep3()])
    with pytest.raises(_Killed):
        killed.train()
    ckpt = last_complete_checkpoint(tmp_path / "killed" / "run")
    assert ckpt is not None and ckpt.endswith("checkpoint-2")
    # scripts/long_run.py commits checkpoints without these two files (they name this
    # machine's paths): a resume must not need them
    from pathlib import Path

    for name in ("training_args.bin", "README.md"):
        (Path(ckpt) / name).unlink(missing_ok=True)

    res, rparts = trainer_in(tmp_path / "killed")
    res.train(resume_from_checkpoint=ckpt)
    assert res.state.global_step == 4
    # data order continued: the resumed run drew exactly the uninterrupted run's batches 3 and 4
    assert rparts["rollout"].history == fparts["rollout"].history[2:]
    assert fparts["rollout"].history[0] != fparts["rollout"].history[2]  # epochs differ, so this is not trivial
    fw, rw = dict(full.model.named_parameters()), dict(res.model.named_parameters())
    trainable = [n for n, p in fw.items() if p.requires_grad]
    assert trainable
    for n in trainable:
        assert torch.allclose(fw[n], rw[n], atol=1e-6, rtol=0), n
        assert not torch.equal(start[n], rw[n].detach()), n
    fo, ro = full.optimizer.state_dict()["state"], res.optimizer.state_dict()["state"]
    assert fo.keys() == ro.keys() and fo
    for k in fo:
        for m in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(fo[k][m], ro[k][m], atol=1e-7, rtol=1e-4), (k, m)
        assert float(fo[k]["step"]) == float(ro[k]["step"]) == 4.0

    def logged(tr):
        return {h["step"]: (h["reward"], h["loss"]) for h in tr.state.log_history if "loss" in h and "reward" in h}

    lf, lr = logged(full), logged(res)
    assert sorted(lr) == [1, 2, 3, 4]
    for step in (3, 4):
        assert lr[step] == pytest.approx(lf[step], abs=1e-6)


def _json_config(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg.protocol = "json"
    return cfg


def test_json_protocol_runs_in_the_shared_rollout(tmp_path, bm25):
    """``protocol: json`` trains through the same rollout_func and driver as tags: turns stop
    at ``</tool_call>``, and the prompt is the env's JSON system prompt in the model's own
    chat template (no tool template swapped in)."""
    from drgym.envs.prompts import QA_SYSTEM_JSON
    from drgym.training.grpo import build_trainer
    from drgym.training.rollout import SearchRolloutFunc

    trainer, parts = build_trainer(_json_config(tmp_path), backend=bm25)
    rollout = parts["rollout"]
    assert isinstance(rollout, SearchRolloutFunc) and trainer.rollout_func is rollout
    assert rollout.settings.protocol == "json" and rollout.settings.stops == ("</tool_call>",)
    assert not getattr(trainer, "environment_factories", None)
    tok = parts["tokenizer"]
    row = parts["dataset"][0]
    assert "You are Qwen" not in row["prompt"] and QA_SYSTEM_JSON in row["prompt"]
    assert row["prompt"].endswith("<|im_start|>assistant\n") and f"Question: {row['question']}" in row["prompt"]
    assert tok.chat_template == type(tok).from_pretrained(tok.name_or_path).chat_template  # SmolLM2's own
    env = rollout.env_factory()
    assert env.protocol == "json"


@pytest.mark.slow
def test_json_protocol_trains_one_step(tmp_path, bm25):
    from drgym.training.grpo import build_trainer

    cfg = _json_config(tmp_path)
    cfg.grpo["max_steps"] = 1
    trainer, _ = build_trainer(cfg, backend=bm25, extra_reward_funcs=[action_chars])
    trainer.train()
    assert trainer.state.global_step == 1
    h = [x for x in trainer.state.log_history if "env/turns_mean" in x]
    assert h and "rewards/f1/mean" in h[0] and "env/retrieved_token_frac" in h[0]
    assert 0 < h[0]["env/turns_mean"] <= cfg.rollout_settings().max_turns
