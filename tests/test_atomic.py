"""Atomic writes: whole files or nothing, normal permissions, torn JSONL lines isolated."""

from __future__ import annotations

import json
import os
import stat

import pytest

from drgym.atomic import append_jsonl, atomic_write_json, load_jsonl_strict, read_jsonl
from drgym.errors import ConfigError


def test_atomic_write_gives_plain_open_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        p = tmp_path / "summary.json"
        atomic_write_json(p, {"a": 1})
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
        assert json.loads(p.read_text()) == {"a": 1}
        assert [f.name for f in tmp_path.iterdir()] == ["summary.json"]  # no temp file left
    finally:
        os.umask(umask)


def test_append_after_torn_line_keeps_both_records(tmp_path):
    p = tmp_path / "t.jsonl"
    append_jsonl(p, {"i": 0})
    with open(p, "a", encoding="utf-8") as f:
        f.write('{"i": 1, "tor')  # a writer killed mid-line
    append_jsonl(p, {"i": 2})
    assert read_jsonl(p) == [{"i": 0}, {"i": 2}]
    with pytest.raises(json.JSONDecodeError):
        read_jsonl(p, skip_bad=False)


def test_strict_jsonl_names_file_and_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\nnot json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"r\.jsonl:3 is not valid JSON"):
        load_jsonl_strict(p, error=ConfigError)
    with pytest.raises(ConfigError, match="No file at"):
        load_jsonl_strict(tmp_path / "missing.jsonl", error=ConfigError)
