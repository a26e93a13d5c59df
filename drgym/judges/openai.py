"""Judge backend for any OpenAI-compatible chat endpoint (vLLM, OpenAI, OpenRouter).

Uses ``httpx`` (the ``openai`` package is not a dependency): ``POST {base_url}/chat/completions``
with ``{"model", "messages", "temperature", "max_tokens", "seed"}`` and reads
``choices[0].message.content``.

Configuration (arguments win over the environment):
    base URL: ``DRGYM_JUDGE_BASE_URL``, then ``OPENAI_BASE_URL``, then ``https://api.openai.com/v1``.
    model: ``DRGYM_JUDGE_MODEL`` (no default: a judge model must be named).
    key: ``DRGYM_JUDGE_API_KEY``, then ``OPENAI_API_KEY`` (optional for local vLLM).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx

from drgym.errors import AuthError, ConfigError
from drgym.judges.base import Judge, JudgeTransportError, JudgeUnreachableError, Messages


class OpenAIJudge(Judge):
    """Chat-completions judge over HTTP.

    Args:
        model: model name sent to the endpoint.
        base_url: API root ending in ``/v1`` (``http://127.0.0.1:8000/v1`` for vLLM).
        api_key: bearer token; None reads the environment.
        json_mode: send ``response_format={"type": "json_object"}`` (OpenAI and vLLM
            support it; set False for servers that reject the field).
        **kwargs: :class:`~drgym.judges.base.Judge` settings (``cache``, ``n_samples``,
            ``retry``...); ``retry.timeout_s`` is the per-request timeout in seconds (a
            timeout is retried, then recorded).

    Raises:
        ConfigError: no model name given or found in ``DRGYM_JUDGE_MODEL``.
        AuthError: (from :meth:`complete`) HTTP 401/403 -- not retried, since no call
            would succeed.
    """

    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        json_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        model = model or os.environ.get("DRGYM_JUDGE_MODEL")
        if not model:
            raise ConfigError("OpenAI judge needs a model: 'openai:MODEL@BASE_URL' or set DRGYM_JUDGE_MODEL.")
        self.model = model
        self.base_url = (
            base_url or os.environ.get("DRGYM_JUDGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        ).rstrip("/")
        self.api_key = api_key or os.environ.get("DRGYM_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.json_mode = bool(json_mode)
        self.model_id = f"openai:{model}"
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "base_url": self.base_url}

    @property
    def client(self) -> httpx.Client:
        with self._client_lock:
            if self._client is None:
                headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
                self._client = httpx.Client(
                    base_url=self.base_url,
                    headers=headers,
                    timeout=self.retry.timeout_s,
                    limits=httpx.Limits(max_connections=max(self.max_concurrency, 1) * 2),
                )
            return self._client

    def complete(self, messages: Messages, *, temperature: float, seed: int, attempt: int, template=None) -> str:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": self.max_tokens,
            "seed": seed,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        try:
            r = self.client.post("/chat/completions", json=body)
        except httpx.TimeoutException as e:
            raise JudgeTransportError(f"timeout after {self.retry.timeout_s:g} s from {self.base_url}") from e
        except httpx.HTTPError as e:  # refused, reset, dropped mid-answer: the endpoint is down
            raise JudgeUnreachableError(f"{type(e).__name__} talking to {self.base_url}: {e}") from e
        if r.status_code in (401, 403):
            raise AuthError(f"judge endpoint {self.base_url} refused the key (HTTP {r.status_code}); set DRGYM_JUDGE_API_KEY.")
        if r.status_code == 429 or r.status_code >= 500:
            raise JudgeTransportError(f"HTTP {r.status_code} from {self.base_url}: {r.text[:200]}")
        if r.status_code >= 400:
            raise JudgeTransportError(f"HTTP {r.status_code} from {self.base_url}: {r.text[:200]}")
        try:
            data = r.json()
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeTransportError(f"response from {self.base_url} is not OpenAI chat format: {r.text[:200]!r}") from e
        return content or ""

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None
