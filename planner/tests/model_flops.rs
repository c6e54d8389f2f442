//! FLOPs per decoded token and per prompt, checked against hand-written formulas from the published geometries
//! (BRIEF §3), not against the inventory the code under test builds.

mod common;

use planner::model::{decode_flops_per_token, parse_model, prefill_flops, ModelSpec};

fn spec(id: &str) -> ModelSpec {
    parse_model(&common::card(id)).unwrap()
}

/// Qwen3.8-27B (FP8): 2 x every matmul a token passes (48 GDN + 16 full layers, 64 MLPs, the untied head), plus
/// attention over 4096 positions in 16 layers and the GDN state step in 48. The embedding gather, the vision tower
/// and the MTP head cost nothing here.
#[test]
fn qwen38_decode_flops() {
    let h: u64 = 5120;
    let gdn_linear = h * (10_240 + 6144 + 48 + 48) + 6144 * h;
    let full_linear = h * (12_288 + 1024 + 1024) + 6144 * h;
    let mlp = 3 * h * 17_408;
    let head = 248_320 * h;
    let matmul = 2 * (48 * gdn_linear + 16 * full_linear + 64 * mlp + head);
    let attention = 16 * 4 * 24 * 256 * 4096;
    let gdn_state = 48 * (7 * 48 * 128 * 128 + 2 * 4 * 10_240);
    assert_eq!(
        decode_flops_per_token(&spec("qwen3.8-27b-fp8"), 4096),
        matmul + attention + gdn_state
    );
    // ~2 x 25.9B weights: about 52 GFLOP per token.
    assert!(
        (matmul as f64 / 1e9 - 52.0).abs() < 1.0,
        "{}",
        matmul as f64 / 1e9
    );
    // The NVFP4 build does the same arithmetic on differently stored weights.
    assert_eq!(
        decode_flops_per_token(&spec("qwen3.8-27b-nvfp4"), 4096),
        decode_flops_per_token(&spec("qwen3.8-27b-fp8"), 4096)
    );
}

/// Spark-X2.5-4B: past the 512 window, a longer context only costs in the 9 full layers.
#[test]
fn spark_sliding_layers_stop_growing_at_the_window() {
    let s = spec("spark-x2.5-4b");
    let per_pos = 4 * 16 * 256;
    let d = decode_flops_per_token(&s, 2000) - decode_flops_per_token(&s, 1000);
    assert_eq!(d, 9 * per_pos * 1000);
    let d = decode_flops_per_token(&s, 400) - decode_flops_per_token(&s, 300);
    assert_eq!(d, 36 * per_pos * 100);
    // The tied embedding is the head: 2 x 131072 x 2560 of the per-token FLOPs.
    let body: u64 = 36 * 2 * (6144 * 2560 + 16 * 2560 + 2560 * 4096 + 3 * 2560 * 10_240);
    assert_eq!(
        decode_flops_per_token(&s, 1),
        body + 2 * 131_072 * 2560 + 36 * per_pos
    );
}

/// Qwen3-8B prefill: every token through every matmul but the head (once, for the last position), causal
/// attention `4 * 32 * 128 * L(L+1)/2` per layer.
#[test]
fn qwen3_8b_prefill_flops() {
    let s = spec("qwen3-8b");
    let h: u64 = 4096;
    let layer = h * (4096 + 1024 + 1024) + 4096 * h + 3 * h * 12_288;
    let body = 2 * 36 * layer;
    let head = 2 * 151_936 * h;
    let l: u64 = 512;
    let attention = 36 * 4 * 32 * 128 * l * (l + 1) / 2;
    assert_eq!(prefill_flops(&s, l), body * l + head + attention);
    assert_eq!(prefill_flops(&s, 0), 0);
    assert_eq!(prefill_flops(&s, 1), decode_flops_per_token(&s, 1));
}

/// Qwen3-Next: routed experts count at 10/512, shared experts and everything else in full.
#[test]
fn qwen3_next_routed_share() {
    let s = spec("qwen3-next-80b-a3b");
    let h: u64 = 2048;
    let experts = 48 * 512 * 3 * h * 512;
    let routed = 2 * experts * 10 / 512;
    let gdn_linear = h * (12_288 + 64) + 4096 * h;
    let full_linear = h * (8192 + 512 + 512) + 4096 * h;
    let per_layer_dense = h * 512 + 3 * h * 512 + h; // router, shared expert, shared-expert gate
    let dense = 2 * (36 * gdn_linear + 12 * full_linear + 48 * per_layer_dense + 151_936 * h);
    let attention = 12 * 4 * 16 * 256 * 100;
    let gdn = 36 * (7 * 32 * 128 * 128 + 2 * 4 * 8192);
    assert_eq!(
        decode_flops_per_token(&s, 100),
        routed + dense + attention + gdn
    );
}
