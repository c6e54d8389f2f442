//! Launches of `cuda/attention_prefill.cu`: causal prefill attention, GQA-packed, optional sliding window, over a
//! batch of sequences (cu_seqlens). The safe wrappers in `super::super::attention_prefill` have checked every size.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{cuda_err, Device, Module};
use crate::cuda::attention_prefill::PrefillKernel;
use crate::KernelError;

impl Device {
    /// One launch of `kernel` over `seqs` sequences: grid (query tiles of the longest sequence, KV heads,
    /// sequences), one warp per `16 * warp_tiles` packed rows. `cu_seqlens = None` is one sequence of `total` tokens (a null pointer).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_prefill(
        &self,
        kernel: &PrefillKernel,
        q: &CudaSlice<u16>,
        k: &CudaSlice<u16>,
        v: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        cu_seqlens: Option<&CudaSlice<u32>>,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
        q_heads: usize,
        kv_heads: usize,
        window: usize,
        scale_log2: f32,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::AttentionPrefill, kernel.name)?;
        let smem = kernel.smem_bytes();
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(cuda_err("attention_prefill shared memory size"))?;
        let group = q_heads / kv_heads;
        let cfg = LaunchConfig {
            grid_dim: (
                (max_seqlen * group).div_ceil(kernel.block_m) as u32,
                kv_heads as u32,
                seqs as u32,
            ),
            block_dim: (kernel.threads() as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (ti, mi, hq, hkv, wi) = (
            total as i32,
            max_seqlen as i32,
            q_heads as i32,
            kv_heads as i32,
            window as i32,
        );
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&f);
        b.arg(q).arg(k).arg(v).arg(out);
        match cu_seqlens {
            Some(cu) => b.arg(cu),
            None => b.arg(&null),
        };
        b.arg(&ti)
            .arg(&mi)
            .arg(&hq)
            .arg(&hkv)
            .arg(&wi)
            .arg(&scale_log2);
        // SAFETY: matches `attention_prefill_D*_M*_W*_N*_S*` in cuda/attention_prefill.cu (four bf16 pointers, the
        // cu_seqlens pointer or null, five ints, one float); the caller checked q/out = [total, q_heads, D],
        // k/v = [total, kv_heads, D], cu_seqlens = [seqs + 1] when given, q_heads % kv_heads == 0, D = the
        // kernel's head dim, every count within i32 and the grid within CUDA's limits. The kernel clamps every
        // cu_seqlens entry to [0, total] and each length to max_seqlen, and zero-fills (does not read) rows past a
        // sequence's end, so device-side offsets cannot send it outside the buffers; the dynamic shared memory is
        // `AP_SMEM` of the instantiation, allowed just above.
        unsafe { b.launch(cfg) }.map_err(cuda_err(kernel.name))?;
        Ok(())
    }
}
