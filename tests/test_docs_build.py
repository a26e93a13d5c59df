"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor,
no page left out of the navigation, and the API reference renders from the docstrings.

The build runs mkdocs in a subprocess into a temporary site folder (a few seconds); it is
skipped, saying why, only when mkdocs or its plugins are not installed (they come with
the ``test`` and ``docs`` extras).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGINS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing() -> list[str]:
    out = []
    for mod in PLUGINS:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(mod)
    return out


needs_mkdocs = pytest.mark.skipif(
    bool(_missing()), reason=f"mkdocs build needs {', '.join(_missing())}: pip install -e '.[docs]'")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DRGYM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from the repository's mkdocs.yml; the test fails with mkdocs's own
    warnings when the strict build does."""
    if _missing():
        pytest.skip(f"mkdocs build needs {', '.join(_missing())}: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    r = _build(REPO / "mkdocs.yml", out)
    assert r.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        line for line in (r.stdout + r.stderr).splitlines() if re.search(r"WARNING|ERROR|Error|Aborted", line))
    return out


@needs_mkdocs
def test_site_builds_with_every_page(site):
    """Every markdown page under docs/ became an HTML page of the site."""
    pages = sorted((REPO / "docs").rglob("*.md"))
    assert len(pages) >= 20
    for md in pages:
        rel = md.relative_to(REPO / "docs").with_suffix("")
        html = site / (rel.parent if rel.name == "index" else rel) / "index.html"
        assert html.is_file(), f"docs/{md.relative_to(REPO / 'docs')}: no {html.relative_to(site)} in the site"


@needs_mkdocs
def test_api_reference_renders_the_mapped_packages(site):
    """The API pages hold the objects of drgym.search and of the three packages that live
    outside drgym/ (envs/, rewards/, training/), with their docstrings."""
    expect = {
        "api/search/index.html": ["drgym.search.local.LocalSearchEngine", "drgym.search.registry.make_backend"],
        "api/envs/index.html": ["drgym.envs.searchqa.SearchQAEnv", "drgym.envs.driver.BatchedDriver"],
        "api/rewards/index.html": ["drgym.rewards.registry.build_reward", "drgym.rewards.qa.SoftMatch"],
        "api/training/index.html": ["drgym.training.config", "drgym.training.grpo"],
    }
    for page, ids in expect.items():
        html = (site / page).read_text(encoding="utf-8")
        for ident in ids:
            assert f'id="{ident}"' in html, f"{page}: no {ident}"
    # A doctest example inside a docstring (SoftMatch's) is highlighted as a console
    # session, its ">>> " prompts marked up as such, not read as markdown.
    rewards = (site / "api/rewards/index.html").read_text(encoding="utf-8")
    assert '<span class="gp">&gt;&gt;&gt; </span>' in rewards and "Lenient" in rewards


@needs_mkdocs
def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check can fail: a page linking to a missing page stops the strict build."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# t\n\nSee [the missing page](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\ntheme: {name: material}\nnav: [index.md]\n")
    r = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "missing.md" in r.stdout + r.stderr, r.stdout + r.stderr


def test_docs_extra_matches_the_test_extra():
    """The docs extra pins what the test extra pins for the site, so either builds it."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    docs = set(extras["docs"])
    assert docs and docs <= set(extras["test"]), (docs, extras["test"])
    assert {re.split(r"[\[<>=]", d)[0] for d in docs} == {"mkdocs", "mkdocs-material", "mkdocstrings", "griffelib"}


def test_fence_doctests():
    """The griffe extension fences doctest runs and leaves fenced code and prose alone."""
    if importlib.util.find_spec("griffe") is None:
        pytest.skip("griffe is not installed: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("drgym_package_dirs", REPO / "docs/_griffe/drgym_package_dirs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = "Prose.\n\n>>> f(1)\n[1.0, 0.0]\n\nMore.\n\n```python\n>>> kept\n```\n"
    assert mod.fence_doctests(text) == (
        "Prose.\n\n```pycon\n>>> f(1)\n[1.0, 0.0]\n```\n\nMore.\n\n```python\n>>> kept\n```\n")
