"""Held-out evaluation during and after GRPO: :func:`make_evaluator` and :func:`evaluate_model`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from drgym.search.registry import backend_from_settings
from drgym.training.data import load_task_slice
from drgym.training.rewards import build_reward_funcs

from drgym.atomic import atomic_write_json
from drgym.errors import ConfigError
from drgym.evaluation.runner import RolloutConfig, run_rollout
from drgym.models import load_model, load_tokenizer
from drgym.policies.hf import HFPolicy
from drgym.rewards.registry import WeightedReward

log = logging.getLogger(__name__)


def make_evaluator(cfg, tasks: list, reward_funcs: list, weights: list[float], *, backend=None):
    """``evaluate(model, tokenizer, out_dir, name=None) -> (metrics, trajectories)`` on held-out tasks.

    The episodes are run by the rollout runner of ``drgym rollout`` (:func:`drgym.evaluation.runner.run_rollout`),
    so ``out_dir`` becomes an ordinary rollout run directory (``config.json``,
    ``trajectories.jsonl``, ``metrics.json``) that ``drgym report`` reads. The policy is :class:`drgym.policies.hf.HFPolicy` on the in-memory model with
    ``layout="continuation"``: observations continue the assistant
    turn, token for token the layout :class:`~drgym.training.rollout.SearchRolloutFunc`
    trains on (``tests/test_training_eval.py`` checks this), in both protocols (the
    JSON protocol's tool results continue the turn as ``<tool_response>`` blocks). The env is the training
    env (``cfg.env``, ``cfg.protocol``) with ``eval.max_turns``; the search backend is
    the run's (``backend``, else :func:`~drgym.search.registry.backend_from_settings` of ``cfg.search``); turns get
    ``rollout.max_new_tokens`` tokens, greedy when ``eval.greedy`` else sampled at the
    rollout temperature. Unlike training, the whole episode is not capped at
    ``rollout.max_completion_tokens`` (the env's observation budget still applies).

    Each episode is scored once, by the env, with the run's weighted reward (the parts of
    ``reward_funcs`` with ``weights``); the metrics read the trajectories'
    ``reward_components``. Metrics: one per reward function of the run (its name; the
    mean over the episodes it scored, None when it scored none), ``<name>_missing``
    (episodes without that score, e.g. a judge failure: not counted as 0), ``reward``
    (the mean weighted sum over the episodes scored by every part; the run directory's
    ``metrics.json`` adds these under ``training_rewards``), ``em`` (exact match, official HotpotQA script),
    ``answered_frac`` (episodes that ended with an answer), ``searches_mean``,
    ``turns_mean`` and ``invalid_action_rate``.

    Args:
        cfg: the run config.
        tasks: the held-out :class:`~drgym.records.Task` objects.
        reward_funcs: the run's :class:`~drgym.training.trl_adapter.TRLReward` list; ``weights`` their weights.
        backend: the run's search backend (None: built from ``cfg.search`` on first use).

    Returns:
        ``evaluate``; its ``name`` argument is the policy name recorded in the run
        directory (default ``"hf:<run name>"``), its ``temperature`` replaces the
        greedy/rollout choice above (``drgym train preflight`` samples at the training
        temperature), and the ``trajectories`` it returns are the episode dicts in task order.
    """
    base = cfg.rollout_settings()
    tasks = list(tasks)
    env_kw = dict(cfg.env.get("kwargs") or {})
    env_kw.pop("max_turns", None)
    env_kw.setdefault("protocol", cfg.protocol)
    ts = cfg.tasks.get("eval")
    label = f"{ts.set}[{ts.start}:{ts.start + len(tasks)}]" if ts is not None else "held-out"

    scorer = WeightedReward([(f.reward, w) for f, w in zip(reward_funcs, weights)])

    def evaluate(model, tokenizer, out_dir, name: str | None = None, temperature: float | None = None):
        be = backend if backend is not None else backend_from_settings(cfg.search)
        pol = HFPolicy(model, tokenizer=tokenizer, name=name or f"hf:{cfg.name}", layout="continuation",
                       scaffold="none", max_new_tokens=base.max_new_tokens, batch_size=base.gen_batch_size,
                       temperature=(temperature if temperature is not None
                                    else 0.0 if cfg.eval.greedy else base.temperature),
                       stops=base.stops, seed=cfg.seed,
                       enable_thinking=cfg.enable_thinking)
        rc = RolloutConfig(env=cfg.env["id"], tasks=label, policy=pol.name, backend=f"training:{cfg.search}",
                           n=None, out=str(out_dir), seed=cfg.seed, batch_size=max(1, len(tasks)),
                           max_turns=cfg.eval.max_turns, rewards=[], env_options=env_kw, plots=False)
        res = run_rollout(rc, policy=pol, backend=be, progress=False, fresh=True, tasks=tasks, reward=scorer)
        trajs = res.trajectories
        # scored once, by the env (WeightedReward of the run's rewards): read reward_components
        metrics: dict[str, float | None] = {}
        for f in reward_funcs:
            vals = [(d.get("reward_components") or {}).get(f.__name__) for d in trajs]
            ok = [float(v) for v in vals if v is not None]
            metrics[f.__name__] = sum(ok) / len(ok) if ok else None
            metrics[f"{f.__name__}_missing"] = len(vals) - len(ok)  # judge failures etc.: not counted as 0
        totals = [float(d["reward"]) for d in trajs if d.get("reward") is not None]
        m = res.metrics
        metrics["reward"] = sum(totals) / len(totals) if totals else None
        metrics["em"] = float(m.get("em") or 0.0)
        metrics["answered_frac"] = float(m.get("answer_rate") or 0.0)
        metrics["searches_mean"] = float(m.get("searches") or 0.0)
        metrics["turns_mean"] = float(m.get("turns") or 0.0)
        metrics["invalid_action_rate"] = float(m.get("invalid_action_rate") or 0.0)
        # the run directory's own "reward" is the env's; record the run's weighted reward beside it
        run_metrics = dict(m)
        run_metrics["training_rewards"] = {"weights": {f.__name__: w for f, w in zip(reward_funcs, weights)},
                                           **{k: metrics[k] for k in [f.__name__ for f in reward_funcs] + ["reward"]}}
        atomic_write_json(Path(out_dir) / "metrics.json", run_metrics)
        return metrics, trajs

    return evaluate


def evaluate_model(cfg, *, model_path: str | None = None, num_tasks: int | None = None, backend=None,
                   out_path: str | Path | None = None, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Held-out evaluation of a model folder, exactly as the training eval callback.

    Loads the model in fp32 (a LoRA adapter folder merged into its base) and runs :func:`make_evaluator` (``drgym rollout``'s runner, the
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
    tok = load_tokenizer(model_ref)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = load_model(model_ref, dtype=torch.float32).eval()  # an adapter folder is merged into its base
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
