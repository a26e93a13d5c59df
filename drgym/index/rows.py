"""Stored rows of dense shards: the memory-mapped float16 embedding files.

An index folder keeps each shard's vectors in ``dense/emb-%05d.npy`` (float16
``(count, dim)``, unit rows, under :data:`DENSE_DIR`), memory-mapped at load and read at
random by the exact re-rank (:func:`advise_random`). A build assembles them from the
embedding parts it computed (``(npy path, first global row, rows)``, float16 or float32):
:func:`copy_rows` copies a shard's rows :data:`ADD_BATCH` at a time, and
:func:`read_rows` reads a training sample as the shards store it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from drgym.errors import CorruptIndexError
from drgym.index.prealloc import open_memmap

log = logging.getLogger(__name__)

DENSE_DIR = "dense"


ADD_BATCH = 262_144
"""Rows converted to float32 and added to a FAISS index at a time (384-d: 403 MB)."""


def advise_random(arr: np.ndarray) -> bool:
    """Tell the kernel that a memory-mapped array's rows are read at random
    (``madvise(MADV_RANDOM)``), so that a page fault reads its page and not the file's
    read-ahead window around it.

    The exact re-rank reads a few hundred scattered float16 rows a query. Without the
    advice, Linux reads ahead around each faulting page (up to ``read_ahead_kb``, 8 MiB on
    the benchmark machine's disk): where the embeddings are not in the page cache, a row
    missed costs far more I/O than its 768 bytes and pushes other pages out. Measured at
    wiki-18 size (2.1x10^7 rows, 16 GB of float16 rows, 200 queries from an empty page
    cache): 381 MB read with the advice against 15.5 GB without, mean 24-29 against 62-72
    ms a query (``scripts/bench_madvise.py``, ``scripts/results/bench_madvise_wiki18.json``).

    Returns:
        True when the advice was given; False for an array that is not memory-mapped, a
        platform without ``MADV_RANDOM`` (macOS has it, Windows not), or a kernel that
        refused it (logged at debug level).
    """
    import mmap

    mm = getattr(arr, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_RANDOM"):
        return False
    try:
        mm.madvise(mmap.MADV_RANDOM)
    except OSError as e:  # advice only: searching works without it, as before
        log.debug("madvise(MADV_RANDOM) refused for a memory-mapped array: %s", e)
        return False
    return True


def _open_part(path, rows: int, dim: int) -> np.ndarray:
    """An embedding part, memory-mapped; CorruptIndexError unless it is ``(rows, dim)``."""
    src = np.load(path, mmap_mode="r")
    if src.ndim != 2 or src.shape[1] != dim or len(src) != rows:
        raise CorruptIndexError(f"Embedding part {path} has shape {src.shape}, expected ({rows}, {dim}).")
    return src


def read_rows(parts, rows: np.ndarray, dim: int) -> np.ndarray:
    """Rows of an index's embedding parts, as float32 rounded through float16 (the
    values the shards store), so that training sees what search scores.

    Args:
        parts: ``(npy path, first global row, rows)`` in row order, float16 or float32
            ``(rows, dim)`` arrays (memory-mapped).
        rows: int64 sorted global rows.
        dim: embedding dimension.

    Returns:
        float32 ``(len(rows), dim)``.

    Raises:
        CorruptIndexError: a part has another shape than announced, or ``rows`` are not
            all covered by the parts.
    """
    out = np.empty((len(rows), dim), dtype=np.float32)
    done = 0
    for path, p0, pn in parts:
        a, b = np.searchsorted(rows, [p0, p0 + pn])
        if a == b:
            continue
        src = _open_part(path, pn, dim)
        out[a:b] = np.asarray(src[rows[a:b] - p0]).astype(np.float16)
        done += b - a
        del src
    if done != len(rows):
        raise CorruptIndexError(f"Embedding parts cover {done} of the {len(rows)} training rows asked for.")
    return out


def copy_rows(dest: Path, start: int, count: int, parts, dim: int) -> None:
    """Write rows ``[start, start + count)`` of the parts to ``dest`` as float16 (via a
    temporary file renamed into place)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    out = open_memmap(tmp, np.float16, (count, dim))  # disk space reserved: a full disk is ENOSPC, not SIGBUS
    stop = start + count
    for path, p0, pn in parts:
        a, b = max(start, p0), min(stop, p0 + pn)
        if a >= b:
            continue
        src = _open_part(path, pn, dim)
        for c in range(a, b, ADD_BATCH):
            e = min(b, c + ADD_BATCH)
            out[c - start : e - start] = src[c - p0 : e - p0]
        del src
    out.flush()
    del out
    os.replace(tmp, dest)
