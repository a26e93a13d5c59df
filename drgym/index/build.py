"""Build an index folder (docstore + dense shards + BM25) from a corpus: streamed,
resumable, one builder at a time.

``build_index`` cuts the corpus into units of about 10,000 documents
(:mod:`drgym.index.units`; a JSONL file by byte range, parquet by row groups), and for
each unit, in order: reads it, splits it into passages with the encoder's tokenizer
(:func:`drgym.corpus.split_documents`, default window
:func:`~drgym.corpus.chunking.default_max_tokens`, overlap 32), embeds them (taking
vectors from drgym's shipped embedding cache when the texts match), and commits the
documents and passages to the docstore and the float16 vectors to an embedding part, in
one transaction. Then it assembles the dense shards from the parts (one FAISS index per
shard, IVF/PQ trained on a sample), the tie ranks, BM25 (streamed from the docstore) and
the manifest. Memory is bounded by one unit plus one FAISS shard, whatever the corpus
size.

Everything is written into ``<root>/.build-<name>/``, which is renamed to
``<root>/<name>`` only when complete: a loader never finds a half-built index. A build
that is killed leaves that folder behind, and running the same build again resumes after
the last committed unit (and after the last finished shard). Builds of the same index
take a file lock (``filelock``), so a second process waits and then reuses the first
one's index. If the destination already holds an index with the same identity (same
corpus fingerprint, or unchanged input files; encoder and revision, factory, chunking,
shard size, drgym version), nothing is rebuilt.

The unit loop and the shard builds go through a *runner*; :class:`LocalRunner` runs them
in this process, :class:`drgym.distributed.build.RayRunner` on a Ray cluster, and both
write the same files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError, CorpusError, CorruptIndexError, IndexNotFoundError, unknown_name
from drgym.index.calibrate import TARGET_RECALL
from drgym.index.manifest import IndexManifest, ShardInfo, record_checksums, record_files
from drgym.index.units import CHUNK_DOCS, EncodedUnit, Unit, encode_unit, plan_units
from drgym.types import Document

log = logging.getLogger(__name__)

DEFAULT_FACTORY = "auto"
"""Pick the FAISS index from the corpus size (:func:`choose_factory`)."""

FLAT_MAX = 1_000_000
"""``auto`` uses exact ``Flat`` search up to this many passages (the estimate is the
number of documents): on 2 CPU cores a single query over 10^6 384-d vectors takes
tens of ms (scripts/bench_scale.py) and the vectors take 1.5 GB; beyond it ``auto`` picks
IVF-PQ."""

DEFAULT_SHARD_SIZE = 25_000_000
"""Rows per dense shard (DeepResearchGym uses 25M documents a shard); wiki-default is one."""

DEFAULT_OVERLAP = 32

BUILD_PREFIX = ".build-"
"""Partial builds live in ``<root>/.build-<name>`` (hidden from ``drgym index list``)."""

_STATE = "build.json"


def choose_factory(n: int, dim: int, shard_size: int | None = None) -> str:
    """The FAISS factory ``auto`` picks for about ``n`` passages of dimension ``dim``.

    ``Flat`` (exact) up to :data:`FLAT_MAX` passages; beyond it IVF-PQ for the rows of
    one shard (``min(n, shard_size)``), as :func:`ivfpq_factory` gives it. HNSW is never
    picked: its graph is built at ~1 ms per vector per core and needs the float32 vectors
    in RAM (see the Scale docs); ask for ``HNSW32`` explicitly when latency matters more
    than build time and memory.

    >>> choose_factory(21_000, 384), choose_factory(5_000_000, 384), choose_factory(21_000_000, 768)
    ('Flat', 'IVF2048,PQ48x4fs', 'IVF4096,PQ96x4fs')
    >>> choose_factory(87_000_000, 768, shard_size=25_000_000)
    'IVF4096,PQ96x4fs'
    """
    if n <= FLAT_MAX:
        return "Flat"
    return ivfpq_factory(min(n, shard_size) if shard_size else n, dim)


def ivfpq_factory(rows: int, dim: int) -> str:
    """``IVF{nlist},PQ{m}x4fs`` for a shard of ``rows`` vectors (see :func:`choose_factory`).

    ``nlist`` is the power of two nearest ``sqrt(rows)`` (the low end of FAISS's
    1-16 sqrt(N) guideline, so that k-means stays affordable on CPUs), also when several
    shards share one quantizer (:func:`shard_tasks`): at wiki-18's size in 9 shards, 8,192
    shared lists needed the same share of the codes scanned for recall@10 0.95 as 2,048
    (``docs/benchmarks/scale.md``), and scanned them slower. In one shard of that size this
    rule gives 4,096 lists, which measured 768 of them (3.9 million codes a query) against
    512 of 2,048 (5.3 million) and answered in 0.94-0.97 of the time. ``m`` is the largest
    divisor of ``dim`` up to ``dim / 8`` (48 for 384-d). The codes are 4-bit PQ in FAISS's
    fast-scan layout (``x4fs``, SIMD look-up tables): ``m / 2`` bytes a vector, scanned
    several times faster than 8-bit PQ. Their coarser scores do not cost recall, because
    the top candidates are re-scored exactly from the memory-mapped float16 embeddings
    (``rerank`` in :data:`drgym.index.search_params.DEFAULT_SEARCH_PARAMS`), and recall is set
    by the share of lists probed (measured per index, :mod:`drgym.index.calibrate`). Measured side
    by side by ``scripts/bench_pq_codes.py`` (``scripts/results/bench_pq_codes.json``)
    on 10^6 synthetic MiniLM-like vectors, one thread, nprobe 256 of 1,024, re-rank 100:
    recall@10 0.973 (4-bit fast scan) and 0.974 (8-bit PQ), single-query p50 10.3 against
    48.6 ms on a loaded machine (4.7x), build 105 against 777 s, 34 against 58 bytes a
    vector on disk. FAISS's GPU
    indexes have no fast-scan PQ: a GPU machine searches such shards on the CPU (logged);
    build with ``--factory IVF{nlist},PQ{m}`` to search them on the GPU.

    >>> ivfpq_factory(100_000, 384), ivfpq_factory(2_500_000, 768)
    ('IVF256,PQ48x4fs', 'IVF2048,PQ96x4fs')
    """
    nlist = 2 ** min(16, max(8, round(math.log2(math.sqrt(rows)))))
    m = max(d for d in range(1, max(1, dim // 8) + 1) if dim % d == 0)
    return f"IVF{nlist},PQ{m}x4fs"


@dataclass
class IndexSpec:
    """What to build.

    Attributes:
        corpus: a named corpus (:data:`drgym.corpus.NAMED`, default ``"wiki-default"``)
            or a path to a corpus file or a folder of corpus files.
        format: corpus format for a path (one of :data:`drgym.corpus.FORMATS`); None sniffs.
        encoder: sentence-transformers model name or path.
        factory: FAISS ``index_factory`` string, or ``"auto"`` (:func:`choose_factory`).
        shard_size: rows per dense shard, >= 1.
        max_tokens: passage window in encoder tokens; None = encoder window minus title
            room (224 for MiniLM); 0 disables splitting.
        overlap: tokens shared by consecutive windows of a split document.
        bm25: also build the BM25 index.
        bm25_tokenizer: BM25 tokens: :data:`drgym.index.bm25.TOKENIZER` (CJK bigrams,
            default) or ``"bm25s"`` (bm25s's own, to reproduce rankings measured with it;
            the folder name then ends in ``--bm25s``).
        bm25_engine: ``"bm25s"`` (default: the score matrix in memory, fastest, about
            2.4 GB of build memory per million passages) or ``"fts5"`` (SQLite FTS5 on
            disk, built streaming with bounded memory at any size:
            :mod:`drgym.index.fts5`; the folder name then ends in ``--fts5``).
        name: index folder name; None derives one from corpus, encoder and factory.
        chunk_docs: documents per build unit (resumption granularity; does not change
            the index).
        target_recall: an IVF index records the smallest ``nprobe`` whose recall@10 on
            its own rows reaches this with 95% confidence (:mod:`drgym.index.calibrate`,
            which adds the measuring to the build's timings as ``calibrate``); None or 0 keeps
            :func:`drgym.index.search_params.auto_nprobe`'s quarter of the lists. Not part of
            the index's identity.
        queries_file: the queries that calibration measures with
            (:func:`drgym.index.calibrate.calibration_queries`): a text file of one query a
            line (encoded by the build's query encoder) or a ``.npy`` of vectors; None:
            drgym's shipped questions when the encoder is the shipped MiniLM, else the
            index's own rows. The manifest's ``calibration["source"]`` says which. Not
            part of the index's identity.
        wikipedia_urls: the corpus file is Wikipedia (``wiki18`` or ``hipporag`` rows):
            a row without a ``url`` gets the Wikipedia URL of its title. False (default):
            it gets none, and is shown and fetched as ``drgym://doc/<doc_id>``. A corpus
            file's rows keep their own ids (``{"id": "0"}`` is doc_id ``"0"``); the
            manifest's ``chunking`` records both (``id_prefix``, ``urls``), so an index
            built otherwise is rebuilt.
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
    chunk_docs: int = CHUNK_DOCS
    bm25_tokenizer: str | None = None
    bm25_engine: str = "bm25s"
    target_recall: float | None = TARGET_RECALL
    queries_file: str | None = None
    wikipedia_urls: bool = False

    def index_name(self, encoder_name: str) -> str:
        """The folder name: given, or ``<corpus>--<encoder>--<factory>[--s<shard_size>]``."""
        if self.name:
            check_index_name(self.name)
            return self.name
        corpus = Path(self.corpus).stem if _is_path(self.corpus) else self.corpus
        parts = [corpus, Path(encoder_name).name, self.factory]
        if self.shard_size != DEFAULT_SHARD_SIZE:
            parts.append(f"s{self.shard_size}")
        from drgym.index.bm25 import LEGACY_TOKENIZER

        if self.bm25 and self.bm25_tokenizer == LEGACY_TOKENIZER:
            parts.append(LEGACY_TOKENIZER)
        if self.bm25 and self.bm25_engine != "bm25s":
            parts.append(self.bm25_engine)
        return "--".join(re.sub(r"[^A-Za-z0-9._-]+", "_", p) for p in parts)


def check_index_name(name: str) -> None:
    """Refuse index names that are not plain folder names.

    Raises:
        ConfigError: characters other than letters, digits, ``.``, ``_``, ``-``, or a
            leading dot.
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name.startswith("."):
        raise ConfigError(f"Index name {name!r} may hold only letters, digits, '.', '_' and '-'.")


def _is_path(corpus: str) -> bool:
    from drgym.corpus.named import NAMED

    return corpus not in NAMED and (os.sep in corpus or Path(corpus).exists())


_ENCODERS: dict[tuple[str, str | None, str], object] = {}
_ENCODERS_LOCK = threading.Lock()


def get_encoder(name: str = "all-MiniLM-L6-v2", device: str | None = None, backend: str | None = None):
    """A process-wide shared :class:`drgym.embedding.Encoder` (loaded once per name, device
    and query ``backend``: ``"torch"``, ``"onnx"`` or ``"onnx-int8"``, see
    :data:`drgym.embedding.ENCODER_BACKENDS`; None: the default for the device,
    :func:`drgym.embedding.resolve_encoder_backend`).

    Encoders are not safe for concurrent ``encode`` calls (fast tokenizers raise
    "Already borrowed"); :class:`~drgym.search.local.LocalSearchEngine` serialises them.
    """
    from drgym.embedding import Encoder, resolve_encoder_backend

    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = resolve_encoder_backend(backend, device)
    key = (name, device, backend)
    with _ENCODERS_LOCK:
        enc = _ENCODERS.get(key)
        if enc is None:
            enc = Encoder(name, device=device, backend=backend)
            _ENCODERS[key] = enc
        return enc


@contextlib.contextmanager
def build_lock(root: Path, name: str, *, announce: Callable[[str], None] | None = None):
    """Exclusive per-index file lock (``filelock``), so concurrent builders of one index
    take turns: the second waits, then finds the first one's index and reuses it.

    The lock is ``<root>/.<name>.lock``; the operating system releases it when the holder
    dies, so a killed build never blocks the next one.

    Args:
        root: folder of index folders.
        name: index name.
        announce: called with a message when the lock is busy (before waiting).
    """
    from filelock import FileLock, Timeout

    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f".{name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        msg = f"another process is building index {name!r}; waiting for it (lock {lock.lock_file})"
        log.info(msg)
        if announce:
            announce(msg)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def planned_manifest(spec: IndexSpec, label: str, fingerprint: str, sources: list[dict], encoder) -> IndexManifest:
    """The manifest a build of ``spec`` would write (without counts, shards, files,
    timings; ``fingerprint`` is ``""`` for a file corpus until it is read).

    Raises:
        ConfigError: ``shard_size < 1``.
    """
    from drgym import __version__
    from drgym.corpus.chunking import default_max_tokens

    max_tokens = default_max_tokens(encoder.max_length) if spec.max_tokens is None else int(spec.max_tokens)
    if spec.shard_size < 1:
        raise ConfigError(f"shard_size must be >= 1, got {spec.shard_size}.")
    target = spec.target_recall
    if target is not None and (isinstance(target, bool) or not 0 <= float(target) <= 1):
        raise ConfigError(f"target_recall must be in [0, 1] (0 or None: no calibration), got {target!r}.")
    return IndexManifest(
        name=spec.index_name(encoder.name),
        corpus=label,
        corpus_fingerprint=fingerprint,
        n_documents=0,
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
        bm25=_planned_bm25(spec.bm25_tokenizer, spec.bm25_engine) if spec.bm25 else None,
        drgym_version=__version__,
        sources=sources,
        calibration=({"target_recall": float(target)} | ({"queries_file": str(spec.queries_file)}
                                                           if spec.queries_file else {})) if target else {},
    )


BM25_ENGINES = ("bm25s", "fts5")
"""BM25 engines: bm25s's in-memory score matrix, or SQLite FTS5 on disk (:mod:`drgym.index.fts5`)."""


def _planned_bm25(tokenizer: str | None = None, engine: str = "bm25s") -> dict:
    from drgym.errors import ConfigError
    from drgym.index.bm25 import TOKENIZER, TOKENIZERS

    tokenizer = tokenizer or TOKENIZER
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"bm25_tokenizer must be one of {list(TOKENIZERS)}, got {tokenizer!r}.")
    if engine not in BM25_ENGINES:
        raise unknown_name("bm25 engine", str(engine), set(BM25_ENGINES))
    planned = {"enabled": True, "tokenizer": tokenizer}
    if engine != "bm25s":  # a bm25s index's manifest stays as it was
        planned["engine"] = engine
    return planned


def bm25_engine_of(bm25: dict | None) -> str:
    """The engine of a manifest's ``bm25`` entry (``"bm25s"`` when it names none)."""
    return str((bm25 or {}).get("engine") or "bm25s")


def source_key(sources: list[dict]) -> list[tuple]:
    """What identifies input files for reuse: ``(path, bytes, mtime_ns, role)`` each."""
    return [(s.get("path"), s.get("bytes"), s.get("mtime_ns"), s.get("role", "corpus")) for s in sources]


def same_identity(existing: IndexManifest, planned: IndexManifest) -> bool:
    """Whether ``existing`` is what ``planned`` would build: equal identities (but for
    the corpus fingerprint and sources), then an equal fingerprint when the planned one
    is known (named corpora), else unchanged input files (path, size, mtime)."""
    a, b = existing.identity(), planned.identity()
    for d in (a, b):
        d.pop("corpus_fingerprint", None)
        d.pop("sources", None)
    if existing.bm25 is not None and planned.bm25 is not None:
        # BM25 settings are fixed by the drgym version, but for the tokeniser (an index
        # whose BM25 tokens were made otherwise is rebuilt; None: before CJK bigrams)
        a["bm25"] = (existing.bm25.get("tokenizer"), bm25_engine_of(existing.bm25))
        b["bm25"] = (planned.bm25.get("tokenizer"), bm25_engine_of(planned.bm25))
    if a != b:
        return False
    if planned.corpus_fingerprint:
        return existing.corpus_fingerprint == planned.corpus_fingerprint
    return bool(planned.sources) and source_key(existing.sources) == source_key(planned.sources)


@dataclass
class BuildResult:
    """Outcome of :func:`build_index`.

    Attributes:
        folder: the index folder.
        manifest: its manifest.
        built: False when an identical index already existed.
        seconds: wall time of the call.
        resumed_units: units found done in a partial build and not redone.
    """

    folder: Path
    manifest: IndexManifest
    built: bool
    seconds: float
    resumed_units: int = 0


@dataclass
class ShardTask:
    """One dense shard to build: arguments of :func:`drgym.index.faiss_build.write_dense_shard`."""

    folder: str
    shard_no: int
    start: int
    count: int
    parts: list[tuple[str, int, int]]
    dim: int
    factory: str
    trained: str = ""

    def run(self) -> ShardInfo:
        """Build the shard (skipped when a previous run finished it)."""
        from drgym.index.faiss_build import write_dense_shard

        return write_dense_shard(Path(self.folder), self.shard_no, self.start, self.count, self.parts, self.dim,
                                 self.factory, self.trained)


def shard_tasks(folder: str | Path, n: int, shard_size: int, parts: list[tuple[str, int, int]], dim: int,
                factory: str) -> list[ShardTask]:
    """The shards of an ``n``-row dense index, ``shard_size`` rows each: the one place a
    build, an import and the benchmarks cut an index into shards. With more than one shard
    an IVF ``factory`` is trained once on a sample of all rows
    (:func:`drgym.index.faiss_build.write_trained`, which runs here) and every shard is a clone
    of it, so that they share one coarse quantizer.

    Raises:
        ConfigError: bad factory or failed training.
        CorruptIndexError: a part is not as announced.
    """
    from drgym.index.faiss_build import write_trained

    starts = range(0, n, shard_size)
    trained = write_trained(folder, parts, n, dim, factory) if len(starts) > 1 else ""
    return [ShardTask(str(folder), no, s, min(n, s + shard_size) - s, parts, dim, factory, trained)
            for no, s in enumerate(starts)]


@dataclass
class BuildContext:
    """What a runner needs to encode units: the encoder (loaded, and as the user named it,
    for runners that load it again elsewhere) and the chunking settings."""

    encoder: object
    max_tokens: int
    overlap: int
    memory_docs: list[Document] | None = None
    progress: bool = False
    encoder_spec: str = ""


class LocalRunner:
    """Run a build's units and shards in this process, in order."""

    name = "local"

    def encode_units(self, units: list[Unit], ctx: BuildContext) -> Iterator[EncodedUnit]:
        """Encoded units, in the order of ``units``."""
        from tqdm.auto import tqdm

        for u in tqdm(units, desc="units", disable=not ctx.progress or len(units) < 2):
            yield encode_unit(u, ctx.encoder, max_tokens=ctx.max_tokens, overlap=ctx.overlap,
                              memory_docs=ctx.memory_docs)

    def build_shards(self, tasks: list[ShardTask], progress: bool = False) -> list[ShardInfo]:
        """Build the shards one after the other."""
        from tqdm.auto import tqdm

        return [t.run() for t in tqdm(tasks, desc="dense shards", disable=not progress or len(tasks) < 2)]


def _estimate_docs(units: list[Unit]) -> int:
    """Documents of a plan; a unit read whole (gz, JSON) counts its file size / 1 KB."""
    n = 0
    for u in units:
        n += u.n_docs if u.n_docs >= 0 else max(1, Path(u.path).stat().st_size // 1024) if u.path else 0
    return n


def check_corpus_files(corpus: str, format: str | None = None) -> None:
    """Check the start of every file of a corpus path (each whole when small:
    :func:`drgym.corpus.readers.check_corpus_start`) before a build loads any model; a
    named corpus, and a path that does not exist (the build names it), pass unchecked.

    Raises:
        CorpusError: a file is empty or of no known format (when ``format`` is None),
            or a row read is malformed (file and line named).
    """
    from drgym.corpus.named import NAMED
    from drgym.corpus.readers import check_corpus_start
    from drgym.index.units import corpus_files

    if corpus in NAMED:
        return
    p = Path(corpus).expanduser()
    if not p.exists():
        return
    for f in corpus_files(p):
        check_corpus_start(f, format)


def _plan(spec: IndexSpec, root: Path, docs: list[Document] | None) -> tuple[list[Unit], list[dict], str, str]:
    """Units, sources, label and (for named / in-memory corpora) fingerprint; a file
    corpus's plan is cached under ``<root>/.plans`` by its sources, so a rebuild or a
    reuse check does not rescan it."""
    from drgym.atomic import atomic_write_json
    from drgym.corpus.named import NAMED, corpus_fingerprint
    from drgym.index.units import _named

    if docs is not None or spec.corpus in NAMED:
        units, sources, label = plan_units(spec.corpus, spec.format, chunk_docs=spec.chunk_docs, docs=docs)
        return units, sources, label, corpus_fingerprint(docs if docs is not None else _named(spec.corpus))
    from drgym.index.units import corpus_files, source_stat

    p = Path(spec.corpus).expanduser()
    if not p.exists():
        return (*plan_units(spec.corpus, spec.format, chunk_docs=spec.chunk_docs), "")  # raises: unknown corpus
    sources = [source_stat(f) for f in corpus_files(p)]
    key = json.dumps([source_key(sources), spec.format, spec.chunk_docs])
    cache = root / ".plans" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
    if cache.exists():
        try:
            d = json.loads(cache.read_text())
            return [Unit.from_dict(u) for u in d["units"]], d["sources"], d["label"], ""
        except (ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable plan cache %s (%s)", cache, e)
    units, sources, label = plan_units(spec.corpus, spec.format, chunk_docs=spec.chunk_docs)
    with contextlib.suppress(OSError):  # a read-only root: plan again next time
        atomic_write_json(cache, {"units": [u.to_dict() for u in units], "sources": sources, "label": label}, indent=None)
    return units, sources, label, ""


def build_index(
    spec: IndexSpec | None = None,
    *,
    root: str | Path | None = None,
    encoder=None,
    force: bool = False,
    progress: bool = False,
    docs: list[Document] | None = None,
    resume: bool = True,
    runner=None,
) -> BuildResult:
    """Build (or reuse, or resume) the index described by ``spec``.

    Args:
        spec: what to build (default: wiki-default, MiniLM, ``auto`` factory, BM25).
        root: folder holding index folders; None is :func:`drgym.paths.indexes_dir`.
        encoder: an already loaded :class:`drgym.embedding.Encoder` whose name must match
            ``spec.encoder``; None loads (and shares) one.
        force: rebuild even if an identical index exists.
        progress: show progress bars (units, shards) and say when waiting for a lock.
        docs: documents to index instead of reading ``spec.corpus`` (which then only
            labels the manifest).
        resume: continue a partial build of the same index left by a killed run
            (False starts over).
        runner: where units are encoded and shards built: None is :class:`LocalRunner`;
            :class:`drgym.distributed.build.RayRunner` uses a Ray cluster.

    Returns:
        A :class:`BuildResult`.

    Raises:
        ConfigError: bad spec (factory string, shard size, name), an empty corpus, or an
            encoder that cannot be loaded here (checked before the corpus is read).
        CorpusError: the corpus cannot be read (not UTF-8, not JSON: file and line
            named), or repeats a doc_id (file and doc_id named). Documents with no text
            are skipped and counted in one warning.
        IndexMismatchError: the destination holds an index of a newer format.
        OSError: ENOSPC naming the partial build folder when the disk filled up (free
            space and rerun: the build resumes).
    """
    from drgym.paths import indexes_dir

    t0 = time.perf_counter()
    spec = spec or IndexSpec()
    root = Path(root) if root is not None else indexes_dir()
    runner = runner or LocalRunner()
    timings: dict[str, float] = {}

    if encoder is None:  # before the corpus is read: a missing model is reported at once
        from drgym.embedding import check_encoder

        check_encoder(spec.encoder)
    if docs is None:  # a malformed corpus file is reported now, not after the encoder has loaded
        check_corpus_files(spec.corpus, spec.format)
    t = time.perf_counter()
    units, sources, label, fingerprint = _plan(spec, root, docs)
    units = with_wikipedia_urls(units, spec.wikipedia_urls)
    timings["plan"] = time.perf_counter() - t
    t = time.perf_counter()
    if encoder is None:
        encoder = get_encoder(spec.encoder)
    timings["load_encoder"] = time.perf_counter() - t
    if spec.factory == "auto":
        from dataclasses import replace

        spec = replace(spec, factory=choose_factory(_estimate_docs(units), encoder.dim, spec.shard_size))
    from drgym.index.faiss_build import new_faiss_index

    new_faiss_index(encoder.dim, spec.factory)  # a bad factory string fails now, not after encoding
    planned = planned_manifest(spec, label, fingerprint, sources, encoder)
    if units and all(u.kind in ("span", "file") for u in units):  # a corpus file: how its ids and URLs were read
        planned.chunking |= {"id_prefix": "", "urls": "wikipedia" if spec.wikipedia_urls else "corpus"}
    folder = root / planned.name
    announce = (lambda m: print(m, flush=True)) if progress else None

    # An identical index is reused before taking the lock (whose file needs a writable
    # root): indexes on a read-only disk stay usable. A manifest of a newer format
    # (IndexMismatchError) stops here with what to do.
    existing = reusable_index(folder, planned, force)
    if existing is not None:
        return BuildResult(folder, existing, False, time.perf_counter() - t0)
    with build_lock(root, planned.name, announce=announce):
        existing = reusable_index(folder, planned, force)  # built by another process while we waited
        if existing is not None:
            return BuildResult(folder, existing, False, time.perf_counter() - t0)
        state = {"identity": planned.identity(), "corpus_fingerprint": planned.corpus_fingerprint,
                 "sources": source_key(planned.sources), "chunk_docs": spec.chunk_docs,
                 "bm25": spec.bm25, "units": len(units)}
        ctx = BuildContext(encoder, planned.chunking["max_tokens"], planned.chunking["overlap"], docs, progress,
                           encoder_spec=spec.encoder)
        manifest, resumed = build_into_place(root, planned, state, units, ctx, runner, timings, bm25=spec.bm25,
                                             resume=resume)
    return BuildResult(folder, manifest, True, time.perf_counter() - t0, resumed)


def with_wikipedia_urls(units: list[Unit], wikipedia_urls: bool) -> list[Unit]:
    """``units`` reading Wikipedia URLs from titles for rows without a URL, when
    ``wikipedia_urls`` (see :attr:`IndexSpec.wikipedia_urls`).

    Raises:
        ConfigError: ``wikipedia_urls`` for a corpus that is not ``wiki18`` or
            ``hipporag`` files (named corpora already have their URLs).
    """
    if not wikipedia_urls:
        return units
    from dataclasses import replace

    from drgym.corpus.readers import WIKIPEDIA_URL_FORMATS

    other = sorted({u.format or u.kind for u in units if u.format not in WIKIPEDIA_URL_FORMATS})
    if other:
        raise ConfigError(f"--wikipedia-urls applies to {' and '.join(WIKIPEDIA_URL_FORMATS)} corpus files, whose "
                          f"rows may lack a URL; this corpus is {', '.join(other)}.")
    return [replace(u, wikipedia_urls=True) for u in units]


def reusable_index(folder: Path, planned: IndexManifest, force: bool) -> IndexManifest | None:
    """The manifest of an index at ``folder`` that :func:`same_identity` finds equal to
    ``planned`` and whose files are intact, or None (also with ``force``).

    Raises:
        IndexMismatchError: the manifest there is of a newer format.
    """
    if force or not (folder / "manifest.json").exists():
        return None
    try:
        existing = IndexManifest.read(folder)
        if same_identity(existing, planned):
            existing.check_files(folder)
            return existing
        log.info("index %s: manifest changed, rebuilding", folder)
    except (CorruptIndexError, IndexNotFoundError) as e:
        log.warning("index %s is corrupt (%s); rebuilding", folder, e)
    return None


def build_into_place(root: Path, planned: IndexManifest, state: dict, units: list[Unit], ctx: BuildContext, runner,
                     timings: dict, *, bm25: bool, resume: bool, dense=None) -> tuple[IndexManifest, int]:
    """Build ``planned`` in ``<root>/.build-<name>`` (resuming a partial build whose
    ``state`` matches) and rename it to ``<root>/<name>``; the caller holds the lock.

    A wrong input or spec (:class:`ConfigError`, :class:`CorpusError`) removes the
    partial build; any other failure keeps it for the next run to resume.

    Returns:
        ``(manifest, units resumed)``.

    Raises:
        OSError: ENOSPC naming the partial build folder when the disk filled up.
    """
    build_dir = root / f"{BUILD_PREFIX}{planned.name}"
    prepare_build_dir(build_dir, json.loads(json.dumps(state)), resume)
    try:
        manifest, resumed = run_build(build_dir, planned, units, ctx, runner, timings, bm25=bm25, dense=dense)
        swap_into_place(build_dir, root / planned.name)
    except (ConfigError, CorpusError):
        shutil.rmtree(build_dir, ignore_errors=True)  # the input or spec is wrong: nothing to resume
        raise
    except BaseException as e:
        log.warning("build of %s stopped; the partial build in %s is resumed by running the same build again",
                    planned.name, build_dir)
        if _disk_full(e, root):  # one line naming the folder, whichever library hit the full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(build_dir)) from e
        raise
    return manifest, resumed


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


def prepare_build_dir(build_dir: Path, state: dict, resume: bool) -> None:
    """Create ``build_dir``, or keep it for resumption when its recorded state equals
    ``state`` (same index identity, inputs and unit size) and ``resume`` is set; else
    start it afresh."""
    from drgym.atomic import atomic_write_json

    sp = build_dir / _STATE
    if build_dir.exists():
        old = None
        with contextlib.suppress(OSError, ValueError):
            old = json.loads(sp.read_text())
        if resume and old == state:
            log.info("resuming the partial build in %s", build_dir)
            return
        log.info("discarding the partial build in %s (%s)", build_dir,
                 "resume off" if not resume else "it was for other inputs or settings")
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True)
    atomic_write_json(sp, state)


PARTS_DIR = "parts"


def part_path(build_dir: Path, unit_no: int) -> Path:
    """Embedding part of a unit: ``parts/emb-<unit>.npy`` (float16, one row a passage)."""
    return build_dir / PARTS_DIR / f"emb-{unit_no:06d}.npy"


def commit_unit(writer, build_dir: Path, eu: EncodedUnit) -> None:
    """Store one encoded unit: its vectors as an embedding part (written atomically
    inside the docstore transaction, before the commit) and its documents and passages
    in the docstore, with the unit marked done."""
    from drgym.atomic import atomic_write_bytes

    def write_part(first_row: int) -> None:
        if eu.vectors is None:
            return
        import io

        buf = io.BytesIO()
        np.save(buf, np.asarray(eu.vectors, dtype=np.float16))
        atomic_write_bytes(part_path(build_dir, eu.no), buf.getvalue())

    writer.add_unit(eu.no, eu.docs, eu.passages, before_commit=write_part)


def run_build(build_dir: Path, planned: IndexManifest, units: list[Unit], ctx: BuildContext, runner,
              timings: dict, *, bm25: bool, dense=None) -> tuple[IndexManifest, int]:
    """Fill ``build_dir``: the units not yet committed, then :func:`finalize`.

    Args:
        dense: None builds dense shards from the units' embedding parts; an importer
            passes a callable ``dense(build_dir, n_passages) -> (shards, sources)``.

    Returns:
        ``(manifest, units resumed)``.
    """
    from drgym.docstore import DocStoreWriter

    writer = DocStoreWriter(build_dir / "docs.sqlite")
    try:
        done = writer.done_units()
        if [d[0] for d in done] != list(range(len(done))):
            raise CorruptIndexError(f"Partial build {build_dir} has units {[d[0] for d in done][:10]}... out of order; "
                                    "rerun with resume off (--no-resume).")
        todo = units[len(done):]
        if done:
            log.info("%d of %d units already built; resuming", len(done), len(units))
            if ctx.progress:
                print(f"resuming: {len(done)} of {len(units)} units already built", flush=True)
        t = time.perf_counter()
        n_live = 0
        no_text: list[str] = []
        for eu in runner.encode_units(todo, ctx):
            try:
                commit_unit(writer, build_dir, eu)
            except CorpusError as e:  # a duplicate doc_id: name the file it is in
                where = units[eu.no].path if eu.no < len(units) and units[eu.no].path else planned.corpus
                raise CorpusError(f"{where}: {e}") from None
            n_live += eu.n_live
            no_text += eu.skipped_no_text
        if no_text:
            shown = ", ".join(repr(x) for x in no_text[:10]) + (f" and {len(no_text) - 10} more" if len(no_text) > 10 else "")
            log.warning("%s: skipped %d document%s with no text: doc_ids %s", planned.corpus, len(no_text),
                        "s" if len(no_text) > 1 else "", shown)
        timings["encode"] = time.perf_counter() - t
        manifest = finalize(build_dir, planned, writer, runner, timings, bm25=bm25, dense=dense, progress=ctx.progress,
                            encoder=ctx.encoder)
        manifest.timings["passages_encoded_live"] = n_live
        manifest.write(build_dir)
        # Read back what was written: the manifest parses, and every file has its size and
        # sampled checksum (the full hashes were just computed from these same files).
        IndexManifest.read(build_dir).check_files(build_dir, "sample")
        return manifest, len(done)
    finally:
        writer.close()


def finalize(build_dir: Path, m: IndexManifest, writer, runner, timings: dict, *, bm25: bool, dense=None,
             progress: bool = False, encoder=None) -> IndexManifest:
    """Turn a filled docstore and its embedding parts into a complete index folder:
    fingerprint, tie ranks, dense shards, the IVF ``nprobe`` measured when ``m.calibration``
    names a ``target_recall`` (:func:`drgym.index.calibrate.calibrate_nprobe`, on the
    queries of :func:`drgym.index.calibrate.calibration_queries`: ``m.calibration``'s
    ``queries_file``, else the shipped questions when ``encoder`` is the shipped MiniLM,
    else the index's own rows), BM25, file sizes and checksums, manifest (all streamed).

    Raises:
        ConfigError: empty corpus, failed FAISS training, BM25 too large for memory.
        CorruptIndexError: the docstore's corpus differs from the planned fingerprint.
    """
    from drgym.corpus.named import fingerprint_rows
    from drgym.index.bm25 import write_bm25
    from drgym.index.ranking import write_tie_rank

    n, n_docs = writer.next_row, writer.n_documents
    if n == 0:
        raise ConfigError(f"Corpus {m.corpus!r} has no documents; nothing to index.")
    t = time.perf_counter()
    fp = fingerprint_rows(writer.iter_documents())
    if m.corpus_fingerprint and fp != m.corpus_fingerprint:
        raise CorruptIndexError(f"The document store of {build_dir} does not hold the planned corpus "
                                "(fingerprint differs); rerun with resume off (--no-resume).")
    m.corpus_fingerprint = fp
    timings["fingerprint"] = time.perf_counter() - t
    t = time.perf_counter()
    write_tie_rank(build_dir, writer.iter_rows_by_passage_id(), n)
    timings["tie_rank"] = time.perf_counter() - t
    t = time.perf_counter()
    if dense is None:
        parts = [(str(part_path(build_dir, u)), first, cnt) for u, first, cnt, _ in writer.done_units()]
        tasks = shard_tasks(build_dir, n, m.shard_size, parts, m.dim, m.factory)
        m.shards = runner.build_shards(tasks, progress=progress)
    else:
        m.shards, extra_sources = dense(build_dir, n)
        m.sources = list(m.sources) + extra_sources
    timings["faiss"] = time.perf_counter() - t
    target = (m.calibration or {}).get("target_recall")
    queries_file = (m.calibration or {}).get("queries_file")
    m.calibration = {}
    if target:
        from drgym.index.calibrate import calibrate_nprobe, calibration_queries

        t = time.perf_counter()
        vectors, source = (calibration_queries(encoder, queries_file) if "IVF" in str(m.factory).upper()
                          else (None, {}))  # only an IVF index is calibrated: no questions to encode
        m.calibration = calibrate_nprobe(build_dir, m.shards, m.dim, int(n), target=float(target),
                                         query_vectors=vectors) or {}
        if m.calibration:
            m.calibration.update(source)
            timings["calibrate"] = time.perf_counter() - t
    if bm25:
        t = time.perf_counter()
        tokenizer = (m.bm25 or {}).get("tokenizer") or _planned_bm25()["tokenizer"]
        if bm25_engine_of(m.bm25) == "fts5":
            from drgym.index.fts5 import write_fts5

            m.bm25 = write_fts5(build_dir, writer.iter_embed_texts(), tokenizer=tokenizer)
        else:
            m.bm25 = write_bm25(build_dir, writer.iter_embed_texts(), tokenizer=tokenizer)
        timings["bm25"] = time.perf_counter() - t
    writer.finish()
    writer.close()
    shutil.rmtree(build_dir / PARTS_DIR, ignore_errors=True)
    (build_dir / _STATE).unlink(missing_ok=True)
    m.n_passages, m.n_documents = int(n), int(n_docs)
    m.files = record_files(build_dir)
    t = time.perf_counter()
    m.checksums = record_checksums(build_dir, m.files)
    timings["checksums"] = time.perf_counter() - t
    m.timings = {k: round(v, 3) for k, v in timings.items()}
    return m


def swap_into_place(tmp: Path, folder: Path) -> None:
    """Rename ``tmp`` to ``folder``; an older ``folder`` is moved aside and deleted."""
    old = None
    if folder.exists():
        old = folder.with_name(f".old-{folder.name}-{os.getpid()}-{time.time_ns()}")
        os.rename(folder, old)
    os.rename(tmp, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
