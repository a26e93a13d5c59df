"""The ``drgym`` command line (typer).

The top layer: each area's commands live in their own module of this package
(``index``, ``search``, ``serve``, ``rollout``, ``evaluate``, ``train``, ``compare``),
so this file only assembles them. Heavy imports (torch, faiss, transformers) happen inside the commands.
"""

from __future__ import annotations

import logging
import os

import typer

app = typer.Typer(
    name="drgym",
    help="drgym: a local search engine, Gymnasium environments, rewards and GRPO training for search agents.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def version() -> None:
    """Print the drgym version."""
    from drgym import __version__

    typer.echo(__version__)


def _register_all() -> None:
    from drgym.cli import compare, distributed, evaluate, index, rollout, search, serve, train

    for module in (index, search, serve, distributed, rollout, evaluate, train, compare):
        module.register(app)


_register_all()


def main() -> None:
    """Console-script entry point.

    A :class:`~drgym.errors.DrgymError` that a command does not handle itself (a bad
    file, name or option) ends the command with a one-line ``error:`` and exit status 2,
    not a traceback; anything else is a bug and keeps its traceback.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from drgym.errors import DrgymError

    try:
        app()
    except DrgymError as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
