"""The action parser: every protocol, and every kind of bad action becomes an ``invalid`` call."""

from __future__ import annotations

import json

import pytest
from drgym.envs.parsing import parse_action
from drgym.envs.prompts import build_messages, render_messages

from drgym.records import Task


def one(action, **kw):
    p = parse_action(action, **kw)
    assert len(p.calls) == 1, p.calls
    return p.calls[0], p


# -- Search-R1 tags -------------------------------------------------------------------
def test_tags_search_with_think():
    c, p = one("<think>Lilu is a demon; look it up.</think>\n<search> Lilu mythology </search>")
    assert (c.name, c.arguments, c.protocol, c.error) == ("search", {"query": "Lilu mythology"}, "tags", None)
    assert p.protocol == "tags"
    assert p.message == {"role": "assistant", "content": "<think>Lilu is a demon; look it up.</think>\n<search> Lilu mythology </search>"}


def test_tags_fetch_and_answer():
    c, _ = one("<fetch>https://en.wikipedia.org/wiki/Lilu_(mythology)</fetch>")
    assert (c.name, c.arguments) == ("fetch", {"url": "https://en.wikipedia.org/wiki/Lilu_(mythology)"})
    c, _ = one("So the answer is <answer> a spirit </answer>")
    assert (c.name, c.arguments) == ("answer", {"answer": "a spirit"})


def test_only_first_action_tag_counts_like_search_r1():
    c, _ = one("<search>first</search> then <search>second</search><answer>x</answer>")
    assert c.arguments == {"query": "first"}


def test_tags_inside_think_are_ignored():
    c, _ = one("<think>maybe <answer>wrong</answer></think><search>right query</search>")
    assert (c.name, c.arguments) == ("search", {"query": "right query"})


def test_completion_only_prompt_example_is_not_an_answer():
    # The system prompt carries "<answer> Beijing </answer>"; only the completion is parsed.
    prompt = render_messages(build_messages(Task("t", "Q?")))
    assert "<answer> Beijing </answer>" in prompt
    c, _ = one("I do not know yet.")
    assert c.name == "invalid" and c.error == "no action found."


@pytest.mark.parametrize(
    "action, error",
    [
        ("", "the turn is empty."),
        ("   \n ", "the turn is empty."),
        ("<think>only thinking</think>", "the turn has only <think> and no action."),
        ("<think>never closed <search>x</search>", "<think> is not closed with </think>."),
        ("<search></search>", "<search></search> is empty; put the query between the tags."),
        ("<answer>   </answer>", "<answer></answer> is empty; put the answer between the tags."),
        ("<search>Lilu", "<search> is not closed with </search>."),
        ("<search><search>Lilu</search></search>", "tags are nested inside <search>...</search>; write one action at a time."),
        ("<answer>It is <search>x</search></answer>", "tags are nested inside <answer>...</answer>; write one action at a time."),
        ("<calculate>2+2</calculate>", "unknown action <calculate>; the actions are <search>, <fetch>, <answer>."),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call><answer>y</answer>',
         "the turn mixes <tool_call> JSON with <search>/<fetch>/<answer> tags; use one protocol per turn."),
    ],
)
def test_malformed_actions(action, error):
    c, _ = one(action)
    assert c.name == "invalid"
    assert c.error == error


def test_huge_action_rejected_without_parsing():
    c, p = one("<search>" + "a " * 20_000 + "</search>", max_chars=32_000)
    assert c.name == "invalid" and c.error == "the turn is 40017 characters long; the limit is 32000."
    assert len(p.message["content"]) == 32_000


def test_non_text_action():
    c, _ = one(12345)
    assert c.name == "invalid" and c.error == "an action must be text, got int."


# -- <tool_call> JSON -----------------------------------------------------------------
def test_hermes_tool_call():
    text = '<think>x</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "Funchal"}}\n</tool_call>'
    c, p = one(text)
    assert (c.name, c.arguments, c.protocol, c.call_id) == ("search", {"query": "Funchal"}, "json", "call_0")
    assert p.message["tool_calls"] == [{"id": "call_0", "type": "function", "function": {"name": "search", "arguments": {"query": "Funchal"}}}]


def test_parallel_tool_calls_and_string_arguments():
    text = ('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"a\\"}"}</tool_call>'
            '<tool_call>{"name": "fetch", "arguments": {"url": "https://x.org/b"}}</tool_call>')
    p = parse_action(text)
    assert [(c.name, c.arguments, c.call_id) for c in p.calls] == [
        ("search", {"query": "a"}, "call_0"), ("fetch", {"url": "https://x.org/b"}, "call_1")]


def test_queries_list_expands():
    p = parse_action('<tool_call>{"name": "search", "arguments": {"queries": ["a", "b"]}}</tool_call>')
    assert [c.arguments["query"] for c in p.calls] == ["a", "b"]


@pytest.mark.parametrize(
    "text, error",
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}', "<tool_call> is not closed with </tool_call>."),
        ("<tool_call>{name: search}</tool_call>", "the <tool_call> body is not valid JSON (Expecting property name enclosed in double quotes at char 1)."),
        ('<tool_call>["search"]</tool_call>', "the <tool_call> body must be a JSON object with 'name' and 'arguments'."),
        ('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>', "unknown tool 'calculator'; the tools are search, fetch, answer."),
        ('<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>', "'search' needs a non-empty string argument 'query', got ''."),
        ('<tool_call>{"name": "search", "arguments": {"query": {"nested": "x"}}}</tool_call>', "'search' needs a non-empty string argument 'query', got {'nested': 'x'}."),
        ('<tool_call>{"name": "answer", "arguments": {"answer": "a"}}</tool_call><tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>',
         "an answer must be the only call of its turn."),
    ],
)
def test_bad_tool_calls(text, error):
    c, _ = one(text)
    assert c.name == "invalid" and c.error == error


# -- OpenAI tool_calls ----------------------------------------------------------------
def _openai(name, args, content=""):
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def test_openai_dict_and_json_string():
    for action in (_openai("fetch", {"url": "https://x.org/a"}), json.dumps(_openai("fetch", {"url": "https://x.org/a"}))):
        c, p = one(action)
        assert (c.name, c.arguments, c.protocol, c.call_id) == ("fetch", {"url": "https://x.org/a"}, "openai", "call_abc")
        assert p.protocol == "openai" and p.message["tool_calls"][0]["id"] == "call_abc"


def test_openai_message_without_tool_calls_is_the_answer():
    c, _ = one({"role": "assistant", "content": "Paris", "tool_calls": []})
    assert (c.name, c.arguments, c.protocol) == ("answer", {"answer": "Paris"}, "openai")


def test_protocol_not_accepted():
    c, _ = one("<search>x</search>", protocols=("json", "openai"))
    assert c.name == "invalid" and c.error == "the 'tags' protocol is not accepted here; use json, openai."


def test_fuzz_never_raises():
    import random

    rng = random.Random(0)
    alphabet = list("<>/{}[]\":, abcsearchfetchanswertool_callthink中文\n") + ["<search>", "</search>", "<tool_call>", "</tool_call>", "<answer>", "</think>"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        p = parse_action(text)
        assert p.calls and all(c.name in ("search", "fetch", "answer", "invalid") for c in p.calls)
