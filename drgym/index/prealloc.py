"""Disk space reserved before a file is written through a memory map.

``np.lib.format.open_memmap(mode="w+")`` makes a sparse file of the full size and maps
it: the disk blocks are only allocated when a page is first written, through the map.
On a full disk that write cannot fail with an error; the kernel sends SIGBUS and the
process dies with exit status 135 and no message. :func:`open_memmap` reserves the
file's blocks first (``posix_fallocate``), so a full disk is an ``OSError`` ENOSPC that
names the file, before anything is written, and the half-made file is removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_UNSUPPORTED = {errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def preallocate(path: str | Path, size: int | None = None) -> None:
    """Allocate the disk blocks of bytes ``[0, size)`` of the file at ``path`` (default:
    its current size), so later writes into that range (through a memory map too) need
    no new space.

    A platform without ``os.posix_fallocate`` (macOS, Windows) or a file system that
    refuses it (``EOPNOTSUPP``/``EINVAL``) is left as it is (logged at debug level):
    there, a full disk during a mapped write still ends the process.

    Args:
        path: an existing file.
        size: bytes to allocate, from offset 0.

    Raises:
        OSError: ENOSPC (or EDQUOT) naming ``path`` when the space is not there; any
            other error of the call.
    """
    path = Path(path)
    size = path.stat().st_size if size is None else int(size)
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in _UNSUPPORTED:
            log.debug("%s: posix_fallocate is not supported here (%s); writing without reserving space", path, e)
            return
        raise OSError(e.errno, f"{os.strerror(e.errno)} (reserving {size} bytes for it)", str(path)) from e
    finally:
        os.close(fd)


def open_memmap(path: str | Path, dtype, shape: tuple[int, ...]) -> np.memmap:
    """``np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)`` with the
    whole file's disk space reserved (:func:`preallocate`) before the array is returned.

    Args:
        path: the ``.npy`` file to create (replaced when it exists).
        dtype: the array's dtype.
        shape: the array's shape.

    Returns:
        The writable memory-mapped array.

    Raises:
        OSError: ENOSPC naming ``path`` when the disk cannot hold the file; the file is
            removed then.
    """
    path = Path(path)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
    try:
        preallocate(path)
    except BaseException:
        del arr
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return arr
