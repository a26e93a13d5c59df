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

The environment path needs no adapter: the Gymnasium env calls ``reward.score`` on
its one finished :class:`~drgym.records.Episode` itself.

The adapter sits in the training layer (``drgym.training.trl_adapter``), above the envs
whose parser it reads completions with and the rewards it wraps.
"""

from __future__ import annotations

import math
from typing import Any

from drgym.envs.parsing import Parser
from drgym.records import Episode, Reward, Task
from drgym.rewards.calibration import split_labelled_answer
from drgym.rewards.registry import WeightedReward, build_reward

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

    Calling it returns one float (or None) per completion, in order.
    """

    def __init__(self, reward: Reward, *, parser: Parser | None = None, name: str | None = None) -> None:
        self.reward = reward
        self.parser = parser or Parser()
        self.__name__ = name or reward.name

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

    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
        completions = list(completions or [])
        out = self.reward.score(self.episodes(list(prompts or []), completions, **kwargs))
        return [None if s is None or (isinstance(s, float) and math.isnan(s)) else float(s) for s in out.scores]


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
