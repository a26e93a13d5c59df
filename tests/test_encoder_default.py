"""The default query encoder (onnx-int8 on the CPU, torch on a GPU, torch one option away)
and the engine identity that records it: a run resumed against an engine with another
query encoder is refused, locally and through a server's /health."""

from __future__ import annotations

import json

import pytest

from drgym.embedding import DEFAULT_ENCODER_BACKEND, resolve_encoder_backend
from drgym.errors import ConfigError
from envs_helpers import engine_with_encoder
from test_rel_runner import _cli, _error_lines, _rollout_args, _Swappable

pytest.importorskip("onnxruntime")


def test_the_default_backend_is_int8_on_the_cpu_and_torch_on_a_gpu():
    assert DEFAULT_ENCODER_BACKEND == "onnx-int8"
    assert resolve_encoder_backend(None, "cpu") == "onnx-int8"
    assert resolve_encoder_backend(None, "cuda") == resolve_encoder_backend(None, "cuda:1") == "torch"
    assert resolve_encoder_backend("torch", "cpu") == "torch" and resolve_encoder_backend("onnx", "cpu") == "onnx"
    with pytest.raises(ConfigError, match="encoder backend.*'onnx-int9'"):
        resolve_encoder_backend("onnx-int9", "cpu")


@pytest.fixture(scope="module")
def torch_hotpotqa(hotpotqa_engine):
    """The hotpotqa index with the torch float32 query encoder (asked for by name)."""
    with engine_with_encoder(hotpotqa_engine, "torch") as engine:
        yield engine


def test_library_engines_default_to_int8_and_identity_records_the_backend(hotpotqa_engine, torch_hotpotqa):
    """``LocalSearchEngine`` with no backend (the fixture: what the library, the envs and
    the configs get) runs the int8 ONNX encoder; its identity says so, and differs from
    the torch engine's over the same index in that field only."""
    from drgym.search.local import LocalSearchEngine

    assert hotpotqa_engine.encoder.backend == "onnx-int8" and hotpotqa_engine.encoder._onnx.int8
    assert torch_hotpotqa.encoder.backend == "torch" and torch_hotpotqa.encoder._onnx is None
    a, b = torch_hotpotqa.identity(), hotpotqa_engine.identity()
    assert a["encoder_backend"] == "torch" and b["encoder_backend"] == "onnx-int8"
    assert {k for k in a if a[k] != b[k]} == {"encoder_backend"}
    assert hotpotqa_engine.with_method("bm25").identity()["encoder_backend"] is None  # no query is encoded
    default = LocalSearchEngine(hotpotqa_engine.folder, method="dense", device="cpu")  # a fresh engine: no backend
    try:
        assert default.identity()["encoder_backend"] == "onnx-int8"
    finally:
        default.close()


def test_serve_and_mcp_default_to_int8_with_torch_one_option_away(hotpotqa_engine):
    from typer.testing import CliRunner

    from drgym.cli import app
    from drgym.cli.serve import load_backend
    from drgym.search.wire import ServerSettings

    engine = load_backend(ServerSettings(index_dir=str(hotpotqa_engine.folder)))
    try:
        assert engine.encoder.backend == "onnx-int8" and engine.identity()["encoder_backend"] == "onnx-int8"
    finally:
        engine.close()
    engine = load_backend(ServerSettings(index_dir=str(hotpotqa_engine.folder), encoder_backend="torch"))
    try:
        assert engine.encoder.backend == "torch"
    finally:
        engine.close()
    for cmd in ("serve", "mcp"):
        res = CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200"})
        assert "--encoder-backend" in res.output, (cmd, res.output)


def test_health_reports_the_encoder_backend(hotpotqa_engine, torch_hotpotqa):
    import httpx

    from drgym.search.wire import ServerSettings
    from server_helpers import running_server

    for engine, want in ((hotpotqa_engine, "onnx-int8"), (torch_hotpotqa, "torch")):
        with running_server(engine, settings=ServerSettings(cache_size=0)) as srv:
            assert httpx.get(f"{srv.url}/health").json()["engine"]["encoder_backend"] == want


def test_a_resumed_run_refuses_a_local_engine_with_another_encoder(hotpotqa_engine, torch_hotpotqa, tmp_path):
    from drgym.evaluation.runner import EngineChangedError, RolloutConfig, run_rollout

    out = tmp_path / "run"
    cfg = RolloutConfig(policy="scripted", n=2, out=str(out), batch_size=2, plots=False)
    run_rollout(cfg, backend=torch_hotpotqa, progress=False)
    assert json.loads((out / "config.json").read_text())["engine"]["encoder_backend"] == "torch"
    more = RolloutConfig(policy="scripted", n=3, out=str(out), batch_size=2, plots=False)
    with pytest.raises(EngineChangedError, match=r"encoder_backend: 'torch' -> 'onnx-int8'"):
        run_rollout(more, backend=hotpotqa_engine, progress=False)
    res = run_rollout(more, backend=torch_hotpotqa, progress=False)  # the same encoder resumes
    assert res.skipped == 2 and res.new_episodes == 1


def test_a_resumed_run_refuses_a_server_restarted_with_another_encoder(hotpotqa_engine, torch_hotpotqa, monkeypatch,
                                                                      tmp_path):
    """A server restarted with ``--encoder-backend torch`` (everything else equal) is another
    engine for a run that searched its int8 default."""
    from drgym.search.wire import ServerSettings
    from server_helpers import running_server

    served = _Swappable(hotpotqa_engine)
    served.identity = lambda: served.engine.identity()
    out = tmp_path / "run"
    with running_server(served, settings=ServerSettings(cache_size=0)) as srv:
        res = _cli(_rollout_args(srv.url, out, 2), monkeypatch)
        assert res.exit_code == 0, res.output
        assert json.loads((out / "config.json").read_text())["engine"]["engine"]["encoder_backend"] == "onnx-int8"
        before = (out / "trajectories.jsonl").read_bytes()
        served.engine = torch_hotpotqa
        res = _cli(_rollout_args(srv.url, out, 3), monkeypatch)
        assert res.exit_code == 2, res.output
        [line] = _error_lines(res.output)
        assert "was run against another search engine" in line
        assert "engine.encoder_backend: 'onnx-int8' -> 'torch'" in line
        assert (out / "trajectories.jsonl").read_bytes() == before


def test_int8_query_vectors_do_not_depend_on_the_batch(hotpotqa_engine):
    """Dynamic int8 quantisation scales a forward pass's activations as a whole, so the int8
    encoder runs one query a pass: a query's vector is the same alone, in any batch and on
    any number of threads (a server's micro-batches cannot change a ranking)."""
    import numpy as np

    from envs_helpers import nq_open_questions

    enc = hotpotqa_engine.encoder
    qs = nq_open_questions(40)
    batch = enc.encode_queries(qs)
    alone = np.vstack([enc.encode_queries([q]) for q in qs])
    mixed = enc.encode_queries(qs[20:] + ["a much longer question about " * 12] + qs[:20])
    assert np.array_equal(batch, alone)
    assert np.array_equal(np.vstack([mixed[21:], mixed[:20]]), batch)
    assert np.array_equal(enc.encode_queries(qs, threads=2), batch)


def test_int8_batch_tokenised_once_feeds_each_pass_what_it_gets_alone(hotpotqa_engine, monkeypatch):
    """A batch for the int8 encoder is tokenised in one call and each row cut to its own
    tokens; every forward pass gets exactly the arrays its text gets tokenised alone (a
    text past the encoder's window, spaces around a text, and texts of one token among
    them), so the vectors are the same as one text a call."""
    import numpy as np

    from envs_helpers import nq_open_questions

    onnx = hotpotqa_engine.encoder._onnx
    assert onnx.int8 and onnx.model.tokenizer.padding_side == "right"
    qs = nq_open_questions(12) + ["word " * 600, "   spaced   question  ", "x", "Ünïcödé ça va?"]
    prefixed = [hotpotqa_engine.encoder.prefixes.query + q for q in qs]
    feeds: list[dict] = []
    calls: list[int] = []
    for sess in {id(s): s for s in (onnx.session, onnx.small_session, onnx.session_for(1))}.values():
        run = sess.run

        def spy(names, feed, _run=run):
            feeds.append({k: v.copy() for k, v in feed.items()})
            return _run(names, feed)
        monkeypatch.setattr(sess, "run", spy)
    real_features = onnx._features
    monkeypatch.setattr(onnx, "_features", lambda texts: (calls.append(len(texts)), real_features(texts))[1])
    together = onnx.encode(prefixed, 16, threads=1)
    assert calls == [len(qs)]  # one tokenizer call for the batch
    batch_feeds = list(feeds)
    feeds.clear()
    alone = np.vstack([onnx.encode([t], 16, threads=1) for t in prefixed])
    order = np.argsort([-len(t) for t in prefixed], kind="stable")
    assert len(batch_feeds) == len(feeds) == len(qs)
    for pos, i in enumerate(order):
        assert batch_feeds[pos].keys() == feeds[i].keys()
        for name in feeds[i]:
            assert np.array_equal(batch_feeds[pos][name], feeds[i][name]), (qs[i][:40], name)
    assert np.array_equal(together, alone)


def test_an_unwritable_home_exports_for_the_process_only(monkeypatch, tmp_path, caplog):
    """Where ``$DRGYM_HOME/onnx`` cannot be written (a read-only home holding an index), the
    export goes to one temporary folder of the process instead of failing the search
    (end to end: tests/test_bad_inputs.py::test_read_only_drgym_home, slow)."""
    import drgym.embedding as emb

    monkeypatch.setattr(emb, "_PROCESS_ONNX_DIR", None)
    home = tmp_path / "home" / "onnx"
    assert emb._writable_onnx_dir(home) == home  # writable: the cache itself
    monkeypatch.setattr(emb.os, "access", lambda path, mode: False)
    first = emb._writable_onnx_dir(home)
    assert first != home and first.is_dir() and first.name.startswith("drgym-onnx-")
    assert emb._writable_onnx_dir(home) == first  # one folder per process
    assert "cannot be written" in caplog.text and str(first) in caplog.text
