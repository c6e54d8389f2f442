"""The chunked gated DeltaNet prefill (kernels/cuda/gdn_prefill.cu, `Gpu::gdn_prefill`) on the H200 against fla.

Usage (repository root): python3 kernels/bench/h200/bench_gdn_prefill.py CARRY_DIR [--quick]
(env GDN_PREFILL_CASES="4096" or "4096,1000,3000,1120;4096" runs only those sequence-length cases;
GDN_PREFILL_LEAN=1 times only the default, the two bf16 splits and the stage arms their rows need;
GDN_PREFILL_ALT="tag=dir;.." adds other builds of gdn_prefill.cu, see `alt_builds`)
CARRY_DIR holds the crate's gdn_prefill.sm_90.cubin (loaded as the crate loads it on an sm_90 device; the PTX is
the fallback). Writes $OUT/bench_gdn_prefill.json and prints a short table last.

Shapes: Qwen3.8-27B's linear-attention layer (Hk = 16, Hv = 48, dk = dv = 128, conv kernel 4), B = 1 at
T = 1024, 4096, 16384, and one ragged batch (4 sequences, 9216 tokens, cu_seqlens).

Arms, each timed with bench.py's method (CUDA graphs rotating over input sets larger than L2, arms alternating,
medians and spreads):
- ours: exactly the four launches `Gpu::gdn_prefill` queues (conv + norms + gates, chunk-local WY, sequential
  state walk, gated RMSNorm), fp32 inputs and outputs, fp32 arithmetic. Not timed: the entry point's upload of
  the `cu_seqlens` / chunk-offset table (2 * (seqs + 1) int32, one small host-to-device copy), which a graph
  cannot capture from pageable memory; it is prepared on the device once here.
- ours_<variant>: the same four launches with another build of the sequential state kernel
  (`Gpu::gdn_prefill_with("<variant>", ..)`): `tf32x3_cs32` / `tf32_cs32` (mma.sync TF32, split or plain); the
  fp32 column slices 16 / 64 only with --variants (measured: 0.78x and 0.98x of cs32).
- ours_wy<math>_<variant> (`wytf32_tf32_cs64`, `wytf32_tf32_cs32`, `wytf32x3_tf32x3_cs32`): launch 2 on the
  tensor-core WY build (`gdn_prefill_wy_tc1` / `_tc3`, mma.sync TF32, same fp32 workspace) instead of the CUDA-core
  one; `ours_wytf32x3_tf32_cs64` is the default (`Gpu::GDN_PREFILL_DEFAULT`: the 3xTF32 WY for
  precision; `wytf32_tf32_cs64` was it (5856.3 us at T = 16384 against 6763.6 us for `tf32_cs64`),
  the row the others are compared with.
- removed: fla's split of launch 3 (`[wytf32_]tf32split_cs<32|64>`, walk + parallel output with the
  norm fused): walk_cs64 1835.7 us + out 963.0 us against state tf32_cs64 2272.2 us + norm 277.8 us; whole step
  wytf32_tf32split_cs64 6125.8 us against 5856.3 us at T = 16384.
- ours_wytf32x3_bf16_cs64 / ours_wytf32_bf16_cs64: the bf16 split, fla's division again but on bf16
  tensor cores: launch 3' `gdn_prefill_walk_bf16` (the state only; each chunk's incoming state and D to the
  workspace's hs region in bf16) and launch 4' `gdn_prefill_out_bf16` (the output parallel over chunks, the gated
  norm fused, so no launch 4), after the 3xTF32 / plain TF32 WY. Checked against fp32_cs32 with a 5e-2 bound
  (fla's precision class); its two launches are also timed alone (`walk_bf16` against the default's walk
  `state_tf32_cs64`, `out_bf16` against `norm`), and it gets its own rows against fla.
- ours_wyf16_bf16_cs64: the same split behind `gdn_prefill_prep_h` (q, k, v stored in f16) and the
  f16 WY `gdn_prefill_wy_h_b`; the rows `gdn_prefill_alt ... this|f16 <stage>` time each launch of the plain-TF32
  split ("this") and of this one alone, in the same rounds.
- launch 1 of every variant is the warp prep `gdn_prefill_prep` (one warp per 128-channel segment and 8 tokens,
  the conv window in registers). Removed: the block-per-token prep it replaced (bit-identical
  outputs; 969.2 -> 304.9 us at B=4 N=9216, 321.3 -> 135.4 us at T=4096; whole default step 3264.3 -> 2615.4 us
  and 1462.8 -> 1291.7 us) and the `prepw_` variant prefix that selected the warp build. Stage arm `prep` is
  timed against `copy` (a torch copy of qkv: the same 2 * N * conv_dim * 4 bytes as the prep's bulk), the copy
  rate the stage rows' "% copy" is relative to.
- stage_meta: launch 0 of `Gpu::gdn_prefill_varlen` (the device-table entry point), `gdn_prefill_meta`, which
  rebuilds the meta table from a device cu_seqlens (checked first to equal the host-built table exactly).
- stage arms (where the time goes): each of the four launches alone, `prep`, `wy`, `wy_tf32x3` / `wy_tf32` (the
  tensor-core WY builds, against `wy`), `state_<variant>` for the fp32
  build and every tensor-core build (cs16 / cs32 / cs64), `norm`, on the workspace the correctness run filled; each
  row prints the stage's nominal FLOPs and bytes (`stage_cost`) as TFLOP/s and GB/s.
- fla_kernel: fla's `chunk_gated_delta_rule` alone, as a model calls it: bf16 q, k (repeated to the 48 value
  heads, as transformers' Qwen3-Next does before the call), v, beta; fp32 g; fp32 initial and final state;
  l2-norm in the kernel. It does not do the conv, the gates or the gated norm.
- fla_layer: the whole layer step as a model runs it in bf16: torch depthwise conv1d over [history | tokens],
  SiLU, split, repeat_interleave of q and k, the gates in fp32, fla's chunk kernel, torch gated RMSNorm.

FLOP count (nominal, both implementations do at least this): per value head and 64-token chunk,
10 * C^2 * d (k k^T, q k^T, W and U from T, Aqk @ D) + 6 * C * d^2 (W S, Q S, K^T D), C = 64, d = 128.
The check compares our output and final state with the fla layer's (bf16 there, so ~1e-2 relative), and every
tensor-core build's with the fp32 build's.

Ragged batches: fla's `chunk_gated_delta_rule` with `cu_seqlens` memoises index tensors derived from the
cu_seqlens tensor (fla's `tensor_cache`, keyed by object identity, bounded). an H200 run crashed with an illegal
address in this case: the fla_layer arm built a fresh cu_seqlens tensor per call (not capturable, so timed eagerly),
whose cache entries evicted (freed) the index tensors the captured fla_kernel graph had recorded, and the next
replay read reused memory. Ours had run the same case (all variants, graphs captured and replayed) without error.
Now one cu_seqlens tensor per case serves both fla arms (so both are capturable and no entry is evicted), and ours
is timed and synchronised in its own pass before any fla arm runs, so a failure in fla cannot cost ours' rows
and the log names the arm group that failed.
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(__file__))
import bench as b  # noqa: E402  (reads sys.argv[1] as the PTX dir)

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HK, HV, D, KC = 16, 48, 128, 4
CD = 2 * HK * D + HV * D
C = 64
WY_SMEM = 101376  # cuda/gdn_prefill.cu WY_SMEM_BYTES
WY_TC_SMEM = 102912  # cuda/gdn_prefill.cu wy_tc_smem_bytes()
WY_H_SMEM = 70144  # cuda/gdn_prefill.cu wy_h_smem_bytes()
VARIANTS = "--variants" in sys.argv
DEFAULT = "wytf32x3_tf32_cs64"  # Gpu::GDN_PREFILL_DEFAULT (wytf32_tf32_cs64 before)
SPLIT = "wytf32x3_bf16_cs64"  # the bf16 split: walk_bf16 + out_bf16 (norm fused) after the 3xTF32 WY
ALT_SPLIT = "wytf32_bf16_cs64"  # the split GDN_PREFILL_ALT's builds are timed as (the fastest)
F16_SPLIT = "wyf16_bf16_cs64"  # the f16 split: f16 prep outputs, the f16 WY, the bf16 walk / output
LEAN = os.environ.get("GDN_PREFILL_LEAN") == "1"  # only the default, the two splits and what their rows need
WALK_BF16_SMEM = 125440  # cuda/gdn_prefill.cu walk_bf16_smem_bytes()
WALK1_BF16_SMEM = 137728  # cuda/gdn_prefill.cu walk1_bf16_smem_bytes()
SMS = torch.cuda.get_device_properties(0).multi_processor_count
OUT_BF16_SMEM = 75008  # cuda/gdn_prefill.cu out_bf16_smem_bytes()
HS_SLOT = D * D + C * D  # bf16 per (head, chunk) of the split's hs region
PREP_TT = 8  # cuda/gdn_prefill.cu PREP_TT (tokens per warp of gdn_prefill_prep)
ROUNDS = 5 if b.QUICK else 7  # arms alternate; the H200 runs' spreads were <= 2% at 11 rounds


# The bf16 split's walk for `pairs` (sequence, head) states: the one-block walk (gdn_prefill_walk1_bf16) beyond
# one wave of two-block walk blocks (kernels/src/cuda/gdn_prefill.rs `walk_one_block`, whose test checks
# this copy).
def walk_one_block(pairs, sms):
    return 2 * pairs > sms


def split_variant(variant):
    """(WY math, state variant) of `[wy<math>_]<math>_cs<cols>` (kernels/src/cuda/gdn_prefill.rs
    GdnPrefillVariant::parse): no `wy` prefix is the CUDA-core WY kernel."""
    if variant.startswith("wy"):
        wy, rest = variant[2:].split("_", 1)
        return wy, rest
    return "fp32", variant


def wy_kernel(wy):
    """(kernel name, dynamic smem bytes) of the WY launch (GdnPrefillVariant::wy_kernel)."""
    return {"fp32": ("gdn_prefill_wy", WY_SMEM), "tf32x3": ("gdn_prefill_wy_tc3", WY_TC_SMEM),
            "tf32": ("gdn_prefill_wy_tc1", WY_TC_SMEM), "f16": ("gdn_prefill_wy_h", WY_H_SMEM)}[wy]


def state_kernel(variant):
    """(kernel name, dynamic smem bytes) of a state-kernel variant `<math>_cs<cols>` (kernels/src/cuda/gdn_prefill.rs
    GdnPrefillVariant::kernel; smem: cuda/gdn_prefill.cu state_smem_bytes / state_tc_smem_bytes)."""
    math, cs = variant.split("_cs")
    cs = int(cs)
    if math == "fp32":
        return f"gdn_prefill_state_cs{cs}", (2 * C * 132 + C * 65 + C * cs + D * cs + C) * 4
    tag = {"tf32x3": "tc3", "tf32": "tc1"}[math]
    bufs = 2 if cs == 64 else 1  # chunk buffers (cuda/gdn_prefill.cu state_tc_buffers)
    return f"gdn_prefill_state_{tag}_cs{cs}", ((2 * C * 132 + C * 68) * bufs + D * (cs + 8) + C * (cs + 8)) * 4


_mods = {}


def kern(name, build=None):
    """Kernel `name` of the crate's gdn_prefill module in CARRY_DIR, or of another build's in directory `build`
    (GDN_PREFILL_ALT)."""
    d = build or b.PTX
    if d not in _mods:
        cubin = os.path.join(d, "gdn_prefill.sm_90.cubin")
        path = cubin if os.path.exists(cubin) else os.path.join(d, "gdn_prefill.ptx")
        b.log(f"loading {path}")
        _mods[d] = cp.RawModule(path=path)
    return _mods[d].get_function(name)


def alt_builds():
    """GDN_PREFILL_ALT="tag=dir[@variant][,walk_smem=BYTES][,walk1_smem=BYTES];..": other builds of
    cuda/gdn_prefill.cu (a directory holding its gdn_prefill.sm_90.cubin or .ptx, e.g. made by
    kernels/bench/h200/build_alt.sh), each timed as `variant` (default the split ALT_SPLIT) in the same rounds as
    this build's arms (interleaved), whole step and stage by stage, and compared with this build's run of the same
    variant; `walk_smem` / `walk1_smem`: that build's walk_bf16_smem_bytes() / walk1_bf16_smem_bytes() where they
    differ from this one's. Returns [(tag, dir, variant, walk_smem, walk1_smem)]."""
    out = []
    for entry in os.environ.get("GDN_PREFILL_ALT", "").split(";"):
        if entry:
            x, *opts = entry.split(",")
            tag, eq, rest = x.partition("=")
            smem = {"walk_smem": WALK_BF16_SMEM, "walk1_smem": WALK1_BF16_SMEM}
            for opt in opts:
                key, _, val = opt.partition("=")
                if key not in smem or not val.isdigit():
                    eq = ""
                else:
                    smem[key] = int(val)
            if not eq:
                raise SystemExit(f"GDN_PREFILL_ALT entry {entry!r}: expected "
                                 "tag=dir[@variant][,walk_smem=BYTES][,walk1_smem=BYTES]")
            d, _, v = rest.partition("@")
            out.append((tag, d, v or ALT_SPLIT, smem["walk_smem"], smem["walk1_smem"]))
    return out


def layout(lens):
    """Mirror of kernels/src/cuda/gdn_prefill.rs `layout`: region offsets (floats, 64-aligned) and total. The hs
    and qkb regions of the bf16 split are always included (after Aqk, so the other offsets are those of every
    variant) so that all variants share one workspace."""
    n = sum(lens)
    nc = sum((l + C - 1) // C for l in lens)
    pad = lambda x: (x + 63) // 64 * 64  # noqa: E731
    sizes = [("qn", n * HK * D), ("kn", n * HK * D), ("v", n * HV * D), ("g", n * HV), ("beta", n * HV),
             ("gcum", n * HV), ("w", HV * nc * C * D), ("u", HV * nc * C * D), ("aqk", HV * nc * C * C),
             ("hs", HV * nc * HS_SLOT // 2), ("qkb", n * HK * D)]
    off, at = {}, 0
    for k, s in sizes:
        off[k] = at
        at += pad(s)
    return off, at, nc


class Ours:
    """The launches of `Gpu::gdn_prefill_with(variant, ..)`; `share`: another instance whose workspace and meta
    table this one uses (the variants differ only in launch 3, so they can share one 3 GiB workspace)."""

    def __init__(self, lens, variant, share=None, build=None, walk_smem=WALK_BF16_SMEM,
                 walk1_smem=WALK1_BF16_SMEM):
        self.lens = lens
        self.walk_smem, self.walk1_smem = walk_smem, walk1_smem
        kern = lambda name: globals()["kern"](name, build)  # noqa: E731
        wy, variant = split_variant(variant)
        self.cs = int(variant.split("_cs")[1])
        self.off, total, self.nc = layout(lens)
        if share is None:
            self.ws = torch.empty(total, device=b.dev, dtype=torch.float32)
            cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            ch = np.concatenate([[0], np.cumsum([(l + C - 1) // C for l in lens])]).astype(np.int32)
            self.meta = torch.from_numpy(np.concatenate([cu, ch])).to(b.dev)
        else:
            self.ws, self.meta = share.ws, share.meta
        self.f16 = wy == "f16"
        self.f_prep = kern("gdn_prefill_prep_h" if self.f16 else "gdn_prefill_prep")  # (variant.prep_kernel)
        wy_name, self.wy_smem = wy_kernel(wy)
        if variant.startswith("bf16"):
            wy_name += "_b"  # the WY build's bf16-output form (GdnPrefillVariant::wy_kernel)
        self.f_wy = kern(wy_name)
        self.split = variant.startswith("bf16")
        if self.split:  # launches 3' and 4' (the norm fused into 4')
            self.f_walk, self.f_out = kern("gdn_prefill_walk_bf16"), kern("gdn_prefill_out_bf16")
            try:  # (older builds have no one-block walk: they run the two-block walk always)
                self.f_walk1 = kern("gdn_prefill_walk1_bf16")
            except Exception:  # noqa: BLE001
                self.f_walk1 = None
            for f, smem in [(self.f_walk, self.walk_smem), (self.f_walk1, self.walk1_smem)]:
                if f is None:
                    continue
                b.allow_smem(f, smem)
                try:
                    f.preferred_shared_memory_carveout = 100
                except Exception as e:  # noqa: BLE001
                    b.log(f"  note: carveout not set on a walk kernel ({e})")
            b.allow_smem(self.f_out, OUT_BF16_SMEM)
            try:
                self.f_out.preferred_shared_memory_carveout = 100
            except Exception as e:  # noqa: BLE001
                b.log(f"  note: carveout not set on gdn_prefill_out_bf16 ({e})")
            variant = "tf32_cs64"  # (state() is not used by the split; any build keeps the attributes below valid)
        name, self.state_smem = state_kernel(variant)
        self.f_state = kern(name)
        self.f_norm = kern("gdn_prefill_gated_norm")
        self.f_meta = kern("gdn_prefill_meta")
        b.allow_smem(self.f_wy, self.wy_smem)
        if wy != "fp32":
            try:  # two 100.5 KiB (68.5 KiB: f16) blocks per SM, as the crate asks (cuda/gdn_prefill.rs)
                self.f_wy.preferred_shared_memory_carveout = 100
            except Exception as e:  # noqa: BLE001
                b.log(f"  note: carveout not set on {wy_name} ({e})")
        b.allow_smem(self.f_state, self.state_smem)
        if not variant.startswith("fp32"):
            try:  # two 113 KiB blocks per SM need the whole carveout, as the crate asks (cuda/gdn_prefill.rs)
                self.f_state.preferred_shared_memory_carveout = 100
            except Exception as e:  # noqa: BLE001
                b.log(f"  note: carveout not set on {name} ({e})")

    def w(self, k):
        return np.uint64(self.ws.data_ptr() + 4 * self.off[k])

    def meta_kernel(self, cu, table):
        """Launch 0 of `Gpu::gdn_prefill_varlen`: `gdn_prefill_meta` builds the meta table from the device
        cu_seqlens `cu` (int32 here, the same bits as the crate's u32 for offsets < 2^31) into `table`."""
        p, i32 = b.ptr, np.int32
        b.launch(self.f_meta, (1,), (256,),
                 (p(cu), p(table), i32(len(self.lens)), i32(sum(self.lens)), i32(max(self.lens))))

    def __call__(self, qkv, z, a, bb, conv_w, a_log, dt_bias, norm_w, conv_in, conv_out, state, out, pdl=True,
                 one_block=None):
        """The layer step as the crate queues it: the WY, the walk and the output as programmatic dependents of
        the launch before (`pdl`; False: every launch plain, the output still waiting on the ready counters);
        `one_block`: the split's walk, if not the one walk_one_block picks."""
        self.prep(qkv, a, bb, conv_w, a_log, dt_bias, conv_in, conv_out)
        self.wy(pdl=pdl)
        if self.split:
            self.walk(state, pdl=pdl, one_block=one_block)
            self.out(out, z, norm_w, wait=True, pdl=pdl)
            return
        self.state(state, out)
        self.norm(out, z, norm_w)

    def prep(self, qkv, a, bb, conv_w, a_log, dt_bias, conv_in, conv_out):
        seqs, maxlen = len(self.lens), max(self.lens)
        p, i32 = b.ptr, np.int32
        # gdn_prefill_prep: a warp per (PREP_TT tokens, segment), 4 per block.
        grid = ((maxlen + PREP_TT - 1) // PREP_TT, (2 * HK + HV + 3) // 4, seqs)
        b.launch(self.f_prep, grid, (128,),
                 (p(qkv), p(a), p(bb), p(conv_w), p(a_log), p(dt_bias), p(conv_in), p(conv_out), p(self.meta),
                  self.w("qn"), self.w("kn"), self.w("v"), self.w("g"), self.w("beta"), *self.qk_bf16(), i32(HK),
                  i32(HV), i32(KC)))

    def qk_bf16(self):
        """The split's bf16 copies of q and k: the qkb region (q then k) for the split, null pointers otherwise
        (written by the prep, or for the f16 split by its WY launch; the f16 prep ignores them)."""
        if not self.split:
            return np.uint64(0), np.uint64(0)
        n = sum(self.lens)
        return self.w("qkb"), np.uint64(self.ws.data_ptr() + 4 * self.off["qkb"] + 2 * n * HK * D)

    def wy(self, pdl=False):
        seqs, maxlen = len(self.lens), max(self.lens)
        p, i32 = b.ptr, np.int32
        # The f16 WY also writes the split's bf16 q / k copies (its prep no longer does). A build
        # from before takes one parameter list shorter and ignores the two (its prep writes them), so GDN_PREFILL_ALT
        # can time it with these launches.
        qkb = self.qk_bf16() if self.f16 else ()
        (b.launch_pdl if pdl else b.launch)(self.f_wy, ((maxlen + C - 1) // C, HV, seqs), (256,),
                 (self.w("qn"), self.w("kn"), self.w("v"), self.w("g"), self.w("beta"), p(self.meta),
                  self.w("gcum"), self.w("w"), self.w("u"), self.w("aqk"), i32(HK), i32(HV), i32(seqs),
                  i32(self.nc), *qkb), shared_mem=self.wy_smem)

    def state(self, state, out):
        seqs = len(self.lens)
        p, i32 = b.ptr, np.int32
        b.launch(self.f_state, (128 // self.cs, HV, seqs), (256,),
                 (self.w("qn"), self.w("kn"), self.w("gcum"), self.w("w"), self.w("u"), self.w("aqk"),
                  p(self.meta), p(state), p(out), i32(HK), i32(HV), i32(seqs), i32(self.nc)),
                 shared_mem=self.state_smem)

    def ready(self):
        """The walk's per-(head, chunk) ready counters (cuda/gdn_prefill.cu split_ready): int32 in the Aqk region's
        second half."""
        return np.uint64(self.ws.data_ptr() + 4 * (self.off["aqk"] + HV * self.nc * C * C // 2))

    def walk(self, state, pdl=False, one_block=None):
        """Launch 3' of the bf16 split: gdn_prefill_walk_bf16 (two blocks per state) or gdn_prefill_walk1_bf16 (one
        block per state), as walk_one_block picks unless `one_block` says (state only; chunk states and D to hs,
        then each chunk's ready counter)."""
        seqs = len(self.lens)
        p, i32 = b.ptr, np.int32
        if one_block is None:
            one_block = self.f_walk1 is not None and walk_one_block(seqs * HV, SMS)
        f, grid_x, smem = (self.f_walk1, 1, self.walk1_smem) if one_block else (self.f_walk, 2, self.walk_smem)
        (b.launch_pdl if pdl else b.launch)(
            f, (grid_x, HV, seqs), (256,),
            (self.qk_bf16()[1], self.w("gcum"), self.w("w"), self.w("u"), p(self.meta), p(state), self.w("hs"),
             self.ready(), i32(HK), i32(HV), i32(seqs), i32(self.nc)), shared_mem=smem)

    def out(self, out, z, norm_w, wait=False, pdl=False):
        """Launch 4' of the bf16 split: gdn_prefill_out_bf16 (output parallel over chunks, gated norm fused). In the
        layer step (`wait`) it waits for the walk's ready counters and runs as the walk's programmatic dependent
        (`pdl`, as the crate launches it); alone (stage arms) it reads the slots the last walk left."""
        seqs, maxlen = len(self.lens), max(self.lens)
        p, i32 = b.ptr, np.int32
        fn = b.launch_pdl if pdl else b.launch
        fn(self.f_out, (HV, seqs, (maxlen + C - 1) // C), (256,),  # heads fastest, chunks slowest
           (self.qk_bf16()[0], self.w("gcum"), self.w("aqk"), self.w("hs"), p(self.meta), p(z), p(norm_w),
            np.float32(1e-6), p(out), self.ready() if wait else np.uint64(0), i32(HK), i32(HV), i32(seqs),
            i32(self.nc)), shared_mem=OUT_BF16_SMEM)

    def norm(self, out, z, norm_w):
        p, i32 = b.ptr, np.int32
        rows = sum(self.lens) * HV
        b.launch(self.f_norm, ((rows + 7) // 8,), (256,), (p(out), p(z), p(norm_w), np.float32(1e-6), i32(rows)))


def fla_layer(chunk, lens, cu, qkv, z, a, bb, conv_w, a_log, dt_bias, norm_w, conv_in, state):
    """The layer as a bf16 model runs it around fla (transformers' Qwen3-Next torch path with fla's kernel); `cu` is
    the case's one cu_seqlens tensor (None for one sequence). Returns (out fp32 [N, Hv*D], final state
    [seqs, Hv, D, D])."""
    n = sum(lens)
    xs, hist = [], []
    r0 = 0
    for s, l in enumerate(lens):
        x = torch.cat([conv_in[s].to(torch.bfloat16), qkv[r0:r0 + l].to(torch.bfloat16).t()], 1)  # [CD, K-1+l]
        y = F.conv1d(x.unsqueeze(0), conv_w.to(torch.bfloat16).unsqueeze(1), groups=CD)[0]  # [CD, l]
        xs.append(F.silu(y).t())
        r0 += l
    y = torch.cat(xs, 0)
    q, k, v = y.split([HK * D, HK * D, HV * D], -1)
    q = q.reshape(1, n, HK, D).repeat_interleave(HV // HK, 2)
    k = k.reshape(1, n, HK, D).repeat_interleave(HV // HK, 2)
    v = v.reshape(1, n, HV, D)
    g = (-a_log.exp() * F.softplus(a.float() + dt_bias)).reshape(1, n, HV)
    beta = bb.to(torch.bfloat16).sigmoid().reshape(1, n, HV)
    o, fs = chunk(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    o = o.reshape(n, HV, D).float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w
    return o.reshape(n, HV * D) * F.silu(z.float()), fs


def flops(lens):
    nc = sum((l + C - 1) // C for l in lens)
    return HV * nc * (10 * C * C * D + 6 * C * D * D)


def stage_cost(lens, stage):
    """Nominal (FLOPs, bytes) of one launch: bytes counted once per tensor (re-reads of q/k by the 3 value heads of
    a key head, and by the 128/CS column blocks of the state kernel, are L2 traffic and not counted)."""
    n, seqs = sum(lens), len(lens)
    nc = sum((l + C - 1) // C for l in lens)
    f4 = 4
    if stage == "prep":
        return 0, f4 * (2 * n * CD + 4 * n * HV + CD * KC + seqs * CD * (KC - 1) * 2)
    if stage == "wy":
        fl = HV * nc * (2 * 2 * C * C * D + C ** 3 // 3 + 2 * 2 * C * C * D)
        by = f4 * (2 * n * HK * D + n * HV * D + 3 * n * HV + HV * nc * (2 * C * D + C * C))
        return fl, by
    if stage == "state":
        fl = HV * nc * (2 * 2 * C * D * D + 2 * C * C * D + 2 * C * D * D)
        by = f4 * (HV * nc * (2 * C * D + C * C) + 2 * n * HK * D + n * HV + n * HV * D + 2 * seqs * HV * D * D)
        return fl, by
    return 0, f4 * 3 * n * HV * D  # norm


def rel(x, y):
    return ((x - y).norm() / y.norm()).item()


def case(lens, chunk):
    n, seqs = sum(lens), len(lens)
    shape = f"T={n}" if seqs == 1 else f"B={seqs} N={n}"
    g = torch.Generator(device=b.dev).manual_seed(1)
    rnd = lambda *s, amp=1.0: (torch.rand(*s, device=b.dev, generator=g) * 2 - 1) * amp  # noqa: E731
    conv_w = rnd(CD, KC, amp=0.6)
    a_log = rnd(HV)
    dt_bias = rnd(HV)
    norm_w = torch.rand(D, device=b.dev, generator=g) + 0.5
    per_set = n * (CD + 2 * HV * D + 2 * HV) * 4 + seqs * HV * D * D * 4
    sets = b.n_sets(per_set, floor=2)
    qkv = [rnd(n, CD, amp=1.5) for _ in range(sets)]
    z = [rnd(n, HV * D, amp=2.0) for _ in range(sets)]
    a = [rnd(n, HV, amp=2.0) for _ in range(sets)]
    bb = [rnd(n, HV, amp=3.0) for _ in range(sets)]
    conv = [rnd(seqs, CD, KC - 1) for _ in range(sets)]
    st = [rnd(seqs, HV, D, D, amp=0.05) for _ in range(sets)]
    conv_out = torch.empty(seqs, CD, KC - 1, device=b.dev)
    out = torch.empty(n, HV * D, device=b.dev)
    whole = (["fp32_cs32", "tf32x3_cs32", "tf32_cs32", "tf32_cs64", "wytf32x3_tf32x3_cs32", "wytf32_tf32_cs32",
              "wytf32_tf32_cs64", "wytf32x3_tf32_cs64", SPLIT, "wytf32_bf16_cs64", F16_SPLIT]
             + (["fp32_cs16", "fp32_cs64"] if VARIANTS else []))
    state_only = ["fp32_cs32"] + [f"{m}_cs{c}" for m in ("tf32x3", "tf32") for c in (16, 32, 64)]
    wy_only = ["tf32x3", "tf32"]  # stage arms of the tensor-core WY builds (launch 2 alone)
    if LEAN:
        whole = ["fp32_cs32", DEFAULT, SPLIT, ALT_SPLIT, F16_SPLIT]
        state_only = ["fp32_cs32", "tf32_cs64"]
        wy_only = []
    ref = Ours(lens, "fp32_cs32")
    impls = {v: (ref if v == "fp32_cs32" else Ours(lens, v, share=ref)) for v in dict.fromkeys(whole + state_only)}

    # Correctness first, on fresh copies: every variant against fp32_cs32, then fp32_cs32 against the fla layer.
    st0, cin0 = st[0].clone(), conv[0].clone()
    ref(qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w, cin0, conv_out, st0, out)
    torch.cuda.synchronize()
    ours_out, ours_state = out.clone(), st0.clone()
    check = {}
    bad = set()  # variants whose check failed: their arms are not timed
    for v, impl in impls.items():
        if v == "fp32_cs32":
            continue
        st1 = st[0].clone()
        out1 = torch.full_like(out, float("nan"))
        impl(qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w, conv[0], conv_out, st1, out1)
        torch.cuda.synchronize()
        eo, es = rel(out1, ours_out), rel(st1, ours_state)
        b.log(f"  {shape}: {v} vs fp32_cs32: output rel err {eo:.2e}, final state rel err {es:.2e}")
        check[f"{v}_out_rel_err"], check[f"{v}_state_rel_err"] = eo, es
        wy, sv = split_variant(v)
        bound = 2e-2 if (wy == "tf32" or sv.startswith("tf32_")) else 1e-4
        if sv.startswith("bf16"):
            bound = 5e-2  # fla's precision class (bf16 operands in the walk and the output)
        if not (eo < bound and es < bound):
            b.log(f"  WARNING: {v} disagrees with fp32_cs32 beyond {bound:.0e}; not timed")
            bad.add(v)
    if DEFAULT in bad:  # every comparison row is against it
        raise RuntimeError(f"{shape}: {DEFAULT} (the default) failed its check against fp32_cs32")
    # Other builds (GDN_PREFILL_ALT), checked like the variants (the split's 5e-2 bound).
    alts, alt_variant = {}, {}
    for tag, d, av, ws, ws1 in alt_builds():
        impl = Ours(lens, av, share=ref, build=d, walk_smem=ws, walk1_smem=ws1)
        st1 = st[0].clone()
        out1 = torch.full_like(out, float("nan"))
        impl(qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w, conv[0], conv_out, st1, out1)
        torch.cuda.synchronize()
        eo, es = rel(out1, ours_out), rel(st1, ours_state)
        b.log(f"  {shape}: alt {tag} ({av}, {d}) vs fp32_cs32: output rel err {eo:.2e}, final state rel err "
              f"{es:.2e}")
        check[f"alt_{tag}_out_rel_err"], check[f"alt_{tag}_state_rel_err"] = eo, es
        if eo < 5e-2 and es < 5e-2 and av in impls and av not in bad:
            alts[tag], alt_variant[tag] = impl, av
        else:
            b.log(f"  WARNING: alt {tag} disagrees with fp32_cs32 beyond 5e-2; not timed")
    # The conv history ours leaves: the last K-1 inputs of each sequence (written by every variant's prep above).
    r0, conv_ok = 0, True
    for s, l in enumerate(lens):
        want = torch.cat([conv[0][s], qkv[0][r0:r0 + l].t()], 1)[:, -(KC - 1):]
        conv_ok &= bool(torch.equal(conv_out[s], want))
        r0 += l
    b.log(f"  {shape}: conv history {'exact' if conv_ok else 'WRONG'}")
    check["conv_exact"] = conv_ok
    # The device-table path (Gpu::gdn_prefill_varlen): its meta kernel must rebuild exactly the host table.
    cu_dev = ref.meta[:seqs + 1].clone()
    meta_dev = torch.full_like(ref.meta, -1)
    ref.meta_kernel(cu_dev, meta_dev)
    torch.cuda.synchronize()
    meta_ok = bool(torch.equal(meta_dev, ref.meta))
    b.log(f"  {shape}: device-built meta table {'exact' if meta_ok else 'WRONG'}")
    check["meta_exact"] = meta_ok
    cu = None if seqs == 1 else torch.tensor([0] + list(np.cumsum(lens)), device=b.dev, dtype=torch.long)
    if chunk is not None:
        t0 = time.time()
        ref_out, ref_state = fla_layer(chunk, lens, cu, qkv[0], z[0], a[0], bb[0], conv_w, a_log, dt_bias, norm_w,
                                       conv[0], st[0].clone())
        torch.cuda.synchronize()
        b.log(f"  {shape}: fla first call (Triton autotune and compile, not timed) {time.time() - t0:.1f} s")
        eo, es = rel(ours_out, ref_out), rel(ours_state, ref_state.float())
        b.log(f"  {shape}: vs fla layer (bf16): output rel err {eo:.2e}, final state rel err {es:.2e}")
        check.update(out_rel_err=eo, state_rel_err=es)
        if not (eo < 5e-2 and es < 5e-2):
            b.log(f"  WARNING: ours and fla disagree beyond bf16 noise ({eo:.2e}, {es:.2e})")

    reps = max(3, min(40, int(2e5 / max(n, 1))))  # fewer launches per graph at large T (wall time)
    fl = flops(lens)
    whole = [v for v in whole if v not in bad]
    state_only = [v for v in state_only if v not in bad]
    wy_only = [m for m in wy_only if (f"wy{m}_{m}_cs32" if m == "tf32x3" else f"wy{m}_{m}_cs64") not in bad]
    # Pass 1: ours only (whole layer step per variant, then each stage alone), synchronised before fla runs.
    arms = {}
    for v in whole:
        arms[v] = (lambda impl: lambda i: impl(qkv[i], z[i], a[i], bb[i], conv_w, a_log, dt_bias, norm_w,
                                               conv[i], conv_out, st[i], out))(impls[v])
    arms["stage_prep"] = lambda i: ref.prep(qkv[i], a[i], bb[i], conv_w, a_log, dt_bias, conv[i], conv_out)
    copy_dst = torch.empty_like(qkv[0])
    arms["stage_copy"] = lambda i: copy_dst.copy_(qkv[i])
    arms["stage_wy"] = lambda i: ref.wy()
    for m in wy_only:
        arms[f"stage_wy_{m}"] = (lambda impl: lambda i: impl.wy())(impls[f"wy{m}_{m}_cs32" if m == "tf32x3"
                                                                            else f"wy{m}_{m}_cs64"])
    for v in state_only:
        arms[f"stage_state_{v}"] = (lambda impl: lambda i: impl.state(st[i], out))(impls[v])
    arms["stage_norm"] = lambda i: ref.norm(out, z[i], norm_w)
    split_ok = SPLIT not in bad
    if split_ok:  # the split's two launches alone (on the W / U / Aqk the last whole step left)
        arms["stage_walk_bf16"] = lambda i: impls[SPLIT].walk(st[i], one_block=False)
        arms["stage_walk1_bf16"] = lambda i: impls[SPLIT].walk(st[i], one_block=True)
        arms["stage_out_bf16"] = lambda i: impls[SPLIT].out(out, z[i], norm_w)
    arms["stage_meta"] = lambda i: ref.meta_kernel(cu_dev, meta_dev)
    # This build's ALT_SPLIT ("this") and F16_SPLIT ("f16") stage by stage (their preps write the bf16 q / k
    # copies, the f16 one q, k, v in f16; their WY launches are the `_b` forms) and each other build's ALT_SPLIT, in
    # the same rounds.
    stage_sets = [("this", impls[ALT_SPLIT])] if ALT_SPLIT not in bad else []
    stage_sets += [("f16", impls[F16_SPLIT])] if F16_SPLIT not in bad and F16_SPLIT in impls else []
    stage_sets += list(alts.items())
    for tag, impl in stage_sets:
        if tag in alts:
            arms[f"alt_{tag}"] = (lambda impl: lambda i: impl(qkv[i], z[i], a[i], bb[i], conv_w, a_log, dt_bias,
                                                              norm_w, conv[i], conv_out, st[i], out))(impl)
        arms[f"split_{tag}_prep"] = (lambda impl: lambda i: impl.prep(qkv[i], a[i], bb[i], conv_w, a_log, dt_bias,
                                                                      conv[i], conv_out))(impl)
        arms[f"split_{tag}_wy"] = (lambda impl: lambda i: impl.wy())(impl)
        arms[f"split_{tag}_walk"] = (lambda impl: lambda i: impl.walk(st[i]))(impl)
        arms[f"split_{tag}_out"] = (lambda impl: lambda i: impl.out(out, z[i], norm_w))(impl)
        if tag == "f16":  # the step with every launch plain (the output after the walk's end), against PDL
            arms["f16_plain_out"] = (lambda impl: lambda i: impl(qkv[i], z[i], a[i], bb[i], conv_w, a_log, dt_bias,
                                                                 norm_w, conv[i], conv_out, st[i], out,
                                                                 pdl=False))(impl)
            if impl.f_walk1 is not None:  # the step with the walk walk_one_block does not pick
                other = not walk_one_block(len(lens) * HV, SMS)
                arms["f16_other_walk"] = (lambda impl: lambda i: impl(qkv[i], z[i], a[i], bb[i], conv_w, a_log,
                                                                      dt_bias, norm_w, conv[i], conv_out, st[i],
                                                                      out, one_block=other))(impl)
    try:
        res = b.time_arms(arms, sets, reps, rounds=ROUNDS)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        b.log(f"  {shape}: OURS failed during timing: {type(e).__name__}: {e}")
        raise
    for v in whole[1:]:
        b.row("gdn_prefill_var", f"{shape} {v}", res[v], "ours (fp32_cs32)", res["fp32_cs32"], flops=fl)
    # Every other build against the default.
    for v in [v for v in whole if v != DEFAULT]:
        b.row("gdn_prefill_var", f"{shape} {v}", res[v], f"default ({DEFAULT})", res[DEFAULT], flops=fl)
    copy_bytes = 2 * n * CD * 4
    copy_rate = copy_bytes / res["stage_copy"][0]  # the "% copy" of every stage row
    b.row("gdn_prefill_stage", f"{shape} copy", res["stage_copy"], "-", None,
          bytes_moved=copy_bytes, ceiling=copy_rate, note="torch copy of qkv, the prep's bulk bytes")
    _, by_s = stage_cost(lens, "prep")
    b.row("gdn_prefill_stage", f"{shape} prep", res["stage_prep"], "torch copy of qkv", res["stage_copy"],
          bytes_moved=by_s, ceiling=copy_rate, note="gdn_prefill_prep, warp per 8 tokens; 'speedup' = copy / prep")
    total = 0.0
    for st_name in ["prep", "wy", "state_fp32_cs32", "norm"]:
        fl_s, by_s = stage_cost(lens, st_name.split("_")[0])
        r = b.row("gdn_prefill_stage", f"{shape} {st_name}", res[f"stage_{st_name}"], "whole (fp32_cs32)",
                  res["fp32_cs32"], bytes_moved=by_s, flops=fl_s or None, ceiling=copy_rate,
                  note=f"{fl_s / 1e9:.1f} GFLOP, {by_s / 1e6:.0f} MB; 'speedup' = fraction of the whole")
        r["fraction_of_whole"] = res[f"stage_{st_name}"][0] / res["fp32_cs32"][0]
        total += res[f"stage_{st_name}"][0]
    b.log(f"  {shape}: stages sum {total * 1e6:.1f} us vs whole {res['fp32_cs32'][0] * 1e6:.1f} us")
    b.row("gdn_prefill_stage", f"{shape} meta", res["stage_meta"], "whole (fp32_cs32)", res["fp32_cs32"],
          note="launch 0 of gdn_prefill_varlen (device cu_seqlens); 'speedup' = fraction of the whole")
    fl_s, by_s = stage_cost(lens, "wy")
    for m in wy_only:
        b.row("gdn_prefill_stage", f"{shape} wy_{m}", res[f"stage_wy_{m}"], "wy (CUDA cores)", res["stage_wy"],
              bytes_moved=by_s, flops=fl_s)
    fl_s, by_s = stage_cost(lens, "state")
    for v in state_only[1:]:
        b.row("gdn_prefill_stage", f"{shape} state_{v}", res[f"stage_state_{v}"], "state fp32_cs32",
              res["stage_state_fp32_cs32"], bytes_moved=by_s, flops=fl_s)
    if split_ok:
        for st_name, base in [("walk_bf16", "state_tf32_cs64"), ("out_bf16", "norm")]:
            if f"stage_{base}" not in res:
                continue
            b.row("gdn_prefill_stage", f"{shape} {st_name}", res[f"stage_{st_name}"], f"stage {base}",
                  res[f"stage_{base}"], note="launch 3' / 4' of the bf16 split against the default's walk / norm")
        b.row("gdn_prefill_stage", f"{shape} walk1_bf16", res["stage_walk1_bf16"], "stage walk_bf16",
              res["stage_walk_bf16"], note="the one-block walk against the two-block walk (alone)")
    if stage_sets and stage_sets[0][0] == "this":
        for tag, _ in stage_sets:
            if tag == "f16":
                b.row("gdn_prefill_alt", f"{shape} {F16_SPLIT}", res[F16_SPLIT], f"{ALT_SPLIT} (this build)",
                      res[ALT_SPLIT], flops=fl)
                b.row("gdn_prefill_alt", f"{shape} {F16_SPLIT} pdl", res[F16_SPLIT], "every launch plain",
                      res["f16_plain_out"], flops=fl, note="WY, walk and output as PDL dependents or all plain")
                if "f16_other_walk" in res:
                    picked = "one-block" if walk_one_block(len(lens) * HV, SMS) else "two-block"
                    b.row("gdn_prefill_alt", f"{shape} {F16_SPLIT} walk", res[F16_SPLIT], "the other walk",
                          res["f16_other_walk"], flops=fl, note=f"walk_one_block picks the {picked} walk")
            elif tag != "this":
                av = alt_variant[tag]
                b.row("gdn_prefill_alt", f"{shape} alt_{tag}", res[f"alt_{tag}"], f"{av} (this build)", res[av],
                      flops=fl)
            base = "f16" if tag in alts and alt_variant[tag] == F16_SPLIT and "split_f16_wy" in res else "this"
            for stg in ("prep", "wy", "walk", "out"):
                b.row("gdn_prefill_alt", f"{shape} {tag} {stg}", res[f"split_{tag}_{stg}"],
                      f"this build's {base} {stg}", res[f"split_{base}_{stg}"], note="the launch alone")
    best = min(whole, key=lambda v: res[v][0])

    # Pass 2: the fla arms (one cu_seqlens tensor for both, so both are graph-capturable).
    if chunk is not None:
        q16 = [x[:, :HK * D].reshape(1, n, HK, D).repeat_interleave(HV // HK, 2).to(torch.bfloat16) for x in qkv]
        k16 = [x[:, HK * D:2 * HK * D].reshape(1, n, HK, D).repeat_interleave(HV // HK, 2).to(torch.bfloat16)
               for x in qkv]
        v16 = [x[:, 2 * HK * D:].reshape(1, n, HV, D).to(torch.bfloat16) for x in qkv]
        g32 = [(-a_log.exp() * F.softplus(x + dt_bias)).reshape(1, n, HV) for x in a]
        b16 = [x.sigmoid().to(torch.bfloat16).reshape(1, n, HV) for x in bb]

        def fla_kernel(i):
            chunk(q16[i], k16[i], v16[i], g=g32[i], beta=b16[i], initial_state=st[i], output_final_state=True,
                  use_qk_l2norm_in_kernel=True, cu_seqlens=cu)

        def fla_whole(i):
            fla_layer(chunk, lens, cu, qkv[i], z[i], a[i], bb[i], conv_w, a_log, dt_bias, norm_w, conv[i], st[i])

        fres = b.time_arms({"fla_kernel": fla_kernel, "fla_layer": fla_whole}, sets, reps, rounds=ROUNDS)
        torch.cuda.synchronize()
        for v in [v for v in dict.fromkeys(["fp32_cs32", DEFAULT, SPLIT, ALT_SPLIT, F16_SPLIT, best]) if v in res]:
            b.row("gdn_prefill", f"{shape} {v}", res[v], "fla chunk kernel", fres["fla_kernel"], flops=fl,
                  target=">=1.0x", note="ours: whole layer step fp32 in/out; fla: recurrence only, bf16")
            b.row("gdn_prefill", f"{shape} {v}", res[v], "torch conv+fla+norm", fres["fla_layer"], flops=fl,
                  target=">=1.0x")
            b.ROWS[-1]["check"] = check
    else:
        b.row("gdn_prefill", f"{shape} fp32_cs32", res["fp32_cs32"], "-", None, flops=fl)
        b.ROWS[-1]["check"] = check
    del qkv, z, a, bb, conv, st, impls
    torch.cuda.empty_cache()


def main():
    props = torch.cuda.get_device_properties(0)
    b.log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
          f"cupy {cp.__version__}")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as chunk
    except Exception as e:  # noqa: BLE001
        b.log(f"fla not importable ({e}); baselines skipped")
        chunk = None
    cases = [[4096, 1000, 3000, 1120], [1024], [4096], [16384]]
    if b.QUICK:
        cases = [[4096, 1000, 3000, 1120], [4096]]
    if os.environ.get("GDN_PREFILL_CASES"):  # e.g. "4096" or "4096,1000,3000,1120;4096": only these cases
        cases = [[int(x) for x in c.split(",")] for c in os.environ["GDN_PREFILL_CASES"].split(";")]
    t0 = time.time()
    for lens in cases:
        try:
            case(lens, chunk)
        except Exception as e:  # noqa: BLE001 - one failing case must not stop the others
            b.log(f"case {lens} FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as e2:  # noqa: BLE001 - a sticky device error: later cases cannot run
                b.log(f"device unusable after the failure ({type(e2).__name__}); stopping")
                break
        b.log(f"[{lens} done at {time.time()-t0:.0f}s]")
    with open(os.path.join(b.OUT, "bench_gdn_prefill.json"), "w") as fh:
        json.dump({"device": props.name, "rows": b.ROWS}, fh, indent=1, default=str)
    print()
    print(f"{'kernel':18s}|{'shape':28s}|{'ours us':>10s}|{'baseline':22s}|{'base us':>10s}|{'x':>6s}|"
          f"{'TFLOP/s':>8s}|{'GB/s':>7s}")
    for r in b.ROWS:
        tf = r.get("TFLOP/s", float("nan"))
        print(f"{r['kernel']:18s}|{r['shape']:28s}|{r['ours_us']:10.1f}|{r['baseline']:22s}|{r['base_us']:10.1f}|"
              f"{r['speedup']:6.2f}|{tf:8.2f}|{r.get('GB/s', float('nan')):7.0f}")
    print("FLOP count: Hv * chunks * (10 C^2 d + 6 C d^2), C = 64, d = 128 (nominal, no triangular savings). "
          "Stage rows: 'x' = the stage's share of the whole fp32 layer step; fp32 CUDA-core ceiling ~67 TFLOP/s, "
          "TF32 mma ~490 TFLOP/s dense; fla runs bf16 tensor cores.")


if __name__ == "__main__":
    main()
