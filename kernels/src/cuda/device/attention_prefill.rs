//! Launches of `cuda/attention_prefill.cu`: causal prefill attention, GQA-packed, optional sliding window, over a
//! batch of sequences (cu_seqlens), optionally continuing a paged or ring KV cache (prefix mode), and the store of
//! new K/V rows into those caches. The safe wrappers in `super::super::attention_prefill` have checked every size.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{cuda_err, Device, Module};
use crate::cuda::attention_prefill::{PrefillBatch, PrefillKernel, PrefixCache};
use crate::KernelError;

impl Device {
    /// One launch of `kernel` over the batch: grid (query tiles of the longest sequence, KV heads, sequences),
    /// one warp per `16 * warp_tiles` packed rows. With `prefix = Some((k_cache, v_cache, cache))` the
    /// prefix-mode kernel of the same tiling runs.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_prefill(
        &self,
        kernel: &PrefillKernel,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        batch: &PrefillBatch<'_>,
        q_heads: usize,
        kv_heads: usize,
        window: usize,
        scale_log2: f32,
        prefix: Option<(&CudaSlice<u16>, &CudaSlice<u16>, &PrefixCache<'_>)>,
    ) -> Result<(), KernelError> {
        let name = if prefix.is_some() {
            kernel.paged_name
        } else {
            kernel.name
        };
        let f = self.function(Module::AttentionPrefill, name)?;
        let smem = kernel.smem_bytes();
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(cuda_err("attention_prefill shared memory size"))?;
        let group = q_heads / kv_heads;
        let cfg = LaunchConfig {
            grid_dim: (
                (batch.max_seqlen * group).div_ceil(kernel.block_m) as u32,
                kv_heads as u32,
                batch.seqs as u32,
            ),
            block_dim: (kernel.threads() as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (ti, mi, hq, hkv, wi) = (
            batch.total as i32,
            batch.max_seqlen as i32,
            q_heads as i32,
            kv_heads as i32,
            window as i32,
        );
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&f);
        b.arg(q).arg(k).arg(v).arg(out);
        match batch.cu_seqlens {
            Some(cu) => b.arg(cu),
            None => b.arg(&null),
        };
        b.arg(&ti)
            .arg(&mi)
            .arg(&hq)
            .arg(&hkv)
            .arg(&wi)
            .arg(&scale_log2);
        let (ps, mp, np) = prefix.as_ref().map_or((0, 0, 0), |(_, _, c)| {
            (c.page_size as i32, c.max_pages as i32, c.num_pages as i32)
        });
        if let Some((kc, vc, cache)) = &prefix {
            b.arg(*kc).arg(*vc);
            match cache.block_table {
                Some(t) => b.arg(t),
                None => b.arg(&null),
            };
            b.arg(cache.prefix_lens).arg(&ps).arg(&mp).arg(&np);
        }
        // SAFETY: matches `attention_prefill_D*_M*_W*_N*_S*` in cuda/attention_prefill.cu (four bf16 pointers, the
        // cu_seqlens pointer or null, five ints, one float), and with a prefix `attention_prefill_paged_*` (the
        // same, then the two cache pointers, the block table or null, prefix_lens, three ints); the caller
        // checked q/out = [total, q_heads, D], k/v = [total, kv_heads, D], cu_seqlens = [seqs + 1] when given,
        // q_heads % kv_heads == 0, D = the kernel's head dim, the caches = [num_pages, kv_heads, page_size, D]
        // with block_table = [seqs, max_pages] (or the ring [seqs, kv_heads, page_size, D]), prefix_lens =
        // [seqs], every count within i32 and the grid within CUDA's limits. The kernel clamps every cu_seqlens
        // entry to [0, total], each length to max_seqlen and each prefix to max_pages * page_size (ring: 2^30),
        // skips page ids >= num_pages, and zero-fills (does not read) keys outside [window edge, prefix + len),
        // so device-side tables cannot send it outside the buffers; the dynamic shared memory is `AP_SMEM` of
        // the instantiation, allowed just above.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    /// `attention_kv_store`: copies the new tokens' K/V rows (`[total, kv_heads, head_dim]`) into a paged cache or
    /// a ring after each sequence's prefix; grid (ceil(max_seqlen * kv_heads * head_dim / 8 / 256), seqs).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_kv_store(
        &self,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        k_cache: &mut CudaSlice<u16>,
        v_cache: &mut CudaSlice<u16>,
        batch: &PrefillBatch<'_>,
        cache: &PrefixCache<'_>,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "attention_kv_store";
        let f = self.function(Module::AttentionPrefill, NAME)?;
        let chunks = head_dim / 8;
        let cfg = LaunchConfig {
            grid_dim: (
                (batch.max_seqlen * kv_heads * chunks).div_ceil(256) as u32,
                batch.seqs as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let ints = [
            batch.total as i32,
            batch.max_seqlen as i32,
            kv_heads as i32,
            chunks as i32,
            cache.page_size as i32,
            cache.max_pages as i32,
            cache.num_pages as i32,
        ];
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&f);
        b.arg(k).arg(v).arg(k_cache).arg(v_cache);
        match batch.cu_seqlens {
            Some(cu) => b.arg(cu),
            None => b.arg(&null),
        };
        b.arg(cache.prefix_lens);
        match cache.block_table {
            Some(t) => b.arg(t),
            None => b.arg(&null),
        };
        for x in &ints {
            b.arg(x);
        }
        // SAFETY: matches `attention_kv_store` in cuda/attention_prefill.cu (two const and two mutable bf16
        // pointers, cu_seqlens or null, prefix_lens, the block table or null, seven ints); the caller checked
        // k/v = [total, kv_heads, head_dim] with head_dim a multiple of 8, the caches = [num_pages, kv_heads,
        // page_size, head_dim] with block_table = [seqs, max_pages] (or the ring [seqs, kv_heads, page_size,
        // head_dim]), prefix_lens = [seqs], cu_seqlens = [seqs + 1], every count within i32 and the grid within
        // CUDA's limits. The kernel clamps offsets, lengths and prefixes, and skips positions past the block table
        // and page ids >= num_pages, so it writes only inside the caches; 16-byte accesses are aligned (row
        // offsets are multiples of 8 elements of buffers the driver aligns to 256 bytes).
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }
}
