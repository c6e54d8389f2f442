//! How a model computes, beyond how big it is: the facts an engine needs to run the forward pass (activation, norm
//! form, gates, RoPE style, scales, softcaps, MoE routing, where each linear module's tensors live and in which
//! format). Each family in `arch/` fills a [`Runtime`] from the same parse that sizes the model, so the engine never
//! reads `config.json` a second time.

use serde::{Deserialize, Serialize};

use super::config::Obj;
use super::error::ModelError;
use super::DType;

/// The MLP's activation (the gate's, for a gated MLP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `x * sigmoid(x)` (`silu`, `swish`).
    Silu,
    /// GELU with the exact erf (`gelu`).
    GeluErf,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
}

/// How an RMSNorm applies its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NormForm {
    /// `x / rms(x) * w` (Llama, Qwen3, Spark).
    Weight,
    /// `x / rms(x) * (1 + w)` (Gemma, Qwen3.5 / Qwen3-Next: the weight is stored as an offset from one).
    OnePlusWeight,
}

/// A gate on the attention output, applied per head before `o_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputGate {
    None,
    /// `q_proj` is twice as wide: per head, `head_dim` query values then `head_dim` gate values; the attention
    /// output is multiplied element-wise by `sigmoid(gate)` (Qwen3.5, Qwen3-Next; a sigmoid whatever the config's
    /// `output_gate_type` says, BRIEF §6).
    SigmoidPerElement,
    /// A separate `g_proj` `[heads, hidden]` reads the attention block's normed input; each head's output is
    /// scaled by `sigmoid` of its one value (Spark-X2.5).
    SigmoidPerHead,
}

/// How the rotary pairs are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Pairs `(i, i + rotary_dim / 2)`: transformers' `rotate_half`, what every supported family uses.
    Neox,
    /// Pairs `(2i, 2i + 1)` (GPT-J / original Llama weights).
    Interleaved,
}

/// Multimodal RoPE sections (Qwen3.5's `mrope_section`). Text positions are the same on all three axes, so for
/// text-only decoding the sections reduce to plain RoPE; they are kept so an engine can refuse image inputs it
/// cannot position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Mrope {
    pub sections: Vec<u64>,
    pub interleaved: bool,
}

/// MoE routing: softmax over `num_experts` router logits, top `experts_per_token`, optionally renormalised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MoeRouting {
    pub num_experts: u32,
    pub experts_per_token: u32,
    /// Divide the chosen probabilities by their sum (`norm_topk_prob`).
    pub normalize_top_k: bool,
    /// A shared expert runs for every token, scaled by `sigmoid(shared_expert_gate(x))`.
    pub shared_expert: bool,
}

/// Storage of one linear module in the checkpoint, with the tensors its scales live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StoredFormat {
    /// `weight` `[out, in]` in this dtype.
    Dense { dtype: DType },
    /// `weight` e4m3 `[out, in]` + `weight_scale_inv` f32 `[ceil(out/b0), ceil(in/b1)]` (multiply).
    Fp8Block { block: [u32; 2] },
    /// `weight` e4m3 + scalar `weight_scale` (multiply) + scalar `input_scale` (modelopt).
    Fp8Tensor,
    /// `weight` u8 `[out, in/2]` (even element low nibble) + `weight_scale` e4m3 `[out, in/group]` +
    /// scalar `weight_scale_2` + scalar `input_scale` (modelopt NVFP4).
    Nvfp4 { group: u32 },
    /// GPTQ: `qweight` i32 `[in*bits/32, out]`, `qzeros`, `scales` `[in/group, out]`, `g_idx`.
    Gptq { bits: u32, group: u32 },
}

/// One linear module of the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LinearModule {
    /// The module name without `.weight` (`model.layers.3.mlp.down_proj`).
    pub module: String,
    pub out_features: u64,
    pub in_features: u64,
    pub bias: bool,
    pub format: StoredFormat,
}

/// Everything about the forward pass that is not a size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Runtime {
    /// Prefix of the decoder's tensors: `model`, or `model.language_model` for the multimodal Qwen3.5 builds.
    pub prefix: String,
    /// Full name of the token embedding (`model.embed_tokens.weight`, Spark's `model.embedding.weight`).
    pub embedding: String,
    pub activation: Activation,
    /// SwiGLU / GeGLU (`gate_proj`, `up_proj`, `down_proj`); every supported family is gated.
    pub mlp_gated: bool,
    pub norm: NormForm,
    /// `rms_norm_eps`.
    pub norm_eps: f64,
    /// Per-head RMSNorm of q and k before RoPE (same form and eps as the layer norms).
    pub qk_norm: bool,
    pub output_gate: OutputGate,
    /// Gemma's four norms per layer: the attention and MLP outputs are normed before the residual add
    /// (`post_attention_layernorm`, `post_feedforward_layernorm`) and the MLP input by `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    pub rope_style: RopeStyle,
    pub mrope: Option<Mrope>,
    /// The embedding output is multiplied by this (Gemma: `sqrt(hidden)`, rounded to the model dtype).
    pub embedding_scale: Option<f64>,
    /// Softmax scale of attention: `query_pre_attn_scalar^-0.5` (Gemma) or `head_dim^-0.5`.
    pub attn_scale: f64,
    /// `tanh` softcap of the attention logits, if any.
    pub attn_logit_softcap: Option<f64>,
    /// `tanh` softcap of the final logits, if any.
    pub final_logit_softcap: Option<f64>,
    pub moe: Option<MoeRouting>,
    /// Every linear module, in checkpoint order, with its stored format.
    pub linears: Vec<LinearModule>,
    /// Special token ids from `config.json` (the engine prefers `generation_config.json` when present).
    pub bos_token_id: Option<u64>,
    pub eos_token_ids: Vec<u64>,
}

/// Reads `hidden_act` (or Gemma's `hidden_activation`), defaulting to `default` when neither is present.
pub(crate) fn activation(text: &Obj<'_>, default: Activation) -> Result<Activation, ModelError> {
    let Some(f) = text
        .field("hidden_activation")
        .or_else(|| text.field("hidden_act"))
    else {
        return Ok(default);
    };
    match f.str()? {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu" => Ok(Activation::GeluErf),
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanh),
        _ => Err(f.invalid("one of silu, swish, gelu, gelu_pytorch_tanh, gelu_new, gelu_fast")),
    }
}

/// `rms_norm_eps`, which must be positive.
pub(crate) fn norm_eps(text: &Obj<'_>) -> Result<f64, ModelError> {
    let eps = text.f64_or("rms_norm_eps", 1e-6)?;
    if eps <= 0.0 {
        return Err(text.require("rms_norm_eps")?.invalid("a positive epsilon"));
    }
    Ok(eps)
}

/// An optional positive softcap (`null` and absent both mean none).
pub(crate) fn softcap(text: &Obj<'_>, key: &str) -> Result<Option<f64>, ModelError> {
    match text.field(key) {
        None => Ok(None),
        Some(f) => {
            let v = f.f64()?;
            if v <= 0.0 {
                return Err(f.invalid("a positive softcap or null"));
            }
            Ok(Some(v))
        }
    }
}

/// `eos_token_id` as one id or a list, and `bos_token_id`, read from `text` then from `root`.
pub(crate) fn special_tokens(
    root: &Obj<'_>,
    text: &Obj<'_>,
) -> Result<(Option<u64>, Vec<u64>), ModelError> {
    let pick = |key: &str| text.field(key).or_else(|| root.field(key));
    let bos = pick("bos_token_id").map(|f| f.u64()).transpose()?;
    let eos = match pick("eos_token_id") {
        None => Vec::new(),
        Some(f) => match f.items() {
            Ok(items) => items.iter().map(|i| i.u64()).collect::<Result<_, _>>()?,
            Err(_) => vec![f.u64()?],
        },
    };
    Ok((bos, eos))
}

/// `mrope_section` (with `mrope_interleaved`) from `rope_parameters` or the older `rope_scaling`, if any.
pub(crate) fn mrope(text: &Obj<'_>) -> Result<Option<Mrope>, ModelError> {
    for key in ["rope_parameters", "rope_scaling"] {
        let Some(rp) = text.opt_obj(key)? else {
            continue;
        };
        if let Some(f) = rp.field("mrope_section") {
            let sections = f
                .items()?
                .iter()
                .map(|i| i.u64())
                .collect::<Result<_, _>>()?;
            let interleaved = rp.bool_or("mrope_interleaved", false)?;
            return Ok(Some(Mrope {
                sections,
                interleaved,
            }));
        }
    }
    Ok(None)
}
