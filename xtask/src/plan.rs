//! `cargo xtask plan`: read a device profile (a name in `profiles/` or a path to a TOML file) and a model card from
//! the repository, plan, print a readable summary, and write the plan TOML (atomically with `--out`, else to stdout).
//! `--all` plans every model x profile pair and prints a table with the time planning took. The exit status says
//! the verdict: [`EXIT_DOES_NOT_FIT`] when the plan does not fit (the plan is still written, with its shortfall).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use miette::{miette, IntoDiagnostic, Result, WrapErr};
use planner::model::{parse_model, ModelCard, SourceFile};
use planner::workload::{Priority, TargetEngine};
use planner::{Plan, Workload};

/// The model the README's `cargo xtask plan --device ryzen-5090` plans: the seed's story (seed 000 §5).
const DEFAULT_MODEL: &str = "qwen3.8-27b-fp8";

/// Exit status of `cargo xtask plan` when the plan does not fit. Distinct from 1 (bad arguments or inputs, a file that
/// cannot be written: no plan at all) so a script can tell "this cannot run here" from "this command was wrong".
pub(crate) const EXIT_DOES_NOT_FIT: u8 = 2;

const USAGE: &str = "\
usage: cargo xtask plan --device D [options]
       cargo xtask plan --all [options]

  --device D           a profile in profiles/ (D.toml), or a path to a profile TOML (anything with a `/` or
                       ending in `.toml`; see docs/profiles.md)
  --model M            a model card in models/ (default: qwen3.8-27b-fp8), or a checkpoint directory
                       (config.json, safetensors headers checked against the architecture)
  --max-model-len N    longest sequence the deployment admits; caches are sized from it (default 4096)
  --max-num-seqs N     concurrent sequences (default 1)
  --prompt-len N       prompt length of the prefill prediction (default 512, or --max-model-len if smaller,
                       with a warning); above --max-model-len is an error
  --offload-gib X      pin X GiB of decoder-layer weights in host memory, like vLLM's cpu_offload_gb; an error
                       above the model's decoder-layer bytes or on a device with no pool linked to the decode pool
  --cap-gpu-memory M   plan each GPU pool as a card of M bytes (`24245000000`, `22.58GiB`): a large GPU standing
                       in for a smaller one
  --priority P         speed | fidelity (default speed)
  --prefill-activations A
                       int16 | int8: pin the activation precision of W4A16 prompt GEMMs (default: the planner
                       chooses, int8 on x86 with AVX-512 VNNI at priority speed); an error on other paths
  --engine E           edgefit | vllm: what the target engine can offload (default edgefit)
  --images             prompts carry images (the vision tower runs at prefill)
  --speculative        speculative decoding with the MTP head (the head is read every token)
  --out FILE           write the plan there atomically (with --all: a directory, one file per pair)
  --format F           toml | json (default toml)
  --all                plan every model x profile pair and print a table with the planning time (not with
                       --model or --device)

exit status: 0 the plan fits; 2 the plan does not fit (no speed is printed; the plan, its verdict and its
shortfall are still written); 1 an error (bad arguments or inputs, an --out that cannot be written). With --all,
0 unless a pair was refused with an error.";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Toml,
    Json,
}

struct Args {
    device: Option<String>,
    model: Option<String>,
    workload: Workload,
    out: Option<PathBuf>,
    format: Format,
    all: bool,
    /// Warnings about defaults the arguments changed, printed before the plan.
    warnings: Vec<String>,
}

fn parse_args(args: Vec<OsString>) -> Result<Args> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args {
        device: None,
        model: None,
        workload: Workload::default(),
        out: None,
        format: Format::Toml,
        all: false,
        warnings: Vec::new(),
    };
    let mut prompt_given = false;
    let num = |p: &mut lexopt::Parser, flag: &str| -> Result<u64> {
        let v = p.value().map_err(|e| miette!("{e}"))?;
        let s = v.to_string_lossy().into_owned();
        s.parse::<u64>()
            .map_err(|_| miette!("{flag} expects a whole number, got `{s}`"))
    };
    while let Some(arg) = p
        .next()
        .map_err(|e| miette!("{e}; see `cargo xtask plan --help`"))?
    {
        match arg {
            Long("device") => {
                a.device = Some(
                    p.value()
                        .map_err(|e| miette!("{e}"))?
                        .string()
                        .map_err(|e| miette!("{e}"))?,
                )
            }
            Long("model") => {
                a.model = Some(
                    p.value()
                        .map_err(|e| miette!("{e}"))?
                        .string()
                        .map_err(|e| miette!("{e}"))?,
                )
            }
            Long("max-model-len") => a.workload.max_model_len = num(&mut p, "--max-model-len")?,
            Long("max-num-seqs") => a.workload.max_num_seqs = num(&mut p, "--max-num-seqs")?,
            Long("prompt-len") => {
                a.workload.prompt_len = num(&mut p, "--prompt-len")?;
                prompt_given = true;
            }
            Long("offload-gib") => {
                let s = p
                    .value()
                    .map_err(|e| miette!("{e}"))?
                    .to_string_lossy()
                    .into_owned();
                let gib: f64 = s
                    .parse()
                    .map_err(|_| miette!("--offload-gib expects a number of GiB, got `{s}`"))?;
                a.workload = a
                    .workload
                    .clone()
                    .with_offload_gib(gib)
                    .map_err(miette::Report::new)?;
            }
            Long("cap-gpu-memory") => {
                let s = p
                    .value()
                    .map_err(|e| miette!("{e}"))?
                    .to_string_lossy()
                    .into_owned();
                a.workload.gpu_memory_cap = Some(
                    Workload::parse_bytes("--cap-gpu-memory", &s).map_err(miette::Report::new)?,
                );
            }
            Long("priority") => {
                let s = p
                    .value()
                    .map_err(|e| miette!("{e}"))?
                    .to_string_lossy()
                    .into_owned();
                a.workload.priority = match s.as_str() {
                    "speed" => Priority::Speed,
                    "fidelity" => Priority::Fidelity,
                    other => {
                        return Err(miette!(
                            "--priority expects `speed` or `fidelity`, got `{other}`"
                        ))
                    }
                };
            }
            Long("engine") => {
                let s = p
                    .value()
                    .map_err(|e| miette!("{e}"))?
                    .to_string_lossy()
                    .into_owned();
                a.workload.engine = match s.as_str() {
                    "edgefit" => TargetEngine::Edgefit,
                    "vllm" => TargetEngine::Vllm,
                    other => {
                        return Err(miette!(
                            "--engine expects `edgefit` or `vllm`, got `{other}`"
                        ))
                    }
                };
            }
            Long("prefill-activations") => {
                let s = p
                    .value()
                    .map_err(|e| miette!("{e}"))?
                    .to_string_lossy()
                    .into_owned();
                a.workload.prefill_activations = Some(
                    planner::weight_path::PrefillActivations::parse(&s)
                        .map_err(|e| miette!("--prefill-activations {e}"))?,
                );
            }
            Long("images") => a.workload.images = true,
            Long("speculative") => a.workload.speculative = true,
            Long("out") => a.out = Some(PathBuf::from(p.value().map_err(|e| miette!("{e}"))?)),
            Long("format") => {
                let s = p
                    .value()
                    .map_err(|e| miette!("{e}"))?
                    .to_string_lossy()
                    .into_owned();
                a.format = match s.as_str() {
                    "toml" => Format::Toml,
                    "json" => Format::Json,
                    other => {
                        return Err(miette!("--format expects `toml` or `json`, got `{other}`"))
                    }
                };
            }
            Long("all") => a.all = true,
            Short('h') | Long("help") => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                return Err(miette!(
                    "{}; see `cargo xtask plan --help`",
                    other.unexpected()
                ))
            }
        }
    }
    if a.all && (a.device.is_some() || a.model.is_some()) {
        return Err(miette!(
            "--all plans every model on every profile; it cannot be combined with --model or --device"
        ));
    }
    // The default prompt only sets what the prefill prediction is made for: when the context is shorter, predict the
    // longest prompt that fits and say so. A --prompt-len the user gave that does not fit is an error (validate).
    if !prompt_given && a.workload.prompt_len > a.workload.max_model_len {
        a.warnings.push(format!(
            "warning: the default --prompt-len {} is above --max-model-len {}; prefill is predicted for a {}-token \
             prompt",
            a.workload.prompt_len, a.workload.max_model_len, a.workload.max_model_len
        ));
        a.workload.prompt_len = a.workload.max_model_len;
    }
    a.workload.validate().map_err(miette::Report::new)?;
    Ok(a)
}

pub(crate) fn workspace_root() -> PathBuf {
    // xtask lives one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn read(path: &Path, shown: &str) -> Result<SourceFile> {
    let text = std::fs::read_to_string(path)
        .into_diagnostic()
        .wrap_err_with(|| format!("reading {shown}"))?;
    Ok(SourceFile {
        path: shown.to_owned(),
        text,
    })
}

/// Names of the entries of `dir` that satisfy `keep`, sorted.
fn list(dir: &Path, keep: impl Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| keep(&e.path()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

pub(crate) fn available_devices(root: &Path) -> Vec<String> {
    list(&root.join("profiles"), |p| {
        (p.extension()? == "toml")
            .then(|| p.file_stem()?.to_str().map(str::to_owned))
            .flatten()
    })
}

pub(crate) fn available_models(root: &Path) -> Vec<String> {
    list(&root.join("models"), |p| {
        p.join("config.json")
            .is_file()
            .then(|| p.file_name()?.to_str().map(str::to_owned))
            .flatten()
    })
}

/// Whether `--device` names a file rather than a profile in `profiles/`.
fn is_profile_path(device: &str) -> bool {
    device.ends_with(".toml") || device.contains('/') || device.contains(std::path::MAIN_SEPARATOR)
}

pub(crate) fn load_profile(root: &Path, device: &str) -> Result<SourceFile> {
    if is_profile_path(device) {
        let path = Path::new(device);
        if !path.is_file() {
            return Err(miette!(
                "--device `{device}` looks like a path but is not a file; give a profile TOML or one of: {}",
                available_devices(root).join(", ")
            ));
        }
        return read(path, device);
    }
    let devices = available_devices(root);
    if !devices.iter().any(|d| d == device) {
        return Err(miette!(
            "unknown device `{device}`; available: {}",
            devices.join(", ")
        ));
    }
    read(
        &root.join("profiles").join(format!("{device}.toml")),
        &format!("profiles/{device}.toml"),
    )
}

pub(crate) fn load_model(root: &Path, model: &str) -> Result<ModelCard> {
    if is_profile_path(model) || Path::new(model).join("config.json").is_file() {
        return crate::checkpoint::load_dir(Path::new(model));
    }
    let models = available_models(root);
    if !models.iter().any(|m| m == model) {
        return Err(miette!(
            "unknown model `{model}`; available: {}",
            models.join(", ")
        ));
    }
    let dir = root.join("models").join(model);
    let quant_path = dir.join("hf_quant_config.json");
    Ok(ModelCard {
        id: model.to_owned(),
        config: read(
            &dir.join("config.json"),
            &format!("models/{model}/config.json"),
        )?,
        quant_config: if quant_path.is_file() {
            Some(read(
                &quant_path,
                &format!("models/{model}/hf_quant_config.json"),
            )?)
        } else {
            None
        },
    })
}

fn render(plan: &Plan, format: Format) -> Result<String> {
    Ok(match format {
        Format::Toml => plan.to_toml().map_err(miette::Report::new)?,
        Format::Json => {
            let mut s = serde_json::to_string_pretty(plan).into_diagnostic()?;
            s.push('\n');
            s
        }
    })
}

/// Write `text` to `path` atomically: a temporary file beside it, then a rename. Refused before anything is written:
/// a directory, and an existing file without write permission (a rename would replace it even so, and with the
/// temporary file's mode). An existing writable file keeps its permissions. The temporary file never outlives a
/// failure.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| miette!("--out needs a file name, got `{}`", path.display()))?;
    // `symlink_metadata`: a link is replaced by the file, never followed onto its target.
    let existing = match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(e)
                .into_diagnostic()
                .wrap_err_with(|| format!("reading {}", path.display()))
        }
    };
    if let Some(m) = &existing {
        if m.is_dir() {
            return Err(miette!(
                "{} is a directory; --out names the plan file to write",
                path.display()
            ));
        }
        if m.is_file() && m.permissions().readonly() {
            return Err(miette!(
                "{} is read-only; refusing to replace it (make it writable or choose another --out)",
                path.display()
            ));
        }
    }
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        std::fs::write(&tmp, text)
            .into_diagnostic()
            .wrap_err_with(|| format!("writing {}", tmp.display()))?;
        if let Some(m) = existing.as_ref().filter(|m| m.is_file()) {
            std::fs::set_permissions(&tmp, m.permissions())
                .into_diagnostic()
                .wrap_err_with(|| format!("keeping the permissions of {}", path.display()))?;
        }
        std::fs::rename(&tmp, path)
            .into_diagnostic()
            .wrap_err_with(|| format!("renaming onto {}", path.display()))
    })();
    if result.is_err() {
        // Best effort: the temporary file may not exist (the first write failed); its removal failing changes nothing
        // about the error being reported.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub(crate) fn run(args: Vec<OsString>) -> Result<ExitCode> {
    let a = parse_args(args)?;
    for w in &a.warnings {
        eprintln!("{w}");
    }
    let root = workspace_root();
    if a.all {
        return run_all(&root, &a);
    }
    let Some(device) = a.device.as_deref() else {
        return Err(miette!(
            "--device is required (or --all); available: {}; see `cargo xtask plan --help`",
            available_devices(&root).join(", ")
        ));
    };
    let profile = load_profile(&root, device)?;
    let card = load_model(&root, a.model.as_deref().unwrap_or(DEFAULT_MODEL))?;
    let plan = planner::plan::plan(&card, &profile, &a.workload).map_err(miette::Report::new)?;
    // Rendered before anything is printed or written: a plan that cannot be rendered is an error, never a file.
    let text = render(&plan, a.format)?;
    match &a.out {
        Some(out) => {
            print!("{}", plan.summary());
            write_atomic(out, &text)?;
            println!("plan written to {}", out.display());
        }
        None => {
            eprint!("{}", plan.summary());
            print!("{text}");
        }
    }
    Ok(exit_code(&plan))
}

fn exit_code(plan: &Plan) -> ExitCode {
    match plan.verdict {
        planner::Verdict::Fits => ExitCode::SUCCESS,
        planner::Verdict::DoesNotFit => ExitCode::from(EXIT_DOES_NOT_FIT),
    }
}

fn run_all(root: &Path, a: &Args) -> Result<ExitCode> {
    let devices = available_devices(root);
    let models = available_models(root);
    // Read and parse every input first, so the timing below is planning only.
    let mut profiles = Vec::new();
    for d in &devices {
        let file = load_profile(root, d)?;
        let parsed = planner::parse_profile(&file).map_err(miette::Report::new)?;
        profiles.push((file, parsed));
    }
    let mut cards = Vec::new();
    for m in &models {
        let card = load_model(root, m)?;
        let spec = parse_model(&card).map_err(miette::Report::new)?;
        cards.push((card, spec));
    }
    let start = Instant::now();
    let mut plans = Vec::new();
    for (file, profile) in &profiles {
        for (card, spec) in &cards {
            plans.push(planner::plan::plan_parsed(
                spec,
                card,
                profile,
                &file.text,
                &a.workload,
            ));
        }
    }
    let elapsed = start.elapsed();
    println!(
        "{:<28} {:<13} {:<13} {:>10} {:>11} {:>9}  bound",
        "model", "device", "verdict", "decode/s", "prefill/s", "offl GiB"
    );
    let mut refused = 0;
    for (i, r) in plans.iter().enumerate() {
        let (_, profile) = &profiles[i / cards.len()];
        let (card, _) = &cards[i % cards.len()];
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                refused += 1;
                println!(
                    "{:<28} {:<13} {:<13} {:>10} {:>11} {:>9}  {e}",
                    card.id, profile.name, "error", "-", "-", "-"
                );
                continue;
            }
        };
        let verdict = match p.verdict {
            planner::Verdict::Fits => "fits",
            planner::Verdict::DoesNotFit => "does-not-fit",
        };
        let offl = p.placement.offloaded_bytes as f64 / Workload::GIB;
        match (&p.prediction, &p.shortfall) {
            (Some(pr), _) => println!(
                "{:<28} {:<13} {:<13} {:>10.3} {:>11.1} {:>9.2}  {}",
                p.model.id,
                p.device.profile,
                verdict,
                pr.decode_tok_s,
                pr.prefill_tok_s,
                offl,
                pr.bound
            ),
            // A plan that does not fit has no speed: the row names what is short instead.
            (None, sf) => println!(
                "{:<28} {:<13} {:<13} {:>10} {:>11} {:>9.2}  short: {}",
                p.model.id,
                p.device.profile,
                verdict,
                "-",
                "-",
                offl,
                sf.as_ref().map_or_else(
                    || "-".to_owned(),
                    |sf| format!(
                        "{} on `{}`, {:.2} GiB",
                        sf.component,
                        sf.pool,
                        sf.shortfall_bytes as f64 / Workload::GIB
                    )
                )
            ),
        }
    }
    println!(
        "planned {} pairs ({} models x {} profiles) in {:.2} ms (inputs parsed beforehand)",
        plans.len(),
        models.len(),
        devices.len(),
        elapsed.as_secs_f64() * 1e3
    );
    if let Some(dir) = &a.out {
        // With --all, --out names a directory: one plan file per pair.
        std::fs::create_dir_all(dir)
            .into_diagnostic()
            .wrap_err_with(|| format!("creating {}", dir.display()))?;
        let ext = if a.format == Format::Json {
            "json"
        } else {
            "toml"
        };
        for p in plans.iter().flatten() {
            write_atomic(
                &dir.join(format!("{}@{}.{ext}", p.model.id, p.device.profile)),
                &render(p, a.format)?,
            )?;
        }
        println!(
            "{} plans written to {}",
            plans.len() - refused,
            dir.display()
        );
    }
    if refused > 0 {
        return Err(miette!(
            "{refused} of {} pairs were refused with an error (see the table)",
            plans.len()
        ));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn err(v: &[&str]) -> String {
        match parse_args(args(v)) {
            Ok(_) => panic!("{v:?} should be rejected"),
            Err(e) => format!("{e}"),
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let a = parse_args(args(&["--device", "h200"])).unwrap();
        assert_eq!(a.device.as_deref(), Some("h200"));
        assert_eq!(a.workload, Workload::default());
        let a = parse_args(args(&[
            "--max-model-len",
            "8192",
            "--max-num-seqs",
            "2",
            "--offload-gib",
            "10",
            "--priority",
            "fidelity",
            "--engine",
            "vllm",
            "--images",
            "--speculative",
            "--format",
            "json",
            "--prefill-activations",
            "int16",
        ]))
        .unwrap();
        let w = &a.workload;
        assert_eq!((w.max_model_len, w.max_num_seqs), (8192, 2));
        assert_eq!(w.offload_bytes, Some(10 << 30));
        assert!(w.images && w.speculative);
        assert_eq!(
            (w.priority, w.engine),
            (Priority::Fidelity, TargetEngine::Vllm)
        );
        assert_eq!(a.format, Format::Json);
        assert_eq!(
            w.prefill_activations,
            Some(planner::weight_path::PrefillActivations::Int16)
        );
    }

    #[test]
    fn bad_arguments_say_what_was_expected() {
        assert!(err(&["--max-model-len", "lots"]).contains("whole number"));
        assert!(err(&["--offload-gib", "-1"]).contains(">= 0"));
        assert!(err(&["--priority", "turbo"]).contains("`speed` or `fidelity`"));
        assert!(err(&["--format", "yaml"]).contains("`toml` or `json`"));
        assert!(err(&["--prefill-activations", "int4"]).contains("`int16` or `int8`, got `int4`"));
        assert!(err(&["--max-model-len", "0"]).contains("max_model_len"));
        assert!(err(&["--bogus"]).contains("--bogus"));
    }

    #[test]
    fn unknown_device_and_model_list_the_available_ones() {
        let root = workspace_root();
        let e = format!("{}", load_profile(&root, "nope").unwrap_err());
        assert!(e.contains("ryzen-5090") && e.contains("h200"), "{e}");
        let e = format!("{}", load_model(&root, "nope").unwrap_err());
        assert!(e.contains(DEFAULT_MODEL), "{e}");
    }

    /// A fresh empty directory under the system temp dir, removed by the caller.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("edgefit-xtask-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn run_err(v: &[&str]) -> String {
        match run(args(v)) {
            Ok(code) => panic!("{v:?} should fail, exited {code:?}"),
            Err(e) => format!("{e}"),
        }
    }

    #[test]
    fn all_with_model_or_device_is_an_error() {
        assert!(err(&["--all", "--model", "gemma-3-1b"]).contains("--all"));
        assert!(err(&["--device", "h200", "--all"]).contains("cannot be combined"));
    }

    #[test]
    fn prompt_len_above_context_is_an_error_and_the_default_warns() {
        let e = err(&["--max-model-len", "256", "--prompt-len", "512"]);
        assert!(
            e.contains("prompt_len 512 is above max_model_len 256"),
            "{e}"
        );
        let a = parse_args(args(&["--device", "h200", "--max-model-len", "256"])).unwrap();
        assert_eq!(a.workload.prompt_len, 256);
        assert_eq!(a.warnings.len(), 1);
        assert!(
            a.warnings[0].contains("default --prompt-len 512"),
            "{:?}",
            a.warnings
        );
    }

    /// Issue 23 §6, reproduced first: each of these panicked or wrote a corrupt file with exit 0.
    #[test]
    fn numbers_no_plan_can_hold_are_errors_naming_the_input() {
        let e = err(&["--offload-gib", "8589934592"]);
        assert!(e.contains("--offload-gib 8589934592"), "{e}");
        let e = run_err(&[
            "--device",
            "ryzen-5090",
            "--max-model-len",
            "18446744073709551615",
        ]);
        assert!(e.contains("max_model_len 18446744073709551615"), "{e}");
        // Within max_position_embeddings but with a cache no plan can hold.
        let e = run_err(&[
            "--device",
            "ryzen-5090",
            "--max-num-seqs",
            "18446744073709551615",
        ]);
        assert!(e.contains("max_num_seqs 18446744073709551615"), "{e}");
        let e = run_err(&["--device", "ryzen-5090", "--offload-gib", "1000"]);
        assert!(e.contains("decoder-layer weights"), "{e}");
        let e = run_err(&["--device", "avx512-2core", "--offload-gib", "1"]);
        assert!(e.contains("nowhere to offload"), "{e}");
    }

    #[test]
    fn a_plan_that_does_not_fit_exits_2_and_still_writes_its_verdict() {
        let dir = scratch("nofit");
        let out = dir.join("p.toml");
        let code = run(args(&[
            "--device",
            "ryzen-5090",
            "--engine",
            "vllm",
            "--offload-gib",
            "4",
            "--out",
            out.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(code, ExitCode::from(EXIT_DOES_NOT_FIT));
        let plan = Plan::from_toml("p.toml", &std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(plan.verdict, planner::Verdict::DoesNotFit);
        assert!(plan.prediction.is_none());
        let sf = plan.shortfall.unwrap();
        assert_eq!(
            (sf.pool.as_str(), sf.component.as_str()),
            ("vram", "weights")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn out_naming_a_directory_is_refused_and_leaves_nothing_behind() {
        let dir = scratch("outdir");
        let target = dir.join("plans");
        std::fs::create_dir(&target).unwrap();
        let e = run_err(&["--device", "h200", "--out", target.to_str().unwrap()]);
        assert!(e.contains("is a directory"), "{e}");
        assert_eq!(entries(&dir), ["plans"], "no temporary file is left behind");
        assert!(entries(&target).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn out_onto_a_read_only_file_is_refused_and_the_file_is_untouched() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("readonly");
        let out = dir.join("p.toml");
        std::fs::write(&out, "keep me\n").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o444)).unwrap();
        let e = run_err(&["--device", "h200", "--out", out.to_str().unwrap()]);
        assert!(e.contains("read-only"), "{e}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me\n");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444);
        assert_eq!(entries(&dir), ["p.toml"]);
        // A writable file is replaced and keeps its mode.
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        run(args(&["--device", "h200", "--out", out.to_str().unwrap()])).unwrap();
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        assert!(std::fs::read_to_string(&out)
            .unwrap()
            .contains("verdict = \"fits\""));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_accepts_a_path_to_a_profile() {
        let dir = scratch("profile-path");
        let text = std::fs::read_to_string(workspace_root().join("profiles/h200.toml"))
            .unwrap()
            .replacen("name = \"h200\"", "name = \"my-h200\"", 1);
        // The profile's name must match its file's stem, wherever the file is.
        let path = dir.join("my-h200.toml");
        std::fs::write(&path, &text).unwrap();
        let out = dir.join("p.toml");
        let code = run(args(&[
            "--device",
            path.to_str().unwrap(),
            "--model",
            "gemma-3-1b",
            "--out",
            out.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let plan = Plan::from_toml("p.toml", &std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(plan.device.profile, "my-h200");
        let e = format!(
            "{}",
            load_profile(&workspace_root(), "no/such.toml").unwrap_err()
        );
        assert!(e.contains("not a file") && e.contains("h200"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The CLI's numbers never panic the argument parser or the planner (issue 23 §6): boundary values and a
    /// deterministic pseudo-random sweep, for every numeric flag. xtask has no proptest dependency, so the inputs come
    /// from a fixed LCG; the count tried is asserted so a report can quote it.
    #[test]
    fn cli_numbers_never_panic() {
        let root = workspace_root();
        let profile = load_profile(&root, "ryzen-5090").unwrap();
        let card = load_model(&root, "spark-x2.5-1.7b").unwrap();
        let mut values: Vec<String> = [
            "0",
            "1",
            "-1",
            "1.5",
            "1e3",
            "nan",
            "inf",
            "-0",
            "",
            " 1",
            "0x10",
            "4096",
            "262144",
            "1048576",
            "4294967296",
            "9007199254740993",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "8589934591",
            "8589934592",
            "1e300",
            "1e-300",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..200 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            values.push((x >> (x % 64)).to_string());
            values.push(format!("{}", f64::from_bits(x >> 2)));
        }
        let flags = [
            "--max-model-len",
            "--max-num-seqs",
            "--prompt-len",
            "--offload-gib",
        ];
        let mut tried = 0;
        for flag in flags {
            for v in &values {
                tried += 1;
                let Ok(a) = parse_args(args(&["--device", "ryzen-5090", flag, v])) else {
                    continue;
                };
                if let Ok(plan) = planner::plan::plan(&card, &profile, &a.workload) {
                    assert!(plan.to_toml().is_ok(), "{flag} {v}");
                }
            }
        }
        assert_eq!(tried, 4 * (24 + 400));
    }

    #[test]
    fn readme_command_writes_a_plan_atomically() {
        let dir = std::env::temp_dir().join(format!("edgefit-xtask-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("plan.toml");
        let code = run(args(&[
            "--device",
            "ryzen-5090",
            "--out",
            out.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let text = std::fs::read_to_string(&out).unwrap();
        let plan = Plan::from_toml("plan.toml", &text).unwrap();
        assert_eq!(plan.model.id, DEFAULT_MODEL);
        assert_eq!(plan.verdict, planner::Verdict::Fits);
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
