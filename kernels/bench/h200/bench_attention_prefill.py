"""Causal prefill attention (kernels/cuda/attention_prefill.cu) on the H200 against torch SDPA.

Usage (repo root): python3 kernels/bench/h200/bench_attention_prefill.py CARRY_DIR [--quick]
  CARRY_DIR holds attention_prefill.ptx (what `cargo build -p kernels --features cuda` embeds).

Cases, B = 1, bf16 in, bf16 out, scale 1/sqrt(D):
  - 24 q / 4 kv heads x 256 (Qwen3.8-27B) and 32 q / 8 kv x 128 (Qwen3-8B), causal, T = 1024, 4096, 16384:
    every built tiling of the head dim against SDPA with the flash backend forced (GQA through enable_gqa when the
    flash backend takes it, else K/V expanded to the query heads beforehand, outside the timing);
  - 32 q / 8 kv x 64 at T = 1024 and 16384 (the D64 tilings, whose default is not yet measured);
  - 24/4 x 256 with a sliding window of 1024 at T = 16384 against SDPA with an explicit boolean mask (the
    efficient backend, K/V expanded) and against our own full causal run (the window should skip most tiles);
  - chunked prefill (`attention_prefill_paged_*`): 2048 new tokens after a prefix of 8192 in a paged cache
    (16- and 64-token pages, shuffled), 24/4 x 256 and 32/8 x 128, against SDPA on the dense equivalent (q of the 2048
    new tokens against contiguous K/V of all 10240, lower-right causal mask: `causal_lower_right`, K/V expanded
    to the query heads outside the timing). Both are checked against the last 2048 rows of SDPA flash's full
    causal run over the 10240 tokens.
Every case prints the default tiling's time (`default_variant`, the mirror of PREFILL_DEFAULTS in
kernels/src/cuda/attention_prefill.rs) beside the best one's.
FLOPs counted: 4 * D * q_heads * (number of unmasked (query, key) pairs): 2 for Q K^T and 2 for P V per pair;
causal pairs = T (T + 1) / 2, windowed sum_i min(i + 1, W), chunked n P + n (n + 1) / 2. Same count for both arms.

Method: bench.py's (CUDA graphs of R launches rotating over input sets larger than L2, arms alternating, medians,
spreads). Each arm's output is checked against SDPA (relative Frobenius error; bf16 output, P rounded to bf16:
expect ~3e-3, flagged above 2e-2). A failing case is printed and the others still run. Writes
$OUT/bench_attention_prefill.json and prints a table last: ours (best tiling), baseline, ratio, TFLOP/s and the
fraction of the H200's dense bf16 peak (989 TFLOP/s, the spec figure; mma.sync cannot reach it, wgmma can).
"""

import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402  (reads sys.argv[1] as the PTX dir)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

MOD = "attention_prefill"
LOG2E = 1.4426950408889634
PEAK = 989e12  # H200 dense bf16 tensor peak (spec)
# Mirrors PREFILL_KERNELS in kernels/src/cuda/attention_prefill.rs.
VARIANTS = {
    64: ["M128_W1_N64_S3", "M128_W2_N64_S3", "M64_W1_N64_S3"],
    128: ["M128_W1_N64_S2", "M128_W2_N64_S2", "M128_W2_N32_S3", "M64_W1_N64_S2"],
    256: ["M64_W1_N32_S2", "M64_W1_N64_S2", "M128_W1_N64_S2"],
}
# Mirrors PREFILL_DEFAULTS there: (head dim, least row tiles, variant), first match wins; row tiles =
# total new tokens x q_heads / 128.
DEFAULTS = [
    (64, 0, "M128_W2_N64_S3"),
    (128, 384, "M128_W2_N64_S2"), (128, 0, "M64_W1_N64_S2"),
    (256, 384, "M128_W1_N64_S2"), (256, 0, "M64_W1_N64_S2"),
]


def default_variant(d, total, hq):
    tiles = total * hq // 128
    return next(v for dd, least, v in DEFAULTS if dd == d and tiles >= least)
dev = torch.device("cuda")
START = time.time()


def tiling(variant):
    parts = dict((p[0], int(p[1:])) for p in variant.split("_"))
    return parts["M"], parts["W"], parts["N"], parts["S"]


def kernel(d, variant, paged=False):
    bm, w, bn, st = tiling(variant)
    fn = b.kern(MOD, f"attention_prefill_{'paged_' if paged else ''}D{d}_{variant}")
    smem = (bm + 2 * st * bn) * d * 2  # AP_SMEM in the .cu
    b.allow_smem(fn, smem)
    return fn, bm, bm // (16 * w) * 32, smem


def launch_ours(fn, bm, threads, smem, q, k, v, out, t, hq, hkv, d, window, scale):
    g = hq // hkv
    grid = (math.ceil(t * g / bm), hkv, 1)
    w = window if (window is not None and window < t) else 0
    b.launch(fn, grid, (threads,), (b.ptr(q), b.ptr(k), b.ptr(v), b.ptr(out), np.uint64(0), np.int32(t), np.int32(t),
                                    np.int32(hq), np.int32(hkv), np.int32(w), np.float32(scale * LOG2E)), shared_mem=smem)


def pairs(t, window):
    if window is None or window >= t:
        return t * (t + 1) // 2
    w = window
    return w * (w + 1) // 2 + (t - w) * w


def rel(a, ref):
    a, ref = a.float(), ref.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).norm() / ref.norm()).item()


def checked(call, out, ref, what, against):
    """Runs call(0) into out (NaN-filled first) and returns its relative error against ref, logging a FAIL where
    it is not below 2e-2."""
    out.fill_(float("nan"))
    call(0)
    torch.cuda.synchronize()
    err = rel(out, ref)
    if not err < 2e-2:
        b.log(f"  FAIL {what}: rel err vs {against} {err:.2e}")
    return err


def sdpa_flash_fn(qs, ks, vs, hq, hkv):
    """Returns (call(i) -> out [1, hq, t, d], label): flash backend, GQA native when accepted, else expanded K/V."""
    def native(i):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], is_causal=True, enable_gqa=True)
    try:
        native(0)
        return native, "SDPA flash (enable_gqa)", None
    except Exception as e:  # noqa: BLE001
        b.log(f"  note: flash refused enable_gqa ({type(e).__name__}: {str(e)[:120]}); expanding K/V")
    g = hq // hkv
    kx = [x.repeat_interleave(g, dim=1) for x in ks]
    vx = [x.repeat_interleave(g, dim=1) for x in vs]

    def expanded(i):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qs[i], kx[i], vx[i], is_causal=True)
    expanded(0)
    return expanded, "SDPA flash (K/V expanded)", (kx, vx)


SUMMARY = []


def case(hq, hkv, d, t, window=None):
    label = f"{hq}q/{hkv}kv x{d} T={t}" + (f" W={window}" if window else " causal")
    scale = 1.0 / math.sqrt(d)
    qb = t * hq * d * 2
    kvb = 2 * t * hkv * d * 2
    sets = b.n_sets(qb * 2 + kvb)
    # Our layout [t, heads, d]; SDPA sees the same memory as [1, heads, t, d] (strided views, last dim contiguous).
    q = [torch.randn(t, hq, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    k = [torch.randn(t, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    v = [torch.randn(t, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    out = torch.empty(t, hq, d, device=dev, dtype=torch.bfloat16)
    qs = [x.view(1, t, hq, d).transpose(1, 2) for x in q]
    ks = [x.view(1, t, hkv, d).transpose(1, 2) for x in k]
    vs = [x.view(1, t, hkv, d).transpose(1, 2) for x in v]
    flops = 4.0 * d * hq * pairs(t, window)
    reps = max(2, min(40, int(0.03 / max(flops / 300e12, 1e-6))))  # ~30 ms per graph at 300 TFLOP/s

    arms, errs = {}, {}
    if window is None:
        base, base_name, keep = sdpa_flash_fn(qs, ks, vs, hq, hkv)
        ref = base(0).transpose(1, 2).reshape(t, hq, d)
    else:
        g = hq // hkv
        kx = [x.repeat_interleave(g, dim=1) for x in ks]
        vx = [x.repeat_interleave(g, dim=1) for x in vs]
        i_ = torch.arange(t, device=dev)
        mask = (i_[None, :] <= i_[:, None]) & (i_[:, None] - i_[None, :] < window)

        def base(i):
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], kx[i], vx[i], attn_mask=mask)
        base_name = "SDPA efficient + mask"
        ref = base(0).transpose(1, 2).reshape(t, hq, d)
    torch.cuda.synchronize()
    arms["sdpa"] = base

    for variant in VARIANTS[d]:
        try:
            fn, bm, threads, smem = kernel(d, variant)

            def call(i, fn=fn, bm=bm, threads=threads, smem=smem):
                launch_ours(fn, bm, threads, smem, q[i], k[i], v[i], out, t, hq, hkv, d, window, scale)
            errs[variant] = checked(call, out, ref, f"{label} {variant}", base_name)
            arms[variant] = call
        except Exception as e:  # noqa: BLE001
            b.log(f"  FAIL {label} {variant}: {type(e).__name__}: {e}")
    if window is not None:
        # Our full causal run of the same inputs: what the window saves.
        fn, bm, threads, smem = kernel(d, VARIANTS[d][0])
        causal_out = torch.empty_like(out)

        def causal(i):
            launch_ours(fn, bm, threads, smem, q[i], k[i], v[i], causal_out, t, hq, hkv, d, None, scale)
        arms["ours_causal"] = causal
    res = b.time_arms(arms, sets, reps)
    good = [vn for vn in VARIANTS[d] if vn in res and errs.get(vn, 1) < 2e-2]
    for vn in VARIANTS[d]:
        if vn in res:
            b.row("attn_prefill_var", f"{label} {vn}", res[vn], base_name, res["sdpa"], flops=flops,
                  note=f"rel err {errs.get(vn, float('nan')):.1e}")
    if not good:
        SUMMARY.append((label, None, base_name, res["sdpa"], None, flops))
        return
    best = min(good, key=lambda vn: res[vn][0])
    default = default_variant(d, t, hq)
    dflt = res[default][0] if default in res else float("nan")
    r = b.row("attn_prefill", label, res[best], base_name, res["sdpa"], flops=flops, target=">=0.8x SDPA flash",
              note=f"best tiling {best} (default {default}: {dflt*1e6:.1f} us), rel err {errs[best]:.1e}")
    r["best_variant"] = best
    r["default_variant"] = default
    r["default_us"] = dflt * 1e6
    if window is not None:
        b.row("attn_prefill_win", f"{label} vs own causal", res[best], "ours causal (same T)", res["ours_causal"],
              flops=flops, note="window skips tiles below the band")
    SUMMARY.append((label, best, base_name, res["sdpa"], res[best], flops, default, dflt))


def paged_case(hq, hkv, d, prefix, n, page_size=16):
    """Chunked prefill: n new tokens after `prefix` cached ones in a shuffled paged cache."""
    label = f"{hq}q/{hkv}kv x{d} P={prefix}+{n} paged" + ("" if page_size == 16 else f" page {page_size}")
    scale = 1.0 / math.sqrt(d)
    g = hq // hkv
    tot = prefix + n
    pages = math.ceil(tot / page_size)
    num_pages = pages + 7
    kv_bytes = 2 * tot * hkv * d * 2
    sets = b.n_sets(kv_bytes * (1 + g) + 2 * n * hq * d * 2)
    gen = torch.Generator(device=dev).manual_seed(1234)
    qf, kf, vf, kc, vc, tables, kx, vx = [], [], [], [], [], [], [], []
    for _ in range(sets):
        # The whole history (prefix + new) in our layout; the cache holds the prefix rows through a shuffled table.
        qf.append(torch.randn(tot, hq, d, device=dev, dtype=torch.bfloat16, generator=gen))
        kf.append(torch.randn(tot, hkv, d, device=dev, dtype=torch.bfloat16, generator=gen))
        vf.append(torch.randn(tot, hkv, d, device=dev, dtype=torch.bfloat16, generator=gen))
        perm = torch.randperm(num_pages, device=dev, generator=gen)[:pages]
        padded = pages * page_size
        for src, dst in ((kf[-1], kc), (vf[-1], vc)):
            cache = torch.full((num_pages, hkv, page_size, d), float("nan"), device=dev, dtype=torch.bfloat16)
            rows = torch.zeros(padded, hkv, d, device=dev, dtype=torch.bfloat16)
            rows[:prefix] = src[:prefix]  # only the prefix is cached; the new rows come from k / v
            cache[perm] = rows.view(pages, page_size, hkv, d).transpose(1, 2)
            dst.append(cache)
        tables.append(perm.to(torch.int32).contiguous())
        kx.append(kf[-1].view(1, tot, hkv, d).transpose(1, 2).repeat_interleave(g, dim=1))
        vx.append(vf[-1].view(1, tot, hkv, d).transpose(1, 2).repeat_interleave(g, dim=1))
    qn = [x[prefix:] for x in qf]  # [n, hq, d] views, contiguous
    kn = [x[prefix:] for x in kf]
    vn = [x[prefix:] for x in vf]
    pre = torch.tensor([prefix], device=dev, dtype=torch.int32)
    cu = torch.tensor([0, n], device=dev, dtype=torch.int32)
    out = torch.empty(n, hq, d, device=dev, dtype=torch.bfloat16)
    # Reference: SDPA flash over the whole history, causal, its last n rows.
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        full = F.scaled_dot_product_attention(qf[0].view(1, tot, hq, d).transpose(1, 2), kx[0], vx[0], is_causal=True)
    ref = full.transpose(1, 2).reshape(tot, hq, d)[prefix:]
    del full
    from torch.nn.attention.bias import causal_lower_right
    bias = causal_lower_right(n, tot)
    qs = [x.view(1, n, hq, d).transpose(1, 2) for x in qn]

    def base(i):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(qs[i], kx[i], vx[i], attn_mask=bias)
    base_name = "SDPA lower-right (dense)"
    try:
        base(0)
    except Exception as e:  # noqa: BLE001
        b.log(f"  note {label}: causal_lower_right refused ({type(e).__name__}: {str(e)[:120]}); explicit mask")
        i_ = torch.arange(n, device=dev)[:, None] + prefix
        mask = torch.arange(tot, device=dev)[None, :] <= i_

        def base(i):
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], kx[i], vx[i], attn_mask=mask)
        base_name = "SDPA efficient + mask (dense)"
    berr = rel(base(0).transpose(1, 2).reshape(n, hq, d), ref)
    if not berr < 2e-2:
        b.log(f"  note {label}: the baseline differs from the reference by {berr:.2e} (mask alignment?)")
    flops = 4.0 * d * hq * (n * prefix + n * (n + 1) // 2)
    reps = max(2, min(40, int(0.03 / max(flops / 300e12, 1e-6))))
    arms, errs = {"sdpa": base}, {}
    for variant in VARIANTS[d]:
        try:
            fn, bm, threads, smem = kernel(d, variant, paged=True)

            def call(i, fn=fn, bm=bm, threads=threads, smem=smem):
                grid = (math.ceil(n * g / bm), hkv, 1)
                b.launch(fn, grid, (threads,), (
                    b.ptr(qn[i]), b.ptr(kn[i]), b.ptr(vn[i]), b.ptr(out), b.ptr(cu), np.int32(n), np.int32(n),
                    np.int32(hq), np.int32(hkv), np.int32(0), np.float32(scale * LOG2E), b.ptr(kc[i]), b.ptr(vc[i]),
                    b.ptr(tables[i]), b.ptr(pre), np.int32(page_size), np.int32(pages), np.int32(num_pages)),
                    shared_mem=smem)
            errs[variant] = checked(call, out, ref, f"{label} {variant}", "the full-history reference")
            arms[variant] = call
        except Exception as e:  # noqa: BLE001
            b.log(f"  FAIL {label} {variant}: {type(e).__name__}: {e}")
    res = b.time_arms(arms, sets, reps)
    for vn in VARIANTS[d]:
        if vn in res:
            b.row("attn_prefill_pvar", f"{label} {vn}", res[vn], base_name, res["sdpa"], flops=flops,
                  note=f"rel err {errs.get(vn, float('nan')):.1e}")
    good = [vn for vn in VARIANTS[d] if vn in res and errs.get(vn, 1) < 2e-2]
    if not good:
        SUMMARY.append((label, None, base_name, res["sdpa"], None, flops, None, float("nan")))
        return
    best = min(good, key=lambda vn: res[vn][0])
    default = default_variant(d, n, hq)
    dflt = res[default][0] if default in res else float("nan")
    r = b.row("attn_prefill_paged", label, res[best], base_name, res["sdpa"], flops=flops,
              target=">=0.8x SDPA on the dense equivalent",
              note=f"best tiling {best} (default {default}: {dflt*1e6:.1f} us), rel err {errs[best]:.1e},"
                   f" baseline rel err {berr:.1e}")
    r["best_variant"] = best
    r["default_variant"] = default
    r["default_us"] = dflt * 1e6
    SUMMARY.append((label, best, base_name, res["sdpa"], res[best], flops, default, dflt))


def main():
    quick = "--quick" in sys.argv
    ts = [1024, 4096] if quick else [1024, 4096, 16384]
    cases = [(24, 4, 256, t, None) for t in ts] + [(32, 8, 128, t, None) for t in ts]
    cases += [(32, 8, 64, t, None) for t in ([1024, 16384] if not quick else [1024])]
    cases.append((24, 4, 256, 16384 if not quick else 4096, 1024))
    for c in cases:
        try:
            case(*c)
        except Exception:  # noqa: BLE001
            b.log(f"FAIL case {c}:\n{traceback.format_exc()}")
        torch.cuda.empty_cache()
    # Pages of 16 (the cases) and of 64 (the decode benchmark's pages; a 64-key tile in one page).
    for c in [(24, 4, 256, 8192, 2048), (32, 8, 128, 8192, 2048), (24, 4, 256, 8192, 2048, 64),
              (32, 8, 128, 8192, 2048, 64)]:
        try:
            paged_case(*c)
        except Exception:  # noqa: BLE001
            b.log(f"FAIL paged case {c}:\n{traceback.format_exc()}")
        torch.cuda.empty_cache()
    b.log("")
    b.log(f"{'case':38s} {'ours us':>10s} {'baseline':>26s} {'base us':>10s} {'ratio':>7s} {'TFLOP/s':>8s}"
          f" {'of peak':>7s}  {'best tiling':15s} {'default':15s} {'dflt us':>9s}")
    for label, best, base_name, base, ours, flops, default, dflt in SUMMARY:
        if ours is None:
            b.log(f"{label:38s} {'FAILED':>10s} {base_name:>26s} {base[0]*1e6:10.1f}")
            continue
        b.log(f"{label:38s} {ours[0]*1e6:10.1f} {base_name:>26s} {base[0]*1e6:10.1f} {base[0]/ours[0]:7.3f}"
              f" {flops/ours[0]/1e12:8.1f} {flops/ours[0]/PEAK*100:6.1f}%  {best:15s} {default:15s} {dflt*1e6:9.1f}")
    b.log(f"(ratio = baseline time / ours; >= 0.8 is the target; {time.time() - START:.0f} s)")
    path = os.path.join(b.OUT, "bench_attention_prefill.json")
    with open(path, "w") as f:
        json.dump(b.ROWS, f, indent=1)


if __name__ == "__main__":
    main()
