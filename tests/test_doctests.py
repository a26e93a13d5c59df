"""The doctests of drgym's rewards, records, parser and tools run in the suite (fast:
scripted judges, no model)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import pytest

import drgym.rewards
from drgym.records import Reward

REWARD_MODULES = sorted(m.name for m in pkgutil.iter_modules(drgym.rewards.__path__, "drgym.rewards."))
OTHER_MODULES = ["drgym.records", "drgym.envs.parsing", "drgym.envs.tools", "drgym.search.registry", "drgym.judges.base", "drgym.reasoning"]
# Rewards whose docstring has no runnable example (doctest) yet (both need long multi-call judge scripts).
NO_EXAMPLE_YET = {"FactReward", "RaceReward"}


@pytest.mark.parametrize("name", REWARD_MODULES + OTHER_MODULES)
def test_doctests_pass(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DRGYM_HOME", str(tmp_path))
    res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert res.failed == 0


def test_every_reward_has_an_example():
    missing = []
    for name in REWARD_MODULES:
        for cls_name, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
            if issubclass(cls, Reward) and cls.__module__ == name and not cls_name.startswith("_"):
                if ">>>" not in (cls.__doc__ or "") and cls_name not in NO_EXAMPLE_YET:
                    missing.append(cls_name)
    assert missing == []
