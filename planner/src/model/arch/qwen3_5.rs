//! Qwen3.5 (`Qwen3_5ForConditionalGeneration`, `model_type` `qwen3_5`): the hybrid of gated DeltaNet
//! (`linear_attention`) and gated full-attention layers, with a vision tower and an MTP head (BRIEF §3).
//!
//! Names follow transformers 5's `modeling_qwen3_5.py`: the text model under `model.language_model.*` (under
//! `model.*` for a text-only `qwen3_5_text` checkpoint), the GDN input projections split into `in_proj_qkv`,
//! `in_proj_z`, `in_proj_b`, `in_proj_a` (Qwen3-Next fuses them as `in_proj_qkvz` / `in_proj_ba`), the Qwen3-VL-style
//! vision tower under `model.visual.*` and the MTP head under `mtp.*` (vLLM's `qwen3_5_mtp` layout: `fc` from
//! `[embedding; hidden]` to hidden, two pre-fc norms, full-attention decoder layers, a final norm).

use super::{
    attention, attention_block, every_nth_full, gated_mlp, gdn, gdn_dims, gdn_tail, layer_index,
    layer_kinds, num_layers, ropes, tied, Architecture, Attn, BuildCx, QWEN_GATED_ATTN,
};
use crate::model::config::Obj;
use crate::model::error::ModelError;
use crate::model::inventory::{Inventory, Part};
use crate::model::quant::parse_quant;
use crate::model::{GdnGeometry, LayerKind, ModelSpec};

pub(crate) struct Qwen3_5;

impl Architecture for Qwen3_5 {
    fn architectures(&self) -> &'static [&'static str] {
        &["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3_5", "qwen3_5_text"]
    }

    fn build(&self, cx: &BuildCx<'_>) -> Result<ModelSpec, ModelError> {
        let nested = cx.root.opt_obj("text_config")?;
        let text = nested.clone().unwrap_or_else(|| cx.root.clone());
        let prefix = if nested.is_some() {
            "model.language_model"
        } else {
            "model"
        };
        let n = num_layers(&text)?;
        let a = attention(&text)?;
        let interval = text.count_or("full_attention_interval", 4)?;
        let layers = layer_kinds(
            &text,
            n,
            &[LayerKind::FullAttention, LayerKind::LinearAttention],
            every_nth_full(interval, LayerKind::LinearAttention),
        )?;
        let g = gdn(&text)?;
        let inter = text.count("intermediate_size")?;
        let vocab = text.count("vocab_size")?;
        let tie = tied(cx, &text, false)?;
        let mtp_layers = match text.field("mtp_num_hidden_layers") {
            Some(f) => f.u64()?,
            None => cx.root.u64_or("mtp_num_hidden_layers", 0)?,
        };
        if mtp_layers > 64 {
            return Err(text
                .require("mtp_num_hidden_layers")?
                .invalid("at most 64 MTP layers"));
        }
        let q = parse_quant(&cx.root, &text, cx.hf_quant)?;
        let vision = cx.root.opt_obj("vision_config")?;

        let mut inv = Inventory::new(&q);
        inv.embedding(
            format!("{prefix}.embed_tokens.weight"),
            vocab,
            a.hidden,
            tie,
        );
        for (i, kind) in layers.iter().enumerate() {
            let part = Part::Layer(layer_index(i as u64));
            let p = format!("{prefix}.layers.{i}");
            decoder_layer(&mut inv, &p, *kind, &a, &g, inter, part);
        }
        inv.small(format!("{prefix}.norm.weight"), &[a.hidden], Part::Top);
        if !tie {
            inv.linear("lm_head", vocab, a.hidden, false, Part::LmHead);
        }
        if let Some(v) = &vision {
            vision_tower(&mut inv, v, a.hidden)?;
        }
        if mtp_layers > 0 {
            let part = Part::Mtp;
            inv.linear("mtp.fc", a.hidden, a.hidden.saturating_mul(2), false, part);
            inv.small("mtp.pre_fc_norm_embedding.weight", &[a.hidden], part);
            inv.small("mtp.pre_fc_norm_hidden.weight", &[a.hidden], part);
            for j in 0..mtp_layers {
                let p = format!("mtp.layers.{j}");
                decoder_layer(&mut inv, &p, LayerKind::FullAttention, &a, &g, inter, part);
            }
            inv.small("mtp.norm.weight", &[a.hidden], part);
        }
        let model_type = cx
            .root
            .opt_str("model_type")?
            .unwrap_or("qwen3_5")
            .to_string();
        let runtime = super::runtime(
            cx,
            &text,
            a.head_dim,
            super::RuntimeFacts {
                prefix,
                embedding: format!("{prefix}.embed_tokens.weight"),
                default_activation: crate::model::Activation::Silu,
                norm: crate::model::NormForm::OnePlusWeight,
                qk_norm: true,
                output_gate: crate::model::OutputGate::SigmoidPerElement,
                sandwich_norms: false,
                embedding_scale: None,
                moe: None,
            },
            std::mem::take(&mut inv.linears),
        )?;
        Ok(ModelSpec {
            id: cx.id.to_string(),
            architecture: super::architecture_name(&cx.root)?
                .unwrap_or_else(|| "Qwen3_5ForConditionalGeneration".into()),
            model_type,
            hidden_size: a.hidden,
            vocab_size: vocab,
            num_q_heads: a.heads,
            num_kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            sliding_window: None,
            max_position_embeddings: text.count("max_position_embeddings")?,
            tie_word_embeddings: tie,
            quantization: q.public.clone(),
            inventory: inv.entries,
            rope: ropes(&text, &layers, a.head_dim, None)?,
            layers,
            gdn: Some(g),
            moe: None,
            has_vision: vision.is_some(),
            mtp_layers: u32::try_from(mtp_layers).unwrap_or(u32::MAX),
            runtime,
        })
    }
}

/// One decoder layer (also the MTP head's layers): pre-norm, GDN or gated attention, post-norm, SwiGLU MLP.
fn decoder_layer(
    inv: &mut Inventory<'_>,
    p: &str,
    kind: LayerKind,
    a: &Attn,
    g: &GdnGeometry,
    inter: u64,
    part: Part,
) {
    inv.small(format!("{p}.input_layernorm.weight"), &[a.hidden], part);
    match kind {
        LayerKind::LinearAttention => {
            let la = format!("{p}.linear_attn");
            let (_, value_dim, conv_dim) = gdn_dims(g);
            inv.linear(
                &format!("{la}.in_proj_qkv"),
                conv_dim,
                a.hidden,
                false,
                part,
            );
            inv.linear(&format!("{la}.in_proj_z"), value_dim, a.hidden, false, part);
            inv.linear(
                &format!("{la}.in_proj_b"),
                g.num_value_heads,
                a.hidden,
                false,
                part,
            );
            inv.linear(
                &format!("{la}.in_proj_a"),
                g.num_value_heads,
                a.hidden,
                false,
                part,
            );
            gdn_tail(inv, &la, g, a.hidden, part);
        }
        _ => {
            attention_block(inv, &format!("{p}.self_attn"), a, &QWEN_GATED_ATTN, part);
        }
    }
    inv.small(
        format!("{p}.post_attention_layernorm.weight"),
        &[a.hidden],
        part,
    );
    gated_mlp(inv, &format!("{p}.mlp"), a.hidden, inter, part);
}

/// The Qwen3-VL-style vision tower (without deepstack mergers, which Qwen3.5 drops): a Conv3d patch embedding,
/// learned position embeddings, `depth` pre-LayerNorm blocks with biased linears, and a merger that folds
/// `spatial_merge_size^2` patches into one text-width token.
fn vision_tower(inv: &mut Inventory<'_>, v: &Obj<'_>, text_hidden: u64) -> Result<(), ModelError> {
    let part = Part::Vision;
    let depth = v.count("depth")?;
    if depth > crate::model::config::MAX_LAYERS {
        return Err(v.require("depth")?.invalid("at most 4096 blocks"));
    }
    let h = v.count("hidden_size")?;
    let heads = v.count("num_heads")?;
    if h % heads != 0 {
        let f = v.require("num_heads")?;
        return Err(f.inconsistent(format!(
            "{heads} heads do not divide the vision hidden_size {h}"
        )));
    }
    let inter = v.count("intermediate_size")?;
    let in_ch = v.count_or("in_channels", 3)?;
    let patch = v.count("patch_size")?;
    let temporal = v.count_or("temporal_patch_size", 2)?;
    let merge = v.count_or("spatial_merge_size", 2)?;
    let out = v.count_or("out_hidden_size", text_hidden)?;
    if out != text_hidden {
        let f = v.require("out_hidden_size")?;
        return Err(f.inconsistent(format!(
            "is {out} but the text model's hidden_size is {text_hidden}"
        )));
    }
    let positions = v.count("num_position_embeddings")?;
    let vp = "model.visual";
    inv.small(
        format!("{vp}.patch_embed.proj.weight"),
        &[h, in_ch, temporal, patch, patch],
        part,
    );
    inv.small(format!("{vp}.patch_embed.proj.bias"), &[h], part);
    inv.small(format!("{vp}.pos_embed.weight"), &[positions, h], part);
    for j in 0..depth {
        let b = format!("{vp}.blocks.{j}");
        for norm in ["norm1", "norm2"] {
            inv.small(format!("{b}.{norm}.weight"), &[h], part);
            inv.small(format!("{b}.{norm}.bias"), &[h], part);
        }
        inv.linear(&format!("{b}.attn.qkv"), h.saturating_mul(3), h, true, part);
        inv.linear(&format!("{b}.attn.proj"), h, h, true, part);
        inv.linear(&format!("{b}.mlp.linear_fc1"), inter, h, true, part);
        inv.linear(&format!("{b}.mlp.linear_fc2"), h, inter, true, part);
    }
    let merged = h.saturating_mul(merge.saturating_mul(merge));
    inv.small(format!("{vp}.merger.norm.weight"), &[h], part);
    inv.small(format!("{vp}.merger.norm.bias"), &[h], part);
    inv.linear(
        &format!("{vp}.merger.linear_fc1"),
        merged,
        merged,
        true,
        part,
    );
    inv.linear(&format!("{vp}.merger.linear_fc2"), out, merged, true, part);
    Ok(())
}
