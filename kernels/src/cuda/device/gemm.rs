//! Launches of `cuda/gemm.cu`: the FP8 quantiser and the `mma.sync` prefill GEMMs.

use super::*;

impl Device {
    /// `fp8_quantize_act` in cuda/gemm.cu: one warp per (token, 128 of K).
    pub(in crate::cuda) fn fp8_quantize_activations(
        &self,
        x: &CudaSlice<u16>,
        xq: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        m: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "fp8_quantize_act";
        let f = self.function(Module::Gemm, NAME)?;
        let (mi, ki) = (m as i32, k as i32);
        let cfg = LaunchConfig {
            // 8 tokens (one per warp) x one 128-wide K block per block.
            grid_dim: (m.div_ceil(8) as u32, k.div_ceil(128) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(xq).arg(scales).arg(&mi).arg(&ki);
        // SAFETY: matches `fp8_quantize_act` in cuda/gemm.cu; the caller checked x = [m, k], xq = [m, k],
        // scales = [m, ceil(k/128)] and k % 16 == 0, so each lane's 8-byte load and 4-byte store of 4 values stay
        // inside its row (warps past m return before touching memory); grid.y = ceil(k/128) <= 65535 was checked.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `fp8_block_gemm_128x128` in cuda/gemm.cu: one 128x128 output tile per block of 8 warps.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn fp8_block_gemm(
        &self,
        xq: &CudaSlice<u8>,
        x_scales: &CudaSlice<f32>,
        w: &CudaSlice<u8>,
        w_scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "fp8_block_gemm_128x128";
        let f = self.function(Module::Gemm, NAME)?;
        // 4 stages of (two 16 KiB tiles + 128 scales): over the 48 KiB a launch gets without asking.
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            GEMM_SMEM_BYTES as i32,
        )
        .map_err(cuda_err("fp8_block_gemm shared memory size"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(128) as u32, n.div_ceil(128) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: GEMM_SMEM_BYTES,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(xq)
            .arg(x_scales)
            .arg(w)
            .arg(w_scales)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `fp8_block_gemm_128x128` in cuda/gemm.cu (GM_SMEM_BYTES there is GEMM_SMEM_BYTES here,
        // a static_assert keeps them equal); the caller checked xq = [m, k], x_scales = [m, ceil(k/128)],
        // w = [n, k], w_scales = [ceil(n/128), ceil(k/128)], y = [m, n], k % 16 == 0 (every 16-byte copy is wholly
        // inside a row or skipped) and ceil(n/128) <= 65535; rows past m or n and chunks past k are zero-filled
        // without reading, and the epilogue guards every store against m and n.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `nvfp4_gemm_128x256` in cuda/gemm.cu: one 128x256 output tile per block of 8 warps.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn nvfp4_gemm(
        &self,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "nvfp4_gemm_128x256";
        let f = self.function(Module::Gemm, NAME)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            NVFP4_GEMM_SMEM_BYTES as i32,
        )
        .map_err(cuda_err("nvfp4_gemm shared memory size"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(128) as u32, n.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: NVFP4_GEMM_SMEM_BYTES,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(w)
            .arg(scales)
            .arg(&global_scale)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `nvfp4_gemm_128x256` in cuda/gemm.cu (NG_SMEM_BYTES there is NVFP4_GEMM_SMEM_BYTES
        // here, kept equal by a static_assert); the caller checked x = [m, k], w = [n, k/2], scales = [n, k/16],
        // y = [m, n], k % 64 == 0 (every 16-byte copy of x and w and 4-byte copy of scales is whole and aligned)
        // and ceil(n/256) <= 65535; rows past m or n are zero-filled without reading and every store is guarded.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }
}

/// Dynamic shared memory of `nvfp4_gemm_128x256` (cuda/gemm.cu `NG_SMEM_BYTES`).
const NVFP4_GEMM_SMEM_BYTES: u32 = 118_784;

/// Dynamic shared memory of `fp8_block_gemm_128x128` (cuda/gemm.cu `GM_SMEM_BYTES`).
const GEMM_SMEM_BYTES: u32 = 133_120;

#[cfg(test)]
mod tests {
    //! The constants above against `cuda/gemm.cu`'s static_assert literals and the bench's copies
    //! (`super::super::source_literal` says why).
    use super::super::source_literal;
    use super::*;

    const CU: &str = include_str!("../../../cuda/gemm.cu");
    const BENCH: &str = include_str!("../../../bench/h200/bench.py");

    #[test]
    fn launch_constants_match_the_kernel_file_and_the_bench() {
        let cu = |key: &str| source_literal(CU, key, " == ") as u32;
        let py = |key: &str| source_literal(BENCH, key, " = ") as u32;
        assert_eq!(cu("static_assert(GM_SMEM_BYTES"), GEMM_SMEM_BYTES);
        assert_eq!(py("\nGEMM_SMEM"), GEMM_SMEM_BYTES);
        assert_eq!(cu("static_assert(NG_SMEM_BYTES"), NVFP4_GEMM_SMEM_BYTES);
        assert_eq!(py("\nNVFP4_GEMM_SMEM"), NVFP4_GEMM_SMEM_BYTES);
    }
}
