"""``drgym mcp`` (the engine as MCP tools) and the ``mcp:`` search backend, over the 994
HotpotQA paragraphs: the SDK's own client over stdio (the real CLI in a subprocess) and
streamable HTTP (a loopback server on a free port), the same rankings as the local
engine, tool errors for bad calls, retries and reconnection, record and replay, and a
BrowseComp-Plus-shaped server."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Annotated, Any

import pytest
from pydantic import Field  # module level: the SDK evaluates the test tools' annotations

from drgym.errors import BadQueryError, ConfigError, DocumentNotFoundError, SearchError, ServiceUnavailableError
from drgym.search.mcp import MCPSearchBackend, parse_spec, record_fields
from drgym.search.registry import check_spec, make_backend, record_name
from server_helpers import free_port, running_command, serving_app

QUERIES = ["Demon Dice collectible dice game by Lester Smith", "Who wrote the novel Dracula?", "Ångström",
           "capital of Norway"]
GOOD_QUERY = QUERIES[0]
GOOD_TITLE = "Demon Dice"  # hand-checked: the HotpotQA paragraph of that title is the answer


# -- servers -----------------------------------------------------------------------------


@contextmanager
def serve_app(app, port: int | None = None):
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a thread, with drgym's
    options; yields the port and stops the server on exit."""
    from drgym.server.app import uvicorn_options

    with serving_app(app, "127.0.0.1", port, **uvicorn_options()) as p:
        yield p


@contextmanager
def serve_mcp(backend, port: int | None = None):
    """``backend``'s drgym MCP server over streamable HTTP; yields the endpoint URL."""
    from drgym.server.mcp import create_mcp_server, streamable_http_app

    with serve_app(streamable_http_app(create_mcp_server(backend)), port) as p:
        yield f"http://127.0.0.1:{p}/mcp"


@pytest.fixture(scope="module")
def mcp_url(hotpotqa_engine):
    with serve_mcp(hotpotqa_engine) as url:
        yield url


def drgym_mcp_command(*extra: str) -> list[str]:
    # the subprocess finds the index the session fixture built (DRGYM_HOME is inherited)
    return [sys.executable, "-m", "drgym", "mcp", "--corpus", "hotpotqa", *extra]


def run(coro):
    return asyncio.run(coro)


def texts(result) -> str:
    return " ".join(c.text for c in result.content if getattr(c, "type", None) == "text")


# -- the SDK's own client against drgym mcp ----------------------------------------------


async def check_server(server: Any, engine) -> None:
    """Everything a client sees from drgym's MCP server, in one session."""
    from mcp import Client

    async with Client(server, cache=None, read_timeout_seconds=120) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"search", "get_document", "fetch"}
        props = tools["search"].input_schema["properties"]
        assert tools["search"].input_schema["required"] == ["query"]
        assert props["k"]["minimum"] == 1 and props["k"]["maximum"] == 100 and props["k"]["default"] == 10
        assert set(tools["get_document"].input_schema["properties"]) == {"docid"}
        assert set(tools["fetch"].input_schema["properties"]) == {"url"}

        for q in QUERIES:
            for k in (3, 10):
                r = await client.call_tool("search", {"query": q, "k": k})
                assert not r.is_error, texts(r)
                want = engine.search(q, k)
                got = r.structured_content["results"]
                assert r.structured_content["k"] == k and len(got) == len(want) > 0
                assert [(h["rank"], h["doc_id"], h["title"], h["url"], h["text"], h["score"], h["source"],
                         h["metadata"]) for h in got] == \
                    [(w.rank, w.doc_id, w.title, w.url, w.text, w.score, w.source, w.metadata) for w in want]
        r = await client.call_tool("search", {"query": GOOD_QUERY})  # default k: 10, as drgym serve
        assert [h["doc_id"] for h in r.structured_content["results"]] == [w.doc_id for w in engine.search(GOOD_QUERY, 10)]
        top = r.structured_content["results"][0]
        assert top["title"] == GOOD_TITLE and "Lester Smith" in top["text"]

        for args, msg in (({"query": GOOD_QUERY, "k": 0}, "BadQueryError: k must be between 1 and 100, got 0."),
                          ({"query": GOOD_QUERY, "k": 101}, "BadQueryError: k must be between 1 and 100, got 101."),
                          ({"query": " \t"}, "BadQueryError: No query text in request"),
                          ({"query": ""}, "BadQueryError: No query text in request"),
                          ({"query": GOOD_QUERY, "k": True}, "must be a JSON integer"),  # not k=1, as drgym serve
                          ({"query": GOOD_QUERY, "k": "5"}, "must be a JSON integer"),  # not k=5
                          ({"query": GOOD_QUERY, "k": 2.5}, "valid integer"),
                          ({"query": 5}, "valid string"),
                          ({"k": 3}, "query")):
            r = await client.call_tool("search", args)
            assert r.is_error and msg in texts(r), (args, texts(r))

        doc = await client.call_tool("get_document", {"docid": top["doc_id"]})
        want = engine.get(top["doc_id"])
        assert not doc.is_error and doc.structured_content == {"doc_id": want.doc_id, "url": want.url,
                                                               "title": want.title, "text": want.text,
                                                               "source": want.source, "metadata": want.metadata}
        page = await client.call_tool("fetch", {"url": top["url"]})
        assert not page.is_error and page.structured_content == doc.structured_content
        r = await client.call_tool("get_document", {"docid": "hotpotqa-no-such-doc"})
        assert r.is_error and "DocumentNotFoundError" in texts(r) and "'hotpotqa-no-such-doc'" in texts(r)
        r = await client.call_tool("fetch", {"url": "https://en.wikipedia.org/wiki/No_such_page_xyz"})
        assert r.is_error and "https://en.wikipedia.org/wiki/No_such_page_xyz" in texts(r)

        # after every bad call the server still answers
        r = await client.call_tool("search", {"query": GOOD_QUERY, "k": 1})
        assert r.structured_content["results"][0]["title"] == GOOD_TITLE


def test_sdk_client_over_streamable_http(mcp_url, hotpotqa_engine):
    run(check_server(mcp_url, hotpotqa_engine))


def test_sdk_client_over_stdio_runs_the_cli(hotpotqa_engine):
    """``python -m drgym mcp --transport stdio`` started by the SDK's stdio client."""
    from mcp.client.stdio import StdioServerParameters

    cmd = drgym_mcp_command("--transport", "stdio", "--method", "hybrid")
    run(check_server(StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ)), hotpotqa_engine))


def test_cli_http_transport_serves_and_stops(hotpotqa_engine, tmp_path):
    """``drgym mcp --transport http`` on a free loopback port: the same hits; stopped after."""
    from mcp import Client

    port = free_port()
    log = tmp_path / "server.log"
    cmd = drgym_mcp_command("--transport", "http", "--host", "127.0.0.1", "--port", str(port), "--max-k", "20")
    with running_command(cmd, port, log):

        async def check() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp", cache=None) as client:
                r = await client.call_tool("search", {"query": GOOD_QUERY, "k": 5})
                assert [h["doc_id"] for h in r.structured_content["results"]] == \
                    [w.doc_id for w in hotpotqa_engine.search(GOOD_QUERY, 5)]
                r = await client.call_tool("search", {"query": GOOD_QUERY, "k": 21})  # --max-k 20
                assert r.is_error and "k must be between 1 and 20, got 21." in texts(r)

        run(check())
    assert "drgym mcp:" in log.read_text() and "Traceback" not in log.read_text()


def test_cli_rejects_bad_options_in_one_line():
    from typer.testing import CliRunner

    from drgym.cli import app

    r = CliRunner().invoke(app, ["mcp", "--transport", "sse"])
    assert r.exit_code == 2 and "--transport must be one of stdio, http, got 'sse'." in r.output
    r = CliRunner().invoke(app, ["mcp", "--max-k", "0"])
    assert r.exit_code == 2 and "invalid settings: max_k" in r.output


# -- the mcp: backend ---------------------------------------------------------------------


def test_backend_over_http_ranks_as_local(mcp_url, hotpotqa_engine):
    with make_backend(f"mcp:{mcp_url}") as b:
        assert isinstance(b, MCPSearchBackend) and b.transport == "http"
        for k in (1, 4, 10):
            assert b.search_batch(QUERIES, k) == hotpotqa_engine.search_batch(QUERIES, k)
        assert [b.search(q, 7) for q in QUERIES] == [hotpotqa_engine.search(q, 7) for q in QUERIES]
        assert [r.to_dict() for r in b.search(QUERIES[1], 5)] == [r.to_dict() for r in hotpotqa_engine.search(QUERIES[1], 5)]
        hit = b.search(GOOD_QUERY, 1)[0]
        assert hit.title == GOOD_TITLE
        assert b.fetch(hit.url) == hotpotqa_engine.fetch(hit.url)
        assert b.get(hit.doc_id) == hotpotqa_engine.get(hit.doc_id)
        ident = b.identity()
        assert ident["kind"] == "mcp" and ident["server"] == mcp_url and ident["server_name"] == "drgym"
        assert ident["engine"]["identity"] == hotpotqa_engine.identity() and ident["max_k"] == 100


def test_backend_errors_are_the_http_clients(mcp_url):
    with make_backend(f"mcp:{mcp_url}") as b:
        with pytest.raises(BadQueryError, match="k must be between 1 and 100, got 0"):
            b.search(GOOD_QUERY, 0)
        with pytest.raises(BadQueryError, match="query 0 is empty"):
            b.search("  ", 3)
        b.search(GOOD_QUERY, 1)
        b.max_k = 1000  # let a k above the server's limit through: the server's tool error comes back as BadQueryError
        with pytest.raises(BadQueryError, match=r"^mcp: k must be between 1 and 100, got 150\.$"):
            b.search(GOOD_QUERY, 150)
        with pytest.raises(DocumentNotFoundError, match="'hotpotqa-no-such-doc'"):
            b.get("hotpotqa-no-such-doc")
        with pytest.raises(DocumentNotFoundError, match="URL not found: 'https://nowhere.test/x'"):
            b.fetch("https://nowhere.test/x")
        assert b.search(GOOD_QUERY, 1)[0].title == GOOD_TITLE  # the session survived every error


def test_backend_over_stdio_ranks_as_local(hotpotqa_engine):
    bm25 = hotpotqa_engine.with_method("bm25")
    cmd = " ".join(drgym_mcp_command("--method", "bm25"))
    with make_backend(f"mcp:stdio:{cmd}") as b:
        assert b.transport == "stdio"
        assert b.search_batch(QUERIES, 5) == bm25.search_batch(QUERIES, 5)
        assert b.identity()["engine"]["identity"]["method"] == "bm25"
        with pytest.raises(DocumentNotFoundError, match="'nope'"):
            b.get("nope")


def test_unreachable_server_is_service_unavailable_after_retries(monkeypatch):
    import types

    import tenacity

    url = f"http://127.0.0.1:{free_port()}/mcp"
    waits: list[float] = []
    monkeypatch.setattr(tenacity.nap, "time", types.SimpleNamespace(sleep=waits.append))  # the retry's pauses, recorded
    with MCPSearchBackend(url, retry={"attempts": 2, "backoff_s": 0.01}) as b:
        with pytest.raises(ServiceUnavailableError, match=r"could not connect .*after 2 attempt\(s\)"):
            b.search(GOOD_QUERY, 3)
    # one pause between the two attempts: the backoff plus its jitter (up to one backoff), nothing longer
    assert len(waits) == 1 and 0.01 <= waits[0] <= 0.02, waits


def test_restarted_server_is_reconnected(hotpotqa_engine):
    """The server goes away mid-run and comes back on the same port: the call waits and succeeds."""
    port = free_port()
    with serve_mcp(hotpotqa_engine, port) as url:
        b = MCPSearchBackend(url, retry={"backoff_s": 0.2, "max_backoff_s": 0.5, "reconnect_s": 30})
        assert b.search(GOOD_QUERY, 3) == hotpotqa_engine.search(GOOD_QUERY, 3)
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["hits"] = b.search(QUERIES[3], 3)
        except Exception as e:  # the assertion below shows it
            result["error"] = e

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(1.0)  # the call is retrying against a closed port
    with serve_mcp(hotpotqa_engine, port):
        worker.join(60)
        assert result.get("hits") == hotpotqa_engine.search(QUERIES[3], 3), result
    b.close()


def _episode(backend) -> dict:
    from drgym.envs.searchqa import SearchQAEnv
    from drgym.records import Task

    env = SearchQAEnv(backend=backend, tasks=[Task("q1", "Who created the game Demon Dice?", ["Lester Smith"])],
                      reward="f1", max_turns=5, max_searches=3, max_fetches=1)
    env.reset(seed=0)
    for a in ("<search> Demon Dice collectible dice game </search>",
              "<fetch> https://en.wikipedia.org/wiki/Demon_Dice </fetch>", "<answer> Lester Smith </answer>"):
        *_, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    d = env.trajectory.to_dict()
    d["timings"] = {}
    for step in d["steps"]:
        step["latency_s"] = 0.0  # wall time differs; everything else must not
    return d


def test_env_episode_over_mcp_equals_local(mcp_url, hotpotqa_engine):
    with make_backend(f"mcp:{mcp_url}") as b:
        over_mcp = _episode(b)
    local = _episode(hotpotqa_engine)
    assert over_mcp == local
    assert over_mcp["reward"] == 1.0 and "Lester Smith" in over_mcp["steps"][1]["observation"]


def test_record_and_replay_over_mcp(mcp_url, hotpotqa_engine, tmp_path):
    store = tmp_path / "mcp.sqlite"
    with make_backend(f"record:{store}#mcp:{mcp_url}") as rec:
        recorded = rec.search_batch(QUERIES, 5)
        doc = rec.fetch(recorded[0][0].url)
        with pytest.raises(DocumentNotFoundError):
            rec.fetch("https://nowhere.test/x")
        assert rec.identity()["inner"]["kind"] == "mcp"
    assert recorded == hotpotqa_engine.search_batch(QUERIES, 5)
    # replay needs no server: the recording is keyed by the spec
    with make_backend(f"replay:{store}") as rep:
        assert rep.inner is None
        assert rep.search_batch(QUERIES, 5) == recorded
        assert rep.fetch(recorded[0][0].url) == doc
        with pytest.raises(DocumentNotFoundError):
            rep.fetch("https://nowhere.test/x")
    with make_backend(f"replay:{store}#mcp:{mcp_url}/") as rep:  # trailing slash: the same key
        assert rep.search(QUERIES[1], 5) == recorded[1]


# -- a BrowseComp-Plus-shaped server ----------------------------------------------------


DOCS = {"101": "Lester Smith designed Demon Dice, a collectible dice game.",
        "102": "Dracula is an 1897 novel by Bram Stoker.",
        "103": "Oslo is the capital of Norway.",
        "104": "Anders Ångström was a Swedish physicist.",
        "105": "Dice games use one or more dice.",
        "106": "Norway is a Nordic country."}


def browsecomp_like_server():
    """BrowseComp-Plus's tools: ``search(query)`` with a fixed k of 5 returning
    ``[{"docid", "score", "snippet"}]`` and ``get_document(docid)`` returning
    ``{"docid", "text"}`` or None; plus a text-only copy of search (no structured output)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name="search-server", log_level="WARNING")

    def ranked(query: str) -> list[dict[str, Any]]:
        words = set(query.lower().split())
        scored = sorted(DOCS.items(), key=lambda kv: (-len(words & set(kv[1].lower().rstrip(".").split())), kv[0]))
        return [{"docid": d, "score": float(len(words & set(t.lower().rstrip(".").split()))), "snippet": t[:30]}
                for d, t in scored[:5]]

    @server.tool(name="search")
    def search(query: str) -> list[dict[str, Any]]:
        return ranked(query)

    @server.tool(name="search_text", structured_output=False)
    def search_text(query: str) -> list[dict[str, Any]]:
        return ranked(query)

    @server.tool(name="search_short")
    def search_short(query: Annotated[str, Field(max_length=20)]) -> list[dict[str, Any]]:
        return ranked(query)

    @server.tool(name="search_raw", structured_output=False)
    def search_raw(query: str) -> str:
        return query  # the query is the answer's JSON text

    @server.tool(name="get_document")
    def get_document(docid: str) -> dict[str, Any] | None:
        return {"docid": docid, "text": DOCS[docid]} if docid in DOCS else None

    return server, ranked


@pytest.fixture(scope="module")
def browsecomp_url():
    from drgym.server.mcp import streamable_http_app

    server, ranked = browsecomp_like_server()
    with serve_app(streamable_http_app(server)) as port:
        yield f"http://127.0.0.1:{port}/mcp", ranked


@pytest.mark.parametrize("tool", ["search", "search_text"])
def test_backend_reads_browsecomp_plus_shape(browsecomp_url, tool):
    url, ranked = browsecomp_url
    with MCPSearchBackend(url, search_tool=tool) as b:
        want = ranked("capital of Norway dice")
        hits = b.search("capital of Norway dice", 3)  # the server's fixed 5, cut to 3
        assert [(h.doc_id, h.text, h.score, h.rank) for h in hits] == \
            [(w["docid"], w["snippet"], w["score"], i + 1) for i, w in enumerate(want[:3])]
        assert hits[0].doc_id == "103" and hits[0].url == "103"  # no URL: the docid stands for it
        assert b.search_batch(["Dracula", "Oslo"], 1)[0][0].doc_id == "102"
        assert b.get("103").text == DOCS["103"]
        assert b.fetch(hits[0].url) == b.get("103")  # no fetch tool: get_document by id
        with pytest.raises(DocumentNotFoundError, match="'999'"):
            b.get("999")


def test_server_argument_errors_are_bad_queries(browsecomp_url):
    url, _ = browsecomp_url
    with MCPSearchBackend(url, search_tool="search_short") as b:
        assert b.search("Oslo", 1)[0].doc_id == "103"
        with pytest.raises(BadQueryError, match="search_short: .*validation error.*query"):
            b.search("a query longer than twenty characters", 1)


def test_non_finite_scores_are_malformed_answers(browsecomp_url):
    from drgym.errors import BackendUnavailableError

    url, _ = browsecomp_url
    with MCPSearchBackend(url, search_tool="search_raw", retry={"attempts": 1}) as b:
        assert [(h.doc_id, h.score) for h in b.search('[{"docid": "101", "score": 2.5}, {"docid": "102"}]', 5)] == \
            [("101", 2.5), ("102", 0.0)]
        for raw, shown in [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("true", "True"),
                           ('"high"', "'high'")]:
            with pytest.raises(BackendUnavailableError, match=f"a hit's score is not a finite number: {shown}"):
                b.search(f'[{{"docid": "101", "score": 1.0}}, {{"docid": "102", "score": {raw}}}]', 5)


def test_backend_names_missing_tools(browsecomp_url):
    url, _ = browsecomp_url
    with MCPSearchBackend(url, search_tool="retrieve") as b:
        for _ in range(2):  # the second call (on the open session) too
            with pytest.raises(ConfigError, match="has no tool 'retrieve' .*get_document, search, search_raw, search_short, "
                                                  "search_text"):
                b.search("x", 1)
    with MCPSearchBackend(url, document_tool="read") as b:
        with pytest.raises(ConfigError, match="has no tool 'read'"):
            b.get("101")


# -- specs --------------------------------------------------------------------------------


def test_specs():
    assert parse_spec("mcp:http://127.0.0.1:9/mcp") == ("http", "http://127.0.0.1:9/mcp")
    assert parse_spec("mcp:stdio:drgym mcp --corpus 'my corpus'") == ("stdio", ["drgym", "mcp", "--corpus", "my corpus"])
    assert record_name("mcp:http://127.0.0.1:9/mcp/") == "mcp:http://127.0.0.1:9/mcp"
    assert record_name("mcp:stdio:drgym  mcp   --corpus hotpotqa") == "mcp:stdio:drgym mcp --corpus hotpotqa"
    check_spec("mcp:http://127.0.0.1:9/mcp")
    check_spec("record:x.sqlite#mcp:stdio:drgym mcp")
    for bad, msg in (("mcp:", "mcp:http://HOST:PORT/mcp"), ("mcp:stdio:", "give the command"),
                     ("mcp:ftp://host/x", "mcp:http://HOST:PORT/mcp"), ("mcp:http://", "mcp:http://HOST:PORT/mcp")):
        with pytest.raises(ConfigError, match=msg):
            make_backend(bad)
        with pytest.raises(ConfigError):
            check_spec(bad)
    with pytest.raises(ConfigError, match="'no-such-command-xyz' not found"):
        make_backend("mcp:stdio:no-such-command-xyz --flag")


def test_record_fields_tolerates_the_known_shapes():
    assert record_fields({"docid": "7", "snippet": "s", "score": 1.5}) == \
        {"doc_id": "7", "url": "7", "title": "", "text": "s", "source": "", "metadata": {}}
    assert record_fields({"doc_id": "a#p0", "url": "u", "title": "T", "text": "x", "rank": 1, "extra": 2,
                          "metadata": {"parent_doc_id": "a"}}) == \
        {"doc_id": "a#p0", "url": "u", "title": "T", "text": "x", "source": "",
         "metadata": {"parent_doc_id": "a", "extra": 2}}
    assert record_fields({"ClueWeb22-ID": "c", "URL": "u", "Clean-Text": "Title\nBody"})["title"] == "Title"
    with pytest.raises(SearchError, match="no id"):
        record_fields({"text": "orphan"})
