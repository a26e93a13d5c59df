""":class:`HTTPSearchClient`: a :class:`SearchBackend` over HTTP, for a ``drgym serve``
server or the public DeepResearchGym API (``https://clueweb22.us``, needs a key).

Both speak DeepResearchGym's wire format (arXiv 2505.19253; server code
``large-scale-embeddings/search_api/uni_search_srv.py``): ``GET /search?query=&k=``
returns base64 JSON documents, ``GET /fetch?url=`` one base64 JSON document. The decoder
accepts every document style seen in the wild:

* drgym documents (``id``, ``url``, ``title``, ``text`` plus the ClueWeb keys);
* ClueWeb22 records with only ``URL``, ``Clean-Text`` (first line = title) and
  ``ClueWeb22-ID``;
* FineWeb rows (``url``, ``text``, ``id``, ``dump``, ``date``...; no title);
* empty entries (base64 of ``b""``, DeepResearchGym's "missing document") and entries
  with an ``_error`` key, both skipped.

Against a drgym server (detected through ``GET /health``), :meth:`search_batch` sends
one ``POST /retrieve`` (Search-R1's shape) so the server batches the queries into one
encoder call; against other servers it runs ``/search`` calls in a thread pool.

Transient failures (HTTP 429 honouring ``Retry-After``, 5xx, timeouts, connection
errors) are retried with exponential backoff (:func:`drgym.search.retry.send_with_retries`,
tenacity), then raised as :class:`~drgym.errors.ServiceUnavailableError` (which ends a
rollout run: see :mod:`drgym.evaluation.runner`). The client's ``retry``
(:class:`~drgym.config.RetryPolicy`) sets how: before the server has answered once,
``attempts`` tries are made (a wrong URL fails in seconds); once it has answered, failures
are retried for at least ``reconnect_s`` seconds, so a server that is killed and restarted
mid-run is waited for and the run goes on. 400/422 raise
:class:`BadQueryError`, 404 on a fetch :class:`DocumentNotFoundError`, 401/403
:class:`AuthError` with the server's detail.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import httpx

from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.errors import (
    BackendUnavailableError,
    BadQueryError,
    ConfigError,
    DocumentNotFoundError,
    SearchError,
    ServiceUnavailableError,
)
from drgym.redact import scrub
from drgym.search.base import COLLAPSE_MODES, SearchBackend, check_collapse
from drgym.search.retry import send_with_retries, with_reconnect
from drgym.search.wire import decode_b64_json
from drgym.types import Document, SearchResult

log = logging.getLogger(__name__)

DEEPRESEARCHGYM_URL = "https://clueweb22.us"
"""The public DeepResearchGym search API (ClueWeb22-B; ``/fineweb/search`` for FineWeb)."""

API_KEY_ENV_VARS = ("DRGYM_API_KEY", "DEEPRESEARCHGYM_API_KEY")
"""Environment variables read, in order, when no ``api_key`` is given."""

_CONSUMED = {"id", "ClueWeb22-ID", "url", "URL", "title", "text", "Clean-Text", "source"}


def record_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """Map one decoded wire document (any style above) to Document/SearchResult fields.

    Returns:
        ``{"doc_id", "url", "title", "text", "source", "metadata"}``; ``metadata`` holds
        the keys not consumed (``URL-hash``, ``Language``, ``dump``, ``date``...).
    """
    url = str(rec.get("url") or rec.get("URL") or "")
    doc_id = str(rec.get("id") or rec.get("ClueWeb22-ID") or url)
    if "text" in rec and "title" in rec:  # drgym (both key styles present)
        title, text = str(rec["title"] or ""), str(rec["text"] or "")
    elif "Clean-Text" in rec:  # ClueWeb22: the first line is the title
        title, _, text = str(rec["Clean-Text"] or "").partition("\n")
    else:  # FineWeb row: text only
        title, text = str(rec.get("title") or ""), str(rec.get("text") or "")
    meta = {k: v for k, v in rec.items() if k not in _CONSUMED}
    return {"doc_id": doc_id, "url": url, "title": title, "text": text,
            "source": str(rec.get("source") or ""), "metadata": meta}


def _score(value: Any, where: str) -> float:
    """A hit's score from the wire: a finite JSON number (None: 0.0, a server that sends none).

    Raises:
        BackendUnavailableError: a boolean, a string, NaN or an infinity (``where`` names
            the answer and the hit).
    """
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BackendUnavailableError(f"{where}: a score must be a finite number, got {value!r}.")
    return float(value)


def _detail(resp: httpx.Response) -> str:
    """The ``detail`` of a FastAPI error body, else a short excerpt of the body."""
    try:
        body = resp.json()
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])
    except ValueError:
        pass
    text = " ".join(resp.text.split())
    return text[:200]


class HTTPSearchClient(SearchBackend):
    """Search and fetch through a DeepResearchGym-compatible HTTP API.

    Args:
        base_url: server root, e.g. ``"http://127.0.0.1:8000"`` or :data:`DEEPRESEARCHGYM_URL`.
        api_key: sent as ``x-api-key``; None reads ``DRGYM_API_KEY`` then
            ``DEEPRESEARCHGYM_API_KEY`` (no header when neither is set).
        retry: retries of transient failures and the timeout of one attempt (connect,
            read, write, pool), a :class:`~drgym.config.RetryPolicy` or its fields;
            unset fields keep :attr:`DEFAULT_RETRY` (4 attempts of 30 s, backoff 0.5 s
            doubling up to 8 s, ``Retry-After`` up to 60 s honoured; once the server has
            answered, a failing request is retried for at least ``reconnect_s`` seconds,
            by default ``$DRGYM_RECONNECT_S`` or 60).
        route: search route, ``"/search"`` (ClueWeb22) or ``"/fineweb/search"``.
        fetch_url: root of the fetch service when it is not ``base_url`` (the public
            DeepResearchGym runs ``/fetch`` as a separate service).
        drgym: whether the server is drgym (batches through ``/retrieve``); None detects
            it from ``GET /health`` on first use.
        max_k: largest ``k`` accepted client-side (a drgym server's own max_k replaces it).
        workers: threads for ``search_batch`` against non-drgym servers.
        retrieve_chunk: most queries per ``/retrieve`` request.
        name: backend name; default ``"deepresearchgym"`` for clueweb22.us, else ``"http"``.
        collapse: ask a drgym server for ``"document"`` (k distinct documents) or
            ``"passage"`` results; None takes the server's ``/search`` default, for
            ``search`` and ``search_batch`` alike. Other servers ignore it.
        deterministic: whether rankings are repeatable. True by default: both a drgym
            server and DeepResearchGym search a fixed index (DeepResearchGym's point);
            pass False for a service that may be re-indexed under you.

    Attributes:
        retry: the :class:`~drgym.config.RetryPolicy` in use (every field set).

    Raises:
        ConfigError: ``base_url`` is not an http(s) URL, or a bad ``retry``.
    """

    DEFAULT_RETRY = RetryPolicy(attempts=4, timeout_s=30.0, backoff_s=0.5, max_backoff_s=8.0, max_retry_after_s=60.0)
    """The client's retries when ``retry`` leaves a field unset."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        retry: RetryLike = None,
        route: str = "/search",
        fetch_url: str | None = None,
        drgym: bool | None = None,
        max_k: int = 100,
        workers: int = 8,
        retrieve_chunk: int = 256,
        name: str | None = None,
        deterministic: bool = True,
        collapse: str | None = None,
    ) -> None:
        parsed = urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000', got {base_url!r}.")
        self.retry = with_reconnect(resolve_retry(retry, self.DEFAULT_RETRY))
        self.base_url = base_url.rstrip("/")
        self.fetch_base = (fetch_url or base_url).rstrip("/")
        self.route = "/" + route.strip("/")
        if api_key is None:
            api_key = next((os.environ[v] for v in API_KEY_ENV_VARS if os.environ.get(v)), None)
        self._headers = {"x-api-key": api_key} if api_key else {}
        self._answered = False  # the server has answered once (then retry.reconnect_s applies)
        self.max_k = max_k
        self.workers = max(1, workers)
        self.retrieve_chunk = max(1, retrieve_chunk)
        self.name = name or ("deepresearchgym" if parsed.hostname and parsed.hostname.endswith("clueweb22.us") else "http")
        self.deterministic = deterministic
        self.collapse = None if collapse is None else check_collapse(collapse)
        self._server_collapse: str | None = None
        self._drgym = drgym
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(self.retry.timeout_s), headers=self._headers,
                                    limits=httpx.Limits(max_connections=max(64, 2 * self.workers)))

    @classmethod
    def deepresearchgym(cls, api_key: str | None = None, *, fineweb: bool = False, **kwargs: Any) -> "HTTPSearchClient":
        """Client of the public DeepResearchGym API (ClueWeb22-B, or FineWeb with
        ``fineweb=True``). Needs a key (``DEEPRESEARCHGYM_API_KEY``)."""
        return cls(DEEPRESEARCHGYM_URL, api_key=api_key, route="/fineweb/search" if fineweb else "/search",
                   drgym=False, **kwargs)

    # -- HTTP --------------------------------------------------------------------------
    def _send(self, method: str, url: str, **kw: Any) -> httpx.Response:
        try:
            resp = send_with_retries(
                self._client, method, url, backend=self.name, env_var=API_KEY_ENV_VARS[0],
                retry=self.retry, min_elapsed_s=float(self.retry.reconnect_s or 0.0) if self._answered else 0.0,
                **kw,
            )
        except RuntimeError as e:  # the client was closed
            raise BackendUnavailableError(f"{self.name}: client is closed ({e}).") from e
        except BackendUnavailableError as e:  # retries spent: the service itself is down
            raise ServiceUnavailableError(str(e)) from e
        self._answered = True
        return resp

    def credentials(self) -> tuple[str, ...]:
        """The ``x-api-key`` sent, if any (see :meth:`SearchBackend.credentials`)."""
        return tuple(self._headers.values())

    def _json(self, resp: httpx.Response) -> Any:
        """Body of a 2xx answer as JSON; 4xx become BadQueryError / SearchError."""
        if resp.status_code in (400, 422):
            raise BadQueryError(scrub(f"{self.name}: {_detail(resp)}", self.credentials()))
        if resp.status_code >= 400:
            raise SearchError(scrub(f"{self.name}: HTTP {resp.status_code} from {resp.request.url}: {_detail(resp)}",
                                    self.credentials()))
        try:
            return resp.json()
        except ValueError as e:
            excerpt = " ".join(resp.text.split())[:120]
            raise BackendUnavailableError(
                f"{self.name}: {resp.request.url.copy_with(query=None)} answered HTTP {resp.status_code} with "
                f"malformed JSON ({e}): {excerpt!r}"
            ) from e

    def is_drgym(self) -> bool:
        """Whether the server is drgym (``GET /health`` says ``"service": "drgym"``);
        detected once, which also adopts the server's ``max_k``.

        Raises:
            ServiceUnavailableError: the server cannot be reached.
        """
        with self._lock:
            if self._drgym is None:
                info = self._read_health()
                self._drgym = isinstance(info, dict) and info.get("service") == "drgym"
                if self._drgym and isinstance(info.get("max_k"), int):
                    self.max_k = info["max_k"]
                if self._drgym and info.get("collapse") in COLLAPSE_MODES:
                    self._server_collapse = info["collapse"]
            return self._drgym

    def _read_health(self) -> dict[str, Any] | None:
        """``GET /health`` as a dict; None when the server answers anything else (not JSON, not 200)."""
        resp = self._send("GET", f"{self.base_url}/health")
        if resp.status_code != 200:
            return None
        try:
            info = resp.json()
        except ValueError:
            return None
        return info if isinstance(info, dict) else None

    def identity(self) -> dict[str, Any]:
        """The remote engine's identity (see :meth:`SearchBackend.identity`), read from a
        fresh ``GET /health`` of a drgym server: the index name, method, encoder and
        passages (parsed from ``index``, e.g. ``LocalSearchEngine('wiki-default--...',
        method='hybrid', ...)``, also kept whole as ``index_repr``), ``max_k`` and the
        collapse mode the client gets (its own ``collapse``, else the server's default),
        and ``engine``: the served backend's own identity as ``/health`` reports it (for a
        local index its ``manifest_fingerprint`` and ``corpus_fingerprint``, so a server
        restarted on a rebuilt index of the same name is another engine). A server that is not drgym (the public DeepResearchGym API) reports no index: its
        identity is the service name and route.

        Raises:
            ServiceUnavailableError: the server cannot be reached.
        """

        if not self.is_drgym():
            return {"kind": "http", "service": self.name, "route": self.route, "max_k": int(self.max_k)}
        info = self._read_health() or {}
        raw = re.sub(r" at 0x[0-9a-fA-F]+", "", str(info.get("index") or ""))  # no object addresses
        m = re.match(r"\s*\w+\(\s*'([^']*)'", raw)
        fields = {k: (q if q else v) for k, q, v in re.findall(r"(\w+)=(?:'([^']*)'|([^,)\s]+))", raw)}
        passages = fields.get("passages")
        server_collapse = info.get("collapse") if info.get("collapse") in COLLAPSE_MODES else None
        ident = {"kind": "http", "service": "drgym", "backend": info.get("backend"),
                "index": m.group(1) if m else (raw or None), "n_passages": int(passages) if str(passages).isdigit() else passages,
                "method": fields.get("method"), "encoder": fields.get("encoder"),
                "max_k": info.get("max_k", self.max_k), "collapse": self.collapse or server_collapse,
                "deterministic": info.get("deterministic"), "index_repr": raw}
        if isinstance(info.get("engine"), dict) and info["engine"]:
            ident["engine"] = info["engine"]  # the served backend's own identity: fingerprints and ranking settings
        return ident

    # -- SearchBackend -----------------------------------------------------------------
    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        """Top-``k`` hits of ``GET {route}?query=&k=&with_distance=true``.

        Returns:
            At most ``k`` hits (a server that sends more is cut to its first ``k``), with
            ``score`` = the server's distance (higher is better; 0.0 when the server sends
            no ``distances``) and ranks 1..n; empty or ``_error`` entries are skipped.

        Raises:
            BadQueryError, AuthError, ServiceUnavailableError (retries spent), SearchError (see module doc).
            BackendUnavailableError: a malformed answer: no ``results`` list, a
                ``distances`` list whose length is not the number of results, or a
                distance that is not a finite number (NaN, Infinity, a string).
        """
        self.check_request([query], k)
        params: dict[str, Any] = {"query": query, "k": k, "with_distance": "true"}
        if self.collapse:
            params["collapse"] = self.collapse
        resp = self._send("GET", f"{self.base_url}{self.route}", params=params)
        body = self._json(resp)
        if not isinstance(body, dict) or not isinstance(body.get("results"), list):
            raise BackendUnavailableError(f"{self.name}: expected {{'results': [...]}} from {self.route}, got {str(body)[:120]!r}")
        results = body["results"]
        dists = body.get("distances")
        where = f"{self.name}: {self.route} of {query[:60]!r}"
        if dists is None:  # a server that sends no distances: every score 0.0
            dists = [None] * len(results)
        elif not isinstance(dists, list) or len(dists) != len(results):
            got = f"{len(dists)} distances" if isinstance(dists, list) else f"distances {str(dists)[:60]!r}"
            raise BackendUnavailableError(f"{where}: {got} for {len(results)} results; the scores cannot be "
                                          "matched to the documents.")
        out: list[SearchResult] = []
        for i, (entry, dist) in enumerate(zip(results, dists)):
            score = _score(dist, f"{where}, result {i}")  # checked even for a result skipped below
            try:
                rec = decode_b64_json(entry) if isinstance(entry, str) else None
            except ValueError as e:
                log.warning("%s: result %d of %r is not base64 JSON (%s); skipped", self.name, i, query[:60], e)
                continue
            if rec is None or "_error" in rec:
                continue
            f = record_fields(rec)
            out.append(SearchResult(score=score, rank=len(out) + 1, **f))
        if len(out) > k:
            log.debug("%s: %d results for k=%d; the first %d kept", where, len(out), k, k)
        return out[:k]

    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        """One result list per query: ``POST /retrieve`` on a drgym server, else
        concurrent ``/search`` calls (``workers`` threads).

        Returns:
            At most ``k`` hits per query, as :meth:`search`.

        Raises:
            BadQueryError: a query is empty or k outside 1..max_k (checked before sending).
            BackendUnavailableError: a malformed answer (a hit without a document id, a
                score that is not a finite number); see :meth:`search`.
        """
        self.check_request(queries, k)
        if not queries:
            return []
        if self.route == "/search" and self.is_drgym():
            self.check_request(queries, k)  # max_k may have changed on detection
            out: list[list[SearchResult]] = []
            for i in range(0, len(queries), self.retrieve_chunk):
                out.extend(self._retrieve(queries[i : i + self.retrieve_chunk], k))
            return out
        if len(queries) == 1:
            return [self.search(queries[0], k)]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="drgym-http")
            pool = self._pool
        return list(pool.map(lambda q: self.search(q, k), queries))

    def _retrieve(self, queries: list[str], k: int) -> list[list[SearchResult]]:
        body: dict[str, Any] = {"queries": queries, "topk": k, "return_scores": True}
        collapse = self.collapse or self._server_collapse  # /retrieve's own default is passages
        if collapse:
            body["collapse"] = collapse
        resp = self._send("POST", f"{self.base_url}/retrieve", json=body)
        body = self._json(resp)
        rows = body.get("result") if isinstance(body, dict) else None
        if not isinstance(rows, list) or len(rows) != len(queries):
            raise BackendUnavailableError(f"{self.name}: /retrieve returned {str(body)[:120]!r} for {len(queries)} queries")
        out = []
        for q, hits in zip(queries, rows):
            where = f"{self.name}: /retrieve of {q[:60]!r}"
            if not isinstance(hits, list):
                raise BackendUnavailableError(f"{where}: expected a list of hits, got {str(hits)[:120]!r}")
            res = []
            for i, h in enumerate(hits):
                d = h.get("document") if isinstance(h, dict) else None
                if not isinstance(d, dict) or d.get("id") is None:
                    raise BackendUnavailableError(f"{where}: hit {i} is not {{'document': {{'id', ...}}, 'score'}}: "
                                                  f"{str(h)[:120]!r}")
                title = str(d.get("title") or "")
                contents = str(d.get("contents") or "")
                head = f'"{title}"\n'
                text = contents[len(head):] if contents.startswith(head) else contents.partition("\n")[2]
                res.append(SearchResult(doc_id=str(d["id"]), url=str(d.get("url") or ""), title=title, text=text,
                                        score=_score(h.get("score"), f"{where}, hit {i}"), rank=len(res) + 1,
                                        source=str(d.get("source") or "")))
            out.append(res[:k])
        return out

    def fetch(self, url: str) -> Document:
        """The whole document at ``url`` (``GET /fetch?url=``).

        Accepts ``clean_text`` as base64 JSON (current servers) or plain text (an older
        DeepResearchGym variant); plain text is split into title (first line) and text.

        Raises:
            DocumentNotFoundError: HTTP 404 (the server's detail is in the message).
            AuthError, ServiceUnavailableError, BackendUnavailableError, SearchError.
        """
        if not isinstance(url, str) or not url.strip():
            raise DocumentNotFoundError(f"URL not found: {url!r} (empty URL).")
        resp = self._send("GET", f"{self.fetch_base}/fetch", params={"url": url})
        if resp.status_code == 404:
            raise DocumentNotFoundError(f"URL not found: {url!r} ({self.name} said: {_detail(resp)})")
        body = self._json(resp)
        ct = body.get("clean_text") if isinstance(body, dict) else None
        if not isinstance(ct, str):
            raise BackendUnavailableError(f"{self.name}: expected {{'clean_text': ...}} from /fetch, got {str(body)[:120]!r}")
        try:
            rec = decode_b64_json(ct)
        except (ValueError, UnicodeDecodeError):
            title, _, text = ct.partition("\n")
            rec = {"URL": url, "title": title, "text": text}
        if rec is None:
            raise DocumentNotFoundError(f"URL not found: {url!r} ({self.name} returned an empty document)")
        f = record_fields(rec)
        if not f["url"]:
            f["url"] = url
        return Document(**f)

    def close(self) -> None:
        """Close the HTTP connections and the thread pool. Idempotent."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
        self._client.close()

    def __repr__(self) -> str:
        return f"HTTPSearchClient({self.base_url!r}, name={self.name!r})"
