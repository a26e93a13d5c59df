"""Scores reproduce across x86-64 CPUs: the main job in float32 (the CPU default) gives the
same answer to every question with torch's native kernels and held to AVX2 kernels.

- the committed main-job records (``scripts/main_job.py``): ``hf_smollm2`` (native
  kernels) and ``hf_smollm2_avx2`` (``ATEN_CPU_CAPABILITY=avx2``), question by question;
- (slow) the same check run here: ``drgym rollout`` on a few questions in two processes,
  one per kernel setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = ROOT / "scripts" / "results" / "main_job"
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _per_question(path: Path) -> dict[str, dict]:
    return {r["task_id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def test_the_committed_main_job_is_the_same_on_avx512_and_avx2_kernels():
    native, avx2 = (_per_question(MAIN_JOB / n / "per_question.jsonl") for n in ("hf_smollm2", "hf_smollm2_avx2"))
    assert len(native) == 20 and native.keys() == avx2.keys()
    assert {t: r["final_answer"] for t, r in native.items()} == {t: r["final_answer"] for t, r in avx2.items()}
    assert native == avx2  # and so every score
    runs = {n: json.loads((MAIN_JOB / n / "run.json").read_text()) for n in ("hf_smollm2", "hf_smollm2_avx2")}
    assert runs["hf_smollm2_avx2"]["cpu"]["torch_cpu_capability"] == "AVX2"
    assert runs["hf_smollm2"]["cpu"]["torch_cpu_capability"] != "AVX2"  # the record compares two kernel sets
    for n in runs:
        policy = json.loads((MAIN_JOB / n / "config.json").read_text())["policy"]
        assert policy["dtype"] == "float32" and policy["dtype_reason"].startswith("auto: float32 on CPU")
    metrics = {n: json.loads((MAIN_JOB / n / "metrics.json").read_text()) for n in runs}
    assert {k: metrics["hf_smollm2"][k] for k in ("em", "f1", "cover_em")} == \
        {k: metrics["hf_smollm2_avx2"][k] for k in ("em", "f1", "cover_em")}


def test_the_committed_main_job_is_the_same_on_an_amd_and_an_intel_amx_cpu():
    amd, intel = (_per_question(MAIN_JOB / n / "per_question.jsonl") for n in ("hf_smollm2", "hf_smollm2_intel_amx"))
    cpus = {n: json.loads((MAIN_JOB / n / "run.json").read_text())["cpu"] for n in ("hf_smollm2", "hf_smollm2_intel_amx")}
    assert cpus["hf_smollm2"]["model"].startswith("AMD") and not cpus["hf_smollm2"]["amx_bf16"]
    assert "Intel" in cpus["hf_smollm2_intel_amx"]["model"] and cpus["hf_smollm2_intel_amx"]["amx_bf16"]
    assert len(amd) == 20 and amd == intel  # every answer, and so every score


def _capability(env: dict[str, str]) -> str:
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.strip()


@pytest.mark.slow
def test_a_rollout_gives_the_same_answers_on_both_kernel_sets(tmp_path):
    if _capability({}) == "AVX2":
        pytest.skip("this CPU has no kernels above AVX2 to compare with")
    answers = {}
    for name, env in (("native", {}), ("avx2", AVX2)):
        out = tmp_path / name
        cmd = [sys.executable, "-m", "drgym", "rollout", "--n", "6", "--out", str(out), "--no-progress", "--no-plots"]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env={**os.environ, **env})
        assert res.returncode == 0, res.stderr[-2000:]
        policy = json.loads((out / "config.json").read_text())["policy"]
        assert policy["dtype"] == "float32"
        answers[name] = {t["task_id"]: t["final_answer"] for t in
                         map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}
    assert len(answers["native"]) == 6 and answers["native"] == answers["avx2"]
