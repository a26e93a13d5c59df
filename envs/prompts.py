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

import re
from typing import Any

from drgym.envs.text import count_tokens, truncate_tokens
from drgym.envs.tools import DEFAULT_TOOLS, Tool, tool_schemas

from drgym.records import Task

TOOLS: list[dict[str, Any]] = tool_schemas(DEFAULT_TOOLS)

_INTRO = {
    "qa": "You answer questions using a search engine.",
    "research": "You are a research assistant who writes well-sourced reports.",
}
_THINK = "Think step by step inside <think> and </think> if you need to."
_CITE = ("Support each claim with an inline citation right after it: the source number in brackets, like [3], or "
         "the URL itself. Cite only sources you were shown. A report whose sources appear only in a bibliography at "
         "the end, with no inline citations, is accepted but scores 0 on citation quality.")
_WRITE_CALL = 'Write each call as <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>.'


def _join(items: list[str], last: str) -> str:
    """``a``, ``a<last>b``, ``a, b<last>c`` (``last`` is ``" and "`` or ``", and "``)."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + last + items[-1]


def system_prompt(kind: str, protocol: str, tools: tuple[Tool, ...] | list[Tool] = DEFAULT_TOOLS) -> str:
    """The default system prompt for ``kind`` (``"qa"``/``"research"``), ``protocol`` and ``tools``.

    Made from each tool's own text (:meth:`drgym.envs.tools.Tool.prompt`): the tools that
    act (search, fetch...) in order, a line saying they may be used several times, then
    the terminal tool (answer). For the default tools this is the Search-R1 instruction
    (tags) and its function-calling counterpart (json) that drgym's models were trained on.

    >>> system_prompt("qa", "tags").startswith("You answer questions using a search engine. Think step by step")
    True
    """
    acting = [t for t in tools if not t.terminal]
    final = [t for t in tools if t.terminal]
    if protocol == "tags":
        verbs = _join([t.verb or t.name for t in acting], " and ")
        parts = [_INTRO[kind if kind == "research" else "qa"]]
        if kind != "research":
            parts.append(_THINK)
        parts += [t.prompt(kind, "tags") for t in acting]
        if kind == "research":
            parts.append(f"{verbs[:1].upper()}{verbs[1:]} as often as you need, one action per turn.")
        else:
            parts.append(f"You may {verbs} several times, one action per turn.")
        parts += [t.prompt(kind, "tags") for t in final]
        if kind == "research":
            parts.append(_CITE)
        return " ".join(p for p in parts if p)
    phrases = [t.prompt(kind, "json") for t in acting]
    if kind == "research":
        parts = [_INTRO["research"], f"Call {_join(phrases, ' and ')}.", *[t.prompt(kind, "json") for t in final], _CITE]
    else:
        parts = [_INTRO["qa"], f"Call the tool {_join(phrases, ', and ')}.", "You may call tools several times.",
                 *[t.prompt(kind, "json") for t in final]]
    return " ".join([*parts, _WRITE_CALL])


QA_SYSTEM_TAGS = system_prompt("qa", "tags")
QA_SYSTEM_JSON = system_prompt("qa", "json")
RESEARCH_SYSTEM_TAGS = system_prompt("research", "tags")
RESEARCH_SYSTEM_JSON = system_prompt("research", "json")
"""The default system prompts of the default tools."""


def user_prompt(task: Task) -> str:
    """The user turn that poses ``task`` (``Question: ...`` or ``Research task: ...``)."""
    if task.kind == "research":
        return f"Research task: {task.question}"
    return f"Question: {task.question}"


def build_messages(task: Task, *, protocol: str = "tags", system: str | None = None,
                   tools: tuple[Tool, ...] | list[Tool] = DEFAULT_TOOLS) -> list[dict[str, Any]]:
    """The opening chat messages for ``task``: system prompt, then the user turn.

    Args:
        task: the task to pose.
        protocol: ``"tags"`` or ``"json"`` (the default system prompt differs).
        system: a system prompt replacing the default.
        tools: the tools the default system prompt describes.

    Returns:
        ``[{"role": "system", ...}, {"role": "user", ...}]``.
    """
    return [
        {"role": "system", "content": system if system is not None else system_prompt(task.kind, protocol, tools)},
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


def tool_response_block(content: str) -> str:
    """One JSON-protocol tool result as it continues an assistant turn, in the Hermes /
    Qwen ``<tool_response>`` form: what a JSON turn's observation is made of, and how
    ``hf:`` policies with the continuation layout and GRPO rollouts lay tool messages out.

    >>> tool_response_block("Doc 1 (Title: Lyon, URL: u) Lyon is a city.")
    '\\n<tool_response>\\nDoc 1 (Title: Lyon, URL: u) Lyon is a city.\\n</tool_response>\\n'
    """
    return f"\n<tool_response>\n{content}\n</tool_response>\n"


def tags_observation(body: str) -> str:
    """Wrap a result or error text as the Search-R1 ``<information>`` block."""
    return f"\n\n<information>{body}</information>\n\n"


_SHOWN = re.compile(r"<information>(.*?)</information>|<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


def shown_text(observation: str) -> str:
    """What an observation shows of its tool results: the bodies of its ``<information>``
    (tags) or ``<tool_response>`` (JSON) blocks, joined by new lines; ``""`` when it has none.

    The text "did the agent see the gold" is asked of (the answerable filter, question
    synthesis, gold-in-view statistics).

    >>> shown_text("ok" + tags_observation("Doc 1 (Title: Lyon, URL: u) Lyon is a city."))
    'Doc 1 (Title: Lyon, URL: u) Lyon is a city.'
    """
    return "\n".join(a or b for a, b in _SHOWN.findall(observation))


def corrective_message(error: str, protocol: str, tools: tuple[Tool, ...] | list[Tool] = DEFAULT_TOOLS) -> str:
    """The text shown after an invalid action: Search-R1's fixed correction (tags),
    extended with the reason, and one sentence per tool (:attr:`drgym.envs.tools.Tool.correction`);
    for JSON, the tools' signatures.

    >>> corrective_message("no action found.", "json")[:80]
    'Your previous turn was not a valid tool call: no action found. Call one of the to'
    """
    tools = [t for t in tools if not t.terminal] + [t for t in tools if t.terminal]
    if protocol == "tags":
        return " ".join(["My previous action is invalid:", error, *[t.corrective() for t in tools], "Let me try again."])
    sigs = [t.signature() for t in tools]
    listed = sigs[0] if len(sigs) == 1 else ", ".join(sigs[:-1]) + " or " + sigs[-1]
    return (f"Your previous turn was not a valid tool call: {error} Call one of the tools {listed} inside "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
