"""Every shipped training config passes the checks a GPU run would hit before step 1.

- DeepSpeed / accelerate consistency: accelerate's launch validation and
  ``DeepSpeedPlugin``, TRL's arguments at the launched world size, and transformers'
  ``HfTrainerDeepSpeedConfig.trainer_config_process``/``trainer_config_finalize`` on each
  config with a ``launch:`` section (``drgym.training.launch.check_launch``).
- Held-out evaluation: a config's ``tasks.train`` and ``tasks.eval`` share no task id and
  no question (``drgym.training.data.check_split``).
- ``drgym train check training/configs/*.yaml`` runs both and passes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "training" / "configs"

# accelerate_zero2.yaml as shipped before: gradient_accumulation_steps fixed at 4 while both
# GPU configs use 8 ("ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=8")
OLD_ZERO2 = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_multinode_launcher: standard
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def _bundled():
    from drgym.training.config import bundled_configs

    return bundled_configs()


@pytest.mark.parametrize("name", _bundled())
def test_every_shipped_config_trains_and_evaluates_on_disjoint_tasks(name):
    from drgym.training.config import load_config
    from drgym.training.data import check_split

    counts = check_split(load_config(name))
    assert counts["train"] > 0 and counts["eval"] > 0


def test_the_paper_case_study_trains_on_a_training_split():
    """Item 5: the Qwen3 configs train on R1-Searcher's stage-2 training questions, not an eval set."""
    from drgym.training.config import load_config
    from drgym.training.data import load_task_slice

    for name in ("searchqa_qwen3_1p7b_gpu", "searchqa_qwen3_1p7b_vllm_server"):
        cfg = load_config(name)
        assert cfg.tasks["train"].set == "r1-stage2" and cfg.tasks["eval"].set == "r1-hotpotqa"
        train = load_task_slice(cfg.tasks["train"])
        assert len(train) == 6478 and all(t.task_id.startswith("r1-stage2-") for t in train)


@pytest.mark.parametrize("name", [n for n in _bundled() if n.startswith("searchqa_qwen3")])
def test_every_shipped_launch_pair_passes_accelerate_and_transformers_checks(name):
    """Item 2: each GPU config with its accelerate file, at its launched world size."""
    from drgym.training.config import load_config
    from drgym.training.launch import check_launch

    cfg = load_config(name)
    assert cfg.launch, f"{name} has no launch: section"
    r = check_launch(cfg)
    assert r["distributed_type"] == "DEEPSPEED" and r["num_processes"] == cfg.launch["num_processes"]
    g = r["grpo"]
    assert g["gradient_accumulation_steps"] == cfg.grpo["gradient_accumulation_steps"] == 8
    assert g["train_micro_batch_size_per_gpu"] == 5
    assert g["train_batch_size"] == 5 * 8 * r["num_processes"]
    assert g["bf16"] is True and g["gradient_clipping"] == 1.0
    assert r["launch"].startswith("accelerate launch --config_file ") and "-m drgym train grpo --config" in r["launch"]


def test_the_old_zero2_file_is_refused_as_transformers_refuses_it(tmp_path):
    """The check catches the mismatch the audit found (it failed on the old shipped pair)."""
    from drgym.errors import ConfigError
    from drgym.training.config import load_config
    from drgym.training.launch import check_launch

    old = tmp_path / "accelerate_old.yaml"
    old.write_text(OLD_ZERO2)
    cfg = load_config("searchqa_qwen3_1p7b_gpu", {"launch": {"accelerate_config": str(old), "num_processes": 8}})
    with pytest.raises(ConfigError, match="ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=8"):
        check_launch(cfg)


def test_a_precision_mismatch_between_the_pair_is_refused():
    """accelerate's mixed_precision bf16 with a run config that trains in fp32."""
    from drgym.errors import ConfigError
    from drgym.training.config import load_config
    from drgym.training.launch import check_launch

    cfg = load_config("searchqa_qwen3_1p7b_gpu", {"grpo": {"bf16": False}})
    with pytest.raises(ConfigError, match="bf16.enabled=True vs hf bf16"):
        check_launch(cfg)


def test_overlapping_train_and_eval_tasks_are_refused():
    from drgym.errors import ConfigError
    from drgym.training.config import load_config
    from drgym.training.data import check_split

    same_ids = load_config("searchqa_smollm2_cpu", {"tasks": {"train": {"set": "hotpotqa-dev", "limit": 40},
                                                              "eval": {"set": "hotpotqa-dev", "start": 30, "limit": 20}}})
    with pytest.raises(ConfigError, match="share 10 task ids"):
        check_split(same_ids)
    # the same question under another id: r1-stage2 carries 4 of HippoRAG's HotpotQA questions
    # (a set's name replaces the file's whole slice; a mapping would merge with its start/limit)
    same_questions = load_config("searchqa_smollm2_cpu", {"tasks": {"train": "r1-stage2", "eval": "hotpotqa-dev"}})
    with pytest.raises(ConfigError, match="share 4 questions under different ids"):
        check_split(same_questions)


def test_drgym_train_check_runs_every_check_on_every_shipped_config():
    from typer.testing import CliRunner

    from drgym.cli import app

    files = sorted(str(p) for p in CONFIG_DIR.glob("*.yaml"))
    res = CliRunner().invoke(app, ["train", "check", *files])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.count("\nok  ") + out.startswith("ok  ") == len(files)
    assert "accelerate_zero2.yaml: accelerate launch config (DEEPSPEED, 8 processes)" in out
    assert "(disjoint)" in out and "launch: 7 processes, DEEPSPEED gradient_accumulation_steps=8" in out


def test_drgym_train_check_fails_on_an_overlapping_config(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from drgym.cli import app

    data = yaml.safe_load((CONFIG_DIR / "searchqa_smollm2_cpu.yaml").read_text())
    data["tasks"]["eval"] = {"set": "hotpotqa-dev", "start": 0, "limit": 5}
    p = tmp_path / "overlap.yaml"
    p.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["train", "check", str(p)])
    assert res.exit_code == 2 and "share 5 task ids" in res.output


def test_launch_section_gives_the_accelerate_command():
    """Item 10: ``launch:`` is read: ``drgym train grpo --launch --dry-run`` prints the command."""
    from typer.testing import CliRunner

    from drgym.cli import app

    res = CliRunner().invoke(app, ["train", "grpo", "--config", "searchqa_qwen3_1p7b_vllm_server", "--launch",
                                   "--dry-run", "--max-steps", "3"])
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("accelerate launch --config_file ")
    assert "accelerate_zero2.yaml --num_processes 7 -m drgym train grpo --config searchqa_qwen3_1p7b_vllm_server" in line
    assert line.endswith("--max-steps 3")


def test_a_bad_launch_section_is_a_config_error():
    from drgym.errors import ConfigError
    from drgym.training.config import load_config

    with pytest.raises(ConfigError, match="launch key"):
        load_config("searchqa_qwen3_1p7b_gpu", {"launch": {"accelerate_cfg": "x.yaml"}})


def test_the_server_config_has_the_gpu_config_schedule():
    """Item 10: the vLLM-server config trains with the same scheduler and loss as the colocate one."""
    from drgym.training.config import load_config

    gpu, srv = load_config("searchqa_qwen3_1p7b_gpu"), load_config("searchqa_qwen3_1p7b_vllm_server")
    for k in ("lr_scheduler_type", "warmup_steps", "learning_rate", "loss_type", "mask_truncated_completions",
              "beta", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps"):
        assert srv.grpo.get(k) == gpu.grpo.get(k), k
    for attr in ("tasks", "rollout", "rewards", "env", "enable_thinking"):
        assert getattr(srv, attr) == getattr(gpu, attr), attr
