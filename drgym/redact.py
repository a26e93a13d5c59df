"""Keep API keys out of everything drgym writes: run configs, recordings, logs.

Run directories (``config.json``), recordings and logs are shared, committed and
uploaded; a key that lands in one leaks. Three tools, used wherever options or command
lines are stored:

* :func:`redact` replaces the value of every mapping entry whose name looks like a
  secret (``api_key``, ``x-api-key``, ``token``, ``password``, ``authorization``...) by
  :data:`REDACTED`, recursively; strings have ``KEY=VALUE`` pairs with such a name
  (a ``-p api_key=...`` option in ``sys.argv``) and URL credentials
  (``https://user:pass@host``) masked too.
* :func:`scrub` masks given secret values wherever they occur in a text (a provider's
  error message that echoes the key).
* :func:`secret_values` collects the values to scrub: the environment variables whose
  names look like secrets (``SERPER_API_KEY``, ``OPENAI_API_KEY``...) plus any given.

A key is never part of a run's identity: two runs that differ only in the key are the
same run (a rotated key resumes a run).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "<redacted>"

_SECRET_WORDS = frozenset({"apikey", "apikeys", "secret", "token", "password", "passwd", "authorization",
                           "credential", "credentials", "bearer"})
_ARG_PAIR = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)(?P<eq>\s*[=:]\s*)(?P<value>\S+)")
_BEARER = re.compile(r"(?i)\b(?P<b>bearer)\s+[^\s\"',]+")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")

MIN_SECRET_LEN = 6
"""Shorter values are not scrubbed by value (they would mask ordinary words)."""


def is_secret_name(name: str) -> bool:
    """Whether an option, header or variable name holds a secret.

    Secret: a name whose last word is ``key``/``keys`` (``api_key``, ``X-API-KEY``,
    ``DRGYM_API_KEYS``, ``openai_key``), or holding a word such as ``token``,
    ``secret``, ``password``, ``authorization`` (``hf_token``, ``Authorization``).
    Counts such as ``max_new_tokens`` are not secrets.

    >>> [is_secret_name(n) for n in ("api_key", "X-Api-Key", "OPENAI_API_KEYS", "hf_token", "max_tokens", "top_k")]
    [True, True, True, True, False, False]
    """
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if not words:
        return False
    return words[-1] in ("key", "keys") or any(w in _SECRET_WORDS for w in words)


def _redact_text(s: str) -> str:
    s = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", s)
    s = _BEARER.sub(lambda m: f"{m['b']} {REDACTED}", s)
    return _ARG_PAIR.sub(lambda m: f"{m['name']}{m['eq']}{REDACTED}" if is_secret_name(m["name"]) else m[0], s)


def _is_secret_flag(v: Any) -> bool:
    return isinstance(v, str) and v.startswith("-") and "=" not in v and is_secret_name(v)


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (JSON-like: dicts, lists, tuples, strings, scalars) without secrets.

    Mapping values under a secret name become :data:`REDACTED` (None and empty values are
    kept, they hold nothing); strings lose ``NAME=VALUE`` secrets, ``Bearer`` tokens and
    URL credentials; in a list, the item after a secret option (``--api-keys K``) is masked.

    >>> redact({"policy_options": {"api_key": "sk-1", "max_tokens": 8},
    ...         "command": ["drgym", "-p", "api_key=sk-1", "--backend", "http://u:pw@h:80"]})
    {'policy_options': {'api_key': '<redacted>', 'max_tokens': 8}, 'command': ['drgym', '-p', 'api_key=<redacted>', '--backend', 'http://<redacted>@h:80']}
    >>> redact(["drgym", "serve", "--api-keys", "k1,k2", "--port", "8000"])
    ['drgym', 'serve', '--api-keys', '<redacted>', '--port', '8000']
    """
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):  # an argv: the value after a secret option (--api-keys K) too
        out = [REDACTED if i and _is_secret_flag(obj[i - 1]) and isinstance(v, str) else redact(v)
               for i, v in enumerate(obj)]
        return out if isinstance(obj, list) else tuple(out)
    if isinstance(obj, str):
        return _redact_text(obj)
    return obj


def secret_values(extra: Iterable[str | None] = ()) -> list[str]:
    """Secret values to :func:`scrub`: ``extra`` plus every environment variable whose name
    looks like a secret; longest first, values shorter than :data:`MIN_SECRET_LEN` left out."""
    vals = {v.strip() for v in extra if v and v.strip()}
    vals |= {v.strip() for k, v in os.environ.items() if is_secret_name(k) and v.strip()}
    return sorted((v for v in vals if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)


def header_secrets(headers: Mapping[str, str]) -> list[str]:
    """Values of the secret headers of a request (``x-api-key``, ``X-Subscription-Token``,
    the token of ``Authorization: Bearer ...``), for :func:`scrub`.

    >>> header_secrets({"Authorization": "Bearer sk-123456", "Accept": "application/json"})
    ['Bearer sk-123456', 'sk-123456']
    """
    out: list[str] = []
    for name, value in headers.items():
        if is_secret_name(name) and value:
            out.append(value)
            scheme, _, token = value.partition(" ")
            if token.strip() and scheme.lower() in ("bearer", "token", "basic"):
                out.append(token.strip())
    return out


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by :data:`REDACTED`.

    >>> scrub("401: invalid key sk-abcdef", ["sk-abcdef"])
    '401: invalid key <redacted>'
    """
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    return text
