"""Thread counts from the available cores, DRGYM_THREADS, the OpenMP wait policy, and the CPU dtype."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys

import pytest

import drgym.cpu as cpu
from drgym.errors import ConfigError


def _run(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (OpenMP settings are fixed at load) and parse its last line."""
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "DRGYM_THREADS")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_doctests():
    assert doctest.testmod(cpu).failed == 0


def test_cgroup_quota_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cpu.cgroup_cpu_limit(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu.cgroup_cpu_limit(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu.cgroup_cpu_limit(v1) == 1.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu.cgroup_cpu_limit(v1) is None
    assert cpu.cgroup_cpu_limit(tmp_path / "absent") is None


def test_available_cpus_is_affinity_capped_by_quota(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpu, "cgroup_cpu_limit", lambda root=None: None)
    assert cpu.available_cpus() == 4
    monkeypatch.setattr(cpu, "cgroup_cpu_limit", lambda root=None: 1.5)
    assert cpu.available_cpus() == 2  # a fractional quota rounds up
    monkeypatch.setattr(cpu, "cgroup_cpu_limit", lambda root=None: 0.2)
    assert cpu.available_cpus() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(cpu, "cgroup_cpu_limit", lambda root=None: 8.0)
    assert cpu.available_cpus() == 1


def test_drgym_threads_overrides_and_bad_values_are_named(monkeypatch):
    monkeypatch.setattr(cpu, "available_cpus", lambda: 2)
    monkeypatch.delenv("DRGYM_THREADS", raising=False)
    assert cpu.thread_count() == 2
    monkeypatch.setenv("DRGYM_THREADS", "3")
    assert cpu.thread_count() == 3
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("DRGYM_THREADS", bad)
        with pytest.raises(ConfigError, match=f"DRGYM_THREADS must be a positive integer.*{bad!r}"):
            cpu.thread_count()


def test_import_drgym_sets_a_passive_wait_policy_unless_the_user_set_one():
    code = "import os, json, drgym; from drgym.cpu import thread_record; print(json.dumps(thread_record()))"
    rec = _run(code)
    assert rec["omp_wait_policy"] == "PASSIVE" and rec["wait_policy_set_by"] == "drgym" and rec["wait_policy_effective"]
    rec = _run(code, OMP_WAIT_POLICY="ACTIVE")
    assert rec["omp_wait_policy"] == "ACTIVE" and rec["wait_policy_set_by"] == "user"
    # torch imported first: its OpenMP runtime read the environment already, and the record says so
    rec = _run("import json, torch, drgym; from drgym.cpu import thread_record; print(json.dumps(thread_record()))")
    assert rec["wait_policy_effective"] is False


def test_configure_threads_applies_drgym_threads_to_torch_faiss_and_env():
    code = ("import json, os, drgym; from drgym.cpu import configure_threads; n = configure_threads(); "
            "import torch, faiss; print(json.dumps({'n': n, 'torch': torch.get_num_threads(), "
            "'faiss': faiss.omp_get_max_threads(), 'omp': os.environ['OMP_NUM_THREADS'], "
            "'rayon': os.environ['RAYON_NUM_THREADS']}))")
    assert _run(code, DRGYM_THREADS="1") == {"n": 1, "torch": 1, "faiss": 1, "omp": "1", "rayon": "1"}


def test_drgym_threads_wins_over_thread_variables_inherited_from_a_parent():
    """A drgym process exports its count to its children; a child started with its own
    DRGYM_THREADS uses that count, not the parent's inherited OMP/RAYON values."""
    code = ("import json, os, drgym; from drgym.cpu import configure_threads; n = configure_threads(); "
            "print(json.dumps({'n': n, 'omp': os.environ['OMP_NUM_THREADS'], 'rayon': os.environ['RAYON_NUM_THREADS']}))")
    assert _run(code, DRGYM_THREADS="1", OMP_NUM_THREADS="7", RAYON_NUM_THREADS="7") == {"n": 1, "omp": "1", "rayon": "1"}
    # without DRGYM_THREADS a user's own OMP_NUM_THREADS is kept
    assert _run(code, OMP_NUM_THREADS="7")["omp"] == "7"


def test_configure_threads_caps_an_already_loaded_torch_at_the_available_cores():
    avail = cpu.available_cpus()
    code = ("import json, torch; torch.set_num_threads(%d); import drgym.cpu as c; c.configure_threads(); "
            "print(json.dumps({'torch': torch.get_num_threads()}))" % (avail + 3))
    assert _run(code) == {"torch": avail}
    # a lower setting made by the caller is kept
    code = ("import json, torch; torch.set_num_threads(1); import drgym.cpu as c; c.configure_threads(); "
            "print(json.dumps({'torch': torch.get_num_threads()}))")
    assert _run(code) == {"torch": 1}


def test_the_cli_refuses_a_bad_drgym_threads_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "DRGYM_THREADS"}
    r = subprocess.run([sys.executable, "-m", "drgym", "version"], capture_output=True, text=True,
                       env={**env, "DRGYM_THREADS": "lots"}, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "error: DRGYM_THREADS must be a positive integer (threads), got 'lots'."


def test_auto_cpu_dtype_follows_the_bf16_instructions(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert cpu.auto_cpu_dtype({"avx2", "fma", "avx512f"}, "AVX512")[0] == "float32"  # AVX-512 without bf16
    assert cpu.auto_cpu_dtype({"avx2", "amx_bf16", "avx512_bf16"}, "AVX512") == (
        "bfloat16", "CPU flags avx512_bf16/amx_bf16, torch capability AVX512")
    assert cpu.auto_cpu_dtype({"fp", "asimd", "bf16"}, "DEFAULT")[0] == "bfloat16"  # Arm
    # torch (ATEN_CPU_CAPABILITY) or oneDNN capped below the bf16 instructions
    assert cpu.auto_cpu_dtype({"avx512_bf16"}, "AVX2") == (
        "float32", "CPU has avx512_bf16 but torch runs at capability AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert cpu.auto_cpu_dtype({"avx512_bf16"}, "AVX512")[0] == "float32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert cpu.auto_cpu_dtype({"avx512_bf16"}, "AVX512")[0] == "bfloat16"
    assert cpu.auto_cpu_dtype(set(), "DEFAULT")[0] == "float32"  # flags unknown (no /proc/cpuinfo)


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 AVX512_BF16\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu.cpu_flags(f) == {"fpu", "avx2", "avx512_bf16"}
    f.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    assert "bf16" in cpu.cpu_flags(f)
    assert cpu.cpu_flags(tmp_path / "absent") == set()


def test_resolve_dtype():
    from drgym.models import resolve_dtype

    assert resolve_dtype("float32", "cpu") == ("float32", "set by the user")
    assert resolve_dtype("auto", "cuda:0") == ("float16", "auto: float16 on CUDA")
    # auto is float32 on every CPU (scores reproduce across kernels); fastest is the CPU's pick
    name, why = resolve_dtype("auto", "cpu")
    assert name == "float32" and why.startswith("auto: float32 on CPU, the same scores on every x86-64 CPU")
    assert ("faster on this CPU" in why) == (cpu.auto_cpu_dtype()[0] == "bfloat16")
    assert resolve_dtype("fastest", "cpu") == (cpu.auto_cpu_dtype()[0], "fastest: " + cpu.auto_cpu_dtype()[1])
    assert resolve_dtype("fastest", "cuda") == ("float16", "fastest: float16 on CUDA")
    for bad in ("float33", "int8", "cpu"):
        with pytest.raises(ConfigError, match=f"dtype must be 'auto', 'fastest' or a torch floating dtype.*{bad!r}"):
            resolve_dtype(bad, "cpu")


def test_hf_policy_refuses_a_bad_dtype_before_loading():
    from drgym.policies.hf import HFPolicy

    with pytest.raises(ConfigError, match="dtype must be"):
        HFPolicy("no-such-model", dtype="bf16")


def test_dtype_names_are_known_without_torch():
    """The dtype check runs before torch loads: its name list must be torch's floating dtypes."""
    import torch

    from drgym.models import _FLOAT_DTYPES, check_dtype

    names = {n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype) and getattr(torch, n).is_floating_point}
    assert _FLOAT_DTYPES == names - {"float4_e2m1fn_x2"}  # a packed pair of 4-bit floats: no weight dtype
    for ok in ("auto", "fastest", "bfloat16", "half"):
        check_dtype(ok)
    with pytest.raises(ConfigError, match="got 'int8'"):
        check_dtype("int8")
