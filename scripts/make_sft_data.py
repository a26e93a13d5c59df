"""Build the SFT warm-start set by rejection sampling from the model itself (train questions only).

The sampling runs and the filter are :mod:`drgym.training.sft_data` (its docstring says
which episodes are kept); this command runs them: step 1 (``sample``) writes one rollout
run per sampling seed under ``<out>/samples/``, step 2 (``build``) writes
``<out>/sft_trajectories.jsonl`` (the input of ``drgym train sft -t``) and
``<out>/sft_data_record.json``.

Usage::

    python scripts/make_sft_data.py --config smollm2_drgym_cpu --out runs/sft_data --k 4 --greedy --question-query
    python scripts/make_sft_data.py --config smollm2_two_hop_cpu --out runs/two_hop_data --k 0 --question-query --two-hop --two-hop-copies 3
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from drgym.errors import ConfigError
from drgym.training.config import load_config
from drgym.training.sft_data import build, sample, sample_dirs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="smollm2_drgym_cpu", help="training config (env, search, turns)")
    ap.add_argument("--out", default="runs/sft_data")
    ap.add_argument("--tasks", default="hipporag-train")
    ap.add_argument("--k", type=int, default=8, help="samples per question (one rollout run per seed)")
    ap.add_argument("--seed0", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--n", type=int, default=None, help="first N questions only (smoke runs)")
    ap.add_argument("--per-question", type=int, default=2)
    ap.add_argument("--greedy", action="store_true", help="add a greedy run of the scaffolded model")
    ap.add_argument("--question-query", action="store_true", help="add the scripted policy (search = the question)")
    ap.add_argument("--two-hop", action="store_true",
                    help="add the bridge run (search the question, then a supporting title named in the results)")
    ap.add_argument("--two-hop-copies", type=int, default=1,
                    help="write each kept two-hop episode this many times (oversampling)")
    ap.add_argument("--build-only", action="store_true", help="skip sampling (use the existing sample runs)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = load_config(a.config)
    cfg.apply_threads()
    out = Path(a.out)
    if a.build_only:
        dirs = sample_dirs(out, k=a.k, seed0=a.seed0, greedy=a.greedy, question_query=a.question_query,
                           two_hop=a.two_hop)
    else:
        dirs = sample(cfg, out, k=a.k, temperature=a.temperature, task_set=a.tasks, n=a.n, seed0=a.seed0,
                      greedy=a.greedy, question_query=a.question_query, two_hop=a.two_hop)
    try:
        rec = build(out, dirs, task_set=a.tasks, per_question=a.per_question, two_hop_copies=a.two_hop_copies,
                    command="python scripts/make_sft_data.py " + " ".join(sys.argv[1:]))
    except ConfigError as e:
        raise SystemExit(str(e)) from e
    print(json.dumps({k: rec[k] for k in ("kept", "kept_by_source", "questions_with_kept_episodes", "filter_counts")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
