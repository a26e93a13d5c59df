"""Which queries an IVF build calibrates its nprobe with, recorded in the manifest's
``calibration.source``: the user's queries file, else drgym's shipped real questions when
the index's encoder is the shipped MiniLM, else (last resort) the index's own rows."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from drgym.index.calibrate import SHIPPED_QUESTIONS, calibration_queries, is_shipped_encoder, shipped_questions
from drgym.index.manifest import IndexManifest

FACTORY = "IVF16,Flat"


def test_shipped_questions_are_the_real_nq_open_and_hipporag_questions():
    qs = shipped_questions()
    assert len(qs) == 200 + 159 and len(set(qs)) == len(qs)
    assert qs[0] == "when was the last time anyone was on the moon"  # NQ-open dev, first row
    assert qs[200] == "If Gallu is a demon Lilu is what?"  # HippoRAG's first HotpotQA question
    assert SHIPPED_QUESTIONS == ("tasks/nq_open_dev_200.jsonl", "tasks/hipporag_queries.tsv")


@pytest.fixture(scope="module")
def ivf_build(hotpotqa_engine, tmp_path_factory):
    """The hotpotqa corpus (994 paragraphs) built as IVF16,Flat with the shipped MiniLM."""
    from drgym.index.build import IndexSpec, build_index

    root = tmp_path_factory.mktemp("ivf")
    res = build_index(IndexSpec(corpus="hotpotqa", factory=FACTORY, name="hp-ivf"), root=root,
                      encoder=hotpotqa_engine.encoder)
    return res, root


def test_a_build_with_the_shipped_encoder_calibrates_on_shipped_questions(ivf_build, hotpotqa_engine):
    res, _ = ivf_build
    assert is_shipped_encoder(hotpotqa_engine.encoder)
    cal = IndexManifest.read(res.folder).calibration
    assert cal["source"] == "shipped-questions" and cal["questions"] == list(SHIPPED_QUESTIONS)
    assert cal["queries"] == 359 and cal["query_source"] == "given"
    assert cal["query_encoder_backend"] == hotpotqa_engine.encoder.backend == "onnx-int8"
    assert cal["nlist"] == 16 and 1 <= cal["search_params"]["nprobe"] <= 16 and cal["reached"]
    # the recorded recall is the questions' own: measured again here with the same vectors
    vectors, rec = calibration_queries(hotpotqa_engine.encoder)
    assert rec["source"] == "shipped-questions" and vectors.shape == (359, 384)


def test_a_queries_file_wins_and_the_cli_records_it(ivf_build, hotpotqa_engine, tmp_path):
    from drgym.cli import app

    res, root = ivf_build
    qfile = tmp_path / "questions.txt"
    qfile.write_text("\n".join(["who was Teutberga", "what is the capital of France", "where is Oslo",
                                "who wrote Dracula", "when did the Berlin wall fall"]) + "\n")
    r = CliRunner().invoke(app, ["index", "build", "hotpotqa", "--factory", FACTORY, "--name", "hp-ivf-q",
                                 "--root", str(root), "--queries-file", str(qfile)])
    assert r.exit_code == 0, r.output
    cal = IndexManifest.read(root / "hp-ivf-q").calibration
    assert cal["source"] == "queries-file" and cal["query_file"] == str(qfile) and cal["queries"] == 5
    assert cal["query_encoder_backend"] == "onnx-int8"
    # drgym index calibrate: the shipped questions by default, the rows when asked
    r = CliRunner().invoke(app, ["index", "calibrate", str(root / "hp-ivf-q")])
    assert r.exit_code == 0, r.output
    assert "on 359 shipped questions" in r.output
    assert IndexManifest.read(root / "hp-ivf-q").calibration["source"] == "shipped-questions"
    r = CliRunner().invoke(app, ["index", "calibrate", str(root / "hp-ivf-q"), "--own-rows"])
    assert r.exit_code == 0, r.output
    cal = IndexManifest.read(root / "hp-ivf-q").calibration
    assert cal["source"] == "rows" and cal["queries"] == 200 and "of its rows" in r.output
    r = CliRunner().invoke(app, ["index", "calibrate", str(root / "hp-ivf-q"), "--own-rows", "--queries-file",
                                 str(qfile)])
    assert r.exit_code == 2 and "give one" in r.output


def test_another_encoder_falls_back_to_the_rows(tmp_path):
    """An index whose encoder is not the shipped MiniLM (here: a table of vectors imported
    with a fake encoder) is calibrated on its own rows, and says so."""
    from test_calibrate import import_clustered

    res = import_clustered(tmp_path)
    cal = IndexManifest.read(res.folder).calibration
    assert cal["source"] == "rows" and cal["query_source"] == "rows" and cal["queries"] == 200
    assert calibration_queries(None) == (None, {"source": "rows"})


def test_a_bad_queries_file_is_named(tmp_path):
    from drgym.errors import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        calibration_queries(None, tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ConfigError, match="holds no queries"):
        calibration_queries(None, tmp_path / "empty.txt")
    (tmp_path / "q.txt").write_text("a question\n")
    with pytest.raises(ConfigError, match="an encoder is needed"):
        calibration_queries(None, tmp_path / "q.txt")
    np.save(tmp_path / "v.npy", np.ones((3, 4), dtype=np.float32))
    vectors, rec = calibration_queries(None, tmp_path / "v.npy")
    assert vectors.shape == (3, 4) and rec == {"source": "queries-file", "query_file": str(tmp_path / "v.npy")}
