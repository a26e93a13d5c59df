#!/usr/bin/env bash
# The prepared GPU check of issue 2.4 (scripts/gpu_check.py says what it measures).
#
# Here (CPU), once:   python scripts/gpu_check.py --prepare .gpu_carry     # ~ a few MiB: wheels + model configs
# On the GPU machine: bash scripts/gpu_check.sh                            # run from the repository root
#   (with the device tool: run(command="bash scripts/gpu_check.sh", carry=[".gpu_carry"], timeout_s=600))
#
# The GPU machine may have torch and transformers but not TRL, datasets, gymnasium or faiss:
# the carried pure-Python wheels are installed without touching the network, drgym itself is
# used from the source tree, and each stage that still lacks a package is recorded as skipped.
# The JSON goes to $OUT (the device tool's result folder) when set, else training/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY="${GPU_CARRY:-.gpu_carry}"
DEST="${OUT:-training/results}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
# one wheel at a time, --no-deps and --no-index: a wheel for another Python version is skipped, pip never
# replaces the machine's torch/transformers, and a dependency still missing shows up as a skipped stage
for whl in "$CARRY"/wheels/*.whl; do
    [ -e "$whl" ] || continue
    python -m pip install --quiet --no-index --no-deps "$whl" > /dev/null 2>&1 || echo "skipped wheel: $(basename "$whl")"
done
timeout 570 python scripts/gpu_check.py --carry "$CARRY" --out "$DEST/gpu_check_cuda.json" --budget-s 480 "$@"
status=$?
echo "gpu_check exit status: $status"
# Sharded float16 GPU search (drgym serve --gpu-shard --gpu-float16): 200k random 128-d unit rows imported as a
# Flat index, searched on all GPUs (rows split across them, float16) and on CPU; recall@10 of the GPU run against
# the CPU run goes to $DEST/gpu_shard_check.json. Skipped (exit 0) without faiss-gpu or a GPU.
timeout 300 python - "$DEST" <<'PY'
import json, sys, tempfile, time
from pathlib import Path
import numpy as np
import faiss
if not hasattr(faiss, "GpuMultipleClonerOptions") or faiss.get_num_gpus() < 1:
    print("gpu shard check: skipped (no faiss-gpu or no GPU)"); sys.exit(0)
from drgym.index.dense import DenseIndex
from drgym.index.importer import import_index
tmp = Path(tempfile.mkdtemp())
x = np.random.default_rng(0).standard_normal((200_000, 128)).astype(np.float32)
x /= np.linalg.norm(x, axis=1, keepdims=True)
np.save(tmp / "emb.npy", x)
(tmp / "c.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": f'"T{i}"\nrow {i}'}) + "\n" for i in range(len(x))))
res = import_index(tmp / "c.jsonl", embeddings=[tmp / "emb.npy"], encoder="random-128d", factory="Flat", root=tmp / "idx", bm25=False)
m, q = res.manifest, x[:256] + 0.05 * np.random.default_rng(1).standard_normal((256, 128)).astype(np.float32)
q /= np.linalg.norm(q, axis=1, keepdims=True)
cpu = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, device="cpu")
gpu = DenseIndex(res.folder, m.shards, m.dim, m.n_passages, gpu_shard=True, gpu_float16=True)
t = time.perf_counter(); _, rg = gpu.search(q, 10); gpu_s = time.perf_counter() - t
_, rc = cpu.search(q, 10)
recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rg, rc)]))
out = {"gpus": faiss.get_num_gpus(), "on_gpu": gpu.on_gpu, "gpu_errors": gpu.gpu_errors, "rows": len(x),
       "queries": len(q), "recall_at_10_vs_cpu": recall, "gpu_search_s": round(gpu_s, 4)}
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[1]) / "gpu_shard_check.json").write_text(json.dumps(out, indent=2))
print("gpu shard check:", json.dumps(out))
sys.exit(0 if gpu.on_gpu and recall >= 0.99 else 1)
PY
shard_status=$?
echo "gpu shard check exit status: $shard_status"
[ "$status" -eq 0 ] && status=$shard_status
exit $status
