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

Reads are thread-safe: a thread borrows a read-only connection from a pool for each
query (:class:`PinnedSQLite`), so concurrent queries run on separate connections. Every
connection reads the file that was at the path when the store was opened: an index
rebuilt under a running process (``drgym index build --force`` renames the new folder
into place) is not read by connections opened later, so the process keeps serving the
one index it loaded, whole, until it loads the index again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from drgym.corpus.chunking import Passage
from drgym.corpus.urls import normalize_url
from drgym.errors import (
    CorpusError,
    CorruptIndexError,
    DocumentNotFoundError,
    IndexNotFoundError,
    IndexReplacedError,
    SearchError,
)
from drgym.types import Document

log = logging.getLogger(__name__)

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


def file_identity(path: str | Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file or folder at ``path``; None when nothing is there
    or it cannot be examined."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class PinnedSQLite:
    """Read-only SQLite connections that all read the file that was at ``path`` when
    this object was made, whatever is renamed to ``path`` later.

    SQLite opens a file by path, and each connection opens it again. An index rebuilt
    under a running process is renamed into place (:func:`drgym.index.build.swap_into_place`),
    so a connection opened after that would read the new file while the process ranks
    with the old index's rows. Here the first connection is opened at once, the file is
    held open (POSIX: its inode cannot be reused while this object lives), and a further
    connection is kept only when ``path`` names the same file (device and inode) both
    before and after SQLite opens it. Once ``path`` names another file, no connection is
    opened any more: a query waits for an idle connection of the pinned file (there is
    always at least the first), logged once. Connections are pooled, not bound to
    threads: a query borrows one (:meth:`connection`) and gives it back.

    Args:
        path: the SQLite file.
        params: URI query parameters (default ``"mode=ro&immutable=1"``: read-only, and
            SQLite takes no locks on a file that never changes).

    Attributes:
        identity: ``(st_dev, st_ino)`` of the pinned file.
        replaced: True once ``path`` was found to name another file (or none).

    Raises:
        FileNotFoundError: no file at ``path``.
        IndexReplacedError: ``path`` was replaced while the first connection was opened.
        sqlite3.Error: SQLite cannot open the file.
    """

    def __init__(self, path: str | Path, params: str = "mode=ro&immutable=1") -> None:
        self.path = Path(path)
        self._uri = f"{self.path.resolve().as_uri()}?{params}"
        self._fd: int | None = None
        if os.name == "posix":  # elsewhere an open file could not be renamed over
            self._fd = os.open(self.path, os.O_RDONLY)
            st = os.fstat(self._fd)
            self.identity = (st.st_dev, st.st_ino)
        else:
            ident = file_identity(self.path)
            if ident is None:
                raise FileNotFoundError(f"No file at {self.path}")
            self.identity = ident
        self.replaced = False
        self._cond = threading.Condition()
        self._idle: list[sqlite3.Connection] = []
        self._all: list[sqlite3.Connection] = []
        self._closed = False
        try:
            first = self._open()
        except BaseException:
            self._release_fd()
            raise
        if first is None:
            self._release_fd()
            raise IndexReplacedError(f"{self.path} was replaced while it was being opened; open it again.")
        self._all.append(first)
        self._idle.append(first)

    def _open(self) -> sqlite3.Connection | None:
        """A new connection to the pinned file, or None when ``path`` names another file."""
        if file_identity(self.path) != self.identity:
            return None
        conn = sqlite3.connect(self._uri, uri=True, check_same_thread=False)
        if file_identity(self.path) != self.identity:  # replaced while SQLite opened it
            conn.close()
            return None
        conn.execute("PRAGMA query_only = ON")
        return conn

    def same_file(self) -> bool:
        """Whether ``path`` still names the pinned file."""
        return file_identity(self.path) == self.identity

    def _closed_error(self) -> SearchError:
        return SearchError(f"Document store {self.path} is closed; open the index again.")

    def _borrow(self) -> sqlite3.Connection:
        with self._cond:
            if self._closed:
                raise self._closed_error()
            if self._idle:
                return self._idle.pop()
            may_open = not self.replaced
        if may_open:
            conn = self._open()  # outside the lock: opening reads the file's header
            if conn is not None:
                with self._cond:
                    if self._closed:
                        conn.close()
                        raise self._closed_error()
                    self._all.append(conn)
                return conn
            with self._cond:
                if not self.replaced:
                    self.replaced = True
                    log.warning("%s was replaced on disk after this process opened it (the index was rebuilt); "
                                "this process keeps reading the file it opened with its %d open connection(s). "
                                "Restart it (or load the index again) to serve the new index.",
                                self.path, len(self._all))
        with self._cond:
            while not self._idle:
                if self._closed:
                    raise self._closed_error()
                self._cond.wait()
            return self._idle.pop()

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._cond:
            if self._closed:
                return
            self._idle.append(conn)
            self._cond.notify()

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """Borrow a connection for one query (blocks while all are busy and no new one
        may be opened).

        Raises:
            SearchError: the pool is closed.
        """
        conn = self._borrow()
        try:
            yield conn
        finally:
            self._give_back(conn)

    def _release_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Close every connection and the pinned file. Idempotent."""
        with self._cond:
            self._closed = True
            conns, self._all, self._idle = self._all, [], []
            self._cond.notify_all()
        for c in conns:
            try:
                c.close()
            except sqlite3.Error as e:  # closing a connection another thread still uses
                log.debug("closing a connection to %s: %s", self.path, e)
        self._release_fd()


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
        try:
            self._db = PinnedSQLite(self.path)
        except FileNotFoundError as e:
            raise IndexNotFoundError(f"Document store not found: {self.path}") from e
        except OSError as e:  # e.g. no read permission
            raise CorruptIndexError(f"Document store {self.path} cannot be opened ({e.strerror or e}); check that this "
                                    "user may read it.") from e
        except sqlite3.DatabaseError as e:
            raise CorruptIndexError(f"Document store {self.path} is unreadable ({e}); rebuild the index.") from e
        try:
            self.n_documents = int(self._query("SELECT count(*) FROM documents")[0][0])
            self.n_passages = int(self._query("SELECT count(*) FROM passages")[0][0])
        except BaseException:
            self.close()
            raise

    # -- connections ---------------------------------------------------------------------
    @property
    def replaced(self) -> bool:
        """Whether ``path`` now names another file than the one this store reads (the
        index was rebuilt under this process; it keeps reading the one it opened)."""
        return not self._db.same_file()

    def _query(self, sql: str, args: Sequence = ()) -> list[tuple]:
        try:
            with self._db.connection() as conn:
                return conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise CorruptIndexError(f"Document store {self.path} is unreadable ({e}); rebuild the index.") from e

    def close(self) -> None:
        """Close every connection (of every thread). Idempotent."""
        self._db.close()

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
