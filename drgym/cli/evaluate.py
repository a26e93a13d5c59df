"""``drgym evaluate``: score a file of reports with judge-based metrics.

The scoring lives in :mod:`drgym.evaluation.judged` (:class:`ReportScoring`: the input
formats, the judge, one reward per metric, the per-system summary); this module parses
the options, calls it and prints.

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

from pathlib import Path
from typing import Optional

import typer

from drgym.evaluation.judged import METRICS, SCALES, load_key_points, read_reports, summarize  # noqa: F401  (re-exported)

__all__ = ["METRICS", "SCALES", "load_key_points", "read_reports", "register", "summarize"]


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

        from drgym.errors import ConfigError, ServiceUnavailableError
        from drgym.evaluation.judged import NoReportsError, ReportScoring, parse_metrics

        console = Console(stderr=True)
        if judge is None:
            raise typer.BadParameter(
                "every metric here is scored by an LLM judge: name one, e.g. --judge openai:MODEL@BASE_URL "
                "(a vLLM server of any instruct model works). --judge hf:smollm2 runs the bundled 135M model, "
                "but it is not a valid judge (Cohen's kappa 0.0) and its scores are flagged.", param_hint="--judge")
        try:
            ms = parse_metrics(metrics)
        except ConfigError as e:
            raise typer.BadParameter(str(e), param_hint="--metrics") from None
        try:
            scoring = ReportScoring(reports, ms, judge, backend=backend, key_points=key_points, criteria=criteria,
                                    references=references, cache=cache, concurrency=concurrency, n_samples=n_samples,
                                    timeout_s=timeout_s, max_attempts=max_attempts, batch_size=batch_size, limit=limit)
        except NoReportsError as e:
            raise typer.BadParameter(str(e), param_hint="--reports") from None
        if not scoring.valid:
            console.print(f"[bold yellow]warning:[/] judge {scoring.judge.model_id} is {scoring.note}.")
        try:
            with Progress(console=console, transient=False) as prog:
                bar = prog.add_task("scoring", total=len(scoring.items) * len(ms))
                rows = scoring.score(on_progress=lambda n: prog.advance(bar, n))
        except ConfigError as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        except ServiceUnavailableError as e:
            console.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(75) from None
        j = scoring.judge
        summ = summarize(rows, ms)
        undefined = scoring.undefined_kpr(rows)
        if undefined:
            console.print(f"[bold yellow]warning:[/] KPR is undefined for {len(undefined)} report(s) with no key points "
                          f"(ids {', '.join(undefined[:8])}{' ...' if len(undefined) > 8 else ''}): excluded from KPR/KPC, "
                          "counted in kpr/undefined (pass --key-points to score them).")
        scoring.write(rows, summ, out=out, summary_out=summary_out)
        systems = list(summ)
        keys = [k for k in next(iter(summ.values())) if k != "n_reports"]
        title = f"drgym evaluate ({j.model_id})" if scoring.valid else f"drgym evaluate ({j.model_id}: NOT A VALID JUDGE, scores are not results)"
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("scale")
        for system in systems:
            table.add_column(system, justify="right")
        table.add_row("reports", "count", *[str(summ[x]["n_reports"]) for x in systems])
        for k in keys:
            table.add_row(k, SCALES.get(k, "count"), *[("-" if summ[x].get(k) is None else f"{summ[x][k]:.4g}") for x in systems])
        Console().print(table)
        if not scoring.valid:
            console.print(f"[bold yellow]warning:[/] these scores come from {j.model_id}, {scoring.note}.")
        console.print(f"judge calls {j.stats['calls']}, cache hits {j.stats['cache_hits']}, retries {j.stats['retries']}, failures {j.stats['failures']}")
        if rows and all(r["failed"].get(m) for r in rows for m in ms):
            # Nothing was scored: say so with a failing exit status (the per-item file
            # above still records every failure).
            console.print("[red]error:[/red] every judge call failed; no report was scored (see the warnings above).")
            raise typer.Exit(1)
