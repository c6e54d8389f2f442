//! Causal prefill attention on the GPU (`cuda/attention_prefill.cu`): flash-attention-2 style on `mma.sync`
//! bf16 tensor cores, grouped-query packing, optional sliding window, one sequence or a batch of sequences of
//! different lengths (cu_seqlens); chunked prefill continuing a paged or ring KV cache (`attention_prefill_paged`,
//! `attention_prefill_ring`) and the store of the new tokens' K/V into those caches (`attention_kv_store_*`). The
//! kernels' design is documented at the top of the .cu file.

#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, PushKernelArg};

#[cfg(feature = "cuda")]
use super::device::{launch_config, Device, Module};
use super::{check_len, check_len_of, Gpu, GpuBuffer, PagedAttentionDims, PrefillChunk};
use crate::shapes::AttnDims;
use crate::KernelError;

/// The cached prefix of a prefix-mode launch (`attention_prefill_paged_*`) or the destination of a store:
/// `block_table = None` is a ring of `page_size` (= window - 1) slots per sequence and KV head.
#[cfg(feature = "cuda")]
pub(in crate::cuda) struct PrefixCache<'a> {
    pub(in crate::cuda) block_table: Option<&'a cudarc::driver::CudaSlice<u32>>,
    pub(in crate::cuda) prefix_lens: &'a cudarc::driver::CudaSlice<u32>,
    pub(in crate::cuda) page_size: usize,
    pub(in crate::cuda) max_pages: usize,
    pub(in crate::cuda) num_pages: usize,
}

/// The sequences of a launch: `cu_seqlens = None` is one sequence of `total` tokens (a null pointer).
#[cfg(feature = "cuda")]
pub(in crate::cuda) struct PrefillBatch<'a> {
    pub(in crate::cuda) cu_seqlens: Option<&'a cudarc::driver::CudaSlice<u32>>,
    pub(in crate::cuda) seqs: usize,
    pub(in crate::cuda) total: usize,
    pub(in crate::cuda) max_seqlen: usize,
}

/// One instantiation of the prefill kernel: its name, the head dim it serves, and its tiling.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the launch fields are read by the cuda build only
pub(in crate::cuda) struct PrefillKernel {
    pub(in crate::cuda) name: &'static str,
    /// The prefix-mode kernel of the same tiling (`attention_prefill_paged_...`: paged or ring cache prefix).
    pub(in crate::cuda) paged_name: &'static str,
    pub(in crate::cuda) head_dim: usize,
    /// `M<block_m>_W<warp_tiles>_N<block_n>_S<stages>`, the name's tail (what callers pass to pick a variant).
    pub(in crate::cuda) variant: &'static str,
    /// Packed query rows (token, query head of the group) per block.
    pub(in crate::cuda) block_m: usize,
    /// m16 row tiles per warp (each K/V fragment loaded from shared memory serves all of them).
    pub(in crate::cuda) warp_tiles: usize,
    /// Keys per K/V tile.
    pub(in crate::cuda) block_n: usize,
    /// Depth of the cp.async K/V pipeline.
    pub(in crate::cuda) stages: usize,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl PrefillKernel {
    /// Dynamic shared memory: the Q tile and `stages` x (K tile + V tile), bf16 (`AP_SMEM` in the .cu).
    pub(in crate::cuda) fn smem_bytes(&self) -> usize {
        (self.block_m + 2 * self.stages * self.block_n) * self.head_dim * 2
    }

    /// Threads per block: one warp per `16 * warp_tiles` rows.
    pub(in crate::cuda) fn threads(&self) -> usize {
        self.block_m / (16 * self.warp_tiles) * 32
    }
}

macro_rules! prefill_kernel {
    ($d:literal, $m:literal, $w:literal, $n:literal, $s:literal) => {
        PrefillKernel {
            name: concat!(
                "attention_prefill_D",
                $d,
                "_M",
                $m,
                "_W",
                $w,
                "_N",
                $n,
                "_S",
                $s
            ),
            paged_name: concat!(
                "attention_prefill_paged_D",
                $d,
                "_M",
                $m,
                "_W",
                $w,
                "_N",
                $n,
                "_S",
                $s
            ),
            head_dim: $d,
            variant: concat!("M", $m, "_W", $w, "_N", $n, "_S", $s),
            block_m: $m,
            warp_tiles: $w,
            block_n: $n,
            stages: $s,
        }
    };
}

/// The instantiations in cuda/attention_prefill.cu (`AP_INSTANTIATE`) that [`PREFILL_DEFAULTS`] picks, built in
/// every build.
pub(in crate::cuda) const PREFILL_KERNELS: &[PrefillKernel] = &[
    prefill_kernel!(64, 128, 2, 64, 3),
    prefill_kernel!(128, 128, 2, 64, 2),
    prefill_kernel!(128, 64, 1, 64, 2),
    prefill_kernel!(256, 64, 1, 64, 2),
    prefill_kernel!(256, 128, 1, 64, 2),
];

/// The tilings no [`PREFILL_DEFAULTS`] row picks, built with the `lab` feature only (`_with` calls name them).
#[cfg(feature = "lab")]
const PREFILL_LAB_KERNELS: &[PrefillKernel] = &[
    prefill_kernel!(64, 128, 1, 64, 3),
    prefill_kernel!(64, 64, 1, 64, 3),
    prefill_kernel!(128, 128, 1, 64, 2),
    prefill_kernel!(128, 128, 2, 32, 3),
    prefill_kernel!(256, 64, 1, 32, 2),
];

/// The default tiling by head dim and size of the grid: `(head_dim, least row tiles, variant)`, the first row of
/// the head dim whose bound the call reaches wins (rows in decreasing order of the bound). "Row tiles" is
/// `total tokens x q_heads / 128`, the number of 128-row query tiles over all sequences and KV heads (GQA packs
/// the `q_heads / kv_heads` heads of a KV head into the rows), to compare with the H200's 132 multiprocessors.
///
/// Measured on the H200 (`benchmarks/h200.md`, one causal sequence, times
/// in us, SDPA flash in brackets):
/// - D256, 24 q / 4 kv: T=1024 (192 row tiles): M64_W1_N64_S2 81.0, M64_W1_N32_S2 83.4, M128_W1_N64_S2 87.4
///   [75.6]; T=4096 (768): M128_W1_N64_S2 769, M64_W1_N32_S2 862, M64_W1_N64_S2 916 [754]; T=16384 (3072):
///   M128_W1_N64_S2 11124, M64_W1_N32_S2 12872, M64_W1_N64_S2 13879 [10369]; windowed W=1024 at 16384:
///   M128_W1_N64_S2 1642, M64_W1_N32_S2 1879. At 1 block per SM (192 KB of shared memory) a 128-row tile
///   wins once there are a few waves of them; below that the 64-row tiles balance the causal triangle better.
/// - D128, 32 q / 8 kv: T=1024 (256): M64_W1_N64_S2 62.3, M128_W2_N64_S2 66.1, M128_W1_N64_S2 66.9 [56.3];
///   T=4096 (1024): M128_W1_N64_S2 553, M128_W2_N64_S2 558, M64_W1_N64_S2 562 [499]; T=16384 (4096):
///   M128_W2_N64_S2 7113, M128_W2_N32_S3 7606, M64_W1_N64_S2 8566, M128_W1_N64_S2 8617 [6527]. W2 (each K/V
///   fragment feeds two MMAs) is within 1% of the best at 4096 and 17% faster at 16384, so it takes every
///   large grid.
/// - D64, 32 q / 8 kv (`benchmarks/h200.md`): T=1024 (256): M128_W2_N64_S3 35.8, M64_W1_N64_S3
///   37.6 [33.4]; T=16384 (4096): M128_W2_N64_S3 3775, M128_W1_N64_S3 5366 [3772]. M128_W2 wins both (by 5% and
///   42%; 1.00x SDPA at 16384), so it serves every D64 grid.
///
/// The split at 384 row tiles (about 3 waves of 128-row blocks) lies between the measured small (192, 256) and
/// large (768, 1024) grids. The benchmark prints the default's time beside the best of every case.
pub(in crate::cuda) const PREFILL_DEFAULTS: &[(usize, usize, &str)] = &[
    (64, 0, "M128_W2_N64_S3"),
    (128, 384, "M128_W2_N64_S2"),
    (128, 0, "M64_W1_N64_S2"),
    (256, 384, "M128_W1_N64_S2"),
    (256, 0, "M64_W1_N64_S2"),
];

/// The instantiations serving `head_dim`.
fn kernels_for(head_dim: usize) -> impl Iterator<Item = &'static PrefillKernel> {
    #[cfg(feature = "lab")]
    let built = PREFILL_KERNELS.iter().chain(PREFILL_LAB_KERNELS);
    #[cfg(not(feature = "lab"))]
    let built = PREFILL_KERNELS.iter();
    built.filter(move |k| k.head_dim == head_dim)
}

/// The default tiling of [`PREFILL_DEFAULTS`] for `total` new tokens of `q_heads` query heads.
fn default_kernel(head_dim: usize, q_heads: usize, total: usize) -> Option<&'static PrefillKernel> {
    let row_tiles = total.saturating_mul(q_heads) / 128;
    let variant = PREFILL_DEFAULTS
        .iter()
        .find(|&&(d, least, _)| d == head_dim && row_tiles >= least)?
        .2;
    kernels_for(head_dim).find(|k| k.variant == variant)
}

impl Gpu {
    /// The head dims the prefill kernels are built for (one tiling per dim): a caller with another falls back to
    /// its own path rather than being refused.
    pub const ATTENTION_PREFILL_HEAD_DIMS: [usize; 3] = [64, 128, 256];

    /// Causal prefill attention of one sequence of `t` tokens, the semantics of the CPU
    /// [`crate::attention::prefill`]: token `i` attends to tokens `j <= i` and, with `window = Some(W)`, only to
    /// `i - j < W` (the window counts the token itself); query head `h` reads KV head `h / (q_heads / kv_heads)`;
    /// `scale` multiplies `q . k` (usually `1/sqrt(head_dim)`).
    ///
    /// Layouts as the CPU's, in bf16 bits: `q`, `out`: `[t, q_heads, head_dim]`; `k`, `v`: `[t, kv_heads,
    /// head_dim]`. The output is bf16 (the next consumer, the output projection, is a bf16 GEMM), normalised in
    /// fp32 before one rounding. Scores and the softmax are fp32; the probabilities are rounded to bf16 for the
    /// `P V` product, as in flash-attention (relative error ~3e-3 against an f32 reference on bf16 inputs).
    /// Needs `head_dim` 64, 128 or 256 and any `q_heads` multiple of `kv_heads`; `t = 0` does nothing.
    ///
    /// Speed (H200, `benchmarks/h200.md`): 0.90-0.98x SDPA flash at T = 1k-16k for 24 q / 4 kv x 256
    /// and 32 q / 8 kv x 128 with the best tiling; the tiling is picked by [`Gpu::attention_prefill_default`]
    /// from those measurements.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill(
        &self,
        dims: &AttnDims,
        scale: f32,
        window: Option<usize>,
        t: usize,
        q: &GpuBuffer<u16>,
        k: &GpuBuffer<u16>,
        v: &GpuBuffer<u16>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.prefill_checked(None, dims, scale, window, None, 1, t, t, q, k, v, out)
    }

    /// [`Gpu::attention_prefill`] for a batch of `seqs` sequences packed one after another (varlen):
    /// `cu_seqlens` (`[seqs + 1]`, on the device) holds the token offsets, sequence `b` being tokens
    /// `cu_seqlens[b] .. cu_seqlens[b + 1]` of `q`, `k`, `v` and `out` (`[total, heads, head_dim]`), each with its
    /// own causal mask. `max_seqlen` bounds every sequence's length and sizes the grid. The offsets are read on
    /// the device and not checked here: the kernel clamps them to `0..=total` and cuts a sequence longer than
    /// `max_seqlen`, so a wrong table gives wrong or unwritten rows, never an access outside the buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill_varlen(
        &self,
        dims: &AttnDims,
        scale: f32,
        window: Option<usize>,
        cu_seqlens: &GpuBuffer<u32>,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
        q: &GpuBuffer<u16>,
        k: &GpuBuffer<u16>,
        v: &GpuBuffer<u16>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.attention_prefill_varlen_with(
            None, dims, scale, window, cu_seqlens, seqs, total, max_seqlen, q, k, v, out,
        )
    }

    lab_pub! {
    /// [`Gpu::attention_prefill_varlen`] on a chosen tiling (`None`: [`Gpu::attention_prefill_default`]), one of
    /// [`Gpu::attention_prefill_variants`]; tests and benchmarks drive each one.
    #[allow(clippy::too_many_arguments)]
    fn attention_prefill_varlen_with(
        &self,
        variant: Option<&str>,
        dims: &AttnDims,
        scale: f32,
        window: Option<usize>,
        cu_seqlens: &GpuBuffer<u32>,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
        q: &GpuBuffer<u16>,
        k: &GpuBuffer<u16>,
        v: &GpuBuffer<u16>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.prefill_checked(
            variant,
            dims,
            scale,
            window,
            Some(cu_seqlens),
            seqs,
            total,
            max_seqlen,
            q,
            k,
            v,
            out,
        )
    }
    }

    /// The tilings built for `head_dim` (`M<query rows>_W<m16 tiles per warp>_N<keys>_S<stages>`); empty for an
    /// unsupported head dim.
    #[cfg(feature = "lab")]
    pub fn attention_prefill_variants(head_dim: usize) -> Vec<&'static str> {
        kernels_for(head_dim).map(|k| k.variant).collect()
    }

    /// The tiling the entry points without a variant run for `total` new tokens (over all sequences) of
    /// `q_heads` query heads at `head_dim` (a table of H200 measurements, documented at `PREFILL_DEFAULTS` in
    /// this file); `None` for an unsupported head dim.
    pub fn attention_prefill_default(
        head_dim: usize,
        q_heads: usize,
        total: usize,
    ) -> Option<&'static str> {
        default_kernel(head_dim, q_heads, total).map(|k| k.variant)
    }

    /// Chunked prefill over a paged KV cache (full-attention layers): sequence `b`'s new tokens ([`PrefillChunk`]: `q`, `k`, `v`:
    /// `[total, heads, head_dim]` bf16 bits, sequences packed as `cu_seqlens`, `[seqs + 1]`) continue after
    /// `prefix_lens[b]` tokens already in `k_cache` / `v_cache` (bf16 bits `[num_pages, kv_heads, page_size,
    /// head_dim]`, the layout of [`Gpu::attention_decode_paged`]; token `p` in page `block_table[b][p /
    /// page_size]`, slot `p % page_size`; `block_table`: `[seqs, max_pages_per_seq]`). New token `t` is position
    /// `P = prefix_lens[b] + t`: it attends to every cached token and to the new tokens up to itself, and with
    /// `window = Some(W)` only to positions `j` with `P - j < W` (the window over absolute positions). The result
    /// is [`crate::attention::prefill`] over the concatenated history (prefix + new tokens), rows of the new
    /// tokens only; `out`: `[total, q_heads, head_dim]` bf16.
    ///
    /// The new tokens' K/V are read from `k` / `v`, not from the cache: store them with
    /// [`Gpu::attention_kv_store_paged`] before or after (the kernel never reads the cache at or past the prefix).
    /// `prefix_lens` and `cu_seqlens` live on the device and are clamped there (a prefix to the block table's
    /// `max_pages_per_seq * page_size` tokens); a page id `>= num_pages` is not read (its keys count as zeros):
    /// a wrong table gives wrong rows, never an access outside the buffers. Same tilings and error as
    /// [`Gpu::attention_prefill`]; `dims.seqs` sequences.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill_paged(
        &self,
        dims: &PagedAttentionDims,
        scale: f32,
        window: Option<usize>,
        k_cache: &GpuBuffer<u16>,
        v_cache: &GpuBuffer<u16>,
        block_table: &GpuBuffer<u32>,
        chunk: PrefillChunk<'_>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.attention_prefill_paged_with(
            None,
            dims,
            scale,
            window,
            k_cache,
            v_cache,
            block_table,
            chunk,
            out,
        )
    }

    lab_pub! {
    /// [`Gpu::attention_prefill_paged`] on a chosen tiling (`None`: the default), one of
    /// [`Gpu::attention_prefill_variants`].
    #[allow(clippy::too_many_arguments)]
    fn attention_prefill_paged_with(
        &self,
        variant: Option<&str>,
        dims: &PagedAttentionDims,
        scale: f32,
        window: Option<usize>,
        k_cache: &GpuBuffer<u16>,
        v_cache: &GpuBuffer<u16>,
        block_table: &GpuBuffer<u32>,
        chunk: PrefillChunk<'_>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_prefill_paged";
        let attn = attn_dims(dims);
        let cache = check_paged_cache(OP, dims, block_table)?;
        self.prefix_prefill(
            OP,
            variant,
            &attn,
            dims.seqs,
            scale,
            window,
            (cache, k_cache, v_cache),
            chunk,
            out,
        )
    }
    }

    /// Chunked prefill over a sliding-window ring (sliding layers): as [`Gpu::attention_prefill_paged`] with the
    /// window `window` (which every new token applies over absolute positions) and the prefix in `k_ring` /
    /// `v_ring` (bf16 bits `[seqs, kv_heads, window - 1, head_dim]`, the layout of [`Gpu::attention_decode_ring`]:
    /// position `p` in slot `p % (window - 1)`), which holds the last `window - 1` tokens of each sequence's
    /// prefix of `prefix_lens[b]` tokens: exactly the cached keys a window of `window` lets the new tokens see.
    /// Run it before [`Gpu::attention_kv_store_ring`] stores the new tokens (which overwrites prefix slots the
    /// first new tokens still need).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill_ring(
        &self,
        dims: &AttnDims,
        seqs: usize,
        scale: f32,
        window: usize,
        k_ring: &GpuBuffer<u16>,
        v_ring: &GpuBuffer<u16>,
        chunk: PrefillChunk<'_>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        self.attention_prefill_ring_with(
            None, dims, seqs, scale, window, k_ring, v_ring, chunk, out,
        )
    }

    lab_pub! {
    /// [`Gpu::attention_prefill_ring`] on a chosen tiling (`None`: the default), one of
    /// [`Gpu::attention_prefill_variants`].
    #[allow(clippy::too_many_arguments)]
    fn attention_prefill_ring_with(
        &self,
        variant: Option<&str>,
        dims: &AttnDims,
        seqs: usize,
        scale: f32,
        window: usize,
        k_ring: &GpuBuffer<u16>,
        v_ring: &GpuBuffer<u16>,
        chunk: PrefillChunk<'_>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_prefill_ring";
        let cache = check_ring(OP, dims, seqs, window)?;
        self.prefix_prefill(
            OP,
            variant,
            dims,
            seqs,
            scale,
            Some(window),
            (cache, k_ring, v_ring),
            chunk,
            out,
        )
    }
    }

    /// Stores the new tokens' keys and values (`k`, `v`: bf16 bits `[total, kv_heads, head_dim]`, sequences as
    /// `cu_seqlens`) into a paged cache (the layout of [`Gpu::attention_prefill_paged`]) after `prefix_lens[b]`
    /// cached tokens: token `t` of sequence `b` goes to position `prefix_lens[b] + t`, page
    /// `block_table[b][pos / page_size]`, slot `pos % page_size` ([`crate::attention::paged_store`] for every
    /// new token, without rounding: the rows are bf16 already). Positions past a sequence's block table and page
    /// ids `>= num_pages` are skipped (device-side values, not checked here). Any `head_dim` multiple of 8.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_kv_store_paged(
        &self,
        dims: &PagedAttentionDims,
        chunk: PrefillChunk<'_>,
        block_table: &GpuBuffer<u32>,
        k_cache: &mut GpuBuffer<u16>,
        v_cache: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_kv_store_paged";
        let attn = attn_dims(dims);
        let cache = check_paged_cache(OP, dims, block_table)?;
        self.kv_store(OP, &attn, dims.seqs, cache, chunk, k_cache, v_cache)
    }

    /// Stores the new tokens' keys and values into a sliding-window ring (`[seqs, kv_heads, window - 1,
    /// head_dim]`, the layout of [`Gpu::attention_prefill_ring`]): position `prefix_lens[b] + t` goes to slot
    /// `pos % (window - 1)`, and only the last `window - 1` new tokens of each sequence are written (the earlier
    /// ones would be overwritten in the same chunk), as [`crate::attention::ring_store`] for every new token in
    /// order. Run it after [`Gpu::attention_prefill_ring`] of the chunk. A window of 1 caches nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_kv_store_ring(
        &self,
        dims: &AttnDims,
        seqs: usize,
        window: usize,
        chunk: PrefillChunk<'_>,
        k_ring: &mut GpuBuffer<u16>,
        v_ring: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_kv_store_ring";
        let cache = check_ring(OP, dims, seqs, window)?;
        self.kv_store(OP, dims, seqs, cache, chunk, k_ring, v_ring)
    }

    /// The checks and the launch shared by [`Gpu::attention_prefill_paged_with`] and
    /// [`Gpu::attention_prefill_ring_with`].
    #[allow(clippy::too_many_arguments)]
    fn prefix_prefill(
        &self,
        op: &'static str,
        variant: Option<&str>,
        dims: &AttnDims,
        seqs: usize,
        scale: f32,
        window: Option<usize>,
        (cache, k_cache, v_cache): (CacheShape<'_>, &GpuBuffer<u16>, &GpuBuffer<u16>),
        chunk: PrefillChunk<'_>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        let PrefillChunk {
            q,
            k,
            v,
            cu_seqlens,
            prefix_lens,
            total,
            max_seqlen,
        } = chunk;
        let kernel = check_prefill(op, variant, dims, scale, window, seqs, total, max_seqlen)?;
        check_batch(op, max_seqlen)?;
        let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
        check_len_of(op, "q", q.len(), &[total, hq, d])?;
        check_len_of(op, "k", k.len(), &[total, hkv, d])?;
        check_len_of(op, "v", v.len(), &[total, hkv, d])?;
        check_len_of(op, "out", out.len(), &[total, hq, d])?;
        check_len(op, "cu_seqlens", cu_seqlens.len(), seqs + 1)?;
        check_len(op, "prefix_lens", prefix_lens.len(), seqs)?;
        let elements = cache.elements(op, seqs, hkv, d)?;
        check_len(op, cache.what(0), k_cache.len(), elements)?;
        check_len(op, cache.what(1), v_cache.len(), elements)?;
        if total == 0 {
            return Ok(());
        }
        // Positions stay below 2^31 (check_batch and the cache checks), so a larger window masks nothing more.
        let window = window.map_or(0, |w| w.min(i32::MAX as usize));
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        #[cfg(feature = "cuda")]
        {
            let batch = PrefillBatch {
                cu_seqlens: Some(&cu_seqlens.slice),
                seqs,
                total,
                max_seqlen,
            };
            let pc = cache.launch(&prefix_lens.slice);
            self.inner.attention_prefill(
                kernel,
                &q.slice,
                &k.slice,
                &v.slice,
                &mut out.slice,
                &batch,
                hq,
                hkv,
                window,
                scale_log2,
                Some((&k_cache.slice, &v_cache.slice, &pc)),
            )
        }
        no_cuda!(self, kernel, window, scale_log2, prefix_lens, cu_seqlens)
    }

    /// The checks and the launch shared by [`Gpu::attention_kv_store_paged`] and [`Gpu::attention_kv_store_ring`].
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        op: &'static str,
        dims: &AttnDims,
        seqs: usize,
        cache: CacheShape<'_>,
        chunk: PrefillChunk<'_>,
        k_cache: &mut GpuBuffer<u16>,
        v_cache: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        let PrefillChunk {
            k,
            v,
            cu_seqlens,
            prefix_lens,
            total,
            max_seqlen,
            ..
        } = chunk;
        dims.validate(op)?;
        let (hkv, d) = (dims.kv_heads, dims.head_dim);
        crate::ensure_shape!(
            d.is_multiple_of(8),
            op,
            "head_dim must be a multiple of 8 (16-byte rows), got {d}"
        );
        crate::ensure_shape!(
            (1..=65535).contains(&seqs),
            op,
            "seqs must be 1..=65535 (grid limit), got {seqs}"
        );
        crate::ensure_shape!(
            max_seqlen <= total && (total == 0 || max_seqlen > 0),
            op,
            "max_seqlen ({max_seqlen}) must be in 1..=total ({total}) (0 only without tokens)"
        );
        check_batch(op, max_seqlen)?;
        crate::ensure_shape!(
            hkv.checked_mul(d)
                .and_then(|row| row.checked_mul(total))
                .is_some_and(|n| n <= i32::MAX as usize),
            op,
            "total ({total}) x kv_heads ({hkv}) x head_dim ({d}) must fit the kernel's 32-bit indices"
        );
        check_len_of(op, "k", k.len(), &[total, hkv, d])?;
        check_len_of(op, "v", v.len(), &[total, hkv, d])?;
        check_len(op, "cu_seqlens", cu_seqlens.len(), seqs + 1)?;
        check_len(op, "prefix_lens", prefix_lens.len(), seqs)?;
        let elements = cache.elements(op, seqs, hkv, d)?;
        check_len(op, cache.what(0), k_cache.len(), elements)?;
        check_len(op, cache.what(1), v_cache.len(), elements)?;
        if total == 0 || elements == 0 {
            return Ok(()); // nothing to store, or a ring of no slots (window 1)
        }
        #[cfg(feature = "cuda")]
        {
            let batch = PrefillBatch {
                cu_seqlens: Some(&cu_seqlens.slice),
                seqs,
                total,
                max_seqlen,
            };
            let cache = cache.launch(&prefix_lens.slice);
            // `attention_kv_store`: grid (ceil(max_seqlen * kv_heads * head_dim / 8 / 256), seqs).
            const NAME: &str = "attention_kv_store";
            let f = self.inner.function(Module::AttentionPrefill, NAME)?;
            let chunks = d / 8;
            let grid = (
                (batch.max_seqlen * hkv * chunks).div_ceil(256) as u32,
                batch.seqs as u32,
                1,
            );
            let cfg = launch_config(grid, (256, 1, 1), 0);
            let ints = [
                batch.total as i32,
                batch.max_seqlen as i32,
                hkv as i32,
                chunks as i32,
                cache.page_size as i32,
                cache.max_pages as i32,
                cache.num_pages as i32,
            ];
            let null: u64 = 0;
            // SAFETY: matches `attention_kv_store` in cuda/attention_prefill.cu (two const and two mutable bf16
            // pointers, cu_seqlens or null, prefix_lens, the block table or null, seven ints); checked above: k/v =
            // [total, kv_heads, head_dim] with head_dim a multiple of 8, the caches = [num_pages, kv_heads,
            // page_size, head_dim] with block_table = [seqs, max_pages] (or the ring [seqs, kv_heads, page_size,
            // head_dim]), prefix_lens = [seqs], cu_seqlens = [seqs + 1], every count within i32 and the grid within
            // CUDA's limits. The kernel clamps offsets, lengths and prefixes, and skips positions past the block
            // table and page ids >= num_pages, so it writes only inside the caches; 16-byte accesses are aligned
            // (row offsets are multiples of 8 elements of buffers the driver aligns to 256 bytes).
            unsafe {
                self.inner.launch_args(NAME, &f, cfg, |b| {
                    b.arg(&k.slice)
                        .arg(&v.slice)
                        .arg(&mut k_cache.slice)
                        .arg(&mut v_cache.slice);
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
                })
            }
        }
        no_cuda!(self, k_cache, v_cache)
    }

    #[allow(clippy::too_many_arguments)]
    fn prefill_checked(
        &self,
        variant: Option<&str>,
        dims: &AttnDims,
        scale: f32,
        window: Option<usize>,
        cu_seqlens: Option<&GpuBuffer<u32>>,
        seqs: usize,
        total: usize,
        max_seqlen: usize,
        q: &GpuBuffer<u16>,
        k: &GpuBuffer<u16>,
        v: &GpuBuffer<u16>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_prefill";
        let kernel = check_prefill(OP, variant, dims, scale, window, seqs, total, max_seqlen)?;
        let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
        check_len_of(OP, "q", q.len(), &[total, hq, d])?;
        check_len_of(OP, "k", k.len(), &[total, hkv, d])?;
        check_len_of(OP, "v", v.len(), &[total, hkv, d])?;
        check_len_of(OP, "out", out.len(), &[total, hq, d])?;
        if let Some(cu) = cu_seqlens {
            check_len(OP, "cu_seqlens", cu.len(), seqs + 1)?;
        }
        if total == 0 {
            return Ok(());
        }
        // A window at least as long as the longest sequence masks nothing: the kernel's "no window" (0).
        let window = window.filter(|&w| w < max_seqlen).unwrap_or(0);
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        #[cfg(feature = "cuda")]
        {
            let batch = PrefillBatch {
                cu_seqlens: cu_seqlens.map(|c| &c.slice),
                seqs,
                total,
                max_seqlen,
            };
            self.inner.attention_prefill(
                kernel,
                &q.slice,
                &k.slice,
                &v.slice,
                &mut out.slice,
                &batch,
                hq,
                hkv,
                window,
                scale_log2,
                None,
            )
        }
        no_cuda!(self, kernel, window, scale_log2)
    }
}

/// The launch [`Gpu::prefill_checked`] and [`Gpu::prefix_prefill`] share.
#[cfg(feature = "cuda")]
impl Device {
    /// One launch of `kernel` over the batch: grid (query tiles of the longest sequence, KV heads, sequences),
    /// one warp per `16 * warp_tiles` packed rows. With `prefix = Some((k_cache, v_cache, cache))` the
    /// prefix-mode kernel of the same tiling runs.
    #[allow(clippy::too_many_arguments)]
    fn attention_prefill(
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
        let smem = kernel.smem_bytes() as u32;
        let f = self.function_with_smem(Module::AttentionPrefill, name, smem)?;
        let group = q_heads / kv_heads;
        let grid = (
            (batch.max_seqlen * group).div_ceil(kernel.block_m) as u32,
            kv_heads as u32,
            batch.seqs as u32,
        );
        let cfg = launch_config(grid, (kernel.threads() as u32, 1, 1), smem);
        let (ti, mi, hq, hkv, wi) = (
            batch.total as i32,
            batch.max_seqlen as i32,
            q_heads as i32,
            kv_heads as i32,
            window as i32,
        );
        let null: u64 = 0;
        let (ps, mp, np) = prefix.as_ref().map_or((0, 0, 0), |(_, _, c)| {
            (c.page_size as i32, c.max_pages as i32, c.num_pages as i32)
        });
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
        unsafe {
            self.launch_args(name, &f, cfg, |b| {
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
                if let Some((kc, vc, cache)) = &prefix {
                    b.arg(*kc).arg(*vc);
                    match cache.block_table {
                        Some(t) => b.arg(t),
                        None => b.arg(&null),
                    };
                    b.arg(cache.prefix_lens).arg(&ps).arg(&mp).arg(&np);
                }
            })
        }
    }
}

/// Most tokens a prefix (and a chunk) may hold: the kernels' positions are 32-bit with room for both
/// (`AP_MAX_PREFIX` in cuda/attention_prefill.cu).
const MAX_POSITIONS: usize = 1 << 30;

/// The cache a prefix-mode prefill reads or a store writes, checked against its dims.
#[derive(Clone, Copy)]
enum CacheShape<'a> {
    Paged {
        block_table: &'a GpuBuffer<u32>,
        page_size: usize,
        max_pages: usize,
        num_pages: usize,
    },
    /// `slots = window - 1` per sequence and KV head.
    Ring { slots: usize },
}

impl CacheShape<'_> {
    /// Elements the K (and the V) buffer must hold, rows of `head_dim`; checks the block table's length.
    fn elements(
        &self,
        op: &'static str,
        seqs: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<usize, KernelError> {
        let (count, what) = match *self {
            CacheShape::Paged {
                block_table,
                page_size,
                max_pages,
                num_pages,
            } => {
                check_len_of(op, "block_table", block_table.len(), &[seqs, max_pages])?;
                (
                    num_pages
                        .checked_mul(kv_heads)
                        .and_then(|x| x.checked_mul(page_size)),
                    "num_pages x kv_heads x page_size",
                )
            }
            CacheShape::Ring { slots } => (
                seqs.checked_mul(kv_heads)
                    .and_then(|x| x.checked_mul(slots)),
                "seqs x kv_heads x (window - 1)",
            ),
        };
        count
            .and_then(|r| r.checked_mul(head_dim))
            .ok_or_else(|| KernelError::shape(op, format!("{what} x head_dim overflows")))
    }

    /// The names of the K and V buffers in errors.
    fn what(&self, i: usize) -> &'static str {
        match (self, i) {
            (CacheShape::Paged { .. }, 0) => "k_cache",
            (CacheShape::Paged { .. }, _) => "v_cache",
            (CacheShape::Ring { .. }, 0) => "k_ring",
            (CacheShape::Ring { .. }, _) => "v_ring",
        }
    }

    #[cfg(feature = "cuda")]
    fn launch<'b>(&self, prefix_lens: &'b cudarc::driver::CudaSlice<u32>) -> PrefixCache<'b>
    where
        Self: 'b,
    {
        match *self {
            CacheShape::Paged {
                block_table,
                page_size,
                max_pages,
                num_pages,
            } => PrefixCache {
                block_table: Some(&block_table.slice),
                prefix_lens,
                page_size,
                max_pages,
                num_pages,
            },
            CacheShape::Ring { slots } => PrefixCache {
                block_table: None,
                prefix_lens,
                page_size: slots,
                max_pages: 0,
                num_pages: 0,
            },
        }
    }
}

fn attn_dims(d: &PagedAttentionDims) -> AttnDims {
    AttnDims {
        q_heads: d.q_heads,
        kv_heads: d.kv_heads,
        head_dim: d.head_dim,
    }
}

/// The paged cache's own limits: positive counts, a block table whose span and a pool whose page ids fit the
/// kernels' 32-bit arithmetic.
fn check_paged_cache<'a>(
    op: &'static str,
    d: &PagedAttentionDims,
    block_table: &'a GpuBuffer<u32>,
) -> Result<CacheShape<'a>, KernelError> {
    crate::ensure_shape!(
        d.seqs > 0 && d.page_size > 0 && d.num_pages > 0 && d.max_pages_per_seq > 0,
        op,
        "seqs, page_size, num_pages and max_pages_per_seq must be positive, got {d:?}"
    );
    crate::ensure_shape!(
        d.max_pages_per_seq
            .checked_mul(d.page_size)
            .is_some_and(|n| n <= MAX_POSITIONS)
            && d.num_pages <= i32::MAX as usize,
        op,
        "max_pages_per_seq ({}) x page_size ({}) must be at most 2^30 tokens and num_pages ({}) below 2^31",
        d.max_pages_per_seq,
        d.page_size,
        d.num_pages
    );
    crate::ensure_shape!(
        cache_rows_fit(&[d.num_pages, d.kv_heads, d.page_size]),
        op,
        "the cache must hold at most 2^31 rows of head_dim (num_pages x kv_heads x page_size), got {} x {} x {}",
        d.num_pages,
        d.kv_heads,
        d.page_size
    );
    Ok(CacheShape::Paged {
        block_table,
        page_size: d.page_size,
        max_pages: d.max_pages_per_seq,
        num_pages: d.num_pages,
    })
}

/// A ring's window: at least 1 token and at most 2^30 (32-bit positions).
fn check_ring(
    op: &'static str,
    dims: &AttnDims,
    seqs: usize,
    window: usize,
) -> Result<CacheShape<'static>, KernelError> {
    dims.validate(op)?;
    crate::ensure_shape!(
        (1..=MAX_POSITIONS).contains(&window),
        op,
        "a sliding window must hold 1..=2^30 tokens, got {window}"
    );
    crate::ensure_shape!(seqs > 0, op, "seqs must be positive");
    crate::ensure_shape!(
        cache_rows_fit(&[seqs, dims.kv_heads, window - 1]),
        op,
        "the ring must hold at most 2^31 rows of head_dim (seqs x kv_heads x (window - 1)), got {seqs} x {} x {}",
        dims.kv_heads,
        window - 1
    );
    Ok(CacheShape::Ring { slots: window - 1 })
}

/// Whether a cache of `dims` rows (their product) fits the prefix-mode kernels' 32-bit row codes: rows below 2^31,
/// the top bit marking a new token (cuda/attention_prefill.cu, `AP_ROW_NEW`). 2^31 rows of K alone are 256 GiB
/// at head_dim 64.
fn cache_rows_fit(dims: &[usize]) -> bool {
    dims.iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .is_some_and(|rows| rows <= 1 << 31)
}

/// Chunks below 2^30 tokens: with a prefix of at most 2^30, every position (and prefix + chunk) stays below 2^31.
fn check_batch(op: &'static str, max_seqlen: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        max_seqlen < MAX_POSITIONS,
        op,
        "max_seqlen ({max_seqlen}) must be below 2^30"
    );
    Ok(())
}

/// Every check of the prefill entry points that does not need a buffer; returns the kernel to launch.
#[allow(clippy::too_many_arguments)]
fn check_prefill(
    op: &'static str,
    variant: Option<&str>,
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    seqs: usize,
    total: usize,
    max_seqlen: usize,
) -> Result<&'static PrefillKernel, KernelError> {
    dims.validate(op)?;
    crate::ensure_shape!(
        Gpu::ATTENTION_PREFILL_HEAD_DIMS.contains(&dims.head_dim),
        op,
        "head_dim must be 64, 128 or 256, got {}",
        dims.head_dim
    );
    crate::ensure_shape!(scale.is_finite(), op, "scale must be finite, got {scale}");
    crate::attention::check_window(op, window)?;
    crate::ensure_shape!(
        (1..=65535).contains(&seqs) && dims.kv_heads <= 65535,
        op,
        "seqs ({seqs}) must be 1..=65535 and kv_heads ({}) at most 65535 (grid limits)",
        dims.kv_heads
    );
    crate::ensure_shape!(
        max_seqlen <= total || (total == 0 && max_seqlen == 0),
        op,
        "max_seqlen ({max_seqlen}) cannot exceed the total token count ({total})"
    );
    crate::ensure_shape!(
        total == 0 || max_seqlen > 0,
        op,
        "max_seqlen must be positive when there are tokens (total = {total})"
    );
    let group = dims.q_heads / dims.kv_heads;
    crate::ensure_shape!(
        dims.q_heads
            .checked_mul(dims.head_dim)
            .and_then(|row| row.checked_mul(total))
            .is_some_and(|n| n <= i32::MAX as usize)
            && max_seqlen
                .checked_mul(group)
                .is_some_and(|n| n <= i32::MAX as usize),
        op,
        "total ({total}) x q_heads ({}) x head_dim ({}) must fit the kernel's 32-bit token indices",
        dims.q_heads,
        dims.head_dim
    );
    let kernel = match variant {
        None => default_kernel(dims.head_dim, dims.q_heads, total),
        Some(name) => kernels_for(dims.head_dim).find(|k| k.variant == name),
    };
    kernel.ok_or_else(|| {
        KernelError::shape(
            op,
            format!(
                "no prefill tiling {:?} for head_dim {} (built: {:?})",
                variant.unwrap_or("default"),
                dims.head_dim,
                kernels_for(dims.head_dim)
                    .map(|k| k.variant)
                    .collect::<Vec<_>>()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(hq: usize, hkv: usize, d: usize) -> AttnDims {
        AttnDims {
            q_heads: hq,
            kv_heads: hkv,
            head_dim: d,
        }
    }

    fn err(r: Result<&'static PrefillKernel, KernelError>) -> String {
        match r {
            Ok(k) => panic!("accepted, kernel {}", k.name),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_prefill_shapes_are_refused() {
        let ok = dims(24, 4, 256);
        assert!(check_prefill("t", None, &ok, 0.06, None, 1, 100, 100).is_ok());
        assert!(err(check_prefill(
            "t",
            None,
            &dims(24, 5, 256),
            0.1,
            None,
            1,
            9,
            9
        ))
        .contains("multiple"));
        assert!(err(check_prefill(
            "t",
            None,
            &dims(8, 4, 96),
            0.1,
            None,
            1,
            9,
            9
        ))
        .contains("64, 128 or 256"));
        assert!(err(check_prefill("t", None, &ok, f32::NAN, None, 1, 9, 9)).contains("finite"));
        assert!(err(check_prefill("t", None, &ok, 0.1, Some(0), 1, 9, 9)).contains("at least 1"));
        assert!(err(check_prefill("t", None, &ok, 0.1, None, 0, 9, 9)).contains("seqs"));
        assert!(err(check_prefill("t", None, &ok, 0.1, None, 1, 9, 10)).contains("max_seqlen"));
        assert!(err(check_prefill("t", None, &ok, 0.1, None, 1, 9, 0)).contains("max_seqlen"));
        assert!(err(check_prefill(
            "t",
            Some("M1_W1_N1_S1"),
            &ok,
            0.1,
            None,
            1,
            9,
            9
        ))
        .contains("no prefill tiling"));
        assert!(err(check_prefill(
            "t",
            None,
            &ok,
            0.1,
            None,
            1,
            1 << 30,
            1 << 30
        ))
        .contains("32-bit"));
    }

    /// Every kernel the default table can pick, for each head dim over batches from one row tile to far past the
    /// table's bounds, is in this build's `cuda/attention_prefill.cu` (plain and paged forms, and the K/V store),
    /// and without `lab` nothing else is; the list comes from the PTX (`build_cuda.rs`).
    #[cfg(feature = "cuda")]
    #[test]
    fn every_default_prefill_kernel_is_embedded() {
        let entries = Module::AttentionPrefill.entries();
        let mut seen = std::collections::BTreeSet::from(["attention_kv_store"]);
        for d in [64, 128, 256] {
            for q_heads in [1, 4, 8, 16, 24, 64] {
                for total in [1, 7, 64, 128, 1000, 4096, 1 << 20] {
                    let k =
                        default_kernel(d, q_heads, total).expect("a default for every head dim");
                    seen.extend([k.name, k.paged_name]);
                }
            }
        }
        for k in &seen {
            assert!(entries.contains(k), "{k} is not embedded");
        }
        #[cfg(not(feature = "lab"))]
        assert_eq!(entries, seen.into_iter().collect::<Vec<_>>());
        #[cfg(feature = "lab")]
        for k in PREFILL_LAB_KERNELS {
            assert!(
                entries.contains(&k.name) && entries.contains(&k.paged_name),
                "{}",
                k.name
            );
        }
    }

    #[test]
    fn every_head_dim_has_a_default_and_the_names_match_the_tilings() {
        for d in [64, 128, 256] {
            let v = kernels_for(d).map(|k| k.variant).collect::<Vec<_>>();
            assert!(!v.is_empty(), "head_dim {d}");
            for k in kernels_for(d) {
                assert_eq!(
                    k.name,
                    format!("attention_prefill_D{d}_{}", k.variant),
                    "kernel name"
                );
                assert_eq!(
                    k.variant,
                    format!(
                        "M{}_W{}_N{}_S{}",
                        k.block_m, k.warp_tiles, k.block_n, k.stages
                    )
                );
                assert!(
                    k.block_m.is_multiple_of(16 * k.warp_tiles)
                        && k.block_n.is_multiple_of(16)
                        && k.stages >= 2
                );
                assert!((32..=1024).contains(&k.threads()));
                assert!(k.smem_bytes() <= 227 * 1024, "{}", k.name);
            }
        }
        assert!(kernels_for(96).next().is_none());
    }

    #[test]
    fn the_default_table_names_built_tilings_and_follows_the_measurements() {
        for &(d, _, v) in PREFILL_DEFAULTS {
            assert!(
                kernels_for(d)
                    .map(|k| k.variant)
                    .collect::<Vec<_>>()
                    .contains(&v),
                "default {v} of head_dim {d} is not built"
            );
        }
        for d in [64, 128, 256] {
            // A row with bound 0 exists, so every call of a supported head dim has a default.
            assert!(Gpu::attention_prefill_default(d, 1, 1).is_some(), "{d}");
            assert!(
                Gpu::attention_prefill_default(d, 64, 1 << 20).is_some(),
                "{d}"
            );
        }
        assert_eq!(Gpu::attention_prefill_default(96, 8, 100), None);
        // The H200 bests of `benchmarks/h200.md` (D128 T=4096: 558 us vs the best 553, within 1%).
        let pick = |d, hq, t| Gpu::attention_prefill_default(d, hq, t).unwrap();
        assert_eq!(pick(256, 24, 1024), "M64_W1_N64_S2");
        assert_eq!(pick(256, 24, 4096), "M128_W1_N64_S2");
        assert_eq!(pick(256, 24, 16384), "M128_W1_N64_S2");
        assert_eq!(pick(128, 32, 1024), "M64_W1_N64_S2");
        assert_eq!(pick(128, 32, 4096), "M128_W2_N64_S2");
        assert_eq!(pick(128, 32, 16384), "M128_W2_N64_S2");
    }

    #[test]
    fn cache_limits_are_checked() {
        let d = PagedAttentionDims {
            seqs: 2,
            q_heads: 8,
            kv_heads: 2,
            head_dim: 128,
            page_size: 16,
            num_pages: 10,
            max_pages_per_seq: 4,
        };
        // Only the shape checks that need no buffer: the block table is borrowed but not read here.
        assert!(check_ring("t", &attn_dims(&d), 2, 0).is_err());
        assert!(check_ring("t", &attn_dims(&d), 2, (1 << 30) + 1).is_err());
        assert!(check_ring("t", &attn_dims(&d), 0, 8).is_err());
        assert!(matches!(
            check_ring("t", &attn_dims(&d), 2, 8),
            Ok(CacheShape::Ring { slots: 7 })
        ));
        assert!(check_batch("t", (1 << 30) - 1).is_ok());
        assert!(check_batch("t", 1 << 30).is_err());
        // Ring rows and the 32-bit row codes of the prefix-mode kernels: 2^20 seqs x 2 heads x 2^10 slots is 2^31
        // rows (the last row 2^31 - 1 fits), one slot more does not.
        assert!(check_ring("t", &attn_dims(&d), 1 << 20, (1 << 10) + 2)
            .is_err_and(|e| e.to_string().contains("2^31 rows")));
        assert!(check_ring("t", &attn_dims(&d), 1 << 20, (1 << 10) + 1).is_ok());
        assert!(cache_rows_fit(&[1 << 20, 2, 1 << 10]));
        assert!(!cache_rows_fit(&[(1 << 20) + 1, 2, 1 << 10]));
        assert!(!cache_rows_fit(&[usize::MAX, 2]));
    }
}
