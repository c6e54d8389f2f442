//! What the planner knows about a model: its parsed `config.json` (+ quantization metadata), the inventory of every
//! tensor its real checkpoint holds, and what it must keep per token and per sequence (caches and recurrent state).
//!
//! This is the contract between the model side (`model/`, one file per architecture family) and the placement /
//! prediction side of the planner. Everything here is pure: text in, values out.

// The interface types below are the boundary the rest of the planner builds on. Implementations live in the
// sibling files of this module:
// - `parse.rs`: `parse_model`, the entry point; picks the family in `arch/` (one file per architecture family).
// - `json.rs`, `config.rs`: a JSON tree that keeps byte spans, and typed reads that turn into `ModelError`s
//   pointing at the offending key or value (`error.rs`).
// - `quant.rs`: which storage format each linear module has (FP8 block, modelopt NVFP4/FP8, GPTQ, dense).
// - `inventory.rs`: module -> checkpoint tensors (weights and their scales), roles, access classes.
// - `cache.rs`: `cache_budget` per layer type; `flops.rs`: FLOPs per decoded token and per prompt.

mod arch;
mod cache;
mod config;
mod error;
mod flops;
mod inventory;
mod json;
mod observed;
mod parse;
mod quant;
mod runtime;

pub use cache::{
    cache_budget, gdn_state_bytes_per_layer, kv_bytes_per_layer_token, model_dtype,
    rope_table_bytes, sliding_slots, GDN_CONV_ELEM_BYTES, GDN_STATE_ELEM_BYTES,
};
pub use error::ModelError;
pub use flops::{decode_flops_per_token, decode_kernels, prefill_flops, KERNELS_PER_LAYER};
pub use observed::{check_inventory, ObservedTensor};
pub use parse::{parse_model, supported_architectures};
pub use runtime::{
    Activation, LinearModule, MoeRouting, Mrope, NormForm, OutputGate, RopeStyle, Runtime,
    StoredFormat,
};

use serde::{Deserialize, Serialize};

/// One file of a model card, already read by the caller (the planner does no IO).
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Path as the user would recognise it, used in error messages (`models/x/config.json`).
    pub path: String,
    pub text: String,
}

/// A model card: `config.json` plus the quantization metadata file the checkpoint ships, if any
/// (`hf_quant_config.json` for modelopt NVFP4).
#[derive(Debug, Clone)]
pub struct ModelCard {
    /// Short id used on the command line and in plans (`qwen3.8-27b-fp8`).
    pub id: String,
    pub config: SourceFile,
    pub quant_config: Option<SourceFile>,
}

/// Storage dtype of a tensor as it sits in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    F32,
    Bf16,
    F16,
    /// float8_e4m3fn.
    F8E4m3,
    /// Packed e2m1 pairs, two values per byte (NVFP4 weights).
    U8PackedE2m1,
    /// GPTQ int32-packed 4-bit codes (8 per int32).
    I32PackedInt4,
    I32,
}

/// What a tensor is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Embedding,
    LmHead,
    /// A matmul weight inside a decoder layer (attention, GDN or MLP projection).
    LayerWeight,
    /// A routed MoE expert weight (only `active / total` of these are read per token).
    ExpertWeight,
    /// Quantization scales, zero points, global scales.
    Scale,
    /// Norm weights, biases, conv kernels, gates' small vectors (A_log, dt_bias).
    Small,
    VisionTower,
    MtpHead,
}

/// How often the bytes of a tensor are read during decode: the key to choosing which bytes to offload first.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Access {
    /// Every byte is read once per generated token.
    EveryToken,
    /// One row per token (embedding lookup): `row_bytes` per token.
    Gather { row_bytes: u64 },
    /// Only when the prompt carries an image (vision tower); never during decode.
    ConditionalImage,
    /// Only when speculative decoding is on (MTP head).
    ConditionalSpeculative,
    /// Routed experts: on average `active` of `total` experts are read per token.
    Routed { active: u32, total: u32 },
}

/// One tensor of the real checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TensorEntry {
    /// The checkpoint's own name (`model.language_model.layers.0.mlp.down_proj.weight`).
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    /// Bytes on disk / in memory for this tensor.
    pub bytes: u64,
    /// Logical parameter count (an NVFP4 byte holds 2 parameters; scales count as parameters of their own).
    pub params: u64,
    pub role: Role,
    pub access: Access,
    /// Decoder layer index, if the tensor belongs to one (the unit an engine like vLLM can offload).
    pub layer: Option<u32>,
}

/// The kind of one decoder layer, which decides what it keeps per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    FullAttention,
    SlidingAttention,
    /// Gated DeltaNet: fixed recurrent + conv state, no KV cache.
    LinearAttention,
}

/// Weight quantization of the checkpoint, as read from its metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "method")]
pub enum Quantization {
    /// Unquantized (bf16/f16/f32 as `dtype` says).
    None { dtype: DType },
    /// FP8 e4m3 with block scales (`weight_block_size`).
    Fp8Block { block: [u32; 2] },
    /// modelopt NVFP4 (some modules may stay FP8 or bf16 through exclude globs).
    Nvfp4 {
        group_size: u32,
        exclude_modules: Vec<String>,
    },
    /// GPTQ integer weights.
    Gptq {
        bits: u32,
        group_size: u32,
        sym: bool,
    },
}

/// Everything the rest of the planner needs to know about one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub id: String,
    pub architecture: String,
    pub model_type: String,
    pub hidden_size: u64,
    pub vocab_size: u64,
    /// One entry per decoder layer, `layers.len() == num_hidden_layers`.
    pub layers: Vec<LayerKind>,
    pub num_q_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    pub sliding_window: Option<u64>,
    pub max_position_embeddings: u64,
    pub tie_word_embeddings: bool,
    pub quantization: Quantization,
    /// Every tensor of the checkpoint, in checkpoint order.
    pub inventory: Vec<TensorEntry>,
    /// Gated DeltaNet geometry when the model has linear-attention layers.
    pub gdn: Option<GdnGeometry>,
    /// Routed-expert geometry for MoE models.
    pub moe: Option<MoeGeometry>,
    pub has_vision: bool,
    pub mtp_layers: u32,
    /// RoPE tables per distinct (rotary dims) — `rotary_dims` per layer type, to size cos/sin tables.
    pub rope: Vec<RopeSpec>,
    /// How the model computes (activation, norms, gates, scales, stored formats): what the engine runs from.
    pub runtime: Runtime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GdnGeometry {
    pub num_key_heads: u64,
    pub num_value_heads: u64,
    pub key_head_dim: u64,
    pub value_head_dim: u64,
    pub conv_kernel: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MoeGeometry {
    pub num_experts: u32,
    pub experts_per_token: u32,
    pub shared_experts: u32,
    pub expert_intermediate: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RopeSpec {
    pub layer_kind: LayerKind,
    pub theta: f64,
    pub rotary_dims: u64,
}

/// What the workload asks of the caches (from the plan's workload section).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheWorkload {
    /// Longest sequence (prompt + generated) the deployment admits. Caches and RoPE tables are sized from this,
    /// never from `max_position_embeddings`.
    pub max_model_len: u64,
    pub max_num_seqs: u64,
    /// Bytes per cached K or V element (2 for a bf16 cache).
    pub kv_bytes_per_elem: u64,
    /// Multiplier on the KV cache (not on the fixed recurrent state): the seed used 1.25.
    pub headroom: f64,
    pub sliding_accounting: SlidingAccounting,
    /// How the target engine holds RoPE's cos/sin values.
    pub rope_tables: RopeTables,
}

/// How an engine holds RoPE's cos/sin values, which decides what the plan reserves for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RopeTables {
    /// vLLM's `RotaryEmbedding.cos_sin_cache`: `cat(cos, sin)` of shape `[positions, rotary_dim]`, cast to the
    /// model dtype (`vllm/model_executor/layers/rotary_embedding/base.py`), one per distinct (theta, rotary_dim)
    /// because `get_rope` caches its instances. Seed 002 measured the 1,048,576-position pair of Spark at 512 MiB +
    /// 128 MiB in bf16.
    CosSinCache,
    /// edgefit's engine keeps no table: each RoPE call computes its angles from `rotary_dim / 2` f32 inverse
    /// frequencies (`kernels::attention::rope_neox`, `kernels/cuda/ops.cu` `rope_neox`), so nothing grows with
    /// positions.
    PerCall,
}

/// How a sliding-window layer's cache is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SlidingAccounting {
    /// A ring of `window - 1` slots (the current token is the window's last member), as edgefit's engine keeps it.
    Ring,
    /// A paged backend's block-rounded window: `ceil(window / block_tokens) * block_tokens` slots.
    Paged { block_tokens: u64 },
}

/// The cache and state budget of one layer kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayerKindBudget {
    pub kind: LayerKind,
    pub layers: u64,
    /// Bytes added per token of context, summed over the layers of this kind (0 for sliding and GDN layers).
    pub bytes_per_token: u64,
    /// Bytes per sequence that do not grow with context: the sliding window's slots, GDN recurrent + conv state.
    pub bytes_per_seq: u64,
    /// Slots a sliding layer keeps per sequence (window accounting), if sliding.
    pub window_slots: Option<u64>,
}

/// The cache and state budget of a model under a workload: the plan's `[cache]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheBudget {
    /// KV bytes per token if every layer were charged a full-attention cache (what a layer-blind backend needs).
    pub bytes_per_token_flat: u64,
    /// KV bytes per token of the layers whose cache grows with context (full attention only).
    pub bytes_per_token_hybrid: u64,
    /// Fixed bytes per sequence: sliding windows plus GDN recurrent and conv state.
    pub state_bytes_per_seq: u64,
    /// The flat figure for the workload: `bytes_per_token_flat * max_model_len * max_num_seqs * headroom`.
    pub flat_total_bytes: u64,
    /// The per-layer-type figure for the workload (headroom on KV, not on recurrent state). What the plan reserves.
    pub total_bytes: u64,
    /// `flat_total_bytes / total_bytes`.
    pub flat_over_hybrid: f64,
    pub headroom: f64,
    pub sliding_accounting: SlidingAccounting,
    /// How the target engine holds RoPE (a cos/sin cache, or angles computed per call).
    pub rope_tables: RopeTables,
    /// The dtype of a cos/sin cache: the model dtype (vLLM casts the f32 table to it).
    pub rope_table_dtype: DType,
    /// What the plan reserves for RoPE: a cos/sin cache sized from `max_model_len` (as the seed's capped vLLM build
    /// allocates it; seed 002: the scheduler never produces a later position), or nothing when the engine computes
    /// the angles per call.
    pub rope_table_bytes: u64,
    /// A cos/sin cache sized from `max_position_embeddings` in `rope_table_dtype`, whatever the target: what a model
    /// file that passes `max_position=config.max_position_embeddings` to vLLM's `get_rope` allocates (the seed's trap:
    /// 640 MiB for Spark's million positions in a 2048-token deployment).
    pub rope_table_bytes_uncapped: u64,
    pub per_kind: Vec<LayerKindBudget>,
}
