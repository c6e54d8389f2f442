//! One file per architecture family. Each family implements [`Architecture`]: which `architectures` /
//! `model_type` strings it accepts, and how its config turns into a [`ModelSpec`] (geometry, layer kinds, RoPE,
//! and the inventory under the checkpoint's real tensor names). Adding a family is one file plus one line in
//! [`FAMILIES`]. The shared readers below keep every family's checks (head divisibility, layer_types length, ...)
//! identical.

mod dense;
mod gemma3;
mod qwen3_5;
mod qwen3_next;
mod spark2_5;

use super::config::{Doc, Obj, MAX_LAYERS};
use super::error::ModelError;
use super::inventory::{Inventory, Part};
use super::{
    Activation, GdnGeometry, LayerKind, ModelSpec, MoeRouting, NormForm, OutputGate, RopeSpec,
    RopeStyle, Runtime,
};

/// What a family gets to build from: the card id, the top-level config object and the modelopt metadata file.
pub(crate) struct BuildCx<'a> {
    pub(crate) id: &'a str,
    pub(crate) root: Obj<'a>,
    pub(crate) hf_quant: Option<&'a Doc<'a>>,
}

/// Per-architecture knowledge, as pure functions over the parsed config.
pub(crate) trait Architecture: Sync {
    /// Values of `architectures[0]` this family reads.
    fn architectures(&self) -> &'static [&'static str];
    /// Values of `model_type` this family reads.
    fn model_types(&self) -> &'static [&'static str];
    fn build(&self, cx: &BuildCx<'_>) -> Result<ModelSpec, ModelError>;
}

/// Every supported family, tried in order.
pub(crate) static FAMILIES: &[&dyn Architecture] = &[
    &qwen3_5::Qwen3_5,
    &qwen3_next::Qwen3Next,
    &spark2_5::Spark2_5,
    &gemma3::Gemma3,
    &dense::Dense,
];

/// Attention geometry shared by every family.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attn {
    pub(crate) hidden: u64,
    pub(crate) heads: u64,
    pub(crate) kv_heads: u64,
    pub(crate) head_dim: u64,
}

/// Reads `hidden_size`, `num_attention_heads`, `num_key_value_heads` (default: the head count, i.e. MHA) and
/// `head_dim` (default `hidden / heads`, which must then divide), and checks that KV heads divide the query heads.
pub(crate) fn attention(text: &Obj<'_>) -> Result<Attn, ModelError> {
    let hidden = text.count("hidden_size")?;
    let heads = text.count("num_attention_heads")?;
    let kv_heads = text.count_or("num_key_value_heads", heads)?;
    if heads % kv_heads != 0 {
        let f = text.require("num_key_value_heads")?;
        return Err(f.inconsistent(format!(
            "{kv_heads} KV heads do not divide {heads} attention heads"
        )));
    }
    let head_dim = match text.opt_count("head_dim")? {
        Some(d) => d,
        None => {
            if hidden % heads != 0 {
                let f = text.require("num_attention_heads")?;
                return Err(f.inconsistent(format!(
                    "{heads} heads do not divide hidden_size {hidden} and no head_dim is given"
                )));
            }
            hidden / heads
        }
    };
    Ok(Attn {
        hidden,
        heads,
        kv_heads,
        head_dim,
    })
}

/// `num_hidden_layers`, bounded so the inventory cannot be asked for an absurd allocation.
pub(crate) fn num_layers(text: &Obj<'_>) -> Result<u64, ModelError> {
    let n = text.count("num_hidden_layers")?;
    if n > MAX_LAYERS {
        return Err(text
            .require("num_hidden_layers")?
            .invalid(&format!("at most {MAX_LAYERS} layers")));
    }
    Ok(n)
}

/// The interleaving the hybrids use when a config has no `layer_types`: every `period`-th layer (1-based) is full
/// attention, the rest are `other` (Qwen3.5 / Qwen3-Next `full_attention_interval`, Gemma 3's sliding pattern).
pub(crate) fn every_nth_full(period: u64, other: LayerKind) -> impl Fn(u64) -> LayerKind {
    move |i| {
        if (i + 1).is_multiple_of(period) {
            LayerKind::FullAttention
        } else {
            other
        }
    }
}

/// The kind of every layer: from `layer_types` when present (its length must equal `num_hidden_layers`, each entry
/// one of `allowed`), else from `fallback(i)`.
pub(crate) fn layer_kinds(
    text: &Obj<'_>,
    n: u64,
    allowed: &[LayerKind],
    fallback: impl Fn(u64) -> LayerKind,
) -> Result<Vec<LayerKind>, ModelError> {
    let Some(f) = text.field("layer_types") else {
        return Ok((0..n).map(fallback).collect());
    };
    let items = f.items()?;
    if items.len() as u64 != n {
        return Err(f.inconsistent(format!(
            "has {} entries but num_hidden_layers is {n}",
            items.len()
        )));
    }
    let names: Vec<&str> = allowed.iter().map(|k| kind_name(*k)).collect();
    items
        .iter()
        .map(|item| {
            let s = item.str()?;
            let kind = match s {
                "full_attention" | "attention" => LayerKind::FullAttention,
                "sliding_attention" => LayerKind::SlidingAttention,
                "linear_attention" => LayerKind::LinearAttention,
                _ => return Err(item.invalid(&format!("one of {}", names.join(", ")))),
            };
            if allowed.contains(&kind) {
                Ok(kind)
            } else {
                Err(item.invalid(&format!(
                    "one of {} for this architecture",
                    names.join(", ")
                )))
            }
        })
        .collect()
}

pub(crate) fn kind_name(k: LayerKind) -> &'static str {
    match k {
        LayerKind::FullAttention => "full_attention",
        LayerKind::SlidingAttention => "sliding_attention",
        LayerKind::LinearAttention => "linear_attention",
    }
}

/// The RoPE of the attention layers of `kind`. Reads `rope_parameters` (transformers 5: either one set for all
/// layers or one per layer type, keyed `full_attention` / `sliding_attention`), falling back to the older top-level
/// `rope_theta` / `partial_rotary_factor` (and `local_theta_key`, e.g. Gemma 3's `rope_local_base_freq`, for sliding
/// layers). `rotary_dims = floor(head_dim * partial_rotary_factor)`, as transformers computes it.
pub(crate) fn rope(
    text: &Obj<'_>,
    kind: LayerKind,
    head_dim: u64,
    local_theta_key: Option<&str>,
) -> Result<RopeSpec, ModelError> {
    let top_partial = text.f64_or("partial_rotary_factor", 1.0)?;
    let (theta_field, partial_field, theta, partial) = match text.opt_obj("rope_parameters")? {
        Some(rp) => {
            let per_type = rp.has("full_attention") || rp.has("sliding_attention");
            let params = if per_type {
                rp.require(kind_name(kind))?.obj()?
            } else {
                rp
            };
            let theta_f = params.require("rope_theta")?;
            let theta = theta_f.f64()?;
            let pf = params.field("partial_rotary_factor");
            let partial = match &pf {
                Some(f) => f.f64()?,
                None => top_partial,
            };
            (Some(theta_f), pf, theta, partial)
        }
        None => {
            let key = match (kind, local_theta_key) {
                (LayerKind::SlidingAttention, Some(k)) => k,
                _ => "rope_theta",
            };
            let theta_f = text.field(key);
            let theta = match &theta_f {
                Some(f) => f.f64()?,
                None => 10_000.0,
            };
            (
                theta_f,
                text.field("partial_rotary_factor"),
                theta,
                top_partial,
            )
        }
    };
    if theta <= 0.0 {
        if let Some(f) = theta_field {
            return Err(f.invalid("a positive rope_theta"));
        }
    }
    if !(partial > 0.0 && partial <= 1.0) {
        if let Some(f) = partial_field {
            return Err(f.invalid("a partial_rotary_factor in (0, 1]"));
        }
    }
    let rotary_dims = (head_dim as f64 * partial).floor() as u64;
    Ok(RopeSpec {
        layer_kind: kind,
        theta,
        rotary_dims,
    })
}

/// One RoPE spec per attention layer kind present (linear-attention layers carry no RoPE).
pub(crate) fn ropes(
    text: &Obj<'_>,
    layers: &[LayerKind],
    head_dim: u64,
    local_theta_key: Option<&str>,
) -> Result<Vec<RopeSpec>, ModelError> {
    let mut out = Vec::new();
    for kind in [LayerKind::FullAttention, LayerKind::SlidingAttention] {
        if layers.contains(&kind) {
            out.push(rope(text, kind, head_dim, local_theta_key)?);
        }
    }
    Ok(out)
}

/// Gated DeltaNet geometry (`linear_*` fields), with the value heads a multiple of the key heads (value head j reads
/// key head `j / (Hv / Hk)`).
pub(crate) fn gdn(text: &Obj<'_>) -> Result<GdnGeometry, ModelError> {
    let num_key_heads = text.count("linear_num_key_heads")?;
    let num_value_heads = text.count("linear_num_value_heads")?;
    if num_value_heads % num_key_heads != 0 {
        let f = text.require("linear_num_value_heads")?;
        return Err(f.inconsistent(format!(
            "{num_value_heads} value heads are not a multiple of {num_key_heads} key heads"
        )));
    }
    Ok(GdnGeometry {
        num_key_heads,
        num_value_heads,
        key_head_dim: text.count("linear_key_head_dim")?,
        value_head_dim: text.count("linear_value_head_dim")?,
        conv_kernel: text.count_or("linear_conv_kernel_dim", 4)?,
    })
}

/// The `sliding_window`, required when any layer slides.
pub(crate) fn sliding_window(
    text: &Obj<'_>,
    layers: &[LayerKind],
) -> Result<Option<u64>, ModelError> {
    let w = text.opt_count("sliding_window")?;
    if w.is_none() && layers.contains(&LayerKind::SlidingAttention) {
        text.require("sliding_window")?;
    }
    Ok(w)
}

/// Reads `tie_word_embeddings` from the text config, then the top level, else `default`.
pub(crate) fn tied(cx: &BuildCx<'_>, text: &Obj<'_>, default: bool) -> Result<bool, ModelError> {
    match text.field("tie_word_embeddings") {
        Some(f) => f.bool(),
        None => cx.root.bool_or("tie_word_embeddings", default),
    }
}

/// The first entry of `architectures`, if any.
pub(crate) fn architecture_name(root: &Obj<'_>) -> Result<Option<String>, ModelError> {
    match root.field("architectures") {
        Some(f) => {
            let items = f.items()?;
            match items.first() {
                Some(first) => Ok(Some(first.str()?.to_string())),
                None => Ok(None),
            }
        }
        None => Ok(None),
    }
}

/// A softmax-attention block: q/k/v/o projections (q twice as wide when it carries a per-head output gate, as
/// Qwen3.5 / Qwen3-Next do), optional q/k RMSNorms of `head_dim`, optional biases (Qwen2 biases q/k/v only;
/// Llama's `attention_bias` covers o_proj too).
pub(crate) struct AttnBlock {
    pub(crate) gated_q: bool,
    pub(crate) qk_norm: bool,
    pub(crate) qkv_bias: bool,
    pub(crate) o_bias: bool,
}

/// The full-attention block of the Qwen3.5 / Qwen3-Next hybrids: q_proj with a per-head output gate (2x width),
/// q_norm / k_norm, no biases.
pub(crate) const QWEN_GATED_ATTN: AttnBlock = AttnBlock {
    gated_q: true,
    qk_norm: true,
    qkv_bias: false,
    o_bias: false,
};

/// Channels of a gated DeltaNet layer: `(key_dim, value_dim, conv_dim)` where the causal conv runs over q|k|v.
pub(crate) fn gdn_dims(g: &GdnGeometry) -> (u64, u64, u64) {
    let key_dim = g.num_key_heads.saturating_mul(g.key_head_dim);
    let value_dim = g.num_value_heads.saturating_mul(g.value_head_dim);
    (
        key_dim,
        value_dim,
        key_dim.saturating_mul(2).saturating_add(value_dim),
    )
}

/// The tensors every gated DeltaNet layer has after its input projections (which differ by family: Qwen3.5 keeps
/// q|k|v, z, b, a apart, Qwen3-Next fuses them): the depthwise conv, the gate parameters, the gated norm and the
/// output projection.
pub(crate) fn gdn_tail(
    inv: &mut Inventory<'_>,
    la: &str,
    g: &GdnGeometry,
    hidden: u64,
    part: Part,
) {
    let (_, value_dim, conv_dim) = gdn_dims(g);
    inv.small(
        format!("{la}.conv1d.weight"),
        &[conv_dim, 1, g.conv_kernel],
        part,
    );
    inv.small(format!("{la}.dt_bias"), &[g.num_value_heads], part);
    inv.small(format!("{la}.A_log"), &[g.num_value_heads], part);
    inv.small(format!("{la}.norm.weight"), &[g.value_head_dim], part);
    inv.linear(&format!("{la}.out_proj"), hidden, value_dim, false, part);
}

pub(crate) fn attention_block(
    inv: &mut Inventory<'_>,
    prefix: &str,
    a: &Attn,
    b: &AttnBlock,
    part: Part,
) {
    let q_out = a
        .heads
        .saturating_mul(a.head_dim)
        .saturating_mul(if b.gated_q { 2 } else { 1 });
    let kv_out = a.kv_heads.saturating_mul(a.head_dim);
    inv.linear(
        &format!("{prefix}.q_proj"),
        q_out,
        a.hidden,
        b.qkv_bias,
        part,
    );
    inv.linear(
        &format!("{prefix}.k_proj"),
        kv_out,
        a.hidden,
        b.qkv_bias,
        part,
    );
    inv.linear(
        &format!("{prefix}.v_proj"),
        kv_out,
        a.hidden,
        b.qkv_bias,
        part,
    );
    inv.linear(
        &format!("{prefix}.o_proj"),
        a.hidden,
        a.heads.saturating_mul(a.head_dim),
        b.o_bias,
        part,
    );
    if b.qk_norm {
        inv.small(format!("{prefix}.q_norm.weight"), &[a.head_dim], part);
        inv.small(format!("{prefix}.k_norm.weight"), &[a.head_dim], part);
    }
}

/// A gated MLP (SwiGLU / GeGLU): gate and up `hidden -> inter`, down `inter -> hidden`.
pub(crate) fn gated_mlp(
    inv: &mut Inventory<'_>,
    prefix: &str,
    hidden: u64,
    inter: u64,
    part: Part,
) {
    inv.linear(&format!("{prefix}.gate_proj"), inter, hidden, false, part);
    inv.linear(&format!("{prefix}.up_proj"), inter, hidden, false, part);
    inv.linear(&format!("{prefix}.down_proj"), hidden, inter, false, part);
}

/// Layer index as stored in [`super::TensorEntry::layer`]; `num_layers` bounds it far below `u32::MAX`.
pub(crate) fn layer_index(i: u64) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// The parts of a [`crate::model::Runtime`] that differ by family; [`runtime`] reads the rest from the config.
pub(crate) struct RuntimeFacts<'s> {
    pub(crate) prefix: &'s str,
    pub(crate) embedding: String,
    pub(crate) default_activation: Activation,
    pub(crate) norm: NormForm,
    pub(crate) qk_norm: bool,
    pub(crate) output_gate: OutputGate,
    pub(crate) sandwich_norms: bool,
    pub(crate) embedding_scale: Option<f64>,
    pub(crate) moe: Option<MoeRouting>,
}

/// Builds the runtime facts of a family from its config (`text`: where the geometry lives) and its inventory.
pub(crate) fn runtime(
    cx: &BuildCx<'_>,
    text: &Obj<'_>,
    head_dim: u64,
    facts: RuntimeFacts<'_>,
    linears: Vec<crate::model::LinearModule>,
) -> Result<Runtime, ModelError> {
    use crate::model::runtime as rt;
    let attn_scale = match text.field("query_pre_attn_scalar") {
        Some(f) => {
            let v = f.f64()?;
            if v <= 0.0 {
                return Err(f.invalid("a positive query_pre_attn_scalar"));
            }
            v.powf(-0.5)
        }
        None => (head_dim as f64).powf(-0.5),
    };
    let (bos_token_id, eos_token_ids) = rt::special_tokens(&cx.root, text)?;
    Ok(Runtime {
        prefix: facts.prefix.to_string(),
        embedding: facts.embedding,
        activation: rt::activation(text, facts.default_activation)?,
        mlp_gated: true,
        norm: facts.norm,
        norm_eps: rt::norm_eps(text)?,
        qk_norm: facts.qk_norm,
        output_gate: facts.output_gate,
        sandwich_norms: facts.sandwich_norms,
        rope_style: RopeStyle::Neox,
        mrope: rt::mrope(text)?,
        embedding_scale: facts.embedding_scale,
        attn_scale,
        attn_logit_softcap: rt::softcap(text, "attn_logit_softcapping")?,
        final_logit_softcap: rt::softcap(text, "final_logit_softcapping")?,
        moe: facts.moe,
        linears,
        bos_token_id,
        eos_token_ids,
    })
}
