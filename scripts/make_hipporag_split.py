"""Write the fixed train/dev/test split of HippoRAG's 159 short-answer questions.

The questions are HippoRAG's 79 HotpotQA (``hotpotqa-dev``) and 80 MuSiQue
(``musique-dev``) questions, whose evidence is in ``wiki-default``. The split is
stratified by source and seeded:

- ``test`` (60): the first 20 ``hotpotqa-dev`` questions (the main job's questions, so the
  README's main-job table can show a trained agent on questions it never trained on),
  10 more HotpotQA and 30 MuSiQue questions, drawn at random;
- ``dev`` (20): 10 HotpotQA and 10 MuSiQue, for choosing settings;
- ``train`` (79): the other 39 HotpotQA and 40 MuSiQue.

Within each slice the questions keep their order in ``hotpotqa-dev`` then
``musique-dev``, so ``hipporag-test[:20]`` are the main job's 20 questions. The test slice
is for final figures only.

Usage::

    python scripts/make_hipporag_split.py            # rewrites drgym/data/tasks/hipporag_split.json
    python scripts/make_hipporag_split.py --check    # exit 1 if the file differs from what the script makes
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SEED = 20261130
OUT = Path(__file__).resolve().parents[1] / "drgym" / "data" / "tasks" / "hipporag_split.json"
MAIN_JOB_N = 20  # drgym rollout's default: the first 20 hotpotqa-dev questions
SIZES = {"hotpotqa": {"test_extra": 10, "dev": 10}, "musique": {"test_extra": 30, "dev": 10}}


def make_split() -> dict:
    """The split as a JSON-able dict: ``{"train": [ids], "dev": [ids], "test": [ids], ...}``."""
    from drgym.envs.task_loaders import load_tasks

    rng = random.Random(SEED)
    hot = [t.task_id for t in load_tasks("hotpotqa-dev")]
    mus = [t.task_id for t in load_tasks("musique-dev")]
    slices: dict[str, set[str]] = {"train": set(), "dev": set(), "test": set(hot[:MAIN_JOB_N])}
    for ids, rest in ((hot, hot[MAIN_JOB_N:]), (mus, mus)):
        src = "hotpotqa" if ids is hot else "musique"
        pool = list(rest)
        rng.shuffle(pool)
        n_test, n_dev = SIZES[src]["test_extra"], SIZES[src]["dev"]
        slices["test"] |= set(pool[:n_test])
        slices["dev"] |= set(pool[n_test:n_test + n_dev])
        slices["train"] |= set(pool[n_test + n_dev:])
    order = hot + mus
    out = {name: [i for i in order if i in slices[name]] for name in ("train", "dev", "test")}
    return {
        "description": ("Fixed split of HippoRAG's 79 HotpotQA + 80 MuSiQue questions (task sets hipporag-train, "
                        "hipporag-dev, hipporag-test). test[:20] are the main job's questions (hotpotqa-dev[:20]). "
                        "Made by scripts/make_hipporag_split.py; the test slice is for final figures only."),
        "seed": SEED,
        "counts": {k: {"total": len(v), "hotpotqa": sum(i.startswith("hotpotqa-") for i in v),
                       "musique": sum(i.startswith("musique-") for i in v)} for k, v in out.items()},
        **out,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped file instead of writing it")
    a = ap.parse_args()
    text = json.dumps(make_split(), indent=1) + "\n"
    if a.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        print("split file is up to date" if same else f"{OUT} differs from what the script makes")
        return 0 if same else 1
    from drgym.atomic import atomic_write_text

    atomic_write_text(OUT, text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
