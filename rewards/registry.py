"""Reward registry: resolve names and configs to :class:`~drgym.records.Reward` objects.

Accepted specs (:func:`build_reward`):

- a name: ``"f1"``, ``"em"``, ``"cover_em"``, ``"llm_match"``, ``"format"``, ``"evidence_recall"``, ``"length"``,
  ``"kpr"``, ``"citation"``, ``"quality"``, ``"race"``, ``"fact"``;
- ``{"kpr": {...kwargs}}`` or ``{"name": "kpr", "kwargs": {...}}``;
- a weighted sum: ``{"weighted": {"f1": 1.0, "format": 0.1}}`` or
  ``{"weighted": [{"name": "f1", "weight": 1.0}, {"name": "kpr", "weight": 0.5, "kwargs": {...}}]}``;
- a :class:`Reward` (returned as is).

``judge`` / ``backend`` kwargs may be specs (``"hf:smollm2"``, ``"openai:MODEL@URL"``;
``"local"``, ``"http://127.0.0.1:8000"``); :func:`build_reward` also injects a shared
judge and backend into every judge-based part that does not set its own.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from drgym.errors import ConfigError, unknown_name
from drgym.judges.factory import make_judge
from drgym.records import Episode, Reward, RewardOutput
from drgym.rewards import citation, evidence, fact, keypoints, length, qa, quality, race
from drgym.rewards.scorer import weighted_total
from drgym.search.registry import make_backend


def _factories() -> dict[str, Callable[..., Reward]]:
    return {
        "em": qa.ExactMatch,
        "cover_em": qa.CoverExactMatch,
        "f1": qa.F1,
        "llm_match": qa.SoftMatch,
        "format": qa.FormatReward,
        "evidence_recall": evidence.EvidenceRecall,
        "length": length.LengthGuard,
        "kpr": keypoints.KeyPointRecall,
        "citation": citation.CitationReward,
        "quality": quality.ReportQuality,
        "race": race.RaceReward,
        "fact": fact.FactReward,
    }


JUDGED = {"llm_match", "kpr", "citation", "quality", "race", "fact"}
NEEDS_BACKEND = {"citation", "fact"}


def reward_names() -> list[str]:
    """All registered reward names."""
    return sorted(_factories())


class WeightedReward(Reward):
    """Weighted sum of rewards: ``score = sum_i w_i * s_i`` (:func:`~drgym.rewards.scorer.weighted_total`).

    An episode is None when any part is None or NaN (judge failure or a metric that does not
    apply); ``failures`` is the number of episodes any part failed on. Components hold
    every part's components plus each part's score under its name.

    Raises:
        ConfigError: no parts, or a non-numeric weight.

    Example:
        >>> from drgym.records import Episode, Task
        >>> from drgym.rewards.qa import ExactMatch, F1
        >>> task = Task(task_id="t", question="Who wrote it?", answers=["William Shakespeare"])
        >>> out = WeightedReward([(F1(), 1.0), (ExactMatch(), 0.5)]).score([Episode(task, "Shakespeare")])
        >>> round(out.scores[0], 4), out.components["em"]
        (0.6667, [0.0])
    """

    name = "weighted"

    def __init__(self, parts: list[tuple[Reward, float]]) -> None:
        if not parts:
            raise ConfigError("A weighted reward needs at least one part.")
        for _, w in parts:
            if isinstance(w, bool) or not isinstance(w, (int, float)):
                raise ConfigError(f"reward weights must be numbers, got {w!r}.")
        self.parts = [(r, float(w)) for r, w in parts]
        self.name = "+".join(r.name for r, _ in self.parts)

    def score(self, episodes: list[Episode]) -> RewardOutput:
        cols: list[list[float | None]] = []
        comps: dict[str, list[float | None]] = {}
        failed = [False] * len(episodes)
        for r, _ in self.parts:
            out = r.score(episodes)
            comps.update(out.components)
            comps[r.name] = list(out.scores)
            cols.append(list(out.scores))
            for i, s in enumerate(out.scores):
                if s is None:
                    failed[i] = failed[i] or out.failures > 0
        weights = [w for _, w in self.parts]
        total = [weighted_total([c[i] for c in cols], weights) for i in range(len(episodes))]
        return RewardOutput(scores=total, components=comps, failures=sum(failed))


async def ascore(reward: Reward, episodes: list[Episode]) -> RewardOutput:
    """Score a batch from asyncio code without blocking the event loop.

    The reward runs in a worker thread; its judge calls run concurrently inside
    (``Judge.judge_many``, at most ``max_concurrency`` at a time).
    """

    return await asyncio.to_thread(reward.score, episodes)


def get_reward(name: str, **kwargs: Any) -> Reward:
    """Build the reward called ``name`` with constructor ``kwargs``.

    String ``judge`` and ``backend`` values are resolved with
    :func:`drgym.judges.factory.make_judge` and :func:`drgym.search.registry.make_backend`.

    Raises:
        ConfigError: unknown name (with a "did you mean"), or bad kwargs.
    """
    if not isinstance(name, str):
        raise ConfigError(
            f"get_reward takes a reward name, got {type(name).__name__}; "
            "use build_reward for configs such as {'weighted': {...}}."
        )
    facs = _factories()
    if name not in facs:
        raise unknown_name("reward", name, facs)
    if isinstance(kwargs.get("backend"), str):
        kwargs["backend"] = make_backend(kwargs["backend"])
    try:
        return facs[name](**kwargs)
    except TypeError as e:
        raise ConfigError(f"Bad options for reward {name!r}: {e}") from None


def build_reward(spec: Any, *, judge: Any = None, backend: Any = None) -> Reward:
    """Resolve a reward spec (see the module doc) to a :class:`Reward`.

    Args:
        spec: name, dict or Reward.
        judge: judge (or spec) given to every judge-based part without its own.
        backend: SearchBackend (or spec) given to citation/FACT parts without their own.

    Raises:
        ConfigError: malformed spec or unknown name.
    """
    if isinstance(spec, Reward):
        return spec
    if judge is not None and isinstance(judge, str):
        judge = make_judge(judge)
    if backend is not None and isinstance(backend, str):
        backend = make_backend(backend)

    def one(name: str, kwargs: dict[str, Any] | None) -> Reward:
        kw = dict(kwargs or {})
        if name in JUDGED and judge is not None:
            kw.setdefault("judge", judge)
        if name in NEEDS_BACKEND and backend is not None:
            kw.setdefault("backend", backend)
        return get_reward(name, **kw)

    if isinstance(spec, str):
        return one(spec, None)
    if not isinstance(spec, dict):
        raise ConfigError(f"A reward spec is a name, a dict or a Reward, got {type(spec).__name__}.")
    if "name" in spec:
        return one(str(spec["name"]), spec.get("kwargs"))
    if len(spec) != 1:
        raise ConfigError(f"A reward dict has one key (the reward name or 'weighted'), got {sorted(spec)}.")
    (key, val), = spec.items()
    if key == "weighted":
        parts: list[tuple[Reward, float]] = []
        if isinstance(val, dict):
            for name, w in val.items():
                parts.append((one(name, None), w))
        elif isinstance(val, list):
            for item in val:
                if not isinstance(item, dict) or "name" not in item:
                    raise ConfigError(f"weighted list items are {{'name', 'weight', 'kwargs'}} dicts, got {item!r}.")
                parts.append((one(str(item["name"]), item.get("kwargs")), item.get("weight", 1.0)))
        else:
            raise ConfigError(f"'weighted' takes a {{name: weight}} dict or a list of dicts, got {type(val).__name__}.")
        return WeightedReward(parts)
    if val is not None and not isinstance(val, dict):
        raise ConfigError(f"Options of reward {key!r} must be a dict, got {type(val).__name__}.")
    return one(key, val)
