"""edgefit CUDA kernels on the H200 against the libraries, in one run.

Loads exactly the PTX that `cargo build -p kernels --features cuda` embedded in the crate (copied next to the
carried binaries by run_all.sh) with cupy.RawModule, and times it beside the baselines through torch:
cuBLAS FP8 (`torch._scaled_mm`) and bf16 (`torch.matmul`), SDPA, fla's fused recurrent gated delta rule.

Method (kernels/bench/h200/README in benchmarks/h200.md): every arm is captured in a CUDA graph of R launches
that rotate over enough input sets to exceed the 60 MB L2 several times, warmed up, then replayed; the time per
launch is the median over replays, arms of one case alternate, and the spread (max-min over median) is printed.
Ceilings are measured in the same run: device-to-device copy bandwidth (bytes read + written) and cuBLAS bf16 /
FP8 rates at 8192^3.

Usage: python3 bench.py PTX_DIR [--quick] [--only=SECTION[,SECTION...]]
  sections: gemv, gdn, attention, fp8_gemm, nvfp4_gemm (the prefill GEMMs, kernels/cuda/gemm.cu); default all. With --only
  the ceilings (copy, cuBLAS at 8192^3) are skipped: every section measures its own baselines in the same run.
"""

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

PTX = sys.argv[1]
QUICK = "--quick" in sys.argv
ONLY = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--only=")), None)
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


ROWS = []
LOG = open(os.path.join(OUT, "bench_log.txt"), "w")


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
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        for r in range(reps):
            call(r % sets)
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    return g


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


# ---------------------------------------------------------------------------------------------------------------
# Ceilings, measured in this run.
def ceilings():
    # float32 buffers of 256 MiB and 1 GiB, the better of the two: a 1 GiB uint8 copy_ measured only 2.7 TB/s
    # in an earlier run (torch's byte copy path) where 256 MiB reached 4.2 TB/s.
    copy_bw = 0.0
    for nbytes in (1 << 28, 1 << 30):
        a = torch.randn(nbytes // 4, device=dev)
        b = torch.empty_like(a)
        res = time_arms({"copy": lambda i: b.copy_(a)}, 1, 10)
        bw = 2 * nbytes / res["copy"][0]
        log(f"copy {nbytes >> 20} MiB float32: {bw/1e12:.3f} TB/s (read+write)")
        copy_bw = max(copy_bw, bw)
        del a, b
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


# ---------------------------------------------------------------------------------------------------------------
def gemv_name(prefix, m):
    mt = 1 if m == 1 else 2 if m == 2 else 4 if m <= 4 else 8 if m <= 8 else 16
    return f"{prefix}_m{mt}"


def bench_gemv(copy_bw):
    shapes = [(5120, 17408), (17408, 5120), (5120, 10240), (248320, 5120)]
    ms = [1, 4, 16] if not QUICK else [1]
    one = torch.ones((), device=dev)
    for (n, k) in shapes:
        if QUICK and n == 248320:
            continue
        kb, nb = (k + 127) // 128, (n + 127) // 128
        fp8_bytes = n * k + nb * kb * 4
        sets = n_sets(fp8_bytes)
        w8 = [torch.randn(n, k, device=dev).div_(4).to(torch.float8_e4m3fn) for _ in range(sets)]
        sc = [torch.rand(nb, kb, device=dev) + 0.5 for _ in range(sets)]
        # NVFP4: random bytes are valid e2m1 pairs; scales are e4m3 codes of modest positive values.
        w4 = [torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8) for _ in range(sets)]
        s4 = [(torch.rand(n, k // 16, device=dev) + 0.5).to(torch.float8_e4m3fn).view(torch.uint8) for _ in range(sets)]
        wbf = None
        for m in ms:
            x = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
            y = torch.empty(m, n, device=dev, dtype=torch.float32)
            # The kernels the Rust side calls (kernels/src/cuda/device.rs): M=1 FP8 is the r2u2 variant.
            f8 = kern("gemv", "fp8_block_gemv_m1_r2_u2" if m == 1 else gemv_name("fp8_block_gemv", m))
            # As device.rs: M=1 NVFP4 takes two rows per warp from n >= 16384 on.
            f4 = kern("gemv", "nvfp4_gemv_m1_r2_u4" if m == 1 and n >= 16384 else gemv_name("nvfp4_gemv", m))
            grid4 = ((n + 15) // 16,) if m == 1 and n >= 16384 else ((n + 7) // 8,)
            grid = ((n + 7) // 8,)
            grid8 = ((n + 15) // 16,) if m == 1 else grid
            cc8 = lambda i: launch(f8, grid8, (256,), (ptr(x[i]), ptr(w8[i].view(torch.uint8)), ptr(sc[i]), ptr(y),
                                                      np.int32(m), np.int32(n), np.int32(k)))
            cc4 = lambda i: launch(f4, grid4, (256,), (ptr(x[i]), ptr(w4[i]), ptr(s4[i]), np.float32(0.01), ptr(y),
                                                      np.int32(m), np.int32(n), np.int32(k)))
            # Tensor-core family (mma.sync), one 16-row tile per block.
            t8 = kern("gemv", "fp8_block_gemv_mma_n8" if m <= 8 else "fp8_block_gemv_mma_n16")
            t4 = kern("gemv", "nvfp4_gemv_mma_n8" if m <= 8 else "nvfp4_gemv_mma_n16")
            gridt = ((n + 15) // 16,)
            tc8 = lambda i: launch(t8, gridt, (256,), (ptr(x[i]), ptr(w8[i].view(torch.uint8)), ptr(sc[i]), ptr(y),
                                                      np.int32(m), np.int32(n), np.int32(k)))
            tc4 = lambda i: launch(t4, gridt, (256,), (ptr(x[i]), ptr(w4[i]), ptr(s4[i]), np.float32(0.01), ptr(y),
                                                      np.int32(m), np.int32(n), np.int32(k)))
            # What GemvPath::Auto picks (kernels/src/cuda/mod.rs): FP8 CUDA cores at M=1, tensor cores otherwise;
            # NVFP4 tensor cores.
            auto8, other8 = ("cc8", "tc8") if m == 1 else ("tc8", "cc8")
            # Correctness in the bench too (the tests are the real check): FP8 both paths against a torch dequant,
            # NVFP4 tensor cores against the CUDA-core kernel.
            wd = w8[0].float() * sc[0].repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            ref = x[0].float() @ wd.t()
            del wd
            errs8 = {}
            for name, call in (("cc8", cc8), ("tc8", tc8)):
                y.fill_(float("nan"))
                call(0)
                torch.cuda.synchronize()
                errs8[name] = ((y - ref).norm() / ref.norm()).item()
            y.fill_(float("nan"))
            cc4(0)
            torch.cuda.synchronize()
            y4 = y.clone()
            y.fill_(float("nan"))
            tc4(0)
            torch.cuda.synchronize()
            err4 = ((y - y4).norm() / y4.norm()).item()
            ref1 = ref
            mp = max(16, m)
            x8 = [torch.randn(mp, k, device=dev).to(torch.float8_e4m3fn) for _ in range(sets)]
            base8 = lambda i: torch._scaled_mm(x8[i], w8[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            # Sweep: 16 warps per 16-row tile instead of 8.
            t8w = kern("gemv", ("fp8_block_gemv_mma_n8" if m <= 8 else "fp8_block_gemv_mma_n16") + "_w16")
            t4w = kern("gemv", ("nvfp4_gemv_mma_n8" if m <= 8 else "nvfp4_gemv_mma_n16") + "_w16")
            tc8w = lambda i: launch(t8w, gridt, (512,), (ptr(x[i]), ptr(w8[i].view(torch.uint8)), ptr(sc[i]), ptr(y),
                                                        np.int32(m), np.int32(n), np.int32(k)))
            tc4w = lambda i: launch(t4w, gridt, (512,), (ptr(x[i]), ptr(w4[i]), ptr(s4[i]), np.float32(0.01), ptr(y),
                                                        np.int32(m), np.int32(n), np.int32(k)))
            y.fill_(float("nan"))
            tc8w(0)
            torch.cuda.synchronize()
            err8w = ((y - ref).norm() / ref.norm()).item()
            y.fill_(float("nan"))
            tc4w(0)
            torch.cuda.synchronize()
            err4w = ((y - y4).norm() / y4.norm()).item()
            res = time_arms({"cc8": cc8, "tc8": tc8, "cc4": cc4, "tc4": tc4, "tc8w": tc8w, "tc4w": tc4w,
                             "scaled_mm": base8}, sets, 60 if n < 100000 else 8)
            shape = f"M={m} N={n} K={k}"
            fp8_moved = fp8_bytes + m * k * 2 + m * n * 4
            row("fp8_gemv", shape, res[auto8], "torch._scaled_mm(M16)", res["scaled_mm"], bytes_moved=fp8_moved,
                ceiling=copy_bw, target=">=85% copy", note=f"{auto8}, rel err vs torch {errs8[auto8]:.1e}")
            row("fp8_gemv_alt", shape, res[other8], "fp8_gemv (auto)", res[auto8], bytes_moved=fp8_moved,
                ceiling=copy_bw, note=f"{other8}, rel err vs torch {errs8[other8]:.1e}")
            nv_bytes = n * k // 2 + n * k // 16 + m * k * 2 + m * n * 4
            row("nvfp4_gemv", shape, res["tc4"], "our fp8_gemv (auto)", res[auto8], bytes_moved=nv_bytes,
                ceiling=copy_bw, target=">=85% copy", note=f"tc4, rel diff vs cc4 {err4:.1e}")
            row("nvfp4_gemv_alt", shape, res["cc4"], "nvfp4_gemv (auto)", res["tc4"], bytes_moved=nv_bytes,
                ceiling=copy_bw, note="cc4")
            row("gemv_tc_w16", f"fp8 {shape}", res["tc8w"], "fp8 tensor cores, 8 warps", res["tc8"],
                bytes_moved=fp8_moved, ceiling=copy_bw, note=f"rel err vs torch {err8w:.1e}")
            row("gemv_tc_w16", f"nvfp4 {shape}", res["tc4w"], "nvfp4 tensor cores, 8 warps", res["tc4"],
                bytes_moved=nv_bytes, ceiling=copy_bw, note=f"rel diff vs cc4 {err4w:.1e}")
            ours4 = cc4
            if m == 1:
                # Design sweep of the FP8 kernel (rows per warp x 16-byte loads in flight per row), same data.
                variants = {}
                for (rw, u) in [(1, 8), (2, 4), (2, 2), (4, 2)]:
                    fv = kern("gemv", f"fp8_block_gemv_m1_r{rw}_u{u}")
                    gv = ((n + 8 * rw - 1) // (8 * rw),)
                    variants[f"r{rw}u{u}"] = (lambda fv, gv: lambda i: launch(
                        fv, gv, (256,), (ptr(x[i]), ptr(w8[i].view(torch.uint8)), ptr(sc[i]), ptr(y), np.int32(1),
                                         np.int32(n), np.int32(k))))(fv, gv)
                errs = {}
                for name, call in variants.items():
                    y.fill_(float("nan"))
                    call(0)
                    torch.cuda.synchronize()
                    errs[name] = ((y - ref1).norm() / ref1.norm()).item()
                f1 = kern("gemv", "fp8_block_gemv_m1")
                r1u4 = lambda i: launch(f1, grid, (256,), (ptr(x[i]), ptr(w8[i].view(torch.uint8)), ptr(sc[i]), ptr(y),
                                                           np.int32(1), np.int32(n), np.int32(k)))
                resv = time_arms({"r1u4": r1u4, **variants}, sets, 60 if n < 100000 else 8)
                nv = {}
                for (rw, u) in [(1, 4), (2, 4), (4, 2), (4, 4)]:
                    fv = kern("gemv", "nvfp4_gemv_m1" if rw == 1 else f"nvfp4_gemv_m1_r{rw}_u{u}")
                    gv = ((n + 8 * rw - 1) // (8 * rw),)
                    nv[f"r{rw}u{u}"] = (lambda fv, gv: lambda i: launch(
                        fv, gv, (256,), (ptr(x[i]), ptr(w4[i]), ptr(s4[i]), np.float32(0.01), ptr(y), np.int32(1),
                                         np.int32(n), np.int32(k))))(fv, gv)
                resn = time_arms({"default": ours4, **nv}, sets, 60 if n < 100000 else 8)
                for name in nv:
                    row("nvfp4_var", f"{shape} {name}", resn[name], "nvfp4 cuda-core default", resn["default"],
                        bytes_moved=n * k // 2 + n * k // 16 + k * 2 + n * 4, ceiling=copy_bw)
                for name in variants:
                    row("fp8_gemv_var", f"{shape} {name}", resv[name], "fp8_gemv r1u4", resv["r1u4"],
                        bytes_moved=fp8_bytes + k * 2 + n * 4, ceiling=copy_bw, note=f"rel err {errs[name]:.1e}")
            if m == 1 and n < 100000:
                if wbf is None:
                    wbf = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(n_sets(2 * n * k))]
                xb = [torch.randn(1, k, device=dev, dtype=torch.bfloat16) for _ in range(len(wbf))]
                res2 = time_arms({"bf16": lambda i: xb[i] @ wbf[i].t()}, len(wbf), 60)
                row("cublas_bf16", shape, res2["bf16"], "-", None, bytes_moved=2 * n * k, ceiling=copy_bw,
                    note="reference point: cuBLAS bf16 GEMV")
            del x, x8, ref1, ref, y4
        del w8, sc, w4, s4, wbf
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
def bench_gdn(copy_bw):
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        log(f"fla not importable ({e}); GDN baseline skipped")
        fused_recurrent_gated_delta_rule = None
    hk, hv, d, kc = 16, 48, 128, 4
    cd = 2 * hk * d + hv * d
    f = kern("gdn", "gdn_decode_step")
    conv_w = torch.randn(cd, kc, device=dev) * 0.5
    a_log = torch.randn(hv, device=dev) * 0.5
    dt_bias = torch.randn(hv, device=dev) * 0.5
    norm_w = torch.rand(d, device=dev) + 0.5
    for b in ([1, 8, 32] if not QUICK else [1, 8]):
        state_bytes = b * hv * d * d * 4
        sets = n_sets(2 * state_bytes, floor=2)
        qkv = [torch.randn(b, cd, device=dev) for _ in range(sets)]
        z = [torch.randn(b, hv * d, device=dev) for _ in range(sets)]
        a = [torch.randn(b, hv, device=dev) for _ in range(sets)]
        bb = [torch.randn(b, hv, device=dev) for _ in range(sets)]
        conv = [torch.randn(b, cd, kc - 1, device=dev) for _ in range(sets + 1)]
        st = [torch.randn(b, hv, d, d, device=dev) * 0.05 for _ in range(sets)]
        out = torch.empty(b, hv * d, device=dev)

        fcl = kern("gdn", "gdn_decode_step_cluster4")

        def cluster4(i):
            launch(fcl, (hv * 4, b), (128,), (ptr(qkv[i]), ptr(z[i]), ptr(a[i]), ptr(bb[i]), ptr(conv_w),
                                              ptr(a_log), ptr(dt_bias), ptr(norm_w), np.float32(1e-6), ptr(conv[i]),
                                              ptr(conv[i + 1]), ptr(st[i]), ptr(out), np.int32(hk), np.int32(hv),
                                              np.int32(kc)))

        def ours(i):
            launch(f, (hv, b), (256,), (ptr(qkv[i]), ptr(z[i]), ptr(a[i]), ptr(bb[i]), ptr(conv_w), ptr(a_log),
                                       ptr(dt_bias), ptr(norm_w), np.float32(1e-6), ptr(conv[i]), ptr(conv[i + 1]),
                                       ptr(st[i]), ptr(out), np.int32(hk), np.int32(hv), np.int32(kc)))

        arms = {"ours": ours, "cluster4": cluster4}
        if fused_recurrent_gated_delta_rule is not None:
            # fla's kernel alone, with everything it can fuse switched on (l2norm, gate, beta sigmoid): it still
            # needs the conv and the gated norm done around it.
            q4 = [torch.randn(b, 1, hk, d, device=dev) for _ in range(sets)]
            k4 = [torch.randn(b, 1, hk, d, device=dev) for _ in range(sets)]
            v4 = [torch.randn(b, 1, hv, d, device=dev) for _ in range(sets)]

            def fla_kernel(i):
                fused_recurrent_gated_delta_rule(
                    q4[i], k4[i], v4[i], g=a[i].view(b, 1, hv), beta=bb[i].view(b, 1, hv), initial_state=st[i],
                    output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log,
                    dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)

            def fla_pipeline(i):
                window = torch.cat([conv[i], qkv[i].unsqueeze(-1)], -1)
                y = F.silu((window * conv_w).sum(-1))
                conv[i + 1].copy_(window[..., 1:])
                q, k, v = y.split([hk * d, hk * d, hv * d], -1)
                o, _ = fused_recurrent_gated_delta_rule(
                    q.reshape(b, 1, hk, d), k.reshape(b, 1, hk, d), v.reshape(b, 1, hv, d), g=a[i].view(b, 1, hv),
                    beta=bb[i].view(b, 1, hv), initial_state=st[i], output_final_state=True,
                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                    use_beta_sigmoid_in_kernel=True)
                o = o.reshape(b, hv, d)
                o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w
                return (o.reshape(b, hv * d) * F.silu(z[i]))

            arms["fla_kernel"] = fla_kernel
            arms["fla_pipeline"] = fla_pipeline
        res = time_arms(arms, sets, 100)
        moved = 2 * state_bytes + b * (cd + 2 * hv * d + 2 * hv) * 4 + 2 * b * cd * (kc - 1) * 4
        shape = f"B={b} Hk={hk} Hv={hv} 128x128"
        row("gdn_var", f"B={b} cluster4", res["cluster4"], "gdn_decode (block/head)", res["ours"], bytes_moved=moved,
            ceiling=copy_bw)
        if "fla_kernel" in res:
            row("gdn_decode", shape, res["ours"], "fla fused_recurrent", res["fla_kernel"], bytes_moved=moved,
                ceiling=copy_bw, target=">=1.5x fla", note="ours: whole step; fla: recurrence only")
            row("gdn_decode", shape, res["ours"], "torch conv+fla+norm", res["fla_pipeline"], bytes_moved=moved,
                ceiling=copy_bw, target=">=1.5x fla")
        else:
            row("gdn_decode", shape, res["ours"], "-", None, bytes_moved=moved, ceiling=copy_bw)
        del qkv, z, a, bb, conv, st
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
def bench_attention(copy_bw, sm_count):
    hq, hkv, d, page = 24, 4, 256, 64
    fsplit = kern("attention", "attention_decode_split_D256_R6")
    fcomb = kern("attention", "attention_decode_combine_D256")
    scale = 1.0 / math.sqrt(d)
    for ctx in ([4096, 8192, 32768, 65536, 131072] if not QUICK else [4096, 32768]):
        pages = ctx // page
        kv_bytes = 2 * ctx * hkv * d * 2
        sets = n_sets(kv_bytes)
        kc = [torch.randn(pages, hkv, page, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        vc = [torch.randn(pages, hkv, page, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        table = torch.randperm(pages, device=dev, dtype=torch.int32).view(1, pages)
        lens = torch.tensor([ctx], device=dev, dtype=torch.int32)
        q = [torch.randn(1, hq, d, device=dev) for _ in range(sets)]
        out = torch.empty(1, hq, d, device=dev)
        splits = max(1, min(math.ceil(4 * sm_count / hkv), math.ceil(ctx / 64)))  # as device.rs auto_splits
        splits_tc = max(1, min(math.ceil(5 * sm_count / hkv), math.ceil(ctx / 64)))  # one wave of 5 blocks/SM
        ws = torch.empty(hq * max(splits, splits_tc) * (d + 2), device=dev)

        def ours(i):
            launch(fsplit, (splits, hkv, 1), (96,), (ptr(q[i]), ptr(kc[i]), ptr(vc[i]), ptr(table), ptr(lens),
                                                     np.float32(scale), ptr(out), ptr(ws), np.int32(hq), np.int32(hkv),
                                                     np.int32(page), np.int32(pages), np.int32(pages)))
            if splits > 1:
                launch(fcomb, (hq, 1), (d, 4), (ptr(ws), ptr(out), np.int32(hq), np.int32(splits)))

        # SDPA over the same tokens laid out contiguously (it has no paged path), with GQA.
        kd = [kc[i][table[0].long()].permute(1, 0, 2, 3).reshape(1, hkv, ctx, d).contiguous() for i in range(sets)]
        vd = [vc[i][table[0].long()].permute(1, 0, 2, 3).reshape(1, hkv, ctx, d).contiguous() for i in range(sets)]
        qb = [q[i].to(torch.bfloat16).view(1, hq, 1, d) for i in range(sets)]
        ours(0)
        torch.cuda.synchronize()
        ref = F.scaled_dot_product_attention(qb[0].float(), kd[0].float(), vd[0].float(), enable_gqa=True)
        err = ((out.view(1, hq, 1, d) - ref).norm() / ref.norm()).item()
        backend = "flash"
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(i):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(qb[i], kd[i], vd[i], enable_gqa=True)

        try:
            sdpa(0)
        except Exception as e:  # noqa: BLE001
            log(f"  note: SDPA flash refused ({e}); letting SDPA choose")
            backend = "auto"

            def sdpa(i):
                return F.scaled_dot_product_attention(qb[i], kd[i], vd[i], enable_gqa=True)

        ftc = kern("attention", "attention_decode_tc_D256")

        def ours_tc(i):
            launch(ftc, (splits_tc, hkv, 1), (128,), (ptr(q[i]), ptr(kc[i]), ptr(vc[i]), ptr(table), ptr(lens),
                                                     np.float32(scale), ptr(out), ptr(ws), np.int32(hq),
                                                     np.int32(hkv), np.int32(page), np.int32(pages), np.int32(pages)))
            if splits_tc > 1:
                launch(fcomb, (hq, 1), (d, 4), (ptr(ws), ptr(out), np.int32(hq), np.int32(splits_tc)))

        out.fill_(float("nan"))
        ours_tc(0)
        torch.cuda.synchronize()
        err_tc = ((out.view(1, hq, 1, d) - ref).norm() / ref.norm()).item()
        fs2 = kern("attention", "attention_decode_split_D256_R6_s2")

        def ours_s2(i):
            launch(fs2, (splits, hkv, 1), (96,), (ptr(q[i]), ptr(kc[i]), ptr(vc[i]), ptr(table), ptr(lens),
                                                 np.float32(scale), ptr(out), ptr(ws), np.int32(hq), np.int32(hkv),
                                                 np.int32(page), np.int32(pages), np.int32(pages)))
            if splits > 1:
                launch(fcomb, (hq, 1), (d, 4), (ptr(ws), ptr(out), np.int32(hq), np.int32(splits)))

        out.fill_(float("nan"))
        ours_s2(0)
        torch.cuda.synchronize()
        err2 = ((out.view(1, hq, 1, d) - ref).norm() / ref.norm()).item()
        res = time_arms({"ours": ours, "ours_tc": ours_tc, "ours_s2": ours_s2, "sdpa": sdpa}, sets, 40)
        # KernelPath::Auto takes the tensor cores (kernels/src/cuda/mod.rs).
        row("attn_decode", f"B=1 ctx={ctx} 24q/4kv x256", res["ours_tc"], f"SDPA {backend} (dense)", res["sdpa"],
            bytes_moved=kv_bytes, ceiling=copy_bw, target=">=80% copy at >=32k",
            note=f"tensor cores, splits {splits_tc}, rel err vs fp32 SDPA {err_tc:.1e}")
        row("attn_alt", f"ctx={ctx} CUDA cores", res["ours"], "attn_decode (tensor cores)", res["ours_tc"],
            bytes_moved=kv_bytes, ceiling=copy_bw, note=f"rel err vs fp32 SDPA {err:.1e}")
        row("attn_var", f"ctx={ctx} CUDA cores, 2 stages", res["ours_s2"], "CUDA cores, 3 stages", res["ours"],
            bytes_moved=kv_bytes, ceiling=copy_bw, note=f"rel err {err2:.1e}")
        del kc, vc, kd, vd, q, qb
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
GEMM_SMEM = 133120  # cuda/gemm.cu GM_SMEM_BYTES (4 stages of two 128x128 e4m3 tiles + 128 scales)


def allow_smem(fn, nbytes):
    """Lets `fn` launch with `nbytes` of dynamic shared memory (over the default 48 KiB): cupy's kernel attribute
    (what worked on the H200 with cupy 14.2, whose RawModule functions are RawKernels without `.ptr`), else the
    driver call (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8)."""
    try:
        fn.max_dynamic_shared_size_bytes = nbytes
    except Exception as e:  # noqa: BLE001
        log(f"  note: cupy's max_dynamic_shared_size_bytes failed ({e}); trying funcSetAttribute")
        cp.cuda.driver.funcSetAttribute(fn.ptr, 8, nbytes)


def bench_fp8_gemm():
    """The FP8 prefill GEMM (kernels/cuda/gemm.cu) at M=4096 on the Qwen3.8-27B MLP shapes, against cuBLAS FP8
    with per-row/per-column scales (torch._scaled_mm rowwise, bf16 out), cuBLAS FP8 with the same 1x128 / 128x128
    block scales when this torch exposes it, and cuBLAS bf16 (torch.matmul). Ours writes fp32 [M, N]."""
    fq = kern("gemm", "fp8_quantize_act")
    fg = kern("gemm", "fp8_block_gemm_128x128")  # what the Rust API launches
    fgu = kern("gemm", "fp8_block_gemm_128x128_u4")  # variant: the K tile's k32 steps unrolled
    for fn in (fg, fgu):
        allow_smem(fn, GEMM_SMEM)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference below must be fp32
    m = 4096
    for (n, k) in [(5120, 17408), (17408, 5120)]:
        kb, nb = (k + 127) // 128, (n + 127) // 128
        sets = n_sets(m * k + n * k)
        x = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        xq = [torch.empty(m, k, device=dev, dtype=torch.uint8) for _ in range(sets)]
        xs = [torch.empty(m, kb, device=dev) for _ in range(sets)]
        w8 = [torch.randn(n, k, device=dev).div_(4).to(torch.float8_e4m3fn) for _ in range(sets)]
        ws = [torch.rand(nb, kb, device=dev) * 1e-2 + 1e-3 for _ in range(sets)]
        y = torch.empty(m, n, device=dev)
        gm, gq = ((m + 127) // 128, nb), ((m + 7) // 8, kb)

        def quant(i):
            launch(fq, gq, (256,), (ptr(x[i]), ptr(xq[i]), ptr(xs[i]), np.int32(m), np.int32(k)))

        def gemm(i, f=fg):
            launch(f, gm, (256,), (ptr(xq[i]), ptr(xs[i]), ptr(w8[i].view(torch.uint8)), ptr(ws[i]), ptr(y),
                                   np.int32(m), np.int32(n), np.int32(k)), shared_mem=GEMM_SMEM)

        def gemm_u4(i):
            gemm(i, fgu)

        def both(i):
            quant(i)
            gemm(i)

        for i in range(sets):
            quant(i)
        torch.cuda.synchronize()
        # Correctness here too (the Rust tests are the real check): the quantiser against torch, the GEMM against
        # an fp32 torch matmul of the dequantised operands.
        xs_ref = x[0].float().abs().view(m, kb, 128).amax(-1) / 448.0
        err_s = ((xs[0] - xs_ref).abs().max() / xs_ref.abs().max()).item()
        xd = xq[0].view(torch.float8_e4m3fn).float() * xs[0].repeat_interleave(128, 1)[:, :k]
        wd = w8[0].float() * ws[0].repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        ref = xd @ wd.t()
        y.fill_(float("nan"))
        gemm(0)
        torch.cuda.synchronize()
        err = ((y - ref).norm() / ref.norm()).item()
        nan = torch.isnan(y).sum().item()
        y.fill_(float("nan"))
        gemm_u4(0)
        torch.cuda.synchronize()
        err_u4 = ((y - ref).norm() / ref.norm()).item()
        refq = (x[0].float() @ wd.t())
        errq = ((ref - refq).norm() / refq.norm()).item()  # what activation quantisation itself costs
        del xd, wd, ref, refq
        xq8 = [t.view(torch.float8_e4m3fn) for t in xq]
        sa_row = [torch.rand(m, 1, device=dev) + 0.5 for _ in range(sets)]
        sb_col = [torch.rand(1, n, device=dev) + 0.5 for _ in range(sets)]
        arms = {"gemm": gemm, "gemm_u4": gemm_u4, "quant+gemm": both,
                "scaled_mm": lambda i: torch._scaled_mm(xq8[i], w8[i].t(), scale_a=sa_row[i], scale_b=sb_col[i],
                                                        out_dtype=torch.bfloat16)}
        # cuBLAS with DeepSeek-style block scales (1x128 activations, 128x128 weights), if this torch has it:
        # scales outer-dim-major as cuBLAS wants them.
        xs_t = [t.t().contiguous().t() for t in xs]
        blk = lambda i: torch._scaled_mm(xq8[i], w8[i].t(), scale_a=xs_t[i], scale_b=ws[i].t(),
                                         out_dtype=torch.bfloat16)
        try:
            yb = blk(0).float()
            torch.cuda.synchronize()
            y.fill_(float("nan"))
            gemm(0)
            torch.cuda.synchronize()
            err_blk = ((y - yb).norm() / yb.norm()).item()
            arms["scaled_mm_block"] = blk
            log(f"  cuBLAS block-scaled FP8 available; ours vs it (its bf16 output): rel diff {err_blk:.1e}")
            del yb
        except Exception as e:  # noqa: BLE001
            log(f"  note: torch._scaled_mm with 1x128/128x128 block scales refused ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:160]})")
        wb = [t.to(torch.bfloat16) for t in w8]
        arms["bf16"] = lambda i: x[i] @ wb[i].t()
        res = time_arms(arms, sets, 10)
        shape = f"M={m} N={n} K={k}"
        fl = 2 * m * n * k
        note = (f"fp32 out; rel err vs fp32 torch {err:.1e}, {nan} NaN; scales vs torch {err_s:.0e}; "
                f"act. quantisation itself {errq:.1e}")
        row("fp8_gemm", shape, res["gemm"], "torch._scaled_mm rowwise", res["scaled_mm"], flops=fl,
            target=">=0.8x cuBLAS FP8", note=note)
        if "scaled_mm_block" in res:
            row("fp8_gemm", shape, res["gemm"], "_scaled_mm block 1x128", res["scaled_mm_block"], flops=fl,
                note="cuBLAS with the same block scales")
        row("fp8_gemm", shape, res["gemm"], "torch.matmul bf16", res["bf16"], flops=fl)
        row("fp8_gemm_var", f"{shape} u4", res["gemm_u4"], "fp8_gemm (unroll 1)", res["gemm"], flops=fl,
            note=f"k32 steps unrolled; rel err {err_u4:.1e}")
        row("fp8_gemm+q", shape, res["quant+gemm"], "torch._scaled_mm rowwise", res["scaled_mm"], flops=fl,
            note="ours from bf16: quantiser + GEMM")
        # (A "quantiser alone" row as the difference of the two arms above printed 0.00 us in the H200 run of
        # 2026-12-01: the GEMM arm's spread, 21%, is larger than the quantiser's time. Next: time it as its own arm.)
        del x, xq, xs, w8, ws, y, xq8, wb, xs_t
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = tf32


NVFP4_GEMM_SMEM = 118784  # cuda/gemm.cu NG_SMEM_BYTES


def bench_nvfp4_gemm():
    """The NVFP4 prefill GEMM (weight-only, W decoded to bf16 in registers, bf16 mma.sync) at M=4096 against cuBLAS
    bf16 (torch.matmul) on the same shape. Ours writes fp32 [M, N]."""
    f4 = kern("gemm", "nvfp4_gemm_128x256")  # what the Rust API launches
    f4u = kern("gemm", "nvfp4_gemm_128x256_u4")  # variant: the K tile's k16 steps unrolled
    for fn in (f4, f4u):
        allow_smem(fn, NVFP4_GEMM_SMEM)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    m = 4096
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], device=dev)
    for (n, k) in [(5120, 17408), (17408, 5120)]:
        sets = n_sets(m * k * 2 + n * k // 2)
        x = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        w4 = [torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8) for _ in range(sets)]
        s4 = [(torch.rand(n, k // 16, device=dev) + 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
              for _ in range(sets)]
        gs = 0.01
        y = torch.empty(m, n, device=dev)

        def ours(i, f=f4):
            launch(f, ((m + 127) // 128, (n + 255) // 256), (256,),
                   (ptr(x[i]), ptr(w4[i]), ptr(s4[i]), np.float32(gs), ptr(y), np.int32(m), np.int32(n),
                    np.int32(k)), shared_mem=NVFP4_GEMM_SMEM)

        codes = torch.stack([w4[0] & 15, w4[0] >> 4], -1).view(n, k).long()
        wd = lut[codes] * s4[0].view(torch.float8_e4m3fn).float().repeat_interleave(16, 1) * gs
        ref = x[0].float() @ wd.t()
        y.fill_(float("nan"))
        ours(0)
        torch.cuda.synchronize()
        err = ((y - ref).norm() / ref.norm()).item()
        nan = torch.isnan(y).sum().item()
        y.fill_(float("nan"))
        ours(0, f4u)
        torch.cuda.synchronize()
        err_u4 = ((y - ref).norm() / ref.norm()).item()
        wb = [wd.to(torch.bfloat16)] + [(lut[torch.stack([t & 15, t >> 4], -1).view(n, k).long()]
                                         * s4[j].view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
                                         * gs).to(torch.bfloat16) for j, t in enumerate(w4) if j > 0]
        del codes, wd, ref
        res = time_arms({"nvfp4": ours, "nvfp4_u4": lambda i: ours(i, f4u), "bf16": lambda i: x[i] @ wb[i].t()},
                        sets, 10)
        shape = f"M={m} N={n} K={k}"
        row("nvfp4_gemm", shape, res["nvfp4"], "torch.matmul bf16", res["bf16"], flops=2 * m * n * k,
            target=">=0.7x cuBLAS bf16", note=f"fp32 out; rel err vs fp32 torch {err:.1e}, {nan} NaN")
        row("nvfp4_gemm_var", f"{shape} u4", res["nvfp4_u4"], "nvfp4_gemm (unroll 1)", res["nvfp4"],
            flops=2 * m * n * k, note=f"k16 steps unrolled; rel err {err_u4:.1e}")
        del x, w4, s4, y, wb
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = tf32


def main():
    props = torch.cuda.get_device_properties(0)
    log(f"device: {props.name}, {props.multi_processor_count} SMs, {props.total_memory/2**30:.0f} GiB, "
        f"torch {torch.__version__}, cupy {cp.__version__}, quick={QUICK}")
    want = lambda sec: ONLY is None or sec in ONLY  # noqa: E731
    copy_bw, bf16, fp8 = ceilings() if ONLY is None else (float("nan"),) * 3
    t0 = time.time()
    if want("gemv"):
        bench_gemv(copy_bw)
        log(f"[gemv done in {time.time()-t0:.0f}s]")
    if want("gdn"):
        bench_gdn(copy_bw)
        log(f"[gdn done in {time.time()-t0:.0f}s]")
    if want("attention"):
        bench_attention(copy_bw, props.multi_processor_count)
        log(f"[attention done in {time.time()-t0:.0f}s]")
    if want("fp8_gemm"):
        bench_fp8_gemm()
        log(f"[fp8_gemm done in {time.time()-t0:.0f}s]")
    if want("nvfp4_gemm"):
        bench_nvfp4_gemm()
        log(f"[nvfp4_gemm done in {time.time()-t0:.0f}s]")
    with open(os.path.join(OUT, "bench.json"), "w") as fh:
        json.dump({"device": props.name, "copy_GBps": copy_bw / 1e9, "cublas_bf16_TFLOPs": bf16 / 1e12,
                   "cublas_fp8_TFLOPs": fp8 / 1e12, "rows": ROWS}, fh, indent=1)
    # The short table, last.
    print()
    print(f"H200 ceilings: copy {copy_bw/1e12:.2f} TB/s, cuBLAS bf16 {bf16/1e12:.0f} TFLOP/s, FP8 {fp8/1e12:.0f}")
    print(f"{'kernel':12s}|{'shape':27s}|{'ours us':>9s}|{'baseline':22s}|{'base us':>9s}|{'x':>6s}|{'GB/s':>6s}|{'%copy':>6s}"
          f"|{'TFLOP/s':>7s}|{'base TF':>7s}")
    for r in ROWS:
        tf = r.get("TFLOP/s", float("nan"))
        btf = tf / r["speedup"] if "TFLOP/s" in r else float("nan")  # the baseline's rate: same FLOPs, its time
        print(f"{r['kernel']:12s}|{r['shape']:27s}|{r['ours_us']:9.2f}|{r['baseline']:22s}|{r['base_us']:9.2f}|"
              f"{r['speedup']:6.2f}|{r.get('GB/s', float('nan')):6.0f}|{r.get('frac_copy', float('nan'))*100:6.1f}"
              f"|{tf:7.1f}|{btf:7.1f}")
    print("Not built: GDN chunked prefill, attention causal prefill, small ops.")


if __name__ == "__main__":
    main()
