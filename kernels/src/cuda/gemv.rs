//! Decode GEMVs (`kernels/cuda/gemv.cu`): FP8 e4m3 with 128x128 block scales and NVFP4, bf16 activations, fp32
//! outputs, on the CUDA cores or the tensor cores ([`KernelPath`]).

#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

#[cfg(feature = "cuda")]
use super::device::{launch_config, Device, Module, PdlArgs};
use super::{check_len_of, check_nvfp4_operands, Gpu, GpuBuffer, KernelPath};
use crate::error::checked_product;
use crate::KernelError;

impl Gpu {
    /// `y[m][n] = sum_k x[m][k] * w[n][k] * scales[n/128][k/128]` for decode (`1 <= m <= 16`).
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: e4m3 `[n, k]` (the checkpoint's `weight`); `scales`: fp32
    /// `[ceil(n/128), ceil(k/128)]` (`weight_scale_inv`, multiplied); `y`: fp32 `[m, n]`. Needs `k % 16 == 0`
    /// (one 16-byte load per lane never straddles a row). Same as [`Gpu::fp8_block_gemv_with`] with
    /// [`KernelPath::Auto`], which takes the CUDA cores at `m = 1` (92% of copy bandwidth on 5120x17408 on the
    /// H200 with K split over two warps, against 67% on the tensor cores) and the tensor cores above (at
    /// `m = 4` 2.8x faster).
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

    lab_pub! {
    /// [`Gpu::fp8_block_gemv`] on a chosen kernel family (tests and benchmarks drive each one).
    ///
    /// `Auto`'s table (H200, benchmarks/h200.md; m = 1 updated ): `m = 1` ->
    /// `fp8_block_gemv_m1_r2_u2_k2` (CUDA cores, K split over two warps, launched as a programmatic dependent:
    /// 86.5-91.7% of copy bandwidth on the layer shapes) below 65536 rows, `fp8_block_gemv_m1_r2_u2`
    /// (105.5% on the lm_head) above (`fp8_m1_ksplit_auto`, `fp8_m1_pdl_auto`); `m = 2..=8` ->
    /// `fp8_block_gemv_mma_n8`, `m = 9..=16` -> `fp8_block_gemv_mma_n16` (tensor cores, 47-94%). A caller that can
    /// lend a scratch buffer should call [`Gpu::fp8_block_gemv_with_scratch`], which at `m >= 2` converts the
    /// activations once per call and cuts the work for the shape (1.0-1.2x this table). A variant replaces an entry only where `kernels/bench/h200/bench_gemv.py` measures it faster ("Auto
    /// table candidates" in its output). An H200 sweep's m = 1 variants lost and were deleted: L2::256B prefetch
    /// hints 0.99-1.01x, split-K with atomics 0.83-1.01x, `cp.async.bulk` rings per warp 0.48-0.80x of this kernel.
    ///
    /// Persistent stream-K kernels (one wave of `SMs x B` blocks of 4 warps, the work cut into one equal contiguous
    /// range per warp, an S-stage `cp.async` ring per warp, partial sums by atomics) lost to this table at every
    /// shape and m (`benchmarks/h200.md`) and were deleted. CUDA cores, m = 1,
    /// 5120x17408: 25.19 us here (83.7% of copy) against `p4b4` 32.77, `p4b8` 32.02, `p8b4` 43.16, `p8b6` 37.52;
    /// 5120x10240: 16.32 against 21.99 (`p4b4`); lm_head 284 against 376-405. Tensor cores with preconverted
    /// activations (`pp3`, `pp6`): 0.45-0.72x of this table at m = 1, 4 and 16. From the SASS of that build
    /// (cuobjdump, instructions in the main loop per KiB of weights): the single-row items lost the two-row
    /// kernel's sharing of the activations, 257 against 133 here; the ring's bookkeeping (cursor, bounds guards,
    /// commit/wait, the atomics' branch) doubled the tensor-core loop, 128 against 66 for
    /// `fp8_block_gemv_mma_pre_n8`, both far under the ~300 per KiB that 85% of copy allows, so issue alone does
    /// not explain `pp*`'s 2x. Suspected, not measured: a static equal split cannot rebalance when some SMs stream
    /// slower (the block scheduler does that for the per-tile grids), and on the row-major FP8 layout a warp's
    /// 128-byte pieces of 16 rows lie far from its block neighbours' (a per-tile block reads 1 KiB of each row).
    #[allow(clippy::too_many_arguments)]
    fn fp8_block_gemv_with(
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
        check_fp8_gemv(OP, x, w, scales, y, m, n, k)?;
        let (ksplit, pdl) = match path {
            KernelPath::Auto => (fp8_m1_ksplit_auto(n), fp8_m1_pdl_auto(n)),
            _ => (1, false),
        };
        #[cfg(feature = "cuda")]
        {
            let tensor = match path {
                KernelPath::Auto => m > 1,
                KernelPath::CudaCores => false,
                KernelPath::TensorCores => true,
            };
            self.inner.fp8_block_gemv(
                tensor,
                ksplit,
                pdl,
                &x.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        no_cuda!(self, path, ksplit, pdl)
    }
    }

    /// The `m = 1` CUDA-core kernel of [`Gpu::fp8_block_gemv`] with K split over `ksplit` warps of a block
    /// (1, 2 or 4; `fp8_block_gemv_m1_r2_u2[_k{ksplit}]`), the partial sums added in shared memory in K order.
    /// Tests and the benchmark drive each split; `Auto` picks by `n` (`fp8_m1_ksplit_auto`).
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn fp8_block_gemv_m1_ksplit(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        n: usize,
        k: usize,
        ksplit: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemv_m1_ksplit";
        crate::ensure_shape!(
            matches!(ksplit, 1 | 2 | 4),
            OP,
            "ksplit must be 1, 2 or 4, got {ksplit}"
        );
        check_fp8_gemv(OP, x, w, scales, y, 1, n, k)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.fp8_block_gemv(
                false,
                ksplit,
                false,
                &x.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
                1,
                n,
                k,
            )
        }
        no_cuda!(self)
    }

    /// `y[m][n] = global_scale * sum_k x[m][k] * e2m1(w[n][k]) * e4m3(scales[n][k/16])` for decode
    /// (`1 <= m <= 16`), weight-only NVFP4 (modelopt layout).
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: `[n, k/2]` bytes, the even element in the low nibble; `scales`: e4m3
    /// `[n, k/16]`; `global_scale`: the checkpoint's `weight_scale_2`; `y`: fp32 `[m, n]`. Needs `k % 32 == 0`
    /// (a lane's 16-byte load is 32 values, two scale groups). Same as [`Gpu::nvfp4_gemv_with`] with
    /// [`KernelPath::Auto`], which takes the tensor cores at every `m` (faster than the CUDA cores at every
    /// shape measured on the H200, 1.04-1.22x at `m = 1`).
    ///
    /// This is the **no-repack** path: it reads the checkpoint layout as it is, so it suits weights used a few
    /// times (tests, one-off products) and needs no scratch. It is slower than the decode path an engine should
    /// use, [`Gpu::nvfp4_repack_tiles`] once at load then [`Gpu::nvfp4_gemv_tiles`] per call: 1.2-1.3x at
    /// `m = 1` and 1.7-1.9x at `m = 16` on the H200 (39-58% of copy bandwidth here against 48-86% there; the table
    /// is in [`Gpu::nvfp4_gemv_tiles`]).
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

    lab_pub! {
    /// [`Gpu::nvfp4_gemv`] on a chosen kernel family (tests and benchmarks drive each one).
    ///
    /// `Auto`'s table (H200, benchmarks/h200.md): `nvfp4_gemv_mma_n8` for `m <= 8`, `nvfp4_gemv_mma_n16`
    /// above (38-61% of copy bandwidth). The decode path of an engine is not this one but the repacked tile
    /// layout, [`Gpu::nvfp4_gemv_tiles`] (1.2-1.9x faster, table there).
    #[allow(clippy::too_many_arguments)]
    fn nvfp4_gemv_with(
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
        check_nvfp4_operands(OP, x, w, scales, global_scale, y, m, n, k)?;
        #[cfg(feature = "cuda")]
        {
            let tensor = !matches!(path, KernelPath::CudaCores);
            let dev = &self.inner;
            let (x, w, scales, y) = (&x.slice, &w.slice, &scales.slice, &mut y.slice);
            if tensor {
                let (name, _) = nvfp4_gemv_kernel(true, m, n);
                let f = dev.function(Module::Gemv, name)?;
                let cfg = mma_config(n);
                // SAFETY: matches `nvfp4_gemv_mma_n*` in cuda/gemv.cu; buffers checked by the caller as for the
                // CUDA-core kernel below; rows are guarded against n and k % 32 == 0 keeps every lane's 16-byte load
                // and 2-byte scale load inside its row.
                return unsafe { dev.launch_nvfp4(name, &f, cfg, x, w, scales, global_scale, y, [m, n, k]) };
            }
            // M = 1 on tall matrices uses two rows per warp so the activations cross L1 once per two weight rows
            // (with one row per warp L1 was 88% busy in Nsight Compute and DRAM 34%); on short ones (n < 16384) that
            // leaves too few warps, and one row per warp is faster (the H200 sweep's numbers: `kernels/NOTES.md`).
            let (name, rows_per_warp) = nvfp4_gemv_kernel(false, m, n);
            let f = dev.function(Module::Gemv, name)?;
            let cfg = gemv_config(n, rows_per_warp);
            // SAFETY: matches `nvfp4_gemv_m*` in cuda/gemv.cu; the caller checked x = [m, k], w = [n, k/2],
            // scales = [n, k/16], y = [m, n] and k % 32 == 0, so each lane's 16-byte weight load and 2-byte scale load
            // stay inside the row.
            unsafe { dev.launch_nvfp4(name, &f, cfg, x, w, scales, global_scale, y, [m, n, k]) }
        }
        no_cuda!(self, path)
    }
    }
}

/// NVFP4 weights in the decode GEMV's own layout: **the primary NVFP4 decode API** is to make one of these per
/// weight at load time ([`Gpu::nvfp4_repack_tiles`], one pass over the bytes, ~37 us for a 5120x17408 weight on the
/// H200; the same device memory as the checkpoint layout plus the padding of the last tile and chunk) and to
/// multiply with [`Gpu::nvfp4_gemv_tiles`] on every decode step ([`Gpu::nvfp4_gemv`] reads the checkpoint layout
/// directly, slower).
///
/// NVFP4 weights rearranged once (at load time) by [`Gpu::nvfp4_repack_tiles`] into the layout of the tensor-core
/// GEMV's tiles (`nvfp4_repack_mma` in `cuda/gemv.cu`): for each 16-row tile and 128-value chunk, the 1 KiB of
/// weights in the order the warp's lanes load them (two coalesced 512-byte loads) and one 32-bit word of group
/// scales per lane; rows past `n` and values past `k` are zeros, so the kernel needs no bounds checks.
/// [`Gpu::nvfp4_gemv_tiles`] multiplies with it.
pub struct Nvfp4TileWeights {
    w: GpuBuffer<u8>,
    scales: GpuBuffer<u32>,
    n: usize,
    k: usize,
}

impl std::fmt::Debug for Nvfp4TileWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvfp4TileWeights")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("device_bytes", &self.device_bytes())
            .finish()
    }
}

impl Nvfp4TileWeights {
    /// The device buffers, in a fixed order: what [`Gpu::stash`] copies to the host and
    /// [`crate::cuda::CopyStream::fill`] refills.
    pub fn buffers(&self) -> Vec<super::WeightBuf<'_>> {
        vec![
            super::WeightBuf::U8(&self.w),
            super::WeightBuf::U32(&self.scales),
        ]
    }

    /// [`Nvfp4TileWeights::buffers`], to refill.
    pub fn buffers_mut(&mut self) -> Vec<super::WeightBufMut<'_>> {
        vec![
            super::WeightBufMut::U8(&mut self.w),
            super::WeightBufMut::U32(&mut self.scales),
        ]
    }

    /// Output rows of the weight matrix.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inner dimension (values per row).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes on the device (weights and scales; the padding of the last tile and chunk included).
    pub fn device_bytes(&self) -> usize {
        self.w.len() + 4 * self.scales.len()
    }
}

/// FP8 weights rearranged once (at load time) by [`Gpu::fp8_repack_tiles`] into the layout of the tensor-core GEMV's
/// tiles (`fp8_repack_mma` in `cuda/gemv.cu`): for each 16-row tile and 128-value chunk, the 2 KiB of e4m3 codes in
/// the order the warp's lanes load them (four contiguous 512-byte loads, where the checkpoint layout gives each load
/// 8 rows x 4 pieces of 16 bytes); rows past `n` and values past `k` are zeros. The block scales are not part of it:
/// the GEMV takes the checkpoint's. [`Gpu::fp8_gemv_tiles_split`] multiplies with it.
pub struct Fp8TileWeights {
    w: GpuBuffer<u8>,
    n: usize,
    k: usize,
}

impl std::fmt::Debug for Fp8TileWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fp8TileWeights")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("device_bytes", &self.w.len())
            .finish()
    }
}

impl Fp8TileWeights {
    /// The device buffers (the tiles; the block scales are the caller's buffer), as
    /// [`Nvfp4TileWeights::buffers`].
    pub fn buffers(&self) -> Vec<super::WeightBuf<'_>> {
        vec![super::WeightBuf::U8(&self.w)]
    }

    /// [`Fp8TileWeights::buffers`], to refill.
    pub fn buffers_mut(&mut self) -> Vec<super::WeightBufMut<'_>> {
        vec![super::WeightBufMut::U8(&mut self.w)]
    }

    /// Output rows of the weight matrix.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inner dimension (values per row).
    pub fn k(&self) -> usize {
        self.k
    }
}

/// The pair order of a decode GEMV's activation fragments: the format whose weights the fragments meet in the
/// `mma` ([`Fp8Order`]: consecutive values; [`Nvfp4Order`]: values `a` and `a + 4` of each 8, as the e2m1 decode
/// yields them). A type parameter, so a GEMV of one format cannot be handed the other's fragments.
pub trait FragmentOrder: sealed_order::Sealed {
    /// The format, for messages.
    const FORMAT: &'static str;
    /// The producers' kernels in `cuda/ops.cu`: rmsnorm, add + rmsnorm, silu * up, gelu * up, cast.
    #[doc(hidden)]
    const KERNELS: [&'static str; 5];
}

mod sealed_order {
    pub trait Sealed {}
    impl Sealed for super::Fp8Order {}
    impl Sealed for super::Nvfp4Order {}
}

/// [`FragmentOrder`] of the FP8 decode GEMV ([`Gpu::fp8_gemv_tiles_fragments`]).
#[derive(Debug)]
pub enum Fp8Order {}
/// [`FragmentOrder`] of the NVFP4 decode GEMV ([`Gpu::nvfp4_gemv_tiles_fragments`]).
#[derive(Debug)]
pub enum Nvfp4Order {}

impl FragmentOrder for Fp8Order {
    const FORMAT: &'static str = "FP8";
    const KERNELS: [&'static str; 5] = [
        "rmsnorm_frag_fp8",
        "add_rmsnorm_frag_fp8",
        "silu_and_mul_frag_fp8",
        "gelu_and_mul_frag_fp8",
        "cast_frag_fp8",
    ];
}
impl FragmentOrder for Nvfp4Order {
    const FORMAT: &'static str = "NVFP4";
    const KERNELS: [&'static str; 5] = [
        "rmsnorm_frag_nvfp4",
        "add_rmsnorm_frag_nvfp4",
        "silu_and_mul_frag_nvfp4",
        "gelu_and_mul_frag_nvfp4",
        "cast_frag_nvfp4",
    ];
}

/// A decode GEMV's activation fragments as a producer wrote them ([`Gpu::rmsnorm_fp8_fragments`],
/// [`Gpu::silu_and_mul_fp8_fragments`], [`Gpu::rmsnorm_nvfp4_fragments`], ...) for the GEMV of the same format
/// ([`Gpu::fp8_gemv_tiles_fragments`], [`Gpu::nvfp4_gemv_tiles_fragments`]): a buffer of f16 `mma` fragments plus
/// the `m` and `k` they were written for, because their layout depends on both (8 tokens per fragment tile,
/// 128-value chunks) and a GEMV reading them for another shape would multiply garbage. Reusable across calls: each
/// producer call records its shape, each GEMV call checks it.
pub struct GemvFragments<O: FragmentOrder> {
    buf: GpuBuffer<u32>,
    written: Option<(usize, usize)>,
    order: std::marker::PhantomData<O>,
}

/// The FP8 decode GEMV's fragments.
pub type Fp8Fragments = GemvFragments<Fp8Order>;
/// The NVFP4 decode GEMV's fragments.
pub type Nvfp4Fragments = GemvFragments<Nvfp4Order>;

impl<O: FragmentOrder> std::fmt::Debug for GemvFragments<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemvFragments")
            .field("format", &O::FORMAT)
            .field("words", &self.buf.len())
            .field("written_m_k", &self.written)
            .finish()
    }
}

impl<O: FragmentOrder> GemvFragments<O> {
    /// Wraps a device buffer (any contents, at least [`Gpu::gemv_scratch_len`]`(m, k)` words for the largest
    /// `m` and `k` it will hold; a producer checks its length) as not yet written.
    pub fn new(buf: GpuBuffer<u32>) -> Self {
        GemvFragments {
            buf,
            written: None,
            order: std::marker::PhantomData,
        }
    }

    /// The `(m, k)` of the last producer call, `None` before the first.
    pub fn written(&self) -> Option<(usize, usize)> {
        self.written
    }

    /// The producer's side: the buffer to write after checking its length for `m` x `k`, recorded as written
    /// for them (the caller launches the write right after, on the same stream).
    pub(in crate::cuda) fn for_write(
        &mut self,
        op: &'static str,
        m: usize,
        k: usize,
    ) -> Result<&mut GpuBuffer<u32>, KernelError> {
        check_scratch(op, &self.buf, m, k)?;
        self.written = Some((m, k));
        Ok(&mut self.buf)
    }

    /// The GEMV's side: the buffer, if it holds fragments of exactly `m` x `k`.
    fn for_read(
        &self,
        op: &'static str,
        m: usize,
        k: usize,
    ) -> Result<&GpuBuffer<u32>, KernelError> {
        crate::ensure_shape!(
            self.written == Some((m, k)),
            op,
            "the fragments hold {}, the GEMV needs m = {m}, k = {k}",
            match self.written {
                Some((wm, wk)) => format!("m = {wm}, k = {wk}"),
                None => "nothing yet (no producer call)".to_string(),
            }
        );
        Ok(&self.buf)
    }
}

/// The tile-layout NVFP4 decode path ([`Gpu::nvfp4_repack_tiles`] + [`Gpu::nvfp4_gemv_tiles`], what an engine
/// uses), the scratch-taking FP8 entry ([`Gpu::fp8_block_gemv_with_scratch`]) and the variant entry points of
/// issue 4 (decode GEMVs on the H200): each variant is timed
/// by `kernels/bench/h200/bench_gemv.py` against the kernels `Auto` picks and checked by the tests against the
/// reference; `Auto` takes one only once a measurement says so.
impl Gpu {
    /// `u32` words of the activation scratch that [`Gpu::nvfp4_gemv_tiles`], [`Gpu::fp8_block_gemv_with_scratch`],
    /// [`Gpu::fp8_block_gemv_preconverted`] and [`Gpu::nvfp4_gemv_preconverted`] need for `m` rows of `k` values:
    /// the f16 B fragments of `ceil(k/128)` chunks x one (m <= 8) or two 8-token tiles, 2 KiB each. One buffer of
    /// `gemv_scratch_len(16, k_max)` words serves every call of a model (32 bytes per `k`: 544 KiB at k = 17408).
    pub fn gemv_scratch_len(m: usize, k: usize) -> usize {
        // Saturating: a `k` past any real model answers a length no buffer has, never a wrapped one.
        k.div_ceil(128)
            .saturating_mul(if m <= 8 { 1 } else { 2 })
            .saturating_mul(512)
    }

    /// [`Gpu::fp8_block_gemv`] on the tensor cores with the activations converted once per call (one small
    /// kernel, `gemv_act_frag_fp8`) to f16 in `mma` fragment order into `scratch` (at least
    /// [`Gpu::gemv_scratch_len`] words, contents ignored), so the GEMV's lanes load their B fragments instead of
    /// converting 32 activations per token tile for every weight tile.
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn fp8_block_gemv_preconverted(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.fp8_block_gemv_split(x, w, scales, y, scratch, m, n, k, MmaSplit::ONE_TILE)
    }

    /// [`Gpu::fp8_block_gemv_preconverted`] cut as `split` says ([`MmaSplit`]): `split.warps` warps per block share
    /// a 16-row tile's K chunks and `split.splits` blocks of one thread-block cluster each take a contiguous share
    /// of them, their sums added in distributed shared memory in rank order (the same bits on
    /// every run); `split.pdl` launches the conversion and the GEMV as programmatic dependents. Tests and the
    /// benchmark drive each cut; `with_scratch`'s `Auto` picks one by shape (`fp8_split_auto`).
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn fp8_block_gemv_split(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        n: usize,
        k: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemv_split";
        check_fp8_gemv(OP, x, w, scales, y, m, n, k)?;
        check_scratch(OP, scratch, m, k)?;
        split.check(OP)?;
        self.fp8_split_launch(x, w, scales, y, scratch, m, n, k, split)
    }

    /// After the checks: `Device::mma_split_gemv` for FP8.
    #[allow(clippy::too_many_arguments)]
    fn fp8_split_launch(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        n: usize,
        k: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.mma_split_gemv(
                SplitFormat::Fp8,
                split,
                Activations::Convert(&x.slice, &mut scratch.slice),
                &w.slice,
                &scales.slice,
                1.0,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        no_cuda!(self, x, w, scales, y, scratch, m, n, k, split)
    }

    /// [`Gpu::nvfp4_gemv`] on the tensor cores (checkpoint layout) with the activations converted once per call
    /// into `scratch` (at least [`Gpu::gemv_scratch_len`] words), as [`Gpu::fp8_block_gemv_preconverted`].
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn nvfp4_gemv_preconverted(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_preconverted";
        check_gemv_dims(OP, m, n, k, 32)?;
        check_nvfp4_operands(OP, x, w, scales, global_scale, y, m, n, k)?;
        check_scratch(OP, scratch, m, k)?;
        #[cfg(feature = "cuda")]
        {
            // NVFP4 in the checkpoint layout, activations converted first (`gemv_act_frag_nvfp4` +
            // `nvfp4_gemv_mma_pre_n*`).
            let dev = &self.inner;
            let (x, xf, w, scales, y) = (
                &x.slice,
                &mut scratch.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
            );
            let (nt, name) = if m <= 8 {
                (1, "nvfp4_gemv_mma_pre_n8")
            } else {
                (2, "nvfp4_gemv_mma_pre_n16")
            };
            dev.gemv_act_frag(true, true, x, xf, m, k, nt)?;
            let f = dev.function(Module::Gemv, name)?;
            let cfg = mma_config(n);
            // SAFETY: matches `nvfp4_gemv_mma_pre_n*`; xf was just written for this m, k and nt; w, scales, y checked
            // by the caller as for `nvfp4_gemv_mma_n*` (k % 32 == 0).
            unsafe { dev.launch_nvfp4(name, &f, cfg, &*xf, w, scales, global_scale, y, [m, n, k]) }
        }
        no_cuda!(self)
    }

    /// Rearranges NVFP4 weights (`w`: `[n, k/2]`, `scales`: e4m3 `[n, k/16]`, as [`Gpu::nvfp4_gemv`]) into the
    /// tile layout of [`Nvfp4TileWeights`], on the device, once per weight (one pass over the bytes).
    /// Needs `k % 32 == 0`.
    pub fn nvfp4_repack_tiles(
        &self,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        n: usize,
        k: usize,
    ) -> Result<Nvfp4TileWeights, KernelError> {
        const OP: &str = "cuda::nvfp4_repack_tiles";
        check_gemv_dims(OP, 1, n, k, 32)?;
        check_len_of(OP, "w", w.len(), &[n, k / 2])?;
        check_len_of(OP, "scales", scales.len(), &[n, k / 16])?;
        let tiles = [n.div_ceil(16), k.div_ceil(128)];
        let mut wr = self.zeros::<u8>(checked_product(
            OP,
            "tiles*1024",
            &[tiles[0], tiles[1], 1024],
        )?)?;
        let mut sr =
            self.zeros::<u32>(checked_product(OP, "tiles*32", &[tiles[0], tiles[1], 32])?)?;
        #[cfg(feature = "cuda")]
        {
            // `nvfp4_repack_mma`: checkpoint layout -> tile layout (cuda/gemv.cu documents it).
            let dev = &self.inner;
            let (w, scales, wr, sr) = (&w.slice, &scales.slice, &mut wr.slice, &mut sr.slice);
            const NAME: &str = "nvfp4_repack_mma";
            let f = dev.function(Module::Gemv, NAME)?;
            let cfg = repack_config(NAME, n.div_ceil(16) * k.div_ceil(128) * 64)?;
            let (ni, ki) = (n as i32, k as i32);
            // SAFETY: matches `nvfp4_repack_mma`; the caller checked w = [n, k/2], scales = [n, k/16], k % 32 == 0
            // (every 16-byte and 2-byte load is whole and aligned inside its row; rows >= n and k0 >= k are not read),
            // wr = ceil(n/16) * ceil(k/128) * 1024 bytes and sr = ceil(n/16) * ceil(k/128) * 32 words, exactly what
            // the threads (one per 16 output bytes, the rest return) write.
            unsafe {
                dev.launch_args(NAME, &f, cfg, |b| {
                    b.arg(w).arg(scales).arg(wr).arg(sr).arg(&ni).arg(&ki);
                })
            }?;
        }
        #[cfg(not(feature = "cuda"))]
        let _ = (&mut wr, &mut sr);
        Ok(Nvfp4TileWeights {
            w: wr,
            scales: sr,
            n,
            k,
        })
    }

    /// Rearranges FP8 e4m3 weights `w` `[n, k]` (`k % 16 == 0`) into the tile layout of the tensor-core GEMV
    /// ([`Fp8TileWeights`]), once at load time; the block scales stay as they are.
    pub fn fp8_repack_tiles(
        &self,
        w: &GpuBuffer<u8>,
        n: usize,
        k: usize,
    ) -> Result<Fp8TileWeights, KernelError> {
        const OP: &str = "cuda::fp8_repack_tiles";
        check_gemv_dims(OP, 1, n, k, 16)?;
        check_len_of(OP, "w", w.len(), &[n, k])?;
        let len = checked_product(OP, "tiles*2048", &[n.div_ceil(16), k.div_ceil(128), 2048])?;
        let mut wr = self.zeros::<u8>(len)?;
        #[cfg(feature = "cuda")]
        {
            // `fp8_repack_mma`: FP8 checkpoint layout -> tile layout (cuda/gemv.cu documents it).
            let dev = &self.inner;
            let (w, wr) = (&w.slice, &mut wr.slice);
            const NAME: &str = "fp8_repack_mma";
            let f = dev.function(Module::Gemv, NAME)?;
            let cfg = repack_config(NAME, n.div_ceil(16) * k.div_ceil(128) * 128)?;
            let (ni, ki) = (n as i32, k as i32);
            // SAFETY: matches `fp8_repack_mma(w, wr, n, k)`; the caller checked w = [n, k] with k % 16 == 0 (every
            // 16-byte load is whole and aligned inside its row; rows >= n and values >= k are not read) and
            // wr = ceil(n/16) * ceil(k/128) * 2048 bytes, exactly what the threads (one per 16 output bytes, the rest
            // return) write.
            unsafe {
                dev.launch_args(NAME, &f, cfg, |b| {
                    b.arg(w).arg(wr).arg(&ni).arg(&ki);
                })
            }?;
        }
        #[cfg(not(feature = "cuda"))]
        let _ = &mut wr;
        Ok(Fp8TileWeights { w: wr, n, k })
    }

    /// `y[m][n] = x[m][k] . W[n][k]` with the 128x128 block `scales` (as [`Gpu::fp8_block_gemv`]) over FP8
    /// weights in the tile layout ([`Gpu::fp8_repack_tiles`], once at load), on the tensor cores, `1 <= m <= 16`:
    /// **the FP8 decode GEMV** for an engine that repacks. `scratch` (at least [`Gpu::gemv_scratch_len`]`(m, k)`
    /// words, contents ignored) receives the activations as `mma` fragments where the table converts them once per
    /// call. The cut, by shape (`fp8_tiles_auto`), from an H200 sweep (us and fraction
    /// of copy, m = 1 / 4 / 16):
    ///
    /// | shape (n x k) | m = 1 | m = 4 | m = 16 | checkpoint layout (`fp8_block_gemv_with_scratch`) |
    /// |---|---|---|---|---|
    /// | 5120 x 17408 | 21.45 (99%) | 24.9 (85%) | 25.8 (82%) | 22.7 (93%) / 29.6 / 33.5 |
    /// | 17408 x 5120 | 23.13 (92%) | 23.9 (88%) | 25.8 (83%) | 24.3 (88%) / 29.3 / 34.7 |
    /// | 5120 x 10240 | 13.31 (94%) | 16.0 (78%) | 17.0 (74%) | 13.5 (93%) / 20.2 / 21.8 |
    /// | 248320 x 5120 | 277.7 (109%) | 292.9 (103%) | 325.0 (94%) | 279.4 (109%) / 318.1 / 385.3 |
    ///
    /// Why the layout matters: in the checkpoint layout each 16-byte load of a warp covers 8 rows x 4 pieces of
    /// 16 bytes 32 bytes apart (half of every 32-byte sector of 8 lines); in the tile layout each load is one
    /// contiguous 512-byte run. The tensor-core kernels add the same products in the same order as on the
    /// checkpoint layout (same bits, [`Gpu::fp8_gemv_tiles_split`]); `m = 1` runs a CUDA-core kernel over the
    /// tiles ([`Gpu::fp8_gemv_tiles_m1`]), faster than either layout's other kernels.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_gemv_tiles(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_gemv_tiles";
        self.fp8_tiles_checked(OP, Some(x), tiles, scales, y, Some(&*scratch), m)?;
        let (split, kernel) = fp8_tiles_auto(m, tiles.n);
        match kernel {
            Fp8TileKernel::CudaCoresM1 => self.fp8_tiles_m1_launch(x, tiles, scales, y, split),
            Fp8TileKernel::Preconverted => {
                self.fp8_tiles_launch(x, tiles, scales, y, scratch, m, split)
            }
            Fp8TileKernel::Converting => {
                self.fp8_tiles_converting_launch(x, tiles, scales, y, m, split)
            }
        }
    }

    /// [`Gpu::fp8_gemv_tiles`] on activation fragments already written by [`Gpu::rmsnorm_fp8_fragments`] or
    /// [`Gpu::silu_and_mul_fp8_fragments`] for the same `m` and `k` (checked: [`Fp8Fragments`]; read, not written; the bits are those of [`Gpu::fp8_gemv_tiles_split`] on
    /// the norm's bf16 output with the same cut): the decode GEMV without its fragment kernel. The cut, from the
    /// same H200 sweeps as `fp8_tiles_auto`'s preconverted entries: 8 warps x 2 blocks per tile up to 8192 rows,
    /// above 4 x 1 at m >= 9 and 8 x 1 at m <= 8. Where [`Gpu::fp8_gemv_tiles`] runs a kernel that reads bf16 x
    /// itself (m = 1 on the CUDA cores; m <= 8 on 8193..65535 rows, converting in the GEMV), that path stays
    /// faster. On the H200, m = 16, this kernel alone against `fp8_gemv_tiles`' fragment kernel + the same GEMV: 23.57
    /// against 25.65 us on 5120x17408, 24.64 against 25.42 on 17408x5120, 15.45 against 17.05 on 5120x10240.
    /// On the H200, the decode step norm + GEMV, `rmsnorm_fp8_fragments` + this against `rmsnorm` + fragment kernel +
    /// the same GEMV (same bits), m = 4 / 16: 25.38 / 25.57 against 30.84 / 31.15 us on 5120x17408 (1.22x), 26.85 /
    /// 26.91 against 27.43 / 27.64 on 17408x5120, 16.26 / 16.80 against 20.57 / 20.92 on 5120x10240 (1.24-1.27x),
    /// 288.2 / 332.1 against 290.6 / 333.9 on the lm_head.
    pub fn fp8_gemv_tiles_fragments(
        &self,
        fragments: &Fp8Fragments,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_gemv_tiles_fragments";
        self.fp8_tiles_checked(OP, None, tiles, scales, y, None, m)?;
        let (n, k) = (tiles.n, tiles.k);
        let fragments = fragments.for_read(OP, m, k)?;
        let split = MmaSplit::fp8_fragments(m, n);
        #[cfg(feature = "cuda")]
        {
            self.inner.mma_split_gemv(
                SplitFormat::Fp8Tile,
                split,
                Activations::Fragments(&fragments.slice),
                &tiles.w.slice,
                &scales.slice,
                1.0,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        no_cuda!(self, fragments, scales, y, split)
    }

    /// [`Gpu::fp8_gemv_tiles`]'s kernel for one token (`m = 1`) on the CUDA cores (`fp8_gemv_tile_m1_w*c*`: each
    /// lane multiplies its 64 weights with the bf16 activations itself, no scratch), cut as `split` says (any of
    /// [`MmaSplit::BUILT`]). Tests and the benchmark drive each cut.
    #[cfg(feature = "lab")]
    pub fn fp8_gemv_tiles_m1(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_gemv_tiles_m1";
        self.fp8_tiles_checked(OP, Some(x), tiles, scales, y, None, 1)?;
        split.check(OP)?;
        self.fp8_tiles_m1_launch(x, tiles, scales, y, split)
    }

    /// After the checks: `Device::fp8_tile_gemv_m1`.
    fn fp8_tiles_m1_launch(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            // The FP8 tile-layout GEMV for one token on the CUDA cores (`fp8_gemv_tile_m1_w*c*`: each lane multiplies
            // its weights with the bf16 activations itself; no fragment kernel, no scratch), cut as `split` says,
            // launched as a programmatic dependent when `split.pdl`.
            let dev = &self.inner;
            let (x, w, scales, y, n, k) = (
                &x.slice,
                &tiles.w.slice,
                &scales.slice,
                &mut y.slice,
                tiles.n,
                tiles.k,
            );
            let name = fp8_tile_m1_kernel(split).ok_or_else(|| {
                KernelError::Cuda(format!(
                    "no m = 1 FP8 tile GEMV build with {} warps and {} splits",
                    split.warps, split.splits
                ))
            })?;
            // SAFETY: matches `fp8_gemv_tile_m1_w*c*(x, wr, scales, y, n, k)` in cuda/gemv.cu; the caller checked
            // x = [1, k] with k % 16 == 0 (each lane's two 16-value activation pieces are whole inside the row or
            // skipped), w the tile layout of exactly n x k (block (b, s) reads tile b only), scales =
            // [ceil(n/128), ceil(k/128)] and y = [1, n]; grid.y equals the build's cluster size; stores are guarded
            // against n; the kernel reads x and writes y only after its pdl_wait (weights may be read before it).
            unsafe { dev.launch_tile_gemv(name, split, x, w, scales, y, None, n, k) }
        }
        no_cuda!(self, x, tiles, scales, y, split)
    }

    /// [`Gpu::fp8_gemv_tiles`]'s kernels that convert the activations themselves (no fragment kernel, no
    /// scratch), cut as `split` says: 8 warps x 1 or 2 blocks per tile, or 4 warps x 1 (the builds the sweep
    /// kept). The same bits as [`Gpu::fp8_gemv_tiles_split`] with the same cut.
    #[cfg(feature = "lab")]
    pub fn fp8_gemv_tiles_converting(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_gemv_tiles_converting";
        self.fp8_tiles_checked(OP, Some(x), tiles, scales, y, None, m)?;
        crate::ensure_shape!(
            MmaSplit::BUILT_CONVERTING.contains(&(split.warps, split.splits)),
            OP,
            "the converting FP8 tile GEMV is built for (warps, splits) (8, 1), (8, 2) and (4, 1), got ({}, {})",
            split.warps,
            split.splits
        );
        self.fp8_tiles_converting_launch(x, tiles, scales, y, m, split)
    }

    /// The operand checks of the FP8 tile GEMVs.
    #[allow(clippy::too_many_arguments)]
    fn fp8_tiles_checked(
        &self,
        op: &'static str,
        x: Option<&GpuBuffer<u16>>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &GpuBuffer<f32>,
        scratch: Option<&GpuBuffer<u32>>,
        m: usize,
    ) -> Result<(), KernelError> {
        let (n, k) = (tiles.n, tiles.k);
        check_gemv_dims(op, m, n, k, 16)?;
        if let Some(x) = x {
            check_len_of(op, "x", x.len(), &[m, k])?;
        }
        check_len_of(op, "y", y.len(), &[m, n])?;
        check_len_of(
            op,
            "scales",
            scales.len(),
            &[n.div_ceil(128), k.div_ceil(128)],
        )?;
        if let Some(s) = scratch {
            check_scratch(op, s, m, k)?;
        }
        Ok(())
    }

    /// After the checks: `Device::fp8_tile_gemv_converting`.
    fn fp8_tiles_converting_launch(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            // The FP8 tile-layout GEMV converting its own activations from bf16 `x` (`fp8_gemv_mma_tile_n*_w*c*`: no
            // fragment kernel, no scratch), cut as `split` says (one of `MmaSplit::BUILT_CONVERTING`), launched as a
            // programmatic dependent when `split.pdl`.
            let dev = &self.inner;
            let (x, w, scales, y, n, k) = (
                &x.slice,
                &tiles.w.slice,
                &scales.slice,
                &mut y.slice,
                tiles.n,
                tiles.k,
            );
            let name = fp8_tile_converting_kernel(m, split).ok_or_else(|| {
                KernelError::Cuda(format!(
                    "no converting FP8 tile GEMV build with {} warps and {} splits",
                    split.warps, split.splits
                ))
            })?;
            // SAFETY: matches `fp8_gemv_mma_tile_n*_w*c*(x, wr, scales, y, m, n, k)` in cuda/gemv.cu; the caller
            // checked x = [m, k] with k % 16 == 0 (activation loads are guarded against m and k), w the tile layout of
            // exactly n x k (ceil(n/16) * ceil(k/128) * 2048 bytes; block (b, s) reads tile b only), scales =
            // [ceil(n/128), ceil(k/128)] and y = [m, n]; grid.y equals the build's cluster size; stores are guarded
            // against m and n; the kernel reads x and writes y only after its pdl_wait.
            unsafe { dev.launch_tile_gemv(name, split, x, w, scales, y, Some(m), n, k) }
        }
        no_cuda!(self, x, tiles, scales, y, m, split)
    }

    /// [`Gpu::fp8_block_gemv_split`] over FP8 weights in the tile layout ([`Gpu::fp8_repack_tiles`]) with the
    /// checkpoint's block `scales` (`[ceil(n/128), ceil(k/128)]`): the same products added in the same order, so
    /// the same bits as [`Gpu::fp8_block_gemv_split`] with the same `split`.
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn fp8_gemv_tiles_split(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_gemv_tiles_split";
        self.fp8_tiles_checked(OP, Some(x), tiles, scales, y, Some(&*scratch), m)?;
        split.check(OP)?;
        self.fp8_tiles_launch(x, tiles, scales, y, scratch, m, split)
    }

    /// After the checks: `Device::mma_split_gemv` over the FP8 tile layout.
    #[allow(clippy::too_many_arguments)]
    fn fp8_tiles_launch(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Fp8TileWeights,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        let (n, k) = (tiles.n, tiles.k);
        #[cfg(feature = "cuda")]
        {
            self.inner.mma_split_gemv(
                SplitFormat::Fp8Tile,
                split,
                Activations::Convert(&x.slice, &mut scratch.slice),
                &tiles.w.slice,
                &scales.slice,
                1.0,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        no_cuda!(self, x, scales, y, scratch, m, n, k, split)
    }

    /// `y[m][n] = global_scale * x[m][k] . W[n][k]` over NVFP4 weights in the tile layout (the same product as
    /// [`Gpu::nvfp4_gemv`] on the same weights before [`Gpu::nvfp4_repack_tiles`]), on the tensor cores,
    /// `1 <= m <= 16`: **the NVFP4 decode GEMV**. An engine repacks each NVFP4 weight once at load
    /// ([`Gpu::nvfp4_repack_tiles`]) and calls this per token; `scratch` (at least [`Gpu::gemv_scratch_len`]`(m, k)`
    /// words, contents ignored, reusable across calls and weights) receives the activations converted once per
    /// call to f16 `mma` fragments. Nothing is allocated per call.
    ///
    /// The kernel is chosen by `m` (and the shape) from the H200 measurements of `kernels/bench/h200/bench_gemv.py`
    /// (`benchmarks/h200.md`): activations preconverted at every `m`, one
    /// chunk in flight per warp, no K split:
    ///
    /// | shape (n x k) | m = 1 | m = 4 | m = 16 | checkpoint layout, `Auto`, m = 1 / 4 / 16 |
    /// |---|---|---|---|---|
    /// | 5120 x 17408 | 21.9 us, 54% of copy | 22.1 us, 54% | 25.1 us, 48% | 28.8 / 29.1 / 44.0 us |
    /// | 17408 x 5120 | 18.6 us, 64% | 18.8 us, 64% | 23.9 us, 51% | 24.2 / 24.4 / 40.2 us |
    /// | 5120 x 10240 | 14.6 us, 48% | 14.7 us, 48% | 16.4 us, 43% | 18.0 / 18.1 / 27.4 us |
    /// | 248320 x 5120 (lm_head) | 197 us, 86% | 222 us, 77% | 312 us, 56% | 292 / 306 / 578 us |
    ///
    /// (Measured with the `nvfp4_gemv_mma_tile_pre_*` kernels, which this runs with one K split.) Since then:
    /// two K splits (`nvfp4_gemv_tiles_n8_u1`, same arithmetic, bit for bit with one split) at m <= 8 on
    /// n <= 8192, 19.2 / 13.0 us at m = 1; the table is in `nvfp4_tiles_auto`. Since a later change (the
    /// tile layout's bits reordered for a cheaper decode; the m = 1 kernel on up to 8192 rows),
    /// m = 1: 15.2-15.5 / 15.4-15.7 / 10.0-10.3 / 170-175 us on the four shapes above (77-79 / 76-77 / 68-70 /
    /// 97-100% of copy), the tables in `nvfp4_tiles_auto`.
    pub fn nvfp4_gemv_tiles(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
    ) -> Result<(), KernelError> {
        let (kernel, splits) = nvfp4_tiles_auto(m, tiles.n());
        self.tiles_launch(
            "cuda::nvfp4_gemv_tiles",
            kernel,
            x,
            tiles,
            global_scale,
            y,
            Some(scratch),
            m,
            splits,
        )
    }

    /// [`Gpu::nvfp4_gemv_tiles`] on activation fragments already written by [`Gpu::rmsnorm_nvfp4_fragments`],
    /// [`Gpu::silu_and_mul_nvfp4_fragments`] or [`Gpu::gelu_and_mul_nvfp4_fragments`] for the same `m` and `k`
    /// (checked: [`Nvfp4Fragments`]; read, not written): the NVFP4 decode GEMV without its fragment kernel. The
    /// kernel is [`Gpu::nvfp4_gemv_tiles`]' choice where that one writes y whole; where it adds two K splits into a
    /// y its fragment kernel zeroed (m <= 8 on up to 8192 rows), the same split runs as one thread-block cluster
    /// (at m = 1 `nvfp4_gemv_tiles_m1_w8c2`), which needs no zeroing and gives the same bits on every run. (The
    /// steps [`Gpu::rmsnorm_nvfp4_gemv`], [`Gpu::silu_and_mul_nvfp4_gemv`] run producer and GEMV in one call and
    /// have the producer zero y, so they keep `Auto`'s atomic split: call one for the first GEMV on an input, this
    /// for the others on the same fragments.)
    /// Not bit for bit with [`Gpu::nvfp4_gemv_tiles`] there (the halves meet in another order), the same precision
    /// class. Measured (`benchmarks/h200.md`, producer + this against `rmsnorm` / `silu_and_mul` +
    /// [`Gpu::nvfp4_gemv_tiles`]): 1.09-1.36x on the layer shapes at m = 1, 1.02-1.32x at m = 4, 1.01-1.24x at
    /// m = 16, the same on the lm_head.
    pub fn nvfp4_gemv_tiles_fragments(
        &self,
        fragments: &Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_tiles_fragments";
        check_nvfp4_fragments_gemv(OP, tiles, global_scale, y, m)?;
        let kernel = nvfp4_fragments_cut(m, tiles.n);
        self.nvfp4_fragments_launch(OP, fragments, tiles, global_scale, y, m, kernel, 1)
    }

    /// The NVFP4 tile GEMV on `fragments` (checked to hold `m` x `tiles.k`) with `kernel` and `splits` (more than
    /// one only for `Split` / `M1` after a producer that zeroed y); the other operands checked by the caller
    /// (`check_nvfp4_fragments_gemv`).
    #[allow(clippy::too_many_arguments)]
    fn nvfp4_fragments_launch(
        &self,
        op: &'static str,
        fragments: &Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
        kernel: TilesKernel,
        splits: usize,
    ) -> Result<(), KernelError> {
        let fragments = fragments.for_read(op, m, tiles.k)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.nvfp4_gemv_tiles_fragments(
                kernel,
                splits,
                &fragments.slice,
                &tiles.w.slice,
                &tiles.scales.slice,
                global_scale,
                &mut y.slice,
                m,
                tiles.n,
                tiles.k,
            )
        }
        no_cuda!(self, fragments, y, global_scale, kernel, splits)
    }

    /// The NVFP4 decode step from the norm: [`Gpu::rmsnorm_nvfp4_fragments`] (with or without `residual`) into
    /// `fragments`, then [`Gpu::nvfp4_gemv_tiles`]' own kernel on them into `y` (`[m, n]`: `m` the rows of `x`,
    /// the norm's dim the GEMV's `k`), two launches. Where that kernel adds two K splits into `y` (m <= 8 on up to
    /// 8192 rows, `nvfp4_tiles_auto`), the norm's launch zeroes `y` as well, which a producer called apart cannot
    /// do for [`Gpu::nvfp4_gemv_tiles_fragments`] (that one runs a cluster build there, 5% slower alone). So `y`
    /// is bit for bit [`Gpu::rmsnorm`] + [`Gpu::nvfp4_gemv_tiles`]' (the same fragments, the same kernel), the
    /// same on every run, and the fragments stay written for the other GEMVs of the same input, which take
    /// [`Gpu::nvfp4_gemv_tiles_fragments`]. Everything is checked before the first launch.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_nvfp4_gemv(
        &self,
        x: &GpuBuffer<f32>,
        residual: Option<&mut GpuBuffer<f32>>,
        weight: &GpuBuffer<f32>,
        form: crate::shapes::NormWeight,
        eps: f32,
        fragments: &mut Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        let producer = StepProducer::Norm {
            x,
            residual,
            weight,
            form,
            eps,
        };
        self.nvfp4_step(
            "cuda::rmsnorm_nvfp4_gemv",
            producer,
            fragments,
            tiles,
            global_scale,
            y,
        )
    }

    /// The NVFP4 decode step's down projection: [`Gpu::silu_and_mul_nvfp4_fragments`] of `gate_up` (`[m, 2k]`,
    /// `k` the GEMV's) into `fragments`, then the GEMV into `y`, as [`Gpu::rmsnorm_nvfp4_gemv`] (the activation's
    /// launch zeroes `y` where the GEMV adds K splits into it; bit for bit [`Gpu::silu_and_mul`] +
    /// [`Gpu::nvfp4_gemv_tiles`]).
    pub fn silu_and_mul_nvfp4_gemv(
        &self,
        gate_up: &GpuBuffer<f32>,
        fragments: &mut Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        let producer = StepProducer::Glu {
            gelu: false,
            gate_up,
        };
        self.nvfp4_step(
            "cuda::silu_and_mul_nvfp4_gemv",
            producer,
            fragments,
            tiles,
            global_scale,
            y,
        )
    }

    /// [`Gpu::silu_and_mul_nvfp4_gemv`] with [`Gpu::gelu_and_mul`]'s activation.
    pub fn gelu_and_mul_nvfp4_gemv(
        &self,
        gate_up: &GpuBuffer<f32>,
        fragments: &mut Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        let producer = StepProducer::Glu {
            gelu: true,
            gate_up,
        };
        self.nvfp4_step(
            "cuda::gelu_and_mul_nvfp4_gemv",
            producer,
            fragments,
            tiles,
            global_scale,
            y,
        )
    }

    /// The NVFP4 decode step of a linear whose f32 input no fused producer writes (the GDN out_proj):
    /// [`Gpu::cast_nvfp4_fragments`] of `x` (`[m, k]`, `k` the GEMV's) into `fragments`, then the GEMV into `y`,
    /// two launches where [`Gpu::cast_f32_to_bf16`] + [`Gpu::nvfp4_gemv_tiles`] take three. As
    /// [`Gpu::rmsnorm_nvfp4_gemv`], the cast's launch zeroes `y` where the GEMV adds K splits into it, so `y` is
    /// bit for bit that of the unfused pair.
    pub fn cast_nvfp4_gemv(
        &self,
        x: &GpuBuffer<f32>,
        fragments: &mut Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.nvfp4_step(
            "cuda::cast_nvfp4_gemv",
            StepProducer::Cast { x },
            fragments,
            tiles,
            global_scale,
            y,
        )
    }

    /// The body of the `*_nvfp4_gemv` steps: the GEMV's operands checked, then the producer (which checks its
    /// own before launching; it zeroes `y` where the kernel adds into it), then the GEMV.
    fn nvfp4_step(
        &self,
        op: &'static str,
        producer: StepProducer<'_>,
        fragments: &mut Nvfp4Fragments,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        let (n, k) = (tiles.n, tiles.k);
        // k > 0: the tiles exist (nvfp4_repack_tiles refuses k = 0).
        let (input, width, len) = match &producer {
            StepProducer::Norm { x, weight, .. } => {
                crate::ensure_shape!(
                    weight.len() == k,
                    op,
                    "the norm's weight has {} elements, the GEMV's k is {k}",
                    weight.len()
                );
                ("x", k, x.len())
            }
            // k is at most i32::MAX (the tiles were checked when made), so 2k fits.
            StepProducer::Glu { gate_up, .. } => ("gate_up", 2 * k, gate_up.len()),
            StepProducer::Cast { x } => ("x", k, x.len()),
        };
        crate::ensure_shape!(
            len.is_multiple_of(width),
            op,
            "{input} has {len} elements, not a whole number of rows of {width} (the GEMV's k = {k})"
        );
        let m = len / width;
        check_nvfp4_fragments_gemv(op, tiles, global_scale, y, m)?;
        let (kernel, splits) = nvfp4_tiles_auto(m, n);
        // Auto's kernels that add K splits into y; the others write it whole.
        let adds = splits > 1 && matches!(kernel, TilesKernel::Split | TilesKernel::M1 { .. });
        let zero = if adds { Some(&mut *y) } else { None };
        match producer {
            StepProducer::Norm {
                x,
                residual,
                weight,
                form,
                eps,
            } => self.rmsnorm_fragments(op, x, residual, weight, form, eps, fragments, zero)?,
            StepProducer::Glu { gelu, gate_up } => {
                self.glu_fragments(op, gelu, gate_up, k, fragments, zero)?
            }
            StepProducer::Cast { x } => self.cast_fragments(op, x, k, fragments, zero)?,
        }
        let splits = if adds { splits } else { 1 };
        self.nvfp4_fragments_launch(op, fragments, tiles, global_scale, y, m, kernel, splits)
    }

    /// [`Gpu::nvfp4_gemv_tiles`] with a chosen K split (tests and the benchmark drive each one).
    ///
    /// With `scratch` (at least [`Gpu::gemv_scratch_len`] words): activations preconverted, the K chunks cut into
    /// `k_splits` (1..=16) ranges run by separate blocks whose partial sums are added into `y` with atomics (`y` is
    /// zeroed by the conversion kernel; with 2 splits the result does not depend on the order, with more it may differ
    /// from run to run in the last bits): `nvfp4_gemv_tiles_n8_u1` (m <= 8) or `_n16_u1`, the same products bit for bit
    /// as `Auto`'s one-split kernels. Without `scratch`: the activations are converted per weight tile inside the GEMV
    /// (`nvfp4_gemv_mma_tile_n*`, `k_splits` must be 1), slower at every `m` measured. Two chunks in flight per warp in
    /// registers (`_u2`) lost at every shape (e.g. 283 vs 224 us on lm_head at m = 1) and was
    /// deleted.
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn nvfp4_gemv_tiles_variant(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: Option<&mut GpuBuffer<u32>>,
        m: usize,
        k_splits: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_tiles_variant";
        crate::ensure_shape!(
            scratch.is_some() || k_splits == 1,
            OP,
            "without a scratch buffer (activations converted in the GEMV) only k_splits = 1 exists, got {k_splits}"
        );
        let kernel = if scratch.is_some() {
            TilesKernel::Split
        } else {
            TilesKernel::Converting
        };
        self.tiles_launch(OP, kernel, x, tiles, global_scale, y, scratch, m, k_splits)
    }

    /// The `m = 1` kernel of [`Gpu::nvfp4_gemv_tiles`] (`nvfp4_gemv_tiles_m1_w{warps}` in `cuda/gemv.cu`: the
    /// group scales applied once per chunk after the mma, with the groups as the mma's columns) with a chosen cut:
    /// `warps` (4 or 8) per 16-row tile and `k_splits` (1..=16) ranges of K chunks whose partial sums are added into
    /// `y` with atomics, as [`Gpu::nvfp4_gemv_tiles_variant`]'s. `x` is one token (`[k]`); `scratch` at least
    /// [`Gpu::gemv_scratch_len`]`(1, k)` words. Not bit for bit with the other kernels (the scale multiplies a
    /// sum, not each product).
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn nvfp4_gemv_tiles_m1(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        warps: usize,
        k_splits: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_tiles_m1";
        crate::ensure_shape!(
            warps == 4 || warps == 8,
            OP,
            "warps must be 4 or 8, got {warps}"
        );
        let kernel = TilesKernel::M1 {
            warps: warps as u32,
        };
        self.tiles_launch(
            OP,
            kernel,
            x,
            tiles,
            global_scale,
            y,
            Some(scratch),
            1,
            k_splits,
        )
    }

    /// [`Gpu::nvfp4_gemv_tiles`] cut as `split` says (see [`MmaSplit`]; `nvfp4_gemv_mma_tile_pre_n*_w{W}c{CS}`):
    /// activations preconverted into `scratch` (at least [`Gpu::gemv_scratch_len`] words), the K chunks of each
    /// tile shared by `split.splits` blocks of one cluster whose sums meet in distributed shared memory (the same
    /// bits on every run, for every split). Tests and the benchmark drive each cut.
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn nvfp4_gemv_tiles_split(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        split: MmaSplit,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_tiles_split";
        split.check(OP)?;
        self.tiles_launch(
            OP,
            TilesKernel::Cluster(split),
            x,
            tiles,
            global_scale,
            y,
            Some(scratch),
            m,
            1,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn tiles_launch(
        &self,
        op: &'static str,
        kernel: TilesKernel,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: Option<&mut GpuBuffer<u32>>,
        m: usize,
        splits: usize,
    ) -> Result<(), KernelError> {
        let (n, k) = (tiles.n, tiles.k);
        crate::ensure_shape!(
            (1..=16).contains(&splits),
            op,
            "k_splits must be 1..=16, got {splits}"
        );
        check_gemv_dims(op, m, n, k, 32)?;
        check_len_of(op, "x", x.len(), &[m, k])?;
        check_len_of(op, "y", y.len(), &[m, n])?;
        crate::ensure_shape!(
            global_scale.is_finite(),
            op,
            "global_scale must be finite, got {global_scale}"
        );
        if let Some(s) = scratch.as_deref() {
            check_scratch(op, s, m, k)?;
        }
        if let TilesKernel::M1 { .. } = kernel {
            crate::ensure_shape!(
                m == 1 && scratch.is_some(),
                op,
                "the m = 1 tile GEMV takes one token and the activation scratch, got m = {m}"
            );
        }
        #[cfg(feature = "cuda")]
        {
            if let TilesKernel::Cluster(split) = kernel {
                let Some(scratch) = scratch else {
                    return Err(KernelError::shape(
                        op,
                        "the cluster-split tile GEMV needs the activation scratch".to_string(),
                    ));
                };
                return self.inner.mma_split_gemv(
                    SplitFormat::Nvfp4Tile,
                    split,
                    Activations::Convert(&x.slice, &mut scratch.slice),
                    &tiles.w.slice,
                    &tiles.scales.slice,
                    global_scale,
                    &mut y.slice,
                    m,
                    n,
                    k,
                );
            }
            self.inner.nvfp4_gemv_tiles(
                kernel,
                &x.slice,
                scratch.map(|s| &mut s.slice),
                &tiles.w.slice,
                &tiles.scales.slice,
                global_scale,
                &mut y.slice,
                m,
                n,
                k,
                splits,
            )
        }
        no_cuda!(self, kernel, scratch, splits)
    }

    /// [`Gpu::fp8_block_gemv`] with a caller-owned activation scratch (at least [`Gpu::gemv_scratch_len`]`(m, k)`
    /// words, contents ignored, reusable across calls): the FP8 decode path. `m = 1` runs `Auto`'s CUDA-core
    /// kernel; `m >= 2` converts the activations once per call and runs the tensor-core GEMV cut as
    /// `fp8_split_auto` says ([`Gpu::fp8_block_gemv_split`]). The scratch is a parameter because the device
    /// context has no buffer of its own for it yet.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemv_with_scratch(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemv_with_scratch";
        check_fp8_gemv(OP, x, w, scales, y, m, n, k)?;
        check_scratch(OP, scratch, m, k)?;
        if m == 1 {
            self.fp8_block_gemv_with(KernelPath::Auto, x, w, scales, y, m, n, k)
        } else {
            self.fp8_split_launch(x, w, scales, y, scratch, m, n, k, fp8_split_auto(m, n))
        }
    }
}

/// The cut [`Gpu::fp8_block_gemv_with_scratch`] runs for `m >= 2` ([`MmaSplit`], always as programmatic
/// dependents): on matrices of at most 8192 rows two 8-warp blocks per tile for `m <= 8` and three 4-warp blocks
/// for `m >= 9`; on taller ones one 4-warp block per tile. H200 (`benchmarks/h200.md`), us,
/// against the table before (the tensor-core kernel converting its own activations at `m <= 8` below 65536 rows,
/// one 8-warp block per tile on preconverted activations elsewhere):
///
/// | shape (n x k) | m = 4: before | m = 4: this | m = 16: before | m = 16: this |
/// |---|---|---|---|---|
/// | 5120 x 17408 | 31.85 | **29.79** (w8c2) | 35.59 | **33.41** (w4c3) |
/// | 17408 x 5120 | 31.50 | **29.50** (w4c1) | 37.62 | **34.56** (w4c1) |
/// | 5120 x 10240 | 20.21 | 20.41 (w8c2) | 23.52 | **21.79** (w4c3) |
/// | 248320 x 5120 | 327.58 | **316.53** (w4c1) | 380.79 | **379.91** (w4c1) |
///
/// The one loss, 1% on 5120x10240 at m = 4, is within that case's spread. Earlier: preconverting was
/// faster at m >= 9 everywhere (34.5 vs 42.6 us on 5120x17408) and at m = 2..=8 on the lm_head (322.1 vs
/// 351.6 us), within 0.96-1.01x at m = 4 on the layer shapes.
fn fp8_split_auto(m: usize, n: usize) -> MmaSplit {
    let (warps, splits) = match (n <= 8192, m <= 8) {
        (true, true) => (8, 2),
        (true, false) => (4, 3),
        (false, _) => (4, 1),
    };
    MmaSplit {
        warps,
        splits,
        pdl: true,
    }
}

/// The kernels of [`Gpu::fp8_gemv_tiles`] (`cuda/gemv.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fp8TileKernel {
    /// `fp8_gemv_tile_m1_*`: one token on the CUDA cores.
    CudaCoresM1,
    /// `gemv_act_frag_fp8` + `fp8_gemv_mma_tile_pre_*`: the activations converted once per call.
    Preconverted,
    /// `fp8_gemv_mma_tile_*`: the activations converted inside the GEMV.
    Converting,
}

/// [`Gpu::fp8_gemv_tiles`]'s choice for `m` tokens and `n` rows: the kernel and its cut; always as programmatic
/// dependents. Three H200 sweeps (`benchmarks/h200.md`), us, the choice
/// in bold:
///
/// | shape (n x k) | m | CUDA cores (m = 1) w8c2 / w8c1 / w4c3 | preconverted w8c2 / w8c1 / w4c1 | converting w8c2 / w8c1 / w4c1 |
/// |---|---|---|---|---|
/// | 5120 x 17408 | 1 | **21.45** / 32.61 / 22.60 | 24.59 / - / - | - |
/// | 17408 x 5120 | 1 | 27.98 / **23.13** / 29.91 | - / 25.41 / - | - / 23.55 / - |
/// | 5120 x 10240 | 1 | **13.31** / 19.19 / 14.29 | 15.72 / - / - | - |
/// | 248320 x 5120 | 1 | 341.9 / **277.7** / 364.0 | - / 280.2 / - | - |
/// | 5120 x 17408 | 4 | - | **24.9** / 29.5 / - (w4c3 25.3) | 26.3 / 27.6 / - |
/// | 5120 x 17408 | 16 | - | **25.8** / 29.7 / - (w4c3 27.3) | - |
/// | 17408 x 5120 | 4 | - | 32.4 / 25.7 / 27.1 | 28.4 / **23.9** / 24.9 |
/// | 17408 x 5120 | 16 | - | 33.6 / 32.5 / **25.8** | - |
/// | 5120 x 10240 | 4 | - | **16.0** / 18.6 / - | 16.8 / 17.3 / - |
/// | 248320 x 5120 | 4 | - | - / **292.9** / 293.8 | - / 297.3 / 297.9 |
/// | 248320 x 5120 | 16 | - | - / 349.2 / **325.0** | - |
///
/// The m = 1 kernel is 98.9 / 91.7 / 93.7 / 108.9% of copy, faster than the checkpoint layout's K-split kernel
/// (22.70 / 24.25 / 13.49 / 295.8 us in the same run). The converting builds at m = 16 were not timed (their
/// 58-59 registers cost a block per SM).
fn fp8_tiles_auto(m: usize, n: usize) -> (MmaSplit, Fp8TileKernel) {
    let ((warps, splits), kernel) = if m == 1 {
        let cut = if n <= 8192 { (8, 2) } else { (8, 1) };
        (cut, Fp8TileKernel::CudaCoresM1)
    } else if n <= 8192 {
        ((8, 2), Fp8TileKernel::Preconverted)
    } else if m >= 9 {
        ((4, 1), Fp8TileKernel::Preconverted)
    } else if n < 65536 {
        ((8, 1), Fp8TileKernel::Converting)
    } else {
        ((8, 1), Fp8TileKernel::Preconverted)
    };
    let split = MmaSplit {
        warps,
        splits,
        pdl: true,
    };
    (split, kernel)
}

/// How a tensor-core decode GEMV over preconverted activations cuts its work (`cuda/gemv.cu`, the `_w{W}c{CS}`
/// builds of `blockq_gemv_mma`): `warps` per block share one 16-row tile's 128-wide K chunks, `splits` blocks (one
/// thread-block cluster) per tile each take a contiguous share of the chunks and add their sums in distributed
/// shared memory (deterministic: no atomics), and `pdl` launches the activation conversion and the GEMV as
/// programmatic dependents. Built: 8 warps x 1 or 2 splits, 4 warps x 1, 2 or 3 ([`MmaSplit::BUILT`]).
///
/// Why: one block of 8 warps per tile leaves a 5120-row matrix 320 blocks, ~19 warps per SM with one 2 KiB (FP8)
/// chunk each in flight, where the FP8 `m = 1` kernel keeps ~40 warps' worth in flight at 90% of copy; and a
/// 17408-row matrix 1088 blocks of 8 warps, 1.65 waves of 5 chunks per warp. The the sweep (
/// `benchmarks/h200.md`) measured every cut; `fp8_split_auto` and `nvfp4_tiles_auto` hold the winners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaSplit {
    /// Warps per block: 4 or 8.
    pub warps: usize,
    /// Blocks (of one cluster) per 16-row tile: 1 or 2 with 8 warps, 1 to 3 with 4.
    pub splits: usize,
    /// Launch the conversion and the GEMV as programmatic dependents.
    pub pdl: bool,
}

impl MmaSplit {
    /// One block of 8 warps per tile, launched plainly: the kernels' earlier shape.
    pub const ONE_TILE: MmaSplit = MmaSplit {
        warps: 8,
        splits: 1,
        pdl: false,
    };

    /// The (warps, splits) pairs built in `cuda/gemv.cu`.
    pub const BUILT: [(usize, usize); 5] = [(8, 1), (8, 2), (4, 1), (4, 2), (4, 3)];

    /// The cut [`Gpu::fp8_gemv_tiles_fragments`] runs for `m` tokens and `n` rows: `fp8_tiles_auto`'s preconverted
    /// cuts (8 warps x 2 blocks per tile up to 8192 rows, above 4 x 1 at m >= 9), and 8 x 1 where that table
    /// converts in the GEMV or runs the CUDA-core m = 1 kernel instead (above 8192 rows, m <= 8).
    pub fn fp8_fragments(m: usize, n: usize) -> MmaSplit {
        let (warps, splits) = if n <= 8192 {
            (8, 2)
        } else if m >= 9 {
            (4, 1)
        } else {
            (8, 1)
        };
        MmaSplit {
            warps,
            splits,
            pdl: true,
        }
    }

    /// The pairs built for the FP8 tile GEMV that converts its own activations ([`Gpu::fp8_gemv_tiles_converting`]).
    pub const BUILT_CONVERTING: [(usize, usize); 3] = [(8, 1), (8, 2), (4, 1)];

    #[cfg(feature = "lab")]
    fn check(self, op: &'static str) -> Result<(), KernelError> {
        crate::ensure_shape!(
            Self::BUILT.contains(&(self.warps, self.splits)),
            op,
            "a tensor-core GEMV split is one of (warps, splits) {:?}, got ({}, {})",
            Self::BUILT,
            self.warps,
            self.splits
        );
        Ok(())
    }
}

/// The weight layouts of the tensor-core GEMV cuts (`Device::mma_split_gemv`; only the CUDA build launches).
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::cuda) enum SplitFormat {
    /// FP8 e4m3 `[n, k]` as the checkpoint stores it.
    Fp8,
    /// FP8 in the tile layout of `fp8_repack_mma`.
    Fp8Tile,
    /// NVFP4 in the tile layout of `nvfp4_repack_mma`.
    Nvfp4Tile,
}

/// What the `*_nvfp4_gemv` decode steps run before their GEMV ([`Gpu::rmsnorm_nvfp4_gemv`],
/// [`Gpu::silu_and_mul_nvfp4_gemv`], [`Gpu::gelu_and_mul_nvfp4_gemv`], [`Gpu::cast_nvfp4_gemv`]).
enum StepProducer<'a> {
    /// [`Gpu::rmsnorm_nvfp4_fragments`]' operands.
    Norm {
        x: &'a GpuBuffer<f32>,
        residual: Option<&'a mut GpuBuffer<f32>>,
        weight: &'a GpuBuffer<f32>,
        form: crate::shapes::NormWeight,
        eps: f32,
    },
    /// [`Gpu::silu_and_mul_nvfp4_fragments`]' (or gelu's, `gelu`) operand; `inter` is the GEMV's `k`.
    Glu {
        gelu: bool,
        gate_up: &'a GpuBuffer<f32>,
    },
    /// [`Gpu::cast_nvfp4_fragments`]' operand; its `k` is the GEMV's.
    Cast { x: &'a GpuBuffer<f32> },
}

/// The builds of the tile-layout NVFP4 GEMV (`cuda/gemv.cu`) that `Device::nvfp4_gemv_tiles` launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::cuda) enum TilesKernel {
    /// `nvfp4_gemv_mma_tile_n*`: activations converted inside the GEMV, no scratch, one split.
    // Only the lab's `nvfp4_gemv_tiles_variant` picks it; the launch code keeps handling it in every build.
    #[cfg_attr(not(feature = "lab"), allow(dead_code))]
    Converting,
    /// `nvfp4_gemv_mma_tile_pre_n*`: preconverted activations, one 16-row tile per block, one split.
    Mma,
    /// `nvfp4_gemv_tiles_n*_u1`: preconverted activations, the K chunks split over `grid.y` blocks.
    Split,
    /// `nvfp4_gemv_mma_tile_pre_n*_w{W}c{CS}`: preconverted activations, cut as the [`MmaSplit`] says.
    Cluster(MmaSplit),
    /// `nvfp4_gemv_tiles_m1_w{warps}` (m = 1 only, warps 4 or 8): the group scales applied after the mma, the K
    /// chunks split over `grid.y` blocks as in `Split`.
    M1 { warps: u32 },
    /// `nvfp4_gemv_tiles_m1_w8c2` (m = 1 only, on fragments a producer wrote): `M1`'s kernel with 8 warps, two
    /// blocks of one cluster per tile whose sums meet in distributed shared memory, so y needs no zeroing.
    M1Cluster,
}

/// The kernel [`Gpu::nvfp4_gemv_tiles_fragments`] runs for `m` tokens and `n` rows: `nvfp4_tiles_auto`'s, except
/// where that one adds K splits into a zeroed y (its fragment kernel zeroes it; a producer writing the fragments
/// does not): there the same split as one cluster (`M1Cluster` at m = 1, 8 warps x 2 blocks at m <= 8). On the H200,
/// the GEMV alone on fragments, m = 1: the cluster build 14.31 against 13.63 us (atomics, y not zeroed) on
/// 5120x17408, 9.64 against 8.96 on 5120x10240; with its producer the step is still 1.02-1.36x the unfused one
/// at m = 1 and 4. `Gpu::nvfp4_step` (the `*_nvfp4_gemv` calls) has its producer zero y and keeps `Auto`'s cut.
fn nvfp4_fragments_cut(m: usize, n: usize) -> TilesKernel {
    match nvfp4_tiles_auto(m, n) {
        (TilesKernel::M1 { .. }, _) => TilesKernel::M1Cluster,
        (TilesKernel::Split, _) => TilesKernel::Cluster(MmaSplit {
            warps: 8,
            splits: 2,
            pdl: true,
        }),
        (kernel, _) => kernel,
    }
}

/// `Auto`'s choice for [`Gpu::nvfp4_gemv_tiles`]: the kernel and the K splits for `m` tokens and `n` rows.
/// Activations are always preconverted (faster than converting them in the GEMV at every m and shape measured:
/// 1.04-1.47x, an H200 run). Two K splits (`nvfp4_gemv_tiles_n8_u1`) where the rows alone leave the GPU short
/// of blocks, m <= 8 on the 5120-row shapes (320 tiles of 16 rows for 132 SMs); everywhere else one split on
/// `nvfp4_gemv_mma_tile_pre_n8` / `_n16`, bitwise the same products as `nvfp4_gemv_tiles_n*_u1` with one split and
/// faster. On the H200 (`benchmarks/h200.md`), us: `tilepre` (one
/// split, `nvfp4_gemv_mma_tile_pre_*`) / `t1k1` (one split, `nvfp4_gemv_tiles_n*_u1`) / `t1k2` (two splits of the
/// latter), the choice in bold:
///
/// | shape (n x k) | m = 1 | m = 4 | m = 16 |
/// |---|---|---|---|
/// | 5120 x 17408 | 22.12 / 22.33 / **19.23** | 22.23 / 22.49 / **19.44** | **25.77** / 31.56 / 28.47 |
/// | 17408 x 5120 | **19.20** / 19.71 / 20.49 | **19.37** / 19.81 / 20.90 | **24.78** / 28.42 / 30.26 |
/// | 5120 x 10240 | 14.83 / 14.95 / **13.08** | 14.89 / 15.02 / **13.24** | **17.03** / 20.53 / 18.85 |
/// | 248320 x 5120 | **199.2** / 208.2 / 233.2 | **204.2** / 211.2 / 241.0 | **294.1** / 328.8 / 374.2 |
///
/// Before s3, `Auto` ran `t1k1` at m <= 8 on n > 8192: 2-4% slower than `tilepre` in both runs (19.17 vs
/// 19.66 us on 17408x5120, 214.9 vs 224.2 on lm_head at m = 1).
///
/// Persistent stream-K kernels (one wave of `SMs x B` blocks of 4 warps, one equal contiguous range of (tile,
/// chunk) items per warp, an S-stage `cp.async` ring per warp, partial sums by atomics; arms `p{S}b{B}`) lost to
/// this table at every shape and m and were deleted: m = 1, 5120x17408: `t1k2` 19.23 us (61.7% of copy)
/// against `p4b4` 27.86, `p4b8` 26.70, `p8b6` 25.70; 17408x5120: `tilepre` 19.20 against `p4b8` 23.88; lm_head
/// 199.2 (85.0%) against 243.9-295.7; m = 16, the four shapes in the table's order: `tilepre` 25.8 / 24.8 / 17.0 /
/// 294 us against `p4b6` 27.8 / 27.9 / 20.0 / 338. From the SASS of
/// that build (cuobjdump, main-loop instructions per 1 KiB chunk): 298-308 for `p_n8_s{4,8}` against 201-204 for
/// the per-tile kernels (ring cursor and guards, commit/wait, shared-memory reads, the atomics' branch: 14 ISETP,
/// 8 BRA, 4 BSSY/BSYNC, 6 LDS per chunk), at or over the ~300 per KiB that 85% of copy allows on 4 schedulers;
/// and with 56-70 registers and 4 warps per block, 16-32 warps per SM against the 40 of 5 tile blocks.
///
/// Tried earlier: on the lm_head at m <= 8, one block of 4 warps per tile (`nvfp4_gemv_mma_tile_pre_n8_w4c1`,
/// [`MmaSplit`], as programmatic dependents): 188.4 / 193.8 us against `tilepre` 195.4 / 204.2 at m = 1, 196.4 /
/// 197.7 against 203.8 / 209.6 at m = 4. Elsewhere the table stands: two- and three-block clusters per tile lost
/// to the atomic two splits on the 5120-row shapes (21.6-21.8 against 18.3-18.6 us), and 4- or 8-warp single
/// blocks came within 1% of `tilepre` on 17408 rows.
///
/// Tried earlier: a block-level shared-memory ring filled by `cp.async.bulk` from a producer warp
/// (W consumer warps x P stages, 1-3 K splits) lost at every shape and m (m = 1: 20.7 / 20.9 / 14.9 / 236 us
/// against this table's 18.7 / 17.7 / 12.7 / 185) and was deleted; the numbers and why are in `cuda/gemv.cu`
/// beside `nvfp4_gemv_tiles_n8_u1`.
///
/// Measured earlier (`benchmarks/h200.md`, two bench runs within 1% of each other): the tile layout's
/// e2m1 bits reordered so that the decode takes 9 instructions per 8 values instead of ~16.5 (`e2m1x8_to_f16_pairs`
/// in `cuda/gemv.cu`). That made every m <= 8 kernel 5-20% faster and moved the winner on the 17408-row shape to one
/// block of 8 warps per tile (`nvfp4_gemv_mma_tile_pre_n*_w8c1`, as programmatic dependents), at m = 16 too; the
/// rest of the table stands. us, `tilepre_pdl` / `w8c1` / `t1k2_pdl` / `w4c1` (the choice in bold):
///
/// | shape (n x k) | m = 1 | m = 4 | m = 16 |
/// |---|---|---|---|
/// | 5120 x 17408 | 26.05 / 24.68 / **15.69** / 42.14 | 25.98 / 24.64 / **15.95** / 42.07 | **25.93** / 34.79 / 26.16 / 60.89 |
/// | 17408 x 5120 | 16.68 / **15.50** / 17.66 / 16.13 | 16.96 / **15.68** / 18.14 / 16.26 | 25.52 / **24.65** / 27.61 / 25.67 |
/// | 5120 x 10240 | 16.38 / 15.81 / **10.82** / 26.08 | 16.40 / 15.90 / **11.13** / 26.29 | **17.24** / 22.29 / 16.95 / 39.20 |
/// | 248320 x 5120 | 177.9 / 177.5 / 207.2 / **174.6** | 186.6 / 183.7 / 223.1 / **182.3** | **276.5** / 307.2 / 371.3 / 281.7 |
///
/// (m = 16 on 5120 x 10240: `t1k2_pdl` within 2% of `tilepre_pdl`, in both runs, not worth a rule.)
///
/// Then the m = 1 kernel (`nvfp4_gemv_tiles_m1_w{W}`, [`Gpu::nvfp4_gemv_tiles_m1`]: the group scales applied once
/// per chunk after the mma, 125 instructions per chunk against 165) (two runs), us, `m1w8k2` /
/// `m1w8k1` / `m1w4k1` against the best of the table above: 5120 x 17408 **15.24-15.46** / 23.2 / 40.1 against
/// `t1k2_pdl` 15.67-15.89; 17408 x 5120 17.1 / 15.75-16.07 / 15.41-15.72 against `w8c1` **15.40-15.70**; 5120 x
/// 10240 **10.06-10.24** / 14.9 / 24.4 against `t1k2_pdl` 10.72-10.94; lm_head 210 / 183.5 / 180.3-182.0 against
/// `w4c1` **173.4-175.3**. So m = 1 takes it (8 warps, 2 K splits) on up to 8192 rows only, 3-6% faster there; a
/// quarter fewer instructions bought little more, so these shapes are no longer issue-bound.
fn nvfp4_tiles_auto(m: usize, n: usize) -> (TilesKernel, usize) {
    let one_block = |warps| {
        let split = MmaSplit {
            warps,
            splits: 1,
            pdl: true,
        };
        (TilesKernel::Cluster(split), 1)
    };
    if m == 1 && n <= 8192 {
        (TilesKernel::M1 { warps: 8 }, 2)
    } else if m <= 8 && n <= 8192 {
        (TilesKernel::Split, 2)
    } else if n > 8192 && n < 65536 {
        one_block(8)
    } else if m <= 8 && n >= 65536 {
        one_block(4)
    } else {
        (TilesKernel::Mma, 1)
    }
}

/// `Auto`'s K split for the `m = 1` FP8 GEMV on the CUDA cores ([`Gpu::fp8_block_gemv_m1_ksplit`]): 2 on the layer
/// shapes, 1 on the lm_head. Why: the unsplit kernel has one block of 8 warps per 16 rows, 19 warps per SM on a
/// 5120-row matrix of the 32 its registers allow, and Nsight Compute showed it latency-bound there (40% of issue
/// slots, 4.8 warps per scheduler). H200 (`benchmarks/h200.md`), us and
/// fraction of copy for splits 1 / 2 / 4:
///
/// | shape (n x k) | 1 | 2 | 4 |
/// |---|---|---|---|
/// | 5120 x 17408 | 25.87 (82.5%) | **23.76 (89.8%)** | 24.34 (87.7%) |
/// | 17408 x 5120 | 26.41 (80.8%) | **25.41 (84.0%)** | 26.41 (80.8%) |
/// | 5120 x 10240 | 16.62 (75.5%) | **14.84 (84.6%)** | 15.62 (80.4%) |
/// | 248320 x 5120 | **280.0 (108.7%)** | 298.8 | 318.7 |
///
/// The lm_head has 15520 blocks, enough warps without the split, which there only adds the shared-memory
/// reduction; the boundary sits between the largest layer shape measured and it.
fn fp8_m1_ksplit_auto(n: usize) -> usize {
    if n < FP8_M1_KSPLIT_BELOW_N {
        2
    } else {
        1
    }
}

/// Whether `Auto` launches the `m = 1` FP8 GEMV as a programmatic dependent (`Device::launch_pdl`): with the K
/// split, below 65536 rows. On the H200 (--quick, `benchmarks/h200.md`), us and fraction of
/// copy, split in two plain / split in two as a dependent: 5120x17408 23.83 (88.3%) / **22.94 (91.7%)**,
/// 17408x5120 25.43 (82.7%) / **24.34 (86.5%)**, 5120x10240 14.94 (82.8%) / **13.63 (90.8%)**. The unsplit kernel
/// as a dependent was 1.2x slower on the 5120-row shapes (31.2 vs 25.9 us: its one-wave grid of 320 blocks,
/// resident early beside the kernel before, no longer spread evenly), and the lm_head keeps the plain unsplit
/// kernel (284.6 us against 285.0 as a dependent, 300.1 split).
fn fp8_m1_pdl_auto(n: usize) -> bool {
    n < FP8_M1_KSPLIT_BELOW_N
}

/// Rows below which [`fp8_m1_ksplit_auto`] splits K (see there).
const FP8_M1_KSPLIT_BELOW_N: usize = 65536;

#[allow(clippy::too_many_arguments)]
fn check_fp8_gemv(
    op: &'static str,
    x: &GpuBuffer<u16>,
    w: &GpuBuffer<u8>,
    scales: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    check_gemv_dims(op, m, n, k, 16)?;
    check_len_of(op, "x", x.len(), &[m, k])?;
    check_len_of(op, "w", w.len(), &[n, k])?;
    check_len_of(
        op,
        "scales",
        scales.len(),
        &[n.div_ceil(128), k.div_ceil(128)],
    )?;
    check_len_of(op, "y", y.len(), &[m, n])
}

pub(in crate::cuda) fn check_scratch(
    op: &'static str,
    scratch: &GpuBuffer<u32>,
    m: usize,
    k: usize,
) -> Result<(), KernelError> {
    let want = Gpu::gemv_scratch_len(m, k);
    crate::ensure_shape!(
        scratch.len() >= want,
        op,
        "scratch has {} words, the activations of m = {m}, k = {k} need {want} (Gpu::gemv_scratch_len)",
        scratch.len()
    );
    Ok(())
}

/// The NVFP4 fragments GEMV's operands besides the fragments: `m` tokens on `tiles` (`check_gemv_dims`), `y` of
/// `m * n` floats and a finite global scale.
fn check_nvfp4_fragments_gemv(
    op: &'static str,
    tiles: &Nvfp4TileWeights,
    global_scale: f32,
    y: &GpuBuffer<f32>,
    m: usize,
) -> Result<(), KernelError> {
    check_gemv_dims(op, m, tiles.n, tiles.k, 32)?;
    check_len_of(op, "y", y.len(), &[m, tiles.n])?;
    crate::ensure_shape!(
        global_scale.is_finite(),
        op,
        "global_scale must be finite, got {global_scale}"
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

// The launches: each tensor-core, CUDA-core and repack kernel of `cuda/gemv.cu`, the activation-fragment
// kernels, and the naming functions the embedded-kernel test shares with them.
#[cfg(feature = "cuda")]
impl Device {
    #[allow(clippy::too_many_arguments)]
    fn fp8_block_gemv(
        &self,
        tensor: bool,
        ksplit: usize,
        pdl: bool,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        // Tensor cores: one 16-row tile per block (`fp8_block_gemv_mma_n*`, blockq_gemv_mma). CUDA cores: M = 1
        // uses two rows per warp and two 16-byte loads in flight per row, the best of the design sweep in
        // kernels/bench/h200 (3.54 TB/s on 5120x17408 on the H200, 1.13x the one-row, four-load kernel);
        // Auto splits K over two warps below 65536 rows and launches that as a programmatic dependent
        // (fp8_m1_ksplit_auto, fp8_m1_pdl_auto in cuda/gemv.rs). `ksplit` (m = 1 only) warps
        // of a block share two rows, each a contiguous part of K (`fp8_block_gemv_m1_r2_u2_k{2,4}`): a block
        // covers 16 / ksplit rows.
        let (name, rows_per_block) = fp8_block_gemv_kernel(tensor, m, ksplit)?;
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = launch_config((n.div_ceil(rows_per_block) as u32, 1, 1), (256, 1, 1), 0);
        // SAFETY (both launches): the argument list matches `fp8_block_gemv_m*` and `fp8_block_gemv_mma_n*` in
        // cuda/gemv.cu (three input pointers, one output, three ints) and the caller checked x = [m, k], w = [n, k],
        // scales = [ceil(n/128), ceil(k/128)], y = [m, n], k % 16 == 0, so every thread's 16-byte loads stay inside
        // its row (the K-split builds cut K at multiples of 512, inside [0, k)); the grid covers n at the build's
        // rows per block, rows past n are guarded; cudarc allocations are 256-byte aligned. As a programmatic
        // dependent (`pdl`, the m = 1 CUDA-core builds only) the kernel reads x and writes y only after its
        // pdl_wait (cuda/gemv.cu, fp8_block_gemv).
        if pdl && m == 1 && !tensor {
            let (xp, _gx) = x.device_ptr(self.stream());
            let (wp, _gw) = w.device_ptr(self.stream());
            let (sp, _gs) = scales.device_ptr(self.stream());
            let (yp, _gy) = y.device_ptr_mut(self.stream());
            let mut args = PdlArgs::default();
            args.ptr(xp).ptr(wp).ptr(sp).ptr(yp).i32(mi).i32(ni).i32(ki);
            // SAFETY: see "SAFETY (both launches)" above.
            unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        } else {
            // SAFETY: see "SAFETY (both launches)" above.
            unsafe {
                self.launch_args(name, &f, cfg, |b| {
                    b.arg(x)
                        .arg(w)
                        .arg(scales)
                        .arg(y)
                        .arg(&mi)
                        .arg(&ni)
                        .arg(&ki);
                })
            }?;
        }
        Ok(())
    }
}

/// The kernel of [`Device::fp8_block_gemv`] and the rows one block covers.
#[cfg(feature = "cuda")]
fn fp8_block_gemv_kernel(
    tensor: bool,
    m: usize,
    ksplit: usize,
) -> Result<(&'static str, usize), KernelError> {
    Ok(match (tensor, m, ksplit) {
        (true, ..=8, _) => ("fp8_block_gemv_mma_n8", 16),
        (true, _, _) => ("fp8_block_gemv_mma_n16", 16),
        (false, 1, 1) => ("fp8_block_gemv_m1_r2_u2", 16),
        (false, 1, 2) => ("fp8_block_gemv_m1_r2_u2_k2", 8),
        (false, 1, 4) => ("fp8_block_gemv_m1_r2_u2_k4", 4),
        (false, 1, s) => {
            return Err(KernelError::Cuda(format!(
                "fp8_block_gemv: no m = 1 build with K split {s} (1, 2 or 4)"
            )))
        }
        (false, 2, _) => ("fp8_block_gemv_m2", 8),
        (false, 3..=4, _) => ("fp8_block_gemv_m4", 8),
        (false, 5..=8, _) => ("fp8_block_gemv_m8", 8),
        (false, _, _) => ("fp8_block_gemv_m16", 8),
    })
}

/// The checkpoint-layout NVFP4 kernel of [`Device::nvfp4_gemv`] and, on the CUDA cores, its rows per warp.
#[cfg(feature = "cuda")]
fn nvfp4_gemv_kernel(tensor: bool, m: usize, n: usize) -> (&'static str, usize) {
    match (tensor, m) {
        (true, ..=8) => ("nvfp4_gemv_mma_n8", 1),
        (true, _) => ("nvfp4_gemv_mma_n16", 1),
        (false, 1) if n >= 16384 => ("nvfp4_gemv_m1_r2_u4", 2),
        (false, 1) => ("nvfp4_gemv_m1", 1),
        (false, 2) => ("nvfp4_gemv_m2", 1),
        (false, 3..=4) => ("nvfp4_gemv_m4", 1),
        (false, 5..=8) => ("nvfp4_gemv_m8", 1),
        (false, _) => ("nvfp4_gemv_m16", 1),
    }
}

/// The activation-fragment kernel for a format (`nvfp4`, else FP8), zeroing y as well or not.
#[cfg(feature = "cuda")]
fn act_frag_kernel(nvfp4: bool, zero: bool) -> &'static str {
    match (nvfp4, zero) {
        (true, false) => "gemv_act_frag_nvfp4",
        (false, false) => "gemv_act_frag_fp8",
        (true, true) => "gemv_act_frag_nvfp4_zero",
        (false, true) => "gemv_act_frag_fp8_zero",
    }
}

/// The `fp8_gemv_tile_m1_w*c*` build for a cut.
#[cfg(feature = "cuda")]
fn fp8_tile_m1_kernel(split: MmaSplit) -> Option<&'static str> {
    const NAMES: [&str; 5] = [
        "fp8_gemv_tile_m1_w8c1",
        "fp8_gemv_tile_m1_w8c2",
        "fp8_gemv_tile_m1_w4c1",
        "fp8_gemv_tile_m1_w4c2",
        "fp8_gemv_tile_m1_w4c3",
    ];
    MmaSplit::BUILT
        .iter()
        .position(|&c| c == (split.warps, split.splits))
        .map(|i| NAMES[i])
}

/// The `fp8_gemv_mma_tile_n*_w*c*` build (activations converted in the GEMV) for `m` tokens and a cut.
#[cfg(feature = "cuda")]
fn fp8_tile_converting_kernel(m: usize, split: MmaSplit) -> Option<&'static str> {
    Some(match (m <= 8, split.warps, split.splits) {
        (true, 8, 1) => "fp8_gemv_mma_tile_n8_w8c1",
        (true, 8, 2) => "fp8_gemv_mma_tile_n8_w8c2",
        (true, 4, 1) => "fp8_gemv_mma_tile_n8_w4c1",
        (false, 8, 1) => "fp8_gemv_mma_tile_n16_w8c1",
        (false, 8, 2) => "fp8_gemv_mma_tile_n16_w8c2",
        (false, 4, 1) => "fp8_gemv_mma_tile_n16_w4c1",
        _ => return None,
    })
}

/// The `_w{W}c{CS}` build of cuda/gemv.cu for a format, token tiles (1: m <= 8, 2: m <= 16), warps and splits:
/// 8 warps x 1 or 2 splits, 4 warps x 1, 2 or 3 ([`MmaSplit::BUILT`]).
#[cfg(feature = "cuda")]
fn split_kernel(
    format: SplitFormat,
    nt: usize,
    warps: usize,
    splits: usize,
) -> Option<&'static str> {
    const FP8: [[&str; 5]; 2] = [
        [
            "fp8_block_gemv_mma_pre_n8_w8c1",
            "fp8_block_gemv_mma_pre_n8_w8c2",
            "fp8_block_gemv_mma_pre_n8_w4c1",
            "fp8_block_gemv_mma_pre_n8_w4c2",
            "fp8_block_gemv_mma_pre_n8_w4c3",
        ],
        [
            "fp8_block_gemv_mma_pre_n16_w8c1",
            "fp8_block_gemv_mma_pre_n16_w8c2",
            "fp8_block_gemv_mma_pre_n16_w4c1",
            "fp8_block_gemv_mma_pre_n16_w4c2",
            "fp8_block_gemv_mma_pre_n16_w4c3",
        ],
    ];
    const NVFP4: [[&str; 5]; 2] = [
        [
            "nvfp4_gemv_mma_tile_pre_n8_w8c1",
            "nvfp4_gemv_mma_tile_pre_n8_w8c2",
            "nvfp4_gemv_mma_tile_pre_n8_w4c1",
            "nvfp4_gemv_mma_tile_pre_n8_w4c2",
            "nvfp4_gemv_mma_tile_pre_n8_w4c3",
        ],
        [
            "nvfp4_gemv_mma_tile_pre_n16_w8c1",
            "nvfp4_gemv_mma_tile_pre_n16_w8c2",
            "nvfp4_gemv_mma_tile_pre_n16_w4c1",
            "nvfp4_gemv_mma_tile_pre_n16_w4c2",
            "nvfp4_gemv_mma_tile_pre_n16_w4c3",
        ],
    ];
    let i = MmaSplit::BUILT
        .iter()
        .position(|&(w, s)| (w, s) == (warps, splits))?;
    const FP8_TILE: [[&str; 5]; 2] = [
        [
            "fp8_gemv_mma_tile_pre_n8_w8c1",
            "fp8_gemv_mma_tile_pre_n8_w8c2",
            "fp8_gemv_mma_tile_pre_n8_w4c1",
            "fp8_gemv_mma_tile_pre_n8_w4c2",
            "fp8_gemv_mma_tile_pre_n8_w4c3",
        ],
        [
            "fp8_gemv_mma_tile_pre_n16_w8c1",
            "fp8_gemv_mma_tile_pre_n16_w8c2",
            "fp8_gemv_mma_tile_pre_n16_w4c1",
            "fp8_gemv_mma_tile_pre_n16_w4c2",
            "fp8_gemv_mma_tile_pre_n16_w4c3",
        ],
    ];
    let table = match format {
        SplitFormat::Fp8 => &FP8,
        SplitFormat::Fp8Tile => &FP8_TILE,
        SplitFormat::Nvfp4Tile => &NVFP4,
    };
    table.get(nt.checked_sub(1)?).map(|row| row[i])
}

/// The grid of a tensor-core GEMV cut: `split.splits` blocks (one cluster) of `split.warps` warps per 16-row tile.
#[cfg(feature = "cuda")]
fn split_config(n: usize, split: MmaSplit) -> LaunchConfig {
    launch_config(
        (n.div_ceil(16) as u32, split.splits as u32, 1),
        (32 * split.warps as u32, 1, 1),
        0,
    )
}

/// One thread per 16 output bytes of a repack kernel (`fp8_repack_mma`, `nvfp4_repack_mma`), 256 per block.
#[cfg(feature = "cuda")]
fn repack_config(name: &str, threads: usize) -> Result<LaunchConfig, KernelError> {
    let blocks = u32::try_from(threads.div_ceil(256))
        .map_err(|_| KernelError::Cuda(format!("{name}: {threads} threads exceed one grid")))?;
    Ok(launch_config((blocks, 1, 1), (256, 1, 1), 0))
}

#[cfg(feature = "cuda")]
fn gemv_config(n: usize, rows_per_warp: usize) -> LaunchConfig {
    // 8 warps per block, `rows_per_warp` output rows per warp (cuda/gemv.cu).
    launch_config((n.div_ceil(8 * rows_per_warp) as u32, 1, 1), (256, 1, 1), 0)
}

/// The activations of a tensor-core GEMV launch (`Device::mma_split_gemv`).
#[cfg(feature = "cuda")]
pub(in crate::cuda) enum Activations<'a> {
    /// bf16 `x [m, k]`, converted into the scratch first by `gemv_act_frag_*`.
    Convert(&'a CudaSlice<u16>, &'a mut CudaSlice<u32>),
    /// Fragments already written on this stream (`Gpu::rmsnorm_fp8_fragments`, `Gpu::silu_and_mul_fp8_fragments`,
    /// their NVFP4 twins), only read.
    Fragments(&'a CudaSlice<u32>),
}

#[cfg(feature = "cuda")]
fn mma_config(n: usize) -> LaunchConfig {
    // One 16-row tile of W per block, 8 warps sharing its K chunks (cuda/gemv.cu, blockq_gemv_mma).
    launch_config((n.div_ceil(16) as u32, 1, 1), (256, 1, 1), 0)
}

#[cfg(feature = "cuda")]
impl Device {
    /// `gemv_act_frag_{fp8,nvfp4}`: bf16 `x [m, k]` -> f16 B fragments `xf` (`ceil(k/128) * nt * 512` words),
    /// launched as a programmatic dependent when `pdl`.
    #[allow(clippy::too_many_arguments)]
    fn gemv_act_frag(
        &self,
        nvfp4: bool,
        pdl: bool,
        x: &CudaSlice<u16>,
        xf: &mut CudaSlice<u32>,
        m: usize,
        k: usize,
        nt: usize,
    ) -> Result<(), KernelError> {
        let name = act_frag_kernel(nvfp4, false);
        let f = self.function(Module::Gemv, name)?;
        let total = k.div_ceil(128) * nt * 128; // uint4 written, one per thread
        let (mi, ki, nti) = (m as i32, k as i32, nt as i32);
        let cfg = launch_config((total.div_ceil(256) as u32, 1, 1), (256, 1, 1), 0);
        // SAFETY (both launches): matches `gemv_act_frag_*(const uint16_t* x, uint4* xf, int m, int k, int nt)` in
        // cuda/gemv.cu, which waits (pdl_wait) before it reads x or writes xf; the caller checked x = [m, k] with
        // k % 16 == 0 (each 16-byte load is inside its row, tokens >= m are not read) and xf holds at least
        // ceil(k/128) * nt * 128 uint4 (threads past that return); cudarc allocations are 256-byte aligned.
        // Launched as a programmatic dependent (Device::launch_pdl) where the GEMV after it is (the NVFP4 tile pair
        // measured 1.03-1.08x faster so; the one-wave FP8 grids of one block per tile 0.6-1.04x).
        let (xp, _gx) = x.device_ptr(self.stream());
        let (xfp, _gxf) = xf.device_ptr_mut(self.stream());
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(xfp).i32(mi).i32(ki).i32(nti);
        // SAFETY: see "SAFETY (both launches)" above.
        unsafe { self.launch_ex(name, &f, cfg, &mut args, pdl) }
    }

    /// The tensor-core GEMV over preconverted activations, cut as `split` says (`cuda/gemv.cu`, the `_w{W}c{CS}`
    /// builds of blockq_gemv_mma): `gemv_act_frag_{fp8,nvfp4}` into `xf`, then `split.splits` blocks of
    /// `split.warps` warps (one thread-block cluster) per 16-row tile; both launched as programmatic dependents when
    /// `split.pdl`. FP8: `w` e4m3 `[n, k]` (or its tile layout, `fp8_repack_mma`), `scales` fp32 block scales,
    /// `global_scale` unused. NVFP4: `w` and `scales` the tile layout of `nvfp4_repack_mma`.
    #[allow(clippy::too_many_arguments)]
    fn mma_split_gemv<S: cudarc::driver::DeviceRepr>(
        &self,
        format: SplitFormat,
        split: MmaSplit,
        act: Activations<'_>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<S>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let nt = if m <= 8 { 1 } else { 2 };
        let nvfp4 = format == SplitFormat::Nvfp4Tile;
        let name = split_kernel(format, nt, split.warps, split.splits).ok_or_else(|| {
            KernelError::Cuda(format!(
                "no tensor-core GEMV build with {} warps and {} splits",
                split.warps, split.splits
            ))
        })?;
        let xf: &CudaSlice<u32> = match act {
            Activations::Convert(x, xf) => {
                self.gemv_act_frag(nvfp4, split.pdl, x, xf, m, k, nt)?;
                xf
            }
            Activations::Fragments(xf) => xf,
        };
        let f = self.function(Module::Gemv, name)?;
        let cfg = split_config(n, split);
        let (xfp, _gxf) = xf.device_ptr(self.stream());
        let (wp, _gw) = w.device_ptr(self.stream());
        let (sp, _gs) = scales.device_ptr(self.stream());
        let (yp, _gy) = y.device_ptr_mut(self.stream());
        let mut args = PdlArgs::default();
        args.ptr(xfp).ptr(wp).ptr(sp);
        if nvfp4 {
            args.f32(global_scale);
        }
        args.ptr(yp).i32(m as i32).i32(n as i32).i32(k as i32);
        // SAFETY: matches `fp8_block_gemv_mma_pre_n*_w*c*(xf, w, scales, y, m, n, k)`,
        // `fp8_gemv_mma_tile_pre_n*_w*c*` (the same list) and
        // `nvfp4_gemv_mma_tile_pre_n*_w*c*(xf, wr, sr, global_scale, y, m, n, k)` in cuda/gemv.cu; xf holds the
        // fragments of m tokens, k and nt (the kernel reads ceil(k/128) * nt * 128 uint4 of it, for tokens < m
        // only), written just above from x or (Activations::Fragments) by the caller on this stream before (the
        // caller checked its length); the caller checked w and scales (FP8: [n, k] or its tile layout of ceil(n/16) *
        // ceil(k/128) * 2048 bytes, and [ceil(n/128), ceil(k/128)], k % 16 == 0; NVFP4: the tile layout of exactly
        // n x k) and y = [m, n]; grid.y equals the build's cluster size, as __cluster_dims__ requires; stores are
        // guarded against m and n; the kernel reads xf and writes y only after its pdl_wait.
        unsafe { self.launch_ex(name, &f, cfg, &mut args, split.pdl) }
    }

    /// Launches the FP8 tile kernel `name` with the parameters `(x, w, scales, y, [m,] n, k)` (`m` only when
    /// given) on the grid of `split`, as a programmatic dependent when `split.pdl`.
    ///
    /// # Safety
    /// As [`Device::launch_pdl`]: `name` takes exactly these parameters, and the caller checked the buffers
    /// against the kernel's reads and writes for `m`, `n`, `k`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_tile_gemv(
        &self,
        name: &'static str,
        split: MmaSplit,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: Option<usize>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Gemv, name)?;
        let cfg = split_config(n, split);
        let (xp, _gx) = x.device_ptr(self.stream());
        let (wp, _gw) = w.device_ptr(self.stream());
        let (sp, _gs) = scales.device_ptr(self.stream());
        let (yp, _gy) = y.device_ptr_mut(self.stream());
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(wp).ptr(sp).ptr(yp);
        if let Some(m) = m {
            args.i32(m as i32);
        }
        args.i32(n as i32).i32(k as i32);
        // SAFETY: the caller's contract above; the guards keep the buffers alive across the queued launch.
        unsafe { self.launch_ex(name, &f, cfg, &mut args, split.pdl) }
    }

    /// The tile-layout NVFP4 GEMV: `kernel` picks the build (see `TilesKernel` in cuda/gemv.rs); with `xf`, the
    /// activations are converted first by `gemv_act_frag_nvfp4`, or by `gemv_act_frag_nvfp4_zero` (which also zeroes y)
    /// when `splits > 1`. The caller allows `splits > 1` only for `TilesKernel::Split` and passes `xf` for every kernel
    /// but `TilesKernel::Converting`.
    #[allow(clippy::too_many_arguments)]
    fn nvfp4_gemv_tiles(
        &self,
        kernel: TilesKernel,
        x: &CudaSlice<u16>,
        xf: Option<&mut CudaSlice<u32>>,
        wr: &CudaSlice<u8>,
        sr: &CudaSlice<u32>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        splits: usize,
    ) -> Result<(), KernelError> {
        let nt = if m <= 8 { 1 } else { 2 };
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let name = nvfp4_tiles_name(kernel, m)?;
        let f = self.function(Module::Gemv, name)?;
        match xf {
            Some(xf) => {
                let m1 = matches!(kernel, TilesKernel::M1 { .. });
                let splits = if kernel == TilesKernel::Split || m1 {
                    splits
                } else {
                    1
                };
                if splits > 1 {
                    self.gemv_act_frag_zero(x, xf, y, m, n, k, nt)?;
                } else {
                    self.gemv_act_frag(true, true, x, xf, m, k, nt)?;
                }
                let mut cfg = mma_config(n);
                cfg.grid_dim.1 = splits as u32;
                if let TilesKernel::M1 { warps } = kernel {
                    cfg.block_dim.0 = 32 * warps;
                }
                // Both kernels launched as programmatic dependents (Device::launch_pdl): the GEMV's blocks get
                // resident while the fragment kernel runs. On the H200, against the same two kernels launched plainly:
                // 18.55 vs 19.19 us (5120x17408, m = 1), 18.22 vs 19.47 (17408x5120), 12.27 vs 13.21 (5120x10240),
                // 198.2 vs 199.5 (lm_head); 1.03-1.08x at m = 1..16 on the layer shapes.
                // (with splits > 1, y was zeroed by the fragment kernel just above, on the same stream)
                self.tiles_pre_launch(
                    name,
                    &f,
                    cfg,
                    &*xf,
                    wr,
                    sr,
                    global_scale,
                    y,
                    (!m1).then_some(m),
                    n,
                    k,
                )?;
            }
            None => {
                if kernel != TilesKernel::Converting {
                    return Err(KernelError::Cuda(format!(
                        "{name}: needs the activation scratch"
                    )));
                }
                // SAFETY: matches `nvfp4_gemv_mma_tile_n*`; x = [m, k] with k % 32 == 0 checked by the caller
                // (activation loads are guarded against m and k), wr/sr as above, y = [m, n].
                unsafe {
                    self.launch_args(name, &f, mma_config(n), |b| {
                        b.arg(x)
                            .arg(wr)
                            .arg(sr)
                            .arg(&global_scale)
                            .arg(y)
                            .arg(&mi)
                            .arg(&ni)
                            .arg(&ki);
                    })
                }?;
            }
        }
        Ok(())
    }

    /// The tile-layout NVFP4 GEMV on fragments already in `xf` (written just before on this stream by the fragment
    /// kernel or a producer such as `rmsnorm_frag_nvfp4`): `nvfp4_gemv_tiles_n*_u1` / `nvfp4_gemv_mma_tile_pre_n*`
    /// (`m` given) or `nvfp4_gemv_tiles_m1_w*[c2]` (`m` None: the m = 1 kernels take none), as a programmatic
    /// dependent with `cfg`'s grid (y: the K splits or the cluster's blocks) and block.
    #[allow(clippy::too_many_arguments)]
    fn tiles_pre_launch(
        &self,
        name: &'static str,
        f: &cudarc::driver::CudaFunction,
        cfg: LaunchConfig,
        xf: &CudaSlice<u32>,
        wr: &CudaSlice<u8>,
        sr: &CudaSlice<u32>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: Option<usize>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let (xfp, _gxf) = xf.device_ptr(self.stream());
        let (wrp, _gwr) = wr.device_ptr(self.stream());
        let (srp, _gsr) = sr.device_ptr(self.stream());
        let (yp, _gy) = y.device_ptr_mut(self.stream());
        let mut args = PdlArgs::default();
        args.ptr(xfp).ptr(wrp).ptr(srp).f32(global_scale).ptr(yp);
        if let Some(m) = m {
            args.i32(m as i32);
        }
        args.i32(n as i32).i32(k as i32);
        // SAFETY: matches `nvfp4_gemv_tiles_n*_u1` and `nvfp4_gemv_mma_tile_pre_n*` (xf, wr, sr, global_scale, y, m,
        // n, k; the latter reads one tile per block and runs with grid.y = 1), and `nvfp4_gemv_tiles_m1_w*` /
        // `_w8c2` (the same without m, 32 x warps threads, m = 1 only; the cluster build with grid.y = 2, its
        // __cluster_dims__) in cuda/gemv.cu; the callers pass xf written on this stream for m, k and nt (the kernels
        // read ceil(k/128) * nt * 128 uint4 of it, only for tokens < m, and the callers checked its length), wr and
        // sr the tile layout of exactly n x k (block (b, s) reads chunks of tile b only, inside ceil(k/128),
        // ceil(n/16) blocks) and y = [m, n]; stores and atomics are guarded against m and n, and atomics (grid.y > 1
        // without a cluster) only follow a fragment kernel that zeroed y; the kernels read xf and touch y only after
        // their pdl_wait.
        unsafe { self.launch_pdl(name, f, cfg, &mut args) }
    }

    /// The GEMV alone on fragments a producer wrote, cut by `kernel`: `Gpu::nvfp4_gemv_tiles_fragments`' cuts
    /// (`nvfp4_fragments_cut`, `splits` 1: none adds into y), or `Gpu::nvfp4_step`'s (`nvfp4_tiles_auto`: `Split`
    /// and `M1` with `splits` > 1 add into y, which that step's producer zeroed).
    #[allow(clippy::too_many_arguments)]
    fn nvfp4_gemv_tiles_fragments(
        &self,
        kernel: TilesKernel,
        splits: usize,
        xf: &CudaSlice<u32>,
        wr: &CudaSlice<u8>,
        sr: &CudaSlice<u32>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let mut cfg = mma_config(n);
        match kernel {
            TilesKernel::Cluster(split) => {
                return self.mma_split_gemv(
                    SplitFormat::Nvfp4Tile,
                    split,
                    Activations::Fragments(xf),
                    wr,
                    sr,
                    global_scale,
                    y,
                    m,
                    n,
                    k,
                )
            }
            TilesKernel::M1Cluster => cfg.grid_dim.1 = 2,
            TilesKernel::M1 { warps } => {
                cfg.grid_dim.1 = splits as u32;
                cfg.block_dim.0 = 32 * warps;
            }
            TilesKernel::Split => cfg.grid_dim.1 = splits as u32,
            TilesKernel::Mma | TilesKernel::Converting => {}
        }
        let name = match kernel {
            TilesKernel::Converting => {
                return Err(KernelError::Cuda(
                    "nvfp4_gemv_tiles_fragments: the converting build takes bf16 activations, not fragments"
                        .into(),
                ))
            }
            TilesKernel::M1Cluster if m == 1 => "nvfp4_gemv_tiles_m1_w8c2",
            _ => nvfp4_tiles_name(kernel, m)?,
        };
        // The m = 1 kernels take no m.
        let m_arg =
            (!matches!(kernel, TilesKernel::M1 { .. } | TilesKernel::M1Cluster)).then_some(m);
        let f = self.function(Module::Gemv, name)?;
        self.tiles_pre_launch(name, &f, cfg, xf, wr, sr, global_scale, y, m_arg, n, k)
    }

    /// `gemv_act_frag_nvfp4_zero`: `gemv_act_frag_nvfp4` that also zeroes `y[0 .. m*n)`, for the split-K launches
    /// that add into `y`.
    #[allow(clippy::too_many_arguments)]
    fn gemv_act_frag_zero(
        &self,
        x: &CudaSlice<u16>,
        xf: &mut CudaSlice<u32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        nt: usize,
    ) -> Result<(), KernelError> {
        let name = act_frag_kernel(true, true);
        let f = self.function(Module::Gemv, name)?;
        let total = k.div_ceil(128) * nt * 128;
        let (mi, ki, nti) = (m as i32, k as i32, nt as i32);
        let ylen = (m * n) as u64;
        let cfg = launch_config((total.div_ceil(256) as u32, 1, 1), (256, 1, 1), 0);
        let (xp, _gx) = x.device_ptr(self.stream());
        let (xfp, _gxf) = xf.device_ptr_mut(self.stream());
        let (yp, _gy) = y.device_ptr_mut(self.stream());
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(xfp)
            .i32(mi)
            .i32(ki)
            .i32(nti)
            .ptr(yp)
            .u64(ylen);
        // SAFETY: as `gemv_act_frag` above (a programmatic dependent, as there for NVFP4), plus y: the caller
        // checked y = [m, n], and the grid-stride loop writes exactly y[0 .. m*n), after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }
    }
}

/// The `cuda/gemv.cu` entry of a tile-layout NVFP4 GEMV build for `m` tokens (n8 for m <= 8, n16 above; the
/// m = 1 kernels at m = 1 only), shared by `Device::nvfp4_gemv_tiles` and `Device::nvfp4_gemv_tiles_fragments`.
/// The cluster cuts have no single name here (`mma_split_gemv`, or `_m1_w8c2` on fragments).
#[cfg(feature = "cuda")]
fn nvfp4_tiles_name(kernel: TilesKernel, m: usize) -> Result<&'static str, KernelError> {
    let n8 = m <= 8;
    Ok(match kernel {
        TilesKernel::Converting if n8 => "nvfp4_gemv_mma_tile_n8",
        TilesKernel::Converting => "nvfp4_gemv_mma_tile_n16",
        TilesKernel::Mma if n8 => "nvfp4_gemv_mma_tile_pre_n8",
        TilesKernel::Mma => "nvfp4_gemv_mma_tile_pre_n16",
        TilesKernel::Split if n8 => "nvfp4_gemv_tiles_n8_u1",
        TilesKernel::Split => "nvfp4_gemv_tiles_n16_u1",
        TilesKernel::M1 { warps: 8 } if m == 1 => "nvfp4_gemv_tiles_m1_w8",
        TilesKernel::M1 { warps: 4 } if m == 1 => "nvfp4_gemv_tiles_m1_w4",
        TilesKernel::M1 { warps } => {
            return Err(KernelError::Cuda(format!(
                "nvfp4_gemv_tiles: no m = 1 kernel for {warps} warps and m = {m}"
            )))
        }
        TilesKernel::Cluster(_) | TilesKernel::M1Cluster => {
            return Err(KernelError::Cuda(
                "nvfp4_gemv_tiles: cluster splits launch through mma_split_gemv / on fragments"
                    .into(),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Every kernel an `Auto` GEMV call can launch, for m = 1..=16 on every shape class the tables cut at (rows
    /// around 8192, 16384 and 65536, the layer shapes and the lm_head), exists in this build's embedded
    /// `cuda/gemv.cu`: the names come from the same choice and naming functions the launches use, the list from
    /// the PTX (`build_cuda.rs`), so a kernel moved behind `lab` that `Auto` still reaches fails here, without a GPU.
    #[cfg(feature = "cuda")]
    #[test]
    fn every_auto_gemv_kernel_is_embedded() {
        let entries = Module::Gemv.entries();
        let mut missing = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut need = |name: &'static str, call: &str, m: usize, n: usize| {
            seen.insert(name);
            if entries.binary_search(&name).is_err() {
                missing.push(format!("{call} m={m} n={n}: {name}"));
            }
        };
        let shapes = [
            16, 5120, 8192, 8193, 10240, 16383, 16384, 17408, 65535, 65536, 248320,
        ];
        for n in shapes {
            for m in 1..=16 {
                // fp8_block_gemv (Auto) and fp8_block_gemv_with_scratch.
                let (name, _) = fp8_block_gemv_kernel(m > 1, m, fp8_m1_ksplit_auto(n)).unwrap();
                need(name, "fp8_block_gemv", m, n);
                if m > 1 {
                    let s = fp8_split_auto(m, n);
                    need(
                        act_frag_kernel(false, false),
                        "fp8_block_gemv_with_scratch",
                        m,
                        n,
                    );
                    let nt = if m <= 8 { 1 } else { 2 };
                    let name = split_kernel(SplitFormat::Fp8, nt, s.warps, s.splits).unwrap();
                    need(name, "fp8_block_gemv_with_scratch", m, n);
                }
                // nvfp4_gemv (Auto: the tensor cores).
                need(nvfp4_gemv_kernel(true, m, n).0, "nvfp4_gemv", m, n);
                // fp8_gemv_tiles.
                let nt = if m <= 8 { 1 } else { 2 };
                let (split, kernel) = fp8_tiles_auto(m, n);
                match kernel {
                    Fp8TileKernel::CudaCoresM1 => {
                        need(fp8_tile_m1_kernel(split).unwrap(), "fp8_gemv_tiles", m, n)
                    }
                    Fp8TileKernel::Preconverted => {
                        need(act_frag_kernel(false, false), "fp8_gemv_tiles", m, n);
                        let name =
                            split_kernel(SplitFormat::Fp8Tile, nt, split.warps, split.splits);
                        need(name.unwrap(), "fp8_gemv_tiles", m, n);
                    }
                    Fp8TileKernel::Converting => need(
                        fp8_tile_converting_kernel(m, split).unwrap(),
                        "fp8_gemv_tiles",
                        m,
                        n,
                    ),
                }
                // fp8_gemv_tiles_fragments.
                let s = MmaSplit::fp8_fragments(m, n);
                let name = split_kernel(SplitFormat::Fp8Tile, nt, s.warps, s.splits).unwrap();
                need(name, "fp8_gemv_tiles_fragments", m, n);
                // nvfp4_gemv_tiles and the *_nvfp4_gemv steps (the same kernel after their producer).
                let (kernel, splits) = nvfp4_tiles_auto(m, n);
                need(act_frag_kernel(true, false), "nvfp4_gemv_tiles", m, n);
                if splits > 1 {
                    need(act_frag_kernel(true, true), "nvfp4_gemv_tiles", m, n);
                }
                let name = match kernel {
                    TilesKernel::Cluster(s) => {
                        split_kernel(SplitFormat::Nvfp4Tile, nt, s.warps, s.splits).unwrap()
                    }
                    k => nvfp4_tiles_name(k, m).unwrap(),
                };
                need(name, "nvfp4_gemv_tiles", m, n);
                // nvfp4_gemv_tiles_fragments.
                let name = match nvfp4_fragments_cut(m, n) {
                    TilesKernel::Cluster(s) => {
                        split_kernel(SplitFormat::Nvfp4Tile, nt, s.warps, s.splits).unwrap()
                    }
                    TilesKernel::M1Cluster => "nvfp4_gemv_tiles_m1_w8c2",
                    k => nvfp4_tiles_name(k, m).unwrap(),
                };
                need(name, "nvfp4_gemv_tiles_fragments", m, n);
            }
        }
        need("fp8_repack_mma", "fp8_repack_tiles", 0, 0);
        need("nvfp4_repack_mma", "nvfp4_repack_tiles", 0, 0);
        assert!(missing.is_empty(), "not embedded:\n{}", missing.join("\n"));
        // Without `lab` the module holds nothing else: each embedded kernel is one some `Auto` call launches.
        #[cfg(not(feature = "lab"))]
        {
            let unreached: Vec<_> = entries.iter().filter(|e| !seen.contains(*e)).collect();
            assert!(
                unreached.is_empty(),
                "embedded but no Auto call launches: {unreached:?}"
            );
        }
    }

    /// Every producer kernel the fragment writers can launch (`FragmentOrder::KERNELS` of both formats: norm,
    /// add + norm, the gated activations and the cast) is in this build's embedded `cuda/ops.cu`.
    #[cfg(feature = "cuda")]
    #[test]
    fn every_fragment_producer_kernel_is_embedded() {
        let entries = Module::Ops.entries();
        let names = Fp8Order::KERNELS.iter().chain(&Nvfp4Order::KERNELS);
        let missing: Vec<_> = names.filter(|k| !entries.contains(*k)).collect();
        assert!(
            missing.is_empty(),
            "not embedded in cuda/ops.cu: {missing:?}"
        );
    }
}
