"""Check drgym's import contracts with import-linter (the contracts are in ``pyproject.toml``).

``envs/``, ``rewards/`` and ``training/`` live at the top of the repository and install
as ``drgym.envs``, ``drgym.rewards`` and ``drgym.training`` (setuptools ``package-dir``).
``drgym/envs``, ``drgym/rewards`` and ``drgym/training`` are links to those folders, so
import-linter (through grimp, which finds a package by walking its folder) and other
structure viewers see one package graph: plain ``lint-imports`` from the repository root
checks every contract.

This script runs the same check on a copy of the package (Python files only, under their
installed names), which is how the tests edit a module without touching the checkout::

    python scripts/lint_imports.py            # exit 0 when every contract is kept

It also lists any import cycle among drgym's modules (:func:`import_cycles`), with the
imports that close it. ``tests/test_layers.py`` runs both in the suite, and plain
``lint-imports`` at the root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("envs", "rewards", "training")  # repo folders linked as drgym/<name>

# Run in a child process whose sys.path starts with the tree: grimp finds ``drgym`` with
# importlib, and the parent may already have imported the editable ``drgym``.
_CYCLES = r"""
import json, sys
import grimp

graph = grimp.build_graph("drgym", cache_dir=None)
succ = {m: sorted(graph.find_modules_directly_imported_by(m) & graph.modules) for m in sorted(graph.modules)}
index, low, stack, on, comps = {}, {}, [], set(), []
for root in succ:  # Tarjan's strongly connected components, iteratively
    if root in index:
        continue
    work = [(root, 0)]
    while work:
        v, i = work.pop()
        if i == 0:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
        if i < len(succ[v]):
            work.append((v, i + 1))
            w = succ[v][i]
            if w not in index:
                work.append((w, 0))
            elif w in on:
                low[v] = min(low[v], index[w])
            continue
        for w in succ[v]:
            if w in on:
                low[v] = min(low[v], low[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in succ[v]:
                comps.append(sorted(comp))
cycles = []
for comp in comps:  # one concrete cycle per component: the shortest path back to its first module
    start, inside = comp[0], set(comp)
    prev, frontier = {start: None}, [start]
    while frontier and start not in [w for v in frontier for w in succ[v]]:
        nxt = []
        for v in frontier:
            for w in succ[v]:
                if w in inside and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    last = next(v for v in frontier if start in succ[v])
    path = [last]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])
    cycles.append(list(reversed(path)) + [start])
json.dump(cycles, sys.stdout)
"""


def package_tree(dest: Path) -> Path:
    """Copy the ``drgym`` package as installed (Python files only) under ``dest``; return ``dest``.

    The links ``drgym/envs``, ``drgym/rewards`` and ``drgym/training`` are followed, so
    the copy holds real folders that a test may edit.
    """
    ignore = shutil.ignore_patterns("__pycache__", "data", "*.pyc", "configs", "results", "checkpoints")
    shutil.copytree(ROOT / "drgym", dest / "drgym", ignore=ignore, symlinks=False)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def lint(tree: Path) -> subprocess.CompletedProcess:
    """Run plain ``lint-imports`` on a tree made by :func:`package_tree` (every contract)."""
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe) if exe.exists() else "lint-imports", "--no-cache"]
    return subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=300)


def import_cycles(tree: Path) -> list[list[str]]:
    """Import cycles among the modules of a tree made by :func:`package_tree`.

    The graph is grimp's, as import-linter builds it: every ``import`` statement, at
    module level or inside a function, is an edge.

    Returns:
        One cycle per strongly connected component, as a module path that ends where it
        starts (``["drgym.a", "drgym.b", "drgym.a"]``); ``[]`` when the graph is acyclic.

    Raises:
        RuntimeError: grimp failed (its stderr is in the message).
    """
    res = subprocess.run([sys.executable, "-c", _CYCLES], cwd=tree, env=_env(tree),
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"building the import graph failed: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="drgym-layers-") as tmp:
        tree = package_tree(Path(tmp))
        res = lint(tree)
        sys.stdout.write(res.stdout[res.stdout.find("Contracts"):] if "Contracts" in res.stdout else res.stdout)
        sys.stderr.write(res.stderr)
        cycles = import_cycles(tree)
        for c in cycles:
            print("import cycle: " + " -> ".join(c))
        return res.returncode or (1 if cycles else 0)


if __name__ == "__main__":
    raise SystemExit(main())
