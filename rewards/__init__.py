"""Reward modules (installed as ``drgym.rewards``).

Every metric is a :class:`Reward` (a batch of :class:`Episode` in, a
:class:`RewardOutput` out). Build one by name or config with :func:`get_reward` /
:func:`build_reward`; score batches with several rewards, under one failure policy, with
:class:`Scorer` (which also writes them into trajectories by one merge rule); weighted totals
and zero-spread groups with :func:`weighted_total` and :func:`degenerate_groups`; adapt one to TRL with :class:`drgym.training.trl_adapter.TRLReward`.
Judge models load only when a judged reward is built.
"""

from drgym.rewards.registry import (
    WeightedReward,
    ascore,
    build_reward,
    get_reward,
    reward_names,
)
from drgym.rewards.scorer import Scored, Scorer, degenerate_groups, weighted_total

from drgym.records import Episode, Reward, RewardOutput

__all__ = ["Episode", "Reward", "RewardOutput", "WeightedReward", "ascore", "build_reward", "get_reward", "reward_names", "Scored", "Scorer",
           "degenerate_groups", "weighted_total"]
