"""TREC relevance judgements (qrels): ``qid 0 docid rel`` per line.

The file format shared by retrieval evaluation (:mod:`drgym.evaluation.retrieval`) and
the task loaders that take gold documents from qrels (BrowseComp-Plus).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from drgym.atomic import atomic_write_text, decode_line
from drgym.errors import ConfigError, CorpusError

Qrels = dict[str, dict[str, int]]
"""``{qid: {docid: relevance}}``."""


def nonblank_lines(path: str | Path, what: str) -> Iterable[tuple[int, str]]:
    """``(line number, stripped line)`` of each non-blank line of a UTF-8 text file.

    Raises:
        CorpusError: the file is missing (named as a ``what`` file) or a line is not UTF-8.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{what} file not found: {path}")
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = decode_line(raw, path, n, error=CorpusError).strip()
            if line:
                yield n, line


def read_qrels(path: str | Path) -> Qrels:
    """Read a TREC qrels file (``qid 0 docid rel`` per line).

    Returns:
        ``{qid: {docid: rel}}`` in file order.

    Raises:
        CorpusError: missing file, a line without four fields, a non-integer ``rel``,
            a docid judged twice for one query, or no line at all.
    """
    out: Qrels = {}
    for n, line in nonblank_lines(path, "qrels"):
        parts = line.split()
        if len(parts) != 4:
            raise CorpusError(f"{path}:{n}: a qrels line is 'qid 0 docid rel' (4 fields), got {len(parts)}: {line[:80]!r}.")
        qid, _, docid, rel = parts
        try:
            r = int(rel)
        except ValueError:
            raise CorpusError(f"{path}:{n}: relevance must be an integer, got {rel!r}.") from None
        if docid in out.setdefault(qid, {}):
            raise CorpusError(f"{path}:{n}: document {docid!r} is judged twice for query {qid!r}.")
        out[qid][docid] = r
    if not out:
        raise CorpusError(f"{path} holds no judgement.")
    return out


def write_qrels(path: str | Path, qrels: Qrels) -> None:
    """Write ``{qid: {docid: rel}}`` as a TREC qrels file (atomically).

    Raises:
        ConfigError: a qid or docid is empty or holds whitespace.
    """
    lines = []
    for qid, docs in qrels.items():
        for docid, rel in docs.items():
            check_trec_id(qid, "query id")
            check_trec_id(docid, "document id")
            lines.append(f"{qid} 0 {docid} {int(rel)}\n")
    atomic_write_text(path, "".join(lines))


def check_trec_id(s: str, what: str) -> None:
    """Raise :class:`ConfigError` unless ``s`` is a non-empty id without whitespace (a TREC field)."""
    if not s or any(c.isspace() for c in s):
        raise ConfigError(f"a TREC {what} must be non-empty without whitespace, got {s!r}.")


