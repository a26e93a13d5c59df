"""``rag:LLM``: the retrieve-then-read lower bound; ``rtr:AGENT``: the same with the agent as reader.

One search with the question itself, then a reader LLM answers from the top-k passages
in one generation: the "RAG" / naive retrieval baseline of the short-answer tables of
Search-R1 (Jin et al. 2025, arXiv 2503.09516, section 4.2, "RAG") and DeepResearchGym's
case study (arXiv 2505.19253). It never searches twice and never fetches.
"""

from __future__ import annotations

import re
from typing import Any

from drgym.envs.tools import DEFAULT_TOOLS, AnswerTool, SearchTool
from drgym.errors import ConfigError
from drgym.policies.base import Conversation, Policy
from drgym.policies.generation import TokenUsage

READER_SYSTEM = (
    "Answer the question using the passages. Reply with the answer only: a few words, "
    "no explanation, no full sentence."
)

_PREFIX = re.compile(
    r"^\s*(?:(?:so|thus|therefore|hence),?\s+)?(?:the\s+)?(?:final\s+|short\s+|correct\s+)?answer"
    r"(?:\s+(?:to|for)\s+(?:this|the)\s+question)?(?:\s+is)?\s*[:\-]?\s*",
    re.IGNORECASE,
)
_SEARCH, _ANSWER = SearchTool(), AnswerTool()
_TAG = re.compile(r"</?(?:" + "|".join([*(re.escape(t.name) for t in DEFAULT_TOOLS), "think", "information"]) + r")>",
                  re.IGNORECASE)
_INFO = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def clean_answer(text: str, max_words: int = 20) -> str:
    """Reduce a reader's reply to a short answer span.

    Removes tags, keeps the first non-empty line, strips a leading "The answer (to this
    question) is:" and trailing punctuation, and caps the length at ``max_words``. Without
    this clean-up SmolLM2's rag EM drops from 0.025 to 0.0 on 40 questions).

    Args:
        text: the raw reply.
        max_words: longest answer kept, in whitespace words.

    Returns:
        The answer text ('' when nothing is left).
    """
    text = _TAG.sub(" ", text or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    ans = _PREFIX.sub("", lines[0]).strip()
    ans = ans.strip(" \"'`*").rstrip(".!;,").strip()
    return " ".join(ans.split()[:max_words])


def _words(text: str, n: int) -> str:
    w = text.split()
    return " ".join(w[:n]) + (" ..." if len(w) > n else "")


class RagPolicy(Policy):
    """Retrieve-then-read (see the module docstring).

    Turn 1 returns ``<search> {question} </search>``. Turn 2 reads the top ``k`` results
    of that search (from ``info["results"]``, else parsed from the ``<information>``
    block), asks the reader for a short answer, cleans it with :func:`clean_answer` and
    returns ``<answer> ... </answer>``.

    Args:
        reader: the reader :class:`Policy` (its ``act`` is called on a two-message
            reader conversation; its stop strings should not include newline-free tags
            only; :func:`drgym.policies.factory.make_policy` builds it with
            ``max_new_tokens=24`` and no tag stops).
        k: passages shown to the reader (>= 1).
        words: words kept per passage (>= 1).
        reader_spec: the spec the reader came from, for the run config.

    Attributes:
        last_usage: reader token counts per conversation of the latest call (zero for
            search turns, which need no generation).
    """

    def __init__(self, reader: Policy, *, k: int = 3, words: int = 50, reader_spec: str = "") -> None:
        if int(k) < 1 or int(words) < 1:
            raise ConfigError(f"rag needs k >= 1 and words >= 1, got k={k}, words={words}.")
        self.reader = reader
        self.k = int(k)
        self.words = int(words)
        self.reader_spec = reader_spec or getattr(reader, "name", "")
        self.name = f"rag:{self.reader_spec}"
        self.last_usage: list[TokenUsage] = []

    def describe(self) -> dict[str, Any]:
        """Settings recorded in run configs."""
        inner = self.reader.describe() if hasattr(self.reader, "describe") else {"name": self.reader.name}
        return {"kind": "rag", "k": self.k, "words": self.words, "reader": inner}

    @staticmethod
    def question_of(conversation: Conversation, info: dict[str, Any] | None) -> str:
        """The question: ``info["question"]``, else the first user turn minus ``Question:``."""
        if info and info.get("question"):
            return str(info["question"])
        for m in conversation:
            if m.get("role") == "user":
                return re.sub(r"^\s*Question:\s*", "", str(m.get("content") or "")).strip()
        return ""

    def passages_of(self, conversation: Conversation, info: dict[str, Any] | None) -> list[tuple[str, str]]:
        """``(title, text)`` of the retrieved passages shown to the reader (at most k)."""
        if info and info.get("results"):
            return [(str(r.get("title") or ""), str(r.get("text") or "")) for r in info["results"][: self.k]]
        for m in reversed(conversation):
            if m.get("role") in ("user", "tool"):
                hit = _INFO.search(str(m.get("content") or ""))
                if hit:
                    docs = re.split(r"\n(?=Doc \d+)", hit.group(1).strip())
                    return [("", d) for d in docs[: self.k]]
        return []

    def reader_conversation(self, question: str, passages: list[tuple[str, str]]) -> Conversation:
        """The reader's chat: system instruction, then passages and the question."""
        docs = "\n".join(f"Doc {i + 1} (Title: {t}) {_words(x, self.words)}" if t else f"Doc {i + 1} {_words(x, self.words)}"
                         for i, (t, x) in enumerate(passages))
        return [
            {"role": "system", "content": READER_SYSTEM},
            {"role": "user", "content": f"Passages:\n{docs}\n\nQuestion: {question}\nAnswer:"},
        ]

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """Search on the first turn, answer from the passages on the next."""
        infos = infos or [{} for _ in conversations]
        out: list[str | None] = [None] * len(conversations)
        to_read: list[tuple[int, Conversation]] = []
        for i, (conv, info) in enumerate(zip(conversations, infos)):
            question = self.question_of(conv, info)
            searched = any(m.get("role") == "assistant" for m in conv)
            if not searched:
                out[i] = _SEARCH.render(" ".join(question.split()))
            else:
                to_read.append((i, self.reader_conversation(question, self.passages_of(conv, info))))
        usage = [TokenUsage(finish="search") for _ in conversations]
        if to_read:
            replies = self.reader.act([c for _, c in to_read])
            reader_usage = getattr(self.reader, "last_usage", None) or [TokenUsage() for _ in to_read]
            for (i, _), reply, u in zip(to_read, replies, reader_usage):
                ans = clean_answer(reply)
                out[i] = _ANSWER.render(ans or "unknown")
                usage[i] = u
        self.last_usage = usage
        return [o or "" for o in out]

    def close(self) -> None:
        """Close the reader."""
        self.reader.close()


class SearchFirstPolicy(Policy):
    """``rtr:AGENT``: retrieve-then-read in which the agent itself reads.

    Turn 1 is ``<search> {question} </search>`` (as :class:`RagPolicy`); every later turn
    is the agent's own (``AGENT`` is any LM spec, e.g. ``hf:smollm2-drgym``), in its own
    conversation format, with the observation of that search in view. Compared with the
    agent run alone, it measures what the agent's own first query adds; compared with
    ``rag:LLM``, what the agent's reading (and answer length) adds. The agent may still
    search again where the env allows; the run's ``searches`` metric shows how often.

    Args:
        agent: the agent :class:`Policy`.
        agent_spec: the spec it came from, for the run config.
    """

    def __init__(self, agent: Policy, *, agent_spec: str = "") -> None:
        self.agent = agent
        self.agent_spec = agent_spec or getattr(agent, "name", "")
        self.name = f"rtr:{self.agent_spec}"
        self.last_usage: list[TokenUsage] = []

    def describe(self) -> dict[str, Any]:
        """Settings recorded in run configs."""
        inner = self.agent.describe() if hasattr(self.agent, "describe") else {"name": self.agent.name}
        return {"kind": "rtr", "agent": inner}

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """The question as the first search; the agent's own turns after it."""
        infos = infos or [{} for _ in conversations]
        out: list[str | None] = [None] * len(conversations)
        rest = []
        for i, (conv, info) in enumerate(zip(conversations, infos)):
            if not any(m.get("role") == "assistant" for m in conv):
                out[i] = _SEARCH.render(" ".join(RagPolicy.question_of(conv, info).split()))
            else:
                rest.append(i)
        usage = [TokenUsage(finish="search") for _ in conversations]
        if rest:
            replies = self.agent.act([conversations[i] for i in rest], [infos[i] for i in rest])
            agent_usage = getattr(self.agent, "last_usage", None) or [TokenUsage() for _ in rest]
            for i, reply, u in zip(rest, replies, agent_usage):
                out[i] = reply
                usage[i] = u
        self.last_usage = usage
        return [o or "" for o in out]

    def close(self) -> None:
        """Close the agent."""
        self.agent.close()
