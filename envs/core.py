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

An episode is scored when it ends, by :func:`score_finished`: the driver calls it once
per turn for every env whose episode ended in that turn, so envs that share one reward
object (a GRPO group's) are scored in one :meth:`~drgym.rewards.scorer.Scorer.score_batch`
(one judge batch); :meth:`SearchAgentEnv.step` scores its own episode alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import gymnasium as gym
from gymnasium.error import ResetNeeded

from drgym.envs.parsing import PROTOCOLS, ParsedAction, Parser
from drgym.envs.prompts import (
    build_messages,
    corrective_message,
    format_docs,
    render_messages,
    tags_observation,
    tool_response_block,
)
from drgym.envs.task_loaders import load_tasks
from drgym.envs.text import UnicodeText, count_tokens
from drgym.envs.tools import DEFAULT_TOOLS, Tool
from drgym.errors import ConfigError, unknown_name
from drgym.records import Episode, Reward, Step, Task, ToolCall, Trajectory
from drgym.rewards.calibration import split_labelled_answer
from drgym.rewards.registry import get_reward
from drgym.rewards.scorer import Scored, Scorer
from drgym.search.base import SearchBackend
from drgym.search.registry import get_backend
from drgym.search.web import url_key

logger = logging.getLogger(__name__)

#: Longest observation, in characters (the observation space's ``max_length``).
MAX_OBS_CHARS = 1_000_000

@dataclass
class PendingStep:
    """Phase one of a step: the parsed action and the tool calls it needs.

    Attributes:
        parsed: the parsed action.
        calls: tool name -> its arguments to run, in call order (one batched
            :meth:`~drgym.envs.tools.Tool.call_batch` per tool).
        k: top-k for the searches.
        refused: call index -> reason, for calls not run (budget spent, last turn).
        started: ``time.perf_counter()`` at :meth:`SearchAgentEnv.begin_step`.
    """

    parsed: ParsedAction
    calls: dict[str, list[str]] = field(default_factory=dict)
    k: int = 3
    refused: dict[int, str] = field(default_factory=dict)
    started: float = 0.0

    @property
    def queries(self) -> list[str]:
        """The search queries (``calls["search"]``)."""
        return self.calls.get("search", [])

    @property
    def urls(self) -> list[str]:
        """The URLs to fetch (``calls["fetch"]``)."""
        return self.calls.get("fetch", [])


class SearchAgentEnv(gym.Env[str, str]):
    """Base class of the search environments (see the subclasses for the full docs).

    Args:
        backend: a :class:`~drgym.search.base.SearchBackend`; None builds the default
            local engine over ``wiki-default`` on first reset (the process-wide
            ``drgym.search.registry.get_backend("local")``).
        tasks: a task-set name (``"hotpotqa-dev"``, see
            :func:`drgym.envs.task_loaders.load_tasks`) or a sequence of
            :class:`~drgym.records.Task`; None uses the subclass default.
        reward: a :class:`~drgym.records.Reward`, a reward name (built with
            :func:`drgym.rewards.registry.get_reward`), False for none, or None for the
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
        tools: the :class:`~drgym.envs.tools.Tool` objects the agent may call (default
            search, fetch, answer); a tool's budget is its ``budget(env)``.
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
        tools: Sequence[Tool] = DEFAULT_TOOLS,
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
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.parser = Parser(tuple(self.tools.values()), self.accept, max_action_chars)
        self.format_penalty = float(format_penalty)
        self.system_prompt = system_prompt
        self.render_mode = render_mode
        self.action_space = UnicodeText(max_length=max_action_chars)
        self.observation_space = UnicodeText(max_length=MAX_OBS_CHARS)
        self._task: Task | None = None
        self._done = True
        self._traj: Trajectory | None = None
        self._unscored = False  # the episode has ended and waits for score_finished

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
            return get_reward(reward)
        if reward is False:
            return None
        if not isinstance(reward, Reward) and not callable(reward):
            raise ConfigError(f"reward must be a drgym Reward, a reward name or False, got {type(reward).__name__}.")
        return reward

    # -- prompts (subclasses may override) -------------------------------------------
    def initial_messages(self, task: Task) -> list[dict[str, Any]]:
        """System and user messages that open an episode on ``task``."""
        return build_messages(task, protocol=self.protocol, system=self.system_prompt, tools=tuple(self.tools.values()))

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
        self._used: dict[str, int] = {}  # tool name -> calls run this episode
        self._invalid = 0
        self._obs_tokens = 0
        self._final_answer: str | None = None
        self._done = False
        self._unscored = False
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
        results: dict[str, Any] = {}
        for name, args in pending.calls.items():
            try:
                results[name] = self.tools[name].call_batch(self.backend, args, k=pending.k)
            except Exception as e:  # recorded and shown to the agent, never raised
                results[name] = e
        return self.end_step(pending, results)

    def begin_step(self, action: str | dict[str, Any]) -> PendingStep:
        """Phase one: parse ``action`` and list the tool calls to run.

        Budgets are charged here: a call beyond its tool's budget (``max_searches``,
        ``max_fetches``...), or any tool call on the last turn, is refused (not run) and
        explained in the observation.

        Raises:
            gymnasium.error.ResetNeeded: the episode is over (or never started).
        """
        if self._done or self._task is None:
            raise ResetNeeded("The episode is over: call reset() before step().")
        t0 = time.perf_counter()
        parsed = self.parser.parse(action)
        pending = PendingStep(parsed=parsed, k=min(self.top_k, self.backend.max_k), started=t0)
        last_turn = self._turn + 1 >= self.max_turns
        for i, call in enumerate(parsed.calls):
            tool = self.tools.get(call.name)
            if tool is None or tool.terminal:
                continue
            budget = tool.budget(self)
            if last_turn:
                pending.refused[i] = f"This was the last turn, so the {tool.name} was not run; no answer was given."
            elif tool.reads_url and not self._fetch_allowed(str(call.arguments.get(tool.argument, ""))):
                pending.refused[i] = ("That URL was not in this episode's search results, so it was not fetched; "
                                      "fetch a URL from a result.")
            elif budget is not None and self._used.get(tool.name, 0) >= budget:
                pending.refused[i] = f"{tool.label} budget spent ({budget} {tool.plural}); give your answer now."
            else:
                self._used[tool.name] = self._used.get(tool.name, 0) + 1
                pending.calls.setdefault(tool.name, []).append(tool.value(call.arguments))
        return pending

    def _fetch_allowed(self, url: str) -> bool:
        """Whether ``fetch(url)`` may run: always for a local corpus; for a web backend that
        fetches only result URLs (``fetch_any_url`` false, the default) only a URL that one
        of this episode's searches returned (compared as :func:`drgym.search.web.url_key`
        does), so one episode cannot fetch what another one's results held."""
        backend = self.backend
        restricted = getattr(backend, "fetch_any_url", None)
        if restricted is None:
            restricted = getattr(getattr(backend, "inner", None), "fetch_any_url", None)
        if restricted is not False:
            return True

        key = url_key(url)
        traj = self._traj
        return traj is not None and any(url_key(str(r.get("url") or "")) == key
                                        for st in traj.steps for r in st.results or [])

    def end_step(
        self,
        pending: PendingStep,
        results: dict[str, list[Any] | BaseException | None] | None = None,
        *,
        score: bool = True,
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Phase two: turn the tool results into the observation, reward and info.

        Args:
            pending: what :meth:`begin_step` returned for this env.
            results: tool name -> one result per ``pending.calls[name]`` entry (in
                order; an entry may be the exception of that call), or the exception the
                tool raised for the whole batch.
            score: score an episode that ends here now; False leaves it to the caller's
                :func:`score_finished` (the driver scores a turn's episodes together),
                and the returned reward and ``info["reward_components"]`` are then not
                yet the episode's.

        Returns:
            ``(observation, reward, terminated, truncated, info)``. ``reward`` is 0.0
            until the episode ends; then the configured reward (minus format penalties).
        """
        t_backend_done = time.perf_counter()
        parsed = pending.parsed
        results = results or {}
        self._turn += 1
        self._messages.append(parsed.message)
        step_results: list[dict[str, Any]] = []
        errors: list[str] = []
        pieces: list[tuple[ToolCall, str]] = []  # (call, text) per call
        seen: dict[str, int] = {}
        terminated = False
        for i, call in enumerate(parsed.calls):
            tool = self.tools.get(call.name)
            if call.name == "invalid":
                self._invalid += 1
                # a turn in no protocol at all (free text) is corrected in the env's own protocol
                protocol = (call.protocol if parsed.protocol is not None else self.protocol)
                pieces.append((call, corrective_message(call.error or "unknown problem.",
                                                        "tags" if protocol == "tags" else "json",
                                                        tuple(self.tools.values()))))
            elif tool is not None and tool.terminal:
                self._final_answer = call.arguments[tool.argument]
                # BrowseComp's labelled format: score the exact answer, keep the stated confidence
                self._final_answer, labels = split_labelled_answer(self._final_answer, self._task.kind)
                if labels is not None:
                    self._traj.metadata["answer_confidence"] = labels.confidence
                    self._traj.metadata["answer_explanation"] = labels.explanation
                terminated = True
            elif i in pending.refused:
                pieces.append((call, pending.refused[i]))
            elif tool is not None:
                res = results.get(call.name)
                j = seen.get(call.name, 0)
                seen[call.name] = j + 1
                if isinstance(res, BaseException):
                    item: Any = res
                elif res is None or j >= len(res):
                    item = RuntimeError(tool.missing)
                else:
                    item = res[j]
                if isinstance(item, BaseException):
                    msg = f"{tool.label} failed: {type(item).__name__}: {item}"
                    errors.append(msg)
                    pieces.append((call, msg))
                else:
                    docs = tool.to_docs(item)
                    step_results.extend(docs)
                    text, _ = self.format_results(call, docs)
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
        ran = any(pending.calls.values())
        traj.steps.append(Step(
            action=parsed.raw,
            tool_calls=list(parsed.calls),
            observation=obs,
            results=step_results,
            latency_s=latency if ran else 0.0,
            error="; ".join(errors) or None,
        ))
        if ran:
            traj.timings["search"] += latency
        reward = 0.0
        if self._done:
            self._close_episode(terminated, truncated)
            if score:
                [reward] = score_finished([self])
        traj.timings["env"] += time.perf_counter() - t_backend_done + (0.0 if ran else latency)
        info = self._info(parsed, step_results, "; ".join(errors) or None)
        if self._done:
            info["final_answer"] = self._final_answer
            info["reward_components"] = dict(traj.reward_components)
            info["trajectory"] = traj
        return obs, reward, terminated, truncated, info

    def end_episode(self, *, score: bool = True) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the running episode as truncated without another agent turn.

        For a caller whose own budget ran out (the GRPO rollout's token caps): the
        episode is finished and scored as if a budget of the env had truncated it
        (``score=False``: as in :meth:`end_step`, scored later by :func:`score_finished`).

        Returns:
            ``(observation, reward, False, True, info)`` as the last :meth:`step` would.

        Raises:
            gymnasium.error.ResetNeeded: the episode is over (or never started).
        """
        if self._done or self._task is None:
            raise ResetNeeded("The episode is over: call reset() before end_episode().")
        self._done = True
        self._close_episode(False, True)
        reward = score_finished([self])[0] if score else 0.0
        traj = self._traj
        assert traj is not None
        info = self._info(None, [], None)
        info["final_answer"] = self._final_answer
        info["reward_components"] = dict(traj.reward_components)
        info["trajectory"] = traj
        return self._last_obs, reward, False, True, info

    # -- internals -------------------------------------------------------------------
    def _observe(self, parsed: ParsedAction, pieces: list[tuple[ToolCall, str]], terminated: bool) -> str:
        """Append the env's messages for this turn and return the observation text."""
        if not pieces:
            return ""
        declared = [tc["id"] for tc in parsed.message.get("tool_calls") or []]
        if declared:
            # OpenAI's pairing rule: exactly one tool message per declared id, in order.
            # A call that expanded to several (a `queries` list) gets one reply holding
            # every result; errors that belong to no declared call (a <tool_call> block
            # that is not a call) open the first reply; a declared call with no text of
            # its own (the whole turn was refused) gets those errors.
            own: dict[str, list[tuple[ToolCall, str]]] = {d: [] for d in declared}
            names = {tc["id"]: tc["function"]["name"] for tc in parsed.message["tool_calls"]}
            loose: list[str] = []
            for call, text in pieces:
                if call.call_id in own:
                    own[call.call_id].append((call, text))
                else:
                    loose.append(text)
            texts = []
            for n, d in enumerate(declared):
                mine = [self._labelled(c, t) if len(own[d]) > 1 else t for c, t in own[d]]
                parts = mine if (n and mine) else loose + mine
                content = "\n\n".join(parts) or "This call was not run."
                self._messages.append({"role": "tool", "tool_call_id": d, "name": names[d], "content": content})
                texts.append(tool_response_block(content))
            return "".join(texts)
        body = "\n".join(text for _, text in pieces)
        if all(c.name == "invalid" for c, _ in pieces):
            obs = f"\n{body}\n"
        else:
            obs = tags_observation(body)
        self._messages.append({"role": "user", "content": obs})
        return obs

    def _labelled(self, call: ToolCall, text: str) -> str:
        """``text`` headed by the call it answers (``Search 'Berlin':``), for a reply that
        holds the results of several queries of one call."""
        tool = self.tools.get(call.name)
        if tool is None or tool.argument not in call.arguments:
            return text
        return f"{tool.label} {call.arguments[tool.argument]!r}:\n{text}"

    def _close_episode(self, terminated: bool, truncated: bool) -> None:
        """Record the episode's end in its trajectory; it waits for :func:`score_finished`."""
        traj = self._traj
        assert traj is not None and self._task is not None
        traj.final_answer = self._final_answer
        traj.terminated = terminated
        traj.truncated = truncated
        traj.metadata.update({
            "turns": self._turn, "searches": self._used.get("search", 0), "fetches": self._used.get("fetch", 0),
            "invalid_actions": self._invalid, "obs_tokens": self._obs_tokens,
        })
        self._finalize_trajectory(traj)
        self._unscored = True

    def _episode(self) -> Episode:
        """The finished episode as its reward scores it."""
        assert self._task is not None and self._traj is not None
        return Episode(task=self._task, answer=self._answer_for_reward(), trajectory=self._traj)

    def _settle(self, label: str | None, res: Scored | None) -> float:
        """The episode's total from its reward's result (None: no reward): the score (0.0
        for a missing one, whose trajectory keeps reward None) minus the format penalty."""
        traj = self._traj
        assert traj is not None
        total, scored = 0.0, True
        if label is not None and res is not None:
            score = res.scores[label]
            if label in res.errors:
                traj.metadata["reward_error"] = res.errors[label]
            scored = score is not None
            total = float(score) if score is not None else 0.0
        if self.format_penalty:
            traj.reward_components["format_penalty"] = -self.format_penalty * self._invalid
            total -= self.format_penalty * self._invalid
        # the trajectory keeps None for a missing score; the Gymnasium step reward must be a float (0.0)
        traj.reward = total if scored else None
        self._unscored = False
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
            "searches_left": self.max_searches - self._used.get("search", 0),
            "fetches_left": self.max_fetches - self._used.get("fetch", 0),
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


def score_finished(envs: Sequence[SearchAgentEnv]) -> list[float]:
    """Score the episodes that just ended in ``envs``; returns each one's step reward.

    Envs that share one reward object are scored together: one
    :meth:`~drgym.rewards.scorer.Scorer.score_batch` per reward object, so a judged
    reward sees a whole GRPO group (whose envs share the run's reward) in one batch.
    Results go into each trajectory by the Scorer's merge rule (a component named like
    the reward wins over its score). A reward that fails, a judge outage included, is
    logged and recorded: the trajectory's ``reward`` is None, ``reward_components``
    holds None under the reward's name, ``metadata["reward_error"]`` the error; the step
    reward is then 0.0 (Gymnasium's reward is a float). The format penalty
    (``format_penalty`` per invalid action) is subtracted and recorded as the
    ``format_penalty`` component.

    Returns:
        One float per env, in order: the score minus the format penalty.

    Raises:
        ValueError: an env has no finished episode waiting to be scored (never ended, or
            already scored).
    """
    bad = [i for i, e in enumerate(envs) if not getattr(e, "_unscored", False)]
    if bad:
        raise ValueError(f"score_finished: env(s) {bad[:5]} have no finished, unscored episode.")
    results: dict[int, tuple[str, Scored]] = {}
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(envs):
        if e.reward is not None:
            groups.setdefault(id(e.reward), []).append(i)
    for idx in groups.values():
        # the env records a judge outage like any failure (stop_on=()): the step ends with reward None
        scorer = Scorer(envs[idx[0]].reward, stop_on=())
        [label] = scorer.names
        for i, res in zip(idx, scorer.score_batch([envs[i]._episode() for i in idx])):
            results[i] = (label, res)
    out = []
    for i, e in enumerate(envs):
        label, res = results.get(i, (None, None))
        out.append(e._settle(label, res))
    return out
