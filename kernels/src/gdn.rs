//! Gated DeltaNet (Qwen3.5 / Qwen3-Next `linear_attention` layers) on the CPU: the fused recurrent decode step for a
//! batch of sequences and the chunked (chunk 64, WY / UT-transform) prefill of one sequence.
//!
//! Both take the layer's projections after the input linear layers and produce the input of `out_proj`; in between
//! they run, in one call: the causal depthwise conv (kernel [`GdnDims::conv_kernel`], SiLU) over the concatenated
//! `q|k|v` channels, l2-normalisation of q and k (q also scaled by `1/sqrt(dk)`), the gates
//! `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`, the delta-rule state update
//! `S <- exp(g) S; S <- S + k (x) beta (v - S^T k)`, the output `o = S^T q`, and the gated RMSNorm
//! `rmsnorm(o) * w * silu(z)` per value head (plain `w`, not `1 + w`: transformers' `Qwen3NextRMSNormGated`).
//!
//! # Data layouts (shared by the C kernels, [`crate::reference::gdn`] and the CUDA kernels)
//! All row-major, fp32. `n` is the batch (decode: one token per sequence) or the token count (prefill).
//! - `qkv`: `[n, conv_dim]`, `conv_dim = 2*Hk*dk + Hv*dv`, channels in the order q (`[Hk, dk]`), k (`[Hk, dk]`),
//!   v (`[Hv, dv]`) — the `in_proj_qkvz` split transformers calls `mixed_qkv`.
//! - `z`: `[n, Hv*dv]`; `a`, `b`: `[n, Hv]`.
//! - `conv_weight`: `[conv_dim, K]` (the checkpoint's `[conv_dim, 1, K]` squeezed), tap `K-1` multiplies the current
//!   input; no bias (Qwen3.5 builds the conv with `bias=False`).
//! - `a_log`, `dt_bias`: `[Hv]`; `norm_weight`: `[dv]` (shared by all value heads).
//! - conv state: `[seqs, conv_dim, K-1]`, the last `K-1` inputs of each channel, oldest first (zeros for a new
//!   sequence). Transformers keeps `K` entries; we keep only the `K-1` that the next step reads.
//! - recurrent state: `[seqs, Hv, dk, dv]` fp32, `S[h][i][j]` maps key component `i` to value component `j`
//!   (`o = S^T q`). Zeros for a new sequence.
//! - output: `[n, Hv*dv]`.
//!
//! Value head `h` reads key head `h / (Hv / Hk)`.
//!
//! # Paths and speed
//! AVX-512 is hand-written (`csrc/gdn_avx512.c`): the decode step walks the state in 16-column blocks that stay
//! in L1 between reading `S^T k` and writing the update, and the prefill register-blocks every product of the
//! chunk algorithm. Scalar and AVX2 are the same portable C (`csrc/gdn_impl.h`), the AVX2 build only
//! compiler-vectorised. Measured by `cargo bench -p kernels --bench cpu_seq` in two full runs on this shared
//! 2-core AVX-512 VM (its read+write bandwidth moved from 20 to 13 GB/s between them; spreads up to 370%, so read
//! these as ranges): the decode step of one Qwen3.8 layer (3 MiB of state) took 0.42-0.43 ms on one thread against
//! a byte floor of 0.31-0.49 ms; the chunked prefill of 512 tokens took 34-103 ms on two threads, 3.0-3.3x faster
//! than 512 recurrent steps and 5.2-5.3x faster than the scalar chunk code, at 0.21-0.25 of the FMA roof measured
//! in the same run. The prefill flushes subnormals for the duration of the call (the chunk decays reach them; with
//! the microcode assists the AVX-512 prefill of 1024 tokens took 745 instead of 287 ms) and restores the caller's
//! floating-point mode.

use crate::cpu::{Isa, SharedMut};
use crate::error::{check_len, checked_product};
use crate::ops::{c_kernels, fastest_path, isa_kernels};
use crate::KernelError;

/// The l2-norm epsilon transformers uses for q and k (`l2norm(x, eps=1e-6)` in `modeling_qwen3_5`).
pub const L2NORM_EPS: f32 = 1e-6;

pub use crate::shapes::{GdnDims, CHUNK};

/// The layer's parameters the kernels read (everything but the linear projections).
#[derive(Debug, Clone, Copy)]
pub struct GdnWeights<'a> {
    /// `[conv_dim, K]`.
    pub conv_weight: &'a [f32],
    /// `[Hv]`, the checkpoint's `A_log`.
    pub a_log: &'a [f32],
    /// `[Hv]`.
    pub dt_bias: &'a [f32],
    /// `[dv]`, the gated RMSNorm weight.
    pub norm_weight: &'a [f32],
    /// The gated RMSNorm epsilon (`rms_norm_eps`, 1e-6 in Qwen3.5).
    pub norm_eps: f32,
}

/// Per-token inputs of `n` tokens (see the module docs for the layouts).
#[derive(Debug, Clone, Copy)]
pub struct GdnInputs<'a> {
    /// `[n, conv_dim]`.
    pub qkv: &'a [f32],
    /// `[n, Hv*dv]`.
    pub z: &'a [f32],
    /// `[n, Hv]`.
    pub a: &'a [f32],
    /// `[n, Hv]`.
    pub b: &'a [f32],
}

/// Checks the weights against `dims`.
pub(crate) fn check_weights(
    op: &'static str,
    dims: &GdnDims,
    w: &GdnWeights<'_>,
) -> Result<(), KernelError> {
    dims.validate(op)?;
    let lens = [
        w.conv_weight.len(),
        w.a_log.len(),
        w.dt_bias.len(),
        w.norm_weight.len(),
    ];
    check_weight_lens(op, dims, lens, w.norm_eps)?;
    Ok(())
}

/// The lengths of a layer's weights (`conv_weight`, `a_log`, `dt_bias`, `norm_weight`, in that order) and its
/// norm epsilon against `dims`, shared by the CPU and the CUDA checks so both refuse the same layers; returns the
/// sizes derived from `dims`.
pub(crate) fn check_weight_lens(
    op: &'static str,
    dims: &GdnDims,
    [conv_weight, a_log, dt_bias, norm_weight]: [usize; 4],
    norm_eps: f32,
) -> Result<crate::shapes::GdnSizes, KernelError> {
    let sizes = dims.checked_sizes(op)?;
    check_len(op, "conv_weight", conv_weight, sizes.conv_weight_len)?;
    check_len(op, "a_log", a_log, dims.value_heads)?;
    check_len(op, "dt_bias", dt_bias, dims.value_heads)?;
    check_len(op, "norm_weight", norm_weight, dims.value_dim)?;
    crate::ensure_shape!(
        norm_eps.is_finite() && norm_eps >= 0.0,
        op,
        "norm_eps must be finite and non-negative, got {norm_eps}"
    );
    Ok(sizes)
}

/// Checks `n` tokens of inputs against `dims`.
pub(crate) fn check_inputs(
    op: &'static str,
    dims: &GdnDims,
    n: usize,
    x: &GdnInputs<'_>,
) -> Result<(), KernelError> {
    let sizes = dims.checked_sizes(op)?;
    let per_token = |what, len| checked_product(op, what, &[n, len]);
    check_len(
        op,
        "qkv",
        x.qkv.len(),
        per_token("n*conv_dim", sizes.conv_dim)?,
    )?;
    check_len(op, "z", x.z.len(), per_token("n*Hv*dv", sizes.value_width)?)?;
    check_len(op, "a", x.a.len(), per_token("n*Hv", dims.value_heads)?)?;
    check_len(op, "b", x.b.len(), per_token("n*Hv", dims.value_heads)?)?;
    Ok(())
}

/// Checks the conv state, recurrent state and output of `seqs` sequences producing `n` output rows.
pub(crate) fn check_states(
    op: &'static str,
    dims: &GdnDims,
    seqs: usize,
    n: usize,
    conv_state: &[f32],
    state: &[f32],
    out: &[f32],
) -> Result<(), KernelError> {
    let sizes = dims.checked_sizes(op)?;
    check_len(
        op,
        "conv_state",
        conv_state.len(),
        checked_product(op, "seqs*conv_dim*(K-1)", &[seqs, sizes.conv_state_len])?,
    )?;
    check_len(
        op,
        "state",
        state.len(),
        checked_product(op, "seqs*Hv*dk*dv", &[seqs, sizes.state_len])?,
    )?;
    check_len(
        op,
        "out",
        out.len(),
        checked_product(op, "n*Hv*dv", &[n, sizes.value_width])?,
    )?;
    Ok(())
}

/// Largest key / value head dim the C kernels accept (they keep a few head-sized vectors on the stack).
pub const MAX_HEAD_DIM: usize = 1024;

/// Mirror of `seq_gdn_args` in `csrc/seq_common.h`.
#[repr(C)]
struct GdnArgs {
    hk: i64,
    hv: i64,
    dk: i64,
    dv: i64,
    norm_eps: f32,
    l2_eps: f32,
    mixed: *const f32,
    z: *const f32,
    a: *const f32,
    b: *const f32,
    a_log: *const f32,
    dt_bias: *const f32,
    norm_w: *const f32,
    state: *mut f32,
    out: *mut f32,
}

// SAFETY: the pointers in GdnArgs are only dereferenced by the C kernels on disjoint item ranges (each thread writes
// only the state blocks and output rows of its own items), and the borrows they come from outlive the scoped
// threads of `parallel_ranges`.
unsafe impl Sync for GdnArgs {}

c_kernels! {
    type ConvFn = fn(t: i64, cd: i64, kk: i64, x: *const f32, w: *const f32, cs: *mut f32, y: *mut f32, c0: i64, c1: i64) -> i32;
    gdn_conv_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] gdn_conv_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] gdn_conv_avx512,
}
c_kernels! {
    type DecodeFn = fn(p: *const GdnArgs, i0: i64, i1: i64) -> i32;
    gdn_decode_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] gdn_decode_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] gdn_decode_avx512,
}
c_kernels! {
    type PrefillFn = fn(p: *const GdnArgs, t: i64, h0: i64, h1: i64, scratch: *mut f32) -> i32;
    gdn_prefill_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] gdn_prefill_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] gdn_prefill_avx512,
}

fn kernels_for(op: &'static str, isa: Isa) -> Result<(ConvFn, DecodeFn, PrefillFn), KernelError> {
    isa_kernels!(op, isa,
        scalar: (gdn_conv_scalar, gdn_decode_scalar, gdn_prefill_scalar),
        avx2: (gdn_conv_avx2, gdn_decode_avx2, gdn_prefill_avx2),
        avx512: (gdn_conv_avx512, gdn_decode_avx512, gdn_prefill_avx512),
    )
}

#[allow(clippy::too_many_arguments)]
fn check_all(
    op: &'static str,
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    seqs: usize,
    n: usize,
    x: &GdnInputs<'_>,
    conv_state: &[f32],
    state: &[f32],
    out: &[f32],
) -> Result<(), KernelError> {
    check_weights(op, dims, w)?;
    crate::ensure_shape!(
        dims.key_dim <= MAX_HEAD_DIM && dims.value_dim <= MAX_HEAD_DIM,
        op,
        "head dims above {MAX_HEAD_DIM} are not supported, got dk={} dv={}",
        dims.key_dim,
        dims.value_dim
    );
    check_inputs(op, dims, n, x)?;
    check_states(op, dims, seqs, n, conv_state, state, out)
}

fn args(
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    mixed: &[f32],
    x: &GdnInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> GdnArgs {
    GdnArgs {
        hk: dims.key_heads as i64,
        hv: dims.value_heads as i64,
        dk: dims.key_dim as i64,
        dv: dims.value_dim as i64,
        norm_eps: w.norm_eps,
        l2_eps: L2NORM_EPS,
        mixed: mixed.as_ptr(),
        z: x.z.as_ptr(),
        a: x.a.as_ptr(),
        b: x.b.as_ptr(),
        a_log: w.a_log.as_ptr(),
        dt_bias: w.dt_bias.as_ptr(),
        norm_w: w.norm_weight.as_ptr(),
        state: state.as_mut_ptr(),
        out: out.as_mut_ptr(),
    }
}

fastest_path! {
    /// One decode step for `batch` sequences (one token each) with the fastest path and all cores: conv state and
    /// recurrent state of every sequence advance by one token and `out` (`[batch, Hv*dv]`) receives the gated-norm
    /// output. One call per layer.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_step(dims: &GdnDims, w: &GdnWeights<'_>, batch: usize, x: &GdnInputs<'_>, conv_state: &mut [f32], state: &mut [f32], out: &mut [f32]) -> Result<(), KernelError> = decode_step_with;
}

/// [`decode_step`] on an explicit instruction-set path and thread count (threads split the `batch * Hv`
/// (sequence, value head) pairs).
#[allow(clippy::too_many_arguments)]
pub fn decode_step_with(
    isa: Isa,
    threads: usize,
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    batch: usize,
    x: &GdnInputs<'_>,
    conv_state: &mut [f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "gdn::decode_step";
    check_all(OP, dims, w, batch, batch, x, conv_state, state, out)?;
    let (conv, decode, _) = kernels_for(OP, isa)?;
    let cd = dims.conv_dim();
    let kk = dims.conv_kernel;
    let mut mixed = vec![0.0f32; batch * cd];
    let mut tag = 0;
    for b in 0..batch {
        // SAFETY: qkv row b has cd floats, conv_state block b has cd*(K-1), mixed row b has cd (checked above);
        // the kernel reads/writes channels 0..cd only.
        tag = unsafe {
            conv(
                1,
                cd as i64,
                kk as i64,
                x.qkv[b * cd..].as_ptr(),
                w.conv_weight.as_ptr(),
                conv_state[b * dims.conv_state_len()..].as_mut_ptr(),
                mixed[b * cd..].as_mut_ptr(),
                0,
                cd as i64,
            )
        };
    }
    if batch > 0 {
        crate::cpu::record_isa(OP, isa, tag)?;
    }
    let p = args(dims, w, &mixed, x, state, out);
    let tag = std::sync::atomic::AtomicI32::new(-1);
    crate::cpu::parallel_ranges(batch * dims.value_heads, 1, threads, |i0, i1| {
        // SAFETY: every buffer in `p` was size-checked for `batch` sequences; items i0..i1 touch only their own
        // state blocks and output rows, so concurrent ranges never alias.
        let t = unsafe { decode(&p, i0 as i64, i1 as i64) };
        tag.store(t, std::sync::atomic::Ordering::Relaxed);
    });
    if batch > 0 {
        crate::cpu::record_isa(OP, isa, tag.into_inner())?;
    }
    Ok(())
}

/// Floats of per-thread scratch the chunked prefill needs.
fn prefill_scratch_len(dims: &GdnDims) -> usize {
    4 * CHUNK * dims.key_dim + 3 * CHUNK * dims.value_dim + 2 * CHUNK * CHUNK + 2 * CHUNK
}

fastest_path! {
    /// Chunked prefill of `t` tokens of one sequence (chunk [`CHUNK`], WY / UT-transform form, ragged last chunk),
    /// continuing from `conv_state` / `state` (zeros for a new sequence) and leaving them as `t` calls of
    /// [`decode_step`] would. `out` is `[t, Hv*dv]`.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill(dims: &GdnDims, w: &GdnWeights<'_>, t: usize, x: &GdnInputs<'_>, conv_state: &mut [f32], state: &mut [f32], out: &mut [f32]) -> Result<(), KernelError> = prefill_with;
}

/// [`prefill`] on an explicit instruction-set path and thread count (threads split the conv channels, then the
/// value heads).
#[allow(clippy::too_many_arguments)]
pub fn prefill_with(
    isa: Isa,
    threads: usize,
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    t: usize,
    x: &GdnInputs<'_>,
    conv_state: &mut [f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "gdn::prefill";
    check_all(OP, dims, w, 1, t, x, conv_state, state, out)?;
    if t == 0 {
        return Ok(());
    }
    let (conv, _, prefill) = kernels_for(OP, isa)?;
    let cd = dims.conv_dim();
    let mut mixed = vec![0.0f32; t * cd];
    let tag = std::sync::atomic::AtomicI32::new(-1);
    let (ymix, cs) = (
        SharedMut(mixed.as_mut_ptr()),
        SharedMut(conv_state.as_mut_ptr()),
    );
    crate::cpu::parallel_ranges(cd, 16, threads, |c0, c1| {
        // SAFETY: qkv and mixed are [t, cd], conv_state is [cd, K-1] (checked); this range writes only channels
        // c0..c1 of mixed and of the conv state.
        let r = unsafe {
            conv(
                t as i64,
                cd as i64,
                dims.conv_kernel as i64,
                x.qkv.as_ptr(),
                w.conv_weight.as_ptr(),
                cs.get(),
                ymix.get(),
                c0 as i64,
                c1 as i64,
            )
        };
        tag.store(r, std::sync::atomic::Ordering::Relaxed);
    });
    crate::cpu::record_isa(OP, isa, tag.load(std::sync::atomic::Ordering::Relaxed))?;
    let p = args(dims, w, &mixed, x, state, out);
    let scratch_len = prefill_scratch_len(dims);
    crate::cpu::parallel_ranges(dims.value_heads, 1, threads, |h0, h1| {
        let mut scratch = vec![0.0f32; scratch_len];
        // SAFETY: buffers in `p` are size-checked for one sequence of t tokens; heads h0..h1 write only their own
        // state blocks and output columns; scratch has the length gdn_prefill documents.
        let r = unsafe { prefill(&p, t as i64, h0 as i64, h1 as i64, scratch.as_mut_ptr()) };
        tag.store(r, std::sync::atomic::Ordering::Relaxed);
    });
    crate::cpu::record_isa(OP, isa, tag.into_inner())
}
