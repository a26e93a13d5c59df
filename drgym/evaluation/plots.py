"""PNG plots of a run: score distribution, turns and search-call histograms (matplotlib Agg)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from drgym.atomic import atomic_write_bytes
from drgym.evaluation.metrics import episode_counts


def main_score_name(trajectories: list[dict[str, Any]]) -> str | None:
    """The score plotted: ``f1`` when episodes have it, else the first numeric component."""
    names: list[str] = []
    for t in trajectories:
        for k, v in (t.get("reward_components") or {}).items():
            if isinstance(v, (int, float)) and k not in names and k != "format_penalty":
                names.append(k)
    for pref in ("f1", "judge", "race", "kpr", "citation", "quality"):
        if pref in names:
            return pref
    return names[0] if names else None


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def write_plots(trajectories: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write ``scores.png``, ``turns.png`` and ``searches.png`` into ``out_dir``.

    Args:
        trajectories: trajectory dicts of one run.
        out_dir: the run directory.

    Returns:
        The paths written (scores.png is skipped when no episode has a numeric score).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    written: list[Path] = []
    name = main_score_name(trajectories)
    if name:
        vals = [float(v) for t in trajectories if isinstance(v := (t.get("reward_components") or {}).get(name), (int, float))]
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.hist(vals, bins=[i / 10 for i in range(11)] if all(0 <= v <= 1 for v in vals) else 10, color="#4C72B0", edgecolor="white")
        ax.set_xlabel(name)
        ax.set_ylabel("episodes")
        ax.set_title(f"{name} distribution (mean {sum(vals) / max(1, len(vals)):.3f}, n={len(vals)})")
        _save(fig, out / "scores.png")
        plt.close(fig)
        written.append(out / "scores.png")
    counts = [episode_counts(t) for t in trajectories]
    for key, fname, color in (("turns", "turns.png", "#55A868"), ("searches", "searches.png", "#C44E52")):
        vals = [c[key] for c in counts]
        hi = max(vals) if vals else 0
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.hist(vals, bins=[x - 0.5 for x in range(hi + 2)], color=color, edgecolor="white")
        ax.set_xticks(range(hi + 1))
        ax.set_xlabel(f"{key} per episode")
        ax.set_ylabel("episodes")
        ax.set_title(f"{key} per episode (mean {sum(vals) / max(1, len(vals)):.2f})")
        _save(fig, out / fname)
        plt.close(fig)
        written.append(out / fname)
    return written
