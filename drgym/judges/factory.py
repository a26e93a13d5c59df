"""Build a judge from a spec string: :func:`make_judge`.

Kept apart from :mod:`drgym.judges.base` (the interface) so that the backends
(:mod:`drgym.judges.local`, :mod:`drgym.judges.openai`) import the interface and this
module imports them: no import circle.
"""

from __future__ import annotations

from typing import Any

from drgym.errors import ConfigError
from drgym.judges.base import Judge
from drgym.judges.local import HFJudge
from drgym.judges.openai import OpenAIJudge


def make_judge(spec: str | Judge, **kwargs: Any) -> Judge:
    """Build a judge from a spec string.

    Specs:
        ``hf:NAME`` -- local transformers model (``hf:smollm2`` = SmolLM2-135M-Instruct
        via :func:`drgym.models.load_causal_lm`; or a local folder / hub name).
        ``openai:MODEL@BASE_URL`` -- OpenAI-compatible endpoint (vLLM, OpenAI,
        OpenRouter); the key comes from ``DRGYM_JUDGE_API_KEY`` or ``OPENAI_API_KEY``.
        ``openai:MODEL`` -- base URL from ``DRGYM_JUDGE_BASE_URL`` / ``OPENAI_BASE_URL``
        (default ``https://api.openai.com/v1``).
        ``openai`` -- model from ``DRGYM_JUDGE_MODEL`` as well.

    ``kwargs`` go to the judge constructor (``cache``, ``n_samples``, ``temperature``,
    ``retry`` (a :class:`~drgym.config.RetryPolicy` or its fields)...).

    Raises:
        ConfigError: unknown backend prefix or empty model.
    """
    if isinstance(spec, Judge):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"Judge spec must be a non-empty string like 'hf:smollm2' or 'openai:MODEL@URL', got {spec!r}.")
    kind, _, rest = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "hf":
        return HFJudge(rest or "smollm2", **kwargs)
    if kind == "openai":
        model, _, base = rest.partition("@")
        return OpenAIJudge(model=model or None, base_url=base or None, **kwargs)
    raise ConfigError(f"Unknown judge backend {kind!r} in {spec!r}: use 'hf:NAME' or 'openai:MODEL@BASE_URL'.")


def require_judge(judge: "Judge | str | None", reward: str) -> Judge:
    """The judge of a judged reward; a missing one is an error, never a silent fallback.

    Args:
        judge: a :class:`Judge`, a spec for :func:`make_judge`, or None.
        reward: the reward's name, for the message.

    Raises:
        ConfigError: ``judge`` is None (the message names how to give one), or a bad spec.
    """
    if judge is None:
        raise ConfigError(
            f"reward {reward!r} is scored by an LLM judge and none was given: pass judge='openai:MODEL@BASE_URL' "
            "(CLI: --judge openai:MODEL@BASE_URL; a vLLM server of any instruct model works). "
            "'hf:smollm2' also runs, but it is not a valid judge (its scores are flagged)."
        )
    return make_judge(judge)
