"""Policies: stop-string cut, answer clean-up, spec parsing, and the OpenAI-compatible
policy against a real HTTP server on loopback speaking the chat-completions format."""

from __future__ import annotations

import json

import pytest

from drgym.errors import ConfigError, DependencyNotInstalled
from drgym.policies.factory import make_policy, parse_options, split_spec
from drgym.policies.generation import close_open_tag, cut_text_at_stop
from drgym.policies.rag import RagPolicy, clean_answer


# -- text helpers ------------------------------------------------------------------------
def test_cut_at_stop_keeps_first_stop_and_drops_pad_eos():
    # A batched row that stopped on </search> is padded with SmolLM2's pad == eos token.
    raw = " <search> Lilu demon </search><|im_end|><|im_end|><|im_end|>"
    assert cut_text_at_stop(raw, eos=("<|im_end|>",)) == (" <search> Lilu demon </search>", "stop")
    # The earliest stop string wins, even when a later one is listed first.
    assert cut_text_at_stop("<answer> 1889 </answer> <search> x </search>") == ("<answer> 1889 </answer>", "stop")
    # A real eos before any stop string ends the turn there.
    assert cut_text_at_stop("Paris is the capital.<|im_end|><|im_end|>", eos=("<|im_end|>",)) == ("Paris is the capital.", "eos")
    assert cut_text_at_stop("no end in sight", eos=("<|im_end|>",)) == ("no end in sight", "length")


def test_close_open_tag_restores_stripped_stop():
    assert close_open_tag("<think>hm</think> <search> Ed Wood nationality ") == "<think>hm</think> <search> Ed Wood nationality </search>"
    assert close_open_tag("<answer> yes") == "<answer> yes</answer>"
    assert close_open_tag("<search> a </search> plain text") == "<search> a </search> plain text"
    assert close_open_tag("plain") == "plain"


def test_clean_answer_strips_rambling():
    assert clean_answer("The answer to this question is: Montana Rifle Company.") == "Montana Rifle Company"
    assert clean_answer("Answer: 1889\nBecause the tower...") == "1889"
    assert clean_answer("<answer> Gustave Eiffel </answer>") == "Gustave Eiffel"
    assert clean_answer("So the final answer is Paris!") == "Paris"
    assert clean_answer("   \n\n") == ""


def test_spec_parsing_and_errors():
    assert split_spec("hf:smollm2") == ("hf", "smollm2")
    assert split_spec("openai:gpt-4o-mini@http://127.0.0.1:8000/v1") == ("openai", "gpt-4o-mini@http://127.0.0.1:8000/v1")
    assert split_spec("scripted") == ("scripted", "")
    with pytest.raises(ConfigError, match="Did you mean 'rag'"):
        split_spec("rags:smollm2")
    with pytest.raises(ConfigError, match="needs an argument"):
        split_spec("rag")
    assert parse_options(["max_new_tokens=32", "dtype=float32", "tools=false"]) == {
        "max_new_tokens": 32, "dtype": "float32", "tools": False}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_options(["oops"])
    with pytest.raises(ConfigError, match="no option 'bogus'"):
        make_policy("scripted", bogus=1)
    with pytest.raises(ConfigError, match="http"):
        make_policy("openai:m@ftp://x")


def test_vllm_policy_without_vllm_says_how_to_install():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    with pytest.raises(DependencyNotInstalled, match=r"drgym\[gpu\]"):
        make_policy("vllm:smollm2")


def test_rag_policy_searches_then_answers_from_passages():
    class Reader:
        name = "fake-reader"
        last_usage = []

        def __init__(self):
            self.seen = []

        def act(self, conversations, infos=None):
            self.seen.extend(conversations)
            return ["The answer is: Scott Derrickson.\nExtra line"] * len(conversations)

        def close(self):
            pass

    reader = Reader()
    rag = RagPolicy(reader, k=2, words=5)
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "Question: Who directed Sinister?"}]
    assert rag.act([conv], [{"question": "Who directed Sinister?"}]) == ["<search> Who directed Sinister? </search>"]
    conv2 = conv + [{"role": "assistant", "content": "<search> Who directed Sinister? </search>"},
                    {"role": "user", "content": "<information>...</information>"}]
    info = {"question": "Who directed Sinister?", "results": [
        {"title": "Sinister (film)", "text": "Sinister is a 2012 horror film directed by Scott Derrickson and written by him"},
        {"title": "Ethan Hawke", "text": "Ethan Hawke is an American actor"},
        {"title": "Third", "text": "never shown"}]}
    assert rag.act([conv2], [info]) == ["<answer> Scott Derrickson </answer>"]
    prompt = reader.seen[0][1]["content"]
    assert "Doc 1 (Title: Sinister (film)) Sinister is a 2012 horror ..." in prompt
    assert "Doc 2 (Title: Ethan Hawke)" in prompt and "never shown" not in prompt
    assert prompt.endswith("Question: Who directed Sinister?\nAnswer:")


def test_rtr_policy_searches_the_question_then_the_agent_answers_in_its_own_format():
    from drgym.policies.factory import check_policy
    from drgym.policies.rag import SearchFirstPolicy

    class Agent:
        name = "hf:agent"
        last_usage = []

        def __init__(self):
            self.seen = []

        def act(self, conversations, infos=None):
            self.seen.extend(conversations)
            return ["<search> my own query </search>" if len(c) < 3 else "<answer> Scott Derrickson </answer>"
                    for c in conversations]

        def close(self):
            pass

    agent = Agent()
    rtr = SearchFirstPolicy(agent, agent_spec="hf:agent")
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "Question: Who directed  Sinister?"}]
    conv2 = conv + [{"role": "assistant", "content": "<search> Who directed Sinister? </search>"},
                    {"role": "user", "content": "<information>Doc 1 ...</information>"}]
    # first turn: the question, whatever the agent would have searched; later turns: the agent's own reply
    assert rtr.act([conv, conv2]) == ["<search> Who directed Sinister? </search>", "<answer> Scott Derrickson </answer>"]
    assert agent.seen == [conv2]  # the agent saw the full conversation with the observation
    assert rtr.name == "rtr:hf:agent" and rtr.describe()["kind"] == "rtr"
    check_policy("rtr:smollm2", {"max_new_tokens": 8})
    with pytest.raises(ConfigError, match="no option"):
        check_policy("rtr:smollm2", {"k": 3})


# -- the OpenAI-compatible policy against a loopback server ---------------------------------
@pytest.fixture
def fake_openai(chat_server):
    """The shared loopback chat server (``conftest.ChatServer``: every request is checked
    against the chat protocol) with a ``handler(body, n) -> (status, payload)`` per test."""
    return chat_server, chat_server.url


def _completion(message, finish="stop", usage=(50, 7)):
    return {"id": "c1", "object": "chat.completion", "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


def test_openai_policy_native_tool_calls_parse_as_env_actions(fake_openai, monkeypatch):
    from drgym.envs.parsing import parse_action

    srv, url = fake_openai
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")

    def handler(body, n):
        last = body["messages"][-1]
        if last["role"] == "tool":
            return 200, _completion({"content": "<answer> Scott Derrickson </answer>"})
        q = last["content"].removeprefix("Question: ")
        return 200, _completion({"content": None, "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "search", "arguments": json.dumps({"query": q})}}]},
            finish="tool_calls")

    srv.handler = handler
    pol = make_policy(f"openai:fake-model@{url}", concurrency=4)
    convs = [[{"role": "system", "content": "s"}, {"role": "user", "content": f"Question: q{i}"}] for i in range(6)]
    actions = pol.act(convs)
    assert len(srv.requests) == 6
    req = srv.requests[0]
    assert srv.headers[0] == {"path": "/v1/chat/completions", "auth": "Bearer sk-test"}
    assert req["model"] == "fake-model" and [t["function"]["name"] for t in req["tools"]] == ["search", "fetch", "answer"]
    # order is preserved under concurrency; each action is a tool call the env parser reads
    for i, a in enumerate(actions):
        parsed = parse_action(a)
        assert [(c.name, c.arguments, c.protocol, c.call_id) for c in parsed.calls] == [("search", {"query": f"q{i}"}, "openai", "call_7")]
    assert [u.to_dict()["completion_tokens"] for u in pol.last_usage] == [7] * 6
    assert pol.last_usage[0].finish == "tool_calls"

    # the next turn sends the structured assistant message and the tool result with its id
    conv = convs[0] + [{"role": "assistant", "content": actions[0]},
                       {"role": "tool", "tool_call_id": "call_7", "name": "search", "content": "Doc 1 ..."}]
    srv.requests.clear()
    assert pol.act([conv]) == ["<answer> Scott Derrickson </answer>"]
    sent = srv.requests[0]["messages"]
    assert sent[2]["role"] == "assistant" and sent[2]["tool_calls"][0]["id"] == "call_7"
    assert sent[2]["tool_calls"][0]["function"] == {"name": "search", "arguments": json.dumps({"query": "q0"})}
    assert sent[3] == {"role": "tool", "tool_call_id": "call_7", "content": "Doc 1 ..."}
    pol.close()


def test_openai_policy_retries_5xx_and_falls_back_to_text_tags(fake_openai):
    srv, url = fake_openai

    overloaded = [True]

    def handler(body, n):
        if overloaded.pop() if overloaded else False:
            return 503, {"error": {"message": "overloaded"}}
        if "tools" in body:
            return 400, {"error": {"message": "tools are not supported by this model"}}
        assert body["stop"] == ["</search>", "</fetch>", "</answer>", "</tool_call>"]
        # servers drop the matched stop string
        return 200, _completion({"content": "<think>look it up</think> <search> Ed Wood nationality "})

    srv.handler = handler
    pol = make_policy(f"openai:fake@{url}", retry={"attempts": 3}, concurrency=1)
    conv = [{"role": "user", "content": "Question: Were Scott Derrickson and Ed Wood of the same nationality?"}]
    out = pol.act([conv], [{"episode_id": "e1"}])
    assert out == ["<think>look it up</think> <search> Ed Wood nationality </search>"]
    assert [("tools" in r) for r in srv.requests] == [True, True, False]  # 503 retried, 400 -> the same request in text mode
    assert pol.text_episodes == {"e1"} and pol.native_tools is True  # that episode only (tests/test_protocol.py)
    assert pol.last_usage[0].extra["tools_refused"].startswith("HTTP 400 from ")
    srv.requests.clear()
    pol.act([conv, conv], [{"episode_id": "e1"}, {"episode_id": "e2"}])
    assert sorted("tools" in r for r in srv.requests) == [False, False, True]  # e1 in text; e2 tries tools, refused
    pol.close()


def test_openai_policy_refused_request_is_an_empty_action_not_a_crash(fake_openai):
    srv, url = fake_openai
    srv.handler = lambda body, n: (400, {"error": "prompt is longer than the context"})
    pol = make_policy(f"openai:fake@{url}", retry={"attempts": 2}, tools=False)
    assert pol.act([[{"role": "user", "content": "hi"}]]) == [""]
    assert len(srv.requests) == 1 and pol.last_usage[0].finish == "error" and pol.n_errors == 1
    assert "HTTP 400" in pol.last_usage[0].extra["error"]
    pol.close()


def test_openai_policy_endpoint_down_raises_service_unavailable(fake_openai):
    from drgym.errors import ServiceUnavailableError

    srv, url = fake_openai
    srv.handler = lambda body, n: (500, {"error": "boom"})
    pol = make_policy(f"openai:fake@{url}", retry={"attempts": 2}, tools=False, concurrency=4)
    with pytest.raises(ServiceUnavailableError, match=r"policy endpoint .*/v1/chat/completions failed 2 attempt\(s\).*HTTP 500"):
        pol.act([[{"role": "user", "content": f"q{i}"}] for i in range(4)])
    # one request gives up after 2 tries; the others of the batch stop at once instead of retrying
    assert 2 <= len(srv.requests) <= 2 + 3 * 2
    pol.close()
    dead = make_policy("openai:fake@http://127.0.0.1:9/v1", retry={"attempts": 1}, tools=False)  # nothing listens on port 9
    with pytest.raises(ServiceUnavailableError, match="ConnectError"):
        dead.act([[{"role": "user", "content": "hi"}]])
    dead.close()


def test_openai_policy_waits_for_a_server_that_answered_before(fake_openai):
    srv, url = fake_openai
    # the server answers, then fails 3 times (a restart), then answers again: with 2 attempts
    # alone the second call would give up; reconnect_s keeps it trying
    srv.handler = lambda body, n: (503, {"error": "restarting"}) if 2 <= n <= 4 else (200, _completion({"content": "<answer> x </answer>"}))
    pol = make_policy(f"openai:fake@{url}", retry={"attempts": 2, "reconnect_s": 30}, tools=False)
    assert pol.act([[{"role": "user", "content": "a"}]]) == ["<answer> x </answer>"]
    assert pol.act([[{"role": "user", "content": "b"}]]) == ["<answer> x </answer>"]
    assert len(srv.requests) == 5 and pol.n_errors == 0
    pol.close()


@pytest.mark.slow
def test_hf_smollm2_batched_generation_cuts_after_stop_string():
    """Real SmolLM2 generation in a left-padded batch of 2: the row that hits the stop
    string early is padded with pad == eos tokens, which must not leak into its text."""
    pol = make_policy("hf:smollm2", max_new_tokens=40, batch_size=2, dtype="float32")
    convs = [[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
             [{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "Write two sentences about the river Danube and the cities it flows through."}]]
    out = pol.generate([pol.render(c) for c in convs], stops=("Paris",))
    assert out[0].endswith("Paris") and "<|im_end|>" not in out[0]
    assert pol.last_usage[0].finish == "stop" and pol.last_usage[0].completion_tokens <= 12
    assert "<|im_end|>" not in out[1] and len(out[1]) > len(out[0])


class _ChatMLTokenizer:
    """Just enough of a tokenizer for HFPolicy.render: SmolLM2's ChatML template."""

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=True):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_render_layouts():
    from drgym.policies.hf import HFPolicy

    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "Question: Q"},
            {"role": "assistant", "content": "<search> q </search>"},
            {"role": "user", "content": "\n\n<information>Doc 1 (Title: T) x</information>\n\n"}]
    pol = HFPolicy.__new__(HFPolicy)  # render needs only the tokenizer, layout and prefill
    pol.tokenizer, pol.prefill = _ChatMLTokenizer(), ""
    pol.layout = "chat"
    assert pol.render(conv).endswith("<|im_start|>user\n\n\n<information>Doc 1 (Title: T) x</information>\n\n<|im_end|>\n<|im_start|>assistant\n")
    # continuation: the observation continues the assistant turn, as drgym train lays it out
    pol.layout = "continuation"
    assert pol.render(conv) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQuestion: Q<|im_end|>\n<|im_start|>assistant\n"
                                "<search> q </search>\n\n<information>Doc 1 (Title: T) x</information>\n\n")
    # before the first assistant turn both layouts give the same prompt
    first = pol.render(conv[:2])
    pol.layout = "chat"
    assert pol.render(conv[:2]) == first == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQuestion: Q<|im_end|>\n<|im_start|>assistant\n"


def test_unknown_layout_is_refused_before_loading():
    from drgym.policies.hf import HFPolicy

    with pytest.raises(ConfigError, match=r"layout must be one of \('auto', 'chat', 'continuation'\), got 'flat'"):
        HFPolicy("no-such-model", layout="flat")
