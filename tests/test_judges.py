"""Judge interface, JSON parsing, verdict cache, and the OpenAI-compatible client on loopback."""

from __future__ import annotations

import json
import threading

import pytest

from drgym.errors import AuthError, ConfigError
from drgym.judges.base import (
    JudgeOutputError,
    JudgeRequest,
    extract_json,
    parse_verdict,
)
from drgym.judges.cache import VerdictCache
from drgym.judges.factory import make_judge
from drgym.judges.openai import OpenAIJudge
from drgym.judges.prompts import KPR, QUALITY, KeyPointVerdict, QualityVerdict


def test_extract_json_variants():
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('Sure! ```json\n{"label": "Supported"}\n``` done') == {"label": "Supported"}
    assert extract_json('The verdict is {"score": 7, "justification": "ok"} as requested.') == {"score": 7, "justification": "ok"}
    # a broken brace first, then a good object
    assert extract_json('{oops} then {"x": [1, 2]}') == {"x": [1, 2]}
    for bad in ["", "I cannot help with that.", '{"label": "Supported"', "   "]:
        with pytest.raises(JudgeOutputError):
            extract_json(bad)


def test_parse_verdict_validation_and_label_normalisation():
    assert parse_verdict('{"label": "supported"}', KeyPointVerdict).label == "Supported"
    assert parse_verdict('{"label": " CONTRADICTED "}', KeyPointVerdict).label == "Contradicted"
    with pytest.raises(JudgeOutputError, match="label"):
        parse_verdict('{"justification": "no label"}', KeyPointVerdict)
    with pytest.raises(JudgeOutputError, match="label"):
        parse_verdict('{"label": "Maybe"}', KeyPointVerdict)
    with pytest.raises(JudgeOutputError, match="score"):
        parse_verdict('{"score": 11}', QualityVerdict)  # out of the 0-10 range


def test_template_render_and_missing_input():
    msgs = KPR.render(key_point="Paris is in France.", report="A report.")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "Paris is in France." in msgs[1]["content"] and "A report." in msgs[1]["content"]
    assert KPR.tag == "kpr@1"
    with pytest.raises(ConfigError, match="report"):
        KPR.render(key_point="x")


def test_make_judge_specs(monkeypatch):
    monkeypatch.delenv("DRGYM_JUDGE_MODEL", raising=False)
    j = make_judge("openai:gpt-4.1-mini@http://127.0.0.1:9/v1", cache=False)
    assert isinstance(j, OpenAIJudge) and j.model == "gpt-4.1-mini" and j.base_url == "http://127.0.0.1:9/v1"
    assert j.model_id == "openai:gpt-4.1-mini"
    monkeypatch.setenv("DRGYM_JUDGE_BASE_URL", "http://127.0.0.1:8/v1")
    assert make_judge("openai:m", cache=False).base_url == "http://127.0.0.1:8/v1"
    with pytest.raises(ConfigError, match="model"):
        make_judge("openai", cache=False)
    with pytest.raises(ConfigError, match="Unknown judge backend"):
        make_judge("vllm:foo", cache=False)
    hf = make_judge("hf:smollm2", cache=False)  # lazy: no model load here
    assert hf.model_id == "hf:smollm2" and hf._model is None


def test_verdict_cache_persists_across_instances(tmp_path):
    path = tmp_path / "c.sqlite"
    c = VerdictCache(path)
    c.put("k1", model="m", template="kpr@1", verdict={"label": "Supported"}, raw="{}")
    c.put("k1", model="m", template="kpr@1", verdict={"label": "Omitted"}, raw="{}")  # replace
    assert len(c) == 1
    c.close()
    c2 = VerdictCache(path)
    assert c2.get("k1")["verdict"] == {"label": "Omitted"}
    assert c2.get("nope") is None


def _kpr_judge(server, tmp_path, **kw):
    kw["retry"] = {"backoff_s": 0.0, **kw.get("retry", {})}
    kw.setdefault("cache", tmp_path / "v.sqlite")
    return OpenAIJudge("test-judge", server.url, **kw)


def test_openai_judge_ok_and_cached(chat_server, tmp_path):
    chat_server.responder = lambda body: '{"label": "Supported", "justification": "stated"}'
    j = _kpr_judge(chat_server, tmp_path)
    r = j.judge(KPR, key_point="kp", report="rep")
    assert r.ok and r.verdict.label == "Supported" and r.attempts == 1 and r.cached == 0
    body = chat_server.requests[0]
    assert body["model"] == "test-judge" and body["temperature"] == 0.0 and body["messages"][1]["role"] == "user"
    # rerun: served from the SQLite cache, no HTTP call, identical verdict
    j2 = _kpr_judge(chat_server, tmp_path)
    r2 = j2.judge(KPR, key_point="kp", report="rep")
    assert r2.ok and r2.cached == 1 and r2.attempts == 0 and r2.verdict == r.verdict
    assert len(chat_server.requests) == 1
    # another template version is another key
    assert j.cache_key(KPR, KPR.render(key_point="kp", report="rep"), 0) != j.cache_key(
        type(KPR)(**{**KPR.__dict__, "version": "2"}), KPR.render(key_point="kp", report="rep"), 0
    )


def test_openai_judge_retries_malformed_then_succeeds(chat_server, tmp_path):
    answers = iter(['{"label": "Supp', "I'm sorry, I can't do that.", '{"label": "Omitted"}'])
    chat_server.responder = lambda body: next(answers)
    j = _kpr_judge(chat_server, tmp_path)
    r = j.judge(KPR, key_point="kp", report="rep")
    assert r.ok and r.verdict.label == "Omitted" and r.attempts == 3
    assert j.stats["retries"] == 2 and j.stats["failures"] == 0


def test_openai_judge_records_failure_not_zero(chat_server, tmp_path):
    chat_server.responder = lambda body: '{"verdict": "yes"}'  # valid JSON, missing field, every time
    j = _kpr_judge(chat_server, tmp_path, retry={"attempts": 2})
    r = j.judge(KPR, key_point="kp", report="rep")
    assert not r.ok and r.verdict is None and "label" in r.error
    assert r.mean(lambda v: 1.0) is None  # never a silent 0
    assert j.stats["failures"] == 1 and len(chat_server.requests) == 2
    assert len(j.cache) == 0  # failures are not cached


def test_openai_judge_timeout_then_recovery(chat_server, tmp_path):
    """The first call is held by the server until the test lets it go; the judge gives it
    up at its 0.5 s timeout and its second call answers, all while the first is held (an
    order, not a duration: the same on a loaded machine)."""
    calls = {"n": 0}
    release, first_answered = threading.Event(), threading.Event()

    def responder(body):
        calls["n"] += 1
        if calls["n"] == 1:
            release.wait(60)
            first_answered.set()
            return '{"label": "Supported"}'
        return '{"label": "Contradicted"}'

    chat_server.responder = responder
    j = _kpr_judge(chat_server, tmp_path, retry={"timeout_s": 0.5})
    try:
        r = j.judge(KPR, key_point="kp", report="rep")
        assert not first_answered.is_set()  # the timed-out call was abandoned, not waited for
    finally:
        release.set()
    assert r.ok and r.verdict.label == "Contradicted" and r.attempts == 2


def test_openai_judge_timeout_every_time_is_a_failure(chat_server, tmp_path):
    chat_server.responder = lambda body: ("sleep", 0.6, '{"label": "Supported"}')
    j = _kpr_judge(chat_server, tmp_path, retry={"timeout_s": 0.2, "attempts": 2})
    r = j.judge(KPR, key_point="kp", report="rep")
    assert not r.ok and "timeout" in r.error


def test_openai_judge_http_errors(chat_server, tmp_path):
    seq = iter([(500, '{"detail": "boom"}'), (429, "slow down"), '{"score": 6}'])
    chat_server.responder = lambda body: next(seq)
    j = _kpr_judge(chat_server, tmp_path)
    r = j.judge(QUALITY, question="q", report="r", criterion="Clarity", description="d")
    assert r.ok and r.verdict.score == 6 and r.attempts == 3
    chat_server.responder = lambda body: (401, '{"detail": "bad key"}')
    with pytest.raises(AuthError):
        _kpr_judge(chat_server, tmp_path, cache=False).judge(KPR, key_point="x", report="y")


def test_judge_many_is_concurrent_and_ordered(chat_server, tmp_path):
    """The server answers no call before all 8 are in flight at once (a barrier): only
    concurrent calls can pass it, whatever the machine's speed."""
    all_in = threading.Barrier(8, timeout=60)
    in_flight = {"now": 0, "most": 0}
    lock = threading.Lock()

    def responder(body):
        kp = body["messages"][1]["content"].split("Key point: ")[1].split("\n")[0]
        label = "Supported" if int(kp) % 2 == 0 else "Omitted"
        with lock:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            all_in.wait()  # BrokenBarrierError (no answer: a failed verdict) unless all 8 came together
        finally:
            with lock:
                in_flight["now"] -= 1
        return json.dumps({"label": label})

    chat_server.responder = responder
    j = _kpr_judge(chat_server, tmp_path, max_concurrency=8)
    reqs = [JudgeRequest(KPR, {"key_point": str(i), "report": "r"}) for i in range(8)]
    res = j.judge_many(reqs)
    assert in_flight["most"] == 8 and len(chat_server.requests) == 8
    assert [r.verdict.label for r in res] == ["Supported" if i % 2 == 0 else "Omitted" for i in range(8)]


def test_n_samples_averaged(chat_server, tmp_path):
    scores = iter(["4", "8"])
    chat_server.responder = lambda body: '{"score": %s}' % next(scores)
    j = _kpr_judge(chat_server, tmp_path, n_samples=2, temperature=0.7)
    r = j.judge(QUALITY, question="q", report="r", criterion="Depth", description="d")
    assert r.ok and len(r.verdicts) == 2 and r.mean(lambda v: v.score) == 6.0
    assert [b["seed"] for b in chat_server.requests] == [0, 1]
