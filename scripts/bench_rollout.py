"""Benchmark rollouts: episodes per minute and where the wall time goes, per policy.

For each policy (default ``scripted``, ``rag:smollm2``, ``hf:smollm2``) this runs
:func:`drgym.evaluation.runner.run_rollout` on the same first ``--n`` questions of
``--tasks`` (default the main job's, ``synth-demo``) over the local ``wiki-default`` backend (shared, loaded once) and
writes JSON with:

- ``episodes_per_min``: episodes / wall seconds of the episode loop (setup excluded;
  ``setup_s`` is the policy load);
- ``time_share``: share of the episode loop's wall time in ``generation`` (policy
  ``act`` calls), ``search`` (the driver's batched search and fetch calls), ``reward``
  (env and runner reward calls) and ``env`` (the rest: parsing, formatting, records);
- ``cpu_s_per_episode``: process CPU seconds (user+sys) per episode, a figure that
  depends less than wall time on other load on a shared machine;
- the run's EM/F1, turns, tokens.

``--dtypes float32,bfloat16`` adds one ``hf:smollm2`` row per weight dtype (to choose the
CPU default). Usage::

    python scripts/bench_rollout.py --n 8 --out bench_rollout.json

**The main job under load** (``--background-load N``): runs the main job itself, the
``drgym rollout`` command (default the main job's policy ``hf:smollm2-drgym``, ``--n 20`` tasks, each run a
fresh process into a fresh run folder), alternately on the machine as it is ("idle")
and with ``N`` busy processes (``python -c 'while True: pass'``, or with
``--background-kind torch`` 2-thread torch matmul loops, OpenMP jobs like the main job)
that this script starts before the run and kills after it, ``--reps`` times, after one untimed warm-up run that
fills the model and index caches. For each run it records the command's wall time, the
episode loop's time per episode (``metrics.json``), the generation share, the CPU
seconds of the command, the thread settings and dtype from ``config.json``, and the load
averages; then medians and the loaded/idle ratios. ``--before-src DIR`` also runs the
``drgym`` of another checkout (e.g. ``git archive`` of an older commit, with
``drgym/envs``, ``drgym/rewards`` and ``drgym/training`` linked to its top-level folders)
in the same passes, for before/after, and
``--job-env KEY=VALUE`` sets environment variables for the main job only::

    nice -n 10 python scripts/bench_rollout.py --background-load 2 --out scripts/results/bench_rollout_load.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drgym.config import DEFAULT_POLICY, DEFAULT_QA_TASKS

BUSY_LOOP = "while True: pass"
TORCH_LOOP = "import torch; torch.set_num_threads(2); a = torch.randn(256, 256)\nwhile True: a @ a"
"""``--background-kind torch``: a busy process that is itself an OpenMP job (2 torch threads,
small back-to-back matmuls, the user's OMP settings), like a second model beside the main job."""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="scripted,rag:smollm2,hf:smollm2")
    ap.add_argument("--dtypes", default="", help="comma list of dtypes for extra hf:smollm2 rows, e.g. float32,bfloat16")
    ap.add_argument("--tasks", default=DEFAULT_QA_TASKS, help=f"task set (default the main job's, {DEFAULT_QA_TASKS})")
    ap.add_argument("--n", type=int, default=None, help="tasks per run (default 8; 20 with --background-load)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default="bench_rollout.json")
    ap.add_argument("--background-load", type=int, default=0, metavar="N",
                    help="measure the main job (drgym rollout) idle and with N busy processes, in this one run")
    ap.add_argument("--background-kind", choices=("python", "torch"), default="python",
                    help="busy processes: a pure-Python loop, or 2-thread torch matmuls (an OpenMP job)")
    ap.add_argument("--main-policy", default=DEFAULT_POLICY,
                    help=f"policy of the main job (with --background-load; default {DEFAULT_POLICY})")
    ap.add_argument("--reps", type=int, default=2, help="idle/loaded pairs (with --background-load)")
    ap.add_argument("--before-src", default=None, metavar="DIR",
                    help="also run the main job from this checkout (e.g. an export of an older commit) in the same "
                         "passes, rows marked code='before' (with --background-load)")
    ap.add_argument("--job-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment variable for the main job (repeatable; with --background-load)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.background_load:
        return main_job_under_load(args)
    args.n = args.n or 8

    from drgym.evaluation.runner import RolloutConfig, run_rollout
    from drgym.policies.factory import make_policy
    from drgym.search.registry import get_backend

    t0 = time.perf_counter()
    backend = get_backend("local")
    backend.search("warm up the encoder", k=3)
    backend_s = time.perf_counter() - t0
    rows = [(p, {}) for p in args.policies.split(",") if p]
    rows += [("hf:smollm2", {"dtype": d}) for d in args.dtypes.split(",") if d]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        for k, (spec, opts) in enumerate(rows):
            t1 = time.perf_counter()
            pol = make_policy(spec, **opts)
            setup = time.perf_counter() - t1
            cfg = RolloutConfig(tasks=args.tasks, policy=spec, n=args.n, batch_size=args.batch_size,
                                out=str(Path(tmp) / f"run{k}"), policy_options=opts, plots=False)
            c0, w0 = _cpu(), time.perf_counter()
            res = run_rollout(cfg, policy=pol, backend=backend, progress=False, fresh=True)
            wall, cpu = time.perf_counter() - w0, _cpu() - c0
            pol.close()
            m = res.metrics
            desc = pol.describe() if hasattr(pol, "describe") else {}
            row = {
                "policy": spec, "options": opts, "dtype": desc.get("dtype") or (desc.get("reader") or {}).get("dtype"),
                "episodes": m["episodes"], "wall_s": round(wall, 2), "setup_s": round(setup, 2),
                "episodes_per_min": round(60 * m["episodes"] / wall, 2),
                "s_per_episode": round(wall / m["episodes"], 3),
                "cpu_s_per_episode": round(cpu / m["episodes"], 3),
                "time_share": {k2: round(v, 4) for k2, v in m["last_session"]["share"].items()},
                "phase_wall_s": {k2: m["last_session"][k2] for k2 in ("generation", "search", "env", "reward")},
                "em": m["em"], "f1": m["f1"], "answer_rate": m["answer_rate"], "turns": m["turns"],
                "completion_tokens_per_episode": m["completion_tokens"], "prompt_tokens_per_episode": m["prompt_tokens"],
            }
            gen = m["last_session"]["generation"] or 0.0
            toks = m["completion_tokens"] * m["episodes"]
            row["generated_tokens_per_s"] = round(toks / gen, 2) if gen and toks else None
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    out = {
        "benchmark": "rollout", "tasks": args.tasks, "n": args.n, "batch_size": args.batch_size,
        "backend_load_s": round(backend_s, 2), "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": os.getloadavg()[0], "results": results,
        "note": "wall times on a shared machine; cpu_s_per_episode is less sensitive to other load",
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _procs_running() -> int | None:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("procs_running"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _one_job(args, out_dir: Path, n: int, load: int, env: dict[str, str]) -> dict:
    """One ``drgym rollout`` process, with ``load`` busy processes running beside it."""
    cmd = [sys.executable, "-m", "drgym", "rollout", "--policy", args.main_policy, "--tasks", args.tasks,
           "--n", str(n), "--batch-size", str(args.batch_size), "--out", str(out_dir), "--fresh",
           "--no-plots", "--no-progress"]
    code = TORCH_LOOP if args.background_kind == "torch" else BUSY_LOOP
    busy = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(load)]
    try:
        if busy:
            time.sleep(1.0)  # let the scheduler see them
        la0, pr0 = os.getloadavg(), _procs_running()
        c0, w0 = _children_cpu(), time.perf_counter()
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - w0
    finally:
        for b in busy:
            b.kill()
        for b in busy:
            b.wait()
    # the busy loops are children too: their CPU time is in RUSAGE_CHILDREN after wait()
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    m = json.loads((out_dir / "metrics.json").read_text())
    cfg = json.loads((out_dir / "config.json").read_text())
    sess = m.get("last_session") or {}
    loop = float(sess.get("loop_s") or m.get("wall_s_last_session") or wall)
    eps = int(m["episodes"])
    pol = cfg.get("policy") or {}
    return {
        "background_load": load, "episodes": eps, "command_wall_s": round(wall, 2),
        "setup_s": m.get("setup_s_last_session"), "loop_s": round(loop, 2), "s_per_episode": round(loop / eps, 3),
        "generation_share": round(float((sess.get("share") or {}).get("generation", 0.0)), 3),
        "cpu_s_incl_busy_loops": round(_children_cpu() - c0, 2),
        "load_avg_1m_before": round(la0[0], 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "procs_running_before": pr0,
        "threads": cfg.get("threads"), "dtype": pol.get("dtype") or (pol.get("reader") or {}).get("dtype"),
        "dtype_reason": pol.get("dtype_reason"),
        "em": m.get("em"), "f1": m.get("f1"), "invalid_action_rate": m.get("invalid_action_rate"),
        "completion_tokens_per_episode": m.get("completion_tokens"),
    }


def main_job_under_load(args) -> dict:
    """The main job idle and under ``args.background_load`` busy processes (see the module docstring)."""
    n = args.n or 20
    env = dict(os.environ)  # drgym is not imported yet: the user's environment
    for kv in args.job_env:
        k, sep, v = kv.partition("=")
        if not sep:
            raise SystemExit(f"--job-env wants KEY=VALUE, got {kv!r}")
        env[k] = v
    variants = {"current": env}
    if args.before_src:
        variants["before"] = {**env, "PYTHONPATH": os.pathsep.join(
            [str(Path(args.before_src).resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    la_start = [round(x, 2) for x in os.getloadavg()]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-load-") as tmp:
        t = time.perf_counter()
        _one_job(args, Path(tmp) / "warmup", 1, 0, env)
        warmup_s = time.perf_counter() - t
        for rep in range(args.reps):
            for load in (0, args.background_load):
                for name, venv in variants.items():
                    row = {"rep": rep, "code": name, **_one_job(args, Path(tmp) / f"run{rep}-{load}-{name}", n, load, venv)}
                    runs.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "threads"}), file=sys.stderr, flush=True)

    summary: dict = {}
    for name in variants:
        summary[name] = {}
        for key in ("s_per_episode", "command_wall_s", "loop_s"):
            def med(load: int) -> float:
                return round(statistics.median(r[key] for r in runs if r["background_load"] == load and r["code"] == name), 3)

            idle, loaded = med(0), med(args.background_load)
            summary[name][key] = {"idle": idle, "loaded": loaded, "loaded_over_idle": round(loaded / idle, 2) if idle else None}
    ratio = summary["current"]["s_per_episode"]["loaded_over_idle"]
    out = {
        "benchmark": "main job under background load",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "main_job": f"drgym rollout --policy {args.main_policy} --tasks {args.tasks} --n {n} --batch-size {args.batch_size}",
        "background_load": f"{args.background_load} x python -c {TORCH_LOOP if args.background_kind == 'torch' else BUSY_LOOP!r}, "
                           "started before and killed after each loaded run",
        "before": f"rows with code='before' run the drgym package of {Path(args.before_src).resolve()}" if args.before_src else None,
        "job_env": args.job_env, "reps": args.reps, "warmup_s": round(warmup_s, 1),
        "cpu_count": os.cpu_count(), "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1_5_15_at_start": la_start, "load_avg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
        "median": summary,
        "target": {"loaded_over_idle_s_per_episode<=3": ratio is not None and ratio <= 3},
        "runs": runs,
        "note": "'idle' is the machine as it is (shared with other jobs: see the load averages); medians over reps",
    }
    from drgym.atomic import atomic_write_json

    atomic_write_json(args.out, out)
    print(json.dumps(out["median"]), file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
