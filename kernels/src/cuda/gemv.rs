//! Decode GEMVs (`kernels/cuda/gemv.cu`): FP8 e4m3 with 128x128 block scales and NVFP4, bf16 activations, fp32
//! outputs, on the CUDA cores or the tensor cores ([`KernelPath`]).

use super::{check_len, Gpu, GpuBuffer, KernelPath};
use crate::KernelError;

impl Gpu {
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
    ///
    /// `Auto`'s table (H200, benchmarks/h200.md run 12): `m = 1` -> `fp8_block_gemv_m1_r2_u2` (CUDA cores, 75-106%
    /// of copy bandwidth); `m = 2..=8` -> `fp8_block_gemv_mma_n8`, `m = 9..=16` -> `fp8_block_gemv_mma_n16` (tensor
    /// cores, 47-94%). A caller that can lend a scratch buffer should call [`Gpu::fp8_block_gemv_with_scratch`],
    /// whose table converts the activations once per call at `m >= 9` (1.02-1.37x there, H200 run s2-run3). The
    /// sweep variants ([`Gpu::fp8_block_gemv_m1_sweep`], [`Gpu::fp8_block_gemv_m1_bulk`]) replace an entry only
    /// where `kernels/bench/h200/bench_gemv.py` measures them faster ("Auto table candidates" in its output).
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

    /// [`Gpu::nvfp4_gemv`] on a chosen kernel family (tests and benchmarks drive each one).
    ///
    /// `Auto`'s table (H200, benchmarks/h200.md run 12): `nvfp4_gemv_mma_n8` for `m <= 8`, `nvfp4_gemv_mma_n16`
    /// above (38-61% of copy bandwidth). The decode path of an engine is not this one but the repacked tile
    /// layout, [`Gpu::nvfp4_gemv_tiles`] (1.2-1.9x faster, table there).
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

/// The tile-layout NVFP4 decode path ([`Gpu::nvfp4_repack_tiles`] + [`Gpu::nvfp4_gemv_tiles`], what an engine
/// uses), the scratch-taking FP8 entry ([`Gpu::fp8_block_gemv_with_scratch`]) and the design-sweep entry points of
/// issue 4 (decode GEMVs on the H200): each sweep variant is timed by `kernels/bench/h200/bench_gemv.py` against
/// the kernels `Auto` picks and checked by the tests against the reference; `Auto` takes one only once a
/// measurement says so.
impl Gpu {
    /// `u32` words of the activation scratch that [`Gpu::nvfp4_gemv_tiles`], [`Gpu::fp8_block_gemv_with_scratch`],
    /// [`Gpu::fp8_block_gemv_preconverted`] and [`Gpu::nvfp4_gemv_preconverted`] need for `m` rows of `k` values:
    /// the f16 B fragments of `ceil(k/128)` chunks x one (m <= 8) or two 8-token tiles, 2 KiB each. One buffer of
    /// `gemv_scratch_len(16, k_max)` words serves every call of a model (32 bytes per `k`: 544 KiB at k = 17408).
    pub fn gemv_scratch_len(m: usize, k: usize) -> usize {
        k.div_ceil(128) * if m <= 8 { 1 } else { 2 } * 512
    }

    /// [`Gpu::fp8_block_gemv`] on the tensor cores with the activations converted once per call (one small
    /// kernel, `gemv_act_frag_fp8`) to f16 in `mma` fragment order into `scratch` (at least
    /// [`Gpu::gemv_scratch_len`] words, contents ignored), so the GEMV's lanes load their B fragments instead of
    /// converting 32 activations per token tile for every weight tile.
    #[allow(clippy::too_many_arguments)]
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
        const OP: &str = "cuda::fp8_block_gemv_preconverted";
        check_fp8_gemv(OP, x, w, scales, y, m, n, k)?;
        check_scratch(OP, scratch, m, k)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.fp8_block_gemv_pre(
                &x.slice,
                &mut scratch.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
                m,
                n,
                k,
            )
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// [`Gpu::fp8_block_gemv`] for `m = 1` on the CUDA cores with two rows per warp, as `Auto` does, in one of the
    /// sweep's forms: two (`four_loads = false`) or four 16-byte loads in flight per row; `splits = None`: every
    /// weight load carries the L2 256-byte prefetch hint; `Some(s)` (`1..=64`): the K dimension is cut into `s`
    /// ranges run by separate blocks that add their partial sums into `y` (zeroed first) with atomics, for
    /// short matrices whose rows fill only a fraction of the last wave (the order of the additions varies, so
    /// results differ from run to run in the last bits).
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemv_m1_sweep(
        &self,
        four_loads: bool,
        splits: Option<u32>,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemv_m1_sweep";
        check_fp8_gemv(OP, x, w, scales, y, 1, n, k)?;
        if let Some(s) = splits {
            crate::ensure_shape!((1..=64).contains(&s), OP, "splits must be 1..=64, got {s}");
        }
        #[cfg(feature = "cuda")]
        {
            self.inner.fp8_block_gemv_m1_variant(
                four_loads,
                splits,
                &x.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
                n,
                k,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = four_loads;
            match self.never {}
        }
    }

    /// [`Gpu::nvfp4_gemv`] on the tensor cores (checkpoint layout) with the activations converted once per call
    /// into `scratch` (at least [`Gpu::gemv_scratch_len`] words), as [`Gpu::fp8_block_gemv_preconverted`].
    #[allow(clippy::too_many_arguments)]
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
        check_nvfp4_gemv(OP, x, w, scales, global_scale, y, m, n, k)?;
        check_scratch(OP, scratch, m, k)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.nvfp4_gemv_pre(
                &x.slice,
                &mut scratch.slice,
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
        check_len(OP, "w", w.len(), n * k / 2)?;
        check_len(OP, "scales", scales.len(), n * k / 16)?;
        let tiles = n.div_ceil(16) * k.div_ceil(128);
        let mut wr = self.zeros::<u8>(tiles * 1024)?;
        let mut sr = self.zeros::<u32>(tiles * 32)?;
        #[cfg(feature = "cuda")]
        self.inner
            .nvfp4_repack_mma(&w.slice, &scales.slice, &mut wr.slice, &mut sr.slice, n, k)?;
        #[cfg(not(feature = "cuda"))]
        let _ = (&mut wr, &mut sr);
        Ok(Nvfp4TileWeights {
            w: wr,
            scales: sr,
            n,
            k,
        })
    }

    /// `y[m][n] = global_scale * x[m][k] . W[n][k]` over NVFP4 weights in the tile layout (the same product as
    /// [`Gpu::nvfp4_gemv`] on the same weights before [`Gpu::nvfp4_repack_tiles`]), on the tensor cores,
    /// `1 <= m <= 16`: **the NVFP4 decode GEMV**. An engine repacks each NVFP4 weight once at load
    /// ([`Gpu::nvfp4_repack_tiles`]) and calls this per token; `scratch` (at least [`Gpu::gemv_scratch_len`]`(m, k)`
    /// words, contents ignored, reusable across calls and weights) receives the activations converted once per
    /// call to f16 `mma` fragments. Nothing is allocated per call.
    ///
    /// The kernel is chosen by `m` (and the shape) from the H200 measurements of `kernels/bench/h200/bench_gemv.py`
    /// (run s2-run3, `benchmarks/h200-runs/s2-run3/bench_gemv.txt`): activations preconverted at every `m`, one
    /// chunk in flight per warp, no K split:
    ///
    /// | shape (n x k) | m = 1 | m = 4 | m = 16 | checkpoint layout, `Auto`, m = 1 / 4 / 16 |
    /// |---|---|---|---|---|
    /// | 5120 x 17408 | 21.9 us, 54% of copy | 22.1 us, 54% | 25.1 us, 48% | 28.8 / 29.1 / 44.0 us |
    /// | 17408 x 5120 | 18.6 us, 64% | 18.8 us, 64% | 23.9 us, 51% | 24.2 / 24.4 / 40.2 us |
    /// | 5120 x 10240 | 14.6 us, 48% | 14.7 us, 48% | 16.4 us, 43% | 18.0 / 18.1 / 27.4 us |
    /// | 248320 x 5120 (lm_head) | 197 us, 86% | 222 us, 77% | 312 us, 56% | 292 / 306 / 578 us |
    ///
    /// (Measured with the `nvfp4_gemv_mma_tile_pre_*` kernel; the `nvfp4_gemv_tiles_*` kernels this launches do
    /// the same arithmetic, bit for bit, and skip the loads of zero fragments. The variants of
    /// [`Gpu::nvfp4_gemv_tiles_variant`] — two chunks in flight, K splits for the short matrices — were built from
    /// the analysis in `cuda/gemv.cu` and replace entries of this table only once the benchmark measures them.)
    pub fn nvfp4_gemv_tiles(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: &mut GpuBuffer<u32>,
        m: usize,
    ) -> Result<(), KernelError> {
        let (chunks, splits) = nvfp4_tiles_auto(m, tiles.n());
        self.tiles_launch(
            "cuda::nvfp4_gemv_tiles",
            x,
            tiles,
            global_scale,
            y,
            Some(scratch),
            m,
            chunks,
            splits,
        )
    }

    /// [`Gpu::nvfp4_gemv_tiles`] on a chosen variant (tests and the benchmark drive each one).
    ///
    /// With `scratch` (at least [`Gpu::gemv_scratch_len`] words): activations preconverted, `chunks_in_flight`
    /// (1 or 2) 1 KiB weight chunks loaded per warp before the first is used, and the K chunks cut into `k_splits`
    /// (1..=16) ranges run by separate blocks whose partial sums are added into `y` with atomics (`y` is zeroed
    /// by the conversion kernel; with 2 splits the result does not depend on the order, with more it may differ
    /// from run to run in the last bits). Without `scratch`: the activations are converted per weight tile inside
    /// the GEMV (`chunks_in_flight` and `k_splits` must be 1), slower at every `m` measured.
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemv_tiles_variant(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: Option<&mut GpuBuffer<u32>>,
        m: usize,
        chunks_in_flight: usize,
        k_splits: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_tiles_variant";
        crate::ensure_shape!(
            (1..=2).contains(&chunks_in_flight),
            OP,
            "chunks_in_flight must be 1 or 2, got {chunks_in_flight}"
        );
        crate::ensure_shape!(
            (1..=16).contains(&k_splits),
            OP,
            "k_splits must be 1..=16, got {k_splits}"
        );
        crate::ensure_shape!(
            scratch.is_some() || (chunks_in_flight == 1 && k_splits == 1),
            OP,
            "without a scratch buffer (activations converted in the GEMV) only chunks_in_flight = 1 and \
             k_splits = 1 exist, got {chunks_in_flight} and {k_splits}"
        );
        self.tiles_launch(
            OP,
            x,
            tiles,
            global_scale,
            y,
            scratch,
            m,
            chunks_in_flight,
            k_splits,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn tiles_launch(
        &self,
        op: &'static str,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: Option<&mut GpuBuffer<u32>>,
        m: usize,
        chunks: usize,
        splits: usize,
    ) -> Result<(), KernelError> {
        let (n, k) = (tiles.n, tiles.k);
        check_gemv_dims(op, m, n, k, 32)?;
        check_len(op, "x", x.len(), m * k)?;
        check_len(op, "y", y.len(), m * n)?;
        crate::ensure_shape!(
            global_scale.is_finite(),
            op,
            "global_scale must be finite, got {global_scale}"
        );
        if let Some(s) = scratch.as_deref() {
            check_scratch(op, s, m, k)?;
        }
        #[cfg(feature = "cuda")]
        {
            self.inner.nvfp4_gemv_tiles(
                &x.slice,
                scratch.map(|s| &mut s.slice),
                &tiles.w.slice,
                &tiles.scales.slice,
                global_scale,
                &mut y.slice,
                m,
                n,
                k,
                chunks,
                splits,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (scratch, chunks, splits);
            match self.never {}
        }
    }

    /// [`Gpu::fp8_block_gemv`] with a caller-owned activation scratch (at least [`Gpu::gemv_scratch_len`]`(m, k)`
    /// words, contents ignored, reusable across calls): `Auto`'s table, except that for `m >= 9` the activations
    /// are converted once per call ([`Gpu::fp8_block_gemv_preconverted`]), measured faster there at every shape
    /// on the H200 (run s2-run3, m = 16: 5120x17408 34.5 vs 42.6 us, 17408x5120 39.9 vs 40.6, 5120x10240 22.8 vs
    /// 26.6, 248320x5120 397 vs 546); at m = 4 the two were within +-4% (31.9 vs 32.0 us on 5120x17408, 32.8
    /// vs 31.5 on 17408x5120), and m = 5..=8 runs the same one-token-tile kernel as m = 4, so `Auto` keeps them.
    /// The scratch is a parameter because the device context has no buffer of its own for it yet.
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
        if m >= FP8_PRECONVERT_FROM_M {
            self.fp8_block_gemv_preconverted(x, w, scales, y, scratch, m, n, k)
        } else {
            self.fp8_block_gemv_with(KernelPath::Auto, x, w, scales, y, m, n, k)
        }
    }

    /// [`Gpu::fp8_block_gemv`] for `m = 1` streamed through shared memory (issue 4 item 2): each warp owns a ring
    /// of `stages` buffers (2 x 4 KiB, 4 x 2 KiB or 8 x 1 KiB) that 1-D bulk copies (`cp.async.bulk`, completing
    /// on mbarriers) fill while the warp consumes the previous ones, so the bytes in flight no longer cost
    /// registers; the rows are spread over `warps_per_sm` (1..=24) warps per SM, a contiguous run of rows each.
    /// Deterministic (one warp sums each row). A sweep variant: [`KernelPath::Auto`] does not take it until
    /// `kernels/bench/h200/bench_gemv.py` measures it faster.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemv_m1_bulk(
        &self,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        n: usize,
        k: usize,
        stages: usize,
        warps_per_sm: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemv_m1_bulk";
        check_fp8_gemv(OP, x, w, scales, y, 1, n, k)?;
        crate::ensure_shape!(
            matches!(stages, 2 | 4 | 8),
            OP,
            "stages must be 2, 4 or 8, got {stages}"
        );
        crate::ensure_shape!(
            (1..=24).contains(&warps_per_sm),
            OP,
            "warps_per_sm must be 1..=24, got {warps_per_sm}"
        );
        #[cfg(feature = "cuda")]
        {
            self.inner.fp8_block_gemv_m1_bulk(
                &x.slice,
                &w.slice,
                &scales.slice,
                &mut y.slice,
                n,
                k,
                stages,
                warps_per_sm,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (stages, warps_per_sm);
            match self.never {}
        }
    }
}

/// From this `m` on, [`Gpu::fp8_block_gemv_with_scratch`] converts the activations once per call (the two-token-
/// tile kernels, `m >= 9`); measurements in its documentation.
const FP8_PRECONVERT_FROM_M: usize = 9;

/// `Auto`'s choice for [`Gpu::nvfp4_gemv_tiles`]: `(chunks in flight per warp, K splits)` for `m` tokens and
/// `n` rows. Activations are always preconverted (faster than converting them in the GEMV at every m and shape
/// measured: 1.04-1.47x, H200 run s2-run3). Two K splits where the rows alone leave the GPU short of blocks:
/// at m <= 8 on the 5120-row shapes (320 tiles of 16 rows for 132 SMs) they took 19.2 / 13.0 us against 22.3 /
/// 14.9 us with one (5120x17408, 5120x10240, m = 1; s2-run5), while on 17408 rows and the 248320-row lm_head
/// one split was faster (19.7 vs 20.4 us, 224 vs 251 us). Two chunks in flight never won. At m = 16 the
/// earlier `nvfp4_gemv_mma_tile_pre_n16` kernel (bench arm `tilepre`) was 4-25% faster than every
/// chunk/split variant of this kernel: folding its loop back in is the next step for m > 8.
fn nvfp4_tiles_auto(m: usize, n: usize) -> (usize, usize) {
    if m <= 8 && n <= 8192 {
        (1, 2)
    } else {
        (1, 1)
    }
}

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
    check_len(op, "x", x.len(), m * k)?;
    check_len(op, "w", w.len(), n * k)?;
    check_len(
        op,
        "scales",
        scales.len(),
        n.div_ceil(128) * k.div_ceil(128),
    )?;
    check_len(op, "y", y.len(), m * n)
}

#[allow(clippy::too_many_arguments)]
fn check_nvfp4_gemv(
    op: &'static str,
    x: &GpuBuffer<u16>,
    w: &GpuBuffer<u8>,
    scales: &GpuBuffer<u8>,
    global_scale: f32,
    y: &GpuBuffer<f32>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    check_gemv_dims(op, m, n, k, 32)?;
    check_len(op, "x", x.len(), m * k)?;
    check_len(op, "w", w.len(), n * k / 2)?;
    check_len(op, "scales", scales.len(), n * k / 16)?;
    check_len(op, "y", y.len(), m * n)?;
    crate::ensure_shape!(
        global_scale.is_finite(),
        op,
        "global_scale must be finite, got {global_scale}"
    );
    Ok(())
}

fn check_scratch(
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
}
