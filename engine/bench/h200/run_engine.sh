#!/usr/bin/env bash
# One device call for the CUDA engine: the engine's GPU parity and batching tests, the new GPU ops' tests,
# compute-sanitizer memcheck over the parity run, then the speed runs on random-weight checkpoints with the real
# Qwen3.8-27B geometry (FP8 block and modelopt NVFP4, written on the device by the random_checkpoint example, never
# committed), each beside the planner's prediction and the device's copy bandwidth measured in the same run.
# It builds nothing on the device: `prepare` (here) builds the release binaries with the `cuda` feature and packs
# them into target-carry-engine/carry.tar.xz, which the device tool carries (`carry: ["target-carry-engine"]`).
#
# Usage (here):    engine/bench/h200/run_engine.sh prepare
# Usage (device):  bash engine/bench/h200/run_engine.sh [STAGES]   (comma-separated: tests,sanitizer,bench,offload,
#                  prefill,serve,ncu,nsys,trace,baseline; default tests,sanitizer,bench). baseline needs
#                  `carry: [".whl"]` (transformers 5.25, flash-linear-attention; see engine/bench/h200/hf_baseline.py).
#                  Env: GEN (decode steps, default 64), MODELS (fp8,nvfp4), TESTS (test binaries), ARMS (graphs
#                  launches old nopdl nofused neither nosplit nostack norows), PREFILL_ARMS (flash slots tiles
#                  blocking old cN), BATCHES, SERVE_ARMS (plain invariant), SERVE_S, TRACE_BATCH (sequences in the
#                  traced steps, default 1); EDGEFIT_SMALL_PDL=0 / EDGEFIT_FUSED_CASTS=0 in the environment turn the
#                  small kernels' programmatic launches / the fused bf16 inputs off for every stage (the tests too).
# Logs: $OUT/engine_*.txt; a table last. The device tool brings back only so many files from $OUT: with several stages
# in one call, give each its own OUT and print what matters to stdout too.
set -uo pipefail
cd "$(dirname "$0")/../../.."
CARRY=target-carry-engine

if [ "${1:-}" = prepare ]; then
  set -e
  NVCC=${NVCC:-$(ls "$PWD"/.venv-cuda/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -1)}
  export NVCC
  trap '[ $? -ne 0 ] && tail -40 /tmp/edgefit-engine-prepare.err' EXIT
  cargo build --release -p engine --features cuda --bin edgefit --example random_checkpoint \
    2>/tmp/edgefit-engine-prepare.err
  # The load generator only speaks HTTP to an `edgefit serve` child: built without the embedded kernels (40 MB less).
  cargo build --release -p engine --example serve_load 2>>/tmp/edgefit-engine-prepare.err
  { cargo test --release -p engine --features cuda --test parity --test batching --test offload --test flash_prefill --test fast_paths --no-run --message-format=json
    cargo test --release -p kernels --features cuda --test gpu_engine_ops --test gpu_gdn_slots --test gpu_ops --test gpu_memory \
      --test backend --no-run --message-format=json
    # The attention and DeltaNet kernels' own tests compare every built variant, so they build with `lab`.
    cargo test --release -p kernels --features cuda,lab --test gpu_attention_prefill --test gpu_attention_decode \
      --test gpu_gdn_decode --test gpu_gdn_prefill --no-run --message-format=json
  } 2>>/tmp/edgefit-engine-prepare.err | python3 -c "import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['kind'] == ['test']:
        print(m['target']['name'], m['executable'])" > /tmp/edgefit-engine-bins.txt
  stage=$(mktemp -d)
  while read -r name exe; do cp "$exe" "$stage/test_$name"; done < /tmp/edgefit-engine-bins.txt
  cp target/release/edgefit target/release/examples/random_checkpoint target/release/examples/serve_load "$stage/"
  # The `trace` stage's GPU timeline (the machine has no Nsight Systems): CUPTI 13.0 from PyPI and the injection
  # library that records through it (engine/bench/h200/cupti_trace.c).
  # Kept under target/ after the first download.
  cupti=target/cupti-13.0.85
  if [ ! -f "$cupti/nvidia/cu13/lib/libcupti.so.13" ]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps 'nvidia-cuda-cupti==13.0.85' -d "$cupti"
    unzip -q -o "$cupti"/*.whl 'nvidia/cu13/include/*' 'nvidia/cu13/lib/libcupti.so.13' -d "$cupti"
  fi
  cc -shared -fPIC -O2 -Wall -Wextra -Werror -I"$cupti/nvidia/cu13/include" -I"$(dirname "$NVCC")/../include" \
    engine/bench/h200/cupti_trace.c -L"$cupti/nvidia/cu13/lib" -l:libcupti.so.13 -o "$stage/libedgefit_cupti.so"
  cp "$cupti/nvidia/cu13/lib/libcupti.so.13" "$stage/"
  strip "$stage"/*
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  # xz with a dictionary larger than one binary: they embed the same PTX and cubins, so each after the first
  # packs to little (about 16x smaller than gzip).
  tar -C "$stage" -cf - . | xz -T2 -9 --lzma2=dict=256MiB > "$CARRY/carry.tar.xz"
  rm -rf "$stage"
  ls -la "$CARRY"
  exit 0
fi

OUT=${OUT:-/tmp/edgefit-engine}
mkdir -p "$OUT"
STAGES=${1:-tests,sanitizer,bench}
GEN=${GEN:-64}
MODELS=${MODELS:-fp8,nvfp4}
BIN=/tmp/edgefit-engine-bin
rm -rf "$BIN" && mkdir -p "$BIN" && tar -C "$BIN" -xf "$CARRY/carry.tar.xz"
# An earlier build's edgefit, for a same-run baseline arm (`ARMS=... old ...`; carry: ["target-carry-old"]).
if [ -f target-carry-old/edgefit.xz ]; then
  xz -dc target-carry-old/edgefit.xz > "$BIN/edgefit-old" && chmod +x "$BIN/edgefit-old"
fi
export EDGEFIT_FIXTURES=$PWD/engine/tests/fixtures
status=()
want() { [[ ",$STAGES," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$OUT/engine_env.txt"

if want tests; then
  for t in ${TESTS:-parity batching offload flash_prefill fast_paths gpu_engine_ops gpu_gdn_slots gpu_ops gpu_memory backend}; do
    timeout 300 "$BIN/test_$t" --test-threads=1 --nocapture > "$OUT/engine_tests_$t.txt" 2>&1
    rc=$?; status+=("tests $t: rc=$rc $(grep -E '^test result' "$OUT/engine_tests_$t.txt" | tail -1)")
  done
  grep -A12 '^Cuda:' "$OUT/engine_tests_parity.txt"
fi

if want sanitizer; then
  # ENGINE_SAN: the engine test binaries under memcheck (default: parity's CUDA tests, then offload).
  for spec in ${ENGINE_SAN:-parity:cuda_ offload}; do
    b=${spec%%:*}; filt=""; [ "$b" != "$spec" ] && filt=${spec#*:}
    timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_$b" $filt --test-threads=1 \
      > "$OUT/engine_memcheck_$b.txt" 2>&1
    rc=$?; status+=("memcheck $spec: rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/engine_memcheck_$b.txt" | tail -1)")
  done
  # SAN_BINS: test binaries (`name` or `name:filter`) under memcheck and racecheck.
  for spec in ${SAN_BINS:-gpu_gdn_slots}; do
    b=${spec%%:*}; filt=""; [ "$b" != "$spec" ] && filt=${spec#*:}
    for tool in memcheck racecheck; do
      timeout "${SAN_TIMEOUT:-200}" compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/test_$b" $filt --test-threads=1 \
        > "$OUT/engine_${tool}_$b.txt" 2>&1
      rc=$?; status+=("$tool $spec: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/engine_${tool}_$b.txt" | tail -1)")
    done
  done
fi

if want bench; then
  for m in ${MODELS//,/ }; do
    dir=/tmp/q27-$m
    [ -f "$dir/model.safetensors" ] || "$BIN/random_checkpoint" "models/qwen3.8-27b-$m" "$dir" 2>&1 | tail -2
    # Decode steps as CUDA graphs (the default) and launch by launch (EDGEFIT_CUDA_GRAPHS=0), interleaved.
    for arm in ${ARMS:-graphs launches graphs}; do
      for b in ${BATCHES:-1 8}; do
        [ $arm = launches ] && g=0 || g=1
        # Baseline arms of this build: nopdl (the decode step's small kernels launched plainly, EDGEFIT_SMALL_PDL=0),
        # nofused (a cast launch before each tile GEMV, EDGEFIT_FUSED_CASTS=0), neither, nosplit (decode attention on
        # one block per (token, head), EDGEFIT_SPLIT_ATTENTION=0), nostack (q/k/v and gate/up apart, EDGEFIT_STACK=0).
        # norows (short NVFP4 matrices on their tiles instead of exact f32 rows, EDGEFIT_NVFP4_F32_ROWS=0).
        pdl=1; fused=1; split=1; stack=1; rows=1
        case $arm in nopdl) pdl=0 ;; nofused) fused=0 ;; neither) pdl=0; fused=0 ;; nosplit) split=0 ;;
          nostack) stack=0 ;; norows) rows=0 ;; esac
        exe="$BIN/edgefit"; [ $arm = old ] && exe="$BIN/edgefit-old"
        f="$OUT/engine_bench_${m}_b${b}_$arm.txt"
        EDGEFIT_SMALL_PDL=$pdl EDGEFIT_FUSED_CASTS=$fused EDGEFIT_SPLIT_ATTENTION=$split EDGEFIT_STACK=$stack \
          EDGEFIT_NVFP4_F32_ROWS=$rows EDGEFIT_CUDA_GRAPHS=$g timeout 300 "$exe" bench --device cuda --model "$dir" --batch $b \
          --prompt-len "${PROMPT:-512}" --gen "$GEN" > "$f.tmp" 2>&1
        rc=$?; status+=("bench $m b$b $arm: rc=$rc $(grep -E 'tg[0-9]|roofline' "$f.tmp" | tr '\n' ' ')")
        cat "$f.tmp" >> "$f"; rm -f "$f.tmp"
      done
    done
  done
fi

# Streaming: the FP8 27B on the H200 capped to the laptop's 22.58 GiB (the planner chooses what to offload), with a
# timeline of the copies and layers, then the seed's sweep of pinned offload amounts under the same cap.
if want offload; then
  m=fp8; dir=/tmp/q27-$m
  [ -f "$dir/model.safetensors" ] || "$BIN/random_checkpoint" "models/qwen3.8-27b-$m" "$dir" 2>&1 | tail -2
  # (10 GiB pinned does not fit under the cap once edgefit keeps the MTP head and its caches: the planner refuses it.)
  for gib in ${OFFLOAD_GIB:-auto 12 14 16 18}; do
    f="$OUT/engine_offload_${m}_$gib.txt"
    extra=(); [ "$gib" = auto ] && extra=(--timeline "$OUT/engine_timeline_$m.json") || extra=(--offload-gib "$gib")
    timeout 300 "$BIN/edgefit" bench --device cuda --model "$dir" --cap-gpu-memory 22.58GiB --batch 1 \
      --prompt-len 32 --gen "${OFFLOAD_GEN:-16}" "${extra[@]}" > "$f" 2>&1
    rc=$?; status+=("offload $m $gib GiB: rc=$rc $(grep -E 'tg[0-9]|streams|timeline' "$f" | tr '\n' ' ')")
  done
fi

# Prefill at 512 and 4096 tokens, interleaved by arm (PREFILL_ARMS): flash (the default: the tensor-core GEMMs on
# the checkpoint-layout copy, prompt attention through the flash prefill kernels), slots (the same with prompt
# attention on the exact path's f32 slot kernel, EDGEFIT_FLASH_PREFILL=0), tiles (the tile GEMVs,
# EDGEFIT_PREFILL_GEMM=0), blocking (flash with CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel, so the
# engine's per-op profile then holds each op family's device time plus its host time, serialized), old (flash on
# the earlier build of target-carry-old), cN (flash in prompt chunks of N tokens, EDGEFIT_PREFILL_CHUNK, instead
# of the plan's chunk; c512 is the engine's default).
if want prefill; then
  for m in ${MODELS//,/ }; do
    dir=/tmp/q27-$m
    [ -f "$dir/model.safetensors" ] || "$BIN/random_checkpoint" "models/qwen3.8-27b-$m" "$dir" 2>&1 | tail -2
    for arm in ${PREFILL_ARMS:-flash slots tiles}; do
      for p in ${PROMPTS:-512 4096}; do
        [ $arm = tiles ] && g=0 || g=1
        [ $arm = slots ] && fl=0 || fl=1
        [ $arm = blocking ] && bl=1 || bl=0
        # cN: flash with prompts run in chunks of N tokens (EDGEFIT_PREFILL_CHUNK); every other arm: the plan's.
        chunk=(); [[ $arm =~ ^c([0-9]+)$ ]] && chunk=(EDGEFIT_PREFILL_CHUNK=${BASH_REMATCH[1]})
        exe="$BIN/edgefit"; [ $arm = old ] && exe="$BIN/edgefit-old"
        f="$OUT/engine_prefill_${m}_${arm}_$p.txt"
        env "${chunk[@]}" CUDA_LAUNCH_BLOCKING=$bl EDGEFIT_FLASH_PREFILL=$fl EDGEFIT_PREFILL_GEMM=$g timeout 300 "$exe" bench --device cuda --model "$dir" --batch 1 \
          --prompt-len $p --gen 4 --max-model-len 8192 > "$f" 2>&1
        rc=$?; status+=("prefill $m $arm pp$p: rc=$rc $(grep -E ' pp[0-9]|^prompt chunk' "$f" | tr '\n' ' ')")
      done
    done
  done
fi

# The server under load on the 27B geometry: 64 streaming clients, some hanging up, against single-request greedy.
if want serve; then
  m=${MODELS%%,*}; dir=/tmp/q27-$m
  [ -f "$dir/model.safetensors" ] || "$BIN/random_checkpoint" "models/qwen3.8-27b-$m" "$dir" 2>&1 | tail -2
  # SERVE_ARMS: `plain` (the default server) and/or `invariant` (--batch-invariant: streams must match their
  # single-request text).
  for arm in ${SERVE_ARMS:-plain}; do
    extra=(); [ "$arm" = invariant ] && extra=(--batch-invariant)
    timeout 400 "$BIN/serve_load" --edgefit "$BIN/edgefit" --device cuda --profile h200 --model "$dir" \
      --clients 64 --duration-s "${SERVE_S:-60}" --warmup-s 10 --max-num-seqs 16 --max-model-len 1024 \
      --max-tokens 48 "${extra[@]}" > "$OUT/engine_serve_${m}_$arm.txt" 2>&1
    rc=$?; status+=("serve load $m $arm: rc=$rc"); tail -16 "$OUT/engine_serve_${m}_$arm.txt"
  done
fi

if want baseline; then
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site
  fi
  PYTHONUNBUFFERED=1 timeout 500 python3 engine/bench/h200/hf_baseline.py models/qwen3.8-27b-fp8 --batch 1,8 \
    --prompt-len 512 --gen 32 > "$OUT/engine_baseline.txt" 2>&1
  rc=$?; status+=("baseline transformers bf16: rc=$rc"); grep '^{' "$OUT/engine_baseline.txt"; tail -3 "$OUT/engine_baseline.txt"
fi

if want ncu; then
  # GPU time per kernel over a window of about one decode step (launch by launch: the first launches, the prompt's
  # and the first decode step's, are skipped), summed by kernel name, for each model.
  for m in ${MODELS//,/ }; do
    [ -f "/tmp/q27-$m/model.safetensors" ] || "$BIN/random_checkpoint" "models/qwen3.8-27b-$m" "/tmp/q27-$m" | tail -1
    # NCU_REAL=1: the card's own clocks and warm caches (`--clock-control none --cache-control none`), so each
    # kernel's time is what it costs in the step (launch by launch, still without the overlap PDL gives).
    real=(); [ "${NCU_REAL:-0}" = 1 ] && real=(--clock-control none --cache-control none)
    EDGEFIT_CUDA_GRAPHS=0 timeout 400 ncu "${real[@]}" --metrics gpu__time_duration.sum --csv --print-units base \
      --launch-skip "${NCU_SKIP:-2600}" --launch-count "${NCU_COUNT:-1100}" \
      "$BIN/edgefit" bench --device cuda --model /tmp/q27-$m --batch 1 --prompt-len 8 --gen "${NCU_GEN:-5}" > "$OUT/engine_ncu_$m.csv" 2>/dev/null
    rc=$?; status+=("ncu $m: rc=$rc")
    python3 - "$OUT/engine_ncu_$m.csv" <<'PY' | tee "$OUT/engine_ncu_summary_$m.txt"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; ki, vi = hdr.index("Kernel Name"), hdr.index("Metric Value")
t = collections.defaultdict(float); n = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    name = r[ki].split("(")[0]; t[name] += v; n[name] += 1
tot = sum(t.values())
print(f"{sys.argv[1]}: {len(rows)-1} kernels ({sum(n.values())} timed), {tot/1e6:.2f} ms GPU time in all")
for k, v in sorted(t.items(), key=lambda x: -x[1])[:40]:
    print(f"{v/1e6:9.3f} ms {100*v/tot:5.1f}% {n[k]:6d} calls {v/n[k]/1e3:8.2f} us/call  {k}")
PY
  done
fi

# A GPU timeline (what `nsys -t cuda` records, through CUPTI: the machine has no Nsight Systems) of a short bench
# run per model: every step's GPU span, busy time and idle gaps, the median decode step's and the prompt's time by
# kernel, and that decode step kernel by kernel (engine_trace_step_*.tsv). TRACE_PROMPTS: prompt lengths.
if want trace; then
  for m in ${MODELS//,/ }; do
    dir=/tmp/q27-$m
    [ -f "$dir/model.safetensors" ] || "$BIN/random_checkpoint" "models/qwen3.8-27b-$m" "$dir" 2>&1 | tail -2
    for p in ${TRACE_PROMPTS:-512}; do
      t="/tmp/engine_trace_${m}_$p.tsv"
      CUDA_INJECTION64_PATH="$BIN/libedgefit_cupti.so" EDGEFIT_CUPTI_TRACE="$t" \
        LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}" timeout 300 "$BIN/edgefit" bench --device cuda --model "$dir" \
        --batch "${TRACE_BATCH:-1}" --prompt-len "$p" --gen "${TRACE_GEN:-8}" --max-model-len 8192 > "$OUT/engine_trace_bench_${m}_$p.txt" 2>&1
      rc=$?; status+=("trace $m pp$p: rc=$rc $(grep -E ' (pp|tg)[0-9]' "$OUT/engine_trace_bench_${m}_$p.txt" | tr '\n' ' ')")
      python3 engine/bench/h200/cupti_timeline.py "$t" --step-out "$OUT/engine_trace_step_${m}_$p.tsv" \
        > "$OUT/engine_trace_summary_${m}_$p.txt" 2>&1
      sed -n '/^decode:/,$p' "$OUT/engine_trace_summary_${m}_$p.txt" | head -60
      rm -f "$t"
    done
  done
fi

if want nsys; then
  m=${MODELS%%,*}
  nsys profile -o "$OUT/engine_decode" --force-overwrite true -t cuda "$BIN/edgefit" bench --device cuda \
    --model /tmp/q27-$m --batch 1 --prompt-len 16 --gen 8 > "$OUT/engine_nsys.txt" 2>&1
  nsys stats -r cuda_gpu_kern_sum "$OUT/engine_decode.nsys-rep" 2>/dev/null | head -40 | tee -a "$OUT/engine_nsys.txt"
  rm -f "$OUT"/engine_decode.nsys-rep "$OUT"/engine_decode.sqlite
fi

echo; echo "== status"
printf '%s\n' "${status[@]}"
