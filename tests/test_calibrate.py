"""An IVF index's nprobe measured on its own rows (drgym.index.calibrate): what a build
records, that every server of the index searches from it, and ``drgym index calibrate``.

Indexes of 6,000 clustered 32-d unit vectors (600 topics) imported with
:func:`drgym.index.importer.import_index`; the query encoder is the table of
tests/test_scale_rules.py, so nothing loads a model and Ray is not started."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.calibrate import TARGET_RECALL, calibrate_nprobe, exact_neighbours, nprobe_grid
from drgym.index.dense import DenseIndex
from drgym.index.search_params import auto_nprobe
from drgym.index.importer import import_index
from drgym.index.manifest import IndexManifest
from drgym.search.local import LocalSearchEngine
from test_scale_rules import ENCODER, fake_encoder, ranking, ray_router, write_corpus  # noqa: F401 (fixture)

N, DIM, TOPICS = 6000, 32, 600


def clustered_rows(n: int = N, seed: int = 3, noise: float = 0.6) -> np.ndarray:
    """Unit vectors near one of ``TOPICS`` random topic centres (``noise``: the spread)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((TOPICS, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, TOPICS, n)] + noise * rng.standard_normal((n, DIM)) / np.sqrt(DIM)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def import_clustered(tmp_path, factory: str = "IVF256,Flat", shard_size: int = 3000, noise: float = 0.6, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_corpus(tmp_path / "wiki-18.jsonl", [str(i) for i in range(N)])
    np.save(tmp_path / "emb.npy", clustered_rows(noise=noise))
    return import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                        factory=factory, shard_size=shard_size, root=tmp_path / "idx", bm25=False, **kw)


@pytest.fixture
def calibrated(tmp_path):
    """2 shards of IVF256,Flat sharing one quantizer, calibrated at the default target."""
    return import_clustered(tmp_path)


def own_row_recall(folder, m, nprobe: int, queries: int = 200, seed: int = 0) -> tuple[float, float]:
    """recall@10 of the index's own rows at ``nprobe``, the row itself left out, and its
    one-sided 95% lower bound, computed here from the stored float16 rows and numpy (not
    with calibrate's helpers)."""
    emb = np.concatenate([np.load(folder / s.embeddings).astype(np.float32) for s in m.shards])
    rows = np.sort(np.random.default_rng(seed).choice(len(emb), queries, replace=False))
    q = emb[rows]
    scores = q @ emb.T
    scores[np.arange(len(rows)), rows] = -np.inf
    truth = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    dense = DenseIndex(folder, m.shards, m.dim, m.n_passages, search_params={"nprobe": nprobe})
    found = dense.search(q, 11)[1]
    dense.close()
    hits = [len(set(t.tolist()) & set([x for x in f.tolist() if x != r][:10])) / 10
            for t, f, r in zip(truth, found, rows)]
    return float(np.mean(hits)), float(np.mean(hits) - 1.645 * np.std(hits, ddof=1) / np.sqrt(len(hits)))


def test_build_records_the_smallest_nprobe_that_reaches_the_target(calibrated):
    m = IndexManifest.read(calibrated.folder)
    cal = m.calibration
    assert cal["target_recall"] == TARGET_RECALL and cal["reached"] and cal["k"] == 10 and cal["queries"] == 200
    assert cal["nlist"] == 256 and cal["rerank"] == 100 and cal["probe_groups"] == 4 and m.timings["calibrate"] > 0
    nprobe = cal["search_params"]["nprobe"]
    assert m.search_defaults == {"nprobe": nprobe}
    tried = [p["nprobe"] for p in cal["curve"]]
    assert tried == nprobe_grid(256)[:len(tried)] and tried[-1] == nprobe
    assert all(p["recall_low"] < TARGET_RECALL for p in cal["curve"][:-1])
    assert cal["recall"] > cal["recall_low"] == cal["curve"][-1]["recall_low"] >= TARGET_RECALL
    # clustered rows need far fewer lists than a quarter (64 of 256)
    assert nprobe <= auto_nprobe(256) // 4
    # the recorded recall and bound and the bound below them, recomputed independently
    mean, low = own_row_recall(calibrated.folder, m, nprobe)
    assert (mean, low) == (pytest.approx(cal["recall"], abs=1e-4), pytest.approx(cal["recall_low"], abs=1e-4))
    assert len(tried) > 1 and own_row_recall(calibrated.folder, m, tried[-2])[1] < TARGET_RECALL
    # held-out vectors from the same topics reach about the same recall there
    held = clustered_rows(200, seed=3)  # the same topics, other noise: not stored rows
    emb = np.concatenate([np.load(calibrated.folder / s.embeddings).astype(np.float32) for s in m.shards])
    truth = np.argsort(-(held @ emb.T), axis=1, kind="stable")[:, :10]
    dense = DenseIndex.from_manifest(calibrated.folder, m)
    found = dense.search(held, 10)[1]
    dense.close()
    recall = np.mean([len(set(t.tolist()) & set(f.tolist())) / 10 for t, f in zip(truth, found)])
    assert recall >= TARGET_RECALL - 0.01


def test_the_recorded_nprobe_clears_the_target_by_the_sampling_error(tmp_path):
    """Spread-out rows: at some nprobe the mean recall@10 of the 200 rows reaches 0.95 but
    its 95% lower bound does not; the next value of the grid is recorded."""
    cal = import_clustered(tmp_path, noise=1.0).manifest.calibration
    short = [p for p in cal["curve"] if p["recall"] >= TARGET_RECALL > p["recall_low"]]
    assert short and cal["curve"][-1]["nprobe"] > short[0]["nprobe"]
    assert cal["recall_low"] >= TARGET_RECALL and cal["search_params"]["nprobe"] == cal["curve"][-1]["nprobe"]


def test_library_serve_and_ray_shards_search_from_the_calibrated_nprobe(calibrated, fake_encoder):
    """The library engine, ``drgym serve``'s engine and ``drgym serve-ray``'s shard
    servers all load the manifest's nprobe and rank alike; a caller's nprobe still wins."""
    from drgym.cli.serve import load_backend
    from drgym.distributed.serve import ShardServer
    from drgym.search.wire import ServerSettings

    folder = calibrated.folder
    nprobe = calibrated.manifest.calibration["search_params"]["nprobe"]
    queries = [f"q{i}" for i in range(30)]
    lib = LocalSearchEngine(folder, method="dense", collapse="passage")
    served = load_backend(ServerSettings(index_dir=str(folder), method="dense", collapse="passage"))
    shards, ray_engine = ray_router(folder, 2)
    assert lib._shared.dense.shard_params == [{"nprobe": nprobe, "rerank": 100, "probe_groups": 4}] * 2
    assert [s.dense.shard_params[0] for s in shards] == [{"nprobe": nprobe, "rerank": 100, "probe_groups": 4}] * 2
    want = ranking(lib.search_batch(queries, 10))
    assert ranking(served.search_batch(queries, 10)) == want
    assert ranking(ray_engine.search_batch(queries, 10)) == want
    given = LocalSearchEngine(folder, method="dense", collapse="passage", search_params={"nprobe": 64})
    assert given._shared.dense.shard_params == [{"nprobe": 64, "rerank": 100, "probe_groups": 4}] * 2
    own = ShardServer(str(folder), 0, {"nprobe": 0, "rerank": 100})  # 0: the index's own, as by default
    assert own.dense.shard_params == [{"nprobe": nprobe, "rerank": 100, "probe_groups": 4}]
    for e in (lib, served, ray_engine, given):
        e.close()


def test_uncalibrated_and_flat_indexes_keep_the_quarter_rule(tmp_path):
    off = import_clustered(tmp_path / "off", target_recall=None)
    assert off.manifest.calibration == {} and off.manifest.search_defaults == {}
    dense = DenseIndex.from_manifest(off.folder, off.manifest)
    assert dense.shard_params == [{"nprobe": auto_nprobe(256), "rerank": 100, "probe_groups": 4}] * 2
    dense.close()
    flat = import_clustered(tmp_path / "flat", factory="Flat")
    assert flat.manifest.calibration == {} and "calibrate" not in flat.manifest.timings
    with pytest.raises(ConfigError, match="target_recall must be in"):
        import_clustered(tmp_path / "bad", target_recall=1.5)


def test_calibrate_cli_records_another_target(calibrated):
    from drgym.cli import app

    folder = calibrated.folder
    before = IndexManifest.read(folder)
    r = CliRunner().invoke(app, ["index", "calibrate", str(folder), "--target-recall", "0.995"])
    assert r.exit_code == 0, r.output
    after = IndexManifest.read(folder)
    assert after.calibration["target_recall"] == 0.995 and after.calibration["recall_low"] >= 0.995
    assert after.search_defaults["nprobe"] > before.search_defaults["nprobe"]
    assert f"nprobe {after.search_defaults['nprobe']} of 256 lists" in r.output
    assert after.identity() == before.identity() and after.files == before.files  # nothing else changed
    r = CliRunner().invoke(app, ["index", "calibrate", str(folder), "--target-recall", "0"])
    assert r.exit_code == 2 and "target recall must be in (0, 1], got 0.0" in r.output
    assert IndexManifest.read(folder).calibration == after.calibration  # a refused run writes nothing


def test_calibrate_cli_refuses_a_flat_index(tmp_path):
    from drgym.cli import app

    flat = import_clustered(tmp_path, factory="Flat")
    r = CliRunner().invoke(app, ["index", "calibrate", str(flat.folder)])
    assert r.exit_code == 2 and "is not an IVF index with stored float16 rows" in r.output


def test_a_malformed_calibration_is_refused_by_name(calibrated):
    folder = calibrated.folder
    data = json.loads((folder / "manifest.json").read_text())
    data["calibration"]["search_params"] = {"nprobe": "many"}
    (folder / "manifest.json").write_text(json.dumps(data))
    m = IndexManifest.read(folder)
    with pytest.raises(CorruptIndexError, match="malformed calibration"):
        DenseIndex.from_manifest(folder, m)


def test_exact_neighbours_match_a_full_sort_across_parts_and_chunks(monkeypatch):
    import drgym.index.calibrate as cal

    x = clustered_rows(1000, seed=5)
    q = x[:7] + 0.01
    want = np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :12]
    monkeypatch.setattr(cal, "EXACT_CHUNK_ROWS", 64)  # several chunks in each part
    got = exact_neighbours([x[:300], x[300:]], q, 12)
    assert got.tolist() == want.tolist()


def test_an_unreachable_target_records_where_the_curve_levels_off(calibrated, monkeypatch, caplog):
    """A target above what the whole index gives (here: every candidate list cut to 2
    rows by a patched depth) is reported as not reached; every nprobe is tried and the
    smallest within PLATEAU of the best recall is recorded, not every list."""
    import drgym.index.dense as dense_mod
    from drgym.index.calibrate import PLATEAU

    m = IndexManifest.read(calibrated.folder)
    monkeypatch.setattr(dense_mod.DenseIndex, "_depth", lambda self, i, k: 2)
    cal = calibrate_nprobe(calibrated.folder, m.shards, m.dim, m.n_passages, target=0.99)
    assert not cal["reached"] and cal["plateau"] == PLATEAU == 0.005
    assert [p["nprobe"] for p in cal["curve"]] == nprobe_grid(256)
    best = max(p["recall"] for p in cal["curve"])
    within = [p for p in cal["curve"] if p["recall"] >= best - PLATEAU]
    assert cal["search_params"] == {"nprobe": within[0]["nprobe"]} and cal["recall"] == within[0]["recall"]
    assert within[0]["nprobe"] < 256, cal["curve"]  # the curve levels off before every list
    assert "no nprobe reaches recall@10 0.990" in caplog.text and f"nprobe {within[0]['nprobe']}" in caplog.text


def test_calibrate_cli_measures_on_given_query_vectors_or_texts(calibrated, fake_encoder, tmp_path):
    """``--queries-file``: a .npy of query vectors (no row left out: the truth is the exact
    top 10 over every row), or a text file encoded with the index's encoder."""
    from drgym.cli import app

    folder = calibrated.folder
    m = IndexManifest.read(folder)
    held = clustered_rows(200, seed=11)
    np.save(tmp_path / "held.npy", held)
    r = CliRunner().invoke(app, ["index", "calibrate", str(folder), "--queries-file", str(tmp_path / "held.npy")])
    assert r.exit_code == 0, r.output
    cal = IndexManifest.read(folder).calibration
    assert cal["query_source"] == "given" and cal["queries"] == 200 and cal["query_file"].endswith("held.npy")
    assert "on 200 given queries" in r.output
    emb = np.concatenate([np.load(folder / s.embeddings).astype(np.float32) for s in m.shards])
    truth = np.argsort(-(held @ emb.T), axis=1, kind="stable")[:, :10]
    dense = DenseIndex(folder, m.shards, m.dim, m.n_passages, search_params={"nprobe": cal["search_params"]["nprobe"]})
    found = dense.search(held, 11)[1][:, :10]  # the top 11 then cut: as calibrate reads it
    dense.close()
    hits = [len(set(t.tolist()) & set(f.tolist())) / 10 for t, f in zip(truth, found)]
    assert np.mean(hits) == pytest.approx(cal["recall"], abs=1e-4) and cal["recall_low"] >= TARGET_RECALL
    (tmp_path / "questions.txt").write_text("\n".join(f"q{i}" for i in range(40)) + "\n\n")
    r = CliRunner().invoke(app, ["index", "calibrate", str(folder), "--queries-file", str(tmp_path / "questions.txt")])
    assert r.exit_code in (0, 1), r.output  # 40 random table vectors may not clear the bound
    cal = IndexManifest.read(folder).calibration
    assert cal["query_source"] == "given" and cal["queries"] == 40
    (tmp_path / "empty.txt").write_text("\n")
    r = CliRunner().invoke(app, ["index", "calibrate", str(folder), "--queries-file", str(tmp_path / "empty.txt")])
    assert r.exit_code == 2 and "holds no queries" in r.output
    np.save(tmp_path / "narrow.npy", held[:, :8])
    r = CliRunner().invoke(app, ["index", "calibrate", str(folder), "--queries-file", str(tmp_path / "narrow.npy")])
    assert r.exit_code == 2 and "calibration queries must have shape (n >= 2, 32), got (200, 8)" in r.output
    assert IndexManifest.read(folder).calibration == cal  # refused runs write nothing
