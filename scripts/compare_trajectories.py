"""Are two rollout runs the same episodes? Compare ``trajectories.jsonl`` apart from timings.

A refactor of the rollout path must not change what ``drgym rollout`` writes. This
script reads two run directories (or two JSONL files) and compares them record by
record, after removing the timing fields, which differ from run to run:

- a key named ``timings`` (per-phase seconds of an episode),
- a key ending in ``_s`` (``latency_s``, ``wall_share_s``, ``setup_s``...),
- a key starting with ``latency`` (``latency``, ``latency_ms``...).

Everything else (episode ids, messages, actions, tool calls, observations, retrieved
passages, answers, rewards, token usage, metadata) must be equal, and the episodes
must come in the same order::

    python scripts/compare_trajectories.py .baseline/scripted runs/after-scripted

Exit status 0 when they match; 1 with the first differences printed otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def is_timing_key(key: str) -> bool:
    """True for the keys the comparison ignores (see the module docstring)."""
    return key == "timings" or key.endswith("_s") or key.startswith("latency")


def strip_timings(value: Any) -> Any:
    """``value`` with every timing key removed, recursively (dicts and lists)."""
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items() if not is_timing_key(str(k))}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def _records(path: Path) -> list[dict[str, Any]]:
    f = path / "trajectories.jsonl" if path.is_dir() else path
    return [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def diff(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths where ``a`` and ``b`` differ (at most a few per record)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'second' if k not in a else 'first'}")
            else:
                out += diff(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"]


def compare(first: Path, second: Path) -> list[str]:
    """All differences between two runs' trajectories, timing fields removed."""
    a = [strip_timings(r) for r in _records(first)]
    b = [strip_timings(r) for r in _records(second)]
    if len(a) != len(b):
        return [f"{len(a)} vs {len(b)} episodes"]
    return [f"episode {i} ({x.get('task_id')}){d}" for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    args = ap.parse_args(argv)
    problems = compare(args.first, args.second)
    n = len(_records(args.first))
    if problems:
        print(f"DIFFERENT: {len(problems)} differences", *problems[:20], sep="\n")
        return 1
    print(f"SAME: {n} episodes, identical apart from timing fields (timings, *_s, latency*)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
