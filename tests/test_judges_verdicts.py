"""Verdict parsing on what judges actually write (issue 2.3, item 5).

Judges cite sources as ``[1]``, reasoning judges think before answering (and the chat
template may open the ``<think>`` block for them), and some correct themselves. For every
verdict model of :mod:`drgym.judges.prompts` the final verdict must win.
"""

from __future__ import annotations

import json

import pytest

from drgym.records import Task
from drgym.judges.base import JudgeOutputError, json_values, parse_verdict, strip_reasoning
from drgym.judges.openai import OpenAIJudge
from drgym.judges.prompts import (
    CitationSupportVerdict,
    ClaimExtraction,
    DimensionWeights,
    FactExtraction,
    FactValidation,
    GeneratedCriteria,
    KeyPointBatchVerdict,
    KeyPointExtraction,
    KeyPointMerge,
    KeyPointVerdict,
    QualityVerdict,
    RacePointVerdict,
    RaceVerdict,
    SoftMatchVerdict,
)
from drgym.rewards import Episode
from drgym.rewards.qa import SoftMatch


def _race(a1, a2):
    return {d: [{"criterion": f"{d} [1]", "analysis": "see [2]", "article_1_score": a1, "article_2_score": a2}]
            for d in ("comprehensiveness", "insight", "instruction_following", "readability")}


def _race_point(s):
    return {d: [{"criterion": f"{d} [1]", "analysis": "cites [3]", "target_score": s}]
            for d in ("comprehensiveness", "insight", "instruction_following", "readability")}


# model -> (a first guess, the final verdict); both valid, and different
CASES = {
    SoftMatchVerdict: ({"score": 0, "justification": "different"}, {"score": 1, "justification": "same city"}),
    KeyPointVerdict: ({"label": "Omitted"}, {"label": "Supported", "justification": "stated in [2]"}),
    KeyPointBatchVerdict: ({"labels": [{"point_number": 1, "label": "Omitted"}]},
                           {"labels": [{"point_number": 1, "label": "Supported"}, {"point_number": 2, "label": "Contradicted"}]}),
    KeyPointExtraction: ({"points": [{"point_number": 1, "point_content": "draft"}]},
                         {"points": [{"point_number": 1, "point_content": "Paris is the capital [1]", "spans": ["capital [1]"]}]}),
    KeyPointMerge: ({"points": [{"point_number": 1, "point_content": "draft"}]},
                    {"points": [{"point_number": 1, "point_content": "merged", "original_point_number": [1, 4]}]}),
    ClaimExtraction: ({"claims": []},
                      {"claims": [{"claim": "Paris is the capital [1]", "sources": ["https://en.wikipedia.org/wiki/Paris"]}]}),
    CitationSupportVerdict: ({"support": "no_support"}, {"support": "partial_support", "justification": "[1] backs half"}),
    QualityVerdict: ({"score": 2}, {"score": 7, "justification": "cites [1]-[4]"}),
    RaceVerdict: (_race(1, 9), _race(8, 6)),
    RacePointVerdict: (_race_point(2), _race_point(7.5)),
    DimensionWeights: ({"comprehensiveness": 0.25, "insight": 0.25, "instruction_following": 0.25, "readability": 0.25},
                       {"comprehensiveness": 0.3, "insight": 0.35, "instruction_following": 0.2, "readability": 0.15}),
    GeneratedCriteria: ({"criteria": [{"criterion": "draft", "weight": 1}]},
                        {"criteria": [{"criterion": "Cites sources [n]", "explanation": "e.g. [1]", "weight": 0.5},
                                      {"criterion": "Coverage", "weight": 0.5}]}),
    FactExtraction: ({"citations": []}, {"citations": [{"fact": "Paris is the capital [1]", "ref_idx": 1, "url": "https://x.org/p"}]}),
    FactValidation: ({"results": [{"idx": 1, "result": "unknown"}]}, {"results": [{"idx": 1, "result": "supported"}]}),
}


def _layouts(guess: str, final: str) -> dict[str, str]:
    return {
        "citation markers before": f"The report says so in [1] and [2, 3], see [3†L10]. {final}",
        "markers after": f"```json\n{final}\n```\nSources: [1] [2]",
        "think block with a first guess": f"<think>First guess {guess}; but [1] says otherwise.</think>\n{final}",
        "template-opened think": f"Checking [1]... first guess {guess}, no.</think>\n\n{final}",
        "nested think": f"<think>a <think>b {guess}</think> c {guess}</think> {final}",
        "thinking tag, upper case": f"<THINKING>{guess}</THINKING>{final}",
        "self-correction": f"Verdict: {guess}. Correction after re-reading [1]: {final}",
        "bare empty list after": f"{final} (no further sources: [])",
    }


@pytest.mark.parametrize("model", list(CASES), ids=lambda m: m.__name__)
def test_final_verdict_wins_for_every_verdict_model(model):
    guess, final = CASES[model]
    want = model.model_validate(final)
    assert want != model.model_validate(guess)
    g, f = json.dumps(guess), json.dumps(final)
    for name, text in _layouts(g, f).items():
        assert parse_verdict(text, model) == want, name
    # reasoning cut off before any verdict: a failure (retried, then counted), never the guess
    with pytest.raises(JudgeOutputError, match="outside the reasoning block"):
        parse_verdict(f"<think>so far {g} and {f}", model)
    with pytest.raises(JudgeOutputError, match="outside the reasoning block"):
        parse_verdict(f"{g}</think>", model)


def test_the_two_replies_of_the_issue():
    r1 = 'The prediction names Paris, as in source [1]. {"score": 1, "justification": "same city"}'
    r2 = '<think>First guess {"score": 0}; but the prediction does name Paris.</think>\n{"score": 1, "justification": "Paris"}'
    assert parse_verdict(r1, SoftMatchVerdict).score == 1.0
    assert parse_verdict(r2, SoftMatchVerdict).score == 1.0


def test_issue_replies_through_a_judge_score_one_without_failures(chat_server, tmp_path):
    replies = iter([
        'The prediction names Paris, as in source [1]. {"score": 1, "justification": "same city"}',
        '<think>First guess {"score": 0}; but the prediction does name Paris.</think>\n{"score": 1, "justification": "Paris"}',
    ])
    chat_server.responder = lambda body: next(replies)
    judge = OpenAIJudge("j", chat_server.url, cache=False, retry={"backoff_s": 0.0, "attempts": 1}, max_concurrency=1)
    eps = [Episode(Task("a", "Capital of France?", ["Paris"]), "the city of Paris"),
           Episode(Task("b", "Capital of France?", ["Paris"]), "Paris, the French capital")]
    out = SoftMatch(judge).score(eps)
    assert out.scores == [1.0, 1.0] and out.failures == 0
    assert len(chat_server.requests) == 2 and judge.stats["failures"] == 0


def test_what_still_fails():
    # a citation marker alone is not a verdict
    with pytest.raises(JudgeOutputError, match="no JSON object"):
        parse_verdict("As in source [1].", SoftMatchVerdict)
    with pytest.raises(JudgeOutputError, match="score"):
        parse_verdict('see [1] {"score": 3}', SoftMatchVerdict)          # out of range: names the field
    with pytest.raises(JudgeOutputError, match="points"):
        parse_verdict("points [1] and [2]", KeyPointExtraction)           # lists of ints are not points
    with pytest.raises(JudgeOutputError, match="empty"):
        parse_verdict("  ", SoftMatchVerdict)
    # a bare list is still accepted for a one-list verdict when no object is given
    assert parse_verdict('[{"idx": 1, "result": "Supported"}]', FactValidation).results[0].result == "supported"


def test_strip_reasoning_and_json_values_units():
    assert strip_reasoning("no tags {}") == "no tags {}"
    assert strip_reasoning("<think>x</think>A<think>y</think>B").replace(" ", "") == "AB"
    assert strip_reasoning("A <reasoning>x") == "A "
    assert strip_reasoning("x </think> y </think> z") == " z"
    assert json_values('{"a": {"b": 1}} [1, 2] {bad} "s" {"c": 2}') == [{"a": {"b": 1}}, [1, 2], {"c": 2}]
    assert json_values("none here") == []


def test_cached_verdicts_are_reparsed_from_their_raw_text(tmp_path):
    from drgym.judges.base import Judge
    from drgym.judges.cache import VerdictCache
    from drgym.judges.prompts import SOFT_MATCH

    class Fixed(Judge):
        model_id = "fixed:j"

        def complete(self, messages, **kw):
            return '<think>{"score": 0}</think>{"score": 1}'

    cache = VerdictCache(tmp_path / "c.sqlite")
    j = Fixed(cache=cache, retry={"backoff_s": 0.0})
    inputs = {"question": "q", "golds": "Paris", "prediction": "the city of Paris", "scale": ""}
    assert j.judge(SOFT_MATCH, **inputs).verdict.score == 1.0
    # a verdict an older parser stored (the first guess) is corrected from the stored raw text
    key = j.cache_key(SOFT_MATCH, SOFT_MATCH.render(**inputs), 0)
    cache.put(key, model=j.model_id, template=SOFT_MATCH.tag, verdict={"score": 0.0, "justification": ""},
              raw='<think>{"score": 0}</think>{"score": 1}')
    res = j.judge(SOFT_MATCH, **inputs)
    assert res.cached == 1 and res.attempts == 0 and res.verdict.score == 1.0
