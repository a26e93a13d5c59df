"""GRPO rollouts through TRL 1.16's REAL vLLM generation code, with recording fakes underneath.

No vLLM and no GPU: ``VLLMGeneration.generate`` (server and colocate branches),
``VLLMClient.generate`` and its logprob parsing are TRL's code; the HTTP session, the
``vllm.LLM`` engine and accelerate's collectives are fakes (``tests/_fake_vllm.py``).
Several training processes are threads meeting in a barrier per collective, so a rank
that skips a collective fails the test (after the barrier's timeout) instead of hanging.

The episodes are real ``drgym/SearchQA-v0`` episodes over real HotpotQA questions and
BM25 results; a scripted model decides per question how many searches to make before
answering with the gold answer, so ranks finish at different turns.
"""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from _fake_vllm import (  # noqa: E402
    FakeCollective,
    FakeLLM,
    FakeSamplingParams,
    FakeTrainer,
    ScriptedSearcher,
    fake_accelerator,
    run_ranks,
    server_client,
    vllm_generation,
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm

    return load_pretrained(AutoTokenizer, resolve_lm("smollm2"))


@pytest.fixture(scope="module")
def tasks():
    from drgym.envs.task_loaders import load_tasks

    return load_tasks("hotpotqa-dev")[:8]


def _rollout(tokenizer, tasks, backend, *, max_new_tokens=64, max_turns=4):
    """A ``SearchRolloutFunc`` over ``tasks`` and the prompts of each task (rendered as GRPO's dataset)."""
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.training.rollout import RolloutSettings, SearchRolloutFunc

    def factory():
        return gym.make("drgym/SearchQA-v0", backend=backend, tasks=list(tasks), max_turns=max_turns,
                        max_searches=3, max_fetches=0, top_k=1, max_obs_tokens=30).unwrapped

    env = factory()
    table, prompt_of = {}, {}
    for t in tasks:
        _, info = env.reset(options={"task": t})
        text = tokenizer.apply_chat_template(info["messages"], tokenize=False, add_generation_prompt=True)
        table[text] = t
        prompt_of[t.task_id] = text
    settings = RolloutSettings(max_turns=max_turns, max_new_tokens=max_new_tokens, max_completion_tokens=2048)
    return SearchRolloutFunc(factory, table, settings), prompt_of, settings


def _plan(tasks, searches):
    return {t.question.strip(): (n, t.answers[0]) for t, n in zip(tasks, searches)}


def _model_turns(out):
    """Per episode, the lengths of its runs of model tokens (``env_mask`` 1), one per turn."""
    runs = []
    for mask in out["env_mask"]:
        r, n = [], 0
        for m in mask:
            if m:
                n += 1
            elif n:
                r.append(n)
                n = 0
        if n:
            r.append(n)
        runs.append(r)
    return runs


# rank r gets tasks 2r and 2r+1, each twice (num_generations 2); searches before answering:
# rank 0 needs 4 turns, rank 1 needs 3, rank 2 finishes in one turn, rank 3 needs 4
SEARCHES = [1, 3, 2, 0, 0, 0, 3, 1]


def _server_ranks(monkeypatch, tokenizer, tasks, backend, world, searches=SEARCHES, **kw):
    coll = FakeCollective(world, timeout=15)
    coll.install(monkeypatch)
    model = ScriptedSearcher(tokenizer, _plan(tasks, searches))
    client = server_client(model)
    rollouts, trainers = [], []
    for r in range(world):
        rf, prompt_of, settings = _rollout(tokenizer, tasks, backend, **kw)
        acc = fake_accelerator(r, world)
        trainers.append(FakeTrainer(acc, vllm_generation(acc, mode="server", client=client if r == 0 else None,
                                                         max_completion_length=2048), tokenizer))
        rollouts.append((rf, [prompt_of[t.task_id] for t in tasks[2 * r: 2 * r + 2] for _ in range(2)]))

    def rank_main(r):
        rf, prompts = rollouts[r]
        return rf(prompts, trainers[r])

    outs = run_ranks(world, rank_main, coll)
    return outs, trainers, coll, client, model, settings


@pytest.mark.parametrize("world", [2, 3, 4])
def test_server_mode_ranks_get_their_own_completions_and_meet_in_every_collective(monkeypatch, tokenizer, tasks,
                                                                                  bm25_backend, world):
    """Item 1: ranks finish at different turns; every rank takes part in every turn's collective,
    with equal counts (padding rows), and every episode gets the completions of its own prompt."""
    outs, _, coll, client, model, _ = _server_ranks(monkeypatch, tokenizer, tasks[:2 * world], bm25_backend, world)
    for r, out in enumerate(outs):
        mine = [t for t in tasks[2 * r: 2 * r + 2] for _ in range(2)]
        assert out["final_answer"] == [t.answers[0] for t in mine], f"rank {r} got another rank's completions"
        assert out["num_searches"] == [SEARCHES[tasks.index(t)] for t in mine]
        assert out["truncated"] == [False] * 4
        for ids, mask, lps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
            assert len(ids) == len(mask) == len(lps)
    # every collective saw the same number of items from every rank (TRL slices by rank * len)
    assert coll.log, "no collective ran"
    assert all(len(set(lens)) == 1 for _, lens in coll.log), coll.log
    # 4 generation rounds (the longest episode), each one request to the server for all ranks
    assert len(client.session.requests) == 4
    # ranks with fewer rows padded their turns; the padding rows came back to nobody
    assert model.dummy_prompts > 0
    assert all("PADDING" not in a for out in outs for a in out["final_answer"])


def test_server_mode_multi_rank_metrics_are_reduced_over_ranks(monkeypatch, tokenizer, tasks, bm25_backend):
    """Item 9: ``env/*`` metrics are means over every rank's episodes, not rank 0's only.

    Both ranks run 2 turns with 4 rows each (so the collectives line up even without
    padding): rank 0's episodes search once and answer, rank 1's keep searching and run
    out of turns."""
    outs, trainers, *_ = _server_ranks(monkeypatch, tokenizer, tasks[:4], bm25_backend, world=2,
                                       searches=[1, 1, 9, 9], max_turns=2)
    assert [o["truncated"] for o in outs] == [[False] * 4, [True] * 4]
    assert [o["num_turns"] for o in outs] == [[2] * 4, [2] * 4]
    searches = [s for out in outs for s in out["num_searches"]]
    for tr in trainers:
        m = tr._metrics["train"]
        assert m["env/answered_frac"] == [0.5]
        assert m["env/empty_answer_frac"] == [0.5]
        assert m["env/turns_mean"] == [2.0]
        assert m["env/searches_mean"] == [pytest.approx(sum(searches) / 8)]


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_vllm_turns_use_the_per_turn_cap_and_stop_strings(monkeypatch, tokenizer, tasks, bm25_backend, mode):
    """Item 3: each turn asks vLLM for ``max_new_tokens`` with the closing tags as stop strings
    (kept in the output), as the HF path does, not for the whole completion budget."""
    import trl.generation.vllm_generation as vg

    from drgym.training.rollout import STOP_STRINGS

    long_q = tasks[0].question.strip()
    model = ScriptedSearcher(tokenizer, _plan(tasks[:2], [1, 0]),
                             preamble={long_q: "Let me think about this for a while. " * 12})
    monkeypatch.setattr(vg, "SamplingParams", FakeSamplingParams, raising=False)
    coll = FakeCollective(1)
    coll.install(monkeypatch)
    acc = fake_accelerator(0, 1)
    client, llm = server_client(model), FakeLLM(model)
    gen = vllm_generation(acc, mode=mode, client=client, llm=llm, max_completion_length=2048)
    rf, prompt_of, settings = _rollout(tokenizer, tasks[:2], bm25_backend, max_new_tokens=40)
    prompts = [prompt_of[t.task_id] for t in tasks[:2] for _ in range(2)]
    coll.bind(0)
    out = rf(prompts, FakeTrainer(acc, gen, tokenizer))

    sent = client.session.requests if mode == "server" else llm.calls
    assert sent
    for params in sent:
        assert params["max_tokens"] == settings.max_new_tokens == 40
        assert list(params["stop"]) == list(STOP_STRINGS)
        assert params["include_stop_str_in_output"] is True
    # the same turn budget as HF: the long-winded first turn is cut at 40 tokens (an invalid
    # action, shown the correction), and no turn is longer than the cap
    turns = _model_turns(out)
    assert all(n <= 40 for r in turns for n in r)
    assert turns[0][0] == 40
    # the generation settings of the trainer are left as they were
    assert gen.max_completion_length == 2048 and "stop" not in gen.generation_kwargs
    # the other question stops at its closing tag: the kept text ends with the tag, no ramble
    assert out["final_answer"][2] == tasks[1].answers[0]
    assert "keep writing" not in tokenizer.decode(out["completion_ids"][2])


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_nan_logprobs_from_vllm_keep_their_token_and_are_counted(monkeypatch, tokenizer, tasks, bm25_backend, mode):
    """Item 4: vLLM reports a NaN logprob as None; the token keeps its place (None, which
    TRL maps back to NaN and leaves out of its importance-sampling correction) and the run
    logs how many there were."""
    import trl.generation.vllm_generation as vg

    model = ScriptedSearcher(tokenizer, _plan(tasks[:2], [1, 0]), nan_at=(1,))
    monkeypatch.setattr(vg, "SamplingParams", FakeSamplingParams, raising=False)
    coll = FakeCollective(1)
    coll.install(monkeypatch)
    acc = fake_accelerator(0, 1)
    gen = vllm_generation(acc, mode=mode, client=server_client(model), llm=FakeLLM(model))
    rf, prompt_of, _ = _rollout(tokenizer, tasks[:2], bm25_backend)
    trainer = FakeTrainer(acc, gen, tokenizer)
    coll.bind(0)
    out = rf([prompt_of[t.task_id] for t in tasks[:2] for _ in range(2)], trainer)

    nones = 0
    for ids, mask, lps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
        assert len(lps) == len(ids)
        # position 1 of every model turn is None; everything else a finite number
        turn_starts = [i for i in range(len(mask)) if mask[i] == 1 and (i == 0 or mask[i - 1] == 0)]
        for s in turn_starts:
            assert lps[s + 1] is None
        nones += sum(1 for x in lps if x is None)
        assert all(x is None or math.isfinite(x) for x in lps)
    turns = sum(out["num_turns"])  # one NaN per model turn
    assert nones == turns == 6
    assert trainer._metrics["train"]["rollout/nan_logprobs"] == [turns]


def test_a_short_vllm_answer_is_an_error_not_a_silent_misalignment(monkeypatch, tokenizer, tasks, bm25_backend):
    """Result lengths are checked before they are zipped onto episodes."""
    model = ScriptedSearcher(tokenizer, _plan(tasks[:2], [1, 0]))
    coll = FakeCollective(1)
    coll.install(monkeypatch)
    acc = fake_accelerator(0, 1)
    client = server_client(model)
    client.session.drop_last = True
    rf, prompt_of, _ = _rollout(tokenizer, tasks[:2], bm25_backend)
    coll.bind(0)
    with pytest.raises(RuntimeError, match="3 completions for 4 prompts"):
        rf([prompt_of[t.task_id] for t in tasks[:2] for _ in range(2)],
           FakeTrainer(acc, vllm_generation(acc, mode="server", client=client), tokenizer))


def test_group_monitor_reduces_guard_metrics_over_ranks(monkeypatch, tmp_path):
    """Item 9: ``guard/*`` fractions are over the whole generation batch (every rank's groups),
    and the degenerate groups are written once (by rank 0), with every rank's groups."""
    from drgym.atomic import read_jsonl
    from drgym.training.rewards import GroupMonitor

    world = 2
    coll = FakeCollective(world)
    coll.install(monkeypatch)
    # rank 0: 2 groups of 2, both with a reward spread; rank 1: 2 groups, both degenerate, one all-empty
    scores = {0: [1.0, 0.0, 0.5, 0.0], 1: [0.0, 0.0, 1.0, 1.0]}
    answers = {0: ["a", "", "b", "c"], 1: ["", "", "d", "d"]}
    monitors = []
    for r in range(world):
        m = GroupMonitor(["f1"], [1.0], 2, tmp_path / "degenerate_groups.jsonl")
        m.trainer = FakeTrainer(fake_accelerator(r, world))
        monitors.append(m)
    run_ranks(world, lambda r: monitors[r].record("f1", scores[r], [f"t{r}a", f"t{r}a", f"t{r}b", f"t{r}b"],
                                                  answers[r]), coll)
    for m in monitors:
        got = m.trainer._metrics["train"]
        assert got["guard/degenerate_group_frac"] == [0.5]
        assert got["guard/all_empty_group_frac"] == [0.25]
        assert got["guard/empty_answer_frac"] == [3 / 8]
    rows = read_jsonl(tmp_path / "degenerate_groups.jsonl")
    assert sorted(r["task_id"] for r in rows) == ["t1a", "t1b"]
