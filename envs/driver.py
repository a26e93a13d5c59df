"""Batched rollouts: step N environments together with one ``search_batch`` per turn.

Search-R1's rollout loop (``LLMGenerationManager.run_llm_loop``) generates for every
active row, then sends **one** batched request to the retriever per turn; this module
does the same for drgym envs::

    driver = BatchedDriver([gym.make("drgym/SearchQA-v0", backend=engine) for _ in range(8)])
    trajectories = driver.run(policy, [{"task_id": t.task_id} for t in tasks])
    write_trajectories("runs/x/trajectories.jsonl", trajectories)

Each turn the driver calls :meth:`~drgym.envs.core.SearchAgentEnv.begin_step` on every
stepped env, merges their queries into one ``backend.search_batch`` per (backend, k)
(split into ``search_chunk``-sized requests sent from a thread pool when set, for HTTP
backends), runs the fetches on a thread pool, and hands each env its own results through
:meth:`~drgym.envs.core.SearchAgentEnv.end_step`. If a merged batch fails, each env's
queries are retried alone so that one bad query cannot fail the others; what still
fails is shown to that env's agent and recorded in its trajectory.

The driver steps ``env.unwrapped`` (Gymnasium's wrappers added by ``make`` are bypassed
for steps; resets go through them).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import gymnasium as gym
from drgym.envs.core import PendingStep, SearchAgentEnv

from drgym.atomic import append_jsonl, atomic_write_text, read_jsonl
from drgym.errors import ConfigError
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

    def _search(self, backend, queries: list[str], k: int) -> list[list[Any]]:
        if self.search_chunk is None or len(queries) <= self.search_chunk:
            self.stats["search_calls"] += 1
            return backend.search_batch(queries, k)
        chunks = [queries[i:i + self.search_chunk] for i in range(0, len(queries), self.search_chunk)]
        self.stats["search_calls"] += len(chunks)
        parts = list(self._executor().map(lambda c: backend.search_batch(c, k), chunks))
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
        self.stats["turns"] += 1
        pending: dict[int, PendingStep] = {i: self.raw[i].begin_step(a) for i, a in actions.items()}

        # one search_batch per (backend, k)
        search_out: dict[int, Any] = {}
        groups: dict[tuple[int, int], list[int]] = {}
        for i, p in pending.items():
            if p.queries:
                groups.setdefault((id(self.raw[i].backend), p.k), []).append(i)
        t0 = time.perf_counter()
        for (_, k), idx in groups.items():
            backend = self.raw[idx[0]].backend
            queries = [q for i in idx for q in pending[i].queries]
            self.stats["queries"] += len(queries)
            try:
                res = self._search(backend, queries, k)
                if len(res) != len(queries):
                    raise RuntimeError(f"the backend returned {len(res)} result lists for {len(queries)} queries")
                pos = 0
                for i in idx:
                    n = len(pending[i].queries)
                    search_out[i] = res[pos:pos + n]
                    pos += n
            except Exception:
                self.stats["retries_alone"] += 1
                for i in idx:
                    try:
                        search_out[i] = self._search(backend, pending[i].queries, k)
                    except Exception as e:  # shown to that agent, recorded in its trajectory
                        search_out[i] = e
        self.stats["search_s"] += time.perf_counter() - t0

        # fetches on the thread pool
        t0 = time.perf_counter()
        jobs = [(i, u) for i, p in pending.items() for u in p.urls]
        fetch_out: dict[int, list[Any]] = {i: [] for i in pending}
        if jobs:
            self.stats["fetches"] += len(jobs)

            def _fetch(job):
                i, u = job
                try:
                    return self.raw[i].backend.fetch(u)
                except Exception as e:
                    return e

            docs = list(self._executor().map(_fetch, jobs)) if self.fetch_workers > 1 and len(jobs) > 1 else [_fetch(j) for j in jobs]
            for (i, _), d in zip(jobs, docs):
                fetch_out[i].append(d)
        self.stats["fetch_s"] += time.perf_counter() - t0

        return {i: self.raw[i].end_step(p, search_out.get(i), fetch_out[i]) for i, p in pending.items()}

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
            policy: anything with ``act(conversations, infos) -> list[str]``
                (:class:`~drgym.records.ActingPolicy`; e.g. a :class:`drgym.policies.base.Policy`).
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
            results = self.step(dict(zip(idx, actions)))
            for i in idx:
                gen_time[i] += dt
                _, _, term, trunc, info = results[i]
                infos[i] = info
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
