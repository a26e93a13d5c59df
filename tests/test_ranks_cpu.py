"""Two GRPO processes on CPU (accelerate launch over gloo) against one process of the same global batch.

The two-process run is ``drgym train grpo`` under ``accelerate launch`` with
``training/configs/accelerate_cpu.yaml`` (the launcher the GPU configs use, on gloo), 6 rows
per rank in groups of 4, so one group is split between the ranks; it records each rank's
rollouts. The one-process run (12 rows) replays them (``tests/ranks_helpers.py``), after
checking its batch is the ranks' batches in rank order. Everything after generation must
then agree: rewards, the gathered ``env/*``, ``guard/*`` and ``zero_variance/*`` metrics,
loss, gradient norm and the updated adapter.

Tolerances: the gathered metrics are means of the same numbers, summed in another order
in float32 at most, so they are checked to 1e-6 relative; the loss and gradient norm are
sums split over two processes and combined by the all-reduce, checked to 1e-5 relative;
the adapter after one AdamW step to 1e-6 absolute, while the step moves it by about the
learning rate (5e-5), so a lost or doubled rank's gradient would show. The measured run
(training/results/ranks_cpu/ranks_cpu.json) agreed to the bit on every one of them: its
one informative group was on rank 1, so rank 0 contributed zero-weight rows only and
no sum changed order.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import torch
from accelerate import PartialState
s = PartialState(cpu=True)
t = torch.tensor([float(s.process_index)])
out = [torch.zeros(1) for _ in range(s.num_processes)]
torch.distributed.all_gather(out, t)
assert s.num_processes == 2 and s.backend == "gloo", (s.num_processes, s.backend)
print("gathered", [float(x) for x in out])
"""


@pytest.fixture(scope="module")
def two_cpu_processes(tmp_path_factory):
    """Skip unless ``accelerate launch`` starts 2 CPU processes that all-gather over gloo."""
    import torch.distributed

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch was built without torch.distributed / gloo")
    accelerate = Path(sys.executable).parent / "accelerate"
    if not accelerate.is_file() and shutil.which("accelerate") is None:
        pytest.skip("the accelerate command is not installed")
    probe = tmp_path_factory.mktemp("probe") / "probe.py"
    probe.write_text(PROBE)
    try:
        res = subprocess.run([str(accelerate), "launch", "--config_file",
                              str(ROOT / "training" / "configs" / "accelerate_cpu.yaml"), "--num_processes", "2",
                              str(probe)], capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("accelerate launch with 2 gloo processes did not finish a probe all_gather in 180 s")
    if res.returncode != 0 or res.stdout.count("gathered [0.0, 1.0]") != 2:
        pytest.skip(f"accelerate launch could not start 2 gloo processes here: {res.stderr[-600:]}")


@pytest.mark.slow
def test_two_ranks_first_step_equals_one_rank_of_the_same_global_batch(tmp_path, two_cpu_processes):
    from ranks_helpers import GATHERED, compare_first_step

    r = compare_first_step(tmp_path)
    # one writer: rank 0 logged the batch once, with both ranks' task ids in rank order (3 questions x 4)
    [batch] = r["batches_two_ranks"]
    assert batch["step"] == 1 and len(batch["task_ids"]) == 12 and len(set(batch["task_ids"])) == 3
    assert r["one_rank"]["replayed"] == ["rank0_call0.pkl", "rank1_call0.pkl"]
    for name in GATHERED:
        two, one, _ = r["metrics"][name]
        assert two is not None and one is not None, name
        tol = 1e-5 if name in ("loss", "grad_norm") else 1e-6
        assert two == pytest.approx(one, rel=tol, abs=1e-7), (name, two, one)
    assert r["same_keys"]
    assert r["weights_max_abs_diff"] <= 1e-6
    if r["metrics"]["zero_variance/filtered_frac"][0] < 1.0:
        # some group had a reward spread: the step moved the adapter (by about the learning
        # rate, AdamW's first step), so a lost or doubled rank's gradient would show above
        assert r["update_max_abs"] >= 1e-5
    else:  # every group zero-variance: both runs skip the update
        assert r["update_max_abs"] == 0.0


def test_select_rows_pads_a_rank_to_the_common_row_count_with_zero_weight_rows():
    """With several processes every rank passes as many rows as the busiest (TRL gathers
    per-row tensors in its loss); the added rows have their loss mask zeroed."""
    import torch

    from drgym.training.grpo import select_rows

    inputs = {"prompt_ids": torch.arange(12).reshape(4, 3),
              "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]]),
              "completion_ids": torch.arange(16).reshape(4, 4),
              "completion_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]),
              "tool_mask": torch.ones(4, 4, dtype=torch.long),
              "advantages": torch.tensor([0.5, 0.0, 0.0, -0.5]), "num_items_in_batch": torch.tensor(7.0)}
    keep = torch.tensor([True, False, False, True])
    out = select_rows(inputs, keep, pad_to=3)
    # rows 0 and 3 kept, row 1 (the first not kept) added with no loss weight
    assert out["prompt_ids"].tolist() == [[0, 1, 2], [3, 4, 5], [9, 10, 11]]
    assert out["advantages"].tolist() == [0.5, 0.0, -0.5]
    assert out["completion_mask"].tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1]]  # cut after the kept rows' end
    assert out["tool_mask"][1].sum() == 0 and out["num_items_in_batch"] == 7.0
    assert select_rows(inputs, keep)["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]  # one process: no filler
    # a rank with no informative row passes filler rows only, which carry no loss tokens
    none = select_rows(inputs, torch.zeros(4, dtype=torch.bool), pad_to=2)
    assert none["prompt_ids"].size(0) == 2 and int(none["completion_mask"].sum()) == 0
