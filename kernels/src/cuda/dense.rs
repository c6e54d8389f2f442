//! Dense f32 / bf16 linear layers on the GPU (`cuda/dense.cu`): the exact path of the engine's CUDA forward pass
//! (small f32 checkpoints, parity tests against transformers, bf16 weights kept as they are stored), the GPU form
//! of [`crate::backend::f32_linear`] and of the bf16 [`crate::backend::Weight`]. Upload a matrix once with
//! [`Gpu::dense_weights_f32`] or [`Gpu::dense_weights_bf16`], then call [`Gpu::dense_linear`] per step: f32
//! activations in, f32 out, f32 products and sums on the CUDA cores (no tensor cores, no TF32). The checks come
//! first, then the launch of the GEMV (m <= 16) or the tiled GEMM.

#[cfg(feature = "cuda")]
use cudarc::driver::CudaSlice;

#[cfg(feature = "cuda")]
use super::device::{launch_config, Device, Module, PdlArgs};
#[cfg(feature = "cuda")]
use super::GpuScalar;
use super::{check_len_of, Gpu, GpuBuffer};
use crate::KernelError;

const I32_MAX: usize = i32::MAX as usize;

/// A dense weight matrix on the device, row-major `[n, k]` (`n` output features of `k` values each, the
/// checkpoint's layout), in f32 or as bf16 bits. Made by [`Gpu::dense_weights_f32`] / [`Gpu::dense_weights_bf16`];
/// [`Gpu::dense_linear`] checks that `w` holds `n * k` values before it trusts `n` and `k`.
pub enum DenseGpuWeights {
    /// f32 values.
    F32 {
        /// `[n, k]`.
        w: GpuBuffer<f32>,
        /// Output features.
        n: usize,
        /// Values per row.
        k: usize,
    },
    /// bf16 bits.
    Bf16 {
        /// `[n, k]`.
        w: GpuBuffer<u16>,
        /// Output features.
        n: usize,
        /// Values per row.
        k: usize,
    },
}

impl std::fmt::Debug for DenseGpuWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = match self {
            DenseGpuWeights::F32 { .. } => "f32",
            DenseGpuWeights::Bf16 { .. } => "bf16",
        };
        f.debug_struct("DenseGpuWeights")
            .field("dtype", &dtype)
            .field("n", &self.n())
            .field("k", &self.k())
            .field("device_bytes", &self.device_bytes())
            .finish()
    }
}

impl DenseGpuWeights {
    /// The device buffer, as [`super::Nvfp4TileWeights::buffers`].
    pub fn buffers(&self) -> Vec<super::WeightBuf<'_>> {
        match self {
            DenseGpuWeights::F32 { w, .. } => vec![super::WeightBuf::F32(w)],
            DenseGpuWeights::Bf16 { w, .. } => vec![super::WeightBuf::U16(w)],
        }
    }

    /// [`DenseGpuWeights::buffers`], to refill.
    pub fn buffers_mut(&mut self) -> Vec<super::WeightBufMut<'_>> {
        match self {
            DenseGpuWeights::F32 { w, .. } => vec![super::WeightBufMut::F32(w)],
            DenseGpuWeights::Bf16 { w, .. } => vec![super::WeightBufMut::U16(w)],
        }
    }

    /// Output features (rows of the matrix).
    pub fn n(&self) -> usize {
        match self {
            DenseGpuWeights::F32 { n, .. } | DenseGpuWeights::Bf16 { n, .. } => *n,
        }
    }

    /// Values per row (the inner dimension).
    pub fn k(&self) -> usize {
        match self {
            DenseGpuWeights::F32 { k, .. } | DenseGpuWeights::Bf16 { k, .. } => *k,
        }
    }

    /// Bytes of device memory the matrix takes.
    pub fn device_bytes(&self) -> usize {
        match self {
            DenseGpuWeights::F32 { w, .. } => w.len() * 4,
            DenseGpuWeights::Bf16 { w, .. } => w.len() * 2,
        }
    }
}

/// `n` and `k` positive and within the kernels' 32-bit indices, `len == n * k`.
fn check_matrix(op: &'static str, len: usize, n: usize, k: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        n > 0 && k > 0,
        op,
        "n and k must be positive, got n = {n}, k = {k}"
    );
    crate::ensure_shape!(
        n <= I32_MAX && k <= I32_MAX,
        op,
        "n = {n} and k = {k} must fit the kernels' 32-bit indices"
    );
    check_len_of(op, "w", len, &[n, k])
}

impl Gpu {
    /// Most activation rows [`Gpu::dense_linear`] gives to the GEMV kernel (each weight row read once for all of
    /// them); more rows take the tiled GEMM.
    pub const DENSE_GEMV_MAX_ROWS: usize = 16;

    /// Uploads the row-major f32 matrix `w` (`[n, k]`) for [`Gpu::dense_linear`].
    pub fn dense_weights_f32(
        &self,
        w: &[f32],
        n: usize,
        k: usize,
    ) -> Result<DenseGpuWeights, KernelError> {
        check_matrix("cuda::dense_weights_f32", w.len(), n, k)?;
        Ok(DenseGpuWeights::F32 {
            w: self.upload(w)?,
            n,
            k,
        })
    }

    /// Uploads the row-major bf16 matrix `w` (bits, `[n, k]`) for [`Gpu::dense_linear`], which widens each value
    /// to f32 exactly.
    pub fn dense_weights_bf16(
        &self,
        w: &[u16],
        n: usize,
        k: usize,
    ) -> Result<DenseGpuWeights, KernelError> {
        check_matrix("cuda::dense_weights_bf16", w.len(), n, k)?;
        Ok(DenseGpuWeights::Bf16 {
            w: self.upload(w)?,
            n,
            k,
        })
    }

    /// `y[m, n] = x[m, k] . w[n, k]^T`: f32 activations `x` (`x.len() == m * k`), f32 output `y`
    /// (`y.len() == m * n`), f32 products and sums (bf16 weights widened exactly), so it agrees with
    /// [`crate::backend::f32_linear`] up to the order of the sum.
    ///
    /// `m <= 16` ([`Gpu::DENSE_GEMV_MAX_ROWS`], decode) runs a GEMV that reads each weight row once for all `m`
    /// rows (a warp per 4 rows, 16-byte loads when `k` is a multiple of 4 for f32 or 8 for bf16, `x` staged in
    /// shared memory); more rows run a shared-memory tiled GEMM (64 x 64 output tiles), with k split over a
    /// cluster of 8 blocks per tile when the tiles are too few to fill the GPU (the partials are added in a fixed
    /// order: the same bits every run). Needs `m >= 1` and `m <= 65535 * 64`.
    pub fn dense_linear(
        &self,
        x: &GpuBuffer<f32>,
        w: &DenseGpuWeights,
        y: &mut GpuBuffer<f32>,
        m: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::dense_linear";
        let (n, k) = (w.n(), w.k());
        let wlen = match w {
            DenseGpuWeights::F32 { w, .. } => w.len(),
            DenseGpuWeights::Bf16 { w, .. } => w.len(),
        };
        check_matrix(OP, wlen, n, k)?;
        crate::ensure_shape!(m > 0, OP, "m must be positive");
        crate::ensure_shape!(
            m <= 65535 * 64,
            OP,
            "m = {m} is past the GEMM's grid (at most 65535 * 64 rows)"
        );
        check_len_of(OP, "x", x.len(), &[m, k])?;
        check_len_of(OP, "y", y.len(), &[m, n])?;
        #[cfg(feature = "cuda")]
        {
            match w {
                DenseGpuWeights::F32 { w, .. } => {
                    self.inner
                        .dense_linear(&x.slice, &w.slice, &mut y.slice, m, n, k)
                }
                DenseGpuWeights::Bf16 { w, .. } => {
                    self.inner
                        .dense_linear(&x.slice, &w.slice, &mut y.slice, m, n, k)
                }
            }
        }
        no_cuda!(self)
    }
}

/// Rows of `w` per GEMV block (`GEMV_ROWS_PER_BLOCK` in cuda/dense.cu: 4 warps of 4 rows).
#[cfg(feature = "cuda")]
pub(super) const GEMV_ROWS_PER_BLOCK: usize = 16;
/// Threads of a GEMV block (`GEMV_THREADS`).
#[cfg(feature = "cuda")]
pub(super) const GEMV_THREADS: u32 = 128;
/// Threads of a split-K GEMV block (`SPLITK_THREADS`): one block per output row.
#[cfg(feature = "cuda")]
pub(super) const SPLITK_THREADS: u32 = 256;
/// Matrices of fewer rows than this take the split-K GEMV (`ceil(n/16)` blocks of whole rows would leave most of the
/// GPU idle: 3 blocks for the 48-row DeltaNet projections of Qwen3.8-27B).
#[cfg(feature = "cuda")]
const DENSE_SPLITK_MAX_N: usize = 4096;
/// Output tile of the GEMM (`GEMM_BM` = `GEMM_BN`) and its threads (`GEMM_THREADS`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) const GEMM_TILE: usize = 64;
#[cfg(feature = "cuda")]
pub(super) const GEMM_THREADS: u32 = 256;
/// Blocks of a split GEMM's cluster (`GEMM_SPLITS`): each sums an eighth of k.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) const GEMM_SPLITS: usize = 8;

/// Whether `dense_gemm_split_*` runs a GEMM of `m` x `n` outputs over `k` on a GPU of `sms` multiprocessors: when
/// its 64 x 64 tiles are fewer than four per multiprocessor (a block per tile, each walking all of k, leaves the
/// rest idle: the 96-row DeltaNet gates of Qwen3.8-27B are 16 tiles at a 512-token prompt) and k gives each of the
/// GEMM_SPLITS blocks at least four steps of 16.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn dense_gemm_splits_k(m: usize, n: usize, k: usize, sms: usize) -> bool {
    let tiles = n.div_ceil(GEMM_TILE).saturating_mul(m.div_ceil(GEMM_TILE));
    tiles < sms.max(1).saturating_mul(4) && k >= GEMM_SPLITS * 64
}

/// The weight element types of `cuda/dense.cu`: f32 and bf16 bits.
#[cfg(feature = "cuda")]
trait DenseWeight: GpuScalar {
    /// `dense_gemv_<dtype>_m{1,2,4,8,16}`.
    const GEMV: [&'static str; 5];
    /// `dense_gemv_splitk_<dtype>_m{1,2,4,8,16}`.
    const SPLITK: [&'static str; 5];
    /// `dense_gemm_<dtype>`.
    const GEMM: &'static str;
    /// `dense_gemm_split_<dtype>`.
    const GEMM_SPLIT: &'static str;
}

#[cfg(feature = "cuda")]
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
    const GEMM_SPLIT: &'static str = "dense_gemm_split_f32";
}

#[cfg(feature = "cuda")]
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
    const GEMM_SPLIT: &'static str = "dense_gemm_split_bf16";
}

/// The launch of [`Gpu::dense_linear`], generic over the weight type; the entry point has checked every length.
#[cfg(feature = "cuda")]
impl Device {
    /// `dense_gemv_*_m{MAXM}` (MAXM the power of two at or above m) for m <= 16, else `dense_gemm_*`.
    fn dense_linear<T: DenseWeight>(
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
            let cfg = launch_config((n as u32, 1, 1), (SPLITK_THREADS, 1, 1), 0);
            (T::SPLITK[which], cfg)
        } else if m <= 16 {
            let which = m.next_power_of_two().trailing_zeros() as usize;
            let grid = (n.div_ceil(GEMV_ROWS_PER_BLOCK) as u32, 1, 1);
            let cfg = launch_config(grid, (GEMV_THREADS, 1, 1), 0);
            (T::GEMV[which], cfg)
        } else if dense_gemm_splits_k(m, n, k, self.sm_count()) {
            // A cluster of GEMM_SPLITS blocks per tile; few tiles, so grid.x stays far below its limit.
            let grid = (
                (n.div_ceil(GEMM_TILE) * GEMM_SPLITS) as u32,
                m.div_ceil(GEMM_TILE) as u32,
                1,
            );
            let cfg = launch_config(grid, (GEMM_THREADS, 1, 1), 0);
            (T::GEMM_SPLIT, cfg)
        } else {
            let grid = (
                n.div_ceil(GEMM_TILE) as u32,
                m.div_ceil(GEMM_TILE) as u32,
                1,
            );
            let cfg = launch_config(grid, (GEMM_THREADS, 1, 1), 0);
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
        // SAFETY: matches `dense_gemv_*(x, w, y, m, n, k)` / `dense_gemm_*(x, w, y, m, n, k)` /
        // `dense_gemm_split_*(x, w, y, m, n, k)` in cuda/dense.cu with the weight type T names; the caller checked
        // x = [m, k], w = [n, k], y = [m, n] with 1 <= n, k <= i32::MAX and 1 <= m <= 65535 * 64, so m, n and k fit
        // i32, grid.x = ceil(n/16), ceil(n/64), or ceil(n/64) * 8 (a multiple of the split kernel's compiled cluster
        // of 8, and small: it runs only below 4 tiles per multiprocessor) fits the grid and grid.y = ceil(m/64) <=
        // 65535; the GEMV's MAXM is at least m (its shared x rows past m are zeros), the
        // kernels clamp their reads to row n - 1 / m - 1 and value k - 1 and store only rows < m, columns < n; the
        // 16-byte loads run only when k is a multiple of the vector width, which keeps every row aligned in these
        // 256-byte-aligned allocations. Safe as launch_small's dependent: each kernel's pdl_start comes first.
        unsafe { self.launch_small(name, &f, cfg, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::dense_gemm_splits_k;

    /// The split runs where the tiles would leave most of the GPU idle and k is long enough to split, and nowhere
    /// else (132 multiprocessors, an H100's and an H200's count).
    #[test]
    fn the_gemm_splits_k_only_for_few_tiles_and_long_k() {
        // The DeltaNet gates of Qwen3.8-27B (96 x 5120) at 512 and 4096 prompt tokens, and at 32 decode rows.
        assert!(dense_gemm_splits_k(512, 96, 5120, 132));
        assert!(dense_gemm_splits_k(4096, 96, 5120, 132));
        assert!(dense_gemm_splits_k(32, 96, 5120, 132));
        // A vocabulary-sized head has tiles to spare.
        assert!(!dense_gemm_splits_k(512, 248_320, 5120, 132));
        // The boundary: 4 tiles per multiprocessor, and k of 8 slices of 64.
        assert!(!dense_gemm_splits_k(64, 64 * 528, 5120, 132));
        assert!(dense_gemm_splits_k(64, 64 * 527, 5120, 132));
        assert!(!dense_gemm_splits_k(512, 96, 511, 132));
        assert!(dense_gemm_splits_k(512, 96, 512, 132));
        // Sizes that overflow the tile count saturate into "enough tiles" instead of wrapping.
        assert!(!dense_gemm_splits_k(usize::MAX, usize::MAX, 5120, 132));
        assert!(dense_gemm_splits_k(17, 1, 512, 0));
    }
}

#[cfg(all(test, feature = "cuda"))]
mod embedded {
    use super::super::device::{assert_embedded, Module};
    use super::DenseWeight;

    /// Every kernel `dense_linear` can launch, for both weight types, is embedded, and nothing else is.
    #[test]
    fn every_dense_kernel_is_embedded() {
        fn names<T: DenseWeight>() -> Vec<&'static str> {
            let mut v = T::GEMV.to_vec();
            v.extend(T::SPLITK);
            v.extend([T::GEMM, T::GEMM_SPLIT]);
            v
        }
        let mut launched = names::<f32>();
        launched.extend(names::<u16>());
        assert_embedded(Module::Dense, launched);
    }
}
