"""Shared helpers of the generating policies: stop strings, chat clean-up, usage records.

Every generating policy (``hf``, ``vllm``, ``openai`` in text mode) ends a turn at the
closing tag of the first tool call or answer, Search-R1 style (Jin et al. 2025,
arXiv 2503.09516, section 3.1: generation stops at ``</search>`` and the retrieved
passages are appended). These helpers make that cut identical across backends.

A stop string ends the turn wherever it occurs, inside reasoning too: vLLM and
OpenAI-compatible servers apply stop strings server-side and cannot tell reasoning from
action, and the cut must be the same on every backend. A turn stopped at a ``</search>``
rehearsed inside an unclosed ``<think>`` therefore ends inside reasoning; the parser
reads it as reasoning only (an invalid action whose corrective observation asks the
model to close ``</think>`` before acting; nothing in it is run). See
:func:`opened_reasoning` for reasoning opened by the chat template.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from drgym.envs.tools import DEFAULT_TOOLS, stop_strings
from drgym.reasoning import OPEN_TAG, ends_in_reasoning

DEFAULT_STOPS: tuple[str, ...] = stop_strings(DEFAULT_TOOLS, "any")
"""Closing tags that end an assistant turn (the env parses the text up to them): those the
default tools declare, in both protocols (:func:`drgym.envs.tools.stop_strings`)."""


def cut_text_at_stop(text: str, stops: tuple[str, ...] | list[str] = DEFAULT_STOPS, eos: tuple[str, ...] | list[str] = ()) -> tuple[str, str]:
    """Cut ``text`` right after the earliest stop string, else before the earliest eos.

    Batched ``generate`` pads finished rows with the pad token, which for SmolLM2 is the
    eos token ``<|im_end|>`` (id 2): a row that stopped on ``</search>`` is followed by
    spurious eos tokens. Cutting after the first stop string first (not at the first
    eos) keeps exactly what the model wrote.

    Args:
        text: the decoded completion (special tokens kept).
        stops: stop strings; the earliest occurrence wins and is kept in the output.
        eos: end-of-sequence / pad token texts; the text is cut before the earliest one
            when no stop string occurs before it.

    Returns:
        ``(kept_text, reason)`` with reason ``"stop"``, ``"eos"`` or ``"length"`` (no stop
        string and no eos: the token budget ran out).
    """
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best[0]):
            best = (i + len(s), "stop")
    for e in eos:
        if not e:
            continue
        i = text.find(e)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, "eos")
    if best is None:
        return text, "length"
    return text[: best[0]], best[1]


def cut_ids_at_stop(tokenizer: Any, ids: list[int], stops: tuple[str, ...] | list[str] = DEFAULT_STOPS,
                    eos_ids: tuple[int, ...] | list[int] | set[int] = ()) -> tuple[list[int], str]:
    """Cut generated token ids after the token that completes the first stop string.

    The token-level twin of :func:`cut_text_at_stop`, used where the kept ids go back into
    the context (``drgym train``'s rollouts, and ``hf:`` policies, whose evaluations
    must see the same tokens): the cut is at a token boundary, so a token that completes
    ``</search>`` and carries more text (SmolLM2 has ``>.``, ``>,``, ``><``...) is kept
    whole, as the model wrote it.

    Args:
        tokenizer: the tokenizer that produced ``ids``.
        ids: the new ids of one row (padding included).
        stops: stop strings; only text before the first eos/pad id counts.
        eos_ids: eos and pad ids. Batched ``generate`` pads finished rows, and SmolLM2
            pads with its eos (id 2), so ids after a stop string are not real ends.

    Returns:
        ``(kept_ids, reason)``: the smallest prefix whose decoded text holds a stop string
        (``"stop"``); else the ids up to and including the first eos/pad id (``"eos"``);
        else all ids (``"length"``). Found by bisection: O(log n) decodes.
    """
    ids = list(ids)
    ends = set(eos_ids)
    eos_pos = next((i for i, t in enumerate(ids) if t in ends), len(ids))
    head = ids[:eos_pos]

    def has_stop(n: int) -> bool:
        text = tokenizer.decode(head[:n], skip_special_tokens=False)
        return any(s in text for s in stops)

    if stops and head and has_stop(len(head)):
        lo, hi = 1, len(head)
        while lo < hi:
            mid = (lo + hi) // 2
            if has_stop(mid):
                hi = mid
            else:
                lo = mid + 1
        return head[:lo], "stop"
    if eos_pos < len(ids):
        return ids[: eos_pos + 1], "eos"
    return ids, "length"


def opened_reasoning(prompt: str) -> str:
    """:data:`~drgym.reasoning.OPEN_TAG` when a chat-template prompt ends inside an open
    reasoning block, else ``''``.

    DeepSeek-R1 distills' templates (and Qwen3 thinking-only releases) end the
    generation prompt with ``<think>``, so the model's turn starts inside reasoning and
    holds only ``... </think>`` and the action. Local policies and the GRPO rollout put
    this tag before such a turn's text when they hand it to the env, so the parser reads
    a turn cut before its ``</think>`` (by the token cap, or by a stop string such as a
    rehearsed ``</search>``) as reasoning, not as the actions it rehearses; a turn that
    closes its reasoning parses the same with or without it (:mod:`drgym.reasoning`).
    Only the template's own prompt counts, not text the model left open in an earlier
    turn: each turn is parsed on its own.
    """
    return OPEN_TAG if ends_in_reasoning(prompt) else ""


def close_open_tag(text: str, stops: tuple[str, ...] | list[str] = DEFAULT_STOPS) -> str:
    """Re-append the closing tag an API stripped when it stopped on it.

    OpenAI-compatible servers drop the matched stop string from the completion. When
    the text has an opening ``<search>`` (the opening tag of any stop string ``</x>``)
    after the last closing tag, the closing tag is appended so the env sees a complete
    action.
    """
    last_open, close = -1, None
    for c in stops:
        if not (c.startswith("</") and c.endswith(">")):
            continue  # not a closing tag: nothing opens it
        o = "<" + c[2:]
        i = text.rfind(o)
        if i > last_open and text.find(c, i) < 0:
            last_open, close = i, c
    return text + close if close else text


def normalise_messages(conversation: list[dict[str, Any]], *, keep_tool_role: bool = True) -> list[dict[str, Any]]:
    """Turn env messages into plain ``{"role", "content"}`` chat messages.

    Args:
        conversation: env ``messages``; assistant turns may hold the JSON of an
            OpenAI-style message (``{"content", "tool_calls"}``), tool results have role
            ``"tool"``.
        keep_tool_role: False maps ``"tool"`` messages to ``"user"`` (chat templates
            such as SmolLM2's ChatML have no tool role semantics).

    Returns:
        New message dicts; the input is not modified.
    """
    out = []
    for m in conversation:
        role = m.get("role", "user")
        content = m.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)
        if role == "tool" and not keep_tool_role:
            role = "user"
        out.append({"role": role, "content": content})
    return out


@dataclass
class TokenUsage:
    """Token and time accounting of one generated turn.

    Attributes:
        prompt_tokens: tokens of the prompt the model read (after the chat template).
        completion_tokens: tokens the model wrote for this turn (after the stop cut).
        generation_s: wall seconds of the batch call this turn was part of, divided
            evenly among its rows (so sums over turns give total generation time).
        finish: ``"stop"``, ``"eos"``, ``"length"``, ``"tool_calls"`` or ``"error"``.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_s: float = 0.0
    finish: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
             "generation_s": round(self.generation_s, 6), "finish": self.finish}
        d.update(self.extra)
        return d


class Timer:
    """``with Timer() as t: ...``; ``t.s`` is the elapsed wall time in seconds."""

    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        self.s = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.s = time.perf_counter() - self.t0


# -- thinking models --------------------------------------------------------------------------
def template_thinking_default(tokenizer: Any) -> bool | None:
    """What ``tokenizer``'s chat template does with no ``enable_thinking`` argument.

    Reasoning models' templates (Qwen3) read a ``enable_thinking`` variable: Qwen3 thinks
    unless it is false, which makes the generation prompt end with an empty
    ``<think>\\n\\n</think>\\n\\n`` block (Qwen3 model card, "Switching Between Thinking
    and Non-Thinking Mode"). The answer is found by rendering a one-message probe three
    ways (no argument, true, false) and comparing, so no template is named here.

    Returns:
        True or False (the template's default), or None when the template ignores the
        argument (SmolLM2, most instruct models: no thinking switch).
    """
    probe = [{"role": "user", "content": "?"}]

    def render(**kw: Any) -> str:
        return tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **kw)

    on, off = render(enable_thinking=True), render(enable_thinking=False)
    if on == off:
        return None
    return render() == on


def resolve_thinking(tokenizer: Any, enable_thinking: bool | None, *, where: str = "") -> bool | None:
    """The thinking mode a run actually gets: ``enable_thinking``, or the template's default when None.

    Returns:
        True/False, or None when the template has no thinking switch (then a setting
        other than None is logged as ignored).
    """
    default = template_thinking_default(tokenizer)
    if default is None:
        if enable_thinking is not None:
            logging.getLogger(__name__).warning("%senable_thinking=%s is ignored: this chat template has no thinking switch",
                                                f"{where}: " if where else "", enable_thinking)
        return None
    return default if enable_thinking is None else bool(enable_thinking)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], *, enable_thinking: bool | None = None,
                add_generation_prompt: bool = True) -> str:
    """``apply_chat_template`` as text, with ``enable_thinking`` passed when it is not None.

    The one place drgym renders a chat prompt for a local model (GRPO dataset and rollout
    prompts, SFT examples, ``hf:``/``vllm:`` policies), so training and evaluation see the
    same thinking mode. Templates without the switch ignore the argument.
    """
    kw: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kw)
