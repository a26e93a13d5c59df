"""The documentation's figure tables are what scripts/readme_tables.py renders from the committed JSON."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_tables", REPO / "scripts" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_tables)


def test_every_table_has_a_page():
    assert set(readme_tables.TABLE_PAGES) == set(readme_tables.TABLES)
    for page in readme_tables.TABLE_PAGES.values():
        assert page.startswith("docs/") and (REPO / page).is_file(), page


@pytest.mark.parametrize("name", sorted(readme_tables.TABLES))
def test_table_matches_json(name):
    page = readme_tables.TABLE_PAGES[name]
    text = (REPO / page).read_text(encoding="utf-8")
    assert readme_tables.readme_table(text, name) == readme_tables.render(name), (
        f"{page}'s {name} table is not what the JSON gives: run python scripts/readme_tables.py --write")


def test_each_table_is_marked_once_and_only_in_its_page():
    """A table's markers appear once, in its own page: a copy left in the README or in
    another page would not be kept up to date."""
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for name in readme_tables.TABLES:
        where = [f.relative_to(REPO).as_posix() for f in files
                 for _ in re.finditer(rf"<!-- table:{re.escape(name)} -->", f.read_text(encoding="utf-8"))]
        assert where == [readme_tables.TABLE_PAGES[name]], (name, where)


def test_main_job_table_reads_each_run(tmp_path, monkeypatch):
    """A row shows its own run's figures: change one metrics.json and the table changes."""
    src = REPO / readme_tables.MAIN_JOB_DIR
    dst = tmp_path / readme_tables.MAIN_JOB_DIR
    for name, _ in readme_tables.MAIN_JOB_ROWS:
        (dst / name).mkdir(parents=True)
        for f in ("metrics.json", "run.json"):
            (dst / name / f).write_text((src / name / f).read_text())
    monkeypatch.setattr(readme_tables, "REPO", tmp_path)
    before = readme_tables.main_job()
    name, label = readme_tables.MAIN_JOB_ROWS[0]
    m = json.loads((dst / name / "metrics.json").read_text())
    m["invalid_action_rate"] = 0.123
    (dst / name / "metrics.json").write_text(json.dumps(m))
    after = readme_tables.main_job()
    row = next(r for r in after.splitlines() if r.startswith(f"| {label} |"))
    assert "| 12.3 % |" in row and after != before


def test_write_replaces_only_the_marked_tables():
    page = readme_tables.TABLE_PAGES["retrieval"]
    names = readme_tables.pages()[page]
    text = (REPO / page).read_text(encoding="utf-8")
    stale = text.replace("<!-- table:retrieval -->\n", "<!-- table:retrieval -->\n| stale |\n", 1)
    assert stale != text
    assert readme_tables.write(stale, names, page) == text
    with pytest.raises(KeyError, match="docs/x.md has no <!-- table:main_job -->"):
        readme_tables.write("no markers here", ["main_job"], "docs/x.md")
    with pytest.raises(KeyError):
        readme_tables.readme_table("no markers here", "main_job")


def test_check_and_write_cover_every_page(tmp_path, monkeypatch, capsys):
    """--check fails naming the page and table that is stale, and --write fixes that page."""
    for page in readme_tables.pages():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((REPO / page).read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(readme_tables, "REPO", tmp_path)
    monkeypatch.setattr(readme_tables, "render", lambda name: f"| {name} |\n")
    assert readme_tables.main(["--check"]) == 1
    assert "docs/benchmarks/scale.md: scale_paper" in capsys.readouterr().out
    assert readme_tables.main(["--write"]) == 0
    assert "<!-- table:scale_paper -->\n| scale_paper |\n<!-- /table:scale_paper -->" in (
        tmp_path / "docs/benchmarks/scale.md").read_text(encoding="utf-8")
    assert readme_tables.main(["--check"]) == 0


def test_rendered_tables_carry_no_local_paths_or_history():
    """The JSON keeps the raw commands and labels of the runs; the tables show none of a
    machine's scratch paths nor labels that only made sense while the code was changing."""
    for name in readme_tables.TABLES:
        out = readme_tables.render(name)
        for word in ("/tmp/", "/work/", "/home/", "README", "engineer", "before the thread changes"):
            assert word not in out, (name, word)
    assert "--before-src DIR --search-r1 RETRIEVAL_SERVER_PY" in readme_tables.render("server_load")
