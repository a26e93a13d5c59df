"""Run a policy through a drgym env over a task set and record everything: :func:`run_rollout`.

The run is defined by a :class:`~drgym.evaluation.run_config.RolloutConfig` and written
into a :class:`~drgym.evaluation.run_directory.RunDirectory` (what it holds, how a rerun
resumes it, what keeps it right). Episodes are stepped in batches through
:class:`drgym.envs.driver.BatchedDriver` (one ``search_batch`` per turn).

A search server, policy endpoint or judge endpoint that stays down through its client's
retries stops the run with :class:`~drgym.errors.ServiceUnavailableError`; no episode
that saw the failure is written, so a rerun redoes it (:mod:`drgym.evaluation.faults`).
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

import drgym.envs  # noqa: F401
from drgym.atomic import atomic_write_json
from drgym.cpu import thread_record
from drgym.envs.driver import BatchedDriver
from drgym.envs.task_loaders import load_tasks
from drgym.errors import ConfigError, ServiceUnavailableError
from drgym.evaluation.answers import write_answers
from drgym.evaluation.faults import ServiceWatch, stopped_message
from drgym.evaluation.metrics import calibration, compute_metrics, evidence_recall
from drgym.evaluation.plots import write_plots
from drgym.evaluation.run_config import RolloutConfig, check_options
from drgym.evaluation.run_directory import (
    RunDirectory,
    backend_fingerprint,
    engine_identity,
    resolved_policy_settings,
    versions,
)
from drgym.judges.base import judge_validity
from drgym.judges.factory import make_judge
from drgym.policies.base import Conversation, Policy
from drgym.policies.factory import check_policy_reachable, describe_policy, make_policy
from drgym.records import Episode
from drgym.redact import redact
from drgym.rewards import build_reward
from drgym.rewards.qa import F1, CoverExactMatch, ExactMatch
from drgym.rewards.scorer import Scorer
from drgym.search.registry import get_backend

# the runner's logger, named as before the split into run_config / run_directory / rollout_loop
log = logging.getLogger("drgym.evaluation.runner")

QA_METRICS = ("em", "f1", "cover_em")


@dataclass
class RunResult:
    """What :func:`run_rollout` returns.

    Attributes:
        out_dir: the run directory.
        metrics: the metrics written to ``metrics.json``.
        trajectories: every episode of the run (resumed ones included), as dicts, in task order.
        new_episodes: episodes run by this call.
        skipped: task ids skipped because they were already done.
        wall_s: wall time of this call (setup included).
        setup_s: seconds spent loading the policy, the backend and the envs.
        interrupted: True when stopped by Ctrl-C (finished episodes are saved).
        failed: episodes of the run (among its tasks) with a backend or policy failure
            (:func:`drgym.evaluation.metrics.episode_failures`): recorded, not done, redone
            by the next run.
        failure_reasons: episodes per failure reason (``{"search AuthError (HTTP 401)": 5}``).
        rejected: damaged lines of ``trajectories.jsonl`` moved to
            :data:`~drgym.evaluation.run_directory.REJECTED_FILE` by this call (their episodes
            were run again).
        files: the files of the run directory this call wrote or rewrote
            (``config.json`` when a session ran, ``trajectories.jsonl`` when episodes were
            appended, ``metrics.json``, ``answers.md``, the plots), in that order.
    """

    out_dir: Path
    metrics: dict[str, Any]
    trajectories: list[dict[str, Any]]
    new_episodes: int = 0
    skipped: int = 0
    wall_s: float = 0.0
    setup_s: float = 0.0
    interrupted: bool = False
    failed: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    files: list[Path] = field(default_factory=list)

    def failure_message(self) -> str | None:
        """One line saying how many episodes failed and why, and what to do; None when none did."""
        if not self.failed:
            return None
        why = ", ".join(f"{r}: {n}" for r, n in self.failure_reasons.items())
        return (f"{self.failed} of {len(self.trajectories)} episodes failed ({why}); they are recorded with their errors "
                f"in {self.out_dir / 'trajectories.jsonl'} but are not done: fix the cause and rerun the same command "
                "to redo them.")


class _RecordingPolicy(Policy):
    """Wraps a policy: records per-episode token usage and generation time."""

    def __init__(self, inner: Policy, watch: Any = None) -> None:
        self.inner = inner
        self.watch = watch  # a drgym.evaluation.faults.ServiceWatch: stop before acting on a dead service
        self.name = inner.name
        self.usage: dict[str, list[dict[str, Any]]] = {}
        self.gen_s: dict[str, float] = {}
        self.first_seen: dict[str, float] = {}
        self.total_act_s = 0.0

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        if self.watch is not None:
            self.watch.check()
        now = time.perf_counter()
        ids = [str((i or {}).get("episode_id", f"?{k}")) for k, i in enumerate(infos or [{}] * len(conversations))]
        for e in ids:
            self.first_seen.setdefault(e, now)
        t0 = time.perf_counter()
        actions = self.inner.act(conversations, infos)
        dt = time.perf_counter() - t0
        self.total_act_s += dt
        usage = getattr(self.inner, "last_usage", None) or []
        for k, e in enumerate(ids):
            u = usage[k] if k < len(usage) else None
            d = u.to_dict() if hasattr(u, "to_dict") else (dict(u) if isinstance(u, dict) else {})
            self.usage.setdefault(e, []).append(d)
            self.gen_s[e] = self.gen_s.get(e, 0.0) + dt / max(1, len(ids))
        return actions

    def close(self) -> None:
        self.inner.close()


def _reward_objects(cfg: RolloutConfig, kind: str, backend: Any = None) -> list[Any]:
    """Extra rewards scored by the runner after each episode.

    QA: the LLM-judge soft match (``llm_match``; ``metrics.json`` sums it up as ``judge``) when ``--judge``
    is set. Research: ``race`` and ``citation`` (DeepResearch Bench RACE, arXiv
    2506.11763 section 3.1; DeepResearchGym citation precision/recall, arXiv 2505.19253
    section 3.2) when ``--judge`` is set, judged by it; without a judge no judged reward
    runs (the bundled 135M model cannot judge reports: it takes minutes per report and
    rarely returns valid verdicts), and ``--reward`` with ``--judge hf:smollm2`` asks for it
    explicitly. Built with :func:`drgym.rewards.build_reward` (citation pages are fetched
    from ``backend``). Every judged reward shares one judge.
    """

    judge = None
    if cfg.judge:
        judge = make_judge(cfg.judge)  # one judge (one model copy) for every judged reward of the run
    names = list(cfg.rewards) if cfg.rewards is not None else None
    if kind == "qa":
        names = names if names is not None else (["llm_match"] if cfg.judge else [])
    else:
        if names is None:
            names = ["race", "citation"] if cfg.judge else []
            if not cfg.judge:
                log.warning("no --judge: reports are not scored (give --judge openai:MODEL@URL).")
    return [build_reward(name, judge=judge, backend=backend) for name in names]


# -- build, loop, finish ----------------------------------------------------------------
@dataclass
class _Session:
    """What the build step makes for one session of a run (internal)."""

    policy: Any
    own_policy: bool
    backend: Any
    envs: list[Any]
    extra_rewards: list[Any]
    record: dict[str, Any]
    setup_s: float
    watch: Any = None


def _build(config: RolloutConfig, run: RunDirectory, tasks: list[Any], all_tasks: list[Any], todo: list[Any], *,
           policy: Policy | None, backend: Any, reward: Any, t_start: float, resumed: bool,
           allow_engine_change: bool = False) -> _Session:
    """Build step: the policy's endpoint (``openai:``, reachable), the backend (and its
    engine identity, which reaches a search server, checked against a resumed run's
    before the policy is loaded), the policy, the envs and the extra rewards; check a
    resumed run's resolved policy settings; write ``config.json``."""

    if policy is None:
        # an openai: server that is down is found before the index (or a reader model) loads
        check_policy_reachable(config.policy)
    be = backend if backend is not None else get_backend(config.backend)
    change = None
    # a search server that is down (its /health) stops the run here, before the policy's
    # model loads; the finished episodes of a resumed run stay, and a rerun resumes
    engine: dict[str, Any] | None = engine_identity(be)
    if resumed and engine is not None:
        # the finished episodes searched the recorded engine: refuse to mix in another one
        change = run.check_engine(engine, allow_change=allow_engine_change)
    pol = policy
    if pol is None:
        opts = dict(config.policy_options)
        if config.policy.split(":", 1)[0].lower() in ("hf", "vllm"):
            opts.setdefault("seed", config.seed)  # sampling seed (greedy decoding ignores it)
        pol = make_policy(config.policy, **opts)
    env_kw = dict(config.env_options)
    if reward is not None:
        env_kw["reward"] = reward
    if config.max_turns is not None:
        env_kw["max_turns"] = config.max_turns
    n_envs = min(config.batch_size, len(todo))
    # the envs search through a watch that remembers a service failure (faults.py); unknown
    # env options were refused by check_options before anything was loaded
    watch = ServiceWatch(be)
    envs = [gym.make(config.env, backend=watch, tasks=tasks, **env_kw)]
    # the other envs share the first one's reward object, so the driver scores the episodes
    # that end in a turn in one batch (score_finished groups by reward object)
    shared = envs[0].unwrapped.reward
    envs += [gym.make(config.env, backend=watch, tasks=tasks, **{**env_kw, "reward": shared if shared is not None else False})
             for _ in range(n_envs - 1)]
    raw0 = envs[0].unwrapped
    kind = getattr(raw0, "kind", "qa")
    extra_rewards = _reward_objects(config, kind, be)
    setup_s = time.perf_counter() - t_start
    record = {
        "identity": config.identity(),
        "config": redact(config.model_dump()),
        "command": redact(sys.argv),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions(),
        "threads": thread_record(),
        "backend": redact(backend_fingerprint(be)),
        "engine": engine,
        **({"engine_changes": [change]} if change else {}),
        "policy": redact(describe_policy(pol)),
        "env": {"id": config.env, "kind": kind, "max_turns": raw0.max_turns, "max_searches": raw0.max_searches,
                "max_fetches": raw0.max_fetches, "max_obs_tokens": raw0.max_obs_tokens, "top_k": raw0.top_k,
                "protocol": raw0.protocol, "reward": getattr(raw0.reward, "name", None) if raw0.reward else None,
                **{k: v for k, v in env_kw.items() if isinstance(v, (int, float, str, bool, type(None)))}},
        "extra_rewards": [getattr(r, "name", type(r).__name__) for r in extra_rewards],
        "tasks": {"name": config.tasks, "n": len(tasks), "n_in_set": len(all_tasks),
                  "task_ids_sha256": hashlib.sha256("\n".join(t.task_id for t in tasks).encode()).hexdigest()[:16]},
        "seeds": {"base": config.seed, "episode_seed": "base + position of the episode in its driver batch (affects episode ids only; greedy decoding)"},
        "setup_s": round(setup_s, 3),
    }
    if resumed:
        # settings a policy resolves itself (layout=auto from the model folder, scaffold=auto)
        # are not in the identity; a resumed run must not mix them
        # (and the weights behind a model path: a folder retrained in place is another policy)
        changed = run.changed_policy_settings(record["policy"])
        if changed:
            prev_pol = resolved_policy_settings((run.previous or {}).get("policy") or {})
            now_pol = resolved_policy_settings(record["policy"])
            if policy is None:
                pol.close()
            hint = ("The model's weights changed since those episodes ran: use --fresh or another --out."
                    if any(k.split(".")[-1] == "weights" for k in changed)
                    else "Pass the old value with -p, or use --fresh / another --out.")
            raise ConfigError(
                f"{run.out} was run with policy {', '.join(f'{k}={prev_pol.get(k)!r}' for k in changed)}, this policy "
                f"resolves to {', '.join(f'{k}={now_pol.get(k)!r}' for k in changed)}; resuming would mix them. "
                + hint)
    run.write_config(record, {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "todo": len(todo), "setup_s": round(setup_s, 3), "engine_changed": bool(change)})
    return _Session(policy=pol, own_policy=policy is None, backend=be, envs=envs, extra_rewards=extra_rewards,
                    record=record, setup_s=setup_s, watch=watch)


def _record_engine_late(run: RunDirectory, session: _Session) -> None:
    """Write the engine identity into ``config.json`` after the loop when the server could
    not be asked at build time (it came back during the run); a server still down leaves
    it unrecorded (logged)."""
    try:
        engine = engine_identity(session.backend)
    except ServiceUnavailableError as e:
        log.warning("the search engine's identity is not recorded in %s: %s", run.config, e)
        return
    session.record["engine"] = engine
    if run.previous is not None:
        run.previous["engine"] = engine
        atomic_write_json(run.config, run.previous)


def _loop(config: RolloutConfig, run: RunDirectory, session: _Session, tasks: list[Any], todo: list[Any],
          skipped: int, *, progress: bool, console: Any
          ) -> tuple[int, dict[str, Any], bool, ServiceUnavailableError | None]:
    """Loop step: run the episodes in the shared loop, appending each one as it ends.

    Returns:
        ``(new_episodes, session_phases, interrupted, stopped)``; ``stopped`` is the
        :class:`~drgym.errors.ServiceUnavailableError` that ended the loop early, if any
        (no episode that saw it is written).
    """

    index_of = {t.task_id: i for i, t in enumerate(tasks)}
    tasks_by_id = {t.task_id: t for t in tasks}
    written: set[str] = set()
    last_flush = [time.perf_counter()]
    new_rewards_s = [0.0]
    # the loop's phase clocks at the last flush: each flush shares out what they gained since
    last_phases = {"generation": 0.0, "search": 0.0, "reward": 0.0}
    bar = _Progress(len(tasks), skipped, enabled=progress, console=console, label=config.policy,
                    batch=len(session.envs))
    driver = BatchedDriver(session.envs)
    rec = _RecordingPolicy(session.policy, session.watch)
    interrupted = False
    stopped: ServiceUnavailableError | None = None

    def flush(trajs: list[Any]) -> None:
        if session.watch is not None:
            session.watch.check()  # after a service failure no episode is written (a rerun redoes it)
        trajs = [t for t in trajs if t is not None and t.episode_id not in written and t.task_id in tasks_by_id]
        if not trajs:
            return
        _finish_trajectories(trajs, tasks_by_id, rec, session.extra_rewards, config)
        now = time.perf_counter()
        span = now - last_flush[0]
        share = span / len(trajs)
        last_flush[0] = now
        new_rewards_s[0] += sum(float(t.timings.get("reward") or 0.0) for t in trajs)
        clocks = {"generation": rec.total_act_s,
                  "search": float(driver.stats.get("search_s", 0.0)) + float(driver.stats.get("fetch_s", 0.0)),
                  "reward": new_rewards_s[0]}
        gained = {k: max(0.0, v - last_phases[k]) for k, v in clocks.items()}
        last_phases.update(clocks)
        gained["env"] = max(0.0, span - sum(gained.values()))
        phase_share = {k: round(v / len(trajs), 6) for k, v in gained.items()}
        for t in trajs:
            t.metadata["wall_share_s"] = share
            t.metadata["wall_phases_s"] = dict(phase_share)
            t.metadata["task_index"] = index_of.get(t.task_id)
            run.append(t)
            written.add(t.episode_id)
            bar.advance(t)

    t_loop = time.perf_counter()
    try:
        bar.start()
        # Each episode is appended to trajectories.jsonl the moment it ends (on_episode),
        # so an interrupt loses no finished episode.
        driver.run(rec, [{"task_id": t.task_id} for t in todo], seed=config.seed, on_episode=lambda t: flush([t]))
    except ServiceUnavailableError as e:  # a service stayed down: stop, keep what is finished
        stopped = e
        log.warning("stopping the run: %s", e)
    except KeyboardInterrupt:
        interrupted = True
        try:
            flush([e.trajectory for e in driver.raw if e.done and e.trajectory is not None and e.trajectory.steps])
        except Exception:  # saving what is finished must not mask the interrupt
            log.exception("could not save finished episodes after the interrupt")
    finally:
        bar.stop()
        loop_s = time.perf_counter() - t_loop
        backend_s = float(driver.stats.get("search_s", 0.0)) + float(driver.stats.get("fetch_s", 0.0))
        phases = {"generation": rec.total_act_s, "search": backend_s, "reward": new_rewards_s[0]}
        phases["env"] = max(0.0, loop_s - sum(phases.values()))
        session_phases = {"loop_s": round(loop_s, 4), **{k: round(v, 4) for k, v in phases.items()},
                          "share": {k: (v / loop_s if loop_s else 0.0) for k, v in phases.items()},
                          "episodes": len(written)}
        driver.close()
        if session.own_policy:
            session.policy.close()
    return len(written), session_phases, interrupted, stopped


def _finish(config: RolloutConfig, run: RunDirectory, tasks: list[Any], *, session_phases: dict[str, Any],
            setup_s: float, wall: float, interrupted: bool,
            stopped: ServiceUnavailableError | None = None
            ) -> tuple[list[dict[str, Any]], dict[str, Any], list[Path]]:
    """Finish step: metrics over the run's episodes, ``answers.md``, plots, and a config
    for a run with nothing to do.

    Returns:
        ``(trajectories, metrics, files)``: ``files`` are the files this step wrote.
    """
    files: list[Path] = []
    trajectories = run.episodes({t.task_id: i for i, t in enumerate(tasks)})
    metrics = compute_metrics_for_run(trajectories)
    metrics["setup_s_last_session"] = round(setup_s, 3)
    metrics["wall_s_last_session"] = round(wall, 3)
    metrics["interrupted"] = interrupted
    metrics["stopped"] = f"{type(stopped).__name__}: {stopped}" if stopped is not None else None
    metrics["tasks_total"] = len(tasks)
    metrics["last_session"] = session_phases

    metrics["gold_evidence"] = evidence_recall(trajectories, {t.task_id: t for t in tasks})
    metrics["calibration"] = calibration(trajectories)
    if config.judge:
        valid, note = judge_validity(config.judge)
        metrics["judge_model"] = {"spec": config.judge, "valid": valid, **({"note": note} if note else {})}
    atomic_write_json(run.metrics, metrics)
    files.append(run.metrics)
    if run.trajectories.exists():
        files.append(write_answers(run.out, tasks, title=f"{config.policy} on {config.tasks} ({config.env})"))
    if config.plots and trajectories:
        try:
            files.extend(write_plots(trajectories, run.out))
        except Exception:  # plots are a convenience; never fail a run on them
            log.exception("could not write plots")
    if not run.config.exists():
        atomic_write_json(run.config, {"identity": config.identity(), "config": config.model_dump(), "versions": versions()})
        files.insert(0, run.config)
    return trajectories, metrics, files


def run_rollout(
    config: RolloutConfig,
    *,
    policy: Policy | None = None,
    backend: Any = None,
    progress: bool = True,
    console: Any = None,
    fresh: bool = False,
    tasks: Sequence[Any] | None = None,
    reward: Any = None,
    allow_engine_change: bool = False,
) -> RunResult:
    """Run (or resume) a rollout and write the run directory.

    Three steps over a :class:`RunDirectory` (held by this call alone: its lock file):
    build (backend, policy, envs, rewards, ``config.json``), loop (the episodes, in
    :class:`drgym.envs.driver.BatchedDriver`) and finish (metrics, plots).

    A run is bound to its search engine (:func:`engine_identity`, recorded in
    ``config.json`` as ``engine``): resuming against another one is refused. An episode
    with a backend or policy failure (:func:`drgym.evaluation.metrics.episode_failures`,
    e.g. every search answered HTTP 401) is recorded with its errors but is not done: the
    result's ``failed`` counts it and the next run redoes it. Damaged lines of
    ``trajectories.jsonl`` are moved aside on resume and their episodes run again.

    Args:
        config: the run definition.
        policy: an already built policy (its ``name`` should match ``config.policy``);
            None builds it from ``config.policy``. A policy passed in is not closed.
        backend: an already built search backend; None takes ``config.backend`` from the
            process cache (:func:`drgym.search.registry.get_backend`).
        progress: show a rich progress bar with ETA.
        console: a ``rich.console.Console`` for the progress bar (None: stderr).
        fresh: discard an existing run in ``out`` (its trajectories and metrics).
        tasks: the :class:`~drgym.records.Task` objects to run, instead of loading
            ``config.tasks`` (which then only names the set in the run record), e.g. a
            held-out slice during training; the first ``config.n`` are run.
        reward: the env's reward (a :class:`~drgym.records.Reward`), instead of the env's
            default; the env scores each episode with it once (``reward_components``).
        allow_engine_change: resume even though the search engine differs from the one
            the run's finished episodes searched; ``config.json`` records both
            (``engine_changes``).

    Returns:
        A :class:`RunResult`; ``metrics`` covers every episode of the run directory
        whose task is among the first ``n`` (failed ones included, counted in
        ``failed``); ``failed`` / :meth:`RunResult.failure_message` say which failed.

    Raises:
        ConfigError: bad config, or ``out`` holds a different run (same directory,
            different env/tasks/policy/backend/seed/options); pass ``fresh=True`` or
            another ``out``. Options are checked before anything is loaded.
        EngineChangedError: resuming against another search engine (a ConfigError).
        TasksChangedError: resuming over tasks whose question, golds or other fields
            differ from those the recorded episodes of their ids answered (a ConfigError).
        InvalidEpisodeError: an episode's record holds a number the run file refuses
            (a reward of ``NaN``...); it is not written.
        RunLockedError: another process is writing ``out``.
        RunDiskFullError: the disk holding ``out`` filled up (the episodes before are saved).
        ServiceUnavailableError: the search server, the policy's or the judge's endpoint
            stayed down through its retries. The episodes finished before are saved (and
            ``metrics.json`` covers them, with ``stopped`` set); the ones in progress are
            not written, so rerunning resumes with them. The error's ``result`` attribute
            is the :class:`RunResult` so far.
        KeyboardInterrupt: re-raised after the finished episodes and the metrics of the
            run so far are saved.
    """
    t_start = time.perf_counter()
    config.validate()
    check_options(config, tasks, policy=policy is None, backend=backend is None)

    all_tasks = list(tasks) if tasks is not None else load_tasks(config.tasks)
    tasks = all_tasks[: config.n] if config.n is not None else all_tasks
    if not tasks:
        raise ConfigError(f"task set {config.tasks!r} is empty.")
    with RunDirectory(config.out_dir(), fresh=fresh) as run:
        return _run_locked(config, run, tasks, all_tasks, policy=policy, backend=backend, progress=progress,
                           console=console, reward=reward, allow_engine_change=allow_engine_change, t_start=t_start)


def _run_locked(config: RolloutConfig, run: RunDirectory, tasks: list[Any], all_tasks: list[Any], *,
                policy: Policy | None, backend: Any, progress: bool, console: Any, reward: Any,
                allow_engine_change: bool, t_start: float) -> RunResult:
    """:func:`run_rollout` once the run directory is held."""
    run.check_identity(config)
    run.bind_tasks(tasks)  # episodes recorded under these ids must have answered these tasks
    done_ids = run.done_task_ids()
    todo = [t for t in tasks if t.task_id not in done_ids]
    skipped = len(tasks) - len(todo)

    new, session_phases, interrupted, setup_s = 0, {}, False, 0.0
    stopped: ServiceUnavailableError | None = None
    if todo:
        try:
            session = _build(config, run, tasks, all_tasks, todo, policy=policy, backend=backend, reward=reward,
                             t_start=t_start, resumed=bool(done_ids), allow_engine_change=allow_engine_change)
        except ServiceUnavailableError as e:  # the search server is down before the first episode (its /health)
            stopped = e
            log.warning("stopping the run: %s", e)
        else:
            setup_s = session.setup_s
            new, session_phases, interrupted, stopped = _loop(config, run, session, tasks, todo, skipped,
                                                              progress=progress, console=console)
            if session.record.get("engine") is None and new:
                _record_engine_late(run, session)
    wall = time.perf_counter() - t_start
    trajectories, metrics, files = _finish(config, run, tasks, session_phases=session_phases, setup_s=setup_s,
                                           wall=wall, interrupted=interrupted, stopped=stopped)
    # config.json is written by a session that ran (the build step), trajectories.jsonl when it appended
    files = ([run.config] if session_phases and run.config not in files else []) + (
        [run.trajectories] if new else []) + files
    result = RunResult(out_dir=run.out, metrics=metrics, trajectories=trajectories, new_episodes=new, skipped=skipped,
                       wall_s=wall, setup_s=setup_s, interrupted=interrupted, failed=int(metrics.get("failed") or 0),
                       failure_reasons=dict(metrics.get("failure_reasons") or {}), rejected=run.rejected, files=files)
    if interrupted:
        raise KeyboardInterrupt(result)
    if stopped is not None:
        err = ServiceUnavailableError(stopped_message(stopped, saved=len(trajectories), total=len(tasks), new=new,
                                                      path=run.trajectories))
        err.result = result  # type: ignore[attr-defined]
        raise err from stopped
    if result.failed:  # the caller reports it (drgym rollout: one error line, exit status 3)
        log.info("%s", result.failure_message())
    return result


def _finish_trajectories(trajs: list[Any], tasks_by_id: dict[str, Any], rec: _RecordingPolicy,
                         extra_rewards: list[Any], config: RolloutConfig) -> None:
    """Attach usage, generation time, QA metrics and extra reward scores to finished episodes.

    QA tasks with answers get ``em``, ``f1`` and ``cover_em`` (the default
    :class:`~drgym.rewards.qa.ExactMatch`, :class:`~drgym.rewards.qa.F1` and
    :class:`~drgym.rewards.qa.CoverExactMatch`) where the env's reward did not already
    record them (an ``f1`` the env scored is not computed again). The extra rewards then
    score every episode. Both go through :meth:`~drgym.rewards.scorer.Scorer.score_batch`
    and its one merge rule: each score under the reward's name, then its components,
    replacing earlier values; a reward that raises is recorded (None, and
    ``metadata["reward_errors"]``), and a :class:`~drgym.errors.ServiceUnavailableError`
    propagates (the run stops, these episodes are not written).
    """

    now = time.perf_counter()
    for t in trajs:
        task = tasks_by_id[t.task_id]
        t.metadata["usage"] = rec.usage.pop(t.episode_id, [])
        t.timings["generation"] = rec.gen_s.pop(t.episode_id, t.timings.get("generation", 0.0))
        t0 = rec.first_seen.pop(t.episode_id, None)
        t.metadata["latency_s"] = (now - t0) if t0 is not None else None
        t.metadata["policy"] = config.policy
        t.metadata["answers"] = list(task.answers)
    eps = [Episode(task=tasks_by_id[t.task_id], answer=t.final_answer or "", trajectory=t) for t in trajs]
    qa = [ep for ep in eps if ep.task.kind == "qa" and ep.task.answers]
    if qa:
        Scorer([ExactMatch(), F1(), CoverExactMatch()]).score_batch(qa, missing_only=True)
    if extra_rewards:
        # re-raises ServiceUnavailableError: the run stops, these episodes are not written
        Scorer(list(extra_rewards)).score_batch(eps)


def compute_metrics_for_run(trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`~drgym.evaluation.metrics.compute_metrics` with the run's wall time and its
    phase shares summed from the episodes' records (``metadata["wall_share_s"]`` and
    ``metadata["wall_phases_s"]``), so a first run and its resume report the same figures."""

    wall = sum(float((t.get("metadata") or {}).get("wall_share_s") or 0.0) for t in trajectories)
    return compute_metrics(trajectories, wall_s=wall if wall > 0 else None)


PROGRESS_EVERY_EPISODES = 5
"""When the output is not a terminal (a pipe, a log file), :class:`_Progress` prints one
plain line after this many finished episodes..."""

PROGRESS_EVERY_S = 30.0
"""... or after this many seconds since its last line, whichever comes first (checked as
episodes finish), plus a line when the loop starts and one when it ends."""


class _Progress:
    """Progress over the run's tasks: a rich progress bar (with ETA) on a terminal, plain
    lines (:data:`PROGRESS_EVERY_EPISODES`, :data:`PROGRESS_EVERY_S`) when the console
    is not one; silent when disabled."""

    def __init__(self, total: int, done: int, *, enabled: bool, console: Any, label: str, batch: int = 1) -> None:
        self.enabled = enabled
        self.batch = max(1, batch)  # episodes stepped together end together: no estimate before a batch's worth
        self.total, self.done0 = total, done
        self.label = label
        self.console = console
        self._p = None
        self._em: list[float] = []
        self._plain = False
        self._done = done
        self._t0 = 0.0
        self._last_line_t = 0.0
        self._last_line_done = done

    def _line(self, what: str) -> None:
        """One plain progress line: episodes done of the total, elapsed time, an estimate of
        the time left from this session's pace (once a batch's worth of episodes has
        ended), and the mean F1 so far."""
        now = time.perf_counter()
        elapsed = now - self._t0
        new = self._done - self.done0
        parts = [f"{self.label}: {self._done}/{self.total} episodes" + (f" ({self.done0} resumed)" if self.done0 else ""),
                 f"{_clock(elapsed)} elapsed"]
        if new >= self.batch and self._done < self.total:
            parts.append(f"about {_clock(elapsed / new * (self.total - self._done))} left")
        if self._em:
            parts.append(f"F1 {sum(self._em) / len(self._em):.3f} over this session's {len(self._em)}")
        self.console.print(f"[{what}] " + ", ".join(parts), highlight=False, markup=False, soft_wrap=True)
        self._last_line_t, self._last_line_done = now, self._done

    def start(self) -> None:
        if not self.enabled:
            return

        self.console = self.console or Console(stderr=True, markup=False)
        if not self.console.is_terminal:
            self._plain = True
            self._t0 = time.perf_counter()
            self._line("start")
            return

        self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                           console=self.console or Console(stderr=True), transient=False)
        self._p.start()
        self._task = self._p.add_task(self.label, total=self.total, completed=self.done0, info="")

    def advance(self, traj: Any) -> None:
        if self._p is None and not self._plain:
            return
        f1 = (traj.reward_components or {}).get("f1")
        if f1 is not None:
            self._em.append(float(f1))
        self._done += 1
        if self._plain:
            if (self._done - self._last_line_done >= PROGRESS_EVERY_EPISODES
                    or time.perf_counter() - self._last_line_t >= PROGRESS_EVERY_S):
                self._line("progress")
            return
        info = f"F1 {sum(self._em) / len(self._em):.3f}" if self._em else ""
        self._p.update(self._task, advance=1, info=info)

    def stop(self) -> None:
        if self._plain:
            self._plain = False
            self._line("end")
        if self._p is not None:
            self._p.stop()
            self._p = None


def _clock(seconds: float) -> str:
    """``75.0`` -> ``"1m15s"``; ``3725`` -> ``"1h02m"``; under a minute ``"42s"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
