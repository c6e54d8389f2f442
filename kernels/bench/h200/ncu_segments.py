"""Where a kernel's time goes, barrier to barrier: reads Nsight Compute's source page exported as CSV
(`ncu --import R.ncu-rep --page source --csv --print-source sass > S.csv`, gzipped or not) and prints, per kernel,
the stretches of SASS between two BAR.SYNC instructions with their share of the warp-stall samples and of the
executed instructions, the top stall reasons and the most executed opcodes. Stretches under 1% of the samples are
left out. A barrier's own stall is sampled on the instructions after it, so a stretch that begins after a barrier
inside a loop carries part of that loop's barrier time.

Usage: python3 kernels/bench/h200/ncu_segments.py S.csv[.gz]
"""
import collections
import csv
import gzip
import sys


def kernels(path):
    opener = gzip.open if path.endswith(".gz") else open
    out, cur, seen = [], None, set()
    with opener(path, "rt") as fh:
        for r in csv.reader(fh):
            if r and r[0] == "Kernel Name":
                cur = None if r[1] in seen else {"name": r[1], "rows": []}  # ncu lists a kernel once per launch
                seen.add(r[1])
                if cur is not None:
                    out.append(cur)
            elif cur is not None and r and r[0] == "Address":
                cur["hdr"] = {n: i for i, n in enumerate(r)}
            elif cur is not None and len(r) > 5:
                cur["rows"].append(r)
    return out


def report(k):
    ix = k["hdr"]
    stalls = [n for n in ix if n.startswith("stall_") and "Not Issued" not in n]
    num = lambda r, n: int(r[ix[n]] or 0)  # noqa: E731
    samples = sum(num(r, "Warp Stall Sampling (All Samples)") for r in k["rows"])
    instr = sum(num(r, "Instructions Executed") for r in k["rows"])
    print(f"== {k['name']}: {samples} samples, {instr} warp instructions")
    seg = None
    for i, r in enumerate(k["rows"]):
        if seg is None:
            seg = {"first": r[0], "s": 0, "n": 0, "st": collections.Counter(), "ops": collections.Counter()}
        src = r[1].strip()
        words = src.split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else ""))
        seg["s"] += num(r, "Warp Stall Sampling (All Samples)")
        seg["n"] += num(r, "Instructions Executed")
        seg["ops"][op.split(".")[0]] += num(r, "Instructions Executed")
        for n in stalls:
            seg["st"][n[6:]] += num(r, n)
        if "BAR.SYNC" in src or i == len(k["rows"]) - 1:
            if seg["s"] * 100 >= samples:
                top = [(n, round(100 * v / max(seg["s"], 1))) for n, v in seg["st"].most_common(4)]
                print(f"  {seg['first'][-5:]}..{r[0][-5:]}: {100 * seg['s'] / samples:5.1f}% of samples, "
                      f"{100 * seg['n'] / instr:5.1f}% of instructions; stalls % {top}; "
                      f"ops {seg['ops'].most_common(6)}")
            seg = None


if __name__ == "__main__":
    for k in kernels(sys.argv[1]):
        report(k)
