"""Hostile input and secrets: ``/fetch`` only looks URLs up in the local store (never opens a
file or a socket for them), API keys are compared in constant time and never printed,
logged or stored (server, rollout run directories, recordings), and ``drgym serve`` binds
127.0.0.1 unless told otherwise."""

from __future__ import annotations

import logging
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from drgym.search.wire import ServerSettings
from server_helpers import running_server

GOOD_QUERY = "Demon Dice collectible dice game by Lester Smith"

# -- /fetch never opens what it is given ---------------------------------------------------

_AUDIT: list | None = None  # events recorded while a `watching()` block runs
_AUDIT_LOCK = threading.Lock()
_WATCHED = ("open", "socket.connect", "socket.getaddrinfo", "urllib.Request", "subprocess.Popen", "os.system")


def _hook(event: str, args: tuple) -> None:
    if _AUDIT is not None and event in _WATCHED:
        with _AUDIT_LOCK:
            _AUDIT.append((event, args))


_HOOK_ADDED = False


@contextmanager
def watching():
    """Record file opens, socket connects/lookups, URL requests and subprocesses of every
    thread of this process (the server runs in a thread here) while the block runs.
    Audit hooks cannot be removed, so one hook is added once and switched by ``_AUDIT``."""
    global _AUDIT, _HOOK_ADDED
    if not _HOOK_ADDED:
        sys.addaudithook(_hook)
        _HOOK_ADDED = True
    events: list = []
    _AUDIT = events
    try:
        yield events
    finally:
        _AUDIT = None


HOSTILE_URLS = [
    "file:///etc/passwd",
    "/etc/passwd",
    "../../etc/passwd",
    "../../../../../../etc/passwd%00.html",
    "..%2F..%2Fetc%2Fpasswd",
    "https://en.wikipedia.org/wiki/../../../../etc/passwd",
    "http://127.0.0.1:22/",
    "http://localhost:22/etc/passwd",
    "http://169.254.169.254/latest/meta-data/",
    "gopher://127.0.0.1:25/xHELO",
    "http://[::1",  # not parseable as a URL: still just a key
]


def test_fetch_looks_hostile_urls_up_as_keys_and_never_opens_them(hotpotqa_engine, tmp_path):
    engine = hotpotqa_engine
    looked_up: list[str] = []
    real_fetch = engine.docstore.fetch

    def spy(url):
        looked_up.append(url)
        return real_fetch(url)

    engine.docstore.fetch = spy
    try:
        with running_server(engine) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
            http.get("/health")  # the client's connection is open before watching starts
            for url in HOSTILE_URLS:
                with watching() as events:
                    r = http.get("/fetch", params={"url": url})
                assert (r.status_code, r.json()) == (404, {"detail": "URL not found."}), (url, r.text)
                opened = [a[0] for e, a in events if e == "open"]
                assert not [p for p in opened if "passwd" in str(p) or "meta-data" in str(p)], (url, opened)
                # the only file the lookup may open is the index's own docstore (a new thread's connection)
                assert all(str(engine.folder) in str(p) or str(p).endswith((".py", ".pyc", ".so")) for p in opened), opened
                connects = [a for e, a in events if e in ("socket.connect", "socket.getaddrinfo")]
                assert not connects, (url, connects)  # the server opens no socket for a fetch
                assert not [e for e, _ in events if e in ("urllib.Request", "subprocess.Popen", "os.system")], url
            # the watcher works: it sees a file opened and a socket connected in the block
            (tmp_path / "probe").write_text("x")
            with watching() as events:
                (tmp_path / "probe").read_text()
                httpx.get(f"{srv.url}/health")  # a new connection
            assert ("open" in {e for e, _ in events}) and ("socket.connect" in {e for e, _ in events}), events
        assert looked_up == [u.rstrip("\n") for u in HOSTILE_URLS]  # every URL reached the store as a key
        # a real document still comes back
        hit = engine.search(GOOD_QUERY, 1)[0]
        with running_server(engine) as srv:
            assert httpx.get(f"{srv.url}/fetch", params={"url": hit.url}, timeout=60).status_code == 200
    finally:
        engine.docstore.fetch = real_fetch


# -- API keys --------------------------------------------------------------------------


SERVER_KEY = "srv-key-8d3f27c1b9"


def test_api_keys_are_compared_in_constant_time(hotpotqa_engine, monkeypatch):
    """Every configured key is checked with hmac.compare_digest (no early exit on the first
    mismatching byte or key), for a right, a wrong and a missing key."""
    import hmac

    from drgym.server import app as app_module

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    keys = [SERVER_KEY, "other-key-0000"]
    with running_server(hotpotqa_engine, settings=ServerSettings(api_keys=",".join(keys))) as srv:
        p = {"query": GOOD_QUERY, "k": 1}
        for sent, status in [(SERVER_KEY, 200), ("other-key-0000", 200), (SERVER_KEY[:-1], 401), ("", 401),
                             (None, 401), ("ключ", 401)]:
            calls.clear()
            headers = {} if sent is None else {"x-api-key": sent.encode("utf-8")}  # raw bytes: non-ASCII too
            assert httpx.get(f"{srv.url}/search", params=p, headers=headers).status_code == status, sent
            assert sorted(b for _, b in calls) == sorted(k.encode() for k in keys), sent  # all keys, each once
            assert all(isinstance(a, bytes) for a, _ in calls)
    # the OpenAPI schema declares the key as an apiKey scheme only when keys are set
    with running_server(hotpotqa_engine, settings=ServerSettings(api_keys=SERVER_KEY)) as srv:
        spec = httpx.get(f"{srv.url}/openapi.json").json()
        assert spec["components"]["securitySchemes"]["APIKeyHeader"] == {
            "type": "apiKey", "in": "header", "name": "x-api-key",
            "description": "API key; required because this server was started with --api-keys"}
        assert "401" in spec["paths"]["/search"]["get"]["responses"]
    with running_server(hotpotqa_engine) as srv:
        spec = httpx.get(f"{srv.url}/openapi.json").json()
        assert "securitySchemes" not in spec.get("components", {})
        assert "401" not in spec["paths"]["/search"]["get"]["responses"]


def test_server_settings_never_show_the_keys():
    s = ServerSettings(api_keys=f"{SERVER_KEY},k2-secret")
    assert SERVER_KEY not in repr(s) and SERVER_KEY not in str(s) and SERVER_KEY not in str(s.model_dump())
    assert s.key_set() == {SERVER_KEY, "k2-secret"}


def _serve_cli(args: list[str], monkeypatch, engine, env: dict | None = None) -> tuple[dict, str]:
    """Run ``drgym serve ARGS`` in-process with uvicorn.run and the index load stubbed out;
    returns (uvicorn.run keyword arguments, everything printed)."""
    import uvicorn
    from typer.testing import CliRunner

    from drgym.cli import app
    from drgym.cli import serve as serve_cli

    seen: dict = {}
    monkeypatch.setattr(serve_cli, "load_backend", lambda settings, **kw: engine)
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: seen.update(kw, app=app_))
    for var in ("DRGYM_HOST", "DRGYM_PORT", "DRGYM_API_KEYS"):
        monkeypatch.delenv(var, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(app, ["serve", *args])
    assert res.exit_code == 0, res.output
    return seen, res.output


class _NoClose:
    """The shared session engine, with close() a no-op (the stubbed server never owns it)."""

    def __init__(self, engine):
        self._e = engine

    def __getattr__(self, name):
        return getattr(self._e, name)

    def __repr__(self):
        return repr(self._e)

    def close(self):
        pass


def test_serve_binds_loopback_by_default_and_prints_no_key(hotpotqa_engine, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    engine = _NoClose(hotpotqa_engine)
    seen, out = _serve_cli(["--port", "0"], monkeypatch, engine)
    assert seen["host"] == "127.0.0.1" and "http://127.0.0.1:" in out and "auth=off" in out
    seen, out = _serve_cli(["--port", "0", "--api-keys", f"{SERVER_KEY},second-key-77"], monkeypatch, engine)
    assert seen["host"] == "127.0.0.1" and "auth=on" in out
    assert seen["app"].state.settings.key_set() == {SERVER_KEY, "second-key-77"}
    seen, out2 = _serve_cli(["--port", "0"], monkeypatch, engine, env={"DRGYM_API_KEYS": SERVER_KEY})
    assert "auth=on" in out2 and seen["app"].state.settings.key_set() == {SERVER_KEY}
    for text in (out, out2, caplog.text):
        assert SERVER_KEY not in text and "second-key-77" not in text
    # binding elsewhere is an explicit choice
    seen, _ = _serve_cli(["--port", "0", "--host", "0.0.0.0"], monkeypatch, engine)
    assert seen["host"] == "0.0.0.0"
    assert ServerSettings().host == "127.0.0.1"


def _all_text(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_rollout_stores_and_logs_no_key(hotpotqa_engine, chat_server, tmp_path, monkeypatch, caplog, capfd):
    """A whole ``drgym rollout`` with keys everywhere: an OpenAI-compatible policy with
    ``-p api_key=...`` (and OPENAI_API_KEY set), a drgym search server that requires a key
    (the client reads DRGYM_API_KEY). Every file of the run directory, everything printed
    and every log record is searched for each key."""
    import json
    import re

    from typer.testing import CliRunner

    from drgym.cli import app

    policy_key, env_openai_key = "sk-policy-5e1b0c9a77", "sk-env-openai-2f4d81"
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_API_KEY", env_openai_key)
    monkeypatch.setenv("DRGYM_API_KEY", SERVER_KEY)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def responder(body):
        last = body["messages"][-1]["content"]
        if "<information>" in last:
            title = re.search(r"Doc 1 \(Title: (.*?), URL:", last).group(1)
            return f"<answer> {title} </answer>"
        return "<search> " + last.removeprefix("Question: ") + " "

    chat_server.responder = responder
    out = tmp_path / "run"

    def rollout(key: str, n: int):
        return CliRunner().invoke(app, [
            "rollout", "--policy", f"openai:fake@{chat_server.url}", "-p", f"api_key={key}", "-p", "tools=false",
            "--backend", srv.url, "--n", str(n), "--out", str(out), "--no-progress", "--no-plots"])

    with running_server(hotpotqa_engine, settings=ServerSettings(api_keys=SERVER_KEY)) as srv:
        res = rollout(policy_key, 2)
        stats = httpx.get(f"{srv.url}/health").json()["stats"]
        # a rerun with another key resumes the same run (a key is not part of its identity)
        again = rollout("sk-rotated-key-000", 3)
    assert res.exit_code == 0, res.output
    assert again.exit_code == 0 and "1 new episodes, 2 resumed" in again.output.replace("\n", " "), again.output
    assert stats["requests"] >= 2  # the searches went through the keyed server...
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 3 and all(t["steps"][0]["results"] for t in trajs)  # ...and found results
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["policy_options"]["api_key"] == "<redacted>"
    assert cfg["identity"]["policy_options"]["api_key"] == "<redacted>"
    files = _all_text(out)
    assert {p.name for p in files} >= {"config.json", "trajectories.jsonl", "metrics.json"}
    captured = capfd.readouterr()
    for key in (policy_key, env_openai_key, SERVER_KEY):
        for p, data in files.items():
            assert key.encode() not in data, (key, p)
        for text in (res.output, caplog.text, captured.out, captured.err):
            assert key not in text, key


def test_recordings_and_errors_hold_no_key(tmp_path, monkeypatch, caplog):
    """A web backend recorded with its key given as an option and in the environment, while
    the provider fails with answers that quote the key: the SQLite recording, the error
    messages and the logs never hold it."""
    from _fake_providers import API_KEY, FakeProviders

    from drgym.errors import AuthError, SearchError
    from drgym.search.registry import make_backend

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SERPER_API_KEY", API_KEY)
    db = tmp_path / "web.sqlite"
    messages = []
    with FakeProviders() as fp:
        rec = make_backend("serper", mode="record", store=db, api_key=API_KEY, base_url=f"{fp.base}/serper",
                           retry={"backoff_s": 0.01, "attempts": 2})
        echo = f'{{"message": "quota exceeded for key {API_KEY}"}}'
        fp.plan("/serper/search", (500, {}, echo), (500, {}, echo))  # retried, then recorded as a failure
        with pytest.raises(SearchError) as e:
            rec.search("capital of France", k=3)
        messages.append(str(e.value))
        fp.plan("/serper/search", (404, {}, f"no such route for {API_KEY}"))  # a non-retryable 4xx
        with pytest.raises(SearchError) as e:
            rec.search("Danube river", k=3)
        messages.append(str(e.value))
        assert [r.title for r in rec.search("Paris", k=2)]  # a good search is recorded too
        rec.close()
        bad = make_backend("serper", api_key="wrong-key-4e7a1d", base_url=f"{fp.base}/serper", retry={"attempts": 1})
        fp.plan("/serper/search", (401, {}, '{"message": "Unauthorized: wrong-key-4e7a1d"}'))
        with pytest.raises(AuthError) as e:
            bad.search("Paris", k=1)
        messages.append(str(e.value))
        bad.close()
    assert "quota exceeded for key <redacted>" in messages[0] and "<redacted>" in messages[1]
    assert "Unauthorized: <redacted>" in messages[2]
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"quota exceeded for key <redacted>" in data  # the failure was recorded, masked
    for key in (API_KEY, "wrong-key-4e7a1d"):
        assert key.encode() not in data
        assert all(key not in m for m in messages)
        assert key not in caplog.text
