"""Two training processes on CPU (accelerate launch, gloo): a run, a stop and exact resume, 2 ranks vs 1.

Runs, with the command users run (``drgym train grpo --config smollm2_two_ranks_cpu --launch``):

1. ``full``: 4 GRPO steps on 2 processes (checkpoints at steps 2 and 4, evaluation at 0, 2, 4);
2. ``stopped``: the same run, stopped (SIGTERM to the launcher's process group) once
   ``checkpoint-2`` is complete, then resumed with ``--launch --resume``; its steps 3 and 4
   (logged metrics, task ids, final adapter, AdamW moments of checkpoint-4) against ``full``'s;
3. one writer per file: every record of ``metrics.jsonl``, ``batches.jsonl`` and
   ``degenerate_groups.jsonl`` once, each batch all ranks' task ids, per-rank RNG files;
4. step 1 on 2 processes against 1 process of the same global batch
   (:func:`ranks_helpers.compare_first_step`: the 1-process run replays the ranks' rollouts).

Writes one JSON (default ``training/results/ranks_cpu/ranks_cpu.json``)::

    python scripts/ranks_cpu.py --work WORK_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ranks_helpers():
    """``tests/ranks_helpers.py``, the record/replay harness the test uses (loaded by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ranks_helpers", ROOT / "tests" / "ranks_helpers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_helpers = _ranks_helpers()
adapter_weights, compare_first_step = _helpers.adapter_weights, _helpers.compare_first_step

COMPARED = ("loss", "grad_norm", "reward", "reward_std", "rewards/f1/mean", "rewards/format/mean", "entropy",
            "env/turns_mean", "env/searches_mean", "env/answered_frac", "env/obs_tokens_mean",
            "guard/degenerate_group_frac", "zero_variance/filtered_frac", "num_tokens")


def drgym(*args: str) -> list[str]:
    return ["nice", "-n", "10", str(Path(sys.executable).parent / "drgym"), *args]


def launch(out: Path, *extra: str, log: Path, stop_after: str | None = None, timeout: float = 2400) -> float:
    """``drgym train grpo --config smollm2_two_ranks_cpu --launch -o out ...``; wall seconds.

    With ``stop_after`` (a checkpoint folder name), the launcher's process group gets SIGTERM
    once that checkpoint's ``trainer_state.json`` exists (the save is complete).
    """
    cmd = drgym("train", "grpo", "--config", "smollm2_two_ranks_cpu", "--launch", "-o", str(out), *extra)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True)
        while p.poll() is None:
            if time.perf_counter() - t0 > timeout:
                os.killpg(p.pid, signal.SIGKILL)
                raise RuntimeError(f"{' '.join(cmd)}: no end after {timeout} s")
            if stop_after and (out / stop_after / "trainer_state.json").is_file():
                time.sleep(1.0)
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=120)
                return time.perf_counter() - t0
            time.sleep(0.5)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}; the end of its log:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def by_step(path: Path) -> dict[int, dict]:
    """Training records of ``metrics.jsonl`` by step (a resumed run's re-logged step: the last wins)."""
    out: dict[int, dict] = {}
    for r in jsonl(path):
        if "loss" in r:
            out[int(r["step"])] = r
    return out


def writers(run: Path) -> dict:
    """Each file's records once (one writer), each batch every rank's ids, per-rank RNG states."""
    metrics = jsonl(run / "metrics.jsonl")
    train = [r["step"] for r in metrics if "loss" in r]
    evals = [r["step"] for r in metrics if "eval/reward" in r]
    batches = jsonl(run / "batches.jsonl")
    degenerate = jsonl(run / "degenerate_groups.jsonl")
    keys = [(d["step"], d["task_id"]) for d in degenerate]
    ckpts = sorted(p.name for p in run.glob("checkpoint-*"))
    return {"train_records_per_step": train, "eval_records_at_steps": evals,
            "batch_sizes": [len(b["task_ids"]) for b in batches], "batch_steps": [b["step"] for b in batches],
            "degenerate_group_records": len(keys), "degenerate_group_duplicates": len(keys) - len(set(keys)),
            "checkpoints": {c: sorted(p.name for p in (run / c).iterdir() if p.name.startswith("rng_state"))
                            for c in ckpts},
            "eval_dirs": sorted(p.name for p in (run / "eval").iterdir()) if (run / "eval").is_dir() else [],
            "summary_json": (run / "summary.json").is_file()}


def resume_check(full: Path, stopped: Path) -> dict:
    import torch

    f, s = by_step(full / "metrics.jsonl"), by_step(stopped / "metrics.jsonl")
    steps = {}
    for st in (3, 4):
        steps[st] = {k: [f[st].get(k), s[st].get(k)] for k in COMPARED}
    worst = max(abs(a - b) for st in steps.values() for a, b in st.values() if a is not None and b is not None)
    wf, ws = adapter_weights(full / "final"), adapter_weights(stopped / "final")
    wdiff = max(float((wf[k] - ws[k]).abs().max()) for k in wf)
    of = torch.load(full / "checkpoint-4" / "optimizer.pt", weights_only=False)["state"]
    os_ = torch.load(stopped / "checkpoint-4" / "optimizer.pt", weights_only=False)["state"]
    mdiff = max(float((of[k][m] - os_[k][m]).abs().max()) for k in of for m in ("exp_avg", "exp_avg_sq"))
    bf = {b["step"]: b["task_ids"] for b in jsonl(full / "batches.jsonl")}
    bs = {b["step"]: b["task_ids"] for b in jsonl(stopped / "batches.jsonl")}
    return {"steps": steps, "max_abs_diff_logged": worst, "final_adapter_max_abs_diff": wdiff,
            "adam_moments_max_abs_diff": mdiff, "adam_step": [float(of[0]["step"]), float(os_[0]["step"])],
            "same_task_ids_steps_3_4": all(bf[k] == bs[k] for k in (3, 4)),
            "stopped_at": sorted(p.name for p in stopped.glob("checkpoint-*"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="Folder for the runs (not the repository).")
    ap.add_argument("--out", default=str(ROOT / "training" / "results" / "ranks_cpu" / "ranks_cpu.json"))
    ap.add_argument("--skip", nargs="*", default=[], choices=["resume", "compare", "spread"],
                    help="Parts not to run; with an existing --out, the parts run replace theirs in it.")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"command": "python scripts/ranks_cpu.py --work WORK_DIR",
                    "config": "training/configs/smollm2_two_ranks_cpu.yaml",
                    "accelerate_config": "training/configs/accelerate_cpu.yaml",
                    "load_average_at_start": os.getloadavg()}
    import accelerate
    import torch
    import transformers
    import trl

    result["versions"] = {"torch": torch.__version__, "accelerate": accelerate.__version__,
                          "transformers": transformers.__version__, "trl": trl.__version__}
    if "resume" not in a.skip:
        full, stopped = work / "full", work / "stopped"
        wall_full = launch(full, log=work / "full.log")
        wall_stop = launch(stopped, log=work / "stopped.log", stop_after="checkpoint-2")
        wall_res = launch(stopped, "--resume", log=work / "resumed.log")
        m = by_step(full / "metrics.jsonl")
        result["full_run"] = {"wall_s": round(wall_full, 1),
                              "step_time_s": {k: round(v["step_time"], 1) for k, v in m.items() if "step_time" in v},
                              "generation_s": {k: round(v["timing/generation_s"], 1) for k, v in m.items()},
                              "reward": {k: v["reward"] for k, v in m.items()},
                              "writers": writers(full)}
        result["stop_and_resume"] = {"wall_s": [round(wall_stop, 1), round(wall_res, 1)], **resume_check(full, stopped),
                                     "writers": writers(stopped)}
    if "compare" not in a.skip:
        load = os.getloadavg()
        result["one_vs_two_ranks"] = {"load_average_at_start": load, **compare_first_step(work / "compare")}
    if "spread" not in a.skip:  # the same with a reward that gives every group a spread (the split one too)
        load = os.getloadavg()
        result["one_vs_two_ranks_every_group_spread"] = {
            "load_average_at_start": load, **compare_first_step(work / "compare_spread", spread=True)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    if a.skip and Path(a.out).is_file():  # a partial run replaces its own parts of an earlier JSON
        earlier = json.loads(Path(a.out).read_text())
        result = {**earlier, **{k: v for k, v in result.items() if k in (
            "full_run", "stop_and_resume", "one_vs_two_ranks", "one_vs_two_ranks_every_group_spread")}}
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(a.out)
    print(json.dumps(result, indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
