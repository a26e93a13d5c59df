"""The import contracts of ``pyproject.toml`` (import-linter) hold, and they catch an upward
import, an import cycle, and a cycle through a function-level import."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
lint_imports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint_imports)

pytest.importorskip("importlinter")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The installed package laid out once (tests that edit it take their own copy)."""
    return lint_imports.package_tree(tmp_path_factory.mktemp("tree"))


def test_contracts_kept(tree):
    res = lint_imports.lint(tree)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "drgym layers: data flows one way KEPT" in res.stdout
    assert "drgym has no import cycles KEPT" in res.stdout
    assert "2 kept, 0 broken" in res.stdout


def test_plain_lint_imports_from_the_repository_root():
    """The standard tool, run as a user runs it, sees envs/, rewards/ and training/ too."""
    for name in lint_imports.MAPPED:
        link = ROOT / "drgym" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), f"drgym/{name} must link to {name}/"
    res = lint_imports.lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 kept, 0 broken" in res.stdout
    analyzed = int(re.search(r"Analyzed (\d+) files", res.stdout).group(1))
    own = sum(f.endswith(".py") for _, _, files in os.walk(ROOT / "drgym") for f in files)  # links not followed
    linked = sum(len(list((ROOT / name).rglob("*.py"))) for name in lint_imports.MAPPED)
    assert analyzed >= own + linked - 5, (analyzed, own, linked)  # the linked folders were walked
    assert "drgym.training" not in res.stderr


def test_no_import_cycles(tree):
    cycles = lint_imports.import_cycles(tree)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_env_builds_named_rewards_through_a_plain_import(tree):
    """The env resolves ``reward="f1"`` with an import the contracts see, not a string entry point."""
    core = (tree / "drgym" / "envs" / "core.py").read_text(encoding="utf-8")
    assert "from drgym.rewards.registry import get_reward" in core
    assert "drgym.rewards.registry:" not in core
    for path in (tree / "drgym" / "rewards").glob("*.py"):
        assert "drgym.envs" not in path.read_text(encoding="utf-8"), f"{path.name} reaches up into drgym.envs"


def test_upward_import_is_caught(tmp_path):
    tree = lint_imports.package_tree(tmp_path)
    qa = tree / "drgym" / "rewards" / "qa.py"
    qa.write_text(qa.read_text() + "\nfrom drgym.envs import parsing  # upward: rewards -> envs\n")
    res = lint_imports.lint(tree)
    assert res.returncode != 0
    assert "drgym.rewards is not allowed to import drgym.envs" in res.stdout
    assert "drgym.rewards.qa -> drgym.envs.parsing" in res.stdout


def test_function_level_cycle_is_caught(tmp_path):
    tree = lint_imports.package_tree(tmp_path)
    config = tree / "drgym" / "training" / "config.py"
    config.write_text(config.read_text() + "\n\ndef _late():\n    from drgym.training.launch import launch_command\n")
    assert lint_imports.import_cycles(tree) == [["drgym.training.config", "drgym.training.launch", "drgym.training.config"]]
    res = lint_imports.lint(tree)
    assert res.returncode != 0
    assert "drgym has no import cycles BROKEN" in res.stdout
    assert ".launch -> .config" in res.stdout


def test_public_api_exports_what_the_docs_name():
    """``from drgym.search import HTTPSearchClient`` and the other names the docs use work,
    every ``__all__`` name resolves, and importing the packages loads no torch."""
    import subprocess
    import sys

    code = (
        "import sys, drgym.search, drgym.training, drgym.envs, drgym.rewards\n"
        "assert 'torch' not in sys.modules, 'torch loaded at import'\n"
        "from drgym.search import HTTPSearchClient, LocalSearchEngine, MCPSearchBackend, make_backend\n"
        "from drgym.training import load_config, build_trainer, make_env_factory, TRLReward, SearchRolloutFunc\n"
        "from drgym.envs import SearchQAEnv, load_tasks, make_env\n"
        "from drgym.rewards import build_reward, get_reward\n"
        "for m in (drgym.search, drgym.training, drgym.envs, drgym.rewards):\n"
        "    for n in m.__all__:\n"
        "        getattr(m, n)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
