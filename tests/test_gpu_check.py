"""The prepared GPU check (``scripts/gpu_check.py``) runs to completion on its CPU fallback.

No GPU here: these runs use ``--device cpu --tiny`` (a 2-layer LM of SmolLM2's vocabulary
and small workloads). The default-suite test runs the cheap stages; the slow one runs
every stage, two GRPO steps through TRL included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def _run(tmp_path, *args):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), *args],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def test_gpu_check_cpu_fallback_env_and_index(tmp_path):
    rep = _run(tmp_path, "--stages", "env,index,sharded")
    st = rep["stages"]
    assert set(st) == {"env", "index", "sharded"} and st["env"]["ran"] and st["index"]["ran"]
    # drgym's sharded GPU path, here on the CPU: 2 Flat shards through DenseIndex, exact
    sh = st["sharded"]
    assert sh["ran"] and sh["shards"] == 2 and sh["on_gpu"] is False and sh["gpu_errors"] == []
    assert sh["top10_agreement_with_cpu_exact"] == 1.0
    assert st["env"]["cuda_available"] is False and st["env"]["imports"]["trl"] is True
    assert st["index"]["index"] == "torch topk (torch.float32) on cpu"
    assert st["index"]["top10_agreement_with_cpu_exact"] == 1.0 and st["index"]["passages"] > 20000


@pytest.mark.slow
def test_gpu_check_cpu_fallback_runs_every_stage(tmp_path):
    """About 2 minutes on a loaded 2-core machine."""
    rep = _run(tmp_path)
    st = rep["stages"]
    assert all(s["ran"] for s in st.values()), {k: s.get("error") or s.get("skipped") for k, s in st.items()}
    assert st["generation"]["kv_cache_reused"] and st["generation"]["generated_tokens"] > 0
    assert st["grpo"]["steps"] == 2 and st["grpo"]["tensors_changed"] > 0 and st["grpo"]["model_device"] == "cpu"
    assert st["encoder"]["passages_per_s"] > 0 and st["encoder"]["dim"] == 384


def test_an_unknown_stage_is_refused(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--stages", "env,warp"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "unknown stage 'warp'" in r.stderr
