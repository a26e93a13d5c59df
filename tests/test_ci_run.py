"""``.ci/run`` runs the README's test command and prints the 25 slowest tests."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ci_pytest_line() -> list[str]:
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
             if ln.strip().startswith("python -m pytest")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_ci_runs_the_readme_command_with_the_slowest_tests_listed():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "&& python -m pytest -q\n" in readme  # the README's test command
    assert _ci_pytest_line() == ["python", "-m", "pytest", "-q", "--durations=25"]


def test_the_ci_command_prints_a_durations_table():
    args = _ci_pytest_line()[1:]  # "-m pytest -q --durations=25" under this interpreter
    one = "tests/test_retry.py::test_without_jitter_the_waits_are_the_backoff"
    out = subprocess.run([sys.executable, *args, "-p", "no:cacheprovider", one], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"=+ slowest 25 durations =+", out.stdout), out.stdout[-2000:]
