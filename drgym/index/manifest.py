"""The index manifest: ``manifest.json``, what an index was built from and of.

An index folder holds ``manifest.json`` plus the files it lists (sizes recorded, so a
truncated file is caught at load time). Two builds with the same *identity* (everything
but timings, creation time and file sizes) are interchangeable, so a build whose
identity matches the manifest on disk is skipped.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from drgym.errors import CorruptIndexError, IndexMismatchError, IndexNotFoundError

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
"""Bumped when the on-disk layout changes (older indexes are then rebuilt). 2: a passage
that is its whole document stores ``''`` in the docstore (see :mod:`drgym.docstore`)."""

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
        timings: seconds spent per build stage.
        sources: input files read from disk, ``{"path", "bytes", "mtime_ns", "role"}``
            (role ``corpus``, ``faiss`` or ``embeddings``); empty for named corpora. A
            file corpus whose sources are unchanged is not re-read to decide reuse.
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
    timings: dict[str, float] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)

    # Fields that describe a particular build rather than what was built.
    VOLATILE = ("created", "files", "timings", "shards", "n_documents", "n_passages")

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

    def check_files(self, folder: str | Path) -> None:
        """Check that every listed file exists with its recorded size.

        Raises:
            CorruptIndexError: a file is missing or has another size (truncated or
                overwritten), naming the file, both sizes and the fix.
        """
        folder = Path(folder)
        for rel, size in self.files.items():
            p = folder / rel
            if not p.exists():
                raise CorruptIndexError(f"Index file {p} is missing; rebuild the index (drgym index build --force).")
            actual = p.stat().st_size
            if actual != size:
                raise CorruptIndexError(
                    f"Index file {p} has {actual} bytes, the manifest says {size} (truncated or overwritten); "
                    "rebuild the index (drgym index build --force)."
                )

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


def record_files(folder: Path) -> dict[str, int]:
    """Sizes of every file under ``folder`` by relative path, except the manifest and
    SQLite's transient ``-wal``/``-shm`` files."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(("-wal", "-shm", ".lock")):
            out[p.relative_to(folder).as_posix()] = p.stat().st_size
    return out
