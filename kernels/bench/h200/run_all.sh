#!/usr/bin/env bash
# Device-side driver for the H200 (the device tool runs it in the repository root). It builds no Rust: it runs
# what kernels/bench/h200/prepare.sh copied into target-h5-carry/ (the release GPU test binary and the PTX the
# crate embeds), in this order, writing logs under $OUT and printing the short table last:
#   1. the environment (nvidia-smi, nvcc, tool and package versions),
#   2. the GPU tests (kernels/tests/gpu_kernels.rs) against the CPU references,
#   3. compute-sanitizer memcheck and racecheck over the same tests (small shapes by construction),
#   4. the SASS of the sm_90 cubins (are the weight loads 16 bytes wide),
#   5. the benchmark (bench.py) against cuBLAS / SDPA / fla measured in the same run.
# Usage: kernels/bench/h200/run_all.sh [--quick]   (--quick: fewer shapes and rounds, for a smoke run)
#        kernels/bench/h200/run_all.sh prepare      (on the build machine: builds and fills target-h5-carry/)
set -uo pipefail
cd "$(dirname "$0")/../../.."
CARRY=${CARRY:-target-h5-carry}  # h6: overridable (run_gemm.sh uses target-h6-carry)

if [ "${1:-}" = prepare ]; then
  set -e
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target-h5}
  bin=$(cargo test -p kernels --features cuda --release --no-run --test gpu_kernels --message-format=json \
    | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'gpu_kernels':
        print(m['executable'])")
  out=$(dirname "$(ls -t "$CARGO_TARGET_DIR"/release/build/kernels-*/out/cuda_modules.rs | head -1)")
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  cp "$bin" "$CARRY/gpu_kernels"
  strip --strip-debug "$CARRY/gpu_kernels"
  cp "$out"/*.ptx "$out"/*.sm_90.cubin "$out"/*.ptxas.txt "$CARRY/"
  du -sh "$CARRY"; ls "$CARRY"
  exit 0
fi
OUT=${OUT:-/tmp/edgefit-h200}
mkdir -p "$OUT"
QUICK=${1:-}
export PYTHONUNBUFFERED=1
status=()

{
  date -u
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  nvcc --version | tail -2
  command -v cuobjdump compute-sanitizer
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)"
} > "$OUT/env.txt" 2>&1
tail -4 "$OUT/env.txt"

if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site && python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
fi

echo "== GPU tests"
"$CARRY/gpu_kernels" --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1
rc=$?; status+=("gpu tests: rc=$rc"); grep -E "^test |test result|seed" "$OUT/tests.txt" | tail -20

echo "== compute-sanitizer"
: > "$OUT/sanitizer.txt"
for tool in memcheck racecheck; do
  echo "--- $tool" >> "$OUT/sanitizer.txt"
  compute-sanitizer --tool "$tool" --error-exitcode 99 "$CARRY/gpu_kernels" --test-threads=1 >> "$OUT/sanitizer.txt" 2>&1
  rc=$?; status+=("sanitizer $tool: rc=$rc"); grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$OUT/sanitizer.txt" | tail -2
done

echo "== SASS"
: > "$OUT/sass.txt"
for c in "$CARRY"/*.sm_90.cubin; do
  echo "--- $c" >> "$OUT/sass.txt"
  cuobjdump --dump-sass "$c" > /tmp/sass_one.txt 2>&1
  for f in $(grep -o "Function : [a-zA-Z0-9_]*" /tmp/sass_one.txt | awk '{print $3}'); do
    awk -v f="$f" '/Function : /{p=($3==f)} p' /tmp/sass_one.txt > /tmp/sass_fn.txt
    printf '%-36s LDG.128 %3d  LDG(all) %3d  LDL/STL %d\n' "$f" "$(grep -c 'LDG.*\.128' /tmp/sass_fn.txt)" \
      "$(grep -c 'LDG' /tmp/sass_fn.txt)" "$(grep -cE 'LDL|STL' /tmp/sass_fn.txt)" >> "$OUT/sass.txt"
  done
done
grep -E "gemv_m1|gdn|D256_R6" "$OUT/sass.txt"
# The full SASS of the M=1 GEMVs, to count conversion and integer instructions per weight byte.
for fn in fp8_block_gemv_m1 nvfp4_gemv_m1; do
  echo "=== $fn" >> "$OUT/sass.txt"
  cuobjdump --dump-sass --function "$fn" "$CARRY/gemv.sm_90.cubin" >> "$OUT/sass.txt" 2>&1
done

echo "== Nsight Compute (one launch of each kernel at benchmark size)"
ncu --clock-control none -k regex:'fp8_block_gemv_m1_r2_u2|nvfp4_gemv_m1|gdn_decode_step|attention_decode' \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
  python3 kernels/bench/h200/ncu_launches.py "$CARRY" > "$OUT/ncu.txt" 2>&1
rc=$?; status+=("ncu: rc=$rc")
grep -E "^\s+[a-z_0-9]+.*\(|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Stall" "$OUT/ncu.txt" | head -60

echo "== benchmark"
python3 kernels/bench/h200/bench.py "$CARRY" $QUICK 2>&1 | tee "$OUT/bench.txt" | grep -vE " ours +[0-9]"
rc=${PIPESTATUS[0]}; status+=("bench: rc=$rc")

echo "== status"
printf '%s\n' "${status[@]}"
