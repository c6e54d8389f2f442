//! The cache and state budget per layer type (the plan's `[cache]` section).
//!
//! Each layer kind keeps something different (BRIEF §2 "Caches are per layer type"): a full-attention layer adds
//! `2 (K and V) * kv_heads * head_dim * kv_bytes` per token of context; a sliding layer holds at most its window,
//! a fixed cost per sequence; a gated DeltaNet layer holds a fixed fp32 recurrent state `[Hv, dk, dv]` plus its conv
//! state (the last `kernel - 1` inputs of its `2*Hk*dk + Hv*dv` conv channels, in bf16) and no KV cache at all.
//! A layer-blind backend charges every layer the full-attention rate: that is the `flat` figure, reported beside the
//! per-layer-type (`hybrid`) one because it is what such a backend will actually allocate.
//!
//! All arithmetic is in integer bytes and saturates; the headroom factor is applied to the KV caches (full and
//! sliding) and rounded up, never to the GDN state, which is exact and constant (the seed's vLLM budget applied its
//! 1.25 the same way; seed 000 §4: 467 MiB at 4096 = 147 MiB of state + 320 MiB = 1.25 x 256 MiB of cache).

use super::{
    CacheBudget, CacheWorkload, DType, LayerKind, LayerKindBudget, ModelSpec, RopeTables,
    SlidingAccounting,
};

/// Bytes per element of the GDN recurrent state: transformers and vLLM keep it in fp32 whatever the model dtype,
/// because the decay `exp(g)` compounds over thousands of steps (BRIEF §3 "Gated DeltaNet").
pub const GDN_STATE_ELEM_BYTES: u64 = 4;
/// Bytes per element of the GDN conv state: it holds raw projected activations, kept in the model dtype (bf16).
pub const GDN_CONV_ELEM_BYTES: u64 = 2;

/// KV bytes one attention layer adds per cached token: K and V, each `kv_heads * head_dim` elements.
pub fn kv_bytes_per_layer_token(spec: &ModelSpec, kv_bytes_per_elem: u64) -> u64 {
    2u64.saturating_mul(spec.num_kv_heads)
        .saturating_mul(spec.head_dim)
        .saturating_mul(kv_bytes_per_elem)
}

/// Slots a sliding layer keeps per sequence under `acc`, never more than the sequence can hold
/// (`max_model_len`). A ring keeps `window - 1` past tokens because the current token is the window's last member
/// (transformers' sliding cache holds 511 for a 512 window; seed 002); a paged backend rounds the window up to
/// whole blocks.
pub fn sliding_slots(window: u64, acc: SlidingAccounting, max_model_len: u64) -> u64 {
    let slots = match acc {
        SlidingAccounting::Ring => window.saturating_sub(1).max(1),
        SlidingAccounting::Paged { block_tokens } => {
            let b = block_tokens.max(1);
            window.div_ceil(b).saturating_mul(b)
        }
    };
    slots.min(max_model_len)
}

/// Fixed per-sequence state of one GDN layer: recurrent `[Hv, dk, dv]` fp32 plus conv `(kernel - 1) x channels`.
pub fn gdn_state_bytes_per_layer(spec: &ModelSpec) -> u64 {
    let Some(g) = spec.gdn else { return 0 };
    let recurrent = g
        .num_value_heads
        .saturating_mul(g.key_head_dim)
        .saturating_mul(g.value_head_dim)
        .saturating_mul(GDN_STATE_ELEM_BYTES);
    let channels = g
        .num_key_heads
        .saturating_mul(g.key_head_dim)
        .saturating_mul(2)
        .saturating_add(g.num_value_heads.saturating_mul(g.value_head_dim));
    let conv = g
        .conv_kernel
        .saturating_sub(1)
        .saturating_mul(channels)
        .saturating_mul(GDN_CONV_ELEM_BYTES);
    recurrent.saturating_add(conv)
}

/// The model dtype: what the token embedding is stored in (every family keeps it unquantized in `torch_dtype`, FP8
/// and NVFP4 builds included). RoPE caches are cast to it.
pub fn model_dtype(spec: &ModelSpec) -> DType {
    spec.inventory
        .iter()
        .find(|t| t.name == spec.runtime.embedding)
        .map_or(DType::Bf16, |t| t.dtype)
}

/// A cos/sin cache for `positions` positions as vLLM builds it: per distinct (theta, rotary_dims) spec, one
/// `[positions, rotary_dims]` tensor (`cat(cos, sin)` of `rotary_dims / 2` angles each) in the model dtype
/// (`vllm/model_executor/layers/rotary_embedding/base.py`: `_compute_cos_sin_cache`, then `cache.to(dtype)`).
///
/// Why it matters: caches sized from `max_position_embeddings` instead of the deployment's `max_model_len` were the
/// largest single memory item the seed found (seed 002: Spark's 1,048,576-position caches, `[1048576, 256]` 512 MB
/// and `[1048576, 64]` 128 MB in bf16, resident in a 2048-token deployment that needed 1.25 MB of them).
pub fn rope_table_bytes(spec: &ModelSpec, positions: u64) -> u64 {
    let elem = super::inventory::elem_bytes(model_dtype(spec));
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let mut total = 0u64;
    for r in &spec.rope {
        let key = (r.theta.to_bits(), r.rotary_dims);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let t = positions.saturating_mul(r.rotary_dims).saturating_mul(elem);
        total = total.saturating_add(t);
    }
    total
}

/// `ceil(bytes * headroom)`, saturating. A headroom that is not finite or below 1 is read as 1: headroom only adds.
fn with_headroom(bytes: u64, headroom: f64) -> u64 {
    let h = if headroom.is_finite() && headroom >= 1.0 {
        headroom
    } else {
        1.0
    };
    let v = (bytes as f64 * h).ceil();
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v as u64
    }
}

/// The cache and state budget of `spec` under workload `w`, per layer kind, with the flat figure beside it.
pub fn cache_budget(spec: &ModelSpec, w: &CacheWorkload) -> CacheBudget {
    let per_layer = kv_bytes_per_layer_token(spec, w.kv_bytes_per_elem);
    let count = |k: LayerKind| spec.layers.iter().filter(|&&l| l == k).count() as u64;
    let (n_full, n_slide, n_lin) = (
        count(LayerKind::FullAttention),
        count(LayerKind::SlidingAttention),
        count(LayerKind::LinearAttention),
    );

    // A sliding layer without a known window can only be charged like a full one (it may hold the whole sequence).
    let slots = match spec.sliding_window {
        Some(win) => sliding_slots(win, w.sliding_accounting, w.max_model_len),
        None => w.max_model_len,
    };
    let full_per_token = n_full.saturating_mul(per_layer);
    let sliding_per_seq = n_slide.saturating_mul(per_layer).saturating_mul(slots);
    let gdn_per_seq = n_lin.saturating_mul(gdn_state_bytes_per_layer(spec));

    let flat_per_token = (spec.layers.len() as u64).saturating_mul(per_layer);
    let flat_total = with_headroom(
        flat_per_token
            .saturating_mul(w.max_model_len)
            .saturating_mul(w.max_num_seqs),
        w.headroom,
    );
    let kv_per_seq = full_per_token
        .saturating_mul(w.max_model_len)
        .saturating_add(sliding_per_seq);
    let total = with_headroom(kv_per_seq.saturating_mul(w.max_num_seqs), w.headroom)
        .saturating_add(gdn_per_seq.saturating_mul(w.max_num_seqs));

    let mut per_kind = Vec::new();
    if n_full > 0 {
        per_kind.push(LayerKindBudget {
            kind: LayerKind::FullAttention,
            layers: n_full,
            bytes_per_token: full_per_token,
            bytes_per_seq: 0,
            window_slots: None,
        });
    }
    if n_slide > 0 {
        per_kind.push(LayerKindBudget {
            kind: LayerKind::SlidingAttention,
            layers: n_slide,
            bytes_per_token: 0,
            bytes_per_seq: sliding_per_seq,
            window_slots: Some(slots),
        });
    }
    if n_lin > 0 {
        per_kind.push(LayerKindBudget {
            kind: LayerKind::LinearAttention,
            layers: n_lin,
            bytes_per_token: 0,
            bytes_per_seq: gdn_per_seq,
            window_slots: None,
        });
    }
    CacheBudget {
        bytes_per_token_flat: flat_per_token,
        bytes_per_token_hybrid: full_per_token,
        state_bytes_per_seq: sliding_per_seq.saturating_add(gdn_per_seq),
        flat_total_bytes: flat_total,
        total_bytes: total,
        flat_over_hybrid: if total == 0 {
            1.0
        } else {
            flat_total as f64 / total as f64
        },
        headroom: w.headroom,
        sliding_accounting: w.sliding_accounting,
        rope_tables: w.rope_tables,
        rope_table_dtype: model_dtype(spec),
        rope_table_bytes: match w.rope_tables {
            RopeTables::CosSinCache => rope_table_bytes(spec, w.max_model_len),
            RopeTables::PerCall => 0,
        },
        rope_table_bytes_uncapped: rope_table_bytes(spec, spec.max_position_embeddings),
        per_kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_window_minus_one_and_paged_rounds_up() {
        assert_eq!(sliding_slots(512, SlidingAccounting::Ring, 1 << 20), 511);
        assert_eq!(
            sliding_slots(512, SlidingAccounting::Paged { block_tokens: 16 }, 1 << 20),
            512
        );
        assert_eq!(
            sliding_slots(500, SlidingAccounting::Paged { block_tokens: 16 }, 1 << 20),
            512
        );
        assert_eq!(
            sliding_slots(500, SlidingAccounting::Paged { block_tokens: 0 }, 1 << 20),
            500
        );
        // A window of one still holds the current token's slot; never more than the sequence.
        assert_eq!(sliding_slots(1, SlidingAccounting::Ring, 100), 1);
        assert_eq!(sliding_slots(512, SlidingAccounting::Ring, 100), 100);
    }

    #[test]
    fn headroom_rounds_up_and_never_shrinks() {
        assert_eq!(with_headroom(4, 1.25), 5);
        assert_eq!(with_headroom(5, 1.25), 7);
        assert_eq!(with_headroom(100, f64::NAN), 100);
        assert_eq!(with_headroom(100, 0.5), 100);
        assert_eq!(with_headroom(u64::MAX, 2.0), u64::MAX);
    }
}
