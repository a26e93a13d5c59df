"""``openai:MODEL@BASE_URL``: any OpenAI-compatible chat-completions server as a policy.

Works with ``vllm serve``, OpenAI, OpenRouter, llama.cpp's server... Requests of one
batch run concurrently on a thread pool over one pooled ``httpx.Client``; transport
errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff (tenacity):
``retries`` attempts, and once the server has answered, for at least ``reconnect_s``
seconds (a restarting server). If the endpoint still fails, :meth:`OpenAIPolicy.act`
raises :class:`~drgym.errors.ServiceUnavailableError`: an unreachable model cannot act,
so the rollout stops (finished episodes are kept; rerunning resumes) instead of
recording turns the model never wrote. A request the server refuses (HTTP 4xx, e.g. a
prompt over the context length) or a malformed completion is that turn's failure: an
empty action with ``finish="error"`` in its usage (the env shows a corrective
observation, and the run counts it in ``errors``).

Native function calling (the request's ``tools`` field) is used when ``tools`` is
``"auto"`` or True; a server that rejects ``tools`` with HTTP 400 switches the policy to
text tags for the rest of the run (``"auto"`` only). Replies with ``tool_calls`` are
returned as the JSON of the assistant message, which the env's action parser reads.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from drgym.errors import BackendUnavailableError, ConfigError, ServiceUnavailableError
from drgym.policies.base import Conversation, Policy
from drgym.policies.generation import DEFAULT_STOPS, Timer, Usage, close_open_tag

log = logging.getLogger(__name__)

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "search", "description": "Search the document collection; returns the top passages with their URLs.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "search query"}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "fetch", "description": "Fetch the whole document at a URL returned by search.",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer and end the episode.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]
"""Function schemas of the three env actions, in the OpenAI ``tools`` format."""


class _Retryable(Exception):
    """An HTTP status worth retrying (429, 5xx)."""


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
        timeout: seconds per request.
        retries: attempts per request (>= 1).
        reconnect_s: once the server has answered, a request failing for transport
            reasons (refused, timeout, 429/5xx) is retried for at least this many seconds;
            None: :func:`drgym.search.retry.default_reconnect_s` (60, or ``$DRGYM_RECONNECT_S``).
        stops: stop strings in text mode (the server drops them; they are re-appended).
        extra_body: extra JSON fields merged into each request (e.g. vLLM's
            ``{"top_k": 1}``).

    Attributes:
        last_usage: one :class:`~drgym.policies.generation.Usage` per conversation of the
            latest call (server-reported token counts when given).
        native_tools: whether function calling is in use now.
    """

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
        timeout: float = 60.0,
        retries: int = 4,
        reconnect_s: float | None = None,
        stops: tuple[str, ...] | list[str] = DEFAULT_STOPS,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        import httpx

        if int(concurrency) < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}.")
        if int(retries) < 1:
            raise ConfigError(f"retries must be >= 1, got {retries}.")
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
        self.timeout = float(timeout)
        self.retries = int(retries)
        if reconnect_s is None:
            from drgym.search.retry import default_reconnect_s

            reconnect_s = default_reconnect_s()
        self.reconnect_s = float(reconnect_s)
        self._answered = False  # the server has answered once (then reconnect_s applies)
        self._down: ServiceUnavailableError | None = None  # set when the endpoint is given up on
        self.stops = tuple(stops)
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=self.timeout,
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="drgym-openai")
        self._lock = threading.Lock()
        self.last_usage: list[Usage] = []
        self.n_errors = 0

    def describe(self) -> dict[str, Any]:
        """Settings recorded in run configs (never the API key)."""
        return {"kind": "openai", "model": self.model, "base_url": self.base_url, "tools": self.tools_mode,
                "max_tokens": self.max_tokens, "temperature": self.temperature, "concurrency": self.concurrency,
                "timeout": self.timeout, "retries": self.retries, "reconnect_s": self.reconnect_s,
                "stops": list(self.stops)}

    # -- message conversion -----------------------------------------------------------------
    def to_api_messages(self, conversation: Conversation) -> list[dict[str, Any]]:
        """Env messages -> API messages.

        With native tools, an assistant turn holding the JSON of a message with
        ``tool_calls`` is sent as that structured message and tool results keep role
        ``"tool"`` with their ``tool_call_id``. In text mode everything is plain text
        and tool results are sent as user turns.
        """
        out: list[dict[str, Any]] = []
        for m in conversation:
            role = m.get("role", "user")
            content = m.get("content") if m.get("content") is not None else ""
            if not isinstance(content, str):
                content = json.dumps(content, ensure_ascii=False)
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
                        msg["content"] = parsed.get("content") or ""
                if calls and self.native_tools:
                    msg["tool_calls"] = [self._norm_call(c, i) for i, c in enumerate(calls)]
                    msg["content"] = msg["content"] or None
                elif calls:
                    msg["content"] = msg["content"] or json.dumps({"tool_calls": calls}, ensure_ascii=False)
                out.append(msg)
            elif role == "tool":
                if self.native_tools and m.get("tool_call_id"):
                    out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": content})
                elif self.native_tools and out and out[-1].get("tool_calls"):
                    out.append({"role": "tool", "tool_call_id": out[-1]["tool_calls"][0]["id"], "content": content})
                else:
                    out.append({"role": "user", "content": content})
            else:
                out.append({"role": role, "content": content})
        return out

    @staticmethod
    def _norm_call(c: dict[str, Any], i: int) -> dict[str, Any]:
        fn = c.get("function") or {"name": c.get("name", ""), "arguments": c.get("arguments", {})}
        args = fn.get("arguments", {})
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return {"id": c.get("id") or f"call_{i}", "type": "function", "function": {"name": fn.get("name", ""), "arguments": args}}

    # -- requests ---------------------------------------------------------------------------
    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST one chat completion with retries.

        Raises:
            ServiceUnavailableError: still unreachable, timing out or answering 429/5xx
                (or invalid JSON) after ``retries`` attempts (and ``reconnect_s`` once the
                server has answered before).
            BackendUnavailableError: HTTP 4xx (not retried).
        """
        import httpx
        from tenacity import (
            Retrying,
            retry_if_exception_type,
            stop_after_attempt,
            stop_after_delay,
            wait_exponential,
        )

        def go() -> dict[str, Any]:
            if self._down is not None:  # another request of this batch gave up on the server
                raise self._down
            r = self._client.post("/chat/completions", json=body)
            self._answered = True
            if r.status_code == 429 or r.status_code >= 500:
                raise _Retryable(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code >= 400:
                raise BackendUnavailableError(f"HTTP {r.status_code} from {self.base_url}/chat/completions: {r.text[:300]}")
            try:
                return r.json()
            except ValueError as e:
                raise _Retryable(f"invalid JSON from server: {r.text[:200]}") from e

        stop: Any = stop_after_attempt(self.retries)
        if self._answered and self.reconnect_s > 0:
            stop = stop & stop_after_delay(self.reconnect_s)
        retrying = Retrying(stop=stop, wait=wait_exponential(multiplier=0.5, max=8),
                            retry=retry_if_exception_type((httpx.TransportError, _Retryable)), reraise=True)
        try:
            return retrying(go)
        except (httpx.TransportError, _Retryable) as e:
            made = retrying.statistics.get("attempt_number") or self.retries
            err = ServiceUnavailableError(
                f"policy endpoint {self.base_url}/chat/completions failed {made} attempt(s): {type(e).__name__}: {e}")
            with self._lock:
                if self._down is None:
                    self._down = err
            raise err from e

    def _one(self, conversation: Conversation) -> tuple[str, Usage]:
        with Timer() as t:
            body: dict[str, Any] = {"model": self.model, "messages": self.to_api_messages(conversation),
                                    "max_tokens": self.max_tokens, "temperature": self.temperature}
            if self.native_tools:
                body["tools"] = TOOL_SCHEMAS
                body["tool_choice"] = "auto"
            elif self.stops:
                body["stop"] = list(self.stops)[:4]  # OpenAI accepts at most 4 stop strings
            body.update(self.extra_body)
            try:
                data = self._post(body)
            except ServiceUnavailableError:
                raise  # the endpoint is down: act() ends the run
            except BackendUnavailableError as e:
                if self.native_tools and self.tools_mode == "auto" and "400" in str(e):
                    log.warning("server refused the tools field (%s); switching to text tags", e)
                    with self._lock:
                        self.native_tools = False
                    return self._one(conversation)
                return self._fail(e)
            except Exception as e:  # an unexpected failure of this one request
                return self._fail(e)
        try:
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (KeyError, IndexError, TypeError):
            return self._fail(ValueError(f"malformed chat completion: {str(data)[:200]}"))
        u = data.get("usage") or {}
        usage = Usage(prompt_tokens=int(u.get("prompt_tokens") or 0), completion_tokens=int(u.get("completion_tokens") or 0),
                      generation_s=t.s, finish=str(choice.get("finish_reason") or ""))
        calls = msg.get("tool_calls")
        if calls:
            action = json.dumps({"content": msg.get("content") or "", "tool_calls": calls}, ensure_ascii=False)
            usage.finish = "tool_calls"
            return action, usage
        text = msg.get("content") or ""
        if not self.native_tools:
            text = close_open_tag(text, self.stops)
        return text, usage

    def _fail(self, e: Exception) -> tuple[str, Usage]:
        with self._lock:
            self.n_errors += 1
        log.warning("chat completion failed: %s: %s", type(e).__name__, e)
        return "", Usage(finish="error", extra={"error": str(e)[:300]})

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
        results = list(self._pool.map(self._one, conversations))
        self.last_usage = [u for _, u in results]
        return [a for a, _ in results]

    def close(self) -> None:
        """Close the HTTP client and the thread pool. Idempotent."""
        self._pool.shutdown(wait=False)
        self._client.close()
