//! One sequence from a prompt to a stop: greedy or sampled (temperature, top-k, top-p, seed, repetition penalty),
//! stopping at a stop token, a stop string, or the token budget, timing prefill and decode separately.

use std::time::Instant;

use kernels::sampling::{self, Pcg32, SamplingParams};

use crate::{Engine, EngineError};

/// How to pick tokens and when to stop.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// HF's repetition penalty: logits of tokens already in the sequence are divided by it when positive and
    /// multiplied when negative; 1 turns it off.
    pub repetition_penalty: f32,
    pub stop_tokens: Vec<u32>,
    /// Keep every step's logits (`--dump-logits`).
    pub keep_logits: bool,
}

/// Why generation ended, as the OpenAI API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
}

/// What a call produced and how long it took.
#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    /// `[steps, vocab]` when asked for.
    pub logits: Vec<f32>,
    pub ttft_s: f64,
    pub prefill_tokens: usize,
    pub prefill_s: f64,
    pub decode_tokens: usize,
    pub decode_s: f64,
}

/// Applies the repetition penalty to `logits` for every id in `seen`.
pub fn penalize(logits: &mut [f32], seen: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut done = std::collections::HashSet::new();
    for &t in seen {
        if let Some(l) = logits.get_mut(t as usize) {
            if done.insert(t) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
}

/// Picks the next token from one row of logits.
pub fn pick(logits: &[f32], opts: &GenerateOptions, rng: &mut Pcg32) -> Result<u32, EngineError> {
    draw(logits, &opts.sampling, rng)
}

/// The token `params` draws from one row of logits with `rng`: the argmax when greedy (first on ties, `rng`
/// untouched), else [`sampling::sample`].
pub fn draw(logits: &[f32], params: &SamplingParams, rng: &mut Pcg32) -> Result<u32, EngineError> {
    let id = if params.temperature == 0.0 {
        kernels::ops::argmax(logits)
    } else {
        sampling::sample(logits, params, rng)
    }
    .map_err(crate::model::kerr)?;
    Ok(id as u32)
}

/// Runs `prompt` through a fresh sequence of `engine` and decodes until a stop; `on_token` sees each new id as it
/// is chosen (streaming). The sequence's slot is freed before returning, on success or error.
pub fn generate(
    engine: &mut Engine,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Generation, EngineError> {
    generate_until(engine, prompt, opts, |id| {
        on_token(id);
        true
    })
}

/// [`generate`] whose `on_token` also decides whether to go on: returning `false` ends generation with
/// [`FinishReason::Stop`] after that token (a stop string matched in the text, say).
pub fn generate_until(
    engine: &mut Engine,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generation, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Request("the prompt has no tokens".into()));
    }
    let total = prompt.len().checked_add(opts.max_new_tokens);
    if total.is_none_or(|n| n > engine.max_len) {
        return Err(EngineError::Request(format!(
            "prompt ({}) + max_new_tokens ({}) exceed max_model_len {}",
            prompt.len(),
            opts.max_new_tokens,
            engine.max_len
        )));
    }
    let slot = engine
        .join()
        .ok_or_else(|| EngineError::Request("no free sequence slot".into()))?;
    let r = run(engine, slot, prompt, opts, &mut on_token);
    engine.leave(slot);
    r
}

fn run(
    engine: &mut Engine,
    slot: usize,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Result<Generation, EngineError> {
    let mut rng = Pcg32::new(opts.seed, 0);
    let mut seen: Vec<u32> = prompt.to_vec();
    let mut tokens = Vec::new();
    let mut dump = Vec::new();
    let t0 = Instant::now();
    let mut logits = engine.step(&[(slot, prompt)])?.remove(0);
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut finish = FinishReason::Length;
    let mut ttft_s = 0.0;
    // Plain greedy decoding needs no logits on the host: the engine picks the ids (on the device, on CUDA).
    let greedy =
        opts.sampling.temperature == 0.0 && opts.repetition_penalty == 1.0 && !opts.keep_logits;
    let mut ready: Option<u32> = None;
    let t1 = Instant::now();
    for step in 0..opts.max_new_tokens {
        let id = match ready.take() {
            Some(id) => id,
            None => {
                if opts.keep_logits {
                    dump.extend_from_slice(&logits);
                }
                penalize(&mut logits, &seen, opts.repetition_penalty);
                pick(&logits, opts, &mut rng)?
            }
        };
        if step == 0 {
            ttft_s = t0.elapsed().as_secs_f64();
        }
        tokens.push(id);
        seen.push(id);
        if !on_token(id) || opts.stop_tokens.contains(&id) {
            finish = FinishReason::Stop;
            break;
        }
        if step + 1 == opts.max_new_tokens {
            break;
        }
        let next = [(slot, std::slice::from_ref(&id))];
        if greedy {
            ready = engine.step_greedy(&next)?.first().copied();
        } else {
            logits = engine.step(&next)?.remove(0);
        }
    }
    let decode_tokens = tokens.len().saturating_sub(1);
    Ok(Generation {
        finish_reason: finish,
        logits: dump,
        ttft_s,
        prefill_tokens: prompt.len(),
        prefill_s,
        decode_tokens,
        decode_s: if decode_tokens > 0 {
            t1.elapsed().as_secs_f64() - (ttft_s - prefill_s)
        } else {
            0.0
        },
        tokens,
    })
}
