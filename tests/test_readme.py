"""The code blocks of the README and of every documentation page work.

Over ``README.md`` and every ``docs/**/*.md``:

* every ```python block runs, top to bottom, in a fresh namespace (over the session's
  test index: the blocks that search build or open wiki-default in ``DRGYM_HOME``);
* every ``drgym ...`` command in a ```bash block names an existing subcommand and parses
  with its options (click's own parser, without running the command), and every
  ``bash FILE`` names a file of the repository.

The figure tables are checked against their JSON sources in test_readme_tables.py, and
the site build in test_docs_build.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The README first, then the pages in path order.
PAGES: list[Path] = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced block in ``lang`` in markdown ``text``."""
    out = []
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M):
        out.append((text[: m.start()].count("\n") + 2, m.group(1)))
    return out


def _all_blocks(lang: str) -> list[tuple[str, int, str]]:
    """``(page, line number, code)`` of every ``lang`` block of every page."""
    return [(_rel(p), line, code) for p in PAGES for line, code in _blocks(p.read_text(encoding="utf-8"), lang)]


PYTHON = _all_blocks("python")
BASH = _all_blocks("bash")


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


DRGYM_COMMANDS = [(page, line, c) for page, line, code in BASH for c in _commands(code) if c[0] == "drgym"]


def test_blocks_found():
    """The pages are read and hold the blocks this file checks (a broken reader would pass
    every parametrised test by finding nothing)."""
    pages = {_rel(p) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/environments.md", "docs/rewards.md", "docs/training.md"} <= pages
    assert len(PYTHON) >= 2 and len(BASH) >= 15, (len(PYTHON), len(BASH))
    assert len(DRGYM_COMMANDS) >= 40, DRGYM_COMMANDS
    assert {page for page, _, _ in DRGYM_COMMANDS} >= {"README.md", "docs/main-job.md", "docs/search.md",
                                                       "docs/training.md", "docs/commercial-search.md"}


def test_readme_opens_with_the_setup_commands():
    """The README's first block is the one CI and users run: set up, then the main job;
    set up with the test tools, then the test suite."""
    first = _blocks(PAGES[0].read_text(encoding="utf-8"), "bash")[0]
    assert first[0] == 4, first
    assert first[1].splitlines()[1::2] == [
        "python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh && drgym rollout",
        "python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh test && python -m pytest -q",
    ]


def test_every_page_is_in_the_site_nav():
    """Every page under docs/ is listed in mkdocs.yml's nav (or it would be built but
    unreachable), and the nav names no page that is missing."""
    nav = re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    pages = {_rel(p).removeprefix("docs/") for p in PAGES[1:]}
    assert set(nav) == pages, (sorted(pages - set(nav)), sorted(set(nav) - pages))


@pytest.mark.parametrize("page,line,code", PYTHON, ids=[f"{page}:{line}" for page, line, _ in PYTHON])
def test_python_block_runs(page, line, code, session_drgym_home, default_engine):
    ns: dict = {"__name__": "__docs__"}
    exec(compile(code, f"{page}:{line}", "exec"), ns)  # noqa: S102 - the documentation's own code
    if "gym.make(" in code and "reward_components" in code:  # the Environments block states the answer's reward
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


@pytest.mark.parametrize("page,line,cmd", DRGYM_COMMANDS,
                         ids=[f"{page}:{line}:{' '.join(c[:3])}" for page, line, c in DRGYM_COMMANDS])
def test_drgym_command_parses(page, line, cmd):
    _parse(cmd[1:])


def test_parser_check_catches_mistakes():
    """The check above can fail: an unknown option, subcommand or bad number is caught."""
    for bad in (["rollout", "--no-such-option"], ["index", "rebuild"], ["search", "q", "-k", "five"]):
        with pytest.raises(Exception):  # noqa: B017 - click's UsageError family or the assert
            _parse(bad)


def test_block_reader_finds_blocks_in_a_page():
    """The reader gives each block's first code line and ignores other languages."""
    text = "# t\n\n```bash\ndrgym search q\n```\n\n```yaml\na: 1\n```\n\n```python\nx = 1\n```\n"
    assert _blocks(text, "bash") == [(4, "drgym search q\n")]
    assert _blocks(text, "python") == [(12, "x = 1\n")]
    assert _commands("python3 -m venv .venv && bash scripts/setup.sh test  # set up\n") == [
        ["python3", "-m", "venv", ".venv"], ["bash", "scripts/setup.sh", "test"]]


def test_bash_files_exist():
    for page, line, code in BASH:
        for c in _commands(code):
            if c[0] == "bash" and len(c) > 1:
                assert (REPO / c[1]).is_file(), f"{page}:{line}: bash {c[1]}: no such file"
