"""``answers.md``: every question of a run beside the agent's answer and the gold, for a person.

One Markdown table row per task of the run, in task order: the question, the agent's
final answer, the gold answer(s), whether it is correct (exact match, ``EM``) and its
token ``F1``, the number of searches, and the episode's line number in
``trajectories.jsonl`` (``sed -n 'Np' trajectories.jsonl`` prints that episode whole).
The episode shown for a task is the one the metrics count
(:func:`drgym.evaluation.run_directory.select_episodes`). The file is written
atomically and rewritten whole at the end of every session, so a resumed run's file
covers all its episodes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from drgym.atomic import atomic_write_text
from drgym.evaluation.metrics import episode_counts, episode_failures
from drgym.evaluation.run_directory import select_episodes

ANSWERS_FILE = "answers.md"
"""The per-question answers file of a run directory."""

CELL_MAX = 160
"""Longest a question, answer or gold cell gets, in characters; longer text ends in ``...``
(the whole text is in ``trajectories.jsonl``)."""


def _cell(text: Any, limit: int = CELL_MAX) -> str:
    """One Markdown table cell: whitespace collapsed, ``|`` and ``<`` escaped, cut at ``limit``."""
    s = " ".join(str(text).split())
    if len(s) > limit:
        s = s[: limit - 3].rstrip() + "..."
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")


def _score(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
        return None
    return float(v)


def lines_of_records(path: Path) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The episode records of a ``trajectories.jsonl`` and each one's line number.

    Lines that are not UTF-8 JSON objects with a string ``task_id`` are skipped (as
    :func:`drgym.evaluation.run_directory.read_run_episodes` does).

    Returns:
        ``(records, line_of)``: the records in file order, and ``id(record)`` -> its
        1-based line number in the file.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    records: list[dict[str, Any]] = []
    line_of: dict[int, int] = {}
    for n, raw in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            continue
        if isinstance(d, dict) and isinstance(d.get("task_id"), str):
            records.append(d)
            line_of[id(d)] = n
    return records, line_of


def answer_rows(trajectories_path: Path, tasks: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per task of ``tasks`` that has an episode in ``trajectories_path``, in task order.

    Args:
        trajectories_path: the run's ``trajectories.jsonl``.
        tasks: the run's :class:`~drgym.records.Task` objects (``task_id``,
            ``question``, ``answers``).

    Returns:
        Dicts ``{"index", "task_id", "question", "answer", "gold", "em", "f1",
        "searches", "line", "failed"}``: ``index`` is the task's 1-based position in
        the run, ``answer`` None when the episode ended without one, ``gold`` the list
        of gold answers (empty for a task without), ``em``/``f1`` the recorded scores
        in [0, 1] (None when not scored), ``searches`` the episode's search calls,
        ``line`` the episode's 1-based line in ``trajectories.jsonl``, ``failed`` its
        backend or policy failures (:func:`~drgym.evaluation.metrics.episode_failures`).

    Raises:
        FileNotFoundError: no ``trajectories.jsonl``.
    """
    records, line_of = lines_of_records(trajectories_path)
    chosen = select_episodes(records)
    rows = []
    for i, task in enumerate(tasks, 1):
        d = chosen.get(task.task_id)
        if d is None:
            continue
        rc = d.get("reward_components") or {}
        meta = d.get("metadata") or {}
        gold = list(getattr(task, "answers", None) or meta.get("answers") or [])
        rows.append({
            "index": i, "task_id": task.task_id,
            "question": getattr(task, "question", None) or meta.get("question") or "",
            "answer": d.get("final_answer"), "gold": gold,
            "em": _score(rc.get("em")), "f1": _score(rc.get("f1")),
            "searches": episode_counts(d)["searches"], "line": line_of[id(d)],
            "failed": episode_failures(d),
        })
    return rows


def render_answers(rows: list[dict[str, Any]], *, title: str, total: int) -> str:
    """The text of ``answers.md`` for :func:`answer_rows`' rows.

    Args:
        rows: the rows, in task order.
        title: what ran, e.g. ``"hf:smollm2 on hotpotqa-dev (drgym/SearchQA-v0)"``.
        total: the number of tasks of the run (rows may be fewer while it is unfinished).
    """
    scored = [r for r in rows if r["em"] is not None]
    head = [f"# Answers: {_cell(title, 200)}", ""]
    summary = f"{len(rows)} of {total} questions answered by an episode"
    if scored:
        right = sum(1 for r in scored if r["em"] >= 1.0)
        f1s = [r["f1"] for r in scored if r["f1"] is not None]
        summary += f"; {right} of {len(scored)} correct (exact match)"
        if f1s:
            summary += f", mean F1 {sum(f1s) / len(f1s):.3f}"
    head += [summary + ".", "",
             "`correct` is exact match against any gold answer after SQuAD normalisation (case, articles, "
             "punctuation); `F1` is the token F1 against the best gold answer. `line` is the episode's line "
             "in `trajectories.jsonl` (`sed -n 'Np' trajectories.jsonl` prints line N).", "",
             "| # | question | answer | gold | correct | F1 | searches | line |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    body = []
    for r in rows:
        if r["failed"]:
            answer = f"(failed: {'; '.join(dict.fromkeys(r['failed']))})"
        elif r["answer"] is None:
            answer = "(no answer)"
        else:
            answer = r["answer"]
        correct = "-" if r["em"] is None else ("yes" if r["em"] >= 1.0 else "no")
        f1 = "-" if r["f1"] is None else f"{r['f1']:.2f}"
        gold = " / ".join(str(g) for g in r["gold"]) if r["gold"] else "-"
        body.append(f"| {r['index']} | {_cell(r['question'])} | {_cell(answer)} | {_cell(gold)} | {correct} | {f1} "
                    f"| {r['searches']} | {r['line']} |")
    return "\n".join(head + body) + "\n"


def write_answers(out_dir: Path, tasks: Sequence[Any], *, title: str) -> Path:
    """Write ``answers.md`` into a run directory from its ``trajectories.jsonl`` (atomically).

    Args:
        out_dir: the run directory.
        tasks: the run's tasks, in run order.
        title: what ran (the file's heading).

    Returns:
        The path written.

    Raises:
        FileNotFoundError: the run directory has no ``trajectories.jsonl``.
        DiskFullError: the disk is full (the previous file, if any, is kept).
    """
    out_dir = Path(out_dir)
    rows = answer_rows(out_dir / "trajectories.jsonl", tasks)
    path = out_dir / ANSWERS_FILE
    atomic_write_text(path, render_answers(rows, title=title, total=len(tasks)))
    return path
