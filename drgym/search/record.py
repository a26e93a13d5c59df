"""Record and replay every search and fetch in a SQLite file.

A web search study is only reproducible if the answers the web gave can be served
again. :class:`RecordReplayBackend` wraps any backend in one of four modes:

``live``
    pass calls through; nothing stored.
``record``
    pass calls through and store each answer (and each backend failure) with a UTC
    timestamp; a later recording of the same request replaces the earlier one.
``replay``
    offline: answer only from the store; needs no inner backend, no key, no network.
    A request that was never recorded raises :class:`~drgym.errors.ReplayMissError`
    naming the query (or URL). Replay is deterministic (``deterministic = True``).
``cache``
    replay when recorded, otherwise call live and record (to build a store incrementally).

Keys: backend name + the normalised request. A query is normalised by collapsing runs
of whitespace to one space and stripping the ends (case is kept: providers are
case-sensitive for some queries); the key also holds ``k``. A fetch is keyed by the
URL (stripped). Recorded failures (timeouts, HTTP 5xx after retries, 404 on a fetch)
are replayed as the same error class with the same message, so a replayed rollout
that met a failure meets it again and stays identical.

Secrets: API keys are never stored. A recorded answer or failure message that holds the
value of a key (the wrapped backend's :meth:`~drgym.search.base.SearchBackend.credentials`,
or any environment variable named like a key, e.g. ``SERPER_API_KEY``) has it replaced by
``<redacted>`` before it is written (:mod:`drgym.redact`).

Storage: one SQLite file (WAL journal); each write is its own transaction, so a crash
never leaves half an entry. Tables ``searches(backend, query, k, results_json, error_type,
error_message, latency_s, recorded_at)`` and ``fetches(backend, url, document_json, ...)``.
:meth:`RecordStore.summary` gives counts and the first/last ``recorded_at`` per backend
(when the web was seen).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from drgym import errors as _errors
from drgym.errors import AuthError, BadQueryError, ConfigError, ReplayMissError, SearchError
from drgym.redact import scrub, secret_values
from drgym.search import pages, retry
from drgym.search.base import SearchBackend
from drgym.types import Document, SearchResult

Mode = Literal["live", "record", "replay", "cache"]
MODES: tuple[str, ...] = ("live", "record", "replay", "cache")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS searches (
    backend TEXT NOT NULL,
    query TEXT NOT NULL,
    k INTEGER NOT NULL,
    results_json TEXT,
    error_type TEXT,
    error_message TEXT,
    latency_s REAL NOT NULL,
    recorded_at TEXT NOT NULL,
    PRIMARY KEY (backend, query, k)
);
CREATE TABLE IF NOT EXISTS fetches (
    backend TEXT NOT NULL,
    url TEXT NOT NULL,
    document_json TEXT,
    error_type TEXT,
    error_message TEXT,
    latency_s REAL NOT NULL,
    recorded_at TEXT NOT NULL,
    PRIMARY KEY (backend, url)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_SCHEMA_VERSION = "1"


def normalize_query(query: str) -> str:
    """The recording key of a query: whitespace runs collapsed to one space, ends stripped."""
    return " ".join(query.split())


def _utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _error_class(name: str | None) -> type[SearchError]:
    """The drgym error class named ``name`` (SearchError when unknown), so a replayed
    failure has the class name the env shows the agent."""

    for module in (_errors, retry, pages):
        cls = getattr(module, name or "", None)
        if isinstance(cls, type) and issubclass(cls, SearchError):
            return cls
    return SearchError


def _rebuild_error(error_type: str | None, message: str | None) -> SearchError:
    cls = _error_class(error_type)
    try:
        return cls(message or "")
    except TypeError:  # a subclass with a different signature
        return SearchError(message or "")


class RecordStore:
    """The SQLite file behind record/replay. Thread-safe (one connection + a lock).

    Args:
        path: the SQLite file; created with its parent folder when missing (unless
            ``readonly``).
        readonly: open for replay only (the file must exist; nothing is written).

    Raises:
        ConfigError: ``readonly`` and the file does not exist, or it is not a drgym
            recording.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False):
        self.path = Path(path)
        self.readonly = readonly
        if readonly:
            if not self.path.is_file():
                raise ConfigError(f"Recording {self.path} does not exist; record one first (mode='record').")
            uri = f"file:{self.path.resolve()}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            with self._conn:
                self._conn.executescript(_SCHEMA)
                self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (_SCHEMA_VERSION,))
                self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('created_at', ?)", (_utcnow(),))
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        try:
            with self._lock:
                self._conn.execute("SELECT 1 FROM searches LIMIT 1").fetchall()
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"{self.path} is not a drgym recording ({e}).") from e

    # -- writes (each one transaction) -------------------------------------------------
    def add_secrets(self, values) -> None:
        """Also mask these values (API keys) in everything written from now on."""
        self._secrets.update(v for v in values if v)

    def _clean(self, text: str | None) -> str | None:
        """``text`` without any known secret value (environment keys and added ones)."""
        return None if text is None else scrub(text, secret_values(self._secrets))

    def put_search(self, backend: str, query: str, k: int, results: list[SearchResult] | None,
                   error: BaseException | None, latency_s: float) -> None:
        """Store the answer (or the failure) of one search; replaces an older recording."""
        self._check_writable()
        row = (
            backend, normalize_query(query), int(k),
            self._clean(None if results is None else json.dumps([r.to_dict() for r in results], ensure_ascii=False)),
            None if error is None else type(error).__name__,
            self._clean(None if error is None else str(error)),
            float(latency_s), _utcnow(),
        )
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO searches VALUES (?,?,?,?,?,?,?,?)", row)

    def put_fetch(self, backend: str, url: str, doc: Document | None, error: BaseException | None,
                  latency_s: float) -> None:
        """Store the document (or the failure) of one fetch; replaces an older recording."""
        self._check_writable()
        row = (
            backend, url.strip(),
            self._clean(None if doc is None else json.dumps(doc.to_dict(), ensure_ascii=False)),
            None if error is None else type(error).__name__,
            self._clean(None if error is None else str(error)),
            float(latency_s), _utcnow(),
        )
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO fetches VALUES (?,?,?,?,?,?,?)", row)

    def _check_writable(self) -> None:
        if self.readonly:
            raise ConfigError(f"Recording {self.path} was opened read-only (replay); it cannot be written.")

    # -- reads ---------------------------------------------------------------------------
    def get_search(self, backend: str, query: str, k: int) -> dict[str, Any] | None:
        """The recorded row ``{"results", "error_type", "error_message", "latency_s",
        "recorded_at"}`` for a search, or None."""
        with self._lock:
            row = self._conn.execute(
                "SELECT results_json, error_type, error_message, latency_s, recorded_at FROM searches "
                "WHERE backend=? AND query=? AND k=?",
                (backend, normalize_query(query), int(k)),
            ).fetchone()
        if row is None:
            return None
        results = None if row[0] is None else [SearchResult.from_dict(d) for d in json.loads(row[0])]
        return {"results": results, "error_type": row[1], "error_message": row[2], "latency_s": row[3], "recorded_at": row[4]}

    def get_fetch(self, backend: str, url: str) -> dict[str, Any] | None:
        """The recorded row ``{"document", "error_type", ...}`` for a fetch, or None."""
        with self._lock:
            row = self._conn.execute(
                "SELECT document_json, error_type, error_message, latency_s, recorded_at FROM fetches "
                "WHERE backend=? AND url=?",
                (backend, url.strip()),
            ).fetchone()
        if row is None:
            return None
        doc = None if row[0] is None else Document.from_dict(json.loads(row[0]))
        return {"document": doc, "error_type": row[1], "error_message": row[2], "latency_s": row[3], "recorded_at": row[4]}

    def recorded_queries(self, backend: str) -> list[tuple[str, int]]:
        """All recorded ``(query, k)`` pairs of ``backend``, sorted."""
        with self._lock:
            rows = self._conn.execute("SELECT query, k FROM searches WHERE backend=? ORDER BY query, k", (backend,)).fetchall()
        return [(q, k) for q, k in rows]

    def backends(self) -> list[str]:
        """Backend names with at least one recording."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT backend FROM searches UNION SELECT backend FROM fetches ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per backend: ``searches``, ``fetches``, ``errors``, ``first_recorded_at``,
        ``last_recorded_at`` (UTC ISO 8601: when the web was seen) and
        ``search_latency_median_s`` (the live latency of the recorded searches, seconds)."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for table, col in (("searches", "searches"), ("fetches", "fetches")):
                for b, n, nerr, first, last in self._conn.execute(
                    f"SELECT backend, COUNT(*), SUM(error_type IS NOT NULL), MIN(recorded_at), MAX(recorded_at) "
                    f"FROM {table} GROUP BY backend"
                ):
                    s = out.setdefault(b, {"searches": 0, "fetches": 0, "errors": 0,
                                           "first_recorded_at": first, "last_recorded_at": last})
                    s[col] = n
                    s["errors"] += int(nerr or 0)
                    s["first_recorded_at"] = min(s["first_recorded_at"], first)
                    s["last_recorded_at"] = max(s["last_recorded_at"], last)
            for b in out:
                lat = [r[0] for r in self._conn.execute(
                    "SELECT latency_s FROM searches WHERE backend=? AND error_type IS NULL", (b,))]
                out[b]["search_latency_median_s"] = statistics.median(lat) if lat else None
        return out

    def close(self) -> None:
        """Close the connection. Idempotent.

        A writable store first leaves WAL mode, which checkpoints the journal into the
        main file: a closed recording is one self-contained ``.sqlite`` file to copy.
        """
        with self._lock:
            try:
                if not self.readonly:
                    try:
                        self._conn.execute("PRAGMA journal_mode=DELETE")
                    except sqlite3.OperationalError:  # another connection still has it open
                        pass
                self._conn.close()
            except sqlite3.ProgrammingError:
                pass


class RecordReplayBackend(SearchBackend):
    """Wrap a backend to record its answers, or replay them offline.

    Args:
        inner: the live backend; may be None in ``replay`` mode only.
        store: a :class:`RecordStore` or the path of its SQLite file.
        mode: ``"live"``, ``"record"``, ``"replay"`` or ``"cache"`` (see module docstring).
        name: the backend name used in keys (default ``inner.name``; required in replay
            without ``inner``). Record and replay must use the same name.
        max_k: the largest k accepted (default ``inner.max_k``, else 100).

    Attributes:
        deterministic: True in replay mode, else ``inner.deterministic``.
        hits, misses, live_calls: counters (replayed answers, replay misses, calls that
            went to ``inner``); ``live_searches`` and ``live_fetches`` split ``live_calls``
            (providers bill searches).

    Raises:
        ConfigError: unknown mode; no inner backend outside replay; no name.
    """

    def __init__(self, inner: SearchBackend | None, store: RecordStore | str | Path, *, mode: Mode = "record",
                 name: str | None = None, max_k: int | None = None):
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
        if inner is None and mode != "replay":
            raise ConfigError(f"mode {mode!r} needs a live backend to wrap; only 'replay' works without one.")
        if name is None and inner is None:
            raise ConfigError("replay without a live backend needs name= (the backend name used when recording).")
        self.inner = inner
        self.mode = mode
        self._own_store = not isinstance(store, RecordStore)
        self.store = store if isinstance(store, RecordStore) else RecordStore(store, readonly=(mode == "replay"))
        if inner is not None:
            self.store.add_secrets(inner.credentials())
        self.name = name or inner.name  # type: ignore[union-attr]
        self.deterministic = True if mode == "replay" else bool(inner.deterministic)  # type: ignore[union-attr]
        self.max_k = max_k or (inner.max_k if inner is not None else 100)
        self.hits = 0
        self.misses = 0
        self.live_calls = 0
        self.live_searches = 0
        self.live_fetches = 0
        self._count_lock = threading.Lock()

    def _count(self, attr: str, n: int = 1) -> None:
        with self._count_lock:
            setattr(self, attr, getattr(self, attr) + n)
            if attr in ("live_searches", "live_fetches"):
                self.live_calls += n

    # -- search -------------------------------------------------------------------------
    def search_batch(self, queries: list[str], k: int = 10) -> list[list[SearchResult]]:
        """See :class:`SearchBackend`; in replay, raises :class:`ReplayMissError` on a miss.

        Raises:
            ReplayMissError: replay mode and some query (named) was not recorded with this k.
            SearchError: the recorded (replay) or live failure of a query.
        """
        self.check_request(queries, k)
        if self.mode == "live":
            self._count("live_searches", len(queries))
            return self.inner.search_batch(queries, k)  # type: ignore[union-attr]
        out: list[list[SearchResult] | None] = [None] * len(queries)
        todo: list[int] = []
        for i, q in enumerate(queries):
            if self.mode in ("replay", "cache"):
                row = self.store.get_search(self.name, q, k)
                if row is not None and self.mode == "cache" and row["error_type"] is not None:
                    row = None  # cache mode retries a recorded failure live
                if row is not None:
                    self._count("hits")
                    if row["error_type"] is not None:
                        raise _rebuild_error(row["error_type"], row["error_message"])
                    out[i] = row["results"]
                    if self.mode == "cache" and hasattr(self.inner, "remember_results"):
                        self.inner.remember_results(row["results"])  # a web backend then fetches these URLs
                    continue
                if self.mode == "replay":
                    self._count("misses")
                    near = sorted({kk for qq, kk in self.store.recorded_queries(self.name) if qq == normalize_query(q)})
                    hint = f" It was recorded with k in {near}, not k={k}." if near else ""
                    raise ReplayMissError(
                        f"Replay miss: backend {self.name!r} has no recording of query {normalize_query(q)!r} "
                        f"with k={k} in {self.store.path}.{hint} Record it first (mode='record' or 'cache')."
                    )
            todo.append(i)
        if todo:
            self._search_live([queries[i] for i in todo], k, todo, out)
        return out  # type: ignore[return-value]

    def _search_live(self, qs: list[str], k: int, idx: list[int], out: list) -> None:
        self._count("live_searches", len(qs))
        t0 = time.perf_counter()
        try:
            res = self.inner.search_batch(qs, k)  # type: ignore[union-attr]
        except (BadQueryError, AuthError):
            raise  # a caller or configuration problem, not a state of the web: never recorded
        except SearchError as e:
            if len(qs) == 1:  # the failure belongs to this one query: record it
                self.store.put_search(self.name, qs[0], k, None, e, time.perf_counter() - t0)
            raise
        per = (time.perf_counter() - t0) / max(1, len(qs))
        for i, q, r in zip(idx, qs, res):
            self.store.put_search(self.name, q, k, r, None, per)
            out[i] = r

    # -- fetch ---------------------------------------------------------------------------
    def fetch(self, url: str) -> Document:
        """See :class:`SearchBackend`; in replay, raises :class:`ReplayMissError` on a miss."""
        if not isinstance(url, str) or not url.strip():
            raise BadQueryError(f"fetch needs a non-empty URL, got {url!r}.")
        if self.mode == "live":
            self._count("live_fetches")
            return self.inner.fetch(url)  # type: ignore[union-attr]
        if self.mode in ("replay", "cache"):
            row = self.store.get_fetch(self.name, url)
            if row is not None and self.mode == "cache" and row["error_type"] is not None:
                row = None
            if row is not None:
                self._count("hits")
                if row["error_type"] is not None:
                    raise _rebuild_error(row["error_type"], row["error_message"])
                return row["document"]
            if self.mode == "replay":
                self._count("misses")
                raise ReplayMissError(
                    f"Replay miss: backend {self.name!r} has no recorded fetch of {url.strip()!r} in {self.store.path}."
                )
        self._count("live_fetches")
        t0 = time.perf_counter()
        try:
            doc = self.inner.fetch(url)  # type: ignore[union-attr]
        except (BadQueryError, AuthError):
            raise
        except SearchError as e:
            self.store.put_fetch(self.name, url, None, e, time.perf_counter() - t0)
            raise
        self.store.put_fetch(self.name, url, doc, None, time.perf_counter() - t0)
        return doc

    def identity(self) -> dict[str, Any]:
        """The recorded backend (see :meth:`SearchBackend.identity`): ``{"kind": "record",
        "mode", "provider", "recording"}`` (the recording's absolute path), plus ``inner``,
        the live backend's identity, outside replay."""
        ident: dict[str, Any] = {"kind": "record", "mode": self.mode, "provider": self.name,
                                 "recording": str(Path(self.store.path).resolve())}
        if self.inner is not None and self.mode != "replay":
            ident["inner"] = self.inner.identity()
        return ident

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        if self._own_store:
            self.store.close()
