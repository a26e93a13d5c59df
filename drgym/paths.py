"""Where drgym keeps its caches: ``$DRGYM_HOME`` or ``~/.cache/drgym``."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Data files shipped inside the package (corpora subsets, tasks, embeddings)."""


def drgym_home() -> Path:
    """Return the cache root, creating it if needed.

    Returns:
        ``Path(os.environ["DRGYM_HOME"])`` when set, else ``~/.cache/drgym``.
    """
    root = Path(os.environ.get("DRGYM_HOME") or Path.home() / ".cache" / "drgym").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def indexes_dir() -> Path:
    """Folder holding one sub-folder per built index."""
    p = drgym_home() / "indexes"
    p.mkdir(parents=True, exist_ok=True)
    return p


def models_dir() -> Path:
    """Folder holding converted model checkpoints (e.g. SmolLM2 GGUF -> HF)."""
    p = drgym_home() / "models"
    p.mkdir(parents=True, exist_ok=True)
    return p
