"""``drgym report``: a leaderboard over run directories, as markdown and standalone HTML."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from drgym.atomic import append_jsonl, atomic_write_json
from drgym.errors import ConfigError
from drgym.evaluation.report import build_report


def _write_run(folder, policy, answers, golds):
    """A run directory with hand-made episodes: each answers once after one search."""
    from drgym.rewards.qa import exact_match, token_f1

    atomic_write_json(folder / "config.json", {
        "config": {"env": "drgym/SearchQA-v0", "tasks": "hotpotqa-dev", "policy": policy, "backend": "local", "n": len(answers)},
        "env": {"max_turns": 4, "top_k": 3}, "backend": {"method": "hybrid", "index": {"corpus": "wiki-default", "n_passages": 20036,
                                                                                       "manifest_fingerprint": "abcd"}},
        "versions": {"drgym": "0.1.0"}, "tasks": {"n": len(answers)}, "created": "2026-11-30T03:00:00Z"})
    for i, (a, g) in enumerate(zip(answers, golds)):
        append_jsonl(folder / "trajectories.jsonl", {
            "episode_id": f"e{i}", "task_id": f"t{i}", "final_answer": a, "terminated": a is not None,
            "steps": [{"action": "<search> q </search>", "tool_calls": [{"name": "search"}]},
                      {"action": f"<answer> {a} </answer>", "tool_calls": [{"name": "answer"}]}],
            "reward_components": {"em": exact_match(a or "", [g]), "f1": token_f1(a or "", [g])},
            "timings": {"generation": 1.0, "search": 0.1, "env": 0.0, "reward": 0.0},
            "metadata": {"usage": [{"completion_tokens": 5}, {"completion_tokens": 3}], "wall_share_s": 1.5}})


def test_report_ranks_runs_and_writes_standalone_html(tmp_path):
    golds = ["Paris", "Gustave Eiffel", "1889", "Danube"]
    a, b = tmp_path / "agent", tmp_path / "baseline"
    a.mkdir(), b.mkdir()
    _write_run(a, "hf:smollm2", ["Paris", "Eiffel", "1889", "Rhine"], golds)        # EM 2/4, F1 (1+2/3+1+0)/4
    _write_run(b, "rag:smollm2", ["Paris", "the tower", "1900", "Seine"], golds)    # EM 1/4, F1 1/4
    (tmp_path / "not-a-run").mkdir()
    runs, md, page = build_report([tmp_path], tmp_path / "board")
    assert [r.name for r in runs] == ["agent", "baseline"]
    assert runs[0].metrics["em"] == pytest.approx(0.5) and runs[0].metrics["f1"] == pytest.approx((1 + 2 / 3 + 1) / 4)
    rows = [ln for ln in md.splitlines() if ln.startswith("| agent") or ln.startswith("| baseline")]
    # each mean with its 95% percentile-bootstrap interval over the 4 episodes: a resampled EM
    # of [1, 0, 1, 0] is Binomial(4, 1/2) / 4, whose 2.5% and 97.5% points are 0 and 1 (each
    # end has probability 1/16); of [1, 0, 0, 0] Binomial(4, 1/4) / 4: 0 and 0.75 (P(1) = 1/256)
    assert rows[0].startswith("| agent | `hf:smollm2` | hotpotqa-dev | 4/4 | 0.500 [0.000, 1.000] | 0.667 [0.250, 1.000] |")
    assert rows[1].startswith("| baseline | `rag:smollm2` | hotpotqa-dev | 4/4 | 0.250 [0.000, 0.750] | 0.250 [0.000, 0.750] |")
    assert "| 100.0% [100.0%, 100.0%] |" in rows[0] and "1.50s" in rows[0]  # answer rate, wall s per episode
    assert (tmp_path / "board.md").read_text() == md
    html = (tmp_path / "board.html").read_text()
    assert html.startswith("<!doctype html>") and "<td>0.667 [0.250, 1.000]</td>" in html
    assert not re.search(r"""(src|href)=['"]?https?://""", html)  # standalone: nothing fetched
    with pytest.raises(ConfigError, match="No rollout run directory"):
        build_report([tmp_path / "not-a-run"])


def test_report_cli(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    _write_run(run, "scripted", ["Paris"], ["Paris"])
    out = subprocess.run([sys.executable, "-m", "drgym", "report", str(run), "--out", str(tmp_path / "lb")],
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "COLUMNS": "250"})
    assert out.returncode == 0, out.stderr
    assert "r1" in out.stdout and "1.000" in out.stdout
    assert json.loads((run / "config.json").read_text())["config"]["policy"] == "scripted"
    assert (tmp_path / "lb.md").exists() and (tmp_path / "lb.html").exists()
