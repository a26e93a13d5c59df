"""Fuzz a running drgym server from its own OpenAPI schema with schemathesis.

    from fuzz_helpers import fuzz_server

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

Strict JSON has no ``NaN`` or ``Infinity`` and schemathesis generates only valid JSON, so a
schema ``map_case`` hook (:func:`inject_non_finite`) rewrites a share of the generated cases:
a JSON body is sent as raw text with ``NaN``, ``Infinity``, ``-Infinity``, ``1e400`` or
``-1e400`` in a numeric field, in a list element, or in a nested object; a numeric query
parameter (``k``) gets one of them as its text. schemathesis then sees the case as
schema-violating, and the check :func:`non_finite_rejected` asks for a 422 whose body is
strict JSON, and for the connection to stay usable (the same request again, then
``GET /health`` on that one kept-alive connection).

schemathesis is a test dependency (``pip install -e .[test]``); it is imported here
only when :func:`fuzz_server` runs. A test helper, not part of the installed package:
tests import it as ``fuzz_helpers``; ``scripts/fuzz_api.py`` puts ``tests/`` on ``sys.path`` first.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from drgym.errors import ConfigError

OPERATIONS = ("GET /search", "GET /fineweb/search", "GET /fetch", "POST /retrieve", "GET /health")
"""The operations a drgym server must expose; :func:`fuzz_server` checks they were all tested."""

NON_FINITE_TOKENS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400")
"""Number texts :func:`inject_non_finite` writes: not valid JSON (RFC 8259), yet Python's
JSON parser reads them as NaN and +-infinity (``1e400`` overflows a float)."""

NON_FINITE_STATUSES = (401, 405, 422)
"""Answers :func:`non_finite_rejected` accepts: 422, or a refusal decided before the
input is read (401 bad key, 405 method)."""

_PLACEHOLDER = "__drgym_non_finite__"
_NESTED_KEY = "drgym_fuzz_nested"


def _is_numeric_schema(schema: Any) -> bool:
    """Whether a JSON schema admits a number (``integer``/``number``, also in ``anyOf``/``oneOf``/``allOf``)."""
    if not isinstance(schema, dict):
        return False
    t = schema.get("type")
    if t in ("integer", "number") or (isinstance(t, list) and {"integer", "number"} & set(t)):
        return True
    return any(_is_numeric_schema(x) for key in ("anyOf", "oneOf", "allOf") for x in schema.get(key) or ())


def numeric_query_parameters(operation: Any) -> list[str]:
    """Names of ``operation``'s query parameters whose schema admits a number (a
    schemathesis ``APIOperation``), in declaration order."""
    return [p.name for p in operation.query if _is_numeric_schema((p.definition or {}).get("schema"))]


def _json_paths(value: Any) -> tuple[list[tuple], list[tuple]]:
    """(paths of numbers, paths of list elements) in a parsed JSON value, any depth."""
    numbers: list[tuple] = []
    elements: list[tuple] = []
    stack: list[tuple[tuple, Any]] = [((), value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            numbers.append(path)
        elif isinstance(v, dict):
            stack.extend((path + (k,), x) for k, x in v.items())
        elif isinstance(v, list):
            elements.extend(path + (i,) for i in range(len(v)))
            stack.extend((path + (i,), x) for i, x in enumerate(v))
    return numbers, elements


def _set_path(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    target = value
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = new
    return value


def non_finite_body(body: Any, token: str, rng: random.Random, numeric_properties: list[str] = ()) -> bytes | None:
    """``body`` (a parsed JSON value) as JSON text with ``token`` (one of
    :data:`NON_FINITE_TOKENS`) written at a place drawn with ``rng``: a number already
    in it (any depth), a property of ``numeric_properties`` (added when missing), a list
    element (nested), a new nested object ``{"drgym_fuzz_nested": {"values": [1.5, token]}}``,
    or the whole body. None when ``body`` is not JSON-serialisable (e.g. binary data).
    """
    import copy
    import json

    try:
        value = copy.deepcopy(body)
        numbers, elements = _json_paths(value)
    except (TypeError, ValueError, RecursionError):
        return None
    places: list[tuple] = [*numbers, *elements]
    if isinstance(value, dict):
        places += [(name,) for name in numeric_properties]
        places.append((_NESTED_KEY, "values", 1))
    elif isinstance(value, list):
        places.append((len(value),))
    if not places:
        places.append(())
    path = places[rng.randrange(len(places))]
    if path and path[0] == _NESTED_KEY:
        value[_NESTED_KEY] = {"values": [1.5, _PLACEHOLDER]}
    elif isinstance(value, list) and path == (len(value),):
        value.append(_PLACEHOLDER)
    else:
        value = _set_path(value, path, _PLACEHOLDER)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return text.replace(json.dumps(_PLACEHOLDER), token, 1).encode()


def inject_non_finite(case: Any, *, share: float, seed: int = 0) -> Any:
    """schemathesis ``map_case`` hook body: for about ``share`` of the cases (drawn from a
    hash of ``seed`` and the case, so a run is repeatable), write a non-finite number
    (:data:`NON_FINITE_TOKENS`) into the request: a JSON body becomes raw JSON text
    (:func:`non_finite_body`), or a numeric query parameter gets the token as its text.
    Cases whose method is not the operation's (405 probes), or with nothing to write
    into (no JSON body, no numeric query parameter), are returned unchanged.

    schemathesis revalidates an edited case, so an injected one counts as
    schema-violating (``negative_data_rejection`` then wants a 4xx).

    Args:
        case: a schemathesis ``Case`` (edited in place and returned).
        share: fraction of cases to rewrite, 0..1.
        seed: mixed into the draw.
    """
    import hashlib

    from schemathesis.core import NOT_SET

    op = case.operation
    if share <= 0 or case.method.upper() != op.method.upper():
        return case
    key = repr((seed, op.label, case.query, case.body, case.media_type)).encode("utf-8", "replace")
    rng = random.Random(hashlib.sha256(key).digest())
    if rng.random() >= share:
        return case
    token = NON_FINITE_TOKENS[rng.randrange(len(NON_FINITE_TOKENS))]
    targets = []
    media = (case.media_type or "").lower()
    if case.body is not NOT_SET and not isinstance(case.body, (bytes, bytearray)) and "json" in media:
        targets.append("body")
    numeric_query = numeric_query_parameters(op)
    if numeric_query:
        targets.append("query")
    if not targets:
        return case
    if targets[rng.randrange(len(targets))] == "body":
        alternative = op.get_body_for_media_type(case.media_type)
        props = (alternative.validation_schema or {}).get("properties") or {} if alternative is not None else {}
        raw = non_finite_body(case.body, token, rng, [n for n, sch in props.items() if _is_numeric_schema(sch)])
        if raw is not None:
            case.body = raw  # bytes: schemathesis sends them as they are, with the JSON content type
        return case
    name = numeric_query[rng.randrange(len(numeric_query))]
    case.query = {**(case.query or {}), name: token}
    return case


def non_finite_sent(operation: Any, uri: str, body: bytes | str | None) -> tuple[str, str] | None:
    """Where a request (as sent) holds a non-finite number, or None.

    Args:
        operation: the schemathesis ``APIOperation`` (its numeric query parameters are read).
        uri: the full request URL.
        body: the request body as sent.

    Returns:
        ``(place, text)``: place is ``"body"`` (a top-level field or the whole body),
        ``"body (nested)"`` (inside a list or an object) or ``"query"``; text is the
        number as written (``"NaN"``, ``"1e400"``...).
    """
    import json
    import math
    from urllib.parse import parse_qsl, urlsplit

    from drgym.server.app import _non_finite_path

    if body:
        seen: list[str] = []

        def constant(text: str) -> float:
            seen.append(text)
            return float(text)

        def number(text: str) -> float:
            v = float(text)
            if not math.isfinite(v):
                seen.append(text)
            return v

        try:
            parsed = json.loads(body, parse_constant=constant, parse_float=number)
        except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON: nothing to look at
            parsed = None
        path = _non_finite_path(parsed) if seen else None
        if path is not None:
            return ("body (nested)" if len(path) > 1 else "body"), seen[0][:40]
    numeric = set(numeric_query_parameters(operation))
    for name, value in parse_qsl(urlsplit(uri).query, keep_blank_values=True):
        if name in numeric:
            try:
                if not math.isfinite(float(value)):
                    return "query", value[:40]
            except ValueError:
                continue
    return None


def _strict_json_problem(content: bytes) -> str | None:
    import json

    def refuse(text: str) -> None:
        raise ValueError(f"{text} in the answer")

    try:
        json.loads(content, parse_constant=refuse)
    except (ValueError, UnicodeDecodeError) as e:
        return f"the 422 body is not strict JSON ({e})"
    return None


def _connection_problem(request: Any, status: int, timeout_s: float = 30.0) -> str | None:
    """Send ``request`` (a ``requests.PreparedRequest``) again on a new connection, then
    ``GET /health`` on that same kept-alive connection; a sentence on what went wrong, or None."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(request.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        conn.request(request.method, u.path + (f"?{u.query}" if u.query else ""), body=request.body,
                     headers=dict(request.headers))
        first = conn.getresponse()
        first.read()
        if first.status != status:
            return f"the same request answered {first.status} the second time, {status} the first"
        if (first.getheader("connection") or "").lower() == "close":
            return f"the {status} answer closes the connection (Connection: close)"
        conn.request("GET", "/health")
        health = conn.getresponse()
        health.read()
        if health.status != 200:
            return f"GET /health on the same connection answered {health.status}"
    except (OSError, http.client.HTTPException) as e:
        return f"the connection did not stay usable: {type(e).__name__}: {e}"
    finally:
        conn.close()
    return None


def non_finite_rejected(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis check (registered by :func:`fuzz_server`): a request holding a
    non-finite number (:func:`non_finite_sent`) is answered 422 (or a 401/405 decided
    before the input is read, :data:`NON_FINITE_STATUSES`), the 422 body is strict JSON,
    and the connection stays usable (:func:`_connection_problem`). Other requests:
    skipped (returns True).

    Raises:
        AssertionError: one of those does not hold (schemathesis records a failure).
    """
    req = response.request
    found = non_finite_sent(case.operation, req.url, req.body)
    if found is None:
        return True
    place, text = found
    status = response.status_code
    if status not in NON_FINITE_STATUSES:
        raise AssertionError(f"{text} in the {place} answered {status}; expected 422")
    problem = _strict_json_problem(response.content) if status == 422 else None
    problem = problem or _connection_problem(req, status)
    if problem:
        raise AssertionError(f"{text} in the {place}: {problem}")
    return None


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
        non_finite_share: share of cases :func:`inject_non_finite` was asked to rewrite.
        non_finite_cases: answered requests that held a non-finite number
            (:func:`non_finite_sent` on what was sent; part of ``requests``).
        non_finite_server_errors: those answered with a 5xx (part of ``server_errors``).
        non_finite_statuses: their answers, ``{"POST /retrieve": {"422": n}, ...}``.
        non_finite_places: their count by place (``body``, ``body (nested)``, ``query``).
        non_finite_numbers: their count by number text (``NaN``, ``1e400``...).
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
    non_finite_share: float = 0.0
    non_finite_cases: int = 0
    non_finite_server_errors: int = 0
    non_finite_statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    non_finite_places: dict[str, int] = field(default_factory=dict)
    non_finite_numbers: dict[str, int] = field(default_factory=dict)

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
                mode: str = "all", max_time_s: int | None = None, non_finite_share: float = 0.2) -> FuzzReport:
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
        non_finite_share: share of generated cases rewritten to hold a non-finite number
            (:func:`inject_non_finite`), 0..1; 0: none. :func:`non_finite_rejected`
            checks every request holding one, whatever the share.

    Returns:
        A :class:`FuzzReport`.

    Raises:
        ConfigError: schemathesis is not installed, or ``non_finite_share`` is not in 0..1.
    """
    import time

    try:
        import schemathesis
        from schemathesis.config import SchemathesisConfig
        from schemathesis.engine import events, from_schema
    except ImportError as e:
        raise ConfigError("API fuzzing needs schemathesis: pip install -e '.[test]'") from e
    if not (isinstance(non_finite_share, (int, float)) and 0 <= non_finite_share <= 1):
        raise ConfigError(f"non_finite_share must be between 0 and 1, got {non_finite_share!r}.")
    schemathesis.check(non_finite_rejected)  # idempotent: the registry is keyed by name

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
    report = FuzzReport(base_url=base_url, seed=seed, max_examples=max_examples,
                        non_finite_share=float(non_finite_share))
    t0 = time.perf_counter()
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config)
    if non_finite_share:
        @schema.hook("map_case")
        def map_case(context, case):
            return inject_non_finite(case, share=non_finite_share, seed=seed)

    statuses: dict[str, Counter] = {}
    nf_statuses: dict[str, Counter] = {}
    nf_places: Counter = Counter()
    nf_numbers: Counter = Counter()
    for ev in from_schema(schema).execute():
        if isinstance(ev, events.ScenarioFinished):
            rec = ev.recorder
            op = rec.label
            report.cases += len(rec.cases)
            report.cases_by_operation[op] = report.cases_by_operation.get(op, 0) + len(rec.cases)
            for case_id, inter in rec.interactions.items():
                if inter.response is None:
                    continue
                report.requests += 1
                code = inter.response.status_code
                statuses.setdefault(op, Counter())[str(code)] += 1
                if code >= 500:
                    report.server_errors += 1
                node = rec.cases.get(case_id)
                found = non_finite_sent(node.value.operation, inter.request.uri, inter.request.body) if node else None
                if found is not None:
                    report.non_finite_cases += 1
                    nf_statuses.setdefault(op, Counter())[str(code)] += 1
                    nf_places[found[0]] += 1
                    nf_numbers[found[1]] += 1
                    if code >= 500:
                        report.non_finite_server_errors += 1
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
    report.non_finite_statuses = {op: dict(sorted(c.items())) for op, c in sorted(nf_statuses.items())}
    report.non_finite_places = dict(sorted(nf_places.items()))
    report.non_finite_numbers = dict(sorted(nf_numbers.items()))
    report.elapsed_s = round(time.perf_counter() - t0, 2)
    return report


def fuzz_cli_server(cli_args: list[str], *, max_examples: int = 250, seed: int = 0,
                    api_key: str | None = None, env: dict[str, str] | None = None,
                    non_finite_share: float = 0.2) -> FuzzReport:
    """Start the real ``drgym serve CLI_ARGS`` (uvicorn, its own process, a free loopback
    port; ``--api-keys API_KEY`` added when a key is given), fuzz it with
    :func:`fuzz_server` (``non_finite_share`` passed on), and stop it.

    Raises:
        RuntimeError, TimeoutError: the server did not start (see
            :func:`server_helpers.running_server`).
    """
    from server_helpers import running_server

    args = list(cli_args) + (["--api-keys", api_key] if api_key else [])
    with running_server(cli_args=args, env=env) as srv:
        return fuzz_server(srv.url, max_examples=max_examples, seed=seed, api_key=api_key,
                           non_finite_share=non_finite_share)


def summarize(reports: list[FuzzReport]) -> dict[str, Any]:
    """Totals over several runs: ``cases``, ``requests``, ``server_errors``, ``failures``,
    ``errors``, ``non_finite_cases``, ``non_finite_server_errors``, statuses per operation
    (all answers, and those to non-finite numbers) and the operations covered."""
    statuses: dict[str, Counter] = {}
    nf_statuses: dict[str, Counter] = {}
    places: Counter = Counter()
    for r in reports:
        for op, c in r.statuses.items():
            statuses.setdefault(op, Counter()).update(c)
        for op, c in r.non_finite_statuses.items():
            nf_statuses.setdefault(op, Counter()).update(c)
        places.update(r.non_finite_places)
    return {
        "cases": sum(r.cases for r in reports),
        "requests": sum(r.requests for r in reports),
        "server_errors": sum(r.server_errors for r in reports),
        "failures": sum(len(r.failures) for r in reports),
        "errors": sum(len(r.errors) for r in reports),
        "operations": sorted(set().union(*(r.operations for r in reports))) if reports else [],
        "statuses": {op: dict(sorted(c.items())) for op, c in sorted(statuses.items())},
        "non_finite_cases": sum(r.non_finite_cases for r in reports),
        "non_finite_server_errors": sum(r.non_finite_server_errors for r in reports),
        "non_finite_places": dict(sorted(places.items())),
        "non_finite_statuses": {op: dict(sorted(c.items())) for op, c in sorted(nf_statuses.items())},
    }
