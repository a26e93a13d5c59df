"""Episode records: :class:`ToolCall`, :class:`Step` and :class:`Trajectory`.

A trajectory is everything needed to score, inspect or train on one episode; it
round-trips through JSON (one episode per JSONL line).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


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
