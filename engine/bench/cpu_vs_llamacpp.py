"""edgefit's CPU engine against llama.cpp on the same random-weight checkpoint, arms interleaved, medians and spreads.

    python engine/bench/cpu_vs_llamacpp.py --llama-src DIR --model CKPT [--reps 3] [--threads 2] [--pp 512 --tg 128]
        [--edgefit-base BIN] [--int16-prefill-arm] [--no-bf16] [--max-load 0.5]

- CKPT: a checkpoint from `cargo run --release -p engine --example random_checkpoint -- CONFIG OUT` (never committed).
- DIR: llama.cpp's source tree (the one vendored by PyPI's `llama-cpp-python` sdist) with `build/bin/llama-bench`
  and `build/bin/llama-quantize` built (`cmake -B build -DGGML_NATIVE=ON && cmake --build build --target
  llama-bench llama-quantize`). Its `convert_hf_to_gguf.py` makes the bf16 GGUF; `llama-quantize` the Q4_0 one.
- Arms, in this order every repetition: llama.cpp bf16, edgefit bf16 (`--exact`), llama.cpp Q4_0, edgefit W4A16
  (the plan's path on this machine: int8 prompt activations where the plan says so), with `--edgefit-base BIN` a
  second W4A16 arm from another build (say, the commit before a kernel change), and with `--int16-prefill-arm` a
  W4A16 arm of the same binary planned with `--prefill-activations int16`; `--no-bf16` drops the two bf16 arms. Each prints pp and tg tok/s; edgefit also
  prints the read bandwidth measured in its run and its tg as a fraction of the weight-read roofline.
- The machine may be shared: before every repetition the script waits until the one-minute load average is below
  `--max-load` (default: no wait), and for every arm it prints the CPU time other processes took during it, as a
  share of the machine's cores (`others`): a number taken while others ran is not a number.

The random checkpoint's tokenizer is a byte-level BPE without merges, whose pre-tokenizer hash llama.cpp does not
know; the conversion pins it to Qwen2's (`qwen2`), which only names the pre-tokenizer in the GGUF: llama-bench feeds
token ids, never text.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def busy_jiffies():
    """Busy CPU time of the whole machine so far, in seconds (user + nice + system + irq + softirq + steal)."""
    f = open("/proc/stat").readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def load1():
    return float(open("/proc/loadavg").read().split()[0])


def convert(src: Path, model: Path, out: Path):
    if out.exists():
        return
    extra = []
    if json.loads((model / "config.json").read_text()).get("model_type", "").startswith("qwen3_5"):
        # The random checkpoint has no MTP head; the converter expects one unless told.
        extra = ["--no-mtp"]
    code = (
        "import sys; sys.path.insert(0, %r); sys.argv = %r\n"
        "import conversion.base as b\n"
        "b.TextModel.get_vocab_base_pre = lambda self, tok: 'qwen2'\n"
        "import convert_hf_to_gguf as c; c.main()\n"
    ) % (str(src), ["convert_hf_to_gguf.py", str(model), "--outtype", "bf16", "--outfile", str(out)] + extra)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=src)


def llama_bench(src: Path, gguf: Path, threads: int, pp: int, tg: int):
    out = subprocess.run(
        [str(src / "build/bin/llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", str(pp), "-n", str(tg),
         "-r", "1", "-o", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = json.loads(out)
    get = lambda p, n: next(r["avg_ts"] for r in rows if r["n_prompt"] == p and r["n_gen"] == n)
    return {"pp": get(pp, 0), "tg": get(0, tg)}


def edgefit_bench(binary: Path, model: Path, exact: bool, pp: int, tg: int, extra=()):
    cmd = [str(binary), "bench", "--model", str(model), "--profile", "avx512-2core", "--prompt-len", str(pp),
           "--gen", str(tg), "--max-model-len", str(pp + tg + 16)] + list(extra)
    if exact:
        cmd.append("--exact")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    pp_ts = float(re.search(r"\| pp\d+ \| ([\d.]+) \|", out).group(1))
    tg_ts = float(re.search(r"\| tg\d+ \| ([\d.]+) \|", out).group(1))
    m = re.search(r"bandwidth now ([\d.]+) GB/s -> roofline ([\d.]+) tok/s; tg at ([\d.]+)", out)
    acts = re.search(r"prefill activations: (.*)", out)
    return {"pp": pp_ts, "tg": tg_ts, "bw": float(m.group(1)), "roof": float(m.group(2)), "frac": float(m.group(3)),
            "acts": acts.group(1) if acts else "(not printed)"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-src", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--edgefit", type=Path, default=Path("target/release/edgefit"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--edgefit-base", type=Path, default=None)
    ap.add_argument("--int16-prefill-arm", action="store_true")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--max-load", type=float, default=None)
    a = ap.parse_args()
    bf16 = a.model.parent / (a.model.name + "-bf16.gguf")
    q4 = a.model.parent / (a.model.name + "-q4_0.gguf")
    convert(a.llama_src, a.model, bf16)
    if not q4.exists():
        subprocess.run([str(a.llama_src / "build/bin/llama-quantize"), str(bf16), str(q4), "Q4_0"], check=True,
                       capture_output=True)
    arms = {
        "llama.cpp bf16": lambda: llama_bench(a.llama_src, bf16, a.threads, a.pp, a.tg),
        "edgefit bf16": lambda: edgefit_bench(a.edgefit, a.model, True, a.pp, a.tg),
        "llama.cpp Q4_0": lambda: llama_bench(a.llama_src, q4, a.threads, a.pp, a.tg),
        "edgefit W4A16": lambda: edgefit_bench(a.edgefit, a.model, False, a.pp, a.tg),
    }
    if a.edgefit_base is not None:
        arms["edgefit W4A16 (base)"] = lambda: edgefit_bench(a.edgefit_base, a.model, False, a.pp, a.tg)
    if a.int16_prefill_arm:
        arms["edgefit W4A16 int16 prefill"] = lambda: edgefit_bench(
            a.edgefit, a.model, False, a.pp, a.tg, ["--prefill-activations", "int16"])
    if a.no_bf16:
        arms = {k: v for k, v in arms.items() if "bf16" not in k}
    res = {k: [] for k in arms}
    cores = os.cpu_count()
    for rep in range(a.reps):
        if a.max_load is not None:
            while load1() >= a.max_load:
                print(f"rep {rep}: load average {load1():.2f} >= {a.max_load}, waiting", flush=True)
                time.sleep(15)
        for name, run in arms.items():
            l0, b0, c0, t0 = load1(), busy_jiffies(), children_cpu(), time.time()
            r = run()
            wall = time.time() - t0
            r["others"] = max(0.0, (busy_jiffies() - b0) - (children_cpu() - c0)) / (wall * cores)
            r["load_before"] = l0
            res[name].append(r)
            print(f"rep {rep} {name}: {r}", flush=True)

    def med(name, key):
        v = [r[key] for r in res[name]]
        return statistics.median(v), (max(v) - min(v)) / statistics.median(v)

    print(f"\n| arm | pp{a.pp} tok/s (spread) | tg{a.tg} tok/s (spread) | tg / roofline | others' CPU (max) |")
    print("|---|---|---|---|---|")
    for name in arms:
        (pp, pps), (tg, tgs) = med(name, "pp"), med(name, "tg")
        roof = f"{med(name, 'frac')[0]:.2f} (bw {med(name, 'bw')[0]:.1f} GB/s)" if "edgefit" in name else ""
        others = max(r["others"] for r in res[name])
        print(f"| {name} | {pp:.2f} ({pps:.0%}) | {tg:.2f} ({tgs:.0%}) | {roof} | {others:.0%} |")
    pairs = [("edgefit bf16", "llama.cpp bf16"), ("edgefit W4A16", "llama.cpp Q4_0"),
             ("edgefit W4A16 (base)", "llama.cpp Q4_0"), ("edgefit W4A16", "edgefit W4A16 (base)"),
             ("edgefit W4A16 int16 prefill", "llama.cpp Q4_0"), ("edgefit W4A16", "edgefit W4A16 int16 prefill")]
    for ours, theirs in pairs:
        if ours not in arms or theirs not in arms:
            continue
        print(f"{ours} / {theirs}: pp {med(ours, 'pp')[0] / med(theirs, 'pp')[0]:.2f}x, "
              f"tg {med(ours, 'tg')[0] / med(theirs, 'tg')[0]:.2f}x")


if __name__ == "__main__":
    main()
