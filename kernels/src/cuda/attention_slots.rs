//! Attention over f32 KV caches of one contiguous block per slot (`cuda/attention_slots.cu`): the exact path of the
//! engine's CUDA forward pass, f32 throughout (no bf16 rounding of the query, the keys or the probabilities), so it
//! agrees with [`crate::reference::attention::decode_dense`] up to the order of the sums.
//!
//! Layout: `cache_k` / `cache_v` are f32 `[slots, max_len, kv_heads * head_dim]`, slot `s` owning the block
//! `[s, 0..max_len, :]`; token `i` of a call lives at `(slots[i], pos[i])` (u32 buffers on the device). Store a
//! step's new keys and values with [`Gpu::kv_store_slots`], then attend with [`Gpu::attention_slots`]; a prefill
//! chunk and a decode batch are the same call (each token attends to its slot's positions up to its own).
//!
//! **Device-side values.** The host checks every length; it cannot check the slot and position values without a
//! round trip, so the kernels never follow one out of range: the store skips such a token, the attention writes a
//! row of zeros for it.

#[cfg(feature = "cuda")]
use super::device::{launch_config, Module, PdlArgs};
use super::{check_len, check_len_of, Gpu, GpuBuffer};
use crate::shapes::AttnDims;
use crate::KernelError;

const I32_MAX: usize = i32::MAX as usize;

/// Threads of the store and attention blocks (`STORE_THREADS`, `ATTN_THREADS` in cuda/attention_slots.cu).
#[cfg(feature = "cuda")]
pub(super) const STORE_THREADS: u32 = 256;
#[cfg(feature = "cuda")]
pub(super) const ATTN_THREADS: u32 = 256;

/// Checks the two caches against `dims` and `max_len` and returns the slot count.
fn check_caches(
    op: &'static str,
    dims: &AttnDims,
    cache_k: usize,
    cache_v: usize,
    max_len: usize,
) -> Result<usize, KernelError> {
    dims.validate(op)?;
    let width = dims.kv_heads.checked_mul(dims.head_dim);
    crate::ensure_shape!(
        width.is_some_and(|w| w <= I32_MAX),
        op,
        "kv_heads x head_dim = {} x {} must fit the kernels' 32-bit row length",
        dims.kv_heads,
        dims.head_dim
    );
    crate::ensure_shape!(max_len > 0, op, "max_len must be positive");
    let block = crate::error::checked_product(
        op,
        "max_len*kv_heads*head_dim",
        &[max_len, dims.kv_heads, dims.head_dim],
    )?;
    crate::ensure_shape!(
        cache_k > 0 && cache_k.is_multiple_of(block),
        op,
        "cache_k has {cache_k} elements, not a positive whole number of slots of max_len x kv_heads x head_dim = \
         {block}"
    );
    check_len(op, "cache_v", cache_v, cache_k)?;
    Ok(cache_k / block)
}

/// Checks the per-token index buffers and returns the token count.
fn check_tokens(op: &'static str, slots: usize, pos: usize) -> Result<usize, KernelError> {
    check_len(op, "pos", pos, slots)?;
    crate::ensure_shape!(
        slots <= I32_MAX,
        op,
        "{slots} tokens: at most i32::MAX (one block per token)"
    );
    Ok(slots)
}

impl Gpu {
    /// Largest `head_dim` of [`Gpu::attention_slots`] (eight values per lane of a warp).
    pub const ATTENTION_SLOTS_MAX_HEAD_DIM: usize = 256;

    /// Stores token `i`'s key and value rows (`k_new`, `v_new`: f32 `[t, kv_heads*head_dim]`) at
    /// `(slots[i], pos[i])` of `cache_k` / `cache_v` (f32 `[slots, max_len, kv_heads*head_dim]`);
    /// `t = slots.len() = pos.len()`. Device-side indices out of range (`slot >=` the caches' slots,
    /// `pos >= max_len`) are skipped, never written; of two tokens with the same `(slot, pos)` one is kept. One
    /// block per token.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store_slots(
        &self,
        dims: &AttnDims,
        k_new: &GpuBuffer<f32>,
        v_new: &GpuBuffer<f32>,
        slots: &GpuBuffer<u32>,
        pos: &GpuBuffer<u32>,
        cache_k: &mut GpuBuffer<f32>,
        cache_v: &mut GpuBuffer<f32>,
        max_len: usize,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::kv_store_slots";
        let num_slots = check_caches(OP, dims, cache_k.len(), cache_v.len(), max_len)?;
        let t = check_tokens(OP, slots.len(), pos.len())?;
        check_len_of(OP, "k_new", k_new.len(), &[t, dims.kv_heads, dims.head_dim])?;
        check_len_of(OP, "v_new", v_new.len(), &[t, dims.kv_heads, dims.head_dim])?;
        #[cfg(feature = "cuda")]
        {
            if t == 0 {
                return Ok(());
            }
            // `kv_store_slots_f32`: one block per token.
            const NAME: &str = "kv_store_slots_f32";
            let f = self.inner.function(Module::AttentionSlots, NAME)?;
            let width = dims.kv_heads * dims.head_dim;
            let (ns, ml, w) = (num_slots as u64, max_len as u64, width as i32);
            let cfg = launch_config((t as u32, 1, 1), (STORE_THREADS, 1, 1), 0);
            let dev = &self.inner;
            let (kp, _g0) = dev.addr(&k_new.slice);
            let (vp, _g1) = dev.addr(&v_new.slice);
            let (sp, _g2) = dev.addr(&slots.slice);
            let (pp, _g3) = dev.addr(&pos.slice);
            let (ckp, _g4) = dev.addr_mut(&mut cache_k.slice);
            let (cvp, _g5) = dev.addr_mut(&mut cache_v.slice);
            let mut args = PdlArgs::default();
            args.ptr(kp)
                .ptr(vp)
                .ptr(sp)
                .ptr(pp)
                .ptr(ckp)
                .ptr(cvp)
                .u64(ns)
                .u64(ml)
                .i32(w);
            // SAFETY: matches `kv_store_slots_f32(k_new, v_new, slots, pos, cache_k, cache_v, num_slots, max_len,
            // width)` in cuda/attention_slots.cu; checked above: k_new, v_new = [t, width], slots, pos = [t] with
            // 1 <= t <= i32::MAX (one block each), 1 <= width <= i32::MAX, and cache_k, cache_v = [num_slots,
            // max_len, width]; the kernel writes only where slot < num_slots and pos < max_len; safe as launch_small's
            // dependent (pdl_start first).
            unsafe { dev.launch_small(NAME, &f, cfg, &mut args) }
        }
        no_cuda!(self, num_slots)
    }

    /// `out[i, h, :] = softmax_j(scale * q[i, h] . K[slots[i], j, kvh]) V[slots[i], j, kvh]` over
    /// `j in [lo, pos[i]]`, `lo = pos[i] + 1 - window` (clamped at 0) for a sliding layer (`window = Some(W)`,
    /// `W >= 1`), 0 for a full one; GQA: `kvh = h / (q_heads / kv_heads)`. `q`, `out`: f32 `[t, q_heads*head_dim]`,
    /// `t = slots.len() = pos.len()`; caches as [`Gpu::kv_store_slots`] (token `i`'s own key and value stored
    /// first). f32 scores, an online softmax with `expf` and f32 sums; `head_dim <= 256`. A token whose slot or
    /// position is out of range gets a row of zeros, never an out-of-bounds read.
    ///
    /// One block of 8 warps per (token, query head), the warps taking every 8th position: simple and exact, not
    /// fast over long contexts (each query head reads its slot's keys and values again).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_slots(
        &self,
        dims: &AttnDims,
        scale: f32,
        window: Option<usize>,
        q: &GpuBuffer<f32>,
        cache_k: &GpuBuffer<f32>,
        cache_v: &GpuBuffer<f32>,
        max_len: usize,
        slots: &GpuBuffer<u32>,
        pos: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_slots";
        let num_slots = check_caches(OP, dims, cache_k.len(), cache_v.len(), max_len)?;
        crate::ensure_shape!(
            dims.head_dim <= Gpu::ATTENTION_SLOTS_MAX_HEAD_DIM,
            OP,
            "head_dim must be at most {}, got {}",
            Gpu::ATTENTION_SLOTS_MAX_HEAD_DIM,
            dims.head_dim
        );
        crate::ensure_shape!(scale.is_finite(), OP, "scale must be finite, got {scale}");
        crate::ensure_shape!(
            window != Some(0),
            OP,
            "a sliding window must hold at least 1 token, got 0"
        );
        let t = check_tokens(OP, slots.len(), pos.len())?;
        crate::ensure_shape!(
            t.checked_mul(dims.q_heads).is_some_and(|b| b <= I32_MAX),
            OP,
            "{t} tokens x {} query heads: at most i32::MAX blocks",
            dims.q_heads
        );
        check_len_of(OP, "q", q.len(), &[t, dims.q_heads, dims.head_dim])?;
        check_len(OP, "out", out.len(), q.len())?;
        // A window of max_len or more reaches every position a slot holds: the full layer's bounds.
        let window = window.filter(|&w| w < max_len).unwrap_or(0);
        #[cfg(feature = "cuda")]
        {
            if t == 0 {
                return Ok(());
            }
            // `attention_slots_f32_e{1,2,4,8}` (the fewest values per lane that hold head_dim): one block per
            // (token, query head).
            const NAMES: [&str; 4] = [
                "attention_slots_f32_e1",
                "attention_slots_f32_e2",
                "attention_slots_f32_e4",
                "attention_slots_f32_e8",
            ];
            let epl = dims.head_dim.div_ceil(32).next_power_of_two();
            let name = NAMES[epl.trailing_zeros() as usize];
            let f = self.inner.function(Module::AttentionSlots, name)?;
            let (ns, ml, win) = (num_slots as u64, max_len as u64, window as u64);
            let (hq, hkv, d) = (
                dims.q_heads as i32,
                dims.kv_heads as i32,
                dims.head_dim as i32,
            );
            let cfg = launch_config(((t * dims.q_heads) as u32, 1, 1), (ATTN_THREADS, 1, 1), 0);
            let dev = &self.inner;
            let (qp, _g0) = dev.addr(&q.slice);
            let (kp, _g1) = dev.addr(&cache_k.slice);
            let (vp, _g2) = dev.addr(&cache_v.slice);
            let (sp, _g3) = dev.addr(&slots.slice);
            let (pp, _g4) = dev.addr(&pos.slice);
            let (op, _g5) = dev.addr_mut(&mut out.slice);
            let mut args = PdlArgs::default();
            args.ptr(qp)
                .ptr(kp)
                .ptr(vp)
                .ptr(sp)
                .ptr(pp)
                .ptr(op)
                .u64(ns)
                .u64(ml)
                .u64(win)
                .i32(hq)
                .i32(hkv)
                .i32(d)
                .f32(scale);
            // SAFETY: matches `attention_slots_f32_e*(q, cache_k, cache_v, slots, pos, out, num_slots, max_len,
            // window, q_heads, kv_heads, head_dim, scale)` in cuda/attention_slots.cu; checked above: dims (q_heads
            // a multiple of kv_heads, all positive), 1 <= head_dim <= 256 so head_dim <= 32 * EPL of the kernel
            // picked here, q and out = [t, q_heads, head_dim], slots and pos = [t] with 1 <= t * q_heads <=
            // i32::MAX (the grid), and the caches = [num_slots, max_len, kv_heads * head_dim]; the kernel reads K/V
            // rows only at positions lo..=pos < max_len of a slot < num_slots (others get zeros); safe as launch_small's
            // dependent (pdl_start first).
            unsafe { dev.launch_small(name, &f, cfg, &mut args) }
        }
        no_cuda!(self, num_slots, window)
    }
}
