"""``drgym train preflight``: can this GRPO run show a lift at all? Measured before training.

On a seeded sample of the config's training tasks it measures:

- **gold in view**: the share of questions whose gold alias is in the env's observation
  for the question itself as the query (:func:`drgym.envs.prompts.shown_text`, SQuAD
  normalisation on word boundaries): what the policy could answer with one search;
- **the start policy at the training temperature**: ``k = grpo.num_generations`` sampled
  episodes per question through the training env, scored by the run's own rewards:
  pass@1 (mean exact match), pass@k (share of questions with an exact match in some
  episode), mean F1, answer rate;
- **zero-variance groups**: the share of those k-episode groups whose weighted rewards are
  all equal, unscored episodes left out (:func:`drgym.rewards.scorer.degenerate_groups`,
  the GRPO guard's rule; no GRPO gradient; with ``zero_variance.filter_groups`` they are
  dropped);
- **rollout time per step**: the sampled episodes' wall time scaled to
  ``per_device_train_batch_size`` completions (generation + env + reward; the backward pass
  is not included);
- **the smallest detectable lift** on the configured test slice (``tasks.test``, else
  ``answerable-test``): a paired two-sided test at 5 % with 80 % power detects
  ``(1.96 + 0.84) * sqrt(2 (1 - rho)) * sd / sqrt(n)``, with ``sd`` the standard deviation of
  one episode's F1 over the sampled episodes (a test scores one greedy episode a question)
  and ``rho = 0.5`` (the correlation of a question's F1 before and after training; an
  assumption, recorded);
- **breadth**: distinct training questions, question-visits over ``max_steps``, and draws
  per question.

It ends with plain verdicts: why a run cannot show a lift (no gold in view, no variance,
too few questions for its steps, or an expected lift under the detectable one), or that
nothing stops it. A config whose model cannot be loaded here (a GPU config on a CPU
machine) gets the data checks and says that the policy part was skipped and why.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from drgym.envs.prompts import shown_text
from drgym.envs.task_loaders import load_tasks
from drgym.records import Task
from drgym.rewards.evidence import gold_in_view as gold_seen
from drgym.rewards.qa import exact_match
from drgym.rewards.scorer import degenerate_groups
from drgym.synth.pipeline import env_search
from drgym.training.data import load_task_slice, make_env_factory

log = logging.getLogger(__name__)

Z_ALPHA, Z_POWER = 1.96, 0.84
"""Two-sided 5 % test, 80 % power."""
RHO = 0.5
"""Assumed correlation of a question's F1 before and after training (for the paired MDE)."""
DEFAULT_TEST = "answerable-test"


def detectable_effect(sd: float, n: int, rho: float = RHO) -> float | None:
    """The smallest paired mean difference a two-sided 5 % test detects with 80 % power.

    Args:
        sd: standard deviation of the per-question score (F1 in [0, 1]).
        n: questions in the test slice.
        rho: correlation of a question's score under the two policies.

    Returns:
        The effect, in the score's units; None for ``n < 2``.

    >>> round(detectable_effect(0.4, 400), 4)
    0.056
    """
    if n < 2:
        return None
    return (Z_ALPHA + Z_POWER) * math.sqrt(2 * (1 - rho)) * sd / math.sqrt(n)


ASSUMED_SD = 0.4
"""The F1 spread assumed when the sample gives none (no policy run, or every episode scored alike)."""


def claim_slice_record(test_name: str, n_test: int, sd: float | None) -> dict[str, Any]:
    """The record's ``test`` part: the slice, its size and the detectable lift (:func:`detectable_effect`).

    A sample without spread (``sd`` None or 0: no policy run, or every sampled episode
    scored the same) says nothing about a test's noise, so :data:`ASSUMED_SD` is used and
    the record says so.

    >>> claim_slice_record("answerable-test", 400, 0.0)["sd_source"]
    'assumed 0.4 (the sample has no spread)'
    """
    if sd:
        used, source = sd, "F1 of one episode, over the sample's episodes"
    else:
        used = ASSUMED_SD
        source = f"assumed {ASSUMED_SD} ({'no policy run' if sd is None else 'the sample has no spread'})"
    mde = detectable_effect(used, n_test)
    return {"set": test_name, "n": n_test, "sd_used": used, "sd_source": source, "rho_assumed": RHO,
            "detectable_effect_f1": round(mde, 4) if mde is not None else None}


def gold_in_view(cfg, tasks: list[Task], *, backend=None) -> list[bool]:
    """Per task: is a gold alias in the training env's observation for the question as query
    (:func:`drgym.rewards.evidence.gold_in_view` of :func:`drgym.envs.prompts.shown_text`)?"""
    factory = make_env_factory(cfg, tasks, backend=backend)
    return [gold_seen(shown_text(obs), t.answers) for t, (obs, _info) in zip(tasks, env_search(factory, tasks, batch=64))]


def _group_stats(trajs: list[dict[str, Any]], by_task: dict[str, Task], k: int) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for d in trajs:
        groups.setdefault(str(d["task_id"]).rsplit("#s", 1)[0], []).append(d)
    em_per_q, f1_per_q, f1_all, zero_var, answered, missing = [], [], [], 0, 0, 0
    for tid, eps in groups.items():
        golds = by_task[tid].answers
        ems = [exact_match(e.get("final_answer") or "", golds) for e in eps]
        f1s = [(e.get("reward_components") or {}).get("f1") for e in eps]
        missing += sum(v is None for v in f1s)
        f1s = [float(v) for v in f1s if v is not None]
        f1_all.extend(f1s)
        em_per_q.append(ems)
        f1_per_q.append(sum(f1s) / len(f1s) if f1s else 0.0)
        rewards = [e.get("reward") for e in eps]
        if degenerate_groups(rewards, len(rewards))[0]:  # the GRPO guard's rule: unscored episodes left out
            zero_var += 1
        answered += sum(bool((e.get("final_answer") or "").strip()) for e in eps)
    n_q = len(groups)
    n_ep = sum(len(g) for g in groups.values())
    return {
        "questions": n_q, "episodes": n_ep, "k": k,
        "pass_at_1": round(sum(sum(e) / len(e) for e in em_per_q) / max(1, n_q), 4),
        f"pass_at_{k}": round(sum(max(e) for e in em_per_q) / max(1, n_q), 4),
        "f1_mean": round(sum(f1_per_q) / max(1, n_q), 4),
        "f1_sd_per_question": round(statistics.pstdev(f1_per_q), 4) if n_q > 1 else None,
        "f1_sd_per_episode": round(statistics.pstdev(f1_all), 4) if len(f1_all) > 1 else None,
        "zero_variance_group_frac": round(zero_var / max(1, n_q), 4),
        "answer_rate": round(answered / max(1, n_ep), 4),
        "f1_missing": missing,
    }


def preflight(cfg, *, n_tasks: int = 16, k: int | None = None, model_path: str | None = None,
              test_set: str | None = None, skip_policy: bool = False, backend=None) -> dict[str, Any]:
    """Run the checks of the module docstring on ``cfg`` (a :class:`~drgym.training.config.RunConfig`).

    Args:
        n_tasks: training questions sampled (seeded by ``cfg.seed``).
        k: episodes per question (default ``grpo.num_generations``).
        model_path: the start policy (default ``cfg.model``).
        test_set: the slice the claim is made on (default ``tasks.test``, else ``answerable-test``).
        skip_policy: only the data checks (no model is loaded).
        backend: a search backend to share (default built from ``cfg.search``).

    Returns:
        A JSON-ready record: ``data``, ``policy`` (or ``policy_skipped`` with the reason),
        ``budget``, ``test``, ``verdicts`` (a list of sentences) and ``can_show_lift``.

    Raises:
        ConfigError: the config has no ``tasks.train`` or an empty slice.
    """
    from drgym.errors import ConfigError

    t0 = time.perf_counter()
    cfg.apply_threads()
    if "train" not in cfg.tasks:
        raise ConfigError(f"{cfg.source}: tasks.train is required for a preflight.")
    train = load_task_slice(cfg.tasks["train"])
    sample = random.Random(cfg.seed).sample(train, min(n_tasks, len(train)))
    grpo = dict(cfg.grpo)
    k = int(k or grpo.get("num_generations", 8))
    in_view = gold_in_view(cfg, sample, backend=backend)
    rec: dict[str, Any] = {
        "config": cfg.name, "source": str(cfg.source), "model": str(model_path or cfg.model),
        "train_set": f"{cfg.tasks['train'].set}", "sample": len(sample), "seed": cfg.seed,
        "data": {"gold_in_view_frac": round(sum(in_view) / max(1, len(in_view)), 4)},
    }
    per_step = int(grpo.get("per_device_train_batch_size", 8)) * int(grpo.get("gradient_accumulation_steps", 1))
    steps = int(grpo.get("max_steps", 0) or 0)
    visits = steps * per_step // max(1, k)
    rec["budget"] = {"distinct_train_questions": len(train), "completions_per_step": per_step,
                     "questions_per_step": per_step // max(1, k), "max_steps": steps, "question_visits": visits,
                     "draws_per_question": round(visits / max(1, len(train)), 2)}
    test_name = test_set or (cfg.tasks["test"].set if "test" in cfg.tasks else DEFAULT_TEST)
    n_test = len(load_tasks(test_name))
    sd = None
    if skip_policy:
        rec["policy_skipped"] = "asked (--data-only)"
    else:
        try:
            rec["policy"] = _policy_checks(cfg, sample, k, model_path, backend)
            sd = rec["policy"]["f1_sd_per_episode"]
            rec["policy"]["rollout_s_per_step"] = round(rec["policy"]["seconds"] / max(1, rec["policy"]["episodes"])
                                                        * per_step, 1)
        except (OSError, ImportError, RuntimeError, ValueError) as e:  # a model this machine cannot load
            rec["policy_skipped"] = f"the start policy could not run here: {type(e).__name__}: {str(e)[:300]}"
            log.warning("preflight: %s", rec["policy_skipped"])
    rec["test"] = claim_slice_record(test_name, n_test, sd)
    mde = rec["test"]["detectable_effect_f1"]
    verdicts = []
    giv = rec["data"]["gold_in_view_frac"]
    if giv < 0.3:
        verdicts.append(f"Only {giv:.0%} of the sampled training questions show their gold for the question as "
                        "query: most cannot be answered from what this env shows, so reward stays near 0.")
    pol = rec.get("policy")
    if pol is not None:
        if pol["zero_variance_group_frac"] > 0.8:
            verdicts.append(f"{pol['zero_variance_group_frac']:.0%} of the sampled groups have equal rewards: "
                            "most steps carry no gradient.")
        if pol["answer_rate"] < 0.5:
            verdicts.append(f"The start policy answers in only {pol['answer_rate']:.0%} of episodes: fix the "
                            "format (SFT) before GRPO.")
    if rec["budget"]["draws_per_question"] > 2:
        verdicts.append(f"Each training question is drawn {rec['budget']['draws_per_question']} times on average: "
                        "the run fits its questions rather than generalising; add questions.")
    if mde is not None and mde > 0.05:
        verdicts.append(f"The test slice ({test_name}, {n_test} questions) detects a lift of {mde:.3f} F1 or more; "
                        "a smaller lift cannot be told from noise.")
    rec["can_show_lift"] = not any(v for v in verdicts if "detects a lift" not in v)
    rec["verdicts"] = verdicts or ["Nothing found that stops this run from showing a lift."]
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


def _policy_checks(cfg, sample: list[Task], k: int, model_path: str | None, backend) -> dict[str, Any]:
    """k sampled episodes per task at the training temperature, through the training env and rewards."""
    import torch

    from drgym.models import load_model, load_tokenizer
    from drgym.training.evaluation import make_evaluator
    from drgym.training.rewards import build_reward_funcs

    model_ref = str(model_path or cfg.model)
    tok = load_tokenizer(model_ref)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = load_model(model_ref, dtype=torch.float32).eval()
    tasks = [Task(task_id=f"{t.task_id}#s{j}", question=t.question, answers=list(t.answers), kind=t.kind,
                  gold_docs=list(t.gold_docs), source=t.source, metadata=dict(t.metadata))
             for t in sample for j in range(k)]
    funcs, weights, _ = build_reward_funcs(cfg, {t.task_id: t for t in tasks}, num_generations=k,
                                           output_dir=cfg.output_dir)
    temperature = cfg.rollout_settings().temperature
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="drgym-preflight-") as d:
        _, trajs = make_evaluator(cfg, tasks, funcs, weights, backend=backend)(
            model, tok, Path(d) / "run", name=f"hf:{model_ref}", temperature=temperature)
    seconds = time.perf_counter() - t0
    out = _group_stats(trajs, {t.task_id: t for t in sample}, k)
    out.update({"temperature": temperature, "seconds": round(seconds, 1)})
    return out
