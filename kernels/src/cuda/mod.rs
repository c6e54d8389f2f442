//! GPU kernels (CUDA, sm_90: the H200). Open a device with [`Gpu::probe`] (which answers `Ok(None)` where there is
//! no driver or no device), move data with [`Gpu::upload`] / [`Gpu::download`], and call the kernels as methods of
//! [`Gpu`]; every size, stride and alignment is checked on the Rust side before a launch.
//!
//! Without the `cuda` feature the same API exists and every entry point returns
//! [`KernelError::NotCompiledWithCuda`], so call sites carry no `cfg`. With it, the kernels in `kernels/cuda/*.cu`
//! are compiled to PTX and sm_90 cubins by `build.rs` (see `build_cuda.rs`), embedded in the crate, and each module
//! is loaded once per [`Gpu`] (one CUDA context) on first use: the cubin on an sm_90 device, the PTX elsewhere.
//! Measured speeds and the method are in `benchmarks/h200.md`; `kernels/bench/h200/run_all.sh` reproduces them.
//!
//! Kernels (layouts in each method's docs; all outputs fp32):
//! - [`Gpu::fp8_block_gemv`]: decode GEMV, bf16 activations x FP8 e4m3 weights with 128x128 block scales.
//! - [`Gpu::nvfp4_gemv`]: decode GEMV, bf16 activations x NVFP4 weights (weight-only: Hopper has no FP4 math).
//!   Both have a CUDA-core and a tensor-core family ([`KernelPath`]), as has the attention decode.
//! - [`Gpu::gdn_decode_step`]: the fused gated DeltaNet decode step for a batch of sequences.
//! - [`Gpu::attention_decode_paged`]: decode attention over a paged KV cache, GQA-packed, split over the context.
//! - [`Gpu::fp8_block_gemm`]: prefill GEMM, FP8 e4m3 activations (per token per 128 of K, made by
//!   [`Gpu::fp8_quantize_activations`]) x FP8 e4m3 weights with 128x128 block scales, on the tensor cores.
//! - [`Gpu::nvfp4_gemm`]: prefill GEMM, bf16 activations x NVFP4 weights decoded to bf16 in registers, on the
//!   tensor cores.

use crate::gdn::GdnDims;
use crate::KernelError;

#[cfg(feature = "cuda")]
mod device;

// One file per kernel family beyond the first four, each an `impl Gpu` block (the safe, checked entry points)
// over its `device/<same name>.rs` launches.
mod attention_prefill;
mod gdn_prefill;
mod gemm_sm90a;
mod ops;

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for f32 {}
}

/// Element types a [`GpuBuffer`] can hold: bytes (FP8/NVFP4 weights and scales), `u16` (bf16 bits), `i32`, `u32`, `f32`.
#[cfg(feature = "cuda")]
pub trait GpuScalar:
    sealed::Sealed
    + Copy
    + Default
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Unpin
    + 'static
{
}
/// Element types a [`GpuBuffer`] can hold: bytes (FP8/NVFP4 weights and scales), `u16` (bf16 bits), `i32`, `u32`, `f32`.
#[cfg(not(feature = "cuda"))]
pub trait GpuScalar: sealed::Sealed + Copy + Default + 'static {}
impl GpuScalar for u8 {}
impl GpuScalar for u16 {}
impl GpuScalar for i32 {}
impl GpuScalar for u32 {}
impl GpuScalar for f32 {}

/// One CUDA device (its primary context and a stream) with the kernel modules loaded on first use.
pub struct Gpu {
    #[cfg(feature = "cuda")]
    inner: device::Device,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

/// A device allocation of `len` elements of `T`, owned by the [`Gpu`] that made it.
pub struct GpuBuffer<T: GpuScalar> {
    #[cfg(feature = "cuda")]
    slice: cudarc::driver::CudaSlice<T>,
    #[cfg(not(feature = "cuda"))]
    never: (std::convert::Infallible, std::marker::PhantomData<T>),
}

impl<T: GpuScalar> GpuBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.slice.len()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never.0 {}
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Device-side parameters of one gated DeltaNet layer (layouts as [`crate::gdn::GdnWeights`]).
pub struct GdnGpuWeights<'a> {
    /// `[conv_dim, K]`.
    pub conv_weight: &'a GpuBuffer<f32>,
    /// `[Hv]`.
    pub a_log: &'a GpuBuffer<f32>,
    /// `[Hv]`.
    pub dt_bias: &'a GpuBuffer<f32>,
    /// `[dv]`.
    pub norm_weight: &'a GpuBuffer<f32>,
    /// The gated RMSNorm epsilon.
    pub norm_eps: f32,
}

/// Device-side per-token inputs of one decode step for `seqs` sequences (layouts as [`crate::gdn::GdnInputs`]).
pub struct GdnGpuInputs<'a> {
    /// `[seqs, conv_dim]`.
    pub qkv: &'a GpuBuffer<f32>,
    /// `[seqs, Hv*dv]`.
    pub z: &'a GpuBuffer<f32>,
    /// `[seqs, Hv]`.
    pub a: &'a GpuBuffer<f32>,
    /// `[seqs, Hv]`.
    pub b: &'a GpuBuffer<f32>,
}

/// Geometry of a paged KV cache and of one decode-attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedAttentionDims {
    /// Sequences in the batch.
    pub seqs: usize,
    /// Query heads; a multiple of `kv_heads`.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dim; the kernel supports 64, 128 and 256.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Pages in the cache pool.
    pub num_pages: usize,
    /// Columns of the block table (most pages one sequence may use).
    pub max_pages_per_seq: usize,
}

/// Which kernel family serves a call that has both ([`Gpu::fp8_block_gemv_with`], [`Gpu::nvfp4_gemv_with`],
/// [`Gpu::attention_decode_paged_with`]). Tests and benchmarks drive each family; callers use `Auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// The measured-best family for the call's shape (each method's docs say which; `benchmarks/h200.md` has
    /// the numbers).
    Auto,
    /// fp32 arithmetic on the CUDA cores. GEMV: one, two or four weight rows per warp, a few instructions per
    /// weight per activation row, so compute-bound beyond `m = 1` (FP8) or already at `m = 1` (NVFP4's decode).
    /// Attention: two query heads per warp, fp32 scores and probabilities.
    CudaCores,
    /// `mma.sync` m16n8k16 with fp32 accumulation. GEMV: f16 operands, the weights decoded once for up to 16
    /// activation rows, activations rounded to f16 (saturating at +-65504). Attention: bf16 operands, the query
    /// and the probabilities rounded to bf16 as in flash-attention kernels (~1e-3 relative error).
    TensorCores,
}

impl Gpu {
    /// Opens device 0, or answers `Ok(None)` where this machine has no CUDA driver or no device; fails with
    /// [`KernelError::NotCompiledWithCuda`] in a build without the `cuda` feature.
    pub fn probe() -> Result<Option<Gpu>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(device::Device::probe()?.map(|inner| Gpu { inner }))
        }
        #[cfg(not(feature = "cuda"))]
        Err(KernelError::NotCompiledWithCuda)
    }

    /// Opens device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Gpu, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(Gpu {
                inner: device::Device::new(ordinal)?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(KernelError::NotCompiledWithCuda)
        }
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String, KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.name()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: GpuScalar>(&self, host: &[T]) -> Result<GpuBuffer<T>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(GpuBuffer {
                slice: self.inner.upload(host)?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = host;
            match self.never {}
        }
    }

    /// A new zero-filled device buffer of `len` elements.
    pub fn zeros<T: GpuScalar>(&self, len: usize) -> Result<GpuBuffer<T>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(GpuBuffer {
                slice: self.inner.zeros(len)?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = len;
            match self.never {}
        }
    }

    /// Overwrites `buf` with `host` (same length).
    pub fn write<T: GpuScalar>(
        &self,
        buf: &mut GpuBuffer<T>,
        host: &[T],
    ) -> Result<(), KernelError> {
        crate::ensure_shape!(
            buf.len() == host.len(),
            "Gpu::write",
            "buffer has {} elements, host slice {}",
            buf.len(),
            host.len()
        );
        #[cfg(feature = "cuda")]
        {
            self.inner.write(&mut buf.slice, host)
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// Copies `buf` back to the host, after every kernel queued before it has finished.
    pub fn download<T: GpuScalar>(&self, buf: &GpuBuffer<T>) -> Result<Vec<T>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.download(&buf.slice)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = buf;
            match self.never {}
        }
    }

    /// Waits for every queued kernel and reports an asynchronous launch error, if any.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.synchronize()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// `y[m][n] = sum_k x[m][k] * w[n][k] * scales[n/128][k/128]` for decode (`1 <= m <= 16`).
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: e4m3 `[n, k]` (the checkpoint's `weight`); `scales`: fp32
    /// `[ceil(n/128), ceil(k/128)]` (`weight_scale_inv`, multiplied); `y`: fp32 `[m, n]`. Needs `k % 16 == 0`
    /// (one 16-byte load per lane never straddles a row). Same as [`Gpu::fp8_block_gemv_with`] with
    /// [`KernelPath::Auto`], which takes the CUDA cores at `m = 1` (83% of copy bandwidth on 5120x17408 on the
    /// H200, against 67% on the tensor cores) and the tensor cores above (at `m = 4` 2.8x faster).
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemv(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.fp8_block_gemv_with(KernelPath::Auto, x, w, scales, y, m, n, k)
    }

    /// [`Gpu::fp8_block_gemv`] on a chosen kernel family (tests and benchmarks drive each one).
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemv_with(
        &self,
        path: KernelPath,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemv";
        check_gemv_dims(OP, m, n, k, 16)?;
        check_len(OP, "x", x.len(), m * k)?;
        check_len(OP, "w", w.len(), n * k)?;
        check_len(
            OP,
            "scales",
            scales.len(),
            n.div_ceil(128) * k.div_ceil(128),
        )?;
        check_len(OP, "y", y.len(), m * n)?;
        #[cfg(feature = "cuda")]
        {
            let tensor = match path {
                KernelPath::Auto => m > 1,
                KernelPath::CudaCores => false,
                KernelPath::TensorCores => true,
            };
            self.inner.fp8_block_gemv(
                tensor,
                &x.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = path;
            match self.never {}
        }
    }

    /// `y[m][n] = global_scale * sum_k x[m][k] * e2m1(w[n][k]) * e4m3(scales[n][k/16])` for decode
    /// (`1 <= m <= 16`), weight-only NVFP4 (modelopt layout).
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: `[n, k/2]` bytes, the even element in the low nibble; `scales`: e4m3
    /// `[n, k/16]`; `global_scale`: the checkpoint's `weight_scale_2`; `y`: fp32 `[m, n]`. Needs `k % 32 == 0`
    /// (a lane's 16-byte load is 32 values, two scale groups). Same as [`Gpu::nvfp4_gemv_with`] with
    /// [`KernelPath::Auto`], which takes the tensor cores at every `m` (faster than the CUDA cores at every
    /// shape measured on the H200, 1.04-1.22x at `m = 1`).
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemv(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.nvfp4_gemv_with(KernelPath::Auto, x, w, scales, global_scale, y, m, n, k)
    }

    /// [`Gpu::nvfp4_gemv`] on a chosen kernel family (tests and benchmarks drive each one).
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemv_with(
        &self,
        path: KernelPath,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv";
        check_gemv_dims(OP, m, n, k, 32)?;
        check_len(OP, "x", x.len(), m * k)?;
        check_len(OP, "w", w.len(), n * k / 2)?;
        check_len(OP, "scales", scales.len(), n * k / 16)?;
        check_len(OP, "y", y.len(), m * n)?;
        crate::ensure_shape!(
            global_scale.is_finite(),
            OP,
            "global_scale must be finite, got {global_scale}"
        );
        #[cfg(feature = "cuda")]
        {
            let tensor = !matches!(path, KernelPath::CudaCores);
            self.inner.nvfp4_gemv(
                tensor,
                &x.slice,
                &w.slice,
                &scales.slice,
                global_scale,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = path;
            match self.never {}
        }
    }

    /// One fused gated DeltaNet decode step (conv, gates, l2-norm, delta-rule update, output, gated RMSNorm) for
    /// `seqs` sequences, one token each, with the layouts of [`crate::gdn`].
    ///
    /// The conv state is read from `conv_in` and the advanced one written to `conv_out` (two buffers, swapped by
    /// the caller each step): the three value heads that share a key head run in different blocks and all read
    /// the key head's conv history, so updating it in place would race. The recurrent `state` is updated in place
    /// (each value head's `[dk, dv]` slice belongs to exactly one block). Built for `dk = dv = 128` and conv
    /// kernels 2..=4 (every released model), checked here.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_decode_step(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seqs: usize,
        conv_in: &GpuBuffer<f32>,
        conv_out: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_decode_step";
        dims.validate(OP)?;
        crate::ensure_shape!(
            dims.key_dim == 128 && dims.value_dim == 128,
            OP,
            "the CUDA step is built for key_dim = value_dim = 128 (Qwen3.5 / Qwen3-Next), got {}x{}",
            dims.key_dim,
            dims.value_dim
        );
        crate::ensure_shape!(
            (2..=4).contains(&dims.conv_kernel),
            OP,
            "conv_kernel must be 2..=4, got {}",
            dims.conv_kernel
        );
        crate::ensure_shape!(
            (1..=65535).contains(&seqs),
            OP,
            "seqs must be 1..=65535, got {seqs}"
        );
        let cd = dims.conv_dim();
        check_len(
            OP,
            "conv_weight",
            w.conv_weight.len(),
            cd * dims.conv_kernel,
        )?;
        check_len(OP, "a_log", w.a_log.len(), dims.value_heads)?;
        check_len(OP, "dt_bias", w.dt_bias.len(), dims.value_heads)?;
        check_len(OP, "norm_weight", w.norm_weight.len(), dims.value_dim)?;
        crate::ensure_shape!(
            w.norm_eps.is_finite() && w.norm_eps >= 0.0,
            OP,
            "norm_eps must be finite and non-negative, got {}",
            w.norm_eps
        );
        check_len(OP, "qkv", x.qkv.len(), seqs * cd)?;
        check_len(OP, "z", x.z.len(), seqs * dims.value_width())?;
        check_len(OP, "a", x.a.len(), seqs * dims.value_heads)?;
        check_len(OP, "b", x.b.len(), seqs * dims.value_heads)?;
        check_len(OP, "conv_in", conv_in.len(), seqs * dims.conv_state_len())?;
        check_len(OP, "conv_out", conv_out.len(), seqs * dims.conv_state_len())?;
        check_len(OP, "state", state.len(), seqs * dims.state_len())?;
        check_len(OP, "out", out.len(), seqs * dims.value_width())?;
        #[cfg(feature = "cuda")]
        {
            self.inner.gdn_decode_step(
                dims,
                w,
                x,
                seqs,
                &conv_in.slice,
                &mut conv_out.slice,
                &mut state.slice,
                &mut out.slice,
            )
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// Decode attention (one query token per sequence) over a paged KV cache.
    ///
    /// Layouts are those of [`crate::attention`] with a bf16 cache: `q`: fp32 `[seqs, q_heads, head_dim]`;
    /// `k_cache`, `v_cache`: bf16 bits `[num_pages, kv_heads, page_size, head_dim]`; `block_table`:
    /// `[seqs, max_pages_per_seq]` page ids; `seq_lens`: `[seqs]` tokens in each sequence's cache, the current
    /// token's K/V already written (a length past the table is clamped, a page id past the pool is skipped);
    /// `out`: fp32 `[seqs, q_heads, head_dim]`; `scale` multiplies `q . k` (usually `1/sqrt(head_dim)`).
    /// Query heads `g*r .. g*r + r` (`r = q_heads / kv_heads`) read KV head `g`, and each block computes all `r`
    /// of them, so K and V are read once per KV head. `splits` blocks share one (sequence, KV head) over the
    /// context (flash-decoding); `splits = 0` picks a count that fills the GPU.
    ///
    /// Same as [`Gpu::attention_decode_paged_with`] with [`KernelPath::Auto`], which picks the tensor cores.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode_paged(
        &self,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        k_cache: &GpuBuffer<u16>,
        v_cache: &GpuBuffer<u16>,
        block_table: &GpuBuffer<u32>,
        seq_lens: &GpuBuffer<u32>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.attention_decode_paged_with(
            KernelPath::Auto,
            dims,
            q,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            scale,
            splits,
            out,
        )
    }

    /// [`Gpu::attention_decode_paged`] on a chosen kernel family (tests and benchmarks drive each one).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode_paged_with(
        &self,
        path: KernelPath,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        k_cache: &GpuBuffer<u16>,
        v_cache: &GpuBuffer<u16>,
        block_table: &GpuBuffer<u32>,
        seq_lens: &GpuBuffer<u32>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_decode_paged";
        let d = dims;
        crate::ensure_shape!(
            d.seqs > 0 && d.q_heads > 0 && d.kv_heads > 0 && d.page_size > 0 && d.num_pages > 0,
            OP,
            "every count must be positive, got {d:?}"
        );
        crate::ensure_shape!(
            d.q_heads.is_multiple_of(d.kv_heads)
                && matches!(d.q_heads / d.kv_heads, 1 | 2 | 4 | 6 | 8),
            OP,
            "q_heads ({}) must be 1, 2, 4, 6 or 8 times kv_heads ({}), the built instantiations",
            d.q_heads,
            d.kv_heads
        );
        crate::ensure_shape!(
            matches!(d.head_dim, 64 | 128 | 256),
            OP,
            "head_dim must be 64, 128 or 256, got {}",
            d.head_dim
        );
        crate::ensure_shape!(
            d.seqs <= 65535 && d.kv_heads <= 65535,
            OP,
            "seqs and kv_heads must be at most 65535"
        );
        crate::ensure_shape!(
            splits <= 1024,
            OP,
            "splits must be at most 1024, got {splits}"
        );
        crate::ensure_shape!(scale.is_finite(), OP, "scale must be finite, got {scale}");
        let cache = d.num_pages * d.page_size * d.kv_heads * d.head_dim;
        check_len(OP, "q", q.len(), d.seqs * d.q_heads * d.head_dim)?;
        check_len(OP, "k_cache", k_cache.len(), cache)?;
        check_len(OP, "v_cache", v_cache.len(), cache)?;
        check_len(
            OP,
            "block_table",
            block_table.len(),
            d.seqs * d.max_pages_per_seq,
        )?;
        check_len(OP, "seq_lens", seq_lens.len(), d.seqs)?;
        check_len(OP, "out", out.len(), d.seqs * d.q_heads * d.head_dim)?;
        #[cfg(feature = "cuda")]
        {
            let tensor = !matches!(path, KernelPath::CudaCores);
            self.inner.attention_decode_paged(
                tensor,
                d,
                &q.slice,
                &k_cache.slice,
                &v_cache.slice,
                &block_table.slice,
                &seq_lens.slice,
                scale,
                splits,
                &mut out.slice,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = path;
            match self.never {}
        }
    }
}

impl Gpu {
    /// Quantises bf16 activations for [`Gpu::fp8_block_gemm`]: per token, per 128 of K,
    /// `scales[m][k/128] = amax / 448` (1.0 for an all-zero block) and `xq[m][k] = e4m3(x[m][k] / scale)`,
    /// rounded to nearest even and saturated (as a torch e4m3 cast after a clamp, and as
    /// `kernels::formats::f32_to_e4m3`).
    ///
    /// `x`: bf16 bits `[m, k]`; `xq`: e4m3 `[m, k]`; `scales`: fp32 `[m, ceil(k/128)]`. Needs `k % 16 == 0`.
    pub fn fp8_quantize_activations(
        &self,
        x: &GpuBuffer<u16>,
        xq: &mut GpuBuffer<u8>,
        scales: &mut GpuBuffer<f32>,
        m: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_quantize_activations";
        check_gemm_dims(OP, m, 1, k)?;
        check_len(OP, "x", x.len(), m * k)?;
        check_len(OP, "xq", xq.len(), m * k)?;
        check_len(OP, "scales", scales.len(), m * k.div_ceil(128))?;
        #[cfg(feature = "cuda")]
        {
            self.inner
                .fp8_quantize_activations(&x.slice, &mut xq.slice, &mut scales.slice, m, k)
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// `y[m][n] = sum_k e4m3(xq[m][k]) * x_scales[m][k/128] * e4m3(w[n][k]) * w_scales[n/128][k/128]` for
    /// prefill (any `m`; at `m <= 16` the decode GEMV [`Gpu::fp8_block_gemv`] reads the weights faster).
    ///
    /// `xq`: e4m3 `[m, k]` and `x_scales`: fp32 `[m, ceil(k/128)]`, as [`Gpu::fp8_quantize_activations`] makes
    /// them; `w`: e4m3 `[n, k]` (the checkpoint's `weight`); `w_scales`: fp32 `[ceil(n/128), ceil(k/128)]`
    /// (`weight_scale_inv`, multiplied); `y`: fp32 `[m, n]`. Tensor cores (`mma.sync` m16n8k32 e4m3, fp32
    /// accumulation) sum each 128 of K, and that partial is scaled by both block scales and added in fp32.
    /// Needs `k % 16 == 0`, `1 <= m, n`, `n <= 65535 * 128` and every size within 32-bit indices.
    ///
    /// Correct but slow: on the H200 at `m = 4096` (5120x17408 and 17408x5120) it runs at ~255-260 TFLOP/s,
    /// 0.18-0.20x cuBLAS FP8 (`torch._scaled_mm`, rowwise or with these same block scales) and 0.30x cuBLAS bf16
    /// (`benchmarks/h200.md`). The next step is a wgmma (sm_90a) kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemm(
        &self,
        xq: &GpuBuffer<u8>,
        x_scales: &GpuBuffer<f32>,
        w: &GpuBuffer<u8>,
        w_scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemm";
        check_gemm_dims(OP, m, n, k)?;
        let kb = k.div_ceil(128);
        check_len(OP, "xq", xq.len(), m * k)?;
        check_len(OP, "x_scales", x_scales.len(), m * kb)?;
        check_len(OP, "w", w.len(), n * k)?;
        check_len(OP, "w_scales", w_scales.len(), n.div_ceil(128) * kb)?;
        check_len(OP, "y", y.len(), m * n)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.fp8_block_gemm(
                &xq.slice,
                &x_scales.slice,
                &w.slice,
                &w_scales.slice,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}

impl Gpu {
    /// `y[m][n] = global_scale * sum_k x[m][k] * e2m1(w[n][k]) * e4m3(scales[n][k/16])` for prefill (any `m`;
    /// at `m <= 16` the decode GEMV [`Gpu::nvfp4_gemv`] is the faster path), weight-only NVFP4 (modelopt layout).
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: `[n, k/2]` bytes, the even element in the low nibble; `scales`: e4m3
    /// `[n, k/16]`; `global_scale`: the checkpoint's `weight_scale_2`; `y`: fp32 `[m, n]`. The weights are decoded
    /// to bf16 in registers (e2m1 times the e4m3 group scale is exact in bf16) and multiplied on the tensor cores
    /// (`mma.sync` m16n8k16 bf16, fp32 accumulation); the global scale is applied to the fp32 result. Needs
    /// `k % 64 == 0` (one K tile), `1 <= m, n`, `n <= 65535 * 256` and every size within 32-bit indices.
    ///
    /// Correct but slow: on the H200 at `m = 4096` it runs at ~210 TFLOP/s, 0.26x cuBLAS bf16 on the same shape
    /// (`benchmarks/h200.md`); for prefill a bf16 copy of the weights through cuBLAS is 3.8x faster today.
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemm(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemm";
        check_gemm_dims(OP, m, n, k)?;
        crate::ensure_shape!(
            k.is_multiple_of(64),
            OP,
            "k must be a multiple of 64 (the NVFP4 GEMM's K tile), got {k}"
        );
        check_len(OP, "x", x.len(), m * k)?;
        check_len(OP, "w", w.len(), n * k / 2)?;
        check_len(OP, "scales", scales.len(), n * k / 16)?;
        check_len(OP, "y", y.len(), m * n)?;
        crate::ensure_shape!(
            global_scale.is_finite(),
            OP,
            "global_scale must be finite, got {global_scale}"
        );
        #[cfg(feature = "cuda")]
        {
            self.inner.nvfp4_gemm(
                &x.slice,
                &w.slice,
                &scales.slice,
                global_scale,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}

/// The prefill GEMM's and the quantiser's limits: positive sizes, `k % 16 == 0` (16-byte copies never straddle a
/// row), 32-bit element indices per row, and grid dimensions within CUDA's 65535 (`ceil(n/128)` GEMM blocks along
/// y, `ceil(k/128)` quantiser blocks along y).
fn check_gemm_dims(op: &'static str, m: usize, n: usize, k: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        m > 0 && n > 0 && k > 0,
        op,
        "m, n and k must be positive, got m = {m}, n = {n}, k = {k}"
    );
    crate::ensure_shape!(
        k.is_multiple_of(16),
        op,
        "k must be a multiple of 16, got {k}"
    );
    crate::ensure_shape!(
        m <= i32::MAX as usize && n <= i32::MAX as usize && k <= i32::MAX as usize,
        op,
        "m = {m}, n = {n} and k = {k} must fit the kernel's 32-bit indices"
    );
    crate::ensure_shape!(
        n.div_ceil(128) <= 65535 && k.div_ceil(128) <= 65535,
        op,
        "n = {n} and k = {k} must be at most 65535 * 128 (grid limits)"
    );
    Ok(())
}

fn check_len(op: &'static str, name: &str, got: usize, want: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        got == want,
        op,
        "{name} has {got} elements, expected {want}"
    );
    Ok(())
}

fn check_gemv_dims(
    op: &'static str,
    m: usize,
    n: usize,
    k: usize,
    k_multiple: usize,
) -> Result<(), KernelError> {
    crate::ensure_shape!(
        (1..=16).contains(&m),
        op,
        "m must be 1..=16 (decode rows), got {m}"
    );
    crate::ensure_shape!(
        n > 0 && k > 0,
        op,
        "n and k must be positive, got n = {n}, k = {k}"
    );
    crate::ensure_shape!(
        k.is_multiple_of(k_multiple),
        op,
        "k must be a multiple of {k_multiple}, got {k}"
    );
    crate::ensure_shape!(
        n <= i32::MAX as usize && k <= i32::MAX as usize,
        op,
        "n = {n} and k = {k} must fit the kernel's 32-bit indices"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the feature the API refuses cleanly; with it, a machine without a driver answers `None`.
    #[test]
    fn probe_matches_the_build() {
        let r = Gpu::probe();
        if cfg!(feature = "cuda") {
            assert!(r.is_ok(), "{:?}", r.err());
        } else {
            assert_eq!(r.err(), Some(KernelError::NotCompiledWithCuda));
            assert_eq!(Gpu::new(0).err(), Some(KernelError::NotCompiledWithCuda));
        }
    }

    #[test]
    fn gemv_dims_are_checked() {
        assert!(check_gemv_dims("t", 0, 8, 16, 16)
            .unwrap_err()
            .to_string()
            .contains("m must be 1..=16"));
        assert!(check_gemv_dims("t", 17, 8, 16, 16).is_err());
        assert!(check_gemv_dims("t", 1, 8, 40, 16)
            .unwrap_err()
            .to_string()
            .contains("multiple of 16"));
        assert!(check_gemv_dims("t", 16, 8, 4096, 32).is_ok());
    }

    #[test]
    fn gemm_dims_are_checked() {
        assert!(check_gemm_dims("t", 0, 8, 16)
            .unwrap_err()
            .to_string()
            .contains("must be positive"));
        assert!(check_gemm_dims("t", 5, 0, 16).is_err());
        assert!(check_gemm_dims("t", 4096, 17408, 5128)
            .unwrap_err()
            .to_string()
            .contains("multiple of 16"));
        assert!(check_gemm_dims("t", 4096, 65535 * 128 + 1, 16)
            .unwrap_err()
            .to_string()
            .contains("65535"));
        assert!(check_gemm_dims("t", 4097, 17408, 5120).is_ok());
        assert!(check_gemm_dims("t", 1, 1, 16).is_ok());
    }
}
