"""Short-answer rewards against the official HotpotQA evaluation and against reward hacking.

1. ``token_f1`` / ``exact_match`` / ``normalize_answer`` against the official functions'
   values (``tests/data/rewards/hotpot_official_reference.json``: hotpot_evaluate_v1.py,
   multi-gold max as FlashRAG) on 561 pairs built from the shipped golds.
2. Hedged yes/no answers (issue 2.3, item 3).
3. What each built-in short-answer reward pays to each cheap strategy a GRPO policy finds
   (issue 2.3, item 4: candidate lists, pasted passages, the question repeated back,
   empty / punctuation-only answers, very long answers), unguarded and with the
   :class:`~drgym.rewards.qa.AnswerGuard`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drgym.envs.task_loaders import load_tasks
from drgym.records import Task
from drgym.errors import ConfigError
from drgym.rewards import Episode, build_reward, get_reward
from drgym.rewards.qa import (
    AnswerGuard,
    CoverExactMatch,
    ExactMatch,
    F1,
    FormatReward,
    SoftMatch,
    candidate_parts,
    cover_exact_match,
    exact_match,
    normalize_answer,
    squad_f1,
    token_f1,
)
from drgym.rewards.registry import WeightedReward
from drgym.training.trl_adapter import trl_reward_funcs

REFERENCE = Path(__file__).parent / "data" / "rewards" / "hotpot_official_reference.json"
CONFIGS = Path(__file__).resolve().parents[1] / "training" / "configs"


def ep(answer, golds, question="q?"):
    return Episode(task=Task(task_id="t", question=question, answers=golds), answer=answer)


# -- 1. the official script ------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


def test_reference_file_is_what_it_claims(reference):
    pairs = reference["pairs"]
    assert len(pairs) >= 500 and "hotpot_evaluate_v1.py" in reference["source"] and "Apache-2.0" in reference["license"]
    kinds = {p["kind"] for p in pairs}
    assert {"hedge-or", "hedge-both", "yes-no-extra", "candidate-list", "alias", "question-echo", "empty"} <= kinds
    # the file exercises both sides of every rule: some pairs score 0, 1 and in between
    f1s = [p["f1"] for p in pairs]
    assert min(f1s) == 0.0 and max(f1s) == 1.0 and sum(0 < f < 1 for f in f1s) > 100
    assert sum(p["em"] for p in pairs) > 100


def _official_em(p) -> float:
    """The official EM, but for the one deliberate difference: a prediction the official
    normalisation empties matches no gold it also empties (the official script gives EM 1
    and F1 0 there; ``rewards/qa.py``, ``match_form``)."""
    if not normalize_answer(p["prediction"]) and any(not normalize_answer(g) for g in p["golds"]):
        return 0.0
    return p["em"]


def test_token_f1_and_exact_match_match_the_official_script(reference):
    bad = []
    for p in reference["pairs"]:
        got = (normalize_answer(p["prediction"]), exact_match(p["prediction"], p["golds"]), token_f1(p["prediction"], p["golds"]))
        if got[0] != p["normalized_prediction"] or got[1] != _official_em(p) or abs(got[2] - p["f1"]) > 1e-9:
            bad.append((p, got))
    assert not bad, bad[:3]
    differ = [(p["prediction"], p["golds"]) for p in reference["pairs"] if _official_em(p) != p["em"]]
    assert differ == [("the", ["a"]), ("", ["the"])]  # official EM 1 with F1 0; here 0 and 0


def test_squad_f1_differs_from_the_official_hotpot_f1_exactly_on_yes_no(reference):
    # SQuAD F1 is kept under its own name; on the reference pairs it differs only where the
    # yes/no/noanswer rule applies (and on the both-empty case)
    for p in reference["pairs"]:
        pred, golds = normalize_answer(p["prediction"]), [normalize_answer(g) for g in p["golds"]]
        labels = {"yes", "no", "noanswer"}
        if pred not in labels and not (set(golds) & labels) and pred:
            assert squad_f1(p["prediction"], p["golds"]) == pytest.approx(p["f1"]), p


# -- 2. hedged yes/no answers (item 3) -------------------------------------------------------


@pytest.mark.parametrize(
    "pred, f1, squad",
    [
        ("yes or no", 0.0, 0.5),         # the issue's three cases: 0.5 / 0.667 / 0.5 before
        ("yes no", 0.0, 2 / 3),
        ("yes it is", 0.0, 0.5),
        ("Yes.", 1.0, 1.0),
        ("YES", 1.0, 1.0),
        ("no", 0.0, 0.0),
        ("no, yes", 0.0, 2 / 3),
        ("noanswer", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_hedged_yes_no_against_gold_yes(pred, f1, squad):
    assert token_f1(pred, ["yes"]) == pytest.approx(f1)
    assert squad_f1(pred, ["yes"]) == pytest.approx(squad)
    assert exact_match(pred, ["yes"]) == float(normalize_answer(pred) == "yes")
    assert cover_exact_match(pred, ["yes"]) == float(normalize_answer(pred) == "yes")


def test_yes_no_rule_applies_from_either_side_and_per_alias():
    assert token_f1("yes", ["Yes Minister"]) == 0.0           # prediction is a label, gold is not
    assert squad_f1("yes", ["Yes Minister"]) == pytest.approx(2 / 3)
    assert token_f1("no", ["no"]) == 1.0 and token_f1("No!", ["no"]) == 1.0
    assert token_f1("no way", ["no"]) == 0.0
    assert token_f1("yes or no", ["yes", "yes or no"]) == 1.0   # max over aliases: the second matches
    assert token_f1("Yes Minister", ["yes", "Yes Minister"]) == 1.0
    assert token_f1("noanswer", ["no answer"]) == 0.0          # "noanswer" is a label, "no answer" is not
    assert token_f1("", ["the"]) == 0.0 and squad_f1("", ["the"]) == 1.0   # official: no common token -> 0


def test_hedging_pays_nothing_on_the_shipped_yes_no_questions():
    tasks = [t for name in ("hotpotqa-dev", "musique-dev", "r1-2wiki") for t in load_tasks(name)
             if t.answers and normalize_answer(t.answers[0]) in ("yes", "no")]
    assert len(tasks) >= 30
    for t in tasks:
        for hedge in ("yes or no", "yes no", "no or yes", "yes it is", "maybe yes, maybe no"):
            assert token_f1(hedge, t.answers) == 0.0 and exact_match(hedge, t.answers) == 0.0
            assert cover_exact_match(hedge, t.answers) == 0.0
        assert token_f1(t.answers[0], t.answers) == 1.0


# -- 3. reward hacking (item 4) --------------------------------------------------------------

GUARD = {"max_answer_tokens": 10, "candidates": "divide"}


def pays(reward, answer, golds, question="q?"):
    return reward.score([ep(answer, golds, question)]).scores[0]


def test_candidate_list_from_the_issue():
    golds = ["Paris"]
    hack = "Paris, London, Berlin, Rome"
    assert pays(CoverExactMatch(), hack, golds) == 1.0            # the hole
    assert pays(CoverExactMatch(candidates="divide"), hack, golds) == 0.25
    assert pays(CoverExactMatch(candidates="zero"), hack, golds) == 0.0
    assert pays(ExactMatch(), hack, golds) == 0.0
    assert pays(F1(), hack, golds) == pytest.approx(0.4)          # P=1/4, R=1
    assert pays(F1(candidates="divide"), hack, golds) == pytest.approx(0.1)
    assert pays(FormatReward(), hack, golds) == 1.0


@pytest.mark.parametrize(
    "answer, golds, parts, divide",
    [
        ("Paris or Rome", ["Paris"], ["paris", "rome"], 0.5),
        ("Paris / Rome / Oslo", ["Paris"], ["paris", "rome", "oslo"], 1 / 3),
        ("Paris; Rome", ["Rome"], ["paris", "rome"], 0.5),
        ("- Paris\n- Rome\n- Oslo\n- Bern", ["Bern"], ["paris", "rome", "oslo", "bern"], 0.25),
        ("1) Paris 2) Rome", ["Rome"], ["paris", "rome"], 0.5),
        ("Paris, London, or Rome", ["Rome"], ["paris", "london", "rome"], 1 / 3),
        ("Paris and London", ["London"], ["paris", "london"], 0.5),
        ("yes or no", ["yes"], ["yes", "no"], 0.5),
        # not penalised: the parts all belong to a gold, or the answer is a gold
        ("Washington, D.C.", ["Washington, D.C."], ["washington", "dc"], 1.0),
        ("Washington, D.C.", ["Washington D.C."], ["washington", "dc"], 1.0),
        ("December 14, 1972", ["14 December 1972 UTC", "December 1972"], ["december 14", "1972"], 1.0),
        ("Bobby Scott and Bob Russell", ["Bobby Scott", "Bob Russell"], ["bobby scott", "bob russell"], 1.0),
        ("Columbus, Ohio", ["Columbus, Ohio"], ["columbus", "ohio"], 1.0),
        ("Simon & Garfunkel", ["Simon and Garfunkel"], ["simon", "garfunkel"], 1.0),
        ("1,000 people", ["1000"], ["1000 people"], 1.0),
        ("AC/DC", ["AC/DC"], ["acdc"], 1.0),
        # a shared generic word does not make a wrong candidate right
        ("University of Oxford, University of Cambridge", ["University of Oxford"],
         ["university of oxford", "university of cambridge"], 0.5),
        ("Paris, France", ["Paris"], ["paris", "france"], 0.5),
    ],
)
def test_candidate_detector(answer, golds, parts, divide):
    assert candidate_parts(answer) == parts
    assert AnswerGuard(candidates="divide").factor(answer, golds) == pytest.approx(divide)
    assert AnswerGuard(candidates="zero").factor(answer, golds) == float(divide == 1.0)
    assert AnswerGuard().factor(answer, golds) == 1.0


@pytest.fixture(scope="module")
def pasted():
    """A real HotpotQA-dev question whose gold occurs in a paragraph of the shipped corpus."""
    corpus = json.loads((Path(__file__).resolve().parents[1] / "drgym/data/corpora/hotpotqa_train_corpus.json").read_text())
    for t in load_tasks("hotpotqa-dev"):
        g = normalize_answer(t.answers[0])
        if g in ("yes", "no"):
            continue
        for title, sents in corpus.items():
            text = f"{title}: " + "".join(sents)
            if f" {g} " in f" {normalize_answer(text)} " and len(text.split()) > 40:
                return t, text
    raise AssertionError("no pasteable passage found")


def test_pasted_passage(pasted):
    task, passage = pasted
    golds = task.answers
    n = len(normalize_answer(passage).split())
    assert n > 40
    assert pays(CoverExactMatch(), passage, golds) == 1.0                 # the hole
    assert pays(ExactMatch(), passage, golds) == 0.0
    assert 0 < pays(F1(), passage, golds) <= 2 / (1 + n / len(normalize_answer(golds[0]).split())) + 1e-9
    for r in (CoverExactMatch(**GUARD), F1(**GUARD), ExactMatch(**GUARD)):
        assert pays(r, passage, golds) == 0.0
    assert pays(FormatReward(), passage, golds) == 1.0


def test_question_repeated_back():
    t = next(t for t in load_tasks("r1-hotpotqa") if t.question.startswith("Which genus is native to more continents"))
    assert t.answers == ["Nothoscordum"]
    q = t.question   # "Which genus is native to more continents, Nothoscordum or Callirhoe?"
    assert pays(CoverExactMatch(), q, t.answers, q) == 1.0                # the gold is in the question
    assert pays(ExactMatch(), q, t.answers, q) == 0.0
    assert pays(F1(), q, t.answers, q) == pytest.approx(2 / 11)          # 10 words, 1 right: P=1/10, R=1
    assert pays(CoverExactMatch(candidates="divide"), q, t.answers, q) == pytest.approx(1 / 3)
    assert pays(CoverExactMatch(max_answer_tokens=8), q, t.answers, q) == 0.0
    assert pays(CoverExactMatch(max_answer_tokens=10), q, t.answers, q) == 1.0   # 10 words: at the cap
    # a plain question echo without the gold earns nothing anywhere
    t2 = load_tasks("nq-open")[0]
    for r in (ExactMatch(), CoverExactMatch(), F1()):
        assert pays(r, t2.question, t2.answers) == 0.0


@pytest.mark.parametrize("answer", ["", "   ", "...", "?!", "<>", "\n\t"])
def test_empty_and_punctuation_only_answers(answer):
    golds = ["Paris"]
    for r in (ExactMatch(), CoverExactMatch(), F1(), F1(**GUARD), CoverExactMatch(**GUARD)):
        assert pays(r, answer, golds) == 0.0
    assert pays(FormatReward(), answer, golds) == 0.0
    # a gold that normalises to empty is not matched by an empty answer, under F1 (official) and EM
    # alike (the official EM gives 1 there)
    assert token_f1(answer, ["the"]) == 0.0 and exact_match(answer, ["the"]) == 0.0


def test_very_long_answer():
    golds = ["Stephen King"]
    long = "The film was directed by Stephen King. " + "It was shot in North Carolina in 1986 and " * 40
    assert pays(CoverExactMatch(), long, golds) == 1.0
    assert pays(F1(), long, golds) < 0.02
    assert pays(CoverExactMatch(max_answer_tokens=10), long, golds) == 0.0
    assert pays(F1(max_answer_tokens=10), long, golds) == 0.0
    # exactly at / one over the cap
    assert pays(CoverExactMatch(max_answer_tokens=3), "Stephen King novelist", golds) == 1.0
    assert pays(CoverExactMatch(max_answer_tokens=3), "Stephen King American novelist", golds) == 0.0


def test_length_cap_never_cuts_a_long_gold():
    # r1-musique and r1-hotpotqa hold golds longer than 10 normalised words
    long_golds = [t for name in ("r1-musique", "r1-hotpotqa") for t in load_tasks(name)
                  if any(len(normalize_answer(a).split()) > 10 for a in t.answers)]
    assert long_golds
    for t in long_golds:
        g = max(t.answers, key=lambda a: len(normalize_answer(a).split()))
        for r in (ExactMatch(**GUARD), F1(**GUARD), CoverExactMatch(**GUARD)):
            assert pays(r, g, t.answers) == 1.0, (t.task_id, g)


def test_guard_keeps_honest_answers_whole_on_the_shipped_dev_golds():
    # every shipped gold, answered exactly, still earns 1.0 under the guard the configs use
    for name in ("nq-open", "r1-2wiki", "bamboogle"):
        for t in load_tasks(name):
            for g in t.answers:
                assert pays(F1(**GUARD), g, t.answers) == 1.0 and pays(CoverExactMatch(**GUARD), g, t.answers) == 1.0


def test_guard_never_changes_exact_match(reference):
    g = AnswerGuard(max_answer_tokens=1, candidates="zero")
    for p in reference["pairs"]:
        assert exact_match(p["prediction"], p["golds"]) * g.factor(p["prediction"], p["golds"]) == _official_em(p)


def test_guard_components_and_options():
    out = F1(**GUARD).score([ep("Paris, Rome", ["Paris"]), ep("Paris", ["Paris"]), ep("x", [])])
    assert out.scores == [pytest.approx(2 / 3 * 0.5), 1.0, None]
    assert out.components["f1_guard"] == [0.5, 1.0, None]
    assert "f1_guard" not in F1().score([ep("Paris", ["Paris"])]).components
    with pytest.raises(ConfigError, match="candidates"):
        F1(candidates="halve")
    with pytest.raises(ConfigError, match="max_answer_tokens"):
        F1(max_answer_tokens=0)
    with pytest.raises(ConfigError, match="max_answer_tokens"):
        F1(max_answer_tokens=True)


def test_guard_through_the_registry_weighted_sum_and_trl():
    r = build_reward({"name": "f1", "kwargs": GUARD})
    assert isinstance(r, F1) and r.guard == AnswerGuard(10, "divide")
    assert get_reward("cover_em", candidates="zero").guard.candidates == "zero"
    w = build_reward({"weighted": [{"name": "f1", "weight": 1.0, "kwargs": GUARD}, {"name": "format", "weight": 0.2}]})
    assert isinstance(w, WeightedReward)
    out = w.score([ep("Paris, London, Berlin, Rome", ["Paris"]), ep("Paris", ["Paris"])])
    assert out.scores == [pytest.approx(0.1 + 0.2), pytest.approx(1.2)]
    funcs = trl_reward_funcs({"weighted": [{"name": "f1", "weight": 1.0, "kwargs": GUARD}, {"name": "format", "weight": 0.2}]})
    assert [f.__name__ for f in funcs] == ["f1", "format"]
    got = funcs[0](prompts=["q"] * 2, completions=["<answer>Paris or Rome</answer>", "<answer>Paris</answer>"], answers=[["Paris"]] * 2)
    assert got == [pytest.approx(0.5 * 0.5), 1.0]   # F1 of "paris or rome": P=1/3, R=1 -> 0.5; halved
    with pytest.raises(ConfigError, match="Bad options|candidates"):
        build_reward({"name": "em", "kwargs": {"candidates": "nope"}})


def test_training_configs_guard_their_short_answer_rewards():
    from drgym.training.config import load_config

    checked = 0
    for path in sorted(CONFIGS.glob("searchqa_*.yaml")):
        cfg = load_config(path)
        r = build_reward({"weighted": cfg.rewards})   # the items are {name, weight, kwargs}
        parts = r.parts if isinstance(r, WeightedReward) else [(r, 1.0)]
        short = [p for p, _ in parts if p.name in ("em", "f1", "cover_em", "llm_match")]
        assert short, path
        for p in short:
            # em needs no guard: it pays only an exact gold, which the guard never cuts
            if p.name != "em":
                assert p.guard.max_answer_tokens is not None and p.guard.candidates != "allow", (path, p.name)
            assert pays(p, "Paris, London, Berlin, Rome", ["Paris"]) <= 0.25
            assert pays(p, "Paris " + "is the capital of France " * 5, ["Paris"]) == 0.0
        checked += 1
    assert checked >= 3


def test_soft_match_guard_skips_the_judge(chat_server, tmp_path):
    from drgym.judges.openai import OpenAIJudge

    chat_server.responder = lambda body: '{"score": 1, "justification": "lenient"}'
    judge = OpenAIJudge("j", chat_server.url, cache=tmp_path / "c.sqlite", retry={"backoff_s": 0.0, "attempts": 1})
    eps = [ep("Paris, London, Berlin, Rome", ["Paris"]), ep("Paris " + "and more words " * 10, ["Paris"]), ep("the city of Paris", ["Paris"])]
    assert SoftMatch(judge).score(eps).scores == [1.0, 1.0, 1.0]          # a lenient judge pays every hack
    n = len(chat_server.requests)
    out = SoftMatch(judge, max_answer_tokens=10, candidates="zero").score(eps)
    assert out.scores == [0.0, 0.0, 1.0] and out.components["llm_match_guard"] == [0.0, 0.0, 1.0]
    assert len(chat_server.requests) == n      # the guarded hacks made no call; the third is cached
    # an empty or punctuation-only answer scores 0 with no call either
    assert SoftMatch(judge).score([ep("", ["Paris"]), ep("...", ["Paris"])]).scores == [0.0, 0.0]
    assert len(chat_server.requests) == n


def test_bench_rewards_script_runs_on_a_dev_slice(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_rewards", Path(__file__).resolve().parents[1] / "scripts" / "bench_rewards.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "b.json"
    assert bench.main(["--out", str(out), "--sets", "nq-open", "--limit", "30", "--no-search"]) == 0
    rec = json.loads(out.read_text())
    res = rec["results"]
    assert rec["n_questions"] == 30 and "passage_top1" not in res["em"]
    assert res["em"]["gold"]["mean"] == 1.0 and res["em"]["candidates_4"]["mean"] == 0.0
    assert res["cover_em"]["candidates_4"]["mean"] == 1.0                 # the hole, measured
    assert res["cover_em guarded"]["candidates_4"]["mean"] <= 0.25 + 1e-9   # one right among 4, at most
    assert res["format"]["punct"]["mean"] == 0.0 and res["format"]["wrong"]["mean"] == 1.0
