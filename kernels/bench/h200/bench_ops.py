"""edgefit's small GPU ops (kernels/cuda/ops.cu) on the H200 at the engine's shapes, against their torch
equivalents: RMSNorm (fp32 in, bf16 out; plain and fused with the residual add) against F.rms_norm + a bf16 cast,
SiLU/GELU-and-mul against F.silu(g) * u / F.gelu(g) * u + cast, the embedding gathers against index_select + cast,
argmax against torch.argmax, top-k/top-p sampling against torch.topk + softmax + top-p mask + multinomial, neox
RoPE against the manual torch form.

Each op is memory-bound, so the figure of merit is the fraction of copy bandwidth (bytes read + written over the
time, over a 256 MiB device copy measured in this run). Method and helpers: bench.py (CUDA graphs rotating over
inputs larger than L2, arms alternating, medians and spreads). Each case checks our output against torch before
timing, and a failing case is printed and skipped without stopping the others.

Usage: python3 kernels/bench/h200/bench_ops.py PTX_DIR     (writes $OUT/bench_ops.json)
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402  (reads sys.argv[1] as the PTX dir)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = b.dev
H, INTER, VOCAB = 5120, 17408, 248320
EPS = 1e-6
REPS = 20
# Gpu::ARGMAX_CLUSTER_MAX_ROWS and Gpu::SAMPLE_CLUSTER_MAX_ROWS (kernels/src/cuda/ops.rs): the row counts up to which
# the Rust API picks the 8-block cluster kernels; the table marks the pick and a note flags a faster other kernel.
AUTO_CLUSTER_MAX_ROWS = 16
T0 = time.time()


def K(name):
    return b.kern("ops", name)


def i32(v):
    return np.int32(v)


def u32(v):
    return np.uint32(v)


def f32(v):
    return np.float32(v)


def case(fn):
    """Runs one case; prints and records a failure without stopping the run."""
    def run(*a):
        try:
            fn(*a)
        except Exception as e:  # noqa: BLE001
            b.log(f"FAILED {fn.__name__}{a}: {type(e).__name__}: {e}")
            traceback.print_exc()
            FAILED.append(f"{fn.__name__}{a}: {type(e).__name__}: {e}")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return run


FAILED = []


def check(what, ok, detail=""):
    if not ok:
        raise AssertionError(f"{what}: output does not match torch {detail}")


@case
def rmsnorm(bw, tokens, fused):
    sets = b.n_sets(tokens * H * (12 if fused else 6))
    x = [torch.randn(tokens, H, device=dev) for _ in range(sets)]
    res = [torch.randn(tokens, H, device=dev) for _ in range(sets)] if fused else None
    w = torch.randn(H, device=dev) * 0.1
    w1 = w + 1.0  # the (1 + w) form, precomputed for torch
    out = torch.empty(tokens, H, device=dev, dtype=torch.bfloat16)
    name = "add_rmsnorm_bf16" if fused else "rmsnorm_bf16"
    fn = K(name)

    def ours(i):
        args = (b.ptr(x[i]),) + ((b.ptr(res[i]),) if fused else ()) + (b.ptr(w), f32(1.0), f32(EPS), b.ptr(out), i32(H))
        b.launch(fn, (tokens,), (256,), args)

    def base(i):
        if fused:
            res[i].add_(x[i])
            return F.rms_norm(res[i], (H,), w1, EPS).to(torch.bfloat16)
        return F.rms_norm(x[i], (H,), w1, EPS).to(torch.bfloat16)

    # Correctness: on copies (the fused form updates the residual in place).
    if fused:
        r0 = res[0].clone()
        ours(0)
        want_r = r0 + x[0]
        check(name + " residual", torch.equal(res[0], want_r))
        want = F.rms_norm(want_r, (H,), w1, EPS).to(torch.bfloat16)
        res[0].copy_(r0)
    else:
        ours(0)
        want = F.rms_norm(x[0], (H,), w1, EPS).to(torch.bfloat16)
    err = (out.float() - want.float()).abs().max().item()
    check(name, err <= 0.02 * want.float().abs().max().item(), f"max err {err}")
    t = b.time_arms({"ours": ours, "torch": base}, sets, REPS)
    nbytes = tokens * H * (4 + 4 + 4 + 2 if fused else 4 + 2) + H * 4
    b.row(name, f"{tokens}x{H}", t["ours"], "F.rms_norm+cast" + (" (+add_)" if fused else ""), t["torch"],
          bytes_moved=nbytes, ceiling=bw, target=">=80% copy at 4096 tokens")


@case
def glu(bw, tokens, gelu):
    sets = b.n_sets(tokens * INTER * 10)
    gu = [torch.randn(tokens, 2 * INTER, device=dev) for _ in range(sets)]
    out = torch.empty(tokens, INTER, device=dev, dtype=torch.bfloat16)
    name = "gelu_and_mul_bf16" if gelu else "silu_and_mul_bf16"
    fn = K(name)
    grid = (tokens, (INTER + 1023) // 1024)

    def ours(i):
        b.launch(fn, grid, (256,), (b.ptr(gu[i]), b.ptr(out), i32(INTER)))

    def base(i):
        g, u = gu[i][:, :INTER], gu[i][:, INTER:]
        a = F.gelu(g) if gelu else F.silu(g)
        return (a * u).to(torch.bfloat16)

    ours(0)
    want = base(0)
    err = (out.float() - want.float()).abs().max().item()
    check(name, err <= 0.01 * want.float().abs().max().item() + 1e-3, f"max err {err}")
    t = b.time_arms({"ours": ours, "torch": base}, sets, REPS)
    b.row(name, f"{tokens}x{INTER}", t["ours"], ("F.gelu" if gelu else "F.silu") + "(g)*u+cast", t["torch"],
          bytes_moved=tokens * INTER * (8 + 2), ceiling=bw, target=">=80% copy at 4096 tokens")


@case
def argmax(bw, rows):
    sets = b.n_sets(rows * VOCAB * 4)
    lg = [torch.randn(rows, VOCAB, device=dev) for _ in range(sets)]
    out = torch.empty(rows, device=dev, dtype=torch.int32)
    fc, fb = K("argmax_cluster8"), K("argmax_block")

    def cl(i):
        b.launch(fc, (8, rows), (1024,), (b.ptr(lg[i]), b.ptr(out), u32(VOCAB)))

    def bl(i):
        b.launch(fb, (1, rows), (1024,), (b.ptr(lg[i]), b.ptr(out), u32(VOCAB)))

    def base(i):
        return torch.argmax(lg[i], dim=-1)

    for nm, f in (("cluster8", cl), ("block", bl)):
        out.fill_(-1)
        f(0)
        check(f"argmax {nm}", torch.equal(out.long(), base(0)))
    t = b.time_arms({"cluster": cl, "block": bl, "torch": base}, sets, REPS)
    auto = "cluster" if rows <= AUTO_CLUSTER_MAX_ROWS else "block"
    b.row("argmax_cl8", f"{rows}x{VOCAB}", t["cluster"], "torch.argmax", t["torch"], bytes_moved=rows * VOCAB * 4,
          ceiling=bw, target="below torch", note="8 blocks per row" + (" (Gpu::argmax's pick)" if auto == "cluster"
                                                                          else ""))
    b.row("argmax_block", f"{rows}x{VOCAB}", t["block"], "torch.argmax", t["torch"], bytes_moved=rows * VOCAB * 4,
          ceiling=bw, note="one block per row" + (" (Gpu::argmax's pick)" if auto == "block" else ""))
    faster = "cluster" if t["cluster"][0] < t["block"][0] else "block"
    if faster != auto:
        b.log(f"  note: at {rows} rows the {faster} kernel is faster but Gpu::argmax picks {auto} "
              f"(ARGMAX_CLUSTER_MAX_ROWS = {AUTO_CLUSTER_MAX_ROWS}: revisit)")


@case
def sample(bw, rows, top_k, top_p, temp):
    sets = b.n_sets(rows * VOCAB * 4)
    lg = [torch.randn(rows, VOCAB, device=dev) * 3 for _ in range(sets)]
    out = torch.empty(rows, device=dev, dtype=torch.int32)
    # One PCG32 per row (Gpu::pcg32_words: any words with an odd increment are a valid generator).
    words = torch.randint(0, 2**31, (rows, 4), device=dev, dtype=torch.int32)
    words[:, 2] |= 1
    fc, fb = K("sample_topk_topp_cluster8"), K("sample_topk_topp")

    def launch(f, i, k, w=words, o=out):
        grid = (8, rows) if f is fc else (rows,)
        b.launch(f, grid, (1024,), (b.ptr(lg[i]), b.ptr(w), b.ptr(o), u32(VOCAB), u32(k), f32(temp), f32(top_p)))

    def cl(i):
        launch(fc, i, top_k)

    def bl(i):
        launch(fb, i, top_k)

    def base(i):
        v, idx = torch.topk(lg[i] / temp, top_k, dim=-1)
        p = torch.softmax(v, dim=-1)
        c = torch.cumsum(p, dim=-1)
        p = p.masked_fill((c - p) >= top_p, 0.0)  # keep the prefix whose mass first reaches top_p
        pick = torch.multinomial(p, 1)
        return idx.gather(-1, pick)

    # Checks: the drawn token is one of torch's top-k ids for its row; both kernels draw the same tokens from the
    # same generator words and advance them alike; k = 1 is torch.argmax.
    _, idx = torch.topk(lg[0], top_k, dim=-1)
    got = {}
    for nm, f in (("cluster", fc), ("block", fb)):
        w, o = words.clone(), torch.full_like(out, -1)
        launch(f, 0, top_k, w, o)
        check(f"sample {nm} in top-k", bool((idx == o.long()[:, None]).any(dim=-1).all()))
        got[nm] = (o, w)
        o.fill_(-1)
        launch(f, 0, 1, w, o)
        check(f"sample {nm} k=1 is argmax", torch.equal(o.long(), torch.argmax(lg[0], dim=-1)))
    check("sample cluster == block tokens", torch.equal(got["cluster"][0], got["block"][0]))
    check("sample cluster == block generators", torch.equal(got["cluster"][1], got["block"][1]))
    t = b.time_arms({"cluster": cl, "block": bl, "torch": base}, sets, REPS)
    auto = "cluster" if rows <= AUTO_CLUSTER_MAX_ROWS else "block"
    for nm, arm in (("sample_cl8", "cluster"), ("sample_block", "block")):
        b.row(nm, f"{rows}x{VOCAB} k{top_k} p{top_p}", t[arm], "topk+softmax+multinom", t["torch"],
              bytes_moved=rows * VOCAB * 4, ceiling=bw, target=">=1.5x torch",
              note="bytes: one read of the logits (the kernel makes 5)" + (" (Gpu::sample's pick)" if auto == arm
                                                                          else ""))
    faster = "cluster" if t["cluster"][0] < t["block"][0] else "block"
    if faster != auto:
        b.log(f"  note: at {rows} rows the {faster} kernel is faster but Gpu::sample picks {auto} "
              f"(SAMPLE_CLUSTER_MAX_ROWS = {AUTO_CLUSTER_MAX_ROWS}: revisit)")


@case
def gather(bw, n):
    table = torch.randn(VOCAB, H, device=dev).to(torch.bfloat16)
    sets = 16
    ids = [torch.randint(0, VOCAB, (n,), device=dev, dtype=torch.int32) for _ in range(sets)]
    out = torch.empty(n, H, device=dev)
    fn, f2 = K("embedding_gather_bf16"), K("embedding_gather_bf16_d2")
    table16 = table.view(torch.int16)

    def ours(i, f=fn):
        b.launch(f, (n,), (128,), (b.ptr(table16), b.ptr(ids[i]), b.ptr(out), u32(VOCAB), i32(H)))

    def d2(i):
        ours(i, f2)

    def base(i):
        return table.index_select(0, ids[i]).float()

    for nm, f in (("embedding_gather_bf16", ours), ("embedding_gather_bf16_d2", d2)):
        out.fill_(float("nan"))
        f(0)
        check(nm, torch.equal(out, base(0)))
    t = b.time_arms({"ours": ours, "d2": d2, "torch": base}, sets, REPS)
    b.row("gather_bf16", f"{n} of {VOCAB}x{H}", t["ours"], "index_select+float", t["torch"],
          bytes_moved=n * H * (2 + 4), ceiling=bw, target=">=80% copy", note="8 loads in flight per thread")
    b.row("gather_bf16_d2", f"{n} of {VOCAB}x{H}", t["d2"], "index_select+float", t["torch"],
          bytes_moved=n * H * (2 + 4), ceiling=bw, note="2 loads in flight per thread (the former kernel)")

    # The packed int4 tinygemm layout (group 128): random codes and bf16 scales/zeros; checked against a torch
    # decode of the same rows, timed against our bf16 gather above (no torch op reads this layout).
    g = 128
    packed = torch.randint(0, 256, (VOCAB // 64, H, 32), device=dev, dtype=torch.uint8)
    sz = (torch.rand(H // g, VOCAB, 2, device=dev) * 0.1).to(torch.bfloat16)
    f4 = K("embedding_gather_int4")

    def ours4(i):
        b.launch(f4, (n,), (128,), (b.ptr(packed), b.ptr(sz.view(torch.int16)), b.ptr(ids[i]), b.ptr(out),
                                    u32(VOCAB), i32(H), i32(g), u32(VOCAB)))

    ours4(0)
    idl = ids[0].long()[:8]
    byte = packed[idl // 64, :, idl % 32]  # [8, H]
    code = torch.where((idl % 64 < 32)[:, None], byte & 15, byte >> 4).float()
    s = sz[:, idl, 0].float().t().repeat_interleave(g, 1)
    z = sz[:, idl, 1].float().t().repeat_interleave(g, 1)
    want = (code - 8.0) * s + z
    check("embedding_gather_int4", torch.allclose(out[:8], want, rtol=0, atol=1e-6))
    t4 = b.time_arms({"ours": ours4, "bf16": ours}, sets, REPS)
    del table, table16
    b.row("gather_int4", f"{n} of {VOCAB}x{H} g{g}", t4["ours"], "our bf16 gather", t4["bf16"],
          bytes_moved=n * H * (32 + 4), ceiling=bw,
          note="bytes: a 32-byte sector per code (the layout's cost) + fp32 out")


@case
def rope(bw, tokens, heads=32, d=256, rot=64, theta=1e7):
    sets = b.n_sets(tokens * heads * d * 4)
    xs = [torch.randn(tokens, heads, d, device=dev) for _ in range(sets)]
    pos = torch.randint(0, 100000, (tokens,), device=dev, dtype=torch.int32)
    fn = K("rope_neox")
    half = rot // 2
    inv = (1.0 / theta ** (torch.arange(0, rot, 2, device=dev, dtype=torch.float64) / rot)).float()

    def ours(i):
        b.launch(fn, (tokens,), (256,), (b.ptr(xs[i]), b.ptr(pos), np.float64(theta), i32(heads), i32(d), i32(rot)))

    def base(i):
        ang = pos.float()[:, None] * inv[None, :]
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
        x1, x2 = xs[i][..., :half], xs[i][..., half:rot]
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        xs[i][..., :half] = o1
        xs[i][..., half:rot] = o2

    x0 = xs[0].clone()
    ours(0)
    got = xs[0].clone()
    xs[0].copy_(x0)
    base(0)
    err = (got - xs[0]).abs().max().item()
    check("rope_neox", err <= 1e-3, f"max err {err}")  # torch's f32 cos/sin against our f64 ones
    t = b.time_arms({"ours": ours, "torch": base}, sets, REPS)
    b.row("rope_neox", f"{tokens}x{heads}x{d} rot{rot}", t["ours"], "torch manual neox", t["torch"],
          bytes_moved=tokens * heads * rot * 8, ceiling=bw, note="bytes: the rotated dims read and written")


def main():
    props = torch.cuda.get_device_properties(0)
    b.log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}")
    bw = b.copy_bandwidth()
    for tokens in (1, 4096):
        rmsnorm(bw, tokens, False)
        rmsnorm(bw, tokens, True)
        glu(bw, tokens, False)
        glu(bw, tokens, True)
        rope(bw, tokens)
    b.log(f"[norm/glu/rope done in {time.time() - T0:.0f}s]")
    for rows in (1, 8, 16, 32, 64):
        argmax(bw, rows)
    for rows in (1, 16, 64):
        sample(bw, rows, 20, 0.9, 0.7)
        sample(bw, rows, 1024, 0.95, 1.0)
    b.log(f"[argmax/sample done in {time.time() - T0:.0f}s]")
    gather(bw, 4096)
    b.log(f"[gather done in {time.time() - T0:.0f}s]")
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "bench_ops.json"), "w") as fh:
        json.dump({"device": props.name, "copy_GBps": bw / 1e9, "rows": b.ROWS, "failed": FAILED}, fh, indent=1)
    print()
    print(f"H200 copy {bw / 1e12:.2f} TB/s; ratio = torch time / ours (> 1: ours faster)")
    print(f"{'kernel':13s}|{'shape':30s}|{'ours us':>9s}|{'baseline':24s}|{'base us':>9s}|{'ratio':>6s}|{'%copy':>6s}")
    for r in b.ROWS:
        print(f"{r['kernel']:13s}|{r['shape']:30s}|{r['ours_us']:9.2f}|{r['baseline']:24s}|{r['base_us']:9.2f}|"
              f"{r['speedup']:6.2f}|{r.get('frac_copy', float('nan')) * 100:6.1f}")
    if FAILED:
        print(f"{len(FAILED)} case(s) FAILED:")
        for f in FAILED:
            print("  " + f)


if __name__ == "__main__":
    main()
