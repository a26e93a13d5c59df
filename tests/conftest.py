"""Shared fixtures. Heavy objects (encoder, default index) load once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS_DIR = Path(__file__).resolve().parent
DATA = TESTS_DIR / "data"
SHARED = TESTS_DIR.parent.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` when present (a fresh clone has none: tests needing it skip)."""
    if not SHARED.exists():
        pytest.skip(f"{SHARED} is absent (a fresh clone has no ../shared); this test reads data that drgym may not ship.")
    return SHARED
