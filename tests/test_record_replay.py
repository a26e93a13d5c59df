"""Record/replay of searches and fetches (drgym.search.record) and the backend registry,
against the loopback fake providers; replay runs with the network switched off."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import datetime, timezone

import httpx
import pytest
from _fake_providers import API_KEY, FakeProviders
from drgym.envs.searchqa import SearchQAEnv

from drgym.errors import (
    AuthError,
    BackendUnavailableError,
    ConfigError,
    DocumentNotFoundError,
    ReplayMissError,
)
from drgym.records import Task
from drgym.search.record import RecordReplayBackend, RecordStore, normalize_query
from drgym.search.registry import make_backend, parse_backend_list, record_name


@pytest.fixture
def fp():
    with FakeProviders() as f:
        yield f


def recorder(fp, store, provider="serper", mode="record", **kw):
    kw.setdefault("fetch_allow_loopback", True)  # the fake's pages are on 127.0.0.1
    kw["retry"] = {"backoff_s": 0.01, **kw.get("retry", {})}
    return make_backend(provider, mode=mode, store=store, api_key=API_KEY, base_url=f"{fp.base}/{provider}", **kw)


def test_normalize_query():
    assert normalize_query("  capital \t of\nFrance  ") == "capital of France"
    assert normalize_query("Paris") != normalize_query("paris")  # case is kept


def test_record_then_replay_offline(fp, tmp_path, monkeypatch):
    db = tmp_path / "web.sqlite"
    rec = recorder(fp, db, "tavily")
    assert rec.deterministic is False and rec.name == "tavily"
    live = rec.search_batch(["capital of France", "Danube river"], k=3)
    page = rec.fetch(live[0][0].url)
    rec.close()
    assert fp.count("/tavily/search") == 2 and fp.count("/pages/paris") == 1

    monkeypatch.delenv("TAVILY_API_KEY", raising=False)  # replay needs no key...
    monkeypatch.setattr(httpx.Client, "send", lambda *a, **k: pytest.fail("replay used the network"))  # ...nor network
    rep = make_backend("tavily", mode="replay", store=db)
    assert rep.deterministic is True and rep.max_k == 20
    again = rep.search_batch([" capital  of France", "Danube\triver"], k=3)  # whitespace-normalised keys
    assert [[r.to_dict() for r in rs] for rs in again] == [[r.to_dict() for r in rs] for rs in live]
    assert rep.fetch(page.url).to_dict() == page.to_dict()
    assert (rep.hits, rep.misses, rep.live_calls) == (3, 0, 0)

    with pytest.raises(ReplayMissError, match=r"'Nile river'.*k=3"):
        rep.search("Nile river", k=3)
    with pytest.raises(ReplayMissError, match=r"recorded with k in \[3\], not k=5"):
        rep.search("capital of France", k=5)
    with pytest.raises(ReplayMissError, match="no recorded fetch"):
        rep.fetch(f"{fp.base}/pages/nile")
    assert rep.misses == 3
    rep.close()


def test_failures_are_recorded_and_replayed(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    rec = recorder(fp, db, "serper", retry={"attempts": 2}, fetch_any_url=True)  # fetches a URL no search returned
    fp.plan("/serper/search", (500, {}, "upstream down"), (500, {}, "upstream down"))
    with pytest.raises(BackendUnavailableError) as live_err:
        rec.search("capital of France", k=2)
    with pytest.raises(DocumentNotFoundError) as live_404:
        rec.fetch(f"{fp.base}/pages/missing")
    rec.close()
    rep = make_backend("serper", mode="replay", store=db)
    with pytest.raises(BackendUnavailableError) as rep_err:
        rep.search("capital of France", k=2)
    with pytest.raises(DocumentNotFoundError) as rep_404:
        rep.fetch(f"{fp.base}/pages/missing")
    assert type(rep_err.value) is type(live_err.value)
    assert str(rep_err.value) == str(live_err.value) and "HTTP 500" in str(rep_err.value)
    assert str(rep_404.value) == str(live_404.value)
    summary = RecordStore(db, readonly=True).summary()["serper"]
    assert (summary["searches"], summary["fetches"], summary["errors"]) == (1, 1, 2)


def test_auth_errors_are_not_recorded(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    rec = make_backend("brave", mode="record", store=db, api_key="wrong", base_url=f"{fp.base}/brave")
    with pytest.raises(AuthError, match="BRAVE_API_KEY"):
        rec.search("Paris", k=2)
    rec.close()
    assert RecordStore(db, readonly=True).summary() == {}


def test_cache_mode_calls_live_only_on_a_miss(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    cache = recorder(fp, db, "brave", mode="cache")
    first = cache.search("Eiffel Tower Paris", k=2)
    second = cache.search("Eiffel   Tower Paris", k=2)
    assert [r.to_dict() for r in first] == [r.to_dict() for r in second]
    assert fp.count("/brave/res/v1/web/search") == 1 and (cache.hits, cache.live_calls) == (1, 1)
    cache.close()


def test_timestamps_and_summary(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    before = datetime.now(timezone.utc)
    rec = recorder(fp, db, "serper")
    rec.search("Paris", k=1)
    rec.search("Berlin", k=1)
    rec.close()
    store = RecordStore(db, readonly=True)
    row = store.get_search("serper", "Paris", 1)
    seen = datetime.fromisoformat(row["recorded_at"])
    assert before <= seen <= datetime.now(timezone.utc)
    s = store.summary()["serper"]
    assert s["searches"] == 2 and s["first_recorded_at"] <= s["last_recorded_at"]
    assert 0 < s["search_latency_median_s"] < 2.0  # loopback: well under the 2 s timeout
    assert store.recorded_queries("serper") == [("Berlin", 1), ("Paris", 1)]
    with pytest.raises(ConfigError, match="read-only"):
        store.put_search("serper", "x", 1, [], None, 0.0)
    store.close()


def test_concurrent_recording_keeps_every_row(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    rec = recorder(fp, db, "serper")
    queries = [f"capital city {i}" for i in range(24)]
    threads = [threading.Thread(target=rec.search, args=(q, 2)) for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.close()
    with sqlite3.connect(db) as conn:  # a second reader sees complete, committed rows
        rows = conn.execute("SELECT query, results_json FROM searches").fetchall()
    assert sorted(q for q, _ in rows) == sorted(queries)
    assert all(r and r.startswith("[{") for _, r in rows)


def test_replay_of_a_missing_file_or_bad_mode(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        make_backend("serper", mode="replay", store=tmp_path / "none.sqlite")
    with pytest.raises(ConfigError, match="mode must be one of"):
        make_backend("serper", mode="playback", store=tmp_path / "x.sqlite")
    with pytest.raises(ConfigError, match="needs store"):
        make_backend("serper", mode="record")
    with pytest.raises(ConfigError, match="needs a live backend"):
        RecordReplayBackend(None, tmp_path / "x.sqlite", mode="record", name="serper")
    (tmp_path / "junk.sqlite").write_bytes(b"this is not a database, just some bytes" * 100)
    with pytest.raises(ConfigError, match="not a drgym recording"):
        make_backend("serper", mode="replay", store=tmp_path / "junk.sqlite")


def test_registry_names():
    assert record_name("serper") == "serper" and record_name("Tavily") == "tavily"
    assert record_name("local") == "local" and record_name("local:hotpotqa") == "local:hotpotqa"
    assert record_name("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    with pytest.raises(ConfigError, match="Did you mean 'serper'"):
        record_name("serpr")
    assert parse_backend_list("local, serper,tavily") == ["local", "serper", "tavily"]
    with pytest.raises(ConfigError, match="twice"):
        parse_backend_list("serper,SERPER")


def test_deepresearchgym_needs_its_key(monkeypatch, tmp_path):
    monkeypatch.delenv("DEEPRESEARCHGYM_API_KEY", raising=False)
    with pytest.raises(AuthError, match="DEEPRESEARCHGYM_API_KEY"):
        make_backend("deepresearchgym")
    rep = make_backend("deepresearchgym", mode="replay", store=_empty_store(tmp_path))
    with pytest.raises(ReplayMissError, match="'deepresearchgym'"):
        rep.search("why is the sky blue", k=3)


def _empty_store(tmp_path):
    p = tmp_path / "empty.sqlite"
    RecordStore(p).close()
    return p


# -- a whole rollout ---------------------------------------------------------------------

ACTIONS = [
    "<search> Eiffel Tower </search>",  # the provider fails on this one (recorded)
    "<search> capital of France </search>",
    "<fetch> {base}/pages/paris </fetch>",
    "<answer> Paris </answer>",
]


def _rollout(backend, base):
    env = SearchQAEnv(backend=backend, tasks=[Task("q1", "What is the capital of France?", ["Paris"])],
                      reward="f1", max_turns=5, max_searches=3, max_fetches=1)
    env.reset(seed=0)
    for a in ACTIONS:
        *_, term, trunc, _ = env.step(a.format(base=base))
        if term or trunc:
            break
    d = env.trajectory.to_dict()
    d["timings"] = {}
    for s in d["steps"]:
        s["latency_s"] = 0.0  # wall time differs between runs; everything else must not
    return d


def test_recorded_rollout_replays_identically_offline(fp, tmp_path, monkeypatch):
    db = tmp_path / "rollout.sqlite"
    rec = recorder(fp, db, "serper", retry={"attempts": 2})
    fp.plan("/serper/search", (500, {}, "boom"), (500, {}, "boom"))  # the first search fails twice
    recorded = _rollout(rec, fp.base)
    rec.close()
    assert recorded["reward"] == 1.0 and recorded["final_answer"].strip() == "Paris"
    errors = [s["error"] for s in recorded["steps"]]
    assert "HTTP 500" in errors[0] and errors[1] is None and errors[2] is None
    assert "Paris - capital of France" in recorded["steps"][1]["observation"]
    assert "Champ de Mars" in recorded["steps"][2]["observation"]

    monkeypatch.setattr(httpx.Client, "send", lambda *a, **k: pytest.fail("replay used the network"))
    replayed = _rollout(make_backend("serper", mode="replay", store=db), fp.base)
    assert replayed == recorded


def test_deepresearchgym_record_and_replay(fp, tmp_path, monkeypatch):
    """The 'deepresearchgym' spec speaks DeepResearchGym's wire format (x-api-key, base64
    ClueWeb22 records) through HTTPSearchClient; pointed at the loopback fake here."""
    monkeypatch.setenv("DEEPRESEARCHGYM_API_KEY", API_KEY)
    monkeypatch.setenv("DEEPRESEARCHGYM_BASE_URL", f"{fp.base}/drg")
    db = tmp_path / "drg.sqlite"
    rec = make_backend("deepresearchgym", mode="record", store=db, retry={"attempts": 1})
    live = rec.search("Danube river Vienna", k=2)
    rec.close()
    assert [r.url.rsplit("/", 1)[1] for r in live] == ["danube", "nile"]
    assert live[0].doc_id == "clueweb22-en0000-00-00000" and live[0].title == "Danube river"
    assert live[0].score == -5.0 and fp.requests[0]["headers"]["x-api-key"] == API_KEY
    monkeypatch.setattr(httpx.Client, "send", lambda *a, **k: pytest.fail("replay used the network"))
    rep = make_backend("deepresearchgym", mode="replay", store=db)
    assert [r.to_dict() for r in rep.search("Danube river  Vienna", k=2)] == [r.to_dict() for r in live]
    monkeypatch.undo()
    monkeypatch.setenv("DEEPRESEARCHGYM_API_KEY", "wrong")
    monkeypatch.setenv("DEEPRESEARCHGYM_BASE_URL", f"{fp.base}/drg")
    with pytest.raises(AuthError, match="Invalid or missing API Key"):
        make_backend("deepresearchgym", retry={"attempts": 1}).search("Danube", k=1)


def test_recording_command(fp, tmp_path):
    from typer.testing import CliRunner

    from drgym.cli import app

    db = tmp_path / "web.sqlite"
    rec = recorder(fp, db, "brave")
    rec.search("Paris", k=2)
    rec.fetch(f"{fp.base}/pages/paris")
    rec.close()
    res = CliRunner().invoke(app, ["recording", str(db)])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)["brave"]
    assert (s["searches"], s["fetches"], s["errors"]) == (1, 1, 0)
    assert CliRunner().invoke(app, ["recording", str(tmp_path / "none.sqlite")]).exit_code == 2


def test_closed_recording_is_one_file(fp, tmp_path):
    db = tmp_path / "web.sqlite"
    rec = recorder(fp, db, "serper")
    rec.search("Paris", k=1)
    assert (tmp_path / "web.sqlite-wal").exists()  # WAL while recording
    rec.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["web.sqlite"]
    moved = tmp_path / "copy" / "moved.sqlite"
    moved.parent.mkdir()
    db.rename(moved)
    assert make_backend("serper", mode="replay", store=moved).search("Paris", k=1)[0].url.endswith("/pages/eiffel")  # tie on "paris": slug order
