//! The prompt chunk: how many tokens of a prompt the engine runs in one step, and the activation memory that costs.
//!
//! A prompt longer than the chunk runs in pieces, so activations stay bounded. Longer pieces make longer GEMMs:
//! on CUDA a 27B FP8 prompt of 4096 tokens ran 1.11-1.16x faster in chunks of 1024 or 2048 tokens than of 512, and
//! no faster past 2048 (`benchmarks/engine-h200.md`, "longer prompt chunks"). They cost activation scratch that the
//! pool's runtime-overhead budget does not hold: the budget stands for the engine at its default chunk
//! ([`BASE_TOKENS`]). So the plan grows the chunk only on a GPU, only out of the memory its decode pool's ledger
//! leaves free, and charges what the growth costs to that ledger (`prompt_scratch_bytes`), where admission sees it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::admission::Ledger;
use crate::model::{LayerKind, ModelSpec};
use crate::profile::{ComputeKind, ComputeUnit};

/// The chunk the pools' runtime-overhead budgets stand for: the engine's default (`engine::PREFILL_CHUNK`).
pub const BASE_TOKENS: u64 = 512;

/// The longest chunk a plan chooses: past 2048 tokens the measured prompt rate rose no further.
pub const MAX_TOKENS: u64 = 2048;

/// f32 copies of the hidden state a layer keeps live at once (the residual, the normed input, a block's output and
/// the sum that follows it).
const HIDDEN_STREAMS: u64 = 4;

/// The plan's prompt chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptChunk {
    /// Longest piece of a prompt one step runs.
    pub tokens: u64,
    /// Activation scratch a token of a chunk takes on the decode unit (an upper estimate, see
    /// [`scratch_bytes_per_token`]).
    pub scratch_bytes_per_token: u64,
    /// Scratch beyond what the runtime overhead holds (`(tokens - 512) x scratch_bytes_per_token`), charged to the
    /// decode pool's ledger as `prompt_scratch_bytes`.
    pub extra_scratch_bytes: u64,
    pub reason: String,
}

impl Default for PromptChunk {
    /// A plan written before the chunk was planned runs the engine's default chunk, which the overhead covers.
    fn default() -> Self {
        PromptChunk {
            tokens: BASE_TOKENS,
            scratch_bytes_per_token: 0,
            extra_scratch_bytes: 0,
            reason: "the engine's default chunk (the plan predates planned chunks)".into(),
        }
    }
}

/// An upper estimate of the activation bytes one prompt token takes on the GPU engine: per layer type, every
/// linear's output in f32 twice (the stacked projection and the copy it is split or activated into) and its input
/// three bytes a value (the bf16 cast and the FP8 quantization the GEMM reads), the MLP once (every layer type
/// shares its widths, and the engine's scratch pool keeps one buffer per length), plus four f32 hidden
/// rows. Routed experts count `experts_per_token` of them. On the 27B FP8 geometry this gives 0.91 MiB against the
/// 0.69-0.72 MiB a token the engine's free memory showed at chunks of 512 to 2048.
pub fn scratch_bytes_per_token(spec: &ModelSpec) -> u64 {
    let prefix = format!("{}.layers.", spec.runtime.prefix);
    let routed = spec
        .moe
        .map_or(u64::MAX, |m| u64::from(m.experts_per_token));
    let cost = |out: u64, inp: u64| out.saturating_mul(8).saturating_add(inp.saturating_mul(3));
    // The first layer of each type stands for its type.
    let mut firsts: Vec<(LayerKind, usize)> = Vec::new();
    for (i, &k) in spec.layers.iter().enumerate() {
        if !firsts.iter().any(|&(seen, _)| seen == k) {
            firsts.push((k, i));
        }
    }
    let (mut mlp, mut mixers) = (0u64, 0u64);
    for (_, layer) in firsts {
        let (mut this_mlp, mut mixer) = (0u64, 0u64);
        for l in &spec.runtime.linears {
            let Some(rest) = l.module.strip_prefix(&prefix) else {
                continue;
            };
            let Some((index, name)) = rest.split_once('.') else {
                continue;
            };
            if index.parse::<usize>() != Ok(layer) {
                continue;
            }
            if expert_index(name).is_some_and(|e| e >= routed) {
                continue;
            }
            let c = cost(l.out_features, l.in_features);
            if name.starts_with("mlp.") {
                this_mlp = this_mlp.saturating_add(c);
            } else {
                mixer = mixer.saturating_add(c);
            }
        }
        mlp = mlp.max(this_mlp);
        mixers = mixers.saturating_add(mixer);
    }
    let streams = HIDDEN_STREAMS
        .saturating_mul(4)
        .saturating_mul(spec.hidden_size);
    streams.saturating_add(mlp).saturating_add(mixers)
}

/// `mlp.experts.7.up_proj` -> 7.
fn expert_index(name: &str) -> Option<u64> {
    let rest = name.split_once("experts.")?.1;
    rest.split('.').next()?.parse().ok()
}

/// The chunk for a plan whose decode runs on `unit` and whose decode pool's ledger is `decode`: the longest of
/// `min(MAX_TOKENS, max_model_len)` and 1024 whose scratch beyond [`BASE_TOKENS`] fits the ledger's free bytes, else
/// the base chunk. `fits` is false for a plan that does not fit (it keeps the base chunk and charges nothing).
pub fn choose(
    spec: &ModelSpec,
    unit: &ComputeUnit,
    max_model_len: u64,
    decode: Option<&Ledger>,
    fits: bool,
) -> PromptChunk {
    let per_token = scratch_bytes_per_token(spec);
    let base = |reason: String| PromptChunk {
        tokens: BASE_TOKENS,
        scratch_bytes_per_token: per_token,
        extra_scratch_bytes: 0,
        reason,
    };
    if unit.kind != ComputeKind::Gpu {
        return base(format!(
            "the engine's default on `{}` ({:?}): longer chunks were measured to help only the GPU's GEMMs",
            unit.id, unit.kind
        ));
    }
    let want = MAX_TOKENS.min(max_model_len);
    if want <= BASE_TOKENS {
        return base(format!(
            "the engine's default: max_model_len {max_model_len} fits one chunk of {BASE_TOKENS}"
        ));
    }
    let Some(ledger) = decode.filter(|_| fits) else {
        return base(
            "the engine's default: the plan does not fit, so no memory is left for more".into(),
        );
    };
    let extra = |t: u64| (t - BASE_TOKENS).saturating_mul(per_token);
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    for tokens in [want, want.min(1024)] {
        if tokens > BASE_TOKENS && extra(tokens) <= ledger.free_bytes {
            return PromptChunk {
                tokens,
                scratch_bytes_per_token: per_token,
                extra_scratch_bytes: extra(tokens),
                reason: format!(
                    "{tokens} tokens: longer GEMMs (1.11-1.16x prompt rate at 1024-2048 against 512 on CUDA); \
                     {:.0} MiB of scratch beyond the {BASE_TOKENS} the runtime overhead holds, out of {:.0} MiB \
                     free in `{}`",
                    mib(extra(tokens)),
                    mib(ledger.free_bytes),
                    ledger.pool
                ),
            };
        }
    }
    base(format!(
        "the engine's default: {:.0} MiB free in `{}` is less than a chunk of 1024 needs beyond {BASE_TOKENS} \
         ({:.0} MiB)",
        mib(ledger.free_bytes),
        ledger.pool,
        mib(extra(want.min(1024)))
    ))
}

/// Charges the chunk's extra scratch to `ledger` out of its free bytes ([`choose`] never picks more than is free).
pub fn charge(ledger: &mut Ledger, chunk: &PromptChunk) {
    let extra = chunk.extra_scratch_bytes.min(ledger.free_bytes);
    ledger.prompt_scratch_bytes = ledger.prompt_scratch_bytes.saturating_add(extra);
    ledger.free_bytes -= extra;
}
