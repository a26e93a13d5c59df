"""GRPO on TRL with multi-turn drgym rollouts (``drgym train grpo``).

Two paths, chosen by the config's ``protocol``:

``tags`` (default)
    ``GRPOTrainer(rollout_func=SearchRolloutFunc(...))`` drives ``drgym/SearchQA-v0``
    with the Search-R1 tag protocol; observation tokens get ``env_mask`` 0 and are
    excluded from the loss (TRL 1.16 ``loss_mask = completion_mask * tool_mask``).
``json``
    ``GRPOTrainer(environment_factory=...)``: TRL's own tool loop with JSON tool calls
    rendered by the chat template (:mod:`drgym.training.toolenv`). SmolLM2's template
    cannot render tool calls, so TRL's ``qwen2_5.jinja`` (same ChatML tokens) is swapped
    in (:func:`drgym.training.toolenv.use_tool_template`).

Rewards are drgym reward modules (``drgym.rewards``) adapted to TRL's
``f(prompts, completions, **kwargs) -> list[float | None]``; each is one TRL reward
function, so TRL logs ``rewards/<name>/mean`` and ``/std`` per component. GRPO itself is
Shao et al. 2024 (DeepSeekMath, §4.1); TRL's default loss here is DAPO's token-level
normalisation (Yu et al. 2025).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from drgym.training.data import (
    build_dataset,
    check_disjoint,
    json_dataset,
    load_task_slice,
    make_env_factory,
)
from drgym.training.evaluation import make_evaluator
from drgym.training.rewards import build_reward_funcs

from drgym.errors import ConfigError

log = logging.getLogger(__name__)


def _trainer_class():
    """``GRPOTrainer`` whose train sampler reseeds per epoch (resume keeps the data order).

    TRL's ``RepeatSampler`` seeds its generator once, so epoch ``e`` of a run sees the
    ``e``-th permutation of one random stream, while a run resumed in epoch ``e`` starts the
    stream again and would replay epoch 0's order. Reseeding with ``seed + epoch`` in
    ``set_epoch`` (which the HF Trainer calls at the start of every epoch, resumed or not)
    makes each epoch's order a function of the epoch alone.
    """
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    class EpochSeededRepeatSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)
            if self.shuffle and self.seed is not None:
                self.generator.manual_seed(int(self.seed) + self.epoch)

    class DrgymGRPOTrainer(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            base = super()._get_train_sampler(dataset)
            return EpochSeededRepeatSampler(
                data_source=base.data_source, mini_repeat_count=base.mini_repeat_count, batch_size=base.batch_size,
                repeat_count=base.repeat_count, shuffle=base.shuffle, seed=base.seed)

    return DrgymGRPOTrainer


def build_trainer(cfg, *, max_steps: int | None = None, model=None, extra_callbacks=None, backend=None,
                  extra_reward_funcs=None):
    """Build the ``GRPOTrainer`` of a run (no training yet).

    Args:
        cfg: the run config.
        max_steps: overrides ``grpo.max_steps``.
        model: an already loaded model (tests); default loads ``cfg.model`` in fp32.
        backend: a search backend to use instead of building ``cfg.search``.
        extra_reward_funcs: more TRL reward functions (weight 1 each), after the
            config's; not seen by the degenerate-group monitor.

    Returns:
        ``(trainer, parts)`` where ``parts`` holds ``rollout``, ``monitor``,
        ``reward_funcs``, ``dataset`` and ``tokenizer``.

    Raises:
        ConfigError: bad config (see :mod:`drgym.training.config`).
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from drgym.training.callbacks import (
        BatchLogCallback,
        EvalCallback,
        JsonlLoggerCallback,
        TrainingRecordCallback,
    )
    from drgym.training.config import build_grpo_args
    from drgym.training.rollout import SearchRolloutFunc
    from drgym.training.sft import freeze_bottom
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm

    if max_steps is not None:
        cfg.grpo["max_steps"] = int(max_steps)
    cfg.apply_threads()
    args = build_grpo_args(cfg)
    path = resolve_lm(cfg.model)
    tok = load_pretrained(AutoTokenizer, path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if model is None:
        torch.manual_seed(cfg.seed)
        model = load_pretrained(AutoModelForCausalLM, path, dtype=torch.float32)
    trainable, total = freeze_bottom(model, cfg.trainable_layers)
    log.info("GRPO: %d / %d parameters trainable", trainable, total)

    if "train" not in cfg.tasks:
        raise ConfigError(f"{cfg.source}: tasks.train is required for GRPO.")
    train_tasks = load_task_slice(cfg.tasks["train"])
    eval_tasks = load_task_slice(cfg.tasks["eval"]) if "eval" in cfg.tasks else []
    check_disjoint(train_tasks, eval_tasks)
    tasks_by_id = {t.task_id: t for t in train_tasks + eval_tasks}
    funcs, weights, monitor = build_reward_funcs(cfg, tasks_by_id, num_generations=args.num_generations,
                                                 output_dir=args.output_dir)
    # one scorer: the env scores each episode once with the run's rewards; the TRL reward
    # functions read the trajectory's reward_components
    from drgym.rewards.registry import WeightedReward

    scorer = WeightedReward([(f.reward, w) for f, w in zip(funcs, weights)])
    env_factory = make_env_factory(cfg, train_tasks + eval_tasks, backend=backend, reward=scorer)
    extra = list(extra_reward_funcs or [])
    args.reward_weights = weights + [1.0] * len(extra)
    callbacks = [JsonlLoggerCallback(Path(args.output_dir) / "metrics.jsonl"), TrainingRecordCallback(cfg, "grpo")]
    eval_cb = None
    if cfg.eval.every_steps and eval_tasks:
        evaluator = make_evaluator(cfg, eval_tasks[: cfg.eval.num_tasks], funcs, weights, backend=backend)
        eval_cb = EvalCallback(evaluator, cfg.eval.every_steps, args.output_dir, tokenizer=tok)
        callbacks.append(eval_cb)
    callbacks += list(extra_callbacks or [])
    GRPOTrainer = _trainer_class()

    if cfg.protocol == "json":
        from drgym.training.toolenv import make_tool_env_class, use_tool_template

        use_tool_template(tok)
        dataset = json_dataset(train_tasks, env_factory)
        trainer = GRPOTrainer(model=model, reward_funcs=funcs + extra, args=args, train_dataset=dataset,
                              processing_class=tok, callbacks=callbacks,
                              environment_factory=make_tool_env_class(env_factory))
        rollout = None
    else:
        dataset, table = build_dataset(train_tasks, env_factory, tok, enable_thinking=cfg.enable_thinking)
        rollout = SearchRolloutFunc(env_factory, table, cfg.rollout_settings())
        callbacks.append(BatchLogCallback(rollout, Path(args.output_dir) / "batches.jsonl"))
        trainer = GRPOTrainer(model=model, reward_funcs=funcs + extra, args=args, train_dataset=dataset,
                              processing_class=tok, callbacks=callbacks, rollout_func=rollout)
    monitor.trainer = trainer
    if eval_cb is not None:
        eval_cb.attach(trainer)
    return trainer, {"rollout": rollout, "monitor": monitor, "reward_funcs": funcs, "dataset": dataset,
                     "tokenizer": tok, "trainable_params": trainable, "total_params": total}


def refuse_earlier_run(out: Path) -> None:
    """Raise when ``out`` holds an earlier training run (its logs or checkpoints).

    A fresh run there would append to the old ``metrics.jsonl`` and leave higher-numbered
    ``checkpoint-N`` folders that a later ``--resume`` would pick up.

    Raises:
        ConfigError: ``out`` has ``metrics.jsonl`` or a ``checkpoint-N`` folder.
    """
    if not out.is_dir():
        return
    found = sorted(p.name for p in out.glob("checkpoint-*") if p.is_dir())
    if (out / "metrics.jsonl").exists():
        found.insert(0, "metrics.jsonl")
    if found:
        raise ConfigError(f"{out} holds an earlier run ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}); "
                          "pass --resume to continue it, or another --output-dir, or remove it.")


def run_grpo(cfg, *, resume: bool = False, max_steps: int | None = None) -> dict[str, Any]:
    """Train with GRPO and save the final model to ``<output_dir>/final``.

    Args:
        cfg: the run config.
        resume: continue from the last complete ``checkpoint-N`` in ``output_dir``
            (optimizer, scheduler, RNG states and data order restored by the HF Trainer;
            a checkpoint torn by a kill while saving is skipped). The next batch is the
            one an uninterrupted run would have drawn (``batches.jsonl`` records each
            step's task ids).
        max_steps: overrides ``grpo.max_steps``.

    Returns:
        A summary dict (also written to ``<output_dir>/summary.json``).

    Raises:
        ConfigError: bad config, ``resume`` without a checkpoint, or (without
            ``resume``) an ``output_dir`` that holds an earlier run.
    """
    import time

    from drgym.atomic import atomic_write_json
    from drgym.training.callbacks import last_complete_checkpoint

    if not resume:
        refuse_earlier_run(Path(cfg.output_dir))
    trainer, parts = build_trainer(cfg, max_steps=max_steps)
    out = Path(trainer.args.output_dir)
    ckpt = None
    if resume:
        ckpt = last_complete_checkpoint(out)  # a checkpoint torn by a kill is skipped
        if ckpt is None:
            raise ConfigError(f"--resume: no complete checkpoint-N folder in {out}.")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=ckpt)
    wall = time.perf_counter() - t0
    trainer.save_model(str(out / "final"))
    parts["tokenizer"].save_pretrained(str(out / "final"))
    from drgym.training.callbacks import write_training_record

    write_training_record(out / "final", cfg, "grpo")
    summary = {"run": cfg.name, "config": cfg.source, "global_step": trainer.state.global_step,
               "train_seconds": round(wall, 1), "resumed_from": ckpt, "train_loss": result.training_loss,
               "trainable_params": parts["trainable_params"], "total_params": parts["total_params"],
               "guard_history": parts["monitor"].history}
    atomic_write_json(out / "summary.json", summary)
    return summary
