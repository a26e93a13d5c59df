"""GRPO data: task slices, the env factory and the ``train_dataset`` with its prompt -> task table."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from drgym.envs.task_loaders import load_tasks  # importing drgym.envs registers the env ids

from drgym.errors import ConfigError
from drgym.policies.generation import render_chat
from drgym.rewards.qa import normalize_answer
from drgym.search.registry import backend_from_settings


def load_task_slice(ts, *, whole: bool = False) -> list:
    """``load_tasks(ts.set)[ts.start : ts.start + ts.limit]`` (or the whole set).

    Raises:
        ConfigError: unknown task set, or an empty slice.
    """
    tasks = list(load_tasks(ts.set))
    if whole:
        return tasks
    end = None if ts.limit is None else ts.start + ts.limit
    out = tasks[ts.start:end]
    if not out:
        raise ConfigError(f"task slice {ts.set}[{ts.start}:{end}] is empty ({len(tasks)} tasks in the set).")
    return out


def make_env_factory(cfg, tasks: list, *, backend=None, max_turns: int | None = None, reward=None):
    """A zero-argument factory of configured envs (``gymnasium.make(cfg.env.id, ...)``).

    The env's ``max_turns`` follows ``rollout.max_turns`` unless ``env.kwargs`` sets it.
    The search backend (``backend``, else the process-wide backend of ``cfg.search``,
    :func:`drgym.search.registry.backend_from_settings`) is shared by every env.
    ``reward`` (a :class:`~drgym.records.Reward`) replaces the env's default reward: the
    env then scores each episode once with it (GRPO passes the run's weighted rewards).
    """
    kwargs = dict(cfg.env.get("kwargs") or {})
    kwargs.setdefault("max_turns", max_turns or cfg.rollout_settings().max_turns)
    kwargs.setdefault("protocol", cfg.protocol)
    if reward is not None:
        kwargs["reward"] = reward
    state: dict[str, Any] = {"backend": backend}

    def factory():
        if state["backend"] is None:
            state["backend"] = backend_from_settings(cfg.search)
        return gym.make(cfg.env["id"], backend=state["backend"], tasks=list(tasks), **kwargs).unwrapped

    return factory


def build_dataset(tasks: list, env_factory, tokenizer, *, enable_thinking: bool | None = None):
    """The GRPO ``train_dataset`` and the prompt -> task table of the rollout function.

    Each row's ``prompt`` is the rendered chat prompt the env poses for the task (system
    + user, with the assistant header, in the ``enable_thinking`` mode), so the rollout
    can map it back; the other columns (``task_id``, ``question``, ``answers``) reach the
    reward functions.

    Returns:
        ``(datasets.Dataset, dict[str, Task])``.
    """
    from datasets import Dataset

    env = env_factory()
    rows, table = [], {}
    for t in tasks:
        _obs, info = env.reset(options={"task": t})
        text = render_chat(tokenizer, info["messages"], enable_thinking=enable_thinking)
        table[text] = t
        rows.append({"prompt": text, "task_id": t.task_id, "question": t.question, "answers": list(t.answers)})
    return Dataset.from_list(rows), table


def check_disjoint(train: list, held_out: list) -> None:
    """Refuse a held-out set that shares tasks with the training set.

    Two tasks are the same when they have the same ``task_id`` or the same question
    after SQuAD normalisation (:func:`drgym.rewards.qa.normalize_answer`), so a question
    that two sets carry under different ids (R1-Searcher's ``stage_2`` shares 4 questions
    with HippoRAG's HotpotQA sample) is caught too.

    Raises:
        ConfigError: the sets overlap (the count and an example are named).
    """
    ids = {t.task_id for t in train} & {t.task_id for t in held_out}
    if ids:
        raise ConfigError(f"tasks.train and tasks.eval share {len(ids)} task ids (e.g. {sorted(ids)[0]!r}); "
                          "held-out evaluation needs disjoint sets.")
    train_q = {normalize_answer(t.question): t.task_id for t in train}
    same = [(train_q[q], t.task_id) for t in held_out if (q := normalize_answer(t.question)) in train_q]
    if same:
        raise ConfigError(f"tasks.train and tasks.eval share {len(same)} questions under different ids (e.g. "
                          f"{same[0][0]!r} = {same[0][1]!r}); held-out evaluation needs disjoint sets.")


def check_split(cfg) -> dict[str, int]:
    """Load a config's ``tasks.train`` and ``tasks.eval`` slices and check they are disjoint.

    Returns:
        ``{"train": n_train, "eval": n_eval}`` (0 for an absent split).

    Raises:
        ConfigError: overlapping sets (:func:`check_disjoint`), an unknown set or an empty slice.
        CorpusError: a set read from ``$DRGYM_SHARED_DATA`` that is not there.
    """
    train = load_task_slice(cfg.tasks["train"]) if "train" in cfg.tasks else []
    held_out = load_task_slice(cfg.tasks["eval"]) if "eval" in cfg.tasks else []
    check_disjoint(train, held_out)
    return {"train": len(train), "eval": len(held_out)}
