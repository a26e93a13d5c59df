"""A long GRPO training run that survives stops: resume, snapshot, restore on a new machine.

The run folder lives outside the work tree (``$DRGYM_RUNS/<name>``, default
``~/.cache/drgym/runs/<name>``). Each start:

1. when the run folder has no complete checkpoint but the repository holds one
   (``training/checkpoints/<name>/``, written by a snapshot), restores it: the
   checkpoint (LoRA adapter and trainer state), the logs up to its step
   (``training/results/<name>/metrics.jsonl``, ``batches.jsonl``) and the dev evaluations
   already made (``eval_metrics.json``), so the run goes on from that step with the data
   order continued, on any machine where only the repository survived. The repository
   keeps no optimizer, scheduler or RNG state (:data:`COMMITTED`): such a resume restarts
   AdamW's moments, with the learning-rate schedule set to the checkpoint's step
   (:class:`drgym.training.resume.ResumeWithoutOptimizerState`); a resume on the machine
   that holds the run folder finds them all and is exact;
2. runs ``drgym train grpo --config NAME --output-dir RUN [--resume]`` in a child
   process (``--resume`` whenever a checkpoint is there);
3. every ``--snapshot-every`` seconds, and when the child ends, snapshots into the
   repository: the logs and the eval metrics (those committed before kept) into
   ``training/results/<name>/``, the curves
   (``drgym plot``), a window summary (and the docs' tables rendered from it,
   ``scripts/readme_tables.py --write``), and the last complete checkpoint into
   ``training/checkpoints/<name>/`` (the previous one replaced), its :data:`COMMITTED`
   files only, the adapter in float16 (half the bytes; a resume from it on another
   machine starts from weights rounded to half precision). Committing them is the
   caller's step.

The repository is the source checkout the package runs from (:data:`ROOT`).
``scripts/long_run.py`` is the command line of :func:`supervise` and :func:`snapshot`::

    python scripts/long_run.py --config smollm2_answerable_cpu            # start or continue
    python scripts/long_run.py --config smollm2_answerable_cpu --snapshot # snapshot only
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import drgym
from drgym.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from drgym.errors import ConfigError

ROOT = Path(drgym.__file__).resolve().parents[1]
"""The repository: the checkout that holds the ``drgym`` package, ``training/`` and ``scripts/``.
A snapshot writes into it and a restore reads from it."""
LOGS = ("metrics.jsonl", "batches.jsonl")
"""The run's logs, kept once in the repository: under ``training/results/<name>/``."""
COMMITTED = ("adapter_model.safetensors", "adapter_config.json", "drgym_training.json", "trainer_state.json")
"""The files of a checkpoint copied into the repository: the LoRA adapter, its config, drgym's
record of the run and the trainer state (the step, hence the data position). Not the
optimizer (twice the adapter's size), scheduler and RNG states, which ``.gitignore``
refuses, nor the tokenizer (the base model's), ``training_args.bin`` (it pickles this
machine's paths) or PEFT's generated ``README.md`` (it names the base model's local path)."""


def require_checkout() -> Path:
    """:data:`ROOT`, when it is a source checkout (it has a ``training/`` folder).

    Raises:
        ConfigError: drgym runs from an installed copy, where a snapshot has no repository to go to.
    """
    if not (ROOT / "training").is_dir():
        raise ConfigError(f"a long run snapshots into a source checkout of drgym (its training/ folder); {ROOT} is "
                          "not one: run it from a clone (pip install -e .).")
    return ROOT


def run_dir_of(name: str) -> Path:
    """``$DRGYM_RUNS/<name>``, else ``~/.cache/drgym/runs/<name>``."""
    base = os.environ.get("DRGYM_RUNS") or str(Path.home() / ".cache" / "drgym" / "runs")
    return Path(base) / name


def half_precision_adapter(src: Path, dst: Path) -> None:
    """Write the LoRA adapter file ``src`` to ``dst`` with its float32 tensors in float16
    (half the bytes; a relative rounding of at most 2^-11 per weight). Loading it into a
    float32 model casts it back (PEFT's ``load_adapter``, a trainer's resume)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    import torch

    with safe_open(str(src), "pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    half = {k: t.to(torch.float16) if t.dtype == torch.float32 else t for k, t in tensors.items()}
    save_file(half, str(dst), metadata={**meta, "format": meta.get("format", "pt")})


def _copy_tree(src: Path, dst: Path, *, half: bool = False) -> None:
    """Copy ``src`` to ``dst`` atomically: into a sibling temp folder, then rename over.
    With ``half``, the adapter's float32 tensors are written in float16
    (:func:`half_precision_adapter`)."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name in COMMITTED:
        if half and name == "adapter_model.safetensors" and (src / name).is_file():
            half_precision_adapter(src / name, tmp / name)
        elif (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        if old.exists():
            shutil.rmtree(old)
        dst.rename(old)
    tmp.rename(dst)
    if old.exists():
        shutil.rmtree(old)


def _copy_file(src: Path, dst: Path) -> None:
    atomic_write_bytes(dst, src.read_bytes())


def _logs_up_to(src: Path, dst: Path, step: int) -> int:
    """Write the records of the JSONL log ``src`` whose ``step`` is at most ``step`` to ``dst``
    (atomically): the log as it stood at that checkpoint, which the resumed run continues.

    Returns:
        The number of records kept.

    Raises:
        ValueError: a line is not a JSON object with an integer ``step`` (the file and line named).
    """
    kept = []
    for i, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{src}:{i}: not JSON ({e.msg}).") from e
        s = rec.get("step") if isinstance(rec, dict) else None
        if isinstance(s, bool) or not isinstance(s, int):
            raise ValueError(f"{src}:{i}: expected a JSON object with an integer 'step', got {line[:80]!r}.")
        if s <= step:
            kept.append(line)
    atomic_write_text(dst, "".join(x + "\n" for x in kept))
    return len(kept)


def restore(name: str, run: Path) -> str | None:
    """Restore the repository's checkpoint of ``name`` into ``run`` when ``run`` has none:
    the last ``training/checkpoints/<name>/checkpoint-N`` (its :data:`COMMITTED` files), the
    logs of ``training/results/<name>/`` up to step N and the committed dev evaluations.

    Returns:
        The restored checkpoint folder's name, or None (nothing to restore, or ``run``
        already has a complete checkpoint).

    Raises:
        ValueError: a committed log has a line that is not a JSON object with an integer ``step``.
    """
    from drgym.training.callbacks import last_complete_checkpoint  # loads transformers: only when a run starts

    if last_complete_checkpoint(run) is not None:
        return None
    saved = ROOT / "training" / "checkpoints" / name
    ckpts = sorted((p for p in saved.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=lambda p: int(p.name.split("-")[1])) if saved.is_dir() else []
    if not ckpts:
        return None
    ck = ckpts[-1]
    step = int(json.loads((ck / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])
    run.mkdir(parents=True, exist_ok=True)
    _copy_tree(ck, run / ck.name)
    res = ROOT / "training" / "results" / name
    for f in LOGS:
        if (res / f).is_file():
            _logs_up_to(res / f, run / f, step)
    # the dev evaluations made before (on another machine): the run's curves and the next
    # snapshot keep them
    for step, m in _committed_evals(name).items():
        out = run / "eval" / step / "metrics.json"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out, m)
    print(f"long_run: restored {ck.relative_to(ROOT)} into {run}", file=sys.stderr)
    from drgym.training.resume import missing_optimizer_state  # loads transformers

    missing = missing_optimizer_state(run / ck.name)
    if missing:
        print(f"long_run: the checkpoint has no {', '.join(missing)}: the resume restarts the optimizer moments "
              "(the learning-rate schedule is set to its step); it is not an exact continuation", file=sys.stderr)
    return ck.name


def _committed_evals(name: str) -> dict:
    """``training/results/<name>/eval_metrics.json`` (``{"step_N": metrics}``), or {}."""
    f = ROOT / "training" / "results" / name / "eval_metrics.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def snapshot(name: str, run: Path) -> dict:
    """Copy the run's logs, curves and last complete checkpoint into the repository
    (``training/results/<name>/``, ``training/checkpoints/<name>/``); committing them is the
    caller's step. A failed plot is said on stderr, never fatal.

    Returns:
        ``{"step": last logged step, "checkpoint": name or None, "files": [...]}``.
    """
    from drgym.training.callbacks import last_complete_checkpoint, read_metrics  # loads transformers

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
            _copy_tree(ck, saved / ck.name, half=True)
            for old in have:
                if old != ck.name:
                    shutil.rmtree(saved / old)
        files.append(str((saved / ck.name).relative_to(ROOT)))
    return {"step": step, "checkpoint": ck.name if ck is not None else None, "files": files}


RESTART_PAUSE_S = 60.0
"""Seconds :func:`supervise` waits before starting a child that was killed again."""


def supervise(config: str, *, run_dir: Path | None = None, snapshot_every: float = 900.0,
              max_steps: int | None = None, restarts: int = 3) -> int:
    """Start or continue the run of training config ``config``: :func:`restore` when the run
    folder has no checkpoint, ``drgym train grpo --config CONFIG --output-dir RUN [--resume]
    [--max-steps N]`` in a child process, a :func:`snapshot` every ``snapshot_every`` seconds
    and one when the child ends.

    A child killed by SIGKILL (the kernel's out-of-memory killer, on a machine where other
    jobs took the memory; a GRPO step of the SmolLM2 CPU configs peaks near 10 GB) is started
    again with ``--resume`` from its last checkpoint, after :data:`RESTART_PAUSE_S` seconds,
    at most ``restarts`` times; each restart is logged. Any other exit ends the supervision.

    Args:
        config: bundled config name or YAML file.
        run_dir: the run folder (default :func:`run_dir_of` the config's name).
        snapshot_every: seconds between snapshots.
        max_steps: overrides ``grpo.max_steps``.
        restarts: how many SIGKILLed children to start again (0: none).

    Returns:
        The last child's exit status (negative: the signal that killed it).

    Raises:
        ConfigError: drgym does not run from a source checkout (:func:`require_checkout`).
    """
    from drgym.training.callbacks import last_complete_checkpoint  # loads transformers
    from drgym.training.config import load_config

    require_checkout()
    cfg = load_config(config)
    run = Path(run_dir) if run_dir else run_dir_of(cfg.name)
    restore(cfg.name, run)
    for attempt in range(restarts + 1):
        cmd = ["drgym", "train", "grpo", "--config", config, "--output-dir", str(run)]
        if last_complete_checkpoint(run) is not None:
            cmd.append("--resume")
        if max_steps:
            cmd += ["--max-steps", str(max_steps)]
        print("long_run: " + " ".join(cmd), file=sys.stderr, flush=True)
        child = subprocess.Popen(cmd)
        last = time.monotonic()
        while child.poll() is None:
            time.sleep(5)
            if time.monotonic() - last >= snapshot_every:
                last = time.monotonic()
                print("long_run: snapshot " + json.dumps(snapshot(cfg.name, run)), file=sys.stderr, flush=True)
        print("long_run: snapshot " + json.dumps(snapshot(cfg.name, run)), file=sys.stderr, flush=True)
        if child.returncode != -signal.SIGKILL or attempt == restarts:
            break
        print(f"long_run: the run was killed (SIGKILL: the out-of-memory killer, see dmesg, or a user); "
              f"restart {attempt + 1} of {restarts} in {RESTART_PAUSE_S:.0f} s", file=sys.stderr, flush=True)
        time.sleep(RESTART_PAUSE_S)
    return child.returncode
