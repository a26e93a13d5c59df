"""Short-answer rewards: exact match, cover-EM, token F1 and an LLM-judge soft match.

Sources:

- Normalisation, exact match and token F1 follow the official HotpotQA evaluation
  (Yang et al. 2018, ``hotpot_evaluate_v1.py``: ``normalize_answer``, ``exact_match_score``,
  ``f1_score``), whose normalisation is SQuAD's (Rajpurkar et al. 2016): lower-case, drop
  punctuation, drop the articles a/an/the, collapse white space. Its F1 differs from
  SQuAD's in one rule: when either normalised side is ``yes``, ``no`` or ``noanswer`` and
  the two differ, F1 is 0, so a hedge such as ``"yes or no"`` earns nothing against
  gold ``"yes"``. SQuAD's F1 (no such rule) stays available as :func:`squad_f1`.
- Several gold aliases: the maximum over aliases, as FlashRAG does
  (``flashrag/evaluator/metrics.py``, ``F1_Score``, ``ExactMatch``).
  ``tests/data/rewards/hotpot_official_reference.json`` holds the official functions'
  values on a few hundred pairs; ``tests/test_rewards_hacking.py`` checks these against it.
- Cover-EM ("gold contained") is the containment variant used by Search-R1 / R1-Searcher
  style training: the normalised gold occurs in the normalised prediction. drgym requires
  whole words (``"paris"`` is not covered by ``"parisian"``), which is stricter than
  Search-R1's plain substring check, and a yes/no/noanswer gold is covered only by that
  exact answer (HotpotQA's yes/no rule), so ``"yes or no"`` does not cover ``"yes"``.
- EM, cover-EM and F1 compare the same form of each string, :func:`match_form`: the
  official normalisation, except for a text that it leaves empty (only articles,
  punctuation or white space: gold ``"A"``, the band ``"!!!"``). The official script
  scores any two such texts EM 1 and F1 0, so an empty answer earned EM 1 against gold
  ``"A"``; here such a text keeps its letters (``"A."`` is ``"a"``, ``"!!!"`` stays), a
  blank text matches nothing, and the three metrics always agree: EM 1 implies cover-EM
  1 and F1 1 (``tests/test_metric_properties.py``). On texts the official normalisation
  leaves non-empty, the scores are the official ones.

Every short-answer reward (``em``, ``cover_em``, ``f1``, ``llm_match``) takes an optional
answer guard against the cheap strategies a GRPO policy finds (see :class:`AnswerGuard`
and the README's reward-hacking table): ``max_answer_tokens`` (an answer longer than this,
and than the longest gold, scores 0) and ``candidates`` (an answer listing several
candidates is paid by the share of its candidates that are right, or 0).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

from drgym.errors import ConfigError
from drgym.judges.base import Judge, JudgeRequest
from drgym.judges.factory import require_judge
from drgym.judges.prompts import (
    SOFT_MATCH,
    SOFT_MATCH_BINARY_SCALE,
    SOFT_MATCH_GRADED_SCALE,
)
from drgym.records import Episode, Reward, RewardOutput

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
#: Normalised answers that HotpotQA's F1 treats as labels, not text (``hotpot_evaluate_v1.py``).
YES_NO_NOANSWER = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """SQuAD / HotpotQA normalisation: lower case, drop punctuation, articles and extra white space.

    ``normalize_answer`` of ``hotpot_evaluate_v1.py`` (same as SQuAD v1.1's).

    >>> normalize_answer("The Eiffel Tower!")
    'eiffel tower'
    """
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def match_form(s: str | None) -> str:
    """The form of an answer or gold that EM, cover-EM and F1 compare.

    :func:`normalize_answer` (SQuAD / HotpotQA) when it leaves something; for a text it
    empties (articles, punctuation and white space only), the text lower-cased without
    punctuation, else lower-cased, white space collapsed either way. ``""`` only for a
    blank text (or None), which matches nothing.

    >>> match_form("The Eiffel Tower!"), match_form("A."), match_form("!!!"), match_form(" \t")
    ('eiffel tower', 'a', '!!!', '')
    """
    if s is None:
        return ""
    s = str(s)
    norm = normalize_answer(s)
    if norm:
        return norm
    low = s.lower()
    return " ".join("".join(ch for ch in low if ch not in _PUNCT).split()) or " ".join(low.split())


def _golds(golds: str | list[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    return [str(g) for g in golds]


def exact_match(prediction: str, golds: str | list[str]) -> float:
    """1.0 when the prediction's :func:`match_form` equals a gold alias's, else 0.0 (0.0 with
    no golds, and for a blank prediction).

    HotpotQA ``exact_match_score``, max over aliases (FlashRAG ``ExactMatch``).

    >>> exact_match("the Eiffel tower", ["Eiffel Tower"]), exact_match("yes or no", ["yes"])
    (1.0, 0.0)
    >>> exact_match("", ["A"]), exact_match("a.", ["A"])
    (0.0, 1.0)
    """
    p = match_form(prediction)
    return float(bool(p) and any(p == match_form(g) for g in _golds(golds)))


def cover_exact_match(prediction: str, golds: str | list[str]) -> float:
    """1.0 when some non-empty gold alias occurs (on word boundaries) in the prediction,
    both in :func:`match_form`.

    A gold that normalises to yes/no/noanswer is covered only by that exact answer
    (HotpotQA's yes/no rule), so a hedge covers nothing.

    >>> cover_exact_match("The answer is Paris, France.", ["Paris"]), cover_exact_match("yes or no", ["yes"])
    (1.0, 0.0)
    """
    p = match_form(prediction)
    for g in _golds(golds):
        ng = match_form(g)
        if not ng:
            continue
        if ng in YES_NO_NOANSWER:
            if p == ng:
                return 1.0
        elif f" {ng} " in f" {p} ":
            return 1.0
    return 0.0


def _f1(p_toks: list[str], g_toks: list[str]) -> float:
    same = sum((Counter(p_toks) & Counter(g_toks)).values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p_toks), same / len(g_toks)
    return 2 * prec * rec / (prec + rec)


def token_f1(prediction: str, golds: str | list[str]) -> float:
    """Token-level F1 of HotpotQA's ``f1_score`` (``hotpot_evaluate_v1.py``), max over gold aliases.

    Both sides are normalised (:func:`match_form`) and split on white space. When
    either normalised side is ``yes``, ``no`` or ``noanswer`` and the two differ, F1 is 0
    (so ``"yes or no"``, ``"yes no"`` and ``"yes it is"`` score 0 against gold ``"yes"``).
    No common token (an empty side included) gives 0. Several golds: the maximum, as
    FlashRAG's ``F1_Score``. Returns a float in [0, 1]; 0.0 with no golds.

    >>> token_f1("Gustave Eiffel, the engineer", ["Gustave Eiffel"])
    0.8
    >>> token_f1("yes or no", ["yes"]), token_f1("Yes.", ["yes"])
    (0.0, 1.0)
    """
    p = match_form(prediction)
    best = 0.0
    for g in _golds(golds):
        ng = match_form(g)
        if (p in YES_NO_NOANSWER or ng in YES_NO_NOANSWER) and p != ng:
            continue
        best = max(best, _f1(p.split(), ng.split()))
    return best


def squad_f1(prediction: str, golds: str | list[str]) -> float:
    """SQuAD token F1 (Rajpurkar et al. 2016; SQuAD v2.0 ``compute_f1``), max over gold aliases.

    Unlike :func:`token_f1` it has no yes/no rule (``"yes or no"`` scores 0.5 and
    ``"yes no"`` 0.667 against ``"yes"``), and two sides that both normalise to empty
    give 1.0 (the SQuAD v2 rule for unanswerable questions). Kept for comparison with SQuAD-style reports; the ``f1``
    reward uses :func:`token_f1`.

    >>> squad_f1("yes or no", ["yes"]), round(squad_f1("yes no", ["yes"]), 3), squad_f1("", ["the"])
    (0.5, 0.667, 1.0)
    """
    best = 0.0
    p_toks = normalize_answer(prediction).split()
    for g in _golds(golds):
        g_toks = normalize_answer(g).split()
        if not p_toks or not g_toks:
            best = max(best, float(p_toks == g_toks))
            continue
        best = max(best, _f1(p_toks, g_toks))
    return best


# -- answer guard ---------------------------------------------------------------------------
# Separators between listed candidates: new lines, semicolons, pipes, ", " (not the comma in
# 1,000), " / ", " & ", " or ", " and ", " and/or ", " vs ", and inline enumerations "1) ".
_CAND_SEP = re.compile(
    r"\s*(?:\n|;|\|)\s*"
    r"|,\s+(?:(?:and/or|or|and)\s+)?"
    r"|\s+(?:/|&|and/or|or|and|vs\.?|versus)\s+"
    r"|\s+\(?\d{1,2}[.)]\s+",
    re.I,
)
_ENUM = re.compile(r"^\s*(?:[-*\u2022]|\(?\d{1,2}[.)])\s+")
CANDIDATE_MODES = ("allow", "divide", "zero")


def candidate_parts(prediction: str, golds: str | list[str] = ()) -> list[str]:
    """The normalised candidates a prediction lists (one element when it lists none).

    The prediction is split on list separators (new lines, ``;``, ``|``, ``", "``,
    ``" / "``, ``" & "``, ``" or "``, ``" and "``, ``" and/or "``, ``" vs "``, inline
    ``1)`` / ``2.`` enumerations), bullet markers are dropped, each part is normalised
    (:func:`normalize_answer`) and empty parts are dropped. A gold alias that itself holds
    a separator (``"Columbus, Ohio"``) is kept whole where it occurs (case-insensitive).

    >>> candidate_parts("Paris, London, or Rome")
    ['paris', 'london', 'rome']
    >>> candidate_parts("1,000 people"), candidate_parts("It is Columbus, Ohio.", ["Columbus, Ohio"])
    (['1000 people'], ['it is columbus ohio'])
    """
    text = str(prediction or "")
    protected = sorted({g.strip() for g in _golds(golds) if g.strip() and _CAND_SEP.search(g.strip())}, key=len, reverse=True)
    for k, g in enumerate(protected):
        text = re.sub(re.escape(g), f"\ue000{k}\ue000", text, flags=re.I)
    parts = []
    for raw in _CAND_SEP.split(text):
        for k, g in enumerate(protected):
            raw = raw.replace(f"\ue000{k}\ue000", g)
        part = normalize_answer(_ENUM.sub("", raw))
        if part:
            parts.append(part)
    return parts


def _candidate_right(part: str, gold_norms: list[str]) -> bool:
    """A candidate is right when it is a gold, lies inside one (all its words), or contains one."""
    toks = Counter(part.split())
    for g in gold_norms:
        if not g:
            continue
        if part == g:
            return True
        if part in YES_NO_NOANSWER or g in YES_NO_NOANSWER:
            continue
        if not (toks - Counter(g.split())) or f" {g} " in f" {part} ":
            return True
    return False


@dataclass(frozen=True)
class AnswerGuard:
    """Length and candidate-list guard for short-answer rewards: a multiplier in [0, 1].

    A GRPO policy finds that listing candidates (``"Paris, London, Berlin, Rome"``) or
    pasting a passage collects cover-EM, F1 or a lenient judge's verdict. Search-R1 /
    R1-Searcher style setups cap the answer length; this guard does that and also
    detects candidate lists. Both are off by default (the metric is then the official one).

    Args:
        max_answer_tokens: an answer with more normalised words than this (and than the
            longest gold alias, so an exact long gold is never cut) scores 0. None: no cap.
        candidates: what an answer that lists several candidates (:func:`candidate_parts`)
            earns: ``"allow"`` (no guard), ``"divide"`` (the metric times the share of
            listed candidates that are right: one right among k pays 1/k, no better than
            guessing one of them), ``"zero"`` (0 unless every listed candidate is right).
            A candidate is right when it equals a gold, lies inside one or contains one, so
            ``"Washington, D.C."`` or ``"December 14, 1972"`` against their golds, and a
            list of exactly the golds, are not penalised. An answer equal to a gold is never
            treated as a list.

    On ``em`` the guard changes nothing (only an exact gold pays, and it is never cut);
    it matters for ``cover_em``, ``f1`` and ``llm_match``.

    Raises:
        ConfigError: ``max_answer_tokens`` < 1 or an unknown ``candidates`` mode.

    >>> g = AnswerGuard(max_answer_tokens=10, candidates="divide")
    >>> g.factor("Paris, London, Berlin, Rome", ["Paris"]), g.factor("Paris", ["Paris"])
    (0.25, 1.0)
    >>> g.factor("word " * 11, ["Paris"]), AnswerGuard(candidates="zero").factor("yes or no", ["yes"])
    (0.0, 0.0)
    """

    max_answer_tokens: int | None = None
    candidates: str = "allow"

    def __post_init__(self) -> None:
        m = self.max_answer_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ConfigError(f"max_answer_tokens must be a positive integer or None, got {m!r}.")
        if self.candidates not in CANDIDATE_MODES:
            raise ConfigError(f"candidates must be one of {list(CANDIDATE_MODES)}, got {self.candidates!r}.")

    @property
    def active(self) -> bool:
        """True when the guard can change a score."""
        return self.max_answer_tokens is not None or self.candidates != "allow"

    def factor(self, prediction: str, golds: str | list[str]) -> float:
        """The multiplier for ``prediction`` against ``golds``: 1.0, 0.0 or a share of
        candidates; 1.0 for an exact match (:func:`match_form`), so a guard never takes
        from cover-EM or F1 what EM pays."""
        p = match_form(prediction)
        gold_norms = [match_form(g) for g in _golds(golds)]
        if self.max_answer_tokens is not None:
            cap = max([self.max_answer_tokens] + [len(g.split()) for g in gold_norms])
            if len(p.split()) > cap:
                return 0.0
        if self.candidates != "allow" and p not in gold_norms:
            parts = candidate_parts(prediction, golds)
            if len(parts) > 1:
                right = sum(_candidate_right(c, gold_norms) for c in parts)
                return right / len(parts) if self.candidates == "divide" else float(right == len(parts))
        return 1.0


class _StringMetric(Reward):
    fn = staticmethod(exact_match)

    def __init__(self, *, max_answer_tokens: int | None = None, candidates: str = "allow") -> None:
        self.guard = AnswerGuard(max_answer_tokens, candidates)

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = []
        factors: list[float | None] = []
        for ep in episodes:
            if not ep.task.answers:
                scores.append(None)
                factors.append(None)
                continue
            f = self.guard.factor(ep.answer or "", ep.task.answers) if self.guard.active else 1.0
            scores.append(self.fn(ep.answer or "", ep.task.answers) * f if f else 0.0)
            factors.append(f)
        comps: dict[str, list[float | None]] = {self.name: list(scores)}
        if self.guard.active:
            comps[f"{self.name}_guard"] = factors
        return RewardOutput(scores=scores, components=comps)


_GUARD_ARGS = """
    Args:
        max_answer_tokens: optional length cap (see :class:`AnswerGuard`); None = off.
        candidates: ``"allow"`` (default), ``"divide"`` or ``"zero"`` for answers that list
            several candidates (see :class:`AnswerGuard`).

    Scores in [0, 1]; None for a task with no gold answers. With a guard on, the
    component ``<name>_guard`` holds each episode's multiplier."""


class ExactMatch(_StringMetric):
    __doc__ = """Exact match (HotpotQA ``exact_match_score``), max over gold aliases.
""" + _GUARD_ARGS + """

    >>> from drgym.records import Task
    >>> ExactMatch().score([Episode(Task("t", "Capital of France?", ["Paris"]), "paris.")]).scores
    [1.0]
    """

    name = "em"
    fn = staticmethod(exact_match)


class CoverExactMatch(_StringMetric):
    __doc__ = """Cover-EM: a normalised gold alias occurs, as whole words, in the prediction.

    Paid in full for candidate lists and pasted passages unless guarded: train with
    ``candidates="divide"`` and ``max_answer_tokens``, or use ``em`` / ``f1``.
""" + _GUARD_ARGS + """

    >>> from drgym.records import Task
    >>> e = Episode(Task("t", "Capital of France?", ["Paris"]), "Paris, London, Berlin, Rome")
    >>> CoverExactMatch().score([e]).scores, CoverExactMatch(candidates="divide").score([e]).scores
    ([1.0], [0.25])
    """

    name = "cover_em"
    fn = staticmethod(cover_exact_match)


class F1(_StringMetric):
    __doc__ = """Token F1 of the official HotpotQA evaluation (:func:`token_f1`), max over gold aliases.
""" + _GUARD_ARGS + """

    >>> from drgym.records import Task
    >>> F1().score([Episode(Task("t", "Is Paris in France?", ["yes"]), "yes or no")]).scores
    [0.0]
    >>> F1(max_answer_tokens=5).score([Episode(Task("t", "Who?", ["Gustave Eiffel"]), "Gustave Eiffel " * 4)]).scores
    [0.0]
    """

    name = "f1"
    fn = staticmethod(token_f1)


class SoftMatch(Reward):
    """LLM-judge soft match: is the prediction equivalent to a gold answer for this question.

    Args:
        judge: a :class:`~drgym.judges.base.Judge` or a spec (``"openai:MODEL@URL"``);
            required.
        graded: False -> 0/1 verdicts; True -> 0 / 0.5 / 1.
        shortcut_em: score 1.0 without a judge call when exact match already holds.
        max_answer_tokens, candidates: the :class:`AnswerGuard` (off by default). The
            verdict is multiplied by the guard's factor; an answer the guard zeroes is
            scored 0 without a judge call.

    Scores are in [0, 1]; a failed judge call gives None and counts in ``failures``.
    An exact match scores 1 without a call (with ``shortcut_em``), so what
    :func:`exact_match` accepts is never refused; any other answer with no letter or
    digit scores 0 without a call.
    With a judge that accepts everything, the guard still zeroes a candidate list:

    >>> from drgym.records import Task
    >>> from drgym.judges.base import Judge
    >>> class Lenient(Judge):
    ...     model_id = "stub:lenient"
    ...     def complete(self, messages, **kw):
    ...         return '{"score": 1}'
    >>> r = SoftMatch(Lenient(cache=False), candidates="zero")
    >>> [r.score([Episode(Task("t", "Capital of France?", ["Paris"]), a)]).scores[0]
    ...  for a in ("Paris", "the city of Paris", "Paris or Rome", "...")]
    [1.0, 1.0, 0.0, 0.0]

    Raises:
        ConfigError: no judge (``judge`` is required; see
            :func:`drgym.judges.base.require_judge`).
    """

    name = "llm_match"

    def __init__(self, judge: Judge | str | None = None, *, graded: bool = False, shortcut_em: bool = True,
                 max_answer_tokens: int | None = None, candidates: str = "allow") -> None:
        self.judge = require_judge(judge, self.name)
        self.graded = graded
        self.shortcut_em = shortcut_em
        self.guard = AnswerGuard(max_answer_tokens, candidates)

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = [None] * len(episodes)
        factors: list[float | None] = [None] * len(episodes)
        reqs, idx = [], []
        scale = SOFT_MATCH_GRADED_SCALE if self.graded else SOFT_MATCH_BINARY_SCALE
        for i, ep in enumerate(episodes):
            if not ep.task.answers:
                continue
            factors[i] = self.guard.factor(ep.answer or "", ep.task.answers) if self.guard.active else 1.0
            if self.shortcut_em and exact_match(ep.answer or "", ep.task.answers):
                scores[i] = factors[i]
                continue
            if not any(ch.isalnum() for ch in ep.answer or "") or not factors[i]:
                scores[i] = 0.0
                continue
            reqs.append(
                JudgeRequest(
                    SOFT_MATCH,
                    {"question": ep.task.question, "golds": " | ".join(ep.task.answers), "prediction": ep.answer, "scale": scale},
                )
            )
            idx.append(i)
        failures = 0
        for i, res in zip(idx, self.judge.judge_many(reqs) if reqs else []):
            v = res.mean(lambda v: v.score if self.graded else float(v.score >= 0.5))
            if v is None:
                failures += 1
            scores[i] = v if v is None else v * factors[i]
        comps: dict[str, list[float | None]] = {self.name: list(scores)}
        if self.guard.active:
            comps[f"{self.name}_guard"] = factors
        return RewardOutput(scores=scores, components=comps, failures=failures)


class FormatReward(Reward):
    """Format reward: 1.0 when the episode ended with an answer, minus a penalty per invalid action.

    An answer counts when it holds at least one letter or digit (``"..."`` does not).

    Args:
        invalid_penalty: subtracted per ``invalid`` tool call in the trajectory.
        require_terminated: with a trajectory, a truncated episode (no answer action) scores 0.
        mode: ``"bonus"`` scores in [0, 1] as above; ``"penalty"`` subtracts 1, so a
            well-formed episode scores 0 and a malformed one down to -1: the term can
            only take reward away, never pay for a wrong answer (the GRPO advantages are
            the same up to the weight, but the reward's scale stays the task's).

    Score in [0, 1] (clipped at 0), or [-1, 0] in ``"penalty"`` mode. Compose it with a task reward through the registry
    (``{"weighted": {"f1": 1.0, "format": 0.1}}``). It pays for any well-formed answer,
    right or wrong, so it is a small collapse guard, never a task reward on its own.

    >>> from drgym.records import Task
    >>> FormatReward().score([Episode(Task("t", "q", ["x"]), "Paris"), Episode(Task("t", "q", ["x"]), "...")]).scores
    [1.0, 0.0]
    >>> FormatReward(mode="penalty").score([Episode(Task("t", "q", ["x"]), "Paris"), Episode(Task("t", "q", ["x"]), "")]).scores
    [0.0, -1.0]
    """

    name = "format"

    def __init__(self, invalid_penalty: float = 0.1, require_terminated: bool = True, mode: str = "bonus") -> None:
        if mode not in ("bonus", "penalty"):
            raise ConfigError(f"format reward: mode must be 'bonus' or 'penalty', got {mode!r}.")
        self.invalid_penalty = float(invalid_penalty)
        self.require_terminated = require_terminated
        self.mode = mode

    def score(self, episodes: list[Episode]) -> RewardOutput:
        scores: list[float | None] = []
        for ep in episodes:
            ok = any(ch.isalnum() for ch in ep.answer or "")
            traj = ep.trajectory
            if traj is not None and self.require_terminated and not traj.terminated:
                ok = False
            s = 1.0 if ok else 0.0
            if traj is not None:
                s -= self.invalid_penalty * traj.count("invalid")
            s = max(0.0, s)
            scores.append(s - 1.0 if self.mode == "penalty" else s)
        return RewardOutput(scores=scores, components={self.name: list(scores)})
