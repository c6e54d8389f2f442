//! Prefill GEMMs on Hopper's warpgroup MMA (`wgmma`, `cuda/gemm_sm90a.cu`, an sm_90a cubin that loads only on a
//! compute-capability-9.0 device such as the H200): the same semantics and layouts as [`Gpu::fp8_block_gemm`]
//! and [`Gpu::nvfp4_gemm`], so they are drop-in faster paths for prefill, with tighter K constraints
//! (`k % 128 == 0` for FP8, `k % 64 == 0` for NVFP4).
//!
//! FP8 comes in four builds of one algorithm (128x128 output tiles; 128 of K per stage; per-128-K
//! partials from `wgmma` e4m3 promoted into fp32 with both block scales on the CUDA cores):
//! - [`Fp8Wgmma::CpAsync`] (v1): two warpgroups load a 4-stage ring with `cp.async` and then
//!   compute; the simplest correct wgmma kernel.
//! - [`Fp8Wgmma::Tma`] (v2): a producer warpgroup issues TMA copies into a 6-stage ring guarded
//!   by mbarriers; two consumer warpgroups compute (DeepGEMM's structure).
//! - [`Fp8Wgmma::Persistent`] (v3): v2 as a persistent kernel, one block per SM walking its
//!   tiles, the ring running on across tiles (the next tile's loads overlap this tile's epilogue).
//! - [`Fp8Wgmma::PingPong`] (v4): v3 with two partial register tiles, so the wgmmas of K block
//!   `kb + 1` run while the promotion of `kb` is done. [`Gpu::fp8_block_gemm_wgmma`] runs it (fp32 out), and
//!   [`Gpu::fp8_block_gemm_wgmma_bf16`] runs it with a bf16 epilogue (round to nearest even, half the output
//!   bytes: what cuBLAS `_scaled_mm` writes, so the like-for-like comparison).
//!
//! Only v4 has the bf16 epilogue, so the bf16 entry point takes no build.
//!
//! Measured on the H200 at M = 4096 on 5120x17408 / 17408x5120 (`benchmarks/h200.md`, one run, all
//! arms checked against torch first): v1 987 / 1050 us, v2 816 / 853, v3 906 / 889, v4 712 / 729 us (1026 /
//! 1002 TFLOP/s) against `torch._scaled_mm` rowwise 524 / 527 us and with the same block scales 560 / 560 us:
//! v4 is 0.72-0.74x the rowwise and 0.77-0.79x the block-scaled cuBLAS (715 / 744 us, 0.79 / 0.76x
//! block-scaled: 693.2 / 735.7 us fp32 out, 691.6 / 712.2 us bf16 out, 0.82 / 0.80x block-scaled
//! cuBLAS, numbers at [`Gpu::fp8_block_gemm_wgmma_bf16`]). A fifth build, v4 in 2x1 clusters multicasting the
//! weight tile (0.75x the L2 -> SM bytes), was removed once the H200 measured it at 741 / 777 us, 0.96-0.99x v4
//! at M = 512, 2048 and 4096. (128x256 tiles do not fit v4: per-128-K promotion of a 64x256 warpgroup tile needs
//! 128 accumulator + 2 x 128 partial registers per thread.) A sixth, "v6" (v4 with 128x192 tiles, ping-pong over
//! two m64n96k32 halves per K block), was removed once the H200 measured it at 859.9 / 855.9 us against v4's
//! 693.2 / 735.7 us (0.81x / 0.86x v4; M = 2048: 0.76x / 0.87x).
//!
//! NVFP4 comes in three builds: [`Nvfp4Wgmma::Synchronous`] (v1), [`Nvfp4Wgmma::WarpSpecialized`] (v2: TMA for
//! x, producer warpgroups decoding the weights into an mbarrier ring, consumer warpgroups issuing wgmmas) and
//! [`Nvfp4Wgmma::PrmtDecode256`] (v3: v2 with 256-row tiles and a byte-permute decode), which
//! [`Gpu::nvfp4_gemm_wgmma`] runs (the table at `NVFP4_BEST`).

#[cfg(feature = "cuda")]
use cudarc::driver::{sys, DevicePtr, DeviceRepr, LaunchArgs, PushKernelArg};

#[cfg(feature = "cuda")]
use super::device::{launch_config, ActivationArg, Module};
use super::{check_len_of, check_nvfp4_operands, Gpu, GpuBuffer};
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
    /// v4, `fp8_block_gemm_sm90a_v4` (`_v4_bf16` for bf16 out): v3 with two partial register tiles per
    /// consumer thread, so the wgmmas of K block `kb + 1` are in flight while the partial of `kb` is promoted
    /// (`wgmma.wait_group 1`).
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
    /// v3, `nvfp4_gemm_sm90a_v3`: v2's structure with 256-row tiles (each consumer warpgroup owns 128 rows, so
    /// each decoded weight feeds twice the MMA work) and an e2m1 -> bf16 decode by byte permutes (`prmt` against
    /// two 8-byte tables in registers, the group scale applied by exact `mul.rn.bf16x2`); a 4-stage ring.
    PrmtDecode256,
}

/// The build [`Gpu::nvfp4_gemm_wgmma`] (and so [`Gpu::nvfp4_gemm`] on compute capability 9.0) runs: v3, faster
/// than v2 at every measured M. H200, N x K = 5120x17408 / 17408x5120, all arms checked against an fp32 torch
/// reference first and timed in the same rounds (`benchmarks/h200.md`):
///
/// | M | v3 us | v2 us | v3 / v2 speed | cuBLAS bf16 `torch.matmul` us | v3 / cuBLAS speed |
/// |---:|---:|---:|---:|---:|---:|
/// | 4096 | 1104 / 1171 | 1783 / 1808 | 1.61 / 1.54 | 907 / 914 | 0.82 / 0.78 |
/// | 2048 | 646 / 614 | 865 / 907 | 1.34 / 1.48 | 454 / 477 | 0.70 / 0.78 |
/// | 512 | 208 / 202 | 343 / 262 | 1.65 / 1.29 | 124 / 121 | 0.60 / 0.60 |
///
/// The final run agrees: M = 4096 1119.6 / 1188.4 us, 0.82x / 0.78x cuBLAS bf16 `torch.matmul`
/// (919.0 / 923.1 us); M = 2048 0.70x / 0.77x; M = 512 0.60x.
///
/// v2 ([`Nvfp4Wgmma::WarpSpecialized`]) stays selectable through [`Gpu::nvfp4_gemm_wgmma_with`].
const NVFP4_BEST: Nvfp4Wgmma = Nvfp4Wgmma::PrmtDecode256;

/// The build [`Gpu::fp8_block_gemm_wgmma`] (and so [`Gpu::fp8_block_gemm`] on compute capability 9.0) runs.
/// v4, 1.15-1.17x v2 on the H200 (numbers in the module docs). Final H200 run (M = 4096,
/// 5120x17408 / 17408x5120): fp32 out 693.2 / 735.7 us; with the bf16 epilogue
/// ([`Gpu::fp8_block_gemm_wgmma_bf16`], the like-for-like comparison: cuBLAS writes bf16 too) 691.6 / 712.2 us
/// = 0.82x / 0.80x cuBLAS `_scaled_mm` with the same 1x128 / 128x128 block scales (566.9 / 570.6 us) and
/// 0.77x / 0.76x `_scaled_mm` rowwise (531.5 / 539.1 us); M = 2048: 0.85x / 0.85x block-scaled. The 128x192
/// build tried in its place (v6) lost everywhere and was removed (module docs).
const FP8_BEST: Fp8Wgmma = Fp8Wgmma::PingPong;

/// The output of an FP8 wgmma GEMM: fp32, or bf16 bits (only v4 has the bf16 epilogue; the bf16 entry points
/// refuse the other builds).
enum Fp8Out<'a> {
    F32(&'a mut GpuBuffer<f32>),
    Bf16(&'a mut GpuBuffer<u16>),
}

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
        self.fp8_wgmma(FP8_BEST, xq, x_scales, w, w_scales, Fp8Out::F32(y), m, n, k)
    }

    /// [`Gpu::fp8_block_gemm_wgmma`] on a chosen build ([`Fp8Wgmma`]; tests and benchmarks drive each one).
    /// Same layouts and constraints.
    #[cfg(feature = "lab")]
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
        self.fp8_wgmma(build, xq, x_scales, w, w_scales, Fp8Out::F32(y), m, n, k)
    }

    /// [`Gpu::fp8_block_gemm_wgmma`] writing bf16: the same build (v4) and fp32 accumulation, each output
    /// rounded to nearest even once at the store (so element for element `bf16(fp32 result)`, ties to even,
    /// exactly what [`crate::formats::f32_to_bf16`] gives for the fp32 path's output). Half the output bytes of
    /// the fp32 form (at m = 4096, n = 17408: 143 MB instead of 285 MB per call), and the output cuBLAS
    /// `torch._scaled_mm` writes.
    ///
    /// Measured on the H200 (`benchmarks/h200.md`, 5120x17408 / 17408x5120, checked against torch
    /// first): at `m = 4096` 691.6 / 712.2 us (fp32 out 693.2 / 735.7 us) = 0.82x / 0.80x cuBLAS
    /// `torch._scaled_mm` with the same 1x128 / 128x128 block scales and bf16 output (566.9 / 570.6 us), and
    /// 0.77x / 0.76x `_scaled_mm` rowwise (531.5 / 539.1 us); at `m = 2048` 0.85x / 0.85x block-scaled.
    ///
    /// `y`: bf16 bits `[m, n]`; everything else as [`Gpu::fp8_block_gemm_wgmma`].
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemm_wgmma_bf16(
        &self,
        xq: &GpuBuffer<u8>,
        x_scales: &GpuBuffer<f32>,
        w: &GpuBuffer<u8>,
        w_scales: &GpuBuffer<f32>,
        y: &mut GpuBuffer<u16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        self.fp8_wgmma(
            FP8_BEST,
            xq,
            x_scales,
            w,
            w_scales,
            Fp8Out::Bf16(y),
            m,
            n,
            k,
        )
    }

    /// Whether this device runs the sm_90a (wgmma) module: compute capability 9.0 exactly.
    pub(super) fn has_wgmma(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            self.inner.has_wgmma()
        }
        no_cuda!(self)
    }

    #[allow(clippy::too_many_arguments)]
    fn fp8_wgmma(
        &self,
        variant: Fp8Wgmma,
        xq: &GpuBuffer<u8>,
        x_scales: &GpuBuffer<f32>,
        w: &GpuBuffer<u8>,
        w_scales: &GpuBuffer<f32>,
        y: Fp8Out<'_>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::fp8_block_gemm_wgmma";
        check_dims(OP, m, n, k, 128)?;
        let kb = k / 128;
        check_len_of(OP, "xq", xq.len(), &[m, k])?;
        check_len_of(OP, "x_scales", x_scales.len(), &[m, kb])?;
        check_len_of(OP, "w", w.len(), &[n, k])?;
        check_len_of(OP, "w_scales", w_scales.len(), &[n.div_ceil(128), kb])?;
        let y_len = match &y {
            Fp8Out::F32(y) => y.len(),
            Fp8Out::Bf16(y) => y.len(),
        };
        check_len_of(OP, "y", y_len, &[m, n])?;
        #[cfg(feature = "cuda")]
        {
            // The FP8 wgmma kernels of cuda/gemm_sm90a.cu: `_v1` (cp.async ring, 2 warpgroups, one block per
            // tile), `_v2` (TMA + mbarriers, producer warpgroup + 2 consumer warpgroups, one block per tile), `_v3`
            // (v2 persistent: one block per SM looping over tiles) and `_v4` (v3 with ping-pong partials);
            // `_v4_bf16` writes bf16. A bf16 output with another build is refused.
            let dev = &self.inner;
            let bf16 = matches!(y, Fp8Out::Bf16(_));
            let (name, smem, threads) = fp8_wgmma_kernel(variant, bf16)?;
            let f = dev.function_with_smem(Module::GemmSm90a, name, smem)?;
            let tiles = tile_grid(m, n);
            let blocks = match variant {
                // Persistent kernels: one block per SM (the ring's shared memory allows one), at most one per tile.
                Fp8Wgmma::Persistent | Fp8Wgmma::PingPong => {
                    tiles.min(dev.sm_count().max(1) as u32)
                }
                Fp8Wgmma::CpAsync | Fp8Wgmma::Tma => tiles,
            };
            let cfg = launch_config((blocks, 1, 1), (threads, 1, 1), smem);
            if variant != Fp8Wgmma::CpAsync {
                // The guards order these raw-pointer uses after any pending writes on other streams and keep the
                // buffers' events until the launch is queued.
                let (xp, _gx) = xq.slice.device_ptr(dev.stream());
                let (wp, _gw) = w.slice.device_ptr(dev.stream());
                let ta = tensor_map_u8(xp, m, k)?;
                let tb = tensor_map_u8(wp, n, k)?;
                let (mi, ni, ki) = (m as i32, n as i32, k as i32);
                // SAFETY: matches `fp8_block_gemm_sm90a_v2`/`_v3`/`_v4` (y fp32) and `_v4_bf16` (y bf16 bits; the match
                // below picks by y's type): two 128-byte tensor maps by value, then pointers and sizes; the caller
                // checked xq = [m, k], x_scales = [m, k/128], w = [n, k], w_scales = [ceil(n/128), k/128], y = [m, n]
                // of the kernel's element type, k % 128 == 0, k >= 128 and m * n tiles within the grid limit. The maps
                // describe exactly xq and w (TMA never reads outside them; rows past m or n are zero-filled), the scale
                // loads clamp rows to m - 1 and every store is guarded against m and n (the bf16 epilogue's 8-byte
                // stores only where n % 4 == 0, so they are aligned in the 256-byte-aligned allocation); the persistent
                // kernels visit tiles below ceil(m/128) * ceil(n/128) only, whatever the grid. xq and w outlive the
                // launch (borrowed for this call, the stream is ordered).
                unsafe {
                    dev.launch_args(name, &f, cfg, |b| {
                        b.arg(&ta)
                            .arg(&tb)
                            .arg(&x_scales.slice)
                            .arg(&w_scales.slice);
                        match y {
                            Fp8Out::F32(y) => b.arg(&mut y.slice),
                            Fp8Out::Bf16(y) => b.arg(&mut y.slice),
                        };
                        b.arg(&mi).arg(&ni).arg(&ki);
                    })
                }
            } else {
                let Fp8Out::F32(y) = y else {
                    return Err(KernelError::Cuda(format!("{name}: writes fp32 only")));
                };
                let (x, w) = ((&xq.slice, &x_scales.slice), (&w.slice, &w_scales.slice));
                // SAFETY: matches `fp8_block_gemm_sm90a_v1`; the caller checked the same lengths as for v2 and
                // k % 128 == 0, so every 16-byte cp.async lies wholly inside a row; rows past m or n are zero-filled
                // without reading (from row 0, a valid address) and every store is guarded against m and n.
                unsafe { dev.launch_fp8_gemm(name, &f, cfg, x, w, &mut y.slice, [m, n, k]) }
            }
        }
        no_cuda!(self, variant, y)
    }

    /// [`Gpu::nvfp4_gemm`] on wgmma, the measured-best build (v3, [`Nvfp4Wgmma::PrmtDecode256`];
    /// H200, `m = 4096`, 5120x17408 and 17408x5120: 1119.6 / 1188.4 us, 0.82 / 0.78x cuBLAS bf16 (the
    /// table at `NVFP4_BEST`): `y[m][n] = global_scale * sum_k x[m][k] *
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
    #[cfg(feature = "lab")]
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
        check_nvfp4_operands(OP, x, w, scales, global_scale, y, m, n, k)?;
        #[cfg(feature = "cuda")]
        {
            // `nvfp4_gemm_sm90a_v1` (block-synchronous: all 256 threads load, decode, then issue wgmmas), `_v2`
            // (warp-specialised: x by TMA, two producer warpgroups decoding the weights into the ring, two consumer
            // warpgroups) or `_v3` (v2 with 256x128 tiles and a byte-permute decode) in cuda/gemm_sm90a.cu.
            let dev = &self.inner;
            let (name, smem, threads) = nvfp4_wgmma_kernel(variant);
            let f = dev.function_with_smem(Module::GemmSm90a, name, smem)?;
            let blocks = match variant {
                // v3's tiles are 256 rows x 128 columns.
                Nvfp4Wgmma::PrmtDecode256 => (m.div_ceil(256) * n.div_ceil(128)) as u32,
                Nvfp4Wgmma::Synchronous | Nvfp4Wgmma::WarpSpecialized => tile_grid(m, n),
            };
            let cfg = launch_config((blocks, 1, 1), (threads, 1, 1), smem);
            let (w, scales, y, mnk) = (&w.slice, &scales.slice, &mut y.slice, [m, n, k]);
            match variant {
                Nvfp4Wgmma::Synchronous => {
                    // SAFETY: matches `nvfp4_gemm_sm90a_v1`; the caller checked x = [m, k], w = [n, k/2], scales =
                    // [n, k/16], y = [m, n] and k % 64 == 0, so every 16-byte copy of x and w and 4-byte copy of the
                    // scales is whole and aligned inside its row; rows past m or n are zero-filled without reading
                    // and every store is guarded.
                    unsafe {
                        dev.launch_nvfp4(name, &f, cfg, &x.slice, w, scales, global_scale, y, mnk)
                    }
                }
                Nvfp4Wgmma::WarpSpecialized | Nvfp4Wgmma::PrmtDecode256 => {
                    // The guard orders this raw-pointer use after any pending writes on other streams and keeps the
                    // buffer's event until the launch is queued.
                    let (xp, _gx) = x.slice.device_ptr(dev.stream());
                    let tx = tensor_map_u16(xp, m, k)?;
                    // SAFETY: matches `nvfp4_gemm_sm90a_v2` and `_v3` (a 128-byte tensor map by value, then pointers,
                    // the scale and sizes; v3 reads x in two 128-row boxes per 256-row tile, the second only where it
                    // holds a row below m); the caller checked x = [m, k], w = [n, k/2], scales = [n, k/16], y = [m, n]
                    // and k % 64 == 0. The map describes exactly x (TMA never reads outside it; rows past m are
                    // zero-filled); the weight and scale loads are 16- and 2-byte aligned inside rows below n (rows
                    // past n read row 0) and every store is guarded against m and n; x outlives the launch (borrowed
                    // for this call, the stream is ordered).
                    unsafe { dev.launch_nvfp4(name, &f, cfg, &tx, w, scales, global_scale, y, mnk) }
                }
            }
        }
        no_cuda!(self, variant)
    }
}

/// Dynamic shared memory of `fp8_block_gemm_sm90a_v1` (cuda/gemm_sm90a.cu `F8V1_SMEM_BYTES`, kept equal by a
/// static_assert there): 4 stages of two 128x128-byte tiles plus 1 KiB to align the ring to 1024 bytes.
#[cfg(feature = "cuda")]
const FP8_V1_SMEM_BYTES: u32 = 132_096;
/// `F8V2_SMEM_BYTES`: 6 stages of two 128x128-byte tiles, 1 KiB of alignment, 12 mbarriers (v2, and the
/// persistent v3/v4 and v4's bf16 form, which share the ring).
#[cfg(feature = "cuda")]
const FP8_V2_SMEM_BYTES: u32 = 197_728;
/// `N4_SMEM_BYTES`: two decoded 128x64 bf16 tiles, 4 stages of (x tile, packed weights, scales) padded to
/// 1 KiB, 1 KiB of alignment.
#[cfg(feature = "cuda")]
const NVFP4_V1_SMEM_BYTES: u32 = 119_808;
/// `N4V2_SMEM_BYTES`: 6 stages of (x tile, decoded B tile), 16 KiB each, 1 KiB of alignment, 12 mbarriers.
#[cfg(feature = "cuda")]
const NVFP4_V2_SMEM_BYTES: u32 = 197_728;
/// `N4V3_SMEM_BYTES`: 4 stages of (x tile 256 x 64 bf16 = 32 KiB, decoded B tile 16 KiB), 1 KiB of alignment,
/// 8 mbarriers.
#[cfg(feature = "cuda")]
const NVFP4_V3_SMEM_BYTES: u32 = 197_696;

/// A CUDA tensor map passed by value as a `__grid_constant__` kernel parameter (the kernel's `TmaDesc`, 128
/// bytes). The driver copies kernel parameters by the kernel's declared layout, so the host alignment of this
/// wrapper only has to satisfy `cuTensorMapEncodeTiled` (64 bytes; `CUtensorMap` is 128-aligned).
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg(feature = "cuda")]
struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte value with no pointers into host memory, passed to the kernel by copy.
#[cfg(feature = "cuda")]
unsafe impl DeviceRepr for TensorMap {}

#[cfg(feature = "cuda")]
impl ActivationArg for TensorMap {
    fn push_to<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

/// The tensor map of a row-major uint8 matrix `[rows, cols]` at device address `ptr`, read in boxes of 128 rows
/// x 128 bytes with the 128-byte swizzle (what the wgmma descriptors expect), rows past `rows` zero-filled.
/// Needs `cols % 16 == 0` (the row stride must be a multiple of 16 bytes) and a 16-byte aligned `ptr`.
#[cfg(feature = "cuda")]
fn tensor_map_u8(
    ptr: sys::CUdeviceptr,
    rows: usize,
    cols: usize,
) -> Result<TensorMap, KernelError> {
    tensor_map_128b(
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        1,
        ptr,
        rows,
        cols,
    )
}

/// The same for a row-major 16-bit matrix (bf16 bits) `[rows, cols]`: boxes of 128 rows x 64 elements (128
/// bytes). Needs `cols % 8 == 0` and a 16-byte aligned `ptr`.
#[cfg(feature = "cuda")]
fn tensor_map_u16(
    ptr: sys::CUdeviceptr,
    rows: usize,
    cols: usize,
) -> Result<TensorMap, KernelError> {
    tensor_map_128b(
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        2,
        ptr,
        rows,
        cols,
    )
}

/// A 2D tensor map of `[rows, cols]` elements of `elem_bytes` bytes, boxes of 128 rows x 128 bytes,
/// SWIZZLE_128B, L2 promotion 256 B, zero fill out of bounds.
#[cfg(feature = "cuda")]
fn tensor_map_128b(
    dtype: sys::CUtensorMapDataType,
    elem_bytes: usize,
    ptr: sys::CUdeviceptr,
    rows: usize,
    cols: usize,
) -> Result<TensorMap, KernelError> {
    let dims: [sys::cuuint64_t; 2] = [cols as u64, rows as u64];
    let strides: [sys::cuuint64_t; 1] = [(cols * elem_bytes) as u64];
    let boxes: [sys::cuuint32_t; 2] = [(128 / elem_bytes) as u32, 128];
    let elem_strides: [sys::cuuint32_t; 2] = [1, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live local array of the rank the call reads (2 dims, 1 stride); `map` is a
    // 128-byte, 128-aligned output; the driver only records `ptr`, which the caller keeps alive for the launch.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(KernelError::Cuda(format!(
            "cuTensorMapEncodeTiled ({rows} x {cols} elements of {elem_bytes} bytes): {r:?}"
        )));
    }
    // SAFETY: the call succeeded, so it wrote the whole map (and it was zeroed before).
    Ok(TensorMap(unsafe { map.assume_init() }))
}

/// Blocks of a 128x128-tiled output: one 1D grid over all tiles (the kernels map block -> tile in groups of 8
/// tile rows for L2 reuse).
#[cfg(feature = "cuda")]
fn tile_grid(m: usize, n: usize) -> u32 {
    (m.div_ceil(128) * n.div_ceil(128)) as u32
}

/// The kernel of an FP8 wgmma build (bf16 or f32 output), its dynamic shared memory and threads per block.
#[cfg(feature = "cuda")]
fn fp8_wgmma_kernel(
    variant: Fp8Wgmma,
    bf16: bool,
) -> Result<(&'static str, u32, u32), KernelError> {
    Ok(match (variant, bf16) {
        (Fp8Wgmma::CpAsync, false) => ("fp8_block_gemm_sm90a_v1", FP8_V1_SMEM_BYTES, 256),
        (Fp8Wgmma::Tma, false) => ("fp8_block_gemm_sm90a_v2", FP8_V2_SMEM_BYTES, 384),
        (Fp8Wgmma::Persistent, false) => ("fp8_block_gemm_sm90a_v3", FP8_V2_SMEM_BYTES, 384),
        (Fp8Wgmma::PingPong, false) => ("fp8_block_gemm_sm90a_v4", FP8_V2_SMEM_BYTES, 384),
        (Fp8Wgmma::PingPong, true) => ("fp8_block_gemm_sm90a_v4_bf16", FP8_V2_SMEM_BYTES, 384),
        (_, true) => {
            return Err(KernelError::Cuda(format!(
                "fp8_block_gemm_sm90a: no bf16 epilogue in the {variant:?} build"
            )))
        }
    })
}

/// The kernel of an NVFP4 wgmma build, its dynamic shared memory and threads per block.
#[cfg(feature = "cuda")]
fn nvfp4_wgmma_kernel(variant: Nvfp4Wgmma) -> (&'static str, u32, u32) {
    match variant {
        Nvfp4Wgmma::Synchronous => ("nvfp4_gemm_sm90a_v1", NVFP4_V1_SMEM_BYTES, 256),
        Nvfp4Wgmma::WarpSpecialized => ("nvfp4_gemm_sm90a_v2", NVFP4_V2_SMEM_BYTES, 512),
        Nvfp4Wgmma::PrmtDecode256 => ("nvfp4_gemm_sm90a_v3", NVFP4_V3_SMEM_BYTES, 512),
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    /// The builds `Auto` runs (FP8 with f32 and bf16 output, NVFP4) are in this build's `cuda/gemm_sm90a.cu`, and
    /// without `lab` the losing builds are not; the names come from the launch code's naming functions.
    #[test]
    fn every_auto_wgmma_kernel_is_embedded() {
        let seen = [
            fp8_wgmma_kernel(FP8_BEST, false).unwrap().0,
            fp8_wgmma_kernel(FP8_BEST, true).unwrap().0,
            nvfp4_wgmma_kernel(NVFP4_BEST).0,
        ];
        super::super::device::assert_embedded(Module::GemmSm90a, seen);
    }

    /// The launch constants against `cuda/gemm_sm90a.cu`'s static_assert literals and the bench's copies
    /// (`device::source_literal` says why).
    #[test]
    fn launch_constants_match_the_kernel_file_and_the_bench() {
        use super::super::device::source_literal;
        const CU: &str = include_str!("../../cuda/gemm_sm90a.cu");
        const BENCH: &str = include_str!("../../bench/h200/bench_gemm_sm90a.py");
        let cu = |key: &str| source_literal(CU, key, " == ") as u32;
        let sizes = [
            ("F8V1_SMEM_BYTES", FP8_V1_SMEM_BYTES),
            ("F8V2_SMEM_BYTES", FP8_V2_SMEM_BYTES),
            ("N4_SMEM_BYTES", NVFP4_V1_SMEM_BYTES),
            ("N4V2_SMEM_BYTES", NVFP4_V2_SMEM_BYTES),
            ("N4V3_SMEM_BYTES", NVFP4_V3_SMEM_BYTES),
        ];
        for (name, bytes) in sizes {
            assert_eq!(cu(&format!("static_assert({name}")), bytes, "{name}");
        }
        // The bench unpacks the five in one line, in this order.
        let line = format!(
            "F8V1_SMEM, F8V2_SMEM, N4_SMEM, N4V2_SMEM, N4V3_SMEM = {}",
            sizes.map(|(_, b)| b.to_string()).join(", ")
        );
        assert!(BENCH.contains(&line), "bench_gemm_sm90a.py lacks `{line}`");
    }
}
