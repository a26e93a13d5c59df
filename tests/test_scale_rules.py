"""Rules that must hold for every server of an index: imported ids kept as they are, one
search-parameter rule (library, ``drgym serve``, ``drgym serve-ray`` shards), a default
``serve-ray`` config that fits 2 cores, and the GPU sharding options reaching FAISS.

Tiny random-vector indexes (dim 32) imported with :func:`drgym.index.importer.import_index`
and a fake query encoder (a lookup table), so nothing here loads a model; Ray Serve is
not started (its shard class and router engine are called directly), except in the one
slow test that needs Ray installed."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from drgym.errors import ConfigError
from drgym.index.importer import import_index
from drgym.search.local import LocalSearchEngine

DIM = 32
ENCODER = "fake-enc"  # not on this machine: the manifest records revision "unknown"


class TableEncoder:
    """A query encoder that looks queries up in a table of unit vectors (``"q<i>"`` is row i)."""

    name, revision, dim, max_length = ENCODER, "table", DIM, 0

    def __init__(self, table: np.ndarray) -> None:
        self.table = np.asarray(table, dtype=np.float32)

    def encode_queries(self, queries: list[str], *, threads: int | None = None) -> np.ndarray:
        return np.stack([self.table[int(q[1:]) % len(self.table)] if q.startswith("q") and q[1:].isdigit()
                         else self.table[0] for q in queries])


def unit_rows(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_corpus(path, ids: list[str]) -> None:
    """A Search-R1 style wiki-18 JSONL corpus: ``{"id", "contents": '"Title"\\ntext'}``."""
    path.write_text("".join(json.dumps({"id": i, "contents": f'"Title {i}"\npassage number {i} about topic {i}'}) + "\n"
                            for i in ids))


@pytest.fixture
def fake_encoder(monkeypatch):
    """Make the manifest's encoder name load the table encoder (as the server loads it)."""
    import drgym.index.build as build

    enc = TableEncoder(unit_rows(64, seed=7))
    real = build.get_encoder
    monkeypatch.setattr(build, "get_encoder", lambda name="", device=None, backend="torch":
                        enc if name == ENCODER else real(name, device, backend))
    return enc


@pytest.fixture
def split_small(monkeypatch):
    """Let the tiny indexes here split a query into probe groups (a group's minimum of codes
    to scan is 1.5x10^6 in drgym, far more than these hold)."""
    import drgym.index.dense as dense

    monkeypatch.setattr(dense, "PROBE_GROUP_MIN_CODES", 1)


def ranking(hit_lists):
    return [[(h.doc_id, round(h.score, 6)) for h in hits] for hits in hit_lists]


# -- 1. imported ids are kept ---------------------------------------------------------------


def test_import_keeps_the_corpus_ids_in_retrieve_and_search(tmp_path, fake_encoder):
    """Search-R1 passage ids ("0", "17", ...) come back unchanged from /retrieve and
    /search; --id-prefix namespaces them. (Before: every id became "wiki18-<id>".)"""
    from drgym.search.wire import ServerSettings, decode_b64_json
    from server_helpers import running_server

    ids = [str(i) for i in (0, 17, 3, 250, 9, 42)]
    write_corpus(tmp_path / "wiki-18.jsonl", ids)
    vecs = fake_encoder.table[: len(ids)]  # query "q<i>" is exactly passage i's vector
    np.save(tmp_path / "emb.npy", vecs)
    res = import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                       factory="Flat", root=tmp_path / "idx", bm25=False)
    assert res.manifest.chunking["id_prefix"] == ""
    eng = LocalSearchEngine(res.folder, method="dense", collapse="passage")
    assert [eng.search(f"q{i}", 1)[0].doc_id for i in range(len(ids))] == ids
    assert eng.get("250").title == "Title 250"
    with running_server(eng, settings=ServerSettings(index_dir=str(res.folder), method="dense")) as srv:
        r = httpx.post(srv.url + "/retrieve", json={"queries": ["q1", "q3"], "topk": 2}, timeout=30).json()
        assert [hs[0]["id"] for hs in r["result"]] == ["17", "250"]
        s = httpx.get(srv.url + "/search", params={"query": "q4", "k": 1}, timeout=30).json()
        assert decode_b64_json(s["results"][0])["id"] == "9"
    eng.close()

    pre = import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                       factory="Flat", root=tmp_path / "idx", bm25=False, id_prefix="wiki18-", name="prefixed")
    eng = LocalSearchEngine(pre.folder, method="dense", collapse="passage")
    assert eng.search("q1", 1)[0].doc_id == "wiki18-17"
    eng.close()


def test_id_prefix_cli_option_and_formats_without_row_ids(tmp_path, fake_encoder):
    from typer.testing import CliRunner

    from drgym.cli import app
    from drgym.docstore import DocStore

    write_corpus(tmp_path / "c.jsonl", ["a1", "b2"])
    np.save(tmp_path / "emb.npy", fake_encoder.table[:2])
    out = CliRunner().invoke(app, ["index", "import", str(tmp_path / "c.jsonl"), "--embeddings", str(tmp_path / "emb.npy"),
                                   "--encoder", ENCODER, "--factory", "Flat", "--no-bm25", "--root", str(tmp_path / "idx"),
                                   "--name", "ns", "--id-prefix", "sr1:"])
    assert out.exit_code == 0, out.output
    assert DocStore(tmp_path / "idx" / "ns" / "docs.sqlite").get("sr1:b2").title == "Title b2"
    ovos = tmp_path / "ovos.json"  # an ovos corpus has no row ids: a prefix is refused
    ovos.write_text(json.dumps([{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]))
    with pytest.raises(ConfigError, match="--id-prefix applies to wiki18 and web corpora"):
        import_index(ovos, format="ovos", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER, factory="Flat",
                     root=tmp_path / "idx2", bm25=False, id_prefix="x-")


# -- 2. one nprobe rule -----------------------------------------------------------------------


class _Call:
    def __init__(self, value) -> None:
        self.value = value

    def result(self, timeout_s=None):
        return self.value


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return _Call(self.fn(*args))


class LocalHandle:
    """Stands in for a Ray Serve handle of a ShardServer: ``.search.remote(q, k).result()``."""

    def __init__(self, server) -> None:
        self.search = _Method(server.search)


def ray_router(folder, n_shards: int):
    """``drgym serve-ray``'s code over an index without Ray: a ShardServer a shard with the
    default config, and the router engine over them (dense, passage results)."""
    from drgym.distributed.serve import ShardedSearchEngine, ShardServer, load_config

    cfg = load_config()["shard"]
    shards = [ShardServer(str(folder), i, cfg.get("search_params"), bool(cfg.get("mmap", True)))
              for i in range(n_shards)]
    return shards, ShardedSearchEngine(folder, [LocalHandle(s) for s in shards], method="dense", collapse="passage")


def import_random(tmp_path, n: int, seed: int, factory: str, shard_size: int):
    """``n`` random unit vectors (ids ``"0"``...) imported as a wiki-18 corpus into ``tmp_path / "idx"``,
    not calibrated (IVF shards probe :func:`~drgym.index.search_params.auto_nprobe`'s quarter of the lists;
    tests/test_calibrate.py covers calibrated indexes)."""
    write_corpus(tmp_path / "wiki-18.jsonl", [str(i) for i in range(n)])
    np.save(tmp_path / "emb.npy", unit_rows(n, seed=seed))
    return import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                        factory=factory, shard_size=shard_size, root=tmp_path / "idx", bm25=False, target_recall=None)


@pytest.fixture
def ivf_index(tmp_path):
    """2,000 random unit vectors, 2 shards of IVF512,Flat: drgym's rule probes 32 lists."""
    return import_random(tmp_path, 2000, 1, "IVF512,Flat", shard_size=1000)


def test_library_serve_and_ray_shards_probe_alike(ivf_index, fake_encoder, split_small):
    """The library engine, the engine ``drgym serve`` loads and the ``drgym serve-ray``
    router over its ShardServer code (default config) give the same rankings, all with
    nprobe max(16, 512/4) = 128."""
    from drgym.cli.serve import load_backend
    from drgym.index.dense import DenseIndex
    from drgym.search.wire import ServerSettings

    folder = ivf_index.folder
    queries = [f"q{i}" for i in range(20)]
    lib = LocalSearchEngine(folder, method="dense", collapse="passage")
    served = load_backend(ServerSettings(index_dir=str(folder), method="dense", collapse="passage"))
    shards, ray_engine = ray_router(folder, 2)
    want_params = {"nprobe": 128, "rerank": 100, "probe_groups": 4}
    assert lib._shared.dense.shard_params == [want_params] * 2
    assert [s.dense.shard_params[0] for s in shards] == [want_params] * 2
    assert lib._shared.dense._groups(0) == shards[0].dense._groups(0) == 2  # ceil(4 / 2 shards), also alone
    want = ranking(lib.search_batch(queries, 10))
    assert ranking(served.search_batch(queries, 10)) == want
    assert ranking(ray_engine.search_batch(queries, 10)) == want
    mapped = LocalSearchEngine(folder, method="dense", collapse="passage", mmap=True)  # IVF lists memory-mapped
    assert ranking(mapped.search_batch(queries, 10)) == want
    mapped.close()
    # the rule matters here: 16 probes rank otherwise
    m = ivf_index.manifest
    d16 = DenseIndex(folder, m.shards, m.dim, m.n_passages, search_params={"nprobe": 16})
    qv = fake_encoder.encode_queries(queries)
    assert not np.array_equal(d16.search(qv, 10)[1], lib._shared.dense.search(qv, 10)[1])
    for e in (lib, served, ray_engine):
        e.close()


def test_rerank_is_split_between_shards_alike_in_library_and_ray_shards(tmp_path, fake_encoder, split_small):
    """``rerank`` counts the candidates re-scored per query across the index: three lossy
    shards of 1,000 rows re-rank ceil(100 / 3) = 34 each (FAISS is asked for 34), a
    ``drgym serve-ray`` shard server, which loads one shard, splits alike, and the library
    and the Ray router then rank alike. With the default 4 probe groups each shard's lists
    are searched in ceil(4 / 3) = 2 groups, each a share of ceil(100 / 6) = 17, raised to
    k + 16 = 26."""
    from drgym.distributed.serve import ShardedSearchEngine, ShardServer
    from drgym.index.dense import DenseIndex
    from drgym.index.search_params import rerank_depth

    res = import_random(tmp_path, 3000, 5, "IVF32,PQ8x4fs", shard_size=1000)
    folder, m = res.folder, res.manifest
    assert len(m.shards) == 3
    lib = LocalSearchEngine(folder, method="dense", collapse="passage", search_params={"probe_groups": 1})
    dense = lib._shared.dense
    asked = []
    for idx in dense._indexes:
        real = idx.search_preassigned  # drgym assigns the queries to lists itself (coarse_assign)
        idx.search_preassigned = lambda q, kk, *a, _real=real: (asked.append(kk), _real(q, kk, *a))[1]
    queries = [f"q{i}" for i in range(12)]
    want = ranking(lib.search_batch(queries, 10))
    assert asked and set(asked) == {34}
    assert [rerank_depth(100, s.count, m.n_passages, 10) for s in m.shards] == [34, 34, 34]
    shards, ray_engine = ray_router(folder, 3)  # the default config: 4 probe groups
    assert [(s.dense._groups(0), s.dense._depth(0, 10)) for s in shards] == [(2, 26)] * 3
    grouped = LocalSearchEngine(folder, method="dense", collapse="passage")
    assert ranking(ray_engine.search_batch(queries, 10)) == ranking(grouped.search_batch(queries, 10))
    alike = [ShardServer(str(folder), i, {"probe_groups": 1}) for i in range(3)]
    assert [s.dense._depth(0, 10) for s in alike] == [34, 34, 34]
    one_group = ShardedSearchEngine(folder, [LocalHandle(s) for s in alike], method="dense", collapse="passage")
    assert ranking(one_group.search_batch(queries, 10)) == want
    # the old per-shard depth (100 a shard) is rerank=300 in all; k larger than a shard's share wins
    wide = DenseIndex(folder, m.shards, m.dim, m.n_passages, search_params={"rerank": 300, "probe_groups": 1})
    assert [wide._depth(i, 10) for i in range(3)] == [100] * 3 and [dense._depth(i, 60) for i in range(3)] == [76] * 3
    for e in (lib, ray_engine, grouped, one_group):
        e.close()


def test_shards_of_an_ivf_index_share_one_trained_quantizer_and_one_coarse_search(tmp_path, fake_encoder):
    """Three IVF-PQ shards are clones of one trained index (``dense/trained.index``): the
    same centroids, so a query is assigned to lists once for all of them; the rows and
    scores are those FAISS gives when each shard assigns the query itself, and a
    ``drgym serve-ray`` shard server, which loads one shard, probes the same lists."""
    import faiss

    from drgym.index.dense import DenseIndex
    from drgym.index.faiss_build import TRAINED_FILE

    res = import_random(tmp_path, 3000, 11, "IVF64,PQ8x4fs", shard_size=1000)
    folder, m = res.folder, res.manifest
    assert len(m.shards) == 3 and TRAINED_FILE in m.files
    def centroids(path):
        index = faiss.read_index(str(path))  # kept alive while its quantizer is read
        quantizer = faiss.downcast_index(faiss.extract_index_ivf(index).quantizer)
        return faiss.rev_swig_ptr(quantizer.get_xb(), 64 * DIM).copy()

    want_c = centroids(folder / TRAINED_FILE)
    for s in m.shards:
        np.testing.assert_array_equal(centroids(folder / s.faiss), want_c)
    one = {"probe_groups": 1}  # FAISS's own assignment knows no probe groups
    dense = DenseIndex(folder, m.shards, m.dim, m.n_passages, device="cpu", search_params=one)
    assert dense.coarse_searches == 1 and dense.shard_params[0]["nprobe"] == 16
    alone = DenseIndex(folder, m.shards, m.dim, m.n_passages, device="cpu", search_params=one)
    alone._coarse_of = [None] * 3  # each shard's FAISS search assigns its queries itself
    for q in (unit_rows(1, seed=12), unit_rows(40, seed=13)):
        S0, R0 = dense.search(q, 10)
        S1, R1 = alone.search(q, 10)
        np.testing.assert_array_equal(R0, R1)
        np.testing.assert_array_equal(S0, S1)
    shards, ray_engine = ray_router(folder, 3)
    assert [s.dense.coarse_searches for s in shards] == [1, 1, 1]
    lib = LocalSearchEngine(folder, method="dense", collapse="passage")
    queries = [f"q{i}" for i in range(16)]
    assert ranking(ray_engine.search_batch(queries, 10)) == ranking(lib.search_batch(queries, 10))
    for e in (lib, ray_engine, dense, alone):
        e.close()


def test_shards_trained_alone_are_assigned_one_by_one(tmp_path):
    """An index whose shards were each trained on their own rows (built before the shards
    shared a quantizer) loads and searches: one coarse search a shard, with the rows and
    scores FAISS gives when each shard assigns the queries itself."""
    from drgym.index.build import ShardTask
    from drgym.index.dense import DenseIndex
    from drgym.index.ranking import write_tie_rank

    np.save(tmp_path / "emb.npy", unit_rows(3000, seed=17).astype(np.float16))
    parts = [(str(tmp_path / "emb.npy"), 0, 3000)]
    shards = [ShardTask(str(tmp_path), no, s, 1000, parts, DIM, "IVF64,PQ8x4fs").run()
              for no, s in enumerate(range(0, 3000, 1000))]
    write_tie_rank(tmp_path, range(3000), 3000)
    one = {"probe_groups": 1}  # FAISS's own assignment knows no probe groups
    dense = DenseIndex(tmp_path, shards, DIM, 3000, device="cpu", search_params=one)
    alone = DenseIndex(tmp_path, shards, DIM, 3000, device="cpu", search_params=one)
    alone._coarse_of = [None] * 3
    assert dense.coarse_searches == 3
    q = unit_rows(30, seed=18)
    for a, b in zip(dense.search(q, 10), alone.search(q, 10)):
        np.testing.assert_array_equal(a, b)
    dense.close()
    alone.close()


def test_one_shard_or_an_untrained_factory_writes_no_trained_index(tmp_path):
    """A one-shard IVF index trains on its own rows, and a Flat index needs no training:
    neither writes ``dense/trained.index``; a several-shard build reuses the file a killed
    build left (the resume), and refuses one that is not an empty trained index."""
    from drgym.errors import CorruptIndexError
    from drgym.index.build import shard_tasks
    from drgym.index.faiss_build import TRAINED_FILE, build_faiss

    np.save(tmp_path / "emb.npy", unit_rows(3000, seed=14).astype(np.float16))
    parts = [(str(tmp_path / "emb.npy"), 0, 3000)]
    assert [t.trained for t in shard_tasks(tmp_path / "a", 3000, 5000, parts, DIM, "IVF64,PQ8x4fs")] == [""]
    assert [t.trained for t in shard_tasks(tmp_path / "b", 3000, 1000, parts, DIM, "Flat")] == ["", "", ""]
    assert not (tmp_path / "a" / TRAINED_FILE).exists() and not (tmp_path / "b" / TRAINED_FILE).exists()
    tasks = shard_tasks(tmp_path / "c", 3000, 1000, parts, DIM, "IVF64,PQ8x4fs")
    assert {t.trained for t in tasks} == {TRAINED_FILE}
    mtime = (tmp_path / "c" / TRAINED_FILE).stat().st_mtime_ns
    shard_tasks(tmp_path / "c", 3000, 1000, parts, DIM, "IVF64,PQ8x4fs")
    assert (tmp_path / "c" / TRAINED_FILE).stat().st_mtime_ns == mtime
    tasks[0].run()
    with pytest.raises(CorruptIndexError, match="not an empty trained index"):
        build_faiss(unit_rows(10, seed=1), "IVF64,PQ8x4fs", tmp_path / "c" / "dense" / "faiss-00000.index")


def test_training_sample_of_bad_parts_is_refused_by_name(tmp_path):
    """The shared training sample reads every part: a part of another shape than announced,
    or parts that do not cover the sample's rows, raise CorruptIndexError naming them."""
    from drgym.errors import CorruptIndexError
    from drgym.index.rows import read_rows

    np.save(tmp_path / "a.npy", unit_rows(100, seed=19).astype(np.float16))
    rows = np.array([3, 50, 99], dtype=np.int64)
    got = read_rows([(str(tmp_path / "a.npy"), 0, 100)], rows, DIM)
    np.testing.assert_array_equal(got, unit_rows(100, seed=19).astype(np.float16)[rows].astype(np.float32))
    with pytest.raises(CorruptIndexError, match=r"a\.npy has shape \(100, 32\), expected \(120, 32\)"):
        read_rows([(str(tmp_path / "a.npy"), 0, 120)], rows, DIM)
    with pytest.raises(CorruptIndexError, match="cover 2 of the 3"):
        read_rows([(str(tmp_path / "a.npy"), 0, 100)], np.array([3, 50, 150]), DIM)


def test_coarse_assign_probes_the_lists_faiss_probes():
    """:func:`coarse_assign` picks the lists FAISS's flat inner-product quantizer picks, in
    its order, with the same inner products, and the same lists for a query alone and in a
    batch."""
    import faiss

    from drgym.index.ranking import coarse_assign

    c = unit_rows(500, seed=15)
    quantizer = faiss.IndexFlatIP(DIM)
    quantizer.add(c)
    q = unit_rows(30, seed=16)
    D, I = coarse_assign(c, q, 40)
    D0, I0 = quantizer.search(q, 40)
    np.testing.assert_array_equal(I, I0)
    np.testing.assert_allclose(D, D0, rtol=1e-5)
    for j in (0, 17):  # a query probes the same lists alone and in a batch
        np.testing.assert_array_equal(coarse_assign(c, q[j:j + 1], 40)[1][0], I[j])
    D, I = coarse_assign(c, q[:1], 500)
    assert sorted(I[0].tolist()) == list(range(500)) and (np.diff(D[0]) <= 0).all()


def test_search_params_for_fits_each_index_type():
    import faiss

    from drgym.index.search_params import search_params_for

    ip = faiss.METRIC_INNER_PRODUCT
    assert search_params_for(faiss.index_factory(8, "IVF4096,Flat", ip)) == {"nprobe": 1024, "rerank": 100,
                                                                             "probe_groups": 4}
    assert search_params_for(faiss.index_factory(8, "IVF64,Flat", ip), {"nprobe": 500}) == {
        "nprobe": 64, "rerank": 100, "probe_groups": 4}
    assert search_params_for(faiss.index_factory(8, "IVF64,Flat", ip), {"nprobe": 2, "probe_groups": 0}) == {
        "nprobe": 2, "rerank": 100, "probe_groups": 1}  # 0 is one group
    assert search_params_for(faiss.index_factory(8, "IVF64,Flat", ip), {"nprobe": 2, "probe_groups": 9}) == {
        "nprobe": 2, "rerank": 100, "probe_groups": 2}  # at most a list a group
    assert search_params_for(faiss.index_factory(8, "HNSW32", ip), {"rerank": 0}) == {"efSearch": 64, "rerank": 0}
    assert search_params_for(faiss.index_factory(8, "Flat", ip)) == {"rerank": 100}
    with pytest.raises(ConfigError, match="nprobe must be an integer >= 0, got -1"):
        search_params_for(faiss.index_factory(8, "Flat", ip), {"nprobe": -1})


def spy_probes(dense):
    """Record the list numbers of every FAISS ``search_preassigned`` call of ``dense``'s shards."""
    calls = []
    for idx in dense._indexes:
        real = idx.search_preassigned
        idx.search_preassigned = lambda q, kk, Iq, Dq, _real=real: (calls.append(Iq.copy()), _real(q, kk, Iq, Dq))[1]
    return calls


def test_probe_groups_scan_every_probed_list_once(tmp_path, split_small):
    """One IVF shard of exact codes (IVF64,Flat, nprobe 16): with 4 probe groups a query
    makes 4 FAISS calls whose lists are the 16 probed lists dealt round-robin, each once,
    and the top 10 is the one-group search's, rows and scores."""
    from drgym.index.dense import DenseIndex
    from drgym.index.ranking import coarse_assign

    res = import_random(tmp_path, 2000, 21, "IVF64,Flat", shard_size=2000)
    m = res.manifest
    assert len(m.shards) == 1
    one = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu", search_params={"probe_groups": 1})
    four = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu")
    assert four.shard_params[0]["nprobe"] == 16 and four._groups(0) == 4
    calls = spy_probes(four)
    q = unit_rows(1, seed=22)
    S1, R1 = one.search(q, 10)
    S4, R4 = four.search(q, 10)
    np.testing.assert_array_equal(R4, R1)
    np.testing.assert_array_equal(S4, S1)
    lists = coarse_assign(four._coarse[0][0], q, 16)[1][0]
    assert len(calls) == 4
    assert sorted(int(x) for c in calls for x in c[0] if x >= 0) == sorted(lists.tolist())
    assert sorted(tuple(c[0][c[0] >= 0].tolist()) for c in calls) == sorted(tuple(lists[g::4].tolist()) for g in range(4))
    for q in (unit_rows(7, seed=23), unit_rows(45, seed=24)):  # the pool's path and FAISS's batch path
        for a, b in zip(four.search(q, 10), one.search(q, 10)):
            np.testing.assert_array_equal(a, b)
    one.close()
    four.close()


def test_probe_groups_rank_alike_alone_in_any_batch_and_on_any_threads(tmp_path, split_small):
    """One fast-scan IVF-PQ shard in 4 probe groups (lossy codes, so the groups' candidates
    differ from one search's): a query ranks alike alone, in a small batch (the groups on
    the shard threads), in a large batch (FAISS's threads), with one shard thread or four,
    and as a ``drgym serve-ray`` shard server ranks it; the default shard threads are the
    jobs of a query, at most the usable cores."""
    from drgym.cpu import thread_count
    from drgym.index.dense import SMALL_BATCH, DenseIndex

    res = import_random(tmp_path, 3000, 25, "IVF32,PQ8x4fs", shard_size=3000)
    m = res.manifest
    q = unit_rows(SMALL_BATCH + 10, seed=26)
    dense = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu")
    assert dense._groups(0) == 4 and dense.shard_workers == min(4, thread_count())
    turn = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu", shard_workers=1)
    wide = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu", shard_workers=4)
    S, R = dense.search(q, 10)
    for idx in (dense, turn, wide):
        alone = [idx.search(q[i:i + 1], 10) for i in range(len(q))]
        np.testing.assert_array_equal(np.concatenate([r for _, r in alone]), R)
        np.testing.assert_array_equal(np.concatenate([s for s, _ in alone]), S)
        for a, b in zip(idx.search(q[:5], 10), (S[:5], R[:5])):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(idx.search(q, 10, threads=1)[1], R)
    one = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu", search_params={"probe_groups": 1})
    assert not np.array_equal(one.search(q, 10)[1], R) or not np.array_equal(one.search(q, 10)[0], S)
    from drgym.distributed.serve import ShardServer

    server = ShardServer(str(res.folder), 0)
    assert server.dense._groups(0) == 4
    np.testing.assert_array_equal(server.dense.search(q, 10)[1], R)
    for idx in (dense, turn, wide, one, server.dense):
        idx.close()


def test_a_probe_group_scans_at_least_its_minimum_of_codes(tmp_path, monkeypatch):
    """A query is split only where each group scans PROBE_GROUP_MIN_CODES codes: 2,000 rows,
    IVF64 and nprobe 16 scan 500 codes a query, so with drgym's 1.5x10^6 the shard is one group,
    with a minimum of 300 one (500 // 300), of 150 two (three, down to a power of two), of
    100 the four asked for; the split is cut to nprobe (the division between shards: the
    probe-alike test above)."""
    import drgym.index.dense as dense_mod
    from drgym.index.dense import DenseIndex

    res = import_random(tmp_path, 2000, 27, "IVF64,Flat", shard_size=2000)
    m = res.manifest

    def groups(minimum=None, **params):
        if minimum is not None:
            monkeypatch.setattr(dense_mod, "PROBE_GROUP_MIN_CODES", minimum)
        d = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu", search_params=params)
        d.close()
        return d._groups(0)

    assert groups() == 1
    assert [groups(300), groups(150), groups(100), groups(1)] == [1, 2, 4, 4]
    assert groups(1, nprobe=2) == 2 and groups(1, probe_groups=1) == 1 and groups(1, probe_groups=64) == 16
    assert groups(1, probe_groups=3) == 2 and groups(1, nprobe=7, probe_groups=8) == 4  # powers of two


# -- 3. serve-ray on 2 cores ------------------------------------------------------------------


def test_default_serve_ray_config_fits_two_cpus():
    """Router + 2 shards at their minimum replicas reserve 1.5 CPUs (before: 3, and the
    router sat pending on a 2-core machine); a config that cannot start is refused."""
    from drgym.distributed.serve import check_fits, load_config

    cfg = load_config()
    assert check_fits(cfg, 2, {"CPU": 2.0}) == {"CPU": 1.5, "GPU": 0.0}
    assert check_fits(cfg, 3, {"CPU": 2.0})["CPU"] == 2.0
    with pytest.raises(ConfigError, match=r"reserve 2\.5 CPUs, the Ray cluster has 2"):
        check_fits(cfg, 4, {"CPU": 2.0})
    gpu = load_config(overrides={"shard": {"deployment": {"ray_actor_options": {"num_gpus": 1}}}})
    with pytest.raises(ConfigError, match="reserve 2 GPUs, the Ray cluster has 0"):
        check_fits(gpu, 2, {"CPU": 8.0})
    fixed = load_config(overrides={"shard": {"deployment": {"num_replicas": 2}}})
    assert check_fits(fixed, 2, {"CPU": 4.0})["CPU"] == 0.5 + 2 * 2 * 0.5


def test_serve_ray_num_cpus_with_a_cluster_address_is_refused():
    from typer.testing import CliRunner

    from drgym.cli import app

    out = CliRunner().invoke(app, ["serve-ray", "--index-dir", "x", "--num-cpus", "2", "--ray-address", "auto"])
    assert out.exit_code == 2
    assert "--num-cpus sets the CPUs of a local cluster started here" in out.output


@pytest.mark.slow
def test_serve_ray_default_config_starts_on_two_cpus(tmp_path):
    """Needs Ray: the default config (autoscaling, half a CPU a replica) deploys a
    2-shard index on a 2-CPU cluster and answers /health."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'drgym[distributed]')")
    from ray import serve

    from drgym.distributed.serve import deploy
    from drgym.index.build import IndexSpec, build_index, get_encoder
    from server_helpers import free_port

    res = build_index(IndexSpec(corpus="hotpotqa", shard_size=600), root=tmp_path,
                      encoder=get_encoder("all-MiniLM-L6-v2", "cpu"))
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
    try:
        url = deploy(res.folder, port=free_port())
        health = httpx.get(url + "/health", timeout=60).json()
        assert health["backend"] == "sharded" and "shards=2" in health["index"]
    finally:
        serve.shutdown()
        ray.shutdown()


# -- 4. GPU sharding in float16 ---------------------------------------------------------------


@pytest.fixture
def fake_gpu_faiss(monkeypatch):
    """faiss as faiss-gpu on 2 GPUs: index_cpu_to_all_gpus records its calls and returns
    the CPU index (so searches still run)."""
    import faiss

    calls = []

    class Options:
        def __init__(self) -> None:
            self.shard, self.useFloat16 = False, False

    def to_all_gpus(index, co=None, ngpu=-1):
        calls.append({"co": None if co is None else {"shard": co.shard, "useFloat16": co.useFloat16}})
        return index

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2, raising=False)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", Options, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", to_all_gpus, raising=False)
    return calls


@pytest.fixture
def flat_index(tmp_path):
    write_corpus(tmp_path / "wiki-18.jsonl", [str(i) for i in range(300)])
    np.save(tmp_path / "emb.npy", unit_rows(300, seed=3))
    return import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                        factory="Flat", shard_size=150, root=tmp_path / "idx", bm25=False)


def test_gpu_shard_and_float16_reach_faiss(flat_index, fake_encoder, fake_gpu_faiss):
    from drgym.cli.serve import load_backend
    from drgym.search.wire import ServerSettings

    eng = LocalSearchEngine(flat_index.folder, method="dense", gpu_shard=True, gpu_float16=True)
    top = eng.search("q5", 3)
    assert len(top) == 3 and eng._shared.dense.on_gpu
    assert fake_gpu_faiss == [{"co": {"shard": True, "useFloat16": True}}] * 2  # one call per dense shard
    fake_gpu_faiss.clear()
    plain = LocalSearchEngine(flat_index.folder, method="dense")
    assert ranking([plain.search("q5", 3)]) == ranking([top])
    assert fake_gpu_faiss == [{"co": None}] * 2  # default: faiss's full copy per GPU
    fake_gpu_faiss.clear()
    served = load_backend(ServerSettings(index_dir=str(flat_index.folder), method="dense"), gpu_shard=True)
    assert fake_gpu_faiss == [{"co": {"shard": True, "useFloat16": False}}] * 2
    for e in (eng, plain, served):
        e.close()


def test_fast_scan_shards_stay_on_cpu_with_a_gpu(tmp_path, fake_encoder, fake_gpu_faiss, caplog):
    """FAISS's GPU indexes have no fast-scan PQ (``auto``'s codes beyond Flat): such a shard
    is not handed to index_cpu_to_all_gpus, the log says why, and no GPU error is recorded."""
    import logging

    from drgym.index.dense import DenseIndex

    write_corpus(tmp_path / "wiki-18.jsonl", [str(i) for i in range(1000)])
    np.save(tmp_path / "emb.npy", unit_rows(1000, seed=5))
    res = import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                       factory="IVF16,PQ8x4fs", root=tmp_path / "idx", bm25=False)
    fake_gpu_faiss.clear()  # the build may train on the (fake) GPUs; only the search-time move is checked
    m = res.manifest
    with caplog.at_level(logging.INFO, logger="drgym.index.dense"):
        dense = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cuda")
    assert fake_gpu_faiss == [] and not dense.on_gpu and dense.gpu_errors == []
    assert "no GPU fast-scan PQ" in caplog.text
    assert dense.search(unit_rows(2, seed=6), 5)[1].shape == (2, 5)


def test_gpu_options_with_cpu_only_faiss_are_refused(monkeypatch):
    import faiss

    from drgym.index.faiss_build import gpu_cloner_options

    monkeypatch.delattr(faiss, "GpuMultipleClonerOptions", raising=False)
    assert gpu_cloner_options(False, False) is None
    with pytest.raises(ConfigError, match="need faiss with GPU support"):
        gpu_cloner_options(shard=True)


def test_serve_cli_has_the_gpu_options():
    from typer.testing import CliRunner

    from drgym.cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "--gpu-shard" in out.output and "--gpu-float16" in out.output


def test_serve_search_params_reach_the_dense_index(ivf_index, fake_encoder, monkeypatch):
    """``drgym serve --search-params '{"probe_groups": 1, "nprobe": 64}'`` (or
    DRGYM_SEARCH_PARAMS) changes the served index's search parameters; JSON that does not
    parse, or a value that is not an integer, exits 2 naming the problem before loading."""
    from typer.testing import CliRunner

    import drgym.cli.serve as serve_cli
    from drgym.cli import app
    from drgym.search.wire import ServerSettings

    engine = serve_cli.load_backend(ServerSettings(index_dir=str(ivf_index.folder), method="dense",
                                                   search_params={"probe_groups": 1, "nprobe": 64}))
    assert engine._shared.dense.shard_params == [{"nprobe": 64, "rerank": 100, "probe_groups": 1}] * 2
    engine.close()
    monkeypatch.setenv("DRGYM_SEARCH_PARAMS", '{"probe_groups": 2}')
    assert ServerSettings().search_params == {"probe_groups": 2}
    monkeypatch.delenv("DRGYM_SEARCH_PARAMS")
    seen = []
    monkeypatch.setattr(serve_cli, "load_backend", lambda settings, *a, **kw: seen.append(settings) or 1 / 0)
    bad = CliRunner().invoke(app, ["serve", "--index-dir", str(ivf_index.folder), "--search-params", "{probe_groups: 1}"])
    assert bad.exit_code == 2 and "--search-params is not JSON" in bad.output and not seen
    bad = CliRunner().invoke(app, ["serve", "--index-dir", str(ivf_index.folder), "--search-params",
                                   '{"probe_groups": "many"}'])
    assert bad.exit_code == 2 and "search_params.probe_groups" in bad.output and not seen


def test_embedding_shards_are_advised_random_access(ivf_index, monkeypatch, tmp_path):
    """Each memory-mapped float16 shard gets madvise(MADV_RANDOM) at load, so a re-rank's
    page fault reads one page, not the disk's read-ahead window (Linux)."""
    import sys

    import drgym.index.dense as dense_mod
    from drgym.index.dense import DenseIndex
    from drgym.index.rows import advise_random

    seen = []
    monkeypatch.setattr(dense_mod, "advise_random", lambda arr: seen.append(arr) or advise_random(arr))
    m = ivf_index.manifest
    d = DenseIndex(ivf_index.folder, m.shards, m.dim, m.n_passages)
    assert [a.shape for a in seen] == [(s.count, m.dim) for s in m.shards]
    assert all(isinstance(a, np.memmap) and a is e for a, e in zip(seen, d._embeddings))
    d.close()
    np.save(tmp_path / "a.npy", np.zeros((4, 2), dtype=np.float16))
    assert advise_random(np.load(tmp_path / "a.npy", mmap_mode="r")) is sys.platform.startswith("linux")
    assert advise_random(np.zeros((4, 2))) is False  # not memory-mapped: nothing to advise


def test_fast_scan_ivfpq_shards_are_rescored_exactly_and_load_mapped(tmp_path, fake_encoder):
    """The codes ``auto`` picks beyond Flat (4-bit fast-scan PQ, ``PQ{m}x4fs``): a lossy
    index, so the candidates are re-scored from the float16 embeddings; the scores are
    then the exact inner products, the top 10 is mostly the exact top 10, and a
    memory-mapped load ranks alike."""
    from drgym.index.dense import DenseIndex
    from drgym.index.faiss_build import is_lossy

    ids = [str(i) for i in range(3000)]
    write_corpus(tmp_path / "wiki-18.jsonl", ids)
    x = unit_rows(3000, seed=3)
    np.save(tmp_path / "emb.npy", x)
    res = import_index(tmp_path / "wiki-18.jsonl", embeddings=[tmp_path / "emb.npy"], encoder=ENCODER,
                       factory="IVF32,PQ8x4fs", root=tmp_path / "idx", bm25=False)
    m = res.manifest
    dense = DenseIndex(res.folder, m.shards, m.dim, m.n_passages)
    assert dense._lossy == [True]
    assert dense.shard_params == [{"nprobe": 16, "rerank": 100, "probe_groups": 4}]
    q = unit_rows(20, seed=4)
    S, R = dense.search(q, 10)
    stored = np.load(res.folder / m.shards[0].embeddings).astype(np.float32)
    np.testing.assert_allclose(S, np.einsum("qkd,qd->qk", stored[R], q), rtol=1e-5, atol=1e-6)
    exact = np.argsort(-(q @ stored.T), axis=1)[:, :10]

    def recall(rows):
        return np.mean([len(set(rows[i]) & set(exact[i])) / 10 for i in range(len(q))])

    norerank = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, search_params={"rerank": 0})
    S0, R0 = norerank.search(q, 10)
    assert not np.allclose(S0, S)  # 4-bit codes alone score otherwise
    # structureless 32-d random vectors, half the lists probed: the re-rank lifts recall well above the codes'
    assert recall(R) >= 0.7 and recall(R) >= recall(R0) + 0.2, (recall(R), recall(R0))
    mapped = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, mmap=True)
    assert np.array_equal(mapped.search(q, 10)[1], R)
    assert is_lossy(mapped._indexes[0])


def test_dense_search_on_given_threads_ranks_alike_and_restores_faiss_threads(ivf_index):
    """``DenseIndex.search(threads=n)`` gives the same rows and scores as the default rule,
    and leaves the calling thread's FAISS thread count as it was."""
    import faiss

    from drgym.index.dense import SMALL_BATCH, DenseIndex
    from drgym.index.manifest import IndexManifest

    m = IndexManifest.read(ivf_index.folder)
    dense = DenseIndex(ivf_index.folder, m.shards, m.dim, m.n_passages, device="cpu")
    q = unit_rows(SMALL_BATCH + 13, seed=7)
    before = faiss.omp_get_max_threads()
    S0, R0 = dense.search(q, 10)
    S1, R1 = dense.search(q, 10, threads=1)
    assert faiss.omp_get_max_threads() == before
    np.testing.assert_array_equal(R1, R0)
    np.testing.assert_allclose(S1, S0, rtol=1e-6)
    assert (R0 >= 0).all()
    with pytest.raises(ConfigError, match="threads"):
        dense.search(q, 10, threads=0)


def test_shards_searched_side_by_side_rank_as_in_turn(ivf_index):
    """With two shards, a small batch (or ``threads=1``) searches them on the shard threads,
    with the same rows and scores as searching them in turn."""
    from drgym.index.dense import SMALL_BATCH, DenseIndex
    from drgym.index.manifest import IndexManifest

    m = IndexManifest.read(ivf_index.folder)
    assert len(m.shards) == 2
    turn = DenseIndex(ivf_index.folder, m.shards, m.dim, m.n_passages, device="cpu", shard_workers=1)
    side = DenseIndex(ivf_index.folder, m.shards, m.dim, m.n_passages, device="cpu", shard_workers=2)
    try:
        for q, threads in ((unit_rows(1, seed=3), None), (unit_rows(5, seed=4), None),
                           (unit_rows(SMALL_BATCH + 9, seed=5), 1), (unit_rows(SMALL_BATCH + 9, seed=6), None)):
            S0, R0 = turn.search(q, 10, threads=threads)
            S1, R1 = side.search(q, 10, threads=threads)
            np.testing.assert_array_equal(R1, R0)
            np.testing.assert_array_equal(S1, S0)
            assert {int(r) // 1000 for r in R0.ravel()} == {0, 1}  # both shards contribute
        assert turn._pool is None and side._pool is not None
        side.close()
        assert side._pool is None
        np.testing.assert_array_equal(side.search(unit_rows(2, seed=7), 10)[1], turn.search(unit_rows(2, seed=7), 10)[1])
    finally:
        side.close()
    with pytest.raises(ConfigError, match="shard_workers"):
        DenseIndex(ivf_index.folder, m.shards, m.dim, m.n_passages, device="cpu", shard_workers=0)


def test_flat_scores_are_bit_identical_alone_and_in_any_batch(flat_index):
    """drgym sends exact inner products of small batches through FAISS's per-query loop and
    of larger ones through BLAS (FLAT_BLAS_THRESHOLD), and re-scores the candidates, so a
    query scores exactly alike alone, in a small batch (one thread) and in a large one; the
    micro-batcher's answers then never depend on what else was in the batch."""
    import faiss

    from drgym.index.dense import SMALL_BATCH, DenseIndex
    from drgym.index.faiss_build import FLAT_BLAS_THRESHOLD
    from drgym.index.manifest import IndexManifest

    m = IndexManifest.read(flat_index.folder)
    dense = DenseIndex(flat_index.folder, m.shards, m.dim, m.n_passages, device="cpu")
    assert faiss.cvar.distance_compute_blas_threshold == FLAT_BLAS_THRESHOLD == 4 * 384
    q = unit_rows(64, seed=11)
    alone = [dense.search(q[i:i + 1], 10) for i in range(len(q))]
    S1 = np.vstack([s for s, _ in alone])
    R1 = np.vstack([r for _, r in alone])
    loop_max = (FLAT_BLAS_THRESHOLD - 1) // m.dim  # the largest batch of FAISS's per-query loop (queries x dim)
    for b, threads in ((3, None), (min(loop_max, 64), None), (min(loop_max + 1, 64), None), (SMALL_BATCH - 1, None),
                       (64, None), (64, 1)):
        parts = [dense.search(q[i:i + b], 10, threads=threads) for i in range(0, len(q), b)]
        np.testing.assert_array_equal(np.vstack([r for _, r in parts]), R1)
        np.testing.assert_array_equal(np.vstack([s for s, _ in parts]), S1)  # bit for bit


def test_flat_scores_do_not_depend_on_faiss_rounding_by_batch(flat_index):
    """On some CPUs OpenBLAS picks its sgemm kernel by matrix size, so FAISS's scores for
    one query differ in the last bit alone and in a batch. drgym re-scores a Flat shard's
    candidates (exact_scores), so that rounding never reaches the results: here FAISS's
    scores are nudged by an amount that depends on the batch size, and the answers stay
    bit for bit those of the query alone."""
    from drgym.index.dense import DenseIndex
    from drgym.index.manifest import IndexManifest

    class BatchRounding:
        def __init__(self, inner):
            self.inner = inner

        def search(self, q, k):
            D, I = self.inner.search(q, k)
            steps = len(q) % 4  # 0 to 3 ulps, by batch size
            for _ in range(steps):
                D = np.nextafter(D, np.float32(np.inf))
            return D, I

    m = IndexManifest.read(flat_index.folder)
    dense = DenseIndex(flat_index.folder, m.shards, m.dim, m.n_passages, device="cpu")
    dense._indexes = [BatchRounding(ix) for ix in dense._indexes]
    q = unit_rows(24, seed=5)
    alone = [dense.search(q[i:i + 1], 10) for i in range(len(q))]
    for b in (2, 3, 8, 24):
        parts = [dense.search(q[i:i + b], 10) for i in range(0, len(q), b)]
        np.testing.assert_array_equal(np.vstack([r for _, r in parts]), np.vstack([r for _, r in alone]))
        np.testing.assert_array_equal(np.vstack([s for s, _ in parts]), np.vstack([s for s, _ in alone]))
