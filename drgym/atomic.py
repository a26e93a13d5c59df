"""Atomic file writes: a crash never leaves a torn file behind.

A write that fails because the disk is full (``ENOSPC``, ``EDQUOT``) raises
:class:`DiskFullError`, whose one-line message names the file and the directory whose
disk is full; the file is left as it was (no partial line, no partial file).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_APPEND_LOCK = threading.Lock()

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A write failed because the disk (or the quota) holding the file is full.

    An :class:`OSError` (``errno`` ENOSPC or EDQUOT, ``filename`` the file), so callers
    catching ``OSError`` still catch it; ``str()`` is one line naming the file, its
    directory and the fix. (This layer sits beside :mod:`drgym.errors`, so it is no
    :class:`~drgym.errors.DrgymError`; callers that want one wrap it.)

    Attributes:
        path: the file that could not be written.
    """

    def __init__(self, err: int, path: str | os.PathLike, message: str) -> None:
        super().__init__(err, os.strerror(err), str(path))
        self.path = Path(path)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _disk_full(e: OSError, path: Path, what: str) -> DiskFullError:
    """The :class:`DiskFullError` for ``e`` (an ENOSPC/EDQUOT) while writing ``path``."""
    full = "quota of the disk" if e.errno == errno.EDQUOT else "disk"
    return DiskFullError(
        e.errno or errno.ENOSPC, path,
        f"cannot write {path}: the {full} holding {path.parent.resolve()} is full ({os.strerror(e.errno or errno.ENOSPC)}); "
        f"{what} Free some space there (or write to another directory) and run again.")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``.

    The file either keeps its old content or has the new content in full.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and not isinstance(e, DiskFullError) and e.errno in _FULL:
            raise _disk_full(e, path, f"{path.name} keeps its previous content.") from e
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically (UTF-8, non-ASCII kept)."""
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=False) + "\n")


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    """Append one JSON line so that a reader never sees a torn line.

    The whole line is built in memory, written with a single ``os.write`` on an
    ``O_APPEND`` descriptor and fsynced. If that write fails or is short (a disk that
    filled up mid-line), the file is truncated back to its size before the call, so no
    partial line is ever left behind. If a previous writer died mid-line (the file does
    not end with a newline), a newline is written first so the torn line stays isolated
    and readers that skip unparsable lines (:func:`read_jsonl`) lose nothing else.

    Raises:
        DiskFullError: the disk holding ``path`` is full (the file is as it was).
        OSError: any other write failure (the file is as it was, when it can be truncated).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    with _APPEND_LOCK:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size:
                with open(path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        line = b"\n" + line
            try:
                n = os.write(fd, line)
                if n != len(line):  # a short write: the disk filled up mid-line
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, size)  # no partial line
                    os.fsync(fd)
                except OSError as e2:  # rare (truncating frees space); a resume rejects a torn line
                    log.error("could not truncate %s back to %d bytes after a failed append: %s", path, size, e2)
                if e.errno in _FULL:
                    raise _disk_full(e, path, f"the line was not written ({path.name} is back to its {size} bytes).") from e
                if e.filename is None:
                    raise OSError(e.errno, e.strerror, str(path)) from e
                raise
        finally:
            os.close(fd)


def read_jsonl(path: str | os.PathLike, *, skip_bad: bool = True) -> list[Any]:
    """Read a JSONL file; a torn or unparsable line is skipped when ``skip_bad``.

    Raises:
        FileNotFoundError: no file at ``path``.
        json.JSONDecodeError: a bad line and ``skip_bad=False``.
    """
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                if not skip_bad:
                    raise
    return out


def decode_line(raw: bytes, path: str | os.PathLike, lineno: int, *, error: type[Exception] = ValueError) -> str:
    """Decode one line of a user's text file as UTF-8, naming the bad byte if it is not.

    Raises:
        error: the line is not UTF-8 (message: file, line, column, byte, and the fix).
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}:{lineno} is not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "save the file as UTF-8.") from None


def load_jsonl_strict(path: str | os.PathLike, *, error: type[Exception] = ValueError,
                      blank_lines: list[int] | None = None) -> list[Any]:
    """Read a JSONL file whole, refusing bad lines (for inputs a user hands in).

    Args:
        path: the file; blank lines are skipped (their numbers appended to
            ``blank_lines`` when given, so the caller can report them).
        error: the exception class raised (e.g. ``ConfigError`` or ``CorpusError``).
        blank_lines: a list collecting the 1-based numbers of blank lines.

    Raises:
        error: the file is missing, or a line is not UTF-8 or not JSON (the message names
            file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"No file at {path}.")
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = decode_line(raw, path, n, error=error)
            if not line.strip():
                if blank_lines is not None:
                    blank_lines.append(n)
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise error(f"{path}:{n} is not valid JSON ({e.msg}: column {e.colno}).") from None
    return rows
