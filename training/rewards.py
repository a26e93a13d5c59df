"""GRPO reward functions: drgym rewards as TRL reward functions
(:class:`~drgym.training.trl_adapter.TRLReward`), and the degenerate-group monitor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drgym.atomic import append_jsonl
from drgym.rewards.scorer import degenerate_groups, weighted_total
from drgym.training.ranks import gather_rows, is_main
from drgym.training.trl_adapter import TRLReward, trl_reward_funcs, trl_reward_weights


class GroupMonitor:
    """Collapse guard: detects degenerate GRPO groups and logs them.

    After the last reward function of a batch has run, the weighted total reward is
    rebuilt per completion as TRL sums it (:func:`~drgym.rewards.scorer.weighted_total`
    with ``skip_missing``; NaN when no part scored) and split into groups of
    ``num_generations``. A group is *degenerate* when all its rewards are equal
    (:func:`~drgym.rewards.scorer.degenerate_groups`: zero advantage, no gradient; DAPO,
    Yu et al. 2025, §3.2 "dynamic sampling"), and an answer is *empty* when the episode
    ended with no ``<answer>`` text. Logged per batch (trainer metrics, so TensorBoard
    and ``metrics.jsonl``): ``guard/degenerate_group_frac``,
    ``guard/empty_answer_frac``, ``guard/all_empty_group_frac``; each degenerate group
    is also appended to ``<output_dir>/degenerate_groups.jsonl``. With several training
    processes the fractions are over every rank's rows (see :meth:`record`).
    """

    def __init__(self, names: list[str], weights: list[float], num_generations: int, out_path: str | Path):
        self.names = names
        self.weights = dict(zip(names, weights))
        self.G = num_generations
        self.out_path = Path(out_path)
        self._batch: dict[str, list] = {}
        self.trainer = None
        self.history: list[dict[str, float]] = []

    def record(self, name: str, scores: list, task_ids: list[str], answers: list[str]) -> None:
        """Take one reward function's scores of this rank's batch; after the last, log the batch.

        With several training processes the batch is every rank's rows, gathered in rank
        order (:func:`drgym.training.ranks.gather_rows`, a collective: every rank's reward
        functions run once per batch), so the groups are TRL's groups and the fractions
        are over the whole generation batch; rank 0 alone writes the degenerate groups.
        """
        self._batch[name] = scores
        if len(self._batch) < len(self.names):
            return
        local = []
        weights = [self.weights[k] for k in self.names]
        for i in range(len(scores)):
            total = weighted_total([self._batch[k][i] for k in self.names], weights, skip_missing=True)
            local.append((float("nan") if total is None else total, task_ids[i], answers[i]))
        self._batch = {}
        rows = gather_rows(self.trainer, local)
        totals = [r[0] for r in rows]
        task_ids = [r[1] for r in rows]
        answers = [r[2] for r in rows]
        n = len(rows)
        G = self.G if self.G and n % self.G == 0 else n
        groups = [list(range(g, g + G)) for g in range(0, n, G)]
        flags = degenerate_groups(totals, G)
        degenerate = 0
        all_empty = 0
        step = getattr(getattr(self.trainer, "state", None), "global_step", None)
        main = is_main(self.trainer)
        for idx, flat in zip(groups, flags):
            r = [totals[i] for i in idx]
            empty = [not (answers[i] or "").strip() for i in idx]
            if all(empty):
                all_empty += 1
            if flat:
                degenerate += 1
                if main:
                    append_jsonl(self.out_path, {"step": step, "task_id": task_ids[idx[0]], "rewards": r,
                                                 "empty_answers": sum(empty), "answers": [answers[i] for i in idx]})
        stats = {
            "guard/degenerate_group_frac": degenerate / len(groups),
            "guard/all_empty_group_frac": all_empty / len(groups),
            "guard/empty_answer_frac": sum(1 for a in answers if not (a or "").strip()) / n,
        }
        self.history.append(stats)
        metrics = getattr(self.trainer, "_metrics", None)
        if metrics is not None:
            mode = "train" if self.trainer.model.training else "eval"
            for k, v in stats.items():
                metrics[mode][k].append(v)


def build_reward_funcs(cfg, tasks_by_id: dict[str, Any], *, num_generations: int, output_dir: str | Path):
    """TRL reward functions, their weights and the :class:`GroupMonitor` of a run.

    The ``rewards:`` list becomes the weighted spec of
    :func:`drgym.training.trl_adapter.trl_reward_funcs` (one TRL function per part, so
    TRL logs each component); each is a :class:`~drgym.training.trl_adapter.TRLReward`
    that scores against the run's tasks, reads the score the env recorded
    (``env_scored``: the run's envs score with these same reward objects) and reports
    to the monitor.

    Raises:
        ConfigError: unknown reward name or bad kwargs (from the reward registry).
    """
    spec = {"weighted": [{"name": str(r["name"]), "weight": float(r.get("weight", 1.0)),
                          "kwargs": dict(r.get("kwargs") or {})} for r in cfg.rewards]}
    inner = trl_reward_funcs(spec)
    weights = trl_reward_weights(spec)
    names = [f.__name__ for f in inner]
    monitor = GroupMonitor(names, weights, num_generations, Path(output_dir) / "degenerate_groups.jsonl")
    funcs = [TRLReward(f.reward, parser=f.parser, name=f.__name__, tasks_by_id=tasks_by_id, monitor=monitor,
                       env_scored=True) for f in inner]
    return funcs, weights, monitor
