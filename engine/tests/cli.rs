//! The `edgefit generate` interface as users script it: `--json` output, and `--stop` strings that are not one token,
//! matched in the decoded text and left out of it.

use std::process::Command;

fn generate(extra: &[&str]) -> serde_json::Value {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3-f32");
    let out = Command::new(env!("CARGO_BIN_EXE_edgefit"))
        .args([
            "generate", "--model", model, "--prompt", "hello", "--exact", "--json",
        ])
        .args(["--profile", "avx512-2core", "--max-new-tokens", "24"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_reports_tokens_timings_memory_and_the_prediction() {
    let v = generate(&[]);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 24);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["timings"]["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["memory"]["weights_bytes"].as_u64().unwrap() > 0);
    assert!(v["predicted"]["decode_tok_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_multi_token_stop_string_ends_generation_and_is_left_out() {
    let full = generate(&[]);
    let text = full["text"].as_str().unwrap().to_string();
    // A two-character piece of the greedy text, past its first few characters: two byte tokens, not one.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let at = text.find(&stop).unwrap();
    let v = generate(&["--stop", &stop]);
    assert_eq!(v["finish_reason"], "stop", "{v}");
    assert_eq!(v["text"].as_str().unwrap(), &text[..at]);
    assert!(v["tokens"].as_array().unwrap().len() < 24);
}
