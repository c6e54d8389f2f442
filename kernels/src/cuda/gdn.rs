//! The fused gated DeltaNet decode step (`kernels/cuda/gdn.cu`).

use super::{check_len, check_len_of, GdnGpuInputs, GdnGpuWeights, Gpu, GpuBuffer};
use crate::shapes::GdnDims;
use crate::KernelError;

/// One decode-step kernel of `cuda/gdn.cu`: its entry point and launch shape (`blocks_per_head` blocks of
/// `threads` threads per (value head, sequence); a cluster of `blocks_per_head` blocks where that is above one,
/// fixed in the kernel by `__cluster_dims__`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cuda) struct GdnDecodeKernel {
    /// The variant's name in [`Gpu::GDN_DECODE_VARIANTS`].
    pub name: &'static str,
    /// The `extern "C"` entry point.
    pub entry: &'static str,
    pub blocks_per_head: u32,
    pub threads: u32,
}

const fn k(
    name: &'static str,
    entry: &'static str,
    blocks_per_head: u32,
    threads: u32,
) -> GdnDecodeKernel {
    GdnDecodeKernel {
        name,
        entry,
        blocks_per_head,
        threads,
    }
}

/// Every variant, in the order of [`Gpu::GDN_DECODE_VARIANTS`] (cuda/gdn.cu documents each).
const KERNELS: [GdnDecodeKernel; 5] = [
    k("block_per_head", "gdn_decode_step", 1, 256),
    k("split2_t128_1r", "gdn_decode_step_split2_t128_1r", 2, 128),
    k("split2_t256_1r", "gdn_decode_step_split2_t256_1r", 2, 256),
    k("split4_t128_1r", "gdn_decode_step_split4_t128_1r", 4, 128),
    k("split8_t128_1r", "gdn_decode_step_split8_t128_1r", 8, 128),
];

/// What `auto` runs, by batch: `(largest batch, variant)`, ascending; the last row covers every larger batch.
/// kernels/bench/h200/bench_gdn_decode.py reads this table (the `AUTO_TABLE` rows below, one per line) to report
/// which arm auto picks, so keep its shape.
///
/// Measured on the H200 (`benchmarks/h200.md`; Qwen3.8-27B's layer, Hk=16 Hv=48,
/// K=4; whole step, microseconds; fla's bare fused_recurrent beside it; the `_mb` arms (two reductions, the
/// winners) lost to the `_1r` arms (one fused reduction of S^T k and S^T q) at every batch
/// and were removed with split8_t64_1r, which never won):
///
/// | batch | split8_t128_1r | split4_t128_1r | split2_t256_1r | split2_t128_1r | best `_mb` | block_per_head | fla   |
/// |-------|----------------|----------------|----------------|----------------|------------|----------------|-------|
/// | 1     | **4.98**       |                |                |                | 5.09       | 7.46           | 4.35  |
/// | 2     | **6.82**       |                |                |                | 6.95       | 9.02           | 6.16  |
/// | 3     |                | **8.65**       |                |                | 9.02       | 11.11          | 8.01  |
/// | 4     |                |                | **10.16**      |                | 10.32      | 12.41          | 10.42 |
/// | 8     |                |                | **18.30**      |                | 18.76      | 22.72          | 20.09 |
/// | 16    |                |                |                | **31.05**      | 32.05      | 37.41          | 37.58 |
/// | 32    |                |                |                | **56.75**      | 57.45      | 70.80          | 71.89 |
///
/// (Blank cells: that arm was not the fastest; bench_gdn_decode.txt has every arm.) Batches 1-2 fill the GPU only
/// with 8 blocks per head (384 at batch 1 on 132 SMs); from batch 4 on two blocks per head fill it and fewer,
/// longer blocks win. Untested batches take the neighbour's winner: 5-8 split2_t256_1r, 9-15 and above 32
/// split2_t128_1r. At batch 1 a bare torch copy of the state (r+w 6.3 MB) takes 2.2 us and an empty launch 1.3 us
/// in the same graphs: the step's 5.0 us is mostly latency, not bytes.
const AUTO_TABLE: [(usize, &str); 4] = [
    (2, "split8_t128_1r"),
    (3, "split4_t128_1r"),
    (8, "split2_t256_1r"),
    (usize::MAX, "split2_t128_1r"),
];

/// The variant `auto` runs for a batch of `seqs` sequences ([`AUTO_TABLE`]).
fn auto_kernel(seqs: usize) -> GdnDecodeKernel {
    let name = AUTO_TABLE
        .iter()
        .find(|(max, _)| seqs <= *max)
        .map_or(AUTO_TABLE[AUTO_TABLE.len() - 1].1, |(_, n)| *n);
    // Every AUTO_TABLE name is in KERNELS (the unit test below checks it); block_per_head is the fallback that
    // can never be taken.
    *KERNELS
        .iter()
        .find(|k| k.name == name)
        .unwrap_or(&KERNELS[0])
}

impl Gpu {
    /// Names of the decode-step variants [`Gpu::gdn_decode_step_variant`] takes, besides `"auto"`:
    /// `block_per_head` (one 256-thread block per (sequence, value head), the reference arm) and `split<S>_t<T>_1r`
    /// (S blocks of T threads per head, a cluster, each owning 128/S state columns, the output formed from one
    /// fused reduction of S^T k and S^T q, the gated RMSNorm's sum of squares exchanged through distributed shared
    /// memory and an mbarrier). All compute the same step; they differ in speed.
    #[cfg(feature = "lab")]
    pub const GDN_DECODE_VARIANTS: &'static [&'static str] = &[
        "block_per_head",
        "split2_t128_1r",
        "split2_t256_1r",
        "split4_t128_1r",
        "split8_t128_1r",
    ];

    /// `seqs` sequences, one token each, with the layouts of [`crate::gdn`].
    ///
    /// The conv state is read from `conv_in` and the advanced one written to `conv_out` (two buffers, swapped by
    /// the caller each step): the three value heads that share a key head run in different blocks and all read
    /// the key head's conv history, so updating it in place would race. The recurrent `state` is updated in place
    /// (each value head's `[dk, dv]` slice, or each column slice of it, belongs to exactly one block). Built for
    /// `dk = dv = 128` and conv kernels 2..=4 (every released model), checked here. Runs the measured-best
    /// variant (`"auto"` of [`Gpu::gdn_decode_step_variant`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_decode_step(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seqs: usize,
        conv_in: &GpuBuffer<f32>,
        conv_out: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.gdn_decode_step_variant("auto", dims, w, x, seqs, conv_in, conv_out, state, out)
    }

    lab_pub! {
    /// [`Gpu::gdn_decode_step`] through a named kernel variant: `"auto"` or one of
    /// [`Gpu::GDN_DECODE_VARIANTS`] (for tests and benchmarks; an unknown name is an error that lists the known
    /// ones). Every variant reads and writes the same layouts and computes the same step.
    #[allow(clippy::too_many_arguments)]
    fn gdn_decode_step_variant(
        &self,
        variant: &str,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seqs: usize,
        conv_in: &GpuBuffer<f32>,
        conv_out: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_decode_step";
        let kernel = if variant == "auto" {
            auto_kernel(seqs)
        } else {
            match KERNELS.iter().find(|k| k.name == variant) {
                Some(k) => *k,
                None => {
                    return Err(KernelError::shape(
                        OP,
                        format!(
                            "unknown variant {variant:?}; known: \"auto\", {:?}",
                            KERNELS.map(|k| k.name)
                        ),
                    ))
                }
            }
        };
        dims.validate(OP)?;
        crate::ensure_shape!(
            dims.key_dim == 128 && dims.value_dim == 128,
            OP,
            "the CUDA step is built for key_dim = value_dim = 128 (Qwen3.5 / Qwen3-Next), got {}x{}",
            dims.key_dim,
            dims.value_dim
        );
        crate::ensure_shape!(
            (2..=4).contains(&dims.conv_kernel),
            OP,
            "conv_kernel must be 2..=4, got {}",
            dims.conv_kernel
        );
        crate::ensure_shape!(
            (1..=65535).contains(&seqs),
            OP,
            "seqs must be 1..=65535, got {seqs}"
        );
        // The grid's x is value_heads * blocks_per_head (at most 8 per head): far below 2^31 for any i32 count.
        crate::ensure_shape!(
            dims.value_heads <= i32::MAX as usize / 8,
            OP,
            "value_heads {} is too large for the kernels' 32-bit indexing",
            dims.value_heads
        );
        let sizes = dims.checked_sizes(OP)?;
        let cd = sizes.conv_dim;
        check_len(
            OP,
            "conv_weight",
            w.conv_weight.len(),
            sizes.conv_weight_len,
        )?;
        check_len(OP, "a_log", w.a_log.len(), dims.value_heads)?;
        check_len(OP, "dt_bias", w.dt_bias.len(), dims.value_heads)?;
        check_len(OP, "norm_weight", w.norm_weight.len(), dims.value_dim)?;
        crate::ensure_shape!(
            w.norm_eps.is_finite() && w.norm_eps >= 0.0,
            OP,
            "norm_eps must be finite and non-negative, got {}",
            w.norm_eps
        );
        check_len_of(OP, "qkv", x.qkv.len(), &[seqs, cd])?;
        check_len_of(OP, "z", x.z.len(), &[seqs, sizes.value_width])?;
        check_len_of(OP, "a", x.a.len(), &[seqs, dims.value_heads])?;
        check_len_of(OP, "b", x.b.len(), &[seqs, dims.value_heads])?;
        check_len_of(OP, "conv_in", conv_in.len(), &[seqs, sizes.conv_state_len])?;
        check_len_of(
            OP,
            "conv_out",
            conv_out.len(),
            &[seqs, sizes.conv_state_len],
        )?;
        check_len_of(OP, "state", state.len(), &[seqs, sizes.state_len])?;
        check_len_of(OP, "out", out.len(), &[seqs, sizes.value_width])?;
        #[cfg(feature = "cuda")]
        {
            self.inner.gdn_decode_step(
                kernel,
                dims,
                w,
                x,
                seqs,
                &conv_in.slice,
                &mut conv_out.slice,
                &mut state.slice,
                &mut out.slice,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = kernel;
            match self.never {}
        }
    }
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    /// The kernel `Auto` launches for every batch size is in this build's `cuda/gdn.cu` (the list comes from the
    /// PTX, `build_cuda.rs`), and without `lab` nothing else is; each launch shape is one the kernels allow.
    #[test]
    fn every_auto_gdn_decode_kernel_is_embedded() {
        use crate::cuda::device::Module;
        let entries = Module::Gdn.entries();
        let mut seen = std::collections::BTreeSet::new();
        for seqs in (1..=64).chain([255, 256, 4096, 65535]) {
            let k = auto_kernel(seqs);
            assert!(
                entries.contains(&k.entry),
                "batch {seqs}: {k:?} not embedded"
            );
            assert!([1, 2, 4, 8].contains(&k.blocks_per_head), "{k:?}");
            assert!(k.threads.is_multiple_of(32) && k.threads <= 256, "{k:?}");
            seen.insert(k.entry);
        }
        #[cfg(not(feature = "lab"))]
        assert_eq!(entries, seen.into_iter().collect::<Vec<_>>());
        #[cfg(feature = "lab")]
        for k in KERNELS {
            assert!(
                entries.contains(&k.entry),
                "{k:?} not embedded in a lab build"
            );
        }
    }
}
