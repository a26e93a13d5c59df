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
exit $status
