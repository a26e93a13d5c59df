"""drgym's one retry loop (``drgym.search.retry.retrying``): backoff, jitter, the log line, and
the components that retry through it (a judge, the ``openai:`` policy, the HTTP search client).

Sleeps are recorded (``time.sleep`` replaced), never slept.
"""

from __future__ import annotations

import logging
import re
import time

import httpx
import pytest

from drgym.config import RetryPolicy
from drgym.search.retry import retrying

LINE = re.compile(r"^(?P<name>.+): attempt (?P<n>\d+) failed \((?P<err>.*)\); retrying in (?P<s>[0-9.e+-]+) s$")


@pytest.fixture
def sleeps(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    return waits


def _flaky(fails: int, exc=ConnectionError):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= fails:
            raise exc(f"boom {len(calls)}")
        return "ok"

    return fn, calls


def test_backoff_doubles_to_its_cap_with_jitter_and_one_log_line_per_retry(sleeps, caplog):
    policy = RetryPolicy(attempts=5, backoff_s=0.1, max_backoff_s=0.25)
    fn, calls = _flaky(4)
    with caplog.at_level(logging.WARNING, logger="drgym.search.retry"):
        assert retrying(policy, name="svc", retry_on=ConnectionError)(fn) == "ok"
    assert len(calls) == 5 and len(sleeps) == 4
    # 0.1, 0.2, then capped at 0.25, each plus up to backoff_s (0.1) of jitter
    for wait, base in zip(sleeps, (0.1, 0.2, 0.25, 0.25)):
        assert base <= wait <= base + 0.1
    assert len(set(sleeps)) == 4  # jittered: no two waits alike
    lines = [LINE.match(r.getMessage()) for r in caplog.records]
    assert all(lines) and [m["n"] for m in lines] == ["1", "2", "3", "4"]
    assert lines[0]["name"] == "svc" and lines[0]["err"] == "boom 1"
    assert [float(m["s"]) for m in lines] == pytest.approx(sleeps, abs=0.01)


def test_without_jitter_the_waits_are_the_backoff(sleeps):
    fn, _ = _flaky(3)
    retrying(RetryPolicy(attempts=4, backoff_s=0.1, max_backoff_s=0.15), name="x", retry_on=ConnectionError,
             jitter=False)(fn)
    assert sleeps == [0.1, 0.15, 0.15]


def test_the_last_failure_is_raised_and_others_are_not_retried(sleeps):
    fn, calls = _flaky(9)
    loop = retrying(RetryPolicy(attempts=3, backoff_s=0.0), name="x", retry_on=ConnectionError)
    with pytest.raises(ConnectionError, match="boom 3"):
        loop(fn)
    assert len(calls) == 3 and loop.statistics["attempt_number"] == 3 and sleeps == [0.0, 0.0]
    fn, calls = _flaky(9, exc=ValueError)
    with pytest.raises(ValueError, match="boom 1"):
        retrying(RetryPolicy(attempts=3), name="x", retry_on=lambda e: isinstance(e, ConnectionError))(fn)
    assert len(calls) == 1 and sleeps == [0.0, 0.0]
    with pytest.raises(ValueError, match="retry_on must be"):
        retrying(RetryPolicy(), name="x", retry_on=())


def test_a_failure_may_name_its_own_wait(sleeps):
    class Later(Exception):
        pass

    fn, _ = _flaky(2, exc=Later)
    retrying(RetryPolicy(attempts=3, backoff_s=0.5), name="x", retry_on=Later, wait_for=lambda e: 7.0)(fn)
    assert sleeps == [7.0, 7.0]


def test_a_judge_retries_through_the_one_loop(sleeps, caplog):
    from drgym.judges.base import Judge, JudgeTransportError
    from drgym.judges.prompts import SOFT_MATCH

    class Flaky(Judge):
        model_id = "flaky:j"
        n = 0

        def complete(self, messages, **kw):
            self.n += 1
            if self.n == 1:
                raise JudgeTransportError("HTTP 503")
            return '{"score": 1}'

    j = Flaky(cache=False, retry={"backoff_s": 0.2, "max_backoff_s": 1.0})
    with caplog.at_level(logging.WARNING, logger="drgym.search.retry"):
        res = j.judge(SOFT_MATCH, question="q", golds="Paris", prediction="Paris", scale="")
    assert res.verdict.score == 1.0 and res.attempts == 2
    assert len(sleeps) == 1 and 0.2 <= sleeps[0] <= 0.4  # backoff plus jitter (none before)
    m = LINE.match(caplog.records[0].getMessage())
    assert m and m["name"] == "judge flaky:j (soft_match@1)" and m["err"] == "HTTP 503"


def test_the_openai_policy_retries_through_the_one_loop(chat_server, sleeps, caplog, monkeypatch):
    from drgym.policies.factory import make_policy

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    answer = {"id": "c1", "object": "chat.completion", "model": "fake",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "<answer> x </answer>"},
                           "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    chat_server.handler = lambda body, n: (503, {"error": "busy"}) if n == 1 else (200, answer)
    pol = make_policy(f"openai:fake@{chat_server.url}", retry={"attempts": 3, "backoff_s": 0.5}, tools=False)
    try:
        with caplog.at_level(logging.WARNING, logger="drgym.search.retry"):
            assert pol.act([[{"role": "user", "content": "q"}]]) == ["<answer> x </answer>"]
    finally:
        pol.close()
    assert len(sleeps) == 1 and 0.5 <= sleeps[0] <= 1.0
    m = LINE.match(caplog.records[0].getMessage())
    assert m and m["name"] == f"policy endpoint {chat_server.url}" and "HTTP 503" in m["err"]


def test_the_http_search_client_retries_through_the_one_loop(sleeps, caplog):
    from drgym.search.retry import send_with_retries

    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(503, text="down") if len(seen) == 1 else httpx.Response(200, json={"ok": True})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client, \
            caplog.at_level(logging.WARNING, logger="drgym.search.retry"):
        r = send_with_retries(client, "GET", "http://search.test/q", backend="mysearch",
                              retry=RetryPolicy(attempts=2, backoff_s=0.3, max_backoff_s=5.0))
    assert r.json() == {"ok": True} and len(seen) == 2
    assert len(sleeps) == 1 and 0.3 <= sleeps[0] <= 0.6
    m = LINE.match(caplog.records[0].getMessage())
    assert m and m["name"] == "mysearch" and "HTTP 503" in m["err"]
