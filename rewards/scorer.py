"""Score episodes with one or more rewards, under one failure policy.

:class:`Scorer` is what the environments (``SearchQAEnv`` and the other envs' episode
end), ``drgym rollout`` (the QA metrics and ``--reward`` extras) and ``drgym evaluate``
call to score a batch:

- each reward scores the whole batch once (one :meth:`~drgym.records.Reward.score` call);
- a reward that raises is logged (a warning naming the reward, the episodes and the
  exception), recorded in every episode's :attr:`Scored.errors`, and its score is None
  (never 0); the other rewards still score;
- an exception in ``stop_on`` (by default :class:`~drgym.errors.ServiceUnavailableError`:
  the judge's or the search server's endpoint stayed down) is re-raised, so the caller can
  stop and resume later instead of recording scores that would be wrong.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from drgym.errors import ServiceUnavailableError
from drgym.records import Episode, Reward

logger = logging.getLogger(__name__)


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
        if not episodes:
            return out
        for label, reward in self.rewards:
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
                continue
            comps = res.components or {}
            for k, s in enumerate(out):
                s.scores[label] = res.scores[k]
                for cname, vals in comps.items():
                    s.components[cname] = vals[k] if k < len(vals) else None
        return out
