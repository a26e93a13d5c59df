"""The action parser: one assistant turn (text) in, the tool calls it makes out.

Three protocols are understood, and every one is parsed from the **completion only**
(never from the prompt, whose examples would otherwise be read as actions; the pitfall
of Search-R1's ``extract_solution``, ``verl/utils/reward_score/qa_em.py``):

Reasoning is never read as an action (every protocol; :mod:`drgym.reasoning`, the rule
the judges' verdict parser follows too): a ``<think>...</think>`` block, the text before
a ``</think>`` that has no opening tag (chat templates of DeepSeek-R1 distills and Qwen3
thinking releases open ``<think>`` in the prompt), and everything after a ``<think>`` that
is never closed (a turn cut while reasoning, which is then invalid). Tags inside reasoning
are rehearsals: they are not run, and nested ones do not make the turn invalid.

``tags`` (Search-R1, Jin et al. 2025, §3.1)
    ``<search>query</search>``, ``<fetch>url</fetch>``, ``<answer>text</answer>``. As in Search-R1's rollout loop
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

Tool names and arguments are the tools' own (:mod:`drgym.envs.tools`): by default
``search`` (``query``: str, or ``queries``: list[str]), ``fetch`` (``url``), ``answer``
(``answer``; ``report`` / ``text`` accepted as aliases); a tool with more arguments
(``find_in_page(url, text)``) needs each by its name.

The assistant message of a JSON or OpenAI turn (:attr:`ParsedAction.message`) follows
OpenAI's tool-call pairing rule by construction: its ``tool_calls`` declare every call the
env will answer, each under a unique id, with ``arguments`` as the JSON text of an object.
A ``queries`` list is one declared call (the env answers it with one tool message holding
every query's results); a ``<tool_call>`` block that is not a call (bad JSON, no name) is
not declared, and its error is reported inside a declared call's reply. See the README,
"Tool calls and OpenAI-compatible servers".

Anything else (empty, over-long, nested tags, unclosed tags, bad JSON, unknown tools,
two protocols in one turn) parses to a single ``ToolCall(name="invalid", error=...)``
whose error text is shown to the agent. Malformed input never raises; a bug in the
parser does (it is not turned into the agent's "invalid action").

:class:`Parser` bundles :func:`parse_action` (one turn) with
:meth:`Parser.parse_answer` (the final answer of a whole completion); every answer drgym
scores is read through it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from drgym.envs.tools import DEFAULT_TOOLS, Tool
from drgym.reasoning import split_reasoning, strip_reasoning
from drgym.records import ToolCall

TOOL_NAMES = tuple(t.name for t in DEFAULT_TOOLS)
PROTOCOLS = ("tags", "json", "openai")
_DEFAULT_BY_NAME: dict[str, Tool] = {t.name: t for t in DEFAULT_TOOLS}

_ANY_TAG_RE = re.compile(r"</?(search|fetch|answer)>", re.IGNORECASE)  # the default tools (parse_answer)
_ANSWER_BLOCK_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OTHER_TAG_RE = re.compile(r"<([A-Za-z_][\w-]*)>(.*?)</\1>", re.DOTALL)
_NOT_ACTIONS = {"think", "information", "tool_response", "result", "tool_call"}


class _Tools:
    """The tools a parse knows (every tool, for messages) and allows (``allowed`` names)."""

    def __init__(self, tools: dict[str, Tool], allowed: tuple[str, ...]) -> None:
        self.by_name = tools
        self.allowed = tuple(allowed)
        names = "|".join(re.escape(n) for n in tools)
        self.open_re = re.compile(f"<({names})>", re.IGNORECASE)
        self.any_re = re.compile(f"</?({names})>", re.IGNORECASE)


def _registry(tools: Any, allowed: tuple[str, ...]) -> _Tools:
    by_name = dict(_DEFAULT_BY_NAME)
    for t in tools or ():
        by_name[t.name] = t
    return _Tools(by_name, allowed)


@dataclass
class ParsedAction:
    """The result of :func:`parse_action`.

    Attributes:
        calls: the tool calls, in order; one ``invalid`` call when the action is bad.
        protocol: ``"tags"``, ``"json"``, ``"openai"``, or None when nothing parsed.
        message: the assistant chat message for the conversation (``{"role":
            "assistant", "content": str}`` plus, for JSON/OpenAI turns with at least one
            call, ``tool_calls``: ``[{"id", "type": "function", "function": {"name",
            "arguments": str}}]``, ids unique; each call's ``call_id`` is one of them, or
            None for an error that belongs to no declared call).
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


def _normalise_call(name: Any, args: Any, protocol: str, call_id: str | None, reg: _Tools) -> list[ToolCall]:
    """Check one JSON/OpenAI call; return one call per query (``queries`` lists expand)."""
    if not isinstance(name, str) or not name.strip():
        return [ToolCall("invalid", {}, protocol, f"a tool call needs a string 'name', got {name!r}.", call_id)]
    name = name.strip().lower()
    if name not in reg.allowed:
        return [ToolCall("invalid", {}, protocol, f"unknown tool {name!r}; the tools are {', '.join(reg.allowed)}.", call_id)]
    tool = reg.by_name[name]
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return [ToolCall("invalid", {}, protocol, f"the arguments of {name!r} are not valid JSON ({e.msg}).", call_id)]
    if not isinstance(args, dict):
        return [ToolCall("invalid", {}, protocol, f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}.", call_id)]
    value = None
    for key in tool.aliases or (tool.argument,):
        if key in args:
            value = args[key]
            break
    if value is None and len(args) == 1 and not tool.more_arguments:  # a single argument under another name
        value = next(iter(args.values()))
    canonical = tool.argument
    if tool.more_arguments:  # every argument is required, by its own name (the first also by an alias)
        given = {canonical: value, **{n: args.get(n) for n, _ in tool.more_arguments}}
        bad = [n for n, v in given.items() if not isinstance(v, str) or not v.strip()]
        if bad:
            return [ToolCall("invalid", {}, protocol, f"{name!r} needs a non-empty string argument {bad[0]!r}, "
                                                      f"got {given[bad[0]]!r}; its arguments are {', '.join(tool.argument_names)}.", call_id)]
        return [ToolCall(name, {n: v.strip() for n, v in given.items()}, protocol, None, call_id)]
    values = value if (name == "search" and isinstance(value, list)) else [value]
    out = []
    for v in values:
        if not isinstance(v, str) or not v.strip():
            out.append(ToolCall("invalid", {}, protocol, f"{name!r} needs a non-empty string argument {canonical!r}, got {v!r}.", call_id))
        else:
            out.append(ToolCall(name, {canonical: v.strip()}, protocol, None, call_id))
    return out or [ToolCall("invalid", {}, protocol, f"{name!r} got an empty list of queries.", call_id)]


def _parse_tags(text: str, reg: _Tools) -> list[ToolCall]:
    allowed = reg.allowed
    m = reg.open_re.search(text)
    if m is None:
        return [_invalid("no action found.")]
    name = m.group(1).lower()
    close = re.search(f"</{name}>", text[m.end():], re.IGNORECASE)
    if close is None:
        return [_invalid(f"<{name}> is not closed with </{name}>.")]
    content = text[m.end(): m.end() + close.start()]
    if reg.any_re.search(content):
        return [_invalid(f"tags are nested inside <{name}>...</{name}>; write one action at a time.")]
    if name not in allowed:
        return [_invalid(f"<{name}> is not available here; the actions are {', '.join('<' + a + '>' for a in allowed)}.")]
    content = content.strip()
    tool = reg.by_name[name]
    if not content:
        return [_invalid(f"<{name}></{name}> is empty; put the {tool.what or tool.argument} between the tags.")]
    arguments = tool.tag_arguments(content)
    if isinstance(arguments, str):
        return [_invalid(arguments)]
    return [ToolCall(name, arguments, "tags")]


def arguments_json(args: Any) -> str:
    """A call's arguments as the OpenAI wire format wants them: the JSON text of an object.

    A dict is dumped; a string that decodes to an object is kept as written; anything
    else (malformed JSON, a list, a number) becomes ``"{}"``, since servers decode the
    arguments of every assistant call they are sent (vLLM renders them through the chat
    template) and answer 400 on text that is not a JSON object. The call's reply says
    what was wrong with the original.
    """
    if isinstance(args, dict):
        return json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        try:
            return args if isinstance(json.loads(args), dict) else "{}"
        except json.JSONDecodeError:
            return "{}"
    return "{}"


def _declare(call_id: str, name: Any, args: Any) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls`` (OpenAI format, string arguments)."""
    name = name.strip() if isinstance(name, str) and name.strip() else "invalid"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json(args)}}


def _parse_tool_call_blocks(text: str, reg: _Tools) -> tuple[list[ToolCall], list[dict[str, Any]]]:
    """Calls of the ``<tool_call>`` blocks and the ``tool_calls`` they declare.

    A block that decodes to an object with a string ``name`` is a call: it is declared
    (id ``call_<i>``, ``i`` its position among the blocks) whatever its tool and
    arguments, and everything it expands to carries that id (a ``queries`` list is one
    declared call). A block that is not a call (bad JSON, not an object, no name) is not
    declared; its ``invalid`` call has no id, and the env reports it inside a declared
    call's reply (:meth:`drgym.envs.core.SearchAgentEnv._observe`).
    """
    blocks = _TOOL_CALL_RE.findall(text)
    opened = text.count("<tool_call>")
    if opened > len(blocks):
        return [_invalid("<tool_call> is not closed with </tool_call>.", "json")], []
    calls: list[ToolCall] = []
    declared: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        call_id = f"call_{i}"
        where = f"<tool_call> block {i + 1} of {len(blocks)}: " if len(blocks) > 1 else ""
        try:
            obj = json.loads(block.strip())
        except json.JSONDecodeError as e:
            calls.append(_invalid(f"{where}the <tool_call> body is not valid JSON ({e.msg} at char {e.pos}).", "json"))
            continue
        if not isinstance(obj, dict):
            calls.append(_invalid(f"{where}the <tool_call> body must be a JSON object with 'name' and 'arguments'.", "json"))
            continue
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            calls.append(_invalid(f"{where}a tool call needs a string 'name', got {name!r}.", "json"))
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        declared.append(_declare(call_id, name, args))
        calls.extend(_normalise_call(name, args, "json", call_id, reg))
    return calls, declared


def _parse_openai(msg: dict[str, Any], reg: _Tools) -> tuple[list[ToolCall], dict[str, Any]]:
    allowed = reg.allowed
    content = msg.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    tool_calls = msg.get("tool_calls") or []
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if not isinstance(tool_calls, list):
        return [_invalid("'tool_calls' must be a list.", "openai")], message
    if not tool_calls:
        stripped, unclosed = split_reasoning(content)
        if reg.open_re.search(stripped) or "<tool_call>" in stripped:
            calls, _, declared = _parse_text(content, reg)
            if declared:
                message["tool_calls"] = declared
            return calls, message
        if not stripped.strip():
            error = _UNCLOSED if unclosed else "the message has neither tool calls nor content."
            return [_invalid(error, "openai")], message
        if "answer" not in allowed:
            return [_invalid("a message without tool calls is not an action here.", "openai")], message
        return [ToolCall("answer", {"answer": stripped.strip()}, "openai")], message
    calls: list[ToolCall] = []
    declared: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tc in enumerate(tool_calls):
        if not isinstance(tc, dict):
            calls.append(_invalid(f"tool_calls[{i}] must be an object.", "openai"))
            continue
        # ids must be unique in the message: a missing or repeated one gets a fresh id, and
        # the message sent back declares the calls under the ids their replies answer
        call_id = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else f"call_{i}"
        while call_id in seen:
            call_id = f"{call_id}_{i}"
        seen.add(call_id)
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else tc
        declared.append(_declare(call_id, fn.get("name"), fn.get("arguments", {})))
        calls.extend(_normalise_call(fn.get("name"), fn.get("arguments", {}), "openai", call_id, reg))
    if declared:
        message["tool_calls"] = declared
    return calls, message


_UNCLOSED = ("<think> is not closed with </think>: the turn ended while reasoning, and nothing written "
             "inside reasoning is run. Close it with </think>, then act.")


def _parse_text(text: str, reg: _Tools) -> tuple[list[ToolCall], str | None, list[dict[str, Any]]]:
    """One turn of text -> ``(calls, protocol, declared tool_calls)``; reasoning is not read."""
    allowed = reg.allowed
    body, unclosed = split_reasoning(text)
    has_tags = bool(reg.open_re.search(body))
    has_json = "<tool_call>" in body
    if has_tags and has_json:
        # The one legal mix: JSON tool calls never appear *with* an answer tag in the same
        # turn, so this is always ambiguous.
        return [_invalid("the turn mixes <tool_call> JSON with <search>/<fetch>/<answer> tags; use one protocol per turn.")], None, []
    if has_json:
        calls, declared = _parse_tool_call_blocks(body, reg)
        return calls, "json", declared
    if has_tags:
        return _parse_tags(body, reg), "tags", []
    if unclosed:
        return [_invalid(_UNCLOSED)], None, []
    other = [t for t, _ in _OTHER_TAG_RE.findall(body) if t.lower() not in _NOT_ACTIONS and t.lower() not in reg.by_name]
    if other:
        return [_invalid(f"unknown action <{other[0]}>; the actions are {', '.join('<' + a + '>' for a in allowed)}.")], None, []
    if not body.strip():
        return [_invalid("the turn is empty." if not text.strip() else "the turn has only <think> and no action.")], None, []
    return [_invalid("no action found.")], None, []


def parse_action(
    action: str | dict[str, Any],
    *,
    allowed: tuple[str, ...] = TOOL_NAMES,
    protocols: tuple[str, ...] = PROTOCOLS,
    max_chars: int = 32_000,
    tools: tuple[Tool, ...] | None = None,
) -> ParsedAction:
    """Parse one assistant turn into tool calls (see the module docstring).

    Args:
        action: the completion text, an OpenAI-style assistant message dict, or that
            message as JSON text.
        allowed: tool names the env offers.
        protocols: protocols the env accepts; a call in another one is invalid.
        max_chars: longer actions are rejected without parsing (characters).
        tools: :class:`~drgym.envs.tools.Tool` objects besides the default ones (their
            names and argument aliases); ``allowed`` still chooses which may be called.

    Returns:
        A :class:`ParsedAction`. A malformed action is an ``invalid`` call, never an
        exception; an exception here is a parser bug and propagates.
    """
    return _parse_action(action, _registry(tools, allowed), protocols, max_chars)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as is; for a message dict, its ``content``; for a
    message list, the content of the last assistant message without tool calls (the
    final answer turn; '' when there is none)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    final = [m for m in list(completion or []) if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
             and not m.get("tool_calls")]
    return str(final[-1].get("content") or "") if final else ""


class Parser:
    """The one parser of drgym: the env's actions and the final answer of a completion.

    The env (:class:`~drgym.envs.core.SearchAgentEnv`), the TRL reward adapter
    (:mod:`drgym.training.trl_adapter`) and the GRPO reward wrapper
    (:mod:`drgym.training.rewards`) all read answers through it, so an answer is the same
    text wherever it is scored. After verifiers' ``Parser`` (``parse`` for a turn,
    ``parse_answer`` for a whole completion); subclass it to read another format.

    Args:
        tools: the :class:`~drgym.envs.tools.Tool` objects offered (default search,
            fetch, answer).
        protocols: protocols accepted (``tags``, ``json``, ``openai``).
        max_chars: longer turns are invalid (characters).
    """

    def __init__(self, tools: tuple[Tool, ...] = DEFAULT_TOOLS, protocols: tuple[str, ...] = PROTOCOLS,
                 max_chars: int = 32_000) -> None:
        self.tools = tuple(tools)
        self.protocols = tuple(protocols)
        self.max_chars = max_chars
        self._reg = _registry(self.tools, tuple(t.name for t in self.tools))

    def parse(self, action: str | dict[str, Any]) -> ParsedAction:
        """One assistant turn -> its tool calls (:func:`parse_action`)."""
        return _parse_action(action, self._reg, self.protocols, self.max_chars)

    def parse_answer(self, completion: Any) -> str | None:
        """The final answer of a completion (a string, a message dict or a message list).

        The rule (the README, "Answers"): the text is :func:`completion_text`, with
        reasoning removed (:func:`drgym.reasoning.strip_reasoning`: ``<think>`` blocks,
        text before an unopened ``</think>``, the rest after an unclosed ``<think>``).
        The answer is the content of its **first** complete
        ``<answer>...</answer>`` block (stripped), as in the env, where the first action
        tag of a turn counts and an episode ends at its first answer; later blocks are
        ignored. Without an ``<answer>`` block, a text with no action tag and no
        ``<tool_call>`` is itself the answer (an OpenAI-style message without tool calls
        is the final answer); a text that only searches or fetches has none (None).
        A string and a one-message list with the same text give the same answer.

        Example:
            >>> p = Parser()
            >>> p.parse_answer("<search>q</search><information>..</information><answer> Paris </answer><answer>Rome</answer>")
            'Paris'
            >>> p.parse_answer([{"role": "assistant", "content": "<think>hm</think><answer>Paris</answer>"}])
            'Paris'
            >>> p.parse_answer("Paris") == p.parse_answer([{"role": "assistant", "content": "Paris"}]) == "Paris"
            True
            >>> p.parse_answer("<search>capital of France</search>") is None
            True
            >>> p.parse_answer("Maybe <answer></answer>? It is Paris.</think>\\n<answer>Paris</answer>")
            'Paris'
        """
        text = strip_reasoning(completion_text(completion))
        m = _ANSWER_BLOCK_RE.search(text)
        if m is not None:
            return m.group(1).strip()
        if _ANY_TAG_RE.search(text) or "<tool_call>" in text:
            return None
        return text.strip() or None


def _parse_action(action, reg: _Tools, protocols, max_chars) -> ParsedAction:
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
        calls, message = _parse_openai(msg_obj, reg)
        protocol = "openai"
    else:
        calls, protocol, declared = _parse_text(raw, reg)
        message = {"role": "assistant", "content": raw}
        if declared:
            message["tool_calls"] = declared
    # a rule about the whole turn makes it one invalid call with no id: the env shows its
    # error in the reply of every call the turn declared
    if protocol is not None and protocol not in protocols:
        calls = [_invalid(f"the {protocol!r} protocol is not accepted here; use {', '.join(protocols)}.", protocol)]
    answers = [c for c in calls if c.name == "answer"]
    if answers and len(calls) > 1:
        calls = [_invalid("an answer must be the only call of its turn.", calls[0].protocol)]
    return ParsedAction(calls, protocol, message, raw)
