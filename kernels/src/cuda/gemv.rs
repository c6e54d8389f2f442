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
    /// cores, 47-94%). The sweep variants ([`Gpu::fp8_block_gemv_preconverted`], [`Gpu::fp8_block_gemv_m1_sweep`])
    /// replace an entry only where `kernels/bench/h200/bench_gemv.py` measures them faster ("Auto table
    /// candidates" in its output).
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
    ///
    /// `Auto`'s table (H200, benchmarks/h200.md run 12): `nvfp4_gemv_mma_n8` for `m <= 8`, `nvfp4_gemv_mma_n16`
    /// above (38-61% of copy bandwidth). Candidates: [`Gpu::nvfp4_gemv_preconverted`] and, over weights repacked
    /// at load time, [`Gpu::nvfp4_gemv_tiles`]; `kernels/bench/h200/bench_gemv.py` decides.
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

/// The design-sweep entry points of issue 4 (decode GEMVs on the H200): each runs one variant that
/// `kernels/bench/h200/bench_gemv.py` times against the kernels [`KernelPath::Auto`] picks, and that the tests check
/// against the reference. [`KernelPath::Auto`] does not take them until a measurement says so.
impl Gpu {
    /// `u32` words of the activation scratch that [`Gpu::fp8_block_gemv_preconverted`],
    /// [`Gpu::nvfp4_gemv_preconverted`] and [`Gpu::nvfp4_gemv_tiles`] need for `m` rows of `k` values: the f16 B
    /// fragments of `ceil(k/128)` chunks x one (m <= 8) or two 8-token tiles, 2 KiB each.
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
    /// [`Gpu::nvfp4_gemv`] on the same weights before [`Gpu::nvfp4_repack_tiles`]), on the tensor cores, `1 <= m
    /// <= 16`. With `scratch` (at least [`Gpu::gemv_scratch_len`] words) the activations are converted once per
    /// call first; without, per weight tile as the checkpoint-layout kernel does.
    pub fn nvfp4_gemv_tiles(
        &self,
        x: &GpuBuffer<u16>,
        tiles: &Nvfp4TileWeights,
        global_scale: f32,
        y: &mut GpuBuffer<f32>,
        scratch: Option<&mut GpuBuffer<u32>>,
        m: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::nvfp4_gemv_tiles";
        let (n, k) = (tiles.n, tiles.k);
        check_gemv_dims(OP, m, n, k, 32)?;
        check_len(OP, "x", x.len(), m * k)?;
        check_len(OP, "y", y.len(), m * n)?;
        crate::ensure_shape!(
            global_scale.is_finite(),
            OP,
            "global_scale must be finite, got {global_scale}"
        );
        if let Some(s) = scratch.as_deref() {
            check_scratch(OP, s, m, k)?;
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
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = scratch;
            match self.never {}
        }
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
