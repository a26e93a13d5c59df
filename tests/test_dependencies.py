"""What drgym imports is installed, declared and within the tested versions.

* every module of the package imports (walked with pkgutil over the packages that
  pyproject.toml installs, so ``drgym.envs``, ``drgym.rewards`` and ``drgym.training`` too);
* every third-party import in the package's source, including the ones deferred into
  functions (``import trafilatura`` in ``drgym.search.pages``), resolves, with the names
  taken from it: a missing transitive dependency fails here, by name, and not at a
  user's first page fetch;
* each optional backend (the extras other than ``test``/``dev``/``docs``) either imports, or its
  entry point raises :class:`drgym.errors.DependencyNotInstalled` naming the extra;
* ``deptry`` finds no undeclared or unused dependency;
* the installed versions and ``requirements/lock.txt`` satisfy pyproject's ranges, the
  lock holds the CPU build of torch and nothing from CUDA, and the upper bounds on
  the libraries whose internals drgym uses sit at the locked major.minor.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCK = REPO / "requirements" / "lock.txt"

# -- the package's modules ----------------------------------------------------------------


def _package_dirs() -> dict[str, Path]:
    """``{package: source folder}`` for the packages pyproject.toml installs."""
    st = PYPROJECT["tool"]["setuptools"]
    mapping = st.get("package-dir", {})
    out = {}
    for pkg in st["packages"]:
        top = max((p for p in mapping if pkg == p or pkg.startswith(p + ".")), key=len, default=None)
        if top is None:
            folder = REPO / pkg.replace(".", "/")
        else:
            folder = REPO / mapping[top] / pkg[len(top):].lstrip(".").replace(".", "/")
        out[pkg] = folder
    return out


def _walk_modules() -> tuple[list[str], list[str]]:
    """(every module name, every subpackage name) found by pkgutil under the installed
    packages' folders, without importing anything."""
    modules, packages = [], []
    for pkg, folder in _package_dirs().items():
        # One level per package: pyproject lists the subpackages, whose folders are walked
        # in turn (pkgutil.walk_packages would import each package to recurse).
        for info in pkgutil.iter_modules([str(folder)], prefix=pkg + "."):
            (packages if info.ispkg else modules).append(info.name)
    modules += list(_package_dirs())
    return sorted(set(modules)), sorted(set(packages))


MODULES, SUBPACKAGES = _walk_modules()


def test_every_subpackage_is_installed():
    """A folder with an ``__init__.py`` that pyproject's ``packages`` does not list imports
    from a checkout but is missing from the wheel."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    missing = [p for p in SUBPACKAGES if p not in listed]
    assert not missing, f"packages not listed in pyproject.toml [tool.setuptools] packages: {missing}"
    assert len(MODULES) > 50, MODULES  # the walk found the package, not an empty folder


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    try:
        importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"import {name} failed: {type(e).__name__}: {e}. Declare the missing distribution in "
                    "pyproject.toml, or import it inside the function that needs it and raise "
                    "DependencyNotInstalled when it is an optional backend.")


# -- third-party imports in the source --------------------------------------------------


def _optional_modules() -> dict[str, str]:
    """``{top-level module: extra}`` for the distributions that only extras install."""
    core = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    names = PYPROJECT["tool"].get("deptry", {}).get("package_module_name_map", {})
    out = {}
    for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items():
        if extra in TOOL_EXTRAS:
            continue
        for r in reqs:
            name = Requirement(r).name
            if name.lower() not in core:
                out[names.get(name, name.replace("-", "_"))] = extra
    return out


TOOL_EXTRAS = ("test", "dev", "docs")


def _source_imports() -> dict[str, dict[str, set[str]]]:
    """``{imported module: {source file: names taken from it}}`` for every absolute import
    of a third-party module anywhere in the package's source (module level or inside a
    function)."""
    first_party = {"drgym"} | {p.split(".")[0] for p in PYPROJECT["tool"]["setuptools"]["packages"]}
    found: dict[str, dict[str, set[str]]] = {}
    for folder in {f for f in _package_dirs().values()}:
        for path in folder.glob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    pairs = [(a.name, None) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    pairs = [(node.module, a.name) for a in node.names]
                else:
                    continue
                for mod, attr in pairs:
                    top = mod.split(".")[0]
                    if top in sys.stdlib_module_names or top in first_party or top == "__future__":
                        continue
                    names = found.setdefault(mod, {}).setdefault(str(path.relative_to(REPO)), set())
                    if attr and attr != "*":
                        names.add(attr)
    return found


SOURCE_IMPORTS = _source_imports()
OPTIONAL = _optional_modules()


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("module", sorted(SOURCE_IMPORTS))
def test_third_party_import_resolves(module):
    users = SOURCE_IMPORTS[module]
    top = module.split(".")[0]
    if top in OPTIONAL and not _installed(top):
        pytest.skip(f"{top} comes with drgym[{OPTIONAL[top]}], not installed (test_optional_backend covers it)")
    where = ", ".join(sorted(users))
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{where} imports {module}: {type(e).__name__}: {e}")
    missing = []
    for names in users.values():
        for attr in names:
            if not hasattr(mod, attr) and importlib.util.find_spec(f"{module}.{attr}") is None:
                missing.append(attr)
    assert not missing, f"{where}: `from {module} import {', '.join(sorted(set(missing)))}` fails with the installed version"


# -- optional backends ------------------------------------------------------------------


def _make_policy(spec: str):
    for where in ("drgym.policies", "drgym.policies.factory", "drgym.rollout.factory"):
        try:
            return importlib.import_module(where).make_policy(spec)
        except (ModuleNotFoundError, AttributeError) as e:
            if isinstance(e, ModuleNotFoundError) and e.name and not e.name.startswith("drgym"):
                raise
            continue
    raise AssertionError("no make_policy found in drgym.policies or drgym.rollout.factory")


def _check_vllm() -> None:
    from drgym.errors import DependencyNotInstalled

    with pytest.raises(DependencyNotInstalled, match=re.escape("drgym[gpu]")):
        _make_policy("vllm:smollm2")


def _check_faiss_gpu() -> None:
    # faiss-gpu-cu12 replaces faiss-cpu's `faiss` module; without it the CPU build serves
    # every index, and drgym reports no GPU rather than failing.
    from drgym.index.faiss_build import gpus_available

    assert gpus_available() == 0


def _check_ray() -> None:
    from drgym.distributed import require_ray
    from drgym.errors import DependencyNotInstalled

    with pytest.raises(DependencyNotInstalled, match=re.escape("drgym[distributed]")):
        require_ray()


# Each distribution that only an extra installs: (its top-level module, what a user
# without it gets). A new extra (e.g. `distributed` with ray) adds its entries here.
OPTIONAL_BACKENDS: dict[str, tuple[str, Callable[[], None]]] = {
    "vllm": ("vllm", _check_vllm),
    "faiss-gpu-cu12": ("faiss", _check_faiss_gpu),
    "ray": ("ray", _check_ray),
}


def _extra_only_distributions() -> list[tuple[str, str]]:
    core = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    out = []
    for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items():
        if extra not in TOOL_EXTRAS:
            out += [(extra, Requirement(r).name) for r in reqs if Requirement(r).name.lower() not in core]
    return out


@pytest.mark.parametrize("extra,dist", _extra_only_distributions())
def test_optional_backend(extra, dist):
    """Installed, its modules import (test_module_imports); absent, drgym imports all the
    same and the backend's entry point names the extra to install."""
    assert dist in OPTIONAL_BACKENDS, (
        f"drgym[{extra}] installs {dist}: add it to OPTIONAL_BACKENDS in {Path(__file__).name} with a check of "
        "what a user without it gets (a DependencyNotInstalled naming the extra, or a working fallback)")
    module, check = OPTIONAL_BACKENDS[dist]
    try:
        installed_dist = md.version(dist)
    except md.PackageNotFoundError:
        installed_dist = None
    if installed_dist is not None:
        importlib.import_module(module)
        return
    import drgym  # noqa: F401  (the package imports without the extra)

    check()


# -- deptry -----------------------------------------------------------------------------


def test_deptry_finds_no_issue():
    """Imports agree with pyproject.toml's dependencies (config and exceptions under
    [tool.deptry])."""
    exe = shutil.which("deptry", path=str(Path(sys.executable).parent)) or shutil.which("deptry")
    if exe is None:
        pytest.skip("deptry is not installed (it comes with drgym[test])")
    # any virtual environment inside the checkout (not only deptry's default .venv/venv names)
    venvs = [p.name for p in REPO.iterdir() if p.is_dir() and (p / "pyvenv.cfg").is_file()]
    extra = ["--extend-exclude", "|".join(re.escape(v) for v in venvs)] if venvs else []
    proc = subprocess.run([exe, ".", *extra], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


# -- versions: installed, declared, locked ------------------------------------------------


def _declared() -> list[Requirement]:
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    reqs += [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def test_installed_versions_within_declared_bounds():
    bad = []
    for req in _declared():
        try:
            v = md.version(req.name)
        except md.PackageNotFoundError:
            bad.append(f"{req.name}: not installed")
            continue
        if not req.specifier.contains(v, prereleases=True):
            bad.append(f"{req.name} {v} is outside {req.specifier}")
    assert not bad, bad


def test_lock_satisfies_pyproject_and_holds_no_cuda():
    pins = _lock()
    bad = []
    for req in _declared():
        v = pins.get(canonicalize_name(req.name))
        if v is None:
            bad.append(f"{req.name} is not in {LOCK.name}")
        elif not req.specifier.contains(v, prereleases=True):
            bad.append(f"{LOCK.name} pins {req.name}=={v}, outside pyproject's {req.specifier}")
    assert not bad, f"{bad}; refresh the lock: bash scripts/lock.sh"
    cuda = [n for n in pins if n.startswith("nvidia-") or n == "triton"]
    assert not cuda, f"{LOCK.name} would install CUDA packages: {cuda}"
    assert Version(pins["torch"]).local == "cpu", f"torch=={pins['torch']} is not the CPU build"
    assert "drgym" not in pins


# The libraries whose internals drgym uses; pyproject bounds them below the next minor
# release after the one the suite passed with (the locked one).
INTERNALS = ("trl", "transformers")


@pytest.mark.parametrize("name", INTERNALS)
def test_internals_bounded_at_tested_minor(name):
    req = next(r for r in _declared() if canonicalize_name(r.name) == name)
    uppers = [Version(s.version) for s in req.specifier if s.operator == "<"]
    assert uppers, f"pyproject.toml gives {name} no upper bound ({req.specifier}); drgym uses its internals"
    locked = Version(_lock()[name])
    assert uppers[0] == Version(f"{locked.major}.{locked.minor + 1}"), (
        f"{name}: the lock tests {locked} but pyproject bounds it {req.specifier}; set the bound to "
        f"<{locked.major}.{locked.minor + 1} (raise it only with a lock that passed the suite)")


def test_internals_drgym_uses_exist():
    """The TRL and transformers names drgym reaches into (training/grpo.py,
    training/rollout.py): a release that renames one fails here by name."""
    import inspect

    import transformers
    import trl
    from trl.trainer.utils import RepeatSampler

    params = inspect.signature(trl.GRPOTrainer.__init__).parameters
    assert "rollout_func" in params, "GRPOTrainer no longer takes rollout_func"
    assert callable(getattr(trl.GRPOTrainer, "_get_train_sampler", None))
    src = inspect.getsource(trl.GRPOTrainer)
    for attr in ("self._metrics", "self.vllm_generation"):
        assert attr in src, f"GRPOTrainer no longer sets {attr}"
    assert {"mini_repeat_count", "batch_size", "repeat_count", "shuffle", "seed"} <= set(
        inspect.signature(RepeatSampler.__init__).parameters)
    for attr in ("get_seq_length", "batch_select_indices"):
        assert callable(getattr(transformers.DynamicCache, attr, None)), f"DynamicCache.{attr} is gone"


def test_installed_matches_lock():
    """scripts/setup.sh installs the lock's pins. CI (DRGYM_CHECK_LOCK=1) requires them;
    elsewhere (e.g. a plain `pip install -e .[test]`) a difference only skips."""
    pins = _lock()
    diff = []
    for name, v in sorted(pins.items()):
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            diff.append(f"{name}=={v} not installed")
            continue
        if Version(have) != Version(v):
            diff.append(f"{name} {have} installed, {v} locked")
    if diff and os.environ.get("DRGYM_CHECK_LOCK") != "1":
        pytest.skip(f"installed set differs from {LOCK.name} (not installed with it?): {diff[:5]}")
    assert not diff, diff
