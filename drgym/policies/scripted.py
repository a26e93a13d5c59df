"""A deterministic scripted policy: search the question, fetch the top hit, answer a span of it.

It needs no model, so it exercises every path of the environments (search, fetch,
answer, rewards, trajectories) in tests and benchmarks, and gives a floor that trained
agents should beat.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from drgym.envs.tools import DEFAULT_TOOLS, Tool
from drgym.policies.base import Conversation, Policy

_WORD_RE = re.compile(r"[A-Za-z0-9][\w'’.-]*|\S")
_CONNECTORS = {"of", "the", "de", "von", "van", "and", "&", "la", "le", "du", "del", "da", "der"}
_STOP_CAPS = {"The", "A", "An", "In", "On", "At", "It", "He", "She", "They", "His", "Her", "This", "That", "These",
              "Those", "As", "By", "For", "From", "With", "After", "Before", "During", "When", "While", "Its", "Their"}


def _norm_tokens(text: str) -> set[str]:
    return {t.lower().strip(".,'’") for t in re.findall(r"\w[\w'’.-]*", text)}


def answer_span(text: str, question: str, title: str = "") -> str:
    """The span the scripted policy answers with: a deterministic extractive heuristic.

    Scans ``text`` left to right for candidate spans: a maximal run of capitalised words
    (joined across ``of``/``the``/``de``/``and``... when a capitalised word follows) or a
    number (a 3-4 digit year or other digits). Sentence-initial function words (``The``,
    ``In``...) do not start a span. The first candidate with a word not in the question
    (case-insensitive) is returned; if none, ``title``; if no title, the first 5 words.

    Args:
        text: the fetched document (or passage) text.
        question: the question (its words are excluded).
        title: fallback answer.

    Returns:
        The span, stripped of trailing punctuation.
    """
    qwords = _norm_tokens(question) | _norm_tokens(title)
    toks = _WORD_RE.findall(text)
    i = 0
    while i < len(toks):
        t = toks[i]
        if t[:1].isupper() and t[:1].isalpha() and t not in _STOP_CAPS:
            j = i + 1
            span = [t]
            while j < len(toks):
                nxt = toks[j]
                if span[-1].endswith(".") and len(span[-1]) > 3:
                    break  # a sentence ended inside the run ("... Williams. It")
                if nxt[:1].isupper() and nxt[:1].isalpha():
                    span.append(nxt)
                    j += 1
                elif nxt.lower() in _CONNECTORS and j + 1 < len(toks) and toks[j + 1][:1].isupper():
                    span.extend([nxt, toks[j + 1]])
                    j += 2
                else:
                    break
            words = {w.lower().strip(".,'’") for w in span}
            if words - qwords - _CONNECTORS:
                return " ".join(span).rstrip(".,;:")
            i = j
            continue
        if t[:1].isdigit():
            if t.lower().strip(".,") not in qwords:
                return t.rstrip(".,;:")
        i += 1
    if title:
        return title
    return " ".join(text.split()[:5])


class ScriptedPolicy(Policy):
    """Search the question, fetch the top hit, answer with :func:`answer_span` of it.

    Turn 1: search the question verbatim. Turn 2: fetch the URL of the top result.
    Turn 3: answer with a span of the fetched document. If a step returned nothing (no
    hits, fetch failed), it answers from what it has (the top passage, else the empty
    span "unknown"). Reads the env ``info`` dicts (``turn``, ``question``, ``results``,
    ``episode_id``), so ``infos`` must be passed to :meth:`act`.

    Args:
        protocol: how actions are written: ``"tags"`` (``<search>...</search>``),
            ``"json"`` (``<tool_call>{...}</tool_call>``) or ``"openai"`` (the JSON of an
            assistant message with ``tool_calls``).
        fetch: False skips the fetch and answers from the top passage.
        tools: the env's tools; the calls are written by their own
            :meth:`~drgym.envs.tools.Tool.render` (it needs ``search``, ``answer`` and,
            with ``fetch``, ``fetch``).

    Raises:
        ValueError: unknown protocol, a needed tool missing from ``tools``, or ``act``
            called without ``infos``.
    """

    name = "scripted"

    def __init__(self, protocol: str = "tags", fetch: bool = True, tools: Sequence[Tool] = DEFAULT_TOOLS) -> None:
        if protocol not in ("tags", "json", "openai"):
            raise ValueError(f"protocol must be 'tags', 'json' or 'openai', got {protocol!r}.")
        self.tools = {t.name: t for t in tools}
        missing = [n for n in ("search", "answer", *(("fetch",) if fetch else ())) if n not in self.tools]
        if missing:
            raise ValueError(f"the scripted policy needs the tools {missing}; got {sorted(self.tools)}.")
        self.protocol = protocol
        self.fetch = fetch
        self._top: dict[str, dict[str, Any]] = {}

    def _call(self, name: str, value: str, n: int) -> str:
        return self.tools[name].render(value, self.protocol, call_id=f"call_{n}")

    def act_one(self, info: dict[str, Any]) -> str:
        """The action for one episode given its latest ``info``."""
        turn = int(info.get("turn", 0))
        ep = str(info.get("episode_id", ""))
        results = info.get("results") or []
        if turn == 0:
            self._top.pop(ep, None)
            return self._call("search", str(info["question"]), turn)
        if turn == 1 and results:
            self._top[ep] = results[0]
            if self.fetch and info.get("fetches_left", 1) > 0 and info.get("turns_left", 2) > 1:
                return self._call("fetch", str(results[0]["url"]), turn)
        doc = results[0] if results else self._top.get(ep)
        self._top.pop(ep, None)
        span = answer_span(doc.get("text", ""), str(info.get("question", "")), doc.get("title", "")) if doc else "unknown"
        return self._call("answer", span, turn)

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """One action per conversation (see the class docstring)."""
        if infos is None:
            raise ValueError("ScriptedPolicy needs the env infos: call act(conversations, infos).")
        return [self.act_one(info) for info in infos]
