"""Check drgym's one-way layers with import-linter (the contract is in ``pyproject.toml``).

``envs/``, ``rewards/`` and ``training/`` live at the top of the repository and install
as ``drgym.envs``, ``drgym.rewards`` and ``drgym.training`` (setuptools ``package-dir``),
which import-linter cannot see in the source tree: it walks the ``drgym`` folder. So
this script lays the installed package out in a temporary folder (Python files only)
and runs ``lint-imports`` there::

    python scripts/lint_imports.py            # exit 0 when every contract is kept

``tests/test_layers.py`` runs it in the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"envs": "envs", "rewards": "rewards", "training": "training"}  # repo folder -> drgym.<name>


def package_tree(dest: Path) -> Path:
    """Copy the ``drgym`` package as installed (Python files only) under ``dest``; return ``dest``."""
    ignore = shutil.ignore_patterns("__pycache__", "data", "*.pyc")
    shutil.copytree(ROOT / "drgym", dest / "drgym", ignore=ignore)
    for folder, name in MAPPED.items():
        shutil.copytree(ROOT / folder, dest / "drgym" / name, ignore=shutil.ignore_patterns("__pycache__", "configs", "results"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def lint(tree: Path) -> subprocess.CompletedProcess:
    """Run ``lint-imports`` on a tree made by :func:`package_tree`."""
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe) if exe.exists() else "lint-imports", "--no-cache"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="drgym-layers-") as tmp:
        res = lint(package_tree(Path(tmp)))
        sys.stdout.write(res.stdout[res.stdout.find("Contracts"):] if "Contracts" in res.stdout else res.stdout)
        sys.stderr.write(res.stderr)
        return res.returncode


if __name__ == "__main__":
    raise SystemExit(main())
