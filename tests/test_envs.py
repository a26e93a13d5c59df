"""SearchQAEnv and DeepResearchEnv: Gymnasium conformance, actions, budgets, rewards, determinism."""

from __future__ import annotations

import json

import drgym.envs  # noqa: F401  (registers the ids)
import gymnasium as gym
import pytest
from drgym.envs.deepresearch import DeepResearchEnv, extract_citations
from drgym.envs.searchqa import SearchQAEnv
from drgym.envs.text import UnicodeText, count_tokens
from drgym.rewards.qa import F1, ExactMatch
from envs_helpers import FailingBackend
from gymnasium.utils.env_checker import check_env

from drgym.errors import ConfigError
from drgym.records import Task

LILU = "hotpotqa-5a77ec115542992a6e59dff7"  # "If Gallu is a demon Lilu is what?" -> "a spirit"


@pytest.fixture
def qa(bm25_backend):
    return gym.make("drgym/SearchQA-v0", backend=bm25_backend)


def run(env, actions, **reset_kw):
    obs, info = env.reset(**reset_kw)
    out = [(obs, 0.0, False, False, info)]
    for a in actions:
        out.append(env.step(a))
        if out[-1][2] or out[-1][3]:
            break
    return out


# -- Gymnasium conformance ------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["drgym/SearchQA-v0", "drgym/DeepResearch-v0"])
def test_check_env(env_id, bm25_backend):
    env = gym.make(env_id, backend=bm25_backend)
    check_env(env.unwrapped)
    assert env.spec.nondeterministic is False


def test_web_ids_are_nondeterministic(bm25_backend, caplog):
    class Web(FailingBackend):
        deterministic = False

    env = drgym.envs.make_env("qa", backend=Web(bm25_backend))
    assert env.spec.id == "drgym/SearchQA-Web-v0" and env.spec.nondeterministic is True
    env.reset(seed=0)
    assert not caplog.records
    gym.make("drgym/SearchQA-v0", backend=Web(bm25_backend)).reset(seed=0)
    assert "drgym/SearchQA-v0 is registered as deterministic but backend 'failing' is not" in caplog.text
    assert drgym.envs.make_env("research", backend=bm25_backend).spec.id == "drgym/DeepResearch-v0"


def test_unicode_text_space():
    space = UnicodeText(max_length=30)
    assert "Gallu est un démon 中文 😀\n" in space
    assert "x" * 31 not in space and b"bytes" not in space
    assert gym.spaces.Text(20).contains("a b") is False  # why the subclass exists
    space.seed(0)
    assert all(s in space for s in (space.sample() for _ in range(50)))


def test_bad_arguments(bm25_backend):
    with pytest.raises(ConfigError, match=r"^max_turns must be an integer >= 1, got 0\.$"):
        SearchQAEnv(backend=bm25_backend, max_turns=0)
    with pytest.raises(ConfigError, match=r"^Unknown task set 'hotpotqa-de'\. Did you mean 'hotpotqa-dev'\?"):
        SearchQAEnv(backend=bm25_backend, tasks="hotpotqa-de")
    with pytest.raises(ConfigError, match=r"^protocol must be 'tags' or 'json', got 'xml'\.$"):
        SearchQAEnv(backend=bm25_backend, protocol="xml")
    with pytest.raises(ConfigError, match=r"^backend must be a drgym SearchBackend, got str\.$"):
        SearchQAEnv(backend="local")


# -- reset / task choice / determinism --------------------------------------------------
def test_reset_chooses_task_by_seed_and_options(qa):
    _, a = qa.reset(seed=7)
    _, b = qa.reset(seed=7)
    assert a["task_id"] == b["task_id"] and a["episode_id"] == b["episode_id"]
    seen = {qa.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert len(seen) > 10  # the seed really drives the choice
    obs, info = qa.reset(options={"task_id": LILU})
    assert obs.endswith("Question: If Gallu is a demon Lilu is what?")
    assert info["messages"][0]["role"] == "system" and info["messages"][1] == {"role": "user", "content": "Question: If Gallu is a demon Lilu is what?"}
    assert (info["turns_left"], info["searches_left"], info["fetches_left"]) == (4, 3, 2)
    assert qa.reset(options={"task_index": 3})[1]["task_id"] == qa.unwrapped.tasks[3].task_id
    with pytest.raises(ConfigError, match="Unknown task_id 'nope'"):
        qa.reset(options={"task_id": "nope"})


def test_same_actions_same_observations(bm25_backend):
    actions = ["<search> Lilu demon mythology </search>", "<fetch>https://en.wikipedia.org/wiki/Lilu_(mythology)</fetch>",
               "bad", "<answer> a spirit </answer>"]
    runs = []
    for _ in range(2):
        env = gym.make("drgym/SearchQA-v0", backend=bm25_backend)
        steps = run(env, actions, seed=3, options={"task_id": LILU})
        runs.append(steps)
    for s1, s2 in zip(*runs):
        assert s1[:4] == s2[:4]
    t1, t2 = runs[0][-1][4]["trajectory"], runs[1][-1][4]["trajectory"]
    d1, d2 = t1.to_dict(), t2.to_dict()
    for d in (d1, d2):
        d.pop("timings")
        for s in d["steps"]:
            s.pop("latency_s")
    assert d1 == d2


# -- a whole episode --------------------------------------------------------------------
def test_episode_search_fetch_answer(qa, bm25_backend):
    steps = run(qa, ["<think>Find Lilu.</think><search> Lilu (mythology) demon </search>",
                     "<fetch> https://en.wikipedia.org/wiki/Lilu_(mythology) </fetch>",
                     "<answer> a spirit </answer>"], options={"task_id": LILU})
    obs, r, term, trunc, info = steps[1]
    assert obs.startswith("\n\n<information>Doc 1 (Title: Lilu (mythology), URL: https://en.wikipedia.org/wiki/Lilu_(mythology)) ")
    assert obs.endswith("</information>\n\n") and obs.count("\nDoc ") == 2
    assert (r, term, trunc) == (0.0, False, False)
    assert info["tool_calls"] == [{"name": "search", "arguments": {"query": "Lilu (mythology) demon"}, "protocol": "tags", "error": None, "call_id": None}]
    assert [d["rank"] for d in info["results"]] == [1, 2, 3] and info["results"][0]["title"] == "Lilu (mythology)"
    assert info["messages"][-1] == {"role": "user", "content": obs} and info["messages"][-2]["role"] == "assistant"
    assert (info["turns_left"], info["searches_left"], info["fetches_left"]) == (3, 2, 2)
    obs, r, term, trunc, info = steps[2]
    assert "A lilu or lilû is a masculine Akkadian word for a spirit, related to Alû, demon." in obs
    assert len(info["results"]) == 1 and info["results"][0]["url"] == "https://en.wikipedia.org/wiki/Lilu_(mythology)"
    obs, r, term, trunc, info = steps[3]
    assert (obs, r, term, trunc) == ("", 1.0, True, False)
    assert info["final_answer"] == "a spirit" and info["reward_components"] == {"f1": 1.0}
    traj = info["trajectory"]
    assert traj.env_id == "drgym/SearchQA-v0" and traj.task_id == LILU and traj.terminated and not traj.truncated
    assert traj.reward == 1.0 and traj.count("search") == 1 and traj.count("fetch") == 1
    assert traj.metadata["turns"] == 3 and len(traj.steps) == 3
    assert set(traj.timings) >= {"search", "env", "reward"}
    with pytest.raises(gym.error.ResetNeeded):
        qa.unwrapped.step("<answer>again</answer>")


def test_json_and_openai_protocols(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, protocol="json", reward=ExactMatch())
    env.reset(options={"task_id": LILU})
    obs, *_, info = env.step('<tool_call>{"name": "search", "arguments": {"query": "Lilu mythology"}}</tool_call>')
    tool_msg = info["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_0" and tool_msg["name"] == "search"
    # the observation is the tool message as it continues an assistant turn (a <tool_response> block)
    assert obs == f"\n<tool_response>\n{tool_msg['content']}\n</tool_response>\n"
    assert tool_msg["content"].startswith("Doc 1 (Title: Lilu (mythology)")
    assert info["messages"][-2]["tool_calls"][0]["function"]["name"] == "search"
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c7", "type": "function", "function": {
        "name": "fetch", "arguments": json.dumps({"url": "https://en.wikipedia.org/wiki/Lilu_(mythology)"})}}]}
    obs, *_, info = env.step(call)
    assert info["messages"][-1]["tool_call_id"] == "c7" and "masculine Akkadian word" in obs
    obs, r, term, trunc, info = env.step(json.dumps({"role": "assistant", "content": "A spirit.", "tool_calls": []}))
    assert (r, term) == (1.0, True) and info["reward_components"] == {"em": 1.0}


# -- invalid actions --------------------------------------------------------------------
@pytest.mark.parametrize(
    "action, error",
    [
        ("", "the turn is empty."),
        ("<search><search>Lilu</search></search>", "tags are nested inside <search>...</search>; write one action at a time."),
        ("<search>x</search><tool_call>{}</tool_call>", "the turn mixes <tool_call> JSON with <search>/<fetch>/<answer> tags; use one protocol per turn."),
        ("<search>" + "Lilu " * 7000 + "</search>", "the turn is 35017 characters long; the limit is 32000."),
        ("<browse>x</browse>", "unknown action <browse>; the actions are <search>, <fetch>, <answer>."),
    ],
)
def test_invalid_action_is_a_corrective_observation(bm25_backend, action, error):
    backend = FailingBackend(bm25_backend)
    env = gym.make("drgym/SearchQA-v0", backend=backend, format_penalty=0.25)
    env.reset(options={"task_id": LILU})
    obs, r, term, trunc, info = env.step(action)
    assert obs == "\n" + f"My previous action is invalid: {error} If I want to search, I should put the query between <search> and </search>. If I want to read a document, I should put its URL between <fetch> and </fetch>. If I want to give the final answer, I should put it between <answer> and </answer>. Let me try again." + "\n"
    assert (r, term, trunc) == (0.0, False, False)
    assert info["invalid_actions"] == 1 and info["tool_calls"][0]["name"] == "invalid"
    assert info["searches_left"] == 3  # nothing was charged
    obs, r, term, trunc, info = env.step("<answer>a spirit</answer>")
    assert r == pytest.approx(1.0 - 0.25) and info["reward_components"] == {"f1": 1.0, "format_penalty": -0.25}


def test_invalid_json_call_gets_a_tool_message(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, protocol="json")
    env.reset(options={"task_id": LILU})
    obs, *_, info = env.step('<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>')
    assert info["messages"][-1]["role"] == "tool" and info["messages"][-1]["tool_call_id"] == "call_0"
    assert info["messages"][-1]["content"].startswith("Your previous turn was not a valid tool call: unknown tool 'calculator'")
    assert obs == f"\n<tool_response>\n{info['messages'][-1]['content']}\n</tool_response>\n"


# -- budgets ----------------------------------------------------------------------------
def test_max_turns_truncates(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, max_turns=2)
    steps = run(env, ["<search>Lilu</search>", "<search>Gallu</search>"], options={"task_id": LILU})
    _, r, term, trunc, info = steps[-1]
    assert (term, trunc, r) == (False, True, 0.0)  # F1 of no answer
    assert steps[-1][0] == "\n\n<information>This was the last turn, so the search was not run; no answer was given.</information>\n\n"
    assert info["final_answer"] is None and info["reward_components"] == {"f1": 0.0}
    assert bm25_backend.calls[-1] == ["Lilu"]  # the last-turn search never reached the backend


def test_max_searches_refuses(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, max_searches=1, max_turns=5)
    env.reset(options={"task_id": LILU})
    env.step("<search>Lilu</search>")
    n_calls = len(bm25_backend.calls)
    obs, r, term, trunc, info = env.step("<search>Gallu</search>")
    assert obs == "\n\n<information>Search budget spent (1 searches); give your answer now.</information>\n\n"
    assert len(bm25_backend.calls) == n_calls and info["searches_left"] == 0 and (term, trunc) == (False, False)


def test_max_fetches_refuses(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, max_fetches=0)
    env.reset(options={"task_id": LILU})
    obs, *_ = env.step("<fetch>https://en.wikipedia.org/wiki/Lilu_(mythology)</fetch>")
    assert obs == "\n\n<information>Fetch budget spent (0 fetches); give your answer now.</information>\n\n"


def test_max_obs_tokens_cuts_results(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, max_obs_tokens=60, top_k=3)
    env.reset(options={"task_id": LILU})
    obs, *_, info = env.step("<search>Lilu mythology demon</search>")
    full = sum(count_tokens(d["text"]) for d in info["results"])
    assert full > 100  # the passages are longer than the budget ...
    assert count_tokens(obs) <= 60 + 3  # ... and each of the 3 items is cut to 20 tokens + " …"
    assert obs.count(" …") == 3


def test_max_total_obs_tokens_truncates(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, max_total_obs_tokens=100, max_turns=10)
    env.reset(options={"task_id": LILU})
    _, _, term, trunc, info = env.step("<search>Lilu</search>")
    assert info["obs_tokens"] > 100 and (term, trunc) == (False, True)


# -- backend failures -----------------------------------------------------------------
def test_backend_errors_are_shown_not_raised(bm25_backend):
    env = gym.make("drgym/SearchQA-v0", backend=FailingBackend(bm25_backend))
    env.reset(options={"task_id": LILU})
    obs, r, term, trunc, info = env.step("<search>fail please</search>")
    msg = "Search failed: BackendUnavailableError: search service unreachable after 3 retries"
    assert obs == f"\n\n<information>{msg}</information>\n\n" and info["error"] == msg
    obs, *_, info = env.step("<fetch>https://example.org/missing</fetch>")
    assert info["error"] == "Fetch failed: DocumentNotFoundError: No document has URL 'https://example.org/missing'."
    traj = env.unwrapped.trajectory
    assert traj.steps[0].error == msg and traj.steps[1].error.startswith("Fetch failed")


def test_failing_reward_is_recorded(bm25_backend):
    class Broken(F1):
        name = "broken"

        def score(self, episodes):
            raise RuntimeError("judge down")

    env = gym.make("drgym/SearchQA-v0", backend=bm25_backend, reward=Broken())
    env.reset(options={"task_id": LILU})
    _, r, term, _, info = env.step("<answer>x</answer>")
    assert (r, term) == (0.0, True) and info["reward_components"] == {"broken": None}
    assert info["trajectory"].metadata["reward_error"] == "RuntimeError: judge down"


# -- DeepResearch -------------------------------------------------------------------------
def test_deepresearch_sources_and_citations(bm25_backend):
    env = gym.make("drgym/DeepResearch-v0", backend=bm25_backend, top_k=2)
    obs, info = env.reset(options={"task_index": 0})
    assert info["kind"] == "research" and obs.split("\n\n")[-1].startswith("Research task: ")
    assert "scores 0 on citation quality" in info["messages"][0]["content"]
    o1, *_ = env.step("<search>Lilu mythology</search>")
    o2, *_ = env.step("<search>Funchal Madeira</search>")
    assert o1.startswith("\n\n<information>[1] (Title: ") and "\n[2] (Title: " in o1
    assert o2.startswith("\n\n<information>[3] (Title: ")
    src = env.unwrapped.sources
    report = (f"Lilu is a masculine Akkadian word for a spirit [1]. Funchal is in Madeira [3][4].\n"
              f"It lies on the Atlantic {src[3]}.")
    _, r, term, trunc, info = env.step(f"<answer>{report}</answer>")
    assert term and r == 0.0 and info["reward_components"] == {}
    meta = info["trajectory"].metadata
    assert [s["n"] for s in meta["sources"]] == [1, 2, 3, 4]
    assert meta["citations"] == [
        {"claim": "Lilu is a masculine Akkadian word for a spirit.", "urls": [src[1]], "markers": [1]},
        {"claim": "Funchal is in Madeira.", "urls": [src[3], src[4]], "markers": [3, 4]},
        {"claim": "It lies on the Atlantic.", "urls": [src[3]], "markers": []},
    ]


def test_reward_sees_resolved_markers(bm25_backend):
    from drgym.envs.deepresearch import resolve_markers

    from drgym.records import Reward, RewardOutput

    class Seen(Reward):
        name = "seen"
        answers: list[str] = []

        def score(self, episodes):
            self.answers.extend(e.answer for e in episodes)
            return RewardOutput([0.5])

    rw = Seen()
    env = gym.make("drgym/DeepResearch-v0", backend=bm25_backend, top_k=2, reward=rw)
    env.reset(options={"task_index": 0})
    env.step("<search>Lilu mythology</search>")
    src = env.unwrapped.sources
    _, r, *_, info = env.step("<answer>Lilu is a spirit [1, 2]. Unknown [9].</answer>")
    assert r == 0.5 and info["final_answer"] == "Lilu is a spirit [1, 2]. Unknown [9]."
    assert rw.answers == [f"Lilu is a spirit [1]({src[1]})[2]({src[2]}). Unknown [9]."]
    assert resolve_markers("see [2-3]", {2: "u2", 3: "u3"}) == "see [2](u2)[3](u3)"


def test_bibliography_only_report_has_no_inline_citations():
    report = "Lilu is a spirit. Gallu is a demon.\n\nReferences\n[1] https://en.wikipedia.org/wiki/Lilu\n[2] https://en.wikipedia.org/wiki/Gallu"
    claims = extract_citations(report, {})
    assert [c["claim"] for c in claims] == ["Lilu is a spirit.", "Gallu is a demon.", "References"]
    assert all(c["urls"] == [] for c in claims)
    # ... while a marker in the text resolves through the bibliography line
    claims = extract_citations("Lilu is a spirit [1].\n[1] https://en.wikipedia.org/wiki/Lilu", {1: "https://other.org"})
    assert claims == [{"claim": "Lilu is a spirit.", "urls": ["https://en.wikipedia.org/wiki/Lilu"], "markers": [1]}]
    # inline URLs keep balanced parentheses and drop sentence punctuation
    claims = extract_citations("A lilu is a spirit (https://en.wikipedia.org/wiki/Lilu_(mythology)).", {})
    assert claims == [{"claim": "A lilu is a spirit ().", "urls": ["https://en.wikipedia.org/wiki/Lilu_(mythology)"], "markers": []}]


def test_chinese_research_task(bm25_backend):
    env = DeepResearchEnv(backend=bm25_backend, tasks="drb-zh")
    obs, info = env.reset(seed=0)
    assert obs in env.observation_space and any("\u4e00" <= ch <= "\u9fff" for ch in obs)
    obs, *_ = env.step("<search>中国 中产 收入</search>")
    assert obs in env.observation_space


def test_task_list_and_task_option(bm25_backend):
    t = Task("mine-1", "Where was Lilu?", ["Mesopotamia"])
    env = SearchQAEnv(backend=bm25_backend, tasks=[t])
    assert env.reset(seed=1)[1]["task_id"] == "mine-1"
    other = Task("mine-2", "Who is Gallu?", ["a demon"])
    assert env.reset(options={"task": other})[1]["question"] == "Who is Gallu?"
    with pytest.raises(ConfigError, match=r"^tasks must be Task records, got a dict\.$"):
        SearchQAEnv(backend=bm25_backend, tasks=[{"task_id": "x"}])


def test_token_count_and_truncation():
    from drgym.envs.text import truncate_tokens

    assert count_tokens("Lilu is a spirit, related to Alû.") == 7
    assert count_tokens("中文 ab, c") == 4  # each CJK character is one token
    assert truncate_tokens("a b  c d", 2) == ("a b …", True)
    assert truncate_tokens("a b", 2) == ("a b", False)


def test_render_ansi(bm25_backend):
    env = SearchQAEnv(backend=bm25_backend, render_mode="ansi")
    env.reset(options={"task_id": LILU})
    env.step("<search>Lilu</search>")
    text = env.render()
    assert text.startswith("[system] You answer questions") and "\n\n[user] Question: If Gallu is a demon Lilu is what?" in text
    assert "\n\n[assistant] <search>Lilu</search>\n\n[user] \n\n<information>Doc 1 (Title: " in text
    assert SearchQAEnv(backend=bm25_backend).render() is None
