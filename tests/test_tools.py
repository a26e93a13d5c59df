"""Tools are objects: a new tool is one class, and the parser, the env's budgets and
observations, the batched driver and the OpenAI schema all pick it up."""

from __future__ import annotations

import gymnasium as gym

import drgym.envs  # noqa: F401
from drgym.envs.driver import BatchedDriver
from drgym.envs.tools import DEFAULT_TOOLS, Tool, tool_schemas
from drgym.records import Task


class FindInPage(Tool):
    """A toy ``find_in_page``: the sentences of a fetched page that contain a word."""

    name = "find_in_page"
    description = "Return the sentences of the page at a URL that contain a word: 'URL | word'."
    argument = "pattern"
    argument_description = "'URL | word'"
    aliases = ("pattern",)
    what = "'URL | word'"
    max_calls = 1
    label, plural, stat = "Find", "finds", "finds"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def call_batch(self, backend, arguments, *, k, executor=None):
        self.batches.append(list(arguments))
        out = []
        for a in arguments:
            url, _, word = (x.strip() for x in a.partition("|"))
            doc = backend.fetch(url)
            hits = [s.strip() for s in doc.text.split(".") if word.lower() in s.lower()]
            out.append({"title": doc.title, "url": doc.url, "text": ". ".join(hits) or "(no match)"})
        return out

    def to_docs(self, result):
        return [result]


def _env(backend, tool, tasks):
    return gym.make("drgym/SearchQA-v0", backend=backend, tasks=tasks, tools=(*DEFAULT_TOOLS, tool), max_turns=4)


def test_a_toy_tool_is_one_class(bm25_backend):
    tool = FindInPage()
    # the OpenAI schema comes from the objects
    schema = tool_schemas((*DEFAULT_TOOLS, tool))
    assert [s["function"]["name"] for s in schema] == ["search", "fetch", "answer", "find_in_page"]
    assert schema[3]["function"]["parameters"]["required"] == ["pattern"]

    task = Task(task_id="t", question="Who?", answers=["x"])
    hit = bm25_backend.search("Lilu demon", k=1)[0]
    word = hit.text.split()[3]
    env = _env(bm25_backend, tool, [task])
    env.reset(options={"task": task})
    obs, _, term, _, info = env.step(f"<find_in_page> {hit.url} | {word} </find_in_page>")
    assert not term and info["tool_calls"][0]["name"] == "find_in_page"
    assert word in obs and "<information>" in obs
    # its budget (max_calls = 1) is charged like search's and fetch's
    obs, _, _, _, info = env.step(f"<find_in_page> {hit.url} | {word} </find_in_page>")
    assert "Find budget spent (1 finds)" in obs
    # JSON calls use the same tool object
    env.reset(options={"task": task})
    obs, *_ = env.step('<tool_call>{"name": "find_in_page", "arguments": {"pattern": "%s | %s"}}</tool_call>' % (hit.url, word))
    assert word in obs


def test_the_driver_batches_a_new_tool_once_per_turn(bm25_backend):
    tool = FindInPage()
    tasks = [Task(task_id=f"t{i}", question="Who?", answers=["x"]) for i in range(3)]
    hit = bm25_backend.search("Lilu demon", k=1)[0]
    envs = [_env(bm25_backend, tool, tasks) for _ in range(3)]
    with BatchedDriver(envs) as d:
        d.reset([{"task_id": t.task_id} for t in tasks])
        out = d.step([f"<find_in_page> {hit.url} | the </find_in_page>"] * 3)
    assert tool.batches == [[f"{hit.url} | the"] * 3]  # one call for the three envs
    assert d.stats["finds"] == 3
    assert all("<information>" in o[0] for o in out.values())
