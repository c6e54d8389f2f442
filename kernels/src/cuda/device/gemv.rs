//! Launches of `cuda/gemv.cu`: the FP8 and NVFP4 decode GEMVs.

use super::*;
use crate::cuda::gemv::{MmaSplit, SplitFormat, TilesKernel};

impl Device {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn fp8_block_gemv(
        &self,
        tensor: bool,
        ksplit: usize,
        pdl: bool,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        // Tensor cores: one 16-row tile per block (`fp8_block_gemv_mma_n*`, blockq_gemv_mma). CUDA cores: M = 1
        // uses two rows per warp and two 16-byte loads in flight per row, the best of the design sweep in
        // kernels/bench/h200 (3.54 TB/s on 5120x17408, 1.13x the one-row, four-load kernel, H200 2026-11-30);
        // Auto splits K over two warps below 65536 rows and launches that as a programmatic dependent
        // (fp8_m1_ksplit_auto, fp8_m1_pdl_auto in cuda/gemv.rs). `ksplit` (m = 1 only) warps
        // of a block share two rows, each a contiguous part of K (`fp8_block_gemv_m1_r2_u2_k{2,4}`): a block
        // covers 16 / ksplit rows.
        let (name, rows_per_block) = fp8_block_gemv_kernel(tensor, m, ksplit)?;
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(rows_per_block) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY (both launches): the argument list matches `fp8_block_gemv_m*` and `fp8_block_gemv_mma_n*` in
        // cuda/gemv.cu (three input pointers, one output, three ints) and the caller checked x = [m, k], w = [n, k],
        // scales = [ceil(n/128), ceil(k/128)], y = [m, n], k % 16 == 0, so every thread's 16-byte loads stay inside
        // its row (the K-split builds cut K at multiples of 512, inside [0, k)); the grid covers n at the build's
        // rows per block, rows past n are guarded; cudarc allocations are 256-byte aligned. As a programmatic
        // dependent (`pdl`, the m = 1 CUDA-core builds only) the kernel reads x and writes y only after its
        // pdl_wait (cuda/gemv.cu, fp8_block_gemv).
        if pdl && m == 1 && !tensor {
            let (xp, _gx) = x.device_ptr(&self.stream);
            let (wp, _gw) = w.device_ptr(&self.stream);
            let (sp, _gs) = scales.device_ptr(&self.stream);
            let (yp, _gy) = y.device_ptr_mut(&self.stream);
            let mut args = PdlArgs::default();
            args.ptr(xp).ptr(wp).ptr(sp).ptr(yp).i32(mi).i32(ni).i32(ki);
            // SAFETY: see "SAFETY (both launches)" above.
            unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        } else {
            let mut b = self.stream.launch_builder(&f);
            b.arg(x)
                .arg(w)
                .arg(scales)
                .arg(y)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki);
            // SAFETY: see "SAFETY (both launches)" above.
            unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        }
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
            let (name, _) = nvfp4_gemv_kernel(true, m, n);
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
        let (name, rows_per_warp) = nvfp4_gemv_kernel(false, m, n);
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

/// The kernel of [`Device::fp8_block_gemv`] and the rows one block covers.
pub(in crate::cuda) fn fp8_block_gemv_kernel(
    tensor: bool,
    m: usize,
    ksplit: usize,
) -> Result<(&'static str, usize), KernelError> {
    Ok(match (tensor, m, ksplit) {
        (true, ..=8, _) => ("fp8_block_gemv_mma_n8", 16),
        (true, _, _) => ("fp8_block_gemv_mma_n16", 16),
        (false, 1, 1) => ("fp8_block_gemv_m1_r2_u2", 16),
        (false, 1, 2) => ("fp8_block_gemv_m1_r2_u2_k2", 8),
        (false, 1, 4) => ("fp8_block_gemv_m1_r2_u2_k4", 4),
        (false, 1, s) => {
            return Err(KernelError::Cuda(format!(
                "fp8_block_gemv: no m = 1 build with K split {s} (1, 2 or 4)"
            )))
        }
        (false, 2, _) => ("fp8_block_gemv_m2", 8),
        (false, 3..=4, _) => ("fp8_block_gemv_m4", 8),
        (false, 5..=8, _) => ("fp8_block_gemv_m8", 8),
        (false, _, _) => ("fp8_block_gemv_m16", 8),
    })
}

/// The checkpoint-layout NVFP4 kernel of [`Device::nvfp4_gemv`] and, on the CUDA cores, its rows per warp.
pub(in crate::cuda) fn nvfp4_gemv_kernel(
    tensor: bool,
    m: usize,
    n: usize,
) -> (&'static str, usize) {
    match (tensor, m) {
        (true, ..=8) => ("nvfp4_gemv_mma_n8", 1),
        (true, _) => ("nvfp4_gemv_mma_n16", 1),
        (false, 1) if n >= 16384 => ("nvfp4_gemv_m1_r2_u4", 2),
        (false, 1) => ("nvfp4_gemv_m1", 1),
        (false, 2) => ("nvfp4_gemv_m2", 1),
        (false, 3..=4) => ("nvfp4_gemv_m4", 1),
        (false, 5..=8) => ("nvfp4_gemv_m8", 1),
        (false, _) => ("nvfp4_gemv_m16", 1),
    }
}

/// The activation-fragment kernel for a format (`nvfp4`, else FP8), zeroing y as well or not.
pub(in crate::cuda) fn act_frag_kernel(nvfp4: bool, zero: bool) -> &'static str {
    match (nvfp4, zero) {
        (true, false) => "gemv_act_frag_nvfp4",
        (false, false) => "gemv_act_frag_fp8",
        (true, true) => "gemv_act_frag_nvfp4_zero",
        (false, true) => "gemv_act_frag_fp8_zero",
    }
}

/// The `fp8_gemv_tile_m1_w*c*` build for a cut.
pub(in crate::cuda) fn fp8_tile_m1_kernel(split: MmaSplit) -> Option<&'static str> {
    const NAMES: [&str; 5] = [
        "fp8_gemv_tile_m1_w8c1",
        "fp8_gemv_tile_m1_w8c2",
        "fp8_gemv_tile_m1_w4c1",
        "fp8_gemv_tile_m1_w4c2",
        "fp8_gemv_tile_m1_w4c3",
    ];
    MmaSplit::BUILT
        .iter()
        .position(|&c| c == (split.warps, split.splits))
        .map(|i| NAMES[i])
}

/// The `fp8_gemv_mma_tile_n*_w*c*` build (activations converted in the GEMV) for `m` tokens and a cut.
pub(in crate::cuda) fn fp8_tile_converting_kernel(
    m: usize,
    split: MmaSplit,
) -> Option<&'static str> {
    Some(match (m <= 8, split.warps, split.splits) {
        (true, 8, 1) => "fp8_gemv_mma_tile_n8_w8c1",
        (true, 8, 2) => "fp8_gemv_mma_tile_n8_w8c2",
        (true, 4, 1) => "fp8_gemv_mma_tile_n8_w4c1",
        (false, 8, 1) => "fp8_gemv_mma_tile_n16_w8c1",
        (false, 8, 2) => "fp8_gemv_mma_tile_n16_w8c2",
        (false, 4, 1) => "fp8_gemv_mma_tile_n16_w4c1",
        _ => return None,
    })
}

/// The `_w{W}c{CS}` build of cuda/gemv.cu for a format, token tiles (1: m <= 8, 2: m <= 16), warps and splits:
/// 8 warps x 1 or 2 splits, 4 warps x 1, 2 or 3 ([`MmaSplit::BUILT`]).
pub(in crate::cuda) fn split_kernel(
    format: SplitFormat,
    nt: usize,
    warps: usize,
    splits: usize,
) -> Option<&'static str> {
    const FP8: [[&str; 5]; 2] = [
        [
            "fp8_block_gemv_mma_pre_n8_w8c1",
            "fp8_block_gemv_mma_pre_n8_w8c2",
            "fp8_block_gemv_mma_pre_n8_w4c1",
            "fp8_block_gemv_mma_pre_n8_w4c2",
            "fp8_block_gemv_mma_pre_n8_w4c3",
        ],
        [
            "fp8_block_gemv_mma_pre_n16_w8c1",
            "fp8_block_gemv_mma_pre_n16_w8c2",
            "fp8_block_gemv_mma_pre_n16_w4c1",
            "fp8_block_gemv_mma_pre_n16_w4c2",
            "fp8_block_gemv_mma_pre_n16_w4c3",
        ],
    ];
    const NVFP4: [[&str; 5]; 2] = [
        [
            "nvfp4_gemv_mma_tile_pre_n8_w8c1",
            "nvfp4_gemv_mma_tile_pre_n8_w8c2",
            "nvfp4_gemv_mma_tile_pre_n8_w4c1",
            "nvfp4_gemv_mma_tile_pre_n8_w4c2",
            "nvfp4_gemv_mma_tile_pre_n8_w4c3",
        ],
        [
            "nvfp4_gemv_mma_tile_pre_n16_w8c1",
            "nvfp4_gemv_mma_tile_pre_n16_w8c2",
            "nvfp4_gemv_mma_tile_pre_n16_w4c1",
            "nvfp4_gemv_mma_tile_pre_n16_w4c2",
            "nvfp4_gemv_mma_tile_pre_n16_w4c3",
        ],
    ];
    let i = MmaSplit::BUILT
        .iter()
        .position(|&(w, s)| (w, s) == (warps, splits))?;
    const FP8_TILE: [[&str; 5]; 2] = [
        [
            "fp8_gemv_mma_tile_pre_n8_w8c1",
            "fp8_gemv_mma_tile_pre_n8_w8c2",
            "fp8_gemv_mma_tile_pre_n8_w4c1",
            "fp8_gemv_mma_tile_pre_n8_w4c2",
            "fp8_gemv_mma_tile_pre_n8_w4c3",
        ],
        [
            "fp8_gemv_mma_tile_pre_n16_w8c1",
            "fp8_gemv_mma_tile_pre_n16_w8c2",
            "fp8_gemv_mma_tile_pre_n16_w4c1",
            "fp8_gemv_mma_tile_pre_n16_w4c2",
            "fp8_gemv_mma_tile_pre_n16_w4c3",
        ],
    ];
    let table = match format {
        SplitFormat::Fp8 => &FP8,
        SplitFormat::Fp8Tile => &FP8_TILE,
        SplitFormat::Nvfp4Tile => &NVFP4,
    };
    table.get(nt.checked_sub(1)?).map(|row| row[i])
}

/// The grid of a tensor-core GEMV cut: `split.splits` blocks (one cluster) of `split.warps` warps per 16-row tile.
fn split_config(n: usize, split: MmaSplit) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(16) as u32, split.splits as u32, 1),
        block_dim: (32 * split.warps as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per 16 output bytes of a repack kernel (`fp8_repack_mma`, `nvfp4_repack_mma`), 256 per block.
fn repack_config(name: &str, threads: usize) -> Result<LaunchConfig, KernelError> {
    let blocks = u32::try_from(threads.div_ceil(256))
        .map_err(|_| KernelError::Cuda(format!("{name}: {threads} threads exceed one grid")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn gemv_config(n: usize, rows_per_warp: usize) -> LaunchConfig {
    // 8 warps per block, `rows_per_warp` output rows per warp (cuda/gemv.cu).
    LaunchConfig {
        grid_dim: (n.div_ceil(8 * rows_per_warp) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The activations of a tensor-core GEMV launch (`Device::mma_split_gemv`).
pub(in crate::cuda) enum Activations<'a> {
    /// bf16 `x [m, k]`, converted into the scratch first by `gemv_act_frag_*`.
    Convert(&'a CudaSlice<u16>, &'a mut CudaSlice<u32>),
    /// Fragments already written on this stream (`Gpu::rmsnorm_fp8_fragments`, `Gpu::silu_and_mul_fp8_fragments`,
    /// their NVFP4 twins), only read.
    Fragments(&'a CudaSlice<u32>),
}

fn mma_config(n: usize) -> LaunchConfig {
    // One 16-row tile of W per block, 8 warps sharing its K chunks (cuda/gemv.cu, blockq_gemv_mma).
    LaunchConfig {
        grid_dim: (n.div_ceil(16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Device {
    /// `gemv_act_frag_{fp8,nvfp4}`: bf16 `x [m, k]` -> f16 B fragments `xf` (`ceil(k/128) * nt * 512` words),
    /// launched as a programmatic dependent when `pdl`.
    #[allow(clippy::too_many_arguments)]
    fn gemv_act_frag(
        &self,
        nvfp4: bool,
        pdl: bool,
        x: &CudaSlice<u16>,
        xf: &mut CudaSlice<u32>,
        m: usize,
        k: usize,
        nt: usize,
    ) -> Result<(), KernelError> {
        let name = act_frag_kernel(nvfp4, false);
        let f = self.function(Module::Gemv, name)?;
        let total = k.div_ceil(128) * nt * 128; // uint4 written, one per thread
        let (mi, ki, nti) = (m as i32, k as i32, nt as i32);
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY (both launches): matches `gemv_act_frag_*(const uint16_t* x, uint4* xf, int m, int k, int nt)` in
        // cuda/gemv.cu, which waits (pdl_wait) before it reads x or writes xf; the caller checked x = [m, k] with
        // k % 16 == 0 (each 16-byte load is inside its row, tokens >= m are not read) and xf holds at least
        // ceil(k/128) * nt * 128 uint4 (threads past that return); cudarc allocations are 256-byte aligned.
        // Launched as a programmatic dependent (Device::launch_pdl) where the GEMV after it is (the NVFP4 tile pair
        // measured 1.03-1.08x faster so; the one-wave FP8 grids of one block per tile 0.6-1.04x).
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (xfp, _gxf) = xf.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(xfp).i32(mi).i32(ki).i32(nti);
        // SAFETY: see "SAFETY (both launches)" above.
        unsafe { self.launch_ex(name, &f, cfg, &mut args, pdl) }?;
        Ok(())
    }

    /// The tensor-core GEMV over preconverted activations, cut as `split` says (`cuda/gemv.cu`, the `_w{W}c{CS}`
    /// builds of blockq_gemv_mma): `gemv_act_frag_{fp8,nvfp4}` into `xf`, then `split.splits` blocks of
    /// `split.warps` warps (one thread-block cluster) per 16-row tile; both launched as programmatic dependents when
    /// `split.pdl`. FP8: `w` e4m3 `[n, k]` (or its tile layout, `fp8_repack_mma`), `scales` fp32 block scales,
    /// `global_scale` unused. NVFP4: `w` and `scales` the tile layout of `nvfp4_repack_mma`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn mma_split_gemv<S: cudarc::driver::DeviceRepr>(
        &self,
        format: SplitFormat,
        split: MmaSplit,
        act: Activations<'_>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<S>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let nt = if m <= 8 { 1 } else { 2 };
        let nvfp4 = format == SplitFormat::Nvfp4Tile;
        let name = split_kernel(format, nt, split.warps, split.splits).ok_or_else(|| {
            KernelError::Cuda(format!(
                "no tensor-core GEMV build with {} warps and {} splits",
                split.warps, split.splits
            ))
        })?;
        let xf: &CudaSlice<u32> = match act {
            Activations::Convert(x, xf) => {
                self.gemv_act_frag(nvfp4, split.pdl, x, xf, m, k, nt)?;
                xf
            }
            Activations::Fragments(xf) => xf,
        };
        let f = self.function(Module::Gemv, name)?;
        let cfg = split_config(n, split);
        let (xfp, _gxf) = xf.device_ptr(&self.stream);
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (sp, _gs) = scales.device_ptr(&self.stream);
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xfp).ptr(wp).ptr(sp);
        if nvfp4 {
            args.f32(global_scale);
        }
        args.ptr(yp).i32(m as i32).i32(n as i32).i32(k as i32);
        // SAFETY: matches `fp8_block_gemv_mma_pre_n*_w*c*(xf, w, scales, y, m, n, k)`,
        // `fp8_gemv_mma_tile_pre_n*_w*c*` (the same list) and
        // `nvfp4_gemv_mma_tile_pre_n*_w*c*(xf, wr, sr, global_scale, y, m, n, k)` in cuda/gemv.cu; xf holds the
        // fragments of m tokens, k and nt (the kernel reads ceil(k/128) * nt * 128 uint4 of it, for tokens < m
        // only), written just above from x or (Activations::Fragments) by the caller on this stream before (the
        // caller checked its length); the caller checked w and scales (FP8: [n, k] or its tile layout of ceil(n/16) *
        // ceil(k/128) * 2048 bytes, and [ceil(n/128), ceil(k/128)], k % 16 == 0; NVFP4: the tile layout of exactly
        // n x k) and y = [m, n]; grid.y equals the build's cluster size, as __cluster_dims__ requires; stores are
        // guarded against m and n; the kernel reads xf and writes y only after its pdl_wait.
        unsafe { self.launch_ex(name, &f, cfg, &mut args, split.pdl) }?;
        Ok(())
    }

    /// NVFP4 in the checkpoint layout, activations converted first (`gemv_act_frag_nvfp4` + `nvfp4_gemv_mma_pre_n*`).
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub(in crate::cuda) fn nvfp4_gemv_pre(
        &self,
        x: &CudaSlice<u16>,
        xf: &mut CudaSlice<u32>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let (nt, name) = if m <= 8 {
            (1, "nvfp4_gemv_mma_pre_n8")
        } else {
            (2, "nvfp4_gemv_mma_pre_n16")
        };
        self.gemv_act_frag(true, true, x, xf, m, k, nt)?;
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&*xf)
            .arg(w)
            .arg(scales)
            .arg(&global_scale)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `nvfp4_gemv_mma_pre_n*`; xf was just written for this m, k and nt; w, scales, y checked by
        // the caller as for `nvfp4_gemv_mma_n*` (k % 32 == 0).
        unsafe { b.launch(mma_config(n)) }.map_err(cuda_err(name))?;
        Ok(())
    }

    /// The FP8 tile-layout GEMV for one token on the CUDA cores (`fp8_gemv_tile_m1_w*c*`: each lane multiplies its
    /// weights with the bf16 activations itself; no fragment kernel, no scratch), cut as `split` says, launched as
    /// a programmatic dependent when `split.pdl`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn fp8_tile_gemv_m1(
        &self,
        split: MmaSplit,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let name = fp8_tile_m1_kernel(split).ok_or_else(|| {
            KernelError::Cuda(format!(
                "no m = 1 FP8 tile GEMV build with {} warps and {} splits",
                split.warps, split.splits
            ))
        })?;
        // SAFETY: matches `fp8_gemv_tile_m1_w*c*(x, wr, scales, y, n, k)` in cuda/gemv.cu; the caller checked
        // x = [1, k] with k % 16 == 0 (each lane's two 16-value activation pieces are whole inside the row or
        // skipped), w the tile layout of exactly n x k (block (b, s) reads tile b only), scales =
        // [ceil(n/128), ceil(k/128)] and y = [1, n]; grid.y equals the build's cluster size; stores are guarded
        // against n; the kernel reads x and writes y only after its pdl_wait (weights may be read before it).
        unsafe { self.launch_tile_gemv(name, split, x, w, scales, y, None, n, k) }
    }

    /// Launches the FP8 tile kernel `name` with the parameters `(x, w, scales, y, [m,] n, k)` (`m` only when
    /// given) on the grid of `split`, as a programmatic dependent when `split.pdl`.
    ///
    /// # Safety
    /// As [`Device::launch_pdl`]: `name` takes exactly these parameters, and the caller checked the buffers
    /// against the kernel's reads and writes for `m`, `n`, `k`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_tile_gemv(
        &self,
        name: &'static str,
        split: MmaSplit,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: Option<usize>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Gemv, name)?;
        let cfg = split_config(n, split);
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (sp, _gs) = scales.device_ptr(&self.stream);
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(wp).ptr(sp).ptr(yp);
        if let Some(m) = m {
            args.i32(m as i32);
        }
        args.i32(n as i32).i32(k as i32);
        // SAFETY: the caller's contract above; the guards keep the buffers alive across the queued launch.
        unsafe { self.launch_ex(name, &f, cfg, &mut args, split.pdl) }
    }

    /// The FP8 tile-layout GEMV converting its own activations from bf16 `x` (`fp8_gemv_mma_tile_n*_w*c*`: no
    /// fragment kernel, no scratch), cut as `split` says (one of `MmaSplit::BUILT_CONVERTING`), launched as a
    /// programmatic dependent when `split.pdl`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn fp8_tile_gemv_converting(
        &self,
        split: MmaSplit,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let name = fp8_tile_converting_kernel(m, split).ok_or_else(|| {
            KernelError::Cuda(format!(
                "no converting FP8 tile GEMV build with {} warps and {} splits",
                split.warps, split.splits
            ))
        })?;
        // SAFETY: matches `fp8_gemv_mma_tile_n*_w*c*(x, wr, scales, y, m, n, k)` in cuda/gemv.cu; the caller
        // checked x = [m, k] with k % 16 == 0 (activation loads are guarded against m and k), w the tile layout of
        // exactly n x k (ceil(n/16) * ceil(k/128) * 2048 bytes; block (b, s) reads tile b only), scales =
        // [ceil(n/128), ceil(k/128)] and y = [m, n]; grid.y equals the build's cluster size; stores are guarded
        // against m and n; the kernel reads x and writes y only after its pdl_wait.
        unsafe { self.launch_tile_gemv(name, split, x, w, scales, y, Some(m), n, k) }
    }

    /// `fp8_repack_mma`: FP8 checkpoint layout -> tile layout (cuda/gemv.cu documents it).
    pub(in crate::cuda) fn fp8_repack_mma(
        &self,
        w: &CudaSlice<u8>,
        wr: &mut CudaSlice<u8>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "fp8_repack_mma";
        let f = self.function(Module::Gemv, NAME)?;
        let cfg = repack_config(NAME, n.div_ceil(16) * k.div_ceil(128) * 128)?;
        let (ni, ki) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(w).arg(wr).arg(&ni).arg(&ki);
        // SAFETY: matches `fp8_repack_mma(w, wr, n, k)`; the caller checked w = [n, k] with k % 16 == 0 (every
        // 16-byte load is whole and aligned inside its row; rows >= n and values >= k are not read) and
        // wr = ceil(n/16) * ceil(k/128) * 2048 bytes, exactly what the threads (one per 16 output bytes, the rest
        // return) write.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `nvfp4_repack_mma`: checkpoint layout -> tile layout (cuda/gemv.cu documents it).
    pub(in crate::cuda) fn nvfp4_repack_mma(
        &self,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        wr: &mut CudaSlice<u8>,
        sr: &mut CudaSlice<u32>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "nvfp4_repack_mma";
        let f = self.function(Module::Gemv, NAME)?;
        let cfg = repack_config(NAME, n.div_ceil(16) * k.div_ceil(128) * 64)?;
        let (ni, ki) = (n as i32, k as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(w).arg(scales).arg(wr).arg(sr).arg(&ni).arg(&ki);
        // SAFETY: matches `nvfp4_repack_mma`; the caller checked w = [n, k/2], scales = [n, k/16], k % 32 == 0
        // (every 16-byte and 2-byte load is whole and aligned inside its row; rows >= n and k0 >= k are not read),
        // wr = ceil(n/16) * ceil(k/128) * 1024 bytes and sr = ceil(n/16) * ceil(k/128) * 32 words, exactly what
        // the threads (one per 16 output bytes, the rest return) write.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// The tile-layout NVFP4 GEMV: `kernel` picks the build (see `TilesKernel` in cuda/gemv.rs); with `xf`, the
    /// activations are converted first by `gemv_act_frag_nvfp4`, or by `gemv_act_frag_nvfp4_zero` (which also zeroes y)
    /// when `splits > 1`. The caller allows `splits > 1` only for `TilesKernel::Split` and passes `xf` for every kernel
    /// but `TilesKernel::Converting`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn nvfp4_gemv_tiles(
        &self,
        kernel: TilesKernel,
        x: &CudaSlice<u16>,
        xf: Option<&mut CudaSlice<u32>>,
        wr: &CudaSlice<u8>,
        sr: &CudaSlice<u32>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        splits: usize,
    ) -> Result<(), KernelError> {
        let nt = if m <= 8 { 1 } else { 2 };
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let name = nvfp4_tiles_name(kernel, m)?;
        let f = self.function(Module::Gemv, name)?;
        match xf {
            Some(xf) => {
                let m1 = matches!(kernel, TilesKernel::M1 { .. });
                let splits = if kernel == TilesKernel::Split || m1 {
                    splits
                } else {
                    1
                };
                if splits > 1 {
                    self.gemv_act_frag_zero(x, xf, y, m, n, k, nt)?;
                } else {
                    self.gemv_act_frag(true, true, x, xf, m, k, nt)?;
                }
                let mut cfg = mma_config(n);
                cfg.grid_dim.1 = splits as u32;
                if let TilesKernel::M1 { warps } = kernel {
                    cfg.block_dim.0 = 32 * warps;
                }
                // Both kernels launched as programmatic dependents (Device::launch_pdl): the GEMV's blocks get
                // resident while the fragment kernel runs. On the H200, against the same two kernels launched plainly:
                // 18.55 vs 19.19 us (5120x17408, m = 1), 18.22 vs 19.47 (17408x5120), 12.27 vs 13.21 (5120x10240),
                // 198.2 vs 199.5 (lm_head); 1.03-1.08x at m = 1..16 on the layer shapes.
                // (with splits > 1, y was zeroed by the fragment kernel just above, on the same stream)
                self.tiles_pre_launch(
                    name,
                    &f,
                    cfg,
                    &*xf,
                    wr,
                    sr,
                    global_scale,
                    y,
                    (!m1).then_some(m),
                    n,
                    k,
                )?;
            }
            None => {
                if kernel != TilesKernel::Converting {
                    return Err(KernelError::Cuda(format!(
                        "{name}: needs the activation scratch"
                    )));
                }
                let mut b = self.stream.launch_builder(&f);
                b.arg(x)
                    .arg(wr)
                    .arg(sr)
                    .arg(&global_scale)
                    .arg(y)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki);
                // SAFETY: matches `nvfp4_gemv_mma_tile_n*`; x = [m, k] with k % 32 == 0 checked by the caller
                // (activation loads are guarded against m and k), wr/sr as above, y = [m, n].
                unsafe { b.launch(mma_config(n)) }.map_err(cuda_err(name))?;
            }
        }
        Ok(())
    }

    /// The tile-layout NVFP4 GEMV on fragments already in `xf` (written just before on this stream by the fragment
    /// kernel or a producer such as `rmsnorm_frag_nvfp4`): `nvfp4_gemv_tiles_n*_u1` / `nvfp4_gemv_mma_tile_pre_n*`
    /// (`m` given) or `nvfp4_gemv_tiles_m1_w*[c2]` (`m` None: the m = 1 kernels take none), as a programmatic
    /// dependent with `cfg`'s grid (y: the K splits or the cluster's blocks) and block.
    #[allow(clippy::too_many_arguments)]
    fn tiles_pre_launch(
        &self,
        name: &'static str,
        f: &cudarc::driver::CudaFunction,
        cfg: LaunchConfig,
        xf: &CudaSlice<u32>,
        wr: &CudaSlice<u8>,
        sr: &CudaSlice<u32>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: Option<usize>,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let (xfp, _gxf) = xf.device_ptr(&self.stream);
        let (wrp, _gwr) = wr.device_ptr(&self.stream);
        let (srp, _gsr) = sr.device_ptr(&self.stream);
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xfp).ptr(wrp).ptr(srp).f32(global_scale).ptr(yp);
        if let Some(m) = m {
            args.i32(m as i32);
        }
        args.i32(n as i32).i32(k as i32);
        // SAFETY: matches `nvfp4_gemv_tiles_n*_u1` and `nvfp4_gemv_mma_tile_pre_n*` (xf, wr, sr, global_scale, y, m,
        // n, k; the latter reads one tile per block and runs with grid.y = 1), and `nvfp4_gemv_tiles_m1_w*` /
        // `_w8c2` (the same without m, 32 x warps threads, m = 1 only; the cluster build with grid.y = 2, its
        // __cluster_dims__) in cuda/gemv.cu; the callers pass xf written on this stream for m, k and nt (the kernels
        // read ceil(k/128) * nt * 128 uint4 of it, only for tokens < m, and the callers checked its length), wr and
        // sr the tile layout of exactly n x k (block (b, s) reads chunks of tile b only, inside ceil(k/128),
        // ceil(n/16) blocks) and y = [m, n]; stores and atomics are guarded against m and n, and atomics (grid.y > 1
        // without a cluster) only follow a fragment kernel that zeroed y; the kernels read xf and touch y only after
        // their pdl_wait.
        unsafe { self.launch_pdl(name, f, cfg, &mut args) }?;
        Ok(())
    }

    /// The GEMV alone on fragments a producer wrote, cut by `kernel`: `Gpu::nvfp4_gemv_tiles_fragments`' cuts
    /// (`nvfp4_fragments_cut`, `splits` 1: none adds into y), or `Gpu::nvfp4_step`'s (`nvfp4_tiles_auto`: `Split`
    /// and `M1` with `splits` > 1 add into y, which that step's producer zeroed).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn nvfp4_gemv_tiles_fragments(
        &self,
        kernel: TilesKernel,
        splits: usize,
        xf: &CudaSlice<u32>,
        wr: &CudaSlice<u8>,
        sr: &CudaSlice<u32>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let mut cfg = mma_config(n);
        match kernel {
            TilesKernel::Cluster(split) => {
                return self.mma_split_gemv(
                    SplitFormat::Nvfp4Tile,
                    split,
                    Activations::Fragments(xf),
                    wr,
                    sr,
                    global_scale,
                    y,
                    m,
                    n,
                    k,
                )
            }
            TilesKernel::M1Cluster => cfg.grid_dim.1 = 2,
            TilesKernel::M1 { warps } => {
                cfg.grid_dim.1 = splits as u32;
                cfg.block_dim.0 = 32 * warps;
            }
            TilesKernel::Split => cfg.grid_dim.1 = splits as u32,
            TilesKernel::Mma | TilesKernel::Converting => {}
        }
        let name = match kernel {
            TilesKernel::Converting => {
                return Err(KernelError::Cuda(
                    "nvfp4_gemv_tiles_fragments: the converting build takes bf16 activations, not fragments"
                        .into(),
                ))
            }
            TilesKernel::M1Cluster if m == 1 => "nvfp4_gemv_tiles_m1_w8c2",
            _ => nvfp4_tiles_name(kernel, m)?,
        };
        // The m = 1 kernels take no m.
        let m_arg =
            (!matches!(kernel, TilesKernel::M1 { .. } | TilesKernel::M1Cluster)).then_some(m);
        let f = self.function(Module::Gemv, name)?;
        self.tiles_pre_launch(name, &f, cfg, xf, wr, sr, global_scale, y, m_arg, n, k)
    }

    /// `gemv_act_frag_nvfp4_zero`: `gemv_act_frag_nvfp4` that also zeroes `y[0 .. m*n)`, for the split-K launches
    /// that add into `y`.
    #[allow(clippy::too_many_arguments)]
    fn gemv_act_frag_zero(
        &self,
        x: &CudaSlice<u16>,
        xf: &mut CudaSlice<u32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        nt: usize,
    ) -> Result<(), KernelError> {
        let name = act_frag_kernel(true, true);
        let f = self.function(Module::Gemv, name)?;
        let total = k.div_ceil(128) * nt * 128;
        let (mi, ki, nti) = (m as i32, k as i32, nt as i32);
        let ylen = (m * n) as u64;
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (xfp, _gxf) = xf.device_ptr_mut(&self.stream);
        let (yp, _gy) = y.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(xfp)
            .i32(mi)
            .i32(ki)
            .i32(nti)
            .ptr(yp)
            .u64(ylen);
        // SAFETY: as `gemv_act_frag` above (a programmatic dependent, as there for NVFP4), plus y: the caller
        // checked y = [m, n], and the grid-stride loop writes exactly y[0 .. m*n), after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }
}

/// The `cuda/gemv.cu` entry of a tile-layout NVFP4 GEMV build for `m` tokens (n8 for m <= 8, n16 above; the
/// m = 1 kernels at m = 1 only), shared by `Device::nvfp4_gemv_tiles` and `Device::nvfp4_gemv_tiles_fragments`.
/// The cluster cuts have no single name here (`mma_split_gemv`, or `_m1_w8c2` on fragments).
pub(in crate::cuda) fn nvfp4_tiles_name(
    kernel: TilesKernel,
    m: usize,
) -> Result<&'static str, KernelError> {
    let n8 = m <= 8;
    Ok(match kernel {
        TilesKernel::Converting if n8 => "nvfp4_gemv_mma_tile_n8",
        TilesKernel::Converting => "nvfp4_gemv_mma_tile_n16",
        TilesKernel::Mma if n8 => "nvfp4_gemv_mma_tile_pre_n8",
        TilesKernel::Mma => "nvfp4_gemv_mma_tile_pre_n16",
        TilesKernel::Split if n8 => "nvfp4_gemv_tiles_n8_u1",
        TilesKernel::Split => "nvfp4_gemv_tiles_n16_u1",
        TilesKernel::M1 { warps: 8 } if m == 1 => "nvfp4_gemv_tiles_m1_w8",
        TilesKernel::M1 { warps: 4 } if m == 1 => "nvfp4_gemv_tiles_m1_w4",
        TilesKernel::M1 { warps } => {
            return Err(KernelError::Cuda(format!(
                "nvfp4_gemv_tiles: no m = 1 kernel for {warps} warps and m = {m}"
            )))
        }
        TilesKernel::Cluster(_) | TilesKernel::M1Cluster => {
            return Err(KernelError::Cuda(
                "nvfp4_gemv_tiles: cluster splits launch through mma_split_gemv / on fragments"
                    .into(),
            ))
        }
    })
}
