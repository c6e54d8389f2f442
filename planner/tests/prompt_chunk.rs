//! The prompt chunk: grown only on a GPU, only out of what the decode pool's ledger leaves free, and charged there.

mod common;

use common::{card, plan, profile};
use planner::admission::{Ledger, Verdict};
use planner::prompt_chunk::{choose, scratch_bytes_per_token, BASE_TOKENS, MAX_TOKENS};
use planner::{Plan, Workload};

fn decode_ledger(p: &Plan) -> &Ledger {
    p.decode_ledger()
        .expect("a plan has its decode pool's ledger")
}

fn ledger(free: u64) -> Ledger {
    Ledger {
        pool: "hbm".into(),
        capacity_bytes: free,
        taken_bytes: 0,
        runtime_overhead_bytes: 0,
        reserve_bytes: 0,
        cache_bytes: 0,
        rope_table_bytes: 0,
        weight_bytes: 0,
        weight_tensors: 0,
        prompt_scratch_bytes: 0,
        free_bytes: free,
        shortfall_bytes: 0,
        budget_declared: true,
    }
}

/// The engine's free memory on the 27B FP8 geometry fell by 0.69-0.72 MiB a prompt token from chunks of 512 to
/// 2048 (`benchmarks/engine-h200.md`): the estimate must not be below that, nor so far above it that it wastes the
/// memory it charges.
#[test]
fn the_estimate_bounds_the_engines_measured_scratch() {
    let spec = planner::model::parse_model(&card("qwen3.8-27b-fp8")).unwrap();
    let per_token = scratch_bytes_per_token(&spec) as f64 / 1048576.0;
    assert!(
        (0.72..=0.72 * 1.5).contains(&per_token),
        "{per_token:.3} MiB a token"
    );
}

#[test]
fn the_h200_grows_the_chunk_and_charges_the_growth() {
    let p = plan("qwen3.8-27b-fp8", "h200", &Workload::default());
    let c = &p.prompt_chunk;
    assert_eq!(c.tokens, MAX_TOKENS);
    assert_eq!(
        c.extra_scratch_bytes,
        (MAX_TOKENS - BASE_TOKENS) * c.scratch_bytes_per_token
    );
    let l = decode_ledger(&p);
    assert_eq!(l.prompt_scratch_bytes, c.extra_scratch_bytes);
    assert!(l.adds_up());
    // Charged to the decode pool only.
    for other in p.ledgers.iter().filter(|o| o.pool != l.pool) {
        assert_eq!(other.prompt_scratch_bytes, 0, "{}", other.pool);
    }
    // The plan as the engine reads it carries the chunk.
    let back = Plan::from_toml("h200.toml", &p.to_toml().unwrap()).unwrap();
    assert_eq!(back.prompt_chunk, p.prompt_chunk);
}

#[test]
fn a_full_card_a_cpu_and_a_plan_that_does_not_fit_keep_the_default() {
    // The laptop's 24 GB card is full with the 27B's weights: nothing is left to grow into.
    let full = plan("qwen3.8-27b-fp8", "ryzen-5090", &Workload::default());
    assert_eq!(full.verdict, Verdict::Fits);
    assert_eq!(full.prompt_chunk.tokens, BASE_TOKENS);
    assert_eq!(decode_ledger(&full).prompt_scratch_bytes, 0);
    assert!(
        full.prompt_chunk.reason.contains("free"),
        "{}",
        full.prompt_chunk.reason
    );
    let cpu = plan("qwen3-1.7b", "avx512-2core", &Workload::default());
    assert_eq!(cpu.prompt_chunk.tokens, BASE_TOKENS);
    assert!(
        cpu.prompt_chunk.reason.contains("GPU"),
        "{}",
        cpu.prompt_chunk.reason
    );
    let no = plan("qwen3-next-80b-a3b", "ryzen-5090", &Workload::default());
    assert_eq!(no.verdict, Verdict::DoesNotFit);
    assert_eq!(no.prompt_chunk.tokens, BASE_TOKENS);
    assert!(no.ledgers.iter().all(|l| l.prompt_scratch_bytes == 0));
}

#[test]
fn a_short_context_runs_in_one_chunk_no_longer_than_it() {
    let at = |len: u64| {
        let w = Workload {
            max_model_len: len,
            prompt_len: len.min(Workload::default().prompt_len),
            ..Workload::default()
        };
        plan("qwen3-8b", "h200", &w).prompt_chunk
    };
    assert_eq!(at(1500).tokens, 1500);
    assert_eq!(at(256).tokens, BASE_TOKENS);
    assert_eq!(at(256).extra_scratch_bytes, 0);
}

#[test]
fn the_chunk_halves_to_what_is_free() {
    let spec = planner::model::parse_model(&card("qwen3.8-27b-fp8")).unwrap();
    let h200 = planner::parse_profile(&profile("h200")).unwrap();
    let unit = h200.decode_unit();
    let per = scratch_bytes_per_token(&spec);
    let extra = |t: u64| (t - BASE_TOKENS) * per;
    let pick = |free: u64| choose(&spec, unit, 4096, Some(&ledger(free)), true);
    assert_eq!(pick(extra(2048)).tokens, 2048);
    assert_eq!(pick(extra(2048) - 1).tokens, 1024);
    assert_eq!(pick(extra(1024)).tokens, 1024);
    assert_eq!(pick(extra(1024) - 1).tokens, BASE_TOKENS);
    assert_eq!(pick(0).extra_scratch_bytes, 0);
    // Not fitting, or no ledger to charge: the default.
    assert_eq!(
        choose(&spec, unit, 4096, Some(&ledger(u64::MAX)), false).tokens,
        BASE_TOKENS
    );
    assert_eq!(choose(&spec, unit, 4096, None, true).tokens, BASE_TOKENS);
}

/// A plan written before the chunk was planned still parses, and runs the engine's default chunk.
#[test]
fn a_plan_without_a_chunk_reads_as_the_default() {
    // A plan of the default chunk charges nothing, so without the new lines it is what the planner wrote before.
    let p = plan("qwen3.8-27b-fp8", "ryzen-5090", &Workload::default());
    assert_eq!(p.prompt_chunk.extra_scratch_bytes, 0);
    let text = p.to_toml().unwrap();
    let mut old = String::new();
    let mut skip = false;
    for line in text.lines() {
        if line.starts_with('[') {
            skip = line == "[prompt_chunk]";
        }
        if !skip && !line.starts_with("prompt_scratch_bytes") {
            old.push_str(line);
            old.push('\n');
        }
    }
    assert!(!old.contains("prompt_chunk") && !old.contains("prompt_scratch"));
    let back = Plan::from_toml("old.toml", &old).unwrap();
    assert_eq!(back.prompt_chunk.tokens, BASE_TOKENS);
    assert!(back.ledgers.iter().all(|l| l.prompt_scratch_bytes == 0));
}

/// A hand edit that runs a longer chunk than the ledger charges, or breaks a ledger's sum, is refused on reading,
/// pointing at the line to re-plan.
#[test]
fn a_hand_edited_chunk_or_ledger_is_refused_with_its_line() {
    let p = plan("qwen3.8-27b-fp8", "h200", &Workload::default());
    let text = p.to_toml().unwrap();
    let line_of = |t: &str, l: &str| t.lines().position(|x| x == l).unwrap() + 1;
    // Longer than what was charged.
    let longer = text.replacen("tokens = 2048", "tokens = 4096", 1);
    let e = Plan::from_toml("p.toml", &longer).unwrap_err();
    assert_eq!(e.line(), Some(line_of(&longer, "[prompt_chunk]")));
    assert!(e.message.contains("4096 tokens"), "{}", e.message);
    // Zero tokens.
    let zero = text.replacen("tokens = 2048", "tokens = 0", 1);
    assert!(Plan::from_toml("p.toml", &zero).is_err());
    // A chunk the ledger does not charge.
    let l = decode_ledger(&p);
    let uncharged = text.replacen(
        &format!("prompt_scratch_bytes = {}", l.prompt_scratch_bytes),
        "prompt_scratch_bytes = 0",
        1,
    );
    let e = Plan::from_toml("p.toml", &uncharged).unwrap_err();
    assert!(e.message.contains("prompt_scratch_bytes"), "{}", e.message);
    // A ledger that no longer adds up: the free bytes of the decode pool edited.
    let edited = text.replacen(
        &format!("free_bytes = {}", l.free_bytes),
        &format!("free_bytes = {}", l.free_bytes + 1),
        1,
    );
    let e = Plan::from_toml("p.toml", &edited).unwrap_err();
    assert!(e.message.contains("does not add up"), "{}", e.message);
    assert_eq!(e.line(), Some(line_of(&edited, "[[ledger]]")));
}
