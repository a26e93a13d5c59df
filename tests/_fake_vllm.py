"""Recording fakes for TRL 1.16's vLLM generation, so its REAL code runs without vLLM or a GPU.

What is real and what is fake:

- ``trl.generation.vllm_generation.VLLMGeneration.generate`` is TRL's own code (the
  object is built with ``__new__``, skipping ``_init_vllm``, which needs vLLM and CUDA).
- Server mode: ``trl.generation.vllm_client.VLLMClient.generate`` and its
  ``parse_logprobs`` are TRL's own; only the HTTP session is replaced by
  :class:`FakeCompletionsSession`, which answers ``POST /v1/completions`` as vLLM's
  OpenAI server does (``return_token_ids``, ``token_id:<id>`` logprob tokens, ``n``
  choices per prompt, ``max_tokens``, ``stop`` with ``include_stop_str_in_output``), with
  a JSON round trip (NaN logprobs travel as ``NaN``, as Python's json writes them).
- Colocate mode: ``vllm.LLM`` is :class:`FakeLLM` and ``vllm.SamplingParams`` is
  :class:`FakeSamplingParams`; TRL's ``extract_logprobs`` is real.
- Several training processes are threads; :class:`FakeCollective` stands in for
  accelerate's ``gather_object`` and ``broadcast_object_list`` (a barrier per call, with
  a timeout: a rank that skips a collective makes the others fail instead of hanging).

The "model" behind both engines is :class:`ScriptedSearcher`: from the decoded prompt it
finds the question and how many ``<information>`` blocks the episode has seen, and writes
``<search> question </search>`` until the question's search budget is spent, then
``<answer> gold </answer>``, each followed by more text (a model that does not stop by
itself), so stop strings and token caps change what comes back.
"""

from __future__ import annotations

import copy
import json
import math
import threading
from collections import defaultdict
from types import SimpleNamespace
from typing import Any


# -- processes as threads -------------------------------------------------------------------
class CollectiveMismatch(RuntimeError):
    """Ranks met in a collective with different operations."""


class FakeCollective:
    """``gather_object`` / ``broadcast_object_list`` across ``world`` ranks run as threads.

    Each thread calls :meth:`bind` with its rank first. Every collective waits for all
    ranks (``threading.Barrier`` with ``timeout`` seconds: a rank that never arrives
    breaks the barrier, which raises ``threading.BrokenBarrierError`` in every waiting
    rank). ``log`` holds one ``(op, [len of each rank's object])`` per collective.
    """

    def __init__(self, world: int, timeout: float = 20.0) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=timeout)
        self._local = threading.local()
        self._slots: list[Any] = [None] * world
        self._ops: list[str | None] = [None] * world
        self.log: list[tuple[str, list[int]]] = []

    def bind(self, rank: int) -> None:
        self._local.rank = rank

    @property
    def rank(self) -> int:
        return self._local.rank

    def _meet(self, op: str, obj: Any) -> list[Any]:
        r = self.rank
        self._slots[r], self._ops[r] = obj, op
        self.barrier.wait()
        ops, slots = list(self._ops), list(self._slots)
        self.barrier.wait()  # everyone has read the slots before they are reused
        if len(set(ops)) != 1:
            raise CollectiveMismatch(f"rank {r} is in {op} while the ranks are in {ops}")
        if r == 0:
            self.log.append((op, [len(s) if isinstance(s, list) else -1 for s in slots]))
        return slots

    def gather_object(self, obj: Any) -> list[Any]:
        """accelerate's ``gather_object``: every rank's list, concatenated in rank order."""
        slots = self._meet("gather_object", list(obj))
        return [x for s in slots for x in s]

    def broadcast_object_list(self, object_list: list[Any], from_process: int = 0) -> list[Any]:
        """accelerate's ``broadcast_object_list``: rank ``from_process``'s list, in place."""
        slots = self._meet("broadcast_object_list", list(object_list))
        object_list[:] = copy.deepcopy(slots[from_process])  # a copy, as pickling over the wire makes
        return object_list

    def install(self, monkeypatch) -> None:
        """Replace the collectives TRL's vLLM generation and drgym's rank reductions call."""
        import accelerate.utils
        import trl.generation.vllm_generation as vg

        monkeypatch.setattr(vg, "gather_object", self.gather_object)
        monkeypatch.setattr(vg, "broadcast_object_list", self.broadcast_object_list)
        monkeypatch.setattr(accelerate.utils, "gather_object", self.gather_object)


def fake_accelerator(rank: int, world: int) -> SimpleNamespace:
    """What TRL's ``generate`` and drgym read from ``accelerate.Accelerator``."""
    return SimpleNamespace(process_index=rank, num_processes=world, is_main_process=rank == 0,
                           local_process_index=rank, device="cpu", unwrap_model=lambda m: m)


def run_ranks(world: int, fn, collective: FakeCollective | None = None) -> list[Any]:
    """Run ``fn(rank)`` in ``world`` threads; return the results, re-raising the first error."""
    results: list[Any] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def main(r: int) -> None:
        if collective is not None:
            collective.bind(r)
        try:
            results[r] = fn(r)
        except BaseException as e:  # re-raised below in the test's thread
            errors[r] = e
            if collective is not None:
                collective.barrier.abort()  # do not leave the other ranks waiting

    threads = [threading.Thread(target=main, args=(r,), name=f"rank{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for e in errors:
        if e is not None and not isinstance(e, threading.BrokenBarrierError):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results


# -- the scripted model ---------------------------------------------------------------------
class ScriptedSearcher:
    """Text a search agent would write, as a function of its prompt.

    Args:
        tokenizer: the policy tokenizer (prompts are decoded with it, texts encoded).
        plan: question -> ``(searches, answer)``: the number of searches before answering.
        ramble: text written after the action (a model that goes on past ``</search>``).
        preamble: question -> text written before the action (e.g. long reasoning).
        nan_at: logprob positions (token indices of a completion) reported as NaN.
    """

    def __init__(self, tokenizer, plan: dict[str, tuple[int, str]], *, ramble: str = " Then I will <answer> not this </answer> and keep writing.",
                 preamble: dict[str, str] | None = None, nan_at: tuple[int, ...] = ()) -> None:
        self.tok = tokenizer
        self.plan = plan
        self.ramble = ramble
        self.preamble = preamble or {}
        self.nan_at = set(nan_at)
        self.dummy_prompts = 0

    def text(self, prompt_ids: list[int]) -> str:
        ctx = self.tok.decode(prompt_ids, skip_special_tokens=False)
        q = next((q for q in self.plan if q in ctx), None)
        if q is None:  # a padding row: nobody must ever see this
            self.dummy_prompts += 1
            return "<answer> PADDING ROW </answer>"
        searches, answer = self.plan[q]
        seen = ctx.count("<information>Doc")
        pre = self.preamble.get(q, "")
        act = f"<search> {q} </search>" if seen < searches else f"<answer> {answer} </answer>"
        return pre + act + self.ramble

    def complete(self, prompt_ids: list[int], *, max_tokens: int, stop: list[str] | None,
                 include_stop: bool) -> tuple[list[int], list[float], str]:
        """vLLM's token-level result: ``(token_ids, logprobs, finish_reason)``.

        A stop string ends generation at the token that completes it (kept when
        ``include_stop``); otherwise the text ends with eos; ``max_tokens`` caps both.
        """
        text = self.text(prompt_ids)
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        finish = "stop"
        if stop:
            for n in range(1, len(ids) + 1):
                if any(s in self.tok.decode(ids[:n]) for s in stop):
                    ids = ids[:n] if include_stop else ids[: n - 1]
                    break
            else:
                ids.append(self.tok.eos_token_id)
        else:
            ids.append(self.tok.eos_token_id)
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        lps = [float("nan") if i in self.nan_at else -0.5 - 0.01 * i for i in range(len(ids))]
        return ids, lps, finish


# -- server mode: vLLM's OpenAI completions endpoint ---------------------------------------
class _Response:
    def __init__(self, body: dict) -> None:
        self.status_code = 200
        self._text = json.dumps(body)  # NaN -> "NaN", as Python's json and vLLM's server write it
        self.text = self._text

    def json(self) -> dict:
        return json.loads(self._text)


class FakeCompletionsSession:
    """A ``requests.Session`` stand-in answering ``POST {base}/v1/completions`` like vLLM.

    ``requests`` records each request body. ``drop_last`` answers one completion short
    (a server bug the rollout must catch instead of zipping the wrong rows).
    """

    def __init__(self, model: ScriptedSearcher) -> None:
        self.model = model
        self.requests: list[dict] = []
        self.drop_last = False
        self._lock = threading.Lock()

    def post(self, url: str, json: dict | None = None, **kw) -> _Response:  # noqa: A002 - requests' name
        assert url.endswith("/v1/completions"), url
        body = json or {}
        with self._lock:
            self.requests.append(body)
        choices = []
        for prompt in body["prompt"]:
            for _ in range(int(body.get("n", 1))):
                ids, lps, finish = self.model.complete(
                    prompt, max_tokens=int(body["max_tokens"]), stop=body.get("stop"),
                    include_stop=bool(body.get("include_stop_str_in_output", False)))
                toks = [f"token_id:{i}" for i in ids]
                choices.append({"index": len(choices), "prompt_token_ids": prompt, "token_ids": ids,
                                "finish_reason": finish,
                                "logprobs": {"tokens": toks, "token_logprobs": lps,
                                             "top_logprobs": [{t: lp} for t, lp in zip(toks, lps)]}})
        if self.drop_last:
            choices = choices[:-1]
        return _Response({"id": "cmpl-fake", "object": "text_completion", "choices": choices})


def server_client(model: ScriptedSearcher):
    """TRL's real ``VLLMClient`` over :class:`FakeCompletionsSession` (``__init__`` needs vLLM)."""
    from trl.generation.vllm_client import VLLMClient

    c = VLLMClient.__new__(VLLMClient)
    c.session = FakeCompletionsSession(model)
    c.base_url = "http://fake-vllm:8000"
    c.host = "fake-vllm"
    c.model = "fake-model"
    return c


# -- colocate mode: vllm.LLM ----------------------------------------------------------------
class FakeSamplingParams:
    """``vllm.SamplingParams``: keeps its keyword arguments."""

    def __init__(self, **kw: Any) -> None:
        self.kw = kw


class FakeLLM:
    """``vllm.LLM.generate`` over :class:`ScriptedSearcher`; ``calls`` records each call's params."""

    def __init__(self, model: ScriptedSearcher) -> None:
        self.model = model
        self.calls: list[dict] = []

    def generate(self, prompts: list[dict], sampling_params: FakeSamplingParams, use_tqdm: bool = False):
        kw = sampling_params.kw
        self.calls.append({"n_prompts": len(prompts), **kw})
        outs = []
        for p in prompts:
            seqs = []
            for _ in range(int(kw.get("n", 1))):
                ids, lps, _ = self.model.complete(p["prompt_token_ids"], max_tokens=int(kw["max_tokens"]),
                                                  stop=kw.get("stop"), include_stop=bool(kw.get("include_stop_str_in_output")))
                logprobs = [{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(ids, lps)]
                seqs.append(SimpleNamespace(token_ids=ids, logprobs=logprobs))
            outs.append(SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=seqs))
        return outs


# -- TRL's VLLMGeneration without _init_vllm ------------------------------------------------
def vllm_generation(accelerator, *, mode: str, client=None, llm=None, max_completion_length: int = 512,
                    generation_kwargs: dict | None = None, temperature: float = 1.0):
    """A real ``VLLMGeneration`` with the attributes ``__init__`` sets, minus the engine start."""
    from trl.generation.vllm_generation import VLLMGeneration

    g = VLLMGeneration.__new__(VLLMGeneration)
    import torch

    # a stand-in module: TRL asks accelerate's is_peft_model(self.model), which needs a module
    # once peft is installed (a None model fails there, not in the code under test)
    g.model, g.accelerator, g.processing_class = torch.nn.Linear(1, 1), accelerator, None
    g.mode, g.structured_outputs_regex = mode, None
    g.server_base_url, g.server_host, g.server_port, g.group_port, g.server_timeout = None, "0.0.0.0", 8000, 51216, 240.0
    g.tensor_parallel_size, g.gpu_memory_utilization, g.max_model_length, g.max_num_seqs = 1, 0.9, None, None
    g.enable_sleep_mode, g.model_impl, g.trust_remote_code = False, "auto", False
    g.repetition_penalty, g.temperature, g.top_p, g.top_k, g.min_p = 1.0, temperature, 1.0, 0, 0.0
    g.max_completion_length, g.logprobs = max_completion_length, 0
    g.generation_kwargs = dict(generation_kwargs or {})
    g._weight_metadata = None
    g._llm_weights_sleeping = False
    if mode == "server" and accelerator.is_main_process:
        g.vllm_client = client
    if mode == "colocate":
        g.llm = llm
    return g


class FakeTrainer:
    """The parts of ``GRPOTrainer`` that ``SearchRolloutFunc`` and ``GroupMonitor`` read."""

    def __init__(self, accelerator, vllm_generation=None, tokenizer=None) -> None:
        self.accelerator = accelerator
        self.vllm_generation = vllm_generation
        self.processing_class = tokenizer
        self.args = SimpleNamespace(use_vllm=vllm_generation is not None)
        self.model = SimpleNamespace(training=True)
        self.state = SimpleNamespace(global_step=3)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}


def finite(x: float | None) -> bool:
    return x is not None and not math.isnan(x)
