"""The ONNX Runtime query encoder (``encoder_backend="onnx"``): the same vectors and
rankings as torch's on real questions, and clear errors where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from drgym.errors import ConfigError
from envs_helpers import engine_with_encoder, nq_open_questions

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def onnx_engine(default_engine):
    """The wiki-default index served with the ONNX query encoder (exported once into the
    session's DRGYM_HOME)."""
    with engine_with_encoder(default_engine, "onnx") as engine:
        yield engine


def test_query_vectors_equal_torch(default_engine, onnx_engine):
    qs = nq_open_questions(64)
    a = default_engine.encoder.encode_queries(qs)
    b = onnx_engine.encoder.encode_queries(qs)
    assert onnx_engine.encoder.backend == "onnx" and default_engine.encoder.backend == "torch"
    assert a.shape == b.shape == (64, 384) and b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert float((a * b).sum(1).min()) > 0.99999
    # one at a time (no padding) and in a batch (padded, length-sorted) agree too
    single = np.vstack([onnx_engine.encoder.encode_queries([q]) for q in qs[:8]])
    np.testing.assert_allclose(single, b[:8], atol=1e-5)


@pytest.mark.parametrize("method", ["dense", "hybrid"])
def test_rankings_equal_torch(default_engine, onnx_engine, method):
    qs = nq_open_questions(100)
    ra = [[r.doc_id for r in res] for res in default_engine.search_batch(qs, 10, method=method)]
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
    assert ServerSettings().encoder_backend == "torch"
    with pytest.raises(ValidationError):
        ServerSettings(encoder_backend="tensorrt")
