"""Records shared by every layer: :class:`Document` and :class:`SearchResult`.

They are plain frozen dataclasses (cheap to build, hashable, picklable) with
``to_dict``/``from_dict`` for JSON. The HTTP layer converts them to the DeepResearchGym
and Search-R1 wire shapes (``drgym.server``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    """One document of a corpus, or one passage of a split document.

    Attributes:
        doc_id: stable identifier, unique within the corpus (e.g. ``"hotpotqa-00012"``).
            A passage of a split document has ``"<doc_id>#p<k>"``.
        url: the document's URL, unique within the corpus (Wikipedia URL from the title,
            with a ``#<doc_id>`` fragment when several documents share a title).
        title: title; may be empty.
        text: body text without the title.
        source: which corpus part it came from (``"ovos"``, ``"hotpotqa"``, ``"clueweb22"``...).
        metadata: other source fields (JSON-serialisable).
    """

    doc_id: str
    url: str
    title: str
    text: str
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def contents(self) -> str:
        """Search-R1 / FlashRAG ``contents``: ``'"title"\\ntext'``."""
        return f'"{self.title}"\n{self.text}'

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the field names above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Document":
        """Inverse of :meth:`to_dict`; unknown keys go into ``metadata``.

        Raises:
            KeyError: ``doc_id`` or ``text`` is missing.
        """
        known = {"doc_id", "url", "title", "text", "source", "metadata"}
        meta = dict(d.get("metadata") or {})
        meta.update({k: v for k, v in d.items() if k not in known})
        return cls(
            doc_id=str(d["doc_id"]),
            url=str(d.get("url") or ""),
            title=str(d.get("title") or ""),
            text=str(d["text"]),
            source=str(d.get("source") or ""),
            metadata=meta,
        )


@dataclass(frozen=True)
class SearchResult:
    """One hit of a search: a passage, its score and its rank.

    Attributes:
        doc_id: doc_id of the passage (``"<doc_id>#p<k>"`` for a split document).
        url: URL of the whole document (what ``fetch`` takes).
        title: title of the document.
        text: passage text (not the whole document).
        score: backend score, higher is better; inner product of unit vectors (cosine,
            in [-1, 1]) for dense search, BM25 score for lexical, RRF score for hybrid,
            and whatever the provider returns for web backends.
        rank: 1-based rank in the result list.
        source: corpus part or web backend name.
        metadata: other fields (e.g. ``{"snippet": ...}`` for web results).
    """

    doc_id: str
    url: str
    title: str
    text: str
    score: float
    rank: int
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the field names above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SearchResult":
        """Inverse of :meth:`to_dict`."""
        return cls(
            doc_id=str(d["doc_id"]),
            url=str(d.get("url") or ""),
            title=str(d.get("title") or ""),
            text=str(d.get("text") or ""),
            score=float(d.get("score") or 0.0),
            rank=int(d.get("rank") or 0),
            source=str(d.get("source") or ""),
            metadata=dict(d.get("metadata") or {}),
        )
