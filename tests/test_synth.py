"""drgym data synth: rules on real passages, verification in the env, the split by document."""

from __future__ import annotations

import gymnasium as gym
import pytest

from drgym.envs.prompts import shown_text
from drgym.records import Task
from drgym.rewards.qa import cover_exact_match, normalize_answer
from drgym.synth.pipeline import SynthSettings, doc_bucket, rules_generator, slice_of, synthesize
from drgym.synth.rules import lead_sentence, rule_questions
from drgym.types import Document


def _doc(title: str, text: str, **meta) -> Document:
    return Document(f"t-{title}", f"https://en.wikipedia.org/wiki/{title}", title, text, "test", meta)


def test_rules_on_real_leads():
    """Real Wikipedia leads of the shipped corpus give the questions and answers a person would write."""
    from drgym.corpus.named import load_named_corpus

    docs = {d.title: d for d in load_named_corpus("wiki-default")}

    def qs(title):
        return {c.question: c.answers for c in rule_questions(docs[title])}

    assert qs("Eduardo De Filippo") == {"When was Eduardo De Filippo born?": ("24 May 1900", "1900"),
                                        "When did Eduardo De Filippo die?": ("31 October 1984", "1984")}
    carly = qs("Carly Rae Jepsen")
    assert carly["When was Carly Rae Jepsen born?"] == ("November 21, 1985", "1985")
    assert carly["What nationality is Carly Rae Jepsen?"] == ("Canadian",)
    assert carly["Who is a Canadian singer, songwriter, and actress?"] == ("Carly Rae Jepsen",)
    assert qs("Cape Town")["Cape Town is the capital of which country or region?"] == ("South Africa",)
    assert qs("Tetris")["Who created Tetris?"] == ("Alexey Pajitnov",)
    assert qs("Forbidden Ground (2013 film)")["In what year was the film Forbidden Ground released?"] == ("2013",)
    assert qs("Enterprise Holdings")["Where is Enterprise Holdings headquartered?"] == ("Clayton, Missouri",
                                                                                        "Clayton", "Missouri")
    # no rule guesses: a lead that does not start with its title ("A hat is ...") writes only what
    # needs no subject, here nothing; nor does a passage cut mid-text (wiki-18's "Sloothby")
    assert qs("Hat") == {} and qs("Sloothby") == {}


def test_answers_are_never_in_their_questions_and_short():
    from drgym.corpus.named import read_part

    cands = rules_generator(read_part("hotpotqa"))
    assert len(cands) > 300
    for c in cands:
        assert 1 <= len(c.answers[0].split()) <= 10, c
        assert not c.answers[0].endswith(" V") and c.answers[0] != "U"


def test_lead_sentence_keeps_initials_apart():
    assert lead_sentence("Cape Town is the capital. It is big.") == "Cape Town is the capital."


def _factory(backend, top_k):
    probe = [Task(task_id="p", question="p", answers=["p"])]
    return lambda: gym.make("drgym/SearchQA-v0", backend=backend, tasks=probe, top_k=top_k,
                            max_obs_tokens=150, max_searches=2, max_fetches=0, max_turns=3).unwrapped


def _direct_in_view(backend, top_k, question, answers) -> bool:
    env = _factory(backend, top_k)()
    env.reset(options={"task": Task(task_id="x", question=question, answers=list(answers))})
    obs, *_ = env.step(f"<search>{question}</search>")
    return bool(cover_exact_match(shown_text(obs), list(answers)))


def test_a_question_is_kept_only_when_the_env_shows_its_answer(bm25_backend):
    """Every candidate is kept exactly when a fresh env at the same settings shows a gold alias
    for the question as the query; fewer are kept at top_k=1 than at top_k=3."""
    docs = bm25_backend.docs[:250]
    settings = SynthSettings(test_frac=0.0, dev_frac=0.0, max_per_answer=1000, batch=16)
    kept = {}
    for top_k in (1, 3):
        res = synthesize(docs, rules_generator, _factory(bm25_backend, top_k), settings=settings)
        kept[top_k] = {t.question for t in res.slices["train"]}
        st = res.record["stages"]
        assert st["in_view"] == len(kept[top_k]) and st["dropped_not_in_view"] > 0
        assert st["checked"] == st["in_view"] + st["dropped_not_in_view"] + st["verify_failed"]
    cands = {c.question: c for c in rules_generator(docs)}
    checked = 0
    for q, c in cands.items():
        if cover_exact_match(q, list(c.answers)):
            continue  # dropped before verification (answer in question)
        for top_k in (1, 3):
            assert (q in kept[top_k]) == _direct_in_view(bm25_backend, top_k, q, c.answers), (top_k, q)
        checked += 1
    assert checked > 100
    assert kept[1] < kept[3]


def test_split_by_document_and_held_out_documents(bm25_backend):
    docs = bm25_backend.docs[:400]
    held = {docs[0].doc_id, docs[1].doc_id, docs[2].doc_id}
    settings = SynthSettings(test_frac=0.3, dev_frac=0.1, max_per_answer=1000, batch=16)
    res = synthesize(docs, rules_generator, _factory(bm25_backend, 3), settings=settings, held_out_docs=held,
                     held_out_questions=["When was Arthur's Magazine started?"])
    by_slice = {n: {t.gold_docs[0] for t in rows} for n, rows in res.slices.items()}
    assert all(by_slice.values())
    assert not (by_slice["train"] & by_slice["test"]) and not (by_slice["train"] & by_slice["dev"])
    assert not (by_slice["dev"] & by_slice["test"])
    assert not held & set().union(*by_slice.values())
    assert res.record["stages"]["dropped_held_out_document"] > 0
    for n, rows in res.slices.items():
        assert all(slice_of(t.gold_docs[0], settings) == n for t in rows)
        assert len({normalize_answer(t.question) for t in rows}) == len(rows)
    assert doc_bucket("a", 1) != doc_bucket("a", 2)


def test_answer_cap():
    settings = SynthSettings(max_per_answer=3)
    assert settings.max_per_answer == 3
    with pytest.raises(Exception, match="test_frac"):
        SynthSettings(test_frac=0.7, dev_frac=0.5)


def test_shipped_synthetic_sets():
    """The shipped sets: >= 5,000 distinct training questions, >= 400 test questions, and no
    evidence document shared between train and test."""
    from drgym.envs.task_loaders import load_tasks

    train, test, dev = load_tasks("synth-train"), load_tasks("synth-test"), load_tasks("synth-dev")
    demo = load_tasks("synth-demo")
    assert len(demo) >= 20
    assert len(test) >= 400
    breadth = load_tasks("breadth-train")
    assert len({normalize_answer(t.question) for t in breadth}) == len(breadth) >= 5000
    tr_docs = {t.gold_docs[0] for t in train}
    assert not tr_docs & {t.gold_docs[0] for t in test}
    assert not tr_docs & {t.gold_docs[0] for t in dev}
    demo_docs = {t.gold_docs[0] for t in demo}
    assert not demo_docs & (tr_docs | {t.gold_docs[0] for t in dev + test})
    for t in train[:500] + test:
        assert not cover_exact_match(t.question, t.answers)
    counts = {}
    for t in train + dev + test + demo:
        k = normalize_answer(t.answers[0])
        counts[k] = counts.get(k, 0) + 1
    assert max(counts.values()) <= 3
