"""A teacher model as the question generator: ``openai:MODEL@URL`` or ``hf:NAME``.

The teacher is a :class:`~drgym.judges.base.Judge` backend (so retries, the verdict cache
and failure counting are the judges' own): for each passage it is asked for one question
whose short answer the passage states, as JSON ``{"question": ..., "answer": ...}``.
A passage whose request still fails after the retries yields no candidate and is counted
in :attr:`TeacherGenerator.failures` (recorded by ``drgym data synth``), never silently.
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import BaseModel, Field

from drgym.judges.base import Judge, JudgeRequest, PromptTemplate
from drgym.judges.factory import make_judge
from drgym.synth.rules import MAX_ANSWER_WORDS, Candidate, base_title
from drgym.types import Document


class QAPair(BaseModel):
    """The teacher's answer: one question and its short answer."""

    question: str = Field(min_length=8, max_length=400)
    answer: str = Field(min_length=1, max_length=120)


QUESTION_TEMPLATE = PromptTemplate(
    name="synth_question",
    version="1",
    system=("You write quiz questions from an encyclopedia passage. Write ONE question that a curious person "
            "might type into a search engine, whose short answer (1-{max_words} words: a name, date, place or "
            "number) is stated in the passage. The question must make sense without the passage, must not "
            "contain its answer, and must name its subject. Reply with JSON only: "
            '{{"question": "...", "answer": "..."}}'),
    user="Title: {title}\nPassage: {text}",
    verdict=QAPair,
)


class TeacherGenerator:
    """Candidates from a teacher model (``openai:MODEL@URL``, ``hf:NAME`` or a Judge).

    Args:
        spec: the judge spec (see :func:`drgym.judges.factory.make_judge`) or a judge.
        max_chars: passage characters shown to the teacher.
        judge_kwargs: passed to :func:`make_judge` (``temperature``, ``retry``...).

    Attributes:
        failures: passages whose request failed after the retries.
    """

    def __init__(self, spec: str | Judge, *, max_chars: int = 1200, **judge_kwargs: Any) -> None:
        self.judge = make_judge(spec, **judge_kwargs)
        self.max_chars = int(max_chars)
        self.failures = 0

    def describe(self) -> dict[str, Any]:
        """The teacher's settings and the template tag, for the synthesis record."""
        return {"teacher": self.judge.describe(), "template": QUESTION_TEMPLATE.tag, "failures": self.failures}

    def __call__(self, docs: Sequence[Document]) -> list[Candidate]:
        reqs = [JudgeRequest(QUESTION_TEMPLATE, {"title": base_title(d.title), "text": d.text[: self.max_chars],
                                                 "max_words": MAX_ANSWER_WORDS}) for d in docs]
        out: list[Candidate] = []
        for d, res in zip(docs, self.judge.judge_many(reqs)):
            if not res.ok:
                self.failures += 1
                continue
            v = res.verdicts[0]
            out.append(Candidate(question=v.question.strip(), answers=(v.answer.strip(),), doc_id=d.doc_id,
                                 rule=f"teacher:{self.judge.model_id}", answer_type="teacher"))
        return out
