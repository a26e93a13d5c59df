"""The training-time evaluation runs ``drgym rollout``'s runner in the token layout GRPO trains on.

A scripted stand-in for the language model (it searches for the question, then answers
with the gold answer) records every context it is asked to continue. The GRPO rollout
(:class:`SearchRolloutFunc`) and the evaluator (:func:`make_evaluator`: ``run_rollout``
with ``HFPolicy(layout="continuation")``) must hand it the same token ids, turn for turn,
over real HotpotQA questions and real BM25 results; with ``layout="chat"`` they differ,
so the check can fail.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class ScriptedLM:
    """Just enough of a causal LM for ``generate``, with three behaviours by question.

    The first turn searches the question's first words, except for the question listed in
    ``mumble``, whose first turn is free text ended by eos (an invalid action: the env
    answers with a corrective observation); for the question in ``dot`` the search turn
    ends with ``</search>.``, whose last token ``>.`` completes the stop string and carries
    one more character. A turn whose context holds search results (``<information>Doc 1``;
    the system prompt names the bare tag) or the corrective text answers with the
    question's gold answer. Each unpadded context (``list[int]``) is recorded; new tokens
    are right-padded with the pad id (SmolLM2's eos), as ``generate`` does.
    """

    def __init__(self, tokenizer, answers_by_question: dict[str, str], *, mumble: str = "", dot: str = "",
                 protocol: str = "tags"):
        import torch

        self.protocol = protocol
        self.tok = tokenizer
        self.answers = answers_by_question
        self.mumble, self.dot = mumble, dot
        self.contexts: list[list[int]] = []
        self.training = False
        self._p = torch.nn.Parameter(torch.zeros(1))
        self.config = type("Cfg", (), {"_name_or_path": "scripted-lm"})()

    def parameters(self):
        return iter([self._p])

    def eval(self):
        self.training = False
        return self

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
        import torch

        new_rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            ctx = [i for i, m in zip(ids, mask) if m]
            self.contexts.append(ctx)
            text = self.tok.decode(ctx)
            q = next(q for q in self.answers if q in text)
            end = []
            words = " ".join(q.split()[:8]).replace('"', "")
            if self.protocol == "json":
                if "<tool_response>\nDoc 1" in text or "not a valid tool call" in text:
                    turn = '<tool_call>{"name": "answer", "arguments": {"answer": "%s"}}</tool_call>' % self.answers[q]
                elif q == self.mumble:
                    turn, end = "I am not sure about this one", [self.tok.eos_token_id]
                else:
                    turn = ('<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % words
                            + ("." if q == self.dot else ""))
            elif "<information>Doc 1" in text or "previous action is invalid" in text:
                turn = f"<answer> {self.answers[q]} </answer>"
            elif q == self.mumble:
                turn, end = "I am not sure about this one", [self.tok.eos_token_id]
            else:
                turn = f"<search> {words} </search>" + ("." if q == self.dot else "")
            new_rows.append(self.tok(turn, add_special_tokens=False)["input_ids"][:max_new_tokens] + end)
        width = max(len(r) for r in new_rows)
        pad = self.tok.pad_token_id
        return torch.tensor([ids + r + [pad] * (width - len(r)) for ids, r in zip(input_ids.tolist(), new_rows)])


def _config(tmp_path):
    from drgym.training.config import load_config

    return load_config("searchqa_smollm2_cpu", {
        "output_dir": str(tmp_path / "run"),
        "tasks": {"train": {"set": "hotpotqa-dev", "start": 0, "limit": 4},
                  "eval": {"set": "hotpotqa-dev", "start": 60, "limit": 3}},
        "rollout": {"max_turns": 2, "max_new_tokens": 48, "max_completion_tokens": 512, "gen_batch_size": 1},
        "env": {"id": "drgym/SearchQA-v0", "kwargs": {"top_k": 2, "max_obs_tokens": 120, "max_fetches": 0}},
        "eval": {"every_steps": 1, "num_tasks": 3, "max_turns": 2, "greedy": True},
    })


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from drgym.models import resolve_lm

    return AutoTokenizer.from_pretrained(resolve_lm("smollm2"))


def _parts(tmp_path, tokenizer, protocol: str = "tags"):
    from drgym.training.data import load_task_slice
    from drgym.training.rewards import build_reward_funcs

    cfg = _config(tmp_path)
    cfg.protocol = protocol
    tasks = load_task_slice(cfg.tasks["eval"])
    funcs, weights, _ = build_reward_funcs(cfg, {t.task_id: t for t in tasks}, num_generations=1,
                                           output_dir=tmp_path / "run")
    lm = ScriptedLM(tokenizer, {t.question: t.answers[0] for t in tasks}, mumble=tasks[1].question,
                    dot=tasks[2].question, protocol=protocol)
    return cfg, tasks, funcs, weights, lm


def _train_rollout(tmp_path, tokenizer, backend, protocol: str = "tags"):
    """The GRPO rollout (greedy) of the 3 held-out tasks with the scripted LM; its contexts are in ``lm.contexts``."""
    from drgym.training.data import build_dataset, make_env_factory
    from drgym.training.rollout import SearchRolloutFunc

    cfg, tasks, funcs, weights, lm = _parts(tmp_path, tokenizer, protocol=protocol)
    factory = make_env_factory(cfg, tasks, backend=backend, max_turns=cfg.eval.max_turns)
    _ds, table = build_dataset(tasks, factory, tokenizer)
    s = cfg.rollout_settings()
    s.greedy = True
    out = SearchRolloutFunc(factory, table, s).run(list(table), model=lm, tokenizer=tokenizer)
    return cfg, tasks, funcs, weights, lm, out


def test_eval_contexts_match_the_grpo_rollout_token_for_token(tmp_path, tokenizer, bm25_backend):
    from drgym.training.evaluation import make_evaluator

    cfg, tasks, funcs, weights, lm, out = _train_rollout(tmp_path, tokenizer, bm25_backend)
    train_ctx = lm.contexts[:]
    assert len(train_ctx) == 6  # 3 tasks x 2 turns
    assert out["num_searches"] == [1, 0, 1] and out["invalid_actions"] == [0, 1, 0]
    # the token that completed </search> and carries a "." was kept whole
    assert "Ġ</ search >. Ċ Ċ < information" in " ".join(tokenizer.convert_ids_to_tokens(train_ctx[-1]))

    lm.contexts.clear()
    metrics, trajs = make_evaluator(cfg, tasks, funcs, weights, backend=bm25_backend)(lm, tokenizer, tmp_path / "ev")
    assert sorted(lm.contexts) == sorted(train_ctx)
    # the second-turn contexts hold retrieved passages (2) or the corrective text (1)
    assert sum("<information>Doc 1" in tokenizer.decode(c) for c in lm.contexts) == 2
    # the rollout runner wrote an ordinary run directory with the same answers
    assert (tmp_path / "ev" / "trajectories.jsonl").read_text().count("\n") == 3
    assert [t["final_answer"] for t in trajs] == out["final_answer"] == [t.answers[0] for t in tasks]
    assert metrics["f1"] == 1.0 and metrics["em"] == 1.0 and metrics["answered_frac"] == 1.0
    assert metrics["searches_mean"] == pytest.approx(2 / 3) and metrics["turns_mean"] == 2.0
    assert metrics["invalid_action_rate"] == pytest.approx(1 / 6)
    assert metrics["reward"] == pytest.approx(1.0 + 0.2 * metrics["format"])
    import json

    run_m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert run_m["training_rewards"]["reward"] == pytest.approx(metrics["reward"])
    assert run_m["training_rewards"]["weights"] == {"f1": 1.0, "format": 0.2}


def test_json_protocol_eval_contexts_match_the_grpo_rollout(tmp_path, tokenizer, bm25_backend):
    """The JSON protocol runs in the same loop: tool calls stop at </tool_call>, tool results
    continue the turn as <tool_response> blocks (masked), and evaluation sees the same ids."""
    from drgym.training.evaluation import make_evaluator

    cfg, tasks, funcs, weights, lm, out = _train_rollout(tmp_path, tokenizer, bm25_backend, protocol="json")
    train_ctx = lm.contexts[:]
    assert len(train_ctx) == 6
    assert out["num_searches"] == [1, 0, 1] and out["invalid_actions"] == [0, 1, 0]
    assert out["final_answer"] == [t.answers[0] for t in tasks]
    for ids, mask, searched in zip(out["completion_ids"], out["env_mask"], out["num_searches"]):
        model_text = tokenizer.decode([i for i, m in zip(ids, mask) if m])
        env_text = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
        assert '<tool_call>{"name": "answer"' in model_text and "<tool_response>" not in model_text
        if searched:
            assert env_text.startswith("\n<tool_response>\nDoc 1 (Title:") and "</tool_response>" in env_text
            assert '"name": "search"' in model_text
    assert "</tool_call>." in tokenizer.decode(train_ctx[-1])  # the token that completed the stop kept whole

    lm.contexts.clear()
    metrics, trajs = make_evaluator(cfg, tasks, funcs, weights, backend=bm25_backend)(lm, tokenizer, tmp_path / "ev")
    assert sorted(lm.contexts) == sorted(train_ctx)
    assert [t["final_answer"] for t in trajs] == out["final_answer"]
    assert metrics["f1"] == 1.0 and metrics["invalid_action_rate"] == pytest.approx(1 / 6)


def test_chat_layout_would_differ(tmp_path, tokenizer, bm25_backend):
    """The check above can fail: in the chat layout the observation is a user turn."""
    from drgym.evaluation.runner import RolloutConfig, run_rollout
    from drgym.policies.hf import HFPolicy

    cfg, tasks, _funcs, _w, lm = _parts(tmp_path, tokenizer)
    res = {}
    for layout in ("chat", "continuation"):
        lm.contexts.clear()
        pol = HFPolicy(lm, tokenizer=tokenizer, layout=layout, max_new_tokens=48, batch_size=1)
        rc = RolloutConfig(tasks="held-out", policy=pol.name, n=None, out=str(tmp_path / layout), max_turns=2,
                           env_options={"top_k": 2, "max_obs_tokens": 120, "max_fetches": 0}, plots=False, rewards=[])
        run_rollout(rc, policy=pol, backend=bm25_backend, progress=False, tasks=tasks[:1])
        res[layout] = tokenizer.decode(lm.contexts[-1])
    assert "<|im_start|>user\n\n\n<information>" in res["chat"]
    assert "</search>\n\n<information>" in res["continuation"]
    assert res["continuation"].count("<|im_start|>assistant") == 1


def test_hf_policy_with_a_loaded_model_needs_its_tokenizer(tokenizer):
    from drgym.errors import ConfigError
    from drgym.policies.hf import HFPolicy

    lm = ScriptedLM(tokenizer, {})
    with pytest.raises(ConfigError, match="needs tokenizer="):
        HFPolicy(lm)
    pol = HFPolicy(lm, tokenizer=tokenizer)
    assert pol.name == "hf:scripted-lm" and pol.scaffold == "none"  # 'auto' scaffolds only the named SmolLM2


def test_train_eval_command_writes_metrics_and_a_rollout_run(tmp_path, bm25_backend):
    """``drgym train eval`` (evaluate_model) on the bundled model: the metrics JSON agrees
    with the episodes of the rollout run directory it writes beside it."""
    import json

    from drgym.rewards.qa import token_f1
    from drgym.training.evaluation import evaluate_model

    cfg = _config(tmp_path)
    cfg.rollout["max_new_tokens"] = 8
    res = evaluate_model(cfg, model_path="smollm2", num_tasks=2, backend=bm25_backend, out_path=tmp_path / "ev.json")
    assert json.loads((tmp_path / "ev.json").read_text()) == res
    assert res["tasks"] == 2 and res["run_dir"] == str(tmp_path / "ev.rollout")
    trajs = [json.loads(x) for x in (tmp_path / "ev.rollout" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 2
    f1 = [token_f1(t["final_answer"] or "", t["metadata"]["answers"]) if t["terminated"] else 0.0 for t in trajs]
    assert res["f1"] == pytest.approx(sum(f1) / 2)
    assert res["turns_mean"] == pytest.approx(sum(len(t["steps"]) for t in trajs) / 2)
    rec = json.loads((tmp_path / "ev.rollout" / "config.json").read_text())
    assert rec["policy"]["name"] == "hf:smollm2" and rec["policy"]["layout"] == "continuation"
    assert rec["policy"]["scaffold"] == "none" and rec["policy"]["max_new_tokens"] == 8


def test_hf_policy_reads_the_layout_a_drgym_model_was_trained_in(tmp_path, caplog):
    """``layout="auto"`` (the default) follows the folder's drgym_training.json."""
    from drgym.training.callbacks import write_training_record
    from drgym.training.config import load_config

    from drgym.models import TRAINING_RECORD, resolve_lm
    from drgym.policies.hf import HFPolicy

    src = resolve_lm("smollm2")
    folder = tmp_path / "model"
    folder.mkdir()
    for f in os.listdir(src):
        (folder / f).symlink_to(os.path.join(src, f))
    assert HFPolicy(str(folder), dtype="float32").describe()["layout"] == "chat"  # no record: a plain chat model
    (folder / "training_args.bin").write_bytes(b"")  # a Trainer output without a record: warned
    with caplog.at_level("WARNING", logger="drgym.policies.hf"):
        assert HFPolicy(str(folder), dtype="float32").layout == "chat"
    assert "-p layout=continuation" in caplog.text

    write_training_record(folder, load_config("searchqa_smollm2_cpu"), "sft")
    pol = HFPolicy(str(folder), dtype="float32")
    assert pol.layout == "continuation" and pol.scaffold == "none"
    assert HFPolicy(str(folder), dtype="float32", layout="chat").layout == "chat"  # an explicit layout wins
    (folder / TRAINING_RECORD).write_text("{not json")
    assert HFPolicy(str(folder), dtype="float32").layout == "chat"  # an unreadable record is ignored


# -- bad input: one clear error, found before anything slow runs ----------------------------
def test_bad_model_paths_are_one_clear_error(tmp_path):
    from drgym.errors import ConfigError
    from drgym.models import load_pretrained, resolve_lm

    with pytest.raises(ConfigError, match="model folder '/nope/model' does not exist"):
        resolve_lm("/nope/model")
    with pytest.raises(ConfigError, match="model folder './runs/x/final' does not exist"):
        resolve_lm("./runs/x/final")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.bin").write_bytes(b"x")
    for bad in (tmp_path / "empty", tmp_path / "file.bin"):
        with pytest.raises(ConfigError, match="is not a saved model folder"):
            resolve_lm(str(bad))
    assert resolve_lm("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"  # hub names pass through
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="cannot load AutoTokenizer from 'no-such-org/no-such-model'"):
        load_pretrained(AutoTokenizer, "no-such-org/no-such-model")


def test_train_eval_cli_refuses_bad_n_and_out_before_loading(tmp_path):
    import json

    from typer.testing import CliRunner

    from drgym.cli import app

    def run(*args):
        res = CliRunner().invoke(app, ["train", "eval", "--config", "searchqa_smollm2_cpu", "--model", "/nope/m", *args])
        return res.exit_code, res.output

    code, out = run("-n", "-3")
    assert code == 2 and "must be >= 0" in out
    (tmp_path / "adir").mkdir()
    code, out = run("--out", str(tmp_path / "adir"))
    assert code == 2 and "is a directory" in out
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    for f in ("config.json", "metrics.json", "trajectories.jsonl"):
        (run_dir / f).write_text("{}")
    code, out = run("--out", str(run_dir / "metrics.json"))
    assert code == 2 and "inside a rollout run directory" in out
    assert json.loads((run_dir / "metrics.json").read_text()) == {}  # untouched
    (tmp_path / "afile").write_text("x")
    code, out = run("--out", str(tmp_path / "afile" / "x.json"))
    assert code == 2 and "cannot write to" in out
    code, out = run("--out", str(tmp_path / "ok.json"))  # a good --out: now the model path is refused
    assert code == 2 and "model folder '/nope/m' does not exist" in out and "Traceback" not in out


def test_config_refuses_a_list_and_a_negative_start(tmp_path):
    from drgym.training.config import load_config

    from drgym.errors import ConfigError

    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a YAML mapping at the top level"):
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match=r"start must be >= 0"):
        load_config("searchqa_smollm2_cpu", {"tasks": {"eval": {"set": "hotpotqa-dev", "start": -5, "limit": 3}}})


def test_a_fresh_run_refuses_an_output_dir_with_an_earlier_run(tmp_path):
    from drgym.training.grpo import refuse_earlier_run

    from drgym.errors import ConfigError

    refuse_earlier_run(tmp_path / "new")  # absent: fine
    (tmp_path / "run" / "sft").mkdir(parents=True)
    refuse_earlier_run(tmp_path / "run")  # an SFT sub-folder is not an earlier GRPO run
    (tmp_path / "run" / "checkpoint-2").mkdir()
    with pytest.raises(ConfigError, match=r"holds an earlier run \(checkpoint-2\); pass --resume"):
        refuse_earlier_run(tmp_path / "run")


def test_resume_refuses_a_policy_that_resolves_to_another_layout(tmp_path, tokenizer, bm25_backend):
    from drgym.errors import ConfigError
    from drgym.evaluation.runner import RolloutConfig, run_rollout
    from drgym.policies.hf import HFPolicy

    cfg, tasks, _f, _w, lm = _parts(tmp_path, tokenizer)
    rc = RolloutConfig(tasks="held-out", policy="hf:scripted-lm", n=1, out=str(tmp_path / "r"), max_turns=2,
                       env_options={"top_k": 2, "max_fetches": 0}, plots=False, rewards=[])
    run_rollout(rc, policy=HFPolicy(lm, tokenizer=tokenizer, layout="continuation"), backend=bm25_backend,
                progress=False, tasks=tasks)
    rc.n = 2
    with pytest.raises(ConfigError, match=r"layout='continuation'.*layout='chat'; resuming would mix them"):
        run_rollout(rc, policy=HFPolicy(lm, tokenizer=tokenizer, layout="chat"), backend=bm25_backend,
                    progress=False, tasks=tasks)
    res = run_rollout(rc, policy=HFPolicy(lm, tokenizer=tokenizer, layout="continuation"), backend=bm25_backend,
                      progress=False, tasks=tasks)
    assert res.new_episodes == 1 and res.skipped == 1


def test_kv_cache_reuse_between_turns_gives_the_same_rollouts(tmp_path, tokenizer, bm25_backend, monkeypatch):
    """The bundled model, greedy, 3 turns on real questions: reusing the previous turn's KV
    cache (masking the eos a rollout drops, and padding after stops) writes the same tokens
    as re-encoding every context."""
    import drgym.training.rollout as R
    import torch
    from drgym.training.data import build_dataset, make_env_factory
    from transformers import AutoModelForCausalLM

    from drgym.models import resolve_lm

    cfg, tasks, *_ = _parts(tmp_path, tokenizer)
    cfg.rollout.update({"max_turns": 3, "max_new_tokens": 64, "gen_batch_size": 8})  # turns end at different lengths
    model = AutoModelForCausalLM.from_pretrained(resolve_lm("smollm2"), dtype=torch.float32)
    factory = make_env_factory(cfg, tasks, backend=bm25_backend, max_turns=3)
    _ds, table = build_dataset(tasks, factory, tokenizer)
    reused = []
    inner = R._reuse_inputs
    monkeypatch.setattr(R, "_reuse_inputs", lambda *a: reused.append(inner(*a)) or reused[-1])
    outs = {}
    for reuse in (False, True):
        s = cfg.rollout_settings()
        s.greedy, s.reuse_cache = True, reuse
        outs[reuse] = R.SearchRolloutFunc(factory, table, s).run(list(table), model=model, tokenizer=tokenizer)
    assert reused and all(r is not None for r in reused)  # turns 2 and 3 read the cache
    assert outs[True]["completion_ids"] == outs[False]["completion_ids"]
    assert outs[True]["env_mask"] == outs[False]["env_mask"]
    assert max(outs[True]["num_turns"]) >= 2


def test_kv_cache_reuse_for_a_subset_of_rows(tokenizer, monkeypatch):
    """Rows that finished drop out of the batch: the cache keeps the others, in order."""
    import drgym.training.rollout as R
    import torch
    from drgym.training.rollout import hf_generate_turn
    from transformers import AutoModelForCausalLM

    from drgym.models import resolve_lm

    reused_inputs = []
    inner = R._reuse_inputs
    monkeypatch.setattr(R, "_reuse_inputs", lambda *a: reused_inputs.append(inner(*a)) or reused_inputs[-1])

    model = AutoModelForCausalLM.from_pretrained(resolve_lm("smollm2"), dtype=torch.float32)
    qs = ["Who wrote Hamlet?", "Which river flows through Vienna, the capital of Austria?", "Who painted the Mona Lisa?"]
    ctx = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                   tokenize=False), add_special_tokens=False)["input_ids"] for q in qs]
    kw = dict(max_new_tokens=12, temperature=1.0, do_sample=False)
    first, state = hf_generate_turn(model, tokenizer, ctx, keys=["a", "b", "c"], **kw)
    assert state is not None
    obs = tokenizer("\n\n<information>Doc 1 (Title: Danube) The Danube flows through Vienna.</information>\n\n",
                    add_special_tokens=False)["input_ids"]
    nxt = [ctx[i] + first[i] + obs for i in (2, 0)]  # "b" finished; the order changes too
    reused, _ = hf_generate_turn(model, tokenizer, nxt, keys=["c", "a"], prev=state, **kw)
    assert len(reused_inputs) == 1 and reused_inputs[0] is not None
    assert reused_inputs[0][0].shape[0] == 2  # two rows read the cache
    fresh, _ = hf_generate_turn(model, tokenizer, nxt, **kw)
    assert reused == fresh and all(reused)
