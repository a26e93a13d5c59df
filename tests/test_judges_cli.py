"""``drgym evaluate`` on DeepResearch Bench- and DeepResearchGym-format reports (loopback judge)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from drgym.rewards.race import load_criteria
from typer.testing import CliRunner

from drgym.cli import app
from drgym.cli.evaluate import read_reports
from drgym.errors import ConfigError
from drgym.judges.prompts import RACE_DIMENSIONS

SAMPLE = Path(__file__).parent / "data" / "drb" / "claude-3-7-sonnet-latest_raw_sample.jsonl"


def test_read_reports_formats(tmp_path):
    drb = read_reports(SAMPLE)
    assert [i["id"] for i in drb] == ["13", "56", "63"] and drb[0]["task"].task_id == "drb-13"
    assert drb[0]["system"] == "claude-3-7-sonnet-latest_raw_sample"
    p = tmp_path / "gym.jsonl"
    p.write_text(
        json.dumps({"id": "7", "query": "why?", "report": "because", "system": "A"}) + "\n"
        + json.dumps({"7.q": "why?", "7.a": "because so"}) + "\n"
    )
    gym = read_reports(p, key_points={"7": [{"point_content": "k"}]})
    assert [g["task"].key_points for g in gym] == [[{"point_content": "k"}]] * 2
    assert gym[1]["answer"] == "because so"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(ConfigError, match="DeepResearch Bench"):
        read_reports(bad)


def test_evaluate_drb_reports_race_and_quality(chat_server, tmp_path):
    crit = load_criteria()

    def responder(body):
        u = body["messages"][1]["content"]
        if "Criterion: " in u:
            if "Criterion: Depth" in u and crit["13"]["prompt"] in u:
                return "refused"  # one report's Depth verdict always fails
            return '{"score": 5}'
        row = next(crit[k] for k in ("13", "56", "63") if crit[k]["prompt"] in u)
        return json.dumps({d: [{"criterion": c["criterion"], "target_score": 6.0} for c in row["criterions"][d]] for d in RACE_DIMENSIONS})

    chat_server.responder = responder
    out, summ = tmp_path / "items.jsonl", tmp_path / "summary.json"
    res = CliRunner().invoke(app, [
        "evaluate", "--reports", str(SAMPLE), "--metrics", "race,quality", "--judge", f"openai:j@{chat_server.url}",
        "--cache", str(tmp_path / "c.sqlite"), "--out", str(out), "--summary", str(summ), "--batch-size", "2", "--max-attempts", "2",
    ])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["13", "56", "63"]
    assert all(r["scores"]["race"] == pytest.approx(0.6) for r in rows)  # point-wise: 6/10 everywhere
    s = json.loads(summ.read_text())
    sys_ = s["summary"]["claude-3-7-sonnet-latest_raw_sample"]
    assert sys_["race_overall"] == pytest.approx(0.6)
    assert s["judge"]["model"] == "openai:j"
    # quality: 5/10 on every criterion -> 50; failures recorded and excluded, not zero
    assert [r["scores"]["quality"] is None for r in rows] == [True, False, False]
    assert sys_["quality/failures"] == 1 and sys_["quality/n"] == 2
    assert sys_["quality"] == pytest.approx(0.5)          # one scale: 0-1, as the reward and its components
    assert all(r["components"]["quality_clarity"] == pytest.approx(0.5) for r in rows)
    assert s["scales"]["quality"] == "0-1" and s["judge"]["valid"] is True
    assert "quality  " in res.output and "0-1" in res.output
    assert "race_overall" in res.output and "failures 1" in res.output
    n = len(chat_server.requests)
    res2 = CliRunner().invoke(app, [
        "evaluate", "--reports", str(SAMPLE), "--metrics", "race", "--judge", f"openai:j@{chat_server.url}",
        "--cache", str(tmp_path / "c.sqlite"),
    ])
    assert res2.exit_code == 0 and len(chat_server.requests) == n  # rerun served from the verdict cache


def test_evaluate_deepresearchgym_reports_kpr(chat_server, tmp_path):
    reports = tmp_path / "r.jsonl"
    rows = [
        {"id": "1", "query": "q1", "system": "A", "report": "alpha report"},
        {"id": "2", "query": "q2", "system": "A", "report": "beta report"},
        {"id": "1", "query": "q1", "system": "B", "report": "gamma report"},
    ]
    reports.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kps = tmp_path / "kp.jsonl"
    kps.write_text(
        json.dumps({"id": "1", "key_points": [{"point_number": 1, "point_content": "P1"}, {"point_number": 2, "point_content": "P2"}]}) + "\n"
        + json.dumps({"id": "2", "key_points": []}) + "\n"
    )

    def responder(body):
        u = body["messages"][1]["content"]
        if "alpha" in u:
            return '{"label": "Supported"}' if "Key point: P1" in u else '{"label": "Contradicted"}'
        return '{"label": "Supported"}'

    chat_server.responder = responder
    summ = tmp_path / "s.json"
    res = CliRunner().invoke(app, [
        "evaluate", "--reports", str(reports), "--metrics", "kpr", "--judge", f"openai:j@{chat_server.url}",
        "--key-points", str(kps), "--cache", str(tmp_path / "c.sqlite"), "--summary", str(summ),
    ])
    assert res.exit_code == 0, res.output
    s = json.loads(summ.read_text())["summary"]
    # A: query 1 KPR 0.5 / KPC 0.5; query 2 has no key points: KPR undefined, excluded and counted, not 0
    assert s["A"]["KPR"] == pytest.approx(0.5) and s["A"]["KPC"] == pytest.approx(0.5)
    assert s["A"]["kpr/undefined"] == 1 and s["A"]["kpr/n"] == 1 and s["A"]["kpr/failures"] == 0
    assert s["B"]["KPR"] == pytest.approx(1.0) and s["B"]["KPC"] == 0.0 and s["B"]["kpr/undefined"] == 0
    assert "KPR is undefined for 1 report(s)" in " ".join(res.output.split())
    bad = CliRunner().invoke(app, ["evaluate", "--reports", str(reports), "--metrics", "kpr,bleu", "--judge", f"openai:j@{chat_server.url}"])
    assert bad.exit_code != 0 and "bleu" in bad.output


def test_evaluate_fails_when_nothing_is_scored(chat_server, tmp_path):
    chat_server.responder = lambda body: "I cannot help with that."  # never JSON
    res = CliRunner().invoke(app, [
        "evaluate", "--reports", str(SAMPLE), "--metrics", "quality", "--judge", f"openai:j@{chat_server.url}",
        "--cache", str(tmp_path / "c.sqlite"), "--out", str(tmp_path / "items.jsonl"), "--max-attempts", "1", "--limit", "1",
    ])
    assert res.exit_code == 1, res.output
    assert "every judge call failed" in res.output
    row = json.loads((tmp_path / "items.jsonl").read_text())
    assert row["failed"] == {"quality": True} and row["scores"] == {"quality": None}


def test_evaluate_requires_a_judge_and_flags_smollm2(tmp_path, monkeypatch):
    from drgym.judges.base import Judge, judge_validity

    res = CliRunner().invoke(app, ["evaluate", "--reports", str(SAMPLE), "--metrics", "quality"])
    flat = " ".join(re.sub("[\u2500-\u257f]", " ", res.output).split())   # drop rich's box drawing
    assert res.exit_code == 2 and "--judge openai:MODEL@BASE_URL" in flat and "not a valid judge" in flat
    for spec in ("hf:smollm2", "hf:SmolLM2-135M-Instruct", "hf:"):
        assert judge_validity(spec)[0] is False
    assert judge_validity("openai:gpt-4.1-mini@https://api.openai.com/v1") == (True, "")

    # hf:smollm2 still runs, flagged on screen, in the summary and in every row; a stub
    # stands in for the 135M model so the test needs no model load
    class FakeSmol(Judge):
        model_id = "hf:smollm2"

        def complete(self, messages, **kw):
            return '{"score": 4}'

    import drgym.judges.factory as factory

    monkeypatch.setattr(factory, "make_judge", lambda spec, **kw: FakeSmol(cache=False))
    out, summ = tmp_path / "items.jsonl", tmp_path / "s.json"
    res = CliRunner().invoke(app, ["evaluate", "--reports", str(SAMPLE), "--metrics", "quality", "--judge", "hf:smollm2",
                                   "--limit", "1", "--out", str(out), "--summary", str(summ)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "NOT A VALID JUDGE" in text and "not a valid judge" in text
    s = json.loads(summ.read_text())
    assert s["judge"]["valid"] is False and s["judge"]["note"].startswith("not a valid judge")
    row = json.loads(out.read_text())
    assert row["judge_valid"] is False and row["scores"]["quality"] == pytest.approx(0.4)
