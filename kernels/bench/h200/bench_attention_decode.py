"""Attention decode on the H200: the tiled tensor-core kernels of kernels/cuda/attention.cu (attention_decode_tiled_*,
attention_decode_ring_*, three tilings) against SDPA with the flash backend on a dense copy of the same tokens.

    python3 kernels/bench/h200/bench_attention_decode.py CARRY_DIR [--quick]

CARRY_DIR holds attention.sm_90.cubin or attention.ptx. Cases: Qwen3.8-27B full attention (24 query / 4 KV heads x
256) over a paged bf16 cache (pages of 64 tokens, randomly permuted) at 4k/8k/32k/64k/128k context with B=1, then
B=8 at 8k and B=32 at 4k; a sliding-window ring (Spark-X2.5-4B's sliding layers, 16/4 x 256, and Gemma-3-1B's, 4/1
x 256) at windows 1024 and 4096.

Arms per case: "auto" is exactly what KernelPath::Auto (paged) / attention_decode_ring (ring) launch: tiling
Gpu::DECODE_AUTO_TILING = (16, 4) (paged) / Gpu::DECODE_RING_TILING = (32, 2) (ring) with Gpu::decode_auto_splits (one
wave of two blocks per SM: floor(slots / pairs)) and the combine kernel Gpu::DECODE_AUTO_SLICED_COMBINE picks
(block: attention_decode_combine_D*, one block per (sequence, query head); sliced: attention_decode_combine_sliced_D*,
one block per 64 columns of it, 1-16 warps with every load of a chunk in flight), launched as the split kernel's
programmatic dependent (PDL, `b.launch_pdl`; every arm's combine is, as in the crate; "auto no-pdl" launches both
kernels plainly). "auto ... sliced" / "auto ...
block" is the same split kernel and split count with the other combine: the pair decides
Gpu::DECODE_AUTO_SLICED_COMBINE. The other two tilings run with both combines ("T32S2" on the paged cases is the
previous Auto); "s=K" arms try other split counts on the auto tiling with both combines; "auto
no-combine" times the split kernel alone (output not final, not checked, never "best"): an arm minus it is its
combine kernel's cost ("comb us" and "sliced comb us" in the table). "% copy" counts K and V once (bytes of the
attended tokens) over the time, against a 256 MiB float32 copy_ measured in this run (read + write). Every arm's
output is checked against SDPA in fp32 on the same bf16 K/V (NaN-poisoned before each check). A failing case is
printed and the others still run. Writes $OUT/bench_attention_decode.json; prints a short table last.
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
# (tokens per stage, stages): Gpu::DECODE_TILINGS in kernels/src/cuda/attention.rs.
TILINGS = [(32, 3), (16, 4), (32, 2)]
AUTO_TILING = {"paged": (16, 4), "ring": (32, 2)}  # Gpu::DECODE_AUTO_TILING, Gpu::DECODE_RING_TILING
AUTO_SLICED = True  # Gpu::DECODE_AUTO_SLICED_COMBINE
# The crate launches every combine as the split kernel's programmatic dependent (Device::launch_pdl):
# every arm's combine here does the same ("+pdlc"), but "auto no-pdl" (both kernels launched plainly).
PDL_COMBINE = "+pdlc"
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
    # cuda/attention.cu TiledGeom::SMEM, as kernels/src/cuda/attention.rs tiled_smem.
    return stages * 2 * tile * d * 2 + 2 * 4 * 32 * (tile // 8) * 2 * 4 + stages * 4 * 4


def per_sm(d, tile, stages):
    # Gpu::decode_auto_splits uses at most two blocks per SM (the fastest split count everywhere).
    return min(2, max(1, 228 * 1024 // (tiled_smem(d, tile, stages) + 1024)))


def auto_splits(sms, pairs, d, tile, stages, max_tokens):
    # kernels/src/cuda/attention.rs Gpu::decode_auto_splits: one wave, floor.
    one_wave = per_sm(d, tile, stages) * sms // max(pairs, 1)
    return max(1, min(1024, min(one_wave, math.ceil(max_tokens / (2 * tile)))))


def sliced_warps(splits):
    # kernels/src/cuda/attention.rs sliced_combine_warps: one warp per 4 splits, 1 to 16.
    return max(1, min(16, math.ceil(splits / 4)))


def combine_names(sliced):
    return "sliced" if sliced else "block"


def arm_plan(sms, pairs, d, max_tokens, kind):
    """{arm name: (tiling, splits, mode)} for one case; mode "block" / "sliced" (split kernel + that combine kernel)
    or "none" (the split kernel alone, not checked). The first arm is Auto."""
    plan = {}
    at = AUTO_TILING[kind]
    auto_mode, other_mode = combine_names(AUTO_SLICED) + PDL_COMBINE, combine_names(not AUTO_SLICED) + PDL_COMBINE
    s_auto = auto_splits(sms, pairs, d, *at, max_tokens)
    plan[f"auto T{at[0]}S{at[1]}"] = (at, s_auto, auto_mode)
    if s_auto > 1:
        plan[f"auto T{at[0]}S{at[1]} {other_mode}"] = (at, s_auto, other_mode)
    for t in TILINGS:
        if t != at:
            s_t = auto_splits(sms, pairs, d, *t, max_tokens)
            plan[f"T{t[0]}S{t[1]}"] = (t, s_t, "block" + PDL_COMBINE)
            if s_t > 1:
                plan[f"T{t[0]}S{t[1]} sliced"] = (t, s_t, "sliced" + PDL_COMBINE)
    most = max(1, math.ceil(max_tokens / (2 * at[0])))
    alts = {max(1, s_auto // 2), max(1, (2 * s_auto) // 3), min(most, (4 * s_auto) // 3), min(most, 2 * s_auto)}
    if pairs >= 32:
        alts |= {1, 2}
    for s in sorted(alts - {s_auto}):
        plan[f"s={s}"] = (at, s, auto_mode)
        if s > 1:  # a cheaper combine may move the best split count
            plan[f"s={s} {other_mode}"] = (at, s, other_mode)
    if s_auto > 1:
        plan["auto no-combine"] = (at, s_auto, "none")
        # Without programmatic dependent launch: both kernels plainly. (Launching the split kernels as dependents
        # too, "+pdl", lost: 43.13 against 39.18 us at 32k, 149.1 against 127.6 at 128k.)
        plan["auto no-pdl"] = (at, s_auto, combine_names(AUTO_SLICED))
    return plan


def combine_launcher(mode, d, ws, out, hq, seqs, splits):
    """A call that launches the combine kernel of `mode` ("block" / "sliced") over `splits` partials as the crate
    does (kernels/src/cuda/attention.rs attention_combine); None for "none" or one split."""
    if mode == "none" or splits <= 1:
        return None
    mode, _, pdl = mode.partition("+")
    go = b.launch_pdl if pdl else b.launch
    args = (b.ptr(ws), b.ptr(out), np.int32(hq), np.int32(splits))
    if mode == "sliced":
        fn = b.kern("attention", f"attention_decode_combine_sliced_D{d}")
        grid, block = (hq * d // 64, seqs), (32, sliced_warps(splits))
    else:
        fn = b.kern("attention", f"attention_decode_combine_D{d}")
        grid, block = (hq, seqs), (d, 4)
    return lambda: go(fn, grid, block, args)


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


def record(case, arm, t, spread, kv_bytes, copy_bw, err, auto_t, sdpa_t, splits=None, note=""):
    r = {"case": case, "arm": arm, "us": t * 1e6, "spread": spread, "GBps": kv_bytes / t / 1e9,
         "frac_copy": kv_bytes / t / copy_bw, "rel_err_vs_fp32_sdpa": err, "splits": splits,
         "vs_auto": auto_t / t if auto_t else float("nan"), "vs_sdpa": sdpa_t / t if sdpa_t else float("nan"),
         "note": note}
    RESULTS.append(r)
    b.log(f"  {arm:22s} {t*1e6:9.2f} us (±{spread*100:4.1f}%)  {r['GBps']:6.0f} GB/s = {r['frac_copy']*100:5.1f}% copy"
          f"  x{r['vs_auto']:.2f} auto  x{r['vs_sdpa']:.2f} SDPA  err {err:.1e} {note}")


def check(err, arm, case):
    if not (err < 1e-2):  # bf16 q and P: ~3e-3 expected (benchmarks/h200.md)
        b.log(f"  FAIL {case} {arm}: relative error {err:.2e} vs fp32 SDPA")
        return "FAIL"
    return ""


def run_arms(case, plan, make, qb, kd, vd, out, seqs, hq, d, sets, kv_bytes, copy_bw):
    """Checks every arm of `plan` (but the no-combine one) against fp32 SDPA, times them all with SDPA flash
    alternating, records the rows."""
    ref = F.scaled_dot_product_attention(qb[0].float(), kd[0].float(), vd[0].float(), enable_gqa=True)
    arms, errs = {}, {}
    for name, (tiling, splits, mode) in plan.items():
        try:
            arms[name] = make(tiling, splits, mode)
            if mode != "none":
                out.fill_(float("nan"))
                arms[name](0)
                torch.cuda.synchronize()
                errs[name] = rel(out.view(seqs, hq, 1, d), ref)
            else:
                errs[name] = float("nan")
        except Exception as e:  # noqa: BLE001 - one arm failing must not stop the others
            b.log(f"  ARM FAILED {name}: {type(e).__name__}: {e}")
            arms.pop(name, None)
            torch.cuda.synchronize()
    arms["sdpa flash"] = sdpa_arm(qb, kd, vd)
    errs["sdpa flash"] = rel(arms["sdpa flash"](0), ref)
    res = b.time_arms(arms, sets, 40)
    auto_name = next(iter(plan))
    auto_t = res[auto_name][0] if auto_name in res else None
    sdpa_t = res["sdpa flash"][0]
    for name, (t, sp) in res.items():
        note = check(errs[name], name, case) if name in plan and plan[name][2] != "none" or name == "sdpa flash" else ""
        if name in plan and plan[name][2] == "none":
            note = "split kernel only (not checked)"
        splits = plan[name][1] if name in plan else None
        label = f"{name} s{splits}" if name in plan and not name.startswith("s=") else name
        record(case, label, t, sp, kv_bytes, copy_bw, errs[name], auto_t, sdpa_t, splits, note)


def decode_buffers(sms, seqs, hq, hkv, d, max_tokens, kind, sets):
    """The queries (one per input set), the output, the arm plan and the split workspace of a decode case."""
    q = [torch.randn(seqs, hq, d, device=dev) for _ in range(sets)]
    out = torch.empty(seqs, hq, d, device=dev)
    plan = arm_plan(sms, seqs * hkv, d, max_tokens, kind)
    ws = torch.empty(seqs * hq * max(v[1] for v in plan.values()) * (d + 2), device=dev)
    return q, out, plan, ws


def tiled_arms(kind, d, ws, out, hq, hkv, seqs, args):
    """`run_arms`' `make`: the tiled `kind` kernel on input set i's arguments `args(i)`, then the combine."""
    def make(tiling, splits, mode):
        fn, smem = tiled_kernel(kind, d, *tiling), tiled_smem(d, *tiling)
        comb = combine_launcher(mode, d, ws, out, hq, seqs, splits)

        def call(i):
            b.launch(fn, (splits, hkv, seqs), (128,), args(i), shared_mem=smem)
            if comb:
                comb()
        return call
    return make


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
    q, out, plan, ws = decode_buffers(sms, seqs, hq, hkv, d, pages_per * page, "paged", sets)
    make = tiled_arms("tiled", d, ws, out, hq, hkv, seqs, lambda i: (
        b.ptr(q[i]), b.ptr(kc[i]), b.ptr(vc[i]), b.ptr(table), b.ptr(lens), np.float32(scale), b.ptr(out),
        b.ptr(ws), np.int32(hq), np.int32(hkv), np.int32(page), np.int32(pages), np.int32(pages_per)))

    kd = [kc[i][table.long()].permute(0, 2, 1, 3, 4).reshape(seqs, hkv, ctx, d).contiguous() for i in range(sets)]
    vd = [vc[i][table.long()].permute(0, 2, 1, 3, 4).reshape(seqs, hkv, ctx, d).contiguous() for i in range(sets)]
    qb = [q[i].to(torch.bfloat16).view(seqs, hq, 1, d) for i in range(sets)]
    run_arms(case, plan, make, qb, kd, vd, out, seqs, hq, d, sets, kv_bytes, copy_bw)
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
    q, out, plan, ws = decode_buffers(sms, seqs, hq, hkv, d, window, "ring", sets)
    make = tiled_arms("ring", d, ws, out, hq, hkv, seqs, lambda i: (
        b.ptr(q[i]), b.ptr(kr[i]), b.ptr(vr[i]), b.ptr(kcur[i]), b.ptr(vcur[i]), b.ptr(pos), np.float32(scale),
        b.ptr(out), b.ptr(ws), np.int32(hq), np.int32(hkv), np.int32(slots)))

    kd = [torch.cat([kr[i], kcur[i].unsqueeze(2)], dim=2) for i in range(sets)]
    vd = [torch.cat([vr[i], vcur[i].unsqueeze(2)], dim=2) for i in range(sets)]
    qb = [q[i].to(torch.bfloat16).view(seqs, hq, 1, d) for i in range(sets)]
    run_arms(case, plan, make, qb, kd, vd, out, seqs, hq, d, sets, kv_bytes, copy_bw)
    del kr, vr, kcur, vcur, kd, vd, q, qb
    torch.cuda.empty_cache()


def main():
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    b.log(f"device: {props.name}, {sms} SMs, torch {torch.__version__}")
    load_attention_module()
    copy_bw = b.copy_bandwidth()
    torch.cuda.empty_cache()
    b.log("the copy bandwidth above is the ceiling below")
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
    # The short table, last: per case what Auto runs, the same with the other combine kernel, the best checked
    # arm, SDPA, and each combine's cost (the arm minus the split kernel alone).
    print()
    print(f"H200 copy {copy_bw/1e12:.2f} TB/s. auto = what KernelPath::Auto / attention_decode_ring launch "
          f"(tiling, splits, combine: {combine_names(AUTO_SLICED)}); other comb = the same with the "
          f"{combine_names(not AUTO_SLICED)} combine; best = fastest checked arm; block / sliced comb = that arm "
          "minus its split kernel alone.")
    print(f"{'case':44s}|{'auto arm':17s}|{'auto us':>8s}|{'other comb us':>13s}|{'best arm':22s}|{'best us':>8s}|"
          f"{'SDPA us':>8s}|{'auto/SDPA':>9s}|{'auto %cp':>8s}|{'SDPA %':>6s}|{'block comb':>10s}|"
          f"{'sliced comb':>11s}|{'err':>7s}")
    by_case = {}
    for r in RESULTS:
        by_case.setdefault(r["case"], []).append(r)
    nan = float("nan")
    for case, rows in by_case.items():
        ours = [r for r in rows if r["arm"] != "sdpa flash" and "no-combine" not in r["arm"] and "us" in r
                and "FAIL" not in r["note"]]
        autos = [r for r in ours if r["arm"].startswith("auto T")]
        auto = next((r for r in autos if not r["arm"].split()[2].startswith(("block", "sliced"))), None)
        other = next((r for r in autos if r is not auto), None)
        if not ours or auto is None:
            print(f"{case:44s}| failed: {rows[-1].get('note', '')}")
            continue
        best = min(ours, key=lambda r: r["us"])
        sd = next((r for r in rows if r["arm"] == "sdpa flash"), None)
        nc = next((r for r in rows if "no-combine" in r["arm"]), None)
        by_mode = {combine_names(AUTO_SLICED): auto, combine_names(not AUTO_SLICED): other}
        comb = {m: (r["us"] - nc["us"] if nc and r else nan) for m, r in by_mode.items()}
        print(f"{case:44s}|{auto['arm']:17s}|{auto['us']:8.2f}|{other['us'] if other else nan:13.2f}|"
              f"{best['arm']:22s}|{best['us']:8.2f}|"
              f"{sd['us'] if sd else nan:8.2f}|{auto['vs_sdpa']:9.2f}|{auto['frac_copy']*100:8.1f}|"
              f"{sd['frac_copy']*100 if sd else nan:6.1f}|{comb['block']:10.2f}|{comb['sliced']:11.2f}|"
              f"{max(r['rel_err_vs_fp32_sdpa'] for r in ours):7.1e}")
    print(f"[{time.time()-t0:.0f}s total]")


if __name__ == "__main__":
    main()
