"""Every documentation page can be found from the two entry points a newcomer reads:
the README's documentation list and ``docs/index.md``.

A page counts as reachable when one of the two files links it by a relative Markdown
link (``[text](page.md)`` or ``[text](page.md#anchor)``). The pages checked are every
page of ``mkdocs.yml``'s ``nav`` and every ``.md`` file under ``docs/``, so a page left
out of the navigation is checked as well. Fast: reads text files only.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+?)(?:#[^)\s]*)?\)")


def _nav_pages(node) -> list[str]:
    """The page paths (relative to ``docs/``) named anywhere in a mkdocs ``nav`` tree."""
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    raise TypeError(f"unexpected nav entry {node!r}")


def _load_mkdocs() -> dict:
    # mkdocs.yml may hold !!python tags; none are used here, but a loader that ignores
    # unknown tags keeps the test about the nav, not about YAML extensions.
    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)


def _linked_pages(md: Path) -> set[str]:
    """The docs pages (relative to ``docs/``, POSIX form) that ``md`` links to."""
    out = set()
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if "://" in target or not target.endswith(".md"):
            continue
        resolved = (md.parent / target).resolve()
        try:
            out.add(PurePosixPath(resolved.relative_to(DOCS.resolve())).as_posix())
        except ValueError:
            continue  # a link outside docs/ (DATA_NOTICE.md, ...)
    return out


def test_link_parser_reads_relative_links():
    linked = _linked_pages(REPO / "README.md")
    assert "index.md" in linked and "main-job.md" in linked and "api/search.md" in linked
    assert not any("://" in p for p in linked)


def test_nav_parser_finds_nested_pages():
    pages = _nav_pages(_load_mkdocs()["nav"])
    assert "index.md" in pages and "benchmarks/main-job.md" in pages and "api/training.md" in pages


def test_every_docs_page_is_linked_from_readme_or_index():
    nav = set(_nav_pages(_load_mkdocs()["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "_griffe" not in p.parts}
    pages = nav | on_disk
    assert len(pages) >= 20, f"expected the whole site, found only {sorted(pages)}"
    linked = _linked_pages(REPO / "README.md") | _linked_pages(DOCS / "index.md") | {"index.md"}
    missing = sorted(pages - linked)
    assert not missing, (
        f"docs pages linked from neither README.md's documentation list nor docs/index.md: {missing}; "
        "add a link to each")
