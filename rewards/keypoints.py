"""DeepResearchGym key points: extraction + merge, and KPR / KPC.

Source: DeepResearchGym (Coelho et al., arXiv 2505.19253, §3.2 "Key point recall and
contradiction" and the appendix prompts); upstream ``cxcscmu/deepresearch_benchmarking``
``key_point_extract.py``, ``aggregate.py``, ``eval_kpr_async.py``.

- Extraction: one judge call per ground-truth document gives key points with verbatim
  supporting spans; a merge call removes duplicates and folds contradictions into one
  "some sources say X, others Y" point. Both go through the judge's persistent verdict
  cache, so rebuilding the key points of a query costs nothing the second time.
- KPR / KPC: one judge verdict per key point (Supported / Omitted / Contradicted)
  against the whole report. Per query: support, omitted and contradicted rates.
  Over queries: KPR = mean support rate, KPC = mean contradicted rate (macro).
- A query with no key points: KPR is undefined. The reward scores it None (not 0),
  flags it in the ``kp_undefined`` component, logs a warning, and ``drgym evaluate`` /
  ``drgym rollout`` exclude it from the means and count it (``kpr/undefined``,
  ``kpr_undefined``). Upstream counts such a query as 0 in every rate; only the
  aggregation helpers below (:func:`label_rates`, :func:`aggregate_kpr`) keep that, to
  reproduce upstream's result files exactly.

Scale: the reward, its components, ``drgym rollout`` and ``drgym evaluate`` use fractions
in [0, 1]. The aggregation helpers use percentages (0-100), as upstream's files do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable

from drgym.errors import ConfigError
from drgym.judges.base import Judge, JudgeRequest
from drgym.judges.factory import make_judge, require_judge
from drgym.judges.prompts import (
    KEYPOINT_EXTRACT,
    KEYPOINT_MERGE,
    KPR,
    KPR_BATCH,
    KPR_LABELS,
)
from drgym.records import Episode, Reward, RewardOutput

log = logging.getLogger(__name__)


def key_point_text(kp: dict[str, Any] | str) -> str:
    """The text of a key point: ``kp["point"]`` (drgym Task) or ``kp["point_content"]`` (DeepResearchGym).

    Raises:
        ConfigError: neither field is present.
    """
    if isinstance(kp, str):
        return kp
    for k in ("point", "point_content", "content", "text"):
        if isinstance(kp.get(k), str):
            return kp[k]
    raise ConfigError(f"A key point needs a 'point' or 'point_content' string, got keys {sorted(kp)}.")


def label_rates(labels: Iterable[str]) -> dict[str, float]:
    """Percentages of Supported / Omitted / Contradicted labels (0-100).

    Returns:
        ``{"support_rate", "omitted_rate", "contradicted_rate", "n"}``; all rates 0 when
        there are no labels (a query with no key points).

    Raises:
        ConfigError: a label outside Supported/Omitted/Contradicted.
    """
    labels = list(labels)
    for lab in labels:
        if lab not in KPR_LABELS:
            raise ConfigError(f"KPR label must be one of {KPR_LABELS}, got {lab!r}.")
    n = len(labels)
    if n == 0:
        return {"support_rate": 0.0, "omitted_rate": 0.0, "contradicted_rate": 0.0, "n": 0}
    return {
        "support_rate": 100.0 * labels.count("Supported") / n,
        "omitted_rate": 100.0 * labels.count("Omitted") / n,
        "contradicted_rate": 100.0 * labels.count("Contradicted") / n,
        "n": n,
    }


def aggregate_kpr(per_query: dict[str, dict[str, float]] | list[dict[str, float]]) -> dict[str, float]:
    """Macro-average per-query rates into KPR / KPC (percent).

    Args:
        per_query: outputs of :func:`label_rates` (or upstream result rows with
            ``support_rate`` / ``contradicted_rate``), one per query; a query with no key
            points counts with rates 0.

    Returns:
        ``{"kpr", "kpc", "omitted", "n_queries"}``.

    Raises:
        ConfigError: no queries.
    """
    rows = list(per_query.values()) if isinstance(per_query, dict) else list(per_query)
    if not rows:
        raise ConfigError("aggregate_kpr needs at least one query.")
    n = len(rows)

    def om(r):  # upstream result files spell it "ommitted_rate"
        return r.get("omitted_rate", r.get("ommitted_rate", 0.0))

    return {
        "kpr": sum(r.get("support_rate", 0.0) for r in rows) / n,
        "kpc": sum(r.get("contradicted_rate", 0.0) for r in rows) / n,
        "omitted": sum(om(r) for r in rows) / n,
        "n_queries": n,
    }


# ---------------------------------------------------------------------------------------
# Key point building
# ---------------------------------------------------------------------------------------


@dataclass
class KeyPointSet:
    """Key points of one query.

    Attributes:
        points: ``{"point_number", "point_content", "point", "original_point_number",
            "spans", "spans_verbatim"}`` dicts (``point`` = ``point_content``, for Task).
        per_doc: the unmerged extraction, ``{doc_id: [points]}``.
        failures: documents (or the merge) whose judge call failed, with the error.
    """

    points: list[dict[str, Any]] = field(default_factory=list)
    per_doc: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


class KeyPointExtractor:
    """Extract key points with spans from ground-truth documents, then merge them.

    Args:
        judge: judge or spec; its verdict cache makes repeated builds free.
        max_doc_chars: documents are cut to this many characters before extraction.
    """

    def __init__(self, judge: Judge | str, max_doc_chars: int = 20000) -> None:
        self.judge = make_judge(judge)
        self.max_doc_chars = int(max_doc_chars)

    def build(self, question: str, documents: list[tuple[str, str]]) -> KeyPointSet:
        """Build the merged key points of ``question`` from ``(doc_id, text)`` pairs.

        A failed extraction skips that document (recorded in ``failures``); a failed
        merge keeps the unmerged points (recorded under ``"<merge>"``).
        """
        out = KeyPointSet()
        reqs = [JudgeRequest(KEYPOINT_EXTRACT, {"question": question, "document": text[: self.max_doc_chars]}) for _, text in documents]
        flat: list[dict[str, Any]] = []
        for (doc_id, text), res in zip(documents, self.judge.judge_many(reqs)):
            if not res.ok:
                out.failures[doc_id] = res.error or "failed"
                continue
            pts = []
            for p in res.verdict.points:
                spans = [s for s in p.spans if s.strip()]
                d = {
                    "point_content": p.point_content,
                    "spans": spans,
                    "spans_verbatim": all(s in text for s in spans),
                    "doc_id": doc_id,
                }
                pts.append(d)
                flat.append(d)
            out.per_doc[doc_id] = pts
        if not flat:
            return out
        numbered = "\n".join(f"{i}. {p['point_content']}" for i, p in enumerate(flat, 1))
        res = self.judge.judge_many([JudgeRequest(KEYPOINT_MERGE, {"question": question, "points": numbered})])[0]
        if not res.ok:
            out.failures["<merge>"] = res.error or "failed"
            merged = [{"point_content": p["point_content"], "original_point_number": [i]} for i, p in enumerate(flat, 1)]
        else:
            merged = [m.model_dump() for m in res.verdict.points]
        for k, m in enumerate(merged, 1):
            origs = [o for o in m.get("original_point_number", []) if 1 <= o <= len(flat)]
            spans = [s for o in origs for s in flat[o - 1]["spans"]]
            out.points.append(
                {
                    "point_number": k,
                    "point_content": m["point_content"],
                    "point": m["point_content"],
                    "original_point_number": origs,
                    "spans": spans,
                    "spans_verbatim": all(flat[o - 1]["spans_verbatim"] for o in origs),
                }
            )
        return out


# ---------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------


class KeyPointRecall(Reward):
    """KPR / KPC of a report against the task's key points (DeepResearchGym §3.2).

    One judge call per key point with the full report. Score = KPR fraction
    ``- contradiction_weight * KPC fraction``. Components per episode: ``kpr``, ``kpc``,
    ``kp_omitted`` (fractions 0-1) and ``n_key_points``.

    Scale: fractions in [0, 1]. A task with no key points has no KPR: it scores None
    with ``kp_undefined`` = 1.0 and a logged warning; it is not a judge failure (not in
    ``failures``). An empty report gets all key points Omitted without judge calls. If
    any key point's judge call fails after retries, the episode scores None and counts
    in ``failures``.

    >>> from drgym.records import Task
    >>> from drgym.judges.base import Judge
    >>> class AllSupported(Judge):
    ...     model_id = "stub:yes"
    ...     def complete(self, messages, **kw):
    ...         return '{"label": "Supported"}'
    >>> r = KeyPointRecall(AllSupported(cache=False))
    >>> out = r.score([Episode(Task("a", "q", kind="research", key_points=[{"point": "x"}, {"point": "y"}]), "report"),
    ...                Episode(Task("b", "q", kind="research"), "report")])
    >>> out.scores, out.components["kp_undefined"], out.failures
    ([1.0, None], [0.0, 1.0], 0)

    Args:
        judge: judge or spec.
        contradiction_weight: penalty weight of KPC in the score (0 = pure KPR).
        max_report_chars: the report is cut to this many characters for the judge.
        batched: judge all key points of a report in one call (``kpr_batch`` template;
            drgym's cheaper mode for RL, not the upstream protocol). A batched answer
            that misses a key point is a failure of that key point.
    """

    name = "kpr"

    def __init__(
        self,
        judge: Judge | str | None = None,
        *,
        contradiction_weight: float = 0.0,
        max_report_chars: int = 30000,
        batched: bool = False,
    ) -> None:
        self.judge = require_judge(judge, self.name)
        self.contradiction_weight = float(contradiction_weight)
        self.max_report_chars = int(max_report_chars)
        self.batched = bool(batched)

    def judge_labels(self, episodes: list[Episode]) -> list[list[str | None]]:
        """Per episode, one label per key point (None where the judge failed)."""
        reqs, where = [], []
        out: list[list[str | None]] = []
        for i, ep in enumerate(episodes):
            kps = ep.task.key_points or []
            report = (ep.answer or "")[: self.max_report_chars]
            if not report.strip():
                out.append(["Omitted"] * len(kps))
                continue
            out.append([None] * len(kps))
            if self.batched:
                if kps:
                    listing = "\n".join(f"{j}. {key_point_text(kp)}" for j, kp in enumerate(kps, 1))
                    reqs.append(JudgeRequest(KPR_BATCH, {"key_points": listing, "report": report}))
                    where.append((i, -1))
                continue
            for j, kp in enumerate(kps):
                reqs.append(JudgeRequest(KPR, {"key_point": key_point_text(kp), "report": report}))
                where.append((i, j))
        for (i, j), res in zip(where, self.judge.judge_many(reqs)):
            if j >= 0:
                out[i][j] = res.verdict.label if res.ok else None
            elif res.ok:
                by_num = {lab.point_number: lab.label for lab in res.verdict.labels}
                out[i] = [by_num.get(k) for k in range(1, len(out[i]) + 1)]
        return out

    def score(self, episodes: list[Episode]) -> RewardOutput:
        labels = self.judge_labels(episodes)
        scores: list[float | None] = []
        comp: dict[str, list[float | None]] = {"kpr": [], "kpc": [], "kp_omitted": [], "n_key_points": [], "kp_failed": [],
                                               "kp_undefined": []}
        failures = 0
        undefined = []
        for ep, labs in zip(episodes, labels):
            failed = sum(lab is None for lab in labs)
            comp["n_key_points"].append(float(len(labs)))
            comp["kp_failed"].append(float(failed))
            comp["kp_undefined"].append(float(not labs))
            if not labs:
                undefined.append(ep.task.task_id)
                scores.append(None)
                for k in ("kpr", "kpc", "kp_omitted"):
                    comp[k].append(None)
                continue
            if failed:
                failures += 1
                scores.append(None)
                for k in ("kpr", "kpc", "kp_omitted"):
                    comp[k].append(None)
                continue
            r = label_rates(labs)
            kpr, kpc = r["support_rate"] / 100, r["contradicted_rate"] / 100
            comp["kpr"].append(kpr)
            comp["kpc"].append(kpc)
            comp["kp_omitted"].append(r["omitted_rate"] / 100)
            scores.append(kpr - self.contradiction_weight * kpc)
        if undefined:
            log.warning("KPR is undefined for %d of %d report(s) whose task has no key points (%s): scored None, not 0.",
                        len(undefined), len(episodes), ", ".join(undefined[:5]) + (" ..." if len(undefined) > 5 else ""))
        return RewardOutput(scores=scores, components=comp, failures=failures)
