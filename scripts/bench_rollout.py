"""Benchmark rollouts: episodes per minute and where the wall time goes, per policy.

For each policy (default ``scripted``, ``rag:smollm2``, ``hf:smollm2``) this runs
:func:`drgym.evaluation.runner.run_rollout` on the same first ``--n`` questions of
``hotpotqa-dev`` over the local ``wiki-default`` backend (shared, loaded once) and
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
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="scripted,rag:smollm2,hf:smollm2")
    ap.add_argument("--dtypes", default="", help="comma list of dtypes for extra hf:smollm2 rows, e.g. float32,bfloat16")
    ap.add_argument("--tasks", default="hotpotqa-dev")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", default="bench_rollout.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


if __name__ == "__main__":
    main()
