"""The action parser: one assistant turn (text) in, the tool calls it makes out.

Three protocols are understood, and every one is parsed from the **completion only**
(never from the prompt, whose examples would otherwise be read as actions; the pitfall
of Search-R1's ``extract_solution``, ``verl/utils/reward_score/qa_em.py``):

``tags`` (Search-R1, Jin et al. 2025, §3.1)
    ``<search>query</search>``, ``<fetch>url</fetch>``, ``<answer>text</answer>``;
    ``<think>...</think>`` blocks are allowed and ignored. As in Search-R1's rollout loop
    (``LLMGenerationManager.postprocess_predictions``) only the **first** complete action
    tag counts; generation is normally stopped right after it.
``json`` (Qwen / Hermes chat templates)
    ``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>``, possibly
    several blocks (parallel calls). ``arguments`` may be an object or a JSON string.
``openai`` (OpenAI function calling)
    an assistant message ``{"content": ..., "tool_calls": [{"id": ..., "type":
    "function", "function": {"name": ..., "arguments": "<json>"}}]}``, given as a dict or
    as its JSON text. A message with no tool calls is the final answer (its ``content``,
    itself parsed for tags first).

Tool names and arguments: ``search`` (``query``: str, or ``queries``: list[str]),
``fetch`` (``url``), ``answer`` (``answer``; ``report`` / ``text`` accepted as aliases).

Anything else (empty, over-long, nested tags, unclosed tags, bad JSON, unknown tools,
two protocols in one turn) parses to a single ``ToolCall(name="invalid", error=...)``
whose error text is shown to the agent. The parser never raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from drgym.records import ToolCall

TOOL_NAMES = ("search", "fetch", "answer")
PROTOCOLS = ("tags", "json", "openai")

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_ACTION_OPEN_RE = re.compile(r"<(search|fetch|answer)>", re.IGNORECASE)
_ANY_TAG_RE = re.compile(r"</?(search|fetch|answer)>", re.IGNORECASE)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OTHER_TAG_RE = re.compile(r"<([A-Za-z_][\w-]*)>(.*?)</\1>", re.DOTALL)
_NOT_ACTIONS = {"think", "information", "tool_response", "result", "answer", "search", "fetch", "tool_call"}

_ARG_ALIASES = {
    "search": ("query", "queries", "q", "search_query"),
    "fetch": ("url", "doc_id", "link"),
    "answer": ("answer", "report", "text", "final_answer"),
}


@dataclass
class ParsedAction:
    """The result of :func:`parse_action`.

    Attributes:
        calls: the tool calls, in order; one ``invalid`` call when the action is bad.
        protocol: ``"tags"``, ``"json"``, ``"openai"``, or None when nothing parsed.
        message: the assistant chat message for the conversation (``{"role":
            "assistant", "content": str}`` plus ``tool_calls`` for JSON/OpenAI calls).
        raw: the action as text (a dict action is dumped as JSON).
    """

    calls: list[ToolCall]
    protocol: str | None
    message: dict[str, Any]
    raw: str
    notes: list[str] = field(default_factory=list)

    @property
    def invalid(self) -> bool:
        """True when the action is one ``invalid`` call."""
        return len(self.calls) == 1 and self.calls[0].name == "invalid"


def _invalid(error: str, protocol: str | None = None) -> ToolCall:
    return ToolCall(name="invalid", arguments={}, protocol=protocol or "tags", error=error)


def _normalise_call(name: Any, args: Any, protocol: str, call_id: str | None, allowed: tuple[str, ...]) -> list[ToolCall]:
    """Check one JSON/OpenAI call; return one call per query (``queries`` lists expand)."""
    if not isinstance(name, str) or not name.strip():
        return [ToolCall("invalid", {}, protocol, f"a tool call needs a string 'name', got {name!r}.", call_id)]
    name = name.strip().lower()
    if name not in allowed:
        return [ToolCall("invalid", {}, protocol, f"unknown tool {name!r}; the tools are {', '.join(allowed)}.", call_id)]
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return [ToolCall("invalid", {}, protocol, f"the arguments of {name!r} are not valid JSON ({e.msg}).", call_id)]
    if not isinstance(args, dict):
        return [ToolCall("invalid", {}, protocol, f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}.", call_id)]
    value = None
    for key in _ARG_ALIASES[name]:
        if key in args:
            value = args[key]
            break
    if value is None and len(args) == 1:  # a single argument under another name
        value = next(iter(args.values()))
    canonical = {"search": "query", "fetch": "url", "answer": "answer"}[name]
    values = value if (name == "search" and isinstance(value, list)) else [value]
    out = []
    for v in values:
        if not isinstance(v, str) or not v.strip():
            out.append(ToolCall("invalid", {}, protocol, f"{name!r} needs a non-empty string argument {canonical!r}, got {v!r}.", call_id))
        else:
            out.append(ToolCall(name, {canonical: v.strip()}, protocol, None, call_id))
    return out or [ToolCall("invalid", {}, protocol, f"{name!r} got an empty list of queries.", call_id)]


def _parse_tags(text: str, allowed: tuple[str, ...]) -> list[ToolCall]:
    m = _ACTION_OPEN_RE.search(text)
    if m is None:
        return [_invalid("no action found.")]
    name = m.group(1).lower()
    close = re.search(f"</{name}>", text[m.end():], re.IGNORECASE)
    if close is None:
        return [_invalid(f"<{name}> is not closed with </{name}>.")]
    content = text[m.end(): m.end() + close.start()]
    if _ANY_TAG_RE.search(content):
        return [_invalid(f"tags are nested inside <{name}>...</{name}>; write one action at a time.")]
    if name not in allowed:
        return [_invalid(f"<{name}> is not available here; the actions are {', '.join('<' + a + '>' for a in allowed)}.")]
    content = content.strip()
    if not content:
        what = {"search": "query", "fetch": "URL", "answer": "answer"}[name]
        return [_invalid(f"<{name}></{name}> is empty; put the {what} between the tags.")]
    key = {"search": "query", "fetch": "url", "answer": "answer"}[name]
    return [ToolCall(name, {key: content}, "tags")]


def _parse_tool_call_blocks(text: str, allowed: tuple[str, ...]) -> list[ToolCall]:
    blocks = _TOOL_CALL_RE.findall(text)
    opened = text.count("<tool_call>")
    if opened > len(blocks):
        return [_invalid("<tool_call> is not closed with </tool_call>.", "json")]
    calls: list[ToolCall] = []
    for i, block in enumerate(blocks):
        call_id = f"call_{i}"
        try:
            obj = json.loads(block.strip())
        except json.JSONDecodeError as e:
            calls.append(ToolCall("invalid", {}, "json", f"the <tool_call> body is not valid JSON ({e.msg} at char {e.pos}).", call_id))
            continue
        if not isinstance(obj, dict):
            calls.append(ToolCall("invalid", {}, "json", "the <tool_call> body must be a JSON object with 'name' and 'arguments'.", call_id))
            continue
        calls.extend(_normalise_call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})), "json", call_id, allowed))
    return calls


def _parse_openai(msg: dict[str, Any], allowed: tuple[str, ...]) -> tuple[list[ToolCall], dict[str, Any]]:
    content = msg.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    tool_calls = msg.get("tool_calls") or []
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if not isinstance(tool_calls, list):
        return [_invalid("'tool_calls' must be a list.", "openai")], message
    if not tool_calls:
        stripped = _THINK_RE.sub("", content)
        if _ACTION_OPEN_RE.search(stripped) or "<tool_call>" in stripped:
            calls, _ = _parse_text(content, allowed)
            return calls, message
        if not stripped.strip():
            return [_invalid("the message has neither tool calls nor content.", "openai")], message
        if "answer" not in allowed:
            return [_invalid("a message without tool calls is not an action here.", "openai")], message
        return [ToolCall("answer", {"answer": stripped.strip()}, "openai")], message
    calls: list[ToolCall] = []
    clean = []
    for i, tc in enumerate(tool_calls):
        if not isinstance(tc, dict):
            calls.append(ToolCall("invalid", {}, "openai", f"tool_calls[{i}] must be an object.", f"call_{i}"))
            continue
        call_id = str(tc.get("id") or f"call_{i}")
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        calls.extend(_normalise_call(fn.get("name"), fn.get("arguments", {}), "openai", call_id, allowed))
        clean.append({"id": call_id, "type": "function", "function": {"name": fn.get("name"), "arguments": fn.get("arguments", {})}})
    message["tool_calls"] = clean
    return calls, message


def _parse_text(text: str, allowed: tuple[str, ...]) -> tuple[list[ToolCall], str | None]:
    if "<think>" in text.lower() and "</think>" not in text.lower():
        return [_invalid("<think> is not closed with </think>.")], None
    body = _THINK_RE.sub("", text)
    has_tags = bool(_ACTION_OPEN_RE.search(body))
    has_json = "<tool_call>" in body
    if has_tags and has_json:
        # The one legal mix: JSON tool calls never appear *with* an answer tag in the same
        # turn, so this is always ambiguous.
        return [_invalid("the turn mixes <tool_call> JSON with <search>/<fetch>/<answer> tags; use one protocol per turn.")], None
    if has_json:
        return _parse_tool_call_blocks(body, allowed), "json"
    if has_tags:
        return _parse_tags(body, allowed), "tags"
    other = [t for t, _ in _OTHER_TAG_RE.findall(body) if t.lower() not in _NOT_ACTIONS]
    if other:
        return [_invalid(f"unknown action <{other[0]}>; the actions are {', '.join('<' + a + '>' for a in allowed)}.")], None
    if not body.strip():
        return [_invalid("the turn is empty." if not text.strip() else "the turn has only <think> and no action.")], None
    return [_invalid("no action found.")], None


def parse_action(
    action: str | dict[str, Any],
    *,
    allowed: tuple[str, ...] = TOOL_NAMES,
    protocols: tuple[str, ...] = PROTOCOLS,
    max_chars: int = 32_000,
) -> ParsedAction:
    """Parse one assistant turn into tool calls (see the module docstring).

    Args:
        action: the completion text, an OpenAI-style assistant message dict, or that
            message as JSON text.
        allowed: tool names the env offers.
        protocols: protocols the env accepts; a call in another one is invalid.
        max_chars: longer actions are rejected without parsing (characters).

    Returns:
        A :class:`ParsedAction`; never raises.
    """
    try:
        return _parse_action(action, allowed, protocols, max_chars)
    except Exception as e:  # a parser bug must not crash a rollout batch
        raw = action if isinstance(action, str) else repr(action)
        return ParsedAction([_invalid(f"the action could not be parsed ({type(e).__name__}).")], None,
                            {"role": "assistant", "content": str(raw)}, str(raw))


def _parse_action(action, allowed, protocols, max_chars) -> ParsedAction:
    if isinstance(action, dict):
        raw = json.dumps(action, ensure_ascii=False)
        msg_obj: dict[str, Any] | None = action
    elif isinstance(action, str):
        raw = action
        msg_obj = None
        s = action.strip()
        if s.startswith("{") and s.endswith("}") and '"tool_calls"' in s and len(action) <= max_chars:
            try:
                obj = json.loads(s)
                if isinstance(obj, dict) and "tool_calls" in obj:
                    msg_obj = obj
            except json.JSONDecodeError:
                pass
    else:
        raw = repr(action)
        return ParsedAction([_invalid(f"an action must be text, got {type(action).__name__}.")], None,
                            {"role": "assistant", "content": raw}, raw)

    if len(raw) > max_chars:
        return ParsedAction([_invalid(f"the turn is {len(raw)} characters long; the limit is {max_chars}.")], None,
                            {"role": "assistant", "content": raw[:max_chars]}, raw)

    if msg_obj is not None:
        calls, message = _parse_openai(msg_obj, allowed)
        protocol = "openai"
    else:
        calls, protocol = _parse_text(raw, allowed)
        message = {"role": "assistant", "content": raw}
        if protocol == "json" and any(c.name != "invalid" for c in calls):
            message["tool_calls"] = [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls if c.name != "invalid"
            ]
    if protocol is not None and protocol not in protocols:
        calls = [_invalid(f"the {protocol!r} protocol is not accepted here; use {', '.join(protocols)}.", protocol)]
    answers = [c for c in calls if c.name == "answer"]
    if answers and len(calls) > 1:
        calls = [ToolCall("invalid", {}, calls[0].protocol, "an answer must be the only call of its turn.", answers[0].call_id)]
    return ParsedAction(calls, protocol, message, raw)
