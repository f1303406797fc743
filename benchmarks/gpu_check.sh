#!/usr/bin/env bash
# What a lent GPU checks, in one command under one time limit (default 540 s):
#
#   1. pytest, on CUDA (compiled Triton, no interpreter): every Triton kernel against the torch
#      reference (tests/test_triton_kernels.py), the decode CUDA graphs captured for real
#      (tests/test_decode_graphs.py), the Engine's greedy parity on the Triton kernels
#      (tests/test_triton_engine.py), the GPU attention backends (tests/test_attention.py),
#      the block-FP8 GEMM and experts (tests/test_fp8_gemm.py), the fused decode path's kernels
#      in bfloat16 (tests/test_fused_layer_kernels.py, tests/test_fused_moe_kernels.py) and its
#      op and host-read budget (tests/test_op_budget.py). A skipped test is a failure,
#      named in the output: a backend that cannot run here must not pass by being skipped;
#   2. benchmarks/gpu_check.py: greedy parity torch / triton eager / triton + CUDA graphs,
#      decode tokens/s of each on a random 0.2 B Llama-shaped model, the FP8 GEMM and experts
#      at DeepSeek-V3's widths against their references, and what `auto` picks here (a
#      fused backend it cannot pick fails the check by name);
#   3. the sm_90 report (kernels/sm90_report.py): every Triton kernel compiled for sm_90,
#      its shared memory, registers and spills against an H100's limits;
#   4. benchmarks/gpu_deepseek_lite.py, in the time left: a random DeepSeek-V2-Lite-shaped
#      model (3 layers, bf16, MLA, MoE) end to end on the Engine's `auto` (Triton) kernels,
#      eager / CUDA graphs, each with and without the overlap (--async-scheduling): decode
#      tokens/s, greedy tokens equal to eager's, per-part round times (host and CUDA events).
#      Its JSON goes into gpu_check.json as "deepseek_lite"; a mismatch, an error, a backend
#      `auto` did not fuse, or a skipped configuration (no overlap in the tree, graphs asked
#      for but not captured) fails the check by name.
#
#   benchmarks/gpu_check.sh [LIMIT_S]        # on the GPU machine, from the carried tree
#   benchmarks/gpu_check.sh --pack           # here, first: copy what that machine lacks
#
# It needs only the carried tree and the machine's python3 with torch (CUDA), triton,
# pytest, numpy, safetensors, pyyaml, tqdm and transformers. The pure-Python `gguf` package
# (imported by the model loader) is not on the lent H200 image: `--pack` copies it from this
# venv into .gpu_deps/ (git-ignored; carry it along). Results: $OUT/gpu_check.json (step 4's
# under "deepseek_lite") and $OUT/sm90_report.json when $OUT is set, else in ./.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack" ]; then
  # This checkout's venv, else the main worktree's (a linked `git worktree` has no venv of its
  # own): both found from where this script lies, never from a fixed path.
  main_root="$(cd "$(git rev-parse --git-common-dir 2>/dev/null || echo .git)/.." 2>/dev/null && pwd)"
  src=""
  for py in .venv/bin/python "$main_root/.venv/bin/python"; do
    src="$("$py" -c 'import gguf, os; print(os.path.dirname(gguf.__file__))' 2>/dev/null)" && break
  done
  [ -n "$src" ] || { echo "gpu_check --pack: no .venv with the gguf package here or in $main_root"; exit 2; }
  mkdir -p .gpu_deps && rm -rf .gpu_deps/gguf && cp -r "$src" .gpu_deps/gguf
  echo "packed $src -> .gpu_deps/gguf"
  exit 0
fi

LIMIT="${1:-540}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD:$PWD/.gpu_deps${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0 # compiled kernels (tests/conftest.py keeps an explicit value)
export PYTHONDONTWRITEBYTECODE=1
deadline=$((SECONDS + LIMIT))
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }

"$PY" -c 'import torch, triton, gguf; assert torch.cuda.is_available(), "no CUDA device"' || {
  echo "gpu_check: needs python3 with torch (CUDA), triton and gguf (run --pack here first)"
  exit 2
}
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
  torch.cuda.get_device_name())'
status=0
log="$(mktemp)"
timeout "$(left)" "$PY" -m pytest -q -rs -p no:cacheprovider --durations=10 \
  tests/test_triton_kernels.py tests/test_decode_graphs.py tests/test_triton_engine.py \
  tests/test_attention.py tests/test_fp8_gemm.py tests/test_fused_layer_kernels.py \
  tests/test_fused_moe_kernels.py tests/test_op_budget.py 2>&1 | tee "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if grep -q '^SKIPPED' "$log"; then
  echo "gpu_check: FAILED: tests were skipped on the GPU (a backend that cannot run here):"
  grep '^SKIPPED' "$log"
  status=1
fi
rm -f "$log"
timeout "$(left)" "$PY" benchmarks/gpu_check.py --json "${OUT:-.}/gpu_check.json" || status=1
env -u TRITON_INTERPRET timeout "$(left)" "$PY" -m roundgate.kernels.sm90_report --json \
  > "${OUT:-.}/sm90_report.json" || {
  echo "gpu_check: FAILED: the sm_90 report (a kernel over an H100's limits, or no compile)"
  status=1
}
lite="$(mktemp)"
timeout "$(left)" "$PY" benchmarks/gpu_deepseek_lite.py --out "$lite" || status=1
# Into gpu_check.json (created if step 2 wrote none) as "deepseek_lite"; what failed or was
# skipped is named, and fails the check.
"$PY" - "$lite" "${OUT:-.}/gpu_check.json" <<'EOF' || status=1
import json, os, sys

lite_path, results_path = sys.argv[1:]
try:
    with open(lite_path) as f:
        lite = json.load(f)
except (OSError, ValueError):
    print("gpu_check: FAILED: gpu_deepseek_lite.py gave no result (timed out or crashed)")
    sys.exit(1)
results = {}
if os.path.exists(results_path):
    with open(results_path) as f:
        results = json.load(f)
results["deepseek_lite"] = lite
with open(results_path, "w") as f:
    f.write(json.dumps(results, indent=2) + "\n")
bad = [f"failed: {x}" for x in lite["failures"]] + [f"skipped: {x}" for x in lite["skipped"]]
for line in bad:
    print(f"gpu_check: FAILED: deepseek_lite {line}")
sys.exit(1 if bad else 0)
EOF
rm -f "$lite"
exit $status
