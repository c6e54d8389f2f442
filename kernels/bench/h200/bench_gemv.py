"""Decode GEMV design sweep on the H200 (issue 4, items 1 and 2): every variant of kernels/cuda/gemv.cu against the
kernels `KernelPath::Auto` picks today, against cuBLAS (`torch._scaled_mm` FP8 with M padded to 16,
`torch.matmul` bf16), on the Qwen3.8-27B decode shapes, in one run that decides `Auto`'s table.

Usage (repository root): python3 kernels/bench/h200/bench_gemv.py CARRY_DIR [--quick]
CARRY_DIR holds the gemv.ptx the crate embeds. Method as bench.py (its helpers are imported): CUDA graphs of R
launches rotating over input sets larger than L2, arms alternating over 11 rounds, medians and spreads. "% copy"
is (weights + scales + activations + outputs) / time over the device-to-device copy bandwidth measured here with a
256 MiB float32 copy_. Every arm's output is checked (FP8 against a torch dequantisation, NVFP4 against our
default kernel) and a failing case is printed without stopping the others. Writes $OUT/bench_gemv.json and
$OUT/bench_gemv_log.txt and prints the short table last.

The read floor (rows fp8_read_floor / nvfp4_read_floor, the last table's "floor" and "%floor"): per format and
shape, kernels/bench/h200/read_floor.cu (CARRY_DIR/read_floor.ptx, compiled by `run_session.sh prepare`) reading
the same weight and scale bytes once and doing nothing else, the fastest of a few grids. It is what one kernel of
this size can do on this card; a GEMV's time over it is the GEMV's own.

Arms (kernel names as in the SASS, for grepping):
  fp8  auto   fp8_block_gemv_m1_r2_u2 (m = 1) | fp8_block_gemv_mma_n8/_n16 (m > 1)
  fp8  k2_pdl fp8_block_gemv_m1_r2_u2_k2 as a programmatic dependent (m = 1)        -- Auto at m = 1, n < 65536
  fp8  pre    gemv_act_frag_fp8 + fp8_block_gemv_mma_pre_n8/_n16_w8c1   -- converted once
  fp8  w{W}c{CS}[_plain]  the same with W warps per block and CS blocks of a cluster per tile
      (Gpu::fp8_block_gemv_split), both kernels as programmatic dependents unless _plain
  fp8  t_pre, t_w{W}c{CS}  the same over the FP8 tile layout (Gpu::fp8_repack_tiles + fp8_gemv_tiles_split)
  fp8  tc_w{W}c{CS}  the tile layout, activations converted in the GEMV (Gpu::fp8_gemv_tiles_converting)
  fp8  t_w8c2_only, t_w4c1_only (m > 1)  the "t_" GEMV alone on fragments converted once before timing: the
      fragment kernel's cost is the difference to t_w8c2 / t_w4c1
      (Gpu::fp8_gemv_tiles, the FP8 decode path: the table in its fp8_tiles_auto)
      (Gpu::fp8_block_gemv_with_scratch: the table in its fp8_split_auto)
  fp8  normfrag  rmsnorm_frag_fp8 + the GEMV (Gpu::rmsnorm_fp8_fragments + fp8_gemv_tiles_fragments) against
      rmsnorm_bf16 + gemv_act_frag_fp8 + the same GEMV (m >= 2; fp8_fused_case)
  fp8  glufrag  silu_and_mul_frag_fp8 + the GEMV (Gpu::silu_and_mul_fp8_fragments) against silu_and_mul_bf16 +
      gemv_act_frag_fp8 + the same GEMV (m >= 2, inter = K; fp8_fused_case)
  nv4  auto   nvfp4_gemv_mma_n8/_n16                          -- Gpu::nvfp4_gemv (checkpoint layout, no repack)
  nv4  pre    gemv_act_frag_nvfp4 + nvfp4_gemv_mma_pre_n8/_n16
  nv4  tile   nvfp4_gemv_mma_tile_n8/_n16 (weights repacked once by nvfp4_repack_mma)
  nv4  tilepre  gemv_act_frag_nvfp4 + nvfp4_gemv_mma_tile_pre_n8/_n16
  nv4  tilepre_only  the same GEMV alone on fragments converted once before timing (against tilepre_pdl)
  nv4  t1k2_only, m1w8k2_only  Auto's two-split kernels alone the same way (y not zeroed between launches):
      what a producer that wrote the fragments and zeroed y would leave of the call
  nv4  m1w8c2[_only]  gemv_act_frag_nvfp4 + nvfp4_gemv_tiles_m1_w8c2 (the m = 1 kernel, two blocks of one cluster
      per tile: nothing to zero), and alone on fragments converted beforehand
  nv4  normfrag, glufrag  rmsnorm_frag_nvfp4 / silu_and_mul_frag_nvfp4 + Gpu::nvfp4_gemv_tiles_fragments' kernel
      against the bf16 producer + fragment kernel + Auto's kernel (nvfp4_fused_case; rows _u: the bf16 producer
      + fragment kernel + the fragments kernel)
  nv4  normstep, glustep  the same producers zeroing y where Auto's kernel adds K splits into it, then Auto's
      kernel (Gpu::rmsnorm_nvfp4_gemv / silu_and_mul_nvfp4_gemv), checked bit for bit against the unfused path
  nv4  t1k{S}  gemv_act_frag_nvfp4[_zero] + nvfp4_gemv_tiles_n8/_n16_u1, grid.y = S (1-4) -- Gpu::nvfp4_gemv_tiles_variant
  nv4  m1w{W}k{S}  gemv_act_frag_nvfp4[_zero] + nvfp4_gemv_tiles_m1_w{W}, grid.y = S (m = 1; Gpu::nvfp4_gemv_tiles_m1)
  nv4  w{W}c{CS}[_plain]  gemv_act_frag_nvfp4 + nvfp4_gemv_mma_tile_pre_n8/_n16_w{W}c{CS}
      (Gpu::nvfp4_gemv_tiles_split; tilepre_w8c1_plain is w8c1 launched plainly)
      (Gpu::nvfp4_gemv_tiles's Auto: the table in its nvfp4_tiles_auto)
The last table names, per case, the fastest correct arm and the arm the library's Auto runs for it (`with_scratch`
for FP8, `nvfp4_gemv_tiles` for NVFP4: the decode paths), so a wrong Auto entry shows as a gain > 1.
The persistent stream-K arms (p*, pp*) lost everywhere and were deleted with their kernels.

Registers of the tile kernels as the driver compiled this PTX are logged ("regs").

Env: GEMV_ONLY=nvfp4 (or fp8) runs one format's cases alone; GEMV_MS="1,4,16" sets the m values (default 1, 4, 16;
--quick 1, 16); GEMV_ALT="TAG=DIR" times another build of gemv.cu (DIR/gemv.ptx, e.g. made by `ALT_MODULE=gemv
kernels/bench/h200/build_alt.sh TAG ..`) in the same rounds: its nvfp4_repack_mma makes its own tile layout of the
same weights, and the arms TAG_t1k2_pdl, TAG_tilepre_pdl, TAG_w4c1, TAG_w8c1 and at m = 1 TAG_m1w8k2, TAG_m1w8k1,
TAG_m1w4k1 (the kernels Gpu::nvfp4_gemv_tiles's Auto picks among) run its GEMVs on it after this build's fragment kernel; rows "nvfp4_vs_TAG" give this build's arm
against the same arm of TAG.
"""

import json
import os
import sys
import tempfile
import time
import traceback

# bench.py opens $OUT/bench_log.txt for writing at import: point it elsewhere so a previous bench.py log survives.
OUT = os.environ.get("OUT", ".")
os.environ["OUT"] = tempfile.mkdtemp()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402

os.environ["OUT"] = OUT
b.LOG = open(os.path.join(OUT, "bench_gemv_log.txt"), "w")

import numpy as np  # noqa: E402
import torch  # noqa: E402

dev = torch.device("cuda")
QUICK = "--quick" in sys.argv
ptr, launch, kern = b.ptr, b.launch, b.kern
ONLY = os.environ.get("GEMV_ONLY", "")
if ONLY not in ("", "fp8", "nvfp4"):
    raise SystemExit(f"GEMV_ONLY={ONLY!r}: expected fp8 or nvfp4 (or unset for both)")
MS_ENV = os.environ.get("GEMV_MS", "")
if MS_ENV and not all(v.strip().isdigit() and 1 <= int(v) <= 16 for v in MS_ENV.split(",")):
    raise SystemExit(f"GEMV_MS={MS_ENV!r}: expected comma-separated token counts 1..16, e.g. 1,4,16")


def alt_build():
    """GEMV_ALT="TAG=DIR": (tag, cupy module of DIR/gemv.ptx) or None."""
    spec = os.environ.get("GEMV_ALT", "")
    if not spec:
        return None
    tag, sep, d = spec.partition("=")
    if not sep or not tag or not os.path.exists(os.path.join(d, "gemv.ptx")):
        raise SystemExit(f"GEMV_ALT={spec!r}: expected TAG=DIR with DIR/gemv.ptx")
    import cupy as cp
    return tag, cp.RawModule(path=os.path.join(d, "gemv.ptx"))


ALT = alt_build()
i32, f32 = np.int32, np.float32


def rel(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


BEST = []  # (format, shape, m, best arm, its us, the library Auto's arm, its us, best's fraction of copy)
FLOOR = {}  # (format, shape) -> seconds: the read floor of that format's weights and scales (read_floor)

# (loads in flight per thread, blocks of 256 threads per SM) of read_floor.cu's kernel; the floor is the fastest.
FLOOR_CUTS = ((2, 8), (4, 8), (4, 4), (8, 4), (8, 2))


def read_floor(fmt, n, k, sets, wbufs, sbufs, copy_bw):
    """The read floor of one format and shape (kernels/bench/h200/read_floor.cu): one kernel reading set i's
    weights wbufs[i] then its scales sbufs[i] once (the bytes a GEMV on set i must read; the activations and
    outputs, a few KiB, left out) and nothing else, the fastest of FLOOR_CUTS, launched plainly and timed as the
    GEMVs are. Records a row and FLOOR[(fmt, "N=n K=k")]."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(1, device=dev, dtype=torch.int32)
    nw = wbufs[0].numel() * wbufs[0].element_size()
    ns = sbufs[0].numel() * sbufs[0].element_size()
    if nw % 16 or ns % 16:
        raise ValueError(f"read_floor: {nw} weight and {ns} scale bytes, expected multiples of 16")
    arms = {}
    for u, per in FLOOR_CUTS:
        f = kern("read_floor", f"read_floor_u{u}")
        arms[f"u{u}b{per}"] = lambda i, f=f, per=per: launch(f, (sms * per,), (256,), (
            ptr(wbufs[i]), np.uint64(nw // 16), ptr(sbufs[i]), np.uint64(ns // 16), ptr(sink)))
    res = b.time_arms(arms, sets, 60 if n < 100000 else 8)
    best = min(res, key=lambda a: res[a][0])
    b.row(f"{fmt}_read_floor", f"N={n} K={k} {best}", res[best], "-", None, bytes_moved=nw + ns, ceiling=copy_bw,
          note="one kernel reading the weights and scales once; " + ", ".join(
              f"{a} {res[a][0] * 1e6:.2f}" for a in res))
    FLOOR[(fmt, f"N={n} K={k}")] = res[best][0]


def fp8_case(n, k, m, sets, w8, wr8, sc, copy_bw, one, wbf):
    x = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    y = torch.empty(m, n, device=dev, dtype=torch.float32)
    nt = 1 if m <= 8 else 2
    xf = torch.empty((k + 127) // 128 * nt * 512, device=dev, dtype=torch.int32)
    g16 = ((n + 15) // 16,)
    args = lambda i: (ptr(x[i]), ptr(w8[i]), ptr(sc[i]), ptr(y), i32(m), i32(n), i32(k))  # noqa: E731
    arms = {}
    if m == 1:
        # "auto" here is the unsplit kernel (the library's earlier Auto); Gpu::fp8_block_gemv's Auto now
        # splits K over 2 warps below 65536 rows and launches that as a programmatic dependent (fp8_m1_ksplit_auto,
        # fp8_m1_pdl_auto), the "k2_pdl" arm.
        f = kern("gemv", "fp8_block_gemv_m1_r2_u2")
        arms["auto"] = lambda i: launch(f, g16, (256,), args(i))
        fk = kern("gemv", "fp8_block_gemv_m1_r2_u2_k2")
        gk = ((n + 7) // 8,)
        arms["k2_pdl"] = lambda i: b.launch_pdl(fk, gk, (256,), args(i))
    else:
        f = kern("gemv", "fp8_block_gemv_mma_n8" if m <= 8 else "fp8_block_gemv_mma_n16")
        arms["auto"] = lambda i: launch(f, g16, (256,), args(i))
    fa = kern("gemv", "gemv_act_frag_fp8")
    ga = ((xf.numel() // 4 + 255) // 256,)
    frag_args = lambda i: (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt))  # noqa: E731
    split_args = lambda i: (ptr(xf), ptr(w8[i]), ptr(sc[i]), ptr(y), i32(m), i32(n), i32(k))  # noqa: E731
    add_split_arms(arms, "fp8_block_gemv_mma_pre", nt, g16[0], fa, ga, frag_args, split_args, "pre")
    # The same cuts over the FP8 tile layout (Gpu::fp8_repack_tiles, fp8_repack_mma; "t_" arms).
    add_split_arms(arms, "fp8_gemv_mma_tile_pre", nt, g16[0], fa, ga, frag_args,
                   lambda i: (ptr(xf), ptr(wr8[i]), ptr(sc[i]), ptr(y), i32(m), i32(n), i32(k)), "t_pre", "t_")
    if m == 1:  # "m1t_": the m = 1 CUDA-core kernel over the tile layout (fp8_gemv_tile_m1_*), as dependents
        for w, cs in SPLITS:
            fm = kern("gemv", f"fp8_gemv_tile_m1_w{w}c{cs}")
            log_regs(f"fp8_gemv_tile_m1_w{w}c{cs}", fm)
            arms[f"m1t_w{w}c{cs}"] = lambda i, fm=fm, w=w, cs=cs: b.launch_pdl(
                fm, (g16[0], cs), (32 * w,), (ptr(x[i]), ptr(wr8[i]), ptr(sc[i]), ptr(y), i32(n), i32(k)))
    # The GEMV alone on fragments converted once beforehand (one scratch per input set): what the fragment kernel
    # costs the "t_" arms, i.e. what a producer kernel that wrote the fragments itself would save ("t_..._only").
    if m > 1:
        xfo = [torch.empty_like(xf) for _ in range(sets)]
        for i in range(sets):
            launch(fa, ga, (256,), (ptr(x[i]), ptr(xfo[i]), i32(m), i32(k), i32(nt)))
        for w, cs in ((8, 2), (4, 1)):
            fo = kern("gemv", f"fp8_gemv_mma_tile_pre_n{8 * nt}_w{w}c{cs}")
            arms[f"t_w{w}c{cs}_only"] = lambda i, fo=fo, cs=cs, w=w: b.launch_pdl(
                fo, (g16[0], cs), (32 * w,), (ptr(xfo[i]), ptr(wr8[i]), ptr(sc[i]), ptr(y), i32(m), i32(n), i32(k)))
    # ... and with the activations converted inside the GEMV (no fragment kernel): "tc_" arms, as dependents.
    for w, cs in ((8, 1), (8, 2), (4, 1)):
        fc = kern("gemv", f"fp8_gemv_mma_tile_n{8 * nt}_w{w}c{cs}")
        log_regs(f"fp8_gemv_mma_tile_n{8 * nt}_w{w}c{cs}", fc)
        arms[f"tc_w{w}c{cs}"] = lambda i, fc=fc, w=w, cs=cs: b.launch_pdl(
            fc, (g16[0], cs), (32 * w,), (ptr(x[i]), ptr(wr8[i]), ptr(sc[i]), ptr(y), i32(m), i32(n), i32(k)))
    # Correctness of every arm against a torch dequantisation of set 0.
    # w8 holds the e4m3 codes as uint8 (the kernels' view): decode them as e4m3, not as integers (run 3 compared
    # against the integer codes and failed every arm, although the GPU tests pass).
    wd = w8[0].view(torch.float8_e4m3fn).float() * sc[0].repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    ref = x[0].float() @ wd.t()
    del wd
    errs = {}
    for name, call in list(arms.items()):
        y.fill_(float("nan"))
        try:
            call(0)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a failing arm is dropped, the others still run
            b.log(f"  ARM FAILED fp8 {name} M={m} N={n} K={k}: {type(e).__name__}: {e}")
            del arms[name]
            continue
        errs[name] = rel(y, ref)
        if not errs[name] < 1e-4:
            b.log(f"  FAIL fp8 {name} M={m} N={n} K={k}: rel err {errs[name]:.2e} (NaN: unwritten)")
    mp = max(16, m)
    x8 = [torch.randn(mp, k, device=dev).to(torch.float8_e4m3fn) for _ in range(sets)]
    w8f = [w.view(torch.float8_e4m3fn) for w in w8]
    all_arms = dict(arms)
    all_arms["scaled_mm"] = lambda i: torch._scaled_mm(x8[i], w8f[i].t(), scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16)
    if wbf is not None:
        xb = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(len(wbf))]
        res_bf = b.time_arms({"bf16": lambda i: xb[i] @ wbf[i].t()}, len(wbf), 60 if n < 100000 else 8)
    res = b.time_arms(all_arms, sets, 60 if n < 100000 else 8)
    shape = f"M={m} N={n} K={k}"
    nb, kb = (n + 127) // 128, (k + 127) // 128
    moved = n * k + nb * kb * 4 + m * k * 2 + m * n * 4
    b.row("fp8_gemv", shape, res["auto"], "torch._scaled_mm(M16)", res["scaled_mm"], bytes_moved=moved,
          ceiling=copy_bw, target=">=85% copy", note=f"auto, rel err {errs['auto']:.1e}")
    for name in arms:
        if name != "auto":
            b.row(f"fp8_{name}", shape, res[name], "fp8 auto", res["auto"], bytes_moved=moved, ceiling=copy_bw,
                  note=f"rel err {errs[name]:.1e}")
    if wbf is not None:
        b.row("cublas_bf16", shape, res_bf["bf16"], "-", None, bytes_moved=2 * n * k + m * k * 2 + m * n * 2,
              ceiling=copy_bw, note="reference point: torch.matmul bf16")
    # "_only" arms skip the activation conversion a call needs: not candidates for the table.
    ok = {a: res[a][0] for a in arms if errs[a] < 1e-4 and not a.endswith("_only")}
    best = min(ok, key=ok.get) if ok else "none"
    # Gpu::fp8_block_gemv_with_scratch's choice
    # The decode path's choice: Gpu::fp8_gemv_tiles over the tile layout (fp8_tiles_auto). (The checkpoint-layout
    # path, Gpu::fp8_block_gemv_with_scratch: k2_pdl / auto at m = 1, w8c2 / w4c3 / w4c1 above, fp8_split_auto.)
    if m == 1:
        lib = "m1t_w8c2" if n <= 8192 else "m1t_w8c1"
    elif n <= 8192:
        lib = "t_w8c2"
    elif m >= 9:
        lib = "t_w4c1"
    else:
        lib = "tc_w8c1" if n < 65536 else "t_w8c1"
    BEST.append(("fp8", f"N={n} K={k}", m, best, ok.get(best, float("nan")) * 1e6, lib, res[lib][0] * 1e6,
                 moved / ok.get(best, float("nan")) / copy_bw if ok else float("nan")))
    return res["auto"]


def producer_calls(kind, fmt, m, k, sets, xb, xf):
    """The decode step's producer of fp8_fused_case / nvfp4_fused_case on `sets` fresh inputs: kind "norm"
    (rmsnorm_bf16 / rmsnorm_frag_{fmt}) or "glu" (silu_and_mul_bf16 / silu_and_mul_frag_{fmt}, inter = k). Returns
    (to_bf16(i), to_frag(i, zero=None)): the bf16 producer into xb, launched plainly (it has no griddepcontrol),
    and the fragment producer into xf, as a programmatic dependent (it waits for its predecessor itself), zeroing
    the tensor `zero` as well if given (what Gpu::rmsnorm_nvfp4_gemv's producer does for a GEMV adding into y)."""
    def z(zero):
        return (ptr(zero), np.uint64(zero.numel())) if zero is not None else (np.uint64(0), np.uint64(0))
    if kind == "norm":
        xs = [torch.randn(m, k, device=dev) * 2 for _ in range(sets)]
        nw = torch.rand(k, device=dev) + 0.5
        eps, add = f32(1e-6), f32(0.0)
        fb, ff = kern("ops", "rmsnorm_bf16"), kern("ops", f"rmsnorm_frag_{fmt}")
        return (lambda i: launch(fb, (m,), (256,), (ptr(xs[i]), ptr(nw), add, eps, ptr(xb), i32(k))),
                lambda i, zero=None: b.launch_pdl(ff, (m,), (256,),
                                                  (ptr(xs[i]), ptr(nw), add, eps, ptr(xf), i32(k)) + z(zero)))
    gus = [torch.randn(m, 2 * k, device=dev) * 2 for _ in range(sets)]
    fb, ff = kern("ops", "silu_and_mul_bf16"), kern("ops", f"silu_and_mul_frag_{fmt}")
    return (lambda i: launch(fb, (m, (k + 1023) // 1024), (256,), (ptr(gus[i]), ptr(xb), i32(k))),
            lambda i, zero=None: b.launch_pdl(ff, (m, ((k + 127) // 128 * 128 + 1023) // 1024), (256,),
                                              (ptr(gus[i]), ptr(xf), i32(k)) + z(zero)))


def fused_outputs(arms, y, what):
    """Runs each arm of a fused case once into y (NaN first) and returns {arm: output}, or None (logged as a FAIL)
    if the "fused" arm's output is not finite or not bit for bit the "unfused" one's."""
    outs = {}
    for name, call in arms.items():
        y.fill_(float("nan"))
        call(0)
        torch.cuda.synchronize()
        outs[name] = y.clone()
    if not torch.equal(outs["unfused"], outs["fused"]) or not torch.isfinite(outs["fused"]).all().item():
        b.log(f"  FAIL {what}: fused and unfused differ (or NaN)")
        return None
    return outs


def fp8_fused_case(kind, n, k, m, sets, wr8, sc, copy_bw):
    """The decode step producer -> FP8 GEMV (m >= 2), both ways. kind "norm": "norm_frag_gemv" = rmsnorm_bf16 +
    gemv_act_frag_fp8 + the GEMV (what Gpu::rmsnorm + Gpu::fp8_gemv_tiles_split run) against "normfrag_gemv" =
    rmsnorm_frag_fp8 + the same GEMV (Gpu::rmsnorm_fp8_fragments + Gpu::fp8_gemv_tiles_fragments); kind "glu": the
    same with silu_and_mul_bf16 / silu_and_mul_frag_fp8 (Gpu::silu_and_mul_fp8_fragments; inter = k). The bf16 producers
    have no griddepcontrol, so they are launched plainly (they write what the GEMV before them may still read);
    the fragment producers wait for their predecessor themselves and, like the rest, go as programmatic
    dependents. The cut is MmaSplit::fp8_fragments'. Outputs compared bit for bit before timing; "% copy" counts
    the GEMV's bytes only (the producer's m x k or m x 2k floats are < 1% of them)."""
    nt = 1 if m <= 8 else 2
    xb = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
    xf = torch.empty((k + 127) // 128 * nt * 512, device=dev, dtype=torch.int32)
    y = torch.empty(m, n, device=dev, dtype=torch.float32)
    g16 = (n + 15) // 16
    w, cs = (8, 2) if n <= 8192 else ((4, 1) if m >= 9 else (8, 1))
    fg = kern("gemv", f"fp8_gemv_mma_tile_pre_n{8 * nt}_w{w}c{cs}")
    fa = kern("gemv", "gemv_act_frag_fp8")
    ga = ((xf.numel() // 4 + 255) // 256,)
    to_bf16, to_frag = producer_calls(kind, "fp8", m, k, sets, xb, xf)
    label, base = (("fp8_normfrag", "norm + frag + gemv") if kind == "norm" else
                   ("fp8_glufrag", "silu*up + frag + gemv"))

    def gemv(i):
        b.launch_pdl(fg, (g16, cs), (32 * w,), (ptr(xf), ptr(wr8[i]), ptr(sc[i]), ptr(y), i32(m), i32(n), i32(k)))

    def unfused(i):
        to_bf16(i)
        b.launch_pdl(fa, ga, (256,), (ptr(xb), ptr(xf), i32(m), i32(k), i32(nt)))
        gemv(i)

    def fused(i):
        to_frag(i)
        gemv(i)
    arms = {"unfused": unfused, "fused": fused}
    if fused_outputs(arms, y, f"fp8 {kind} M={m} N={n} K={k}") is None:
        return
    res = b.time_arms(arms, sets, 60 if n < 100000 else 8)
    nb, kb = (n + 127) // 128, (k + 127) // 128
    moved = n * k + nb * kb * 4 + m * k * 2 + m * n * 4
    b.row(label, f"M={m} N={n} K={k}", res["fused"], base, res["unfused"], bytes_moved=moved, ceiling=copy_bw,
          target=">=85% copy", note=f"w{w}c{cs}, bitwise equal")


def nvfp4_gemv_cut(n, m, fragments):
    """(kernel, grid, threads, takes m, adds into y) of the NVFP4 tile GEMV that Gpu::nvfp4_gemv_tiles runs
    (fragments False: nvfp4_tiles_auto, the "lib" of nvfp4_case) or Gpu::nvfp4_gemv_tiles_fragments runs (True: the
    same where it writes y whole, else the cluster builds: nothing to zero for a producer that writes the
    fragments)."""
    sfx, g16 = ("n8" if m <= 8 else "n16"), (n + 15) // 16
    if m == 1 and n <= 8192:
        return ((kern("gemv", "nvfp4_gemv_tiles_m1_w8c2"), (g16, 2), 256, False, False) if fragments else
                (kern("gemv", "nvfp4_gemv_tiles_m1_w8"), (g16, 2), 256, False, True))
    if m <= 8 and n <= 8192:
        return ((kern("gemv", f"nvfp4_gemv_mma_tile_pre_{sfx}_w8c2"), (g16, 2), 256, True, False) if fragments else
                (kern("gemv", f"nvfp4_gemv_tiles_{sfx}_u1"), (g16, 2), 256, True, True))
    if 8192 < n < 65536:
        return kern("gemv", f"nvfp4_gemv_mma_tile_pre_{sfx}_w8c1"), (g16, 1), 256, True, False
    if m <= 8:
        return kern("gemv", f"nvfp4_gemv_mma_tile_pre_{sfx}_w4c1"), (g16, 1), 128, True, False
    return kern("gemv", f"nvfp4_gemv_mma_tile_pre_{sfx}"), (g16, 1), 256, True, False


def nvfp4_fused_case(kind, n, k, m, sets, wr, sr, copy_bw):
    """The decode step producer -> NVFP4 GEMV, as fp8_fused_case: "auto" = the bf16 producer (rmsnorm_bf16 or
    silu_and_mul_bf16, plain) + gemv_act_frag_nvfp4[_zero] + Gpu::nvfp4_gemv_tiles' kernel; "unfused" = the bf16
    producer + gemv_act_frag_nvfp4 + Gpu::nvfp4_gemv_tiles_fragments' kernel; "fused" = rmsnorm_frag_nvfp4 (or
    silu_and_mul_frag_nvfp4) + that kernel (Gpu::rmsnorm_nvfp4_fragments + Gpu::nvfp4_gemv_tiles_fragments).
    fused and unfused must be equal bit for bit, fused and auto within 1e-5. "% copy" counts the GEMV's bytes."""
    nt = 1 if m <= 8 else 2
    xb = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
    xf = torch.empty((k + 127) // 128 * nt * 512, device=dev, dtype=torch.int32)
    y = torch.empty(m, n, device=dev, dtype=torch.float32)
    gs = f32(0.01)
    fa, faz = kern("gemv", "gemv_act_frag_nvfp4"), kern("gemv", "gemv_act_frag_nvfp4_zero")
    ga = ((xf.numel() // 4 + 255) // 256,)
    to_bf16, to_frag = producer_calls(kind, "nvfp4", m, k, sets, xb, xf)
    label = "nvfp4_normfrag" if kind == "norm" else "nvfp4_glufrag"

    def gemv(i, fragments):
        fg, grid, threads, takes_m, _ = nvfp4_gemv_cut(n, m, fragments)
        b.launch_pdl(fg, grid, (threads,), (ptr(xf), ptr(wr[i]), ptr(sr[i]), gs, ptr(y))
                     + ((i32(m),) if takes_m else ()) + (i32(n), i32(k)))

    def auto(i):
        to_bf16(i)
        if nvfp4_gemv_cut(n, m, False)[4]:
            b.launch_pdl(faz, ga, (256,), (ptr(xb), ptr(xf), i32(m), i32(k), i32(nt), ptr(y), np.uint64(m * n)))
        else:
            b.launch_pdl(fa, ga, (256,), (ptr(xb), ptr(xf), i32(m), i32(k), i32(nt)))
        gemv(i, False)

    def unfused(i):
        to_bf16(i)
        b.launch_pdl(fa, ga, (256,), (ptr(xb), ptr(xf), i32(m), i32(k), i32(nt)))
        gemv(i, True)

    def fused(i):
        to_frag(i)
        gemv(i, True)

    def step(i):
        to_frag(i, y if nvfp4_gemv_cut(n, m, False)[4] else None)
        gemv(i, False)
    arms = {"auto": auto, "unfused": unfused, "fused": fused, "step": step}
    what = f"nvfp4 {kind} M={m} N={n} K={k}"
    outs = fused_outputs(arms, y, what)
    if outs is None:
        return
    err = rel(outs["fused"], outs["auto"])
    if not err < 1e-5:
        b.log(f"  FAIL {what}: fused against auto rel diff {err:.2e}")
        return
    if not torch.equal(outs["step"], outs["auto"]):
        b.log(f"  FAIL {what}: the step (producer zeroing y + Auto's kernel) differs from auto")
        return
    res = b.time_arms(arms, sets, 60 if n < 100000 else 8)
    moved = n * k // 2 + n * k // 16 + m * k * 2 + m * n * 4
    shape = f"M={m} N={n} K={k}"
    b.row(label, shape, res["fused"], "producer + frag + auto", res["auto"], bytes_moved=moved, ceiling=copy_bw,
          target=">=85% copy", note=f"fused == unfused bitwise, rel diff vs auto {err:.1e}")
    b.row(label + "_u", shape, res["unfused"], "producer + frag + auto", res["auto"], bytes_moved=moved,
          ceiling=copy_bw, note="unfused: frag kernel + the fragments GEMV")
    b.row(label.replace("frag", "step"), shape, res["step"], "producer + frag + auto", res["auto"],
          bytes_moved=moved, ceiling=copy_bw, target=">=85% copy",
          note="Gpu::*_nvfp4_gemv: the producer zeroes y, Auto's kernel; == auto bitwise")


# The cuts of the tensor-core GEMVs over preconverted activations (Gpu::fp8_block_gemv_split,
# Gpu::nvfp4_gemv_tiles_split; the _w{W}c{CS} builds of blockq_gemv_mma): W warps per block, CS blocks of one
# cluster per 16-row tile. "pre" is w8c1 launched plainly (the one-block-per-tile kernel -4).
SPLITS = [(8, 1), (8, 2), (4, 1), (4, 2), (4, 3)]  # MmaSplit::BUILT
PLAIN_TOO = [(8, 1)]


def add_split_arms(arms, base, nt, tiles, fa, ga, frag_args, split_args, w8c1_plain, prefix=""):
    """Adds an arm per cut: fragment kernel + split GEMV, both as programmatic dependents ("{prefix}w{W}c{CS}"), and
    for PLAIN_TOO also launched plainly ("{prefix}w{W}c{CS}_plain"; w8c1 plain is named w8c1_plain)."""
    for w, cs in SPLITS:
        fn = kern("gemv", f"{base}_n{8 * nt}_w{w}c{cs}")
        log_regs(f"{base}_n{8 * nt}_w{w}c{cs}", fn)
        for pdl in (True, False) if (w, cs) in PLAIN_TOO else (True,):
            go = b.launch_pdl if pdl else launch

            def arm(i, fn=fn, w=w, cs=cs, go=go):
                go(fa, ga, (256,), frag_args(i))
                go(fn, (tiles, cs), (32 * w,), split_args(i))
            name = f"{prefix}w{w}c{cs}" if pdl else (w8c1_plain if (w, cs) == (8, 1) else f"{prefix}w{w}c{cs}_plain")
            arms[name] = arm


def nvfp4_case(n, k, m, sets, w4, s4, wr, sr, copy_bw, fp8_auto, alt_tiles=None):
    x = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    y = torch.empty(m, n, device=dev, dtype=torch.float32)
    nt = 1 if m <= 8 else 2
    xf = torch.empty((k + 127) // 128 * nt * 512, device=dev, dtype=torch.int32)
    g16 = ((n + 15) // 16,)
    ga = ((xf.numel() // 4 + 255) // 256,)
    sfx = "n8" if m <= 8 else "n16"
    gs = f32(0.01)
    fa = kern("gemv", "gemv_act_frag_nvfp4")
    f0 = kern("gemv", f"nvfp4_gemv_mma_{sfx}")
    fpre = kern("gemv", f"nvfp4_gemv_mma_pre_{sfx}")
    ft = kern("gemv", f"nvfp4_gemv_mma_tile_{sfx}")
    ftp = kern("gemv", f"nvfp4_gemv_mma_tile_pre_{sfx}")
    log_regs(f"nvfp4_gemv_mma_tile_pre_{sfx}", ftp)
    frag = lambda i: launch(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt)))  # noqa: E731
    faz = kern("gemv", "gemv_act_frag_nvfp4_zero")
    fragz = lambda i: launch(faz, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt), ptr(y),  # noqa: E731
                                               np.uint64(m * n)))
    tail = lambda: (gs, ptr(y), i32(m), i32(n), i32(k))  # noqa: E731
    arms = {
        "auto": lambda i: launch(f0, g16, (256,), (ptr(x[i]), ptr(w4[i]), ptr(s4[i])) + tail()),
        "pre": lambda i: (frag(i), launch(fpre, g16, (256,), (ptr(xf), ptr(w4[i]), ptr(s4[i])) + tail())),
        "tile": lambda i: launch(ft, g16, (256,), (ptr(x[i]), ptr(wr[i]), ptr(sr[i])) + tail()),
        "tilepre": lambda i: (frag(i), launch(ftp, g16, (256,), (ptr(xf), ptr(wr[i]), ptr(sr[i])) + tail())),
    }
    # Gpu::nvfp4_gemv_tiles_variant's kernels: S K splits (S > 1: y zeroed by the _zero fragment kernel).
    fu = kern("gemv", f"nvfp4_gemv_tiles_{sfx}_u1")
    log_regs(f"nvfp4_gemv_tiles_{sfx}_u1", fu)
    for splits in (1, 2, 3, 4):
        def tiles_arm(i, splits=splits):
            (fragz if splits > 1 else frag)(i)
            launch(fu, (g16[0], splits), (256,), (ptr(xf), ptr(wr[i]), ptr(sr[i])) + tail())
        arms[f"t1k{splits}"] = tiles_arm
    # PDL launches (as in fp8_case) of the two decode paths: both kernels of each with the attribute.
    arms["tilepre_pdl"] = lambda i: (
        b.launch_pdl(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt))),
        b.launch_pdl(ftp, g16, (256,), (ptr(xf), ptr(wr[i]), ptr(sr[i])) + tail()))
    arms["t1k2_pdl"] = lambda i: (
        b.launch_pdl(faz, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt), ptr(y), np.uint64(m * n))),
        b.launch_pdl(fu, (g16[0], 2), (256,), (ptr(xf), ptr(wr[i]), ptr(sr[i])) + tail()))
    # m = 1: nvfp4_gemv_tiles_m1_w{W} (the group scales after the mma, Gpu::nvfp4_gemv_tiles_m1), K splits S,
    # both kernels as programmatic dependents ("m1w{W}k{S}").
    def m1_arm(fm, wrs, srs, w, splits):
        """The fragment kernel (zeroing y for splits > 1) + an m = 1 kernel fm on the tile layout wrs / srs."""
        def arm(i):
            if splits > 1:
                b.launch_pdl(faz, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt), ptr(y), np.uint64(m * n)))
            else:
                b.launch_pdl(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt)))
            b.launch_pdl(fm, (g16[0], splits), (32 * w,), (ptr(xf), ptr(wrs[i]), ptr(srs[i]), gs, ptr(y), i32(n),
                                                           i32(k)))
        return arm

    if m == 1:
        for w, splits in ((8, 1), (8, 2), (4, 1), (4, 2)):
            fm = kern("gemv", f"nvfp4_gemv_tiles_m1_w{w}")
            log_regs(f"nvfp4_gemv_tiles_m1_w{w}", fm)
            arms[f"m1w{w}k{splits}"] = m1_arm(fm, wr, sr, w, splits)
        # The cluster build (two blocks per tile, sums in distributed shared memory; nothing to zero).
        fmc = kern("gemv", "nvfp4_gemv_tiles_m1_w8c2")
        log_regs("nvfp4_gemv_tiles_m1_w8c2", fmc)
        arms["m1w8c2"] = lambda i: (
            b.launch_pdl(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt))),
            b.launch_pdl(fmc, (g16[0], 2), (256,), (ptr(xf), ptr(wr[i]), ptr(sr[i]), gs, ptr(y), i32(n), i32(k))))
    # The one-split GEMV alone on fragments converted once beforehand (as fp8_case's "t_..._only").
    xfo = [torch.empty_like(xf) for _ in range(sets)]
    for i in range(sets):
        launch(fa, ga, (256,), (ptr(x[i]), ptr(xfo[i]), i32(m), i32(k), i32(nt)))
    arms["tilepre_only"] = lambda i: b.launch_pdl(ftp, g16, (256,), (ptr(xfo[i]), ptr(wr[i]), ptr(sr[i])) + tail())
    # Auto's split kernels alone on those fragments: what a producer writing the fragments (and zeroing y) would
    # leave of the call (the FP8 path's rmsnorm_fp8_fragments). They add into y, zeroed for the check only.
    adds_only = {"t1k2_only"}
    if m <= 8:
        arms["t1k2_only"] = lambda i: b.launch_pdl(fu, (g16[0], 2), (256,), (ptr(xfo[i]), ptr(wr[i]), ptr(sr[i]))
                                                   + tail())
    if m == 1:
        fm8 = kern("gemv", "nvfp4_gemv_tiles_m1_w8")
        arms["m1w8k2_only"] = lambda i: b.launch_pdl(fm8, (g16[0], 2), (256,), (
            ptr(xfo[i]), ptr(wr[i]), ptr(sr[i]), gs, ptr(y), i32(n), i32(k)))
        adds_only.add("m1w8k2_only")
        arms["m1w8c2_only"] = lambda i: b.launch_pdl(fmc, (g16[0], 2), (256,), (
            ptr(xfo[i]), ptr(wr[i]), ptr(sr[i]), gs, ptr(y), i32(n), i32(k)))
    add_split_arms(arms, "nvfp4_gemv_mma_tile_pre", nt, g16[0], fa, ga,
                   lambda i: (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt)),
                   lambda i: (ptr(xf), ptr(wr[i]), ptr(sr[i])) + tail(), "tilepre_w8c1_plain")
    # The other build's GEMVs (GEMV_ALT) on its own tile layout, after this build's fragment kernel.
    alt_arms = ("t1k2_pdl", "tilepre_pdl", "w4c1", "w8c1") + (("m1w8k2", "m1w8k1", "m1w4k1") if m == 1 else ())
    if ALT is not None:
        tag, mod = ALT
        awr, asr = alt_tiles
        fu_a = mod.get_function(f"nvfp4_gemv_tiles_{sfx}_u1")
        ftp_a = mod.get_function(f"nvfp4_gemv_mma_tile_pre_{sfx}")
        fw_a = mod.get_function(f"nvfp4_gemv_mma_tile_pre_{sfx}_w4c1")
        arms[f"{tag}_t1k2_pdl"] = lambda i: (
            b.launch_pdl(faz, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt), ptr(y), np.uint64(m * n))),
            b.launch_pdl(fu_a, (g16[0], 2), (256,), (ptr(xf), ptr(awr[i]), ptr(asr[i])) + tail()))
        arms[f"{tag}_tilepre_pdl"] = lambda i: (
            b.launch_pdl(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt))),
            b.launch_pdl(ftp_a, g16, (256,), (ptr(xf), ptr(awr[i]), ptr(asr[i])) + tail()))
        arms[f"{tag}_w4c1"] = lambda i: (
            b.launch_pdl(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt))),
            b.launch_pdl(fw_a, (g16[0], 1), (128,), (ptr(xf), ptr(awr[i]), ptr(asr[i])) + tail()))
        if m == 1:  # the m = 1 kernel's cuts (newer builds)
            for w, splits in ((8, 2), (8, 1), (4, 1)):
                fm_a = mod.get_function(f"nvfp4_gemv_tiles_m1_w{w}")
                arms[f"{tag}_m1w{w}k{splits}"] = m1_arm(fm_a, awr, asr, w, splits)
        fw8_a = mod.get_function(f"nvfp4_gemv_mma_tile_pre_{sfx}_w8c1")
        arms[f"{tag}_w8c1"] = lambda i: (
            b.launch_pdl(fa, ga, (256,), (ptr(x[i]), ptr(xf), i32(m), i32(k), i32(nt))),
            b.launch_pdl(fw8_a, (g16[0], 1), (256,), (ptr(xf), ptr(awr[i]), ptr(asr[i])) + tail()))
    outs = {}
    for name, call in list(arms.items()):
        y.fill_(0.0 if name in adds_only else float("nan"))
        try:
            call(0)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            b.log(f"  ARM FAILED nvfp4 {name} M={m} N={n} K={k}: {type(e).__name__}: {e}")
            del arms[name]
            continue
        outs[name] = y.clone()
    errs = {name: rel(o, outs["auto"]) for name, o in outs.items()}
    errs["auto"] = 0.0 if torch.isfinite(outs["auto"]).all().item() else float("nan")
    for name, e in errs.items():
        if not e < 1e-5:
            b.log(f"  FAIL nvfp4 {name} M={m} N={n} K={k}: rel diff vs auto {e:.2e} (NaN: unwritten)")
    exact = torch.equal(outs["tilepre"], outs["pre"]) and torch.equal(outs["t1k1"], outs["pre"])
    del outs
    res = b.time_arms(arms, sets, 60 if n < 100000 else 8)
    shape = f"M={m} N={n} K={k}"
    moved = n * k // 2 + n * k // 16 + m * k * 2 + m * n * 4
    b.row("nvfp4_gemv", shape, res["auto"], "our fp8 auto", fp8_auto, bytes_moved=moved, ceiling=copy_bw,
          target=">=85% copy")
    for name in arms:
        if name != "auto":
            b.row(f"nvfp4_{name}", shape, res[name], "nvfp4 auto", res["auto"], bytes_moved=moved, ceiling=copy_bw,
                  note=f"rel diff vs auto {errs[name]:.1e}" + (", tilepre == t1k1 == pre bitwise"
                                                                 if name == "tilepre" and exact else ""))
    if ALT is not None:
        for name in alt_arms:
            a = f"{ALT[0]}_{name}"
            if name in res and a in res:
                b.row(f"nvfp4_vs_{ALT[0]}", f"{shape} {name}", res[name], f"{a}", res[a], bytes_moved=moved,
                      ceiling=copy_bw)
    ok = {a: res[a][0] for a in arms if errs[a] < 1e-5 and not a.endswith("_only")}
    best = min(ok, key=ok.get) if ok else "none"
    # Gpu::nvfp4_gemv_tiles's choice (nvfp4_tiles_auto), launched as programmatic dependents.
    lib = ("m1w8k2" if m == 1 and n <= 8192 else "t1k2_pdl" if m <= 8 and n <= 8192 else
           "w8c1" if 8192 < n < 65536 else "w4c1" if m <= 8 and n >= 65536 else "tilepre_pdl")
    BEST.append(("nvfp4", f"N={n} K={k}", m, best, ok.get(best, float("nan")) * 1e6, lib, res[lib][0] * 1e6,
                 moved / ok.get(best, float("nan")) / copy_bw if ok else float("nan")))


class _Skip(Exception):
    """A format left out by GEMV_ONLY (raised to skip that format's part of a shape)."""


REGS_SEEN = set()


def log_regs(name, fn):
    """Logs a kernel's registers and static shared memory once, as the driver compiled the PTX."""
    if name in REGS_SEEN:
        return
    REGS_SEEN.add(name)
    try:
        b.log(f"regs {name}: {fn.num_regs} registers, {fn.shared_size_bytes} B static smem, "
              f"{fn.local_size_bytes} B local")
    except Exception as e:  # noqa: BLE001 - informational only
        b.log(f"regs {name}: unavailable ({type(e).__name__}: {e})")


def guarded(what, fn, *args):
    """fn(*args), or None with an ERROR line (the traceback in the log) if it raises: one failing case must not
    stop the others."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        b.log(f"  ERROR {what}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return None


def main():
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    b.log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, quick={QUICK}")
    copy_bw = b.copy_bandwidth()
    one = torch.ones((), device=dev)
    shapes = [(5120, 17408), (17408, 5120), (5120, 10240), (248320, 5120)]
    ms = [1, 4, 16] if not QUICK else [1, 16]
    if MS_ENV:
        ms = [int(v) for v in MS_ENV.split(",")]
    for (n, k) in shapes:
        try:
            if ONLY == "nvfp4":
                raise _Skip
            nb, kb = (n + 127) // 128, (k + 127) // 128
            sets = b.n_sets(n * k + nb * kb * 4)
            w8 = [torch.randn(n, k, device=dev).div_(4).to(torch.float8_e4m3fn).view(torch.uint8)
                  for _ in range(sets)]
            sc = [torch.rand(nb, kb, device=dev) + 0.5 for _ in range(sets)]
            wbf = None
            if n < 100000:
                wbf = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(b.n_sets(2 * n * k))]
            # FP8 tile layout (fp8_repack_mma), made once per weight set.
            ntiles8 = ((n + 15) // 16) * ((k + 127) // 128)
            wr8 = [torch.empty(ntiles8 * 2048, device=dev, dtype=torch.uint8) for _ in range(sets)]
            frp8 = kern("gemv", "fp8_repack_mma")
            for i in range(sets):
                launch(frp8, ((ntiles8 * 128 + 255) // 256,), (256,), (ptr(w8[i]), ptr(wr8[i]), i32(n), i32(k)))
            torch.cuda.synchronize()
            guarded(f"fp8 read floor N={n} K={k}", read_floor, "fp8", n, k, sets, wr8, sc, copy_bw)
            fp8_auto = {m: guarded(f"fp8 M={m} N={n} K={k}", fp8_case, n, k, m, sets, w8, wr8, sc, copy_bw, one, wbf)
                        for m in ms}
            for m in sorted(set(ms + [4]) - {1}):
                for kind in ("norm", "glu"):
                    guarded(f"fp8 {kind} M={m} N={n} K={k}", fp8_fused_case, kind, n, k, m, sets, wr8, sc, copy_bw)
            del w8, wr8, sc, wbf
            torch.cuda.empty_cache()
        except _Skip:
            fp8_auto = {}
        except Exception as e:  # noqa: BLE001
            b.log(f"  ERROR shape N={n} K={k} (fp8): {type(e).__name__}: {e}\n{traceback.format_exc()}")
            fp8_auto = {}
        try:
            if ONLY == "fp8":
                raise _Skip
            sets4 = b.n_sets(n * k // 2 + n * k // 16)
            w4 = [torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8) for _ in range(sets4)]
            s4 = [(torch.rand(n, k // 16, device=dev) + 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
                  for _ in range(sets4)]
            # The tile layout, made by the repack kernel (timed once: a load-time cost).
            tiles = ((n + 15) // 16) * ((k + 127) // 128)
            wr = [torch.empty(tiles * 1024, device=dev, dtype=torch.uint8) for _ in range(sets4)]
            sr = [torch.empty(tiles * 32, device=dev, dtype=torch.int32) for _ in range(sets4)]
            frp = kern("gemv", "nvfp4_repack_mma")
            grp = ((tiles * 64 + 255) // 256,)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for i in range(sets4):
                if i == 1:
                    e0.record()
                launch(frp, grp, (256,), (ptr(w4[i]), ptr(s4[i]), ptr(wr[i]), ptr(sr[i]), i32(n), i32(k)))
            e1.record()
            torch.cuda.synchronize()
            if sets4 > 1:
                b.log(f"nvfp4_repack_mma N={n} K={k}: {e0.elapsed_time(e1) * 1e3 / (sets4 - 1):.1f} us per weight")
            alt_tiles = None
            if ALT is not None:  # the other build's tile layout of the same weights, by its own repack kernel
                alt_tiles = ([torch.empty_like(t) for t in wr], [torch.empty_like(t) for t in sr])
                frp_a = ALT[1].get_function("nvfp4_repack_mma")
                for i in range(sets4):
                    launch(frp_a, grp, (256,), (ptr(w4[i]), ptr(s4[i]), ptr(alt_tiles[0][i]), ptr(alt_tiles[1][i]),
                                                i32(n), i32(k)))
                torch.cuda.synchronize()
            guarded(f"nvfp4 read floor N={n} K={k}", read_floor, "nvfp4", n, k, sets4, wr, sr, copy_bw)
            for m in ms:
                for kind in ("norm", "glu"):
                    guarded(f"nvfp4 {kind} M={m} N={n} K={k}", nvfp4_fused_case, kind, n, k, m, sets4, wr, sr,
                            copy_bw)
                guarded(f"nvfp4 M={m} N={n} K={k}", nvfp4_case, n, k, m, sets4, w4, s4, wr, sr, copy_bw,
                        fp8_auto.get(m), alt_tiles)
            del w4, s4, wr, sr, alt_tiles
            torch.cuda.empty_cache()
        except _Skip:
            pass
        except Exception as e:  # noqa: BLE001
            b.log(f"  ERROR shape N={n} K={k} (nvfp4): {type(e).__name__}: {e}\n{traceback.format_exc()}")
        b.log(f"[N={n} K={k} done at {time.time() - t0:.0f}s]")
    with open(os.path.join(OUT, "bench_gemv.json"), "w") as fh:
        json.dump({"device": props.name, "copy_GBps": copy_bw / 1e9, "rows": b.ROWS,
                   "best": [dict(zip(("format", "shape", "m", "best", "best_us", "auto", "auto_us", "frac_copy"), r))
                            for r in BEST]}, fh, indent=1)
    print()
    print(f"copy {copy_bw / 1e12:.3f} TB/s; {time.time() - t0:.0f} s")
    print(f"{'kernel':14s}|{'shape':24s}|{'ours us':>9s}|{'baseline':22s}|{'base us':>9s}|{'x':>6s}|{'GB/s':>6s}|"
          f"{'%copy':>6s}|note")
    for r in b.ROWS:
        print(f"{r['kernel']:14s}|{r['shape']:24s}|{r['ours_us']:9.2f}|{r['baseline']:22s}|{r['base_us']:9.2f}|"
              f"{r['speedup']:6.2f}|{r.get('GB/s', float('nan')):6.0f}|{r.get('frac_copy', float('nan')) * 100:6.1f}|"
              f"{r['note']}")
    print()
    print("Auto table candidates (fastest correct arm per case; auto = the arm the library's Auto runs, both")
    print("formats on the tile layout: Gpu::fp8_gemv_tiles, Gpu::nvfp4_gemv_tiles):")
    print("floor = read_floor.cu reading the same weights and scales once, alone; %floor = floor / auto's time.")
    print(f"{'fmt':6s}|{'shape':18s}|{'m':>3s}|{'best':15s}|{'best us':>8s}|{'auto':9s}|{'auto us':>8s}|{'gain':>5s}|"
          f"{'%copy':>6s}|{'floor us':>8s}|{'%floor':>6s}")
    for fmt, shape, m, best, bu, lib, au, fc in BEST:
        fl = FLOOR.get((fmt, shape), float("nan")) * 1e6
        print(f"{fmt:6s}|{shape:18s}|{m:3d}|{best:15s}|{bu:8.2f}|{lib:9s}|{au:8.2f}|{au / bu:5.2f}|{fc * 100:6.1f}|"
              f"{fl:8.2f}|{fl / au * 100:6.1f}")


if __name__ == "__main__":
    main()
