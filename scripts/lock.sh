#!/usr/bin/env bash
# Refresh requirements/lock.txt, the exact set of packages that `bash scripts/setup.sh`
# installs (as pip constraints) and that CI tests: drgym's dependencies plus the `test`
# extra, for CPython 3.11 on x86-64 Linux.
#
#   bash scripts/lock.sh              # re-resolve after a change to pyproject.toml; keeps the other pins
#   bash scripts/lock.sh --upgrade    # move every pin to the newest release within pyproject's ranges
#   bash scripts/lock.sh --upgrade-package trl   # (any other `uv pip compile` option passes through)
#
# Then run the test suite in a fresh venv (bash .ci/run) before committing the new lock.
# Needs uv: pip install -e '.[dev]' (or pip install uv).
#
# torch is locked to the CPU build, torch==$TORCH_VERSION+cpu. uv resolves from PyPI and
# ignores pip's configuration, and PyPI's Linux torch is the CUDA build, whose metadata
# pulls in nvidia-* and triton: resolved from there, the lock would make pip download
# gigabytes of CUDA. The CPU wheel's metadata comes from a folder of wheels ($TORCH_WHEELS,
# default /opt/wheels, where this machine keeps it) or, failing that, PyTorch's CPU index.
# The result is checked: a lock that names nvidia-*, triton or a non-CPU torch is refused.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.13.0"
TORCH_WHEELS="${TORCH_WHEELS:-/opt/wheels}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
out="requirements/lock.txt"

if command -v uv >/dev/null 2>&1; then uv=(uv); elif python -m uv --version >/dev/null 2>&1; then uv=(python -m uv)
else echo "scripts/lock.sh needs uv: pip install -e '.[dev]'  (or: pip install uv)" >&2; exit 2; fi

torch_source=()
if compgen -G "$TORCH_WHEELS/torch-${TORCH_VERSION}+cpu-*.whl" >/dev/null; then
    torch_source=(--find-links "$TORCH_WHEELS")
else
    torch_source=(--extra-index-url "$TORCH_INDEX")
fi

mkdir -p requirements
torch_in="$(mktemp --suffix=.in)"
trap 'rm -f "$torch_in"' EXIT
echo "torch==${TORCH_VERSION}+cpu" >"$torch_in"

"${uv[@]}" pip compile pyproject.toml "$torch_in" --extra test \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    "${torch_source[@]}" \
    --custom-compile-command "bash scripts/lock.sh" \
    --no-emit-package drgym \
    --quiet -o "$out" "$@"
# The temporary file's name is in the "# via" notes; name it for what it is.
sed -i "s|-r $torch_in|scripts/lock.sh (torch, the CPU build)|" "$out"

if grep -q -i -E '^(nvidia-|triton==|torch==[^+]*$)' "$out"; then
    echo "scripts/lock.sh: $out names a CUDA torch, triton or nvidia-* package; refusing it:" >&2
    grep -i -E '^(nvidia-|triton==|torch==)' "$out" >&2
    exit 1
fi
grep -q -E "^torch==${TORCH_VERSION}\+cpu$" "$out" || { echo "scripts/lock.sh: torch==${TORCH_VERSION}+cpu is not in $out" >&2; exit 1; }
echo "wrote $out ($(grep -c -E '^[A-Za-z0-9]' "$out") pins)"
