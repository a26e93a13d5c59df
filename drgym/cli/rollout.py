"""``drgym rollout`` and ``drgym report``, registered on the root app by :func:`register`."""

from __future__ import annotations

from typing import Optional

import typer

from drgym.config import DEFAULT_N, DEFAULT_POLICY, DEFAULT_QA_TASKS, DEFAULT_RESEARCH_TASKS

EX_TEMPFAIL = 75
"""Exit status of a run stopped because a service stayed down (sysexits.h EX_TEMPFAIL:
a temporary failure; rerunning the same command resumes)."""

EX_EPISODES_FAILED = 3
"""Exit status of a run that finished with failed episodes (a backend or policy error in
some turn, e.g. HTTP 401 from the search server): they are recorded but not done, and
rerunning the same command redoes them."""


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""

    @app.command()
    def rollout(
        ctx: typer.Context,
        env: str = typer.Option("drgym/SearchQA-v0", "--env", help="Gymnasium id: drgym/SearchQA-v0 or drgym/DeepResearch-v0."),
        tasks: Optional[str] = typer.Option(None, "--tasks", help=f"Task set (default {DEFAULT_QA_TASKS} for SearchQA, {DEFAULT_RESEARCH_TASKS} for DeepResearch) or a file."),
        policy: str = typer.Option(DEFAULT_POLICY, "--policy", help="hf:MODEL | openai:MODEL@URL | vllm:MODEL | rag:LLM | scripted."),
        backend: str = typer.Option("local", "--backend", help="Search backend: local (in-process index of wiki-default) or a registry spec."),
        n: int = typer.Option(DEFAULT_N, "--n", help="Number of tasks (the first N of the set); 0 = all."),
        out: Optional[str] = typer.Option(None, "--out", help="Run directory (default runs/<env>-<tasks>-<policy>)."),
        seed: int = typer.Option(0, "--seed", help="Base seed of the env resets (episode ids) and of sampling policies."),
        batch_size: int = typer.Option(8, "--batch-size", help="Episodes stepped together."),
        max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Turn budget (default: the env's)."),
        max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Tokens per turn for hf/vllm (openai: max_tokens)."),
        judge: Optional[str] = typer.Option(None, "--judge", help="Judge for LLM soft match (QA) or report rewards (research): openai:MODEL@URL; required by judged --reward; hf:smollm2 runs but is flagged as not a valid judge."),
        reward: Optional[str] = typer.Option(None, "--reward", help="Comma-separated extra rewards (e.g. race,citation,quality,kpr)."),
        policy_opt: list[str] = typer.Option([], "--policy-opt", "-p", help="Policy option KEY=VALUE (repeatable), e.g. -p dtype=float32."),
        env_opt: list[str] = typer.Option([], "--env-opt", "-e", help="Env option KEY=VALUE (repeatable), e.g. -e top_k=5."),
        fresh: bool = typer.Option(False, "--fresh", help="Discard an existing run in --out instead of resuming it."),
        allow_engine_change: bool = typer.Option(
            False, "--allow-engine-change",
            help="Resume even if the search engine (index, method, encoder, server) differs from the run's; "
                 "config.json records both."),
        no_plots: bool = typer.Option(False, "--no-plots", help="Do not write PNG plots."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
        config: Optional[str] = typer.Option(
            None, "--config",
            help="A run file (YAML or JSON) of run options: env, tasks, policy, backend, n, out, seed, batch_size, "
                 "max_turns, judge, rewards, policy_options, env_options, plots. Options given on the command line "
                 "win; -p and -e add to its policy_options and env_options."),
    ) -> None:
        """Run a policy through a drgym env on real tasks; write config, trajectories, metrics and plots.

        Rerunning the same command resumes: finished task ids are skipped (against the
        same search engine only, unless --allow-engine-change, and only while each task's
        question, golds and other fields are those its episode answered: a task file
        reordered or edited since is refused, naming the tasks). If the search server or the
        model/judge endpoint stays down through its retries, the run stops with exit status
        75 (EX_TEMPFAIL) and rerunning resumes it. Episodes in which a search or a model
        request failed (e.g. HTTP 401) are recorded but not done: the run ends with exit
        status 3 and rerunning redoes them. Bad options, a run directory held by another
        run, another engine, changed tasks or a full disk end with one error line and exit
        status 2.
        """
        from rich.console import Console

        from drgym.errors import DrgymError, ServiceUnavailableError
        from drgym.evaluation.metrics import rich_table
        from drgym.evaluation.runner import RolloutConfig, run_rollout
        from drgym.policies.factory import parse_options

        # markup=False: run names, specs and messages are printed as they are ('drgym[gpu]')
        console = Console(markup=False)
        try:
            if config is not None:
                from drgym.evaluation.run_config import read_run_file

                given = read_run_file(config)

                def defaulted(name: str) -> bool:  # the user did not give this option (typer's click: by name)
                    return getattr(ctx.get_parameter_source(name), "name", "DEFAULT") == "DEFAULT"

                def pick(name: str, value):
                    # a command-line option the user gave wins over the file
                    return given[name] if name in given and defaulted(name) else value

                env, tasks, policy, backend = pick("env", env), pick("tasks", tasks), pick("policy", policy), pick("backend", backend)
                n = pick("n", n) or 0  # the file's null (all tasks) is the command line's 0
                out, seed, batch_size = pick("out", out), pick("seed", seed), pick("batch_size", batch_size)
                max_turns, judge = pick("max_turns", max_turns), pick("judge", judge)
                if "rewards" in given and defaulted("reward"):
                    reward = ",".join(given["rewards"] or []) if isinstance(given["rewards"], list) else given["rewards"]
                if "plots" in given and defaulted("no_plots"):
                    no_plots = not bool(given["plots"])
            else:
                given = {}
            popts = {**dict(given.get("policy_options") or {}), **parse_options(policy_opt)}
            if max_new_tokens is not None:
                popts["max_tokens" if policy.startswith("openai:") else "max_new_tokens"] = max_new_tokens
            if tasks is None:
                tasks_name = DEFAULT_RESEARCH_TASKS if "DeepResearch" in env else DEFAULT_QA_TASKS
            else:
                tasks_name = tasks
            cfg = RolloutConfig(
                env=env, tasks=tasks_name, policy=policy, backend=backend, n=n or None, out=out, seed=seed,
                batch_size=batch_size, max_turns=max_turns, judge=judge,
                rewards=[r.strip() for r in reward.split(",") if r.strip()] if reward else None,
                policy_options=popts, env_options={**dict(given.get("env_options") or {}), **parse_options(env_opt)},
                plots=not no_plots,
            )
            check_backend_keys(backend)
            if judge:
                from drgym.judges.base import judge_validity

                valid, note = judge_validity(judge)
                if not valid:
                    typer.secho(f"warning: judge {judge} is {note}.", fg="yellow", err=True)
            if not progress:
                quiet_model_loading()
            res = run_rollout(cfg, progress=progress, console=Console(stderr=True, markup=False), fresh=fresh,
                              allow_engine_change=allow_engine_change)
        except KeyboardInterrupt as e:
            res = e.args[0] if e.args else None
            if res is not None:
                console.print(rich_table(res.metrics, title=f"{policy} (interrupted)"))
                console.print(files_written(res), highlight=False, soft_wrap=True)
            console.print("Interrupted: finished episodes are saved; rerun the same command to resume.", style="yellow")
            raise typer.Exit(130)
        except ServiceUnavailableError as e:  # a server stayed down: finished episodes are saved
            print_error(e)
            raise typer.Exit(EX_TEMPFAIL)
        except DrgymError as e:
            print_error(e)
            raise typer.Exit(2)
        m = res.metrics
        jm = m.get("judge_model") or {}
        flag = f"; judge {jm['spec']}: NOT A VALID JUDGE, judged scores are not results" if jm.get("valid") is False else ""
        console.print(rich_table(m, title=f"{cfg.policy} on {cfg.tasks} ({cfg.env}){flag}"))
        console.print(
            f"{res.new_episodes} new episodes, {res.skipped} resumed; this session {res.wall_s:.1f}s "
            f"(setup {res.setup_s:.1f}s). Run directory: {res.out_dir}", highlight=False
        )
        console.print(files_written(res), highlight=False, soft_wrap=True)
        failed = res.failure_message()
        if failed:
            print_error(failed)
            raise typer.Exit(EX_EPISODES_FAILED)

    @app.command()
    def report(
        runs: list[str] = typer.Argument(..., help="Run directories (or folders of them), e.g. runs/*."),
        out: str = typer.Option("runs/leaderboard", "--out", help="Path stem: writes STEM.md and STEM.html."),
    ) -> None:
        """Compare rollout runs side by side: prints a leaderboard, writes markdown and standalone HTML."""
        from rich.console import Console

        from drgym.errors import DrgymError
        from drgym.evaluation.metrics import terminal_tables
        from drgym.evaluation.report import build_report, leaderboard_rows

        console = Console(markup=False)
        try:
            loaded, _, _ = build_report(runs, out)
        except DrgymError as e:
            print_error(e)
            raise typer.Exit(2)
        headers, rows = leaderboard_rows(loaded)  # scores with their 95% intervals over episodes
        # split over several tables on a narrow terminal, each repeating the run name, so
        # that every number is shown in full
        for t in terminal_tables(headers, rows, width=console.width, text_columns=3, repeat=1,
                                 title="drgym rollout leaderboard"):
            console.print(t)
        console.print(f"wrote {out}.md and {out}.html", highlight=False)


FILE_NOTES = {
    "config.json": "how to rerun it",
    "trajectories.jsonl": "every episode, one per line",
    "metrics.json": "the scores and counts above",
    "answers.md": "each question, the answer, the gold",
}
"""What the run summary says of each file of a run directory (plots: ``plot``)."""


def files_written(res) -> str:
    """The run summary's line of files: those this call wrote into the run directory, each
    with what it holds, e.g. ``Wrote: metrics.json (the scores and counts above),
    answers.md (each question, the answer, the gold), scores.png (plot)``.

    Args:
        res: the :class:`~drgym.evaluation.rollout_loop.RunResult` of the run.
    """
    names = [f"{p.name} ({FILE_NOTES.get(p.name, 'plot' if p.suffix == '.png' else 'file')})" for p in res.files]
    return "Wrote: " + (", ".join(names) if names else "nothing") + "."


def print_error(message: object) -> None:
    """Print ``error: MESSAGE`` on stderr as one plain line: no rich markup, so a
    ``pip install 'drgym[gpu]'`` in the message is printed as is."""
    typer.secho(f"error: {message}", fg="red", err=True)


def quiet_model_loading() -> None:
    """Hide the model libraries' own progress bars (transformers' "Loading weights" and
    GGUF conversion, huggingface_hub's downloads), for ``--no-progress``: a log or a
    pipe then gets only drgym's lines. Library warnings are untouched. transformers' GGUF
    reader uses plain ``tqdm``, so every ``tqdm`` bar of this process is disabled (and of
    its children, by ``TQDM_DISABLE=1``); drgym's own bars are rich's."""
    import os
    from functools import partialmethod

    import tqdm
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    os.environ["TQDM_DISABLE"] = "1"  # read by tqdm when a process imports it
    if not isinstance(tqdm.std.tqdm.__dict__["__init__"], partialmethod):  # once: imported already here
        tqdm.std.tqdm.__init__ = partialmethod(tqdm.std.tqdm.__init__, disable=True)
    hf_logging.disable_progress_bar()
    disable_progress_bars()


def check_backend_keys(spec: str) -> None:
    """Check that a web search backend (``serper``, ``tavily``, ``brave``,
    ``deepresearchgym``, also inside ``record:``/``cache:``) has its API key, before
    anything loads: the backend is built (no request is sent) and closed. Other specs,
    and ``replay:`` (which needs no key), pass without being built.

    Raises:
        AuthError: the key's environment variable is not set (the backend's own message).
        ConfigError: a bad spec.
    """
    from drgym.search.registry import NAMES, make_backend, split_mode

    mode, _, inner = split_mode(spec)
    if mode == "replay" or inner is None:
        return
    kind = inner.strip().lower()
    if kind in NAMES and kind != "local":
        make_backend(kind).close()
