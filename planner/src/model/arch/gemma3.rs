//! Gemma 3 text models (`Gemma3ForCausalLM`, `model_type` `gemma3_text`): 5 sliding layers then 1 global, repeating
//! (`sliding_window_pattern` 6, or an explicit `layer_types`), local RoPE theta 1e4 (`rope_local_base_freq`) and
//! global 1e6, q/k norms and four RMSNorms per layer, tied embeddings (BRIEF §3). The 1B geometry adds up to the
//! published 999,885,952 parameters.

use super::{
    attention, attention_block, every_nth_full, gated_mlp, layer_index, layer_kinds, num_layers,
    ropes, sliding_window, tied, Architecture, AttnBlock, BuildCx,
};
use crate::model::error::ModelError;
use crate::model::inventory::{Inventory, Part};
use crate::model::quant::parse_quant;
use crate::model::{LayerKind, ModelSpec};

pub(crate) struct Gemma3;

impl Architecture for Gemma3 {
    fn architectures(&self) -> &'static [&'static str] {
        &["Gemma3ForCausalLM"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["gemma3_text"]
    }

    fn build(&self, cx: &BuildCx<'_>) -> Result<ModelSpec, ModelError> {
        let text = cx.root.clone();
        let n = num_layers(&text)?;
        let a = attention(&text)?;
        let pattern = text.count_or("sliding_window_pattern", 6)?;
        let layers = layer_kinds(
            &text,
            n,
            &[LayerKind::FullAttention, LayerKind::SlidingAttention],
            every_nth_full(pattern, LayerKind::SlidingAttention),
        )?;
        let window = sliding_window(&text, &layers)?;
        let inter = text.count("intermediate_size")?;
        let vocab = text.count("vocab_size")?;
        let tie = tied(cx, &text, true)?;
        let bias = text.bool_or("attention_bias", false)?;
        let q = parse_quant(&cx.root, &text, cx.hf_quant)?;

        let mut inv = Inventory::new(&q);
        inv.embedding("model.embed_tokens.weight", vocab, a.hidden, tie);
        for i in 0..n {
            let part = Part::Layer(layer_index(i));
            let p = format!("model.layers.{i}");
            inv.small(format!("{p}.input_layernorm.weight"), &[a.hidden], part);
            let block = AttnBlock {
                gated_q: false,
                qk_norm: true,
                qkv_bias: bias,
                o_bias: bias,
            };
            attention_block(&mut inv, &format!("{p}.self_attn"), &a, &block, part);
            inv.small(
                format!("{p}.post_attention_layernorm.weight"),
                &[a.hidden],
                part,
            );
            inv.small(
                format!("{p}.pre_feedforward_layernorm.weight"),
                &[a.hidden],
                part,
            );
            gated_mlp(&mut inv, &format!("{p}.mlp"), a.hidden, inter, part);
            inv.small(
                format!("{p}.post_feedforward_layernorm.weight"),
                &[a.hidden],
                part,
            );
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
                embedding: "model.embed_tokens.weight".into(),
                default_activation: crate::model::Activation::GeluTanh,
                norm: crate::model::NormForm::OnePlusWeight,
                qk_norm: true,
                output_gate: crate::model::OutputGate::None,
                sandwich_norms: true,
                // Gemma scales the embedding by sqrt(hidden) computed in the model dtype.
                embedding_scale: Some((a.hidden as f64).sqrt()),
                moe: None,
            },
            std::mem::take(&mut inv.linears),
        )?;
        Ok(ModelSpec {
            id: cx.id.to_string(),
            architecture: super::architecture_name(&cx.root)?
                .unwrap_or_else(|| "Gemma3ForCausalLM".into()),
            model_type: "gemma3_text".into(),
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
            rope: ropes(&text, &layers, a.head_dim, Some("rope_local_base_freq"))?,
            layers,
            gdn: None,
            moe: None,
            has_vision: false,
            mtp_layers: 0,
            runtime,
        })
    }
}
