#!/usr/bin/env bash
# One H200 call for work on the GDN chunked prefill (kernels/cuda/gdn_prefill.cu), an earlier H200 run: the
# gpu_gdn_prefill tests, the bench at T = 4096 and the ragged B = 4 x 9216 case (--quick), memcheck and racecheck
# on the ragged-batch test, memcheck over every test of the binary (env GDN_PREFILL_CASES: other cases, as
# bench_gdn_prefill.py reads it), then a short table: the stage and whole-step
# rows, the sanitizers' summaries, the worst split and default errors against the f64 recurrence. Results are
# packed into $OUT/run1.tgz (tests, bench, ragged sanitizers) and $OUT/run.tgz (the rest) next to rs.txt (the
# device tool returns few files).
# Here first: kernels/bench/h200/run_session.sh prepare gpu_gdn_prefill (and the fla wheels in .whl, see
# benchmarks/h200.md, Reproduce); on the device (carry: ["target-carry", ".whl"]):
#   bash kernels/bench/h200/gdn_prefill_call.sh
# Other builds timed in the same rounds: kernels/bench/h200/build_alt.sh TAG .. here, then on the device
#   GDN_PREFILL_ALT="TAG=target-carry/alt/TAG[@variant];.." [GDN_PREFILL_LEAN=1] bash kernels/bench/h200/gdn_prefill_call.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/edgefit-h200}
mkdir -p "$OUT"
GDN_PREFILL_CASES="${GDN_PREFILL_CASES:-4096;1000,3000,1120,4096}" BENCH_ARGS=--quick SAN_ARGS=ragged SAN_TIMEOUT=120 \
    bash kernels/bench/h200/run_session.sh gpu_gdn_prefill gdn_prefill > "$OUT/rs.txt" 2>&1
# The tests', bench's and sanitizers' logs packed now (run1.tgz), so that a call cut later (ran out of
# device time in the full memcheck below and lost them: the tool returns 8 files) still returns them.
# The summary below reads them from $LOGS.
LOGS=$(mktemp -d)
(cd "$OUT" && tar czf /tmp/o1.tgz --exclude='./rs*.txt' . && find . -type f ! -name 'rs*.txt' -exec mv {} "$LOGS/" \; \
    && mv /tmp/o1.tgz run1.tgz)
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 99 /tmp/edgefit-carry/gpu_gdn_prefill --test-threads=1 \
    > "$OUT/memcheck_full.txt" 2>&1
echo "memcheck full rc=$?" >> "$OUT/rs.txt"
tail -3 "$OUT/memcheck_full.txt" >> "$OUT/rs.txt"
grep -E "(T=[0-9]+|B=[0-9]+ N=[0-9]+) (wy_|walk|out_|prep )|^gdn_prefill +(T=|B=).*fla chunk|^gdn_prefill_alt" \
    "$LOGS/bench_gdn_prefill.txt" | cut -c1-120
grep -E "status|rc=|ERROR|RACECHECK|memcheck full" "$OUT/rs.txt" | tail -12
# worst scaled output errors of the split (three largest) and of the default
grep -E "_bf16_cs64.*vs recurrence" "$LOGS/tests_gpu_gdn_prefill.txt" | awk '{print $NF, $0}' | sort -g | tail -3 | cut -c1-160
grep -E "x3_tf32_cs64.*vs recurrence" "$LOGS/tests_gpu_gdn_prefill.txt" | awk '{print $NF}' | sort -g | tail -1
# worst scaled output errors of each split, by variant
for v in wytf32x3_bf16_cs64 wytf32_bf16_cs64 wyf16_bf16_cs64; do
  echo "$v worst output $(grep -E "variant=$v .*output vs recurrence" "$LOGS/tests_gpu_gdn_prefill.txt" | awk '{print $NF}' | sort -g | tail -1)" \
    "state $(grep -E "variant=$v .*state vs recurrence" "$LOGS/tests_gpu_gdn_prefill.txt" | awk '{print $NF}' | sort -g | tail -1)"
done
# GDN_PREFILL_NCU="regex": Nsight Compute on the f16 split's launches whose names match, warm (the
# second of profile_gdn_prefill.py's three steps; N_PER_STEP: how many of a step's four launches match), then its
# details page, the SASS source page and ncu_segments.py's barrier-to-barrier summary.
if [ -n "${GDN_PREFILL_NCU:-}" ]; then
  n=${N_PER_STEP:-3}
  PYTHONPATH=/tmp/site GDN_PROFILE_VARIANT=wyf16_bf16_cs64 timeout 300 ncu --clock-control none --set full \
      --import-source no -k regex:"$GDN_PREFILL_NCU" --launch-skip "$n" --launch-count "$n" -o "$OUT/gdn" -f \
      python3 kernels/bench/h200/profile_gdn_prefill.py /tmp/edgefit-carry > "$OUT/ncu_log.txt" 2>&1
  ncu --import "$OUT/gdn.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
  ncu --import "$OUT/gdn.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/ncu_source.csv.gz"
  python3 kernels/bench/h200/ncu_segments.py "$OUT/ncu_source.csv.gz" > "$OUT/ncu_segments.txt" 2>&1
  grep -E "^  gdn_prefill|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Eligible Warps|Issued Warp" \
      "$OUT/ncu_details.txt" | head -60
fi
cd "$OUT" && tar czf /tmp/o.tgz --exclude='./run1.tgz' . && find . -type f ! -name 'rs*.txt' ! -name run1.tgz -delete \
    && mv /tmp/o.tgz run.tgz
