"""The GDN prefill's launches at T = 4096 (Qwen3.8-27B's layer: Hk = 16, Hv = 48, d = 128) for Nsight Compute: the
default variant's four launches (prep, WY, state walk, gated norm) three times on the same inputs, so with the
filter below --launch-skip 2 --launch-count 2 profiles the second (warm) WY and state launches (what an earlier call ran).

    ncu --clock-control none --set full --import-source no -k regex:'gdn_prefill_(wy|state)' \\
        --launch-skip 2 --launch-count 2 python3 kernels/bench/h200/profile_gdn_prefill.py CARRY_DIR

CARRY_DIR holds gdn_prefill.sm_90.cubin. Env GDN_PROFILE_VARIANT picks another variant than the default, e.g.
`wytf32_bf16_cs64` (the bf16 split: prep, WY, walk, output; filter -k regex:'gdn_prefill_(wy|walk|out)'). Correctness
is the tests' and bench_gdn_prefill.py's business; this only launches. Env GDN_PROFILE_LENS: other sequence
lengths than one of 4096 (e.g. 1000,3000,1120,4096, where the split runs its one-block walk).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gdn_prefill as g  # noqa: E402  (its `bench` import reads sys.argv[1] as the carry dir)

import torch  # noqa: E402

b = g.b
lens = [int(x) for x in os.environ.get("GDN_PROFILE_LENS", "4096").split(",")]  # e.g. 1000,3000,1120,4096
n = sum(lens)
gen = torch.Generator(device=b.dev).manual_seed(1)
rnd = lambda *s, amp=1.0: (torch.rand(*s, device=b.dev, generator=gen) * 2 - 1) * amp  # noqa: E731
conv_w, a_log, dt_bias = rnd(g.CD, g.KC, amp=0.6), rnd(g.HV), rnd(g.HV)
norm_w = torch.rand(g.D, device=b.dev, generator=gen) + 0.5
qkv, z = rnd(n, g.CD, amp=1.5), rnd(n, g.HV * g.D, amp=2.0)
a, bb = rnd(n, g.HV, amp=2.0), rnd(n, g.HV, amp=3.0)
conv_in = rnd(len(lens), g.CD, g.KC - 1)
conv_out = torch.empty(len(lens), g.CD, g.KC - 1, device=b.dev)
state = rnd(len(lens), g.HV, g.D, g.D, amp=0.05)
out = torch.empty(n, g.HV * g.D, device=b.dev)
ref = g.Ours(lens, os.environ.get("GDN_PROFILE_VARIANT", g.DEFAULT))
for _ in range(3):
    ref(qkv, z, a, bb, conv_w, a_log, dt_bias, norm_w, conv_in, conv_out, state, out)
torch.cuda.synchronize()
print("done")
