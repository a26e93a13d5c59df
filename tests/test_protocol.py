"""OpenAI's tool-call pairing rule holds in every conversation drgym sends (issue 2.3 item 2).

An assistant message with ``tool_calls`` must be followed by exactly one ``role: tool``
message per call id, ids unique, and no tool message may answer an undeclared id. The
checker is :mod:`chat_protocol`; the loopback chat server (``conftest.ChatServer``)
runs it on every request and answers 400 on a violation, as OpenAI and vLLM do.
"""

from __future__ import annotations

import json

import pytest

from chat_protocol import message_list_errors, request_errors
from drgym.records import Task

GERMANY = Task(task_id="de", question="What is the capital of Germany?", answers=["Berlin"])
FRANCE = Task(task_id="fr", question="What is the capital of France?", answers=["Paris"])


def _native(*calls, content=None):
    """The JSON of an assistant message with native tool calls ``(id, name, arguments)``."""
    return json.dumps({"content": content, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for cid, name, args in calls]})


def _block(name, args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


MULTI = {"queries": ["Berlin", "Germany capital"]}
ISSUE_NATIVE = _native(("call_1", "search", MULTI))
ISSUE_TEXT = _block("search", MULTI)
ISSUE_MALFORMED = '<tool_call>{"name": "search", "arguments": {"query": "Berlin"</tool_call>' + _block("search", {"query": "Germany capital"})


def _env(backend, task=GERMANY, **kw):
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from envs_helpers import Counting

    counting = Counting(backend)
    kw = {"protocol": "json", "max_turns": 4, "max_searches": 4, "top_k": 2, "max_obs_tokens": 120, **kw}
    env = gym.make("drgym/SearchQA-v0", backend=counting, tasks=[task], reward="f1", **kw).unwrapped
    env.reset(options={"task": task})
    return env, counting


# -- the checker can fail ----------------------------------------------------------------
def _call(cid, name="search", args='{"query": "x"}'):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def test_the_checker_finds_each_broken_pattern_of_the_issue():
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    ok = head + [{"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]},
                 {"role": "tool", "tool_call_id": "b", "content": "rb"}, {"role": "tool", "tool_call_id": "a", "content": "ra"}]
    assert message_list_errors(ok) == []
    # what drgym sent before for the three inputs of the issue
    two_replies = head + [{"role": "assistant", "content": None, "tool_calls": [_call("call_1")]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "r1"}, {"role": "tool", "tool_call_id": "call_1", "content": "r2"}]
    assert message_list_errors(two_replies) == ["messages[2]: tool call 'call_1' has 2 tool replies (exactly 1 needed)"]
    dup_ids = head + [{"role": "assistant", "content": "", "tool_calls": [_call("call_0"), _call("call_0")]},
                      {"role": "tool", "tool_call_id": "call_0", "content": "r1"}, {"role": "tool", "tool_call_id": "call_0", "content": "r2"}]
    assert "messages[2].tool_calls[1]: id 'call_0' is repeated in the message" in message_list_errors(dup_ids)
    undeclared = head + [{"role": "assistant", "content": "", "tool_calls": [_call("call_1")]},
                         {"role": "tool", "tool_call_id": "call_0", "content": "bad JSON"}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}]
    assert message_list_errors(undeclared) == ["messages[3]: tool message answers 'call_0', which messages[2] did not declare"]
    # and the other rules
    assert message_list_errors(head + [{"role": "assistant", "content": None, "tool_calls": [_call("a")]}]) == [
        "messages[2]: tool call 'a' has 0 tool replies (exactly 1 needed)"]
    assert message_list_errors(head + [{"role": "assistant", "content": None, "tool_calls": [_call("a")]}], ended=True) == []
    assert message_list_errors(head + [{"role": "tool", "tool_call_id": "a", "content": "r"}]) == [
        "messages[2]: tool message for 'a' does not follow an assistant message with tool_calls"]
    assert message_list_errors(head + [{"role": "assistant", "content": "", "tool_calls": [_call("a", args='{"query": ')]},
                                       {"role": "tool", "tool_call_id": "a", "content": "r"}]) == [
        "messages[2].tool_calls[0]: function.arguments is not the JSON text of an object: '{\"query\": '"]
    interrupted = head + [{"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]},
                          {"role": "tool", "tool_call_id": "a", "content": "r"}, {"role": "user", "content": "u"},
                          {"role": "tool", "tool_call_id": "b", "content": "r"}]
    assert len(message_list_errors(interrupted)) == 2
    assert request_errors({"model": "m", "messages": head, "tool_choice": "auto", "stop": list("abcde")}) == [
        "tool_choice is set without tools", "stop must be a string or a list of at most 4 strings"]


# -- the env builds valid conversations ---------------------------------------------------
def test_issue_native_multi_query_call_gets_one_reply(bm25_backend):
    env, counting = _env(bm25_backend)
    obs, _, term, _, info = env.step(ISSUE_NATIVE)
    msgs = info["messages"]
    assert message_list_errors(msgs) == []
    assert counting.batches == [["Berlin", "Germany capital"]] and info["searches_left"] == 2 and not term
    assert msgs[2]["tool_calls"] == [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": json.dumps(MULTI)}}]
    assert [m["role"] for m in msgs[3:]] == ["tool"] and msgs[3]["tool_call_id"] == "call_1"
    body = msgs[3]["content"]
    assert body.startswith("Search 'Berlin':\nDoc 1 (Title: ") and "\n\nSearch 'Germany capital':\nDoc 1 (Title: " in body
    assert obs == f"\n<tool_response>\n{body}\n</tool_response>\n"


def test_issue_text_multi_query_block_is_one_declared_call(bm25_backend):
    env, counting = _env(bm25_backend)
    _, _, _, _, info = env.step(ISSUE_TEXT)
    msgs = info["messages"]
    assert message_list_errors(msgs) == []
    assert counting.batches == [["Berlin", "Germany capital"]]
    assert msgs[2] == {"role": "assistant", "content": ISSUE_TEXT, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": json.dumps(MULTI)}}]}
    assert [(m["role"], m["tool_call_id"]) for m in msgs[3:]] == [("tool", "call_0")]


def test_issue_malformed_block_is_reported_in_the_declared_calls_reply(bm25_backend):
    env, counting = _env(bm25_backend)
    _, _, _, _, info = env.step(ISSUE_MALFORMED)
    msgs = info["messages"]
    assert message_list_errors(msgs) == []
    assert counting.batches == [["Germany capital"]] and info["invalid_actions"] == 1
    assert [tc["id"] for tc in msgs[2]["tool_calls"]] == ["call_1"]
    assert [(m["role"], m["tool_call_id"]) for m in msgs[3:]] == [("tool", "call_1")]
    reply = msgs[3]["content"]
    assert reply.startswith("Your previous turn was not a valid tool call: <tool_call> block 1 of 2: the <tool_call> body is not valid JSON")
    assert "\n\nDoc 1 (Title: " in reply


ADVERSARIAL = [
    # (action, searches run, invalid actions counted)
    (ISSUE_NATIVE, 2, 0),
    (ISSUE_TEXT, 2, 0),
    (ISSUE_MALFORMED, 1, 1),
    (_native(("dup", "search", {"query": "a"}), ("dup", "search", {"query": "b"})), 2, 0),  # the server repeats an id
    (_native(("", "search", {"query": "a"}), ("call_0", "search", {"query": "b"})), 2, 0),  # a missing id meets a taken one
    (_native(("c1", "search", '{"query": "Berl'), ("c2", "fetch", {"url": "https://x.org"})), 0, 1),  # bad arguments JSON
    (_native(("c1", "browse", {"url": "u"})), 0, 1),  # unknown tool
    (_native(("c1", 7, {"query": "a"})), 0, 1),  # a name that is not a string
    (_native(("c1", "search", {"queries": ["a", "", "b"]})), 2, 1),  # one empty query among good ones
    (_native(("c1", "answer", {"answer": "Berlin"}), ("c2", "search", {"query": "a"})), 0, 1),  # an answer with a search
    (_block("search", {"query": "a"}) + "<tool_call>[1, 2]</tool_call>" + _block("fetch", {"url": "https://x.org"}), 1, 1),
    ("<tool_call>{oops}</tool_call><tool_call>not json</tool_call>", 0, 2),  # nothing declared: a user turn
    ('<tool_call>{"arguments": {"query": "a"}}</tool_call>', 0, 1),  # no name
    (_block("search", {"query": "a"}) + "<answer>Berlin</answer>", 0, 1),  # two protocols
    ("<think>" + _block("search", {"query": "rehearsed"}) + "</think>" + _block("search", {"query": "a"}), 1, 0),
    (json.dumps({"content": "", "tool_calls": ["not an object", {"id": "c9", "function": {"name": "search", "arguments": "{\"query\": \"a\"}"}}]}), 1, 1),
]


@pytest.mark.parametrize("action, searches, invalid", ADVERSARIAL)
def test_every_adversarial_turn_leaves_a_valid_conversation(action, searches, invalid, bm25_backend):
    env, counting = _env(bm25_backend)
    _, _, term, trunc, info = env.step(action)
    assert message_list_errors(info["messages"]) == []
    assert sum(len(b) for b in counting.batches) == searches and info["invalid_actions"] == invalid
    assert not term and not trunc
    # and the episode goes on to a valid end
    _, reward, term, _, info = env.step(_native(("fin", "answer", {"answer": "Berlin"})))
    assert term and reward == 1.0 and message_list_errors(info["messages"], ended=True) == []


def test_a_refused_turn_answers_every_call_it_declared(bm25_backend):
    env, counting = _env(bm25_backend, accept=("tags", "json"))  # OpenAI messages not accepted
    _, _, _, _, info = env.step(_native(("a", "search", {"query": "x"}), ("b", "fetch", {"url": "https://x.org"})))
    msgs = info["messages"]
    assert message_list_errors(msgs) == [] and counting.batches == []
    assert [m["tool_call_id"] for m in msgs[3:]] == ["a", "b"]
    assert all("the 'openai' protocol is not accepted here" in m["content"] for m in msgs[3:])


# -- every request the policy sends, through the checking server ----------------------------------
def _completion(message, finish="stop"):
    return {"id": "c", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def _as_reply(action: str):
    """What a server returns for one scripted action: native calls or text content."""
    try:
        msg = json.loads(action)
    except json.JSONDecodeError:
        return _completion({"content": action})
    return _completion({"content": msg.get("content"), "tool_calls": msg["tool_calls"]}, "tool_calls")


def test_adversarial_episodes_through_the_policy_send_only_valid_requests(chat_server, bm25_backend):
    """Each episode plays adversarial turns (ADVERSARIAL, in order) through ``openai:``
    against the checking server, then answers. Every request the policy sends (turns 2 and
    later carry the earlier calls and their replies) passes the checker, and no request
    was refused (a refusal would also have switched episodes to text tags)."""
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.envs.driver import BatchedDriver
    from drgym.policies.openai import OpenAIPolicy

    script = [a for a, _, _ in ADVERSARIAL]
    per_episode = 4
    episodes = [script[i:i + per_episode] + [_native(("fin", "answer", {"answer": "Berlin"}))]
                for i in range(0, len(script), per_episode)]
    tasks = [Task(task_id=f"t{i}", question=f"Question {i}: what is the capital of Germany?", answers=["Berlin"])
             for i in range(len(episodes))]

    def handler(body, n):
        question = body["messages"][1]["content"]
        i = int(question.split("Question ")[1].split(":")[0])
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return 200, _as_reply(episodes[i][turn])

    chat_server.handler = handler
    pol = OpenAIPolicy("fake", chat_server.url, concurrency=2, retry={"attempts": 1})
    envs = [gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=tasks, reward="f1", protocol="json",
                     max_turns=per_episode + 1, max_searches=10, top_k=1, max_obs_tokens=60).unwrapped for _ in range(2)]
    with BatchedDriver(envs) as driver:
        trajs = driver.run(pol, [{"task": t} for t in tasks])
    pol.close()
    assert chat_server.violations == []
    assert len(chat_server.requests) == sum(len(e) for e in episodes) and all("tools" in r for r in chat_server.requests)
    assert pol.n_errors == 0 and pol.n_repairs == 0 and pol.text_episodes == set()
    assert [(t.final_answer, t.reward) for t in trajs] == [("Berlin", 1.0)] * len(episodes)
    for t in trajs:
        assert message_list_errors(t.messages, ended=True) == []


def test_a_400_switches_only_its_own_episode_to_text_tags(chat_server, bm25_backend):
    """The server refuses ``tools`` for the Germany episode only (as a server that rejects
    a tool schema in one prompt would): that episode is asked again without tools and goes
    on in text tags; the France episode keeps function calling."""
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.envs.driver import BatchedDriver
    from drgym.policies.openai import OpenAIPolicy

    def handler(body, n):
        msgs = body["messages"]
        germany = "Germany" in msgs[1]["content"]
        turn = sum(1 for m in msgs if m["role"] == "assistant")
        if germany and "tools" in body:
            return 400, {"error": {"message": "tool schema not supported here", "type": "invalid_request_error"}}
        if germany:
            assert body["stop"][:2] == ["</search>", "</fetch>"]
            return 200, _completion({"content": ["<search> Germany capital ", "<answer> Berlin "][turn]})
        return 200, _as_reply([_native(("s1", "search", {"query": "France capital"})),
                               _native(("a1", "answer", {"answer": "Paris"}))][turn])

    chat_server.handler = handler
    pol = OpenAIPolicy("fake", chat_server.url, concurrency=2, retry={"attempts": 1})
    envs = [gym.make("drgym/SearchQA-v0", backend=bm25_backend, tasks=[GERMANY, FRANCE], reward="f1",
                     max_turns=3, top_k=1, max_obs_tokens=60).unwrapped for _ in range(2)]
    with BatchedDriver(envs) as driver:
        trajs = driver.run(pol, [{"task": GERMANY}, {"task": FRANCE}])
    pol.close()
    assert [(t.task_id, t.final_answer, t.reward) for t in trajs] == [("de", "Berlin", 1.0), ("fr", "Paris", 1.0)]
    assert pol.text_episodes == {trajs[0].episode_id} and pol.native_tools is True and pol.n_errors == 0
    de = [r for r in chat_server.requests if "Germany" in r["messages"][1]["content"]]
    fr = [r for r in chat_server.requests if "France" in r["messages"][1]["content"]]
    assert [("tools" in r) for r in de] == [True, False, False]  # refused once, then text tags for the episode
    assert [("tools" in r) for r in fr] == [True, True]
    assert fr[1]["messages"][3] == {"role": "tool", "tool_call_id": "s1", "content": fr[1]["messages"][3]["content"]}


def test_a_400_that_is_not_about_tools_fails_the_turn_and_switches_nothing(chat_server):
    from drgym.policies.openai import OpenAIPolicy

    chat_server.handler = lambda body, n: (400, {"error": {"message": "This model's maximum context length is 8192 tokens"}})
    pol = OpenAIPolicy("fake", chat_server.url, retry={"attempts": 1})
    out = pol.act([[{"role": "user", "content": "Q"}]], [{"episode_id": "e1"}])
    pol.close()
    assert out == [""] and pol.last_usage[0].finish == "error" and pol.n_errors == 1
    assert [("tools" in r) for r in chat_server.requests] == [True, False] and pol.text_episodes == set()


def test_to_api_messages_repairs_any_conversation_and_counts_it(chat_server):
    """Conversations that do not come from the env (hand-made, or older trajectories)
    are made valid before they are sent, and each repair is counted."""
    from drgym.policies.openai import OpenAIPolicy

    chat_server.handler = lambda body, n: (200, _completion({"content": "<answer>Berlin</answer>"}))
    pol = OpenAIPolicy("fake", chat_server.url, retry={"attempts": 1}, concurrency=1)
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    broken = [
        head + [{"role": "assistant", "content": ISSUE_NATIVE},  # JSON content, two replies to one id
                {"role": "tool", "tool_call_id": "call_1", "content": "r1"}, {"role": "tool", "tool_call_id": "call_1", "content": "r2"}],
        head + [{"role": "assistant", "content": ISSUE_TEXT, "tool_calls": [_call("call_0"), _call("call_0")]},
                {"role": "tool", "tool_call_id": "call_0", "content": "r1"}, {"role": "tool", "tool_call_id": "call_0", "content": "r2"}],
        head + [{"role": "assistant", "content": ISSUE_MALFORMED, "tool_calls": [_call("call_1", args='{"query": ')]},
                {"role": "tool", "tool_call_id": "call_0", "content": "bad JSON"}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}],
        head + [{"role": "tool", "tool_call_id": "zz", "content": "stray"}],
    ]
    assert pol.act(broken) == ["<answer>Berlin</answer>"] * 4
    pol.close()
    assert chat_server.violations == [] and pol.n_repairs == 6
    sent = [r["messages"] for r in chat_server.requests]
    assert sent[0][3:] == [{"role": "tool", "tool_call_id": "call_1", "content": "r1\n\nr2"}]
    assert [tc["id"] for tc in sent[1][2]["tool_calls"]] == ["call_0", "call_0_1"]
    assert sent[1][3:] == [{"role": "tool", "tool_call_id": "call_0", "content": "r1\n\nr2"},
                           {"role": "tool", "tool_call_id": "call_0_1", "content": "No result."}]
    assert sent[2][2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert sent[2][3:] == [{"role": "tool", "tool_call_id": "call_1", "content": "r"}, {"role": "user", "content": "bad JSON"}]
    assert sent[3][2] == {"role": "user", "content": "stray"}
