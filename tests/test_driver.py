"""Rollout plumbing: the batched driver, the scripted policy, vector envs, trajectory JSONL."""

from __future__ import annotations

import drgym.envs  # noqa: F401
import gymnasium as gym
import pytest
from drgym.envs.driver import BatchedDriver, read_trajectories, write_trajectories
from drgym.envs.task_loaders import load_tasks
from drgym.rewards.qa import ExactMatch, exact_match, token_f1
from envs_helpers import Counting, FailingBackend

from drgym.policies.scripted import ScriptedPolicy, answer_span


def make_envs(backend, n, **kw):
    return [gym.make("drgym/SearchQA-v0", backend=backend, **kw) for _ in range(n)]


# -- hand-checked scores of the scripted policy ----------------------------------------
# Each case: task, the span the scripted policy answers after BM25 (tests/envs_helpers.py)
# over the HippoRAG paragraphs, and EM / F1 computed by hand with SQuAD normalisation
# (lower-case, drop punctuation and a/an/the):
#   "Columbus" vs "Columbus, Ohio": tokens {columbus} vs {columbus, ohio}: P=1, R=1/2, F1=2/3.
#   "Michael Edwards" vs 'Eddie "The Eagle" Edwards' -> {eddie, eagle, edwards}: 1 common,
#       P=1/2, R=1/3, F1=2*(1/6)/(5/6)=0.4.
#   "William Forrest Winter" vs "William Winter": P=2/3, R=1, F1=0.8.
#   "1998" vs "1998": EM 1, F1 1.   "Akkadian" vs "a spirit": 0, 0.
HAND_CASES = [
    ("hotpotqa-5ab3c131554299233954ff9c", "Two Dollar Radio", "Columbus", 0.0, 2 / 3),
    ("hotpotqa-5ac199145542994ab5c67d89", 'Eddie &quot;The Eagle&quot; Edwards', "Michael Edwards", 0.0, 0.4),
    ("hotpotqa-5adbfb9955429947ff17388f", "William Winter (politician)", "William Forrest Winter", 0.0, 0.8),
    ("hotpotqa-5ae77176554299540e5a5593", "How to Eat", "1998", 1.0, 1.0),
    ("hotpotqa-5a77ec115542992a6e59dff7", "Lilu (mythology)", "Akkadian", 0.0, 0.0),
]


def test_scripted_policy_hand_checked_scores(bm25_backend):
    backend = Counting(bm25_backend)
    with BatchedDriver(make_envs(backend, 3)) as driver:
        trajs = driver.run(ScriptedPolicy(), [{"task_id": c[0]} for c in HAND_CASES])
    assert [t.task_id for t in trajs] == [c[0] for c in HAND_CASES]
    tasks = {t.task_id: t for t in load_tasks("hotpotqa-dev")}
    for traj, (tid, fetched_title, answer, em, f1) in zip(trajs, HAND_CASES):
        assert [c.name for s in traj.steps for c in s.tool_calls] == ["search", "fetch", "answer"]
        assert traj.steps[0].tool_calls[0].arguments["query"] == tasks[tid].question
        assert traj.steps[1].results[0]["title"] == fetched_title
        assert traj.final_answer == answer
        assert traj.reward == pytest.approx(f1) and traj.reward_components == {"f1": pytest.approx(f1)}
        assert exact_match(answer, tasks[tid].answers) == em and token_f1(answer, tasks[tid].answers) == pytest.approx(f1)
        assert traj.terminated and traj.metadata["policy"] == "scripted" and traj.timings["generation"] >= 0
    # 5 episodes over 3 envs: turn 1 searches 3, turn 2 fetches, turn 3 answers and refills
    # 2 envs, which search in turn 4: one search_batch per turn that searches.
    assert [len(b) for b in backend.batches] == [3, 2]


def test_answer_span_rules():
    text = "The Exies are an American rock band formed in Los Angeles in 1997. Scott Stevens sang."
    assert answer_span(text, "Which American band was formed in 1997?") == "Exies"
    assert answer_span(text, "Where were The Exies formed?") == "American"
    assert answer_span("Hank Williams and Audrey Williams. It was", "Whose son?") == "Hank Williams and Audrey Williams"
    assert answer_span("in 1997 and 2001", "Formed in 1997?") == "2001"
    assert answer_span("all lower case", "q", title="Fallback") == "Fallback"


# The same policy over the default corpus (wiki-default, 21,126 passages) with the
# default hybrid engine (query encoder onnx-int8; with torch the fourth case's first hit
# is "1997–98 Orlando Magic season", with the same answer); EM / F1 by hand as above:
#   "Jack Owens" vs "Jack Owens": 1, 1.   "Richard David Bach" vs itself: 1, 1.
#   "Central and Southern United States" vs "March 2 and 3, 2012": 5 tokens each, one
#       common ("and"): P=R=1/5, F1=0.2.
#   "NBA" vs "NBA Inside Stuff": P=1, R=1/3, F1=2*(1/3)/(4/3)=0.5.
DEFAULT_CASES = [
    ("hotpotqa-5a809f815542996402f6a5b7", "The Hukilau Song", "Jack Owens", 1.0, 1.0),
    ("hotpotqa-5a7f6af65542994857a76736", "Richard Bach", "Richard David Bach", 1.0, 1.0),
    ("hotpotqa-5ae7b39f554299540e5a5650", "Tornado outbreak sequence of May 1896", "Central and Southern United States", 0.0, 0.2),
    ("hotpotqa-5a88d89f554299206df2b37b", "2003–04 Orlando Magic season", "NBA", 0.0, 0.5),
    ("hotpotqa-5a77ec115542992a6e59dff7", "Lilu (mythology)", "Akkadian", 0.0, 0.0),
]


def test_scripted_policy_on_default_corpus(default_engine):
    backend = Counting(default_engine)
    tasks = {t.task_id: t for t in load_tasks("hotpotqa-dev")}
    with BatchedDriver(make_envs(backend, 4)) as driver:
        trajs = driver.run(ScriptedPolicy(), [{"task_id": c[0]} for c in DEFAULT_CASES])
    for traj, (tid, fetched_title, answer, em, f1) in zip(trajs, DEFAULT_CASES):
        assert traj.task_id == tid and traj.steps[1].results[0]["title"] == fetched_title
        assert traj.final_answer == answer
        assert exact_match(answer, tasks[tid].answers) == em
        assert traj.reward == pytest.approx(f1) and token_f1(answer, tasks[tid].answers) == pytest.approx(f1)
    assert [len(b) for b in backend.batches] == [4, 1]


@pytest.mark.slow
def test_scripted_policy_whole_hotpotqa_default_backend(default_engine):
    """All 79 HotpotQA questions with the env's own default backend (built lazily)."""
    env0 = gym.make("drgym/SearchQA-v0")
    assert env0.unwrapped._backend is None  # nothing is loaded before the first reset
    envs = [env0] + [gym.make("drgym/SearchQA-v0") for _ in range(7)]
    with BatchedDriver(envs) as driver:
        trajs = driver.run(ScriptedPolicy(), [{"task_id": t.task_id} for t in load_tasks("hotpotqa-dev")])
    assert len({id(e.unwrapped.backend) for e in envs}) == 1  # one engine shared by the process
    assert len(trajs) == 79 and all(t.terminated for t in trajs)
    assert all(t.count("search") == 1 and t.count("fetch") == 1 for t in trajs)
    assert sum(t.reward for t in trajs) / 79 == pytest.approx(0.0595, abs=0.005)  # measured: 4.70 / 79


# -- the driver -----------------------------------------------------------------------
def test_one_search_batch_per_turn_and_chunking(bm25_backend):
    backend = Counting(bm25_backend)
    driver = BatchedDriver(make_envs(backend, 5))
    driver.reset(options=[{"task_index": i} for i in range(5)])
    out = driver.step([f"<search>query {i}</search>" for i in range(5)])
    assert backend.batches == [[f"query {i}" for i in range(5)]]
    assert all(o[4]["results"] and o[4]["results"][0]["rank"] == 1 for o in out.values())
    # the same results as stepping each env alone
    solo = make_envs(bm25_backend, 1)[0]
    solo.reset(options={"task_index": 2})
    assert solo.step("<search>query 2</search>")[0] == out[2][0]
    driver.search_chunk = 2
    driver.step({0: "<search>a</search>", 1: "<search>b</search>", 3: "<search>c</search>", 4: "bad"})
    assert backend.batches[1:] == [["a", "b"], ["c"]]
    assert driver.stats["search_calls"] == 3 and driver.stats["queries"] == 8
    driver.close()


def test_failing_query_is_isolated(bm25_backend):
    driver = BatchedDriver(make_envs(FailingBackend(bm25_backend), 3))
    driver.reset(options=[{"task_index": i} for i in range(3)])
    out = driver.step(["<search>Lilu</search>", "<search>fail now</search>", "<search>Funchal</search>"])
    assert out[1][4]["error"] == "Search failed: BackendUnavailableError: search service unreachable after 3 retries"
    assert out[0][4]["error"] is None and out[2][4]["results"][0]["title"] == "Funchal"
    assert driver.stats["retries_alone"] == 1


def test_run_refills_envs_and_is_deterministic(bm25_backend, tmp_path):
    runs = []
    streamed = []
    for _ in range(2):
        with BatchedDriver(make_envs(bm25_backend, 3, reward=ExactMatch())) as driver:
            runs.append(driver.run(ScriptedPolicy(protocol="json"), 7, seed=100, on_episode=streamed.append))
    assert len(runs[0]) == 7 and len(streamed) == 14
    assert {t.episode_id for t in streamed[:7]} == {t.episode_id for t in runs[0]}
    assert [t.task_id for t in runs[0]] == [t.task_id for t in runs[1]]
    assert [t.messages for t in runs[0]] == [t.messages for t in runs[1]]
    assert [t.reward_components for t in runs[0]] == [t.reward_components for t in runs[1]]
    # JSONL round trip
    path = tmp_path / "traj.jsonl"
    write_trajectories(path, runs[0])
    write_trajectories(path, runs[1][:2], append=True)
    back = read_trajectories(path)
    assert len(back) == 9 and [t.to_dict() for t in back[:7]] == [t.to_dict() for t in runs[0]]
    assert back[0].steps[0].tool_calls[0].name == "search" and back[0].steps[0].tool_calls[0].protocol == "json"


def test_run_with_openai_protocol(bm25_backend):
    with BatchedDriver(make_envs(bm25_backend, 2)) as driver:
        trajs = driver.run(ScriptedPolicy(protocol="openai"), [{"task_index": 0}, {"task_index": 1}])
    roles = [m["role"] for m in trajs[0].messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert trajs[0].messages[3]["tool_call_id"] == "call_0"


# -- Gymnasium vector envs ----------------------------------------------------------------
def test_sync_vector_env(bm25_backend):
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("drgym/SearchQA-v0", backend=bm25_backend, max_turns=2)] * 2)
    obs, info = venv.reset(seed=[0, 1])
    assert isinstance(obs, tuple) and all(o.startswith("You answer questions using a search engine.") for o in obs)
    obs, r, term, trunc, info = venv.step(("<search>Lilu démon 中文</search>", "<answer>x</answer>"))
    assert obs[0].startswith("\n\n<information>Doc 1 (Title: ") and obs[1] == ""
    assert list(term) == [False, True] and r[1] == 0.0
    obs, r, term, trunc, info = venv.step(("<answer>a spirit</answer>", "<search>Lilu</search>"))
    assert list(term) == [True, False]  # env 1 was auto-reset (next-step mode) and is running again
    venv.close()
    venv = gym.make_vec("drgym/SearchQA-v0", num_envs=3, vectorization_mode="sync", backend=bm25_backend)
    obs, info = venv.reset(seed=0)
    assert len(set(info["task_id"])) == 3  # sub-envs are seeded 0, 1, 2
    venv.close()


def _make_subprocess_env():
    import gymnasium as gym
    from envs_helpers import BM25Backend

    return gym.make("drgym/SearchQA-v0", backend=BM25Backend("hotpotqa"), max_turns=3)


def test_async_vector_env_without_shared_memory():
    venv = gym.vector.AsyncVectorEnv([_make_subprocess_env] * 2, shared_memory=False)
    try:
        obs, _ = venv.reset(seed=[0, 1])
        obs, r, term, trunc, info = venv.step(("<search>Lilu démon 中文</search>", "bad"))
        assert obs[0].startswith("\n\n<information>Doc 1 (Title: Lilu") and obs[1].startswith("\nMy previous action is invalid: no action found.")
        assert list(info["invalid_actions"]) == [0, 1]
    finally:
        venv.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_async_vector_env_shared_memory_fails_on_unicode():
    """Documents the Gymnasium limitation (see drgym.envs.text.UnicodeText)."""
    venv = gym.vector.AsyncVectorEnv([_make_subprocess_env] * 2, shared_memory=True)
    try:
        venv.reset(seed=[0, 1])
        with pytest.raises(KeyError):
            venv.step(("<search>Lilu</search>", "<search>Lilu</search>"))
    finally:
        venv.close(terminate=True)


def test_driver_rejects_other_envs():
    from drgym.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^envs\[0\] is a CartPoleEnv, not a drgym search environment\.$"):
        BatchedDriver([gym.make("CartPole-v1")])
