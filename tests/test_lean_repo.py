"""A lean repository: committed checkpoints hold adapters and trainer state only, logs are
stored once, and a resume from such a checkpoint keeps the learning-rate schedule and says
that the optimizer moments restart."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CKPTS = REPO / "training" / "checkpoints"
FORBIDDEN = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "rng_state_0.pth", "tokenizer.json",
             "tokenizer_config.json", "chat_template.jinja", "training_args.bin", "README.md", "metrics.jsonl",
             "batches.jsonl")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def tracked() -> list[str]:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    return _git("ls-files", "training/checkpoints").split()


def test_committed_checkpoints_hold_adapters_and_trainer_state_only(tracked):
    assert tracked, "no committed checkpoint"
    names = {Path(p).name for p in tracked}
    assert names <= {"adapter_model.safetensors", "adapter_config.json", "drgym_training.json", "trainer_state.json"}
    folders = {Path(p).parent for p in tracked}
    for f in folders:
        assert (REPO / f / "adapter_model.safetensors").is_file() and (REPO / f / "adapter_config.json").is_file(), f
        if f.name.startswith("checkpoint-"):  # a resumable state: its step is the data position
            state = json.loads((REPO / f / "trainer_state.json").read_text(encoding="utf-8"))
            assert state["global_step"] == int(f.name.split("-")[1]), f


def test_git_refuses_optimizer_rng_scheduler_and_tokenizer_files():
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    paths = [f"training/checkpoints/some_run/checkpoint-5/{n}" for n in FORBIDDEN] + ["runs/x/checkpoint-5/optimizer.pt"]
    out = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert sorted(out.stdout.split()) == sorted(paths)
    kept = ["training/checkpoints/some_run/checkpoint-5/adapter_model.safetensors",
            "training/checkpoints/some_run/checkpoint-5/trainer_state.json", "training/results/some_run/metrics.jsonl"]
    out = subprocess.run(["git", "check-ignore", *kept], cwd=REPO, capture_output=True, text=True)
    assert out.stdout == "" and out.returncode == 1


def test_logs_are_stored_once_under_results():
    for ck in sorted(CKPTS.glob("*/checkpoint-*")):
        name, step = ck.parent.name, int(ck.name.split("-")[1])
        assert not (ck.parent / "metrics.jsonl").exists() and not (ck.parent / "batches.jsonl").exists()
        for log in ("metrics.jsonl", "batches.jsonl"):
            rows = [json.loads(x) for x in (REPO / "training" / "results" / name / log).read_text().splitlines() if x]
            assert max(r["step"] for r in rows) >= step, (name, log)


def test_an_adapter_without_tokenizer_files_loads_its_base_tokenizer():
    from drgym.models import load_tokenizer, resolve_lm

    base = load_tokenizer(resolve_lm("smollm2"))
    tok = load_tokenizer(str(CKPTS / "smollm2_two_hop_cpu" / "final"))
    assert not (CKPTS / "smollm2_two_hop_cpu" / "final" / "tokenizer.json").exists()
    assert tok.chat_template == base.chat_template and tok.eos_token == base.eos_token == "<|im_end|>"
    assert tok("<search> Lilu </search>")["input_ids"] == base("<search> Lilu </search>")["input_ids"]


# -- resuming without optimizer state --------------------------------------------------------------
def _scheduler(lr=1e-3, warmup=4):
    import torch
    from transformers import get_scheduler

    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=lr)
    return get_scheduler("constant_with_warmup", opt, num_warmup_steps=warmup)


def test_the_schedule_is_set_to_the_checkpoint_step_and_brake_scale(caplog):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from drgym.training.resume import ResumeWithoutOptimizerState

    state = TrainerState(global_step=3, log_history=[{"step": 1, "entropy_brake/lr_scale": 1.0},
                                                     {"step": 2, "entropy_brake/lr_scale": 0.25}, {"step": 3}])
    sched = _scheduler()
    cb = ResumeWithoutOptimizerState("ck/checkpoint-3", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
    with caplog.at_level(logging.WARNING, logger="drgym.training.resume"):
        cb.on_train_begin(TrainingArguments(output_dir="unused", report_to=[]), state, TrainerControl(),
                          lr_scheduler=sched)
    # the uninterrupted run's rate for step 4: warm-up 3/4 done, times the brake's quarter
    assert sched.get_last_lr() == pytest.approx([1e-3 * 3 / 4 * 0.25] * 2)
    assert [g["lr"] for g in sched.optimizer.param_groups] == pytest.approx([1e-3 * 3 / 4 * 0.25] * 2)
    assert cb.restored == {"step": 3, "lr_scale": 0.25, "lr": pytest.approx(1.875e-4)}
    msg = caplog.records[-1].getMessage()
    assert "AdamW moments restart from zero" in msg and "no RNG state" in msg and "step 3" in msg


def test_missing_optimizer_state_and_brake_scale_checks(tmp_path):
    from drgym.training.resume import brake_scale, missing_optimizer_state

    ck = tmp_path / "checkpoint-2"
    ck.mkdir()
    assert missing_optimizer_state(ck) == ["optimizer.pt", "scheduler.pt", "rng_state.pth"]
    for f in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (ck / f).write_bytes(b"x")
    assert missing_optimizer_state(ck) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        missing_optimizer_state(tmp_path / "nope")
    assert brake_scale([]) == 1.0
    with pytest.raises(ValueError, match="entropy_brake/lr_scale 2"):
        brake_scale([{"step": 4, "entropy_brake/lr_scale": 2}])


# -- drgym.training.long_run (scripts/long_run.py) ------------------------------------------------
def _long_run(monkeypatch, root: Path):
    from drgym.training import long_run

    monkeypatch.setattr(long_run, "ROOT", root)
    return long_run


def _jsonl(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_snapshot_commits_the_lean_files_and_logs_once(tmp_path, monkeypatch, capsys):
    lr = _long_run(monkeypatch, tmp_path / "repo")
    run = tmp_path / "run"
    ck = run / "checkpoint-4"
    ck.mkdir(parents=True)
    for f in ("adapter_config.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
              "tokenizer.json", "chat_template.jinja", "training_args.bin", "README.md"):
        (ck / f).write_bytes(f.encode())
    import torch
    from safetensors.torch import load_file, save_file

    weights = {"a.lora_A.weight": torch.randn(8, 64) / 7, "a.lora_B.weight": torch.randn(64, 8) / 3}
    save_file(weights, str(ck / "adapter_model.safetensors"), metadata={"format": "pt"})
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    (run / "metrics.jsonl").write_text(_jsonl({"step": s, "loss": s / 10} for s in range(1, 7)))
    (run / "batches.jsonl").write_text(_jsonl({"step": s, "task_ids": [f"t{s}"]} for s in range(1, 7)))
    monkeypatch.setattr(lr.subprocess, "run", lambda *a, **k: None)  # the summary and table scripts
    lr.snapshot("arm", run)
    saved = tmp_path / "repo" / "training" / "checkpoints" / "arm"
    assert sorted(p.name for p in (saved / "checkpoint-4").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "trainer_state.json"]
    assert sorted(p.name for p in saved.iterdir()) == ["checkpoint-4"]  # no second copy of the logs
    half = load_file(str(saved / "checkpoint-4" / "adapter_model.safetensors"))  # the adapter in float16
    assert {k: v.dtype for k, v in half.items()} == {k: torch.float16 for k in weights}
    assert all(torch.equal(half[k], weights[k].half()) for k in weights)
    assert (saved / "checkpoint-4" / "adapter_model.safetensors").stat().st_size < \
        0.6 * (ck / "adapter_model.safetensors").stat().st_size
    res = tmp_path / "repo" / "training" / "results" / "arm"
    assert (res / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()

    # a new machine: the run folder is gone; the restore takes the logs up to the checkpoint's step
    fresh = tmp_path / "fresh"
    assert lr.restore("arm", fresh) == "checkpoint-4"
    assert [json.loads(x)["step"] for x in (fresh / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert [json.loads(x)["step"] for x in (fresh / "batches.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert sorted(p.name for p in (fresh / "checkpoint-4").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "trainer_state.json"]
    err = capsys.readouterr().err
    assert "no optimizer.pt, scheduler.pt, rng_state.pth" in err and "restarts the optimizer moments" in err

    (res / "batches.jsonl").write_text('{"step": 1}\n{"task_ids": []}\n')
    with pytest.raises(ValueError, match=r"batches.jsonl:2: expected a JSON object with an integer 'step'"):
        lr.restore("arm", tmp_path / "fresh2")


# -- a real resume ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_resume_without_optimizer_state_keeps_the_schedule_and_data_order(tmp_path, bm25_backend, caplog):
    """GRPO killed after step 3 (checkpoint 2), its optimizer, scheduler and RNG files deleted,
    resumed with ``run_grpo(resume=True)``: steps 3 and 4 run at the uninterrupted run's learning
    rates (mid-warm-up) on its batches; the warning names the lost moments."""
    from transformers import TrainerCallback

    from drgym.training.grpo import run_grpo

    sys.path.insert(0, str(REPO / "tests"))
    from test_training_grpo import action_chars, tiny_config

    g = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "save_total_limit": None, "seed": 3,
         "learning_rate": 1e-3, "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 4}

    def lrs(folder):
        rows = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines() if x]
        return {r["step"]: r["learning_rate"] for r in rows if "learning_rate" in r}

    def batches(folder):
        return [json.loads(x) for x in (folder / "run" / "batches.jsonl").read_text().splitlines() if x]

    run_grpo(tiny_config(tmp_path / "full", **g), backend=bm25_backend, extra_reward_funcs=[action_chars])
    full = lrs(tmp_path / "full")
    assert len(set(full.values())) == 4  # warm-up: every step's rate differs

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                raise KeyboardInterrupt

    cfg = tiny_config(tmp_path / "cut", **g)
    with pytest.raises(KeyboardInterrupt):
        run_grpo(cfg, backend=bm25_backend, extra_reward_funcs=[action_chars], extra_callbacks=[Kill()])
    ck = tmp_path / "cut" / "run" / "checkpoint-2"
    for f in ck.iterdir():
        if f.name in ("optimizer.pt", "scheduler.pt") or f.name.startswith("rng_state"):
            f.unlink()

    with caplog.at_level(logging.WARNING, logger="drgym.training.resume"):
        run_grpo(tiny_config(tmp_path / "cut", **g), resume=True, backend=bm25_backend,
                 extra_reward_funcs=[action_chars])
    cut = lrs(tmp_path / "cut")
    assert cut[3] == pytest.approx(full[3]) and cut[4] == pytest.approx(full[4])
    assert [b["task_ids"] for b in batches(tmp_path / "cut") if b["step"] >= 3] == \
        [b["task_ids"] for b in batches(tmp_path / "full") if b["step"] >= 3]
    assert any("AdamW moments restart from zero" in r.getMessage() for r in caplog.records)


def test_a_half_precision_adapter_loads_into_a_float32_lora_model(tmp_path):
    """What a snapshot commits (the adapter in float16) loads as a resume loads it (PEFT's
    ``load_adapter``): the trainable weights stay float32 and hold the rounded values."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file

    from drgym.training.long_run import half_precision_adapter

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.lin(x)

    torch.manual_seed(0)
    model = get_peft_model(Net(), LoraConfig(r=4, target_modules=["lin"], init_lora_weights=False))
    model.save_pretrained(tmp_path / "full")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_bytes((tmp_path / "full" / "adapter_config.json").read_bytes())
    half_precision_adapter(tmp_path / "full" / "adapter_model.safetensors", tmp_path / "half" / "adapter_model.safetensors")
    assert {v.dtype for v in load_file(str(tmp_path / "half" / "adapter_model.safetensors")).values()} == {torch.float16}
    torch.manual_seed(1)
    loaded = PeftModel.from_pretrained(Net(), tmp_path / "half", is_trainable=True)
    want = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    got = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert got.keys() == want.keys() and len(got) == 2
    assert all(got[k].dtype == torch.float32 and torch.equal(got[k], want[k].half().float()) for k in want)
