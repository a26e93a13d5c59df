"""Commands of this area, registered on the root ``drgym`` app by :func:`register`.

``drgym train grpo|sft|check`` and ``drgym plot``. Heavy imports stay inside the
command bodies so ``drgym --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

train_app = typer.Typer(help="GRPO and SFT training on TRL (configs in training/configs).", no_args_is_help=True,
                        rich_markup_mode=None)  # plain help: a "[...]" in it is not rich markup


SET_HELP = ("Override a config key by its dotted path, as the YAML would write the value "
            "(--set rollout.max_turns=3 --set grpo.learning_rate=1e-5 --set env.kwargs.top_k=5); repeatable.")


def _overrides(output_dir: Optional[str], model: Optional[str], sets: Optional[list[str]] = None) -> dict:
    """The config overrides of a command: its ``--set`` items, then ``--output-dir`` and ``--model``."""
    from drgym.config import dotted_overrides

    o = dotted_overrides(sets or [])
    if output_dir:
        o["output_dir"] = output_dir
    if model:
        o["model"] = model
    return o


def _fail(e: Exception) -> None:
    from drgym.errors import DrgymError

    if isinstance(e, DrgymError):
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2)
    raise e


@train_app.command("grpo")
def grpo_cmd(
    config: str = typer.Option(..., "--config", "-c", help="YAML file or bundled config name (searchqa_smollm2_cpu)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output folder."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Override grpo.max_steps."),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o", help="Override output_dir (default runs/NAME)."),
    model: Optional[str] = typer.Option(None, "--model", help="Override model (e.g. an SFT output folder)."),
    launch: bool = typer.Option(False, "--launch", help="Start the run as the config's launch: section says "
                                "(accelerate launch --config_file ... --num_processes N -m drgym train grpo ...)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --launch: print the command, start nothing."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Train a search agent with GRPO (multi-turn rollouts of drgym/SearchQA-v0)."""
    try:
        from drgym.training.config import load_config
        from drgym.training.grpo import run_grpo

        cfg = load_config(config, _overrides(output_dir, model, sets))
        if launch or dry_run:
            extra = (["--resume"] if resume else []) + (["--max-steps", str(max_steps)] if max_steps else []) \
                + (["--output-dir", output_dir] if output_dir else []) + (["--model", model] if model else []) \
                + [a for item in sets for a in ("--set", item)]
            _launch(cfg, config, "grpo", extra, dry_run)
            return
        summary = run_grpo(cfg, resume=resume, max_steps=max_steps)
    except Exception as e:  # noqa: BLE001
        _fail(e)
    summary.pop("guard_history", None)
    typer.echo(json.dumps(summary, indent=2))


def _launch(cfg, config_arg: str, command: str, extra: list[str], dry_run: bool) -> None:
    """Print (``dry_run``) or run the config's ``accelerate launch`` command; exit with its status."""
    import shutil
    import subprocess

    from drgym.training.launch import format_command, launch_command

    cmd = launch_command(cfg, config_arg, command, extra)
    typer.echo(format_command(cmd))
    if dry_run:
        return
    if shutil.which(cmd[0]) is None:
        from drgym.errors import DependencyNotInstalled

        raise DependencyNotInstalled("`accelerate` is not on PATH (pip install accelerate; DeepSpeed configs also "
                                     "need pip install deepspeed).")
    raise typer.Exit(subprocess.call(cmd))


@train_app.command("sft")
def sft_cmd(
    config: str = typer.Option(..., "--config", "-c", help="YAML file or bundled config name (its sft: section is used)."),
    trajectories: list[str] = typer.Option([], "--trajectories", "-t", help="Trajectory JSONL (from `drgym rollout`); repeatable."),
    scripted: Optional[str] = typer.Option(None, "--scripted", help="First write scripted-policy trajectories of tasks.train to this JSONL and train on them."),
    scripted_limit: Optional[int] = typer.Option(None, "--scripted-limit", help="Tasks for --scripted (default the tasks.train limit)."),
    output_dir: Optional[str] = typer.Option(None, "--output-dir", "-o", help="Default <output_dir>/sft."),
    gold_answers: bool = typer.Option(False, "--gold-answers", help="Replace each final answer by the task's gold answer."),
    min_reward: Optional[float] = typer.Option(None, "--min-reward", help="Keep trajectories with reward >= this."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
    model: Optional[str] = typer.Option(None, "--model", help="Override model."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Warm-start a policy on trajectories with TRL's SFTTrainer (observation tokens masked)."""
    try:
        from drgym.training.config import load_config
        from drgym.training.sft import run_sft

        cfg = load_config(config, _overrides(None, model, sets))
        if scripted:
            from drgym.training.sft import make_scripted_trajectories

            trajs = make_scripted_trajectories(cfg, scripted, limit=scripted_limit)
            typer.echo(f"wrote {len(trajs)} scripted trajectories to {scripted}", err=True)
            trajectories = [*trajectories, scripted]
        if not trajectories:
            from drgym.errors import ConfigError

            raise ConfigError("give --trajectories FILE (repeatable) or --scripted OUT.jsonl.")
        final = run_sft(cfg, trajectories, output_dir=output_dir, gold_answers=gold_answers, min_reward=min_reward,
                        resume=resume)
    except Exception as e:  # noqa: BLE001
        _fail(e)
    typer.echo(str(final))


@train_app.command("check")
def check_cmd(
    config: list[str] = typer.Argument(..., help="Config files or bundled names (training/configs/*.yaml)."),
) -> None:
    """Check configs without training (no GPU needed).

    Run configs: TRL arguments built, train/eval split disjoint (task ids and questions),
    and for a launch: section accelerate's, TRL's and transformers' DeepSpeed consistency
    checks at the launched world size. accelerate launch files (accelerate_*.yaml) go
    through accelerate's launch validation.
    """
    from drgym.training.config import build_grpo_args, build_sft_args, load_config
    from drgym.training.data import check_split
    from drgym.training.launch import check_accelerate_file, is_accelerate_file

    ok = True
    for c in config:
        try:
            if is_accelerate_file(c):
                r = check_accelerate_file(c)
                typer.echo(f"ok  {c}: accelerate launch config ({r['distributed_type']}, {r['num_processes']} processes)")
                continue
            cfg = load_config(c)
            g = build_grpo_args(cfg, validate_only=True)
            build_sft_args(cfg, validate_only=True)
            adj = getattr(g, "_drgym_adjusted", {})
            split = check_split(cfg)
            from drgym.training.launch import check_launch

            launch = check_launch(cfg)
            msg = (f"ok  {c}: generation_batch_size={g.generation_batch_size} num_generations={g.num_generations} "
                   f"use_vllm={g.use_vllm}; tasks train={split['train']} eval={split['eval']} (disjoint)")
            if launch.get("launch"):
                gr = launch.get("grpo") or {}
                msg += f"; launch: {launch['num_processes']} processes, {launch['distributed_type']}"
                if launch["distributed_type"] == "DEEPSPEED":
                    msg += (f" gradient_accumulation_steps={gr.get('gradient_accumulation_steps')} "
                            f"train_batch_size={gr.get('train_batch_size')}"
                            + ("" if launch.get("deepspeed", True) else " (checked without deepspeed installed)"))
            typer.echo(msg + (f" (checked without GPU: {adj})" if adj else ""))
        except Exception as e:  # noqa: BLE001
            ok = False
            typer.secho(f"bad {c}: {e}", fg="red", err=True)
    if not ok:
        raise typer.Exit(2)


@train_app.command("eval")
def eval_cmd(
    config: str = typer.Option(..., "--config", "-c", help="YAML file or bundled config name (tasks.eval is used)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model folder (default the config's model)."),
    num_tasks: Optional[int] = typer.Option(None, "--num-tasks", "-n", help="First N held-out tasks (default eval.num_tasks)."),
    out: Optional[str] = typer.Option(None, "--out", help="Write the metrics JSON here (the rollout run directory goes beside it, as <out>.rollout/; default <output_dir>/eval/<model folder>)."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Held-out evaluation of a model, exactly as the training-time eval callback (drgym rollout's runner, training token layout)."""
    try:
        from drgym.training.config import load_config
        from drgym.training.evaluation import evaluate_model

        res = evaluate_model(load_config(config, _overrides(None, None, sets)), model_path=model, num_tasks=num_tasks, out_path=out)
    except Exception as e:  # noqa: BLE001
        _fail(e)
    typer.echo(json.dumps(res, indent=2))


def plot_cmd(
    run_dir: Path = typer.Argument(..., help="A run folder holding metrics.jsonl (runs/NAME)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Default <run_dir>/plots."),
) -> None:
    """Draw a run's training curves (reward, components, KL/entropy, lengths...) as PNG."""
    try:
        from drgym.training.plot import plot_run

        paths = plot_run(run_dir, out_dir)
    except Exception as e:  # noqa: BLE001
        _fail(e)
    for p in paths:
        typer.echo(str(p))


@train_app.command("preflight")
def preflight_cmd(
    config: str = typer.Option(..., "--config", "-c", help="YAML file or bundled config name."),
    n_tasks: int = typer.Option(16, "--n", help="Training questions sampled."),
    k: Optional[int] = typer.Option(None, "--k", help="Episodes per question (default grpo.num_generations)."),
    model: Optional[str] = typer.Option(None, "--model", help="Start policy (default the config's model)."),
    test_set: Optional[str] = typer.Option(None, "--test-set", help="Slice the claim is made on "
                                           "(default tasks.test, else answerable-test)."),
    data_only: bool = typer.Option(False, "--data-only", help="Only the data checks: load no model."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the record to this JSON file."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Before training: gold in view, the start policy's pass@1/pass@k at the training temperature,
    zero-variance groups, rollout time per step, and the smallest lift the test slice can detect.

    Ends with plain verdicts on whether the run can show a lift, and why not. Takes a few
    minutes on 2 CPU cores for the SmolLM2 configs (16 questions x num_generations episodes).
    """
    try:
        from drgym.atomic import atomic_write_json
        from drgym.training.config import load_config
        from drgym.training.preflight import preflight

        cfg = load_config(config, _overrides(None, None, sets))
        rec = preflight(cfg, n_tasks=n_tasks, k=k, model_path=model, test_set=test_set, skip_policy=data_only)
        if out is not None:
            atomic_write_json(out, rec, indent=1)
    except Exception as e:  # noqa: BLE001
        _fail(e)
    typer.echo(json.dumps(rec, indent=1))


@train_app.command("long-run")
def long_run_cmd(
    config: str = typer.Option(..., "--config", "-c", help="YAML file or bundled config name."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run folder (default $DRGYM_RUNS/<name>, else "
                                           "~/.cache/drgym/runs/<name>)."),
    snapshot_every: float = typer.Option(900.0, "--snapshot-every", help="Seconds between snapshots."),
    snapshot: bool = typer.Option(False, "--snapshot", help="Snapshot the run folder into the checkout and exit."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Override grpo.max_steps."),
    restarts: int = typer.Option(3, "--restarts", min=0, help="Times a run killed by SIGKILL (the out-of-memory "
                                 "killer) is resumed from its last checkpoint."),
) -> None:
    """A GRPO run that survives stops: restore the checkout's checkpoint, train in a child process,
    snapshot logs, curves and the last checkpoint into the checkout (training/results/NAME,
    training/checkpoints/NAME) as it goes. Needs a source checkout; the same as
    `python scripts/long_run.py`.
    """
    code = 0
    try:
        from drgym.training.config import load_config
        from drgym.training.long_run import require_checkout, run_dir_of, supervise
        from drgym.training.long_run import snapshot as take_snapshot

        if snapshot:
            require_checkout()
            cfg = load_config(config)
            typer.echo(json.dumps(take_snapshot(cfg.name, run_dir or run_dir_of(cfg.name))))
        else:
            code = supervise(config, run_dir=run_dir, snapshot_every=snapshot_every, max_steps=max_steps,
                             restarts=restarts)
    except Exception as e:  # noqa: BLE001  (_fail prints a drgym error in one line and re-raises the others)
        _fail(e)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``: ``train grpo|sft|check|eval|preflight|long-run`` and ``plot``."""
    app.add_typer(train_app, name="train")
    app.command("plot")(plot_cmd)
