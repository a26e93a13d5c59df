"""Safe fetching for the web backends (server-side request forgery): loopback, private,
link-local... hosts are refused after DNS resolution and at every redirect hop, before any
connection; redirects, size and time are capped; web backends fetch only URLs their
searches returned; a refusal is the agent's observation.

Every server here listens on 127.0.0.1. An audit hook fails any socket connection to
another address while a test runs (so even a regression sends nothing elsewhere), and
records the connections made."""

from __future__ import annotations

import socket
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from _fake_providers import API_KEY, FakeProviders
from drgym.envs.searchqa import SearchQAEnv
from drgym.records import Task
from drgym.search.pages import FetchRefusedError, PageFetcher, address_refusal
from drgym.search.registry import make_backend
from drgym.search.web import SerperSearch, TavilySearch

# -- no connection leaves loopback ---------------------------------------------------------

_CONNECTS: list | None = None  # (address) of each socket.connect while `guarded()` runs
_HOOKED = False


def _hook(event: str, args: tuple) -> None:
    if _CONNECTS is None or event != "socket.connect":
        return
    address = args[1]
    host = address[0] if isinstance(address, tuple) else str(address)
    _CONNECTS.append(host)
    if host not in ("127.0.0.1", "::1"):
        raise ConnectionRefusedError(f"test guard: connection to {address!r} blocked (only loopback allowed)")


@contextmanager
def guarded():
    """Record every socket.connect of this process, and block those not to loopback
    (audit hooks cannot be removed: one is added once and switched by ``_CONNECTS``)."""
    global _CONNECTS, _HOOKED
    if not _HOOKED:
        sys.addaudithook(_hook)
        _HOOKED = True
    seen: list = []
    _CONNECTS = seen
    try:
        yield seen
    finally:
        _CONNECTS = None


# -- a loopback web with redirects, big and slow pages --------------------------------------

PAGE = "<html><head><title>{t}</title></head><body><article><h1>{t}</h1><p>{p}</p></article></body></html>"


class Web:
    """``with Web() as w``: ``w.url(path)``; ``w.paths`` lists the paths requested.

    Routes: ``/page/<name>`` an HTML page; ``/redirect?to=<url>`` 302 to ``url``;
    ``/status/<code>`` that status (429 with ``Retry-After: 3600``);
    ``/loop/<n>`` 302 to ``/loop/<n+1>``; ``/endless`` a body that never ends (chunked);
    ``/drip`` a chunk every 0.2 s, forever."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, headers, body=b""):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_GET(self):
                outer.paths.append(self.path)
                path, _, query = self.path.partition("?")
                try:
                    if path.startswith("/page/"):
                        name = path.removeprefix("/page/")
                        body = PAGE.format(t=f"Page {name}", p=f"The text of page {name}, reached on loopback.")
                        self._send(200, {"Content-Type": "text/html; charset=utf-8"}, body.encode())
                    elif path == "/redirect":
                        self._send(302, {"Location": query.removeprefix("to=")})
                    elif path.startswith("/status/"):
                        code = int(path.removeprefix("/status/"))
                        self._send(code, {"Content-Type": "text/plain", **({"Retry-After": "3600"} if code == 429 else {})},
                                   b"no")
                    elif path.startswith("/loop/"):
                        self._send(302, {"Location": f"/loop/{int(path.rsplit('/', 1)[1]) + 1}"})
                    elif path in ("/endless", "/drip"):
                        self.send_response(200)
                        self.send_header("Content-Type", "text/html")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        self._chunk(b"<html><body><article><p>")
                        while not outer.stop.is_set():
                            if path == "/drip":
                                self._chunk(b"slow words arriving one by one ")
                                time.sleep(0.2)
                            else:
                                self._chunk(b"endless words of an endless page " * 1000)
                    else:
                        self._send(404, {"Content-Type": "text/plain"}, b"not found")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: what the caps are for

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return self.base + path

    def __enter__(self) -> "Web":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def web():
    with Web() as w:
        yield w


@pytest.fixture
def fp():
    with FakeProviders() as f:
        yield f


# -- addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize("address,why", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.1.1", "private"), ("fc00::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("240.0.0.1", "private"), ("100.64.0.1", "not globally routable"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "link-local"),
    ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
    ("8.8.8.8", None), ("2606:4700::1111", None), ("::ffff:8.8.8.8", None),
])
def test_address_categories(address, why):
    assert address_refusal(address) == why


def test_allow_loopback_allows_only_loopback():
    assert address_refusal("127.0.0.1", allow_loopback=True) is None
    assert address_refusal("::1", allow_loopback=True) is None
    for other in ("10.0.0.1", "169.254.169.254", "0.0.0.0", "192.168.0.1"):
        assert address_refusal(other, allow_loopback=True) is not None


# -- refusals before any connection ------------------------------------------------------


def test_loopback_and_private_urls_are_refused_before_connecting(web):
    port = web.server.server_address[1]
    cases = {
        web.url("/page/a"): "127.0.0.1 (loopback address)",
        f"http://localhost:{port}/page/a": "localhost (127.0.0.1) (loopback address)",  # after DNS resolution
        f"http://2130706433:{port}/page/a": "(127.0.0.1) (loopback address)",  # 127.0.0.1 as one number
        f"http://[::1]:{port}/page/a": "::1 (loopback address)",
        f"http://0.0.0.0:{port}/page/a": "unspecified address",
        "http://169.254.169.254/latest/meta-data/": "link-local address",
        "http://10.0.0.1/admin": "private address",
        "https://192.168.1.1/": "private address",
        "http://[::ffff:10.0.0.1]/": "private address",
    }
    f = PageFetcher(retry={"backoff_s": 0.01})
    with guarded() as connects:
        for url, why in cases.items():
            with pytest.raises(FetchRefusedError, match="fetch refused") as e:
                f.fetch(url)
            assert why in str(e.value) and url in str(e.value), (url, str(e.value))
            assert e.value.reason == "address"
    f.close()
    assert connects == [] and web.paths == []  # nothing was sent anywhere


def test_redirect_is_followed_and_checked_at_every_hop(web, monkeypatch):
    f = PageFetcher(retry={"backoff_s": 0.01}, allow_loopback=True)
    with guarded() as connects:
        # a loopback page that 302-redirects to another loopback path: followed
        doc = f.fetch(web.url(f"/redirect?to={web.url('/page/b')}"))
        assert doc.url == web.url(f"/redirect?to={web.url('/page/b')}")
        assert doc.metadata["final_url"] == web.url("/page/b") and doc.metadata["redirects"] == [web.url("/page/b")]
        assert doc.title == "Page b" and "text of page b" in doc.text
        # ... relative Location too
        assert f.fetch(web.url("/redirect?to=/page/c")).metadata["final_url"] == web.url("/page/c")
        served = len(web.paths)

        # the first host is allowed (loopback, in this test), but each target is checked
        # by its own category before it is requested
        real_getaddrinfo = socket.getaddrinfo

        def fake_dns(host, *a, **k):
            if host == "intranet.example":
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 80))]
            return real_getaddrinfo(host, *a, **k)

        monkeypatch.setattr(socket, "getaddrinfo", fake_dns)
        for target, why in [("http://169.254.169.254/latest/meta-data/", "169.254.169.254 (link-local address)"),
                            ("http://10.0.0.1/admin", "10.0.0.1 (private address)"),
                            ("http://intranet.example/secrets", "intranet.example (10.1.2.3) (private address)"),
                            ("http://0.0.0.0/", "0.0.0.0 (unspecified address)")]:
            start = web.url(f"/redirect?to={target}")
            with pytest.raises(FetchRefusedError) as e:
                f.fetch(start)
            msg = str(e.value)
            assert why in msg and f"redirected from {start}" in msg, msg
        with pytest.raises(FetchRefusedError, match="not an http:// or https:// URL") as e:
            f.fetch(web.url("/redirect?to=file:///etc/passwd"))
        assert e.value.reason == "scheme"
    f.close()
    assert len(web.paths) == served + 5  # only the five first hops reached the server
    assert set(connects) == {"127.0.0.1"}  # no connection was attempted to any refused target


def test_dns_answer_that_changes_after_the_check_is_refused_at_connect(monkeypatch):
    """DNS rebinding: public when checked, loopback when connecting. The transport
    connects only to addresses it checked itself."""
    real_getaddrinfo = socket.getaddrinfo
    answers = iter(["93.184.216.34", "127.0.0.1", "127.0.0.1", "127.0.0.1"])

    def rebinding(host, port, *a, **k):
        if host == "rebind.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]
        return real_getaddrinfo(host, port, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    f = PageFetcher(retry={"backoff_s": 0.01, "attempts": 1})
    with guarded() as connects:
        with pytest.raises(FetchRefusedError, match=r"rebind.example \(127.0.0.1\) \(loopback address\)"):
            f.fetch("http://rebind.example/")
    f.close()
    assert connects == []


def test_redirect_cap(web):
    f = PageFetcher(retry={"backoff_s": 0.01}, allow_loopback=True, max_redirects=3)
    with pytest.raises(FetchRefusedError, match=r"redirected more than max_redirects=3 times \(last to .*/loop/4\)") as e:
        f.fetch(web.url("/loop/0"))
    assert e.value.reason == "redirects"
    assert web.paths == ["/loop/0", "/loop/1", "/loop/2", "/loop/3"]  # the 4th redirect is not followed
    f.close()


def test_size_cap_on_an_endless_body(web):
    f = PageFetcher(retry={"backoff_s": 0.01}, allow_loopback=True, max_bytes=200_000)
    doc = f.fetch(web.url("/endless"))
    # cut by the size cap (not by the time cap, which would end it otherwise), at the cap exactly
    assert doc.metadata["bytes"] == 200_000 and doc.metadata["truncated"] is True
    assert doc.metadata["cut_by"] == "max_bytes"
    assert doc.text.startswith("endless words of an endless page")
    f.close()


def test_time_cap_on_a_body_that_drips(web):
    """Each chunk comes well within the read timeout, so only a whole-fetch deadline ends it."""
    f = PageFetcher(retry={"backoff_s": 0.01, "timeout_s": 2.0}, allow_loopback=True, max_time_s=1.5)
    t0 = time.monotonic()
    doc = f.fetch(web.url("/drip"))
    took = time.monotonic() - t0
    assert took >= 1.5, took  # not before the deadline (an upper bound would measure the machine's load)
    assert doc.metadata["truncated"] is True and doc.metadata["cut_by"] == "max_time_s"
    assert "slow words arriving" in doc.text and doc.metadata["bytes"] < 2_000
    f.close()


def test_page_fetcher_rejects_a_client_that_follows_redirects():
    import httpx

    with httpx.Client(follow_redirects=True) as c, pytest.raises(ValueError, match="follow_redirects=False"):
        PageFetcher(client=c)


# -- web backends: only URLs seen in search results ----------------------------------------


def test_web_backend_fetches_only_urls_from_its_search_results(fp):
    b = SerperSearch(API_KEY, base_url=f"{fp.base}/serper", retry={"backoff_s": 0.01}, fetch_allow_loopback=True)
    paris = f"{fp.base}/pages/paris"
    with pytest.raises(FetchRefusedError, match="was not in any search result") as e:
        b.fetch(paris)
    assert e.value.reason == "not-in-results" and fp.count("/pages/paris") == 0
    urls = [r.url for r in b.search("capital of France", k=2)]
    assert urls == [paris, f"{fp.base}/pages/berlin"]
    assert "capital and most populous" in b.fetch(paris).text
    loose = b.fetch(f" {paris}/#History ")  # the same URL, written loosely: fetched as the result gave it
    assert loose.url == paris and "capital and most populous" in loose.text
    with pytest.raises(FetchRefusedError, match="was not in any search result"):
        b.fetch(f"{fp.base}/pages/nile")  # never returned
    b.close()
    assert fp.count("/pages/nile") == 0 and fp.count("/pages/paris") == 2

    opened = SerperSearch(API_KEY, base_url=f"{fp.base}/serper", fetch_any_url=True, fetch_allow_loopback=True)
    assert "Cairo lies on the Nile" in opened.fetch(f"{fp.base}/pages/nile").text  # the option opens it up
    opened.close()


def test_tavily_raw_content_follows_the_same_rule(fp):
    b = TavilySearch(API_KEY, base_url=f"{fp.base}/tavily", include_raw_content=True, fetch_allow_loopback=True)
    b.search("Danube", k=1)
    assert "second-longest river" in b.fetch(f"{fp.base}/pages/danube").text
    with pytest.raises(FetchRefusedError, match="was not in any search result"):
        b.fetch(f"{fp.base}/pages/paris")
    b.close()


def test_web_backend_default_refuses_loopback_result_pages(fp):
    """The reported case: a search result pointing at a loopback page. By default the
    page is not fetched, and the agent's observation says why."""
    b = SerperSearch(API_KEY, base_url=f"{fp.base}/serper", retry={"backoff_s": 0.01})
    env = SearchQAEnv(backend=b, tasks=[Task("q1", "What is the capital of France?", ["Paris"])],
                      reward="f1", max_turns=5, max_searches=2, max_fetches=3)
    env.reset(seed=0)
    with guarded() as connects:
        obs, *_ = env.step(f"<fetch> {fp.base}/pages/paris </fetch>")  # before any search: the env refuses it
        assert "That URL was not in this episode's search results" in obs
        obs, *_ = env.step("<search> capital of France </search>")
        assert f"{fp.base}/pages/paris" in obs
        obs, *_ = env.step(f"<fetch> {fp.base}/pages/paris </fetch>")
        assert "Fetch failed: FetchRefusedError: fetch refused:" in obs and "127.0.0.1 (loopback address)" in obs
        assert "Champ de Mars" not in obs
    steps = env.trajectory.to_dict()["steps"]
    assert "loopback address" in steps[2]["error"] and "Champ de Mars" not in str(steps[2]["results"])
    assert fp.count("/pages/paris") == 0 and set(connects) == {"127.0.0.1"}  # only the search API was called
    b.close()


def test_fetch_is_limited_to_this_episodes_results(fp):
    """A URL that an earlier episode's search returned is not fetched in a later episode
    that never searched it (the backend alone would allow it), and ``fetch_any_url`` lifts the rule."""
    b = SerperSearch(API_KEY, base_url=f"{fp.base}/serper", retry={"backoff_s": 0.01}, fetch_allow_loopback=True)
    env = SearchQAEnv(backend=b, tasks=[Task("q1", "What is the capital of France?", ["Paris"])],
                      reward="f1", max_turns=5, max_searches=2, max_fetches=3)
    paris = f"{fp.base}/pages/paris"
    env.reset(seed=0)
    env.step("<search> capital of France </search>")
    obs, *_ = env.step(f"<fetch> {paris}/#History </fetch>")  # this episode's result, written loosely
    assert "capital and most populous" in obs
    env.reset(seed=1)
    obs, *_ = env.step(f"<fetch> {paris} </fetch>")  # seen by the backend, not by this episode
    assert "That URL was not in this episode's search results" in obs and "capital and most populous" not in obs
    assert fp.count("/pages/paris") == 1
    b.close()
    opened = SerperSearch(API_KEY, base_url=f"{fp.base}/serper", fetch_any_url=True, fetch_allow_loopback=True)
    env = SearchQAEnv(backend=opened, tasks=[Task("q1", "Where does the Nile flow?", ["Egypt"])], reward="f1",
                      max_turns=5, max_searches=2, max_fetches=3)
    env.reset(seed=0)
    obs, *_ = env.step(f"<fetch> {fp.base}/pages/nile </fetch>")
    assert "Cairo lies on the Nile" in obs
    opened.close()


def test_cache_mode_lets_the_backend_fetch_urls_of_cached_searches(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    kw = dict(api_key=API_KEY, base_url=f"{fp.base}/brave", retry={"backoff_s": 0.01}, fetch_allow_loopback=True)
    first = make_backend("brave", mode="cache", store=db, **kw)
    url = first.search("Eiffel Tower", k=1)[0].url
    first.close()
    again = make_backend("brave", mode="cache", store=db, **kw)  # a new process: the search is a cache hit
    assert again.search("Eiffel Tower", k=1)[0].url == url and fp.count("/brave/res/v1/web/search") == 1
    assert "completed in 1889" in again.fetch(url).text
    again.close()


def test_refusals_are_recorded_and_replayed(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    rec = make_backend("serper", mode="record", store=db, api_key=API_KEY, base_url=f"{fp.base}/serper")
    rec.search("capital of France", k=1)
    with pytest.raises(FetchRefusedError) as live:
        rec.fetch(f"{fp.base}/pages/paris")  # in the results, but on loopback
    rec.close()
    rep = make_backend("serper", mode="replay", store=db)
    with pytest.raises(FetchRefusedError) as replayed:
        rep.fetch(f"{fp.base}/pages/paris")
    assert str(replayed.value) == str(live.value) and "loopback address" in str(live.value)
    rep.close()


# -- malformed URLs: page errors, nothing sent ---------------------------------------------

BAD_LOCATIONS = [
    ("http://[::1", "Invalid port"),  # httpx: InvalidURL (its own redirect handling: a RemoteProtocolError, retried)
    ("http://xn--/", "IDNAError"),  # a host that is no internationalised name
    ("http://" + "a" * 64 + ".example/", "not a valid host name"),  # a label over 63 characters (UnicodeError)
    ("http://a..b/", "not a valid host name"),  # an empty label
    ("http://%zz/", "not a host name nor an IP address"),
    ("http://a%20b/", "not a host name nor an IP address"),
    ("http://[fe80::1%25eth0]/", "not a host name nor an IP address"),  # an IPv6 zone: this machine's interface
    ("http://203.0.113.9:99999/", "port 99999 is outside 1..65535"),  # the resolver would wrap it to 34463
    ("http://203.0.113.9:0/", "port 0 is outside 1..65535"),
]


@pytest.mark.parametrize("location, why", BAD_LOCATIONS)
def test_malformed_redirect_is_a_page_error_sent_nowhere(web, location, why):
    """A page whose redirect is no valid URL is that page's error (``SearchError`` naming
    the page first: the agent's observation, not a backend failure), raised once: no retry,
    no connection to the target."""
    from drgym.errors import BackendUnavailableError, SearchError
    from drgym.evaluation.metrics import episode_failures

    start = web.url(f"/redirect?to={location}")
    f = PageFetcher(retry={"backoff_s": 0.01, "attempts": 3}, allow_loopback=True)
    with guarded() as connects:
        with pytest.raises(SearchError) as e:
            f.fetch(start)
    f.close()
    assert type(e.value) is SearchError and not isinstance(e.value, BackendUnavailableError)
    msg = str(e.value)
    assert msg.startswith(f"{start}: HTTP 302 redirect to an invalid URL") and why in msg, msg
    assert web.paths == [f"/redirect?to={location}"] and connects == ["127.0.0.1"]  # one request, then nothing
    step = {"error": f"Fetch failed: {type(e.value).__name__}: {msg}"}  # as the env records it
    assert episode_failures({"steps": [step]}) == []


def test_location_without_slashes_is_resolved_on_the_same_host(web):
    """``http:127.0.0.1:1/x`` (the reported case) is relative to the page, as browsers read
    it: the same server's path ``/127.0.0.1:1/x`` (a 404 here), never port 1."""
    from drgym.errors import DocumentNotFoundError

    f = PageFetcher(retry={"backoff_s": 0.01}, allow_loopback=True)
    start = web.url("/redirect?to=http:127.0.0.1:1/x")
    with guarded() as connects, pytest.raises(DocumentNotFoundError, match="HTTP 404"):
        f.fetch(start)
    f.close()
    assert web.paths == ["/redirect?to=http:127.0.0.1:1/x", "/127.0.0.1:1/x"]
    assert set(connects) == {"127.0.0.1"}


@pytest.mark.parametrize("url, why", [
    ("http://xn--/", "IDNAError"), ("http://a..b/", "not a valid host name"),
    ("http://" + "a" * 64 + ".example/", "not a valid host name"), ("http://203.0.113.9:99999/", "outside 1..65535"),
    ("http://[fe80::1%25eth0]/", "not a host name nor an IP address"), ("http://[::1", "Invalid IPv6 URL"),
])
def test_agents_own_malformed_url_is_a_bad_query_sent_nowhere(url, why):
    from drgym.errors import BadQueryError

    f = PageFetcher(retry={"backoff_s": 0.01})
    with guarded() as connects, pytest.raises(BadQueryError, match="fetch needs a valid URL") as e:
        f.fetch(url)
    f.close()
    assert why in str(e.value) and connects == []


def test_fact_reward_counts_a_page_with_a_malformed_redirect_as_unknown(web):
    """FACT scores a report whose cited page redirects to no valid URL: that URL's
    statements are unknown, the other URL's are judged."""
    import json

    from drgym.judges.base import Judge
    from drgym.records import Episode
    from drgym.rewards.fact import FactReward

    bad, good = web.url("/redirect?to=http://xn--/"), web.url("/page/a")
    prompts: list[str] = []

    class Fake(Judge):
        model_id = "openai:fake"

        def complete(self, messages, **kw):
            text = " ".join(str(m.get("content")) for m in messages)
            prompts.append(text)
            if "The text of page a" in text:
                return '{"results": [{"idx": 1, "result": "supported"}]}'
            return json.dumps({"citations": [{"fact": "A is 5.", "ref_idx": 1, "url": bad},
                                             {"fact": "B is 6.", "ref_idx": 2, "url": good}]})

    class Pages:  # a backend whose fetch is the page fetcher's
        fetcher = PageFetcher(retry={"backoff_s": 0.01}, allow_loopback=True)

        def fetch(self, url):
            return self.fetcher.fetch(url)

    r = FactReward(Fake(cache=False), Pages())
    (t,) = r.evaluate([Episode(Task("drb-1", "q", kind="research"), "A is 5 [1]. B is 6 [2].")])
    Pages.fetcher.close()
    assert t.results == {bad: ["unknown"], good: ["supported"]} and t.errors == {}
    assert len(prompts) == 2  # the extraction and one validation: the bad page was never judged


def test_a_page_that_refuses_fails_or_is_unreachable_is_a_page_error(web, monkeypatch):
    """401/403 from a page (the fetcher sends no credentials), 5xx after the retries, 429
    with a long Retry-After, a redirect to a closed port or to a name that does not
    resolve: each error names the page first, so an episode that met it is complete (a
    hostile page cannot make a run redo the episode forever)."""
    from drgym.errors import AuthError, BackendUnavailableError, SearchError
    from drgym.evaluation.metrics import episode_failures

    real_getaddrinfo = socket.getaddrinfo

    def no_such_name(host, *a, **k):
        if host == "gone.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}/x"  # bound, never listening: connection refused
    f = PageFetcher(retry={"backoff_s": 0.01, "attempts": 2}, allow_loopback=True)
    cases = [(web.url("/status/401"), SearchError, "HTTP 401 while fetching the page: the page refused access"),
             (web.url("/status/403"), SearchError, "HTTP 403 while fetching the page: the page refused access"),
             (web.url("/status/503"), BackendUnavailableError, "the page could not be fetched (fetch: HTTP 503"),
             (web.url("/status/429"), BackendUnavailableError, "wait longer than max_retry_after_s"),
             (web.url(f"/redirect?to={dead}"), BackendUnavailableError, f"(redirected to {dead}) (fetch: could not reach"),
             (web.url("/redirect?to=http://gone.example/"), BackendUnavailableError, "cannot resolve 'gone.example'")]
    with guarded() as connects:
        for url, cls, why in cases:
            with pytest.raises(SearchError) as e:
                f.fetch(url)
            assert type(e.value) is cls and not isinstance(e.value, AuthError), (url, repr(e.value))
            msg = str(e.value)
            assert msg.startswith(f"{url}: ") and why in msg, msg
            assert episode_failures({"steps": [{"error": f"Fetch failed: {type(e.value).__name__}: {msg}"}]}) == []
    f.close()
    closed.close()
    assert set(connects) == {"127.0.0.1"}
    assert web.paths.count("/status/503") == 2 and web.paths.count("/status/403") == 1  # 5xx retried, 403 not


@pytest.mark.parametrize("error", ["InvalidURL", "UnsupportedProtocol", "UnicodeError"])
def test_fact_reward_counts_a_backend_url_error_as_unknown(error):
    """A backend of another library that lets httpx's URL errors out: FACT still scores
    the report, the page's statements unknown (the run is not stopped)."""
    import json

    import httpx

    from drgym.judges.base import Judge
    from drgym.records import Episode
    from drgym.rewards.fact import FactReward

    class Fake(Judge):
        model_id = "openai:fake"

        def complete(self, messages, **kw):
            return json.dumps({"citations": [{"fact": "A is 5.", "ref_idx": 1, "url": "http:127.0.0.1:1/x"}]})

    class Raw:
        def fetch(self, url):
            raise {"InvalidURL": httpx.InvalidURL("For absolute URLs, path must be empty or begin with '/'"),
                   "UnsupportedProtocol": httpx.UnsupportedProtocol("Request URL has an unsupported protocol"),
                   "UnicodeError": UnicodeError("encoding with 'idna' codec failed (label too long)")}[error]

    (t,) = FactReward(Fake(cache=False), Raw()).evaluate([Episode(Task("drb-1", "q", kind="research"), "A is 5 [1].")])
    assert t.results == {"http:127.0.0.1:1/x": ["unknown"]} and t.errors == {}
