"""Griffe extension for the API pages: load drgym.envs, drgym.rewards and drgym.training.

pyproject.toml maps these three subpackages to top-level folders of the repository
(``[tool.setuptools] package-dir``: ``envs/``, ``rewards/``, ``training/``), so in a
checkout they are not under ``drgym/`` and griffe, which reads the source without
importing it, does not find them. When griffe has loaded the ``drgym`` package, this
extension loads each mapped folder's modules as ``drgym.<name>.*``, as an installed
wheel lays them out. It also fences the docstrings' doctest examples (``>>>`` runs) as
``pycon`` code, so that markdown shows them as code and reads nothing in them as a link.
mkdocs.yml names it under the mkdocstrings handler's ``extensions``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import griffe

REPO = Path(__file__).resolve().parents[2]
# drgym.<name> -> folder, as in pyproject.toml's [tool.setuptools] package-dir.
PACKAGE_DIRS: dict[str, Path] = {"envs": REPO / "envs", "rewards": REPO / "rewards", "training": REPO / "training"}

logger = logging.getLogger(__name__)

# A doctest example: a ">>> " line, then "... " lines and output lines, up to a blank line.
_DOCTEST = re.compile(r"^(?P<indent>[ \t]*)>>> .*(?:\n(?P=indent)(?!\s*$).*)*", re.M)


def fence_doctests(text: str) -> str:
    """``text`` with each doctest example (a ``>>>`` line and what follows it up to a blank
    line, at the same indent) inside a fenced ``pycon`` block; text already inside a fence
    is left as it is."""
    out, fenced = [], False
    for part in re.split(r"(^[ \t]*```.*$)", text, flags=re.M):
        if part.lstrip().startswith("```"):
            fenced = not fenced
            out.append(part)
        elif fenced:
            out.append(part)
        else:
            out.append(_DOCTEST.sub(lambda m: f"{m['indent']}```pycon\n{m[0]}\n{m['indent']}```", part))
    return "".join(out)


def _fence_all(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None and ">>> " in obj.docstring.value:
        obj.docstring.value = fence_doctests(obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _fence_all(member, seen)


class DrgymPackageDirs(griffe.Extension):
    """Attach the mapped folders to the loaded ``drgym`` package as its subpackages."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Load ``envs/``, ``rewards/`` and ``training/`` under ``pkg`` when ``pkg`` is ``drgym``.

        Raises FileNotFoundError when a mapped folder has no ``__init__.py`` (the layout
        in pyproject.toml changed and this map must follow it).
        """
        if pkg.name != "drgym":
            return
        for name, root in PACKAGE_DIRS.items():
            if name in pkg.members:  # already there (an installed, non-editable layout)
                continue
            if not (root / "__init__.py").is_file():
                raise FileNotFoundError(f"{root / '__init__.py'}: drgym.{name}'s folder moved; update {__file__}")
            # Parents before children: a package's __init__ comes before its modules.
            files = sorted(root.rglob("*.py"), key=lambda p: (len(p.relative_to(root).parts), p.name != "__init__.py", p))
            for path in files:
                parts = (name, *path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                loader._load_submodule(pkg, parts, path)  # noqa: SLF001 - griffe's own submodule loader
            sub = pkg.members.get(name)
            if sub is None:
                raise RuntimeError(f"griffe could not load drgym.{name} from {root}")
            loader.expand_exports(sub)
            loader.expand_wildcards(sub, external=False)
            logger.debug("loaded drgym.%s from %s", name, root)
        _fence_all(pkg, set())
