"""Run a long GRPO training run that survives stops: resume, snapshot, restore on a new machine.

The run folder lives outside the work tree (``$DRGYM_RUNS/<name>``, default
``~/.cache/drgym/runs/<name>``). Each start:

1. when the run folder has no complete checkpoint but the repository holds one
   (``training/checkpoints/<name>/``, written by a snapshot), restores it: the
   checkpoint (LoRA adapter, optimizer, scheduler, RNG states, trainer state) and the
   logs (``metrics.jsonl``, ``batches.jsonl``) and the dev evaluations already made
   (``training/results/<name>/eval_metrics.json``), so the run goes on from that step
   with the data order continued, on any machine where only the repository survived;
2. runs ``drgym train grpo --config NAME --output-dir RUN [--resume]`` in a child
   process (``--resume`` whenever a checkpoint is there);
3. every ``--snapshot-every`` seconds, and when the child ends, snapshots into the
   repository: the logs and the eval metrics (those committed before kept) into
   ``training/results/<name>/``, the curves
   (``drgym plot``), a window summary (and the docs' tables rendered from it,
   ``scripts/readme_tables.py --write``), and the last complete checkpoint into
   ``training/checkpoints/<name>/`` (the previous one replaced). Committing them is the
   caller's step.

Usage::

    python scripts/long_run.py --config smollm2_answerable_cpu            # start or continue
    python scripts/long_run.py --config smollm2_answerable_cpu --snapshot # snapshot only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ("metrics.jsonl", "batches.jsonl")
CKPT_FILES_SKIP = {"rng_state.pth.tmp", "training_args.bin", "README.md"}
"""Not copied into the repository: a resume reads neither (``training_args.bin`` pickles this
machine's paths; ``README.md`` is PEFT's generated card naming the base model's local path)."""


def run_dir_of(name: str) -> Path:
    """``$DRGYM_RUNS/<name>``, else ``~/.cache/drgym/runs/<name>``."""
    base = os.environ.get("DRGYM_RUNS") or str(Path.home() / ".cache" / "drgym" / "runs")
    return Path(base) / name


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` atomically: into a sibling temp folder, then rename over."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp, ignore=lambda d, names: [n for n in names if n in CKPT_FILES_SKIP])
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        if old.exists():
            shutil.rmtree(old)
        dst.rename(old)
    tmp.rename(dst)
    if old.exists():
        shutil.rmtree(old)


def _copy_file(src: Path, dst: Path) -> None:
    from drgym.atomic import atomic_write_bytes

    atomic_write_bytes(dst, src.read_bytes())


def restore(name: str, run: Path) -> str | None:
    """Restore the repository's checkpoint of ``name`` into ``run`` when ``run`` has none.

    Returns:
        The restored checkpoint folder's name, or None (nothing to restore, or ``run``
        already has a complete checkpoint).
    """
    from drgym.training.callbacks import last_complete_checkpoint

    if last_complete_checkpoint(run) is not None:
        return None
    saved = ROOT / "training" / "checkpoints" / name
    ckpts = sorted(saved.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])) if saved.is_dir() else []
    if not ckpts:
        return None
    ck = ckpts[-1]
    run.mkdir(parents=True, exist_ok=True)
    _copy_tree(ck, run / ck.name)
    for f in LOGS:
        if (saved / f).is_file():
            _copy_file(saved / f, run / f)
    # the dev evaluations made before (on another machine): the run's curves and the next
    # snapshot keep them
    for step, m in _committed_evals(name).items():
        out = run / "eval" / step / "metrics.json"
        if not out.is_file():
            from drgym.atomic import atomic_write_json

            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out, m)
    print(f"long_run: restored {ck.relative_to(ROOT)} into {run}", file=sys.stderr)
    return ck.name


def _committed_evals(name: str) -> dict:
    """``training/results/<name>/eval_metrics.json`` (``{"step_N": metrics}``), or {}."""
    f = ROOT / "training" / "results" / name / "eval_metrics.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def snapshot(name: str, run: Path) -> dict:
    """Copy the run's logs, curves and last complete checkpoint into the repository.

    Returns:
        ``{"step": last logged step, "checkpoint": name or None, "files": [...]}``.
    """
    from drgym.training.callbacks import last_complete_checkpoint, read_metrics

    res = ROOT / "training" / "results" / name
    saved = ROOT / "training" / "checkpoints" / name
    res.mkdir(parents=True, exist_ok=True)
    files = []
    for f in LOGS:
        if (run / f).is_file():
            _copy_file(run / f, res / f)
            files.append(str((res / f).relative_to(ROOT)))
    evals = _committed_evals(name)  # evaluations of earlier machines stay; this run's replace their steps
    for m in sorted((run / "eval").glob("step_*/metrics.json")) if (run / "eval").is_dir() else []:
        evals[m.parent.name] = json.loads(m.read_text(encoding="utf-8"))
    evals = dict(sorted(evals.items(), key=lambda kv: int(kv[0].split("_")[1])))
    if evals:
        from drgym.atomic import atomic_write_json

        atomic_write_json(res / "eval_metrics.json", evals)
        files.append(str((res / "eval_metrics.json").relative_to(ROOT)))
    step = None
    if (run / "metrics.jsonl").is_file():
        rows = read_metrics(run / "metrics.jsonl")
        step = max((r.get("step") or 0 for r in rows), default=None)
        try:
            from drgym.training.plot import plot_run

            plots = plot_run(run, res / "plots")
            files += [str(p.relative_to(ROOT)) for p in plots if p.name in ("summary.png", "curves.png")]
            for p in plots:  # keep the two overview pictures only
                if p.name not in ("summary.png", "curves.png"):
                    p.unlink()
        except Exception as e:  # noqa: BLE001  (a plot must not stop the run; said, not hidden)
            print(f"long_run: plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "summarize_grpo.py"), str(run), "--window", "25",
                        "--out", str((res / "grpo_summary.json").relative_to(ROOT)), "--label", name],
                       check=False, cwd=ROOT, stdout=subprocess.DEVNULL)
        # the docs' tables are rendered from these files: keep them in step
        subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--write"], check=False, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    ck = last_complete_checkpoint(run)
    if ck is not None:
        ck = Path(ck)
        saved.mkdir(parents=True, exist_ok=True)
        have = sorted(p.name for p in saved.glob("checkpoint-*"))
        if have != [ck.name]:
            _copy_tree(ck, saved / ck.name)
            for f in LOGS:
                if (run / f).is_file():
                    _copy_file(run / f, saved / f)
            for old in have:
                if old != ck.name:
                    shutil.rmtree(saved / old)
        files.append(str((saved / ck.name).relative_to(ROOT)))
    return {"step": step, "checkpoint": ck.name if ck is not None else None, "files": files}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="bundled config name or YAML file")
    ap.add_argument("--run-dir", default=None, help="run folder (default $DRGYM_RUNS/<name>)")
    ap.add_argument("--snapshot-every", type=float, default=900.0, help="seconds between snapshots")
    ap.add_argument("--snapshot", action="store_true", help="snapshot the run folder and exit")
    ap.add_argument("--max-steps", type=int, default=None, help="override grpo.max_steps")
    a = ap.parse_args()
    from drgym.training.callbacks import last_complete_checkpoint
    from drgym.training.config import load_config

    cfg = load_config(a.config)
    run = Path(a.run_dir) if a.run_dir else run_dir_of(cfg.name)
    if a.snapshot:
        print(json.dumps(snapshot(cfg.name, run)))
        return 0
    restore(cfg.name, run)
    cmd = ["drgym", "train", "grpo", "--config", a.config, "--output-dir", str(run)]
    if last_complete_checkpoint(run) is not None:
        cmd.append("--resume")
    if a.max_steps:
        cmd += ["--max-steps", str(a.max_steps)]
    print("long_run: " + " ".join(cmd), file=sys.stderr, flush=True)
    child = subprocess.Popen(cmd)
    last = time.monotonic()
    while child.poll() is None:
        time.sleep(5)
        if time.monotonic() - last >= a.snapshot_every:
            last = time.monotonic()
            print("long_run: snapshot " + json.dumps(snapshot(cfg.name, run)), file=sys.stderr, flush=True)
    print("long_run: snapshot " + json.dumps(snapshot(cfg.name, run)), file=sys.stderr, flush=True)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
