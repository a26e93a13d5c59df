"""BrowseComp's answer format and calibration error.

BrowseComp (Wei et al. 2025, arXiv 2504.12516) and BrowseComp-Plus ask the model to end
with three labelled lines, :data:`BROWSECOMP_TEMPLATE`::

    Explanation: <why>
    Exact Answer: <the short answer>
    Confidence: <0% to 100%>

:func:`parse_answer_confidence` reads them back, and :func:`split_labelled_answer` gives
the env the exact answer to score (the env keeps the confidence in the trajectory's
``metadata["answer_confidence"]``); :func:`expected_calibration_error` is the
calibration error BrowseComp reports beside accuracy: stated confidence against being
right, over 10 equal-width confidence bins. A rollout's ``metrics.json`` holds it as
``calibration`` (:func:`drgym.evaluation.metrics.calibration`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable

from drgym.errors import ConfigError

BROWSECOMP_TEMPLATE = """{question}

Your response should be in the following format:
Explanation: {{your explanation for your final answer}}
Exact Answer: {{your succinct, final answer}}
Confidence: {{your confidence score between 0% and 100% for your answer}}"""
"""BrowseComp's query template (``.format(question=...)``)."""

_LINE_LABEL = re.compile(r"^[ \t>*_#-]*(explanation|exact[ \t]+answer|confidence)[ \t*_]*:[ \t*_]*",
                         re.IGNORECASE | re.MULTILINE)
"""A label at the start of a line, Markdown list, quote and emphasis marks allowed around it."""
_INLINE_CONFIDENCE = re.compile(r"[ \t]+[(\[]?[*_]*confidence[ \t*_]*:[ \t*_]*(?=[.,]?\d)", re.IGNORECASE)
"""A ``Confidence: <number>`` label on the ``Exact Answer:`` line itself."""
_CONFIDENCE_VALUE = re.compile(r"\**[ \t]*(\d+(?:[.,]\d+)?|[.,]\d+)(?![.,]?\d|[ \t]*/)[ \t]*(%|percent\b)?", re.IGNORECASE)


def _confidence_value(text: str) -> float | None:
    """The probability a ``Confidence:`` value states: ``85%`` / ``85 percent`` -> 0.85; a
    bare number <= 1 is a fraction (``0.9`` -> 0.9, ``1`` -> 1.0), a bare number above 1
    a percentage (``85`` -> 0.85); a decimal comma is read as a point (``0,9``); above
    100% is clamped to 1.0; anything else (``high``, ``-5%``, ``9/10``) is None."""
    m = _CONFIDENCE_VALUE.match(text)
    if not m:
        return None
    value = float(m.group(1).replace(",", "."))
    if m.group(2) or value > 1.0:
        value /= 100.0
    return min(value, 1.0)


def _answer_text(text: str) -> str:
    """One answer line without its surrounding space, separators and emphasis marks."""
    return text.strip().rstrip(",;|").strip().strip("*_").strip()


@dataclass(frozen=True)
class AnswerConfidence:
    """A response in BrowseComp's format.

    Attributes:
        explanation: the ``Explanation:`` text, or None when absent.
        answer: the ``Exact Answer:`` text, or None when absent.
        confidence: the ``Confidence:`` value as a probability in [0, 1] (``85%``, ``85``
            and ``0.85`` -> 0.85: a bare number up to 1 is a fraction, above 1 a
            percentage), or None when absent or not a number.
    """

    explanation: str | None
    answer: str | None
    confidence: float | None


def parse_answer_confidence(text: str) -> AnswerConfidence:
    """Read ``Explanation: ... Exact Answer: ... Confidence: NN%`` from a response.

    Labels are matched case-insensitively at the start of a line, with Markdown emphasis
    (``**Exact Answer:**``) allowed; the last occurrence of each label wins (a model
    that restates its answer). The exact answer is the rest of its label's line, or the
    next non-empty line when the label ends its line (``"Exact Answer:\\nLyon"``); a
    ``Confidence: <number>`` on that same line ends the answer and is the confidence
    (``"Exact Answer: Lyon Confidence: 80%"`` -> ``Lyon``, 0.8). A confidence with ``%``
    (or ``percent``) is a percentage; a bare number up to 1 is a fraction (``0.9``), above
    1 a percentage (``85``); above 100% is clamped to 1.0; a value that is not a number
    (``high``) is no confidence.

    >>> r = parse_answer_confidence("Explanation: the 1997 list.\\nExact Answer: **Lyon**\\nConfidence: 85%")
    >>> r.answer, r.confidence
    ('Lyon', 0.85)
    >>> r = parse_answer_confidence("Exact Answer:\\nLyon\\nConfidence: 0.9")
    >>> r.answer, r.confidence
    ('Lyon', 0.9)
    >>> parse_answer_confidence("I think it is Lyon.")
    AnswerConfidence(explanation=None, answer=None, confidence=None)
    """
    text = text or ""
    marks = list(_LINE_LABEL.finditer(text))
    explanation = answer = confidence = None
    for i, m in enumerate(marks):
        value = text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        kind = m.group(1).lower()
        if kind == "explanation":
            explanation = value.strip() or explanation
        elif kind == "confidence":
            stated = _confidence_value(value)
            confidence = stated if stated is not None else confidence
        else:  # exact answer: the rest of its line, or the next non-empty line when that is empty
            line, _, rest = value.partition("\n")
            inline = _INLINE_CONFIDENCE.search(line)
            if inline:
                stated = _confidence_value(line[inline.end():])
                confidence = stated if stated is not None else confidence
                line = line[: inline.start()]
            elif not _answer_text(line):
                line = next((x for x in rest.split("\n") if _answer_text(x)), "")
            answer = _answer_text(line) or answer
    return AnswerConfidence(explanation=explanation, answer=answer, confidence=confidence)


def split_labelled_answer(text: str, kind: str = "qa") -> tuple[str, AnswerConfidence | None]:
    """The short answer to score, and the BrowseComp labels, of a final answer.

    A short answer (``kind`` ``"qa"``) written in BrowseComp's format (it has an ``Exact
    Answer:`` line) is scored on that line alone: EM, F1 and judges compare the exact
    answer with the gold, not the explanation and the confidence around it. Any other
    answer, and every research report (``kind`` ``"research"``), is scored as written.
    The env and :class:`drgym.training.trl_adapter.TRLReward` both apply it.

    >>> split_labelled_answer("Explanation: seen in [2].\\nExact Answer: Oslo\\nConfidence: 70%")
    ('Oslo', AnswerConfidence(explanation='seen in [2].', answer='Oslo', confidence=0.7))
    >>> split_labelled_answer("Oslo")
    ('Oslo', None)

    Returns:
        ``(answer, labels)``: ``labels`` is None when ``text`` has no ``Exact Answer:`` line.
    """
    if kind != "qa":
        return text, None
    parsed = parse_answer_confidence(text or "")
    if parsed.answer is None:
        return text, None
    return parsed.answer, parsed


def expected_calibration_error(confidences: Iterable[float], correct: Iterable[bool | float], *,
                               bins: int = 10) -> float:
    """Expected calibration error of stated confidences (BrowseComp's calibration error).

    The confidences (probabilities in [0, 1]) fall into ``bins`` equal-width bins
    ``[0, 0.1), [0.1, 0.2), ..., [0.9, 1.0]`` (1.0 in the last); each bin contributes its
    share of the answers times ``|accuracy in the bin - mean confidence in the bin|``:
    ``ECE = sum_b (n_b / N) * |acc_b - conf_b|``. 0 is perfectly calibrated; an answer
    with no stated confidence must be given one by the caller (BrowseComp counts it as
    100%).

    >>> expected_calibration_error([0.9, 0.9, 0.2, 0.2], [True, False, False, False])
    0.3

    Args:
        confidences: one probability per answer.
        correct: one truth value (or 0/1 score) per answer, same order.
        bins: number of equal-width bins.

    Returns:
        The error, in [0, 1].

    Raises:
        ConfigError: lengths differ, no answer at all, ``bins`` < 1, or a confidence
            outside [0, 1] or not finite.
    """
    conf = [float(c) for c in confidences]
    acc = [float(x) for x in correct]
    if len(conf) != len(acc):
        raise ConfigError(f"calibration error needs one truth value per confidence: {len(conf)} confidences, {len(acc)} values.")
    if not conf:
        raise ConfigError("calibration error of no answer is undefined: pass at least one.")
    if bins < 1:
        raise ConfigError(f"bins must be >= 1, got {bins}.")
    bad = [c for c in conf if not (math.isfinite(c) and 0.0 <= c <= 1.0)]
    if bad:
        raise ConfigError(f"confidences must be probabilities in [0, 1], got {bad[0]!r}.")
    groups: dict[int, list[int]] = {}
    for i, c in enumerate(conf):
        groups.setdefault(min(int(c * bins), bins - 1), []).append(i)
    n = len(conf)
    err = sum(len(ix) / n * abs(sum(acc[i] for i in ix) / len(ix) - sum(conf[i] for i in ix) / len(ix))
              for ix in groups.values())
    return round(err, 12)


def accuracy_and_calibration(responses: Iterable[str], correct: Iterable[bool | float], *, bins: int = 10,
                             missing_confidence: float = 1.0) -> dict[str, float | int]:
    """Accuracy and calibration error of a run in BrowseComp's format.

    Args:
        responses: the model's final texts.
        correct: whether each was judged right (same order).
        missing_confidence: confidence given to a response without a ``Confidence:``
            line (BrowseComp: 100%).

    Returns:
        ``{"accuracy", "calibration_error", "n", "no_confidence"}``; ``no_confidence``
        counts the responses that stated none.

    Raises:
        ConfigError: as :func:`expected_calibration_error`.
    """
    parsed = [parse_answer_confidence(r) for r in responses]
    acc = [float(x) for x in correct]
    if len(parsed) != len(acc):
        raise ConfigError(f"{len(parsed)} responses but {len(acc)} correctness values.")
    conf = [p.confidence if p.confidence is not None else missing_confidence for p in parsed]
    return {"accuracy": sum(acc) / len(acc) if acc else 0.0,
            "calibration_error": expected_calibration_error(conf, acc, bins=bins),
            "n": len(acc), "no_confidence": sum(p.confidence is None for p in parsed)}
