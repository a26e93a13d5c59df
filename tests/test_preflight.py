"""drgym train preflight: the data checks on real configs and questions, and the policy part."""

from __future__ import annotations

import pytest

from drgym.training.config import load_config
from drgym.training.preflight import _group_stats, detectable_effect, preflight, claim_slice_record
from drgym.records import Task


def test_detectable_effect_formula():
    # (1.96 + 0.84) * sqrt(2 * 0.5) * 0.4 / sqrt(400) = 0.056
    assert detectable_effect(0.4, 400) == pytest.approx(0.056)
    assert detectable_effect(0.4, 100) == pytest.approx(0.112)
    assert detectable_effect(0.4, 1) is None


def test_a_sample_without_spread_does_not_claim_a_zero_detectable_lift():
    """Every sampled episode scoring 0 says nothing about a test's noise: the assumed spread is used."""
    t = claim_slice_record("hipporag-test", 60, 0.0)
    assert t["detectable_effect_f1"] == pytest.approx(2.8 * 0.4 / 60 ** 0.5, abs=1e-4)
    assert "no spread" in t["sd_source"]
    assert claim_slice_record("answerable-test", 400, 0.27)["detectable_effect_f1"] == pytest.approx(0.0378, abs=1e-4)


def test_data_checks_tell_a_run_that_fits_from_one_with_breadth(default_engine):
    """smollm2_answerable_cpu draws its 190 questions about 3 times: the preflight says so;
    the breadth config draws each of ~10k at most once, and its questions show their gold."""
    narrow = preflight(load_config("smollm2_answerable_cpu"), n_tasks=12, skip_policy=True, backend=default_engine)
    assert narrow["budget"]["distinct_train_questions"] == 190
    assert narrow["budget"]["draws_per_question"] == pytest.approx(300 * 16 / 8 / 190, abs=0.01)
    assert any("drawn 3.16 times" in v for v in narrow["verdicts"])
    assert not narrow["can_show_lift"]
    wide = preflight(load_config("smollm2_breadth_cpu"), n_tasks=24, skip_policy=True, backend=default_engine)
    assert wide["budget"]["distinct_train_questions"] >= 5000
    assert wide["budget"]["draws_per_question"] < 1
    assert wide["data"]["gold_in_view_frac"] >= 0.8
    assert wide["test"]["set"] == "answerable-test" and wide["test"]["n"] == 400
    assert wide["can_show_lift"]
    assert wide["policy_skipped"]


def test_group_stats_counts_zero_variance_groups_and_pass_at_k():
    tasks = {"a": Task("a", "q", ["Paris"]), "b": Task("b", "q", ["Rome"])}
    trajs = [
        {"task_id": "a#s0", "final_answer": "Paris", "reward": 1.0, "reward_components": {"f1": 1.0}},
        {"task_id": "a#s1", "final_answer": "Lyon", "reward": 0.0, "reward_components": {"f1": 0.0}},
        {"task_id": "b#s0", "final_answer": "", "reward": -0.1, "reward_components": {"f1": 0.0}},
        {"task_id": "b#s1", "final_answer": "Milan", "reward": -0.1, "reward_components": {"f1": 0.0}},
    ]
    s = _group_stats(trajs, tasks, 2)
    assert s["pass_at_1"] == 0.25 and s["pass_at_2"] == 0.5
    assert s["zero_variance_group_frac"] == 0.5
    assert s["answer_rate"] == 0.75
    assert s["f1_mean"] == 0.25


@pytest.mark.slow
def test_policy_part_runs_the_start_policy(default_engine):
    rec = preflight(load_config("smollm2_breadth_cpu"), n_tasks=2, k=2, backend=default_engine)
    pol = rec["policy"]
    assert pol["episodes"] == 4 and pol["questions"] == 2 and pol["temperature"] == 1.0
    assert 0 <= pol["pass_at_1"] <= pol["pass_at_2"] <= 1
