"""drgym on Ray (``pip install 'drgym[distributed]'``): the Ray Data build equals the local
build, and the Ray Serve router over 2 shard applications answers as the single-process
server, with a flagged partial answer when a shard is down.

Both tests start a local Ray cluster (about 15 s, then 1-3 min of deployments and
encoding on 2 busy cores), so they are marked slow; without Ray they skip."""

from __future__ import annotations

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'drgym[distributed]')")

from drgym.corpus import load_named_corpus  # noqa: E402
from drgym.index.build import IndexSpec, build_index, get_encoder  # noqa: E402
from drgym.index.dense import DenseIndex  # noqa: E402
from drgym.search.local import LocalSearchEngine  # noqa: E402
from drgym.search.wire import decode_b64_json  # noqa: E402

from ray_cluster import HOTPOT_QUESTIONS  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def encoder():
    return get_encoder("all-MiniLM-L6-v2", "cpu")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
    yield
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def test_ray_data_build_equals_local_build(tmp_path, encoder, ray_cluster):
    """60 real 2Wiki paragraphs without titles (not in the shipped cache, so encoded live:
    once in this process, once in Ray actors with one torch thread each), 3 units, 3
    shards: the two index folders hold the same bytes (embeddings, FAISS, BM25, tie
    ranks) and the same docstore rows."""
    from drgym.distributed.build import RayRunner
    from test_index_scale import assert_same_index, untitled_corpus

    corpus = untitled_corpus(tmp_path / "untitled.jsonl", 60)
    spec = IndexSpec(corpus=str(corpus), factory="Flat", name="untitled", chunk_docs=20, shard_size=25)
    local = build_index(spec, root=tmp_path / "local", encoder=encoder)
    runner = RayRunner(encoder_actors=2)
    distributed = build_index(spec, root=tmp_path / "ray", encoder=encoder, runner=runner)
    m = distributed.manifest
    assert m.timings["passages_encoded_live"] == local.manifest.timings["passages_encoded_live"] > 50
    assert len(m.shards) == 3
    assert_same_index(local.folder, distributed.folder)


def test_cli_index_build_with_ray_on_a_named_corpus(tmp_path, encoder, ray_cluster):
    """``drgym index build --ray`` joins the running cluster; the HotpotQA corpus (named,
    read by name in the actors, vectors from the shipped cache) gives the local index."""
    from typer.testing import CliRunner

    from drgym.cli import app
    from test_index_scale import assert_same_index

    args = ["index", "build", "--corpus", "hotpotqa", "--no-bm25", "--chunk-docs", "400"]
    res = CliRunner().invoke(app, [*args, "--ray", "--root", str(tmp_path / "ray")])
    assert res.exit_code == 0, res.output
    assert "built: 994 documents" in res.output and ray.is_initialized()  # the test's cluster stays up
    local = build_index(IndexSpec(corpus="hotpotqa", bm25=False, chunk_docs=400), root=tmp_path / "local", encoder=encoder)
    assert_same_index(local.folder, tmp_path / "ray" / local.folder.name)


def test_ray_serve_router_with_two_shards(tmp_path, encoder, ray_cluster):
    from ray import serve

    from drgym.distributed.serve import deploy, load_config, shard_app_names
    from server_helpers import free_port, running_server

    res = build_index(IndexSpec(corpus="hotpotqa", shard_size=600), root=tmp_path, encoder=encoder)
    assert len(res.manifest.shards) == 2
    one = {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.5}}
    cfg = load_config(overrides={"router": {"deployment": one}, "shard": {"deployment": one}, "shard_timeout_s": 5})
    assert "autoscaling_config" not in cfg["shard"]["deployment"]
    url = deploy(res.folder, cfg, port=free_port())
    single = LocalSearchEngine(res.folder, method="hybrid", encoder=encoder)
    with running_server(single) as srv:
        for q in HOTPOT_QUESTIONS:
            for method_url in ("/search", "/fineweb/search"):
                params = {"query": q, "k": 10, "with_distance": True}
                a = httpx.get(srv.url + method_url, params=params).json()
                b = httpx.get(url + method_url, params=params, timeout=120).json()
                assert a == b and len(b["results"]) == 10
        body = {"queries": HOTPOT_QUESTIONS, "topk": 5, "return_scores": True}
        a, b = httpx.post(srv.url + "/retrieve", json=body).json(), httpx.post(url + "/retrieve", json=body, timeout=120).json()
        assert a == b and "partial" not in b
        fetched = httpx.get(url + "/fetch", params={"url": "https://en.wikipedia.org/wiki/Lilu_(mythology)"}, timeout=60)
        assert fetched.json() == httpx.get(srv.url + "/fetch", params={"url": "https://en.wikipedia.org/wiki/Lilu_(mythology)"}).json()
        health = httpx.get(url + "/health").json()
        assert health["backend"] == "sharded" and "shards=2" in health["index"]

        # Shard 1 down: 200, flagged partial, and exactly the ranking of the single engine
        # whose dense search sees shard 0 only (BM25 and the docstore live in the router).
        serve.delete(shard_app_names(res.folder, cfg)[1])
        m = res.manifest
        expected = LocalSearchEngine(res.folder, method="hybrid", encoder=encoder)
        expected._shared._dense = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, shard_ids=[0])
        docs = load_named_corpus("hotpotqa")
        in_shard1 = [d.text.split(". ")[0] for d in (docs[700], docs[900])]  # passages of rows >= 600
        for q in in_shard1:  # not asked before: no cache hit
            r = httpx.get(url + "/search", params={"query": q, "k": 5, "with_distance": True}, timeout=120)
            assert r.status_code == 200 and r.json()["partial"] == {"missing_shards": [1], "shards": 2}
            got = [(decode_b64_json(x)["id"], d) for x, d in zip(r.json()["results"], r.json()["distances"])]
            assert got == [(h.doc_id, h.score) for h in expected.search(q, 5)]
            full = [(h.doc_id, h.score) for h in single.search(q, 5)]
            assert got != full and full[0][0] not in {i for i, _ in got}  # the best passage lived in shard 1
        rr = httpx.post(url + "/retrieve", json={"queries": ["Teutberga queen", "Gallu"], "topk": 3}, timeout=120)
        assert rr.status_code == 200 and rr.json()["partial"] == {"missing_shards": [1], "shards": 2}
        assert [[h["id"] for h in hs] for hs in rr.json()["result"]] == \
            [[h.doc_id for h in hs] for hs in expected.search_batch(["Teutberga queen", "Gallu"], 3)]
