"""What this CPU offers drgym: the cores it may use, the threads to run, and bf16 or not.

A 2-core machine shared with other jobs (CI, a training run beside a server) is the
normal case, so drgym sizes every thread pool from the cores the process may actually
use, not from the machine's core count:

* :func:`available_cpus`: the CPUs in the process's affinity mask
  (``os.sched_getaffinity``), capped by a cgroup CPU quota (cgroup v2 ``cpu.max``,
  cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``), at least 1.
* :func:`thread_count`: ``$DRGYM_THREADS`` when set (the one override, a positive
  integer), else :func:`available_cpus`.
* :func:`configure_threads`: applies that count to torch's intra-op threads, to the
  OpenMP runtimes (torch's and faiss's own copies of libgomp, through
  ``OMP_NUM_THREADS`` and ``faiss.omp_set_num_threads``), to Hugging Face tokenizers
  (``RAYON_NUM_THREADS``; ``TOKENIZERS_PARALLELISM`` stays false), and is what
  ``drgym serve`` sizes its worker threads from.

**No spinning waits.** libgomp (the OpenMP runtime of the torch 2.13 CPU wheel, and a
second copy bundled in the faiss-cpu wheel) lets idle worker threads spin for about
300,000 iterations before sleeping. Between the back-to-back parallel regions of a
decode loop they never sleep, and on a busy machine they burn the CPU time that the
thread they wait for needs. Measured on the shared 2-core machine (load 11-12), 300
tiny parallel regions with a 1 ms pause between them, 2 threads: torch 17.7 s wall /
5.0 s CPU spinning against 0.61 s / 0.12 s with ``OMP_WAIT_POLICY=PASSIVE``; faiss 9.9 s
/ 2.8 s against 0.68 s / 0.09 s. ``import drgym`` therefore sets
``OMP_WAIT_POLICY=PASSIVE`` unless the user set it. OpenMP reads it once, when the
runtime loads, so it takes effect only if drgym (or the ``drgym`` command) is imported
before torch and faiss; :func:`thread_record` says whether it did.

**fork.** The OpenMP runtime (GNU libgomp) does not survive ``fork()``: a child forked
after its parent ran a parallel region (a multi-threaded FAISS search or torch op)
inherits a thread pool whose threads do not exist in the child, and its first parallel
region waits for them forever. ``import drgym`` therefore registers
:func:`_after_fork_in_child` (``os.register_at_fork``): a forked child whose parent had
torch or faiss loaded sets both to one thread (``torch.set_num_threads(1)``,
``faiss.omp_set_num_threads(1)``), and :func:`configure_threads` keeps it at one there
(a run that wants threads in workers starts them with ``spawn`` or ``forkserver``).

**bf16 on CPU.** bfloat16 weights halve the memory traffic of decoding, but a CPU
without bf16 dot-product instructions converts every operand: on an AVX2-only CPU,
SmolLM2-135M (1 thread, 4 x 301-token prefill, then 8 tokens) took 147.9 s + 140.9 s
in bf16 against 28.6 s + 28.2 s in fp32. :func:`auto_cpu_dtype` picks bf16 only where
the CPU has them (AVX512_BF16 or AMX-BF16 on x86, the ``bf16`` feature on Arm) and
torch may use them, and float32 otherwise; see ``scripts/bench_dtype.py``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

from drgym.errors import ConfigError

log = logging.getLogger(__name__)

THREADS_ENV = "DRGYM_THREADS"
"""Environment variable overriding :func:`thread_count` (a positive integer)."""

WAIT_POLICY_DEFAULT = "PASSIVE"
"""``OMP_WAIT_POLICY`` drgym sets when the user has not: idle OpenMP threads sleep."""

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_CPUINFO = Path("/proc/cpuinfo")

# Whether OMP_WAIT_POLICY was in the environment before an OpenMP runtime was loaded
# (set by ensure_wait_policy at ``import drgym``).
_wait_policy_state: dict[str, object] = {}
_applied: dict[str, int] = {}
_forked: dict[str, object] = {}
"""Set in a child forked after torch or faiss was loaded: ``{"pid", "parent_threads",
"loaded"}`` (and ``"error"`` if setting one thread failed)."""


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: one OpenMP thread in a forked child
    whose parent had torch or faiss loaded (their thread pools did not survive the fork;
    see the module docstring). Runs in the child before ``fork()`` returns: no logging
    (a lock held by another parent thread would stay held), errors are recorded only."""
    loaded = [m for m in ("torch", "faiss") if m in sys.modules]
    if not loaded:
        return
    _forked.clear()
    _forked.update(pid=os.getpid(), parent_threads=_applied.get("threads"), loaded=loaded)
    _applied["threads"] = 1
    try:
        if "faiss" in sys.modules:
            sys.modules["faiss"].omp_set_num_threads(1)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    except Exception as e:  # noqa: BLE001 - recorded in _forked; the child then keeps the parent's count
        _forked["error"] = f"{type(e).__name__}: {e}"


def forked_child() -> bool:
    """True in a process forked (without exec) from one that had torch or faiss loaded:
    its thread count is then 1 (see :func:`configure_threads`)."""
    return _forked.get("pid") == os.getpid()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)


def ensure_wait_policy() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it, and note whether an
    OpenMP runtime (torch, faiss) was already loaded, in which case it is too late."""
    if _wait_policy_state:
        return
    user = os.environ.get("OMP_WAIT_POLICY")
    loaded = sorted(m for m in ("torch", "faiss") if m in sys.modules)
    if user is None:
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY_DEFAULT
    _wait_policy_state.update(
        omp_wait_policy=os.environ["OMP_WAIT_POLICY"],
        set_by="user" if user is not None else "drgym",
        loaded_before=loaded,
    )
    if user is None and loaded:
        log.info("OMP_WAIT_POLICY=%s set after %s was imported: its OpenMP threads keep spinning; "
                 "import drgym first or export OMP_WAIT_POLICY=PASSIVE", WAIT_POLICY_DEFAULT, ", ".join(loaded))


def cgroup_cpu_limit(root: Path = _CGROUP_ROOT) -> float | None:
    """CPUs allowed by a cgroup CPU quota, or None when there is no quota.

    Reads cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``), then cgroup
    v1 ``cpu/cpu.cfs_quota_us`` and ``cpu/cpu.cfs_period_us`` (quota -1 = none).

    Returns:
        quota / period in CPUs (e.g. 1.5), or None.
    """
    try:
        parts = (root / "cpu.max").read_text().split()
        if parts and parts[0] != "max":
            return int(parts[0]) / int(parts[1])
        if parts:
            return None
    except (OSError, ValueError, IndexError):
        pass
    for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota = int((root / sub / "cpu.cfs_quota_us").read_text())
            period = int((root / sub / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota.

    A fractional quota is rounded up (1.5 CPUs -> 2 threads, which the quota then
    shares), never below 1.

    Returns:
        An int >= 1.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def thread_count() -> int:
    """Threads drgym runs: ``$DRGYM_THREADS`` when set, else :func:`available_cpus`.

    Raises:
        ConfigError: ``DRGYM_THREADS`` is not a positive integer.
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return available_cpus()
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{THREADS_ENV} must be a positive integer (threads), got {raw!r}.")
    return n


def configure_threads(threads: int | None = None, *, force: bool = False) -> int:
    """Apply the thread count to this process: environment, torch and faiss.

    Sets ``OMP_NUM_THREADS`` and ``RAYON_NUM_THREADS`` where unset, or to the count
    when it is exact (read by OpenMP runtimes and tokenizers that load later, and by
    child processes); when torch or
    faiss is already imported, caps their thread count at ``threads`` (a lower setting
    made by the caller is kept). With ``threads`` given or ``$DRGYM_THREADS`` set, the
    count is set exactly. Runs once per process unless ``force``. In a child forked
    after torch or faiss was loaded (:func:`forked_child`) the count is 1, whatever is
    asked (logged).

    Args:
        threads: the count; None uses :func:`thread_count`.
        force: apply again even if already applied.

    Returns:
        The thread count in effect.

    Raises:
        ConfigError: a bad ``DRGYM_THREADS``, or ``threads < 1``.
    """
    if _applied and not force and threads is None:
        return _applied["threads"]
    exact = threads is not None or bool(os.environ.get(THREADS_ENV, "").strip())
    n = thread_count() if threads is None else int(threads)
    if n < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}.")
    if n > 1 and forked_child():
        log.warning("this process was forked from one that had %s loaded: their OpenMP thread pools do not survive "
                    "fork, so it keeps 1 thread instead of %d (start workers with the 'spawn' or 'forkserver' "
                    "context to use more)", " and ".join(_forked.get("loaded", [])), n)
        n = 1  # for torch and faiss here; the environment keeps its count for exec'd children
    ensure_wait_policy()
    for var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):
        # an exact count (DRGYM_THREADS, or threads given) wins over a value inherited from a
        # parent process that applied its own count; otherwise the user's setting is kept
        if exact:
            os.environ[var] = str(n)
        else:
            os.environ.setdefault(var, str(n))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "torch" in sys.modules:
        import torch

        if exact or torch.get_num_threads() > n:
            torch.set_num_threads(n)
    if "faiss" in sys.modules:
        import faiss

        if exact or faiss.omp_get_max_threads() > n:
            faiss.omp_set_num_threads(n)
    _applied["threads"] = n
    return n


def thread_record() -> dict[str, object]:
    """What a run config records about threads (``config.json``'s ``"threads"``).

    Returns:
        ``{"threads", "source", "available_cpus", "affinity", "cgroup_quota", "torch",
        "faiss", "omp_wait_policy", "wait_policy_set_by", "wait_policy_effective",
        "forked_child"}``;
        ``torch``/``faiss`` are their thread counts when imported, else None.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    ensure_wait_policy()
    torch_n = faiss_n = None
    if "torch" in sys.modules:
        torch_n = sys.modules["torch"].get_num_threads()
    if "faiss" in sys.modules:
        faiss_n = sys.modules["faiss"].omp_get_max_threads()
    st = _wait_policy_state
    return {
        "threads": _applied.get("threads", thread_count()),
        "source": THREADS_ENV if os.environ.get(THREADS_ENV, "").strip() else "available_cpus",
        "available_cpus": available_cpus(), "affinity": affinity, "cgroup_quota": cgroup_cpu_limit(),
        "torch": torch_n, "faiss": faiss_n,
        "omp_wait_policy": st.get("omp_wait_policy"), "wait_policy_set_by": st.get("set_by"),
        "wait_policy_effective": st.get("set_by") == "user" or not st.get("loaded_before"),
        "forked_child": forked_child(),
    }


# -- dtype -------------------------------------------------------------------------------

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
_ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                     "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
                     "AVX10_2_512_AMX_2", "ALL", "DEFAULT")


def cpu_flags(cpuinfo: Path = _CPUINFO) -> set[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` (x86 ``flags``, Arm
    ``Features``), lower case; empty where the file is absent (macOS, Windows)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return set(value.lower().split())
    return set()


def auto_cpu_dtype(flags: set[str] | None = None, capability: str | None = None) -> tuple[str, str]:
    """The weight dtype for LM inference on this CPU, and why.

    bfloat16 when the CPU has bf16 dot-product instructions and torch may use them:
    x86 ``avx512_bf16`` or ``amx_bf16`` with torch's CPU capability at AVX512 (not
    capped by ``ATEN_CPU_CAPABILITY``) and oneDNN not capped below bf16 by
    ``ONEDNN_MAX_CPU_ISA``; or Arm's ``bf16`` feature. float32 otherwise: without them
    every bf16 matmul converts its operands and runs several times slower than fp32
    (measured by ``scripts/bench_dtype.py``).

    Args:
        flags: CPU flags (default :func:`cpu_flags`).
        capability: torch's CPU capability (default
            ``torch.backends.cpu.get_cpu_capability()``, e.g. ``"AVX2"``, ``"AVX512"``).

    Returns:
        ``("bfloat16" | "float32", reason)``.

    >>> auto_cpu_dtype({"avx2", "fma"}, "AVX2")
    ('float32', 'no bf16 dot-product instructions (AVX512_BF16/AMX/Arm bf16) on this CPU')
    >>> auto_cpu_dtype({"avx512f", "avx512_bf16"}, "AVX512")[0]
    'bfloat16'
    """
    flags = cpu_flags() if flags is None else flags
    if capability is None:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability())
    cap = capability.upper()
    x86 = [f for f in _BF16_FLAGS if f in flags]
    if "bf16" in flags:  # Arm's Features line (x86 names it avx512_bf16)
        return "bfloat16", f"Arm bf16 feature (torch capability {capability})"
    if not x86:
        return "float32", "no bf16 dot-product instructions (AVX512_BF16/AMX/Arm bf16) on this CPU"
    if "AVX512" not in cap:
        return "float32", f"CPU has {'/'.join(x86)} but torch runs at capability {capability}"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa and isa not in _ONEDNN_BF16_ISAS:
        return "float32", f"CPU has {'/'.join(x86)} but ONEDNN_MAX_CPU_ISA={isa} caps oneDNN below bf16"
    return "bfloat16", f"CPU flags {'/'.join(x86)}, torch capability {capability}"
