"""The library baselines of the GPU benchmark, and the combined table.

`kernels/benches/gpu.rs` (the Rust binary, built to carry by `cargo xtask bench gpu`) times our kernels through the
public `kernels::cuda::Gpu` calls the engine makes and writes its rows to JSON. This script reads that JSON, times
the baseline each row is compared with (cuBLAS through torch, SDPA flash, fla, plain torch ops) on the same shapes in
the same device call, and prints one table: ours, the baseline, their ratio, and the fraction of the copy
bandwidth the Rust run measured. Rows whose baseline is one of ours (NVFP4 against our FP8 GEMV, the one-call decode
step against the unfused producer + GEMV) take it from the same JSON. It also measures the ceilings (torch's
device copy, cuBLAS bf16 and FP8 at 8192^3).

Usage (on the device, after the Rust binary): python3 kernels/bench/h200/baselines.py RUST_JSON [--quick]
[--json OUT_JSON]. torch is required; fla (`flash-linear-attention`, carried as wheels) is optional (its rows say
"fla missing"). Method as the Rust side: each baseline captured in a CUDA graph of R calls rotating over enough
input sets to exceed the L2 (eager where torch cannot capture it), 11 rounds (5 with --quick), median and spread.
"""

import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from cuda_graph import capture

dev = torch.device("cuda")
QUICK = "--quick" in sys.argv
ROUNDS = 5 if QUICK else 11
ROUND_S = 1.5e-3 if QUICK else 3e-3
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False


def n_sets(nbytes):
    return max(2, min(64, math.ceil(240e6 / max(nbytes, 1))))


def time_call(call, sets):
    """Median seconds per call and spread ((max - min) / median), as the Rust benchmark measures its rows."""
    for i in range(sets):
        call(i)
    torch.cuda.synchronize()
    t = time.perf_counter()
    probe = max(sets, 3)
    for r in range(probe):
        call(r % sets)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / probe
    reps = max(1, min(4000, math.ceil(ROUND_S / per)))
    graph = None
    if per < 200e-6:
        try:
            graph = capture(call, sets, reps)
        except Exception:  # noqa: BLE001 - a baseline torch cannot capture is timed eagerly
            graph = None
            torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    v = []
    for _ in range(ROUNDS):
        e0.record()
        if graph is not None:
            graph.replay()
        else:
            for r in range(reps):
                call(r % sets)
        e1.record()
        torch.cuda.synchronize()
        v.append(e0.elapsed_time(e1) * 1e-3 / reps)
    med = statistics.median(v)
    return med, (max(v) - min(v)) / med


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device=dev) * scale).to(torch.bfloat16)


# ---- one function per family: params -> (baseline name, call(i), sets); None where there is no baseline ----

def gemv_fp8(p):
    n, k, m = p["n"], p["k"], p["m"]
    sets = n_sets(n * k)
    w = [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn) for _ in range(sets)]
    x = [torch.randn(max(16, m), k, device=dev).to(torch.float8_e4m3fn) for _ in range(sets)]
    one = torch.ones((), device=dev)
    # cuBLAS FP8 needs M >= 16: the smallest GEMM that does this GEMV's work, as the Python benchmark had it.
    return "cuBLAS FP8 _scaled_mm (M pad 16)", (
        lambda i: torch._scaled_mm(x[i], w[i].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), sets


def gemv_bf16(p):
    n, k, m = p["n"], p["k"], p["m"]
    sets = n_sets(2 * n * k)
    w = [bf16(n, k) for _ in range(sets)]
    x = [bf16(m, k) for _ in range(sets)]
    return "cuBLAS bf16 x @ W.T", (lambda i: x[i] @ w[i].t()), sets


def gemm_fp8(p):
    m, n, k = p["m"], p["n"], p["k"]
    sets = n_sets(n * k + m * k)
    xq = [torch.randn(m, k, device=dev).to(torch.float8_e4m3fn) for _ in range(sets)]
    w8 = [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn) for _ in range(sets)]
    # The same 1x128 activation / 128x128 weight block scales, bf16 out (the like-for-like row); torch builds
    # without block-scaled FP8 fall back to rowwise scales (a coarser scaling, said in the name).
    xs = (torch.rand(m, k // 128, device=dev) + 0.5).t().contiguous().t()
    ws = torch.rand(n // 128, k // 128, device=dev) + 0.5
    try:
        torch._scaled_mm(xq[0], w8[0].t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)
        return "cuBLAS FP8 _scaled_mm block", (
            lambda i: torch._scaled_mm(xq[i], w8[i].t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)), sets
    except Exception:  # noqa: BLE001
        sa, sb = torch.rand(m, 1, device=dev) + 0.5, torch.rand(1, n, device=dev) + 0.5
        return "cuBLAS FP8 _scaled_mm rowwise", (
            lambda i: torch._scaled_mm(xq[i], w8[i].t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)), sets


def gemm_bf16(p):
    m, n, k = p["m"], p["n"], p["k"]
    sets = n_sets(2 * (n * k + m * k))
    w = [bf16(k, n) for _ in range(sets)]
    x = [bf16(m, k) for _ in range(sets)]
    return "cuBLAS bf16 matmul", (lambda i: x[i] @ w[i]), sets


def fp8_quant(p):
    m, k = p["m"], p["k"]
    sets = n_sets(2 * m * k)
    x = [bf16(m, k) for _ in range(sets)]

    def q(i):
        xb = x[i].float().view(m, k // 128, 128)
        s = xb.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448.0
        return (xb / s).clamp(-448, 448).to(torch.float8_e4m3fn), s
    return "torch per-128 quant", q, sets


FLA = {}


def fla(name):
    if name not in FLA:
        try:
            import fla.ops.gated_delta_rule as g
            FLA[name] = getattr(g, name)
        except Exception as e:  # noqa: BLE001
            FLA[name] = None
            print(f"fla not importable ({type(e).__name__}: {e}); its baselines are skipped")
    return FLA[name]


HK, D = 16, 128


def gdn_decode(p):
    fused = fla("fused_recurrent_gated_delta_rule")
    if fused is None:
        return None
    bsz, hv = p["b"], p["hv"]
    sets = n_sets(2 * bsz * hv * D * D * 4)
    q = [torch.randn(bsz, 1, HK, D, device=dev) for _ in range(sets)]
    k = [torch.randn(bsz, 1, HK, D, device=dev) for _ in range(sets)]
    v = [torch.randn(bsz, 1, hv, D, device=dev) for _ in range(sets)]
    a = [torch.randn(bsz, 1, hv, device=dev) for _ in range(sets)]
    b = [torch.randn(bsz, 1, hv, device=dev) for _ in range(sets)]
    st = [torch.randn(bsz, hv, D, D, device=dev) * 0.05 for _ in range(sets)]
    a_log, dt_bias = torch.randn(hv, device=dev) * 0.5, torch.randn(hv, device=dev) * 0.5
    # fla's recurrence alone, with its l2-norm / gate / beta fusions on (ours is the whole step: conv, gates,
    # norms, state update, output, gated norm).
    return "fla fused_recurrent (recurrence only)", (lambda i: fused(
        q[i], k[i], v[i], g=a[i], beta=b[i], initial_state=st[i], output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True)), sets


def gdn_prefill(p):
    chunk = fla("chunk_gated_delta_rule")
    if chunk is None:
        return None
    t, seqs, hv = p["t"], p["seqs"], p["hv"]
    n = t * seqs
    # q and k repeated to the value heads, bf16, as a model calls fla; the gate precomputed (ours computes it).
    q = bf16(1, n, hv, D)
    k = bf16(1, n, hv, D)
    v = bf16(1, n, hv, D)
    g = -torch.rand(1, n, hv, device=dev) * 0.1
    beta = torch.rand(1, n, hv, device=dev).to(torch.bfloat16)
    st = torch.randn(seqs, hv, D, D, device=dev) * 0.05
    cu = None if seqs == 1 else torch.arange(0, n + 1, t, device=dev, dtype=torch.long)
    return "fla chunk_gated_delta_rule", (lambda i: chunk(
        q, k, v, g=g, beta=beta, initial_state=st, output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu)), 1


def sdpa_flash(fn):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call(i):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return fn(i)
    return call


def attn_decode(p):
    b, hq, hkv, d, ctx = p["b"], p["hq"], p["hkv"], p["d"], p["ctx"]
    sets = n_sets(2 * b * ctx * hkv * d * 2)
    q = [bf16(b, hq, 1, d) for _ in range(sets)]
    k = [bf16(b, hkv, ctx, d) for _ in range(sets)]
    v = [bf16(b, hkv, ctx, d) for _ in range(sets)]
    return "SDPA flash (dense KV)", sdpa_flash(
        lambda i: F.scaled_dot_product_attention(q[i], k[i], v[i], enable_gqa=True)), sets


def attn_prefill(p):
    hq, hkv, d, t, w = p["hq"], p["hkv"], p["d"], p["t"], p["window"]
    sets = n_sets(2 * t * d * (hq + 2 * hkv))
    q = [bf16(1, hq, t, d) for _ in range(sets)]
    k = [bf16(1, hkv, t, d) for _ in range(sets)]
    v = [bf16(1, hkv, t, d) for _ in range(sets)]
    if w == 0:
        return "SDPA flash causal", sdpa_flash(
            lambda i: F.scaled_dot_product_attention(q[i], k[i], v[i], is_causal=True, enable_gqa=True)), sets
    # SDPA has no sliding window: a boolean mask, which no flash kernel takes; the memory-efficient backend does,
    # but not with enable_gqa, so K and V are expanded to the query heads first (outside the timed call), else
    # the math backend would materialise every score.
    i_ = torch.arange(t, device=dev)
    mask = (i_[None, :] <= i_[:, None]) & (i_[:, None] - i_[None, :] < w)
    kx = [x.repeat_interleave(hq // hkv, 1) for x in k]
    vx = [x.repeat_interleave(hq // hkv, 1) for x in v]
    return "SDPA with a window mask", (
        lambda i: F.scaled_dot_product_attention(q[i], kx[i], vx[i], attn_mask=mask)), sets


def attn_prefill_paged(p):
    hq, hkv, d, t, pre = p["hq"], p["hkv"], p["d"], p["t"], p["prefix"]
    q = bf16(1, hq, t, d)
    # K and V expanded to the query heads, as for the window (the mask keeps flash out).
    k = bf16(1, hkv, pre + t, d).repeat_interleave(hq // hkv, 1)
    v = bf16(1, hkv, pre + t, d).repeat_interleave(hq // hkv, 1)
    i_ = torch.arange(t, device=dev)[:, None] + pre
    mask = torch.arange(pre + t, device=dev)[None, :] <= i_
    return "SDPA on the dense equivalent (mask)", (
        lambda i: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), 1


def small_op(fam, p):
    r = p.get("rows", 1)
    if fam in ("rmsnorm", "add_rmsnorm", "rmsnorm_f32", "add_rmsnorm_f32"):
        dim = p["dim"]
        sets = n_sets(r * dim * 8)
        x = [torch.randn(r, dim, device=dev) for _ in range(sets)]
        res = [torch.randn(r, dim, device=dev) for _ in range(sets)]
        w = torch.rand(dim, device=dev) + 1.0
        out = torch.float32 if fam.endswith("_f32") else torch.bfloat16
        if fam.startswith("add_"):
            def call(i):
                res[i].add_(x[i])
                return F.rms_norm(res[i], (dim,), w, 1e-6).to(out)
            return "torch add_ + F.rms_norm (+cast)", call, sets
        return "torch F.rms_norm (+cast)", (lambda i: F.rms_norm(x[i], (dim,), w, 1e-6).to(out)), sets
    if fam in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul_f32"):
        inter = p["inter"]
        sets = n_sets(r * inter * 8)
        gu = [torch.randn(r, 2 * inter, device=dev) for _ in range(sets)]
        act = {"silu_and_mul": F.silu, "gelu_and_mul": F.gelu,
               "gelu_tanh_and_mul_f32": lambda g: F.gelu(g, approximate="tanh")}[fam]
        out = torch.float32 if fam.endswith("_f32") else torch.bfloat16
        return "torch act(g) * u (+cast)", (lambda i: (act(gu[i][:, :inter]) * gu[i][:, inter:]).to(out)), sets
    if fam == "cast_f32_to_bf16":
        n = r * p["dim"]
        sets = n_sets(n * 4)
        x = [torch.randn(n, device=dev) for _ in range(sets)]
        return "torch .to(bf16)", (lambda i: x[i].to(torch.bfloat16)), sets
    if fam == "cast_bf16_to_f32":
        n = r * p["dim"]
        sets = n_sets(n * 2)
        x = [bf16(n) for _ in range(sets)]
        return "torch .float()", (lambda i: x[i].float()), sets
    if fam == "sigmoid_gate":
        n = r * p["dim"]
        sets = n_sets(n * 8)
        x = [torch.randn(n, device=dev) for _ in range(sets)]
        g = [torch.randn(n, device=dev) for _ in range(sets)]
        return "torch x.mul_(sigmoid(g))", (lambda i: x[i].mul_(torch.sigmoid(g[i]))), sets
    if fam == "sigmoid_head_gate":
        h, d = p["heads"], p["d"]
        sets = n_sets(r * h * d * 4)
        x = [torch.randn(r, h, d, device=dev) for _ in range(sets)]
        g = [torch.randn(r, h, 1, device=dev) for _ in range(sets)]
        return "torch x.mul_(sigmoid(g))", (lambda i: x[i].mul_(torch.sigmoid(g[i]))), sets
    if fam == "rope_neox":
        h, d, rot = p["heads"], p["d"], p["rot"]
        sets = n_sets(r * h * d * 4)
        x = [torch.randn(r, h, d, device=dev) for _ in range(sets)]
        inv = 1.0 / (1e7 ** (torch.arange(0, rot, 2, device=dev, dtype=torch.float32) / rot))
        ang = torch.arange(r, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]

        def call(i):
            x1, x2 = x[i][..., :rot // 2], x[i][..., rot // 2:rot]
            o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
            x[i][..., :rot // 2].copy_(o1)
            x[i][..., rot // 2:rot].copy_(o2)
        return "torch neox rope (partial)", call, sets
    if fam == "embedding_gather":
        table = torch.zeros(p["vocab"], p["dim"], device=dev, dtype=torch.bfloat16)
        ids = torch.randint(0, p["vocab"], (r,), device=dev)
        return "torch F.embedding + float()", (lambda i: F.embedding(ids, table).float()), 1
    if fam == "argmax":
        sets = n_sets(r * p["vocab"] * 4)
        lg = [torch.randn(r, p["vocab"], device=dev) * 10 for _ in range(sets)]
        return "torch argmax", (lambda i: lg[i].argmax(-1)), sets
    if fam == "sample":
        sets = n_sets(r * p["vocab"] * 4)
        lg = [torch.randn(r, p["vocab"], device=dev) * 10 for _ in range(sets)]
        kk = p["top_k"]

        def call(i):
            v, ix = torch.topk(lg[i] / 0.7, kk, dim=-1)
            pr = torch.softmax(v, -1)
            cum = pr.cumsum(-1)
            pr = pr.masked_fill(cum - pr > 0.95, 0)
            return ix.gather(-1, torch.multinomial(pr, 1))
        return "torch topk+softmax+top_p+multinomial", call, sets
    if fam == "copy":
        n = p["mib"] << 18
        a, b = torch.randn(n, device=dev), torch.empty(n, device=dev)
        return "torch copy_", (lambda i: b.copy_(a)), 1
    return None


# Rows compared with another row of ours from the same Rust run: family -> (other family, label).
OURS = {
    "nvfp4_gemv": ("fp8_gemv", "our FP8 GEMV (per token)"),
    "nvfp4_gemv_frag": ("fp8_gemv_frag", "our FP8 GEMV on fragments"),
    "nvfp4_step_norm": ("nvfp4_unfused_norm", "rmsnorm + nvfp4_gemv_tiles"),
    "nvfp4_step_silu": ("nvfp4_unfused_silu", "silu_and_mul + nvfp4_gemv_tiles"),
    "fp8_step": ("fp8_gemv", "fp8_gemv_tiles alone"),
}

BASELINES = {
    "fp8_gemv": gemv_fp8, "fp8_gemv_frag": gemv_fp8, "bf16_gemv": gemv_bf16, "fp8_gemm": gemm_fp8,
    "fp8_gemm_bf16": gemm_fp8,
    "nvfp4_gemm": gemm_bf16, "fp8_quant": fp8_quant, "gdn_decode": gdn_decode, "gdn_prefill": gdn_prefill,
    "gdn_prefill_f16": gdn_prefill, "attn_decode": attn_decode, "attn_prefill": attn_prefill,
    "attn_prefill_paged": attn_prefill_paged,
}


def key(row):
    # Rows that share a baseline (every m of one GEMV shape against one M-padded cuBLAS call) time it once.
    p = dict(row["params"])
    fam = row["family"]
    if fam in ("fp8_gemv", "fp8_gemv_frag"):
        p.pop("m")
        fam = "fp8_gemv"
    if fam == "gdn_prefill_f16":
        fam = "gdn_prefill"
    if fam == "fp8_gemm_bf16":
        fam = "fp8_gemm"
    return fam, tuple(sorted(p.items()))


def ceilings():
    nbytes = 1 << 28
    a = torch.randn(nbytes // 4, device=dev)
    b = torch.empty_like(a)
    copy = 2 * nbytes / time_call(lambda i: b.copy_(a), 1)[0]
    del a, b
    m = 8192
    x, y = bf16(m, m), bf16(m, m)
    bf = 2 * m ** 3 / time_call(lambda i: x @ y, 1)[0]
    x8, y8, one = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn), torch.ones((), device=dev)
    f8 = 2 * m ** 3 / time_call(
        lambda i: torch._scaled_mm(x8, y8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 1)[0]
    del x, y, x8, y8
    torch.cuda.empty_cache()
    return {"torch_copy_GBps": copy / 1e9, "cublas_bf16_TFLOPs": bf / 1e12, "cublas_fp8_TFLOPs": f8 / 1e12}


def fmt(v, p=2, pct=False):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v * 100:.{p}f}%" if pct else f"{v:.{p}f}"


def main():
    args = [a for a in sys.argv[1:] if a != "--quick"]
    out_json = None
    if "--json" in args:
        i = args.index("--json")
        out_json = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        sys.exit("usage: baselines.py RUST_JSON [--quick] [--json OUT_JSON]")
    rust = json.load(open(args[0]))
    if rust.get("skipped"):
        print(f"the Rust benchmark was skipped ({rust['skipped']}); no baselines")
        return
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, torch {torch.__version__}; Rust rows: {len(rust['rows'])} on {rust['device']}")
    ceil = ceilings()
    print("ceilings: torch copy {torch_copy_GBps:.0f} GB/s, cuBLAS bf16 {cublas_bf16_TFLOPs:.0f} TFLOP/s, "
          "FP8 {cublas_fp8_TFLOPs:.0f} TFLOP/s (8192^3)".format(**ceil))
    ours = {(r["family"], tuple(sorted(r["params"].items()))): r for r in rust["rows"]}
    cache = {}
    combined = []
    for r in rust["rows"]:
        fam, p = r["family"], r["params"]
        base_name, base_us, base_sp, note = None, None, None, ""
        if r.get("error"):
            note = "ours FAILED"
        elif fam in OURS:
            other, base_name = OURS[fam]
            o = ours.get((other, tuple(sorted(p.items()))))
            if o and o.get("us"):
                base_us, base_sp = o["us"], o["spread"]
        else:
            k = key(r)
            if k not in cache:
                try:
                    made = BASELINES[fam](p) if fam in BASELINES else small_op(fam, p)
                    if made is None:
                        cache[k] = (None, None, None, "no baseline")
                    else:
                        name, call, sets = made
                        t, sp = time_call(call, sets)
                        cache[k] = (name, t * 1e6, sp, "")
                        del made, call
                except Exception as e:  # noqa: BLE001 - one failing baseline must not stop the others
                    cache[k] = (None, None, None, f"baseline FAILED: {type(e).__name__}: {str(e)[:80]}")
                    traceback.print_exc()
                    torch.cuda.synchronize()
                torch.cuda.empty_cache()
            base_name, base_us, base_sp, note = cache[k]
        speedup = base_us / r["us"] if base_us and r.get("us") else None
        combined.append({**r, "baseline": base_name, "base_us": base_us, "base_spread": base_sp,
                         "speedup": speedup, "note": note})
        print(f"{r['name']:64s} ours {fmt(r.get('us'))} us  {base_name or '-'} {fmt(base_us)} us  "
              f"x{fmt(speedup, 3)} {note}", flush=True)
    if out_json:
        with open(out_json, "w") as fh:
            json.dump({"device": props.name, "rust_device": rust["device"], "copy_GBps": rust["copy_GBps"],
                       "ceilings": ceil, "rows": combined}, fh, indent=1)
    # The combined table last: what benchmarks/h200.md's tables are read from.
    print()
    print(f"Combined: ours through kernels::cuda::Gpu (Rust) against the baseline in the same device call; copy "
          f"{fmt(rust['copy_GBps'], 0)} GB/s (Gpu::copy), {ceil['torch_copy_GBps']:.0f} GB/s (torch); cuBLAS bf16 "
          f"{ceil['cublas_bf16_TFLOPs']:.0f} / FP8 {ceil['cublas_fp8_TFLOPs']:.0f} TFLOP/s")
    w = max(len(r["name"]) for r in combined) if combined else 10
    print(f"{'row':{w}s} | {'ours us':>9s} | {'±':>5s} | {'of copy':>7s} | {'TFLOP/s':>7s} | {'baseline':36s} | "
          f"{'base us':>9s} | {'x base':>6s}")
    for r in combined:
        print(f"{r['name']:{w}s} | {fmt(r.get('us')):>9s} | {fmt(r.get('spread'), 1, True):>5s} | "
              f"{fmt(r.get('of_copy'), 1, True):>7s} | {fmt(r.get('TFLOPs'), 1):>7s} | "
              f"{(r['baseline'] or r['note'] or '-')[:36]:36s} | {fmt(r['base_us']):>9s} | {fmt(r['speedup'], 3):>6s}")


if __name__ == "__main__":
    main()
