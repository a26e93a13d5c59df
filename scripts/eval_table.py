"""The test-slice table of the bundled agent: five policies, bootstrap CIs, paired differences.

Every policy runs through ``drgym rollout``'s runner (:func:`drgym.evaluation.runner.run_rollout`)
on the same questions in the same env: the main job's (``drgym/SearchQA-v0`` over
``wiki-default`` with hybrid search, top-3, 4 turns, 3 searches, 2 fetches, observations of
500 drgym tokens; the hf policies' defaults, greedy). The default task set is
``hipporag-test`` (60 questions; its first 20 are the main job's), touched only for final
figures; ``--tasks hipporag-dev`` gives the same table on the dev slice.

For each policy: EM, F1 (HotpotQA's official F1, the env's ``f1`` reward), answer rate and
searches per episode, each a mean over questions with a 95% bootstrap confidence interval
over questions (``scipy.stats.bootstrap``, percentile method, 10,000 resamples, seeded).
Paired differences (per-question difference, then the same bootstrap) are given for
SFT + GRPO minus SFT (the RL lift: it counts only when its interval excludes 0) and for
SFT + GRPO minus ``rag:smollm2`` (the main job's default rule, README).

Run directories go to ``<runs>/<label>/`` and are resumed on a rerun; the table goes to
``--out`` (JSON) and ``<out>.md``.

Usage::

    python scripts/eval_table.py --sft runs/smollm2_drgym_cpu/sft/final --grpo hf:smollm2-drgym \\
        --tasks hipporag-test --runs runs/test_eval --out training/results/test_table.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

METRICS = ("em", "f1", "answered", "searches")
N_RESAMPLES = 10_000
SEED = 0


def per_question(trajectories: list[dict], golds: dict[str, list[str]] | None = None) -> dict[str, dict[str, float]]:
    """``{task_id: {"em", "f1", "answered", "searches"[, "saw_gold"]}}`` from a run's trajectory dicts.

    ``saw_gold`` (with ``golds``, task id -> aliases): 1.0 when a gold alias (SQuAD-normalised,
    whole words: :func:`drgym.rewards.qa.cover_exact_match`) is in some observation of the episode.
    """
    from drgym.evaluation.metrics import episode_counts
    from drgym.rewards.evidence import visible_text
    from drgym.rewards.qa import YES_NO_NOANSWER, cover_exact_match, normalize_answer

    out = {}
    for t in trajectories:
        comp = t.get("reward_components") or {}
        row = {"em": float(comp.get("em") or 0.0), "f1": float(comp.get("f1") or 0.0),
               "answered": 1.0 if t.get("terminated") else 0.0,
               "searches": float(episode_counts(t)["searches"])}
        if golds is not None:
            g = [a for a in golds.get(t["task_id"], []) if normalize_answer(a) not in YES_NO_NOANSWER]
            seen = " ".join(visible_text(str(s.get("observation") or "")) for s in t.get("steps") or [])
            row["saw_gold"] = 1.0 if g and cover_exact_match(seen, g) else 0.0
        out[t["task_id"]] = row
    return out


def detectable_effect(sd: float, n: int, *, power: float = 0.8) -> float:
    """Smallest paired mean difference a two-sided 95% test on ``n`` questions detects with
    ``power``, for a per-question difference of standard deviation ``sd``:
    ``(z_0.975 + z_power) * sd / sqrt(n)`` (normal approximation; 2.80 * sd / sqrt(n) at 80%)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf
    return (z(0.975) + z(power)) * sd / max(1, n) ** 0.5


def mean_ci(values: list[float]) -> dict[str, float]:
    """Mean and 95% percentile-bootstrap interval over questions (``scipy.stats.bootstrap``)."""
    import numpy as np
    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if np.all(x == x[0]):  # no spread: the interval is the point
        return {"mean": m, "lo": m, "hi": m}
    res = bootstrap((x,), np.mean, confidence_level=0.95, n_resamples=N_RESAMPLES, method="percentile",
                    random_state=np.random.default_rng(SEED))
    return {"mean": m, "lo": float(res.confidence_interval.low), "hi": float(res.confidence_interval.high)}


def paired(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]], metric: str) -> dict[str, float]:
    """Mean of ``a - b`` per question (same task ids) with its bootstrap interval; ``excludes_zero``."""
    ids = sorted(set(a) & set(b))
    if len(ids) != len(a) or len(ids) != len(b):
        raise SystemExit(f"paired difference: the runs cover different questions ({len(a)} vs {len(b)}).")
    diffs = [a[i][metric] - b[i][metric] for i in ids]
    r = mean_ci(diffs)
    r["excludes_zero"] = bool(r["lo"] > 0 or r["hi"] < 0)
    r["n"] = len(ids)
    import statistics

    r["sd"] = statistics.pstdev(diffs) if len(diffs) > 1 else 0.0
    r["detectable_at_80pct_power"] = detectable_effect(r["sd"], len(ids))
    r["wins"] = sum(a[i][metric] > b[i][metric] for i in ids)
    r["losses"] = sum(a[i][metric] < b[i][metric] for i in ids)
    return r


def run_policy(label: str, spec: str, tasks: str, runs: Path, options: dict, env: dict | None = None) -> dict:
    """One rollout run (resumed when its directory exists) in the main job's env, or in the
    env ``env`` describes (``{"env_options": {...}, "max_turns": int}``, from ``--config``)."""
    from drgym.evaluation.runner import RolloutConfig, run_rollout

    env = env or {}
    rc = RolloutConfig(tasks=tasks, policy=spec, n=None, out=str(runs / label), plots=False, policy_options=options,
                       env_options=dict(env.get("env_options") or {}), max_turns=env.get("max_turns"))
    t0 = time.perf_counter()
    res = run_rollout(rc, progress=False)
    logging.info("%s (%s): %d episodes, f1 %.3f, %.0f s", label, spec, len(res.trajectories),
                 res.metrics.get("f1") or 0.0, time.perf_counter() - t0)
    return {"policy": spec, "options": options, "run_dir": str(runs / label), "trajectories": res.trajectories,
            "metrics": res.metrics}


def reusable_rows(path: Path, policies: dict[str, tuple[str, dict]], tasks: str, env_desc: str) -> dict[str, dict]:
    """Rows of an earlier table (``path``, written by this script) that need not run again.

    A row is reused when the earlier table was made on the same ``tasks`` in the same env
    (``env_desc``, which names the dtype and generation length) and its label's policy is the
    same spec (as :func:`_shown_path` records it). Returns ``{label: {"policy", "run_dir",
    "per_question", "metrics"}}``; the other labels run.

    Raises:
        SystemExit: ``path`` was made on other tasks or in another env, so no row of it can stand in.
    """
    old = json.loads(path.read_text())
    if old.get("tasks") != tasks or old.get("env") != env_desc:
        raise SystemExit(f"--reuse {path}: made on tasks {old.get('tasks')!r} in env {old.get('env')!r}, "
                         f"not on {tasks!r} in {env_desc!r}; no row of it can be reused.")
    out = {}
    for label, (spec, _opt) in policies.items():
        row = old.get("rows", {}).get(label)
        if row and row.get("policy") == _shown_path(spec) and label in old.get("per_question", {}):
            out[label] = {**_taken_row(old, label), "policy": spec}
            logging.info("%s (%s): reused from %s", label, spec, path)
    return out


def other_row(path: Path, label: str, tasks: str, env_desc: str) -> dict:
    """Row ``label`` of another table (``path``, written by this script on the same ``tasks``
    in the same env), as :func:`reusable_rows` gives a row: ``{"policy", "run_dir",
    "per_question", "metrics"}``.

    Raises:
        SystemExit: ``path`` was made on other tasks or in another env, or has no row ``label``
            with per-question scores (its labels are named).
    """
    old = json.loads(path.read_text())
    if old.get("tasks") != tasks or old.get("env") != env_desc:
        raise SystemExit(f"--also {path}: made on tasks {old.get('tasks')!r} in env {old.get('env')!r}, "
                         f"not on {tasks!r} in {env_desc!r}; its rows cannot be paired with this table's.")
    row = old.get("rows", {}).get(label)
    if not row or label not in old.get("per_question", {}):
        raise SystemExit(f"--also {path}: no row {label!r} with per-question scores; its rows: {sorted(old.get('rows', {}))}")
    logging.info("%s (%s): taken from %s", label, row["policy"], path)
    return _taken_row(old, label)


def _taken_row(table: dict, label: str) -> dict:
    """Row ``label`` of a table JSON as a result of this script's runs (its per-question
    scores, metric means)."""
    row = table["rows"][label]
    return {"policy": row["policy"], "run_dir": row["run_dir"], "per_question": table["per_question"][label],
            "metrics": {("answer_rate" if k == "answered" else k): v["mean"] for k, v in row["scores"].items()}}


def markdown(table: dict) -> str:
    """The table as markdown (means with their 95% intervals)."""
    def cell(d, pct=False, nd=3):
        f = (lambda v: f"{100 * v:.0f} %") if pct else (lambda v: f"{v:.{nd}f}")
        return f"{f(d['mean'])} [{f(d['lo'])}, {f(d['hi'])}]"

    lines = [f"Slice `{table['tasks']}` ({table['n_questions']} questions), {table['env_name']}; "
             "mean [95% bootstrap CI over questions]", "",
             "| policy | EM | F1 | answer rate | searches / episode | searched twice | saw the gold |",
             "|---|---|---|---|---|---|---|"]
    for label, row in table["rows"].items():
        s = row["scores"]
        pol = row["policy"]
        if "/runs/" in pol:  # a local training output: show it relative to the checkout that trained it
            pol = "hf:runs/" + pol.split("/runs/", 1)[1]
        saw = cell(s["saw_gold"], pct=True) if "saw_gold" in s else ""
        twice = cell(s["searched_twice"], pct=True) if "searched_twice" in s else ""
        lines.append(f"| {label} (`{pol}`) | {cell(s['em'])} | {cell(s['f1'])} | "
                     f"{cell(s['answered'], pct=True)} | {cell(s['searches'], nd=2)} | {twice} | {saw} |")
    if not table["paired"]:
        return "\n".join(lines) + "\n"
    lines += ["", "| paired difference (per question) | mean | 95% CI | excludes 0 | wins / losses | "
              "detectable (80% power) |", "|---|---|---|---|---|---|"]
    for name, d in table["paired"].items():
        mde = f"{d['detectable_at_80pct_power']:.3f}" if "detectable_at_80pct_power" in d else ""
        lines.append(f"| {name} | {d['mean']:+.3f} | [{d['lo']:+.3f}, {d['hi']:+.3f}] | "
                     f"{'yes' if d['excludes_zero'] else 'no'} | {d['wins']} / {d['losses']} | {mde} |")
    return "\n".join(lines) + "\n"


def _shown_path(text: str) -> str:
    """``text`` with an absolute path outside the checkout shown by its last two parts
    (a run folder of this machine means nothing to a reader of the repository)."""
    root = str(Path(__file__).resolve().parents[1])
    if root in text:
        return text.replace(root + "/", "")
    prefix = "hf:" if text.startswith("hf:") else ""
    body = text[len(prefix):]
    if body.startswith("/"):
        return prefix + ".../" + "/".join(Path(body).parts[-2:])
    return text


def _shown_args(args: list[str]) -> list[str]:
    """The command's arguments as recorded: ``--runs`` becomes ``RUNS``, other absolute paths shortened."""
    out, skip = [], False
    for x in args:
        if skip:
            out.append("RUNS")
            skip = False
            continue
        skip = x == "--runs"
        out.append(_shown_path(x) if x.startswith("/") or x.startswith("hf:/") else x)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", default=None, help="SFT model or adapter folder (hf:PATH or PATH)")
    ap.add_argument("--grpo", default=None, help="SFT + GRPO model (hf:smollm2-drgym or a folder)")
    ap.add_argument("--start", default=None,
                    help="start policy of an RL run (instead of --sft): rows start, start + GRPO (--trained) and the "
                         "retrieve-then-read baselines read by each (rtr:)")
    ap.add_argument("--trained", default=None, help="with --start: the policy after GRPO")
    ap.add_argument("--trained-label", default="start + GRPO",
                    help="with --trained: the label of its row (e.g. 'start + two-hop SFT')")
    ap.add_argument("--dtype", default=None,
                    help="dtype of every hf policy and reader (float32: scores that do not depend on the CPU's bf16 "
                         "kernels; default the policies' auto)")
    ap.add_argument("--tasks", default="hipporag-test")
    ap.add_argument("--runs", default="runs/test_eval")
    ap.add_argument("--out", default="training/results/test_table.json")
    ap.add_argument("--config", default=None,
                    help="evaluate every policy in this training config's env (its env kwargs, eval.max_turns and "
                         "rollout.max_new_tokens for hf policies) instead of the main job's")
    ap.add_argument("--only", default=None,
                    help="semicolon-separated labels to run now (the others are not run; no table is written "
                         "unless --partial)")
    ap.add_argument("--partial", action="store_true",
                    help="with --only: write the table of the rows run (their paired differences only)")
    ap.add_argument("--reuse", default=None,
                    help="a table JSON this script wrote for the same --tasks and env: its rows whose policy is the "
                         "same are taken from its per-question scores instead of being run again (greedy rows are "
                         "deterministic on a CPU in float32)")
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=TABLE",
                    help="with --start: the row LABEL of another table JSON this script wrote on the same --tasks and "
                         "env (e.g. another arm's 'start + GRPO'), shown under that label and paired with the trained "
                         "row question by question; repeatable")
    a = ap.parse_args()
    if bool(a.start) == bool(a.sft) or (a.sft and not a.grpo):
        ap.error("give --sft and --grpo (the bundled agent's table), or --start [--trained] (an RL run's table)")
    if a.also and not a.start:
        ap.error("--also pairs a row with an RL run's trained row: give it with --start")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from drgym.atomic import atomic_write_json, atomic_write_text

    def hf(x):
        return x if x.startswith("hf:") else f"hf:{x}"

    env, gen = None, {}
    env_name = "the main job's env"
    env_desc = ("drgym/SearchQA-v0, drgym rollout defaults: wiki-default hybrid, top_k 3, max_turns 4, max_searches 3, "
                "max_fetches 2, max_obs_tokens 500; hf policies greedy, max_new_tokens 64, dtype auto (float32 on CPU)")
    if a.config:
        from drgym.training.config import load_config

        cfg = load_config(a.config)
        kw = {k: v for k, v in (cfg.env.get("kwargs") or {}).items() if k != "max_turns"}
        env = {"env_options": kw, "max_turns": cfg.eval.max_turns}
        gen = {"max_new_tokens": cfg.rollout_settings().max_new_tokens}
        env_name = f"the env of training config `{cfg.name}`"
        env_desc = (f"{cfg.env['id']} over {cfg.search}, env options {kw}, max_turns {cfg.eval.max_turns} (the training "
                    f"config {cfg.name}'s env); hf policies greedy, max_new_tokens {gen['max_new_tokens']}, "
                    f"dtype {a.dtype or 'auto (float32 on CPU)'}")
    dt = {"dtype": a.dtype} if a.dtype else {}
    if a.start:
        policies = {
            "zero-shot, scaffolded": ("hf:smollm2", {**gen, **dt}),
            "retrieve-then-read": ("rag:smollm2", dict(dt)),
            "retrieve-then-read, start reads": (f"rtr:{hf(a.start)}", {**gen, **dt}),
            "scripted": ("scripted", {}),
            "start": (hf(a.start), {**gen, **dt}),
        }
        if a.trained:
            policies["retrieve-then-read, trained reads"] = (f"rtr:{hf(a.trained)}", {**gen, **dt})
            if a.trained_label in policies:
                ap.error(f"--trained-label {a.trained_label!r} is the label of another row; choose another")
            policies[a.trained_label] = (hf(a.trained), {**gen, **dt})
    else:
        policies = {
            "zero-shot, scaffolded": ("hf:smollm2", {**gen, **dt}),
            "retrieve-then-read": ("rag:smollm2", dict(dt)),
            "scripted": ("scripted", {}),
            "SFT": (hf(a.sft), {**gen, **dt}),
            "SFT + GRPO": (hf(a.grpo), {**gen, **dt}),
        }
    runs = Path(a.runs)
    only = [x.strip() for x in a.only.split(";")] if a.only else None
    if only:
        bad = sorted(set(only) - set(policies))
        if bad:
            ap.error(f"--only: unknown labels {bad}; labels: {sorted(policies)}")
        policies = {k: v for k, v in policies.items() if k in only}
    also = {}  # read before any rollout runs, so that a bad --also costs nothing
    for item in a.also:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            ap.error(f"--also {item!r}: give LABEL=TABLE, e.g. 'start + GRPO=training/results/answerable_test_table.json'")
        if label in policies:
            ap.error(f"--also {label!r} is the label of a row of this table; rows must have different labels")
        also[label] = other_row(Path(path), label, a.tasks, env_desc)
    reused = reusable_rows(Path(a.reuse), policies, a.tasks, env_desc) if a.reuse else {}
    results = {label: reused.get(label) or run_policy(label.replace(" ", "_").replace(",", "").replace("+", "plus"),
                                                      spec, a.tasks, runs, opt, env)
               for label, (spec, opt) in policies.items()}
    results.update(also)
    if only and not a.partial:
        for label, r in results.items():
            print(label, {k: r["metrics"].get(k) for k in ("em", "f1", "answer_rate", "searches")})
        return 0
    from drgym.envs.task_loaders import load_tasks

    golds = {t.task_id: list(t.answers) for t in load_tasks(a.tasks)}
    pq = {label: r["per_question"] if "per_question" in r else per_question(r["trajectories"], golds)
          for label, r in results.items()}
    for rows_ in pq.values():  # the share of episodes that searched more than once (a second hop)
        for q in rows_.values():
            q["searched_twice"] = 1.0 if q["searches"] >= 2 else 0.0
    if a.start:
        top = a.trained_label if a.trained and a.trained_label in pq else "start"
        if "start" not in pq:
            ap.error("the table needs the 'start' row")
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
        paired_rows = {name: paired(pq[x], pq[y], m) for name, (x, y, m) in pairs.items()}
        n_key = "start"
    else:
        paired_rows = {
            "F1: SFT + GRPO - SFT": paired(pq["SFT + GRPO"], pq["SFT"], "f1"),
            "EM: SFT + GRPO - SFT": paired(pq["SFT + GRPO"], pq["SFT"], "em"),
            "answer rate: SFT + GRPO - SFT": paired(pq["SFT + GRPO"], pq["SFT"], "answered"),
            "F1: SFT + GRPO - retrieve-then-read": paired(pq["SFT + GRPO"], pq["retrieve-then-read"], "f1"),
            "F1: SFT - retrieve-then-read": paired(pq["SFT"], pq["retrieve-then-read"], "f1"),
            "F1: SFT + GRPO - zero-shot": paired(pq["SFT + GRPO"], pq["zero-shot, scaffolded"], "f1"),
        }
        n_key = "SFT"
    table = {
        "made_by": "python scripts/eval_table.py " + shlex.join(_shown_args(sys.argv[1:])),
        "tasks": a.tasks, "n_questions": len(pq[n_key]),
        "env": env_desc, "env_name": env_name,
        "bootstrap": {"method": "percentile", "n_resamples": N_RESAMPLES, "confidence": 0.95, "seed": SEED,
                      "unit": "question"},
        "rows": {label: {"policy": _shown_path(r["policy"]), "run_dir": Path(r["run_dir"]).name,
                         "scores": {m: mean_ci([q[m] for q in pq[label].values()]) for m in METRICS + ("saw_gold", "searched_twice")}}
                 for label, r in results.items()},
        "paired": paired_rows,
        "per_question": pq,
    }
    main_job = [t.task_id for t in load_tasks("hotpotqa-dev", limit=20) if t.task_id in pq[n_key]]
    if main_job:  # the main job's 20 questions (drgym rollout's default), a subset of hipporag-test
        table["main_job_questions"] = {label: {m: sum(pq[label][i][m] for i in main_job) / len(main_job)
                                               for m in METRICS} for label in pq}
    out = Path(a.out)
    atomic_write_json(out, table)
    atomic_write_text(out.with_suffix(".md"), markdown(table))
    # per-question results, one line per question, for diffing two runs question by question
    lines = [json.dumps({"task_id": i, **{label: pq[label][i] for label in pq}}, sort_keys=True)
             for i in sorted(pq[n_key])]
    atomic_write_text(out.with_suffix(".per_question.jsonl"), "\n".join(lines) + "\n")
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
