"""schemathesis against drgym serve's own /openapi.json (tests/fuzz_helpers.py): every operation,
schema-valid and schema-violating input, non-finite numbers (NaN, Infinity, 1e400) sent as raw
JSON text or query text, no 5xx, and every answer as declared."""

from __future__ import annotations

import http.server
import json
import math
import random
import threading
from types import SimpleNamespace

import pytest
import requests

from drgym.server.app import _non_finite_path
from fuzz_helpers import (
    NON_FINITE_TOKENS,
    OPERATIONS,
    fuzz_cli_server,
    fuzz_server,
    non_finite_body,
    non_finite_rejected,
    non_finite_sent,
    summarize,
)
from server_helpers import running_server


def _assert_clean(report) -> None:
    assert not report.errors, report.errors
    assert report.server_errors == 0, report.statuses
    assert not report.failures, report.failures[:3]
    assert report.operations == set(OPERATIONS), report.cases_by_operation


def test_fuzz_small(hotpotqa_engine):
    """A quick run in the default suite, on a uvicorn thread: about 200 cases (mostly the
    coverage phase: boundary and schema-violating values of every parameter), 10-15 s."""
    with running_server(hotpotqa_engine) as srv:
        report = fuzz_server(srv.url, max_examples=2, seed=0)
    _assert_clean(report)
    assert report.cases >= 50 and report.requests >= report.cases
    # schema-violating input was sent and refused, valid input answered
    assert "422" in report.statuses["POST /retrieve"] and "200" in report.statuses["POST /retrieve"]
    assert "400" in report.statuses["GET /search"] and "200" in report.statuses["GET /search"]
    # a share of the cases held NaN/Infinity/1e400 (body fields, nested, query k): all 422
    assert report.non_finite_cases >= 15 and report.non_finite_server_errors == 0
    assert set(report.non_finite_places) == {"body", "body (nested)", "query"}, report.non_finite_places
    assert {code for c in report.non_finite_statuses.values() for code in c} == {"422"}, report.non_finite_statuses
    assert set(report.non_finite_statuses) == {"POST /retrieve", "GET /search", "GET /fineweb/search"}
    assert sum(report.non_finite_numbers.values()) == report.non_finite_cases
    assert set(report.non_finite_numbers) <= set(NON_FINITE_TOKENS)


def _refuse(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


def _finite_float(text: str) -> float:
    return float(text) if math.isfinite(float(text)) else _refuse(text)


def test_non_finite_body_writes_raw_json_text_at_every_kind_of_place():
    """The injected body is not strict JSON, Python's parser finds the number where drawn:
    an existing number (nested), the schema's numeric property when missing, a list
    element, a new nested object; and non_finite_sent reports place and text."""
    rng = random.Random(0)
    body = {"queries": ["a", "b"], "return_scores": True, "extra": {"w": [0.5]}}
    paths, places = set(), set()
    for _ in range(200):
        token = NON_FINITE_TOKENS[rng.randrange(len(NON_FINITE_TOKENS))]
        raw = non_finite_body(body, token, rng, ["topk"])
        with pytest.raises(ValueError):  # strict JSON refuses it
            json.loads(raw, parse_constant=_refuse, parse_float=_finite_float)
        path = _non_finite_path(json.loads(raw))
        assert path is not None and token.encode() in raw
        paths.add(path)
        place, text = non_finite_sent(SimpleNamespace(query=[]), "http://127.0.0.1:1/retrieve", raw)
        assert text == token and place == ("body (nested)" if len(path) > 1 else "body")
        places.add(place)
    assert {("topk",), ("queries", 0), ("queries", 1), ("extra", "w", 0), ("drgym_fuzz_nested", "values", 1)} <= paths
    assert places == {"body", "body (nested)"}
    assert body == {"queries": ["a", "b"], "return_scores": True, "extra": {"w": [0.5]}}  # not modified
    assert non_finite_body([], "NaN", rng) == b"[NaN]" and non_finite_body(3, "1e400", rng) == b"1e400"
    assert non_finite_sent(SimpleNamespace(query=[]), "http://127.0.0.1:1/retrieve", b'{"topk": 3, "q": "NaN"}') is None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    close_after_422 = False

    def _send(self, status: int, body: bytes, close: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(422, b'{"detail": []}', type(self).close_after_422)

    def do_GET(self):  # noqa: N802
        self._send(200, b'{"status": "ok"}', False)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("close", [False, True])
def test_non_finite_check_wants_422_strict_json_and_a_usable_connection(close):
    """non_finite_rejected fails a 500, a 422 echoing NaN, and a 422 that closes the
    connection; it passes a 422 on a connection that then answers GET /health."""
    handler = type("H", (_Handler,), {"close_after_422": close})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/retrieve"
        req = requests.Request("POST", url, data=b'{"queries": ["a"], "topk": NaN}',
                               headers={"Content-Type": "application/json"}).prepare()
        case = SimpleNamespace(operation=SimpleNamespace(query=[]))

        def answer(status, content=b'{"detail": []}'):
            return SimpleNamespace(request=req, status_code=status, content=content)

        with pytest.raises(AssertionError, match="NaN in the body answered 500"):
            non_finite_rejected(None, answer(500), case)
        with pytest.raises(AssertionError, match="not strict JSON"):
            non_finite_rejected(None, answer(422, b'{"detail": [{"input": NaN}]}'), case)
        if close:
            with pytest.raises(AssertionError, match="closes the connection"):
                non_finite_rejected(None, answer(422), case)
        else:
            assert non_finite_rejected(None, answer(422), case) is None
        finite = requests.Request("POST", url, data=b'{"queries": ["a"], "topk": 1}').prepare()
        assert non_finite_rejected(None, SimpleNamespace(request=finite, status_code=500, content=b""), case) is True
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
def test_fuzz_real_server_1000_cases(hotpotqa_engine):
    """The real ``drgym serve`` (its own uvicorn process) fuzzed without keys and with
    ``--api-keys`` (then schemathesis also checks that a missing key gets 401): at least
    1,000 generated cases in all, 0 answers of 5xx, every answer conforming to the schema.
    ``scripts/fuzz_api.py`` is the same run writing JSON for the README."""
    args = ["--index-dir", str(hotpotqa_engine.folder), "--cache-size", "0"]
    reports = [fuzz_cli_server(args, max_examples=150, seed=0),
               fuzz_cli_server(args, max_examples=100, seed=1, api_key="fuzz-key-3c9e1a")]
    for r in reports:
        _assert_clean(r)
    total = summarize(reports)
    assert total["cases"] >= 1000 and total["server_errors"] == 0, total
    assert total["non_finite_cases"] >= 100 and total["non_finite_server_errors"] == 0, total
    assert "401" in total["statuses"]["GET /search"]
