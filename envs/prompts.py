"""Prompts and tool-result formatting for the search environments.

Two protocols (see :mod:`drgym.envs.parsing`):

- ``"tags"``: the Search-R1 protocol (Jin et al. 2025, "Search-R1", §3.1 and Table 1).
  The system prompt explains ``<search>``, ``<fetch>``, ``<answer>`` and the
  ``<information>`` blocks; results come back as ``\\n\\n<information>Doc 1 (Title: T,
  URL: u) text ...</information>\\n\\n``, appended as a ``user`` message.
- ``"json"``: Qwen / Hermes function calling. The tools are :data:`TOOLS` (the OpenAI
  function schemas of :data:`drgym.envs.tools.DEFAULT_TOOLS`, also what chat templates take as ``tools=``); each result is a
  ``{"role": "tool", "tool_call_id": ..., "name": ..., "content": ...}`` message.

For the research env, results are numbered globally (``[3] (Title: ..., URL: ...)``) so
a report can cite ``[3]``; see :mod:`drgym.envs.deepresearch`.
"""

from __future__ import annotations

from typing import Any

from drgym.envs.text import count_tokens, truncate_tokens
from drgym.envs.tools import DEFAULT_TOOLS, tool_schemas

from drgym.records import Task

TOOLS: list[dict[str, Any]] = tool_schemas(DEFAULT_TOOLS)

QA_SYSTEM_TAGS = (
    "You answer questions using a search engine. Think step by step inside <think> and </think> if you need to. "
    "To search, write a query between <search> and </search>; the results come back between <information> and "
    "</information>, each as Doc n (Title: ..., URL: ...). To read a whole document, write its URL between "
    "<fetch> and </fetch>. You may search and fetch several times, one action per turn. When you know the "
    "answer, write it between <answer> and </answer>, as a short phrase without explanation, for example "
    "<answer> Beijing </answer>."
)

QA_SYSTEM_JSON = (
    "You answer questions using a search engine. Call the tool `search` with a query to get passages with "
    "their titles and URLs, and `fetch` with a URL to read a whole document. You may call tools several "
    "times. When you know the answer, call `answer` with a short phrase without explanation. Write each call as "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>.'
)

RESEARCH_SYSTEM_TAGS = (
    "You are a research assistant who writes well-sourced reports. To search, write a query between "
    "<search> and </search>; results come back between <information> and </information>, each numbered as "
    "[n] (Title: ..., URL: ...). To read a whole source, write its URL between <fetch> and </fetch>. Search "
    "and fetch as often as you need, one action per turn. Finish with the full report between <answer> and "
    "</answer>. Support each claim with an inline citation right after it: the source number in brackets, "
    "like [3], or the URL itself. Cite only sources you were shown. A report whose sources appear only in a "
    "bibliography at the end, with no inline citations, is accepted but scores 0 on citation quality."
)

RESEARCH_SYSTEM_JSON = (
    "You are a research assistant who writes well-sourced reports. Call `search` with a query to get "
    "numbered sources ([n] (Title: ..., URL: ...)) and `fetch` with a URL to read a whole source. When done, "
    "call `answer` with the full report. Support each claim with an inline citation right after it: the "
    "source number in brackets, like [3], or the URL itself. Cite only sources you were shown. A report "
    "whose sources appear only in a bibliography at the end, with no inline citations, is accepted but "
    "scores 0 on citation quality. Write each call as "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>.'
)


def system_prompt(kind: str, protocol: str) -> str:
    """The default system prompt for ``kind`` (``"qa"``/``"research"``) and ``protocol``."""
    if kind == "research":
        return RESEARCH_SYSTEM_TAGS if protocol == "tags" else RESEARCH_SYSTEM_JSON
    return QA_SYSTEM_TAGS if protocol == "tags" else QA_SYSTEM_JSON


def user_prompt(task: Task) -> str:
    """The user turn that poses ``task`` (``Question: ...`` or ``Research task: ...``)."""
    if task.kind == "research":
        return f"Research task: {task.question}"
    return f"Question: {task.question}"


def build_messages(task: Task, *, protocol: str = "tags", system: str | None = None) -> list[dict[str, Any]]:
    """The opening chat messages for ``task``: system prompt, then the user turn.

    Args:
        task: the task to pose.
        protocol: ``"tags"`` or ``"json"`` (the default system prompt differs).
        system: a system prompt replacing the default.

    Returns:
        ``[{"role": "system", ...}, {"role": "user", ...}]``.
    """
    return [
        {"role": "system", "content": system if system is not None else system_prompt(task.kind, protocol)},
        {"role": "user", "content": user_prompt(task)},
    ]


def render_messages(messages: list[dict[str, Any]]) -> str:
    """Plain-text rendering of opening messages (the reset observation): contents joined by blank lines."""
    return "\n\n".join(str(m.get("content") or "") for m in messages)


def format_docs(
    docs: list[dict[str, Any]],
    max_tokens: int,
    *,
    labels: list[str] | None = None,
) -> tuple[str, bool]:
    """Format retrieved passages or a fetched document, within a token budget.

    Each item reads ``Doc n (Title: T, URL: u) text`` (``labels`` replaces ``Doc n``,
    e.g. ``[3]`` in the research env). The budget (drgym tokens, see
    :mod:`drgym.envs.text`) is shared equally between the items, so every item stays
    visible; each text is cut to its share.

    Args:
        docs: dicts with ``title``, ``url``, ``text``.
        max_tokens: budget for the whole block.
        labels: one label per doc; default ``Doc 1``, ``Doc 2``...

    Returns:
        ``(text, truncated)``.
    """
    if not docs:
        return "No results.", False
    labels = labels or [f"Doc {i + 1}" for i in range(len(docs))]
    per_doc = max(1, max_tokens // len(docs))
    parts = []
    cut_any = False
    for label, d in zip(labels, docs):
        head = f"{label} (Title: {d.get('title', '')}, URL: {d.get('url', '')})"
        room = max(1, per_doc - count_tokens(head))
        body, cut = truncate_tokens(" ".join(str(d.get("text", "")).split()), room)
        cut_any |= cut
        parts.append(f"{head} {body}")
    return "\n".join(parts), cut_any


def tags_observation(body: str) -> str:
    """Wrap a result or error text as the Search-R1 ``<information>`` block."""
    return f"\n\n<information>{body}</information>\n\n"


CORRECTIVE = (
    "My previous action is invalid: {error} If I want to search, I should put the query between <search> and "
    "</search>. If I want to read a document, I should put its URL between <fetch> and </fetch>. If I want to "
    "give the final answer, I should put it between <answer> and </answer>. Let me try again."
)

CORRECTIVE_JSON = (
    "Your previous turn was not a valid tool call: {error} Call one of the tools search(query), fetch(url) "
    "or answer(answer) inside <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>."
)


def corrective_message(error: str, protocol: str) -> str:
    """The text shown after an invalid action (Search-R1's fixed correction, extended with the reason)."""
    if protocol == "tags":
        return CORRECTIVE.format(error=error)
    return CORRECTIVE_JSON.format(error=error)
