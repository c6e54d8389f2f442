//! The fused gated DeltaNet decode step (`kernels/cuda/gdn.cu`): the checks of both entry points, then the one
//! launch they share, every variant.

#[cfg(feature = "cuda")]
use super::device::{launch_config, Device, Module, PdlArgs};
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
        let sizes = check_step(OP, dims, w, seqs)?;
        let cd = sizes.conv_dim;
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
            let d = &self.inner;
            let (qkv, _g0) = d.addr(&x.qkv.slice);
            let (z, _g1) = d.addr(&x.z.slice);
            let (a, _g2) = d.addr(&x.a.slice);
            let (b, _g3) = d.addr(&x.b.slice);
            let (conv_in, _g4) = d.addr(&conv_in.slice);
            let (conv_out, _g5) = d.addr_mut(&mut conv_out.slice);
            let (state, _g6) = d.addr_mut(&mut state.slice);
            let (out, _g7) = d.addr_mut(&mut out.slice);
            let args = GdnStepArgs {
                qkv,
                z,
                a,
                b,
                // Each fits: checked_sizes bounded them and check_step the heads for 32-bit indexing.
                qkv_ld: to_i32(OP, cd)?,
                z_ld: to_i32(OP, sizes.value_width)?,
                ab_ld: to_i32(OP, dims.value_heads)?,
                conv_in,
                conv_out,
                state,
                out,
                slots: 0,
                pos: 0,
                n_slots: 0,
            };
            d.gdn_decode_step(kernel, dims, w, &args, seqs)
        }
        no_cuda!(self, kernel)
    }
    }

    /// The decode step of `seqs` sequences on the engine's caches, indexed by slot: sequence `i`'s recurrent state
    /// is row `slots[i]` of `state` (`[n_slots, Hv*dk*dv]`), its conv history a pair of rows of `conv`
    /// (`[n_slots, 2, conv_dim*(K-1)]`): read from the one `pos[i] % 2` names, the advanced history written to the
    /// other, which position `pos[i] + 1` then reads. Why: a recorded CUDA graph then serves every batch of the
    /// same size whatever its slots, and no state is gathered, scattered or copied back around the step.
    ///
    /// The inputs are stacked as the engine's fused projections write them: `x.qkvz` `[seqs, conv_dim + Hv*dv]`
    /// (each row the conv input q, k, v, then z) and `x.ba` `[seqs, 2*Hv]` (each row b, then a); `out`
    /// `[seqs, Hv*dv]` in batch order. `slots` and `pos` live on the device (`[seqs]` each, so a graph reads this
    /// step's values); a slot of `n_slots` or more is refused by the kernel, which writes NaN to that sequence's
    /// output and touches no cache. The slots of one step must be distinct (two sequences on one slot race).
    /// Otherwise as [`Gpu::gdn_decode_step`]: the same arithmetic, bit for bit, for the same variant.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_decode_step_slots(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnStackedInputs<'_>,
        seqs: usize,
        slots: &GpuBuffer<u32>,
        pos: &GpuBuffer<u32>,
        conv: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_decode_step_slots";
        let kernel = auto_kernel(seqs);
        let sizes = check_step(OP, dims, w, seqs)?;
        let cd = sizes.conv_dim;
        let row = cd.checked_add(sizes.value_width).ok_or_else(|| {
            KernelError::shape(OP, "conv_dim + Hv*dv overflows usize".to_string())
        })?;
        check_len_of(OP, "qkvz", x.qkvz.len(), &[seqs, row])?;
        check_len_of(OP, "ba", x.ba.len(), &[seqs, 2, dims.value_heads])?;
        check_len(OP, "slots", slots.len(), seqs)?;
        check_len(OP, "pos", pos.len(), seqs)?;
        check_len_of(OP, "out", out.len(), &[seqs, sizes.value_width])?;
        crate::ensure_shape!(
            !state.is_empty() && state.len().is_multiple_of(sizes.state_len),
            OP,
            "state holds {} floats, not a whole number of slots of {} (Hv*dk*dv)",
            state.len(),
            sizes.state_len
        );
        let n_slots = state.len() / sizes.state_len;
        check_len_of(OP, "conv", conv.len(), &[n_slots, 2, sizes.conv_state_len])?;
        let n_slots = u32::try_from(n_slots).map_err(|_| {
            KernelError::shape(
                OP,
                format!("{n_slots} slots do not fit the kernel's u32 slot ids"),
            )
        })?;
        #[cfg(feature = "cuda")]
        {
            let d = &self.inner;
            let (qkvz, _g0) = d.addr(&x.qkvz.slice);
            let (ba, _g1) = d.addr(&x.ba.slice);
            let (sl, _g2) = d.addr(&slots.slice);
            let (ps, _g3) = d.addr(&pos.slice);
            let (cv, _g4) = d.addr_mut(&mut conv.slice);
            let (st, _g5) = d.addr_mut(&mut state.slice);
            let (o, _g6) = d.addr_mut(&mut out.slice);
            let f = std::mem::size_of::<f32>() as u64;
            let hv = dims.value_heads as u64;
            let args = GdnStepArgs {
                qkv: qkvz,
                z: qkvz + cd as u64 * f,
                b: ba,
                a: ba + hv * f,
                qkv_ld: to_i32(OP, row)?,
                z_ld: to_i32(OP, row)?,
                ab_ld: to_i32(OP, 2 * dims.value_heads)?,
                conv_in: cv,
                conv_out: cv,
                state: st,
                out: o,
                slots: sl,
                pos: ps,
                n_slots,
            };
            d.gdn_decode_step(kernel, dims, w, &args, seqs)
        }
        no_cuda!(self, kernel, n_slots)
    }
}

/// The stacked inputs of [`Gpu::gdn_decode_step_slots`].
pub struct GdnStackedInputs<'a> {
    /// `[seqs, conv_dim + Hv*dv]`: per row the conv input (q, k, v), then z.
    pub qkvz: &'a GpuBuffer<f32>,
    /// `[seqs, 2*Hv]`: per row b, then a.
    pub ba: &'a GpuBuffer<f32>,
}

/// Where the step's inputs and caches live, as device addresses (one launch argument each), built by the entry
/// points above after their checks.
#[cfg(feature = "cuda")]
pub(in crate::cuda) struct GdnStepArgs {
    pub qkv: u64,
    pub z: u64,
    pub a: u64,
    pub b: u64,
    /// Elements between two sequences' rows of qkv, z and a / b.
    pub qkv_ld: i32,
    pub z_ld: i32,
    pub ab_ld: i32,
    pub conv_in: u64,
    pub conv_out: u64,
    pub state: u64,
    pub out: u64,
    /// 0 (null) for caches in batch order; otherwise each sequence's slot and position.
    pub slots: u64,
    pub pos: u64,
    pub n_slots: u32,
}

#[cfg(feature = "cuda")]
fn to_i32(op: &'static str, v: usize) -> Result<i32, KernelError> {
    i32::try_from(v).map_err(|_| {
        KernelError::shape(
            op,
            format!("{v} is too large for the kernel's 32-bit indexing"),
        )
    })
}

#[cfg(feature = "cuda")]
impl Device {
    /// The one launch of both entry points: `kernel` over `seqs` sequences, on the addresses and strides in `x`
    /// that the entry point built after its checks.
    fn gdn_decode_step(
        &self,
        kernel: GdnDecodeKernel,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnStepArgs,
        seqs: usize,
    ) -> Result<(), KernelError> {
        let name = kernel.entry;
        let f = self.function(Module::Gdn, name)?;
        let (hk, hv, kconv) = (
            dims.key_heads as i32,
            dims.value_heads as i32,
            dims.conv_kernel as i32,
        );
        // blocks_per_head blocks per (value head, sequence), consecutive in x so that each head's blocks form one of
        // the kernel's compile-time clusters (cuda/gdn.cu).
        let grid = (
            dims.value_heads as u32 * kernel.blocks_per_head,
            seqs as u32,
            1,
        );
        let cfg = launch_config(grid, (kernel.threads, 1, 1), 0);
        let (cw, _g0) = self.addr(&w.conv_weight.slice);
        let (al, _g1) = self.addr(&w.a_log.slice);
        let (dt, _g2) = self.addr(&w.dt_bias.slice);
        let (nw, _g3) = self.addr(&w.norm_weight.slice);
        let mut args = PdlArgs::default();
        args.u64(x.qkv).u64(x.z).u64(x.a).u64(x.b);
        args.ptr(cw).ptr(al).ptr(dt).ptr(nw);
        args.f32(w.norm_eps)
            .u64(x.conv_in)
            .u64(x.conv_out)
            .u64(x.state)
            .u64(x.out);
        args.i32(hk).i32(hv).i32(kconv);
        args.u64(x.slots)
            .u64(x.pos)
            .u32(x.n_slots)
            .i32(x.qkv_ld)
            .i32(x.z_ld)
            .i32(x.ab_ld);
        // SAFETY: every entry of cuda/gdn.cu takes these arguments in this order; the caller checked dk = dv =
        // 128 (the kernels' compile-time size), conv_kernel in 2..=4, seqs in 1..=65535 (grid y), value_heads
        // small enough for the 32-bit grid x, every buffer's length against dims, seqs, the row strides and (with
        // slots) n_slots, and holds the guards of every address until this returns; a slot past n_slots is
        // refused inside the kernel before any cache access; conv_in and conv_out are distinct allocations, or
        // (with slots) one allocation whose halves the kernel reads and writes apart. The block size and the
        // blocks per head come from the same table entry as the entry point, so they match the kernel's
        // __launch_bounds__ and __cluster_dims__.
        // Safe under launch_small's programmatic launch: the kernel's pdl_start comes before any memory access.
        unsafe { self.launch_small(name, &f, cfg, &mut args) }
    }
}

/// The checks both entry points share: the geometry the kernels are built for, the batch, the weights.
fn check_step(
    op: &'static str,
    dims: &GdnDims,
    w: &GdnGpuWeights<'_>,
    seqs: usize,
) -> Result<crate::shapes::GdnSizes, KernelError> {
    check_gdn_geometry(op, dims, "step")?;
    crate::ensure_shape!(
        (1..=65535).contains(&seqs),
        op,
        "seqs must be 1..=65535, got {seqs}"
    );
    // The grid's x is value_heads * blocks_per_head (at most 8 per head): far below 2^31 for any i32 count.
    crate::ensure_shape!(
        dims.value_heads <= i32::MAX as usize / 8,
        op,
        "value_heads {} is too large for the kernels' 32-bit indexing",
        dims.value_heads
    );
    check_gdn_weights(op, dims, w)
}

/// The geometry every DeltaNet kernel (`what`: the step, the prefill) is built for: dk = dv = 128 and a conv
/// kernel of 2..=4 (every released model), on a valid [`GdnDims`].
pub(in crate::cuda) fn check_gdn_geometry(
    op: &'static str,
    dims: &GdnDims,
    what: &str,
) -> Result<(), KernelError> {
    dims.validate(op)?;
    crate::ensure_shape!(
        dims.key_dim == 128 && dims.value_dim == 128,
        op,
        "the CUDA {what} is built for key_dim = value_dim = 128 (Qwen3.5 / Qwen3-Next), got {}x{}",
        dims.key_dim,
        dims.value_dim
    );
    crate::ensure_shape!(
        (2..=4).contains(&dims.conv_kernel),
        op,
        "conv_kernel must be 2..=4, got {}",
        dims.conv_kernel
    );
    Ok(())
}

/// The layer's weights against `dims`, and the sizes derived from it.
pub(in crate::cuda) fn check_gdn_weights(
    op: &'static str,
    dims: &GdnDims,
    w: &GdnGpuWeights<'_>,
) -> Result<crate::shapes::GdnSizes, KernelError> {
    let lens = [
        w.conv_weight.len(),
        w.a_log.len(),
        w.dt_bias.len(),
        w.norm_weight.len(),
    ];
    crate::gdn::check_weight_lens(op, dims, lens, w.norm_eps)
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::*;

    /// The kernel `Auto` launches for every batch size is in this build's `cuda/gdn.cu` (the list comes from the
    /// PTX, `build_cuda.rs`), and without `lab` nothing else is; each launch shape is one the kernels allow.
    #[test]
    fn every_auto_gdn_decode_kernel_is_embedded() {
        use crate::cuda::device::{assert_embedded, Module};
        let mut seen = Vec::new();
        for seqs in (1..=64).chain([255, 256, 4096, 65535]) {
            let k = auto_kernel(seqs);
            assert!([1, 2, 4, 8].contains(&k.blocks_per_head), "{k:?}");
            assert!(k.threads.is_multiple_of(32) && k.threads <= 256, "{k:?}");
            seen.push(k.entry);
        }
        assert_embedded(Module::Gdn, seen);
        #[cfg(feature = "lab")]
        assert_embedded(Module::Gdn, KERNELS.iter().map(|k| k.entry));
    }
}
