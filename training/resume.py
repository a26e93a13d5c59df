"""Resuming GRPO from a lean checkpoint: adapter and trainer state, without optimizer state.

A checkpoint the HF Trainer writes holds the LoRA adapter, ``trainer_state.json`` (the
step counter, hence the data position, and the log history), ``optimizer.pt`` (AdamW's
moments, twice the adapter's size), ``scheduler.pt`` and ``rng_state.pth``. The repository
keeps only the first two (``.gitignore`` refuses the rest), so a run resumed on another
machine from a committed checkpoint finds no optimizer or scheduler file, and the
Trainer then silently starts a fresh scheduler: its warm-up would run again and the
entropy brake's cut of the learning rate would be lost.

:class:`ResumeWithoutOptimizerState` puts the schedule back: the fresh scheduler is
stepped to the checkpoint's step and its base rates scaled by the entropy brake's last
logged scale (``entropy_brake/lr_scale``), so every later step runs at the learning rate
the uninterrupted run would have used. AdamW's moments restart from zero (a warning says
so), and without ``rng_state.pth`` sampling differs from the uninterrupted run. The data
order is the step counter's and is continued exactly. A resume on the machine that wrote
the checkpoint finds every file and stays exact; this callback is then not used.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

OPTIMIZER_FILES = ("optimizer.pt", "scheduler.pt")
"""The files without which the HF Trainer restores neither the optimizer nor the scheduler."""
RNG_FILE = "rng_state.pth"
"""The RNG states of a single-process run's checkpoint."""


def missing_optimizer_state(checkpoint: str | Path) -> list[str]:
    """The optimizer, scheduler and RNG files ``checkpoint`` lacks (``[]`` for a full checkpoint).

    Raises:
        FileNotFoundError: ``checkpoint`` is not a folder.
    """
    ck = Path(checkpoint)
    if not ck.is_dir():
        raise FileNotFoundError(f"checkpoint folder {ck} does not exist.")
    missing = [f for f in OPTIMIZER_FILES if not (ck / f).is_file()]
    if not any(ck.glob("rng_state*.pth")):
        missing.append(RNG_FILE)
    return missing


def brake_scale(log_history: list[dict[str, Any]]) -> float:
    """The entropy brake's learning-rate scale last logged (``entropy_brake/lr_scale``), else 1.

    >>> brake_scale([{"step": 1, "entropy_brake/lr_scale": 1.0}, {"step": 2, "entropy_brake/lr_scale": 0.5}, {"step": 2}])
    0.5

    Raises:
        ValueError: the logged scale is not a number in (0, 1].
    """
    for rec in reversed(log_history):
        if "entropy_brake/lr_scale" in rec:
            s = rec["entropy_brake/lr_scale"]
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1:
                raise ValueError(f"the trainer state logs entropy_brake/lr_scale {s!r} at step {rec.get('step')}; "
                                 "expected a number in (0, 1].")
            return float(s)
    return 1.0


class ResumeWithoutOptimizerState(TrainerCallback):
    """At the start of a resumed run whose checkpoint has no optimizer or scheduler file: set
    the learning-rate schedule to the checkpoint's step and brake scale, and say that the
    optimizer moments restart.

    Args:
        checkpoint: the checkpoint folder resumed from (named in the warning).
        missing: the files it lacks (:func:`missing_optimizer_state`).

    Attributes:
        restored: after ``on_train_begin``, ``{"step", "lr_scale", "lr"}`` of the schedule
            set (``lr``: the first parameter group's rate for the next step).
    """

    def __init__(self, checkpoint: str | Path, missing: list[str]) -> None:
        self.checkpoint = str(checkpoint)
        self.missing = list(missing)
        self.restored: dict[str, float] = {}

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if lr_scheduler is None:
            raise RuntimeError("the trainer handed no lr_scheduler to on_train_begin; cannot set the schedule "
                               f"of the resume from {self.checkpoint}.")
        sched = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper holds the torch one
        scale = brake_scale(state.log_history)
        sched.base_lrs = [b * scale for b in sched.base_lrs]
        with warnings.catch_warnings():
            # stepping the schedule without optimizer steps is the point here
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            for _ in range(int(state.global_step)):
                sched.step()
        lr = float(sched.get_last_lr()[0])
        self.restored = {"step": int(state.global_step), "lr_scale": scale, "lr": lr}
        log.warning(
            "resuming from %s without %s: the AdamW moments restart from zero%s; the learning-rate schedule is set "
            "to step %d (brake scale %.4g, learning rate %.4g); the data order continues from step %d",
            self.checkpoint, ", ".join(self.missing),
            " and sampling differs from an uninterrupted run (no RNG state)" if RNG_FILE in self.missing else "",
            state.global_step, scale, lr, state.global_step)
