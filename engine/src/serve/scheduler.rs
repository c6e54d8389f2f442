//! The engine's step loop on its own OS thread: continuous batching.
//!
//! Requests arrive through a channel ([`Msg::Submit`]) and wait in a queue; between two steps the loop drops the
//! ones whose client has gone (their event channel is closed), admits waiting ones into free slots while the
//! worst-case page budget of everything running still fits the cache (a request waits rather than evicting a
//! running one), and runs one [`Engine::step`]: fresh sequences prefill their prompt, running ones decode one
//! token each in one shared pass over the weights. Each sequence samples with its own seeded generator, so its
//! tokens do not depend on what else runs beside it. Text goes back as deltas, with stop strings cut and a
//! partial stop string or an incomplete UTF-8 character held back until it resolves.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use kernels::sampling::{Pcg32, SamplingParams};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Shared;
use crate::cache::PAGE_SIZE;
use crate::generate::{penalize, pick, FinishReason, GenerateOptions};
use crate::tokenizer::{Detok, Tokenizer};
use crate::{Draw, Engine, Picked};

/// What the HTTP side sends to the loop.
pub(crate) enum Msg {
    Submit(Box<Job>),
    /// Refuse new requests (503); the accepted ones, running or queued, still finish.
    Drain,
    /// Cancel everything and end the thread.
    Stop,
}

/// One request, tokenized and validated.
pub(crate) struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub repetition_penalty: f32,
    pub stop_tokens: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// `Some(n)`: report each token's logprob and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
}

/// One generated token with its log-probability, for `logprobs`.
#[derive(Debug, Clone)]
pub(crate) struct TokenLogprob {
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// What the loop sends back for one request.
#[derive(Debug)]
pub(crate) enum Event {
    /// New text (possibly empty when only held-back tokens arrived) and, with `logprobs`, the tokens since the
    /// last delta.
    Delta {
        text: String,
        tokens: Vec<TokenLogprob>,
    },
    Done {
        finish: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Error {
        status: u16,
        message: String,
    },
}

struct Seq {
    job: Box<Job>,
    slot: usize,
    opts: GenerateOptions,
    rng: Pcg32,
    seen: Vec<u32>,
    generated: usize,
    next: u32,
    prefilled: bool,
    /// Prompt tokens already in the cache: a long prompt is fed a chunk per step, between the decode tokens of the
    /// running sequences, so one new request does not stall every stream for its whole prefill.
    fed: usize,
    detok: Detok,
    logprobs: Vec<TokenLogprob>,
    last_token: Option<Instant>,
}

/// Prompt tokens a sequence feeds per step: longer prompts are prefilled over several steps, each sharing the
/// step with the running sequences' decode tokens, so inter-token latency stays bounded while a long prompt joins.
const PROMPT_CHUNK: usize = 256;

/// The next piece of `s`'s prompt to feed.
fn piece(s: &Seq) -> &[u32] {
    let end = (s.fed + PROMPT_CHUNK).min(s.job.prompt.len());
    &s.job.prompt[s.fed..end]
}

/// The worst-case cache pages a request can take.
fn pages_for(job: &Job) -> usize {
    (job.prompt.len() + job.max_tokens).div_ceil(PAGE_SIZE)
}

fn log_softmax_top(
    logits: &[f32],
    id: u32,
    top: usize,
    tok: &Tokenizer,
) -> (f32, Vec<(String, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max
        + logits
            .iter()
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
    let lp = logits
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY)
        - lse;
    let mut best: Vec<(usize, f32)> = Vec::new();
    if top > 0 {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = top.min(idx.len());
        idx.select_nth_unstable_by(k.saturating_sub(1), |&a, &b| {
            logits[b].total_cmp(&logits[a]).then(a.cmp(&b))
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        best = idx.into_iter().map(|i| (i, logits[i] - lse)).collect();
    }
    (
        lp,
        best.into_iter()
            .map(|(i, l)| (tok.token_text(i as u32), l))
            .collect(),
    )
}

/// The loop: runs until [`Msg::Stop`] or until every sender is gone and nothing runs.
pub(crate) fn run(mut engine: Engine, tok: Arc<Tokenizer>, rx: Receiver<Msg>, shared: Arc<Shared>) {
    let mut pending: VecDeque<Box<Job>> = VecDeque::new();
    let mut active: Vec<Seq> = Vec::new();
    let mut draining = false;
    let mut open = true;
    let reject = |job: Box<Job>, shared: &Shared, msg: &str| {
        shared.queued.fetch_sub(1, Ordering::SeqCst);
        let _ = job.events.send(Event::Error {
            status: 503,
            message: msg.into(),
        });
    };
    loop {
        // Intake: block only when there is nothing to run.
        let mut msgs = Vec::new();
        if active.is_empty() && pending.is_empty() {
            if !open {
                break;
            }
            match rx.recv() {
                Ok(m) => msgs.push(m),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(m) => msgs.push(m),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        for m in msgs {
            match m {
                Msg::Submit(job) if draining => reject(job, &shared, "the server is shutting down"),
                Msg::Submit(job) => pending.push_back(job),
                // Requests already accepted (running or queued) still finish; new ones are refused.
                Msg::Drain => draining = true,
                Msg::Stop => {
                    for job in pending.drain(..) {
                        reject(job, &shared, "the server is shutting down");
                    }
                    for s in active.drain(..) {
                        engine.leave(s.slot);
                        shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                        let _ = s.job.events.send(Event::Error {
                            status: 503,
                            message: "cancelled: the server is shutting down".into(),
                        });
                    }
                    shared.running.store(0, Ordering::SeqCst);
                    return;
                }
            }
        }

        // Clients that went away free their place before the step.
        pending.retain(|j| {
            let gone = j.events.is_closed();
            if gone {
                shared.queued.fetch_sub(1, Ordering::SeqCst);
                shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        active.retain(|s| {
            let gone = s.job.events.is_closed();
            if gone {
                engine.leave(s.slot);
                shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });

        // Admission: a free slot and room in the cache for the whole request, oldest first.
        let mut committed: usize = active.iter().map(|s| pages_for(&s.job)).sum();
        while let Some(job) = pending.front() {
            let need = pages_for(job);
            if committed + need > engine.caches.pages {
                break;
            }
            let Some(slot) = engine.join() else { break };
            let Some(job) = pending.pop_front() else {
                engine.leave(slot);
                break;
            };
            shared.queued.fetch_sub(1, Ordering::SeqCst);
            committed += need;
            let opts = GenerateOptions {
                max_new_tokens: job.max_tokens,
                sampling: job.sampling,
                seed: job.seed,
                repetition_penalty: job.repetition_penalty,
                stop_tokens: job.stop_tokens.clone(),
                keep_logits: false,
            };
            active.push(Seq {
                rng: Pcg32::new(job.seed, 0),
                seen: job.prompt.clone(),
                slot,
                opts,
                generated: 0,
                next: 0,
                prefilled: false,
                fed: 0,
                detok: Detok::new(),
                logprobs: Vec::new(),
                last_token: None,
                job,
            });
        }
        shared.running.store(active.len(), Ordering::SeqCst);
        shared.cache_pages_used.store(
            engine.caches.pages - engine.caches.free_pages(),
            Ordering::Relaxed,
        );
        if active.is_empty() {
            continue;
        }

        let work: Vec<(usize, &[u32])> = active
            .iter()
            .map(|s| {
                if s.prefilled {
                    (s.slot, std::slice::from_ref(&s.next))
                } else {
                    (s.slot, piece(s))
                }
            })
            .collect();
        let prompt_tokens: usize = active
            .iter()
            .filter(|s| !s.prefilled)
            .map(|s| piece(s).len())
            .sum();
        // A sequence whose next token needs nothing but its draw (no logprobs, no repetition penalty, its prompt
        // fed) draws it where the logits are: on CUDA the device's sampler, so only the id crosses the link.
        let mut draws: Vec<Option<Draw>> = active
            .iter()
            .map(|s| {
                let samples = s.prefilled || s.fed + PROMPT_CHUNK >= s.job.prompt.len();
                let plain = s.job.logprobs.is_none() && s.opts.repetition_penalty == 1.0;
                (samples && plain).then(|| Draw {
                    params: s.opts.sampling,
                    rng: s.rng.clone(),
                    token: 0,
                })
            })
            .collect();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.step_pick(&work, &mut draws)
        }));
        let picked = match result {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                fail_all(&mut engine, &mut active, &shared, &e.to_string());
                continue;
            }
            Err(_) => {
                fail_all(&mut engine, &mut active, &shared, "the engine panicked");
                continue;
            }
        };
        shared
            .metrics
            .prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);

        let now = Instant::now();
        let mut finished = Vec::new();
        // The last events go out once the counters and gauges say the request is over, so a client that reads
        // /metrics after its response sees it counted.
        let mut done = Vec::new();
        for (i, ((s, picked), draw)) in active.iter_mut().zip(picked).zip(draws).enumerate() {
            if !s.prefilled {
                s.fed = (s.fed + PROMPT_CHUNK).min(s.job.prompt.len());
                if s.fed < s.job.prompt.len() {
                    // More of the prompt to feed: nothing to sample yet.
                    continue;
                }
            }
            s.prefilled = true;
            let (id, row) = match (picked, draw) {
                (Picked::Token(id), Some(d)) => {
                    s.rng = d.rng;
                    (Ok(id), None)
                }
                (Picked::Logits(mut row), _) => {
                    penalize(&mut row, &s.seen, s.opts.repetition_penalty);
                    (pick(&row, &s.opts, &mut s.rng), Some(row))
                }
                (Picked::Token(_), None) => (
                    Err(crate::EngineError::Kernel(
                        "a token drawn where none was asked".into(),
                    )),
                    None,
                ),
            };
            let id = match id {
                Ok(id) => id,
                Err(e) => {
                    shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
                    done.push((
                        s.job.events.clone(),
                        Event::Error {
                            status: 500,
                            message: e.to_string(),
                        },
                    ));
                    finished.push(i);
                    continue;
                }
            };
            if let (Some(top), Some(row)) = (s.job.logprobs, &row) {
                let (lp, alts) = log_softmax_top(row, id, top, &tok);
                s.logprobs.push(TokenLogprob {
                    text: tok.token_text(id),
                    logprob: lp,
                    top: alts,
                });
            }
            s.generated += 1;
            s.seen.push(id);
            s.next = id;
            shared
                .metrics
                .generation_tokens
                .fetch_add(1, Ordering::Relaxed);
            match s.last_token {
                None => shared
                    .metrics
                    .ttft
                    .observe(now.duration_since(s.job.submitted).as_secs_f64()),
                Some(t) => shared
                    .metrics
                    .itl
                    .observe(now.duration_since(t).as_secs_f64()),
            }
            s.last_token = Some(now);
            let eos = s.opts.stop_tokens.contains(&id);
            let full = s.generated >= s.job.max_tokens || engine.len(s.slot) + 1 > engine.max_len;
            let last = eos || full;
            if !eos {
                s.detok.push(&tok, id, last);
            }
            let (text, hit_stop) = s.detok.release(&s.job.stop_strings, last);
            let finish = if eos || hit_stop {
                Some(FinishReason::Stop)
            } else if full {
                Some(FinishReason::Length)
            } else {
                None
            };
            if !text.is_empty() || !s.logprobs.is_empty() || finish.is_some() {
                let _ = s.job.events.send(Event::Delta {
                    text,
                    tokens: std::mem::take(&mut s.logprobs),
                });
            }
            if let Some(finish) = finish {
                match finish {
                    FinishReason::Stop => &shared.metrics.finished_stop,
                    FinishReason::Length => &shared.metrics.finished_length,
                }
                .fetch_add(1, Ordering::Relaxed);
                done.push((
                    s.job.events.clone(),
                    Event::Done {
                        finish,
                        prompt_tokens: s.job.prompt.len(),
                        completion_tokens: s.generated,
                    },
                ));
                finished.push(i);
            }
        }
        for &i in finished.iter().rev() {
            let s = active.swap_remove(i);
            engine.leave(s.slot);
        }
        // Keep arrival order among the running (swap_remove moved the last one).
        active.sort_by_key(|s| s.job.submitted);
        shared.running.store(active.len(), Ordering::SeqCst);
        shared.cache_pages_used.store(
            engine.caches.pages - engine.caches.free_pages(),
            Ordering::Relaxed,
        );
        for (tx, ev) in done {
            let _ = tx.send(ev);
        }
    }
    shared.running.store(0, Ordering::SeqCst);
}

fn fail_all(engine: &mut Engine, active: &mut Vec<Seq>, shared: &Shared, msg: &str) {
    for s in active.drain(..) {
        engine.leave(s.slot);
        shared.metrics.errors.fetch_add(1, Ordering::Relaxed);
        let _ = s.job.events.send(Event::Error {
            status: 500,
            message: format!("engine: {msg}"),
        });
    }
}
