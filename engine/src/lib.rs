//! The engine executes a plan: it loads a Hugging Face checkpoint ([`checkpoint`]), converts every weight once into
//! the plan's weight path ([`model::Model::load`]), sizes the caches per layer type from the plan ([`cache`]), and
//! generates tokens with the kernels crate ([`Engine`]). It measures itself so that every run prints measured
//! against predicted.
//!
//! Start at [`Engine`]: sequences join ([`Engine::join`]), advance by prompt or by one token in shared steps
//! ([`Engine::step`]) and leave ([`Engine::leave`]) between steps — the continuous batching a server needs.
//! [`generate::generate`] drives one sequence from a prompt to a stop; [`serve`] puts the engine behind the
//! OpenAI HTTP API with continuous batching, and [`chat`] renders the checkpoint's chat template.

pub mod bench_checkpoint;
pub mod cache;
pub mod chat;
pub mod checkpoint;
pub mod fixtures;
pub mod generate;
mod gptq;
pub mod model;
pub mod profile;
pub mod serve;
pub mod setup;
pub mod tokenizer;

use std::path::Path;

pub use model::{CudaModel, CudaOptions, Model, Step, WeightMode};

/// Everything that can stop the engine, each naming the file, tensor or limit involved.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum EngineError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Checkpoint(String),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Model(Box<planner::model::ModelError>),
    #[error("{0}")]
    Plan(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("kernel: {0}")]
    Kernel(String),
    /// The driver had no memory left for an allocation (device, or page-locked host).
    #[error("kernel: {0}")]
    OutOfMemory(String),
    #[error("the KV cache is full: {needed} more pages needed, {free} free")]
    CacheFull { needed: usize, free: usize },
    #[error("{0}")]
    Request(String),
}

impl EngineError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        EngineError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Longest piece of a prompt one step runs: a prompt longer than this is prefilled in chunks, so activations stay
/// bounded (the chunked DeltaNet continues its state across chunks; attention reads the cached prefix).
pub const PREFILL_CHUNK: usize = 512;

/// `EDGEFIT_PREFILL_CHUNK` tokens, when set: a bench arm that trades activation memory for longer GEMMs, and
/// overrides the plan's chunk.
fn chunk_from_env() -> Result<Option<usize>, EngineError> {
    match std::env::var("EDGEFIT_PREFILL_CHUNK") {
        Err(_) => Ok(None),
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|&c| c >= 1)
            .map(Some)
            .ok_or_else(|| {
                EngineError::Request(format!(
                    "EDGEFIT_PREFILL_CHUNK={v}: expected a whole number of tokens, at least 1"
                ))
            }),
    }
}

/// The prompt chunk a new engine runs: [`PREFILL_CHUNK`] unless the environment says otherwise.
fn prefill_chunk() -> Result<usize, EngineError> {
    Ok(chunk_from_env()?.unwrap_or(PREFILL_CHUNK))
}

/// A loaded model with its caches: the unit that runs steps.
pub struct Engine {
    pub model: Model,
    pub caches: cache::Caches,
    /// Longest sequence (prompt + generated) a slot holds: the plan's `max_model_len`.
    pub max_len: usize,
    /// Tokens cached per slot.
    lens: Vec<usize>,
    /// Longest piece of a prompt one step runs ([`PREFILL_CHUNK`] unless the plan or the environment says
    /// otherwise).
    prefill_chunk: usize,
    /// The model placed on a CUDA device, when the engine runs there (`model` then holds only its facts).
    cuda: Option<Box<CudaModel>>,
}

/// Where an engine runs its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl Engine {
    /// Caches for `slots` sequences of at most `max_len` tokens, sized per layer type.
    pub fn new(model: Model, slots: usize, max_len: usize) -> Result<Engine, EngineError> {
        let window = model.spec.sliding_window.map(|w| w as usize);
        let caches = cache::Caches::new(
            &model.spec.layers,
            &model.attn_dims,
            window,
            model.gdn_dims,
            slots,
            max_len,
            // bf16 K/V, as the plan budgets them, except on the exact path (parity with f32 references).
            model.mode != WeightMode::Exact,
        )?;
        Ok(Engine {
            model,
            caches,
            max_len,
            lens: vec![0; slots],
            prefill_chunk: prefill_chunk()?,
            cuda: None,
        })
    }

    /// The engine on CUDA device 0: with `opts.cap`, device memory past it is held back first (the device then
    /// behaves as a card of that size); `admit(usable device bytes, the bytes of the caches the engine will
    /// allocate)` decides before anything else is allocated there and answers the bytes the plan needs on the
    /// device, then `model`'s weights move to the device (or, for the linears `opts.streamed` names, to pinned host
    /// memory) and the caches are allocated; refuses with "no CUDA device" where there is none.
    pub fn on_cuda(
        mut model: Model,
        opts: CudaOptions,
        admit: impl FnOnce(usize, u64) -> Result<u64, EngineError>,
    ) -> Result<Engine, EngineError> {
        let prefill_chunk = prefill_chunk()?;
        let gpu = kernels::cuda::Gpu::probe()
            .map_err(model::kerr)?
            .ok_or_else(|| EngineError::Unsupported("no CUDA device".into()))?;
        let (usable, ballast) = match opts.cap {
            Some(cap) => CudaModel::hold_back(&gpu, cap)?,
            None => (gpu.memory_info().map_err(model::kerr)?.0 as u64, None),
        };
        let caches = model.cuda_cache_sizes(opts.slots, opts.max_len)?;
        let need = admit(usize::try_from(usable).unwrap_or(usize::MAX), caches.bytes)?;
        let mut opts = opts;
        // The prefill GEMMs' copy of the quantized weights in the checkpoint layout, only where the device has
        // room for it beyond what the plan needs (with a GiB to spare), and never beside streamed weights.
        let second = model.quantized_bytes();
        opts.gemm_copies &= opts.streamed.is_empty()
            && usable.saturating_sub(need) >= second.saturating_add(1 << 30);
        let (slots, max_len) = (opts.slots, opts.max_len);
        let mut cuda = CudaModel::upload(gpu, &mut model, &opts, |_, _| {})?;
        cuda.keep(ballast);
        let caches = cache::Caches::bookkeeping(slots, max_len, cuda.cache_bytes)?;
        Ok(Engine {
            model,
            caches,
            max_len,
            lens: vec![0; slots],
            prefill_chunk,
            cuda: Some(Box::new(cuda)),
        })
    }

    /// Longest piece of a prompt one step runs.
    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Runs prompts in chunks of `tokens`, the plan's `[prompt_chunk]` (its ledger charged the activations a chunk
    /// longer than [`PREFILL_CHUNK`] takes), unless `EDGEFIT_PREFILL_CHUNK` overrides it.
    pub fn with_planned_chunk(mut self, tokens: u64) -> Result<Engine, EngineError> {
        self.prefill_chunk = match chunk_from_env()? {
            Some(c) => c,
            None => usize::try_from(tokens)
                .ok()
                .filter(|&c| c >= 1)
                .ok_or_else(|| {
                    EngineError::Plan(format!(
                        "the plan's prompt_chunk.tokens = {tokens}: expected a whole number of tokens, at least 1"
                    ))
                })?,
        };
        Ok(self)
    }

    /// Where the steps run.
    pub fn device(&self) -> Device {
        if self.cuda.is_some() {
            Device::Cuda
        } else {
            Device::Cpu
        }
    }

    /// The model on the device, when the engine runs on one.
    pub fn cuda(&self) -> Option<&CudaModel> {
        self.cuda.as_deref()
    }

    /// The model on the device, mutably (for its measurements).
    pub fn cuda_mut(&mut self) -> Option<&mut CudaModel> {
        self.cuda.as_deref_mut()
    }

    /// The weight path names the steps run, each once.
    pub fn paths(&self) -> Vec<&'static str> {
        match &self.cuda {
            Some(c) => c.paths(),
            None => self.model.paths(),
        }
    }

    /// [`Engine::step`] for greedy decoding: each sequence's argmax token instead of its logits. On CUDA the
    /// argmax runs on the device and only the ids cross the link.
    pub fn step_greedy(&mut self, work: &[(usize, &[u32])]) -> Result<Vec<u32>, EngineError> {
        if self.cuda.is_some() && !work.is_empty() && work.iter().all(|(_, t)| t.len() == 1) {
            for &(slot, toks) in work {
                self.check_and_reserve(slot, toks.len())?;
            }
            let steps: Vec<Step<'_>> = work
                .iter()
                .map(|&(slot, tokens)| Step {
                    slot,
                    pos: self.lens[slot],
                    tokens,
                })
                .collect();
            let c = self.cuda.as_deref_mut().expect("checked above");
            let ids = c.forward_argmax(&steps)?;
            for &(slot, _) in work {
                self.lens[slot] += 1;
            }
            return Ok(ids);
        }
        self.step(work)?
            .iter()
            .map(|l| {
                kernels::ops::argmax(l)
                    .map(|i| i as u32)
                    .map_err(model::kerr)
            })
            .collect()
    }

    /// The checks of a step for one sequence (tokens present, within max_model_len) and its pages reserved.
    fn check_and_reserve(&mut self, slot: usize, n: usize) -> Result<(), EngineError> {
        if n == 0 {
            return Err(EngineError::Request(format!(
                "slot {slot}: a step needs at least one token"
            )));
        }
        let len = self.lens[slot];
        if len + n > self.max_len {
            return Err(EngineError::Request(format!(
                "slot {slot}: {} tokens exceed max_model_len {}",
                len + n,
                self.max_len
            )));
        }
        self.caches.reserve(slot, len + n)
    }

    fn forward(&mut self, steps: &[Step<'_>]) -> Result<Vec<f32>, EngineError> {
        match &mut self.cuda {
            Some(c) => c.forward(steps),
            None => self.model.forward(&mut self.caches, steps),
        }
    }

    /// A new sequence's slot, or `None` when every slot is taken.
    pub fn join(&mut self) -> Option<usize> {
        let s = self.caches.acquire()?;
        self.lens[s] = 0;
        Some(s)
    }

    /// Frees a sequence's slot and pages.
    pub fn leave(&mut self, slot: usize) {
        self.caches.release(slot);
        self.lens[slot] = 0;
    }

    /// Tokens cached for `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Advances every `(slot, tokens)` and returns each one's last-token logits (`[work.len()][vocab]`). A prompt
    /// runs as a prefill (chunked DeltaNet, causal attention) when the sequence is fresh and as a chunk after its
    /// cached prefix otherwise, in pieces of at most [`PREFILL_CHUNK`]; single tokens of several sequences share
    /// one decode step (one pass over the weights).
    pub fn step(&mut self, work: &[(usize, &[u32])]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut draws: Vec<Option<Draw>> = vec![None; work.len()];
        self.step_pick(work, &mut draws)?
            .into_iter()
            .map(|p| match p {
                Picked::Logits(l) => Ok(l),
                Picked::Token(_) => Err(EngineError::Kernel(
                    "step: a token where logits were asked".into(),
                )),
            })
            .collect()
    }

    /// [`Engine::step`] where a sequence may draw its next token instead of handing back its logits: `draws[i]`
    /// `Some` draws `work[i]`'s token (its generator advanced as the draw advances it, as
    /// [`generate::draw`] on the host would), `None` hands back its logits. On CUDA the decode rows draw on the
    /// device where its sampler takes their parameters, so only the ids cross the link; prompt rows and the rest
    /// draw on the host from the same logits.
    pub fn step_pick(
        &mut self,
        work: &[(usize, &[u32])],
        draws: &mut [Option<Draw>],
    ) -> Result<Vec<Picked>, EngineError> {
        if draws.len() != work.len() {
            return Err(EngineError::Kernel(format!(
                "step_pick: {} draws for {} sequences",
                draws.len(),
                work.len()
            )));
        }
        let vocab = self.model.vocab();
        let mut out: Vec<Option<Picked>> = (0..work.len()).map(|_| None).collect();
        let mut decode: Vec<(usize, usize)> = Vec::new();
        for (i, &(slot, toks)) in work.iter().enumerate() {
            self.check_and_reserve(slot, toks.len())?;
            let len = self.lens[slot];
            if toks.len() == 1 {
                decode.push((i, slot));
                continue;
            }
            // A prompt runs in chunks of at most `prefill_chunk` tokens, so activations stay bounded: the first as
            // a prefill when the sequence is fresh, the rest after the cached prefix.
            let mut last = Vec::new();
            for (c, piece) in toks.chunks(self.prefill_chunk).enumerate() {
                let pos = len + c * self.prefill_chunk;
                let step = Step {
                    slot,
                    pos,
                    tokens: piece,
                };
                last = self.forward(&[step])?;
                self.lens[slot] = pos + piece.len();
                if let Some(c) = self.cuda.as_deref() {
                    c.trace_memory(format_args!("after a {}-token prompt chunk", piece.len()));
                }
            }
            out[i] = Some(pick_host(last, &mut draws[i])?);
        }
        if !decode.is_empty() {
            let steps: Vec<Step<'_>> = decode
                .iter()
                .map(|&(i, slot)| Step {
                    slot,
                    pos: self.lens[slot],
                    tokens: work[i].1,
                })
                .collect();
            match self.cuda.as_deref_mut() {
                Some(c) => {
                    let mut sub: Vec<Option<Draw>> =
                        decode.iter().map(|&(i, _)| draws[i].take()).collect();
                    let rows = c.forward_pick(&steps, &mut sub);
                    for (&(i, _), d) in decode.iter().zip(sub) {
                        draws[i] = d;
                    }
                    for (&(i, _), row) in decode.iter().zip(rows?) {
                        out[i] = Some(match (row, &draws[i]) {
                            (Some(l), _) => Picked::Logits(l),
                            (None, Some(d)) => Picked::Token(d.token),
                            (None, None) => {
                                return Err(EngineError::Kernel(
                                    "step_pick: a row with neither logits nor a draw".into(),
                                ))
                            }
                        });
                    }
                }
                None => {
                    let logits = self.model.forward(&mut self.caches, &steps)?;
                    for (b, &(i, _)) in decode.iter().enumerate() {
                        let row = logits[b * vocab..(b + 1) * vocab].to_vec();
                        out[i] = Some(pick_host(row, &mut draws[i])?);
                    }
                }
            }
            for &(_, slot) in &decode {
                self.lens[slot] += 1;
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(Picked::Logits(Vec::new())))
            .collect())
    }
}

/// A row's logits, or the token its draw takes from them on the host.
fn pick_host(logits: Vec<f32>, draw: &mut Option<Draw>) -> Result<Picked, EngineError> {
    Ok(match draw {
        Some(d) => {
            d.token = generate::draw(&logits, &d.params, &mut d.rng)?;
            Picked::Token(d.token)
        }
        None => Picked::Logits(logits),
    })
}

/// One sequence's draw in a step ([`Engine::step_pick`]): its parameters and generator (advanced in place as the
/// draw advances it), and the token drawn.
#[derive(Debug, Clone)]
pub struct Draw {
    pub params: kernels::sampling::SamplingParams,
    pub rng: kernels::sampling::Pcg32,
    pub token: u32,
}

/// What [`Engine::step_pick`] hands back for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Picked {
    Logits(Vec<f32>),
    Token(u32),
}
