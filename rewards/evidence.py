"""Evidence recall: did the agent's searches bring a gold answer into view?

A shaping reward for search skill, in the spirit of StepSearch's information-gain reward
(Wang et al. 2025, arXiv 2505.15107) and s3's gain over retrieve-then-read (Jiang et al.
2025, arXiv 2505.14146): it pays when a gold alias appears in what the env showed the
agent, whatever the final answer. Alone it teaches nothing about answering, so it is a
term beside ``f1`` (``{"weighted": {"f1": 1.0, "evidence_recall": 0.2}}``), most useful on
questions whose gold is retrievable but not with the question as query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from drgym.errors import ConfigError
from drgym.records import Episode, Reward, RewardOutput
from drgym.rewards.qa import YES_NO_NOANSWER, cover_exact_match, normalize_answer

_TAG = re.compile(r"</?[A-Za-z_][\w-]*>")


def visible_text(observation: str) -> str:
    """An observation with its tags (``<information>``...) replaced by spaces.

    SQuAD normalisation drops punctuation without a space, so ``"Homer.</information>"``
    would normalise to ``homerinformation`` and hide the alias ``Homer``.

    >>> visible_text("attributed to Homer.</information>")
    'attributed to Homer. '
    """
    return _TAG.sub(" ", observation or "")


def gold_aliases(answers: Iterable[str]) -> list[str]:
    """The gold aliases that can appear in a passage: not empty after SQuAD normalisation,
    and not yes / no / noanswer (HotpotQA's comparison answers, never in a text as such).

    >>> gold_aliases(["yes", "Paris", "  ", "Paris, France"])
    ['Paris', 'Paris, France']
    """
    return [a for a in answers if normalize_answer(a) and normalize_answer(a) not in YES_NO_NOANSWER]


def gold_in_view(text: str, answers: Iterable[str]) -> bool:
    """Did the agent see the gold: True when one of ``answers``' :func:`gold_aliases` occurs
    in ``text`` (SQuAD-normalised, on word boundaries: :func:`drgym.rewards.qa.cover_exact_match`).

    ``text`` is what the env showed: the tool results of an observation (``shown_text`` of
    the env's prompts module: the answerable filter, question synthesis, preflight) or the
    :func:`visible_text` of an episode's observations (:class:`EvidenceRecall`, the score
    tables' ``saw_gold``).
    False when no alias can appear in a text.

    >>> gold_in_view("Hamlet is by William Shakespeare.", ["William Shakespeare"]), gold_in_view("yes", ["yes"])
    (True, False)
    """
    golds = gold_aliases(answers)
    return bool(golds) and bool(cover_exact_match(text, golds))


class EvidenceRecall(Reward):
    """1.0 when a gold alias is in an observation of the episode, else 0.0.

    The match is :func:`drgym.rewards.qa.cover_exact_match` (SQuAD-normalised, on word
    boundaries) over each step's observation text (what the agent saw, after the env's
    token budget), or over the full retrieved passages with ``scope="results"``.

    Args:
        scope: ``"observation"`` (default: the text shown) or ``"results"`` (the
            retrieved passages before truncation).
        baseline: with ``"question"``, subtract 1.0 when the gold is already in view for
            the question as query, i.e. pay only the gain over retrieve-then-read
            (needs ``task.metadata["question_query_hit"]``, a bool; tasks without it
            count as 0). Default ``None``: no baseline.

    Score in [0, 1] (in [-1, 1] with a baseline); None for an episode without a
    trajectory or for a task with no alias that can appear in text (yes/no only), counted
    in neither mean. Component ``evidence_recall``.

    Raises:
        ConfigError: unknown ``scope`` or ``baseline``.

    >>> from drgym.records import Task, Trajectory, Step
    >>> t = Task("t", "Who wrote Hamlet?", ["William Shakespeare"])
    >>> seen = Trajectory("e", "t", steps=[Step("<search>x</search>", observation="Hamlet is by William Shakespeare.")])
    >>> unseen = Trajectory("e", "t", steps=[Step("<search>x</search>", observation="Paris is in France.")])
    >>> EvidenceRecall().score([Episode(t, "", seen), Episode(t, "", unseen), Episode(t, "")]).scores
    [1.0, 0.0, None]
    """

    name = "evidence_recall"

    def __init__(self, scope: str = "observation", baseline: str | None = None) -> None:
        if scope not in ("observation", "results"):
            raise ConfigError(f"evidence_recall: scope must be 'observation' or 'results', got {scope!r}.")
        if baseline not in (None, "question"):
            raise ConfigError(f"evidence_recall: baseline must be null or 'question', got {baseline!r}.")
        self.scope = scope
        self.baseline = baseline

    def _text(self, traj) -> str:
        if self.scope == "observation":
            return " ".join(visible_text(s.observation) for s in traj.steps)
        return " ".join(f"{r.get('title', '')} {r.get('text', '')}" for s in traj.steps for r in s.results or [])

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = []
        for ep in episodes:
            golds = gold_aliases(ep.task.answers)
            if ep.trajectory is None or not golds:
                scores.append(None)
                continue
            s = cover_exact_match(self._text(ep.trajectory), golds)
            if self.baseline == "question":
                s -= 1.0 if ep.task.metadata.get("question_query_hit") else 0.0
            scores.append(float(s))
        return RewardOutput(scores=scores, components={self.name: list(scores)})
