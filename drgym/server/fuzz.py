"""Fuzz a running drgym server from its own OpenAPI schema with schemathesis.

    from drgym.server.fuzz import fuzz_server

    report = fuzz_server("http://127.0.0.1:8000", max_examples=250, seed=0)
    assert report.server_errors == 0 and not report.failures

schemathesis (https://schemathesis.readthedocs.io) reads ``/openapi.json`` and runs its
phases (examples, coverage, fuzzing, stateful) against every operation: schema-valid
and schema-violating requests, missing and wrong API keys. Every default check runs on
every answer: no 5xx (``not_a_server_error``), the status is declared
(``status_code_conformance``), the body matches the declared schema
(``response_schema_conformance``), content type and headers match, invalid input is
rejected with a 4xx (``negative_data_rejection``), valid input is accepted
(``positive_data_acceptance``), and with keys configured, a request without one is
refused (``ignored_auth``).

schemathesis is a test dependency (``pip install -e .[test]``); it is imported here
only when :func:`fuzz_server` runs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from drgym.errors import ConfigError

OPERATIONS = ("GET /search", "GET /fineweb/search", "GET /fetch", "POST /retrieve", "GET /health")
"""The operations a drgym server must expose; :func:`fuzz_server` checks they were all tested."""


@dataclass
class FuzzReport:
    """What one schemathesis run against a server found.

    Attributes:
        base_url: the server fuzzed.
        seed: schemathesis/hypothesis seed (same seed and server: same cases).
        max_examples: examples per operation and phase asked of hypothesis.
        cases: test cases generated (each one request; checks such as ``ignored_auth``
            send extra variants, counted in ``requests``).
        requests: HTTP requests answered by the server.
        server_errors: answers with a 5xx status.
        statuses: ``{"GET /search": {"200": n, "400": n, ...}, ...}``.
        cases_by_operation: generated cases per operation.
        failures: one dict per failed check: ``check``, ``operation``, ``status``,
            ``title``, ``request`` (method and URL), ``body`` (request body excerpt).
        errors: engine errors (unreachable server, invalid schema), as text.
        elapsed_s: wall time of the run, seconds.
    """

    base_url: str
    seed: int
    max_examples: int
    cases: int = 0
    requests: int = 0
    server_errors: int = 0
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    cases_by_operation: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def operations(self) -> set[str]:
        """Operations that received at least one generated case."""
        return {op for op, n in self.cases_by_operation.items() if n}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (failures capped at 50)."""
        d = asdict(self)
        d["failures"] = d["failures"][:50]
        d["n_failures"] = len(self.failures)
        d["failed_checks"] = dict(Counter(f["check"] for f in self.failures))
        return d


def fuzz_server(base_url: str, *, max_examples: int = 50, seed: int = 0, api_key: str | None = None,
                mode: str = "all", max_time_s: int | None = None) -> FuzzReport:
    """Run schemathesis against ``base_url`` (a running server) and count what happens.

    Args:
        base_url: server root, e.g. ``"http://127.0.0.1:8000"``; the schema is read from
            ``{base_url}/openapi.json``.
        max_examples: hypothesis examples per operation and phase (about 4-5 cases per
            example over the 5 operations and the phases: 250 gives about 1,000 cases).
        seed: makes the run repeatable.
        api_key: sent as ``x-api-key`` when the server has keys (``ignored_auth`` then
            checks that requests without it get 401).
        mode: ``"positive"`` (schema-valid input), ``"negative"`` or ``"all"``.
        max_time_s: stop generating after this many seconds (None: no limit).

    Returns:
        A :class:`FuzzReport`.

    Raises:
        ConfigError: schemathesis is not installed.
    """
    import time

    try:
        import schemathesis
        from schemathesis.config import SchemathesisConfig
        from schemathesis.engine import events, from_schema
    except ImportError as e:
        raise ConfigError("API fuzzing needs schemathesis: pip install -e '.[test]'") from e

    base_url = base_url.rstrip("/")
    cfg: dict[str, Any] = {
        "seed": seed,
        "generation": {"max-examples": max_examples, "mode": mode, "database": "none"},
        "checks": {"enabled": True},
        "workers": 1,
        "cache": {"enabled": False},  # no .schemathesis/ folder in the working directory
    }
    if max_time_s:
        cfg["max-time"] = int(max_time_s)
    if api_key:
        cfg["headers"] = {"x-api-key": api_key}
    config = SchemathesisConfig.from_dict(cfg)
    report = FuzzReport(base_url=base_url, seed=seed, max_examples=max_examples)
    t0 = time.perf_counter()
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config)
    statuses: dict[str, Counter] = {}
    for ev in from_schema(schema).execute():
        if isinstance(ev, events.ScenarioFinished):
            rec = ev.recorder
            op = rec.label
            report.cases += len(rec.cases)
            report.cases_by_operation[op] = report.cases_by_operation.get(op, 0) + len(rec.cases)
            for inter in rec.interactions.values():
                if inter.response is None:
                    continue
                report.requests += 1
                code = inter.response.status_code
                statuses.setdefault(op, Counter())[str(code)] += 1
                if code >= 500:
                    report.server_errors += 1
            for case_id, checks in rec.checks.items():
                for c in checks:
                    if c.status.value != "failure":
                        continue
                    inter = rec.interactions.get(case_id)
                    req = inter.request if inter is not None else None
                    fail = c.failure_info.failure if c.failure_info is not None else None
                    report.failures.append({
                        "check": c.name, "operation": op,
                        "status": inter.response.status_code if inter is not None and inter.response is not None else None,
                        "title": getattr(fail, "title", None),
                        "message": (getattr(fail, "message", "") or "")[:300],
                        "request": f"{req.method} {req.uri}"[:500] if req is not None else None,
                        "body": (req.body or b"")[:2000].decode("utf-8", "replace") if req is not None and isinstance(req.body, bytes) else None,
                    })
        elif isinstance(ev, (events.NonFatalError, events.FatalError)):
            report.errors.append(str(getattr(ev, "info", None) or getattr(ev, "exception", None) or ev)[:500])
    report.statuses = {op: dict(sorted(c.items())) for op, c in sorted(statuses.items())}
    report.elapsed_s = round(time.perf_counter() - t0, 2)
    return report


def fuzz_cli_server(cli_args: list[str], *, max_examples: int = 250, seed: int = 0,
                    api_key: str | None = None, env: dict[str, str] | None = None) -> FuzzReport:
    """Start the real ``drgym serve CLI_ARGS`` (uvicorn, its own process, a free loopback
    port; ``--api-keys API_KEY`` added when a key is given), fuzz it with
    :func:`fuzz_server`, and stop it.

    Raises:
        RuntimeError, TimeoutError: the server did not start (see
            :func:`drgym.server.testing.running_server`).
    """
    from drgym.server.testing import running_server

    args = list(cli_args) + (["--api-keys", api_key] if api_key else [])
    with running_server(cli_args=args, env=env) as srv:
        return fuzz_server(srv.url, max_examples=max_examples, seed=seed, api_key=api_key)


def summarize(reports: list[FuzzReport]) -> dict[str, Any]:
    """Totals over several runs: ``cases``, ``requests``, ``server_errors``, ``failures``,
    ``errors``, statuses per operation and the operations covered."""
    statuses: dict[str, Counter] = {}
    for r in reports:
        for op, c in r.statuses.items():
            statuses.setdefault(op, Counter()).update(c)
    return {
        "cases": sum(r.cases for r in reports),
        "requests": sum(r.requests for r in reports),
        "server_errors": sum(r.server_errors for r in reports),
        "failures": sum(len(r.failures) for r in reports),
        "errors": sum(len(r.errors) for r in reports),
        "operations": sorted(set().union(*(r.operations for r in reports))) if reports else [],
        "statuses": {op: dict(sorted(c.items())) for op, c in sorted(statuses.items())},
    }
