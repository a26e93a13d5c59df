"""The :class:`Task` record: one question or research prompt with its gold data.

Loaders for the task formats in ``shared/data`` live in :mod:`drgym.envs.task_loaders`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass
class Task:
    """One task an environment poses to an agent.

    Attributes:
        task_id: stable id, unique within its task set (e.g. ``"hotpotqa-5a77ec11..."``).
        question: the question (short answer) or research prompt (long form).
        answers: gold answers with all aliases; empty for research tasks.
        kind: ``"qa"`` (short answer, SearchQA) or ``"research"`` (cited report).
        gold_docs: supporting documents, as titles, URLs or doc_ids (see ``metadata``
            key ``"gold_docs_kind"``); empty when unknown.
        key_points: DeepResearchGym key points, each ``{"point": str, ...}``; empty when none.
        source: the task set name (``"hotpotqa"``, ``"musique"``, ``"drb"``...).
        metadata: any other field (question type, hop count, criteria id, language...).
    """

    task_id: str
    question: str
    answers: list[str] = field(default_factory=list)
    kind: Literal["qa", "research"] = "qa"
    gold_docs: list[str] = field(default_factory=list)
    key_points: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the field names above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError: ``task_id`` or ``question`` is missing.
        """
        return cls(
            task_id=str(d["task_id"]),
            question=str(d["question"]),
            answers=[str(a) for a in d.get("answers") or []],
            kind=d.get("kind") or "qa",
            gold_docs=[str(g) for g in d.get("gold_docs") or []],
            key_points=list(d.get("key_points") or []),
            source=str(d.get("source") or ""),
            metadata=dict(d.get("metadata") or {}),
        )
