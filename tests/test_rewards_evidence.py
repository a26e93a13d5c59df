"""The evidence_recall shaping reward on real retrieved passages."""

from __future__ import annotations

import pytest


def test_evidence_recall_on_a_real_observation_and_through_the_registry():
    from drgym.records import Episode, Step, Task, Trajectory
    from drgym.rewards.registry import build_reward

    task = Task("nq", "who wrote the iliad", ["Homer"], metadata={"question_query_hit": True})
    obs = ("<information>Doc 1 (Title: Iliad, URL: https://en.wikipedia.org/wiki/Iliad) The Iliad is an ancient "
           "Greek epic poem in dactylic hexameter, traditionally attributed to Homer.</information>")
    cut = "<information>Doc 1 (Title: Iliad, URL: https://en.wikipedia.org/wiki/Iliad) The Iliad is an …</information>"
    full = [{"title": "Iliad", "text": "The Iliad is an ancient Greek epic poem, traditionally attributed to Homer."}]
    seen = Trajectory("a", "nq", steps=[Step("<search> iliad </search>", observation=obs, results=full)])
    trunc = Trajectory("b", "nq", steps=[Step("<search> iliad </search>", observation=cut, results=full)])
    homeric = Trajectory("c", "nq", steps=[Step("<search> x </search>", observation="Homeric Hymns were sung.")])
    eps = [Episode(task, "", seen), Episode(task, "", trunc), Episode(task, "", homeric)]
    assert build_reward("evidence_recall").score(eps).scores == [1.0, 0.0, 0.0]  # "Homeric" is not "Homer"
    assert build_reward({"evidence_recall": {"scope": "results"}}).score(eps).scores == [1.0, 1.0, 0.0]
    gain = build_reward({"evidence_recall": {"baseline": "question"}}).score(eps).scores
    assert gain == [0.0, -1.0, -1.0]
    w = build_reward({"weighted": {"f1": 1.0, "evidence_recall": 0.2}})
    out = w.score([Episode(task, "Homer", seen)])
    assert out.scores == [pytest.approx(1.2)]


def test_evidence_recall_rejects_bad_options():
    from drgym.errors import ConfigError
    from drgym.rewards.evidence import EvidenceRecall

    with pytest.raises(ConfigError, match="scope"):
        EvidenceRecall(scope="docs")
    with pytest.raises(ConfigError, match="baseline"):
        EvidenceRecall(baseline="rag")
