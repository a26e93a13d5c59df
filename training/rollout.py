"""Multi-turn rollouts for TRL's ``GRPOTrainer(rollout_func=...)`` (Search-R1 tag protocol).

The episodes run in drgym's one multi-turn loop (:class:`drgym.envs.driver.BatchedDriver`,
the loop ``drgym rollout`` and the held-out evaluation run); :class:`TokenRecorder` is
the policy there: a pluggable generation step (:class:`HFTurnStep` with KV reuse,
:class:`VLLMTurnStep`) plus the token bookkeeping GRPO needs.

One rollout is one episode of ``drgym/SearchQA-v0``: the model writes a turn that ends
at the closing tag of a tool call (``</search>``, ``</fetch>``, ``</answer>``: the stop
strings the env's tools declare, :func:`drgym.envs.tools.stop_strings`), the environment
answers a search with an ``<information>...</information>`` block, and the block's
tokens are appended to the *same* assistant turn, as in Search-R1 (Jin et al. 2025, §3.1 "loss masking for
retrieved tokens"). The completion handed to TRL is the interleaving of model tokens and
observation tokens; ``env_mask`` is 1 on model tokens and 0 on observation tokens, so
TRL 1.16 multiplies it into the loss mask (``loss_mask = completion_mask * tool_mask``).

The layout of the token ids is produced by one function, :func:`encode_segments`, which
the SFT warm start (:mod:`drgym.training.sft`) uses too, so SFT labels and GRPO masks
agree token for token.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import StrictBool

from drgym.training.ranks import gather_rows, world

from drgym.config import RolloutSection
from drgym.envs.tools import DEFAULT_TOOLS, stop_strings
from drgym.errors import ConfigError
from drgym.policies.generation import cut_ids_at_stop, opened_reasoning, render_chat

log = logging.getLogger(__name__)

STOP_STRINGS = stop_strings(DEFAULT_TOOLS, "tags")
"""Stop strings of a tag-protocol turn with the default tools (Search-R1: a turn ends at
the closing tag of its call): ``("</search>", "</fetch>", "</answer>")``."""
JSON_STOP_STRINGS = stop_strings(DEFAULT_TOOLS, "json")
"""Stop strings of a JSON-protocol turn: a turn ends at its first complete tool call."""


# -- token layout ------------------------------------------------------------------------
def prompt_token_ids(tokenizer, messages: list[dict[str, Any]], *, enable_thinking: bool | None = None) -> list[int]:
    """Token ids of the chat prompt (system + user), ending with the assistant header.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: ``{"role", "content"}`` dicts (the env's initial ``info["messages"]``).
        enable_thinking: the chat template's thinking switch (None: its default); see
            :func:`drgym.policies.generation.render_chat`.

    Returns:
        ``list[int]``: ``apply_chat_template(..., add_generation_prompt=True)`` tokenised
        without adding special tokens twice.
    """
    text = render_chat(tokenizer, messages, enable_thinking=enable_thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_segments(tokenizer, segments: list[tuple[str, bool]], *, end_with_eos: bool) -> tuple[list[int], list[int]]:
    """Token ids and mask of an assistant turn made of model and observation segments.

    Each segment is tokenised on its own (``add_special_tokens=False``) and concatenated,
    exactly as the rollout builds its completions turn by turn.

    Args:
        tokenizer: the policy's tokenizer.
        segments: ``(text, is_model)`` pairs in order; ``is_model`` False marks an
            environment observation (an ``<information>`` block).
        end_with_eos: append the eos token (masked like a model token: it is what the
            model must learn to emit after ``</answer>``).

    Returns:
        ``(ids, mask)``, two equal-length ``list[int]``; ``mask[i]`` is 1 for model tokens
        and 0 for observation tokens.
    """
    ids: list[int] = []
    mask: list[int] = []
    for text, is_model in segments:
        if not text:
            continue
        t = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids += t
        mask += [1 if is_model else 0] * len(t)
    if end_with_eos:
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return ids, mask


def cut_generated_turn(tokenizer, new_ids: list[int], stop_strings=STOP_STRINGS) -> tuple[list[int], bool]:
    """Cut one generated turn right after its first stop string, else after its first eos.

    SmolLM2 pads with its eos id (``<|im_end|>`` = 2), so a row that stopped on a stop
    string inside a batched ``generate`` is followed by pad ids that look like eos; they
    must not be kept (they would be trained as model tokens). The cut is
    :func:`drgym.policies.generation.cut_ids_at_stop`, the one ``hf:`` policies use, so
    evaluation with ``drgym rollout`` keeps the same tokens.

    Args:
        tokenizer: the tokenizer that produced ``new_ids``.
        new_ids: generated ids of one row (padding included).

    Returns:
        ``(ids, ended_with_eos)``: the kept ids and whether they end with a real eos.
    """
    kept, reason = cut_ids_at_stop(tokenizer, new_ids, stop_strings, (tokenizer.eos_token_id,))
    return kept, reason == "eos"


# -- generation backends --------------------------------------------------------------------
@dataclass
class TurnCache:
    """What one ``generate`` call leaves for the next turn of the same rows (HF backend).

    Attributes:
        keys: one key per row (the caller's row identities), in batch order.
        seq: ``(rows, C + 1)`` long tensor of the ids the call saw and wrote (left pads
            and masked holes included); the KV cache covers its first ``C`` columns.
        mask: ``(rows, T_in)`` attention mask of the call's input columns.
        contexts: each row's context (``list[int]``) that the input columns held.
        generated: each row's generated ids (padding included).
        cache: the ``transformers`` KV cache (``DynamicCache``) of ``seq[:, :C]``.
    """

    keys: list[Any]
    seq: Any
    mask: Any
    contexts: list[list[int]]
    generated: list[list[int]]
    cache: Any


def _reuse_inputs(prev: TurnCache, keys: list[Any], contexts: list[list[int]], pad: int):
    """Inputs of the next turn that reuse ``prev``'s KV cache, or None when they cannot.

    Row ``i``'s new context must extend what ``prev`` saw for it (its old context, then
    a prefix of what it generated, then new tokens such as an observation). Cached
    positions outside the new context (padding written after a stop, an eos the rollout
    dropped) are masked out, and the new tokens are left-padded after the cached
    columns, so each row attends to exactly its context; position ids follow the mask
    (``cumsum``), as in a contiguous left-padded batch.

    Returns:
        ``(input_ids, attention_mask, cache)`` or None (a row not in ``prev``, a context
        that does not extend its old one, or nothing new to read).
    """
    import torch

    where = {k: j for j, k in enumerate(prev.keys)}
    if any(k not in where for k in keys):
        return None
    cached = prev.cache.get_seq_length() if prev.cache is not None else 0
    t_in = prev.mask.shape[1]
    n_gen = cached - t_in  # generated tokens in the cache (the last one written is not)
    if n_gen < 0:
        return None
    masks, suffixes = [], []
    for k, ctx in zip(keys, contexts):
        j = where[k]
        old = prev.contexts[j]
        if ctx[: len(old)] != old:
            return None
        rest = ctx[len(old):]
        gen = prev.generated[j][:n_gen]
        m = 0
        while m < len(gen) and m < len(rest) and gen[m] == rest[m]:
            m += 1
        suffix = rest[m:]
        if not suffix:
            return None
        masks.append(prev.mask[j].tolist() + [1] * m + [0] * (n_gen - m))
        suffixes.append(suffix)
    width = max(len(x) for x in suffixes)
    idx = torch.tensor([where[k] for k in keys], dtype=torch.long)
    head = prev.seq[idx, :cached]
    tail = torch.tensor([[pad] * (width - len(x)) + x for x in suffixes], dtype=torch.long)
    mask = torch.tensor([m + [0] * (width - len(x)) + [1] * len(x) for m, x in zip(masks, suffixes)], dtype=torch.long)
    cache = prev.cache
    if idx.tolist() != list(range(len(prev.keys))):
        cache.batch_select_indices(idx.to(head.device))
    return torch.cat([head, tail.to(head.device)], 1), mask, cache


def hf_generate_turn(model, tokenizer, contexts: list[list[int]], *, max_new_tokens: int, temperature: float,
                     do_sample: bool = True, top_k: int = 0, top_p: float = 1.0, keys: list[Any] | None = None,
                     prev: TurnCache | None = None,
                     stops: tuple[str, ...] = STOP_STRINGS) -> tuple[list[list[int]], TurnCache | None]:
    """One turn of ``model.generate`` for each row, reusing the previous turn's KV cache.

    Without ``prev`` (or when it cannot serve these rows, see :func:`_reuse_inputs`) the
    contexts are left-padded and encoded whole. With it, only the tokens added since the
    previous turn (the observation) are encoded: the prompt and earlier turns are not
    re-encoded each turn, which is most of a multi-turn step's generation time on CPU
    (``scripts/bench_train.py``).

    Args:
        model: a causal LM (possibly the trainer's model, in train mode).
        contexts: one ``list[int]`` context per row.
        max_new_tokens: per-turn cap.
        temperature: sampling temperature (as ``GRPOConfig.temperature``).
        keys: row identities, needed to reuse the cache next turn (None: no reuse).
        prev: the :class:`TurnCache` of the previous turn.
        stops: the turn's stop strings (:func:`drgym.envs.tools.stop_strings` of the
            env's tools and protocol).

    Returns:
        ``(new_ids, turn_cache)``: each row's new ids cut by :func:`cut_generated_turn`, and the
        cache for the next turn (None when ``keys`` is None or the model returned no
        cache).
    """
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    reuse = _reuse_inputs(prev, keys, contexts, pad) if (prev is not None and keys is not None) else None
    if reuse is not None:
        input_ids, attn, cache = reuse
    else:
        width = max(len(x) for x in contexts)
        input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
        attn = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, x in enumerate(contexts):
            input_ids[i, width - len(x):] = torch.tensor(x, dtype=torch.long)
            attn[i, width - len(x):] = 1
        cache = None
    width = input_ids.shape[1]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            gen_kwargs: dict[str, Any] = dict(
                max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
                stop_strings=list(stops), tokenizer=tokenizer,
            )
            if do_sample:
                gen_kwargs.update(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
            else:
                gen_kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
            if keys is not None:
                gen_kwargs["return_dict_in_generate"] = True
            if cache is not None:
                gen_kwargs["cache"] = cache
            out = model.generate(input_ids=input_ids.to(device), attention_mask=attn.to(device), **gen_kwargs)
    finally:
        if was_training:
            model.train()
    seq = out if isinstance(out, torch.Tensor) else out.sequences
    new = seq[:, width:].tolist()
    kept = [cut_generated_turn(tokenizer, row, stops)[0] for row in new]
    new_cache = None if isinstance(out, torch.Tensor) else getattr(out, "cache", None)
    state = None
    if keys is not None and new_cache is not None:
        state = TurnCache(keys=list(keys), seq=seq, mask=attn, contexts=[list(c) for c in contexts], generated=new,
                          cache=new_cache)
    return kept, state


def sampled_logprob(lp: Any) -> float | None:
    """One token's sampled log-prob from TRL's vLLM output, or None when vLLM had none.

    TRL 1.16 returns each token's log-probs as a list, top-1 (the sampled token) first,
    and replaces a NaN by None (``extract_logprobs``, ``parse_logprobs``). None is kept:
    TRL's ``_generate_and_score_completions`` maps it back to NaN and gives that token no
    importance-sampling correction (ratio 1).
    """
    if isinstance(lp, (list, tuple)):
        lp = lp[0] if lp else None
    if lp is None:
        return None
    lp = float(lp)
    return None if math.isnan(lp) else lp


# -- episodes -------------------------------------------------------------------------------
class RolloutSettings(RolloutSection):
    """Budgets of one rollout (collapse guards): the ``rollout:`` section
    (:class:`~drgym.config.RolloutSection`, whose fields it has) plus two top-level keys of
    the run config.

    Attributes:
        enable_thinking: the chat template's thinking switch for the prompts (the run
            config's top-level ``enable_thinking``; None: the template's default).
        protocol: the env's action protocol (the run config's top-level ``protocol``):
            ``"tags"`` turns stop at the tools' closing tags (``</search>``, ``</fetch>``,
            ``</answer>``), ``"json"`` turns at ``</tool_call>``.

    With ``reuse_cache`` (:class:`~drgym.config.RolloutSection`), the HF backend keeps the
    KV cache between turns when a rollout batch fits one ``generate`` call (at most
    ``gen_batch_size`` episodes), so a turn encodes only the new observation
    (:func:`hf_generate_turn`); False re-encodes every context each turn.

    Raises:
        ConfigError: an unknown field or a bad value (``rollout.max_turns`` below 1...).
    """

    enable_thinking: StrictBool | None = None
    protocol: Literal["tags", "json"] = "tags"

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings of a turn with the default tools in :attr:`protocol`
        (:func:`drgym.envs.tools.stop_strings`); :class:`SearchRolloutFunc` takes them
        from its env's own tools instead."""
        return stop_strings(DEFAULT_TOOLS, self.protocol)


@dataclass
class TokenRecord:
    """The token record of one episode (what GRPO trains on).

    Attributes:
        prompt_ids: the chat prompt's ids (:func:`prompt_token_ids`).
        completion_ids: model and observation ids, interleaved.
        env_mask: 1 per model id, 0 per observation id (and for the closing eos).
        logprobs: per completion id; sampled log-probs on vLLM (None where vLLM
            reported NaN, see :func:`sampled_logprob`), 0.0 for observation ids and on HF.
        turns: model turns generated.
        length_capped: the whole-completion cap (``max_completion_tokens``) cut the
            episode short.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    turns: int = 0
    length_capped: bool = False


class HFTurnStep:
    """Generation step on the HF backend: :func:`hf_generate_turn`, KV cache kept between turns.

    Args:
        model: the causal LM (the trainer's, unwrapped).
        tokenizer: its tokenizer.
        settings: the run's :class:`RolloutSettings` (per-turn cap, temperature,
            ``gen_batch_size``, ``greedy``, ``reuse_cache``).
        rows: episodes in the rollout batch; the KV cache is reused between turns only
            when they fit one ``generate`` call (``rows <= gen_batch_size``).
        stops: the turn's stop strings (None: ``settings.stops``, the default tools').
    """

    returns_logprobs = False

    def __init__(self, model, tokenizer, settings: RolloutSettings, rows: int,
                 stops: tuple[str, ...] | None = None) -> None:
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.stops = tuple(stops) if stops is not None else settings.stops
        self.single = rows <= settings.gen_batch_size and settings.reuse_cache
        self._cache: TurnCache | None = None

    def __call__(self, contexts: list[list[int]], keys: list[Any]) -> tuple[list[list[int]], list[list[float]]]:
        """One turn for each context (``keys`` name the rows across turns). Returns ``(ids, logprobs)``."""
        s = self.settings
        ids_out: list[list[int]] = []
        for b in range(0, len(contexts), s.gen_batch_size):
            ids, cache = hf_generate_turn(
                self.model, self.tokenizer, contexts[b: b + s.gen_batch_size], max_new_tokens=s.max_new_tokens,
                temperature=s.temperature, do_sample=not s.greedy,
                keys=keys[b: b + s.gen_batch_size] if self.single else None, prev=self._cache if self.single else None,
                stops=self.stops)
            if self.single:
                self._cache = cache
            ids_out += ids
        return ids_out, [[0.0] * len(x) for x in ids_out]


class VLLMTurnStep:
    """Generation step through TRL's vLLM engine (``trainer.vllm_generation``, colocate or server).

    One call per turn with every active row of this rank, with the per-turn sampling
    parameters the HF path uses: ``max_tokens`` = ``max_new_tokens`` and ``stop`` =
    the turn's stop strings with ``include_stop_str_in_output`` (set on TRL's
    ``VLLMGeneration`` for the call and restored after; TRL 1.16 takes no per-call
    sampling parameters, and ``generation_kwargs`` override its own). Each row is still
    cut by :func:`cut_generated_turn`, as on HF.

    Several processes: TRL's server branch, and colocate mode with
    ``vllm_tensor_parallel_size > 1``, are collective. ``VLLMGeneration.generate``
    gathers every rank's prompts and hands rank ``r`` the slice ``[r*n, (r+1)*n)`` of the
    results, ``n`` being *its own* prompt count, so every rank must call it every round
    with the same count. Each round therefore starts with a gather of the ranks' row
    counts; every rank pads its batch to the largest with one-token dummy prompts (whose
    outputs are dropped), and a rank whose episodes have all ended keeps joining rounds
    (:meth:`drain`) until every rank reports 0 rows.

    Checks: the engine must return one completion and one log-prob list per prompt and
    one log-prob per token, else ``RuntimeError`` (never a silent zip of the wrong rows).
    A NaN log-prob (None from TRL) keeps its token and stays None
    (:func:`sampled_logprob`); ``stats["nan_logprobs"]`` counts them.

    Attributes:
        collective: True when rounds are synchronised across ranks (see above).
        stats: ``rounds`` (generate calls), ``padding_rows`` (dummy prompts sent),
            ``nan_logprobs`` (tokens of real rows without a log-prob).
    """

    returns_logprobs = True

    def __init__(self, trainer, tokenizer, settings: RolloutSettings, stops: tuple[str, ...] | None = None) -> None:
        self.trainer, self.tokenizer, self.settings = trainer, tokenizer, settings
        self.stops = tuple(stops) if stops is not None else settings.stops
        self.gen = trainer.vllm_generation
        _, n_proc = world(trainer)
        mode = getattr(self.gen, "mode", "colocate")
        self.collective = n_proc > 1 and (mode == "server" or int(getattr(self.gen, "tensor_parallel_size", 1) or 1) > 1)
        self.stats: dict[str, int] = {"rounds": 0, "padding_rows": 0, "nan_logprobs": 0}
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        self._dummy = [int(pad)]

    @contextmanager
    def _turn_params(self):
        """TRL's generation settings with the per-turn cap and stop strings, restored after."""
        g = self.gen
        old_len, old_kw = g.max_completion_length, g.generation_kwargs
        g.max_completion_length = self.settings.max_new_tokens
        g.generation_kwargs = {**(old_kw or {}), "max_tokens": self.settings.max_new_tokens,
                               "stop": list(self.stops), "include_stop_str_in_output": True}
        try:
            yield
        finally:
            g.max_completion_length, g.generation_kwargs = old_len, old_kw

    def _round_size(self, n: int) -> int:
        """The rows every rank sends this round (the largest count; this rank's own without collectives)."""
        if not self.collective:
            return n
        return max(int(c) for c in gather_rows(self.trainer, [n]))

    def _generate(self, contexts: list[list[int]], total: int) -> tuple[list[list[int]], list[list[float | None]]]:
        """One ``VLLMGeneration.generate`` call with ``contexts`` padded to ``total`` rows; the real rows' results."""
        n = len(contexts)
        batch = list(contexts) + [self._dummy] * (total - n)
        self.stats["rounds"] += 1
        self.stats["padding_rows"] += total - n
        with self._turn_params():
            _, completion_ids, logprobs, _ = self.gen.generate(prompts=batch, images=None, num_generations=1)
        if len(completion_ids) != len(batch):
            raise RuntimeError(f"vLLM returned {len(completion_ids)} completions for {len(batch)} prompts "
                               f"({n} rollout rows + {total - n} padding rows); refusing to assign them to episodes.")
        if logprobs is not None and len(logprobs) != len(batch):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-prob lists for {len(batch)} prompts.")
        ids_out: list[list[int]] = []
        lp_out: list[list[float | None]] = []
        for i in range(n):
            ids = list(completion_ids[i])
            lps = logprobs[i] if logprobs is not None else [None] * len(ids)
            if len(lps) != len(ids):
                raise RuntimeError(f"vLLM returned {len(lps)} log-probs for a completion of {len(ids)} tokens.")
            kept, _ = cut_generated_turn(self.tokenizer, ids, self.stops)
            row = [sampled_logprob(x) for x in lps[: len(kept)]]
            self.stats["nan_logprobs"] += sum(1 for x in row if x is None)
            ids_out.append(kept)
            lp_out.append(row)
        return ids_out, lp_out

    def __call__(self, contexts: list[list[int]], keys: list[Any]) -> tuple[list[list[int]], list[list[float | None]]]:
        """One turn for this rank's active rows (a collective round when :attr:`collective`)."""
        return self._generate(contexts, self._round_size(len(contexts)))

    def drain(self) -> None:
        """After this rank's episodes have ended: join the other ranks' rounds until none has rows left."""
        if not self.collective:
            return
        while True:
            total = self._round_size(0)
            if total == 0:
                return
            self._generate([], total)


class TokenRecorder:
    """A policy for the shared rollout loop that generates token ids and records them.

    The loop is :meth:`drgym.envs.driver.BatchedDriver.run` (the one ``drgym rollout``
    runs); this object is its policy. Each :meth:`act` call it (1) appends the previous
    turn's observation tokens (``env_mask`` 0) to each continuing episode, after the
    bookkeeping rules below, (2) runs the generation step (``step(contexts, keys)``:
    :class:`HFTurnStep` or :class:`VLLMTurnStep`) once for every active row, (3) records
    the new ids (``env_mask`` 1) and returns their decoded text as the actions.

    Rules (Search-R1's layout, Jin et al. 2025, §3.1):

    - a turn is cut after its first stop string or eos (:func:`cut_generated_turn`),
      inside reasoning too (see :mod:`drgym.policies.generation`);
    - when the chat template opens ``<think>`` in the prompt, the episode's first turn is
      handed to the env behind that tag (:func:`~drgym.policies.generation.opened_reasoning`;
      the recorded ids are the model's own);
    - a turn that ended with eos while the episode goes on loses that eos, so the
      observation continues the turn's text (what the ``hf:`` policy renders);
    - the whole completion is capped at ``max_completion_tokens``: a turn is cut to the
      room left and ends the episode; an observation that leaves no room ends it too;
    - an episode ends after ``max_turns`` model turns;
    - an episode that ended with an answer but no eos is closed with a masked eos.

    Ending an episode is answering None for it: the driver then ends it as truncated
    (:meth:`drgym.envs.core.SearchAgentEnv.end_episode`).
    """

    name = "token-recorder"

    def __init__(self, step, tokenizer, settings: RolloutSettings) -> None:
        self.step, self.tokenizer, self.settings = step, tokenizer, settings
        self.records: dict[str, TokenRecord] = {}
        self._opened: dict[str, str] = {}  # episode id -> OPEN_TAG when its prompt ends inside <think>
        self.generation_s = 0.0

    def act(self, conversations: list[list[dict[str, Any]]], infos: list[dict[str, Any]] | None = None) -> list[str | None]:
        s, tok = self.settings, self.tokenizer
        actions: list[str | None] = [None] * len(conversations)
        rows: list[int] = []
        for k, (conv, info) in enumerate(zip(conversations, infos or [{}] * len(conversations))):
            eid = info["episode_id"]
            rec = self.records.get(eid)
            if rec is None:
                self.records[eid] = TokenRecord(prompt_ids=prompt_token_ids(tok, conv, enable_thinking=s.enable_thinking))
                # the chat template may open <think> in the prompt: the first turn is then handed
                # to the env behind that tag (drgym.policies.generation.opened_reasoning)
                self._opened[eid] = opened_reasoning(tok.decode(self.records[eid].prompt_ids, skip_special_tokens=False))
                rows.append(k)
                continue
            if rec.length_capped or rec.turns >= s.max_turns:
                continue  # None: the driver ends the episode
            if rec.completion_ids and rec.completion_ids[-1] == tok.eos_token_id:
                # the turn ended with eos but the episode goes on (an invalid action gets a
                # corrective observation): drop the eos, as Search-R1 does when it re-tokenises
                # the decoded turn
                rec.completion_ids.pop()
                rec.env_mask.pop()
                rec.logprobs.pop()
            obs = info.get("observation") or ""
            obs_ids = list(tok(obs, add_special_tokens=False)["input_ids"]) if obs else []
            if len(obs_ids) >= s.max_completion_tokens - len(rec.completion_ids):
                rec.length_capped = True  # no room left for the model to act on this observation
                continue
            rec.completion_ids += obs_ids
            rec.env_mask += [0] * len(obs_ids)
            rec.logprobs += [0.0] * len(obs_ids)
            rows.append(k)
        if not rows:
            return actions
        keys = [infos[k]["episode_id"] for k in rows]  # type: ignore[index]
        recs = [self.records[e] for e in keys]
        t0 = time.perf_counter()
        new_ids, new_lps = self.step([r.prompt_ids + r.completion_ids for r in recs], keys)
        self.generation_s += time.perf_counter() - t0
        for k, eid, rec, ids, lps in zip(rows, keys, recs, new_ids, new_lps):
            room = s.max_completion_tokens - len(rec.completion_ids)
            if len(ids) > room:
                ids, lps, rec.length_capped = ids[:room], lps[:room], True
            rec.completion_ids += ids
            rec.env_mask += [1] * len(ids)
            rec.logprobs += list(lps)
            actions[k] = (self._opened.pop(eid, "") if rec.turns == 0 else "") + tok.decode(ids, skip_special_tokens=True)
            rec.turns += 1
        return actions

    def finish(self, traj) -> TokenRecord:
        """The record of a finished episode, closed with a masked eos when it answered without one."""
        rec = self.records[traj.episode_id]
        eos = self.tokenizer.eos_token_id
        if traj.terminated and (not rec.completion_ids or rec.completion_ids[-1] != eos):
            # stopped on </answer>: close the turn with eos so TRL does not count it as clipped;
            # the model never sampled this token, so it is masked (env_mask 0).
            rec.completion_ids.append(eos)
            rec.env_mask.append(0)
            rec.logprobs.append(0.0)
        return rec


class SearchRolloutFunc:
    """A TRL ``rollout_func``: multi-turn episodes of a drgym env, tag protocol.

    Call contract (TRL 1.16, ``GRPOTrainer._generate``): ``f(prompts, trainer) -> dict``
    with ``prompts`` the generation batch, each dataset prompt already repeated
    ``num_generations`` times consecutively; one completion is returned per element.

    The episodes run in the shared rollout loop (:class:`drgym.envs.driver.BatchedDriver`,
    one ``search_batch`` per turn for every episode of the batch) with a
    :class:`TokenRecorder` as the policy. The dataset's ``prompt`` column must be the
    rendered chat prompt of a task, as made by :func:`drgym.training.data.build_dataset`;
    the prompt text is mapped back to its task through ``prompt_to_task``.

    Returns (per element of ``prompts``):
        ``prompt_ids`` (list[int]), ``completion_ids`` (list[int], model and observation
        tokens interleaved), ``logprobs`` (None on the HF backend; TRL recomputes them),
        ``env_mask`` (list[int], 1 model / 0 observation), and extra fields forwarded to
        the reward functions: ``final_answer`` (str, '' when none), ``trajectory`` (the
        episode as a ``Trajectory`` dict), ``num_turns``, ``num_searches``,
        ``invalid_actions``, ``truncated`` (bool) and ``env_reward_components``.
    """

    def __init__(self, env_factory, prompt_to_task: dict[str, Any], settings: RolloutSettings, *, tokenizer=None):
        self.env_factory = env_factory
        self.prompt_to_task = prompt_to_task
        self.settings = settings
        self.tokenizer = tokenizer
        self._pool: list[Any] = []
        self.last_timings: dict[str, float] = {}
        self.last_driver_stats: dict[str, float] = {}
        self.last_step_stats: dict[str, int] = {}
        self.history: list[list[str]] = []  # task ids of each call, in order (resume checks)
        self.model_tokens: list[list[int]] = []  # env_mask sums of each call (masking checks)

    # TRL passes ``trainer``; tests and the benchmark may call with a model/tokenizer pair.
    def __call__(self, prompts: list[Any], trainer) -> dict[str, Any]:
        tok = self.tokenizer or trainer.processing_class
        use_vllm = bool(getattr(getattr(trainer, "args", None), "use_vllm", False))
        model = getattr(trainer, "model", None)
        if model is not None and hasattr(trainer, "accelerator"):
            model = trainer.accelerator.unwrap_model(model)
        out = self.run(prompts, model=model, tokenizer=tok, trainer=trainer if use_vllm else None)
        self._log_metrics(trainer, out)
        return out

    def _envs(self, n: int) -> list[Any]:
        while len(self._pool) < n:
            self._pool.append(self.env_factory())
        return self._pool[:n]

    @staticmethod
    def stops(envs: list[Any]) -> tuple[str, ...]:
        """The stop strings of a turn: what the envs' tools declare in their protocol
        (:func:`drgym.envs.tools.stop_strings`), so a turn ends at every closing tag the
        system prompt describes (``</fetch>`` too when the env offers fetch).

        Raises:
            ConfigError: the envs disagree (one rollout batch shares one generation call).
        """
        found = {stop_strings(e.tools.values(), e.protocol) for e in envs}
        if len(found) != 1:
            raise ConfigError(f"the rollout's envs declare different stop strings {sorted(found)}; "
                              "every env of a rollout must have the same tools and protocol.")
        return found.pop()

    def run(self, prompts: list[Any], *, model=None, tokenizer, trainer=None, step=None) -> dict[str, Any]:
        """Run one episode per prompt; see the class docstring for the returned fields.

        ``step`` replaces the generation step (default :class:`VLLMTurnStep` with a
        vLLM ``trainer``, else :class:`HFTurnStep` on ``model``).
        """
        # the envs load here, not at import: drgym.training.config imports this module
        # for RolloutSettings, and the envs (gymnasium, rewards, judges) cost ~0.5 s
        from drgym.envs.driver import BatchedDriver

        tasks = []
        for p in prompts:
            key = p if isinstance(p, str) else str(p)
            if key not in self.prompt_to_task:
                raise ConfigError("rollout_func got a prompt that is not in its task table; build the dataset with "
                                  "drgym.training.data.build_dataset so prompts map to tasks.")
            tasks.append(self.prompt_to_task[key])
        self.history.append([t.task_id for t in tasks])
        envs = self._envs(len(prompts))
        if step is None:
            stops = self.stops(envs)
            step = VLLMTurnStep(trainer, tokenizer, self.settings, stops) if trainer is not None else HFTurnStep(
                model, tokenizer, self.settings, rows=len(prompts), stops=stops)
        recorder = TokenRecorder(step, tokenizer, self.settings)
        t0 = time.perf_counter()
        with BatchedDriver(envs) as driver:
            trajs = driver.run(recorder, [{"task": t} for t in tasks], seed=None)
        drain = getattr(step, "drain", None)
        if drain is not None:
            t1 = time.perf_counter()
            drain()  # collective vLLM: keep joining the other ranks' turns until they are done too
            recorder.generation_s += time.perf_counter() - t1
        wall = time.perf_counter() - t0

        result: dict[str, list] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "final_answer", "trajectory", "num_turns",
            "num_searches", "invalid_actions", "truncated", "env_reward_components")}
        for traj in trajs:
            rec = recorder.finish(traj)
            result["prompt_ids"].append(rec.prompt_ids)
            result["completion_ids"].append(rec.completion_ids)
            result["logprobs"].append(rec.logprobs)
            result["env_mask"].append(rec.env_mask)
            result["final_answer"].append(traj.final_answer or "")
            result["trajectory"].append(traj.to_dict())
            result["num_turns"].append(rec.turns)
            result["num_searches"].append(traj.count("search"))
            result["invalid_actions"].append(traj.count("invalid"))
            result["truncated"].append(not traj.terminated)
            result["env_reward_components"].append(dict(traj.reward_components or {}))
        if not step.returns_logprobs:
            result["logprobs"] = None  # HF backend: TRL recomputes log-probs itself
        self.last_timings = {"generation_s": recorder.generation_s, "env_s": wall - recorder.generation_s}
        self.last_driver_stats = dict(driver.stats)
        self.last_step_stats = dict(getattr(step, "stats", {}))
        if self.last_step_stats.get("nan_logprobs"):
            log.warning("vLLM returned no log-prob (NaN) for %d sampled tokens of this batch; they keep their place "
                        "and get no importance-sampling correction", self.last_step_stats["nan_logprobs"])
        self.model_tokens.append([sum(m) for m in result["env_mask"]])
        return result

    def _log_metrics(self, trainer, out: dict[str, Any]) -> None:
        """Append the batch's ``env/*``, ``rollout/*`` and ``timing/*`` metrics to the trainer's.

        Means are over the episodes of **every** rank (:func:`drgym.training.ranks.gather_rows`;
        TRL logs rank 0's metrics only); ``rollout/nan_logprobs`` and
        ``rollout/padding_rows`` are summed over ranks and ``timing/*`` is the slowest
        rank's (the step waits for it). With several processes this is a collective:
        every rank calls it once per ``rollout_func`` call.
        """
        metrics = getattr(trainer, "_metrics", None)
        if metrics is None:
            return
        eps = [(turns, searches, invalid, 0 if trunc else 1, 0 if ans.strip() else 1, len(ids) - sum(mask))
               for turns, searches, invalid, trunc, ans, ids, mask in zip(
                   out["num_turns"], out["num_searches"], out["invalid_actions"], out["truncated"],
                   out["final_answer"], out["completion_ids"], out["env_mask"])]
        mine = {"episodes": eps, "generation_s": self.last_timings.get("generation_s", 0.0),
                "env_s": self.last_timings.get("env_s", 0.0), "nan_logprobs": self.last_step_stats.get("nan_logprobs", 0),
                "padding_rows": self.last_step_stats.get("padding_rows", 0),
                "completion_tokens": sum(len(ids) for ids in out["completion_ids"])}
        ranks = gather_rows(trainer, [mine])
        rows = [e for r in ranks for e in r["episodes"]]
        n = max(1, len(rows))
        m = metrics["train" if trainer.model.training else "eval"]
        for j, name in enumerate(("env/turns_mean", "env/searches_mean", "env/invalid_actions_mean",
                                  "env/answered_frac", "env/empty_answer_frac", "env/obs_tokens_mean")):
            m[name].append(sum(e[j] for e in rows) / n)
        # share of the batch's completion tokens that are retrieved text (masked from the loss)
        m["env/retrieved_token_frac"].append(sum(e[5] for e in rows) / max(1, sum(r["completion_tokens"] for r in ranks)))
        if "nan_logprobs" in self.last_step_stats:  # vLLM
            m["rollout/nan_logprobs"].append(sum(r["nan_logprobs"] for r in ranks))
        if len(ranks) > 1:
            m["rollout/padding_rows"].append(sum(r["padding_rows"] for r in ranks))
        m["timing/generation_s"].append(max(r["generation_s"] for r in ranks))
        m["timing/env_s"].append(max(r["env_s"] for r in ranks))

