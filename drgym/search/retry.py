"""Retries as a :class:`~drgym.config.RetryPolicy` says, and HTTP calls with clear errors.

:func:`retrying` is drgym's one retry loop (tenacity): the HTTP calls below, the MCP
backend, the ``openai:`` policy and its reachability check, and the judges all retry
through it, with the same backoff, jitter and log line.

:func:`send_with_retries`, shared by the HTTP search client, the web backends
(:mod:`drgym.search.web`) and the page fetcher (:mod:`drgym.search.pages`):

- 429 and 5xx answers, timeouts and connection failures are retried with exponential
  backoff plus jitter, as a :class:`~drgym.config.RetryPolicy` says; a 429/503
  ``Retry-After`` header (seconds or HTTP date) is honoured instead of the backoff, unless
  it asks for longer than the policy's ``max_retry_after_s`` (then the call fails at once
  rather than stalling a rollout).
- 401/403 raise :class:`~drgym.errors.AuthError` naming the environment variable that
  holds the key.
- After the last attempt a :class:`~drgym.errors.BackendUnavailableError` says what
  failed (status, timeout, connection) and how many attempts were made.

The API key is never put into an error message or a log line: an answer body that
echoes it (some providers quote the key they refused) has it masked
(:func:`drgym.redact.scrub` with the request's secret headers).
"""

from __future__ import annotations

import email.utils
import logging
import os
import time
from datetime import datetime, timezone
from typing import Any, Callable, Union

import httpx
import tenacity

from drgym.config import RetryPolicy
from drgym.errors import AuthError, BackendUnavailableError, ConfigError
from drgym.redact import header_secrets, scrub

log = logging.getLogger(__name__)

RECONNECT_ENV = "DRGYM_RECONNECT_S"
DEFAULT_RECONNECT_S = 60.0


def default_reconnect_s() -> float:
    """How long a client keeps retrying a service that answered before and then went
    away (a server being restarted), in seconds: ``$DRGYM_RECONNECT_S``, else 60.

    Used by the HTTP search client, the MCP backend, the ``openai:`` policy and the
    judges when their :class:`~drgym.config.RetryPolicy` leaves ``reconnect_s`` unset.

    Raises:
        ConfigError: the variable is not a number >= 0.
    """

    raw = os.environ.get(RECONNECT_ENV, "").strip()
    if not raw:
        return DEFAULT_RECONNECT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"{RECONNECT_ENV} must be a number of seconds >= 0, got {raw!r}.")
    return value


class RetryableHTTPError(BackendUnavailableError):
    """An HTTP 429 or 5xx answer (retried, then raised as is).

    Attributes:
        status: the HTTP status code.
        retry_after: seconds the server asked to wait (``Retry-After``), or None.
    """

    def __init__(self, message: str, status: int = 0, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 §10.2.3).

    Args:
        value: the header: delay-seconds (``"3"``) or an HTTP date.
        now: POSIX time to measure a date against (default: now).

    Returns:
        A non-negative number of seconds, or None when absent or unparsable.
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    ref = datetime.fromtimestamp(time.time() if now is None else now, tz=timezone.utc)
    return max(0.0, (when - ref).total_seconds())


def _body_excerpt(resp: httpx.Response, n: int = 200) -> str:
    try:
        text = resp.text
    except Exception:  # a streamed body not read yet, or undecodable
        return ""
    text = " ".join(text.split())
    return text[:n] + ("…" if len(text) > n else "")


def with_reconnect(retry: RetryPolicy) -> RetryPolicy:
    """``retry`` with ``reconnect_s`` filled in from :func:`default_reconnect_s` when unset.

    Raises:
        ConfigError: ``$DRGYM_RECONNECT_S`` is not a number >= 0.
    """
    return retry if retry.reconnect_s is not None else retry.model_copy(update={"reconnect_s": default_reconnect_s()})


RetryOn = Union[type[BaseException], tuple[type[BaseException], ...], Callable[[BaseException], bool]]
"""What :func:`retrying` retries: an exception type, a tuple of them, or a predicate."""


def retrying(
    policy: RetryPolicy,
    *,
    name: str,
    retry_on: RetryOn,
    min_elapsed_s: float = 0.0,
    stop: Callable[[tenacity.RetryCallState], bool] | None = None,
    wait_for: Callable[[BaseException], float | None] | None = None,
    jitter: bool = True,
) -> tenacity.Retrying:
    """A tenacity ``Retrying`` that retries as ``policy`` says: drgym's one retry loop.

    - Stop: after ``policy.attempts`` tries; with ``min_elapsed_s`` > 0, not before that
      many seconds have passed since the first try either (a service being restarted).
    - Wait before retry ``n`` (1, 2, ...): ``policy.backoff_s * 2 ** (n - 1)`` seconds,
      capped at ``policy.max_backoff_s``, plus a uniform random jitter of up to
      ``policy.backoff_s`` seconds (so that concurrent callers do not retry in step).
    - Log: one warning per retry, ``"<name>: attempt <n> failed (<error>); retrying in
      <s> s"``.
    - The last failure is raised as is (``reraise``); a failure ``retry_on`` does not
      match is raised at once.

    Use it as ``retrying(...)(fn)`` or ``for attempt in retrying(...): with attempt: ...``;
    its ``statistics`` (``attempt_number``, ``delay_since_first_attempt``) say how many
    tries were made.

    Args:
        policy: tries, backoff and its cap (``timeout_s``, ``max_retry_after_s`` and
            ``reconnect_s`` are the caller's to apply).
        name: who retries, in the log line (``"serper"``, ``"judge gpt-4.1-mini"``).
        retry_on: the failures to retry: an exception type, a tuple of them, or a
            predicate on the exception.
        min_elapsed_s: keep retrying until at least this many seconds have passed, even
            after ``policy.attempts`` tries; 0 stops after the attempts.
        stop: a tenacity stop rule replacing the one above (a judge stops at once when
            another request found its endpoint down).
        wait_for: seconds a failure asks to wait instead of the backoff (an HTTP
            ``Retry-After``), or None to back off as usual.
        jitter: False leaves the jitter out (a single probe that nothing else retries
            alongside: its waits are exactly the backoff).

    Returns:
        The ``tenacity.Retrying`` object (one per call: its statistics are that call's).

    Raises:
        ValueError: ``retry_on`` is neither an exception type, a tuple of them, nor callable.
    """
    def is_error_type(t: Any) -> bool:
        return isinstance(t, type) and issubclass(t, BaseException)

    if is_error_type(retry_on) or (isinstance(retry_on, tuple) and retry_on and all(map(is_error_type, retry_on))):
        retry = tenacity.retry_if_exception_type(retry_on)
    elif callable(retry_on):
        retry = tenacity.retry_if_exception(retry_on)
    else:
        raise ValueError(f"retry_on must be an exception type, a tuple of them or a predicate, got {retry_on!r}.")
    backoff: Any = tenacity.wait_exponential(multiplier=policy.backoff_s, max=policy.max_backoff_s)
    if jitter and policy.backoff_s > 0:
        backoff = backoff + tenacity.wait_random(0, policy.backoff_s)

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        asked = wait_for(exc) if (wait_for is not None and exc is not None) else None
        return float(asked) if asked is not None else float(backoff(state))

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("%s: attempt %d failed (%s); retrying in %.2g s", name, state.attempt_number, exc, pause)

    if stop is None:
        stop = tenacity.stop_after_attempt(policy.attempts)
        if min_elapsed_s > 0:
            stop = stop & tenacity.stop_after_delay(min_elapsed_s)
    return tenacity.Retrying(stop=stop, wait=wait, retry=retry, before_sleep=before_sleep, reraise=True)


def send_with_retries(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    backend: str,
    env_var: str | None = None,
    retry: RetryPolicy | None = None,
    min_elapsed_s: float = 0.0,
    stream: bool = False,
    **request_kwargs: Any,
) -> httpx.Response:
    """Send one HTTP request, retrying transient failures.

    Args:
        client: the httpx client.
        method, url: the request line.
        backend: backend name used in error messages (``"serper"``).
        env_var: the environment variable holding the key, named in an AuthError.
        retry: tries, per-attempt timeout (``timeout_s``, unless ``request_kwargs`` gives
            a ``timeout``), backoff (``backoff_s``, doubling per retry plus up to
            ``backoff_s`` of jitter, capped at ``max_backoff_s``) and the longest
            ``Retry-After`` honoured (``max_retry_after_s``; a longer one fails at once).
            None: ``RetryPolicy()``. Its ``reconnect_s`` is not used here: callers pass
            ``min_elapsed_s``.
        min_elapsed_s: keep retrying until at least this many seconds have passed since
            the first try, even after ``retry.attempts`` tries (e.g. to wait for a server
            that answered before and is being restarted); 0 stops after the attempts.
        stream: return a streaming response (the caller must close it).
        request_kwargs: passed to ``client.build_request`` (``headers``, ``params``, ``json``,
            ``timeout``).

    Returns:
        The response of the first attempt that was not 401/403/429/5xx. Other 4xx
        answers are returned for the caller to interpret (404 on a fetch, 400 on a search).

    Raises:
        AuthError: 401 or 403.
        BackendUnavailableError: still 429/5xx, timing out or unreachable after
            ``retry.attempts`` tries and ``min_elapsed_s`` seconds (or a Retry-After beyond
            ``retry.max_retry_after_s``); the message gives the number of tries made.
    """
    retry = retry or RetryPolicy()
    attempts, max_retry_after_s = retry.attempts, retry.max_retry_after_s
    request_kwargs.setdefault("timeout", httpx.Timeout(retry.timeout_s))

    def asked_wait(exc: BaseException) -> float | None:
        return exc.retry_after if isinstance(exc, RetryableHTTPError) else None

    def should_retry(exc: BaseException) -> bool:
        if isinstance(exc, RetryableHTTPError):
            return exc.retry_after is None or exc.retry_after <= max_retry_after_s
        return isinstance(exc, (httpx.TimeoutException, httpx.TransportError))

    def once() -> httpx.Response:
        request = client.build_request(method, url, **request_kwargs)
        secrets = header_secrets(request.headers)  # a body that echoes the key must not carry it on
        resp = client.send(request, stream=stream)
        status = resp.status_code
        if status in (401, 403):
            if stream:
                resp.read()
            resp.close()
            who = f"; set {env_var} to a valid key" if env_var else ""
            raise AuthError(scrub(
                f"{backend}: the API refused the credentials (HTTP {status}){who}. Server said: {_body_excerpt(resp)!r}",
                secrets))
        if status == 429 or status >= 500:
            retry_after = parse_retry_after(resp.headers.get("retry-after"))
            if stream:
                resp.read()
            resp.close()
            raise RetryableHTTPError(
                scrub(f"{backend}: HTTP {status} from {url}"
                      + (f" (Retry-After {retry_after:g} s)" if retry_after is not None else "")
                      + f": {_body_excerpt(resp)!r}", secrets),
                status=status,
                retry_after=retry_after,
            )
        return resp

    loop = retrying(retry, name=backend, retry_on=should_retry, min_elapsed_s=min_elapsed_s, wait_for=asked_wait)
    try:
        return loop(once)
    except (RetryableHTTPError, httpx.TransportError) as e:  # TransportError covers the timeouts
        made = int(loop.statistics.get("attempt_number") or attempts)
        tries = f"{made} attempt(s)"
        if min_elapsed_s > 0:
            tries += f" over {float(loop.statistics.get('delay_since_first_attempt') or 0.0):.0f} s"
        if isinstance(e, RetryableHTTPError):
            if e.retry_after is not None and e.retry_after > max_retry_after_s:
                raise RetryableHTTPError(
                    f"{e} — gave up: the server asks to wait longer than max_retry_after_s={max_retry_after_s:g} s.",
                    e.status,
                    e.retry_after,
                ) from e
            raise RetryableHTTPError(f"{e} — still failing after {tries}.", e.status, e.retry_after) from e
        if isinstance(e, httpx.TimeoutException):
            raise BackendUnavailableError(f"{backend}: {method} {url} timed out ({type(e).__name__}) on all {tries}.") from e
        raise BackendUnavailableError(f"{backend}: could not reach {url} ({type(e).__name__}: {e}) after {tries}.") from e
