//! Launches of `cuda/gemm_sm90a.cu` (wgmma prefill GEMMs, an sm_90a cubin loaded only on compute capability
//! 9.0). The safe wrappers in `super::super::gemm_sm90a` have checked every size; this file sizes the grids,
//! raises the shared-memory limit, encodes the TMA tensor maps and launches.

use cudarc::driver::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::{cuda_err, Device, Module};
use crate::cuda::gemm_sm90a::{Fp8OutSlice, Fp8Wgmma, Nvfp4Wgmma};
use crate::KernelError;

/// Dynamic shared memory of `fp8_block_gemm_sm90a_v1` (cuda/gemm_sm90a.cu `F8V1_SMEM_BYTES`, kept equal by a
/// static_assert there): 4 stages of two 128x128-byte tiles plus 1 KiB to align the ring to 1024 bytes.
const FP8_V1_SMEM_BYTES: u32 = 132_096;
/// `F8V2_SMEM_BYTES`: 6 stages of two 128x128-byte tiles, 1 KiB of alignment, 12 mbarriers (v2, and the
/// persistent v3/v4 and v4's bf16 form, which share the ring).
const FP8_V2_SMEM_BYTES: u32 = 197_728;
/// `N4_SMEM_BYTES`: two decoded 128x64 bf16 tiles, 4 stages of (x tile, packed weights, scales) padded to
/// 1 KiB, 1 KiB of alignment.
const NVFP4_V1_SMEM_BYTES: u32 = 119_808;
/// `N4V2_SMEM_BYTES`: 6 stages of (x tile, decoded B tile), 16 KiB each, 1 KiB of alignment, 12 mbarriers.
const NVFP4_V2_SMEM_BYTES: u32 = 197_728;
/// `N4V3_SMEM_BYTES`: 4 stages of (x tile 256 x 64 bf16 = 32 KiB, decoded B tile 16 KiB), 1 KiB of alignment,
/// 8 mbarriers.
const NVFP4_V3_SMEM_BYTES: u32 = 197_696;

/// A CUDA tensor map passed by value as a `__grid_constant__` kernel parameter (the kernel's `TmaDesc`, 128
/// bytes). The driver copies kernel parameters by the kernel's declared layout, so the host alignment of this
/// wrapper only has to satisfy `cuTensorMapEncodeTiled` (64 bytes; `CUtensorMap` is 128-aligned).
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte value with no pointers into host memory, passed to the kernel by copy.
unsafe impl DeviceRepr for TensorMap {}

/// The tensor map of a row-major uint8 matrix `[rows, cols]` at device address `ptr`, read in boxes of 128 rows
/// x 128 bytes with the 128-byte swizzle (what the wgmma descriptors expect), rows past `rows` zero-filled.
/// Needs `cols % 16 == 0` (the row stride must be a multiple of 16 bytes) and a 16-byte aligned `ptr`.
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
fn tile_grid(m: usize, n: usize) -> u32 {
    (m.div_ceil(128) * n.div_ceil(128)) as u32
}

impl Device {
    /// The FP8 wgmma kernels of cuda/gemm_sm90a.cu: `_v1` (cp.async ring, 2 warpgroups, one block per tile),
    /// `_v2` (TMA + mbarriers, producer warpgroup + 2 consumer warpgroups, one block per tile), `_v3` (v2
    /// persistent: one block per SM looping over tiles) and `_v4` (v3 with ping-pong partials); `_v4_bf16`
    /// writes bf16. A bf16 output with another build is refused (the safe layer refuses it first).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn fp8_block_gemm_sm90a(
        &self,
        variant: Fp8Wgmma,
        xq: &CudaSlice<u8>,
        x_scales: &CudaSlice<f32>,
        w: &CudaSlice<u8>,
        w_scales: &CudaSlice<f32>,
        y: Fp8OutSlice<'_>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let bf16 = matches!(y, Fp8OutSlice::Bf16(_));
        let (name, smem, threads) = fp8_wgmma_kernel(variant, bf16)?;
        let f = self.function(Module::GemmSm90a, name)?;
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(cuda_err("fp8_block_gemm_sm90a shared memory size"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let tiles = tile_grid(m, n);
        let blocks = match variant {
            // Persistent kernels: one block per SM (the ring's shared memory allows one), at most one per tile.
            Fp8Wgmma::Persistent | Fp8Wgmma::PingPong => tiles.min(self.sm_count().max(1) as u32),
            Fp8Wgmma::CpAsync | Fp8Wgmma::Tma => tiles,
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        if variant != Fp8Wgmma::CpAsync {
            // The guards order these raw-pointer uses after any pending writes on other streams and keep the
            // buffers' events until the launch is queued.
            let (xp, _gx) = xq.device_ptr(&self.stream);
            let (wp, _gw) = w.device_ptr(&self.stream);
            let ta = tensor_map_u8(xp, m, k)?;
            let tb = tensor_map_u8(wp, n, k)?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&ta).arg(&tb).arg(x_scales).arg(w_scales);
            match y {
                Fp8OutSlice::F32(y) => b.arg(y),
                Fp8OutSlice::Bf16(y) => b.arg(y),
            };
            b.arg(&mi).arg(&ni).arg(&ki);
            // SAFETY: matches `fp8_block_gemm_sm90a_v2`/`_v3`/`_v4` (y fp32) and `_v4_bf16` (y bf16 bits; the match
            // above picks by y's type): two 128-byte tensor maps by value, then pointers and sizes; the caller
            // checked xq = [m, k], x_scales = [m, k/128], w = [n, k], w_scales = [ceil(n/128), k/128], y = [m, n] of
            // the kernel's element type, k % 128 == 0, k >= 128 and m * n tiles within the grid limit. The maps
            // describe exactly xq and w (TMA never reads outside them; rows past m or n are zero-filled), the scale
            // loads clamp rows to m - 1 and every store is guarded against m and n (the bf16 epilogue's 8-byte
            // stores only where n % 4 == 0, so they are aligned in the 256-byte-aligned allocation); the persistent
            // kernels visit tiles below ceil(m/128) * ceil(n/128) only, whatever the grid. xq and w outlive the
            // launch (borrowed for this call, the stream is ordered).
            unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        } else {
            let Fp8OutSlice::F32(y) = y else {
                return Err(KernelError::Cuda(format!("{name}: writes fp32 only")));
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
            // SAFETY: matches `fp8_block_gemm_sm90a_v1`; the caller checked the same lengths as for v2 and
            // k % 128 == 0, so every 16-byte cp.async lies wholly inside a row; rows past m or n are zero-filled
            // without reading (from row 0, a valid address) and every store is guarded against m and n.
            unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        }
        Ok(())
    }

    /// `nvfp4_gemm_sm90a_v1` (block-synchronous: all 256 threads load, decode, then issue wgmmas), `_v2`
    /// (warp-specialised: x by TMA, two producer warpgroups decoding the weights into the ring, two consumer
    /// warpgroups) or `_v3` (v2 with 256x128 tiles and a byte-permute decode) in cuda/gemm_sm90a.cu.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn nvfp4_gemm_sm90a(
        &self,
        variant: Nvfp4Wgmma,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        let (name, smem, threads) = nvfp4_wgmma_kernel(variant);
        let f = self.function(Module::GemmSm90a, name)?;
        f.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(cuda_err("nvfp4_gemm_sm90a shared memory size"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let blocks = match variant {
            // v3's tiles are 256 rows x 128 columns.
            Nvfp4Wgmma::PrmtDecode256 => (m.div_ceil(256) * n.div_ceil(128)) as u32,
            Nvfp4Wgmma::Synchronous | Nvfp4Wgmma::WarpSpecialized => tile_grid(m, n),
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        match variant {
            Nvfp4Wgmma::Synchronous => {
                let mut b = self.stream.launch_builder(&f);
                b.arg(x)
                    .arg(w)
                    .arg(scales)
                    .arg(&global_scale)
                    .arg(y)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki);
                // SAFETY: matches `nvfp4_gemm_sm90a_v1`; the caller checked x = [m, k], w = [n, k/2], scales =
                // [n, k/16], y = [m, n] and k % 64 == 0, so every 16-byte copy of x and w and 4-byte copy of the
                // scales is whole and aligned inside its row; rows past m or n are zero-filled without reading
                // and every store is guarded.
                unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
            }
            Nvfp4Wgmma::WarpSpecialized | Nvfp4Wgmma::PrmtDecode256 => {
                // The guard orders this raw-pointer use after any pending writes on other streams and keeps the
                // buffer's event until the launch is queued.
                let (xp, _gx) = x.device_ptr(&self.stream);
                let tx = tensor_map_u16(xp, m, k)?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(&tx)
                    .arg(w)
                    .arg(scales)
                    .arg(&global_scale)
                    .arg(y)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki);
                // SAFETY: matches `nvfp4_gemm_sm90a_v2` and `_v3` (a 128-byte tensor map by value, then
                // pointers, the scale and sizes; v3 reads x in two 128-row boxes per 256-row tile, the second
                // only where it holds a row below m); the caller checked x = [m, k], w = [n, k/2], scales =
                // [n, k/16], y = [m, n] and k % 64 == 0. The map describes exactly x (TMA never reads outside it; rows past m are
                // zero-filled); the weight and scale loads are 16- and 2-byte aligned inside rows below n (rows
                // past n read row 0) and every store is guarded against m and n; x outlives the launch
                // (borrowed for this call, the stream is ordered).
                unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
            }
        }
        Ok(())
    }
}

/// The kernel of an FP8 wgmma build (bf16 or f32 output), its dynamic shared memory and threads per block.
pub(in crate::cuda) fn fp8_wgmma_kernel(
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
pub(in crate::cuda) fn nvfp4_wgmma_kernel(variant: Nvfp4Wgmma) -> (&'static str, u32, u32) {
    match variant {
        Nvfp4Wgmma::Synchronous => ("nvfp4_gemm_sm90a_v1", NVFP4_V1_SMEM_BYTES, 256),
        Nvfp4Wgmma::WarpSpecialized => ("nvfp4_gemm_sm90a_v2", NVFP4_V2_SMEM_BYTES, 512),
        Nvfp4Wgmma::PrmtDecode256 => ("nvfp4_gemm_sm90a_v3", NVFP4_V3_SMEM_BYTES, 512),
    }
}

#[cfg(test)]
mod tests {
    //! The constants above against `cuda/gemm_sm90a.cu`'s static_assert literals and the bench's copies
    //! (`super::super::source_literal` says why).
    use super::super::source_literal;
    use super::*;

    const CU: &str = include_str!("../../../cuda/gemm_sm90a.cu");
    const BENCH: &str = include_str!("../../../bench/h200/bench_gemm_sm90a.py");

    #[test]
    fn launch_constants_match_the_kernel_file_and_the_bench() {
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
