"""The definition of a rollout run: :class:`RolloutConfig` (what
:func:`drgym.evaluation.rollout_loop.run_rollout` runs), its option checks and the
default name of its run directory.

Options are checked before the index, the model or the judge is loaded
(:func:`check_options`), so a typo costs no loading time.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Sequence

import gymnasium as gym
import yaml

import drgym.envs  # noqa: F401  (registers the ids)
from drgym.config import DEFAULT_N, RolloutRun, parse_section  # noqa: F401 (DEFAULT_N: drgym.evaluation.runner's)
from drgym.errors import ConfigError, unknown_name
from drgym.policies.factory import check_policy
from drgym.records import Task
from drgym.redact import redact
from drgym.rewards.registry import JUDGED, reward_names
from drgym.search.registry import check_spec


class RolloutConfig(RolloutRun):
    """Everything that defines a rollout run: the fields of :class:`~drgym.config.RolloutRun`
    (a run file's keys), and the checks and names derived from them.

    Raises:
        ConfigError: (when made) an unknown field or a value of the wrong type;
            :meth:`validate` checks the values.
    """

    # fields that may change between a run and its resumption
    RESUMABLE: ClassVar[tuple[str, ...]] = ("n", "out", "batch_size", "plots")

    def identity(self) -> dict[str, Any]:
        """The fields that must match for a rerun to resume a run directory (API keys in
        options are redacted: a key is never stored, and a new key resumes the run)."""

        d = self.model_dump()
        for k in self.RESUMABLE:
            d.pop(k, None)
        return redact(d)

    def out_dir(self) -> Path:
        """The run directory (``out`` or the default name)."""
        return Path(self.out) if self.out else Path("runs") / default_run_name(self.env, self.tasks, self.policy)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field."""
        if self.n is not None and (not isinstance(self.n, int) or self.n < 1):
            raise ConfigError(f"n must be a positive number of tasks (on the command line, --n 0 means all tasks), got {self.n!r}.")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {self.batch_size!r}.")
        if self.max_turns is not None and (not isinstance(self.max_turns, int) or self.max_turns < 1):
            raise ConfigError(f"max_turns must be a positive integer, got {self.max_turns!r}.")

        if self.env not in gym.registry:
            raise unknown_name("environment", self.env, [k for k in gym.registry if k.startswith("drgym/")])

        judged = [r for r in (self.rewards or []) if isinstance(r, str) and r in JUDGED]
        if judged and not self.judge:
            raise ConfigError(
                f"--reward {','.join(judged)} is scored by an LLM judge and no --judge was given: pass "
                "--judge openai:MODEL@BASE_URL (a vLLM server of any instruct model works). "
                "--judge hf:smollm2 also runs, but it is not a valid judge (its scores are flagged)."
            )


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The :class:`RolloutConfig` fields of a run file (YAML or JSON), for ``drgym rollout
    --config FILE``: the fields the file gives (``policy``, ``tasks``, ``backend``, ``n``,
    ``policy_options``...), validated by :class:`~drgym.config.RolloutRun`.

    Raises:
        ConfigError: the file is missing or unreadable, is not a mapping, names a field
            that does not exist (with a "Did you mean" hint), or gives a value of the
            wrong type (naming the field).
    """

    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"Run file {p} cannot be read: {e.strerror or e}.") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"Run file {p} is not valid YAML or JSON: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"Run file {p} must be a mapping of run options, got {type(data).__name__}.")
    return parse_section(RolloutRun, data, source=f"Run file {p}").model_dump(exclude_unset=True)


def check_options(config: RolloutConfig, tasks: Sequence[Any] | None = None, *,
                  policy: bool = True, backend: bool = True) -> None:
    """Check a run's options before anything heavy is loaded (index, model, judge).

    Checks the policy spec and its options (:func:`drgym.policies.factory.check_policy`),
    the backend spec, the judge spec, the extra reward names, and the env options (by
    building one env without a backend: Gymnasium envs validate their arguments in the
    constructor, and drgym's build their backend on first use).

    Args:
        config: the run definition (already :meth:`RolloutConfig.validate`-d).
        tasks: the run's tasks (None: a one-task stand-in, for the option check only).
        policy: check ``config.policy`` (False when the caller passes a built policy).
        backend: check ``config.backend`` (False when the caller passes a built backend).

    Raises:
        ConfigError: the first bad option, named.
    """

    if policy:
        check_policy(config.policy, dict(config.policy_options))
    if backend:
        check_spec(config.backend)
    if config.judge is not None:
        kind = str(config.judge).split(":", 1)[0].lower()
        if kind not in ("hf", "openai"):
            raise ConfigError(f"Unknown judge backend {kind!r} in {config.judge!r}: use 'hf:NAME' or 'openai:MODEL@BASE_URL'.")
    if config.rewards:
        known = reward_names()
        for r in config.rewards:
            if r not in known:
                raise unknown_name("reward", r, known)
    env_kw = dict(config.env_options)
    if config.max_turns is not None:
        env_kw["max_turns"] = config.max_turns
    probe_tasks = list(tasks) if tasks else [Task(task_id="probe", question="probe", answers=["probe"])]
    try:
        probe = gym.make(config.env, backend=None, tasks=probe_tasks, **env_kw)
    except TypeError as e:
        # An unknown env option (-e KEY=VALUE) reaches the env constructor; name it
        # and the valid ones instead of dumping the kwargs.

        entry = gym.spec(config.env).entry_point
        cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        valid = sorted(p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "backend", "tasks"))
        bad = sorted(set(env_kw) - set(valid))
        raise ConfigError(f"{config.env} has no option {', '.join(map(repr, bad)) or '?'}; env options: {', '.join(valid)}.") from e
    probe.close()


def default_run_name(env: str, tasks: str, policy: str) -> str:
    """``("drgym/SearchQA-v0", "hotpotqa-dev", "hf:smollm2")`` -> ``"searchqa-hotpotqa-dev-hf-smollm2"``."""
    e = env.split("/")[-1].lower()
    e = re.sub(r"-v\d+$", "", e)
    t = Path(tasks).stem if os.sep in tasks or "." in Path(tasks).name else tasks
    p = re.sub(r"https?://", "", policy)
    name = f"{e}-{t}-{p}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:120]
