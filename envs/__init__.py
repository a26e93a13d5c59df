"""Gymnasium environments for search agents (installed as ``drgym.envs``).

Importing this package registers ``drgym/SearchQA-v0`` and ``drgym/DeepResearch-v0``
(plus ``-Web`` ids for live web backends) with Gymnasium::

    import gymnasium as gym
    import drgym.envs  # registers the ids

    env = gym.make("drgym/SearchQA-v0", backend=engine, tasks="hotpotqa-dev")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<search> Lilu demon </search>")

The env classes live in submodules and load on first use, so ``import drgym.envs`` stays light.
"""

from drgym.envs.registration import make_env, register_envs

from drgym.records import Step, Task, ToolCall, Trajectory

register_envs()

__all__ = [
    "Task", "Trajectory", "Step", "ToolCall", "make_env", "register_envs",
    "SearchQAEnv", "DeepResearchEnv", "load_tasks", "parse_action", "BatchedDriver",
]


def __getattr__(name: str):
    if name == "SearchQAEnv":
        from drgym.envs.searchqa import SearchQAEnv

        return SearchQAEnv
    if name == "DeepResearchEnv":
        from drgym.envs.deepresearch import DeepResearchEnv

        return DeepResearchEnv
    if name == "load_tasks":
        from drgym.envs.task_loaders import load_tasks

        return load_tasks
    if name == "parse_action":
        from drgym.envs.parsing import parse_action

        return parse_action
    if name == "BatchedDriver":
        from drgym.envs.driver import BatchedDriver

        return BatchedDriver
    raise AttributeError(f"module 'drgym.envs' has no attribute {name!r}")
