"""Report quality: six 0-10 criteria, reported as one fraction in [0, 1] (DeepResearchGym).

Source: DeepResearchGym (Coelho et al., arXiv 2505.19253, §3.2 "Report quality");
upstream ``eval_quality_async.py``: one judge call per criterion (Clarity, Depth,
Balance, Breadth, Support, Insightfulness), integer 0-10 each, report score =
sum / (6 x 10) x 100.

Scale: drgym reports quality on ONE scale, a fraction in [0, 1] = sum / (6 x 10): the
reward's score, each criterion's component (its 0-10 verdict / 10), ``drgym rollout``
metrics and ``drgym evaluate`` all use it. DeepResearchGym's published numbers are this
times 100. Only the judge's verdicts (and the verdict cache) hold the 0-10 integers.
"""

from __future__ import annotations

from drgym.errors import ConfigError
from drgym.judges.base import Judge, JudgeRequest
from drgym.judges.factory import require_judge
from drgym.judges.prompts import QUALITY, QUALITY_CRITERIA
from drgym.records import Episode, Reward, RewardOutput


def quality_score(criterion_scores: dict[str, float]) -> float:
    """Normalised quality, a fraction in [0, 1]: ``sum(scores) / (10 * len(scores))``.

    ``criterion_scores`` are the judge's 0-10 verdicts. (DeepResearchGym's 0-100 value
    is this times 100.)

    >>> quality_score({"Clarity": 6, "Depth": 4})
    0.5

    Raises:
        ConfigError: empty input, or a score outside 0-10.
    """
    if not criterion_scores:
        raise ConfigError("quality_score needs at least one criterion score.")
    for k, v in criterion_scores.items():
        if not 0.0 <= v <= 10.0:
            raise ConfigError(f"criterion {k!r} score must be in [0, 10], got {v}.")
    return sum(criterion_scores.values()) / (10.0 * len(criterion_scores))


class ReportQuality(Reward):
    """Six-criterion report quality (DeepResearchGym); score = sum/60, a fraction in [0, 1].

    Components ``quality_<criterion>`` (e.g. ``quality_depth``) are on the same scale:
    the criterion's 0-10 verdict / 10, so the score is their mean. An empty report scores
    0 without judge calls. If any criterion's judge call fails after retries the episode
    scores None (counted in ``failures``).

    Args:
        judge: judge or spec (required: ``ConfigError`` without one).
        criteria: subset of the six names (default all six).
        max_report_chars: the report is cut to this many characters.

    Example (a scripted judge giving every criterion 7/10):
        >>> from drgym.judges.base import Judge
        >>> from drgym.records import Episode, Task
        >>> class Seven(Judge):
        ...     model_id = "scripted:seven"
        ...     def complete(self, messages, **kw):
        ...         return '{"score": 7, "justification": "fine"}'
        >>> task = Task(task_id="r", question="Why is the sky blue?", kind="research")
        >>> ReportQuality(Seven(cache=False)).score([Episode(task, "Rayleigh scattering [1]."), Episode(task, "")]).scores
        [0.7, 0.0]
    """

    name = "quality"

    def __init__(self, judge: Judge | str | None = None, *, criteria: list[str] | None = None, max_report_chars: int = 30000) -> None:
        crit = list(criteria or QUALITY_CRITERIA)
        bad = [c for c in crit if c not in QUALITY_CRITERIA]
        if bad:
            raise ConfigError(f"Unknown quality criteria {bad}; known: {list(QUALITY_CRITERIA)}.")
        self.criteria = crit
        self.judge = require_judge(judge, self.name)
        self.max_report_chars = int(max_report_chars)

    def score(self, episodes: list[Episode]) -> RewardOutput:
        n = len(episodes)
        per: dict[str, list[float | None]] = {c: [None] * n for c in self.criteria}  # 0-10 verdicts
        reqs, where = [], []
        for i, ep in enumerate(episodes):
            report = (ep.answer or "")[: self.max_report_chars]
            if not report.strip():
                for c in self.criteria:
                    per[c][i] = 0.0
                continue
            for c in self.criteria:
                reqs.append(
                    JudgeRequest(QUALITY, {"question": ep.task.question, "report": report, "criterion": c, "description": QUALITY_CRITERIA[c]})
                )
                where.append((i, c))
        for (i, c), res in zip(where, self.judge.judge_many(reqs)):
            per[c][i] = res.mean(lambda v: v.score)
        scores: list[float | None] = []
        failures = 0
        for i in range(n):
            vals = {c: per[c][i] for c in self.criteria}
            if any(v is None for v in vals.values()):
                failures += 1
                scores.append(None)
            else:
                scores.append(quality_score(vals))
        comps = {f"quality_{c.lower()}": [None if v is None else v / 10.0 for v in per[c]] for c in self.criteria}
        return RewardOutput(scores=scores, components=comps, failures=failures)
