"""The answerable pool and its frozen split (drgym.training.answerable_pool, scripts/make_answerable_pool.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    from drgym.training import answerable_pool

    return answerable_pool


def test_split_is_disjoint_and_sized():
    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards.qa import normalize_answer
    from drgym.training.data import check_disjoint

    train, dev, test = (load_tasks(f"answerable-{s}") for s in ("train", "dev", "test"))
    assert len(test) >= 400 and len(dev) == 30 and 150 <= len(train) <= 230
    for a, b in ((train, dev), (train, test), (dev, test)):
        check_disjoint(a, b)  # raises on a shared id or normalised question
    # hipporag-dev / -test stay their own slices: none of their questions is in the pool
    held = {normalize_answer(t.question) for n in ("hipporag-dev", "hipporag-test") for t in load_tasks(n)}
    assert not held & {normalize_answer(t.question) for t in train + dev + test}
    # no question carries its own answer, and none is yes/no only
    script = _script()
    from drgym.rewards.qa import cover_exact_match

    for t in train + dev + test:
        golds = script.gold_aliases(t)
        assert golds and not cover_exact_match(t.question, golds), t.task_id
    # the search-skill pool's test slice shares no question with the answerable test slice
    skill_test = load_tasks("search-skill-test")
    assert len(skill_test) == 200
    check_disjoint(test, skill_test)


def test_split_is_what_the_script_makes():
    script = _script()
    for path, fn in ((script.SPLIT_FILE, script.make_split), (script.SKILL_FILE, script.make_skill_split)):
        doc = json.loads(path.read_text(encoding="utf-8"))
        want = {k: [r["task_id"] for r in v] for k, v in doc["slices"].items()}
        assert fn(script.pool_of(doc)) == want, path.name
        assert doc["seed"] == script.SEED
    # and a different seed gives a different split (the check can fail)
    doc = json.loads(script.SPLIT_FILE.read_text(encoding="utf-8"))
    assert script.make_split(script.pool_of(doc), seed=1)["test"] != [r["task_id"] for r in doc["slices"]["test"]]


def test_pool_record_matches_the_split():
    rec = json.loads((ROOT / "training" / "results" / "answerable_pool" / "pool_record.json").read_text())
    doc = json.loads(_script().SPLIT_FILE.read_text(encoding="utf-8"))
    assert rec["answerable"] == len(doc["pool"])
    assert rec["split"] == {k: len(v) for k, v in doc["slices"].items()}
    assert sum(s["obs_hit"] for s in rec["stages"].values()) == rec["answerable"]
    assert doc["settings"]["env"]["kwargs"]["max_obs_tokens"] == 150


@pytest.mark.slow
def test_filter_reproduces_on_a_sample():
    """Re-run the env filter on 12 pool questions and 12 rejected ones from the same sources:
    the kept ones are still answerable in the training env, the others are not.

    The pool was filtered with the torch (float32) query encoder, before ONNX int8 became the
    default; int8 changes which passages come back for some questions, so the filter is
    reproduced with the encoder it ran with (``settings.search.encoder_backend`` in the record,
    pinned in the config)."""
    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards.qa import cover_exact_match
    from drgym.training.config import load_config
    from drgym.envs.prompts import shown_text
    from drgym.training.data import make_env_factory

    script = _script()
    cfg = load_config("smollm2_answerable_cpu")
    record = json.loads((ROOT / "training/results/answerable_pool/pool_record.json").read_text())
    assert cfg.search["encoder_backend"] == record["settings"]["search"]["encoder_backend"] == "torch"
    kept = load_tasks("answerable-train")[:6] + load_tasks("answerable-test")[:6]
    kept_q = {t.question for t in load_tasks("answerable-train") + load_tasks("answerable-dev")
              + load_tasks("answerable-test")}
    others = [t for t in load_tasks("hipporag-train") if t.question not in kept_q
              and script.gold_aliases(t) and not cover_exact_match(t.question, script.gold_aliases(t))][:12]
    env = make_env_factory(cfg, kept + others)()

    def shown(t):
        env.reset(options={"task": t})
        obs, *_ = env.step(f"<search>{t.question}</search>")
        return cover_exact_match(shown_text(obs), script.gold_aliases(t))

    assert all(shown(t) for t in kept)
    assert not any(shown(t) for t in others)


def test_wide_train_pool_holds_answerable_train_and_no_held_out_question():
    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards.qa import cover_exact_match, normalize_answer
    from drgym.training.data import check_disjoint

    wide, train = load_tasks("answerable-train-wide"), load_tasks("answerable-train")
    assert [t.task_id for t in wide[: len(train)]] == [t.task_id for t in train]
    extra = wide[len(train):]
    assert len(extra) >= 200 and {t.metadata["pool_source"] for t in extra} <= {"r1-stage1", "r1-stage2"}
    for name in ("answerable-dev", "answerable-test", "hipporag-dev", "hipporag-test"):
        check_disjoint(extra, load_tasks(name))
    assert len({normalize_answer(t.question) for t in wide}) == len(wide)
    script = _script()
    for t in extra:
        golds = script.gold_aliases(t)
        assert golds and not cover_exact_match(t.question, golds), t.task_id
    rec = json.loads((ROOT / "training" / "results" / "answerable_pool" / "wide_record.json").read_text())
    assert rec["train"] == len(wide) and rec["added"] == len(extra)


def test_wide_capped_pool_is_the_wide_pool_with_at_most_three_questions_per_gold():
    """answerable-train-wide-capped is what the script's cap makes of answerable-train-wide:
    the same questions in the same order, minus those past the third of one gold answer; the
    136 "American" questions are what made the cap necessary."""
    from collections import Counter

    from drgym.envs.task_loaders import load_tasks
    from drgym.rewards.qa import normalize_answer

    script = _script()
    wide, capped = load_tasks("answerable-train-wide"), load_tasks("answerable-train-wide-capped")
    golds = Counter(normalize_answer(t.answers[0]) for t in wide)
    assert golds["american"] == 136
    kept, dropped = script.cap_per_answer([t.to_dict() for t in wide])
    assert [r["task_id"] for r in kept] == [t.task_id for t in capped]
    assert max(Counter(normalize_answer(t.answers[0]) for t in capped).values()) == script.MAX_PER_ANSWER == 3
    assert dropped["american"] == 133 and len(capped) == len(wide) - sum(dropped.values()) == 321
    train_ids = [t.task_id for t in load_tasks("answerable-train")]
    assert [t.task_id for t in capped[: len(train_ids)]] == train_ids  # no answerable-train question is dropped
    rec = json.loads((ROOT / "training" / "results" / "answerable_pool" / "wide_capped_record.json").read_text())
    assert rec["train"] == len(capped) and rec["dropped_by_answer"] == dropped


def test_wide_capped_files_are_what_build_wide_capped_writes():
    """The shipped capped pool and its record, rebuilt from the shipped wide pool, byte for byte as JSON."""
    script = _script()
    doc, record = script.build_wide_capped(json.loads(script.WIDE_FILE.read_text()))
    assert doc == json.loads(script.WIDE_CAPPED_FILE.read_text())
    assert record == json.loads((ROOT / "training" / "results" / "answerable_pool" / "wide_capped_record.json").read_text())
    assert len(doc["slices"]["train"]) == 321 and record["dropped_by_answer"]["american"] == 133


def test_drgym_data_pool_checks_the_shipped_split_and_asks_for_an_output_folder():
    from typer.testing import CliRunner

    from drgym.cli import app

    res = CliRunner().invoke(app, ["data", "pool", "--check-split"])
    assert res.exit_code == 0 and "split files are what the split makes" in res.output
    res = CliRunner().invoke(app, ["data", "pool"])
    assert res.exit_code == 2 and "give --out FOLDER" in res.output
