""":class:`MCPSearchBackend`: a :class:`SearchBackend` over any MCP server that offers a
search tool and a document tool (``drgym mcp``, BrowseComp-Plus's ``search`` /
``get_document`` server, or another of that shape).

Specs (:func:`drgym.search.registry.make_backend`)::

    mcp:http://127.0.0.1:8000/mcp                       # streamable HTTP
    mcp:stdio:python -m drgym mcp --corpus hotpotqa     # a command started as a subprocess

The official MCP Python SDK (``mcp``) is asynchronous; this backend runs it on a private
event loop in a daemon thread and keeps one session open, so its methods are ordinary
blocking, thread-safe calls. A stdio server is started on first use with this process's
environment and stopped by :meth:`~MCPSearchBackend.close`.

Tools and arguments: ``search_tool`` (default ``search``) gets ``{"query": ..., "k": ...}``,
``k`` only when the tool's input schema has a ``k`` property (BrowseComp-Plus's search
takes only ``query`` and answers its own fixed number of hits, which are cut to ``k``);
``document_tool`` (default ``get_document``) gets ``{"docid": ...}``; ``fetch_tool``
(default ``fetch``) gets ``{"url": ...}``. :meth:`~MCPSearchBackend.fetch` uses the fetch
tool when the server has it, else the document tool with the URL as the id (a hit
without a URL gets its ``doc_id`` as URL, so a fetch of it finds the document).

Answers are read tolerantly: the structured content when the server sends it (an object
with a ``results``/``hits``/``documents`` list, a ``{"result": [...]}`` wrapper or a bare
list), else JSON in the text content (one block holding the list, or one block per hit).
Fields: id from ``doc_id``/``docid``/``id``, text from ``text``/``snippet``/``contents``,
plus ``title``, ``url``, ``score``, ``source``; other keys go into ``metadata``. Ranks are
the positions, 1..n.

Errors follow :class:`~drgym.search.client.HTTPSearchClient`'s rules: a failed connection,
a broken session, a timeout or a server-side internal error is retried with exponential
backoff on a fresh session, as the backend's ``retry`` (:class:`~drgym.config.RetryPolicy`)
says (``attempts`` tries; once the server has answered, for at least ``reconnect_s``
seconds, so a restarted server is waited for), then raised as
:class:`~drgym.errors.ServiceUnavailableError`. A tool error (``isError`` result) whose
text names a drgym error class (``BadQueryError: ...``, what ``drgym mcp`` sends) is
raised as that class; a search tool's argument-validation error as
:class:`~drgym.errors.BadQueryError`; a document tool's empty answer (BrowseComp-Plus
returns ``null``) as :class:`~drgym.errors.DocumentNotFoundError`; any other tool error
as :class:`~drgym.errors.SearchError`. A malformed answer is a
:class:`~drgym.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar
from urllib.parse import urlparse

from drgym import errors as _errors
from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.errors import (
    AuthError,
    BackendUnavailableError,
    BadQueryError,
    ConfigError,
    DocumentNotFoundError,
    DrgymError,
    SearchError,
    ServiceUnavailableError,
)
from drgym.search.base import SearchBackend
from drgym.search.retry import retrying, with_reconnect
from drgym.types import Document, SearchResult

log = logging.getLogger(__name__)

SPEC_PREFIX = "mcp:"
STDIO_PREFIX = "stdio:"
API_KEY_ENV = "DRGYM_API_KEY"
"""The environment variable of the key sent when no ``api_key`` is given (as the ``http://`` client)."""
ENGINE_RESOURCE = "drgym://engine"
"""URI of the resource a drgym MCP server describes its engine with (identity and limits)."""

_T = TypeVar("_T")
_TOOL_PREFIX = re.compile(r"^Error executing tool [^:]*:\s*")
_ERROR_CLASS = re.compile(r"^([A-Z]\w*Error):\s*(.*)$", re.S)
_ID_KEYS = ("doc_id", "docid", "id", "ClueWeb22-ID")
_URL_KEYS = ("url", "URL", "link")
_TEXT_KEYS = ("text", "snippet", "contents", "content", "Clean-Text")
_LIST_KEYS = ("results", "hits", "documents", "result")
_CONSUMED = {*_ID_KEYS, *_URL_KEYS, *_TEXT_KEYS, "title", "score", "rank", "source", "metadata"}


def tool_error_text(exc: BaseException) -> str:
    """The text of the tool error a drgym MCP server answers for ``exc``:
    ``"<drgym error class>: <message>"`` (``"SearchError: <type>: <message>"`` for an
    exception that is not a drgym error). :class:`MCPSearchBackend` reads it back as
    that class."""
    if isinstance(exc, DrgymError):
        return f"{type(exc).__name__}: {exc}"
    return f"SearchError: {type(exc).__name__}: {exc}"


def parse_spec(spec: str) -> tuple[str, str | list[str]]:
    """``"mcp:http://h:1/mcp"`` -> ``("http", "http://h:1/mcp")``;
    ``"mcp:stdio:python -m drgym mcp"`` -> ``("stdio", ["python", "-m", "drgym", "mcp"])``
    (the command split as a POSIX shell would, :func:`shlex.split`).

    Raises:
        ConfigError: not an ``mcp:`` spec, a URL without a host, or an empty command.
    """
    s = spec.strip()
    if not s.lower().startswith(SPEC_PREFIX):
        raise ConfigError(f"{spec!r} is not an MCP backend spec; give 'mcp:http://HOST:PORT/mcp' or "
                          "'mcp:stdio:COMMAND ARGS...'.")
    rest = s[len(SPEC_PREFIX):].strip()
    if rest.lower().startswith(STDIO_PREFIX):
        try:
            argv = shlex.split(rest[len(STDIO_PREFIX):])
        except ValueError as e:
            raise ConfigError(f"{spec!r}: cannot split the command ({e}).") from e
        if not argv:
            raise ConfigError(f"{spec!r}: give the command that starts the server, e.g. "
                              "'mcp:stdio:drgym mcp --corpus hotpotqa'.")
        return "stdio", argv
    u = urlparse(rest)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ConfigError(f"{spec!r}: give 'mcp:http://HOST:PORT/mcp' (streamable HTTP) or "
                          "'mcp:stdio:COMMAND ARGS...'.")
    return "http", rest


def spec_record_name(spec: str) -> str:
    """The recording key of an ``mcp:`` spec: ``mcp:`` + the URL without a trailing slash,
    or ``mcp:stdio:`` + the command re-joined with single spaces.

    Raises:
        ConfigError: as :func:`parse_spec`.
    """
    transport, target = parse_spec(spec)
    if transport == "http":
        return SPEC_PREFIX + str(target).rstrip("/")
    return SPEC_PREFIX + STDIO_PREFIX + shlex.join(target)  # type: ignore[arg-type]


class _Transient(Exception):
    """A failure worth a retry on a fresh session (connection, timeout, server internal error)."""


def _first(rec: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        v = rec.get(key)
        if v is not None and v != "":
            return v
    return None


def record_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """Map one hit or document of an MCP answer to Document/SearchResult fields.

    Accepts drgym's shape (``doc_id``, ``title``, ``url``, ``text``, ``score``, ``source``),
    BrowseComp-Plus's (``docid``, ``snippet`` or ``text``, ``score``) and the
    DeepResearchGym keys (``id``, ``URL``, ``Clean-Text``).

    Returns:
        ``{"doc_id", "url", "title", "text", "source", "metadata"}`` (``url`` is the doc_id
        when the record has none; ``metadata`` holds the record's own ``metadata`` object
        and the unconsumed keys).

    Raises:
        BackendUnavailableError: the record has no id.
    """
    doc_id = _first(rec, _ID_KEYS)
    url = _first(rec, _URL_KEYS)
    if doc_id is None and url is None:
        raise BackendUnavailableError(f"an MCP record has no id (doc_id, docid or id) nor url: {str(rec)[:160]!r}")
    text = _first(rec, _TEXT_KEYS)
    title = rec.get("title")
    if title is None and "Clean-Text" in rec and text == rec["Clean-Text"]:  # ClueWeb22: first line is the title
        title, _, text = str(text).partition("\n")
    meta = dict(rec["metadata"]) if isinstance(rec.get("metadata"), dict) else {}  # drgym's own metadata field
    meta.update({k: v for k, v in rec.items() if k not in _CONSUMED})
    return {"doc_id": str(doc_id if doc_id is not None else url), "url": str(url if url is not None else doc_id),
            "title": str(title or ""), "text": str(text or ""), "source": str(rec.get("source") or ""),
            "metadata": meta}


def _payload(result: Any) -> Any:
    """The data of a successful tool result: structured content, else the JSON of its text."""
    sc = getattr(result, "structured_content", None)
    if sc is not None:
        if isinstance(sc, dict) and set(sc) == {"result"}:  # the SDKs' wrapper of a non-object return value
            return sc["result"]
        return sc
    texts = [c.text for c in (result.content or []) if getattr(c, "type", None) == "text"]
    parsed = []
    for t in texts:
        try:
            parsed.append(json.loads(t))
        except ValueError:
            parsed.append(t)
    if not parsed:
        return None
    return parsed[0] if len(parsed) == 1 else parsed


def _hit_records(payload: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(payload, dict):
        for key in _LIST_KEYS:
            if isinstance(payload.get(key), list):
                payload = payload[key]
                break
        else:
            if payload.get("error") and _first(payload, _ID_KEYS) is None:
                raise SearchError(f"{where}: {payload['error']}")
            payload = [payload] if _first(payload, _ID_KEYS) is not None else payload
    if payload is None:
        return []
    if not isinstance(payload, list):
        raise BackendUnavailableError(f"{where}: expected a list of hits, got {str(payload)[:160]!r}")
    out = []
    for item in payload:
        if isinstance(item, str):
            try:
                item = json.loads(item)
            except ValueError:
                raise BackendUnavailableError(f"{where}: a hit is not a JSON object: {item[:160]!r}") from None
        if not isinstance(item, dict):
            raise BackendUnavailableError(f"{where}: a hit is not an object: {str(item)[:160]!r}")
        out.append(item)
    return out


def _error_class(name: str) -> type[DrgymError] | None:
    cls = getattr(_errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, DrgymError) else None


class _Session:
    """One open MCP session on the private loop: the client, its tools and a stop event."""

    def __init__(self, client: Any, tools: dict[str, Any], engine: dict[str, Any] | None, stop: asyncio.Event,
                 task: asyncio.Task) -> None:
        self.client = client
        self.tools = tools
        self.engine = engine
        self.stop = stop
        self.task = task


class MCPSearchBackend(SearchBackend):
    """Search and fetch through an MCP server's tools.

    Args:
        target: the server: an ``http(s)://`` streamable-HTTP endpoint URL, or the command
            (a list of arguments, or one string split like a shell) of a stdio server.
        transport: ``"http"`` or ``"stdio"``; None: ``http`` for a URL, else ``stdio``.
        search_tool: the search tool's name (default ``search``).
        document_tool: the tool that returns a document by id (default ``get_document``,
            argument ``docid``).
        fetch_tool: the tool that returns a document by URL (default ``fetch``, argument
            ``url``); when the server has none, :meth:`fetch` asks ``document_tool``.
        retry: retries of transient failures and the timeout of one tool call (and of
            connecting), a :class:`~drgym.config.RetryPolicy` or its fields; unset fields
            keep :attr:`DEFAULT_RETRY` (4 attempts of 60 s, backoff 0.5 s with jitter
            doubling up to 8 s; once the server has answered, a failing call is retried for
            at least ``reconnect_s`` seconds, by default ``$DRGYM_RECONNECT_S`` or 60).
        max_k: the largest ``k`` accepted before the server is seen; replaced by the
            server's (a drgym server's ``max_k``, or the ``maximum`` of the search tool's
            ``k``) on connecting.
        workers: threads for concurrent tool calls in :meth:`search_batch`.
        env: environment of a stdio server (default: this process's environment).
        cwd: working folder of a stdio server (default: this process's).
        name: backend name in logs and errors (default ``"mcp"``).
        deterministic: whether rankings are repeatable (True: a fixed index).
        api_key: sent as ``x-api-key`` to an HTTP server (``drgym mcp --api-keys``); None
            reads ``DRGYM_API_KEY``; unused over stdio. A server that refuses it answers
            401, raised as :class:`~drgym.errors.AuthError` (not retried).

    Attributes:
        retry: the :class:`~drgym.config.RetryPolicy` in use (every field set).

    Raises:
        ConfigError: a bad URL, an empty command or one not found on ``PATH``, or a bad
            ``retry``.
    """

    DEFAULT_RETRY = RetryPolicy(attempts=4, timeout_s=60.0, backoff_s=0.5, max_backoff_s=8.0)
    """The backend's retries when ``retry`` leaves a field unset."""

    def __init__(
        self,
        target: str | list[str],
        *,
        transport: str | None = None,
        search_tool: str = "search",
        document_tool: str = "get_document",
        fetch_tool: str | None = "fetch",
        retry: RetryLike = None,
        max_k: int = 100,
        workers: int = 8,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        name: str = "mcp",
        deterministic: bool = True,
        api_key: str | None = None,
    ) -> None:
        if transport is None:
            transport = "http" if isinstance(target, str) and target.strip().lower().startswith(("http://", "https://")) \
                else "stdio"
        if transport not in ("http", "stdio"):
            raise ConfigError(f"transport must be 'http' or 'stdio', got {transport!r}.")
        self.retry = with_reconnect(resolve_retry(retry, self.DEFAULT_RETRY))
        if transport == "http":
            url = str(target).strip()
            u = urlparse(url)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise ConfigError(f"an MCP endpoint must be an http(s) URL such as 'http://127.0.0.1:8000/mcp', "
                                  f"got {target!r}.")
            self.target: str | list[str] = url
        else:
            argv = shlex.split(target) if isinstance(target, str) else [str(a) for a in target]
            if not argv:
                raise ConfigError("an MCP stdio server needs a command, e.g. ['drgym', 'mcp', '--corpus', 'hotpotqa'].")
            if shutil.which(argv[0]) is None:
                raise ConfigError(f"MCP stdio server command {argv[0]!r} not found (not an executable file, nor on "
                                  "PATH).")
            self.target = argv
        self.transport = transport
        self.search_tool = search_tool
        self.document_tool = document_tool
        self.fetch_tool = fetch_tool
        self.max_k = int(max_k)
        self.workers = max(1, int(workers))
        self.env = dict(os.environ) if env is None else dict(env)
        self.cwd = cwd
        self.name = name
        self.deterministic = deterministic
        if api_key is None:
            api_key = os.environ.get(API_KEY_ENV) or None
        self._api_key = api_key if transport == "http" else None
        self._answered = False
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._session: _Session | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> "MCPSearchBackend":
        """The backend of an ``mcp:`` spec (see the module doc); ``kwargs`` as the constructor.

        Raises:
            ConfigError: as :func:`parse_spec` and the constructor.
        """
        transport, target = parse_spec(spec)
        return cls(target, transport=transport, **kwargs)

    def describe(self) -> str:
        """The server in one line: its URL, or ``stdio:`` and its command."""
        return str(self.target) if self.transport == "http" else "stdio:" + shlex.join(self.target)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"MCPSearchBackend({self.describe()!r}, search_tool={self.search_tool!r})"

    # -- the private event loop ----------------------------------------------------------
    def _run(self, coro_fn: Callable[[], Any], timeout: float) -> Any:
        """Run ``coro_fn()`` on the private loop and wait at most ``timeout`` seconds.

        Raises:
            TimeoutError: it took longer (the coroutine is cancelled).
        """
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"{self.name}: the backend is closed.")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="drgym-mcp-loop", daemon=True)
                self._thread.start()
            loop = self._loop
        fut = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro_fn(), timeout), loop)
        try:
            return fut.result(timeout + 5.0)
        except TimeoutError:
            fut.cancel()
            raise

    def credentials(self) -> tuple[str, ...]:
        """The ``x-api-key`` sent, if any (see :meth:`SearchBackend.credentials`)."""
        return (self._api_key,) if self._api_key else ()

    def _server(self) -> Any:
        from mcp.client.stdio import StdioServerParameters

        if self.transport == "http":
            return _keyed_http(str(self.target), self._api_key) if self._api_key else self.target
        argv = list(self.target)
        return StdioServerParameters(command=argv[0], args=argv[1:], env=self.env, cwd=self.cwd)

    async def _open(self) -> _Session:
        """Start a session task; it keeps the client open until its stop event is set."""
        from mcp import Client

        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()

        async def main() -> None:
            try:
                async with Client(self._server(), cache=None, read_timeout_seconds=self.retry.timeout_s) as client:
                    tools: dict[str, Any] = {}
                    cursor = None
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools.update({t.name: t for t in page.tools})
                        cursor = page.next_cursor
                        if not cursor:
                            break
                    engine = await self._read_engine(client)
                    ready.set_result((client, tools, engine))
                    await stop.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, or logged once the session ran
                if not ready.done():
                    ready.set_exception(e if isinstance(e, Exception) else _Transient(repr(e)))
                elif not isinstance(e, asyncio.CancelledError):
                    log.warning("%s: the MCP session to %s ended: %s", self.name, self.describe(), _describe(e))
                if isinstance(e, asyncio.CancelledError):
                    raise

        task = asyncio.get_running_loop().create_task(main())
        try:
            client, tools, engine = await ready
        except BaseException:
            stop.set()
            task.cancel()  # still connecting (a timeout): give up on it
            raise
        return _Session(client, tools, engine, stop, task)

    async def _read_engine(self, client: Any) -> dict[str, Any] | None:
        """The ``drgym://engine`` resource of a drgym server (None when the server has none)."""
        try:
            listed = await client.list_resources()
            if not any(str(r.uri) == ENGINE_RESOURCE for r in listed.resources):
                return None
            res = await client.read_resource(ENGINE_RESOURCE)
            text = next((c.text for c in res.contents if getattr(c, "text", None)), None)
            info = json.loads(text) if text else None
            return info if isinstance(info, dict) else None
        except Exception as e:  # a server without resources: no engine description
            log.debug("%s: no engine resource (%s)", self.name, e)
            return None

    def _connect(self) -> _Session:
        """The open session, opening one when there is none.

        Raises:
            _Transient: the server could not be reached or the handshake failed.
            ConfigError: the server has no tool named ``search_tool``.
        """
        with self._connect_lock:  # one connection attempt at a time: concurrent callers share it
            with self._lock:
                session = self._session
            if session is None or session.task.done():
                try:
                    session = self._run(self._open, self.retry.timeout_s)
                except (ConfigError, BackendUnavailableError):
                    raise
                except Exception as e:
                    refused = _auth_refusal(e)
                    if refused is not None:  # a wrong or missing key: retrying cannot help
                        raise AuthError(f"{self.name}: the MCP server {self.describe()} refused the connection: "
                                        f"{refused}") from e
                    raise _Transient(f"could not connect ({_describe(e)})") from e
                with self._lock:
                    self._session = session
                self._answered = True  # the server answered (then reconnect_s applies)
                self._adopt_limits(session)
        if self.search_tool not in session.tools:
            raise ConfigError(f"{self.name}: the MCP server {self.describe()} has no tool {self.search_tool!r} "
                              f"(it has {', '.join(sorted(session.tools)) or 'none'}); set search_tool=.")
        return session

    def _adopt_limits(self, session: _Session) -> None:
        engine_k = (session.engine or {}).get("max_k")
        schema_k = self._k_schema(session).get("maximum")
        for value in (engine_k, schema_k):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                self.max_k = value
                return

    def _k_schema(self, session: _Session) -> dict[str, Any]:
        tool = session.tools.get(self.search_tool)
        props = (getattr(tool, "input_schema", None) or {}).get("properties") or {}
        k = props.get("k")
        return k if isinstance(k, dict) else {}

    def _stop_session(self, session: _Session) -> None:
        if self._loop is None or session.task.done():
            return

        async def stop() -> None:
            session.stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(session.task), 10.0)
            except BaseException:  # noqa: BLE001 - a session that does not stop in time is cancelled
                session.task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(15.0)
        except Exception as e:
            log.warning("%s: closing the MCP session to %s failed: %s", self.name, self.describe(), _describe(e))

    def _drop(self, session: _Session) -> None:
        """Forget ``session`` (a broken one) so the next call opens a fresh one."""
        with self._lock:
            if self._session is session:
                self._session = None
            else:
                return
        self._stop_session(session)

    # -- calls -------------------------------------------------------------------------
    def _call(self, tool: str, arguments: dict[str, Any], what: str) -> Any:
        """Call ``tool`` with retries; returns the successful CallToolResult.

        Raises:
            ServiceUnavailableError: transient failures outlasted the retries.
            BadQueryError, DocumentNotFoundError, SearchError: a tool error (see the module doc).
        """
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, INTERNAL_ERROR, INVALID_PARAMS, REQUEST_TIMEOUT

        def once() -> Any:
            session = self._connect()
            try:
                result = self._run(lambda: session.client.call_tool(tool, arguments), self.retry.timeout_s)
            except MCPError as e:
                if e.code in (CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT):
                    self._drop(session)
                    raise _Transient(f"MCP error {e.code}: {e.message}") from e
                if e.code == INVALID_PARAMS:
                    raise BadQueryError(f"{self.name}: {tool}: {e.message}") from e
                raise SearchError(f"{self.name}: {tool}: MCP error {e.code}: {e.message}") from e
            except (DrgymError, _Transient):
                raise
            except Exception as e:  # the transport: connection lost, timeout, a dead subprocess
                self._drop(session)
                raise _Transient(_describe(e)) from e
            self._answered = True
            if result.is_error:
                raise self._tool_error(tool, result)
            return result

        return self._with_retries(once, what)

    def _with_retries(self, once: Callable[[], _T], what: str) -> _T:
        reconnect = float(self.retry.reconnect_s or 0.0) if self._answered else 0.0
        loop = retrying(self.retry, name=self.name, retry_on=_Transient, min_elapsed_s=reconnect)
        try:
            return loop(once)
        except _Transient as e:
            made = int(loop.statistics.get("attempt_number") or self.retry.attempts)
            tries = f"{made} attempt(s)"
            if reconnect > 0:
                tries += f" over {float(loop.statistics.get('delay_since_first_attempt') or 0.0):.0f} s"
            raise ServiceUnavailableError(f"{self.name}: {what} failed on the MCP server {self.describe()}: {e} "
                                          f"— still failing after {tries}.") from e

    def _tool_error(self, tool: str, result: Any) -> Exception:
        text = " ".join(c.text for c in (result.content or []) if getattr(c, "type", None) == "text").strip()
        msg = " ".join(_TOOL_PREFIX.sub("", text).split()) or "(no message)"  # one line
        m = _ERROR_CLASS.match(msg)
        cls = _error_class(m.group(1)) if m else None
        if cls is not None and m is not None:
            detail = m.group(2)
            if not issubclass(cls, SearchError) or issubclass(cls, BackendUnavailableError):
                # the server's engine is down or its index broken (HTTP's 5xx): retried
                return _Transient(f"{tool} answered {msg}")
            try:
                return cls(f"{self.name}: {detail}")
            except TypeError:
                return SearchError(f"{self.name}: {msg}")
        if tool == self.search_tool and "validation error" in msg.lower():
            return BadQueryError(f"{self.name}: {tool}: {msg}")
        return SearchError(f"{self.name}: {tool} failed: {msg}")

    # -- SearchBackend -------------------------------------------------------------------
    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        """Top-``k`` hits of one ``search_tool`` call (see :meth:`SearchBackend.search`).

        Returns:
            At most ``k`` hits, ranks 1..n, ``score`` the server's (0.0 when it sends none;
            a score that is not a finite number, NaN or a boolean, is a malformed answer:
            :class:`~drgym.errors.BackendUnavailableError`).

        Raises:
            BadQueryError: empty query, k outside 1..max_k (checked before sending, and
                again with the server's max_k), or the server refused the query.
            ServiceUnavailableError, BackendUnavailableError, SearchError: see the module doc.
        """
        self.check_request([query], k)
        session = self._with_retries(self._connect, "connection")
        self.check_request([query], k)  # max_k may have come from the server
        args: dict[str, Any] = {"query": query}
        if "k" in ((getattr(session.tools.get(self.search_tool), "input_schema", None) or {}).get("properties") or {}):
            args["k"] = k
        result = self._call(self.search_tool, args, f"search of {query[:60]!r}")
        where = f"{self.name}: {self.search_tool}"
        out: list[SearchResult] = []
        for rec in _hit_records(_payload(result), where)[:k]:
            f = record_fields(rec)
            raw = rec.get("score")
            try:
                score = 0.0 if raw is None else float("nan") if isinstance(raw, bool) else float(raw)
            except (TypeError, ValueError):
                score = float("nan")
            if not math.isfinite(score):
                raise BackendUnavailableError(f"{where}: a hit's score is not a finite number: {raw!r}")
            out.append(SearchResult(score=score, rank=len(out) + 1, **f))
        return out

    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        """One result list per query: concurrent tool calls (``workers`` threads) on one session.

        Raises:
            BadQueryError: a query is empty or k outside 1..max_k (checked before sending).
        """
        self.check_request(queries, k)
        if not queries:
            return []
        if len(queries) == 1:
            return [self.search(queries[0], k)]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="drgym-mcp")
            pool = self._pool
        return list(pool.map(lambda q: self.search(q, k), queries))

    def get(self, doc_id: str) -> Document:
        """The whole document with this id (``document_tool``).

        Raises:
            DocumentNotFoundError: the server has no such document (a tool error saying
                so, or an empty answer).
            ConfigError: the server has no ``document_tool``.
            ServiceUnavailableError, BackendUnavailableError, SearchError: see the module doc.
        """
        if not isinstance(doc_id, str) or not doc_id.strip():
            raise DocumentNotFoundError(f"No document with doc_id {doc_id!r} (empty doc_id).")
        session = self._with_retries(self._connect, "connection")
        if self.document_tool not in session.tools:
            raise ConfigError(f"{self.name}: the MCP server {self.describe()} has no tool {self.document_tool!r} "
                              f"(it has {', '.join(sorted(session.tools))}); set document_tool=.")
        result = self._call(self.document_tool, {"docid": doc_id}, f"document {doc_id!r}")
        return self._document(_payload(result), f"No document with doc_id {doc_id!r}", doc_id)

    def fetch(self, url: str) -> Document:
        """The whole document at ``url``: ``fetch_tool`` when the server has it, else
        ``document_tool`` with ``url`` as the id.

        Raises:
            DocumentNotFoundError: no such document.
            ServiceUnavailableError, BackendUnavailableError, SearchError: see the module doc.
        """
        if not isinstance(url, str) or not url.strip():
            raise DocumentNotFoundError(f"URL not found: {url!r} (empty URL).")
        session = self._with_retries(self._connect, "connection")
        if not self.fetch_tool or self.fetch_tool not in session.tools:
            return self.get(url)
        result = self._call(self.fetch_tool, {"url": url}, f"fetch {url!r}")
        return self._document(_payload(result), f"URL not found: {url!r}", url)

    def _document(self, payload: Any, missing: str, key: str) -> Document:
        if isinstance(payload, list) and len(payload) == 1:
            payload = payload[0]
        if payload is None or payload == "" or payload == []:
            raise DocumentNotFoundError(f"{missing} ({self.name} returned no document).")
        if not isinstance(payload, dict):
            raise BackendUnavailableError(f"{self.name}: expected a document object, got {str(payload)[:160]!r}")
        if payload.get("error") and _first(payload, _TEXT_KEYS) is None:
            raise DocumentNotFoundError(f"{missing} ({self.name} said: {payload['error']}).")
        f = record_fields({"docid": key, **payload} if _first(payload, _ID_KEYS) is None else payload)
        return Document(**f)

    def identity(self) -> dict[str, Any]:
        """What decides the answers (see :meth:`SearchBackend.identity`): the server (URL
        or command), its name and version, the tool names, ``max_k``, and for a drgym
        server its engine (read fresh from ``drgym://engine``: the local engine's
        identity, collapse mode and limits).

        Raises:
            ServiceUnavailableError: the server cannot be reached.
        """
        session = self._with_retries(self._connect, "connection")
        engine = None
        if session.engine is not None:
            try:
                engine = self._run(lambda: self._read_engine(session.client), self.retry.timeout_s)
            except Exception as e:
                log.debug("%s: re-reading the engine failed (%s)", self.name, e)
                engine = session.engine
        info = getattr(session.client, "server_info", None)
        return {"kind": "mcp", "transport": self.transport, "server": self.describe(),
                "server_name": getattr(info, "name", None), "server_version": getattr(info, "version", None),
                "search_tool": self.search_tool, "document_tool": self.document_tool,
                "max_k": int(self.max_k), "engine": engine}

    def close(self) -> None:
        """Close the session (a stdio server is stopped), the loop and the thread pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            session, self._session = self._session, None
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if session is not None:
            self._stop_session(session)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10.0)
            if not self._loop.is_running():
                self._loop.close()


def _keyed_http(url: str, api_key: str) -> Any:
    """A streamable-HTTP transport to ``url`` whose requests carry ``x-api-key``."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @contextlib.asynccontextmanager
    async def transport():
        async with create_mcp_http_client(headers={"x-api-key": api_key}) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                yield streams

    return transport()


def _auth_refusal(e: BaseException) -> str | None:
    """The message of an ``AuthError: ...`` error answer (``drgym mcp``'s 401), found in
    ``e`` or the exception groups around it; None for any other failure."""
    from mcp.shared.exceptions import MCPError

    todo = [e]
    while todo:
        x = todo.pop()
        if isinstance(x, BaseExceptionGroup):
            todo.extend(x.exceptions)
        elif isinstance(x, MCPError) and str(x.message).startswith("AuthError:"):
            return str(x.message).removeprefix("AuthError:").strip()
    return None


def _describe(e: BaseException) -> str:
    """One line for an exception, unwrapping exception groups (the SDK's task groups raise them)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
