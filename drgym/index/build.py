"""Build an index folder (docstore + dense shards + BM25) from a corpus, atomically.

``build_index`` loads the corpus, splits it into passages with the encoder's tokenizer
(:func:`drgym.corpus.split_documents`, default window
:func:`~drgym.corpus.chunking.default_max_tokens`, overlap 32), embeds them (taking
vectors from drgym's shipped embedding cache when the texts match, so the default corpus
needs no live encoding), and writes everything into a temporary folder next to the
destination, which is renamed into place at the end. A crash never leaves a half-built
index where a loader would find it. If the destination already holds an index with the
same identity (same corpus fingerprint, encoder and revision, factory, chunking, shard
size, drgym version), nothing is rebuilt.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from drgym.errors import ConfigError, CorruptIndexError, IndexNotFoundError
from drgym.index.manifest import IndexManifest, record_files
from drgym.types import Document

log = logging.getLogger(__name__)

DEFAULT_FACTORY = "Flat"
"""Exact inner-product search: on the ~21k passages of wiki-default a Flat search costs
~2 ms against ~15 ms for embedding the query, is exact, and rebuilds bit-identically.
Use ``"HNSW32"`` (or ``"IVF4096,PQ64"``) for large corpora."""

DEFAULT_SHARD_SIZE = 25_000_000
"""Rows per dense shard (DeepResearchGym uses 25M documents a shard); wiki-default is one."""

DEFAULT_OVERLAP = 32


@dataclass
class IndexSpec:
    """What to build.

    Attributes:
        corpus: a named corpus (:data:`drgym.corpus.NAMED`, default ``"wiki-default"``)
            or a path to a corpus file/folder.
        format: corpus format for a path (one of :data:`drgym.corpus.FORMATS`); None sniffs.
        encoder: sentence-transformers model name or path.
        factory: FAISS ``index_factory`` string.
        shard_size: rows per dense shard, >= 1.
        max_tokens: passage window in encoder tokens; None = encoder window minus title
            room (224 for MiniLM); 0 disables splitting.
        overlap: tokens shared by consecutive windows of a split document.
        bm25: also build the BM25 index.
        name: index folder name; None derives one from corpus, encoder and factory.
    """

    corpus: str = "wiki-default"
    format: str | None = None
    encoder: str = "all-MiniLM-L6-v2"
    factory: str = DEFAULT_FACTORY
    shard_size: int = DEFAULT_SHARD_SIZE
    max_tokens: int | None = None
    overlap: int = DEFAULT_OVERLAP
    bm25: bool = True
    name: str | None = None

    def index_name(self, encoder_name: str) -> str:
        """The folder name: given, or ``<corpus>--<encoder>--<factory>[--s<shard_size>]``."""
        if self.name:
            if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name) or self.name.startswith("."):
                raise ConfigError(f"Index name {self.name!r} may hold only letters, digits, '.', '_' and '-'.")
            return self.name
        corpus = Path(self.corpus).stem if _is_path(self.corpus) else self.corpus
        parts = [corpus, Path(encoder_name).name, self.factory]
        if self.shard_size != DEFAULT_SHARD_SIZE:
            parts.append(f"s{self.shard_size}")
        return "--".join(re.sub(r"[^A-Za-z0-9._-]+", "_", p) for p in parts)


def _is_path(corpus: str) -> bool:
    from drgym.corpus.named import NAMED

    return corpus not in NAMED and (os.sep in corpus or Path(corpus).exists())


def load_corpus(corpus: str, format: str | None = None) -> tuple[list[Document], str]:
    """Load a named corpus or a corpus file, with unique URLs.

    Returns:
        ``(documents, label)`` where label is the corpus name or the absolute path.
        Documents of a file with no text are skipped with a warning that counts them.

    Raises:
        ConfigError: unknown corpus name (not a name and not an existing path).
        CorpusError: unreadable corpus file (not UTF-8, not JSON: file and line named),
            a duplicate doc_id (both positions named), or no document with text.
    """
    from drgym.corpus.named import NAMED, load_named_corpus, skip_empty, unique_urls
    from drgym.corpus.readers import read_corpus
    from drgym.errors import unknown_name

    if corpus in NAMED:
        return load_named_corpus(corpus), corpus
    p = Path(corpus).expanduser()
    if not p.exists():
        raise unknown_name("corpus (name or existing path)", corpus, NAMED)
    # a duplicate doc_id is an error; a document with no text is skipped and counted (a warning)
    docs = skip_empty(unique_urls(read_corpus(p, format), where=str(p)), where=str(p))
    return docs, str(p.resolve())


_ENCODERS: dict[tuple[str, str | None], object] = {}
_ENCODERS_LOCK = threading.Lock()


def get_encoder(name: str = "all-MiniLM-L6-v2", device: str | None = None):
    """A process-wide shared :class:`drgym.embedding.Encoder` (loaded once per name/device).

    Encoders are not safe for concurrent ``encode`` calls (fast tokenizers raise
    "Already borrowed"); :class:`~drgym.search.local.LocalSearchEngine` serialises them.
    """
    from drgym.embedding import Encoder

    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    key = (name, device)
    with _ENCODERS_LOCK:
        enc = _ENCODERS.get(key)
        if enc is None:
            enc = Encoder(name, device=device)
            _ENCODERS[key] = enc
        return enc


@contextlib.contextmanager
def _build_lock(root: Path, name: str):
    """Exclusive per-index file lock, so concurrent builders of one index wait in turn."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def planned_manifest(spec: IndexSpec, docs: list[Document], label: str, encoder) -> IndexManifest:
    """The manifest a build of ``spec`` would write (without shards, files, timings)."""
    from drgym import __version__
    from drgym.corpus.chunking import default_max_tokens
    from drgym.corpus.named import corpus_fingerprint

    max_tokens = default_max_tokens(encoder.max_length) if spec.max_tokens is None else int(spec.max_tokens)
    if spec.shard_size < 1:
        raise ConfigError(f"shard_size must be >= 1, got {spec.shard_size}.")
    return IndexManifest(
        name=spec.index_name(encoder.name),
        corpus=label,
        corpus_fingerprint=corpus_fingerprint(docs),
        n_documents=len(docs),
        n_passages=0,
        encoder=encoder.name,
        encoder_revision=encoder.revision,
        dim=encoder.dim,
        metric="inner_product",
        normalized=True,
        factory=spec.factory,
        chunking={"max_tokens": max_tokens, "overlap": int(spec.overlap), "tokenizer": encoder.name,
                  "encoder_max_length": encoder.max_length},
        shard_size=int(spec.shard_size),
        shards=[],
        bm25={"enabled": True} if spec.bm25 else None,
        drgym_version=__version__,
    )


def _same_identity(existing: IndexManifest, planned: IndexManifest) -> bool:
    a, b = existing.identity(), planned.identity()
    if existing.bm25 is not None and planned.bm25 is not None:
        a["bm25"] = b["bm25"] = True  # BM25 settings are fixed by the drgym version
    return a == b


@dataclass
class BuildResult:
    """Outcome of :func:`build_index`.

    Attributes:
        folder: the index folder.
        manifest: its manifest.
        built: False when an identical index already existed.
        seconds: wall time of the call.
    """

    folder: Path
    manifest: IndexManifest
    built: bool
    seconds: float


def build_index(
    spec: IndexSpec | None = None,
    *,
    root: str | Path | None = None,
    encoder=None,
    force: bool = False,
    progress: bool = False,
    docs: list[Document] | None = None,
) -> BuildResult:
    """Build (or reuse) the index described by ``spec``.

    Args:
        spec: what to build (default: wiki-default, MiniLM, Flat, BM25).
        root: folder holding index folders; None is :func:`drgym.paths.indexes_dir`.
        encoder: an already loaded :class:`drgym.embedding.Encoder` whose name must match
            ``spec.encoder``; None loads (and shares) one.
        force: rebuild even if an identical index exists.
        progress: show progress bars (shards, live encoding).
        docs: documents to index instead of loading ``spec.corpus`` (which then only
            labels the manifest).

    Returns:
        A :class:`BuildResult`.

    Raises:
        ConfigError: bad spec (factory string, shard size, name), or an encoder that
            cannot be loaded here (checked before the corpus is read).
        CorpusError: the corpus cannot be read.
    """
    from drgym.paths import indexes_dir

    t0 = time.perf_counter()
    spec = spec or IndexSpec()
    root = Path(root) if root is not None else indexes_dir()
    timings: dict[str, float] = {}

    if encoder is None:  # before the corpus is read: a missing model is reported at once
        from drgym.embedding import check_encoder

        check_encoder(spec.encoder)
    t = time.perf_counter()
    if docs is None:
        docs, label = load_corpus(spec.corpus, spec.format)
    else:
        label = spec.corpus
    if not docs:
        raise ConfigError(f"Corpus {spec.corpus!r} has no documents; nothing to index.")
    timings["load_corpus"] = time.perf_counter() - t

    t = time.perf_counter()
    if encoder is None:
        encoder = get_encoder(spec.encoder)
    timings["load_encoder"] = time.perf_counter() - t
    planned = planned_manifest(spec, docs, label, encoder)
    folder = root / planned.name

    def reusable() -> IndexManifest | None:
        if force or not (folder / "manifest.json").exists():
            return None
        try:
            existing = IndexManifest.read(folder)
            if _same_identity(existing, planned):
                existing.check_files(folder)
                return existing
            log.info("index %s: manifest changed, rebuilding", folder)
        except (CorruptIndexError, IndexNotFoundError) as e:
            log.warning("index %s is corrupt (%s); rebuilding", folder, e)
        return None

    # an identical index is reused without taking the lock, which needs a writable root
    # (indexes on a read-only disk stay usable); IndexMismatchError (a newer format) stops here
    existing = reusable()
    if existing is not None:
        return BuildResult(folder, existing, False, time.perf_counter() - t0)
    with _build_lock(root, planned.name):
        existing = reusable()  # another process may have built it while we waited
        if existing is not None:
            return BuildResult(folder, existing, False, time.perf_counter() - t0)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{planned.name}-", dir=root))
        try:
            manifest = _build_into(tmp, spec, planned, docs, encoder, timings, progress)
            _swap_into_place(tmp, folder)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if _disk_full(e, root):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)) from e
            raise
    return BuildResult(folder, manifest, True, time.perf_counter() - t0)


def _disk_full(e: BaseException, root: Path) -> bool:
    """True for a write that failed because the disk is full, whichever library raised it
    (OSError ENOSPC from numpy, SQLite's "database or disk is full", FAISS's C++ error,
    whose text does not say why: then less than 1 MiB left on ``root`` decides)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if not isinstance(e, (OSError, RuntimeError, sqlite3.Error)):
        return False
    text = str(e).lower()
    if "disk is full" in text or "no space left" in text:
        return True
    try:
        return shutil.disk_usage(root).free < (1 << 20)
    except OSError:
        return False


def _build_into(tmp: Path, spec: IndexSpec, m: IndexManifest, docs, encoder, timings, progress) -> IndexManifest:
    import numpy as np

    from drgym.corpus.chunking import split_documents
    from drgym.docstore import write_docstore
    from drgym.embedding import embed_passages_cached
    from drgym.index.bm25 import write_bm25
    from drgym.index.dense import build_dense_shards, write_tie_rank

    t = time.perf_counter()
    passages = split_documents(docs, encoder.tokenizer, max_tokens=m.chunking["max_tokens"] or None, overlap=m.chunking["overlap"])
    timings["split"] = time.perf_counter() - t
    t = time.perf_counter()
    write_docstore(tmp / "docs.sqlite", docs, passages)
    timings["docstore"] = time.perf_counter() - t

    texts = [p.embed_text for p in passages]
    write_tie_rank(tmp, [p.passage_id for p in passages])
    counts = {"encoded_live": 0}
    embed_seconds = [0.0]

    def embed(start: int, stop: int) -> np.ndarray:
        te = time.perf_counter()
        vecs, n_live = embed_passages_cached(encoder, texts[start:stop], show_progress=progress)
        counts["encoded_live"] += n_live
        embed_seconds[0] += time.perf_counter() - te
        return vecs

    t = time.perf_counter()
    m.shards = build_dense_shards(tmp, len(passages), m.shard_size, m.factory, embed, progress=progress)
    timings["embed"] = embed_seconds[0]
    timings["faiss"] = time.perf_counter() - t - embed_seconds[0]
    if spec.bm25:
        t = time.perf_counter()
        m.bm25 = write_bm25(tmp, texts)
        timings["bm25"] = time.perf_counter() - t
    m.n_passages = len(passages)
    m.n_documents = len(docs)
    m.files = record_files(tmp)
    m.timings = {k: round(v, 3) for k, v in timings.items()}
    m.timings["passages_encoded_live"] = counts["encoded_live"]
    m.write(tmp)
    return m


def _swap_into_place(tmp: Path, folder: Path) -> None:
    """Rename ``tmp`` to ``folder``; an older ``folder`` is moved aside and deleted."""
    old = None
    if folder.exists():
        old = folder.with_name(f".old-{folder.name}-{os.getpid()}-{time.time_ns()}")
        os.rename(folder, old)
    os.rename(tmp, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
