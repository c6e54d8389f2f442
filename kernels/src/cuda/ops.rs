//! The small per-token ops of the engine on the GPU (`cuda/ops.cu`), each the GPU form of a CPU op of the crate:
//!
//! - [`Gpu::rmsnorm`], [`Gpu::rmsnorm_f32`]: [`crate::ops::rmsnorm`] (both [`NormWeight`] forms), fp32 rows in,
//!   bf16 out (the next GEMV/GEMM's activations) or fp32 out (a q/k norm ahead of RoPE);
//!   [`Gpu::add_rmsnorm`], [`Gpu::add_rmsnorm_f32`]: the fused residual form (`residual += x`, then the norm of
//!   the sum), which the CPU has as two calls.
//! - [`Gpu::silu_and_mul`], [`Gpu::gelu_and_mul`]: [`crate::ops::silu_and_mul`] / [`crate::ops::gelu_and_mul`],
//!   fp32 `gate_up` (a GEMM's output) in, bf16 out (the down projection's input).
//! - [`Gpu::embedding_gather`] (bf16 table) and [`Gpu::embedding_gather_int4`] (the packed tinygemm layout of
//!   [`crate::linear::Int4Weights`]): [`crate::ops::embedding_gather`] / `Int4Weights::gather_rows`, fp32 out (the
//!   residual stream).
//! - [`Gpu::argmax`]: [`crate::ops::argmax`] per row; [`Gpu::sample`]: [`crate::sampling::sample`] per row, the
//!   same token for the same seed.
//! - [`Gpu::rope_neox`]: [`crate::attention::rope_neox`] in place.
//! - The f32 elementwise ops of the engine's exact path: [`Gpu::cast_f32_to_bf16`] / [`Gpu::cast_bf16_to_f32`],
//!   [`Gpu::act_and_mul_f32`] ([`crate::ops::act_and_mul`] with f32 output), [`Gpu::sigmoid_gate`],
//!   [`Gpu::sigmoid_head_gate`], [`Gpu::softcap`] (the `crate::backend` ops of those names), [`Gpu::add_assign`],
//!   [`Gpu::scale_assign`], [`Gpu::add_bias_rows`] and [`Gpu::copy_cols`].
//!
//! **Device-side values.** Token ids, positions and logits live on the device in an engine, so the host cannot
//! check them before a launch without a round trip. The kernels never read out of bounds because of them and
//! flag them instead: an id past the table gathers a row of NaN (which the norm, the GEMMs and the LM head carry
//! to the logits); a row of logits holding a NaN (or +inf, for sampling) answers the token `u32::MAX`
//! ([`Gpu::INVALID_TOKEN`]), where the CPU returns an error. Everything the host does know (every length, count
//! and parameter) is checked here and refused with [`KernelError::Shape`] before any launch.

#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

#[cfg(feature = "cuda")]
use super::device::{launch_config, Device, Module, PdlArgs};
use super::{
    check_len, check_len_of, Fp8Fragments, FragmentOrder, GemvFragments, Gpu, GpuBuffer, GpuScalar,
    Nvfp4Fragments,
};
use crate::shapes::NormWeight;
use crate::shapes::Rope;
use crate::shapes::SamplingParams;
use crate::KernelError;

const I32_MAX: usize = i32::MAX as usize;

/// Rows of a norm call: `weight` is one row, `x` a whole number of them; `rows <= i32::MAX` (one block per row).
fn check_norm(op: &'static str, x: usize, weight: usize, eps: f32) -> Result<usize, KernelError> {
    crate::ensure_shape!(weight > 0, op, "weight must not be empty");
    crate::ensure_shape!(
        weight <= I32_MAX,
        op,
        "dim = {weight} must fit the kernel's 32-bit row length"
    );
    crate::ensure_shape!(
        x.is_multiple_of(weight),
        op,
        "x has {x} elements, not a whole number of rows of {weight}"
    );
    crate::ensure_shape!(
        eps.is_finite() && eps >= 0.0,
        op,
        "eps must be finite and non-negative, got {eps}"
    );
    let rows = x / weight;
    crate::ensure_shape!(
        rows <= I32_MAX,
        op,
        "{rows} rows: at most i32::MAX (one block per row)"
    );
    Ok(rows)
}

/// Rows of a gated activation: `gate_up` is `[rows, 2 * inter]`; `ceil(inter / 1024)` blocks per row fit grid.y.
fn check_glu(op: &'static str, gate_up: usize, inter: usize) -> Result<usize, KernelError> {
    crate::ensure_shape!(inter > 0, op, "inter must be positive");
    crate::ensure_shape!(
        inter <= 65535 * 1024,
        op,
        "inter = {inter} is past the kernel's grid (at most 65535 * 1024)"
    );
    let width = 2 * inter;
    crate::ensure_shape!(
        gate_up.is_multiple_of(width),
        op,
        "gate_up has {gate_up} elements, not a whole number of rows of 2*inter = {width}"
    );
    let rows = gate_up / width;
    crate::ensure_shape!(
        rows <= I32_MAX,
        op,
        "{rows} rows: at most i32::MAX (one block per row)"
    );
    Ok(rows)
}

/// The norm kernels' `add`: the weight multiplies as `w + add`.
fn norm_add(form: NormWeight) -> f32 {
    match form {
        NormWeight::Plain => 0.0,
        NormWeight::OnePlus => 1.0,
    }
}

/// The FP8 decode GEMV's fragments hold 1 to 16 token rows (two tiles of 8).
fn check_fragment_rows(op: &'static str, rows: usize, what: &str) -> Result<(), KernelError> {
    crate::ensure_shape!(
        (1..=16).contains(&rows),
        op,
        "the decode GEMV's fragments hold 1 to 16 token rows, {what} has {rows} rows"
    );
    Ok(())
}

/// The candidate count `k` of a sampling call (1 when greedy), after checking the parameters as the CPU's
/// `sampling::candidates` does and against the GPU's limit.
fn sample_k(op: &'static str, vocab: usize, p: &SamplingParams) -> Result<usize, KernelError> {
    crate::sampling::check_params(op, p)?;
    if p.temperature == 0.0 {
        return Ok(1);
    }
    let k = crate::sampling::top_k_of(p, vocab);
    crate::ensure_shape!(
        k <= Gpu::SAMPLE_TOP_K_MAX,
        op,
        "top_k = {} over a vocabulary of {vocab} keeps {k} candidates; the GPU sampler takes at most \
         {} (top_k = 0, all, only for vocabularies up to that)",
        p.top_k,
        Gpu::SAMPLE_TOP_K_MAX
    );
    Ok(k)
}

/// Rows of an argmax or sampling call over `logits = [rows, vocab]`, `out = [rows]`.
fn check_logits(
    op: &'static str,
    logits: usize,
    vocab: usize,
    out: usize,
    max_rows: usize,
) -> Result<usize, KernelError> {
    crate::ensure_shape!(
        vocab > 0 && vocab <= I32_MAX,
        op,
        "vocab must be in 1..=i32::MAX, got {vocab}"
    );
    crate::ensure_shape!(
        out > 0 && out <= max_rows,
        op,
        "out has {out} rows, expected 1..={max_rows}"
    );
    check_len_of(op, "logits", logits, &[out, vocab])?;
    Ok(out)
}

/// Checks a RoPE call and returns the token count.
fn check_rope(
    op: &'static str,
    rope: &Rope,
    heads: usize,
    positions: usize,
    x: usize,
) -> Result<usize, KernelError> {
    rope.validate(op)?;
    crate::ensure_shape!(
        rope.rotary_dim <= Gpu::ROPE_ROTARY_DIM_MAX,
        op,
        "rotary_dim must be at most {}, got {}",
        Gpu::ROPE_ROTARY_DIM_MAX,
        rope.rotary_dim
    );
    crate::ensure_shape!(heads > 0, op, "heads must be positive");
    crate::ensure_shape!(
        heads.saturating_mul(rope.head_dim) <= I32_MAX && positions <= I32_MAX,
        op,
        "heads x head_dim and the token count must fit 32-bit indices"
    );
    check_len_of(op, "x", x, &[positions, heads, rope.head_dim])?;
    Ok(positions)
}

/// Checks a packed int4 table (an embedding, or the weights of [`Gpu::int4_weights`]) and returns `npad`.
pub(super) fn check_int4_table(
    op: &'static str,
    packed: usize,
    scales_zeros: usize,
    n: usize,
    k: usize,
    group: usize,
) -> Result<usize, KernelError> {
    crate::ensure_shape!(
        n > 0 && k > 0,
        op,
        "n and k must be positive, got n = {n}, k = {k}"
    );
    crate::ensure_shape!(
        crate::formats::INT4_GROUPS.contains(&group),
        op,
        "group must be one of {:?}, got {group}",
        crate::formats::INT4_GROUPS
    );
    let npad = n.div_ceil(64).saturating_mul(64);
    crate::ensure_shape!(
        npad <= u32::MAX as usize && k <= I32_MAX,
        op,
        "n = {n} and k = {k} must fit the kernel's 32-bit indices"
    );
    check_len_of(op, "packed", packed, &[npad / 64, k, 32])?;
    check_len_of(
        op,
        "scales_zeros",
        scales_zeros,
        &[k.div_ceil(group), npad, 2],
    )?;
    Ok(npad)
}

fn check_ids(op: &'static str, ids: usize, dim: usize, out: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        ids <= I32_MAX,
        op,
        "{ids} ids: at most i32::MAX (one block per id)"
    );
    check_len_of(op, "out", out, &[ids, dim])
}

impl Gpu {
    /// The token [`Gpu::argmax`] and [`Gpu::sample`] answer for a row they refuse (a NaN, or +inf when sampling):
    /// never a valid id, and an id [`Gpu::embedding_gather`] turns into a NaN row.
    pub const INVALID_TOKEN: u32 = u32::MAX;

    /// Largest `top_k` [`Gpu::sample`] takes: its candidates are sorted in shared memory, one per thread of a
    /// 1024-thread block.
    pub const SAMPLE_TOP_K_MAX: usize = 1024;

    /// Most rows [`Gpu::argmax`] gives to the cluster kernel (8 blocks per row); more rows take one block per row.
    /// Measured on the H200 at a 248320-wide vocabulary: 1 row, cluster 4.6 us against one block 11.7 us (torch
    /// 8.7 us); 64 rows, cluster 24.0 us against one block 18.0 us (torch 32.2 us). At 16 rows the clusters are 128
    /// blocks, one wave on 132 SMs; past that the block kernel already fills the machine with whole rows.
    pub const ARGMAX_CLUSTER_MAX_ROWS: usize = 16;

    /// Most rows [`Gpu::sample`] gives to the cluster kernel (8 blocks per row); more rows take one block per row.
    /// Measured on the H200 at a 248320-wide vocabulary, k = 20 / 1024 (`benchmarks/h200.md`): 1 row,
    /// cluster 28.5 / 36.8 us against one block 119 / 138 us (torch top-k + softmax + multinomial 104 / 120 us);
    /// 16 rows 45.5 / 58.0 against 126 / 148 us; 64 rows 104 / 125 against 153 / 171 us (torch 326 / 373 us).
    /// The cluster kernel won at every measured row count, so it serves up to the largest measured one; more
    /// rows (unmeasured) take one block per row.
    pub const SAMPLE_CLUSTER_MAX_ROWS: usize = 64;

    /// Largest `rotary_dim` of [`Gpu::rope_neox`] (the kernel's 512-entry cos/sin tables).
    pub const ROPE_ROTARY_DIM_MAX: usize = 1024;

    /// RMSNorm over rows of `weight.len()` with bf16 output: `out = bf16(x * (1 / sqrtf(mean(x^2) + eps)) * w')`,
    /// `w' = w` or `1 + w` as `form` says ([`crate::ops::rmsnorm`], the same f32 arithmetic up to the order of the
    /// sum of squares, then one bf16 rounding).
    ///
    /// `x`: fp32 `[rows, dim]`; `weight`: fp32 `[dim]` (convert a bf16 checkpoint weight once at load); `out`: bf16
    /// bits `[rows, dim]`, the activations of the next GEMV/GEMM. One block of 256 threads per row; rows of up to
    /// 8192 floats that are a multiple of 4 are read once into registers (float4), others are read twice.
    pub fn rmsnorm(
        &self,
        x: &GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.rmsnorm_any(
            "cuda::rmsnorm",
            "rmsnorm_bf16",
            x,
            None,
            weight,
            form,
            eps,
            out,
        )
    }

    /// [`Gpu::rmsnorm`] with fp32 output (no rounding: the CPU's numbers to f32 rounding of the sum).
    pub fn rmsnorm_f32(
        &self,
        x: &GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.rmsnorm_any(
            "cuda::rmsnorm_f32",
            "rmsnorm_f32",
            x,
            None,
            weight,
            form,
            eps,
            out,
        )
    }

    /// The fused residual step of a decoder layer: `residual += x` (fp32, written back), then
    /// `out = bf16(rmsnorm(residual))` as [`Gpu::rmsnorm`]. One read of `x` and `residual`, one write of each
    /// output, where the two CPU calls ([`crate::ops`] has no fused form) make a second pass.
    pub fn add_rmsnorm(
        &self,
        x: &GpuBuffer<f32>,
        residual: &mut GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.rmsnorm_any(
            "cuda::add_rmsnorm",
            "add_rmsnorm_bf16",
            x,
            Some(residual),
            weight,
            form,
            eps,
            out,
        )
    }

    /// [`Gpu::add_rmsnorm`] with fp32 output.
    pub fn add_rmsnorm_f32(
        &self,
        x: &GpuBuffer<f32>,
        residual: &mut GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.rmsnorm_any(
            "cuda::add_rmsnorm_f32",
            "add_rmsnorm_f32",
            x,
            Some(residual),
            weight,
            form,
            eps,
            out,
        )
    }

    /// [`Gpu::add_rmsnorm_f32`] that also writes its output rounded to bf16 into `out_bf16` (the bits
    /// [`Gpu::add_rmsnorm`] would write): a decoder layer's normed input for both a dense GEMV, which reads f32, and
    /// the tile GEMVs, which read bf16, without the [`Gpu::cast_f32_to_bf16`] launch between them.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_dual(
        &self,
        x: &GpuBuffer<f32>,
        residual: &mut GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<f32>,
        out_bf16: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::add_rmsnorm_dual";
        let dim = weight.len();
        let rows = check_norm(OP, x.len(), dim, eps)?;
        check_len(OP, "residual", residual.len(), x.len())?;
        check_len(OP, "out", out.len(), x.len())?;
        check_len(OP, "out_bf16", out_bf16.len(), x.len())?;
        let add = norm_add(form);
        #[cfg(feature = "cuda")]
        {
            if rows == 0 {
                return Ok(());
            }
            self.inner.rmsnorm_dual(
                &x.slice,
                &mut residual.slice,
                &weight.slice,
                add,
                eps,
                &mut out.slice,
                &mut out_bf16.slice,
                rows,
                dim,
            )
        }
        no_cuda!(self, add, rows, out, out_bf16)
    }

    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_any<T: GpuScalar>(
        &self,
        op: &'static str,
        kernel: &'static str,
        x: &GpuBuffer<f32>,
        residual: Option<&mut GpuBuffer<f32>>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<T>,
    ) -> Result<(), KernelError> {
        let dim = weight.len();
        let rows = check_norm(op, x.len(), dim, eps)?;
        check_len(op, "out", out.len(), x.len())?;
        if let Some(r) = &residual {
            check_len(op, "residual", r.len(), x.len())?;
        }
        let add = norm_add(form);
        #[cfg(feature = "cuda")]
        {
            if rows == 0 {
                return Ok(());
            }
            self.inner.rmsnorm(
                kernel,
                &x.slice,
                residual.map(|r| &mut r.slice),
                &weight.slice,
                add,
                eps,
                &mut out.slice,
                rows,
                dim,
            )
        }
        no_cuda!(self, kernel, residual, add, rows)
    }

    /// [`Gpu::rmsnorm`] (or, with `residual`, [`Gpu::add_rmsnorm`]'s `residual += x` first) of `m` token rows
    /// (`1 <= m <= 16`) written straight into the FP8 decode GEMV's activation fragments `fragments` (a buffer of
    /// at least [`Gpu::gemv_scratch_len`]`(m, dim)` words, which then records `m` and `dim`) for
    /// [`Gpu::fp8_gemv_tiles_fragments`]: the same bits as
    /// [`Gpu::rmsnorm`]'s bf16 output converted by the GEMV's own fragment kernel, one launch fewer per decode
    /// step. Why: at m = 16 that launch costs 0.8-2.1 us of a 17-26 us GEMV on the layer shapes (
    /// `benchmarks/h200.md`); the norm + GEMV step runs 1.22-1.27x faster so on the 5120-row shapes (
    /// numbers at [`Gpu::fp8_gemv_tiles_fragments`]). Launched as a programmatic dependent (it waits for the
    /// kernel before it itself). Needs `dim % 16 == 0` and `dim <= 8192`.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_fp8_fragments(
        &self,
        x: &GpuBuffer<f32>,
        residual: Option<&mut GpuBuffer<f32>>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        fragments: &mut Fp8Fragments,
    ) -> Result<(), KernelError> {
        self.rmsnorm_fragments(
            "cuda::rmsnorm_fp8_fragments",
            x,
            residual,
            weight,
            form,
            eps,
            fragments,
            None,
        )
    }

    /// [`Gpu::rmsnorm_fp8_fragments`] into the NVFP4 decode GEMV's fragments (its pair order) for
    /// [`Gpu::nvfp4_gemv_tiles_fragments`]: the same bits as [`Gpu::rmsnorm`]'s bf16 output converted by
    /// [`Gpu::nvfp4_gemv_tiles`]' own fragment kernel, one launch fewer. Measured with that GEMV (
    /// `benchmarks/h200.md`): the norm + GEMV step 1.08-1.36x faster than `rmsnorm` + `nvfp4_gemv_tiles` on the
    /// layer shapes at m = 1 and 4 (11.9 against 16.2 us on 5120x10240 at m = 1), the same on the lm_head.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_nvfp4_fragments(
        &self,
        x: &GpuBuffer<f32>,
        residual: Option<&mut GpuBuffer<f32>>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        fragments: &mut Nvfp4Fragments,
    ) -> Result<(), KernelError> {
        self.rmsnorm_fragments(
            "cuda::rmsnorm_nvfp4_fragments",
            x,
            residual,
            weight,
            form,
            eps,
            fragments,
            None,
        )
    }

    /// The norm producers' body; `zero`, if given, is zeroed whole by the same launch (the output of a GEMV that
    /// adds K splits into it: [`Gpu::rmsnorm_nvfp4_gemv`]).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn rmsnorm_fragments<O: FragmentOrder>(
        &self,
        op: &'static str,
        x: &GpuBuffer<f32>,
        residual: Option<&mut GpuBuffer<f32>>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        fragments: &mut GemvFragments<O>,
        zero: Option<&mut GpuBuffer<f32>>,
    ) -> Result<(), KernelError> {
        let dim = weight.len();
        let rows = check_norm(op, x.len(), dim, eps)?;
        check_fragment_rows(op, rows, "x")?;
        crate::ensure_shape!(
            dim.is_multiple_of(16) && dim <= 8192,
            op,
            "dim must be a multiple of 16 and at most 8192 (the kernel's vector path), got {dim}"
        );
        if let Some(r) = &residual {
            check_len(op, "residual", r.len(), x.len())?;
        }
        let add = norm_add(form);
        let fragments = fragments.for_write(op, rows, dim)?;
        #[cfg(feature = "cuda")]
        {
            let name = O::KERNELS[usize::from(residual.is_some())];
            self.inner.rmsnorm_fragments(
                name,
                &x.slice,
                residual.map(|r| &mut r.slice),
                &weight.slice,
                add,
                eps,
                &mut fragments.slice,
                zero.map(|z| &mut z.slice),
                rows,
                dim,
            )
        }
        no_cuda!(self, residual, add, fragments, zero, rows)
    }

    /// `out = bf16(silu(gate) * up)` over rows of `gate_up` (fp32 `[rows, 2*inter]`, gate half first, as
    /// [`crate::ops::silu_and_mul`]); `out`: bf16 bits `[rows, inter]`, the down projection's activations.
    /// `silu(g) = g / (1 + expf(-g))` in f32 as the CPU's scalar path. Four outputs per thread (float4 loads when
    /// `inter % 4 == 0`).
    pub fn silu_and_mul(
        &self,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.glu("cuda::silu_and_mul", false, gate_up, inter, out)
    }

    /// `out = bf16(gelu_erf(gate) * up)`, as [`Gpu::silu_and_mul`] with `0.5 g (1 + erff(g / sqrt 2))` (the exact
    /// erf form of [`crate::ops::gelu_and_mul`]).
    pub fn gelu_and_mul(
        &self,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.glu("cuda::gelu_and_mul", true, gate_up, inter, out)
    }

    /// [`Gpu::silu_and_mul`] of `m = gate_up.len() / (2 * inter)` token rows (`1 <= m <= 16`) written straight
    /// into the FP8 decode GEMV's activation fragments `fragments` (at least [`Gpu::gemv_scratch_len`]`(m, inter)`
    /// words; records `m` and `inter`) for [`Gpu::fp8_gemv_tiles_fragments`]: the same bits as the bf16 output
    /// converted by the GEMV's own fragment kernel, one launch fewer before the down projection (as
    /// [`Gpu::rmsnorm_fp8_fragments`] before the others; at m = 16 on 5120x17408 that launch is 2.1 of 25.7 us,
    /// measured on the H200). Launched as a programmatic dependent. Needs `inter % 16 == 0`.
    pub fn silu_and_mul_fp8_fragments(
        &self,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        fragments: &mut Fp8Fragments,
    ) -> Result<(), KernelError> {
        self.glu_fragments(
            "cuda::silu_and_mul_fp8_fragments",
            false,
            gate_up,
            inter,
            fragments,
            None,
        )
    }

    /// [`Gpu::silu_and_mul_fp8_fragments`] with [`Gpu::gelu_and_mul`]'s activation.
    pub fn gelu_and_mul_fp8_fragments(
        &self,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        fragments: &mut Fp8Fragments,
    ) -> Result<(), KernelError> {
        self.glu_fragments(
            "cuda::gelu_and_mul_fp8_fragments",
            true,
            gate_up,
            inter,
            fragments,
            None,
        )
    }

    /// [`Gpu::silu_and_mul_fp8_fragments`] into the NVFP4 decode GEMV's fragments for
    /// [`Gpu::nvfp4_gemv_tiles_fragments`] (the same bits as [`Gpu::silu_and_mul`]'s output converted by
    /// [`Gpu::nvfp4_gemv_tiles`]' fragment kernel): the down projection's activations without that launch, 1.10-1.17x
    /// on the layer shapes at m = 1. Needs `inter % 16 == 0` (the GEMV then needs `inter % 32 == 0`).
    pub fn silu_and_mul_nvfp4_fragments(
        &self,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        fragments: &mut Nvfp4Fragments,
    ) -> Result<(), KernelError> {
        self.glu_fragments(
            "cuda::silu_and_mul_nvfp4_fragments",
            false,
            gate_up,
            inter,
            fragments,
            None,
        )
    }

    /// [`Gpu::silu_and_mul_nvfp4_fragments`] with [`Gpu::gelu_and_mul`]'s activation.
    pub fn gelu_and_mul_nvfp4_fragments(
        &self,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        fragments: &mut Nvfp4Fragments,
    ) -> Result<(), KernelError> {
        self.glu_fragments(
            "cuda::gelu_and_mul_nvfp4_fragments",
            true,
            gate_up,
            inter,
            fragments,
            None,
        )
    }

    /// The gated-activation producers' body; `zero` as `Gpu::rmsnorm_fragments`'.
    pub(in crate::cuda) fn glu_fragments<O: FragmentOrder>(
        &self,
        op: &'static str,
        gelu: bool,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        fragments: &mut GemvFragments<O>,
        zero: Option<&mut GpuBuffer<f32>>,
    ) -> Result<(), KernelError> {
        let rows = check_glu(op, gate_up.len(), inter)?;
        check_fragment_rows(op, rows, "gate_up")?;
        crate::ensure_shape!(
            inter.is_multiple_of(16),
            op,
            "inter must be a multiple of 16 (the {} GEMV's k), got {inter}",
            O::FORMAT
        );
        let fragments = fragments.for_write(op, rows, inter)?;
        #[cfg(feature = "cuda")]
        {
            let name = O::KERNELS[2 + usize::from(gelu)];
            self.inner.glu_fragments(
                name,
                &gate_up.slice,
                &mut fragments.slice,
                zero.map(|z| &mut z.slice),
                rows,
                inter,
            )
        }
        no_cuda!(self, gelu, fragments, zero, rows)
    }

    /// `x` (fp32 `[m, k]`, `1 <= m <= 16`) written straight into the FP8 decode GEMV's activation fragments
    /// `fragments` (at least [`Gpu::gemv_scratch_len`]`(m, k)` words; records `m` and `k`) for
    /// [`Gpu::fp8_gemv_tiles_fragments`]: the same bits as [`Gpu::cast_f32_to_bf16`] converted by the GEMV's own
    /// fragment kernel, one launch fewer for a linear whose input no fused producer writes. Launched as a
    /// programmatic dependent. Needs `k % 16 == 0`.
    pub fn cast_fp8_fragments(
        &self,
        x: &GpuBuffer<f32>,
        k: usize,
        fragments: &mut Fp8Fragments,
    ) -> Result<(), KernelError> {
        self.cast_fragments("cuda::cast_fp8_fragments", x, k, fragments, None)
    }

    /// [`Gpu::cast_fp8_fragments`] into the NVFP4 decode GEMV's fragments for
    /// [`Gpu::nvfp4_gemv_tiles_fragments`]: the same bits as [`Gpu::cast_f32_to_bf16`] converted by
    /// [`Gpu::nvfp4_gemv_tiles`]' fragment kernel (the GEMV then needs `k % 32 == 0`).
    pub fn cast_nvfp4_fragments(
        &self,
        x: &GpuBuffer<f32>,
        k: usize,
        fragments: &mut Nvfp4Fragments,
    ) -> Result<(), KernelError> {
        self.cast_fragments("cuda::cast_nvfp4_fragments", x, k, fragments, None)
    }

    /// The cast producers' body; `zero` as `Gpu::rmsnorm_fragments`'.
    pub(in crate::cuda) fn cast_fragments<O: FragmentOrder>(
        &self,
        op: &'static str,
        x: &GpuBuffer<f32>,
        k: usize,
        fragments: &mut GemvFragments<O>,
        zero: Option<&mut GpuBuffer<f32>>,
    ) -> Result<(), KernelError> {
        crate::ensure_shape!(
            k > 0 && k.is_multiple_of(16),
            op,
            "k must be a positive multiple of 16 (the {} GEMV's fragments), got {k}",
            O::FORMAT
        );
        // The grid's y covers k rounded up to 128-value chunks, 1024 values per block.
        crate::ensure_shape!(
            k <= 65535 * 1024,
            op,
            "k = {k} is past the kernel's grid (at most 65535 * 1024)"
        );
        crate::ensure_shape!(
            x.len().is_multiple_of(k),
            op,
            "x has {} elements, not a whole number of rows of k = {k}",
            x.len()
        );
        let rows = x.len() / k;
        check_fragment_rows(op, rows, "x")?;
        let fragments = fragments.for_write(op, rows, k)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.cast_fragments(
                O::KERNELS[4],
                &x.slice,
                &mut fragments.slice,
                zero.map(|z| &mut z.slice),
                rows,
                k,
            )
        }
        no_cuda!(self, fragments, zero, rows)
    }

    fn glu(
        &self,
        op: &'static str,
        gelu: bool,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        let rows = check_glu(op, gate_up.len(), inter)?;
        check_len_of(op, "out", out.len(), &[rows, inter])?;
        #[cfg(feature = "cuda")]
        {
            if rows == 0 {
                return Ok(());
            }
            self.inner
                .glu(gelu, &gate_up.slice, &mut out.slice, rows, inter)
        }
        no_cuda!(self, gelu)
    }

    /// Embedding gather from a bf16 table: `out[i] = f32(table[ids[i]])` (exact), as
    /// [`crate::ops::embedding_gather`] with [`crate::ops::EmbeddingTable::Bf16`].
    ///
    /// `table`: bf16 bits `[vocab, dim]`; `ids`: `[n]` on the device; `out`: fp32 `[n, dim]`. An id `>= vocab`
    /// cannot be refused before the launch (it is on the device): its row of `out` is filled with NaN and the table
    /// is not read for it. One block of 128 threads per id, 16-byte loads when `dim % 8 == 0`, up to eight of them
    /// in flight per thread (a whole row of up to 8192 values is requested before the first store).
    pub fn embedding_gather(
        &self,
        table: &GpuBuffer<u16>,
        dim: usize,
        ids: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::embedding_gather";
        crate::ensure_shape!(
            dim > 0 && dim <= I32_MAX,
            OP,
            "dim must be in 1..=i32::MAX, got {dim}"
        );
        crate::ensure_shape!(
            table.len().is_multiple_of(dim),
            OP,
            "table has {} elements, not a whole number of rows of {dim}",
            table.len()
        );
        let vocab = table.len() / dim;
        crate::ensure_shape!(
            vocab > 0 && vocab <= u32::MAX as usize,
            OP,
            "the table must have 1..=u32::MAX rows, got {vocab}"
        );
        check_ids(OP, ids.len(), dim, out.len())?;
        #[cfg(feature = "cuda")]
        {
            if ids.is_empty() {
                return Ok(());
            }
            self.inner
                .embedding_gather_bf16(&table.slice, &ids.slice, &mut out.slice, vocab, dim)
        }
        no_cuda!(self)
    }

    /// Embedding gather from a packed int4 table in the tinygemm layout of [`crate::linear::Int4Weights`] (its
    /// `packed()` and `scales_zeros()` uploaded as they are): `out[i][c] = (code - 8) * scale + zero` of row
    /// `ids[i]`, bit for bit `Int4Weights::gather_rows`.
    ///
    /// `packed`: `[ceil(n/64)][k][32]` bytes; `scales_zeros`: bf16 bits `[ceil(k/group)][npad][2]`; `n` rows
    /// (the vocabulary) of `k` values (the hidden size); `ids`: `[m]`; `out`: fp32 `[m, k]`. Ids `>= n` give NaN
    /// rows, as [`Gpu::embedding_gather`]. Slow by construction: a row's codes are one byte in every 32, so each
    /// read sector serves one byte; a gather-friendly copy of the table (bf16 or row-major int4) is the fast path.
    #[allow(clippy::too_many_arguments)]
    pub fn embedding_gather_int4(
        &self,
        packed: &GpuBuffer<u8>,
        scales_zeros: &GpuBuffer<u16>,
        n: usize,
        k: usize,
        group: usize,
        ids: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::embedding_gather_int4";
        check_int4_table(OP, packed.len(), scales_zeros.len(), n, k, group)?;
        check_ids(OP, ids.len(), k, out.len())?;
        #[cfg(feature = "cuda")]
        {
            if ids.is_empty() {
                return Ok(());
            }
            self.inner.embedding_gather_int4(
                &packed.slice,
                &scales_zeros.slice,
                &ids.slice,
                &mut out.slice,
                n,
                k,
                group,
            )
        }
        no_cuda!(self)
    }

    /// Argmax per row, as [`crate::ops::argmax`]: the index of the largest value, the first one on ties (an all
    /// `-inf` row answers 0); a row holding a NaN answers [`Gpu::INVALID_TOKEN`] (the CPU refuses it).
    ///
    /// `logits`: fp32 `[rows, vocab]`; `out`: `[rows]` (`rows = out.len()`, 1..=65535). Picks the kernel by the
    /// row count ([`Gpu::argmax_with`]): up to [`Gpu::ARGMAX_CLUSTER_MAX_ROWS`] rows a cluster of 8 blocks of 1024
    /// threads per row, combined through distributed shared memory in the same launch; more rows one block each.
    pub fn argmax(
        &self,
        logits: &GpuBuffer<f32>,
        vocab: usize,
        out: &mut GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        let cluster = out.len() <= Self::ARGMAX_CLUSTER_MAX_ROWS;
        self.argmax_with(cluster, logits, vocab, out)
    }

    lab_pub! {
    /// [`Gpu::argmax`] on a chosen kernel: `cluster` 8 blocks per row (sm_90 thread-block clusters), or one block
    /// per row (tests and benchmarks drive both).
    fn argmax_with(
        &self,
        cluster: bool,
        logits: &GpuBuffer<f32>,
        vocab: usize,
        out: &mut GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::argmax";
        let rows = check_logits(OP, logits.len(), vocab, out.len(), 65535)?;
        #[cfg(feature = "cuda")]
        {
            self.inner
                .argmax(cluster, &logits.slice, &mut out.slice, rows, vocab)
        }
        no_cuda!(self, cluster, rows)
    }
    }

    /// The device words of a [`crate::sampling::Pcg32`] seeded with `(seed, stream)`, for the `rng` buffer of
    /// [`Gpu::sample`]: `[state lo, state hi, inc lo, inc hi]`, seeded exactly as `Pcg32::new` (so the GPU and
    /// the CPU draw the same numbers).
    pub fn pcg32_words(seed: u64, stream: u64) -> [u32; 4] {
        const MULT: u64 = 6_364_136_223_846_793_005;
        let inc = (stream << 1) | 1;
        // pcg32_srandom_r: state = 0, step, state += seed, step (a step's output is discarded).
        let mut state = 0u64.wrapping_mul(MULT).wrapping_add(inc);
        state = state.wrapping_add(seed);
        state = state.wrapping_mul(MULT).wrapping_add(inc);
        [
            state as u32,
            (state >> 32) as u32,
            inc as u32,
            (inc >> 32) as u32,
        ]
    }

    /// Whether [`Gpu::sample`] takes `params` over a vocabulary of `vocab` (valid parameters leaving at most
    /// [`Gpu::SAMPLE_TOP_K_MAX`] candidates), so a caller can draw the other rows on the host instead.
    pub fn can_sample(vocab: usize, params: &SamplingParams) -> bool {
        vocab > 0 && sample_k("cuda::sample", vocab, params).is_ok()
    }

    /// Draws one token per row from `logits` under `params`, as [`crate::sampling::sample`] does: temperature,
    /// `top_k` largest (lower id first on ties), softmax, smallest prefix reaching `top_p`, renormalise, draw with
    /// the row's PCG32; greedy (temperature 0) and single-candidate rows do not advance the generator. With the
    /// same seed the GPU draws the same token as the CPU (the probabilities are the same f64 numbers up to the
    /// order of their sums, so only a draw within ~1e-16 of a boundary could differ).
    ///
    /// `logits`: fp32 `[rows, vocab]`; `rng`: `[rows, 4]` generator words (one generator per row, e.g. per
    /// request; start them with [`Gpu::pcg32_words`]), advanced in place; `out`: `[rows]` tokens, or
    /// [`Gpu::INVALID_TOKEN`] for a row with a NaN or +inf logit (the CPU refuses those; the generator is not
    /// advanced). One `params` for the call. `top_k` must leave at most [`Gpu::SAMPLE_TOP_K_MAX`] candidates: `top_k = 0`
    /// (all) is refused for vocabularies above that, since an exact draw in the CPU's order over the whole
    /// vocabulary needs a full sort. A 4-pass radix select of the k-th logit, the candidates sorted in shared
    /// memory, f64 probabilities; up to [`Gpu::SAMPLE_CLUSTER_MAX_ROWS`] rows each row is shared by a cluster of 8
    /// blocks of 1024 threads (histograms summed through distributed shared memory), more rows take one block
    /// each ([`Gpu::sample_with`] picks explicitly).
    pub fn sample(
        &self,
        logits: &GpuBuffer<f32>,
        vocab: usize,
        params: &SamplingParams,
        rng: &mut GpuBuffer<u32>,
        out: &mut GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        let cluster = out.len() <= Self::SAMPLE_CLUSTER_MAX_ROWS;
        self.sample_with(cluster, logits, vocab, params, rng, out)
    }

    lab_pub! {
    /// [`Gpu::sample`] on a chosen kernel (tests and benchmarks drive both): `cluster` 8 blocks per row (sm_90
    /// thread-block clusters; at most 65535 rows), or one block per row. Both draw the same tokens.
    fn sample_with(
        &self,
        cluster: bool,
        logits: &GpuBuffer<f32>,
        vocab: usize,
        params: &SamplingParams,
        rng: &mut GpuBuffer<u32>,
        out: &mut GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::sample";
        let max_rows = if cluster { 65535 } else { I32_MAX };
        let rows = check_logits(OP, logits.len(), vocab, out.len(), max_rows)?;
        let k = sample_k(OP, vocab, params)?;
        check_len_of(OP, "rng", rng.len(), &[rows, 4])?;
        #[cfg(feature = "cuda")]
        {
            self.inner.sample(
                cluster,
                &logits.slice,
                &mut rng.slice,
                &mut out.slice,
                rows,
                vocab,
                k,
                params.temperature,
                params.top_p,
            )
        }
        no_cuda!(self, k, cluster)
    }
    }

    /// Neox RoPE in place on `x` (fp32 `[tokens, heads, head_dim]`), token `i` at `positions[i]` (device `[tokens]`),
    /// as [`crate::attention::rope_neox`]: the same f32 inverse frequencies and angles, cos and sin computed in f64
    /// and rounded to f32, dims past `rotary_dim` untouched. Call it once for q and once for k (their head counts
    /// differ). Needs `rotary_dim <= 1024` ([`Gpu::ROPE_ROTARY_DIM_MAX`]).
    pub fn rope_neox(
        &self,
        rope: &Rope,
        heads: usize,
        positions: &GpuBuffer<u32>,
        x: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::rope_neox";
        let tokens = check_rope(OP, rope, heads, positions.len(), x.len())?;
        #[cfg(feature = "cuda")]
        {
            if tokens == 0 {
                return Ok(());
            }
            self.inner.rope_neox(
                &mut x.slice,
                &positions.slice,
                rope.theta,
                tokens,
                heads,
                rope.head_dim,
                rope.rotary_dim,
            )
        }
        no_cuda!(self, tokens)
    }
}

/// The grid of the row-wise ops (`sigmoid_head_gate_f32`, `add_bias_rows_f32`): `cols` on grid.x, whole blocks of
/// 256, so at most i32::MAX columns.
fn check_row_cols(op: &'static str, what: &str, cols: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        cols <= I32_MAX,
        op,
        "{what} = {cols} must fit the kernel's 32-bit column index"
    );
    Ok(())
}

/// The last element a [`Gpu::copy_cols`] side touches, `(rows - 1) * cols + off + width`, must be inside `len`.
fn check_copy_side(
    op: &'static str,
    name: &str,
    len: usize,
    cols: usize,
    off: usize,
    rows: usize,
    width: usize,
) -> Result<(), KernelError> {
    let end = (rows - 1)
        .checked_mul(cols)
        .and_then(|a| a.checked_add(off))
        .and_then(|a| a.checked_add(width));
    match end {
        Some(end) if end <= len => Ok(()),
        Some(end) => Err(KernelError::shape(
            op,
            format!(
                "{name} has {len} elements; {rows} rows of {name}_cols = {cols} from {name}_off = {off}, {width} \
                 wide, end at {end}"
            ),
        )),
        None => Err(KernelError::shape(
            op,
            format!("the extent of {name} ((rows - 1) * {name}_cols + {name}_off + width) overflows usize"),
        )),
    }
}

/// f32 elementwise ops of the engine's exact path (activations kept in f32 device buffers): casts, the gated
/// activations with f32 output, the sigmoid gates, the softcap, in-place adds and scales, bias rows and strided
/// column copies. Each is one memory-bound pass; lengths are checked here, an empty buffer launches nothing.
impl Gpu {
    /// `out = bf16(x)` element-wise: f32 `x` to bf16 bits `out` of the same length, rounded to nearest even, bit
    /// for bit [`crate::formats::f32_to_bf16`] (NaN stays a quiet NaN with its sign).
    pub fn cast_f32_to_bf16(
        &self,
        x: &GpuBuffer<f32>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        check_len("cuda::cast_f32_to_bf16", "out", out.len(), x.len())?;
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner
                .cast("cast_f32_to_bf16", &x.slice, &mut out.slice)
        }
        no_cuda!(self)
    }

    /// `out = f32(x)` element-wise: bf16 bits `x` widened exactly to f32 `out` of the same length.
    pub fn cast_bf16_to_f32(
        &self,
        x: &GpuBuffer<u16>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        check_len("cuda::cast_bf16_to_f32", "out", out.len(), x.len())?;
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner
                .cast("cast_bf16_to_f32", &x.slice, &mut out.slice)
        }
        no_cuda!(self)
    }

    /// `out[r, i] = act(gate_up[r, i]) * gate_up[r, inter + i]`: `gate_up` f32 `[rows, 2*inter]` (gate first),
    /// `out` f32 `[rows, inter]`, the activation [`crate::ops::act_and_mul`] computes for `act` (SiLU
    /// `g / (1 + expf(-g))`, GELU `0.5 g (1 + erff(g / sqrt 2))`, GELU tanh
    /// `0.5 g (1 + tanhf(sqrt(2/pi) (g + 0.044715 g^3)))`), in f32 with CUDA's accurate `expf` / `erff` / `tanhf`.
    pub fn act_and_mul_f32(
        &self,
        act: crate::shapes::GatedAct,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::act_and_mul_f32";
        let rows = check_glu(OP, gate_up.len(), inter)?;
        check_len_of(OP, "out", out.len(), &[rows, inter])?;
        #[cfg(feature = "cuda")]
        {
            if rows == 0 {
                return Ok(());
            }
            self.inner
                .act_and_mul_f32(act, &gate_up.slice, &mut out.slice, rows, inter)
        }
        no_cuda!(self, act)
    }

    /// `x *= sigmoid(gate)` element-wise (`x`, `gate` f32 of the same length; sigmoid `1 / (1 + expf(-g))`):
    /// [`crate::backend::sigmoid_gate`], Qwen3.5's per-element attention output gate.
    pub fn sigmoid_gate(
        &self,
        x: &mut GpuBuffer<f32>,
        gate: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        check_len("cuda::sigmoid_gate", "gate", gate.len(), x.len())?;
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner
                .ew_binary("sigmoid_gate_f32", &mut x.slice, &gate.slice)
        }
        no_cuda!(self)
    }

    /// `out = bf16(x * sigmoid(gate))` element-wise: [`Gpu::sigmoid_gate`] and [`Gpu::cast_f32_to_bf16`] in one
    /// launch (the same bits), for a gated attention output that a tile GEMV reads next.
    pub fn sigmoid_gate_bf16(
        &self,
        x: &GpuBuffer<f32>,
        gate: &GpuBuffer<f32>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        check_len("cuda::sigmoid_gate_bf16", "gate", gate.len(), x.len())?;
        check_len("cuda::sigmoid_gate_bf16", "out", out.len(), x.len())?;
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner
                .sigmoid_gate_bf16(&x.slice, &gate.slice, &mut out.slice)
        }
        no_cuda!(self)
    }

    /// `x[r, h, :] *= sigmoid(gate[r, h])`: `x` f32 `[rows, heads, d]`, `gate` f32 `[rows, heads]` (`d` and `rows`
    /// follow from the lengths): [`crate::backend::sigmoid_head_gate`], Spark's per-head output gate. Needs
    /// `heads >= 1`, a non-empty `gate` of whole rows of `heads`, and `x` a positive multiple of it.
    pub fn sigmoid_head_gate(
        &self,
        x: &mut GpuBuffer<f32>,
        heads: usize,
        gate: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::sigmoid_head_gate";
        let (xl, gl) = (x.len(), gate.len());
        crate::ensure_shape!(
            heads > 0 && gl > 0 && gl.is_multiple_of(heads) && xl.is_multiple_of(gl) && xl > 0,
            OP,
            "x has {xl} elements and gate {gl} for {heads} heads: gate must be whole rows of heads and x a \
             positive multiple of it"
        );
        let d = xl / gl;
        check_row_cols(OP, "head dim", d)?;
        #[cfg(feature = "cuda")]
        {
            self.inner
                .ew_rows("sigmoid_head_gate_f32", &mut x.slice, &gate.slice, gl, d)
        }
        no_cuda!(self)
    }

    /// `x = cap * tanhf(x / cap)` element-wise (Gemma's logit and attention softcap), as
    /// [`crate::backend::softcap`]. Needs a finite `cap > 0`.
    pub fn softcap(&self, x: &mut GpuBuffer<f32>, cap: f32) -> Result<(), KernelError> {
        crate::ensure_shape!(
            cap.is_finite() && cap > 0.0,
            "cuda::softcap",
            "cap must be finite and positive, got {cap}"
        );
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner.ew_scalar("softcap_f32", &mut x.slice, cap)
        }
        no_cuda!(self, x)
    }

    /// `x += y` element-wise (f32, the same length): the residual add.
    pub fn add_assign(
        &self,
        x: &mut GpuBuffer<f32>,
        y: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        check_len("cuda::add_assign", "y", y.len(), x.len())?;
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner
                .ew_binary("add_assign_f32", &mut x.slice, &y.slice)
        }
        no_cuda!(self)
    }

    /// `x *= s` element-wise (f32; any `s`, a non-finite one propagates as in IEEE arithmetic).
    pub fn scale_assign(&self, x: &mut GpuBuffer<f32>, s: f32) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            if x.is_empty() {
                return Ok(());
            }
            self.inner.ew_scalar("scale_assign_f32", &mut x.slice, s)
        }
        no_cuda!(self, x, s)
    }

    /// `x[r, :] += bias` for every row: `x` f32 `[rows, n]`, `bias` f32 `[n]` (`rows` follows from the lengths;
    /// `bias` non-empty, `x` whole rows of it).
    pub fn add_bias_rows(
        &self,
        x: &mut GpuBuffer<f32>,
        bias: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::add_bias_rows";
        let (xl, n) = (x.len(), bias.len());
        crate::ensure_shape!(n > 0, OP, "bias must not be empty");
        crate::ensure_shape!(
            xl.is_multiple_of(n),
            OP,
            "x has {xl} elements, not a whole number of rows of {n}"
        );
        check_row_cols(OP, "n", n)?;
        #[cfg(feature = "cuda")]
        {
            if xl == 0 {
                return Ok(());
            }
            self.inner
                .ew_rows("add_bias_rows_f32", &mut x.slice, &bias.slice, xl / n, n)
        }
        no_cuda!(self)
    }

    /// `dst[r*dst_cols + dst_off + c] = src[r*src_cols + src_off + c]` for `r < rows`, `c < width` (f32): splits a
    /// fused projection's columns (`src_cols` the fused width, `src_off` the part's first column), gathers a
    /// contiguous run of rows (`src_off = first_row * src_cols`), or copies one slot's state block (`rows = 1`,
    /// the offsets the slots' starts). Needs `rows >= 1` and `width >= 1`, `width <= dst_cols` when `rows > 1`
    /// (two rows never write the same element), and on each side `(rows - 1) * cols + off + width <= len`
    /// (checked arithmetic).
    #[allow(clippy::too_many_arguments)]
    pub fn copy_cols(
        &self,
        src: &GpuBuffer<f32>,
        src_cols: usize,
        src_off: usize,
        dst: &mut GpuBuffer<f32>,
        dst_cols: usize,
        dst_off: usize,
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::copy_cols";
        crate::ensure_shape!(
            rows > 0 && width > 0,
            OP,
            "rows and width must be positive, got rows = {rows}, width = {width}"
        );
        crate::ensure_shape!(
            rows == 1 || width <= dst_cols,
            OP,
            "width = {width} is more than dst_cols = {dst_cols}: rows would overlap in dst"
        );
        check_copy_side(OP, "src", src.len(), src_cols, src_off, rows, width)?;
        check_copy_side(OP, "dst", dst.len(), dst_cols, dst_off, rows, width)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.copy_cols(
                &src.slice,
                src_cols,
                src_off,
                &mut dst.slice,
                dst_cols,
                dst_off,
                rows,
                width,
            )
        }
        no_cuda!(self)
    }
}

/// Threads of the norm blocks (`NORM_THREADS` in cuda/ops.cu).
#[cfg(feature = "cuda")]
const NORM_THREADS: u32 = 256;
/// Threads of the gated-activation blocks, each doing four outputs (`GLU_THREADS`).
#[cfg(feature = "cuda")]
const GLU_THREADS: u32 = 256;
/// Threads of the gather blocks (`GATHER_THREADS`).
#[cfg(feature = "cuda")]
const GATHER_THREADS: u32 = 128;
/// Threads of the argmax and sampling blocks (`ARGMAX_THREADS`, `SAMPLE_THREADS`).
#[cfg(feature = "cuda")]
const ROW_THREADS: u32 = 1024;
/// Blocks of one argmax cluster (`ARGMAX_CLUSTER`, the kernel's `__cluster_dims__`).
#[cfg(feature = "cuda")]
const ARGMAX_CLUSTER: u32 = 8;
/// Blocks of one sampling cluster (`SAMPLE_CLUSTER`, the kernel's `__cluster_dims__`).
#[cfg(feature = "cuda")]
const SAMPLE_CLUSTER: u32 = 8;
/// Threads of the f32 elementwise blocks (`EW_THREADS`).
#[cfg(feature = "cuda")]
const EW_THREADS: u32 = 256;
/// Most blocks of a grid-stride elementwise launch (flat ops, and `copy_cols`' columns).
#[cfg(feature = "cuda")]
const EW_MAX_BLOCKS: usize = 4096;
/// Most blocks along grid.y of the row-wise ops (the hardware's limit); more rows are strided.
#[cfg(feature = "cuda")]
const EW_MAX_ROWS: usize = 65535;

/// The flat elementwise ops' grid over `n` elements: one thread per float4 of the vector part (at least one block,
/// which also covers a tail of up to 3), at most EW_MAX_BLOCKS blocks (the kernels stride).
#[cfg(feature = "cuda")]
fn flat_config(n: usize) -> LaunchConfig {
    let blocks = (n / 4)
        .div_ceil(EW_THREADS as usize)
        .clamp(1, EW_MAX_BLOCKS);
    launch_config((blocks as u32, 1, 1), (EW_THREADS, 1, 1), 0)
}

#[cfg(feature = "cuda")]
fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    launch_config((rows as u32, 1, 1), (threads, 1, 1), 0)
}

/// The gated activations' grid: a block of GLU_THREADS threads per row and 4 * GLU_THREADS of its `width` outputs.
#[cfg(feature = "cuda")]
fn glu_config(rows: usize, width: usize) -> LaunchConfig {
    let grid = (
        rows as u32,
        width.div_ceil(4 * GLU_THREADS as usize) as u32,
        1,
    );
    launch_config(grid, (GLU_THREADS, 1, 1), 0)
}

/// The launches of the ops above: each entry point has checked every length, count and parameter before its launch
/// runs, and each launch states what its kernel relies on.
#[cfg(feature = "cuda")]
impl Device {
    /// `name`: `rmsnorm_frag_{fp8,nvfp4}` (`residual` `None`) or `add_rmsnorm_frag_*`: one block per token row,
    /// writing a decode GEMV's activation fragments, and zeroing `zero` whole if given.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_fragments(
        &self,
        name: &'static str,
        x: &CudaSlice<f32>,
        residual: Option<&mut CudaSlice<f32>>,
        w: &CudaSlice<f32>,
        add: f32,
        eps: f32,
        xf: &mut CudaSlice<u32>,
        zero: Option<&mut CudaSlice<f32>>,
        rows: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let (xp, _gx) = self.addr(x);
        let (wp, _gw) = self.addr(w);
        let (fp, _gf) = self.addr_mut(xf);
        let mut args = PdlArgs::default();
        args.ptr(xp);
        let _gr = residual.map(|r| {
            let (rp, g) = self.addr_mut(r);
            args.ptr(rp);
            g
        });
        args.ptr(wp).f32(add).f32(eps).ptr(fp).i32(dim as i32);
        let _gz = self.zero_args(&mut args, zero);
        // SAFETY: matches `rmsnorm_frag_{fp8,nvfp4}(x, w, add, eps, xf, dim, y, ylen)` / `add_rmsnorm_frag_*(x,
        // residual, w, add, eps, xf, dim, y, ylen)` in cuda/ops.cu (the caller picks the name by the residual's
        // presence); the caller checked x and residual = [rows, dim], w = [dim], 1 <= rows <= 16 (one block per
        // token; the kernel takes 8 tokens per fragment tile from gridDim.x), dim % 16 == 0 and dim <= 8192 (the
        // kernel's float4 path, the only one that writes fragments), and xf of at least ceil(dim/128) * nt * 512
        // words (Gpu::gemv_scratch_len), every entry the kernel writes; (y, ylen) is a whole allocation and its
        // length (zero_args) or (null, 0); as a programmatic dependent it touches memory only after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, per_row(rows, NORM_THREADS), &mut args) }
    }

    /// The producers' last two arguments: `zero`'s pointer and length (a whole allocation, so 256-byte aligned as
    /// `zero_f32` in cuda/common.cuh needs), or (null, 0). Returns the pointer's guard, to hold until the launch.
    fn zero_args<'a>(
        &'a self,
        args: &mut PdlArgs,
        zero: Option<&'a mut CudaSlice<f32>>,
    ) -> Option<cudarc::driver::SyncOnDrop<'a>> {
        match zero {
            Some(z) => {
                let len = z.len() as u64;
                let (zp, g) = self.addr_mut(z);
                args.ptr(zp).u64(len);
                Some(g)
            }
            None => {
                args.ptr(0).u64(0);
                None
            }
        }
    }

    /// `rmsnorm_bf16` / `rmsnorm_f32` (`residual` `None`) or `add_rmsnorm_*` (`Some`): one block per row.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm<T: GpuScalar>(
        &self,
        name: &'static str,
        x: &CudaSlice<f32>,
        residual: Option<&mut CudaSlice<f32>>,
        w: &CudaSlice<f32>,
        add: f32,
        eps: f32,
        out: &mut CudaSlice<T>,
        rows: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let (xp, _gx) = self.addr(x);
        let (wp, _gw) = self.addr(w);
        let (op, _go) = self.addr_mut(out);
        let mut args = PdlArgs::default();
        args.ptr(xp);
        let _gr = residual.map(|r| {
            let (rp, g) = self.addr_mut(r);
            args.ptr(rp);
            g
        });
        args.ptr(wp).f32(add).f32(eps).ptr(op).i32(dim as i32);
        // SAFETY: matches `rmsnorm_*` / `add_rmsnorm_*` in cuda/ops.cu (the caller picks the name from the output
        // type and the residual's presence); the caller checked x, residual and out = [rows, dim], w = [dim],
        // 1 <= rows <= i32::MAX (one block per row) and dim <= i32::MAX; the kernels' float4 path is taken only when
        // dim % 4 == 0, which keeps every row 16-byte aligned in these 256-byte-aligned allocations; safe as
        // launch_small's dependent (rmsnorm_row_to's pdl_start first).
        unsafe { self.launch_small(name, &f, per_row(rows, NORM_THREADS), &mut args) }
    }

    /// `add_rmsnorm_dual`: one block per row, writing the f32 output and its bf16 copy.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_dual(
        &self,
        x: &CudaSlice<f32>,
        residual: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        add: f32,
        eps: f32,
        out: &mut CudaSlice<f32>,
        out_b: &mut CudaSlice<u16>,
        rows: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "add_rmsnorm_dual";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = self.addr(x);
        let (rp, _gr) = self.addr_mut(residual);
        let (wp, _gw) = self.addr(w);
        let (op, _go) = self.addr_mut(out);
        let (bp, _gb) = self.addr_mut(out_b);
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(rp)
            .ptr(wp)
            .f32(add)
            .f32(eps)
            .ptr(op)
            .ptr(bp)
            .i32(dim as i32);
        // SAFETY: matches `add_rmsnorm_dual(x, residual, w, add, eps, out, out_b, dim)` in cuda/ops.cu; the caller
        // checked x, residual, out and out_b = [rows, dim], w = [dim], 1 <= rows <= i32::MAX (one block per row) and
        // dim <= i32::MAX; the float4 path is taken only when dim % 4 == 0, which keeps every row of both outputs
        // aligned in these 256-byte-aligned allocations; safe as launch_small's dependent (pdl_start first).
        unsafe { self.launch_small(NAME, &f, per_row(rows, NORM_THREADS), &mut args) }
    }

    /// `sigmoid_gate_bf16`: the flat grid over x.len().
    fn sigmoid_gate_bf16(
        &self,
        x: &CudaSlice<f32>,
        gate: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
    ) -> Result<(), KernelError> {
        const NAME: &str = "sigmoid_gate_bf16";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = self.addr(x);
        let (gp, _gg) = self.addr(gate);
        let (op, _go) = self.addr_mut(out);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(gp).ptr(op).u64(x.len() as u64);
        // SAFETY: matches `sigmoid_gate_bf16(x, gate, out, n)` in cuda/ops.cu; the caller checked gate.len() ==
        // out.len() == x.len() = n >= 1; indices < n only, the vector accesses below 4 * (n / 4) from 256-byte-aligned
        // starts; safe as launch_small's dependent (ew_walk's pdl_start first).
        unsafe { self.launch_small(NAME, &f, flat_config(x.len()), &mut args) }
    }

    /// `name`: `silu_and_mul_frag_{fp8,nvfp4}` / `gelu_and_mul_frag_*`: the gated activation of `rows` token rows
    /// written as a decode GEMV's activation fragments, as a programmatic dependent.
    fn glu_fragments(
        &self,
        name: &'static str,
        gate_up: &CudaSlice<f32>,
        xf: &mut CudaSlice<u32>,
        zero: Option<&mut CudaSlice<f32>>,
        rows: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        // The grid covers inter rounded up to whole 128-value chunks: the padding's fragments are written too.
        let cfg = glu_config(rows, inter.div_ceil(128) * 128);
        let (gp, _gg) = self.addr(gate_up);
        let (fp, _gf) = self.addr_mut(xf);
        let mut args = PdlArgs::default();
        args.ptr(gp).ptr(fp).i32(inter as i32);
        let _gz = self.zero_args(&mut args, zero);
        // SAFETY: matches `*_and_mul_frag_{fp8,nvfp4}(gate_up, xf, inter, y, ylen)` in cuda/ops.cu; the caller
        // checked gate_up = [rows, 2*inter] with 1 <= rows <= 16, inter % 16 == 0 (so the float4 loads are aligned)
        // and inter <= 65535 * 1024 (a multiple of 128, so the padded grid's y stays <= 65535), and xf of at least
        // ceil(inter/128) * nt * 512 words (Gpu::gemv_scratch_len), every entry the grid writes (threads past the
        // last 128-chunk return); (y, ylen) as zero_args says; as a programmatic dependent it touches memory only
        // after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }
    }

    /// `name`: `cast_frag_{fp8,nvfp4}`: `rows` token rows of `x` written as a decode GEMV's activation fragments,
    /// as a programmatic dependent.
    fn cast_fragments(
        &self,
        name: &'static str,
        x: &CudaSlice<f32>,
        xf: &mut CudaSlice<u32>,
        zero: Option<&mut CudaSlice<f32>>,
        rows: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        // As glu_fragments: the grid covers k rounded up to whole 128-value chunks, whose padding is written too.
        let cfg = glu_config(rows, k.div_ceil(128) * 128);
        let (xp, _gx) = self.addr(x);
        let (fp, _gf) = self.addr_mut(xf);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(fp).i32(k as i32);
        let _gz = self.zero_args(&mut args, zero);
        // SAFETY: matches `cast_frag_{fp8,nvfp4}(x, xf, dim, y, ylen)` in cuda/ops.cu; the caller checked x =
        // [rows, k] with 1 <= rows <= 16, k % 16 == 0 (so every row and each float4 load is 16-byte aligned, and
        // no load passes the row's end) and k <= 65535 * 1024 (a multiple of 128, so the padded grid's y stays
        // <= 65535 and k fits the i32), and xf of at least ceil(k/128) * nt * 512 words (Gpu::gemv_scratch_len),
        // every entry the grid writes (threads past the last 128-chunk return); (y, ylen) as zero_args says; as a
        // programmatic dependent it touches memory only after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }
    }

    /// `silu_and_mul_bf16` / `gelu_and_mul_bf16`: grid (rows, ceil(inter / 1024)).
    fn glu(
        &self,
        gelu: bool,
        gate_up: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
        rows: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        let name = if gelu {
            "gelu_and_mul_bf16"
        } else {
            "silu_and_mul_bf16"
        };
        let f = self.function(Module::Ops, name)?;
        let i = inter as i32;
        let cfg = glu_config(rows, inter);
        let (gp, _gg) = self.addr(gate_up);
        let (op, _go) = self.addr_mut(out);
        let mut args = PdlArgs::default();
        args.ptr(gp).ptr(op).i32(i);
        // SAFETY: matches `*_and_mul_bf16` in cuda/ops.cu; the caller checked gate_up = [rows, 2*inter],
        // out = [rows, inter], rows <= i32::MAX and ceil(inter/1024) <= 65535; threads past inter return, and the
        // float4 path runs only when inter % 4 == 0 (aligned halves); safe as launch_small's dependent (pdl_start
        // first).
        unsafe { self.launch_small(name, &f, cfg, &mut args) }
    }

    /// `embedding_gather_bf16`: one block per id.
    fn embedding_gather_bf16(
        &self,
        table: &CudaSlice<u16>,
        ids: &CudaSlice<u32>,
        out: &mut CudaSlice<f32>,
        vocab: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "embedding_gather_bf16";
        let f = self.function(Module::Ops, NAME)?;
        let (v, d) = (vocab as u32, dim as i32);
        // SAFETY: matches `embedding_gather_bf16` in cuda/ops.cu; the caller checked table = [vocab, dim],
        // out = [ids, dim], 1 <= ids <= i32::MAX, vocab < 2^32 and dim <= i32::MAX; the kernel reads a row only for
        // an id < vocab (others become NaN rows), and its 16-byte loads only when dim % 8 == 0.
        unsafe {
            self.launch_args(NAME, &f, per_row(ids.len(), GATHER_THREADS), |b| {
                b.arg(table).arg(ids).arg(out).arg(&v).arg(&d);
            })
        }
    }

    /// `embedding_gather_int4`: one block per id.
    #[allow(clippy::too_many_arguments)]
    fn embedding_gather_int4(
        &self,
        packed: &CudaSlice<u8>,
        scales_zeros: &CudaSlice<u16>,
        ids: &CudaSlice<u32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        k: usize,
        group: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "embedding_gather_int4";
        let f = self.function(Module::Ops, NAME)?;
        let npad = n.div_ceil(64) as u32 * 64;
        let (nn, kk, g) = (n as u32, k as i32, group as i32);
        // SAFETY: matches `embedding_gather_int4` in cuda/ops.cu; the caller checked packed = [npad/64][k][32],
        // scales_zeros = [ceil(k/group)][npad][2], out = [ids, k], group > 0, npad < 2^32 and k <= i32::MAX;
        // ids >= n read nothing (NaN rows).
        unsafe {
            self.launch_args(NAME, &f, per_row(ids.len(), GATHER_THREADS), |b| {
                b.arg(packed)
                    .arg(scales_zeros)
                    .arg(ids)
                    .arg(out)
                    .arg(&nn)
                    .arg(&kk)
                    .arg(&g)
                    .arg(&npad);
            })
        }
    }

    /// `argmax_cluster8` (grid (8, rows), clusters of 8 along x) or `argmax_block` (grid (1, rows)).
    fn argmax(
        &self,
        cluster: bool,
        logits: &CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), KernelError> {
        let (name, gx) = if cluster {
            ("argmax_cluster8", ARGMAX_CLUSTER)
        } else {
            ("argmax_block", 1)
        };
        let f = self.function(Module::Ops, name)?;
        let v = vocab as u32;
        let cfg = launch_config((gx, rows as u32, 1), (ROW_THREADS, 1, 1), 0);
        // SAFETY: matches `argmax_*` in cuda/ops.cu; the caller checked logits = [rows, vocab], out = [rows],
        // 1 <= rows <= 65535 (grid.y) and vocab <= i32::MAX; the cluster kernel's compile-time cluster of 8 divides
        // grid.x = 8; float4 loads only when vocab % 4 == 0.
        unsafe {
            self.launch_args(name, &f, cfg, |b| {
                b.arg(logits).arg(out).arg(&v);
            })
        }
    }

    /// `sample_topk_topp_cluster8` (grid (8, rows), clusters of 8 along x) or `sample_topk_topp` (grid (rows)).
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &self,
        cluster: bool,
        logits: &CudaSlice<f32>,
        rng: &mut CudaSlice<u32>,
        out: &mut CudaSlice<u32>,
        rows: usize,
        vocab: usize,
        k: usize,
        temperature: f32,
        top_p: f32,
    ) -> Result<(), KernelError> {
        let (name, grid_dim) = if cluster {
            (
                "sample_topk_topp_cluster8",
                (SAMPLE_CLUSTER, rows as u32, 1),
            )
        } else {
            ("sample_topk_topp", (rows as u32, 1, 1))
        };
        let f = self.function(Module::Ops, name)?;
        let (v, kk) = (vocab as u32, k as u32);
        let cfg = launch_config(grid_dim, (ROW_THREADS, 1, 1), 0);
        // SAFETY: matches `sample_topk_topp*` in cuda/ops.cu; the caller checked logits = [rows, vocab],
        // rng = [rows, 4], out = [rows], 1 <= rows <= i32::MAX (one block per row) and <= 65535 for the cluster
        // kernel (grid.y), whose compile-time cluster of 8 divides grid.x = 8; 1 <= k <= min(vocab, 1024) (the
        // shared candidate array), vocab <= i32::MAX, temperature finite and > 0 unless k == 1, top_p in (0, 1].
        unsafe {
            self.launch_args(name, &f, cfg, |b| {
                b.arg(logits)
                    .arg(rng)
                    .arg(out)
                    .arg(&v)
                    .arg(&kk)
                    .arg(&temperature)
                    .arg(&top_p);
            })
        }
    }

    /// `silu_and_mul_f32` / `gelu_and_mul_f32` / `gelu_tanh_and_mul_f32`: grid (rows, ceil(inter / 1024)).
    fn act_and_mul_f32(
        &self,
        act: crate::shapes::GatedAct,
        gate_up: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        use crate::shapes::GatedAct;
        let name = match act {
            GatedAct::Silu => "silu_and_mul_f32",
            GatedAct::GeluErf => "gelu_and_mul_f32",
            GatedAct::GeluTanh => "gelu_tanh_and_mul_f32",
        };
        let f = self.function(Module::Ops, name)?;
        let (gp, _gg) = self.addr(gate_up);
        let (op, _go) = self.addr_mut(out);
        let mut args = PdlArgs::default();
        args.ptr(gp).ptr(op).i32(inter as i32);
        // SAFETY: matches `*_and_mul_f32(gate_up, out, inter)` in cuda/ops.cu; the caller checked
        // gate_up = [rows, 2*inter], out = [rows, inter], 1 <= rows <= i32::MAX and 1 <= inter <= 65535 * 1024 (so
        // grid.y = ceil(inter/1024) <= 65535); threads past inter return, and the float4 path runs only when
        // inter % 4 == 0 (aligned rows and halves); safe as launch_small's dependent (pdl_start first).
        unsafe { self.launch_small(name, &f, glu_config(rows, inter), &mut args) }
    }

    /// `cast_f32_to_bf16` (f32 `x`, bf16 bits `out`) / `cast_bf16_to_f32` (the reverse): the flat grid over
    /// x.len().
    fn cast<A, B>(
        &self,
        name: &'static str,
        x: &CudaSlice<A>,
        out: &mut CudaSlice<B>,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let (xp, _gx) = self.addr(x);
        let (op, _go) = self.addr_mut(out);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(op).u64(x.len() as u64);
        // SAFETY: matches `cast_f32_to_bf16(x, out, n)` / `cast_bf16_to_f32(x, out, n)` in cuda/ops.cu (the caller
        // names the kernel of its element types); the caller checked out.len() == x.len() = n >= 1; the kernel
        // touches indices < n only, its 16-byte / 8-byte vector accesses cover whole groups of 4 below 4 * (n / 4)
        // from the starts of these 256-byte-aligned allocations; safe as launch_small's dependent (ew_walk's pdl_start
        // first).
        unsafe { self.launch_small(name, &f, flat_config(x.len()), &mut args) }
    }

    /// `sigmoid_gate_f32` / `add_assign_f32` (`x op= y`): the flat grid over x.len().
    fn ew_binary(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let len = x.len();
        let (xp, _gx) = self.addr_mut(x);
        let (yp, _gy) = self.addr(y);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(yp).u64(len as u64);
        // SAFETY: matches `sigmoid_gate_f32(x, gate, n)` / `add_assign_f32(x, y, n)` in cuda/ops.cu; the caller
        // checked y.len() == x.len() = n >= 1 (two distinct allocations: one is borrowed mutably); the kernel
        // touches indices < n only, float4 accesses only below 4 * (n / 4) from 256-byte-aligned starts; a
        // programmatic dependent (ew_walk's pdl_start first).
        unsafe { self.launch_small(name, &f, flat_config(len), &mut args) }
    }

    /// `softcap_f32` / `scale_assign_f32` (`x = op(x, s)`): the flat grid over x.len().
    fn ew_scalar(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        s: f32,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let len = x.len();
        let (xp, _gx) = self.addr_mut(x);
        let mut args = PdlArgs::default();
        args.ptr(xp).f32(s).u64(len as u64);
        // SAFETY: matches `softcap_f32(x, cap, n)` / `scale_assign_f32(x, s, n)` in cuda/ops.cu; n = x.len() >= 1
        // (the caller returns before an empty buffer); indices < n only, float4 accesses as in ew_binary; a
        // programmatic dependent (ew_walk's pdl_start first).
        unsafe { self.launch_small(name, &f, flat_config(len), &mut args) }
    }

    /// `sigmoid_head_gate_f32` (`v` the gate, one per group of `cols`) / `add_bias_rows_f32` (`v` the bias, one
    /// per column): grid (ceil(cols / 256), min(rows, 65535)).
    fn ew_rows(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        v: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let grid = (
            cols.div_ceil(EW_THREADS as usize) as u32,
            rows.min(EW_MAX_ROWS) as u32,
            1,
        );
        let cfg = launch_config(grid, (EW_THREADS, 1, 1), 0);
        let (xp, _gx) = self.addr_mut(x);
        let (vp, _gv) = self.addr(v);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(vp).u64(rows as u64).i32(cols as i32);
        // SAFETY: matches `sigmoid_head_gate_f32(x, gate, groups, d)` / `add_bias_rows_f32(x, bias, rows, n)` in
        // cuda/ops.cu; the caller checked x = [rows, cols] with rows, cols >= 1 and cols <= i32::MAX, and v of
        // rows elements (the gate) or cols (the bias), the only ones each kernel reads; threads past cols return
        // and grid.y strides the rows; safe as launch_small's dependent (pdl_start before any return).
        unsafe { self.launch_small(name, &f, cfg, &mut args) }
    }

    /// `copy_cols_f32`: grid (min(ceil(width / 256), 4096), min(rows, 65535)), both strided.
    #[allow(clippy::too_many_arguments)]
    fn copy_cols(
        &self,
        src: &CudaSlice<f32>,
        src_cols: usize,
        src_off: usize,
        dst: &mut CudaSlice<f32>,
        dst_cols: usize,
        dst_off: usize,
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "copy_cols_f32";
        let f = self.function(Module::Ops, NAME)?;
        let a = [src_cols, src_off, dst_cols, dst_off, rows, width].map(|v| v as u64);
        let grid = (
            width.div_ceil(EW_THREADS as usize).min(EW_MAX_BLOCKS) as u32,
            rows.min(EW_MAX_ROWS) as u32,
            1,
        );
        let cfg = launch_config(grid, (EW_THREADS, 1, 1), 0);
        let (sp, _gs) = self.addr(src);
        let (dp, _gd) = self.addr_mut(dst);
        let mut args = PdlArgs::default();
        args.ptr(sp)
            .u64(a[0])
            .u64(a[1])
            .ptr(dp)
            .u64(a[2])
            .u64(a[3])
            .u64(a[4])
            .u64(a[5]);
        // SAFETY: matches `copy_cols_f32(src, src_cols, src_off, dst, dst_cols, dst_off, rows, width)` in
        // cuda/ops.cu; the caller checked rows, width >= 1 and (rows - 1) * cols + off + width <= len on both sides
        // without overflow, so every index the kernel forms (r < rows, c < width) is inside its buffer; src and dst
        // are distinct allocations (dst is borrowed mutably); safe as launch_small's dependent (pdl_start first).
        unsafe { self.launch_small(NAME, &f, cfg, &mut args) }
    }

    /// `rope_neox`: one block of 256 threads per token.
    #[allow(clippy::too_many_arguments)]
    fn rope_neox(
        &self,
        x: &mut CudaSlice<f32>,
        positions: &CudaSlice<u32>,
        theta: f64,
        tokens: usize,
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "rope_neox";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = self.addr_mut(x);
        let (pp, _gp) = self.addr(positions);
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(pp)
            .f64(theta)
            .i32(heads as i32)
            .i32(head_dim as i32)
            .i32(rotary_dim as i32);
        // SAFETY: matches `rope_neox` in cuda/ops.cu; the caller checked x = [tokens, heads, head_dim],
        // positions = [tokens], 1 <= tokens <= i32::MAX, heads * head_dim <= i32::MAX, rotary_dim even,
        // 2 <= rotary_dim <= min(head_dim, 1024) (the kernel's 512-entry angle tables); a programmatic dependent
        // (pdl_start first).
        unsafe { self.launch_small(NAME, &f, per_row(tokens, 256), &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Pcg32;

    fn err<T: std::fmt::Debug>(r: Result<T, KernelError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn pcg32_words_seed_like_the_cpu_generator() {
        // Replays the words with the CPU's step and compares the outputs with Pcg32's own.
        for (seed, stream) in [
            (0u64, 0u64),
            (42, 7),
            (u64::MAX, 1 << 62),
            (123_456_789, 99),
        ] {
            let w = Gpu::pcg32_words(seed, stream);
            let mut state = u64::from(w[0]) | (u64::from(w[1]) << 32);
            let inc = u64::from(w[2]) | (u64::from(w[3]) << 32);
            let mut cpu = Pcg32::new(seed, stream);
            for _ in 0..16 {
                let old = state;
                state = old
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(inc);
                let x = (((old >> 18) ^ old) >> 27) as u32;
                assert_eq!(x.rotate_right((old >> 59) as u32), cpu.next_u32());
            }
        }
    }

    #[test]
    fn norm_and_glu_sizes_are_checked() {
        assert!(err(check_norm("t", 10, 0, 1e-6)).contains("empty"));
        assert!(err(check_norm("t", 10, 3, 1e-6)).contains("whole number"));
        assert!(err(check_norm("t", 9, 3, f32::NAN)).contains("eps"));
        assert!(err(check_norm("t", 9, 3, -1.0)).contains("eps"));
        assert_eq!(check_norm("t", 9, 3, 0.0).unwrap(), 3);
        assert_eq!(check_norm("t", 0, 3, 1e-6).unwrap(), 0);
        assert!(err(check_glu("t", 8, 0)).contains("positive"));
        assert!(err(check_glu("t", 10, 3)).contains("whole number"));
        assert!(err(check_glu("t", 10, 65535 * 1024 + 1)).contains("grid"));
        assert_eq!(check_glu("t", 12, 3).unwrap(), 2);
    }

    #[test]
    fn sampling_parameters_are_checked() {
        let p = |temperature, top_k, top_p| SamplingParams {
            temperature,
            top_k,
            top_p,
        };
        assert_eq!(sample_k("t", 248_320, &p(0.0, 0, 1.0)).unwrap(), 1);
        assert_eq!(sample_k("t", 248_320, &p(0.7, 20, 0.9)).unwrap(), 20);
        assert_eq!(sample_k("t", 300, &p(0.7, 0, 0.9)).unwrap(), 300);
        assert_eq!(sample_k("t", 5, &p(1.0, 50, 1.0)).unwrap(), 5);
        assert!(err(sample_k("t", 248_320, &p(0.7, 0, 0.9))).contains("at most 1024"));
        assert!(err(sample_k("t", 248_320, &p(0.7, 1025, 0.9))).contains("at most 1024"));
        assert!(err(sample_k("t", 10, &p(-1.0, 5, 0.9))).contains("temperature"));
        assert!(err(sample_k("t", 10, &p(f32::INFINITY, 5, 0.9))).contains("temperature"));
        assert!(err(sample_k("t", 10, &p(1.0, 5, 0.0))).contains("top_p"));
        assert!(err(sample_k("t", 10, &p(1.0, 5, 1.5))).contains("top_p"));
        assert!(err(check_logits("t", 10, 0, 1, 65535)).contains("vocab"));
        assert!(err(check_logits("t", 10, 5, 0, 65535)).contains("rows"));
        assert!(err(check_logits("t", 10, 5, 3, 65535)).contains("logits"));
        assert!(err(check_logits("t", 65536 * 2, 2, 65536, 65535)).contains("rows"));
        assert_eq!(check_logits("t", 15, 5, 3, 65535).unwrap(), 3);
    }

    #[test]
    fn rope_and_int4_tables_are_checked() {
        let r = Rope::new(256, 0.25, 1e7).unwrap();
        assert_eq!(check_rope("t", &r, 4, 3, 3 * 4 * 256).unwrap(), 3);
        assert!(err(check_rope("t", &r, 4, 3, 3 * 4 * 256 - 1)).contains("x has"));
        assert!(err(check_rope("t", &r, 0, 3, 0)).contains("heads"));
        let wide = Rope {
            head_dim: 2048,
            rotary_dim: 2048,
            theta: 1e4,
        };
        assert!(err(check_rope("t", &wide, 1, 1, 2048)).contains("at most 1024"));
        // n = 100 -> npad 128, k = 70, group 32 -> 3 groups.
        assert_eq!(
            check_int4_table("t", 2 * 70 * 32, 3 * 128 * 2, 100, 70, 32).unwrap(),
            128
        );
        assert!(
            err(check_int4_table("t", 2 * 70 * 32, 3 * 128 * 2, 100, 70, 48)).contains("group")
        );
        assert!(err(check_int4_table(
            "t",
            2 * 70 * 32 - 1,
            3 * 128 * 2,
            100,
            70,
            32
        ))
        .contains("packed"));
        assert!(
            err(check_int4_table("t", 2 * 70 * 32, 3 * 128, 100, 70, 32)).contains("scales_zeros")
        );
        assert!(err(check_ids("t", 3, 70, 209)).contains("out"));
    }
}
