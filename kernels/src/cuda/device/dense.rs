//! Launches of `cuda/dense.cu`: the dense f32 / bf16 GEMV (m <= 16) and tiled GEMM. The safe wrapper in
//! `cuda/dense.rs` has checked every length before anything here runs.

use super::*;

/// Rows of `w` per GEMV block (`GEMV_ROWS_PER_BLOCK` in cuda/dense.cu: 4 warps of 4 rows).
const GEMV_ROWS_PER_BLOCK: usize = 16;
/// Threads of a GEMV block (`GEMV_THREADS`).
const GEMV_THREADS: u32 = 128;
/// Threads of a split-K GEMV block (`SPLITK_THREADS`): one block per output row.
const SPLITK_THREADS: u32 = 256;
/// Matrices of fewer rows than this take the split-K GEMV (`ceil(n/16)` blocks of whole rows would leave most of the
/// GPU idle: 3 blocks for the 48-row DeltaNet projections of Qwen3.8-27B).
const DENSE_SPLITK_MAX_N: usize = 4096;
/// Output tile of the GEMM (`GEMM_BM` = `GEMM_BN`) and its threads (`GEMM_THREADS`).
const GEMM_TILE: usize = 64;
const GEMM_THREADS: u32 = 256;

/// The weight element types of `cuda/dense.cu`: f32 and bf16 bits.
pub(in crate::cuda) trait DenseWeight: GpuScalar {
    /// `dense_gemv_<dtype>_m{1,2,4,8,16}`.
    const GEMV: [&'static str; 5];
    /// `dense_gemv_splitk_<dtype>_m{1,2,4,8,16}`.
    const SPLITK: [&'static str; 5];
    /// `dense_gemm_<dtype>`.
    const GEMM: &'static str;
}

impl DenseWeight for f32 {
    const GEMV: [&'static str; 5] = [
        "dense_gemv_f32_m1",
        "dense_gemv_f32_m2",
        "dense_gemv_f32_m4",
        "dense_gemv_f32_m8",
        "dense_gemv_f32_m16",
    ];
    const SPLITK: [&'static str; 5] = [
        "dense_gemv_splitk_f32_m1",
        "dense_gemv_splitk_f32_m2",
        "dense_gemv_splitk_f32_m4",
        "dense_gemv_splitk_f32_m8",
        "dense_gemv_splitk_f32_m16",
    ];
    const GEMM: &'static str = "dense_gemm_f32";
}

impl DenseWeight for u16 {
    const GEMV: [&'static str; 5] = [
        "dense_gemv_bf16_m1",
        "dense_gemv_bf16_m2",
        "dense_gemv_bf16_m4",
        "dense_gemv_bf16_m8",
        "dense_gemv_bf16_m16",
    ];
    const SPLITK: [&'static str; 5] = [
        "dense_gemv_splitk_bf16_m1",
        "dense_gemv_splitk_bf16_m2",
        "dense_gemv_splitk_bf16_m4",
        "dense_gemv_splitk_bf16_m8",
        "dense_gemv_splitk_bf16_m16",
    ];
    const GEMM: &'static str = "dense_gemm_bf16";
}

impl Device {
    /// `dense_gemv_*_m{MAXM}` (MAXM the power of two at or above m) for m <= 16, else `dense_gemm_*`.
    pub(in crate::cuda) fn dense_linear<T: DenseWeight>(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<T>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let (name, cfg) = if m <= 16 && n < DENSE_SPLITK_MAX_N {
            let which = m.next_power_of_two().trailing_zeros() as usize;
            let cfg = LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (SPLITK_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            (T::SPLITK[which], cfg)
        } else if m <= 16 {
            let which = m.next_power_of_two().trailing_zeros() as usize;
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(GEMV_ROWS_PER_BLOCK) as u32, 1, 1),
                block_dim: (GEMV_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            (T::GEMV[which], cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (
                    n.div_ceil(GEMM_TILE) as u32,
                    m.div_ceil(GEMM_TILE) as u32,
                    1,
                ),
                block_dim: (GEMM_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            (T::GEMM, cfg)
        };
        let f = self.function(Module::Dense, name)?;
        let (xp, _gx) = self.addr(x);
        let (wp, _gw) = self.addr(w);
        let (yp, _gy) = self.addr_mut(y);
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(wp)
            .ptr(yp)
            .i32(m as i32)
            .i32(n as i32)
            .i32(k as i32);
        // The split-K GEMV (n < DENSE_SPLITK_MAX_N blocks, one per row) reads row `blockIdx.x < n` only.
        // SAFETY: matches `dense_gemv_*(x, w, y, m, n, k)` / `dense_gemm_*(x, w, y, m, n, k)` in cuda/dense.cu with
        // the weight type T names; the caller checked x = [m, k], w = [n, k], y = [m, n] with 1 <= n, k <= i32::MAX
        // and 1 <= m <= 65535 * 64, so m, n and k fit i32, grid.x = ceil(n/16) or ceil(n/64) fits the grid and
        // grid.y = ceil(m/64) <= 65535; the GEMV's MAXM is at least m (its shared x rows past m are zeros), both
        // kernels clamp their reads to row n - 1 / m - 1 and value k - 1 and store only rows < m, columns < n; the
        // 16-byte loads run only when k is a multiple of the vector width, which keeps every row aligned in these
        // 256-byte-aligned allocations. A programmatic dependent: each kernel's pdl_start comes first.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::source_literal;

    /// The launch constants restated here are those cuda/dense.cu pins.
    #[test]
    fn launch_constants_match_the_kernel_source() {
        let src = include_str!("../../../cuda/dense.cu");
        assert_eq!(
            source_literal(src, "GEMV_ROWS_PER_BLOCK", " == ") as usize,
            super::GEMV_ROWS_PER_BLOCK
        );
        assert_eq!(
            source_literal(src, "constexpr int GEMV_THREADS", " = ") as u32,
            super::GEMV_THREADS
        );
        assert_eq!(
            source_literal(src, "constexpr int SPLITK_THREADS", " = ") as u32,
            super::SPLITK_THREADS
        );
        assert_eq!(
            source_literal(src, "GEMM_BM", " == ") as usize,
            super::GEMM_TILE
        );
        assert_eq!(
            source_literal(src, "GEMM_THREADS", " = ") as u32,
            super::GEMM_THREADS
        );
    }
}
