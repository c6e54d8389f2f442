"""Where fla's chunked gated DeltaNet prefill spends its time, kernel by kernel (issue 4: the numbers a redesign of
kernels/cuda/gdn_prefill.cu is measured against, stage by stage).

Usage (repository root, on the H200, fla importable): python3 kernels/bench/h200/profile_fla_gdn_prefill.py [--one]
(--one: the T = 4096 case only.) With TRITON_CACHE_DIR pointing at an empty folder, that folder then holds what
Triton compiled for each kernel (metadata json with warps, stages and shared memory; TTGIR; PTX).

Runs fla's `chunk_gated_delta_rule` exactly as bench_gdn_prefill.py's `fla_kernel` arm does (bf16 q, k repeated to
the 48 value heads, v, fp32 gates, bf16 beta, fp32 initial and final state, l2norm in the kernel) on that bench's
two --quick cases (T = 4096; B = 4, N = 9216: 4096, 1000, 3000 and 1120 tokens through cu_seqlens), warms it up
(Triton autotune), then records 20 calls under torch.profiler and prints, per CUDA kernel, its launches per call
and its mean time per call, with the sum; and, for comparison, the median of 20 event-timed eager calls (launch
gaps included, unlike the sum).
"""

import statistics
import sys

import torch
import torch.nn.functional as F

HK, HV, D = 16, 48, 128  # Qwen3.8-27B's GDN layer: key heads, value heads, head dim
CALLS = 20


def case(chunk, lens):
    n = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(1)
    rnd = lambda *s, amp=1.0: (torch.rand(*s, device="cuda", generator=g) * 2 - 1) * amp  # noqa: E731
    q = rnd(1, n, HK, D).repeat_interleave(HV // HK, 2).to(torch.bfloat16)
    k = rnd(1, n, HK, D).repeat_interleave(HV // HK, 2).to(torch.bfloat16)
    v = rnd(1, n, HV, D).to(torch.bfloat16)
    gate = (-rnd(HV).exp() * F.softplus(rnd(n, HV, amp=2.0) + rnd(HV))).reshape(1, n, HV)
    beta = rnd(n, HV, amp=3.0).sigmoid().to(torch.bfloat16).reshape(1, n, HV)
    state = rnd(len(lens), HV, D, D, amp=0.05)
    cu = None
    if len(lens) > 1:
        cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], device="cuda", dtype=torch.int32)

    def call():
        chunk(q, k, v, g=gate, beta=beta, initial_state=state, output_final_state=True,
              use_qk_l2norm_in_kernel=True, cu_seqlens=cu)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(CALLS):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        call()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        cnt, us = rows.get(ev.name, (0, 0.0))
        rows[ev.name] = (cnt + 1, us + ev.device_time_total)
    shape = f"T={n}" if len(lens) == 1 else f"B={len(lens)} N={n}"
    print(f"\nfla chunk_gated_delta_rule, {shape}: eager call median {statistics.median(times):.1f} us "
          f"(min {min(times):.1f}, max {max(times):.1f}) over {CALLS}")
    total = 0.0
    for name, (cnt, us) in sorted(rows.items(), key=lambda r: -r[1][1]):
        total += us / CALLS
        print(f"  {us / CALLS:9.1f} us  x{cnt / CALLS:4.1f}  {name[:110]}")
    print(f"  {total:9.1f} us  sum of kernel time per call")


def main():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as chunk
    import fla
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, fla {fla.__version__}")
    # bench_gdn_prefill.py --quick's cases: one sequence of 4096, and the ragged batch B = 4, N = 9216.
    for lens in ([4096],) if "--one" in sys.argv else ([4096], [4096, 1000, 3000, 1120]):
        try:
            case(chunk, lens)
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the other
            print(f"case {lens}: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
