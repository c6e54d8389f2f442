"""Attention decode on the H200: the tiled tensor-core kernels of kernels/cuda/attention.cu (attention_decode_tiled_*,
attention_decode_ring_*, three tilings) against our current tensor-core kernel (attention_decode_tc_*, what
KernelPath::Auto runs) and SDPA with the flash backend on a dense copy of the same tokens.

    python3 kernels/bench/h200/bench_attention_decode.py CARRY_DIR [--quick]

CARRY_DIR holds attention.ptx (loaded by cupy, JIT for the card). Cases: Qwen3.8-27B full attention (24 query / 4 KV
heads x 256) over a paged bf16 cache (pages of 64 tokens, randomly permuted) at 4k/8k/32k/64k/128k context with
B=1, then B=8 at 8k and B=32 at 4k; a sliding-window ring (Spark-X2.5-4B's sliding layers, 16/4 x 256, and
Gemma-3-1B's, 4/1 x 256) at windows 1024 and 4096. "% copy" counts K and V once (bytes of the attended tokens) over
the time, against a 256 MiB float32 copy_ measured in this run (read + write). Every arm's output is checked
against SDPA in fp32 on the same bf16 K/V (NaN-poisoned before each check). A failing case is printed and the
others still run. Writes $OUT/bench_attention_decode.json; prints a short table last.
"""
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402  (reads sys.argv[1] as the PTX directory)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

dev = torch.device("cuda")
# (tokens per stage, stages): Gpu::DECODE_TILINGS in kernels/src/cuda/attention.rs, the first is the default.
TILINGS = [(32, 3), (16, 4), (32, 2)]
RESULTS = []


def load_attention_module():
    """The sm_90 cubin the crate embeds when CARRY_DIR has it (no driver JIT of ~60 kernels, and the exact code the
    Rust tests load), else the PTX as bench.py does."""
    import cupy as cp

    cubin = os.path.join(b.PTX, "attention.sm_90.cubin")
    if os.path.exists(cubin) and "attention" not in b.mods:
        try:
            b.mods["attention"] = cp.RawModule(path=cubin)
            b.log(f"loaded {cubin}")
        except Exception as e:  # noqa: BLE001
            b.log(f"  note: loading {cubin} failed ({e}); using the PTX")


def tiled_smem(d, tile, stages):
    # cuda/attention.cu TiledGeom::SMEM, as kernels/src/cuda/device/attention.rs tiled_smem.
    return stages * 2 * tile * d * 2 + 2 * 4 * 32 * (tile // 8) * 2 * 4 + stages * 4 * 4


def tiled_splits(sms, blocks, d, tile, stages, max_tokens):
    # kernels/src/cuda/device/attention.rs Device::tiled_splits.
    per_sm = min(4, max(1, 228 * 1024 // (tiled_smem(d, tile, stages) + 1024)))
    want = math.ceil(per_sm * sms / max(blocks, 1))
    return max(1, min(1024, min(want, math.ceil(max_tokens / (2 * tile)))))


def tiled_kernel(kind, d, tile, stages):
    fn = b.kern("attention", f"attention_decode_{kind}_D{d}_T{tile}_S{stages}")
    b.allow_smem(fn, tiled_smem(d, tile, stages))
    return fn


def rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


def sdpa_arm(qb, kd, vd):
    def call(i):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qb[i], kd[i], vd[i], enable_gqa=True)

    return call


def record(case, arm, t, spread, kv_bytes, copy_bw, err, base_t, sdpa_t, note=""):
    r = {"case": case, "arm": arm, "us": t * 1e6, "spread": spread, "GBps": kv_bytes / t / 1e9,
         "frac_copy": kv_bytes / t / copy_bw, "rel_err_vs_fp32_sdpa": err,
         "vs_current": base_t / t if base_t else float("nan"), "vs_sdpa": sdpa_t / t if sdpa_t else float("nan"),
         "note": note}
    RESULTS.append(r)
    b.log(f"  {arm:22s} {t*1e6:9.2f} us (±{spread*100:4.1f}%)  {r['GBps']:6.0f} GB/s = {r['frac_copy']*100:5.1f}% copy"
          f"  x{r['vs_current']:.2f} current  x{r['vs_sdpa']:.2f} SDPA  err {err:.1e} {note}")


def check(err, arm, case):
    if not (err < 1e-2):  # bf16 q and P: ~3e-3 expected (benchmarks/h200.md)
        b.log(f"  FAIL {case} {arm}: relative error {err:.2e} vs fp32 SDPA")
        return "FAIL"
    return ""


def paged_case(copy_bw, sms, seqs, ctx, hq=24, hkv=4, d=256, page=64):
    case = f"paged B={seqs} ctx={ctx} {hq}q/{hkv}kv x{d}"
    b.log(case)
    scale = 1.0 / math.sqrt(d)
    pages_per = ctx // page
    pages = seqs * pages_per
    kv_bytes = 2 * seqs * ctx * hkv * d * 2
    sets = b.n_sets(kv_bytes)
    kc = [torch.randn(pages, hkv, page, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    vc = [torch.randn(pages, hkv, page, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    table = torch.randperm(pages, device=dev, dtype=torch.int32).view(seqs, pages_per).contiguous()
    lens = torch.full((seqs,), ctx, device=dev, dtype=torch.int32)
    q = [torch.randn(seqs, hq, d, device=dev) for _ in range(sets)]
    out = torch.empty(seqs, hq, d, device=dev)
    # Current kernel, as bench.py runs it (one wave of 5 blocks per SM).
    splits_tc = max(1, min(math.ceil(5 * sms / (hkv * seqs)), math.ceil(ctx / 64)))
    split_t = {t: tiled_splits(sms, seqs * hkv, d, t[0], t[1], pages_per * page) for t in TILINGS}
    ws = torch.empty(seqs * hq * max([splits_tc] + list(split_t.values())) * (d + 2), device=dev)
    fcomb = b.kern("attention", f"attention_decode_combine_D{d}")
    ftc = b.kern("attention", f"attention_decode_tc_D{d}")

    def args(i):
        return (b.ptr(q[i]), b.ptr(kc[i]), b.ptr(vc[i]), b.ptr(table), b.ptr(lens), np.float32(scale), b.ptr(out),
                b.ptr(ws), np.int32(hq), np.int32(hkv), np.int32(page), np.int32(pages), np.int32(pages_per))

    def make(fn, splits, smem):
        def call(i):
            b.launch(fn, (splits, hkv, seqs), (128,), args(i), shared_mem=smem)
            if splits > 1:
                b.launch(fcomb, (hq, seqs), (d, 4), (b.ptr(ws), b.ptr(out), np.int32(hq), np.int32(splits)))
        return call

    arms = {"current tc": make(ftc, splits_tc, 0)}
    for t in TILINGS:
        arms[f"tiled T{t[0]}S{t[1]}"] = make(tiled_kernel("tiled", d, *t), split_t[t], tiled_smem(d, *t))
    kd = [kc[i][table.long()].permute(0, 2, 1, 3, 4).reshape(seqs, hkv, ctx, d).contiguous() for i in range(sets)]
    vd = [vc[i][table.long()].permute(0, 2, 1, 3, 4).reshape(seqs, hkv, ctx, d).contiguous() for i in range(sets)]
    qb = [q[i].to(torch.bfloat16).view(seqs, hq, 1, d) for i in range(sets)]
    ref = F.scaled_dot_product_attention(qb[0].float(), kd[0].float(), vd[0].float(), enable_gqa=True)
    errs = {}
    for name, call in arms.items():
        out.fill_(float("nan"))
        call(0)
        torch.cuda.synchronize()
        errs[name] = rel(out.view(seqs, hq, 1, d), ref)
    arms["sdpa flash"] = sdpa_arm(qb, kd, vd)
    errs["sdpa flash"] = rel(arms["sdpa flash"](0), ref)
    res = b.time_arms(arms, sets, 40)
    base_t, sdpa_t = res["current tc"][0], res["sdpa flash"][0]
    for name, (t, sp) in res.items():
        note = check(errs[name], name, case)
        if name.startswith("tiled"):
            tl = tuple(int(x) for x in name[7:].split("S"))
            note += f" splits {split_t[tl]}"
        elif name == "current tc":
            note += f" splits {splits_tc}"
        record(case, name, t, sp, kv_bytes, copy_bw, errs[name], base_t, sdpa_t, note.strip())
    del kc, vc, kd, vd, q, qb
    torch.cuda.empty_cache()


def ring_case(copy_bw, sms, seqs, window, hq, hkv, d=256, model=""):
    case = f"ring B={seqs} W={window} {hq}q/{hkv}kv x{d} {model}"
    b.log(case)
    scale = 1.0 / math.sqrt(d)
    slots = window - 1
    kv_bytes = 2 * seqs * window * hkv * d * 2
    sets = b.n_sets(kv_bytes)
    kr = [torch.randn(seqs, hkv, slots, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    vr = [torch.randn(seqs, hkv, slots, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    kcur = [torch.randn(seqs, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    vcur = [torch.randn(seqs, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    # Positions past the window: every slot is valid (the steady state of a long generation).
    pos = torch.full((seqs,), 10 * window + 7, device=dev, dtype=torch.int32)
    q = [torch.randn(seqs, hq, d, device=dev) for _ in range(sets)]
    out = torch.empty(seqs, hq, d, device=dev)
    split_t = {t: tiled_splits(sms, seqs * hkv, d, t[0], t[1], window) for t in TILINGS}
    ws = torch.empty(seqs * hq * max(split_t.values()) * (d + 2), device=dev)
    fcomb = b.kern("attention", f"attention_decode_combine_D{d}")

    def make(fn, splits, smem):
        def call(i):
            b.launch(fn, (splits, hkv, seqs), (128,),
                     (b.ptr(q[i]), b.ptr(kr[i]), b.ptr(vr[i]), b.ptr(kcur[i]), b.ptr(vcur[i]), b.ptr(pos),
                      np.float32(scale), b.ptr(out), b.ptr(ws), np.int32(hq), np.int32(hkv), np.int32(slots)),
                     shared_mem=smem)
            if splits > 1:
                b.launch(fcomb, (hq, seqs), (d, 4), (b.ptr(ws), b.ptr(out), np.int32(hq), np.int32(splits)))
        return call

    arms = {f"ring T{t[0]}S{t[1]}": make(tiled_kernel("ring", d, *t), split_t[t], tiled_smem(d, *t))
            for t in TILINGS}
    kd = [torch.cat([kr[i], kcur[i].unsqueeze(2)], dim=2) for i in range(sets)]
    vd = [torch.cat([vr[i], vcur[i].unsqueeze(2)], dim=2) for i in range(sets)]
    qb = [q[i].to(torch.bfloat16).view(seqs, hq, 1, d) for i in range(sets)]
    ref = F.scaled_dot_product_attention(qb[0].float(), kd[0].float(), vd[0].float(), enable_gqa=True)
    errs = {}
    for name, call in arms.items():
        out.fill_(float("nan"))
        call(0)
        torch.cuda.synchronize()
        errs[name] = rel(out.view(seqs, hq, 1, d), ref)
    arms["sdpa flash"] = sdpa_arm(qb, kd, vd)
    errs["sdpa flash"] = rel(arms["sdpa flash"](0), ref)
    res = b.time_arms(arms, sets, 40)
    sdpa_t = res["sdpa flash"][0]
    for name, (t, sp) in res.items():
        note = check(errs[name], name, case)
        if name.startswith("ring"):
            tl = tuple(int(x) for x in name[6:].split("S"))
            note += f" splits {split_t[tl]}"
        record(case, name, t, sp, kv_bytes, copy_bw, errs[name], None, sdpa_t, note.strip())
    del kr, vr, kcur, vcur, kd, vd, q, qb
    torch.cuda.empty_cache()


def main():
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    b.log(f"device: {props.name}, {sms} SMs, torch {torch.__version__}")
    load_attention_module()
    nbytes = 1 << 28
    a = torch.randn(nbytes // 4, device=dev)
    c = torch.empty_like(a)
    res = b.time_arms({"copy": lambda i: c.copy_(a)}, 1, 10)
    copy_bw = 2 * nbytes / res["copy"][0]
    del a, c
    torch.cuda.empty_cache()
    b.log(f"copy 256 MiB float32: {copy_bw/1e12:.3f} TB/s (read + write), the ceiling below")
    cases = [("paged", 1, ctx) for ctx in ([4096, 32768] if b.QUICK else [4096, 8192, 32768, 65536, 131072])]
    cases += [("paged", 8, 8192), ("paged", 32, 4096)]
    cases += [("ring", 1, 1024, 16, 4, "spark-x2.5-4b"), ("ring", 1, 4096, 16, 4, "spark-x2.5-4b"),
              ("ring", 8, 4096, 16, 4, "spark-x2.5-4b"), ("ring", 32, 1024, 4, 1, "gemma-3-1b")]
    for cs in cases:
        try:
            if cs[0] == "paged":
                paged_case(copy_bw, sms, cs[1], cs[2])
            else:
                ring_case(copy_bw, sms, cs[1], cs[2], cs[3], cs[4], model=cs[5])
        except Exception as e:  # noqa: BLE001 - one failing case must not stop the others
            b.log(f"  CASE FAILED {cs}: {type(e).__name__}: {e}")
            b.log(traceback.format_exc())
            RESULTS.append({"case": str(cs), "arm": "error", "note": f"{type(e).__name__}: {e}"})
            torch.cuda.synchronize()
        b.log(f"  [{time.time()-t0:.0f}s]")
    with open(os.path.join(b.OUT, "bench_attention_decode.json"), "w") as fh:
        json.dump({"device": props.name, "copy_GBps": copy_bw / 1e9, "rows": RESULTS}, fh, indent=1)
    # The short table, last: per case the best tiled arm against our current kernel and SDPA.
    print()
    print(f"H200 copy {copy_bw/1e12:.2f} TB/s. Best tiled arm per case (ours) vs the current tensor-core kernel "
          "(paged only) and SDPA flash (dense copy).")
    print(f"{'case':44s}|{'best arm':15s}|{'ours us':>8s}|{'current':>8s}|{'x cur':>6s}|{'SDPA us':>8s}|"
          f"{'x SDPA':>7s}|{'%copy':>6s}|{'SDPA %':>6s}|{'err':>7s}")
    by_case = {}
    for r in RESULTS:
        by_case.setdefault(r["case"], []).append(r)
    for case, rows in by_case.items():
        ours = [r for r in rows if r["arm"].startswith(("tiled", "ring"))]
        if not ours:
            print(f"{case:44s}| failed: {rows[-1].get('note', '')}")
            continue
        best = min(ours, key=lambda r: r["us"])
        cur = next((r for r in rows if r["arm"] == "current tc"), None)
        sd = next((r for r in rows if r["arm"] == "sdpa flash"), None)
        print(f"{case:44s}|{best['arm']:15s}|{best['us']:8.2f}|{cur['us'] if cur else float('nan'):8.2f}|"
              f"{best['vs_current']:6.2f}|{sd['us'] if sd else float('nan'):8.2f}|{best['vs_sdpa']:7.2f}|"
              f"{best['frac_copy']*100:6.1f}|{sd['frac_copy']*100 if sd else float('nan'):6.1f}|"
              f"{max(r['rel_err_vs_fp32_sdpa'] for r in ours):7.1e}")
    print(f"[{time.time()-t0:.0f}s total]")


if __name__ == "__main__":
    main()
