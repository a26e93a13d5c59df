"""The shared machinery of drgym's search environments: :class:`SearchAgentEnv`.

:class:`~drgym.envs.searchqa.SearchQAEnv` and
:class:`~drgym.envs.deepresearch.DeepResearchEnv` are thin subclasses that choose the
prompts, default tasks, default reward and budgets.

A step has two phases so that a driver can batch search across environments
(:mod:`drgym.envs.driver`): :meth:`SearchAgentEnv.begin_step` parses the action and
returns a :class:`PendingStep` listing the queries and URLs it needs;
:meth:`SearchAgentEnv.end_step` takes their results and returns the usual
``(observation, reward, terminated, truncated, info)``. :meth:`SearchAgentEnv.step`
runs both with the env's own backend.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import gymnasium as gym
from drgym.envs.parsing import PROTOCOLS, TOOL_NAMES, ParsedAction, parse_action
from drgym.envs.prompts import (
    build_messages,
    corrective_message,
    format_docs,
    render_messages,
    tags_observation,
)
from drgym.envs.text import UnicodeText, count_tokens
from gymnasium.envs.registration import load_env_creator
from gymnasium.error import ResetNeeded

from drgym.errors import ConfigError, unknown_name
from drgym.records import Episode, Reward, Step, Task, ToolCall, Trajectory
from drgym.search.base import SearchBackend
from drgym.search.registry import get_backend
from drgym.types import Document, SearchResult

logger = logging.getLogger(__name__)

#: Where a reward given by name is built (``get_reward(name) -> Reward``).
REWARD_REGISTRY_ENTRY_POINT = "drgym.rewards.registry:get_reward"

#: Longest observation, in characters (the observation space's ``max_length``).
MAX_OBS_CHARS = 1_000_000

@dataclass
class PendingStep:
    """Phase one of a step: the parsed action and the backend calls it needs.

    Attributes:
        parsed: the parsed action.
        queries: search queries to run, in call order (one ``search_batch`` for all).
        urls: URLs to fetch, in call order.
        k: top-k for the searches.
        refused: call index -> reason, for calls not run (budget spent, last turn).
        started: ``time.perf_counter()`` at :meth:`SearchAgentEnv.begin_step`.
    """

    parsed: ParsedAction
    queries: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    k: int = 3
    refused: dict[int, str] = field(default_factory=dict)
    started: float = 0.0


class SearchAgentEnv(gym.Env[str, str]):
    """Base class of the search environments (see the subclasses for the full docs).

    Args:
        backend: a :class:`~drgym.search.base.SearchBackend`; None builds the default
            local engine over ``wiki-default`` on first reset (the process-wide
            ``drgym.search.registry.get_backend("local")``).
        tasks: a task-set name (``"hotpotqa-dev"``, see
            :func:`drgym.envs.task_loaders.load_tasks`) or a sequence of
            :class:`~drgym.records.Task`; None uses the subclass default.
        reward: a :class:`~drgym.records.Reward`, a reward name, or None for the
            subclass default.
        protocol: ``"tags"`` or ``"json"``: the default system prompt and how corrective
            messages are worded. Actions in every protocol of ``accept`` are parsed.
        accept: protocols accepted (default all of ``"tags"``, ``"json"``, ``"openai"``).
        max_turns: agent turns per episode (>= 1); the episode is truncated after the
            last one unless it answered. On the last turn searches and fetches are refused.
        max_searches: search calls per episode; further searches get a refusal message.
        max_fetches: fetch calls per episode; likewise.
        max_obs_tokens: budget of one tool observation in drgym tokens (see
            :mod:`drgym.envs.text`); results are cut to fit.
        max_total_obs_tokens: budget of all tool observations of an episode; exceeding it
            truncates the episode. None: unlimited.
        top_k: passages per search (1..backend.max_k).
        max_action_chars: longer actions are invalid (characters).
        format_penalty: subtracted from the final reward once per invalid action (>= 0).
        system_prompt: replaces the default system prompt.
        render_mode: None or ``"ansi"`` (``render()`` returns the conversation as text).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    kind = "qa"
    default_tasks = "hotpotqa-dev"
    default_reward = "f1"
    env_id = ""

    def __init__(
        self,
        backend: SearchBackend | None = None,
        tasks: str | Sequence[Task] | None = None,
        reward: Any = None,
        *,
        protocol: str = "tags",
        accept: Sequence[str] = PROTOCOLS,
        max_turns: int = 4,
        max_searches: int = 3,
        max_fetches: int = 2,
        max_obs_tokens: int = 500,
        max_total_obs_tokens: int | None = None,
        top_k: int = 3,
        max_action_chars: int = 32_000,
        format_penalty: float = 0.0,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        if protocol not in ("tags", "json"):
            raise ConfigError(f"protocol must be 'tags' or 'json', got {protocol!r}.")
        bad = [p for p in accept if p not in PROTOCOLS]
        if bad or not accept:
            raise ConfigError(f"accept must be a non-empty subset of {PROTOCOLS}, got {tuple(accept)!r}.")
        for name, v, lo in (("max_turns", max_turns, 1), ("max_searches", max_searches, 0), ("max_fetches", max_fetches, 0),
                            ("max_obs_tokens", max_obs_tokens, 1), ("top_k", top_k, 1), ("max_action_chars", max_action_chars, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}, got {v!r}.")
        if max_total_obs_tokens is not None and (not isinstance(max_total_obs_tokens, int) or max_total_obs_tokens < 1):
            raise ConfigError(f"max_total_obs_tokens must be None or an integer >= 1, got {max_total_obs_tokens!r}.")
        if not isinstance(format_penalty, (int, float)) or format_penalty < 0:
            raise ConfigError(f"format_penalty must be a number >= 0, got {format_penalty!r}.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode must be None or 'ansi', got {render_mode!r}.")
        if backend is not None and not isinstance(backend, SearchBackend):
            raise ConfigError(f"backend must be a drgym SearchBackend, got {type(backend).__name__}.")

        self._backend = backend
        self.tasks: list[Task] = self._resolve_tasks(tasks if tasks is not None else self.default_tasks)
        self.reward = self._resolve_reward(reward if reward is not None else self.default_reward)
        self.protocol = protocol
        self.accept = tuple(accept)
        self.max_turns = max_turns
        self.max_searches = max_searches
        self.max_fetches = max_fetches
        self.max_obs_tokens = max_obs_tokens
        self.max_total_obs_tokens = max_total_obs_tokens
        self.top_k = top_k
        self.max_action_chars = max_action_chars
        self.format_penalty = float(format_penalty)
        self.system_prompt = system_prompt
        self.render_mode = render_mode
        self.action_space = UnicodeText(max_length=max_action_chars)
        self.observation_space = UnicodeText(max_length=MAX_OBS_CHARS)
        self._task: Task | None = None
        self._done = True
        self._traj: Trajectory | None = None

    # -- configuration ---------------------------------------------------------------
    @property
    def backend(self) -> SearchBackend:
        """The search backend (the default local engine is built on first access)."""
        if self._backend is None:
            self._backend = get_backend("local")  # wiki-default, built once per process
        return self._backend

    @staticmethod
    def _resolve_tasks(tasks: str | Sequence[Task]) -> list[Task]:
        if isinstance(tasks, str):
            from drgym.envs.task_loaders import load_tasks

            out = load_tasks(tasks)
        else:
            out = list(tasks)
            bad = [type(t).__name__ for t in out if not isinstance(t, Task)]
            if bad:
                raise ConfigError(f"tasks must be Task records, got a {bad[0]}.")
        if not out:
            raise ConfigError("tasks is empty: an environment needs at least one task.")
        return out

    @staticmethod
    def _resolve_reward(reward: Any):
        if isinstance(reward, str):
            # The reward layer sits above the envs (README, "Layers"): a reward named by a
            # string is looked up through its registry's entry point, the way Gymnasium
            # resolves "module:attr" env entry points, not imported statically.
            return load_env_creator(REWARD_REGISTRY_ENTRY_POINT)(reward)
        if reward is False:
            return None
        if not isinstance(reward, Reward) and not callable(reward):
            raise ConfigError(f"reward must be a drgym Reward, a reward name or False, got {type(reward).__name__}.")
        return reward

    # -- prompts (subclasses may override) -------------------------------------------
    def initial_messages(self, task: Task) -> list[dict[str, Any]]:
        """System and user messages that open an episode on ``task``."""
        return build_messages(task, protocol=self.protocol, system=self.system_prompt)

    def format_results(self, call: ToolCall, docs: list[dict[str, Any]]) -> tuple[str, bool]:
        """Result text of one search or fetch (``Doc n (Title, URL) text``) within budget."""
        return format_docs(docs, self.max_obs_tokens)

    # -- Gymnasium API ---------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        The task is ``options["task"]`` (a Task), ``options["task_id"]``,
        ``options["task_index"]``, or else drawn with ``self.np_random`` (so a seed fixes it).

        Raises:
            ConfigError: unknown ``task_id`` or out-of-range ``task_index``.
        """
        super().reset(seed=seed)
        if self._backend is not None and not self._backend.deterministic and self.spec is not None and not self.spec.nondeterministic and not getattr(self, "_warned_nondet", False):
            self._warned_nondet = True
            logger.warning("%s is registered as deterministic but backend %r is not (a live web backend); "
                           "use the '-Web' id (drgym.envs.make_env picks it).", self.spec.id, self._backend.name)
        options = options or {}
        if isinstance(options.get("task"), Task):
            task = options["task"]
        elif "task_id" in options:
            by_id = {t.task_id: t for t in self.tasks}
            if options["task_id"] not in by_id:
                raise unknown_name("task_id", str(options["task_id"]), list(by_id)[:50])
            task = by_id[options["task_id"]]
        elif "task_index" in options:
            i = options["task_index"]
            if not isinstance(i, int) or not 0 <= i < len(self.tasks):
                raise ConfigError(f"task_index must be an integer in 0..{len(self.tasks) - 1}, got {i!r}.")
            task = self.tasks[i]
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._task = task
        self._episode_id = f"{task.task_id}-{int(self.np_random.integers(2**62)):016x}"
        self._messages = self.initial_messages(task)
        self._turn = 0
        self._searches = 0
        self._fetches = 0
        self._invalid = 0
        self._obs_tokens = 0
        self._final_answer: str | None = None
        self._done = False
        self._last_obs = render_messages(self._messages)
        self._on_reset(task)
        self._traj = Trajectory(
            episode_id=self._episode_id,
            task_id=task.task_id,
            env_id=self.spec.id if self.spec is not None else self.env_id,
            messages=self._messages,
            timings={"search": 0.0, "env": 0.0, "reward": 0.0},
            metadata={"seed": seed, "question": task.question, "kind": task.kind},
        )
        return self._last_obs, self._info(None, [], None)

    def _on_reset(self, task: Task) -> None:
        """Hook for subclasses (per-episode state)."""

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run one agent turn with the env's own backend (see :meth:`begin_step`, :meth:`end_step`)."""
        pending = self.begin_step(action)
        search_out: Any = None
        fetch_out: list[Any] = []
        if pending.queries:
            try:
                search_out = self.backend.search_batch(pending.queries, pending.k)
            except Exception as e:  # recorded and shown to the agent, never raised
                search_out = e
        for url in pending.urls:
            try:
                fetch_out.append(self.backend.fetch(url))
            except Exception as e:
                fetch_out.append(e)
        return self.end_step(pending, search_out, fetch_out)

    def begin_step(self, action: str | dict[str, Any]) -> PendingStep:
        """Phase one: parse ``action`` and list the searches and fetches to run.

        Budgets are charged here: a search or fetch beyond ``max_searches`` /
        ``max_fetches``, or on the last turn, is refused (not run) and explained in the
        observation.

        Raises:
            gymnasium.error.ResetNeeded: the episode is over (or never started).
        """
        if self._done or self._task is None:
            raise ResetNeeded("The episode is over: call reset() before step().")
        t0 = time.perf_counter()
        parsed = parse_action(action, allowed=TOOL_NAMES, protocols=self.accept, max_chars=self.max_action_chars)
        pending = PendingStep(parsed=parsed, k=min(self.top_k, self.backend.max_k), started=t0)
        last_turn = self._turn + 1 >= self.max_turns
        for i, call in enumerate(parsed.calls):
            if call.name == "search":
                if last_turn:
                    pending.refused[i] = "This was the last turn, so the search was not run; no answer was given."
                elif self._searches >= self.max_searches:
                    pending.refused[i] = f"Search budget spent ({self.max_searches} searches); give your answer now."
                else:
                    self._searches += 1
                    pending.queries.append(call.arguments["query"])
            elif call.name == "fetch":
                if last_turn:
                    pending.refused[i] = "This was the last turn, so the fetch was not run; no answer was given."
                elif self._fetches >= self.max_fetches:
                    pending.refused[i] = f"Fetch budget spent ({self.max_fetches} fetches); give your answer now."
                else:
                    self._fetches += 1
                    pending.urls.append(call.arguments["url"])
        return pending

    def end_step(
        self,
        pending: PendingStep,
        search_results: list[list[SearchResult]] | BaseException | None = None,
        fetch_results: Sequence[Document | BaseException] | None = None,
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Phase two: turn the backend results into the observation, reward and info.

        Args:
            pending: what :meth:`begin_step` returned for this env.
            search_results: one result list per ``pending.queries`` entry (in order), or
                the exception the backend raised for the batch.
            fetch_results: one Document or exception per ``pending.urls`` entry.

        Returns:
            ``(observation, reward, terminated, truncated, info)``. ``reward`` is 0.0
            until the episode ends; then the configured reward (minus format penalties).
        """
        t_backend_done = time.perf_counter()
        parsed = pending.parsed
        fetch_results = list(fetch_results or [])
        self._turn += 1
        self._messages.append(parsed.message)
        step_results: list[dict[str, Any]] = []
        errors: list[str] = []
        pieces: list[tuple[ToolCall, str]] = []  # (call, text) per call
        q_i = u_i = 0
        terminated = False
        for i, call in enumerate(parsed.calls):
            if call.name == "invalid":
                self._invalid += 1
                pieces.append((call, corrective_message(call.error or "unknown problem.", "tags" if call.protocol == "tags" else "json")))
            elif call.name == "answer":
                self._final_answer = call.arguments["answer"]
                terminated = True
            elif i in pending.refused:
                pieces.append((call, pending.refused[i]))
            elif call.name == "search":
                res = search_results
                if isinstance(res, BaseException) or res is None or q_i >= len(res):
                    err = res if isinstance(res, BaseException) else RuntimeError("no result returned for this query")
                    msg = f"Search failed: {type(err).__name__}: {err}"
                    errors.append(msg)
                    pieces.append((call, msg))
                else:
                    docs = [r.to_dict() for r in res[q_i]]
                    step_results.extend(docs)
                    text, _ = self.format_results(call, docs)
                    pieces.append((call, text))
                q_i += 1
            elif call.name == "fetch":
                doc = fetch_results[u_i] if u_i < len(fetch_results) else RuntimeError("no document returned")
                u_i += 1
                if isinstance(doc, BaseException):
                    msg = f"Fetch failed: {type(doc).__name__}: {doc}"
                    errors.append(msg)
                    pieces.append((call, msg))
                else:
                    d = doc.to_dict()
                    step_results.append(d)
                    text, _ = self.format_results(call, [d])
                    pieces.append((call, text))

        obs = self._observe(parsed, pieces, terminated)
        if len(obs) > MAX_OBS_CHARS:
            obs = obs[:MAX_OBS_CHARS]
        self._obs_tokens += count_tokens(obs)
        truncated = False
        if not terminated:
            if self._turn >= self.max_turns:
                truncated = True
            elif self.max_total_obs_tokens is not None and self._obs_tokens > self.max_total_obs_tokens:
                truncated = True
        self._done = terminated or truncated
        self._last_obs = obs

        traj = self._traj
        assert traj is not None
        latency = t_backend_done - pending.started
        traj.steps.append(Step(
            action=parsed.raw,
            tool_calls=list(parsed.calls),
            observation=obs,
            results=step_results,
            latency_s=latency if (pending.queries or pending.urls) else 0.0,
            error="; ".join(errors) or None,
        ))
        if pending.queries or pending.urls:
            traj.timings["search"] += latency
        reward = 0.0
        if self._done:
            reward = self._finish(terminated, truncated)
        traj.timings["env"] += time.perf_counter() - t_backend_done + (0.0 if (pending.queries or pending.urls) else latency)
        info = self._info(parsed, step_results, "; ".join(errors) or None)
        if self._done:
            info["final_answer"] = self._final_answer
            info["reward_components"] = dict(traj.reward_components)
            info["trajectory"] = traj
        return obs, reward, terminated, truncated, info

    # -- internals -------------------------------------------------------------------
    def _observe(self, parsed: ParsedAction, pieces: list[tuple[ToolCall, str]], terminated: bool) -> str:
        """Append the env's messages for this turn and return the observation text."""
        if not pieces:
            return ""
        structured = parsed.protocol in ("json", "openai") and all(c.call_id for c, _ in pieces)
        if structured:
            texts = []
            for call, text in pieces:
                name = call.name if call.name != "invalid" else "error"
                self._messages.append({"role": "tool", "tool_call_id": call.call_id, "name": name, "content": text})
                texts.append(text)
            return "\n\n".join(texts)
        body = "\n".join(text for _, text in pieces)
        if all(c.name == "invalid" for c, _ in pieces):
            obs = f"\n{body}\n"
        else:
            obs = tags_observation(body)
        self._messages.append({"role": "user", "content": obs})
        return obs

    def _finish(self, terminated: bool, truncated: bool) -> float:
        traj = self._traj
        assert traj is not None and self._task is not None
        traj.final_answer = self._final_answer
        traj.terminated = terminated
        traj.truncated = truncated
        traj.metadata.update({
            "turns": self._turn, "searches": self._searches, "fetches": self._fetches,
            "invalid_actions": self._invalid, "obs_tokens": self._obs_tokens,
        })
        self._finalize_trajectory(traj)
        comps: dict[str, float | None] = {}
        total = 0.0
        t0 = time.perf_counter()
        if self.reward is not None:
            try:
                out = self.reward.score([Episode(task=self._task, answer=self._answer_for_reward(), trajectory=traj)])
                score = out.scores[0]
                comps = {k: (v[0] if v else None) for k, v in out.components.items()}
                comps.setdefault(getattr(self.reward, "name", "reward"), score)
                total = float(score) if score is not None else 0.0
            except Exception as e:  # a failing reward is recorded, the rollout goes on
                traj.metadata["reward_error"] = f"{type(e).__name__}: {e}"
                comps = {getattr(self.reward, "name", "reward"): None}
        if self.format_penalty:
            comps["format_penalty"] = -self.format_penalty * self._invalid
            total -= self.format_penalty * self._invalid
        traj.timings["reward"] = time.perf_counter() - t0
        traj.reward = total
        traj.reward_components = comps
        return total

    def _answer_for_reward(self) -> str:
        """The answer text the reward scores (subclasses may rewrite it)."""
        return self._final_answer or ""

    def _finalize_trajectory(self, traj: Trajectory) -> None:
        """Hook for subclasses (e.g. resolve citations) before scoring."""

    def _info(self, parsed: ParsedAction | None, results: list[dict[str, Any]], error: str | None) -> dict[str, Any]:
        task = self._task
        assert task is not None
        return {
            "episode_id": self._episode_id,
            "task_id": task.task_id,
            "question": task.question,
            "kind": task.kind,
            "messages": list(self._messages),
            "tool_calls": [asdict(c) for c in parsed.calls] if parsed is not None else [],
            "results": results,
            "error": error,
            "turn": self._turn,
            "turns_left": self.max_turns - self._turn,
            "searches_left": self.max_searches - self._searches,
            "fetches_left": self.max_fetches - self._fetches,
            "obs_tokens": self._obs_tokens,
            "invalid_actions": self._invalid,
        }

    @property
    def task(self) -> Task | None:
        """The current task (None before the first reset)."""
        return self._task

    @property
    def trajectory(self) -> Trajectory | None:
        """The current (or last) episode's trajectory."""
        return self._traj

    @property
    def done(self) -> bool:
        """True when the episode has ended (or none started)."""
        return self._done

    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the conversation so far as text."""
        if self.render_mode != "ansi" or self._task is None:
            return None
        return "\n\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in self._messages)

    def close(self) -> None:
        """Nothing to free: the backend belongs to the caller (or is the shared default)."""
