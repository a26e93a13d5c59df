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
        ("<think>never closed <search>x</search>", "<think> is not closed with </think>: the turn ended while reasoning, "
         "and nothing written inside reasoning is run. Close it with </think>, then act."),
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
    assert p.message["tool_calls"] == [{"id": "call_0", "type": "function", "function": {"name": "search", "arguments": '{"query": "Funchal"}'}}]


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


def test_a_parser_bug_surfaces_instead_of_becoming_an_invalid_action(monkeypatch):
    """The fuzz test above can fail: an exception inside the parser propagates."""
    import drgym.envs.parsing as P

    def broken(text, allowed):
        raise IndexError("bug")

    monkeypatch.setattr(P, "_parse_tags", broken)
    with pytest.raises(IndexError):
        parse_action("<search>x</search>")


@pytest.mark.parametrize("text, answer", [
    ("<answer> Paris </answer>", "Paris"),
    ("<think>maybe <answer>Rome</answer></think><answer>Paris</answer>", "Paris"),
    ("<answer>Paris</answer> then <answer>Rome</answer>", "Paris"),  # the first block counts
    ("<search>q</search>\n<information>Doc 1</information>\n<answer>Paris</answer>", "Paris"),
    ("Paris", "Paris"),  # no tags, no tool call: the text is the answer
    ("<search>capital of France</search>", None),
    ('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>', None),
    ("", None),
])
def test_one_answer_rule_for_strings_and_message_lists(text, answer):
    from drgym.envs.parsing import Parser

    p = Parser()
    assert p.parse_answer(text) == answer
    assert p.parse_answer([{"role": "user", "content": "Q?"}, {"role": "assistant", "content": text}]) == answer
    assert p.parse_answer({"role": "assistant", "content": text}) == answer


def test_env_trl_adapter_and_grpo_wrapper_read_the_same_answer(bm25_backend):
    """Three readers of one completion with two <answer> blocks agree (they used not to:
    the adapter took the last block, the GRPO wrapper the first)."""
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.records import Task
    from drgym.rewards.qa import ExactMatch
    from drgym.training.trl_adapter import TRLReward

    completion = "<answer>Paris</answer> no wait <answer>Rome</answer>"
    task = Task(task_id="t", question="Capital of France?", answers=["Paris"])
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[task], reward="em").unwrapped
    env.reset(options={"task": task})
    _, reward, term, _, info = env.step(completion)
    assert term and info["final_answer"] == "Paris" and reward == 1.0
    trl = TRLReward(ExactMatch())
    assert trl([[{"role": "user", "content": "Q"}]], [completion], answers=[["Paris"]]) == [1.0]
    wrapped = TRLReward(ExactMatch(), tasks_by_id={"t": task}, env_scored=True)  # as GRPO builds it
    assert wrapped(["Q"], [completion], task_id=["t"]) == [1.0]


# -- reasoning: what thinking models write (issue 2.3 item 1) --------------------------
GERMANY = "What is the capital of Germany?"
ISSUE_FORMAT_ECHO = ("The format says to put the answer in <answer></answer> tags. Berlin is the capital.</think>\n"
                     "<answer>Berlin</answer>")
ISSUE_REHEARSED_SEARCH = "Maybe <search>old query</search> would help, but I know it.</think>\n<answer>Berlin</answer>"


def _germany_env(backend, **kw):
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from envs_helpers import Counting

    counting = Counting(backend)
    task = Task(task_id="de", question=GERMANY, answers=["Berlin"])
    env = gym.make("drgym/SearchQA-v0", backend=counting, tasks=[task], reward="f1", **kw).unwrapped
    env.reset(options={"task": task})
    return env, counting


@pytest.mark.parametrize("action", [ISSUE_FORMAT_ECHO, ISSUE_REHEARSED_SEARCH])
def test_issue_reasoning_opened_by_the_template_ends_the_episode_with_the_answer(action, bm25_backend):
    """Issue 2.3 item 1: the completion of a template that opened <think> in the prompt.
    Before, the first read an empty <answer></answer> from the reasoning (invalid, reward 0)
    and the second ran the rehearsed search."""
    env, counting = _germany_env(bm25_backend)
    _, reward, term, trunc, info = env.step(action)
    assert (term, trunc) == (True, False)
    assert info["final_answer"] == "Berlin" and reward == 1.0 and info["reward_components"] == {"f1": 1.0}
    assert counting.batches == [] and info["invalid_actions"] == 0


@pytest.mark.parametrize("text, call", [
    # text before a </think> with no opening tag is reasoning (any case, think/thinking/reasoning)
    ("I should search.</think><search>capital of Germany</search>", ("search", "capital of Germany")),
    ("Plan: <answer>Paris</answer>?</THINK>\n<answer>Berlin</answer>", ("answer", "Berlin")),
    ("<search>x</search> is a rehearsal</thinking><fetch>https://x.org/b</fetch>", ("fetch", "https://x.org/b")),
    ("first pass</think> second pass <search>draft</search></think><answer>Berlin</answer>", ("answer", "Berlin")),  # the last close ends it
    # nested tags inside reasoning are rehearsals, not nested actions (no "tags are nested" error)
    ("<think>I'd write <answer>It is <search>x</search></answer></think><search>right query</search>", ("search", "right query")),
    ("<think>a <think>b</think> c</think><answer>Berlin</answer>", ("answer", "Berlin")),  # blocks do not nest
    ('<think><tool_call>{"name": "search", "arguments": {"query": "no"}}</tool_call></think><answer>Berlin</answer>',
     ("answer", "Berlin")),
    ('Let me call <tool_call>{"name": "fetch"}</tool_call></think>\n<tool_call>{"name": "search", "arguments": {"query": "yes"}}</tool_call>',
     ("search", "yes")),
    # an action written before a <think> that is never closed still counts
    ("<search>capital of Germany</search><think>and then", ("search", "capital of Germany")),
])
def test_reasoning_is_never_read_as_an_action(text, call):
    c, _ = one(text)
    assert (c.name, next(iter(c.arguments.values()), None)) == call, c


UNCLOSED = ("<think> is not closed with </think>: the turn ended while reasoning, and nothing written inside "
            "reasoning is run. Close it with </think>, then act.")


@pytest.mark.parametrize("text", [
    "<think>Maybe <search>old query</search>",  # a turn stopped at a rehearsed </search>
    "<think>Maybe <search>old query</search> would help, but",  # cut by the token cap
    "So: <think>",
    '<think><tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>',
    "<reasoning>Let me <answer>guess</answer>",
])
def test_an_unclosed_think_block_runs_nothing(text, bm25_backend):
    c, _ = one(text)
    assert c.name == "invalid" and c.error == UNCLOSED
    env, counting = _germany_env(bm25_backend)
    obs, reward, term, trunc, info = env.step(text)
    assert not term and not trunc and counting.batches == [] and info["invalid_actions"] == 1
    assert "Close it with </think>, then act." in obs


def test_only_reasoning_in_an_openai_message_is_not_an_answer():
    c, _ = one({"role": "assistant", "content": "Berlin? No, let me check.</think>\n", "tool_calls": []})
    assert c.name == "invalid" and c.error == "the message has neither tool calls nor content."
    c, _ = one({"role": "assistant", "content": "<think>Berlin? Let me", "tool_calls": []})
    assert c.name == "invalid" and c.error == UNCLOSED
    c, _ = one({"role": "assistant", "content": "It is <answer>Paris</answer>, no.</think>\nBerlin", "tool_calls": []})
    assert (c.name, c.arguments) == ("answer", {"answer": "Berlin"})


@pytest.mark.parametrize("text, answer", [
    (ISSUE_FORMAT_ECHO, "Berlin"),
    (ISSUE_REHEARSED_SEARCH, "Berlin"),
    ("Berlin? Or Bonn.</think>\nBerlin", "Berlin"),  # no tags after the reasoning: the text is the answer
    ("<think>maybe <answer>Bonn</answer>", None),  # unclosed: all of it is reasoning
    ("<answer>Berlin</answer><think>done", "Berlin"),
    ("Paris?</think> <search>capital of Germany</search>", None),
    ("<think>a <think>b</think> c</think><answer>Berlin</answer>", "Berlin"),
])
def test_the_answer_rule_reads_no_reasoning_for_strings_and_message_lists(text, answer):
    from drgym.envs.parsing import Parser

    p = Parser()
    assert p.parse_answer(text) == answer
    assert p.parse_answer([{"role": "user", "content": GERMANY}, {"role": "assistant", "content": text}]) == answer
    assert p.parse_answer({"role": "assistant", "content": text}) == answer


def test_env_trl_adapter_and_grpo_wrapper_read_template_opened_reasoning_alike(bm25_backend):
    from drgym.rewards.qa import F1
    from drgym.training.trl_adapter import TRLReward

    task = Task(task_id="de", question=GERMANY, answers=["Berlin"])
    trl = TRLReward(F1())
    wrapped = TRLReward(F1(), tasks_by_id={"de": task}, env_scored=True)  # as GRPO builds it
    for completion in (ISSUE_FORMAT_ECHO, ISSUE_REHEARSED_SEARCH):
        env, _ = _germany_env(bm25_backend)
        _, reward, _, _, info = env.step(completion)
        assert (info["final_answer"], reward) == ("Berlin", 1.0)
        assert trl([[{"role": "user", "content": GERMANY}]], [completion], answers=[["Berlin"]]) == [1.0]
        assert trl([[{"role": "user", "content": GERMANY}]], [[{"role": "assistant", "content": completion}]],
                   answers=[["Berlin"]]) == [1.0]
        assert wrapped([GERMANY], [completion], task_id=["de"]) == [1.0]


def test_the_judges_and_the_parser_share_one_reasoning_rule():
    import drgym.envs.parsing as P
    import drgym.judges.base as J
    from drgym.reasoning import strip_reasoning

    assert J.strip_reasoning is strip_reasoning and P.strip_reasoning is strip_reasoning
