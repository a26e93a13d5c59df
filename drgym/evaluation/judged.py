"""``drgym evaluate``'s scoring: judge-based metrics over a file of reports.

Input formats (one JSON object per line, detected per line; :func:`read_reports`):

- DeepResearch Bench: ``{"id", "prompt", "article"}`` (task ids 1-100 match the shipped
  RACE criteria);
- DeepResearchGym: ``{"id", "query", "report"}`` (optionally ``"system"`` and
  ``"key_points"``), or the upstream batch form ``{"<id>.q": query, "<id>.a": report}``.

:class:`ReportScoring` builds the judge and the metrics' rewards, scores the reports in
batches through :class:`~drgym.rewards.scorer.Scorer` (its failure policy and its one
merge rule), aggregates them per system (:func:`summarize`) and writes the per-item JSONL
and the summary JSON (atomically, once, at the end). ``drgym evaluate``
(:mod:`drgym.cli.evaluate`) parses the options, calls it and prints.

Example (with an OpenAI-compatible judge server running):

    >>> scoring = ReportScoring("reports.jsonl", ["quality"], "openai:MODEL@http://127.0.0.1:8001/v1")  # doctest: +SKIP
    >>> rows = scoring.score()                                                                          # doctest: +SKIP
    >>> summarize(rows, scoring.metrics)["reports"]["quality"]                                          # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

from drgym.atomic import atomic_write_json, atomic_write_text, load_jsonl_strict
from drgym.config import RetryPolicy
from drgym.errors import ConfigError, ServiceUnavailableError
from drgym.judges import factory
from drgym.judges.base import judge_validity
from drgym.records import Episode, Task
from drgym.rewards import registry
from drgym.rewards.fact import fact_stats
from drgym.rewards.race import load_criteria, load_jsonl
from drgym.rewards.scorer import Scorer
from drgym.search.registry import make_backend

log = logging.getLogger(__name__)

METRICS = ("kpr", "citation", "quality", "race", "fact")
"""The metrics ``drgym evaluate`` scores, each a judged reward of the registry."""

#: The one scale of each summary value (the same as the reward's score and components).
SCALES = {
    "KPR": "0-1", "KPC": "0-1", "citation_precision": "0-1", "citation_recall": "0-1", "quality": "0-1",
    "race_overall": "0-1", "race_comprehensiveness": "0-1", "race_insight": "0-1", "race_instruction_following": "0-1",
    "race_readability": "0-1", "fact_citation_accuracy": "0-1", "fact_effective_citations": "per report",
}


def read_reports(path: str | Path, key_points: dict[str, list] | None = None) -> list[dict[str, Any]]:
    """Read a reports file into ``{"task": Task, "answer": str, "system": str, "id": str}`` items.

    Raises:
        ConfigError: missing file, a line that is not a JSON object, or an unknown
            line format (``n`` in messages counts non-blank lines).
    """
    path = Path(path)
    items = []
    for n, r in enumerate(load_jsonl_strict(path, error=ConfigError), 1):
        if not isinstance(r, dict):
            raise ConfigError(f"{path}: report {n} is not a JSON object.")
        system = str(r.get("system") or path.stem)
        if "article" in r and "prompt" in r:
            rid = str(r.get("id", n))
            task = Task(task_id=f"drb-{rid}", question=str(r["prompt"]), kind="research", source="drb", metadata={"drb_id": rid})
            answer = str(r["article"] or "")
        elif "report" in r and ("query" in r or "question" in r):
            rid = str(r.get("id", n))
            kps = r.get("key_points")
            if kps is None and key_points is not None:
                kps = key_points.get(rid, [])
            task = Task(task_id=f"drgym-{rid}", question=str(r.get("query") or r.get("question")), kind="research", source="deepresearchgym", key_points=list(kps or []))
            answer = str(r["report"] or "")
        else:
            qk = [k for k in r if k.endswith(".q")]
            if len(qk) != 1 or qk[0][:-2] + ".a" not in r:
                raise ConfigError(
                    f"{path}:{n}: expected {{'id','prompt','article'}} (DeepResearch Bench) or "
                    f"{{'id','query','report'}} / {{'<id>.q','<id>.a'}} (DeepResearchGym), got keys {sorted(r)[:6]}."
                )
            rid = qk[0][:-2]
            kps = (key_points or {}).get(rid, [])
            task = Task(task_id=f"drgym-{rid}", question=str(r[qk[0]]), kind="research", source="deepresearchgym", key_points=list(kps))
            answer = str(r[rid + ".a"] or "")
        items.append({"id": rid, "system": system, "task": task, "answer": answer})
    return items


def load_key_points(path: str | Path) -> dict[str, list]:
    """``{id: key_points}`` from a DeepResearchGym key-points JSONL (``{"id", "key_points"}``)."""
    return {str(r["id"]): list(r.get("key_points") or []) for r in load_jsonl(path)}


def parse_metrics(text: str) -> list[str]:
    """The metric names of a comma list (``"kpr,citation"``), in order.

    Raises:
        ConfigError: an unknown metric, or none.
    """
    ms = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in ms if m not in METRICS]
    if bad or not ms:
        raise ConfigError(f"unknown metrics {bad}; choose from {','.join(METRICS)}")
    return ms


def summarize(rows: list[dict[str, Any]], metrics: list[str]) -> dict[str, dict[str, Any]]:
    """Per-system aggregates of per-item rows.

    Every rate is a fraction in [0, 1], the scale of the reward's own score and
    components (:data:`SCALES`; DeepResearchGym publishes KPR, KPC, citation and quality
    times 100):

    - kpr: KPR / KPC macro over the reports that have key points; a report without key
      points has no KPR: excluded and counted in ``kpr/undefined`` (upstream counts it as 0).
    - citation: mean precision and recall.
    - quality: mean of the reports' quality (sum of the six 0-10 criteria / 60).
    - race: mean overall and per-dimension scores.
    - fact: citation accuracy (micro) and effective citations per report with citations.

    Each metric also reports ``n`` (scored) and ``failures`` (judge failures, excluded).
    """
    def mean(vals):
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    out: dict[str, dict[str, Any]] = {}
    for system in sorted({r["system"] for r in rows}):
        rs = [r for r in rows if r["system"] == system]
        s: dict[str, Any] = {"n_reports": len(rs)}
        for m in metrics:
            sc = [r["scores"].get(m) for r in rs]
            comp = [r["components"] for r in rs]
            ok = [c for c, v in zip(comp, sc) if v is not None]
            s[f"{m}/n"] = len(ok)
            s[f"{m}/failures"] = sum(1 for r in rs if r["failed"].get(m))
            if m == "kpr":
                s["kpr/undefined"] = sum(1 for c in comp if c.get("kp_undefined"))
                s["KPR"] = None if not ok else mean([c["kpr"] for c in ok])
                s["KPC"] = None if not ok else mean([c["kpc"] for c in ok])
            elif m == "citation":
                s["citation_precision"] = None if not ok else mean([c["citation_precision"] for c in ok])
                s["citation_recall"] = None if not ok else mean([c["citation_recall"] for c in ok])
            elif m == "quality":
                s["quality"] = None if not ok else mean([v for v in sc if v is not None])
            elif m == "race":
                s["race_overall"] = mean(sc)
                for d in ("comprehensiveness", "insight", "instruction_following", "readability"):
                    s[f"race_{d}"] = mean([c.get(f"race_{d}") for c in ok])
            elif m == "fact":
                rows_f = [{"n_extracted": int(c["fact_n_extracted"]), "supported": int(c["fact_supported"]), "judged": int(c["fact_judged"])} for c in ok]
                try:
                    st = fact_stats(rows_f)
                    s["fact_citation_accuracy"] = st["citation_accuracy"]
                    s["fact_effective_citations"] = st["effective_citations"]
                except (ValueError, KeyError, ZeroDivisionError) as e:  # no usable FACT rows: no score, not a made-up 0
                    log.warning("FACT statistics of %s failed: %s", system, e)
                    s["fact_citation_accuracy"] = None
                    s["fact_effective_citations"] = None
                    s["fact_error"] = f"{type(e).__name__}: {e}"
        out[system] = s
    return out


class NoReportsError(ConfigError):
    """The reports file (after ``limit``) holds no reports."""


class ReportScoring:
    """One ``drgym evaluate`` run: the reports, the judge and one reward per metric.

    Args:
        reports: the reports JSONL (see the module doc).
        metrics: metric names from :data:`METRICS` (:func:`parse_metrics`).
        judge: the judge spec (``openai:MODEL@BASE_URL``, ``openai:MODEL``, ``hf:PATH``,
            ``hf:smollm2``: it runs, but :attr:`valid` is False).
        backend: search backend spec whose ``fetch()`` serves cited pages (citation, fact).
        key_points: DeepResearchGym key points JSONL ``{id, key_points}`` (kpr).
        criteria: RACE criteria JSONL (None: the shipped DeepResearch Bench criteria).
        references: RACE reference reports JSONL ``{id, prompt, article}``; None: RACE
            is point-wise.
        cache: the verdict cache SQLite (None: ``$DRGYM_HOME/judge_cache.sqlite``).
        concurrency: concurrent judge calls.
        n_samples: judge samples per request, averaged.
        timeout_s: per-call timeout of an OpenAI-compatible judge, seconds.
        max_attempts: attempts per judge call before it is recorded as a failure.
        batch_size: reports scored per batch (each metric's reward scores a batch in one
            call; the progress granularity).
        limit: score only the first ``limit`` reports.

    Attributes:
        items: the reports read (:func:`read_reports`).
        metrics: the metric names, in order.
        judge: the :class:`~drgym.judges.base.Judge`; :attr:`valid` and :attr:`note` say
            whether it is a valid judge (:func:`~drgym.judges.base.judge_validity`).

    Raises:
        NoReportsError: no reports to score (an empty file, or ``limit`` 0).
        ConfigError: an unknown metric, a bad reports, key-points, criteria or
            references file, or a ``batch_size`` below 1.
    """

    def __init__(self, reports: str | Path, metrics: Sequence[str], judge: str, *, backend: str = "local",
                 key_points: str | Path | None = None, criteria: str | Path | None = None,
                 references: str | Path | None = None, cache: str | Path | None = None, concurrency: int = 8,
                 n_samples: int = 1, timeout_s: float = 120.0, max_attempts: int = 3, batch_size: int = 4,
                 limit: int | None = None) -> None:
        self.metrics = parse_metrics(",".join(metrics))
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        self.reports = Path(reports)
        kp = load_key_points(key_points) if key_points else None
        items = read_reports(reports, kp)
        if limit is not None:
            items = items[:limit]
        if not items:
            raise NoReportsError(f"{reports} holds no reports")
        self.items = items
        self.batch_size = batch_size
        # max_attempts and timeout_s are the judge's retry policy (the timeout only reaches an endpoint)
        retry = RetryPolicy(attempts=max_attempts, **({"timeout_s": timeout_s} if judge.startswith("openai") else {}))
        jkw: dict[str, Any] = {"n_samples": n_samples, "max_concurrency": concurrency, "retry": retry}
        if cache is not None:
            jkw["cache"] = cache
        self.judge = factory.make_judge(judge, **jkw)
        self.valid, self.note = judge_validity(self.judge)
        be = make_backend(backend) if any(m in ("citation", "fact") for m in self.metrics) else None
        rewards = {}
        for m in self.metrics:
            kw: dict[str, Any] = {}
            if m == "race":
                kw["criteria"] = load_criteria(criteria)
                if references:
                    kw["references"] = {str(r["id"]): r["article"] for r in load_jsonl(references)}
                kw["generate_missing"] = True
            if m == "citation":
                kw["mode"] = "precision"
            rewards[m] = registry.build_reward({m: kw}, judge=self.judge, backend=be)
        # a metric that raises is logged and counted as failed (None); a ConfigError or a
        # service that stayed down stops the evaluation
        self.scorers = {m: Scorer({m: rewards[m]}, stop_on=(ServiceUnavailableError, ConfigError)) for m in self.metrics}

    def score(self, on_progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
        """Score every report with every metric; the judge is closed at the end.

        Args:
            on_progress: called with the number of (report, metric) pairs just scored.

        Returns:
            One row per report: ``id``, ``system``, ``task_id``, ``scores`` (metric ->
            score or None), ``components`` (every metric's score under its name and its
            components, by :meth:`~drgym.rewards.scorer.Scored.merge_into`), ``failed``
            (metric -> bool: None from a judge failure; a KPR with no key points is
            undefined, not failed) and, for a metric that raised, ``errors`` (metric ->
            ``"ExceptionType: message"``).

        Raises:
            ConfigError: a metric's configuration is wrong.
            ServiceUnavailableError: the judge (or the search server of citation/fact)
                stayed down; the message says how many reports were scored and that a
                rerun resumes from the verdict cache.
        """
        rows: list[dict[str, Any]] = []
        try:
            for start in range(0, len(self.items), self.batch_size):
                chunk = self.items[start:start + self.batch_size]
                eps = [Episode(task=it["task"], answer=it["answer"]) for it in chunk]
                chunk_rows: list[dict[str, Any]] = [
                    {"id": it["id"], "system": it["system"], "task_id": it["task"].task_id, "scores": {}, "components": {}, "failed": {}}
                    for it in chunk
                ]
                for m in self.metrics:
                    for row, res in zip(chunk_rows, self.scorers[m].score(eps)):
                        row["scores"][m] = res.scores[m]
                        res.merge_into(row["components"])
                        if m in res.errors:
                            row.setdefault("errors", {})[m] = res.errors[m]
                        # None is a judge failure, except a KPR with no key points (undefined)
                        row["failed"][m] = res.scores[m] is None and not (m == "kpr" and row["components"].get("kp_undefined"))
                    if on_progress is not None:
                        on_progress(len(chunk))
                rows.extend(chunk_rows)
        except ServiceUnavailableError as e:
            # valid verdicts are in the cache, so a rerun judges only what is left
            where = f"the verdict cache {self.judge.cache.path}" if self.judge.cache is not None else "no cache (--cache was off)"
            raise ServiceUnavailableError(
                f"{e} -- evaluation stopped after {len(rows)} of {len(self.items)} reports; every valid verdict so far "
                f"is in {where}. Rerun the same command to resume once the endpoint is back (cached verdicts are "
                "not judged again); no output file was written.") from e
        finally:
            self.judge.close()
        return rows

    def undefined_kpr(self, rows: list[dict[str, Any]]) -> list[str]:
        """Ids of the reports whose KPR is undefined (their task has no key points)."""
        return [r["id"] for r in rows if r["components"].get("kp_undefined")]

    def meta(self, summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """What the summary JSON records besides the summary: the judge, its call counts,
        the metrics, the reports file and the scale of each summary value."""
        return {"judge": self.judge.describe(), "judge_stats": dict(self.judge.stats), "metrics": self.metrics,
                "reports": str(self.reports),
                "scales": {k: v for k, v in SCALES.items() if any(k in x for x in summary.values())}}

    def write(self, rows: list[dict[str, Any]], summary: dict[str, dict[str, Any]], *,
              out: str | Path | None = None, summary_out: str | Path | None = None) -> None:
        """Write the per-item JSONL (each row with the judge's id, and ``judge_valid:
        false`` for an invalid judge) and the summary JSON, each atomically; None skips one."""
        if out:
            row_judge = {"judge": self.judge.model_id, **({} if self.valid else {"judge_valid": False})}
            atomic_write_text(out, "".join(json.dumps({**r, **row_judge}, ensure_ascii=False) + "\n" for r in rows))
        if summary_out:
            atomic_write_json(summary_out, {"summary": summary, **self.meta(summary)})
