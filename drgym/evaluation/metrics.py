"""Aggregate episode records (trajectory dicts) into run metrics.

Definitions (every mean is over the episodes of the run, each episode weighted 1):

- ``em`` / ``f1`` / ``cover_em``: exact match, token F1 and cover-EM of the final answer
  against the gold aliases, as the official HotpotQA evaluation computes them
  (``hotpot_evaluate_v1.py``: SQuAD normalisation, F1 0 when a yes/no/noanswer side
  differs; max over aliases as FlashRAG; see :mod:`drgym.rewards.qa`), with no answer
  guard. A truncated episode (no answer) scores 0.
- ``judge``: the LLM-judge soft match (DeepResearchGym arXiv 2505.19253 section 3.2,
  "LLM-as-a-judge" for short answers), mean over episodes the judge scored.
- ``judge_failures``: episode scores of judged rewards (``judge``, ``race``,
  ``citation``, ``kpr``, ``quality``, ``fact``) that are None because the judge failed
  after its retries; they are excluded from the means.
- ``kpr_undefined``: episodes whose task has no key points: KPR is undefined (None, not
  a judge failure), excluded from the KPR mean.
- ``judge_model`` (written by the runner): ``{"spec", "valid", "note"}``; ``valid`` is
  False for a judge drgym measured as no judge (``hf:smollm2``).
- other reward components (``kpr``, ``kpc``, ``citation_precision``, ``quality``,
  ``race``...): mean over episodes where they are not None.
- ``answer_rate``: share of episodes that ended with an answer (``terminated``).
- ``invalid_action_rate``: invalid actions / all actions (turns).
- ``turns``, ``searches``, ``fetches``: per episode.
- ``completion_tokens`` / ``prompt_tokens``: per episode, summed over its turns (prompt
  tokens are re-counted every turn, as a server bills them).
- ``wall_s``: the run's wall time in seconds, summed over its sessions' episode loops
  (model loading excluded): each flush of finished episodes shares the time since the
  previous one out among them (``metadata["wall_share_s"]``).
  ``wall_s_per_episode``: ``wall_s`` / episodes, the throughput figure (what an episode
  costs the run: with a batch of 8 episodes stepped together, about an eighth of one
  episode's duration). ``episode_latency_s``: mean seconds from an episode's first turn
  to its end, while it shared the batch with others, so about ``wall_s_per_episode``
  times the batch size; it is not what an episode costs.
- ``errors``: episodes in which a search or fetch failed (shown to the agent) or a model
  request failed (the server refused it; its turn is an empty action). A search server
  or model endpoint that is down stops the run instead (see
  :mod:`drgym.evaluation.faults`), so such episodes are never counted here.
- ``failed``: episodes with a backend or policy failure (:func:`episode_failures`: a
  search the engine did not answer, e.g. HTTP 401, a model request the server refused);
  they are in the means (scored as they ended) but are not complete: a rerun of the run
  redoes them. ``failure_reasons``: episodes per reason.
- ``gold_evidence`` (written by the runner): for tasks with gold documents
  (``Task.gold_docs``), the share of them each episode retrieved and cited, per episode
  and as means (:func:`evidence_recall`); None when no task has any.
- ``calibration`` (written by the runner): accuracy and BrowseComp's calibration error
  over the answers given in its format (``Exact Answer:`` / ``Confidence:`` lines;
  :func:`calibration`); None when no answer is.
- ``wall_share``: shares of the run's wall time (``wall_s``) spent in generation,
  search (and fetch), reward scoring and the env (the rest), summed from each episode's
  ``metadata["wall_phases_s"]``: the loop's own clocks, shared out like ``wall_s``, so a
  first run and its resume give the same figures. ``wall_phases_s``: those seconds.
  ``wall_share_episodes``: the episodes that record them (records of an older drgym do
  not).
- ``time_share``: shares of the summed per-episode timings (``timings_s``; generation is
  split evenly over a batch's rows, but each env records the whole latency of its
  batched search, so search is over-weighted by the batch size): use ``wall_share``
  for where the time went. The runner's ``last_session`` entry holds the shares of the
  last session's episode loop alone.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from rich.table import Table
from rich.text import Text

from drgym.corpus.urls import normalize_url
from drgym.rewards.calibration import expected_calibration_error

PHASES = ("generation", "search", "env", "reward")
HEADLINE = ("em", "f1", "judge", "answer_rate", "invalid_action_rate", "turns", "searches", "fetches",
            "completion_tokens", "wall_s_per_episode")
_NON_SCORE_COMPONENTS = {"format_penalty"}


def _mean(xs: list[float]) -> float | None:
    xs = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def episode_counts(t: dict[str, Any]) -> dict[str, int]:
    """Turns, searches, fetches and invalid actions of one trajectory dict."""
    steps = t.get("steps") or []
    names = [c.get("name") for s in steps for c in (s.get("tool_calls") or [])]
    return {
        "turns": len(steps),
        "searches": names.count("search"),
        "fetches": names.count("fetch"),
        "invalid": names.count("invalid"),
    }


def episode_tokens(t: dict[str, Any]) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` summed over the episode's turns."""
    usage = (t.get("metadata") or {}).get("usage") or []
    return (sum(int(u.get("prompt_tokens") or 0) for u in usage), sum(int(u.get("completion_tokens") or 0) for u in usage))


def episode_has_error(t: dict[str, Any]) -> bool:
    """True when a search/fetch of the episode failed (``steps[i].error``) or a model
    request failed (a turn whose usage says ``finish == "error"``)."""
    if any(s.get("error") for s in t.get("steps") or []):
        return True
    return any(u.get("finish") == "error" for u in (t.get("metadata") or {}).get("usage") or [] if isinstance(u, dict))


AGENT_ERRORS = frozenset({"BadQueryError", "DocumentNotFoundError", "UnsupportedContentError", "FetchRefusedError"})
"""Step errors the agent's own call caused (an empty or rejected query, a URL that does
not exist or was in no search result, a page that is not text): shown to it as an
observation, part of a complete episode. A fetch of a web page that failed (the
:class:`~drgym.search.pages.PageFetcher`'s errors name the page first: ``"Fetch failed:
SearchError: https://...: HTTP 503 ..."``) is one too: the web, not the engine, failed."""

_STEP_ERROR = re.compile(r"(?:^|; )([A-Z][A-Za-z]*) failed: ([A-Za-z_]\w*)(?=\W|$)")
_HTTP = re.compile(r"HTTP (\d{3})")
_PAGE = re.compile(r":\s*https?://")  # a page fetcher's error: it names the page first


def episode_failures(t: dict[str, Any]) -> list[str]:
    """The backend and policy failures of one trajectory dict, one short reason each.

    A step error (``steps[i].error``, ``"Search failed: AuthError: ..."``) is a backend
    failure unless the agent caused it or a web page failed (:data:`AGENT_ERRORS`); a turn whose usage says
    ``finish == "error"`` is a policy failure (the model's server refused the request).
    An episode with any failure is not complete: its results or turns are not the
    engine's or the model's, so the rollout runner records it and redoes it on the next
    run (:mod:`drgym.evaluation.runner`).

    Returns:
        Reasons such as ``"search AuthError (HTTP 401)"`` or ``"policy request failed
        (HTTP 404)"``, in turn order (empty: a complete episode).
    """
    out: list[str] = []
    for s in t.get("steps") or []:
        err = s.get("error") if isinstance(s, dict) else None
        if not err:
            continue
        err = str(err)
        found = list(_STEP_ERROR.finditer(err))
        if not found:
            out.append(f"step error: {err[:80]}")
        for i, m in enumerate(found):
            tool, kind = m.group(1), m.group(2)
            piece = err[m.end(): found[i + 1].start() if i + 1 < len(found) else len(err)]
            if kind in AGENT_ERRORS or (tool == "Fetch" and _PAGE.match(piece)):
                continue
            code = _HTTP.search(piece)
            out.append(f"{tool.lower()} {kind}" + (f" (HTTP {code.group(1)})" if code else ""))
    for u in (t.get("metadata") or {}).get("usage") or []:
        if isinstance(u, dict) and u.get("finish") == "error":
            msg = " ".join(str(u.get("error") or "").split())
            code = _HTTP.search(msg)
            out.append("policy request failed" + (f" (HTTP {code.group(1)})" if code else (f": {msg[:60]}" if msg else "")))
    return out


def failure_counts(trajectories: list[dict[str, Any]]) -> dict[str, int]:
    """Episodes per failure reason (:func:`episode_failures`; an episode counts once per
    reason), most frequent first."""
    counts: dict[str, int] = {}
    for t in trajectories:
        for r in dict.fromkeys(episode_failures(t)):
            counts[r] = counts.get(r, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


JUDGED = ("judge", "llm_match", "race", "citation", "kpr", "quality", "fact")
"""Reward names scored by an LLM judge (a None score is a judge failure)."""


def _judge_failed(rc: dict[str, Any], k: str) -> bool:
    """A judged reward's None that is a judge failure (not a KPR left undefined by a task without key points)."""
    return k in rc and rc[k] is None and not (k == "kpr" and rc.get("kp_undefined"))


CI_METRICS = ("em", "f1", "judge", "answer_rate")
"""The per-episode scores whose means ``drgym report`` and ``drgym compare`` show with a
95% bootstrap interval (:func:`episode_scores`, :func:`drgym.evaluation.stats.mean_ci`)."""


def episode_scores(trajectories: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each episode's value of the :data:`CI_METRICS`, the values whose means
    :func:`compute_metrics` reports: ``em`` and ``f1`` from the reward components (episodes
    without a finite number left out), ``judge`` from ``judge`` or else ``llm_match``,
    ``answer_rate`` 1.0 for an episode that ended with an answer, else 0.0. A metric no
    episode has is left out.

    >>> episode_scores([{"reward_components": {"em": 1.0}, "terminated": True, "final_answer": "x"},
    ...                 {"reward_components": {"em": None}, "terminated": False}])
    {'em': [1.0], 'answer_rate': [1.0, 0.0]}
    """
    def values(key: str) -> list[float]:
        out = []
        for t in trajectories:
            v = (t.get("reward_components") or {}).get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append(float(v))
        return out

    has = {k for t in trajectories for k in (t.get("reward_components") or {})}
    res = {"em": values("em"), "f1": values("f1"),
           "judge": values("judge") if "judge" in has else values("llm_match")}
    res = {k: v for k, v in res.items() if v}
    if trajectories:
        res["answer_rate"] = [1.0 if t.get("terminated") and t.get("final_answer") is not None else 0.0
                              for t in trajectories]
    return res


def compute_metrics(trajectories: list[dict[str, Any]], *, wall_s: float | None = None) -> dict[str, Any]:
    """Run metrics from trajectory dicts (see the module docstring for definitions).

    Args:
        trajectories: :meth:`~drgym.records.Trajectory.to_dict` records, with
            ``reward_components`` and ``metadata["usage"]`` as the runner writes them.
        wall_s: total wall time of the run (sum over resumed sessions); None leaves
            ``wall_s_per_episode`` out.

    Returns:
        A flat dict of floats/ints plus ``"scores"`` (every reward component's mean),
        ``"time_share"`` and ``"timings_s"`` dicts. Empty input gives ``{"episodes": 0}``.
    """
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    comps: dict[str, list[float | None]] = {}
    for t in trajectories:
        for k, v in (t.get("reward_components") or {}).items():
            if k in _NON_SCORE_COMPONENTS:
                continue
            comps.setdefault(k, []).append(v if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
    scores = {k: _mean(v) for k, v in sorted(comps.items())}
    counts = [episode_counts(t) for t in trajectories]
    toks = [episode_tokens(t) for t in trajectories]
    turns = sum(c["turns"] for c in counts)
    timings = {p: sum(float((t.get("timings") or {}).get(p) or 0.0) for t in trajectories) for p in PHASES}
    total_t = sum(timings.values())
    lat = [float((t.get("metadata") or {}).get("latency_s") or 0.0) for t in trajectories]
    judge_vals = comps.get("judge") or comps.get("llm_match")
    m: dict[str, Any] = {
        "episodes": n,
        "em": scores.get("em"),
        "f1": scores.get("f1"),
        "cover_em": scores.get("cover_em"),
        "judge": _mean(judge_vals) if judge_vals else None,
        "judge_failures": sum(1 for t in trajectories for k in JUDGED if _judge_failed(t.get("reward_components") or {}, k)),
        "kpr_undefined": sum(1 for t in trajectories if (t.get("reward_components") or {}).get("kp_undefined")),
        "answer_rate": sum(1 for t in trajectories if t.get("terminated") and t.get("final_answer") is not None) / n,
        "invalid_action_rate": (sum(c["invalid"] for c in counts) / turns) if turns else 0.0,
        "turns": turns / n,
        "searches": sum(c["searches"] for c in counts) / n,
        "fetches": sum(c["fetches"] for c in counts) / n,
        "prompt_tokens": sum(p for p, _ in toks) / n,
        "completion_tokens": sum(c for _, c in toks) / n,
        "episode_latency_s": statistics.fmean(lat) if any(lat) else None,
        "reward": _mean([t.get("reward") for t in trajectories]),
        "scores": scores,
        "timings_s": {k: round(v, 4) for k, v in timings.items()},
        "time_share": {k: (v / total_t if total_t else 0.0) for k, v in timings.items()},
        "errors": sum(1 for t in trajectories if episode_has_error(t)),
        "failed": sum(1 for t in trajectories if episode_failures(t)),
        "failure_reasons": failure_counts(trajectories),
    }
    phase_records = [p for t in trajectories
                     if isinstance(p := (t.get("metadata") or {}).get("wall_phases_s"), dict)]
    if phase_records:
        sums = {k: sum(float(p.get(k) or 0.0) for p in phase_records) for k in PHASES}
        total = sum(sums.values())
        m["wall_phases_s"] = {k: round(v, 4) for k, v in sums.items()}
        m["wall_share"] = {k: (v / total if total else 0.0) for k, v in sums.items()}
        m["wall_share_episodes"] = len(phase_records)
    if wall_s is not None:
        m["wall_s"] = round(wall_s, 3)
        m["wall_s_per_episode"] = wall_s / n
        m["episodes_per_min"] = 60.0 * n / wall_s if wall_s > 0 else None
    return m


def _evidence_key(kind: str, value: str) -> str:
    """The comparable form of a gold document or a retrieved one's field, by ``gold_docs_kind``."""
    if kind == "url":
        return normalize_url(value)
    if kind == "title":
        return " ".join(value.split()).casefold()
    return re.sub(r"#p\d+$", "", value.strip())


def evidence_recall(trajectories: list[dict[str, Any]], tasks: dict[str, Any]) -> dict[str, Any] | None:
    """Share of each task's gold documents (``Task.gold_docs``) the agent retrieved, and cited.

    A gold document is *retrieved* when a result of any step (``steps[].results``, search
    hits and fetched pages) names it, by the task's ``metadata["gold_docs_kind"]``:
    ``"title"`` (whitespace-collapsed, case-folded titles: a title several documents share
    counts for any of them), ``"url"`` (:func:`drgym.corpus.urls.normalize_url`) or
    ``"doc_id"`` (the default; a passage id ``<doc_id>#p<k>`` or ``metadata.parent_doc_id``
    names its document). It is *cited* when a URL of the trajectory's
    ``metadata["citations"]`` (research episodes) is the gold URL, or the URL of a result
    that names it.

    Args:
        trajectories: trajectory dicts (``task_id``, ``steps``, ``metadata``).
        tasks: task_id -> :class:`~drgym.records.Task`.

    Returns:
        None when no episode's task has gold documents; else ``{"episodes": n,
        "retrieved": mean share, "cited": mean share over the episodes with citations (None
        when none has), "per_episode": [{"episode_id", "task_id", "gold", "retrieved",
        "cited"}]}`` (shares in [0, 1]; ``cited`` None for an episode without citations).
    """
    rows = []
    for t in trajectories:
        task = tasks.get(t.get("task_id"))
        gold_docs = list(getattr(task, "gold_docs", None) or [])
        if not gold_docs:
            continue
        kind = (task.metadata or {}).get("gold_docs_kind") or "doc_id"
        field = {"url": "url", "title": "title"}.get(kind, "doc_id")
        gold = {_evidence_key(kind, g) for g in gold_docs}
        seen: set[str] = set()
        by_url: dict[str, set[str]] = {}
        for step in t.get("steps") or []:
            for r in step.get("results") or []:
                names = {str(r.get(field) or "")}
                if field == "doc_id":
                    names.add(str((r.get("metadata") or {}).get("parent_doc_id") or ""))
                keys = {_evidence_key(kind, n) for n in names if n}
                seen |= keys
                if r.get("url"):
                    by_url.setdefault(_evidence_key("url", str(r["url"])), set()).update(keys)
        citations = (t.get("metadata") or {}).get("citations")
        cited = None
        if citations is not None:
            urls = {_evidence_key("url", str(u)) for c in citations for u in (c.get("urls") or [])}
            named = set().union(*(by_url.get(u, set()) for u in urls)) | (urls if kind == "url" else set())
            cited = len(gold & named) / len(gold)
        rows.append({"episode_id": t.get("episode_id"), "task_id": t.get("task_id"), "gold": len(gold),
                     "retrieved": len(gold & seen) / len(gold), "cited": cited})
    if not rows:
        return None
    return {"episodes": len(rows), "retrieved": _mean([r["retrieved"] for r in rows]),
            "cited": _mean([r["cited"] for r in rows if r["cited"] is not None]), "per_episode": rows}


def calibration(trajectories: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Accuracy and calibration error of the answers given in BrowseComp's format.

    The env scores a short answer with an ``Exact Answer:`` line on that line and keeps
    its ``Confidence:`` as ``metadata["answer_confidence"]``
    (:func:`drgym.rewards.calibration.split_labelled_answer`). Over those episodes, an
    answer is right by the judge (``reward_components["judge"]`` >= 0.5) when the run
    has a judge, as BrowseComp grades, else by exact match (``em``); a missing confidence
    counts as 100%, as in BrowseComp. The error is
    :func:`drgym.rewards.calibration.expected_calibration_error` (10 equal-width bins).

    Returns:
        None when no episode answered in the format; else ``{"episodes", "accuracy",
        "calibration_error", "correct_by" ("judge" or "em"), "no_confidence",
        "unscored"}``; ``unscored`` counts episodes whose correctness score is None (a
        failed judge), left out of both figures (None when all are).
    """

    rows = [t for t in trajectories if "answer_confidence" in (t.get("metadata") or {})]
    if not rows:
        return None
    by = "judge" if any((t.get("reward_components") or {}).get("judge") is not None for t in rows) else "em"
    conf, right, unscored, missing = [], [], 0, 0
    for t in rows:
        score = (t.get("reward_components") or {}).get(by)
        if score is None or (isinstance(score, float) and math.isnan(score)):
            unscored += 1
            continue
        c = t["metadata"]["answer_confidence"]
        missing += c is None
        conf.append(1.0 if c is None else float(c))
        right.append(float(score) >= 0.5 if by == "judge" else float(score))
    out = {"episodes": len(rows), "accuracy": None, "calibration_error": None, "correct_by": by,
           "no_confidence": missing, "unscored": unscored}
    if conf:
        out["accuracy"] = sum(right) / len(right)
        out["calibration_error"] = expected_calibration_error(conf, right)
    return out


def format_value(key: str, v: Any) -> str:
    """Human formatting of one metric value for tables (3 decimals, percents for rates)."""
    if v is None:
        return "-"
    if key in ("answer_rate", "invalid_action_rate"):
        return f"{100 * v:.1f}%"
    if key in ("completion_tokens", "prompt_tokens"):
        return f"{v:.0f}"
    if key.endswith("_s") or key.startswith("wall_s") or key == "episode_latency_s":
        return f"{v:.2f}s"
    if key in ("turns", "searches", "fetches"):
        return f"{v:.2f}"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


LABELS = {
    "em": "EM", "f1": "F1", "cover_em": "cover-EM", "judge": "judge", "answer_rate": "answer rate",
    "invalid_action_rate": "invalid actions", "turns": "turns/ep", "searches": "searches/ep",
    "fetches": "fetches/ep", "completion_tokens": "gen tokens/ep", "prompt_tokens": "prompt tokens/ep",
    "wall_s_per_episode": "wall s/ep", "episode_latency_s": "latency s/ep", "episodes": "episodes",
}


def rich_table(metrics: dict[str, Any], title: str = "rollout"):
    """A ``rich.table.Table`` of the headline metrics plus any other reward component.

    Two columns (metric, value); values are never cut (they wrap instead), so the table
    reads in full on an 80-column terminal. Names and the title are plain text: a
    ``[...]`` in them is printed as is, not read as rich markup.
    """

    table = Table(title=Text(title), show_header=True, header_style="bold")
    table.add_column("metric", overflow="fold")
    table.add_column("value", justify="right", overflow="fold")

    def row(name: str, value: str) -> None:
        table.add_row(Text(name), Text(value))

    row("episodes", str(metrics.get("episodes", 0)))
    for k in HEADLINE:
        if k == "judge" and metrics.get("judge") is None:
            continue
        row(LABELS.get(k, k), format_value(k, metrics.get(k)))
    for k, v in (metrics.get("scores") or {}).items():
        if k in ("em", "f1", "judge", "llm_match"):
            continue
        row(k, format_value(k, v))
    for k in ("errors", "failed", "judge_failures"):  # shown when there are some
        if metrics.get(k):
            row(k.replace("_", " "), str(metrics[k]))
    # the run's shares from its records (the same on a first run and its resume); a run
    # recorded by an older drgym has only the per-episode timings' shares
    share = metrics.get("wall_share") or metrics.get("time_share") or {}
    if share:
        row("wall time share", " ".join(f"{k} {100 * v:.0f}%" for k, v in share.items()))
    return table


TEXT_COLUMN_MAX = 24
"""Widest a text column (run name, policy, tasks) of :func:`terminal_tables` gets, in
characters; longer cells fold onto further lines."""


def terminal_tables(headers: list[str], rows: list[list[str]], *, width: int, text_columns: int = 1,
                    repeat: int = 1, title: str | None = None) -> list[Any]:
    """A wide table as one or more ``rich.table.Table`` that each fit ``width`` columns,
    with every number shown in full.

    The first ``text_columns`` columns are text (left-aligned, folded at
    :data:`TEXT_COLUMN_MAX` characters); the others are numbers (right-aligned, never
    wrapped or cut; a header wraps at its spaces instead). When all columns do not fit,
    they are split over several tables in order, each repeating the first ``repeat``
    columns (e.g. the run name) so every row stays identifiable. Cells and headers are
    plain text (no rich markup).

    Args:
        headers: column names.
        rows: one list of cell strings per row, ``len(headers)`` each.
        width: terminal width in characters (``Console.width``).
        text_columns: how many leading columns are text.
        repeat: how many leading columns every table repeats (<= ``text_columns``).
        title: title of the first table.

    Returns:
        The tables, to print one after the other (one when everything fits).
    """

    def col_width(i: int) -> int:
        cells = [len(r[i]) for r in rows] or [0]
        if i < text_columns:
            return min(max(max(cells), max((len(w) for w in headers[i].split()), default=0)), TEXT_COLUMN_MAX)
        return max(max(cells), max((len(w) for w in headers[i].split()), default=0))

    widths = [col_width(i) for i in range(len(headers))]
    cost = [w + 3 for w in widths]  # one space each side and a border
    fixed = list(range(min(repeat, len(headers))))
    budget = width - 1 - sum(cost[i] for i in fixed)
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in range(len(fixed), len(headers)):
        if current and used + cost[i] > budget:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += cost[i]
    if current or not groups:
        groups.append(current)
    tables = []
    for n, group in enumerate(groups):
        t = Table(title=Text(title) if title and n == 0 else None, show_header=True, header_style="bold")
        for i in fixed + group:
            if i < text_columns:
                t.add_column(Text(headers[i]), overflow="fold", max_width=TEXT_COLUMN_MAX)
            else:
                t.add_column(Text(headers[i].replace(" ", "\n") if len(headers[i]) > widths[i] else headers[i]),
                             justify="right", no_wrap=True, min_width=widths[i])
        for r in rows:
            t.add_row(*[Text(r[i]) for i in fixed + group])
        tables.append(t)
    return tables
