"""``openai:MODEL@BASE_URL``: any OpenAI-compatible chat-completions server as a policy.

Works with ``vllm serve``, OpenAI, OpenRouter, llama.cpp's server... Requests of one
batch run concurrently on a thread pool over one pooled ``httpx.Client``; transport
errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff and jitter
(:func:`drgym.search.retry.retrying`), as the policy's ``retry`` (:class:`~drgym.config.RetryPolicy`) says: ``attempts`` tries, and
once the server has answered, for at least ``reconnect_s`` seconds (a restarting
server). If the endpoint still fails, :meth:`OpenAIPolicy.act` raises
:class:`~drgym.errors.ServiceUnavailableError`: an unreachable model cannot act, so the
rollout stops (finished episodes are kept; rerunning resumes) instead of
recording turns the model never wrote. A request the server refuses (HTTP 4xx, e.g. a
prompt over the context length) or a malformed completion is that turn's failure: an
empty action with ``finish="error"`` in its usage (the env shows a corrective
observation, and the run counts it in ``errors``).

Native function calling (the request's ``tools`` field) is used when ``tools`` is
``"auto"`` or True. With ``"auto"``, a request answered HTTP 400 is sent once more without
``tools``; when the server takes that one, the **episode** (``info["episode_id"]``) goes
on with text tags and every other episode keeps function calling; when it refuses that
too, the 400 was not about tools and the turn is a recorded failure. Replies with
``tool_calls`` are returned as the JSON of the assistant message, which the env's action
parser reads. Every message list sent follows OpenAI's tool-call pairing rule
(:meth:`OpenAIPolicy.to_api_messages`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.envs.parsing import arguments_json
from drgym.envs.tools import DEFAULT_TOOLS, tool_schemas
from drgym.errors import BackendUnavailableError, ConfigError, ServiceUnavailableError
from drgym.policies.base import Conversation, Policy
from drgym.policies.generation import DEFAULT_STOPS, Timer, TokenUsage, close_open_tag
from drgym.search.retry import retrying, with_reconnect

log = logging.getLogger(__name__)


def _text(content: Any) -> str:
    """A message content as text (None -> '', non-strings as JSON)."""
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


class _Retryable(Exception):
    """An HTTP status worth retrying (429, 5xx)."""


class _Refused(BackendUnavailableError):
    """The server refused the request (HTTP 4xx other than 429); ``status`` is the code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``"MODEL@BASE_URL"`` into ``(model, base_url)``.

    ``MODEL`` alone uses ``$OPENAI_BASE_URL`` or ``https://api.openai.com/v1``.

    Raises:
        ConfigError: empty model or a base URL that is not http(s).
    """
    model, _, url = spec.rpartition("@") if "@" in spec else (spec, "", "")
    model = model.strip()
    url = (url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").strip()
    if not model:
        raise ConfigError(f"openai policy spec needs a model name: 'openai:MODEL@BASE_URL', got 'openai:{spec}'.")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"openai base URL must start with http:// or https://, got {url!r}.")
    return model, url.rstrip("/")


class OpenAIPolicy(Policy):
    """Chat-completions client policy (see the module docstring).

    Args:
        model: the server's model name.
        base_url: e.g. ``"http://127.0.0.1:8000/v1"``; ``/chat/completions`` is appended.
        api_key: bearer token; default ``$OPENAI_API_KEY`` (may be empty for local servers).
        tools: ``"auto"`` (function calling, falling back to tags when refused), True
            (function calling only) or False (text tags with stop strings).
        max_tokens: completion budget of one turn.
        temperature: sampling temperature (0 = greedy where the server honours it).
        concurrency: requests in flight at once.
        retry: retries of a request failing for transport reasons (refused, timeout,
            429/5xx) and the timeout of one attempt, a :class:`~drgym.config.RetryPolicy`
            or its fields (``-p 'retry={"attempts": 2}'``); unset fields keep
            :attr:`DEFAULT_RETRY` (4 attempts of 60 s, backoff 0.5 s with jitter doubling up to 8 s;
            once the server has answered, retried for at least ``reconnect_s`` seconds,
            by default ``$DRGYM_RECONNECT_S`` or 60).
        stops: stop strings in text mode (the server drops them; they are re-appended).
        extra_body: extra JSON fields merged into each request (e.g. vLLM's
            ``{"top_k": 1}``).
        enable_thinking: the server-side chat template's thinking switch, sent as
            ``chat_template_kwargs: {"enable_thinking": ...}`` (vLLM, SGLang); None sends
            nothing (the OpenAI API itself rejects unknown fields).

    Attributes:
        retry: the :class:`~drgym.config.RetryPolicy` in use (every field set).
        last_usage: one :class:`~drgym.policies.generation.TokenUsage` per conversation of the
            latest call (server-reported token counts when given).
        native_tools: whether function calling is in use (``tools`` not False).
        text_episodes: ids of the episodes that went on with text tags after a 400.
        n_repairs: changes :meth:`to_api_messages` had to make to follow the pairing
            rule (0 for the env's own conversations).

    Raises:
        ConfigError: ``concurrency`` < 1, a bad ``tools`` or a bad ``retry``.
    """

    DEFAULT_RETRY = RetryPolicy(attempts=4, timeout_s=60.0, backoff_s=0.5, max_backoff_s=8.0)
    """The policy's retries when ``retry`` leaves a field unset."""

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        *,
        api_key: str | None = None,
        tools: bool | str = "auto",
        max_tokens: int = 512,
        temperature: float = 0.0,
        concurrency: int = 8,
        retry: RetryLike = None,
        stops: tuple[str, ...] | list[str] = DEFAULT_STOPS,
        extra_body: dict[str, Any] | None = None,
        enable_thinking: bool | None = None,
    ) -> None:
        if int(concurrency) < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}.")
        if tools not in ("auto", True, False, "true", "false"):
            raise ConfigError(f"tools must be 'auto', true or false, got {tools!r}.")
        self.name = f"openai:{model}@{base_url}"
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.tools_mode = {"true": True, "false": False}.get(tools, tools) if isinstance(tools, str) else tools
        self.native_tools = self.tools_mode is not False
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.concurrency = int(concurrency)

        self.retry = with_reconnect(resolve_retry(retry, self.DEFAULT_RETRY))
        self._answered = False  # the server has answered once (then retry.reconnect_s applies)
        self._down: ServiceUnavailableError | None = None  # set when the endpoint is given up on
        self.stops = tuple(stops)
        self.extra_body = dict(extra_body or {})
        self.enable_thinking = enable_thinking
        if enable_thinking is not None:
            # vLLM's and SGLang's OpenAI servers pass chat_template_kwargs to the model's chat template
            ctk = dict(self.extra_body.get("chat_template_kwargs") or {})
            ctk["enable_thinking"] = bool(enable_thinking)
            self.extra_body["chat_template_kwargs"] = ctk
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=self.retry.timeout_s,
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="drgym-openai")
        self._lock = threading.Lock()
        self.last_usage: list[TokenUsage] = []
        self.n_errors = 0
        self.n_repairs = 0
        self.text_episodes: set[str] = set()

    def describe(self) -> dict[str, Any]:
        """Settings recorded in run configs (never the API key)."""
        return {"kind": "openai", "model": self.model, "base_url": self.base_url, "tools": self.tools_mode,
                "max_tokens": self.max_tokens, "temperature": self.temperature, "concurrency": self.concurrency,
                "retry": self.retry.model_dump(),
                "stops": list(self.stops), "enable_thinking": self.enable_thinking}

    # -- message conversion -----------------------------------------------------------------
    def to_api_messages(self, conversation: Conversation, native: bool | None = None) -> list[dict[str, Any]]:
        """Env messages -> API messages that follow OpenAI's tool-call pairing rule.

        With native tools (``native``, default :attr:`native_tools`), an assistant turn
        holding the JSON of a message with ``tool_calls`` is sent as that structured
        message and tool results keep role ``"tool"`` with their ``tool_call_id``. In text
        mode everything is plain text and tool results are sent as user turns.

        The pairing rule holds for any input (the env's conversations already follow
        it, see :meth:`drgym.envs.core.SearchAgentEnv._observe`): every assistant message
        with ``tool_calls`` (ids made unique, arguments JSON text of an object) is
        followed by exactly one tool message per id, in order: replies to the same id
        are joined, a declared id with no reply gets ``"No result."``, and a tool
        message that answers no declared id is sent as a user turn after the replies.
        Each such repair is counted in :attr:`n_repairs` and logged once.
        """
        native = self.native_tools if native is None else native
        out: list[dict[str, Any]] = []
        i = 0
        conv = list(conversation)
        while i < len(conv):
            m = conv[i]
            i += 1
            role = m.get("role", "user")
            content = _text(m.get("content"))
            if role == "assistant":
                msg: dict[str, Any] = {"role": "assistant", "content": content}
                calls = m.get("tool_calls")
                if calls is None and content.lstrip().startswith("{"):
                    try:
                        parsed = json.loads(content)
                    except json.JSONDecodeError:
                        parsed = None
                    if isinstance(parsed, dict) and parsed.get("tool_calls"):
                        calls = parsed["tool_calls"]
                        msg["content"] = _text(parsed.get("content"))
                calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
                if not native:
                    if calls:
                        msg["content"] = msg["content"] or json.dumps({"tool_calls": calls}, ensure_ascii=False)
                    out.append(msg)
                    continue
                if not calls:
                    out.append(msg)
                    continue
                msg["tool_calls"] = self._norm_calls(calls)
                msg["content"] = msg["content"] or None
                out.append(msg)
                # the tool messages that follow answer this message's calls
                block = []
                while i < len(conv) and conv[i].get("role") == "tool":
                    block.append(conv[i])
                    i += 1
                out.extend(self._pair(msg["tool_calls"], block))
            elif role == "tool":
                if native and m.get("tool_call_id"):
                    self._repaired(f"a tool message answers {m.get('tool_call_id')!r} with no assistant call before it")
                out.append({"role": "user", "content": content})
            else:
                out.append({"role": role, "content": content})
        return out

    def _norm_calls(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI ``tool_calls`` with unique non-empty ids and JSON-object argument text."""
        out, seen = [], set()
        for i, c in enumerate(calls):
            fn = c.get("function") if isinstance(c.get("function"), dict) else {"name": c.get("name", ""), "arguments": c.get("arguments", {})}
            cid = c.get("id") if isinstance(c.get("id"), str) and c.get("id") else f"call_{i}"
            while cid in seen:
                cid = f"{cid}_{i}"
            if cid != c.get("id"):
                self._repaired(f"tool call id {c.get('id')!r} is missing or repeated; sent as {cid!r}")
            seen.add(cid)
            name = fn.get("name") if isinstance(fn.get("name"), str) and fn.get("name") else "invalid"
            out.append({"id": cid, "type": "function", "function": {"name": name, "arguments": arguments_json(fn.get("arguments", {}))}})
        return out

    def _pair(self, calls: list[dict[str, Any]], block: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One tool message per call of ``calls`` from the tool messages that followed them."""
        replies: dict[str, list[str]] = {c["id"]: [] for c in calls}
        stray: list[str] = []
        for t in block:
            tid = t.get("tool_call_id")
            (replies[tid] if tid in replies else stray).append(_text(t.get("content")))
        out = []
        for cid, texts in replies.items():
            if len(texts) != 1:
                self._repaired(f"call {cid!r} had {len(texts)} tool replies; sent as one")
            out.append({"role": "tool", "tool_call_id": cid, "content": "\n\n".join(texts) or "No result."})
        if stray:
            self._repaired(f"{len(stray)} tool message(s) answered no declared call; sent as a user turn")
            out.append({"role": "user", "content": "\n\n".join(stray)})
        return out

    def _repaired(self, what: str) -> None:
        with self._lock:
            self.n_repairs += 1
            first = self.n_repairs == 1
        if first:
            log.warning("conversation repaired to follow the tool-call pairing rule: %s (further repairs are "
                        "counted in n_repairs, not logged)", what)

    # -- requests ---------------------------------------------------------------------------
    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one chat completion with retries.

        Raises:
            ServiceUnavailableError: still unreachable, timing out or answering 429/5xx
                (or invalid JSON) after ``retry.attempts`` attempts (and ``retry.reconnect_s``
                once the server has answered before).
            BackendUnavailableError: HTTP 4xx (not retried).
        """

        def go() -> dict[str, Any]:
            if self._down is not None:  # another request of this batch gave up on the server
                raise self._down
            r = self._client.post("/chat/completions", json=body)
            self._answered = True
            if r.status_code == 429 or r.status_code >= 500:
                raise _Retryable(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code >= 400:
                raise _Refused(r.status_code, f"HTTP {r.status_code} from {self.base_url}/chat/completions: {r.text[:300]}")
            try:
                return r.json()
            except ValueError as e:
                raise _Retryable(f"invalid JSON from server: {r.text[:200]}") from e

        reconnect = float(self.retry.reconnect_s or 0.0) if self._answered else 0.0
        loop = retrying(self.retry, name=f"policy endpoint {self.base_url}", retry_on=(httpx.TransportError, _Retryable),
                        min_elapsed_s=reconnect)
        try:
            return loop(go)
        except (httpx.TransportError, _Retryable) as e:
            made = loop.statistics.get("attempt_number") or self.retry.attempts
            err = ServiceUnavailableError(
                f"policy endpoint {self.base_url}/chat/completions failed {made} attempt(s): {type(e).__name__}: {e}")
            with self._lock:
                if self._down is None:
                    self._down = err
            raise err from e

    def _body(self, conversation: Conversation, native: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": self.to_api_messages(conversation, native),
                                "max_tokens": self.max_tokens, "temperature": self.temperature}
        if native:
            body["tools"] = tool_schemas(DEFAULT_TOOLS)
            body["tool_choice"] = "auto"
        elif self.stops:
            body["stop"] = list(self.stops)[:4]  # OpenAI accepts at most 4 stop strings
        body.update(self.extra_body)
        return body

    def _one(self, job: tuple[Conversation, str | None]) -> tuple[str, TokenUsage]:
        conversation, episode = job
        native = self.native_tools and episode not in self.text_episodes
        fallback = None
        with Timer() as t:
            try:
                data = self._post(self._body(conversation, native))
            except ServiceUnavailableError:
                raise  # the endpoint is down: act() ends the run
            except _Refused as e:
                if not (native and self.tools_mode == "auto" and e.status == 400):
                    return self._fail(e)
                # Per episode, not per run: the same request is sent once more without
                # `tools`. If the server takes it, this episode goes on in text tags (its
                # native calls so far become text); if not, the 400 was about something
                # else (a prompt over the context length...) and the turn is a failure.
                # Other episodes keep function calling either way.
                try:
                    data = self._post(self._body(conversation, False))
                except ServiceUnavailableError:
                    raise
                except Exception as e2:  # counted and recorded as this turn's error
                    return self._fail(e2)
                fallback = str(e)[:300]
                native = False
                if episode is not None:
                    with self._lock:
                        self.text_episodes.add(episode)
                log.warning("server refused a request with tools (%s); episode %s goes on with text tags", e,
                            episode if episode is not None else "(unnamed, this turn only)")
            except Exception as e:  # an unexpected failure of this one request
                return self._fail(e)
        try:
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (KeyError, IndexError, TypeError):
            return self._fail(ValueError(f"malformed chat completion: {str(data)[:200]}"))
        u = data.get("usage") or {}
        usage = TokenUsage(prompt_tokens=int(u.get("prompt_tokens") or 0), completion_tokens=int(u.get("completion_tokens") or 0),
                      generation_s=t.s, finish=str(choice.get("finish_reason") or ""))
        if fallback is not None:
            usage.extra["tools_refused"] = fallback
        calls = msg.get("tool_calls")
        if calls:
            action = json.dumps({"content": msg.get("content") or "", "tool_calls": calls}, ensure_ascii=False)
            usage.finish = "tool_calls"
            return action, usage
        text = msg.get("content") or ""
        if not native:
            text = close_open_tag(text, self.stops)
        return text, usage

    def _fail(self, e: Exception) -> tuple[str, TokenUsage]:
        with self._lock:
            self.n_errors += 1
        log.warning("chat completion failed: %s: %s", type(e).__name__, e)
        return "", TokenUsage(finish="error", extra={"error": str(e)[:300]})

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """One concurrent request per conversation; order preserved.

        Returns:
            The assistant text, or the JSON of ``{"content", "tool_calls"}`` when the
            model called a tool natively; ``""`` for a request the server refused (its
            usage has ``finish="error"``).

        Raises:
            ServiceUnavailableError: the endpoint stayed unreachable (see the module doc);
                the other requests of the batch stop at once.
        """
        self._down = None  # a new batch tries the server again
        episodes = [None if (i or {}).get("episode_id") is None else str(i["episode_id"])
                    for i in (infos or [None] * len(conversations))]
        results = list(self._pool.map(self._one, zip(conversations, episodes)))
        self.last_usage = [u for _, u in results]
        return [a for a, _ in results]

    def close(self) -> None:
        """Close the HTTP client and the thread pool. Idempotent."""
        self._pool.shutdown(wait=False)
        self._client.close()
