r"""Reasoning blocks in model text: the one rule for what a model thought and what it said.

Reasoning models write ``<think>...</think>`` before they act or judge: DeepSeek-R1 and
its distills, Qwen3 in thinking mode, QwQ. Their chat templates often open the block in
the *prompt* (the generation prompt ends with ``<think>``), so the completion holds only
``... </think>`` and then the action. Everything here applies to the tags ``think``,
``thinking`` and ``reasoning`` in any case, and is used by both readers of model text:
the action and answer parser (:mod:`drgym.envs.parsing`) and the judges' verdict parser
(:func:`drgym.judges.base.parse_verdict`).

The rule:

1. a closed block ``<think>...</think>`` is reasoning. Blocks do not nest: the first
   close tag after an opening tag closes it (the shortest match), so in
   ``<think>a <think>b</think> c</think>`` the block is ``<think>a <think>b</think>`` and
   `` c</think>`` is handled by rule 2;
2. a close tag with no opening tag (the chat template opened the block) ends the
   reasoning: everything before the **last** such close tag is reasoning;
3. an opening tag that is never closed starts reasoning that runs to the end of the
   text (a turn cut by the token cap, or by a stop string, while it was reasoning).

Whatever is reasoning is never read as an action, an answer or a verdict; tags inside it
(``<search>``, ``<answer>``, ``<tool_call>``, JSON) are rehearsals.
"""

from __future__ import annotations

import re

__all__ = ["OPEN_TAG", "ends_in_reasoning", "split_reasoning", "strip_reasoning"]

_REASONING = r"(?:think|thinking|reasoning)"
_CLOSED_BLOCK = re.compile(rf"<({_REASONING})\b[^>]*>.*?</\1\s*>", re.S | re.I)
_CLOSE_TAG = re.compile(rf"</{_REASONING}\s*>", re.I)
_OPEN_TAG = re.compile(rf"<{_REASONING}\b[^>]*>", re.I)

OPEN_TAG = "<think>"
"""The opening tag drgym writes for a block a chat template opened (see :func:`ends_in_reasoning`)."""


def split_reasoning(text: str) -> tuple[str, bool]:
    r"""Apply the rule (module docstring) to ``text``.

    Returns:
        ``(said, unclosed)``: the text outside reasoning (blocks removed, with a space
        where a closed block was, so words either side stay apart), and whether the text
        ends inside an unclosed reasoning block (rule 3).

    >>> split_reasoning("<think>maybe <answer>Rome</answer></think><answer>Paris</answer>")
    (' <answer>Paris</answer>', False)
    >>> split_reasoning("Berlin is the capital.</think>\n<answer>Berlin</answer>")
    ('\n<answer>Berlin</answer>', False)
    >>> split_reasoning("<think>Maybe <search>old query</search>")
    ('', True)
    """
    text = _CLOSED_BLOCK.sub(" ", text)
    closes = list(_CLOSE_TAG.finditer(text))
    if closes:
        text = text[closes[-1].end():]
    m = _OPEN_TAG.search(text)
    return (text[: m.start()], True) if m else (text, False)


def strip_reasoning(text: str) -> str:
    r"""The text outside reasoning blocks (:func:`split_reasoning`'s first value).

    >>> strip_reasoning('<think>maybe {"score": 0}</think> {"score": 1}').strip()
    '{"score": 1}'
    >>> strip_reasoning('first guess 0</think>\n{"score": 1}'), strip_reasoning('{"a": 1} <think>cut off')
    ('\n{"score": 1}', '{"a": 1} ')
    """
    return split_reasoning(text)[0]


def ends_in_reasoning(text: str) -> bool:
    r"""True when ``text`` ends inside an open reasoning block.

    Used on a rendered chat prompt: a template that opens ``<think>`` in the prompt
    (DeepSeek-R1 distills) makes the completion start inside reasoning, and drgym then
    hands the parser the completion behind :data:`OPEN_TAG`, so a turn cut before its
    ``</think>`` is read as reasoning rather than as the actions it rehearses.

    >>> ends_in_reasoning("<|im_start|>assistant\n<think>\n"), ends_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    (True, False)
    """
    return split_reasoning(text)[1]
