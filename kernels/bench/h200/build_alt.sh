#!/usr/bin/env bash
# Build another version of kernels/cuda/gdn_prefill.cu (or, with ALT_MODULE=gemv, kernels/cuda/gemv.cu) exactly as
# kernels/build_cuda.rs does (PTX for compute_90, then ptxas to the sm_90 cubin the crate loads), into
# target-carry/alt/TAG/, so that one H200 call can time it against the crate's build in the same rounds
# (bench_gdn_prefill.py's GDN_PREFILL_ALT, which loads the cubin; bench_gemv.py's GEMV_ALT, which loads the PTX as
# it loads the crate's, so the PTX is kept for that module).
# Usage (here, after `run_session.sh prepare`, which recreates target-carry):
#   [ALT_MODULE=gemv] kernels/bench/h200/build_alt.sh TAG [SOURCE.cu]  (default SOURCE: the working tree's module)
#   [ALT_MODULE=gemv] kernels/bench/h200/build_alt.sh TAG git:REV      (the module as committed at REV)
# On the device: GDN_PREFILL_ALT="TAG=target-carry/alt/TAG;..." python3 kernels/bench/h200/bench_gdn_prefill.py ..
set -euo pipefail
cd "$(dirname "$0")/../../.."
tag=$1
stem=${ALT_MODULE:-gdn_prefill}  # the module name the bench loads, whatever the source file is called
src=${2:-kernels/cuda/$stem.cu}
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
[ "$stem" = gemv ] || rm "$out/$stem.ptx"
ls -la "$out"
