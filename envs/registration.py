"""Gymnasium registration of drgym's environments (runs on ``import drgym.envs``).

=========================  ==================================  ================
id                         entry point                         nondeterministic
=========================  ==================================  ================
drgym/SearchQA-v0          drgym.envs.searchqa:SearchQAEnv      False
drgym/DeepResearch-v0      drgym.envs.deepresearch:...Env      False
drgym/SearchQA-Web-v0      same class                          True
drgym/DeepResearch-Web-v0  same class                          True
=========================  ==================================  ================

The ``-Web`` ids are for live web backends (``backend.deterministic`` False: the same
query can rank differently over time), so Gymnasium's checker skips its determinism
checks. :func:`make_env` picks the right id from the backend. Passing a
nondeterministic backend to a deterministic id works but logs a warning.

``max_episode_steps`` is not set in the specs: ``max_turns`` (an env argument) bounds
episodes and ends them with ``truncated=True`` itself.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym

from drgym.errors import unknown_name

logger = logging.getLogger(__name__)

ENV_IDS = {
    "drgym/SearchQA-v0": ("drgym.envs.searchqa:SearchQAEnv", False),
    "drgym/DeepResearch-v0": ("drgym.envs.deepresearch:DeepResearchEnv", False),
    "drgym/SearchQA-Web-v0": ("drgym.envs.searchqa:SearchQAEnv", True),
    "drgym/DeepResearch-Web-v0": ("drgym.envs.deepresearch:DeepResearchEnv", True),
}


def register_envs() -> None:
    """Register every id of :data:`ENV_IDS` with Gymnasium (idempotent)."""
    for env_id, (entry, nondet) in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry, nondeterministic=nondet, disable_env_checker=False)


def make_env(kind: str = "qa", *, backend: Any = None, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` the right id for ``kind`` (``"qa"``/``"research"``) and backend.

    A backend with ``deterministic = False`` (live web search) gets the ``-Web`` id.

    Raises:
        ConfigError: unknown kind.
    """
    base = {"qa": "SearchQA", "research": "DeepResearch"}
    if kind not in base:
        raise unknown_name("env kind", kind, base)
    web = backend is not None and not getattr(backend, "deterministic", True)
    env_id = f"drgym/{base[kind]}{'-Web' if web else ''}-v0"
    return gym.make(env_id, backend=backend, **kwargs)
