//! Launches of `cuda/attention.cu`: paged decode attention, split over the context.

use super::*;
use crate::cuda::attention::tiled_smem;

impl Device {
    /// Multiprocessors of the device.
    pub(in crate::cuda) fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Splits of the CUDA-core kernel that fill exactly one wave of four resident blocks per multiprocessor (by
    /// their 48 KiB of pipeline stages), with at least 64 tokens (four pipeline stages) per split.
    fn auto_splits(&self, d: &PagedAttentionDims) -> usize {
        let blocks = d.seqs * d.kv_heads;
        let want = (4 * self.sm_count).div_ceil(blocks.max(1));
        let most = (d.max_pages_per_seq * d.page_size).div_ceil(64);
        want.min(most).clamp(1, 1024)
    }

    /// The CUDA-core kernel `attention_decode_split_D*_R*` (KernelPath::CudaCores).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_decode_paged(
        &self,
        d: &PagedAttentionDims,
        q: &CudaSlice<f32>,
        k_cache: &CudaSlice<u16>,
        v_cache: &CudaSlice<u16>,
        block_table: &CudaSlice<u32>,
        seq_lens: &CudaSlice<u32>,
        scale: f32,
        splits: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let splits = if splits == 0 {
            self.auto_splits(d)
        } else {
            splits
        };
        let r = d.q_heads / d.kv_heads;
        let split_name = attention_split_name(d.head_dim, r).ok_or_else(|| {
            KernelError::shape(
                "cuda::attention_decode_paged",
                format!("q_heads / kv_heads must be 1, 2, 4, 6 or 8, got {r}"),
            )
        })?;
        let f = self.function(Module::Attention, split_name)?;
        let mut ws_guard =
            self.attention_workspace(d.seqs * d.q_heads * splits * (d.head_dim + 2))?;
        let Some(ws) = ws_guard.as_mut() else {
            return Err(KernelError::Cuda(
                "attention workspace was not allocated".into(),
            ));
        };
        let (hq, hkv, ps, np, mp) = (
            d.q_heads as i32,
            d.kv_heads as i32,
            d.page_size as i32,
            d.num_pages as i32,
            d.max_pages_per_seq as i32,
        );
        // One warp per two query heads (per head when the group size is odd), as cuda/attention.cu's AttGeom.
        let warps = if r.is_multiple_of(2) { r / 2 } else { r };
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, d.kv_heads as u32, d.seqs as u32),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_table)
            .arg(seq_lens)
            .arg(&scale)
            .arg(&mut *out)
            .arg(&mut *ws);
        b.arg(&hq).arg(&hkv).arg(&ps).arg(&np).arg(&mp);
        // SAFETY: matches `attention_decode_split_D*_R*` in cuda/attention.cu; the caller checked every buffer
        // against dims; the kernel clamps each length to max_pages * page_size and skips page ids >= num_pages, so
        // device-side table contents cannot send it outside the cache; the workspace holds
        // seqs * q_heads * splits * (head_dim + 2) floats.
        unsafe { b.launch(cfg) }.map_err(cuda_err(split_name))?;
        if splits > 1 {
            // The CUDA-core path is the accuracy arm: it keeps the block combine, the one the H200 ran it with
            //; the tiled paths use Gpu::DECODE_AUTO_SLICED_COMBINE.
            self.attention_combine(false, d.head_dim, d.q_heads, d.seqs, splits, ws, out)?;
        }
        Ok(())
    }
}

fn attention_split_name(head_dim: usize, r: usize) -> Option<&'static str> {
    Some(match (head_dim, r) {
        (64, 1) => "attention_decode_split_D64_R1",
        (64, 2) => "attention_decode_split_D64_R2",
        (64, 4) => "attention_decode_split_D64_R4",
        (64, 6) => "attention_decode_split_D64_R6",
        (64, 8) => "attention_decode_split_D64_R8",
        (128, 1) => "attention_decode_split_D128_R1",
        (128, 2) => "attention_decode_split_D128_R2",
        (128, 4) => "attention_decode_split_D128_R4",
        (128, 6) => "attention_decode_split_D128_R6",
        (128, 8) => "attention_decode_split_D128_R8",
        (256, 1) => "attention_decode_split_D256_R1",
        (256, 2) => "attention_decode_split_D256_R2",
        (256, 4) => "attention_decode_split_D256_R4",
        (256, 6) => "attention_decode_split_D256_R6",
        (256, 8) => "attention_decode_split_D256_R8",
        _ => return None,
    })
}

pub(in crate::cuda) fn tiled_name(ring: bool, head_dim: usize, tiling: usize) -> &'static str {
    const PAGED: [[&str; 3]; 3] = [
        [
            "attention_decode_tiled_D64_T32_S3",
            "attention_decode_tiled_D64_T16_S4",
            "attention_decode_tiled_D64_T32_S2",
        ],
        [
            "attention_decode_tiled_D128_T32_S3",
            "attention_decode_tiled_D128_T16_S4",
            "attention_decode_tiled_D128_T32_S2",
        ],
        [
            "attention_decode_tiled_D256_T32_S3",
            "attention_decode_tiled_D256_T16_S4",
            "attention_decode_tiled_D256_T32_S2",
        ],
    ];
    const RING: [[&str; 3]; 3] = [
        [
            "attention_decode_ring_D64_T32_S3",
            "attention_decode_ring_D64_T16_S4",
            "attention_decode_ring_D64_T32_S2",
        ],
        [
            "attention_decode_ring_D128_T32_S3",
            "attention_decode_ring_D128_T16_S4",
            "attention_decode_ring_D128_T32_S2",
        ],
        [
            "attention_decode_ring_D256_T32_S3",
            "attention_decode_ring_D256_T16_S4",
            "attention_decode_ring_D256_T32_S2",
        ],
    ];
    let di = match head_dim {
        64 => 0,
        128 => 1,
        _ => 2,
    };
    if ring {
        RING[di][tiling]
    } else {
        PAGED[di][tiling]
    }
}

pub(in crate::cuda) fn combine_name(sliced: bool, head_dim: usize) -> &'static str {
    match (sliced, head_dim) {
        (false, 64) => "attention_decode_combine_D64",
        (false, 128) => "attention_decode_combine_D128",
        (false, _) => "attention_decode_combine_D256",
        (true, 64) => "attention_decode_combine_sliced_D64",
        (true, 128) => "attention_decode_combine_sliced_D128",
        (true, _) => "attention_decode_combine_sliced_D256",
    }
}

/// Warps per block of `attention_decode_combine_sliced_D*` for `splits` partials: one per 4 splits, 1 to 16
/// (cuda/attention.cu `COMB_MAX_WARPS`), so a warp has at most 4 of them in one chunk of loads up to 64 splits.
pub(crate) fn sliced_combine_warps(splits: usize) -> usize {
    splits.div_ceil(4).clamp(1, 16)
}

impl Device {
    /// Splits for the tiled kernels when the caller passes 0: `Gpu::decode_auto_splits` on this device.
    fn tiled_splits(
        &self,
        pairs: usize,
        head_dim: usize,
        tiling: usize,
        max_tokens: usize,
    ) -> usize {
        crate::cuda::Gpu::decode_auto_splits(
            crate::cuda::Gpu::DECODE_TILINGS[tiling],
            head_dim,
            self.sm_count,
            pairs,
            max_tokens,
        )
    }

    /// The split kernel's partials workspace, grown to `len` floats.
    fn attention_workspace(
        &self,
        len: usize,
    ) -> Result<std::sync::MutexGuard<'_, Option<CudaSlice<f32>>>, KernelError> {
        let mut ws_guard = self.attention_ws.lock().map_err(|_| poisoned())?;
        if ws_guard.as_ref().is_none_or(|w| w.len() < len) {
            *ws_guard = Some(
                self.stream
                    .alloc_zeros::<f32>(len.max(1))
                    .map_err(cuda_err("attention workspace"))?,
            );
        }
        Ok(ws_guard)
    }

    /// `attention_decode_combine_D*` (`sliced`: `attention_decode_combine_sliced_D*`) over `splits` partials per
    /// (sequence, query head).
    #[allow(clippy::too_many_arguments)]
    fn attention_combine(
        &self,
        sliced: bool,
        head_dim: usize,
        q_heads: usize,
        seqs: usize,
        splits: usize,
        ws: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let name = combine_name(sliced, head_dim);
        let f = self.function(Module::Attention, name)?;
        let (hq, s) = (q_heads as i32, splits as i32);
        let cfg = if sliced {
            // One block per 64 columns of each (sequence, query head), sliced_combine_warps(splits) warps.
            LaunchConfig {
                grid_dim: ((q_heads * head_dim / 64) as u32, seqs as u32, 1),
                block_dim: (32, sliced_combine_warps(splits) as u32, 1),
                shared_mem_bytes: 0,
            }
        } else {
            LaunchConfig {
                grid_dim: (q_heads as u32, seqs as u32, 1),
                block_dim: (head_dim as u32, 4, 1),
                shared_mem_bytes: 0,
            }
        };
        // Launched as the split kernel's programmatic dependent (Device::launch_pdl): its blocks get resident
        // while the split kernel runs and wait in pdl_wait for the partials (39.18 vs 39.67 us at 32k,
        // 6.89 vs 7.56 us on a 1024-token ring). Launching the split kernels so too lost (43.1 us at 32k: their
        // blocks, resident early beside the previous combine's, no longer spread two per SM).
        // The guards order the raw addresses after pending writes on other streams and record this use.
        let (wsp, _gws) = ws.device_ptr(&self.stream);
        let (outp, _gout) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(wsp).ptr(outp).i32(hq).i32(s);
        // SAFETY: matches `attention_decode_combine{,_sliced}_D*(const float* ws, float* out, int hq, int splits)`
        // with the block shape each expects (the sliced one at most 16 warps, its shared arrays' size; head_dim a
        // multiple of 64); the split kernel queued before it on the same stream fills seqs * q_heads * splits
        // partials of head_dim + 2 floats (splits <= 1024, checked by the callers), which the combine reads only
        // after its pdl_wait, as it writes out ([seqs, q_heads, head_dim]); the values live across the call.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }

    /// The tiled kernel `name` with its dynamic shared memory allowed (over the 48 KiB default).
    fn tiled_function(
        &self,
        name: &'static str,
        smem: usize,
    ) -> Result<cudarc::driver::CudaFunction, KernelError> {
        let f = self.function(Module::Attention, name)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(cuda_err(name))?;
        Ok(f)
    }

    /// The tiled paged kernel `attention_decode_tiled_*`, then with more than one split the combine kernel
    /// (`sliced`: `attention_decode_combine_sliced_D*`, else `attention_decode_combine_D*`).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_decode_paged_tiled(
        &self,
        tiling: usize,
        sliced: bool,
        d: &PagedAttentionDims,
        q: &CudaSlice<f32>,
        k_cache: &CudaSlice<u16>,
        v_cache: &CudaSlice<u16>,
        block_table: &CudaSlice<u32>,
        seq_lens: &CudaSlice<u32>,
        scale: f32,
        splits: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let splits = if splits == 0 {
            self.tiled_splits(
                d.seqs * d.kv_heads,
                d.head_dim,
                tiling,
                d.max_pages_per_seq * d.page_size,
            )
        } else {
            splits
        };
        let (tile, stages) = crate::cuda::Gpu::DECODE_TILINGS[tiling];
        let smem = tiled_smem(d.head_dim, tile, stages);
        let name = tiled_name(false, d.head_dim, tiling);
        let f = self.tiled_function(name, smem)?;
        let mut ws_guard =
            self.attention_workspace(d.seqs * d.q_heads * splits * (d.head_dim + 2))?;
        let Some(ws) = ws_guard.as_mut() else {
            return Err(KernelError::Cuda(
                "attention workspace was not allocated".into(),
            ));
        };
        let (hq, hkv, ps, np, mp) = (
            d.q_heads as i32,
            d.kv_heads as i32,
            d.page_size as i32,
            d.num_pages as i32,
            d.max_pages_per_seq as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, d.kv_heads as u32, d.seqs as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_table)
            .arg(seq_lens)
            .arg(&scale)
            .arg(&mut *out)
            .arg(&mut *ws);
        b.arg(&hq).arg(&hkv).arg(&ps).arg(&np).arg(&mp);
        // SAFETY: matches `attention_decode_tiled_D*_T*_S*` in cuda/attention.cu with 4 warps and its TiledGeom
        // shared memory; the caller checked every buffer against dims and that rows and the table fit the
        // kernel's 32-bit indices; the kernel clamps each length to max_pages * page_size and skips page ids >=
        // num_pages; the workspace holds seqs * q_heads * splits * (head_dim + 2) floats.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        if splits > 1 {
            self.attention_combine(sliced, d.head_dim, d.q_heads, d.seqs, splits, ws, out)?;
        }
        Ok(())
    }

    /// The ring kernel `attention_decode_ring_*`, then the combine as [`Device::attention_decode_paged_tiled`].
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_decode_ring(
        &self,
        tiling: usize,
        sliced: bool,
        d: &crate::shapes::AttnDims,
        seqs: usize,
        slots: usize,
        q: &CudaSlice<f32>,
        k_ring: &CudaSlice<u16>,
        v_ring: &CudaSlice<u16>,
        k_cur: &CudaSlice<u16>,
        v_cur: &CudaSlice<u16>,
        pos: &CudaSlice<u32>,
        scale: f32,
        splits: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let splits = if splits == 0 {
            self.tiled_splits(seqs * d.kv_heads, d.head_dim, tiling, slots + 1)
        } else {
            splits
        };
        let (tile, stages) = crate::cuda::Gpu::DECODE_TILINGS[tiling];
        let smem = tiled_smem(d.head_dim, tile, stages);
        let name = tiled_name(true, d.head_dim, tiling);
        let f = self.tiled_function(name, smem)?;
        let mut ws_guard =
            self.attention_workspace(seqs * d.q_heads * splits * (d.head_dim + 2))?;
        let Some(ws) = ws_guard.as_mut() else {
            return Err(KernelError::Cuda(
                "attention workspace was not allocated".into(),
            ));
        };
        let (hq, hkv, sl) = (d.q_heads as i32, d.kv_heads as i32, slots as i32);
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, d.kv_heads as u32, seqs as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q)
            .arg(k_ring)
            .arg(v_ring)
            .arg(k_cur)
            .arg(v_cur)
            .arg(pos)
            .arg(&scale)
            .arg(&mut *out)
            .arg(&mut *ws);
        b.arg(&hq).arg(&hkv).arg(&sl);
        // SAFETY: matches `attention_decode_ring_D*_T*_S*` in cuda/attention.cu with 4 warps and its TiledGeom
        // shared memory; the caller checked the ring ([seqs, kv_heads, slots, head_dim]), the current rows, pos and
        // out, and that ring rows fit 32 bits; the kernel reads min(pos, slots) slots per (sequence, KV head); the
        // workspace holds seqs * q_heads * splits * (head_dim + 2) floats.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        if splits > 1 {
            self.attention_combine(sliced, d.head_dim, d.q_heads, seqs, splits, ws, out)?;
        }
        Ok(())
    }
}
