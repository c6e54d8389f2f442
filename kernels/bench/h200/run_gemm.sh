#!/usr/bin/env bash
# Device-side driver for the prefill GEMMs (kernels/cuda/gemm.cu) in one short H200 call (h6). Like run_all.sh it
# builds no Rust: it runs what `CARRY=target-h6-carry kernels/bench/h200/run_all.sh prepare` copied (the release GPU
# test binary and the PTX the crate embeds), writing logs under $OUT and printing the short table last:
#   1. the environment,
#   2. every GPU test (kernels/tests/gpu_kernels.rs: the GEMMs' and, re-verified, the GEMVs', GDN's, attention's),
#   3. compute-sanitizer memcheck over the GEMM and quantiser tests,
#   4. the benchmark sections fp8_gemm and nvfp4_gemm (bench.py --only=fp8_gemm,nvfp4_gemm),
#   5. compute-sanitizer racecheck over the same tests as 3.
# Every step has its own timeout (185 s in all) so that one slow step cannot take the table with it.
# Usage: kernels/bench/h200/run_gemm.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
CARRY=${CARRY:-target-h6-carry}
OUT=${OUT:-/tmp/edgefit-h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=()
t0=$(date +%s)
GEMM_TESTS=(fp8_block_gemm fp8_quantize nvfp4_gemm)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)"
  command -v compute-sanitizer
} > "$OUT/env.txt" 2>&1
tail -4 "$OUT/env.txt"

echo "== GPU tests"
timeout 55 "$CARRY/gpu_kernels" --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1
rc=$?; status+=("gpu tests: rc=$rc (t=$(( $(date +%s) - t0 ))s)")
grep -E "^test |test result|relative error|panicked" "$OUT/tests.txt" | tail -40

sanitize() {
  echo "--- $1" >> "$OUT/sanitizer.txt"
  timeout "$2" compute-sanitizer --tool "$1" --error-exitcode 99 "$CARRY/gpu_kernels" --test-threads=1 \
    "${GEMM_TESTS[@]}" >> "$OUT/sanitizer.txt" 2>&1
  rc=$?; status+=("sanitizer $1: rc=$rc (t=$(( $(date +%s) - t0 ))s)")
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$OUT/sanitizer.txt" | tail -2
}
echo "== compute-sanitizer memcheck (GEMM + quantiser tests)"
: > "$OUT/sanitizer.txt"
sanitize memcheck 30

echo "== benchmark (fp8_gemm, nvfp4_gemm)"
timeout 75 python3 kernels/bench/h200/bench.py "$CARRY" --only=fp8_gemm,nvfp4_gemm > "$OUT/bench.txt" 2>&1
rc=$?; status+=("bench: rc=$rc (t=$(( $(date +%s) - t0 ))s)")
grep -E "note|Error|error|Traceback" "$OUT/bench.txt" | head -8

echo "== compute-sanitizer racecheck (GEMM + quantiser tests)"
sanitize racecheck 25

echo "== status"
printf '%s\n' "${status[@]}"
echo "== table"
sed -n '/^H200 ceilings/,$p' "$OUT/bench.txt"
grep -E "^(fp8_gemm|nvfp4_gemm|fp8_quant)" "$OUT/bench.txt" | grep " ours " | cut -c1-200 | tail -14
