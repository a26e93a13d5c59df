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
- at most ``max_chars`` of extracted text are kept;
- at most ``max_time_s`` seconds per fetch, redirects and body together (each attempt's
  timeout is cut to what is left; a body still arriving then is cut like a long one).

Safety (server-side request forgery): the URL an agent writes is untrusted, so

- the host is resolved (``socket.getaddrinfo``) and refused, before anything is sent,
  when any of its addresses is loopback, private, link-local, multicast, reserved,
  unspecified or otherwise not globally routable (:func:`address_refusal`; IPv4 inside
  IPv6 -- mapped, NAT64, 6to4, Teredo -- is checked as the IPv4 address);
- redirects are followed by hand (at most ``max_redirects``), each ``Location`` checked
  the same way before it is requested;
- the connection itself goes to an address that passed the check (the transport resolves,
  checks and connects to that address), so a DNS answer that changes between the check
  and the connection (DNS rebinding) is refused too;
- environment proxies are not used (a proxy would hide the target address from the check).

A refusal raises :class:`FetchRefusedError` naming the URL, the address and why. Tests
that serve pages on 127.0.0.1 pass ``allow_loopback=True`` (loopback only: private,
link-local... stay refused).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.errors import (
    AuthError,
    BackendUnavailableError,
    BadQueryError,
    DocumentNotFoundError,
    SearchError,
    ServiceUnavailableError,
)
from drgym.search.retry import send_with_retries
from drgym.types import Document

log = logging.getLogger(__name__)

#: Content types whose text can be extracted.
TEXT_TYPES: tuple[str, ...] = ("text/html", "application/xhtml+xml", "text/plain")
DEFAULT_USER_AGENT = "drgym/0.1 (+https://github.com/drgym/drgym; research page fetcher)"


class UnsupportedContentError(SearchError):
    """The page is not HTML or text (a PDF, an image...), so no text can be extracted."""


class FetchRefusedError(SearchError):
    """drgym refused to fetch a URL, and sent nothing to the refused address.

    Raised when the host is (or resolves to) a loopback, private, link-local, multicast,
    reserved or unspecified address, when a redirect leads to such a host or to a
    non-http(s) URL, after more than ``max_redirects`` redirects, or (web backends) when
    the URL was not in the backend's search results. The agent sees the message as the
    fetch's observation.

    Attributes:
        reason: a short tag: ``"address"``, ``"scheme"``, ``"url"`` (not a valid URL),
            ``"redirects"`` or ``"not-in-results"`` (``""`` when rebuilt from a recording).
    """

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, NAT64 64:ff9b::/96, 6to4, Teredo)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def address_refusal(address: str, *, allow_loopback: bool = False) -> str | None:
    """Why a page may not be fetched from ``address``, or None for a public address.

    Args:
        address: an IPv4 or IPv6 address literal (a scope suffix ``%eth0`` is ignored).
        allow_loopback: accept loopback addresses (127.0.0.0/8, ::1); for tests only.

    Returns:
        ``None`` when the address is globally routable, else its category:
        ``"unspecified"``, ``"loopback"``, ``"link-local"``, ``"multicast"``,
        ``"private"``, ``"reserved"`` or ``"not globally routable"`` (e.g. 100.64.0.0/10),
        or ``"not an IP address"``.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            why = address_refusal(str(inner), allow_loopback=allow_loopback)
            if why is not None:
                return why
            if ip.ipv4_mapped is not None:
                return None
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return None if allow_loopback else "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routable"
    return None


def resolve_public(host: str, port: int, *, allow_loopback: bool = False, url: str | None = None) -> list[str]:
    """Resolve ``host`` and check every address it has (see :func:`address_refusal`).

    Args:
        host: a host name or IP literal (IPv6 without brackets).
        port: the TCP port (resolution is per port and socket type).
        allow_loopback: accept loopback addresses (tests).
        url: the URL named in the error message (default ``host``).

    Returns:
        The addresses (strings, resolver order, duplicates removed); all are allowed.

    Raises:
        FetchRefusedError: some address is refused (a host with one private address among
            public ones is refused: the connection could go to any of them).
        socket.gaierror: the name does not resolve.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[str] = []
    for *_, sockaddr in infos:
        addr = str(sockaddr[0])
        why = address_refusal(addr, allow_loopback=allow_loopback)
        if why is not None:
            shown = host if host == addr else f"{host} ({addr})"
            raise FetchRefusedError(
                f"fetch refused: {url or host} points at {shown} ({why} address); drgym only fetches "
                "pages on public internet addresses.", reason="address")
        if addr not in out:
            out.append(addr)
    if not out:
        raise socket.gaierror(f"{host!r} has no address")
    return out


class _CheckedNetworkBackend(httpcore.SyncBackend):
    """Resolves the host itself, checks every address (:func:`resolve_public`) and connects
    to a checked address, so the address connected to is the address that was checked."""

    def __init__(self, allow_loopback: bool) -> None:
        self.allow_loopback = allow_loopback

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None) -> httpcore.NetworkStream:
        try:
            addresses = resolve_public(host, port, allow_loopback=self.allow_loopback)
        except OSError as e:  # socket.gaierror: as an unreachable host (retried, then BackendUnavailableError)
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {e}") from e
        last: Exception | None = None
        for addr in addresses:
            try:
                return super().connect_tcp(addr, port, timeout=timeout, local_address=local_address,
                                           socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                last = e
        assert last is not None
        raise last


class _CheckedTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose connections go through :class:`_CheckedNetworkBackend`."""

    def __init__(self, allow_loopback: bool, limits: httpx.Limits = httpx.Limits(max_connections=100,
                                                                               max_keepalive_connections=20)):
        super().__init__(trust_env=False, limits=limits)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),  # SSL_CERT_FILE / SSL_CERT_DIR honoured, as before
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_CheckedNetworkBackend(allow_loopback),
        )


_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_LOCATION = "x-drgym-location"
"""Where :func:`_take_location` moves a response's ``Location`` header."""


def _take_location(response: httpx.Response) -> None:
    """Response hook of a :class:`PageFetcher`'s client: move ``Location`` to
    :data:`_LOCATION`, so httpx does not build the redirect request itself (it does for
    every redirect, followed or not, and a malformed ``Location`` then raises its own URL
    errors, or a ``RemoteProtocolError`` that would be retried as a broken connection).
    :meth:`PageFetcher.fetch` reads, checks and follows it."""
    location = response.headers.get("location")
    if location is not None:
        del response.headers["location"]
        response.headers[_LOCATION] = location


URL_ERRORS: tuple[type[Exception], ...] = (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.LocalProtocolError,
                                           UnicodeError)
"""What httpx raises for a URL it cannot parse or send: ``InvalidURL``,
``UnsupportedProtocol`` (a scheme it has no transport for), ``LocalProtocolError`` (a
request it cannot write), and the ``idna`` codec's ``UnicodeError`` (``idna.IDNAError`` is
one: a host that is no valid internationalised name, a label over 63 characters)."""


_HOST = re.compile(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]+")
"""A host as httpx sends it: an ASCII name (IDNA-encoded), IPv4 or IPv6 (no zone: a zone
names an interface of this machine, never a web address)."""


def parse_page_url(url: str) -> httpx.URL:
    """``url`` parsed as httpx will send it, with a valid host and a port in 1..65535.

    Raises:
        ValueError: a URL httpx cannot parse (the :data:`URL_ERRORS` as one message
            naming the problem: ``http://[::1``, ``http://xn--/``), a host with
            characters no host name has (``http://a b/``, ``http://%zz/``) or labels no
            name has (empty, over 63 characters), or a port
            outside 1..65535 (refused here: the resolver would wrap it, 99999 becoming
            port 34463).
    """
    try:
        parsed = httpx.URL(url)
        parsed.host  # noqa: B018 - decodes an internationalised name, which may fail
    except URL_ERRORS as e:
        raise ValueError(f"{type(e).__name__}: {e}") from e
    raw = parsed.raw_host.decode("ascii", "replace")
    if raw and not _HOST.fullmatch(raw):
        raise ValueError(f"host {raw!r} is not a host name nor an IP address")
    if raw and ":" not in raw:  # a name or IPv4: labels of 1..63 characters, 253 in all (RFC 1035)
        labels = raw[:-1].split(".") if raw.endswith(".") else raw.split(".")
        if len(raw) > 253 or any(not 1 <= len(label) <= 63 for label in labels):
            raise ValueError(f"host {raw[:80]!r} is not a valid host name (an empty label, one over 63 characters, "
                             "or over 253 in all)")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(f"port {parsed.port} is outside 1..65535")
    return parsed


def _via(url: str, current: str) -> str:
    """`` (redirected to <current>)`` when a redirect led from ``url`` to ``current``."""
    return f" (redirected to {current})" if current != url else ""


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
        retry: retries of 429/5xx/timeouts (:func:`drgym.search.retry.send_with_retries`)
            and the per-attempt timeout (connect and read), a
            :class:`~drgym.config.RetryPolicy` or its fields; unset fields keep
            :attr:`DEFAULT_RETRY` (3 attempts of 20 s, backoff 0.5 s with jitter doubling up
            to 20 s).
        max_bytes: largest body read, in bytes (default 5 MB).
        max_chars: largest extracted text kept, in characters (default 200k).
        allowed_types: accepted ``Content-Type`` media types.
        user_agent: the ``User-Agent`` header sent.
        client: an httpx client to use (else one is created and owned). It must not follow
            redirects itself (they are followed and checked here); a client given here
            connects without the connection-time address check (the URL of every hop is
            still checked before it is requested). The fetcher adds a response hook to
            it that moves each response's ``Location`` header to ``x-drgym-location``.
        source: the ``source`` field of returned documents.
        max_redirects: redirects followed per fetch (more: :class:`FetchRefusedError`).
        max_time_s: longest a fetch may take, seconds, all redirects and the body together.
        allow_loopback: accept pages on loopback addresses (127.0.0.0/8, ::1). Off by
            default; for tests that serve pages on 127.0.0.1. Private, link-local and the
            other refused categories stay refused.

    Attributes:
        retry: the :class:`~drgym.config.RetryPolicy` in use (every field set).

    Raises:
        ValueError: a limit is not positive, or ``client`` follows redirects.
        ConfigError: a bad ``retry`` (a ``ValueError`` too).

    Thread-safe (httpx clients are).
    """

    DEFAULT_RETRY = RetryPolicy(attempts=3, timeout_s=20.0, backoff_s=0.5, max_backoff_s=20.0)
    """The fetcher's retries when ``retry`` leaves a field unset."""

    def __init__(
        self,
        *,
        retry: RetryLike = None,
        max_bytes: int = 5_000_000,
        max_chars: int = 200_000,
        allowed_types: tuple[str, ...] = TEXT_TYPES,
        user_agent: str = DEFAULT_USER_AGENT,
        client: httpx.Client | None = None,
        source: str = "web",
        max_redirects: int = 5,
        max_time_s: float = 60.0,
        allow_loopback: bool = False,
    ):
        if max_bytes < 1 or max_chars < 1:
            raise ValueError(f"max_bytes and max_chars must be positive, got {max_bytes}, {max_chars}.")
        if not max_time_s > 0 or max_redirects < 0:
            raise ValueError(f"max_time_s must be > 0 and max_redirects >= 0, got {max_time_s}, {max_redirects}.")
        if client is not None and client.follow_redirects:
            raise ValueError("PageFetcher needs a client with follow_redirects=False: it follows and checks redirects itself.")
        self.retry = resolve_retry(retry, self.DEFAULT_RETRY)
        self.max_bytes = int(max_bytes)
        self.max_chars = int(max_chars)
        self.max_redirects = int(max_redirects)
        self.max_time_s = float(max_time_s)
        self.allow_loopback = bool(allow_loopback)
        self.allowed_types = tuple(t.lower() for t in allowed_types)
        self.source = source
        self._own_client = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(self.retry.timeout_s),
            follow_redirects=False,
            transport=_CheckedTransport(self.allow_loopback),
            headers={"User-Agent": user_agent, "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.1"},
        )
        hooks = self.client.event_hooks
        if _take_location not in hooks["response"]:
            self.client.event_hooks = {**hooks, "response": [*hooks["response"], _take_location]}

    def check_url(self, url: str, *, requested: str | None = None) -> None:
        """Refuse ``url`` unless it is http(s) on a host whose addresses are all public.

        Args:
            url: the URL about to be requested.
            requested: the URL the agent asked for (named in messages when ``url`` is a
                redirect target).

        Raises:
            FetchRefusedError: another scheme, a URL that cannot be parsed or a port
                outside 1..65535 (:func:`parse_page_url`), or a refused address (see
                :func:`address_refusal`). A name that does not resolve passes (the request
                then fails as an unreachable host).
        """
        via = f" (redirected from {requested})" if requested and requested != url else ""
        try:
            parts = parse_page_url(url)
        except ValueError as e:
            raise FetchRefusedError(f"fetch refused: {url}{via} is not a valid URL ({e}).", reason="url") from e
        if parts.scheme not in ("http", "https"):
            raise FetchRefusedError(f"fetch refused: {url}{via} is not an http:// or https:// URL.", reason="scheme")
        host = parts.host
        if not host:
            raise FetchRefusedError(f"fetch refused: {url}{via} has no host.", reason="scheme")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            resolve_public(host, port, allow_loopback=self.allow_loopback, url=f"{url}{via}")
        except OSError as e:  # does not resolve: the connection attempt reports it (and re-checks)
            log.info("fetch: %s does not resolve (%s)", host, e)

    def fetch(self, url: str) -> Document:
        """Download ``url`` and extract its main text.

        Redirects (301/302/303/307/308) are followed by hand, at most ``max_redirects``,
        each target checked with :meth:`check_url` before it is requested (httpx never
        reads ``Location`` itself: the client gets a response hook that moves it aside).

        Returns:
            A Document with ``doc_id == url``, ``url`` the requested URL, ``title`` and
            ``text`` from trafilatura, and metadata ``final_url`` (after redirects),
            ``redirects`` (the URLs redirected to, in order), ``content_type``, ``status``,
            ``fetched_at`` (UTC ISO 8601), ``bytes``, ``truncated`` (body cut at
            ``max_bytes`` or at ``max_time_s``, or text cut at ``max_chars``) and
            ``cut_by`` (``"max_bytes"``, ``"max_time_s"``, ``"max_chars"`` or None).

        Raises:
            BadQueryError: not an http(s) URL.
            FetchRefusedError: a refused address (the URL's or a redirect's), a redirect to
                another scheme, or more than ``max_redirects`` redirects.
            DocumentNotFoundError: HTTP 404 or 410.
            UnsupportedContentError: a content type outside ``allowed_types``.
            SearchError: another 4xx answer (401 and 403 too: the page refused access), no
                text could be extracted, or a bad redirect:
                a ``Location`` that is no valid URL (``http:127.0.0.1:1/x``, a host that
                is no valid name, a port outside 1..65535), in a message that names the
                page first, as every error of a page (nothing is sent to such a target).
            BackendUnavailableError: the page (or a redirect's target) did not answer, timed
                out or answered 429/5xx after the retries (:func:`send_with_retries`), or
                ``max_time_s`` ran out before an answer came.

        A run counts each of these as the agent's observation, not as a failure of the
        search backend (:func:`drgym.evaluation.metrics.episode_failures`): the refusals
        and a bad URL by their class, the others because their message names the page
        first (``"<url>: ..."``), so a hostile or dead page cannot fail an episode.
        """
        if not isinstance(url, str):
            raise BadQueryError(f"fetch needs an http:// or https:// URL, got {url!r}.")
        url = url.strip()
        try:
            parts = urlsplit(url)  # ValueError: e.g. an unclosed IPv6 bracket
            if parts.scheme.lower() not in ("http", "https"):
                raise BadQueryError(f"fetch needs an http:// or https:// URL, got {url!r}.")
            parsed = parse_page_url(url)
        except BadQueryError:
            raise
        except ValueError as e:
            raise BadQueryError(f"fetch needs a valid URL, got {url!r} ({e}).") from e
        if not parts.netloc or not parsed.host:
            raise BadQueryError(f"fetch needs a URL with a host, got {url!r}.")
        deadline = time.monotonic() + self.max_time_s
        current = url
        redirects: list[str] = []
        for _ in range(self.max_redirects + 1):
            self.check_url(current, requested=url)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendUnavailableError(f"{url}: no answer within max_time_s={self.max_time_s:g} s "
                                              f"({len(redirects)} redirect(s) followed).")
            try:
                resp = send_with_retries(
                    self.client, "GET", current, backend="fetch", retry=self.retry,
                    stream=True, timeout=httpx.Timeout(min(self.retry.timeout_s, left)),
                )
            except URL_ERRORS as e:  # a URL httpx cannot send (parsed and checked above): nothing was sent
                raise SearchError(f"{url}: cannot request {current!r} ({type(e).__name__}: {e}).") from e
            except AuthError as e:  # the page answered 401/403: the fetcher sends no credentials of ours
                code = re.search(r"HTTP (\d{3})", str(e))
                raise SearchError(f"{url}: HTTP {code.group(1) if code else '401/403'} while fetching the page"
                                  f"{_via(url, current)}: the page refused access.") from e
            except ServiceUnavailableError:
                raise
            except BackendUnavailableError as e:  # unreachable, timed out, 429/5xx after the retries
                raise BackendUnavailableError(f"{url}: the page could not be fetched{_via(url, current)} ({e})") from e
            location = resp.headers.get(_LOCATION)
            if resp.status_code not in _REDIRECTS or location is None:
                break
            resp.close()
            try:
                current = str(resp.url.join(location))
                parse_page_url(current)
            except (ValueError, *URL_ERRORS) as e:  # UnicodeError is a ValueError
                raise SearchError(f"{url}: HTTP {resp.status_code} redirect to an invalid URL {location!r} ({e}).") from e
            redirects.append(current)
        else:
            raise FetchRefusedError(
                f"fetch refused: {url} redirected more than max_redirects={self.max_redirects} times "
                f"(last to {current}); the page was not fetched.", reason="redirects")
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
            cut_by: str | None = None
            for chunk in resp.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= self.max_bytes:
                    if size > self.max_bytes:
                        cut_by = "max_bytes"
                    break
                if time.monotonic() > deadline:
                    cut_by = "max_time_s"
                    log.warning("fetch: %s still sending after max_time_s=%g s; body cut at %d bytes",
                                url, self.max_time_s, size)
                    break
            body = b"".join(chunks)[: self.max_bytes]
            final_url = str(resp.url)
            encoding = resp.charset_encoding or "utf-8"
        except httpx.TransportError as e:  # the connection failed while the body was read
            raise BackendUnavailableError(f"{url}: the download broke off ({type(e).__name__}: {e}).") from e
        finally:
            resp.close()

        if ctype == "text/plain":
            text, title = body.decode(encoding, "replace").strip(), ""
        else:
            text, title = extract_main_text(body, url=final_url)
        if not text:
            raise SearchError(f"{url}: no text could be extracted from the page ({len(body)} bytes of {ctype or 'unknown type'}).")
        if len(text) > self.max_chars:
            text = text[: self.max_chars]
            cut_by = cut_by or "max_chars"
        return Document(
            doc_id=url,
            url=url,
            title=title,
            text=text,
            source=self.source,
            metadata={
                "final_url": final_url,
                "redirects": redirects,
                "content_type": ctype,
                "status": resp.status_code,
                "fetched_at": _now(),
                "bytes": len(body),
                "truncated": cut_by is not None,
                "cut_by": cut_by,
            },
        )

    def close(self) -> None:
        """Close the owned HTTP client. Idempotent."""
        if self._own_client:
            self.client.close()
