//! Property tests of the model side: the parser never panics on any input, and for random but valid geometries
//! the inventory and the cache budget keep their invariants.

use miette::{Diagnostic, NarratableReportHandler};
use planner::model::{
    cache_budget, decode_flops_per_token, parse_model, prefill_flops, CacheWorkload, LayerKind,
    ModelCard, ModelSpec, RopeTables, SlidingAccounting, SourceFile,
};
use proptest::prelude::*;

fn card(text: String) -> ModelCard {
    ModelCard {
        id: "prop".into(),
        config: SourceFile {
            path: "prop/config.json".into(),
            text,
        },
        quant_config: None,
    }
}

const SEED_CARDS: [&str; 4] = [
    include_str!("../../models/spark-x2.5-1.7b/config.json"),
    include_str!("../../models/qwen3.8-27b-fp8/config.json"),
    include_str!("../../models/spark-x2.5-1.7b-gptq-int4/config.json"),
    include_str!("../../models/qwen3-next-80b-a3b/config.json"),
];

/// A Spark-like (sliding/full) config with the given geometry.
fn spark_config(
    hidden: u64,
    layers: u64,
    kv: u64,
    group: u64,
    head_dim: u64,
    inter: u64,
    window: u64,
) -> String {
    let heads = kv * group;
    let types: Vec<String> = (0..layers)
        .map(|i| {
            if (i + 1) % 4 == 0 {
                "\"full_attention\""
            } else {
                "\"sliding_attention\""
            }
            .to_string()
        })
        .collect();
    format!(
        r#"{{"architectures": ["Spark2_5ForCausalLM"], "model_type": "spark2_5", "hidden_size": {hidden},
  "num_hidden_layers": {layers}, "num_attention_heads": {heads}, "num_key_value_heads": {kv},
  "head_dim": {head_dim}, "intermediate_size": {inter}, "vocab_size": 1000, "sliding_window": {window},
  "max_position_embeddings": 65536, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "layer_types": [{}],
  "rope_parameters": {{"full_attention": {{"rope_theta": 5000000.0, "partial_rotary_factor": 0.25}},
                      "sliding_attention": {{"rope_theta": 10000.0}}}}}}"#,
        types.join(", ")
    )
}

/// A Qwen3.5-like (GDN/full) config with the given geometry.
#[allow(clippy::too_many_arguments)] // One argument per generated dimension reads clearer than a struct here.
fn qwen_config(
    hidden: u64,
    groups: u64,
    kv: u64,
    q_group: u64,
    hk: u64,
    v_group: u64,
    dk: u64,
    mtp: u64,
) -> String {
    let layers = groups * 4;
    format!(
        r#"{{"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
  "text_config": {{"hidden_size": {hidden}, "num_hidden_layers": {layers}, "num_attention_heads": {},
  "num_key_value_heads": {kv}, "head_dim": 64, "intermediate_size": {}, "vocab_size": 512,
  "full_attention_interval": 4, "linear_num_key_heads": {hk}, "linear_num_value_heads": {},
  "linear_key_head_dim": {dk}, "linear_value_head_dim": {dk}, "linear_conv_kernel_dim": 4,
  "mtp_num_hidden_layers": {mtp}, "dtype": "bfloat16", "max_position_embeddings": 262144,
  "rope_parameters": {{"rope_theta": 10000000, "partial_rotary_factor": 0.25}}}},
  "quantization_config": {{"quant_method": "fp8", "weight_block_size": [128, 128],
                          "modules_to_not_convert": ["lm_head"]}}}}"#,
        kv * q_group,
        hidden * 3,
        hk * v_group
    )
}

fn workload(len: u64, seqs: u64, acc: SlidingAccounting) -> CacheWorkload {
    CacheWorkload {
        max_model_len: len,
        max_num_seqs: seqs,
        kv_bytes_per_elem: 2,
        headroom: 1.25,
        sliding_accounting: acc,
        rope_tables: RopeTables::CosSinCache,
    }
}

fn check_invariants(
    s: &ModelSpec,
    len: u64,
    seqs: u64,
    acc: SlidingAccounting,
) -> Result<(), TestCaseError> {
    prop_assert!(s.total_params() > 0);
    prop_assert_eq!(
        s.total_bytes(),
        s.inventory.iter().map(|t| t.bytes).sum::<u64>()
    );
    let b = cache_budget(s, &workload(len, seqs, acc));
    let longer = cache_budget(s, &workload(len + 1 + len / 3, seqs, acc));
    prop_assert!(
        longer.total_bytes >= b.total_bytes,
        "cache must not shrink with a longer max_model_len"
    );
    prop_assert!(longer.rope_table_bytes >= b.rope_table_bytes);
    prop_assert!(b.bytes_per_token_hybrid <= b.bytes_per_token_flat);
    if s.gdn.is_none() {
        // Without recurrent state the per-layer-type figure can only be smaller than the layer-blind one.
        prop_assert!(
            b.total_bytes <= b.flat_total_bytes,
            "{} > {}",
            b.total_bytes,
            b.flat_total_bytes
        );
    }
    let per_kind_layers: u64 = b.per_kind.iter().map(|k| k.layers).sum();
    prop_assert_eq!(per_kind_layers, s.layers.len() as u64);
    prop_assert!(decode_flops_per_token(s, len + 1) >= decode_flops_per_token(s, len));
    prop_assert!(prefill_flops(s, len + 1) > prefill_flops(s, len));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = parse_model(&card(text));
    }

    #[test]
    fn arbitrary_json_shaped_text_never_panics(text in r#"[{}\[\]":,0-9a-z_ .eE+\-]{0,120}"#) {
        let _ = parse_model(&card(text));
    }

    #[test]
    fn mutated_real_cards_never_panic(which in 0usize..4, at in any::<prop::sample::Index>(), cut in 0usize..40,
                                     insert in r#"[{}\[\]":,0-9a-z\-]{0,6}"#) {
        let base = SEED_CARDS[which];
        let mut pos = at.index(base.len());
        while !base.is_char_boundary(pos) { pos -= 1; }
        let mut end = (pos + cut).min(base.len());
        while !base.is_char_boundary(end) { end -= 1; }
        let text = format!("{}{}{}", &base[..pos], insert, &base[end..]);
        if let Err(e) = parse_model(&card(text.clone())) {
            // Every error renders, names the file, and its label lies inside the text.
            let mut out = String::new();
            prop_assert!(NarratableReportHandler::new().render_report(&mut out, &e).is_ok());
            prop_assert!(out.contains("prop/config.json"), "{}", out);
            for label in e.labels().into_iter().flatten() {
                prop_assert!(label.offset() + label.len() <= text.len());
            }
        }
    }

    #[test]
    fn spark_like_geometries_keep_invariants(
        hidden in 1u64..512, layers in 1u64..12, kv in 1u64..4, group in 1u64..4,
        head_dim in prop::sample::select(vec![32u64, 64, 128]), inter in 1u64..1024, window in 2u64..300,
        len in 1u64..5000, seqs in 1u64..4, paged in any::<bool>(),
    ) {
        let s = parse_model(&card(spark_config(hidden, layers, kv, group, head_dim, inter, window)))
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert_eq!(s.layers.len() as u64, layers);
        let acc = if paged { SlidingAccounting::Paged { block_tokens: 16 } } else { SlidingAccounting::Ring };
        check_invariants(&s, len, seqs, acc)?;
    }

    #[test]
    fn qwen_like_geometries_keep_invariants(
        hidden in 64u64..600, groups in 1u64..3, kv in 1u64..3, q_group in 1u64..3, hk in 1u64..3,
        v_group in 1u64..4, dk in prop::sample::select(vec![16u64, 32, 64]), mtp in 0u64..2,
        len in 1u64..5000, seqs in 1u64..3,
    ) {
        let s = parse_model(&card(qwen_config(hidden, groups, kv, q_group, hk, v_group, dk, mtp)))
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert_eq!(s.layers.iter().filter(|k| **k == LayerKind::FullAttention).count() as u64, groups);
        check_invariants(&s, len, seqs, SlidingAccounting::Ring)?;
        // State is per sequence and does not depend on context.
        let a = cache_budget(&s, &workload(len, seqs, SlidingAccounting::Ring));
        let b = cache_budget(&s, &workload(len * 2, seqs, SlidingAccounting::Ring));
        prop_assert_eq!(a.state_bytes_per_seq, b.state_bytes_per_seq);
    }
}
