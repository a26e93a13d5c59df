"""The index manifest: ``manifest.json``, what an index was built from and of.

An index folder holds ``manifest.json`` plus the files it lists, each with its size and
two BLAKE2b checksums (:func:`record_checksums`): the hash of the whole file, and the
hash of a fixed sample of it (the whole file up to :data:`SAMPLE_WHOLE_MAX` bytes, else
:data:`SAMPLE_BLOCKS` blocks of :data:`SAMPLE_BLOCK` bytes spread evenly over it). A
loaded index checks every size and the sampled hashes (``mode="sample"``, a few ms to
~0.1 s for wiki-default); ``drgym index verify`` and ``verify=True`` check the full
hashes. Manifests written before checksums existed (format < 3) still load, with sizes
checked only (logged once per index); a format-3 manifest without its ``checksums``, or
without the entry of one of its files, is corrupt.

The manifest protects itself too: ``checksums["manifest"]`` is the hash of every other
field (:func:`manifest_digest`), written by :meth:`IndexManifest.write`, and the shard
layout must cover rows ``0..n_passages-1`` in order (:meth:`IndexManifest.layout_problems`).
An edited field (a shard's ``start``, ``n_passages``, the encoder...) would otherwise
move every dense hit to another document with the same score; load and
``drgym index verify`` refuse it, naming the field. A manifest written before this hash
existed loads, and ``drgym index verify`` says that its fields are not protected.

Two builds with the same *identity* (everything but timings, creation time, file sizes
and checksums) are interchangeable, so a build whose identity matches the manifest on
disk is skipped.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drgym.errors import CorruptIndexError, IndexMismatchError, IndexNotFoundError, IndexReplacedError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT_VERSION = 3
"""Bumped when the on-disk layout changes (older indexes are then rebuilt by
``drgym index build``; they still load). 2: a passage that is its whole document stores
``''`` in the docstore (see :mod:`drgym.docstore`). 3: file checksums in the manifest,
and BM25 tokens with CJK character bigrams (:data:`drgym.index.bm25.TOKENIZER`)."""

CHECKSUM_ALGORITHM = "blake2b-128"
"""Hash of the recorded checksums: ``hashlib.blake2b(digest_size=16)`` (stdlib; about
0.8 GB/s on one core of the 2-core test machine)."""

SAMPLE_BLOCK = 1 << 16
"""Bytes per sampled block (64 KiB)."""

SAMPLE_BLOCKS = 16
"""Blocks in the sampled hash of a file larger than :data:`SAMPLE_WHOLE_MAX`: the first,
the last and 14 between them, evenly spaced (1 MiB read per file)."""

SAMPLE_WHOLE_MAX = 64 << 20
"""Files up to this size (64 MiB) are hashed whole by the sampled check too: every file
of wiki-default's index is (79 MB in all, about 0.1 s), so a garbled block anywhere in
them is caught at load time; larger files are sampled."""

VERIFY_MODES = ("size", "sample", "full")
"""What :meth:`IndexManifest.check_files` checks: sizes only; sizes and sampled hashes
(the default at load time); sizes and full hashes (``drgym index verify``)."""

_HASH_CHUNK = 1 << 20
_warned_unchecked: set[str] = set()
_warned_lock = threading.Lock()

UNKNOWN_REVISION = "unknown"
"""``encoder_revision`` of an imported index whose encoder weights were not found
locally: the revision is then not checked when the index is loaded."""


@dataclass
class ShardInfo:
    """One dense shard: rows ``[start, start + count)`` of the passage table.

    Attributes:
        embeddings: file name of the float16 ``(count, dim)`` ``.npy`` matrix; ``""`` for
            an imported FAISS index that came without vectors.
        faiss: file name of the FAISS index over those rows (ids local to the shard).
        start: first global row.
        count: number of rows.
    """

    embeddings: str
    faiss: str
    start: int
    count: int


@dataclass
class IndexManifest:
    """Contents of ``manifest.json``.

    Attributes:
        name: index name (the folder name under ``indexes_dir()``).
        corpus: corpus name or path it was built from.
        corpus_fingerprint: :func:`drgym.corpus.corpus_fingerprint` of the documents.
        n_documents: documents in the docstore.
        n_passages: passages (rows of the dense and BM25 indexes).
        encoder: canonical encoder name (e.g. ``"all-MiniLM-L6-v2"``).
        encoder_revision: content hash of the encoder weights.
        dim: embedding dimension.
        metric: ``"inner_product"`` (vectors are unit-normalised, so this is cosine).
        normalized: True when passage vectors have unit L2 norm.
        factory: FAISS ``index_factory`` string (``"Flat"``, ``"HNSW32"``, ``"IVF256,PQ32"``...).
        chunking: ``{"max_tokens", "overlap", "tokenizer"}`` used to split documents.
        shard_size: maximum rows per dense shard.
        shards: the dense shards in row order.
        bm25: BM25 settings and folder, or None when no BM25 index was built.
        drgym_version: drgym version that built it.
        format_version: on-disk layout version (:data:`FORMAT_VERSION`).
        created: UTC creation time (ISO 8601).
        files: ``{relative path: size in bytes}`` of every file of the index.
        checksums: ``{"algorithm", "sample": {"block_bytes", "blocks", "whole_max_bytes"},
            "files": {relative path: {"full", "sample"}}}`` (hex digests,
            :func:`record_checksums`); empty in manifests written before format 3.
        timings: seconds spent per build stage.
        sources: input files read from disk, ``{"path", "bytes", "mtime_ns", "role"}``
            (role ``corpus``, ``faiss`` or ``embeddings``); empty for named corpora. A
            file corpus whose sources are unchanged is not re-read to decide reuse.
        calibration: an IVF index's ``nprobe`` measured on its own rows
            (:func:`drgym.index.calibrate.calibrate_nprobe`): ``{"search_params":
            {"nprobe": int}, "target_recall", "recall", "curve", ...}``; empty when not
            measured (other index kinds, imported FAISS indexes, older manifests).
    """

    name: str
    corpus: str
    corpus_fingerprint: str
    n_documents: int
    n_passages: int
    encoder: str
    encoder_revision: str
    dim: int
    metric: str
    normalized: bool
    factory: str
    chunking: dict[str, Any]
    shard_size: int
    shards: list[ShardInfo]
    bm25: dict[str, Any] | None
    drgym_version: str
    format_version: int = FORMAT_VERSION
    created: str = ""
    files: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)

    # Fields that describe a particular build rather than what was built.
    VOLATILE = ("created", "files", "checksums", "timings", "shards", "n_documents", "n_passages", "calibration")

    @property
    def search_defaults(self) -> dict[str, int]:
        """Search parameters measured for this index (``calibration["search_params"]``,
        e.g. ``{"nprobe": 448}``), under any the caller gives; empty when not measured.

        Raises:
            CorruptIndexError: a recorded parameter that is not an integer >= 1.
        """
        params = (self.calibration or {}).get("search_params") or {}
        if not isinstance(params, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                   for v in params.values()):
            raise CorruptIndexError(f"Index manifest {self.name!r} has a malformed calibration "
                                    f"(search_params {params!r}); run `drgym index calibrate {self.name}`.")
        return dict(params)

    def identity(self) -> dict[str, Any]:
        """The manifest without build-specific fields (see :attr:`VOLATILE`): equal
        identities mean an index need not be rebuilt."""
        d = self.to_dict()
        for k in self.VOLATILE:
            d.pop(k, None)
        return d

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "IndexManifest":
        """Inverse of :meth:`to_dict`.

        Raises:
            CorruptIndexError: fields are missing or of the wrong type.
        """
        try:
            d = dict(d)
            d["shards"] = [ShardInfo(**s) for s in d["shards"]]
            return cls(**d)
        except (KeyError, TypeError) as e:
            raise CorruptIndexError(f"Index manifest has missing or unknown fields ({e}).") from e

    def write(self, folder: Path) -> None:
        """Write ``folder/manifest.json`` atomically; a manifest with file checksums also
        records the hash of its own fields (``checksums["manifest"]``, :func:`manifest_digest`).

        Raises:
            CorruptIndexError: the shard layout is broken (:meth:`layout_problems`), or
                this manifest was read from a file whose fields fail their recorded hash
                (writing it would record a hash of the edited fields).
        """
        from drgym.atomic import atomic_write_json

        if not self.created:
            self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        problems = self.layout_problems()
        if problems:
            raise CorruptIndexError(f"Refusing to write manifest {self.name!r}: it {problems[0]}.")
        raw = getattr(self, "_raw", None)
        want = raw.get("checksums", {}).get("manifest") if isinstance(raw, dict) and isinstance(raw.get("checksums"), dict) else None
        if want and manifest_digest(raw) != want:  # rewriting it would bless the edit
            raise CorruptIndexError(f"Refusing to rewrite manifest {self.name!r} in {folder}: the manifest read there has "
                                    "fields that were changed after the build (their hash differs from the recorded one); "
                                    "rebuild the index (drgym index build --force).")
        if isinstance(self.checksums, dict) and self.checksums.get("files"):
            self.checksums = {k: v for k, v in self.checksums.items() if k != "manifest"}
            self.checksums["manifest"] = manifest_digest(json.loads(json.dumps(self.to_dict())))
        atomic_write_json(Path(folder) / MANIFEST, self.to_dict())
        self._raw = json.loads(json.dumps(self.to_dict()))  # what the file now holds

    @classmethod
    def read(cls, folder: str | Path) -> "IndexManifest":
        """Read ``folder/manifest.json``.

        Raises:
            IndexNotFoundError: no manifest in ``folder``.
            CorruptIndexError: the manifest is not valid JSON or lacks fields.
            IndexMismatchError: a newer ``format_version`` than :data:`FORMAT_VERSION`
                (written by a newer drgym); the message says to upgrade or rebuild.
        """
        path = Path(folder) / MANIFEST
        if not path.exists():
            raise IndexNotFoundError(f"No index at {folder} (no {MANIFEST}); build one with `drgym index build`.")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptIndexError(f"{path} is not valid JSON ({e}); rebuild the index.") from e
        if not isinstance(data, dict):
            raise CorruptIndexError(f"{path} must hold a JSON object, got {type(data).__name__}.")
        if "format_version" not in data:  # a manifest without it would pass for the newest format
            raise CorruptIndexError(f"{path} has no format_version field; the manifest was edited or truncated: "
                                    "rebuild the index (drgym index build --force).")
        version = data.get("format_version", FORMAT_VERSION)
        if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
            from drgym import __version__

            raise IndexMismatchError(
                f"{path} is index format {version}, written by a newer drgym ({data.get('drgym_version', '?')}); "
                f"drgym {__version__} reads format {FORMAT_VERSION}: upgrade drgym (pip install -U drgym), or "
                "rebuild the index with this version (drgym index build --force).")
        m = cls.from_dict(copy.deepcopy(data))  # the manifest's dicts are its own: editing them leaves data as read
        m._raw = data  # what the file holds: the digest of its fields is checked on it
        return m

    def layout_problems(self) -> list[str]:
        """What is wrong with the counts and the dense shard layout, as phrases that
        follow "the manifest": ``n_passages`` and ``n_documents`` integers >= 0, ``dim``
        >= 1, and the shards in row order covering rows ``0..n_passages-1`` once each
        (each ``start`` where the previous shard ends, the first at 0, every ``count`` >= 1,
        the counts summing to ``n_passages``), each shard's files listed in ``files``.

        Returns:
            Phrases such as ``"has shards[0].start 5, expected 0 ..."``; empty when all is well.
        """
        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        out = []
        for name in ("n_passages", "n_documents"):
            v = getattr(self, name)
            if not is_int(v) or v < 0:
                out.append(f"has {name} {v!r}, not an integer >= 0")
        if not is_int(self.dim) or self.dim < 1:
            out.append(f"has dim {self.dim!r}, not an integer >= 1")
        if out:
            return out
        if not isinstance(self.shards, list) or (self.n_passages > 0 and not self.shards):
            return [f"lists no dense shards for its {self.n_passages} passages"]
        row = 0
        for i, sh in enumerate(self.shards):
            if not is_int(sh.start) or not is_int(sh.count) or sh.count < 1:
                out.append(f"has shards[{i}] start {sh.start!r} count {sh.count!r}, not integers with count >= 1")
                return out
            if sh.start != row:
                where = "row 0" if i == 0 else f"row {row}, where shards[{i - 1}] ends"
                what = "a gap" if sh.start > row else "an overlap"
                out.append(f"has shards[{i}].start {sh.start}, expected {where} ({what}: the shards must cover rows "
                           f"0..n_passages-1 in order, each once)")
                return out
            row += sh.count
            for kind in ("faiss", "embeddings"):
                f = getattr(sh, kind)
                if (f or kind == "faiss") and isinstance(self.files, dict) and self.files and f not in self.files:
                    out.append(f"has shards[{i}].{kind} {f!r}, a file it does not list among its files")
        if row != self.n_passages:
            out.append(f"has shards whose counts sum to {row} rows, but n_passages {self.n_passages}")
        return out

    def manifest_problems(self, raw: dict[str, Any] | None = None) -> list[tuple[str, str]]:
        """What is wrong with the manifest itself: a broken shard layout
        (:meth:`layout_problems`); for format 3 and later (which always records
        checksums), a missing ``checksums`` section, a listed file without its checksum
        entry or an entry for an unlisted file, and fields that no longer match
        ``checksums["manifest"]`` (:func:`manifest_digest`).

        Args:
            raw: the manifest as read from JSON (default: :meth:`to_dict`).

        Returns:
            ``[(relative path, problem)]``: :data:`MANIFEST` or the file concerned.
        """
        out = [(MANIFEST, p) for p in self.layout_problems()]
        if not isinstance(self.checksums, dict) or not isinstance(self.checksums.get("files", {}), dict):
            return out + [(MANIFEST, "has a malformed checksums field (not a JSON object)")]
        if not isinstance(self.format_version, int) or self.format_version < 3:
            return out
        sums = self.checksums.get("files") or {}
        if not sums:
            return out + [(MANIFEST, f"has no checksums section, which index format {self.format_version} always "
                                     "writes (the manifest was edited or truncated)")]
        for rel in sorted(set(self.files) - set(sums)):
            out.append((rel, f"has no checksum entry in the manifest, which index format {self.format_version} "
                             "records for every file (the manifest was edited)"))
        for rel in sorted(set(sums) - set(self.files)):
            out.append((rel, "has a checksum entry in the manifest but is not among its files (the manifest was edited)"))
        want = self.checksums.get("manifest")
        if want is not None:
            got = manifest_digest(raw if raw is not None else json.loads(json.dumps(self.to_dict())))
            if got != want:
                out.append((MANIFEST, "has fields that were changed after the build: their "
                                      f"{CHECKSUM_ALGORITHM} hash is {got[:12]}..., the manifest says {str(want)[:12]}..."))
        return out

    def serving_fingerprint(self) -> str:
        """What processes that serve parts of one index compare, so that none serves a part
        of another build (a replica restarted after ``drgym index build --force``): hex
        BLAKE2b-128 of the build's creation time, corpus fingerprint, row count, shard
        layout and the recorded full hashes of its files (sizes for a manifest without
        checksums). Two builds of the same corpus differ by it, even in the same second,
        unless their files are identical too."""
        sums = self.checksums.get("files", {}) if isinstance(self.checksums, dict) else {}
        body = {"created": self.created, "corpus": self.corpus_fingerprint, "n_passages": self.n_passages,
                "shards": [[s.start, s.count, s.faiss, s.embeddings] for s in self.shards],
                "files": {k: (v.get("full") if isinstance(v, dict) else v) for k, v in sums.items()} or self.files}
        h = _hasher()
        h.update(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        return h.hexdigest()

    @property
    def fields_protected(self) -> bool:
        """Whether the manifest records the hash of its own fields (written by this
        drgym; older manifests load without it, unprotected)."""
        return isinstance(self.checksums, dict) and bool(self.checksums.get("manifest"))

    def file_problems(self, folder: str | Path, mode: str = "sample") -> list[tuple[str, str]]:
        """Every listed file that is missing, has another size, or (``mode`` ``"sample"``
        or ``"full"``) another checksum than the manifest records.

        Args:
            folder: the index folder.
            mode: one of :data:`VERIFY_MODES`.

        Returns:
            ``[(relative path, problem)]``: first the manifest's own problems
            (:meth:`manifest_problems`; when there are any, the files are not checked
            against it), else the bad files in path order; empty when all is well. A
            manifest without checksums (format < 3) is checked by size only.

        Raises:
            ConfigError: an unknown ``mode``.
        """
        if mode not in VERIFY_MODES:
            from drgym.errors import ConfigError

            raise ConfigError(f"verify mode must be one of {VERIFY_MODES}, got {mode!r}.")
        folder = Path(folder)
        own = self.manifest_problems(getattr(self, "_raw", None))
        if own:  # the listed sizes and checksums cannot be trusted
            return own
        sums = self.checksums.get("files", {}) if mode != "size" else {}
        if mode != "size" and not sums:
            key = str(folder.resolve())
            with _warned_lock:
                first = key not in _warned_unchecked
                _warned_unchecked.add(key)
            if first:
                log.warning("index %s has no checksums (manifest format %s, written by drgym %s): only file sizes are "
                            "checked; rebuild it (drgym index build --force) to record them",
                            folder, self.format_version, self.drgym_version)
        elif mode != "size" and self.checksums.get("algorithm") != CHECKSUM_ALGORITHM:
            return [(MANIFEST, f"checksum algorithm {self.checksums.get('algorithm')!r} is unknown to this drgym "
                               f"(it reads {CHECKSUM_ALGORITHM!r})")]
        params = self.checksums.get("sample", {})
        out = []
        for rel, size in sorted(self.files.items()):
            p = folder / rel
            if not p.is_file():
                out.append((rel, "is missing"))
                continue
            actual = p.stat().st_size
            if actual != size:
                out.append((rel, f"has {actual} bytes, the manifest says {size} (truncated or overwritten)"))
                continue
            want = sums.get(rel)
            if not want:
                continue
            try:
                got = full_hash(p) if mode == "full" else sample_hash(p, size, **_sample_params(params))
            except OSError as e:
                out.append((rel, f"cannot be read ({e.strerror or e})"))
                continue
            if got != want.get(mode):
                what = "full" if mode == "full" else "sampled"
                out.append((rel, f"is unreadable: it has the recorded size but another content ({what} "
                                 f"{CHECKSUM_ALGORITHM} hash {got[:12]}..., the manifest says "
                                 f"{str(want.get(mode))[:12]}...)"))
        return out

    def check_files(self, folder: str | Path, mode: str = "sample") -> None:
        """Check that every listed file exists with its recorded size and, unless
        ``mode="size"``, its recorded checksum (sampled, or ``mode="full"``).

        Raises:
            CorruptIndexError: the first bad file (missing, other size, other content),
                named in one line with the fix (``drgym index verify`` / ``build --force``).
            ConfigError: an unknown ``mode``.
        """
        problems = self.file_problems(folder, mode)
        if problems:
            rel, problem = problems[0]
            more = f" ({len(problems) - 1} more bad file(s))" if len(problems) > 1 else ""
            raise corrupt_file_error(Path(folder) / rel, problem + more, folder)

    def check_encoder(self, encoder: str, revision: str | None = None, dim: int | None = None) -> None:
        """Refuse an encoder other than the one the index was built with.

        Raises:
            IndexMismatchError: name, revision or dimension differ (both values named).
        """
        if encoder != self.encoder:
            raise IndexMismatchError(
                f"Index {self.name!r} was built with encoder {self.encoder!r}, but encoder {encoder!r} was given; "
                f"use encoder={self.encoder!r} or rebuild the index with the new encoder."
            )
        if revision is not None and self.encoder_revision != UNKNOWN_REVISION and revision != self.encoder_revision:
            raise IndexMismatchError(
                f"Index {self.name!r} was built with {self.encoder} revision {self.encoder_revision!r}, "
                f"but the loaded weights are revision {revision!r}; rebuild the index."
            )
        if dim is not None and dim != self.dim:
            raise IndexMismatchError(f"Index {self.name!r} has dimension {self.dim}, the encoder gives {dim}.")


def index_ref(folder: str | Path) -> str:
    """How ``drgym index`` commands name the index at ``folder``: its name when it lies in
    :func:`drgym.paths.indexes_dir`, else its path."""
    from drgym.paths import indexes_dir

    folder = Path(folder)
    try:
        if folder.resolve().parent == indexes_dir().resolve():
            return folder.name
    except OSError:
        pass
    return str(folder)


def corrupt_file_error(path: str | Path, problem: str, folder: str | Path | None = None) -> CorruptIndexError:
    """A one-line :class:`CorruptIndexError` for a bad index file: the file, what is
    wrong, and the fix.

    Args:
        path: the bad file.
        problem: what is wrong, a phrase that follows the path, e.g. ``"is missing"`` or
            ``"is unreadable (FAISS: ...)"``; made one line.
        folder: the index folder (default: found from ``path``, the folder holding a
            ``manifest.json`` nearest above it).
    """
    path = Path(path)
    if folder is None:
        folder = next((d for d in path.parents if (d / MANIFEST).exists()), path.parent)
    ref = index_ref(folder)
    problem = " ".join(str(problem).split())  # one line, whatever the library said
    return CorruptIndexError(f"Index file {path} {problem}; the index is corrupt: rebuild the index with "
                             f"`drgym index build --force` (`drgym index verify {ref}` lists every bad file).")


def _sample_params(params: dict[str, Any]) -> dict[str, int]:
    return {"block": int(params.get("block_bytes", SAMPLE_BLOCK)), "blocks": int(params.get("blocks", SAMPLE_BLOCKS)),
            "whole_max": int(params.get("whole_max_bytes", SAMPLE_WHOLE_MAX))}


def _hasher():
    return hashlib.blake2b(digest_size=16)


def manifest_digest(fields: dict[str, Any]) -> str:
    """Hex BLAKE2b-128 of a manifest's fields but ``checksums``: their JSON with sorted
    keys and no spaces, UTF-8 (what ``checksums["manifest"]`` records).

    Args:
        fields: the manifest as a JSON-ready dict (as read from ``manifest.json``).
    """
    body = {k: v for k, v in fields.items() if k != "checksums"}
    h = _hasher()
    h.update(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def full_hash(path: str | Path) -> str:
    """Hex BLAKE2b-128 of the whole file (read 1 MiB at a time).

    Raises:
        OSError: the file cannot be read.
    """
    h = _hasher()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sample_ranges(size: int, block: int = SAMPLE_BLOCK, blocks: int = SAMPLE_BLOCKS,
                  whole_max: int = SAMPLE_WHOLE_MAX) -> list[tuple[int, int]]:
    """The ``(offset, length)`` byte ranges that the sampled hash of a ``size``-byte file
    reads: the whole file up to ``whole_max`` bytes, else ``blocks`` blocks of ``block``
    bytes, the first at 0, the last ending at the end, the others evenly between.

    >>> sample_ranges(10)
    [(0, 10)]
    >>> sample_ranges(100 << 20, blocks=3)
    [(0, 65536), (52396032, 65536), (104792064, 65536)]
    """
    if size <= whole_max or size <= block * blocks or blocks < 2:
        return [(0, size)]
    last = size - block
    return [(round(i * last / (blocks - 1)), block) for i in range(blocks)]


def sample_hash(path: str | Path, size: int | None = None, *, block: int = SAMPLE_BLOCK, blocks: int = SAMPLE_BLOCKS,
                whole_max: int = SAMPLE_WHOLE_MAX) -> str:
    """Hex BLAKE2b-128 of the file's :func:`sample_ranges` (the size is hashed too).

    Raises:
        OSError: the file cannot be read.
    """
    size = Path(path).stat().st_size if size is None else int(size)
    h = _hasher()
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        for off, n in sample_ranges(size, block, blocks, whole_max):
            f.seek(off)
            left = n
            while left > 0 and (chunk := f.read(min(left, _HASH_CHUNK))):
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def record_checksums(folder: str | Path, files: dict[str, int]) -> dict[str, Any]:
    """Checksums of the listed files, as :attr:`IndexManifest.checksums` records them:
    one full read of each file (plus 1 MiB for the sample of a large one).

    Args:
        folder: the index (build) folder.
        files: ``{relative path: size}`` (:func:`record_files`).

    Returns:
        ``{"algorithm", "sample": {...}, "files": {relative path: {"full", "sample"}}}``.
    """
    folder = Path(folder)
    out = {}
    for rel, size in sorted(files.items()):
        p = folder / rel
        if sample_ranges(size) == [(0, size)]:  # the sample is the whole file: one read for both
            hf, hs = _hasher(), _hasher()
            hs.update(int(size).to_bytes(8, "little"))
            with open(p, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    hf.update(chunk)
                    hs.update(chunk)
            out[rel] = {"full": hf.hexdigest(), "sample": hs.hexdigest()}
        else:
            out[rel] = {"full": full_hash(p), "sample": sample_hash(p, size)}
    return {"algorithm": CHECKSUM_ALGORITHM,
            "sample": {"block_bytes": SAMPLE_BLOCK, "blocks": SAMPLE_BLOCKS, "whole_max_bytes": SAMPLE_WHOLE_MAX},
            "files": out}


def record_files(folder: Path) -> dict[str, int]:
    """Sizes of every file under ``folder`` by relative path, except the manifest and
    SQLite's transient ``-wal``/``-shm`` files."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(("-wal", "-shm", ".lock")):
            out[p.relative_to(folder).as_posix()] = p.stat().st_size
    return out


class FolderPin:
    """The index folder a process loaded, to tell when another folder was renamed to its
    path (``drgym index build --force`` moves the old folder aside and deletes it).

    The folder is held open (POSIX), so its inode cannot be reused while the pin lives,
    and :meth:`check` compares the device and inode now at the path with the pinned ones.
    A part of an index loaded after the check passes twice (before and after loading it)
    belongs to the pinned folder.

    Args:
        folder: the index folder.

    Raises:
        IndexNotFoundError: no folder at ``folder``.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._fd: int | None = None
        try:
            if os.name == "posix":
                self._fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                st = os.fstat(self._fd)
            else:
                st = os.stat(self.folder)
        except OSError as e:
            raise IndexNotFoundError(f"No index at {self.folder} ({e.strerror or e}).") from e
        self.identity = (st.st_dev, st.st_ino)

    def unchanged(self) -> bool:
        """Whether ``folder`` still names the pinned folder."""
        try:
            st = os.stat(self.folder)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def check(self, doing: str) -> None:
        """Refuse to go on when the folder was replaced.

        Args:
            doing: what the caller was about to do or did, e.g. ``"loading its dense
                index"`` (goes into the message).

        Raises:
            IndexReplacedError: ``folder`` names another folder (or none) now.
        """
        if not self.unchanged():
            raise IndexReplacedError(
                f"Index {self.folder} was replaced on disk (rebuilt or removed) after this process loaded it, "
                f"before {doing}: its parts would come from two indexes. This process keeps serving what it "
                "loaded where it can; restart it (or load the engine again) to serve the new index.")

    def close(self) -> None:
        """Release the folder. Idempotent."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
