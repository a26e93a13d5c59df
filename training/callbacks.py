"""Trainer callbacks: JSONL metrics, degenerate-group records, held-out evaluation.

TensorBoard logging is TRL/transformers' own (``report_to: [tensorboard]``); these
callbacks add an append-only ``metrics.jsonl`` (atomic line writes, so a crash never
leaves a torn record) that ``drgym plot`` reads, and an evaluation every N steps.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from drgym import __version__
from drgym.atomic import append_jsonl, atomic_write_json, read_jsonl
from drgym.errors import ConfigError
from drgym.models import (
    ADAPTER_CONFIG,
    SMOLLM2_ALIASES,
    SMOLLM2_HUB_NAME,
    TRAINING_RECORD,
    adapter_base,
    is_adapter,
    resolve_lm,
)

log = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def rss_mib() -> float | None:
    """This process's resident set size now, in MiB (``/proc/self/statm``), or None where
    the platform has no ``/proc`` (macOS, Windows)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


class JsonlLoggerCallback(TrainerCallback):
    """Append every ``on_log`` record to a JSONL file as ``{"step", "time", **logs}``.

    Each record also carries ``memory/rss_mib``, the trainer process's resident memory in
    MiB at that step (:func:`rss_mib`; null without ``/proc``), so that a long run's memory
    growth is on record before it meets the machine's limit.

    Args:
        path: the JSONL file (created with its folder). On ``--resume`` records continue
            in the same file; readers keep the last record per step (:func:`read_metrics`).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._t0 = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        rec = {"step": state.global_step, "epoch": _clean(state.epoch), "time": round(time.time() - self._t0, 3)}
        rec.update({k: _clean(v) for k, v in logs.items() if isinstance(v, (int, float, str, type(None)))})
        rec["memory/rss_mib"] = rss_mib()
        append_jsonl(self.path, rec)


class EntropyBrake(TrainerCallback):
    """Cut the learning rate when the policy's token entropy collapses (config ``entropy_brake``).

    With ``beta: 0`` nothing in GRPO's loss holds the entropy up, and a run that has
    learned its format keeps sharpening on whatever term supplies the advantage. This
    brake watches TRL's logged ``entropy`` (mean per-token entropy of the sampled
    completions, nats): when the mean of the last ``window`` logged steps is below
    ``floor``, the scheduler's base learning rates are multiplied by ``factor``, at most
    once per ``window`` steps and never below ``min_scale`` times the configured rate.
    The scale lives in the LR scheduler's ``base_lrs``, which the HF Trainer saves in every
    checkpoint, so a resumed run keeps it. A step whose every group was zero-variance (no
    forward pass, so TRL logs entropy 0) is not counted. Every log record gets
    ``entropy_brake/lr_scale``; each engagement is logged at INFO.

    With ``z > 0`` the brake engages only when the window's mean is below ``floor`` with
    one-sided confidence: ``mean + z * sd / sqrt(window) < floor`` (``sd`` the sample
    standard deviation of the window's entropies; ``z = 1.645`` is 95 %). Per-step entropy of
    a small policy swings several-fold between steps (0.05 to 0.65 nats in one run whose
    every 25-step mean stayed above 0.25), so a short bare mean fires on noise; a long
    window with the bound does not.

    Args:
        floor: entropy (nats per token) below which the brake engages; > 0.
        window: logged steps averaged, and the least steps between engagements; >= 1.
        factor: multiplier per engagement, in (0, 1).
        min_scale: lowest total scale, in (0, 1].
        z: confidence multiplier of the bound above (0: the bare mean); >= 0.

    Raises:
        ConfigError: a value outside its range (:meth:`from_config`).
    """

    def __init__(self, floor: float, window: int = 5, factor: float = 0.5, min_scale: float = 0.125, z: float = 0.0):
        self.floor, self.window, self.factor, self.min_scale = float(floor), int(window), float(factor), float(min_scale)
        self.z = float(z)
        self._recent: list[float] = []
        self._last_step = -(10 ** 9)
        self.engagements: list[dict[str, float]] = []

    @classmethod
    def from_config(cls, d: dict[str, Any], *, source: str = "<config>") -> "EntropyBrake":
        try:
            brake = cls(**d)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: entropy_brake needs floor (and optionally window, factor, min_scale, z) "
                              f"as numbers: {e}") from None
        if not (brake.floor > 0 and brake.window >= 1 and 0 < brake.factor < 1 and 0 < brake.min_scale <= 1
                and brake.z >= 0 and math.isfinite(brake.z)):
            raise ConfigError(f"{source}: entropy_brake needs floor > 0, window >= 1, 0 < factor < 1, "
                              f"0 < min_scale <= 1 and z >= 0, got {d!r}.")
        return brake

    def upper_bound(self) -> float:
        """``mean + z * sd / sqrt(n)`` of the entropies in the window (the bare mean when ``z`` is 0
        or the window holds one step); ``inf`` when it is empty.

        >>> b = EntropyBrake(0.2, window=3, z=1.645); b._recent = [0.1, 0.1, 0.1]; b.upper_bound()
        0.1
        """
        n = len(self._recent)
        if not n:
            return math.inf
        mean = sum(self._recent) / n
        if self.z == 0 or n < 2:
            return mean
        sd = math.sqrt(sum((x - mean) ** 2 for x in self._recent) / (n - 1))
        return mean + self.z * sd / math.sqrt(n)

    @staticmethod
    def scale_of(args, lr_scheduler) -> float:
        """The current brake scale: the scheduler's first base rate over ``args.learning_rate``."""
        if lr_scheduler is None or not getattr(lr_scheduler, "base_lrs", None) or not args.learning_rate:
            return 1.0
        return float(lr_scheduler.base_lrs[0]) / float(args.learning_rate)

    def on_log(self, args, state, control, logs=None, lr_scheduler=None, **kwargs):
        if not logs:
            return
        scale = self.scale_of(args, lr_scheduler)
        ent = logs.get("entropy")
        skipped = logs.get("zero_variance/filtered_frac") == 1.0  # no forward pass: TRL logs entropy 0
        if isinstance(ent, (int, float)) and math.isfinite(ent) and not skipped:
            self._recent = (self._recent + [float(ent)])[-self.window:]
            mean = sum(self._recent) / len(self._recent)
            if (len(self._recent) == self.window and self.upper_bound() < self.floor and scale > self.min_scale + 1e-12
                    and state.global_step - self._last_step >= self.window and lr_scheduler is not None):
                new = max(self.min_scale, scale * self.factor)
                lr_scheduler.base_lrs = [b * new / scale for b in lr_scheduler.base_lrs]
                self._last_step = state.global_step
                self.engagements.append({"step": state.global_step, "entropy": round(mean, 4), "lr_scale": new})
                log.info("entropy brake: mean entropy %.3f < %.3f over %d steps at step %d; lr scale %.3f -> %.3f",
                         mean, self.floor, self.window, state.global_step, scale, new)
                scale = new
        logs["entropy_brake/lr_scale"] = round(scale, 6)


class BatchLogCallback(TrainerCallback):
    """Append the task ids each optimizer step's rollouts ran to ``batches.jsonl``
    (``{"step", "task_ids"}``, in generation order), so that a resumed run can be checked
    against an uninterrupted one: same questions, same order, from the step after the
    checkpoint on.

    With several processes each rank's rollout holds its own rows; the ids are gathered
    in rank order (:func:`drgym.training.ranks.gather_rows`, a collective every rank enters
    at every step end), so the record is the whole generation batch, and rank 0 writes it.

    Args:
        rollout: the :class:`~drgym.training.rollout.SearchRolloutFunc` (its ``history``).
        path: the JSONL file (appended atomically; a resumed run continues it).
        trainer: the trainer (its accelerator); set after the trainer is built. None: this
            process's ids only.
    """

    def __init__(self, rollout, path: str | Path, trainer=None):
        self.rollout = rollout
        self.path = Path(path)
        self.trainer = trainer
        self._logged = 0

    def on_step_end(self, args, state, control, **kwargs):
        from drgym.training.ranks import gather_rows

        history = self.rollout.history
        new, self._logged = history[self._logged:], len(history)
        ids = [t for call in new for t in call]
        if self.trainer is not None:
            ids = gather_rows(self.trainer, ids)
        if ids and state.is_world_process_zero:
            append_jsonl(self.path, {"step": state.global_step, "task_ids": ids})


def last_complete_checkpoint(out: str | Path) -> str | None:
    """The ``checkpoint-N`` folder of ``out`` with the highest N whose save finished.

    The HF Trainer writes a checkpoint in place and its ``trainer_state.json`` last, so a
    process killed while saving leaves a folder without it; such folders are skipped (with
    a warning), where ``transformers``' ``get_last_checkpoint`` would pick them and the
    resume would fail. None when there is no complete checkpoint.
    """
    import re

    out = Path(out)
    if not out.is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in out.iterdir()
                   if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))
    for _, p in reversed(found):
        if (p / "trainer_state.json").is_file():
            return str(p)
        log.warning("%s is incomplete (no trainer_state.json: the run was killed while saving it); skipping it", p)
    return None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl``, merging the records of one step (later values win).

    A resumed run logs some steps again, and the end-of-training summary shares the
    last step's number; merging keeps one record per step.

    Returns:
        Records sorted by step; training and evaluation records of the same step are
        kept apart (an evaluation record has ``eval/*`` keys only).
    """
    rows = read_jsonl(path)
    by_key: dict[tuple[int, bool], dict[str, Any]] = {}
    for r in rows:
        is_eval = any(k.startswith("eval") for k in r) and not any(k.startswith("reward") for k in r)
        by_key.setdefault((int(r.get("step") or 0), is_eval), {}).update(r)
    return [by_key[k] for k in sorted(by_key)]


def write_training_record(folder: str | Path, cfg, stage: str) -> Path:
    """Write :data:`drgym.models.TRAINING_RECORD` into a saved model folder.

    It tells later readers how the model was trained, above all the conversation
    ``layout`` (``"continuation"``: observations continue the assistant turn, in GRPO
    with either protocol and in SFT, which trains tag-protocol trajectories), which
    :class:`drgym.policies.hf.HFPolicy` applies by default (``layout="auto"``).

    Args:
        folder: the model folder (``final`` or ``checkpoint-N``); must exist.
        cfg: the run's :class:`~drgym.training.config.RunConfig`.
        stage: ``"sft"`` or ``"grpo"``.

    Returns:
        The written file's path (written atomically).
    """
    protocol = "tags" if stage == "sft" else cfg.protocol  # SFT trains tag-protocol trajectories only
    rec = {"protocol": protocol, "layout": "continuation", "stage": stage,
           "run": cfg.name, "config": cfg.source, "base_model": cfg.model, "env": cfg.env, "search": cfg.search,
           "rollout": cfg.rollout, "enable_thinking": cfg.enable_thinking, "drgym_version": __version__}
    if is_adapter(folder):
        rec.update(adapter_record(folder, cfg))
    path = Path(folder) / TRAINING_RECORD
    atomic_write_json(path, json.loads(json.dumps(rec, default=str)))
    return path


def adapter_record(folder: str | Path, cfg) -> dict[str, Any]:
    """Training-record fields of a saved LoRA adapter, and a portable base in its ``adapter_config.json``.

    The base model is the root of the run's model: ``cfg.model``, or, when that is itself
    an adapter (GRPO continuing an SFT adapter), that adapter's base. When the base is the
    bundled SmolLM2, ``adapter_config.json`` gets its hub name
    (:data:`drgym.models.SMOLLM2_HUB_NAME`, which drgym resolves to the bundled weights)
    in place of this machine's cache path, so the folder loads on any install.

    Returns:
        ``{"adapter": True, "base_model", "init_from", "peft"}``.
    """
    init = str(cfg.model)
    base = adapter_base(resolve_lm(init)) if is_adapter(resolve_lm(init)) else init
    smol = base.lower() in SMOLLM2_ALIASES
    acfg_path = Path(folder) / ADAPTER_CONFIG
    acfg = json.loads(acfg_path.read_text(encoding="utf-8"))
    acfg["base_model_name_or_path"] = SMOLLM2_HUB_NAME if smol else base
    atomic_write_json(acfg_path, acfg)
    return {"adapter": True, "base_model": "smollm2" if smol else base, "init_from": init,
            "peft": {k: acfg.get(k) for k in ("r", "lora_alpha", "lora_dropout", "target_modules",
                                               "layers_to_transform") if k in acfg}}


class TrainingRecordCallback(TrainerCallback):
    """Write the training record (:func:`write_training_record`) into every checkpoint."""

    def __init__(self, cfg, stage: str):
        self.cfg = cfg
        self.stage = stage

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            write_training_record(folder, self.cfg, self.stage)


class EvalCallback(TrainerCallback):
    """Evaluate the policy on held-out tasks every ``every_steps`` optimizer steps.

    Runs held-out episodes with the current weights through ``drgym rollout``'s runner (in the
    token layout training uses; see :func:`drgym.training.evaluation.make_evaluator`) and
    scores them with the run's reward functions. Logs ``eval/reward``,
    ``eval/<component>``, ``eval/answered_frac``, ``eval/searches_mean`` and
    ``eval/seconds`` into the trainer log (TensorBoard and ``metrics.jsonl``); each
    evaluation is a rollout run directory ``<output_dir>/eval/step_<N>/`` (its
    ``trajectories.jsonl``, ``config.json`` and ``metrics.json``), which ``drgym report``
    reads.

    Args:
        evaluate: ``f(model, tokenizer, out_dir, name=...) -> (metrics: dict[str, float],
            trajectories: list[dict])``, built by :func:`drgym.training.evaluation.make_evaluator`.
        every_steps: evaluation period in optimizer steps (>= 1).
        output_dir: run folder.
        at_start: also evaluate before the first step (step 0).
    """

    def __init__(self, evaluate, every_steps: int, output_dir: str | Path, *, at_start: bool = True, tokenizer=None):
        self.evaluate = evaluate
        self.every_steps = max(1, int(every_steps))
        self.output_dir = Path(output_dir)
        self.at_start = at_start
        self.tokenizer = tokenizer
        self._trainer = None

    def attach(self, trainer) -> "EvalCallback":
        """Keep a handle on the trainer (for ``trainer.log``)."""
        self._trainer = trainer
        return self

    def _run(self, state, model) -> None:
        t0 = time.perf_counter()
        if self._trainer is not None and hasattr(self._trainer, "accelerator"):
            model = self._trainer.accelerator.unwrap_model(model)
        step = state.global_step
        metrics, _trajs = self.evaluate(model, self.tokenizer, self.output_dir / "eval" / f"step_{step}",
                                        name=f"hf:{self.output_dir.name}@step_{step}")
        # a metric with no score (None, e.g. every judge call failed) is left out of the trainer's
        # log (TensorBoard takes numbers only) and kept as null in metrics.jsonl
        missing = {f"eval/{k}": None for k, v in metrics.items() if v is None}
        metrics = {f"eval/{k}": v for k, v in metrics.items() if v is not None}
        metrics["eval/seconds"] = round(time.perf_counter() - t0, 2)
        log.info("eval at step %d: %s", state.global_step, metrics)
        if self._trainer is not None:
            # through the trainer's reporters: TensorBoard and JsonlLoggerCallback
            # on a copy of the control: the handler clears should_log, which would drop this
            # step's training log
            import copy

            self._trainer.callback_handler.on_log(self._trainer.args, state, copy.copy(self._trainer.control),
                                                  dict(metrics))
        else:
            append_jsonl(self.output_dir / "metrics.jsonl", {"step": state.global_step, **metrics, **missing})

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and state.global_step == 0 and state.is_world_process_zero:
            self._run(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every_steps == 0 and state.is_world_process_zero:
            self._run(state, model)
