//! Every model card in `models/` parses, and its inventory adds up to the published checkpoint (BRIEF §3, seeds).

use std::path::{Path, PathBuf};

use planner::model::{
    parse_model, Access, DType, LayerKind, ModelCard, ModelSpec, Quantization, Role, SourceFile,
};

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
}

fn card(id: &str) -> ModelCard {
    let dir = models_dir().join(id);
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).ok().map(|text| SourceFile {
            path: format!("models/{id}/{name}"),
            text,
        })
    };
    ModelCard {
        id: id.to_string(),
        config: read("config.json").unwrap_or_else(|| panic!("models/{id}/config.json is missing")),
        quant_config: read("hf_quant_config.json"),
    }
}

fn spec(id: &str) -> ModelSpec {
    match parse_model(&card(id)) {
        Ok(s) => s,
        Err(e) => panic!("{id}: {e:?}"),
    }
}

fn gb(bytes: u64) -> f64 {
    bytes as f64 / 1e9
}

fn tensor<'a>(s: &'a ModelSpec, name: &str) -> &'a planner::model::TensorEntry {
    s.inventory
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{}: no tensor {name}", s.id))
}

#[test]
fn every_card_parses_and_its_inventory_is_consistent() {
    let mut ids: Vec<String> = std::fs::read_dir(models_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    assert!(
        ids.len() >= 8,
        "expected the eight cards of issue 2, found {ids:?}"
    );
    for id in &ids {
        let s = spec(id);
        assert!(s.total_params() > 0, "{id}");
        assert_eq!(
            s.total_bytes(),
            s.inventory.iter().map(|t| t.bytes).sum::<u64>(),
            "{id}"
        );
        let mut names: Vec<&str> = s.inventory.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "{id}: duplicate tensor names");
        for t in &s.inventory {
            if t.name.starts_with("model.visual.") {
                assert_eq!(t.access, Access::ConditionalImage, "{}", t.name);
                assert_eq!(t.role, Role::VisionTower, "{}", t.name);
            }
            if t.name.starts_with("mtp.") {
                assert_eq!(t.access, Access::ConditionalSpeculative, "{}", t.name);
            }
            if t.name.contains(".layers.")
                && !t.name.starts_with("mtp.")
                && !t.name.starts_with("model.visual.")
            {
                assert!(t.layer.is_some(), "{} has no layer", t.name);
            }
        }
    }
}

/// BRIEF §3 / seed 000 §4-§5: Qwen3.8-27B-FP8 is 30.87 GB, with a 2.543 GB bf16 embed_tokens and lm_head each,
/// a ~0.92 GB bf16 vision tower and a ~0.48 GB MTP head.
#[test]
fn qwen38_fp8_matches_the_published_checkpoint() {
    let s = spec("qwen3.8-27b-fp8");
    assert!(
        (gb(s.total_bytes()) - 30.87).abs() < 0.005,
        "total {} GB",
        gb(s.total_bytes())
    );
    let embed = tensor(&s, "model.language_model.embed_tokens.weight");
    let head = tensor(&s, "lm_head.weight");
    for t in [embed, head] {
        assert_eq!(t.shape, vec![248_320, 5120]);
        assert_eq!(t.dtype, DType::Bf16);
        assert!(
            (gb(t.bytes) - 2.543).abs() < 0.0005,
            "{} {}",
            t.name,
            gb(t.bytes)
        );
    }
    // Same shape and dtype, opposite decision: a gather of one 10 KiB row against a full read per token.
    assert_eq!(embed.access, Access::Gather { row_bytes: 10_240 });
    assert_eq!(head.access, Access::EveryToken);
    assert!(
        (gb(s.bytes_under("model.visual.")) - 0.922).abs() < 0.001,
        "{}",
        gb(s.bytes_under("model.visual."))
    );
    assert!(
        (gb(s.bytes_under("mtp.")) - 0.478).abs() < 0.001,
        "{}",
        gb(s.bytes_under("mtp."))
    );
    assert_eq!(s.quantization, Quantization::Fp8Block { block: [128, 128] });
    assert_eq!(s.layers.len(), 64);
    assert_eq!(
        s.layers
            .iter()
            .filter(|k| **k == LayerKind::FullAttention)
            .count(),
        16
    );
    assert_eq!(s.layers[3], LayerKind::FullAttention);
    assert_eq!(s.mtp_layers, 1);
    assert!(s.has_vision);

    // FP8 block layout: e4m3 weight [out, in] + f32 weight_scale_inv [ceil(out/128), ceil(in/128)].
    let p = "model.language_model.layers.0.linear_attn";
    let qkv = tensor(&s, &format!("{p}.in_proj_qkv.weight"));
    assert_eq!(
        (qkv.shape.clone(), qkv.dtype),
        (vec![10_240, 5120], DType::F8E4m3)
    );
    let scale = tensor(&s, &format!("{p}.in_proj_qkv.weight_scale_inv"));
    assert_eq!(
        (scale.shape.clone(), scale.dtype, scale.role),
        (vec![80, 40], DType::F32, Role::Scale)
    );
    // Kept bf16 through modules_to_not_convert; conv1d, A_log, norms are never quantized.
    for name in [
        "in_proj_b.weight",
        "in_proj_a.weight",
        "conv1d.weight",
        "A_log",
        "dt_bias",
        "norm.weight",
    ] {
        assert_eq!(
            tensor(&s, &format!("{p}.{name}")).dtype,
            DType::Bf16,
            "{name}"
        );
    }
    assert_eq!(
        tensor(&s, &format!("{p}.conv1d.weight")).shape,
        vec![10_240, 1, 4]
    );
    let q = tensor(&s, "model.language_model.layers.3.self_attn.q_proj.weight");
    assert_eq!(
        q.shape,
        vec![12_288, 5120],
        "q_proj carries the per-head output gate"
    );
    assert_eq!(
        tensor(&s, "model.language_model.layers.3.self_attn.o_proj.weight").shape,
        vec![5120, 6144]
    );
    assert_eq!(tensor(&s, "mtp.fc.weight").dtype, DType::Bf16);
    assert_eq!(
        tensor(&s, "mtp.layers.0.mlp.down_proj.weight").dtype,
        DType::F8E4m3
    );
    assert_eq!(
        tensor(&s, "model.visual.blocks.26.attn.qkv.weight").dtype,
        DType::Bf16
    );
}

/// BRIEF §3 / seed 000 §6: the modelopt NVFP4 build (a mix of FP8 and NVFP4, group 16) is 21.95 GB.
#[test]
fn qwen38_nvfp4_matches_the_published_checkpoint() {
    let s = spec("qwen3.8-27b-nvfp4");
    assert!(
        (gb(s.total_bytes()) - 21.95).abs() < 0.005,
        "total {} GB",
        gb(s.total_bytes())
    );
    match &s.quantization {
        Quantization::Nvfp4 {
            group_size,
            exclude_modules,
        } => {
            assert_eq!(*group_size, 16);
            assert!(exclude_modules.iter().any(|m| m == "lm_head"));
        }
        other => panic!("expected NVFP4, got {other:?}"),
    }
    let p = "model.language_model.layers.0.mlp.down_proj";
    let w = tensor(&s, &format!("{p}.weight"));
    assert_eq!(
        (w.shape.clone(), w.dtype, w.params),
        (vec![5120, 8704], DType::U8PackedE2m1, 5120 * 17_408)
    );
    assert_eq!(
        tensor(&s, &format!("{p}.weight_scale")).shape,
        vec![5120, 1088]
    );
    assert_eq!(
        tensor(&s, &format!("{p}.weight_scale")).dtype,
        DType::F8E4m3
    );
    assert_eq!(
        tensor(&s, &format!("{p}.weight_scale_2")).shape,
        Vec::<u64>::new()
    );
    assert_eq!(tensor(&s, &format!("{p}.input_scale")).dtype, DType::F32);
    // The GDN input projections stay FP8 (per-tensor scales in modelopt's layout).
    let qkv = "model.language_model.layers.0.linear_attn.in_proj_qkv";
    assert_eq!(tensor(&s, &format!("{qkv}.weight")).dtype, DType::F8E4m3);
    assert_eq!(
        tensor(&s, &format!("{qkv}.weight_scale")).shape,
        Vec::<u64>::new()
    );
    assert_eq!(tensor(&s, "lm_head.weight").dtype, DType::Bf16);
    assert_eq!(
        tensor(&s, "model.visual.merger.linear_fc2.weight").dtype,
        DType::Bf16
    );
    // Same vision tower as the FP8 build.
    assert_eq!(
        s.bytes_under("model.visual."),
        spec("qwen3.8-27b-fp8").bytes_under("model.visual.")
    );
}

/// BRIEF §3: Spark-X2.5-4B has exactly 4,112,079,360 parameters (bf16, tied embedding counted once).
#[test]
fn spark_4b_has_the_published_parameter_count() {
    let s = spec("spark-x2.5-4b");
    assert_eq!(s.total_params(), 4_112_079_360);
    assert_eq!(s.total_bytes(), 2 * 4_112_079_360);
    assert!(s.tie_word_embeddings);
    let e = tensor(&s, "model.embedding.weight");
    assert_eq!(
        (e.role, e.access),
        (Role::Embedding, Access::EveryToken),
        "tied: the embedding is also the head"
    );
    assert!(!s.inventory.iter().any(|t| t.name == "lm_head.weight"));
    assert_eq!(
        tensor(&s, "model.layers.0.self_attn.q_k_v_proj.weight").shape,
        vec![6144, 2560]
    );
    assert_eq!(
        tensor(&s, "model.layers.0.self_attn.g_proj.weight").shape,
        vec![16, 2560]
    );
    assert_eq!(
        s.layers
            .iter()
            .filter(|k| **k == LayerKind::SlidingAttention)
            .count(),
        27
    );
    assert_eq!(s.sliding_window, Some(512));
}

/// BRIEF §3: Spark-X2.5-1.7B (hidden 2048, 28 layers, 8/2 heads, fused q_k_v_proj [3072 x 2048], g_proj [8 x 2048]).
#[test]
fn spark_1_7b_geometry_and_per_type_rope() {
    let s = spec("spark-x2.5-1.7b");
    assert_eq!(
        tensor(&s, "model.layers.5.self_attn.q_k_v_proj.weight").shape,
        vec![3072, 2048]
    );
    assert_eq!(
        tensor(&s, "model.layers.5.self_attn.g_proj.weight").shape,
        vec![8, 2048]
    );
    // 131072*2048 + 28 * (3072*2048 + 8*2048 + 2048*2048 + 3*2048*6656 + 2*2048) + 2048
    assert_eq!(s.total_params(), 1_707_657_216);
    let full = s
        .rope
        .iter()
        .find(|r| r.layer_kind == LayerKind::FullAttention)
        .unwrap();
    let sliding = s
        .rope
        .iter()
        .find(|r| r.layer_kind == LayerKind::SlidingAttention)
        .unwrap();
    assert_eq!((full.theta, full.rotary_dims), (5e6, 64));
    assert_eq!((sliding.theta, sliding.rotary_dims), (1e4, 256));
}

/// The GPTQ symmetric 4-bit card for the Xeon W4A8 path: decoder linears in GPTQ layout, g_proj and the tied
/// embedding kept bf16.
#[test]
fn spark_1_7b_gptq_layout() {
    let s = spec("spark-x2.5-1.7b-gptq-int4");
    assert_eq!(
        s.quantization,
        Quantization::Gptq {
            bits: 4,
            group_size: 128,
            sym: true
        }
    );
    let p = "model.layers.0.mlp.down_proj";
    let q = tensor(&s, &format!("{p}.qweight"));
    assert_eq!(
        (q.shape.clone(), q.dtype, q.bytes),
        (vec![832, 2048], DType::I32PackedInt4, 6656 * 2048 / 2)
    );
    assert_eq!(tensor(&s, &format!("{p}.qzeros")).shape, vec![52, 256]);
    assert_eq!(tensor(&s, &format!("{p}.scales")).shape, vec![52, 2048]);
    assert_eq!(tensor(&s, &format!("{p}.scales")).dtype, DType::F16);
    assert_eq!(tensor(&s, &format!("{p}.g_idx")).shape, vec![6656]);
    assert_eq!(
        tensor(&s, "model.layers.0.self_attn.g_proj.weight").dtype,
        DType::Bf16
    );
    assert_eq!(tensor(&s, "model.embedding.weight").dtype, DType::Bf16);
    // Same logical matmul parameters as the bf16 card; scales and zeros come on top.
    let bf16 = spec("spark-x2.5-1.7b");
    assert!(s.total_params() > bf16.total_params());
    assert!(
        s.total_bytes() < bf16.total_bytes() / 2,
        "{} vs {}",
        s.total_bytes(),
        bf16.total_bytes()
    );
}

/// Gemma 3 1B: 999,885,952 parameters (the published count), 5 sliding : 1 global.
#[test]
fn gemma3_1b_parameter_count_and_layer_mix() {
    let s = spec("gemma-3-1b");
    assert_eq!(s.total_params(), 999_885_952);
    assert_eq!(
        s.layers
            .iter()
            .filter(|k| **k == LayerKind::FullAttention)
            .count(),
        4
    );
    assert_eq!(s.layers[5], LayerKind::FullAttention);
    assert_eq!(s.layers[4], LayerKind::SlidingAttention);
    let sliding = s
        .rope
        .iter()
        .find(|r| r.layer_kind == LayerKind::SlidingAttention)
        .unwrap();
    assert_eq!(sliding.theta, 1e4);
}

/// Qwen3-8B: 8,190,735,360 parameters (Qwen's model card: 8.2B), untied.
#[test]
fn qwen3_8b_parameter_count() {
    let s = spec("qwen3-8b");
    assert_eq!(s.total_params(), 8_190_735_360);
    assert_eq!(s.layers, vec![LayerKind::FullAttention; 36]);
}

/// Qwen3-Next-80B-A3B: ~80B total, ~3B active; routed experts are the bulk and are read 10/512 per token.
#[test]
fn qwen3_next_total_and_active_parameters() {
    let s = spec("qwen3-next-80b-a3b");
    // 151936*2048*2 (untied) + 36 GDN layers * 33,718,464 + 12 full layers * 27,263,488
    // + 48 * (router 512*2048 + 512 experts * 3*2048*512 + shared 3*2048*512 + gate 2048 + 2 norms) + final norm.
    assert_eq!(s.total_params(), 79_674_391_296);
    let moe = s.moe.unwrap();
    assert_eq!(
        (moe.num_experts, moe.experts_per_token, moe.shared_experts),
        (512, 10, 1)
    );
    let expert = tensor(&s, "model.layers.0.mlp.experts.511.down_proj.weight");
    assert_eq!(
        expert.access,
        Access::Routed {
            active: 10,
            total: 512
        }
    );
    assert_eq!(expert.role, Role::ExpertWeight);
    // Active parameters: everything read every token plus 10/512 of the experts, less the gathered embedding.
    let active: u64 = s
        .inventory
        .iter()
        .map(|t| match t.access {
            Access::EveryToken => t.params,
            Access::Routed { active, total } => t.params * u64::from(active) / u64::from(total),
            _ => 0,
        })
        .sum();
    let active = active as f64 / 1e9;
    assert!((2.5..4.0).contains(&active), "active {active}B");
}

/// What one decode step reads (BRIEF §2: the embedding is a gather of one row, the vision tower and the MTP head
/// are conditional): for Qwen3.8-27B-FP8 that is the total less 2.543 GB of embedding (plus one 10 KiB row), less
/// the vision tower, less the MTP head unless speculative decoding is on.
#[test]
fn bytes_read_per_token_follows_access_classes() {
    let s = spec("qwen3.8-27b-fp8");
    let embed = tensor(&s, "model.language_model.embed_tokens.weight").bytes;
    let vision = s.bytes_under("model.visual.");
    let mtp = s.bytes_under("mtp.");
    let plain = s.total_bytes() - embed + 10_240 - vision - mtp;
    assert_eq!(s.bytes_read_per_token(false, false), plain);
    assert_eq!(s.bytes_read_per_token(true, false), plain + mtp);
    assert_eq!(s.bytes_read_per_token(true, true), plain + mtp + vision);
    // Tied Spark: the single embedding tensor is the head and is read whole every token.
    let spark = spec("spark-x2.5-4b");
    assert_eq!(
        spark.bytes_read_per_token(false, false),
        spark.total_bytes()
    );
    // MoE: the routed experts count at 10/512.
    let next = spec("qwen3-next-80b-a3b");
    let experts: u64 = next
        .inventory
        .iter()
        .filter(|t| t.name.contains(".experts."))
        .map(|t| t.bytes)
        .sum();
    let read = next.bytes_read_per_token(false, false);
    let embed = tensor(&next, "model.embed_tokens.weight").bytes;
    let dense = next.total_bytes() - experts - embed + 2048 * 2;
    // Each of the 73,728 expert tensors rounds its share up, so allow one byte per tensor.
    assert!(
        read >= dense + experts * 10 / 512 && read <= dense + experts * 10 / 512 + 73_728,
        "{read}"
    );
}

fn inline(text: &str) -> ModelSpec {
    let card = ModelCard {
        id: "inline".into(),
        config: SourceFile {
            path: "inline/config.json".into(),
            text: text.into(),
        },
        quant_config: None,
    };
    parse_model(&card).unwrap_or_else(|e| panic!("{e:?}"))
}

/// Llama: `attention_bias` biases all four projections; tied embeddings leave no `lm_head`; without `head_dim` it is
/// `hidden / heads`; the top-level `rope_theta` applies.
#[test]
fn llama_variants_biases_and_tying() {
    let s = inline(
        r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
            "vocab_size": 1000, "max_position_embeddings": 4096, "attention_bias": true, "tie_word_embeddings": true,
            "rope_theta": 500000.0, "torch_dtype": "float16"}"#,
    );
    assert_eq!(s.head_dim, 64);
    assert_eq!(
        tensor(&s, "model.layers.1.self_attn.o_proj.bias").shape,
        vec![256]
    );
    assert_eq!(
        tensor(&s, "model.layers.1.self_attn.k_proj.bias").shape,
        vec![128]
    );
    assert_eq!(
        tensor(&s, "model.layers.1.self_attn.k_proj.weight").dtype,
        DType::F16
    );
    assert!(!s.inventory.iter().any(|t| t.name == "lm_head.weight"));
    assert_eq!(s.rope.len(), 1);
    assert_eq!((s.rope[0].theta, s.rope[0].rotary_dims), (500_000.0, 64));
    // 1000*256 + 2 * (256*(256+128+128) + 256 + 128 + 128 + 256*256 + 256 + 3*256*512 + 2*256) + 256
    assert_eq!(
        s.total_params(),
        256_000 + 2 * (131_072 + 512 + 65_536 + 256 + 393_216 + 512) + 256
    );
}

/// Qwen2 biases q/k/v but not o; `use_sliding_window` with `max_window_layers` makes the upper layers slide.
#[test]
fn qwen2_biases_and_sliding_layers() {
    let s = inline(
        r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 256,
            "vocab_size": 100, "max_position_embeddings": 4096, "use_sliding_window": true, "sliding_window": 64,
            "max_window_layers": 2, "torch_dtype": "bfloat16"}"#,
    );
    assert!(s
        .inventory
        .iter()
        .any(|t| t.name == "model.layers.0.self_attn.q_proj.bias"));
    assert!(!s
        .inventory
        .iter()
        .any(|t| t.name == "model.layers.0.self_attn.o_proj.bias"));
    use LayerKind::{FullAttention as F, SlidingAttention as S};
    assert_eq!(s.layers, vec![F, F, S, S]);
    assert_eq!(s.sliding_window, Some(64));
}

/// Qwen3-Next reads the older top-level RoPE fields: theta 1e7, partial 0.25 of head_dim 256.
#[test]
fn qwen3_next_top_level_rope() {
    let s = spec("qwen3-next-80b-a3b");
    assert_eq!(s.rope.len(), 1);
    assert_eq!(
        (s.rope[0].layer_kind, s.rope[0].theta, s.rope[0].rotary_dims),
        (LayerKind::FullAttention, 1e7, 64)
    );
}

/// `full_attention_interval` alone (no `layer_types`) gives the same 3 GDN : 1 full layout.
#[test]
fn full_attention_interval_without_layer_types() {
    let text = std::fs::read_to_string(models_dir().join("qwen3.8-27b-fp8/config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut v = v;
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("layer_types");
    let s = inline(&serde_json::to_string_pretty(&v).unwrap());
    assert_eq!(s.layers, spec("qwen3.8-27b-fp8").layers);
    assert_eq!(s.total_bytes(), spec("qwen3.8-27b-fp8").total_bytes());
}

/// modelopt metadata inside config.json only (no hf_quant_config.json): a single `quant_algo` with `ignore` globs.
/// FP8 block scales round up: a [48, 5120] projection gets a [1, 40] scale grid.
#[test]
fn modelopt_globs_and_fp8_ragged_blocks() {
    let text = std::fs::read_to_string(models_dir().join("qwen3.8-27b-fp8/config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["quantization_config"] = serde_json::json!({
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "ignore": ["lm_head", "model.visual*", "mtp.*", "*.linear_attn.in_proj_qkv"]
    });
    let s = inline(&v.to_string());
    let qkv = tensor(
        &s,
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
    );
    assert_eq!(qkv.dtype, DType::Bf16, "excluded by a glob");
    let z = tensor(
        &s,
        "model.language_model.layers.0.linear_attn.in_proj_z.weight",
    );
    assert_eq!(
        (z.dtype, z.shape.clone()),
        (DType::U8PackedE2m1, vec![6144, 2560])
    );
    assert_eq!(
        tensor(&s, "mtp.layers.0.mlp.up_proj.weight").dtype,
        DType::Bf16
    );
    assert_eq!(
        s.quantization,
        Quantization::Nvfp4 {
            group_size: 16,
            exclude_modules: [
                "lm_head",
                "model.visual*",
                "mtp.*",
                "*.linear_attn.in_proj_qkv"
            ]
            .map(String::from)
            .to_vec()
        }
    );

    v["quantization_config"] = serde_json::json!({
        "quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]
    });
    let s = inline(&v.to_string());
    let b = tensor(
        &s,
        "model.language_model.layers.0.linear_attn.in_proj_b.weight_scale_inv",
    );
    assert_eq!(b.shape, vec![1, 40]);
    // Without `model.visual` in the list the vision linears are FP8 too; their biases stay bf16.
    assert_eq!(
        tensor(&s, "model.visual.blocks.0.attn.qkv.weight").dtype,
        DType::F8E4m3
    );
    assert_eq!(
        tensor(&s, "model.visual.blocks.0.attn.qkv.bias").dtype,
        DType::Bf16
    );
}
