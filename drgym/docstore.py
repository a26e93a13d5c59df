"""SQLite document store of an index: documents by doc_id and URL, passages by row.

One file, ``docs.sqlite``, in WAL mode, with two tables:

* ``documents(doc_id, url, norm_url, title, text, source, metadata)``: the whole
  documents that ``fetch`` returns, looked up by doc_id, by exact URL, by the
  normalised URL (:func:`drgym.corpus.urls.normalize_url`) and, last, by the URL with
  its ``#fragment`` stripped.
* ``passages(row, passage_id, doc_id, text)``: row ``i`` is row ``i`` of the dense
  index (FAISS id) and of the BM25 index. A passage that is its whole document
  (``passage_id == doc_id``: the document was not split) stores ``''`` and is read with
  the document's text, so a corpus of ready-made passages (wiki-18's 21M) keeps its text
  once, not twice.

:class:`DocStoreWriter` fills the file unit by unit (:mod:`drgym.index.units`), each unit
in one transaction together with a row of a progress table, so a killed build resumes
after the last committed unit.

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


PASSAGE_TEXT = "CASE WHEN p.text = '' THEN d.text ELSE p.text END"
"""SQL for a passage's text: ``''`` stands for the whole document's text (see above)."""


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
            # immutable: a built index never changes (builds write a new folder and rename
            # it), so SQLite needs no lock or -shm file and reads work on read-only disks
            conn = sqlite3.connect(f"file:{self.path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
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
            try:
                norm = normalize_url(u)
            except ValueError:  # not parseable as a URL (e.g. "http://[::1"): exact match only
                norm = None
            for col, val in (("url", u), ("norm_url", norm)):
                if val is None:
                    continue
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
                f"SELECT p.row, p.passage_id, p.doc_id, {PASSAGE_TEXT}, d.url, d.title, d.source "
                f"FROM passages p JOIN documents d ON d.doc_id = p.doc_id WHERE p.row IN ({marks})",
                chunk,
            ):
                out[r[0]] = PassageRecord(*r)
        return out

    def __len__(self) -> int:
        return self.n_documents


def write_docstore(path: str | Path, docs: Iterable[Document], passages: Iterable[Passage]) -> tuple[int, int]:
    """Create ``docs.sqlite`` at ``path`` (which must not exist yet) in one go.

    Args:
        path: destination file (inside an index build folder).
        docs: documents; doc_ids must be unique.
        passages: passages in index-row order; each ``doc_id`` must be among ``docs``.

    Returns:
        ``(n_documents, n_passages)``.

    Raises:
        CorpusError: duplicate doc_id or passage_id.
    """
    w = DocStoreWriter(path)
    try:
        w.add_unit(0, list(docs), list(passages))
        w.finish()
    finally:
        w.close()
    return w.n_documents, w.next_row


BUILD_TABLE = "drgym_build_units"


class DocStoreWriter:
    """Fill a ``docs.sqlite`` unit by unit; a killed writer resumes where it stopped.

    Each :meth:`add_unit` is one SQLite transaction: the unit's documents, its passages
    (rows numbered on from the previous unit) and a row of the progress table
    ``drgym_build_units(unit, first_row, n_passages, n_documents)`` commit together or
    not at all (the table stays in the finished file). Units must be added in order. URLs are made unique as
    :func:`drgym.corpus.named.unique_urls` does (an empty URL becomes
    ``drgym://doc/<doc_id>``, a repeated one gets ``#<doc_id>``), checked against the
    documents already stored, so the whole corpus never sits in memory.

    Args:
        path: the SQLite file; created with the schema when missing, else reopened.

    Attributes:
        next_row: the row the next passage gets (= passages stored).
        n_documents: documents stored.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        new = not self.path.exists()
        self.conn = sqlite3.connect(self.path)
        try:
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a killed process loses no commit
            self.conn.execute("PRAGMA cache_size = -262144")  # 256 MiB of page cache for the URL index
            if new:
                self.conn.executescript(SCHEMA)
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {BUILD_TABLE} (unit INTEGER PRIMARY KEY, "
                              "first_row INTEGER NOT NULL, n_passages INTEGER NOT NULL, n_documents INTEGER NOT NULL)")
            self.conn.commit()
            self.next_row = int(self.conn.execute("SELECT count(*) FROM passages").fetchone()[0])
            self.n_documents = int(self.conn.execute("SELECT count(*) FROM documents").fetchone()[0])
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise CorruptIndexError(f"Document store {self.path} is unreadable ({e}); delete it to start over.") from e

    def done_units(self) -> list[tuple[int, int, int, int]]:
        """Committed units ``(unit, first_row, n_passages, n_documents)`` in unit order."""
        return [tuple(r) for r in self.conn.execute(f"SELECT * FROM {BUILD_TABLE} ORDER BY unit")]

    def add_unit(self, unit: int, docs: Sequence[Document], passages: Sequence[Passage],
                 before_commit=None) -> int:
        """Store one unit's documents and passages, and mark the unit done, atomically.

        Args:
            unit: the unit number (must not be done yet).
            docs: its documents, in corpus order.
            passages: its passages, in row order.
            before_commit: called as ``before_commit(first_row)`` inside the transaction,
                after the rows are written and before the commit (the builder writes the
                unit's vectors there, so a unit marked done always has them).

        Returns:
            The row of the unit's first passage.

        Raises:
            CorpusError: a doc_id or passage_id is already stored (named in the message).
        """
        from drgym.errors import CorpusError

        first = self.next_row
        c = self.conn
        try:
            with c:
                for d in docs:
                    url = d.url or f"drgym://doc/{d.doc_id}"
                    if c.execute("SELECT 1 FROM documents WHERE url = ? LIMIT 1", (url,)).fetchone():
                        url = f"{url}#{d.doc_id}"
                    try:
                        c.execute("INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, ?)",
                                  (d.doc_id, url, normalize_url(url) if url else "", d.title, d.text, d.source,
                                   json.dumps(d.metadata, ensure_ascii=False, default=str)))
                    except sqlite3.IntegrityError:
                        raise CorpusError(f"Duplicate doc_id {d.doc_id!r} in corpus (document stores need unique doc_ids).") from None
                try:
                    c.executemany("INSERT INTO passages VALUES (?, ?, ?, ?)",
                                  ((first + i, p.passage_id, p.doc_id, "" if p.passage_id == p.doc_id else p.text)
                                   for i, p in enumerate(passages)))
                except sqlite3.IntegrityError as e:
                    raise CorpusError(f"Duplicate passage_id in unit {unit} of the corpus ({e}); "
                                      "a doc_id of the form '<id>#p<k>' collides with a split document.") from None
                c.execute(f"INSERT INTO {BUILD_TABLE} VALUES (?, ?, ?, ?)", (unit, first, len(passages), len(docs)))
                if before_commit is not None:
                    before_commit(first)
        except sqlite3.IntegrityError as e:
            raise CorpusError(f"Unit {unit} is already in {self.path} ({e}).") from None
        self.next_row = first + len(passages)
        self.n_documents += len(docs)
        return first

    def iter_documents(self, batch: int = 10_000):
        """``(doc_id, url, title, text)`` of every document in insertion (corpus) order."""
        cur = self.conn.execute("SELECT doc_id, url, title, text FROM documents ORDER BY rowid")
        while rows := cur.fetchmany(batch):
            yield from rows

    def iter_rows_by_passage_id(self, batch: int = 100_000):
        """Passage rows in passage_id order (SQLite's BINARY collation compares UTF-8
        bytes, the same order as Python's ``sorted`` of the strings)."""
        cur = self.conn.execute("SELECT row FROM passages ORDER BY passage_id")
        while rows := cur.fetchmany(batch):
            yield from (r[0] for r in rows)

    def iter_embed_texts(self, batch: int = 10_000):
        """``"title\\ntext"`` of every passage in row order (what BM25 and the encoder read)."""
        cur = self.conn.execute(f"SELECT d.title, {PASSAGE_TEXT} FROM passages p "
                                "JOIN documents d ON d.doc_id = p.doc_id ORDER BY p.row")
        while rows := cur.fetchmany(batch):
            yield from ((f"{t}\n{x}" if t else x) for t, x in rows)

    def finish(self) -> None:
        """Checkpoint the WAL into the main file. The progress table stays (one small
        row a unit): a build killed after this point still knows every unit is done."""
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Close the connection. Idempotent."""
        try:
            self.conn.close()
        except sqlite3.Error:
            pass
