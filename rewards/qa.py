"""Short-answer rewards: exact match, cover-EM, token F1 and an LLM-judge soft match.

String metrics use the SQuAD answer normalisation (Rajpurkar et al. 2016, the official
SQuAD v1.1 evaluation script): lower-case, drop punctuation, drop the articles
a/an/the, collapse white space. Every metric takes the maximum over all gold aliases.
Cover-EM ("gold contained") is the containment variant used by Search-R1 / R1-Searcher
style training: the normalised gold occurs in the normalised prediction. drgym requires
whole words (``"paris"`` is not covered by ``"parisian"``), which is stricter than
Search-R1's plain substring check.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from drgym.judges.base import Judge, JudgeRequest
from drgym.judges.factory import make_judge
from drgym.judges.prompts import (
    SOFT_MATCH,
    SOFT_MATCH_BINARY_SCALE,
    SOFT_MATCH_GRADED_SCALE,
)
from drgym.records import Episode, Reward, RewardOutput

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, remove punctuation, articles and extra white space."""
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(golds: str | list[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    return [str(g) for g in golds]


def exact_match(prediction: str, golds: str | list[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold alias, else 0.0 (0.0 with no golds)."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in _golds(golds)))


def cover_exact_match(prediction: str, golds: str | list[str]) -> float:
    """1.0 when some non-empty normalised gold alias occurs (on word boundaries) in the normalised prediction."""
    p = f" {normalize_answer(prediction)} "
    for g in _golds(golds):
        ng = normalize_answer(g)
        if ng and f" {ng} " in p:
            return 1.0
    return 0.0


def token_f1(prediction: str, golds: str | list[str]) -> float:
    """Max over aliases of the SQuAD token-level F1 between normalised prediction and gold.

    Two empty normalised strings give 1.0 (as in the SQuAD v2 script); one empty gives 0.0.
    """
    best = 0.0
    p_toks = normalize_answer(prediction).split()
    for g in _golds(golds):
        g_toks = normalize_answer(g).split()
        if not p_toks or not g_toks:
            best = max(best, float(p_toks == g_toks))
            continue
        common = Counter(p_toks) & Counter(g_toks)
        same = sum(common.values())
        if same == 0:
            continue
        prec, rec = same / len(p_toks), same / len(g_toks)
        best = max(best, 2 * prec * rec / (prec + rec))
    return best


class _StringMetric(Reward):
    fn = staticmethod(exact_match)

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = []
        for ep in episodes:
            scores.append(None if not ep.task.answers else self.fn(ep.answer or "", ep.task.answers))
        return RewardOutput(scores=scores, components={self.name: list(scores)})


class ExactMatch(_StringMetric):
    """Exact match after SQuAD normalisation, max over aliases; None for a task with no gold answers.

    Source: SQuAD v1.1 ``evaluate-v1.1.py`` (Rajpurkar et al. 2016), as Search-R1 uses it.

    Example:
        >>> from drgym.records import Episode, Task
        >>> task = Task(task_id="t", question="Capital of France?", answers=["Paris", "City of Paris"])
        >>> ExactMatch().score([Episode(task, "the  Paris."), Episode(task, "Lyon")]).scores
        [1.0, 0.0]
    """

    name = "em"
    fn = staticmethod(exact_match)


class CoverExactMatch(_StringMetric):
    """Cover-EM: a normalised gold alias is contained in the prediction; None without golds.

    Example:
        >>> from drgym.records import Episode, Task
        >>> task = Task(task_id="t", question="Capital of France?", answers=["Paris"])
        >>> CoverExactMatch().score([Episode(task, "It is Paris, in France"), Episode(task, "")]).scores
        [1.0, 0.0]
    """

    name = "cover_em"
    fn = staticmethod(cover_exact_match)


class F1(_StringMetric):
    """SQuAD token F1, max over aliases; None for a task with no gold answers.

    Source: SQuAD v1.1 ``evaluate-v1.1.py`` (``f1_score``).

    Example:
        >>> from drgym.records import Episode, Task
        >>> task = Task(task_id="t", question="Who wrote it?", answers=["William Shakespeare"])
        >>> F1().score([Episode(task, "Shakespeare"), Episode(Task(task_id="r", question="Essay?"), "text")]).scores
        [0.6666666666666666, None]
    """

    name = "f1"
    fn = staticmethod(token_f1)


class SoftMatch(Reward):
    """LLM-judge soft match: is the prediction equivalent to a gold answer for this question.

    Args:
        judge: a :class:`~drgym.judges.base.Judge` or a spec (``"hf:smollm2"``).
        graded: False -> 0/1 verdicts; True -> 0 / 0.5 / 1.
        shortcut_em: score 1.0 without a judge call when exact match already holds.

    Scores are in [0, 1]; a failed judge call gives None and counts in ``failures``.

    Example (a scripted judge that always says "equivalent"):
        >>> from drgym.judges.base import Judge
        >>> from drgym.records import Episode, Task
        >>> class Yes(Judge):
        ...     model_id = "scripted:yes"
        ...     def complete(self, messages, **kw):
        ...         return '{"score": 1, "justification": "same city"}'
        >>> task = Task(task_id="t", question="Capital of France?", answers=["Paris"])
        >>> out = SoftMatch(Yes(cache=False)).score([Episode(task, "the French capital"), Episode(task, "")])
        >>> out.scores, out.failures
        ([1.0, 0.0], 0)
    """

    name = "llm_match"

    def __init__(self, judge: Judge | str = "hf:smollm2", *, graded: bool = False, shortcut_em: bool = True) -> None:
        self.judge = make_judge(judge)
        self.graded = graded
        self.shortcut_em = shortcut_em

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = [None] * len(episodes)
        reqs, idx = [], []
        scale = SOFT_MATCH_GRADED_SCALE if self.graded else SOFT_MATCH_BINARY_SCALE
        for i, ep in enumerate(episodes):
            if not ep.task.answers:
                continue
            if not (ep.answer or "").strip():
                scores[i] = 0.0
                continue
            if self.shortcut_em and exact_match(ep.answer, ep.task.answers):
                scores[i] = 1.0
                continue
            reqs.append(
                JudgeRequest(
                    SOFT_MATCH,
                    {"question": ep.task.question, "golds": " | ".join(ep.task.answers), "prediction": ep.answer, "scale": scale},
                )
            )
            idx.append(i)
        failures = 0
        for i, res in zip(idx, self.judge.judge_many(reqs)):
            v = res.mean(lambda v: v.score if self.graded else float(v.score >= 0.5))
            if v is None:
                failures += 1
            scores[i] = v
        return RewardOutput(scores=scores, components={self.name: list(scores)}, failures=failures)


class FormatReward(Reward):
    """Format reward: 1.0 when the episode ended with a non-empty answer, minus a penalty per invalid action.

    Args:
        invalid_penalty: subtracted per ``invalid`` tool call in the trajectory.
        require_terminated: with a trajectory, a truncated episode (no answer action) scores 0.

    Score in [0, 1] (clipped at 0). Compose it with a task reward through the registry
    (``{"weighted": {"f1": 1.0, "format": 0.1}}``).

    Example:
        >>> from drgym.records import Episode, Step, Task, ToolCall, Trajectory
        >>> task = Task(task_id="t", question="Q?", answers=["a"])
        >>> traj = Trajectory(episode_id="e", task_id="t", terminated=True,
        ...                   steps=[Step("oops", [ToolCall("invalid")]), Step("<answer>a</answer>", [ToolCall("answer")])])
        >>> FormatReward(invalid_penalty=0.25).score([Episode(task, "a", traj), Episode(task, "")]).scores
        [0.75, 0.0]
    """

    name = "format"

    def __init__(self, invalid_penalty: float = 0.1, require_terminated: bool = True) -> None:
        self.invalid_penalty = float(invalid_penalty)
        self.require_terminated = require_terminated

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = []
        for ep in episodes:
            ok = bool((ep.answer or "").strip())
            traj = ep.trajectory
            if traj is not None and self.require_terminated and not traj.terminated:
                ok = False
            s = 1.0 if ok else 0.0
            if traj is not None:
                s -= self.invalid_penalty * traj.count("invalid")
            scores.append(max(0.0, s))
        return RewardOutput(scores=scores, components={self.name: list(scores)})
