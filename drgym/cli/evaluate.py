"""``drgym evaluate``: score a file of reports with judge-based metrics.

Input formats (one JSON object per line, detected per line):

- DeepResearch Bench: ``{"id", "prompt", "article"}`` (task ids 1-100 match the shipped
  RACE criteria);
- DeepResearchGym: ``{"id", "query", "report"}`` (optionally ``"system"`` and
  ``"key_points"``), or the upstream batch form ``{"<id>.q": query, "<id>.a": report}``.

Judge specs (``--judge`` is required): ``openai:MODEL@BASE_URL`` (any OpenAI-compatible
server; key from ``DRGYM_JUDGE_API_KEY`` / ``OPENAI_API_KEY``), ``openai:MODEL`` (base
URL from ``DRGYM_JUDGE_BASE_URL`` / ``OPENAI_BASE_URL``), ``hf:/path/to/model``, or
``hf:smollm2`` (the bundled SmolLM2-135M-Instruct: it runs, but it is not a valid judge;
the screen, the summary JSON and every per-item row say so).

Outputs: a summary table (per system, per metric, each with its scale), per-item JSONL
(``--out``) and a summary JSON (``--summary``), both written atomically, once, at the end.

A judge endpoint that dies mid-run is retried with backoff (and waited for up to
``reconnect_s`` once it has answered); if it stays down, the command stops with exit
status 75, writes no output file, and rerunning it resumes: every valid verdict is in the
judge cache, so only what is left is judged.
"""

from __future__ import annotations

import logging

import json
from pathlib import Path
from typing import Any, Optional

import typer

log = logging.getLogger(__name__)

METRICS = ("kpr", "citation", "quality", "race", "fact")


def read_reports(path: str | Path, key_points: dict[str, list] | None = None) -> list[dict[str, Any]]:
    """Read a reports file into ``{"task": Task, "answer": str, "system": str, "id": str}`` items.

    Raises:
        ConfigError: missing file, a line that is not a JSON object, or an unknown
            line format (``n`` in messages counts non-blank lines).
    """
    from drgym.atomic import load_jsonl_strict
    from drgym.errors import ConfigError
    from drgym.records import Task

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
    from drgym.rewards.race import load_jsonl

    return {str(r["id"]): list(r.get("key_points") or []) for r in load_jsonl(path)}


#: The one scale of each summary value (the same as the reward's score and components).
SCALES = {
    "KPR": "0-1", "KPC": "0-1", "citation_precision": "0-1", "citation_recall": "0-1", "quality": "0-1",
    "race_overall": "0-1", "race_comprehensiveness": "0-1", "race_insight": "0-1", "race_instruction_following": "0-1",
    "race_readability": "0-1", "fact_citation_accuracy": "0-1", "fact_effective_citations": "per report",
}


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
    from drgym.rewards.fact import fact_stats

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


def register(app: typer.Typer) -> None:
    """Add ``drgym evaluate`` to ``app``."""

    @app.command("evaluate")
    def evaluate(
        reports: Path = typer.Option(..., "--reports", help="JSONL of reports: DeepResearch Bench {id,prompt,article} or DeepResearchGym {id,query,report}."),
        metrics: str = typer.Option("kpr,citation,quality", "--metrics", help=f"Comma list from {','.join(METRICS)}."),
        judge: Optional[str] = typer.Option(None, "--judge", help="Judge spec (required): openai:MODEL@BASE_URL | openai:MODEL | hf:PATH | hf:smollm2 (runs, but flagged as not a valid judge)."),
        backend: str = typer.Option("local", "--backend", help="Search backend spec whose fetch() serves cited pages (citation, fact)."),
        key_points: Optional[Path] = typer.Option(None, "--key-points", help="DeepResearchGym key points JSONL {id, key_points} (kpr)."),
        criteria: Optional[Path] = typer.Option(None, "--criteria", help="RACE criteria JSONL (default: shipped DeepResearch Bench criteria)."),
        references: Optional[Path] = typer.Option(None, "--references", help="RACE reference reports JSONL {id,prompt,article}; without it RACE is point-wise."),
        out: Optional[Path] = typer.Option(None, "--out", help="Per-item JSONL output."),
        summary_out: Optional[Path] = typer.Option(None, "--summary", help="Summary JSON output."),
        cache: Optional[Path] = typer.Option(None, "--cache", help="Verdict cache SQLite (default $DRGYM_HOME/judge_cache.sqlite)."),
        concurrency: int = typer.Option(8, "--concurrency", help="Concurrent judge calls."),
        n_samples: int = typer.Option(1, "--n-samples", help="Judge samples per request, averaged."),
        timeout_s: float = typer.Option(120.0, "--timeout", help="Per-call timeout of an OpenAI-compatible judge, seconds."),
        max_attempts: int = typer.Option(3, "--max-attempts", help="Attempts per judge call before it is recorded as a failure."),
        batch_size: int = typer.Option(4, "--batch-size", help="Reports scored per batch (progress granularity)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Score only the first N reports."),
    ) -> None:
        """Score reports with KPR/KPC, citation precision/recall, quality, RACE and FACT."""
        from rich.console import Console
        from rich.progress import Progress
        from rich.table import Table

        from drgym.atomic import atomic_write_json, atomic_write_text
        from drgym.config import RetryPolicy
        from drgym.errors import ConfigError, ServiceUnavailableError
        from drgym.judges.base import judge_validity
        from drgym.judges.factory import make_judge
        from drgym.records import Episode
        from drgym.rewards.registry import build_reward
        from drgym.rewards.scorer import Scorer

        console = Console(stderr=True)
        if judge is None:
            raise typer.BadParameter(
                "every metric here is scored by an LLM judge: name one, e.g. --judge openai:MODEL@BASE_URL "
                "(a vLLM server of any instruct model works). --judge hf:smollm2 runs the bundled 135M model, "
                "but it is not a valid judge (Cohen's kappa 0.0) and its scores are flagged.", param_hint="--judge")
        ms = [m.strip() for m in metrics.split(",") if m.strip()]
        bad = [m for m in ms if m not in METRICS]
        if bad or not ms:
            raise typer.BadParameter(f"unknown metrics {bad}; choose from {','.join(METRICS)}", param_hint="--metrics")
        kp = load_key_points(key_points) if key_points else None
        items = read_reports(reports, kp)
        if limit is not None:
            items = items[:limit]
        if not items:
            raise typer.BadParameter(f"{reports} holds no reports", param_hint="--reports")
        # --max-attempts and --timeout are the judge's retry policy (the timeout only reaches an endpoint)
        retry = RetryPolicy(attempts=max_attempts, **({"timeout_s": timeout_s} if judge.startswith("openai") else {}))
        jkw: dict[str, Any] = {"n_samples": n_samples, "max_concurrency": concurrency, "retry": retry}
        if cache is not None:
            jkw["cache"] = cache
        j = make_judge(judge, **jkw)
        valid, note = judge_validity(j)
        if not valid:
            console.print(f"[bold yellow]warning:[/] judge {j.model_id} is {note}.")
        be = None
        if any(m in ("citation", "fact") for m in ms):
            from drgym.search.registry import make_backend

            be = make_backend(backend)
        rewards = {}
        for m in ms:
            kw: dict[str, Any] = {}
            if m == "race":
                from drgym.rewards.race import load_criteria, load_jsonl

                kw["criteria"] = load_criteria(criteria)
                if references:
                    kw["references"] = {str(r["id"]): r["article"] for r in load_jsonl(references)}
                kw["generate_missing"] = True
            if m == "citation":
                kw["mode"] = "precision"
            rewards[m] = build_reward({m: kw}, judge=j, backend=be)
        scorers = {m: Scorer({m: rewards[m]}, stop_on=(ServiceUnavailableError, ConfigError)) for m in ms}
        rows: list[dict[str, Any]] = []
        try:
            with Progress(console=console, transient=False) as prog:
                bar = prog.add_task("scoring", total=len(items) * len(ms))
                for start in range(0, len(items), batch_size):
                    chunk = items[start : start + batch_size]
                    eps = [Episode(task=it["task"], answer=it["answer"]) for it in chunk]
                    chunk_rows = [
                        {"id": it["id"], "system": it["system"], "task_id": it["task"].task_id, "scores": {}, "components": {}, "failed": {}}
                        for it in chunk
                    ]
                    for m in ms:
                        # a metric that raises is logged and counted as failed (None); a ConfigError
                        # or a service that stayed down stops the evaluation (handled below)
                        for row, res in zip(chunk_rows, scorers[m].score(eps)):
                            row["scores"][m] = res.scores[m]
                            row["components"].update(res.components)
                            if m in res.errors:
                                row.setdefault("errors", {})[m] = res.errors[m]
                            # None is a judge failure, except a KPR with no key points (undefined)
                            row["failed"][m] = res.scores[m] is None and not (m == "kpr" and row["components"].get("kp_undefined"))
                        prog.advance(bar, len(chunk))
                    rows.extend(chunk_rows)
        except ConfigError as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        except ServiceUnavailableError as e:
            # the judge (or the search server of citation/fact) stayed down: valid verdicts
            # are in the cache, so a rerun judges only what is left
            where = f"the verdict cache {j.cache.path}" if j.cache is not None else "no cache (--cache was off)"
            console.print(f"[red]error:[/red] {e} -- evaluation stopped after {len(rows)} of {len(items)} reports; "
                          f"every valid verdict so far is in {where}. Rerun the same "
                          "command to resume once the endpoint is back (cached verdicts are not judged again); "
                          "no output file was written.", soft_wrap=True)
            raise typer.Exit(75) from None
        finally:
            j.close()
        summ = summarize(rows, ms)
        meta = {"judge": j.describe(), "judge_stats": dict(j.stats), "metrics": ms, "reports": str(reports),
                "scales": {k: v for k, v in SCALES.items() if any(k in x for x in summ.values())}}
        undefined = [r["id"] for r in rows if r["components"].get("kp_undefined")]
        if undefined:
            console.print(f"[bold yellow]warning:[/] KPR is undefined for {len(undefined)} report(s) with no key points "
                          f"(ids {', '.join(undefined[:8])}{' ...' if len(undefined) > 8 else ''}): excluded from KPR/KPC, "
                          "counted in kpr/undefined (pass --key-points to score them).")
        if out:
            row_judge = {"judge": j.model_id, **({} if valid else {"judge_valid": False})}
            atomic_write_text(out, "".join(json.dumps({**r, **row_judge}, ensure_ascii=False) + "\n" for r in rows))
        if summary_out:
            atomic_write_json(summary_out, {"summary": summ, **meta})
        systems = list(summ)
        keys = [k for k in next(iter(summ.values())) if k != "n_reports"]
        title = f"drgym evaluate ({j.model_id})" if valid else f"drgym evaluate ({j.model_id}: NOT A VALID JUDGE, scores are not results)"
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("scale")
        for system in systems:
            table.add_column(system, justify="right")
        table.add_row("reports", "count", *[str(summ[x]["n_reports"]) for x in systems])
        for k in keys:
            table.add_row(k, SCALES.get(k, "count"), *[("-" if summ[x].get(k) is None else f"{summ[x][k]:.4g}") for x in systems])
        Console().print(table)
        if not valid:
            console.print(f"[bold yellow]warning:[/] these scores come from {j.model_id}, {note}.")
        console.print(f"judge calls {j.stats['calls']}, cache hits {j.stats['cache_hits']}, retries {j.stats['retries']}, failures {j.stats['failures']}")
        if rows and all(r["failed"].get(m) for r in rows for m in ms):
            # Nothing was scored: say so with a failing exit status (the per-item file
            # above still records every failure).
            console.print("[red]error:[/red] every judge call failed; no report was scored (see the warnings above).")
            raise typer.Exit(1)
