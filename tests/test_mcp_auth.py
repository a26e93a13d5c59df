"""``drgym mcp --transport http`` off loopback: API keys (``--api-keys`` / ``DRGYM_API_KEYS``,
the keys of ``drgym serve``), the Host and Origin checks on every bind address with their
allow-lists (``--allowed-hosts`` / ``--allowed-origins``), and the warning for a
non-loopback bind without keys. Servers bind a free port on 0.0.0.0 or 127.0.0.1 and are
reached through 127.0.0.1; a foreign name is a spoofed ``Host`` header."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import httpx
import pytest

from drgym.errors import AuthError, ConfigError
from drgym.search.base import SearchBackend
from drgym.search.mcp import MCPSearchBackend
from drgym.server.app import BAD_KEY_DETAIL
from drgym.server.mcp import create_mcp_server, is_loopback, streamable_http_app, transport_security
from server_helpers import free_port, running_command, serving_app
from drgym.types import Document, SearchResult

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
JSON_RPC = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


class Three(SearchBackend):
    """Three fixed hits for any query."""

    name = "three"
    max_k = 100
    deterministic = True

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        return [SearchResult(doc_id=f"d{i}", url=f"https://x.example/{i}", title=f"T{i}", text=f"text {i}",
                             score=3.0 - i, rank=i + 1) for i in range(min(k, 3))]

    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        return [self.search(q, k) for q in queries]

    def fetch(self, url: str) -> Document:
        return Document(doc_id=url, url=url, title="T", text="text")

    def identity(self) -> dict:
        return {"kind": "three"}


def initialize(port: int, **headers: str) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/mcp", json=INIT, headers={**JSON_RPC, **headers}, timeout=30)


def test_api_keys_and_foreign_host_and_origin_on_a_wildcard_bind():
    app = streamable_http_app(create_mcp_server(Three()), host="0.0.0.0", api_keys=["k-one", "k-two"])
    with serving_app(app, "0.0.0.0") as port:
        for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": "K-ONE"}, {"x-api-key": "k-one-"},
                        {"Authorization": "Bearer k-one"}):
            r = initialize(port, **headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json() == {"jsonrpc": "2.0", "id": None,
                                "error": {"code": -32001, "message": f"AuthError: {BAD_KEY_DETAIL}"}}
        assert initialize(port, **{"x-api-key": "k-one"}).status_code == 200
        assert initialize(port, **{"x-api-key": "k-two"}).status_code == 200
        # the key does not lift the Host and Origin checks
        r = initialize(port, **{"x-api-key": "k-one", "Host": "evil.example"})
        assert r.status_code == 421 and "Invalid Host header" in r.text
        r = initialize(port, **{"x-api-key": "k-one", "Host": f"evil.example:{port}"})
        assert r.status_code == 421
        r = initialize(port, **{"x-api-key": "k-one", "Origin": "http://evil.example"})
        assert r.status_code == 403 and "Invalid Origin header" in r.text
        r = initialize(port, **{"x-api-key": "k-one", "Origin": f"http://127.0.0.1.evil.example:{port}"})
        assert r.status_code == 403
        # the loopback names pass, with or without a port, and so do their origins
        for host in ("localhost", f"localhost:{port}", "127.0.0.1"):
            assert initialize(port, **{"x-api-key": "k-one", "Host": host}).status_code == 200, host
        assert initialize(port, **{"x-api-key": "k-one", "Origin": "http://localhost:3000"}).status_code == 200

        url = f"http://127.0.0.1:{port}/mcp"
        with pytest.raises(AuthError, match="refused the connection: Invalid or missing API Key"):
            MCPSearchBackend(url, api_key="wrong", retry={"attempts": 3}).search("q", 2)
        b = MCPSearchBackend(url, api_key="k-two")
        assert [(h.doc_id, h.score) for h in b.search("q", 2)] == [("d0", 3.0), ("d1", 2.0)]
        assert b.credentials() == ("k-two",)
        b.close()


def test_key_from_the_environment(monkeypatch):
    app = streamable_http_app(create_mcp_server(Three()), host="127.0.0.1", api_keys=["k-env"])
    with serving_app(app, "127.0.0.1") as port:
        url = f"http://127.0.0.1:{port}/mcp"
        monkeypatch.delenv("DRGYM_API_KEY", raising=False)
        with pytest.raises(AuthError):
            MCPSearchBackend(url, retry={"attempts": 2}).search("q", 1)
        monkeypatch.setenv("DRGYM_API_KEY", "k-env")
        b = MCPSearchBackend(url)
        assert [h.doc_id for h in b.search("q", 1)] == ["d0"]
        b.close()


def test_allow_lists():
    app = streamable_http_app(create_mcp_server(Three()), host="0.0.0.0",
                              allowed_hosts="search.example.org, api.example.org:8443",
                              allowed_origins=["https://app.example.org", "http://tool.example.org:3000"])
    with serving_app(app, "0.0.0.0") as port:
        for host, status in [("search.example.org", 200), ("search.example.org:9000", 200),
                             ("api.example.org:8443", 200), ("api.example.org:8444", 421), ("api.example.org", 421),
                             ("evil.example", 421), ("search.example.org.evil.example", 421)]:
            assert initialize(port, Host=host).status_code == status, host
        for origin, status in [("https://app.example.org", 200), ("https://app.example.org:444", 200),
                               ("http://tool.example.org:3000", 200), ("http://tool.example.org:3001", 403),
                               ("https://search.example.org", 200),  # an accepted host's own origin
                               ("http://app.example.org", 403), ("https://evil.example", 403)]:
            assert initialize(port, Origin=origin).status_code == status, origin


def test_transport_security_settings():
    s = transport_security("192.0.2.5")  # a bound address is accepted as a Host
    assert {"192.0.2.5", "192.0.2.5:*", "127.0.0.1:*", "localhost:*", "[::1]:*"} <= set(s.allowed_hosts)
    assert s.enable_dns_rebinding_protection and "http://192.0.2.5:*" in s.allowed_origins
    assert "[2001:db8::1]:*" in transport_security("2001:db8::1").allowed_hosts
    assert not any("0.0.0.0" in h or h.startswith("[::]") for h in transport_security("::").allowed_hosts)
    for bad in ("http://search.example.org", "*", "*.example.org", "a/b"):
        with pytest.raises(ConfigError, match="allowed hosts are Host header values"):
            transport_security("0.0.0.0", allowed_hosts=bad)
    for bad in ("app.example.org", "*", "https://*.example.org", "https://app.example.org/path"):
        with pytest.raises(ConfigError, match="allowed origins are origins"):
            transport_security("0.0.0.0", allowed_origins=bad)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "0.0.0.0", "::",
                                     "192.0.2.5", "example.org")] == [True] * 5 + [False] * 4


# -- the CLI --------------------------------------------------------------------------------


@contextmanager
def cli_server(log_path, *args: str, env: dict | None = None):
    """``drgym mcp --transport http`` over the hotpotqa index on a free port; yields the port."""
    port = free_port()
    cmd = [sys.executable, "-m", "drgym", "mcp", "--corpus", "hotpotqa", "--method", "bm25", "--transport", "http",
           "--port", str(port), *args]
    with running_command(cmd, port, log_path, env=env):
        yield port


def test_cli_warns_on_an_open_bind_and_checks_host_and_origin(hotpotqa_engine, tmp_path, monkeypatch):
    monkeypatch.delenv("DRGYM_API_KEYS", raising=False)
    log = tmp_path / "open.log"
    with cli_server(log, "--host", "0.0.0.0", "--allowed-hosts", "search.example.org") as port:
        assert initialize(port).status_code == 200
        assert initialize(port, Host="search.example.org").status_code == 200
        assert initialize(port, Host="evil.example").status_code == 421
        assert initialize(port, Origin="http://evil.example").status_code == 403
    text = log.read_text()
    assert "WARNING: listening on 0.0.0.0 without --api-keys" in text and "auth=off" in text
    assert "Host accepted: 127.0.0.1, localhost, [::1], search.example.org)" in text
    assert "Traceback" not in text


def test_cli_api_keys_from_the_environment_as_drgym_serve(hotpotqa_engine, tmp_path):
    log = tmp_path / "keys.log"
    with cli_server(log, "--host", "127.0.0.1", env={"DRGYM_API_KEYS": "k-one,k-two"}) as port:
        assert initialize(port).status_code == 401
        assert initialize(port, **{"x-api-key": "k-three"}).status_code == 401
        assert initialize(port, **{"x-api-key": "k-two"}).status_code == 200
        b = MCPSearchBackend(f"http://127.0.0.1:{port}/mcp", api_key="k-one")
        assert [h.doc_id for h in b.search("Who wrote the novel Dracula?", 3)] == \
            [h.doc_id for h in hotpotqa_engine.search_batch(["Who wrote the novel Dracula?"], 3, method="bm25",
                                                            collapse="document")[0]]
        b.close()
    text = log.read_text()
    assert "WARNING" not in text and "auth=on" in text and "k-one" not in text


def test_cli_refuses_bad_security_options_in_one_line():
    from typer.testing import CliRunner

    from drgym.cli import app

    r = CliRunner().invoke(app, ["mcp", "--transport", "http", "--allowed-origins", "app.example.org"])
    assert r.exit_code == 2 and "allowed origins are origins such as" in r.output
    r = CliRunner().invoke(app, ["mcp", "--transport", "http", "--allowed-hosts", "https://search.example.org"])
    assert r.exit_code == 2 and "allowed hosts are Host header values" in r.output
    r = CliRunner().invoke(app, ["mcp", "--api-keys", "k-one"])  # stdio: no network to protect
    assert r.exit_code == 2 and "--api-keys applies to --transport http" in r.output
