"""Run a long GRPO training run that survives stops: resume, snapshot, restore on a new machine.

The run folder lives outside the work tree (``$DRGYM_RUNS/<name>``, default
``~/.cache/drgym/runs/<name>``). Each start restores the repository's checkpoint when the run
folder has none, runs ``drgym train grpo`` in a child process, and snapshots the logs,
curves and last checkpoint into the repository every ``--snapshot-every`` seconds and when
the child ends: :mod:`drgym.training.long_run` says what is copied where, and what a
resume on a new machine keeps.

Usage::

    python scripts/long_run.py --config smollm2_answerable_cpu            # start or continue
    python scripts/long_run.py --config smollm2_answerable_cpu --snapshot # snapshot only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from drgym.training.config import load_config
from drgym.training.long_run import run_dir_of, snapshot, supervise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="bundled config name or YAML file")
    ap.add_argument("--run-dir", default=None, help="run folder (default $DRGYM_RUNS/<name>)")
    ap.add_argument("--snapshot-every", type=float, default=900.0, help="seconds between snapshots")
    ap.add_argument("--snapshot", action="store_true", help="snapshot the run folder and exit")
    ap.add_argument("--max-steps", type=int, default=None, help="override grpo.max_steps")
    ap.add_argument("--restarts", type=int, default=3,
                    help="times a run killed by SIGKILL (the out-of-memory killer) is resumed from its last checkpoint")
    a = ap.parse_args()
    if a.snapshot:
        cfg = load_config(a.config)
        print(json.dumps(snapshot(cfg.name, Path(a.run_dir) if a.run_dir else run_dir_of(cfg.name))))
        return 0
    return supervise(a.config, run_dir=Path(a.run_dir) if a.run_dir else None, snapshot_every=a.snapshot_every,
                     max_steps=a.max_steps, restarts=a.restarts)


if __name__ == "__main__":
    sys.exit(main())
