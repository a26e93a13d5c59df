"""The layer contract of ``pyproject.toml`` (import-linter) holds, and it catches an upward import."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
lint_imports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint_imports)

pytest.importorskip("importlinter")


def test_layers_kept(tmp_path):
    res = lint_imports.lint(lint_imports.package_tree(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 kept, 0 broken" in res.stdout


def test_upward_import_is_caught(tmp_path):
    tree = lint_imports.package_tree(tmp_path)
    text = tree / "drgym" / "envs" / "text.py"
    text.write_text(text.read_text() + "\nfrom drgym.rewards import qa  # upward: envs -> rewards\n")
    res = lint_imports.lint(tree)
    assert res.returncode != 0
    assert "drgym.envs is not allowed to import drgym.rewards" in res.stdout
    assert "drgym.envs.text -> drgym.rewards.qa" in res.stdout
