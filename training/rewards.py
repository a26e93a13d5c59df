"""GRPO reward functions: drgym rewards as TRL reward functions, and the degenerate-group monitor."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from drgym.atomic import append_jsonl
from drgym.records import Trajectory
from drgym.training.ranks import gather_rows, is_main
from drgym.training.trl_adapter import trl_reward_funcs, trl_reward_weights


class DrgymRewardFunc:
    """A drgym reward (through :class:`drgym.training.trl_adapter.TRLReward`) fed with rollout fields.

    TRL calls ``f(prompts=, completions=, completion_ids=, **columns, **rollout_fields)``.
    The adapter builds each :class:`~drgym.records.Episode` from the dataset
    columns (``task_id``, ``question``, ``answers``); this wrapper then sets the answer
    to the rollout's ``final_answer`` (the env's parsed ``<answer>``, '' when none) and
    attaches the episode's ``trajectory``, so rewards that count invalid actions or
    check termination (``format``) see the whole episode and nothing re-parses the
    decoded completion (which includes the ``<information>`` text). When the env already
    scored the episode (GRPO's env scores with the run's rewards), the score is read from
    the trajectory's ``reward_components`` instead of computed again.

    Returns ``list[float | None]``, one per completion. ``__name__`` is the reward
    name TRL logs under (``rewards/<name>/mean`` and ``/std``).
    """

    def __init__(self, trl_reward, tasks_by_id: dict[str, Any], monitor: "GroupMonitor | None" = None):
        self.inner = trl_reward
        self.reward = trl_reward.reward
        self.__name__ = trl_reward.__name__
        self.tasks_by_id = tasks_by_id
        self.monitor = monitor

    def __call__(self, prompts, completions, final_answer=None, trajectory=None, **kw):
        n = len(completions)
        episodes = self.inner.episodes(list(prompts or []), list(completions), **kw)
        for i, ep in enumerate(episodes):
            tid = kw.get("task_id")[i] if kw.get("task_id") is not None else None
            if tid in self.tasks_by_id:
                ep.task = self.tasks_by_id[tid]
            if final_answer is not None:
                ep.answer = final_answer[i] or ""
            d = trajectory[i] if trajectory is not None else None
            if isinstance(d, dict) and d.get("episode_id"):
                ep.trajectory = Trajectory.from_dict(d)
        # one scorer: an episode the env already scored (its trajectory carries this reward's
        # component) is read, not scored again; only completions without an env episode
        # (a direct call) are scored here
        comps = [((trajectory[i] or {}).get("reward_components") or {}) if trajectory is not None
                 and isinstance(trajectory[i], dict) else {} for i in range(n)]
        todo = [i for i in range(n) if self.__name__ not in comps[i]]
        raw: list[Any] = [comps[i].get(self.__name__) for i in range(n)]
        if todo:
            out = self.reward.score([episodes[i] for i in todo])
            for i, s in zip(todo, out.scores):
                raw[i] = s
        scores = [None if s is None or (isinstance(s, float) and math.isnan(s)) else float(s) for s in raw]
        if self.monitor is not None:
            self.monitor.record(self.__name__, scores, kw.get("task_id") or [""] * n,
                                [e.answer for e in episodes])
        return scores


class GroupMonitor:
    """Collapse guard: detects degenerate GRPO groups and logs them.

    After the last reward function of a batch has run, the weighted total reward is
    rebuilt per completion and split into groups of ``num_generations``. A group is
    *degenerate* when all its rewards are equal (zero advantage, no gradient; DAPO,
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
        for i in range(len(scores)):
            vals = [(self._batch[k][i], self.weights[k]) for k in self.names if self._batch[k][i] is not None]
            local.append((sum(v * w for v, w in vals) if vals else float("nan"), task_ids[i], answers[i]))
        self._batch = {}
        rows = gather_rows(self.trainer, local)
        totals = [r[0] for r in rows]
        task_ids = [r[1] for r in rows]
        answers = [r[2] for r in rows]
        n = len(rows)
        G = self.G if self.G and n % self.G == 0 else n
        groups = [list(range(g, g + G)) for g in range(0, n, G)]
        degenerate = 0
        all_empty = 0
        step = getattr(getattr(self.trainer, "state", None), "global_step", None)
        main = is_main(self.trainer)
        for idx in groups:
            r = [totals[i] for i in idx]
            empty = [not (answers[i] or "").strip() for i in idx]
            if all(empty):
                all_empty += 1
            finite = [x for x in r if not math.isnan(x)]
            if len(finite) <= 1 or max(finite) - min(finite) < 1e-9:
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
    TRL logs each component), each wrapped in :class:`DrgymRewardFunc`.

    Raises:
        ConfigError: unknown reward name or bad kwargs (from the reward registry).
    """
    spec = {"weighted": [{"name": str(r["name"]), "weight": float(r.get("weight", 1.0)),
                          "kwargs": dict(r.get("kwargs") or {})} for r in cfg.rewards]}
    inner = trl_reward_funcs(spec)
    weights = trl_reward_weights(spec)
    names = [f.__name__ for f in inner]
    monitor = GroupMonitor(names, weights, num_generations, Path(output_dir) / "degenerate_groups.jsonl")
    funcs = [DrgymRewardFunc(f, tasks_by_id, monitor) for f in inner]
    return funcs, weights, monitor
