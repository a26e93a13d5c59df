"""The shipped agent ``hf:smollm2-drgym``: SmolLM2-135M-Instruct + the LoRA adapter in the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_shipped_adapter_files_are_small_and_describe_themselves():
    from drgym.models import ADAPTER_CONFIG, SMOLLM2_HUB_NAME, TRAINING_RECORD, packaged_adapter, training_record

    folder = packaged_adapter("smollm2-drgym")
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert set(files) == {"adapter_model.safetensors", ADAPTER_CONFIG, TRAINING_RECORD, "README.md"}
    assert sum(files.values()) <= 10 * 2**20  # the budget: at most about 10 MB
    rec = training_record("smollm2-drgym")
    assert rec["adapter"] is True and rec["base_model"] == "smollm2" and rec["layout"] == "continuation"
    assert rec["stage"] == "grpo" and rec["protocol"] == "tags"
    assert json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == SMOLLM2_HUB_NAME
    card = (folder / "README.md").read_text()
    assert "hipporag-train" in card and "GRPO" in card and "Scores" in card


def test_drgym_rollout_runs_the_shipped_agent(default_engine, session_drgym_home, tmp_path):
    """``drgym rollout --policy hf:smollm2-drgym --n 3``, as a user runs it: the adapter loads onto
    the bundled base (layout from its drgym_training.json, no scaffold) and the agent acts with
    the tags it learned (the base model alone never writes them)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "drgym", "rollout", "--policy", "hf:smollm2-drgym", "--n", "3",
           "--max-new-tokens", "24", "--out", str(out), "--no-progress", "--no-plots"]
    env = {**os.environ, "DRGYM_HOME": str(session_drgym_home), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["policy"]["model"] == "smollm2-drgym"
    assert cfg["policy"]["layout"] == "continuation" and cfg["policy"]["scaffold"] == "none"
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 3
    first = [t["steps"][0]["action"].lstrip() for t in trajs]
    assert all(a.startswith(("<search>", "<answer>")) for a in first), first
    assert json.loads((out / "metrics.json").read_text())["searches"] > 0
