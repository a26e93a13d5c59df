"""Reward modules (installed as ``drgym.rewards``)."""

from drgym.rewards.base import Episode, Reward, RewardOutput

__all__ = ["Episode", "Reward", "RewardOutput"]
