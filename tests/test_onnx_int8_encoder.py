"""The int8 ONNX Runtime query encoder (``encoder_backend="onnx-int8"``): query vectors
close to torch's float32 ones on real questions, rankings that move only a little, the
quantised file made once and reused, and clear errors where it cannot run."""

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
def int8_engine(default_engine):
    """The wiki-default index served with the int8 query encoder (exported and quantised
    once into the session's DRGYM_HOME)."""
    with engine_with_encoder(default_engine, "onnx-int8") as engine:
        yield engine


def test_query_vectors_close_to_torch(torch_engine, int8_engine):
    # measured on these 200 NQ-open questions: cosine to torch float32 min 0.987, mean 0.993
    # in batches; min 0.990 one query a call
    qs = nq_open_questions(200)
    a = torch_engine.encoder.encode_queries(qs)
    b = int8_engine.encoder.encode_queries(qs)
    assert int8_engine.encoder.backend == "onnx-int8" and int8_engine.encoder._onnx.int8
    assert a.shape == b.shape == (200, 384) and b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cos = (a * b).sum(1)
    assert float(cos.min()) >= 0.98 and float(cos.mean()) >= 0.99, (cos.min(), cos.mean())
    assert float(cos.max()) < 0.99999  # quantised: not the float32 weights again
    # one at a time (no padding) is as close; its activations are quantised per call, so
    # it differs a little from the padded batch (measured min cosine 0.985)
    single = np.vstack([int8_engine.encoder.encode_queries([q]) for q in qs[:32]])
    assert float((single * a[:32]).sum(1).min()) >= 0.98
    assert float((single * b[:32]).sum(1).min()) >= 0.98


def test_rankings_move_little(torch_engine, int8_engine):
    # measured on these 100 questions: top-10 overlap with torch float32 0.908 dense, 0.947
    # hybrid (passages)
    qs = nq_open_questions(100)
    for method, bound in (("dense", 0.85), ("hybrid", 0.9)):
        ra = [[r.doc_id for r in res] for res in torch_engine.search_batch(qs, 10, method=method, collapse="passage")]
        rb = [[r.doc_id for r in res] for res in int8_engine.search_batch(qs, 10, method=method, collapse="passage")]
        overlap = float(np.mean([len(set(x) & set(y)) / 10 for x, y in zip(ra, rb)]))
        assert overlap >= bound, (method, overlap)


def test_quantised_file_is_cached_and_reused(int8_engine, session_drgym_home, monkeypatch):
    import onnx

    from drgym.embedding import Encoder

    enc = int8_engine.encoder
    # the encoder is shared per process: it may have been exported under the home of the
    # first test that made it (the session's, or $DRGYM_HOME's as CI sets it)
    folder = enc._onnx.path.parent
    assert folder.name == "onnx"
    path = folder / f"{enc.revision}-{enc.max_length}-int8.onnx"
    fp32 = folder / f"{enc.revision}-{enc.max_length}.onnx"
    assert enc._onnx.path == path and path.is_file() and fp32.is_file()
    assert path.stat().st_size < fp32.stat().st_size / 3  # int8 weights: about a quarter
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file or folder left
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops, ops
    assert any(i.data_type == onnx.TensorProto.INT8 for i in model.graph.initializer)
    stamp = path.stat().st_mtime_ns
    monkeypatch.setenv("DRGYM_HOME", str(folder.parent))  # the home that holds the export
    again = Encoder(backend="onnx-int8", device="cpu")  # loads the quantised file, no second quantisation
    assert again._onnx.path == path and path.stat().st_mtime_ns == stamp
    np.testing.assert_allclose(again.encode_queries(["who wrote the iliad"]),
                               enc.encode_queries(["who wrote the iliad"]), atol=1e-6)


def test_gpu_device_is_refused():
    from drgym.embedding import Encoder

    with pytest.raises(ConfigError, match="'onnx-int8' runs on the CPU only"):
        Encoder(backend="onnx-int8", device="cuda")
    with pytest.raises(ConfigError, match="onnx-int8"):
        Encoder(backend="onnx_int8")  # unknown: the message lists the backends


def test_serve_settings_take_the_backend():
    from drgym.search.wire import ServerSettings

    assert ServerSettings(encoder_backend="onnx-int8").encoder_backend == "onnx-int8"
    assert ServerSettings().encoder_backend is None  # the default for the device
