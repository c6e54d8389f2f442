//! The chunked gated DeltaNet prefill on the GPU ([`Gpu::gdn_prefill`]): a batch of sequences of any lengths
//! (cu_seqlens style), each continuing from its conv history and recurrent state, with exactly the semantics of
//! the CPU [`crate::gdn::prefill`] and the layouts of [`crate::gdn`] and [`Gpu::gdn_decode_step`], so an engine
//! prefills and then decodes on the same buffers. Kernels, chunk algebra and precision: `cuda/gdn_prefill.cu`.

#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

#[cfg(feature = "cuda")]
use super::device::{cuda_err, launch_config, Device, Module, PdlArgs};
use super::{check_len, check_len_of, GdnGpuInputs, GdnGpuWeights, GdnPrefillIo, Gpu, GpuBuffer};
use crate::error::checked_product;
use crate::shapes::{GdnDims, CHUNK};
use crate::KernelError;

/// How the sequential state kernel (launch 3) multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum StateMath {
    /// fp32 FMAs on the CUDA cores (`gdn_prefill_state_cs<CS>`): the accuracy reference.
    Fp32,
    /// `mma.sync` TF32 with the 3xTF32 split (`gdn_prefill_state_tc3_cs<CS>`): about fp32 accuracy.
    Tf32x3,
    /// `mma.sync` plain TF32 (`gdn_prefill_state_tc1_cs<CS>`): operands rounded to 10 mantissa bits.
    Tf32,
    /// The bf16 split (state walk only): `gdn_prefill_walk_bf16` walks the chunks carrying only the state (bf16
    /// operands on mma.sync m16n8k16, the state fp32 in registers) and stores each chunk's incoming state and D in
    /// bf16; `gdn_prefill_out_bf16` then computes the output parallel over chunks with the gated norm fused (so
    /// launch 4 is not queued). Both read bf16 operands only: the prep also writes bf16 q and k, and the WY
    /// launch is the tensor-core build's `_b` form (bf16 W, U, Aqk). fla's division of the work and its precision
    /// class; 64 columns and a tensor-core WY only. Not a WY build itself.
    Bf16,
}

/// How the chunk-local WY kernel (launch 2) multiplies. Its own type, so that a WY-only build (`F16`) cannot be
/// asked for as a state kernel, nor the bf16 split's walk (`StateMath::Bf16`) as a WY build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum WyMath {
    /// fp32 FMAs on the CUDA cores (`gdn_prefill_wy`), row-at-a-time substitution.
    Fp32,
    /// `mma.sync` TF32 with the 3xTF32 split (`gdn_prefill_wy_tc3[_b]`).
    Tf32x3,
    /// `mma.sync` plain TF32 (`gdn_prefill_wy_tc1[_b]`).
    Tf32,
    /// f16 operands on mma.sync m16n8k16, fp32 accumulation (`wyf16_bf16_cs64`, the f16 split):
    /// `gdn_prefill_prep_h` stores q, k and v in f16 (v saturated at +-65504; q and k are l2-normed) and
    /// `gdn_prefill_wy_h_b` runs the three WY products on them (T rounded to f16 too), writing the bf16 W, U and
    /// Aqk the split's walk and output launches read, so it exists only in front of the split. Its error model
    /// (kernels/bench/gdn_operand_precision.py) is the plain-TF32 WY's: f16 keeps TF32's 10 mantissa bits.
    F16,
}

/// Which builds of the chunk-local WY kernel (launch 2) and of the sequential state kernel (launch 3) run: `wy`
/// the WY kernel's arithmetic ([`WyMath`]: `Fp32`: `gdn_prefill_wy` on the CUDA cores; `Tf32x3` / `Tf32`:
/// `gdn_prefill_wy_tc3` / `gdn_prefill_wy_tc1` on mma.sync TF32, the same workspace; `F16` the f16 split's
/// `gdn_prefill_wy_h_b`), `math` the state kernel's,
/// and `cols`, the state columns each state block owns (16, 32 or 64: 8, 4 or 2 blocks per (sequence, head);
/// the `Bf16` split only 64).
/// fla's split of launch 3 (`[wytf32_]tf32split_cs<32|64>`) was removed: at T = 16384 its walk
/// (1835.7 us at cs64) plus its output launch with the norm fused (963.0 us) took longer than the state walk
/// tf32_cs64 (2272.2 us) plus the norm (277.8 us); whole step 6125.8 us against 5856.3 us for `wytf32_tf32_cs64`.
/// On bf16 operands the same division is the `Bf16` split, faster than the default.
/// Launch 1 is the same for every variant: `gdn_prefill_prep` (one warp per 128-channel segment and 8 tokens,
/// ; cuda/gdn_prefill.cu has its numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct GdnPrefillVariant {
    pub(crate) wy: WyMath,
    pub(crate) math: StateMath,
    pub(crate) cols: u32,
}

/// The variant names [`Gpu::gdn_prefill_with`] accepts (besides "" and "auto"): `<math>_cs<cols>` with the
/// CUDA-core WY kernel, and `wy<wymath>_<math>_cs<cols>` (`wymath` `tf32` or `tf32x3`) with the tensor-core one;
/// the WY prefix combines with every state build (the bf16 split, `bf16_cs64`, only with a WY prefix), and this
/// list names the combinations the tests and the benchmark drive.
pub(crate) const GDN_PREFILL_VARIANTS: [&str; 17] = [
    "fp32_cs16",
    "fp32_cs32",
    "fp32_cs64",
    "tf32x3_cs16",
    "tf32x3_cs32",
    "tf32x3_cs64",
    "tf32_cs16",
    "tf32_cs32",
    "tf32_cs64",
    "wytf32x3_fp32_cs32",
    "wytf32x3_tf32x3_cs32",
    "wytf32_tf32_cs32",
    "wytf32_tf32_cs64",
    "wytf32x3_tf32_cs64",
    "wytf32x3_bf16_cs64",
    "wytf32_bf16_cs64",
    "wyf16_bf16_cs64",
];

impl GdnPrefillVariant {
    /// `wytf32_tf32_cs64`, the default (now [`Gpu::GDN_PREFILL_DEFAULT`] is
    /// `wytf32x3_tf32_cs64`, the same with a 3xTF32 WY, for precision: see there): the WY launch and the state walk
    /// both on plain TF32 tensor cores, 64 state columns per block, after the warp prep (`gdn_prefill_prep`, every
    /// variant's launch 1 ). On the H200 (`benchmarks/h200.md`, --quick, Qwen3.8-27B's layer)
    /// the whole step took 2615.4 us at B = 4, N = 9216 and 1291.7 us at T = 4096: 1.25x / 1.13x the same build
    /// on the block-per-token prep the warp prep replaced (3264.3 / 1462.8 us; the prep alone 304.9 against
    /// 969.2 us and 135.4 against 321.3 us, bit-identical outputs), 1.92x / 1.68x torch's conv + fla's chunk
    /// kernel + torch's gated norm (5033.2 / 2170.4 us), 0.35x / 0.32x fla's bare chunk kernel (909.1 / 414.5 us).
    /// Before that, with the old prep (T = 16384), the whole step took 5856.3 us: 1.15x the previous
    /// default `tf32_cs64` (CUDA-core WY, 6763.6 us), 1.48x torch conv + fla + torch norm (8687.3 us), 0.27x fla's
    /// bare chunk kernel (1599.9 us); `wytf32_tf32_cs32` took 6130.9 us. Stages: prep (block per token) 1277.2 us,
    /// WY on tensor cores 2049.9 us (2938.4 us on the CUDA cores), state walk tf32_cs64 2272.2 us, norm 277.8 us. At
    /// B = 4, N = 9216 it was also the fastest (3261.2 us against 3804.5 us for `tf32_cs64`). Its error (4e-4
    /// relative on the output against `fp32_cs32` there; the tests' 1e-2 bound on the normalised output against
    /// the f64 recurrence) is below that of fla's bf16 kernels (7e-3); `fp32_cs32` stays the accuracy reference.
    const DEFAULT: GdnPrefillVariant = GdnPrefillVariant {
        wy: WyMath::Tf32x3,
        math: StateMath::Tf32,
        cols: 64,
    };

    /// The engine's precise path (`"fp32_cs32"`: the fp32 WY and state walk on 32 columns), built without `lab`.
    const PRECISE: GdnPrefillVariant = GdnPrefillVariant {
        wy: WyMath::Fp32,
        math: StateMath::Fp32,
        cols: 32,
    };

    /// The variants a build without `lab` embeds the kernels of: `Auto`'s and the engine's precise one.
    const DEFAULT_BUILD: [GdnPrefillVariant; 2] = [Self::DEFAULT, Self::PRECISE];

    /// [`GdnPrefillVariant::parse`], or the shape error every entry point gives for a name it does not know.
    fn named(op: &'static str, name: &str) -> Result<GdnPrefillVariant, KernelError> {
        let v = Self::parse(name).ok_or_else(|| {
            KernelError::shape(
                op,
                format!("unknown state-kernel variant {name:?}: expected \"auto\" or one of {GDN_PREFILL_VARIANTS:?}"),
            )
        })?;
        // The other variants' kernels are compiled only with `lab`; refusing here names the cause before any
        // launch rather than failing on a missing kernel halfway through a prefill.
        crate::ensure_shape!(
            cfg!(feature = "lab") || Self::DEFAULT_BUILD.contains(&v),
            op,
            "state-kernel variant {name:?} needs the `lab` feature; this build has \"auto\" ({}) and \"fp32_cs32\"",
            Gpu::GDN_PREFILL_DEFAULT
        );
        Ok(v)
    }

    fn parse(name: &str) -> Option<GdnPrefillVariant> {
        if name.is_empty() || name == "auto" {
            return Some(Self::DEFAULT);
        }
        let (wy, name) = match name.strip_prefix("wy") {
            Some(rest) => {
                let (wy, state) = rest.split_once('_')?;
                let wy = match wy {
                    "tf32x3" => WyMath::Tf32x3,
                    "tf32" => WyMath::Tf32,
                    "f16" => WyMath::F16,
                    _ => return None,
                };
                (wy, state)
            }
            None => (WyMath::Fp32, name),
        };
        let (math, cols) = name.split_once("_cs")?;
        let math = match math {
            "fp32" => StateMath::Fp32,
            "tf32x3" => StateMath::Tf32x3,
            "tf32" => StateMath::Tf32,
            "bf16" => StateMath::Bf16,
            _ => return None,
        };
        let cols = match cols {
            "16" => 16,
            "32" => 32,
            "64" => 64,
            _ => return None,
        };
        // The split reads bf16 W / U / Aqk, which only the tensor-core WY builds write (their `_b` forms); the f16
        // WY exists only in that form.
        if math == StateMath::Bf16 && (cols != 64 || wy == WyMath::Fp32) {
            return None;
        }
        if wy == WyMath::F16 && math != StateMath::Bf16 {
            return None;
        }
        Some(GdnPrefillVariant { wy, math, cols })
    }

    /// The WY kernel's name in `cuda/gdn_prefill.cu`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn wy_kernel(&self) -> &'static str {
        match (self.wy, self.split()) {
            (WyMath::Fp32, _) => "gdn_prefill_wy",
            (WyMath::Tf32x3, false) => "gdn_prefill_wy_tc3",
            (WyMath::Tf32x3, true) => "gdn_prefill_wy_tc3_b",
            (WyMath::Tf32, false) => "gdn_prefill_wy_tc1",
            (WyMath::Tf32, true) => "gdn_prefill_wy_tc1_b",
            (WyMath::F16, _) => "gdn_prefill_wy_h_b",
        }
    }

    /// The state kernel's name in `cuda/gdn_prefill.cu` (launch 3).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn kernel(&self) -> &'static str {
        match (self.math, self.cols) {
            (StateMath::Fp32, 16) => "gdn_prefill_state_cs16",
            (StateMath::Fp32, 64) => "gdn_prefill_state_cs64",
            (StateMath::Fp32, _) => "gdn_prefill_state_cs32",
            (StateMath::Tf32x3, 16) => "gdn_prefill_state_tc3_cs16",
            (StateMath::Tf32x3, 64) => "gdn_prefill_state_tc3_cs64",
            (StateMath::Tf32x3, _) => "gdn_prefill_state_tc3_cs32",
            (StateMath::Tf32, 16) => "gdn_prefill_state_tc1_cs16",
            (StateMath::Tf32, 64) => "gdn_prefill_state_tc1_cs64",
            (StateMath::Tf32, _) => "gdn_prefill_state_tc1_cs32",
            (StateMath::Bf16, _) => "gdn_prefill_walk_bf16",
        }
    }

    /// Launch 1's kernel: `gdn_prefill_prep_h` (q, k, v in f16) for the f16 WY, `gdn_prefill_prep` otherwise.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn prep_kernel(&self) -> &'static str {
        if self.wy == WyMath::F16 {
            "gdn_prefill_prep_h"
        } else {
            "gdn_prefill_prep"
        }
    }

    /// Whether the WY launch, not launch 1, writes the split's bf16 copies of q and k (the f16 WY, from its f16
    /// tiles; its prep skips them).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn wy_writes_qk_bf16(&self) -> bool {
        self.wy == WyMath::F16
    }

    /// Whether launch 3 is the bf16 split (walk, then the output launch with the norm fused), which needs the
    /// workspace's `hs` region.
    pub(crate) fn split(&self) -> bool {
        self.math == StateMath::Bf16
    }
}

/// bf16 per (head, chunk) slot of the bf16 split's `hs` region: the chunk's incoming state `[128][128]`, then its
/// D `[64][128]` (`HS_SLOT` in cuda/gdn_prefill.cu).
pub(crate) const HS_SLOT_BF16: usize = 128 * 128 + CHUNK * 128;

/// Where the launches find `cu_seqlens` and the chunk offsets: a table built on the host (uploaded by the call),
/// or the caller's device `cu_seqlens` (the chunk offsets are then built on the device, in the workspace).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum GdnMeta<'a> {
    Host(&'a [i32]),
    Device(&'a GpuBuffer<u32>),
}

/// Float offsets and lengths of the prefill workspace regions (each region starts at a multiple of 64 floats, so
/// every float4 access of the kernels is aligned), plus the batch geometry the launches need.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct GdnPrefillLayout {
    pub(crate) seqs: usize,
    pub(crate) tokens: usize,
    pub(crate) chunks: usize,
    pub(crate) max_len: usize,
    pub(crate) max_chunks: usize,
    pub(crate) qk_len: usize,
    pub(crate) v_len: usize,
    pub(crate) gate_len: usize,
    pub(crate) wu_len: usize,
    pub(crate) aqk_len: usize,
    pub(crate) qn: usize,
    pub(crate) kn: usize,
    pub(crate) v: usize,
    pub(crate) g: usize,
    pub(crate) beta: usize,
    pub(crate) gcum: usize,
    pub(crate) w: usize,
    pub(crate) u: usize,
    pub(crate) aqk: usize,
    /// The bf16 split's per-(head, chunk) slots of the chunk's incoming state and D (bf16, `HS_SLOT_BF16` each,
    /// as floats: half that); `hs_len` is 0 for every other variant.
    pub(crate) hs: usize,
    pub(crate) hs_len: usize,
    /// The bf16 split's copies of the normalised q and k (`[N, Hk, 128]` bf16 each, q then k: `qk_len` floats in
    /// all); `qkb_len` is 0 for every other variant.
    pub(crate) qkb: usize,
    pub(crate) qkb_len: usize,
    /// The device-built meta table (`cu_seqlens` then chunk offsets, `2 * (seqs + 1)` int32) of
    /// [`Gpu::gdn_prefill_varlen`]; `meta_len` is 0 for [`Gpu::gdn_prefill`], which uploads its table.
    pub(crate) meta: usize,
    pub(crate) meta_len: usize,
    /// Floats the workspace needs.
    pub(crate) total: usize,
}

/// The prefill's limits: head dims 128 (the kernels' compile-time size), conv kernel 2..=4, 1..=65535 sequences,
/// at least one token in total and every token / row count within the kernels' 32-bit indices. Returns the layout.
fn layout(
    op: &'static str,
    dims: &GdnDims,
    seq_lens: &[usize],
    split: bool,
) -> Result<GdnPrefillLayout, KernelError> {
    let tokens = seq_lens.iter().try_fold(0usize, |a, &l| a.checked_add(l));
    let chunks = seq_lens
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l.div_ceil(CHUNK)));
    let (Some(tokens), Some(chunks)) = (tokens, chunks) else {
        return Err(KernelError::shape(op, "the sequence lengths overflow"));
    };
    let max_len = seq_lens.iter().copied().max().unwrap_or(0);
    layout_geom(
        op,
        dims,
        seq_lens.len(),
        tokens,
        chunks,
        max_len,
        false,
        split,
    )
}

/// [`layout`] for a device `cu_seqlens` table that the host does not read: `seqs` sequences of at most
/// `max_len` tokens each, `tokens` in all (`1..=tokens` for `max_len`). The device's meta kernel clamps the
/// table to disjoint ordered sequences inside `0..tokens` of at most `max_len` each, so their chunks number at
/// most `min(seqs * ceil(max_len / 64), ceil(tokens / 64) + seqs)`: the W / U / Aqk regions are sized for that
/// bound, and the meta region is added.
fn layout_varlen(
    op: &'static str,
    dims: &GdnDims,
    seqs: usize,
    tokens: usize,
    max_len: usize,
    split: bool,
) -> Result<GdnPrefillLayout, KernelError> {
    crate::ensure_shape!(
        (1..=tokens.max(1)).contains(&max_len),
        op,
        "max_seqlen must be 1..=total ({tokens}), got {max_len}"
    );
    let chunks = seqs
        .saturating_mul(max_len.div_ceil(CHUNK))
        .min(tokens.div_ceil(CHUNK).saturating_add(seqs));
    layout_geom(op, dims, seqs, tokens, chunks, max_len, true, split)
}

/// The shared body of [`layout`] and [`layout_varlen`]: `meta_region` adds the device-built table's region,
/// `split` the bf16 split's `hs` and `qkb` regions.
#[allow(clippy::too_many_arguments)]
fn layout_geom(
    op: &'static str,
    dims: &GdnDims,
    seqs: usize,
    tokens: usize,
    chunks: usize,
    max_len: usize,
    meta_region: bool,
    split: bool,
) -> Result<GdnPrefillLayout, KernelError> {
    super::gdn::check_gdn_geometry(op, dims, "prefill")?;
    crate::ensure_shape!(
        (1..=65535).contains(&seqs),
        op,
        "seq_lens must name 1..=65535 sequences, got {seqs}"
    );
    let heads = dims
        .key_heads
        .checked_mul(2)
        .and_then(|qk| qk.checked_add(dims.value_heads));
    crate::ensure_shape!(
        heads.is_some_and(|h| h <= 65535),
        op,
        "2 * key_heads + value_heads must be at most 65535 (grid limit), got key_heads = {}, value_heads = {}",
        dims.key_heads,
        dims.value_heads
    );
    crate::ensure_shape!(
        tokens > 0,
        op,
        "seq_lens must hold at least one token in total"
    );
    let lim = i32::MAX as usize;
    crate::ensure_shape!(
        tokens.saturating_mul(dims.value_heads) <= lim,
        op,
        "{tokens} tokens exceed the kernels' 32-bit token and row indices"
    );
    crate::ensure_shape!(
        !split || max_len.div_ceil(CHUNK) <= 65535,
        op,
        "the bf16 split's output launch takes a sequence's chunks as its grid's z (at most 65535 chunks of \
         {CHUNK}, {} tokens), got a sequence of {max_len} tokens",
        65535 * CHUNK
    );
    // The limits above keep every region far below 2^63 elements; the products are checked all the same.
    let pad = |n: usize| n.div_ceil(64).saturating_mul(64);
    let len = |what, f: &[usize]| checked_product(op, what, f);
    let qk_len = len("tokens*Hk*128", &[tokens, dims.key_heads, 128])?;
    let v_len = len("tokens*Hv*128", &[tokens, dims.value_heads, 128])?;
    let gate_len = len("tokens*Hv", &[tokens, dims.value_heads])?;
    let wu_len = len("Hv*chunks*64*128", &[dims.value_heads, chunks, CHUNK, 128])?;
    let aqk_len = len("Hv*chunks*64*64", &[dims.value_heads, chunks, CHUNK, CHUNK])?;
    let hs_len = if split {
        len(
            "Hv*chunks*hs_slot",
            &[dims.value_heads, chunks, HS_SLOT_BF16],
        )? / 2
    } else {
        0
    };
    let mut at = 0usize;
    let mut region = |len: usize| {
        let o = at;
        at = at.saturating_add(pad(len));
        o
    };
    let (qn, kn, v) = (region(qk_len), region(qk_len), region(v_len));
    let (g, beta, gcum) = (region(gate_len), region(gate_len), region(gate_len));
    let (w, u, aqk) = (region(wu_len), region(wu_len), region(aqk_len));
    let hs = region(hs_len);
    let qkb_len = if split { qk_len } else { 0 };
    let qkb = region(qkb_len);
    let meta_len = if meta_region { 2 * (seqs + 1) } else { 0 };
    let meta = region(meta_len);
    Ok(GdnPrefillLayout {
        seqs,
        tokens,
        chunks,
        max_len,
        max_chunks: max_len.div_ceil(CHUNK),
        qk_len,
        v_len,
        gate_len,
        wu_len,
        aqk_len,
        qn,
        kn,
        v,
        g,
        beta,
        gcum,
        w,
        u,
        aqk,
        hs,
        hs_len,
        qkb,
        qkb_len,
        meta,
        meta_len,
        total: at,
    })
}

impl Gpu {
    /// The build [`Gpu::gdn_prefill`] runs (and `"auto"` names): the warp prep, then the WY launch and the state
    /// walk on plain TF32 tensor cores, 64 columns per state block. H200 (--quick): whole step 2615.4 us
    /// at B = 4, N = 9216 and 1291.7 us at T = 4096, 1.25x / 1.13x the same build on the old block-per-token prep
    /// (3264.3 / 1462.8 us), 1.92x / 1.68x torch conv + fla + torch norm (5033.2 / 2170.4 us), 0.35x / 0.32x fla's
    /// bare chunk kernel (909.1 / 414.5 us). On the H200 with the old prep (T = 16384): 5856.3 us, 1.15x the previous default
    /// `tf32_cs64` (6763.6 us); the stage numbers are beside the constant it names.
    ///
    /// Now the WY launch runs 3xTF32 (`wytf32x3_tf32_cs64`, each operand split in two TF32 terms), not
    /// plain TF32: the plain-TF32 WY's errors reach the triangular solve's output, and on the H200 its worst
    /// normalised-output error over fresh draws went to 1.35e-2 on a 63-token sequence, over the tests'
    /// 1e-2 bound; over 24 further draws (`tf32_builds_hold_their_bounds_over_many_draws`) the worst was
    /// 6.3e-3 for the plain WY, 2.2e-3 with the 3xTF32 WY and 2.6e-3 with the fp32 WY. The 3xTF32 WY stage cost
    /// 592.6 against 501.3 us at T = 4096 (the stage alone), ~7% of the whole step.
    ///
    /// A later change made the same build faster without changing its arithmetic (TF32 rounding by one integer add,
    /// T inverted by 16 x 16 blocks, the walk double-buffered; cuda/gdn_prefill.cu): 1103.1 us at T = 4096 and
    /// 2222.9 us at B = 4, N = 9216, 0.38x / 0.41x fla's bare chunk kernel (414.7 / 909.2 us), 1.97x /
    /// 2.26x torch conv + fla + torch norm; stages at T = 4096: prep 135.7, WY 370.3 (plain TF32 ~300), walk
    /// 514.6, norm 72.0 us.
    pub const GDN_PREFILL_DEFAULT: &'static str = "wytf32x3_tf32_cs64";

    /// Every named variant [`Gpu::gdn_prefill_with`] accepts besides `""` and `"auto"` (the crate's
    /// `GDN_PREFILL_VARIANTS`), so the tests and the benchmark drive the one list the parser checks against.
    #[cfg(feature = "lab")]
    pub const GDN_PREFILL_VARIANTS: [&'static str; 17] = GDN_PREFILL_VARIANTS;

    /// Floats of the workspace [`Gpu::gdn_prefill`] needs for this batch: about
    /// `4 * N * (2*Hk + Hv) * 128` bytes for the normalised q/k/v, `4 * Hv * NC * 64 * (2*128 + 64)` for the
    /// chunk-local W, U and Aqk (`N` tokens, `NC = sum ceil(len / 64)` chunks) and three `[N, Hv]` gate arrays:
    /// 1.69 GB (422 M floats) at Qwen3.8-27B dims and 16384 tokens. Fails on the shapes
    /// [`Gpu::gdn_prefill`] refuses. This is the default variant's size, which every variant but the bf16 split
    /// shares: [`Gpu::gdn_prefill_workspace_len_with`] names the variant.
    pub fn gdn_prefill_workspace_len(
        dims: &GdnDims,
        seq_lens: &[usize],
    ) -> Result<usize, KernelError> {
        Self::gdn_prefill_workspace_len_with("auto", dims, seq_lens)
    }

    /// [`Gpu::gdn_prefill_workspace_len`] for the variant [`Gpu::gdn_prefill_with`] runs under that name: the bf16
    /// split (`wy<math>_bf16_cs64`) needs `2 * Hv * NC * (128 + 64) * 128` more bytes for each chunk's incoming
    /// state and D in bf16 and `2 * 2 * N * Hk * 128` for bf16 copies of q and k (+40% at Qwen3.8-27B dims).
    /// Fails on an unknown name too.
    pub fn gdn_prefill_workspace_len_with(
        variant: &str,
        dims: &GdnDims,
        seq_lens: &[usize],
    ) -> Result<usize, KernelError> {
        const OP: &str = "cuda::gdn_prefill_workspace_len";
        let split = GdnPrefillVariant::named(OP, variant)?.split();
        Ok(layout(OP, dims, seq_lens, split)?.total)
    }

    /// Chunked gated DeltaNet prefill of a batch of sequences: sequence `i` has `seq_lens[i]` tokens (0 allowed),
    /// stored consecutively in the inputs (cu_seqlens style: rows `sum(seq_lens[..i]) ..` of `qkv`, `z`, `a`, `b`
    /// and `out`), and continues from its conv history (`conv_in[i]`) and recurrent state (`state[i]`).
    ///
    /// Layouts are those of [`crate::gdn`] and [`Gpu::gdn_decode_step`] (all fp32): `qkv` `[N, conv_dim]`, `z`
    /// `[N, Hv*128]`, `a`, `b` `[N, Hv]`, `conv_in` / `conv_out` `[seqs, conv_dim, K-1]`, `state`
    /// `[seqs, Hv, 128, 128]` (updated in place), `out` `[N, Hv*128]` (the input of `out_proj`), with
    /// `N = sum(seq_lens)`. As in the decode step, the conv history is read from `conv_in` and the advanced one
    /// written to `conv_out`, so a following decode step reads `conv_out`. The result is the token-by-token
    /// recurrence's within TF32 rounding: chunks of 64 in the WY form, the WY products and the sequential state
    /// walk on TF32 tensor cores ([`Gpu::GDN_PREFILL_DEFAULT`]; [`Gpu::gdn_prefill_with`] `"fp32_cs32"` for fp32
    /// throughout).
    ///
    /// `io.workspace` must hold at least [`Gpu::gdn_prefill_workspace_len`] floats; its contents are scratch. Built
    /// for `dk = dv = 128` and conv kernels 2..=4, checked here with every length. `seq_lens` is read on the host
    /// (the grid is sized from it) and uploaded for the kernels, so a call costs one small host-to-device copy;
    /// [`Gpu::gdn_prefill_varlen`] takes the offsets on the device instead.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_prefill(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seq_lens: &[usize],
        io: GdnPrefillIo<'_>,
    ) -> Result<(), KernelError> {
        self.gdn_prefill_with("auto", dims, w, x, seq_lens, io)
    }

    /// [`Gpu::gdn_prefill`] with the build of the sequential state kernel named: `"auto"` (or `""`) for the
    /// default, else `<math>_cs<cols>` with `math` `fp32` (CUDA-core FMAs, the
    /// accuracy reference), `tf32x3` (tensor cores, 3xTF32 split: fp32-level accuracy) or `tf32` (tensor cores,
    /// plain TF32: products rounded to ~5e-4 relative), and `cols` 16, 32 or 64 state columns per block; with a
    /// `wytf32_` or `wytf32x3_` prefix (e.g. `"wytf32_tf32_cs64"`) the chunk-local WY launch runs on mma.sync TF32
    /// (plain or 3xTF32) instead of the CUDA cores. Every variant runs the same conv / norms / gates launch.
    /// Tests and the benchmark drive each.
    ///
    /// `"wytf32x3_bf16_cs64"` / `"wytf32_bf16_cs64"` run the bf16 split: the walk carries only the
    /// state and the output is computed parallel over chunks with the gated norm fused, every operand of both in
    /// bf16. H200: 762.6 / 675.2 us at T = 4096 and 1628.6 / 1425.2 us at B = 4, N = 9216 against the
    /// default's 1061.0 / 2258.8 us (0.54x-0.65x fla's bare chunk kernel against 0.39x / 0.41x), at fla's
    /// precision class: up to ~3e-2 scaled error on the normalised output and ~3e-3 on the state against the f64
    /// recurrence (the default: ~2e-3 / ~2e-4). Its workspace is larger: size it with
    /// [`Gpu::gdn_prefill_workspace_len_with`]. `"wyf16_bf16_cs64"` is the same split behind a WY
    /// launch on f16 tensor cores (q, k, v stored in f16 by its prep; the plain-TF32 WY's error model), the
    /// fastest build: 412.3 us at T = 4096 and 902.0 us at B = 4, N = 9216 on the H200 (1.003x / 1.016x
    /// fla's bare chunk kernel), `"wytf32_bf16_cs64"` 504.3 / 1105.4 us in the same run. The splits queue the WY,
    /// the walk and the output as programmatic dependents of the launch before (each waits in `pdl_wait`, the
    /// output per chunk on the walk's counters), so their starts overlap; their walk runs two blocks per
    /// (sequence, head) state, or one when that many blocks would not fit the GPU at once.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_prefill_with(
        &self,
        variant: &str,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seq_lens: &[usize],
        io: GdnPrefillIo<'_>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_prefill";
        let variant = GdnPrefillVariant::named(OP, variant)?;
        let lay = layout(OP, dims, seq_lens, variant.split())?;
        // cu_seqlens then the chunk offsets, both [seqs + 1]; every value fits i32 (checked by `layout`).
        let mut meta = Vec::with_capacity(2 * (lay.seqs + 1));
        let mut acc = 0usize;
        meta.push(0i32);
        for &l in seq_lens {
            acc += l;
            meta.push(acc as i32);
        }
        acc = 0;
        meta.push(0i32);
        for &l in seq_lens {
            acc += l.div_ceil(CHUNK);
            meta.push(acc as i32);
        }
        self.gdn_prefill_checked(OP, variant, dims, w, x, &lay, GdnMeta::Host(&meta), io)
    }

    /// Floats of the workspace [`Gpu::gdn_prefill_varlen`] needs: [`Gpu::gdn_prefill_workspace_len`]'s regions
    /// sized for the most chunks `seqs` sequences of at most `max_seqlen` tokens, `total` in all, can have, plus
    /// `2 * (seqs + 1)` for the table the device builds. Fails on the shapes [`Gpu::gdn_prefill_varlen`] refuses.
    /// The default variant's size, as [`Gpu::gdn_prefill_workspace_len`]; the variant named:
    /// [`Gpu::gdn_prefill_varlen_workspace_len_with`].
    pub fn gdn_prefill_varlen_workspace_len(
        dims: &GdnDims,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
    ) -> Result<usize, KernelError> {
        Self::gdn_prefill_varlen_workspace_len_with("auto", dims, seqs, total, max_seqlen)
    }

    /// [`Gpu::gdn_prefill_varlen_workspace_len`] for the variant named as in [`Gpu::gdn_prefill_with`].
    pub fn gdn_prefill_varlen_workspace_len_with(
        variant: &str,
        dims: &GdnDims,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
    ) -> Result<usize, KernelError> {
        const OP: &str = "cuda::gdn_prefill_varlen_workspace_len";
        let split = GdnPrefillVariant::named(OP, variant)?.split();
        Ok(layout_varlen(OP, dims, seqs, total, max_seqlen, split)?.total)
    }

    /// [`Gpu::gdn_prefill`] with the sequence offsets on the device, as [`Gpu::attention_prefill_varlen`] takes
    /// them: `cu_seqlens` (`[seqs + 1]`, u32) holds the token offsets, sequence `b` being rows
    /// `cu_seqlens[b] .. cu_seqlens[b + 1]` of `qkv`, `z`, `a`, `b` and `out` (`[total, ..]`), continuing from
    /// `conv_in[b]` and `state[b]`. Nothing is copied from the host, so the call can be captured in a CUDA graph.
    /// `max_seqlen` (`1..=total`) bounds every sequence's length and sizes the grid; `io.workspace` must hold
    /// [`Gpu::gdn_prefill_varlen_workspace_len`] floats.
    ///
    /// The table is read on the device and not checked here: a first small kernel clamps it to ordered,
    /// disjoint sequences inside `0..total` of at most `max_seqlen` tokens (entry `b + 1` is clamped to
    /// `cu[b] ..= min(total, cu[b] + max_seqlen)` after entry `b` was), so a wrong table gives wrong or unwritten
    /// rows, never an access outside the buffers. On a valid table the result is bit for bit that of
    /// [`Gpu::gdn_prefill_with`] on the same lengths (same kernels, same order of arithmetic).
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_prefill_varlen(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        cu_seqlens: &GpuBuffer<u32>,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
        io: GdnPrefillIo<'_>,
    ) -> Result<(), KernelError> {
        self.gdn_prefill_varlen_with("auto", dims, w, x, cu_seqlens, seqs, total, max_seqlen, io)
    }

    /// [`Gpu::gdn_prefill_varlen`] with the variant named as in [`Gpu::gdn_prefill_with`]; `io.workspace` must hold
    /// [`Gpu::gdn_prefill_varlen_workspace_len_with`] floats for the same name.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_prefill_varlen_with(
        &self,
        variant: &str,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        cu_seqlens: &GpuBuffer<u32>,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
        io: GdnPrefillIo<'_>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_prefill_varlen";
        let variant = GdnPrefillVariant::named(OP, variant)?;
        let lay = layout_varlen(OP, dims, seqs, total, max_seqlen, variant.split())?;
        check_len(OP, "cu_seqlens", cu_seqlens.len(), seqs + 1)?;
        self.gdn_prefill_checked(
            OP,
            variant,
            dims,
            w,
            x,
            &lay,
            GdnMeta::Device(cu_seqlens),
            io,
        )
    }

    /// The length checks both entry points share, then the launches.
    #[allow(clippy::too_many_arguments)]
    fn gdn_prefill_checked(
        &self,
        op: &'static str,
        variant: GdnPrefillVariant,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        lay: &GdnPrefillLayout,
        meta: GdnMeta<'_>,
        io: GdnPrefillIo<'_>,
    ) -> Result<(), KernelError> {
        let GdnPrefillIo {
            conv_in,
            conv_out,
            state,
            out,
            workspace,
        } = io;
        let n = lay.tokens;
        let sizes = super::gdn::check_gdn_weights(op, dims, w)?;
        let cd = sizes.conv_dim;
        check_len_of(op, "qkv", x.qkv.len(), &[n, cd])?;
        check_len_of(op, "z", x.z.len(), &[n, sizes.value_width])?;
        check_len_of(op, "a", x.a.len(), &[n, dims.value_heads])?;
        check_len_of(op, "b", x.b.len(), &[n, dims.value_heads])?;
        check_len_of(
            op,
            "conv_in",
            conv_in.len(),
            &[lay.seqs, sizes.conv_state_len],
        )?;
        check_len_of(
            op,
            "conv_out",
            conv_out.len(),
            &[lay.seqs, sizes.conv_state_len],
        )?;
        check_len_of(op, "state", state.len(), &[lay.seqs, sizes.state_len])?;
        check_len_of(op, "out", out.len(), &[n, sizes.value_width])?;
        crate::ensure_shape!(
            workspace.len() >= lay.total,
            op,
            "workspace has {} floats, the batch needs {} (Gpu::{}{})",
            workspace.len(),
            lay.total,
            if lay.meta_len > 0 {
                "gdn_prefill_varlen_workspace_len"
            } else {
                "gdn_prefill_workspace_len"
            },
            if variant.split() { "_with" } else { "" }
        );
        #[cfg(feature = "cuda")]
        {
            // The four prefill kernels on the device's stream. `meta` is either the host table
            // `cu_seqlens[seqs+1]` followed by the chunk offsets `[seqs+1]` (built and checked above; uploaded
            // here), or the caller's device `cu_seqlens`, from which `gdn_prefill_meta` builds the clamped table in
            // the workspace's meta region first. `lay` is the workspace split.
            let dev = &self.inner;
            let (conv_in, conv_out, state, out, workspace) = (
                &conv_in.slice,
                &mut conv_out.slice,
                &mut state.slice,
                &mut out.slice,
                &mut workspace.slice,
            );
            let seqs = lay.seqs;
            let (seqs_i, nc_i) = (seqs as i32, lay.chunks as i32);
            let mut uploaded: Option<CudaSlice<i32>> = None;
            let meta_dev = match meta {
                GdnMeta::Host(table) => {
                    let up: &CudaSlice<i32> = uploaded.insert(
                        dev.stream()
                            .clone_htod(table)
                            .map_err(cuda_err("gdn_prefill: uploading cu_seqlens"))?,
                    );
                    up.as_view()
                }
                GdnMeta::Device(cu) => {
                    const NAME: &str = "gdn_prefill_meta";
                    let f = dev.function(Module::GdnPrefill, NAME)?;
                    let (total_i, max_len_i) = (lay.tokens as i32, lay.max_len as i32);
                    {
                        let mut table = workspace.slice_mut(lay.meta..lay.meta + lay.meta_len);
                        let cfg = launch_config((1, 1, 1), (256, 1, 1), 0);
                        // SAFETY: matches `gdn_prefill_meta`; cu = [seqs + 1] u32 (checked by the caller), the table
                        // view is the workspace's meta region of 2 * (seqs + 1) floats, written as int32 bits.
                        unsafe {
                            dev.launch_args(NAME, &f, cfg, |b| {
                                b.arg(&cu.slice).arg(&mut table);
                                b.arg(&seqs_i).arg(&total_i).arg(&max_len_i);
                            })
                        }?;
                    }
                    let table = workspace.slice(lay.meta..lay.meta + lay.meta_len);
                    // SAFETY: the region holds 2 * (seqs + 1) 4-byte elements that `gdn_prefill_meta` wrote as int32
                    // (queued before every reader on this stream); f32 and i32 have the same size and alignment.
                    unsafe { table.transmute::<i32>(lay.meta_len) }.ok_or_else(|| {
                        KernelError::shape("cuda::gdn_prefill_varlen", "meta region too small")
                    })?
                }
            };
            let (hk, hv, kconv) = (
                dims.key_heads as i32,
                dims.value_heads as i32,
                dims.conv_kernel as i32,
            );
            let ws = |off: usize, len: usize| workspace.slice(off..off + len);

            // 1. conv + norms + gates (`gdn_prefill_prep`: a warp per (8 tokens, segment), four segments per block).
            {
                let name = variant.prep_kernel();
                let f = dev.function(Module::GdnPrefill, name)?;
                let segs = 2 * dims.key_heads + dims.value_heads;
                let cfg = launch_config(
                    (
                        lay.max_len.div_ceil(PREP_TOKENS) as u32,
                        segs.div_ceil(4) as u32,
                        seqs as u32,
                    ),
                    (128, 1, 1),
                    0,
                );
                let (qn, kn, vv, gg, bb) = (
                    ws(lay.qn, lay.qk_len),
                    ws(lay.kn, lay.qk_len),
                    ws(lay.v, lay.v_len),
                    ws(lay.g, lay.gate_len),
                    ws(lay.beta, lay.gate_len),
                );
                // The bf16 split's copies of q and k (null pointers for every other variant and where the WY launch
                // writes them: the kernel skips them).
                let null = 0u64;
                let (qb, kb) = qk_bf16_views(workspace, lay)?;
                // SAFETY: matches `gdn_prefill_prep` / `gdn_prefill_prep_h` (same parameters; `_h` writes qn, kn, v as
                // f16 into the first half of the same regions); the caller checked qkv = [N, conv_dim], a, b = [N, Hv],
                // conv_weight = [conv_dim, K], a_log, dt_bias = [Hv], conv_in/conv_out = [seqs, conv_dim, K-1]
                // (distinct allocations), dk = dv = 128 and meta's offsets (non-decreasing, last = N); the workspace
                // views are disjoint ranges of `workspace` sized by `lay` (qb / kb: [N, Hk, 128] bf16 each in the
                // split's qkb region, or null); kconv is 2..=4 (checked by `layout`). Warps past a sequence's length or
                // the last segment return.
                unsafe {
                    dev.launch_args(name, &f, cfg, |b| {
                        b.arg(&x.qkv.slice).arg(&x.a.slice).arg(&x.b.slice);
                        b.arg(&w.conv_weight.slice)
                            .arg(&w.a_log.slice)
                            .arg(&w.dt_bias.slice);
                        b.arg(conv_in).arg(&mut *conv_out).arg(&meta_dev);
                        b.arg(&qn).arg(&kn).arg(&vv).arg(&gg).arg(&bb);
                        if variant.split() && !variant.wy_writes_qk_bf16() {
                            b.arg(&qb).arg(&kb);
                        } else {
                            b.arg(&null).arg(&null);
                        }
                        b.arg(&hk).arg(&hv).arg(&kconv);
                    })
                }?;
            }
            // 2. chunk-local WY (CUDA cores or tensor cores; same parameters and outputs).
            {
                let name = variant.wy_kernel();
                let smem = match variant.wy {
                    WyMath::Fp32 => WY_SMEM_BYTES,
                    WyMath::F16 => WY_H_SMEM_BYTES,
                    WyMath::Tf32x3 | WyMath::Tf32 => WY_TC_SMEM_BYTES,
                };
                let f = dev.function_with_smem(Module::GdnPrefill, name, smem)?;
                if variant.wy != WyMath::Fp32 {
                    // Two blocks of 100.5 KiB (68.5 KiB for the f16 build) per SM need more than the default
                    // carveout; ask for all of it (cuda/gdn_prefill.cu).
                    max_carveout(&f, name)?;
                }
                let cfg = launch_config(
                    (lay.max_chunks as u32, dims.value_heads as u32, seqs as u32),
                    (256, 1, 1),
                    smem,
                );
                let (qn, kn, vv, gg, bb) = (
                    ws(lay.qn, lay.qk_len),
                    ws(lay.kn, lay.qk_len),
                    ws(lay.v, lay.v_len),
                    ws(lay.g, lay.gate_len),
                    ws(lay.beta, lay.gate_len),
                );
                let (gc, wo, uo, ao) = (
                    ws(lay.gcum, lay.gate_len),
                    ws(lay.w, lay.wu_len),
                    ws(lay.u, lay.wu_len),
                    ws(lay.aqk, lay.aqk_len),
                );
                // Launched as the prep's programmatic dependent (Device::launch_pdl): every WY build starts with
                // `pdl_wait`, so only its blocks' start overlaps the prep's last blocks. The guards order the raw
                // addresses after pending work on other streams.
                let (qp, _g1) = qn.device_ptr(dev.stream());
                let (kp, _g2) = kn.device_ptr(dev.stream());
                let (vp, _g3) = vv.device_ptr(dev.stream());
                let (gp, _g4) = gg.device_ptr(dev.stream());
                let (bp, _g5) = bb.device_ptr(dev.stream());
                let (mp, _g6) = meta_dev.device_ptr(dev.stream());
                let (cp, _g7) = gc.device_ptr(dev.stream());
                let (wp, _g8) = wo.device_ptr(dev.stream());
                let (up, _g9) = uo.device_ptr(dev.stream());
                let (ap, _g10) = ao.device_ptr(dev.stream());
                let mut args = PdlArgs::default();
                args.ptr(qp).ptr(kp).ptr(vp).ptr(gp).ptr(bp).ptr(mp);
                args.ptr(cp).ptr(wp).ptr(up).ptr(ap);
                args.i32(hk).i32(hv).i32(seqs_i).i32(nc_i);
                // The f16 WY also writes the split's bf16 q / k copies (the qkb region), which its prep skips.
                let qkb = if variant.wy_writes_qk_bf16() {
                    Some(qk_bf16_views(workspace, lay)?)
                } else {
                    None
                };
                let _qkb_guards = qkb.as_ref().map(|(qb, kb)| {
                    let (qbp, g11) = qb.device_ptr(dev.stream());
                    let (kbp, g12) = kb.device_ptr(dev.stream());
                    args.ptr(qbp).ptr(kbp);
                    (g11, g12)
                });
                // SAFETY: matches `gdn_prefill_wy`, `gdn_prefill_wy_tc{1,3}[_b]` and `gdn_prefill_wy_h_b` (same
                // parameters; the `_b` forms write W, U, Aqk as bf16 into the first half of the same regions, `_h_b`
                // reads the f16 qn, kn, v `gdn_prefill_prep_h` wrote there); each reads and writes nothing before its
                // `pdl_wait` (the prep's end), then reads what launch 1 wrote and writes gcum [N, Hv],
                // W, U [Hv, NC, 64, 128] and Aqk [Hv, NC, 64, 64], each block only its own chunk's rows (chunk offsets
                // in meta sum to NC); blocks past a sequence's chunks return. `_h_b` also takes the qkb region's
                // q / k halves ([N, Hk, 128] bf16 each) and writes its chunk's rows of its key head there (one value
                // head per key head).
                unsafe { dev.launch_pdl(name, &f, cfg, &mut args) }?;
            }
            // 3. sequential state walk + unnormalised output (the bf16 split: launches 3' and 4' instead of 3 and 4).
            {
                let (name, cs) = (variant.kernel(), variant.cols);
                let smem = match variant.math {
                    StateMath::Fp32 => state_smem_bytes(cs),
                    StateMath::Tf32x3 | StateMath::Tf32 => state_tc_smem_bytes(cs),
                    // (The meta upload, if any, is freed in stream order after these launches, when this returns.)
                    StateMath::Bf16 => {
                        return dev
                            .gdn_prefill_split(dims, w, x, &meta_dev, lay, state, out, workspace)
                    }
                };
                let f = dev.function_with_smem(Module::GdnPrefill, name, smem)?;
                if variant.math != StateMath::Fp32 {
                    // Two blocks of 113 KiB per SM (16 and 32 columns) or one of 220 KiB (64) need the whole
                    // 228 KiB carveout (cuda/gdn_prefill.cu).
                    max_carveout(&f, name)?;
                }
                let cfg = launch_config(
                    (128 / cs, dims.value_heads as u32, seqs as u32),
                    (256, 1, 1),
                    smem,
                );
                let (qn, kn, gc, wi, ui, ai) = (
                    ws(lay.qn, lay.qk_len),
                    ws(lay.kn, lay.qk_len),
                    ws(lay.gcum, lay.gate_len),
                    ws(lay.w, lay.wu_len),
                    ws(lay.u, lay.wu_len),
                    ws(lay.aqk, lay.aqk_len),
                );
                // SAFETY: matches `gdn_prefill_state_cs*` and `gdn_prefill_state_tc*_cs*` (same parameters); state =
                // [seqs, Hv, 128, 128] and out = [N, Hv*128] were checked; each block owns `cs` columns of one
                // (sequence, head) state and writes only those columns of that head's output rows of its sequence. A
                // plain launch: it reads what the WY wrote, and the state kernels have no `pdl_wait`.
                unsafe {
                    dev.launch_args(name, &f, cfg, |b| {
                        b.arg(&qn).arg(&kn).arg(&gc).arg(&wi).arg(&ui).arg(&ai);
                        b.arg(&meta_dev).arg(&mut *state).arg(&mut *out);
                        b.arg(&hk).arg(&hv).arg(&seqs_i).arg(&nc_i);
                    })
                }?;
            }
            // 4. gated RMSNorm in place.
            {
                const NAME: &str = "gdn_prefill_gated_norm";
                let f = dev.function(Module::GdnPrefill, NAME)?;
                let rows = lay.tokens * dims.value_heads;
                let rows_i = rows as i32;
                let cfg = launch_config((rows.div_ceil(8) as u32, 1, 1), (256, 1, 1), 0);
                // SAFETY: matches `gdn_prefill_gated_norm`; out and z are [N, Hv*128], norm_weight [128]; warps past
                // `rows` return.
                unsafe {
                    dev.launch_args(NAME, &f, cfg, |b| {
                        b.arg(&mut *out)
                            .arg(&x.z.slice)
                            .arg(&w.norm_weight.slice)
                            .arg(&w.norm_eps)
                            .arg(&rows_i);
                    })
                }?;
            }
            // The meta upload must outlive the kernels that read it: dropping a cudarc slice frees it in stream order
            // (cuMemFreeAsync on this stream), after the launches queued above (`meta_dev` borrows it until here).
            let _ = meta_dev;
            drop(uploaded);
            Ok(())
        }
        no_cuda!(self, variant, meta, conv_in, conv_out, state, out)
    }
}

/// Tokens per warp of `gdn_prefill_prep` (`PREP_TT` in cuda/gdn_prefill.cu, kept equal by a static_assert
/// there).
#[cfg(feature = "cuda")]
const PREP_TOKENS: usize = 8;

/// Dynamic shared memory of `gdn_prefill_wy` (`WY_SMEM_BYTES` in cuda/gdn_prefill.cu, kept equal by a
/// static_assert there).
#[cfg(feature = "cuda")]
const WY_SMEM_BYTES: u32 = 101_376;

/// Dynamic shared memory of `gdn_prefill_wy_tc{1,3}` (`wy_tc_smem_bytes()` in cuda/gdn_prefill.cu, kept equal by a
/// static_assert there).
#[cfg(feature = "cuda")]
const WY_TC_SMEM_BYTES: u32 = 102_912;
/// Dynamic shared memory of `gdn_prefill_wy_h_b` (cuda/gdn_prefill.cu `wy_h_smem_bytes()`): K, Q, V f16 tiles
/// (A and then T over Q), T fp32, g and beta.
#[cfg(feature = "cuda")]
const WY_H_SMEM_BYTES: u32 = 70_144;

/// Dynamic shared memory of `gdn_prefill_state_cs<CS>` (`state_smem_bytes(CS)` in cuda/gdn_prefill.cu).
#[cfg(feature = "cuda")]
fn state_smem_bytes(cs: u32) -> u32 {
    (2 * 64 * 132 + 64 * 65 + 64 * cs + 128 * cs + 64) * 4
}

/// Dynamic shared memory of `gdn_prefill_state_tc*_cs<CS>` (`state_tc_smem_bytes(CS)` in cuda/gdn_prefill.cu):
/// one chunk buffer (two [64][132] tiles and a [64][68] one) per block at 16 and 32 columns, two at 64 (the next
/// chunk streams in while this one is multiplied), plus the state and D tiles.
#[cfg(feature = "cuda")]
fn state_tc_smem_bytes(cs: u32) -> u32 {
    let buffers = if cs == 64 { 2 } else { 1 };
    ((2 * 64 * 132 + 64 * 68) * buffers + 128 * (cs + 8) + 64 * (cs + 8)) * 4
}

/// Dynamic shared memory of `gdn_prefill_walk_bf16`, `gdn_prefill_walk1_bf16` and `gdn_prefill_out_bf16`
/// (`walk_bf16_smem_bytes()`, `walk1_bf16_smem_bytes()`, `out_bf16_smem_bytes()` in cuda/gdn_prefill.cu, kept
/// equal by a static_assert there). Either walk block leaves room for one output block on its SM.
#[cfg(feature = "cuda")]
const WALK_BF16_SMEM_BYTES: u32 = 125_440;
#[cfg(feature = "cuda")]
const WALK1_BF16_SMEM_BYTES: u32 = 137_728;
#[cfg(feature = "cuda")]
const OUT_BF16_SMEM_BYTES: u32 = 75_008;

/// Which walk the bf16 split runs for `pairs` (sequence, value head) states on `sms` SMs: the two-block walk
/// (`gdn_prefill_walk_bf16`, 64 state columns per block) while its `2 * pairs` blocks are all resident at once
/// (one per SM), else the one-block walk (`gdn_prefill_walk1_bf16`, all 128 columns per block, ~1.6x the
/// two-block walk's time per chunk for twice its columns). Beyond one wave the two-block walk's last blocks start
/// late, and the output launch (its programmatic dependent) can start only once every walk block has. On the H200,
/// the whole f16 split step with this rule's walk against the other: T = 4096 (48 pairs) 412.3 us
/// two-block against 426.1 one-block; B = 4 x 9216 (192 pairs) 902.0 one-block against 929.7 two-block (fla
/// 413.6 / 916.5), B = 2 x 4096 (96 pairs, an earlier and slower one-block walk): 816.1 against 814.6.
#[cfg(feature = "cuda")]
fn walk_one_block(pairs: usize, sms: usize) -> bool {
    2 * pairs > sms
}

/// `floats` floats of the workspace from float `at`, as the kernels' bf16 (u16 here: the same bits; cudarc has no
/// bf16 device type without its half feature): `2 * floats` elements. An empty region gives an empty view.
#[cfg(feature = "cuda")]
fn bf16_view(
    workspace: &CudaSlice<f32>,
    at: usize,
    floats: usize,
) -> Result<cudarc::driver::CudaView<'_, u16>, KernelError> {
    let v = workspace
        .try_slice(at..at + floats)
        .ok_or_else(|| KernelError::shape("cuda::gdn_prefill", "workspace region out of range"))?;
    // SAFETY: `floats` f32 are 2 * floats 2-byte elements of the same allocation; f32's alignment covers u16's.
    unsafe { v.transmute::<u16>(2 * floats) }
        .ok_or_else(|| KernelError::shape("cuda::gdn_prefill", "workspace region too small"))
}

/// The split's bf16 copies of q and k: the qkb region's two halves ([N, Hk, 128] bf16 each, q then k).
#[cfg(feature = "cuda")]
type Bf16View<'a> = cudarc::driver::CudaView<'a, u16>;
#[cfg(feature = "cuda")]
fn qk_bf16_views<'a>(
    workspace: &'a CudaSlice<f32>,
    lay: &GdnPrefillLayout,
) -> Result<(Bf16View<'a>, Bf16View<'a>), KernelError> {
    let half = lay.qkb_len / 2;
    Ok((
        bf16_view(workspace, lay.qkb, half)?,
        bf16_view(workspace, lay.qkb + half, half)?,
    ))
}

/// Asks for the whole 228 KiB shared-memory carveout (two blocks of ~100-115 KiB per SM need it).
#[cfg(feature = "cuda")]
fn max_carveout(f: &cudarc::driver::CudaFunction, name: &str) -> Result<(), KernelError> {
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        100,
    )
    .map_err(cuda_err(name))
}

#[cfg(feature = "cuda")]
impl Device {
    /// Launches 3' and 4' of the bf16 split (cuda/gdn_prefill.cu): the walk carrying only the state, storing each
    /// chunk's incoming state and D (bf16) in the workspace's `hs` region, then the output parallel over chunks
    /// with the gated norm fused.
    #[allow(clippy::too_many_arguments)]
    fn gdn_prefill_split(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        meta_dev: &cudarc::driver::CudaView<'_, i32>,
        lay: &GdnPrefillLayout,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        workspace: &CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let (hk, hv) = (dims.key_heads as i32, dims.value_heads as i32);
        let (seqs_i, nc_i) = (lay.seqs as i32, lay.chunks as i32);
        let gc = workspace.slice(lay.gcum..lay.gcum + lay.gate_len);
        // What the `_b` WY wrote: bf16 W, U, Aqk in the first half of each region; q and k in bf16 (prep).
        let wi = bf16_view(workspace, lay.w, lay.wu_len / 2)?;
        let ui = bf16_view(workspace, lay.u, lay.wu_len / 2)?;
        let ai = bf16_view(workspace, lay.aqk, lay.aqk_len / 2)?;
        let (qb, kb) = qk_bf16_views(workspace, lay)?;
        let hs = bf16_view(workspace, lay.hs, lay.hs_len)?;
        // The walk's per-(head, chunk) ready counters (cuda/gdn_prefill.cu `split_ready`): one int per slot in the
        // Aqk region's second half, which the bf16 Aqk leaves free; zeroed by the `_b` WY launch.
        let slots = dims.value_heads * lay.chunks;
        let ready_at = lay.aqk + lay.aqk_len / 2;
        let ready_f = workspace
            .try_slice(ready_at..ready_at + slots)
            .ok_or_else(|| {
                KernelError::shape("cuda::gdn_prefill", "workspace region out of range")
            })?;
        // SAFETY: `slots` f32 of the same allocation read as i32 (same size and alignment); only the kernels write
        // them, as int32.
        let ready = unsafe { ready_f.transmute::<i32>(slots) }
            .ok_or_else(|| KernelError::shape("cuda::gdn_prefill", "workspace region too small"))?;
        {
            let one_block = walk_one_block(lay.seqs * dims.value_heads, self.sm_count());
            let (name, smem, blocks_x) = if one_block {
                ("gdn_prefill_walk1_bf16", WALK1_BF16_SMEM_BYTES, 1)
            } else {
                ("gdn_prefill_walk_bf16", WALK_BF16_SMEM_BYTES, 2)
            };
            let f = self.function_with_smem(Module::GdnPrefill, name, smem)?;
            max_carveout(&f, name)?; // one walk block and one output block per SM
            let cfg = launch_config(
                (blocks_x, dims.value_heads as u32, lay.seqs as u32),
                (256, 1, 1),
                smem,
            );
            // Launched as the WY's programmatic dependent (Device::launch_pdl): each block loads its state (the
            // caller's), then waits in `pdl_wait` for the WY's end.
            let (kp, _g1) = kb.device_ptr(self.stream());
            let (gp, _g2) = gc.device_ptr(self.stream());
            let (wp, _g3) = wi.device_ptr(self.stream());
            let (up, _g4) = ui.device_ptr(self.stream());
            let (mp, _g5) = meta_dev.device_ptr(self.stream());
            let (sp, _g6) = state.device_ptr_mut(self.stream());
            let (hp, _g7) = hs.device_ptr(self.stream());
            let (rp, _g8) = ready.device_ptr(self.stream());
            let mut args = PdlArgs::default();
            args.ptr(kp)
                .ptr(gp)
                .ptr(wp)
                .ptr(up)
                .ptr(mp)
                .ptr(sp)
                .ptr(hp)
                .ptr(rp);
            args.i32(hk).i32(hv).i32(seqs_i).i32(nc_i);
            // SAFETY: matches `gdn_prefill_walk_bf16` and `gdn_prefill_walk1_bf16` (the same parameters); before
            // their `pdl_wait` they read only the state (the caller's) and meta (written before the prep, a plain
            // launch), after it what launches 1 and 2 wrote; state = [seqs, Hv, 128, 128] was checked; each block
            // owns 64 (two-block walk) or all 128 columns of one (sequence, head) state and writes only those
            // columns of its own chunks' hs slots (hs holds Hv * NC slots, `layout`), then adds 1 per 64 columns
            // to each chunk's ready counter (Hv * NC int32 past the bf16 Aqk, inside the Aqk region).
            unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        }
        {
            const NAME: &str = "gdn_prefill_out_bf16";
            let f = self.function_with_smem(Module::GdnPrefill, NAME, OUT_BF16_SMEM_BYTES)?;
            max_carveout(&f, NAME)?;
            let cfg = LaunchConfig {
                // Heads fastest, chunks slowest: the order in which the walk finishes the slots (`layout`
                // checked max_chunks <= 65535).
                grid_dim: (
                    dims.value_heads as u32,
                    lay.seqs as u32,
                    lay.max_chunks as u32,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: OUT_BF16_SMEM_BYTES,
            };
            // Launched as the walk's programmatic dependent (Device::launch_pdl): its blocks become resident beside
            // the walk's (one per walk block's SM, three on the SMs the walk leaves idle) and each waits for its
            // chunk's ready counter, not for the walk's end. The guards order the raw addresses after pending work
            // on other streams.
            let (qp, _g1) = qb.device_ptr(self.stream());
            let (gp, _g2) = gc.device_ptr(self.stream());
            let (ap, _g3) = ai.device_ptr(self.stream());
            let (hp, _g4) = hs.device_ptr(self.stream());
            let (mp, _g5) = meta_dev.device_ptr(self.stream());
            let (zp, _g6) = x.z.slice.device_ptr(self.stream());
            let (wp, _g7) = w.norm_weight.slice.device_ptr(self.stream());
            let (op, _g8) = out.device_ptr_mut(self.stream());
            let (rp, _g9) = ready.device_ptr(self.stream());
            let mut args = PdlArgs::default();
            args.ptr(qp)
                .ptr(gp)
                .ptr(ap)
                .ptr(hp)
                .ptr(mp)
                .ptr(zp)
                .ptr(wp)
                .f32(w.norm_eps)
                .ptr(op)
                .ptr(rp);
            args.i32(hk).i32(hv).i32(seqs_i).i32(nc_i);
            // SAFETY: matches `gdn_prefill_out_bf16`; reads launch 2's Aqk and the prep's q (finished: the walk's
            // blocks trigger this launch only after their `pdl_wait`, the WY's end, itself after the prep's) and
            // each chunk's hs slot only after that chunk's ready counter reached 2 (all 128 columns written; the
            // walk's blocks are all resident before this grid starts, so the counters do get there); z and out are
            // [N, Hv*128], norm_weight [128] (checked); each block writes only its chunk's rows of its head; blocks
            // past a sequence's chunks return.
            unsafe { self.launch_pdl(NAME, &f, cfg, &mut args) }?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launch constants against `cuda/gdn_prefill.cu`'s static_assert literals and the bench's copies
    /// (`device::source_literal` says why). One change altered three of these sizes in three places by hand.
    #[cfg(feature = "cuda")]
    const CU: &str = include_str!("../../cuda/gdn_prefill.cu");
    #[cfg(feature = "cuda")]
    const BENCH: &str = include_str!("../../bench/h200/bench_gdn_prefill.py");
    #[cfg(feature = "cuda")]
    use super::super::device::source_literal;

    fn qwen() -> GdnDims {
        GdnDims {
            key_heads: 16,
            value_heads: 48,
            key_dim: 128,
            value_dim: 128,
            conv_kernel: 4,
        }
    }

    #[test]
    fn layout_regions_are_aligned_and_disjoint() {
        let l = layout("t", &qwen(), &[65, 0, 3], false).unwrap();
        assert_eq!(
            (l.tokens, l.chunks, l.max_len, l.max_chunks),
            (68, 3, 65, 2)
        );
        let regions = [
            (l.qn, l.qk_len),
            (l.kn, l.qk_len),
            (l.v, l.v_len),
            (l.g, l.gate_len),
            (l.beta, l.gate_len),
            (l.gcum, l.gate_len),
            (l.w, l.wu_len),
            (l.u, l.wu_len),
            (l.aqk, l.aqk_len),
        ];
        for (i, &(o, n)) in regions.iter().enumerate() {
            assert_eq!(o % 64, 0, "region {i} at {o}");
            assert!(o + n <= l.total);
            if i + 1 < regions.len() {
                assert!(o + n <= regions[i + 1].0, "region {i} overlaps the next");
            }
        }
        assert_eq!(l.gate_len, 68 * 48);
        assert_eq!(l.hs_len, 0);
        // The bf16 split adds its slots after Aqk (the same regions before them).
        let sl = layout("t", &qwen(), &[65, 0, 3], true).unwrap();
        assert_eq!((sl.w, sl.aqk), (l.w, l.aqk));
        assert_eq!(sl.hs_len, 48 * 3 * (128 * 128 + 64 * 128) / 2);
        assert_eq!(sl.hs % 64, 0);
        assert_eq!((sl.qkb % 64, sl.qkb_len, l.qkb_len), (0, sl.qk_len, 0));
        assert!(l.aqk + l.aqk_len <= sl.hs && sl.hs + sl.hs_len <= sl.qkb);
        assert!(sl.qkb + sl.qkb_len <= sl.meta && sl.meta <= sl.total);
        assert_eq!(l.wu_len, 48 * 3 * 64 * 128);
        assert_eq!(l.aqk_len, 48 * 3 * 64 * 64);
    }

    /// Every kernel the prefill can launch for the variants this build accepts (`Auto`'s and the engine's precise
    /// one; with `lab`, every named variant) is in the embedded `cuda/gdn_prefill.cu`, and without `lab` nothing
    /// else is. The names come from the variant's own kernel functions and the device file's fixed launches.
    #[cfg(feature = "cuda")]
    #[test]
    fn every_accepted_gdn_prefill_kernel_is_embedded() {
        let entries = Module::GdnPrefill.entries();
        let mut names = vec!["auto", "", "fp32_cs32"];
        if cfg!(feature = "lab") {
            names.extend(GDN_PREFILL_VARIANTS);
        }
        let mut seen = std::collections::BTreeSet::from(["gdn_prefill_meta"]);
        for name in names {
            let v = GdnPrefillVariant::named("t", name).unwrap();
            seen.extend([v.prep_kernel(), v.wy_kernel(), v.kernel()]);
            if v.split() {
                seen.extend([
                    "gdn_prefill_walk_bf16",
                    "gdn_prefill_walk1_bf16",
                    "gdn_prefill_out_bf16",
                ]);
            } else {
                seen.insert("gdn_prefill_gated_norm");
            }
        }
        for k in &seen {
            assert!(entries.contains(k), "{k} is not embedded");
        }
        #[cfg(not(feature = "lab"))]
        {
            assert_eq!(entries, seen.into_iter().collect::<Vec<_>>());
            let e = GdnPrefillVariant::named("t", "tf32_cs16").unwrap_err();
            assert!(e.to_string().contains("needs the `lab` feature"), "{e}");
        }
    }

    #[test]
    fn every_variant_name_parses_to_its_kernel() {
        for full in GDN_PREFILL_VARIANTS {
            let v = GdnPrefillVariant::parse(full).unwrap();
            let (wy, name) = match full.strip_prefix("wy") {
                Some(rest) => rest.split_once('_').unwrap(),
                None => ("fp32", full),
            };
            let wy_kernel = match wy {
                "fp32" => "gdn_prefill_wy",
                "tf32x3" => "gdn_prefill_wy_tc3",
                "f16" => "gdn_prefill_wy_h",
                _ => "gdn_prefill_wy_tc1",
            };
            let prep = if wy == "f16" {
                "gdn_prefill_prep_h"
            } else {
                "gdn_prefill_prep"
            };
            assert_eq!(v.prep_kernel(), prep, "{full}");
            assert_eq!(v.wy_writes_qk_bf16(), wy == "f16", "{full}");
            // The split's WY launch is the `_b` form (bf16 W, U, Aqk) of the same build.
            let b = if name.starts_with("bf16_") { "_b" } else { "" };
            assert_eq!(v.wy_kernel(), format!("{wy_kernel}{b}"), "{full}");
            let (math, cols) = name.split_once("_cs").unwrap();
            assert_eq!(v.cols.to_string(), cols, "{name}");
            assert_eq!(v.split(), math == "bf16", "{name}");
            if math == "bf16" {
                assert_eq!(v.kernel(), "gdn_prefill_walk_bf16", "{name}");
                continue;
            }
            assert!(v.kernel().ends_with(&format!("_cs{cols}")), "{name}");
            let tag = match math {
                "fp32" => "state_cs",
                "tf32x3" => "state_tc3_cs",
                _ => "state_tc1_cs",
            };
            assert!(v.kernel().contains(tag), "{name} -> {}", v.kernel());
        }
        assert_eq!(
            GdnPrefillVariant::parse(""),
            Some(GdnPrefillVariant::DEFAULT)
        );
        // The public name of the default is the default.
        let named = Gpu::GDN_PREFILL_DEFAULT;
        assert_ne!(named, "auto");
        assert!(GDN_PREFILL_VARIANTS.contains(&named));
        let (math, cols) = named.split_once("_cs").unwrap();
        assert_eq!(GdnPrefillVariant::DEFAULT.cols.to_string(), cols);
        assert_eq!(
            GdnPrefillVariant::DEFAULT.math,
            match math {
                "fp32" => StateMath::Fp32,
                "tf32x3" => StateMath::Tf32x3,
                _ => StateMath::Tf32,
            }
        );
        assert_eq!(
            GdnPrefillVariant::parse("auto"),
            Some(GdnPrefillVariant::DEFAULT)
        );
        // The name parses to the default as a whole (its WY prefix included), and the default is the 3xTF32
        // tensor-core WY with the plain-TF32 state walk on 64 columns (for precision).
        assert_eq!(
            GdnPrefillVariant::parse(named),
            Some(GdnPrefillVariant::DEFAULT)
        );
        assert_eq!(
            GdnPrefillVariant::DEFAULT,
            GdnPrefillVariant {
                wy: WyMath::Tf32x3,
                math: StateMath::Tf32,
                cols: 64,
            }
        );
        assert_eq!(GdnPrefillVariant::DEFAULT.wy_kernel(), "gdn_prefill_wy_tc3");
        assert_eq!(
            GdnPrefillVariant::DEFAULT.kernel(),
            "gdn_prefill_state_tc1_cs64"
        );
        // Any state build behind either tensor-core WY prefix.
        assert_eq!(
            GdnPrefillVariant::parse("wytf32x3_tf32_cs16"),
            Some(GdnPrefillVariant {
                wy: WyMath::Tf32x3,
                math: StateMath::Tf32,
                cols: 16,
            })
        );
        for bad in [
            "fp32",
            "fp32_cs48",
            "bf16_cs32",
            // The bf16 split is built for 64 columns only.
            "bf16_cs16",
            "wytf32x3_bf16_cs32",
            // ... behind a tensor-core WY only (the CUDA-core WY writes no bf16 W / U / Aqk).
            "bf16_cs64",
            "wybf16_bf16_cs64",
            // The f16 WY exists only in front of the split, and f16 is no state build.
            "wyf16_tf32_cs64",
            "wyf16_fp32_cs32",
            "wyf16_bf16_cs32",
            "f16_cs64",
            "wytf32_f16_cs64",
            "tf32x3_cs",
            "32",
            "wy",
            "wytf32",
            "wyfp32_tf32_cs32",
            "wybf16_tf32_cs32",
            "wytf32_cs32",
            "wytf32_tf32_cs48",
            "wytf32_wytf32_tf32_cs32",
            // fla's split, removed.
            "tf32split_cs32",
            "tf32split_cs64",
            "wytf32_tf32split_cs64",
            "tf32split",
            // The warp prep's prefix, gone since it became every variant's launch 1.
            "prepw_fp32_cs32",
            "prepw_wytf32_tf32_cs64",
        ] {
            assert_eq!(GdnPrefillVariant::parse(bad), None, "{bad}");
            let e = GdnPrefillVariant::named("t", bad).unwrap_err().to_string();
            assert!(
                e.contains("unknown state-kernel variant") && e.contains(bad),
                "{e}"
            );
        }
        assert_eq!(
            GdnPrefillVariant::named("t", "auto").unwrap(),
            GdnPrefillVariant::DEFAULT
        );
    }

    #[test]
    fn layout_refuses_bad_shapes() {
        let e = layout("t", &qwen(), &[], false).unwrap_err();
        assert!(e.to_string().contains("1..=65535 sequences"), "{e}");
        let e = layout("t", &qwen(), &[0, 0], false).unwrap_err();
        assert!(e.to_string().contains("at least one token"), "{e}");
        let e = layout(
            "t",
            &GdnDims {
                key_dim: 64,
                ..qwen()
            },
            &[4],
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("key_dim = value_dim = 128"), "{e}");
        let e = layout(
            "t",
            &GdnDims {
                conv_kernel: 5,
                ..qwen()
            },
            &[4],
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("conv_kernel must be 2..=4"), "{e}");
        let e = layout("t", &qwen(), &[usize::MAX, 2], false).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
        let e = layout("t", &qwen(), &[1 << 27], false).unwrap_err();
        assert!(e.to_string().contains("32-bit"), "{e}");
        // The split's output grid takes the chunks as z (65535 at most); the other builds take them as x.
        let long = [65535 * CHUNK + 1];
        let e = layout("t", &qwen(), &long, true).unwrap_err();
        assert!(e.to_string().contains("at most 65535 chunks"), "{e}");
        assert!(layout("t", &qwen(), &long, false).is_ok());
        assert!(layout("t", &qwen(), &[65535 * CHUNK], true).is_ok());
    }

    #[test]
    fn varlen_layout_bounds_the_chunks_and_adds_the_meta_table() {
        // 3 sequences of at most 130 of 200 tokens: at most min(3 * 3, 4 + 3) = 7 chunks.
        let l = layout_varlen("t", &qwen(), 3, 200, 130, false).unwrap();
        assert_eq!((l.seqs, l.tokens, l.chunks, l.max_len), (3, 200, 7, 130));
        assert_eq!(l.max_chunks, 3);
        assert_eq!((l.meta % 64, l.meta_len), (0, 8));
        assert!(l.aqk + l.aqk_len <= l.meta && l.meta + l.meta_len <= l.total);
        // Short sequences: the per-sequence bound is the smaller one.
        assert_eq!(
            layout_varlen("t", &qwen(), 4, 200, 10, false)
                .unwrap()
                .chunks,
            4
        );
        // The host-table layout has no meta region.
        assert_eq!(layout("t", &qwen(), &[65, 3], false).unwrap().meta_len, 0);
        for (seqs, tokens, max_len, msg) in [
            (1, 10, 11, "max_seqlen must be 1..=total"),
            (1, 10, 0, "max_seqlen must be 1..=total"),
            (0, 10, 5, "1..=65535 sequences"),
            (65536, 100_000, 5, "1..=65535 sequences"),
            (1, 1 << 27, 64, "32-bit"),
        ] {
            let e = layout_varlen("t", &qwen(), seqs, tokens, max_len, false).unwrap_err();
            assert!(
                e.to_string().contains(msg),
                "{seqs} {tokens} {max_len}: {e}"
            );
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn launch_constants_match_the_kernel_file_and_the_bench() {
        let cu = |key: &str| source_literal(CU, key, " == ");
        let py = |key: &str| source_literal(BENCH, key, " = ");
        assert_eq!(cu("static_assert(PREP_TT") as usize, PREP_TOKENS);
        assert_eq!(py("\nPREP_TT") as usize, PREP_TOKENS);
        assert_eq!(cu("static_assert(WY_SMEM_BYTES") as u32, WY_SMEM_BYTES);
        assert_eq!(py("\nWY_SMEM") as u32, WY_SMEM_BYTES);
        assert_eq!(cu("wy_tc_smem_bytes()") as u32, WY_TC_SMEM_BYTES);
        assert_eq!(py("\nWY_TC_SMEM") as u32, WY_TC_SMEM_BYTES);
        assert_eq!(cu("wy_h_smem_bytes()") as u32, WY_H_SMEM_BYTES);
        assert_eq!(py("\nWY_H_SMEM") as u32, WY_H_SMEM_BYTES);
        for cs in [16, 32, 64] {
            assert_eq!(
                cu(&format!("state_smem_bytes({cs})")) as u32,
                state_smem_bytes(cs),
                "cs {cs}"
            );
            assert_eq!(
                cu(&format!("state_tc_smem_bytes({cs})")) as u32,
                state_tc_smem_bytes(cs),
                "cs {cs}"
            );
        }
        assert_eq!(cu("walk_bf16_smem_bytes()") as u32, WALK_BF16_SMEM_BYTES);
        assert_eq!(py("\nWALK_BF16_SMEM") as u32, WALK_BF16_SMEM_BYTES);
        assert_eq!(cu("walk1_bf16_smem_bytes()") as u32, WALK1_BF16_SMEM_BYTES);
        assert_eq!(py("\nWALK1_BF16_SMEM") as u32, WALK1_BF16_SMEM_BYTES);
        assert_eq!(cu("out_bf16_smem_bytes()") as u32, OUT_BF16_SMEM_BYTES);
        assert_eq!(py("\nOUT_BF16_SMEM") as u32, OUT_BF16_SMEM_BYTES);
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn the_walk_takes_one_block_per_state_beyond_one_wave_of_two() {
        // H200 (132 SMs): one 4096-token sequence of 48 heads runs the two-block walk (96 blocks), four run the
        // one-block walk (384 two-block blocks would be three waves); the bench mirrors this rule.
        assert!(!walk_one_block(48, 132));
        assert!(!walk_one_block(66, 132));
        assert!(walk_one_block(67, 132));
        assert!(walk_one_block(4 * 48, 132));
        assert!(walk_one_block(1, 0));
        assert!(!walk_one_block(0, 132));
        assert!(
            BENCH.contains("def walk_one_block(pairs, sms):\n    return 2 * pairs > sms\n"),
            "the bench's copy of the rule"
        );
    }
}
