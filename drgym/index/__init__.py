"""Indexes: SQLite docstore, sharded FAISS dense index, bm25s BM25, manifest, builder.

    >>> from drgym.index import IndexSpec, build_index
    >>> res = build_index(IndexSpec(corpus="wiki-default", factory="Flat"))
    >>> res.folder, res.built

Heavy libraries (faiss, bm25s, torch) load only when an index is built or opened.
"""

from drgym.index.build import DEFAULT_FACTORY, DEFAULT_SHARD_SIZE, BuildResult, IndexSpec, build_index
from drgym.index.manifest import IndexManifest, ShardInfo

__all__ = ["DEFAULT_FACTORY", "DEFAULT_SHARD_SIZE", "BuildResult", "IndexManifest", "IndexSpec", "ShardInfo", "build_index"]
