"""Run the main job's policies with `drgym rollout` and keep their figures for the README.

Each policy runs as the README shows it, on two slices of 20 questions over wiki-default:
`synth-demo` (the default: `drgym rollout` runs the trained agent `hf:smollm2-drgym`; and
`--policy hf:smollm2`, `rag:smollm2`, `scripted`), and the multi-hop `hotpotqa-dev`
(`--tasks hotpotqa-dev`, the same policies, and `hf:smollm2` again with torch held to AVX2
kernels), into a fresh `runs/main_job/NAME/`. Its `metrics.json` and `config.json` are copied to
`scripts/results/main_job/NAME/`, with a `per_question.jsonl` (each question's answer and
scores) and a `run.json` with the command, its wall time,
the load average before and after, and the CPU (model, cores, torch's CPU capability:
bfloat16 results differ between CPUs with and without AVX512-BF16). Then
`python scripts/readme_tables.py --write` puts them in the README's main-job table.

    python scripts/main_job.py                    # all of POLICIES
    python scripts/main_job.py --only scripted    # one (NAME as below)
    python scripts/main_job.py --add trained "--policy hf:runs/x/final"   # another row

A row added with --add also needs a line in MAIN_JOB_ROWS of scripts/readme_tables.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "scripts" / "results" / "main_job"

# NAME: (the arguments after `drgym rollout`, extra environment variables).
HOTPOTQA = ["--tasks", "hotpotqa-dev"]
POLICIES: dict[str, tuple[list[str], dict[str, str]]] = {
    # the main job as the README runs it: the trained agent on synth-demo (the defaults)
    "demo_hf_smollm2_drgym": ([], {}),
    "demo_hf_smollm2": (["--policy", "hf:smollm2"], {}),
    "demo_rag_smollm2": (["--policy", "rag:smollm2"], {}),
    "demo_scripted": (["--policy", "scripted"], {}),
    # the multi-hop slice, one option away: the first 20 hotpotqa-dev questions
    "hf_smollm2": ([*HOTPOTQA, "--policy", "hf:smollm2"], {}),
    "rag_smollm2": ([*HOTPOTQA, "--policy", "rag:smollm2"], {}),
    "scripted": ([*HOTPOTQA, "--policy", "scripted"], {}),
    # the bundled agent trained in drgym; these questions are not in its train slice
    "hf_smollm2_drgym": ([*HOTPOTQA, "--policy", "hf:smollm2-drgym"], {}),
    # hf:smollm2 as a CPU without AVX-512 runs it: torch and oneDNN held to AVX2 kernels.
    # In float32 (the CPU default) every answer must be the one of hf_smollm2.
    "hf_smollm2_avx2": ([*HOTPOTQA, "--policy", "hf:smollm2"], {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
}


def _cpu(env: dict[str, str]) -> dict:
    """The CPU, and the kernel set torch dispatches to under ``env``."""
    capability = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                                capture_output=True, text=True, check=True, env={**os.environ, **env}).stdout.strip()
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    flags = set()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {"model": model, "cores": os.cpu_count(), "torch_cpu_capability": capability,
            "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def _commit() -> str | None:
    """HEAD, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def write_per_question(trajectories: Path, dest: Path) -> int:
    """One line per question of a run (task order): ``task_id``, ``final_answer`` and its
    ``em``, ``f1``, ``cover_em``, so a rerun on another CPU can be diffed question by question.

    Returns:
        The number of lines written.
    """
    rows = []
    for line in trajectories.read_text(encoding="utf-8").splitlines():
        t = json.loads(line)
        comps = t.get("reward_components") or {}
        rows.append({"task_id": t["task_id"], "final_answer": t.get("final_answer"),
                     **{k: comps.get(k) for k in ("em", "f1", "cover_em")}})
    dest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def run(name: str, args: list[str], env: dict[str, str], runs_dir: Path) -> dict:
    out = runs_dir / name
    if out.exists():
        shutil.rmtree(out)  # a fresh run, not a resumed one
    drgym = shutil.which("drgym", path=str(Path(sys.executable).parent)) or "drgym"
    cmd = ["drgym", "rollout", *args, "--out", os.path.relpath(out, REPO)]
    info = {"command": shlex.join(cmd), "env": env, "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load_avg_1_5_15_before": list(os.getloadavg()), "cpu": _cpu(env), "commit": _commit()}
    t0 = time.perf_counter()
    subprocess.run([drgym, *cmd[1:]], cwd=REPO, check=True, env={**os.environ, **env})
    info["wall_s"] = round(time.perf_counter() - t0, 1)
    info["load_avg_1_5_15_after"] = list(os.getloadavg())
    dest = RESULTS / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("metrics.json", "config.json"):
        shutil.copyfile(out / f, dest / f)
    write_per_question(out / "trajectories.jsonl", dest / "per_question.jsonl")
    (dest / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(POLICIES), help="run only this policy (repeatable)")
    ap.add_argument("--add", nargs=2, metavar=("NAME", "ARGS"), help="run another policy: NAME and the rollout arguments")
    ap.add_argument("--runs-dir", default="runs/main_job", help="where the run directories go (default runs/main_job)")
    a = ap.parse_args(argv)
    todo = {n: POLICIES[n] for n in (a.only or POLICIES)} if not a.add or a.only else {}
    if a.add:
        todo[a.add[0]] = (shlex.split(a.add[1]), {})
    for name, (args, env) in todo.items():
        info = run(name, args, env, REPO / a.runs_dir)
        print(f"{name}: {info['wall_s']} s, load {info['load_avg_1_5_15_before'][0]:.2f} -> "
              f"{info['load_avg_1_5_15_after'][0]:.2f}; results in {RESULTS / name}")


if __name__ == "__main__":
    main()
