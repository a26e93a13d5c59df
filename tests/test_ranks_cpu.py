"""Two GRPO processes on CPU (accelerate launch over gloo) against one process of the same global batch.

The two-process run is ``drgym train grpo`` under ``accelerate launch`` with
``training/configs/accelerate_cpu.yaml`` (the launcher the GPU configs use, on gloo), 6 rows
per rank in groups of 4, so one group is split between the ranks; it records each rank's
rollouts. The one-process run (12 rows) replays them (``tests/ranks_helpers.py``), after
checking its batch is the ranks' batches in rank order. Everything after generation must
then agree: rewards, the gathered ``env/*``, ``guard/*`` and ``zero_variance/*`` metrics,
loss, gradient norm and the updated adapter.

Tolerances, from the measured runs (training/results/ranks_cpu/ranks_cpu.json): the
metrics are means or sums of the same numbers, at most summed in another order in float32
(the loss, the gradient norm and TRL's entropy are combined over the ranks by a reduce),
checked to 1e-5 relative. With the config's rewards the measured batch agreed to the bit
(its one informative group was on rank 1; rank 0 passed zero-weight rows only); with every
group spread (both ranks send gradients) the gradient norm and entropy differed by 3e-7
relative. The adapter after one AdamW step: equal to the bit, and at most 6.2e-6 apart
with every group spread, where the step itself is about the learning rate (5e-5) per
element; checked to 1e-6 and 2.5e-5.
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
@pytest.mark.parametrize("spread", [False, True], ids=["config_rewards", "every_group_spread"])
def test_two_ranks_first_step_equals_one_rank_of_the_same_global_batch(tmp_path, two_cpu_processes, spread):
    """``spread``: an extra reward (characters written) gives every group a reward spread,
    so the group split between the ranks has advantages and both ranks send gradients."""
    from ranks_helpers import GATHERED, compare_first_step

    r = compare_first_step(tmp_path, spread=spread)
    # one writer: rank 0 logged the batch once, with both ranks' task ids in rank order (3 questions x 4)
    [batch] = r["batches_two_ranks"]
    assert batch["step"] == 1 and len(batch["task_ids"]) == 12 and len(set(batch["task_ids"])) == 3
    assert r["one_rank"]["replayed"] == ["rank0_call0.pkl", "rank1_call0.pkl"]
    for name in r["metrics"]:
        two, one, _ = r["metrics"][name]
        assert two is not None and one is not None, name
        assert two == pytest.approx(one, rel=1e-5, abs=1e-7), (name, two, one)
    assert r["same_keys"]
    # AdamW's first step is lr * g / (|g| + eps) per element: where |g| is near eps (1e-8), the
    # float32 order of the all-reduce's sum moves the update by a share of lr (5e-5); a lost or
    # doubled rank flips the sign of many elements' steps (differences near 2 * lr)
    assert r["weights_max_abs_diff"] <= (2.5e-5 if spread else 1e-6)
    assert set(GATHERED) <= set(r["metrics"])
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
