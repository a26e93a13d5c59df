"""SFT warm start from trajectories (TRL ``SFTTrainer``), observations masked.

SmolLM2-135M never emits ``<search>``/``<answer>`` zero-shot (0 of 40 trial episodes); a short SFT on trajectories of the
scripted policy (or any ``drgym rollout`` JSONL) teaches the protocol before GRPO.

Each trajectory becomes one example whose token layout is exactly the GRPO rollout's
(:func:`drgym.training.rollout.encode_segments`): the chat prompt, then one assistant
turn made of model actions and ``<information>`` observations, closed by eos. Labels
are -100 on the prompt and on observation tokens, as in Search-R1's loss masking
(Jin et al. 2025, §3.1), so SFT and GRPO train on the same tokens.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from drgym.envs.driver import BatchedDriver, write_trajectories
from drgym.training.config import TaskSlice, build_peft_config, build_sft_args
from drgym.training.data import load_task_slice, make_env_factory
from drgym.training.rollout import encode_segments, prompt_token_ids

from drgym.atomic import atomic_write_json, read_jsonl
from drgym.errors import ConfigError
from drgym.models import load_model, load_tokenizer
from drgym.policies.scripted import ScriptedPolicy
from drgym.records import Trajectory

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
_ANSWER_RE = re.compile(r"<answer>.*?</answer>", re.DOTALL)


def load_trajectories(paths: list[str | Path]):
    """Read ``Trajectory`` records from JSONL files (one episode per line).

    Raises:
        ConfigError: a file is missing or holds no valid trajectory.
    """
    out = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise ConfigError(f"trajectory file {p} does not exist; write one with `drgym rollout ... --out {p}`.")
        rows = read_jsonl(p)
        for i, d in enumerate(rows):
            try:
                out.append(Trajectory.from_dict(d))
            except (KeyError, TypeError) as e:
                raise ConfigError(f"{p}: line {i + 1} is not a Trajectory record ({e}).") from e
    if not out:
        raise ConfigError(f"no trajectories in {', '.join(map(str, paths))}.")
    return out


def prompt_messages(traj) -> list[dict[str, Any]]:
    """The system/user messages that precede the first assistant turn of ``traj``.

    Raises:
        ConfigError: the trajectory has no user message.
    """
    msgs = []
    for m in traj.messages:
        if m.get("role") == "assistant":
            break
        msgs.append({"role": m["role"], "content": m.get("content") or ""})
    if not any(m["role"] == "user" for m in msgs):
        raise ConfigError(f"trajectory {traj.episode_id} has no user message before its first assistant turn.")
    return msgs


def trajectory_segments(traj, *, gold_answer: str | None = None) -> list[tuple[str, bool]]:
    """``(text, is_model)`` segments of the assistant turn of a tag-protocol trajectory.

    Args:
        traj: a finished trajectory.
        gold_answer: if given, the text inside the last ``<answer>...</answer>`` is
            replaced by it (expert data: the protocol *and* the right span).

    Returns:
        Actions (model) alternating with the observations that followed them (env);
        the observation after the last action is dropped.
    """
    segs: list[tuple[str, bool]] = []
    n = len(traj.steps)
    for i, s in enumerate(traj.steps):
        action = s.action
        if i == n - 1 and gold_answer is not None:
            if _ANSWER_RE.search(action):
                action = _ANSWER_RE.sub(f"<answer> {gold_answer} </answer>", action, count=1)
            else:
                action = f"<answer> {gold_answer} </answer>"
        segs.append((action, True))
        if i < n - 1 and s.observation:
            segs.append((s.observation, False))
    return segs


def encode_trajectory(tokenizer, traj, *, gold_answer: str | None = None, max_length: int = 1024,
                      enable_thinking: bool | None = None) -> dict[str, list[int]]:
    """One SFT example: ``input_ids`` and ``labels`` (-100 on prompt and observations).

    The prompt is rendered as GRPO renders it (``enable_thinking``: the chat template's
    thinking switch, None for its default).

    Returns:
        ``{"input_ids": list[int], "labels": list[int]}`` of equal length, at most
        ``max_length`` (cut from the right).
    """
    pids = prompt_token_ids(tokenizer, prompt_messages(traj), enable_thinking=enable_thinking)
    cids, mask = encode_segments(tokenizer, trajectory_segments(traj, gold_answer=gold_answer),
                                 end_with_eos=traj.final_answer is not None or gold_answer is not None)
    ids = pids + cids
    labels = [IGNORE_INDEX] * len(pids) + [t if m else IGNORE_INDEX for t, m in zip(cids, mask)]
    return {"input_ids": ids[:max_length], "labels": labels[:max_length]}


def build_sft_dataset(tokenizer, trajectories, *, tasks_by_id: dict[str, Any] | None = None, gold_answers: bool = False,
                      min_reward: float | None = None, max_length: int = 1024, enable_thinking: bool | None = None):
    """A ``datasets.Dataset`` of ``input_ids``/``labels`` rows from trajectories.

    Args:
        tokenizer: the policy's tokenizer.
        trajectories: ``Trajectory`` records (tag protocol).
        tasks_by_id: tasks by ``task_id``; needed for ``gold_answers``.
        gold_answers: replace each final answer by the task's first gold answer.
        min_reward: keep only trajectories whose ``reward`` is at least this.
        max_length: token cap per example.
        enable_thinking: the chat template's thinking switch (see :func:`encode_trajectory`).

    Raises:
        ConfigError: nothing left after filtering, or gold answers asked without tasks.
    """
    from datasets import Dataset

    rows = []
    skipped = 0
    for t in trajectories:
        if not t.steps:
            skipped += 1
            continue
        if min_reward is not None and (t.reward is None or t.reward < min_reward):
            skipped += 1
            continue
        gold = None
        if gold_answers:
            if not tasks_by_id or t.task_id not in tasks_by_id:
                raise ConfigError(f"gold answers asked but task {t.task_id!r} is not in the task table.")
            answers = tasks_by_id[t.task_id].answers
            if not answers:
                skipped += 1
                continue
            gold = answers[0]
        rows.append(encode_trajectory(tokenizer, t, gold_answer=gold, max_length=max_length,
                                      enable_thinking=enable_thinking))
    if not rows:
        raise ConfigError(f"no SFT examples left ({skipped} trajectories skipped by the filters).")
    log.info("SFT dataset: %d examples (%d skipped)", len(rows), skipped)
    return Dataset.from_list(rows)


def freeze_bottom(model, trainable_layers: int | None) -> tuple[int, int]:
    """Freeze the embeddings and all but the top ``trainable_layers`` decoder layers.

    SmolLM2 ties ``lm_head`` to the input embeddings, so the head is frozen with them.

    Returns:
        ``(trainable, total)`` parameter counts.
    """
    if trainable_layers is not None:
        layers = _decoder_layers(model)
        keep = set(range(max(0, len(layers) - trainable_layers), len(layers)))
        for p in model.parameters():
            p.requires_grad_(False)
        for i, layer in enumerate(layers):
            if i in keep:
                for p in layer.parameters():
                    p.requires_grad_(True)
        norm = getattr(getattr(model, "model", model), "norm", None)
        if norm is not None and trainable_layers > 0:
            for p in norm.parameters():
                p.requires_grad_(True)
    return count_parameters(model)


def count_parameters(model) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts of ``model`` (a PEFT model counts its adapter as trainable)."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total


def _decoder_layers(model):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ConfigError(f"cannot find decoder layers on {type(model).__name__} to apply trainable_layers.")
    return layers


def refuse_earlier_run(out: Path) -> None:
    """Raise when ``out`` holds an earlier training run (its logs or checkpoints).

    A fresh run there would append to the old ``metrics.jsonl`` and leave higher-numbered
    ``checkpoint-N`` folders that a later ``--resume`` would pick up.

    Raises:
        ConfigError: ``out`` has ``metrics.jsonl`` or a ``checkpoint-N`` folder.
    """
    if not out.is_dir():
        return
    found = sorted(p.name for p in out.glob("checkpoint-*") if p.is_dir())
    if (out / "metrics.jsonl").exists():
        found.insert(0, "metrics.jsonl")
    if found:
        raise ConfigError(f"{out} holds an earlier run ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}); "
                          "pass --resume to continue it, or another --output-dir, or remove it.")


def run_sft(cfg, trajectory_paths: list[str | Path], *, output_dir: str | None = None, gold_answers: bool = False,
            min_reward: float | None = None, resume: bool = False, extra_callbacks=None) -> Path:
    """Fine-tune ``cfg.model`` on trajectories and save the result.

    Args:
        cfg: the run config (its ``sft`` section gives ``trl.SFTConfig`` arguments).
        trajectory_paths: JSONL files of ``Trajectory`` records.
        output_dir: where checkpoints and the final model go (default
            ``<cfg.output_dir>/sft``); the final model is in ``<output_dir>/final``.
        gold_answers: see :func:`build_sft_dataset`.
        resume: continue from the last checkpoint in ``output_dir``.

    Returns:
        The folder of the final model (loadable as ``model:`` in a GRPO config).
    """
    import torch
    from drgym.training.callbacks import (
        JsonlLoggerCallback,
        TrainingRecordCallback,
        write_training_record,
    )
    from trl import SFTTrainer

    args = build_sft_args(cfg, output_dir)
    cfg.apply_threads()
    out = Path(args.output_dir)
    if not resume:
        refuse_earlier_run(out)
    peft_config = build_peft_config(cfg)
    tok = load_tokenizer(cfg.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    trajs = load_trajectories(trajectory_paths)
    tasks_by_id = None
    if gold_answers:
        tasks_by_id = _tasks_for(cfg, {t.task_id for t in trajs})
    ds = build_sft_dataset(tok, trajs, tasks_by_id=tasks_by_id, gold_answers=gold_answers, min_reward=min_reward,
                           max_length=int(cfg.sft.get("max_length") or 1024), enable_thinking=cfg.enable_thinking)
    torch.manual_seed(cfg.seed)
    # an adapter folder as cfg.model goes on training its adapter; peft_config adds a new one
    model = load_model(cfg.model, dtype=torch.float32, adapter="trainable")
    freeze_bottom(model, cfg.trainable_layers)
    callbacks = [JsonlLoggerCallback(out / "metrics.jsonl"), TrainingRecordCallback(cfg, "sft")] + list(extra_callbacks or [])
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=callbacks,
                         peft_config=peft_config)
    trainable, total = count_parameters(trainer.model)
    log.info("SFT: %d / %d parameters trainable", trainable, total)
    trainer.train(resume_from_checkpoint=_last_checkpoint(out) if resume else None)
    final = out / "final"
    trainer.save_model(str(final))
    tok.save_pretrained(str(final))
    write_training_record(final, cfg, "sft")
    atomic_write_json(out / "sft_summary.json", {
        "examples": len(ds), "trajectories": [str(p) for p in trajectory_paths], "gold_answers": gold_answers,
        "trainable_params": trainable, "total_params": total, "global_step": trainer.state.global_step,
        "loss_tokens": int(sum(sum(1 for x in r if x != IGNORE_INDEX) for r in ds["labels"])),
        "tokens": int(sum(len(r) for r in ds["input_ids"])),
    })
    return final


def _last_checkpoint(out: Path) -> str | None:
    from drgym.training.callbacks import last_complete_checkpoint

    return last_complete_checkpoint(out)  # a checkpoint torn by a kill is skipped


def _tasks_for(cfg, ids: set[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for split in ("train", "eval"):
        if split in cfg.tasks:
            for t in load_task_slice(cfg.tasks[split], whole=True):
                if t.task_id in ids:
                    found[t.task_id] = t
    return found


def make_scripted_trajectories(cfg, out_path: str | Path, *, split: str = "train", start: int | None = None,
                               limit: int | None = None, max_turns: int | None = None, backend=None) -> list:
    """Roll out the scripted policy (search the question, answer a span of the top hit).

    Uses :class:`drgym.policies.scripted.ScriptedPolicy` (``fetch=False``) in the run's
    env over the config's ``tasks.<split>`` slice, stepped by
    :class:`drgym.envs.driver.BatchedDriver`, and writes the trajectories as JSONL.
    With ``--gold-answers`` at SFT time these become expert demonstrations of the
    protocol: one search, the real retrieved ``<information>``, the gold answer.

    Args:
        backend: a search backend instead of the one ``cfg.search`` builds.

    Returns:
        The trajectories.
    """
    ts = cfg.tasks[split]
    ts = TaskSlice(set=ts.set, start=ts.start if start is None else start, limit=ts.limit if limit is None else limit)
    tasks = load_task_slice(ts)
    factory = make_env_factory(cfg, tasks, max_turns=max_turns, backend=backend)
    envs = [factory() for _ in range(min(8, len(tasks)))]
    with BatchedDriver(envs) as driver:
        trajs = driver.run(ScriptedPolicy(protocol="tags", fetch=False), [{"task": t} for t in tasks], seed=cfg.seed)
    write_trajectories(out_path, trajs)
    return trajs
