"""PyTorch CPU baselines for `cargo bench -p kernels --bench cpu_gemv` (run by the bench itself).

Times, on the same shapes and the same working-set size as the Rust bench:
  torch_int4_gemv   torch._weight_int4pack_mm_for_cpu (tinygemm int4, bf16 activations), one row
  torch_bf16_gemv   torch.nn.functional.linear in bf16, one row
  torch_int4_gemm / torch_bf16_gemm   the same with many rows (prefill)
on 1 thread and on all threads, repetitions interleaved across arms. Each GEMV arm walks a list of distinct
matrices whose total size is --mib, so the weights come from DRAM, not the last-level cache.

It also checks that the packed bytes of torch's int4 packer are the layout edgefit packs ([N/64][K][32], byte d =
column d low nibble | column d+32 high nibble) and that torch decodes them as (q - 8) * scale + zero, so the two
int4 arms read the same bytes and compute the same thing.

Standalone, it prints one `RESULT arm threads median_s min_s max_s bytes flops` line per arm. With --serve (how
the Rust bench runs it) it builds the same data, prints `READY <int4 copies> <bf16 copies>`, then answers each
stdin line `<arm> <threads>` with the seconds one call took, so the Rust bench can interleave these arms with its
own within every repetition.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


def check_layout():
    n, k, g = 128, 256, 64
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1).contiguous().view(torch.uint8).numpy().reshape(-1)
    qn = q.numpy().astype(np.uint8)
    ours = np.concatenate(
        [((qn[b * 64 : b * 64 + 32].T) | (qn[b * 64 + 32 : b * 64 + 64].T << 4)).reshape(-1) for b in range(n // 64)]
    )
    s = torch.rand(k // g, n) * 0.1 + 0.01
    z = torch.randn(k // g, n) * 0.1
    sz = torch.stack([s, z], -1).to(torch.bfloat16)
    y = torch._weight_int4pack_mm_for_cpu(torch.eye(k, dtype=torch.bfloat16), torch.from_numpy(packed.reshape(n, k // 2)), g, sz).float()
    scale = sz[..., 0].float().repeat_interleave(g, 0)
    zero = sz[..., 1].float().repeat_interleave(g, 0)
    want = (q.float().T - 8) * scale + zero  # [k, n]
    err = (y - want).abs().max().item()
    ok = np.array_equal(ours, packed) and err < 0.01
    print(f"LAYOUT {'ok' if ok else 'MISMATCH'} bytes_equal={np.array_equal(ours, packed)} max_decode_err={err:.4g}", flush=True)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--mib", type=int, default=1536)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--gemm-m", type=int, default=64)
    ap.add_argument("--gemm-n", type=int, default=4096)
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    check_layout()
    all_threads = os.cpu_count() or 1
    n, k, g = a.n, a.k, a.group

    int4_bytes = n * k // 2 + (k // g) * n * 2 * 2
    copies = max(1, (a.mib << 20) // int4_bytes)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    del q
    int4 = []
    for _ in range(copies):
        sz = torch.stack([torch.rand(k // g, n) * 0.01 + 0.001, torch.randn(k // g, n) * 0.01], -1).to(torch.bfloat16)
        int4.append((packed.clone(), sz))
    del packed
    bf16_bytes = n * k * 2
    bcopies = max(1, (a.mib << 20) // bf16_bytes)
    bf16 = [(torch.randn(n, k) * 0.02).to(torch.bfloat16) for _ in range(bcopies)]
    x1 = torch.randn(1, k).to(torch.bfloat16)

    gm, gn = a.gemm_m, a.gemm_n
    xg = torch.randn(gm, k).to(torch.bfloat16)
    qg = torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (gn, k), dtype=torch.int32), 1)
    szg = torch.stack([torch.rand(k // g, gn) * 0.01, torch.randn(k // g, gn) * 0.01], -1).to(torch.bfloat16)
    wg = (torch.randn(gn, k) * 0.02).to(torch.bfloat16)

    arms = {
        "torch_int4_gemv": (lambda: [torch._weight_int4pack_mm_for_cpu(x1, p, g, s) for p, s in int4], copies * int4_bytes, 2 * n * k * copies),
        "torch_bf16_gemv": (lambda: [torch.nn.functional.linear(x1, w) for w in bf16], bcopies * bf16_bytes, 2 * n * k * bcopies),
        "torch_int4_gemm": (lambda: torch._weight_int4pack_mm_for_cpu(xg, qg, g, szg), gn * k // 2, 2 * gm * gn * k),
        "torch_bf16_gemm": (lambda: torch.nn.functional.linear(xg, wg), gn * k * 2, 2 * gm * gn * k),
    }
    if a.serve:
        with torch.inference_mode():
            for fn, _, _ in arms.values():  # warm-up: first calls allocate and pick kernels
                fn()
            print(f"READY {copies} {bcopies}", flush=True)
            for line in sys.stdin:
                parts = line.split()
                if not parts or parts[0] == "quit":
                    break
                torch.set_num_threads(int(parts[1]))
                print(f"{timed(arms[parts[0]][0]):.9g}", flush=True)
        return
    times = {(name, t): [] for name in arms for t in (1, all_threads)}
    with torch.inference_mode():
        for name, (fn, _, _) in arms.items():  # warm-up: first calls allocate and pick kernels
            fn()
        for _ in range(a.reps):
            for t in (1, all_threads):
                torch.set_num_threads(t)
                for name, (fn, _, _) in arms.items():
                    times[(name, t)].append(timed(fn))
    for (name, t), ts in times.items():
        _, nbytes, flops = arms[name]
        print(f"RESULT {name} {t} {statistics.median(ts):.6g} {min(ts):.6g} {max(ts):.6g} {nbytes} {flops}")


if __name__ == "__main__":
    main()
