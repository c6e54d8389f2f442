//! Several sequences at once: sequences join and leave between steps, single tokens of several sequences share
//! one decode step, and every sequence's tokens are exactly what it generates alone (caches per slot, pages handed
//! out and returned). Also proves the fast paths ran: on an AVX-512 machine the attention, GDN and norm kernels
//! report their AVX-512 builds.

mod common;
use common::{cuda_here, rel_err};
use std::path::Path;

use engine::checkpoint::Checkpoint;
use engine::generate::{draw, generate, GenerateOptions};
use engine::{Device, Draw, Engine, Model, Picked, WeightMode};
use kernels::cpu::Isa;
use kernels::sampling::{Pcg32, SamplingParams};

fn engine(name: &str, slots: usize) -> Engine {
    engine_on(name, slots, Device::Cpu)
}

fn engine_on(name: &str, slots: usize, device: Device) -> Engine {
    engine_with(name, slots, device, true, false)
}

/// An engine on `device`; on CUDA `precise` picks the f32 builds (else the converted fast path: tile GEMVs on bf16
/// activations) and `invariant` runs every decode step at `slots` rows (`--batch-invariant`).
fn engine_with(name: &str, slots: usize, device: Device, precise: bool, invariant: bool) -> Engine {
    // EDGEFIT_FIXTURES: where a test binary built here finds the fixtures on another machine (the GPU runs).
    let dir = std::env::var_os("EDGEFIT_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
        .join(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let model = Model::load(&ck, WeightMode::Exact, |_, _| {}).unwrap();
    match device {
        Device::Cpu => Engine::new(model, slots, 160).unwrap(),
        Device::Cuda => Engine::on_cuda(
            model,
            engine::CudaOptions {
                slots,
                max_len: 160,
                precise,
                batch_invariant: invariant,
                ..Default::default()
            },
            |_, _| Ok(0),
        )
        .unwrap(),
    }
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: SamplingParams::GREEDY,
        seed: 0,
        repetition_penalty: 1.0,
        stop_tokens: vec![],
        keep_logits: false,
    }
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % 256)
        .collect()
}

/// Runs three sequences that join at different steps and leave early or late, in shared decode steps, and checks
/// each against the same sequence run alone.
fn interleaved_equals_alone(name: &str, device: Device) {
    interleaved_equals_alone_on(name, &|slots| engine_on(name, slots, device), 1);
}

/// [`interleaved_equals_alone`] with engines from `make(slots)`, the single runs on one of `alone_slots` slots.
fn interleaved_equals_alone_on(name: &str, make: &dyn Fn(usize) -> Engine, alone_slots: usize) {
    let mut alone = make(alone_slots);
    let prompts = [prompt(1, 70), prompt(2, 9), prompt(3, 33)];
    let steps = [12usize, 5, 9];
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .zip(steps)
        .map(|(p, n)| generate(&mut alone, p, &greedy(n), |_| {}).unwrap().tokens)
        .collect();

    let mut e = make(3);
    let vocab = e.model.vocab();
    let argmax = |l: &[f32]| kernels::ops::argmax(&l[..vocab]).unwrap() as u32;
    // Sequence i joins at step `join[i]`.
    let join = [0usize, 2, 4];
    let mut slots = [None; 3];
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    for step in 0..20 {
        let mut work: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut who = Vec::new();
        for i in 0..3 {
            if step == join[i] {
                slots[i] = Some(e.join().unwrap());
                work.push((slots[i].unwrap(), prompts[i].clone()));
                who.push(i);
            } else if let Some(s) = slots[i] {
                work.push((s, vec![*got[i].last().unwrap()]));
                who.push(i);
            }
        }
        if work.is_empty() {
            continue;
        }
        let refs: Vec<(usize, &[u32])> = work.iter().map(|(s, t)| (*s, t.as_slice())).collect();
        let logits = e.step(&refs).unwrap();
        for (j, &i) in who.iter().enumerate() {
            got[i].push(argmax(&logits[j]));
            if got[i].len() == steps[i] {
                e.leave(slots[i].take().unwrap());
            }
        }
    }
    assert_eq!(
        got, want,
        "{name}: interleaved sequences must equal their single runs"
    );
    assert_eq!(
        e.caches.free_pages(),
        e.caches.pages,
        "{name}: every page returned"
    );
}

#[test]
fn sequences_join_and_leave_between_shared_steps() {
    for name in ["qwen3_5-f32", "spark2_5-bf16", "gemma3-bf16", "qwen3-f32"] {
        interleaved_equals_alone(name, Device::Cpu);
    }
}

/// On CUDA's converted fast path the batched step is not the single one bit for bit (the FP8 GEMV runs another
/// kernel at one row than at several, the DeltaNet step another split); with `batch_invariant` every decode step
/// runs at the engine's slot count, so each sequence's tokens equal its single run on an engine of as many slots.
#[test]
fn cuda_batch_invariant_fast_path_sequences_equal_alone() {
    if !cuda_here() {
        return;
    }
    for name in ["qwen3_5-fp8", "qwen3_5-nvfp4", "qwen3_5-f32", "gemma3-bf16"] {
        let make = |slots| engine_with(name, slots, Device::Cuda, false, true);
        interleaved_equals_alone_on(name, &make, 3);
    }
}

/// The same on CUDA: batched decode steps (the DeltaNet caches indexed by slot inside the kernel, one recorded graph
/// per batch size serving every set of slots) equal each sequence alone, token for token.
#[test]
fn cuda_sequences_join_and_leave_between_shared_steps() {
    if !cuda_here() {
        return;
    }
    for name in [
        "qwen3_5-f32",
        "qwen3_5-fp8",
        "spark2_5-bf16",
        "gemma3-bf16",
        "qwen3-f32",
    ] {
        interleaved_equals_alone(name, Device::Cuda);
    }
}

#[test]
fn a_prompt_past_the_context_or_a_full_cache_is_refused_not_truncated() {
    let mut e = engine("qwen3-f32", 1);
    let long = prompt(4, 161);
    let err = generate(&mut e, &long, &greedy(1), |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_model_len 160"), "{err}");
    // A token budget that overflows with the prompt is refused too, not wrapped around.
    let err = generate(&mut e, &prompt(4, 20), &greedy(usize::MAX), |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_model_len 160"), "{err}");
    // The slot came back: a fitting prompt still runs.
    generate(&mut e, &prompt(4, 20), &greedy(2), |_| {}).unwrap();
    let s = e.join().unwrap();
    assert!(e.join().is_none(), "one slot only");
    e.leave(s);
}

#[test]
fn the_avx512_kernels_ran() {
    if Isa::detected() != Isa::Avx512 {
        println!(
            "skipped: this CPU has no AVX-512 (detected {:?})",
            Isa::detected()
        );
        return;
    }
    let before = kernels::ops::seq_isa_calls(Isa::Avx512);
    let mut e = engine("qwen3_5-f32", 1);
    generate(&mut e, &prompt(5, 70), &greedy(3), |_| {}).unwrap();
    let ran = kernels::ops::seq_isa_calls(Isa::Avx512) - before;
    // Per token step at least: 4 layers x 2 norms, the GDN or attention kernel, RoPE on the attention layer.
    assert!(ran >= 3 * 10, "only {ran} AVX-512 sequence-kernel calls");
}

/// A prompt fed in pieces (a prefill, then chunks after the cached prefix: the path long prompts and a server's
/// chunked prefill take) gives the logits of the prompt run in one prefill, and the same greedy continuation.
#[test]
fn a_prompt_in_chunks_equals_the_prompt_at_once() {
    prompt_in_chunks(Device::Cpu, 1e-4);
}

/// On CUDA the pieces run different kernels (the DeltaNet prefill over 30 and 49 tokens, its decode step for one;
/// the f32 builds): the same logits within 1e-3 of the largest.
#[test]
fn cuda_a_prompt_in_chunks_equals_the_prompt_at_once() {
    if cuda_here() {
        prompt_in_chunks(Device::Cuda, 1e-3);
    }
}

fn prompt_in_chunks(device: Device, bound: f32) {
    for name in [
        "qwen3_5-f32",
        "qwen3_5-nvfp4",
        "spark2_5-bf16",
        "gemma3-bf16",
        "qwen3-f32",
        "llama-bf16",
    ] {
        let p = prompt(6, 80);
        let mut whole = engine_on(name, 1, device);
        let s = whole.join().unwrap();
        let want = whole.step(&[(s, &p)]).unwrap().remove(0);
        let mut parts = engine_on(name, 1, device);
        let c = parts.join().unwrap();
        let mut got = Vec::new();
        // 30 as a prefill (past the 8-token windows), then 1 token, then 49 across the 64-token DeltaNet chunk.
        for piece in [&p[..30], &p[30..31], &p[31..]] {
            got = parts.step(&[(c, piece)]).unwrap().remove(0);
        }
        let err = rel_err(&got, &want);
        assert!(
            err < bound,
            "{name} on {device:?}: chunked prompt logits differ by {err:.2e} of the largest"
        );
        let mut a = kernels::ops::argmax(&want).unwrap() as u32;
        let mut b = kernels::ops::argmax(&got).unwrap() as u32;
        for _ in 0..8 {
            assert_eq!(a, b, "{name}: continuations differ");
            a = kernels::ops::argmax(&whole.step(&[(s, &[a])]).unwrap()[0]).unwrap() as u32;
            b = kernels::ops::argmax(&parts.step(&[(c, &[b])]).unwrap()[0]).unwrap() as u32;
        }
    }
}

/// `step_pick` draws what the host draws from `step`'s logits with the same generators, and leaves each generator
/// where the host's is: a prompt row (drawn on the host), decode rows drawn (on CUDA by the device's sampler, only
/// the ids crossing), and a row in the same steps that hands back its logits instead.
fn drawn_equals_host(name: &str, device: Device) {
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
    };
    let mut a = engine_on(name, 3, device);
    let mut b = engine_on(name, 3, device);
    let prompts = [prompt(4, 21), prompt(5, 8), prompt(6, 13)];
    let mut rng_a: Vec<Pcg32> = (0..2).map(|i| Pcg32::new(7 + i, 0)).collect();
    let mut rng_b = rng_a.clone();
    let slots_a: Vec<usize> = (0..3).map(|_| a.join().unwrap()).collect();
    let slots_b: Vec<usize> = (0..3).map(|_| b.join().unwrap()).collect();
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    for step in 0..8 {
        let work_a: Vec<(usize, &[u32])> = slots_a
            .iter()
            .zip(&next)
            .map(|(&s, t)| (s, t.as_slice()))
            .collect();
        let work_b: Vec<(usize, &[u32])> = slots_b
            .iter()
            .zip(&next)
            .map(|(&s, t)| (s, t.as_slice()))
            .collect();
        // Rows 0 and 1 draw; row 2 hands back its logits (and follows its argmax).
        let mut draws: Vec<Option<Draw>> = (0..3)
            .map(|i| {
                (i < 2).then(|| Draw {
                    params,
                    rng: rng_a[i].clone(),
                    token: 0,
                })
            })
            .collect();
        let picked = a.step_pick(&work_a, &mut draws).unwrap();
        let logits = b.step(&work_b).unwrap();
        let mut new_next = Vec::new();
        for i in 0..3 {
            let want_logits = &logits[i];
            let tok = match (&picked[i], i < 2) {
                (Picked::Token(t), true) => {
                    let want = draw(want_logits, &params, &mut rng_b[i]).unwrap();
                    assert_eq!(*t, want, "{name} step {step} row {i}: drawn token");
                    rng_a[i] = draws[i].take().unwrap().rng;
                    assert_eq!(rng_a[i], rng_b[i], "{name} step {step} row {i}: generator");
                    *t
                }
                (Picked::Logits(l), false) => {
                    assert_eq!(l, want_logits, "{name} step {step}: the logits row");
                    kernels::ops::argmax(l).unwrap() as u32
                }
                (p, _) => panic!("{name} step {step} row {i}: unexpected {p:?}"),
            };
            new_next.push(vec![tok]);
        }
        next = new_next;
    }
}

#[test]
fn draws_in_the_step_equal_the_hosts() {
    for name in ["qwen3_5-f32", "gemma3-bf16"] {
        drawn_equals_host(name, Device::Cpu);
    }
}

#[test]
fn cuda_draws_on_the_device_equal_the_hosts() {
    if !cuda_here() {
        return;
    }
    for name in ["qwen3_5-f32", "qwen3_5-fp8", "gemma3-bf16"] {
        drawn_equals_host(name, Device::Cuda);
    }
}

/// A draw list that does not match the work is refused before anything runs: no token is cached.
#[test]
fn step_pick_refuses_mismatched_draws() {
    let mut e = engine("qwen3-f32", 2);
    let s = e.join().unwrap();
    let p = prompt(9, 5);
    let err = e.step_pick(&[(s, &p)], &mut []).unwrap_err().to_string();
    assert!(err.contains("0 draws for 1 sequences"), "{err}");
    assert_eq!(e.len(s), 0, "nothing cached");
    // The same work with one entry runs.
    let mut draws = vec![None];
    let picked = e.step_pick(&[(s, &p)], &mut draws).unwrap();
    assert!(matches!(&picked[0], Picked::Logits(l) if l.len() == e.model.vocab()));
    assert_eq!(e.len(s), 5);
}
