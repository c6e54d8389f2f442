//! Attention on the CPU: RoPE (neox style, partial rotary factor, per-layer theta), decode over a paged KV cache
//! (full-attention layers) or a ring of `window - 1` slots (sliding layers), and causal prefill with tiled online
//! softmax and an optional sliding-window mask. Grouped-query: the query heads that share a KV head are served in
//! one pass over that head's cache.
//!
//! # Data layouts (shared by the C kernels, [`crate::reference::attention`] and the CUDA kernels)
//! Row-major fp32 (decode caches may also be bf16, [`KvSlice`]); `Hq` query heads, `Hkv` KV heads, head dim `D` (the same for K and V); query head `h` reads KV
//! head `h / (Hq / Hkv)`.
//! - decode query / output: `[B, Hq, D]` (one token per sequence).
//! - paged cache: `k_pages`, `v_pages`: `[num_pages, Hkv, page_size, D]`; `block_table`: `[B, max_pages]` page ids
//!   (`u32`); `lens`: `[B]` tokens in the cache **including the current one** (the caller writes the current K/V
//!   first, [`paged_slot`]). Token `p` of sequence `b` lives in page `block_table[b][p / page_size]`, slot
//!   `p % page_size`.
//! - ring cache (sliding window `W`): `k_ring`, `v_ring`: `[B, Hkv, W-1, D]` holding the `W-1` tokens before the
//!   current one; the current token's K/V come separately (`[B, Hkv, D]`), so a window counts the current token
//!   (transformers' sliding cache holds 511 entries for window 512). `pos`: `[B]`, the current token's position;
//!   slots `0..min(pos, W-1)` are valid and token `p` lives in slot `p % (W-1)` ([`ring_slot`]). Order inside the
//!   ring does not matter: softmax is permutation invariant and each key already carries its rotary phase.
//! - prefill: `q`: `[T, Hq, D]`, `k`, `v`: `[T, Hkv, D]`, output `[T, Hq, D]`; query `i` sees key `j` iff `j <= i`
//!   and, with a window `W`, `i - j < W`.
//!
//! # Paths and speed
//! AVX-512 is hand-written (`csrc/attn_avx512.c`): decode loads each chunk of a K/V row once per KV head for the
//! whole query group (f32 or bf16 cache, bf16 widened in registers) with the group's accumulators in registers;
//! prefill transposes K once and scores blocks of 16 query tokens as small GEMMs. The AVX2 build has a hand-written
//! decode segment (`csrc/attn_avx2.c`); the rest of AVX2 and all of scalar is the portable C of
//! `csrc/attn_impl.h` (per-query prefill). The AVX-512 paged decode for head dims that are a multiple of 32 and
//! groups of 2/3/4/6/8 query heads scores two keys per pass over the whole group and prefetches along the block
//! table into L2; measured by `cpu_seq` (benchmarks/cpu-avx512-2core.md, "after h8"): 0.95-1.01 of the read
//! bandwidth measured in the same run for an f32 cache and 0.91-0.92 for bf16, at 8k-32k context, 1 and 2 threads
//! (without the software prefetch it falls to 0.52-0.66). Other shapes and the ring decode use the generic walker.
//! Prefill of 1024 Spark tokens runs at 59-151 GFLOP/s (0.32-0.38 of the FMA roof, shared machine), 12-15x the
//! scalar per-query kernel.
//!
//! RoPE works in place on `[T, H, D]` rows with one position per row of `T`; angles are computed per call from
//! `theta` (no table that grows with the declared context: the seed found 618 MB of RoPE tables for a million
//! positions in a 2048-token deployment).

use crate::cpu::Isa;
use crate::error::{check_len, checked_product};
use crate::ops::{c_kernels, fastest_path, isa_kernels};
use crate::KernelError;

pub use crate::shapes::{AttnDims, Rope};

/// Ring slot of the token at position `p` in a sliding window of `window` tokens (`window - 1` slots), or `None`
/// when the window is 1 and nothing is cached.
pub fn ring_slot(window: usize, p: usize) -> Option<usize> {
    (window > 1).then(|| p % (window - 1))
}

/// Page id and slot of the token at position `p` of a sequence, or `None` when `p` is past its block table.
pub fn paged_slot(block_table: &[u32], page_size: usize, p: usize) -> Option<(u32, usize)> {
    if page_size == 0 {
        return None;
    }
    block_table
        .get(p / page_size)
        .map(|&page| (page, p % page_size))
}

/// Writable cache contents for [`paged_store`] and [`ring_store`].
#[derive(Debug)]
pub enum KvSliceMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements (stores round to nearest even).
    Bf16(&'a mut [half::bf16]),
}

impl KvSliceMut<'_> {
    fn len(&self) -> usize {
        match self {
            KvSliceMut::F32(s) => s.len(),
            KvSliceMut::Bf16(s) => s.len(),
        }
    }
    fn write(&mut self, at: usize, row: &[f32]) {
        match self {
            KvSliceMut::F32(s) => s[at..at + row.len()].copy_from_slice(row),
            KvSliceMut::Bf16(s) => {
                for (d, &x) in s[at..at + row.len()].iter_mut().zip(row) {
                    *d = half::bf16::from_f32(x);
                }
            }
        }
    }
}

/// Checks that a sliding window (`Some`; `None` is a full layer) holds at least the current token: every
/// attention entry point's one window check, CPU and CUDA.
pub(crate) fn check_window(op: &'static str, window: Option<usize>) -> Result<(), KernelError> {
    crate::ensure_shape!(
        window != Some(0),
        op,
        "a sliding window must hold at least 1 token, got 0"
    );
    Ok(())
}

/// Checks that a K and a V buffer (`names`, of `lens` elements) both have the product of `dims` (`what` is its
/// formula) elements.
fn check_kv_pair(
    op: &'static str,
    [k, v]: [&str; 2],
    [k_len, v_len]: [usize; 2],
    what: &str,
    dims: &[usize],
) -> Result<(), KernelError> {
    let want = checked_product(op, what, dims)?;
    crate::ensure_shape!(
        k_len == want && v_len == want,
        op,
        "{k} and {v} must have {what} = {want} elements, got {k_len} and {v_len}"
    );
    Ok(())
}

/// Checks that a per-sequence array (`name`) has one entry per sequence of the batch.
fn check_per_sequence(
    op: &'static str,
    name: &str,
    len: usize,
    batch: usize,
) -> Result<(), KernelError> {
    crate::ensure_shape!(
        len == batch,
        op,
        "{name} has {len} entries, expected batch = {batch}"
    );
    Ok(())
}

/// Runs a decode kernel (`kernel`, from [`kernels_for`]) over the `batch * Hkv` (sequence, KV head) items of `a`.
///
/// # Safety
/// Every buffer behind `a` must have been checked for `batch` sequences of `dims`, and `kernel` must be one of the
/// decode kernels of the path `isa`, which this CPU supports.
unsafe fn run_decode(
    op: &'static str,
    isa: Isa,
    threads: usize,
    dims: &AttnDims,
    batch: usize,
    a: &AttnArgs,
    kernel: ItemFn,
) -> Result<(), KernelError> {
    run_items(
        op,
        isa,
        batch * dims.kv_heads,
        threads,
        scratch_len(dims),
        // SAFETY: the caller checked the buffers behind `a`; each item writes only its own output rows.
        |i0, i1, s| unsafe { kernel(a, i0, i1, s) },
    )
}

/// Checks that `row` holds one token's keys or values, `[Hkv, D]`.
fn check_row(op: &'static str, dims: &AttnDims, row: &[f32]) -> Result<(), KernelError> {
    let row_len = checked_product(op, "Hkv x D", &[dims.kv_heads, dims.head_dim])?;
    crate::ensure_shape!(
        row.len() == row_len,
        op,
        "row has {} elements, expected Hkv x D = {row_len}",
        row.len()
    );
    Ok(())
}

/// Stores one token's keys or values (`row`: `[Hkv, D]` f32) at position `p` of a sequence in a paged cache
/// (`[num_pages, Hkv, page_size, D]`) through its block table. Call it for K and for V before
/// [`decode_paged`], whose `lens` count this token.
pub fn paged_store(
    dims: &AttnDims,
    mut cache: KvSliceMut<'_>,
    page_size: usize,
    block_table: &[u32],
    p: usize,
    row: &[f32],
) -> Result<(), KernelError> {
    const OP: &str = "attention::paged_store";
    dims.validate(OP)?;
    let (hkv, d) = (dims.kv_heads, dims.head_dim);
    crate::ensure_shape!(page_size > 0, OP, "page_size must be positive");
    check_row(OP, dims, row)?;
    let page = checked_product(OP, "Hkv x page_size x D", &[hkv, page_size, d])?;
    crate::ensure_shape!(
        cache.len().is_multiple_of(page),
        OP,
        "cache has {} elements, not a whole number of pages of {page}",
        cache.len()
    );
    let Some((id, slot)) = paged_slot(block_table, page_size, p) else {
        return Err(KernelError::shape(
            OP,
            format!(
                "position {p} is past the block table ({} pages of {page_size})",
                block_table.len()
            ),
        ));
    };
    crate::ensure_shape!(
        (id as usize) < cache.len() / page,
        OP,
        "block table names page {id} but the cache has {} pages",
        cache.len() / page
    );
    for h in 0..hkv {
        cache.write(
            id as usize * page + (h * page_size + slot) * d,
            &row[h * d..(h + 1) * d],
        );
    }
    Ok(())
}

/// Stores one token's keys or values (`row`: `[Hkv, D]` f32) at position `p` into sequence `b` of a ring
/// (`[batch, Hkv, window-1, D]`). Call it after [`decode_ring`] for that token (the ring holds the tokens before
/// the current one); with a window of 1 nothing is cached and this does nothing.
pub fn ring_store(
    dims: &AttnDims,
    mut cache: KvSliceMut<'_>,
    window: usize,
    b: usize,
    p: usize,
    row: &[f32],
) -> Result<(), KernelError> {
    const OP: &str = "attention::ring_store";
    dims.validate(OP)?;
    let (hkv, d) = (dims.kv_heads, dims.head_dim);
    check_window(OP, Some(window))?;
    check_row(OP, dims, row)?;
    let Some(slot) = ring_slot(window, p) else {
        return Ok(());
    };
    let slots = window - 1;
    let seq = checked_product(OP, "Hkv x (window-1) x D", &[hkv, slots, d])?;
    crate::ensure_shape!(
        cache.len().is_multiple_of(seq) && b < cache.len() / seq,
        OP,
        "ring has {} elements: no sequence {b} in rings of Hkv x (window-1) x D = {seq}",
        cache.len()
    );
    for h in 0..hkv {
        cache.write(((b * hkv + h) * slots + slot) * d, &row[h * d..(h + 1) * d]);
    }
    Ok(())
}

/// Keys per online-softmax tile in the C kernels (`ATTN_TILE` in `csrc/attn_impl.h`).
const TILE: usize = 32;

/// Mirror of `seq_attn_args` in `csrc/seq_common.h`.
#[repr(C)]
struct AttnArgs {
    hq: i64,
    hkv: i64,
    d: i64,
    scale: f32,
    q: *const f32,
    out: *mut f32,
    kv_bf16: i64,
    k_pages: *const std::ffi::c_void,
    v_pages: *const std::ffi::c_void,
    block_table: *const u32,
    lens: *const u32,
    page_size: i64,
    max_pages: i64,
    k_ring: *const std::ffi::c_void,
    v_ring: *const std::ffi::c_void,
    k_cur: *const std::ffi::c_void,
    v_cur: *const std::ffi::c_void,
    pos: *const u32,
    slots: i64,
    k: *const f32,
    v: *const f32,
    window: i64,
}

// SAFETY: the C kernels only read through the const pointers and write `out` rows of their own items; the borrows
// behind the pointers outlive the scoped threads of `parallel_ranges`.
unsafe impl Sync for AttnArgs {}

impl AttnArgs {
    fn new(dims: &AttnDims, scale: f32, q: &[f32], out: &mut [f32]) -> AttnArgs {
        let null = std::ptr::null();
        let void = std::ptr::null();
        AttnArgs {
            hq: dims.q_heads as i64,
            hkv: dims.kv_heads as i64,
            d: dims.head_dim as i64,
            scale,
            q: q.as_ptr(),
            out: out.as_mut_ptr(),
            kv_bf16: 0,
            k_pages: void,
            v_pages: void,
            block_table: std::ptr::null(),
            lens: std::ptr::null(),
            page_size: 0,
            max_pages: 0,
            k_ring: void,
            v_ring: void,
            k_cur: void,
            v_cur: void,
            pos: std::ptr::null(),
            slots: 0,
            k: null,
            v: null,
            window: 0,
        }
    }
}

c_kernels! {
    type ItemFn = fn(p: *const AttnArgs, i0: i64, i1: i64, scratch: *mut f32) -> i32;
    attn_decode_paged_scalar,
    attn_decode_ring_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] attn_decode_paged_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] attn_decode_ring_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] attn_decode_paged_avx512,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] attn_decode_ring_avx512,
}
c_kernels! {
    type PrefillFn = fn(p: *const AttnArgs, t: i64, i0: i64, i1: i64, scratch: *mut f32) -> i32;
    attn_prefill_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] attn_prefill_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] attn_prefill_avx512,
}
c_kernels! {
    type RopeFn = fn(x: *mut f32, heads: i64, d: i64, rot: i64, pos: *const u32, inv_freq: *const f32, t0: i64, t1: i64, scratch: *mut f32) -> i32;
    rope_neox_scalar,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] rope_neox_avx2,
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))] rope_neox_avx512,
}

struct Kernels {
    paged: ItemFn,
    ring: ItemFn,
    prefill: PrefillFn,
    rope: RopeFn,
}

fn kernels_for(op: &'static str, isa: Isa) -> Result<Kernels, KernelError> {
    isa_kernels!(op, isa,
        scalar: Kernels { paged: attn_decode_paged_scalar, ring: attn_decode_ring_scalar, prefill: attn_prefill_scalar, rope: rope_neox_scalar },
        avx2: Kernels { paged: attn_decode_paged_avx2, ring: attn_decode_ring_avx2, prefill: attn_prefill_avx2, rope: rope_neox_avx2 },
        avx512: Kernels { paged: attn_decode_paged_avx512, ring: attn_decode_ring_avx512, prefill: attn_prefill_avx512, rope: rope_neox_avx512 },
    )
}

/// Largest head dim the kernels accept (scratch and tiles are sized per head; no model uses more than 256).
pub const MAX_HEAD_DIM: usize = 1024;

fn check_common(
    op: &'static str,
    dims: &AttnDims,
    scale: f32,
    rows: usize,
    q: &[f32],
    out: &[f32],
) -> Result<(), KernelError> {
    dims.validate(op)?;
    crate::ensure_shape!(
        dims.head_dim <= MAX_HEAD_DIM,
        op,
        "head_dim {} is above the supported {MAX_HEAD_DIM}",
        dims.head_dim
    );
    crate::ensure_shape!(scale.is_finite(), op, "scale must be finite, got {scale}");
    let want = checked_product(op, "rows x Hq x D", &[rows, dims.q_heads, dims.head_dim])?;
    crate::ensure_shape!(
        q.len() == want,
        op,
        "q has {} elements, expected {rows} x Hq x D = {want}",
        q.len()
    );
    check_len(op, "out", out.len(), want)?;
    Ok(())
}

/// Runs `f` over `0..items` on `threads` threads with per-thread scratch, then records the ISA tag.
fn run_items(
    op: &'static str,
    isa: Isa,
    items: usize,
    threads: usize,
    scratch: usize,
    f: impl Fn(i64, i64, *mut f32) -> i32 + Sync,
) -> Result<(), KernelError> {
    if items == 0 {
        return Ok(());
    }
    let tag = std::sync::atomic::AtomicI32::new(-1);
    crate::cpu::parallel_ranges(items, 1, threads, |i0, i1| {
        let mut s = vec![0.0f32; scratch.max(1)];
        tag.store(
            f(i0 as i64, i1 as i64, s.as_mut_ptr()),
            std::sync::atomic::Ordering::Relaxed,
        );
    });
    crate::cpu::record_isa(op, isa, tag.into_inner())
}

fn scratch_len(dims: &AttnDims) -> usize {
    (dims.q_heads / dims.kv_heads) * (2 + dims.head_dim + TILE)
}

/// Cache contents of a decode call: f32, or bf16 (half the bytes streamed per token; each element is widened to
/// f32 exactly in registers, so only the cache's own rounding differs from an f32 cache).
#[derive(Debug, Clone, Copy)]
pub enum KvSlice<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    Bf16(&'a [half::bf16]),
}

impl KvSlice<'_> {
    /// Elements in the slice.
    pub fn len(&self) -> usize {
        match self {
            KvSlice::F32(s) => s.len(),
            KvSlice::Bf16(s) => s.len(),
        }
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn is_bf16(&self) -> bool {
        matches!(self, KvSlice::Bf16(_))
    }
    fn ptr(&self) -> *const std::ffi::c_void {
        match self {
            KvSlice::F32(s) => s.as_ptr().cast(),
            KvSlice::Bf16(s) => s.as_ptr().cast(),
        }
    }
}

/// Checks that every cache slice of one call has the same element type, returning whether it is bf16.
fn same_dtype(op: &'static str, slices: &[KvSlice<'_>]) -> Result<bool, KernelError> {
    let bf16 = slices[0].is_bf16();
    crate::ensure_shape!(
        slices.iter().all(|s| s.is_bf16() == bf16),
        op,
        "K and V caches (and the current token's K/V) must all be f32 or all bf16"
    );
    Ok(bf16)
}

/// A paged KV cache of one full-attention layer and the block tables of a batch (layouts: module docs).
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    /// `[num_pages, Hkv, page_size, D]`.
    pub k_pages: KvSlice<'a>,
    /// `[num_pages, Hkv, page_size, D]`.
    pub v_pages: KvSlice<'a>,
    /// Tokens per page.
    pub page_size: usize,
    /// `[batch, max_pages]` page ids.
    pub block_table: &'a [u32],
    /// Columns of `block_table`.
    pub max_pages: usize,
    /// `[batch]` tokens in the cache, current one included.
    pub lens: &'a [u32],
}

/// The sliding-window ring of one layer for a batch, plus the current token's K/V (layouts: module docs).
#[derive(Debug, Clone, Copy)]
pub struct RingKv<'a> {
    /// `[batch, Hkv, window-1, D]`.
    pub k_ring: KvSlice<'a>,
    /// `[batch, Hkv, window-1, D]`.
    pub v_ring: KvSlice<'a>,
    /// The sliding window `W` in tokens, the current one included (512 for Spark and Gemma 3 1B).
    pub window: usize,
    /// `[batch, Hkv, D]`, the current token's key (same element type as the ring).
    pub k_cur: KvSlice<'a>,
    /// `[batch, Hkv, D]`, the current token's value.
    pub v_cur: KvSlice<'a>,
    /// `[batch]`, the current token's position (= tokens before it).
    pub pos: &'a [u32],
}

fastest_path! {
    /// Decode over a paged cache (full-attention layers) with the fastest path and all cores; `q`, `out`:
    /// `[batch, Hq, D]`.
    pub fn decode_paged(dims: &AttnDims, scale: f32, batch: usize, q: &[f32], kv: &PagedKv<'_>, out: &mut [f32]) -> Result<(), KernelError> = decode_paged_with;
}

/// [`decode_paged`] on an explicit path and thread count (threads split the (sequence, KV head) pairs).
#[allow(clippy::too_many_arguments)]
pub fn decode_paged_with(
    isa: Isa,
    threads: usize,
    dims: &AttnDims,
    scale: f32,
    batch: usize,
    q: &[f32],
    kv: &PagedKv<'_>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "attention::decode_paged";
    check_common(OP, dims, scale, batch, q, out)?;
    let (hkv, d, ps) = (dims.kv_heads, dims.head_dim, kv.page_size);
    crate::ensure_shape!(ps > 0, OP, "page_size must be positive");
    let page = checked_product(OP, "Hkv x page_size x D", &[hkv, ps, d])?;
    crate::ensure_shape!(
        kv.k_pages.len().is_multiple_of(page),
        OP,
        "k_pages has {} elements, not a whole number of pages of Hkv x page_size x D = {page}",
        kv.k_pages.len()
    );
    crate::ensure_shape!(
        kv.v_pages.len() == kv.k_pages.len(),
        OP,
        "v_pages has {} elements, k_pages {}",
        kv.v_pages.len(),
        kv.k_pages.len()
    );
    let num_pages = kv.k_pages.len() / page;
    let bf16 = same_dtype(OP, &[kv.k_pages, kv.v_pages])?;
    crate::ensure_shape!(
        kv.block_table.len() == checked_product(OP, "batch x max_pages", &[batch, kv.max_pages])?,
        OP,
        "block_table has {} entries, expected batch ({batch}) x max_pages ({})",
        kv.block_table.len(),
        kv.max_pages
    );
    check_per_sequence(OP, "lens", kv.lens.len(), batch)?;
    for (b, &len) in kv.lens.iter().enumerate() {
        let len = len as usize;
        crate::ensure_shape!(
            len >= 1,
            OP,
            "lens[{b}] is 0: the cache must hold at least the current token"
        );
        // Saturating is exact here: a product past usize::MAX is above every u32 length.
        crate::ensure_shape!(
            len <= kv.max_pages.saturating_mul(ps),
            OP,
            "lens[{b}] = {len} does not fit in {} pages of {ps}",
            kv.max_pages
        );
        for i in 0..len.div_ceil(ps) {
            let id = kv.block_table[b * kv.max_pages + i];
            crate::ensure_shape!(
                (id as usize) < num_pages,
                OP,
                "block_table[{b}][{i}] = {id} but the cache has {num_pages} pages"
            );
        }
    }
    let kern = kernels_for(OP, isa)?;
    let mut a = AttnArgs::new(dims, scale, q, out);
    a.kv_bf16 = i64::from(bf16);
    a.k_pages = kv.k_pages.ptr();
    a.v_pages = kv.v_pages.ptr();
    a.block_table = kv.block_table.as_ptr();
    a.lens = kv.lens.as_ptr();
    a.page_size = ps as i64;
    a.max_pages = kv.max_pages as i64;
    // SAFETY: sizes, page ids and lengths were checked above; `kern` is the path's own decode kernel.
    unsafe { run_decode(OP, isa, threads, dims, batch, &a, kern.paged) }
}

fastest_path! {
    /// Decode over a sliding-window ring (sliding layers) with the fastest path and all cores; `q`, `out`:
    /// `[batch, Hq, D]`.
    pub fn decode_ring(dims: &AttnDims, scale: f32, batch: usize, q: &[f32], kv: &RingKv<'_>, out: &mut [f32]) -> Result<(), KernelError> = decode_ring_with;
}

/// [`decode_ring`] on an explicit path and thread count (threads split the (sequence, KV head) pairs).
#[allow(clippy::too_many_arguments)]
pub fn decode_ring_with(
    isa: Isa,
    threads: usize,
    dims: &AttnDims,
    scale: f32,
    batch: usize,
    q: &[f32],
    kv: &RingKv<'_>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "attention::decode_ring";
    check_common(OP, dims, scale, batch, q, out)?;
    check_window(OP, Some(kv.window))?;
    let (hkv, d, slots) = (dims.kv_heads, dims.head_dim, kv.window - 1);
    check_kv_pair(
        OP,
        ["k_ring", "v_ring"],
        [kv.k_ring.len(), kv.v_ring.len()],
        "batch x Hkv x (window-1) x D",
        &[batch, hkv, slots, d],
    )?;
    check_kv_pair(
        OP,
        ["k_cur", "v_cur"],
        [kv.k_cur.len(), kv.v_cur.len()],
        "batch x Hkv x D",
        &[batch, hkv, d],
    )?;
    check_per_sequence(OP, "pos", kv.pos.len(), batch)?;
    let bf16 = same_dtype(OP, &[kv.k_ring, kv.v_ring, kv.k_cur, kv.v_cur])?;
    let kern = kernels_for(OP, isa)?;
    let mut a = AttnArgs::new(dims, scale, q, out);
    a.kv_bf16 = i64::from(bf16);
    a.k_ring = kv.k_ring.ptr();
    a.v_ring = kv.v_ring.ptr();
    a.k_cur = kv.k_cur.ptr();
    a.v_cur = kv.v_cur.ptr();
    a.pos = kv.pos.as_ptr();
    a.slots = slots as i64;
    // SAFETY: ring, current K/V and pos sizes were checked above (the kernel reads min(pos, slots) slots per
    // item); `kern` is the path's own decode kernel.
    unsafe { run_decode(OP, isa, threads, dims, batch, &a, kern.ring) }
}

fastest_path! {
    /// Causal prefill of `t` tokens with the fastest path and all cores (layouts: module docs); `window = Some(W)`
    /// applies the sliding-window mask.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill(dims: &AttnDims, scale: f32, window: Option<usize>, t: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) -> Result<(), KernelError> = prefill_with;
}

/// [`prefill`] on an explicit path and thread count (threads split the (token, KV head) pairs).
#[allow(clippy::too_many_arguments)]
pub fn prefill_with(
    isa: Isa,
    threads: usize,
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    t: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "attention::prefill";
    check_common(OP, dims, scale, t, q, out)?;
    check_window(OP, window)?;
    // The C kernels index tokens with 32-bit lane arithmetic in places.
    crate::ensure_shape!(
        t <= i32::MAX as usize,
        OP,
        "{t} tokens is more than the kernels index (2^31 - 1)"
    );
    check_kv_pair(
        OP,
        ["k", "v"],
        [k.len(), v.len()],
        "t x Hkv x D",
        &[t, dims.kv_heads, dims.head_dim],
    )?;
    let kern = kernels_for(OP, isa)?;
    let mut a = AttnArgs::new(dims, scale, q, out);
    a.k = k.as_ptr();
    a.v = v.as_ptr();
    // A window wider than the prompt masks nothing: pass it as "no window" so the kernels' index arithmetic stays
    // within the prompt's range.
    a.window = match window {
        Some(w) if w <= t => w as i64,
        _ => 0,
    };
    let group = dims.q_heads / dims.kv_heads;
    #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
    if isa == Isa::Avx512 && group <= MAX_BLOCKED_GROUP && t > 0 {
        return prefill_blocked_avx512(OP, threads, dims, &a, t);
    }
    let _ = group;
    // SAFETY: q, k, v and out sizes were checked above; item (i, kvh) reads keys <= i and writes its own rows.
    run_items(
        OP,
        isa,
        t * dims.kv_heads,
        threads,
        scratch_len(dims),
        |i0, i1, s| unsafe { (kern.prefill)(&a, t as i64, i0, i1, s) },
    )
}

/// Query tokens per block of the AVX-512 blocked prefill (`ATTN_BQ` in `csrc/attn_avx512.c`).
const PREFILL_BLOCK: usize = 16;
/// Largest group (query heads per KV head) the blocked prefill takes: its row table holds 256 rows of
/// `PREFILL_BLOCK` tokens x group. Larger groups use the per-query kernel.
const MAX_BLOCKED_GROUP: usize = 16;

#[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
extern "C" {
    fn attn_k_transpose_avx512(p: *const AttnArgs, t: i64, tpad: i64, kt: *mut f32) -> i32;
    fn attn_prefill_blocked_avx512(
        p: *const AttnArgs,
        t: i64,
        tpad: i64,
        kt: *const f32,
        i0: i64,
        i1: i64,
        scratch: *mut f32,
    ) -> i32;
}

/// The AVX-512 prefill: K transposed once (`[Hkv, D, t rounded up to 32]`, the size of K), then blocks of
/// [`PREFILL_BLOCK`] query tokens scored as small GEMMs against it. Measured with `cpu_seq` (Spark geometry, 2048
/// tokens, full attention, same machine and hour): 675 ms with the per-query AVX-512 kernel (0.11 of the FMA roof),
/// 243 ms with this one (0.32).
#[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
fn prefill_blocked_avx512(
    op: &'static str,
    threads: usize,
    dims: &AttnDims,
    a: &AttnArgs,
    t: usize,
) -> Result<(), KernelError> {
    let tpad = t.div_ceil(TILE) * TILE;
    let mut kt = vec![0.0f32; dims.kv_heads * dims.head_dim * tpad];
    // SAFETY: `a.k` holds t x Hkv x D floats (checked by the caller) and kt Hkv x D x tpad.
    let tag = unsafe { attn_k_transpose_avx512(a, t as i64, tpad as i64, kt.as_mut_ptr()) };
    crate::cpu::record_isa(op, Isa::Avx512, tag)?;
    let rows = (PREFILL_BLOCK * (dims.q_heads / dims.kv_heads)).next_multiple_of(4);
    let scratch = rows * (TILE + dims.head_dim + 2) + dims.head_dim;
    let blocks = t.div_ceil(PREFILL_BLOCK);
    let kt = &kt;
    // SAFETY: sizes checked by the caller; kt is the transposed K of `tpad` columns; each item (query block, KV
    // head) writes only the output rows of its own tokens and heads; the scratch has the documented length.
    run_items(
        op,
        Isa::Avx512,
        blocks * dims.kv_heads,
        threads,
        scratch,
        |i0, i1, s| unsafe {
            attn_prefill_blocked_avx512(a, t as i64, tpad as i64, kt.as_ptr(), i0, i1, s)
        },
    )
}

fastest_path! {
    /// Neox RoPE in place on `x` (`[t, heads, head_dim]`), row `i` at `positions[i]`, with the fastest path.
    pub fn rope_neox(rope: &Rope, heads: usize, positions: &[u32], x: &mut [f32]) -> Result<(), KernelError> = rope_neox_with;
}

/// [`rope_neox`] on an explicit path and thread count (threads split the tokens).
pub fn rope_neox_with(
    isa: Isa,
    threads: usize,
    rope: &Rope,
    heads: usize,
    positions: &[u32],
    x: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "attention::rope_neox";
    rope.validate(OP)?;
    let want = checked_product(
        OP,
        "positions x heads x head_dim",
        &[positions.len(), heads, rope.head_dim],
    )?;
    crate::ensure_shape!(
        x.len() == want,
        OP,
        "x has {} elements, expected positions ({}) x heads ({heads}) x head_dim ({}) = {want}",
        x.len(),
        positions.len(),
        rope.head_dim
    );
    crate::ensure_shape!(heads > 0, OP, "heads must be positive");
    let kern = kernels_for(OP, isa)?;
    if positions.is_empty() {
        return Ok(());
    }
    // x holds at least one row of head_dim >= rotary_dim floats, so the table and the scratch below are no larger.
    let inv: Vec<f32> = (0..rope.rotary_dim / 2).map(|i| rope.inv_freq(i)).collect();
    let xp = crate::cpu::SharedMut(x.as_mut_ptr());
    let (d, rot) = (rope.head_dim as i64, rope.rotary_dim as i64);
    // A row is a few hundred multiply-adds: below 16 rows per thread a spawned thread costs more than it saves.
    let threads = threads.min(positions.len().div_ceil(16));
    run_items(
        OP,
        isa,
        positions.len(),
        threads,
        rope.rotary_dim,
        |t0, t1, s| {
            // SAFETY: x holds positions.len() rows of heads x head_dim (checked); rows t0..t1 are this thread's alone;
            // inv_freq has rotary_dim/2 entries and the scratch rotary_dim floats.
            unsafe {
                (kern.rope)(
                    xp.get(),
                    heads as i64,
                    d,
                    rot,
                    positions.as_ptr(),
                    inv.as_ptr(),
                    t0,
                    t1,
                    s,
                )
            }
        },
    )
}
