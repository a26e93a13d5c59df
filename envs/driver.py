"""Batched rollouts: step N environments together with one ``search_batch`` per turn.

Search-R1's rollout loop (``LLMGenerationManager.run_llm_loop``) generates for every
active row, then sends **one** batched request to the retriever per turn; this module
does the same for drgym envs::

    driver = BatchedDriver([gym.make("drgym/SearchQA-v0", backend=engine) for _ in range(8)])
    trajectories = driver.run(policy, [{"task_id": t.task_id} for t in tasks])
    write_trajectories("runs/x/trajectories.jsonl", trajectories)

This is drgym's one multi-turn loop: ``drgym rollout``, ``drgym train eval``, the
training-time evaluation and GRPO's ``rollout_func`` all run :meth:`BatchedDriver.run`.

Each turn the driver calls :meth:`~drgym.envs.core.SearchAgentEnv.begin_step` on every
stepped env, merges their queries into one ``backend.search_batch`` per (backend, k)
(split into ``search_chunk``-sized requests sent from a thread pool when set, for HTTP
backends), runs the fetches on a thread pool, and hands each env its own results through
:meth:`~drgym.envs.core.SearchAgentEnv.end_step`. If a merged batch fails, each env's
queries are retried alone so that one bad query cannot fail the others; what still
fails is shown to that env's agent and recorded in its trajectory. The episodes that end
in a turn are then scored together (:func:`~drgym.envs.core.score_finished`: one
:meth:`~drgym.rewards.scorer.Scorer.score_batch` per reward object the envs share, so a
judge sees a GRPO group's episodes in one batch).

The driver steps ``env.unwrapped`` (Gymnasium's wrappers added by ``make`` are bypassed
for steps; resets go through them).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import gymnasium as gym
from drgym.envs.core import PendingStep, SearchAgentEnv, score_finished

from drgym.atomic import append_jsonl, atomic_write_text, read_jsonl
from drgym.errors import ConfigError

logger = logging.getLogger(__name__)
from drgym.records import ActingPolicy, Trajectory


class BatchedDriver:
    """Step several search environments in lockstep.

    Args:
        envs: environments (made by ``gymnasium.make`` or constructed directly); each must
            unwrap to a :class:`~drgym.envs.core.SearchAgentEnv`.
        fetch_workers: threads for fetches (1: sequential).
        search_chunk: when set, a merged search batch is split into requests of at most
            this many queries, sent concurrently from ``search_workers`` threads (for
            HTTP backends whose server caps the batch size); None sends one request.
        search_workers: threads for chunked search requests.

    Attributes:
        stats: counters over the driver's life: ``turns``, ``search_calls`` (backend
            requests), ``queries``, ``fetches``, ``search_s`` and ``fetch_s`` (wall
            seconds), ``retries_alone`` (batches retried per env after a failure).

    Raises:
        ConfigError: an env is not a drgym search env, or a bad worker count.
    """

    def __init__(
        self,
        envs: Sequence[gym.Env],
        *,
        fetch_workers: int = 8,
        search_chunk: int | None = None,
        search_workers: int = 4,
    ) -> None:
        if not envs:
            raise ConfigError("BatchedDriver needs at least one environment.")
        self.envs = list(envs)
        self.raw: list[SearchAgentEnv] = []
        for i, e in enumerate(self.envs):
            u = e.unwrapped
            if not isinstance(u, SearchAgentEnv):
                raise ConfigError(f"envs[{i}] is a {type(u).__name__}, not a drgym search environment.")
            self.raw.append(u)
        for name, v in (("fetch_workers", fetch_workers), ("search_workers", search_workers)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}.")
        if search_chunk is not None and (not isinstance(search_chunk, int) or search_chunk < 1):
            raise ConfigError(f"search_chunk must be None or an integer >= 1, got {search_chunk!r}.")
        self.fetch_workers = fetch_workers
        self.search_chunk = search_chunk
        self.search_workers = search_workers
        self._pool: ThreadPoolExecutor | None = None
        self.stats: dict[str, float] = {"turns": 0, "search_calls": 0, "queries": 0, "fetches": 0,
                                        "search_s": 0.0, "fetch_s": 0.0, "retries_alone": 0}

    def __len__(self) -> int:
        return len(self.envs)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(self.fetch_workers, self.search_workers), thread_name_prefix="drgym-driver")
        return self._pool

    def close(self) -> None:
        """Stop the thread pool (the envs stay open: they belong to the caller)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> "BatchedDriver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one turn ----------------------------------------------------------------------
    def reset(self, options: Sequence[dict[str, Any] | None] | None = None, seeds: Sequence[int | None] | None = None):
        """Reset every env. Returns ``(observations, infos)`` lists."""
        n = len(self.envs)
        options = list(options) if options is not None else [None] * n
        seeds = list(seeds) if seeds is not None else [None] * n
        out = [e.reset(seed=s, options=o) for e, s, o in zip(self.envs, seeds, options)]
        return [o for o, _ in out], [i for _, i in out]

    def _call(self, tool, backend, args: list[str], k: int) -> list[Any]:
        """One tool batch; ``search`` is split into ``search_chunk``-sized requests when set."""
        pool = self._executor() if self.fetch_workers > 1 else None
        if tool.name != "search" or self.search_chunk is None or len(args) <= self.search_chunk:
            if tool.name == "search":
                self.stats["search_calls"] += 1
            return tool.call_batch(backend, args, k=k, executor=pool)
        chunks = [args[i:i + self.search_chunk] for i in range(0, len(args), self.search_chunk)]
        self.stats["search_calls"] += len(chunks)
        parts = list(self._executor().map(lambda c: tool.call_batch(backend, c, k=k), chunks))
        return [r for p in parts for r in p]

    def step(self, actions: dict[int, Any] | Sequence[Any]) -> dict[int, tuple[str, float, bool, bool, dict[str, Any]]]:
        """Step the envs named in ``actions`` (index -> action; a list steps all, None skips).

        Returns:
            index -> ``(observation, reward, terminated, truncated, info)``.

        Raises:
            gymnasium.error.ResetNeeded: a stepped env has finished its episode.
        """
        if not isinstance(actions, dict):
            actions = {i: a for i, a in enumerate(actions) if a is not None}
        return self._score(self._step_unscored(actions))

    def _step_unscored(self, actions: dict[int, Any]) -> dict[int, tuple[str, float, bool, bool, dict[str, Any]]]:
        """:meth:`step` without scoring the episodes that end (see :meth:`_score`)."""
        self.stats["turns"] += 1
        pending: dict[int, PendingStep] = {i: self.raw[i].begin_step(a) for i, a in actions.items()}
        return self._finish_step(pending)

    def _score(self, results: dict[int, tuple[str, float, bool, bool, dict[str, Any]]]
               ) -> dict[int, tuple[str, float, bool, bool, dict[str, Any]]]:
        """Score every episode of ``results`` that ended this turn, together
        (:func:`~drgym.envs.core.score_finished`), and put the rewards and
        ``reward_components`` into ``results`` (returned)."""
        done = [i for i, (_, _, term, trunc, _) in results.items() if term or trunc]
        if not done:
            return results
        for i, reward in zip(done, score_finished([self.raw[i] for i in done])):
            obs, _, term, trunc, info = results[i]
            info["reward_components"] = dict(info["trajectory"].reward_components)
            results[i] = (obs, reward, term, trunc, info)
        return results

    def _finish_step(self, pending: dict[int, PendingStep]) -> dict[int, tuple[str, float, bool, bool, dict[str, Any]]]:
        """Run each tool's calls of ``pending`` as one merged batch, then end each env's step.

        One :meth:`~drgym.envs.tools.Tool.call_batch` per (backend, tool, k): for
        ``search`` that is one ``search_batch`` per turn for every env (split into
        ``search_chunk``-sized requests when set); ``fetch`` runs its URLs on the thread
        pool. A merged batch that fails is retried per env, so one bad call cannot fail
        the others; what still fails is shown to that env's agent.
        """
        out: dict[int, dict[str, Any]] = {i: {} for i in pending}
        groups: dict[tuple[int, str, int], list[int]] = {}
        for i, p in pending.items():
            for name, args in p.calls.items():
                if args:
                    groups.setdefault((id(self.raw[i].backend), name, p.k), []).append(i)
        for (_, name, k), idx in groups.items():
            env0 = self.raw[idx[0]]
            tool, backend = env0.tools[name], env0.backend
            args = [a for i in idx for a in pending[i].calls[name]]
            self.stats[tool.stat or name] = self.stats.get(tool.stat or name, 0) + len(args)
            t0 = time.perf_counter()
            try:
                res = self._call(tool, backend, args, k)
                if len(res) != len(args):
                    raise RuntimeError(f"the {name} tool returned {len(res)} results for {len(args)} calls")
                pos = 0
                for i in idx:
                    n = len(pending[i].calls[name])
                    out[i][name] = res[pos:pos + n]
                    pos += n
            except Exception as e:  # logged; each env's calls are retried alone below
                logger.warning("a merged %s batch of %d calls failed (%s: %s); retrying each env's calls alone",
                               name, len(args), type(e).__name__, e)
                self.stats["retries_alone"] += 1
                for i in idx:
                    try:
                        out[i][name] = self._call(tool, backend, pending[i].calls[name], k)
                    except Exception as e:  # shown to that agent, recorded in its trajectory
                        out[i][name] = e
            self.stats[f"{name}_s"] = self.stats.get(f"{name}_s", 0.0) + time.perf_counter() - t0
        return {i: self.raw[i].end_step(p, out[i], score=False) for i, p in pending.items()}

    # -- whole rollouts ----------------------------------------------------------------
    def run(
        self,
        policy: ActingPolicy,
        jobs: Iterable[dict[str, Any] | None] | int,
        *,
        seed: int | None = 0,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Roll out episodes with ``policy``, keeping every env busy until the jobs run out.

        Args:
            policy: anything with ``act(conversations, infos) -> list[str | None]``
                (:class:`~drgym.records.ActingPolicy`; e.g. a :class:`drgym.policies.base.Policy`,
                or the GRPO :class:`drgym.training.rollout.TokenRecorder`). Each info
                carries the env's last ``"observation"`` besides its own keys. An action
                of None ends that episode as truncated
                (:meth:`~drgym.envs.core.SearchAgentEnv.end_episode`).
            jobs: reset ``options`` per episode (e.g. ``{"task_id": ...}``), or a number of
                episodes whose tasks are drawn by the envs' seeded RNGs.
            seed: episode ``j`` is reset with ``seed + j`` (None: unseeded).
            on_episode: called with each trajectory as soon as its episode ends (before
                its env is reset for the next job), e.g. to append it to a JSONL file.

        Returns:
            The trajectories in job order; ``timings["generation"]`` holds each episode's
            share of the policy time (a batch's time split equally over its rows).
        """
        queue = [None] * jobs if isinstance(jobs, int) else list(jobs)
        out: list[Trajectory | None] = [None] * len(queue)
        job_of: dict[int, int] = {}
        infos: dict[int, dict[str, Any]] = {}
        gen_time: dict[int, float] = {}
        next_job = 0

        def start(i: int) -> None:
            nonlocal next_job
            j = next_job
            next_job += 1
            _, info = self.envs[i].reset(seed=None if seed is None else seed + j, options=queue[j])
            job_of[i] = j
            infos[i] = info
            gen_time[i] = 0.0

        for i in range(min(len(self.envs), len(queue))):
            start(i)
        while job_of:
            idx = sorted(job_of)
            t0 = time.perf_counter()
            actions = policy.act([infos[i]["messages"] for i in idx], [infos[i] for i in idx])
            dt = (time.perf_counter() - t0) / len(idx)
            if len(actions) != len(idx):
                raise ConfigError(f"policy returned {len(actions)} actions for {len(idx)} conversations.")
            # None: the policy ends that episode (its own budget ran out); the env ends it truncated
            results = self._step_unscored({i: a for i, a in zip(idx, actions) if a is not None})
            results.update({i: self.raw[i].end_episode(score=False) for i, a in zip(idx, actions) if a is None})
            self._score(results)  # this turn's finished episodes, scored together
            for i in idx:
                gen_time[i] += dt
                obs, _, term, trunc, info = results[i]
                infos[i] = {**info, "observation": obs}
                if term or trunc:
                    traj: Trajectory = info["trajectory"]
                    traj.timings["generation"] = gen_time[i]
                    traj.metadata.setdefault("policy", getattr(policy, "name", type(policy).__name__))
                    out[job_of.pop(i)] = traj
                    if on_episode is not None:
                        on_episode(traj)
                    if next_job < len(queue):
                        start(i)
        return [t for t in out if t is not None]


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False) -> None:
    """Write trajectories as JSONL, one episode per line (UTF-8, non-ASCII kept).

    ``append=False`` replaces the file atomically; ``append=True`` appends line by line
    (each line written whole, see :func:`drgym.atomic.append_jsonl`).
    """
    if append:
        for t in trajectories:
            append_jsonl(path, t.to_dict())
    else:
        atomic_write_text(path, "".join(t.to_json() + "\n" for t in trajectories))


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a JSONL file written by :func:`write_trajectories` (torn lines are skipped).

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    return [Trajectory.from_dict(d) for d in read_jsonl(path)]
