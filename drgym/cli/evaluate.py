"""``drgym evaluate``: score a file of reports with judge-based metrics.

Input formats (one JSON object per line, detected per line):

- DeepResearch Bench: ``{"id", "prompt", "article"}`` (task ids 1-100 match the shipped
  RACE criteria);
- DeepResearchGym: ``{"id", "query", "report"}`` (optionally ``"system"`` and
  ``"key_points"``), or the upstream batch form ``{"<id>.q": query, "<id>.a": report}``.

Judge specs: ``hf:smollm2`` (local SmolLM2-135M-Instruct; plumbing only, poor verdicts),
``hf:/path/to/model``, ``openai:MODEL@BASE_URL`` (any OpenAI-compatible server; key
from ``DRGYM_JUDGE_API_KEY`` / ``OPENAI_API_KEY``), ``openai:MODEL`` (base URL from
``DRGYM_JUDGE_BASE_URL`` / ``OPENAI_BASE_URL``).

Outputs: a summary table (per system, per metric), per-item JSONL (``--out``) and a
summary JSON (``--summary``), both written atomically.
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


def summarize(rows: list[dict[str, Any]], metrics: list[str]) -> dict[str, dict[str, Any]]:
    """Per-system aggregates of per-item rows (the benchmark conventions of each metric).

    - kpr: KPR / KPC macro over reports (0-100); a report without key points counts as 0.
    - citation: mean precision and recall (0-100).
    - quality: mean normalised quality (0-100).
    - race: mean overall and per-dimension scores (0-1).
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
                s["KPR"] = None if not ok else 100 * mean([c["kpr"] for c in ok])
                s["KPC"] = None if not ok else 100 * mean([c["kpc"] for c in ok])
            elif m == "citation":
                s["citation_precision"] = None if not ok else 100 * mean([c["citation_precision"] for c in ok])
                s["citation_recall"] = None if not ok else 100 * mean([c["citation_recall"] for c in ok])
            elif m == "quality":
                s["quality"] = None if not ok else 100 * mean([v for v in sc if v is not None])
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
        judge: str = typer.Option("hf:smollm2", "--judge", help="Judge spec: hf:smollm2 | hf:PATH | openai:MODEL@BASE_URL | openai:MODEL."),
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
        from drgym.errors import ConfigError
        from drgym.judges.factory import make_judge
        from drgym.records import Episode
        from drgym.rewards.registry import build_reward

        console = Console(stderr=True)
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
        jkw: dict[str, Any] = {"n_samples": n_samples, "max_concurrency": concurrency, "max_attempts": max_attempts}
        if cache is not None:
            jkw["cache"] = cache
        if judge.startswith("openai"):
            jkw["timeout_s"] = timeout_s
        j = make_judge(judge, **jkw)
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
                        res = rewards[m].score(eps)
                        for k, row in enumerate(chunk_rows):
                            row["scores"][m] = res.scores[k]
                            row["failed"][m] = res.scores[k] is None
                            for cname, vals in res.components.items():
                                row["components"][cname] = vals[k]
                        prog.advance(bar, len(chunk))
                    rows.extend(chunk_rows)
        except ConfigError as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        finally:
            j.close()
        summ = summarize(rows, ms)
        meta = {"judge": j.describe(), "judge_stats": dict(j.stats), "metrics": ms, "reports": str(reports)}
        if out:
            atomic_write_text(out, "".join(json.dumps({**r, "judge": j.model_id}, ensure_ascii=False) + "\n" for r in rows))
        if summary_out:
            atomic_write_json(summary_out, {"summary": summ, **meta})
        systems = list(summ)
        keys = [k for k in next(iter(summ.values())) if k != "n_reports"]
        table = Table(title=f"drgym evaluate ({j.model_id})")
        table.add_column("metric")
        for system in systems:
            table.add_column(system, justify="right")
        table.add_row("reports", *[str(summ[x]["n_reports"]) for x in systems])
        for k in keys:
            table.add_row(k, *[("-" if summ[x].get(k) is None else f"{summ[x][k]:.4g}") for x in systems])
        Console().print(table)
        console.print(f"judge calls {j.stats['calls']}, cache hits {j.stats['cache_hits']}, retries {j.stats['retries']}, failures {j.stats['failures']}")
        if rows and all(r["failed"].get(m) for r in rows for m in ms):
            # Nothing was scored: say so with a failing exit status (the per-item file
            # above still records every failure).
            console.print("[red]error:[/red] every judge call failed; no report was scored (see the warnings above).")
            raise typer.Exit(1)
