"""GRPO rollouts run in the shared loop, with any backend spec ``drgym rollout`` accepts.

- one ``search_batch`` per turn for the whole rollout batch (the driver merges every
  episode's queries), counted on a wrapped backend;
- a config with ``search: {backend: http://127.0.0.1:PORT}`` (drgym's server app on a
  free port; a ``drgym serve`` subprocess in the slow variant) and one with
  ``search: {backend: replay:FILE}`` each run one CPU step.

The model's first turn is forced to search its question (the base SmolLM2 rarely writes
the tags), so every step really goes through the configured backend; the later turns
are the model's own.
"""

from __future__ import annotations

import os

import pytest

from envs_helpers import Counting

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _scripted_step(tokenizer, turns: list[str]):
    """A generation step writing ``turns[t]`` (``{q}`` = the row's question) on turn ``t``."""
    from drgym.training.rollout import cut_generated_turn

    state = {"turn": 0, "questions": {}}

    def step(contexts, keys):
        t = state["turn"]
        state["turn"] += 1
        out = []
        for ctx in contexts:
            text = tokenizer.decode(ctx, skip_special_tokens=True)
            q = text.split("Question:")[-1].split("\n")[0].strip() if "Question:" in text else "x"
            ids = tokenizer(turns[t].format(q=q), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            out.append(cut_generated_turn(tokenizer, ids)[0])
        return out, [[0.0] * len(x) for x in out]

    step.returns_logprobs = False
    return step


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm

    return load_pretrained(AutoTokenizer, resolve_lm("smollm2"))


def test_grpo_rollouts_issue_one_search_batch_per_turn(tokenizer, bm25_backend):
    import gymnasium as gym

    import drgym.envs  # noqa: F401
    from drgym.envs.task_loaders import load_tasks
    from drgym.training.rollout import RolloutSettings, SearchRolloutFunc

    counting = Counting(bm25_backend)
    tasks = load_tasks("hotpotqa-dev")[:3]

    def factory():
        return gym.make("drgym/SearchQA-v0", backend=counting, tasks=tasks, max_turns=3, max_searches=3,
                        top_k=1, max_obs_tokens=40).unwrapped

    env = factory()
    table = {}
    for t in tasks:
        _, info = env.reset(options={"task": t})
        table[tokenizer.apply_chat_template(info["messages"], tokenize=False, add_generation_prompt=True)] = t
    prompts = [p for p in table for _ in range(2)]  # 3 tasks x 2 generations
    settings = RolloutSettings(max_turns=3, max_new_tokens=32, max_completion_tokens=1024)
    step = _scripted_step(tokenizer, ["<search> {q} </search>", "<search> {q} founded </search>", "<answer> x </answer>"])
    out = SearchRolloutFunc(factory, table, settings).run(prompts, tokenizer=tokenizer, step=step)

    # turn 1 and turn 2 search in all 6 episodes: one merged request per turn, 6 queries each
    assert [len(c) for c in counting.batches] == [6, 6]
    assert counting.batches[0][0] == counting.batches[0][1] == tasks[0].question.strip()
    assert out["num_searches"] == [2] * 6 and out["num_turns"] == [3] * 6
    assert out["truncated"] == [False] * 6 and out["final_answer"] == ["x"] * 6
    # observation tokens are masked; the model's three turns are not; eos closes the answer
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
        assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 0


def _force_first_turn_search(monkeypatch, tokenizer_holder: dict):
    """Make the HF generation step's first turn of each rollout search the row's question."""
    from drgym.training import rollout as R

    real = R.HFTurnStep.__call__

    def call(self, contexts, keys):
        if not getattr(self, "_forced", False):
            self._forced = True
            tok = self.tokenizer
            out = []
            for ctx in contexts:
                q = tok.decode(ctx, skip_special_tokens=True).split("Question:")[-1].split("\n")[0].strip()
                out.append(tok(f"<search> {q} </search>", add_special_tokens=False)["input_ids"])
            return out, [[0.0] * len(x) for x in out]
        return real(self, contexts, keys)

    monkeypatch.setattr(R.HFTurnStep, "__call__", call)


def _one_step(tmp_path, monkeypatch, search: dict):
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_training_grpo import action_chars, tiny_config

    from drgym.search.registry import backend_from_settings
    from drgym.training.grpo import build_trainer

    cfg = tiny_config(tmp_path, max_steps=1)
    cfg.search = search
    _force_first_turn_search(monkeypatch, {})
    trainer, parts = build_trainer(cfg, extra_reward_funcs=[action_chars])
    trainer.train()
    assert trainer.state.global_step == 1
    stats = parts["rollout"].last_driver_stats
    assert stats["search_calls"] == 1 and stats["queries"] == 4  # turn 1: the 4 rollouts' searches, one request
    return backend_from_settings(search), trainer


def test_grpo_config_with_an_http_backend_runs_one_step(tmp_path, monkeypatch, bm25_backend):
    """The server is drgym's FastAPI app on a free loopback port (uvicorn in a thread)."""
    from drgym.search.client import HTTPSearchClient
    from server_helpers import running_server

    with running_server(bm25_backend) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        backend, _ = _one_step(tmp_path, monkeypatch, {"backend": srv.url})
    assert isinstance(backend, HTTPSearchClient)


@pytest.mark.slow
def test_grpo_config_with_a_drgym_serve_subprocess_runs_one_step(tmp_path, monkeypatch, hotpotqa_engine):
    """The same with ``drgym serve`` in its own process (about 1.5 min on a loaded 2-core machine)."""
    from drgym.search.client import HTTPSearchClient
    from server_helpers import running_server

    with running_server(cli_args=["--corpus", "hotpotqa", "--method", "bm25"]) as srv:
        backend, _ = _one_step(tmp_path, monkeypatch, {"backend": srv.url})
    assert isinstance(backend, HTTPSearchClient)


def test_grpo_config_with_a_replay_recording_runs_one_step(tmp_path, monkeypatch, bm25_backend):
    from drgym.envs.task_loaders import load_tasks
    from drgym.search.record import RecordReplayBackend

    store = tmp_path / "hotpotqa.sqlite"
    rec = RecordReplayBackend(bm25_backend, store, mode="record", name="local:hipporag")
    questions = [t.question.strip() for t in load_tasks("hotpotqa-dev")[:4]]
    rec.search_batch(questions, 1)  # what the forced first turns will ask (top_k 1)
    rec.close()
    backend, trainer = _one_step(tmp_path, monkeypatch, {"backend": f"replay:{store}"})
    assert isinstance(backend, RecordReplayBackend) and backend.mode == "replay"
    assert backend.name == "local:hipporag"
