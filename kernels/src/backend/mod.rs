//! The engine-facing op set: one vocabulary, the same on the CPU ([`Cpu`]) and on CUDA ([`Gpu`]), behind the
//! [`Backend`] trait. A forward pass written against `B: Backend` runs on either device: the caller gives shapes
//! and buffers ([`Backend::Buf`]), and which kernel runs (ISA path, GEMV or GEMM, tile layout) is decided inside.
//!
//! Weights are prepared once per backend: a linear layer's checkpoint tensors go into a host [`Weight`] (one
//! variant per format), and [`Backend::prepare`] turns it into the backend's own typed weight
//! ([`Backend::Linear`]: the same [`Weight`] on the CPU, a [`GpuLinear`] in the GPU's tile layouts), which only
//! that backend's [`Backend::linear`] accepts. Embedding tables go the same way ([`Embedding`],
//! [`Backend::prepare_table`]).
//!
//! Every method is a thin, checked layer over the crate's CPU functions ([`crate::ops`], [`crate::attention`],
//! [`crate::gdn`], [`crate::linear`], [`crate::moe`]) and the public [`Gpu`] methods; no kernel lives here. All
//! activations are f32; bf16 appears only as a cast target ([`Backend::cast_f32_to_bf16`]) and as a table or
//! weight format.
//!
//! # The ops, by family
//!
//! | family | methods | CPU | CUDA |
//! |---|---|---|---|
//! | memory | [`Backend::upload`], [`Backend::zeros`], [`Backend::download`] | `Vec` | [`crate::cuda::GpuBuffer`] |
//! | embedding gather | [`Backend::embedding_gather`] (f32, bf16, int4 tables) | yes | yes (f32: one copy per id, below) |
//! | RMSNorm | [`Backend::rmsnorm`], [`Backend::add_rmsnorm`] (`w` and `1 + w`; q/k norms: a `[head_dim]` weight) | yes | yes |
//! | RoPE | [`Backend::rope_neox`] (neox, partial, a theta per [`Rope`]) | yes | yes |
//! | attention | [`Backend::kv_store`], [`Backend::attention`] over a [`KvCache`] (causal, windowed, after a cached prefix, decode batches) | yes | yes |
//! | output gates | [`Backend::sigmoid_gate`] (per element), [`Backend::sigmoid_head_gate`] (per head) | yes | yes |
//! | gated DeltaNet | [`Backend::gdn_decode`] (conv + step), [`Backend::gdn_prefill`] (chunked) | yes | yes (`dk = dv = 128`) |
//! | gated MLP | [`Backend::act_and_mul`] (SiLU, GELU erf, GELU tanh) | yes | yes |
//! | linear | [`Backend::prepare`], [`Backend::linear`] (f32, bf16, FP8 block, FP8 per tensor, NVFP4, int4 W4A16 / W4A8) | yes | yes |
//! | mixture of experts | [`Backend::moe_route`] (softmax + top-k), [`Backend::moe_gather`], [`Backend::moe_combine`] | yes | yes (up to [`Gpu::MOE_MAX_EXPERTS`] experts) |
//! | logits and small ops | [`Backend::softcap`], [`Backend::argmax`], [`Backend::sample`], [`Backend::add_assign`], [`Backend::add_bias_rows`], [`Backend::scale_assign`] | yes | yes |
//! | casts | [`Backend::cast_f32_to_bf16`], [`Backend::cast_bf16_to_f32`] | yes | yes |
//!
//! # What differs between the devices
//!
//! - **int4 linear (W4A16, W4A8)** reads the same pack on both devices. The GPU runs one simple kernel for every
//!   row count ([`Gpu::int4_w4a16`], [`Gpu::int4_w4a8`]): W4A16 with f32 activations and f32 sums (the CPU's integer
//!   kernels, where AVX512-VBMI exists, hold the activations as int16 per group instead), W4A8 with its own int8
//!   quantisation of the activations, the CPU's codes bit for bit. Both differ from the CPU only in the order of
//!   the f32 sums. The GPU's W4A8 allocates its activation scratch per call.
//! - **The f32 embedding gather on the GPU** has no kernel of its own: it reads the ids back to the host and copies
//!   one row per id ([`Gpu::copy_cols`]), so it synchronises and cannot be recorded in a CUDA graph. bf16 and int4
//!   tables gather on the device.
//! - **The GPU linear of FP8 and NVFP4** reads bf16 activations (the tile GEMVs, up to 16 rows at a time) or, past
//!   16 rows, e4m3 activations quantised per 128 columns (the FP8 GEMM, `k % 16 == 0`) and bf16 (the NVFP4 GEMM,
//!   `k % 64 == 0`); the CPU computes them with f32 activations. It allocates its activation scratch per call.
//! - **Gated DeltaNet on the GPU** is built for `dk = dv = 128` and conv kernels 2..=4; its prefill runs on TF32
//!   tensor cores (3xTF32 products, about 2e-3 of the output's scale).
//! - **Values on the device** (token ids, slots, positions, logits) cannot be checked by the host before a GPU
//!   launch: an id past the table gathers NaN, a slot or position out of range is skipped by the store and gives a
//!   zero row in attention, a NaN row of logits answers [`Gpu::INVALID_TOKEN`]; a non-finite router logit gives its
//!   token [`Gpu::INVALID_TOKEN`] ids and NaN weights, a token or pair row past its buffer in the MoE gather or
//!   combine a NaN row. The CPU refuses each with an error.
//! - **MoE routing** picks the experts on the GPU by the logits (the order the probabilities have, without `expf`'s
//!   rounding) and sums the softmax in a tree; the CPU sorts its f32 probabilities. Two logits whose probabilities
//!   round to the same f32 may therefore be ordered differently; the weights differ by the rounding of `exp` and of
//!   the sum. The grouping by expert ([`crate::moe::dispatch_ids`]) runs on the host for both.
//! - GPTQ modules are unpacked on the host ([`Weight::gptq`]) into the int4 pack, so they run where int4 runs: on
//!   both devices, as W4A16.
//!
//! # Example
//!
//! A norm, a linear layer and the argmax of its output, written once for any backend:
//!
//! ```
//! use kernels::backend::{Backend, Cpu, Weight};
//! use kernels::ops::NormWeight;
//! use kernels::KernelError;
//!
//! type Bufs<B> = <B as Backend>::Buf<f32>;
//!
//! fn step<B: Backend>(b: &B, w: &B::Linear, norm: &Bufs<B>, x: &Bufs<B>) -> Result<Vec<u32>, KernelError> {
//!     let mut h = b.zeros::<f32>(b.len(x))?;
//!     b.rmsnorm(x, norm, NormWeight::Plain, 1e-6, &mut h)?;
//!     let mut logits = b.zeros::<f32>(3)?;
//!     b.linear(w, &h, 1, &mut logits)?;
//!     let mut token = b.zeros::<u32>(1)?;
//!     b.argmax(&logits, 3, &mut token)?;
//!     b.download(&token)
//! }
//!
//! let cpu = Cpu;
//! let w = cpu.prepare(Weight::f32(vec![1.0, 0.0, 0.0, 1.0, 0.0, -1.0], 3, 2)?)?;
//! let norm = cpu.upload(&[1.0f32, 1.0])?;
//! let x = cpu.upload(&[1.0f32, 3.0])?;
//! assert_eq!(step(&cpu, &w, &norm, &x)?, [1]);
//! # Ok::<(), KernelError>(())
//! ```

mod cpu;
mod cuda;
mod host;

pub use cpu::Cpu;
pub use cuda::{GpuLinear, GpuTable};
pub use host::{
    f32_linear, gelu_tanh_and_mul, sigmoid_gate, sigmoid_head_gate, softcap, GptqTensors, Weight,
};

use crate::cuda::GpuScalar;
// The docs name the GPU backend by its type; the code reaches it only through `cuda.rs`.
#[cfg(doc)]
use crate::cuda::Gpu;
use crate::error::checked_product;
use crate::gdn::{GdnDims, GdnWeights};
use crate::linear::Int4Weights;
use crate::shapes::{AttnDims, GatedAct, NormWeight, Rope};
use crate::KernelError;

/// Element types a backend buffer holds: bytes, bf16 bits (`u16`), token ids and positions (`u32`), `f32`.
/// Sealed: the GPU's own element list ([`GpuScalar`]) is its supertrait.
pub trait Scalar: GpuScalar {}
impl Scalar for u8 {}
impl Scalar for u16 {}
impl Scalar for u32 {}
impl Scalar for f32 {}

/// An embedding table on the host, as the checkpoint gives it, for [`Backend::prepare_table`].
#[derive(Debug, Clone)]
pub enum Embedding {
    /// f32 rows `[vocab, dim]`.
    F32 { w: Vec<f32>, dim: usize },
    /// bf16 bits, rows `[vocab, dim]`.
    Bf16 { w: Vec<u16>, dim: usize },
    /// The chunked int4 pack (`n` = vocabulary rows of `k` = hidden values), gathered row by row.
    Int4(Int4Weights),
}

impl Embedding {
    /// An f32 table of rows of `dim` values.
    pub fn f32(w: Vec<f32>, dim: usize) -> Result<Embedding, KernelError> {
        check_table("Embedding::f32", w.len(), dim)?;
        Ok(Embedding::F32 { w, dim })
    }

    /// A bf16 table (bits) of rows of `dim` values.
    pub fn bf16(w: Vec<u16>, dim: usize) -> Result<Embedding, KernelError> {
        check_table("Embedding::bf16", w.len(), dim)?;
        Ok(Embedding::Bf16 { w, dim })
    }

    /// Values per row (the hidden size).
    pub fn dim(&self) -> usize {
        match self {
            Embedding::F32 { dim, .. } | Embedding::Bf16 { dim, .. } => *dim,
            Embedding::Int4(w) => w.k(),
        }
    }

    /// Rows (the vocabulary).
    pub fn rows(&self) -> usize {
        match self {
            Embedding::F32 { w, dim } => w.len() / dim,
            Embedding::Bf16 { w, dim } => w.len() / dim,
            Embedding::Int4(w) => w.n(),
        }
    }
}

/// A table must be whole, non-empty rows, and every row must be nameable by a `u32` id.
fn check_table(op: &'static str, len: usize, dim: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(dim > 0, op, "dim must be positive");
    crate::ensure_shape!(
        len > 0 && len.is_multiple_of(dim),
        op,
        "table has {len} elements, not a positive whole number of rows of {dim}"
    );
    crate::ensure_shape!(
        len / dim <= u32::MAX as usize,
        op,
        "{} rows: token ids are u32",
        len / dim
    );
    Ok(())
}

/// The K and V caches of one attention layer: one block of `max_len` positions per slot (a sequence),
/// `[slots, max_len, kv_heads * head_dim]` f32 each, on the backend's device. Token `i` of a call lives at
/// `(slots[i], pos[i])`; [`Backend::kv_store`] writes it, [`Backend::attention`] reads it. A prefill, a chunk
/// after a cached prefix and a decode batch are the same two calls.
pub struct KvCache<B: Backend + ?Sized> {
    k: B::Buf<f32>,
    v: B::Buf<f32>,
    dims: AttnDims,
    slots: usize,
    max_len: usize,
}

impl<B: Backend + ?Sized> KvCache<B> {
    /// Zeroed caches for `slots` sequences of up to `max_len` tokens each.
    pub fn new(b: &B, dims: AttnDims, slots: usize, max_len: usize) -> Result<Self, KernelError> {
        const OP: &str = "KvCache::new";
        dims.validate(OP)?;
        crate::ensure_shape!(
            slots > 0 && max_len > 0,
            OP,
            "slots and max_len must be positive, got {slots} and {max_len}"
        );
        let len = checked_product(
            OP,
            "slots*max_len*kv_heads*head_dim",
            &[slots, max_len, dims.kv_heads, dims.head_dim],
        )?;
        Ok(KvCache {
            k: b.zeros(len)?,
            v: b.zeros(len)?,
            dims,
            slots,
            max_len,
        })
    }

    /// The head geometry the caches were made for.
    pub fn dims(&self) -> AttnDims {
        self.dims
    }

    /// Sequences the caches hold.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Positions per sequence.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The keys, `[slots, max_len, kv_heads * head_dim]`.
    pub fn k(&self) -> &B::Buf<f32> {
        &self.k
    }

    /// The values, as [`KvCache::k`].
    pub fn v(&self) -> &B::Buf<f32> {
        &self.v
    }
}

/// The parameters of one gated DeltaNet layer on the backend's device (layouts as [`GdnWeights`]).
pub struct GdnLayer<B: Backend + ?Sized> {
    /// `[conv_dim, K]`.
    pub conv_weight: B::Buf<f32>,
    /// `[Hv]`, the checkpoint's `A_log`.
    pub a_log: B::Buf<f32>,
    /// `[Hv]`.
    pub dt_bias: B::Buf<f32>,
    /// `[dv]`, the gated RMSNorm weight.
    pub norm_weight: B::Buf<f32>,
    /// The gated RMSNorm epsilon.
    pub norm_eps: f32,
}

impl<B: Backend + ?Sized> GdnLayer<B> {
    /// Copies a layer's parameters to the backend's device (the kernels check their lengths at each call).
    pub fn upload(b: &B, w: &GdnWeights<'_>) -> Result<Self, KernelError> {
        Ok(GdnLayer {
            conv_weight: b.upload(w.conv_weight)?,
            a_log: b.upload(w.a_log)?,
            dt_bias: b.upload(w.dt_bias)?,
            norm_weight: b.upload(w.norm_weight)?,
            norm_eps: w.norm_eps,
        })
    }
}

/// The per-token inputs of a gated DeltaNet call (`n` tokens; layouts as [`crate::gdn::GdnInputs`]).
pub struct GdnIn<'a, B: Backend + ?Sized> {
    /// `[n, conv_dim]`.
    pub qkv: &'a B::Buf<f32>,
    /// `[n, Hv*dv]`.
    pub z: &'a B::Buf<f32>,
    /// `[n, Hv]`.
    pub a: &'a B::Buf<f32>,
    /// `[n, Hv]`.
    pub b: &'a B::Buf<f32>,
}

/// The conv history and recurrent state of `seqs` sequences of one gated DeltaNet layer, advanced in place by
/// [`Backend::gdn_decode`] and [`Backend::gdn_prefill`]. The conv history is kept twice because the GPU kernels
/// read one copy and write the other (value heads sharing a key head read the same history in different blocks);
/// [`GdnState::conv`] is always the current one.
pub struct GdnState<B: Backend + ?Sized> {
    conv: [B::Buf<f32>; 2],
    cur: usize,
    state: B::Buf<f32>,
    dims: GdnDims,
    seqs: usize,
}

impl<B: Backend + ?Sized> GdnState<B> {
    /// Zero history and state (new sequences).
    pub fn new(b: &B, dims: GdnDims, seqs: usize) -> Result<Self, KernelError> {
        let (conv, state) = Self::lens(&dims, seqs)?;
        Ok(GdnState {
            conv: [b.zeros(conv)?, b.zeros(conv)?],
            cur: 0,
            state: b.zeros(state)?,
            dims,
            seqs,
        })
    }

    /// History `[seqs, conv_dim, K-1]` and state `[seqs, Hv, dk, dv]` given on the host.
    pub fn from_host(
        b: &B,
        dims: GdnDims,
        seqs: usize,
        conv: &[f32],
        state: &[f32],
    ) -> Result<Self, KernelError> {
        const OP: &str = "GdnState::from_host";
        let (conv_len, state_len) = Self::lens(&dims, seqs)?;
        crate::ensure_shape!(
            conv.len() == conv_len && state.len() == state_len,
            OP,
            "conv has {} and state {} elements, expected {conv_len} and {state_len}",
            conv.len(),
            state.len()
        );
        Ok(GdnState {
            conv: [b.upload(conv)?, b.zeros(conv_len)?],
            cur: 0,
            state: b.upload(state)?,
            dims,
            seqs,
        })
    }

    fn lens(dims: &GdnDims, seqs: usize) -> Result<(usize, usize), KernelError> {
        const OP: &str = "GdnState::new";
        dims.validate(OP)?;
        crate::ensure_shape!(seqs > 0, OP, "seqs must be positive");
        let sizes = dims.checked_sizes(OP)?;
        Ok((
            checked_product(OP, "seqs*conv_state_len", &[seqs, sizes.conv_state_len])?,
            checked_product(OP, "seqs*state_len", &[seqs, sizes.state_len])?,
        ))
    }

    /// The current conv history, `[seqs, conv_dim, K-1]`.
    pub fn conv(&self) -> &B::Buf<f32> {
        &self.conv[self.cur]
    }

    /// The recurrent state, `[seqs, Hv, dk, dv]`.
    pub fn state(&self) -> &B::Buf<f32> {
        &self.state
    }

    /// The layer geometry the state was made for.
    pub fn dims(&self) -> GdnDims {
        self.dims
    }

    /// Sequences the state holds.
    pub fn seqs(&self) -> usize {
        self.seqs
    }

    /// Refuses a call whose geometry is not the state's.
    fn check(&self, op: &'static str, dims: &GdnDims) -> Result<(), KernelError> {
        crate::ensure_shape!(
            *dims == self.dims,
            op,
            "the state was made for {:?}, the call passes {dims:?}",
            self.dims
        );
        Ok(())
    }
}

/// One device's implementation of every op a forward pass needs. Implemented by [`Cpu`] and by [`Gpu`] (which
/// exists in every build and fails with [`KernelError::NotCompiledWithCuda`] without the `cuda` feature).
///
/// Buffers hold f32 activations unless a method says otherwise; every length is checked (products with checked
/// arithmetic) and a mismatch is a [`KernelError::Shape`] naming the op, never a crash. The module docs list
/// what differs between the devices.
pub trait Backend {
    /// A buffer of `T` on this device.
    type Buf<T: Scalar>;
    /// A linear layer's weights in this device's layout ([`Backend::prepare`]).
    type Linear;
    /// An embedding table on this device ([`Backend::prepare_table`]).
    type Table;

    /// `"cpu"` or `"cuda"`, for messages.
    fn name(&self) -> &'static str;

    // Memory.

    /// Copies `host` to a new buffer.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// let cpu = Cpu;
    /// let x = cpu.upload(&[1.0f32, 2.0])?;
    /// let z = cpu.zeros::<u32>(3)?;
    /// assert_eq!((cpu.len(&x), cpu.download(&z)?), (2, vec![0, 0, 0]));
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn upload<T: Scalar>(&self, host: &[T]) -> Result<Self::Buf<T>, KernelError>;
    /// A new zero-filled buffer of `len` elements (an allocation that cannot be made is an error).
    fn zeros<T: Scalar>(&self, len: usize) -> Result<Self::Buf<T>, KernelError>;
    /// Copies `buf` to the host, after every op queued before it has finished.
    fn download<T: Scalar>(&self, buf: &Self::Buf<T>) -> Result<Vec<T>, KernelError>;
    /// Elements in `buf`.
    fn len<T: Scalar>(&self, buf: &Self::Buf<T>) -> usize;

    // Weights, prepared once.

    /// Takes a linear layer's weights to this device's layout (the CPU keeps the [`Weight`]; the GPU uploads it,
    /// repacks FP8 and NVFP4 into the tile layout of its GEMVs and keeps the int4 pack as it is). Only
    /// [`Backend::linear`] of the same backend accepts the result. W4A8 needs weights on the symmetric grid: the GPU
    /// refuses others here, the CPU at the call.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu, Weight};
    /// let cpu = Cpu;
    /// // A 3x40 layer quantised to int4 in groups of 32 (the last group short), run as W4A16 and as W4A8: each
    /// // output is the dot product with the layer's own dequantised row (int8 holds all-ones activations exactly).
    /// let w: Vec<f32> = (0..120).map(|i| (i as f32 * 0.37).sin()).collect();
    /// for a8 in [false, true] {
    ///     let weight = Weight::int4_from_rows(3, 40, 32, a8, |r0, rows| {
    ///         rows.copy_from_slice(&w[r0 * 40..r0 * 40 + rows.len()]);
    ///         Ok(())
    ///     })?;
    ///     let mut row = vec![0.0f32; 40];
    ///     weight.row(2, &mut row)?;
    ///     let lin = cpu.prepare(weight)?;
    ///     let mut y = cpu.zeros::<f32>(3)?;
    ///     cpu.linear(&lin, &vec![1.0; 40], 1, &mut y)?;
    ///     assert!((y[2] - row.iter().sum::<f32>()).abs() < 1e-4);
    /// }
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn prepare(&self, w: Weight) -> Result<Self::Linear, KernelError>;
    /// Takes an embedding table to this device.
    fn prepare_table(&self, t: Embedding) -> Result<Self::Table, KernelError>;

    // Embedding.

    /// `out[i, :] = table[ids[i], :]` as f32 (`out`: `[ids.len(), dim]`); bf16 widens exactly, int4 dequantises
    /// as [`Int4Weights::gather_rows`].
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu, Embedding};
    /// let cpu = Cpu;
    /// let table = cpu.prepare_table(Embedding::f32(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 2)?)?;
    /// let ids = cpu.upload(&[2u32, 0])?;
    /// let mut out = cpu.zeros::<f32>(4)?;
    /// cpu.embedding_gather(&table, &ids, &mut out)?;
    /// assert_eq!(out, [4.0, 5.0, 0.0, 1.0]);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn embedding_gather(
        &self,
        table: &Self::Table,
        ids: &Self::Buf<u32>,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Norms.

    /// RMSNorm over rows of `weight.len()`: `out = x * rsqrt(mean(x^2) + eps) * w'`, `w' = w` or `1 + w` as
    /// `form` says. A per-head q/k norm is this call with a `[head_dim]` weight over `[tokens * heads, head_dim]`.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// use kernels::ops::NormWeight;
    /// let cpu = Cpu;
    /// // Two heads of head_dim 2 normed by one [2] weight (a q norm); then the fused residual form.
    /// let (x, w) = (vec![3.0f32, 4.0, 1.0, 1.0], vec![1.0f32, 0.0]);
    /// let mut out = cpu.zeros::<f32>(4)?;
    /// cpu.rmsnorm(&x, &w, NormWeight::OnePlus, 0.0, &mut out)?;
    /// let r = (12.5f32).sqrt();
    /// assert!((out[0] - 2.0 * 3.0 / r).abs() < 1e-6 && (out[1] - 4.0 / r).abs() < 1e-6);
    /// let mut residual = vec![1.0f32, 0.0, -1.0, 0.0];
    /// cpu.add_rmsnorm(&x, &mut residual, &w, NormWeight::Plain, 0.0, &mut out)?;
    /// assert_eq!(residual, [4.0, 4.0, 0.0, 1.0]);
    /// assert_eq!((out[1], out[3]), (0.0, 0.0));
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn rmsnorm(
        &self,
        x: &Self::Buf<f32>,
        weight: &Self::Buf<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;
    /// The fused residual step of a decoder layer: `residual += x`, then `out = rmsnorm(residual)` as
    /// [`Backend::rmsnorm`]. Every size is checked before `residual` is written.
    fn add_rmsnorm(
        &self,
        x: &Self::Buf<f32>,
        residual: &mut Self::Buf<f32>,
        weight: &Self::Buf<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // RoPE.

    /// Neox RoPE in place on `x` (`[tokens, heads, head_dim]`), token `i` at `positions[i]`; dims past
    /// `rope.rotary_dim` (a partial rotary factor) pass through; the theta is the layer type's ([`Rope`]).
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// use kernels::attention::Rope;
    /// let cpu = Cpu;
    /// // head_dim 4, half of it rotated: position 0 is the identity, the last two dims never move.
    /// let rope = Rope::new(4, 0.5, 10_000.0)?;
    /// let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
    /// cpu.rope_neox(&rope, 1, &vec![0u32, 1], &mut x)?;
    /// assert_eq!(x[..4], [1.0, 2.0, 3.0, 4.0]);
    /// assert_eq!(x[6..], [3.0, 4.0]);
    /// assert!((x[4] - (1.0f32.cos() - 2.0 * 1.0f32.sin())).abs() < 1e-6);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn rope_neox(
        &self,
        rope: &Rope,
        heads: usize,
        positions: &Self::Buf<u32>,
        x: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Attention.

    /// Stores token `i`'s key and value rows (`k`, `v`: `[t, kv_heads * head_dim]`) at `(slots[i], pos[i])` of
    /// `cache`; `t = slots.len() = pos.len()`. Store a step's tokens before [`Backend::attention`] reads them.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu, KvCache};
    /// use kernels::attention::AttnDims;
    /// let cpu = Cpu;
    /// let dims = AttnDims { q_heads: 2, kv_heads: 1, head_dim: 2 };
    /// let mut cache = KvCache::new(&cpu, dims, 1, 8)?;
    /// // A prompt of two tokens in slot 0: store, then attend (causal).
    /// let (slots, pos) = (vec![0u32, 0], vec![0u32, 1]);
    /// let k = vec![1.0f32, 0.0, 0.0, 1.0];
    /// let v = vec![1.0f32, 2.0, 3.0, 4.0];
    /// cpu.kv_store(&mut cache, &k, &v, &slots, &pos)?;
    /// let q = vec![0.0f32; 8];
    /// let mut out = cpu.zeros::<f32>(8)?;
    /// cpu.attention(&cache, 1.0, None, &q, &slots, &pos, &mut out)?;
    /// // Token 0 sees only itself; token 1 averages both values (equal scores).
    /// assert_eq!(out[..4], [1.0, 2.0, 1.0, 2.0]);
    /// assert_eq!(out[4..], [2.0, 3.0, 2.0, 3.0]);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn kv_store(
        &self,
        cache: &mut KvCache<Self>,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        slots: &Self::Buf<u32>,
        pos: &Self::Buf<u32>,
    ) -> Result<(), KernelError>;
    /// `out[i, h, :] = softmax_j(scale * q[i, h] . K[slots[i], j]) V[slots[i], j]` over `j in [lo, pos[i]]`,
    /// `lo = pos[i] + 1 - W` (at least 0) with a sliding `window = Some(W)`, else 0; grouped-query (query head `h`
    /// reads KV head `h / (q_heads / kv_heads)`). `q`, `out`: `[t, q_heads * head_dim]`. Each token's own key and
    /// value must be stored first. One call serves a prompt, a chunk after a cached prefix and a decode batch;
    /// the CPU runs its causal prefill kernel when the call is one slot's tokens from position 0, its paged decode
    /// otherwise.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        cache: &KvCache<Self>,
        scale: f32,
        window: Option<usize>,
        q: &Self::Buf<f32>,
        slots: &Self::Buf<u32>,
        pos: &Self::Buf<u32>,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Output gates.

    /// `x *= sigmoid(gate)` element-wise (Qwen3.5's per-element attention output gate).
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// let cpu = Cpu;
    /// let mut x = vec![2.0f32; 4];
    /// cpu.sigmoid_gate(&mut x, &vec![0.0, 0.0, 100.0, -100.0])?;
    /// assert_eq!(x[..3], [1.0, 1.0, 2.0]);
    /// // Per head: x is [rows, heads, head_dim], the gate [rows, heads].
    /// let mut y = vec![2.0f32; 4];
    /// cpu.sigmoid_head_gate(&mut y, 2, &vec![0.0, 100.0])?;
    /// assert_eq!(y, [1.0, 1.0, 2.0, 2.0]);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn sigmoid_gate(
        &self,
        x: &mut Self::Buf<f32>,
        gate: &Self::Buf<f32>,
    ) -> Result<(), KernelError>;
    /// `x[r, h, :] *= sigmoid(gate[r, h])`: `x` `[rows, heads, d]`, `gate` `[rows, heads]` (Spark's per-head gate).
    fn sigmoid_head_gate(
        &self,
        x: &mut Self::Buf<f32>,
        heads: usize,
        gate: &Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Gated DeltaNet.

    /// One decode step (conv, gates, delta-rule update, gated RMSNorm) for every sequence of `state`, one token
    /// each: `x` holds `state.seqs()` rows, `out` is `[seqs, Hv*dv]`.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu, GdnIn, GdnLayer, GdnState};
    /// use kernels::gdn::{GdnDims, GdnWeights};
    /// let cpu = Cpu;
    /// let dims = GdnDims { key_heads: 1, value_heads: 1, key_dim: 4, value_dim: 4, conv_kernel: 4 };
    /// let cd = dims.conv_dim();
    /// let layer = GdnLayer::upload(&cpu, &GdnWeights {
    ///     conv_weight: &vec![0.25; cd * 4], a_log: &[0.0], dt_bias: &[0.0], norm_weight: &[1.0; 4], norm_eps: 1e-6,
    /// })?;
    /// let mut state = GdnState::new(&cpu, dims, 1)?;
    /// // A three-token prompt, then one decode step.
    /// let (qkv, z, ab) = (vec![0.5f32; 3 * cd], vec![1.0f32; 3 * 4], vec![0.0f32; 3]);
    /// let mut out = cpu.zeros::<f32>(3 * 4)?;
    /// cpu.gdn_prefill(&dims, &layer, &GdnIn { qkv: &qkv, z: &z, a: &ab, b: &ab }, &[3], &mut state, &mut out)?;
    /// let mut one = cpu.zeros::<f32>(4)?;
    /// let x = GdnIn { qkv: &qkv[..cd].to_vec(), z: &z[..4].to_vec(), a: &vec![0.0], b: &vec![0.0] };
    /// cpu.gdn_decode(&dims, &layer, &x, &mut state, &mut one)?;
    /// assert!(out.iter().chain(&one).all(|v| v.is_finite()));
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn gdn_decode(
        &self,
        dims: &GdnDims,
        w: &GdnLayer<Self>,
        x: &GdnIn<'_, Self>,
        state: &mut GdnState<Self>,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;
    /// Chunked prefill: sequence `i` of `state` takes `seq_lens[i]` tokens (0 allowed), stored consecutively in
    /// `x` and `out` (`[sum(seq_lens), ..]`), continuing from its history and state and leaving them as that many
    /// decode steps would.
    fn gdn_prefill(
        &self,
        dims: &GdnDims,
        w: &GdnLayer<Self>,
        x: &GdnIn<'_, Self>,
        seq_lens: &[usize],
        state: &mut GdnState<Self>,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Gated MLP.

    /// `out[r, i] = act(gate_up[r, i]) * gate_up[r, inter + i]` (`gate_up`: `[rows, 2*inter]`, gate first;
    /// `out`: `[rows, inter]`), the activation a model's `hidden_act` names ([`GatedAct`]).
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// use kernels::ops::GatedAct;
    /// let cpu = Cpu;
    /// let gate_up = vec![0.0f32, 10.0, 3.0, 2.0]; // one row, inter = 2
    /// let mut out = cpu.zeros::<f32>(2)?;
    /// for act in [GatedAct::Silu, GatedAct::GeluErf, GatedAct::GeluTanh] {
    ///     cpu.act_and_mul(act, &gate_up, 2, &mut out)?;
    ///     assert_eq!(out[0], 0.0);
    ///     assert!((out[1] - 20.0).abs() < 1e-3);
    /// }
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn act_and_mul(
        &self,
        act: GatedAct,
        gate_up: &Self::Buf<f32>,
        inter: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Linear.

    /// `y[m, n] = x[m, k] . W[n, k]^T` with the kernel of `w`'s format for `m` rows (one token or many).
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu, Weight};
    /// use kernels::formats::f32_to_bf16;
    /// let cpu = Cpu;
    /// // A bf16 2x3 layer, prepared once, applied to one row and to two.
    /// let bits = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.0].map(f32_to_bf16).to_vec();
    /// let w = cpu.prepare(Weight::bf16(bits, 2, 3)?)?;
    /// let mut y = cpu.zeros::<f32>(2)?;
    /// cpu.linear(&w, &vec![1.0, 1.0, 1.0], 1, &mut y)?;
    /// assert_eq!(y, [6.0, -0.5]);
    /// let mut y2 = cpu.zeros::<f32>(4)?;
    /// cpu.linear(&w, &vec![1.0, 1.0, 1.0, 0.0, 0.0, 2.0], 2, &mut y2)?;
    /// assert_eq!(y2, [6.0, -0.5, 6.0, 0.0]);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn linear(
        &self,
        w: &Self::Linear,
        x: &Self::Buf<f32>,
        m: usize,
        y: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Mixture of experts.

    /// Routes `tokens = logits.len() / experts` tokens as [`crate::moe::route`]: softmax over each row of router
    /// logits (`[tokens, experts]`), the `top_k` most probable experts (the larger first, the lower id on ties)
    /// into `ids` and their probabilities into `weights` (both `[tokens, top_k]`), divided by their sum when
    /// `renormalize` (`norm_topk_prob`); `1 <= top_k <= experts`.
    ///
    /// A sparse layer (Qwen3-Next's) is then: download `ids` and group the pairs by expert on the host
    /// ([`crate::moe::dispatch_ids`]: each expert's row count decides its linear's `m`), upload the dispatch's
    /// token list and pair rows, run every expert that has rows on them ([`Backend::moe_gather`], its linears), and
    /// add each token's expert outputs with its weights ([`Backend::moe_combine`]).
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu, Weight};
    /// use kernels::moe::dispatch_ids;
    /// let cpu = Cpu;
    /// // Two tokens of hidden 2, three experts (expert e multiplies by e + 1), top-2 renormalised.
    /// let x = cpu.upload(&[1.0f32, 0.0, 0.0, 1.0])?;
    /// let logits = cpu.upload(&[2.0f32, 1.0, 0.0, 0.0, 0.0, 3.0])?;
    /// let (mut ids, mut weights) = (cpu.zeros::<u32>(4)?, cpu.zeros::<f32>(4)?);
    /// cpu.moe_route(&logits, 3, 2, true, &mut ids, &mut weights)?;
    /// assert_eq!(cpu.download(&ids)?, [0, 1, 2, 0]);
    /// let d = dispatch_ids(&cpu.download(&ids)?, 3, 2)?;
    /// let (tokens, pair_rows) = (cpu.upload(d.all_tokens())?, cpu.upload(&d.pair_rows()?)?);
    /// let mut outs = Vec::new();
    /// for e in 0..3 {
    ///     let rows = d.tokens(e).len();
    ///     if rows == 0 {
    ///         continue;
    ///     }
    ///     let s = e as f32 + 1.0;
    ///     let w = cpu.prepare(Weight::f32(vec![s, 0.0, 0.0, s], 2, 2)?)?;
    ///     let mut xe = cpu.zeros::<f32>(rows * 2)?;
    ///     cpu.moe_gather(&x, 2, &tokens, d.offset(e), &mut xe)?;
    ///     let mut ye = cpu.zeros::<f32>(rows * 2)?;
    ///     cpu.linear(&w, &xe, rows, &mut ye)?;
    ///     outs.push(ye);
    /// }
    /// let mut out = cpu.zeros::<f32>(4)?;
    /// cpu.moe_combine(&outs.iter().collect::<Vec<_>>(), 2, 2, &weights, &pair_rows, &mut out)?;
    /// // Token 0 is [1, 0] through experts 0 and 1; token 1 is [0, 1] through experts 2 and 0.
    /// let w = cpu.download(&weights)?;
    /// assert!((out[0] - (w[0] * 1.0 + w[1] * 2.0)).abs() < 1e-6 && out[1] == 0.0);
    /// assert!((out[3] - (w[2] * 3.0 + w[3] * 1.0)).abs() < 1e-6 && out[2] == 0.0);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn moe_route(
        &self,
        logits: &Self::Buf<f32>,
        experts: usize,
        top_k: usize,
        renormalize: bool,
        ids: &mut Self::Buf<u32>,
        weights: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;
    /// `out[r, :] = x[tokens[start + r], :]` for every row of `out` (`[rows, hidden]`; `x` `[x_rows, hidden]`):
    /// one expert's rows of the hidden states, `tokens` a dispatch's token list
    /// ([`crate::moe::Dispatch::all_tokens`]) and `start` the expert's offset in it ([`crate::moe::Dispatch::offset`]).
    /// Needs `start + rows <= tokens.len()`.
    fn moe_gather(
        &self,
        x: &Self::Buf<f32>,
        hidden: usize,
        tokens: &Self::Buf<u32>,
        start: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;
    /// `out[t, :] = sum_j weights[t, j] * expert_out[pair_rows[t, j], :]` over `j < top_k`, added in `j` order
    /// from zero with one rounding per product and per sum on both devices, so the same bits on both and no
    /// dependence on thread timing. `expert_out` is `parts` one after another (each expert's output rows, experts
    /// in dispatch order, those without rows left out or empty), `[rows, hidden]`; `weights` and `pair_rows`
    /// (`[tokens, top_k]`) are the routing's weights and [`crate::moe::Dispatch::pair_rows`]; `out`
    /// (`[tokens, hidden]`) is overwritten.
    fn moe_combine(
        &self,
        parts: &[&Self::Buf<f32>],
        hidden: usize,
        top_k: usize,
        weights: &Self::Buf<f32>,
        pair_rows: &Self::Buf<u32>,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;

    // Logits and small elementwise ops.

    /// `x = cap * tanh(x / cap)` element-wise (Gemma's logit softcap); `cap` finite and positive.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// let cpu = Cpu;
    /// let mut logits = vec![0.0f32, 100.0, -3.0, 1.0, 5.0, 2.0];
    /// cpu.softcap(&mut logits, 30.0)?;
    /// assert!(logits[1] < 30.0);
    /// let mut best = cpu.zeros::<u32>(2)?;
    /// cpu.argmax(&logits, 3, &mut best)?; // two rows of a vocabulary of 3
    /// assert_eq!(best, [1, 1]);
    /// let mut bits = cpu.zeros::<u16>(6)?;
    /// cpu.cast_f32_to_bf16(&logits, &mut bits)?;
    /// let mut back = cpu.zeros::<f32>(6)?;
    /// cpu.cast_bf16_to_f32(&bits, &mut back)?;
    /// assert_eq!(back[0], 0.0);
    /// let mut x = vec![1.0f32, 2.0, 3.0, 4.0];
    /// cpu.add_assign(&mut x, &vec![1.0; 4])?;
    /// cpu.add_bias_rows(&mut x, &vec![10.0, 20.0])?;
    /// cpu.scale_assign(&mut x, 0.5)?;
    /// assert_eq!(x, [6.0, 11.5, 7.0, 12.5]);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn softcap(&self, x: &mut Self::Buf<f32>, cap: f32) -> Result<(), KernelError>;
    /// Per row of `logits` (`[rows, vocab]`, `rows = out.len()`), the index of the largest value (the first on
    /// ties). A NaN logit is an error on the CPU and [`Gpu::INVALID_TOKEN`] on the GPU.
    fn argmax(
        &self,
        logits: &Self::Buf<f32>,
        vocab: usize,
        out: &mut Self::Buf<u32>,
    ) -> Result<(), KernelError>;
    /// Per row of `logits` (`[rows, vocab]`, `rows = out.len()`), a token drawn under `params` with that row's
    /// generator, as [`crate::sampling::sample`] draws it: `rng` holds `[rows, 4]` words
    /// ([`crate::sampling::Pcg32::to_words`]), advanced in place as the draw advances it (greedy and
    /// single-candidate rows leave it). The same tokens and words on both devices; the GPU takes at most
    /// [`Gpu::SAMPLE_TOP_K_MAX`] candidates (`top_k = 0` over a larger vocabulary is refused there,
    /// [`Gpu::can_sample`]), and answers [`Gpu::INVALID_TOKEN`] for a row with a NaN or +inf logit, which the CPU
    /// refuses.
    ///
    /// ```
    /// use kernels::backend::{Backend, Cpu};
    /// use kernels::sampling::{Pcg32, SamplingParams};
    /// let cpu = Cpu;
    /// let logits = vec![0.0f32, 5.0, 1.0, 9.0, 2.0, 0.0];
    /// let mut rng: Vec<u32> = [Pcg32::new(1, 0), Pcg32::new(2, 0)].iter().flat_map(|g| g.to_words()).collect();
    /// let mut out = vec![0u32; 2];
    /// cpu.sample(&logits, 3, &SamplingParams::GREEDY, &mut rng, &mut out)?;
    /// assert_eq!(out, [1, 0]);
    /// # Ok::<(), kernels::KernelError>(())
    /// ```
    fn sample(
        &self,
        logits: &Self::Buf<f32>,
        vocab: usize,
        params: &crate::sampling::SamplingParams,
        rng: &mut Self::Buf<u32>,
        out: &mut Self::Buf<u32>,
    ) -> Result<(), KernelError>;
    /// `x += y` element-wise (the residual add).
    fn add_assign(&self, x: &mut Self::Buf<f32>, y: &Self::Buf<f32>) -> Result<(), KernelError>;
    /// `x[r, :] += bias` for every row of `x` (`[rows, bias.len()]`).
    fn add_bias_rows(
        &self,
        x: &mut Self::Buf<f32>,
        bias: &Self::Buf<f32>,
    ) -> Result<(), KernelError>;
    /// `x *= s` element-wise (an embedding scale).
    fn scale_assign(&self, x: &mut Self::Buf<f32>, s: f32) -> Result<(), KernelError>;

    // Casts.

    /// `out = bf16(x)` element-wise, rounded to nearest even ([`crate::formats::f32_to_bf16`]).
    fn cast_f32_to_bf16(
        &self,
        x: &Self::Buf<f32>,
        out: &mut Self::Buf<u16>,
    ) -> Result<(), KernelError>;
    /// `out = f32(x)` element-wise, exact.
    fn cast_bf16_to_f32(
        &self,
        x: &Self::Buf<u16>,
        out: &mut Self::Buf<f32>,
    ) -> Result<(), KernelError>;
}

/// Rows of a gated DeltaNet call's inputs: checks `x` against `tokens` rows of `dims` and returns the sizes.
fn check_gdn_inputs<B: Backend + ?Sized>(
    b: &B,
    op: &'static str,
    dims: &GdnDims,
    tokens: usize,
    x: &GdnIn<'_, B>,
    out: &B::Buf<f32>,
) -> Result<(), KernelError> {
    dims.validate(op)?;
    let s = dims.checked_sizes(op)?;
    for (name, len, width) in [
        ("qkv", b.len(x.qkv), s.conv_dim),
        ("z", b.len(x.z), s.value_width),
        ("a", b.len(x.a), dims.value_heads),
        ("b", b.len(x.b), dims.value_heads),
        ("out", b.len(out), s.value_width),
    ] {
        let want = checked_product(op, "tokens*width", &[tokens, width])?;
        crate::ensure_shape!(
            len == want,
            op,
            "{name} has {len} elements, expected {tokens} tokens x {width}"
        );
    }
    Ok(())
}
