"""Use any drgym :class:`~drgym.records.Reward` as a TRL ``reward_funcs`` entry.

TRL (GRPOTrainer) calls each reward function as
``f(prompts=..., completions=..., completion_ids=..., **dataset_columns)`` and expects
``list[float | None]`` (None = not applicable; TRL ignores it in the weighted sum).

Dataset columns read by :class:`TRLReward` (all optional except the golds a metric needs):

==================== ==================================================================
``answers``          gold answers per row, a list of aliases or one string (also accepted
                     under ``golds``, ``golden_answers``, ``answer``)
``question``         the question / research prompt (else the last user message of the prompt)
``task_id``          the task id (else ``"trl-<i>"``)
``key_points``       DeepResearchGym key points (for ``kpr``)
``task``             a full :class:`~drgym.records.Task` dict, overriding the above
==================== ==================================================================

Completions may be strings or chat message lists. The answer is read by the one drgym
:class:`~drgym.envs.parsing.Parser` (:meth:`~drgym.envs.parsing.Parser.parse_answer`:
the first ``<answer>`` block; see the README, "Answers"), '' when there is none.

drgym's GRPO rollout (:class:`~drgym.training.rollout.SearchRolloutFunc`) adds two
columns: ``final_answer`` (the env's parsed answer, used instead of re-parsing the
decoded completion, which holds the ``<information>`` text too) and ``trajectory`` (the
whole episode, given to rewards that count invalid actions or check termination). With
``env_scored=True`` (drgym's GRPO, whose envs score each episode with the run's own
reward objects) a score the env recorded in the trajectory's ``reward_components`` under
the function's name is read, not computed again. One :class:`TRLReward` serves both: it
reads the components from the trajectory and scores the rest through
:class:`~drgym.rewards.scorer.Scorer`.

The adapter sits in the training layer (``drgym.training.trl_adapter``), above the envs
whose parser it reads completions with and the rewards it wraps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from drgym.envs.parsing import Parser
from drgym.records import Episode, Reward, Task, Trajectory
from drgym.rewards.calibration import split_labelled_answer
from drgym.rewards.registry import WeightedReward, build_reward
from drgym.rewards.scorer import Scorer

GOLD_KEYS = ("answers", "golds", "golden_answers", "answer")


def _question(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for m in reversed(list(prompt or [])):
        if isinstance(m, dict) and m.get("role") == "user":
            return str(m.get("content") or "")
    return ""


class TRLReward:
    """A drgym reward as a TRL reward function, named for TRL's logs.

    Args:
        reward: the drgym reward.
        parser: reads the answer of a completion; default :class:`~drgym.envs.parsing.Parser`.
        name: the name TRL logs under (``rewards/<name>/mean``); default ``reward.name``.
        tasks_by_id: task id -> :class:`~drgym.records.Task`; a row whose ``task_id``
            is here is scored against that task (its golds, key points) rather than one
            rebuilt from the columns.
        monitor: an object with ``record(name, scores, task_ids, answers)`` (the
            :class:`~drgym.training.rewards.GroupMonitor`), given every batch's scores.
        env_scored: the envs that produced the ``trajectory`` column scored their
            episodes with this same reward (drgym's GRPO): read the score they recorded.
            Leave it False when the env's reward differs (a default ``f1`` env beside a
            guarded ``f1`` function): the names match, the scores would not.

    Calling it returns one float (or None) per completion, in order. With
    ``env_scored``, a completion whose trajectory holds a score under this function's
    name gets that score; the others are scored in one batch
    through :class:`~drgym.rewards.scorer.Scorer` (a reward that raises is logged and
    gives None, never 0; a :class:`~drgym.errors.ServiceUnavailableError` propagates). A
    NaN score is returned as None.
    """

    def __init__(self, reward: Reward, *, parser: Parser | None = None, name: str | None = None,
                 tasks_by_id: Mapping[str, Task] | None = None, monitor: Any = None,
                 env_scored: bool = False) -> None:
        self.reward = reward
        self.parser = parser or Parser()
        self.__name__ = name or reward.name
        self.tasks_by_id = dict(tasks_by_id or {})
        self.monitor = monitor
        self.env_scored = env_scored

    def episodes(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[Episode]:
        """Build the :class:`Episode` batch from TRL's arguments."""
        n = len(completions)
        gold_key = next((k for k in GOLD_KEYS if kwargs.get(k) is not None), None)
        eps = []
        for i in range(n):
            if kwargs.get("task") is not None:
                task = Task.from_dict(kwargs["task"][i])
            else:
                golds: Any = kwargs[gold_key][i] if gold_key else []
                if isinstance(golds, str):
                    golds = [golds]
                task = Task(
                    task_id=str(kwargs["task_id"][i]) if kwargs.get("task_id") is not None else f"trl-{i}",
                    question=str(kwargs["question"][i]) if kwargs.get("question") is not None else _question(prompts[i] if prompts else ""),
                    answers=[str(g) for g in (golds or [])],
                    kind="research" if kwargs.get("key_points") is not None else "qa",
                    key_points=list(kwargs["key_points"][i] or []) if kwargs.get("key_points") is not None else [],
                )
            answer, _labels = split_labelled_answer(self.parser.parse_answer(completions[i]) or "", task.kind)  # as the env
            eps.append(Episode(task=task, answer=answer))
        return eps

    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None, *,
                 final_answer: list[Any] | None = None, trajectory: list[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        completions = list(completions or [])
        n = len(completions)
        episodes = self.episodes(list(prompts or []), completions, **kwargs)
        task_ids = kwargs.get("task_id")
        comps: list[dict[str, Any]] = [{} for _ in range(n)]
        for i, ep in enumerate(episodes):
            tid = task_ids[i] if task_ids is not None else None
            if tid in self.tasks_by_id:
                ep.task = self.tasks_by_id[tid]
            if final_answer is not None:
                ep.answer = final_answer[i] or ""
            d = trajectory[i] if trajectory is not None else None
            if isinstance(d, Trajectory):
                ep.trajectory = d
                comps[i] = d.reward_components or {}
            elif isinstance(d, dict):
                if d.get("episode_id"):
                    ep.trajectory = Trajectory.from_dict(d)
                comps[i] = d.get("reward_components") or {}
            if not self.env_scored:
                comps[i] = {}
        # read what the env scored; score only the completions no env scored with this reward
        raw: list[Any] = [comps[i].get(self.__name__) for i in range(n)]
        todo = [i for i in range(n) if self.__name__ not in comps[i]]
        if todo:
            scored = Scorer({self.__name__: self.reward}).score([episodes[i] for i in todo])
            for i, res in zip(todo, scored):
                raw[i] = res.scores[self.__name__]
        scores = [None if s is None or (isinstance(s, float) and math.isnan(s)) else float(s) for s in raw]
        if self.monitor is not None:
            self.monitor.record(self.__name__, scores, list(task_ids) if task_ids is not None else [""] * n,
                                [e.answer for e in episodes])
        return scores


def trl_reward_funcs(spec: Any, **build_kwargs: Any) -> list[TRLReward]:
    """TRL ``reward_funcs`` from a reward spec: one function per part of a weighted spec.

    Returns:
        ``[TRLReward, ...]``; pair them with ``GRPOConfig(reward_weights=...)`` using
        :func:`trl_reward_weights` so TRL logs each part separately.
    """
    r = build_reward(spec, **build_kwargs)
    if isinstance(r, WeightedReward):
        return [TRLReward(p) for p, _ in r.parts]
    return [TRLReward(r)]


def trl_reward_weights(spec: Any, **build_kwargs: Any) -> list[float]:
    """Weights aligned with :func:`trl_reward_funcs` (1.0 for a single reward)."""
    r = build_reward(spec, **build_kwargs)
    if isinstance(r, WeightedReward):
        return [w for _, w in r.parts]
    return [1.0]
