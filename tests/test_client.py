"""HTTPSearchClient against tiny loopback fake servers (auth, retries, malformed answers,
timeouts, every DeepResearchGym document style) and against a real drgym server."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from drgym.errors import AuthError, BackendUnavailableError, BadQueryError, ConfigError, DocumentNotFoundError
from drgym.search.client import HTTPSearchClient, record_fields


def b64(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.b64encode(raw).decode()


class FakeServer:
    """A loopback HTTP server answering from a script of (status, headers, body, delay)
    tuples, one per request (the last one repeats); records each request."""

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                u = urlparse(self.path)
                n = len(fake.requests)
                fake.requests.append({"method": self.command, "path": u.path, "params": parse_qs(u.query),
                                      "headers": dict(self.headers)})
                status, headers, body, delay = fake.script[min(n, len(fake.script) - 1)]
                if callable(body):
                    body = body(u.path, parse_qs(u.query))
                if delay:
                    time.sleep(delay)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    servers = []

    def make(*script):
        s = FakeServer(script)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def ok(body, delay=0.0):
    return (200, {"Content-Type": "application/json"}, body, delay)


def err(status, detail, headers=None):
    return (status, {"Content-Type": "application/json", **(headers or {})}, {"detail": detail}, 0.0)


CLUEWEB = {"URL": "https://example.org/a\n", "URL-hash": "ABC", "Language": "en", "ClueWeb22-ID": "clueweb22-en0001-01-00001",
           "Clean-Text": "Alpha page\nAlpha is the first letter.\nSecond line."}
FINEWEB = {"text": "A FineWeb page body.", "id": "<urn:uuid:1234>", "dump": "CC-MAIN-2024-51", "url": "https://fw.example/x",
           "date": "2024-12-01", "language": "en", "token_count": 5}


def search_body(path, params):
    return {"results": [b64(CLUEWEB), b64(b""), b64(FINEWEB), b64({"_error": "lost"})],
            "distances": [-5.25, -5.5, -6.0, -7.0], "outlinks": []}


def test_decodes_clueweb_fineweb_and_skips_empty_entries(fake):
    srv = fake(ok(search_body))
    with HTTPSearchClient(srv.url, drgym=False, api_key="k-123") as c:
        hits = c.search("alpha", k=4)
    assert [h.rank for h in hits] == [1, 2]
    a, f = hits
    assert (a.doc_id, a.title, a.text, a.score) == (
        "clueweb22-en0001-01-00001", "Alpha page", "Alpha is the first letter.\nSecond line.", -5.25)
    assert a.url == "https://example.org/a\n" and a.metadata == {"URL-hash": "ABC", "Language": "en"}
    assert (f.doc_id, f.url, f.title, f.text, f.score) == ("<urn:uuid:1234>", "https://fw.example/x", "",
                                                          "A FineWeb page body.", -6.0)
    assert f.metadata["dump"] == "CC-MAIN-2024-51"
    req = srv.requests[0]
    assert req["path"] == "/search" and req["params"] == {"query": ["alpha"], "k": ["4"], "with_distance": ["true"]}
    assert req["headers"]["x-api-key"] == "k-123"


def test_record_fields_prefers_drgym_keys():
    rec = {"URL": "u", "ClueWeb22-ID": "d", "Clean-Text": "T\nbody", "url": "u", "id": "d", "title": "T",
           "text": "body", "source": "hotpotqa"}
    assert record_fields(rec) == {"doc_id": "d", "url": "u", "title": "T", "text": "body", "source": "hotpotqa",
                                  "metadata": {}}


def test_api_key_from_env_and_batch_through_thread_pool(fake, monkeypatch):
    monkeypatch.delenv("DRGYM_API_KEY", raising=False)
    monkeypatch.setenv("DEEPRESEARCHGYM_API_KEY", "env-key")
    srv = fake(ok({"status": "healthy"}), ok(search_body))  # /health answers like the public API
    c = HTTPSearchClient(srv.url, workers=3)
    out = c.search_batch(["q1", "q2", "q3"], k=2)
    c.close()
    assert not c.is_drgym()
    assert [len(r) for r in out] == [2, 2, 2]
    paths = [r["path"] for r in srv.requests]
    assert paths[0] == "/health" and paths[1:] == ["/search"] * 3
    assert sorted(r["params"]["query"][0] for r in srv.requests[1:]) == ["q1", "q2", "q3"]
    assert all(r["headers"].get("x-api-key") == "env-key" for r in srv.requests)


def test_401_raises_auth_error_with_server_detail_and_no_retry(fake):
    srv = fake(err(401, "Invalid or missing API Key. Request one at deepresearchgym@cmu.edu"))
    c = HTTPSearchClient(srv.url, drgym=False, retry={"attempts": 4, "backoff_s": 0.01})
    with pytest.raises(AuthError, match="Invalid or missing API Key") as ei:
        c.search("q")
    assert "401" in str(ei.value)
    assert len(srv.requests) == 1


def test_429_retry_after_is_honoured(fake, monkeypatch):
    srv = fake(err(429, "slow down", {"Retry-After": "1"}), ok(search_body))
    c = HTTPSearchClient(srv.url, drgym=False, retry={"attempts": 3, "backoff_s": 0.01})
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)  # the pauses, recorded instead of slept
    hits = c.search("q", k=2)
    assert len(hits) == 2 and len(srv.requests) == 2
    assert waits == [1.0]  # the server's Retry-After second, not the 0.01 s backoff


def test_500_then_200_recovers(fake):
    srv = fake(err(500, "boom"), ok(search_body))
    c = HTTPSearchClient(srv.url, drgym=False, retry={"attempts": 3, "backoff_s": 0.01})
    assert [h.rank for h in c.search("q")] == [1, 2]
    assert len(srv.requests) == 2


def test_persistent_500_becomes_backend_unavailable_after_all_attempts(fake):
    srv = fake(err(503, "index reloading"))
    c = HTTPSearchClient(srv.url, drgym=False, retry={"attempts": 3, "backoff_s": 0.01, "max_backoff_s": 0.02})
    with pytest.raises(BackendUnavailableError, match=r"HTTP 503.*index reloading.*3 attempt"):
        c.search("q")
    assert len(srv.requests) == 3


def test_malformed_json_is_a_clear_error(fake):
    srv = fake((200, {"Content-Type": "application/json"}, b"<html>not json", 0.0))
    c = HTTPSearchClient(srv.url, drgym=False, retry={"attempts": 2, "backoff_s": 0.01})
    with pytest.raises(BackendUnavailableError, match="malformed JSON.*<html>not json"):
        c.search("q")
    srv2 = fake(ok({"items": []}))
    with pytest.raises(BackendUnavailableError, match="expected {'results'"):
        HTTPSearchClient(srv2.url, drgym=False).search("q")


def test_timeout_is_retried_then_reported(fake):
    """The server holds every request until the test lets it go: the client gives both
    attempts up at its 0.3 s timeout while they are still held (an order, not a duration)."""
    release = threading.Event()

    def held(path, params):
        release.wait(60)
        return search_body(path, params)

    srv = fake(ok(held))
    c = HTTPSearchClient(srv.url, drgym=False, retry={"timeout_s": 0.3, "attempts": 2, "backoff_s": 0.01})
    try:
        with pytest.raises(BackendUnavailableError, match="timed out.*2 attempt"):
            c.search("q")
        assert len(srv.requests) == 2  # both given up: a client that waited would get the answer, not raise
    finally:
        release.set()


def test_connection_refused_is_backend_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = HTTPSearchClient(f"http://127.0.0.1:{port}", drgym=False, retry={"attempts": 2, "backoff_s": 0.01})
    with pytest.raises(BackendUnavailableError, match="could not reach"):
        c.search("q")


def test_400_and_client_side_validation(fake):
    srv = fake(err(400, "No query text in request"))
    c = HTTPSearchClient(srv.url, drgym=False, max_k=50)
    with pytest.raises(BadQueryError, match="No query text in request"):
        c.search("q")
    n = len(srv.requests)
    for q, k in [("", 5), ("   ", 5), ("q", 0), ("q", 51)]:
        with pytest.raises(BadQueryError):
            c.search(q, k)
    assert len(srv.requests) == n  # rejected before sending


def test_fetch_404_plain_text_and_b64(fake):
    srv = fake(err(404, "URL not found."))
    with pytest.raises(DocumentNotFoundError, match="URL not found.*https://nowhere.example"):
        HTTPSearchClient(srv.url, drgym=False).fetch("https://nowhere.example")
    srv2 = fake(ok({"clean_text": "Old Title\nold plain body"}))  # an older DeepResearchGym variant
    d = HTTPSearchClient(srv2.url, drgym=False).fetch("https://old.example/p")
    assert (d.doc_id, d.url, d.title, d.text) == ("https://old.example/p", "https://old.example/p", "Old Title",
                                                  "old plain body")
    srv3 = fake(ok({"clean_text": b64(CLUEWEB)}))
    d = HTTPSearchClient(srv3.url, drgym=False, fetch_url=srv3.url + "/").fetch("https://example.org/a")
    assert (d.doc_id, d.title, d.text) == ("clueweb22-en0001-01-00001", "Alpha page", "Alpha is the first letter.\nSecond line.")
    assert srv3.requests[0]["params"]["url"] == ["https://example.org/a"]


def test_config_errors_and_names():
    with pytest.raises(ConfigError, match="http"):
        HTTPSearchClient("localhost:8000")
    assert HTTPSearchClient.deepresearchgym(api_key="x").name == "deepresearchgym"
    assert HTTPSearchClient.deepresearchgym(api_key="x", fineweb=True).route == "/fineweb/search"
    assert HTTPSearchClient("http://127.0.0.1:1").name == "http"


# -- against a real drgym server -------------------------------------------------------


@pytest.fixture(scope="module")
def served_engine(hotpotqa_engine):
    """(engine, base_url): a real index served from a uvicorn thread."""
    from server_helpers import running_server

    with running_server(hotpotqa_engine) as srv:
        yield hotpotqa_engine, srv.url


def test_round_trip_equals_in_process(served_engine):
    engine, url = served_engine
    queries = ["Who founded the Kingdom of Prussia?", "Mount Everest height", "Ångström unit of length"]
    with HTTPSearchClient(url) as c:
        assert c.is_drgym() and c.max_k == engine.max_k
        for q in queries:
            assert c.search(q, k=5) == engine.search(q, k=5)
        assert c.search_batch(queries, k=7) == engine.search_batch(queries, k=7)
        hit = engine.search(queries[0], k=1)[0]
        doc = c.fetch(hit.url)
        assert doc == engine.fetch(hit.url)
        assert doc.text.count(hit.text[:40]) >= 1  # the passage comes from the fetched document
        with pytest.raises(DocumentNotFoundError):
            c.fetch("https://en.wikipedia.org/wiki/No_such_page_drgym_test")
        with pytest.raises(BadQueryError, match="k must be between 1 and"):
            HTTPSearchClient(url, max_k=10_000).search("x", k=engine.max_k + 1)


def _docs(n: int) -> list[str]:
    return [b64({"id": f"d{i}", "url": f"https://x.example/{i}", "title": f"T{i}", "text": f"text {i}"}) for i in range(n)]


def test_search_answers_at_most_k_hits_with_finite_matched_scores(fake):
    """A server that sends more than k results is cut to k; a distance that is not a finite
    number, or a distances list of another length than the results, is a malformed answer
    (not a 0.0 or NaN score)."""
    srv = fake(ok({"results": _docs(50), "distances": [float(50 - i) for i in range(50)]}))
    hits = HTTPSearchClient(srv.url, drgym=False).search("q", k=5)
    assert [(h.doc_id, h.score, h.rank) for h in hits] == [(f"d{i}", 50.0 - i, i + 1) for i in range(5)]
    # no distances at all: the scores are 0.0, as documented
    srv = fake(ok({"results": _docs(3)}))
    assert [h.score for h in HTTPSearchClient(srv.url, drgym=False).search("q", k=3)] == [0.0, 0.0, 0.0]
    bad = [({"results": _docs(3), "distances": [1.5]}, "1 distances for 3 results"),
           ({"results": _docs(3), "distances": [3.0, 2.0, 1.0, 0.0]}, "4 distances for 3 results"),
           ({"results": _docs(3), "distances": "1,2,3"}, "distances '1,2,3' for 3 results"),
           ({"results": _docs(3), "distances": [1.0, float("nan"), 0.5]}, "result 1: a score must be a finite number, got nan"),
           ({"results": _docs(2), "distances": [float("inf"), 0.5]}, "result 0: a score must be a finite number, got inf"),
           ({"results": _docs(2), "distances": [1.0, float("-inf")]}, "got -inf"),
           ({"results": _docs(2), "distances": [1.0, "0.5"]}, "got '0.5'"),
           ({"results": _docs(2), "distances": [True, 0.5]}, "got True")]
    for body, msg in bad:
        srv = fake(ok(body))
        with pytest.raises(BackendUnavailableError, match=re.escape(msg)):
            HTTPSearchClient(srv.url, drgym=False, retry={"attempts": 1}).search("q", k=5)


def test_retrieve_answers_at_most_k_hits_with_finite_scores(fake):
    def hits(n, score=None):
        return [{"document": {"id": f"d{i}", "title": f"T{i}", "contents": f'"T{i}"\ntext {i}', "url": f"u{i}"},
                 "score": float(n - i) if score is None else score(i)} for i in range(n)]

    srv = fake(ok({"result": [hits(50), hits(2)]}))
    out = HTTPSearchClient(srv.url, drgym=True).search_batch(["a", "b"], k=5)
    assert [[(h.doc_id, h.score) for h in r] for r in out] == [[(f"d{i}", 50.0 - i) for i in range(5)],
                                                               [("d0", 2.0), ("d1", 1.0)]]
    assert srv.requests[0]["path"] == "/retrieve"
    for rows, msg in [([hits(3, lambda i: float("nan")), hits(1)], "hit 0: a score must be a finite number, got nan"),
                      ([hits(1), hits(2, lambda i: float("inf") if i else 1.0)], "'b', hit 1: a score must be a finite"),
                      ([hits(1), [{"score": 1.0}]], "hit 0 is not {'document'"),
                      ([hits(1), "nope"], "expected a list of hits")]:
        srv = fake(ok({"result": rows}))
        with pytest.raises(BackendUnavailableError, match=re.escape(msg)):
            HTTPSearchClient(srv.url, drgym=True, retry={"attempts": 1}).search_batch(["a", "b"], k=5)
