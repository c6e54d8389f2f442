"""edgefit's CPU engine against llama.cpp on the same random-weight checkpoint, arms interleaved, medians and spreads.

    python engine/bench/cpu_vs_llamacpp.py --llama-src DIR --model CKPT [--reps 3] [--threads 2] [--pp 512 --tg 128]

- CKPT: a checkpoint from `cargo run --release -p engine --example random_checkpoint -- CONFIG OUT` (never committed).
- DIR: llama.cpp's source tree (the one vendored by PyPI's `llama-cpp-python` sdist) with `build/bin/llama-bench`
  and `build/bin/llama-quantize` built (`cmake -B build -DGGML_NATIVE=ON && cmake --build build --target
  llama-bench llama-quantize`). Its `convert_hf_to_gguf.py` makes the bf16 GGUF; `llama-quantize` the Q4_0 one.
- Arms, in this order every repetition: llama.cpp bf16, edgefit bf16 (`--exact`), llama.cpp Q4_0, edgefit W4A16
  (the plan's path on this machine). Each prints pp and tg tok/s; edgefit also prints the read bandwidth measured in
  its run and its tg as a fraction of the weight-read roofline.

The random checkpoint's tokenizer is a byte-level BPE without merges, whose pre-tokenizer hash llama.cpp does not
know; the conversion pins it to Qwen2's (`qwen2`), which only names the pre-tokenizer in the GGUF: llama-bench feeds
token ids, never text.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path


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


def edgefit_bench(binary: Path, model: Path, exact: bool, pp: int, tg: int):
    cmd = [str(binary), "bench", "--model", str(model), "--profile", "avx512-2core", "--prompt-len", str(pp),
           "--gen", str(tg), "--max-model-len", str(pp + tg + 16)]
    if exact:
        cmd.append("--exact")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    pp_ts = float(re.search(r"\| pp\d+ \| ([\d.]+) \|", out).group(1))
    tg_ts = float(re.search(r"\| tg\d+ \| ([\d.]+) \|", out).group(1))
    m = re.search(r"read bandwidth now ([\d.]+) GB/s -> roofline ([\d.]+) tok/s; tg at ([\d.]+)", out)
    return {"pp": pp_ts, "tg": tg_ts, "bw": float(m.group(1)), "roof": float(m.group(2)), "frac": float(m.group(3))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-src", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--edgefit", type=Path, default=Path("target/release/edgefit"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
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
    res = {k: [] for k in arms}
    for rep in range(a.reps):
        for name, run in arms.items():
            r = run()
            res[name].append(r)
            print(f"rep {rep} {name}: {r}", flush=True)

    def med(name, key):
        v = [r[key] for r in res[name]]
        return statistics.median(v), (max(v) - min(v)) / statistics.median(v)

    print(f"\n| arm | pp{a.pp} tok/s (spread) | tg{a.tg} tok/s (spread) | tg / roofline |")
    print("|---|---|---|---|")
    for name in arms:
        (pp, pps), (tg, tgs) = med(name, "pp"), med(name, "tg")
        roof = f"{med(name, 'frac')[0]:.2f} (bw {med(name, 'bw')[0]:.1f} GB/s)" if "edgefit" in name else ""
        print(f"| {name} | {pp:.2f} ({pps:.0%}) | {tg:.2f} ({tgs:.0%}) | {roof} |")
    for ours, theirs in [("edgefit bf16", "llama.cpp bf16"), ("edgefit W4A16", "llama.cpp Q4_0")]:
        print(f"{ours} / {theirs}: pp {med(ours, 'pp')[0] / med(theirs, 'pp')[0]:.2f}x, "
              f"tg {med(ours, 'tg')[0] / med(theirs, 'tg')[0]:.2f}x")


if __name__ == "__main__":
    main()
