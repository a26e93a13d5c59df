"""Multi-GPU launch from a config's ``launch:`` section, and the DeepSpeed/accelerate consistency check.

A run config may carry::

    launch: {accelerate_config: accelerate_zero2.yaml, num_processes: 8}

``accelerate_config`` is an ``accelerate launch --config_file`` YAML (a path, or the name
of one in ``training/configs``); ``num_processes`` overrides its process count.
``drgym train grpo --config C --launch`` runs (``--dry-run``: prints)
:func:`launch_command`, i.e. ``accelerate launch --config_file ... --num_processes N -m
drgym train grpo --config C``.

:func:`check_launch` runs, without a GPU and without starting processes, the checks that
the launched processes would run before step 1, with the libraries' own code:

1. accelerate: the YAML through ``accelerate launch``'s argument parser and
   ``_validate_launch_command``, then ``prepare_deepspeed_cmd_env`` (the environment
   each process gets), then ``DeepSpeedPlugin`` built from that environment and
   ``set_mixed_precision``, as ``AcceleratorState`` does;
2. TRL: ``GRPOConfig`` / ``SFTConfig`` built with the launched world size (TRL's
   generation-batch divisibility checks use it), with the config's ``bf16``/``fp16``;
3. transformers: ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
   ``trainer_config_finalize`` (what ``Trainer`` runs through
   ``propagate_args_to_deepspeed`` and ``deepspeed_init``), which refuse a DeepSpeed
   value that differs from the training arguments (e.g. ``ds
   gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=8``);
4. accelerate again: ``DeepSpeedPlugin.deepspeed_config_process(must_match=True)``
   with the batch sizes ``Accelerator._prepare_deepspeed`` would derive.

transformers' ``HfTrainerDeepSpeedConfig.__init__`` only adds a deepspeed version check
and a process-global weak reference to accelerate's ``HfDeepSpeedConfig.__init__``;
without ``deepspeed`` installed, the object is built through accelerate's constructor and
transformers' two check methods run unchanged (``report["deepspeed"]`` says which).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from drgym.config import LaunchSection, parse_section
from drgym.errors import ConfigError
from drgym.training.config import CONFIG_DIR, build_grpo_args, build_sft_args


def accelerate_config_path(cfg) -> Path:
    """The ``launch.accelerate_config`` file of ``cfg`` (a path, or a name in ``training/configs``).

    Raises:
        ConfigError: no ``launch`` section, an unknown key in it, or no such file.
    """
    launch = dict(cfg.launch or {})
    if not launch:
        raise ConfigError(f"{cfg.source}: no launch: section (launch: {{accelerate_config: ..., num_processes: N}}).")
    name = parse_section(LaunchSection, launch, source=cfg.source).accelerate_config
    if not name:
        raise ConfigError(f"{cfg.source}: launch.accelerate_config is required (e.g. accelerate_zero2.yaml).")
    for p in (Path(str(name)), Path(cfg.source).parent / str(name), CONFIG_DIR / Path(str(name)).name):
        if p.is_file():
            return p.resolve()
    raise ConfigError(f"{cfg.source}: launch.accelerate_config {name!r} is neither a file nor a config in {CONFIG_DIR}.")


def is_accelerate_file(path: str | os.PathLike) -> bool:
    """True for an ``accelerate launch`` config file (a YAML with ``distributed_type`` and no run ``name``)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        p = CONFIG_DIR / (p.name if p.suffix else p.name + ".yaml")
        if not p.is_file():
            return False
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "distributed_type" in data and "name" not in data


def check_accelerate_file(path: str | os.PathLike) -> dict[str, Any]:
    """An ``accelerate launch`` config through accelerate's own loader and launch validation.

    Returns:
        ``{"num_processes", "distributed_type"}``.

    Raises:
        ConfigError: accelerate refuses the file.
    """
    p = Path(path)
    if not p.is_file():  # a bundled name, with or without .yaml (as is_accelerate_file takes it)
        p = CONFIG_DIR / (p.name if p.suffix else p.name + ".yaml")
    try:
        args, _ = _launch_env(p.resolve(), None)
    except (ValueError, TypeError, KeyError, FileNotFoundError) as e:
        raise ConfigError(f"{p}: accelerate launch refuses it: {e}") from e
    return {"num_processes": int(args.num_processes or 1), "distributed_type": _distributed_type(args)}


def _distributed_type(args) -> str:
    """What accelerate launches: ``DEEPSPEED``, ``MULTI_GPU`` (torchrun; on a machine without a
    GPU each process joins a gloo group when the trainer runs on CPU), or ``other``."""
    return "DEEPSPEED" if args.use_deepspeed else "MULTI_GPU" if getattr(args, "multi_gpu", False) else "other"


def launch_command(cfg, config_arg: str, command: str = "grpo", extra: list[str] | None = None) -> list[str]:
    """The ``accelerate launch`` command line of ``cfg``'s ``launch:`` section.

    Args:
        cfg: the run config (its ``launch`` section).
        config_arg: what the launched processes get as ``--config`` (a path or bundled name).
        command: ``"grpo"`` or ``"sft"``.
        extra: more arguments for ``drgym train <command>`` (``--resume``, ``--max-steps N``...).

    Returns:
        ``["accelerate", "launch", "--config_file", ..., "-m", "drgym", "train", command, ...]``.

    Raises:
        ConfigError: see :func:`accelerate_config_path`.
    """
    acc = accelerate_config_path(cfg)
    cmd = ["accelerate", "launch", "--config_file", str(acc)]
    n = cfg.launch.get("num_processes")
    if n is not None:
        cmd += ["--num_processes", str(int(n))]
    return cmd + ["-m", "drgym", "train", command, "--config", str(config_arg), *(extra or [])]


def format_command(cmd: list[str]) -> str:
    """A shell-quoted command line."""
    return " ".join(shlex.quote(c) for c in cmd)


def _launch_env(acc_path: Path, num_processes: int | None) -> tuple[Any, dict[str, str]]:
    """accelerate's parsed launch arguments and the environment each launched process gets."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    argv = ["--config_file", str(acc_path)]
    if num_processes is not None:
        argv += ["--num_processes", str(int(num_processes))]
    args = launch_command_parser().parse_args(argv + ["-m", "drgym", "train", "grpo"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if not args.use_deepspeed:
        return args, {}
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    # as accelerate.commands.launch.launch_command does before deepspeed_launcher
    fields = list(defaults.deepspeed_config.keys()) if defaults else []
    if mp_from_config:
        fields.append("mixed_precision")
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    return args, {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}


def _plugin(env: dict[str, str]):
    """``DeepSpeedPlugin()`` as a launched process builds it (from its environment)."""
    from accelerate.utils import DeepSpeedPlugin

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision(env.get("ACCELERATE_MIXED_PRECISION", "no"))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return plugin


def _hf_trainer_ds_config(config: dict):
    """transformers' ``HfTrainerDeepSpeedConfig`` (see the module docstring); ``(obj, with_deepspeed)``.

    Without ``deepspeed`` installed, transformers makes ``HfTrainerDeepSpeedConfig`` a
    subclass of ``object`` (its base, accelerate's ``HfDeepSpeedConfig``, is only used when
    deepspeed imports); the check then runs transformers' own methods on a class with
    that base, which is the class a deepspeed install gets.
    """
    import importlib.util

    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    if importlib.util.find_spec("deepspeed") is not None:
        return HfTrainerDeepSpeedConfig(config), True
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    methods = {k: v for k, v in vars(HfTrainerDeepSpeedConfig).items()
               if k in ("dtype", "is_auto", "fill_match", "fill_only", "trainer_config_process", "trainer_config_finalize")}
    cls = type("HfTrainerDeepSpeedConfig", (HfDeepSpeedConfig,), methods)
    obj = cls(config)
    obj._dtype = None
    obj.mismatches = []
    return obj, False


def _args_at_world_size(build, cfg, world_size: int):
    """TRL arguments built as a process of a ``world_size``-process launch sees them (no GPU needed)."""
    from unittest import mock

    from trl import GRPOConfig, SFTConfig

    with mock.patch.object(GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=world_size), \
            mock.patch.object(SFTConfig, "world_size", new_callable=mock.PropertyMock, return_value=world_size):
        args = build(cfg, validate_only=True)
        for k, v in getattr(args, "_drgym_adjusted", {}).items():
            if k in ("bf16", "fp16"):
                setattr(args, k, v)  # what the GPU run has (validate_only turned them off on CPU)
    return args


def check_launch(cfg) -> dict[str, Any]:
    """Run accelerate's, TRL's and transformers' launch-time checks on ``cfg`` and its accelerate config.

    See the module docstring for what runs. Configs without a ``launch:`` section are
    not checked (``{"launch": None}``).

    Returns:
        ``{"launch", "accelerate_config", "num_processes", "distributed_type", "deepspeed"
        (True: transformers' constructor with deepspeed installed; False: without), and per
        section ("grpo", "sft") the final DeepSpeed values: gradient_accumulation_steps,
        train_micro_batch_size_per_gpu, train_batch_size, gradient_clipping, bf16, and TRL's
        generation_batch_size}``.

    Raises:
        ConfigError: any check failed (the library's message is kept).
    """
    from unittest import mock

    if not cfg.launch:
        return {"launch": None}
    acc_path = accelerate_config_path(cfg)
    try:
        args, env = _launch_env(acc_path, cfg.launch.get("num_processes"))
    except (ValueError, TypeError, KeyError, FileNotFoundError) as e:
        raise ConfigError(f"{acc_path}: accelerate launch refuses it: {e}") from e
    world_size = int(args.num_processes or 1)
    report: dict[str, Any] = {"launch": format_command(launch_command(cfg, cfg.source)),
                              "accelerate_config": str(acc_path), "num_processes": world_size,
                              "distributed_type": _distributed_type(args)}
    if not args.use_deepspeed:
        return report
    sections = [("grpo", build_grpo_args)] + ([("sft", build_sft_args)] if cfg.sft else [])
    for section, build in sections:
        try:
            plugin = _plugin(env)
            targs = _args_at_world_size(build, cfg, world_size)
            hf, with_ds = _hf_trainer_ds_config(plugin.deepspeed_config)
            with mock.patch.object(type(targs), "world_size", new_callable=mock.PropertyMock, return_value=world_size):
                hf.trainer_config_process(targs)
                hf.trainer_config_finalize(targs, None, int(targs.max_steps) if targs.max_steps > 0 else 1000)
            plugin.hf_ds_config.config = hf.config
            plugin.deepspeed_config = hf.config
            gas = targs.gradient_accumulation_steps
            mb = targs.per_device_train_batch_size
            plugin.deepspeed_config_process(must_match=True, train_micro_batch_size_per_gpu=mb,
                                            gradient_accumulation_steps=gas, train_batch_size=mb * gas * world_size,
                                            gradient_clipping=targs.max_grad_norm)
        except ConfigError:
            raise
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"{cfg.source} with {acc_path.name} ({section}, {world_size} processes): {e}") from e
        c = hf.config
        report["deepspeed"] = with_ds
        report[section] = {"gradient_accumulation_steps": c.get("gradient_accumulation_steps"),
                           "train_micro_batch_size_per_gpu": c.get("train_micro_batch_size_per_gpu"),
                           "train_batch_size": c.get("train_batch_size"), "gradient_clipping": c.get("gradient_clipping"),
                           "bf16": (c.get("bf16") or {}).get("enabled"),
                           "generation_batch_size": getattr(targs, "generation_batch_size", None)}
    return report
