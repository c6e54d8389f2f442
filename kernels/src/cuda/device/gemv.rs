//! Launches of `cuda/gemv.cu`: the FP8 and NVFP4 decode GEMVs.

use super::*;

impl Device {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn fp8_block_gemv(
        &self,
        tensor: bool,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        if tensor {
            let name = if m <= 8 {
                "fp8_block_gemv_mma_n8"
            } else {
                "fp8_block_gemv_mma_n16"
            };
            let f = self.function(Module::Gemv, name)?;
            let (mi, ni, ki) = (m as i32, n as i32, k as i32);
            let mut b = self.stream.launch_builder(&f);
            b.arg(x)
                .arg(w)
                .arg(scales)
                .arg(y)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki);
            // SAFETY: matches `fp8_block_gemv_mma_n*` in cuda/gemv.cu; the caller checked the buffers as for the
            // CUDA-core kernel below; each block reads 16 rows (guarded against n) in 16-byte loads guarded
            // against k, which k % 16 == 0 keeps inside the row.
            unsafe { b.launch(mma_config(n)) }.map_err(cuda_err(name))?;
            return Ok(());
        }
        // M = 1 uses two rows per warp and two 16-byte loads in flight per row: the best of the design sweep in
        // kernels/bench/h200 (3.54 TB/s on 5120x17408, 1.13x the one-row, four-load kernel, H200 2026-11-30).
        let (name, rows_per_warp) = match m {
            1 => ("fp8_block_gemv_m1_r2_u2", 2),
            2 => ("fp8_block_gemv_m2", 1),
            3..=4 => ("fp8_block_gemv_m4", 1),
            5..=8 => ("fp8_block_gemv_m8", 1),
            _ => ("fp8_block_gemv_m16", 1),
        };
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = gemv_config(n, rows_per_warp);
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(w)
            .arg(scales)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: the argument list matches `fp8_block_gemv_m*` in cuda/gemv.cu (three input pointers, one output,
        // three ints) and the caller checked x = [m, k], w = [n, k], scales = [ceil(n/128), ceil(k/128)],
        // y = [m, n], k % 16 == 0, so every thread's 16-byte loads stay inside its row; cudarc allocations are
        // 256-byte aligned.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn nvfp4_gemv(
        &self,
        tensor: bool,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        if tensor {
            let name = if m <= 8 {
                "nvfp4_gemv_mma_n8"
            } else {
                "nvfp4_gemv_mma_n16"
            };
            let f = self.function(Module::Gemv, name)?;
            let (mi, ni, ki) = (m as i32, n as i32, k as i32);
            let mut b = self.stream.launch_builder(&f);
            b.arg(x)
                .arg(w)
                .arg(scales)
                .arg(&global_scale)
                .arg(y)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki);
            // SAFETY: matches `nvfp4_gemv_mma_n*` in cuda/gemv.cu; buffers checked by the caller as for the
            // CUDA-core kernel below; rows are guarded against n and k % 32 == 0 keeps every lane's 16-byte load
            // and 2-byte scale load inside its row.
            unsafe { b.launch(mma_config(n)) }.map_err(cuda_err(name))?;
            return Ok(());
        }
        // M = 1 on tall matrices uses two rows per warp so the activations cross L1 once per two weight rows
        // (with one row per warp L1 was 88% busy in Nsight Compute and DRAM 34%); on short ones (n < 16384) that
        // leaves too few warps, and one row per warp is faster. Design sweep on the H200, 2026-11-30: 17408x5120
        // 25.1 us (r2) vs 27.9 (r1); 248320x5120 301 vs 358; 5120x17408 37.1 vs 32.1; 5120x10240 22.8 vs 21.7.
        let (name, rows_per_warp) = match m {
            1 if n >= 16384 => ("nvfp4_gemv_m1_r2_u4", 2),
            1 => ("nvfp4_gemv_m1", 1),
            2 => ("nvfp4_gemv_m2", 1),
            3..=4 => ("nvfp4_gemv_m4", 1),
            5..=8 => ("nvfp4_gemv_m8", 1),
            _ => ("nvfp4_gemv_m16", 1),
        };
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = gemv_config(n, rows_per_warp);
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(w)
            .arg(scales)
            .arg(&global_scale)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `nvfp4_gemv_m*` in cuda/gemv.cu; the caller checked x = [m, k], w = [n, k/2],
        // scales = [n, k/16], y = [m, n] and k % 32 == 0, so each lane's 16-byte weight load and 2-byte scale load
        // stay inside the row.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }
}

fn gemv_config(n: usize, rows_per_warp: usize) -> LaunchConfig {
    // 8 warps per block, `rows_per_warp` output rows per warp (cuda/gemv.cu).
    LaunchConfig {
        grid_dim: (n.div_ceil(8 * rows_per_warp) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn mma_config(n: usize) -> LaunchConfig {
    // One 16-row tile of W per block, 8 warps sharing its K chunks (cuda/gemv.cu, blockq_gemv_mma).
    LaunchConfig {
        grid_dim: (n.div_ceil(16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
