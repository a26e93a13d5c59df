"""The env's tools as objects: name, arguments, prompt text, budget and a batched call.

As verifiers' ``ToolEnv`` and GEM's ``BaseTool``: each tool is declared once, as one
class, and everything else is made from it: the action parser (:mod:`drgym.envs.parsing`:
tag names, JSON argument names), the system prompts and corrective messages of both
protocols (:mod:`drgym.envs.prompts`: each tool's sentence), the OpenAI tool schema
(:func:`tool_schemas`, what chat templates and ``tools=`` requests take), the env's
budgets and observations (:mod:`drgym.envs.core`) and the batched driver
(:mod:`drgym.envs.driver`). A new tool is one new :class:`Tool` subclass passed to the env
as ``tools=(*DEFAULT_TOOLS, FindInPageTool())``; :class:`FindInPageTool` is such a third
tool.

A tool takes one string argument (``argument``; JSON and OpenAI calls may name it by
any of ``aliases``) and possibly more (``more_arguments``). Tag calls are
``<name>argument</name>``; a tool with more arguments reads them from the tag body
(:meth:`Tool.tag_arguments`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import Executor
from typing import Any

from drgym.types import Document, SearchResult


TOOL_CALL_OPEN = "<tool_call>"
"""The tag that opens a call in the JSON protocol (Qwen / Hermes function calling)."""
TOOL_CALL_CLOSE = "</tool_call>"
"""The tag that closes a call in the JSON protocol: its one stop string."""


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
        more_arguments: further required string arguments, ``(name, description)``
            pairs (JSON and OpenAI calls name them exactly).
        reads_url: the tool opens a URL (``argument``); a backend that fetches only
            URLs it returned refuses others (:meth:`drgym.envs.core.SearchAgentEnv.begin_step`).
        verb: what the system prompt says the agent may do several times ("search").
        prompts: the tool's text in the system prompt, per ``"<kind>/<protocol>"``
            (``"qa/tags"``, ``"research/tags"``, ``"qa/json"``, ``"research/json"``): a
            whole sentence for tags, a phrase (``"`fetch` with a URL to read a whole
            document"``) for JSON; :mod:`drgym.envs.prompts` joins them.
        correction: the tool's sentence in the tag protocol's corrective message.
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
    more_arguments: tuple[tuple[str, str], ...] = ()
    reads_url: bool = False
    verb: str = ""
    prompts: dict[str, str] = {}
    correction: str = ""

    @property
    def argument_names(self) -> tuple[str, ...]:
        """Every argument, ``argument`` first."""
        return (self.argument, *(n for n, _ in self.more_arguments))

    def signature(self) -> str:
        """``name(arg, ...)``, as the JSON corrective message lists the tools."""
        return f"{self.name}({', '.join(self.argument_names)})"

    def prompt(self, kind: str, protocol: str) -> str:
        """The tool's text in the system prompt of ``kind`` (``"qa"``/``"research"``) and
        ``protocol`` (``"tags"``/``"json"``).

        A tool without its own text for the pair (``prompts``) gets one made from its
        ``description``, ``name`` and arguments.
        """
        key = f"{kind if kind == 'research' else 'qa'}/{'tags' if protocol == 'tags' else 'json'}"
        if key in self.prompts:
            return self.prompts[key]
        # a tool that brings no text of its own is described from its name and description
        if protocol == "tags":
            return f"{self.description.rstrip('.')}: write the {self.what or self.argument} between <{self.name}> and </{self.name}>."
        return f"`{self.name}` with {' and '.join(self.argument_names)} ({self.description.rstrip('.')})"

    def corrective(self) -> str:
        """The tool's sentence in the tag protocol's corrective message (:attr:`correction`,
        else one made from its name)."""
        return self.correction or (f"If I want to call {self.name}, I should put the {self.what or self.argument} "
                                   f"between <{self.name}> and </{self.name}>.")

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (``{"type": "function", "function": {...}}``)."""
        props = {self.argument: {"type": "string", "description": self.argument_description}}
        props.update({n: {"type": "string", "description": d} for n, d in self.more_arguments})
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": props, "required": list(self.argument_names)},
            },
        }

    def tag_arguments(self, content: str) -> dict[str, str] | str:
        """The arguments of a tag call ``<name>content</name>`` (``content`` stripped, not
        empty): ``{argument: content}``; a tool with more arguments splits the body itself.

        Returns:
            The arguments, or the error text shown to the agent when the body is malformed.
        """
        return {self.argument: content}

    @property
    def open_tag(self) -> str:
        """The tag that opens a call in the tag protocol (``"<search>"``)."""
        return f"<{self.name}>"

    @property
    def close_tag(self) -> str:
        """The tag that closes a call in the tag protocol (``"</search>"``): a stop string."""
        return f"</{self.name}>"

    def tag_body(self, arguments: dict[str, str]) -> str:
        """The body of a tag call with ``arguments``: the inverse of :meth:`tag_arguments`
        (the ``argument``'s value; a tool with more arguments joins them itself)."""
        return arguments[self.argument]

    def render(self, arguments: dict[str, str] | str, protocol: str = "tags", *, call_id: str = "call_0") -> str:
        """The action text that calls this tool, as :mod:`drgym.envs.parsing` reads it.

        Args:
            arguments: ``{name: value}`` of every argument (:attr:`argument_names`), or
                the value of :attr:`argument` alone.
            protocol: ``"tags"`` (``<search> q </search>``), ``"json"``
                (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) or
                ``"openai"`` (the JSON of an assistant message with one ``tool_calls`` entry).
            call_id: the ``id`` of the OpenAI tool call.

        Returns:
            The action string.

        Raises:
            ValueError: an unknown protocol, or an argument missing or not a string.

        >>> SearchTool().render("capital of France")
        '<search> capital of France </search>'
        """
        args = {self.argument: arguments} if isinstance(arguments, str) else dict(arguments)
        missing = [n for n in self.argument_names if not isinstance(args.get(n), str)]
        if missing:
            raise ValueError(f"{self.name} needs string arguments {list(self.argument_names)}; "
                             f"missing or not a string: {missing}.")
        if protocol == "tags":
            return f"{self.open_tag} {self.tag_body(args)} {self.close_tag}"
        if protocol == "json":
            return (f"{TOOL_CALL_OPEN}\n" + json.dumps({"name": self.name, "arguments": args}, ensure_ascii=False)
                    + f"\n{TOOL_CALL_CLOSE}")
        if protocol == "openai":
            return json.dumps({"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": self.name, "arguments": json.dumps(args, ensure_ascii=False)}}]},
                ensure_ascii=False)
        raise ValueError(f"protocol must be 'tags', 'json' or 'openai', got {protocol!r}.")

    def value(self, arguments: dict[str, str]) -> Any:
        """What :meth:`call_batch` gets for one call: the ``argument``'s string, or for a tool
        with more arguments a tuple of them in :attr:`argument_names` order."""
        if not self.more_arguments:
            return arguments[self.argument]
        return tuple(arguments[n] for n in self.argument_names)

    def call_batch(self, backend: Any, arguments: list[str], *, k: int, executor: Executor | None = None) -> list[Any]:
        """Run the tool on every argument at once.

        Args:
            backend: the env's search backend.
            arguments: one :meth:`value` per call, in order.
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
    verb = "search"
    prompts = {
        "qa/tags": "To search, write a query between <search> and </search>; the results come back between "
                   "<information> and </information>, each as Doc n (Title: ..., URL: ...).",
        "research/tags": "To search, write a query between <search> and </search>; results come back between "
                         "<information> and </information>, each numbered as [n] (Title: ..., URL: ...).",
        "qa/json": "`search` with a query to get passages with their titles and URLs",
        "research/json": "`search` with a query to get numbered sources ([n] (Title: ..., URL: ...))",
    }
    correction = "If I want to search, I should put the query between <search> and </search>."

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
    reads_url = True
    verb = "fetch"
    prompts = {
        "qa/tags": "To read a whole document, write its URL between <fetch> and </fetch>.",
        "research/tags": "To read a whole source, write its URL between <fetch> and </fetch>.",
        "qa/json": "`fetch` with a URL to read a whole document",
        "research/json": "`fetch` with a URL to read a whole source",
    }
    correction = "If I want to read a document, I should put its URL between <fetch> and </fetch>."

    def call_batch(self, backend, arguments, *, k, executor=None):
        return fetch_each(backend, arguments, executor)

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
    prompts = {
        "qa/tags": "When you know the answer, write it between <answer> and </answer>, as a short phrase without "
                   "explanation, for example <answer> Beijing </answer>.",
        "research/tags": "Finish with the full report between <answer> and </answer>.",
        "qa/json": "When you know the answer, call `answer` with a short phrase without explanation.",
        "research/json": "When done, call `answer` with the full report.",
    }
    correction = "If I want to give the final answer, I should put it between <answer> and </answer>."


def fetch_each(backend: Any, urls: list[str], executor: Executor | None = None) -> list[Any]:
    """``backend.fetch`` of every URL, on ``executor``'s threads when given.

    Returns:
        One :class:`~drgym.types.Document` per URL, or that call's exception (a failed
        fetch is its result: shown to the agent and recorded).
    """
    def one(url: str) -> Any:
        try:
            return backend.fetch(url)
        except Exception as e:  # that call's failure is its result: shown to the agent, recorded
            return e

    if executor is not None and len(urls) > 1:
        return list(executor.map(one, urls))
    return [one(u) for u in urls]


class FindInPageTool(Tool):
    """``find_in_page(url, text)``: the passages of a document that contain a text.

    Fetches the document and returns up to :attr:`max_matches` windows of
    :attr:`window` words either side of each match of ``text``, joined by ``...``
    (overlapping windows merge); "No match" when there is none. A match is a run of
    consecutive words (whitespace-separated) that contain the words of ``text`` in order,
    compared lower-cased (``population`` matches ``population,``). Not among :data:`DEFAULT_TOOLS`: pass it with
    ``tools=(*DEFAULT_TOOLS, FindInPageTool())``. Its budget is the env's
    ``max_fetches`` (counted apart from fetches). The tag form is
    ``<find_in_page>URL words to find</find_in_page>``: the URL, whitespace, the text.
    """

    name = "find_in_page"
    description = "Find a text in the document at a URL and return the passages around each match."
    argument = "url"
    argument_description = "A URL from a search result."
    more_arguments = (("text", "The words to find in the document (case-insensitive)."),)
    aliases = ("url", "doc_id", "link")
    what = "URL and the text to find"
    budget_attr = "max_fetches"
    label, plural, stat = "Find", "finds", "finds"
    missing = "no document returned"
    reads_url = True
    verb = "find text in a page"
    prompts = {
        "qa/tags": "To find a text in a document, write its URL, a space and the text between <find_in_page> and "
                   "</find_in_page>.",
        "research/tags": "To find a text in a source, write its URL, a space and the text between <find_in_page> "
                         "and </find_in_page>.",
        "qa/json": "`find_in_page` with a URL and a text to get the passages of that document that contain it",
        "research/json": "`find_in_page` with a URL and a text to get the passages of that source that contain it",
    }
    correction = ("If I want to find a text in a document, I should put its URL, a space and the text between "
                  "<find_in_page> and </find_in_page>.")
    window = 30
    max_matches = 3

    def tag_arguments(self, content: str) -> dict[str, str] | str:
        parts = content.split(None, 1)
        if len(parts) < 2 or not parts[1].strip():
            return (f"<{self.name}> needs a URL, a space and the text to find, e.g. "
                    f"<{self.name}>https://en.wikipedia.org/wiki/Lyon population</{self.name}>.")
        return {"url": parts[0], "text": parts[1].strip()}

    def tag_body(self, arguments: dict[str, str]) -> str:
        return f"{arguments['url']} {arguments['text']}"

    def call_batch(self, backend, arguments, *, k, executor=None):
        docs = fetch_each(backend, [url for url, _ in arguments], executor)
        return [d if isinstance(d, BaseException) else (d, text) for d, (_, text) in zip(docs, arguments)]

    def find(self, text: str, needle: str) -> list[str]:
        """The windows of ``text`` around each match of ``needle`` (at most :attr:`max_matches`).

        >>> FindInPageTool().find("Lyon is a city in France. Its population is 522,250.", "population")
        ['Lyon is a city in France. Its population is 522,250.']
        """
        words = text.split()
        target = needle.lower().split()
        if not target:
            return []
        lowered = [w.lower() for w in words]
        out: list[str] = []
        last_end = -1
        for i in range(len(words) - len(target) + 1):
            if all(t in lowered[i + j] for j, t in enumerate(target)):
                start, end = max(0, i - self.window), min(len(words), i + len(target) + self.window)
                if start <= last_end:  # overlaps the previous window: extend it
                    out[-1] = " ".join(words[out_start:end])
                else:
                    out.append(" ".join(words[start:end]))
                    out_start = start
                last_end = end
                if len(out) > self.max_matches:
                    return out[: self.max_matches]
        return out

    def to_docs(self, result: tuple[Document, str]) -> list[dict[str, Any]]:
        doc, needle = result
        found = self.find(doc.text, needle)
        d = doc.to_dict()
        d["text"] = " ... ".join(found) if found else f"No match for {needle!r} in this document."
        return [d]


DEFAULT_TOOLS: tuple[Tool, ...] = (SearchTool(), FetchTool(), AnswerTool())
"""The tools of drgym's envs: search, fetch, answer."""


def tool_schemas(tools: tuple[Tool, ...] | list[Tool] = DEFAULT_TOOLS) -> list[dict[str, Any]]:
    """OpenAI ``tools`` schemas of ``tools``, in order."""
    return [t.schema() for t in tools]


def stop_strings(tools: Iterable[Tool] = DEFAULT_TOOLS, protocol: str = "tags") -> tuple[str, ...]:
    """The stop strings that end an agent turn calling ``tools`` in ``protocol``.

    A turn ends at the closing tag of its first call (Search-R1: generation stops at
    ``</search>``), so the stop strings are what the tools declare: each tool's
    :attr:`Tool.close_tag` in the tag protocol, ``</tool_call>`` in the JSON one.

    Args:
        tools: the tools the env offers (``env.tools.values()``), in order.
        protocol: ``"tags"``, ``"json"``, or ``"any"`` for both (a policy that does not
            know the env's protocol).

    Returns:
        The stop strings, tags first in tool order (``("</search>", "</fetch>",
        "</answer>")`` for :data:`DEFAULT_TOOLS`).

    Raises:
        ValueError: an unknown protocol, or no tools.

    >>> stop_strings(DEFAULT_TOOLS, "any")
    ('</search>', '</fetch>', '</answer>', '</tool_call>')
    """
    tools = tuple(tools)
    if not tools:
        raise ValueError("stop_strings needs at least one tool.")
    if protocol not in ("tags", "json", "any"):
        raise ValueError(f"protocol must be 'tags', 'json' or 'any', got {protocol!r}.")
    tags = tuple(t.close_tag for t in tools) if protocol in ("tags", "any") else ()
    return tags + ((TOOL_CALL_CLOSE,) if protocol in ("json", "any") else ())
