//! Plain dense decoders: Qwen3 (`Qwen3ForCausalLM`, q/k norms), Qwen2 (q/k/v biases) and Llama
//! (`LlamaForCausalLM`, `attention_bias` flag). Every layer is full attention unless the config turns on a sliding
//! window (`use_sliding_window` with `max_window_layers`, Qwen2/3's semantics) or lists `layer_types`.

use super::{
    attention, attention_block, gated_mlp, layer_index, layer_kinds, num_layers, ropes,
    sliding_window, tied, Architecture, AttnBlock, BuildCx,
};
use crate::model::error::ModelError;
use crate::model::inventory::{Inventory, Part};
use crate::model::quant::parse_quant;
use crate::model::{LayerKind, ModelSpec};

pub(crate) struct Dense;

impl Architecture for Dense {
    fn architectures(&self) -> &'static [&'static str] {
        &["Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3", "qwen2", "llama"]
    }

    fn build(&self, cx: &BuildCx<'_>) -> Result<ModelSpec, ModelError> {
        let text = cx.root.clone();
        let model_type = text.opt_str("model_type")?.unwrap_or("llama").to_string();
        let arch = super::architecture_name(&cx.root)?.unwrap_or_else(|| "LlamaForCausalLM".into());
        let n = num_layers(&text)?;
        let a = attention(&text)?;
        let use_sliding = text.bool_or("use_sliding_window", false)?;
        let max_window_layers = text.u64_or("max_window_layers", n)?;
        let layers = layer_kinds(
            &text,
            n,
            &[LayerKind::FullAttention, LayerKind::SlidingAttention],
            |i| {
                if use_sliding && i >= max_window_layers {
                    LayerKind::SlidingAttention
                } else {
                    LayerKind::FullAttention
                }
            },
        )?;
        let window = if layers.contains(&LayerKind::SlidingAttention) {
            sliding_window(&text, &layers)?
        } else {
            None
        };
        let inter = text.count("intermediate_size")?;
        let vocab = text.count("vocab_size")?;
        let tie = tied(cx, &text, false)?;
        // Qwen2 always biases q/k/v (never o); `attention_bias` (Llama, Qwen3) biases all four projections.
        let attention_bias = text.bool_or("attention_bias", false)?;
        let qkv_bias = model_type == "qwen2" || attention_bias;
        let block = AttnBlock {
            gated_q: false,
            qk_norm: model_type == "qwen3",
            qkv_bias,
            o_bias: attention_bias,
        };
        let q = parse_quant(&cx.root, &text, cx.hf_quant)?;

        let mut inv = Inventory::new(&q);
        inv.embedding("model.embed_tokens.weight", vocab, a.hidden, tie);
        for i in 0..n {
            let part = Part::Layer(layer_index(i));
            let p = format!("model.layers.{i}");
            inv.small(format!("{p}.input_layernorm.weight"), &[a.hidden], part);
            attention_block(&mut inv, &format!("{p}.self_attn"), &a, &block, part);
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
                embedding: "model.embed_tokens.weight".into(),
                default_activation: crate::model::Activation::Silu,
                norm: crate::model::NormForm::Weight,
                qk_norm: block.qk_norm,
                output_gate: crate::model::OutputGate::None,
                sandwich_norms: false,
                embedding_scale: None,
                moe: None,
            },
            std::mem::take(&mut inv.linears),
        )?;
        Ok(ModelSpec {
            id: cx.id.to_string(),
            architecture: arch,
            model_type,
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
