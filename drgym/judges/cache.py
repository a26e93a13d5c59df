"""Persistent SQLite verdict cache: reruns of a judge are free and identical.

Keys are SHA-256 digests built by :meth:`drgym.judges.base.Judge.cache_key` from the
judge model id, template name and version, rendered messages and sampling settings.
Each ``put`` is one SQLite transaction (atomic: a crash leaves the old row or the new
row, never a torn one); the database runs in WAL mode so readers never block writers,
and several processes may share one file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from drgym.paths import drgym_home

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    template TEXT NOT NULL,
    verdict TEXT NOT NULL,
    raw TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class VerdictCache:
    """A key -> verdict store in one SQLite file.

    Args:
        path: the SQLite file; None for ``$DRGYM_HOME/judge_cache.sqlite``;
            ``":memory:"`` for a process-local cache.

    Thread-safe (one connection guarded by a lock).
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        if path is None:
            path = default_cache_path()
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0, isolation_level=None)
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(_SCHEMA)

    def get(self, key: str) -> dict[str, Any] | None:
        """Return ``{"verdict": dict, "raw": str, "model", "template"}`` or None."""
        with self._lock:
            row = self._conn.execute("SELECT model, template, verdict, raw FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return {"model": row[0], "template": row[1], "verdict": json.loads(row[2]), "raw": row[3]}

    def put(self, key: str, *, model: str, template: str, verdict: Any, raw: str) -> None:
        """Store a verdict (replacing any old row for ``key``) in one transaction."""
        data = json.dumps(verdict, ensure_ascii=False, sort_keys=True)
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute(
                    "INSERT OR REPLACE INTO verdicts (key, model, template, verdict, raw, created) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, model, template, data, raw, time.time()),
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.ProgrammingError:
                pass


def default_cache_path() -> Path:
    """``$DRGYM_HOME/judge_cache.sqlite``."""

    return drgym_home() / "judge_cache.sqlite"
