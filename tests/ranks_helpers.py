"""Several training processes on CPU: record one run's rollouts, replay them in another.

``drgym train grpo`` under ``accelerate launch`` (two gloo processes, ``training/configs/
accelerate_cpu.yaml``) and the same command in one process draw the same questions for
the same global batch (TRL's ``RepeatSampler`` is seeded alike on every rank; rank ``r``
takes rows ``[r*n, (r+1)*n)``), but their sampled rollouts differ: each rank samples its
rows from its own RNG stream. To compare everything downstream of generation (rewards,
the gathered group statistics and ``env/*`` metrics, advantages, loss, gradient, the
update), the two-process run records each rank's rollout output and the one-process run
replays them, after checking that its prompts are the two ranks' prompts in rank order.

Run as a script, it patches :class:`drgym.training.rollout.SearchRolloutFunc` where
:func:`drgym.training.grpo.build_trainer` takes it and then runs the ``drgym`` command
line unchanged::

    accelerate launch --config_file training/configs/accelerate_cpu.yaml --num_processes 2 \\
        tests/ranks_helpers.py record DIR [--spread] train grpo --config C2.yaml
    python tests/ranks_helpers.py replay DIR [--spread] train grpo --config C1.yaml

``scripts/ranks_cpu.py`` and ``tests/test_ranks_cpu.py`` use :func:`compare_first_step`.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ACCELERATE_CPU = ROOT / "training" / "configs" / "accelerate_cpu.yaml"

# metrics that are functions of the whole generation batch, so equal in both runs up to
# float summation order (TRL gathers them, drgym gathers env/*, guard/* and the filter's share)
GATHERED = ("loss", "grad_norm", "reward", "reward_std", "frac_reward_zero_std", "rewards/f1/mean", "rewards/f1/std",
            "rewards/format/mean", "rewards/format/std", "env/turns_mean", "env/searches_mean",
            "env/invalid_actions_mean", "env/answered_frac", "env/empty_answer_frac", "env/obs_tokens_mean",
            "env/retrieved_token_frac", "guard/degenerate_group_frac", "guard/all_empty_group_frac",
            "guard/empty_answer_frac", "zero_variance/filtered_frac", "completions/mean_length",
            "completions/min_length", "completions/max_length", "completions/clipped_ratio", "num_tokens",
            "entropy", "clip_ratio/region_mean")


def action_chars(prompts, completions, trajectory=None, **kw):
    """Characters the model wrote in its actions / 100: an extra reward that gives almost
    every group a reward spread (so no group is filtered and a split group has advantages)."""
    return [sum(len(s["action"]) for s in t["steps"]) / 100 for t in trajectory]


def _patch(mode: str, folder: Path, spread: bool = False) -> None:
    from drgym.training import grpo
    from drgym.training.rollout import SearchRolloutFunc

    if spread:
        build = grpo.build_trainer

        def with_spread(cfg, **kw):
            kw["extra_reward_funcs"] = [action_chars, *(kw.get("extra_reward_funcs") or [])]
            return build(cfg, **kw)

        grpo.build_trainer = with_spread

    class Recording(SearchRolloutFunc):
        def run(self, prompts, **kw):
            out = super().run(prompts, **kw)
            rank = int(os.environ.get("RANK", "0"))
            path = folder / f"rank{rank}_call{len(self.history) - 1}.pkl"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps({"task_ids": self.history[-1], "out": out,
                                          "timings": dict(self.last_timings)}))
            tmp.replace(path)
            return out

    class Replaying(SearchRolloutFunc):
        def run(self, prompts, **kw):
            k = len(self.history)
            parts = [pickle.loads(p.read_bytes()) for p in sorted(folder.glob(f"rank*_call{k}.pkl"))]
            if not parts:
                raise RuntimeError(f"no recorded rollout for call {k} in {folder}")
            ids = [self.prompt_to_task[p if isinstance(p, str) else str(p)].task_id for p in prompts]
            expected = [t for p in parts for t in p["task_ids"]]
            if ids != expected:
                raise RuntimeError(f"the one-process batch is not the ranks' batches in rank order: {ids} vs {expected}")
            out = {key: (None if parts[0]["out"][key] is None else [x for p in parts for x in p["out"][key]])
                   for key in parts[0]["out"]}
            self.history.append(ids)
            self.last_timings = {"generation_s": 0.0, "env_s": 0.0}
            self.last_driver_stats, self.last_step_stats = {}, {}
            self.model_tokens.append([sum(m) for m in out["env_mask"]])
            return out

    grpo.SearchRolloutFunc = Recording if mode == "record" else Replaying


def tiny_config(path: Path, out: Path, *, processes: int, rows_per_process: int = 6, max_steps: int = 1,
                **grpo: Any) -> Path:
    """Write a run config (YAML) of ``smollm2_two_ranks_cpu`` with ``processes x rows_per_process`` rows.

    Defaults: 6 rows per process with groups of 4, so with 2 processes the middle group is
    split between the ranks; no evaluation, no checkpoint, no TensorBoard.
    """
    import yaml

    data = yaml.safe_load((ROOT / "training" / "configs" / "smollm2_two_ranks_cpu.yaml").read_text())
    data["output_dir"] = str(out)
    data["eval"] = {"every_steps": 0, "num_tasks": 4, "max_turns": 2}
    data["tasks"]["train"] = {"set": "answerable-train", "limit": 12}
    data["launch"] = {"accelerate_config": str(ACCELERATE_CPU), "num_processes": processes}
    data["rollout"]["gen_batch_size"] = processes * rows_per_process
    g = data["grpo"]
    g.update({"max_steps": max_steps, "per_device_train_batch_size": rows_per_process, "save_strategy": "no",
              "report_to": "none"})
    g.update(grpo)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _run(cmd: list[str], log: Path, timeout: float) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.call(["nice", "-n", "10", *cmd], stdout=f, stderr=subprocess.STDOUT, env=_env(),
                             cwd=str(ROOT), timeout=timeout)
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}; the end of its log:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def train_record(run: Path) -> dict[str, Any]:
    """The step-1 training record of a run's ``metrics.jsonl`` (one writer: exactly one such line)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step1 = [r for r in rows if r.get("step") == 1 and "loss" in r]
    if len(step1) != 1:
        raise AssertionError(f"{run / 'metrics.jsonl'}: {len(step1)} training records of step 1 (one writer: 1)")
    return step1[0]


def adapter_weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def compare_first_step(work: Path, timeout: float = 1500, *, spread: bool = False) -> dict[str, Any]:
    """Run step 1 on 2 processes (recording) and on 1 process (replaying); return the comparison.

    ``spread``: both runs add :func:`action_chars` to the config's rewards, so (almost)
    every group has a reward spread, the split group included.

    Returns:
        ``{"two_ranks": {...}, "one_rank": {...}, "metrics": {name: [two, one, abs diff]},
        "weights_max_abs_diff", "update_max_abs", "batches_two_ranks": [...], "same_keys"}``.

    Raises:
        RuntimeError: a run failed (its log's end is in the message).
    """
    work.mkdir(parents=True, exist_ok=True)
    rec = work / "rollouts"
    shutil.rmtree(rec, ignore_errors=True)
    rec.mkdir()
    two, one = work / "two_ranks", work / "one_rank"
    for d in (two, one):
        shutil.rmtree(d, ignore_errors=True)
    c2 = tiny_config(work / "two_ranks.yaml", two, processes=2)
    c1 = tiny_config(work / "one_rank.yaml", one, processes=1, rows_per_process=12)
    helper = str(Path(__file__).resolve())
    accelerate = str(Path(sys.executable).parent / "accelerate")
    flag = ["--spread"] if spread else []
    wall2 = _run([accelerate, "launch", "--config_file", str(ACCELERATE_CPU),
                  "--num_processes", "2", helper, "record", str(rec), *flag, "train", "grpo", "--config", str(c2)],
                 work / "two_ranks.log", timeout)
    wall1 = _run([sys.executable, helper, "replay", str(rec), *flag, "train", "grpo", "--config", str(c1)],
                 work / "one_rank.log", timeout)
    m2, m1 = train_record(two), train_record(one)
    names = GATHERED + (("rewards/action_chars/mean", "rewards/action_chars/std") if spread else ())
    metrics = {k: [m2.get(k), m1.get(k), None if m2.get(k) is None or m1.get(k) is None else abs(m2[k] - m1[k])]
               for k in names}
    w2, w1 = adapter_weights(two / "final"), adapter_weights(one / "final")
    from drgym.models import resolve_lm

    w0 = adapter_weights(Path(resolve_lm("smollm2-drgym")))
    diff = max(float((w2[k] - w1[k]).abs().max()) for k in w2)
    moved = max(float((w1[k] - w0[k]).abs().max()) for k in w1 if k in w0)
    batches2 = [json.loads(x) for x in (two / "batches.jsonl").read_text().splitlines()]
    # the total reward of each row, as the env scored it (plus action_chars with spread), by group of 4
    rows = [(c.get("f1+format"), t) for p in sorted(rec.glob("rank*_call0.pkl"))
            for c, t in zip(pickle.loads(p.read_bytes())["out"]["env_reward_components"],
                            pickle.loads(p.read_bytes())["out"]["trajectory"])]
    totals = [round(r + (action_chars(None, None, [t])[0] if spread else 0.0), 9) for r, t in rows]
    groups = [totals[g:g + 4] for g in range(0, len(totals), 4)]
    rank_files = sorted(p.name for p in rec.iterdir())
    return {"two_ranks": {"config": c2.name, "step_time_s": m2.get("step_time"), "wall_s": round(wall2, 1),
                          "generation_s_slowest_rank": m2.get("timing/generation_s")},
            "one_rank": {"config": c1.name, "step_time_s": m1.get("step_time"), "wall_s": round(wall1, 1),
                         "replayed": rank_files},
            "metrics": metrics,
            "weights_max_abs_diff": diff, "update_max_abs": moved, "batches_two_ranks": batches2,
            "group_rewards": groups, "split_group_has_spread": len(set(groups[1])) > 1 if len(groups) > 1 else None,
            "same_keys": sorted(w2) == sorted(w1)}


if __name__ == "__main__":
    mode, folder, *rest = sys.argv[1:]
    if mode not in ("record", "replay"):
        raise SystemExit("usage: ranks_helpers.py record|replay DIR [--spread] <drgym arguments>")
    spread = bool(rest) and rest[0] == "--spread"
    _patch(mode, Path(folder), spread=spread)
    rest = rest[1:] if spread else rest
    from drgym.cli import main

    sys.argv = ["drgym", *rest]
    main()
