"""schemathesis against drgym serve's own /openapi.json (drgym.server.fuzz): every operation,
schema-valid and schema-violating input, no 5xx, and every answer as declared."""

from __future__ import annotations

import pytest

from drgym.server.fuzz import OPERATIONS, fuzz_cli_server, fuzz_server, summarize
from drgym.server.testing import running_server


def _assert_clean(report) -> None:
    assert not report.errors, report.errors
    assert report.server_errors == 0, report.statuses
    assert not report.failures, report.failures[:3]
    assert report.operations == set(OPERATIONS), report.cases_by_operation


def test_fuzz_small(hotpotqa_engine):
    """A quick run in the default suite, on a uvicorn thread: about 200 cases (mostly the
    coverage phase: boundary and schema-violating values of every parameter), 10-15 s."""
    with running_server(hotpotqa_engine) as srv:
        report = fuzz_server(srv.url, max_examples=2, seed=0)
    _assert_clean(report)
    assert report.cases >= 50 and report.requests >= report.cases
    # schema-violating input was sent and refused, valid input answered
    assert "422" in report.statuses["POST /retrieve"] and "200" in report.statuses["POST /retrieve"]
    assert "400" in report.statuses["GET /search"] and "200" in report.statuses["GET /search"]


@pytest.mark.slow
def test_fuzz_real_server_1000_cases(hotpotqa_engine):
    """The real ``drgym serve`` (its own uvicorn process) fuzzed without keys and with
    ``--api-keys`` (then schemathesis also checks that a missing key gets 401): at least
    1,000 generated cases in all, 0 answers of 5xx, every answer conforming to the schema.
    ``scripts/fuzz_api.py`` is the same run writing JSON for the README."""
    args = ["--index-dir", str(hotpotqa_engine.folder), "--cache-size", "0"]
    reports = [fuzz_cli_server(args, max_examples=150, seed=0),
               fuzz_cli_server(args, max_examples=100, seed=1, api_key="fuzz-key-3c9e1a")]
    for r in reports:
        _assert_clean(r)
    total = summarize(reports)
    assert total["cases"] >= 1000 and total["server_errors"] == 0, total
    assert "401" in total["statuses"]["GET /search"]
