//! Spark-X2.5 (`Spark2_5ForCausalLM`, `model_type` `spark2_5`): a sliding/full attention hybrid (3 sliding layers of
//! window 512 then 1 full, repeating) with per-layer-type RoPE and a head-wise sigmoid output gate (BRIEF §3, seed
//! 002).
//!
//! The checkpoint stores QKV pre-fused as `self_attn.q_k_v_proj` (`(heads + 2 * kv_heads) * head_dim` rows, split
//! at load time), the gate as `self_attn.g_proj` (`[heads, hidden]`), the output projection as `self_attn.out_proj`,
//! and the tied embedding as `model.embedding`. There are no biases and no q/k norms: with two RMSNorm weights per
//! layer and a final norm, the 4B geometry adds up to exactly the published 4,112,079,360 parameters.

use super::{
    attention, gated_mlp, layer_index, layer_kinds, num_layers, ropes, sliding_window, tied,
    Architecture, BuildCx,
};
use crate::model::error::ModelError;
use crate::model::inventory::{Inventory, Part};
use crate::model::quant::parse_quant;
use crate::model::{LayerKind, ModelSpec};

pub(crate) struct Spark2_5;

impl Architecture for Spark2_5 {
    fn architectures(&self) -> &'static [&'static str] {
        &["Spark2_5ForCausalLM"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["spark2_5"]
    }

    fn build(&self, cx: &BuildCx<'_>) -> Result<ModelSpec, ModelError> {
        let text = cx.root.clone();
        let n = num_layers(&text)?;
        let a = attention(&text)?;
        // Without a `layer_types` map every layer is charged as full attention: the seed's budget code found that
        // assuming the window everywhere under-charges, and a budget that is too small is a stall, not a slowdown.
        let layers = layer_kinds(
            &text,
            n,
            &[LayerKind::FullAttention, LayerKind::SlidingAttention],
            |_| LayerKind::FullAttention,
        )?;
        let window = sliding_window(&text, &layers)?;
        let inter = text.count("intermediate_size")?;
        let vocab = text.count("vocab_size")?;
        let tie = tied(cx, &text, true)?;
        let q = parse_quant(&cx.root, &text, cx.hf_quant)?;

        let mut inv = Inventory::new(&q);
        inv.embedding("model.embedding.weight", vocab, a.hidden, tie);
        let qkv = a
            .heads
            .saturating_add(a.kv_heads.saturating_mul(2))
            .saturating_mul(a.head_dim);
        for i in 0..n {
            let part = Part::Layer(layer_index(i));
            let p = format!("model.layers.{i}");
            inv.small(format!("{p}.input_layernorm.weight"), &[a.hidden], part);
            inv.linear(
                &format!("{p}.self_attn.q_k_v_proj"),
                qkv,
                a.hidden,
                false,
                part,
            );
            inv.linear(
                &format!("{p}.self_attn.g_proj"),
                a.heads,
                a.hidden,
                false,
                part,
            );
            inv.linear(
                &format!("{p}.self_attn.out_proj"),
                a.hidden,
                a.heads.saturating_mul(a.head_dim),
                false,
                part,
            );
            inv.small(
                format!("{p}.post_attention_layernorm.weight"),
                &[a.hidden],
                part,
            );
            gated_mlp(&mut inv, &format!("{p}.mlp"), a.hidden, inter, part);
        }
        inv.small("model.norm.weight", &[a.hidden], Part::Top);
        if !tie {
            inv.linear("lm_head", vocab, a.hidden, false, Part::LmHead);
        }
        let runtime = super::runtime(
            cx,
            &text,
            a.head_dim,
            super::RuntimeFacts {
                prefix: "model",
                embedding: "model.embedding.weight".into(),
                default_activation: crate::model::Activation::GeluErf,
                norm: crate::model::NormForm::Weight,
                qk_norm: false,
                output_gate: crate::model::OutputGate::SigmoidPerHead,
                sandwich_norms: false,
                embedding_scale: None,
                moe: None,
            },
            std::mem::take(&mut inv.linears),
        )?;
        Ok(ModelSpec {
            id: cx.id.to_string(),
            architecture: super::architecture_name(&cx.root)?
                .unwrap_or_else(|| "Spark2_5ForCausalLM".into()),
            model_type: "spark2_5".into(),
            hidden_size: a.hidden,
            vocab_size: vocab,
            num_q_heads: a.heads,
            num_kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            sliding_window: window,
            max_position_embeddings: text.count("max_position_embeddings")?,
            tie_word_embeddings: tie,
            quantization: q.public.clone(),
            inventory: inv.entries,
            rope: ropes(&text, &layers, a.head_dim, None)?,
            layers,
            gdn: None,
            moe: None,
            has_vision: false,
            mtp_layers: 0,
            runtime,
        })
    }
}
