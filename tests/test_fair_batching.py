"""Fair micro-batching and the byte-bounded result cache of the search server.

A gated fake engine (each ``search_batch`` call waits until the test lets it finish,
results computed from the query) makes the claims about scheduling, as orders and counts,
whatever the machine's speed: a one-query ``/search`` sent while a 4,096-query
``POST /retrieve`` is being served is searched in the next batch but one, not after the
last of the big request's 64 batches. Timings belong in ``scripts/bench_search.py``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from drgym.errors import DocumentNotFoundError
from drgym.search.base import SearchBackend
from drgym.search.wire import ServerSettings
from drgym.server.batching import LRUCache, MicroBatcher, entry_nbytes
from server_helpers import running_server
from drgym.types import SearchResult

N_DOCS = 500


class SlowFake(SearchBackend):
    """Deterministic fake engine: each query ranks ``N_DOCS`` synthetic passages by a hash of
    (query, passage); every ``search_batch`` call sleeps ``batch_s`` whatever its size."""

    name = "slow-fake"

    def __init__(self, batch_s: float = 0.06, text_chars: int = 40) -> None:
        self.batch_s, self.text_chars = batch_s, text_chars
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def ranking(self, query: str, k: int) -> list[SearchResult]:
        scored = sorted(((int.from_bytes(hashlib.blake2b(f"{query}|{i}".encode(), digest_size=4).digest(), "big"), i)
                         for i in range(N_DOCS)), reverse=True)[:k]
        return [SearchResult(f"d{i}", f"https://fake.test/{i}", f"Title {i}", (f"passage {i} " * 40)[: self.text_chars],
                             s / 2**32, r + 1) for r, (s, i) in enumerate(scored)]

    def search_batch(self, queries, k=10):
        with self.lock:
            self.calls.append(list(queries))
        time.sleep(self.batch_s)
        return [self.ranking(q, k) for q in queries]

    def fetch(self, url):
        raise DocumentNotFoundError(url)


def decode(s: str) -> dict:
    return json.loads(base64.b64decode(s))


HANG_S = 120
"""How long a gated test waits for the server before failing (a hang guard, not a speed
claim: on any machine the awaited event comes, only later on a slow one)."""


class GatedFake(SlowFake):
    """:class:`SlowFake` whose ``search_batch`` calls each wait for :meth:`release`, so a test
    decides how many batches run, and when, instead of the clock."""

    def __init__(self) -> None:
        super().__init__(batch_s=0.0)
        self.gate = threading.Semaphore(0)
        self.arrived = threading.Condition()
        self.finished: list[int] = []  # call numbers in the order their results went back

    def search_batch(self, queries, k=10):
        with self.arrived:
            self.calls.append(list(queries))
            n = len(self.calls) - 1
            self.arrived.notify_all()
        if not self.gate.acquire(timeout=HANG_S):
            raise RuntimeError(f"call {n} was never released")
        with self.arrived:
            self.finished.append(n)
        return [self.ranking(q, k) for q in queries]

    def wait_calls(self, n: int) -> None:
        """Block until ``n`` calls have arrived."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.calls) >= n, timeout=HANG_S), (len(self.calls), n)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()


def _wait_health(srv, pred) -> dict:
    """``/health``'s stats once ``pred(stats)`` holds (polled; fails after :data:`HANG_S`)."""
    deadline = time.monotonic() + HANG_S
    while True:
        stats = httpx.get(f"{srv.url}/health", timeout=HANG_S).json()["stats"]
        if pred(stats):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.01)


def test_one_query_is_not_stuck_behind_a_4096_query_request():
    """The one-query /search, sent while batch 6 of the big request's 64 is being searched,
    is searched right after batch 7: one batch of the big request between its arrival and
    its own (before fair batching it waited for all 58 left)."""
    fake = GatedFake()
    queries = [f"big batch question number {i}" for i in range(4096)]
    settings = ServerSettings(cache_mb=0, batch_window_ms=1, max_batch_size=64)
    small_q = "the evaluator's question"
    with running_server(fake, settings=settings) as srv, ThreadPoolExecutor(2) as pool:
        big = pool.submit(httpx.post, f"{srv.url}/retrieve", timeout=HANG_S,
                          json={"queries": queries, "topk": 3, "return_scores": True})
        fake.wait_calls(1)
        for n in range(1, 6):  # five batches of the big request done, the sixth being searched
            fake.release()
            fake.wait_calls(n + 1)
        _wait_health(srv, lambda st: st["waiting"] == 4096 - 6 * 64)
        small = pool.submit(httpx.get, f"{srv.url}/search", params={"query": small_q, "k": 5}, timeout=HANG_S)
        _wait_health(srv, lambda st: st["waiting"] == 4096 - 6 * 64 + 1)  # the small query is queued
        assert len(fake.calls) == 6 and not big.done() and not small.done()
        fake.release(2)  # the sixth big batch, then the next batch
        fake.wait_calls(8)
        assert fake.calls[7] == [small_q]  # searched at once: one big batch between
        fake.release()
        small = small.result()
        assert small.status_code == 200, small.text[:200]
        assert not big.done() and fake.finished == list(range(8))  # answered while 56 big batches wait
        fake.release(100)  # the rest of the big request
        r = big.result()
    served = list(fake.calls)
    assert r.status_code == 200, r.text[:200]
    expected_small = [h.doc_id for h in fake.ranking(small_q, 5)]
    assert [decode(s)["id"] for s in small.json()["results"]] == expected_small
    got = r.json()["result"]
    assert len(got) == 4096
    for i in list(range(0, 4096, 97)) + [4095]:  # a sample, in request order, exactly the direct ranking
        direct = fake.ranking(queries[i], 3)
        assert [h["document"]["id"] for h in got[i]] == [h.doc_id for h in direct]
        assert [h["score"] for h in got[i]] == [h.score for h in direct]
    # the big request was served in 64 batches of 64; the small query (another k and
    # collapse, so a call of its own) went between the seventh and the eighth
    assert len(served) == 65 and served.index([small_q]) == 7
    assert [q for c in served[:7] + served[8:] for q in c] == queries


def test_round_robin_order_and_results_match_direct_search():
    fake = SlowFake(batch_s=0.0)

    async def main():
        b = MicroBatcher(lambda qs, k, c: fake.search_batch(qs, k), window_ms=0, max_batch_size=4, cache_bytes=0)
        await b.start()
        try:
            big = [f"q{i}" for i in range(10)] + ["q3"]  # a repeat inside the request is searched once
            t_big = asyncio.create_task(b.search_many(big, 2))
            t_mid = asyncio.create_task(b.search_many(["m0", "m1", "m2"], 2))
            t_one = asyncio.create_task(b.search("s0", 2))
            t_other_k = asyncio.create_task(b.search("s0", 5))
            got = await asyncio.gather(t_big, t_mid, t_one, t_other_k)
        finally:
            await b.stop()
        return big, got

    big, (got_big, got_mid, got_one, got_k5) = asyncio.run(main())
    served = list(fake.calls)
    # all four requests were queued before the first batch: each gives one query in turn;
    # the oldest request then goes to the back; the k=5 request has its own call, in turn
    assert served == [["q0", "m0", "s0", "q1"], ["m1", "q2", "m2", "q3"], ["s0"],
                      ["q4", "q5", "q6", "q7"], ["q8", "q9"]], served
    assert got_big == fake.search_batch(big, 2) and got_big[3] == got_big[10]
    assert got_mid == fake.search_batch(["m0", "m1", "m2"], 2)
    assert got_one == fake.ranking("s0", 2) and got_k5 == fake.ranking("s0", 5)


class _Clock:
    """A ``time`` stand-in for :mod:`drgym.server.batching` whose ``perf_counter`` moves only
    when the test says, so the measured batch time (and so Retry-After) is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_per_request_bound_answers_429_with_retry_after(monkeypatch):
    import drgym.server.batching as batching

    clock = _Clock()
    monkeypatch.setattr(batching, "time", clock)

    class Timed(GatedFake):
        def search_batch(self, queries, k=10):
            out = super().search_batch(queries, k)
            clock.now += 0.5  # each batch "takes" 0.5 s on the batcher's clock
            return out

    fake = Timed()
    settings = ServerSettings(cache_mb=0, batch_window_ms=0, max_batch_size=2, max_request_pending=5)
    with running_server(fake, settings=settings) as srv, ThreadPoolExecutor(2) as pool:
        fake.release()
        assert httpx.get(f"{srv.url}/search", params={"query": "warm", "k": 1}, timeout=HANG_S).status_code == 200
        first = pool.submit(httpx.get, f"{srv.url}/search", params={"query": "busy", "k": 1}, timeout=HANG_S)
        fake.wait_calls(2)  # the worker is busy with it, nothing waits
        queued = pool.submit(httpx.post, f"{srv.url}/retrieve", timeout=HANG_S,
                             json={"queries": [f"w{i}" for i in range(5)], "topk": 1})  # 5 <= 5: taken
        _wait_health(srv, lambda st: st["waiting"] == 5)
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": [f"x{i}" for i in range(6)], "topk": 1},
                       timeout=HANG_S)
        assert r.status_code == 429, r.text
        assert "max_request_pending" in r.json()["detail"] and "6 queries" in r.json()["detail"]
        # 5 queries wait, 2 per batch of 0.5 s: ceil(3 * 0.5) = 2 s
        assert r.headers["retry-after"] == "2"
        fake.release(4)  # "busy", then w0-w4 in three batches
        assert first.result().status_code == 200 and queued.result().status_code == 200
        fake.release(100)
        # an idle server takes the same request
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": [f"x{i}" for i in range(6)], "topk": 1}, timeout=60)
        assert r.status_code == 200 and len(r.json()["result"]) == 6
        assert httpx.get(f"{srv.url}/health").json()["stats"]["rejected_overloaded"] == 6


def _entry(i: int, k: int = 20, chars: int = 2000) -> tuple[tuple, tuple]:
    hits = tuple(SearchResult(f"doc{i}-{j}", f"https://x.test/{i}/{j}", f"Title {i} {j}",
                              f"{i} {j} " + "w" * chars, 1.0 / (j + 1), j + 1, "wiki",
                              {"parent_doc_id": f"doc{i}", "method": "dense"}) for j in range(k))
    return (f"query number {i}", k, "passage"), hits


def test_cache_is_bounded_in_bytes_and_evicts_the_oldest():
    budget = 2 * 2**20
    c = LRUCache(max_bytes=budget)
    one = entry_nbytes(*_entry(0))
    assert 20 * 2000 < one < 20 * 2000 * 1.5  # about the text it holds
    keys = []
    for i in range(400):  # 400 entries of about 45 KB: about 9 times the budget
        key, value = _entry(i)
        c.put(key, value)
        keys.append(key)
        assert c.nbytes <= budget
    assert budget - one < c.nbytes <= budget
    kept = len(c)
    assert kept == budget // one or kept == budget // one - 1, (kept, one)
    assert all(k not in c for k in keys[: 400 - kept]) and all(k in c for k in keys[400 - kept:])
    assert c.evictions == 400 - kept
    assert c.get(keys[-1]) == _entry(399)[1]  # a hit returns the same results
    # an entry larger than the whole budget is not stored; the entry bound still applies
    small = LRUCache(max_bytes=10_000)
    small.put(*_entry(1))
    assert len(small) == 0 and small.nbytes == 0
    both = LRUCache(3, max_bytes=budget)
    for i in range(5):
        both.put(*_entry(i, k=1, chars=10))
    assert len(both) == 3 and _entry(1, k=1)[0] not in both


def test_cache_estimate_matches_traced_memory():
    c = LRUCache(max_bytes=1 << 40)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            c.put(*_entry(i, k=10, chars=500))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.8 < c.nbytes / held < 1.5, (c.nbytes, held)


def test_server_cache_hits_return_the_same_results_within_its_budget():
    fake = SlowFake(batch_s=0.0, text_chars=4000)
    settings = ServerSettings(cache_mb=0.5, batch_window_ms=0)  # about 6 entries of 20 x 4 KB
    queries = [f"cached question {i}" for i in range(30)]
    with running_server(fake, settings=settings) as srv:
        first = httpx.post(f"{srv.url}/retrieve", json={"queries": queries, "topk": 20}, timeout=60).json()
        n_calls = len(fake.calls)
        again = httpx.post(f"{srv.url}/retrieve", json={"queries": queries[-3:], "topk": 20}, timeout=60).json()
        stats = httpx.get(f"{srv.url}/health").json()["stats"]
    assert again["result"] == first["result"][-3:]
    assert len(fake.calls) == n_calls  # the latest entries were answered from the cache
    assert stats["cache_hits"] == 3 and 0 < stats["cache_bytes"] <= 0.5 * 2**20
    assert 3 <= stats["cache_entries"] < 30 and stats["cache_evictions"] == 30 - stats["cache_entries"]
    assert first["result"][0][0]["id"] == fake.ranking(queries[0], 20)[0].doc_id


@pytest.mark.slow
def test_fair_batching_on_the_real_small_index(hotpotqa_engine):
    """The same claim on the 994-paragraph HotpotQA index (an idle machine: under 1 s)."""
    queries = [f"who wrote the book number {i} about dice games" for i in range(4096)]
    with running_server(hotpotqa_engine, settings=ServerSettings(cache_mb=0)) as srv, ThreadPoolExecutor(1) as pool:
        big = pool.submit(httpx.post, f"{srv.url}/retrieve", timeout=600, json={"queries": queries, "topk": 3})
        time.sleep(1.0)
        t = time.monotonic()
        small = httpx.get(f"{srv.url}/search", params={"query": "Demon Dice collectible dice game", "k": 3},
                          timeout=600)
        small_s = time.monotonic() - t
        big_was_running = not big.done()
        got = big.result().json()["result"]
    assert big_was_running and small_s < 1.0, small_s
    assert [decode(s)["id"] for s in small.json()["results"]] == [
        h.doc_id for h in hotpotqa_engine.search("Demon Dice collectible dice game", 3)]
    sample = list(range(0, 4096, 511))
    direct = hotpotqa_engine.search_batch([queries[i] for i in sample], 3, collapse="passage")
    assert [[h["id"] for h in got[i]] for i in sample] == [[h.doc_id for h in d] for d in direct]
