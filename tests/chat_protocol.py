"""What an OpenAI-compatible server accepts in a chat-completions request: a checker.

The loopback chat servers of the tests (``conftest.ChatServer``, used by every test of the
``openai:`` policy and of the judges) run :func:`request_errors` on every request and
answer a violation with HTTP 400, as OpenAI and vLLM do; the fixture then fails the test.
So every message list drgym sends in the suite is validated.

The rules (OpenAI chat-completions API reference, "messages" and "tool_calls"; vLLM's
``chat_utils`` parses the ``arguments`` of every assistant call as JSON):

- ``messages`` is a non-empty list of objects with a known ``role`` (system, developer,
  user, assistant, tool); content is a string, except an assistant message with tool calls,
  whose content may be null;
- an assistant ``tool_calls`` is a non-empty list of ``{"id": str, "type": "function",
  "function": {"name": str, "arguments": str}}``, ids non-empty and unique in the message,
  ``arguments`` the JSON text of an object;
- the pairing rule: an assistant message with ``tool_calls`` is followed by exactly one
  ``role: tool`` message per call id (any order), before any other message; no tool
  message answers an id its block did not declare, and no tool message stands anywhere
  else;
  (so a request never ends with an assistant message whose calls are unanswered);
- ``tool_choice`` needs ``tools``; each tool is a function schema with a name; ``stop``
  holds at most 4 strings.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_list_errors(messages: Any, *, ended: bool = False) -> list[str]:
    """Every violation of the rules (module docstring) in one message list.

    Args:
        messages: the ``messages`` of a request (or an env's ``info["messages"]``).
        ended: the list is a finished episode, not a request: its last assistant
            message may hold calls that were never answered (an ``answer`` call ends it).

    Returns:
        One line per violation (empty when the list is valid).
    """
    if not isinstance(messages, list) or not messages:
        return ["messages must be a non-empty list"]
    errors: list[str] = []
    pending: dict[str, int] | None = None  # declared id -> replies so far, inside a tool block
    opened_at = -1

    def close_block(at: int) -> None:
        nonlocal pending
        if pending is None:
            return
        # a finished episode may end with calls nobody answered (its `answer` call)
        if not (ended and at == len(messages) and not any(pending.values())):
            for cid, n in pending.items():
                if n != 1:
                    errors.append(f"messages[{opened_at}]: tool call {cid!r} has {n} tool replies (exactly 1 needed)")
        pending = None

    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            errors.append(f"messages[{i}] is not an object")
            continue
        role = m.get("role")
        if role not in ROLES:
            errors.append(f"messages[{i}]: unknown role {role!r}")
            continue
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                errors.append(f"messages[{i}]: a tool message needs a string tool_call_id")
            elif pending is None:
                errors.append(f"messages[{i}]: tool message for {tid!r} does not follow an assistant message with tool_calls")
            elif tid not in pending:
                errors.append(f"messages[{i}]: tool message answers {tid!r}, which messages[{opened_at}] did not declare")
            else:
                pending[tid] += 1
            if not isinstance(m.get("content"), str):
                errors.append(f"messages[{i}]: tool content must be a string")
            continue
        close_block(i)
        calls = m.get("tool_calls")
        content = m.get("content")
        if role == "assistant" and calls is not None:
            if not isinstance(calls, list) or not calls:
                errors.append(f"messages[{i}]: tool_calls must be a non-empty list")
                continue
            if content is not None and not isinstance(content, str):
                errors.append(f"messages[{i}]: content must be a string or null")
            pending, opened_at = {}, i
            for j, c in enumerate(calls):
                where = f"messages[{i}].tool_calls[{j}]"
                if not isinstance(c, dict):
                    errors.append(f"{where} is not an object")
                    continue
                cid = c.get("id")
                if not isinstance(cid, str) or not cid:
                    errors.append(f"{where}: id must be a non-empty string")
                    continue
                if cid in pending:
                    errors.append(f"{where}: id {cid!r} is repeated in the message")
                pending[cid] = 0
                if c.get("type") != "function":
                    errors.append(f"{where}: type must be 'function'")
                fn = c.get("function")
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn.get("name"):
                    errors.append(f"{where}: function.name must be a non-empty string")
                    continue
                args = fn.get("arguments")
                if not isinstance(args, str):
                    errors.append(f"{where}: function.arguments must be a string (JSON text), got {type(args).__name__}")
                    continue
                try:
                    ok = isinstance(json.loads(args), dict)
                except json.JSONDecodeError:
                    ok = False
                if not ok:
                    errors.append(f"{where}: function.arguments is not the JSON text of an object: {args[:60]!r}")
        elif not isinstance(content, str):
            errors.append(f"messages[{i}]: {role} content must be a string")
    close_block(len(messages))
    return errors


def request_errors(body: Any) -> list[str]:
    """Every violation in one chat-completions request body (module docstring)."""
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    errors = []
    if not isinstance(body.get("model"), str) or not body.get("model"):
        errors.append("model must be a non-empty string")
    errors += message_list_errors(body.get("messages"))
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            errors.append("tools must be a non-empty list")
        else:
            for j, t in enumerate(tools):
                fn = t.get("function") if isinstance(t, dict) else None
                if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
                    errors.append(f"tools[{j}] must be a function schema with a name")
    if "tool_choice" in body and tools is None:
        errors.append("tool_choice is set without tools")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and len(stop) <= 4
                                                           and all(isinstance(x, str) for x in stop))):
        errors.append("stop must be a string or a list of at most 4 strings")
    return errors
