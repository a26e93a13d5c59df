"""The README's code blocks work.

* every ```python block runs, top to bottom, in a fresh namespace (over the session's
  test index: the blocks that search build or open wiki-default in ``DRGYM_HOME``);
* every ``drgym ...`` command in a ```bash block names an existing subcommand and parses
  with its options (click's own parser, without running the command), and every
  ``bash FILE`` names a file of the repository.

The README's tables are checked against their JSON sources in test_readme_tables.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced block in ``lang``."""
    out = []
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", README, re.S | re.M):
        out.append((README[: m.start()].count("\n") + 2, m.group(1)))
    return out


PYTHON = _blocks("python")
BASH = _blocks("bash")


def _commands(code: str) -> list[list[str]]:
    """The simple commands of a bash block: continuation lines joined, comments dropped,
    split at ``&&``, ``||``, ``;`` and ``|``."""
    cmds: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        cmds.append([])
        for tok in lex:
            if tok in ("&&", "||", ";", "|", "&"):
                cmds.append([])
            else:
                cmds[-1].append(tok)
    return [c for c in cmds if c]


DRGYM_COMMANDS = [(line, c) for line, code in BASH for c in _commands(code) if c[0] == "drgym"]


def test_blocks_found():
    assert len(PYTHON) >= 2 and len(BASH) >= 6, (len(PYTHON), len(BASH))
    assert len(DRGYM_COMMANDS) >= 15, DRGYM_COMMANDS


@pytest.mark.parametrize("line,code", PYTHON, ids=[f"README.md:{line}" for line, _ in PYTHON])
def test_python_block_runs(line, code, session_drgym_home, default_engine):
    ns: dict = {"__name__": "__readme__"}
    exec(compile(code, f"README.md:{line}", "exec"), ns)  # noqa: S102 - the README's own code
    if "gym.make(" in code:  # the Environments block states the answer's reward in a comment
        assert ns["reward"] == 1.0 and ns["info"]["reward_components"] == {"f1": 1.0}
        assert ns["terminated"] is True
    if "build_reward" in code:  # the Rewards block shows its output in a comment
        assert repr(ns["out"]) in code, repr(ns["out"])


def _parse(args: list[str]) -> None:
    """Parse ``drgym ARGS`` with the CLI's click command tree without invoking it; raise
    click's error for an unknown subcommand or option or a bad value."""
    import typer

    from drgym.cli import app

    cmd = typer.main.get_command(app)
    path = ["drgym"]
    while getattr(cmd, "commands", None):
        assert args and args[0] in cmd.commands, (
            f"`{' '.join(path)}` has no subcommand {args[:1]}; it has {sorted(cmd.commands)}")
        path.append(args[0])
        cmd, args = cmd.commands[args[0]], args[1:]
    with cmd.make_context(" ".join(path), list(args)):
        pass


@pytest.mark.parametrize("line,cmd", DRGYM_COMMANDS,
                         ids=[f"README.md:{line}:{' '.join(c[:3])}" for line, c in DRGYM_COMMANDS])
def test_drgym_command_parses(line, cmd):
    _parse(cmd[1:])


def test_parser_check_catches_mistakes():
    """The check above can fail: an unknown option, subcommand or bad number is caught."""
    for bad in (["rollout", "--no-such-option"], ["index", "rebuild"], ["search", "q", "-k", "five"]):
        with pytest.raises(Exception):  # noqa: B017 - click's UsageError family or the assert
            _parse(bad)


def test_bash_files_exist():
    for line, code in BASH:
        for c in _commands(code):
            if c[0] == "bash" and len(c) > 1:
                assert (REPO / c[1]).is_file(), f"README.md:{line}: bash {c[1]}: no such file"
