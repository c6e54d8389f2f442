//! Prefill GEMMs on `mma.sync` (`kernels/cuda/gemm.cu`): the FP8 activation quantiser, the FP8 block-scaled GEMM
//! and the NVFP4 weight-only GEMM.

use super::{check_len, Gpu, GpuBuffer};
use crate::KernelError;

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
}
