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
