"""ruff over the repository: imports sit at the top of each module.

The rules and their exceptions are in ``pyproject.toml`` (``[tool.ruff.lint]``): PLC0415
(an import inside a function or class) and TID253 (a heavy or optional library imported at
module level), with the command line and the not-yet-moved directories excepted by path.
ruff comes with the ``test`` extra, so the test runs wherever the suite's tools are
installed, and skips with the reason when ruff is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed: pip install -e '.[test]'")
    return [exe]


def test_ruff_check_passes_on_the_repository():
    r = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, f"ruff check found imports out of place:\n{r.stdout}{r.stderr}"


def test_ruff_flags_an_import_inside_a_function_and_a_heavy_one_at_the_top(tmp_path):
    """The configuration is live: the same rules catch both kinds of misplaced import in a
    module placed where the package's rules apply."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    pkg = tmp_path / "drgym" / "search"
    pkg.mkdir(parents=True)
    (pkg / "example.py").write_text(
        "import torch\n\n\ndef f():\n    import json\n\n    return json, torch\n\n\n"
        "def g():\n    import faiss\n\n    return faiss\n", encoding="utf-8")
    r = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    found = sorted(line.split(": ", 1)[1].split(" ", 1)[0] for line in r.stdout.splitlines() if "example.py:" in line)
    # `import json` in f (PLC0415), `import torch` at the top (TID253); `import faiss` in g is allowed
    assert found == ["PLC0415", "TID253"], r.stdout
