"""Launches each edgefit CUDA kernel a few times on benchmark-sized inputs, for Nsight Compute to read.

run_all.sh runs it under `ncu --clock-control none` (the card's clocks are left alone) and keeps the speed-of-light,
occupancy and warp-stall sections: the numbers that say whether a kernel waits on memory, on latency or on issue.
Usage: python3 profile.py PTX_DIR
"""

import math
import os
import sys
import warnings

import cupy as cp
import numpy as np
import torch

warnings.filterwarnings("ignore", category=DeprecationWarning)
PTX = sys.argv[1]
dev = torch.device("cuda")
mods = {name: cp.RawModule(path=os.path.join(PTX, name + ".ptx")) for name in ("gemv", "gdn", "attention")}


def ptr(t):
    return np.uint64(t.data_ptr())


def run(mod, name, grid, block, args, times=1):
    f = mods[mod].get_function(name)
    for _ in range(times):
        f(grid, block, args)
    cp.cuda.Device().synchronize()


# GEMV, M = 1, 17408 x 5120.
n, k = 17408, 5120
x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
w8 = torch.randn(n, k, device=dev).div_(4).to(torch.float8_e4m3fn).view(torch.uint8)
sc = torch.rand((n + 127) // 128, (k + 127) // 128, device=dev) + 0.5
w4 = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8)
s4 = (torch.rand(n, k // 16, device=dev) + 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
y = torch.empty(1, n, device=dev)
run("gemv", "fp8_block_gemv_m1_r2_u2", ((n + 15) // 16,), (256,),
    (ptr(x), ptr(w8), ptr(sc), ptr(y), np.int32(1), np.int32(n), np.int32(k)))
run("gemv", "nvfp4_gemv_m1", ((n + 7) // 8,), (256,),
    (ptr(x), ptr(w4), ptr(s4), np.float32(0.01), ptr(y), np.int32(1), np.int32(n), np.int32(k)))

# GDN decode, batch 32, Qwen3.8-27B heads.
b, hk, hv, d, kc = 32, 16, 48, 128, 4
cd = 2 * hk * d + hv * d
t = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
qkv, z, a, bb = t(b, cd), t(b, hv * d), t(b, hv), t(b, hv)
conv_w, a_log, dt_bias, norm_w = t(cd, kc), t(hv), t(hv), t(d)
conv_in, conv_out, st, out = t(b, cd, kc - 1), t(b, cd, kc - 1), t(b, hv, d, d) * 0.05, t(b, hv * d)
run("gdn", "gdn_decode_step", (hv, b), (256,),
    (ptr(qkv), ptr(z), ptr(a), ptr(bb), ptr(conv_w), ptr(a_log), ptr(dt_bias), ptr(norm_w), np.float32(1e-6),
     ptr(conv_in), ptr(conv_out), ptr(st), ptr(out), np.int32(hk), np.int32(hv), np.int32(kc)))

# Attention decode, 32k context, 24 query heads on 4 KV heads of 256, pages of 64.
hq, hkv, d, page, ctx = 24, 4, 256, 64, 32768
pages = ctx // page
kcache = torch.randn(pages, hkv, page, d, device=dev, dtype=torch.bfloat16)
vcache = torch.randn(pages, hkv, page, d, device=dev, dtype=torch.bfloat16)
table = torch.randperm(pages, device=dev, dtype=torch.int32)
lens = torch.tensor([ctx], device=dev, dtype=torch.int32)
q = torch.randn(1, hq, d, device=dev)
o = torch.empty(1, hq, d, device=dev)
splits = max(1, min(math.ceil(4 * 132 / hkv), math.ceil(ctx / 64)))
wsp = torch.empty(hq * 1024 * (d + 2), device=dev)  # room for any split count
run("attention", "attention_decode_split_D256_R6", (splits, hkv, 1), (96,),
    (ptr(q), ptr(kcache), ptr(vcache), ptr(table), ptr(lens), np.float32(1 / 16), ptr(o), ptr(wsp), np.int32(hq),
     np.int32(hkv), np.int32(page), np.int32(pages), np.int32(pages)))
splits_tc = max(1, min(math.ceil(5 * 132 / hkv), math.ceil(ctx / 64)))
run("attention", "attention_decode_tc_D256", (splits_tc, hkv, 1), (128,),
    (ptr(q), ptr(kcache), ptr(vcache), ptr(table), ptr(lens), np.float32(1 / 16), ptr(o), ptr(wsp), np.int32(hq),
     np.int32(hkv), np.int32(page), np.int32(pages), np.int32(pages)))
run("attention", "attention_decode_combine_D256", (hq, 1), (d, 4), (ptr(wsp), ptr(o), np.int32(hq), np.int32(splits)))
print("profile launches done")
