"""What a newcomer meets first: error and help text printed intact, bad options refused
in seconds, corpus rows without a title line, tables on an 80-column terminal, a quiet
install."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drgym.cli import app
from server_helpers import free_port

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sentence_transformers", "faiss", "onnxruntime", "bm25s", "vllm", "trl")
"""Modules that load a model, an encoder or an index: a command refused for a bad option
imports none of them (what made it take a minute, counted instead of timed)."""

_PROBE = ("import atexit, runpy, sys\n"
          f"HEAVY = {HEAVY!r}\n"
          "atexit.register(lambda: sys.stderr.write('\\nHEAVY ' + ','.join(m for m in HEAVY if m in sys.modules) + '\\n'))\n"
          "sys.argv = ['drgym', *sys.argv[1:]]\n"
          "runpy.run_module('drgym', run_name='__main__', alter_sys=True)\n")
"""``python -m drgym`` that writes, at exit, which :data:`HEAVY` modules it imported."""


def _drgym(args: list[str], tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``python -m drgym ARGS`` in ``tmp_path`` with an empty DRGYM_HOME; (result, the
    :data:`HEAVY` modules it imported)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    full_env = {**os.environ, "DRGYM_HOME": str(home), "HF_HUB_OFFLINE": "1", **env}
    for k in ("SERPER_API_KEY", "TAVILY_API_KEY", "BRAVE_API_KEY"):
        if k not in env:
            full_env.pop(k, None)
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=tmp_path, env=full_env, capture_output=True,
                         text=True, timeout=300)
    [line] = [ln for ln in res.stderr.splitlines() if ln.startswith("HEAVY ")]
    return res, [m for m in line[len("HEAVY "):].split(",") if m]


def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


# -- 1. brackets survive ------------------------------------------------------------------
def test_a_dependency_message_naming_an_extra_reaches_stderr_intact(monkeypatch):
    """rich markup used to eat '[gpu]': 'pip install 'drgym'' was printed."""
    import drgym.evaluation.runner as runner
    from drgym.errors import DependencyNotInstalled

    def missing(*a, **k):
        raise DependencyNotInstalled("The vllm policy needs vLLM and a CUDA GPU: pip install 'drgym[gpu]'.")

    monkeypatch.setattr(runner, "run_rollout", missing)
    res = CliRunner().invoke(app, ["rollout", "--policy", "scripted", "--n", "1", "--no-progress"])
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: The vllm policy needs vLLM and a CUDA GPU: pip install 'drgym[gpu]'."


def test_help_keeps_bracketed_text():
    res = CliRunner().invoke(app, ["index", "build", "--help"], terminal_width=200)
    assert res.exit_code == 0
    assert "pip install 'drgym[distributed]'" in " ".join(res.output.split())


def test_tables_print_brackets_as_they_are():
    from rich.console import Console

    from drgym.evaluation.metrics import rich_table, terminal_tables

    console = Console(width=80, record=True, color_system=None)
    console.print(rich_table({"episodes": 2, "em": 0.5}, title="hf:[my] model"))
    for t in terminal_tables(["run", "EM"], [["run[1]", "0.500"]], width=80):
        console.print(t)
    text = console.export_text()
    assert "hf:[my] model" in text and "run[1]" in text


# -- 2. refused before anything loads (no model, encoder or index module imported) ---------
def test_bad_policy_kind_fails_fast(tmp_path):
    res, heavy = _drgym(["rollout", "--policy", "bogus:x", "--n", "2", "--no-progress"], tmp_path)
    assert res.returncode == 2 and heavy == [], (heavy, res.stderr[-2000:])
    assert "Unknown policy kind 'bogus'" in _error_line(res.stderr)


@pytest.mark.parametrize("args, message", [
    (["-p", "dtype=float33"], "dtype must be 'auto', 'fastest' or a torch floating dtype (float32, bfloat16, float16...); "
                              "got 'float33'."),
    (["--backend", "local:nope"], "Unknown corpus or index for local:NAME"),
    (["--tasks", "nowhere/tasks.jsonl"], "Task file 'nowhere/tasks.jsonl' does not exist"),
])
def test_bad_dtype_local_name_and_task_file_fail_fast_leaving_nothing(tmp_path, args, message):
    res, heavy = _drgym(["rollout", *args, "--n", "2", "--out", "r", "--no-progress"], tmp_path)
    assert res.returncode == 2 and heavy == [], (heavy, res.stderr[-2000:])
    assert message in _error_line(res.stderr)
    assert not (tmp_path / "r").exists() and not list((tmp_path / "home").rglob("manifest.json"))


def test_dead_openai_endpoint_fails_fast_naming_the_url(tmp_path):
    """Used to load the local index first (a minute), then fail on the first request."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    res, heavy = _drgym(["rollout", "--policy", f"openai:Qwen/Qwen3-1.7B@{url}", "--n", "2", "--out", "r",
                        "--no-progress", "--no-plots"], tmp_path)
    assert res.returncode == 75 and heavy == [], (heavy, res.stderr[-2000:])
    line = _error_line(res.stderr)
    assert f"policy endpoint {url} is not reachable: GET {url}/models failed 3 attempt(s)" in line
    assert "0 of 2 episodes are saved" in line
    assert not list((tmp_path / "home").rglob("manifest.json"))  # no index was built or loaded


def test_missing_serper_key_fails_fast(tmp_path):
    res, heavy = _drgym(["rollout", "--policy", "scripted", "--backend", "serper", "--n", "2", "--no-progress"], tmp_path)
    assert res.returncode == 2 and heavy == [], (heavy, res.stderr[-2000:])
    assert "serper: no API key. Set the SERPER_API_KEY environment variable" in _error_line(res.stderr)


def test_missing_serper_key_fails_compare_before_the_local_runs(tmp_path):
    """``compare -b local,serper`` used to build the index and run every local episode first."""
    res, heavy = _drgym(["compare", "-p", "scripted", "-b", "local,serper", "--n", "2", "--out", "c"], tmp_path)
    assert res.returncode == 2 and heavy == [], (heavy, res.stderr[-2000:])
    assert "SERPER_API_KEY" in _error_line(res.stderr)
    assert not (tmp_path / "c").exists()


def test_vllm_policy_on_a_cpu_machine_fails_fast_with_the_install_hint(tmp_path):
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and a CUDA GPU are present: the vllm policy can run here")
    res, heavy = _drgym(["rollout", "--policy", "vllm:smollm2", "--n", "2", "--no-progress"], tmp_path)
    assert res.returncode == 2 and heavy == [], (heavy, res.stderr[-2000:])
    line = _error_line(res.stderr)
    assert ("pip install 'drgym[gpu]'" in line) if importlib.util.find_spec("vllm") is None else ("CUDA GPU" in line)


def test_policy_endpoints_and_reachability(monkeypatch):
    from drgym.errors import ServiceUnavailableError
    from drgym.policies.factory import check_policy_reachable, policy_endpoints

    assert policy_endpoints("openai:m@http://127.0.0.1:9/v1/") == ["http://127.0.0.1:9/v1"]
    assert policy_endpoints("rag:openai:m@http://h:1/v1") == ["http://h:1/v1"]
    assert policy_endpoints("hf:smollm2") == [] and policy_endpoints("scripted") == []
    check_policy_reachable("scripted")  # nothing to reach
    dead = f"http://127.0.0.1:{free_port()}/v1"
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)  # the retry's pauses, recorded instead of slept
    with pytest.raises(ServiceUnavailableError, match=re.escape(f"GET {dead}/models failed 2 attempt(s)")):
        check_policy_reachable(f"rtr:openai:m@{dead}", retry={"attempts": 2, "backoff_s": 0.1})
    assert waits == [0.1]  # one pause of the given backoff between the two attempts, nothing else


def test_an_openai_server_that_answers_anything_is_reachable(chat_server):
    from drgym.policies.factory import check_policy_reachable

    check_policy_reachable(f"openai:fake@{chat_server.url}", retry={"attempts": 1})  # its /models is a 404: it answered


# -- 3. corpora ---------------------------------------------------------------------------
def test_wiki18_row_without_a_title_line_is_indexed_whole(tmp_path, caplog):
    import logging

    from drgym.corpus.readers import read_corpus

    p = tmp_path / "c.jsonl"
    rows = [{"id": 1, "contents": '"Paris"\nParis is the capital of France.'},
            {"id": 2, "contents": "Rome is the capital of Italy."},
            {"id": 3, "contents": '"Empty"\n'}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        docs = list(read_corpus(p))
    assert [(d.doc_id, d.title, d.text) for d in docs] == [
        ("1", "Paris", "Paris is the capital of France."),
        ("2", "", "Rome is the capital of Italy."),
        ("3", "Empty", "")]  # a title with no text: skipped (and counted) by the index build
    assert docs[0].url == docs[1].url == ""  # a user's corpus: no URL made up (drgym://doc/<id> once indexed)
    [msg] = [r.getMessage() for r in caplog.records if "title line" in r.getMessage()]
    assert f"{p}:2: wiki18 'contents' has no title line" in msg and "the first line is the title" in msg
    assert list(read_corpus(p, wikipedia_urls=True))[0].url == "https://en.wikipedia.org/wiki/Paris"


def test_corpus_errors_name_the_fields_and_the_title_line(tmp_path):
    from drgym.corpus.readers import read_corpus
    from drgym.errors import CorpusError

    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"id": 1, "body": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError) as e:
        list(read_corpus(p, format="wiki18"))
    assert "wiki18 rows need 'id' and 'contents'" in str(e.value) and "the first line is the title" in str(e.value)
    with pytest.raises(CorpusError) as e:
        list(read_corpus(p))
    assert "'contents'" in str(e.value) and "'text'" in str(e.value) and "--format" in str(e.value)


def test_index_build_takes_the_corpus_as_an_argument(tmp_path, monkeypatch):
    import drgym.index.build as build

    seen = []

    def fake_build(spec, **kw):
        seen.append(spec.corpus)
        raise build.ConfigError("stop here")

    monkeypatch.setattr(build, "build_index", fake_build)
    runner = CliRunner()
    for args in (["my.jsonl"], ["--corpus", "my.jsonl"], ["my.jsonl", "--corpus", "my.jsonl"], []):
        res = runner.invoke(app, ["index", "build", *args, "--format", "wiki18"])
        assert res.exit_code == 2 and "stop here" in res.output, res.output
    assert seen == ["my.jsonl", "my.jsonl", "my.jsonl", "wiki-default"]
    res = runner.invoke(app, ["index", "build", "a.jsonl", "--corpus", "b.jsonl"])
    assert res.exit_code == 2 and "two corpora given" in res.output and len(seen) == 4


# -- 4. an 80-column terminal ---------------------------------------------------------------
def _render(tables, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None)
    for t in tables:
        console.print(t)
    return console.export_text()


def test_leaderboard_numbers_stay_whole_at_80_columns():
    from drgym.evaluation.metrics import LABELS, format_value, terminal_tables
    from drgym.evaluation.report import COLUMNS

    headers = ["run", "policy", "tasks", "episodes"] + [LABELS.get(c, c) for c in COLUMNS]
    metrics = [{"em": 0.125, "f1": 0.2083, "judge": 0.3333, "answer_rate": 0.875, "invalid_action_rate": 0.0417,
                "turns": 3.25, "searches": 1.875, "fetches": 0.5, "completion_tokens": 123.4, "wall_s_per_episode": 12.345},
               {"em": 0.5, "f1": 0.6667, "judge": 0.75, "answer_rate": 1.0, "invalid_action_rate": 0.0,
                "turns": 2.0, "searches": 1.0, "fetches": 0.0, "completion_tokens": 45.0, "wall_s_per_episode": 1.5}]
    rows = [[name, pol, "hotpotqa-dev", "50/50", *[format_value(c, m.get(c)) for c in COLUMNS]]
            for name, pol, m in (("searchqa-v0-hotpotqa-dev-hf-smollm2", "hf:smollm2", metrics[0]),
                                 ("rag", "rag:smollm2", metrics[1]))]
    tables = terminal_tables(headers, rows, width=80, text_columns=3, repeat=1, title="drgym rollout leaderboard")
    text = _render(tables, 80)
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "…" not in text
    words = set(text.split())
    for r in rows:
        for cell in r[3:]:
            assert cell in words, (cell, text)
    assert text.count("rag ") >= len(tables) > 1  # split over tables, each naming the run
    assert len(_render(terminal_tables(headers, rows, width=250, text_columns=3), 250).split("┏")) == 2  # wide: one table


def test_rollout_summary_table_fits_80_columns():
    from drgym.evaluation.metrics import rich_table

    m = {"episodes": 50, "em": 0.125, "f1": 0.20833, "answer_rate": 0.875, "invalid_action_rate": 0.04167, "turns": 3.25,
         "searches": 1.875, "fetches": 0.5, "completion_tokens": 123.4, "wall_s_per_episode": 12.345,
         "scores": {"citation_precision": 0.61234}, "errors": 2,
         "time_share": {"generation": 0.61, "search": 0.3, "env": 0.05, "reward": 0.04}}
    text = _render([rich_table(m, title="hf:smollm2 on hotpotqa-dev (drgym/SearchQA-v0)")], 80)
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= 80
    for v in ("0.125", "0.208", "87.5%", "4.2%", "3.25", "1.88", "123", "12.35s", "0.612",
              "generation 61% search 30% env 5% reward 4%"):
        assert v in text, (v, text)


def test_report_cli_at_80_columns(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_report import _write_run

    run = tmp_path / "searchqa-v0-hotpotqa-dev-hf-smollm2"
    run.mkdir()
    _write_run(run, "hf:smollm2", ["Paris", "Eiffel", "1889", "Rhine"], ["Paris", "Gustave Eiffel", "1889", "Danube"])
    res = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "lb")], terminal_width=80,
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output and "0.500" in res.output and "0.667" in res.output
    assert max(len(ln) for ln in res.output.splitlines()) <= 80


# -- 5. a quiet install ---------------------------------------------------------------------
def test_wheel_build_prints_no_warning(tmp_path):
    ignore = shutil.ignore_patterns(".git", ".venv", ".ci-venv", ".ci-cache", "build", "dist", "*.egg-info",
                                    "__pycache__", ".pytest_cache", "runs", "checkpoints", "results", "*.pyc")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                           str(tmp_path / "w"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert not re.search(r"warn", out, re.IGNORECASE), out[-5000:]


def test_editable_install_as_setup_sh_runs_it_prints_no_warning(tmp_path):
    """The PEP 660 hook that `pip install -e` calls, under the warning filter that
    scripts/setup.sh sets: setuptools' "Editable installation" note is gone, and nothing
    else warns."""
    setup_sh = (REPO / "scripts" / "setup.sh").read_text()
    m = re.search(r'PYTHONWARNINGS="([^"]+)" python -m pip install [^\n]* -e ', setup_sh)
    assert m, "scripts/setup.sh no longer sets PYTHONWARNINGS on its editable install"
    ignore = shutil.ignore_patterns(".git", ".venv", ".ci-venv", ".ci-cache", "build", "dist", "*.egg-info",
                                    "__pycache__", ".pytest_cache", "runs", "checkpoints", "results", "*.pyc")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=ignore)
    hook = ("import sys; from setuptools import build_meta as b; "
            "print(b.build_editable(sys.argv[1]))")
    env = {**os.environ, "PYTHONWARNINGS": m.group(1)}
    proc = subprocess.run([sys.executable, "-c", hook, str(tmp_path / "w")], cwd=src, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "w" / proc.stdout.strip().splitlines()[-1]).exists()
    assert not re.search(r"warn|Editable installation", proc.stderr, re.IGNORECASE), proc.stderr[-5000:]
    # and the filter is what silences it: without it the note is there
    env.pop("PYTHONWARNINGS")
    shutil.rmtree(tmp_path / "w")
    proc = subprocess.run([sys.executable, "-c", hook, str(tmp_path / "w")], cwd=src, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Editable installation" in proc.stderr, proc.stderr[-3000:]


def test_version_flag_and_command_agree():
    from drgym import __version__
    from drgym.cli import app

    for args in (["--version"], ["version"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0 and res.output.strip() == __version__, (args, res.output)

