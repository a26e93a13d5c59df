"""Length guard: a penalty for answers beyond a token budget.

Judges read whole reports, and longer reports trivially recall more key points
(DeepResearchGym KPR, arXiv 2505.19253 §3.2), so long-form training adds this guard.
Tokens are counted as white-space separated words unless a tokenizer is given.
"""

from __future__ import annotations

from typing import Any, Callable

from drgym.errors import ConfigError
from drgym.records import Episode, Reward, RewardOutput


class LengthGuard(Reward):
    """0 up to ``max_tokens``; beyond, ``-rate * excess / max_tokens``, floored at ``-max_penalty``.

    Args:
        max_tokens: budget N (> 0).
        rate: penalty per N excess tokens (1.0: a report of 2N tokens gets -1).
        max_penalty: the most negative value (> 0).
        tokenizer: optional ``str -> list`` (e.g. a HF tokenizer's ``tokenize``); default ``str.split``.

    Components: ``length_tokens`` (the count) and ``length_penalty`` (the score).

    >>> from drgym.records import Task
    >>> LengthGuard(max_tokens=4).score([Episode(Task("t", "q"), "a b c"), Episode(Task("t", "q"), "a b c d e f")]).scores
    [0.0, -0.5]
    """

    name = "length"

    def __init__(self, max_tokens: int = 2000, rate: float = 1.0, max_penalty: float = 1.0, tokenizer: Callable[[str], Any] | None = None) -> None:
        if max_tokens <= 0:
            raise ConfigError(f"max_tokens must be > 0, got {max_tokens}.")
        if rate < 0 or max_penalty < 0:
            raise ConfigError(f"rate and max_penalty must be >= 0, got {rate}, {max_penalty}.")
        self.max_tokens = int(max_tokens)
        self.rate = float(rate)
        self.max_penalty = float(max_penalty)
        self.tokenizer = tokenizer or str.split

    def count(self, text: str) -> int:
        """Token count of ``text``."""
        return len(self.tokenizer(text or ""))

    def score(self, episodes: list[Episode]) -> RewardOutput:
        counts = [self.count(ep.answer) for ep in episodes]
        scores: list[float | None] = []
        for n in counts:
            excess = max(0, n - self.max_tokens)
            scores.append(-min(self.max_penalty, self.rate * excess / self.max_tokens) if excess else 0.0)
        return RewardOutput(scores=scores, components={"length_tokens": [float(c) for c in counts], "length_penalty": list(scores)})
