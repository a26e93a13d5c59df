"""EM, cover-EM and F1 agree with each other, as properties over generated answers.

For every prediction and gold list (hypothesis: 10,000 generated cases a run, drawn in
batches of 50 so that the run takes seconds):
EM = 1 implies cover-EM = 1 and F1 = 1; cover-EM >= EM; every score is 0.0 or 1.0 (EM,
cover-EM) or in [0, 1] (F1); the three read the same form of each string
(:func:`match_form`), so they depend on nothing else. Strings are drawn to normalise to
little or nothing: articles, punctuation, white space of several kinds, yes/no, accents,
CJK, combining marks, case pairs such as ``İ``/``ß``. The same holds through the reward
classes, with and without the answer guard, and for the judge's soft match (an exact match
is never refused). Texts the official normalisation leaves non-empty keep the official
scores (``tests/test_rewards_hacking.py`` checks 561 pairs against the official script).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drgym.records import Episode, Task
from drgym.rewards.qa import (
    F1,
    CoverExactMatch,
    ExactMatch,
    SoftMatch,
    cover_exact_match,
    exact_match,
    match_form,
    normalize_answer,
    token_f1,
)

CASES = 10_000

WORDS = ["a", "an", "the", "A", "The", "AN", "yes", "no", "noanswer", "Yes.", "paris", "Paris", "PARIS", "france",
         "1,000", "1000", "é", "É", "café", "cafe\u0301", "İ", "i", "ß", "SS", "東京", "!!!", "...", "-", "'s",
         "“", "”", "—", "¿", "x", "Eiffel", "tower", "Ω", "ﬁ", "Ⅻ", "٣", "🙂", "\u0301", "\ufeff", "a.n", "t-h-e"]
SEPS = [" ", "  ", "\t", "\n", "\u00a0", "\u3000", "\u2028", "\u200b", ", ", ". ", "-", "", " or ", " and ", "!"]
# single characters of many Unicode categories (letters of several scripts, marks,
# punctuation, symbols, spaces), so that a piece can also be any short string of them
CHARS = [chr(c) for c in [*range(0x20, 0x7f), *range(0xa0, 0x180, 3), *range(0x300, 0x370, 7), *range(0x391, 0x3ca, 5),
                          *range(0x410, 0x450, 5), 0x5d0, 0x627, 0x905, 0x3042, 0x4e00, 0xac00, *range(0x2000, 0x2070, 3),
                          0x20ac, 0x2122, 0xff01, 0xff21, 0x1f600]]


def _compose(n: int) -> str:
    """The string number ``n`` (mixed radix): up to 5 pieces, each a word of WORDS or 1-3
    characters of CHARS, each followed by a separator of SEPS. One integer draw a string
    keeps the generation cheap, so that 10,000 cases take seconds."""
    n, count = divmod(n, 6)
    out = []
    for _ in range(count):
        n, kind = divmod(n, 3)
        if kind:
            n, w = divmod(n, len(WORDS))
            out.append(WORDS[w])
        else:
            n, m = divmod(n, 3)
            for _ in range(m + 1):
                n, c = divmod(n, len(CHARS))
                out.append(CHARS[c])
        n, sep = divmod(n, len(SEPS))
        out.append(SEPS[sep])
    return "".join(out)


def _case(n: int) -> tuple[str, list[str]]:
    """Case number ``n``: a prediction and 1-3 golds, each a :func:`_compose` of 96 bits."""
    n, extra = divmod(n, 3)
    parts = [(n >> (96 * i)) & (2**96 - 1) for i in range(2 + extra)]
    return _compose(parts[0]), [_compose(x) for x in parts[1:]]


text = st.integers(min_value=0, max_value=2**96).map(_compose)
case = st.integers(min_value=0, max_value=2**400).map(_case)
BATCH = 50
FAST = settings(max_examples=CASES // BATCH, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def batches(strategy):
    """``BATCH`` draws of ``strategy`` per example: CASES cases in CASES // BATCH examples."""
    return st.lists(strategy, min_size=BATCH, max_size=BATCH)


@FAST
@given(cases=batches(case))
def test_em_implies_cover_and_f1_and_scores_are_in_range(cases):
    for pred, gs in cases:
        _check_metrics(pred, gs)


def _check_metrics(pred, gs):
    em, cover, f1 = exact_match(pred, gs), cover_exact_match(pred, gs), token_f1(pred, gs)
    assert em in (0.0, 1.0) and cover in (0.0, 1.0) and 0.0 <= f1 <= 1.0
    assert cover >= em
    if em == 1.0:
        assert cover == 1.0 and f1 == 1.0, (pred, gs)
    # one normalisation for all three: the scores depend only on match_form of each side
    fp, fg = match_form(pred), [match_form(g) for g in gs]
    assert (exact_match(fp, fg), cover_exact_match(fp, fg), token_f1(fp, fg)) == (em, cover, f1)
    assert em == float(bool(fp) and fp in fg)
    # a blank answer is right about nothing
    if not fp:
        assert (em, cover, f1) == (0.0, 0.0, 0.0)


@FAST
@given(strings=batches(text))
def test_match_form_is_the_official_form_whenever_that_is_not_empty(strings):
    for s in strings:
        f = match_form(s)
        assert match_form(f) == f  # idempotent: comparing forms is comparing strings
        if normalize_answer(s):
            assert f == normalize_answer(s)
        assert (f == "") == (not s.split())  # empty only for blank text


@settings(FAST, max_examples=40)
@given(cases=batches(case), cap=st.sampled_from([None, 1, 3]),
       mode=st.sampled_from(["allow", "divide", "zero"]))
def test_rewards_with_a_guard_never_refuse_what_em_pays(cases, cap, mode):
    e = [Episode(Task("t", "q?", gs), pred) for pred, gs in cases]
    ems = ExactMatch(max_answer_tokens=cap, candidates=mode).score(e).scores
    covers = CoverExactMatch(max_answer_tokens=cap, candidates=mode).score(e).scores
    f1s = F1(max_answer_tokens=cap, candidates=mode).score(e).scores
    for (pred, gs), em, cover, f1 in zip(cases, ems, covers, f1s):
        assert cover >= em and 0.0 <= f1 <= 1.0
        if em == 1.0:
            assert cover == 1.0 and f1 == 1.0, (pred, gs, cap, mode)


class _Refuses:
    """A judge that never sees a request: any call fails the test."""

    model_id = "stub:refuses"

    def judge_many(self, reqs):
        assert not reqs, reqs
        return []


@settings(FAST, max_examples=40)
@given(cases=batches(case))
def test_soft_match_pays_every_exact_match_without_a_call(cases):
    from drgym.judges.base import Judge

    class Refuses(_Refuses, Judge):
        def complete(self, messages, **kw):
            raise AssertionError("no judge call expected")

    exact = [Episode(Task("t", "q?", gs), pred) for pred, gs in cases if exact_match(pred, gs) == 1.0]
    r = SoftMatch(Refuses(cache=False), candidates="zero", max_answer_tokens=1)
    assert r.score(exact).scores == [1.0] * len(exact)


@pytest.mark.parametrize("pred, gold, em, cover, f1", [
    ("", "A", 0.0, 0.0, 0.0),            # the official script gives EM 1: both normalise to ""
    ("the", "A", 0.0, 0.0, 0.0),         # the same
    ("A.", "A", 1.0, 1.0, 1.0),          # the grade "A" keeps its letter
    ("!!!", "!!!", 1.0, 1.0, 1.0),       # the band
    ("The The", "the the", 1.0, 1.0, 1.0),
    ("The The", "The", 0.0, 1.0, 2 / 3),  # the gold is inside
    ("  ", "  ", 0.0, 0.0, 0.0),         # blank: nothing to match
    ("Paris.", "paris", 1.0, 1.0, 1.0),  # the official rules unchanged
    ("yes or no", "yes", 0.0, 0.0, 0.0),
])
def test_texts_that_normalise_to_nothing(pred, gold, em, cover, f1):
    assert (exact_match(pred, [gold]), cover_exact_match(pred, [gold]), token_f1(pred, [gold])) == (em, cover, f1)


def test_the_three_take_and_refuse_the_same_inputs():
    """What exact_match accepts the other two accept; what it refuses they refuse alike."""
    inputs = [("Paris", "Paris"), ("Paris", ("Paris", "Lutetia")), (1997, [1997]), (None, ["none"]),
              ("x", []), ("x", ["x", 2.5]), ("x", None), ("x", 5)]
    for pred, gs in inputs:
        outcomes = []
        for fn in (exact_match, cover_exact_match, token_f1):
            try:
                outcomes.append(("ok", fn(pred, gs) >= 0.0))
            except Exception as e:  # noqa: BLE001 - the kind of refusal is what is compared
                outcomes.append(("error", type(e).__name__))
        assert len(set(outcomes)) == 1, (pred, gs, outcomes)
    assert exact_match(None, ["none"]) == 0.0  # no answer is not the word "none"
