"""Where drgym keeps its caches: ``$DRGYM_HOME`` or ``~/.cache/drgym``."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Data files shipped inside the package (corpora subsets, tasks, embeddings)."""


def home_path() -> Path:
    """The cache root without creating it: ``$DRGYM_HOME`` when set, else ``~/.cache/drgym``."""
    return Path(os.environ.get("DRGYM_HOME") or Path.home() / ".cache" / "drgym").expanduser()


def drgym_home() -> Path:
    """Return the cache root, creating it if needed.

    Returns:
        ``Path(os.environ["DRGYM_HOME"])`` when set, else ``~/.cache/drgym``.

    Raises:
        OSError: the folder does not exist and cannot be created (read-only or full
            disk, no permission); the ``drgym`` command turns it into one line.
    """
    root = home_path()
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
    return root


def indexes_dir() -> Path:
    """Folder holding one sub-folder per built index (created when missing)."""
    p = drgym_home() / "indexes"
    if not p.is_dir():
        p.mkdir(parents=True, exist_ok=True)
    return p


def models_dir() -> Path:
    """Folder holding converted model checkpoints (e.g. SmolLM2 GGUF -> HF) (created when missing)."""
    p = drgym_home() / "models"
    if not p.is_dir():
        p.mkdir(parents=True, exist_ok=True)
    return p


def hub_offline() -> bool:
    """True when no model hub may be reached (``HF_HUB_OFFLINE`` set to 1/true/yes; the
    ``drgym`` command sets it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def in_hub_cache(*repo_ids: str) -> bool:
    """True when one of ``repo_ids`` has a ``config.json`` in the local Hugging Face cache
    (so it loads offline). Looks only at the cache on disk; never contacts a hub."""
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415  0.1 s (httpx); every layer imports drgym.paths
    except ImportError:  # pragma: no cover - a dependency of transformers
        return False
    for repo in repo_ids:
        try:
            if isinstance(try_to_load_from_cache(repo, "config.json"), str):
                return True
        except ValueError:  # huggingface_hub's HFValidationError: not a valid repo id, so not cached
            continue
    return False
