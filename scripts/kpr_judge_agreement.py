"""Agreement of a drgym KPR judge with DeepResearchGym's official gpt-4.1-mini labels.

Reads the official per-key-point labels (``results/mini``), the matching key points
(``key_points_deduplicated_at_3322d305.jsonl``) and the reports
(``reports/reports_sample.jsonl``) from ``shared/data/deepresearchgym`` (not shipped
with drgym: no licence), re-judges every key point with the given judge through
:class:`drgym.rewards.keypoints.KeyPointRecall`, and writes JSON with label agreement,
per-system KPR/KPC (ours vs official), failures and timing.

Usage:
    python scripts/kpr_judge_agreement.py --judge hf:smollm2 --queries 31522,879779 --out kpr_agreement.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from drgym.rewards.keypoints import KeyPointRecall, aggregate_kpr, label_rates

from drgym.atomic import atomic_write_json
from drgym.judges.factory import make_judge
from drgym.records import Episode, Task

SYSTEMS = ["GPTResearcher", "GPTResearcher_custom", "hf_deepresearch_gpt-4o-mini", "open_deep_search"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "deepresearchgym"))
    ap.add_argument("--judge", required=True, help="judge spec to measure, e.g. hf:smollm2 or openai:MODEL@URL")
    ap.add_argument("--queries", default="31522,879779", help="comma list of mini query ids, or 'all'")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--max-report-chars", type=int, default=6000)
    ap.add_argument("--cache", default=None, help="verdict cache (default $DRGYM_HOME/judge_cache.sqlite)")
    ap.add_argument("--out", default="kpr_agreement.json")
    a = ap.parse_args()
    root = Path(a.shared)
    kps = {r["id"]: r["key_points"] for r in map(json.loads, open(root / "results/mini/key_points_deduplicated_at_3322d305.jsonl"))}
    reports = {(r["system"], r["id"]): r for r in map(json.loads, open(root / "reports/reports_sample.jsonl"))}
    qids = list(kps) if a.queries == "all" else a.queries.split(",")
    systems = a.systems.split(",")
    judge = make_judge(a.judge, **({"cache": a.cache} if a.cache else {}))
    reward = KeyPointRecall(judge, max_report_chars=a.max_report_chars)
    pairs, per_sys = [], {}
    t0 = time.perf_counter()
    for s in systems:
        official = json.load(open(root / "results/mini" / s / "evaluation_results_kpr_gpt-4.1-mini.json"))
        eps, gold = [], []
        for q in qids:
            if (s, q) not in reports:
                continue
            eps.append(Episode(Task(task_id=q, question=reports[(s, q)]["query"], kind="research", key_points=kps[q]), reports[(s, q)]["report"]))
            gold.append([official[q]["labels"][str(p["point_number"])][0] for p in kps[q]])
        labels = reward.judge_labels(eps)
        ours_rates, off_rates = {}, {}
        for e, ours, g in zip(eps, labels, gold):
            pairs += list(zip(g, ours))
            if all(x is not None for x in ours):
                ours_rates[e.task.task_id] = label_rates(ours)
            off_rates[e.task.task_id] = label_rates(g)
        per_sys[s] = {
            "queries": [e.task.task_id for e in eps],
            "official": aggregate_kpr(off_rates) if off_rates else None,
            "ours": aggregate_kpr(ours_rates) if ours_rates else None,
            "queries_with_failures": len(eps) - len(ours_rates),
        }
    judged = [(g, o) for g, o in pairs if o is not None]
    agree = sum(g == o for g, o in judged)
    # Cohen's kappa over the judged pairs
    n = len(judged)
    pg, po = Counter(g for g, _ in judged), Counter(o for _, o in judged)
    pe = sum(pg[k] * po[k] for k in pg) / (n * n) if n else 0.0
    kappa = ((agree / n) - pe) / (1 - pe) if n and pe < 1 else None
    out = {
        "judge": judge.describe(),
        "template": "kpr@1",
        "max_report_chars": a.max_report_chars,
        "key_points": len(pairs),
        "judged": n,
        "failures": len(pairs) - n,
        "agreement": agree / n if n else None,
        "cohen_kappa": kappa,
        "official_label_counts": dict(Counter(g for g, _ in pairs)),
        "our_label_counts": dict(Counter(o for _, o in judged)),
        "per_system": per_sys,
        "judge_stats": dict(judge.stats),
        "wall_s": time.perf_counter() - t0,
    }
    atomic_write_json(a.out, out)
    print(json.dumps({k: v for k, v in out.items() if k != "per_system"}, indent=1))


if __name__ == "__main__":
    main()
