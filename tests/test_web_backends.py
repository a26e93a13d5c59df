"""Serper, Tavily and Brave backends, page fetching and cost accounting against a
loopback fake of each provider (tests/_fake_providers.py). No traffic leaves 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time

import pytest

from _fake_providers import API_KEY, PAGES, FakeProviders
from drgym.errors import AuthError, BackendUnavailableError, BadQueryError, DocumentNotFoundError
from drgym.search.accounting import MeteredBackend, latency_summary
from drgym.search.pages import PageFetcher, UnsupportedContentError
from drgym.search.retry import parse_retry_after
from drgym.search.web import BraveSearch, SerperSearch, TavilySearch

ROUTES = {"serper": "/serper/search", "tavily": "/tavily/search", "brave": "/brave/res/v1/web/search"}
CLASSES = {"serper": SerperSearch, "tavily": TavilySearch, "brave": BraveSearch}


@pytest.fixture
def fp():
    with FakeProviders() as f:
        yield f


def make(fp, provider, **kw):
    kw["retry"] = {"backoff_s": 0.01, "timeout_s": 2.0, **kw.get("retry", {})}
    kw.setdefault("fetch_allow_loopback", True)  # the fake's pages are on 127.0.0.1
    return CLASSES[provider](kw.pop("api_key", API_KEY), base_url=f"{fp.base}/{provider}", **kw)


@pytest.mark.parametrize("provider", ["serper", "tavily", "brave"])
def test_documented_request_and_result_mapping(fp, provider):
    with make(fp, provider) as b:
        res = b.search("  capital   of France ", k=3)
    # "capital" and "france" both occur only on the Paris page; Berlin has "capital",
    # the Eiffel page "France": ties are broken by slug, so paris, berlin, eiffel.
    assert [r.url for r in res] == [f"{fp.base}/pages/{s}" for s in ("paris", "berlin", "eiffel")]
    assert [r.rank for r in res] == [1, 2, 3]
    assert all(r.doc_id == r.url and r.source == provider for r in res)
    assert res[0].title == "Paris - capital of France"
    assert res[0].text == PAGES["paris"][1][:90]  # Brave's <strong> highlighting removed
    if provider == "tavily":
        assert [r.score for r in res] == [0.9, 0.8, 0.7]
    else:  # no provider score: 1/rank
        assert [r.score for r in res] == pytest.approx([1.0, 0.5, 1 / 3])
    (req,) = fp.requests
    assert req["path"] == ROUTES[provider]
    if provider == "serper":
        assert req["method"] == "POST" and req["headers"]["x-api-key"] == API_KEY
        assert json.loads(req["body"]) == {"q": "capital of France", "num": 3}
    elif provider == "tavily":
        assert req["method"] == "POST" and req["headers"]["authorization"] == f"Bearer {API_KEY}"
        body = json.loads(req["body"])
        assert body["query"] == "capital of France" and body["max_results"] == 3
    else:
        assert req["method"] == "GET" and req["headers"]["x-subscription-token"] == API_KEY
        assert req["query"] == {"q": ["capital of France"], "count": ["3"]}


def test_batch_and_empty_answer(fp):
    with make(fp, "brave") as b:
        out = b.search_batch(["Danube river Vienna", "xyzzy plugh"], k=5)
    # Brave omits "web" when nothing matched: an empty list, not an error.
    assert [r.url.rsplit("/", 1)[1] for r in out[0]] == ["danube", "nile"]
    assert out[1] == []
    assert fp.count(ROUTES["brave"]) == 2


@pytest.mark.parametrize("provider", ["serper", "tavily", "brave"])
def test_bad_key_is_a_clear_auth_error_without_retries(fp, provider):
    with make(fp, provider, api_key="wrong") as b:
        with pytest.raises(AuthError, match=CLASSES[provider].env_var):
            b.search("Paris", k=2)
    assert fp.count(ROUTES[provider]) == 1


def test_missing_key_names_env_var(monkeypatch):
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    with pytest.raises(AuthError, match="TAVILY_API_KEY"):
        TavilySearch(base_url="http://127.0.0.1:9")


def test_bad_query_rejected_before_any_request(fp):
    with make(fp, "serper") as b:
        with pytest.raises(BadQueryError, match="empty"):
            b.search("   ", k=3)
        with pytest.raises(BadQueryError, match="between 1 and 100"):
            b.search("Paris", k=101)
    assert fp.requests == []


def test_429_retry_after_is_honoured(fp):
    fp.plan(ROUTES["serper"], (429, {"Retry-After": "1"}, {"message": "Too many requests"}))
    with make(fp, "serper") as b:
        t0 = time.perf_counter()
        res = b.search("Nile river", k=2)
        waited = time.perf_counter() - t0
    assert [r.url.rsplit("/", 1)[1] for r in res] == ["nile", "danube"]
    assert fp.count(ROUTES["serper"]) == 2
    assert waited >= 1.0  # the server asked for 1 s; backoff alone would be ~0.01 s


def test_retry_after_beyond_cap_fails_fast(fp):
    fp.plan(ROUTES["brave"], (429, {"Retry-After": "3600"}, {"error": "rate limited"}))
    with make(fp, "brave", retry={"max_retry_after_s": 5}) as b:
        with pytest.raises(BackendUnavailableError, match="Retry-After 3600"):
            b.search("Paris", k=2)
    assert fp.count(ROUTES["brave"]) == 1


def test_5xx_retried_then_succeeds_or_gives_up(fp):
    fp.plan(ROUTES["tavily"], (500, {}, "oops"), (502, {}, "bad gateway"))
    with make(fp, "tavily", retry={"attempts": 3}) as b:
        assert [r.url.rsplit("/", 1)[1] for r in b.search("capital city", k=2)] == ["berlin", "paris"]
        assert fp.count(ROUTES["tavily"]) == 3
        fp.plan(ROUTES["tavily"], *[(503, {}, "down")] * 3)
        with pytest.raises(BackendUnavailableError, match=r"HTTP 503.*after 3 attempt"):
            b.search("Berlin", k=2)
    assert fp.count(ROUTES["tavily"]) == 6


def test_timeout_retried_then_clear_error(fp):
    fp.plan(ROUTES["serper"], (200, {}, {"organic": []}, 1.0), (200, {}, {"organic": []}, 1.0))
    with make(fp, "serper", retry={"timeout_s": 0.2, "attempts": 2}) as b:
        with pytest.raises(BackendUnavailableError, match="timed out"):
            b.search("Paris", k=2)
    assert fp.count(ROUTES["serper"]) == 2


def test_unreachable_host_is_backend_unavailable():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = SerperSearch(API_KEY, base_url=f"http://127.0.0.1:{port}", retry={"attempts": 2, "backoff_s": 0.01})
    with pytest.raises(BackendUnavailableError, match="could not reach"):
        b.search("Paris", k=1)
    b.close()


@pytest.mark.parametrize(
    "provider,body,match",
    [
        ("serper", "<html>Service temporarily unavailable</html>", "malformed JSON"),
        ("tavily", '{"results": [', "malformed JSON"),
        ("serper", {"organic": "nope"}, "expected 'organic' to be a list"),
        ("brave", {"web": {"results": {"a": 1}}}, "expected 'web.results' to be a list"),
        ("tavily", ["not", "an", "object"], "expected the response to be a dict"),
    ],
)
def test_malformed_answers_raise_clear_errors(fp, provider, body, match):
    fp.plan(ROUTES[provider], (200, {"Content-Type": "application/json"}, body))
    with make(fp, provider) as b:
        with pytest.raises(BackendUnavailableError, match=match):
            b.search("Paris", k=2)
    assert fp.count(ROUTES[provider]) == 1  # a malformed 200 is not retried


def test_parse_retry_after():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now=now) == pytest.approx(30.0)
    assert parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now=now) == 0.0


# -- page fetching ---------------------------------------------------------------------


def test_fetch_extracts_main_text_without_boilerplate(fp):
    with make(fp, "serper") as b:
        url = b.search("Eiffel Tower", k=1)[0].url
        doc = b.fetch(url)
    assert url.endswith("/pages/eiffel") and doc.url == url and doc.doc_id == url
    assert doc.title == "Eiffel Tower"
    assert "completed in 1889" in doc.text and "Gustave Eiffel" in doc.text
    for boiler in ("Cookie settings", "All rights reserved", "Log in"):
        assert boiler not in doc.text
    assert doc.metadata["content_type"] == "text/html" and doc.metadata["status"] == 200


def test_fetch_limits_and_errors(fp):
    f = PageFetcher(max_bytes=50_000, retry={"backoff_s": 0.01}, allow_loopback=True)
    big = f.fetch(f"{fp.base}/pages/huge")  # ~1.5 MB page
    assert big.metadata["truncated"] is True and big.metadata["bytes"] == 50_000
    assert big.text.startswith("Paragraph 0 of a very long page") and "Paragraph 19999" not in big.text
    assert f.fetch(f"{fp.base}/pages/plain.txt").text == "Just plain text, caf\u00e9."
    with pytest.raises(UnsupportedContentError, match="application/pdf"):
        f.fetch(f"{fp.base}/pages/doc.pdf")
    with pytest.raises(DocumentNotFoundError, match="404"):
        f.fetch(f"{fp.base}/pages/missing")
    with pytest.raises(BadQueryError, match="http"):
        f.fetch("file:///etc/passwd")
    fp.plan("/pages/paris", (503, {}, "busy"))
    assert "capital and most populous" in f.fetch(f"{fp.base}/pages/paris").text
    assert fp.count("/pages/paris") == 2
    f.close()


def test_tavily_raw_content_serves_fetch_without_download(fp):
    with make(fp, "tavily", include_raw_content=True) as b:
        url = b.search("Danube", k=1)[0].url
        doc = b.fetch(url)
    assert doc.text == PAGES["danube"][1]
    assert fp.count("/pages/danube") == 0


# -- accounting ------------------------------------------------------------------------


def test_metered_backend_counts_cost_and_errors(fp):
    b = MeteredBackend(make(fp, "serper", retry={"attempts": 1}))
    assert b.usage.price_per_search == 0.001 and b.deterministic is False
    b.search_batch(["Paris", "Berlin"], k=2)
    b.search("Nile", k=2)
    fp.plan(ROUTES["serper"], (500, {}, "err"))
    with pytest.raises(BackendUnavailableError):
        b.search("Danube", k=2)
    with pytest.raises(BadQueryError):  # rejected locally: not billed
        b.search("", k=2)
    b.fetch(f"{fp.base}/pages/nile")
    u = b.usage.to_dict()
    assert (u["searches"], u["fetches"], u["errors"]) == (4, 1, 1)
    assert u["cost_usd"] == pytest.approx(0.004)
    assert u["search_latency"]["n"] == 4 and u["search_latency"]["max_s"] < 2.0
    b.close()


def test_latency_summary_hand_checked():
    s = latency_summary([0.4, 0.1, 0.3, 0.2])
    assert s["mean_s"] == pytest.approx(0.25) and s["median_s"] == pytest.approx(0.25)
    assert s["p95_s"] == 0.4 and s["max_s"] == 0.4 and s["n"] == 4
    assert latency_summary([])["median_s"] is None
