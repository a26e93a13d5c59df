"""Confidence intervals over questions: bootstrap means and paired differences.

A score table compares policies on the same questions; a mean alone does not say whether
two policies differ. :func:`mean_ci` gives a mean with its 95% percentile-bootstrap
interval over questions (``scipy.stats.bootstrap``, :data:`N_RESAMPLES` resamples, seeded
with :data:`SEED`, so the same scores give the same interval); :func:`paired` gives the
mean per-question difference of two runs on the same questions with its interval, and
whether that interval excludes 0. ``drgym report`` and ``drgym compare`` print the
interval beside each mean.

>>> mean_ci([1.0, 1.0, 1.0])
{'mean': 1.0, 'lo': 1.0, 'hi': 1.0}
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np

N_RESAMPLES = 10_000
"""Bootstrap resamples of :func:`mean_ci`."""
SEED = 0
"""Seed of the bootstrap's generator (``numpy.random.default_rng(SEED)``)."""
CONFIDENCE = 0.95
"""Confidence level of every interval here."""


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """Mean and 95% percentile-bootstrap interval of ``values`` (one score per question).

    Args:
        values: the per-question scores (any finite floats; at least one).

    Returns:
        ``{"mean", "lo", "hi"}``; ``lo == hi == mean`` when every value is the same (no
        spread, no interval).

    Raises:
        ValueError: ``values`` is empty or holds a NaN or an infinity.
    """
    from scipy.stats import bootstrap  # scipy loads in about a second; only callers of a CI pay for it

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_ci: no values; a confidence interval needs at least one score.")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"mean_ci: {int((~np.isfinite(x)).sum())} of {x.size} values are NaN or infinite.")
    m = float(x.mean())
    if np.all(x == x[0]):  # no spread: the interval is the point
        return {"mean": m, "lo": m, "hi": m}
    res = bootstrap((x,), np.mean, confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, method="percentile",
                    random_state=np.random.default_rng(SEED))
    return {"mean": m, "lo": float(res.confidence_interval.low), "hi": float(res.confidence_interval.high)}


def detectable_effect(sd: float, n: int, *, power: float = 0.8) -> float:
    """Smallest paired mean difference a two-sided 95% test on ``n`` questions detects with
    ``power``, for a per-question difference of standard deviation ``sd``:
    ``(z_0.975 + z_power) * sd / sqrt(n)`` (normal approximation; 2.80 * sd / sqrt(n) at 80%).

    >>> round(detectable_effect(1.0, 100), 3)
    0.28
    """
    z = NormalDist().inv_cdf
    return (z(0.975) + z(power)) * sd / max(1, n) ** 0.5


def paired(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]], metric: str) -> dict:
    """Mean of ``a - b`` per question for ``metric``, with its bootstrap interval.

    Args:
        a, b: ``{task_id: {metric: score}}`` of two runs on the same questions.
        metric: the score compared (e.g. ``"f1"``).

    Returns:
        :func:`mean_ci`'s ``{"mean", "lo", "hi"}`` of the differences, plus
        ``excludes_zero`` (the interval lies above or below 0), ``n`` (questions),
        ``sd`` (population standard deviation of the differences),
        ``detectable_at_80pct_power`` (:func:`detectable_effect`), and ``wins`` / ``losses``
        (questions where ``a`` scores above / below ``b``).

    Raises:
        ValueError: the two runs cover different questions.
    """
    ids = sorted(set(a) & set(b))
    if len(ids) != len(a) or len(ids) != len(b):
        raise ValueError(f"paired difference: the runs cover different questions ({len(a)} vs {len(b)}).")
    diffs = [a[i][metric] - b[i][metric] for i in ids]
    r: dict = mean_ci(diffs)
    r["excludes_zero"] = bool(r["lo"] > 0 or r["hi"] < 0)
    r["n"] = len(ids)
    r["sd"] = statistics.pstdev(diffs) if len(diffs) > 1 else 0.0
    r["detectable_at_80pct_power"] = detectable_effect(r["sd"], len(ids))
    r["wins"] = sum(a[i][metric] > b[i][metric] for i in ids)
    r["losses"] = sum(a[i][metric] < b[i][metric] for i in ids)
    return r


def format_ci(d: Mapping[str, float], *, nd: int = 3, pct: bool = False) -> str:
    """``"mean [lo, hi]"`` of a :func:`mean_ci` result; percentages with ``pct``.

    >>> format_ci({"mean": 0.5, "lo": 0.25, "hi": 0.75}), format_ci({"mean": 0.5, "lo": 0.4, "hi": 0.6}, pct=True)
    ('0.500 [0.250, 0.750]', '50 % [40 %, 60 %]')
    """
    def f(v: float) -> str:
        return f"{100 * v:.0f} %" if pct else f"{v:.{nd}f}"

    return f"{f(d['mean'])} [{f(d['lo'])}, {f(d['hi'])}]"
