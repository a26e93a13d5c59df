"""Search backends: the :class:`SearchBackend` interface and its implementations.

Every name below imports from ``drgym.search`` (the classes load on first use, so
``import drgym.search`` stays light)::

    from drgym.search import LocalSearchEngine, HTTPSearchClient, make_backend

==========================  ==========================================================
name                        what
==========================  ==========================================================
``SearchBackend``           the interface: ``search``, ``search_batch``, ``fetch``, ``identity``
``SearchResult``            one hit (``doc_id``, ``url``, ``title``, ``text``, ``score``, ``rank``)
``Document``                a fetched document
``LocalSearchEngine``       FAISS + BM25 + hybrid over a local index (``local:NAME``)
``HTTPSearchClient``        a ``drgym serve`` / DeepResearchGym / Search-R1 server (``http://...``)
``MCPSearchBackend``        any MCP server with search and document tools (``mcp:...``)
``SerperSearch``,           commercial web search (``serper``, ``tavily``, ``brave``)
``TavilySearch``,
``BraveSearch``
``RecordReplayBackend``     record or replay any backend (``record:``/``replay:`` specs)
``make_backend``            the backend factory: a spec string -> a backend
``get_backend``             the same, cached per process
``backend_from_settings``   a config's ``search:`` section -> a backend
==========================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from drgym.search.base import SearchBackend
from drgym.types import Document, SearchResult

__all__ = [
    "SearchBackend", "SearchResult", "Document", "LocalSearchEngine", "HTTPSearchClient", "MCPSearchBackend",
    "SerperSearch", "TavilySearch", "BraveSearch", "WebSearchBackend", "RecordReplayBackend", "make_backend",
    "get_backend", "backend_from_settings",
]


def __getattr__(name: str) -> Any:  # the implementations load on first use (plain imports, for the layer checks)
    if name == "LocalSearchEngine":
        from drgym.search.local import LocalSearchEngine

        return LocalSearchEngine
    if name == "HTTPSearchClient":
        from drgym.search.client import HTTPSearchClient

        return HTTPSearchClient
    if name == "MCPSearchBackend":
        from drgym.search.mcp import MCPSearchBackend

        return MCPSearchBackend
    if name in ("SerperSearch", "TavilySearch", "BraveSearch", "WebSearchBackend"):
        from drgym.search import web

        return getattr(web, name)
    if name == "RecordReplayBackend":
        from drgym.search.record import RecordReplayBackend

        return RecordReplayBackend
    if name in ("make_backend", "get_backend", "backend_from_settings"):
        from drgym.search import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'drgym.search' has no attribute {name!r}")
