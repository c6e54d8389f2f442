"""Every variant of edgefit's fused gated DeltaNet decode step (kernels/cuda/gdn.cu) on the H200, beside the
current kernel (block_per_head), fla's fused_recurrent_gated_delta_rule alone (the bare recurrence, with its
l2norm / gate / beta-sigmoid fusions on) and the whole step as a model runs it with fla (torch conv + fla +
torch gated RMSNorm), at batch 1, 2, 3, 4, 8, 16, 32 for Qwen3.8-27B's GDN layer (Hk=16, Hv=48, dk=dv=128, K=4).
Which variant `auto` runs at each batch is read from kernels/src/cuda/gdn.rs (AUTO_TABLE) and printed beside the
measured best, so a stale table shows.

The byte floor: the fp32 state read and written once, the per-token inputs (qkv, z, a, b), the output, the conv
history read and written, the conv weights once; over the copy bandwidth measured in this run. fla's floor is the
same for its own traffic (state twice, q, k, v, g, beta, o). Method and helpers: bench.py (CUDA graphs rotating
over inputs larger than L2, arms alternating, medians and spreads).

Usage: python3 kernels/bench/h200/bench_gdn_decode.py PTX_DIR     (writes $OUT/bench_gdn_decode.json)
"""

import json
import os
import re
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as b  # noqa: E402  (reads sys.argv[1] as the PTX dir)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dev = b.dev
HK, HV, D, KC = 16, 48, 128, 4
CD = 2 * HK * D + HV * D
EPS = 1e-6
# name -> (entry point, blocks per head, threads): kernels/src/cuda/gdn.rs KERNELS, the same table.
VARIANTS = {"block_per_head": ("gdn_decode_step", 1, 256)}
for _s, _t in ((2, 128), (2, 256), (4, 128), (8, 128)):
    VARIANTS[f"split{_s}_t{_t}_1r"] = (f"gdn_decode_step_split{_s}_t{_t}_1r", _s, _t)
BATCHES = [1, 2, 3, 4, 8, 16, 32]


def auto_table():
    """[(largest batch, variant)] from kernels/src/cuda/gdn.rs's AUTO_TABLE, or None (reported) if it cannot be
    read."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "cuda", "gdn.rs")
    try:
        src = open(path).read()
        body = re.search(r"const AUTO_TABLE: \[\(usize, &str\); \d+\] = \[(.*?)\];", src, re.S).group(1)
        rows = [(int(m) if m != "usize::MAX" else 1 << 62, n)
                for m, n in re.findall(r'\(\s*(\d+|usize::MAX)\s*,\s*"(\w+)"\s*\)', body)]
        if not rows:
            raise ValueError("no rows")
        return rows
    except Exception as e:  # noqa: BLE001
        b.log(f"cannot read AUTO_TABLE from {path}: {type(e).__name__}: {e}")
        return None


def auto_pick(table, bsz):
    if table is None:
        return "?"
    for mx, name in table:
        if bsz <= mx:
            return name
    return table[-1][1]


T0 = time.time()


def floors(bsz):
    state = bsz * HV * D * D * 4
    ours = 2 * state + bsz * (CD + 2 * HV * D + 2 * HV) * 4 + 2 * bsz * CD * (KC - 1) * 4 + CD * KC * 4
    fla = 2 * state + bsz * (2 * HK * D + 2 * HV * D + 2 * HV) * 4
    return ours, fla


def launcher(name, t):
    entry, s, threads = VARIANTS[name]
    fn = b.kern("gdn", entry)

    def call(i):
        b.launch(fn, (HV * s, t["bsz"]), (threads,),
                 (b.ptr(t["qkv"][i]), b.ptr(t["z"][i]), b.ptr(t["a"][i]), b.ptr(t["b"][i]), b.ptr(t["conv_w"]),
                  b.ptr(t["a_log"]), b.ptr(t["dt_bias"]), b.ptr(t["norm_w"]), np.float32(EPS),
                  b.ptr(t["conv"][i]), b.ptr(t["conv_out"]), b.ptr(t["st"][i]), b.ptr(t["out"]), np.int32(HK),
                  np.int32(HV), np.int32(KC)))
    return call


def rel(x, y):
    return float((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-300))


def check(t, names, fla_fn):
    """Runs every variant once on the same inputs (set 0, state copied) and compares out, state and the conv
    history against block_per_head; fla's whole step against it too (semantics check, reported). Returns the
    names that match."""
    ref = {}
    ok = []
    for name in ["block_per_head"] + [n for n in names if n != "block_per_head"]:
        st0 = t["st"][0].clone()
        try:
            t2 = dict(t)
            t2["st"] = [st0]
            t2["out"] = torch.full_like(t["out"], float("nan"))
            t2["conv_out"] = torch.full_like(t["conv_out"], float("nan"))
            launcher(name, t2)(0)
            torch.cuda.synchronize()
            got = (t2["out"].clone(), st0, t2["conv_out"].clone())
        except Exception as e:  # noqa: BLE001
            b.log(f"  {name}: launch failed: {type(e).__name__}: {e}")
            continue
        if name == "block_per_head":
            ref = got
            ok.append(name)
            continue
        if not ref:
            b.log(f"  {name}: not checked (block_per_head failed), dropped")
            continue
        eo, es = rel(got[0], ref[0]), rel(got[1], ref[1])
        ec = rel(got[2], ref[2])
        fine = eo < 1e-4 and es < 1e-5 and ec == 0.0 and bool(torch.isfinite(got[0]).all())
        if not fine:
            b.log(f"  {name}: MISMATCH vs block_per_head: out {eo:.2e}, state {es:.2e}, conv {ec:.2e} (dropped)")
        else:
            ok.append(name)
    if fla_fn is not None and ref:
        try:
            st0 = t["st"][0].clone()
            o = fla_fn(0, st0)
            torch.cuda.synchronize()
            b.log(f"  fla whole step vs block_per_head: out {rel(o, ref[0]):.2e}, state {rel(st0, ref[1]):.2e}")
        except Exception as e:  # noqa: BLE001
            b.log(f"  fla whole step check failed: {type(e).__name__}: {e}")
    return ok


def run_batch(bsz, bw, fused, rows, summary, table):
    ours_floor, fla_floor = floors(bsz)
    state_bytes = bsz * HV * D * D * 4
    sets = b.n_sets(2 * state_bytes, floor=2)
    t = {
        "bsz": bsz,
        "qkv": [torch.randn(bsz, CD, device=dev) for _ in range(sets)],
        "z": [torch.randn(bsz, HV * D, device=dev) for _ in range(sets)],
        "a": [torch.randn(bsz, HV, device=dev) for _ in range(sets)],
        "b": [torch.randn(bsz, HV, device=dev) for _ in range(sets)],
        "conv": [torch.randn(bsz, CD, KC - 1, device=dev) for _ in range(sets)],
        "conv_out": torch.empty(bsz, CD, KC - 1, device=dev),
        "st": [torch.randn(bsz, HV, D, D, device=dev) * 0.05 for _ in range(sets)],
        "out": torch.empty(bsz, HV * D, device=dev),
        "conv_w": W["conv_w"], "a_log": W["a_log"], "dt_bias": W["dt_bias"], "norm_w": W["norm_w"],
    }
    fla_step = None
    arms = {}
    if fused is not None:
        q4 = [torch.randn(bsz, 1, HK, D, device=dev) for _ in range(sets)]
        k4 = [torch.randn(bsz, 1, HK, D, device=dev) for _ in range(sets)]
        v4 = [torch.randn(bsz, 1, HV, D, device=dev) for _ in range(sets)]

        def fla_kernel(i):
            fused(q4[i], k4[i], v4[i], g=t["a"][i].view(bsz, 1, HV), beta=t["b"][i].view(bsz, 1, HV),
                  initial_state=t["st"][i], output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, A_log=t["a_log"], dt_bias=t["dt_bias"], use_beta_sigmoid_in_kernel=True)

        def fla_step(i, st):
            window = torch.cat([t["conv"][i], t["qkv"][i].unsqueeze(-1)], -1)
            y = F.silu((window * t["conv_w"]).sum(-1))
            t["conv_out"].copy_(window[..., 1:])
            q, k, v = y.split([HK * D, HK * D, HV * D], -1)
            o, fin = fused(q.reshape(bsz, 1, HK, D), k.reshape(bsz, 1, HK, D), v.reshape(bsz, 1, HV, D),
                           g=t["a"][i].view(bsz, 1, HV), beta=t["b"][i].view(bsz, 1, HV), initial_state=st,
                           output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                           A_log=t["a_log"], dt_bias=t["dt_bias"], use_beta_sigmoid_in_kernel=True)
            st.copy_(fin)  # ours updates in place; the model would keep fla's final state as the next one
            o = o.reshape(bsz, HV, D)
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS) * t["norm_w"]
            return o.reshape(bsz, HV * D) * F.silu(t["z"][i])

        arms["fla_kernel"] = fla_kernel
        arms["fla_pipeline"] = lambda i: fla_step(i, t["st"][i])
    names = check(t, list(VARIANTS), fla_step)
    for n in names:
        arms[n] = launcher(n, t)
    # Two yardsticks for the small batches, where the step is latency, not bytes: a bare copy of one state set into
    # the next (the state's read + write at this size, one torch launch, no compute) and a one-element add (what
    # a graph node costs with nothing to do).
    tiny = torch.zeros(1, device=dev)
    arms["copy_state"] = lambda i: t["st"][(i + 1) % sets].copy_(t["st"][i])
    arms["tiny_launch"] = lambda i: tiny.add_(1.0)
    res = b.time_arms(arms, sets, 100)
    base = res["block_per_head"]
    shape = f"B={bsz} Hk={HK} Hv={HV} 128x128"
    for n in names:
        r = b.row("gdn_decode_var", f"B={bsz} {n}", res[n], "block_per_head", base, bytes_moved=ours_floor,
                  ceiling=bw)
        r["floor_us"] = ours_floor / bw * 1e6
        r["frac_floor"] = r["floor_us"] / r["ours_us"]
        rows.append(r)
    best = min(names, key=lambda n: res[n][0])
    auto = auto_pick(table, bsz)
    entry = {"batch": bsz, "best": best, "best_us": res[best][0] * 1e6, "block_per_head_us": base[0] * 1e6,
             "auto": auto, "auto_us": res[auto][0] * 1e6 if auto in res else float("nan"),
             "floor_us": ours_floor / bw * 1e6, "fla_floor_us": fla_floor / bw * 1e6,
             "variants_us": {n: res[n][0] * 1e6 for n in names},
             "copy_state_us": res["copy_state"][0] * 1e6, "tiny_launch_us": res["tiny_launch"][0] * 1e6}
    b.log(f"  B={bsz} yardsticks: copy of the state (r+w {2 * state_bytes / 1e6:.1f} MB) "
          f"{entry['copy_state_us']:.2f} us (± {100 * res['copy_state'][1]:.1f}%), one-element add "
          f"{entry['tiny_launch_us']:.2f} us (± {100 * res['tiny_launch'][1]:.1f}%)")
    if "fla_kernel" in res:
        for arm, label in (("fla_kernel", "fla fused_recurrent"), ("fla_pipeline", "torch conv+fla+norm")):
            r = b.row("gdn_decode", f"{shape} {best}", res[best], label, res[arm], bytes_moved=ours_floor,
                      ceiling=bw, target=">=1.5x fla" if arm == "fla_kernel" else "",
                      note="ours: whole step" + ("; fla: recurrence only" if arm == "fla_kernel" else ""))
            rows.append(r)
        entry["fla_kernel_us"] = res["fla_kernel"][0] * 1e6
        entry["fla_pipeline_us"] = res["fla_pipeline"][0] * 1e6
        entry["fla_kernel_frac_of_its_floor"] = fla_floor / bw / res["fla_kernel"][0]
    summary.append(entry)


def main():
    props = torch.cuda.get_device_properties(0)
    b.log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}")
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fused
    except Exception as e:  # noqa: BLE001
        b.log(f"fla not importable ({e}); fla baselines skipped")
        fused = None
    bw = b.copy_bandwidth()
    W["conv_w"] = torch.randn(CD, KC, device=dev) * 0.5
    W["a_log"] = torch.randn(HV, device=dev) * 0.5
    W["dt_bias"] = torch.randn(HV, device=dev) * 0.5
    W["norm_w"] = torch.rand(D, device=dev) + 0.5
    table = auto_table()
    b.log(f"auto table (kernels/src/cuda/gdn.rs): {table}")
    rows, summary = [], []
    for bsz in BATCHES:
        try:
            run_batch(bsz, bw, fused, rows, summary, table)
        except Exception as e:  # noqa: BLE001
            b.log(f"batch {bsz} failed: {type(e).__name__}: {e}")
            b.log(traceback.format_exc())
        torch.cuda.empty_cache()
        b.log(f"[batch {bsz} done at {time.time() - T0:.0f}s]")
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "bench_gdn_decode.json"), "w") as fh:
        json.dump({"device": props.name, "copy_GBps": bw / 1e9, "rows": rows, "summary": summary}, fh, indent=1)
    print()
    print(f"GDN decode step, Hk={HK} Hv={HV} 128x128 fp32 state, K={KC}; copy {bw / 1e12:.2f} TB/s; floor = bytes "
          f"(state r+w, inputs, output, conv history r+w, conv weights) / copy")
    print(f"{'B':>3s}|{'best variant':15s}|{'best us':>7s}|{'auto picks':15s}|{'auto us':>7s}|{'bph us':>7s}|"
          f"{'x bph':>5s}|{'fla us':>7s}|{'x fla':>5s}|{'pipe us':>7s}|{'x pipe':>6s}|{'floor':>6s}|{'%floor':>6s}|"
          f"{'1.5xfla':>11s}|{'fla%flr':>7s}|{'copy us':>7s}|{'launch':>6s}")
    for s in summary:
        fk = s.get("fla_kernel_us", float("nan"))
        fp = s.get("fla_pipeline_us", float("nan"))
        tgt = fk / 1.5
        # auto's arm within 3% of the best counts as right (the spreads are 0.5-3%); beyond that it is flagged.
        flag = "" if s["auto_us"] <= 1.03 * s["best_us"] else "!"
        print(f"{s['batch']:3d}|{s['best']:15s}|{s['best_us']:7.2f}|{s['auto'] + flag:15s}|{s['auto_us']:7.2f}|"
              f"{s['block_per_head_us']:7.2f}|{s['block_per_head_us'] / s['best_us']:5.2f}|{fk:7.2f}|"
              f"{fk / s['best_us']:5.2f}|{fp:7.2f}|{fp / s['best_us']:6.2f}|{s['floor_us']:6.2f}|"
              f"{100 * s['floor_us'] / s['best_us']:6.1f}|{tgt:7.2f}{'<flr' if tgt < s['floor_us'] else '    '}|"
              f"{100 * s.get('fla_kernel_frac_of_its_floor', float('nan')):7.1f}|{s['copy_state_us']:7.2f}|"
              f"{s['tiny_launch_us']:6.2f}")
    print("bph = block_per_head (the reference kernel); fla = fused_recurrent alone; pipe = torch conv + fla + torch "
          "norm; auto = what Gpu::gdn_decode_step runs at that batch ('!' = more than 3% behind the best: update "
          "AUTO_TABLE); 1.5xfla = the target time, '<flr' where it is below our byte floor; copy = a torch copy of the "
          "state (its read + write, no compute), launch = a one-element add (the per-launch floor of a graph)")
    print(f"total {time.time() - T0:.0f}s")


W = {}
if __name__ == "__main__":
    main()
