"""A score table of policies on one task set: means with bootstrap CIs, paired differences.

Every policy runs through ``drgym rollout``'s runner (:func:`drgym.evaluation.runner.run_rollout`)
on the same questions in the same env: the main job's (``drgym/SearchQA-v0`` over
``wiki-default`` with hybrid search, top-3, 4 turns, 3 searches, 2 fetches, observations of
500 drgym tokens; the hf policies' defaults, greedy), or a training config's.

For each policy: EM, F1 (HotpotQA's official F1, the env's ``f1`` reward), answer rate,
searches per episode, the share of episodes that searched twice and the share that saw the
gold (:func:`drgym.rewards.evidence.gold_in_view`), each a mean over questions with a 95%
bootstrap confidence interval over questions (:func:`drgym.evaluation.stats.mean_ci`).
Paired differences (:func:`drgym.evaluation.stats.paired`) compare the trained policy with
its start and with the baselines question by question.

``scripts/eval_table.py`` is the command line of :func:`build_table`; it writes the table as
JSON, as markdown (:func:`markdown`) and one line per question.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from drgym.atomic import atomic_write_json, atomic_write_text
from drgym.envs.task_loaders import load_tasks
from drgym.errors import ConfigError
from drgym.evaluation.metrics import episode_counts
from drgym.evaluation.runner import RolloutConfig, run_rollout
from drgym.evaluation.stats import CONFIDENCE, N_RESAMPLES, SEED, format_ci, mean_ci, paired
from drgym.rewards.evidence import gold_in_view, visible_text

log = logging.getLogger(__name__)

METRICS = ("em", "f1", "answered", "searches")
"""Per-question scores of every row (``saw_gold`` and ``searched_twice`` are added beside them)."""
MAIN_ENV = ("drgym/SearchQA-v0, drgym rollout defaults: wiki-default hybrid, top_k 3, max_turns 4, max_searches 3, "
            "max_fetches 2, max_obs_tokens 500; hf policies greedy, max_new_tokens 64, dtype auto (float32 on CPU)")
"""The description of the main job's env recorded in a table (``env``); rows are reused only within one env."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The folder above the package: a source checkout, whose paths a table records relative to it."""


def per_question(trajectories: list[dict], golds: dict[str, list[str]] | None = None) -> dict[str, dict[str, float]]:
    """``{task_id: {"em", "f1", "answered", "searches"[, "saw_gold"]}}`` from a run's trajectory dicts.

    ``em`` / ``f1`` are the trajectory's reward components (0.0 when missing), ``answered``
    1.0 when the episode ended with an answer, ``searches`` the number of searches.
    ``saw_gold`` (with ``golds``, task id -> aliases): 1.0 when
    :func:`drgym.rewards.evidence.gold_in_view` finds a gold alias in the visible text of
    the episode's observations.
    """
    out = {}
    for t in trajectories:
        comp = t.get("reward_components") or {}
        row = {"em": float(comp.get("em") or 0.0), "f1": float(comp.get("f1") or 0.0),
               "answered": 1.0 if t.get("terminated") else 0.0,
               "searches": float(episode_counts(t)["searches"])}
        if golds is not None:
            seen = " ".join(visible_text(str(s.get("observation") or "")) for s in t.get("steps") or [])
            row["saw_gold"] = 1.0 if gold_in_view(seen, golds.get(t["task_id"], [])) else 0.0
        out[t["task_id"]] = row
    return out


def run_policy(label: str, spec: str, tasks: str, runs: Path, options: dict, env: dict | None = None) -> dict:
    """One rollout run into ``runs/label`` (resumed when that folder exists) in the main job's
    env, or in the env ``env`` describes (``{"env_options": {...}, "max_turns": int}``).

    Returns:
        ``{"policy", "options", "run_dir", "trajectories", "metrics"}``.
    """
    env = env or {}
    rc = RolloutConfig(tasks=tasks, policy=spec, n=None, out=str(runs / label), plots=False, policy_options=options,
                       env_options=dict(env.get("env_options") or {}), max_turns=env.get("max_turns"))
    t0 = time.perf_counter()
    res = run_rollout(rc, progress=False)
    log.info("%s (%s): %d episodes, f1 %.3f, %.0f s", label, spec, len(res.trajectories),
             res.metrics.get("f1") or 0.0, time.perf_counter() - t0)
    return {"policy": spec, "options": options, "run_dir": str(runs / label), "trajectories": res.trajectories,
            "metrics": res.metrics}


def reusable_rows(path: Path, policies: dict[str, tuple[str, dict]], tasks: str, env_desc: str) -> dict[str, dict]:
    """Rows of an earlier table (``path``, written by :func:`build_table`) that need not run again.

    A row is reused when the earlier table was made on the same ``tasks`` in the same env
    (``env_desc``, which names the dtype and generation length) and its label's policy is the
    same spec (as :func:`shown_path` records it). Returns ``{label: {"policy", "run_dir",
    "per_question", "metrics"}}``; the other labels run.

    Raises:
        ConfigError: ``path`` was made on other tasks or in another env, so no row of it can stand in.
    """
    old = json.loads(Path(path).read_text())
    if old.get("tasks") != tasks or old.get("env") != env_desc:
        raise ConfigError(f"--reuse {path}: made on tasks {old.get('tasks')!r} in env {old.get('env')!r}, "
                          f"not on {tasks!r} in {env_desc!r}; no row of it can be reused.")
    out = {}
    for label, (spec, _opt) in policies.items():
        row = old.get("rows", {}).get(label)
        if row and row.get("policy") == shown_path(spec) and label in old.get("per_question", {}):
            out[label] = {**_taken_row(old, label), "policy": spec}
            log.info("%s (%s): reused from %s", label, spec, path)
    return out


def other_row(path: Path, label: str, tasks: str, env_desc: str) -> dict:
    """Row ``label`` of another table (``path``, written by :func:`build_table` on the same
    ``tasks`` in the same env), as :func:`reusable_rows` gives a row: ``{"policy", "run_dir",
    "per_question", "metrics"}``.

    Raises:
        ConfigError: ``path`` was made on other tasks or in another env, or has no row ``label``
            with per-question scores (its labels are named).
    """
    old = json.loads(Path(path).read_text())
    if old.get("tasks") != tasks or old.get("env") != env_desc:
        raise ConfigError(f"--also {path}: made on tasks {old.get('tasks')!r} in env {old.get('env')!r}, "
                          f"not on {tasks!r} in {env_desc!r}; its rows cannot be paired with this table's.")
    row = old.get("rows", {}).get(label)
    if not row or label not in old.get("per_question", {}):
        raise ConfigError(f"--also {path}: no row {label!r} with per-question scores; its rows: "
                          f"{sorted(old.get('rows', {}))}")
    log.info("%s (%s): taken from %s", label, row["policy"], path)
    return _taken_row(old, label)


def _taken_row(table: dict, label: str) -> dict:
    """Row ``label`` of a table JSON as a result of a run (its per-question scores, metric means)."""
    row = table["rows"][label]
    return {"policy": row["policy"], "run_dir": row["run_dir"], "per_question": table["per_question"][label],
            "metrics": {("answer_rate" if k == "answered" else k): v["mean"] for k, v in row["scores"].items()}}


def markdown(table: dict) -> str:
    """The table as markdown (means with their 95% intervals, then the paired differences)."""
    lines = [f"Slice `{table['tasks']}` ({table['n_questions']} questions), {table['env_name']}; "
             "mean [95% bootstrap CI over questions]", "",
             "| policy | EM | F1 | answer rate | searches / episode | searched twice | saw the gold |",
             "|---|---|---|---|---|---|---|"]
    for label, row in table["rows"].items():
        s = row["scores"]
        pol = row["policy"]
        if "/runs/" in pol:  # a local training output: show it relative to the checkout that trained it
            pol = "hf:runs/" + pol.split("/runs/", 1)[1]
        saw = format_ci(s["saw_gold"], pct=True) if "saw_gold" in s else ""
        twice = format_ci(s["searched_twice"], pct=True) if "searched_twice" in s else ""
        lines.append(f"| {label} (`{pol}`) | {format_ci(s['em'])} | {format_ci(s['f1'])} | "
                     f"{format_ci(s['answered'], pct=True)} | {format_ci(s['searches'], nd=2)} | {twice} | {saw} |")
    if not table["paired"]:
        return "\n".join(lines) + "\n"
    lines += ["", "| paired difference (per question) | mean | 95% CI | excludes 0 | wins / losses | "
              "detectable (80% power) |", "|---|---|---|---|---|---|"]
    for name, d in table["paired"].items():
        mde = f"{d['detectable_at_80pct_power']:.3f}" if "detectable_at_80pct_power" in d else ""
        lines.append(f"| {name} | {d['mean']:+.3f} | [{d['lo']:+.3f}, {d['hi']:+.3f}] | "
                     f"{'yes' if d['excludes_zero'] else 'no'} | {d['wins']} / {d['losses']} | {mde} |")
    return "\n".join(lines) + "\n"


def shown_path(text: str, root: Path = CHECKOUT) -> str:
    """``text`` with a path inside ``root`` made relative to it, and another absolute path
    shown by its last two parts (a run folder of this machine means nothing to a reader of
    the repository); an ``hf:`` prefix is kept."""
    r = str(root)
    if r in text:
        return text.replace(r + "/", "")
    prefix = "hf:" if text.startswith("hf:") else ""
    body = text[len(prefix):]
    if body.startswith("/"):
        return prefix + ".../" + "/".join(Path(body).parts[-2:])
    return text


def shown_args(args: list[str]) -> list[str]:
    """A command's arguments as recorded: the value of ``--runs`` becomes ``RUNS``, other
    absolute paths are shortened by :func:`shown_path`."""
    out, skip = [], False
    for x in args:
        if skip:
            out.append("RUNS")
            skip = False
            continue
        skip = x == "--runs"
        out.append(shown_path(x) if x.startswith("/") or x.startswith("hf:/") else x)
    return out


def _hf(x: str) -> str:
    return x if x.startswith("hf:") else f"hf:{x}"


def table_env(cfg: Any | None, dtype: str | None) -> tuple[dict | None, dict, str, str]:
    """The env every row runs in: the main job's (``cfg`` None), or that of a training
    config (``cfg``, a :class:`drgym.training.config.TrainingConfig`: its env kwargs,
    ``eval.max_turns`` and ``rollout.max_new_tokens`` for hf policies).

    Returns:
        ``(env, gen, env_name, env_desc)``: ``env`` for :func:`run_policy` (None: the main
        job's), the generation options of hf policies, the env's name for the markdown
        title, and its description recorded in the table (rows are reused only within one).
    """
    if cfg is None:
        return None, {}, "the main job's env", MAIN_ENV
    kw = {k: v for k, v in (cfg.env.get("kwargs") or {}).items() if k != "max_turns"}
    env = {"env_options": kw, "max_turns": cfg.eval.max_turns}
    gen = {"max_new_tokens": cfg.rollout_settings().max_new_tokens}
    env_desc = (f"{cfg.env['id']} over {cfg.search}, env options {kw}, max_turns {cfg.eval.max_turns} (the training "
                f"config {cfg.name}'s env); hf policies greedy, max_new_tokens {gen['max_new_tokens']}, "
                f"dtype {dtype or 'auto (float32 on CPU)'}")
    return env, gen, f"the env of training config `{cfg.name}`", env_desc


def table_policies(*, sft: str | None = None, grpo: str | None = None, start: str | None = None,
                   trained: str | None = None, trained_label: str = "start + GRPO", gen: dict | None = None,
                   dtype: str | None = None) -> dict[str, tuple[str, dict]]:
    """The rows of a table, ``{label: (policy spec, policy options)}``.

    With ``sft`` and ``grpo``: the bundled agent's table (zero-shot, retrieve-then-read,
    scripted, SFT, SFT + GRPO). With ``start`` (and optionally ``trained``): an RL run's
    table (zero-shot, retrieve-then-read, retrieve-then-read with the start policy reading,
    scripted, start; with ``trained``, retrieve-then-read with the trained policy reading and
    the trained row under ``trained_label``). ``gen`` and ``dtype`` go to every hf policy.

    Raises:
        ConfigError: neither or both of ``sft`` and ``start``, ``sft`` without ``grpo``, or a
            ``trained_label`` that is the label of another row.
    """
    gen = gen or {}
    dt = {"dtype": dtype} if dtype else {}
    if bool(start) == bool(sft) or (sft and not grpo):
        raise ConfigError("give --sft and --grpo (the bundled agent's table), or --start [--trained] "
                          "(an RL run's table)")
    if start:
        policies = {
            "zero-shot, scaffolded": ("hf:smollm2", {**gen, **dt}),
            "retrieve-then-read": ("rag:smollm2", dict(dt)),
            "retrieve-then-read, start reads": (f"rtr:{_hf(start)}", {**gen, **dt}),
            "scripted": ("scripted", {}),
            "start": (_hf(start), {**gen, **dt}),
        }
        if trained:
            policies["retrieve-then-read, trained reads"] = (f"rtr:{_hf(trained)}", {**gen, **dt})
            if trained_label in policies:
                raise ConfigError(f"--trained-label {trained_label!r} is the label of another row; choose another")
            policies[trained_label] = (_hf(trained), {**gen, **dt})
        return policies
    return {
        "zero-shot, scaffolded": ("hf:smollm2", {**gen, **dt}),
        "retrieve-then-read": ("rag:smollm2", dict(dt)),
        "scripted": ("scripted", {}),
        "SFT": (_hf(sft), {**gen, **dt}),
        "SFT + GRPO": (_hf(grpo), {**gen, **dt}),
    }


def run_rows(policies: dict[str, tuple[str, dict]], *, tasks: str, runs: Path, env: dict | None = None,
             reused: dict[str, dict] | None = None) -> dict[str, dict]:
    """Each row's result: the ``reused`` one (:func:`reusable_rows`) when there is one, else a
    run of :func:`run_policy` into ``runs/<label as a folder name>``."""
    reused = reused or {}
    return {label: reused.get(label) or run_policy(label.replace(" ", "_").replace(",", "").replace("+", "plus"),
                                                   spec, tasks, runs, opt, env)
            for label, (spec, opt) in policies.items()}


def _pairs(pq: dict, *, start: bool, trained_label: str, has_trained: bool, also: list[str]) -> dict:
    if not start:
        return {
            "F1: SFT + GRPO - SFT": ("SFT + GRPO", "SFT", "f1"),
            "EM: SFT + GRPO - SFT": ("SFT + GRPO", "SFT", "em"),
            "answer rate: SFT + GRPO - SFT": ("SFT + GRPO", "SFT", "answered"),
            "F1: SFT + GRPO - retrieve-then-read": ("SFT + GRPO", "retrieve-then-read", "f1"),
            "F1: SFT - retrieve-then-read": ("SFT", "retrieve-then-read", "f1"),
            "F1: SFT + GRPO - zero-shot": ("SFT + GRPO", "zero-shot, scaffolded", "f1"),
        }
    top = trained_label if has_trained and trained_label in pq else "start"
    if "start" not in pq:
        raise ConfigError("the table needs the 'start' row")
    pairs = {}
    if top != "start":
        pairs[f"F1: {top} - start"] = (top, "start", "f1")
        pairs[f"EM: {top} - start"] = (top, "start", "em")
        pairs[f"searched twice: {top} - start"] = (top, "start", "searched_twice")
        if all("saw_gold" in q for x in (top, "start") for q in pq[x].values()):
            pairs[f"saw the gold: {top} - start"] = (top, "start", "saw_gold")
    for base in ("retrieve-then-read", "retrieve-then-read, start reads", "retrieve-then-read, trained reads",
                 "scripted", "zero-shot, scaffolded"):
        if base in pq and base != top:
            pairs[f"F1: {top} - {base}"] = (top, base, "f1")
    if top != "start" and "retrieve-then-read" in pq:
        pairs["F1: start - retrieve-then-read"] = ("start", "retrieve-then-read", "f1")
    if "retrieve-then-read, trained reads" in pq and "retrieve-then-read, start reads" in pq:
        # the same first search for both: what training changed in reading alone
        pairs["F1: trained reads - start reads (retrieve-then-read)"] = (
            "retrieve-then-read, trained reads", "retrieve-then-read, start reads", "f1")
    for label in also:  # another run's row on the same questions: what this one changed against it
        pairs[f"F1: {top} - {label}"] = (top, label, "f1")
    return pairs


def score_table(results: dict[str, dict], *, tasks: str, env_desc: str, env_name: str, command: str,
                start: bool = False, trained_label: str = "start + GRPO", has_trained: bool = False,
                also: list[str] | None = None) -> dict:
    """The table of ``results`` (:func:`run_rows`, plus rows taken by :func:`other_row` under
    the labels ``also``): per-question scores, each row's means with their intervals
    (:func:`drgym.evaluation.stats.mean_ci`), the paired differences
    (:func:`drgym.evaluation.stats.paired`), and the means on the main job's 20 questions
    when the task set holds them.

    ``start`` selects an RL run's pairs (the trained row ``trained_label`` when
    ``has_trained``, else ``start``, against the start and the baselines); otherwise the
    bundled agent's (SFT + GRPO against SFT and the baselines).

    Raises:
        ConfigError: a row the pairs need is missing, or two paired rows cover different questions.
    """
    golds = {t.task_id: list(t.answers) for t in load_tasks(tasks)}
    pq = {label: r["per_question"] if "per_question" in r else per_question(r["trajectories"], golds)
          for label, r in results.items()}
    for rows_ in pq.values():  # the share of episodes that searched more than once (a second hop)
        for q in rows_.values():
            q["searched_twice"] = 1.0 if q["searches"] >= 2 else 0.0
    pairs = _pairs(pq, start=start, trained_label=trained_label, has_trained=has_trained, also=also or [])
    try:
        paired_rows = {name: paired(pq[x], pq[y], m) for name, (x, y, m) in pairs.items()}
    except ValueError as e:
        raise ConfigError(str(e)) from e
    n_key = "start" if start else "SFT"
    table: dict[str, Any] = {
        "made_by": command,
        "tasks": tasks, "n_questions": len(pq[n_key]),
        "env": env_desc, "env_name": env_name,
        "bootstrap": {"method": "percentile", "n_resamples": N_RESAMPLES, "confidence": CONFIDENCE, "seed": SEED,
                      "unit": "question"},
        "rows": {label: {"policy": shown_path(r["policy"]), "run_dir": Path(r["run_dir"]).name,
                         "scores": {m: mean_ci([q[m] for q in pq[label].values()])
                                    for m in METRICS + ("saw_gold", "searched_twice")}}
                 for label, r in results.items()},
        "paired": paired_rows,
        "per_question": pq,
    }
    main_job = [t.task_id for t in load_tasks("hotpotqa-dev", limit=20) if t.task_id in pq[n_key]]
    if main_job:  # the main job's 20 questions (drgym rollout's default), a subset of hipporag-test
        table["main_job_questions"] = {label: {m: sum(pq[label][i][m] for i in main_job) / len(main_job)
                                               for m in METRICS} for label in pq}
    return table


def write_table(table: dict, out: Path) -> None:
    """Write ``table`` to ``out`` (JSON), ``out`` with suffix ``.md`` (:func:`markdown`) and
    ``.per_question.jsonl`` (one line per question, every row's scores, for diffing two runs
    question by question); each file atomically."""
    n_key = "start" if "start" in table["per_question"] else "SFT"
    pq = table["per_question"]
    atomic_write_json(out, table)
    atomic_write_text(out.with_suffix(".md"), markdown(table))
    lines = [json.dumps({"task_id": i, **{label: pq[label][i] for label in pq}}, sort_keys=True)
             for i in sorted(pq[n_key])]
    atomic_write_text(out.with_suffix(".per_question.jsonl"), "\n".join(lines) + "\n")
