"""How the rounding of the mma operands of the GDN chunked prefill (kernels/cuda/gdn_prefill.cu) moves its output,
simulated on the CPU: the chunk algebra of that file in fp32 with each product's operands rounded as a build rounds
them, against the token-by-token recurrence in f64. It answers a design question before any kernel exists: may the
WY products or the state walk run on bf16 operands (what fla does) and stay inside the GPU tests' bounds?

Usage: python3 kernels/bench/gdn_operand_precision.py [draws]   (numpy; ~20 s for 8 draws, ~50 s for 20)

Rounding per group of products (the WY's; the walk's state path W S and Kd^T D; the output's Q S and Aqk D), as
named in the table: `fp32` (3xTF32 builds: ~2^-22, modelled exact), `tf32` (round to
nearest, ties away: the `tf32_round` add), `bf16` (round to nearest even). The state itself and every accumulation
stay fp32 in every mode, as in the kernels. Inputs follow kernels/tests/gpu_gdn_prefill.rs: keys and queries are
l2-normed SiLU outputs (so strongly correlated, which is what makes I + A ill-conditioned), q scaled by 1/sqrt(128),
a_log in (-1, 1), beta = sigmoid(U(-3, 3)), initial state U(-0.5, 0.5); the metric is the tests' scaled error
max |got - want| / (1 + |want|) on the gated-normed output (rmsnorm(o) * w * silu(z)) and on the final state.

The last rows model the bf16 split as built (`chunked_split`: every operand the walk and the output
launch read is stored in bf16) behind a 3xTF32, plain-TF32 or bf16 WY. Earlier, 40 draws: 1.78e-2 / 1.46e-3
(3xTF32 WY), 1.65e-2 / 1.46e-3 (TF32), 6.79e-2 / 1.84e-3 (bf16 WY: over the split's 5e-2 output bound, so a bf16
WY needs bounds of its own); the H200's tests saw up to 2.9e-2 / 2.6e-3 for the 3xTF32 one over 108 checks of
more heads and ragged batches. Earlier rows (20 draws): behind the plain-TF32 WY 1.72e-2 / 1.15e-3; K K^T in
bf16 1.72e-2 / 1.14e-3 and W, U in bf16 1.70e-2 / 1.66e-3 (so a bf16 K K^T and W / U stay in the class), but Q K^T
with q or k in bf16 4.9e-2 / 4.1e-2 and both 7.4e-2 on the output, and v stored in bf16 3.26e-2 / 2.24e-3 (the
H200's tests saw 3.9e-2 with it; reverted). Earlier rows (40 draws): the WY's TF32 operands passed
unrounded (`tf32t`, the tensor core truncates them) 1.85e-2 / 1.48e-3 with all three products so; all three on
f16 operands (`f16`: IEEE half, round to nearest even) 1.65e-2 / 1.46e-3, exactly the plain-TF32 WY's 1.65e-2 /
1.46e-3, where bf16 W / U gave 2.57e-2 / 1.84e-3: hence `wyf16_bf16_cs64` (the H200's tests saw up to 2.0e-2).
"""
import sys

import numpy as np

D, C = 128, 64


def rnd(x, mode):
    x = np.asarray(x, dtype=np.float32)
    if mode == "fp32":
        return x
    u = x.view(np.uint32).astype(np.uint64)
    if mode == "tf32":
        u = (u + 0x1000) & 0xFFFFE000
    elif mode == "tf32t":  # the operand as fp32 bits, no rounding add: the tensor core drops the low 13 bits
        u = u & 0xFFFFE000
    elif mode == "f16":  # round to nearest even in IEEE half (subnormals below 2^-14, +-inf past 65504)
        return x.astype(np.float16).astype(np.float32)
    elif mode == "bf16":
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    else:
        raise ValueError(mode)
    return (u & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def mm(a, b, mode):
    """fp32 product of operands rounded to `mode`."""
    return rnd(a, mode) @ rnd(b, mode)


def draw(rng, t):
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    q = unit(silu(rng.uniform(-1.5, 1.5, (t, D)))) / np.sqrt(D)
    k = unit(silu(rng.uniform(-1.5, 1.5, (t, D))))
    v = silu(rng.uniform(-1.5, 1.5, (t, D)))
    a_log = rng.uniform(-1, 1)
    g = -np.exp(a_log) * np.log1p(np.exp(rng.uniform(-2, 2, t) + rng.uniform(-1, 1)))
    beta = 1 / (1 + np.exp(-rng.uniform(-3, 3, t)))
    s0 = rng.uniform(-0.5, 0.5, (D, D))
    z = rng.uniform(-2, 2, (t, D))
    w = rng.uniform(0.5, 1.5, D)
    return q, k, v, g, beta, s0, z, w


def recurrence(q, k, v, g, beta, s0):
    s = s0.astype(np.float64).copy()
    out = np.empty((len(g), D))
    for i in range(len(g)):
        s *= np.exp(g[i])
        s += np.outer(k[i], beta[i] * (v[i] - s.T @ k[i]))
        out[i] = s.T @ q[i]
    return out, s


def chunked(q, k, v, g, beta, s0, wy, walk, outp):
    """wy: the WY products' operands; walk: the state path's (W S, Kd^T D); outp: the output's (Q S, Aqk D)."""
    f = np.float32
    q, k, v, g, beta = (np.asarray(x, f) for x in (q, k, v, g, beta))
    s = np.asarray(s0, f).copy()
    out = np.empty((len(g), D), f)
    for c0 in range(0, len(g), C):
        sl = slice(c0, min(c0 + C, len(g)))
        kc, qc, vc, bc = k[sl], q[sl], v[sl], beta[sl]
        gc = np.cumsum(g[sl].astype(f)).astype(f)
        n = len(gc)
        dec = np.tril(np.exp(np.minimum(gc[:, None] - gc[None, :], 0))).astype(f)  # G_i - G_j <= 0 for j <= i
        a = np.tril(bc[:, None] * mm(kc, kc.T, wy) * dec, -1).astype(f)
        t = np.linalg.inv(np.eye(n, dtype=np.float64) + a).astype(f)  # fp32-class solve (the kernels: fp32 FMAs)
        wmat = mm(t, (bc * np.exp(gc))[:, None] * kc, wy)
        umat = mm(t, bc[:, None] * vc, wy)
        aqk = (mm(qc, kc.T, wy) * dec).astype(f)
        dmat = umat - mm(wmat, s, walk)
        out[sl] = np.exp(gc)[:, None] * mm(qc, s, outp) + mm(aqk, dmat, outp)
        kd = np.exp(gc[-1] - gc)[:, None] * kc
        s = np.exp(gc[-1]) * s + mm(kd.T, dmat, walk)
    return out, s


def chunked_split(q, k, v, g, beta, s0, wy, kkt=None, qkt=None, wu=None, qk_q=None, qk_k=None, v_in="fp32"):
    """The bf16 split as built (`wy<wy>_bf16_cs64`, gdn_prefill_walk_bf16 / gdn_prefill_out_bf16): the
    WY products' operands rounded to `wy`, then every stored operand in bf16 - W, U, Aqk (the `_b` WY), q and k (the
    prep's copies), each chunk's incoming state and D (the walk's hs slots) - and the update's D scaled by
    e^{G_L-G_t} before its rounding; the state itself and every accumulation fp32. Earlier questions, one
    product or input at a time: `kkt`, `qkt`, `wu` round that WY product's operands otherwise (default `wy`);
    `qk_q` / `qk_k` round only q or only k of Q K^T; `v_in="bf16"` stores v in bf16 before the WY (as the prep
    would write it)."""
    f = np.float32
    b = lambda x: rnd(x, "bf16")  # noqa: E731
    kkt, qkt, wu = kkt or wy, qkt or wy, wu or wy
    q, k, v, g, beta = (np.asarray(x, f) for x in (q, k, v, g, beta))
    qb, kb = b(q), b(k)
    if v_in == "bf16":
        v = b(v)
    s = np.asarray(s0, f).copy()
    out = np.empty((len(g), D), f)
    for c0 in range(0, len(g), C):
        sl = slice(c0, min(c0 + C, len(g)))
        kc, vc, bc = k[sl], v[sl], beta[sl]
        gc = np.cumsum(g[sl].astype(f)).astype(f)
        n = len(gc)
        dec = np.tril(np.exp(np.minimum(gc[:, None] - gc[None, :], 0))).astype(f)
        a = np.tril(bc[:, None] * mm(kc, kc.T, kkt) * dec, -1).astype(f)
        t = np.linalg.inv(np.eye(n, dtype=np.float64) + a).astype(f)
        wmat = b(mm(t, (bc * np.exp(gc))[:, None] * kc, wu))
        umat = b(mm(t, bc[:, None] * vc, wu))
        if qk_q or qk_k:
            aqk = b((rnd(q[sl], qk_q or qkt) @ rnd(kc, qk_k or qkt).T) * dec)
        else:
            aqk = b(mm(q[sl], kc.T, qkt) * dec)
        sb = b(s)
        dmat = umat - wmat @ sb
        out[sl] = np.exp(gc)[:, None] * (qb[sl] @ sb) + aqk @ b(dmat)
        s = np.exp(gc[-1]) * s + kb[sl].T @ b(np.exp(gc[-1] - gc)[:, None] * dmat)
    return out, s


def gated_norm(o, z, w):
    o = o.astype(np.float64)
    return o / np.sqrt((o * o).mean(1, keepdims=True) + 1e-6) * w * (z / (1 + np.exp(-z)))


def scaled(got, want):
    return float(np.max(np.abs(got - want) / (1 + np.abs(want))))


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    modes = [("fp32", "fp32", "fp32"), ("tf32", "tf32", "tf32"), ("fp32", "tf32", "tf32"),
             ("fp32", "tf32", "bf16"), ("fp32", "bf16", "bf16"), ("bf16", "tf32", "tf32"), ("bf16", "bf16", "bf16")]
    split_wy = ["fp32", "tf32", "bf16"]  # the bf16 split behind a 3xTF32, a plain-TF32 or a (future) bf16 WY
    # Tried: the split behind a plain-TF32 WY with one product or input rounded to bf16 (name, options).
    split_one = [("K K^T bf16", dict(kkt="bf16")), ("W, U bf16", dict(wu="bf16")),
                 ("K K^T, W, U bf16", dict(kkt="bf16", wu="bf16")), ("Q K^T: q bf16", dict(qk_q="bf16")),
                 ("Q K^T: k bf16", dict(qk_k="bf16")), ("Q K^T bf16", dict(qkt="bf16")),
                 ("v stored bf16", dict(v_in="bf16")),
                 # Tried: the WY's TF32 operands passed unrounded (truncated by the tensor core).
                 ("K K^T TF32 truncated", dict(kkt="tf32t")), ("W, U TF32 truncated", dict(wu="tf32t")),
                 ("Q K^T TF32 truncated", dict(qkt="tf32t")), ("all three truncated", dict(kkt="tf32t", wu="tf32t", qkt="tf32t")),
                 # Tried: K K^T and Q K^T on f16 operands (q and k stored in f16 by the prep), W, U on bf16.
                 ("Q K^T, K K^T f16", dict(kkt="f16", qkt="f16")),
                 ("Q K^T, K K^T f16; W, U bf16", dict(kkt="f16", qkt="f16", wu="bf16")),
                 ("Q K^T, K K^T, W, U f16", dict(kkt="f16", qkt="f16", wu="f16"))]
    rng = np.random.default_rng(6)
    worst = {m: [0.0, 0.0] for m in modes + [("split", w) for w in split_wy] + [("one", n) for n, _ in split_one]}
    for t in (63, 130, 1024):
        for _ in range(draws):
            q, k, v, g, beta, s0, z, w = draw(rng, t)
            ref_o, ref_s = recurrence(q, k, v, g, beta, s0)
            ref = gated_norm(ref_o, z, w)
            for m in modes + [("split", w_) for w_ in split_wy]:
                if m[0] == "split":
                    o, s = chunked_split(q, k, v, g, beta, s0, m[1])
                else:
                    o, s = chunked(q, k, v, g, beta, s0, *m)
                eo, es = scaled(gated_norm(o, z, w), ref), scaled(s, ref_s)
                worst[m] = [max(worst[m][0], eo), max(worst[m][1], es)]
            for name, opts in split_one:
                o, s = chunked_split(q, k, v, g, beta, s0, "tf32", **opts)
                eo, es = scaled(gated_norm(o, z, w), ref), scaled(s, ref_s)
                m = ("one", name)
                worst[m] = [max(worst[m][0], eo), max(worst[m][1], es)]
    print(f"{draws} draws each of T = 63, 130, 1024 (one head); worst scaled error against the f64 recurrence")
    print(f"{'WY':6s} {'W S, Kd^T D':12s} {'Q S, Aqk D':12s} {'output':>10s} {'state':>10s}")
    for m in modes:
        print(f"{m[0]:6s} {m[1]:12s} {m[2]:12s} {worst[m][0]:10.2e} {worst[m][1]:10.2e}")
    print("the bf16 split as built (every stored operand bf16), behind a WY of:")
    for w_ in split_wy:
        m = ("split", w_)
        print(f"{w_:6s} {'bf16 split':12s} {'bf16 split':12s} {worst[m][0]:10.2e} {worst[m][1]:10.2e}")
    print("the bf16 split behind a plain-TF32 WY with one product or input in bf16:")
    for name, _ in split_one:
        m = ("one", name)
        print(f"{name:32s} {worst[m][0]:10.2e} {worst[m][1]:10.2e}")


if __name__ == "__main__":
    main()
