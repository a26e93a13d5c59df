"""Score episodes with one or more rewards, under one failure policy and one merge rule.

:class:`Scorer` is what every place that scores calls: the environments' episode end
(``score_finished`` of the envs' core module, once per driver turn for every episode
that ended in it), ``drgym rollout`` (the QA metrics and ``--reward`` extras), ``drgym
evaluate`` (:mod:`drgym.evaluation.judged`) and the GRPO reward function
(:class:`drgym.training.trl_adapter.TRLReward`, for completions no env scored):

- each reward scores the whole batch once (one :meth:`~drgym.records.Reward.score` call),
  so a judge sees every episode of the batch (a GRPO group) together;
- a reward that raises is logged (a warning naming the reward, the episodes and the
  exception), recorded in every episode's :attr:`Scored.errors`, and its score is None
  (never 0); the other rewards still score;
- an exception in ``stop_on`` (by default :class:`~drgym.errors.ServiceUnavailableError`:
  the judge's or the search server's endpoint stayed down) is re-raised, so the caller can
  stop and resume later instead of recording scores that would be wrong;
- :meth:`Scorer.score_batch` writes the results into each episode's trajectory by the one
  merge rule, :meth:`Scored.merge_into`.

Two helpers hold the arithmetic that GRPO's reward bookkeeping shares:
:func:`weighted_total` (a weighted sum of reward scores, with the two ways a missing score
can count) and :func:`degenerate_groups` (which groups of totals have no spread).

Example:
    >>> from drgym.records import Episode, Task
    >>> from drgym.rewards.qa import ExactMatch, F1
    >>> task = Task(task_id="t", question="Who wrote Hamlet?", answers=["William Shakespeare"])
    >>> [s] = Scorer([ExactMatch(), F1()]).score([Episode(task, "Shakespeare")])
    >>> s.scores["em"], round(s.scores["f1"], 4), s.errors
    (0.0, 0.6667, {})
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from drgym.errors import ServiceUnavailableError
from drgym.records import Episode, Reward

logger = logging.getLogger(__name__)

SPREAD_EPS = 1e-9
"""Totals of a group that differ by less than this count as equal (:func:`degenerate_groups`)."""


def _missing(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def weighted_total(scores: Sequence[float | None], weights: Sequence[float], *,
                   skip_missing: bool = False) -> float | None:
    """The weighted sum ``sum_i w_i * s_i`` of one episode's reward scores.

    A score is missing when it is None or NaN (its judge failed, or the reward does not
    apply). Two rules, one per caller:

    - ``skip_missing=False`` (:class:`~drgym.rewards.registry.WeightedReward`): a
      missing part makes the total None;
    - ``skip_missing=True`` (TRL's ``nansum`` over its reward functions, as GRPO sums
      them): the missing parts are left out; None when every part is missing.

    Args:
        scores: one score per reward, aligned with ``weights``.
        weights: one weight per reward.

    Returns:
        The total, or None.

    Raises:
        ValueError: ``scores`` and ``weights`` differ in length.

    Example:
        >>> weighted_total([1.0, None], [1.0, 0.2]), weighted_total([1.0, None], [1.0, 0.2], skip_missing=True)
        (None, 1.0)
    """
    if len(scores) != len(weights):
        raise ValueError(f"weighted_total: {len(scores)} scores for {len(weights)} weights.")
    present = [(float(s), float(w)) for s, w in zip(scores, weights) if not _missing(s)]
    if not present or (not skip_missing and len(present) < len(scores)):
        return None
    return sum(s * w for s, w in present)


def degenerate_groups(totals: Sequence[float | None], group_size: int) -> list[bool]:
    """Which groups of consecutive totals carry no GRPO signal.

    ``totals`` is split into groups of ``group_size`` (a shorter last group when the
    length is not a multiple); a group is *degenerate* when at most one of its totals is
    present (not None or NaN) or the present ones differ by less than :data:`SPREAD_EPS`:
    every advantage in it is 0 (DAPO, Yu et al. 2025, section 3.2).

    Returns:
        One flag per group, in order.

    Raises:
        ValueError: ``group_size`` < 1.

    Example:
        >>> degenerate_groups([1.0, 1.0, 0.0, 0.5, None, 0.3], 2)
        [True, False, True]
    """
    if group_size < 1:
        raise ValueError(f"degenerate_groups: group_size must be >= 1, got {group_size}.")
    flags = []
    for g in range(0, len(totals), group_size):
        present = [float(x) for x in totals[g:g + group_size] if not _missing(x)]
        flags.append(len(present) <= 1 or max(present) - min(present) < SPREAD_EPS)
    return flags


@dataclass
class Scored:
    """One episode's scores.

    Attributes:
        scores: reward label (its ``name``, or the key it was given under) -> score: a
            float, or None where the reward does not apply, its judge failed or it raised.
        components: every reward's components for this episode, merged in reward order (a
            later reward's component of the same name replaces an earlier one's). A
            reward's score is not added here, only what it returned as components; a
            reward that raised adds nothing.
        errors: reward label -> ``"ExceptionType: message"`` for each reward that raised.
    """

    scores: dict[str, float | None] = field(default_factory=dict)
    components: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def merge_into(self, components: dict[str, float | None]) -> dict[str, float | None]:
        """The one merge rule: write these results into ``components`` (a trajectory's
        ``reward_components``, a ``drgym evaluate`` row's ``components``) in place.

        Every reward's score goes under its label, then every component under its name;
        both replace what ``components`` held. A component named like a label replaces
        that label's score: the component is the reward's raw metric (``kpr``), the score
        may be weighted or penalised (``kpr - w * kpc``). Returns ``components``.

        Example:
            >>> Scored({"kpr": 0.25, "f1": None}, {"kpr": 0.5, "kpc": 0.25}).merge_into({"f1": 1.0, "em": 1.0})
            {'f1': None, 'em': 1.0, 'kpr': 0.5, 'kpc': 0.25}
        """
        components.update(self.scores)
        components.update(self.components)
        return components


class Scorer:
    """Scores batches of episodes with a fixed set of rewards.

    Args:
        rewards: one :class:`~drgym.records.Reward`, a list or tuple of them (each labelled
            by its ``name``), or a mapping label -> reward (the label keys its score, e.g. a
            ``drgym evaluate`` metric name).
        stop_on: exception types that are re-raised instead of recorded; by default
            ``(ServiceUnavailableError,)``. ``()`` records every exception as a failure.

    An object without a ``score`` method fails like a reward that raises (recorded, None).
    """

    def __init__(self, rewards: Reward | Sequence[Reward] | Mapping[str, Reward], *,
                 stop_on: tuple[type[BaseException], ...] = (ServiceUnavailableError,)) -> None:
        if isinstance(rewards, Mapping):
            items = list(rewards.items())
        elif isinstance(rewards, (list, tuple)):
            items = [(getattr(r, "name", "reward"), r) for r in rewards]
        else:
            items = [(getattr(rewards, "name", "reward"), rewards)]
        self.rewards: list[tuple[str, Reward]] = items
        self.stop_on = tuple(stop_on)

    @property
    def names(self) -> list[str]:
        """The reward labels, in scoring order."""
        return [label for label, _ in self.rewards]

    def score(self, episodes: list[Episode]) -> list[Scored]:
        """Score ``episodes`` with every reward.

        Returns:
            One :class:`Scored` per episode, in order (an empty list for no episodes).

        Raises:
            Exception: an instance of a ``stop_on`` type raised by a reward (the batch is
                not scored further).
        """
        out = [Scored() for _ in episodes]
        for label, reward in self.rewards:
            self._score_one(label, reward, episodes, out)
        return out

    def score_batch(self, episodes: list[Episode], *, missing_only: bool = False) -> list[Scored]:
        """Score finished episodes and write the results into their trajectories.

        Each reward scores the batch once (:meth:`score`); each trajectory then gets the
        results by :meth:`Scored.merge_into` (``reward_components``), each failed
        reward's ``"label: ExceptionType: message"`` appended to
        ``metadata["reward_errors"]``, and its share of the scoring time (seconds, the
        batch's time split equally) added to ``timings["reward"]``.

        Args:
            episodes: the episodes, each with its ``trajectory``.
            missing_only: score a reward only on the episodes whose trajectory has no
                component under its label yet (``drgym rollout``'s QA metrics after the
                env's reward: an ``f1`` the env recorded is not computed again).

        Returns:
            One :class:`Scored` per episode, in order (a reward skipped for an episode is
            absent from its ``scores``).

        Raises:
            ValueError: an episode has no trajectory.
            Exception: an instance of a ``stop_on`` type raised by a reward; then no
                trajectory of the batch is changed.
        """
        bad = [i for i, ep in enumerate(episodes) if ep.trajectory is None]
        if bad:
            raise ValueError(f"score_batch scores into trajectories; episode(s) {bad[:5]} have none.")
        out = [Scored() for _ in episodes]
        if not episodes:
            return out
        t0 = time.perf_counter()
        for label, reward in self.rewards:
            idx = [i for i, ep in enumerate(episodes)
                   if not (missing_only and label in ep.trajectory.reward_components)]  # type: ignore[union-attr]
            if idx:
                self._score_one(label, reward, [episodes[i] for i in idx], [out[i] for i in idx])
        share = (time.perf_counter() - t0) / len(episodes)
        for ep, s in zip(episodes, out):
            traj = ep.trajectory
            assert traj is not None
            s.merge_into(traj.reward_components)
            if s.errors:
                traj.metadata.setdefault("reward_errors", []).extend(f"{k}: {v}" for k, v in s.errors.items())
            traj.timings["reward"] = float(traj.timings.get("reward") or 0.0) + share
        return out

    def _score_one(self, label: str, reward: Reward, episodes: list[Episode], out: list[Scored]) -> None:
        """Score ``episodes`` with one reward into ``out`` (aligned with ``episodes``)."""
        if not episodes:
            return
        try:
            res = reward.score(episodes)
            if len(res.scores) != len(episodes):
                raise ValueError(f"returned {len(res.scores)} scores for {len(episodes)} episodes")
        except self.stop_on:
            raise
        except Exception as e:  # a failing reward is logged and recorded: None, never 0
            ids = [ep.trajectory.episode_id if ep.trajectory is not None else ep.task.task_id for ep in episodes]
            logger.warning("reward %s failed on %d episode(s) (%s): %s: %s", label, len(episodes),
                           ", ".join(ids[:5]) + (" ..." if len(ids) > 5 else ""), type(e).__name__, e)
            for s in out:
                s.scores[label] = None
                s.errors[label] = f"{type(e).__name__}: {e}"
            return
        comps = res.components or {}
        for k, s in enumerate(out):
            s.scores[label] = res.scores[k]
            for cname, vals in comps.items():
                s.components[cname] = vals[k] if k < len(vals) else None
