"""The index manifest: ``manifest.json``, what an index was built from and of.

An index folder holds ``manifest.json`` plus the files it lists, each with its size and
two BLAKE2b checksums (:func:`record_checksums`): the hash of the whole file, and the
hash of a fixed sample of it (the whole file up to :data:`SAMPLE_WHOLE_MAX` bytes, else
:data:`SAMPLE_BLOCKS` blocks of :data:`SAMPLE_BLOCK` bytes spread evenly over it). A
loaded index checks every size and the sampled hashes (``mode="sample"``, a few ms to
~0.1 s for wiki-default); ``drgym index verify`` and ``verify=True`` check the full
hashes. Manifests written before checksums existed still load, with sizes checked only
(logged once per index).

Two builds with the same *identity* (everything but timings, creation time, file sizes
and checksums) are interchangeable, so a build whose identity matches the manifest on
disk is skipped.
"""

from __future__ import annotations

import contextlib
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
        """Write ``folder/manifest.json`` atomically."""
        from drgym.atomic import atomic_write_json

        if not self.created:
            self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        atomic_write_json(Path(folder) / MANIFEST, self.to_dict())

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
        version = data.get("format_version", FORMAT_VERSION)
        if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
            from drgym import __version__

            raise IndexMismatchError(
                f"{path} is index format {version}, written by a newer drgym ({data.get('drgym_version', '?')}); "
                f"drgym {__version__} reads format {FORMAT_VERSION}: upgrade drgym (pip install -U drgym), or "
                "rebuild the index with this version (drgym index build --force).")
        return cls.from_dict(data)

    def file_problems(self, folder: str | Path, mode: str = "sample") -> list[tuple[str, str]]:
        """Every listed file that is missing, has another size, or (``mode`` ``"sample"``
        or ``"full"``) another checksum than the manifest records.

        Args:
            folder: the index folder.
            mode: one of :data:`VERIFY_MODES`.

        Returns:
            ``[(relative path, problem)]`` in path order; empty when all is well. A
            manifest without checksums (format < 3) is checked by size only.

        Raises:
            ConfigError: an unknown ``mode``.
        """
        if mode not in VERIFY_MODES:
            from drgym.errors import ConfigError

            raise ConfigError(f"verify mode must be one of {VERIFY_MODES}, got {mode!r}.")
        folder = Path(folder)
        if not isinstance(self.checksums, dict) or not isinstance(self.checksums.get("files", {}), dict):
            return [(MANIFEST, "has a malformed checksums field (not a JSON object)")]
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
