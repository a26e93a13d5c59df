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
    rich_markup_mode=None,  # help as plain text: "pip install 'drgym[gpu]'" is not rich markup
)


def _print_version(value: bool) -> None:
    if value:
        from drgym import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the drgym version and exit (as `drgym version`)."),
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
    from drgym.cli import compare, data, distributed, evaluate, index, mcp, rollout, search, serve, train

    for module in (index, search, serve, mcp, distributed, rollout, evaluate, data, train, compare):
        module.register(app)


_register_all()


def main() -> None:
    """Console-script entry point.

    A :class:`~drgym.errors.DrgymError` that a command does not handle itself (a bad
    file, name or option) ends the command with a one-line ``error:`` and exit status 2,
    not a traceback; so does a file that cannot be written because its disk is full or
    read-only, or permission is denied (:func:`write_failure_message`). Anything else is
    a bug and keeps its traceback.

    Before any command imports torch or faiss, the thread count is fixed from the cores
    this process may use, or ``$DRGYM_THREADS`` (:func:`drgym.cpu.configure_threads`).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from drgym.cpu import configure_threads
    from drgym.errors import DrgymError

    try:
        configure_threads()
        app()
    except DrgymError as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None
    except OSError as e:
        msg = write_failure_message(e)
        if msg is None:
            raise
        typer.echo(f"error: {msg}", err=True)
        raise SystemExit(2) from None


def write_failure_message(e: OSError) -> str | None:
    """One line for a write that failed for a reason the user must fix (disk full,
    read-only file system, permission denied), naming the file and what to do; None for
    other errors.

    Example: ``cannot write /data/drgym/indexes: Read-only file system (DRGYM_HOME is
    /data/drgym: the file system is read-only, or point DRGYM_HOME at a writable folder
    with room).``
    """
    import errno

    from drgym.paths import home_path

    hints = {
        errno.ENOSPC: "the disk is full: free some space",
        errno.EDQUOT: "the disk quota is exceeded: free some space",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
    }
    if e.errno not in hints:
        return None
    home = home_path()
    where = str(e.filename) if e.filename else "a file"
    in_home = bool(e.filename) and os.path.abspath(str(e.filename)).startswith(os.path.abspath(str(home)) + os.sep)
    fix = (f"DRGYM_HOME is {home}: {hints[e.errno]}, or point DRGYM_HOME at a writable folder with room"
           if in_home or not e.filename else f"{hints[e.errno]}, or write somewhere else")
    return f"cannot write {where}: {e.strerror or e} ({fix})."


if __name__ == "__main__":
    main()
