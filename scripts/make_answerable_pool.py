"""Build the answerable task pool of a training env, and freeze its train/dev/test split.

The filter, the split and the cap are :mod:`drgym.training.answerable_pool` (its docstring
says what is kept and how the split is drawn); this command runs them and writes the
shipped task files and their records:

- ``drgym/data/tasks/answerable_split.json``: the pool, the split (task sets
  ``answerable-train``, ``answerable-dev``, ``answerable-test``);
- ``drgym/data/tasks/search_skill_pool.json`` (``search-skill-train``, ``search-skill-test``);
- ``training/results/answerable_pool/pool_record.json``: counts per source and stage,
  the env settings, the command, the time taken.

Usage::

    python scripts/make_answerable_pool.py --config smollm2_answerable_cpu     # needs ../shared/data
    python scripts/make_answerable_pool.py --check-split    # the shipped split is what the shipped pool gives
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from drgym.atomic import atomic_write_json
from drgym.training.answerable_pool import (
    MAX_PER_ANSWER, SKILL_FILE, SPLIT_FILE, WIDE_CAPPED_FILE, WIDE_FILE, build_pools, build_wide, build_wide_capped,
    filter_pool, pool_settings, split_mismatches,
)
from drgym.training.config import load_config

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "training" / "results" / "answerable_pool"
RECORD = RECORDS / "pool_record.json"
WIDE_RECORD = RECORDS / "wide_record.json"
WIDE_CAPPED_RECORD = RECORDS / "wide_capped_record.json"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="smollm2_answerable_cpu", help="training config whose env is the filter")
    ap.add_argument("--limit", type=int, default=None, help="first N questions of each source (a quick look)")
    ap.add_argument("--check-split", action="store_true", help="only check the shipped split files")
    ap.add_argument("--wide", action="store_true",
                    help="write answerable-train-wide: answerable-train plus the answerable questions of R1-Searcher's "
                         "training sets "
                         "(the frozen split is read, never changed)")
    ap.add_argument("--wide-capped", action="store_true",
                    help=f"write answerable-train-wide-capped from answerable-train-wide: at most {MAX_PER_ANSWER} "
                         "questions per gold answer")
    a = ap.parse_args()
    if a.check_split:
        bad = split_mismatches()
        print("split files are what the script makes" if not bad else f"differ from what the script makes: {bad}")
        return 1 if bad else 0
    if a.wide or not a.wide_capped:
        cfg = load_config(a.config)
        cfg.apply_threads()
    if a.wide:
        doc, record = build_wide(cfg, a.config)
        atomic_write_json(WIDE_FILE, doc, indent=1)
        atomic_write_json(WIDE_RECORD, record, indent=1)
        print(json.dumps({k: record[k] for k in ("from_answerable_train", "added", "train", "seconds")}))
        return 0
    if a.wide_capped:
        doc, record = build_wide_capped(json.loads(WIDE_FILE.read_text()))
        atomic_write_json(WIDE_CAPPED_FILE, doc, indent=1)
        atomic_write_json(WIDE_CAPPED_RECORD, record, indent=1)
        print(json.dumps({k: record[k] for k in ("from_wide", "train", "dropped_by_answer")}))
        return 0
    t0 = time.perf_counter()
    res = filter_pool(cfg, limit=a.limit, progress=_stderr)
    seconds = round(time.perf_counter() - t0, 1)
    if a.limit is not None:  # a quick look: counts only, nothing written
        print(json.dumps({"seconds": seconds, "answerable": len(res["answerable"]),
                          "search_skill": len(res["search_skill"]), "stages": res["stages"]}, indent=1))
        return 0
    doc, sk_doc, record = build_pools(res, settings=pool_settings(a.config, cfg), seconds=seconds,
                                      command=f"python scripts/make_answerable_pool.py --config {a.config}")
    atomic_write_json(SPLIT_FILE, doc, indent=1)
    atomic_write_json(SKILL_FILE, sk_doc, indent=1)
    atomic_write_json(RECORD, record, indent=1)
    print(json.dumps({k: record[k] for k in ("answerable", "search_skill", "split", "seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
