"""GRPO data: task slices, the env factory and the ``train_dataset`` with its prompt -> task table."""

from __future__ import annotations

from typing import Any

from drgym.errors import ConfigError
from drgym.search.registry import backend_from_settings


def load_task_slice(ts, *, whole: bool = False) -> list:
    """``load_tasks(ts.set)[ts.start : ts.start + ts.limit]`` (or the whole set).

    Raises:
        ConfigError: unknown task set, or an empty slice.
    """
    from drgym.envs.task_loaders import load_tasks

    tasks = list(load_tasks(ts.set))
    if whole:
        return tasks
    end = None if ts.limit is None else ts.start + ts.limit
    out = tasks[ts.start:end]
    if not out:
        raise ConfigError(f"task slice {ts.set}[{ts.start}:{end}] is empty ({len(tasks)} tasks in the set).")
    return out


def make_env_factory(cfg, tasks: list, *, backend=None, max_turns: int | None = None):
    """A zero-argument factory of configured envs (``gymnasium.make(cfg.env.id, ...)``).

    The env's ``max_turns`` follows ``rollout.max_turns`` unless ``env.kwargs`` sets it.
    The search backend (``backend``, else the process-wide backend of ``cfg.search``,
    :func:`drgym.search.registry.backend_from_settings`) is shared by every env.
    """
    import drgym.envs  # noqa: F401  (registers the env ids)
    import gymnasium as gym

    kwargs = dict(cfg.env.get("kwargs") or {})
    kwargs.setdefault("max_turns", max_turns or cfg.rollout_settings().max_turns)
    kwargs.setdefault("protocol", cfg.protocol)
    state: dict[str, Any] = {"backend": backend}

    def factory():
        if state["backend"] is None:
            state["backend"] = backend_from_settings(cfg.search)
        return gym.make(cfg.env["id"], backend=state["backend"], tasks=list(tasks), **kwargs).unwrapped

    return factory


def build_dataset(tasks: list, env_factory, tokenizer):
    """The GRPO ``train_dataset`` and the prompt -> task table of the rollout function.

    Each row's ``prompt`` is the rendered chat prompt the env poses for the task (system
    + user, with the assistant header), so the rollout can map it back; the other
    columns (``task_id``, ``question``, ``answers``) reach the reward functions.

    Returns:
        ``(datasets.Dataset, dict[str, Task])``.
    """
    from datasets import Dataset

    env = env_factory()
    rows, table = [], {}
    for t in tasks:
        _obs, info = env.reset(options={"task": t})
        text = tokenizer.apply_chat_template(info["messages"], tokenize=False, add_generation_prompt=True)
        table[text] = t
        rows.append({"prompt": text, "task_id": t.task_id, "question": t.question, "answers": list(t.answers)})
    return Dataset.from_list(rows), table


def check_disjoint(train: list, held_out: list) -> None:
    overlap = {t.task_id for t in train} & {t.task_id for t in held_out}
    if overlap:
        raise ConfigError(f"tasks.train and tasks.eval share {len(overlap)} tasks (e.g. {sorted(overlap)[0]!r}); "
                          "held-out evaluation needs disjoint slices.")


def json_dataset(tasks: list):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": t.question}], "task_id": t.task_id,
                               "question": t.question, "answers": list(t.answers)} for t in tasks])
