"""Work units of a streaming index build: a corpus cut into pieces of about
:data:`CHUNK_DOCS` documents, read, split and embedded one at a time.

A unit is a byte range of a JSONL file (of its decompressed bytes for ``.jsonl.gz``:
units read in order decompress it once, see :func:`drgym.corpus.readers._iter_jsonl`),
a run of parquet row groups, a whole file of a format that cannot be read by range
(gzip JSON, HippoRAG/ovos JSON, a ``datasets`` folder), or a slice of an in-memory or
named corpus. Units are planned once, up front, by
scanning line ends (no JSON parsing), so the plan of a 13 GB wiki-18 file costs one
sequential read; the plan is stored with a partial build, so a resumed build never
re-plans. The same unit list drives the local build (:mod:`drgym.index.build`) and the
Ray Data build (:mod:`drgym.distributed.build`), and each unit is embedded by the same
function (:func:`encode_unit`), with the same encoder batches, in both: that is what
makes the two builds give identical vectors.

    >>> units, sources, label = plan_units("drgym/data/corpora/flashrag_wiki18_sample.jsonl", chunk_docs=400)
    >>> [u.n_docs for u in units]
    [400, 400, 200]
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from drgym.corpus.readers import SPAN_FORMATS, Span
from drgym.errors import ConfigError, CorpusError
from drgym.types import Document

CHUNK_DOCS = 10_000
"""Documents per unit: the granularity of resumption. At MiniLM's ~100 passages/s on 2
CPU cores a unit is ~100 s of encoding, and its float16 vectors (384-d) take 7.7 MB."""

CORPUS_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
"""Files taken from a corpus folder (sorted by name); other files are ignored."""

DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
"""Files that mark a ``datasets.save_to_disk`` folder (read whole as ``web`` rows)."""


@dataclass(frozen=True)
class Unit:
    """One piece of a corpus (see the module docstring).

    Attributes:
        no: position in build order (0-based).
        kind: ``"span"`` (part of a JSONL/parquet file), ``"file"`` (a whole file or
            ``datasets`` folder), ``"named"`` (slice of a named corpus) or ``"memory"``
            (slice of documents handed to the builder).
        path: the file (span, file).
        format: its corpus format (span, file).
        span: ``(start, stop, first)`` of a :class:`~drgym.corpus.readers.Span`.
        corpus: the named corpus (named).
        start, stop: document slice ``[start, stop)`` (named, memory).
        n_docs: documents in the unit, or -1 when only reading tells (file).
        id_prefix: doc_id prefix of wiki18 and web rows; None or ``""``: the ids as they
            are (see :func:`drgym.corpus.readers.read_corpus`).
        wikipedia_urls: wiki18 and hipporag rows without a URL get the Wikipedia URL of
            their title (the corpus is Wikipedia).
    """

    no: int
    kind: str
    path: str = ""
    format: str = ""
    span: tuple[int, int, int] | None = None
    corpus: str = ""
    start: int = 0
    stop: int = 0
    n_docs: int = -1
    id_prefix: str | None = None
    wikipedia_urls: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (stored in a partial build's state)."""
        d = asdict(self)
        d["span"] = list(self.span) if self.span is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Unit":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["span"] = tuple(d["span"]) if d.get("span") is not None else None
        return cls(**d)

    def read(self, memory_docs: list[Document] | None = None) -> list[Document]:
        """The unit's documents, in corpus order.

        Args:
            memory_docs: the documents handed to the builder (``kind == "memory"``).

        Raises:
            CorpusError: unreadable or malformed file.
        """
        from drgym.corpus.readers import read_corpus

        if self.kind == "span":
            return list(read_corpus(self.path, self.format, span=Span(*self.span), id_prefix=self.id_prefix,
                                    wikipedia_urls=self.wikipedia_urls))
        if self.kind == "file":
            return list(read_corpus(self.path, self.format, id_prefix=self.id_prefix,
                                    wikipedia_urls=self.wikipedia_urls))
        if self.kind == "named":
            return _named(self.corpus)[self.start : self.stop]
        if self.kind == "memory":
            if memory_docs is None:
                raise ConfigError("an in-memory corpus unit needs the documents (memory_docs=)")
            return memory_docs[self.start : self.stop]
        raise ConfigError(f"unknown unit kind {self.kind!r}")


@functools.lru_cache(maxsize=2)
def _named(name: str) -> list[Document]:
    from drgym.corpus.named import load_named_corpus

    return load_named_corpus(name)


def corpus_files(path: Path) -> list[Path]:
    """The files of a corpus path: the file itself, or the corpus files of a folder
    (:data:`CORPUS_SUFFIXES`, sorted by name, hidden files skipped). A ``datasets``
    folder is one source.

    Raises:
        CorpusError: a folder with no corpus file.
    """
    if not path.is_dir() or any((path / m).exists() for m in DATASETS_MARKERS):
        return [path]
    files = sorted(p for p in path.iterdir()
                   if p.is_file() and not p.name.startswith(".") and p.name.endswith(CORPUS_SUFFIXES))
    if not files:
        raise CorpusError(f"Corpus folder {path} holds no corpus file ({', '.join(CORPUS_SUFFIXES)}).")
    return files


def source_stat(path: Path, role: str = "corpus") -> dict[str, Any]:
    """``{"path", "bytes", "mtime_ns", "role"}`` of a file or folder (a folder: total
    bytes and newest mtime of its files): what a manifest records to tell, without
    reading it, that an input is unchanged."""
    path = Path(path).resolve()
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        mtime = max((p.stat().st_mtime_ns for p in files), default=path.stat().st_mtime_ns)
    else:
        st = path.stat()
        size, mtime = st.st_size, st.st_mtime_ns
    return {"path": str(path), "bytes": int(size), "mtime_ns": int(mtime), "role": role}


def _plan_jsonl(path: Path, chunk_docs: int) -> list[tuple[Span, int]]:
    """Cut a JSONL file into spans of ``chunk_docs`` non-blank lines (one binary scan;
    for a ``.gz`` file, of the decompressed bytes, which its spans then address)."""
    from drgym.corpus.readers import open_bytes

    out: list[tuple[Span, int]] = []
    start, first, n, pos = 0, 1, 0, 0
    with open_bytes(path) as f:
        lineno = 0
        for lineno, line in enumerate(f, 1):
            pos += len(line)
            if line.strip():
                n += 1
                if n == chunk_docs:
                    out.append((Span(start, pos, first), n))
                    start, first, n = pos, lineno + 1, 0
    if n:
        out.append((Span(start, pos, first), n))
    return out


def _plan_parquet(path: Path, chunk_docs: int) -> list[tuple[Span, int]]:
    """Cut a parquet file into runs of whole row groups of about ``chunk_docs`` rows."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as e:  # noqa: BLE001
        raise CorpusError(f"{path}: not a readable parquet file ({type(e).__name__}: {e}).") from e
    out: list[tuple[Span, int]] = []
    g0, row0, n = 0, 0, 0
    for g in range(meta.num_row_groups):
        n += meta.row_group(g).num_rows
        if n >= chunk_docs:
            out.append((Span(g0, g + 1, row0), n))
            g0, row0, n = g + 1, row0 + n, 0
    if n:
        out.append((Span(g0, meta.num_row_groups, row0), n))
    return out


def plan_units(
    corpus: str,
    format: str | None = None,
    *,
    chunk_docs: int = CHUNK_DOCS,
    docs: list[Document] | None = None,
) -> tuple[list[Unit], list[dict[str, Any]], str]:
    """Plan the units of a corpus.

    Args:
        corpus: a named corpus, or a corpus file or folder of files.
        format: corpus format of the files (one of :data:`drgym.corpus.FORMATS`); None
            sniffs each file.
        chunk_docs: documents per unit, >= 1.
        docs: documents to index instead of reading ``corpus`` (which then only labels).

    Returns:
        ``(units, sources, label)``: the units in corpus order; :func:`source_stat` of
        every input file (empty for named and in-memory corpora); the corpus name or the
        absolute path.

    Raises:
        ConfigError: unknown corpus name, or ``chunk_docs < 1``.
        CorpusError: unreadable files, unknown format.
    """
    from drgym.corpus.named import NAMED
    from drgym.corpus.readers import sniff_format
    from drgym.errors import unknown_name

    if chunk_docs < 1:
        raise ConfigError(f"chunk_docs must be >= 1, got {chunk_docs}.")
    if docs is not None:
        return _slices("memory", len(docs), chunk_docs, corpus=""), [], corpus
    if corpus in NAMED:
        return _slices("named", len(_named(corpus)), chunk_docs, corpus=corpus), [], corpus
    p = Path(corpus).expanduser()
    if not p.exists():
        raise unknown_name("corpus (name or existing path)", corpus, NAMED)
    units: list[Unit] = []
    sources = []
    for f in corpus_files(p):
        fmt = format or sniff_format(f)
        sources.append(source_stat(f))
        if fmt in SPAN_FORMATS and f.is_file() and f.suffix == ".parquet":
            pieces = _plan_parquet(f, chunk_docs)
        elif fmt in SPAN_FORMATS and f.is_file() and (f.name.endswith(".jsonl.gz") or f.suffix != ".gz"):
            pieces = _plan_jsonl(f, chunk_docs)
        else:
            units.append(Unit(no=len(units), kind="file", path=str(f.resolve()), format=fmt))
            continue
        for span, n in pieces:
            units.append(Unit(no=len(units), kind="span", path=str(f.resolve()), format=fmt,
                              span=(span.start, span.stop, span.first), n_docs=n))
    return units, sources, str(p.resolve())


def _slices(kind: str, n: int, chunk_docs: int, corpus: str) -> list[Unit]:
    return [Unit(no=i, kind=kind, corpus=corpus, start=s, stop=min(n, s + chunk_docs), n_docs=min(n, s + chunk_docs) - s)
            for i, s in enumerate(range(0, n, chunk_docs))]


@dataclass
class EncodedUnit:
    """What one unit contributes to an index.

    Attributes:
        no: the unit number.
        docs: its documents.
        passages: their passages (:class:`drgym.corpus.Passage`), in order.
        vectors: float32 ``(len(passages), dim)`` unit rows, or None (an import, whose
            vectors come from elsewhere).
        n_live: passages encoded live (the rest came from the shipped cache).
        skipped_no_text: doc_ids of a corpus file's documents with no text, left out
            (the builder counts them in one warning).
    """

    no: int
    docs: list[Document]
    passages: list
    vectors: np.ndarray | None
    n_live: int = 0
    skipped_no_text: list[str] = field(default_factory=list)


def encode_unit(unit: Unit, encoder=None, *, max_tokens: int = 0, overlap: int = 0,
                memory_docs: list[Document] | None = None) -> EncodedUnit:
    """Read, split and embed one unit (the step the local and the Ray build share).

    Args:
        unit: the unit.
        encoder: a :class:`drgym.embedding.Encoder`; None splits nothing (one passage per
            document, as an import needs) and embeds nothing.
        max_tokens: passage window in encoder tokens (0: no split).
        overlap: tokens shared by consecutive windows.
        memory_docs: the builder's documents for ``"memory"`` units.

    Returns:
        An :class:`EncodedUnit`; vectors come from
        :func:`drgym.embedding.embed_passages_cached` in one call per unit, so the
        encoder batches (hence the float values) depend only on the unit.
    """
    from drgym.corpus.chunking import split_documents

    docs = unit.read(memory_docs)
    skipped: list[str] = []
    # a user's corpus file: a document with no text is skipped and counted (not in an import,
    # whose rows must line up with the imported vectors)
    if encoder is not None and unit.kind in ("span", "file"):
        skipped = [d.doc_id for d in docs if not (d.text and d.text.strip())]
        if skipped:
            docs = [d for d in docs if d.text and d.text.strip()]
    tok = encoder.tokenizer if encoder is not None else None
    passages = split_documents(docs, tok, max_tokens=max_tokens or None, overlap=overlap)
    if encoder is None:
        return EncodedUnit(unit.no, docs, passages, None, 0, skipped)
    from drgym.embedding import embed_passages_cached

    vecs, n_live = embed_passages_cached(encoder, [p.embed_text for p in passages])
    return EncodedUnit(unit.no, docs, passages, vecs, n_live, skipped)
