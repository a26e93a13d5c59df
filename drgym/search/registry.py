"""Build any search backend from a short spec, optionally recorded or replayed.

>>> make_backend("local")                                   # doctest: +SKIP
>>> make_backend("serper", mode="record", store="web.sqlite")  # doctest: +SKIP
>>> make_backend("serper", mode="replay", store="web.sqlite")  # offline, no key  # doctest: +SKIP

Specs:

==================== ====================================================================
``local``            :class:`~drgym.search.local.LocalSearchEngine` over ``wiki-default``
``local:<name>``     over a named corpus or an index name/folder (``local:hotpotqa``)
``serper``           :class:`~drgym.search.web.SerperSearch` (``SERPER_API_KEY``)
``tavily``           :class:`~drgym.search.web.TavilySearch` (``TAVILY_API_KEY``)
``brave``            :class:`~drgym.search.web.BraveSearch` (``BRAVE_API_KEY``)
``deepresearchgym``  the public DeepResearchGym API, ``https://clueweb22.us``
                     (:class:`~drgym.search.client.HTTPSearchClient`, ``DEEPRESEARCHGYM_API_KEY``;
                     ``base_url=`` or ``DEEPRESEARCHGYM_BASE_URL`` point it elsewhere)
``http://host:port`` a ``drgym serve`` server or any DeepResearchGym-compatible API
``mcp:URL``          an MCP server over streamable HTTP (``mcp:http://127.0.0.1:8000/mcp``):
                     ``drgym mcp``, BrowseComp-Plus's server... (:class:`~drgym.search.mcp.MCPSearchBackend`)
``mcp:stdio:CMD``    an MCP server started as a subprocess (``mcp:stdio:drgym mcp --corpus hotpotqa``)
``record:FILE#SPEC`` ``SPEC`` live, every call written to the SQLite recording ``FILE``
``cache:FILE#SPEC``  ``SPEC``, answering from ``FILE`` when it can and recording misses
``replay:FILE[#SPEC]`` only from ``FILE`` (offline); ``#SPEC`` names the recorded backend,
                     and may be left out when the recording holds one backend
==================== ====================================================================

:func:`get_backend` is the process cache over :func:`make_backend`: one backend per
spec (and keyword arguments) per process, shared by every env, the rollout runner and
the trainer; :func:`make_backend` always builds a new one.

Modes (:mod:`drgym.search.record`): ``live`` (the bare backend), ``record``, ``cache``
(both wrap it in a :class:`~drgym.search.record.RecordReplayBackend` writing ``store``),
``replay`` (answers only from ``store``; the live backend is never built, so no key,
index or network is needed). Record and replay key the store by :func:`record_name`
of the spec, so ``make_backend("serper", mode="replay", store=...)`` finds what
``make_backend("serper", mode="record", store=...)`` wrote.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from drgym.config import SearchSettings, parse_section
from drgym.corpus.named import NAMED
from drgym.errors import AuthError, ConfigError, unknown_name
from drgym.paths import indexes_dir
from drgym.search.base import SearchBackend
from drgym.search.client import HTTPSearchClient
from drgym.search.mcp import MCPSearchBackend, parse_spec, spec_record_name
from drgym.search.record import MODES, RecordReplayBackend, RecordStore
from drgym.search.web import WEB_BACKENDS

#: Named specs (besides ``local:<name>``, ``http(s)://`` URLs and ``mcp:`` servers).
NAMES: tuple[str, ...] = ("local", "serper", "tavily", "brave", "deepresearchgym")
DEEPRESEARCHGYM_ENV = "DEEPRESEARCHGYM_API_KEY"


#: Mode prefixes of a spec (``replay:FILE[#SPEC]``...), see the module docstring.
MODE_PREFIXES: tuple[str, ...] = ("record", "cache", "replay")


def split_mode(spec: str) -> tuple[str, str | None, str | None]:
    """``"replay:web.sqlite#serper"`` -> ``("replay", "web.sqlite", "serper")``.

    Returns:
        ``(mode, store, inner_spec)``: ``("live", None, spec)`` for a spec without a mode
        prefix; ``inner_spec`` is None for ``replay:FILE``.

    Raises:
        ConfigError: a mode prefix without a file, or ``record:``/``cache:`` without ``#SPEC``.
    """
    s = spec.strip()
    head, sep, rest = s.partition(":")
    if not sep or head.lower() not in MODE_PREFIXES:
        return "live", None, s
    mode = head.lower()
    store, _, inner = rest.partition("#")
    if not store.strip():
        raise ConfigError(f"{spec!r}: give the recording file, e.g. '{mode}:runs/web.sqlite#serper'.")
    if mode != "replay" and not inner.strip():
        raise ConfigError(f"{spec!r}: {mode} needs the backend to record, e.g. '{mode}:{store}#serper'.")
    return mode, store.strip(), (inner.strip() or None)


def _kind(spec: str) -> str:
    s = spec.strip()
    if s.startswith(("http://", "https://")):
        return "http"
    head = s.split(":", 1)[0].lower()
    if head == "mcp":
        return "mcp"
    if head not in NAMES:
        raise unknown_name("search backend", s, [*NAMES, "local:<corpus>", "http://host:port",
                                                 "mcp:http://host:port/mcp", "mcp:stdio:COMMAND"])
    if ":" in s and head != "local":
        raise ConfigError(f"Only 'local' takes a ':<name>' suffix, got {spec!r}.")
    return head


def record_name(spec: str) -> str:
    """The name a spec's recordings are keyed by: ``"serper"``, ``"local:hotpotqa"``,
    ``"http://127.0.0.1:8000"`` (lower-cased names; URLs without a trailing slash).

    Raises:
        ConfigError: unknown spec.
    """
    kind = _kind(spec)
    s = spec.strip()
    if kind == "http":
        return s.rstrip("/")
    if kind == "mcp":
        return spec_record_name(s)
    if kind == "local":
        return "local" if s.lower() in ("local", "local:wiki-default") else "local:" + s.split(":", 1)[1]
    return kind


def _build_live(spec: str, kind: str, kwargs: dict[str, Any]) -> SearchBackend:
    if kind == "local":
        # numpy and the index reader: 128 modules, about 0.1 s of CPU, which `drgym --help`
        # would pay through the reward registry
        from drgym.search.local import LocalSearchEngine  # noqa: PLC0415  (numpy: see above)

        target = spec.split(":", 1)[1] if ":" in spec else kwargs.pop("corpus", "wiki-default")

        folder = Path(str(target)).expanduser()
        if (folder / "manifest.json").exists() or (indexes_dir() / str(target) / "manifest.json").exists():
            return LocalSearchEngine.open(target, **kwargs)
        return LocalSearchEngine.from_corpus(str(target), **kwargs)
    if kind in ("serper", "tavily", "brave"):
        return WEB_BACKENDS[kind](**kwargs)
    if kind == "mcp":
        return MCPSearchBackend.from_spec(spec, **kwargs)

    if kind == "deepresearchgym":
        key = kwargs.pop("api_key", None) or os.environ.get(DEEPRESEARCHGYM_ENV, "")
        if not key.strip():
            raise AuthError(
                f"deepresearchgym: no API key. Set {DEEPRESEARCHGYM_ENV} (keys are given on request by the "
                "DeepResearchGym authors, deepresearchgym@cmu.edu), or use mode='replay' with a recording."
            )
        base = kwargs.pop("base_url", None) or os.environ.get("DEEPRESEARCHGYM_BASE_URL")
        if base:  # a mirror, a proxy, or a loopback fake in tests
            kwargs.setdefault("drgym", False)
            return HTTPSearchClient(base, api_key=key.strip(), name="deepresearchgym", **kwargs)
        return HTTPSearchClient.deepresearchgym(api_key=key.strip(), name="deepresearchgym", **kwargs)
    return HTTPSearchClient(spec.strip(), **kwargs)


def check_spec(spec: str) -> None:
    """Check a backend spec without building the backend (no index load, no connection).

    Raises:
        ConfigError: unknown spec, a mode prefix without its file or backend, a
            ``replay:`` recording that does not exist, or a ``local:NAME`` that is no
            named corpus, index name or existing path.
    """

    mode, store, inner = split_mode(spec)
    if mode == "replay" and not Path(str(store)).exists():
        raise ConfigError(f"replay: no recording at {store}.")
    if inner is None:
        return
    if _kind(inner) == "local" and ":" in inner:
        target = inner.split(":", 1)[1]
        folder = Path(target).expanduser()
        if not (target in NAMED or folder.exists() or (indexes_dir() / target / "manifest.json").exists()):
            raise unknown_name("corpus or index for local:NAME (a named corpus, an index under "
                               f"{indexes_dir()}, or an existing path)", target, [*NAMED, *_index_names()])
    if _kind(inner) == "mcp":
        parse_spec(inner)
    elif _kind(inner) == "http":
        u = urlparse(inner.strip())
        if not u.netloc:
            raise ConfigError(f"backend URL {inner!r} has no host; give e.g. 'http://127.0.0.1:8000'.")


def _index_names() -> list[str]:
    """Index folders under ``$DRGYM_HOME/indexes`` (for a "Did you mean" hint)."""

    root = indexes_dir()
    return sorted(p.name for p in root.iterdir() if (p / "manifest.json").exists()) if root.is_dir() else []


def _replay_max_k(kind: str) -> int:
    if kind in ("serper", "tavily", "brave"):
        return WEB_BACKENDS[kind].max_k
    return 100


def make_backend(
    spec: str | SearchBackend,
    *,
    mode: str = "live",
    store: str | Path | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> SearchBackend:
    """Build the backend named by ``spec`` in ``mode``.

    Args:
        spec: see the module docstring (mode prefixes included), or an already built
            backend (wrapped as asked).
        mode: ``"live"``, ``"record"``, ``"cache"`` or ``"replay"``.
        store: the SQLite recording (required unless ``mode == "live"``).
        name: the recording key (default :func:`record_name` of ``spec``, or the
            backend's ``name`` when ``spec`` is a backend).
        kwargs: passed to the live backend's constructor (``api_key``, ``base_url``,
            ``retry``... for web backends; ``method``, ``corpus`` for local; ``retry``,
            ``route`` for HTTP; ``search_tool``, ``document_tool``, ``retry`` for MCP).
            ``retry`` is a :class:`~drgym.config.RetryPolicy` or its fields (``{"attempts":
            2, "timeout_s": 10}``). A config's ``search:`` section lists them all
            (:class:`~drgym.config.SearchSettings`). Ignored in replay.

    Returns:
        A :class:`SearchBackend`; in replay it has ``deterministic = True``.

    Raises:
        ConfigError: unknown spec or mode; no ``store`` for record/cache/replay; in
            replay, a store file that does not exist.
        AuthError: a web backend or DeepResearchGym without its key (live/record/cache).
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}.")
    if isinstance(spec, str) and split_mode(spec)[0] != "live":
        if mode != "live" or store is not None:
            raise ConfigError(f"{spec!r} names its own mode and recording; do not pass mode= or store= as well.")
        mode, store, inner = split_mode(spec)
        if inner is None:
            inner = _only_recorded_backend(store)
            name = name or inner
        return make_backend(inner, mode=mode, store=store, name=name, **kwargs)
    if mode != "live" and store is None:
        raise ConfigError(f"mode {mode!r} needs store=<path to a .sqlite recording>.")
    if isinstance(spec, SearchBackend):
        if mode == "live":
            return spec
        return RecordReplayBackend(spec, store, mode=mode, name=name or spec.name)  # type: ignore[arg-type]
    kind = _kind(spec)
    key = name or record_name(spec)
    if mode == "replay":
        return RecordReplayBackend(None, store, mode="replay", name=key, max_k=_replay_max_k(kind))  # type: ignore[arg-type]
    live = _build_live(spec, kind, dict(kwargs))
    if mode == "live":
        return live
    return RecordReplayBackend(live, store, mode=mode, name=key)  # type: ignore[arg-type]


def _only_recorded_backend(store: str | Path) -> str:
    """The one backend name recorded in ``store`` (for ``replay:FILE`` without ``#SPEC``)."""

    if not Path(store).exists():
        raise ConfigError(f"replay: no recording at {store}.")
    rs = RecordStore(store, readonly=True)
    try:
        names = rs.backends()
    finally:
        rs.close()
    if len(names) != 1:
        raise ConfigError(f"replay:{store} holds {len(names)} backends ({', '.join(names) or 'none'}); "
                          f"name one: 'replay:{store}#NAME'.")
    return names[0]


_CACHE: dict[str, SearchBackend] = {}
_CACHE_LOCK = threading.Lock()


def get_backend(spec: str | SearchBackend, **kwargs: Any) -> SearchBackend:
    """The process-wide backend of ``spec``: built by :func:`make_backend` on first use, then shared.

    Keyed by the spec and the keyword arguments (``get_backend("local:hotpotqa",
    method="bm25")`` and ``get_backend("local:hotpotqa")`` are two backends). A backend
    passed in is returned as is. Callers share the result: do not close it.

    Raises:
        ConfigError, AuthError: as :func:`make_backend`.
    """
    if isinstance(spec, SearchBackend):
        return spec
    key = json.dumps([spec.strip(), kwargs], sort_keys=True, default=str)
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = make_backend(spec, **kwargs)
        return _CACHE[key]


def backend_from_settings(settings: dict[str, Any] | None) -> SearchBackend:
    """The (cached) backend of a config's ``search:`` section
    (:class:`~drgym.config.SearchSettings`).

    ``{backend: SPEC, **kwargs}`` takes any spec of the module docstring (what
    ``drgym rollout --backend`` takes); ``{corpus: NAME, **kwargs}`` is short for
    ``{backend: "local:NAME", ...}``; ``{}`` is ``local`` (``wiki-default``). The other
    keys are keyword arguments of :func:`make_backend` (``method: bm25``,
    ``retry: {attempts: 2, timeout_s: 10}``...).

    Raises:
        ConfigError: an unknown key (with a "Did you mean" hint) or a value of the wrong
            type, both ``backend`` and ``corpus``, an unknown spec or an argument the
            backend does not take.
    """
    parse_section(SearchSettings, settings)
    kw = dict(settings or {})
    if "backend" in kw and "corpus" in kw:
        raise ConfigError(f"search: give 'backend' or 'corpus', not both (got {settings!r}).")
    spec = str(kw.pop("backend", None) or "local:" + str(kw.pop("corpus", "wiki-default")))
    if spec == "local:wiki-default":
        spec = "local"
    try:
        return get_backend(spec, **kw)
    except TypeError as e:
        raise ConfigError(f"bad search settings {settings!r}: {e}") from e


def parse_backend_list(text: str) -> list[str]:
    """Split ``"local,serper, tavily"`` into specs, checking each one.

    Raises:
        ConfigError: empty list, unknown or duplicate spec.
    """
    specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ConfigError(f"No backend in {text!r}; give e.g. 'local,serper'.")
    seen: set[str] = set()
    for s in specs:
        key = record_name(s)
        if key in seen:
            raise ConfigError(f"Backend {s!r} is listed twice in {text!r}.")
        seen.add(key)
    return specs
