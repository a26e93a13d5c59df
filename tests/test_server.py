"""The drgym search service over a real index (the 994 HotpotQA paragraphs): wire shapes, good and bad
requests (the server keeps serving after each), micro-batching, the LRU cache, auth,
the real ``drgym serve`` CLI in a subprocess, and its one-line errors for broken indexes."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from drgym.search.base import SearchBackend
from drgym.search.client import HTTPSearchClient
from drgym.search.wire import ServerSettings
from server_helpers import free_port, running_server

GOOD_QUERY = "Demon Dice collectible dice game by Lester Smith"
GOOD_TITLE = "Demon Dice"  # hand-checked: the HotpotQA paragraph of that title is the answer


def decode(s: str) -> dict:
    return json.loads(base64.b64decode(s))


@pytest.fixture(scope="module")
def served(hotpotqa_engine):
    """(engine, base_url): the default engine served from a uvicorn thread."""
    with running_server(hotpotqa_engine) as srv:
        yield hotpotqa_engine, srv.url


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served[1], timeout=60) as c:
        yield c


def assert_still_serving(http, engine):
    r = http.get("/search", params={"query": GOOD_QUERY, "k": 3})
    assert r.status_code == 200, r.text
    top = decode(r.json()["results"][0])
    assert top["title"] == GOOD_TITLE
    assert top["id"] == engine.search(GOOD_QUERY, 3)[0].doc_id


# -- shapes ----------------------------------------------------------------------------


def test_search_answers_deepresearchgym_shape_with_both_key_styles(served, http):
    engine, _ = served
    expected = engine.search(GOOD_QUERY, k=5)
    r = http.get("/search", params={"query": GOOD_QUERY, "k": 5, "with_distance": "true"})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"results", "distances", "outlinks"} and body["outlinks"] == []
    docs = [decode(s) for s in body["results"]]
    assert [d["id"] for d in docs] == [h.doc_id for h in expected]
    assert body["distances"] == [h.score for h in expected]
    assert body["distances"] == sorted(body["distances"], reverse=True)
    for d, h in zip(docs, expected):
        assert d["URL"] == d["url"] == h.url and d["ClueWeb22-ID"] == d["id"]
        assert d["Clean-Text"] == f"{h.title}\n{h.text}" and d["text"] == h.text and d["title"] == h.title
    assert docs[0]["title"] == GOOD_TITLE and "Lester Smith" in docs[0]["text"]
    # default: 10 results, no distances (as upstream DeepResearchGym)
    body = http.get("/search", params={"query": GOOD_QUERY}).json()
    assert len(body["results"]) == 10 and body["distances"] is None


def test_fineweb_alias_and_openapi(served, http):
    a = http.get("/search", params={"query": "capital of Norway", "k": 4}).json()
    b = http.get("/fineweb/search", params={"query": "capital of Norway", "k": 4}).json()
    assert a["results"] == b["results"] and b["outlinks"] is None
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/search", "/fineweb/search", "/fetch", "/retrieve", "/health"} <= set(paths)
    h = http.get("/health").json()
    assert h["status"] == "healthy" and h["service"] == "drgym" and h["max_k"] == 100
    assert h["backend"] == "local" and h["deterministic"] is True and "hotpotqa" in h["index"]


def test_fetch_returns_whole_document_or_404(served, http):
    engine, _ = served
    hit = engine.search(GOOD_QUERY, 1)[0]
    r = http.get("/fetch", params={"url": hit.url})
    assert r.status_code == 200 and set(r.json()) == {"clean_text"}
    d = decode(r.json()["clean_text"])
    doc = engine.fetch(hit.url)
    assert (d["id"], d["url"], d["title"], d["text"]) == (doc.doc_id, doc.url, doc.title, doc.text)
    assert d["Clean-Text"].startswith(GOOD_TITLE + "\n") and hit.text in d["text"]
    for bad in ["https://en.wikipedia.org/wiki/No_such_page_xyz", "", "   ", "not a url"]:
        r = http.get("/fetch", params={"url": bad})
        assert (r.status_code, r.json()) == (404, {"detail": "URL not found."}), bad
        assert_still_serving(http, engine)
    assert http.get("/fetch").status_code == 422


# -- bad requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "status", "detail"),
    [
        ({"query": ""}, 400, "No query text in request"),
        ({"query": "  \t\n "}, 400, "No query text in request"),
        ({}, 422, None),
        ({"query": "x", "k": 0}, 400, "k must be between 1 and 100, got 0."),
        ({"query": "x", "k": -1}, 400, "k must be between 1 and 100, got -1."),
        ({"query": "x", "k": 10**6}, 400, "k must be between 1 and 100, got 1000000."),
        ({"query": "x", "k": "ten"}, 422, None),
    ],
    ids=["empty", "whitespace", "missing", "k0", "k-1", "k1e6", "k-not-int"],
)
def test_bad_search_requests_get_clear_errors_and_server_keeps_serving(served, http, params, status, detail):
    r = http.get("/search", params=params)
    assert r.status_code == status, r.text
    body = r.json()
    assert "detail" in body
    if detail:
        assert body["detail"].startswith(detail)
    assert_still_serving(http, served[0])


def test_long_and_non_ascii_queries_are_served(served, http):
    engine, _ = served
    long_q = ("Demon Dice collectible dice game " * 400)[:10_000]
    for q in [long_q, "Ångström unit of length", "北京 首都", "Café Müller 🎲 dice", "é" * 10_000]:
        r = http.get("/search", params={"query": q, "k": 3, "with_distance": "true"})
        assert r.status_code == 200, (q[:30], r.text[:200])
        ids = [decode(s)["id"] for s in r.json()["results"]]
        assert ids == [h.doc_id for h in engine.search(q, 3)]
        assert len(ids) == 3
    assert_still_serving(http, engine)


# -- /retrieve -------------------------------------------------------------------------


def test_retrieve_in_search_r1_shape(served, http):
    engine, _ = served
    qs = [GOOD_QUERY, "capital of Norway"]
    r = http.post("/retrieve", json={"queries": qs, "topk": 3, "return_scores": True})
    assert r.status_code == 200
    res = r.json()["result"]
    expected = engine.search_batch(qs, 3, collapse="passage")  # /retrieve answers passages, as Search-R1
    assert len(res) == 2 and [len(x) for x in res] == [3, 3]
    for hits, exp in zip(res, expected):
        for h, e in zip(hits, exp):
            assert set(h) == {"document", "score"} and h["score"] == e.score
            assert h["document"]["id"] == e.doc_id
            assert h["document"]["contents"] == f'"{e.title}"\n{e.text}'
    # Search-R1's own parsing: title = first line without quotes
    assert res[0][0]["document"]["contents"].split("\n")[0].strip('"') == GOOD_TITLE
    plain = http.post("/retrieve", json={"queries": qs[:1], "topk": 2}).json()["result"]
    assert [d["id"] for d in plain[0]] == [e.doc_id for e in expected[0][:2]] and "score" not in plain[0][0]
    default_k = http.post("/retrieve", json={"queries": qs[:1]}).json()["result"]
    assert len(default_k[0]) == 3  # Search-R1's default topk
    assert http.post("/retrieve", json={"queries": []}).json() == {"result": []}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"queries": ["ok"], "topk": -1}, 400),
        ({"queries": ["ok"], "topk": 101}, 400),
        ({"queries": "just a string", "topk": 3}, 422),
        ({"queries": [1, 2]}, 422),
        ({"topk": 3}, 422),
        ({"queries": ["ok"], "topk": "3"}, 422),
        ({"queries": ["ok"], "return_scores": 1}, 422),
        ({"queries": ["ok"], "collapse": "sentence"}, 422),
    ],
    ids=["topk-1", "topk101", "not-a-list", "not-strings", "no-queries", "topk-string", "scores-int", "bad-collapse"],
)
def test_bad_retrieve_requests(served, http, body, status):
    r = http.post("/retrieve", json=body)
    assert r.status_code == status, r.text
    assert "detail" in r.json()
    assert_still_serving(http, served[0])


def test_retrieve_answers_an_empty_query_with_an_empty_list_as_search_r1(served, http):
    """Search-R1 rollouts send "" when a model writes <search> </search>; its server answers
    200 and its client reads ``.json()['result']``: one list per query, [] for the empty one."""
    engine, _ = served
    r = http.post("/retrieve", json={"queries": ["capital of Germany", ""], "topk": 3})
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    assert [len(x) for x in res] == [3, 0]
    want = engine.search_batch(["capital of Germany"], 3, collapse="passage")[0]
    assert [d["id"] for d in res[0]] == [h.doc_id for h in want]
    # whitespace and empty queries anywhere in the batch; the others keep their places
    qs = [" \t\n", GOOD_QUERY, "", "capital of Norway", "  "]
    res = http.post("/retrieve", json={"queries": qs, "topk": 2, "return_scores": True}).json()["result"]
    want = engine.search_batch([GOOD_QUERY, "capital of Norway"], 2, collapse="passage")
    assert [[h["document"]["id"] for h in x] for x in res] == [[], [h.doc_id for h in want[0]], [],
                                                               [h.doc_id for h in want[1]], []]
    assert http.post("/retrieve", json={"queries": ["", " "]}).json() == {"result": [[], []]}
    assert_still_serving(http, engine)


def test_retrieve_through_search_r1_client_code_path(served):
    """The exact calls of Search-R1's ``search_r1/llm_agent/generation.py`` (``requests``,
    ``.json()['result']``, then ``_passages2string``'s parsing of each hit)."""
    import requests

    engine, url = served
    payload = {"queries": ["capital of Germany", "", GOOD_QUERY], "topk": 3, "return_scores": True}
    results = requests.post(f"{url}/retrieve", json=payload, timeout=60).json()["result"]
    strings = []
    for result in results:
        ref = ""
        for idx, doc_item in enumerate(result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            ref += f"Doc {idx+1}(Title: {title}) {text}\n"
        strings.append(ref)
    assert strings[1] == "" and strings[0].count("Doc ") >= 3 and strings[2].startswith(f'Doc 1(Title: "{GOOD_TITLE}")')


@pytest.mark.parametrize("body", [{}, {"topk": None}, {"topk": 0}], ids=["missing", "null", "zero"])
def test_retrieve_topk_missing_null_or_zero_is_the_server_default(served, http, body):
    engine, _ = served
    res = http.post("/retrieve", json={"queries": [GOOD_QUERY], **body}).json()["result"]
    assert [d["id"] for d in res[0]] == [h.doc_id for h in engine.search_batch([GOOD_QUERY], 3, collapse="passage")[0]]


def test_retrieve_rejects_malformed_json_body(served, http):
    r = http.post("/retrieve", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert_still_serving(http, served[0])


# -- documents or passages -------------------------------------------------------------

LONG_DOC_URL = "https://en.wikipedia.org/wiki/Amri_language"  # a HotpotQA paragraph split into 4 passages


def test_search_returns_distinct_documents_by_default(served, http):
    engine, _ = served
    urls = lambda body: [decode(x)["url"] for x in body["results"]]  # noqa: E731
    for route in ("/search", "/fineweb/search"):
        body = http.get(route, params={"query": "Amri language", "k": 3}).json()
        assert len(set(urls(body))) == 3 and urls(body)[0] == LONG_DOC_URL, urls(body)
        passages = http.get(route, params={"query": "Amri language", "k": 3, "collapse": "passage"}).json()
        assert urls(passages) == [LONG_DOC_URL] * 3  # the cache keeps the two modes apart
        assert decode(passages["results"][0]) == decode(body["results"][0])  # best passage as the snippet
    assert [decode(x)["id"] for x in http.get("/search", params={"query": "Amri language", "k": 3}).json()["results"]] == \
        [h.doc_id for h in engine.search_batch(["Amri language"], 3, collapse="document")[0]]
    r = http.get("/search", params={"query": "Amri language", "collapse": "sentence"})
    assert r.status_code == 422
    # /retrieve: passages by default (Search-R1), documents on request
    res = http.post("/retrieve", json={"queries": ["Amri language"], "topk": 3}).json()["result"][0]
    assert [d["url"] for d in res] == [LONG_DOC_URL] * 3
    res = http.post("/retrieve", json={"queries": ["Amri language"], "topk": 3, "collapse": "document"}).json()["result"][0]
    assert len({d["url"] for d in res}) == 3
    h = http.get("/health").json()
    assert (h["collapse"], h["retrieve_collapse"]) == ("document", "passage")


def test_collapse_defaults_are_server_settings(hotpotqa_engine):
    settings = ServerSettings(collapse="passage", retrieve_collapse="document")
    with running_server(hotpotqa_engine, settings=settings) as srv:
        body = httpx.get(f"{srv.url}/search", params={"query": "Amri language", "k": 3}).json()
        assert [decode(x)["url"] for x in body["results"]] == [LONG_DOC_URL] * 3
        res = httpx.post(f"{srv.url}/retrieve", json={"queries": ["Amri language"], "topk": 3}).json()["result"][0]
        assert len({d["url"] for d in res}) == 3
        # the drgym client follows the server's /search default in search_batch (/retrieve) too
        with HTTPSearchClient(srv.url) as c:
            assert [r.url for r in c.search_batch(["Amri language"], 3)[0]] == [LONG_DOC_URL] * 3
        with HTTPSearchClient(srv.url, collapse="document") as c:
            assert len({r.url for r in c.search("Amri language", 3)}) == 3
            assert c.search_batch(["Amri language"], 3)[0] == c.search("Amri language", 3)
    # a backend that cannot collapse is served as it is, and /health says so
    with running_server(Recording(hotpotqa_engine)) as srv:
        h = httpx.get(f"{srv.url}/health").json()
        assert h["collapse"] is None and h["retrieve_collapse"] is None
        assert httpx.get(f"{srv.url}/search", params={"query": "Amri language", "k": 3}).status_code == 200


# -- batching, cache, failures, auth ---------------------------------------------------


class Recording(SearchBackend):
    """Wraps a real engine, recording each search_batch call; a query containing
    ``FAIL`` makes the backend raise (a backend bug, not a bad request)."""

    def __init__(self, inner, delay_s=0.0):
        self.inner, self.calls, self.ks, self.lock, self.delay_s = inner, [], [], threading.Lock(), delay_s
        self.max_k, self.name = inner.max_k, "recording"

    def search_batch(self, queries, k=10):
        with self.lock:
            self.calls.append(list(queries))
            self.ks.append(k)
        if any("FAIL" in q for q in queries):
            raise RuntimeError("simulated backend failure")
        time.sleep(self.delay_s)
        return self.inner.search_batch(queries, k)

    def fetch(self, url):
        return self.inner.fetch(url)


def test_concurrent_queries_are_micro_batched_and_cached(hotpotqa_engine):
    rec = Recording(hotpotqa_engine)
    queries = [f"history of the city number {i} in Europe" for i in range(16)]
    expected = hotpotqa_engine.search_batch(queries, 5)
    with running_server(rec, settings=ServerSettings(batch_window_ms=50)) as srv:
        barrier = threading.Barrier(16)

        def one(q):
            with httpx.Client(timeout=60) as c:
                barrier.wait()
                return c.get(f"{srv.url}/search", params={"query": q, "k": 5}).json()

        with ThreadPoolExecutor(16) as pool:
            bodies = list(pool.map(one, queries))
        got = [[decode(s)["id"] for s in b["results"]] for b in bodies]
        assert got == [[h.doc_id for h in e] for e in expected]
        n_calls = len(rec.calls)
        assert sum(len(c) for c in rec.calls) == 16
        assert n_calls < 16 and max(len(c) for c in rec.calls) > 1, rec.calls
        # repeats come from the LRU cache: no new backend call
        for q in queries[:4]:
            assert httpx.get(f"{srv.url}/search", params={"query": q, "k": 5}).status_code == 200
        assert len(rec.calls) == n_calls
        stats = httpx.get(f"{srv.url}/health").json()["stats"]
        assert stats["cache_hits"] >= 4 and stats["batches"] == n_calls


def test_worker_threads_are_sized_from_drgym_threads(hotpotqa_engine, monkeypatch):
    """search_batch and /fetch run on the server's own pool of DRGYM_THREADS + 4 threads
    (not Python's default of os.cpu_count() + 4, which ignores affinity and quotas)."""
    monkeypatch.setenv("DRGYM_THREADS", "1")
    names, lock = set(), threading.Lock()

    class Slow(Recording):
        def search_batch(self, queries, k=10):
            with lock:
                names.add(threading.current_thread().name)
            return super().search_batch(queries, k)

        def fetch(self, url):
            with lock:
                names.add(threading.current_thread().name)
            time.sleep(0.2)
            return self.inner.fetch(url)

    url = hotpotqa_engine.search(GOOD_QUERY, 1)[0].url
    with running_server(Slow(hotpotqa_engine)) as srv:
        assert httpx.get(f"{srv.url}/search", params={"query": GOOD_QUERY, "k": 3}).status_code == 200
        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: httpx.get(f"{srv.url}/fetch", params={"url": url}, timeout=60).status_code,
                                  range(16)))
    assert codes == [200] * 16
    assert all(n.startswith("drgym-serve") for n in names) and 1 < len(names) <= 5, names


def test_mixed_k_and_duplicate_queries_in_one_window(hotpotqa_engine):
    rec = Recording(hotpotqa_engine)
    jobs = [("capital of Norway", 3), ("capital of Norway", 5), ("Demon Dice", 3), ("capital of Norway", 3)]
    with running_server(rec, settings=ServerSettings(batch_window_ms=200, cache_size=0)) as srv:
        barrier = threading.Barrier(len(jobs))

        def one(job):
            with httpx.Client(timeout=60) as c:
                barrier.wait()
                r = c.get(f"{srv.url}/search", params={"query": job[0], "k": job[1]})
                return [decode(s)["id"] for s in r.json()["results"]]

        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(one, jobs))
    assert got == [[h.doc_id for h in hotpotqa_engine.search(q, k)] for q, k in jobs]
    # all four arrive within one window: one call per k, a repeated (query, k) searched once
    assert sorted(zip(rec.ks, map(sorted, rec.calls))) == [
        (3, ["Demon Dice", "capital of Norway"]), (5, ["capital of Norway"])], (rec.calls, rec.ks)


def test_lru_cache_evicts_least_recently_used():
    from drgym.server.batching import LRUCache

    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3 and len(c) == 2
    assert (c.hits, c.misses) == (3, 1)
    off = LRUCache(0)
    off.put("a", 1)
    assert off.get("a") is None and len(off) == 0


def test_backend_failure_is_500_isolated_and_server_survives(hotpotqa_engine):
    rec = Recording(hotpotqa_engine)
    with running_server(rec, settings=ServerSettings(batch_window_ms=50)) as srv:
        body = {"queries": ["capital of Norway", "please FAIL now"], "topk": 2}
        r = httpx.post(f"{srv.url}/retrieve", json=body, timeout=60)
        assert r.status_code == 500 and "simulated backend failure" in r.json()["detail"]
        # the good query of the failed batch was retried alone and cached
        assert ["capital of Norway"] in rec.calls
        r = httpx.get(f"{srv.url}/search", params={"query": "please FAIL again"}, timeout=60)
        assert r.status_code == 500 and r.json() == {"detail": "RuntimeError: simulated backend failure"}
        r = httpx.get(f"{srv.url}/search", params={"query": GOOD_QUERY, "k": 1}, timeout=60)
        assert r.status_code == 200 and decode(r.json()["results"][0])["title"] == GOOD_TITLE


def test_overload_answers_429_and_the_client_retries(hotpotqa_engine):
    slow = Recording(hotpotqa_engine, delay_s=1.5)
    settings = ServerSettings(max_pending=2, batch_window_ms=0, cache_size=0)
    with running_server(slow, settings=settings) as srv, ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.get, f"{srv.url}/search", params={"query": "Demon Dice", "k": 1}, timeout=60)
        time.sleep(0.3)  # the worker is busy with the first query, the queue is empty
        many = pool.submit(httpx.post, f"{srv.url}/retrieve", timeout=60,
                           json={"queries": ["capital of Norway", "Lester Smith", "dice game"], "topk": 1})
        time.sleep(0.3)  # three queries wait now
        r = httpx.get(f"{srv.url}/search", params={"query": "one more", "k": 1}, timeout=60)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "3 queries are waiting" in r.json()["detail"]
        t = time.monotonic()
        hits = HTTPSearchClient(srv.url, retry={"attempts": 6}).search("one more", 1)  # retried until served
        assert len(hits) == 1 and time.monotonic() - t >= 0.9
        assert first.result().status_code == 200 and many.result().status_code == 200
        assert httpx.get(f"{srv.url}/health").json()["stats"]["rejected_overloaded"] >= 2


def test_api_keys_are_enforced_when_configured(hotpotqa_engine):
    from drgym.errors import AuthError

    with running_server(hotpotqa_engine, settings=ServerSettings(api_keys="s3cret, other")) as srv:
        p = {"query": GOOD_QUERY, "k": 1}
        assert httpx.get(f"{srv.url}/search", params=p).status_code == 401
        r = httpx.get(f"{srv.url}/search", params=p, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["detail"].startswith("Invalid or missing API Key")
        assert httpx.get(f"{srv.url}/search", params=p, headers={"x-api-key": "other"}).status_code == 200
        assert httpx.get(f"{srv.url}/health").status_code == 200  # no auth on health
        assert HTTPSearchClient(srv.url, api_key="s3cret").search(GOOD_QUERY, 1)[0].title == GOOD_TITLE
        with pytest.raises(AuthError, match="401.*Invalid or missing API Key"):
            HTTPSearchClient(srv.url, api_key="nope").search(GOOD_QUERY, 1)


# -- the real CLI ----------------------------------------------------------------------


def test_cli_serve_subprocess_gives_same_rankings(hotpotqa_engine):
    """``python -m drgym serve`` in its own process: identical rankings to in-process."""
    qs = [GOOD_QUERY, "Who wrote the novel Dracula?", "Ångström"]
    # --corpus finds the index the fixture built (same DRGYM_HOME) and does not rebuild it
    built = (hotpotqa_engine.folder / "manifest.json").stat().st_mtime_ns
    with running_server(cli_args=["--corpus", "hotpotqa", "--method", "hybrid"],
                        env={"DRGYM_MAX_K": "50"}) as srv:  # settings also come from DRGYM_* env vars
        health = httpx.get(f"{srv.url}/health").json()
        assert hotpotqa_engine.folder.name in health["index"] and "hybrid" in health["index"]
        with HTTPSearchClient(srv.url) as c:
            assert c.max_k == 100  # the client's default until it has seen the server
            assert c.is_drgym() and c.max_k == 50  # adopted from /health
            assert c.search_batch(qs, 10) == hotpotqa_engine.search_batch(qs, 10)
            assert [c.search(q, 4) for q in qs] == [hotpotqa_engine.search(q, 4) for q in qs]
        assert httpx.get(f"{srv.url}/search", params={"query": "x", "k": 51}).status_code == 400
        assert httpx.get(f"{srv.url}/search", params={"query": " "}).status_code == 400
        assert httpx.get(f"{srv.url}/search", params={"query": GOOD_QUERY, "k": 50}).status_code == 200
        assert "drgym serve:" in srv.log_text() and "Traceback" not in srv.log_text()
    assert (hotpotqa_engine.folder / "manifest.json").stat().st_mtime_ns == built


def _serve_and_fail(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "drgym", "serve", "--port", str(free_port()), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # it started serving: a failure of this test
        pytest.fail(f"drgym serve {args} kept running instead of failing: {e.stderr}")


def _copy_index(src, dst):
    """Symlink the big files, copy the manifest (so it can be edited safely)."""
    dst.mkdir()
    for p in src.iterdir():
        if p.name == "manifest.json":
            shutil.copy(p, dst / p.name)
        elif p.is_dir():
            shutil.copytree(p, dst / p.name, copy_function=shutil.copy)
        else:
            (dst / p.name).symlink_to(p)
    return dst


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("drgym serve: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def test_cli_serve_refuses_corrupt_index(hotpotqa_engine, tmp_path):
    src = hotpotqa_engine.folder
    # 1. a truncated file
    bad = tmp_path / "truncated"
    bad.mkdir()
    for p in src.iterdir():
        if p.is_file() and p.name != "manifest.json" and p.stat().st_size > 1000:
            victim = p.name
            break
    for p in src.iterdir():
        if p.is_dir():
            shutil.copytree(p, bad / p.name)
        elif p.name == victim:
            (bad / p.name).write_bytes(p.read_bytes()[:100])
        else:
            shutil.copy(p, bad / p.name)
    _one_line_error(_serve_and_fail("--index-dir", str(bad)), victim)
    # 2. a manifest that is not JSON
    garbled = _copy_index(src, tmp_path / "garbled")
    (garbled / "manifest.json").write_text("{ this is not json")
    _one_line_error(_serve_and_fail("--index-dir", str(garbled)), "manifest.json")
    # 3. no index at all
    (tmp_path / "empty").mkdir()
    _one_line_error(_serve_and_fail("--index-dir", str(tmp_path / "empty")))


def test_cli_serve_refuses_mismatched_encoder(hotpotqa_engine, tmp_path):
    # another encoder named on the command line
    line = _one_line_error(_serve_and_fail("--index-dir", str(hotpotqa_engine.folder), "--encoder", "intfloat/e5-base-v2"))
    assert "all-MiniLM-L6-v2" in line and "e5-base-v2" in line
    # an index whose manifest records other encoder weights than the installed ones
    other = _copy_index(hotpotqa_engine.folder, tmp_path / "other")
    m = json.loads((other / "manifest.json").read_text())
    m["encoder_revision"] = "0123456789abcdef"
    from drgym.index.manifest import manifest_digest

    m["checksums"]["manifest"] = manifest_digest(m)  # as a build with those weights writes it
    (other / "manifest.json").write_text(json.dumps(m))
    _one_line_error(_serve_and_fail("--index-dir", str(other), "--method", "dense"), "0123456789abcdef")


def test_cli_serve_rejects_bad_settings():
    line = _one_line_error(_serve_and_fail("--max-k", "0", timeout=60))
    assert "max_k" in line


def test_cli_serve_refuses_a_busy_port_before_loading_the_index():
    """One line naming the address, and no banner: the port is checked before the index loads."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-m", "drgym", "serve", "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    line = _one_line_error(proc, f"127.0.0.1:{port}", "in use")
    assert "http://" not in proc.stderr  # the "serving on" banner never printed
    assert line.endswith("pick another --port)")
