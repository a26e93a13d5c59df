"""Counts of the codebase's structure, for the table in docs/development.md.

    python scripts/structure_counts.py            # this checkout
    python scripts/structure_counts.py OTHER_DIR  # another checkout (git archive REV | tar -x -C DIR)

Prints one JSON object: the package's Python files and lines (drgym/, envs/, rewards/,
training/), its imports of its own modules and how many of those sit inside a function,
the largest module, `scripts/`'s Python files and lines, and `sys.path` insertions in
`scripts/` and `tests/`. Standard library only.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

OWN = ("drgym", "envs", "rewards", "training")
CALLS = ("sys.path" + ".insert(", "syspath" + "_prepend(")  # written apart so that this file does not count itself


def _own_imports(tree: ast.AST) -> tuple[int, int]:
    """(imports of drgym's own modules, those inside a function) in one parsed module."""
    total = inside = 0

    def visit(node: ast.AST, in_function: bool) -> None:
        nonlocal total, inside
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom):
                    names = ["drgym"] if child.level else [child.module or ""]
                else:
                    names = [a.name for a in child.names]
                if any(n.split(".")[0] in OWN for n in names):
                    total += 1
                    inside += in_function
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return total, inside


def counts(root: Path) -> dict:
    files = sorted(p for d in OWN for p in (root / d).rglob("*.py"))
    lines = {p: p.read_text(encoding="utf-8").count("\n") for p in files}
    own = inside = 0
    for p in files:
        t, i = _own_imports(ast.parse(p.read_text(encoding="utf-8")))
        own, inside = own + t, inside + i
    largest = max(files, key=lines.__getitem__)
    scripts = sorted((root / "scripts").glob("*.py"))

    def sys_path(paths) -> int:
        return sum(p.read_text(encoding="utf-8").count(s) for p in paths for s in CALLS)

    return {"package_files": len(files), "package_lines": sum(lines.values()), "own_imports": own,
            "own_imports_inside_functions": inside,
            "largest_module": [str(largest.relative_to(root)), lines[largest]],
            "scripts_files": len(scripts), "scripts_lines": sum(p.read_text(encoding="utf-8").count("\n") for p in scripts),
            "sys_path_insertions_scripts": sys_path(scripts),
            "sys_path_insertions_tests": sys_path(sorted((root / "tests").glob("*.py")))}


if __name__ == "__main__":
    print(json.dumps(counts(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])), indent=1))
