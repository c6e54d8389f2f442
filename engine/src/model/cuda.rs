//! The forward pass on a CUDA GPU (`--device cuda`): the same layer sequence as [`Model::forward`], every op a
//! kernel of `kernels::cuda`, activations in f32 device buffers.
//!
//! Weights are taken from a loaded [`Model`] (so the checkpoint is read and checked by the one loader) and placed in
//! device memory in the layout the GPU kernels read fastest: FP8 blocks and NVFP4 repacked into the decode GEMVs'
//! tiles, f32 and bf16 kept dense. The embedding stays on the host and only the rows a step needs cross the link.
//! GPTQ int4 has no GPU kernel: it is widened to bf16 at load ([`CudaModel::paths`] says `bf16`). The parity path
//! (`precise`) computes every format in f32 from its dequantized rows instead.
//!
//! Caches: K/V in f32, one contiguous block of `max_len` positions per slot and layer (the exact path's numbers;
//! sliding layers read only their window), and the DeltaNet conv histories (a pair per slot: a step reads the one
//! its position's parity names and writes the other) and recurrent states, one buffer per layer indexed by slot
//! inside the kernel, so no state is gathered or copied around a decode step.
//!
//! Decode steps are recorded as CUDA graphs, one per batch size (every kernel reads the step's slots and positions
//! from device buffers, so one graph serves any batch of its size): the first step of a size runs launch by launch
//! (it loads the modules and fills the scratch pool), the second is recorded and every later one is one graph
//! launch. `EDGEFIT_CUDA_GRAPHS=0` turns that off (the benchmarks' other arm).
//!
//! Scratch comes from a pool keyed by length, so a decode step allocates nothing once every shape has been seen.
//!
//! Linears the plan places in host memory ([`CudaOptions::streamed`]) are kept there pinned, in the tile layout,
//! and copied on a second stream into staging buffers a layer ahead of the compute ([`Streamer`]): a step then
//! costs the larger of the transfer and the compute, not their sum (`benchmarks/engine-h200.md`: 1.00 of the
//! larger on the capped 27B). Prompts of more than 16 rows run the tensor-core GEMMs on a second copy of the FP8 /
//! NVFP4 weights in the checkpoint layout, where the device has room for it ([`CudaOptions::gemm_copies`]).

use std::collections::HashMap;

use kernels::attention::{AttnDims, Rope};
use kernels::backend::Weight;
use kernels::cuda::{
    CopyStream, DenseGpuWeights, Fp8TileWeights, GdnGpuInputs, GdnGpuWeights, GdnPrefillIo,
    GdnStackedInputs, Gpu, GpuBuffer, GpuEvent, GpuScalar, Int4GpuWeights, Nvfp4Fragments,
    Nvfp4TileWeights, PagedAttentionDims, PinnedWeights, PrefillChunk, WeightBuf, WeightBufMut,
};
use kernels::gdn::GdnDims;
use kernels::linear::Int4Scheme;
use kernels::sampling::{Pcg32, SamplingParams};
use kernels::KernelError;

use crate::Draw;
use kernels::ops::{GatedAct, NormWeight};
use planner::model::{Activation, OutputGate};

use super::{kerr, CudaCacheSizes, Embedding, GateUp, Mixer, Model, Qkv, Step, Table};
use crate::profile::{self, Op};
use crate::setup::{LinearRole, Streamed};
use crate::EngineError;

/// A linear layer's weights on the device.
enum GLinear {
    Dense(DenseGpuWeights),
    Fp8 {
        tiles: Fp8TileWeights,
        scales: GpuBuffer<f32>,
        /// The checkpoint layout too, for the prefill GEMM, where the device has room for both.
        raw: Option<GpuBuffer<u8>>,
    },
    Nvfp4 {
        tiles: Nvfp4TileWeights,
        global: f32,
        /// The checkpoint layout (values, e4m3 scales) for the prefill GEMM, as for FP8.
        raw: Option<(GpuBuffer<u8>, GpuBuffer<u8>)>,
        /// A short matrix's rows dequantized exactly to f32, which steps of at most 16 rows read instead of the
        /// tiles ([`NVFP4_F32_ROWS_MAX_N`]); kept beside the GEMM's copy, where the device has room for both.
        rows: Option<DenseGpuWeights>,
    },
    /// GPTQ / int4 weights (W4A16 or W4A8 packs) on the W4A16 GEMV: f32 activations, which the symmetric W4A8
    /// pack takes too (zero points 0). The W4A8 kernel reads the same weight bytes and would need an
    /// [`kernels::cuda::Int4A8Scratch`] kept per model (a recorded step allocates nothing); not wired yet.
    Int4(Int4GpuWeights),
    /// Placed in host memory by the plan: streamed into `stage`'s device buffers before its layer runs.
    Host(Box<HostLinear>),
}

/// A streamed linear's pinned host copy, in the device layout, and the staging buffers it is copied into.
struct HostLinear {
    w: PinnedWeights,
    stage: usize,
    n: usize,
    k: usize,
    path: &'static str,
    /// NVFP4's global scale (set on the stage when it is filled).
    global: f32,
}

impl GLinear {
    fn n(&self) -> usize {
        match self {
            GLinear::Dense(w) => w.n(),
            GLinear::Fp8 { tiles, .. } => tiles.n(),
            GLinear::Nvfp4 { tiles, .. } => tiles.n(),
            GLinear::Int4(w) => w.n(),
            GLinear::Host(h) => h.n,
        }
    }
    fn k(&self) -> usize {
        match self {
            GLinear::Dense(w) => w.k(),
            GLinear::Fp8 { tiles, .. } => tiles.k(),
            GLinear::Nvfp4 { tiles, .. } => tiles.k(),
            GLinear::Int4(w) => w.k(),
            GLinear::Host(h) => h.k,
        }
    }
    /// The device buffers, in a fixed order (what a host copy holds and a refill writes).
    fn buffers(&self) -> Vec<WeightBuf<'_>> {
        match self {
            GLinear::Dense(w) => w.buffers(),
            GLinear::Fp8 { tiles, scales, .. } => {
                let mut v = tiles.buffers();
                v.push(WeightBuf::F32(scales));
                v
            }
            GLinear::Nvfp4 { tiles, .. } => tiles.buffers(),
            GLinear::Int4(w) => w.buffers(),
            GLinear::Host(_) => Vec::new(),
        }
    }
    fn buffers_mut(&mut self) -> Vec<WeightBufMut<'_>> {
        match self {
            GLinear::Dense(w) => w.buffers_mut(),
            GLinear::Fp8 { tiles, scales, .. } => {
                let mut v = tiles.buffers_mut();
                v.push(WeightBufMut::F32(scales));
                v
            }
            GLinear::Nvfp4 { tiles, .. } => tiles.buffers_mut(),
            GLinear::Int4(w) => w.buffers_mut(),
            GLinear::Host(_) => Vec::new(),
        }
    }
    /// Device bytes (a streamed linear holds none of its own).
    fn bytes(&self) -> usize {
        match self {
            GLinear::Host(_) => 0,
            GLinear::Dense(w) => w.device_bytes(),
            // The tile layout: 2 KiB per 16 rows x 128 columns.
            GLinear::Fp8 { tiles, scales, .. } => {
                tiles.n().div_ceil(16) * tiles.k().div_ceil(128) * 2048 + scales.len() * 4
            }
            // A decode step reads the f32 rows where they exist, else the tiles.
            GLinear::Nvfp4 { rows: Some(r), .. } => r.device_bytes(),
            GLinear::Nvfp4 { tiles, .. } => tiles.device_bytes(),
            GLinear::Int4(w) => w.device_bytes(),
        }
    }
    /// Device bytes of the copies a decode step does not read: the prefill GEMM's checkpoint layout, and an NVFP4
    /// linear's tiles where its f32 rows serve decode.
    fn gemm_bytes(&self) -> usize {
        match self {
            GLinear::Fp8 { raw: Some(r), .. } => r.len(),
            GLinear::Nvfp4 {
                raw, rows, tiles, ..
            } => {
                raw.as_ref().map_or(0, |(w, s)| w.len() + s.len())
                    + rows.as_ref().map_or(0, |_| tiles.device_bytes())
            }
            _ => 0,
        }
    }
    /// Whether a tile GEMV computes it (it reads bf16 activations; the dense and int4 ones read f32).
    fn tiled(&self) -> bool {
        matches!(self.path_name(), "fp8-block" | "nvfp4")
    }

    /// Whether a step of `m` rows computes it on a tile GEMV, from bf16 activations alone: a short NVFP4 matrix's
    /// exact f32 rows read the f32 activations at m <= 16 ([`f32_linear`]), so its caller must keep those current.
    fn tiled_at(&self, m: usize) -> bool {
        let rows = matches!(self, GLinear::Nvfp4 { rows: Some(_), .. }) && m <= F32_ROWS_MAX_M;
        self.tiled() && !rows
    }

    fn path_name(&self) -> &'static str {
        match self {
            GLinear::Dense(DenseGpuWeights::F32 { .. }) => "f32",
            GLinear::Dense(DenseGpuWeights::Bf16 { .. }) => "bf16",
            GLinear::Fp8 { .. } => "fp8-block",
            GLinear::Nvfp4 { .. } => "nvfp4",
            GLinear::Int4(_) => "int4-w4a16",
            GLinear::Host(h) => h.path,
        }
    }
}

#[allow(clippy::large_enum_variant)] // one per attention layer, built once
enum GQkv {
    Split { q: GLinear, k: GLinear, v: GLinear },
    Fused { w: GLinear, q_rows: usize },
}

struct GAttn {
    qkv: GQkv,
    o: GLinear,
    biases: [Option<GpuBuffer<f32>>; 4],
    g_proj: Option<GLinear>,
    q_norm: Option<GpuBuffer<f32>>,
    k_norm: Option<GpuBuffer<f32>>,
    rope: Rope,
    window: Option<usize>,
}

struct GGdn {
    /// `in_proj_qkv` and `in_proj_z` as one linear (the step reads its rows as `[qkv | z]`) where both share a
    /// format and a placement; else the two, their outputs stitched into that layout.
    qkvz: Vec<GLinear>,
    /// `in_proj_b` and `in_proj_a` likewise, rows `[b | a]`.
    ba: Vec<GLinear>,
    out: GLinear,
    conv: GpuBuffer<f32>,
    a_log: GpuBuffer<f32>,
    dt_bias: GpuBuffer<f32>,
    norm: GpuBuffer<f32>,
}

enum GMixer {
    Attn(Box<GAttn>),
    Gdn(Box<GGdn>),
}

#[allow(clippy::large_enum_variant)] // one per layer, built once
enum GGateUp {
    Fused(GLinear),
    Split { gate: GLinear, up: GLinear },
}

struct GLayer {
    input_norm: GpuBuffer<f32>,
    post_attn_norm: GpuBuffer<f32>,
    pre_ff_norm: Option<GpuBuffer<f32>>,
    post_ff_norm: Option<GpuBuffer<f32>>,
    mixer: GMixer,
    gate_up: GGateUp,
    down: GLinear,
}

impl GLayer {
    /// Whether one of the mixer's input projections is a tile GEMV: its normed input is then worth writing in
    /// bf16 too, by the norm itself ([`Gpu::add_rmsnorm_dual`]), instead of a cast launch in the layer.
    fn mixer_reads_bf16(&self) -> bool {
        match &self.mixer {
            GMixer::Attn(a) => match &a.qkv {
                GQkv::Split { q, k, v } => q.tiled() || k.tiled() || v.tiled(),
                GQkv::Fused { w, .. } => w.tiled(),
            },
            GMixer::Gdn(g) => g.qkvz.iter().chain(&g.ba).any(GLinear::tiled),
        }
    }
}

/// Where a step's embedding rows come from (host memory).
enum HostEmbed {
    Table(Table),
    /// The tied table, held as the host copy of the head.
    Head(Weight),
}

enum LayerState {
    Attn {
        k: GpuBuffer<f32>,
        v: GpuBuffer<f32>,
    },
    /// Every slot's DeltaNet caches in one buffer each, indexed by slot inside the kernel
    /// ([`Gpu::gdn_decode_step_slots`]), so a recorded step serves any batch of its size: `conv`
    /// `[slots, 2, conv_dim*(K-1)]` (a pair per slot, read from the half the position's parity names and written to
    /// the other), `state` `[slots, Hv*dk*dv]`.
    Gdn {
        conv: GpuBuffer<f32>,
        state: GpuBuffer<f32>,
    },
}

/// Device scratch, reused by length. A step's buffers come back after it and serve the next step of the same
/// shapes. Lengths that depend on a prompt's chunk (`t` rows, the cached prefix) would otherwise pile up one set
/// per distinct length until the device ran out, so the [`Ledger`] frees the least recently used of those past
/// [`POOL_CAP_BYTES`]; lengths a decode step has taken are never freed (a recorded graph holds their pointers,
/// and the next recording must find them).
#[derive(Default)]
struct Pool {
    f32s: HashMap<usize, Vec<GpuBuffer<f32>>>,
    u16s: HashMap<usize, Vec<GpuBuffer<u16>>>,
    u8s: HashMap<usize, Vec<GpuBuffer<u8>>>,
    ledger: Ledger,
    /// While a graph is recorded nothing may be allocated: a length the pool lacks is an error then.
    frozen: bool,
    /// Set for a decode step: the lengths it takes are pinned.
    pin: bool,
}

/// Free pooled bytes of unpinned lengths the pool keeps before it frees the least recently used.
const POOL_CAP_BYTES: usize = 2 << 30;

/// A pooled length: the element type (its size in bytes) and the element count.
type PoolKey = (usize, usize);

/// What the pool holds, by [`PoolKey`], and which lengths to free: the device-free bookkeeping of [`Pool`].
#[derive(Default)]
struct Ledger {
    /// Buffers held now, and when each key was last taken or given back.
    held: HashMap<PoolKey, (usize, u64)>,
    pinned: std::collections::HashSet<PoolKey>,
    /// Bytes held under unpinned keys.
    loose: usize,
    clock: u64,
}

impl Ledger {
    fn bytes((size, len): PoolKey) -> usize {
        size * len
    }

    fn take(&mut self, key: PoolKey, pin: bool, found: bool) {
        self.clock += 1;
        if pin && self.pinned.insert(key) {
            self.loose -= Self::bytes(key) * self.held.get(&key).map_or(0, |h| h.0);
        }
        let h = self.held.entry(key).or_insert((0, 0));
        h.1 = self.clock;
        if found {
            h.0 -= 1;
            if !self.pinned.contains(&key) {
                self.loose -= Self::bytes(key);
            }
        }
    }

    /// Records a buffer given back and returns the keys to free one buffer of each, oldest first, so that the
    /// unpinned bytes held fit `cap` (never `key` itself: what a step just used is what it is likely to use next).
    fn put(&mut self, key: PoolKey, cap: usize) -> Vec<PoolKey> {
        self.clock += 1;
        let h = self.held.entry(key).or_insert((0, 0));
        h.0 += 1;
        h.1 = self.clock;
        if self.pinned.contains(&key) {
            return Vec::new();
        }
        self.loose += Self::bytes(key);
        let mut evict = Vec::new();
        while self.loose > cap {
            let oldest = self
                .held
                .iter()
                .filter(|(k, h)| h.0 > 0 && **k != key && !self.pinned.contains(k))
                .min_by_key(|(_, h)| h.1)
                .map(|(k, _)| *k);
            let Some(k) = oldest else { break };
            if let Some(h) = self.held.get_mut(&k) {
                h.0 -= 1;
            }
            self.loose -= Self::bytes(k);
            evict.push(k);
        }
        evict
    }
}

impl Pool {
    fn take<T: GpuScalar>(
        map: &mut HashMap<usize, Vec<GpuBuffer<T>>>,
        ledger: &mut Ledger,
        gpu: &Gpu,
        len: usize,
        (frozen, pin): (bool, bool),
    ) -> Result<GpuBuffer<T>, EngineError> {
        let found = map.get_mut(&len).and_then(Vec::pop);
        ledger.take((std::mem::size_of::<T>(), len), pin, found.is_some());
        match found {
            Some(b) => Ok(b),
            None if frozen => Err(EngineError::Kernel(format!(
                "recording a graph: no pooled buffer of {len} elements"
            ))),
            None => gpu.zeros::<T>(len).map_err(kerr),
        }
    }
    fn f32(&mut self, gpu: &Gpu, len: usize) -> Result<GpuBuffer<f32>, EngineError> {
        Self::take(
            &mut self.f32s,
            &mut self.ledger,
            gpu,
            len,
            (self.frozen, self.pin),
        )
    }
    fn u16(&mut self, gpu: &Gpu, len: usize) -> Result<GpuBuffer<u16>, EngineError> {
        Self::take(
            &mut self.u16s,
            &mut self.ledger,
            gpu,
            len,
            (self.frozen, self.pin),
        )
    }
    fn u8(&mut self, gpu: &Gpu, len: usize) -> Result<GpuBuffer<u8>, EngineError> {
        Self::take(
            &mut self.u8s,
            &mut self.ledger,
            gpu,
            len,
            (self.frozen, self.pin),
        )
    }
    fn give<T: GpuScalar>(
        &mut self,
        b: GpuBuffer<T>,
        map: fn(&mut Pool) -> &mut HashMap<usize, Vec<GpuBuffer<T>>>,
    ) {
        let key = (std::mem::size_of::<T>(), b.len());
        map(self).entry(b.len()).or_default().push(b);
        for (size, len) in self.ledger.put(key, POOL_CAP_BYTES) {
            // Dropping a buffer frees it on the device after the work queued before it (one stream).
            match size {
                4 => drop(self.f32s.get_mut(&len).and_then(Vec::pop)),
                2 => drop(self.u16s.get_mut(&len).and_then(Vec::pop)),
                _ => drop(self.u8s.get_mut(&len).and_then(Vec::pop)),
            }
        }
    }
    fn put_u8(&mut self, b: GpuBuffer<u8>) {
        self.give(b, |p| &mut p.u8s)
    }
    fn put(&mut self, b: GpuBuffer<f32>) {
        self.give(b, |p| &mut p.f32s)
    }
    fn put_u16(&mut self, b: GpuBuffer<u16>) {
        self.give(b, |p| &mut p.u16s)
    }
}

/// The immutable half: device, weights and the model's facts.
struct Weights {
    gpu: Gpu,
    /// Tile-GEMV inputs written in bf16 by the kernel before (the norm, [`Gpu::add_rmsnorm_dual`]; the attention
    /// gate, [`Gpu::sigmoid_gate_bf16`]) instead of a cast launch, and an NVFP4 GEMV's f32 input cast straight into
    /// its fragments ([`Gpu::cast_nvfp4_gemv`]) instead of a cast and a fragment launch. On unless
    /// `EDGEFIT_FUSED_CASTS=0` (the same-run baseline arm of `run_engine.sh`): the parity, offload and batching
    /// tests pass either way, and it gave about 1% at batch 1 (benchmarks/engine-h200.md).
    fused_casts: bool,
    /// Prompt attention through the tensor-core flash prefill kernels on bf16 copies of the chunk and of the
    /// slot's cached prefix ([`FlashChunk`]) instead of the f32 slot kernel, whose one block per (token, head)
    /// rereads the whole prefix: [`CudaOptions::flash_prefill_attention`], never on the precise path or for head
    /// dims the flash kernels lack.
    flash_prefill: bool,
    /// Blocks per (token, query head) of the slot attention in steps of at most 16 tokens
    /// ([`Gpu::attention_slots_split`], the device's choice); `None` without
    /// [`CudaOptions::split_decode_attention`] (the one-block kernel).
    decode_splits: Option<usize>,
    embed: HostEmbed,
    embed_scale: Option<f32>,
    layers: Vec<GLayer>,
    final_norm: GpuBuffer<f32>,
    lm_head: GLinear,
    attn_dims: AttnDims,
    gdn_dims: Option<GdnDims>,
    hidden: usize,
    inter: usize,
    eps: f32,
    norm_form: NormWeight,
    act: GatedAct,
    gated_q: bool,
    attn_scale: f32,
    final_softcap: Option<f32>,
    /// `u32` words of the tile GEMVs' activation scratch: enough for 16 rows of the widest input.
    scratch_len: usize,
    /// The DeltaNet prefill build: the f32 one for parity runs, else the fastest (TF32, ~2e-3 relative).
    gdn_prefill: &'static str,
}

/// Recorded decode graphs kept at most (one per batch size, so at most `max_num_seqs`); past it they are dropped.
const MAX_GRAPHS: usize = 256;

/// A recorded decode step: the graph, the input buffer it reads the embedded rows from and the logits it writes.
struct Recorded {
    graph: kernels::cuda::GpuGraph,
    x: GpuBuffer<f32>,
    logits: GpuBuffer<f32>,
}

/// What a step hands back: the logits, or the greedy ids chosen on the device.
/// What a step's caller wants back: every row's logits, every row's argmax, or per row a draw or the logits.
enum Want<'a> {
    Logits,
    Argmax,
    Draws(&'a mut [Option<Draw>]),
}

enum Out {
    Logits(Vec<f32>),
    Ids(Vec<u32>),
    /// Per row: the logits where no draw was asked.
    Rows(Vec<Option<Vec<f32>>>),
}

/// A model placed on a CUDA device with its caches: what [`crate::Engine`] runs when `--device cuda`.
pub struct CudaModel {
    w: Weights,
    /// u32 scratch by length (argmax and drawn ids, generator words), kept across steps.
    ids_buf: HashMap<usize, GpuBuffer<u32>>,
    /// Recorded decode steps by batch size (the slots and positions are read from device buffers, so one graph
    /// serves every batch of its size), the sizes seen once, and whether to record.
    graphs: HashMap<usize, Recorded>,
    seen: std::collections::HashSet<usize>,
    graphs_on: bool,
    /// Rows every decode step runs at ([`CudaOptions::batch_invariant`]); 0 for the batch's own size.
    pad_to: usize,
    /// Zeros to clear a slot's state from, in place.
    zeros: GpuBuffer<f32>,
    state: Vec<LayerState>,
    pool: Pool,
    gemv_scratch: GpuBuffer<u32>,
    /// The NVFP4 decode GEMVs' activation fragments, written by the fused producers (norm, gated activation).
    frags: Nvfp4Fragments,
    slot_buf: HashMap<usize, (GpuBuffer<u32>, GpuBuffer<u32>)>,
    /// Sequences the caches hold at once.
    slots: usize,
    max_len: usize,
    /// The copy stream and staging buffers of the weights the plan keeps in host memory, if any.
    streamer: Option<Streamer>,
    /// Device memory held back so the device behaves as a smaller card (`--cap-gpu-memory`).
    ballast: Option<GpuBuffer<u8>>,
    /// Pinned host bytes of the streamed weights (each crosses the link once per step).
    pub host_bytes: u64,
    /// Device bytes of the staging buffers of the streamed weights (two per role and shape).
    pub stage_bytes: u64,
    /// Device bytes of the prefill GEMMs' second layout of the weights ([`CudaOptions::gemm_copies`]).
    pub gemm_bytes: u64,
    /// Device bytes of the resident weights (each read once per step), and of the caches.
    pub weight_bytes: u64,
    pub cache_bytes: u64,
    paths: Vec<&'static str>,
}

/// With `EDGEFIT_TRACE_MEMORY=1`, the driver's free device memory after a load phase or a prompt chunk, on stderr:
/// where a load that runs out of memory spent it, and what a chunk's scratch holds.
fn trace_memory(gpu: &Gpu, what: std::fmt::Arguments<'_>) {
    if std::env::var_os("EDGEFIT_TRACE_MEMORY").is_some_and(|v| v == "1") {
        if let Ok((free, _)) = gpu.memory_info() {
            eprintln!("memory: {what}: {} MiB free", free >> 20);
        }
    }
}

/// `e`, an error while placing `what` on the device, with the driver's free memory then; running out says that the
/// load needed more than the plan's ledger counted, and how to see where it went.
fn placing(gpu: &Gpu, what: std::fmt::Arguments<'_>, e: EngineError) -> EngineError {
    let free = || {
        gpu.memory_info().map_or_else(
            |_| "unknown".to_string(),
            |(free, _)| format!("{} MiB", free >> 20),
        )
    };
    match e {
        EngineError::OutOfMemory(msg) => EngineError::OutOfMemory(format!(
            "placing {what}: {msg}; {} free on the device (the load needed more memory than the plan counts; \
             EDGEFIT_TRACE_MEMORY=1 prints where the device's went)",
            free()
        )),
        EngineError::Kernel(msg) => EngineError::Kernel(format!(
            "placing {what}: {msg}; {} free on the device",
            free()
        )),
        e => e,
    }
}

fn upload_vec(gpu: &Gpu, v: &[f32]) -> Result<GpuBuffer<f32>, EngineError> {
    gpu.upload(v).map_err(kerr)
}

/// A weight's rows dequantized to f32 (`Weight::row`), as one dense f32 weight on the device.
fn widen_f32(gpu: &Gpu, w: &Weight) -> Result<GLinear, EngineError> {
    Ok(GLinear::Dense(dense_f32(gpu, w)?))
}

/// A weight's rows dequantized to f32 on the device. For NVFP4 each value is one f32 rounding of e2m1 x e4m3 x
/// the global scale, the product the NVFP4 kernels form, so the dense kernels compute the same linear.
fn dense_f32(gpu: &Gpu, w: &Weight) -> Result<DenseGpuWeights, EngineError> {
    let (n, k) = (w.n(), w.k());
    let mut all = vec![0.0f32; n * k];
    for (r, row) in all.chunks_exact_mut(k).enumerate() {
        w.row(r, row).map_err(kerr)?;
    }
    gpu.dense_weights_f32(&all, n, k).map_err(kerr)
}

/// NVFP4 matrices of at most this many rows also keep exact f32 rows for decode, where the device has room for a
/// second layout ([`CudaOptions::gemm_copies`]): so short a matrix (the DeltaNet's 96-row stacked `in_proj_b/a`
/// on Qwen3.8-27B) is latency-bound on the NVFP4 tile GEMV and its fragment kernel, 8.1 us a layer on an H100
/// against 4.2 us on the dense split-K GEMV (benchmarks/engine-h200.md), while a prompt keeps the NVFP4 GEMM.
pub(crate) const NVFP4_F32_ROWS_MAX_N: usize = 256;

/// Steps of at most this many rows read those f32 rows; longer ones keep the NVFP4 GEMM.
const F32_ROWS_MAX_M: usize = 16;

/// `w` widened to a bf16 dense weight, one row at a time.
fn widen_bf16(gpu: &Gpu, w: &Weight) -> Result<GLinear, EngineError> {
    let (n, k) = (w.n(), w.k());
    let mut bits = Vec::with_capacity(n * k);
    let mut row = vec![0.0f32; k];
    for r in 0..n {
        w.row(r, &mut row).map_err(kerr)?;
        bits.extend(row.iter().map(|&x| half::bf16::from_f32(x).to_bits()));
    }
    Ok(GLinear::Dense(
        gpu.dense_weights_bf16(&bits, n, k).map_err(kerr)?,
    ))
}

/// A linear on the device. `precise` (the parity path) computes every format in f32 from its dequantized rows,
/// the checkpoint's own numbers: the tile GEMVs read bf16 activations (about 2e-2 of the largest logit on the
/// qwen3_5 fixtures); GPTQ / int4 otherwise runs the int4 GEMV on its packed bits.
/// `w` on the device: the tile layout for FP8 and NVFP4, plus the checkpoint layout for the prefill GEMMs when
/// `gemm` (else prefill runs the tile GEMVs 16 rows at a time), and with `rows` a short NVFP4 matrix's f32 rows.
fn upload_linear(
    gpu: &Gpu,
    w: &Weight,
    precise: bool,
    gemm: bool,
    rows: bool,
) -> Result<GLinear, EngineError> {
    let whole = w;
    if precise
        && matches!(
            w,
            Weight::Fp8Block { .. } | Weight::Nvfp4 { .. } | Weight::Int4 { .. }
        )
    {
        return widen_f32(gpu, w);
    }
    Ok(match w {
        Weight::F32 { w, n, k } => GLinear::Dense(gpu.dense_weights_f32(w, *n, *k).map_err(kerr)?),
        Weight::Bf16 { w, n, k } => {
            GLinear::Dense(gpu.dense_weights_bf16(w, *n, *k).map_err(kerr)?)
        }
        Weight::Fp8Block { w, scale_inv, n, k } => {
            // What stays is allocated before the raw upload, so nothing kept shares the raw buffer's memory.
            let scales = gpu.upload(scale_inv).map_err(kerr)?;
            let raw = gpu.upload(w).map_err(kerr)?;
            let tiles = gpu.fp8_repack_tiles(&raw, *n, *k).map_err(kerr)?;
            GLinear::Fp8 {
                tiles,
                scales,
                raw: keep_or_release(gpu, gemm, raw)?,
            }
        }
        Weight::Nvfp4 {
            w,
            scales,
            global,
            n,
            k,
        } => {
            let raw = gpu.upload(w).map_err(kerr)?;
            let sc = gpu.upload(scales).map_err(kerr)?;
            let tiles = gpu.nvfp4_repack_tiles(&raw, &sc, *n, *k).map_err(kerr)?;
            // The GEMM takes k in whole 64-column tiles.
            let raw = keep_or_release(gpu, gemm && k.is_multiple_of(64), (raw, sc))?;
            GLinear::Nvfp4 {
                tiles,
                global: *global,
                rows: match rows && *n <= NVFP4_F32_ROWS_MAX_N {
                    true => Some(dense_f32(gpu, whole)?),
                    false => None,
                },
                raw,
            }
        }
        Weight::Int4 { w: q, .. } => {
            let symmetric = q.scheme() == Int4Scheme::Symmetric;
            match gpu.int4_weights(
                q.packed(),
                q.scales_zeros(),
                q.n(),
                q.k(),
                q.group(),
                symmetric,
            ) {
                Ok(iw) => GLinear::Int4(iw),
                // A shape the int4 kernel does not take runs widened to bf16 (the paths list says "bf16").
                Err(KernelError::Shape { .. }) => widen_bf16(gpu, w)?,
                Err(e) => return Err(kerr(e)),
            }
        }
    })
}

/// `raw` kept when `keep`; else freed, and its memory handed back to the driver at once
/// ([`Gpu::release_unused`]). A freed buffer stays reserved in the allocator's pool, where later kept buffers can be
/// cut from it and pin the rest: freed into the pool, the raw uploads left each resident FP8 27B layer holding ~57 MB
/// more than it keeps (~9 MB handed back at once), and the planner's own choice under a 22.58 GiB cap ran out
/// loading the head (benchmarks/engine-h200.md, runs 12-13).
fn keep_or_release<T>(gpu: &Gpu, keep: bool, raw: T) -> Result<Option<T>, EngineError> {
    if keep {
        return Ok(Some(raw));
    }
    release(gpu, raw)?;
    Ok(None)
}

/// Frees `buffers` and hands their memory back to the driver at once (why: [`keep_or_release`]).
fn release<T>(gpu: &Gpu, buffers: T) -> Result<(), EngineError> {
    drop(buffers);
    gpu.release_unused().map_err(kerr)
}

/// FP8 block weights with the same input, stacked by rows into one (each part's rows a whole number of 128-row
/// scale blocks, so the scales stack too): one GEMV per step instead of one per part. `None` when they cannot be.
fn stack_fp8(parts: &[&Weight]) -> Option<Weight> {
    let mut w = Vec::new();
    let mut scales = Vec::new();
    let (mut n, mut k0) = (0, None);
    for p in parts {
        let Weight::Fp8Block {
            w: pw,
            scale_inv,
            n: pn,
            k,
        } = p
        else {
            return None;
        };
        if *k0.get_or_insert(*k) != *k || !pn.is_multiple_of(128) {
            return None;
        }
        w.extend_from_slice(pw);
        scales.extend_from_slice(scale_inv);
        n += pn;
    }
    Some(Weight::Fp8Block {
        w,
        scale_inv: scales,
        n,
        k: k0?,
    })
}

/// Weights with the same input stacked by rows into one of the same format: FP8 blocks as [`stack_fp8`], f32 and
/// bf16 as they are, NVFP4 where the parts share their global scale. `None` when they cannot be.
fn stack_rows(parts: &[&Weight]) -> Option<Weight> {
    if let Some(w) = stack_fp8(parts) {
        return Some(w);
    }
    let k = parts.first()?.k();
    if parts.iter().any(|p| p.k() != k) {
        return None;
    }
    let n = parts.iter().map(|p| p.n()).sum();
    // Every part's rows, one after the other, where `rows` finds them in each.
    fn concat<T: Clone>(
        parts: &[&Weight],
        rows: impl Fn(&Weight) -> Option<&[T]>,
    ) -> Option<Vec<T>> {
        let mut all = Vec::new();
        for p in parts {
            all.extend_from_slice(rows(p)?);
        }
        Some(all)
    }
    match parts[0] {
        Weight::F32 { .. } => {
            let w = concat(parts, |p| match p {
                Weight::F32 { w, .. } => Some(&w[..]),
                _ => None,
            })?;
            Some(Weight::F32 { w, n, k })
        }
        Weight::Bf16 { .. } => {
            let w = concat(parts, |p| match p {
                Weight::Bf16 { w, .. } => Some(&w[..]),
                _ => None,
            })?;
            Some(Weight::Bf16 { w, n, k })
        }
        Weight::Nvfp4 { .. } => stack_nvfp4(parts),
        _ => None,
    }
}

/// NVFP4 weights with the same input and the same global scale stacked by rows (the group scales are per row, so
/// they stack too). modelopt gives the projections it expects fused (q/k/v, gate/up) one global scale for this.
/// `None` when they cannot be.
fn stack_nvfp4(parts: &[&Weight]) -> Option<Weight> {
    let (mut w, mut scales) = (Vec::new(), Vec::new());
    let (mut n, mut first) = (0, None);
    for p in parts {
        let Weight::Nvfp4 {
            w: pw,
            scales: ps,
            global,
            n: pn,
            k,
        } = p
        else {
            return None;
        };
        let (g0, k0) = *first.get_or_insert((global.to_bits(), *k));
        if global.to_bits() != g0 || *k != k0 {
            return None;
        }
        w.extend_from_slice(pw);
        scales.extend_from_slice(ps);
        n += pn;
    }
    let (g0, k) = first?;
    Some(Weight::Nvfp4 {
        w,
        scales,
        global: f32::from_bits(g0),
        n,
        k,
    })
}

/// The quantized formats' stacking ([`stack_fp8`], [`stack_nvfp4`]): the exact path's f32 and bf16 linears stay
/// apart, as the checkpoint has them.
fn stack_quantized(parts: &[&Weight]) -> Option<Weight> {
    stack_fp8(parts).or_else(|| stack_nvfp4(parts))
}

fn opt_vec(gpu: &Gpu, v: &Option<Vec<f32>>) -> Result<Option<GpuBuffer<f32>>, EngineError> {
    v.as_deref().map(|v| upload_vec(gpu, v)).transpose()
}

/// How [`CudaModel::upload`] places a model: sequences and their length, the exact builds, the linears the plan
/// keeps in host memory, and the device memory the model may use.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    pub slots: usize,
    pub max_len: usize,
    /// The f32 builds of kernels that have a faster, less exact one (the parity path, `--exact`).
    pub precise: bool,
    /// Linears streamed from pinned host memory, a layer ahead ([`crate::setup::streamed_linears`]).
    pub streamed: Streamed,
    /// Device bytes the model may use at most (`--cap-gpu-memory`): the rest is allocated and held back first, so
    /// the driver itself refuses anything past it.
    pub cap: Option<u64>,
    /// Keep FP8 and NVFP4 weights in the checkpoint layout too, for the prefill GEMMs (tensor cores), where the
    /// device has room for both layouts beyond the plan ([`crate::Engine::on_cuda`] decides).
    pub gemm_copies: bool,
    /// Run every decode step at `slots` rows (`--batch-invariant`), the rows past the batch's padding that touch no
    /// cache: each sequence then gets the same kernels, and so the same bits, whatever else shares its step.
    pub batch_invariant: bool,
    /// Prompt attention through the flash prefill kernels (on by default; `EDGEFIT_FLASH_PREFILL=0` for `edgefit`
    /// turns it off): 2x at 4096 tokens on the 27B geometry, and `tests/flash_prefill.rs` holds it to the exact
    /// slot kernel (benchmarks/engine-h200.md). Ignored on the precise path.
    pub flash_prefill_attention: bool,
    /// Attention in steps of at most 16 tokens with each (token, head)'s context shared by several blocks
    /// ([`Gpu::attention_slots_split`]; on by default, `EDGEFIT_SPLIT_ATTENTION=0` for `edgefit` turns it off).
    /// One block per (token, head) is 24 blocks in a 27B decode step, each walking the whole context
    /// (benchmarks/engine-h200.md).
    pub split_decode_attention: bool,
    /// Projections of one input stacked by rows into one linear at load where the format allows it (FP8 block:
    /// q/k/v and gate/up; NVFP4 where the parts share their global scale, as modelopt exports the projections it
    /// expects fused): one GEMV a step instead of one per part, and for gate/up the fused norm step. On by
    /// default; `EDGEFIT_STACK=0` for `edgefit` turns it off.
    pub stack_projections: bool,
    /// With the GEMM copies, short NVFP4 matrices also keep exact f32 rows that steps of at most 16 rows read
    /// ([`NVFP4_F32_ROWS_MAX_N`]). On by default; `EDGEFIT_NVFP4_F32_ROWS=0` for `edgefit` turns it off.
    pub nvfp4_f32_rows: bool,
}

impl Default for CudaOptions {
    /// Nothing streamed, no cap, the exact builds off, flash prompt attention, split decode attention and stacked
    /// projections on (as `edgefit` runs them), and no GEMM copies: they cost device memory beyond the plan, so the
    /// caller asks for them.
    fn default() -> Self {
        CudaOptions {
            slots: 0,
            max_len: 0,
            precise: false,
            streamed: Default::default(),
            cap: None,
            gemm_copies: false,
            batch_invariant: false,
            flash_prefill_attention: true,
            split_decode_attention: true,
            stack_projections: true,
            nvfp4_f32_rows: true,
        }
    }
}

/// Places each linear on the device, or for a streamed one in pinned host memory with two staging copies on the
/// device (one per buffer of the double buffering) shared by every streamed linear of its role and shape.
struct Placer<'a> {
    gpu: &'a Gpu,
    precise: bool,
    gemm: bool,
    /// Short NVFP4 matrices' exact f32 rows for decode ([`CudaOptions::nvfp4_f32_rows`]).
    rows: bool,
    streamed: &'a Streamed,
    stages: Vec<[GLinear; 2]>,
    keys: HashMap<(LinearRole, usize, usize, &'static str), usize>,
    host_bytes: u64,
}

impl Placer<'_> {
    /// Linears of one input in `layer`, one role each: stacked into one ([`stack_rows`]) where every role has the
    /// same placement (so nothing streams that the plan keeps resident, or the reverse), else each apart.
    fn put_stacked(
        &mut self,
        parts: &[&Weight],
        layer: usize,
        roles: &[LinearRole],
    ) -> Result<Vec<GLinear>, EngineError> {
        let streamed = |r: &LinearRole| self.streamed.contains(&(layer, *r));
        let same = roles.iter().all(|r| streamed(r) == streamed(&roles[0]));
        if let Some(w) = stack_rows(parts).filter(|_| same) {
            return Ok(vec![self.put(&w, layer, roles)?]);
        }
        parts
            .iter()
            .zip(roles)
            .map(|(w, r)| self.put(w, layer, std::slice::from_ref(r)))
            .collect()
    }

    /// `w`, the linear of `roles` (the first names it; any of them streamed streams it) in `layer`.
    fn put(
        &mut self,
        w: &Weight,
        layer: usize,
        roles: &[LinearRole],
    ) -> Result<GLinear, EngineError> {
        if !roles.iter().any(|r| self.streamed.contains(&(layer, *r))) {
            return upload_linear(self.gpu, w, self.precise, self.gemm, self.rows);
        }
        let dev = upload_linear(self.gpu, w, self.precise, false, false)?;
        let (n, k, path) = (dev.n(), dev.k(), dev.path_name());
        let host = self.gpu.stash(&dev.buffers()).map_err(kerr)?;
        self.host_bytes += host.bytes() as u64;
        let global = match &dev {
            GLinear::Nvfp4 { global, .. } => *global,
            _ => 1.0,
        };
        let key = (roles[0], n, k, path);
        let stage = match self.keys.get(&key) {
            Some(&i) => {
                // Only the host copy stays: the device one goes back to the driver.
                release(self.gpu, dev)?;
                i
            }
            None => {
                // The second staging copy is one more upload of the same weight (its contents are overwritten).
                let twin = upload_linear(self.gpu, w, self.precise, false, false)?;
                self.stages.push([dev, twin]);
                self.keys.insert(key, self.stages.len() - 1);
                self.stages.len() - 1
            }
        };
        Ok(GLinear::Host(Box::new(HostLinear {
            w: host,
            stage,
            n,
            k,
            path,
            global,
        })))
    }
}

/// Streams the host-placed linears: two staging buffers per role and shape; a layer's linears are copied on the copy
/// stream into one buffer while the layer before computes from the other. `next_fill` and `next_use` count filled
/// and computed streamed layers (cyclically over `order`, across steps), so at most two are in flight and the next
/// step's first layers are copied while the last layers (resident) of this one compute.
struct Streamer {
    copy: CopyStream,
    /// Layers with a streamed linear, in order.
    order: Vec<usize>,
    /// `copied[b]`: buffer `b`'s last fill done (the compute stream waits for it); `used[b]`: the last layer
    /// computed from buffer `b` done (the copy stream waits for it before overwriting).
    copied: [GpuEvent; 2],
    used: [GpuEvent; 2],
    next_fill: usize,
    next_use: usize,
    stages: Vec<[GLinear; 2]>,
    /// Timing events of the copies and layers, while a timeline is being recorded.
    timeline: Option<Vec<Mark>>,
}

/// One timed span of a timeline: a streamed layer's copy (on the copy stream) or a layer's compute.
struct Mark {
    copy: bool,
    layer: usize,
    start: GpuEvent,
    end: GpuEvent,
}

/// A timeline span in milliseconds from the timeline's first event.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Span {
    pub stream: &'static str,
    pub layer: usize,
    pub start_ms: f32,
    pub end_ms: f32,
}

impl Streamer {
    /// Queues fills until two streamed layers are ahead of the next one to compute.
    fn fill_ahead(&mut self, layers: &[GLayer], gpu: &Gpu) -> Result<(), EngineError> {
        while self.next_fill < self.next_use + 2 {
            let layer = self.order[self.next_fill % self.order.len()];
            let b = self.next_fill % 2;
            self.copy.wait_for(&self.used[b]).map_err(kerr)?;
            let start = self.mark(gpu)?;
            if let Some(s) = &start {
                self.copy.record(s).map_err(kerr)?;
            }
            for lin in layers[layer].linears() {
                if let GLinear::Host(h) = lin {
                    let stage = &mut self.stages[h.stage][b];
                    self.copy
                        .fill(&h.w, &mut stage.buffers_mut())
                        .map_err(kerr)?;
                    if let GLinear::Nvfp4 { global, .. } = stage {
                        *global = h.global;
                    }
                }
            }
            self.copy.record(&self.copied[b]).map_err(kerr)?;
            if let Some(start) = start {
                let end = gpu.new_event(true).map_err(kerr)?;
                self.copy.record(&end).map_err(kerr)?;
                if let Some(t) = &mut self.timeline {
                    t.push(Mark {
                        copy: true,
                        layer,
                        start,
                        end,
                    });
                }
            }
            self.next_fill += 1;
        }
        Ok(())
    }

    fn mark(&self, gpu: &Gpu) -> Result<Option<GpuEvent>, EngineError> {
        match self.timeline {
            Some(_) => gpu.new_event(true).map(Some).map_err(kerr),
            None => Ok(None),
        }
    }

    /// Before streamed layer `layer` computes: the compute stream waits for its fill; the buffer it reads.
    fn begin(&mut self, layer: usize, gpu: &Gpu) -> Result<usize, EngineError> {
        if self.order[self.next_use % self.order.len()] != layer {
            return Err(EngineError::Kernel(format!(
                "streaming: layer {layer} computes out of order"
            )));
        }
        let b = self.next_use % 2;
        gpu.wait_for(&self.copied[b]).map_err(kerr)?;
        Ok(b)
    }

    /// After streamed layer's compute is queued: its buffer is free once the queued work is done; fills go on.
    fn end(&mut self, layers: &[GLayer], gpu: &Gpu) -> Result<(), EngineError> {
        gpu.record(&self.used[self.next_use % 2]).map_err(kerr)?;
        self.next_use += 1;
        self.fill_ahead(layers, gpu)
    }

    /// Starts a step: realigns after a step that failed midway (waits for everything queued), then fills ahead.
    fn start(&mut self, layers: &[GLayer], gpu: &Gpu) -> Result<(), EngineError> {
        if !self.next_use.is_multiple_of(self.order.len()) {
            gpu.synchronize().map_err(kerr)?;
            self.copy.synchronize().map_err(kerr)?;
            self.next_use = 0;
            self.next_fill = 0;
        }
        self.fill_ahead(layers, gpu)
    }
}

impl CudaModel {
    /// Moves `model`'s weights onto `gpu` (the host copies are dropped layer by layer; `model` keeps its facts and
    /// refuses to run on the CPU afterwards) and allocates the caches for `slots` sequences of `max_len` tokens.
    /// `precise` picks the f32 builds where a kernel has a faster, less exact one (the parity path, `--exact`).
    pub fn upload(
        gpu: Gpu,
        model: &mut Model,
        opts: &CudaOptions,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<CudaModel, EngineError> {
        use LinearRole as R;
        let (slots, max_len, precise) = (opts.slots, opts.max_len, opts.precise);
        // Sized first: a cache that overflows is refused before anything is uploaded.
        let cache_sizes = model.cuda_cache_sizes(slots, max_len)?;
        trace_memory(&gpu, format_args!("before the weights"));
        let mut pl = Placer {
            gpu: &gpu,
            precise,
            gemm: opts.gemm_copies && !precise,
            rows: opts.gemm_copies && !precise && opts.nvfp4_f32_rows,
            streamed: &opts.streamed,
            stages: Vec::new(),
            keys: HashMap::new(),
            host_bytes: 0,
        };
        let layers_host = std::mem::take(&mut model.layers);
        model.on_device = true;
        let total = layers_host.len();
        let mut layers = Vec::with_capacity(total);
        let mut wide = model.hidden();
        let stack = opts.stack_projections;
        for (i, l) in layers_host.into_iter().enumerate() {
            // One layer's weights, called at once: an error then names the layer it stopped in.
            let place = || -> Result<GLayer, EngineError> {
                let mixer = match l.mixer {
                    Mixer::Attn(a) => {
                        let a = *a;
                        let qkv = match a.qkv {
                            Qkv::Split { q, k, v } => {
                                match stack.then(|| stack_quantized(&[&q, &k, &v])).flatten() {
                                    Some(w) => GQkv::Fused {
                                        w: pl.put(&w, i, &[R::Qkv, R::Q, R::K, R::V])?,
                                        q_rows: q.n(),
                                    },
                                    None => GQkv::Split {
                                        q: pl.put(&q, i, &[R::Q])?,
                                        k: pl.put(&k, i, &[R::K])?,
                                        v: pl.put(&v, i, &[R::V])?,
                                    },
                                }
                            }
                            Qkv::Fused { w, q_rows } => GQkv::Fused {
                                w: pl.put(&w, i, &[R::Qkv, R::Q, R::K, R::V])?,
                                q_rows,
                            },
                        };
                        // The output projection reads q_heads x head_dim columns, which can exceed the hidden size.
                        wide = wide.max(a.o.k());
                        let [b0, b1, b2, b3] = &a.biases;
                        GMixer::Attn(Box::new(GAttn {
                            qkv,
                            o: pl.put(&a.o, i, &[R::O])?,
                            biases: [
                                opt_vec(&gpu, b0)?,
                                opt_vec(&gpu, b1)?,
                                opt_vec(&gpu, b2)?,
                                opt_vec(&gpu, b3)?,
                            ],
                            g_proj: a
                                .g_proj
                                .as_ref()
                                .map(|g| pl.put(g, i, &[R::G]))
                                .transpose()?,
                            q_norm: opt_vec(&gpu, &a.q_norm)?,
                            k_norm: opt_vec(&gpu, &a.k_norm)?,
                            rope: a.rope,
                            window: a.window,
                        }))
                    }
                    Mixer::Gdn(g) => {
                        let g = *g;
                        wide = wide.max(g.out.k());
                        GMixer::Gdn(Box::new(GGdn {
                            qkvz: pl.put_stacked(
                                &[&g.in_qkv, &g.in_z],
                                i,
                                &[R::GdnQkv, R::GdnZ],
                            )?,
                            ba: pl.put_stacked(&[&g.in_b, &g.in_a], i, &[R::GdnB, R::GdnA])?,
                            out: pl.put(&g.out, i, &[R::GdnOut])?,
                            conv: upload_vec(&gpu, &g.conv)?,
                            a_log: upload_vec(&gpu, &g.a_log)?,
                            dt_bias: upload_vec(&gpu, &g.dt_bias)?,
                            norm: upload_vec(&gpu, &g.norm)?,
                        }))
                    }
                };
                let gate_up = match l.gate_up {
                    GateUp::Fused(w) => GGateUp::Fused(pl.put(&w, i, &[R::Gate, R::Up])?),
                    GateUp::Split { gate, up } => {
                        match stack.then(|| stack_quantized(&[&gate, &up])).flatten() {
                            Some(w) => GGateUp::Fused(pl.put(&w, i, &[R::Gate, R::Up])?),
                            None => GGateUp::Split {
                                gate: pl.put(&gate, i, &[R::Gate])?,
                                up: pl.put(&up, i, &[R::Up])?,
                            },
                        }
                    }
                };
                wide = wide.max(l.down.k());
                Ok(GLayer {
                    input_norm: upload_vec(&gpu, &l.input_norm)?,
                    post_attn_norm: upload_vec(&gpu, &l.post_attn_norm)?,
                    pre_ff_norm: opt_vec(&gpu, &l.pre_ff_norm)?,
                    post_ff_norm: opt_vec(&gpu, &l.post_ff_norm)?,
                    mixer,
                    gate_up,
                    down: pl.put(&l.down, i, &[R::Down])?,
                })
            };
            let layer = place()
                .map_err(|e| placing(&gpu, format_args!("decoder layer {i} of {total}"), e))?;
            layers.push(layer);
            progress(i + 1, total);
            trace_memory(&gpu, format_args!("layer {i} placed"));
        }
        // The head goes to the device; a tied table keeps its host copy for the embedding gather.
        let head_host = std::mem::replace(
            &mut model.lm_head,
            Weight::F32 {
                w: Vec::new(),
                n: 0,
                k: 0,
            },
        );
        let lm_head = upload_linear(&gpu, &head_host, precise, false, false).map_err(|e| {
            placing(
                &gpu,
                format_args!("the lm_head ({} MiB)", head_host.bytes() >> 20),
                e,
            )
        })?;
        let embed = match std::mem::replace(&mut model.embed, Embedding::Head) {
            Embedding::Table(t) => HostEmbed::Table(t),
            Embedding::Head => HostEmbed::Head(head_host),
        };
        let Placer {
            stages, host_bytes, ..
        } = pl;
        let rt = &model.spec.runtime;
        let w = Weights {
            fused_casts: std::env::var("EDGEFIT_FUSED_CASTS").map_or(true, |v| v != "0"),
            decode_splits: opts
                .split_decode_attention
                .then(|| gpu.attention_slots_splits(&model.attn_dims)),
            flash_prefill: !precise
                && opts.flash_prefill_attention
                && Gpu::ATTENTION_PREFILL_HEAD_DIMS.contains(&model.attn_dims.head_dim),
            embed,
            embed_scale: model.embed_scale,
            final_norm: upload_vec(&gpu, &model.final_norm)?,
            lm_head,
            layers,
            attn_dims: model.attn_dims,
            gdn_dims: model.gdn_dims,
            hidden: model.hidden(),
            inter: model.inter,
            eps: model.eps,
            norm_form: model.norm_form,
            act: match rt.activation {
                Activation::Silu => GatedAct::Silu,
                Activation::GeluErf => GatedAct::GeluErf,
                Activation::GeluTanh => GatedAct::GeluTanh,
            },
            gated_q: rt.output_gate == OutputGate::SigmoidPerElement,
            attn_scale: rt.attn_scale as f32,
            final_softcap: rt.final_logit_softcap.map(|c| c as f32),
            scratch_len: Gpu::gemv_scratch_len(16, wide.max(model.hidden()).max(model.inter)),
            gdn_prefill: if precise { "fp32_cs32" } else { "auto" },
            gpu,
        };
        let mut weight_bytes = w.lm_head.bytes() as u64;
        let mut gemm_bytes = 0u64;
        let mut paths = vec![w.lm_head.path_name()];
        for l in &w.layers {
            for lin in l.linears() {
                weight_bytes += lin.bytes() as u64;
                gemm_bytes += lin.gemm_bytes() as u64;
                paths.push(lin.path_name());
            }
        }
        let stage_bytes = stages
            .iter()
            .flatten()
            .map(|l| l.bytes() as u64)
            .sum::<u64>();
        paths.sort_unstable();
        paths.dedup();
        let gemv_scratch = w.gpu.zeros::<u32>(w.scratch_len).map_err(kerr)?;
        let frags = Nvfp4Fragments::new(w.gpu.zeros::<u32>(w.scratch_len).map_err(kerr)?);
        let zeros = w.gpu.zeros::<f32>(1).map_err(kerr)?;
        let order: Vec<usize> = (0..w.layers.len())
            .filter(|&i| {
                w.layers[i]
                    .linears()
                    .iter()
                    .any(|l| matches!(l, GLinear::Host(_)))
            })
            .collect();
        let streamer = if order.is_empty() {
            None
        } else {
            let ev = || w.gpu.new_event(false).map_err(kerr);
            Some(Streamer {
                copy: w.gpu.copy_stream().map_err(kerr)?,
                order,
                copied: [ev()?, ev()?],
                used: [ev()?, ev()?],
                next_fill: 0,
                next_use: 0,
                stages,
                timeline: None,
            })
        };
        let mut m = CudaModel {
            // Graph capture does not cross to the copy stream: a streamed model runs its steps launch by launch
            // (the link, not the launches, bounds such a step).
            pad_to: if opts.batch_invariant { opts.slots } else { 0 },
            graphs_on: streamer.is_none()
                && std::env::var("EDGEFIT_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            streamer,
            host_bytes,
            stage_bytes,
            gemm_bytes,
            ballast: None,
            ids_buf: HashMap::new(),
            graphs: HashMap::new(),
            seen: Default::default(),
            zeros,
            state: Vec::new(),
            pool: Pool::default(),
            gemv_scratch,
            frags,
            slot_buf: HashMap::new(),
            slots,
            max_len,
            weight_bytes,
            cache_bytes: 0,
            paths,
            w,
        };
        trace_memory(&m.w.gpu, format_args!("scratch and streams"));
        m.alloc_caches(cache_sizes)?;
        trace_memory(&m.w.gpu, format_args!("caches"));
        Ok(m)
    }

    /// [`trace_memory`] for a step of the engine's: what a prompt chunk's activations took.
    pub(crate) fn trace_memory(&self, what: std::fmt::Arguments<'_>) {
        trace_memory(&self.w.gpu, what);
    }

    /// The per-layer caches, of the sizes [`Model::cuda_cache_sizes`] gave the admission.
    fn alloc_caches(&mut self, sizes: CudaCacheSizes) -> Result<(), EngineError> {
        let gpu = &self.w.gpu;
        let mut zeros_len = 1;
        for l in &self.w.layers {
            let s = match &l.mixer {
                GMixer::Attn(_) => LayerState::Attn {
                    k: gpu.zeros(sizes.kv_len).map_err(kerr)?,
                    v: gpu.zeros(sizes.kv_len).map_err(kerr)?,
                },
                GMixer::Gdn(_) => {
                    let g = self.w.gdn_dims.ok_or_else(|| {
                        EngineError::Unsupported("GDN layer without geometry".into())
                    })?;
                    zeros_len = zeros_len.max(2 * g.conv_state_len()).max(g.state_len());
                    LayerState::Gdn {
                        conv: gpu.zeros(sizes.conv_len).map_err(kerr)?,
                        state: gpu.zeros(sizes.state_len).map_err(kerr)?,
                    }
                }
            };
            self.state.push(s);
        }
        self.cache_bytes = sizes.bytes;
        self.zeros = gpu.zeros(zeros_len).map_err(kerr)?;
        Ok(())
    }

    /// Which kernel a prompt chunk's attention runs: the flash prefill kernels or the f32 slot kernel.
    pub fn prefill_attention(&self) -> &'static str {
        if self.w.flash_prefill {
            "flash (bf16)"
        } else {
            "slot kernel (f32)"
        }
    }

    /// Layers with a linear streamed from host memory.
    pub fn streamed_layers(&self) -> usize {
        self.streamer.as_ref().map_or(0, |s| s.order.len())
    }

    /// The link's host-to-device rate from pinned memory now, bytes per second (best of five 256 MiB copies): what
    /// a streamed step's transfer is bounded by, measured in the same run.
    pub fn link_bandwidth(&mut self) -> Result<f64, EngineError> {
        self.w.gpu.pinned_upload_bandwidth(1 << 28).map_err(kerr)
    }

    /// Starts timing every streamed layer's copy and every layer's compute (a model without streamed layers has
    /// nothing to show: an error).
    pub fn start_timeline(&mut self) -> Result<(), EngineError> {
        let st = self.streamer.as_mut().ok_or_else(|| {
            EngineError::Unsupported("a timeline shows streaming: no layer is streamed".into())
        })?;
        st.timeline = Some(Vec::new());
        Ok(())
    }

    /// Stops timing and returns the spans since [`CudaModel::start_timeline`], in milliseconds from the first,
    /// ordered by start (waits for the work still queued).
    pub fn take_timeline(&mut self) -> Result<Vec<Span>, EngineError> {
        let marks = self
            .streamer
            .as_mut()
            .and_then(|s| s.timeline.take())
            .unwrap_or_default();
        self.w.gpu.synchronize().map_err(kerr)?;
        if let Some(st) = &self.streamer {
            st.copy.synchronize().map_err(kerr)?;
        }
        let Some(first) = marks.first() else {
            return Ok(Vec::new());
        };
        let mut spans = Vec::with_capacity(marks.len());
        for m in &marks {
            spans.push(Span {
                stream: if m.copy { "copy" } else { "compute" },
                layer: m.layer,
                start_ms: first.start.elapsed_ms(&m.start).map_err(kerr)?,
                end_ms: first.start.elapsed_ms(&m.end).map_err(kerr)?,
            });
        }
        spans.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        Ok(spans)
    }

    /// Holds back device memory so that at most `cap` bytes stay usable by this process (its context counted), as
    /// on a card of `cap` bytes; returns the bytes left usable.
    pub fn hold_back(gpu: &Gpu, cap: u64) -> Result<(u64, Option<GpuBuffer<u8>>), EngineError> {
        let (free, total) = gpu.memory_info().map_err(kerr)?;
        let (free, total) = (free as u64, total as u64);
        if cap >= total {
            return Ok((free, None));
        }
        let used = total - free;
        let usable = cap.saturating_sub(used);
        let hold = free.saturating_sub(usable);
        let len = usize::try_from(hold).map_err(|_| {
            EngineError::Unsupported("--cap-gpu-memory: too much to hold back".into())
        })?;
        let ballast = gpu.zeros::<u8>(len).map_err(kerr)?;
        Ok((usable, Some(ballast)))
    }

    /// Keeps `ballast` ([`CudaModel::hold_back`]) for as long as the model lives.
    pub fn keep(&mut self, ballast: Option<GpuBuffer<u8>>) {
        self.ballast = ballast;
    }

    /// The weight path names on the device, each once.
    pub fn paths(&self) -> Vec<&'static str> {
        self.paths.clone()
    }

    /// The decoder layers' linears as loaded: a stacked projection ([`CudaOptions::stack_projections`]) counts once.
    pub fn linear_count(&self) -> usize {
        self.w.layers.iter().map(|l| l.linears().len()).sum()
    }

    /// The decoder layers' NVFP4 linears that keep exact f32 rows for decode ([`CudaOptions::nvfp4_f32_rows`]).
    pub fn f32_row_linears(&self) -> usize {
        let rows = |l: &&&GLinear| matches!(l, GLinear::Nvfp4 { rows: Some(_), .. });
        self.w
            .layers
            .iter()
            .map(|l| l.linears().iter().filter(rows).count())
            .sum()
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        self.w.gpu.name().unwrap_or_else(|_| "CUDA device".into())
    }

    /// The device's copy bandwidth now, read + write bytes per second: the best of ten device-to-device copies of
    /// 256 MiB (the driver's copy, as torch's `copy_` is; the decode roofline's denominator, measured in the same
    /// run; 256 MiB, as `benchmarks/h200.md` measures it, fits the slack a capped device leaves).
    pub fn copy_bandwidth(&mut self) -> Result<f64, EngineError> {
        let gpu = &self.w.gpu;
        let len = 1usize << 26;
        let src = gpu.zeros::<f32>(len).map_err(kerr)?;
        let mut dst = gpu.zeros::<f32>(len).map_err(kerr)?;
        let mut best = 0.0f64;
        for _ in 0..10 {
            gpu.synchronize().map_err(kerr)?;
            let t = std::time::Instant::now();
            gpu.copy(&src, &mut dst).map_err(kerr)?;
            gpu.synchronize().map_err(kerr)?;
            best = best.max((2 * 4 * len) as f64 / t.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    /// Zeroes a slot's DeltaNet state for a new sequence (its K/V positions are written before they are read), in
    /// place: recorded graphs name these buffers. Every step at position 0 does it first.
    fn reset_slot(&mut self, slot: usize) -> Result<(), EngineError> {
        let gpu = &self.w.gpu;
        let z = &self.zeros;
        let Some(g) = self.w.gdn_dims else {
            return Ok(());
        };
        for l in &mut self.state {
            if let LayerState::Gdn { conv, state } = l {
                for (buf, per) in [(conv, 2 * g.conv_state_len()), (state, g.state_len())] {
                    let n = buf.len();
                    gpu.copy_cols(z, z.len(), 0, buf, n, slot * per, 1, per)
                        .map_err(kerr)?;
                }
            }
        }
        Ok(())
    }

    /// [`Model::forward`] on the device: the logits of each sequence's last token, `[batch.len(), vocab]`.
    pub fn forward(&mut self, batch: &[Step<'_>]) -> Result<Vec<f32>, EngineError> {
        match self.forward_as(batch, Want::Logits)? {
            Out::Logits(l) => Ok(l),
            _ => Err(EngineError::Kernel(
                "forward: ids where logits were asked".into(),
            )),
        }
    }

    /// A decode step where each row either draws its next token on the device (`Some(draw)`: the device's
    /// sampler where it takes the parameters, so only the id and the generator cross the link; otherwise the
    /// row's logits come back and it is drawn on the host, the same draw) or hands back its logits (`None`).
    pub fn forward_pick(
        &mut self,
        batch: &[Step<'_>],
        draws: &mut [Option<Draw>],
    ) -> Result<Vec<Option<Vec<f32>>>, EngineError> {
        if draws.len() != batch.len() {
            return Err(EngineError::Kernel(format!(
                "forward_pick: {} draws for {} sequences",
                draws.len(),
                batch.len()
            )));
        }
        match self.forward_as(batch, Want::Draws(draws))? {
            Out::Rows(r) => Ok(r),
            _ => Err(EngineError::Kernel(
                "forward_pick: logits where rows were asked".into(),
            )),
        }
    }

    /// The greedy next token of each sequence, chosen on the device: only the ids cross the link (first on ties,
    /// as the CPU's argmax; a row holding a NaN is an error).
    pub fn forward_argmax(&mut self, batch: &[Step<'_>]) -> Result<Vec<u32>, EngineError> {
        match self.forward_as(batch, Want::Argmax)? {
            Out::Ids(ids) => Ok(ids),
            _ => Err(EngineError::Kernel(
                "forward: logits where ids were asked".into(),
            )),
        }
    }

    fn forward_as(&mut self, batch: &[Step<'_>], want: Want<'_>) -> Result<Out, EngineError> {
        let prefill = batch.len() == 1 && batch[0].tokens.len() > 1;
        // A decode step's lengths stay pooled for good (it may be recorded); a prompt chunk's may be freed.
        self.pool.pin = !prefill;
        if !prefill && batch.iter().any(|s| s.tokens.len() != 1) {
            return Err(EngineError::Unsupported(
                "a step is one sequence's prompt or chunk, or one token per sequence".into(),
            ));
        }
        let mut ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        // Token i's (slot, position): a prompt's tokens run consecutively from its first position.
        let (mut slots, mut positions): (Vec<u32>, Vec<u32>) = batch
            .iter()
            .flat_map(|s| (0..s.tokens.len()).map(move |i| (s.slot as u32, (s.pos + i) as u32)))
            .unzip();
        let rows = ids.len();
        if positions.iter().any(|&p| p as usize >= self.max_len) {
            return Err(EngineError::Request(format!(
                "a position reaches max_model_len {}",
                self.max_len
            )));
        }
        // The kernels index the caches by these slots: each must exist and hold one sequence of the step.
        for (i, s) in batch.iter().enumerate() {
            if s.slot >= self.slots {
                return Err(EngineError::Request(format!(
                    "no slot {} (the caches hold {})",
                    s.slot, self.slots
                )));
            }
            if batch[..i].iter().any(|o| o.slot == s.slot) {
                return Err(EngineError::Request(format!(
                    "two sequences of one step on slot {}",
                    s.slot
                )));
            }
        }
        // A sequence's first step starts from zeroed DeltaNet state (queued before anything recorded runs).
        for s in batch {
            if s.pos == 0 {
                self.reset_slot(s.slot)?;
            }
        }
        // Batch-invariant decode: padding rows on a slot past the caches, which the kernels skip (no cache byte
        // moves; their rows come out NaN and are dropped below).
        if !prefill && rows < self.pad_to {
            let pad = self.pad_to - rows;
            ids.extend(std::iter::repeat_n(0, pad));
            slots.extend(std::iter::repeat_n(self.slots as u32, pad));
            positions.extend(std::iter::repeat_n(0, pad));
        }
        let t = ids.len();
        let xh = self.embed_rows(&ids)?;
        let gpu = &self.w.gpu;
        let (mut sb, mut pb) = match self.slot_buf.remove(&t) {
            Some(b) => b,
            None => (
                gpu.zeros::<u32>(t).map_err(kerr)?,
                gpu.zeros::<u32>(t).map_err(kerr)?,
            ),
        };
        let written = gpu
            .write(&mut sb, &slots)
            .and_then(|()| gpu.write(&mut pb, &positions));
        self.slot_buf.insert(t, (sb, pb));
        written.map_err(kerr)?;
        if !prefill && self.graphs_on {
            let key = t;
            if let Some(g) = self.graphs.get_mut(&key) {
                gpu.write(&mut g.x, &xh).map_err(kerr)?;
                gpu.launch_graph(&g.graph).map_err(kerr)?;
                let vocab = self.w.lm_head.n();
                return finish(
                    gpu,
                    &self.graphs[&key].logits,
                    (rows, vocab),
                    &mut self.ids_buf,
                    want,
                );
            }
            if self.seen.contains(&key) {
                return self.record(key, batch, &xh, rows, want);
            }
            self.seen.insert(key);
        }
        let mut x = self.pool.f32(gpu, xh.len())?;
        let r = gpu
            .write(&mut x, &xh)
            .map_err(kerr)
            .and_then(|()| self.run(&mut x, batch, prefill));
        self.pool.put(x);
        let logits = r?;
        let vocab = self.w.lm_head.n();
        let out = finish(&self.w.gpu, &logits, (rows, vocab), &mut self.ids_buf, want);
        self.pool.put(logits);
        out
    }

    /// Records a decode step of this batch as a graph, runs it and keeps it for the batch's later steps. If the
    /// recording fails, graphs are turned off (said once on stderr) and the step runs launch by launch.
    fn record(
        &mut self,
        key: usize,
        batch: &[Step<'_>],
        xh: &[f32],
        rows: usize,
        want: Want<'_>,
    ) -> Result<Out, EngineError> {
        if self.graphs.len() >= MAX_GRAPHS {
            self.graphs.clear();
        }
        let gpu = &self.w.gpu;
        let mut x = gpu.zeros::<f32>(xh.len()).map_err(kerr)?;
        gpu.write(&mut x, xh).map_err(kerr)?;
        self.pool.frozen = true;
        let began = gpu.begin_capture().map_err(kerr);
        let ran = began.and_then(|()| self.run(&mut x, batch, false));
        let graph = self.w.gpu.end_capture().map_err(kerr);
        self.pool.frozen = false;
        match (ran, graph) {
            (Ok(logits), Ok(graph)) => {
                self.w.gpu.launch_graph(&graph).map_err(kerr)?;
                let out = finish(
                    &self.w.gpu,
                    &logits,
                    (rows, self.w.lm_head.n()),
                    &mut self.ids_buf,
                    want,
                );
                self.graphs.insert(key, Recorded { graph, x, logits });
                out
            }
            (ran, graph) => {
                let why = match (&ran, &graph) {
                    (Err(e), _) | (_, Err(e)) => e.to_string(),
                    _ => String::new(),
                };
                if let Ok(l) = ran {
                    self.pool.put(l);
                }
                eprintln!("edgefit: recording a CUDA graph failed ({why}); decode steps run launch by launch");
                self.graphs_on = false;
                // Nothing recorded ran: the caches are as before, so the step runs again, unrecorded.
                self.forward_as(batch, want)
            }
        }
    }

    /// The embedding rows of `ids` on the host (the table stays there), scaled as the family says.
    fn embed_rows(&self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let _t = profile::span(Op::Embed);
        let h = self.w.hidden;
        let mut xh = vec![0.0f32; ids.len() * h];
        match &self.w.embed {
            HostEmbed::Table(Table::F32(tab)) => kernels::ops::embedding_gather(
                kernels::ops::EmbeddingTable::F32(tab),
                h,
                ids,
                &mut xh,
            ),
            HostEmbed::Table(Table::Bf16(tab)) => kernels::ops::embedding_gather(
                kernels::ops::EmbeddingTable::Bf16(tab),
                h,
                ids,
                &mut xh,
            ),
            HostEmbed::Head(head) => ids
                .iter()
                .zip(xh.chunks_exact_mut(h))
                .try_for_each(|(&id, row)| head.row(id as usize, row)),
        }
        .map_err(kerr)?;
        if let Some(s) = self.w.embed_scale {
            xh.iter_mut().for_each(|v| *v *= s);
        }
        Ok(xh)
    }

    /// Every layer and the head on the device, from the embedded rows in `x` (the residual stream, updated in
    /// place); the step's slots and positions are in `slot_buf[t]`. Only launches: nothing is allocated once the
    /// pool has seen the shapes, nothing crosses the link, so it can be recorded.
    fn run(
        &mut self,
        x: &mut GpuBuffer<f32>,
        batch: &[Step<'_>],
        prefill: bool,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let h = self.w.hidden;
        let t = x.len() / h;
        let CudaModel {
            w,
            state,
            pool,
            gemv_scratch,
            frags,
            slot_buf,
            max_len,
            streamer,
            ..
        } = self;
        let w: &Weights = w;
        let gpu = &w.gpu;
        let max_len = *max_len;
        let (sb, pb) = slot_buf
            .get(&t)
            .ok_or_else(|| EngineError::Kernel("no slot buffers for this step".into()))?;
        if let Some(st) = streamer.as_mut() {
            st.start(&w.layers, gpu)?;
        }
        // A prompt chunk's flash attention tables (a prefill is never recorded, so these uploads may cross the link).
        let flash = match batch {
            [s] if prefill && w.flash_prefill => {
                let p = s.pos as u32;
                Some(FlashChunk {
                    slot: s.slot,
                    prefix: s.pos,
                    cu_seqlens: gpu.upload(&[0, t as u32]).map_err(kerr)?,
                    prefix_lens: gpu.upload(&[p]).map_err(kerr)?,
                    table: match p {
                        0 => None,
                        _ => Some(gpu.upload(&(0..p).collect::<Vec<u32>>()).map_err(kerr)?),
                    },
                })
            }
            _ => None,
        };
        // A step's view for one layer: the staging buffer `buf` of the streamed linears (when the layer has any).
        macro_rules! ctx {
            ($buf:expr) => {
                Ctx {
                    w,
                    pool: &mut *pool,
                    scratch: &mut *gemv_scratch,
                    frags: &mut *frags,
                    max_len,
                    stages: streamer.as_ref().map_or(&[][..], |s| &s.stages[..]),
                    buf: $buf,
                    flash: flash.as_ref(),
                }
            };
        }
        // Each residual add is fused into the norm after it (`add_rmsnorm_f32`: one pass, one launch).
        let layers = &w.layers;
        let mut hb = match layers.first() {
            Some(l) => ctx!(0).norm(x, &l.input_norm)?,
            None => return Err(EngineError::Unsupported("a model without layers".into())),
        };
        // The layer input's bf16 copy, where the norm wrote one (decode steps of tile-GEMV layers).
        let mut hbb: Option<GpuBuffer<u16>> = None;
        for (li, layer) in layers.iter().enumerate() {
            let buf = match streamer.as_mut() {
                Some(st) if st.order.binary_search(&li).is_ok() => Some(st.begin(li, gpu)?),
                _ => None,
            };
            let timed = match streamer.as_ref().filter(|s| s.timeline.is_some()) {
                Some(st) => st.mark(gpu)?,
                None => None,
            };
            if let Some(ev) = &timed {
                gpu.record(ev).map_err(kerr)?;
            }
            let mut cx = ctx!(buf.unwrap_or(0));
            let mut o = match (&layer.mixer, &mut state[li]) {
                (GMixer::Attn(a), LayerState::Attn { k, v }) => {
                    cx.attention(a, k, v, sb, pb, (&hb, hbb.as_ref()), t)?
                }
                (GMixer::Gdn(g), LayerState::Gdn { conv, state }) => cx.gdn(
                    g,
                    conv,
                    state,
                    (sb, pb),
                    batch,
                    prefill,
                    (&hb, hbb.as_ref()),
                    t,
                )?,
                _ => {
                    return Err(EngineError::Unsupported(
                        "cache kind does not match the layer".into(),
                    ))
                }
            };
            cx.pool.put(hb);
            if let Some(b) = hbb.take() {
                cx.pool.put_u16(b);
            }
            if layer.pre_ff_norm.is_some() {
                let n = cx.norm(&o, &layer.post_attn_norm)?;
                cx.pool.put(std::mem::replace(&mut o, n));
            }
            let ff_norm = layer.pre_ff_norm.as_ref().unwrap_or(&layer.post_attn_norm);
            let mut m = match cx.norm_mlp(layer, &o, x, ff_norm, t)? {
                Some(m) => m,
                None => {
                    let h2 = cx.add_norm(&o, x, ff_norm)?;
                    let m = cx.mlp(layer, &h2, t);
                    cx.pool.put(h2);
                    m?
                }
            };
            cx.pool.put(o);
            if let Some(wn) = &layer.post_ff_norm {
                let n = cx.norm(&m, wn)?;
                cx.pool.put(std::mem::replace(&mut m, n));
            }
            match layers.get(li + 1) {
                Some(next) if t <= 16 && w.fused_casts && next.mixer_reads_bf16() => {
                    let (f, b) = cx.add_norm_dual(&m, x, &next.input_norm)?;
                    hb = f;
                    hbb = Some(b);
                }
                Some(next) => hb = cx.add_norm(&m, x, &next.input_norm)?,
                None => {
                    let _t = profile::span(Op::Small);
                    gpu.add_assign(x, &m).map_err(kerr)?;
                    // A buffer to hand back at the loop's end (nothing reads it).
                    hb = cx.pool.f32(gpu, 1)?;
                }
            }
            cx.pool.put(m);
            if let Some(start) = timed {
                let end = gpu.new_event(true).map_err(kerr)?;
                gpu.record(&end).map_err(kerr)?;
                if let Some(tl) = streamer.as_mut().and_then(|s| s.timeline.as_mut()) {
                    tl.push(Mark {
                        copy: false,
                        layer: li,
                        start,
                        end,
                    });
                }
            }
            if let (Some(_), Some(st)) = (buf, streamer.as_mut()) {
                st.end(layers, gpu)?;
            }
        }
        let mut cx = ctx!(0);
        cx.pool.put(hb);
        // Logits of each sequence's last token only.
        let rows = if prefill { 1 } else { t };
        let normed = if prefill && t > 1 {
            let mut l = cx.pool.f32(gpu, h)?;
            gpu.copy_cols(x, t * h, (t - 1) * h, &mut l, h, 0, 1, h)
                .map_err(kerr)?;
            let n = cx.norm(&l, &cx.w.final_norm)?;
            cx.pool.put(l);
            n
        } else {
            cx.norm(x, &cx.w.final_norm)?
        };
        let mut logits = cx.linear(&cx.w.lm_head, &normed, rows)?;
        cx.pool.put(normed);
        if let Some(cap) = cx.w.final_softcap {
            gpu.softcap(&mut logits, cap).map_err(kerr)?;
        }
        Ok(logits)
    }
}

/// A u32 scratch buffer of `len` from `bufs` (or a new one); the caller puts it back under `len`.
fn take_u32(
    gpu: &Gpu,
    bufs: &mut HashMap<usize, GpuBuffer<u32>>,
    len: usize,
) -> Result<GpuBuffer<u32>, EngineError> {
    match bufs.remove(&len) {
        Some(b) => Ok(b),
        None => gpu.zeros::<u32>(len).map_err(kerr),
    }
}

/// What the caller wants of the first `rows` rows of a finished step's `logits` buffer (`[rows + padding,
/// vocab]`): the logits, the greedy ids, or per row a draw (on the device where its sampler takes the parameters,
/// rows of equal parameters in one call) or the logits.
fn finish(
    gpu: &Gpu,
    logits: &GpuBuffer<f32>,
    (rows, vocab): (usize, usize),
    ids_buf: &mut HashMap<usize, GpuBuffer<u32>>,
    want: Want<'_>,
) -> Result<Out, EngineError> {
    let _t = profile::span(Op::Wait);
    let all = logits.len() / vocab;
    let draws = match want {
        Want::Logits => {
            let mut l = gpu.download(logits).map_err(kerr)?;
            l.truncate(rows * vocab);
            return Ok(Out::Logits(l));
        }
        Want::Argmax => {
            let mut ids = take_u32(gpu, ids_buf, all)?;
            let r = gpu
                .argmax(logits, vocab, &mut ids)
                .and_then(|()| gpu.download(&ids));
            ids_buf.insert(all, ids);
            let mut ids = r.map_err(kerr)?;
            ids.truncate(rows);
            if ids.contains(&Gpu::INVALID_TOKEN) {
                return Err(EngineError::Kernel(
                    "argmax: a row of logits holds a NaN".into(),
                ));
            }
            return Ok(Out::Ids(ids));
        }
        Want::Draws(d) => d,
    };
    // Each row's parameters where the device's sampler draws it.
    let on_device: Vec<Option<SamplingParams>> = draws
        .iter()
        .map(|d| {
            d.as_ref()
                .map(|d| d.params)
                .filter(|p| Gpu::can_sample(vocab, p))
        })
        .collect();
    // Rows drawn on the host or handed back need the logits here: one download for all of them.
    let host = if on_device.iter().all(Option::is_some) {
        None
    } else {
        Some(gpu.download(logits).map_err(kerr)?)
    };
    // The device's draws, one call per distinct parameters; a group short of every row is copied out first.
    let mut groups: Vec<(SamplingParams, Vec<usize>)> = Vec::new();
    for (r, p) in on_device.iter().enumerate() {
        if let Some(p) = p {
            match groups.iter_mut().find(|(q, _)| q == p) {
                Some((_, v)) => v.push(r),
                None => groups.push((*p, vec![r])),
            }
        }
    }
    for (params, rs) in groups {
        let n = rs.len();
        let copy;
        let src = if n == all {
            logits
        } else {
            let mut c = gpu.zeros::<f32>(n * vocab).map_err(kerr)?;
            for (i, &r) in rs.iter().enumerate() {
                gpu.copy_cols(
                    logits,
                    all * vocab,
                    r * vocab,
                    &mut c,
                    n * vocab,
                    i * vocab,
                    1,
                    vocab,
                )
                .map_err(kerr)?;
            }
            copy = c;
            &copy
        };
        let words: Vec<u32> = rs
            .iter()
            .flat_map(|&r| draws[r].as_ref().map_or([0; 4], |d| d.rng.to_words()))
            .collect();
        // Two u32 scratch buffers of different lengths (4n and n), so they never share a key.
        let mut rng = take_u32(gpu, ids_buf, 4 * n)?;
        let mut ids = take_u32(gpu, ids_buf, n)?;
        let r = gpu
            .write(&mut rng, &words)
            .and_then(|()| gpu.sample(src, vocab, &params, &mut rng, &mut ids))
            .and_then(|()| gpu.download(&ids))
            .and_then(|ids| Ok((ids, gpu.download(&rng)?)));
        ids_buf.insert(n, ids);
        ids_buf.insert(4 * n, rng);
        let (ids, words) = r.map_err(kerr)?;
        for (i, &r) in rs.iter().enumerate() {
            if ids[i] == Gpu::INVALID_TOKEN {
                return Err(EngineError::Kernel(format!(
                    "sampling: row {r} of logits holds a NaN or +inf"
                )));
            }
            if let Some(d) = draws[r].as_mut() {
                d.token = ids[i];
                d.rng = Pcg32::from_words([
                    words[4 * i],
                    words[4 * i + 1],
                    words[4 * i + 2],
                    words[4 * i + 3],
                ]);
            }
        }
    }
    let mut out = Vec::with_capacity(rows);
    for (r, d) in draws.iter_mut().enumerate() {
        let row = host.as_ref().map(|h| &h[r * vocab..(r + 1) * vocab]);
        match (d, row) {
            (Some(d), Some(row)) if on_device[r].is_none() => {
                d.token = crate::generate::draw(row, &d.params, &mut d.rng)?;
                out.push(None);
            }
            (Some(_), _) => out.push(None),
            (None, Some(row)) => out.push(Some(row.to_vec())),
            (None, None) => {
                return Err(EngineError::Kernel(
                    "finish: a row's logits were not fetched".into(),
                ))
            }
        }
    }
    Ok(Out::Rows(out))
}

impl GLayer {
    fn linears(&self) -> Vec<&GLinear> {
        let mut v = Vec::new();
        match &self.gate_up {
            GGateUp::Fused(w) => v.push(w),
            GGateUp::Split { gate, up } => v.extend([gate, up]),
        }
        v.push(&self.down);
        match &self.mixer {
            GMixer::Attn(a) => {
                match &a.qkv {
                    GQkv::Split { q, k, v: vv } => v.extend([q, k, vv]),
                    GQkv::Fused { w, .. } => v.push(w),
                }
                v.push(&a.o);
                if let Some(g) = &a.g_proj {
                    v.push(g);
                }
            }
            GMixer::Gdn(g) => v.extend(g.qkvz.iter().chain(&g.ba).chain([&g.out])),
        }
        v
    }
}

/// A step's view: the weights, the scratch pool and the GEMV scratch.
struct Ctx<'a> {
    w: &'a Weights,
    pool: &'a mut Pool,
    scratch: &'a mut GpuBuffer<u32>,
    frags: &'a mut Nvfp4Fragments,
    max_len: usize,
    /// The staging buffers of streamed linears, and which of each pair this layer reads.
    stages: &'a [[GLinear; 2]],
    buf: usize,
    /// A prompt chunk's attention through the flash prefill kernels, where the weights allow it.
    flash: Option<&'a FlashChunk>,
}

/// What the flash prefill kernels need for one prompt chunk of one sequence, uploaded once for all layers: the
/// chunk's offsets `[0, t]`, the prefix length `[P]` and, after a cached prefix, an identity block table
/// `[0, P)`: the slot's prefix is copied into a bf16 `[P, kv_heads, head_dim]` buffer per layer, which is the
/// paged layout with one token per page.
struct FlashChunk {
    slot: usize,
    prefix: usize,
    cu_seqlens: GpuBuffer<u32>,
    prefix_lens: GpuBuffer<u32>,
    table: Option<GpuBuffer<u32>>,
}

/// `y = x · wᵀ` for the linears that read f32 activations (dense, int4); `None` for a tile one (nothing done).
fn f32_linear(
    gpu: &Gpu,
    w: &GLinear,
    x: &GpuBuffer<f32>,
    y: &mut GpuBuffer<f32>,
    m: usize,
) -> Option<Result<(), EngineError>> {
    let r = match w {
        GLinear::Dense(d) => gpu.dense_linear(x, d, y, m),
        GLinear::Nvfp4 { rows: Some(d), .. } if m <= F32_ROWS_MAX_M => gpu.dense_linear(x, d, y, m),
        GLinear::Int4(q) => gpu.int4_w4a16(x, q, m, y),
        _ => return None,
    };
    Some(r.map_err(kerr))
}

/// The device weights a linear computes from: its own, or for a streamed one this layer's staging buffer.
fn resolve<'a>(stages: &'a [[GLinear; 2]], buf: usize, w: &'a GLinear) -> &'a GLinear {
    match w {
        GLinear::Host(h) => stages.get(h.stage).map_or(w, |s| &s[buf]),
        _ => w,
    }
}

impl<'a> Ctx<'a> {
    fn norm(
        &mut self,
        x: &GpuBuffer<f32>,
        wn: &GpuBuffer<f32>,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let _t = profile::span(Op::Small);
        let gpu = &self.w.gpu;
        let mut out = self.pool.f32(gpu, x.len())?;
        gpu.rmsnorm_f32(x, wn, self.w.norm_form, self.w.eps, &mut out)
            .map_err(kerr)?;
        Ok(out)
    }

    /// `x += y` (the residual stream), then the norm of the new `x` with `wn`: one kernel.
    fn add_norm(
        &mut self,
        y: &GpuBuffer<f32>,
        x: &mut GpuBuffer<f32>,
        wn: &GpuBuffer<f32>,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let _t = profile::span(Op::Small);
        let gpu = &self.w.gpu;
        let mut out = self.pool.f32(gpu, x.len())?;
        gpu.add_rmsnorm_f32(y, x, wn, self.w.norm_form, self.w.eps, &mut out)
            .map_err(kerr)?;
        Ok(out)
    }

    /// [`Ctx::add_norm`] that also writes the normed rows in bf16, for the tile GEMVs (one kernel).
    fn add_norm_dual(
        &mut self,
        y: &GpuBuffer<f32>,
        x: &mut GpuBuffer<f32>,
        wn: &GpuBuffer<f32>,
    ) -> Result<(GpuBuffer<f32>, GpuBuffer<u16>), EngineError> {
        let _t = profile::span(Op::Small);
        let gpu = &self.w.gpu;
        let mut out = self.pool.f32(gpu, x.len())?;
        let mut outb = self.pool.u16(gpu, x.len())?;
        gpu.add_rmsnorm_dual(y, x, wn, self.w.norm_form, self.w.eps, &mut out, &mut outb)
            .map_err(kerr)?;
        Ok((out, outb))
    }

    /// Columns `[off, off + width)` of every row of `src` (`[rows, cols]`) as a new `[rows, width]` buffer.
    fn cols(
        &mut self,
        src: &GpuBuffer<f32>,
        cols: usize,
        off: usize,
        width: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let gpu = &self.w.gpu;
        let rows = src.len() / cols;
        let mut out = self.pool.f32(gpu, rows * width)?;
        gpu.copy_cols(src, cols, off, &mut out, width, 0, rows, width)
            .map_err(kerr)?;
        Ok(out)
    }

    /// `y = x · wᵀ` for `m` rows: the dense kernel at any `m`; the tile GEMVs on bf16 copies of the activations
    /// (what they read), in pieces of at most 16 rows.
    fn linear(
        &mut self,
        w: &GLinear,
        x: &GpuBuffer<f32>,
        m: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        self.linear_in(w, (x, None), m)
    }

    /// [`Ctx::linear`] given, optionally, `x`'s bf16 copy, which a tile GEMV of at most 16 rows then reads
    /// instead of casting `x` itself.
    fn linear_in(
        &mut self,
        w: &GLinear,
        (x, xb16): (&GpuBuffer<f32>, Option<&GpuBuffer<u16>>),
        m: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let _t = profile::span(Op::Linear);
        let w = resolve(self.stages, self.buf, w);
        let gpu = &self.w.gpu;
        let (n, k) = (w.n(), w.k());
        let mut y = self.pool.f32(gpu, m * n)?;
        if let Some(r) = f32_linear(gpu, w, x, &mut y, m) {
            r?;
            return Ok(y);
        }
        if let (Some(xb), true) = (xb16, m <= 16) {
            self.tiles(w, xb, &mut y, m)?;
            return Ok(y);
        }
        // An NVFP4 tile GEMV with no bf16 copy at hand (the GDN out_proj): the cast writes the GEMV's fragments
        // itself ([`Gpu::cast_nvfp4_gemv`]: no bf16 copy, no fragment kernel), the same bits as the cast + GEMV
        // below. The producer takes rows of a multiple of 16 values within its grid.
        if let GLinear::Nvfp4 { tiles, global, .. } = w {
            if m <= 16 && self.w.fused_casts && k.is_multiple_of(16) && k <= 65535 * 1024 {
                gpu.cast_nvfp4_gemv(x, self.frags, tiles, *global, &mut y)
                    .map_err(kerr)?;
                return Ok(y);
            }
        }
        if m <= 16 {
            let mut xb = self.pool.u16(gpu, m * k)?;
            gpu.cast_f32_to_bf16(x, &mut xb).map_err(kerr)?;
            self.tiles(w, &xb, &mut y, m)?;
            self.pool.put_u16(xb);
            return Ok(y);
        }
        // Many rows with the checkpoint layout at hand: the tensor-core GEMMs (FP8 with activations quantised per
        // 128 columns, NVFP4 weight-only on bf16 activations).
        match w {
            GLinear::Fp8 {
                raw: Some(wr),
                scales,
                ..
            } if k.is_multiple_of(16) => {
                let mut xb = self.pool.u16(gpu, m * k)?;
                gpu.cast_f32_to_bf16(x, &mut xb).map_err(kerr)?;
                let mut xq = self.pool.u8(gpu, m * k)?;
                let mut xs = self.pool.f32(gpu, m * k.div_ceil(128))?;
                gpu.fp8_quantize_activations(&xb, &mut xq, &mut xs, m, k)
                    .and_then(|()| gpu.fp8_block_gemm(&xq, &xs, wr, scales, &mut y, m, n, k))
                    .map_err(kerr)?;
                self.pool.put_u16(xb);
                self.pool.put_u8(xq);
                self.pool.put(xs);
                return Ok(y);
            }
            GLinear::Nvfp4 {
                raw: Some((wr, sc)),
                global,
                ..
            } => {
                let mut xb = self.pool.u16(gpu, m * k)?;
                gpu.cast_f32_to_bf16(x, &mut xb).map_err(kerr)?;
                gpu.nvfp4_gemm(&xb, wr, sc, *global, &mut y, m, n, k)
                    .map_err(kerr)?;
                self.pool.put_u16(xb);
                return Ok(y);
            }
            _ => {}
        }
        let mut r0 = 0;
        while r0 < m {
            let c = (m - r0).min(16);
            let mut xs = self.pool.f32(gpu, c * k)?;
            gpu.copy_cols(x, m * k, r0 * k, &mut xs, c * k, 0, 1, c * k)
                .map_err(kerr)?;
            let mut xb = self.pool.u16(gpu, c * k)?;
            gpu.cast_f32_to_bf16(&xs, &mut xb).map_err(kerr)?;
            self.pool.put(xs);
            let mut ys = self.pool.f32(gpu, c * n)?;
            self.tiles(w, &xb, &mut ys, c)?;
            self.pool.put_u16(xb);
            gpu.copy_cols(&ys, c * n, 0, &mut y, m * n, r0 * n, 1, c * n)
                .map_err(kerr)?;
            self.pool.put(ys);
            r0 += c;
        }
        Ok(y)
    }

    /// Several linears of the same input `x` (`m` rows), the input cast to bf16 once for all the tile GEMVs.
    fn linears(
        &mut self,
        ws: &[&GLinear],
        (x, xb16): (&GpuBuffer<f32>, Option<&GpuBuffer<u16>>),
        m: usize,
    ) -> Result<Vec<GpuBuffer<f32>>, EngineError> {
        let ws: Vec<&GLinear> = ws
            .iter()
            .map(|w| resolve(self.stages, self.buf, w))
            .collect();
        let tiled = ws.iter().filter(|w| w.tiled()).count();
        if m > 16 || (tiled < 2 && xb16.is_none()) {
            return ws.iter().map(|w| self.linear_in(w, (x, xb16), m)).collect();
        }
        let _t = profile::span(Op::Linear);
        let gpu = &self.w.gpu;
        let k = ws[0].k();
        let owned = match xb16 {
            Some(_) => None,
            None => {
                let mut xb = self.pool.u16(gpu, m * k)?;
                gpu.cast_f32_to_bf16(x, &mut xb).map_err(kerr)?;
                Some(xb)
            }
        };
        let mut out = Vec::with_capacity(ws.len());
        let mut r = Ok(());
        if let Some(xb) = owned.as_ref().or(xb16) {
            for w in ws {
                let mut y = self.pool.f32(gpu, m * w.n())?;
                r = match f32_linear(gpu, w, x, &mut y, m) {
                    Some(r) => r,
                    None => self.tiles(w, xb, &mut y, m),
                };
                out.push(y);
                if r.is_err() {
                    break;
                }
            }
        }
        if let Some(xb) = owned {
            self.pool.put_u16(xb);
        }
        r.map(|()| out)
    }

    /// One tile GEMV of at most 16 rows.
    fn tiles(
        &mut self,
        w: &GLinear,
        xb: &GpuBuffer<u16>,
        y: &mut GpuBuffer<f32>,
        m: usize,
    ) -> Result<(), EngineError> {
        let gpu = &self.w.gpu;
        match resolve(self.stages, self.buf, w) {
            GLinear::Host(_) => {
                return Err(EngineError::Kernel(
                    "a streamed linear has no staging buffer".into(),
                ))
            }
            GLinear::Fp8 { tiles, scales, .. } => {
                gpu.fp8_gemv_tiles(xb, tiles, scales, y, self.scratch, m)
            }
            GLinear::Nvfp4 { tiles, global, .. } => {
                gpu.nvfp4_gemv_tiles(xb, tiles, *global, y, self.scratch, m)
            }
            GLinear::Dense(_) | GLinear::Int4(_) => {
                return Err(EngineError::Unsupported(format!(
                    "a {} {}x{} weight has no tile GEMV",
                    w.path_name(),
                    w.n(),
                    w.k()
                )))
            }
        }
        .map_err(kerr)
    }

    /// The residual add, the feed-forward norm and the MLP's up projection fused where the gate/up projection is
    /// one tile GEMV of at most 16 rows: the norm writes the bf16 activations the FP8 GEMV reads (no f32 copy, no
    /// cast), or the NVFP4 GEMV's fragments ([`Gpu::rmsnorm_nvfp4_gemv`]: no cast, no fragment kernel), the same
    /// bits as the unfused steps. `None` (nothing done) where it does not apply.
    fn norm_mlp(
        &mut self,
        layer: &GLayer,
        o: &GpuBuffer<f32>,
        x: &mut GpuBuffer<f32>,
        ff_norm: &GpuBuffer<f32>,
        t: usize,
    ) -> Result<Option<GpuBuffer<f32>>, EngineError> {
        let GGateUp::Fused(gate_up) = &layer.gate_up else {
            return Ok(None);
        };
        let gate_up = resolve(self.stages, self.buf, gate_up);
        if t > 16 || !matches!(gate_up, GLinear::Fp8 { .. } | GLinear::Nvfp4 { .. }) {
            return Ok(None);
        }
        let gpu = &self.w.gpu;
        let mut gu = self.pool.f32(gpu, t * gate_up.n())?;
        {
            let _t = profile::span(Op::Linear);
            let (form, eps) = (self.w.norm_form, self.w.eps);
            // The fragment producer takes rows of at most 8192 values, a multiple of 16.
            let dim = x.len() / t;
            match gate_up {
                GLinear::Nvfp4 { tiles, global, .. } if dim <= 8192 && dim.is_multiple_of(16) => {
                    gpu.rmsnorm_nvfp4_gemv(
                        o,
                        Some(x),
                        ff_norm,
                        form,
                        eps,
                        self.frags,
                        tiles,
                        *global,
                        &mut gu,
                    )
                    .map_err(kerr)?
                }
                _ => {
                    let mut xb = self.pool.u16(gpu, x.len())?;
                    let r = gpu
                        .add_rmsnorm(o, x, ff_norm, form, eps, &mut xb)
                        .map_err(kerr)
                        .and_then(|()| self.tiles(gate_up, &xb, &mut gu, t));
                    self.pool.put_u16(xb);
                    r?;
                }
            }
        }
        self.mlp_down(layer, gu, t).map(Some)
    }

    fn mlp(
        &mut self,
        layer: &GLayer,
        x: &GpuBuffer<f32>,
        t: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let gu = match &layer.gate_up {
            GGateUp::Fused(wt) => self.linear(wt, x, t)?,
            GGateUp::Split { gate, up } => {
                let outs = self.linears(&[gate, up], (x, None), t)?;
                self.side_by_side(outs, t)?
            }
        };
        self.mlp_down(layer, gu, t)
    }

    /// The gated activation of `gu` (`[t, 2 * inter]`, gate then up) and the down projection.
    fn mlp_down(
        &mut self,
        layer: &GLayer,
        gu: GpuBuffer<f32>,
        t: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let gpu = &self.w.gpu;
        let inter = self.w.inter;
        // A tile down projection reads bf16 (FP8) or its fragments (NVFP4): the activation kernel writes them
        // directly (no f32 copy, no cast, no fragment kernel).
        let down = resolve(self.stages, self.buf, &layer.down);
        let tile_down = down.tiled() && t <= 16;
        if tile_down && self.w.act != GatedAct::GeluTanh {
            let mut out = self.pool.f32(gpu, t * layer.down.n())?;
            if let GLinear::Nvfp4 { tiles, global, .. } = down {
                let _t = profile::span(Op::Linear);
                let r = match self.w.act {
                    GatedAct::Silu => {
                        gpu.silu_and_mul_nvfp4_gemv(&gu, self.frags, tiles, *global, &mut out)
                    }
                    _ => gpu.gelu_and_mul_nvfp4_gemv(&gu, self.frags, tiles, *global, &mut out),
                };
                self.pool.put(gu);
                r.map_err(kerr)?;
                return Ok(out);
            }
            let mut xb = self.pool.u16(gpu, t * inter)?;
            {
                let _t = profile::span(Op::Small);
                match self.w.act {
                    GatedAct::Silu => gpu.silu_and_mul(&gu, inter, &mut xb),
                    _ => gpu.gelu_and_mul(&gu, inter, &mut xb),
                }
                .map_err(kerr)?;
            }
            self.pool.put(gu);
            {
                let _t = profile::span(Op::Linear);
                self.tiles(&layer.down, &xb, &mut out, t)?;
            }
            self.pool.put_u16(xb);
            return Ok(out);
        }
        let mut act = self.pool.f32(gpu, t * inter)?;
        {
            let _t = profile::span(Op::Small);
            gpu.act_and_mul_f32(self.w.act, &gu, inter, &mut act)
                .map_err(kerr)?;
        }
        self.pool.put(gu);
        let out = self.linear(&layer.down, &act, t)?;
        self.pool.put(act);
        Ok(out)
    }

    /// One prompt chunk's attention (`q`, `k`, `v`: f32 `[t, heads * head_dim]`, RoPE applied) through the flash
    /// prefill kernels into `out` (f32 `[t, q_heads * head_dim]`): bf16 copies of the chunk and, after a cached
    /// prefix, of the slot's first `P` cached rows (the caches keep f32 for the exact decode kernel). Each new
    /// token sees the prefix and the chunk up to itself, within `window`.
    fn flash_attention(
        &mut self,
        f: &FlashChunk,
        window: Option<usize>,
        (q, k, v): (&GpuBuffer<f32>, &GpuBuffer<f32>, &GpuBuffer<f32>),
        (ck, cv): (&GpuBuffer<f32>, &GpuBuffer<f32>),
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), EngineError> {
        let gpu = &self.w.gpu;
        let d = self.w.attn_dims;
        let kvw = d.kv_heads * d.head_dim;
        let t = k.len() / kvw;
        let mut bf = Vec::with_capacity(3);
        for x in [q, k, v] {
            let mut b = self.pool.u16(gpu, x.len())?;
            gpu.cast_f32_to_bf16(x, &mut b).map_err(kerr)?;
            bf.push(b);
        }
        let mut ob = self.pool.u16(gpu, out.len())?;
        let ran = match &f.table {
            None => gpu.attention_prefill(
                &d,
                self.w.attn_scale,
                window,
                t,
                &bf[0],
                &bf[1],
                &bf[2],
                &mut ob,
            ),
            Some(table) => {
                let (p, base) = (f.prefix, f.slot * self.max_len * kvw);
                let mut pre = Vec::with_capacity(2);
                for c in [ck, cv] {
                    let mut rows = self.pool.f32(gpu, p * kvw)?;
                    gpu.copy_cols(c, c.len(), base, &mut rows, p * kvw, 0, 1, p * kvw)
                        .map_err(kerr)?;
                    let mut b = self.pool.u16(gpu, p * kvw)?;
                    gpu.cast_f32_to_bf16(&rows, &mut b).map_err(kerr)?;
                    self.pool.put(rows);
                    pre.push(b);
                }
                let dims = PagedAttentionDims {
                    seqs: 1,
                    q_heads: d.q_heads,
                    kv_heads: d.kv_heads,
                    head_dim: d.head_dim,
                    page_size: 1,
                    num_pages: p,
                    max_pages_per_seq: p,
                };
                let chunk = PrefillChunk {
                    q: &bf[0],
                    k: &bf[1],
                    v: &bf[2],
                    cu_seqlens: &f.cu_seqlens,
                    prefix_lens: &f.prefix_lens,
                    total: t,
                    max_seqlen: t,
                };
                let r = gpu.attention_prefill_paged(
                    &dims,
                    self.w.attn_scale,
                    window,
                    &pre[0],
                    &pre[1],
                    table,
                    chunk,
                    &mut ob,
                );
                pre.into_iter().for_each(|b| self.pool.put_u16(b));
                r
            }
        };
        let r = ran
            .and_then(|()| gpu.cast_bf16_to_f32(&ob, out))
            .map_err(kerr);
        self.pool.put_u16(ob);
        bf.into_iter().for_each(|b| self.pool.put_u16(b));
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        a: &GAttn,
        ck: &mut GpuBuffer<f32>,
        cv: &mut GpuBuffer<f32>,
        slots: &GpuBuffer<u32>,
        pos: &GpuBuffer<u32>,
        (x, xb16): (&GpuBuffer<f32>, Option<&GpuBuffer<u16>>),
        t: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let gpu = &self.w.gpu;
        let d = self.w.attn_dims;
        let (qw, kvw) = (d.q_heads * d.head_dim, d.kv_heads * d.head_dim);
        let (qg, mut k, mut v) = match &a.qkv {
            GQkv::Split { q, k, v } => {
                let mut o = self.linears(&[q, k, v], (x, xb16), t)?.into_iter();
                let mut next = || {
                    o.next()
                        .ok_or_else(|| EngineError::Kernel("linears: missing output".into()))
                };
                (next()?, next()?, next()?)
            }
            GQkv::Fused { w, q_rows } => {
                let n = w.n();
                let all = self.linear_in(w, (x, xb16), t)?;
                let q = self.cols(&all, n, 0, *q_rows)?;
                let k = self.cols(&all, n, *q_rows, kvw)?;
                let v = self.cols(&all, n, *q_rows + kvw, kvw)?;
                self.pool.put(all);
                (q, k, v)
            }
        };
        // A gated q projection holds, per head, head_dim queries then head_dim gates.
        let (mut q, gate) = if self.w.gated_q {
            let q = self.cols(&qg, 2 * d.head_dim, 0, d.head_dim)?;
            let g = self.cols(&qg, 2 * d.head_dim, d.head_dim, d.head_dim)?;
            self.pool.put(qg);
            (q, Some(g))
        } else {
            (qg, None)
        };
        for (buf, bias) in [
            (&mut q, &a.biases[0]),
            (&mut k, &a.biases[1]),
            (&mut v, &a.biases[2]),
        ] {
            if let Some(b) = bias {
                gpu.add_bias_rows(buf, b).map_err(kerr)?;
            }
        }
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            let nq = self.norm(&q, qn)?;
            self.pool.put(std::mem::replace(&mut q, nq));
            let nk = self.norm(&k, kn)?;
            self.pool.put(std::mem::replace(&mut k, nk));
        }
        {
            let _t = profile::span(Op::Small);
            gpu.rope_neox(&a.rope, d.q_heads, pos, &mut q)
                .map_err(kerr)?;
            gpu.rope_neox(&a.rope, d.kv_heads, pos, &mut k)
                .map_err(kerr)?;
        }
        let mut out = self.pool.f32(gpu, t * qw)?;
        {
            let _t = profile::span(Op::Attention);
            gpu.kv_store_slots(&d, &k, &v, slots, pos, ck, cv, self.max_len)
                .map_err(kerr)?;
            if let Some(f) = self.flash {
                self.flash_attention(f, a.window, (&q, &k, &v), (ck, cv), &mut out)?;
            } else if let (Some(splits), true) = (self.w.decode_splits, t <= 16) {
                let len = Gpu::attention_slots_workspace_len(&d, t, splits).map_err(kerr)?;
                let mut ws = self.pool.f32(gpu, len)?;
                let r = gpu.attention_slots_split(
                    &d,
                    self.w.attn_scale,
                    a.window,
                    &q,
                    ck,
                    cv,
                    self.max_len,
                    slots,
                    pos,
                    splits,
                    &mut ws,
                    &mut out,
                );
                self.pool.put(ws);
                r.map_err(kerr)?;
            } else {
                gpu.attention_slots(
                    &d,
                    self.w.attn_scale,
                    a.window,
                    &q,
                    ck,
                    cv,
                    self.max_len,
                    slots,
                    pos,
                    &mut out,
                )
                .map_err(kerr)?;
            }
        }
        self.pool.put(q);
        self.pool.put(k);
        self.pool.put(v);
        // A per-element gate before a tile o_proj of at most 16 rows writes only the bf16 the GEMV reads (no cast),
        // so an o_proj that reads f32 activations (its exact f32 rows) must take the gate in f32.
        let o_tiled =
            t <= 16 && self.w.fused_casts && resolve(self.stages, self.buf, &a.o).tiled_at(t);
        let mut gated_b16 = None;
        if let Some(g) = gate {
            if o_tiled && a.g_proj.is_none() {
                let mut ob = self.pool.u16(gpu, out.len())?;
                gpu.sigmoid_gate_bf16(&out, &g, &mut ob).map_err(kerr)?;
                gated_b16 = Some(ob);
            } else {
                gpu.sigmoid_gate(&mut out, &g).map_err(kerr)?;
            }
            self.pool.put(g);
        }
        if let Some(gp) = &a.g_proj {
            let g = self.linear_in(gp, (x, xb16), t)?;
            gpu.sigmoid_head_gate(&mut out, d.q_heads, &g)
                .map_err(kerr)?;
            self.pool.put(g);
        }
        let mut o = self.linear_in(&a.o, (&out, gated_b16.as_ref()), t)?;
        self.pool.put(out);
        if let Some(ob) = gated_b16 {
            self.pool.put_u16(ob);
        }
        if let Some(b) = &a.biases[3] {
            gpu.add_bias_rows(&mut o, b).map_err(kerr)?;
        }
        Ok(o)
    }

    /// `outs` (`[m, n_i]` each) copied side by side into one `[m, sum n_i]` buffer; a single one is returned as is.
    fn side_by_side(
        &mut self,
        mut outs: Vec<GpuBuffer<f32>>,
        m: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        if outs.len() == 1 {
            return outs
                .pop()
                .ok_or_else(|| EngineError::Kernel("linears: missing output".into()));
        }
        let gpu = &self.w.gpu;
        let width: usize = outs.iter().map(|o| o.len() / m).sum();
        let mut all = self.pool.f32(gpu, m * width)?;
        let mut off = 0;
        for o in outs {
            let n = o.len() / m;
            gpu.copy_cols(&o, n, 0, &mut all, width, off, m, n)
                .map_err(kerr)?;
            off += n;
            self.pool.put(o);
        }
        Ok(all)
    }

    #[allow(clippy::too_many_arguments)]
    fn gdn(
        &mut self,
        g: &GGdn,
        conv: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        (slots, pos): (&GpuBuffer<u32>, &GpuBuffer<u32>),
        batch: &[Step<'_>],
        prefill: bool,
        x: (&GpuBuffer<f32>, Option<&GpuBuffer<u16>>),
        t: usize,
    ) -> Result<GpuBuffer<f32>, EngineError> {
        let gpu = &self.w.gpu;
        let dims = self
            .w
            .gdn_dims
            .ok_or_else(|| EngineError::Unsupported("GDN layer without geometry".into()))?;
        let (vw, hv, cd) = (dims.value_width(), dims.value_heads, dims.conv_dim());
        // One pass over the input for every projection (one bf16 cast for the tile GEMVs), then the stacked
        // layouts the step reads: [qkv | z] and [b | a] per row.
        let parts: Vec<&GLinear> = g.qkvz.iter().chain(&g.ba).collect();
        let mut outs = self.linears(&parts, x, t)?;
        let ba_outs = outs.split_off(g.qkvz.len());
        let qkvz = self.side_by_side(outs, t)?;
        let ba = self.side_by_side(ba_outs, t)?;
        let wts = GdnGpuWeights {
            conv_weight: &g.conv,
            a_log: &g.a_log,
            dt_bias: &g.dt_bias,
            norm_weight: &g.norm,
            norm_eps: self.w.eps,
        };
        let mut out = self.pool.f32(gpu, t * vw)?;
        let t_gdn = profile::span(Op::Gdn);
        if prefill {
            // The chunked prefill runs on one sequence's own rows: its state and the conv history its first
            // position reads are copied out of the slot caches, and back (the history into the half the next
            // position reads).
            let (s, p0) = (batch[0].slot, batch[0].pos);
            let (cl, sl) = (dims.conv_state_len(), dims.state_len());
            let qkv = self.cols(&qkvz, cd + vw, 0, cd)?;
            let z = self.cols(&qkvz, cd + vw, cd, vw)?;
            let b = self.cols(&ba, 2 * hv, 0, hv)?;
            let a = self.cols(&ba, 2 * hv, hv, hv)?;
            let gpu = &self.w.gpu;
            let mut st = self.pool.f32(gpu, sl)?;
            let mut cin = self.pool.f32(gpu, cl)?;
            let mut cout = self.pool.f32(gpu, cl)?;
            let ws_len = Gpu::gdn_prefill_workspace_len_with(self.w.gdn_prefill, &dims, &[t])
                .map_err(kerr)?;
            let mut ws = self.pool.f32(gpu, ws_len)?;
            let (nc, ns) = (conv.len(), state.len());
            let r = gpu
                .copy_cols(state, ns, s * sl, &mut st, sl, 0, 1, sl)
                .and_then(|()| {
                    gpu.copy_cols(conv, nc, (2 * s + p0 % 2) * cl, &mut cin, cl, 0, 1, cl)
                })
                .and_then(|()| {
                    gpu.gdn_prefill_with(
                        self.w.gdn_prefill,
                        &dims,
                        &wts,
                        &GdnGpuInputs {
                            qkv: &qkv,
                            z: &z,
                            a: &a,
                            b: &b,
                        },
                        &[t],
                        GdnPrefillIo {
                            conv_in: &cin,
                            conv_out: &mut cout,
                            state: &mut st,
                            out: &mut out,
                            workspace: &mut ws,
                        },
                    )
                })
                .and_then(|()| {
                    gpu.copy_cols(&cout, cl, 0, conv, nc, (2 * s + (p0 + t) % 2) * cl, 1, cl)
                })
                .and_then(|()| gpu.copy_cols(&st, sl, 0, state, ns, s * sl, 1, sl));
            for buf in [qkv, z, b, a, st, cin, cout, ws] {
                self.pool.put(buf);
            }
            r.map_err(kerr)?;
        } else {
            gpu.gdn_decode_step_slots(
                &dims,
                &wts,
                &GdnStackedInputs {
                    qkvz: &qkvz,
                    ba: &ba,
                },
                t,
                slots,
                pos,
                conv,
                state,
                &mut out,
            )
            .map_err(kerr)?;
        }
        drop(t_gdn);
        self.pool.put(qkvz);
        self.pool.put(ba);
        let o = self.linear(&g.out, &out, t)?;
        self.pool.put(out);
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unpinned bytes the ledger says it holds, recomputed from its counts.
    fn loose(l: &Ledger) -> usize {
        l.held
            .iter()
            .filter(|(k, _)| !l.pinned.contains(k))
            .map(|(k, h)| h.0 * Ledger::bytes(*k))
            .sum()
    }

    /// The pool frees the least recently used unpinned lengths past its cap, never a pinned one nor the one just
    /// given back, and its byte count stays equal to what it holds.
    #[test]
    fn ledger_frees_the_oldest_unpinned_lengths_past_the_cap() {
        let mut l = Ledger::default();
        let cap = 1000;
        // A decode step pins its length: never freed, never counted against the cap.
        l.take((4, 50), true, false);
        assert!(l.put((4, 50), cap).is_empty());
        // Prompt chunks of three lengths of 400 bytes each, given back in that order.
        for key in [(1, 400), (2, 200)] {
            l.take(key, false, false);
            assert!(l.put(key, cap).is_empty());
        }
        assert_eq!((l.loose, loose(&l)), (800, 800));
        // The third overflows the cap: the oldest unpinned length goes, not the pinned one nor the third itself.
        l.take((4, 100), false, false);
        assert_eq!(l.put((4, 100), cap), vec![(1, 400)]);
        assert_eq!((l.loose, loose(&l)), (800, 800));
        // Taking (2, 200) again makes it the newest: the next overflow frees (4, 100) instead.
        l.take((2, 200), false, true);
        assert_eq!((l.loose, loose(&l)), (400, 400));
        assert!(l.put((2, 200), cap).is_empty());
        l.take((1, 300), false, false);
        assert_eq!(l.put((1, 300), cap), vec![(4, 100)]);
        assert_eq!((l.loose, loose(&l)), (700, 700));
        // A buffer bigger than the cap frees everything else unpinned and is kept itself.
        l.take((1, 2000), false, false);
        assert_eq!(l.put((1, 2000), cap), vec![(2, 200), (1, 300)]);
        assert_eq!((l.loose, loose(&l)), (2000, 2000));
        // Pinning a length that holds buffers takes them out of the count.
        l.take((1, 2000), true, true);
        assert_eq!((l.loose, loose(&l)), (0, 0));
        assert!(l.put((1, 2000), cap).is_empty());
        assert_eq!((l.held[&(4, 50)].0, l.held[&(1, 2000)].0), (1, 1));
    }

    /// Stacking by rows keeps each part's rows in order and refuses what one kernel cannot read as one weight.
    #[test]
    fn stack_rows_concatenates_or_refuses() {
        let a = Weight::f32(vec![1.0, 2.0, 3.0, 4.0], 2, 2).unwrap();
        let b = Weight::f32(vec![5.0, 6.0], 1, 2).unwrap();
        match stack_rows(&[&a, &b]) {
            Some(Weight::F32 { w, n, k }) => {
                assert_eq!((w, n, k), (vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2))
            }
            other => panic!("f32 parts: {other:?}"),
        }
        let h = Weight::bf16(vec![7, 8], 1, 2).unwrap();
        match stack_rows(&[&h, &h]) {
            Some(Weight::Bf16 { w, n, k }) => assert_eq!((w, n, k), (vec![7, 8, 7, 8], 2, 2)),
            other => panic!("bf16 parts: {other:?}"),
        }
        // Different formats, different k.
        assert!(stack_rows(&[&a, &h]).is_none());
        let wide = Weight::f32(vec![0.0; 3], 1, 3).unwrap();
        assert!(stack_rows(&[&a, &wide]).is_none());
        // NVFP4 parts stack only with one global scale.
        let nv = |global: f32| Weight::Nvfp4 {
            w: vec![0; 8],
            scales: vec![0; 1],
            global,
            n: 1,
            k: 16,
        };
        match stack_rows(&[&nv(2.0), &nv(2.0)]) {
            Some(Weight::Nvfp4 { n, global, w, .. }) => {
                assert_eq!((n, global, w.len()), (2, 2.0, 16))
            }
            other => panic!("nvfp4 parts: {other:?}"),
        }
        assert!(stack_rows(&[&nv(2.0), &nv(3.0)]).is_none());
        // The projections' stacking takes the quantized formats only, each part's rows in order, and refuses a
        // different k.
        let rows = |first: u8, global: f32, k: usize| Weight::Nvfp4 {
            w: vec![first; k / 2],
            scales: vec![first; k / 16],
            global,
            n: 1,
            k,
        };
        match stack_quantized(&[&rows(1, 0.5, 32), &rows(2, 0.5, 32), &rows(3, 0.5, 32)]) {
            Some(Weight::Nvfp4 {
                w,
                scales,
                global,
                n,
                k,
            }) => {
                assert_eq!((n, k, global), (3, 32, 0.5));
                assert_eq!(w, [[1u8; 16], [2; 16], [3; 16]].concat());
                assert_eq!(scales, vec![1, 1, 2, 2, 3, 3]);
            }
            other => panic!("nvfp4 projections: {other:?}"),
        }
        assert!(stack_quantized(&[&rows(1, 0.5, 32), &rows(1, 0.5, 16)]).is_none());
        assert!(stack_quantized(&[&rows(1, 0.5, 32), &rows(1, 0.25, 32)]).is_none());
        assert!(stack_quantized(&[&a, &a]).is_none());
        assert!(stack_quantized(&[&h, &h]).is_none());
    }
}
