"""BM25 served from disk by SQLite FTS5: lexical search with bounded memory at any size.

bm25s (:mod:`drgym.index.bm25`) builds its score matrix in memory, about 2.4 GB per
million 100-word passages, so it cannot index wiki-18 (2.1x10^7 passages) on a 24-64 GB
machine. This engine (``bm25_engine="fts5"``) keeps an FTS5 full-text index in one SQLite
file, ``bm25.fts5.sqlite``: the build streams the passages into it in transactions of
``chunk`` rows (memory bounded by SQLite's page cache, whatever the corpus size), and a
query reads only the posting lists of its terms from disk (the operating system's page
cache keeps what is hot; nothing else stays resident).

Tokens are drgym's own (:func:`drgym.index.bm25.tokenize`: the same lower-cased words,
stopwords and CJK bigrams as the bm25s engine), stored space-separated; FTS5's
``unicode61`` tokenizer with ``_`` as a token character splits them back exactly. The
score is FTS5's built-in ``bm25()`` (SQLite documentation, "The bm25() function":
Okapi BM25 with ``k1 = 1.2``, ``b = 0.75`` and IDF ``log((N - n + 0.5) / (n + 0.5))``,
clamped near 0 for terms in more than half the passages), where bm25s uses ``k1 = 1.5``
and Lucene's IDF ``log(1 + (N - n + 0.5) / (n + 0.5))``, so the two engines rank alike
but not identically (``scripts/bench_bm25_engines.py`` measures their top-10 overlap).
Hybrid search fuses this ranking with the dense one exactly as it fuses bm25s's
(:func:`drgym.index.bm25.rrf_fuse`).
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Iterable

import numpy as np

from drgym.docstore import PinnedSQLite
from drgym.errors import ConfigError, CorruptIndexError
from drgym.index.bm25 import LEGACY_TOKENIZER, TOKENIZER, TOKENIZERS, _legacy_tokenize, tokenize

FTS5_FILE = "bm25.fts5.sqlite"
ENGINE = "fts5"
FTS5_K1, FTS5_B = 1.2, 0.75
"""FTS5's fixed BM25 parameters (its ``bm25()`` function)."""
_TOKENIZE = "unicode61 remove_diacritics 0 tokenchars '_'"
_MARGIN = 64
"""Extra hits read past ``k`` so that ties at the cut-off are ordered by passage_id."""


def _token_fn(tokenizer: str):
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"bm25 tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}.")
    return tokenize if tokenizer == TOKENIZER else _legacy_tokenize


def write_fts5(folder: Path, texts: Iterable[str], *, tokenizer: str = TOKENIZER, chunk: int = 10_000) -> dict:
    """Build the FTS5 BM25 index of ``texts`` (one per passage row, in row order) as
    ``folder/bm25.fts5.sqlite``, streaming: ``chunk`` rows per transaction.

    Args:
        folder: the index build folder.
        texts: passage texts in row order (row ``i`` is FTS5 rowid ``i``).
        tokenizer: :data:`~drgym.index.bm25.TOKENIZER` (default) or
            :data:`~drgym.index.bm25.LEGACY_TOKENIZER`.
        chunk: rows per transaction (>= 1).

    Returns:
        Settings recorded in the manifest's ``bm25`` (``engine``, ``file``, ``k1``,
        ``b``, ``tokenizer``, ``n_passages``).

    Raises:
        ConfigError: a bad ``tokenizer`` or ``chunk``.
    """
    tok = _token_fn(tokenizer)
    if chunk < 1:
        raise ConfigError(f"chunk must be >= 1, got {chunk}.")
    path = Path(folder) / FTS5_FILE
    for p in (path, path.with_name(path.name + "-journal")):
        p.unlink(missing_ok=True)  # a half-written file from an interrupted build
    con = sqlite3.connect(str(path))
    n = 0
    try:
        con.execute("PRAGMA journal_mode=OFF")  # a failed build is rebuilt from scratch, never resumed
        con.execute("PRAGMA synchronous=OFF")
        con.execute(f"CREATE VIRTUAL TABLE passages USING fts5(body, content='', tokenize=\"{_TOKENIZE}\")")
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        con.execute("CREATE VIRTUAL TABLE vocab USING fts5vocab(passages, 'row')")  # term -> document frequency
        it = iter(texts)
        while batch := list(itertools.islice(it, chunk)):
            with con:
                con.executemany("INSERT INTO passages(rowid, body) VALUES (?, ?)",
                                ((n + i, " ".join(tok(t))) for i, t in enumerate(batch)))
            n += len(batch)
        with con:
            con.execute("INSERT INTO passages(passages) VALUES ('optimize')")  # one b-tree per term: fewer reads
            con.executemany("INSERT INTO meta VALUES (?, ?)", [("n_passages", str(n)), ("tokenizer", tokenizer)])
    finally:
        con.close()
    return {"engine": ENGINE, "file": FTS5_FILE, "method": "fts5-okapi", "k1": FTS5_K1, "b": FTS5_B,
            "tokenizer": tokenizer, "n_passages": n}


class FTS5BM25Index:
    """A BM25 index in SQLite FTS5, searched from disk (see the module docstring).

    Same interface as :class:`drgym.index.bm25.BM25Index`'s :meth:`search`. The file is
    opened read-only, through a pool of connections pinned to the file opened first
    (:class:`drgym.docstore.PinnedSQLite`): an index rebuilt under the process is not read.

    Args:
        folder: the index folder (holding ``bm25.fts5.sqlite``).
        n_passages: expected number of rows.
        tokenizer: the manifest's ``bm25["tokenizer"]``.

    Raises:
        CorruptIndexError: the file is missing or unreadable, or holds another row count
            or tokenizer than the manifest.
    """

    def __init__(self, folder: str | Path, n_passages: int, tokenizer: str | None = TOKENIZER) -> None:
        self.path = Path(folder) / FTS5_FILE
        self.n_passages = int(n_passages)
        self.tokenizer = tokenizer or LEGACY_TOKENIZER
        self._tokenize = _token_fn(self.tokenizer)
        self._db = None
        try:
            if not self.path.is_file():
                raise sqlite3.OperationalError(f"no such file: {self.path}")
            # pinned: connections opened later read this file, not one renamed over it
            self._db = PinnedSQLite(self.path, "mode=ro")
            meta = dict(self._query("SELECT key, value FROM meta"))
        except (sqlite3.Error, OSError) as e:
            self.close()
            raise self._corrupt(f"is unreadable ({type(e).__name__}: {e})") from e
        if meta.get("n_passages") != str(self.n_passages):
            raise self._corrupt(f"holds {meta.get('n_passages')} passages, the manifest says {self.n_passages}")
        if meta.get("tokenizer") != self.tokenizer:
            raise self._corrupt(f"was built with tokenizer {meta.get('tokenizer')!r}, the manifest says {self.tokenizer!r}")

    def _corrupt(self, problem: str) -> CorruptIndexError:
        from drgym.index.manifest import corrupt_file_error

        return corrupt_file_error(self.path, problem, self.path.parent)

    def _query(self, sql: str, args=()) -> list[tuple]:
        with self._db.connection() as con:
            return con.execute(sql, args).fetchall()

    def match_expression(self, query: str) -> str | None:
        """The FTS5 query of ``query``: its distinct tokens that can change the ranking,
        quoted, joined by ``OR``; None when there is none.

        A token in at least half of the passages is left out: FTS5 clamps its IDF to
        1e-6, so it adds at most about 2e-6 to a score, and matching it would make SQLite
        score nearly every passage (most of a query's time on a large index). A query
        made only of such tokens, stopwords or punctuation has no result.
        """
        toks = list(dict.fromkeys(self._tokenize(query)))
        if not toks:
            return None
        marks = ",".join("?" * len(toks))
        df = dict(self._query(f"SELECT term, doc FROM vocab WHERE term IN ({marks})", toks))
        keep = [t for t in toks if 0 < df.get(t, 0) and 2 * df[t] < self.n_passages]
        return " OR ".join(f'"{t}"' for t in keep) if keep else None

    def search(self, queries: list[str], k: int, tie_rank: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` passages per query that share a token with it.

        Args:
            queries: query strings.
            k: results per query.
            tie_rank: int64 ``(n_passages,)`` passage_id ranks for tie-breaks.

        Returns:
            Per query ``(scores, rows)``: float32 BM25 scores (FTS5's, higher is better)
            and int64 rows, length <= k, best first, equal scores ordered by passage_id.

        Raises:
            CorruptIndexError: SQLite cannot read the file, or it returns a row outside
                the index.
        """
        out = []
        for q in queries:
            expr = self.match_expression(q)
            if expr is None:
                out.append((np.zeros(0, np.float32), np.zeros(0, np.int64)))
                continue
            try:
                hits = self._query("SELECT rowid, -bm25(passages) FROM passages WHERE passages MATCH ? "
                                   "ORDER BY bm25(passages) LIMIT ?", (expr, int(k) + _MARGIN))
            except sqlite3.Error as e:
                raise self._corrupt(f"could not be searched ({type(e).__name__}: {e})") from e
            rows = np.fromiter((r for r, _ in hits), dtype=np.int64, count=len(hits))
            scores = np.fromiter((s for _, s in hits), dtype=np.float64, count=len(hits)).astype(np.float32)
            if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= self.n_passages):
                raise self._corrupt(f"returned passage rows outside 0..{self.n_passages - 1}")
            order = np.lexsort((tie_rank[rows], -scores))[:k]
            out.append((scores[order], rows[order]))
        return out

    def close(self) -> None:
        """Close every connection. Idempotent."""
        if self._db is not None:
            self._db.close()
