//! The runtime facts each card's parse carries for the engine (issue: one parse for planning and running): each
//! assertion names the config key or the reference behaviour it comes from.

mod common;

use planner::model::{parse_model, Activation, DType, NormForm, OutputGate, StoredFormat};

fn spec(id: &str) -> planner::model::ModelSpec {
    parse_model(&common::card(id)).unwrap_or_else(|e| panic!("{id}: {e:?}"))
}

#[test]
fn gemma3_uses_tanh_gelu_one_plus_norms_sandwich_and_query_pre_attn_scalar() {
    let s = spec("gemma-3-1b");
    let r = &s.runtime;
    assert_eq!(r.activation, Activation::GeluTanh); // hidden_activation: gelu_pytorch_tanh
    assert_eq!(r.norm, NormForm::OnePlusWeight);
    assert!(r.qk_norm && r.sandwich_norms);
    assert_eq!(r.output_gate, OutputGate::None);
    assert_eq!(r.attn_scale, 256f64.powf(-0.5)); // query_pre_attn_scalar: 256
    assert_eq!(r.embedding_scale, Some(1152f64.sqrt()));
    assert_eq!(r.attn_logit_softcap, None); // null in the config
    assert_eq!(r.final_logit_softcap, None);
}

#[test]
fn qwen3_8_is_a_gated_hybrid_with_sigmoid_gates_and_fp8_linears() {
    let s = spec("qwen3.8-27b-fp8");
    let r = &s.runtime;
    assert_eq!(r.prefix, "model.language_model");
    assert_eq!(r.embedding, "model.language_model.embed_tokens.weight");
    assert_eq!(r.activation, Activation::Silu);
    assert_eq!(r.norm, NormForm::OnePlusWeight);
    assert_eq!(r.output_gate, OutputGate::SigmoidPerElement);
    assert!(r.mrope.is_some(), "Qwen3.5 configs carry mrope_section");
    let down = r
        .linears
        .iter()
        .find(|l| l.module == "model.language_model.layers.0.mlp.down_proj")
        .unwrap();
    assert_eq!(down.format, StoredFormat::Fp8Block { block: [128, 128] });
    assert_eq!((down.out_features, down.in_features), (5120, 17408));
    let head = r.linears.iter().find(|l| l.module == "lm_head").unwrap();
    assert_eq!(head.format, StoredFormat::Dense { dtype: DType::Bf16 });
}

#[test]
fn the_nvfp4_build_mixes_nvfp4_and_per_tensor_fp8() {
    let s = spec("qwen3.8-27b-nvfp4");
    let formats: std::collections::BTreeSet<String> = s
        .runtime
        .linears
        .iter()
        .map(|l| format!("{:?}", l.format))
        .collect();
    assert!(
        formats.iter().any(|f| f.starts_with("Nvfp4")),
        "{formats:?}"
    );
    assert!(formats.contains("Fp8Tensor"), "{formats:?}");
}

#[test]
fn spark_has_erf_gelu_plain_norms_and_a_per_head_gate() {
    let s = spec("spark-x2.5-1.7b");
    let r = &s.runtime;
    assert_eq!(r.activation, Activation::GeluErf); // hidden_act: gelu
    assert_eq!(r.norm, NormForm::Weight);
    assert!(!r.qk_norm);
    assert_eq!(r.output_gate, OutputGate::SigmoidPerHead);
    assert_eq!(r.embedding, "model.embedding.weight");
    assert_eq!(r.attn_scale, 256f64.powf(-0.5));
    let g = spec("spark-x2.5-1.7b-gptq-int4");
    assert!(g
        .runtime
        .linears
        .iter()
        .any(|l| matches!(l.format, StoredFormat::Gptq { bits: 4, .. })));
}

#[test]
fn qwen3_dense_and_next_carry_their_norms_and_routing() {
    let d = spec("qwen3-8b");
    assert!(d.runtime.qk_norm);
    assert_eq!(d.runtime.norm, NormForm::Weight);
    assert_eq!(d.runtime.eos_token_ids, vec![151645]);
    let n = spec("qwen3-next-80b-a3b");
    let moe = n.runtime.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (512, 10));
    assert!(moe.normalize_top_k && moe.shared_expert);
}
