"""The search server under hostile clients: NaN and Infinity in JSON bodies get a clean
422 on a connection that stays usable, and slow clients (a header line a second, a body
byte a second, nothing at all) are cut off after the head and body timeouts. A tiny
in-memory backend keeps these fast; the servers listen on 127.0.0.1."""

from __future__ import annotations

import json
import math
import socket
import threading
import time

import httpx
import pytest
from typer.testing import CliRunner

from drgym.errors import DocumentNotFoundError
from drgym.search.base import SearchBackend
from drgym.server import app as server_app
from server_helpers import running_server
from drgym.types import Document, SearchResult


class Tiny(SearchBackend):
    """k results per query, ``"<query> #<i>"``; fetch knows no URL."""

    name = "tiny"
    max_k = 10

    def search_batch(self, queries, k=10):
        self.check_request(queries, k)
        return [[SearchResult(doc_id=f"d{i}", url=f"https://example.org/{i}", title=f"T{i}", text=f"{q} #{i}",
                              score=1.0 / (i + 1), rank=i + 1, source="tiny") for i in range(k)] for q in queries]

    def fetch(self, url) -> Document:
        raise DocumentNotFoundError(url)


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity (what any strict JSON client does)."""
    def bad(name):
        raise ValueError(f"non-finite number {name} in the answer")
    return json.loads(text, parse_constant=bad)


def local_port(resp: httpx.Response) -> int:
    """The client-side port of the connection that carried ``resp``."""
    return resp.extensions["network_stream"].get_extra_info("client_addr")[1]


@pytest.fixture(scope="module")
def srv():
    with running_server(Tiny(), header_timeout_s=2.0, body_timeout_s=2.0, keep_alive_s=5.0) as s:
        yield s


# -- NaN and Infinity ----------------------------------------------------------------------

GOOD = '{"queries": ["capital of France"], "topk": 2}'

NON_FINITE = [
    ('{"queries": ["x"], "topk": NaN}', ["topk"], "NaN"),
    ('{"queries": ["x"], "topk": Infinity}', ["topk"], "Infinity"),
    ('{"queries": ["x"], "topk": -Infinity}', ["topk"], "-Infinity"),
    ('{"queries": ["x"], "topk": 1e400}', ["topk"], "Infinity"),
    ('{"queries": ["x"], "topk": -1e400}', ["topk"], "-Infinity"),
    ('{"queries": [NaN], "topk": 2}', ["queries", 0], "NaN"),
    ('{"queries": ["x"], "topk": 2, "extra": {"deep": [1, 2, Infinity]}}', ["extra", "deep", 2], "Infinity"),
    ('{"queries": ["x"], "return_scores": NaN}', ["return_scores"], "NaN"),
    ("NaN", [], "NaN"),
]


@pytest.mark.parametrize("body,loc,echo", NON_FINITE)
def test_non_finite_numbers_get_422_and_the_connection_stays_usable(srv, body, loc, echo):
    with httpx.Client(base_url=srv.url, timeout=10, limits=httpx.Limits(max_connections=1)) as c:
        bad = c.post("/retrieve", content=body, headers={"Content-Type": "application/json"})
        bad_port = local_port(bad)
        good = c.post("/retrieve", content=GOOD, headers={"Content-Type": "application/json"})
        good_port = local_port(good)
    assert bad.status_code == 422, bad.text
    detail = strict_json(bad.text)["detail"]  # valid, strict JSON: no NaN echoed back
    assert detail[0]["loc"] == ["body", *loc]
    assert "not valid JSON numbers" in detail[0]["msg"]
    assert detail[0]["input"] == echo
    assert good.status_code == 200, good.text
    assert [d["contents"] for d in good.json()["result"][0]] == ['"T0"\ncapital of France #0', '"T1"\ncapital of France #1']
    assert bad_port == good_port  # the same keep-alive connection answered both


def test_validation_errors_echo_no_non_finite_input():
    """Whatever a validation error echoes is made finite (FastAPI's own handler would fail to
    encode it: a 500 and a reset connection)."""
    out = server_app.finite_json([{"input": {"a": [math.nan, math.inf, -math.inf, 1.5]}, "loc": ("body", "a")}])
    assert out == [{"input": {"a": ["NaN", "Infinity", "-Infinity", 1.5]}, "loc": ["body", "a"]}]
    json.dumps(out, allow_nan=False)


def test_ordinary_422s_unchanged(srv):
    r = httpx.post(f"{srv.url}/retrieve", json={"queries": "not a list"}, timeout=10)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "queries"]
    r = httpx.post(f"{srv.url}/retrieve", json={"queries": ["x"], "topk": 2.5}, timeout=10)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "topk"]


# -- slow clients ----------------------------------------------------------------------------


def _closed_after(sock: socket.socket, send_lines: list[bytes], every_s: float, limit_s: float) -> tuple[float, bytes]:
    """Send ``send_lines`` one per ``every_s`` (cycling) until the server closes; returns
    (seconds until closed, what the server sent). Fails after ``limit_s``."""
    t0 = time.monotonic()
    got = b""
    i = 0
    sock.settimeout(every_s)
    while time.monotonic() - t0 < limit_s:
        try:
            if send_lines:
                sock.sendall(send_lines[i % len(send_lines)])
                i += 1
            chunk = sock.recv(4096)
            if not chunk:
                return time.monotonic() - t0, got
            got += chunk
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0, got
    pytest.fail(f"the server kept a slow connection open for {limit_s} s (received {got!r})")


def _connect(srv) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=5)


def test_a_client_sending_one_header_line_a_second_is_cut_off(srv):
    with _connect(srv) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        took, got = _closed_after(s, [b"X-Slow: %d\r\n" % i for i in range(100)], every_s=1.0, limit_s=12)
    assert took >= 1.5, took  # not before the 2 s header timeout (the 408 says which timeout cut it)
    assert got.startswith(b"HTTP/1.1 408 Request Timeout") and b"no whole request head within 2 s" in got


def test_a_client_sending_its_body_a_byte_a_second_is_cut_off(srv):
    with _connect(srv) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 200\r\n\r\n")
        took, got = _closed_after(s, [b"{", b" "], every_s=1.0, limit_s=12)
    assert took >= 1.5, took
    assert got.startswith(b"HTTP/1.1 408 Request Timeout") and b"no whole request body within 2 s" in got
    assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200


def test_a_silent_connection_is_closed(srv):
    with _connect(srv) as s:
        took, got = _closed_after(s, [], every_s=0.5, limit_s=12)
    assert took >= 1.5 and got.startswith(b"HTTP/1.1 408"), (took, got)


def test_many_slow_clients_are_all_cut_off_and_others_are_served(srv):
    socks = [_connect(srv) for _ in range(60)]
    try:
        for s in socks:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n")
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200  # served meanwhile
        closed = 0
        for s in socks:
            s.settimeout(60)  # a hang guard: each is answered 408 at its 2 s header timeout
            try:
                data = s.recv(4096)
                closed += data.startswith(b"HTTP/1.1 408")
            except socket.timeout:
                pass
        assert closed == len(socks)
    finally:
        for s in socks:
            s.close()


def test_idle_keep_alive_connection_outlives_the_head_timeout(srv):
    """The head deadline starts with a request's first byte: an idle kept-alive
    connection is governed by the keep-alive timeout (5 s here), not by it (2 s)."""
    with httpx.Client(base_url=srv.url, timeout=10, limits=httpx.Limits(max_connections=1)) as c:
        a = c.get("/health")
        a_port = local_port(a)
        time.sleep(3.0)
        b = c.get("/health")
        b_port = local_port(b)
    assert a.status_code == b.status_code == 200 and a_port == b_port


def test_a_complete_quick_request_on_a_raw_socket_is_answered(srv):
    with _connect(srv) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b'"service":"drgym"' in data


# -- `drgym serve` options ---------------------------------------------------------------------


def test_serve_options_reach_uvicorn(monkeypatch):
    from drgym.cli import app
    from drgym.cli import serve as serve_cli

    got: dict = {}
    monkeypatch.setattr(serve_cli, "load_backend", lambda settings, **kw: Tiny())
    monkeypatch.setattr("uvicorn.run", lambda app_, **kw: got.update(kw))
    monkeypatch.setenv("DRGYM_BODY_TIMEOUT", "7.5")
    res = CliRunner().invoke(app, ["serve", "--port", "0", "--header-timeout", "3", "--keep-alive-timeout", "4"])
    assert res.exit_code == 0, res.output
    assert got["timeout_keep_alive"] == 4.0 and got["h11_max_incomplete_event_size"] == server_app.UVICORN_H11_MAX_EVENT
    assert got["http"] is server_app.timed_h11_protocol(3.0, 7.5)  # --header-timeout and DRGYM_BODY_TIMEOUT
    got.clear()
    monkeypatch.delenv("DRGYM_BODY_TIMEOUT")
    assert CliRunner().invoke(app, ["serve", "--port", "0"]).exit_code == 0
    assert got["http"] is server_app.timed_h11_protocol(server_app.DEFAULT_HEADER_TIMEOUT_S,
                                                        server_app.DEFAULT_BODY_TIMEOUT_S)
    assert got["timeout_keep_alive"] == server_app.DEFAULT_KEEP_ALIVE_S
    assert (serve_cli.DEFAULT_HEADER_TIMEOUT_S, serve_cli.DEFAULT_BODY_TIMEOUT_S, serve_cli.DEFAULT_KEEP_ALIVE_S) == (
        server_app.DEFAULT_HEADER_TIMEOUT_S, server_app.DEFAULT_BODY_TIMEOUT_S, server_app.DEFAULT_KEEP_ALIVE_S)


@pytest.mark.parametrize("args", [["--header-timeout", "0"], ["--body-timeout", "nan"], ["--keep-alive-timeout", "-1"]])
def test_serve_rejects_bad_timeouts_in_one_line(monkeypatch, args):
    from drgym.cli import app
    from drgym.cli import serve as serve_cli

    monkeypatch.setattr(serve_cli, "load_backend", lambda settings, **kw: pytest.fail("loaded the index"))
    res = CliRunner().invoke(app, ["serve", "--port", "0", *args])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("drgym serve: error: invalid settings:") and "Traceback" not in res.output
    assert "must be a positive number of seconds" in lines[0]
