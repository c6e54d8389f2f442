//! Qwen3-Next (`Qwen3NextForCausalLM`, `model_type` `qwen3_next`): the GDN/attention hybrid of Qwen3.5 with a
//! sparse MoE in every layer (BRIEF §3: 48 layers, 3 GDN : 1 full, 512 experts, 10 routed + 1 shared). Planner
//! only: it is the classic host-offload case, with most bytes in routed experts that a token reads 10/512 of.
//!
//! Names follow transformers' `modeling_qwen3_next.py`: fused `in_proj_qkvz` / `in_proj_ba`, `mlp.gate` (router),
//! `mlp.experts.{e}.{gate,up,down}_proj`, `mlp.shared_expert.*` and the scalar `mlp.shared_expert_gate`.

use super::{
    attention, attention_block, every_nth_full, gated_mlp, gdn, gdn_dims, gdn_tail, layer_index,
    layer_kinds, num_layers, ropes, tied, Architecture, BuildCx, QWEN_GATED_ATTN,
};
use crate::model::config::{MAX_EXPERTS, MAX_EXPERT_INSTANCES};
use crate::model::error::ModelError;
use crate::model::inventory::{Inventory, Part};
use crate::model::quant::parse_quant;
use crate::model::{LayerKind, ModelSpec, MoeGeometry};

pub(crate) struct Qwen3Next;

impl Architecture for Qwen3Next {
    fn architectures(&self) -> &'static [&'static str] {
        &["Qwen3NextForCausalLM"]
    }

    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3_next"]
    }

    fn build(&self, cx: &BuildCx<'_>) -> Result<ModelSpec, ModelError> {
        let text = cx.root.clone();
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
        let vocab = text.count("vocab_size")?;
        let tie = tied(cx, &text, false)?;
        let experts = text.count("num_experts")?;
        if experts > MAX_EXPERTS {
            return Err(text
                .require("num_experts")?
                .invalid(&format!("at most {MAX_EXPERTS} experts")));
        }
        // One inventory entry per expert projection: bound layers x experts so a mistyped config cannot ask for
        // hundreds of millions of entries (Qwen3-Next itself is 48 x 512 = 24,576).
        if n.saturating_mul(experts) > MAX_EXPERT_INSTANCES {
            let f = text.require("num_experts")?;
            return Err(f.invalid(&format!(
                "num_hidden_layers x num_experts at most {MAX_EXPERT_INSTANCES}"
            )));
        }
        let active = text.count("num_experts_per_tok")?;
        if active > experts {
            let f = text.require("num_experts_per_tok")?;
            return Err(f.inconsistent(format!(
                "routes to {active} experts but num_experts is {experts}"
            )));
        }
        let expert_inter = text.count("moe_intermediate_size")?;
        let shared_inter = text.u64_or("shared_expert_intermediate_size", 0)?;
        let dense_inter = text.count_or("intermediate_size", expert_inter)?;
        let sparse_step = text.count_or("decoder_sparse_step", 1)?;
        let mlp_only: Vec<u64> = match text.field("mlp_only_layers") {
            Some(f) => f
                .items()?
                .iter()
                .map(|i| i.u64())
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let q = parse_quant(&cx.root, &text, cx.hf_quant)?;
        let (experts32, active32) = (layer_index(experts), layer_index(active));

        let mut inv = Inventory::new(&q);
        inv.embedding("model.embed_tokens.weight", vocab, a.hidden, tie);
        for (i, kind) in layers.iter().enumerate() {
            let li = layer_index(i as u64);
            let part = Part::Layer(li);
            let p = format!("model.layers.{i}");
            inv.small(format!("{p}.input_layernorm.weight"), &[a.hidden], part);
            match kind {
                LayerKind::LinearAttention => {
                    let la = format!("{p}.linear_attn");
                    let (_, value_dim, conv_dim) = gdn_dims(&g);
                    let qkvz = conv_dim.saturating_add(value_dim);
                    inv.linear(&format!("{la}.in_proj_qkvz"), qkvz, a.hidden, false, part);
                    inv.linear(
                        &format!("{la}.in_proj_ba"),
                        g.num_value_heads.saturating_mul(2),
                        a.hidden,
                        false,
                        part,
                    );
                    gdn_tail(&mut inv, &la, &g, a.hidden, part);
                }
                _ => {
                    attention_block(
                        &mut inv,
                        &format!("{p}.self_attn"),
                        &a,
                        &QWEN_GATED_ATTN,
                        part,
                    );
                }
            }
            inv.small(
                format!("{p}.post_attention_layernorm.weight"),
                &[a.hidden],
                part,
            );
            let m = format!("{p}.mlp");
            let sparse =
                !mlp_only.contains(&(i as u64)) && (i as u64 + 1).is_multiple_of(sparse_step);
            if sparse {
                inv.linear(&format!("{m}.gate"), experts, a.hidden, false, part);
                let ep = Part::Expert {
                    layer: li,
                    active: active32,
                    total: experts32,
                };
                for e in 0..experts {
                    gated_mlp(
                        &mut inv,
                        &format!("{m}.experts.{e}"),
                        a.hidden,
                        expert_inter,
                        ep,
                    );
                }
                if shared_inter > 0 {
                    gated_mlp(
                        &mut inv,
                        &format!("{m}.shared_expert"),
                        a.hidden,
                        shared_inter,
                        part,
                    );
                    inv.linear(&format!("{m}.shared_expert_gate"), 1, a.hidden, false, part);
                }
            } else {
                gated_mlp(&mut inv, &m, a.hidden, dense_inter, part);
            }
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
                norm: crate::model::NormForm::OnePlusWeight,
                qk_norm: true,
                output_gate: crate::model::OutputGate::SigmoidPerElement,
                sandwich_norms: false,
                embedding_scale: None,
                moe: Some(crate::model::MoeRouting {
                    num_experts: experts32,
                    experts_per_token: active32,
                    normalize_top_k: text.bool_or("norm_topk_prob", true)?,
                    shared_expert: shared_inter > 0,
                }),
            },
            std::mem::take(&mut inv.linears),
        )?;
        Ok(ModelSpec {
            id: cx.id.to_string(),
            architecture: super::architecture_name(&cx.root)?
                .unwrap_or_else(|| "Qwen3NextForCausalLM".into()),
            model_type: "qwen3_next".into(),
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
            moe: Some(MoeGeometry {
                num_experts: experts32,
                experts_per_token: active32,
                shared_experts: u32::from(shared_inter > 0),
                expert_intermediate: expert_inter,
            }),
            has_vision: false,
            mtp_layers: 0,
            runtime,
        })
    }
}
