//! The cache and state budget reproduces the seed's figures (BRIEF §3 "Derived budget facts"; seed 000 §4,
//! seed 002's `kv_budget_for` note), and the RoPE cap its 1M-position trap.

mod common;

use planner::model::{
    cache_budget, parse_model, CacheBudget, CacheWorkload, LayerKind, ModelCard, ModelSpec,
    RopeTables, SlidingAccounting, SourceFile,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn spec(id: &str) -> ModelSpec {
    parse_model(&common::card(id)).unwrap()
}

fn workload(max_model_len: u64, acc: SlidingAccounting) -> CacheWorkload {
    CacheWorkload {
        max_model_len,
        max_num_seqs: 1,
        kv_bytes_per_elem: 2,
        headroom: 1.25,
        sliding_accounting: acc,
        rope_tables: RopeTables::CosSinCache,
    }
}

fn budget(id: &str, len: u64) -> CacheBudget {
    cache_budget(&spec(id), &workload(len, SlidingAccounting::Ring))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// BRIEF §3: 16 full layers x 4 KiB = 64 KiB/token; a flat 64-layer budget says 256 KiB.
#[test]
fn qwen38_per_token_figures() {
    let b = budget("qwen3.8-27b-fp8", 4096);
    assert_eq!(b.bytes_per_token_hybrid, 64 * KIB);
    assert_eq!(b.bytes_per_token_flat, 256 * KIB);
    let full = b
        .per_kind
        .iter()
        .find(|k| k.kind == LayerKind::FullAttention)
        .unwrap();
    assert_eq!(
        (full.layers, full.bytes_per_token / full.layers),
        (16, 4 * KIB)
    );
}

/// BRIEF §3: GDN recurrent (fp32 [48,128,128] = 3 MiB per layer) + conv state (bf16, 3 x 10240 per layer), over
/// 48 layers: ~147 MiB per sequence, constant in context.
#[test]
fn qwen38_gdn_state_is_147_mib_and_constant() {
    let short = budget("qwen3.8-27b-fp8", 1024);
    let long = budget("qwen3.8-27b-fp8", 65_536);
    assert_eq!(short.state_bytes_per_seq, 48 * (3 * MIB + 3 * 10_240 * 2));
    assert_eq!(short.state_bytes_per_seq, long.state_bytes_per_seq);
    assert_eq!(mib(short.state_bytes_per_seq).round(), 147.0);
    let gdn = short
        .per_kind
        .iter()
        .find(|k| k.kind == LayerKind::LinearAttention)
        .unwrap();
    assert_eq!((gdn.layers, gdn.bytes_per_token), (48, 0));
}

/// BRIEF §3: the constant state and the linear cache cross at ~2350 tokens (state / 64 KiB per token).
#[test]
fn qwen38_state_and_cache_cross_near_2350_tokens() {
    let b = budget("qwen3.8-27b-fp8", 4096);
    let crossing = b.state_bytes_per_seq / b.bytes_per_token_hybrid;
    assert!((2340..=2360).contains(&crossing), "{crossing}");
}

/// BRIEF §3 / seed 000 §4: cache + state = 467 MiB at 4096 tokens (147 + 1.25 x 256) and 787 MiB at 8192.
#[test]
fn qwen38_totals_at_4096_and_8192() {
    assert_eq!(
        mib(budget("qwen3.8-27b-fp8", 4096).total_bytes).round(),
        467.0
    );
    assert_eq!(
        mib(budget("qwen3.8-27b-fp8", 8192).total_bytes).round(),
        787.0
    );
    // The headroom is on the cache only: without it the 4096 figure is 147 + 256.
    let mut w = workload(4096, SlidingAccounting::Ring);
    w.headroom = 1.0;
    assert_eq!(
        mib(cache_budget(&spec("qwen3.8-27b-fp8"), &w).total_bytes).round(),
        403.0
    );
    // The NVFP4 build has the same caches.
    assert_eq!(
        budget("qwen3.8-27b-nvfp4", 8192),
        budget("qwen3.8-27b-fp8", 8192)
    );
}

/// BRIEF §3 / seed 000 §4: Spark-X2.5-4B is 144 KiB/token flat and 3.37x smaller at 8192 when its 27 sliding layers
/// are charged their window (ring of 511 slots; a paged backend's 512 gives the same 3.37).
#[test]
fn spark_4b_flat_and_hybrid() {
    let b = budget("spark-x2.5-4b", 8192);
    assert_eq!(b.bytes_per_token_flat, 144 * KIB);
    assert_eq!(b.bytes_per_token_hybrid, 9 * 4 * KIB);
    assert_eq!((b.flat_over_hybrid * 100.0).round() / 100.0, 3.37);
    let sliding = b
        .per_kind
        .iter()
        .find(|k| k.kind == LayerKind::SlidingAttention)
        .unwrap();
    assert_eq!(sliding.window_slots, Some(511));
    let paged = cache_budget(
        &spec("spark-x2.5-4b"),
        &workload(8192, SlidingAccounting::Paged { block_tokens: 16 }),
    );
    let slots = paged
        .per_kind
        .iter()
        .find(|k| k.kind == LayerKind::SlidingAttention)
        .unwrap()
        .window_slots;
    assert_eq!(slots, Some(512));
    assert_eq!((paged.flat_over_hybrid * 100.0).round() / 100.0, 3.37);
}

/// Seed 002 (`kv_budget_for`): Spark-X2.5-1.7B is 56 KiB/token flat and 3.8x smaller at 32k context.
#[test]
fn spark_1_7b_flat_and_hybrid_at_32k() {
    let b = budget("spark-x2.5-1.7b", 32_768);
    assert_eq!(b.bytes_per_token_flat, 56 * KIB);
    assert_eq!((b.flat_over_hybrid * 10.0).round() / 10.0, 3.8);
    // A paged backend rounds the window to whole blocks of 16: still 3.8x.
    let paged = cache_budget(
        &spec("spark-x2.5-1.7b"),
        &workload(32_768, SlidingAccounting::Paged { block_tokens: 16 }),
    );
    assert_eq!((paged.flat_over_hybrid * 10.0).round() / 10.0, 3.8);
}

/// Gemma 3 1B: 26 layers x 1 KiB flat (1 KV head x 256 x 2 x bf16); 4 global layers grow with context, 22 local
/// layers hold 511 slots each.
#[test]
fn gemma3_1b_sliding_global_mix() {
    let b = budget("gemma-3-1b", 32_768);
    assert_eq!(b.bytes_per_token_flat, 26 * KIB);
    assert_eq!(b.bytes_per_token_hybrid, 4 * KIB);
    assert_eq!(b.state_bytes_per_seq, 22 * KIB * 511);
    let expected_total = ((4 * KIB * 32_768 + 22 * KIB * 511) as f64 * 1.25).ceil() as u64;
    assert_eq!(b.total_bytes, expected_total);
    // 26 / (4 + 22 * 511 / 32768) = 5.99.
    assert_eq!((b.flat_over_hybrid * 100.0).round() / 100.0, 5.99);
}

/// A sliding layer never holds more than the sequence: below the window the hybrid and flat figures agree.
#[test]
fn sliding_slots_are_capped_by_max_model_len() {
    let b = budget("spark-x2.5-4b", 256);
    let sliding = b
        .per_kind
        .iter()
        .find(|k| k.kind == LayerKind::SlidingAttention)
        .unwrap();
    assert_eq!(sliding.window_slots, Some(256));
    assert_eq!(b.total_bytes, b.flat_total_bytes);
}

/// Seed 002: Spark's 1,048,576-position RoPE tables, as vLLM builds them (`cos_sin_cache` `[positions,
/// rotary_dim]` in the model dtype, bf16): `[1048576, 256]` 512 MB for the sliding layers (all 256 dims rotated) and
/// `[1048576, 64]` 128 MB for the full ones (partial 0.25), 640 MiB together; "at max_model_len 2048 they need 1.25 MB
/// between them".
#[test]
fn rope_tables_match_seed_002s_640_mib_at_a_million_positions_and_1_25_mib_at_2048() {
    for id in ["spark-x2.5-1.7b", "spark-x2.5-4b"] {
        let b = budget(id, 2048);
        assert_eq!(b.rope_table_dtype, planner::model::DType::Bf16);
        assert_eq!(
            b.rope_table_bytes_uncapped,
            1_048_576 * 256 * 2 + 1_048_576 * 64 * 2
        );
        assert_eq!(b.rope_table_bytes_uncapped, 640 * MIB, "{id}");
        assert_eq!(b.rope_table_bytes, 2048 * (256 + 64) * 2);
        assert_eq!(b.rope_table_bytes, 1280 * KIB, "{id}: 1.25 MiB");
    }
    // Qwen3.8 has one RoPE (full layers only, 64 of 256 dims rotated): GDN layers carry none.
    let q = budget("qwen3.8-27b-fp8", 4096);
    assert_eq!(q.rope_table_bytes, 4096 * 64 * 2);
    // ... and vLLM's stock Qwen3.5 attention, sized from max_position_embeddings (262144), holds 32 MiB of it.
    assert_eq!(q.rope_table_bytes_uncapped, 32 * MIB);
}

/// edgefit's engine computes RoPE angles per call (`kernels::attention::rope_neox`): it reserves no table, whatever
/// the context; the uncapped figure stays in the plan as what a cos/sin-cache backend would hold.
#[test]
fn edgefit_reserves_no_rope_table() {
    let mut w = workload(2048, SlidingAccounting::Ring);
    w.rope_tables = RopeTables::PerCall;
    let b = cache_budget(&spec("spark-x2.5-4b"), &w);
    assert_eq!(b.rope_table_bytes, 0);
    assert_eq!(b.rope_table_bytes_uncapped, 640 * MIB);
    let default = planner::Workload::default().cache_workload();
    assert_eq!(default.rope_tables, RopeTables::PerCall);
    let vllm = planner::Workload {
        engine: planner::workload::TargetEngine::Vllm,
        ..planner::Workload::default()
    };
    assert_eq!(vllm.cache_workload().rope_tables, RopeTables::CosSinCache);
}

/// More sequences scale the cache and the state together.
#[test]
fn budget_scales_with_max_num_seqs() {
    let s = spec("qwen3.8-27b-fp8");
    let one = cache_budget(&s, &workload(4096, SlidingAccounting::Ring));
    let mut w = workload(4096, SlidingAccounting::Ring);
    w.max_num_seqs = 4;
    let four = cache_budget(&s, &w);
    assert_eq!(four.total_bytes, 4 * one.total_bytes);
    assert_eq!(four.state_bytes_per_seq, one.state_bytes_per_seq);
}

/// Seed 002: a config with a `sliding_window` but no `layer_types` map is charged the flat rate rather than assumed
/// to apply the window everywhere (a budget that is too small is a stall, not a slowdown).
#[test]
fn sliding_window_without_layer_types_is_charged_flat() {
    let text = common::card("spark-x2.5-4b").config.text;
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("layer_types");
    let card = ModelCard {
        id: "no-layer-types".into(),
        config: SourceFile {
            path: "x/config.json".into(),
            text: v.to_string(),
        },
        quant_config: None,
    };
    let s = parse_model(&card).unwrap();
    assert!(s.layers.iter().all(|k| *k == LayerKind::FullAttention));
    let b = cache_budget(&s, &workload(8192, SlidingAccounting::Ring));
    assert_eq!(b.bytes_per_token_hybrid, b.bytes_per_token_flat);
    assert_eq!(b.total_bytes, b.flat_total_bytes);
}
