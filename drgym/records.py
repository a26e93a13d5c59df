"""Records shared by the environments, the rewards, the policies and the trainer.

One episode's data, lowest layer first: :class:`Task` (what is asked), :class:`ToolCall`
and :class:`Step` (what happened each turn), :class:`Trajectory` (the whole episode,
JSON round-trip), :class:`Episode` (what a reward scores) and :class:`RewardOutput`
(what it returns); :class:`Reward` is the reward interface and :class:`ActingPolicy` the
policy interface that the rollout loop drives.

They live here, below every layer that uses them (see the README, "Layers"), so that
``drgym.envs`` and ``drgym.rewards`` both read them without importing each other.
:mod:`drgym.types` holds the search-level records (``Document``, ``SearchResult``) that
the corpus and index layers use; these are episode-level.
"""

from __future__ import annotations

import abc
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Conversation = list[dict[str, Any]]
"""A chat history: ``{"role": "system"|"user"|"assistant"|"tool", "content": str, ...}`` dicts."""


@dataclass
class Task:
    """One task an environment poses to an agent.

    Attributes:
        task_id: stable id, unique within its task set (e.g. ``"hotpotqa-5a77ec11..."``).
        question: the question (short answer) or research prompt (long form).
        answers: gold answers with all aliases; empty for research tasks.
        kind: ``"qa"`` (short answer, SearchQA) or ``"research"`` (cited report).
        gold_docs: supporting documents, as titles, URLs or doc_ids (see ``metadata``
            key ``"gold_docs_kind"``); empty when unknown.
        key_points: DeepResearchGym key points, each ``{"point": str, ...}``; empty when none.
        source: the task set name (``"hotpotqa"``, ``"musique"``, ``"drb"``...).
        metadata: any other field (question type, hop count, criteria id, language...).
    """

    task_id: str
    question: str
    answers: list[str] = field(default_factory=list)
    kind: Literal["qa", "research"] = "qa"
    gold_docs: list[str] = field(default_factory=list)
    key_points: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the field names above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError: ``task_id`` or ``question`` is missing.
        """
        return cls(
            task_id=str(d["task_id"]),
            question=str(d["question"]),
            answers=[str(a) for a in d.get("answers") or []],
            kind=d.get("kind") or "qa",
            gold_docs=[str(g) for g in d.get("gold_docs") or []],
            key_points=list(d.get("key_points") or []),
            source=str(d.get("source") or ""),
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass
class ToolCall:
    """One parsed action.

    Attributes:
        name: ``"search"``, ``"fetch"``, ``"answer"``, or ``"invalid"`` for an action
            that could not be parsed.
        arguments: ``{"query": ...}``, ``{"url": ...}``, ``{"answer": ...}``; for
            ``invalid``, ``{}``.
        protocol: ``"tags"`` (Search-R1 tags), ``"json"`` (``<tool_call>`` JSON) or
            ``"openai"`` (OpenAI-style ``tool_calls`` dicts).
        error: why the action is invalid (shown to the agent), else None.
        call_id: the tool call id for JSON/OpenAI protocols, else None.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    protocol: str = "tags"
    error: str | None = None
    call_id: str | None = None


@dataclass
class Step:
    """One environment step.

    Attributes:
        action: the agent's raw text for this turn.
        tool_calls: the parsed calls (usually one).
        observation: the text the env returned (tool results or a corrective message).
        results: retrieved documents as dicts (``SearchResult.to_dict`` or
            ``Document.to_dict``), for rewards that check citations or gold documents.
        latency_s: wall time of the step's search/fetch calls, in seconds.
        error: a backend failure recorded instead of raised, else None.
    """

    action: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    observation: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    latency_s: float = 0.0
    error: str | None = None


@dataclass
class Trajectory:
    """One whole episode.

    Attributes:
        episode_id: unique id of the episode.
        task_id: id of the :class:`~drgym.envs.tasks.Task` it answered.
        env_id: the Gymnasium id (``"drgym/SearchQA-v0"``).
        messages: the chat conversation (``{"role", "content"}`` dicts, tool messages
            included), starting with the system and user prompts.
        steps: the steps in order.
        final_answer: the answer or report text, or None if the episode was truncated
            before one was given.
        reward: the total reward at termination, or None if not scored.
        reward_components: named reward parts (``{"f1": 0.5, "em": 0.0, ...}``).
        terminated: ended with an answer.
        truncated: ended by a budget.
        timings: seconds spent per phase (``{"generation": ..., "search": ..., "env": ...,
            "reward": ...}``).
        metadata: anything else (policy name, seed, counts).
    """

    episode_id: str
    task_id: str
    env_id: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    final_answer: str | None = None
    reward: float | None = None
    reward_components: dict[str, float | None] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def actions(self) -> list[str]:
        """The agent's raw texts, one per step."""
        return [s.action for s in self.steps]

    def count(self, name: str) -> int:
        """Number of tool calls named ``name`` (``"search"``, ``"fetch"``, ``"invalid"``)."""
        return sum(1 for s in self.steps for c in s.tool_calls if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (nested dataclasses become dicts)."""
        return asdict(self)

    def to_json(self) -> str:
        """One JSON line (non-ASCII kept)."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError: ``episode_id`` or ``task_id`` is missing.
        """
        steps = []
        for s in d.get("steps") or []:
            calls = [ToolCall(**c) for c in s.get("tool_calls") or []]
            steps.append(Step(**{**s, "tool_calls": calls}))
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known and k != "steps"}
        return cls(**{**kw, "steps": steps})

    @classmethod
    def from_json(cls, line: str) -> "Trajectory":
        """Parse one JSON line written by :meth:`to_json`."""
        return cls.from_dict(json.loads(line))


_MODELS: Any = None


def _record_models():
    """The pydantic models of a trajectory record (built on first use: pydantic is not
    imported by everything that reads records)."""
    global _MODELS
    if _MODELS is None:
        from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

        Number = StrictInt | StrictFloat

        class ToolCallRecord(BaseModel):
            model_config = ConfigDict(extra="allow")
            name: StrictStr
            arguments: dict[str, Any]
            error: StrictStr | None = None

        class StepRecord(BaseModel):
            model_config = ConfigDict(extra="allow")
            action: StrictStr
            tool_calls: list[ToolCallRecord]
            observation: StrictStr
            results: list[dict[str, Any]]
            error: StrictStr | None

        class TrajectoryRecord(BaseModel):
            model_config = ConfigDict(extra="allow")
            episode_id: StrictStr
            task_id: StrictStr
            env_id: StrictStr
            messages: list[dict[str, Any]]
            steps: list[StepRecord]
            final_answer: StrictStr | None
            reward: Number | None
            reward_components: dict[str, Any]
            terminated: StrictBool
            truncated: StrictBool
            timings: dict[str, Any]
            metadata: dict[str, Any]

        _MODELS = TrajectoryRecord
    return _MODELS


def trajectory_record_error(record: Any) -> str | None:
    """Why ``record`` is not a whole :meth:`Trajectory.to_dict` record, or None when it is.

    Checked against a pydantic model of the fields :meth:`Trajectory.to_dict` always
    writes (``episode_id``, ``task_id``, ``env_id``, ``messages``, ``steps`` (each with
    ``action``, ``tool_calls``, ``observation``, ``results``, ``error``),
    ``final_answer``, ``reward``, ``reward_components``, ``terminated``, ``truncated``,
    ``timings``, ``metadata``), with their JSON types; extra fields are allowed.

    Returns:
        None for a valid record; else one line naming the first problems (``"not a JSON
        object (list)"``, ``"steps.0.action: Field required"``...).

    >>> trajectory_record_error(Trajectory(episode_id="e0", task_id="t0").to_dict()) is None
    True
    >>> trajectory_record_error([1, 2])
    'not a JSON object (list)'
    >>> trajectory_record_error({"task_id": "t0"})
    'episode_id: Field required; env_id: Field required; messages: Field required (+8 more)'
    """
    if not isinstance(record, dict):
        return f"not a JSON object ({'null' if record is None else type(record).__name__})"
    from pydantic import ValidationError

    try:
        _record_models().model_validate(record)
    except ValidationError as e:
        errs = e.errors()
        parts = [f"{'.'.join(str(x) for x in err['loc']) or '(record)'}: {err['msg']}" for err in errs[:3]]
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return "; ".join(parts) + more
    return None


@dataclass
class Episode:
    """What a reward scores.

    Attributes:
        task: the task posed.
        answer: the final answer or report text ('' when none was given).
        trajectory: the whole episode, when available (TRL completions and report files
            have none); rewards that need retrieved documents or tool counts read it.
    """

    task: Task
    answer: str
    trajectory: Trajectory | None = None


@dataclass
class RewardOutput:
    """Scores for a batch.

    Attributes:
        scores: one float per episode, or None where the reward does not apply or its
            judge failed (excluded from means, counted in ``failures``).
        components: named per-episode parts, each a list aligned with ``scores``.
        failures: number of episodes whose judge calls failed after retries.
    """

    scores: list[float | None]
    components: dict[str, list[float | None]] = field(default_factory=dict)
    failures: int = 0


class Reward(abc.ABC):
    """A reward module. Subclasses set ``name`` and implement :meth:`score`."""

    name: str = "reward"

    @abc.abstractmethod
    def score(self, episodes: list[Episode]) -> RewardOutput:
        """Score a batch of finished episodes.

        Returns:
            A :class:`RewardOutput` with ``len(scores) == len(episodes)``.
        """

    def __call__(self, episodes: list[Episode]) -> RewardOutput:
        return self.score(episodes)


@runtime_checkable
class ActingPolicy(Protocol):
    """What the rollout loop needs from a policy (:class:`drgym.policies.base.Policy` is one).

    Attributes:
        name: the spec it was built from (``"hf:smollm2"``, ``"scripted"``...).
    """

    name: str

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """One action (assistant turn) per conversation, in order."""
        ...
