"""Task loaders and the task-set registry, checked against rows read by hand from the files."""

from __future__ import annotations

import json

import pytest
from drgym.envs.task_loaders import (
    load_deepresearcher,
    load_drb,
    load_hf_tasks,
    load_nq_open,
    load_researchy,
    load_tasks,
    task_set_names,
)

from drgym.errors import ConfigError, CorpusError
from drgym.records import Task

SHIPPED = {  # name: rows, as counted in the shipped files
    "hotpotqa-dev": 79, "musique-dev": 80, "hipporag": 159, "hipporag-train": 79, "hipporag-dev": 20, "hipporag-test": 60, "nq-open": 200, "bamboogle": 66,
    "r1-hotpotqa": 393, "r1-2wiki": 398, "r1-musique": 379, "deepresearcher-dev": 627,
    "simpleqa": 100, "frames": 50, "drb": 90, "drb-en": 40, "drb-zh": 50,
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_sets_load_with_unique_ids(name):
    tasks = load_tasks(name)
    assert len(tasks) == SHIPPED[name]
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert all(t.question.strip() for t in tasks)
    if name.startswith("drb"):
        assert all(t.kind == "research" and not t.answers for t in tasks)
    else:
        assert all(t.kind == "qa" and t.answers for t in tasks)


def test_hipporag_hotpotqa_fields():
    t = load_tasks("hotpotqa-dev")[0]
    assert t == Task(
        task_id="hotpotqa-5a77ec115542992a6e59dff7", question="If Gallu is a demon Lilu is what?", answers=["a spirit"],
        kind="qa", gold_docs=["Alû", "Lilu (mythology)"], source="hotpotqa",
        metadata={"type": "bridge", "level": "easy", "gold_docs_kind": "title"},
    )


def test_hipporag_musique_fields():
    t = load_tasks("musique-dev")[0]
    assert t.task_id == "musique-2hop__150763_14904"
    assert t.answers == ["G. Stanley Hall", "Stanley Hall"]  # answer + answer_aliases (a repr string upstream)
    assert t.gold_docs == ["Journal of Psychotherapy Integration", "Adolescence"]
    assert t.metadata["decomposition"][0]["answer"] == "American Psychological Association"
    assert t.metadata["answerable"] is True


def test_other_formats():
    nq = load_tasks("nq-open")[0]
    assert (nq.task_id, nq.question, nq.answers) == ("nq-open-0", "when was the last time anyone was on the moon", ["14 December 1972 UTC", "December 1972"])
    bam = load_tasks("bamboogle")[0]
    assert (bam.task_id, bam.answers) == ("bamboogle-1", ["james madison"])
    dr = load_tasks("deepresearcher-dev")[0]
    assert dr.task_id == "deepresearcher-dev-tq_qg_3477" and dr.metadata == {"data_source": "tq"}
    assert dr.answers[:3] == ["türkiye", "türkei", "türkiye cumhuriyeti"] and "turkey" in dr.answers and len(dr.answers) == 26
    sq = load_tasks("simpleqa")[0]
    assert (sq.question, sq.answers) == ("Who received the IEEE Frank Rosenblatt Award in 2010?", ["Michio Sugeno"])
    assert sq.gold_docs[0] == "https://en.wikipedia.org/wiki/IEEE_Frank_Rosenblatt_Award" and len(sq.gold_docs) == 3  # duplicates dropped
    fr = load_tasks("frames")[0]
    assert fr.answers == ["Jane Ballou"] and fr.gold_docs[:2] == [
        "https://en.wikipedia.org/wiki/President_of_the_United_States", "https://en.wikipedia.org/wiki/James_Buchanan"]
    en = load_tasks("drb-en")[0]
    assert en.task_id == "drb-51" and en.metadata["language"] == "en" and en.question.startswith("From 2020 to 2050, how many elderly people")
    assert load_tasks("drb-zh")[0].question.startswith("收集整理目前中国9阶层实际收入和财务状况")


def test_limit_and_cache_copies():
    a = load_tasks("hotpotqa-dev", limit=5)
    assert len(a) == 5
    a.clear()
    assert len(load_tasks("hotpotqa-dev")) == 79


def test_unknown_name_did_you_mean():
    with pytest.raises(ConfigError, match=r"^Unknown task set 'musique-de'\. Did you mean 'musique-dev'\? Known: "):
        load_tasks("musique-de")
    assert "researchy" in task_set_names()


def test_unshipped_set_without_shared_data(monkeypatch, tmp_path):
    monkeypatch.setenv("DRGYM_SHARED_DATA", str(tmp_path))
    with pytest.raises(CorpusError, match="this task set is not shipped with drgym"):
        load_tasks("frames-full")


def test_files_in_other_formats(tmp_path):
    p = tmp_path / "mine.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [
        {"question": "Capital of France?", "answer": "Paris<|answer_split|>paris, france"},
        {"question": "2+2?", "answer": ["4", "four"]},
    ]) + "\n", encoding="utf-8")
    tasks = load_hf_tasks(p)
    assert [(t.task_id, t.answers) for t in tasks] == [("mine-0", ["Paris", "paris, france"]), ("mine-1", ["4", "four"])]
    assert [t.task_id for t in load_tasks(str(p))] == ["mine-0", "mine-1"]
    with pytest.raises(ConfigError, match=r"has no column 'query'"):
        load_hf_tasks(p, question_key="query")
    nq = tmp_path / "nq.jsonl"
    nq.write_text('{"question": "q1", "answer": ["a", "a", " b "]}\n', encoding="utf-8")
    assert load_nq_open(nq)[0].answers == ["a", "b"]
    drb = tmp_path / "q.jsonl"
    drb.write_text('{"id": 7, "topic": "T", "language": "en", "prompt": " Study X. "}\n', encoding="utf-8")
    assert load_drb(drb) == [Task("drb-7", "Study X.", kind="research", source="drb", metadata={"topic": "T", "language": "en"})]


def test_deepresearcher_parquet_roundtrip(tmp_path):
    import pandas as pd

    p = tmp_path / "d.parquet"
    pd.DataFrame([{"data_source": "nq", "prompt": [{"role": "user", "content": "who?"}], "ability": "x",
                   "reward_model": {"ground_truth": "a<|answer_split|>b", "style": "rule"},
                   "extra_info": {"index": "nq_1", "split": "dev"}}]).to_parquet(p)
    assert load_deepresearcher(p) == [Task("deepresearcher-nq_1", "who?", ["a", "b"], source="deepresearcher", metadata={"data_source": "nq"})]


def test_researchy_with_key_points(shared_data):
    d = shared_data / "deepresearchgym"
    tasks = load_researchy(d / "queries/researchy_queries_sample_doc_click_100.jsonl", d / "key_points/key_points_aggregated.jsonl")
    assert len(tasks) == 100 and tasks[0].task_id == "researchy-346541"
    assert tasks[0].question == "should children compete in competitive sports" and tasks[0].kind == "research"
    assert len(tasks[0].key_points) == 15 and set(tasks[0].key_points[0]) == {"point", "number"}
    assert sum(1 for t in tasks if t.key_points) == 99  # SOURCE.md: 24 of the 1000 queries have no key points


def test_hipporag_split_is_disjoint_covers_all_and_keeps_main_job_out_of_train():
    from drgym.envs.task_loaders import hipporag_split

    split = hipporag_split()
    sets = {k: set(v) for k, v in split.items()}
    assert all(len(sets[k]) == len(split[k]) for k in sets)  # no duplicate within a slice
    assert not sets["train"] & sets["dev"] and not sets["train"] & sets["test"] and not sets["dev"] & sets["test"]
    assert sets["train"] | sets["dev"] | sets["test"] == {t.task_id for t in load_tasks("hipporag")}
    main_job = [t.task_id for t in load_tasks("hotpotqa-dev", limit=20)]  # drgym rollout's default questions
    assert [t.task_id for t in load_tasks("hipporag-test")][:20] == main_job
    assert not set(main_job) & (sets["train"] | sets["dev"])
    for name in ("train", "dev", "test"):  # both sources in every slice
        srcs = {t.source for t in load_tasks(f"hipporag-{name}")}
        assert srcs == {"hotpotqa", "musique"}, (name, srcs)


def test_hipporag_split_file_is_what_the_script_makes():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / "make_hipporag_split.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
