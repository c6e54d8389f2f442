//! Causal prefill attention on the GPU (`cuda/attention_prefill.cu`): flash-attention-2 style on `mma.sync`
//! bf16 tensor cores, grouped-query packing, optional sliding window, one sequence or a batch of sequences of
//! different lengths (cu_seqlens). The kernel's design is documented at the top of the .cu file.

use super::{check_len, Gpu, GpuBuffer};
use crate::attention::AttnDims;
use crate::KernelError;

/// One instantiation of the prefill kernel: its name, the head dim it serves, and its tiling.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the launch fields are read by the cuda build only
pub(in crate::cuda) struct PrefillKernel {
    pub(in crate::cuda) name: &'static str,
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
            head_dim: $d,
            variant: concat!("M", $m, "_W", $w, "_N", $n, "_S", $s),
            block_m: $m,
            warp_tiles: $w,
            block_n: $n,
            stages: $s,
        }
    };
}

/// Every instantiation in cuda/attention_prefill.cu (`AP_INSTANTIATE`), the default of each head dim first.
/// Defaults: the variants without register spills (ptxas, sm_90) and with the most blocks per SM; the H200
/// benchmark (kernels/bench/h200/bench_attention_prefill.py) times every one and is what should settle them.
pub(in crate::cuda) const PREFILL_KERNELS: &[PrefillKernel] = &[
    prefill_kernel!(64, 128, 1, 64, 3),
    prefill_kernel!(64, 128, 2, 64, 3),
    prefill_kernel!(64, 64, 1, 64, 3),
    prefill_kernel!(128, 128, 1, 64, 2),
    prefill_kernel!(128, 128, 2, 64, 2),
    prefill_kernel!(128, 128, 2, 32, 3),
    prefill_kernel!(128, 64, 1, 64, 2),
    prefill_kernel!(256, 64, 1, 32, 2),
    prefill_kernel!(256, 64, 1, 64, 2),
    prefill_kernel!(256, 128, 1, 64, 2),
];

/// The instantiations serving `head_dim`, the default first.
fn kernels_for(head_dim: usize) -> impl Iterator<Item = &'static PrefillKernel> {
    PREFILL_KERNELS
        .iter()
        .filter(move |k| k.head_dim == head_dim)
}

impl Gpu {
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
    /// Speed: not yet measured (written without a GPU at hand); `kernels/bench/h200/bench_attention_prefill.py`
    /// times every tiling against SDPA flash, and its best per head dim should become the default here.
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

    /// [`Gpu::attention_prefill_varlen`] on a chosen tiling (`None`: the default of the head dim), one of
    /// [`Gpu::attention_prefill_variants`]; tests and benchmarks drive each one.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prefill_varlen_with(
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

    /// The tilings built for `head_dim` (`M<query rows>_W<m16 tiles per warp>_N<keys>_S<stages>`), the default first; empty for an
    /// unsupported head dim.
    pub fn attention_prefill_variants(head_dim: usize) -> Vec<&'static str> {
        kernels_for(head_dim).map(|k| k.variant).collect()
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
        check_len(OP, "q", q.len(), total * hq * d)?;
        check_len(OP, "k", k.len(), total * hkv * d)?;
        check_len(OP, "v", v.len(), total * hkv * d)?;
        check_len(OP, "out", out.len(), total * hq * d)?;
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
            self.inner.attention_prefill(
                kernel,
                &q.slice,
                &k.slice,
                &v.slice,
                &mut out.slice,
                cu_seqlens.map(|c| &c.slice),
                seqs,
                total,
                max_seqlen,
                hq,
                hkv,
                window,
                scale_log2,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (kernel, window, scale_log2);
            match self.never {}
        }
    }
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
        matches!(dims.head_dim, 64 | 128 | 256),
        op,
        "head_dim must be 64, 128 or 256, got {}",
        dims.head_dim
    );
    crate::ensure_shape!(scale.is_finite(), op, "scale must be finite, got {scale}");
    crate::ensure_shape!(
        window != Some(0),
        op,
        "a sliding window must hold at least 1 token, got 0"
    );
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
        total
            .checked_mul(dims.q_heads.max(1) * dims.head_dim)
            .is_some_and(|n| n <= i32::MAX as usize)
            && max_seqlen * group <= i32::MAX as usize,
        op,
        "total ({total}) x q_heads ({}) x head_dim ({}) must fit the kernel's 32-bit token indices",
        dims.q_heads,
        dims.head_dim
    );
    let kernel = match variant {
        None => kernels_for(dims.head_dim).next(),
        Some(name) => kernels_for(dims.head_dim).find(|k| k.variant == name),
    };
    kernel.ok_or_else(|| {
        KernelError::shape(
            op,
            format!(
                "no prefill tiling {:?} for head_dim {} (built: {:?})",
                variant.unwrap_or("default"),
                dims.head_dim,
                Gpu::attention_prefill_variants(dims.head_dim)
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

    #[test]
    fn every_head_dim_has_a_default_and_the_names_match_the_tilings() {
        for d in [64, 128, 256] {
            let v = Gpu::attention_prefill_variants(d);
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
        assert!(Gpu::attention_prefill_variants(96).is_empty());
    }
}
