"""Multi-turn rollouts for TRL's ``GRPOTrainer(rollout_func=...)`` (Search-R1 tag protocol).

One rollout is one episode of ``drgym/SearchQA-v0``: the model writes a turn that ends
at ``</search>`` or ``</answer>`` (stop strings), the environment answers a search with
an ``<information>...</information>`` block, and the block's tokens are appended to the
*same* assistant turn, as in Search-R1 (Jin et al. 2025, §3.1 "loss masking for
retrieved tokens"). The completion handed to TRL is the interleaving of model tokens and
observation tokens; ``env_mask`` is 1 on model tokens and 0 on observation tokens, so
TRL 1.16 multiplies it into the loss mask (``loss_mask = completion_mask * tool_mask``).

The layout of the token ids is produced by one function, :func:`encode_segments`, which
the SFT warm start (:mod:`drgym.training.sft`) uses too, so SFT labels and GRPO masks
agree token for token.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from drgym.errors import ConfigError

log = logging.getLogger(__name__)

STOP_STRINGS = ("</search>", "</answer>")


# -- token layout ------------------------------------------------------------------------
def prompt_token_ids(tokenizer, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of the chat prompt (system + user), ending with the assistant header.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: ``{"role", "content"}`` dicts (the env's initial ``info["messages"]``).

    Returns:
        ``list[int]``: ``apply_chat_template(..., add_generation_prompt=True)`` tokenised
        without adding special tokens twice.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
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


def cut_at_stop(tokenizer, new_ids: list[int], stop_strings=STOP_STRINGS) -> tuple[list[int], bool]:
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
    from drgym.policies.generation import cut_ids_at_stop

    kept, reason = cut_ids_at_stop(tokenizer, new_ids, stop_strings, (tokenizer.eos_token_id,))
    return kept, reason == "eos"


# -- generation backends --------------------------------------------------------------------
def hf_generate(model, tokenizer, batch_ids: list[list[int]], *, max_new_tokens: int, temperature: float,
                do_sample: bool = True, top_k: int = 0, top_p: float = 1.0) -> list[list[int]]:
    """Sample one turn for each row with ``model.generate`` (left padding, stop strings).

    Args:
        model: a causal LM (possibly the trainer's model, in train mode).
        batch_ids: one ``list[int]`` context per row.
        max_new_tokens: per-turn cap.
        temperature: sampling temperature; must equal ``GRPOConfig.temperature`` because
            TRL recomputes log-probs with ``logits / temperature``.

    Returns:
        The new ids of each row, cut by :func:`cut_at_stop`.
    """
    ids, _state = hf_generate_turn(model, tokenizer, batch_ids, max_new_tokens=max_new_tokens,
                                   temperature=temperature, do_sample=do_sample, top_k=top_k, top_p=top_p)
    return ids


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
                     prev: TurnCache | None = None) -> tuple[list[list[int]], TurnCache | None]:
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

    Returns:
        ``(new_ids, turn_cache)``: each row's new ids cut by :func:`cut_at_stop`, and the
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
                stop_strings=list(STOP_STRINGS), tokenizer=tokenizer,
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
    kept = [cut_at_stop(tokenizer, row)[0] for row in new]
    new_cache = None if isinstance(out, torch.Tensor) else getattr(out, "cache", None)
    state = None
    if keys is not None and new_cache is not None:
        state = TurnCache(keys=list(keys), seq=seq, mask=attn, contexts=[list(c) for c in contexts], generated=new,
                          cache=new_cache)
    return kept, state


def vllm_generate(trainer, tokenizer, batch_ids: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one turn per row through TRL's vLLM engine (colocate or server mode).

    TRL's sampling parameters carry no stop strings, so each row is cut after generation
    by :func:`cut_at_stop`; the log-probs of the kept tokens are returned for TRL's
    importance-sampling correction.

    Returns:
        ``(ids, logprobs)`` per row.
    """
    _, completion_ids, logprobs, _ = trainer.vllm_generation.generate(prompts=batch_ids, images=None, num_generations=1)
    ids_out, lp_out = [], []
    for ids, lps in zip(completion_ids, logprobs):
        kept, _ = cut_at_stop(tokenizer, list(ids))
        ids_out.append(kept)
        lp_out.append([float(lp[0]) if isinstance(lp, (list, tuple)) else float(lp) for lp in lps[: len(kept)]])
    return ids_out, lp_out


# -- episodes -------------------------------------------------------------------------------
@dataclass
class RolloutSettings:
    """Budgets of one rollout (collapse guards).

    Attributes:
        max_turns: model turns per episode; a search on the last turn ends the episode
            unanswered (the env marks it truncated).
        max_new_tokens: tokens per model turn.
        max_completion_tokens: cap on the whole completion (model + observation tokens);
            TRL does not enforce ``max_completion_length`` on ``rollout_func`` output.
        temperature: sampling temperature (same as ``GRPOConfig.temperature``).
        gen_batch_size: rows per ``generate`` call on the HF backend.
        greedy: greedy decoding (evaluation); training samples.
        reuse_cache: on the HF backend, when a rollout batch fits one ``generate`` call
            (at most ``gen_batch_size`` episodes), keep the KV cache between turns so a
            turn encodes only the new observation (:func:`hf_generate_turn`); False
            re-encodes every context each turn.
    """

    max_turns: int = 2
    max_new_tokens: int = 64
    max_completion_tokens: int = 768
    temperature: float = 1.0
    gen_batch_size: int = 16
    greedy: bool = False
    reuse_cache: bool = True

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_completion_tokens", "gen_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"rollout.{name} must be a positive integer, got {v!r}.")
        if not self.temperature > 0:
            raise ConfigError(f"rollout.temperature must be > 0, got {self.temperature!r}.")


@dataclass
class EpisodeState:
    """One in-flight episode of a rollout batch (internal)."""

    env: Any
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[tuple[str, bool]] = field(default_factory=list)
    done: bool = False
    turns: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    length_capped: bool = False


def _reset_env(env, task) -> tuple[str, dict[str, Any]]:
    """Reset ``env`` on ``task`` (a :class:`~drgym.records.Task`)."""
    obs, info = env.reset(options={"task": task})
    return obs, info


def _initial_messages(obs: str, info: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = info.get("messages")
    if not msgs:
        raise ConfigError("the environment's reset() info has no 'messages'; drgym training needs the chat prompt there.")
    return [dict(m) for m in msgs]


class SearchRolloutFunc:
    """A TRL ``rollout_func``: multi-turn episodes of a drgym env, tag protocol.

    Call contract (TRL 1.16, ``GRPOTrainer._generate``): ``f(prompts, trainer) -> dict``
    with ``prompts`` the generation batch, each dataset prompt already repeated
    ``num_generations`` times consecutively; one completion is returned per element.

    The dataset's ``prompt`` column must be the rendered chat prompt of a task, as made
    by :func:`drgym.training.data.build_dataset`; the prompt text is mapped back to its
    task through ``prompt_to_task``.

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

    def _env(self, i: int):
        while len(self._pool) <= i:
            self._pool.append(self.env_factory())
        return self._pool[i]

    def run(self, prompts: list[Any], *, model, tokenizer, trainer=None) -> dict[str, Any]:
        """Run one episode per prompt; see the class docstring for the returned fields."""
        s = self.settings
        t_gen = t_env = 0.0
        states: list[EpisodeState] = []
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            key = p if isinstance(p, str) else str(p)
            if key not in self.prompt_to_task:
                raise ConfigError("rollout_func got a prompt that is not in its task table; build the dataset with "
                                  "drgym.training.data.build_dataset so prompts map to tasks.")
            env = self._env(i)
            if i == 0:
                self.history.append([])
            self.history[-1].append(self.prompt_to_task[key].task_id)
            obs, info = _reset_env(env, self.prompt_to_task[key])
            pids = prompt_token_ids(tokenizer, _initial_messages(obs, info))
            states.append(EpisodeState(env=env, prompt_ids=pids, info=info))
        t_env += time.perf_counter() - t0

        turn_cache: TurnCache | None = None
        for _turn in range(s.max_turns):
            active = [st for st in states if not st.done]
            if not active:
                break
            tg = time.perf_counter()
            new_ids: list[list[int]] = []
            new_lps: list[list[float]] = []
            # one chunk: the KV cache of the previous turn serves this one (HF backend)
            single = len(states) <= s.gen_batch_size and s.reuse_cache
            for b in range(0, len(active), s.gen_batch_size):
                rows = active[b: b + s.gen_batch_size]
                chunk = [st.prompt_ids + st.completion_ids for st in rows]
                if trainer is not None:
                    ids, lps = vllm_generate(trainer, tokenizer, chunk)
                else:
                    ids, turn_cache = hf_generate_turn(
                        model, tokenizer, chunk, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                        do_sample=not s.greedy, keys=[id(st) for st in rows] if single else None,
                        prev=turn_cache if single else None)
                    lps = [[0.0] * len(x) for x in ids]
                new_ids += ids
                new_lps += lps
            t_gen += time.perf_counter() - tg
            te = time.perf_counter()
            for st, ids, lps in zip(active, new_ids, new_lps):
                room = s.max_completion_tokens - len(st.completion_ids)
                if len(ids) > room:
                    ids, lps, st.length_capped = ids[:room], lps[:room], True
                st.completion_ids += ids
                st.env_mask += [1] * len(ids)
                st.logprobs += lps
                st.turns += 1
                text = tokenizer.decode(ids, skip_special_tokens=True)
                st.segments.append((text, True))
                obs, _r, term, trunc, info = st.env.step(text)
                st.info = info
                st.terminated, st.truncated = bool(term), bool(trunc)
                if term or trunc or st.length_capped:
                    st.done = True
                    continue
                if _turn == s.max_turns - 1:
                    st.done, st.truncated = True, True
                    continue
                if st.completion_ids and st.completion_ids[-1] == tokenizer.eos_token_id:
                    # the turn ended with eos but the episode goes on (an invalid action gets a
                    # corrective observation): drop the eos, as Search-R1 does when it re-tokenises
                    # the decoded turn, so the observation continues the turn's text and the
                    # context matches what drgym rollout's hf policy renders
                    st.completion_ids.pop()
                    st.env_mask.pop()
                    st.logprobs.pop()
                obs_ids = list(tokenizer(obs, add_special_tokens=False)["input_ids"]) if obs else []
                room = s.max_completion_tokens - len(st.completion_ids)
                if len(obs_ids) >= room:  # no room left for the model to act on this observation
                    st.done, st.truncated, st.length_capped = True, True, True
                    continue
                st.completion_ids += obs_ids
                st.env_mask += [0] * len(obs_ids)
                st.logprobs += [0.0] * len(obs_ids)
                st.segments.append((obs, False))
            t_env += time.perf_counter() - te

        eos = tokenizer.eos_token_id
        result: dict[str, list] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "final_answer", "trajectory", "num_turns",
            "num_searches", "invalid_actions", "truncated", "env_reward_components")}
        for st in states:
            if st.terminated and (not st.completion_ids or st.completion_ids[-1] != eos):
                # stopped on </answer>: close the turn with eos so TRL does not count it as clipped;
                # the model never sampled this token, so it is masked (env_mask 0).
                st.completion_ids.append(eos)
                st.env_mask.append(0)
                st.logprobs.append(0.0)
            traj = _trajectory_dict(st)
            result["prompt_ids"].append(st.prompt_ids)
            result["completion_ids"].append(st.completion_ids)
            result["logprobs"].append(st.logprobs)
            result["env_mask"].append(st.env_mask)
            result["final_answer"].append(traj.get("final_answer") or "")
            result["trajectory"].append(traj)
            result["num_turns"].append(st.turns)
            result["num_searches"].append(_count_calls(traj, "search"))
            result["invalid_actions"].append(_count_calls(traj, "invalid"))
            result["truncated"].append(not st.terminated)
            result["env_reward_components"].append(dict(traj.get("reward_components") or {}))
        if trainer is None:
            result["logprobs"] = None  # HF backend: TRL recomputes log-probs itself
        self.last_timings = {"generation_s": t_gen, "env_s": t_env}
        self.model_tokens.append([sum(m) for m in result["env_mask"]])
        return result

    def _log_metrics(self, trainer, out: dict[str, Any]) -> None:
        metrics = getattr(trainer, "_metrics", None)
        if metrics is None:
            return
        mode = "train" if trainer.model.training else "eval"
        n = max(1, len(out["num_turns"]))
        m = metrics[mode]
        m["env/turns_mean"].append(sum(out["num_turns"]) / n)
        m["env/searches_mean"].append(sum(out["num_searches"]) / n)
        m["env/invalid_actions_mean"].append(sum(out["invalid_actions"]) / n)
        m["env/answered_frac"].append(sum(1 for t in out["truncated"] if not t) / n)
        m["env/empty_answer_frac"].append(sum(1 for a in out["final_answer"] if not a.strip()) / n)
        m["env/obs_tokens_mean"].append(sum(len(x) - sum(y) for x, y in zip(out["completion_ids"], out["env_mask"])) / n)
        m["timing/generation_s"].append(self.last_timings.get("generation_s", 0.0))
        m["timing/env_s"].append(self.last_timings.get("env_s", 0.0))


def _trajectory_dict(st: EpisodeState) -> dict[str, Any]:
    traj = st.info.get("trajectory")
    if traj is not None:
        return traj.to_dict() if hasattr(traj, "to_dict") else dict(traj)
    env = getattr(st.env, "unwrapped", st.env)
    for attr in ("trajectory", "_trajectory"):
        t = getattr(env, attr, None)
        if t is not None and hasattr(t, "to_dict"):
            return t.to_dict()
    return {"final_answer": st.info.get("final_answer"), "reward_components": st.info.get("reward_components") or {},
            "steps": []}


def _count_calls(traj: dict[str, Any], name: str) -> int:
    return sum(1 for s in traj.get("steps") or [] for c in s.get("tool_calls") or [] if c.get("name") == name)
