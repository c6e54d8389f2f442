//! Bad inputs get a clear error with the file and the line, never a panic: the rendered report (as a user reads it
//! in a log, without colours) names the file, points at the line of the offending key, and says what was expected.

mod common;

use planner::model::SourceFile;
use planner::Workload;

const PATH: &str = "profiles/bad.toml";

/// The committed laptop profile with one edit applied.
fn edited(from: &str, to: &str) -> String {
    let text = common::profile("ryzen-5090").text;
    assert!(
        text.contains(from),
        "fixture edit `{from}` no longer applies"
    );
    text.replacen(from, to, 1)
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

/// Parse, render, and check the report names the file and the line holding `needle`.
fn check(text: &str, needle: &str, says: &str) -> String {
    let e = planner::parse_profile(&SourceFile {
        path: PATH.into(),
        text: text.into(),
    })
    .expect_err("a bad profile must be rejected");
    let report = common::render(&e);
    assert!(
        report.contains(PATH),
        "report does not name the file:\n{report}"
    );
    let line = line_of(text, needle);
    assert!(
        report.contains(&format!("line {line}")),
        "report does not point at line {line}:\n{report}"
    );
    assert!(
        report.contains(says),
        "report does not say `{says}`:\n{report}"
    );
    report
}

#[test]
fn unknown_key() {
    let text = edited("runs_engine = true", "runs_engine = true\nfp4_turbo = true");
    check(&text, "fp4_turbo", "unknown field `fp4_turbo`");
}

#[test]
fn negative_rate() {
    let text = edited("value = 472e9", "value = -472e9");
    check(&text, "-472e9", "finite rate above zero");
}

#[test]
fn nan_rate() {
    let text = edited("value = 13.9e9", "value = nan");
    check(&text, "value = nan", "finite rate above zero");
}

#[test]
fn zero_size_pool() {
    let text = edited("value = 25651314688", "value = 0");
    check(&text, "capacity_bytes = { value = 0", "zero capacity");
}

#[test]
fn negative_size_is_a_type_error() {
    let text = edited("value = 25651314688", "value = -5");
    check(&text, "capacity_bytes = { value = -5", "invalid value");
}

#[test]
fn malformed_toml() {
    let text = edited("kind = \"gpu\"", "kind = \"gpu");
    check(&text, "kind = \"gpu", "invalid device profile");
}

#[test]
fn unknown_enum_value_lists_the_choices() {
    let text = edited("kind = \"gpu\"", "kind = \"tpu\"");
    let report = check(&text, "kind = \"tpu\"", "unknown variant `tpu`");
    assert!(report.contains("gpu") && report.contains("npu"), "{report}");
}

#[test]
fn dangling_pool_reference() {
    let text = edited("pool = \"vram\"", "pool = \"hbm\"");
    check(&text, "pool = \"hbm\"", "unknown pool `hbm`");
}

#[test]
fn missing_source() {
    let text = edited(
        "source = \"seed 000 §2: GPU VRAM bandwidth, idle machine\"",
        "source = \"\"",
    );
    check(
        &text,
        "read_bytes_per_s = { value = 472e9, source = \"\"",
        "needs a source",
    );
}

#[test]
fn missing_required_field() {
    let text = edited(
        "reserve_bytes = { value = 182536110",
        "# reserve_bytes = { value = 182536110",
    );
    let e = planner::parse_profile(&SourceFile {
        path: PATH.into(),
        text,
    })
    .unwrap_err();
    let report = common::render(&e);
    assert!(
        report.contains("missing field `reserve_bytes`") && report.contains(PATH),
        "{report}"
    );
}

/// A bad model card, through the whole planner: the model side's error reaches the caller with its file.
#[test]
fn bad_model_card_through_plan() {
    let mut card = common::card("gemma-3-1b");
    // Replaced in place: a key added before the real one would now lose to it (the last value wins, as in Python).
    card.config.text =
        card.config
            .text
            .replacen("\"model_type\": \"gemma3_text\"", "\"model_type\": 7", 1);
    let e = planner::plan::plan(&card, &common::profile("ryzen-5090"), &Workload::default())
        .unwrap_err();
    let report = common::render(&e);
    assert!(report.contains("models/gemma-3-1b/config.json"), "{report}");
}

/// A repeated key keeps its last value, as Python's `json` and Hugging Face do (issue 23 §6): a bad first value is
/// overridden, and a bad last value is the error, pointing at the second occurrence.
#[test]
fn a_repeated_config_key_keeps_its_last_value() {
    let mut card = common::card("gemma-3-1b");
    card.config.text = card.config.text.replacen('{', "{\n  \"model_type\": 7,", 1);
    let plan = planner::plan::plan(&card, &common::profile("ryzen-5090"), &Workload::default());
    assert!(
        plan.is_ok(),
        "the first, bad, value is overridden by the real one"
    );
    let mut card = common::card("gemma-3-1b");
    card.config.text = card.config.text.replacen(
        "\"vocab_size\": 262144",
        "\"vocab_size\": 1000,\n  \"vocab_size\": 262144",
        1,
    );
    let spec = planner::model::parse_model(&card).unwrap();
    assert_eq!(spec.vocab_size, 262144);
}

/// An impossible workload is an error, not a plan.
#[test]
fn zero_context_workload() {
    let w = Workload {
        max_model_len: 0,
        ..Workload::default()
    };
    let e = planner::plan::plan(
        &common::card("gemma-3-1b"),
        &common::profile("ryzen-5090"),
        &w,
    )
    .unwrap_err();
    assert!(e.to_string().contains("max_model_len"), "{e}");
}
