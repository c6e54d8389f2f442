#!/usr/bin/env python3
"""Reads a `cupti_trace.c` trace of an `edgefit bench` run and says where each step's GPU time went.

A step ends with the kernel that picks its tokens (argmax or sampling), so the prompt is one step and each decode
step one more. Per step: the GPU span from its first kernel's start to the picking kernel's end, the time some
kernel was running (the union of the kernels' intervals), the idle rest, and the gap to the next step (host work
between steps). Then, for the decode step at the median of the span and for the prompt, the GPU time by kernel
name, and the idle gaps by length. `--step-out FILE` writes that decode step's kernels one a line (start offset,
duration, gap before, name): the timeline of one decode step.

Usage: cupti_timeline.py TRACE.tsv [--step-out STEP.tsv] [--top 15]
"""
import argparse
import collections
import statistics
import sys


def read(path):
    kernels, copies, api = [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.startswith("# dropped"):
                sys.exit(f"{path}: CUPTI {line[2:].strip()}: gaps in this trace would read as idle time")
            if line.startswith("#"):
                continue
            p = line.rstrip("\n").split("\t")
            if len(p) < 8:
                sys.exit(f"{path}:{n}: expected 8 tab-separated fields (cupti_trace.c's format), got {len(p)}")
            try:
                rec = (int(p[1]), int(p[2]), p[7], int(p[3]), int(p[5]))
            except ValueError:
                sys.exit(f"{path}:{n}: expected integer start, end, stream and graph fields (cupti_trace.c's "
                         f"format), got {line.strip()[:120]!r}")
            {"K": kernels, "C": copies, "S": copies, "D": api}.get(p[0], []).append(rec)
    kernels.sort()
    copies.sort()
    api.sort()
    return kernels, copies, api


def busy(intervals):
    """The union's length of (start, end) intervals sorted by start."""
    total, cur_s, cur_e = 0, None, None
    for s, e in intervals:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def gaps(ks):
    """Idle stretches between kernels (sorted by start), in ns."""
    out, end = [], None
    for s, e, *_ in ks:
        if end is not None and s > end:
            out.append(s - end)
        end = e if end is None else max(end, e)
    return out


def short(name):
    return name.split("(")[0][:60]


def by_name(ks, top):
    t, n = collections.defaultdict(int), collections.Counter()
    for s, e, name, *_ in ks:
        t[short(name)] += e - s
        n[short(name)] += 1
    tot = sum(t.values()) or 1
    rows = sorted(t.items(), key=lambda x: -x[1])
    for name, v in rows[:top]:
        print(f"  {v/1e6:8.3f} ms {100*v/tot:5.1f}% {n[name]:5d} x {v/n[name]/1e3:7.2f} us  {name}")
    rest = sum(v for _, v in rows[top:])
    if rest:
        print(f"  {rest/1e6:8.3f} ms {100*rest/tot:5.1f}%   (the other {len(rows) - top} kernel names)")


def gap_table(g):
    edges = [(0, 1e3, "< 1 us"), (1e3, 5e3, "1-5 us"), (5e3, 20e3, "5-20 us"), (20e3, 100e3, "20-100 us"),
             (100e3, float("inf"), ">= 100 us")]
    for lo, hi, label in edges:
        sel = [x for x in g if lo <= x < hi]
        print(f"  {label:>10}: {len(sel):5d} gaps, {sum(sel)/1e6:8.3f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--step-out")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    kernels, copies, api = read(a.trace)
    if not kernels:
        sys.exit(f"{a.trace}: no kernel records (was the library loaded? CUDA_INJECTION64_PATH)")
    steps, cur = [], []
    for k in kernels:
        cur.append(k)
        if short(k[2]).startswith(("argmax", "sample_topk")):
            steps.append(cur)
            cur = []
    if not steps:
        sys.exit(f"{a.trace}: no step ends (argmax / sample_topk kernels) among {len(kernels)} kernels")
    print(f"{a.trace}: {len(kernels)} kernels, {len(copies)} copies/memsets, {len(api)} driver calls, "
          f"{len(steps)} steps (a step ends with its argmax / sampling kernel)")
    print("step  kernels  span ms  busy ms  idle ms  busy  gap to next ms")
    rows = []
    for i, ks in enumerate(steps):
        span = ks[-1][1] - ks[0][0]
        b = busy([(s, e) for s, e, *_ in ks])
        nxt = steps[i + 1][0][0] - ks[-1][1] if i + 1 < len(steps) else 0
        rows.append((i, len(ks), span, b, nxt))
        print(f"{i:4d} {len(ks):8d} {span/1e6:8.3f} {b/1e6:8.3f} {(span-b)/1e6:8.3f} {b/max(span,1):5.2f} "
              f"{nxt/1e6:10.3f}")
    # Decode steps: the steps after the largest (the timed prompt) with few kernels; the median by span.
    prompt = max(range(len(rows)), key=lambda i: rows[i][1])
    decode = [r for r in rows[prompt + 1:]]
    if decode:
        spans = [r[2] for r in decode]
        med = statistics.median(spans)
        pick = min(decode, key=lambda r: abs(r[2] - med))
        ks = steps[pick[0]]
        print(f"\ndecode: {len(decode)} steps after the prompt, GPU span median {med/1e6:.3f} ms "
              f"(min {min(spans)/1e6:.3f}, max {max(spans)/1e6:.3f}); busy median "
              f"{statistics.median(r[3] for r in decode)/1e6:.3f} ms; step period median "
              f"{statistics.median(r[2] + r[4] for r in decode[:-1]) / 1e6 if len(decode) > 1 else 0:.3f} ms")
        print(f"step {pick[0]} (the median one): {len(ks)} kernels, span {pick[2]/1e6:.3f} ms, busy "
              f"{pick[3]/1e6:.3f} ms; GPU time by kernel:")
        by_name(ks, a.top)
        print("  idle gaps inside the step:")
        gap_table(gaps(ks))
        if a.step_out:
            t0, end = ks[0][0], None
            with open(a.step_out, "w") as f:
                f.write("start_us\tdur_us\tgap_before_us\tstream\tgraph\tkernel\n")
                for s, e, name, stream, graph in ks:
                    gap = 0 if end is None else max(0, s - end)
                    end = e if end is None else max(end, e)
                    f.write(f"{(s-t0)/1e3:.2f}\t{(e-s)/1e3:.2f}\t{gap/1e3:.2f}\t{stream}\t{graph}\t{short(name)}\n")
            print(f"  (every kernel of the step, in order: {a.step_out})")
    ks = steps[prompt]
    span, b = rows[prompt][2], rows[prompt][3]
    print(f"\nthe largest step, {prompt} (the prompt, with what ran before its first token: load, warm-up): "
          f"{len(ks)} kernels, span {span/1e6:.3f} ms, busy {b/1e6:.3f} ms ({b/max(span,1):.2f}); "
          "GPU time by kernel:")
    by_name(ks, a.top)
    print("  idle gaps inside the prompt:")
    gap_table(gaps(ks))


if __name__ == "__main__":
    main()
