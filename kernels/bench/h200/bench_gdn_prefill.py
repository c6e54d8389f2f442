"""The chunked gated DeltaNet prefill (kernels/cuda/gdn_prefill.cu, `Gpu::gdn_prefill`) on the H200 against fla.

Usage (repository root): python3 kernels/bench/h200/bench_gdn_prefill.py CARRY_DIR [--quick]
CARRY_DIR holds the crate's gdn_prefill.sm_90.cubin (loaded as the crate loads it on an sm_90 device; the PTX is
the fallback). Writes $OUT/bench_gdn_prefill.json and prints a short table last.

Shapes: Qwen3.8-27B's linear-attention layer (Hk = 16, Hv = 48, dk = dv = 128, conv kernel 4), B = 1 at
T = 1024, 4096, 16384, and one ragged batch (4 sequences, 9216 tokens, cu_seqlens).

Arms, each timed with bench.py's method (CUDA graphs rotating over input sets larger than L2, arms alternating,
medians and spreads):
- ours: exactly the four launches `Gpu::gdn_prefill` queues (conv + norms + gates, chunk-local WY, sequential
  state walk, gated RMSNorm), fp32 inputs and outputs, fp32 arithmetic. Not timed: the entry point's upload of
  the `cu_seqlens` / chunk-offset table (2 * (seqs + 1) int32, one small host-to-device copy), which a graph
  cannot capture from pageable memory; it is prepared on the device once here.
- ours_cs16 / ours_cs64: the state kernel's other column slices (`Gpu::gdn_prefill_with(16 | 64, ..)`).
- fla_kernel: fla's `chunk_gated_delta_rule` alone, as a model calls it: bf16 q, k (repeated to the 48 value
  heads, as transformers' Qwen3-Next does before the call), v, beta; fp32 g; fp32 initial and final state;
  l2-norm in the kernel. It does not do the conv, the gates or the gated norm.
- fla_layer: the whole layer step as a model runs it in bf16: torch depthwise conv1d over [history | tokens],
  SiLU, split, repeat_interleave of q and k, the gates in fp32, fla's chunk kernel, torch gated RMSNorm.

FLOP count (nominal, both implementations do at least this): per value head and 64-token chunk,
10 * C^2 * d (k k^T, q k^T, W and U from T, Aqk @ D) + 6 * C * d^2 (W S, Q S, K^T D), C = 64, d = 128.
The check compares our output and final state with the fla layer's (bf16 there, so ~1e-2 relative).
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(__file__))
import bench as b  # noqa: E402  (reads sys.argv[1] as the PTX dir)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HK, HV, D, KC = 16, 48, 128, 4
CD = 2 * HK * D + HV * D
C = 64
WY_SMEM = 101376  # cuda/gdn_prefill.cu WY_SMEM_BYTES


def state_smem(cs):
    return (2 * C * 132 + C * 65 + C * cs + D * cs + C) * 4  # cuda/gdn_prefill.cu state_smem_bytes


_mod = None


def kern(name):
    global _mod
    if _mod is None:
        cubin = os.path.join(b.PTX, "gdn_prefill.sm_90.cubin")
        path = cubin if os.path.exists(cubin) else os.path.join(b.PTX, "gdn_prefill.ptx")
        b.log(f"loading {path}")
        _mod = cp.RawModule(path=path)
    return _mod.get_function(name)


def layout(lens):
    """Mirror of kernels/src/cuda/gdn_prefill.rs `layout`: region offsets (floats, 64-aligned) and total."""
    n = sum(lens)
    nc = sum((l + C - 1) // C for l in lens)
    pad = lambda x: (x + 63) // 64 * 64  # noqa: E731
    sizes = [("qn", n * HK * D), ("kn", n * HK * D), ("v", n * HV * D), ("g", n * HV), ("beta", n * HV),
             ("gcum", n * HV), ("w", HV * nc * C * D), ("u", HV * nc * C * D), ("aqk", HV * nc * C * C)]
    off, at = {}, 0
    for k, s in sizes:
        off[k] = at
        at += pad(s)
    return off, at, nc


class Ours:
    def __init__(self, lens, cs):
        self.lens = lens
        self.cs = cs
        self.off, total, self.nc = layout(lens)
        self.ws = torch.empty(total, device=b.dev, dtype=torch.float32)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        ch = np.concatenate([[0], np.cumsum([(l + C - 1) // C for l in lens])]).astype(np.int32)
        self.meta = torch.from_numpy(np.concatenate([cu, ch])).to(b.dev)
        self.f_prep = kern("gdn_prefill_prep")
        self.f_wy = kern("gdn_prefill_wy")
        self.f_state = kern(f"gdn_prefill_state_cs{cs}")
        self.f_norm = kern("gdn_prefill_gated_norm")
        b.allow_smem(self.f_wy, WY_SMEM)
        b.allow_smem(self.f_state, state_smem(cs))

    def w(self, k):
        return np.uint64(self.ws.data_ptr() + 4 * self.off[k])

    def __call__(self, qkv, z, a, bb, conv_w, a_log, dt_bias, norm_w, conv_in, conv_out, state, out):
        seqs, n, maxlen = len(self.lens), sum(self.lens), max(self.lens)
        p, i32 = b.ptr, np.int32
        b.launch(self.f_prep, (maxlen, 2 * HK + HV, seqs), (128,),
                 (p(qkv), p(a), p(bb), p(conv_w), p(a_log), p(dt_bias), p(conv_in), p(conv_out), p(self.meta),
                  self.w("qn"), self.w("kn"), self.w("v"), self.w("g"), self.w("beta"), i32(HK), i32(HV), i32(KC)))
        b.launch(self.f_wy, ((maxlen + C - 1) // C, HV, seqs), (256,),
                 (self.w("qn"), self.w("kn"), self.w("v"), self.w("g"), self.w("beta"), p(self.meta),
                  self.w("gcum"), self.w("w"), self.w("u"), self.w("aqk"), i32(HK), i32(HV), i32(seqs),
                  i32(self.nc)), shared_mem=WY_SMEM)
        b.launch(self.f_state, (128 // self.cs, HV, seqs), (256,),
                 (self.w("qn"), self.w("kn"), self.w("gcum"), self.w("w"), self.w("u"), self.w("aqk"),
                  p(self.meta), p(state), p(out), i32(HK), i32(HV), i32(seqs), i32(self.nc)),
                 shared_mem=state_smem(self.cs))
        rows = n * HV
        b.launch(self.f_norm, ((rows + 7) // 8,), (256,), (p(out), p(z), p(norm_w), np.float32(1e-6), i32(rows)))


def fla_layer(chunk, lens, qkv, z, a, bb, conv_w, a_log, dt_bias, norm_w, conv_in, state):
    """The layer as a bf16 model runs it around fla (transformers' Qwen3-Next torch path with fla's kernel).
    Returns (out fp32 [N, Hv*D], final state [seqs, Hv, D, D])."""
    n = sum(lens)
    xs, hist = [], []
    r0 = 0
    for s, l in enumerate(lens):
        x = torch.cat([conv_in[s].to(torch.bfloat16), qkv[r0:r0 + l].to(torch.bfloat16).t()], 1)  # [CD, K-1+l]
        y = F.conv1d(x.unsqueeze(0), conv_w.to(torch.bfloat16).unsqueeze(1), groups=CD)[0]  # [CD, l]
        xs.append(F.silu(y).t())
        r0 += l
    y = torch.cat(xs, 0)
    q, k, v = y.split([HK * D, HK * D, HV * D], -1)
    q = q.reshape(1, n, HK, D).repeat_interleave(HV // HK, 2)
    k = k.reshape(1, n, HK, D).repeat_interleave(HV // HK, 2)
    v = v.reshape(1, n, HV, D)
    g = (-a_log.exp() * F.softplus(a.float() + dt_bias)).reshape(1, n, HV)
    beta = bb.to(torch.bfloat16).sigmoid().reshape(1, n, HV)
    cu = None
    if len(lens) > 1:
        cu = torch.tensor([0] + list(np.cumsum(lens)), device=b.dev, dtype=torch.long)
    o, fs = chunk(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    o = o.reshape(n, HV, D).float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w
    return o.reshape(n, HV * D) * F.silu(z.float()), fs


def flops(lens):
    nc = sum((l + C - 1) // C for l in lens)
    return HV * nc * (10 * C * C * D + 6 * C * D * D)


def case(lens, chunk):
    n, seqs = sum(lens), len(lens)
    shape = f"T={n}" if seqs == 1 else f"B={seqs} N={n}"
    g = torch.Generator(device=b.dev).manual_seed(1)
    rnd = lambda *s, amp=1.0: (torch.rand(*s, device=b.dev, generator=g) * 2 - 1) * amp  # noqa: E731
    conv_w = rnd(CD, KC, amp=0.6)
    a_log = rnd(HV)
    dt_bias = rnd(HV)
    norm_w = torch.rand(D, device=b.dev, generator=g) + 0.5
    per_set = n * (CD + 2 * HV * D + 2 * HV) * 4 + seqs * HV * D * D * 4
    sets = b.n_sets(per_set, floor=2)
    qkv = [rnd(n, CD, amp=1.5) for _ in range(sets)]
    z = [rnd(n, HV * D, amp=2.0) for _ in range(sets)]
    a = [rnd(n, HV, amp=2.0) for _ in range(sets)]
    bb = [rnd(n, HV, amp=3.0) for _ in range(sets)]
    conv = [rnd(seqs, CD, KC - 1) for _ in range(sets)]
    st = [rnd(seqs, HV, D, D, amp=0.05) for _ in range(sets)]
    conv_out = torch.empty(seqs, CD, KC - 1, device=b.dev)
    out = torch.empty(n, HV * D, device=b.dev)
    impls = {cs: Ours(lens, cs) for cs in (32, 16, 64)}

    # Correctness first, on fresh copies: ours against the fla layer (bf16).
    st0, cin0 = st[0].clone(), conv[0].clone()
    impls[32](qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w, cin0, conv_out, st0, out)
    torch.cuda.synchronize()
    ours_out, ours_state = out.clone(), st0.clone()
    for cs in (16, 64):
        st1 = st[0].clone()
        out1 = torch.empty_like(out)
        impls[cs](qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w, conv[0], conv_out, st1, out1)
        torch.cuda.synchronize()
        e = ((out1 - ours_out).norm() / ours_out.norm()).item()
        b.log(f"  {shape}: cs{cs} vs cs32 output rel err {e:.2e}")
        if not e < 1e-4:
            b.log(f"  WARNING: state-kernel variants disagree ({e:.2e})")
    # The conv history ours leaves: the last K-1 inputs of each sequence.
    r0, conv_ok = 0, True
    for s, l in enumerate(lens):
        want = torch.cat([conv[0][s], qkv[0][r0:r0 + l].t()], 1)[:, -(KC - 1):]
        conv_ok &= bool(torch.equal(conv_out[s], want))
        r0 += l
    b.log(f"  {shape}: conv history {'exact' if conv_ok else 'WRONG'}")
    check = {"conv_exact": conv_ok}
    if chunk is not None:
        ref_out, ref_state = fla_layer(chunk, lens, qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w,
                                       conv[0], st[0].clone())
        eo = ((ours_out - ref_out).norm() / ref_out.norm()).item()
        es = ((ours_state - ref_state.float()).norm() / ref_state.float().norm()).item()
        b.log(f"  {shape}: vs fla layer (bf16): output rel err {eo:.2e}, final state rel err {es:.2e}")
        check.update(out_rel_err=eo, state_rel_err=es)
        if not (eo < 5e-2 and es < 5e-2):
            b.log(f"  WARNING: ours and fla disagree beyond bf16 noise ({eo:.2e}, {es:.2e})")

    arms = {}
    for cs, impl in impls.items():
        name = "ours" if cs == 32 else f"ours_cs{cs}"
        arms[name] = (lambda impl: lambda i: impl(qkv[i], z[i], a[i], bb[i], conv_w, a_log, dt_bias, norm_w,
                                                  conv[i], conv_out, st[i], out))(impl)
    if chunk is not None:
        q16 = [x[:, :HK * D].reshape(1, n, HK, D).repeat_interleave(HV // HK, 2).to(torch.bfloat16) for x in qkv]
        k16 = [x[:, HK * D:2 * HK * D].reshape(1, n, HK, D).repeat_interleave(HV // HK, 2).to(torch.bfloat16)
               for x in qkv]
        v16 = [x[:, 2 * HK * D:].reshape(1, n, HV, D).to(torch.bfloat16) for x in qkv]
        g32 = [(-a_log.exp() * F.softplus(x + dt_bias)).reshape(1, n, HV) for x in a]
        b16 = [x.sigmoid().to(torch.bfloat16).reshape(1, n, HV) for x in bb]
        cu = None if seqs == 1 else torch.tensor([0] + list(np.cumsum(lens)), device=b.dev, dtype=torch.long)

        def fla_kernel(i):
            chunk(q16[i], k16[i], v16[i], g=g32[i], beta=b16[i], initial_state=st[i], output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)

        def fla_whole(i):
            fla_layer(chunk, lens, qkv[i], z[i], a[i], bb[i], conv_w, a_log, dt_bias, norm_w, conv[i], st[i])

        arms["fla_kernel"] = fla_kernel
        arms["fla_layer"] = fla_whole
    reps = max(3, min(50, int(4e5 / max(n, 1))))
    res = b.time_arms(arms, sets, reps)
    fl = flops(lens)
    for name in ("ours_cs16", "ours_cs64"):
        b.row("gdn_prefill_var", f"{shape} {name}", res[name], "ours (cs32)", res["ours"], flops=fl)
    if "fla_kernel" in res:
        b.row("gdn_prefill", shape, res["ours"], "fla chunk kernel", res["fla_kernel"], flops=fl, target=">=1.0x",
              note="ours: whole layer step fp32; fla: recurrence only, bf16")
        b.row("gdn_prefill", shape, res["ours"], "torch conv+fla+norm", res["fla_layer"], flops=fl,
              target=">=1.0x")
    else:
        b.row("gdn_prefill", shape, res["ours"], "-", None, flops=fl)
    b.ROWS[-1]["check"] = check
    del qkv, z, a, bb, conv, st, impls
    torch.cuda.empty_cache()


def main():
    props = torch.cuda.get_device_properties(0)
    b.log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
          f"cupy {cp.__version__}")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as chunk
    except Exception as e:  # noqa: BLE001
        b.log(f"fla not importable ({e}); baselines skipped")
        chunk = None
    cases = [[1024], [4096], [16384], [4096, 1000, 3000, 1120]]
    if b.QUICK:
        cases = [[1024], [4096], [4096, 1000, 3000, 1120]]
    t0 = time.time()
    for lens in cases:
        try:
            case(lens, chunk)
        except Exception as e:  # noqa: BLE001 - one failing case must not stop the others
            b.log(f"case {lens} FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        b.log(f"[{lens} done at {time.time()-t0:.0f}s]")
    with open(os.path.join(b.OUT, "bench_gdn_prefill.json"), "w") as fh:
        json.dump({"device": props.name, "rows": b.ROWS}, fh, indent=1, default=str)
    print()
    print(f"{'kernel':16s}|{'shape':24s}|{'ours us':>10s}|{'baseline':22s}|{'base us':>10s}|{'x':>6s}|"
          f"{'TFLOP/s':>8s}|{'base TF':>8s}")
    for r in b.ROWS:
        tf = r.get("TFLOP/s", float("nan"))
        btf = tf / r["speedup"] if r["speedup"] == r["speedup"] else float("nan")
        print(f"{r['kernel']:16s}|{r['shape']:24s}|{r['ours_us']:10.1f}|{r['baseline']:22s}|{r['base_us']:10.1f}|"
              f"{r['speedup']:6.2f}|{tf:8.2f}|{btf:8.2f}")
    print("FLOP count: Hv * chunks * (10 C^2 d + 6 C d^2), C = 64, d = 128 (nominal, no triangular savings). "
          "Ceiling: H200 fp32 CUDA cores ~67 TFLOP/s dense FMA (ours is fp32 on CUDA cores); fla runs bf16 "
          "tensor cores.")


if __name__ == "__main__":
    main()
