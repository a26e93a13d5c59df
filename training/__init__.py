"""GRPO and SFT training on TRL (installed as ``drgym.training``).

The pieces a user's own TRL script needs import from here (they load on first use, so
``import drgym.training`` does not import torch)::

    from drgym.training import load_config, build_trainer, make_env_factory, TRLReward

==========================  ==========================================================
name                        what
==========================  ==========================================================
``load_config``             a YAML file or bundled config name -> :class:`RunConfig`
``RunConfig``               the validated config
``build_trainer``           the ``GRPOTrainer`` of a config (rollout function, rewards, callbacks)
``run_grpo``, ``run_sft``   train (what ``drgym train grpo|sft`` runs)
``make_env_factory``        a zero-argument factory of configured envs
``build_dataset``           the GRPO ``train_dataset`` and its prompt -> task table
``SearchRolloutFunc``       TRL's ``rollout_func``: multi-turn episodes, observations masked
``TRLReward``               a drgym reward as a TRL ``reward_funcs`` entry
==========================  ==========================================================
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "load_config", "RunConfig", "build_trainer", "run_grpo", "run_sft", "make_env_factory", "build_dataset",
    "SearchRolloutFunc", "RolloutSettings", "TRLReward", "trl_reward_funcs",
]


def __getattr__(name: str) -> Any:  # loads on first use (plain imports, for the layer checks): no torch at import
    if name in ("load_config", "RunConfig"):
        from drgym.training import config

        return getattr(config, name)
    if name in ("build_trainer", "run_grpo"):
        from drgym.training import grpo

        return getattr(grpo, name)
    if name == "run_sft":
        from drgym.training.sft import run_sft

        return run_sft
    if name in ("make_env_factory", "build_dataset"):
        from drgym.training import data

        return getattr(data, name)
    if name in ("SearchRolloutFunc", "RolloutSettings"):
        from drgym.training import rollout

        return getattr(rollout, name)
    if name in ("TRLReward", "trl_reward_funcs"):
        from drgym.training import trl_adapter

        return getattr(trl_adapter, name)
    raise AttributeError(f"module 'drgym.training' has no attribute {name!r}")
