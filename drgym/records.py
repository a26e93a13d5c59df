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
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictStr, ValidationError

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

RECORD_SCORE_LIMIT = 1e6
"""The largest absolute value a run-file record may hold as its ``reward`` or a
``reward_components`` value: drgym's scores lie in [0, 1], a format penalty or a count
component (``n_claims``, ``length_tokens``) stays far below it; a value beyond is a
damaged or hand-edited line (:func:`trajectory_record_error`)."""

RECORD_SECONDS_LIMIT = 1e7
"""The largest number of seconds (about 116 days) a run-file record may hold as a timing
(``timings``, ``steps[i].latency_s``, ``metadata`` ``latency_s`` / ``wall_share_s``, a
turn's ``generation_s``)."""

RECORD_COUNT_LIMIT = 10**9
"""The largest count a run-file record may hold (tokens of one turn, turns, searches,
fetches, invalid actions, observation tokens, the task's position)."""


def _record_models():
    """The pydantic models of a trajectory record (built on first use: pydantic is not
    imported by everything that reads records).

    Every number that :mod:`drgym.evaluation.metrics` reads is constrained: finite
    (``allow_inf_nan=False``, so ``NaN``, ``Infinity`` and ``1e400`` are refused), of
    its JSON type (strict: the string ``"NaN"`` is not a number, ``true`` is not a count)
    and in range (scores within +-:data:`RECORD_SCORE_LIMIT`, seconds in
    [0, :data:`RECORD_SECONDS_LIMIT`], counts in [0, :data:`RECORD_COUNT_LIMIT`]).
    """
    global _MODELS
    if _MODELS is None:
        Score = Annotated[float, Strict(), Field(ge=-RECORD_SCORE_LIMIT, le=RECORD_SCORE_LIMIT, allow_inf_nan=False)]
        Seconds = Annotated[float, Strict(), Field(ge=0.0, le=RECORD_SECONDS_LIMIT, allow_inf_nan=False)]
        Count = Annotated[int, Strict(), Field(ge=0, le=RECORD_COUNT_LIMIT)]
        # strict float accepts a JSON integer (within float range) and refuses true/false and strings
        strict = ConfigDict(extra="allow", allow_inf_nan=False)

        class ToolCallRecord(BaseModel):
            model_config = strict
            name: StrictStr
            arguments: dict[str, Any]
            error: StrictStr | None = None

        class ResultRecord(BaseModel):
            model_config = strict
            metadata: dict[str, Any] | None = None

        class StepRecord(BaseModel):
            model_config = strict
            action: StrictStr
            tool_calls: list[ToolCallRecord]
            observation: StrictStr
            results: list[ResultRecord]
            latency_s: Seconds | None = None
            error: StrictStr | None

        class UsageRecord(BaseModel):
            model_config = strict
            prompt_tokens: Count | None = None
            completion_tokens: Count | None = None
            generation_s: Seconds | None = None

        class CitationRecord(BaseModel):
            model_config = strict
            urls: list[StrictStr] | None = None

        class MetadataRecord(BaseModel):
            model_config = strict
            usage: list[UsageRecord] | None = None
            latency_s: Seconds | None = None
            wall_share_s: Seconds | None = None
            answer_confidence: Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
            turns: Count | None = None
            searches: Count | None = None
            fetches: Count | None = None
            invalid_actions: Count | None = None
            obs_tokens: Count | None = None
            task_index: Count | None = None
            wall_phases_s: dict[str, Seconds | None] | None = None
            citations: list[CitationRecord] | None = None
            task_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

        class TrajectoryRecord(BaseModel):
            model_config = strict
            episode_id: StrictStr
            task_id: StrictStr
            env_id: StrictStr
            messages: list[dict[str, Any]]
            steps: list[StepRecord]
            final_answer: StrictStr | None
            reward: Score | None
            reward_components: dict[str, Score | None]
            terminated: StrictBool
            truncated: StrictBool
            timings: dict[str, Seconds | None]
            metadata: MetadataRecord

        _MODELS = TrajectoryRecord
    return _MODELS


def trajectory_record_error(record: Any, *, partial: bool = False) -> str | None:
    """Why ``record`` is not a whole :meth:`Trajectory.to_dict` record, or None when it is.

    Checked against a pydantic model of the fields :meth:`Trajectory.to_dict` always
    writes (``episode_id``, ``task_id``, ``env_id``, ``messages``, ``steps`` (each with
    ``action``, ``tool_calls``, ``observation``, ``results``, ``error``),
    ``final_answer``, ``reward``, ``reward_components``, ``terminated``, ``truncated``,
    ``timings``, ``metadata``), with their JSON types; extra fields are allowed. The
    numbers the run metrics read must be finite and in range: ``reward`` and each
    ``reward_components`` value (a number within +-:data:`RECORD_SCORE_LIMIT`, or null),
    ``timings`` values, ``steps[i].latency_s`` and
    ``metadata`` ``latency_s`` / ``wall_share_s`` / ``usage[j].generation_s`` and the values
    of ``metadata["wall_phases_s"]`` (seconds in [0, :data:`RECORD_SECONDS_LIMIT`]), ``metadata`` ``usage[j].prompt_tokens`` /
    ``completion_tokens``, ``turns``, ``searches``, ``fetches``, ``invalid_actions``,
    ``obs_tokens``, ``task_index`` (integers in [0, :data:`RECORD_COUNT_LIMIT`]),
    ``metadata["answer_confidence"]`` (in [0, 1]) and ``metadata["task_sha256"]`` (64
    lowercase hex digits); ``metadata["usage"]`` entries, ``metadata["citations"]``
    entries (their ``urls`` a list of strings) and ``steps[i].results`` entries (their
    ``metadata`` an object) are JSON objects.

    Args:
        record: one parsed line of ``trajectories.jsonl``.
        partial: accept a record with fields missing (a hand-made run that ``drgym
            report`` reads); the fields it has must still be valid.

    Returns:
        None for a valid record; else one line naming the first problems (``"not a JSON
        object (list)"``, ``"steps.0.action: Field required"``, ``"reward: Input should
        be a finite number"``...).

    >>> trajectory_record_error(Trajectory(episode_id="e0", task_id="t0").to_dict()) is None
    True
    >>> trajectory_record_error([1, 2])
    'not a JSON object (list)'
    >>> trajectory_record_error({"task_id": "t0"})
    'episode_id: Field required; env_id: Field required; messages: Field required (+8 more)'
    >>> trajectory_record_error({**Trajectory(episode_id="e0", task_id="t0").to_dict(), "reward": float("nan")})
    'reward: Input should be a finite number'
    >>> trajectory_record_error({"task_id": "t0", "reward": 0.5}, partial=True) is None
    True
    >>> trajectory_record_error({"task_id": "t0", "reward": 1e308}, partial=True)
    'reward: Input should be less than or equal to 1000000'
    """
    if not isinstance(record, dict):
        return f"not a JSON object ({'null' if record is None else type(record).__name__})"

    try:
        _record_models().model_validate(record)
    except ValidationError as e:
        errs = [err for err in e.errors() if not (partial and err["type"] == "missing")]
        if not errs:
            return None
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
