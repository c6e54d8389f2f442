//! Bad model cards get a clear error: the right kind, and a rendered report that names the file, the line of the
//! offending key or value, and what was expected. Never a panic.

use std::path::Path;

use miette::{Diagnostic, NarratableReportHandler};
use planner::model::{parse_model, ModelCard, ModelError, SourceFile};

fn card_text(id: &str, name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(id)
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

fn parse(text: &str) -> Result<planner::model::ModelSpec, ModelError> {
    let card = ModelCard {
        id: "test".into(),
        config: SourceFile {
            path: "models/test/config.json".into(),
            text: text.to_string(),
        },
        quant_config: None,
    };
    parse_model(&card)
}

fn render(e: &dyn Diagnostic) -> String {
    let mut out = String::new();
    NarratableReportHandler::new()
        .render_report(&mut out, e)
        .unwrap();
    out
}

/// 1-based line of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in the text"));
    text[..at].matches('\n').count() + 1
}

/// Replaces exactly one occurrence, so a test cannot silently mutate nothing.
fn mutate(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` must occur once");
    text.replacen(from, to, 1)
}

/// Asserts the report names the file and points at `line`, and returns it for further checks.
fn assert_report(e: &ModelError, file: &str, line: usize) -> String {
    let r = render(e);
    assert!(r.contains(file), "report does not name {file}:\n{r}");
    let at = format!("label at line {line},");
    let starting = format!("label starting at line {line},");
    assert!(
        r.contains(&at) || r.contains(&starting),
        "report does not point at line {line}:\n{r}"
    );
    r
}

#[test]
fn malformed_json_points_at_serde_position() {
    let good = card_text("spark-x2.5-1.7b", "config.json");
    let bad = mutate(&good, "\"hidden_size\": 2048,", "\"hidden_size\": 2048");
    let e = parse(&bad).unwrap_err();
    assert!(matches!(e, ModelError::Syntax { .. }), "{e:?}");
    // serde_json notices the missing comma at the next key, one line below.
    let r = assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "\"initializer_range\""),
    );
    assert!(r.contains("expected `,`"), "{r}");
}

#[test]
fn truncated_and_empty_files_are_syntax_errors() {
    for text in ["", "{", "{\"model_type\": ", "[1, 2", "nul"] {
        let e = parse(text).unwrap_err();
        assert!(matches!(e, ModelError::Syntax { .. }), "{text:?}: {e:?}");
        let r = render(&e);
        assert!(r.contains("models/test/config.json"), "{r}");
    }
}

#[test]
fn a_top_level_array_is_the_wrong_type() {
    let e = parse("[1, 2, 3]").unwrap_err();
    assert!(matches!(e, ModelError::WrongType { .. }), "{e:?}");
}

#[test]
fn unknown_architecture_names_the_supported_ones() {
    let good = card_text("qwen3-8b", "config.json");
    let bad = mutate(
        &mutate(&good, "Qwen3ForCausalLM", "MambaForCausalLM"),
        "\"qwen3\"",
        "\"mamba\"",
    );
    let e = parse(&bad).unwrap_err();
    match &e {
        ModelError::Unsupported {
            found, supported, ..
        } => {
            assert_eq!(found, "MambaForCausalLM");
            assert!(
                supported.contains("Qwen3_5ForConditionalGeneration")
                    && supported.contains("Spark2_5ForCausalLM")
            );
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let r = assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "MambaForCausalLM"),
    );
    assert!(r.contains("supported architectures: "), "{r}");
}

#[test]
fn known_model_type_rescues_an_unlisted_architecture_class() {
    let good = card_text("qwen3-8b", "config.json");
    let renamed = mutate(&good, "Qwen3ForCausalLM", "Qwen3ForSequenceClassification");
    assert_eq!(
        parse(&renamed).unwrap().total_params(),
        parse(&good).unwrap().total_params()
    );
}

#[test]
fn layer_types_length_mismatch_names_the_field() {
    let good = card_text("qwen3.8-27b-fp8", "config.json");
    let bad = mutate(
        &good,
        "\"num_hidden_layers\": 64",
        "\"num_hidden_layers\": 60",
    );
    let e = parse(&bad).unwrap_err();
    match &e {
        ModelError::Inconsistent { field, reason, .. } => {
            assert_eq!(field, "text_config.layer_types");
            assert!(
                reason.contains("64 entries") && reason.contains("60"),
                "{reason}"
            );
        }
        other => panic!("expected Inconsistent, got {other:?}"),
    }
    assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "\"layer_types\""),
    );
}

#[test]
fn kv_heads_that_do_not_divide_the_heads() {
    let good = card_text("spark-x2.5-4b", "config.json");
    let bad = mutate(
        &good,
        "\"num_key_value_heads\": 4",
        "\"num_key_value_heads\": 3",
    );
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::Inconsistent { field, .. } if field == "num_key_value_heads"),
        "{e:?}"
    );
    let r = assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "\"num_key_value_heads\": 3"),
    );
    assert!(r.contains("do not divide"), "{r}");
}

#[test]
fn gdn_value_heads_not_a_multiple_of_key_heads() {
    let good = card_text("qwen3.8-27b-fp8", "config.json");
    let bad = mutate(
        &good,
        "\"linear_num_value_heads\": 48",
        "\"linear_num_value_heads\": 40",
    );
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::Inconsistent { field, .. } if field == "text_config.linear_num_value_heads"),
        "{e:?}"
    );
    assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "\"linear_num_value_heads\""),
    );
}

#[test]
fn zero_negative_and_fractional_sizes() {
    let good = card_text("gemma-3-1b", "config.json");
    for (to, expected) in [
        ("0", "a positive integer"),
        ("-1152", "a non-negative integer"),
        ("11.5", "a whole number"),
    ] {
        let bad = mutate(
            &good,
            "\"hidden_size\": 1152",
            &format!("\"hidden_size\": {to}"),
        );
        let e = parse(&bad).unwrap_err();
        assert!(
            matches!(&e, ModelError::InvalidValue { field, .. } if field == "hidden_size"),
            "{to}: {e:?}"
        );
        let r = assert_report(
            &e,
            "models/test/config.json",
            line_of(&bad, "\"hidden_size\""),
        );
        assert!(r.contains(expected), "{r}");
    }
}

#[test]
fn wrong_types_say_what_was_expected() {
    let good = card_text("gemma-3-1b", "config.json");
    let bad = mutate(
        &good,
        "\"vocab_size\": 262144",
        "\"vocab_size\": \"262144\"",
    );
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::WrongType { field, .. } if field == "vocab_size"),
        "{e:?}"
    );
    let r = assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "\"vocab_size\""),
    );
    assert!(
        r.contains("expected a non-negative integer, found a string"),
        "{r}"
    );

    let good = card_text("qwen3-8b", "config.json");
    let bad = mutate(
        &good,
        "\"tie_word_embeddings\": false",
        "\"tie_word_embeddings\": \"no\"",
    );
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::WrongType { field, .. } if field == "tie_word_embeddings"),
        "{e:?}"
    );
    let r = assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "\"tie_word_embeddings\""),
    );
    assert!(r.contains("expected true or false, found a string"), "{r}");
}

#[test]
fn a_missing_required_field_is_named() {
    let good = card_text("qwen3-8b", "config.json");
    let bad = mutate(&good, "\"vocab_size\": 151936", "\"vocab\": 151936");
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::MissingField { field, .. } if field == "vocab_size"),
        "{e:?}"
    );
    let r = assert_report(&e, "models/test/config.json", 1);
    assert!(r.contains("vocab_size"), "{r}");
}

#[test]
fn unknown_layer_type_and_sliding_layers_without_a_window() {
    let good = card_text("spark-x2.5-1.7b", "config.json");
    let bad = good.replacen("\"sliding_attention\",", "\"chunked_attention\",", 1);
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { field, .. } if field == "layer_types[0]"),
        "{e:?}"
    );
    assert_report(
        &e,
        "models/test/config.json",
        line_of(&bad, "chunked_attention"),
    );

    let bad = mutate(&good, "\"sliding_window\": 512,", "");
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::MissingField { field, .. } if field == "sliding_window"),
        "{e:?}"
    );
}

#[test]
fn unknown_quantization_method() {
    let good = card_text("qwen3.8-27b-fp8", "config.json");
    let bad = mutate(
        &good,
        "\"quant_method\": \"fp8\"",
        "\"quant_method\": \"awq\"",
    );
    let e = parse(&bad).unwrap_err();
    assert!(matches!(e, ModelError::Quantization { .. }), "{e:?}");
    let r = assert_report(&e, "models/test/config.json", line_of(&bad, "\"awq\""));
    assert!(r.contains("fp8, modelopt, gptq"), "{r}");
}

#[test]
fn errors_in_hf_quant_config_name_that_file() {
    let config = card_text("qwen3.8-27b-nvfp4", "config.json");
    let quant = card_text("qwen3.8-27b-nvfp4", "hf_quant_config.json");
    let bad = mutate(
        &quant,
        "\"quant_algo\": \"MIXED_PRECISION\"",
        "\"quant_algo\": \"INT8_SQ\"",
    );
    let card = ModelCard {
        id: "test".into(),
        config: SourceFile {
            path: "models/test/config.json".into(),
            text: config,
        },
        quant_config: Some(SourceFile {
            path: "models/test/hf_quant_config.json".into(),
            text: bad.clone(),
        }),
    };
    let e = parse_model(&card).unwrap_err();
    assert!(matches!(e, ModelError::Quantization { .. }), "{e:?}");
    assert_report(
        &e,
        "models/test/hf_quant_config.json",
        line_of(&bad, "INT8_SQ"),
    );
}

#[test]
fn gptq_with_other_bit_widths_is_refused() {
    let good = card_text("spark-x2.5-1.7b-gptq-int4", "config.json");
    let bad = mutate(&good, "\"bits\": 4", "\"bits\": 3");
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { field, .. } if field == "quantization_config.bits"),
        "{e:?}"
    );
}

#[test]
fn absurd_layer_counts_are_refused_before_allocating() {
    let good = card_text("qwen3-8b", "config.json");
    let bad = mutate(
        &good,
        "\"num_hidden_layers\": 36",
        "\"num_hidden_layers\": 1000000000000",
    );
    let e = parse(&bad).unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { field, .. } if field == "num_hidden_layers"),
        "{e:?}"
    );
}

#[test]
fn a_mixed_precision_card_without_its_hf_quant_config() {
    let config = card_text("qwen3.8-27b-nvfp4", "config.json");
    let e = parse(&config).unwrap_err();
    assert!(matches!(e, ModelError::Quantization { .. }), "{e:?}");
    let r = assert_report(
        &e,
        "models/test/config.json",
        line_of(&config, "MIXED_PRECISION"),
    );
    assert!(r.contains("hf_quant_config.json"), "{r}");
}

#[test]
fn modelopt_fp8_only_is_refused_not_mislabelled() {
    let config = card_text("qwen3.8-27b-nvfp4", "config.json");
    let bad = mutate(
        &config,
        "\"quant_algo\": \"MIXED_PRECISION\"",
        "\"quant_algo\": \"FP8\"",
    );
    let e = parse(&bad).unwrap_err();
    assert!(matches!(e, ModelError::Quantization { .. }), "{e:?}");
    let r = assert_report(&e, "models/test/config.json", line_of(&bad, "\"FP8\""));
    assert!(r.contains("FP8 only"), "{r}");
}
