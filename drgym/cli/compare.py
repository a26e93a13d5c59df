"""``drgym compare``: the same policies and tasks over several search backends, side by side.

Registered on the root app by :func:`register` (see :mod:`drgym.evaluation.compare`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _kv(items: list[str] | None, what: str) -> dict[str, str]:
    from drgym.errors import ConfigError

    out = {}
    for it in items or []:
        if "=" not in it:
            raise ConfigError(f"{what} must be KEY=VALUE, got {it!r}.")
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def register(app: typer.Typer) -> None:
    """Add ``compare`` to ``app``."""

    @app.command("compare")
    def compare(
        policy: list[str] = typer.Option(..., "--policy", "-p", help="Policy entry: a spec plus optional KEY=VALUE options, e.g. 'scripted' or 'hf:smollm2 max_new_tokens=64'. Repeat for several policies (Kendall tau needs >= 2)."),
        tasks: str = typer.Option("hotpotqa-dev", "--tasks", "-t", help="Task-set name or tasks file, as for `drgym rollout`."),
        backends: str = typer.Option("local", "--backends", "-b", help="Comma-separated backend specs: local, local:CORPUS, serper, tavily, brave, deepresearchgym, http://host:port."),
        n: Optional[int] = typer.Option(30, "--n", help="Episodes per (policy, backend): the first N tasks. 0 = all."),
        out: Path = typer.Option(Path("runs/compare"), "--out", "-o", help="Output folder (compare.md/html/png/json and runs/)."),
        replay: Optional[Path] = typer.Option(None, "--replay", help="Replay every non-local backend from this SQLite recording (offline, no keys)."),
        record: Optional[Path] = typer.Option(None, "--record", help="Record every non-local backend's answers into this SQLite file."),
        env: str = typer.Option("drgym/SearchQA-v0", "--env", help="Gymnasium env id (drgym/DeepResearch-v0 for research tasks)."),
        max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Env turn budget (default: the env's)."),
        batch_size: int = typer.Option(8, "--batch-size", help="Episodes stepped together."),
        seed: int = typer.Option(0, "--seed", help="Base seed."),
        metric: Optional[str] = typer.Option(None, "--metric", help="Score ranked by Kendall tau and charted (default: f1, else kpr)."),
        judge: Optional[str] = typer.Option(None, "--judge", help="Judge spec for judged rewards (KPR, citation, quality)."),
        reward: list[str] = typer.Option([], "--reward", help="Extra reward scored per episode (repeatable; e.g. kpr, citation, quality with --judge); default: the runner's."),
        local_method: Optional[str] = typer.Option(None, "--local-method", help="Search method of local backends: dense, bm25 or hybrid."),
        price: list[str] = typer.Option([], "--price", help="BACKEND=USD per search call, overriding the list price (repeatable)."),
        env_option: list[str] = typer.Option([], "--env-option", help="Extra env option KEY=VALUE (e.g. top_k=5, max_searches=4); repeatable."),
        progress: bool = typer.Option(False, "--progress/--no-progress", help="Show a progress bar per run."),
    ) -> None:
        """Run the same policies and tasks over each search backend and compare them side by side.

        Writes OUT/compare.md, compare.html, compare.png and compare.json (scores, answer rate, calls, search latency, cost, Kendall tau of the policies' ranking between backends) and one rollout run directory per (policy, backend) under OUT/runs/.

        Example (offline, replaying a recording): drgym compare -p scripted -p 'scripted fetch=false' -b local,serper --replay web.sqlite --n 30
        """
        from drgym.cli.rollout import check_backend_keys, print_error, quiet_model_loading
        from drgym.errors import DrgymError
        from drgym.evaluation.compare import parse_policy_entry, run_compare
        from drgym.policies.factory import check_policy, check_policy_reachable, parse_options
        from drgym.search.registry import parse_backend_list

        try:
            specs = parse_backend_list(backends)
            # checked before the first run loads an index or a model: a missing API key,
            # a bad policy or a dead openai: server would otherwise surface runs later
            for entry in policy:
                spec, opts = parse_policy_entry(entry)
                check_policy(spec, opts)
            if replay is None:
                for s in specs:
                    check_backend_keys(s)
            for entry in policy:
                check_policy_reachable(parse_policy_entry(entry)[0])
            prices = {k: float(v) for k, v in _kv(price, "--price").items()}
            backend_options = {}
            if local_method:
                backend_options = {s: {"method": local_method} for s in specs if s.lower().startswith("local")}
            run_options = {"env": env, "seed": seed, "batch_size": batch_size, "max_turns": max_turns, "judge": judge,
                           "rewards": list(reward) or None, "env_options": parse_options(env_option), "progress": progress}
            if not progress:
                quiet_model_loading()
            result = run_compare(policies=policy, tasks=tasks, backends=specs, out=out, n=(n or None), replay=replay,
                                 record=record, prices=prices, backend_options=backend_options,
                                 run_options=run_options, metric=metric)
        except (DrgymError, ValueError) as e:
            print_error(e)
            raise typer.Exit(2) from e
        typer.echo((Path(out) / "compare.md").read_text(encoding="utf-8"))
        typer.echo(f"wrote {out}/compare.md, compare.html, compare.png, compare.json "
                   f"({len(result['rows'])} runs, {result['wall_s']:.1f} s)", err=True)

    @app.command("recording")
    def recording(
        path: Path = typer.Argument(..., help="A SQLite recording written with mode 'record' (e.g. drgym compare --record)."),
    ) -> None:
        """Show what a search recording holds: searches, fetches, failures and when the web was seen, per backend."""
        import json

        from drgym.errors import DrgymError
        from drgym.search.record import RecordStore

        try:
            store = RecordStore(path, readonly=True)
        except DrgymError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from e
        try:
            typer.echo(json.dumps(store.summary(), indent=2))
        finally:
            store.close()
