"""What each built-in short-answer reward pays to each reward-hacking strategy (issue 2.3, item 4).

    python scripts/bench_rewards.py --out scripts/results/bench_rewards.json \
        [--sets nq-open,r1-2wiki] [--limit 200] [--judge openai:MODEL@URL] [--no-search]

For every question of the chosen dev slices, each strategy writes an answer from the
question and its golds (and, for the passage strategies, from BM25 over ``wiki-default``):

============== ============================================================================
gold           the first gold alias (the ceiling)
sentence       ``"The answer is <gold>."``: an honest but wordy answer
wrong          another question's gold (the floor)
candidates_2   ``"<gold> or <other>"``
candidates_4   the gold and three other questions' golds, comma-separated, gold at a random place
yes_or_no      ``"yes or no"`` (yes/no questions only)
passage_top1   the top BM25 passage for the question, pasted whole
passage_gold   of the top-10 passages, the first that contains a gold, pasted whole (top-1 if none)
question       the question repeated back
long           ``"The answer is <gold>. "`` followed by about 200 words of retrieved text
empty          ``""``
punct          ``"..."``
============== ============================================================================

Each reward's mean over the questions a strategy applies to is recorded. The rewards are
``em``, ``cover_em``, ``f1``, ``format`` and their guarded forms
(``max_answer_tokens=10, candidates="divide"``; cover-EM also with ``candidates="zero"``),
and the weighted sums of the shipped GRPO configs. ``llm_match`` needs a judge that is
one: pass ``--judge`` (a served model) to include it; the local SmolLM2 is not a judge.

Dev slices only, nothing tuned: ``nq-open`` is the first 200 questions of NQ-open dev
(shipped), ``r1-2wiki`` R1-Searcher's 500-question 2WikiMultihopQA dev sample (shipped;
the first ``--limit``). The answer guard's settings come from the golds' lengths, not from
this benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]

STRATEGIES = ["gold", "sentence", "wrong", "candidates_2", "candidates_4", "yes_or_no", "passage_top1",
              "passage_gold", "question", "long", "empty", "punct"]
GUARD = {"max_answer_tokens": 10, "candidates": "divide"}


def reward_specs(judge: str | None) -> dict[str, object]:
    """Label -> reward spec (for :func:`drgym.rewards.build_reward`)."""
    specs: dict[str, object] = {
        "em": "em",
        "cover_em": "cover_em",
        "f1": "f1",
        "format": "format",
        "em guarded": {"name": "em", "kwargs": GUARD},
        "cover_em guarded": {"name": "cover_em", "kwargs": GUARD},
        "cover_em zero": {"name": "cover_em", "kwargs": {"max_answer_tokens": 10, "candidates": "zero"}},
        "f1 guarded": {"name": "f1", "kwargs": GUARD},
        # the shipped GRPO configs
        "em + 0.1 format (qwen3 configs)": {"weighted": {"em": 1.0, "format": 0.1}},
        "f1 guarded + 0.2 format (smollm2 config)": {"weighted": [{"name": "f1", "weight": 1.0, "kwargs": GUARD},
                                                                  {"name": "format", "weight": 0.2}]},
        "f1 + 0.2 format (unguarded)": {"weighted": {"f1": 1.0, "format": 0.2}},
    }
    if judge:
        specs["llm_match"] = {"name": "llm_match", "kwargs": {"judge": judge}}
        specs["llm_match guarded"] = {"name": "llm_match", "kwargs": {"judge": judge, **GUARD}}
    return specs


def build_answers(tasks, passages_top10, rng: random.Random) -> dict[str, list[tuple[int, str]]]:
    """Strategy -> [(task index, answer)]; yes_or_no only on yes/no questions."""
    from drgym.rewards.qa import normalize_answer

    all_golds = [t.answers[0] for t in tasks]
    out: dict[str, list[tuple[int, str]]] = {s: [] for s in STRATEGIES}
    for i, t in enumerate(tasks):
        g = t.answers[0]
        gnorm = {normalize_answer(a) for a in t.answers}
        others = [a for a in all_golds if normalize_answer(a) not in gnorm]
        picks = rng.sample(others, 3)
        out["gold"].append((i, g))
        out["sentence"].append((i, f"The answer is {g}."))
        out["wrong"].append((i, picks[0]))
        out["candidates_2"].append((i, f"{g} or {picks[0]}"))
        four = [g] + picks
        rng.shuffle(four)
        out["candidates_4"].append((i, ", ".join(four)))
        if gnorm & {"yes", "no"}:
            out["yes_or_no"].append((i, "yes or no"))
        out["question"].append((i, t.question))
        out["empty"].append((i, ""))
        out["punct"].append((i, "..."))
        if passages_top10 is not None:
            hits = passages_top10[i]
            top1 = hits[0].text if hits else ""
            with_gold = next((h.text for h in hits if any(f" {a} " in f" {normalize_answer(h.text)} " for a in gnorm if a)), top1)
            out["passage_top1"].append((i, top1))
            out["passage_gold"].append((i, with_gold))
            filler = " ".join(" ".join(h.text for h in hits).split()[:200])
            out["long"].append((i, f"The answer is {g}. {filler}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "scripts" / "results" / "bench_rewards.json"))
    ap.add_argument("--sets", default="nq-open,r1-2wiki", help="comma-separated shipped dev task sets")
    ap.add_argument("--limit", type=int, default=200, help="first N questions of each set")
    ap.add_argument("--judge", default=None, help="a judge spec for llm_match (a served model); omitted: no llm_match")
    ap.add_argument("--no-search", action="store_true", help="skip the passage and long strategies (no index)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards import Episode, build_reward

    t0 = time.perf_counter()
    tasks = []
    per_set = {}
    for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        ts = [t for t in load_tasks(name) if t.answers][: args.limit]
        per_set[name] = len(ts)
        tasks += ts
    passages = None
    if not args.no_search:
        from drgym.search.local import LocalSearchEngine

        engine = LocalSearchEngine.from_corpus("wiki-default", method="bm25", device="cpu")
        passages = engine.search_batch([t.question for t in tasks], k=10, method="bm25")
        engine.close()
    answers = build_answers(tasks, passages, random.Random(args.seed))

    results: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for label, spec in reward_specs(args.judge).items():
        reward = build_reward(spec)
        results[label] = {}
        for strat, rows in answers.items():
            if not rows:
                continue
            eps = [Episode(task=tasks[i], answer=a) for i, a in rows]
            out = reward.score(eps)
            vals = [s for s in out.scores if s is not None]
            results[label][strat] = {"mean": round(sum(vals) / len(vals), 4) if vals else None, "n": len(vals),
                                     "failures": out.failures}
    from drgym.rewards.qa import normalize_answer

    extra = {}
    if passages is not None:
        gold_in = sum(any(f" {a} " in f" {normalize_answer(h.text)} " for h in hits for a in {normalize_answer(x) for x in t.answers} if a)
                      for t, hits in zip(tasks, passages))
        extra["passage_gold_has_gold_share"] = round(gold_in / len(tasks), 4)
        lens = sorted(len(normalize_answer(a).split()) for _, a in answers["passage_top1"])
        extra["passage_top1_median_words"] = lens[len(lens) // 2]
    record = {
        "command": "python scripts/bench_rewards.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "sets": per_set,
        "n_questions": len(tasks),
        "n_yes_no": len(answers["yes_or_no"]),
        "guard": GUARD,
        "judge": args.judge,
        "strategies": STRATEGIES,
        "results": results,
        **extra,
        "wall_s": round(time.perf_counter() - t0, 2),
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
    }
    from drgym.atomic import atomic_write_json

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    show = [s for s in STRATEGIES if answers[s]]
    print("| reward | " + " | ".join(show) + " |")
    print("|---|" + "---|" * len(show))
    for label, row in results.items():
        print(f"| {label} | " + " | ".join(f"{row[s]['mean']:.3f}" if row.get(s) and row[s]["mean"] is not None else "–" for s in show) + " |")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
