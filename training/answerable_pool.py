"""The answerable task pool of a training env, and its frozen train/dev/test split.

A question is **answerable** in an env when a gold alias is in view
(:func:`drgym.rewards.evidence.gold_in_view` of :func:`drgym.envs.prompts.shown_text`) in the
env's own observation after the action ``<search>QUESTION</search>``, run through the env
built from the training config (same corpus, method, ``top_k`` and ``max_obs_tokens``, so
the same ``format_docs`` cut). Dropped first, in this order, with counts in the record:

- questions whose every gold alias is yes / no / noanswer (never in a passage as such);
- questions with a gold alias inside the question itself (``"...army won the army navy
  game"`` -> ``Army``: the observation echoes the query);
- questions equal, after normalisation, to an earlier question (sources in the order of
  :data:`SOURCES`) or to a ``hipporag-dev`` / ``hipporag-test`` question (those two stay
  their own slices, never trained on).

A second pool, **search skill**, holds the questions (same filters) whose gold is in one
of the top-10 passages for the question as query but not in the top-3 observation: there
a better-worded query is what pays.

The split is seeded and made before any training (:func:`make_split`): ``hipporag-train``
questions go to train; the rest are shuffled, the first ``TRAIN_SIDE - n_hipporag`` join the
train side and the others are test (at least :data:`MIN_TEST`); :data:`DEV` questions of the
train side (not hipporag ones, so dev is drawn like test) become dev. The search-skill pool
is split the same way into :data:`SKILL_TEST` test questions and the rest for training
(:func:`make_skill_split`). Neither pool shares a normalised question with the other's test
slice.

The shipped files (task records, so a clone without ``shared/data`` loads them) are
:data:`SPLIT_FILE` (task sets ``answerable-train``, ``-dev``, ``-test``), :data:`SKILL_FILE`
(``search-skill-train``, ``-test``), :data:`WIDE_FILE` (``answerable-train-wide``) and
:data:`WIDE_CAPPED_FILE` (``answerable-train-wide-capped``). ``scripts/make_answerable_pool.py``
is their command line.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from drgym.envs.prompts import shown_text
from drgym.envs.task_loaders import load_tasks
from drgym.paths import DATA_DIR
from drgym.records import Task
from drgym.rewards.evidence import gold_aliases as _aliases
from drgym.rewards.evidence import gold_in_view
from drgym.rewards.qa import cover_exact_match, normalize_answer
from drgym.training.data import make_env_factory

TASKS_DIR = DATA_DIR / "tasks"
SPLIT_FILE = TASKS_DIR / "answerable_split.json"
SKILL_FILE = TASKS_DIR / "search_skill_pool.json"
WIDE_FILE = TASKS_DIR / "answerable_train_wide.json"
WIDE_CAPPED_FILE = TASKS_DIR / "answerable_train_wide_capped.json"
SEED = 20261201
SOURCES = ["hipporag-train", "nq-open-full", "efficientqa-dev", "efficientqa-test", "deepresearcher-dev",
           "deepresearcher-test"]
"""Task sets read, in priority order for de-duplication (the first copy of a question is kept)."""
HELD_OUT = ["hipporag-dev", "hipporag-test"]
WIDE_SOURCES = ["r1-stage1", "r1-stage2"]
"""Training question sets (R1-Searcher's RL stages: HotpotQA and 2WikiMultihopQA train) filtered
the same way for ``answerable-train-wide``, after the split is frozen."""
MAX_PER_ANSWER = 3
"""``answerable-train-wide-capped`` keeps at most this many questions per gold answer (its
first alias, SQuAD-normalised), the first ones in pool order. In ``answerable-train-wide``,
136 of 461 questions (128 of R1-Searcher's stage 2) have the gold "American": a frequent word
is in nearly every observation, so the answerable filter keeps such questions, and a policy
that answers "American" whatever the question earns F1 on 30 % of them."""
TRAIN_SIDE = 230  # train + dev
DEV = 30
MIN_TEST = 400
SKILL_TEST = 200
FULL_K = 10


def gold_aliases(task: Task) -> list[str]:
    """The task's aliases that can appear in a passage (:func:`drgym.rewards.evidence.gold_aliases`)."""
    return _aliases(task.answers)


def filter_pool(cfg: Any, *, limit: int | None = None, progress: Callable[[str], None] | None = None,
                sources: list[str] | None = None, held_out: list[str] | None = None) -> dict:
    """Run the filter over ``sources`` (default :data:`SOURCES`) in ``cfg``'s env, leaving out
    the questions of the task sets ``held_out`` (default :data:`HELD_OUT`).

    Args:
        cfg: the training config (:class:`drgym.training.config.TrainingConfig`) whose env filters.
        limit: only the first ``limit`` questions of each source (a quick look).
        progress: called with a line every 250 questions checked.
        sources, held_out: task-set names.

    Returns:
        ``{"answerable": [Task], "search_skill": [Task], "stages": {source: {stage: n}}}``;
        each kept task's ``metadata`` gets ``pool_source`` (the task set it came from).

    Raises:
        RuntimeError: the env's observation of a search shows no tool result.
    """
    held = {normalize_answer(t.question) for name in (held_out or HELD_OUT) for t in load_tasks(name)}
    seen: set[str] = set()
    candidates = []  # (source, task)
    stages: dict[str, dict[str, int]] = {}
    for name in sources or SOURCES:
        st = stages.setdefault(name, {"n": 0, "yes_no_only": 0, "gold_in_question": 0, "duplicate_or_held_out": 0,
                                      "checked": 0, "obs_hit": 0, "full10_not_obs": 0})
        for t in load_tasks(name)[:limit]:
            st["n"] += 1
            golds = gold_aliases(t)
            q = normalize_answer(t.question)
            if not golds:
                st["yes_no_only"] += 1
            elif cover_exact_match(t.question, golds):
                st["gold_in_question"] += 1
            elif q in seen or q in held or not q:
                st["duplicate_or_held_out"] += 1
            else:
                seen.add(q)
                candidates.append((name, t))
    all_tasks = [t for _, t in candidates]
    env = make_env_factory(cfg, all_tasks)()
    answerable, skill = [], []
    t0 = time.perf_counter()
    for i, (name, t) in enumerate(candidates):
        env.reset(options={"task": t})
        obs, *_ = env.step(f"<search>{t.question}</search>")
        shown = shown_text(obs)
        if not shown:
            raise RuntimeError(f"no tool result in the env's observation for {t.task_id}: {obs[:300]!r}")
        st = stages[name]
        st["checked"] += 1
        meta = dict(t.metadata, pool_source=name)
        if gold_in_view(shown, t.answers):
            st["obs_hit"] += 1
            answerable.append(type(t)(**{**t.to_dict(), "metadata": meta}))
        else:
            hits = env.backend.search(t.question, k=FULL_K)
            if any(gold_in_view(f"{h.title} {h.text}", t.answers) for h in hits):
                st["full10_not_obs"] += 1
                skill.append(type(t)(**{**t.to_dict(), "metadata": meta}))
        if progress is not None and (i + 1) % 250 == 0:
            progress(f"  {i + 1}/{len(candidates)} questions, {len(answerable)} answerable, {len(skill)} "
                     f"search-skill, {time.perf_counter() - t0:.0f} s")
    return {"answerable": answerable, "search_skill": skill, "stages": stages}


def make_split(pool: list[dict], *, seed: int = SEED) -> dict[str, list[str]]:
    """The frozen split of the answerable pool (task dicts in pool order) as task ids per slice.

    Raises:
        ValueError: the pool is too small for :data:`MIN_TEST` test questions and a train side.
    """
    rng = random.Random(seed)
    hip = [r["task_id"] for r in pool if r["metadata"].get("pool_source") == "hipporag-train"]
    rest = [r["task_id"] for r in pool if r["metadata"].get("pool_source") != "hipporag-train"]
    rng.shuffle(rest)
    n_side = max(DEV + 1, TRAIN_SIDE - len(hip))
    if len(rest) - n_side < MIN_TEST:
        n_side = len(rest) - MIN_TEST
    if n_side <= DEV:
        raise ValueError(f"the answerable pool has {len(pool)} questions: too few for {MIN_TEST} test questions, "
                         f"{DEV} dev questions and a train slice.")
    side, test = rest[:n_side], rest[n_side:]
    dev = side[:DEV]
    train = hip + side[DEV:]
    order = {r["task_id"]: i for i, r in enumerate(pool)}
    return {k: sorted(v, key=order.__getitem__) for k, v in (("train", train), ("dev", dev), ("test", test))}


def make_skill_split(pool: list[dict], *, seed: int = SEED) -> dict[str, list[str]]:
    """The split of the search-skill pool: :data:`SKILL_TEST` test ids, the rest train."""
    rng = random.Random(seed + 1)
    ids = [r["task_id"] for r in pool]
    rng.shuffle(ids)
    order = {r["task_id"]: i for i, r in enumerate(pool)}
    test, train = ids[:SKILL_TEST], ids[SKILL_TEST:]
    return {"train": sorted(train, key=order.__getitem__), "test": sorted(test, key=order.__getitem__)}


def split_document(pool: list[dict], split: dict[str, list[str]], *, description: str, settings: dict) -> dict:
    """The JSON document of a split file: pool ids, and each slice's task records."""
    by_id = {r["task_id"]: r for r in pool}
    return {
        "description": description,
        "seed": SEED,
        "settings": settings,
        "counts": {k: len(v) for k, v in split.items()},
        "pool": [r["task_id"] for r in pool],
        "slices": {k: [by_id[i] for i in v] for k, v in split.items()},
    }


def pool_of(doc: dict) -> list[dict]:
    """The pool's task dicts, in pool order, from a split document."""
    by_id = {r["task_id"]: r for rows in doc["slices"].values() for r in rows}
    return [by_id[i] for i in doc["pool"]]


def split_mismatches() -> list[str]:
    """Names of the shipped split files (:data:`SPLIT_FILE`, :data:`SKILL_FILE`) that are not
    what :func:`make_split` / :func:`make_skill_split` give for their pools (empty: both are)."""
    bad = []
    for path, fn in ((SPLIT_FILE, make_split), (SKILL_FILE, make_skill_split)):
        doc = json.loads(path.read_text(encoding="utf-8"))
        got = fn(pool_of(doc))
        want = {k: [r["task_id"] for r in v] for k, v in doc["slices"].items()}
        if got != want:
            bad.append(path.name)
    return bad


def pool_settings(config: str, cfg: Any) -> dict:
    """The filter's settings as recorded in the split files and the record."""
    return {"config": config, "search": cfg.search, "env": cfg.env, "query": "the question itself",
            "match": "a gold alias, SQuAD-normalised, on word boundaries (cover_exact_match)", "full_k": FULL_K}


def build_pools(res: dict, *, settings: dict, command: str, seconds: float) -> tuple[dict, dict, dict]:
    """The two split documents and the record from :func:`filter_pool`'s result ``res``.

    The answerable pool is split by :func:`make_split`; the search-skill pool loses the
    questions of the answerable test slice, then is split by :func:`make_skill_split`.

    Returns:
        ``(answerable split document, search-skill split document, record)``: the documents
        for :data:`SPLIT_FILE` and :data:`SKILL_FILE`, the record of counts per source and stage.
    """
    ans = [t.to_dict() for t in res["answerable"]]
    skill = [t.to_dict() for t in res["search_skill"]]
    split = make_split(ans)
    test_ids = set(split["test"])
    test_q = {normalize_answer(t["question"]) for t in ans if t["task_id"] in test_ids}
    skill = [t for t in skill if normalize_answer(t["question"]) not in test_q]
    sk_split = make_skill_split(skill)
    doc = split_document(ans, split, settings=settings, description=(
        "Answerable pool: questions whose gold alias is in the training env's observation with the question as "
        "query, and its frozen split. Made by scripts/make_answerable_pool.py; test is for final figures only."))
    sk_doc = split_document(skill, sk_split, settings=settings, description=(
        "Search-skill pool: gold in the top-10 passages for the question as query, not in the top-3 observation. "
        "Made by scripts/make_answerable_pool.py."))
    by_source: dict[str, dict[str, int]] = {}
    for rows, key in ((ans, "answerable"), (skill, "search_skill")):
        for r in rows:
            by_source.setdefault(r["metadata"]["pool_source"], {"answerable": 0, "search_skill": 0})[key] += 1
    record = {
        "command": command,
        "seconds": seconds, "seed": SEED, "settings": settings, "stages": res["stages"], "kept_by_source": by_source,
        "answerable": len(ans), "search_skill": len(skill),
        "split": {k: len(v) for k, v in split.items()}, "search_skill_split": {k: len(v) for k, v in sk_split.items()},
        "split_by_source": {k: count_sources(ans, v) for k, v in split.items()},
    }
    return doc, sk_doc, record


def build_wide(cfg: Any, config: str) -> tuple[dict, dict]:
    """``answerable-train`` plus the answerable questions of :data:`WIDE_SOURCES`, none
    sharing a normalised question with the frozen split (train, dev, test),
    ``hipporag-dev`` or ``hipporag-test``.

    Returns:
        ``(document for WIDE_FILE, record)``.
    """
    t0 = time.perf_counter()
    res = filter_pool(cfg, sources=WIDE_SOURCES,
                      held_out=[*HELD_OUT, "answerable-train", "answerable-dev", "answerable-test"])
    seconds = round(time.perf_counter() - t0, 1)
    base = [t.to_dict() for t in load_tasks("answerable-train")]
    extra = [t.to_dict() for t in res["answerable"]]
    rows = base + extra
    doc = {"description": ("answerable-train plus the answerable questions of R1-Searcher's training sets, "
                           "filtered in the same env; made by scripts/make_answerable_pool.py --wide"),
           "seed": SEED, "settings": {"config": config, "search": cfg.search, "env": cfg.env, "sources": WIDE_SOURCES},
           "counts": {"train": len(rows)}, "pool": [r["task_id"] for r in rows], "slices": {"train": rows}}
    record = {"command": f"python scripts/make_answerable_pool.py --wide --config {config}", "seconds": seconds,
              "stages": res["stages"], "from_answerable_train": len(base), "added": len(extra), "train": len(rows),
              "added_by_source": count_sources(extra, [r["task_id"] for r in extra])}
    return doc, record


def cap_per_answer(rows: list[dict], most: int = MAX_PER_ANSWER) -> tuple[list[dict], dict[str, int]]:
    """The first ``most`` rows (task dicts, in order) of each gold answer (first alias,
    SQuAD-normalised); and how many rows of each answer that was over the cap were dropped."""
    seen: dict[str, int] = {}
    kept, dropped = [], {}
    for r in rows:
        key = normalize_answer(r["answers"][0]) if r["answers"] else ""
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= most:
            kept.append(r)
        else:
            dropped[key] = dropped.get(key, 0) + 1
    return kept, dict(sorted(dropped.items(), key=lambda kv: -kv[1]))


def build_wide_capped(wide: dict) -> tuple[dict, dict]:
    """The capped pool from the wide pool's document ``wide`` by :func:`cap_per_answer`.

    Returns:
        ``(document for WIDE_CAPPED_FILE, record)``.
    """
    rows, dropped = cap_per_answer(wide["slices"]["train"])
    doc = {"description": (f"answerable-train-wide with at most {MAX_PER_ANSWER} questions per gold answer; made by "
                           "scripts/make_answerable_pool.py --wide-capped"),
           "seed": wide["seed"], "settings": {**wide["settings"], "max_per_answer": MAX_PER_ANSWER},
           "counts": {"train": len(rows)}, "pool": [r["task_id"] for r in rows], "slices": {"train": rows}}
    record = {"command": "python scripts/make_answerable_pool.py --wide-capped",
              "from_wide": len(wide["slices"]["train"]),
              "train": len(rows), "max_per_answer": MAX_PER_ANSWER, "dropped_by_answer": dropped,
              "kept_by_source": count_sources(rows, [r["task_id"] for r in rows])}
    return doc, record


def count_sources(pool: list[dict], ids: list[str]) -> dict[str, int]:
    """Rows of ``pool`` among ``ids``, per ``metadata["pool_source"]``."""
    want = set(ids)
    out: dict[str, int] = {}
    for r in pool:
        if r["task_id"] in want:
            s = r["metadata"]["pool_source"]
            out[s] = out.get(s, 0) + 1
    return out
