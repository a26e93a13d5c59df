"""TRL ``environment_factory`` path: JSON tool calling through the chat template.

TRL 1.16 turns every public method of the environment class into a tool, renders the
tool schemas with the tokenizer's chat template, parses ``<tool_call>{json}</tool_call>``
replies with ``tokenizer.parse_response`` and masks tool-result tokens from the loss.
It only does so for chat templates it recognises byte for byte; SmolLM2's is not one,
so :func:`use_tool_template` installs TRL's ``qwen2_5.jinja``, which uses the same
ChatML tokens (``<|im_start|>``/``<|im_end|>``).

The class built by :func:`make_tool_env_class` wraps one ``drgym/SearchQA-v0`` env, so
budgets, observation formatting, trajectories and rewards are the env's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drgym.errors import ConfigError


def use_tool_template(tokenizer) -> None:
    """Install TRL's Qwen2.5 tool-calling chat template on ``tokenizer`` (in place).

    Raises:
        ConfigError: the template file is missing from the installed TRL.
    """
    import trl

    p = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    if not p.is_file():
        raise ConfigError(f"TRL's qwen2_5.jinja is missing at {p}; the JSON tool path needs TRL >= 1.16.")
    tokenizer.chat_template = p.read_text(encoding="utf-8")


def make_tool_env_class(env_factory):
    """A zero-argument environment class for ``GRPOTrainer(environment_factory=...)``.

    Tools exposed to the model are the env's own, as its JSON-protocol system prompt
    describes them (:data:`drgym.envs.prompts.QA_SYSTEM_JSON`): ``search(query)``,
    ``fetch(url)`` and ``answer(answer)``; each call is one env step, so budgets (a
    ``max_fetches`` of 0 refuses fetches), observations and the trajectory are the
    env's. ``answer`` ends the episode. A final assistant message without a tool call
    is taken as the answer when ``answer`` was not called: reward functions receive the
    instances as ``environments`` and call ``_finish(answer)`` with its text (see
    :class:`drgym.training.rewards.DrgymRewardFunc`).
    """

    class SearchTools:
        """One drgym SearchQA episode behind TRL's tool loop."""

        def __init__(self) -> None:
            self._env = env_factory()
            self._calls = 0
            self.finished = False

        def reset(self, **row: Any) -> str | None:
            """Start the episode of the dataset row (``task_id`` column)."""
            task = next((t for t in self._env.tasks if t.task_id == row.get("task_id")), None)
            self._env.reset(options={"task": task} if task is not None else {"task_id": row.get("task_id")})
            self._calls = 0
            self.finished = False
            return None

        def _step(self, name: str, argument: str, value: str) -> str:
            if self.finished or self._env.done:
                self.finished = True
                return "The episode has ended; reply without a tool call."
            self._calls += 1
            msg = {"content": "", "tool_calls": [{"id": f"call_{self._calls}", "type": "function",
                                                  "function": {"name": name, "arguments": json.dumps({argument: value})}}]}
            obs, _r, term, trunc, _info = self._env.step(msg)
            if term or trunc:
                self.finished = True
            return obs

        def search(self, query: str) -> str:
            """Search the corpus and return the top passages.

            Args:
                query: what to search for, in a few words.

            Returns:
                The passages, one per line, with their titles and URLs.
            """
            return self._step("search", "query", query)

        def fetch(self, url: str) -> str:
            """Read a whole document by its URL (from a search result).

            Args:
                url: the document's URL.

            Returns:
                The document's text.
            """
            return self._step("fetch", "url", url)

        def answer(self, answer: str) -> str:
            """Give the final answer and end the episode.

            Args:
                answer: a short phrase, without explanation.

            Returns:
                A confirmation.
            """
            self._step("answer", "answer", answer)
            return "Answer recorded."

        def _finish(self, answer: str):
            # private (leading underscore) so TRL does not expose it as a tool
            if not self.finished and not self._env.done:
                self._env.step({"content": f"<answer>{answer}</answer>"})
            self.finished = True
            return self._env.trajectory

    return SearchTools
