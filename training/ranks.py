"""Several training processes: what every rank must do together, and metrics over all ranks.

Under ``accelerate launch`` each process (rank) runs its own rollouts and reward calls
on its share of the generation batch. TRL logs the trainer's ``_metrics`` from rank 0
only, so a metric computed from one rank's episodes describes an eighth of the batch on
8 GPUs; TRL's own metrics gather first (``accelerator.gather``). drgym's ``env/*``,
``guard/*`` and ``rollout/*`` metrics do the same through :func:`gather_rows`.

Collectives must be entered by every rank, the same number of times and in the same
order; a rank that skips one makes the others wait forever. Both helpers here are
collectives when there is more than one process, so call them where every rank passes
(once per ``rollout_func`` call, once per reward batch).
"""

from __future__ import annotations

from typing import Any


def world(trainer) -> tuple[int, int]:
    """``(process_index, num_processes)`` of the trainer's accelerator (``(0, 1)`` without one)."""
    acc = getattr(trainer, "accelerator", None)
    if acc is None:
        return 0, 1
    return int(getattr(acc, "process_index", 0)), int(getattr(acc, "num_processes", 1))


def is_main(trainer) -> bool:
    """True on rank 0 (and without an accelerator)."""
    return world(trainer)[0] == 0


def gather_rows(trainer, rows: list[Any]) -> list[Any]:
    """Every rank's ``rows`` concatenated in rank order (accelerate's ``gather_object``).

    With one process this is ``list(rows)`` and no collective runs. The order is the
    order TRL uses for the generation batch (rank 0's rows first), so groups of
    ``num_generations`` consecutive rows line up with TRL's groups.

    Args:
        trainer: anything with an ``accelerator`` (``process_index``, ``num_processes``).
        rows: picklable items of this rank.

    Returns:
        ``list``: all ranks' rows.
    """
    _, n = world(trainer)
    if n <= 1:
        return list(rows)
    import accelerate.utils

    return list(accelerate.utils.gather_object(list(rows)))
