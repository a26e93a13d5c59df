"""The generalisation study: the same policies and tasks over several search backends.

DeepResearchGym (arXiv 2505.19253) claims that systems keep their ranking when moved
from commercial web search to its local engine, and that an agent trained locally
still works on commercial search. :func:`run_compare` makes that one command:

1. for each backend spec (``local``, ``serper``, ``tavily``, ``brave``,
   ``deepresearchgym``, ``http://host:port``; :mod:`drgym.search.registry`), build it,
   live or from a recording (``replay``/``record``), wrapped in a
   :class:`~drgym.search.accounting.MeteredBackend` that counts calls, latency and cost;
2. for each policy, run the rollout runner (``drgym rollout``'s code path) on the same
   tasks, into ``OUT/runs/<policy>__<backend>/`` (config.json, trajectories.jsonl,
   metrics.json);
3. write a side-by-side table (``compare.md``, ``compare.html``, ``compare.png``,
   ``compare.json``): task scores (EM/F1 for short answers, KPR/KPC/citation metrics
   for research tasks, whatever reward components the runs produced), answer rate,
   search/fetch calls, search latency (median, p95), cost at list price, and when each
   replayed backend's answers were recorded;
4. when more than one policy is given, Kendall's tau-b (Kendall 1945, "The treatment of
   ties in ranking problems"; ``scipy.stats.kendalltau``) between the policies' scores
   on every pair of backends: tau = 1 means the backends rank the policies identically.

Costs: ``cost_usd`` is calls x list price (:data:`drgym.search.accounting.DEFAULT_PRICES`,
override with ``prices``), i.e. what the calls cost (or would cost) live; ``billed_usd``
counts only calls that actually went to the provider (0 when replayed).
"""

from __future__ import annotations

import html
import logging
import math
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym

import drgym.envs  # noqa: F401  (registers the ids)
from drgym.atomic import atomic_write_json, atomic_write_text
from drgym.errors import ConfigError
from drgym.evaluation.metrics import CI_METRICS, episode_scores
from drgym.evaluation.run_directory import read_run_episodes
from drgym.evaluation.runner import RolloutConfig, run_rollout
from drgym.evaluation.stats import mean_ci
from drgym.policies.factory import make_policy, parse_options
from drgym.search.accounting import MeteredBackend, default_price
from drgym.search.record import RecordStore
from drgym.search.registry import make_backend, record_name

log = logging.getLogger(__name__)

#: Score columns shown first when present (others follow alphabetically).
SCORE_ORDER = ("em", "f1", "cover_em", "judge", "kpr", "kpc", "citation_precision", "citation_recall", "quality", "race")
SCORE_LABELS = {"em": "EM", "f1": "F1", "cover_em": "cover-EM", "judge": "judge", "kpr": "KPR", "kpc": "KPC",
                "citation_precision": "cit. prec.", "citation_recall": "cit. recall", "quality": "quality", "race": "RACE"}


def slug(text: str) -> str:
    """A file-name-safe form of a spec (``"http://127.0.0.1:8000"`` -> ``"http-127.0.0.1-8000"``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def parse_policy_entry(entry: str) -> tuple[str, dict[str, Any]]:
    """``"scripted fetch=false"`` -> ``("scripted", {"fetch": False})``.

    A policy entry is a spec followed by optional ``KEY=VALUE`` options (values read as
    JSON when they parse), separated by spaces, so one ``compare`` run can hold two
    variants of the same policy kind.

    Raises:
        ConfigError: empty entry or an option without ``=``.
    """

    parts = shlex.split(entry)
    if not parts:
        raise ConfigError("empty --policy entry; give e.g. 'scripted' or 'hf:smollm2 max_new_tokens=64'.")
    return parts[0], parse_options(parts[1:])


@dataclass
class CompareRow:
    """One (policy, backend) cell of the study.

    Attributes:
        policy: the policy entry as given.
        backend: the backend spec.
        mode: ``"live"``, ``"record"`` or ``"replay"``.
        metrics: the runner's metrics.json (see :func:`drgym.evaluation.metrics.compute_metrics`).
        usage: :meth:`drgym.search.accounting.SearchUsage.to_dict` of the backend during the run.
        billed_usd: cost of the calls that reached the provider (0 for replay).
        recorded: for replayed/recorded backends, ``{"first_recorded_at", "last_recorded_at"}``.
        run_dir: where the run's files are.
        cis: ``{score: {"mean", "lo", "hi"}}``, the 95% bootstrap interval over episodes of
            each of :data:`~drgym.evaluation.metrics.CI_METRICS` the run has (read from its
            ``trajectories.jsonl``; empty when there is none), shown beside the means.
    """

    policy: str
    backend: str
    mode: str
    metrics: dict[str, Any]
    usage: dict[str, Any]
    billed_usd: float
    recorded: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""
    cis: dict[str, dict[str, float]] = field(default_factory=dict)

    def score(self, key: str) -> float | None:
        """The mean of score ``key`` (``"f1"``, ``"kpr"``...), or None."""
        v = (self.metrics.get("scores") or {}).get(key, self.metrics.get(key))
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "backend": self.backend, "mode": self.mode, "metrics": self.metrics,
                "usage": self.usage, "billed_usd": self.billed_usd, "recorded": self.recorded, "run_dir": self.run_dir,
                "cis": self.cis}

    def cell(self, key: str, value: float | None, nd: int = 3) -> str:
        """``value`` (the mean of ``key``) formatted, with its 95% interval beside it when
        the row has one: ``"0.400 [0.200, 0.600]"``."""
        ci = self.cis.get(key)
        if value is None or ci is None:
            return _fmt(value, nd)
        return f"{_fmt(value, nd)} [{_fmt(ci['lo'], nd)}, {_fmt(ci['hi'], nd)}]"


def kendall_taus(rows: list[CompareRow], metric: str) -> list[dict[str, Any]]:
    """Kendall's tau-b between the policies' ``metric`` on each pair of backends.

    Args:
        rows: study rows; policies missing a score on either backend are left out of
            that pair.
        metric: score key (``"f1"``, ``"kpr"``...).

    Returns:
        One dict per backend pair ``{"a", "b", "tau", "p_value", "n_policies"}``; ``tau``
        and ``p_value`` are None with fewer than 2 policies or when one side has all
        scores tied (tau is undefined).
    """
    from scipy.stats import kendalltau

    backends = list(dict.fromkeys(r.backend for r in rows))
    by = {(r.policy, r.backend): r.score(metric) for r in rows}
    policies = list(dict.fromkeys(r.policy for r in rows))
    out = []
    for i, a in enumerate(backends):
        for b in backends[i + 1:]:
            pol = [p for p in policies if by.get((p, a)) is not None and by.get((p, b)) is not None]
            xa, xb = [by[(p, a)] for p in pol], [by[(p, b)] for p in pol]
            tau = pv = None
            if len(pol) >= 2 and len(set(xa)) > 1 and len(set(xb)) > 1:
                res = kendalltau(xa, xb)
                tau, pv = float(res.statistic), float(res.pvalue)
            out.append({"a": a, "b": b, "tau": tau, "p_value": pv, "n_policies": len(pol)})
    return out


def run_cis(run_dir: str | Path) -> dict[str, dict[str, float]]:
    """``{score: {"mean", "lo", "hi"}}`` of a run directory's episodes
    (:func:`drgym.evaluation.metrics.episode_scores`, :func:`drgym.evaluation.stats.mean_ci`);
    empty when it holds no ``trajectories.jsonl`` (a run function that writes none)."""
    tp = Path(run_dir) / "trajectories.jsonl"
    if not tp.exists():
        return {}
    return {k: mean_ci(v) for k, v in episode_scores(read_run_episodes(tp)).items() if k in CI_METRICS}


def _score_keys(rows: list[CompareRow]) -> list[str]:
    keys: set[str] = set()
    for r in rows:
        keys.update(k for k, v in (r.metrics.get("scores") or {}).items() if v is not None)
    return [k for k in SCORE_ORDER if k in keys] + sorted(keys - set(SCORE_ORDER))


def _fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table_rows(rows: list[CompareRow]) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of the side-by-side table (shared by md and HTML)."""
    keys = _score_keys(rows)
    header = (["policy", "backend", "mode", "episodes"] + [SCORE_LABELS.get(k, k) for k in keys]
              + ["answer rate", "searches/ep", "fetches/ep", "search calls", "fetch calls", "errors",
                 "search median s", "search p95 s", "cost USD", "billed USD"])
    body = []
    for r in rows:
        m, u = r.metrics, r.usage
        lat = u.get("search_latency") or {}
        body.append(
            [r.policy, r.backend, r.mode, str(m.get("episodes", 0))]
            + [r.cell(k, r.score(k)) for k in keys]
            + [r.cell("answer_rate", m.get("answer_rate")), _fmt(m.get("searches"), 2), _fmt(m.get("fetches"), 2),
               str(u.get("searches", 0)), str(u.get("fetches", 0)), str(u.get("errors", 0)),
               _fmt(lat.get("median_s"), 4), _fmt(lat.get("p95_s"), 4),
               f"{u.get('cost_usd', 0.0):.4f}", f"{r.billed_usd:.4f}"]
        )
    return header, body


def _provenance(rows: list[CompareRow]) -> list[str]:
    lines = []
    for b in dict.fromkeys(r.backend for r in rows):
        rec = next((r.recorded for r in rows if r.backend == b and r.recorded), None)
        if rec and rec.get("first_recorded_at"):
            lat = rec.get("search_latency_median_s")
            lat_txt = f"; median live search latency then {1000 * lat:.1f} ms" if lat is not None else ""
            lines.append(f"{b}: answers recorded between {rec['first_recorded_at']} and {rec['last_recorded_at']} (UTC)"
                         f"{lat_txt}")
    return lines


def render_markdown(rows: list[CompareRow], taus: list[dict[str, Any]], metric: str, title: str = "") -> str:
    """The study as a markdown document: table, rank correlations, provenance."""
    header, body = table_rows(rows)
    out = [f"# {title or 'Search backend comparison'}", ""]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(header))) + "|")
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    out.append("")
    if taus:
        out += [f"## Rank correlation of policies across backends (Kendall tau-b on {SCORE_LABELS.get(metric, metric)})", "",
                "| backend A | backend B | tau | p-value | policies |", "|---|---|---:|---:|---:|"]
        out += [f"| {t['a']} | {t['b']} | {_fmt(t['tau'])} | {_fmt(t['p_value'])} | {t['n_policies']} |" for t in taus]
        out.append("")
    prov = _provenance(rows)
    if prov:
        out += ["## When the web was seen", ""] + [f"- {p}" for p in prov] + [""]
    if any(r.cis for r in rows):
        out.append("Scores and answer rate: mean [95% bootstrap interval over the run's episodes].\n")
    out.append("Cost USD = search calls x list price per call; billed USD counts only calls sent to the provider "
               "(replayed calls cost nothing). Latency is wall time per search query as seen by the env "
               "(for a replayed backend: the lookup in the recording; its live latency is under \"When the web was seen\").")
    return "\n".join(out) + "\n"


def render_html(rows: list[CompareRow], taus: list[dict[str, Any]], metric: str, title: str = "",
                png_name: str | None = "compare.png") -> str:
    """The study as a self-contained HTML page (table, rank correlations, chart)."""
    header, body = table_rows(rows)
    e = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{e(title or 'Search backend comparison')}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}td:nth-child(-n+3),th{text-align:left}"
        "th{background:#eee}</style></head><body>",
        f"<h1>{e(title or 'Search backend comparison')}</h1>",
        "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>",
    ]
    parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in body]
    parts.append("</table>")
    if taus:
        parts.append(f"<h2>Rank correlation of policies across backends (Kendall tau-b on {e(SCORE_LABELS.get(metric, metric))})</h2>")
        parts.append("<table><tr><th>backend A</th><th>backend B</th><th>tau</th><th>p-value</th><th>policies</th></tr>")
        parts += [f"<tr><td>{e(t['a'])}</td><td>{e(t['b'])}</td><td>{_fmt(t['tau'])}</td><td>{_fmt(t['p_value'])}</td>"
                  f"<td>{t['n_policies']}</td></tr>" for t in taus]
        parts.append("</table>")
    prov = _provenance(rows)
    if prov:
        parts.append("<h2>When the web was seen</h2><ul>" + "".join(f"<li>{e(p)}</li>" for p in prov) + "</ul>")
    if png_name:
        parts.append(f"<img src='{e(png_name)}' alt='scores and latency per backend' style='max-width:100%'>")
    parts.append("<p>Cost USD = search calls x list price per call; billed USD counts only calls sent to the provider.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_png(rows: list[CompareRow], metric: str, path: str | Path) -> None:
    """Grouped bars: ``metric`` per backend for each policy; median search latency per
    backend, labelled with the list-price cost of its runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(dict.fromkeys(r.backend for r in rows))
    policies = list(dict.fromkeys(r.policy for r in rows))
    by = {(r.policy, r.backend): r for r in rows}
    modes = {r.backend: r.mode for r in rows}
    labels = [b if modes[b] == "live" else f"{b}\n({modes[b]})" for b in backends]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(backends) + 4), 4))
    width = 0.8 / max(1, len(policies))
    for j, p in enumerate(policies):
        xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(backends))]
        ys = [(by[(p, b)].score(metric) if (p, b) in by else None) or 0.0 for b in backends]
        ax1.bar(xs, ys, width=width, label=p)
    ax1.set_xticks(range(len(backends)), labels, rotation=15)
    ax1.set_ylabel(SCORE_LABELS.get(metric, metric))
    ax1.set_title(f"{SCORE_LABELS.get(metric, metric)} by backend")
    ax1.legend(fontsize=8)
    med = []
    for b in backends:
        vals = [(by[(p, b)].usage.get("search_latency") or {}).get("median_s") for p in policies if (p, b) in by]
        vals = [v for v in vals if v is not None]
        med.append(1000 * sum(vals) / len(vals) if vals else 0.0)
    bars = ax2.bar(range(len(backends)), med, color="gray")
    for b, bar in zip(backends, bars):  # list-price cost of all runs on this backend
        cost = sum(r.usage.get("cost_usd", 0.0) for r in rows if r.backend == b)
        ax2.annotate(f"${cost:.3f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                     ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(range(len(backends)), labels, rotation=15)
    ax2.set_ylabel("median search latency (ms)")
    ax2.set_title("search latency (label: cost at list price)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def default_metric(rows: list[CompareRow]) -> str:
    """``"f1"`` when the runs have F1, else ``"kpr"``, else the first score present."""
    keys = _score_keys(rows)
    for k in ("f1", "kpr"):
        if k in keys:
            return k
    return keys[0] if keys else "reward"


def write_report(rows: list[CompareRow], out: str | Path, *, metric: str | None = None, title: str = "",
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``compare.{md,html,png,json}`` under ``out`` (each atomically).

    Returns:
        The compare.json content: ``{"metric", "rows", "kendall_tau", ...extra}``.
    """
    out = Path(out)
    metric = metric or default_metric(rows)
    n_pol = len(set(r.policy for r in rows))
    taus = kendall_taus(rows, metric) if n_pol > 1 else []
    atomic_write_text(out / "compare.md", render_markdown(rows, taus, metric, title))
    render_png(rows, metric, out / "compare.png")
    atomic_write_text(out / "compare.html", render_html(rows, taus, metric, title))
    result = {"metric": metric, "rows": [r.to_dict() for r in rows], "kendall_tau": taus, **(extra or {})}
    atomic_write_json(out / "compare.json", result)
    return result


# -- running the study --------------------------------------------------------------------

RunFn = Callable[..., dict[str, Any]]


def _is_local(spec: str) -> bool:
    s = spec.strip().lower()
    return s == "local" or s.startswith("local:")


def backend_mode(spec: str, *, replay: str | Path | None, record: str | Path | None) -> str:
    """Mode of ``spec`` in a study: local engines always run live; other backends are
    replayed from ``replay``, recorded into ``record``, or live."""
    if _is_local(spec):
        return "live"
    if replay is not None:
        return "replay"
    if record is not None:
        return "record"
    return "live"


def run_compare(
    *,
    policies: list[str],
    tasks: str,
    backends: list[str],
    out: str | Path,
    n: int | None = None,
    replay: str | Path | None = None,
    record: str | Path | None = None,
    prices: dict[str, float] | None = None,
    backend_options: dict[str, dict[str, Any]] | None = None,
    run_options: dict[str, Any] | None = None,
    metric: str | None = None,
    run_fn: RunFn | None = None,
) -> dict[str, Any]:
    """Run every policy over every backend on the same tasks and write the report.

    Args:
        policies: policy entries (``"scripted"``, ``"hf:smollm2 max_new_tokens=64"``).
        tasks: a task-set name (``"hotpotqa-dev"``...) or a tasks file, as ``drgym rollout``.
        backends: backend specs (see :mod:`drgym.search.registry`).
        out: output folder (created).
        n: episodes per run (first ``n`` tasks); None: all tasks.
        replay: a recording to replay every non-local backend from (offline).
        record: a recording to write every non-local backend's answers into.
        prices: USD per search call by backend spec (default list prices).
        backend_options: constructor options per backend spec (e.g. ``{"local": {"method": "bm25"}}``).
        run_options: passed to the rollout runner (env budgets, batch size, seed...).
        metric: score used for the Kendall tau and the chart (default F1, else KPR).
        run_fn: runs one cell and returns its metrics (default :func:`rollout_run`, the
            ``drgym rollout`` runner); called with ``policy, tasks, backend, out, n,
            backend_spec, backend_mode, policy_obj`` and ``run_options``.

    Returns:
        The compare.json content.

    Raises:
        ConfigError: no policy/backend, both ``replay`` and ``record``, unknown spec.
        AuthError: a live web backend without its key.
        ReplayMissError is not raised: a miss is recorded in the trajectory like any
        search failure (and counted in the ``errors`` column).
    """
    if not policies:
        raise ConfigError("compare needs at least one --policy.")
    if not backends:
        raise ConfigError("compare needs at least one backend (--backends local,serper).")
    if replay is not None and record is not None:
        raise ConfigError("give --replay or --record, not both.")
    if replay is not None and not Path(replay).is_file():
        raise ConfigError(f"--replay {replay}: no such recording.")
    run_fn = run_fn or rollout_run
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prices = prices or {}
    rows: list[CompareRow] = []
    t_start = time.perf_counter()

    built: dict[str, Any] = {}  # each policy is built once and reused on every backend
    try:
        for entry in policies:
            spec_p, opts_p = parse_policy_entry(entry)
            built[entry] = make_policy(spec_p, **opts_p)
            built[entry].name = spec_p
        _run_all(rows, policies, built, tasks, backends, out, n, replay, record, prices, backend_options,
                 run_options, run_fn)
    finally:
        for p in built.values():
            p.close()
    extra = {"tasks": tasks, "n": n, "backends": backends, "policies": policies,
             "replay": str(replay) if replay else None, "record": str(record) if record else None,
             "wall_s": round(time.perf_counter() - t_start, 3)}
    return write_report(rows, out, metric=metric, title=f"Search backend comparison on {tasks}", extra=extra)


def _run_all(rows, policies, built, tasks, backends, out, n, replay, record, prices, backend_options, run_options,
             run_fn) -> None:
    for spec in backends:
        mode = backend_mode(spec, replay=replay, record=record)
        store = replay if mode == "replay" else record if mode == "record" else None
        opts = dict((backend_options or {}).get(spec, {}))
        inner = make_backend(spec, mode=mode, store=store, **opts)
        price = prices.get(spec, default_price(record_name(spec)))
        try:
            for entry in policies:
                metered = MeteredBackend(inner, price_per_search=price, close_inner=False)
                before_live = getattr(inner, "live_searches", None)
                run_dir = out / "runs" / f"{slug(entry)}__{slug(spec)}"
                log.info("compare: %s on %s (%s) -> %s", entry, spec, mode, run_dir)
                metrics = run_fn(policy=entry, tasks=tasks, backend=metered, out=run_dir, n=n, backend_spec=spec,
                                 backend_mode=mode, policy_obj=built.get(entry), **(run_options or {}))
                usage = metered.usage.to_dict()
                if before_live is None:  # a bare live backend: every call was billed
                    billed = usage["cost_usd"] if mode == "live" else 0.0
                else:
                    billed = (getattr(inner, "live_searches", 0) - before_live) * price
                recorded: dict[str, Any] = {}
                if store is not None:
                    s = RecordStore(store, readonly=True)
                    try:
                        recorded = s.summary().get(getattr(inner, "name", spec), {})
                    finally:
                        s.close()
                rows.append(CompareRow(policy=entry, backend=spec, mode=mode, metrics=metrics, usage=usage,
                                       billed_usd=billed, recorded=recorded, run_dir=str(run_dir),
                                       cis=run_cis(run_dir)))
        finally:
            inner.close()


def web_env_id(env: str) -> str:
    """The ``-Web`` variant of a drgym env id (registered as nondeterministic, for live web
    backends), when it is registered: ``drgym/SearchQA-v0`` -> ``drgym/SearchQA-Web-v0``."""

    if "-Web-" in env:
        return env
    web = re.sub(r"-v(\d+)$", r"-Web-v\1", env)
    return web if web in gym.registry else env


def rollout_run(
    *,
    policy: str,
    tasks: str,
    backend: Any,
    out: str | Path,
    n: int | None,
    backend_spec: str,
    backend_mode: str,
    policy_obj: Any = None,
    env: str = "drgym/SearchQA-v0",
    seed: int = 0,
    batch_size: int = 8,
    max_turns: int | None = None,
    judge: str | None = None,
    rewards: list[str] | None = None,
    env_options: dict[str, Any] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """One cell of the study through the rollout runner (:func:`drgym.evaluation.runner.run_rollout`).

    The run directory is started fresh (``fresh=True``) so that the metered calls,
    latency and cost cover every episode of the run. A nondeterministic backend (live or
    recording web search) runs in the env's ``-Web`` id; a replayed one is deterministic
    and keeps ``env``.

    Returns:
        The run's metrics (also in ``out/metrics.json``).
    """

    env = web_env_id(env) if not getattr(backend, "deterministic", True) else env
    spec, opts = parse_policy_entry(policy)
    cfg = RolloutConfig(
        env=env, tasks=tasks, policy=spec,
        backend=backend_spec if backend_mode == "live" else f"{backend_spec} ({backend_mode})",
        n=n, out=str(out), seed=seed, batch_size=batch_size, max_turns=max_turns, judge=judge, rewards=rewards,
        policy_options=opts, env_options=dict(env_options or {}), plots=False,
    )
    res = run_rollout(cfg, policy=policy_obj, backend=backend, progress=progress, fresh=True)
    return res.metrics
