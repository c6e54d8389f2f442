//! Prompt attention on CUDA through the flash prefill kernels (bf16 tensor cores, `FlashChunk` in
//! `model/cuda.rs`) against the exact f32 slot kernel, on random checkpoints whose head dim the flash kernels take
//! (the parity fixtures' 16 and 32 are below it): a first chunk, a chunk after a 512-token cached prefix, a second
//! sequence on another slot continuing after a ragged 41-token prefix, a sliding window shorter than the prefix,
//! and the decode steps after them (which read the caches the prompt left). Skips where there is no CUDA device.

mod common;
use common::{cuda_engine, cuda_here, rel_err, tokens};
use std::path::{Path, PathBuf};

use engine::{CudaOptions, Engine, EngineError};

/// A random checkpoint of a fixture's card with its attention heads widened to `head_dim`.
fn card(name: &str, head_dim: usize) -> PathBuf {
    common::random_card(name, &format!("flash-{name}-{head_dim}"), 11, |c| {
        c["head_dim"] = serde_json::json!(head_dim)
    })
}

fn engine_on(dir: &Path, flash: bool) -> Result<Engine, EngineError> {
    let opts = CudaOptions {
        slots: 2,
        max_len: 1024,
        // The fast path in both arms (the same linears and DeltaNet kernels): only prompt attention differs.
        precise: false,
        gemm_copies: false,
        flash_prefill_attention: flash,
        ..Default::default()
    };
    cuda_engine(dir, opts)
}

/// The logits of every step: a 700-token prompt on slot 0 (chunks of 512 and 188), then on slot 1 a 41-token
/// prompt and a 60-token chunk after it, then three decode steps of both sequences together.
fn run(dir: &Path, flash: bool) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut e = engine_on(dir, flash)?;
    let vocab = e.model.vocab() as u32;
    let (a, b) = (e.join().unwrap(), e.join().unwrap());
    let mut out = Vec::new();
    out.extend(e.step(&[(a, &tokens(700, 1, vocab))])?);
    out.extend(e.step(&[(b, &tokens(41, 2, vocab))])?);
    out.extend(e.step(&[(b, &tokens(60, 3, vocab))])?);
    for s in 0..3u32 {
        let (ta, tb) = ([(s * 7 + 1) % vocab], [(s * 11 + 3) % vocab]);
        out.extend(e.step(&[(a, &ta[..]), (b, &tb[..])])?);
    }
    Ok(out)
}

/// The 60-token chunk as a fresh prompt: what a chunk that ignored its cached prefix would give.
fn prefix_dropped(dir: &Path) -> Result<Vec<f32>, EngineError> {
    let mut e = engine_on(dir, false)?;
    let vocab = e.model.vocab() as u32;
    let s = e.join().unwrap();
    Ok(e.step(&[(s, &tokens(60, 3, vocab))])?.remove(0))
}

#[test]
fn flash_prefill_attention_agrees_with_the_exact_slot_kernel() {
    if !cuda_here() {
        return;
    }
    let mut table =
        String::from("| card | head_dim | step | flash vs exact | prefix dropped vs exact |\n|---|---|---|---|---|\n");
    let mut failures = Vec::new();
    for (name, head_dim) in [
        ("gemma3-bf16", 64),
        ("llama-bf16", 128),
        ("qwen3_5-fp8", 256),
    ] {
        let dir = card(name, head_dim);
        // An engine error fails this card and the test, after every card has run and the table is printed.
        let runs = run(&dir, true).and_then(|f| Ok((f, run(&dir, false)?, prefix_dropped(&dir)?)));
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
        let (flash, exact, dropped) = match runs {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{name} (head_dim {head_dim}): {e}"));
                continue;
            }
        };
        let wrong = rel_err(&dropped, &exact[2]);
        for (i, (f, x)) in flash.iter().zip(&exact).enumerate() {
            let err = rel_err(f, x);
            table += &format!("| {name} | {head_dim} | {i} | {err:.2e} | {wrong:.2e} |\n");
            // bf16 queries, keys, values and probabilities move these amplified random models' logits by less
            // than a chunk that lost its prefix does (3e-2 .. 3e-1 of the largest logit, with one attention
            // layer in four on qwen3_5 and every layer attending on the others).
            if !err.is_finite() || err > 3e-2 || err * 3.0 > wrong {
                failures.push(format!(
                    "{name} step {i}: error {err:.2e} (prefix dropped: {wrong:.2e})"
                ));
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}
