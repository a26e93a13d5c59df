"""The docs' example scripts run (docs/examples/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_own_grpo_trainer_script_trains_one_step(tmp_path):
    """docs/own-trainer.md's script: a user's own TRL GRPOTrainer with drgym's env factory,
    dataset, rollout_func and TRLReward finishes a GRPO step and logs a reward."""
    out = subprocess.run([sys.executable, str(REPO / "docs" / "examples" / "own_grpo_trainer.py"), "--max-steps", "1",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=1500,
                         env={**__import__("os").environ, "DRGYM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    rec = json.loads(last)
    assert rec["step"] == 1 and rec["reward"] is not None and rec["train_loss"] is not None
