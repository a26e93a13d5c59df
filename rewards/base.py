"""The reward interface: a batch of finished episodes in, one float each out.

Every metric in :mod:`drgym.rewards` is a :class:`Reward`. The environment calls it
with one episode at termination; the TRL adapter calls it with a batch of completions;
``drgym evaluate`` calls it over a file of reports.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from drgym.envs.tasks import Task
from drgym.envs.trajectory import Trajectory


@dataclass
class Episode:
    """What a reward scores.

    Attributes:
        task: the task posed.
        answer: the final answer or report text ('' when none was given).
        trajectory: the whole episode, when available (TRL completions and report files
            have none); rewards that need retrieved documents or tool counts read it.
    """

    task: Task
    answer: str
    trajectory: Trajectory | None = None


@dataclass
class RewardOutput:
    """Scores for a batch.

    Attributes:
        scores: one float per episode, or None where the reward does not apply or its
            judge failed (excluded from means, counted in ``failures``).
        components: named per-episode parts, each a list aligned with ``scores``.
        failures: number of episodes whose judge calls failed after retries.
    """

    scores: list[float | None]
    components: dict[str, list[float | None]] = field(default_factory=dict)
    failures: int = 0


class Reward(abc.ABC):
    """A reward module. Subclasses set ``name`` and implement :meth:`score`."""

    name: str = "reward"

    @abc.abstractmethod
    def score(self, episodes: list[Episode]) -> RewardOutput:
        """Score a batch of finished episodes.

        Returns:
            A :class:`RewardOutput` with ``len(scores) == len(episodes)``.
        """

    def __call__(self, episodes: list[Episode]) -> RewardOutput:
        return self.score(episodes)
