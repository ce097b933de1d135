#!/usr/bin/env bash
# Every check of the GPU target, on a machine with an NVIDIA GPU, in one run; prints a summary.
# Run it where TensorRT and Model Optimizer import: the GPU build image (build/Containerfile), e.g.
#   podman run --rm --device nvidia.com/gpu=all -v "$PWD:/repo" -w /repo --entrypoint bash \
#     slimserve-build-gpu:0.1.0 scripts/gpu-check.sh
# or any venv with slimserve[dev] plus TensorRT's Python bindings. Steps:
#   env        GPU, driver, compute capability, TensorRT / Model Optimizer / torch versions
#   cpu-tests  tests/test_tensorrt.py tests/test_tensorrt_qdq.py tests/test_tensorrt_multi_item.py
#              tests/test_tensorrt_multi_item_stage.py (profiles, configs, gate, Q/DQ graphs; the
#              multi-item profiles, config, stage, publish and the service's requests against the config)
#   gpu-tests  tests/test_tensorrt_gpu.py (single-sequence and multi-item engines built, run, gated;
#              a skip here counts as a failure)
#   build      slimserve build --recipe tiny-gpu (Q/DQ, engine, parity gate, tensorrt_plan publish)
#   triton     the published repository served by Triton 24.10 (local tritonserver or the
#              tritonserver:24.10-py3 image via docker/podman), scores compared with the engine's
#   build-multi-item, triton-multi-item
#              the same with publish.scoring_mode: multi_item (the multi-item engine: Q/DQ on member
#              requests, profiles per item-length bucket, gated per member against the multi-item ONNX
#              graph; served one member per request as the scoring service sends them)
# Options (environment): OUT (default build_output/gpu-check), PYTHON (default: .venv/bin/python if
# present, else python3), TRITON_IMAGE (default nvcr.io/nvidia/tritonserver:24.10-py3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build_output/gpu-check}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TRITON_IMAGE="${TRITON_IMAGE:-nvcr.io/nvidia/tritonserver:24.10-py3}"
mkdir -p "$OUT"
declare -a NAMES=() RESULTS=() NOTES=()

record() { NAMES+=("$1"); RESULTS+=("$2"); NOTES+=("$3"); echo "== $1: $2 $3"; }

step_env() {
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || return 1
  "$PYTHON" - <<'PY'
import importlib
for name in ("tensorrt", "modelopt", "torch", "onnxruntime", "onnx"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except ImportError as exc:
        print(f"{name} MISSING ({exc})")
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_capability() if torch.cuda.is_available() else "-")
PY
}

pytest_step() {  # name, junit file, args...
  local name="$1" junit="$2"
  shift 2
  "$PYTHON" -m pytest -q -rs -p no:cacheprovider --junitxml="$junit" "$@"
  local rc=$?
  local counts
  counts="$("$PYTHON" - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite[0]
# a skip is expected only for FP8 on GPUs below compute capability 8.9
unexpected = sum(
    1 for case in suite.iter("testcase") for skip in case.iter("skipped")
    if "FP8 needs compute capability" not in (skip.get("message") or "")
)
print(suite.get("tests"), suite.get("failures"), suite.get("errors"), unexpected)
PY
)"
  read -r tests failures errors skipped <<<"$counts"
  echo "$name: $tests tests, $failures failures, $errors errors, $skipped unexpected skips"
  LAST_NOTE="($tests tests, $((failures + errors)) failed, $skipped unexpectedly skipped)"
  LAST_SKIPPED="$skipped"
  return $rc
}

echo "# slimserve GPU check, $(date -u +%FT%TZ), output in $OUT"

if step_env >"$OUT/env.txt" 2>&1; then record env PASS "$(head -1 "$OUT/env.txt")"; else record env FAIL "(no GPU visible: nvidia-smi failed)"; fi
cat "$OUT/env.txt"

if pytest_step cpu-tests "$OUT/cpu-tests.xml" tests/test_tensorrt.py tests/test_tensorrt_qdq.py \
  tests/test_tensorrt_multi_item.py tests/test_tensorrt_multi_item_stage.py; then
  record cpu-tests PASS "$LAST_NOTE"
else
  record cpu-tests FAIL "$LAST_NOTE"
fi

if pytest_step gpu-tests "$OUT/gpu-tests.xml" -m gpu tests/test_tensorrt_gpu.py && [[ "${LAST_SKIPPED:-1}" == 0 ]]; then
  record gpu-tests PASS "$LAST_NOTE"
else
  record gpu-tests FAIL "$LAST_NOTE (skip reasons: the -rs lines above)"
fi

multi_item_recipe() {  # tiny-gpu with publish.scoring_mode: multi_item (the recipe files stay single)
  "$PYTHON" - "$1" <<'PY'
import sys, yaml
from slimserve.buildstage.recipe import RECIPES_DIR
recipe = yaml.safe_load((RECIPES_DIR / "tiny-gpu.yaml").read_text())
recipe["name"] = "tiny-gpu-multi-item"
recipe["publish"]["scoring_mode"] = "multi_item"
open(sys.argv[1], "w").write(yaml.safe_dump(recipe))
PY
}

build_and_serve() {  # step suffix, recipe; records build<suffix> and triton<suffix>
  local suffix="$1" recipe="$2" work="$OUT/work$1" repo="$OUT/model_repository$1"
  rm -rf "$repo"
  if "$PYTHON" -m slimserve.cli build --recipe "$recipe" --work-dir "$work" --model-repository "$repo" --restart \
      >"$OUT/build$suffix.log" 2>&1; then
    local parity summary
    parity="$(find "$work" -name tensorrt.json -path '*tensorrt_*sm*' | head -1)"
    summary="$("$PYTHON" -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['parity']; e=d['engine']; g=d.get('multi_item_gate'); print(f\"{d.get('layout', 'single')} {e['precision']} sm{e['compute_capability']} TensorRT {e['tensorrt_version']}: pearson {p['pearson']:.4f} spearman {p['spearman']:.4f} pairs {p['pairwise_agreement']:.4f} top-k {p['topk_overlap']:.3f}\" + (f\" AUC gap {g['auc_gap']:.4f}\" if g else ''))" "$parity")"
    record "build$suffix" PASS "($summary)"
    grep -E "platform|max_batch_size|cc_model_filenames|profile" "$repo"/scorer/config.pbtxt | head -8
  else
    record "build$suffix" FAIL "(see $OUT/build$suffix.log)"
    tail -20 "$OUT/build$suffix.log"
  fi
  if [[ -f "$repo/scorer/config.pbtxt" ]]; then
    "$PYTHON" scripts/gpu_check_triton.py "$repo" --image "$TRITON_IMAGE" >"$OUT/triton$suffix.log" 2>&1
    local rc=$?
    tail -5 "$OUT/triton$suffix.log"
    case $rc in
      0) record "triton$suffix" PASS "($(grep -m1 'max |diff|' "$OUT/triton$suffix.log"))" ;;
      3) record "triton$suffix" SKIP "($(grep -m1 SKIP "$OUT/triton$suffix.log"))" ;;
      *) record "triton$suffix" FAIL "(see $OUT/triton$suffix.log)" ;;
    esac
  else
    record "triton$suffix" SKIP "(nothing published)"
  fi
}

build_and_serve "" tiny-gpu
if multi_item_recipe "$OUT/tiny-gpu-multi-item.yaml" >"$OUT/multi-item-recipe.log" 2>&1; then
  build_and_serve "-multi-item" "$OUT/tiny-gpu-multi-item.yaml"
else
  record build-multi-item FAIL "(could not write the recipe: $OUT/multi-item-recipe.log)"
fi

echo
echo "## Summary"
failed=0
for i in "${!NAMES[@]}"; do
  printf '%-10s %-5s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${NOTES[$i]}"
  [[ "${RESULTS[$i]}" == FAIL ]] && failed=1
done
exit $failed
