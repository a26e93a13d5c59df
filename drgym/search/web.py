"""Commercial web search backends: Serper (Google), Tavily and Brave Search.

Each backend speaks its provider's documented HTTP API and maps the answer to the
shared :class:`~drgym.types.SearchResult` shape:

========= ========================================================== ======================= ==================================================
backend   request                                                    key (env var, header)   response read
========= ========================================================== ======================= ==================================================
serper    ``POST https://google.serper.dev/search`` JSON             ``SERPER_API_KEY``,     ``organic[{title, link, snippet, position}]``
          ``{"q", "num"}``                                           ``X-API-KEY``
tavily    ``POST https://api.tavily.com/search`` JSON                ``TAVILY_API_KEY``,     ``results[{title, url, content, score,
          ``{"query", "max_results", "search_depth",                 ``Authorization:        raw_content}]``
          "include_raw_content"}``                                   Bearer``
brave     ``GET https://api.search.brave.com/res/v1/web/search``     ``BRAVE_API_KEY``,      ``web.results[{title, url, description}]``
          ``?q=&count=``                                             ``X-Subscription-Token``
========= ========================================================== ======================= ==================================================

Base URLs can be overridden with ``base_url=`` or the ``SERPER_BASE_URL``,
``TAVILY_BASE_URL`` and ``BRAVE_BASE_URL`` environment variables (a proxy, or a loopback
fake in tests).

Mapping: ``doc_id`` and ``url`` are the result URL, ``text`` is the provider's snippet
(Brave's ``<strong>`` highlighting removed), ``score`` is Tavily's relevance score or
``1/rank`` for providers that give none, ``source`` is the backend name, and
``metadata`` keeps ``snippet`` and the provider's own position.

``fetch(url)`` downloads the page and extracts its main text
(:class:`~drgym.search.pages.PageFetcher`); for Tavily with ``include_raw_content``
the page text returned by the search is used instead when available. As the fetch tool
promises the agent ("a URL seen in search results"), only URLs this backend returned in
a search result are fetched (compared without fragment, trailing slash or case of
scheme and host; the URL is then fetched as the result gave it); any other URL raises :class:`~drgym.search.pages.FetchRefusedError`
(the agent's observation), unless the backend was built with ``fetch_any_url=True``. The
page fetcher refuses hosts on loopback, private, link-local and other non-public
addresses, at every redirect (see :mod:`drgym.search.pages`).

Failures: 429/5xx/timeouts are retried with backoff (honouring ``Retry-After``), 401/403
raise :class:`~drgym.errors.AuthError` naming the env var, malformed JSON or an
unexpected response shape raises :class:`~drgym.errors.BackendUnavailableError`.
Web backends are ``deterministic = False``: the web changes; record them with
:class:`drgym.search.record.RecordReplayBackend` to make a study reproducible.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.errors import AuthError, BackendUnavailableError, BadQueryError, SearchError
from drgym.redact import scrub
from drgym.search.base import SearchBackend
from drgym.search.pages import FetchRefusedError, PageFetcher
from drgym.search.retry import send_with_retries
from drgym.types import Document, SearchResult

log = logging.getLogger(__name__)

_TAG = re.compile(r"<[^>]+>")


def url_key(url: str) -> str:
    """The form in which fetch compares a URL with the search results' URLs: surrounding
    space, fragment and trailing ``/`` dropped, scheme and host lower-cased."""
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), parts.query, ""))


def _clean(text: Any) -> str:
    """Plain text from a provider string: tags removed, entities unescaped, spaces collapsed."""
    if text is None:
        return ""
    return " ".join(html.unescape(_TAG.sub("", str(text))).split())


class WebSearchBackend(SearchBackend):
    """Base class of the HTTP web search backends.

    Subclasses set ``name``, ``env_var``, ``default_base_url`` and ``max_k`` and
    implement :meth:`_build_request` and :meth:`_parse`.

    Args:
        api_key: the provider key; default: the ``env_var`` environment variable.
        base_url: the API root (default ``default_base_url``; tests point it at loopback).
        retry: retries of 429/5xx/timeouts and the per-attempt HTTP timeout, a
            :class:`~drgym.config.RetryPolicy` or its fields; unset fields keep
            :attr:`DEFAULT_RETRY` (4 attempts of 15 s, backoff 0.5 s with jitter doubling
            up to 20 s, ``Retry-After`` up to 60 s honoured).
        max_workers: queries of one batch sent concurrently.
        page_fetcher: fetcher used by :meth:`fetch` (default: a new :class:`PageFetcher`
            whose per-attempt timeout is ``retry.timeout_s``, at least 20 s).
        fetch_any_url: let :meth:`fetch` open URLs that no search of this backend returned
            (default False: only URLs seen in search results, as the fetch tool says).
        fetch_allow_loopback: the default page fetcher accepts loopback hosts (tests that
            serve pages on 127.0.0.1; see :class:`PageFetcher`). Ignored with ``page_fetcher``.
        max_seen_urls: search-result URLs remembered for :meth:`fetch` (oldest forgotten first).

    Attributes:
        retry: the :class:`~drgym.config.RetryPolicy` in use (every field set).

    Raises:
        AuthError: no key given and ``env_var`` unset.
        ConfigError: a bad ``retry``.
    """

    DEFAULT_RETRY = RetryPolicy(attempts=4, timeout_s=15.0, backoff_s=0.5, max_backoff_s=20.0, max_retry_after_s=60.0)
    """The web backends' retries when ``retry`` leaves a field unset."""

    name = "web"
    env_var = ""
    default_base_url = ""
    deterministic = False
    max_k = 20

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        retry: RetryLike = None,
        max_workers: int = 4,
        page_fetcher: PageFetcher | None = None,
        fetch_any_url: bool = False,
        fetch_allow_loopback: bool = False,
        max_seen_urls: int = 100_000,
    ):
        key = api_key if api_key is not None else os.environ.get(self.env_var, "")
        if not key or not key.strip():
            raise AuthError(
                f"{self.name}: no API key. Set the {self.env_var} environment variable "
                f"(or pass api_key=...), or use mode='replay' with a recording."
            )
        self._api_key = key.strip()
        self.base_url = (base_url or os.environ.get(f"{self.env_var.removesuffix('_API_KEY')}_BASE_URL") or self.default_base_url).rstrip("/")
        self.retry = resolve_retry(retry, self.DEFAULT_RETRY)
        self.max_workers = max(1, int(max_workers))
        self.client = httpx.Client(timeout=httpx.Timeout(self.retry.timeout_s), headers={"Accept": "application/json"})
        self._own_fetcher = page_fetcher is None
        self.page_fetcher = page_fetcher or PageFetcher(retry={"timeout_s": max(self.retry.timeout_s, 20.0)},
                                                        source=self.name, allow_loopback=fetch_allow_loopback)
        self.fetch_any_url = bool(fetch_any_url)
        self.max_seen_urls = max(1, int(max_seen_urls))
        self._seen: OrderedDict[str, str] = OrderedDict()  # url_key -> the URL as the result gave it
        self._seen_lock = threading.Lock()
        self._closed = False

    # -- provider specifics ------------------------------------------------------------
    def _build_request(self, query: str, k: int) -> dict[str, Any]:
        """``{"method", "url", "headers", "params" | "json"}`` for one query."""
        raise NotImplementedError

    def _parse(self, payload: Any) -> list[dict[str, Any]]:
        """Provider JSON -> list of ``{"url", "title", "snippet", "score"?, "position"?, ...}``.

        Raises:
            BackendUnavailableError: the payload does not have the documented shape.
        """
        raise NotImplementedError

    # -- SearchBackend -------------------------------------------------------------------
    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        """Search each query (up to ``max_workers`` at a time); see :class:`SearchBackend`.

        Raises:
            BadQueryError: empty query or k outside 1..max_k.
            AuthError: the provider refused the key.
            BackendUnavailableError: retries exhausted, timeouts, malformed answers.
        """
        self.check_request(queries, k)
        if len(queries) <= 1 or self.max_workers == 1:
            return [self._search_one(q, k) for q in queries]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(queries))) as pool:
            return list(pool.map(lambda q: self._search_one(q, k), queries))

    def _search_one(self, query: str, k: int) -> list[SearchResult]:
        req = self._build_request(" ".join(query.split()), k)  # whitespace-normalised, as recordings are keyed
        method, url = req.pop("method"), req.pop("url")
        resp = send_with_retries(
            self.client,
            method,
            url,
            backend=self.name,
            env_var=self.env_var,
            retry=self.retry,
            **req,
        )
        keys = self.credentials()  # an answer that echoes the key must not carry it into messages
        if resp.status_code == 400 or resp.status_code == 422:
            raise BadQueryError(scrub(f"{self.name}: the API rejected the query {query!r} (HTTP {resp.status_code}): "
                                      f"{resp.text[:300]!r}", keys))
        if resp.status_code >= 400:
            raise SearchError(scrub(f"{self.name}: HTTP {resp.status_code} for query {query!r}: {resp.text[:300]!r}", keys))
        try:
            payload = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BackendUnavailableError(scrub(
                f"{self.name}: the API answered HTTP {resp.status_code} with malformed JSON for query {query!r} "
                f"({e}); body starts {resp.text[:120]!r}.", keys)) from e
        items = self._parse(payload)
        out: list[SearchResult] = []
        seen: set[str] = set()
        for item in items:
            url_i = str(item.get("url") or "").strip()
            if not url_i or url_i in seen:
                continue
            seen.add(url_i)
            rank = len(out) + 1
            score = item.get("score")
            try:
                score = float(score) if score is not None else 1.0 / rank
            except (TypeError, ValueError):
                score = 1.0 / rank
            snippet = _clean(item.get("snippet"))
            meta = {"snippet": snippet}
            if item.get("position") is not None:
                meta["position"] = item["position"]
            for extra in ("date", "age", "published_date"):
                if item.get(extra):
                    meta[extra] = item[extra]
            out.append(
                SearchResult(
                    doc_id=url_i,
                    url=url_i,
                    title=_clean(item.get("title")),
                    text=snippet,
                    score=score,
                    rank=rank,
                    source=self.name,
                    metadata=meta,
                )
            )
            if len(out) == k:
                break
        self.remember_results(out)
        return out

    def remember_results(self, results: list[SearchResult]) -> None:
        """Note the URLs of ``results`` as seen, so :meth:`fetch` opens them (the backend's
        own searches call this; a cache that answers searches without the backend, such as
        record/replay's cache mode, calls it with the cached results)."""
        with self._seen_lock:
            for r in results:
                if r.url:
                    key = url_key(r.url)
                    self._seen[key] = r.url
                    self._seen.move_to_end(key)
            while len(self._seen) > self.max_seen_urls:
                self._seen.popitem(last=False)

    def check_seen(self, url: str) -> str:
        """Refuse ``url`` unless a search of this backend returned it (or ``fetch_any_url``).

        Returns:
            The URL to fetch: as the search result gave it (``url`` may differ in
            fragment, trailing ``/`` or case of scheme and host), or ``url`` itself with
            ``fetch_any_url``.

        Raises:
            FetchRefusedError: reason ``"not-in-results"``.
        """
        if not isinstance(url, str):
            return url
        with self._seen_lock:
            seen = self._seen.get(url_key(url))
        if seen is not None:
            return seen
        if self.fetch_any_url:
            return url
        raise FetchRefusedError(
            f"fetch refused: {url.strip()!r} was not in any search result; fetch opens only URLs that a "
            "search returned (copy one from the results).", reason="not-in-results")

    def fetch(self, url: str) -> Document:
        """Download the page at ``url`` and return its main text (see :class:`PageFetcher`).

        Raises:
            FetchRefusedError: ``url`` was not in this backend's search results (unless
                ``fetch_any_url``), or the page fetcher refused its address or a redirect.
            BadQueryError, DocumentNotFoundError, UnsupportedContentError, SearchError,
            BackendUnavailableError: see :meth:`PageFetcher.fetch`.
        """
        return self.page_fetcher.fetch(self.check_seen(url))

    def credentials(self) -> tuple[str, ...]:
        """The provider key (see :meth:`SearchBackend.credentials`)."""
        return (self._api_key,)

    def identity(self) -> dict[str, Any]:
        """The provider (see :meth:`SearchBackend.identity`): ``{"kind": "web", "provider",
        "base_url", "max_k"}`` plus the provider's ranking options (Tavily's
        ``search_depth`` and ``include_raw_content``). Never the key."""
        ident: dict[str, Any] = {"kind": "web", "provider": self.name, "base_url": scrub(self.base_url, self.credentials()),
                                 "max_k": int(self.max_k)}
        for opt in ("search_depth", "include_raw_content"):
            if hasattr(self, opt):
                ident[opt] = getattr(self, opt)
        return ident

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.client.close()
        if self._own_fetcher:
            self.page_fetcher.close()

    @staticmethod
    def _expect(payload: Any, backend: str, path: str, value: Any, kind: type) -> Any:
        if not isinstance(value, kind):
            raise BackendUnavailableError(
                f"{backend}: unexpected response shape: expected {path} to be a {kind.__name__}, "
                f"got {type(value).__name__} (payload starts {json.dumps(payload)[:120]!r})."
            )
        return value


class SerperSearch(WebSearchBackend):
    """Google results through Serper (serper.dev).

    API: ``POST {base}/search`` with header ``X-API-KEY`` and JSON ``{"q": query, "num": k}``;
    response ``{"organic": [{"title", "link", "snippet", "position", ...}], ...}``.
    ``num`` up to 100.
    """

    name = "serper"
    env_var = "SERPER_API_KEY"
    default_base_url = "https://google.serper.dev"
    max_k = 100

    def _build_request(self, query: str, k: int) -> dict[str, Any]:
        return {
            "method": "POST",
            "url": f"{self.base_url}/search",
            "headers": {"X-API-KEY": self._api_key, "Content-Type": "application/json"},
            "json": {"q": query, "num": k},
        }

    def _parse(self, payload: Any) -> list[dict[str, Any]]:
        self._expect(payload, self.name, "the response", payload, dict)
        organic = payload.get("organic", [])
        self._expect(payload, self.name, "'organic'", organic, list)
        out = []
        for r in organic:
            if isinstance(r, dict):
                out.append({"url": r.get("link"), "title": r.get("title"), "snippet": r.get("snippet"),
                            "position": r.get("position"), "date": r.get("date")})
        return out


class TavilySearch(WebSearchBackend):
    """Tavily search (tavily.com), built for LLM agents.

    API: ``POST {base}/search`` with ``Authorization: Bearer <key>`` and JSON
    ``{"query", "max_results": k, "search_depth", "include_raw_content"}``; response
    ``{"results": [{"title", "url", "content", "score", "raw_content"}], ...}``.
    ``max_results`` up to 20.

    Args:
        search_depth: ``"basic"`` (1 credit) or ``"advanced"`` (2 credits).
        include_raw_content: ask for each page's text; :meth:`fetch` then serves it
            (last 512 pages kept) instead of downloading the page.
    """

    name = "tavily"
    env_var = "TAVILY_API_KEY"
    default_base_url = "https://api.tavily.com"
    max_k = 20

    def __init__(self, api_key: str | None = None, *, search_depth: str = "basic", include_raw_content: bool = False, **kw):
        if search_depth not in ("basic", "advanced"):
            raise ValueError(f"search_depth must be 'basic' or 'advanced', got {search_depth!r}.")
        super().__init__(api_key, **kw)
        self.search_depth = search_depth
        self.include_raw_content = include_raw_content
        self._raw: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._raw_lock = threading.Lock()

    def _build_request(self, query: str, k: int) -> dict[str, Any]:
        return {
            "method": "POST",
            "url": f"{self.base_url}/search",
            "headers": {"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json"},
            "json": {"query": query, "max_results": k, "search_depth": self.search_depth,
                     "include_raw_content": self.include_raw_content},
        }

    def _parse(self, payload: Any) -> list[dict[str, Any]]:
        self._expect(payload, self.name, "the response", payload, dict)
        results = payload.get("results", [])
        self._expect(payload, self.name, "'results'", results, list)
        out = []
        for r in results:
            if not isinstance(r, dict):
                continue
            out.append({"url": r.get("url"), "title": r.get("title"), "snippet": r.get("content"),
                        "score": r.get("score"), "published_date": r.get("published_date")})
            raw = r.get("raw_content")
            if raw and r.get("url"):
                with self._raw_lock:
                    self._raw[str(r["url"])] = (str(r.get("title") or ""), str(raw))
                    self._raw.move_to_end(str(r["url"]))
                    while len(self._raw) > 512:
                        self._raw.popitem(last=False)
        return out

    def fetch(self, url: str) -> Document:
        """The page text Tavily returned with the search when it did, else a download;
        see :meth:`WebSearchBackend.fetch` (the same rules and errors)."""
        url = self.check_seen(url)
        with self._raw_lock:
            hit = self._raw.get(url)
        if hit is not None:
            return Document(doc_id=url, url=url, title=hit[0], text=hit[1], source=self.name,
                            metadata={"from": "tavily raw_content"})
        return self.page_fetcher.fetch(url)


class BraveSearch(WebSearchBackend):
    """Brave Search web results (api.search.brave.com).

    API: ``GET {base}/res/v1/web/search?q=&count=`` with header ``X-Subscription-Token``;
    response ``{"web": {"results": [{"title", "url", "description", "age"?}]}, ...}``
    (``web`` is absent when nothing matched). ``count`` up to 20.
    """

    name = "brave"
    env_var = "BRAVE_API_KEY"
    default_base_url = "https://api.search.brave.com"
    max_k = 20

    def _build_request(self, query: str, k: int) -> dict[str, Any]:
        return {
            "method": "GET",
            "url": f"{self.base_url}/res/v1/web/search",
            "headers": {"X-Subscription-Token": self._api_key, "Accept": "application/json"},
            "params": {"q": query, "count": k},
        }

    def _parse(self, payload: Any) -> list[dict[str, Any]]:
        self._expect(payload, self.name, "the response", payload, dict)
        web = payload.get("web", {})
        self._expect(payload, self.name, "'web'", web, dict)
        results = web.get("results", [])
        self._expect(payload, self.name, "'web.results'", results, list)
        out = []
        for r in results:
            if isinstance(r, dict):
                out.append({"url": r.get("url"), "title": r.get("title"), "snippet": r.get("description"),
                            "age": r.get("age")})
        return out


#: Web backends by name.
WEB_BACKENDS: dict[str, type[WebSearchBackend]] = {
    "serper": SerperSearch,
    "tavily": TavilySearch,
    "brave": BraveSearch,
}
