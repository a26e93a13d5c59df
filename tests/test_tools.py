"""Tools are objects: a new tool is one class, and the parser, the system prompts, the
corrective messages, the env's budgets and observations, the batched driver and the
OpenAI schema all pick it up (a toy tool, and the shipped third tool ``find_in_page``, in
both protocols)."""

from __future__ import annotations

import gymnasium as gym

import drgym.envs  # noqa: F401
import pytest

from drgym.envs.driver import BatchedDriver
from drgym.envs.prompts import corrective_message, system_prompt
from drgym.envs.tools import DEFAULT_TOOLS, FindInPageTool, Tool, tool_schemas
from drgym.records import Task

# The default tools' prompts, as drgym's shipped models were trained on them: generated from
# the Tool objects, they must stay these bytes.
FROZEN = {
    "QA_SYSTEM_TAGS": "You answer questions using a search engine. Think step by step inside <think> and </think> if you need to. To search, write a query between <search> and </search>; the results come back between <information> and </information>, each as Doc n (Title: ..., URL: ...). To read a whole document, write its URL between <fetch> and </fetch>. You may search and fetch several times, one action per turn. When you know the answer, write it between <answer> and </answer>, as a short phrase without explanation, for example <answer> Beijing </answer>.",
    "QA_SYSTEM_JSON": "You answer questions using a search engine. Call the tool `search` with a query to get passages with their titles and URLs, and `fetch` with a URL to read a whole document. You may call tools several times. When you know the answer, call `answer` with a short phrase without explanation. Write each call as <tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"...\"}}</tool_call>.",
    "RESEARCH_SYSTEM_TAGS": "You are a research assistant who writes well-sourced reports. To search, write a query between <search> and </search>; results come back between <information> and </information>, each numbered as [n] (Title: ..., URL: ...). To read a whole source, write its URL between <fetch> and </fetch>. Search and fetch as often as you need, one action per turn. Finish with the full report between <answer> and </answer>. Support each claim with an inline citation right after it: the source number in brackets, like [3], or the URL itself. Cite only sources you were shown. A report whose sources appear only in a bibliography at the end, with no inline citations, is accepted but scores 0 on citation quality.",
    "RESEARCH_SYSTEM_JSON": "You are a research assistant who writes well-sourced reports. Call `search` with a query to get numbered sources ([n] (Title: ..., URL: ...)) and `fetch` with a URL to read a whole source. When done, call `answer` with the full report. Support each claim with an inline citation right after it: the source number in brackets, like [3], or the URL itself. Cite only sources you were shown. A report whose sources appear only in a bibliography at the end, with no inline citations, is accepted but scores 0 on citation quality. Write each call as <tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"...\"}}</tool_call>.",
    "CORRECTIVE": "My previous action is invalid: {error} If I want to search, I should put the query between <search> and </search>. If I want to read a document, I should put its URL between <fetch> and </fetch>. If I want to give the final answer, I should put it between <answer> and </answer>. Let me try again.",
    "CORRECTIVE_JSON": "Your previous turn was not a valid tool call: {error} Call one of the tools search(query), fetch(url) or answer(answer) inside <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>.",
}


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
    _, info0 = env.reset(options={"task": task})
    # a tool with no prompt text of its own is described from its description
    assert ("Return the sentences of the page at a URL that contain a word: 'URL | word': write the 'URL | word' "
            "between <find_in_page> and </find_in_page>.") in info0["messages"][0]["content"]
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


def test_default_prompts_are_made_from_the_tools_and_unchanged():
    assert system_prompt("qa", "tags") == FROZEN["QA_SYSTEM_TAGS"]
    assert system_prompt("qa", "json") == FROZEN["QA_SYSTEM_JSON"]
    assert system_prompt("research", "tags") == FROZEN["RESEARCH_SYSTEM_TAGS"]
    assert system_prompt("research", "json") == FROZEN["RESEARCH_SYSTEM_JSON"]
    assert corrective_message("no action found.", "tags") == FROZEN["CORRECTIVE"].format(error="no action found.")
    assert corrective_message("bad.", "json") == FROZEN["CORRECTIVE_JSON"].format(error="bad.")


def test_a_third_tool_is_in_every_prompt_and_schema():
    tools = (*DEFAULT_TOOLS, FindInPageTool())
    qa_tags, qa_json = system_prompt("qa", "tags", tools), system_prompt("qa", "json", tools)
    assert "write its URL, a space and the text between <find_in_page> and </find_in_page>" in qa_tags
    assert "You may search, fetch and find text in a page several times, one action per turn." in qa_tags
    assert qa_tags.index("<find_in_page>") < qa_tags.index("<answer>")  # the answer comes last
    assert "`fetch` with a URL to read a whole document, and `find_in_page` with a URL and a text" in qa_json
    assert "Search, fetch and find text in a page as often as you need" in system_prompt("research", "tags", tools)
    assert "search(query), fetch(url), find_in_page(url, text) or answer(answer)" in corrective_message("x", "json", tools)
    assert corrective_message("x", "tags", tools).endswith(
        "<find_in_page> and </find_in_page>. If I want to give the final answer, I should put it between <answer> "
        "and </answer>. Let me try again.")
    [schema] = [s for s in tool_schemas(tools) if s["function"]["name"] == "find_in_page"]
    assert schema["function"]["parameters"]["required"] == ["url", "text"]
    assert set(schema["function"]["parameters"]["properties"]) == {"url", "text"}


def _page(bm25_backend):
    hit = bm25_backend.search("Lilu demon", k=1)[0]
    doc = bm25_backend.fetch(hit.url)
    words = doc.text.split()
    return hit, doc, words[len(words) // 2]


@pytest.mark.parametrize("protocol", ["tags", "json"])
def test_find_in_page_in_both_protocols(bm25_backend, protocol):
    hit, doc, word = _page(bm25_backend)
    task = Task(task_id="t", question="Who?", answers=["x"])
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[task], tools=(*DEFAULT_TOOLS, FindInPageTool()),
                   protocol=protocol, max_turns=5, max_fetches=1, max_obs_tokens=2000)
    obs0, info0 = env.reset(options={"task": task})
    assert "find_in_page" in info0["messages"][0]["content"]  # the system prompt offers it

    def call(url, text):
        if protocol == "tags":
            return f"<find_in_page>{url} {text}</find_in_page>"
        return '<tool_call>{"name": "find_in_page", "arguments": {"url": "%s", "text": "%s"}}</tool_call>' % (url, text)

    obs, _, term, _, info = env.step(call(hit.url, word.upper()))
    assert not term and info["tool_calls"][0]["name"] == "find_in_page"
    assert info["tool_calls"][0]["arguments"] == {"url": hit.url, "text": word.upper()}
    expected = FindInPageTool().find(doc.text, word)
    assert expected and expected[0] in " ".join(obs.split())  # the passage around the match, found case-insensitively
    assert len(expected[0].split()) <= 2 * FindInPageTool.window + 1
    # its budget is max_fetches, counted apart from fetch
    obs, *_ = env.step(call(hit.url, word))
    assert "Find budget spent (1 finds)" in obs
    obs, *_ = env.step(f"<fetch>{hit.url}</fetch>" if protocol == "tags" else
                       '<tool_call>{"name": "fetch", "arguments": {"url": "%s"}}</tool_call>' % hit.url)
    assert "budget spent" not in obs
    traj = env.unwrapped.trajectory
    assert [c.name for st in traj.steps for c in st.tool_calls] == ["find_in_page", "find_in_page", "fetch"]


def test_find_in_page_bad_calls_are_observations(bm25_backend):
    hit, _, _ = _page(bm25_backend)
    task = Task(task_id="t", question="Who?", answers=["x"])
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[task], tools=(*DEFAULT_TOOLS, FindInPageTool()),
                   max_turns=6, max_fetches=5)
    env.reset(options={"task": task})
    obs, _, term, _, info = env.step(f"<find_in_page>{hit.url}</find_in_page>")  # no text to find
    assert not term and info["tool_calls"][0]["name"] == "invalid"
    assert "needs a URL, a space and the text to find" in obs and "Let me try again." in obs
    obs, *_ = env.step('<tool_call>{"name": "find_in_page", "arguments": {"url": "%s"}}</tool_call>' % hit.url)
    assert "'find_in_page' needs a non-empty string argument 'text'" in obs and "find_in_page(url, text)" in obs
    obs, *_ = env.step("<find_in_page>https://nowhere.invalid/x demon</find_in_page>")
    assert "Find failed:" in obs
    obs, *_ = env.step(f"<find_in_page>{hit.url} zzqqxx</find_in_page>")
    assert "No match for 'zzqqxx' in this document." in obs


def test_the_driver_batches_find_in_page_once_per_turn(bm25_backend):
    hit, _, word = _page(bm25_backend)
    tool = FindInPageTool()
    seen = []
    real = tool.call_batch
    tool.call_batch = lambda backend, arguments, **kw: seen.append(list(arguments)) or real(backend, arguments, **kw)
    tasks = [Task(task_id=f"t{i}", question="Who?", answers=["x"]) for i in range(3)]
    envs = [gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=tasks, tools=(*DEFAULT_TOOLS, tool)) for _ in range(3)]
    with BatchedDriver(envs) as d:
        d.reset([{"task_id": t.task_id} for t in tasks])
        out = d.step([f"<find_in_page>{hit.url} {word}</find_in_page>"] * 3)
    assert seen == [[(hit.url, word)] * 3] and d.stats["finds"] == 3
    assert all(word.lower() in o[0].lower() for o in out.values())
