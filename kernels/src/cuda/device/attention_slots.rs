//! Launches of `cuda/attention_slots.cu`: the K/V store and the f32 attention over per-slot caches. The safe
//! wrappers in `cuda/attention_slots.rs` have checked every length before anything here runs.

use super::*;
use crate::shapes::AttnDims;

/// Threads of the store and attention blocks (`STORE_THREADS`, `ATTN_THREADS` in cuda/attention_slots.cu).
const STORE_THREADS: u32 = 256;
const ATTN_THREADS: u32 = 256;

impl Device {
    /// `kv_store_slots_f32`: one block per token.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn kv_store_slots(
        &self,
        k_new: &CudaSlice<f32>,
        v_new: &CudaSlice<f32>,
        slots: &CudaSlice<u32>,
        pos: &CudaSlice<u32>,
        cache_k: &mut CudaSlice<f32>,
        cache_v: &mut CudaSlice<f32>,
        num_slots: usize,
        max_len: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "kv_store_slots_f32";
        let f = self.function(Module::AttentionSlots, NAME)?;
        let t = slots.len();
        let (ns, ml, w) = (num_slots as u64, max_len as u64, width as i32);
        let cfg = LaunchConfig {
            grid_dim: (t as u32, 1, 1),
            block_dim: (STORE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(k_new)
            .arg(v_new)
            .arg(slots)
            .arg(pos)
            .arg(cache_k)
            .arg(cache_v)
            .arg(&ns)
            .arg(&ml)
            .arg(&w);
        // SAFETY: matches `kv_store_slots_f32(k_new, v_new, slots, pos, cache_k, cache_v, num_slots, max_len,
        // width)` in cuda/attention_slots.cu; the caller checked k_new, v_new = [t, width], slots, pos = [t] with
        // 1 <= t <= i32::MAX (one block each), 1 <= width <= i32::MAX, and cache_k, cache_v = [num_slots, max_len,
        // width]; the kernel writes only where slot < num_slots and pos < max_len.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `attention_slots_f32_e{1,2,4,8}` (the fewest values per lane that hold head_dim): one block per
    /// (token, query head).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn attention_slots(
        &self,
        dims: &AttnDims,
        scale: f32,
        window: usize,
        q: &CudaSlice<f32>,
        cache_k: &CudaSlice<f32>,
        cache_v: &CudaSlice<f32>,
        num_slots: usize,
        max_len: usize,
        slots: &CudaSlice<u32>,
        pos: &CudaSlice<u32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        const NAMES: [&str; 4] = [
            "attention_slots_f32_e1",
            "attention_slots_f32_e2",
            "attention_slots_f32_e4",
            "attention_slots_f32_e8",
        ];
        let epl = dims.head_dim.div_ceil(32).next_power_of_two();
        let name = NAMES[epl.trailing_zeros() as usize];
        let f = self.function(Module::AttentionSlots, name)?;
        let t = slots.len();
        let (ns, ml, win) = (num_slots as u64, max_len as u64, window as u64);
        let (hq, hkv, d) = (
            dims.q_heads as i32,
            dims.kv_heads as i32,
            dims.head_dim as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: ((t * dims.q_heads) as u32, 1, 1),
            block_dim: (ATTN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q)
            .arg(cache_k)
            .arg(cache_v)
            .arg(slots)
            .arg(pos)
            .arg(out)
            .arg(&ns)
            .arg(&ml)
            .arg(&win)
            .arg(&hq)
            .arg(&hkv)
            .arg(&d)
            .arg(&scale);
        // SAFETY: matches `attention_slots_f32_e*(q, cache_k, cache_v, slots, pos, out, num_slots, max_len, window,
        // q_heads, kv_heads, head_dim, scale)` in cuda/attention_slots.cu; the caller checked dims (q_heads a
        // multiple of kv_heads, all positive), 1 <= head_dim <= 256 so head_dim <= 32 * EPL of the kernel picked
        // here, q and out = [t, q_heads, head_dim], slots and pos = [t] with 1 <= t * q_heads <= i32::MAX (the
        // grid), and the caches = [num_slots, max_len, kv_heads * head_dim]; the kernel reads K/V rows only at
        // positions lo..=pos < max_len of a slot < num_slots (others get zeros).
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::source_literal;

    /// The launch constants restated here are those cuda/attention_slots.cu pins.
    #[test]
    fn launch_constants_match_the_kernel_source() {
        let src = include_str!("../../../cuda/attention_slots.cu");
        assert_eq!(
            source_literal(src, "constexpr int STORE_THREADS", " = ") as u32,
            super::STORE_THREADS
        );
        assert_eq!(
            source_literal(src, "constexpr int ATTN_THREADS", " = ") as u32,
            super::ATTN_THREADS
        );
        assert_eq!(
            source_literal(src, "ATTN_MAX_HEAD_DIM", " == ") as usize,
            crate::cuda::Gpu::ATTENTION_SLOTS_MAX_HEAD_DIM
        );
    }
}
