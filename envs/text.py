"""Text helpers shared by the environments: a Unicode ``Text`` space and token budgets.

Token unit
----------
Budgets on observations (``max_obs_tokens``) are counted in **drgym tokens**: one token per
run of non-space characters (a "word", punctuation attached), except that each CJK
ideograph, kana or hangul syllable counts as one token by itself. The count is a single
regex pass (about 1 µs per 10 words), needs no tokenizer, and is within roughly 1.3x of a
BPE count for English prose (BPE tokenizers split long or rare words into several pieces,
so a budget of 500 drgym tokens is about 500-700 model tokens).
"""

from __future__ import annotations

import re
from itertools import islice

import numpy as np
from gymnasium.spaces import Text

# CJK unified ideographs (+ext A, compatibility), hiragana/katakana, hangul syllables,
# CJK punctuation and fullwidth forms: each character is one token.
_CJK = "\u2e80-\u2fff\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_TOKEN_RE = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")

#: Characters :meth:`UnicodeText.sample` draws from: printable ASCII, whitespace, some
#: Latin-1, Greek, Cyrillic, CJK and an emoji, so sampled actions exercise non-ASCII paths.
SAMPLE_CHARSET = (
    "".join(chr(c) for c in range(32, 127))
    + "\n\t"
    + "äöüßéèçñåøÆœ"
    + "αβγδλπΩ"
    + "абвгдж"
    + "中文日本語研究問題答案"
    + "한국어"
    + "😀"
)


class UnicodeText(Text):
    """A :class:`gymnasium.spaces.Text` space that contains *any* Unicode string.

    Gymnasium's ``Text`` only contains strings whose characters all belong to its
    ``charset`` (by default ``[0-9A-Za-z]``: no spaces, no punctuation, no non-ASCII), so
    real model text would fail ``obs in env.observation_space``. This subclass keeps the
    length bounds (``min_length <= len(x) <= max_length``, in characters, both
    inclusive) and accepts every character; :meth:`sample` draws from
    :data:`SAMPLE_CHARSET`.

    Vector envs: ``gymnasium.vector.SyncVectorEnv`` works as is, and so does
    ``AsyncVectorEnv(..., shared_memory=False)`` (observations are pickled through pipes).
    ``AsyncVectorEnv(shared_memory=True)`` does not: Gymnasium stores ``Text`` observations
    in shared memory as indices into the charset (and reserves ``max_length`` int32 per
    env), so a character outside :data:`SAMPLE_CHARSET` makes the worker fail with a
    ``KeyError`` (Gymnasium 1.4; with a narrow charset the text would be garbled instead).

    Args:
        max_length: longest string, in characters.
        min_length: shortest string, in characters (default 0: empty text allowed).
        seed: seed of the space's own sampler.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x) -> bool:
        """True for a ``str`` whose length (characters) is within the bounds."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:  # Space defines __eq__; keep instances hashable
        return hash((UnicodeText, self.min_length, self.max_length))


def count_tokens(text: str) -> int:
    """Number of drgym tokens in ``text`` (see the module docstring for the unit)."""
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def truncate_tokens(text: str, max_tokens: int, marker: str = " …") -> tuple[str, bool]:
    """Cut ``text`` after its first ``max_tokens`` drgym tokens, keeping original spacing.

    Args:
        text: any text.
        max_tokens: tokens to keep (>= 0).
        marker: appended when the text was cut.

    Returns:
        ``(text, was_truncated)``.
    """
    if max_tokens <= 0:
        return (marker.strip() if text.strip() else ""), bool(text.strip())
    nxt = next(islice(_TOKEN_RE.finditer(text), max_tokens, None), None)  # token max_tokens + 1
    if nxt is None:
        return text, False
    return text[: nxt.start()].rstrip() + marker, True
