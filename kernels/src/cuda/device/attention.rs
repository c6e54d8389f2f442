//! Launches of `cuda/attention.cu`: paged decode attention, split over the context.

use super::*;

impl Device {
    /// Splits that fill exactly one wave of `per_sm` resident blocks per multiprocessor (CUDA cores: four, by
    /// their 48 KiB of pipeline stages; tensor cores: five, by 41 KiB of shared memory and 96 registers at
    /// head_dim 256), with at least 64 tokens (four pipeline stages) per split. A second, partial wave cost an
    /// earlier tensor-core version 1.35x at 32k context.
    fn auto_splits(&self, d: &PagedAttentionDims, per_sm: usize) -> usize {
        let blocks = d.seqs * d.kv_heads;
        let want = (per_sm * self.sm_count).div_ceil(blocks.max(1));
        let most = (d.max_pages_per_seq * d.page_size).div_ceil(64);
        want.min(most).clamp(1, 1024)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_decode_paged(
        &self,
        tensor: bool,
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
            self.auto_splits(d, if tensor { 5 } else { 4 })
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
        let split_name = if tensor {
            match d.head_dim {
                64 => "attention_decode_tc_D64",
                128 => "attention_decode_tc_D128",
                _ => "attention_decode_tc_D256",
            }
        } else {
            split_name
        };
        let f = self.function(Module::Attention, split_name)?;
        let ws_len = d.seqs * d.q_heads * splits * (d.head_dim + 2);
        let mut ws_guard = self.attention_ws.lock().map_err(|_| poisoned())?;
        if ws_guard.as_ref().is_none_or(|w| w.len() < ws_len) {
            *ws_guard = Some(
                self.stream
                    .alloc_zeros::<f32>(ws_len.max(1))
                    .map_err(cuda_err("attention workspace"))?,
            );
        }
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
        // CUDA cores: one warp per two query heads (per head when the group size is odd), as cuda/attention.cu's
        // AttGeom; tensor cores: four warps, each a quarter of the head dim.
        let warps = if tensor {
            4
        } else if r.is_multiple_of(2) {
            r / 2
        } else {
            r
        };
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
        // SAFETY: matches `attention_decode_split_D*_R*` and `attention_decode_tc_D*` in cuda/attention.cu; the caller checked every buffer
        // against dims; the kernel clamps each length to max_pages * page_size and skips page ids >= num_pages, so
        // device-side table contents cannot send it outside the cache; the workspace holds
        // seqs * q_heads * splits * (head_dim + 2) floats.
        unsafe { b.launch(cfg) }.map_err(cuda_err(split_name))?;
        if splits > 1 {
            let combine = match d.head_dim {
                64 => "attention_decode_combine_D64",
                128 => "attention_decode_combine_D128",
                _ => "attention_decode_combine_D256",
            };
            let f = self.function(Module::Attention, combine)?;
            let s = splits as i32;
            let cfg = LaunchConfig {
                grid_dim: (d.q_heads as u32, d.seqs as u32, 1),
                // head_dim x 4 threads: the 4 rows split the splits (cuda/attention.cu, COMB_Y).
                block_dim: (d.head_dim as u32, 4, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&f);
            b.arg(&*ws).arg(out).arg(&hq).arg(&s);
            // SAFETY: matches `attention_decode_combine_D*`; the split kernel queued before it on the same stream
            // filled seqs * q_heads * splits partials of head_dim + 2 floats, and out is [seqs, q_heads, head_dim].
            unsafe { b.launch(cfg) }.map_err(cuda_err(combine))?;
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
