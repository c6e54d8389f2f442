//! The prefill GEMMs' public entry points: the FP8 activation quantiser, the FP8 block-scaled GEMM and the NVFP4
//! weight-only GEMM. [`Gpu::fp8_block_gemm`] and [`Gpu::nvfp4_gemm`] dispatch: on compute capability 9.0 (the
//! H200) to the wgmma kernels of `kernels/cuda/gemm_sm90a.cu` (`super::gemm_sm90a`) where the shape meets their
//! constraint, otherwise to the `mma.sync` kernels of `kernels/cuda/gemm.cu`, which stay callable by name
//! ([`Gpu::fp8_block_gemm_mma_sync`], [`Gpu::nvfp4_gemm_mma_sync`]) for tests and benchmarks.

#[cfg(feature = "cuda")]
use cudarc::driver::PushKernelArg;

#[cfg(feature = "cuda")]
use super::device::{launch_config, Module};
use super::{check_len_of, check_nvfp4_operands, Gpu, GpuBuffer};
use crate::KernelError;

/// Dynamic shared memory of `nvfp4_gemm_128x256` (cuda/gemm.cu `NG_SMEM_BYTES`).
#[cfg(feature = "cuda")]
const NVFP4_GEMM_SMEM_BYTES: u32 = 118_784;

/// Dynamic shared memory of `fp8_block_gemm_128x128` (cuda/gemm.cu `GM_SMEM_BYTES`): 4 stages of (two 16 KiB
/// tiles + 128 scales), over the 48 KiB a launch gets without asking.
#[cfg(feature = "cuda")]
const GEMM_SMEM_BYTES: u32 = 133_120;

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
        check_len_of(OP, "x", x.len(), &[m, k])?;
        check_len_of(OP, "xq", xq.len(), &[m, k])?;
        check_len_of(OP, "scales", scales.len(), &[m, k.div_ceil(128)])?;
        #[cfg(feature = "cuda")]
        {
            // `fp8_quantize_act` in cuda/gemm.cu: one warp per (token, 128 of K).
            const NAME: &str = "fp8_quantize_act";
            let f = self.inner.function(Module::Gemm, NAME)?;
            let (mi, ki) = (m as i32, k as i32);
            // 8 tokens (one per warp) x one 128-wide K block per block.
            let grid = (m.div_ceil(8) as u32, k.div_ceil(128) as u32, 1);
            let cfg = launch_config(grid, (256, 1, 1), 0);
            // SAFETY: matches `fp8_quantize_act(x, xq, scales, m, k)` in cuda/gemm.cu; checked above: x = [m, k],
            // xq = [m, k], scales = [m, ceil(k/128)] and k % 16 == 0, so each lane's 8-byte load and 4-byte store of
            // 4 values stay inside its row (warps past m return before touching memory); grid.y = ceil(k/128) is at
            // most 65535.
            unsafe {
                self.inner.launch_args(NAME, &f, cfg, |b| {
                    b.arg(&x.slice)
                        .arg(&mut xq.slice)
                        .arg(&mut scales.slice)
                        .arg(&mi)
                        .arg(&ki);
                })
            }
        }
        no_cuda!(self)
    }

    /// `y[m][n] = sum_k e4m3(xq[m][k]) * x_scales[m][k/128] * e4m3(w[n][k]) * w_scales[n/128][k/128]` for
    /// prefill (any `m`; at `m <= 16` the decode GEMV [`Gpu::fp8_block_gemv`] reads the weights faster).
    ///
    /// `xq`: e4m3 `[m, k]` and `x_scales`: fp32 `[m, ceil(k/128)]`, as [`Gpu::fp8_quantize_activations`] makes
    /// them; `w`: e4m3 `[n, k]` (the checkpoint's `weight`); `w_scales`: fp32 `[ceil(n/128), ceil(k/128)]`
    /// (`weight_scale_inv`, multiplied); `y`: fp32 `[m, n]`. Each 128 of K is summed on the tensor cores and
    /// that partial is scaled by both block scales and added in fp32. Needs `k % 16 == 0`, `1 <= m, n`,
    /// `n <= 65535 * 128` and every size within 32-bit indices.
    ///
    /// Dispatch: on compute capability 9.0 with `k % 128 == 0` (every real checkpoint's K) and fewer than 2^31
    /// output tiles, the wgmma kernel [`Gpu::fp8_block_gemm_wgmma`] (persistent, TMA producer + 2 consumer
    /// warpgroups with ping-pong partials, v4; H200, `m = 4096`, 5120x17408 and 17408x5120: 693.2 / 735.7 us,
    /// ~990-1050 TFLOP/s, 0.82x / 0.78x cuBLAS FP8 `torch._scaled_mm` with the same block scales (bf16 out;
    /// with bf16 out too, [`Gpu::fp8_block_gemm_wgmma_bf16`]: 691.6 / 712.2 us, 0.82x / 0.80x), 4.4-4.7x the
    /// mma.sync kernel; `benchmarks/h200.md`),
    /// otherwise [`Gpu::fp8_block_gemm_mma_sync`]. The two agree to ~1e-4 relative (the same products summed in
    /// another order).
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
        check_fp8_gemm(OP, xq, x_scales, w, w_scales, y, m, n, k)?;
        if super::gemm_sm90a::wgmma_fits(m, n, k, 128) && self.has_wgmma() {
            self.fp8_block_gemm_wgmma(xq, x_scales, w, w_scales, y, m, n, k)
        } else {
            self.fp8_block_gemm_mma_sync(xq, x_scales, w, w_scales, y, m, n, k)
        }
    }

    /// [`Gpu::fp8_block_gemm`] always on the `mma.sync` kernel of `kernels/cuda/gemm.cu` (m16n8k32 e4m3, fp32
    /// accumulation, one 128x128 output tile per block of 8 warps), any compute capability >= 9.0. Same layouts
    /// and constraints. Correct but slow: ~255-260 TFLOP/s on the H200 at `m = 4096`, 0.18-0.20x cuBLAS FP8.
    #[allow(clippy::too_many_arguments)]
    pub fn fp8_block_gemm_mma_sync(
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
        const OP: &str = "cuda::fp8_block_gemm_mma_sync";
        check_fp8_gemm(OP, xq, x_scales, w, w_scales, y, m, n, k)?;
        #[cfg(feature = "cuda")]
        {
            // `fp8_block_gemm_128x128` in cuda/gemm.cu: one 128x128 output tile per block of 8 warps.
            const NAME: &str = "fp8_block_gemm_128x128";
            let dev = &self.inner;
            let f = dev.function_with_smem(Module::Gemm, NAME, GEMM_SMEM_BYTES)?;
            let grid = (m.div_ceil(128) as u32, n.div_ceil(128) as u32, 1);
            let cfg = launch_config(grid, (256, 1, 1), GEMM_SMEM_BYTES);
            let (x, w) = ((&xq.slice, &x_scales.slice), (&w.slice, &w_scales.slice));
            // SAFETY: matches `fp8_block_gemm_128x128` in cuda/gemm.cu (GM_SMEM_BYTES there is GEMM_SMEM_BYTES
            // here, a static_assert keeps them equal); check_fp8_gemm checked xq = [m, k], x_scales = [m,
            // ceil(k/128)], w = [n, k], w_scales = [ceil(n/128), ceil(k/128)], y = [m, n], k % 16 == 0 (every 16-byte
            // copy is wholly inside a row or skipped) and ceil(n/128) <= 65535; rows past m or n and chunks past k
            // are zero-filled without reading, and the epilogue guards every store against m and n.
            unsafe { dev.launch_fp8_gemm(NAME, &f, cfg, x, w, &mut y.slice, [m, n, k]) }
        }
        no_cuda!(self)
    }

    /// `y[m][n] = global_scale * sum_k x[m][k] * e2m1(w[n][k]) * e4m3(scales[n][k/16])` for prefill (any `m`;
    /// at `m <= 16` the decode GEMV [`Gpu::nvfp4_gemv`] is the faster path), weight-only NVFP4 (modelopt layout).
    ///
    /// `x`: bf16 bits `[m, k]`; `w`: `[n, k/2]` bytes, the even element in the low nibble; `scales`: e4m3
    /// `[n, k/16]`; `global_scale`: the checkpoint's `weight_scale_2`; `y`: fp32 `[m, n]`. The weights are decoded
    /// to bf16 (e2m1 times the e4m3 group scale is exact in bf16) and multiplied on the tensor cores with fp32
    /// accumulation; the global scale is applied to the fp32 result. Needs `k % 64 == 0` (one K tile),
    /// `1 <= m, n`, `n <= 65535 * 128`, a finite `global_scale` and every size within 32-bit indices.
    ///
    /// Dispatch: on compute capability 9.0 with fewer than 2^31 output tiles, the wgmma kernel
    /// [`Gpu::nvfp4_gemm_wgmma`] (v3: producer warpgroups decode the weights by byte permutes into a swizzled
    /// bf16 ring in shared memory, consumer warpgroups run `wgmma` m64n128k16 bf16 on 256x128 tiles; H200,
    /// `m = 4096`, 5120x17408 and 17408x5120: 1119.6 / 1188.4 us, ~615-650 TFLOP/s, 0.82x / 0.78x cuBLAS bf16
    /// `torch.matmul` on a dequantised copy (919.0 / 923.1 us; `m = 2048`: 0.70x / 0.77x, `m = 512`: 0.60x),
    /// 3.2-3.4x the mma.sync kernel; `benchmarks/h200.md`),
    /// otherwise [`Gpu::nvfp4_gemm_mma_sync`]. Both have the same K constraint, so every valid call takes the
    /// wgmma path on the H200.
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
        check_nvfp4_gemm_dims(OP, m, n, k)?;
        check_nvfp4_operands(OP, x, w, scales, global_scale, y, m, n, k)?;
        if super::gemm_sm90a::wgmma_fits(m, n, k, 64) && self.has_wgmma() {
            self.nvfp4_gemm_wgmma(x, w, scales, global_scale, y, m, n, k)
        } else {
            self.nvfp4_gemm_mma_sync(x, w, scales, global_scale, y, m, n, k)
        }
    }

    /// [`Gpu::nvfp4_gemm`] always on the `mma.sync` kernel of `kernels/cuda/gemm.cu` (weights decoded to bf16
    /// in registers, m16n8k16 bf16, one 128x256 output tile per block of 8 warps), on every device the crate
    /// runs on (compute capability 9.0 or later). Same layouts and constraints. Correct but slow: ~210 TFLOP/s
    /// on the H200 at `m = 4096`, 0.26x cuBLAS bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn nvfp4_gemm_mma_sync(
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
        const OP: &str = "cuda::nvfp4_gemm_mma_sync";
        check_nvfp4_gemm_dims(OP, m, n, k)?;
        check_nvfp4_operands(OP, x, w, scales, global_scale, y, m, n, k)?;
        #[cfg(feature = "cuda")]
        {
            // `nvfp4_gemm_128x256` in cuda/gemm.cu: one 128x256 output tile per block of 8 warps.
            const NAME: &str = "nvfp4_gemm_128x256";
            let dev = &self.inner;
            let f = dev.function_with_smem(Module::Gemm, NAME, NVFP4_GEMM_SMEM_BYTES)?;
            let grid = (m.div_ceil(128) as u32, n.div_ceil(256) as u32, 1);
            let cfg = launch_config(grid, (256, 1, 1), NVFP4_GEMM_SMEM_BYTES);
            let (x, w, scales, y) = (&x.slice, &w.slice, &scales.slice, &mut y.slice);
            // SAFETY: matches `nvfp4_gemm_128x256` in cuda/gemm.cu (NG_SMEM_BYTES there is NVFP4_GEMM_SMEM_BYTES
            // here, kept equal by a static_assert); the checks above gave x = [m, k], w = [n, k/2], scales =
            // [n, k/16], y = [m, n], k % 64 == 0 (every 16-byte copy of x and w and 4-byte copy of scales is whole
            // and aligned) and ceil(n/256) <= 65535; rows past m or n are zero-filled without reading and every
            // store is guarded.
            unsafe { dev.launch_nvfp4(NAME, &f, cfg, x, w, scales, global_scale, y, [m, n, k]) }
        }
        no_cuda!(self)
    }
}

/// The FP8 GEMM's arguments, as every path needs them (the wgmma path adds `k % 128 == 0`, which the dispatcher
/// checks before taking it).
#[allow(clippy::too_many_arguments)]
fn check_fp8_gemm(
    op: &'static str,
    xq: &GpuBuffer<u8>,
    x_scales: &GpuBuffer<f32>,
    w: &GpuBuffer<u8>,
    w_scales: &GpuBuffer<f32>,
    y: &GpuBuffer<f32>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    check_gemm_dims(op, m, n, k)?;
    let kb = k.div_ceil(128);
    check_len_of(op, "xq", xq.len(), &[m, k])?;
    check_len_of(op, "x_scales", x_scales.len(), &[m, kb])?;
    check_len_of(op, "w", w.len(), &[n, k])?;
    check_len_of(op, "w_scales", w_scales.len(), &[n.div_ceil(128), kb])?;
    check_len_of(op, "y", y.len(), &[m, n])
}

/// The NVFP4 GEMM's sizes, as both paths need them (its operands: [`check_nvfp4_operands`]).
fn check_nvfp4_gemm_dims(
    op: &'static str,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    check_gemm_dims(op, m, n, k)?;
    crate::ensure_shape!(
        k.is_multiple_of(64),
        op,
        "k must be a multiple of 64 (the NVFP4 GEMM's K tile), got {k}"
    );
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The launch constants against `cuda/gemm.cu`'s static_assert literals and the bench's copies
    /// (`device::source_literal` says why).
    #[cfg(feature = "cuda")]
    #[test]
    fn launch_constants_match_the_kernel_file_and_the_bench() {
        use super::super::device::source_literal;
        const CU: &str = include_str!("../../cuda/gemm.cu");
        const BENCH: &str = include_str!("../../bench/h200/bench.py");
        let cu = |key: &str| source_literal(CU, key, " == ") as u32;
        let py = |key: &str| source_literal(BENCH, key, " = ") as u32;
        assert_eq!(cu("static_assert(GM_SMEM_BYTES"), GEMM_SMEM_BYTES);
        assert_eq!(py("\nGEMM_SMEM"), GEMM_SMEM_BYTES);
        assert_eq!(cu("static_assert(NG_SMEM_BYTES"), NVFP4_GEMM_SMEM_BYTES);
        assert_eq!(py("\nNVFP4_GEMM_SMEM"), NVFP4_GEMM_SMEM_BYTES);
    }
}
