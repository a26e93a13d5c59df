"""LLM judges: one :class:`Judge` interface (messages in, pydantic verdict out), an
OpenAI-compatible backend, a local transformers backend, and a SQLite verdict cache.

Build one from a spec with :func:`make_judge` (``"hf:smollm2"``,
``"openai:MODEL@BASE_URL"``). ``drgym evaluate`` lives in :mod:`drgym.judges.cli`.
"""

from drgym.judges.base import Judge, JudgeRequest, JudgeResult, PromptTemplate, make_judge
from drgym.judges.cache import VerdictCache

__all__ = ["Judge", "JudgeRequest", "JudgeResult", "PromptTemplate", "VerdictCache", "make_judge"]
