"""Summarise a GRPO run's ``metrics.jsonl`` in windows of steps (the evidence for or against a lift).

Per window of ``--window`` optimizer steps: mean train reward and its within-batch std,
train F1, the fraction of degenerate (zero-variance) groups, the share of rows the filter
dropped, the answer rate and searches of the sampled rollouts (T = 1), model tokens per
episode, entropy, grad norm and seconds per step; plus every held-out evaluation
(``eval/*``). Writes JSON (``--out``) and prints a markdown table.

Usage::

    python scripts/summarize_grpo.py runs/smollm2_drgym_cpu --out training/results/smollm2_drgym_grpo_summary.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

KEYS = {
    "reward": "reward", "reward_std": "reward_std", "f1": "rewards/f1/mean", "format": "rewards/format/mean",
    "degenerate_group_frac": "guard/degenerate_group_frac", "filtered_frac": "zero_variance/filtered_frac",
    "answered_frac": "env/answered_frac", "searches": "env/searches_mean", "invalid_actions": "env/invalid_actions_mean",
    "model_tokens": "completions/mean_length", "retrieved_token_frac": "env/retrieved_token_frac",
    "entropy": "entropy", "grad_norm": "grad_norm", "step_s": "step_time", "lr_scale": "entropy_brake/lr_scale",
}
EVAL = ("eval/f1", "eval/em", "eval/reward", "eval/answered_frac", "eval/searches_mean")


def summarize(run_dir: Path, window: int) -> dict:
    """The windowed summary of ``run_dir/metrics.jsonl`` (see the module docstring)."""
    from drgym.training.callbacks import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in rows if "reward" in r]
    evals = [{"step": r["step"], **{k.split("/", 1)[1]: r[k] for k in EVAL if k in r}} for r in rows if "eval/f1" in r]
    out = []
    for lo in range(0, len(train), window):
        w = train[lo:lo + window]
        rec = {"steps": f"{w[0]['step']}-{w[-1]['step']}"}
        for name, key in KEYS.items():
            vals = [float(r[key]) for r in w if isinstance(r.get(key), (int, float))]
            rec[name] = round(statistics.mean(vals), 4) if vals else None
        out.append(rec)
    return {"run": str(run_dir), "steps": len(train), "window": window, "windows": out, "evaluations": evals,
            "all_steps": {name: round(statistics.mean([float(r[k]) for r in train if isinstance(r.get(k), (int, float))]), 4)
                          if any(isinstance(r.get(k), (int, float)) for r in train) else None
                          for name, k in KEYS.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--label", default=None, help="name the run by this label in the output, not by its folder")
    a = ap.parse_args()
    s = summarize(Path(a.run_dir), a.window)
    if a.label:
        s["run"] = a.label
    s["made_by"] = "python scripts/summarize_grpo.py " + " ".join(
        [a.label or a.run_dir, "--window", str(a.window)] + (["--out", a.out] if a.out else []))
    if a.out:
        from drgym.atomic import atomic_write_json

        atomic_write_json(a.out, s)
    cols = ["steps", "reward", "reward_std", "f1", "degenerate_group_frac", "answered_frac", "searches", "model_tokens",
            "entropy", "step_s"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for w in s["windows"]:
        print("| " + " | ".join("" if w[c] is None else (f"{w[c]:.3f}" if isinstance(w[c], float) else str(w[c]))
                                for c in cols) + " |")
    print("\nheld-out:", json.dumps(s["evaluations"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
