"""A malformed corpus file is reported before ``drgym index build`` loads any model.

The encoder loader is replaced by one that fails the test if it is called, so each test
shows that the corpus error came first. The corpora are written here: a few wiki-18
rows, one of them broken.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drgym.cli import app
from drgym.corpus.readers import check_corpus_start
from drgym.errors import CorpusError
from drgym.index.build import IndexSpec, build_index


def _row(i: int, title: str, text: str) -> str:
    return json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'})


GOOD = [_row(1, "Iliad", "The Iliad is an epic poem attributed to Homer."),
        _row(2, "Odyssey", "The Odyssey is the second Homeric epic.")]


@pytest.fixture
def no_encoder(monkeypatch):
    """Any attempt to load an encoder fails the test."""
    import drgym.embedding
    import drgym.index.build as build

    def refuse(*a, **k):
        raise AssertionError("the encoder was loaded before the corpus was checked")

    monkeypatch.setattr(build, "get_encoder", refuse)
    monkeypatch.setattr(drgym.embedding, "Encoder", refuse)


def test_bad_json_line_fails_before_the_encoder_loads(tmp_path, no_encoder):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(GOOD + ['{"id": "3", "contents": "oops']) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:3: not valid JSON"):
        build_index(IndexSpec(corpus=str(bad), format="wiki18", name="bad"), root=tmp_path / "indexes")
    assert not (tmp_path / "indexes" / "bad").exists()


def test_missing_fields_fail_before_the_encoder_loads_also_when_sniffed(tmp_path, no_encoder):
    bad = tmp_path / "fields.jsonl"
    bad.write_text("\n".join(GOOD + [json.dumps({"id": "3", "text": "no contents"})]) + "\n", encoding="utf-8")
    # the format is sniffed from the first row (wiki18); the third lacks 'contents'
    with pytest.raises(CorpusError, match=r"fields\.jsonl:3: wiki18 rows need 'id' and 'contents'.*got keys \['id', 'text'\]"):
        build_index(IndexSpec(corpus=str(bad), name="fields"), root=tmp_path / "indexes")


def test_a_bad_file_in_a_corpus_folder_is_named(tmp_path, no_encoder):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    (folder / "b.jsonl").write_bytes(GOOD[0].encode() + b"\n" + b'{"id": "9", "contents": "\xff"}\n')
    with pytest.raises(CorpusError, match=r"b\.jsonl.*2.*UTF-8"):
        build_index(IndexSpec(corpus=str(folder), format="wiki18", name="folder"), root=tmp_path / "indexes")


def test_cli_reports_the_bad_line_with_exit_status_2(tmp_path, no_encoder):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(GOOD + ["[1, 2]"]) + "\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["index", "build", str(bad), "--format", "wiki18", "--root", str(tmp_path / "ix")])
    assert res.exit_code == 2, res.output
    assert "bad.jsonl:3: expected a JSON object, got list" in res.output
    assert "Traceback" not in res.output


def test_small_files_are_read_whole_and_large_ones_by_their_first_rows(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(GOOD) + "\n", encoding="utf-8")
    assert check_corpus_start(good) == {"path": str(good), "format": "wiki18", "rows": 2, "whole": True}
    # a file of whole_bytes or more: the first rows only, so a late bad row is left to the build
    late = tmp_path / "late.jsonl"
    late.write_text("\n".join(GOOD * 3 + ["not json"]) + "\n", encoding="utf-8")
    size = late.stat().st_size
    assert check_corpus_start(late, "wiki18", first_rows=4, whole_bytes=size) == {
        "path": str(late), "format": "wiki18", "rows": 4, "whole": False}
    with pytest.raises(CorpusError, match=r"late\.jsonl:7: not valid JSON"):
        check_corpus_start(late, "wiki18", first_rows=4, whole_bytes=size + 1)  # small: read whole
    with pytest.raises(CorpusError, match=r"late\.jsonl:7: not valid JSON"):
        check_corpus_start(late, "wiki18", first_rows=7, whole_bytes=size)  # the bad row is among the first
    with pytest.raises(CorpusError, match="Corpus file not found"):
        check_corpus_start(tmp_path / "nope.jsonl")


def test_the_check_leaves_the_untitled_row_warning_to_the_build(tmp_path, caplog):
    import logging

    p = tmp_path / "untitled.jsonl"
    p.write_text(GOOD[0] + "\n" + json.dumps({"id": "2", "contents": "Rome is the capital of Italy."}) + "\n",
                 encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert check_corpus_start(p)["rows"] == 2
    assert not [r for r in caplog.records if "title line" in r.getMessage()]
    from drgym.corpus.readers import read_corpus

    with caplog.at_level(logging.WARNING):
        list(read_corpus(p))  # the reader itself still warns
    assert [r for r in caplog.records if "title line" in r.getMessage()]
