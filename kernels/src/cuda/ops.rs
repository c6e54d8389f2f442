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
    crate::ensure_shape!(
        p.temperature.is_finite() && p.temperature >= 0.0,
        op,
        "temperature must be finite and >= 0, got {}",
        p.temperature
    );
    crate::ensure_shape!(
        p.top_p > 0.0 && p.top_p <= 1.0,
        op,
        "top_p must be in (0, 1], got {}",
        p.top_p
    );
    if p.temperature == 0.0 {
        return Ok(1);
    }
    let k = if p.top_k == 0 {
        vocab
    } else {
        p.top_k.min(vocab)
    };
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (add, rows, out, out_bf16);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (kernel, residual, add, rows);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (residual, add, fragments, zero, rows);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (gelu, fragments, zero, rows);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = gelu;
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (cluster, rows);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (k, cluster);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = tokens;
            match self.never {}
        }
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
            self.inner.cast_f32_to_bf16(&x.slice, &mut out.slice)
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
            self.inner.cast_bf16_to_f32(&x.slice, &mut out.slice)
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = act;
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = x;
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (x, s);
            match self.never {}
        }
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
        #[cfg(not(feature = "cuda"))]
        match self.never {}
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
