"""The rollout runner of ``drgym rollout``, in three modules; this one re-exports their names,
so ``from drgym.evaluation.runner import ...`` works as before.

- :mod:`drgym.evaluation.run_config`: the run definition: :class:`RolloutConfig`,
  :func:`check_options`, :func:`default_run_name`, :data:`DEFAULT_N`;
- :mod:`drgym.evaluation.run_directory`: the run directory and resume:
  :class:`RunDirectory` (``config.json``, ``trajectories.jsonl``, ``run.lock``, damaged
  lines, the engine check, the tasks' content), :class:`EngineChangedError`,
  :class:`TasksChangedError`, :class:`InvalidEpisodeError`, :class:`RunLockedError`,
  :class:`RunDiskFullError`, :func:`task_content_sha256`, :func:`select_episodes`, :func:`read_run_episodes` and what
  ``config.json`` records (:func:`versions`, :func:`backend_fingerprint`,
  :func:`engine_identity`);
- :mod:`drgym.evaluation.rollout_loop`: the loop: :func:`run_rollout` (build, loop,
  finish), :class:`RunResult`, the progress bar, the scoring of finished episodes and
  :func:`compute_metrics_for_run`.

Each imports only the ones before it (config <- run directory <- loop). To replace a
function the loop calls (in a test), patch it where it lives, e.g.
``monkeypatch.setattr(rollout_loop, "_reward_objects", ...)``.
"""

from __future__ import annotations

from drgym.evaluation.rollout_loop import (
    QA_METRICS,
    RunResult,
    compute_metrics_for_run,
    run_rollout,
)
from drgym.evaluation.run_config import DEFAULT_N, RolloutConfig, check_options, default_run_name
from drgym.evaluation.run_directory import (
    LOCK_FILE,
    REJECTED_FILE,
    RESOLVED_POLICY_KEYS,
    EngineChangedError,
    InvalidEpisodeError,
    RunDirectory,
    RunDiskFullError,
    RunLockedError,
    TasksChangedError,
    backend_fingerprint,
    engine_identity,
    read_run_episodes,
    select_episodes,
    task_content_sha256,
    versions,
)

__all__ = [
    "DEFAULT_N",
    "LOCK_FILE",
    "QA_METRICS",
    "REJECTED_FILE",
    "RESOLVED_POLICY_KEYS",
    "EngineChangedError",
    "InvalidEpisodeError",
    "RolloutConfig",
    "RunDirectory",
    "RunDiskFullError",
    "RunLockedError",
    "RunResult",
    "TasksChangedError",
    "backend_fingerprint",
    "check_options",
    "compute_metrics_for_run",
    "default_run_name",
    "engine_identity",
    "read_run_episodes",
    "run_rollout",
    "select_episodes",
    "task_content_sha256",
    "versions",
]
