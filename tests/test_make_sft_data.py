"""drgym.training.sft_data's two-hop source (scripts/make_sft_data.py): a second search only when the first results lack
the answer, with a query read off those results, and an answer read off the second."""

from __future__ import annotations

import json

from drgym.training import sft_data

HUMBERT = "hotpotqa-5ae3b0005542992f92d82341"  # hipporag-train; gold docs Dick Humbert, Philadelphia Eagles


def _task(task_id: str):
    from drgym.envs.task_loaders import load_tasks

    return next(t for t in load_tasks("hipporag-train") if t.task_id == task_id)


def test_bridge_query_is_a_supporting_title_named_in_the_first_results_and_not_in_the_question():
    sd = sft_data
    t = _task(HUMBERT)
    assert t.answers == ["Pennsylvania"] and "Dick Humbert" in t.gold_docs  # a gold title the question names
    assert sd.bridge_query(t, "He played for the Philadelphia Eagles (1941, 1945-1949).") == "Philadelphia Eagles"
    assert sd.bridge_query(t, "Dick Humbert was an American football end.") is None  # not named: no second hop
    assert sd._bare_title("Lilu (mythology)") == "Lilu" and sd._bare_title("Canton, Massachusetts") == "Canton, Massachusetts"


def test_bridge_policy_searches_again_only_when_the_answer_is_not_yet_in_view():
    sd = sft_data
    t = _task(HUMBERT)
    pol = sd.BridgePolicy({t.task_id: t})
    info = {"task_id": t.task_id, "episode_id": "e1", "searches_left": 2}
    assert pol.act_one({**info, "turn": 0}) == f"<search> {t.question} </search>"
    first = "<information>Doc 1 (Title: Dick Humbert) He played for the Philadelphia Eagles.</information>"
    assert pol.act_one({**info, "turn": 1, "observation": first}) == "<search> Philadelphia Eagles </search>"
    second = "<information>Doc 1 (Title: Philadelphia Eagles) A franchise based in Philadelphia, Pennsylvania.</information>"
    assert pol.act_one({**info, "turn": 2, "observation": second}) == "<answer> Pennsylvania </answer>"
    # the answer already in the first results: answer, no second search
    pol.act_one({**info, "episode_id": "e2", "turn": 0})
    assert pol.act_one({**info, "episode_id": "e2", "turn": 1, "observation": second}) == "<answer> Pennsylvania </answer>"


def test_two_hop_run_through_the_env_keeps_only_supported_second_hops(bm25_backend, tmp_path):
    """The bridge run in a real env over real HippoRAG paragraphs, then the build's filter."""
    from drgym.envs.task_loaders import load_tasks
    from drgym.evaluation.runner import RolloutConfig, run_rollout

    sd = sft_data
    tasks = load_tasks("hipporag-train")[:12]
    if HUMBERT not in {t.task_id for t in tasks}:
        tasks.append(_task(HUMBERT))
    run = tmp_path / "samples" / "two_hop"
    rc = RolloutConfig(tasks="hipporag-train", policy=sd.BridgePolicy.name, n=None, out=str(run), plots=False,
                       env_options={"top_k": 3, "max_obs_tokens": 150, "max_searches": 2, "max_fetches": 0}, max_turns=3)
    res = run_rollout(rc, policy=sd.BridgePolicy({t.task_id: t for t in tasks}), backend=bm25_backend, tasks=tasks,
                      progress=False)
    assert len(res.trajectories) == len(tasks)
    rec = sd.build(tmp_path, [run], task_set="hipporag-train", per_question=2)
    kept = [json.loads(x) for x in (tmp_path / "sft_trajectories.jsonl").read_text().splitlines()]
    c = rec["filter_counts"]
    assert rec["kept"] == len(kept) == c["two_hop_bridge_gold_span"] >= 1
    assert c["two_hop_bridge_gold_span"] + c["two_hop_one_search"] + c["two_hop_gold_not_in_second"] + c["yes_no_question"] \
        == len(tasks)
    golds = {t.task_id: t.answers for t in tasks}
    for k in kept:
        steps = k["steps"]
        assert [s["action"].split(">")[0] for s in steps] == ["<search", "<search", "<answer"]
        first, second = steps[0]["observation"], steps[1]["observation"]
        assert sd.find_span(first, golds[k["task_id"]]) is None  # the first search did not find it
        span = sd.find_span(second, golds[k["task_id"]])
        assert span is not None and k["final_answer"] == span and steps[2]["action"] == f"<answer> {span} </answer>"
        q2 = k["metadata"]["bridge_query"]
        assert steps[1]["action"] == f"<search> {q2} </search>" and q2.lower() in first.lower()
    # oversampling writes each kept two-hop episode again; the record counts distinct ones
    rec2 = sd.build(tmp_path, [run], task_set="hipporag-train", per_question=2, two_hop_copies=3)
    lines = (tmp_path / "sft_trajectories.jsonl").read_text().splitlines()
    assert rec2["kept"] == rec["kept"] and rec2["written"] == len(lines) == 3 * rec["kept"]
    # `drgym data sft --build-only` runs the same build over the same sample runs
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "drgym", "data", "sft", "--build-only", "--k", "0", "--two-hop",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rec3 = json.loads((tmp_path / "sft_data_record.json").read_text())
    assert json.loads(p.stdout)["kept"] == rec3["kept"] == rec["kept"] and rec3["filter_counts"] == rec["filter_counts"]
    assert rec3["made_by"] == f"drgym data sft --build-only --k 0 --two-hop --out {tmp_path}"


def test_build_refuses_held_out_questions_and_a_copy_count_below_one(tmp_path):
    import pytest

    from drgym.errors import ConfigError

    with pytest.raises(ConfigError, match="hipporag-dev holds dev/test questions"):
        sft_data.build(tmp_path, [], task_set="hipporag-dev", per_question=2)
    with pytest.raises(ConfigError, match="--two-hop-copies must be >= 1, got 0"):
        sft_data.build(tmp_path, [], task_set="hipporag-train", per_question=2, two_hop_copies=0)
    assert not (tmp_path / "sft_trajectories.jsonl").exists()
