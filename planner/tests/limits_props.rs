//! No input a user can write panics the planner or yields a plan that cannot be written (issue 23 §6). Real model
//! cards get one or two of their numbers replaced (boundary values such as 2^63 and 2^64 - 1 are drawn often), real
//! profiles get their byte counts and rates replaced, and the workload's numbers are drawn the same way; every
//! input either is an error or gives a plan whose TOML renders, reads back and whose ledgers add up. proptest catches
//! a panic as a failure, so "no panic" is what each property asserts first.
//!
//! Inputs tried per run: `CASES` per property (see the constant), each a full parse + plan; five properties, so
//! 1280 inputs (config numbers, workload numbers, profile numbers, arbitrary profile text, mutated real profiles).

mod common;

use std::sync::OnceLock;

use planner::model::{ModelCard, SourceFile};
use planner::{Plan, PlanError, Verdict, Workload};
use proptest::prelude::*;

/// Cases per property. Each is a full parse and plan of a real card (up to ~75k tensors for Qwen3-Next).
const CASES: u32 = 256;

/// Numbers that break arithmetic, drawn half the time; any u64 the other half.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0u64,
            1,
            2,
            3,
            7,
            255,
            65_535,
            1 << 31,
            u64::from(u32::MAX),
            1 << 32,
            1 << 53,
            (1 << 53) + 1,
            i64::MAX as u64 - 1,
            i64::MAX as u64,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ]),
        any::<u64>(),
        1u64..100_000,
    ]
}

fn cards() -> &'static [ModelCard] {
    static C: OnceLock<Vec<ModelCard>> = OnceLock::new();
    C.get_or_init(|| common::models().iter().map(|m| common::card(m)).collect())
}

fn profiles() -> &'static [SourceFile] {
    static P: OnceLock<Vec<SourceFile>> = OnceLock::new();
    P.get_or_init(|| {
        common::profiles()
            .iter()
            .map(|d| common::profile(d))
            .collect()
    })
}

/// The numeric keys of the cards' configs that geometry and caches are built from.
const CONFIG_KEYS: [&str; 16] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
    "max_position_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "full_attention_interval",
];

/// Set `key` to `value` wherever it appears (top level and `text_config`).
fn set_everywhere(v: &mut serde_json::Value, key: &str, value: u64) {
    if let Some(o) = v.as_object_mut() {
        if o.contains_key(key) {
            o.insert(key.to_owned(), value.into());
        }
        for child in o.values_mut() {
            set_everywhere(child, key, value);
        }
    }
}

/// The plan is either an error (with a message) or a plan that renders, reads back and keeps its invariants.
fn check(result: Result<Plan, PlanError>) -> Result<(), TestCaseError> {
    let plan = match result {
        Ok(plan) => plan,
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            return Ok(());
        }
    };
    let text = plan.to_toml();
    prop_assert!(text.is_ok(), "{:?}", text.err());
    let text = text.unwrap_or_default();
    let back = Plan::from_toml("p.toml", &text);
    prop_assert!(back.is_ok(), "the plan does not read back");
    for l in &plan.ledgers {
        prop_assert!(l.adds_up(), "{:?}", l);
    }
    prop_assert_eq!(plan.prediction.is_some(), plan.verdict == Verdict::Fits);
    if let Some(p) = &plan.prediction {
        prop_assert!(
            p.decode_tok_s.is_finite() && p.decode_tok_s > 0.0,
            "{:?}",
            p
        );
    }
    Ok(())
}

fn workload(len: u64, seqs: u64, prompt: u64, offload: Option<u64>) -> Workload {
    Workload {
        max_model_len: len,
        max_num_seqs: seqs,
        prompt_len: prompt,
        offload_bytes: offload,
        ..Workload::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    /// One or two numbers of a real card replaced (issue 23 §6: `"vocab_size": 9223372036854775808` panicked in
    /// `placement::place` and a release build said "fits" at 0.000 tok/s).
    #[test]
    fn config_numbers_never_panic(
        card in 0usize..64,
        profile in 0usize..64,
        k1 in 0usize..CONFIG_KEYS.len(),
        v1 in number(),
        k2 in 0usize..CONFIG_KEYS.len(),
        v2 in number(),
        two in any::<bool>(),
    ) {
        let mut card = cards()[card % cards().len()].clone();
        let mut v: serde_json::Value = serde_json::from_str(&card.config.text).unwrap();
        set_everywhere(&mut v, CONFIG_KEYS[k1], v1);
        if two {
            set_everywhere(&mut v, CONFIG_KEYS[k2], v2);
        }
        card.config.text = serde_json::to_string_pretty(&v).unwrap();
        let profile = &profiles()[profile % profiles().len()];
        check(planner::plan::plan(&card, profile, &Workload::default()))?;
    }

    /// The workload's numbers as the CLI passes them (issue 23 §6: `--max-model-len 18446744073709551615` panicked
    /// with an add overflow; `--offload-gib 8589934592` wrote `# plan serialization failed` with exit 0).
    #[test]
    fn workload_numbers_never_panic(
        card in 0usize..64,
        profile in 0usize..64,
        len in number(),
        seqs in number(),
        prompt in number(),
        offload in prop::option::of(number()),
        gib in prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-0.0), Just(8589934592.0), Just(1e300),
                           0.0f64..1e12],
    ) {
        let card = &cards()[card % cards().len()];
        let profile = &profiles()[profile % profiles().len()];
        check(planner::plan::plan(card, profile, &workload(len, seqs, prompt, offload)))?;
        match workload(len, seqs, prompt, None).with_offload_gib(gib) {
            Ok(w) => check(planner::plan::plan(card, profile, &w))?,
            Err(e) => prop_assert!(e.to_string().contains("--offload-gib"), "{}", e),
        }
    }

    /// A real profile with its byte counts and rates replaced.
    #[test]
    fn profile_numbers_never_panic(
        card in 0usize..64,
        profile in 0usize..64,
        which in 0usize..6,
        value in number(),
        rate in prop_oneof![Just(1e-300), Just(1e300), Just(f64::MAX), Just(f64::MIN_POSITIVE), 1e-3f64..1e15],
    ) {
        let card = &cards()[card % cards().len()];
        let mut file = profiles()[profile % profiles().len()].clone();
        let mut v: toml::Value = toml::from_str(&file.text).unwrap();
        // TOML integers stop at i64::MAX; larger draws are clamped so the text stays TOML and the planner sees them.
        let int = i64::try_from(value).unwrap_or(i64::MAX);
        if let Some(pools) = v.get_mut("pool").and_then(|p| p.as_array_mut()) {
            for pool in pools {
                let key = ["capacity_bytes", "taken_bytes", "runtime_overhead_bytes", "reserve_bytes"][which % 4];
                if let Some(m) = pool.get_mut(key).and_then(|m| m.as_table_mut()) {
                    m.insert("value".into(), toml::Value::Integer(int));
                }
                if which >= 4 {
                    if let Some(m) = pool.get_mut("read_bytes_per_s").and_then(|m| m.as_table_mut()) {
                        m.insert("value".into(), toml::Value::Float(rate));
                    }
                }
            }
        }
        file.text = toml::to_string(&v).unwrap();
        match planner::parse_profile(&file) {
            Ok(_) => check(planner::plan::plan(card, &file, &Workload::default()))?,
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// The profile reader on arbitrary text (the fuzz target `profile` does the same, unbounded): an error that
    /// renders with its span, never a panic.
    #[test]
    fn arbitrary_profile_text_never_panics(text in "\\PC{0,300}") {
        let file = SourceFile { path: "profiles/fuzz.toml".into(), text };
        if let Err(e) = planner::parse_profile(&file) {
            prop_assert!(!common::render(&e).is_empty());
        }
    }

    /// A real profile cut short, with a slice of it repeated or a few characters spliced in: every truncation and
    /// splice of a valid file is an error or a profile that plans.
    #[test]
    fn mutated_real_profiles_never_panic(
        profile in 0usize..64,
        card in 0usize..64,
        at in any::<prop::sample::Index>(),
        cut in 0usize..80,
        splice in "[\\[\\]{}=\".,0-9a-z_ \n#-]{0,12}",
    ) {
        let mut file = profiles()[profile % profiles().len()].clone();
        let mut chars: Vec<char> = file.text.chars().collect();
        let i = at.index(chars.len().max(1)).min(chars.len());
        let end = (i + cut).min(chars.len());
        chars.splice(i..end, splice.chars());
        file.text = chars.into_iter().collect();
        match planner::parse_profile(&file) {
            Ok(_) => check(planner::plan::plan(&cards()[card % cards().len()], &file, &Workload::default()))?,
            Err(e) => prop_assert!(!common::render(&e).is_empty()),
        }
    }
}

/// The two inputs of issue 23 §6 that panicked, as fixed cases.
#[test]
fn the_reported_crashes_are_errors_naming_the_input() {
    let mut card = common::card("spark-x2.5-1.7b");
    card.config.text = card.config.text.replace(
        "\"vocab_size\": 131072",
        "\"vocab_size\": 9223372036854775808",
    );
    let e = planner::plan::plan(&card, &common::profile("ryzen-5090"), &Workload::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.embedding") && e.contains("9223372036854775808"),
        "{e}"
    );
    let e = planner::plan::plan(
        &common::card("qwen3.8-27b-fp8"),
        &common::profile("ryzen-5090"),
        &workload(u64::MAX, 1, 512, None),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("max_model_len 18446744073709551615"), "{e}");
    // Within the model's context, but a cache no plan can hold.
    let e = planner::plan::plan(
        &common::card("qwen3.8-27b-fp8"),
        &common::profile("ryzen-5090"),
        &workload(4096, u64::MAX, 512, None),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("max_num_seqs 18446744073709551615"), "{e}");
}
