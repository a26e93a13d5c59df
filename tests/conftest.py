"""Shared fixtures. Heavy objects (encoder, default index) load once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS_DIR = Path(__file__).resolve().parent
DATA = TESTS_DIR / "data"
SHARED = TESTS_DIR.parent.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` when present (a fresh clone has none: tests needing it skip)."""
    if not SHARED.exists():
        pytest.skip(f"{SHARED} is absent (a fresh clone has no ../shared); this test reads data that drgym may not ship.")
    return SHARED


# -- search engine fixtures (drgym.index, drgym.search.local) ----------------------------


@pytest.fixture(scope="session")
def session_drgym_home(tmp_path_factory) -> Path:
    """A session-wide temporary ``DRGYM_HOME`` holding the test indexes.

    Setting it also makes ``LocalSearchEngine.from_corpus(...)`` (and ``drgym`` commands
    run in subprocesses with the inherited environment) find the indexes built here
    instead of touching ``~/.cache/drgym``.
    """
    from envs_helpers import drgym_home

    with drgym_home(tmp_path_factory.mktemp("drgym_home")) as home:
        yield home


@pytest.fixture(scope="session")
def default_engine(session_drgym_home):
    """The wiki-default index (20,036 documents, Flat + BM25), built once per session.

    A :class:`drgym.search.local.LocalSearchEngine` with method ``"hybrid"``; use
    ``default_engine.with_method("dense")`` / ``("bm25")`` for the others (no reload).
    Built from the shipped embedding cache (no live encoding).
    """
    from drgym.search.local import LocalSearchEngine

    engine = LocalSearchEngine.from_corpus("wiki-default", method="hybrid", device="cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hotpotqa_engine(session_drgym_home):
    """The ``hotpotqa`` named corpus (994 HotpotQA paragraphs), Flat + BM25, hybrid."""
    from drgym.search.local import LocalSearchEngine

    engine = LocalSearchEngine.from_corpus("hotpotqa", method="hybrid", device="cpu")
    yield engine
    engine.close()


class ChatServer:
    """Loopback HTTP server answering ``POST /v1/chat/completions`` in the OpenAI chat format.

    ``responder(body) -> str | ("sleep", seconds, str) | (status, text)``: a string is the
    assistant content; a sleep tuple delays before answering (to force client timeouts);
    a status tuple sends that HTTP status with ``text`` as body. ``handler(body, n) ->
    (status, payload)``, when set, answers instead with any JSON payload (``n`` counts
    requests from 1). ``requests`` logs bodies, ``headers`` their path and Authorization.

    Every request is validated first (:func:`chat_protocol.request_errors`: message
    roles, the tool-call pairing rule, argument JSON, tools, stop). A request that breaks
    a rule is answered HTTP 400 like OpenAI's ``invalid_request_error`` and logged in
    ``violations``; the ``chat_server`` fixture fails the test if there is any.
    """

    def __init__(self) -> None:
        import http.server
        import json as _json
        import threading
        import time as _time

        from chat_protocol import request_errors

        self.requests: list = []
        self.headers: list = []
        self.violations: list = []
        self.responder = lambda body: "{}"
        self.handler = None
        srv = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                srv.requests.append(body)
                srv.headers.append({"path": self.path, "auth": self.headers.get("Authorization")})
                errors = request_errors(body)
                status, payload = 200, None
                if errors:
                    srv.violations.append({"request": len(srv.requests), "errors": errors, "messages": body.get("messages")})
                    status, out = 400, _json.dumps({"error": {"message": "; ".join(errors), "type": "invalid_request_error"}})
                elif srv.handler is not None:
                    status, data = srv.handler(body, len(srv.requests))
                    out = (status, _json.dumps(data))
                else:
                    out = srv.responder(body)
                if isinstance(out, tuple) and out[0] == "sleep":
                    _time.sleep(out[1])
                    out = out[2]
                if isinstance(out, tuple):
                    status, payload = out[0], out[1].encode()
                elif errors:
                    payload = out.encode()
                else:
                    payload = _json.dumps({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                           "choices": [{"index": 0, "finish_reason": "stop",
                                                        "message": {"role": "assistant", "content": out}}]}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    """A :class:`ChatServer` on 127.0.0.1 (closed after the test, which fails if any
    request it got broke the chat protocol)."""
    s = ChatServer()
    yield s
    s.close()
    assert not s.violations, f"invalid chat requests were sent: {s.violations}"


@pytest.fixture(scope="session")
def bm25_backend():
    """A small real backend for env tests: bm25s over HippoRAG's 2,884 HotpotQA + MuSiQue
    paragraphs (``tests/envs_helpers.py``; builds in about 2 s)."""
    from envs_helpers import BM25Backend

    return BM25Backend("hipporag")
