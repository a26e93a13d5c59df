"""drgym.evaluation.stats: bootstrap intervals over questions and paired differences."""

from __future__ import annotations

import math

import pytest

from drgym.evaluation.compare import CompareRow
from drgym.evaluation.stats import format_ci, mean_ci, paired


def test_interval_of_a_binary_score_is_the_binomial_percentiles():
    # a resampled mean of [1, 0, 0, 0] is Binomial(4, 1/4) / 4: P(0) = 0.316 and
    # P(>= 0.75) = 0.051, P(1) = 0.004, so the 2.5% and 97.5% points are 0 and 0.75
    assert mean_ci([1.0, 0.0, 0.0, 0.0]) == {"mean": 0.25, "lo": 0.0, "hi": 0.75}
    assert mean_ci([0.5] * 7) == {"mean": 0.5, "lo": 0.5, "hi": 0.5}  # no spread: the point


def test_bad_scores_are_refused_by_name():
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])
    with pytest.raises(ValueError, match="1 of 3 values are NaN or infinite"):
        mean_ci([1.0, math.nan, 0.0])
    with pytest.raises(ValueError, match="cover different questions"):
        paired({"a": {"f1": 1.0}}, {"b": {"f1": 0.0}}, "f1")


def test_paired_difference_counts_wins_and_losses():
    a = {"q1": {"f1": 1.0}, "q2": {"f1": 0.5}, "q3": {"f1": 0.0}}
    b = {"q1": {"f1": 0.0}, "q2": {"f1": 0.5}, "q3": {"f1": 0.5}}
    d = paired(a, b, "f1")
    assert d["mean"] == pytest.approx(1 / 6) and (d["wins"], d["losses"], d["n"]) == (1, 1, 3)
    assert not d["excludes_zero"] and d["lo"] < 0 < d["hi"]


def test_compare_cells_show_the_interval_beside_the_mean():
    row = CompareRow(policy="p", backend="local", mode="live", metrics={"scores": {"f1": 0.4}, "answer_rate": 1.0},
                     usage={}, billed_usd=0.0, cis={"f1": {"mean": 0.4, "lo": 0.2, "hi": 0.6}})
    assert row.cell("f1", row.score("f1")) == "0.400 [0.200, 0.600]"
    assert row.cell("answer_rate", 1.0) == "1.000"  # no interval recorded: the mean alone
    assert format_ci({"mean": 0.4, "lo": 0.2, "hi": 0.6}, pct=True) == "40 % [20 %, 60 %]"
