"""The one :class:`Judge` interface: chat messages in, a pydantic-validated verdict out.

A judge renders a versioned :class:`PromptTemplate` into chat messages, asks its backend
(an OpenAI-compatible endpoint, :mod:`drgym.judges.openai`, or a local transformers
model, :mod:`drgym.judges.local`) for a completion, extracts the JSON object from the
text and validates it against the template's pydantic verdict model.

Robustness contract (DeepResearchGym and DeepResearch Bench retry judge calls the same
way: ``cxcscmu/deepresearch_benchmarking`` ``eval_kpr_async.py`` and
``Ayanami0730/deep_research_bench`` ``deepresearch_bench_race.py``):

- malformed JSON, missing or out-of-range fields, refusals (no JSON at all), timeouts
  and 429/5xx answers are retried with exponential backoff and jitter
  (:func:`drgym.search.retry.retrying`), as the judge's
  ``retry`` (:class:`~drgym.config.RetryPolicy`) says;
- an endpoint that cannot be reached at all (connection refused or reset) is retried
  the same way, and, once it has answered before, for at least ``retry.reconnect_s`` seconds
  (a judge server being restarted); if it is still down, :meth:`Judge.judge_many`
  raises :class:`JudgeUnavailableError` (a
  :class:`~drgym.errors.ServiceUnavailableError`) instead of recording a failure per
  request: ``drgym evaluate`` and ``drgym rollout`` stop, the verdicts so far are in the
  cache, and rerunning the command resumes from there;
- after ``retry.attempts`` the request becomes a *recorded failure*: a
  :class:`JudgeResult` with ``ok == False`` and an ``error`` string. Rewards exclude it
  (score ``None``) and count it in ``RewardOutput.failures``; nothing crashes and
  nothing silently becomes 0;
- every valid verdict is stored in a persistent SQLite :class:`VerdictCache` keyed by
  judge model, template name + version, rendered messages and sampling settings, so a
  rerun is free and gives identical verdicts. Failures are not cached (a rerun retries).

Concurrency: :meth:`Judge.judge_many` runs the requests of a batch in a thread pool of
at most ``max_concurrency`` workers (HTTP backends are I/O bound; the local backend
serialises generation behind a lock). :meth:`Judge.ajudge_many` is the asyncio form.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import json
import logging
import re
import string
import threading
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.errors import ConfigError, JudgeError, ServiceUnavailableError
from drgym.judges.cache import VerdictCache
from drgym.models import SMOLLM2_ALIASES
from drgym.reasoning import strip_reasoning  # the one reasoning rule, shared with the action parser
from drgym.search.retry import retrying, with_reconnect

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]


class JudgeOutputError(JudgeError):
    """The judge answered, but the text holds no valid verdict (retryable)."""


class JudgeTransportError(JudgeError):
    """The judge backend did not answer: timeout, connection error, HTTP 429/5xx (retryable)."""


class JudgeUnreachableError(JudgeTransportError):
    """The judge endpoint refused or dropped the connection (retryable; see ``retry.reconnect_s``)."""


class JudgeUnavailableError(ServiceUnavailableError, JudgeError):
    """The judge endpoint stayed unreachable through its retries: the run stops (the
    verdicts so far are cached, so rerunning the command resumes)."""


# ---------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTemplate:
    """A versioned judge prompt with its verdict schema.

    Attributes:
        name: stable template name (``"kpr"``, ``"citation_support"``...).
        version: bumped whenever the wording or schema changes; part of the cache key.
        system: system message (``str.format`` fields allowed).
        user: user message with ``{field}`` placeholders filled from the inputs.
        verdict: pydantic model the JSON answer must validate against.
        prefill: start of the assistant's answer for backends that can pre-fill it
            (the local judge), e.g. ``'{"label": "'`` for a flat one-field verdict; ""
            for none. A non-empty prefill also means the verdict is a flat object that
            ends at the first ``}``. Not part of the cache key of API judges.
    """

    name: str
    version: str
    system: str
    user: str
    verdict: type[BaseModel]
    prefill: str = ""

    @property
    def fields(self) -> set[str]:
        """Placeholder names used by ``system`` and ``user``."""

        out = set()
        for text in (self.system, self.user):
            out |= {f for _, f, _, _ in string.Formatter().parse(text) if f}
        return out

    def render(self, **inputs: Any) -> Messages:
        """Fill the placeholders and return ``[{"role": "system", ...}, {"role": "user", ...}]``.

        Raises:
            ConfigError: a placeholder has no input.
        """
        missing = self.fields - set(inputs)
        if missing:
            raise ConfigError(f"Template {self.name!r} needs inputs {sorted(missing)}, got {sorted(inputs)}.")
        return [
            {"role": "system", "content": self.system.format(**inputs)},
            {"role": "user", "content": self.user.format(**inputs)},
        ]

    @property
    def tag(self) -> str:
        """``"name@version"``, recorded with every score."""
        return f"{self.name}@{self.version}"


@dataclass
class JudgeRequest:
    """One judge call to make: a template and the inputs that fill it."""

    template: PromptTemplate
    inputs: dict[str, Any]


@dataclass
class JudgeResult:
    """The outcome of one request.

    Attributes:
        verdicts: one validated verdict per sample (``n_samples`` of them) when ok,
            else empty.
        error: why the request failed after all retries, else None.
        attempts: backend calls made (0 when everything came from the cache).
        cached: number of samples served from the cache.
        raw: the raw completion texts (last attempt), for debugging.
    """

    verdicts: list[BaseModel] = field(default_factory=list)
    error: str | None = None
    attempts: int = 0
    cached: int = 0
    raw: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every sample produced a valid verdict."""
        return self.error is None and bool(self.verdicts)

    @property
    def verdict(self) -> BaseModel | None:
        """The first sample's verdict (the only one at ``n_samples=1``), or None on failure."""
        return self.verdicts[0] if self.ok else None

    def mean(self, fn: Callable[[Any], float]) -> float | None:
        """Average ``fn(verdict)`` over the samples; None on failure."""
        if not self.ok:
            return None
        vals = [float(fn(v)) for v in self.verdicts]
        return sum(vals) / len(vals)


# ---------------------------------------------------------------------------------------
# JSON extraction
# ---------------------------------------------------------------------------------------

_JSON_START = re.compile(r"[{\[]")


def json_values(text: str) -> list[Any]:
    r"""Every top-level JSON object or array in ``text``, in order of position.

    Scans for ``{`` / ``[`` and decodes a complete value from each; a decoded value's
    inside is not scanned again (so a nested object is not a separate value). Prose,
    markdown fences and citation markers such as ``[1]`` around the values are skipped
    over (``[1]`` is itself a value: callers filter by what validates).

    >>> json_values('as in source [1]. ```json\n{"score": 1, "why": "[2]"}\n``` {oops}')
    [[1], {'score': 1, 'why': '[2]'}]
    """
    dec = json.JSONDecoder()
    out: list[Any] = []
    pos = 0
    while True:
        m = _JSON_START.search(text, pos)
        if m is None:
            return out
        try:
            val, end = dec.raw_decode(text, m.start())
        except json.JSONDecodeError:
            pos = m.start() + 1
            continue
        out.append(val)
        pos = end


def extract_json(text: str) -> Any:
    """Return the first JSON object or array of a judge's text, outside reasoning blocks.

    Accepts plain JSON, JSON inside a markdown fence, or JSON surrounded by prose.
    :func:`parse_verdict` is what judges use: it prefers the last value that validates.

    Raises:
        JudgeOutputError: no decodable JSON value (malformed output or a refusal).
    """
    if not isinstance(text, str) or not text.strip():
        raise JudgeOutputError("empty judge output")
    values = json_values(strip_reasoning(text))
    if values:
        return values[0]
    snippet = text.strip().replace("\n", " ")[:120]
    raise JudgeOutputError(f"no JSON object in judge output (malformed or refusal): {snippet!r}")


def parse_verdict(text: str, model: type[BaseModel]) -> BaseModel:
    r"""The judge's verdict in ``text``, validated as ``model``.

    Reasoning blocks are removed first (:func:`strip_reasoning`). Of the JSON values left
    (:func:`json_values`), the LAST object that validates against ``model`` wins: a judge
    writes its final verdict last, after prose that may cite sources as ``[1]`` or quote
    an earlier guess. A bare list is accepted only when no object validates, and only for
    a model whose one required field is a list (it is wrapped as ``{field: list}``).

    >>> from drgym.judges.prompts import SoftMatchVerdict
    >>> parse_verdict('Names Paris, as in source [1]. {"score": 1, "justification": "same city"}', SoftMatchVerdict).score
    1.0
    >>> parse_verdict('<think>First guess {"score": 0}; but it does name Paris.</think>\n{"score": 1}', SoftMatchVerdict).score
    1.0

    Raises:
        JudgeOutputError: empty text, no JSON outside reasoning, or no value that validates
            (the message names the last candidate's first validation error).
    """
    if not isinstance(text, str) or not text.strip():
        raise JudgeOutputError("empty judge output")
    body = strip_reasoning(text)
    values = json_values(body)
    if not values:
        snippet = text.strip().replace("\n", " ")[:120]
        where = "outside the reasoning block " if body.strip() != text.strip() else ""
        raise JudgeOutputError(f"no JSON object {where}in judge output (malformed or refusal): {snippet!r}")
    req = [n for n, f in model.model_fields.items() if f.is_required()]
    list_field = req[0] if len(req) == 1 and _is_list_field(model, req[0]) else None
    candidates = [v for v in values if isinstance(v, dict)][::-1]
    if list_field is not None:
        candidates += [{list_field: v} for v in values if isinstance(v, list)][::-1]
    last_error: ValidationError | None = None
    for obj in candidates:
        try:
            return model.model_validate(obj)
        except ValidationError as e:
            last_error = last_error or e
    if last_error is None:
        raise JudgeOutputError(f"verdict does not match {model.__name__}: the output holds no JSON object, only {values[-1]!r}")
    first = last_error.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    raise JudgeOutputError(f"verdict does not match {model.__name__}: {loc}: {first.get('msg')}") from None


def _is_list_field(model: type[BaseModel], name: str) -> bool:
    ann = model.model_fields[name].annotation
    return ann is list or typing.get_origin(ann) is list


# ---------------------------------------------------------------------------------------
# The judge
# ---------------------------------------------------------------------------------------


class Judge(abc.ABC):
    """Base class of judge backends.

    Subclasses implement :meth:`complete` (one chat completion, raising
    :class:`JudgeTransportError` on a retryable backend failure) and set ``model_id``.

    Args:
        cache: a :class:`~drgym.judges.cache.VerdictCache`, a path to its SQLite file,
            None for the default ``$DRGYM_HOME/judge_cache.sqlite``, or False for none.
        n_samples: samples per request; numeric verdicts are averaged by the caller
            (:meth:`JudgeResult.mean`). With ``temperature == 0`` all samples are equal.
        temperature: sampling temperature (0 = greedy, the default everywhere).
        retry: a :class:`~drgym.config.RetryPolicy` or its fields; unset fields keep the
            class's ``DEFAULT_RETRY``. ``attempts``: tries per sample before the request
            is a recorded failure (3); ``backoff_s``: first wait between tries, seconds,
            doubling up to ``max_backoff_s``, plus up to ``backoff_s`` of jitter (1 s up
            to 30 s; 0 for the local judge);
            ``timeout_s``: seconds per request of an endpoint (120); ``reconnect_s``: once
            the endpoint has answered, an unreachable endpoint is retried for at least
            this many seconds before :class:`JudgeUnavailableError` (default
            ``$DRGYM_RECONNECT_S``, else 60).
        max_concurrency: worker threads of :meth:`judge_many`.
        max_tokens: completion length limit, in tokens.

    Attributes:
        model_id: ``"<backend>:<model>"``, part of the cache key and of every score record.
        retry: the :class:`~drgym.config.RetryPolicy` in use (every field set).
        stats: counters ``calls``, ``cache_hits``, ``failures``, ``retries``.

    Raises:
        ConfigError: ``n_samples`` or ``max_concurrency`` below 1, or a bad ``retry``.
    """

    DEFAULT_RETRY = RetryPolicy(attempts=3, timeout_s=120.0, backoff_s=1.0, max_backoff_s=30.0)
    """A judge's retries when ``retry`` leaves a field unset."""

    model_id: str = "judge"
    cache_salt: str = ""
    """Backend settings that change verdicts beyond model and template (part of the cache key)."""

    def __init__(
        self,
        *,
        cache: Any = None,
        n_samples: int = 1,
        temperature: float = 0.0,
        retry: RetryLike = None,
        max_concurrency: int = 8,
        max_tokens: int = 1024,
    ) -> None:
        if n_samples < 1:
            raise ConfigError(f"n_samples must be >= 1, got {n_samples}.")
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}.")
        if cache is False:
            self.cache = None
        elif isinstance(cache, VerdictCache):
            self.cache = cache
        else:
            self.cache = VerdictCache(cache)
        self.n_samples = int(n_samples)
        self.temperature = float(temperature)

        self.retry = with_reconnect(resolve_retry(retry, self.DEFAULT_RETRY))
        self.max_concurrency = int(max_concurrency)
        self.max_tokens = int(max_tokens)
        self.stats = {"calls": 0, "cache_hits": 0, "failures": 0, "retries": 0}
        self._stats_lock = threading.Lock()
        self._answered = False  # the endpoint has answered once (then retry.reconnect_s applies)
        self._down: JudgeUnavailableError | None = None  # set once the endpoint is given up on

    # -- backend ------------------------------------------------------------------------
    @abc.abstractmethod
    def complete(
        self, messages: Messages, *, temperature: float, seed: int, attempt: int, template: PromptTemplate | None = None
    ) -> str:
        """Return the assistant text for ``messages``.

        Args:
            messages: chat messages (``role``/``content`` dicts).
            temperature: sampling temperature.
            seed: sample index (0..n_samples-1), used as the sampling seed where possible.
            attempt: 1-based attempt number (backends may vary sampling on retries).
            template: the template rendered into ``messages`` (for its ``prefill``).

        Raises:
            JudgeTransportError: timeout, connection failure, HTTP 429/5xx.
        """

    def close(self) -> None:
        """Release backend resources. Idempotent."""

    # -- public API ---------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Settings to record next to scores: model id, temperature, samples, and validity.

        ``valid`` is False (with a ``note``) for a judge drgym has measured as no judge
        (:func:`judge_validity`); its scores test the plumbing and must not be read as results.
        """
        valid, note = judge_validity(self)
        d: dict[str, Any] = {"model": self.model_id, "temperature": self.temperature, "n_samples": self.n_samples, "valid": valid}
        if note:
            d["note"] = note
        return d

    def judge(self, template: PromptTemplate, **inputs: Any) -> JudgeResult:
        """Judge one request (see :meth:`judge_many`)."""
        return self.judge_many([JudgeRequest(template, inputs)])[0]

    def judge_many(
        self,
        requests: list[JudgeRequest],
        *,
        max_concurrency: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[JudgeResult]:
        """Judge a batch concurrently; one :class:`JudgeResult` per request, in order.

        Never raises for a bad judge answer or a backend timeout: those become failed
        results. Raises for programming/config errors (a template input missing) and
        :class:`JudgeUnavailableError` when the endpoint stays unreachable (the other
        requests of the batch then stop at once; the next call tries the endpoint again).
        """
        if not requests:
            return []
        self._down = None
        workers = min(max_concurrency or self.max_concurrency, len(requests))
        if workers == 1:
            out = []
            for r in requests:
                out.append(self._judge_one(r))
                if progress:
                    progress(1)
            return out
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge") as pool:
            futs = [pool.submit(self._judge_one, r) for r in requests]
            out = []
            for f in futs:
                out.append(f.result())
                if progress:
                    progress(1)
            return out

    async def ajudge_many(self, requests: list[JudgeRequest], *, max_concurrency: int | None = None) -> list[JudgeResult]:
        """Asyncio form of :meth:`judge_many` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.judge_many, requests, max_concurrency=max_concurrency)

    # -- internals ----------------------------------------------------------------------
    def _bump(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] += n

    def cache_key(self, template: PromptTemplate, messages: Messages, sample: int) -> str:
        """SHA-256 over judge model, template name+version, messages and sampling settings."""
        payload = {
            "model": self.model_id,
            "template": template.name,
            "version": template.version,
            "messages": messages,
            "sample": sample,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "salt": self.cache_salt,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _judge_one(self, req: JudgeRequest) -> JudgeResult:
        messages = req.template.render(**req.inputs)
        res = JudgeResult()
        for s in range(self.n_samples):
            key = self.cache_key(req.template, messages, s)
            hit = self.cache.get(key) if self.cache is not None else None
            if hit is not None:
                try:
                    # the stored raw text is parsed again, so verdicts cached by an older
                    # parser (one that took a [1] marker or a first guess) follow the current one
                    raw = hit.get("raw") or ""
                    v = parse_verdict(raw, req.template.verdict) if raw else req.template.verdict.model_validate(hit["verdict"])
                    res.verdicts.append(v)
                    res.raw.append(raw)
                    res.cached += 1
                    self._bump("cache_hits")
                    continue
                except (ValidationError, JudgeOutputError) as e:
                    log.warning("cached verdict for %s no longer parses (%s); re-judging", req.template.tag, e)
            try:
                verdict, raw, attempts = self._sample(req.template, messages, s)
            except JudgeUnreachableError as e:
                with self._stats_lock:
                    if self._down is None:
                        self._down = JudgeUnavailableError(
                            f"judge {self.model_id} is unreachable: {e} (after {self.retry.attempts} attempt(s)"
                            + (f" and {self.retry.reconnect_s:g} s of retries" if self._answered else "") + ")")
                raise self._down from e
            except JudgeError as e:
                self._bump("failures")
                log.warning("judge %s failed on %s after %d attempts: %s", self.model_id, req.template.tag, self.retry.attempts, e)
                return JudgeResult(error=f"{type(e).__name__}: {e}", attempts=res.attempts + self.retry.attempts, cached=res.cached, raw=res.raw)
            res.attempts += attempts
            res.verdicts.append(verdict)
            res.raw.append(raw)
            if self.cache is not None:
                self.cache.put(
                    key,
                    model=self.model_id,
                    template=req.template.tag,
                    verdict=verdict.model_dump(mode="json"),
                    raw=raw,
                )
        return res

    def _stop(self, state: Any) -> bool:
        """Tenacity stop rule: ``retry.attempts`` tries; an unreachable endpoint that has
        answered before is retried until ``retry.reconnect_s`` have passed; a judge already
        given up on (another request found it down) stops at once."""
        if self._down is not None:
            return True
        if state.attempt_number < self.retry.attempts:
            return False
        exc = state.outcome.exception() if state.outcome is not None else None
        return not (isinstance(exc, JudgeUnreachableError) and self._answered
                    and state.seconds_since_start < float(self.retry.reconnect_s or 0.0))

    def _sample(self, template: PromptTemplate, messages: Messages, sample: int) -> tuple[BaseModel, str, int]:
        loop = retrying(self.retry, name=f"judge {self.model_id} ({template.tag})",
                        retry_on=(JudgeOutputError, JudgeTransportError), stop=self._stop)
        for attempt in loop:
            with attempt:
                if self._down is not None:
                    raise JudgeUnreachableError(str(self._down))
                n = attempt.retry_state.attempt_number
                if n > 1:
                    self._bump("retries")
                self._bump("calls")
                raw = self.complete(messages, temperature=self.temperature, seed=sample, attempt=n, template=template)
                self._answered = True
                return parse_verdict(raw, template.verdict), raw, n
        raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------------------------------
# Judge validity
# ---------------------------------------------------------------------------------------

NOT_A_VALID_JUDGE = (
    "not a valid judge: SmolLM2-135M agrees with gpt-4.1-mini no better than chance (Cohen's kappa 0.0 on "
    "DeepResearchGym key points, README 'Rewards and judges'); its scores test the plumbing, they are not results"
)


def judge_validity(judge: "Judge | str | None") -> tuple[bool, str]:
    """Whether ``judge`` (a :class:`Judge` or a spec) can be read as a judge, and why not.

    The bundled SmolLM2-135M (``hf:smollm2`` and its aliases) runs end to end but is no
    judge: on one DeepResearchGym query it marked all 40 key points Supported (agreement
    with gpt-4.1-mini 0.875, Cohen's kappa 0.0). Any other model is assumed valid: drgym
    cannot measure it here.

    Returns:
        ``(True, "")``, or ``(False, NOT_A_VALID_JUDGE)``; ``(False, "no judge")`` for None.
    """
    if judge is None:
        return False, "no judge"
    spec = judge.model_id if isinstance(judge, Judge) else str(judge).strip()
    kind, _, rest = spec.partition(":")
    if kind.lower() == "hf":
        if (rest or "smollm2").strip().lower() in SMOLLM2_ALIASES:
            return False, NOT_A_VALID_JUDGE
    return True, ""
