"""Screenshots of the built documentation site's index page and of an HTML leaderboard,
taken with headless Chromium (the Debian package ``chromium``).

    python scripts/screenshots.py                 # writes docs/img/site_index.png, docs/img/leaderboard.png
    python scripts/screenshots.py --out DIR       # elsewhere (the slow test does this)

The site is built with ``mkdocs build --strict`` into a temporary folder. The leaderboard
is ``drgym report`` over two short real rollouts (the scripted policy on 10 hotpotqa-dev
and 10 musique-dev questions, hybrid search over wiki-default), made in a temporary ``DRGYM_HOME``
unless ``--keep-home`` is given. Exits 2 when Chromium or mkdocs is missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW = "1280,900"


def chromium() -> str | None:
    """The headless-capable Chromium on PATH (``chromium`` or ``chromium-browser``), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(browser: str, url: str, out: Path, *, window: str = WINDOW) -> None:
    """Render ``url`` in headless Chromium and write a PNG of the window to ``out``.

    Raises:
        RuntimeError: Chromium exited non-zero or wrote no file.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="drgym-chromium-") as profile:
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--user-data-dir={profile}", f"--window-size={window}", f"--screenshot={out}", url],
                              capture_output=True, text=True, timeout=180)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"chromium failed on {url} (exit {proc.returncode}): {proc.stderr[-1500:]}")


def build_site(dest: Path) -> Path:
    """``mkdocs build --strict`` into ``dest``; returns the index page."""
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(dest)],
                   cwd=ROOT, check=True, timeout=600)
    return dest / "index.html"


def build_leaderboard(work: Path, env: dict[str, str]) -> Path:
    """Two short scripted rollouts and their ``drgym report``; returns the HTML leaderboard."""
    drgym = [sys.executable, "-m", "drgym"]
    runs = []
    for tasks in ("hotpotqa-dev", "musique-dev"):
        out = work / f"scripted_{tasks}"
        subprocess.run([*drgym, "rollout", "--policy", "scripted", "--tasks", tasks, "--n", "10", "--out", str(out),
                        "--no-progress", "--no-plots"], cwd=work, env=env, check=True, timeout=900)
        runs.append(str(out))
    stem = work / "leaderboard"
    subprocess.run([*drgym, "report", *runs, "--out", str(stem)], cwd=work, env=env, check=True, timeout=300)
    return stem.with_suffix(".html")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"), help="folder for the two PNG files")
    ap.add_argument("--keep-home", action="store_true", help="use $DRGYM_HOME (its built indexes) instead of a fresh one")
    a = ap.parse_args()
    browser = chromium()
    if browser is None:
        print("screenshots: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    out = Path(a.out)
    with tempfile.TemporaryDirectory(prefix="drgym-screens-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        if not a.keep_home:
            env["DRGYM_HOME"] = str(work / "home")
        index = build_site(work / "site")
        screenshot(browser, index.as_uri(), out / "site_index.png")
        board = build_leaderboard(work, env)
        screenshot(browser, board.as_uri(), out / "leaderboard.png", window="1720,480")  # the leaderboard is wider than 1280 px
    print(f"wrote {out / 'site_index.png'} and {out / 'leaderboard.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
