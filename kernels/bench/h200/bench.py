"""The shared half of the H200 benchmarks (kernels/bench/h200/bench_*.py import it as `b`), and, run on its own,
the ceilings every benchmark's "fraction of the ceiling" refers to.

Library: `kern` loads a module of the PTX the crate embeds (with cupy.RawModule) and returns a kernel; `launch`
launches on torch's current stream (so a torch CUDA-graph capture records it); `time_arms` times several arms the
same way (each captured in a CUDA graph of R launches rotating over enough input sets to exceed the 60 MB L2,
warmed up, replayed; the arms alternate over 11 rounds; median and spread (max - min over median) per arm);
`n_sets` sizes the rotation; `row` records and prints one result line; `log` writes to $OUT/bench_log.txt and
stdout; `allow_smem` raises a kernel's dynamic shared-memory limit.

Ceilings (`python3 kernels/bench/h200/bench.py CARRY_DIR`, what run_session.sh runs first): device-to-device copy
bandwidth (bytes read + written, 256 MiB and 1 GiB float32, the better of the two), cuBLAS bf16 (`torch.matmul`)
and FP8 (`torch._scaled_mm`, per-tensor scales) at 8192^3; written to $OUT/ceilings.json.
"""

import ctypes
import json
import math
import os
import statistics
import sys
import time
import warnings

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

from cuda_graph import capture

PTX = sys.argv[1]
QUICK = "--quick" in sys.argv
OUT = os.environ.get("OUT", ".")
dev = torch.device("cuda")
warnings.filterwarnings("ignore", category=DeprecationWarning)  # cupy's ExternalStream; still the way that works
torch.manual_seed(0)

mods = {}


def kern(mod, name):
    # Modules load on first use, so a run of one section JIT-compiles only its own PTX.
    if mod not in mods:
        mods[mod] = cp.RawModule(path=os.path.join(PTX, mod + ".ptx"))
    return mods[mod].get_function(name)


def ptr(t):
    return np.uint64(t.data_ptr())


def launch(fn, grid, block, args, shared_mem=0):
    # Launch on torch's current stream, so that a torch graph capture records the kernel too.
    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        fn(grid, block, args, shared_mem=shared_mem)


# Programmatic dependent launch (PDL): cupy cannot set launch attributes, so launch_pdl calls the driver's
# cuLaunchKernelEx through ctypes with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6) = 1, on torch's
# current stream (a graph capture records the programmatic edge). The kernel's side: common.cuh's pdl_* helpers.
class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("val", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttr)), ("nattrs", ctypes.c_uint)]


_libcuda = None
_CTYPE = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
          np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
          np.dtype(np.float32): ctypes.c_float}


def launch_pdl(fn, grid, block, args, shared_mem=0):
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    attr = _LaunchAttr()
    attr.id = 6
    attr.val[0] = 1
    cfg = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem,
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.pointer(attr), 1)
    vals = [_CTYPE[np.asarray(a).dtype](a.item() if hasattr(a, "item") else a) for a in args]
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
    # cupy's RawModule.get_function gives a RawKernel; its `kernel` is the loaded Function, whose ptr is the
    # CUfunction (RawKernel has no ptr of its own).
    func = fn.ptr if hasattr(fn, "ptr") else fn.kernel.ptr
    rc = _libcuda.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(func), params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed: CUresult {rc}")


ROWS = []
# One log per script (bench_ops.py -> $OUT/bench_ops_log.txt), so the scripts of one run do not overwrite each other.
LOG = open(os.path.join(OUT, os.path.splitext(os.path.basename(sys.argv[0]))[0] + "_log.txt"), "w")


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.write(s + "\n")
    LOG.flush()


def graph_of(call, sets, reps):
    """Captures `reps` calls rotating over `sets` input sets; returns (graph, launches)."""
    for i in range(sets):  # warm-up: module load, autotune, allocator
        call(i)
    torch.cuda.synchronize()
    return capture(call, sets, reps)


def time_arms(arms, sets, reps, rounds=None):
    """arms: {name: call(i)}. Returns {name: (median seconds per launch, spread)} with the arms alternating."""
    rounds = rounds or (5 if QUICK else 11)
    graphs = {}
    for name, call in arms.items():
        try:
            graphs[name] = ("graph", graph_of(call, sets, reps))
        except Exception as e:  # noqa: BLE001 - a baseline that cannot be captured is timed eagerly
            log(f"  note: {name} not capturable in a graph ({type(e).__name__}: {e}); timed eagerly")
            torch.cuda.synchronize()
            graphs[name] = ("eager", call)
    samples = {name: [] for name in arms}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for name, (kind, obj) in graphs.items():
            e0.record()
            if kind == "graph":
                obj.replay()
            else:
                for r in range(reps):
                    obj(r % sets)
            e1.record()
            torch.cuda.synchronize()
            samples[name].append(e0.elapsed_time(e1) * 1e-3 / reps)
    res = {}
    for name, v in samples.items():
        med = statistics.median(v)
        res[name] = (med, (max(v) - min(v)) / med)
    return res


def n_sets(bytes_per_set, floor=2):
    return max(floor, min(64, math.ceil(240e6 / max(bytes_per_set, 1))))


def row(kernel, shape, ours, base_name, base, bytes_moved=None, flops=None, ceiling=None, target=None, note=""):
    t, sp = ours
    bt, bsp = base if base else (float("nan"), float("nan"))
    r = {
        "kernel": kernel,
        "shape": shape,
        "ours_us": t * 1e6,
        "ours_spread": sp,
        "baseline": base_name,
        "base_us": bt * 1e6,
        "base_spread": bsp,
        "speedup": bt / t if base else float("nan"),
    }
    if bytes_moved is not None:
        r["GB/s"] = bytes_moved / t / 1e9
        r["frac_copy"] = bytes_moved / t / (ceiling or float("nan"))
    if flops is not None:
        r["TFLOP/s"] = flops / t / 1e12
    r["target"] = target or ""
    r["note"] = note
    ROWS.append(r)
    log(
        f"{kernel:14s} {shape:28s} ours {t*1e6:9.2f} us (±{sp*100:4.1f}%)  {base_name:22s} {bt*1e6:9.2f} us"
        f"  speedup {r['speedup']:6.3f}"
        + (f"  {r['GB/s']:7.0f} GB/s = {r['frac_copy']*100:5.1f}% copy" if bytes_moved is not None else "")
        + (f"  {r['TFLOP/s']:7.1f} TFLOP/s" if flops is not None else "")
        + (f"  [{note}]" if note else "")
    )
    return r


# Dynamic shared memory of the mma.sync prefill GEMMs (cuda/gemm.cu), for the benchmarks that time them as arms.
GEMM_SMEM = 133120  # GM_SMEM_BYTES: 4 stages of two 128x128 e4m3 tiles + 128 scales
NVFP4_GEMM_SMEM = 118784  # cuda/gemm.cu NG_SMEM_BYTES


def allow_smem(fn, nbytes):
    """Lets `fn` launch with `nbytes` of dynamic shared memory (over the default 48 KiB): cupy's kernel attribute
    (what worked on the H200 with cupy 14.2, whose RawModule functions are RawKernels without `.ptr`), else the
    driver call (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8)."""
    try:
        fn.max_dynamic_shared_size_bytes = nbytes
    except Exception as e:  # noqa: BLE001
        log(f"  note: cupy's max_dynamic_shared_size_bytes failed ({e}); trying funcSetAttribute")
        cp.cuda.driver.funcSetAttribute(fn.ptr, 8, nbytes)


def copy_bandwidth(nbytes=1 << 28):
    """Bytes read + written per second by torch's device copy of `nbytes` of float32, logged."""
    a = torch.randn(nbytes // 4, device=dev)
    c = torch.empty_like(a)
    res = time_arms({"copy": lambda i: c.copy_(a)}, 1, 10)
    bw = 2 * nbytes / res["copy"][0]
    log(f"copy {nbytes >> 20} MiB float32: {bw / 1e12:.3f} TB/s (read+write)")
    del a, c
    return bw


# Ceilings, measured in this run.
def ceilings():
    # float32 buffers of 256 MiB and 1 GiB, the better of the two: a 1 GiB uint8 copy_ measured only 2.7 TB/s
    # in an earlier run (torch's byte copy path) where 256 MiB reached 4.2 TB/s.
    copy_bw = max(copy_bandwidth(1 << 28), copy_bandwidth(1 << 30))
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    res = time_arms({"bf16": lambda i: x @ y}, 1, 10)
    bf16 = 2 * m**3 / res["bf16"][0]
    x8 = x.to(torch.float8_e4m3fn)
    y8 = y.to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    res = time_arms(
        {"fp8": lambda i: torch._scaled_mm(x8, y8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)}, 1, 10
    )
    fp8 = 2 * m**3 / res["fp8"][0]
    log(f"ceilings: copy {copy_bw/1e12:.3f} TB/s (read+write), cuBLAS bf16 {bf16/1e12:.0f} TFLOP/s, "
        f"cuBLAS FP8 {fp8/1e12:.0f} TFLOP/s (8192^3)")
    del x, y, x8, y8
    torch.cuda.empty_cache()
    return copy_bw, bf16, fp8


def main():
    props = torch.cuda.get_device_properties(0)
    log(f"device: {props.name}, {props.multi_processor_count} SMs, {props.total_memory/2**30:.0f} GiB, "
        f"torch {torch.__version__}, cupy {cp.__version__}")
    copy_bw, bf16, fp8 = ceilings()
    with open(os.path.join(OUT, "ceilings.json"), "w") as fh:
        json.dump({"device": props.name, "copy_GBps": copy_bw / 1e9, "cublas_bf16_TFLOPs": bf16 / 1e12,
                   "cublas_fp8_TFLOPs": fp8 / 1e12}, fh, indent=1)
    print(f"H200 ceilings: copy {copy_bw/1e12:.3f} TB/s (read + write), cuBLAS bf16 {bf16/1e12:.0f} TFLOP/s, "
          f"cuBLAS FP8 {fp8/1e12:.0f} TFLOP/s (8192^3)")


if __name__ == "__main__":
    main()
