"""GRPO on TRL with multi-turn drgym rollouts (``drgym train grpo``).

Two paths, chosen by the config's ``protocol``:

``tags`` (default)
    ``GRPOTrainer(rollout_func=SearchRolloutFunc(...))`` drives ``drgym/SearchQA-v0``
    with the Search-R1 tag protocol; observation tokens get ``env_mask`` 0 and are
    excluded from the loss (TRL 1.16 ``loss_mask = completion_mask * tool_mask``).
``json``
    ``GRPOTrainer(environment_factory=...)``: TRL's own tool loop with JSON tool calls
    rendered by the chat template (:mod:`drgym.training.toolenv`). SmolLM2's template
    cannot render tool calls, so TRL's ``qwen2_5.jinja`` (same ChatML tokens) is swapped
    in (``shared/notes/stack_check.md`` §5).

Rewards are drgym reward modules (``drgym.rewards``) adapted to TRL's
``f(prompts, completions, **kwargs) -> list[float | None]``; each is one TRL reward
function, so TRL logs ``rewards/<name>/mean`` and ``/std`` per component. GRPO itself is
Shao et al. 2024 (DeepSeekMath, §4.1); TRL's default loss here is DAPO's token-level
normalisation (Yu et al. 2025).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from drgym.errors import ConfigError

log = logging.getLogger(__name__)


# -- tasks, env, dataset ----------------------------------------------------------------------
def load_task_slice(ts, *, whole: bool = False) -> list:
    """``load_tasks(ts.set)[ts.start : ts.start + ts.limit]`` (or the whole set).

    Raises:
        ConfigError: unknown task set, or an empty slice.
    """
    from drgym.envs.task_loaders import load_tasks

    tasks = list(load_tasks(ts.set))
    if whole:
        return tasks
    end = None if ts.limit is None else ts.start + ts.limit
    out = tasks[ts.start:end]
    if not out:
        raise ConfigError(f"task slice {ts.set}[{ts.start}:{end}] is empty ({len(tasks)} tasks in the set).")
    return out


_BACKENDS: dict[str, Any] = {}


def build_backend(search_cfg: dict[str, Any]):
    """The search backend of a run, built once per process per config.

    ``{corpus: NAME}`` alone gives the env's process-wide default engine
    (:func:`drgym.envs.core.default_backend`); other keys (``method: bm25``,
    ``encoder``...) go to :meth:`drgym.search.local.LocalSearchEngine.from_corpus`.

    Raises:
        ConfigError: unknown corpus or argument (from the search layer).
    """
    import json

    kw = dict(search_cfg)
    corpus = kw.pop("corpus", "wiki-default")
    key = json.dumps([corpus, kw], sort_keys=True)
    if key not in _BACKENDS:
        if not kw:
            from drgym.envs.core import default_backend

            _BACKENDS[key] = default_backend(corpus)
        else:
            from drgym.search.local import LocalSearchEngine

            try:
                _BACKENDS[key] = LocalSearchEngine.from_corpus(corpus, **kw)
            except TypeError as e:
                raise ConfigError(f"bad search settings {search_cfg!r}: {e}") from e
    return _BACKENDS[key]


def make_env_factory(cfg, tasks: list, *, backend=None, max_turns: int | None = None):
    """A zero-argument factory of configured envs (``gymnasium.make(cfg.env.id, ...)``).

    The env's ``max_turns`` follows ``rollout.max_turns`` unless ``env.kwargs`` sets it.
    The search backend is built once and shared.
    """
    import gymnasium as gym

    import drgym.envs  # noqa: F401  (registers the env ids)

    kwargs = dict(cfg.env.get("kwargs") or {})
    kwargs.setdefault("max_turns", max_turns or cfg.rollout_settings().max_turns)
    kwargs.setdefault("protocol", cfg.protocol)
    state: dict[str, Any] = {"backend": backend}

    def factory():
        if state["backend"] is None:
            state["backend"] = build_backend(cfg.search)
        return gym.make(cfg.env["id"], backend=state["backend"], tasks=list(tasks), **kwargs).unwrapped

    return factory


def build_dataset(tasks: list, env_factory, tokenizer):
    """The GRPO ``train_dataset`` and the prompt -> task table of the rollout function.

    Each row's ``prompt`` is the rendered chat prompt the env poses for the task (system
    + user, with the assistant header), so the rollout can map it back; the other
    columns (``task_id``, ``question``, ``answers``) reach the reward functions.

    Returns:
        ``(datasets.Dataset, dict[str, Task])``.
    """
    from datasets import Dataset

    env = env_factory()
    rows, table = [], {}
    for t in tasks:
        _obs, info = env.reset(options={"task": t})
        text = tokenizer.apply_chat_template(info["messages"], tokenize=False, add_generation_prompt=True)
        table[text] = t
        rows.append({"prompt": text, "task_id": t.task_id, "question": t.question, "answers": list(t.answers)})
    return Dataset.from_list(rows), table


# -- rewards ----------------------------------------------------------------------------------
class DrgymRewardFunc:
    """A drgym reward (through :class:`drgym.rewards.trl_adapter.TRLReward`) fed with rollout fields.

    TRL calls ``f(prompts=, completions=, completion_ids=, **columns, **rollout_fields)``.
    The adapter builds each :class:`~drgym.rewards.base.Episode` from the dataset
    columns (``task_id``, ``question``, ``answers``); this wrapper then sets the answer
    to the rollout's ``final_answer`` (the env's parsed ``<answer>``, '' when none) and
    attaches the episode's ``trajectory``, so rewards that count invalid actions or
    check termination (``format``) see the whole episode and nothing re-parses the
    decoded completion (which includes the ``<information>`` text).

    Returns ``list[float | None]``, one per completion. ``__name__`` is the reward
    name TRL logs under (``rewards/<name>/mean`` and ``/std``).
    """

    def __init__(self, trl_reward, tasks_by_id: dict[str, Any], monitor: "GroupMonitor | None" = None):
        self.inner = trl_reward
        self.reward = trl_reward.reward
        self.__name__ = trl_reward.__name__
        self.tasks_by_id = tasks_by_id
        self.monitor = monitor

    def __call__(self, prompts, completions, final_answer=None, trajectory=None, environments=None, **kw):
        from drgym.envs.trajectory import Trajectory

        n = len(completions)
        if environments is not None and final_answer is None:
            # environment_factory path: the answer is the last assistant message's text
            final_answer, trajectory = [], []
            for env, comp in zip(environments, completions):
                tr = env._finish(_strip_answer_tags(_last_assistant_text(comp)))
                final_answer.append((tr.final_answer if tr is not None else None) or "")
                trajectory.append(tr.to_dict() if tr is not None else None)
        episodes = self.inner.episodes(list(prompts or []), list(completions), **kw)
        for i, ep in enumerate(episodes):
            tid = kw.get("task_id")[i] if kw.get("task_id") is not None else None
            if tid in self.tasks_by_id:
                ep.task = self.tasks_by_id[tid]
            if final_answer is not None:
                ep.answer = final_answer[i] or ""
            d = trajectory[i] if trajectory is not None else None
            if isinstance(d, dict) and d.get("episode_id"):
                ep.trajectory = Trajectory.from_dict(d)
        out = self.reward.score(episodes)
        scores = [None if s is None or (isinstance(s, float) and math.isnan(s)) else float(s) for s in out.scores]
        if self.monitor is not None:
            self.monitor.record(self.__name__, scores, kw.get("task_id") or [""] * n,
                                [e.answer for e in episodes])
        return scores


def _last_assistant_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    for m in reversed(completion or []):
        if m.get("role") == "assistant" and not m.get("tool_calls"):
            return str(m.get("content") or "")
    return ""


def _strip_answer_tags(text: str) -> str:
    import re

    m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return (m.group(1) if m else text).strip()


class GroupMonitor:
    """Collapse guard: detects degenerate GRPO groups and logs them.

    After the last reward function of a batch has run, the weighted total reward is
    rebuilt per completion and split into groups of ``num_generations``. A group is
    *degenerate* when all its rewards are equal (zero advantage, no gradient; DAPO,
    Yu et al. 2025, §3.2 "dynamic sampling"), and an answer is *empty* when the episode
    ended with no ``<answer>`` text. Logged per batch (trainer metrics, so TensorBoard
    and ``metrics.jsonl``): ``guard/degenerate_group_frac``,
    ``guard/empty_answer_frac``, ``guard/all_empty_group_frac``; each degenerate group
    is also appended to ``<output_dir>/degenerate_groups.jsonl``.
    """

    def __init__(self, names: list[str], weights: list[float], num_generations: int, out_path: str | Path):
        self.names = names
        self.weights = dict(zip(names, weights))
        self.G = num_generations
        self.out_path = Path(out_path)
        self._batch: dict[str, list] = {}
        self.trainer = None
        self.history: list[dict[str, float]] = []

    def record(self, name: str, scores: list, task_ids: list[str], answers: list[str]) -> None:
        from drgym.atomic import append_jsonl

        self._batch[name] = scores
        if len(self._batch) < len(self.names):
            return
        n = len(scores)
        totals = []
        for i in range(n):
            vals = [(self._batch[k][i], self.weights[k]) for k in self.names if self._batch[k][i] is not None]
            totals.append(sum(v * w for v, w in vals) if vals else float("nan"))
        self._batch = {}
        G = self.G if self.G and n % self.G == 0 else n
        groups = [list(range(g, g + G)) for g in range(0, n, G)]
        degenerate = 0
        all_empty = 0
        step = getattr(getattr(self.trainer, "state", None), "global_step", None)
        for idx in groups:
            r = [totals[i] for i in idx]
            empty = [not (answers[i] or "").strip() for i in idx]
            if all(empty):
                all_empty += 1
            finite = [x for x in r if not math.isnan(x)]
            if len(finite) <= 1 or max(finite) - min(finite) < 1e-9:
                degenerate += 1
                append_jsonl(self.out_path, {"step": step, "task_id": task_ids[idx[0]], "rewards": r,
                                             "empty_answers": sum(empty), "answers": [answers[i] for i in idx]})
        stats = {
            "guard/degenerate_group_frac": degenerate / len(groups),
            "guard/all_empty_group_frac": all_empty / len(groups),
            "guard/empty_answer_frac": sum(1 for a in answers if not (a or "").strip()) / n,
        }
        self.history.append(stats)
        metrics = getattr(self.trainer, "_metrics", None)
        if metrics is not None:
            mode = "train" if self.trainer.model.training else "eval"
            for k, v in stats.items():
                metrics[mode][k].append(v)


def build_reward_funcs(cfg, tasks_by_id: dict[str, Any], *, num_generations: int, output_dir: str | Path):
    """TRL reward functions, their weights and the :class:`GroupMonitor` of a run.

    The ``rewards:`` list becomes the weighted spec of
    :func:`drgym.rewards.trl_adapter.trl_reward_funcs` (one TRL function per part, so
    TRL logs each component), each wrapped in :class:`DrgymRewardFunc`.

    Raises:
        ConfigError: unknown reward name or bad kwargs (from the reward registry).
    """
    from drgym.rewards.trl_adapter import trl_reward_funcs, trl_reward_weights

    spec = {"weighted": [{"name": str(r["name"]), "weight": float(r.get("weight", 1.0)),
                          "kwargs": dict(r.get("kwargs") or {})} for r in cfg.rewards]}
    inner = trl_reward_funcs(spec)
    weights = trl_reward_weights(spec)
    names = [f.__name__ for f in inner]
    monitor = GroupMonitor(names, weights, num_generations, Path(output_dir) / "degenerate_groups.jsonl")
    funcs = [DrgymRewardFunc(f, tasks_by_id, monitor) for f in inner]
    return funcs, weights, monitor


# -- evaluation -------------------------------------------------------------------------------
def make_evaluator(cfg, tasks: list, reward_funcs: list, weights: list[float], *, backend=None):
    """``evaluate(model, tokenizer, out_dir, name=None) -> (metrics, trajectories)`` on held-out tasks.

    The episodes are run by 4/6's rollout runner (:func:`drgym.rollout.runner.run_rollout`),
    so ``out_dir`` becomes an ordinary rollout run directory (``config.json``,
    ``trajectories.jsonl``, ``metrics.json``) that ``drgym report`` reads. The policy is :class:`drgym.rollout.hf.HFPolicy` on the in-memory model with
    ``layout="continuation"`` for the tag protocol: observations continue the assistant
    turn, token for token the layout :class:`~drgym.training.rollout.SearchRolloutFunc`
    trains on (``tests/test_training_eval.py`` checks this). The env is the training
    env (``cfg.env``, ``cfg.protocol``) with ``eval.max_turns``; the search backend is
    the run's (``backend``, else :func:`build_backend` of ``cfg.search``); turns get
    ``rollout.max_new_tokens`` tokens, greedy when ``eval.greedy`` else sampled at the
    rollout temperature. Unlike training, the whole episode is not capped at
    ``rollout.max_completion_tokens`` (the env's observation budget still applies).
    ``protocol: json`` runs use the chat layout with the run's tool template, which
    approximates TRL's tool loop (tool results arrive as user turns).

    Metrics (means over the tasks): one per reward function of the run (its name),
    ``reward`` (their weighted sum, as GRPO sees it; the run directory's
    ``metrics.json`` keeps the env's own ``reward`` and adds these under
    ``training_rewards``), ``em`` (exact match, official HotpotQA script),
    ``answered_frac`` (episodes that ended with an answer), ``searches_mean``,
    ``turns_mean`` and ``invalid_action_rate``.

    Args:
        cfg: the run config.
        tasks: the held-out :class:`~drgym.envs.tasks.Task` objects.
        reward_funcs: the run's :class:`DrgymRewardFunc` list; ``weights`` their weights.
        backend: the run's search backend (None: built from ``cfg.search`` on first use).

    Returns:
        ``evaluate``; its ``name`` argument is the policy name recorded in the run
        directory (default ``"hf:<run name>"``), and the ``trajectories`` it returns are
        the episode dicts in task order.
    """
    from drgym.envs.trajectory import Trajectory
    from drgym.rewards.base import Episode
    from drgym.rollout.generation import DEFAULT_STOPS
    from drgym.rollout.hf import HFPolicy
    from drgym.rollout.runner import RolloutConfig, run_rollout
    from drgym.training.rollout import STOP_STRINGS

    base = cfg.rollout_settings()
    tasks = list(tasks)
    by_id = {t.task_id: t for t in tasks}
    env_kw = dict(cfg.env.get("kwargs") or {})
    env_kw.pop("max_turns", None)
    env_kw.setdefault("protocol", cfg.protocol)
    ts = cfg.tasks.get("eval")
    label = f"{ts.set}[{ts.start}:{ts.start + len(tasks)}]" if ts is not None else "held-out"
    tags = cfg.protocol != "json"

    def evaluate(model, tokenizer, out_dir, name: str | None = None):
        be = backend if backend is not None else build_backend(cfg.search)
        pol = HFPolicy(model, tokenizer=tokenizer, name=name or f"hf:{cfg.name}", layout="continuation" if tags else "chat",
                       scaffold="none", max_new_tokens=base.max_new_tokens, batch_size=base.gen_batch_size,
                       temperature=0.0 if cfg.eval.greedy else base.temperature,
                       stops=STOP_STRINGS if tags else DEFAULT_STOPS, seed=cfg.seed)
        rc = RolloutConfig(env=cfg.env["id"], tasks=label, policy=pol.name, backend=f"training:{cfg.search}",
                           n=None, out=str(out_dir), seed=cfg.seed, batch_size=max(1, len(tasks)),
                           max_turns=cfg.eval.max_turns, rewards=[], env_options=env_kw, plots=False)
        res = run_rollout(rc, policy=pol, backend=be, progress=False, fresh=True, tasks=tasks)
        trajs = res.trajectories
        eps = [Episode(task=by_id[d["task_id"]], answer=d.get("final_answer") or "", trajectory=Trajectory.from_dict(d))
               for d in trajs]
        n = max(1, len(eps))
        metrics: dict[str, float] = {}
        total = [0.0] * len(eps)
        for f, w in zip(reward_funcs, weights):
            vals = [0.0 if s is None else float(s) for s in f.reward.score(eps).scores]
            metrics[f.__name__] = sum(vals) / n
            total = [a + w * b for a, b in zip(total, vals)]
        m = res.metrics
        metrics["reward"] = sum(total) / n
        metrics["em"] = float(m.get("em") or 0.0)
        metrics["answered_frac"] = float(m.get("answer_rate") or 0.0)
        metrics["searches_mean"] = float(m.get("searches") or 0.0)
        metrics["turns_mean"] = float(m.get("turns") or 0.0)
        metrics["invalid_action_rate"] = float(m.get("invalid_action_rate") or 0.0)
        # the run directory's own "reward" is the env's; record the run's weighted reward beside it
        from drgym.atomic import atomic_write_json

        run_metrics = dict(m)
        run_metrics["training_rewards"] = {"weights": {f.__name__: w for f, w in zip(reward_funcs, weights)},
                                           **{k: metrics[k] for k in [f.__name__ for f in reward_funcs] + ["reward"]}}
        atomic_write_json(Path(out_dir) / "metrics.json", run_metrics)
        return metrics, trajs

    return evaluate


# -- trainer ----------------------------------------------------------------------------------
def _trainer_class():
    """``GRPOTrainer`` whose train sampler reseeds per epoch (resume keeps the data order).

    TRL's ``RepeatSampler`` seeds its generator once, so epoch ``e`` of a run sees the
    ``e``-th permutation of one random stream, while a run resumed in epoch ``e`` starts the
    stream again and would replay epoch 0's order. Reseeding with ``seed + epoch`` in
    ``set_epoch`` (which the HF Trainer calls at the start of every epoch, resumed or not)
    makes each epoch's order a function of the epoch alone.
    """
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    class EpochSeededRepeatSampler(RepeatSampler):
        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)
            if self.shuffle and self.seed is not None:
                self.generator.manual_seed(int(self.seed) + self.epoch)

    class DrgymGRPOTrainer(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            base = super()._get_train_sampler(dataset)
            return EpochSeededRepeatSampler(
                data_source=base.data_source, mini_repeat_count=base.mini_repeat_count, batch_size=base.batch_size,
                repeat_count=base.repeat_count, shuffle=base.shuffle, seed=base.seed)

    return DrgymGRPOTrainer


def build_trainer(cfg, *, max_steps: int | None = None, model=None, extra_callbacks=None, backend=None,
                  extra_reward_funcs=None):
    """Build the ``GRPOTrainer`` of a run (no training yet).

    Args:
        cfg: the run config.
        max_steps: overrides ``grpo.max_steps``.
        model: an already loaded model (tests); default loads ``cfg.model`` in fp32.
        backend: a search backend to use instead of building ``cfg.search``.
        extra_reward_funcs: more TRL reward functions (weight 1 each), after the
            config's; not seen by the degenerate-group monitor.

    Returns:
        ``(trainer, parts)`` where ``parts`` holds ``rollout``, ``monitor``,
        ``reward_funcs``, ``dataset`` and ``tokenizer``.

    Raises:
        ConfigError: bad config (see :mod:`drgym.training.config`).
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drgym.models import load_pretrained, resolve_lm
    from drgym.training.callbacks import EvalCallback, JsonlLoggerCallback, TrainingRecordCallback
    from drgym.training.config import build_grpo_args
    from drgym.training.rollout import SearchRolloutFunc
    from drgym.training.sft import freeze_bottom

    if max_steps is not None:
        cfg.grpo["max_steps"] = int(max_steps)
    cfg.apply_threads()
    args = build_grpo_args(cfg)
    path = resolve_lm(cfg.model)
    tok = load_pretrained(AutoTokenizer, path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if model is None:
        torch.manual_seed(cfg.seed)
        model = load_pretrained(AutoModelForCausalLM, path, dtype=torch.float32)
    trainable, total = freeze_bottom(model, cfg.trainable_layers)
    log.info("GRPO: %d / %d parameters trainable", trainable, total)

    if "train" not in cfg.tasks:
        raise ConfigError(f"{cfg.source}: tasks.train is required for GRPO.")
    train_tasks = load_task_slice(cfg.tasks["train"])
    eval_tasks = load_task_slice(cfg.tasks["eval"]) if "eval" in cfg.tasks else []
    _check_disjoint(train_tasks, eval_tasks)
    tasks_by_id = {t.task_id: t for t in train_tasks + eval_tasks}
    env_factory = make_env_factory(cfg, train_tasks + eval_tasks, backend=backend)
    funcs, weights, monitor = build_reward_funcs(cfg, tasks_by_id, num_generations=args.num_generations,
                                                 output_dir=args.output_dir)
    extra = list(extra_reward_funcs or [])
    args.reward_weights = weights + [1.0] * len(extra)
    callbacks = [JsonlLoggerCallback(Path(args.output_dir) / "metrics.jsonl"), TrainingRecordCallback(cfg, "grpo")]
    eval_cb = None
    if cfg.eval.every_steps and eval_tasks:
        evaluator = make_evaluator(cfg, eval_tasks[: cfg.eval.num_tasks], funcs, weights, backend=backend)
        eval_cb = EvalCallback(evaluator, cfg.eval.every_steps, args.output_dir, tokenizer=tok)
        callbacks.append(eval_cb)
    callbacks += list(extra_callbacks or [])
    GRPOTrainer = _trainer_class()

    if cfg.protocol == "json":
        from drgym.training.toolenv import make_tool_env_class, use_tool_template

        use_tool_template(tok)
        dataset = _json_dataset(train_tasks)
        trainer = GRPOTrainer(model=model, reward_funcs=funcs + extra, args=args, train_dataset=dataset,
                              processing_class=tok, callbacks=callbacks,
                              environment_factory=make_tool_env_class(env_factory))
        rollout = None
    else:
        dataset, table = build_dataset(train_tasks, env_factory, tok)
        rollout = SearchRolloutFunc(env_factory, table, cfg.rollout_settings())
        trainer = GRPOTrainer(model=model, reward_funcs=funcs + extra, args=args, train_dataset=dataset,
                              processing_class=tok, callbacks=callbacks, rollout_func=rollout)
    monitor.trainer = trainer
    if eval_cb is not None:
        eval_cb.attach(trainer)
    return trainer, {"rollout": rollout, "monitor": monitor, "reward_funcs": funcs, "dataset": dataset,
                     "tokenizer": tok, "trainable_params": trainable, "total_params": total}


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


def _check_disjoint(train: list, held_out: list) -> None:
    overlap = {t.task_id for t in train} & {t.task_id for t in held_out}
    if overlap:
        raise ConfigError(f"tasks.train and tasks.eval share {len(overlap)} tasks (e.g. {sorted(overlap)[0]!r}); "
                          "held-out evaluation needs disjoint slices.")


def _json_dataset(tasks: list):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": t.question}], "task_id": t.task_id,
                               "question": t.question, "answers": list(t.answers)} for t in tasks])


def run_grpo(cfg, *, resume: bool = False, max_steps: int | None = None) -> dict[str, Any]:
    """Train with GRPO and save the final model to ``<output_dir>/final``.

    Args:
        cfg: the run config.
        resume: continue from the last ``checkpoint-N`` in ``output_dir`` (optimizer,
            scheduler, RNG states and data order restored by the HF Trainer).
        max_steps: overrides ``grpo.max_steps``.

    Returns:
        A summary dict (also written to ``<output_dir>/summary.json``).

    Raises:
        ConfigError: bad config, ``resume`` without a checkpoint, or (without
            ``resume``) an ``output_dir`` that holds an earlier run.
    """
    import time

    from transformers.trainer_utils import get_last_checkpoint

    from drgym.atomic import atomic_write_json

    if not resume:
        refuse_earlier_run(Path(cfg.output_dir))
    trainer, parts = build_trainer(cfg, max_steps=max_steps)
    out = Path(trainer.args.output_dir)
    ckpt = None
    if resume:
        ckpt = get_last_checkpoint(str(out)) if out.is_dir() else None
        if ckpt is None:
            raise ConfigError(f"--resume: no checkpoint-N folder in {out}.")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=ckpt)
    wall = time.perf_counter() - t0
    trainer.save_model(str(out / "final"))
    parts["tokenizer"].save_pretrained(str(out / "final"))
    from drgym.training.callbacks import write_training_record

    write_training_record(out / "final", cfg, "grpo")
    summary = {"run": cfg.name, "config": cfg.source, "global_step": trainer.state.global_step,
               "train_seconds": round(wall, 1), "resumed_from": ckpt, "train_loss": result.training_loss,
               "trainable_params": parts["trainable_params"], "total_params": parts["total_params"],
               "guard_history": parts["monitor"].history}
    atomic_write_json(out / "summary.json", summary)
    return summary


def evaluate_model(cfg, *, model_path: str | None = None, num_tasks: int | None = None, backend=None,
                   out_path: str | Path | None = None, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Held-out evaluation of a model folder, exactly as the training eval callback.

    Loads the model in fp32 and runs :func:`make_evaluator` (4/6's rollout runner, the
    training token layout) on the first ``num_tasks`` tasks of ``tasks.eval``.

    Args:
        cfg: run config (its ``tasks.eval``, env, search, rollout budgets and rewards are used).
        model_path: model to evaluate (default ``cfg.model``).
        num_tasks: first N held-out tasks (default ``eval.num_tasks``; 0 = the whole
            ``tasks.eval`` slice, as ``drgym rollout --n 0``; more than the slice holds is
            cut to the slice, with a warning).
        backend: search backend (default built from ``cfg.search``).
        out_path: optional JSON file for the metrics.
        run_dir: the rollout run directory (episodes, ``config.json``, ``metrics.json``);
            default ``<out_path without suffix>.rollout`` with ``out_path``, else
            ``<output_dir>/eval/<model folder name>``. An earlier run there is replaced.

    Returns:
        ``{"model", "tasks", "seconds", "run_dir", **metrics}``.

    Raises:
        ConfigError: the config has no ``tasks.eval``; a negative ``num_tasks``;
            ``out_path`` is a directory, lies inside a rollout run directory, cannot be
            created, or equals the run directory (checked before the model loads).
    """
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drgym.atomic import atomic_write_json
    from drgym.models import load_pretrained, resolve_lm

    cfg.apply_threads()
    if "eval" not in cfg.tasks:
        raise ConfigError(f"{cfg.source}: tasks.eval is required for evaluation.")
    if num_tasks is not None and num_tasks < 0:
        raise ConfigError(f"the number of held-out tasks must be >= 0 (0 = the whole tasks.eval slice), got {num_tasks}.")
    held_out = load_task_slice(cfg.tasks["eval"])
    want = cfg.eval.num_tasks if num_tasks is None else (num_tasks or len(held_out))
    if want > len(held_out):
        log.warning("asked for %d held-out tasks; tasks.eval of %s has %d: evaluating %d.", want, cfg.source,
                    len(held_out), len(held_out))
    tasks = held_out[:want]
    if run_dir is None and out_path:
        run_dir = Path(out_path).with_suffix(".rollout")
    if out_path:
        _check_out_paths(Path(out_path), Path(run_dir))
    model_ref = str(model_path or cfg.model)
    path = resolve_lm(model_ref)
    tok = load_pretrained(AutoTokenizer, path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if cfg.protocol == "json":
        from drgym.training.toolenv import use_tool_template

        use_tool_template(tok)
    model = load_pretrained(AutoModelForCausalLM, path, dtype=torch.float32).eval()
    tasks_by_id = {t.task_id: t for t in tasks}
    funcs, weights, _ = build_reward_funcs(cfg, tasks_by_id, num_generations=1, output_dir=cfg.output_dir)
    if run_dir is None:
        run_dir = Path(cfg.output_dir) / "eval" / (Path(model_ref).name or "model")
    t0 = time.perf_counter()
    metrics, _trajs = make_evaluator(cfg, tasks, funcs, weights, backend=backend)(model, tok, run_dir, name=f"hf:{model_ref}")
    res = {"model": model_ref, "tasks": len(tasks), "seconds": round(time.perf_counter() - t0, 1),
           "run_dir": str(run_dir), **metrics}
    if out_path:
        atomic_write_json(out_path, res)
    return res


def _check_out_paths(out: Path, run_dir: Path) -> None:
    """Refuse an ``--out`` that would fail or clobber something only after the evaluation."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a JSON file path (e.g. {out / 'eval.json'}).")
    if out.resolve() == run_dir.resolve():
        raise ConfigError(f"--out {out} would also be the rollout run directory; use a .json name.")
    in_run_dir = (out.parent / "trajectories.jsonl").exists() or (
        (out.parent / "config.json").exists() and (out.parent / "metrics.json").exists())
    if in_run_dir:
        raise ConfigError(f"--out {out} is inside a rollout run directory ({out.parent}); write it elsewhere.")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"the rollout run directory {run_dir} (beside --out) exists and is not a directory.")
    import tempfile

    for folder in (out.parent, run_dir):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".drgym-probe-"):
                pass
        except OSError as e:
            raise ConfigError(f"cannot write to {folder} for --out {out}: {e.strerror or e}.") from None
