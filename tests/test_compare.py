"""`drgym compare`: the same policies over several backends, side by side.

The CI study: record a loopback fake Serper (answering with BM25 over the real HotpotQA
paragraphs that the local index also holds) into a temporary SQLite file, then compare
the local engine with the replayed recording, offline."""

from __future__ import annotations

import json

import httpx
import pytest
from _fake_providers import API_KEY, FakeProviders
from typer.testing import CliRunner

from drgym.evaluation.compare import (
    CompareRow,
    backend_mode,
    kendall_taus,
    parse_policy_entry,
    run_compare,
    write_report,
)

POLICIES = ["scripted", "scripted fetch=false"]
N = 8


def _row(policy, backend, f1, searches=10, cost=0.0):
    return CompareRow(policy=policy, backend=backend, mode="live",
                      metrics={"episodes": 10, "scores": {"f1": f1, "em": f1 / 2}, "answer_rate": 1.0,
                               "searches": 1.0, "fetches": 0.5},
                      usage={"searches": searches, "fetches": 5, "errors": 0, "cost_usd": cost,
                             "search_latency": {"median_s": 0.25, "p95_s": 0.5}},
                      billed_usd=cost)


def test_kendall_tau_hand_checked():
    rows = ([_row(p, "A", s) for p, s in zip("xyz", (0.1, 0.2, 0.3))]
            + [_row(p, "B", s) for p, s in zip("xyz", (0.3, 0.2, 0.1))]
            + [_row(p, "C", s) for p, s in zip("xyz", (0.1, 0.3, 0.2))]
            + [_row(p, "D", s) for p, s in zip("xyz", (0.2, 0.2, 0.2))])
    taus = {(t["a"], t["b"]): t for t in kendall_taus(rows, "f1")}
    assert taus[("A", "B")]["tau"] == pytest.approx(-1.0)  # order reversed
    # A vs C: pairs (x,y) and (x,z) concordant, (y,z) discordant: (2 - 1) / 3
    assert taus[("A", "C")]["tau"] == pytest.approx(1 / 3)
    assert taus[("A", "D")]["tau"] is None and taus[("A", "D")]["n_policies"] == 3  # all tied: undefined
    assert len(taus) == 6


def test_report_files(tmp_path):
    rows = [_row("p1", "local", 0.5), _row("p2", "local", 0.25), _row("p1", "serper", 0.4, cost=0.01),
            _row("p2", "serper", 0.3, cost=0.01)]
    res = write_report(rows, tmp_path, title="t")
    assert res["metric"] == "f1" and res["kendall_tau"][0]["tau"] == pytest.approx(1.0)
    md = (tmp_path / "compare.md").read_text()
    assert "| p1 | serper | live | 10 | 0.200 | 0.400 | 1.000 | 1.00 | 0.50 | 10 | 5 | 0 | 0.2500 | 0.5000 | 0.0100 | 0.0100 |" in md
    assert "| local | serper | 1.000 |" in md
    html = (tmp_path / "compare.html").read_text()
    assert html.count("<tr>") == 1 + 4 + 1 + 1 and "compare.png" in html
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "compare.json").read_text())["rows"][2]["backend"] == "serper"


def test_entry_parsing_and_modes():
    assert parse_policy_entry("scripted fetch=false") == ("scripted", {"fetch": False})
    assert parse_policy_entry("hf:smollm2 max_new_tokens=64") == ("hf:smollm2", {"max_new_tokens": 64})
    assert backend_mode("local:hotpotqa", replay="x", record=None) == "live"
    assert backend_mode("serper", replay="x", record=None) == "replay"
    assert backend_mode("tavily", replay=None, record="y") == "record"


# -- the CI study ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hotpot_web():
    """A fake Serper whose web is the HotpotQA paragraphs (BM25-ranked); slug = row index."""
    from envs_helpers import BM25Backend

    bm = BM25Backend("hotpotqa")
    slug = {d.url: str(i) for i, d in enumerate(bm.docs)}
    pages = {str(i): (d.title, d.text) for i, d in enumerate(bm.docs)}
    with FakeProviders(pages, lambda q, k: [slug[r.url] for r in bm.search(q, k)]) as fp:
        yield fp


def _episodes(run_dir):
    out = []
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        d = json.loads(line)
        steps = [{k: v for k, v in s.items() if k != "latency_s"} for s in d["steps"]]
        out.append((d["task_id"], d["final_answer"], d["reward_components"], steps, d["messages"]))
    return sorted(out, key=lambda e: e[0])


def test_compare_local_vs_replayed_recording(hotpot_web, hotpotqa_engine, tmp_path, monkeypatch):
    db = tmp_path / "serper.sqlite"
    monkeypatch.setenv("SERPER_API_KEY", API_KEY)
    monkeypatch.setenv("SERPER_BASE_URL", f"{hotpot_web.base}/serper")
    rec = run_compare(policies=POLICIES, tasks="hotpotqa-dev", backends=["serper"], n=N, out=tmp_path / "rec",
                      record=db, run_options={"batch_size": 4},
                      backend_options={"serper": {"fetch_allow_loopback": True}})  # the fake's pages are on 127.0.0.1
    assert hotpot_web.count("/serper/search") == 2 * N  # one search per episode, each recorded
    assert [r["billed_usd"] for r in rec["rows"]] == pytest.approx([N * 0.001, N * 0.001])

    # Offline from here: no key, and any HTTP request fails the test.
    monkeypatch.delenv("SERPER_API_KEY")
    monkeypatch.setattr(httpx.Client, "send", lambda *a, **k: pytest.fail("compare --replay used the network"))
    local = f"local:{hotpotqa_engine.folder}"
    out = tmp_path / "cmp"
    from drgym.cli import app

    res = CliRunner().invoke(app, ["compare", "--policy", POLICIES[0], "--policy", POLICIES[1], "--tasks", "hotpotqa-dev",
                                   "--backends", f"{local},serper", "--replay", str(db), "--n", str(N),
                                   "--out", str(out), "--local-method", "bm25", "--batch-size", "4"])
    assert res.exit_code == 0, res.output
    assert "| scripted | serper | replay | 8 |" in res.output
    result = json.loads((out / "compare.json").read_text())
    rows = {(r["policy"], r["mode"]): r for r in result["rows"]}
    assert len(rows) == 4
    for p in POLICIES:
        replayed, recorded = rows[(p, "replay")], next(r for r in rec["rows"] if r["policy"] == p)
        # the replayed run reproduces the recorded one exactly (wall times aside)
        assert replayed["metrics"]["scores"] == recorded["metrics"]["scores"]
        assert _episodes(out / "runs" / f"{p.replace(' ', '-').replace('=', '-')}__serper") == _episodes(
            tmp_path / "rec" / "runs" / f"{p.replace(' ', '-').replace('=', '-')}__serper")
        assert replayed["usage"]["errors"] == 0 and replayed["metrics"]["errors"] == 0
        assert replayed["usage"]["searches"] == N and replayed["usage"]["cost_usd"] == pytest.approx(N * 0.001)
        assert replayed["billed_usd"] == 0.0
        # both policies search the same N questions: N distinct recordings (the second run replaced the first)
        assert replayed["recorded"]["searches"] == N and replayed["recorded"]["fetches"] == N and replayed["recorded"]["first_recorded_at"]
        assert rows[(p, "live")]["backend"] == local and rows[(p, "live")]["usage"]["cost_usd"] == 0.0
    assert rows[("scripted", "replay")]["usage"]["fetches"] == N
    assert rows[("scripted fetch=false", "replay")]["usage"]["fetches"] == 0
    (tau,) = result["kendall_tau"]
    assert (tau["a"], tau["b"], tau["n_policies"]) == (local, "serper", 2)
    f1 = {k: r["metrics"]["scores"]["f1"] for k, r in rows.items()}
    tied = f1[("scripted", "live")] == f1[("scripted fetch=false", "live")] or \
        f1[("scripted", "replay")] == f1[("scripted fetch=false", "replay")]
    if tied:
        assert tau["tau"] is None
    else:
        same = (f1[("scripted", "live")] > f1[("scripted fetch=false", "live")]) == \
            (f1[("scripted", "replay")] > f1[("scripted fetch=false", "replay")])
        assert tau["tau"] == pytest.approx(1.0 if same else -1.0)
    md = (out / "compare.md").read_text()
    for r in result["rows"]:  # each score's mean with its 95% interval over the run's episodes beside it
        ci = r["cis"]["f1"]
        assert ci["mean"] == pytest.approx(r["metrics"]["scores"]["f1"], abs=1e-12) and ci["lo"] <= ci["mean"] <= ci["hi"]
        assert f"| {ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}] |" in md
    assert "mean [95% bootstrap interval over the run's episodes]" in md
    assert "When the web was seen" in md and "serper: answers recorded between" in md
    assert "median live search latency then" in md
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG" and (out / "compare.html").exists()


def test_backend_failures_are_recorded_not_fatal(hotpot_web, tmp_path, monkeypatch):
    """Live provider errors (HTTP 500 after retries) and replay misses end up in the
    trajectories and the errors column; the study still completes."""
    hotpot_web.plan("/serper/search", *[(500, {}, "internal error")] * 50)
    before = hotpot_web.count("/serper/search")
    monkeypatch.setenv("SERPER_API_KEY", API_KEY)
    monkeypatch.setenv("SERPER_BASE_URL", f"{hotpot_web.base}/serper")
    try:
        res = run_compare(policies=["scripted"], tasks="hotpotqa-dev", backends=["serper"], n=4, out=tmp_path / "live",
                          backend_options={"serper": {"retry": {"attempts": 1}}}, run_options={"batch_size": 2})
    finally:
        hotpot_web._plans.clear()
    (row,) = res["rows"]
    assert row["metrics"]["episodes"] == 4 and row["metrics"]["errors"] == 4 and row["metrics"]["answer_rate"] == 1.0
    # every request failed (retry.attempts 1: one request per query) and each was counted; a failed
    # batch counts all its queries, and its other queries' requests may or may not have been
    # sent before the first failure came back (they run on worker threads), so the server can
    # see fewer requests than the errors counted
    served = hotpot_web.count("/serper/search") - before
    assert row["usage"]["errors"] >= served >= 4
    steps = json.loads((tmp_path / "live" / "runs" / "scripted__serper" / "trajectories.jsonl").read_text().splitlines()[0])["steps"]
    assert "HTTP 500" in steps[0]["error"]

    empty = tmp_path / "empty.sqlite"
    from drgym.search.record import RecordStore

    RecordStore(empty).close()
    res = run_compare(policies=["scripted"], tasks="hotpotqa-dev", backends=["brave"], n=3, out=tmp_path / "miss",
                      replay=empty)
    (row,) = res["rows"]
    # the batched driver retries a failed merged batch once per env: 3 + 3 failed query calls
    assert row["metrics"]["errors"] == 3 and row["usage"]["errors"] == 6
    first = json.loads((tmp_path / "miss" / "runs" / "scripted__brave" / "trajectories.jsonl").read_text().splitlines()[0])
    assert "ReplayMissError" in first["steps"][0]["error"] and "'brave'" in first["steps"][0]["error"]
