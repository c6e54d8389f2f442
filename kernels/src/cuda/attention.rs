//! Decode attention over a paged KV cache or a sliding-window ring (`kernels/cuda/attention.cu`): the checks,
//! then the launches of the split kernel and of the combine that weighs its partials.

#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};

#[cfg(feature = "cuda")]
use super::device::{cuda_err, launch_config, poisoned, Device, Module, PdlArgs};
use super::{
    check_len, check_len_of, DecodeKernels, Gpu, GpuBuffer, KernelPath, PagedAttentionDims,
    PagedKvCache, RingKvCache,
};
use crate::KernelError;

impl Gpu {
    /// Decode attention (one query token per sequence) over a paged bf16 KV cache.
    ///
    /// Layouts are those of [`crate::attention`] with a bf16 cache: `q`: fp32 `[seqs, q_heads, head_dim]`;
    /// `kv.k`, `kv.v`: bf16 bits `[num_pages, kv_heads, page_size, head_dim]`; `kv.block_table`:
    /// `[seqs, max_pages_per_seq]` page ids; `kv.seq_lens`: `[seqs]` tokens in each sequence's cache, the current
    /// token's K/V already written (a length past the table is clamped, a page id past the pool is skipped);
    /// `out`: fp32 `[seqs, q_heads, head_dim]`; `scale` multiplies `q . k` (usually `1/sqrt(head_dim)`).
    /// Query heads `g*r .. g*r + r` (`r = q_heads / kv_heads`) read KV head `g`, and each block computes all `r`
    /// of them, so K and V are read once per KV head. `splits` blocks share one (sequence, KV head) over the
    /// context (flash-decoding); `splits = 0` picks a count that fills the GPU.
    ///
    /// Same as [`Gpu::attention_decode_paged_with`] with [`KernelPath::Auto`]: the tiled tensor-core kernel,
    /// [`DecodeKernels::PAGED_AUTO`] (any group size 1-8).
    pub fn attention_decode_paged(
        &self,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        kv: PagedKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.attention_decode_paged_with(KernelPath::Auto, dims, q, kv, scale, splits, out)
    }

    lab_pub! {
    /// [`Gpu::attention_decode_paged`] on a chosen kernel family (tests and benchmarks drive each one).
    /// [`KernelPath::Auto`] and [`KernelPath::TensorCores`] run the tiled tensor-core kernel
    /// ([`Gpu::attention_decode_paged_tiled`] with [`DecodeKernels::PAGED_AUTO`]): group sizes 1-8, the query and the
    /// probabilities rounded to bf16 (~1e-3 relative error). [`KernelPath::CudaCores`] runs the fp32 kernel
    /// `attention_decode_split_*` (~1e-6 relative error; group sizes 1, 2, 4, 6 and 8; 2-2.5x slower).
    #[allow(clippy::too_many_arguments)]
    fn attention_decode_paged_with(
        &self,
        path: KernelPath,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        kv: PagedKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_decode_paged";
        if !matches!(path, KernelPath::CudaCores) {
            return self.paged_tiled(
                OP,
                DecodeKernels::PAGED_AUTO,
                dims,
                q,
                kv,
                scale,
                splits,
                out,
            );
        }
        let d = dims;
        check_paged_counts(OP, d)?;
        crate::ensure_shape!(
            d.q_heads.is_multiple_of(d.kv_heads)
                && matches!(d.q_heads / d.kv_heads, 1 | 2 | 4 | 6 | 8),
            OP,
            "q_heads ({}) must be 1, 2, 4, 6 or 8 times kv_heads ({}) on the CUDA cores, the built instantiations",
            d.q_heads,
            d.kv_heads
        );
        crate::ensure_shape!(
            matches!(d.head_dim, 64 | 128 | 256),
            OP,
            "head_dim must be 64, 128 or 256, got {}",
            d.head_dim
        );
        crate::ensure_shape!(
            d.seqs <= 65535 && d.kv_heads <= 65535,
            OP,
            "seqs and kv_heads must be at most 65535"
        );
        crate::ensure_shape!(
            splits <= 1024,
            OP,
            "splits must be at most 1024, got {splits}"
        );
        crate::ensure_shape!(scale.is_finite(), OP, "scale must be finite, got {scale}");
        check_paged_lens(OP, d, q, kv, out)?;
        #[cfg(feature = "cuda")]
        {
            // The CUDA-core kernel `attention_decode_split_D*_R*`.
            let dev = &self.inner;
            let splits = if splits == 0 {
                dev.auto_splits(d)
            } else {
                splits
            };
            let r = d.q_heads / d.kv_heads;
            let split_name = attention_split_name(d.head_dim, r).ok_or_else(|| {
                KernelError::shape(
                    OP,
                    format!("q_heads / kv_heads must be 1, 2, 4, 6 or 8, got {r}"),
                )
            })?;
            let f = dev.function(Module::Attention, split_name)?;
            // One warp per two query heads (per head when the group size is odd), as cuda/attention.cu's AttGeom.
            let warps = if r.is_multiple_of(2) { r / 2 } else { r };
            // The CUDA-core path is the accuracy arm, so it keeps the block combine (`sliced` false) it was measured
            // with; the tiled paths use Gpu::DECODE_AUTO_SLICED_COMBINE.
            // SAFETY: `attention_decode_split_D*_R*` in cuda/attention.cu takes the paged parameter list with
            // `warps` warps and no dynamic shared memory; every buffer was checked against dims above.
            unsafe {
                dev.launch_paged_decode(split_name, &f, 32 * warps as u32, 0, false, d, q, kv, scale, splits, out)
            }
        }
        no_cuda!(self)
    }
    }
}

/// Largest row index (`(page * kv_heads + head) * page_size + slot`, or `(seq * kv_heads + head) * (window - 1) +
/// slot` for a ring) the tiled kernels address: they carry row indices in 32 bits, with the top two values as
/// markers (cuda/attention.cu, `TD_INVALID`, `TD_CURRENT`). 2^31 rows is 1 TiB of bf16 K at head_dim 256.
const TILED_MAX_ROWS: usize = 1 << 31;

/// Most tokens one sequence may span (block-table width x page size, or ring slots): the kernels split lengths
/// in 32-bit arithmetic with up to 1024 splits of tile-rounded size, which 2^30 keeps far from overflow.
const TILED_MAX_TOKENS: usize = 1 << 30;

impl Gpu {
    /// The tilings the tiled decode kernels are built for, `(tokens per pipeline stage, stages)`. (32, 3): 2
    /// blocks per multiprocessor at head_dim 256; (16, 4) and (32, 2): 3 blocks. Each keeps 96-144 KiB of K/V in
    /// flight per multiprocessor (cuda/attention.cu explains the count); the benchmark
    /// `kernels/bench/h200/bench_attention_decode.py` compares them.
    pub const DECODE_TILINGS: [(usize, usize); 3] = [(32, 3), (16, 4), (32, 2)];

    /// The tiling of [`KernelPath::Auto`] (paged): 16 tokens per stage, 4 stages, 3 blocks per multiprocessor
    /// (2 used: [`Gpu::decode_auto_splits`]). Measured on the H200 with the two-kernel combine
    /// (`benchmarks/h200.md`, Qwen 24q/4kv x 256, pages of 64), (16, 4)
    /// against (32, 2), the previous default, both at the same split count: B=1 4k 12.28 vs 12.80 us, 8k 16.33 vs
    /// 16.92, 32k 40.62 vs 40.87 (78.8% of copy bandwidth), 64k 70.35 vs 71.10, 128k 129.04 vs 130.22; B=8 x 8k
    /// 71.19 vs 71.48; B=32 x 4k 135.71 vs 136.50. (32, 3) was slower than both everywhere. (In an earlier run, before
    /// the split count was fixed to one wave, (32, 2) had won; the ring keeps it: [`Gpu::DECODE_RING_TILING`].)
    ///
    /// A folded combine (the last block of each group of 8 splits weighing the group's partials, the last group
    /// the rest, through device counters; no second kernel) was built and measured in the same run and lost
    /// everywhere but B=32: B=1 paged 4k 18.72 vs 12.80 us (Auto then, (32, 2) with the combine kernel), 8k 23.58
    /// vs 16.92, 32k 49.09 vs 40.87, 64k 79.36 vs 71.10, 128k 136.96 vs 130.22; B=32 x 4k 131.09 vs 136.50; ring
    /// B=8 even (39.06 vs 38.75). It was removed. Why, as far as the numbers say: the fold turns the combine's
    /// wide work (24 blocks of 1024 threads at B=1, every thread with its loads in flight) into a serial tail
    /// after the last K/V tile: one 128-thread block per group of 8 splits weighs 6 heads x 8 partials in 6
    /// passes over the columns, then, after a fence and a counter round trip, one block per (sequence, KV head),
    /// four at B=1, weighs 6 heads x 9 group partials the same way while the other SMs sit idle. That tail (the
    /// fold minus the split kernel alone: 9.4 us at 4k, 12.3 us at 32k) cost more than the whole combine kernel
    /// with its launch (3.5-4.1 us). Only at B=32, where 2 splits leave the tail short and the combine kernel
    /// spent 10.9 us in 768 barrier-bound blocks of 1024 threads, did it win.
    pub const DECODE_AUTO_TILING: (usize, usize) = (16, 4);

    /// The tiling of [`Gpu::attention_decode_ring`]: 32 tokens per stage, 2 stages. Measured on the H200
    /// (`benchmarks/h200.md`), (32, 2) against (16, 4): Spark 16q/4kv x 256 B=1
    /// W=1024 8.84 vs 9.23 us, W=4096 11.63 vs 11.84; B=8 W=4096 38.75 vs 38.63; Gemma 4q/1kv x 256 B=32 W=1024
    /// 15.12 vs 14.98: (32, 2) wins the two B=1 cases (the ones a decode step waits on) by 2-4% and loses the
    /// batched ones by 0.3-0.9%, within the runs' spread.
    pub const DECODE_RING_TILING: (usize, usize) = (32, 2);

    /// Whether [`KernelPath::Auto`] and [`Gpu::attention_decode_ring`] ([`DecodeKernels::PAGED_AUTO`],
    /// [`DecodeKernels::RING_AUTO`], [`DecodeKernels::with_tiling`]) reduce the split partials with the sliced combine kernel
    /// (`attention_decode_combine_sliced_D*`: one block per 64 columns of each (sequence, query head), each warp
    /// with all its loads in flight before any reduction) instead of the block one (`attention_decode_combine_D*`:
    /// one block per (sequence, query head), a round trip for the split maxima first). Measured on the H200
    /// (`benchmarks/h200.md`, the same split kernel and partials, arms
    /// alternating), whole call in us, block combine / sliced combine (the combine's own share in brackets):
    ///
    /// | case (paged, 24q/4kv x 256, Auto tiling (16, 4)) | block | sliced |
    /// |---|---:|---:|
    /// | B=1 4k / 8k | 12.05 / 16.01 (3.43 / 3.49) | **11.48 / 15.42** (2.86 / 2.90) |
    /// | B=1 32k / 64k / 128k | 40.81 / 71.08 / 130.81 (4.15 / 3.90 / 3.72) | **39.89 / 70.33 / 130.09** (3.23 / 3.16 / 3.00) |
    /// | B=8 x 8k / B=32 x 4k | 71.07 / 137.49 (4.80 / 11.05) | **68.61 / 130.22** (2.34 / 3.78) |
    /// | ring B=1 W=1024 / 4096, B=8 W=4096, Gemma B=32 (tiling (32, 2)) | 8.62 / 11.09 / 38.82 / 14.95 | **7.53 / 10.59 / 38.02 / 14.15** |
    ///
    /// The sliced combine wins every case, so it is the one used. At 32k that was 79.8% of copy bandwidth (copy
    /// 4.22 TB/s in that run), 0.2 points under the 80% target; 64k 89.5%, 128k 97.3%. Now the
    /// combine is launched as the split kernel's programmatic dependent (`Device::launch_pdl`), so its blocks
    /// are resident when the partials land: 32k 39.18 / 39.57 / 39.60 us (80.1-81.8% of copy)
    /// against 39.67 / 39.89 us plainly. The block combine stays selectable ([`DecodeKernels`]`::sliced_combine`)
    /// as the measured comparison; `combines_agree_over_ragged_batches` passed on the H200.
    pub const DECODE_AUTO_SLICED_COMBINE: bool = true;

    /// [`Gpu::attention_decode_paged`] (same layouts, same clamping of lengths and skipping of bad page ids) on
    /// the tiled tensor-core kernels `kernels` names: `attention_decode_tiled_*` on `kernels.tiling`, one of
    /// [`Gpu::DECODE_TILINGS`], then with more than one split the combine `kernels.sliced_combine` picks (see
    /// [`Gpu::DECODE_AUTO_SLICED_COMBINE`]; the two weigh the same partials and differ by fp32 rounding). Any group
    /// size `q_heads / kv_heads` from 1 to 8; the query and the probabilities are rounded to bf16 (~1e-3 relative
    /// error). `splits = 0` picks the count of [`Gpu::decode_auto_splits`]. Tests and benchmarks drive each
    /// tiling and combine; `DecodeKernels::PAGED_AUTO` is what `Auto` runs.
    #[allow(clippy::too_many_arguments)]
    #[cfg(feature = "lab")]
    pub fn attention_decode_paged_tiled(
        &self,
        kernels: DecodeKernels,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        kv: PagedKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.paged_tiled(
            "cuda::attention_decode_paged_tiled",
            kernels,
            dims,
            q,
            kv,
            scale,
            splits,
            out,
        )
    }

    /// The split count `splits = 0` picks for the tiled kernels (paged and ring): `pairs` (sequence, KV head)
    /// pairs of up to `max_tokens` tokens each, on `sms` multiprocessors. One wave of at most two blocks per
    /// multiprocessor (fewer where `tiling`'s shared memory allows fewer: 228 KiB less 1 KiB per block): the
    /// largest count whose grid (`splits x pairs` blocks) fits those slots, so every block runs from the start
    /// and all end together; 1 when the pairs alone fill them (no partials, no combine kernel); at most one split
    /// per two tiles of `max_tokens`, at most 1024. Measured on the H200 at head_dim 256 with (32, 2), which fits
    /// three blocks per multiprocessor (`benchmarks/h200.md`): two per multiprocessor was the fastest
    /// split count in every case: B=1 at 8k-128k (66 splits against 99: 40.2 vs 42.5 us at 32k, 79.7% of copy
    /// bandwidth), B=8 x 8k (8: 70.7 vs 72.5 us), B=32 x 4k (2: 135.6 vs 136.3 us), the ring at B=8 and 32 (8).
    /// Fewer, longer splits read as fast and leave the combine kernel less to do (3.5-11.6 us of those calls).
    /// (A count rounded up instead overshot the wave: at B=8 x 8k, 416 blocks on 396 slots ran at 73% of copy
    /// bandwidth.) Public so the benchmark and the tests can state what Auto ran.
    pub fn decode_auto_splits(
        tiling: (usize, usize),
        head_dim: usize,
        sms: usize,
        pairs: usize,
        max_tokens: usize,
    ) -> usize {
        // Saturating: any arguments give a count (never a panic); the built tilings and head dims are small.
        // Shared memory as tiled_smem: K/V stages, score partials, masks.
        let (tile, stages) = (tiling.0.max(1), tiling.1);
        let smem = stages
            .saturating_mul(4)
            .saturating_mul(tile)
            .saturating_mul(head_dim)
            .saturating_add(tile.saturating_mul(256))
            .saturating_add(stages.saturating_mul(16));
        let per_sm = (228 * 1024 / smem.saturating_add(1024)).clamp(1, 2);
        let slots = per_sm.saturating_mul(sms.max(1));
        let one_wave = slots / pairs.max(1);
        one_wave
            .min(max_tokens.div_ceil(tile.saturating_mul(2)))
            .clamp(1, 1024)
    }

    /// Multiprocessors of this GPU (what [`Gpu::decode_auto_splits`] fills).
    pub fn sm_count(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.inner.sm_count()
        }
        no_cuda!(self)
    }

    /// The checks and the launch of the tiled paged kernel.
    #[allow(clippy::too_many_arguments)]
    fn paged_tiled(
        &self,
        op: &'static str,
        kernels: DecodeKernels,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        kv: PagedKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        let t = tiling_index(op, kernels.tiling)?;
        let sliced = kernels.sliced_combine;
        let d = dims;
        check_paged_counts(op, d)?;
        check_heads(op, d.q_heads, d.kv_heads, d.head_dim, d.seqs, splits, scale)?;
        crate::ensure_shape!(
            d.num_pages
                .checked_mul(d.kv_heads)
                .and_then(|x| x.checked_mul(d.page_size))
                .is_some_and(|rows| rows <= TILED_MAX_ROWS)
                && d
                    .max_pages_per_seq
                    .checked_mul(d.page_size)
                    .is_some_and(|c| c <= TILED_MAX_TOKENS),
            op,
            "the cache must hold at most 2^31 rows of head_dim (num_pages x kv_heads x page_size) and a block table \
             at most 2^30 tokens, got {d:?}"
        );
        check_paged_lens(op, d, q, kv, out)?;
        #[cfg(feature = "cuda")]
        {
            // The tiled paged kernel `attention_decode_tiled_*`, then with more than one split the combine.
            let dev = &self.inner;
            let max_tokens = d.max_pages_per_seq * d.page_size;
            let splits = dev.tiled_splits(d.seqs * d.kv_heads, d.head_dim, t, max_tokens, splits);
            let (f, name, smem) = dev.tiled_function(false, d.head_dim, t)?;
            // SAFETY: `attention_decode_tiled_D*_T*_S*` in cuda/attention.cu takes the paged parameter list with 4
            // warps and its TiledGeom shared memory; every buffer was checked against dims above, and that rows and
            // the table fit the kernel's 32-bit indices.
            unsafe {
                dev.launch_paged_decode(name, &f, 128, smem, sliced, d, q, kv, scale, splits, out)
            }
        }
        no_cuda!(self, t, sliced)
    }

    /// Decode over a sliding-window ring (sliding layers), as [`crate::attention::decode_ring`] with a bf16
    /// cache: `q`, `out`: fp32 `[seqs, q_heads, head_dim]`; `kv.k_ring`, `kv.v_ring`: bf16 bits `[seqs, kv_heads,
    /// window - 1, head_dim]`; `kv.k_cur`, `kv.v_cur`: bf16 bits `[seqs, kv_heads, head_dim]`, the current token's
    /// key and value; `kv.pos`: `[seqs]`, the current token's position. Sequence `b` attends ring slots
    /// `0..min(pos[b], window - 1)` (in any order: token `p` lives in slot `p % (window - 1)`) plus the current
    /// token. Grouped-query packed and split over the ring as the paged kernel (any group size 1-8, head_dim
    /// 64/128/256); `splits = 0` picks one wave ([`Gpu::decode_auto_splits`]). Runs [`DecodeKernels::RING_AUTO`].
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode_ring(
        &self,
        dims: &crate::shapes::AttnDims,
        seqs: usize,
        q: &GpuBuffer<f32>,
        kv: RingKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.attention_decode_ring_with(
            DecodeKernels::RING_AUTO,
            dims,
            seqs,
            q,
            kv,
            scale,
            splits,
            out,
        )
    }

    lab_pub! {
    /// [`Gpu::attention_decode_ring`] on the kernels `kernels` names (tiling one of [`Gpu::DECODE_TILINGS`], and
    /// the combine, as [`Gpu::attention_decode_paged_tiled`]).
    #[allow(clippy::too_many_arguments)]
    fn attention_decode_ring_with(
        &self,
        kernels: DecodeKernels,
        dims: &crate::shapes::AttnDims,
        seqs: usize,
        q: &GpuBuffer<f32>,
        kv: RingKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        let op = "cuda::attention_decode_ring";
        let t = tiling_index(op, kernels.tiling)?;
        let sliced = kernels.sliced_combine;
        let RingKvCache {
            window,
            k_ring,
            v_ring,
            k_cur,
            v_cur,
            pos,
        } = kv;
        dims.validate(op)?;
        crate::ensure_shape!(seqs > 0, op, "seqs must be positive");
        check_heads(
            op,
            dims.q_heads,
            dims.kv_heads,
            dims.head_dim,
            seqs,
            splits,
            scale,
        )?;
        crate::attention::check_window(op, Some(window))?;
        let slots = window - 1;
        crate::ensure_shape!(
            seqs.checked_mul(dims.kv_heads)
                .and_then(|x| x.checked_mul(slots))
                .is_some_and(|rows| rows <= TILED_MAX_ROWS)
                && slots < TILED_MAX_TOKENS,
            op,
            "the ring must hold at most 2^31 rows (seqs x kv_heads x (window - 1)), got {seqs} x {} x {slots}",
            dims.kv_heads
        );
        let (hq, hkv, hd) = (dims.q_heads, dims.kv_heads, dims.head_dim);
        check_len_of(op, "q", q.len(), &[seqs, hq, hd])?;
        check_len_of(op, "k_ring", k_ring.len(), &[seqs, hkv, slots, hd])?;
        check_len_of(op, "v_ring", v_ring.len(), &[seqs, hkv, slots, hd])?;
        check_len_of(op, "k_cur", k_cur.len(), &[seqs, hkv, hd])?;
        check_len_of(op, "v_cur", v_cur.len(), &[seqs, hkv, hd])?;
        check_len(op, "pos", pos.len(), seqs)?;
        check_len_of(op, "out", out.len(), &[seqs, hq, hd])?;
        #[cfg(feature = "cuda")]
        {
            // The ring kernel `attention_decode_ring_*`, then the combine as the tiled paged path.
            let dev = &self.inner;
            let d = dims;
            let splits = dev.tiled_splits(seqs * d.kv_heads, d.head_dim, t, slots + 1, splits);
            let (f, name, smem) = dev.tiled_function(true, d.head_dim, t)?;
            let mut ws_guard =
                dev.attention_workspace(seqs * d.q_heads * splits * (d.head_dim + 2))?;
            let Some(ws) = ws_guard.as_mut() else {
                return Err(KernelError::Cuda(
                    "attention workspace was not allocated".into(),
                ));
            };
            let (hq, hkv, sl) = (d.q_heads as i32, d.kv_heads as i32, slots as i32);
            let grid = (splits as u32, d.kv_heads as u32, seqs as u32);
            let cfg = launch_config(grid, (128, 1, 1), smem);
            // SAFETY: matches `attention_decode_ring_D*_T*_S*` in cuda/attention.cu with 4 warps and its TiledGeom
            // shared memory; the ring ([seqs, kv_heads, slots, head_dim]), the current rows, pos and out were
            // checked above, and that ring rows fit 32 bits; the kernel reads min(pos, slots) slots per (sequence,
            // KV head); the workspace holds seqs * q_heads * splits * (head_dim + 2) floats.
            unsafe { dev.launch_args(name, &f, cfg, |b| {
            b.arg(&q.slice)
                .arg(&k_ring.slice)
                .arg(&v_ring.slice)
                .arg(&k_cur.slice)
                .arg(&v_cur.slice)
                .arg(&pos.slice)
                .arg(&scale)
                .arg(&mut out.slice)
                .arg(&mut *ws);
            b.arg(&hq).arg(&hkv).arg(&sl);
            }) }?;
            if splits > 1 {
                dev.attention_combine(sliced, d.head_dim, d.q_heads, seqs, splits, ws, &mut out.slice)?;
            }
            Ok(())
        }
        no_cuda!(self, t, sliced)
    }
    }
}

/// The counts of a paged decode call, each at least 1.
fn check_paged_counts(op: &'static str, d: &PagedAttentionDims) -> Result<(), KernelError> {
    crate::ensure_shape!(
        d.seqs > 0 && d.q_heads > 0 && d.kv_heads > 0 && d.page_size > 0 && d.num_pages > 0,
        op,
        "every count must be positive, got {d:?}"
    );
    Ok(())
}

/// The lengths of a paged decode call's buffers against its dims (the layouts of [`Gpu::attention_decode_paged`]).
fn check_paged_lens(
    op: &'static str,
    d: &PagedAttentionDims,
    q: &GpuBuffer<f32>,
    kv: PagedKvCache<'_>,
    out: &GpuBuffer<f32>,
) -> Result<(), KernelError> {
    let cache = [d.num_pages, d.page_size, d.kv_heads, d.head_dim];
    check_len_of(op, "q", q.len(), &[d.seqs, d.q_heads, d.head_dim])?;
    check_len_of(op, "k_cache", kv.k.len(), &cache)?;
    check_len_of(op, "v_cache", kv.v.len(), &cache)?;
    check_len_of(
        op,
        "block_table",
        kv.block_table.len(),
        &[d.seqs, d.max_pages_per_seq],
    )?;
    check_len(op, "seq_lens", kv.seq_lens.len(), d.seqs)?;
    check_len_of(op, "out", out.len(), &[d.seqs, d.q_heads, d.head_dim])
}

/// Index of `tiling` in [`Gpu::DECODE_TILINGS`], or a shape error naming the built ones.
fn tiling_index(op: &'static str, tiling: (usize, usize)) -> Result<usize, KernelError> {
    Gpu::DECODE_TILINGS
        .iter()
        .position(|&t| t == tiling)
        .ok_or_else(|| {
            KernelError::shape(
                op,
                format!(
                    "tiling (tokens per stage, stages) must be one of {:?}, got {tiling:?}",
                    Gpu::DECODE_TILINGS
                ),
            )
        })
}

/// The checks the tiled paged and ring kernels share: head geometry they are built for, grid limits, splits
/// (the combine kernel weighs at most 1024), a finite scale.
fn check_heads(
    op: &'static str,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    seqs: usize,
    splits: usize,
    scale: f32,
) -> Result<(), KernelError> {
    crate::ensure_shape!(
        q_heads > 0 && kv_heads > 0 && q_heads.is_multiple_of(kv_heads) && (1..=8).contains(&(q_heads / kv_heads)),
        op,
        "q_heads ({q_heads}) must be 1 to 8 times kv_heads ({kv_heads}): the query group is the 8 rows of one mma tile"
    );
    crate::ensure_shape!(
        matches!(head_dim, 64 | 128 | 256),
        op,
        "head_dim must be 64, 128 or 256, got {head_dim}"
    );
    crate::ensure_shape!(
        seqs <= 65535 && kv_heads <= 65535,
        op,
        "seqs and kv_heads must be at most 65535"
    );
    crate::ensure_shape!(
        splits <= 1024,
        op,
        "splits must be at most 1024, got {splits}"
    );
    crate::ensure_shape!(scale.is_finite(), op, "scale must be finite, got {scale}");
    Ok(())
}

#[cfg(feature = "cuda")]
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

#[cfg(feature = "cuda")]
fn tiled_name(ring: bool, head_dim: usize, tiling: usize) -> &'static str {
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

#[cfg(feature = "cuda")]
fn combine_name(sliced: bool, head_dim: usize) -> &'static str {
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
#[cfg(feature = "cuda")]
fn sliced_combine_warps(splits: usize) -> usize {
    splits.div_ceil(4).clamp(1, 16)
}

/// The launch steps the paged and ring paths share: split counts, the partials workspace, the tiled kernels'
/// shared memory and the combine.
#[cfg(feature = "cuda")]
impl Device {
    /// Splits of the CUDA-core kernel that fill exactly one wave of four resident blocks per multiprocessor (by
    /// their 48 KiB of pipeline stages), with at least 64 tokens (four pipeline stages) per split.
    fn auto_splits(&self, d: &PagedAttentionDims) -> usize {
        let blocks = d.seqs * d.kv_heads;
        let want = (4 * self.sm_count()).div_ceil(blocks.max(1));
        let most = (d.max_pages_per_seq * d.page_size).div_ceil(64);
        want.min(most).clamp(1, 1024)
    }

    /// `splits`, or for the tiled kernels when the caller passes 0, `Gpu::decode_auto_splits` on this device.
    fn tiled_splits(
        &self,
        pairs: usize,
        head_dim: usize,
        tiling: usize,
        max_tokens: usize,
        splits: usize,
    ) -> usize {
        if splits != 0 {
            return splits;
        }
        Gpu::decode_auto_splits(
            Gpu::DECODE_TILINGS[tiling],
            head_dim,
            self.sm_count(),
            pairs,
            max_tokens,
        )
    }

    /// Launches the paged split kernel `f` (the CUDA-core and the tiled ones share one parameter list: q, K, V, block
    /// table, lengths, scale, out, the partials workspace, then q_heads, kv_heads, page_size, num_pages,
    /// max_pages_per_seq) on `splits` blocks per (sequence, KV head), then with more than one split the combine
    /// `sliced` picks.
    ///
    /// # Safety
    /// `f` is the kernel `name`, which takes that parameter list with `threads` threads per block and `smem` bytes
    /// of dynamic shared memory; `q`, `kv` and `out` were checked against `d` (`check_paged_lens`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_paged_decode(
        &self,
        name: &str,
        f: &cudarc::driver::CudaFunction,
        threads: u32,
        smem: u32,
        sliced: bool,
        d: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        kv: PagedKvCache<'_>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
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
        let grid = (splits as u32, d.kv_heads as u32, d.seqs as u32);
        let cfg = launch_config(grid, (threads, 1, 1), smem);
        // SAFETY: the caller's contract above; the kernels clamp each length to max_pages * page_size and skip
        // page ids >= num_pages, so device-side table contents cannot send them outside the cache; the workspace
        // holds seqs * q_heads * splits * (head_dim + 2) floats.
        unsafe {
            self.launch_args(name, f, cfg, |b| {
                b.arg(&q.slice)
                    .arg(&kv.k.slice)
                    .arg(&kv.v.slice)
                    .arg(&kv.block_table.slice)
                    .arg(&kv.seq_lens.slice)
                    .arg(&scale)
                    .arg(&mut out.slice)
                    .arg(&mut *ws);
                b.arg(&hq).arg(&hkv).arg(&ps).arg(&np).arg(&mp);
            })
        }?;
        if splits > 1 {
            self.attention_combine(
                sliced,
                d.head_dim,
                d.q_heads,
                d.seqs,
                splits,
                ws,
                &mut out.slice,
            )?;
        }
        Ok(())
    }

    /// The split kernel's partials workspace, grown to `len` floats.
    fn attention_workspace(
        &self,
        len: usize,
    ) -> Result<std::sync::MutexGuard<'_, Option<CudaSlice<f32>>>, KernelError> {
        let mut ws_guard = self.attention_ws.lock().map_err(|_| poisoned())?;
        if ws_guard.as_ref().is_none_or(|w| w.len() < len) {
            *ws_guard = Some(
                self.stream()
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
            let grid = ((q_heads * head_dim / 64) as u32, seqs as u32, 1);
            launch_config(grid, (32, sliced_combine_warps(splits) as u32, 1), 0)
        } else {
            launch_config((q_heads as u32, seqs as u32, 1), (head_dim as u32, 4, 1), 0)
        };
        // Launched as the split kernel's programmatic dependent (Device::launch_pdl): its blocks get resident
        // while the split kernel runs and wait in pdl_wait for the partials (39.18 vs 39.67 us at 32k,
        // 6.89 vs 7.56 us on a 1024-token ring). Launching the split kernels so too lost (43.1 us at 32k: their
        // blocks, resident early beside the previous combine's, no longer spread two per SM).
        // The guards order the raw addresses after pending writes on other streams and record this use.
        let (wsp, _gws) = ws.device_ptr(self.stream());
        let (outp, _gout) = out.device_ptr_mut(self.stream());
        let mut args = PdlArgs::default();
        args.ptr(wsp).ptr(outp).i32(hq).i32(s);
        // SAFETY: matches `attention_decode_combine{,_sliced}_D*(const float* ws, float* out, int hq, int splits)`
        // with the block shape each expects (the sliced one at most 16 warps, its shared arrays' size; head_dim a
        // multiple of 64); the split kernel queued before it on the same stream fills seqs * q_heads * splits
        // partials of head_dim + 2 floats (splits <= 1024, checked by the callers), which the combine reads only
        // after its pdl_wait, as it writes out ([seqs, q_heads, head_dim]); the values live across the call.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }
    }

    /// The tiled kernel (`ring`: `attention_decode_ring_*`, else `attention_decode_tiled_*`) of `tiling` for
    /// `head_dim`, with its dynamic shared memory allowed; returns it with its name and that size.
    fn tiled_function(
        &self,
        ring: bool,
        head_dim: usize,
        tiling: usize,
    ) -> Result<(cudarc::driver::CudaFunction, &'static str, u32), KernelError> {
        let (tile, stages) = Gpu::DECODE_TILINGS[tiling];
        let smem = tiled_smem(head_dim, tile, stages) as u32;
        let name = tiled_name(ring, head_dim, tiling);
        let f = self.function_with_smem(Module::Attention, name, smem)?;
        Ok((f, name, smem))
    }
}

/// Dynamic shared memory of `attention_decode_{tiled,ring}_D*_T*_S*`: cuda/attention.cu's `TiledGeom::SMEM`
/// (stages of K and V, the double-buffered float2 score partials of 4 warps, the per-stage masks).
#[cfg(feature = "cuda")]
pub(crate) fn tiled_smem(head_dim: usize, tile: usize, stages: usize) -> usize {
    stages * 2 * tile * head_dim * 2 + 2 * 4 * 32 * (tile / 8) * 2 * 4 + stages * 4 * 4
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    /// The kernels `Auto` launches on each head dim (the paged tiling, the ring tiling, the combine it picks) are
    /// in this build's `cuda/attention.cu`, and without `lab` nothing else is; the names come from the launch
    /// code's naming functions, the list from the PTX (`build_cuda.rs`).
    #[test]
    fn every_auto_decode_kernel_is_embedded() {
        let mut seen = Vec::new();
        for d in [64, 128, 256] {
            for (ring, kernels) in [
                (false, DecodeKernels::PAGED_AUTO),
                (true, DecodeKernels::RING_AUTO),
            ] {
                let t = tiling_index("t", kernels.tiling).unwrap();
                seen.push(tiled_name(ring, d, t));
                seen.push(combine_name(kernels.sliced_combine, d));
            }
        }
        super::super::device::assert_embedded(Module::Attention, seen);
    }
}
