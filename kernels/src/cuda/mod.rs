//! GPU kernels (CUDA, sm_90: the H200). Open a device with [`Gpu::probe`] (which answers `Ok(None)` where there is
//! no driver or no device), move data with [`Gpu::upload`] / [`Gpu::download`], and call the kernels as methods of
//! [`Gpu`]; every size, stride and alignment is checked on the Rust side before a launch.
//!
//! Without the `cuda` feature the same API exists and every entry point returns
//! [`KernelError::NotCompiledWithCuda`], so call sites carry no `cfg`. With it, the kernels in `kernels/cuda/*.cu`
//! are compiled to PTX and sm_90 cubins by `build.rs` (see `build_cuda.rs`), embedded in the crate, and each module
//! is loaded once per [`Gpu`] (one CUDA context) on first use: the cubin on an sm_90 device, the PTX elsewhere.
//! Measured speeds and the method are in `benchmarks/h200.md`; `kernels/bench/h200/run_session.sh` reproduces them.
//!
//! Kernels, one file per family (`kernels/cuda/<family>.cu`, each safe entry point and its launch in
//! `<family>.rs`); layouts, constraints, the measured `Auto` choices and their numbers are in each method's docs:
//! - `gemv`: decode GEMVs for 1-16 tokens, bf16 activations, fp32 out: [`Gpu::fp8_block_gemv`] (FP8 e4m3 with
//!   128x128 block scales) and, for NVFP4 (weight-only: Hopper has no FP4 math), [`Gpu::nvfp4_repack_tiles`] once
//!   at load then [`Gpu::nvfp4_gemv_tiles`] per token ([`Gpu::nvfp4_gemv`] reads the checkpoint layout, slower).
//! - `gemm` / `gemm_sm90a`: prefill GEMMs, [`Gpu::fp8_quantize_activations`] + [`Gpu::fp8_block_gemm`] and
//!   [`Gpu::nvfp4_gemm`]: `wgmma` + TMA kernels on compute capability 9.0, `mma.sync` elsewhere.
//! - `gdn` / `gdn_prefill`: gated DeltaNet, [`Gpu::gdn_decode_step`] (one fused kernel per layer for a batch of
//!   sequences) and [`Gpu::gdn_prefill`] (chunked, WY form, ragged batches, the same state layout).
//! - `attention` / `attention_prefill`: [`Gpu::attention_decode_paged`] and [`Gpu::attention_decode_ring`]
//!   (GQA-packed, split over the context), [`Gpu::attention_prefill`] / [`Gpu::attention_prefill_varlen`]
//!   (causal, sliding window), [`Gpu::attention_prefill_paged`] / [`Gpu::attention_prefill_ring`] (a chunk after a
//!   cached prefix) and [`Gpu::attention_kv_store_paged`] / [`Gpu::attention_kv_store_ring`]; bf16 caches.
//! - `ops`: [`Gpu::rmsnorm`], [`Gpu::add_rmsnorm`], [`Gpu::silu_and_mul`], [`Gpu::gelu_and_mul`],
//!   [`Gpu::embedding_gather`] (bf16 and packed int4), [`Gpu::argmax`], [`Gpu::sample`] (the CPU's tokens for the
//!   same seed), [`Gpu::rope_neox`]; and the f32 elementwise ops of the engine's exact path ([`Gpu::act_and_mul_f32`],
//!   the casts, the sigmoid gates, [`Gpu::softcap`], [`Gpu::add_assign`], [`Gpu::copy_cols`], ...).
//! - `dense`: f32 / bf16 dense linear layers in f32 ([`Gpu::dense_weights_f32`], [`Gpu::dense_weights_bf16`],
//!   [`Gpu::dense_linear`]): the exact path of small checkpoints.
//! - `attention_slots`: f32 KV caches of one block per slot, [`Gpu::kv_store_slots`] and [`Gpu::attention_slots`]
//!   (full or sliding, GQA), the engine's exact attention.
//! - `int4`: W4A16 and W4A8 linear layers over the chunked int4 pack of [`crate::linear::Int4Weights`]
//!   ([`Gpu::int4_weights`], [`Gpu::int4_w4a16`], [`Gpu::int4_w4a8`]), f32 activations, one simple kernel.
//! - `moe`: mixture-of-experts routing, [`Gpu::moe_route`] (softmax + top-k), [`Gpu::moe_gather`] and
//!   [`Gpu::moe_combine`], deterministic.

use crate::KernelError;

#[cfg(feature = "cuda")]
mod device;

/// A variant entry point (a `_with` / `_variant` form whose `Auto` form calls it with `Auto`): `pub` with the `lab`
/// feature, private without it, so one definition serves both builds.
macro_rules! lab_pub {
    ($(#[$attr:meta])* fn $($rest:tt)*) => {
        $(#[$attr])*
        #[cfg(feature = "lab")]
        pub fn $($rest)*

        $(#[$attr])*
        #[cfg(not(feature = "lab"))]
        fn $($rest)*
    };
}

/// The tail of an entry point for the build without the `cuda` feature, after its `#[cfg(feature = "cuda")]`
/// launch block: `no_cuda!(self, a, b)` stands for
/// `#[cfg(not(feature = "cuda"))] { let _ = (a, b); match self.never {} }`. No value of `self` exists there (its
/// `never` field is uninhabited), so the tail never runs; it names the arguments only the launch block reads, so
/// neither build warns of an unused variable.
macro_rules! no_cuda {
    ($this:ident) => {
        #[cfg(not(feature = "cuda"))]
        match $this.never {}
    };
    ($this:ident, $($unused:expr),+ $(,)?) => {
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ($($unused,)+);
            match $this.never {}
        }
    };
}

// One file per kernel family, each an `impl Gpu` block whose entry points check their sizes and then launch
// through the helpers of `device.rs`, so an op's argument list is written once.
mod attention;
mod attention_prefill;
mod attention_slots;
mod dense;
mod gdn;
mod gdn_prefill;
mod gemm;
mod gemm_sm90a;
mod gemv;
mod int4;
mod moe;
mod ops;
mod transfer;
pub use dense::DenseGpuWeights;
pub use gdn::GdnStackedInputs;
pub use gemm_sm90a::{Fp8Wgmma, Nvfp4Wgmma};
pub use gemv::{
    Fp8Fragments, Fp8Order, Fp8TileWeights, FragmentOrder, GemvFragments, MmaSplit, Nvfp4Fragments,
    Nvfp4Order, Nvfp4TileWeights,
};
pub use int4::{Int4A8Scratch, Int4GpuWeights};
pub use transfer::{CopyStream, GpuEvent, PinnedWeights, WeightBuf, WeightBufMut};

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for f32 {}
}

/// Element types a [`GpuBuffer`] can hold: bytes (FP8/NVFP4 weights and scales), `u16` (bf16 bits), `i32`, `u32`, `f32`.
#[cfg(feature = "cuda")]
pub trait GpuScalar:
    sealed::Sealed
    + Copy
    + Default
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + Unpin
    + 'static
{
}
/// Element types a [`GpuBuffer`] can hold: bytes (FP8/NVFP4 weights and scales), `u16` (bf16 bits), `i32`, `u32`, `f32`.
#[cfg(not(feature = "cuda"))]
pub trait GpuScalar: sealed::Sealed + Copy + Default + 'static {}
impl GpuScalar for u8 {}
impl GpuScalar for u16 {}
impl GpuScalar for i32 {}
impl GpuScalar for u32 {}
impl GpuScalar for f32 {}

/// A recorded sequence of launches ([`Gpu::begin_capture`] .. [`Gpu::end_capture`]), replayed by
/// [`Gpu::launch_graph`] with one launch's overhead.
pub struct GpuGraph {
    #[cfg(feature = "cuda")]
    graph: cudarc::driver::CudaGraph,
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    never: std::convert::Infallible,
}

// SAFETY: the driver's graph objects may be used from any thread as long as calls on one graph are not concurrent
// (CUDA's "graph thread safety" rules); `GpuGraph` is only used through `&self` / ownership by one owner at a
// time (it is not `Sync`), so moving it to another thread (an engine's step thread) keeps that.
#[cfg(feature = "cuda")]
unsafe impl Send for GpuGraph {}

/// One CUDA device (its primary context and a stream) with the kernel modules loaded on first use.
pub struct Gpu {
    #[cfg(feature = "cuda")]
    inner: device::Device,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

/// A device allocation of `len` elements of `T`, owned by the [`Gpu`] that made it.
pub struct GpuBuffer<T: GpuScalar> {
    #[cfg(feature = "cuda")]
    slice: cudarc::driver::CudaSlice<T>,
    #[cfg(not(feature = "cuda"))]
    never: (std::convert::Infallible, std::marker::PhantomData<T>),
}

impl<T: GpuScalar> GpuBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.slice.len()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never.0 {}
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Device-side parameters of one gated DeltaNet layer (layouts as [`crate::gdn::GdnWeights`]).
pub struct GdnGpuWeights<'a> {
    /// `[conv_dim, K]`.
    pub conv_weight: &'a GpuBuffer<f32>,
    /// `[Hv]`.
    pub a_log: &'a GpuBuffer<f32>,
    /// `[Hv]`.
    pub dt_bias: &'a GpuBuffer<f32>,
    /// `[dv]`.
    pub norm_weight: &'a GpuBuffer<f32>,
    /// The gated RMSNorm epsilon.
    pub norm_eps: f32,
}

/// Device-side per-token inputs of one decode step for `seqs` sequences (layouts as [`crate::gdn::GdnInputs`]).
pub struct GdnGpuInputs<'a> {
    /// `[seqs, conv_dim]`.
    pub qkv: &'a GpuBuffer<f32>,
    /// `[seqs, Hv*dv]`.
    pub z: &'a GpuBuffer<f32>,
    /// `[seqs, Hv]`.
    pub a: &'a GpuBuffer<f32>,
    /// `[seqs, Hv]`.
    pub b: &'a GpuBuffer<f32>,
}

/// What a chunked gated DeltaNet prefill ([`Gpu::gdn_prefill`] and its variants) reads and advances per
/// sequence, what it writes, and its scratch; layouts in [`Gpu::gdn_prefill`].
pub struct GdnPrefillIo<'a> {
    /// `[seqs, conv_dim, K-1]`: each sequence's conv history before the chunk.
    pub conv_in: &'a GpuBuffer<f32>,
    /// `[seqs, conv_dim, K-1]`: the history after it (what the next decode step reads).
    pub conv_out: &'a mut GpuBuffer<f32>,
    /// `[seqs, Hv, 128, 128]`, updated in place.
    pub state: &'a mut GpuBuffer<f32>,
    /// `[N, Hv*128]`: the input of `out_proj`.
    pub out: &'a mut GpuBuffer<f32>,
    /// Scratch of at least [`Gpu::gdn_prefill_workspace_len`] (or `_varlen_workspace_len`; their `_with` forms for
    /// a named variant) floats.
    pub workspace: &'a mut GpuBuffer<f32>,
}

/// Geometry of a paged KV cache and of one decode-attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedAttentionDims {
    /// Sequences in the batch.
    pub seqs: usize,
    /// Query heads; a multiple of `kv_heads`.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dim; the kernel supports 64, 128 and 256.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Pages in the cache pool.
    pub num_pages: usize,
    /// Columns of the block table (most pages one sequence may use).
    pub max_pages_per_seq: usize,
}

/// The paged bf16 KV cache one decode-attention call reads ([`Gpu::attention_decode_paged`] has the layouts).
#[derive(Clone, Copy)]
pub struct PagedKvCache<'a> {
    /// Keys, bf16 bits `[num_pages, kv_heads, page_size, head_dim]`.
    pub k: &'a GpuBuffer<u16>,
    /// Values, as `k`.
    pub v: &'a GpuBuffer<u16>,
    /// `[seqs, max_pages_per_seq]` page ids.
    pub block_table: &'a GpuBuffer<u32>,
    /// `[seqs]` tokens in each sequence's cache, the current token's K/V already written.
    pub seq_lens: &'a GpuBuffer<u32>,
}

/// The sliding-window ring one decode-attention call reads ([`Gpu::attention_decode_ring`] has the layouts).
#[derive(Clone, Copy)]
pub struct RingKvCache<'a> {
    /// The window in tokens (the ring holds `window - 1` of them, plus the current token).
    pub window: usize,
    /// Keys of the ring, bf16 bits `[seqs, kv_heads, window - 1, head_dim]`.
    pub k_ring: &'a GpuBuffer<u16>,
    /// Values of the ring, as `k_ring`.
    pub v_ring: &'a GpuBuffer<u16>,
    /// The current token's key, bf16 bits `[seqs, kv_heads, head_dim]`.
    pub k_cur: &'a GpuBuffer<u16>,
    /// The current token's value, as `k_cur`.
    pub v_cur: &'a GpuBuffer<u16>,
    /// `[seqs]`, the current token's position.
    pub pos: &'a GpuBuffer<u32>,
}

/// The new tokens of one chunked-prefill call over a cached prefix ([`Gpu::attention_prefill_paged`],
/// [`Gpu::attention_prefill_ring`]) and of the K/V stores that follow it ([`Gpu::attention_kv_store_paged`],
/// [`Gpu::attention_kv_store_ring`], which read `k`, `v` and the positions only).
#[derive(Clone, Copy)]
pub struct PrefillChunk<'a> {
    /// Queries, bf16 bits `[total, q_heads, head_dim]`, sequences packed as `cu_seqlens`.
    pub q: &'a GpuBuffer<u16>,
    /// Keys, bf16 bits `[total, kv_heads, head_dim]`.
    pub k: &'a GpuBuffer<u16>,
    /// Values, as `k`.
    pub v: &'a GpuBuffer<u16>,
    /// `[seqs + 1]` offsets of each sequence's new tokens (on the device, clamped there).
    pub cu_seqlens: &'a GpuBuffer<u32>,
    /// `[seqs]` tokens each sequence has cached before these (on the device, clamped there).
    pub prefix_lens: &'a GpuBuffer<u32>,
    /// New tokens in all.
    pub total: usize,
    /// The most new tokens of one sequence.
    pub max_seqlen: usize,
}

/// Which tiled tensor-core decode kernels run ([`Gpu::attention_decode_paged_tiled`],
/// [`Gpu::attention_decode_ring_with`]): the tiling (tokens per stage, stages), one of [`Gpu::DECODE_TILINGS`], and
/// the combine kernel (`sliced_combine`: `attention_decode_combine_sliced_D*`, else `attention_decode_combine_D*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeKernels {
    /// (tokens per stage, stages).
    pub tiling: (usize, usize),
    /// The sliced combine (one block per 64 columns) rather than the block combine.
    pub sliced_combine: bool,
}

impl DecodeKernels {
    /// What `Auto` runs on the paged cache: [`Gpu::DECODE_AUTO_TILING`], [`Gpu::DECODE_AUTO_SLICED_COMBINE`].
    pub const PAGED_AUTO: DecodeKernels = DecodeKernels {
        tiling: Gpu::DECODE_AUTO_TILING,
        sliced_combine: Gpu::DECODE_AUTO_SLICED_COMBINE,
    };
    /// What [`Gpu::attention_decode_ring`] runs: [`Gpu::DECODE_RING_TILING`], the same combine.
    pub const RING_AUTO: DecodeKernels = DecodeKernels {
        tiling: Gpu::DECODE_RING_TILING,
        sliced_combine: Gpu::DECODE_AUTO_SLICED_COMBINE,
    };
    /// `tiling` with the combine `Auto` picks.
    pub const fn with_tiling(tiling: (usize, usize)) -> DecodeKernels {
        DecodeKernels {
            tiling,
            sliced_combine: Gpu::DECODE_AUTO_SLICED_COMBINE,
        }
    }
}

/// Which kernel family serves a call that has both ([`Gpu::fp8_block_gemv_with`], [`Gpu::nvfp4_gemv_with`],
/// [`Gpu::attention_decode_paged_with`]). Tests and benchmarks drive each family; callers use `Auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// The measured-best family for the call's shape (each method's docs say which; `benchmarks/h200.md` has
    /// the numbers).
    Auto,
    /// fp32 arithmetic on the CUDA cores. GEMV: one, two or four weight rows per warp, a few instructions per
    /// weight per activation row, so compute-bound beyond `m = 1` (FP8) or already at `m = 1` (NVFP4's decode).
    /// Attention: two query heads per warp, fp32 scores and probabilities.
    CudaCores,
    /// `mma.sync` m16n8k16 with fp32 accumulation. GEMV: f16 operands, the weights decoded once for up to 16
    /// activation rows, activations rounded to f16 (saturating at +-65504). Attention: bf16 operands, the query
    /// and the probabilities rounded to bf16 as in flash-attention kernels (~1e-3 relative error).
    TensorCores,
}

impl Gpu {
    /// Opens device 0, or answers `Ok(None)` where this machine has no CUDA driver or no device; fails with
    /// [`KernelError::NotCompiledWithCuda`] in a build without the `cuda` feature.
    pub fn probe() -> Result<Option<Gpu>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(device::Device::probe()?.map(|inner| Gpu { inner }))
        }
        #[cfg(not(feature = "cuda"))]
        Err(KernelError::NotCompiledWithCuda)
    }

    /// Opens device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Gpu, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(Gpu {
                inner: device::Device::new(ordinal)?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(KernelError::NotCompiledWithCuda)
        }
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String, KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.name()
        }
        no_cuda!(self)
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: GpuScalar>(&self, host: &[T]) -> Result<GpuBuffer<T>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(GpuBuffer {
                slice: self.inner.upload(host)?,
            })
        }
        no_cuda!(self, host)
    }

    /// A new zero-filled device buffer of `len` elements.
    pub fn zeros<T: GpuScalar>(&self, len: usize) -> Result<GpuBuffer<T>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            Ok(GpuBuffer {
                slice: self.inner.zeros(len)?,
            })
        }
        no_cuda!(self, len)
    }

    /// Overwrites `buf` with `host` (same length).
    pub fn write<T: GpuScalar>(
        &self,
        buf: &mut GpuBuffer<T>,
        host: &[T],
    ) -> Result<(), KernelError> {
        crate::ensure_shape!(
            buf.len() == host.len(),
            "Gpu::write",
            "buffer has {} elements, host slice {}",
            buf.len(),
            host.len()
        );
        #[cfg(feature = "cuda")]
        {
            self.inner.write(&mut buf.slice, host)
        }
        no_cuda!(self)
    }

    /// Copies `src` into `dst` (same length) on the device, queued on the stream: the driver's own device-to-device
    /// copy, what a copy-bandwidth measurement times.
    pub fn copy<T: GpuScalar>(
        &self,
        src: &GpuBuffer<T>,
        dst: &mut GpuBuffer<T>,
    ) -> Result<(), KernelError> {
        crate::ensure_shape!(
            src.len() == dst.len(),
            "Gpu::copy",
            "src has {} elements, dst {}",
            src.len(),
            dst.len()
        );
        #[cfg(feature = "cuda")]
        {
            self.inner.copy(&src.slice, &mut dst.slice)
        }
        no_cuda!(self)
    }

    /// Copies `buf` back to the host, after every kernel queued before it has finished.
    pub fn download<T: GpuScalar>(&self, buf: &GpuBuffer<T>) -> Result<Vec<T>, KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.download(&buf.slice)
        }
        no_cuda!(self, buf)
    }

    /// Starts recording every launch queued on this device's stream into a graph instead of running it, until
    /// [`Gpu::end_capture`]. Nothing may be allocated, uploaded or downloaded meanwhile (the driver refuses it on
    /// this thread); every kernel to be recorded must have run once before (modules load on first use).
    pub fn begin_capture(&self) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.begin_capture()
        }
        no_cuda!(self)
    }

    /// Ends a capture begun by [`Gpu::begin_capture`] and instantiates what was recorded. The graph holds the
    /// device addresses of every buffer the recorded kernels used: they must outlive it and keep their place.
    pub fn end_capture(&self) -> Result<GpuGraph, KernelError> {
        #[cfg(feature = "cuda")]
        {
            match self.inner.end_capture()? {
                Some(graph) => Ok(GpuGraph { graph }),
                None => Err(KernelError::Cuda(
                    "end_capture: nothing was recorded".into(),
                )),
            }
        }
        no_cuda!(self)
    }

    /// Queues a recorded graph on this device's stream: every kernel it holds, in order, in one launch.
    pub fn launch_graph(&self, graph: &GpuGraph) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            let _ = self;
            graph
                .graph
                .launch()
                .map_err(|e| KernelError::Cuda(format!("launch_graph: {e:?}")))
        }
        no_cuda!(self, graph)
    }

    /// Free and total bytes of device memory, as the driver reports them now (what an engine admits a plan
    /// against before it allocates).
    pub fn memory_info(&self) -> Result<(usize, usize), KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.memory_info()
        }
        no_cuda!(self)
    }

    /// Waits for every queued kernel, then returns the device memory that freed buffers left reserved in the
    /// allocator's pool to the driver: buffers are freed in stream order into a pool that keeps their memory, so
    /// a load that allocates and frees buffers of changing sizes (raw weights repacked into tiles) otherwise
    /// holds more than it keeps, and `memory_info` counts the difference as used.
    pub fn release_unused(&self) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.release_unused()
        }
        no_cuda!(self)
    }

    /// Waits for every queued kernel and reports an asynchronous launch error, if any.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.inner.synchronize()
        }
        no_cuda!(self)
    }
}

fn check_len(op: &'static str, name: &str, got: usize, want: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(
        got == want,
        op,
        "{name} has {got} elements, expected {want}"
    );
    Ok(())
}

/// [`check_len`] against the product of `factors`, multiplied with checked arithmetic: a product that does not fit
/// in `usize` is a shape error, never a wrapped length that a launch would then trust.
fn check_len_of(
    op: &'static str,
    name: &str,
    got: usize,
    factors: &[usize],
) -> Result<(), KernelError> {
    let Some(want) = factors.iter().try_fold(1usize, |a, &f| a.checked_mul(f)) else {
        return Err(KernelError::shape(
            op,
            format!("the size of {name} (the product of {factors:?}) overflows usize"),
        ));
    };
    check_len(op, name, got, want)
}

/// The NVFP4 operands of every NVFP4 GEMV and GEMM (checkpoint layout), after the caller's own checks of `m`, `n`
/// and `k`: `x` bf16 `[m, k]`, `w` `[n, k/2]` bytes, `scales` e4m3 `[n, k/16]`, `y` fp32 `[m, n]` and a finite
/// `global_scale`.
#[allow(clippy::too_many_arguments)]
fn check_nvfp4_operands(
    op: &'static str,
    x: &GpuBuffer<u16>,
    w: &GpuBuffer<u8>,
    scales: &GpuBuffer<u8>,
    global_scale: f32,
    y: &GpuBuffer<f32>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    check_len_of(op, "x", x.len(), &[m, k])?;
    check_len_of(op, "w", w.len(), &[n, k / 2])?;
    check_len_of(op, "scales", scales.len(), &[n, k / 16])?;
    check_len_of(op, "y", y.len(), &[m, n])?;
    crate::ensure_shape!(
        global_scale.is_finite(),
        op,
        "global_scale must be finite, got {global_scale}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the feature the API refuses cleanly; with it, a machine without a driver answers `None`.
    #[test]
    fn probe_matches_the_build() {
        let r = Gpu::probe();
        if cfg!(feature = "cuda") {
            assert!(r.is_ok(), "{:?}", r.err());
        } else {
            assert_eq!(r.err(), Some(KernelError::NotCompiledWithCuda));
            assert_eq!(Gpu::new(0).err(), Some(KernelError::NotCompiledWithCuda));
        }
    }
}
