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
/// Threads of the split records' merge (`COMBINE_THREADS`).
#[cfg(feature = "cuda")]
pub(super) const COMBINE_THREADS: u32 = 128;

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

/// What [`check_attend`] found: the caches' slot count, the token count and the window as the kernels take it
/// (0 for a full layer).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Attend {
    num_slots: usize,
    t: usize,
    max_len: usize,
    window: usize,
}

/// The checks [`Gpu::attention_slots`] and [`Gpu::attention_slots_split`] share.
#[allow(clippy::too_many_arguments)]
fn check_attend(
    op: &'static str,
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    (q, cache_k, cache_v): (&GpuBuffer<f32>, &GpuBuffer<f32>, &GpuBuffer<f32>),
    max_len: usize,
    (slots, pos): (&GpuBuffer<u32>, &GpuBuffer<u32>),
    out: &GpuBuffer<f32>,
) -> Result<Attend, KernelError> {
    let num_slots = check_caches(op, dims, cache_k.len(), cache_v.len(), max_len)?;
    crate::ensure_shape!(
        dims.head_dim <= Gpu::ATTENTION_SLOTS_MAX_HEAD_DIM,
        op,
        "head_dim must be at most {}, got {}",
        Gpu::ATTENTION_SLOTS_MAX_HEAD_DIM,
        dims.head_dim
    );
    crate::ensure_shape!(scale.is_finite(), op, "scale must be finite, got {scale}");
    crate::attention::check_window(op, window)?;
    let t = check_tokens(op, slots.len(), pos.len())?;
    crate::ensure_shape!(
        t.checked_mul(dims.q_heads).is_some_and(|b| b <= I32_MAX),
        op,
        "{t} tokens x {} query heads: at most i32::MAX blocks",
        dims.q_heads
    );
    check_len_of(op, "q", q.len(), &[t, dims.q_heads, dims.head_dim])?;
    check_len(op, "out", out.len(), q.len())?;
    // A window of max_len or more reaches every position a slot holds: the full layer's bounds.
    let window = window.filter(|&w| w < max_len).unwrap_or(0);
    Ok(Attend {
        num_slots,
        t,
        max_len,
        window,
    })
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
    /// fast over long contexts (each query head reads its slot's keys and values again, on few blocks at one
    /// token: [`Gpu::attention_slots_split`] is the decode step's form).
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
        let a = check_attend(
            OP,
            dims,
            scale,
            window,
            (q, cache_k, cache_v),
            max_len,
            (slots, pos),
            out,
        )?;
        #[cfg(feature = "cuda")]
        {
            self.attend_launch(
                dims,
                scale,
                &a,
                (q, cache_k, cache_v),
                (slots, pos),
                out,
                None,
            )
        }
        no_cuda!(self, a)
    }

    /// How many blocks [`Gpu::attention_slots_split`] gives each (token, query head) on this device: enough that
    /// one token's heads fill every SM twice, a power of two, at most 64. It depends on the device and `dims`
    /// only, so a recorded step and every batch compute each token the same way.
    pub fn attention_slots_splits(&self, dims: &AttnDims) -> usize {
        (2 * self.sm_count().max(1))
            .div_ceil(dims.q_heads.max(1))
            .next_power_of_two()
            .clamp(1, Self::ATTENTION_SLOTS_MAX_SPLITS)
    }

    /// Most splits [`Gpu::attention_slots_split`] takes (`MAX_SPLITS` in cuda/attention_slots.cu).
    pub const ATTENTION_SLOTS_MAX_SPLITS: usize = 64;

    /// f32 values of the workspace [`Gpu::attention_slots_split`] needs for `t` tokens and `splits` splits:
    /// `t * q_heads * splits * (head_dim + 2)` (one record of max, sum and output per block).
    pub fn attention_slots_workspace_len(
        dims: &AttnDims,
        t: usize,
        splits: usize,
    ) -> Result<usize, KernelError> {
        crate::error::checked_product(
            "cuda::attention_slots_workspace_len",
            "t*q_heads*splits*(head_dim+2)",
            &[t, dims.q_heads, splits, dims.head_dim.saturating_add(2)],
        )
    }

    /// [`Gpu::attention_slots`] with each (token, query head)'s positions shared by `splits` blocks (flash
    /// decoding: chunks of at least 32 positions, so a short context leaves the later blocks empty), whose
    /// partial softmax records a second kernel merges. The same result up to the order of the f32 sums. `splits`
    /// in `1..=64` ([`Gpu::attention_slots_splits`] is this device's choice); `workspace` holds at least
    /// [`Gpu::attention_slots_workspace_len`] f32 values, its contents are overwritten. Each token's result depends
    /// on its own (slot, position) and `splits` only, not on the other tokens of the call.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_slots_split(
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
        splits: usize,
        workspace: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_slots_split";
        let a = check_attend(
            OP,
            dims,
            scale,
            window,
            (q, cache_k, cache_v),
            max_len,
            (slots, pos),
            out,
        )?;
        crate::ensure_shape!(
            (1..=Self::ATTENTION_SLOTS_MAX_SPLITS).contains(&splits),
            OP,
            "splits must be in 1..={}, got {splits}",
            Self::ATTENTION_SLOTS_MAX_SPLITS
        );
        let need = Self::attention_slots_workspace_len(dims, a.t, splits)?;
        crate::ensure_shape!(
            workspace.len() >= need,
            OP,
            "workspace holds {} f32 values, {need} needed (t x q_heads x splits x (head_dim + 2))",
            workspace.len()
        );
        #[cfg(feature = "cuda")]
        {
            if a.t == 0 {
                return Ok(());
            }
            self.attend_launch(
                dims,
                scale,
                &a,
                (q, cache_k, cache_v),
                (slots, pos),
                workspace,
                Some(splits),
            )?;
            // `attention_slots_combine_f32`: one block per (token, query head).
            const NAME: &str = "attention_slots_combine_f32";
            let f = self.inner.function(Module::AttentionSlots, NAME)?;
            let rows = a.t * dims.q_heads;
            let cfg = launch_config((rows as u32, 1, 1), (COMBINE_THREADS, 1, 1), 0);
            let dev = &self.inner;
            let (wp, _g0) = dev.addr(&workspace.slice);
            let (op, _g1) = dev.addr_mut(&mut out.slice);
            let mut args = PdlArgs::default();
            args.ptr(wp)
                .ptr(op)
                .i32(splits as i32)
                .i32(dims.head_dim as i32);
            // SAFETY: matches `attention_slots_combine_f32(ws, out, splits, head_dim)` in cuda/attention_slots.cu;
            // checked above: 1 <= rows = t * q_heads <= i32::MAX (the grid), 1 <= splits <= 64 (its shared
            // weights), workspace >= [rows, splits, head_dim + 2] (written by the split launch just before, which
            // this one waits for: pdl_start first), out = [rows, head_dim].
            unsafe { dev.launch_small(NAME, &f, cfg, &mut args) }
        }
        no_cuda!(self, a, need)
    }

    /// The launch of `attention_slots_f32_e*` (`splits` None, into `dst` = the output) or
    /// `attention_slots_split_f32_e*` (grid `(t * q_heads, splits)`, into `dst` = the workspace), after
    /// [`check_attend`] (and the split's checks).
    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn attend_launch(
        &self,
        dims: &AttnDims,
        scale: f32,
        a: &Attend,
        (q, cache_k, cache_v): (&GpuBuffer<f32>, &GpuBuffer<f32>, &GpuBuffer<f32>),
        (slots, pos): (&GpuBuffer<u32>, &GpuBuffer<u32>),
        dst: &mut GpuBuffer<f32>,
        splits: Option<usize>,
    ) -> Result<(), KernelError> {
        if a.t == 0 {
            return Ok(());
        }
        // The fewest values per lane that hold head_dim; one block per (token, query head[, split]).
        const NAMES: [[&str; 4]; 2] = [
            [
                "attention_slots_f32_e1",
                "attention_slots_f32_e2",
                "attention_slots_f32_e4",
                "attention_slots_f32_e8",
            ],
            [
                "attention_slots_split_f32_e1",
                "attention_slots_split_f32_e2",
                "attention_slots_split_f32_e4",
                "attention_slots_split_f32_e8",
            ],
        ];
        let epl = dims.head_dim.div_ceil(32).next_power_of_two();
        let name = NAMES[usize::from(splits.is_some())][epl.trailing_zeros() as usize];
        let f = self.inner.function(Module::AttentionSlots, name)?;
        let (ns, ml, win) = (a.num_slots as u64, a.max_len as u64, a.window as u64);
        let (hq, hkv, d) = (
            dims.q_heads as i32,
            dims.kv_heads as i32,
            dims.head_dim as i32,
        );
        let cfg = launch_config(
            ((a.t * dims.q_heads) as u32, splits.unwrap_or(1) as u32, 1),
            (ATTN_THREADS, 1, 1),
            0,
        );
        let dev = &self.inner;
        let (qp, _g0) = dev.addr(&q.slice);
        let (kp, _g1) = dev.addr(&cache_k.slice);
        let (vp, _g2) = dev.addr(&cache_v.slice);
        let (sp, _g3) = dev.addr(&slots.slice);
        let (pp, _g4) = dev.addr(&pos.slice);
        let (dp, _g5) = dev.addr_mut(&mut dst.slice);
        let mut args = PdlArgs::default();
        args.ptr(qp)
            .ptr(kp)
            .ptr(vp)
            .ptr(sp)
            .ptr(pp)
            .ptr(dp)
            .u64(ns)
            .u64(ml)
            .u64(win)
            .i32(hq)
            .i32(hkv)
            .i32(d)
            .f32(scale);
        // SAFETY: matches `attention_slots[_split]_f32_e*(q, cache_k, cache_v, slots, pos, out | ws, num_slots,
        // max_len, window, q_heads, kv_heads, head_dim, scale)` in cuda/attention_slots.cu; checked by the callers:
        // dims (q_heads a multiple of kv_heads, all positive), 1 <= head_dim <= 256 so head_dim <= 32 * EPL of the
        // kernel picked here, q = [t, q_heads, head_dim], dst = out of q's size (one block) or a workspace of at
        // least [t, q_heads, splits, head_dim + 2] (split, 1 <= splits <= 64), slots and pos = [t] with
        // 1 <= t * q_heads <= i32::MAX (the grid), and the caches = [num_slots, max_len, kv_heads * head_dim]; the
        // kernel reads K/V rows only at positions lo..=pos < max_len of a slot < num_slots (others get zeros or an
        // empty record); safe as launch_small's dependent (pdl_start first).
        unsafe { dev.launch_small(name, &f, cfg, &mut args) }
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::super::device::{assert_embedded, source_literal, Module};
    use super::{Gpu, COMBINE_THREADS};

    /// Every kernel the launch code above can name is embedded (and, without `lab`, nothing else).
    #[test]
    fn every_attention_slots_kernel_is_embedded() {
        let mut launched = vec!["kv_store_slots_f32", "attention_slots_combine_f32"];
        for e in ["e1", "e2", "e4", "e8"] {
            launched.push(Box::leak(
                format!("attention_slots_f32_{e}").into_boxed_str(),
            ));
            launched.push(Box::leak(
                format!("attention_slots_split_f32_{e}").into_boxed_str(),
            ));
        }
        assert_embedded(Module::AttentionSlots, launched);
    }

    /// The split launch's constants are the kernel file's.
    #[test]
    fn split_constants_match_the_kernel_source() {
        const SRC: &str = include_str!("../../cuda/attention_slots.cu");
        assert_eq!(
            source_literal(SRC, "constexpr int COMBINE_THREADS", " = "),
            u64::from(COMBINE_THREADS)
        );
        assert_eq!(
            source_literal(SRC, "constexpr int MAX_SPLITS", " = "),
            Gpu::ATTENTION_SLOTS_MAX_SPLITS as u64
        );
    }
}
