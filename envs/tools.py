"""The env's tools as objects: name, argument schema, budget and a batched call.

As verifiers' ``ToolEnv`` and GEM's ``BaseTool``: each tool is one class, and the
action parser (:mod:`drgym.envs.parsing`), the env's budgets and observations
(:mod:`drgym.envs.core`), the batched driver (:mod:`drgym.envs.driver`) and the OpenAI
tool schema (:func:`tool_schemas`, what chat templates and ``tools=`` requests take)
all read them. A new tool (say ``find_in_page``) is one new :class:`Tool` subclass
passed to the env as ``tools=(*DEFAULT_TOOLS, FindInPage())``.

A tool takes one string argument (``argument``; JSON and OpenAI calls may name it by
any of ``aliases``). Tag calls are ``<name>argument</name>``.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from drgym.types import Document, SearchResult


class Tool:
    """One action the agent can call.

    Attributes:
        name: the tool name (tag name, JSON/OpenAI function name).
        description: shown in the tool schema.
        argument: the canonical argument name (``ToolCall.arguments[argument]``).
        argument_description: shown in the tool schema.
        aliases: argument names accepted in JSON/OpenAI calls (``argument`` first).
        what: how the empty-argument error names the argument ("query", "URL").
        terminal: calling it ends the episode (the ``answer`` tool).
        budget_attr: the env attribute holding the per-episode call budget
            (``"max_searches"``), or None to use ``max_calls``.
        max_calls: per-episode budget when ``budget_attr`` is None (None: unlimited).
        label: the capitalised name in messages (``"Search failed: ..."``).
        plural: calls in budget messages (``"3 searches"``).
        stat: the driver counter of arguments run (``"queries"``).
        missing: the error shown when the backend returned no result for a call.
    """

    name: str = ""
    description: str = ""
    argument: str = ""
    argument_description: str = ""
    aliases: tuple[str, ...] = ()
    what: str = ""
    terminal: bool = False
    budget_attr: str | None = None
    max_calls: int | None = None
    label: str = ""
    plural: str = ""
    stat: str = ""
    missing: str = "no result returned"

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (``{"type": "function", "function": {...}}``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {self.argument: {"type": "string", "description": self.argument_description}},
                    "required": [self.argument],
                },
            },
        }

    def call_batch(self, backend: Any, arguments: list[str], *, k: int, executor: Executor | None = None) -> list[Any]:
        """Run the tool on every argument at once.

        Args:
            backend: the env's search backend.
            arguments: one argument per call, in order.
            k: top-k of the env (for tools that rank).
            executor: a thread pool the tool may use for calls that do not batch.

        Returns:
            One result per argument (anything :meth:`to_docs` takes), or the exception of
            that call.

        Raises:
            Exception: a failure of the whole batch (the driver then retries each env's
                calls alone).
        """
        raise NotImplementedError

    def to_docs(self, result: Any) -> list[dict[str, Any]]:
        """The result as document dicts (``title``, ``url``, ``text``...) for the observation
        and ``Step.results``."""
        raise NotImplementedError

    def budget(self, env: Any) -> int | None:
        """The per-episode budget of this tool in ``env`` (None: unlimited)."""
        return getattr(env, self.budget_attr) if self.budget_attr else self.max_calls


class SearchTool(Tool):
    """``search``: top-k passages for a query, one ``search_batch`` for all the calls."""

    name = "search"
    description = "Search the document collection and return the top passages with their titles and URLs."
    argument = "query"
    argument_description = "The search query."
    aliases = ("query", "queries", "q", "search_query")
    what = "query"
    budget_attr = "max_searches"
    label, plural, stat = "Search", "searches", "queries"
    missing = "no result returned for this query"

    def call_batch(self, backend, arguments, *, k, executor=None):
        return backend.search_batch(arguments, k)

    def to_docs(self, result: list[SearchResult]) -> list[dict[str, Any]]:
        return [r.to_dict() for r in result]


class FetchTool(Tool):
    """``fetch``: the whole document at a URL; calls run on the executor's threads."""

    name = "fetch"
    description = "Return the whole document at a URL seen in search results."
    argument = "url"
    argument_description = "A URL from a search result."
    aliases = ("url", "doc_id", "link")
    what = "URL"
    budget_attr = "max_fetches"
    label, plural, stat = "Fetch", "fetches", "fetches"
    missing = "no document returned"

    def call_batch(self, backend, arguments, *, k, executor=None):
        def one(url: str) -> Any:
            try:
                return backend.fetch(url)
            except Exception as e:  # that call's failure is its result: shown to the agent, recorded
                return e

        if executor is not None and len(arguments) > 1:
            return list(executor.map(one, arguments))
        return [one(u) for u in arguments]

    def to_docs(self, result: Document) -> list[dict[str, Any]]:
        return [result.to_dict()]


class AnswerTool(Tool):
    """``answer``: the final answer or report; ends the episode."""

    name = "answer"
    description = "Give the final answer (or the final report) and end the episode."
    argument = "answer"
    argument_description = "The final answer or report."
    aliases = ("answer", "report", "text", "final_answer")
    what = "answer"
    terminal = True
    label, plural = "Answer", "answers"


DEFAULT_TOOLS: tuple[Tool, ...] = (SearchTool(), FetchTool(), AnswerTool())
"""The tools of drgym's envs: search, fetch, answer."""


def tool_schemas(tools: tuple[Tool, ...] | list[Tool] = DEFAULT_TOOLS) -> list[dict[str, Any]]:
    """OpenAI ``tools`` schemas of ``tools``, in order."""
    return [t.schema() for t in tools]
