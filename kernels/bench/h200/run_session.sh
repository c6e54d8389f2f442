#!/usr/bin/env bash
# One H200 call for everything the GPU work needs checked: every GPU test binary (kernels/tests/gpu_*.rs) against
# the CPU references, compute-sanitizer memcheck and racecheck over each, then the benchmarks, a status table last.
# The benchmarks: the Rust GPU benchmark (kernels/benches/gpu.rs: the public kernels::cuda::Gpu calls the engine
# makes, timed through the library) writes $OUT/gpu_bench.json, then kernels/bench/h200/baselines.py times the
# library baselines (cuBLAS, SDPA flash, fla, torch) on the same shapes and prints the combined table that
# benchmarks/h200.md is read from. The older cupy scripts (kernels/bench/h200/bench_*.py, which launch the PTX
# themselves to sweep variants) still run by name.
# It builds nothing on the device: `prepare` (here, on the build machine) builds the release test binaries with
# the `cuda` and `lab` features (the tests and the bench scripts drive variants that only `lab` embeds) and packs
# them with the PTX and cubins the crate embeds into target-carry/carry.tar.xz, and the benchmark into
# target-carry/gpu_bench.tar.gz (`cargo xtask bench gpu`), which the device tool carries
# (`carry: ["target-carry", ".whl"]`; the packs keep the call under its 64 MiB).
#
# Usage (here):     kernels/bench/h200/run_session.sh prepare [gpu_a,gpu_b]   (default: every gpu_* test file)
# Usage (device):   bash kernels/bench/h200/run_session.sh [TESTS] [BENCHES] [--no-sanitizer]
#   TESTS: comma-separated names (gpu_kernels,gpu_ops) or "all" (default) or "none".
#   BENCHES: "all" (default) = "rust" (the Rust benchmark + baselines.py); "cupy" = every bench_*.py script;
#   or comma-separated names (rust,gemv,ops); "none".
#   Env: SAN_TESTS (binaries to sanitize, default TESTS), SAN_ARGS (extra arguments of each sanitized binary, e.g.
#   a test-name filter), SAN_TIMEOUT (per tool run, default 120 s), SAN_BUDGET
#   (no new sanitizer run after this many seconds), BENCH_ARGS (e.g. --quick: passed to the Rust benchmark,
#   baselines.py and every bench script), GPU_BENCH_FILTER (row-name filters of the Rust benchmark, e.g. "gemv attn").
# Logs: $OUT/tests_<name>.txt, $OUT/sanitizer_<name>.txt, $OUT/gpu_bench.{txt,json}, $OUT/baselines.{txt,json},
#   $OUT/bench_<name>.txt (+ each cupy script's json).
set -uo pipefail
cd "$(dirname "$0")/../../.."
CARRY=target-carry

if [ "${1:-}" = prepare ]; then
  set -e
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target-carry-build}
  targets=()
  if [ -n "${2:-}" ]; then for t in ${2//,/ }; do targets+=(--test "$t"); done; else targets=(--tests); fi
  # (the compiler's messages go to /tmp/edgefit-prepare.err; shown if the build fails)
  trap '[ $? -ne 0 ] && tail -40 /tmp/edgefit-prepare.err' EXIT
  cargo test -p kernels --features cuda,lab --release --no-run "${targets[@]}" --message-format=json 2>/tmp/edgefit-prepare.err \
    | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    name = m.get('target', {}).get('name', '')
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and (name.startswith('gpu_') or name == 'backend'):
        # The backend parity tests (CPU and CUDA arms of one op vocabulary) travel as gpu_backend.
        print(name if name.startswith('gpu_') else 'gpu_' + name, m['executable'])" > /tmp/edgefit-gpu-bins.txt
  out=$(dirname "$(ls -t "$CARGO_TARGET_DIR"/release/build/kernels-*/out/cuda_modules.rs | head -1)")
  stage=$(mktemp -d)
  while read -r name exe; do cp "$exe" "$stage/$name"; strip --strip-debug "$stage/$name"; done < /tmp/edgefit-gpu-bins.txt
  cp "$out"/*.ptx "$out"/*.cubin "$out"/*.ptxas.txt "$stage/"
  # bench_gemv.py's read floor, not part of the crate: the same nvcc and target as kernels/build_cuda.rs
  "${NVCC:-nvcc}" -ptx -arch=compute_90 -O3 -std=c++17 --Werror all-warnings -Ikernels/cuda \
    -o "$stage/read_floor.ptx" kernels/bench/h200/read_floor.cu
  mkdir -p "$CARRY" && rm -f "$CARRY/carry.tar.xz"
  tar -C "$stage" -cJf "$CARRY/carry.tar.xz" .
  rm -rf "$stage"
  # The GPU benchmark, built in the same target directory (the kernels crate is already compiled there).
  cargo xtask bench gpu --out "$CARRY"
  ls -la "$CARRY"; cut -d' ' -f1 /tmp/edgefit-gpu-bins.txt
  exit 0
fi

OUT=${OUT:-/tmp/edgefit-h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TESTS=${1:-all}
BENCHES=${2:-all}
SANITIZE=1
[ "${3:-}" = --no-sanitizer ] && SANITIZE=0
BIN=/tmp/edgefit-carry
rm -rf "$BIN" && mkdir -p "$BIN"
[ -f "$CARRY/carry.tar.xz" ] && tar -C "$BIN" -xf "$CARRY/carry.tar.xz"
[ -f "$CARRY/gpu_bench.tar.gz" ] && tar -C "$BIN" -xzf "$CARRY/gpu_bench.tar.gz"
status=()
t0=$(date +%s)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  nvcc --version | tail -2
  python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site && python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
fi

wanted() { [ "$1" = all ] || [[ ",$1," == *",$2,"* ]]; }
# BENCHES "all" is the Rust benchmark with its baselines; "cupy" every older script.
wanted_bench() {
  case "$BENCHES" in
    all) [ "$1" = rust ] ;;
    cupy) [ "$1" != rust ] ;;
    *) [[ ",$BENCHES," == *",$1,"* ]] ;;
  esac
}

for exe in "$BIN"/gpu_*; do
  [ -f "$exe" ] || continue
  [ "$(basename "$exe")" = gpu_bench ] && continue
  name=$(basename "$exe")
  wanted "$TESTS" "$name" || continue
  echo "== $name"
  timeout 120 "$exe" --test-threads=1 --nocapture > "$OUT/tests_$name.txt" 2>&1
  rc=$?; status+=("tests $name: rc=$rc $(grep -E '^test result' "$OUT/tests_$name.txt" | tail -1)")
  grep -E "^test .*(FAILED|ok)$|panicked|test result" "$OUT/tests_$name.txt" | grep -vE " ok$" | head -20
done
echo "[tests done at +$(( $(date +%s) - t0 ))s]"

if wanted_bench rust; then
  echo "== Rust GPU benchmark (kernels/benches/gpu.rs)"
  if [ -x "$BIN/gpu_bench" ]; then
    # shellcheck disable=SC2086
    timeout 420 "$BIN/gpu_bench" ${BENCH_ARGS:-} --json "$OUT/gpu_bench.json" ${GPU_BENCH_FILTER:-} > "$OUT/gpu_bench.txt" 2>&1
    rc=$?; status+=("gpu_bench: rc=$rc $(grep -c FAILED "$OUT/gpu_bench.txt") FAILED lines")
    grep -E "^(device|skipped|\[all rows)" "$OUT/gpu_bench.txt"
    echo "[gpu_bench done at +$(( $(date +%s) - t0 ))s]"
    echo "== baselines (kernels/bench/h200/baselines.py)"
    # shellcheck disable=SC2086
    timeout 300 python3 kernels/bench/h200/baselines.py "$OUT/gpu_bench.json" ${BENCH_ARGS:-} --json "$OUT/baselines.json" \
      > "$OUT/baselines.txt" 2>&1
    rc=$?; status+=("baselines: rc=$rc")
    # The combined table is the last block baselines.py prints.
    sed -n '/^Combined:/,$p' "$OUT/baselines.txt"
    [ $rc -ne 0 ] && tail -20 "$OUT/baselines.txt"
    echo "[baselines done at +$(( $(date +%s) - t0 ))s]"
  else
    status+=("gpu_bench: not carried (run \`cargo xtask bench gpu\` here first)")
  fi
fi

if [ "$BENCHES" != none ] && [ "$BENCHES" != all ] && [ "$BENCHES" != rust ]; then
  echo "== ceilings"
  timeout 120 python3 kernels/bench/h200/bench.py "$BIN" > "$OUT/ceilings.txt" 2>&1
  rc=$?; status+=("ceilings: rc=$rc $(tail -1 "$OUT/ceilings.txt")")
  tail -1 "$OUT/ceilings.txt"
fi

for script in kernels/bench/h200/bench_*.py; do
  name=$(basename "$script" .py); name=${name#bench_}
  wanted_bench "$name" || continue
  echo "== bench $name"
  timeout 200 python3 "$script" "$BIN" ${BENCH_ARGS:-} > "$OUT/bench_$name.txt" 2>&1
  rc=$?; status+=("bench $name: rc=$rc")
  # the short table each script prints last
  tail -n 30 "$OUT/bench_$name.txt"
  echo "[bench $name done at +$(( $(date +%s) - t0 ))s]"
done

# The sanitizers last: the slowest and, once clean, the least likely to change what the next step is.
# SAN_TESTS (default: TESTS) picks the binaries; SAN_BUDGET (seconds since the start, default none) stops starting
# new sanitizer runs once passed, so one call can fit the device tool's 10-minute limit.
# SAN_PARALLEL=1 runs every sanitizer pass at once (each its own process and context on the one GPU; the
# instrumentation, not the GPU, is the bottleneck), each bounded by SAN_TIMEOUT.
if [ $SANITIZE = 1 ] && [ "${SAN_PARALLEL:-0}" = 1 ]; then
  pids=()
  for exe in "$BIN"/gpu_*; do
    name=$(basename "$exe")
    [ "$name" = gpu_bench ] && continue
    wanted "${SAN_TESTS:-$TESTS}" "$name" || continue
    for tool in memcheck racecheck; do
      ( timeout "${SAN_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --error-exitcode 99 "$exe" --test-threads=1 \
          ${SAN_ARGS:-} > "$OUT/sanitizer_${name}_$tool.txt" 2>&1
        echo "$tool $name: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${name}_$tool.txt" | tail -1)" \
          > "$OUT/sanitizer_${name}_$tool.status" ) &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  for f in "$OUT"/sanitizer_*.status; do status+=("$(cat "$f")"); rm -f "$f"; done
  SANITIZE=0
fi
if [ $SANITIZE = 1 ]; then
  for exe in "$BIN"/gpu_*; do
    name=$(basename "$exe")
    [ "$name" = gpu_bench ] && continue
    wanted "${SAN_TESTS:-$TESTS}" "$name" || continue
    for tool in memcheck racecheck; do
      if [ -n "${SAN_BUDGET:-}" ] && [ $(( $(date +%s) - t0 )) -ge "$SAN_BUDGET" ]; then
        status+=("$tool $name: not run (SAN_BUDGET ${SAN_BUDGET}s spent)"); continue
      fi
      timeout "${SAN_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --error-exitcode 99 "$exe" --test-threads=1 ${SAN_ARGS:-} \
        > "$OUT/sanitizer_${name}_$tool.txt" 2>&1
      rc=$?; status+=("$tool $name: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_${name}_$tool.txt" | tail -1)")
    done
  done
fi

echo "== status (+$(( $(date +%s) - t0 ))s)"
printf '%s\n' "${status[@]}"
