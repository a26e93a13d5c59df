"""The :class:`Policy` interface: a batch of conversations in, one assistant turn each out.

A conversation is the env's chat ``messages`` (``info["messages"]``): a list of
``{"role": "system"|"user"|"assistant"|"tool", "content": str, ...}`` dicts. A policy
returns the assistant's text for the next turn; that text is the env action. Policies
that use native function calling return the JSON of an OpenAI-style assistant message
(``{"content": ..., "tool_calls": [...]}``), which the env's action parser reads too.
"""

from __future__ import annotations

import abc
from typing import Any

from drgym.records import Conversation

__all__ = ["Conversation", "Policy"]


class Policy(abc.ABC):
    """An agent that writes one assistant turn per conversation.

    Attributes:
        name: the spec it was built from (``"hf:smollm2"``, ``"scripted"``...), recorded in
            run configs.
    """

    name: str = "policy"

    @abc.abstractmethod
    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """Write the next assistant turn for each conversation.

        Args:
            conversations: one chat history per active episode.
            infos: the env ``info`` dict of each episode (task id, budgets left...), for
                policies that need structured state (scripted, rag); others ignore it.

        Returns:
            One action string per conversation, in order.
        """

    def close(self) -> None:
        """Free resources (models, HTTP clients). Idempotent."""
