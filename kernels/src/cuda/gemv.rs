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
