"""The wheel maps envs/, rewards/, training/ into drgym.* and ships the data files."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


IGNORE = shutil.ignore_patterns(".git", ".venv", ".ci-venv", ".ci-cache", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", "runs", "*.pyc")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    # Build from a copy of the source tree: setuptools reuses a build/ folder, which in
    # the repository could hold stale modules and would hide packaging mistakes.
    src = tmp_path_factory.mktemp("src") / "drgym-src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(out.glob("drgym-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as z:
        return z.namelist()


def test_wheel_has_namespaced_subpackages(wheel_names):
    names = set(wheel_names)
    for pkg in ("drgym/envs/__init__.py", "drgym/rewards/__init__.py", "drgym/training/__init__.py",
                "drgym/index/dense.py", "drgym/search/local.py", "drgym/docstore.py"):
        assert pkg in names, pkg
    tops = {n.split("/", 1)[0] for n in names}
    assert not tops & {"envs", "rewards", "training", "tests", "scripts"}, tops
    assert all(t == "drgym" or t.startswith("drgym-") for t in tops), tops


def test_wheel_ships_data_files(wheel_names):
    names = set(wheel_names)
    for f in ("hotpotqa_train_corpus.json", "musique_train_corpus.json", "2wikimultihopqa_corpus.json",
              "flashrag_wiki18_sample.jsonl"):
        assert f"drgym/data/corpora/{f}" in names, f
    emb = [n for n in names if n.startswith("drgym/data/embeddings/")]
    assert any(n.endswith("/keys.npy") for n in emb) and any(n.endswith("/vectors.npy") for n in emb), emb
    meta = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert meta
    licences = [n for n in names if "licenses/" in n.lower() or n.endswith(("LICENSE", "DATA_NOTICE.md"))]
    assert any(n.endswith("DATA_NOTICE.md") for n in licences), licences
