"""SQLite document store of an index: documents by doc_id and URL, passages by row.

One file, ``docs.sqlite``, in WAL mode, with two tables:

* ``documents(doc_id, url, norm_url, title, text, source, metadata)``: the whole
  documents that ``fetch`` returns, looked up by doc_id, by exact URL, by the
  normalised URL (:func:`drgym.corpus.urls.normalize_url`) and, last, by the URL with
  its ``#fragment`` stripped.
* ``passages(row, passage_id, doc_id, text)``: row ``i`` is row ``i`` of the dense
  index (FAISS id) and of the BM25 index.

Reads are thread-safe: each thread gets its own read-only connection (SQLite
connections must not be shared between threads without a lock, and WAL lets readers
run concurrently).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from drgym.corpus.chunking import Passage
from drgym.corpus.urls import normalize_url
from drgym.errors import CorruptIndexError, DocumentNotFoundError, IndexNotFoundError, SearchError
from drgym.types import Document

SCHEMA = """
CREATE TABLE documents (
    doc_id   TEXT PRIMARY KEY,
    url      TEXT NOT NULL,
    norm_url TEXT NOT NULL,
    title    TEXT NOT NULL,
    text     TEXT NOT NULL,
    source   TEXT NOT NULL,
    metadata TEXT NOT NULL
);
CREATE INDEX documents_url ON documents(url);
CREATE INDEX documents_norm_url ON documents(norm_url);
CREATE TABLE passages (
    row        INTEGER PRIMARY KEY,
    passage_id TEXT NOT NULL UNIQUE,
    doc_id     TEXT NOT NULL REFERENCES documents(doc_id),
    text       TEXT NOT NULL
);
CREATE INDEX passages_doc ON passages(doc_id);
"""


@dataclass(frozen=True)
class PassageRecord:
    """One passage row joined with its document's URL, title and source.

    Attributes:
        row: row in the dense and BM25 indexes (0-based).
        passage_id: ``doc_id`` or ``"<doc_id>#p<k>"``.
        doc_id: the parent document.
        text: the passage text (title excluded).
        url: the parent document's URL.
        title: the parent document's title.
        source: the parent document's source label.
    """

    row: int
    passage_id: str
    doc_id: str
    text: str
    url: str
    title: str
    source: str


class DocStore:
    """Read access to ``docs.sqlite`` (see the module docstring).

    Args:
        path: the SQLite file.

    Raises:
        IndexNotFoundError: no file at ``path``.
        CorruptIndexError: the file is not a readable drgym docstore.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise IndexNotFoundError(f"Document store not found: {self.path}")
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        try:
            conn = self._conn()
            self.n_documents = int(conn.execute("SELECT count(*) FROM documents").fetchone()[0])
            self.n_passages = int(conn.execute("SELECT count(*) FROM passages").fetchone()[0])
        except sqlite3.DatabaseError as e:
            self.close()
            raise CorruptIndexError(f"Document store {self.path} is unreadable ({e}); rebuild the index.") from e

    # -- connections ---------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise SearchError(f"Document store {self.path} is closed; open the index again.")
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _query(self, sql: str, args: Sequence = ()) -> list[tuple]:
        try:
            return self._conn().execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise CorruptIndexError(f"Document store {self.path} is unreadable ({e}); rebuild the index.") from e

    def close(self) -> None:
        """Close every connection (of every thread). Idempotent."""
        with self._lock:
            self._closed = True
            for c in self._conns:
                try:
                    c.close()
                except sqlite3.Error:
                    pass
            self._conns.clear()
        self._local = threading.local()

    # -- lookups -------------------------------------------------------------------------
    @staticmethod
    def _doc(row: tuple) -> Document:
        doc_id, url, title, text, source, meta = row
        return Document(doc_id=doc_id, url=url, title=title, text=text, source=source, metadata=json.loads(meta))

    _DOC_COLS = "doc_id, url, title, text, source, metadata"

    def get(self, doc_id: str) -> Document:
        """Return the document with this doc_id.

        A passage id ``"<doc_id>#p<k>"`` also works and returns the whole parent document.

        Raises:
            DocumentNotFoundError: no such doc_id.
        """
        rows = self._query(f"SELECT {self._DOC_COLS} FROM documents WHERE doc_id = ?", (doc_id,))
        if not rows and "#p" in doc_id:
            rows = self._query(
                f"SELECT {self._DOC_COLS} FROM documents WHERE doc_id = "
                "(SELECT doc_id FROM passages WHERE passage_id = ?)",
                (doc_id,),
            )
        if not rows:
            raise DocumentNotFoundError(f"No document with doc_id {doc_id!r}.")
        return self._doc(rows[0])

    def fetch(self, url: str) -> Document:
        """Return the document at ``url``.

        Lookup order: exact URL; normalised URL (:func:`normalize_url`: http/https,
        ``www.``, mobile Wikipedia host, percent-encoding, spaces, trailing slash); the
        URL without its ``#fragment`` (exact, then normalised). The first hit in corpus
        order wins.

        Raises:
            DocumentNotFoundError: no document matches (message "URL not found: ...").
        """
        if not isinstance(url, str) or not url.strip():
            raise DocumentNotFoundError(f"URL not found: {url!r} (empty URL).")
        candidates = [url.strip()]
        base = url.strip().split("#", 1)[0]
        if base != candidates[0] and base:
            candidates.append(base)
        for u in candidates:
            for col, val in (("url", u), ("norm_url", normalize_url(u))):
                rows = self._query(f"SELECT {self._DOC_COLS} FROM documents WHERE {col} = ? ORDER BY rowid LIMIT 1", (val,))
                if rows:
                    return self._doc(rows[0])
        raise DocumentNotFoundError(f"URL not found: {url!r}.")

    def passages(self, rows: Sequence[int]) -> dict[int, PassageRecord]:
        """Passage records of index rows, joined with their documents.

        Args:
            rows: index rows (ints; duplicates allowed).

        Returns:
            ``{row: PassageRecord}`` for the rows that exist.
        """
        rows = sorted({int(r) for r in rows if int(r) >= 0})
        if not rows:
            return {}
        out: dict[int, PassageRecord] = {}
        for i in range(0, len(rows), 900):  # SQLite's bound-parameter limit
            chunk = rows[i : i + 900]
            marks = ",".join("?" * len(chunk))
            for r in self._query(
                "SELECT p.row, p.passage_id, p.doc_id, p.text, d.url, d.title, d.source "
                f"FROM passages p JOIN documents d ON d.doc_id = p.doc_id WHERE p.row IN ({marks})",
                chunk,
            ):
                out[r[0]] = PassageRecord(*r)
        return out

    def __len__(self) -> int:
        return self.n_documents


def write_docstore(path: str | Path, docs: Iterable[Document], passages: Iterable[Passage]) -> tuple[int, int]:
    """Create ``docs.sqlite`` at ``path`` (which must not exist yet).

    Args:
        path: destination file (inside an index build folder).
        docs: documents; doc_ids must be unique.
        passages: passages in index-row order; each ``doc_id`` must be among ``docs``.

    Returns:
        ``(n_documents, n_passages)``.

    Raises:
        CorruptIndexError: duplicate doc_id or passage_id (SQLite integrity error).
    """
    path = Path(path)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executescript(SCHEMA)
        with conn:
            conn.executemany(
                "INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    (d.doc_id, d.url, normalize_url(d.url) if d.url else "", d.title, d.text, d.source,
                     json.dumps(d.metadata, ensure_ascii=False, default=str))
                    for d in docs
                ),
            )
            conn.executemany(
                "INSERT INTO passages VALUES (?, ?, ?, ?)",
                ((i, p.passage_id, p.doc_id, p.text) for i, p in enumerate(passages)),
            )
        n_docs = conn.execute("SELECT count(*) FROM documents").fetchone()[0]
        n_pass = conn.execute("SELECT count(*) FROM passages").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.IntegrityError as e:
        raise CorruptIndexError(f"Cannot write document store {path}: {e} (doc_ids and passage_ids must be unique).") from e
    finally:
        conn.close()
    return int(n_docs), int(n_pass)
