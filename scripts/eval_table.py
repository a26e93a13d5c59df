"""The test-slice table of the bundled agent: five policies, bootstrap CIs, paired differences.

Every policy runs through ``drgym rollout``'s runner (:func:`drgym.evaluation.runner.run_rollout`)
on the same questions in the same env: the main job's (``drgym/SearchQA-v0`` over
``wiki-default`` with hybrid search, top-3, 4 turns, 3 searches, 2 fetches, observations of
500 drgym tokens; the hf policies' defaults, greedy). The default task set is
``hipporag-test`` (60 questions; its first 20 are the main job's), touched only for final
figures; ``--tasks hipporag-dev`` gives the same table on the dev slice.

For each policy: EM, F1 (HotpotQA's official F1, the env's ``f1`` reward), answer rate and
searches per episode, each a mean over questions with a 95% bootstrap confidence interval
over questions (``scipy.stats.bootstrap``, percentile method, 10,000 resamples, seeded).
Paired differences (per-question difference, then the same bootstrap) are given for
SFT + GRPO minus SFT (the RL lift: it counts only when its interval excludes 0) and for
SFT + GRPO minus ``rag:smollm2`` (the main job's default rule, README).

Run directories go to ``<runs>/<label>/`` and are resumed on a rerun; the table goes to
``--out`` (JSON) and ``<out>.md``.

Usage::

    python scripts/eval_table.py --sft runs/smollm2_drgym_cpu/sft/final --grpo hf:smollm2-drgym \\
        --tasks hipporag-test --runs runs/test_eval --out training/results/test_table.json
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from drgym.errors import ConfigError
from drgym.evaluation.policy_table import (
    markdown, other_row, reusable_rows, run_rows, score_table, shown_args, table_env, table_policies, write_table,
)
from drgym.training.config import load_config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", default=None, help="SFT model or adapter folder (hf:PATH or PATH)")
    ap.add_argument("--grpo", default=None, help="SFT + GRPO model (hf:smollm2-drgym or a folder)")
    ap.add_argument("--start", default=None,
                    help="start policy of an RL run (instead of --sft): rows start, start + GRPO (--trained) and the "
                         "retrieve-then-read baselines read by each (rtr:)")
    ap.add_argument("--trained", default=None, help="with --start: the policy after GRPO")
    ap.add_argument("--trained-label", default="start + GRPO",
                    help="with --trained: the label of its row (e.g. 'start + two-hop SFT')")
    ap.add_argument("--dtype", default=None,
                    help="dtype of every hf policy and reader (float32: scores that do not depend on the CPU's bf16 "
                         "kernels; default the policies' auto)")
    ap.add_argument("--tasks", default="hipporag-test")
    ap.add_argument("--runs", default="runs/test_eval")
    ap.add_argument("--out", default="training/results/test_table.json")
    ap.add_argument("--config", default=None,
                    help="evaluate every policy in this training config's env (its env kwargs, eval.max_turns and "
                         "rollout.max_new_tokens for hf policies) instead of the main job's")
    ap.add_argument("--only", default=None,
                    help="semicolon-separated labels to run now (the others are not run; no table is written "
                         "unless --partial)")
    ap.add_argument("--partial", action="store_true",
                    help="with --only: write the table of the rows run (their paired differences only)")
    ap.add_argument("--reuse", default=None,
                    help="a table JSON this script wrote for the same --tasks and env: its rows whose policy is the "
                         "same are taken from its per-question scores instead of being run again (greedy rows are "
                         "deterministic on a CPU in float32)")
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=TABLE",
                    help="with --start: the row LABEL of another table JSON this script wrote on the same --tasks and "
                         "env (e.g. another arm's 'start + GRPO'), shown under that label and paired with the trained "
                         "row question by question; repeatable")
    a = ap.parse_args()
    if a.also and not a.start:
        ap.error("--also pairs a row with an RL run's trained row: give it with --start")
    try:
        return _run(a, ap)
    except ConfigError as e:
        ap.error(str(e))


def _run(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    # the rows once without the config's generation options: bad arguments fail before a config loads
    table_policies(sft=a.sft, grpo=a.grpo, start=a.start, trained=a.trained, trained_label=a.trained_label)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    env, gen, env_name, env_desc = table_env(load_config(a.config) if a.config else None, a.dtype)
    policies = table_policies(sft=a.sft, grpo=a.grpo, start=a.start, trained=a.trained, trained_label=a.trained_label,
                              gen=gen, dtype=a.dtype)
    only = [x.strip() for x in a.only.split(";")] if a.only else None
    if only:
        bad = sorted(set(only) - set(policies))
        if bad:
            ap.error(f"--only: unknown labels {bad}; labels: {sorted(policies)}")
        policies = {k: v for k, v in policies.items() if k in only}
    also = {}  # read before any rollout runs, so that a bad --also costs nothing
    for item in a.also:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            ap.error(f"--also {item!r}: give LABEL=TABLE, e.g. 'start + GRPO=training/results/answerable_test_table.json'")
        if label in policies:
            ap.error(f"--also {label!r} is the label of a row of this table; rows must have different labels")
        also[label] = other_row(Path(path), label, a.tasks, env_desc)
    reused = reusable_rows(Path(a.reuse), policies, a.tasks, env_desc) if a.reuse else {}
    results = run_rows(policies, tasks=a.tasks, runs=Path(a.runs), env=env, reused=reused)
    results.update(also)
    if only and not a.partial:
        for label, r in results.items():
            print(label, {k: r["metrics"].get(k) for k in ("em", "f1", "answer_rate", "searches")})
        return 0
    table = score_table(results, tasks=a.tasks, env_desc=env_desc, env_name=env_name,
                        command="python scripts/eval_table.py " + shlex.join(shown_args(sys.argv[1:])),
                        start=bool(a.start), trained_label=a.trained_label, has_trained=bool(a.trained),
                        also=list(also))
    write_table(table, Path(a.out))
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
