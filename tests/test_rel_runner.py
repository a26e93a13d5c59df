"""Reliability of a rollout run directory: one engine per run, failed episodes are not
done, damaged lines are moved aside, a full disk leaves no torn line, one writer per run.

Each test drives the real runner (``run_rollout`` or ``drgym rollout`` in process) with
the scripted policy on the first few hotpotqa-dev questions; servers are loopback
threads (:func:`server_helpers.running_server`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from drgym.atomic import DiskFullError, append_jsonl
from drgym.cli import app
from drgym.evaluation.runner import (
    REJECTED_FILE,
    EngineChangedError,
    RolloutConfig,
    RunDiskFullError,
    RunLockedError,
    run_rollout,
)
from drgym.search.base import SearchBackend

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict]:
    """Every line of a JSONL file, parsed (a torn or non-UTF-8 line fails the test)."""
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]


def _cli(args: list[str], monkeypatch, **env: str):
    """``drgym ARGS`` in process, as a fresh process would run it (no cached backend)."""
    import drgym.search.registry as registry

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(registry, "_CACHE", {})
    return CliRunner().invoke(app, args)


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


class _Swappable(SearchBackend):
    """Serves ``engine`` and can be switched to another one under a running server: what a
    client sees when the server at its URL is restarted with other options."""

    name = "local"

    def __init__(self, engine) -> None:
        self.engine = engine
        self.max_k = engine.max_k

    def search_batch(self, queries, k=10, *, collapse=None):
        return self.engine.search_batch(queries, k, collapse=collapse)

    def fetch(self, url):
        return self.engine.fetch(url)

    def __repr__(self) -> str:  # /health reports the served engine through repr()
        return repr(self.engine)


def _rollout_args(backend: str, out: Path, n: int) -> list[str]:
    return ["rollout", "--policy", "scripted", "--backend", backend, "--n", str(n), "--out", str(out),
            "--no-progress", "--no-plots"]


# -- 1. a run is bound to its engine ----------------------------------------------------
def test_resuming_against_a_server_with_another_method_is_refused(hotpotqa_engine, monkeypatch, tmp_path):
    from drgym.search.wire import ServerSettings
    from server_helpers import running_server

    served = _Swappable(hotpotqa_engine)  # hybrid
    out = tmp_path / "run"
    with running_server(served, settings=ServerSettings(cache_size=0)) as srv:
        res = _cli(_rollout_args(srv.url, out, 3), monkeypatch)
        assert res.exit_code == 0, res.output
        cfg = json.loads((out / "config.json").read_text())
        eng = cfg["engine"]
        assert eng["kind"] == "http" and eng["service"] == "drgym" and eng["method"] == "hybrid"
        assert eng["index"] == hotpotqa_engine.manifest.name and eng["encoder"] == hotpotqa_engine.manifest.encoder
        assert eng["n_passages"] == hotpotqa_engine.n_passages and eng["collapse"] == "document"
        assert eng["max_k"] == hotpotqa_engine.max_k
        before = (out / "trajectories.jsonl").read_bytes()

        served.engine = hotpotqa_engine.with_method("bm25")  # "the server was restarted with --method bm25"
        res = _cli(_rollout_args(srv.url, out, 5), monkeypatch)
        assert res.exit_code == 2, res.output
        [line] = _error_lines(res.output)
        assert "was run against another search engine" in line and "method: 'hybrid' -> 'bm25'" in line
        assert "--allow-engine-change" in line and "Traceback" not in res.output
        assert (out / "trajectories.jsonl").read_bytes() == before  # nothing mixed in

        res = _cli([*_rollout_args(srv.url, out, 5), "--allow-engine-change"], monkeypatch)
        assert res.exit_code == 0, res.output
        assert "2 new episodes, 3 resumed" in res.output.replace("\n", " ")
    cfg = json.loads((out / "config.json").read_text())
    [change] = cfg["engine_changes"]
    assert change["from"]["method"] == "hybrid" and change["to"]["method"] == "bm25"
    assert cfg["engine"]["method"] == "bm25" and [s["engine_changed"] for s in cfg["sessions"]] == [False, True]
    assert len(_lines(out / "trajectories.jsonl")) == 5


def test_resuming_against_a_rebuilt_index_of_the_same_name_is_refused(hotpotqa_engine, monkeypatch, tmp_path):
    """/health reports the served engine's own identity, so a server restarted on a rebuilt
    index (same name, method, encoder and size: only the manifest fingerprint differs) is
    another engine."""
    from drgym.search.wire import ServerSettings
    from server_helpers import running_server

    served = _Swappable(hotpotqa_engine)
    real = hotpotqa_engine.identity()
    served.identity = lambda: dict(real)
    out = tmp_path / "run"
    with running_server(served, settings=ServerSettings(cache_size=0)) as srv:
        assert _cli(_rollout_args(srv.url, out, 2), monkeypatch).exit_code == 0
        eng = json.loads((out / "config.json").read_text())["engine"]
        assert eng["engine"] == json.loads(json.dumps(real)) and len(eng["engine"]["manifest_fingerprint"]) == 16
        served.identity = lambda: {**real, "manifest_fingerprint": "0123456789abcdef"}
        res = _cli(_rollout_args(srv.url, out, 3), monkeypatch)
        assert res.exit_code == 2, res.output
        [line] = _error_lines(res.output)
        assert f"engine.manifest_fingerprint: '{real['manifest_fingerprint']}' -> '0123456789abcdef'" in line
        assert "method" not in line.split("(")[1].split(")")[0]  # only what differs is named
        served.identity = lambda: 1 / 0  # a backend whose identity fails is an unknown engine, not a crash
        health = httpx.get(f"{srv.url}/health").json()
        assert health["engine"] == {"kind": "unknown", "error": "ZeroDivisionError: division by zero"}


def test_local_engine_identity_binds_the_run(hotpotqa_engine, tmp_path):
    out = tmp_path / "run"
    cfg = RolloutConfig(policy="scripted", n=2, out=str(out), batch_size=2, plots=False)
    run_rollout(cfg, backend=hotpotqa_engine, progress=False)
    eng = json.loads((out / "config.json").read_text())["engine"]
    m = hotpotqa_engine.manifest
    assert eng["kind"] == "local" and eng["index"] == m.name and eng["method"] == "hybrid"
    assert eng["corpus_fingerprint"] == m.corpus_fingerprint and len(eng["manifest_fingerprint"]) == 16
    assert eng["encoder"] == m.encoder and eng["collapse"] == "document" and eng["max_k"] == hotpotqa_engine.max_k
    more = RolloutConfig(policy="scripted", n=3, out=str(out), batch_size=2, plots=False)
    with pytest.raises(EngineChangedError, match=r"collapse: 'document' -> 'passage'"):
        run_rollout(more, backend=hotpotqa_engine.with_method("hybrid", collapse="passage"), progress=False)
    assert len(_lines(out / "trajectories.jsonl")) == 2
    res = run_rollout(more, backend=hotpotqa_engine, progress=False)  # the same engine resumes
    assert res.skipped == 2 and res.new_episodes == 1


def test_web_and_recorded_backends_name_their_provider_and_recording(tmp_path):
    from drgym.search.record import RecordReplayBackend, RecordStore
    from drgym.search.web import SerperSearch, TavilySearch

    web = SerperSearch(api_key="sk-test-secret-123456", base_url="http://127.0.0.1:9")
    ident = web.identity()
    assert ident == {"kind": "web", "provider": "serper", "base_url": "http://127.0.0.1:9", "max_k": web.max_k}
    assert "sk-test-secret-123456" not in json.dumps(ident)
    tav = TavilySearch(api_key="k" * 12, base_url="http://127.0.0.1:9", search_depth="advanced")
    assert tav.identity()["search_depth"] == "advanced" and tav.identity()["provider"] == "tavily"
    store = tmp_path / "web.sqlite"
    rec = RecordReplayBackend(web, store, mode="record")
    assert rec.identity() == {"kind": "record", "mode": "record", "provider": "serper",
                              "recording": str(store.resolve()), "inner": ident}
    rec.close()
    rep = RecordReplayBackend(None, RecordStore(store, readonly=True), mode="replay", name="serper")
    assert rep.identity() == {"kind": "record", "mode": "replay", "provider": "serper", "recording": str(store.resolve())}
    tav.close()


# -- 2. failed is not done ----------------------------------------------------------------
def test_episodes_whose_searches_were_refused_are_redone(hotpotqa_engine, monkeypatch, tmp_path):
    from drgym.search.wire import ServerSettings
    from server_helpers import running_server

    out = tmp_path / "run"
    with running_server(hotpotqa_engine, settings=ServerSettings(api_keys="right-key-123")) as srv:
        res = _cli(_rollout_args(srv.url, out, 3), monkeypatch, DRGYM_API_KEY="wrong-key-456")
        assert res.exit_code == 3, res.output
        [line] = _error_lines(res.output)
        assert "3 of 3 episodes failed (search AuthError (HTTP 401): 3)" in line and "rerun the same command" in line
        recs = _lines(out / "trajectories.jsonl")
        assert len(recs) == 3 and all(r["metadata"]["failed"][0] == "search AuthError (HTTP 401)" for r in recs)
        m = json.loads((out / "metrics.json").read_text())
        assert m["failed"] == 3 and m["failure_reasons"] == {"search AuthError (HTTP 401)": 3}

        res = _cli(_rollout_args(srv.url, out, 3), monkeypatch, DRGYM_API_KEY="right-key-123")
        assert res.exit_code == 0, res.output
        assert "3 new episodes, 0 resumed" in res.output.replace("\n", " ")
    m = json.loads((out / "metrics.json").read_text())
    assert m["episodes"] == 3 and m["failed"] == 0 and m["errors"] == 0 and m["searches"] == 1.0
    assert len(_lines(out / "trajectories.jsonl")) == 6  # the failed records stay, the run uses the redone ones


def test_episodes_whose_model_requests_were_refused_are_redone(bm25_backend, chat_server, tmp_path):
    import re

    chat_server.responder = lambda body: (404, json.dumps({"error": {"message": "model 'fake' not found"}}))
    cfg = RolloutConfig(policy=f"openai:fake@{chat_server.url}", n=2, out=str(tmp_path / "r"), batch_size=2,
                        policy_options={"tools": False}, max_turns=2, plots=False)
    res = run_rollout(cfg, backend=bm25_backend, progress=False)
    assert res.failed == 2 and res.failure_reasons == {"policy request failed (HTTP 404)": 2}
    assert res.metrics["failed"] == 2 and res.metrics["episodes"] == 2
    assert res.failure_message().startswith("2 of 2 episodes failed (policy request failed (HTTP 404): 2)")

    def answers(body):
        last = body["messages"][-1]["content"]
        if "<information>" in last:
            return "<answer> " + re.search(r"Doc 1 \(Title: (.*?), URL:", last).group(1) + " </answer>"
        return "<search> " + last.removeprefix("Question: ") + " "

    chat_server.responder = answers
    res = run_rollout(cfg, backend=bm25_backend, progress=False)
    assert res.skipped == 0 and res.new_episodes == 2 and res.failed == 0
    assert res.metrics["episodes"] == 2 and res.metrics["answer_rate"] == 1.0


def test_a_failed_query_the_agent_caused_is_not_a_failure():
    from drgym.evaluation.metrics import episode_failures

    ok = {"steps": [{"error": "Fetch failed: DocumentNotFoundError: URL not found: 'x'"},
                    {"error": "Search failed: BadQueryError: query 0 is empty"},
                    {"error": "Fetch failed: SearchError: https://x: HTTP 503 while fetching the page."},
                    {"error": "Fetch failed: BackendUnavailableError: https://x: the download broke off (ReadError)."},
                    {"error": "Fetch failed: FetchRefusedError: fetch refused: 'u' was not in any search result"}],
          "metadata": {"usage": [{"finish": "stop"}]}}
    assert episode_failures(ok) == []
    bad = {"steps": [{"error": "Search failed: BackendUnavailableError: serper: HTTP 500; "
                               "Fetch failed: DocumentNotFoundError: URL not found"},
                     {"error": "Fetch failed: SearchError: http: HTTP 405 from http://127.0.0.1:1/fetch: no"}],
           "metadata": {"usage": [{"finish": "error", "error": "ValueError: malformed chat completion"}]}}
    assert episode_failures(bad) == ["search BackendUnavailableError (HTTP 500)", "fetch SearchError (HTTP 405)",
                                     "policy request failed: ValueError: malformed chat completion"]


# -- 3. damaged run files ------------------------------------------------------------------
def test_damaged_lines_are_moved_aside_and_their_episodes_redone(bm25_backend, tmp_path, caplog):
    out = tmp_path / "run"
    cfg = RolloutConfig(policy="scripted", n=3, out=str(out), batch_size=3, plots=False)
    clean = run_rollout(cfg, backend=bm25_backend, progress=False)
    path = out / "trajectories.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    damaged = (json.dumps({"task_id": first["task_id"]}).encode() + b"\n"  # only a task id: not an episode
               + b"".join(lines[1:])
               + b'{"task_id": "x", "steps": "\xff\xfe"}\n'  # not UTF-8
               + b"[1, 2]\n" + b"null\n"
               + lines[1][:40])  # a torn last line
    path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="drgym.evaluation.runner"):
        res = run_rollout(cfg, backend=bm25_backend, progress=False)
    assert res.rejected == 5 and res.skipped == 2 and res.new_episodes == 1
    [warning] = [r for r in caplog.records if "moved to" in r.getMessage()]
    assert "5 line(s) are not whole episode records" in warning.getMessage()
    recs = _lines(path)
    assert sorted(r["task_id"] for r in recs) == sorted(d["task_id"] for d in clean.trajectories)
    assert len(recs) == 3
    m = json.loads((out / "metrics.json").read_text())
    assert m["episodes"] == 3 and m["tasks_total"] == 3
    assert m["f1"] == pytest.approx(clean.metrics["f1"]) and m["turns"] == pytest.approx(clean.metrics["turns"])
    rejected = _lines(out / REJECTED_FILE)
    assert [r["line"] for r in rejected] == [1, 4, 5, 6, 7]
    reasons = [r["reason"] for r in rejected]
    assert reasons[0].startswith("episode_id: Field required")
    assert reasons[1] == "not UTF-8 text (byte 0xff at column 28)" and "\\xff" in rejected[1]["raw"]
    assert reasons[2] == "not a JSON object (list)" and reasons[3] == "not a JSON object (null)"
    assert reasons[4].startswith("not valid JSON")
    res = run_rollout(cfg, backend=bm25_backend, progress=False)  # now clean: nothing moved, nothing redone
    assert res.rejected == 0 and res.skipped == 3 and len(_lines(out / REJECTED_FILE)) == 5


# -- 8. a full disk ------------------------------------------------------------------------
def _fail_writes_to(monkeypatch, name: str, *, after: int = 0, partial: bool = True, short: bool = False) -> list[int]:
    """Make ``os.write`` to a file called ``name`` fail with ENOSPC after ``after`` good
    writes: writing half the bytes first (``partial``), or returning a short count (``short``)."""
    real = os.write
    calls = [0]

    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if not target.endswith(os.sep + name):
            return real(fd, data)
        calls[0] += 1
        if calls[0] <= after:
            return real(fd, data)
        if short:
            return real(fd, bytes(data)[: len(data) // 2])
        if partial:
            real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    return calls


@pytest.mark.parametrize("short", [False, True], ids=["raises", "short-write"])
def test_a_full_disk_leaves_no_partial_line(monkeypatch, tmp_path, short):
    path = tmp_path / "out" / "t.jsonl"
    append_jsonl(path, {"a": 1})
    before = path.read_bytes()
    _fail_writes_to(monkeypatch, "t.jsonl", short=short)
    with pytest.raises(DiskFullError) as ei:
        append_jsonl(path, {"b": "x" * 100})
    assert path.read_bytes() == before  # truncated back: no torn line
    msg = str(ei.value)
    assert f"cannot write {path}: the disk holding {path.parent} is full" in msg
    assert ei.value.errno == errno.ENOSPC and ei.value.filename == str(path)


def test_a_full_run_disk_names_the_file_and_a_rerun_resumes(bm25_backend, monkeypatch, tmp_path):
    out = tmp_path / "run"
    cfg = RolloutConfig(policy="scripted", n=3, out=str(out), batch_size=1, plots=False)
    _fail_writes_to(monkeypatch, "trajectories.jsonl", after=1)
    with pytest.raises(RunDiskFullError) as ei:
        run_rollout(cfg, backend=bm25_backend, progress=False)
    msg = str(ei.value)
    assert f"cannot write {out / 'trajectories.jsonl'}: the disk holding {out} is full" in msg
    assert "DRGYM_HOME" not in msg and "rerun the same command to resume" in msg
    assert len(_lines(out / "trajectories.jsonl")) == 1  # whole lines only
    monkeypatch.undo()
    res = run_rollout(cfg, backend=bm25_backend, progress=False)
    assert res.skipped == 1 and res.new_episodes == 2 and len(_lines(out / "trajectories.jsonl")) == 3


# -- 11. one writer per run directory ----------------------------------------------------------
def test_a_second_run_into_the_same_out_is_refused(bm25_backend, monkeypatch, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom drgym.evaluation.runner import RunDirectory\n"
         "r = RunDirectory(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(120)\n", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cfg = RolloutConfig(policy="scripted", n=3, out=str(out), plots=False)
        with pytest.raises(RunLockedError, match=f"is being written by process {holder.pid} ") as ei:
            run_rollout(cfg, backend=bm25_backend, progress=False)
        assert ei.value.pid == holder.pid
        res = _cli(["rollout", "--policy", "scripted", "--n", "3", "--out", str(out), "--no-progress"], monkeypatch)
        assert res.exit_code == 2, res.output
        [line] = _error_lines(res.output)
        assert f"process {holder.pid}" in line and "Traceback" not in res.output
        assert not (out / "trajectories.jsonl").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    res = run_rollout(cfg, backend=bm25_backend, progress=False)  # the lock went with the process
    assert res.new_episodes == 3
    assert not (out / "run.lock").exists()  # released and removed: nothing left behind
