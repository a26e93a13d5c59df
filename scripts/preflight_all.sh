#!/usr/bin/env bash
# `drgym train preflight` on every shipped config, into training/results/preflight/: the CPU
# configs with their start policy (16 questions for the breadth run, 8 for the others), the
# GPU configs with the data checks only (no model is loaded). About an hour on 2 cores.
#   bash scripts/preflight_all.sh
set -u
cd "$(dirname "$0")/.."
out=training/results/preflight
mkdir -p "$out"
drgym train preflight --config smollm2_breadth_cpu --n 16 --out "$out/smollm2_breadth_cpu.json" > /dev/null
for c in smollm2_answerable_cpu smollm2_answerable_evidence_cpu smollm2_answerable_wide_cpu \
         smollm2_answerable_wide_capped_cpu smollm2_drgym_cpu smollm2_two_hop_cpu searchqa_smollm2_cpu; do
  drgym train preflight --config "$c" --n 8 --out "$out/$c.json" > /dev/null || echo "FAILED $c"
done
for c in searchqa_qwen3_1p7b_gpu searchqa_qwen3_1p7b_vllm_server; do
  drgym train preflight --config "$c" --data-only --out "$out/$c.json" > /dev/null || echo "FAILED $c"
done
