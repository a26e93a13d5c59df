"""Seconds per GRPO step on CPU, split by phase, vs a plain single-turn GRPO step.

Multi-turn: ``drgym train grpo``'s trainer (rollout_func over drgym/SearchQA-v0, tag
protocol) for ``--steps`` optimizer steps. Each step's wall time is split into
``generation`` (model.generate calls inside the rollout), ``env`` (env reset/step incl.
search), ``reward`` (the reward functions) and ``optimisation`` (the rest: TRL's
log-prob forward, loss, backward, optimizer step, bookkeeping).

Single-turn baseline: TRL's own generation path (no rollout_func, no env) on the same
prompts and model, forced to write the same number of completion tokens per rollout as
the multi-turn run produced on average (model + observation tokens), via
``min_new_tokens = max_new_tokens``. Target: multi-turn / single-turn <= 1.2.

    python scripts/bench_train.py --out bench_train.json [--model PATH] [--steps 2]

Writes JSON with per-step records, medians and the ratio.

``--vs-full`` (for a config with a ``peft`` section) times LoRA against full fine-tuning
on the same tokens instead: one real GRPO step of the config produces a generation batch
(prompts, multi-turn completions, ``env_mask``, advantages); then the optimisation of that
same batch (TRL's GRPO loss, backward, AdamW step) is timed ``--repeats`` times for
(a) the config's LoRA adapter, (b) full fine-tuning (every parameter) and (c) the top 10
decoder layers (the earlier CPU config), and one rollout turn of the batch's prompts is
generated greedily with the LoRA model unmerged (as GRPO does) and with the plain model
(same tokens: a fresh adapter's B matrices are 0).

    python scripts/bench_train.py --config smollm2_drgym_cpu --vs-full --out training/results/bench_train_lora.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class _Timed:
    """Wrap a TRL reward function and add its wall time to a shared counter."""

    def __init__(self, f, acc):
        self.f, self.acc = f, acc
        self.__name__ = f.__name__

    def __call__(self, *a, **k):
        t = time.perf_counter()
        try:
            return self.f(*a, **k)
        finally:
            self.acc[0] += time.perf_counter() - t


def _step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times = []
            self._t = None

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    return StepTimer()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="searchqa_smollm2_cpu")
    ap.add_argument("--model", default=None, help="model folder (e.g. an SFT output); default the config's")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default="bench_train.json")
    ap.add_argument("--vs-full", action="store_true", help="LoRA vs full fine-tuning on the same batch (see above)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if a.vs_full:
        return lora_vs_full(a)

    import tempfile

    from drgym.training.config import load_config
    from drgym.training.grpo import build_trainer

    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    over = {"output_dir": str(tmp / "multi"), "eval": {"every_steps": 0},
            "grpo": {"max_steps": a.steps, "save_strategy": "no", "report_to": "none"}}
    if a.model:
        over["model"] = a.model
    cfg = load_config(a.config, over)
    timer = _step_timer()
    trainer, parts = build_trainer(cfg, extra_callbacks=[timer])
    acc = [0.0]
    rew: list[float] = []  # reward seconds per step (between one rollout and the next)
    trainer.reward_funcs = [_Timed(f, acc) for f in trainer.reward_funcs]
    rollout = parts["rollout"]
    gen, env = [], []
    orig_run = rollout.run

    def run(*args, **kw):
        if gen:
            rew.append(acc[0])
        acc[0] = 0.0
        out = orig_run(*args, **kw)
        gen.append(rollout.last_timings["generation_s"])
        env.append(rollout.last_timings["env_s"])
        return out

    rollout.run = run
    trainer.train()
    rew.append(acc[0])
    tok_counts = rollout.model_tokens
    multi_steps = []
    for i, total in enumerate(timer.times):
        multi_steps.append({"step_s": total, "generation_s": gen[i], "env_s": env[i], "reward_s": rew[i],
                            "model_tokens_mean": statistics.mean(tok_counts[i])})
    comp_len = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    obs_len = [h.get("env/obs_tokens_mean") for h in trainer.state.log_history if "env/obs_tokens_mean" in h]
    total_tokens = round(statistics.mean(c + o for c, o in zip(comp_len, obs_len)))

    # -- single-turn baseline: same model/prompts, TRL's own generate, same completion tokens
    from trl import GRPOTrainer

    from drgym.training.config import build_grpo_args

    base_cfg = load_config(a.config, {**over, "output_dir": str(tmp / "single")})
    base_cfg.grpo.update({"max_completion_length": total_tokens,
                          "generation_kwargs": {"min_new_tokens": total_tokens}})
    bargs = build_grpo_args(base_cfg)
    timer2 = _step_timer()
    model = trainer.model
    acc2 = [0.0]

    def completion_chars(prompts, completions, **k):
        """A cheap real reward for the baseline: characters of each completion."""
        return [float(len(c)) for c in completions]

    base = GRPOTrainer(model=model, reward_funcs=[_Timed(completion_chars, acc2)], args=bargs,
                       train_dataset=parts["dataset"], processing_class=parts["tokenizer"], callbacks=[timer2])
    base.train()
    single = [{"step_s": t} for t in timer2.times]
    base_len = [h.get("completions/mean_length") for h in base.state.log_history if "completions/mean_length" in h]

    med = lambda xs: statistics.median([x for x in xs if x is not None]) if any(x is not None for x in xs) else None  # noqa: E731
    m_step = med([s["step_s"] for s in multi_steps])
    s_step = med([s["step_s"] for s in single])
    result = {
        "config": cfg.source, "model": cfg.model, "steps": a.steps,
        "rollouts_per_step": trainer.args.generation_batch_size,
        "torch_threads": cfg.torch_threads, "load_avg_1m_at_end": os.getloadavg()[0],
        "multi_turn": {
            "per_step": multi_steps,
            "median_step_s": m_step,
            "median_generation_s": med([s["generation_s"] for s in multi_steps]),
            "median_env_s": med([s["env_s"] for s in multi_steps]),
            "median_reward_s": med([s["reward_s"] for s in multi_steps]),
            "median_optimisation_s": med([s["step_s"] - s["generation_s"] - s["env_s"] - s["reward_s"]
                                          for s in multi_steps]),
            "completion_tokens_mean (model, env_mask=1)": statistics.mean(comp_len),
            "observation_tokens_mean (env_mask=0)": statistics.mean(obs_len),
        },
        "single_turn": {"per_step": single, "median_step_s": s_step, "completion_tokens": total_tokens,
                        "completion_tokens_logged": base_len},
        "ratio_multi_over_single": (m_step / s_step) if s_step else None,
        "target_ratio": 1.2,
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def lora_vs_full(a) -> int:
    """``--vs-full``: optimisation and generation seconds of LoRA vs full fine-tuning, same batch."""
    import resource
    import tempfile

    import torch

    from drgym.models import load_model
    from drgym.training.config import build_peft_config, load_config
    from drgym.training.grpo import build_trainer
    from drgym.training.rollout import hf_generate_turn
    from drgym.training.sft import count_parameters, freeze_bottom

    load_start = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_lora_"))
    over = {"output_dir": str(tmp / "run"), "eval": {"every_steps": 0},
            "grpo": {"max_steps": 1, "save_strategy": "no", "report_to": "none"}}
    if a.model:
        over["model"] = a.model
    cfg = load_config(a.config, over)
    if not cfg.peft:
        raise SystemExit(f"{a.config} has no peft section; --vs-full compares its LoRA adapter with full fine-tuning.")
    trainer, parts = build_trainer(cfg)
    captured = {}
    orig = trainer._generate_and_score_completions

    def capture(inputs):
        out = orig(inputs)
        captured["batch"] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}
        return out

    trainer._generate_and_score_completions = capture
    t0 = time.perf_counter()
    trainer.train()
    real_step_s = time.perf_counter() - t0
    batch = captured["batch"]
    batch.pop("drgym_informative", None)
    batch["advantages"] = torch.linspace(-1.0, 1.0, batch["advantages"].numel())  # a gradient in every variant
    loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
    batch["num_items_in_batch"] = loss_mask.sum()
    tokens = {"rows": int(batch["completion_ids"].size(0)),
              "prompt_tokens": int(batch["prompt_mask"].sum()), "completion_tokens": int(batch["completion_mask"].sum()),
              "loss_tokens (model, env_mask=1)": int(loss_mask.sum()),
              "padded_width": int(batch["prompt_ids"].size(1) + batch["completion_ids"].size(1))}
    trainer.current_gradient_accumulation_steps = 1
    base_name = cfg.model

    def variant(kind: str):
        """LoRA: the config's adapter (a fresh one, or the one ``--model`` holds); full / top10:
        the plain model (an adapter merged into its base)."""
        torch.manual_seed(0)
        m = load_model(base_name, dtype=torch.float32, adapter="trainable" if kind == "lora" else "merge")
        if kind == "lora":
            from accelerate.utils import is_peft_model
            from peft import get_peft_model

            if not is_peft_model(m):
                m = get_peft_model(m, build_peft_config(cfg))
        elif kind == "full":
            for p in m.parameters():
                p.requires_grad_(True)
        else:  # top10
            freeze_bottom(m, 10)
        # as GRPOTrainer.__init__ does to its own model: log-probs from a fused LM head
        from accelerate.utils import is_peft_model as _is_peft
        from trl.trainer.grpo_trainer import add_fused_lm_head

        add_fused_lm_head(m.get_base_model() if _is_peft(m) else m, temperature=trainer.temperature,
                          cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32, outputs=("log_probs", "entropy"))
        m.train()
        return m

    opt_rows = {}
    for kind in ("lora", "full", "top10"):
        m = variant(kind)
        trainable, total = count_parameters(m)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5)
        times = []
        for _ in range(a.repeats + 1):  # the first repeat warms up (allocations, optimizer state)
            t = time.perf_counter()
            loss = trainer._compute_loss(m, dict(batch))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t)
        opt_rows[kind] = {"trainable_params": trainable, "total_params": total, "warmup_s": times[0],
                          "optimisation_s": times[1:], "median_optimisation_s": statistics.median(times[1:])}
        del m, opt

    # generation: one greedy turn of the batch's prompts, LoRA unmerged vs the plain model
    tok = parts["tokenizer"]
    prompts = [row[m.bool()].tolist() for row, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
    gen_rows = {}
    for kind in ("lora_unmerged", "plain"):
        m = variant("lora") if kind == "lora_unmerged" else load_model(base_name, dtype=torch.float32)
        m.eval()
        times, ntok = [], 0
        for _ in range(a.repeats):
            t = time.perf_counter()
            ids, _ = hf_generate_turn(m, tok, prompts, max_new_tokens=cfg.rollout_settings().max_new_tokens,
                                      temperature=1.0, do_sample=False)
            times.append(time.perf_counter() - t)
            ntok = sum(map(len, ids))
        gen_rows[kind] = {"generation_s": times, "median_generation_s": statistics.median(times), "new_tokens": ntok}
        del m
    lo, fu = opt_rows.get("lora", {}), opt_rows.get("full", {})
    result = {
        "what": "LoRA vs full fine-tuning on the same GRPO batch (scripts/bench_train.py --vs-full)",
        "config": cfg.source, "model": str(cfg.model), "peft": cfg.peft, "torch_threads": cfg.torch_threads,
        "repeats": a.repeats, "load_avg_1m_at_start_end": [load_start, os.getloadavg()[0]],
        "real_grpo_step_s (LoRA, incl. rollout)": real_step_s, "batch": tokens,
        "optimisation": opt_rows, "generation_one_turn": gen_rows,
        "ratio_optimisation_lora_over_full": (lo["median_optimisation_s"] / fu["median_optimisation_s"])
        if "median_optimisation_s" in lo and "median_optimisation_s" in fu else None,
        "peak_rss_gb_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
