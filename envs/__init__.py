"""Gymnasium environments for search agents (installed as ``drgym.envs``)."""

from drgym.envs.tasks import Task
from drgym.envs.trajectory import Step, ToolCall, Trajectory

__all__ = ["Task", "Trajectory", "Step", "ToolCall"]
