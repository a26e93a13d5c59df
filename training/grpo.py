"""GRPO on TRL with multi-turn drgym rollouts (``drgym train grpo``).

``GRPOTrainer(rollout_func=SearchRolloutFunc(...))`` drives ``drgym/SearchQA-v0`` in
drgym's one multi-turn loop (:class:`drgym.envs.driver.BatchedDriver`, batched search),
with either protocol of the config's ``protocol``: ``tags`` (Search-R1's
``<search>``/``<answer>``) or ``json`` (``<tool_call>{...}</tool_call>``, tool results
as ``<tool_response>`` blocks). Observation tokens get ``env_mask`` 0 and are excluded
from the loss (TRL 1.16 ``loss_mask = completion_mask * tool_mask``).

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

from drgym.training.config import build_grpo_args, build_peft_config
from drgym.training.data import build_dataset, check_disjoint, load_task_slice, make_env_factory
from drgym.training.evaluation import make_evaluator
from drgym.training.rewards import build_reward_funcs
from drgym.training.rollout import SearchRolloutFunc
from drgym.training.sft import count_parameters, freeze_bottom, refuse_earlier_run

from drgym.atomic import atomic_write_json
from drgym.errors import ConfigError
from drgym.models import load_model, load_tokenizer
from drgym.rewards.registry import WeightedReward
from drgym.rewards.scorer import degenerate_groups, weighted_total

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
        drgym_filter_groups = False  # set from the config's zero_variance.filter_groups

        def _get_train_sampler(self, dataset=None):
            base = super()._get_train_sampler(dataset)
            return EpochSeededRepeatSampler(
                data_source=base.data_source, mini_repeat_count=base.mini_repeat_count, batch_size=base.batch_size,
                repeat_count=base.repeat_count, shuffle=base.shuffle, seed=base.seed)

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if self.drgym_filter_groups and self.model.training:
                mark_informative(out, degenerate_rows(self, out["completion_ids"].size(0)), self)
            return out

        def _compute_loss(self, model, inputs):
            import torch

            keep = inputs.pop(INFORMATIVE, None)
            if keep is None:
                return super()._compute_loss(model, inputs)
            rows = keep.sum().reshape(1)
            # with several processes every rank must pass the same number of rows: TRL gathers
            # per-row tensors in _compute_loss (the clip-ratio minimum and maximum), and the
            # gradient all-reduce needs every rank's backward pass (a collective, every call)
            most = int(self.accelerator.gather(rows).max()) if self.accelerator.num_processes > 1 else int(rows)
            if most == 0:
                # every group of the batch (on every rank) is zero-variance: no forward pass, and a loss
                # that reaches no parameter, so their grads stay None and AdamW leaves them (and its
                # moments) as they are
                return torch.zeros((), device=keep.device, requires_grad=True)
            return super()._compute_loss(model, select_rows(inputs, keep, pad_to=most))

    return DrgymGRPOTrainer


INFORMATIVE = "drgym_informative"
"""Key of the per-row ``bool`` tensor that marks rows of groups with a reward spread."""


def degenerate_rows(trainer, n_local: int) -> list[bool]:
    """Which rows of the local batch belong to a zero-variance group, from the rewards TRL just scored.

    Rebuilds the weighted total reward of every completion of the generation batch from
    the per-function rewards TRL logged for it (``trainer._logs["rewards"]``, gathered
    over processes, every reward function included) and ``trainer.reward_weights``,
    exactly as TRL sums them (:func:`~drgym.rewards.scorer.weighted_total` with
    ``skip_missing``, TRL's ``nansum``), groups them by ``num_generations`` and flags
    the rows of :func:`~drgym.rewards.scorer.degenerate_groups` (finite rewards all
    equal, or at most one).

    Returns:
        ``list[bool]`` of length ``n_local`` (this process's rows).

    Raises:
        ValueError: the logged rewards do not cover the batch.
    """
    n_proc = trainer.accelerator.num_processes
    n = n_local * n_proc
    names = list(trainer.reward_func_names)
    cols = [list(trainer._logs["rewards"][k])[-n:] for k in names]
    if any(len(c) != n for c in cols):
        raise ValueError(f"zero-variance filter: TRL logged {[len(c) for c in cols]} rewards for a batch of {n}.")
    w = [float(x) for x in trainer.reward_weights.tolist()]
    totals = [weighted_total([c[i] for c in cols], w, skip_missing=True) for i in range(n)]
    G = trainer.num_generations
    flags = [flat for g, flat in zip(range(0, n, G), degenerate_groups(totals, G)) for _ in range(min(G, n - g))]
    r = trainer.accelerator.process_index
    return flags[r * n_local:(r + 1) * n_local]


def mark_informative(batch: dict[str, Any], degenerate_rows: list[bool], trainer) -> dict[str, Any]:
    """Zero-variance group filter (``zero_variance.filter_groups``): mark the rows that carry signal.

    A group whose rewards are all equal has advantage 0 for every row under every
    ``scale_rewards`` choice, so it adds no gradient, only weight in the loss
    normaliser. DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2)
    resamples until a batch holds only informative groups; a ``rollout_func`` cannot
    resample, so the batch is kept at its size and the degenerate groups are dropped from
    the loss instead: rows are marked here (``batch[INFORMATIVE]``, split and shuffled
    with the batch by TRL) and removed in ``_compute_loss`` before the forward pass, and
    ``num_items_in_batch`` (the ``dapo``/``cispo`` normaliser) counts the loss tokens of the
    informative rows only. The ``grpo``/``bnpo``/``dr_grpo`` losses then average over
    informative rows as well. A batch with no informative group skips the forward and
    backward pass and leaves the weights and the optimizer's moments unchanged (its
    parameters get no gradient). With several processes every rank passes the same number
    of rows to the loss (TRL gathers per-row tensors there, and the gradient all-reduce
    needs every rank's backward pass): a rank with fewer informative rows than the most of
    any rank adds some of its dropped rows with their loss mask zeroed (they add nothing
    to the loss, its normaliser or TRL's masked metrics), and the skip happens only when
    no rank has an informative row. The losses normalised by the batch's token count over
    every rank (``dapo``, ``cispo``, ``vespo``) then equal a one-process run's on the same
    rows; TRL's ``grpo``, ``bnpo`` and ``dr_grpo`` normalise on each rank (its rows or its
    tokens), so a filler row counts in ``grpo``'s and ``dr_grpo``'s row count.
    Logged: ``zero_variance/filtered_frac`` (share of the rows of every rank dropped).

    Args:
        batch: the output of ``GRPOTrainer._generate_and_score_completions`` (modified in place).
        degenerate_rows: one bool per row of the local batch (:func:`degenerate_rows`).
        trainer: the trainer (its accelerator and metrics).

    Returns:
        ``batch``.

    Raises:
        ValueError: ``degenerate_rows`` does not match the batch size.
    """
    import torch

    n = batch["completion_ids"].size(0)
    if len(degenerate_rows) != n:
        raise ValueError(f"zero-variance filter: {len(degenerate_rows)} group flags for a batch of {n} rows.")
    device = batch["completion_ids"].device
    keep = torch.tensor([not d for d in degenerate_rows], dtype=torch.bool, device=device)
    loss_mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
    batch[INFORMATIVE] = keep
    batch["num_items_in_batch"] = trainer.accelerator.gather((loss_mask * keep.unsqueeze(1)).sum()).sum()
    # over every rank's rows (TRL logs rank 0's metrics only); a collective like the gather above
    kept = trainer.accelerator.gather(keep.float()) if trainer.accelerator.num_processes > 1 else keep.float()
    trainer._metrics["train"]["zero_variance/filtered_frac"].append(1.0 - kept.mean().item())
    return batch


def select_rows(inputs: dict[str, Any], keep, pad_to: int | None = None) -> dict[str, Any]:
    """The rows ``keep`` of a GRPO loss batch, with all-padding columns cut off.

    Tensors whose first dimension is the batch are indexed; scalars (``num_items_in_batch``)
    and other values pass through. Prompt columns that are padding in every kept row
    (left padding) and completion columns past every kept row's end (right padding) are
    cut, so the forward pass covers only what the kept rows need.

    Args:
        inputs: the loss batch (``prompt_mask`` and ``completion_mask`` of shape
            ``(rows, columns)``, other per-row tensors and lists).
        keep: ``bool`` tensor of shape ``(rows,)``.
        pad_to: at least this many rows out (several processes: every rank passes the same
            count): the first rows not kept are added, with their ``completion_mask`` (and
            ``tool_mask``) zeroed, so they add nothing to the loss, its normaliser or TRL's
            masked metrics. At most ``rows``.
    """
    import torch

    n = keep.size(0)
    take = keep.clone()
    if pad_to is not None and pad_to > int(keep.sum()):
        take[(~keep).nonzero().flatten()[: pad_to - int(keep.sum())]] = True
    filler = (~keep)[take]  # per selected row: a zero-weight row added to reach pad_to
    out: dict[str, Any] = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == n:
            out[k] = v[take]
        elif isinstance(v, list) and len(v) == n:
            out[k] = [x for x, m in zip(v, take.tolist()) if m]
        else:
            out[k] = v
    if bool(filler.any()):
        for k in ("completion_mask", "tool_mask"):
            if k in out:
                out[k] = out[k] * (~filler).unsqueeze(1).to(out[k].dtype)
    pm = out["prompt_mask"]
    first = int(pm.any(0).nonzero()[0]) if pm.any() else 0
    cm = out["completion_mask"]
    last = int(cm.any(0).nonzero()[-1]) + 1 if cm.any() else cm.size(1)
    p_cols, c_cols = pm.size(1), cm.size(1)
    for k, v in list(out.items()):
        if not isinstance(v, torch.Tensor) or v.dim() < 2:
            continue
        if k.startswith("prompt") and v.size(1) == p_cols:
            out[k] = v[:, first:]
        elif k != "advantages" and v.size(1) == c_cols and not k.startswith("prompt"):
            out[k] = v[:, :last]
    return out


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

    if max_steps is not None:
        cfg.grpo["max_steps"] = int(max_steps)
    cfg.apply_threads()
    args = build_grpo_args(cfg)
    tok = load_tokenizer(cfg.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    peft_config = build_peft_config(cfg)
    if model is None:
        torch.manual_seed(cfg.seed)
        # an adapter folder (e.g. the LoRA SFT output) goes on training its own adapter
        model = load_model(cfg.model, dtype=torch.float32, adapter="trainable")
    from accelerate.utils import is_peft_model

    if is_peft_model(model):
        if peft_config is not None:
            log.info("GRPO: %s already holds a LoRA adapter; training it (the config's peft section is not applied)",
                     cfg.model)
        peft_config = None
    freeze_bottom(model, cfg.trainable_layers)

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
    scorer = WeightedReward([(f.reward, w) for f, w in zip(funcs, weights)])
    env_factory = make_env_factory(cfg, train_tasks + eval_tasks, backend=backend, reward=scorer)
    extra = list(extra_reward_funcs or [])
    args.reward_weights = weights + [1.0] * len(extra)
    callbacks = [JsonlLoggerCallback(Path(args.output_dir) / "metrics.jsonl"), TrainingRecordCallback(cfg, "grpo")]
    if cfg.entropy_brake:
        from drgym.training.callbacks import EntropyBrake

        callbacks.insert(0, EntropyBrake.from_config(cfg.entropy_brake, source=cfg.source))  # logs before the JSONL
    eval_cb = None
    if cfg.eval.every_steps and eval_tasks:
        evaluator = make_evaluator(cfg, eval_tasks[: cfg.eval.num_tasks], funcs, weights, backend=backend)
        eval_cb = EvalCallback(evaluator, cfg.eval.every_steps, args.output_dir, tokenizer=tok)
        callbacks.append(eval_cb)
    callbacks += list(extra_callbacks or [])
    GRPOTrainer = _trainer_class()

    dataset, table = build_dataset(train_tasks, env_factory, tok, enable_thinking=cfg.enable_thinking)
    rollout = SearchRolloutFunc(env_factory, table, cfg.rollout_settings())
    batch_log = BatchLogCallback(rollout, Path(args.output_dir) / "batches.jsonl")
    callbacks.append(batch_log)
    trainer = GRPOTrainer(model=model, reward_funcs=funcs + extra, args=args, train_dataset=dataset,
                          processing_class=tok, callbacks=callbacks, rollout_func=rollout,
                          peft_config=peft_config)
    trainer.drgym_filter_groups = bool(cfg.zero_variance.get("filter_groups", False))
    if getattr(trainer, "vllm_generation", None) is not None:
        from drgym.training.vllm_sync import install_weight_sync

        log.info("GRPO: vLLM weight sync: %s", install_weight_sync(trainer))  # reload_weights on vLLM's CPU backend
    trainable, total = count_parameters(trainer.model)
    log.info("GRPO: %d / %d parameters trainable", trainable, total)
    monitor.trainer = trainer
    batch_log.trainer = trainer  # gathers every rank's task ids
    if eval_cb is not None:
        eval_cb.attach(trainer)
    return trainer, {"rollout": rollout, "monitor": monitor, "reward_funcs": funcs, "dataset": dataset,
                     "tokenizer": tok, "trainable_params": trainable, "total_params": total}


def run_grpo(cfg, *, resume: bool = False, max_steps: int | None = None, backend=None,
             extra_reward_funcs=None, extra_callbacks=None) -> dict[str, Any]:
    """Train with GRPO and save the final model to ``<output_dir>/final``.

    Args:
        cfg: the run config.
        resume: continue from the last complete ``checkpoint-N`` in ``output_dir``
            (optimizer, scheduler, RNG states and data order restored by the HF Trainer;
            a checkpoint torn by a kill while saving is skipped). The next batch is the
            one an uninterrupted run would have drawn (``batches.jsonl`` records each
            step's task ids). A checkpoint without optimizer state (one committed to the
            repository) resumes with fresh AdamW moments and the learning-rate schedule
            set to its step (:class:`~drgym.training.resume.ResumeWithoutOptimizerState`,
            which warns).
        max_steps: overrides ``grpo.max_steps``.
        backend: a search backend instead of the one ``cfg.search`` builds.
        extra_reward_funcs, extra_callbacks: see :func:`build_trainer`.

    Returns:
        A summary dict (also written to ``<output_dir>/summary.json``).

    Raises:
        ConfigError: bad config, ``resume`` without a checkpoint, or (without
            ``resume``) an ``output_dir`` that holds an earlier run.
    """
    import time

    from drgym.training.callbacks import last_complete_checkpoint

    if not resume:
        refuse_earlier_run(Path(cfg.output_dir))
    trainer, parts = build_trainer(cfg, max_steps=max_steps, backend=backend, extra_reward_funcs=extra_reward_funcs,
                                   extra_callbacks=extra_callbacks)
    out = Path(trainer.args.output_dir)
    ckpt = None
    if resume:
        ckpt = last_complete_checkpoint(out)  # a checkpoint torn by a kill is skipped
        if ckpt is None:
            raise ConfigError(f"--resume: no complete checkpoint-N folder in {out}.")
        from drgym.training.resume import OPTIMIZER_FILES, ResumeWithoutOptimizerState, missing_optimizer_state

        missing = missing_optimizer_state(ckpt)
        if any(f in missing for f in OPTIMIZER_FILES):  # the Trainer would restore neither: set the schedule
            trainer.add_callback(ResumeWithoutOptimizerState(ckpt, missing))
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=ckpt)
    wall = time.perf_counter() - t0
    trainer.save_model(str(out / "final"))  # every rank calls it; the Trainer writes on rank 0
    summary = {"run": cfg.name, "config": cfg.source, "global_step": trainer.state.global_step,
               "train_seconds": round(wall, 1), "resumed_from": ckpt, "train_loss": result.training_loss,
               "trainable_params": parts["trainable_params"], "total_params": parts["total_params"],
               "guard_history": parts["monitor"].history}
    from drgym.training.ranks import is_main

    if is_main(trainer):  # one writer per file under accelerate launch
        parts["tokenizer"].save_pretrained(str(out / "final"))
        from drgym.training.callbacks import write_training_record

        write_training_record(out / "final", cfg, "grpo")
        atomic_write_json(out / "summary.json", summary)
    return summary
