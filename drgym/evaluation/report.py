"""Leaderboard of rollout runs: :func:`build_report` (markdown and a standalone HTML page).

Each run directory (written by :func:`drgym.evaluation.runner.run_rollout`) contributes one
row: its metrics (recomputed from ``trajectories.jsonl`` so a partial or interrupted run
is reported as it stands) beside its config (env, tasks, policy, backend, budgets).
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drgym.atomic import atomic_write_text
from drgym.errors import ConfigError
from drgym.evaluation.metrics import CI_METRICS, LABELS, episode_scores, format_value
from drgym.evaluation.runner import compute_metrics_for_run, read_run_episodes
from drgym.evaluation.stats import mean_ci

COLUMNS = ("em", "f1", "judge", "answer_rate", "invalid_action_rate", "turns", "searches", "fetches",
           "completion_tokens", "wall_s_per_episode")


@dataclass
class RunSummary:
    """One run directory, loaded.

    Attributes:
        path: the directory.
        name: its folder name.
        config: ``config.json`` (empty when missing).
        metrics: metrics recomputed from its trajectories.
        cis: ``{metric: {"mean", "lo", "hi"}}``, the 95% bootstrap interval over episodes
            of each of :data:`~drgym.evaluation.metrics.CI_METRICS` the run has
            (:func:`drgym.evaluation.stats.mean_ci`).
    """

    path: Path
    name: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    cis: dict[str, dict[str, float]] = field(default_factory=dict)

    def cell(self, key: str) -> str:
        """Metric ``key`` formatted for a table, with its 95% interval beside it when it
        has one: ``"0.500 [0.000, 1.000]"``, ``"75.0% [25.0%, 100.0%]"``; ``"-"`` when missing."""
        v = self.metrics.get(key)
        ci = self.cis.get(key)
        if v is None or ci is None:
            return format_value(key, v)
        return f"{format_value(key, v)} [{format_value(key, ci['lo'])}, {format_value(key, ci['hi'])}]"

    @property
    def setting(self) -> dict[str, str]:
        """Short config fields shown beside the scores."""
        c = self.config.get("config") or {}
        env = self.config.get("env") or {}
        be = self.config.get("backend") or {}
        idx = be.get("index") or {}
        return {
            "env": str(c.get("env", "?")).replace("drgym/", ""),
            "tasks": str(c.get("tasks", "?")),
            "policy": str(c.get("policy", "?")),
            "backend": f"{c.get('backend', '?')}" + (f" ({be.get('method')})" if be.get("method") else ""),
            "index": f"{idx.get('corpus', '')} {idx.get('n_passages', '')} {idx.get('manifest_fingerprint', '')}".strip(),
            "budget": f"turns {env.get('max_turns', '?')}, top-{env.get('top_k', '?')}",
        }


def load_run(path: str | Path) -> RunSummary:
    """Load one run directory.

    Raises:
        ConfigError: ``path`` holds no ``trajectories.jsonl``.
    """

    p = Path(path)
    tp = p / "trajectories.jsonl"
    if not tp.exists():
        raise ConfigError(f"{p} is not a rollout run directory: it has no trajectories.jsonl.")
    cfg: dict[str, Any] = {}
    if (p / "config.json").exists():
        try:
            cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            cfg = {}
    n = (cfg.get("config") or {}).get("n")
    rows = read_run_episodes(tp)  # a failed episode's redo replaces it (drgym.evaluation.runner)
    metrics = compute_metrics_for_run(rows)
    metrics["tasks_total"] = (cfg.get("tasks") or {}).get("n", n)
    cis = {k: mean_ci(v) for k, v in episode_scores(rows).items() if k in CI_METRICS}
    return RunSummary(path=p, name=p.name, config=cfg, metrics=metrics, cis=cis)


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories among ``paths`` (a folder of runs is expanded one level)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if (p / "trajectories.jsonl").exists():
            out.append(p)
        elif p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if (q / "trajectories.jsonl").exists()))
    seen, uniq = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            uniq.append(p)
    return uniq


def _sort_key(r: RunSummary) -> tuple:
    m = r.metrics
    return (r.setting["env"], r.setting["tasks"], -(m.get("f1") if m.get("f1") is not None else -1),
            -(m.get("em") or 0.0))


def leaderboard_rows(runs: list[RunSummary]) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of the leaderboard (markdown, HTML and the terminal):
    one row per run, best first within each env and task set; each score and the answer
    rate with its 95% interval over episodes beside the mean (:meth:`RunSummary.cell`)."""
    cols = [c for c in COLUMNS if any(r.metrics.get(c) is not None for r in runs)]
    head = ["run", "policy", "tasks", "episodes"] + [LABELS.get(c, c) for c in cols]
    body = [[r.name, r.setting["policy"], r.setting["tasks"],
             f"{r.metrics.get('episodes', 0)}/{r.metrics.get('tasks_total') or '?'}",
             *[r.cell(c) for c in cols]] for r in sorted(runs, key=_sort_key)]
    return head, body


def leaderboard_markdown(runs: list[RunSummary]) -> str:
    """The leaderboard as a markdown document (scores table with 95% intervals over
    episodes, then each run's config)."""
    head, body = leaderboard_rows(runs)
    lines = ["# drgym rollout leaderboard", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in body:
        lines.append("| " + " | ".join([row[0], f"`{row[1]}`", *row[2:]]) + " |")
    lines += ["", "Scores and answer rate: mean [95% bootstrap interval over episodes]."]
    lines += ["", "## Configurations", "", "| run | env | backend | index (corpus, passages, fingerprint) | budget | drgym | created |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=_sort_key):
        s = r.setting
        v = (r.config.get("versions") or {}).get("drgym", "?")
        lines.append(f"| {r.name} | {s['env']} | {s['backend']} | {s['index']} | {s['budget']} | {v} | {r.config.get('created', '?')} |")
    other = sorted({k for r in runs for k in (r.metrics.get("scores") or {}) if k not in ("em", "f1", "judge", "llm_match")})
    if other:
        lines += ["", "## Other reward components", "", "| run | " + " | ".join(other) + " |", "|---|" + "---|" * len(other)]
        for r in sorted(runs, key=_sort_key):
            sc = r.metrics.get("scores") or {}
            lines.append(f"| {r.name} | " + " | ".join(format_value(k, sc.get(k)) for k in other) + " |")
    lines.append("")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child,td.l{text-align:left}
details{margin:.5em 0}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}
img{max-width:32%;margin-right:1%}
"""


def leaderboard_html(runs: list[RunSummary], *, embed_plots: bool = True) -> str:
    """A standalone HTML page (inline CSS, plots embedded as base64 PNG, no external files)."""
    esc = html.escape
    cols = [c for c in COLUMNS if any(r.metrics.get(c) is not None for r in runs)]
    runs = sorted(runs, key=_sort_key)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>drgym leaderboard</title>",
             f"<style>{_CSS}</style></head><body><h1>drgym rollout leaderboard</h1><table><tr>"]
    for h in ["run", "env", "policy", "tasks", "backend", "episodes"] + [LABELS.get(c, c) for c in cols]:
        parts.append(f"<th>{esc(h)}</th>")
    parts.append("</tr>")
    for r in runs:
        s = r.setting
        ep = f"{r.metrics.get('episodes', 0)}/{r.metrics.get('tasks_total') or '?'}"
        cells = [f"<td class='l'>{esc(x)}</td>" for x in (r.name, s["env"], s["policy"], s["tasks"], s["backend"])]
        cells.append(f"<td>{esc(ep)}</td>")
        cells += [f"<td>{esc(r.cell(c))}</td>" for c in cols]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table><h2>Runs</h2>")
    for r in runs:
        parts.append(f"<details><summary><b>{esc(r.name)}</b> &mdash; {esc(r.setting['policy'])}</summary>")
        if embed_plots:
            for png in ("scores.png", "turns.png", "searches.png"):
                f = r.path / png
                if f.exists():
                    b64 = base64.b64encode(f.read_bytes()).decode()
                    parts.append(f"<img alt='{esc(png)}' src='data:image/png;base64,{b64}'>")
        cfg = {k: r.config.get(k) for k in ("config", "env", "policy", "backend", "tasks", "versions", "created") if k in r.config}
        parts.append(f"<pre>{esc(json.dumps(cfg, indent=2, ensure_ascii=False, default=str))}</pre>")
        m = {k: v for k, v in r.metrics.items()}
        parts.append(f"<pre>{esc(json.dumps(m, indent=2, ensure_ascii=False, default=str))}</pre></details>")
    parts.append("</body></html>\n")
    return "".join(parts)


def build_report(paths: list[str | Path], out: str | Path | None = None) -> tuple[list[RunSummary], str, str]:
    """Load runs, build the markdown and HTML leaderboards, and write them when ``out`` is set.

    Args:
        paths: run directories (or folders of them).
        out: path stem; writes ``<out>.md`` and ``<out>.html``. None writes nothing.

    Returns:
        ``(runs, markdown, html)``.

    Raises:
        ConfigError: no run directory among ``paths``.
    """
    dirs = find_runs(paths)
    if not dirs:
        raise ConfigError(f"No rollout run directory (with trajectories.jsonl) in: {', '.join(map(str, paths))}.")
    runs = [load_run(d) for d in dirs]
    md = leaderboard_markdown(runs)
    page = leaderboard_html(runs)
    if out is not None:
        stem = Path(out)
        if stem.suffix in (".md", ".html"):
            stem = stem.with_suffix("")
        atomic_write_text(stem.with_suffix(".md"), md)
        atomic_write_text(stem.with_suffix(".html"), page)
    return runs, md, page
