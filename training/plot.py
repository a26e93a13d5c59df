"""``drgym plot runs/NAME``: training curves from ``metrics.jsonl`` as PNG files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drgym.atomic import atomic_write_bytes
from drgym.errors import ConfigError

#: Panels drawn when their metrics are present: (title, [metric keys]).
PANELS: list[tuple[str, list[str]]] = [
    ("reward (mean)", ["reward", "eval/reward"]),
    ("reward std", ["reward_std"]),
    ("reward components (mean)", ["__rewards_mean__"]),
    ("degenerate groups", ["frac_reward_zero_std", "guard/degenerate_group_frac", "guard/empty_answer_frac"]),
    ("episode", ["env/turns_mean", "env/searches_mean", "env/answered_frac", "eval/answered_frac"]),
    ("completion length (model tokens)", ["completions/mean_length", "env/obs_tokens_mean"]),
    ("loss", ["loss"]),
    ("KL / entropy", ["kl", "entropy"]),
    ("grad norm", ["grad_norm"]),
    ("seconds", ["step_time", "timing/generation_s", "timing/env_s"]),
    ("retrieved share of completion tokens", ["env/retrieved_token_frac"]),
]

#: The panels of ``summary.png``, the one-picture view of a GRPO run: (title, [metric keys]).
SUMMARY_PANELS: list[tuple[str, list[str]]] = [
    ("train reward (per step, and mean of 10)", ["reward"]),
    ("held-out F1 (greedy)", ["eval/f1"]),
    ("degenerate (zero-variance) groups", ["guard/degenerate_group_frac", "zero_variance/filtered_frac"]),
    ("response length (model tokens per episode)", ["completions/mean_length"]),
    ("entropy (nats per token)", ["entropy"]),
    ("learning rate", ["learning_rate"]),
]
SMOOTH = 10


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(float(r.get("step") or 0))
            ys.append(float(v))
    return xs, ys


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw the curves of a run folder (``metrics.jsonl``) into PNG files.

    Args:
        run_dir: the run's ``output_dir`` (or an SFT folder) holding ``metrics.jsonl``.
        out_dir: where to write; default ``<run_dir>/plots``.

    Returns:
        The PNG paths: ``summary.png`` (train reward, held-out F1, degenerate-group
        fraction and response length in one picture; written when the run logged a
        reward), ``curves.png`` (all panels) and one ``<panel>.png`` per panel.

    Raises:
        ConfigError: no ``metrics.jsonl`` or no numeric metric in it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from drgym.training.callbacks import read_metrics

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; train with `drgym train grpo|sft` first.")
    rows = read_metrics(path)
    comp_keys = sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")}
                       | {k for r in rows for k in r if k.startswith("eval/") and k not in
                          ("eval/reward", "eval/answered_frac", "eval/seconds", "eval/searches_mean", "eval/turns_mean")})
    panels = []
    for title, keys in PANELS:
        keys = comp_keys if keys == ["__rewards_mean__"] else keys
        present = [k for k in keys if _series(rows, k)[0]]
        if present:
            panels.append((title, present))
    if not panels:
        raise ConfigError(f"{path} holds no numeric metrics to plot.")
    out = Path(out_dir) if out_dir else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    import io

    def save(fig, p: Path) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        atomic_write_bytes(p, buf.getvalue())
        written.append(p)

    summary = [(t, [k for k in keys if _series(rows, k)[0]]) for t, keys in SUMMARY_PANELS]
    if summary[0][1]:
        fig, axes = plt.subplots(2, 3, figsize=(15, 6.4), squeeze=False)
        for ax in list(axes.flat)[len(summary):]:
            ax.axis("off")
        for ax, (title, keys) in zip(axes.flat, summary):
            if keys:
                _draw(ax, rows, title, keys, smooth=SMOOTH if title.startswith("train reward") else 0)
            else:
                ax.set_title(title + ": not logged", fontsize=10)
                ax.axis("off")
        fig.suptitle(run_dir.name)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
        save(fig, out / "summary.png")
    ncols = 2
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(11, 3.2 * nrows), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels):
        _draw(ax, rows, title, keys)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(run_dir.name)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    save(fig, out / "curves.png")
    for title, keys in panels:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        _draw(ax, rows, title, keys)
        slug = "".join(c if c.isalnum() else "_" for c in title).strip("_").lower()
        save(fig, out / f"{slug}.png")
    return written


def _draw(ax, rows, title: str, keys: list[str], smooth: int = 0) -> None:
    for k in keys:
        xs, ys = _series(rows, k)
        line, = ax.plot(xs, ys, marker="o", ms=3, label=k, alpha=0.45 if smooth else 1.0)
        if smooth and len(ys) >= smooth:
            avg = [sum(ys[i - smooth + 1:i + 1]) / smooth for i in range(smooth - 1, len(ys))]
            ax.plot(xs[smooth - 1:], avg, color=line.get_color(), lw=2, label=f"{k} (mean of {smooth})")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
