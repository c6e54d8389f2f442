//! FLOPs per decoded token and per prompt, the compute side of the prediction (BRIEF §2: "bytes are not the whole
//! model" — the NVFP4 path was compute-bound, 4.7x slower than its bytes said).
//!
//! Counted: 2 FLOPs per multiply-accumulate of every matmul weight a token passes through (logical parameters, so
//! an NVFP4 byte counts as two), routed experts at their active share, attention scores and values over the cached
//! context (`4 * q_heads * head_dim` per attended position: QK^T and PV), and the gated DeltaNet step
//! (`7 * Hv * dk * dv`: decay 1, `S^T k` 2, the rank-1 update 2, `S^T q` 2, per element of the state) plus its
//! depthwise conv (`2 * kernel` per channel). Norms, activations and softmax are a few FLOPs per element of a
//! vector and are left out; quantization scales are not matmul work. The vision tower and the MTP head are
//! conditional and not part of a plain decode step.

use super::{Access, LayerKind, ModelSpec, Role};

/// FLOPs of one matmul weight per token, with routed experts at `active / total`. Gathered embeddings cost none;
/// a tied embedding (read `EveryToken`) is the LM head and counts in full.
fn matmul_flops(spec: &ModelSpec, include_head: bool) -> u128 {
    spec.inventory
        .iter()
        .map(|t| {
            let is_head = matches!(t.role, Role::LmHead)
                || (t.role == Role::Embedding && t.access == Access::EveryToken);
            let is_weight = matches!(t.role, Role::LayerWeight | Role::ExpertWeight) || is_head;
            if !is_weight || (is_head && !include_head) {
                return 0;
            }
            let p = u128::from(t.params) * 2;
            match t.access {
                Access::EveryToken => p,
                Access::Routed { active, total } if total > 0 => {
                    p * u128::from(active.min(total)) / u128::from(total)
                }
                _ => 0,
            }
        })
        .fold(0u128, u128::saturating_add)
}

/// FLOPs of the LM head alone (one matmul per token that needs logits).
fn head_flops(spec: &ModelSpec) -> u128 {
    matmul_flops(spec, true).saturating_sub(matmul_flops(spec, false))
}

/// Per-token state work of one GDN layer.
fn gdn_flops(spec: &ModelSpec) -> u128 {
    let Some(g) = spec.gdn else { return 0 };
    // Each factor is below 2^64, so the products of two fit; the rest saturates.
    let state = (u128::from(g.num_value_heads) * u128::from(g.key_head_dim))
        .saturating_mul(u128::from(g.value_head_dim));
    let channels = (2 * u128::from(g.num_key_heads) * u128::from(g.key_head_dim))
        .saturating_add(u128::from(g.num_value_heads) * u128::from(g.value_head_dim));
    state
        .saturating_mul(7)
        .saturating_add(channels.saturating_mul(2 * u128::from(g.conv_kernel)))
}

fn attn_per_position(spec: &ModelSpec) -> u128 {
    (u128::from(spec.num_q_heads) * u128::from(spec.head_dim)).saturating_mul(4)
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// FLOPs to decode one token with `context_len` tokens in the cache (the new token included): full layers attend to
/// all of them, sliding layers to at most their window.
pub fn decode_flops_per_token(spec: &ModelSpec, context_len: u64) -> u64 {
    let ctx = u128::from(context_len);
    let window = spec.sliding_window.map_or(ctx, |w| u128::from(w).min(ctx));
    let per_pos = attn_per_position(spec);
    let layers: u128 = spec
        .layers
        .iter()
        .map(|k| match k {
            LayerKind::FullAttention => per_pos.saturating_mul(ctx),
            LayerKind::SlidingAttention => per_pos.saturating_mul(window),
            LayerKind::LinearAttention => gdn_flops(spec),
        })
        .fold(0u128, u128::saturating_add);
    saturate(matmul_flops(spec, true).saturating_add(layers))
}

/// FLOPs to prefill a `prompt_len`-token prompt: every token through every matmul except the LM head, which only the
/// last position needs; causal attention (token t attends to t positions, capped at the window for sliding
/// layers); the GDN recurrence once per token (the chunked WY form reorganises the same work into matmuls).
pub fn prefill_flops(spec: &ModelSpec, prompt_len: u64) -> u64 {
    if prompt_len == 0 {
        return 0;
    }
    let l = u128::from(prompt_len);
    let body = matmul_flops(spec, false)
        .saturating_mul(l)
        .saturating_add(head_flops(spec));
    let per_pos = attn_per_position(spec);
    let causal = |w: u128| -> u128 {
        // sum_{t=1..l} min(t, w)
        if l <= w {
            l * (l + 1) / 2
        } else {
            w * (w + 1) / 2 + (l - w) * w
        }
    };
    let window = spec.sliding_window.map_or(l, u128::from);
    let layers: u128 = spec
        .layers
        .iter()
        .map(|k| match k {
            LayerKind::FullAttention => per_pos.saturating_mul(causal(l)),
            LayerKind::SlidingAttention => per_pos.saturating_mul(causal(window)),
            LayerKind::LinearAttention => gdn_flops(spec).saturating_mul(l),
        })
        .fold(0u128, u128::saturating_add);
    saturate(body.saturating_add(layers))
}

/// Kernels per decoder layer of a decode step as an engine without cross-op fusion runs them: the input norm, the
/// fused input projection(s), q/k norms or the conv, RoPE or the gates, the attention or recurrence kernel, the
/// output projection, the residual add, the post-attention norm, the fused gate/up projection, the activation, the
/// down projection and the second residual add (a GDN layer's conv, gates and state update are one kernel, its four
/// input projections two). Twelve either way, within one or two of what the H200 kernels' layer steps launch.
pub const KERNELS_PER_LAYER: u64 = 12;

/// Kernels a decode step runs: [`KERNELS_PER_LAYER`] per decoder layer plus the embedding gather, the final norm,
/// the head and the sampler.
pub fn decode_kernels(spec: &ModelSpec) -> u64 {
    (spec.layers.len() as u64)
        .saturating_mul(KERNELS_PER_LAYER)
        .saturating_add(4)
}
