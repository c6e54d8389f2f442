#!/usr/bin/env bash
# Build another version of kernels/cuda/gdn_prefill.cu exactly as kernels/build_cuda.rs does
# (PTX for compute_90, then ptxas to the sm_90 cubin the crate loads), into target-carry/alt/TAG/, so that one H200
# call can time it against the crate's build in the same rounds (bench_gdn_prefill.py's GDN_PREFILL_ALT).
# Usage (here, after `run_session.sh prepare`, which recreates target-carry):
#   kernels/bench/h200/build_alt.sh TAG [SOURCE.cu]     (default SOURCE: the working tree's cuda/gdn_prefill.cu)
#   kernels/bench/h200/build_alt.sh TAG git:REV         (cuda/gdn_prefill.cu as committed at REV)
# On the device: GDN_PREFILL_ALT="TAG=target-carry/alt/TAG;..." python3 kernels/bench/h200/bench_gdn_prefill.py ..
set -euo pipefail
cd "$(dirname "$0")/../../.."
tag=$1
src=${2:-kernels/cuda/gdn_prefill.cu}
stem=gdn_prefill  # the module name the bench loads, whatever the source file is called
out=target-carry/alt/$tag
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ $src == git:* ]]; then  # the file and its headers as committed
  git archive "${src#git:}" kernels/cuda | tar -x -C "$work" --strip-components=2
else
  cp kernels/cuda/*.cuh "$work/"
  cp "$src" "$work/$stem.cu"
fi
nvcc -ptx -arch=compute_90 -O3 -std=c++17 -lineinfo --Werror all-warnings -I"$work" -o "$out/$stem.ptx" "$work/$stem.cu"
"$(dirname "$(command -v nvcc)")/ptxas" -arch=sm_90 -O3 --generate-line-info -v -o "$out/$stem.sm_90.cubin" \
  "$out/$stem.ptx" > "$out/$stem.ptxas.txt" 2>&1
rm "$out/$stem.ptx"
ls -la "$out"
