"""The ONNX Runtime query encoder (``encoder_backend="onnx"``): the same vectors and
rankings as torch's on real questions, and clear errors where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from drgym.errors import ConfigError
from envs_helpers import engine_with_encoder, nq_open_questions

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def torch_engine(default_engine):
    """The wiki-default index with the torch float32 query encoder: the reference (the
    default query encoder on the CPU is onnx-int8)."""
    with engine_with_encoder(default_engine, "torch") as engine:
        yield engine


@pytest.fixture(scope="module")
def onnx_engine(default_engine):
    """The wiki-default index served with the ONNX query encoder (exported once into the
    session's DRGYM_HOME)."""
    with engine_with_encoder(default_engine, "onnx") as engine:
        yield engine


def test_query_vectors_equal_torch(torch_engine, onnx_engine):
    qs = nq_open_questions(64)
    a = torch_engine.encoder.encode_queries(qs)
    b = onnx_engine.encoder.encode_queries(qs)
    assert onnx_engine.encoder.backend == "onnx" and torch_engine.encoder.backend == "torch"
    assert a.shape == b.shape == (64, 384) and b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert float((a * b).sum(1).min()) > 0.99999
    # one at a time (no padding) and in a batch (padded, length-sorted) agree too
    single = np.vstack([onnx_engine.encoder.encode_queries([q]) for q in qs[:8]])
    np.testing.assert_allclose(single, b[:8], atol=1e-5)


@pytest.mark.parametrize("method", ["dense", "hybrid"])
def test_rankings_equal_torch(torch_engine, onnx_engine, method):
    qs = nq_open_questions(100)
    ra = [[r.doc_id for r in res] for res in torch_engine.search_batch(qs, 10, method=method)]
    rb = [[r.doc_id for r in res] for res in onnx_engine.search_batch(qs, 10, method=method)]
    assert ra == rb


def _float32_exports(home):
    return [f for f in (home / "onnx").glob("*.onnx") if not f.stem.endswith("-int8")]  # not onnx-int8's copies


def test_export_is_reused(onnx_engine, session_drgym_home):
    files = _float32_exports(session_drgym_home)
    assert len(files) == 1 and files[0].name.startswith(onnx_engine.encoder.revision)
    from drgym.embedding import Encoder

    again = Encoder(backend="onnx")  # loads the exported file, no second export
    assert _float32_exports(session_drgym_home) == files
    assert again.encode_queries(["who wrote the iliad"]).shape == (1, 384)


def test_unknown_backend_and_gpu_device_are_refused():
    from drgym.embedding import Encoder

    with pytest.raises(ConfigError, match="onnx"):
        Encoder(backend="onxx")
    with pytest.raises(ConfigError, match="CPU only"):
        Encoder(backend="onnx", device="cuda")


def test_serve_settings_take_the_backend():
    from pydantic import ValidationError

    from drgym.search.wire import ServerSettings

    assert ServerSettings(encoder_backend="onnx").encoder_backend == "onnx"
    assert ServerSettings().encoder_backend is None  # the default for the device
    with pytest.raises(ValidationError):
        ServerSettings(encoder_backend="tensorrt")


def test_threads_per_call_pick_a_session_of_that_many_threads_and_the_same_vectors(onnx_engine):
    """``encode_queries(threads=n)`` runs every batch size on an n-thread session (made once,
    then reused) and gives the vectors the default rule gives."""
    enc = onnx_engine.encoder
    qs = nq_open_questions(24)  # above SMALL_QUERY_BATCH: the default rule uses the process's threads
    onnx = enc._onnx
    base = enc.encode_queries(qs)
    one = enc.encode_queries(qs, threads=1)
    np.testing.assert_allclose(one, base, atol=1e-5)
    sess = onnx.session_for(1)
    assert sess is onnx.session_for(1) and sess is onnx.small_session  # query_threads=1: the same session
    three = onnx.session_for(3)
    assert three is not sess and onnx._sessions[3] is three
    np.testing.assert_allclose(enc.encode_queries(qs, threads=3), base, atol=1e-5)
    with pytest.raises(ConfigError, match="threads"):
        enc.encode_queries(qs, threads=0)


def test_serve_runs_searches_on_one_thread_by_default(default_engine, monkeypatch):
    """``drgym serve`` gives its engine ``search_threads=1`` unless told otherwise (0: the
    process's threads), and such an engine ranks as the default one does."""
    from drgym.cli.serve import load_backend
    from drgym.search.wire import ServerSettings

    assert ServerSettings().search_threads == 1
    monkeypatch.setenv("DRGYM_SEARCH_THREADS", "0")
    assert ServerSettings().search_threads == 0
    engine = load_backend(ServerSettings(index_dir=str(default_engine.folder), method="hybrid"))
    try:
        assert engine.search_threads is None
    finally:
        engine.close()
    monkeypatch.delenv("DRGYM_SEARCH_THREADS")
    engine = load_backend(ServerSettings(index_dir=str(default_engine.folder), method="hybrid"))
    try:
        assert engine.search_threads == 1 and engine.with_method("dense").search_threads == 1
        qs = nq_open_questions(40)  # above DenseIndex's SMALL_BATCH, so FAISS's threads differ
        got = [[r.doc_id for r in res] for res in engine.search_batch(qs, 10)]
        want = [[r.doc_id for r in res] for res in default_engine.search_batch(qs, 10, method="hybrid")]
        assert got == want
    finally:
        engine.close()
