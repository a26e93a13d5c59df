"""Fetching a web page for a commercial search result: httpx + trafilatura main text.

:class:`PageFetcher` downloads a URL with size and content-type limits and extracts the
main text with trafilatura (Barbaresi, ACL 2021 demo; boilerplate such as menus, ads
and footers is dropped). It returns a :class:`~drgym.types.Document` whose ``text`` is
the page's main text, so a web backend's ``fetch`` has the same shape as the local
engine's.

Limits (all configurable):

- only ``http``/``https`` URLs;
- ``Content-Type`` must be HTML, XHTML or plain text (PDFs, images, archives are
  refused with :class:`UnsupportedContentError`);
- at most ``max_bytes`` of body are read (a longer body is cut and the document gets
  ``metadata["truncated"] = True``; a ``Content-Length`` beyond it is read up to the cap);
- at most ``max_chars`` of extracted text are kept.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from urllib.parse import urlsplit

import httpx

from drgym.errors import BadQueryError, DocumentNotFoundError, SearchError
from drgym.search.retry import send_with_retries
from drgym.types import Document

log = logging.getLogger(__name__)

#: Content types whose text can be extracted.
TEXT_TYPES: tuple[str, ...] = ("text/html", "application/xhtml+xml", "text/plain")
DEFAULT_USER_AGENT = "drgym/0.1 (+https://github.com/drgym/drgym; research page fetcher)"


class UnsupportedContentError(SearchError):
    """The page is not HTML or text (a PDF, an image...), so no text can be extracted."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def extract_main_text(html: str | bytes, url: str | None = None) -> tuple[str, str]:
    """Main text and title of an HTML page.

    Uses ``trafilatura.bare_extraction`` (comments excluded, tables kept); when it finds
    no main content (very short pages), falls back to ``trafilatura.html2txt`` (all
    visible text).

    Args:
        html: the page source, as text or raw bytes (trafilatura detects the charset).
        url: the page URL (helps trafilatura's metadata extraction).

    Returns:
        ``(text, title)``; either may be ``""``.
    """
    import trafilatura  # lxml-based; imported here to keep `import drgym` light

    title = ""
    text = ""
    try:
        doc = trafilatura.bare_extraction(html, url=url, include_comments=False, with_metadata=True)
    except (ValueError, TypeError) as e:  # trafilatura raises ValueError on broken input
        log.info("trafilatura failed on %s: %s", url, e)
        doc = None
    if doc is not None:
        text = (getattr(doc, "text", None) or "").strip()
        title = (getattr(doc, "title", None) or "").strip()
    if not text:
        text = (trafilatura.html2txt(html) or "").strip()
    if not title:
        raw = html.decode("utf-8", "replace") if isinstance(html, bytes) else html
        m = re.search(r"<title[^>]*>(.*?)</title>", raw, flags=re.I | re.S)
        if m:
            title = " ".join(m.group(1).split())
    return text, title


class PageFetcher:
    """Download a web page and return its main text as a :class:`Document`.

    Args:
        timeout_s: per-attempt timeout in seconds (connect and read).
        max_bytes: largest body read, in bytes (default 5 MB).
        max_chars: largest extracted text kept, in characters (default 200k).
        attempts: tries on 429/5xx/timeouts (see :func:`drgym.search.retry.send_with_retries`).
        backoff_s: first retry backoff, seconds.
        allowed_types: accepted ``Content-Type`` media types.
        user_agent: the ``User-Agent`` header sent.
        client: an httpx client to use (else one is created and owned).
        source: the ``source`` field of returned documents.

    Thread-safe (httpx clients are).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 20.0,
        max_bytes: int = 5_000_000,
        max_chars: int = 200_000,
        attempts: int = 3,
        backoff_s: float = 0.5,
        allowed_types: tuple[str, ...] = TEXT_TYPES,
        user_agent: str = DEFAULT_USER_AGENT,
        client: httpx.Client | None = None,
        source: str = "web",
    ):
        if max_bytes < 1 or max_chars < 1:
            raise ValueError(f"max_bytes and max_chars must be positive, got {max_bytes}, {max_chars}.")
        self.max_bytes = int(max_bytes)
        self.max_chars = int(max_chars)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.allowed_types = tuple(t.lower() for t in allowed_types)
        self.source = source
        self._own_client = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=True,
            headers={"User-Agent": user_agent, "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.1"},
        )

    def fetch(self, url: str) -> Document:
        """Download ``url`` and extract its main text.

        Returns:
            A Document with ``doc_id == url``, ``url`` the requested URL, ``title`` and
            ``text`` from trafilatura, and metadata ``final_url`` (after redirects),
            ``content_type``, ``status``, ``fetched_at`` (UTC ISO 8601), ``bytes`` and
            ``truncated``.

        Raises:
            BadQueryError: not an http(s) URL.
            DocumentNotFoundError: HTTP 404 or 410.
            UnsupportedContentError: a content type outside ``allowed_types``.
            SearchError: another 4xx answer, or no text could be extracted.
            AuthError, BackendUnavailableError: see :func:`send_with_retries`.
        """
        if not isinstance(url, str) or urlsplit(url.strip()).scheme.lower() not in ("http", "https"):
            raise BadQueryError(f"fetch needs an http:// or https:// URL, got {url!r}.")
        url = url.strip()
        if not urlsplit(url).netloc:
            raise BadQueryError(f"fetch needs a URL with a host, got {url!r}.")
        resp = send_with_retries(
            self.client, "GET", url, backend="fetch", attempts=self.attempts, backoff_s=self.backoff_s, stream=True
        )
        try:
            if resp.status_code in (404, 410):
                raise DocumentNotFoundError(f"{url}: HTTP {resp.status_code}, the page does not exist.")
            if resp.status_code >= 400:
                raise SearchError(f"{url}: HTTP {resp.status_code} while fetching the page.")
            ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype and ctype not in self.allowed_types:
                raise UnsupportedContentError(
                    f"{url}: content type {ctype!r} is not supported; drgym extracts text from {', '.join(self.allowed_types)}."
                )
            chunks: list[bytes] = []
            size = 0
            truncated = False
            for chunk in resp.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= self.max_bytes:
                    truncated = size > self.max_bytes
                    break
            body = b"".join(chunks)[: self.max_bytes]
            final_url = str(resp.url)
            encoding = resp.charset_encoding or "utf-8"
        finally:
            resp.close()

        if ctype == "text/plain":
            text, title = body.decode(encoding, "replace").strip(), ""
        else:
            text, title = extract_main_text(body, url=final_url)
        if not text:
            raise SearchError(f"{url}: no text could be extracted from the page ({len(body)} bytes of {ctype or 'unknown type'}).")
        if len(text) > self.max_chars:
            text, truncated = text[: self.max_chars], True
        return Document(
            doc_id=url,
            url=url,
            title=title,
            text=text,
            source=self.source,
            metadata={
                "final_url": final_url,
                "content_type": ctype,
                "status": resp.status_code,
                "fetched_at": _now(),
                "bytes": len(body),
                "truncated": truncated,
            },
        )

    def close(self) -> None:
        """Close the owned HTTP client. Idempotent."""
        if self._own_client:
            self.client.close()
