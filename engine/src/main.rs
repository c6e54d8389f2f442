//! `edgefit`: run a checkpoint as a plan says and print measured against predicted.
//!
//! ```text
//! edgefit generate --model DIR [--plan PLAN.toml] [--profile NAME|PATH] [--device cpu]
//!     (--prompt TEXT | --prompt-ids 1,2,3) [--max-new-tokens N] [--temperature T --top-k K --top-p P --seed S]
//!     [--stop TEXT]... [--chat] [--exact] [--json] [--dump-logits FILE]
//! edgefit bench --model DIR [--batch B] [--prompt-len P] [--gen N]
//! edgefit serve --model DIR [--host 127.0.0.1] [--port 8000] [--served-model-name NAME] [--api-key KEY]
//!     [--max-num-seqs N] [--max-model-len N]
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use engine::checkpoint::Checkpoint;
use engine::generate::{generate_until, GenerateOptions};
use engine::tokenizer::{Detok, GenerationConfig, Tokenizer};
use engine::{Engine, EngineError, Model, WeightMode};
use kernels::sampling::SamplingParams;
use miette::IntoDiagnostic;
use planner::weight_path::PrefillActivations;
use planner::{Plan, Workload};

#[derive(Parser)]
#[command(
    name = "edgefit",
    about = "Run a model as its plan says, and measure it against the prediction"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate from a prompt, streaming text to stdout.
    Generate(GenerateArgs),
    /// pp/tg figures the way llama-bench prints them, beside the plan's prediction.
    Bench(BenchArgs),
    /// Serve the OpenAI API (chat and completions, streamed or whole) with continuous batching.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    serve: engine::serve::ServeFlags,
}

#[derive(Args)]
struct Common {
    /// A Hugging Face checkpoint directory.
    #[arg(long)]
    model: PathBuf,
    /// A plan TOML (`cargo xtask plan --out`); without it the planner plans this checkpoint for this machine.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// A committed profile name or a profile TOML path; without it this machine is probed.
    #[arg(long)]
    profile: Option<String>,
    /// Where to run: `cpu`, or `cuda` (device 0; the engine built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Run the checkpoint's own formats (no conversion), f32 accumulation: the parity path.
    #[arg(long)]
    exact: bool,
    /// Longest sequence (prompt + generated) when the engine makes the plan.
    #[arg(long, default_value_t = 4096)]
    max_model_len: u64,
    /// With `--device cuda`: use at most this much device memory (`24245000000`, `22.58GiB`), planned and
    /// enforced, so a large GPU behaves as a smaller card (weights that no longer fit are streamed from the host).
    #[arg(long)]
    cap_gpu_memory: Option<String>,
    /// With `--device cuda`: run every decode step at the plan's `max_num_seqs` rows, padding the batch, so that a
    /// sequence's tokens do not depend on what shares its steps (the same bits as a single request on the same
    /// server). Slower at small batches: each step costs what a full batch does.
    #[arg(long)]
    batch_invariant: bool,
    /// Pin this many GiB of decoder-layer weights in host memory when the engine makes the plan (like vLLM's
    /// `cpu_offload_gb`); on CUDA they are streamed to the device every step.
    #[arg(long)]
    offload_gib: Option<f64>,
    /// Pin the activation precision of W4A16 prompt GEMMs, `int16` or `int8`, when the engine makes the plan
    /// (default: the planner's choice, written in the plan's `weight_path.prefill`). With `--plan`, edit that field.
    #[arg(long, value_parser = parse_prefill_activations)]
    prefill_activations: Option<PrefillActivations>,
}

fn parse_prefill_activations(s: &str) -> Result<PrefillActivations, String> {
    PrefillActivations::parse(s)
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Render --prompt as one user message through the checkpoint's chat template.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// A stop string: one token of the vocabulary stops on its id, anything else is matched in the decoded text
    /// (and left out of it).
    #[arg(long)]
    stop: Vec<String>,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Write every generated step's logits as f32 little-endian `[steps, vocab]`.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    gen: usize,
    /// With weights streamed on CUDA: time two more decode steps' copies and layers and write the spans here
    /// (JSON), with a summary of how much of the transfer the compute hid.
    #[arg(long)]
    timeline: Option<PathBuf>,
}

/// Peak resident memory of this process (`VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

struct Loaded {
    engine: Engine,
    plan: Plan,
    load_s: f64,
}

fn load(c: &Common, max_num_seqs: u64, prompt_len: u64) -> Result<Loaded, EngineError> {
    let cuda = match c.device.as_str() {
        "cpu" => false,
        "cuda" => true,
        other => {
            return Err(EngineError::Unsupported(format!(
                "--device {other}: expected cpu or cuda"
            )))
        }
    };
    let t0 = Instant::now();
    let ck = Checkpoint::open(&c.model)?;
    // On CUDA the plan is the GPU's: the committed H200 profile unless one is named.
    let profile_name = c.profile.as_deref().or(cuda.then_some("h200"));
    let profile = engine::setup::profile(profile_name)?;
    if let (Some(a), Some(p)) = (c.prefill_activations, &c.plan) {
        // The plan file is the interface: a flag that silently overrode it would run something the plan does not say.
        return Err(EngineError::Plan(format!(
            "--prefill-activations {} is a planning input; {} already says how prompts run (its \
             weight_path.prefill): edit that, or plan with `cargo xtask plan --prefill-activations {}`",
            a.name(),
            p.display(),
            a.name()
        )));
    }
    let cap = match c.cap_gpu_memory.as_deref() {
        Some(s) => Some(
            Workload::parse_bytes("--cap-gpu-memory", s)
                .map_err(|e| EngineError::Plan(e.to_string()))?,
        ),
        None => None,
    };
    if cap.is_some() && !cuda {
        return Err(EngineError::Unsupported(
            "--cap-gpu-memory applies to --device cuda".into(),
        ));
    }
    if c.batch_invariant && !cuda {
        return Err(EngineError::Unsupported(
            "--batch-invariant applies to --device cuda (the CPU engine's batched steps are not padded)".into(),
        ));
    }
    let mut workload = Workload {
        max_model_len: c.max_model_len,
        max_num_seqs,
        prompt_len: prompt_len.min(c.max_model_len),
        gpu_memory_cap: cap,
        prefill_activations: c.prefill_activations,
        ..Workload::default()
    };
    if let Some(gib) = c.offload_gib {
        workload = workload
            .with_offload_gib(gib)
            .map_err(|e| EngineError::Plan(e.to_string()))?;
    }
    let plan = engine::setup::plan(&ck, c.plan.as_deref(), &profile, &workload)?;
    let streamed = if cuda {
        engine::setup::streamed_linears(&plan, &ck)?
    } else {
        engine::setup::admit(&plan)?;
        Default::default()
    };
    let mode = if c.exact {
        WeightMode::Exact
    } else {
        // A CPU plan's int4 path runs on the GPU too: the converted pack on the int4 GEMV (W4A16 with f32
        // activations for both packs; `CudaModel::paths` says so).
        WeightMode::from_plan(plan.weight_path.format)?
    };
    // A progress bar for loads that take more than a moment (it draws only on a terminal).
    let bar = indicatif::ProgressBar::new(ck.spec.layers.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    let mut model = Model::load(&ck, mode, |done, _| {
        if t0.elapsed().as_secs_f64() > 1.0 && bar.is_hidden() {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    // The mapping is dropped here: every tensor has been converted or copied.
    drop(ck);
    let slots = usize::try_from(plan.workload.max_num_seqs)
        .unwrap_or(1)
        .max(1);
    let max_len = usize::try_from(plan.workload.max_model_len).unwrap_or(usize::MAX);
    // The plan's prompt precision applies to the CPU's W4A16 GEMM; `--exact` and the GPU (which runs the
    // checkpoint's formats) keep their own numerics.
    if !c.exact && !cuda {
        model.set_prefill(plan.weight_path.prefill.as_ref(), slots)?;
    }
    let engine = if cuda {
        let opts = engine::CudaOptions {
            slots,
            max_len,
            precise: c.exact,
            streamed,
            // A plan given with --plan carries its own cap.
            cap: plan.workload.gpu_memory_cap,
            // Where the device has room beyond the plan (decided at upload): `EDGEFIT_PREFILL_GEMM=0` turns it off
            // (the benchmarks' other arm).
            gemm_copies: std::env::var("EDGEFIT_PREFILL_GEMM").map_or(true, |v| v != "0"),
            batch_invariant: c.batch_invariant,
            // Prompt attention through the flash prefill kernels: `EDGEFIT_FLASH_PREFILL=0` turns it off (the
            // benchmarks' `slots` arm).
            flash_prefill_attention: std::env::var("EDGEFIT_FLASH_PREFILL")
                .map_or(true, |v| v != "0"),
            // Decode attention split over the context, and stacked projections: `EDGEFIT_SPLIT_ATTENTION=0` and
            // `EDGEFIT_STACK=0` turn them off (the benchmarks' `nosplit` and `nostack` arms).
            split_decode_attention: std::env::var("EDGEFIT_SPLIT_ATTENTION")
                .map_or(true, |v| v != "0"),
            stack_projections: std::env::var("EDGEFIT_STACK").map_or(true, |v| v != "0"),
            // Short NVFP4 matrices' f32 rows for decode beside the GEMM copies: `EDGEFIT_NVFP4_F32_ROWS=0` turns
            // them off (the benchmarks' `norows` arm).
            nvfp4_f32_rows: std::env::var("EDGEFIT_NVFP4_F32_ROWS").map_or(true, |v| v != "0"),
        };
        Engine::on_cuda(model, opts, |free, caches| {
            engine::setup::admit_cuda(&plan, free as u64, caches)
        })?
    } else {
        Engine::new(model, slots, max_len)?
    };
    let engine = engine.with_planned_chunk(plan.prompt_chunk.tokens)?;
    Ok(Loaded {
        engine,
        plan,
        load_s: t0.elapsed().as_secs_f64(),
    })
}

/// What the W4A16 prompt GEMMs ran with, and how many calls took int8 (the proof that the plan's path ran).
fn prefill_activations(l: &Loaded) -> String {
    let calls = l.engine.model.int8_prefill_calls();
    match &l.plan.weight_path.prefill {
        _ if l.engine.cuda().is_some() => format!(
            "the checkpoint's (cuda); attention: {}",
            l.engine.cuda().map_or("", |c| c.prefill_attention())
        ),
        Some(p)
            if p.activations == PrefillActivations::Int8
                && l.engine.model.mode == WeightMode::W4a16 =>
        {
            format!("int8 from {} rows ({calls} int8 GEMM calls)", p.min_rows)
        }
        _ if l.engine.model.mode == WeightMode::W4a16 => "int16".into(),
        // `--exact` (or a plan of another path): f32, and int16 on a GPTQ checkpoint's int4 weights.
        _ => "the exact path's (no int8)".into(),
    }
}

/// The plan's predicted figures (a plan the engine runs fits, so it has them; zeros say "no prediction").
struct Predicted {
    decode_tok_s: f64,
    prefill_tok_s: f64,
    bound: String,
}

fn predicted(plan: &Plan) -> Predicted {
    match &plan.prediction {
        Some(p) => Predicted {
            decode_tok_s: p.decode_tok_s,
            prefill_tok_s: p.prefill_tok_s,
            bound: p.bound.clone(),
        },
        None => Predicted {
            decode_tok_s: 0.0,
            prefill_tok_s: 0.0,
            bound: "no prediction (the plan does not fit)".into(),
        },
    }
}

fn ratio(measured: f64, predicted: f64) -> String {
    if predicted > 0.0 {
        format!("{:.2}x", measured / predicted)
    } else {
        "n/a".into()
    }
}

fn run_generate(a: GenerateArgs) -> miette::Result<()> {
    let tok = if a.prompt.is_some() || !a.json {
        Tokenizer::open(&a.common.model).ok()
    } else {
        None
    };
    let prompt: Vec<u32> = match (&a.prompt, &a.prompt_ids) {
        (Some(p), _) => {
            let t = tok.as_ref().ok_or_else(|| {
                miette::miette!("--prompt needs {}/tokenizer.json", a.common.model.display())
            })?;
            if a.chat {
                let tmpl = engine::chat::ChatTemplate::open(&a.common.model)?.ok_or_else(|| {
                    miette::miette!("--chat: {} has no chat template", a.common.model.display())
                })?;
                // The template writes the special tokens itself, as apply_chat_template does.
                t.encode(&tmpl.render_user(p)?, false)?
            } else {
                t.encode(p, true)?
            }
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => miette::bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let gen_cfg = GenerationConfig::open(&a.common.model)?;
    let mut l = load(&a.common, 1, prompt.len() as u64)?;
    let mut stop_tokens = gen_cfg.stop_tokens(&l.engine.model.spec);
    // A stop string that is one token of the vocabulary stops on that id; any other is matched in the text.
    let mut stop_strings: Vec<String> = Vec::new();
    for s in &a.stop {
        if s.is_empty() {
            miette::bail!("--stop needs a non-empty string");
        }
        match tok.as_ref().and_then(|t| t.token_id(s)) {
            Some(id) => stop_tokens.push(id),
            None if tok.is_some() => stop_strings.push(s.clone()),
            None => miette::bail!(
                "--stop {s:?} needs the checkpoint's tokenizer.json to match it in the text"
            ),
        }
    }
    let temperature = a.temperature.or(gen_cfg.temperature).unwrap_or(0.0);
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: SamplingParams {
            temperature,
            top_k: a.top_k.or(gen_cfg.top_k).unwrap_or(0),
            top_p: a.top_p.or(gen_cfg.top_p).unwrap_or(1.0),
        },
        seed: a.seed,
        repetition_penalty: a
            .repetition_penalty
            .or(gen_cfg.repetition_penalty)
            .unwrap_or(1.0),
        stop_tokens,
        keep_logits: a.dump_logits.is_some(),
    };
    let stream = !a.json && tok.is_some();
    // The server's incremental detokenizer: text is released as it completes, up to the first stop string (left
    // out), holding back what a stop string could still need.
    let mut detok = Detok::new();
    let mut released = String::new();
    let mut stopped = false;
    let g = generate_until(&mut l.engine, &prompt, &opts, |id| {
        let Some(t) = &tok else { return true };
        detok.push(t, id, false);
        let (piece, hit) = detok.release(&stop_strings, false);
        if stream {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }
        released.push_str(&piece);
        stopped = hit;
        !hit
    })?;
    if let Some(path) = &a.dump_logits {
        let bytes: Vec<u8> = g.logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        write_atomic(path, &bytes)?;
    }
    let prefill_tok_s = g.prefill_tokens as f64 / g.prefill_s.max(1e-12);
    let decode_tok_s = if g.decode_tokens > 0 {
        g.decode_tokens as f64 / g.decode_s.max(1e-12)
    } else {
        0.0
    };
    let p = predicted(&l.plan);
    let sent = released.len();
    let text = match &tok {
        Some(_) if stopped => released,
        Some(t) => t.decode(&g.tokens)?,
        None => String::new(),
    };
    if stream && !stopped && text.len() > sent && text.is_char_boundary(sent) {
        // The tail the detokenizer still held back when generation ended.
        print!("{}", &text[sent..]);
    }
    if a.json {
        let out = serde_json::json!({
            "tokens": g.tokens,
            "text": text,
            "finish_reason": g.finish_reason,
            "timings": {
                "ttft_ms": g.ttft_s * 1e3,
                "prefill_tok_s": prefill_tok_s,
                "decode_tok_s": decode_tok_s,
                "load_s": l.load_s,
            },
            "memory": {
                "host_peak_bytes": peak_rss(),
                "weights_bytes": l.engine.cuda().map_or(l.engine.model.weight_bytes, |c| c.weight_bytes),
                "cache_bytes": l.engine.caches.bytes,
                "planned_weight_bytes": l.plan.inventory.planned_bytes,
                "planned_cache_bytes": l.plan.cache.total_bytes,
            },
            "weight_paths": l.engine.paths(),
            "prefill_activations": prefill_activations(&l),
            "prompt_chunk": l.engine.prefill_chunk(),
            "device": format!("{:?}", l.engine.device()),
            "predicted": {
                "decode_tok_s": p.decode_tok_s,
                "prefill_tok_s": p.prefill_tok_s,
                "bound": p.bound,
                "weight_path": format!("{:?}", l.plan.weight_path.format),
            },
        });
        println!("{out}");
    } else {
        println!();
        eprintln!(
            "prefill {} tok {:.1} tok/s (predicted {:.1}, {}), decode {} tok {:.2} tok/s (predicted {:.2}, {}), ttft {:.1} ms, peak rss {} MiB, paths {:?}",
            g.prefill_tokens,
            prefill_tok_s,
            p.prefill_tok_s,
            ratio(prefill_tok_s, p.prefill_tok_s),
            g.decode_tokens,
            decode_tok_s,
            p.decode_tok_s,
            ratio(decode_tok_s, p.decode_tok_s),
            g.ttft_s * 1e3,
            peak_rss().unwrap_or(0) >> 20,
            l.engine.paths(),
        );
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a failure leaves no
/// partial file.
fn write_atomic(path: &Path, bytes: &[u8]) -> miette::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let r = std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.into_diagnostic()
}

/// Read bandwidth of this machine now: the best of three passes summing a 1 GiB buffer on every core, the
/// roofline's denominator measured in the same run as the model it judges.
fn read_bandwidth() -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let threads = kernels::cpu::default_threads();
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let total = std::sync::atomic::AtomicU64::new(0);
        kernels::cpu::parallel_ranges(words, 1 << 16, threads, |a, b| {
            let s = buf[a..b].iter().fold(0u64, |x, &y| x.wrapping_add(y));
            total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        std::hint::black_box(total.load(std::sync::atomic::Ordering::Relaxed));
        best = best.max((words * 8) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

/// The engine's own profile of `total_s` spent in `calls` steps, per op family.
fn print_profile(what: &str, prof: &[(&str, f64)], total_s: f64, calls: usize) {
    let per = |s: f64| s * 1e3 / calls.max(1) as f64;
    let timed: f64 = prof.iter().map(|(_, s)| s).sum();
    println!("{what} profile (ms per call, share of the time):");
    for (name, s) in prof {
        println!(
            "  {name:<24} {:>9.3} ms  {:>5.1}%",
            per(*s),
            100.0 * s / total_s
        );
    }
    let rest = total_s - timed;
    println!(
        "  {:<24} {:>9.3} ms  {:>5.1}%",
        "untimed (engine glue)",
        per(rest),
        100.0 * rest / total_s
    );
}

fn run_bench(a: BenchArgs) -> miette::Result<()> {
    let b = a.batch.max(1);
    let mut l = load(&a.common, b as u64, a.prompt_len as u64)?;
    let vocab = l.engine.model.vocab() as u32;
    let prompt: Vec<u32> = (0..a.prompt_len as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let slots: Vec<usize> = (0..b)
        .map(|_| l.engine.join().expect("slots sized from --batch"))
        .collect();
    // One untimed prompt first, so the timed ones find the kernels loaded and the buffers allocated (a server
    // pays those once, not per request).
    if let Some(&s) = slots.first() {
        l.engine.step(&[(s, &prompt)])?;
        l.engine.leave(s);
        if l.engine.join() != Some(s) {
            return Err(
                EngineError::Kernel("bench: the warm-up slot did not come back".into()).into(),
            );
        }
    }
    engine::profile::enable();
    let t0 = Instant::now();
    for &s in &slots {
        l.engine.step(&[(s, &prompt)])?;
    }
    let pp_s = t0.elapsed().as_secs_f64();
    let pp_prof = engine::profile::totals();
    let mut toks: Vec<u32> = vec![1; b];
    engine::profile::enable();
    let t1 = Instant::now();
    for _ in 0..a.gen {
        toks = greedy_step(&mut l.engine, &slots, &toks)?;
    }
    let tg_s = t1.elapsed().as_secs_f64();
    let pp = (a.prompt_len * b) as f64 / pp_s;
    let tg = (a.gen * b) as f64 / tg_s;
    let p = predicted(&l.plan);
    println!("loaded in {:.1} s", l.load_s);
    println!("| model | paths | batch | test | t/s | predicted | ratio |");
    println!("|---|---|---|---|---|---|---|");
    let name = l.engine.model.spec.id.clone();
    let paths = l.engine.paths().join("+");
    println!(
        "| {name} | {paths} | {b} | pp{} | {pp:.2} | {:.2} | {} |",
        a.prompt_len,
        p.prefill_tok_s,
        ratio(pp, p.prefill_tok_s)
    );
    println!(
        "| {name} | {paths} | {b} | tg{} | {tg:.2} | {:.2} | {} |",
        a.gen,
        p.decode_tok_s,
        ratio(tg / b as f64, p.decode_tok_s)
    );
    let prof = engine::profile::totals();
    // The roofline: weight bytes read per step over the bandwidth measured now (host reads, or the device's copy
    // bandwidth, read + write, as benchmarks/h200.md counts it).
    let (bw, read_bytes) = match l.engine.cuda_mut() {
        Some(c) => (c.copy_bandwidth()?, c.weight_bytes),
        None => (read_bandwidth(), l.engine.model.decode_read_bytes),
    };
    let roof = bw / read_bytes as f64;
    println!(
        "decode reads {} weight bytes per step; bandwidth now {:.2} GB/s -> roofline {:.2} tok/s; tg at {:.2} of it",
        read_bytes,
        bw / 1e9,
        roof,
        (tg / b as f64) / roof
    );
    if let Some(c) = l.engine.cuda_mut().filter(|c| c.streamed_layers() > 0) {
        // Streamed weights cross the link and are then read from the staging buffers: a step takes the larger of
        // the transfer and the device reads when they overlap, their sum when they do not.
        let link = c.link_bandwidth()?;
        let host = c.host_bytes as f64;
        let t_link = host / link;
        let t_dev = (read_bytes as f64 + host) / bw;
        println!(
            "streams {} bytes of {} layers per step from pinned host memory; link now {:.2} GB/s -> transfer {:.2} \
             ms, device reads {:.2} ms; bound if overlapped {:.3} tok/s, if not {:.3} tok/s; tg at {:.2} of the \
             overlapped bound",
            c.host_bytes,
            c.streamed_layers(),
            link / 1e9,
            t_link * 1e3,
            t_dev * 1e3,
            1.0 / t_link.max(t_dev),
            1.0 / (t_link + t_dev),
            (tg / b as f64) * t_link.max(t_dev)
        );
    }
    if let Some(path) = &a.timeline {
        timeline(&mut l.engine, &slots, &toks, path)?;
    }
    println!("prefill activations: {}", prefill_activations(&l));
    println!(
        "prompt chunk: {} tokens (plan: {}, {} MiB of scratch beyond the default)",
        l.engine.prefill_chunk(),
        l.plan.prompt_chunk.tokens,
        l.plan.prompt_chunk.extra_scratch_bytes >> 20
    );
    print_profile("decode step", &prof, tg_s, a.gen);
    print_profile("prefill", &pp_prof, pp_s, b);
    Ok(())
}

/// One decode step of every sequence in `slots`, each fed its token in `toks`: the next tokens, greedy, as a user's
/// default decode (the ids are chosen where the step ran).
fn greedy_step(
    engine: &mut Engine,
    slots: &[usize],
    toks: &[u32],
) -> Result<Vec<u32>, EngineError> {
    let work: Vec<(usize, &[u32])> = slots
        .iter()
        .zip(toks)
        .map(|(&s, t)| (s, std::slice::from_ref(t)))
        .collect();
    engine.step_greedy(&work)
}

/// Two decode steps with every streamed copy and every layer timed on the device; the spans go to `path` (JSON)
/// and the second step's summary to stdout: its length, the link's busy time and the compute's, and how much of the
/// transfer ran under compute.
fn timeline(engine: &mut Engine, slots: &[usize], toks: &[u32], path: &Path) -> miette::Result<()> {
    let Some(c) = engine.cuda_mut() else {
        miette::bail!("--timeline needs --device cuda");
    };
    c.start_timeline()?;
    let mut toks = toks.to_vec();
    for _ in 0..2 {
        toks = greedy_step(engine, slots, &toks)?;
    }
    let spans = engine
        .cuda_mut()
        .ok_or_else(|| miette::miette!("--timeline needs --device cuda"))?
        .take_timeline()?;
    write_atomic(
        path,
        serde_json::to_string_pretty(&spans)
            .into_diagnostic()?
            .as_bytes(),
    )?;
    // The second step: from its first layer's compute to its last.
    let compute: Vec<_> = spans.iter().filter(|s| s.stream == "compute").collect();
    let n_layers = engine.model.spec.layers.len();
    if compute.len() < 2 * n_layers {
        miette::bail!(
            "the timeline holds {} layer spans, expected {}",
            compute.len(),
            2 * n_layers
        );
    }
    let (t0, t1) = (compute[n_layers].start_ms, compute[2 * n_layers - 1].end_ms);
    let busy = |stream: &str| -> f32 {
        spans
            .iter()
            .filter(|s| s.stream == stream)
            .map(|s| (s.end_ms.min(t1) - s.start_ms.max(t0)).max(0.0))
            .sum()
    };
    let (copy, comp) = (busy("copy"), busy("compute"));
    println!(
        "timeline ({}): step {:.2} ms; copies busy {:.2} ms, layers busy {:.2} ms; the step is {:.2} of their sum \
         and {:.2} of the larger (1.00: fully overlapped)",
        path.display(),
        t1 - t0,
        copy,
        comp,
        (t1 - t0) / (copy + comp),
        (t1 - t0) / copy.max(comp)
    );
    Ok(())
}

fn main() -> miette::Result<()> {
    match Cli::parse().cmd {
        Cmd::Generate(a) => run_generate(a),
        Cmd::Bench(a) => run_bench(a),
        Cmd::Serve(a) => {
            let l = load(&a.common, a.serve.max_num_seqs, 512)?;
            Ok(engine::serve::run(l.engine, &a.common.model, &a.serve)?)
        }
    }
}
