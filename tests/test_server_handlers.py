"""The HTTP and MCP servers' handlers are top-level functions over a state object: each can
be imported and called alone, and the HTTP routes work in a minimal app of their router."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from mcp.server.mcpserver.exceptions import ToolError

from drgym.errors import BadQueryError, DocumentNotFoundError
from drgym.search.wire import ServerSettings, decode_b64_json
from drgym.server import mcp as mcp_server
from drgym.server.app import ServerState, fetch, lifespan, search, search_router, with_annotations
from drgym.types import Document, SearchResult

DOCS = [
    Document(doc_id="d1", url="https://en.wikipedia.org/wiki/Paris", title="Paris",
             text="Paris is the capital of France."),
    Document(doc_id="d2", url="https://en.wikipedia.org/wiki/Lyon", title="Lyon",
             text="Lyon is a city in France on the Rhone."),
    Document(doc_id="d3", url="https://en.wikipedia.org/wiki/Berlin", title="Berlin",
             text="Berlin is the capital of Germany."),
]


class WordOverlap:
    """A backend ranking DOCS by the number of query words in their text (ties by order)."""

    name = "word-overlap"

    def search_batch(self, queries: list[str], k: int) -> list[list[SearchResult]]:
        out = []
        for q in queries:
            words = set(q.lower().split())
            scored = sorted(((sum(w.strip(".") in words for w in d.text.lower().split()), i) for i, d in enumerate(DOCS)),
                            key=lambda t: (-t[0], t[1]))[:k]
            out.append([SearchResult(doc_id=DOCS[i].doc_id, url=DOCS[i].url, title=DOCS[i].title, text=DOCS[i].text,
                                     score=float(s), rank=r + 1) for r, (s, i) in enumerate(scored)])
        return out

    def fetch(self, url: str) -> Document:
        for d in DOCS:
            if d.url == url:
                return d
        raise DocumentNotFoundError(f"URL not found: {url!r}.")

    def identity(self) -> dict:
        return {"kind": "word-overlap"}


def test_search_handler_called_alone():
    state = ServerState.build(WordOverlap(), ServerSettings(max_k=2, cache_size=0))

    async def go():
        await state.batcher.start()
        try:
            found = await search(state, "capital of Germany", k=2, with_distance=True, collapse=None)
            with pytest.raises(BadQueryError, match="k must be between 1 and 2, got 3"):
                await search(state, "capital", k=3, with_distance=False, collapse=None)
            doc = await fetch(state, "https://en.wikipedia.org/wiki/Lyon\n")
            return found, doc
        finally:
            await state.batcher.stop()

    found, doc = asyncio.run(go())
    # "capital of germany": Berlin has 3 of the words, Paris 2 ("capital", "of"), Lyon 0
    assert [decode_b64_json(r)["title"] for r in found.results] == ["Berlin", "Paris"]
    assert found.distances == [3.0, 2.0] and found.outlinks == []
    assert decode_b64_json(doc.clean_text)["text"] == "Lyon is a city in France on the Rhone."


def test_router_in_a_minimal_app_states_the_limits():
    state = ServerState.build(WordOverlap(), ServerSettings(max_k=2, default_k=1, cache_size=0))
    app = FastAPI(lifespan=lifespan)  # starts and stops the batcher
    app.state.drgym = state
    app.include_router(search_router(state))
    with TestClient(app) as client:
        r = client.get("/openapi.json").json()
        k = next(p for p in r["paths"]["/search"]["get"]["parameters"] if p["name"] == "k")
        assert k["schema"]["maximum"] == 2 and "default 1" in k["description"]
        assert r["components"]["schemas"]["RetrieveRequest"]["properties"]["topk"]["maximum"] == 2
        assert "security" not in r["paths"]["/search"]["get"]  # no keys, no auth
        assert client.get("/fetch", params={"url": "https://en.wikipedia.org/wiki/Paris"}).status_code == 200
        got = client.get("/search", params={"query": "city in France"}).json()  # k: the default, 1
        assert [decode_b64_json(r)["title"] for r in got["results"]] == ["Lyon"] and got["distances"] is None


def test_with_annotations_refuses_an_unknown_parameter():
    with pytest.raises(TypeError, match="search has no parameter top_k"):
        with_annotations(search, top_k=int)


def test_mcp_tools_called_alone():
    state = mcp_server.MCPState.build(WordOverlap(), ServerSettings(max_k=2, default_k=1))
    out = mcp_server.search(state, "capital of France")
    assert [(h.rank, h.title, h.score) for h in out.results] == [(1, "Paris", 3.0)] and out.k == 1
    with pytest.raises(ToolError, match="BadQueryError: k must be between 1 and 2, got 5"):
        mcp_server.search(state, "capital", k=5)
    assert mcp_server.fetch(state, "https://en.wikipedia.org/wiki/Berlin").title == "Berlin"
    with pytest.raises(ToolError, match="SearchError: this server's backend \\(WordOverlap\\) cannot look documents"):
        mcp_server.get_document(state, "d1")
