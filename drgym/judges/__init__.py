"""LLM judges: one :class:`Judge` interface (messages in, pydantic verdict out), an
OpenAI-compatible backend, a local transformers backend, and a SQLite verdict cache.

Build one from a spec with :func:`make_judge` (``"hf:smollm2"``,
``"openai:MODEL@BASE_URL"``). ``drgym evaluate`` scores with them in :mod:`drgym.evaluation.judged`.
"""

from drgym.judges.base import Judge, JudgeRequest, JudgeResult, PromptTemplate
from drgym.judges.cache import VerdictCache
from drgym.judges.factory import make_judge

__all__ = ["Judge", "JudgeRequest", "JudgeResult", "PromptTemplate", "VerdictCache", "make_judge"]
