"""The README's figure tables are what scripts/readme_tables.py renders from the committed JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_tables", REPO / "scripts" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_tables)


@pytest.mark.parametrize("name", sorted(readme_tables.TABLES))
def test_readme_table_matches_json(name):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_tables.readme_table(text, name) == readme_tables.render(name), (
        f"README.md's {name} table is not what the JSON gives: run python scripts/readme_tables.py --write")


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
    m["invalid_action_rate"] = 0.07
    (dst / name / "metrics.json").write_text(json.dumps(m))
    after = readme_tables.main_job()
    row = next(r for r in after.splitlines() if r.startswith(f"| {label} |"))
    assert "| 7.0 % |" in row and after != before


def test_write_replaces_only_the_marked_tables():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    stale = text.replace("<!-- table:retrieval -->\n", "<!-- table:retrieval -->\n| stale |\n", 1)
    assert stale != text
    assert readme_tables.write(stale) == text
    with pytest.raises(KeyError):
        readme_tables.readme_table("no markers here", "main_job")
