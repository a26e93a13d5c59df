"""``drgym index import``: an index from a corpus plus vectors made elsewhere, with
nothing re-encoded.

Two kinds of vectors:

* an existing FAISS index, e.g. FlashRAG / Search-R1's ``e5_Flat.index`` next to
  ``wiki-18.jsonl`` (row ``i`` of the index is line ``i`` of the corpus, a
  ``{"id", "contents"}`` row whose ``contents`` is ``'"title"\\ntext'``). The index file
  becomes the one dense shard (hard-linked when it is on the same filesystem, else
  copied, or symlinked on request); it must use inner product.
* ``.npy`` embedding shards (float32 or float16 ``(rows, dim)``, concatenated in the
  order given = corpus order). drgym then builds its own FAISS shards over them
  (any factory, ``auto`` by default), as a native build does.

The corpus is read in units (:mod:`drgym.index.units`), one document a passage (no
splitting: a Search-R1 corpus is already cut into 100-word passages), into the docstore
of a partial build folder, then checked against the vectors: the row counts and the
dimensions (of the index, the shards and, when its weights are found locally, the named
encoder) must agree, and each mismatch is one error naming both numbers. The encoder is
only named: queries are encoded with it at search time, so it must be the model that
made the vectors. When its weights are not found locally, the manifest records revision
``"unknown"`` (then not checked at load time) and a warning says so.

The rows' ids are kept as they are (``wiki18`` and ``web`` rows: the ``id`` field), so
``/retrieve``, ``/search`` and trajectories name a passage by the id of the source corpus,
as Search-R1 does; ``id_prefix`` (``--id-prefix``) puts a namespace in front of them.

    >>> from drgym.index.importer import import_index
    >>> res = import_index("wiki-18.jsonl", faiss_index="e5_Flat.index", encoder="intfloat/e5-base-v2")
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drgym.errors import ConfigError, CorpusError
from drgym.index.build import (
    DEFAULT_SHARD_SIZE,
    BuildContext,
    BuildResult,
    IndexSpec,
    LocalRunner,
    build_into_place,
    build_lock,
    choose_factory,
    planned_manifest,
    reusable_index,
    shard_tasks,
    source_key,
    with_wikipedia_urls,
)
from drgym.index.calibrate import TARGET_RECALL
from drgym.index.manifest import UNKNOWN_REVISION, ShardInfo
from drgym.index.units import CHUNK_DOCS, plan_units, source_stat

log = logging.getLogger(__name__)

LINK_MODES = ("auto", "hardlink", "copy", "symlink")
NORM_SAMPLE = 1000
"""Rows whose L2 norm is checked to record ``normalized`` in the manifest."""


@dataclass(frozen=True)
class EncoderInfo:
    """What a manifest records about an encoder, found without encoding anything.

    Attributes:
        name: canonical name (:func:`drgym.embedding.resolve_model`).
        revision: content hash of its weights, or ``"unknown"``.
        dim: embedding dimension, or 0 when unknown.
        max_length: encoder window in tokens, or 0 when unknown.
    """

    name: str
    revision: str
    dim: int
    max_length: int


def encoder_info(name: str) -> EncoderInfo:
    """Describe the encoder ``name``: loaded when its weights are on this machine (a
    local folder, a drgym-shipped model, or the Hugging Face cache), else only named.

    Never downloads anything.
    """
    from drgym.embedding import resolve_model
    from drgym.errors import DependencyNotInstalled

    try:
        canonical, load_path = resolve_model(name)
    except DependencyNotInstalled:
        canonical, load_path = name, name
    local = Path(load_path).exists()
    if not local:
        try:
            from huggingface_hub import try_to_load_from_cache

            local = isinstance(try_to_load_from_cache(load_path, "config.json"), str)
        except Exception:  # noqa: BLE001 - not a repo id, or no hub library: not local
            local = False
    if local:
        from drgym.index.build import get_encoder

        try:
            enc = get_encoder(name, "cpu")
            return EncoderInfo(enc.name, enc.revision, enc.dim, enc.max_length)
        except Exception as e:  # noqa: BLE001 - a broken local model: fall back to the name
            log.warning("could not load encoder %s (%s); recording it by name only", name, e)
    log.warning("encoder %r was not found on this machine: the manifest records revision %r and the dimension "
                "of the vectors; queries need that model (pip package, local folder or HF cache) at search time",
                name, UNKNOWN_REVISION)
    return EncoderInfo(canonical, UNKNOWN_REVISION, 0, 0)


def describe_faiss(index) -> str:
    """A factory-like description of a FAISS index (``Flat``, ``HNSW32``,
    ``IVF4096,PQ64``...), or its class name."""
    import faiss

    idx = faiss.downcast_index(index)
    cls = type(idx).__name__
    if cls in ("IndexFlatIP", "IndexFlat", "IndexFlatL2"):
        return "Flat"
    if cls == "IndexHNSWFlat":
        return f"HNSW{idx.hnsw.nb_neighbors(1)}"
    if cls == "IndexIVFFlat":
        return f"IVF{idx.nlist},Flat"
    if cls == "IndexIVFPQ":
        return f"IVF{idx.nlist},PQ{idx.pq.M}" + (f"x{idx.pq.nbits}" if idx.pq.nbits != 8 else "")
    if cls == "IndexScalarQuantizer":
        return "SQfp16" if idx.sq.qtype == faiss.ScalarQuantizer.QT_fp16 else "SQ8" if idx.sq.qtype == faiss.ScalarQuantizer.QT_8bit else cls
    return cls


def _sample_norms(index=None, arrays=None) -> np.ndarray | None:
    """L2 norms of up to :data:`NORM_SAMPLE` evenly spaced rows, or None when the index
    cannot give its vectors back."""
    if arrays is not None:
        a = arrays[0]
        rows = np.unique(np.linspace(0, len(a) - 1, min(NORM_SAMPLE, len(a))).astype(np.int64))
        return np.linalg.norm(np.asarray(a[rows], dtype=np.float32), axis=1)
    try:
        n = index.ntotal
        rows = np.unique(np.linspace(0, n - 1, min(NORM_SAMPLE, n)).astype(np.int64))
        return np.linalg.norm(np.stack([index.reconstruct(int(r)) for r in rows]), axis=1)
    except RuntimeError:
        return None


def _place(src: Path, dst: Path, link: str) -> str:
    """Put ``src`` at ``dst`` by hard link, copy or symlink; returns the mode used."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    if link in ("auto", "hardlink"):
        try:
            os.link(src, dst)
            return "hardlink"
        except OSError as e:
            if link == "hardlink":
                raise ConfigError(f"Cannot hard-link {src} into {dst.parent} ({e.strerror}); use --link copy.") from e
    if link == "symlink":
        dst.symlink_to(src.resolve())
        return "symlink"
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return "copy"


def import_index(
    corpus: str | Path,
    *,
    encoder: str,
    faiss_index: str | Path | None = None,
    embeddings: list[str | Path] | None = None,
    format: str | None = None,
    factory: str = "auto",
    shard_size: int = DEFAULT_SHARD_SIZE,
    bm25: bool = True,
    name: str | None = None,
    root: str | Path | None = None,
    link: str = "auto",
    force: bool = False,
    resume: bool = True,
    chunk_docs: int = CHUNK_DOCS,
    progress: bool = False,
    id_prefix: str = "",
    bm25_engine: str = "bm25s",
    target_recall: float | None = TARGET_RECALL,
    wikipedia_urls: bool = False,
) -> BuildResult:
    """Import a corpus and its vectors as a drgym index (see the module docstring).

    Args:
        corpus: corpus file or folder (wiki-18 JSONL/parquet, or any drgym format).
        encoder: the model that made the vectors (name or local path).
        faiss_index: a FAISS index file whose row ``i`` is document ``i``.
        embeddings: ``.npy`` files of ``(rows, dim)`` vectors, in corpus order.
        format: corpus format; None sniffs (``wiki18`` for ``{"id", "contents"}`` rows).
        factory: FAISS factory for ``embeddings`` (``auto``: :func:`choose_factory`);
            ignored with ``faiss_index``.
        shard_size: rows per dense shard (``embeddings`` only; an imported FAISS index
            is one shard).
        bm25: also build BM25 over the corpus.
        name: index name; None is ``<corpus>--<encoder>--<factory>``.
        root: folder of index folders (default ``$DRGYM_HOME/indexes``).
        link: how the FAISS file enters the index: ``auto`` (hard link, else copy),
            ``hardlink``, ``copy`` or ``symlink`` (the source must then stay).
        force: rebuild even if an identical index exists.
        resume: continue a partial import left by a killed run.
        chunk_docs: documents per unit.
        progress: progress bars.
        id_prefix: put in front of every row id to make the doc_id (``""``, the default:
            the corpus's ids as they are). Only ``wiki18`` and ``web`` rows carry ids of
            their own; other formats keep drgym's doc_ids and refuse a prefix.
        bm25_engine: ``"bm25s"`` (in memory) or ``"fts5"`` (SQLite FTS5 on disk, bounded
            build memory: the one that fits wiki-18 on a 24-64 GB machine).
        target_recall: an IVF index built from ``embeddings`` records the smallest
            ``nprobe`` reaching this recall@10 on its own rows with 95% confidence
            (:mod:`drgym.index.calibrate`); None or 0: a quarter of the lists. An
            imported ``faiss_index`` has no stored rows to measure and is not calibrated.
        wikipedia_urls: the corpus is Wikipedia (Search-R1's wiki-18 is): ``wiki18`` and
            ``hipporag`` rows without a ``url`` get the Wikipedia URL of their title.
            False (default): no URL is made up; such a row is shown and fetched as
            ``drgym://doc/<doc_id>``.

    Returns:
        A :class:`~drgym.index.build.BuildResult`.

    Raises:
        ConfigError: not exactly one of ``faiss_index``/``embeddings``; an index that
            is not inner product; dimensions that disagree; bad ``link``; an
            ``id_prefix`` for a corpus format without row ids.
        CorpusError: unreadable corpus, or a corpus whose row count differs from the
            vectors'.
    """
    from drgym.paths import indexes_dir

    t0 = time.perf_counter()
    if (faiss_index is None) == (not embeddings):
        raise ConfigError("give exactly one of faiss_index= (a FAISS index file) or embeddings= (.npy files).")
    if link not in LINK_MODES:
        raise ConfigError(f"link must be one of {LINK_MODES}, got {link!r}.")
    root = Path(root) if root is not None else indexes_dir()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    units, sources, label = plan_units(str(corpus), format, chunk_docs=chunk_docs)
    units = with_wikipedia_urls(_with_id_prefix(units, id_prefix), wikipedia_urls)
    known_rows = sum(u.n_docs for u in units) if all(u.n_docs >= 0 for u in units) else None
    timings["plan"] = time.perf_counter() - t
    enc = encoder_info(encoder)

    if faiss_index is not None:
        import faiss

        fpath = Path(faiss_index).expanduser().resolve()
        if not fpath.is_file():
            raise ConfigError(f"No FAISS index file at {fpath}.")
        try:
            index = faiss.read_index(str(fpath), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError as e:
            raise ConfigError(f"{fpath} is not a readable FAISS index ({str(e).splitlines()[-1]}).") from e
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ConfigError(f"FAISS index {fpath} uses metric {index.metric_type} (L2 = 1); drgym ranks by inner "
                              "product (cosine on unit vectors): rebuild it with METRIC_INNER_PRODUCT or import its "
                              "vectors as .npy files.")
        n_vec, dim, factory = int(index.ntotal), int(index.d), describe_faiss(index)
        norms = _sample_norms(index=index)
        del index
        vec_sources = [source_stat(fpath, "faiss")]
        arrays = None
    else:
        paths = [Path(p).expanduser().resolve() for p in embeddings]
        arrays = []
        for p in paths:
            try:
                a = np.load(p, mmap_mode="r")
            except (OSError, ValueError) as e:
                raise ConfigError(f"{p} is not a readable .npy file ({e}).") from e
            if a.ndim != 2 or a.dtype not in (np.float16, np.float32):
                raise ConfigError(f"{p} holds {a.dtype} of shape {a.shape}; expected float32 or float16 (rows, dim).")
            arrays.append(a)
        dims = {a.shape[1] for a in arrays}
        if len(dims) != 1:
            raise ConfigError(f"the .npy files have different dimensions: {sorted(dims)}.")
        n_vec, dim = sum(len(a) for a in arrays), dims.pop()
        if factory == "auto":
            factory = choose_factory(n_vec, dim, shard_size)
        from drgym.index.faiss_build import new_faiss_index

        new_faiss_index(dim, factory)
        norms = _sample_norms(arrays=arrays)
        vec_sources = [source_stat(p, "embeddings") for p in paths]
    if enc.dim and enc.dim != dim:
        raise ConfigError(f"encoder {enc.name} gives {enc.dim}-d vectors, the imported vectors are {dim}-d; "
                          "name the encoder that made them.")
    if known_rows is not None and known_rows != n_vec:
        raise CorpusError(f"corpus {label} has {known_rows:,} rows, the vectors {n_vec:,}: row i of the vectors must "
                          "be row i of the corpus.")
    normalized = bool(norms is not None and np.allclose(norms, 1.0, atol=1e-2))
    if norms is not None and not normalized:
        log.warning("imported vectors are not unit-norm (sampled norms %.3f..%.3f): scores are raw inner products, "
                    "not cosines", float(norms.min()), float(norms.max()))

    spec = IndexSpec(corpus=str(corpus), format=format, encoder=encoder, factory=factory, shard_size=shard_size,
                     max_tokens=0, overlap=0, bm25=bm25, name=name, chunk_docs=chunk_docs, bm25_engine=bm25_engine,
                     target_recall=target_recall)
    planned = planned_manifest(spec, label, "", sources + vec_sources, _EncoderView(enc, dim))
    planned.normalized = normalized
    planned.chunking = {"max_tokens": 0, "overlap": 0, "tokenizer": "", "encoder_max_length": enc.max_length,
                        "imported": "faiss" if faiss_index is not None else "npy", "id_prefix": id_prefix,
                        "urls": "wikipedia" if wikipedia_urls else "corpus"}
    existing = reusable_index(root / planned.name, planned, force)  # before the lock: read-only disks work
    if existing is not None:
        return BuildResult(root / planned.name, existing, False, time.perf_counter() - t0)
    with build_lock(root, planned.name, announce=(lambda m: print(m, flush=True)) if progress else None):
        existing = reusable_index(root / planned.name, planned, force)
        if existing is not None:
            return BuildResult(root / planned.name, existing, False, time.perf_counter() - t0)
        state = {"identity": planned.identity(), "sources": source_key(planned.sources), "chunk_docs": chunk_docs,
                 "units": len(units), "import": True}
        planned.sources = sources  # the vector files are added back by the dense step

        def dense(bdir: Path, n: int) -> tuple[list[ShardInfo], list[dict]]:
            if n != n_vec:
                raise CorpusError(f"corpus {label} has {n:,} rows, the vectors {n_vec:,}: row i of the vectors must be "
                                  "row i of the corpus.")
            if faiss_index is not None:
                mode = _place(fpath, bdir / "dense" / "faiss-00000.index", link)
                log.info("FAISS index %s placed by %s", fpath, mode)
                return [ShardInfo(embeddings="", faiss="dense/faiss-00000.index", start=0, count=n)], \
                    [{**vec_sources[0], "link": mode}]
            parts, start = [], 0
            for p, a in zip(paths, arrays):
                parts.append((str(p), start, len(a)))
                start += len(a)
            tasks = shard_tasks(bdir, n, shard_size, parts, dim, factory)
            return LocalRunner().build_shards(tasks, progress=progress), vec_sources

        manifest, resumed = build_into_place(root, planned, state, units, BuildContext(None, 0, 0, None, progress),
                                             LocalRunner(), timings, bm25=bm25, resume=resume, dense=dense)
    return BuildResult(root / planned.name, manifest, True, time.perf_counter() - t0, resumed)


def _with_id_prefix(units: list, id_prefix: str) -> list:
    """``units`` reading their rows' ids behind ``id_prefix`` (formats with row ids).

    Raises:
        ConfigError: a non-empty ``id_prefix`` for units of a format without row ids.
    """
    from dataclasses import replace

    from drgym.corpus.readers import ID_PREFIX_FORMATS

    if not isinstance(id_prefix, str):
        raise ConfigError(f"id_prefix must be a string, got {type(id_prefix).__name__}.")
    other = sorted({u.format or u.kind for u in units if u.format not in ID_PREFIX_FORMATS})
    if id_prefix and other:
        raise ConfigError(f"--id-prefix applies to {' and '.join(ID_PREFIX_FORMATS)} corpora, whose rows carry "
                          f"ids; this corpus is {', '.join(other)}.")
    return [replace(u, id_prefix=id_prefix) if u.format in ID_PREFIX_FORMATS else u for u in units]


class _EncoderView:
    """The attributes :func:`planned_manifest` reads, from an :class:`EncoderInfo`."""

    def __init__(self, info: EncoderInfo, dim: int) -> None:
        self.name, self.revision, self.dim, self.max_length = info.name, info.revision, dim, info.max_length
