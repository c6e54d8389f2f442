//! Decode attention over a paged KV cache (`kernels/cuda/attention.cu`).

use super::{check_len, Gpu, GpuBuffer, KernelPath, PagedAttentionDims};
use crate::KernelError;

impl Gpu {
    ///
    /// Layouts are those of [`crate::attention`] with a bf16 cache: `q`: fp32 `[seqs, q_heads, head_dim]`;
    /// `k_cache`, `v_cache`: bf16 bits `[num_pages, kv_heads, page_size, head_dim]`; `block_table`:
    /// `[seqs, max_pages_per_seq]` page ids; `seq_lens`: `[seqs]` tokens in each sequence's cache, the current
    /// token's K/V already written (a length past the table is clamped, a page id past the pool is skipped);
    /// `out`: fp32 `[seqs, q_heads, head_dim]`; `scale` multiplies `q . k` (usually `1/sqrt(head_dim)`).
    /// Query heads `g*r .. g*r + r` (`r = q_heads / kv_heads`) read KV head `g`, and each block computes all `r`
    /// of them, so K and V are read once per KV head. `splits` blocks share one (sequence, KV head) over the
    /// context (flash-decoding); `splits = 0` picks a count that fills the GPU.
    ///
    /// Same as [`Gpu::attention_decode_paged_with`] with [`KernelPath::Auto`], which picks the tensor cores.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode_paged(
        &self,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        k_cache: &GpuBuffer<u16>,
        v_cache: &GpuBuffer<u16>,
        block_table: &GpuBuffer<u32>,
        seq_lens: &GpuBuffer<u32>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.attention_decode_paged_with(
            KernelPath::Auto,
            dims,
            q,
            k_cache,
            v_cache,
            block_table,
            seq_lens,
            scale,
            splits,
            out,
        )
    }

    /// [`Gpu::attention_decode_paged`] on a chosen kernel family (tests and benchmarks drive each one).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_decode_paged_with(
        &self,
        path: KernelPath,
        dims: &PagedAttentionDims,
        q: &GpuBuffer<f32>,
        k_cache: &GpuBuffer<u16>,
        v_cache: &GpuBuffer<u16>,
        block_table: &GpuBuffer<u32>,
        seq_lens: &GpuBuffer<u32>,
        scale: f32,
        splits: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::attention_decode_paged";
        let d = dims;
        crate::ensure_shape!(
            d.seqs > 0 && d.q_heads > 0 && d.kv_heads > 0 && d.page_size > 0 && d.num_pages > 0,
            OP,
            "every count must be positive, got {d:?}"
        );
        crate::ensure_shape!(
            d.q_heads.is_multiple_of(d.kv_heads)
                && matches!(d.q_heads / d.kv_heads, 1 | 2 | 4 | 6 | 8),
            OP,
            "q_heads ({}) must be 1, 2, 4, 6 or 8 times kv_heads ({}), the built instantiations",
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
        let cache = d.num_pages * d.page_size * d.kv_heads * d.head_dim;
        check_len(OP, "q", q.len(), d.seqs * d.q_heads * d.head_dim)?;
        check_len(OP, "k_cache", k_cache.len(), cache)?;
        check_len(OP, "v_cache", v_cache.len(), cache)?;
        check_len(
            OP,
            "block_table",
            block_table.len(),
            d.seqs * d.max_pages_per_seq,
        )?;
        check_len(OP, "seq_lens", seq_lens.len(), d.seqs)?;
        check_len(OP, "out", out.len(), d.seqs * d.q_heads * d.head_dim)?;
        #[cfg(feature = "cuda")]
        {
            let tensor = !matches!(path, KernelPath::CudaCores);
            self.inner.attention_decode_paged(
                tensor,
                d,
                &q.slice,
                &k_cache.slice,
                &v_cache.slice,
                &block_table.slice,
                &seq_lens.slice,
                scale,
                splits,
                &mut out.slice,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = path;
            match self.never {}
        }
    }
}
