"""Index integrity under a running process and on disk: an index rebuilt under a loaded
engine is never read by it (docstore, FTS5, lazily loaded parts), the manifest's
identity fields are checksummed and its shard layout checked, and a full disk during a
build gives one line, not SIGBUS. On the real ``hotpotqa`` corpus (994 paragraphs,
shipped vectors)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import pytest

from drgym.corpus import load_named_corpus
from drgym.errors import IndexReplacedError
from drgym.index.build import IndexSpec, build_index, get_encoder
from drgym.search.local import LocalSearchEngine

GALLU = "If Gallu is a demon Lilu is what?"  # HotpotQA train; supporting: "Alû", "Lilu (mythology)"
QUERIES = [GALLU, "Which magazine was started first Arthur's Magazine or First for Women?",
           "The Oberoi family is part of a hotel company that has a head office in what city?"]


@pytest.fixture(scope="module")
def encoder():
    return get_encoder("all-MiniLM-L6-v2", "cpu")


@pytest.fixture(scope="module")
def docs():
    return load_named_corpus("hotpotqa")


def _build(root, docs, encoder, name="swap", **kw):
    """Build (or rebuild, ``force``) ``root/name`` from ``docs``."""
    res = build_index(IndexSpec(corpus="hotpotqa", name=name, **kw), root=root, encoder=encoder, docs=docs, force=True)
    assert res.built
    return res


def _rotated(docs):
    """The same documents, rows rotated by half: every old row names another passage."""
    h = len(docs) // 2
    return docs[h:] + docs[:h]


def _in_new_thread(fn):
    """``fn()`` on a thread started now (so its SQLite connections are opened now)."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the caller
            out["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(120)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _hits(results):
    return [(r.doc_id, r.title, r.url, r.text, r.score) for r in results]


# -- item: an index replaced under a running engine ------------------------------------------


@pytest.mark.parametrize("engine_kind", ["bm25s", "fts5"])
def test_rebuilt_index_is_not_read_by_a_loaded_engine(tmp_path, docs, encoder, engine_kind):
    """After ``build --force`` swaps the folder, a thread started later still gets the
    loaded index's passages for its rows, and fetches the same documents."""
    _build(tmp_path, docs, encoder, bm25_engine=engine_kind)
    folder = tmp_path / "swap"
    engine = LocalSearchEngine(folder, method="bm25", encoder=encoder)
    try:
        before = {q: engine.search(q, k=5) for q in QUERIES}
        assert before[GALLU][0].title in ("Alû", "Lilu (mythology)")
        # a new index without the documents just found, its rows moved: renamed into place
        found = {r.url for rs in before.values() for r in rs}
        _build(tmp_path, _rotated([d for d in docs if d.url not in found]), encoder, bm25_engine=engine_kind)

        after = _in_new_thread(lambda: {q: engine.search(q, k=5) for q in QUERIES})
        assert {q: _hits(r) for q, r in after.items()} == {q: _hits(r) for q, r in before.items()}
        assert engine.docstore.replaced
        top = before[GALLU][0]
        fetched = _in_new_thread(lambda: engine.fetch(top.url))
        assert (fetched.doc_id, fetched.title) == (top.doc_id, top.title)
        # many threads at once, all opened after the swap: every answer from the loaded index
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            many = list(pool.map(lambda q: _hits(engine.search(q, k=5)), QUERIES * 8))
        assert many == [_hits(before[q]) for q in QUERIES * 8]
    finally:
        engine.close()
    # a freshly loaded engine serves the new index: its rows name other passages
    fresh = LocalSearchEngine(folder, method="bm25", encoder=encoder)
    try:
        assert fresh.docstore.passages([0])[0].doc_id == _rotated([d for d in docs if d.url not in found])[0].doc_id
        assert [r.url for r in fresh.search(GALLU, k=5) if r.url in found] == []
        assert engine.docstore.path == fresh.docstore.path
    finally:
        fresh.close()


def test_a_part_first_used_after_the_swap_is_refused_by_name(tmp_path, docs, encoder):
    """Dense and BM25 load on first use: after a swap they would come from the new
    folder, so the engine refuses, naming the folder and the fix."""
    _build(tmp_path, docs, encoder)
    folder = tmp_path / "swap"
    engine = LocalSearchEngine(folder, method="dense", encoder=encoder)  # dense not loaded yet
    try:
        _build(tmp_path, _rotated(docs), encoder)
        for method in ("dense", "bm25", "hybrid"):
            with pytest.raises(IndexReplacedError, match=r"was replaced on disk .* restart it"):
                engine.search_rows([GALLU], 3, method=method)
        assert str(folder) in str(pytest.raises(IndexReplacedError, engine.search, GALLU, 3).value)
    finally:
        engine.close()


def test_health_and_search_over_http_stay_on_the_loaded_index(tmp_path, docs, encoder):
    """Through ``drgym serve``'s app: /search, /fetch of the URLs it returned, and
    /health's fingerprint are all the loaded index's after a rebuild."""
    from fastapi.testclient import TestClient

    from drgym.server.app import create_app

    first = _build(tmp_path, docs, encoder)
    engine = LocalSearchEngine(tmp_path / "swap", method="bm25", encoder=encoder)
    with TestClient(create_app(engine, close_backend=True)) as client:
        before = client.get("/search", params={"query": GALLU, "k": 5}).json()
        health = client.get("/health").json()
        hits = [json.loads(base64.b64decode(r)) for r in before["results"]]
        urls = [h["url"] for h in hits] * 8
        # the new index lacks the documents /search just returned, and its rows moved
        second = _build(tmp_path, _rotated([d for d in docs if d.url not in urls]), encoder)
        assert second.manifest.corpus_fingerprint != first.manifest.corpus_fingerprint
        from concurrent.futures import ThreadPoolExecutor

        def fetch(url):
            return client.get("/fetch", params={"url": url})

        def search(_):
            return client.get("/search", params={"query": GALLU, "k": 5}).json()["results"]

        with ThreadPoolExecutor(16) as pool:  # fresh worker threads on the server side
            answers = list(pool.map(fetch, urls))
            searches = list(pool.map(search, range(16)))
        assert [a.status_code for a in answers] == [200] * len(urls)
        assert [json.loads(base64.b64decode(a.json()["clean_text"]))["url"] for a in answers] == urls
        assert searches == [before["results"]] * 16
        assert client.get("/health").json()["engine"] == health["engine"]
        assert first.manifest.corpus_fingerprint in str(health["engine"])


def test_mcp_server_keeps_serving_the_loaded_index_after_a_rebuild(tmp_path, docs, encoder):
    """``drgym mcp``'s tools (run on worker threads) after a rebuild: same hits, and
    ``fetch`` of each hit's URL gives its document."""
    from mcp import Client

    from drgym.server.mcp import create_mcp_server

    _build(tmp_path, docs, encoder)
    engine = LocalSearchEngine(tmp_path / "swap", method="bm25", encoder=encoder)
    want = _hits(engine.search(GALLU, k=5))

    async def session():
        async with Client(create_mcp_server(engine), cache=None, read_timeout_seconds=120) as client:
            _build(tmp_path, _rotated(docs), encoder)
            r = await client.call_tool("search", {"query": GALLU, "k": 5})
            got = [(h["doc_id"], h["title"], h["url"], h["text"], h["score"]) for h in r.structured_content["results"]]
            pages = [await client.call_tool("fetch", {"url": h[2]}) for h in got]
            return got, [(p.structured_content or {}).get("doc_id") for p in pages]

    try:
        got, fetched = asyncio.run(session())
        assert got == want
        assert fetched == [h[0].split("#p")[0] for h in want]  # a passage's document
    finally:
        engine.close()


# -- item: the manifest protects itself -------------------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A module-wide DRGYM_HOME (``drgym index verify NAME`` resolves names in it)."""
    from envs_helpers import drgym_home

    with drgym_home(tmp_path_factory.mktemp("drgym_home")) as home:
        yield home


@pytest.fixture(scope="module")
def four(home, docs, encoder):
    """hotpotqa in dense shards of 250 rows (Flat + BM25)."""
    return build_index(IndexSpec(corpus="hotpotqa", name="four", shard_size=250), root=home / "indexes",
                       encoder=encoder, docs=docs)


def _edited(res, home, name, edit):
    """A copy of the index ``res`` named ``name`` whose manifest JSON ``edit`` changed in place."""
    import shutil

    dst = home / "indexes" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(res.folder, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m)
    (dst / "manifest.json").write_text(json.dumps(m, indent=2))
    return dst


def _verify(name):
    from typer.testing import CliRunner

    from drgym.cli import app

    return CliRunner().invoke(app, ["index", "verify", name])


def _refused(folder, name, *needles):
    """Load and ``drgym index verify`` both refuse the index, naming each needle."""
    from drgym.errors import CorruptIndexError

    with pytest.raises(CorruptIndexError) as e:
        LocalSearchEngine(folder, method="dense")
    res = _verify(name)
    assert res.exit_code == 1, res.output
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))
        assert needle in res.output, (needle, res.output)
    assert "bad: " in res.output and "ok:" not in res.output
    return str(e.value), res.output


def test_first_shard_start_moved_is_refused_by_name(four, home):
    """shards[0].start 0 -> 5 moved every dense hit to another document with the same score."""
    dst = _edited(four, home, "start5", lambda m: m["shards"][0].update(start=5))
    err, out = _refused(dst, "start5", "shards[0].start 5, expected row 0")
    assert "manifest.json" in err and "a gap" in err


def test_overlapping_shards_with_the_right_total_are_refused(four, home):
    """shards[1] starting 10 rows early (an overlap) while the counts still sum to n_passages."""
    def overlap(m):
        m["shards"][1]["start"] -= 10
    dst = _edited(four, home, "overlap", overlap)
    m = json.loads((dst / "manifest.json").read_text())
    assert sum(s["count"] for s in m["shards"]) == m["n_passages"]
    _refused(dst, "overlap", "shards[1].start 240, expected row 250, where shards[0] ends", "an overlap")


def test_counts_not_summing_to_n_passages_are_refused(four, home):
    dst = _edited(four, home, "short", lambda m: m.update(n_passages=m["n_passages"] - 1))
    _refused(dst, "short", "counts sum to", f"n_passages {four.manifest.n_passages - 1}")


def test_swapped_shard_files_keep_the_layout_but_fail_the_manifest_hash(four, home, encoder):
    """Shards 0 and 1 (250 rows each) with their files swapped: a valid layout, every hit
    of those shards on another passage. Only the hash of the fields catches it."""
    def swap(m):
        a, b = m["shards"][0], m["shards"][1]
        a["faiss"], b["faiss"] = b["faiss"], a["faiss"]
        a["embeddings"], b["embeddings"] = b["embeddings"], a["embeddings"]
    dst = _edited(four, home, "swapped", swap)
    _refused(dst, "swapped", "manifest.json has fields that were changed after the build")


def test_missing_checksums_section_is_refused_by_name(four, home):
    dst = _edited(four, home, "nosums", lambda m: m.pop("checksums"))
    _refused(dst, "nosums", "has no checksums section, which index format 3 always writes")


def test_missing_checksum_entry_of_a_garbled_file_is_refused_by_name(four, home):
    """One file's entry removed and the file garbled (same size): refused, the file named."""
    import numpy as np

    dst = _edited(four, home, "noentry", lambda m: m["checksums"]["files"].pop("dense/faiss-00001.index"))
    f = dst / "dense" / "faiss-00001.index"
    data = bytearray(f.read_bytes())
    data[-4096:] = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    f.write_bytes(bytes(data))
    _refused(dst, "noentry", "dense/faiss-00001.index has no checksum entry in the manifest")


def test_a_manifest_without_format_version_is_refused(four, home):
    """Without ``format_version`` it would read as the newest format; it is refused instead."""
    from drgym.errors import CorruptIndexError

    dst = _edited(four, home, "nofmt", lambda m: m.pop("format_version"))
    with pytest.raises(CorruptIndexError, match="has no format_version field"):
        LocalSearchEngine(dst, method="dense")


def test_an_older_manifest_without_its_own_hash_loads_and_verify_says_so(four, home, encoder):
    """A format-3 manifest written before the fields were hashed: loads, searches as the
    original, and ``drgym index verify`` says plainly that its fields are unprotected."""
    dst = _edited(four, home, "olderfmt", lambda m: m["checksums"].pop("manifest"))
    e = LocalSearchEngine(dst, method="dense", encoder=encoder)
    try:
        assert e.search(GALLU, 3)[0].title in ("Alû", "Lilu (mythology)")
    finally:
        e.close()
    res = _verify("olderfmt")
    assert res.exit_code == 0 and "ok:" in res.output
    assert "manifest's own fields (shard layout, counts, encoder...) are not checksummed" in res.output


def test_the_built_manifest_records_the_hash_of_its_fields_and_write_refuses_a_broken_layout(four, tmp_path):
    from drgym.errors import CorruptIndexError
    from drgym.index.manifest import IndexManifest, manifest_digest

    raw = json.loads((four.folder / "manifest.json").read_text())
    assert raw["checksums"]["manifest"] == manifest_digest(raw)
    assert [(s["start"], s["count"]) for s in raw["shards"]][:2] == [(0, 250), (250, 250)]
    m = IndexManifest.read(four.folder)
    assert m.fields_protected and m.manifest_problems() == [] and m.layout_problems() == []
    m.shards[2].start += 1
    with pytest.raises(CorruptIndexError, match=r"shards\[2\]\.start 501, expected row 500"):
        m.write(tmp_path)
    assert not (tmp_path / "manifest.json").exists()


# -- item: a full disk during a build ---------------------------------------------------------


def _no_space(monkeypatch, after: int = 0):
    """``os.posix_fallocate`` fails with ENOSPC (after ``after`` calls succeed), as on a full disk."""
    import errno
    import os

    calls = {"n": 0}
    real = os.posix_fallocate

    def fallocate(fd, offset, length):
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return calls


def test_open_memmap_reserves_the_space_and_a_full_disk_is_enospc_naming_the_file(tmp_path, monkeypatch):
    import errno
    import os

    import numpy as np

    from drgym.index.prealloc import open_memmap

    a = open_memmap(tmp_path / "a.npy", np.float16, (1000, 384))
    a[:] = 1
    del a
    st = os.stat(tmp_path / "a.npy")
    assert st.st_blocks * 512 >= st.st_size  # allocated, not sparse
    assert (np.load(tmp_path / "a.npy") == 1).all()
    _no_space(monkeypatch)
    with pytest.raises(OSError) as e:
        open_memmap(tmp_path / "b.npy", np.float16, (1000, 384))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "b.npy")
    assert not (tmp_path / "b.npy").exists()  # nothing half-made is left

    def unsupported(fd, offset, length):  # a file system without fallocate: written as before
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    c = open_memmap(tmp_path / "c.npy", np.int64, (10,))
    c[:] = np.arange(10)
    del c
    assert np.load(tmp_path / "c.npy").tolist() == list(range(10))


@pytest.mark.parametrize("after", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_full_disk_during_build_is_one_line_and_the_rerun_resumes(tmp_path, docs, encoder, monkeypatch, after):
    """The first mapped file (the tie ranks; ``after=1``: the dense shard's embeddings)
    cannot get its space: an ENOSPC naming the partial build folder (one line from
    ``drgym index build``), no index put in place, no mapped file left half-written; the
    rerun resumes and finishes the build."""
    import errno

    from drgym.cli import write_failure_message
    from drgym.index.manifest import IndexManifest

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.doc_id, "title": d.title, "contents": d.text}) + "\n"
                              for d in docs[:100]), encoding="utf-8")
    root = tmp_path / "idx"
    calls = _no_space(monkeypatch, after)
    with pytest.raises(OSError) as e:
        build_index(IndexSpec(corpus=str(corpus), format="wiki18", name="full"), root=root, encoder=encoder)
    assert calls["n"] == after + 1 and e.value.errno == errno.ENOSPC
    assert str(root / ".build-full") in str(e.value)
    assert not (root / "full").exists()
    partial = root / ".build-full"
    mapped = sorted(p.name for p in (partial / "dense").iterdir()) if (partial / "dense").exists() else []
    assert not [n for n in mapped if n.endswith(".tmp")], mapped
    # what `drgym index build` prints for it (drgym.cli.main): one line, the folder named
    msg = write_failure_message(e.value)
    assert msg is not None and "\n" not in msg
    assert msg.startswith(f"cannot write {root / '.build-full'}: No space left on device (the disk is full")
    monkeypatch.undo()
    res = build_index(IndexSpec(corpus=str(corpus), format="wiki18", name="full"), root=root, encoder=encoder)
    assert res.built and res.resumed_units >= 1
    m = IndexManifest.read(root / "full")
    m.check_files(root / "full", "full")
    assert m.n_documents == 100


def test_an_edited_manifest_is_not_rewritten_with_a_fresh_hash(four, home):
    """``drgym index calibrate`` reads and rewrites the manifest: an edited one is refused,
    not blessed with the hash of its edited fields."""
    from drgym.errors import CorruptIndexError
    from drgym.index.manifest import IndexManifest

    dst = _edited(four, home, "rewrite", lambda m: m.update(n_documents=m["n_documents"] + 1))
    m = IndexManifest.read(dst)
    with pytest.raises(CorruptIndexError, match="fields that were changed after the build"):
        m.write(dst)
    assert json.loads((dst / "manifest.json").read_text())["n_documents"] == four.manifest.n_documents + 1


def test_serve_ray_replicas_started_after_a_rebuild_refuse_to_serve_it(tmp_path, docs, encoder):
    """``drgym serve-ray``: a shard replica (or the router) that Ray restarts after the
    index was rebuilt would load the new build beside replicas of the old one; given the
    deployed build's fingerprint, it refuses by name. Without Ray: the replicas' own classes."""
    from drgym.distributed.serve import ShardedSearchEngine, ShardServer
    from drgym.index.manifest import IndexManifest

    first = _build(tmp_path, docs, encoder, shard_size=500)
    folder = tmp_path / "swap"
    built = IndexManifest.read(folder).serving_fingerprint()
    assert built == first.manifest.serving_fingerprint()
    shard = ShardServer(str(folder), 0, expect=built)  # deployed before the rebuild: serves
    scores, rows = shard.search(encoder.encode_queries([GALLU]), 3)
    assert rows.shape == (1, 3) and int(rows.max()) < 500

    _build(tmp_path, _rotated(docs), encoder, shard_size=500)  # same corpus, same layout, another build
    assert IndexManifest.read(folder).serving_fingerprint() != built
    with pytest.raises(IndexReplacedError, match=r"rebuilt after serve-ray deployed it: shard 1 would serve"):
        ShardServer(str(folder), 1, expect=built)
    with pytest.raises(IndexReplacedError, match="the router would serve the new build"):
        ShardedSearchEngine(folder, [], expect=built, method="dense")
    assert ShardServer(str(folder), 1, expect=IndexManifest.read(folder).serving_fingerprint()).shard_id == 1


def test_full_disk_while_streaming_bm25_arrays_is_enospc_naming_the_array(tmp_path, docs, monkeypatch):
    """The streamed BM25 build writes its two score arrays through memory maps too."""
    import errno

    from drgym.index.bm25 import write_bm25

    texts = [f"{d.title}\n{d.text}" for d in docs[:50]]
    write_bm25(tmp_path / "ok", iter(texts), streaming=True)  # the space is there: built
    assert (tmp_path / "ok" / "bm25" / "data.csc.index.npy").stat().st_size > 0
    _no_space(monkeypatch)
    with pytest.raises(OSError) as e:
        write_bm25(tmp_path / "full", iter(texts), streaming=True)
    assert e.value.errno == errno.ENOSPC and e.value.filename.endswith("data.csc.index.npy")
    assert not (tmp_path / "full" / "bm25" / "data.csc.index.npy").exists()


def test_an_unreadable_docstore_is_one_error_naming_it(tmp_path, docs, encoder, monkeypatch):
    """A docstore this user may not read (os.open refused, as for a file of mode 000 when not root)."""
    import errno
    import os

    from drgym import docstore as ds
    from drgym.errors import CorruptIndexError

    res = _build(tmp_path, docs[:20], encoder)
    real = os.open

    def refuse(path, *a, **kw):
        if str(path).endswith("docs.sqlite"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(ds.os, "open", refuse)
    with pytest.raises(CorruptIndexError, match=r"docs.sqlite cannot be opened \(Permission denied\)"):
        ds.DocStore(res.folder / "docs.sqlite")
