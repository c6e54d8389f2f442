//! Prefill GEMMs on Hopper's warpgroup MMA (`wgmma`, `cuda/gemm_sm90a.cu`, an sm_90a cubin that loads only on a
//! compute-capability-9.0 device such as the H200): the same semantics and layouts as [`Gpu::fp8_block_gemm`]
//! and [`Gpu::nvfp4_gemm`], so they are drop-in faster paths for prefill, with tighter K constraints
//! (`k % 128 == 0` for FP8, `k % 64 == 0` for NVFP4).
//!
//! FP8 comes in four builds of one algorithm (128x128 output tiles, 128 of K per stage, per-128-K partials
//! from `wgmma` m64n128k32 e4m3 promoted into fp32 with both block scales on the CUDA cores):
//! - [`Fp8Wgmma::CpAsync`] (v1): two warpgroups load a 4-stage ring with `cp.async` and then
//!   compute; the simplest correct wgmma kernel. H200, M = 4096, 5120x17408 / 17408x5120: 1018-1048 us,
//!   0.52-0.56x cuBLAS FP8.
//! - [`Fp8Wgmma::Tma`] (v2): a producer warpgroup issues TMA copies into a 6-stage ring guarded
//!   by mbarriers; two consumer warpgroups compute (DeepGEMM's structure). 818-855 us, 0.64-0.70x cuBLAS FP8
//!   (`torch._scaled_mm` rowwise 537-543 us, block-scaled 572 us), 855-930 TFLOP/s.
//! - [`Fp8Wgmma::Persistent`] (v3): v2 as a persistent kernel, one block per SM walking its
//!   tiles, the ring running on across tiles (the next tile's loads overlap this tile's epilogue).
//! - [`Fp8Wgmma::PingPong`] (v4): v3 with two partial register tiles, so the wgmmas of K block
//!   `kb + 1` run while the promotion of `kb` is done.
//!
//! NVFP4 comes in two builds: [`Nvfp4Wgmma::Synchronous`] (v1, measured: 0.43-0.46x cuBLAS bf16)
//! and [`Nvfp4Wgmma::WarpSpecialized`] (v2: TMA for x, producer warpgroups decoding the weights
//! into an mbarrier ring, consumer warpgroups issuing wgmmas); [`Gpu::nvfp4_gemm_wgmma`] picks v1 until the
//! H200 has timed v2.
//!
//! Measured on the H200 at M = 4096 on 5120x17408 / 17408x5120 (benchmarks/h200-runs/s2-run5, one run, all
//! arms checked against torch first): v1 987 / 1050 us, v2 816 / 853, v3 906 / 889, v4 712 / 729 us (1026 /
//! 1002 TFLOP/s) against `torch._scaled_mm` rowwise 524 / 527 us and with the same block scales 560 / 560 us:
//! v4 is 0.72-0.74x the rowwise and 0.77-0.79x the block-scaled cuBLAS, and [`Gpu::fp8_block_gemm_wgmma`] runs
//! it. NVFP4: v1 2137 / 2154 us, v2 1784 / 1819 us against bf16 `torch.matmul` 904 / 910 us (0.50-0.51x):
//! [`Gpu::nvfp4_gemm_wgmma`] runs v2.

use super::{check_len, Gpu, GpuBuffer};
use crate::KernelError;

/// Which build of the wgmma FP8 GEMM runs (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Wgmma {
    /// v1, `fp8_block_gemm_sm90a_v1`: `cp.async` loads by the computing warpgroups (no TMA, no warp
    /// specialisation).
    CpAsync,
    /// v2, `fp8_block_gemm_sm90a_v2`: TMA loads (tensor maps encoded per call) by a producer warpgroup into an
    /// mbarrier ring, two consumer warpgroups, one block per tile.
    Tma,
    /// v3, `fp8_block_gemm_sm90a_v3`: v2 as a persistent kernel (one block per SM, tiles `b, b + grid, ...` in
    /// the grouped order; the producer runs on into the next tile while the consumers store this one).
    Persistent,
    /// v4, `fp8_block_gemm_sm90a_v4`: v3 with two partial register tiles per consumer thread, so the wgmmas of
    /// K block `kb + 1` are in flight while the partial of `kb` is promoted (`wgmma.wait_group 1`).
    PingPong,
}

/// Which build of the wgmma NVFP4 GEMM runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nvfp4Wgmma {
    /// v1, `nvfp4_gemm_sm90a_v1`: 256 threads load x and the packed weights with `cp.async` into a 4-stage
    /// ring, all decode each 64-K tile into a double-buffered bf16 tile, then both warpgroups issue their wgmmas
    /// (two block barriers per K tile).
    Synchronous,
    /// v2, `nvfp4_gemm_sm90a_v2`: x by TMA; two producer warpgroups load the packed weights four K tiles ahead
    /// and decode them straight into the swizzled bf16 B tile of each stage of a 6-stage mbarrier ring; two
    /// consumer warpgroups only wait and issue wgmmas. No block barrier in the K loop.
    WarpSpecialized,
}

/// The build [`Gpu::nvfp4_gemm_wgmma`] (and so [`Gpu::nvfp4_gemm`] on compute capability 9.0) runs: v2, 1.17-1.20x
/// v1 on the H200 (s2-run5, numbers in the module docs).
const NVFP4_BEST: Nvfp4Wgmma = Nvfp4Wgmma::WarpSpecialized;

/// The build [`Gpu::fp8_block_gemm_wgmma`] (and so [`Gpu::fp8_block_gemm`] on compute capability 9.0) runs.
/// v4, 1.15-1.17x v2 on the H200 (s2-run5, numbers in the module docs).
const FP8_BEST: Fp8Wgmma = Fp8Wgmma::PingPong;

/// Sizes every wgmma GEMM accepts: positive, within the kernels' 32-bit indices, K a multiple of the kernel's K
/// tile, and at most `i32::MAX` output tiles of 128x128 (the 1D grid).
fn check_dims(
    op: &'static str,
    m: usize,
    n: usize,
    k: usize,
    k_tile: usize,
) -> Result<(), KernelError> {
    crate::ensure_shape!(
        m > 0 && n > 0 && k > 0,
        op,
        "m, n and k must be positive, got m = {m}, n = {n}, k = {k}"
    );
    crate::ensure_shape!(
        k.is_multiple_of(k_tile),
        op,
        "k must be a multiple of {k_tile} (the wgmma GEMM's K tile), got {k}"
    );
    crate::ensure_shape!(
        m <= i32::MAX as usize && n <= i32::MAX as usize && k <= i32::MAX as usize,
        op,
        "m = {m}, n = {n} and k = {k} must fit the kernel's 32-bit indices"
    );
    crate::ensure_shape!(
        m.div_ceil(128) * n.div_ceil(128) <= i32::MAX as usize,
        op,
        "m = {m} and n = {n} make more 128x128 tiles than a grid holds"
    );
    Ok(())
}

/// Whether `check_dims` accepts this shape: the public GEMMs of `super::gemm` take the wgmma path only then.
pub(super) fn wgmma_fits(m: usize, n: usize, k: usize, k_tile: usize) -> bool {
    check_dims("", m, n, k, k_tile).is_ok()
}

impl Gpu {
    /// [`Gpu::fp8_block_gemm`] on wgmma, the measured-best build (v4, [`Fp8Wgmma::PingPong`];
    /// numbers in the module docs): `y[m][n] = sum_k e4m3(xq[m][k]) * x_scales[m][k/128] *
    /// e4m3(w[n][k]) * w_scales[n/128][k/128]`, fp32 out.
    ///
    /// `xq`: e4m3 `[m, k]`, `x_scales`: fp32 `[m, k/128]` (from [`Gpu::fp8_quantize_activations`]); `w`: e4m3
    /// `[n, k]`; `w_scales`: fp32 `[ceil(n/128), k/128]`; `y`: fp32 `[m, n]`. Needs `k % 128 == 0` (every K tile
    /// is one whole scale block), `1 <= m, n` and sizes within 32-bit indices; runs only on compute capability 9.0
    /// (an error elsewhere).
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemm_wgmma(
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
        self.fp8_wgmma(FP8_BEST, xq, x_scales, w, w_scales, y, m, n, k)
    }

    /// [`Gpu::fp8_block_gemm_wgmma`] on a chosen build ([`Fp8Wgmma`]; tests and benchmarks drive each one).
    /// Same layouts and constraints.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemm_wgmma_with(
        &self,
        build: Fp8Wgmma,
        xq: &GpuBuffer<u8>,
        x_scales: &GpuBuffer<f32>,
        w: &GpuBuffer<u8>,
        w_scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.fp8_wgmma(build, xq, x_scales, w, w_scales, y, m, n, k)
    }

    /// Whether this device runs the sm_90a (wgmma) module: compute capability 9.0 exactly.
    pub(super) fn has_wgmma(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            self.inner.has_wgmma()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    #[allow(clippy::too_many_arguments)]
    fn fp8_wgmma(
        &self,
        variant: Fp8Wgmma,
        xq: &GpuBuffer<u8>,
        x_scales: &GpuBuffer<f32>,
        w: &GpuBuffer<u8>,
        w_scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemm_wgmma";
        check_dims(OP, m, n, k, 128)?;
        let kb = k / 128;
        check_len(OP, "xq", xq.len(), m * k)?;
        check_len(OP, "x_scales", x_scales.len(), m * kb)?;
        check_len(OP, "w", w.len(), n * k)?;
        check_len(OP, "w_scales", w_scales.len(), n.div_ceil(128) * kb)?;
        check_len(OP, "y", y.len(), m * n)?;
        #[cfg(feature = "cuda")]
        {
            self.inner.fp8_block_gemm_sm90a(
                variant,
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
        {
            let _ = variant;
            match self.never {}
        }
    }

    /// [`Gpu::nvfp4_gemm`] on wgmma, the measured-best build (v2, [`Nvfp4Wgmma::WarpSpecialized`];
    /// H200, `m = 4096`, 5120x17408 and 17408x5120: 1784-1819 us, 0.50-0.51x cuBLAS bf16, 1.95-1.97x the
    /// mma.sync kernel): `y[m][n] = global_scale * sum_k x[m][k] *
    /// e2m1(w[n][k]) * e4m3(scales[n][k/16])`, fp32 out. The weights are decoded to bf16 in shared memory
    /// (exact: an e2m1 value times an e4m3 scale has at most 5 significant bits) and multiplied by `wgmma`
    /// m64n128k16 bf16 with fp32 accumulation; the global scale is applied to the result.
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: `[n, k/2]` bytes, the even element in the low nibble; `scales`: e4m3
    /// `[n, k/16]`; `y`: fp32 `[m, n]`. Needs `k % 64 == 0`, `1 <= m, n`, a finite `global_scale` and sizes
    /// within 32-bit indices; runs only on compute capability 9.0 (an error elsewhere).
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemm_wgmma(
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
        self.nvfp4_wgmma(NVFP4_BEST, x, w, scales, global_scale, y, m, n, k)
    }

    /// [`Gpu::nvfp4_gemm_wgmma`] on a chosen build ([`Nvfp4Wgmma`]; tests and benchmarks drive each one). Same
    /// layouts and constraints.
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemm_wgmma_with(
        &self,
        build: Nvfp4Wgmma,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.nvfp4_wgmma(build, x, w, scales, global_scale, y, m, n, k)
    }

    #[allow(clippy::too_many_arguments)]
    fn nvfp4_wgmma(
        &self,
        variant: Nvfp4Wgmma,
        x: &GpuBuffer<u16>,
        w: &GpuBuffer<u8>,
        scales: &GpuBuffer<u8>,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemm_wgmma";
        check_dims(OP, m, n, k, 64)?;
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
            self.inner.nvfp4_gemm_sm90a(
                variant,
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
            let _ = variant;
            match self.never {}
        }
    }
}
