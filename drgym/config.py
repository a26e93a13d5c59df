"""drgym's typed configuration tree (pydantic v2): one model per config section.

Every section a user writes is validated by one model here, the only place that knows the
section's keys:

- :class:`RetryPolicy`: the ``retry:`` block of a search backend, the page fetcher, a
  policy or a judge (how a request that failed for a transient reason is retried, and the
  timeout of one attempt);
- :class:`TrainingConfig`: a training run config (``drgym train``), with its sections
  :class:`EnvSection`, :class:`SearchSettings`, :class:`TasksSection` (of
  :class:`TaskSlice`), :class:`RolloutSection`, :class:`RewardItem`,
  :class:`EvalSettings`, :class:`LaunchSection`, :class:`ZeroVarianceSection` and
  :class:`EntropyBrakeSection`;
- :class:`RolloutRun`: a rollout run file (``drgym rollout --config FILE``);
- :class:`SearchSettings`: a config's ``search:`` section, the keyword arguments of
  :func:`drgym.search.registry.make_backend` and of the backend it builds;
- :class:`ServeSettings` and :class:`ServeTimeouts`: the options of ``drgym serve`` and
  ``drgym mcp``.

Sections whose keys belong to another library stay mappings, checked where they are used:
``grpo:`` and ``sft:`` (TRL's ``GRPOConfig`` / ``SFTConfig``), ``env.kwargs`` (the
environment's constructor, through ``gymnasium.make``) and ``peft:`` (``peft.LoraConfig``).

Errors: the models raise :class:`~drgym.errors.ConfigError` (a ``ValueError``), whether
they are built in code or read with :func:`parse_section`; :class:`ServeSettings` built
directly raises pydantic's ``ValidationError``, as the settings class of the servers
always has. An unknown key names its path and the closest known key
(``rollout.max_turn: unknown rollout key. Did you mean 'max_turns'? Known: ...``); a value
of the wrong type names the field and the expected type
(``enable_thinking must be true, false or null, got 'yes'.``).
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from drgym.errors import ConfigError, did_you_mean

_M = TypeVar("_M", bound=BaseModel)


# -- errors ---------------------------------------------------------------------------------


def _base(ann: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``."""
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _members(ann: Any) -> list[Any]:
    """The members of a union (``X | None`` -> ``[X, NoneType]``), else ``[ann]``."""
    ann = _base(ann)
    if typing.get_origin(ann) in (Union, types.UnionType):
        return [_base(a) for a in typing.get_args(ann)]
    return [ann]


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _walk(model: type[BaseModel], loc: Sequence[Any]) -> tuple[Any, list[str]]:
    """Follow a pydantic error location through ``model``'s annotations.

    Returns:
        ``(annotation at loc, path parts)``; union-member tags pydantic adds to a
        location (``'list[str]'``, ``'function-before[...]'``) are left out of the path.
    """
    ann: Any = model
    parts: list[str] = []
    for part in loc:
        members = _members(ann)
        sub = next((m for m in members if _is_model(m) and isinstance(part, str) and part in m.model_fields), None)
        if sub is not None:
            ann = sub.model_fields[part].annotation
            parts.append(part)
            continue
        origins = {typing.get_origin(m): m for m in members}
        if isinstance(part, int) and (list in origins or tuple in origins):
            args = typing.get_args(origins.get(list) or origins.get(tuple))
            ann = args[0] if args else Any
            parts.append(f"[{part}]")
            continue
        if isinstance(part, str) and dict in origins:
            args = typing.get_args(origins[dict])
            ann = args[1] if len(args) == 2 else Any
            parts.append(part)
            continue
        # a union-member tag: not part of the user's path
    return ann, parts


def _join_path(parts: Sequence[str]) -> str:
    out = ""
    for p in parts:
        out += p if p.startswith("[") or not out else "." + p
    return out


def _alternatives(ann: Any) -> str:
    """What a value of annotation ``ann`` may be, in words: ``"an integer or null"``."""
    alts: list[str] = []
    nullable = False
    for m in _members(ann):
        origin = typing.get_origin(m)
        if m is type(None):
            nullable = True
        elif m is bool:
            alts += ["true", "false"]
        elif m is int:
            alts.append("an integer")
        elif m is float:
            alts.append("a number")
        elif m is str or m is SecretStr:
            alts.append("a string")
        elif origin is Literal:
            alts.append("one of " + ", ".join(map(repr, typing.get_args(m))))
        elif _is_model(m) or m is dict or origin in (dict, Mapping):
            alts.append("a mapping")
        elif m is list or origin in (list, tuple, Sequence):
            alts.append("a list")
        elif m is not Any:
            alts.append(getattr(m, "__name__", str(m)))
    alts = list(dict.fromkeys(alts)) + (["null"] if nullable else [])
    if not alts:
        return "a value"
    return alts[0] if len(alts) == 1 else ", ".join(alts[:-1]) + " or " + alts[-1]


#: Keys that belong in a ``retry:`` block, and other common spellings of them: an unknown
#: one of these, in a section that has ``retry``, gets a hint pointing there.
_RETRY_SPELLINGS = frozenset({"attempts", "retries", "max_attempts", "timeout", "timeout_s", "backoff_s",
                              "max_backoff_s", "max_retry_after_s", "reconnect_s", "pause_s"})


def _message(err: Mapping[str, Any], model: type[BaseModel], where: Sequence[str]) -> tuple[str, str]:
    """``(path, message)`` of one pydantic error, in drgym's words."""
    kind = err["type"]
    loc = tuple(err.get("loc") or ())
    value = err.get("input")
    if kind == "extra_forbidden" and loc:
        parent, parts = _walk(model, loc[:-1])
        key = str(loc[-1])
        path = _join_path([*where, *parts, key])
        owner = next((m for m in _members(parent) if _is_model(m)), None)
        known = sorted(owner.model_fields) if owner is not None else []
        label = _join_path([*where, *parts]) or "top-level"
        hint = did_you_mean(key, known)
        if not hint and key in _RETRY_SPELLINGS and "retry" in known:
            hint = f" Retries and timeouts are set under 'retry:' ({', '.join(RetryPolicy.model_fields)})."
        listing = f" Known: {', '.join(known)}." if known else ""
        return path, f"{path}: unknown {label} key.{hint}{listing}"
    ann, parts = _walk(model, loc)
    path = _join_path([*where, *parts]) or "config"
    if kind == "missing":
        return path, f"{path} is required and missing."
    if kind == "literal_error":
        choices = [a for m in _members(ann) if typing.get_origin(m) is Literal for a in typing.get_args(m)]
        name = parts[-1] if parts else path
        hint = did_you_mean(str(value), [str(c) for c in choices])
        return path, f"{path}: Unknown {name} {value!r}.{hint} Known: {', '.join(map(str, choices))}."
    if kind.endswith("_type") or kind.endswith("_parsing") or kind in ("int_from_float", "model_attributes_type"):
        return path, f"{path} must be {_alternatives(ann)}, got {value!r}."
    msg = str(err.get("msg", kind))
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    msg = msg.replace("Input should be ", "must be ", 1)
    for words, sign in (("greater than or equal to", ">="), ("less than or equal to", "<="), ("greater than", ">"),
                        ("less than", "<")):
        msg = msg.replace(f"must be {words} ", f"must be {sign} ")
    if not msg.startswith("must "):
        msg = ": " + msg
    else:
        msg = " " + msg
    return path, f"{path}{msg}, got {value!r}."


def config_error(exc: ValidationError, model: type[BaseModel], *, where: str = "", source: str = "") -> ConfigError:
    """Turn pydantic's ``ValidationError`` for ``model`` into one :class:`ConfigError`.

    Args:
        exc: the validation error.
        model: the model that was validated.
        where: the section path the model sits at (``"rollout"``, ``"search.retry"``).
        source: the file (or other origin) named first in the message.

    Returns:
        A ConfigError listing each problem once: unknown keys with a
        "Did you mean" hint and the known keys, wrong types with the expected type.
    """
    prefix = [p for p in where.split(".") if p]
    seen: dict[str, str] = {}
    for err in exc.errors(include_url=False):
        path, msg = _message(err, model, prefix)
        seen.setdefault(path, msg)
    text = " ".join(seen.values()) or str(exc)
    return ConfigError(f"{source}: {text}" if source else text)


def parse_section(model: type[_M], data: Any, *, where: str | None = None, source: str = "") -> _M:
    """Validate ``data`` (a mapping; None is an empty one) against ``model``.

    Args:
        model: a model of this module.
        data: the section as written (a model instance is returned as is).
        where: the section's path for messages; default the model's ``section``.
        source: the file the section comes from, named first in messages.

    Raises:
        ConfigError: an unknown key, a value of the wrong type or out of range.
    """
    if isinstance(data, model):
        return data
    where = getattr(model, "section", "") if where is None else where
    try:
        return model.model_validate({} if data is None else data)
    except ValidationError as e:
        raise config_error(e, model, where=where, source=source) from None


def merge_layers(base: Mapping[str, Any], over: Mapping[str, Any], *,
                 exclusive: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """``over`` merged over ``base``: mappings merge key by key at every depth, anything else
    in ``over`` replaces (a list is replaced whole). Neither argument is changed.

    This is how a run file and the command line's ``--set`` options combine, and how the
    layers of a serving config do (:func:`drgym.distributed.serve.load_config`).

    Args:
        base, over: the two layers.
        exclusive: pairs of keys that take one another's place at any depth: a key of a
            pair given in ``over`` drops the other from ``base`` (Ray Serve's
            ``num_replicas`` and ``autoscaling_config``).

    >>> merge_layers({"env": {"id": "x", "kwargs": {"top_k": 3, "max_searches": 2}}},
    ...              {"env": {"kwargs": {"top_k": 5}}})
    {'env': {'id': 'x', 'kwargs': {'top_k': 5, 'max_searches': 2}}}
    >>> merge_layers({"d": {"num_replicas": 2}}, {"d": {"autoscaling_config": {"max_replicas": 4}}},
    ...              exclusive=[("num_replicas", "autoscaling_config")])
    {'d': {'autoscaling_config': {'max_replicas': 4}}}
    """
    out = dict(base)
    for k, v in over.items():
        for a, b in exclusive:
            if k in (a, b):
                out.pop(b if k == a else a, None)
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge_layers(out[k], v, exclusive=exclusive)
        else:
            out[k] = v
    return out


_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def dotted_overrides(pairs: Sequence[str], *, option: str = "--set") -> dict[str, Any]:
    """``["rollout.max_turns=3", "grpo.learning_rate=1e-5"]`` as a nested mapping.

    Each value is read as a YAML scalar or flow collection, as the same text in a config file
    would be (``3`` an int, ``1e-5`` a float, ``true`` a bool, ``null`` None, ``[a, b]`` a list,
    anything else a string; ``1e-5``, a string to PyYAML without a dot, is read as a float
    here); the models then validate it where the file's value would be.

    >>> dotted_overrides(["rollout.max_turns=3", "env.kwargs.top_k=5", "name=x"])
    {'rollout': {'max_turns': 3}, 'env': {'kwargs': {'top_k': 5}}, 'name': 'x'}

    Raises:
        ConfigError: an item without ``=``, an empty key part, a value that is not valid YAML,
            or two items that set a key and a key inside it.
    """

    out: dict[str, Any] = {}
    for item in pairs:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE with a dotted KEY (rollout.max_turns=3).")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"{option} {item!r}: the value is not valid YAML ({e}).") from None
        if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 (PyYAML) reads 1e-5 as a string; 1.0e-5 as a float
        node = out
        for depth, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part.strip(), {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{option} {item!r}: {'.'.join(parts[:depth + 1])} was set to a value above.")
            node = nxt
        last = parts[-1].strip()
        if isinstance(node.get(last), dict):
            raise ConfigError(f"{option} {item!r}: {key.strip()} already has keys set inside it above.")
        node[last] = value
    return out


class Section(BaseModel):
    """Base of the config models: unknown keys are errors, and so is any invalid value,
    as a :class:`~drgym.errors.ConfigError` (also when a model is built in code).

    Attributes:
        section: the path of the section in a config, used in messages (``"rollout"``).
    """

    model_config = ConfigDict(extra="forbid")
    section: ClassVar[str] = ""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise config_error(e, type(self), where=type(self).section) from None

    # Marked as pydantic's own __init__: validating a nested section (or model_validate)
    # then does not call it, so one ValidationError reaches config_error with the full path.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


def _positive_seconds(v: float) -> float:
    if not (math.isfinite(v) and v > 0):
        raise ValueError("must be a positive number of seconds")
    return v


def _non_negative_seconds(v: float) -> float:
    if not (math.isfinite(v) and v >= 0):
        raise ValueError("must be a number of seconds >= 0")
    return v


PositiveSeconds = Annotated[float, AfterValidator(_positive_seconds)]
"""A finite number of seconds > 0."""
Seconds = Annotated[float, AfterValidator(_non_negative_seconds)]
"""A finite number of seconds >= 0."""


# -- retries ----------------------------------------------------------------------------------


class RetryPolicy(Section):
    """How a request that failed for a transient reason is retried: the one ``retry:``
    block of every component that talks to a service (search backends, the page fetcher,
    the ``openai:`` policy and its reachability check, the judges).

    What counts as transient is the component's: for HTTP, timeouts, refused or dropped
    connections, 429 and 5xx answers; for a judge, malformed verdicts too.

    Attributes:
        attempts: tries per request, the first one included (>= 1).
        timeout_s: seconds one attempt may take (connect and read), > 0.
        backoff_s: seconds before the first retry (>= 0); the wait doubles per retry,
            with up to ``backoff_s`` of random jitter where the component adds it.
        max_backoff_s: longest wait between two tries, seconds (>= 0).
        max_retry_after_s: longest ``Retry-After`` an HTTP search client honours, seconds;
            a server asking for longer fails the request at once.
        reconnect_s: once the service has answered, a request failing because the service
            is unreachable is retried for at least this many seconds, beyond ``attempts``
            (a server being restarted); 0 stops after ``attempts``. None: the
            ``$DRGYM_RECONNECT_S`` environment variable, else 60
            (:func:`drgym.search.retry.default_reconnect_s`). Used by the HTTP search
            client, the MCP backend, the ``openai:`` policy and the judges.

    A component given a policy keeps its own default for every field the policy does not
    set (:func:`resolve_retry`): ``retry: {attempts: 2}`` changes the number of tries only.

    Raises:
        ConfigError: an unknown field or a value out of range.
    """

    section: ClassVar[str] = "retry"

    attempts: int = Field(4, ge=1)
    timeout_s: PositiveSeconds = 30.0
    backoff_s: Seconds = 0.5
    max_backoff_s: Seconds = 20.0
    max_retry_after_s: Seconds = 60.0
    reconnect_s: Seconds | None = None


RetryLike = Union[RetryPolicy, Mapping[str, Any], None]
"""What a component's ``retry`` argument takes: a :class:`RetryPolicy`, its fields as a
mapping (a config's ``retry:`` block), or None for the component's default."""


def resolve_retry(retry: RetryLike, default: RetryPolicy) -> RetryPolicy:
    """The policy a component uses: ``default`` with the fields ``retry`` sets.

    Args:
        retry: a :class:`RetryPolicy` (only the fields given when it was made count), a
            mapping of its fields, or None.
        default: the component's own policy.

    Returns:
        A RetryPolicy with every field set.

    Raises:
        ConfigError: an unknown field or a bad value (as :class:`RetryPolicy`).
    """
    if retry is None:
        return default
    if not isinstance(retry, RetryPolicy):
        if not isinstance(retry, Mapping):
            raise ConfigError(f"retry must be a mapping of {', '.join(RetryPolicy.model_fields)}, got {retry!r}.")
        retry = parse_section(RetryPolicy, dict(retry))
    given = {k: getattr(retry, k) for k in retry.model_fields_set}
    return default.model_copy(update=given) if given else default


# -- search -----------------------------------------------------------------------------------

Collapse = Literal["document", "passage"]
"""What a search returns per hit: distinct ``document``\\ s (each its best passage) or ``passage``\\ s."""


class SearchSettings(Section):
    """A config's ``search:`` section: which backend, and the keyword arguments of
    :func:`drgym.search.registry.make_backend` and of the backend it builds.

    ``{}`` is the in-process ``local`` engine over ``wiki-default``; ``corpus: NAME`` is
    short for ``backend: local:NAME``. Every other key is optional and goes to the backend
    only when given; each applies to the backends named below.

    Attributes:
        backend: a backend spec (``local:hotpotqa``, ``http://127.0.0.1:8000``, ``serper``,
            ``mcp:URL``, ``replay:FILE#SPEC``...).
        corpus: named corpus of the local engine (instead of ``backend``).
        mode, store, name: recording (``live``, ``record``, ``cache``, ``replay``), its
            SQLite file and key (:mod:`drgym.search.record`).
        retry: retries and per-attempt timeout (:class:`RetryPolicy`; HTTP, web, MCP).
        method, encoder, device, search_params, max_k, rrf_depth, collapse, verify,
            gpu_shard, gpu_float16, factory, shard_size, format, root, rebuild, progress,
            bm25_tokenizer, bm25_engine, encoder_backend, mmap, search_threads: the local engine's
            (:class:`~drgym.search.local.LocalSearchEngine`; ``max_k`` and ``collapse``
            also for HTTP/MCP).
        api_key, base_url, max_workers, fetch_any_url, fetch_allow_loopback, max_seen_urls:
            the web backends' (:class:`~drgym.search.web.WebSearchBackend`; ``api_key``,
            ``base_url`` also for ``deepresearchgym``).
        route, fetch_url, drgym, workers, retrieve_chunk, deterministic, fineweb: the HTTP
            client's (:class:`~drgym.search.client.HTTPSearchClient`; ``workers`` and
            ``deterministic`` also for MCP).
        transport, search_tool, document_tool, fetch_tool, env, cwd: the MCP backend's
            (:class:`~drgym.search.mcp.MCPSearchBackend`).

    Raises:
        ConfigError: an unknown key (with a "Did you mean" hint) or a value of the wrong type.
    """

    section: ClassVar[str] = "search"

    backend: str | None = None
    corpus: str | None = None
    mode: Literal["live", "record", "cache", "replay"] | None = None
    store: str | None = None
    name: str | None = None
    retry: RetryPolicy | None = None
    # the local engine
    method: str | None = None
    encoder: str | None = None
    device: str | None = None
    search_params: dict[str, int] | None = None
    max_k: int | None = Field(None, ge=1)
    rrf_depth: int | None = Field(None, ge=1)
    collapse: Collapse | None = None
    verify: StrictBool | str | None = None
    gpu_shard: StrictBool | None = None
    gpu_float16: StrictBool | None = None
    factory: str | None = None
    shard_size: int | None = Field(None, ge=1)
    format: str | None = None
    root: str | None = None
    rebuild: StrictBool | None = None
    progress: StrictBool | None = None
    bm25_tokenizer: str | None = None
    bm25_engine: str | None = None
    encoder_backend: str | None = None
    mmap: StrictBool | None = None
    search_threads: int | None = Field(None, ge=1)
    # web backends
    api_key: str | None = None
    base_url: str | None = None
    max_workers: int | None = Field(None, ge=1)
    fetch_any_url: StrictBool | None = None
    fetch_allow_loopback: StrictBool | None = None
    max_seen_urls: int | None = Field(None, ge=1)
    # the HTTP client
    route: str | None = None
    fetch_url: str | None = None
    drgym: StrictBool | None = None
    workers: int | None = Field(None, ge=1)
    retrieve_chunk: int | None = Field(None, ge=1)
    deterministic: StrictBool | None = None
    fineweb: StrictBool | None = None
    # the MCP backend
    transport: Literal["http", "stdio"] | None = None
    search_tool: str | None = None
    document_tool: str | None = None
    fetch_tool: str | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None


# -- training run configs ---------------------------------------------------------------------


class TaskSlice(Section):
    """A slice of a task set: ``load_tasks(set)[start:start+limit]``. Written as a task-set
    name (the whole set) or ``{set:, start:, limit:}``.

    Attributes:
        set: task-set name or file.
        start: first task, a position in the set (>= 0).
        limit: number of tasks (>= 1); None: to the end of the set.

    Raises:
        ConfigError: an unknown key or a bad value.
    """

    section: ClassVar[str] = "tasks"

    set: str = Field(min_length=1)
    start: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"set": data} if isinstance(data, str) else data


class TasksSection(Section):
    """``tasks:``: the training and the held-out task slices (:class:`TaskSlice`).

    Attributes:
        train: the training questions.
        eval: held-out questions for settings and the curves (dev).
        test: the slice the run's claim is made on: read only for final figures and by
            ``drgym train preflight`` (its size sets the smallest detectable lift), never
            during training.
    """

    section: ClassVar[str] = "tasks"

    train: TaskSlice | None = None
    eval: TaskSlice | None = None
    test: TaskSlice | None = None


class EnvSection(Section):
    """``env:``: the Gymnasium id and its keyword arguments (checked by the environment's
    constructor through ``gymnasium.make``)."""

    section: ClassVar[str] = "env"

    id: str = "drgym/SearchQA-v0"
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("kwargs", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v


class RolloutSection(Section):
    """``rollout:``: the budgets of one training rollout (collapse guards).

    Attributes:
        max_turns: model turns per episode (>= 1); a search on the last turn ends the
            episode unanswered (the env marks it truncated).
        max_new_tokens: tokens per model turn (>= 1).
        max_completion_tokens: cap on the whole completion, model and observation tokens
            (>= 1); TRL does not enforce ``max_completion_length`` on ``rollout_func`` output.
        temperature: sampling temperature (> 0); in a run config it follows
            ``grpo.temperature`` (TRL recomputes log-probs at that temperature).
        gen_batch_size: rows per ``generate`` call on the HF backend (>= 1).
        greedy: greedy decoding (evaluation); training samples.
        reuse_cache: on the HF backend, keep the KV cache between turns when a rollout
            batch fits one ``generate`` call.

    Raises:
        ConfigError: an unknown key or a bad value.
    """

    section: ClassVar[str] = "rollout"

    max_turns: int = Field(2, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    max_completion_tokens: int = Field(768, ge=1)
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    gen_batch_size: int = Field(16, ge=1)
    greedy: StrictBool = False
    reuse_cache: StrictBool = True


class RewardItem(Section):
    """One item of ``rewards:``: a reward name (:func:`drgym.rewards.registry.reward_names`),
    its weight and its constructor keyword arguments."""

    section: ClassVar[str] = "rewards"

    name: str = Field(min_length=1)
    weight: float = Field(1.0, allow_inf_nan=False)
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("kwargs", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v


class EvalSettings(Section):
    """``eval:``: held-out evaluation during training.

    Attributes:
        every_steps: run every N optimizer steps (0: never).
        num_tasks: held-out tasks per evaluation.
        max_turns: turn budget of eval episodes (>= 1).
        greedy: greedy decoding (otherwise sampling at the rollout temperature).

    Raises:
        ConfigError: an unknown key or a bad value.
    """

    section: ClassVar[str] = "eval"

    every_steps: int = Field(0, ge=0)
    num_tasks: int = Field(8, ge=0)
    max_turns: int = Field(2, ge=1)
    greedy: StrictBool = True


class LaunchSection(Section):
    """``launch:``: how ``drgym train grpo --launch`` runs ``accelerate launch``.

    Attributes:
        accelerate_config: an accelerate config file, or the name of one in
            ``training/configs`` (``accelerate_zero2.yaml``).
        num_processes: processes (GPUs) to launch; None: the accelerate file's.
    """

    section: ClassVar[str] = "launch"

    accelerate_config: str | None = None
    num_processes: int | None = Field(None, ge=1)


class ZeroVarianceSection(Section):
    """``zero_variance:``: GRPO groups whose rewards are all equal.

    Attributes:
        filter_groups: drop them from the loss and its normaliser, and skip their
            forward/backward pass.
    """

    section: ClassVar[str] = "zero_variance"

    filter_groups: StrictBool = False


class EntropyBrakeSection(Section):
    """``entropy_brake:``: a learning-rate cut when the token entropy collapses
    (:class:`drgym.training.callbacks.EntropyBrake` checks the ranges).

    Attributes:
        floor: mean entropy (nats per token) below which the brake engages.
        window: logged steps averaged, and the least number of steps between two cuts.
        factor: multiplier of the learning rate per engagement.
        min_scale: the smallest learning-rate scale.
        z: engage only when the window's mean plus ``z`` standard errors is below
            ``floor`` (one-sided confidence; 0: the bare mean).
    """

    section: ClassVar[str] = "entropy_brake"

    floor: float
    window: int = 5
    factor: float = 0.5
    min_scale: float = 0.125
    z: float = 0.0


class TrainingConfig(Section):
    """A training run config file (``drgym train``; :func:`drgym.training.config.parse_config`
    returns it as a :class:`~drgym.training.config.RunConfig`).

    A key written as null (or an empty string, list or mapping) takes its default.

    Attributes:
        name: run name (non-empty); outputs go to ``runs/<name>`` unless ``output_dir``.
        output_dir: where checkpoints and logs go.
        model: ``smollm2``, a hub name, or a local folder.
        trainable_layers: train only the top N decoder layers (null: all; not with ``peft``).
        env: :class:`EnvSection`. search: :class:`SearchSettings`. tasks:
            :class:`TasksSection`. rollout: :class:`RolloutSection`. rewards: a list of
            :class:`RewardItem`. eval: :class:`EvalSettings`. launch:
            :class:`LaunchSection`. zero_variance: :class:`ZeroVarianceSection`.
            entropy_brake: :class:`EntropyBrakeSection`.
        protocol: ``tags`` (Search-R1 tags) or ``json`` (``<tool_call>`` JSON).
        grpo, sft: ``trl.GRPOConfig`` / ``trl.SFTConfig`` keyword arguments (checked by TRL).
        peft: ``peft.LoraConfig`` keyword arguments (checked by peft).
        seed: base seed.
        torch_threads: torch's intra-op threads (null or 0: torch's default).
        enable_thinking: the chat template's thinking switch (null: the template's default).

    Raises:
        ConfigError: an unknown key (with a "Did you mean" hint), a value of the wrong
            type or out of range, or a missing ``name``.
    """

    name: str
    output_dir: str | None = None
    model: str = "smollm2"
    trainable_layers: int | None = Field(None, ge=0)
    env: EnvSection = Field(default_factory=EnvSection)
    search: SearchSettings = Field(default_factory=SearchSettings)
    tasks: TasksSection = Field(default_factory=TasksSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    rewards: list[RewardItem] = Field(default_factory=lambda: [RewardItem(name="f1", weight=1.0)])
    protocol: Literal["tags", "json"] = "tags"
    eval: EvalSettings = Field(default_factory=EvalSettings)
    grpo: dict[str, Any] = Field(default_factory=dict)
    sft: dict[str, Any] = Field(default_factory=dict)
    launch: LaunchSection = Field(default_factory=LaunchSection)
    peft: dict[str, Any] = Field(default_factory=dict)
    zero_variance: ZeroVarianceSection = Field(default_factory=ZeroVarianceSection)
    entropy_brake: EntropyBrakeSection | None = None
    seed: int = 0
    torch_threads: int | None = Field(None, ge=0)
    enable_thinking: StrictBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if not (v is None or (isinstance(v, (str, list, dict)) and not v))}
        return data

    @field_validator("name")
    @classmethod
    def _strip_name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty string (the run name)")
        return v.strip()


# -- rollout run files ------------------------------------------------------------------------

DEFAULT_N = 20
"""Default number of tasks of a rollout run: the first 20 of the task set (the main job's
budget: >= 20 questions in <= 5 minutes on 2 CPU cores once the model and index are cached)."""
DEFAULT_QA_TASKS = "synth-demo"
"""The main job's questions: single-hop questions whose answer ``wiki-default`` holds and the
default env shows for the question as the query, from documents that no training, dev or
test question came from (``drgym data synth --demo-frac``), in a seeded order."""
DEFAULT_RESEARCH_TASKS = "drb-en"
DEFAULT_POLICY = "hf:smollm2-drgym"
"""The best agent drgym ships: SmolLM2-135M-Instruct with the LoRA adapter trained in drgym."""


class RolloutRun(Section):
    """A rollout run file (``drgym rollout --config FILE``, YAML or JSON): the fields of
    :class:`~drgym.evaluation.run_config.RolloutConfig`, which adds their checks.

    Attributes:
        env: Gymnasium id (``"drgym/SearchQA-v0"`` or ``"drgym/DeepResearch-v0"``).
        tasks: task-set name for :func:`drgym.envs.task_loaders.load_tasks` or a file path.
        policy: policy spec (:func:`drgym.policies.factory.make_policy`).
        backend: search backend spec: ``"local"`` (in-process index of ``wiki-default``),
            or anything :func:`drgym.search.registry.make_backend` accepts.
        n: number of tasks (the first ``n`` of the set, in file order); None = all.
        out: run directory; None = ``runs/<env>-<tasks>-<policy>``.
        seed: base seed of env resets (episode ids) and of sampling policies.
        batch_size: episodes stepped together (one policy batch, one search batch per turn).
        max_turns: env turn budget; None = the env's default.
        judge: judge spec (``"hf:smollm2"``, ``"openai:MODEL@URL"``) for the LLM soft
            match (QA) or the report rewards (research); None = no judge.
        rewards: extra reward names scored after each episode (a list, or one
            comma-separated string); research default: ``["citation"]`` without a judge,
            ``["race", "citation", "quality"]`` with one.
        policy_options: constructor options of the policy (``max_new_tokens``, ``retry``...).
        env_options: extra env keyword arguments (``max_searches``, ``top_k``...).
        plots: write PNG plots.

    Raises:
        ConfigError: an unknown field (with a "Did you mean" hint) or a value of the wrong type.
    """

    env: str = "drgym/SearchQA-v0"
    tasks: str = DEFAULT_QA_TASKS
    policy: str = DEFAULT_POLICY
    backend: str = "local"
    n: int | None = DEFAULT_N
    out: str | None = None
    seed: int = 0
    batch_size: int = 8
    max_turns: int | None = None
    judge: str | None = None
    rewards: list[str] | None = None
    policy_options: dict[str, Any] = Field(default_factory=dict)
    env_options: dict[str, Any] = Field(default_factory=dict)
    plots: bool = True

    @field_validator("tasks", "out", mode="before")
    @classmethod
    def _path_as_str(cls, v: Any) -> Any:
        return os.fspath(v) if isinstance(v, os.PathLike) else v

    @field_validator("rewards", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        return [r.strip() for r in v.split(",") if r.strip()] if isinstance(v, str) else v

    @field_validator("policy_options", "env_options", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v


# -- serving ----------------------------------------------------------------------------------


class ServeSettings(BaseModel):
    """The settings of ``drgym serve`` and ``drgym mcp`` (:class:`drgym.search.wire.ServerSettings`
    reads them from ``DRGYM_<FIELD>`` environment variables and command-line options).

    Attributes:
        corpus: named corpus to serve (``wiki-default``, ``hotpotqa``...).
        method: retrieval method of the local engine (``dense``, ``bm25``, ``hybrid``);
            None uses the engine's default.
        encoder: sentence-transformers model name or path; None uses the index's.
        index_dir: explicit index folder; None uses the cache under ``DRGYM_HOME``.
        host, port: where uvicorn listens (port 0..65535; 0 lets the OS pick).
        max_k: largest ``k`` accepted (400 beyond it).
        default_k: ``k`` of ``/search`` when the request gives none (DeepResearchGym: 10;
            lowered to ``max_k`` when larger).
        retrieve_topk: ``topk`` of ``/retrieve`` when the request gives none (Search-R1: 3;
            lowered to ``max_k`` when larger).
        max_batch_queries: most queries in one ``/retrieve`` request (400 beyond it).
        max_query_chars: longer queries are cut to this many characters before search
            (the encoder truncates to its token window anyway; this bounds BM25 work and
            cache memory). Never an error.
        batch_window_ms: how long the micro-batcher waits for more queries after the
            first one arrives, in milliseconds (0 = take whatever is queued).
        max_batch_size: most queries in one ``search_batch`` call.
        cache_mb: byte budget of the LRU result cache in MiB (estimated from the
            results' text; 0 disables the cache).
        cache_size: most entries of the LRU result cache, besides ``cache_mb``; None for
            no entry bound, 0 disables the cache.
        max_pending: most queries waiting for the batcher; beyond it requests get 429
            with ``Retry-After`` (the drgym client retries them).
        max_request_pending: most queries of one request that may wait while other
            queries wait (429 with ``Retry-After`` beyond it; an idle server takes any
            request). Large requests are served in ``max_batch_size`` chunks, in turn
            with the other requests.
        collapse: what ``/search`` returns by default: ``"document"`` (k distinct
            documents, each its best passage, as DeepResearchGym) or ``"passage"`` (k best
            passages); a request's ``collapse`` parameter overrides it.
        retrieve_collapse: the same for ``POST /retrieve``; default ``"passage"``, as
            Search-R1's retriever (whose corpus rows are 100-word passages).
        api_keys: comma-separated keys accepted in the ``x-api-key`` header; empty means
            no authentication (the default, for loopback use). A secret: never printed
            (``repr`` shows ``**********``), compared in constant time.
        log_level: uvicorn log level.
        encoder_backend: runtime of the query encoder: ``torch`` (float32), ``onnx`` (the
            same float32 weights in ONNX Runtime) or ``onnx-int8`` (those weights quantised
            to int8; rankings move a little) (:data:`drgym.embedding.ENCODER_BACKENDS`);
            None (default): ``onnx-int8`` on the CPU, ``torch`` on a GPU
            (:func:`drgym.embedding.resolve_encoder_backend`).
        mmap: memory-map the dense shards' FAISS files instead of reading them into memory
            (``LocalSearchEngine(mmap=True)``).
        search_threads: CPU threads each micro-batch's query encoding and FAISS search run
            on (``LocalSearchEngine(search_threads=...)``); default 1, the least CPU per
            request (the event loop's HTTP and JSON work runs beside it on another core);
            0: the process's thread count for large batches, one thread for small ones.
        search_params: changes to the dense search parameters
            (:data:`drgym.index.search_params.DEFAULT_SEARCH_PARAMS`: ``nprobe``, ``efSearch``,
            ``rerank``, ``probe_groups``; ``LocalSearchEngine(search_params=...)``), e.g.
            ``{"probe_groups": 1}``; None: the index's own.

    Raises:
        pydantic.ValidationError: an unknown setting or a value of the wrong type or out
            of range, when the model is built directly (as :class:`~drgym.search.wire.ServerSettings`
            is, whose errors the CLIs print field by field); :func:`parse_section` raises
            :class:`~drgym.errors.ConfigError` instead.
    """

    model_config = ConfigDict(extra="forbid")

    corpus: str = "wiki-default"
    method: str | None = None
    encoder: str | None = None
    index_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_k: int = Field(100, ge=1, le=10_000)
    default_k: int = Field(10, ge=1)
    retrieve_topk: int = Field(3, ge=1)
    max_batch_queries: int = Field(4096, ge=1)
    max_query_chars: int = Field(20_000, ge=1)
    batch_window_ms: float = Field(1.0, ge=0.0, le=1000.0)
    max_batch_size: int = Field(64, ge=1)
    cache_mb: float = Field(64.0, ge=0.0, allow_inf_nan=False)
    cache_size: int | None = Field(None, ge=0)
    max_pending: int = Field(16384, ge=1)
    max_request_pending: int = Field(4096, ge=1)
    collapse: Collapse = "document"
    retrieve_collapse: Collapse = "passage"
    api_keys: SecretStr = SecretStr("")
    log_level: str = "warning"
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] | None = None
    mmap: bool = False
    search_threads: int = Field(1, ge=0)
    search_params: dict[str, int] | None = None

    @model_validator(mode="after")
    def _defaults_within_max_k(self) -> "ServeSettings":
        # a small --max-k lowers the default k instead of refusing to start
        self.default_k = min(self.default_k, self.max_k)
        self.retrieve_topk = min(self.retrieve_topk, self.max_k)
        return self

    def key_set(self) -> frozenset[str]:
        """The accepted API keys (empty: authentication off)."""
        return frozenset(k.strip() for k in self.api_keys.get_secret_value().split(",") if k.strip())


class ServeTimeouts(Section):
    """The slow-client timeouts of a drgym server (``drgym serve --header-timeout``,
    ``--body-timeout``, ``--keep-alive-timeout``; :func:`drgym.server.app.uvicorn_options`).

    Attributes:
        header_timeout_s: seconds a client has to send a whole request head (> 0).
        body_timeout_s: seconds a client has to send a whole request body after its head (> 0).
        keep_alive_s: seconds an idle kept-alive connection stays open (> 0).

    Raises:
        ConfigError: a timeout that is not a positive number of seconds.
    """

    header_timeout_s: PositiveSeconds = 10.0
    body_timeout_s: PositiveSeconds = 60.0
    keep_alive_s: PositiveSeconds = 5.0
