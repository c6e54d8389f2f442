"""The baseline a user would run instead of edgefit on the H200: transformers (with flash-linear-attention's kernels
for the DeltaNet layers when its wheel is installed) on a model of the same geometry, bf16, random weights, greedy
decode with its own cache. vLLM does not fit the lent machine. Also measures the device's copy bandwidth (read +
write, as benchmarks/h200.md counts it) in the same run, the roofline's denominator.

Usage: python3 engine/bench/h200/hf_baseline.py models/qwen3.8-27b-fp8 [--batch 1,8] [--prompt-len 512] [--gen 32]
Prints one JSON object per measurement.
"""
import argparse
import json
import time

import torch
import transformers


def copy_bandwidth():
    x = torch.empty(256 << 20, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    best = 0.0
    for _ in range(10):
        torch.cuda.synchronize()
        t = time.perf_counter()
        y.copy_(x)
        torch.cuda.synchronize()
        best = max(best, 2 * x.numel() * 4 / (time.perf_counter() - t))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("card")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    a = ap.parse_args()
    print(json.dumps({"what": "copy_bandwidth", "bytes_per_s": copy_bandwidth()}), flush=True)
    cfg = json.load(open(f"{a.card}/config.json"))
    text = cfg.get("text_config", cfg)
    text = {k: v for k, v in text.items() if k not in ("quantization_config",)}
    mt = text.get("model_type", cfg["model_type"])
    if mt == "qwen3_5":
        mt = "qwen3_5_text"
    conf = transformers.AutoConfig.for_model(mt, **{k: v for k, v in text.items() if k != "model_type"})
    try:
        import fla  # noqa: F401

        kernels = "fla"
    except ImportError:
        kernels = "torch fallback"
    t = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"what": "model", "model_type": mt, "params": params, "gdn_kernels": kernels,
                      "transformers": transformers.__version__, "torch": torch.__version__,
                      "build_s": time.perf_counter() - t}), flush=True)
    vocab = conf.vocab_size
    for b in [int(x) for x in a.batch.split(",")]:
        ids = (torch.arange(a.prompt_len, device="cuda") * 7919 + 13) % vocab
        ids = ids.unsqueeze(0).repeat(b, 1)
        with torch.no_grad():
            # One warm-up prefill + step (kernels compile and autotune on first use).
            out = model(ids[:, :16], use_cache=True)
            model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(ids, use_cache=True)
            torch.cuda.synchronize()
            pp = time.perf_counter() - t0
            cache = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for _ in range(a.gen):
                out = model(tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            tg = time.perf_counter() - t1
        print(json.dumps({"what": "bench", "batch": b, "prompt_len": a.prompt_len, "gen": a.gen,
                          "prefill_tok_s": b * a.prompt_len / pp, "decode_tok_s_per_seq": a.gen / tg,
                          "decode_tok_s": b * a.gen / tg}), flush=True)
        del out, cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
