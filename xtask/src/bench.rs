//! `cargo xtask bench cpu | gpu`: the kernel benchmarks, in one command each.
//!
//! `cpu` runs `cargo bench -p kernels --bench cpu_gemv --bench cpu_seq` (weight GEMV/GEMM against the machine's
//! read bandwidth and PyTorch's CPU int4/bf16 paths; the DeltaNet and attention sequences), streaming their output.
//! Each bench prints a short summary table last. Knobs are environment variables read by the benches themselves
//! (`EDGEFIT_BENCH_MIB`, `EDGEFIT_BENCH_REPS`, `EDGEFIT_TORCH_PYTHON`; see `kernels/benches/cpu_gemv.rs`).
//!
//! `gpu` builds the GPU benchmark (`kernels/benches/gpu.rs`, the public `Gpu` calls the engine makes) in release
//! with the `cuda` feature (`NVCC` as for any CUDA build) and packs it, without debug info, into
//! `target-carry/gpu_bench.tar.gz` for the device tool, which has no Rust toolchain:
//! `kernels/bench/h200/run_session.sh` unpacks and runs it there, then the Python baselines. `--lab` adds the
//! variant rows (the `lab` feature); `--out DIR` packs elsewhere.

use miette::{miette, IntoDiagnostic, Result};
use std::ffi::OsString;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub(crate) fn run(args: Vec<OsString>) -> Result<()> {
    let mut args = args.into_iter();
    let target = args.next();
    match target.as_ref().and_then(|t| t.to_str()) {
        Some("cpu") => {
            if let Some(extra) = args.next() {
                return Err(miette!("unexpected argument {extra:?} after `cpu`"));
            }
            cpu()
        }
        Some("gpu") => gpu(GpuArgs::parse(args)?),
        Some(other) => Err(miette!(
            "unknown bench target `{other}`; expected `cpu` or `gpu`"
        )),
        None => Err(miette!(
            "usage: cargo xtask bench cpu | gpu [--lab] [--out DIR]"
        )),
    }
}

fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"))
}

fn cpu() -> Result<()> {
    let status = Command::new(cargo())
        .args([
            "bench", "-p", "kernels", "--bench", "cpu_gemv", "--bench", "cpu_seq",
        ])
        .status()
        .into_diagnostic()?;
    if !status.success() {
        return Err(miette!("`cargo bench -p kernels` failed ({status})"));
    }
    Ok(())
}

#[derive(Debug, PartialEq)]
struct GpuArgs {
    lab: bool,
    out: PathBuf,
}

impl GpuArgs {
    fn parse(args: impl IntoIterator<Item = OsString>) -> Result<GpuArgs> {
        use lexopt::prelude::*;
        let mut p = lexopt::Parser::from_args(args);
        let mut a = GpuArgs {
            lab: false,
            out: PathBuf::from("target-carry"),
        };
        while let Some(arg) = p.next().into_diagnostic()? {
            match arg {
                Long("lab") => a.lab = true,
                Long("out") => a.out = p.value().into_diagnostic()?.into(),
                other => {
                    return Err(miette!(
                        "{}; usage: cargo xtask bench gpu [--lab] [--out DIR]",
                        other.unexpected()
                    ))
                }
            }
        }
        Ok(a)
    }
}

/// The name of the executable in the carry (and on the device).
const BIN: &str = "gpu_bench";

fn gpu(a: GpuArgs) -> Result<()> {
    let features = if a.lab {
        "kernels/cuda,kernels/lab"
    } else {
        "kernels/cuda"
    };
    // cargo's JSON messages name the built executable (a bench has a hashed name under deps/); with
    // `json-render-diagnostics` the compiler's messages still reach the terminal, rendered, on stderr.
    let mut child = Command::new(cargo())
        .args([
            "build",
            "--release",
            "-p",
            "kernels",
            "--bench",
            "gpu",
            "--features",
            features,
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .into_diagnostic()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| miette!("no stdout from cargo"))?;
    let mut exe = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.into_diagnostic()?;
        if let Some(path) = bench_executable(&line) {
            exe = Some(path);
        }
    }
    let status = child.wait().into_diagnostic()?;
    if !status.success() {
        return Err(miette!(
            "`cargo build --bench gpu --features {features}` failed ({status}); is NVCC set?"
        ));
    }
    let exe = exe.ok_or_else(|| miette!("cargo built no `gpu` bench executable"))?;
    pack(&exe, &a.out)
}

/// The executable of the `gpu` bench target, from one line of cargo's JSON messages.
fn bench_executable(line: &str) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["reason"] != "compiler-artifact" || v["target"]["name"] != "gpu" {
        return None;
    }
    v["executable"].as_str().map(PathBuf::from)
}

/// Copies `exe` as `gpu_bench` into a fresh staging folder, strips its debug info (the release profile keeps line
/// tables: ~54 MB against ~39 MB stripped, ~7 MB packed) and packs it into `out/gpu_bench.tar.gz`.
fn pack(exe: &Path, out: &Path) -> Result<()> {
    let stage = out.join("gpu_bench.stage");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).into_diagnostic()?;
    let bin = stage.join(BIN);
    std::fs::copy(exe, &bin).into_diagnostic()?;
    match Command::new("strip")
        .arg("--strip-debug")
        .arg(&bin)
        .status()
    {
        Ok(s) if s.success() => {}
        // Unstripped still runs; it only costs carry space.
        _ => eprintln!("note: `strip --strip-debug` failed or is missing; packing with debug info"),
    }
    let tgz = out.join("gpu_bench.tar.gz");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&stage)
        .arg("-czf")
        .arg(&tgz)
        .arg(BIN)
        .status()
        .into_diagnostic()?;
    std::fs::remove_dir_all(&stage).into_diagnostic()?;
    if !status.success() {
        return Err(miette!("tar failed ({status})"));
    }
    let size = std::fs::metadata(&tgz).into_diagnostic()?.len();
    println!(
        "{} ({:.1} MB): carry `{}`; on the device `tar -C /tmp -xzf {} && /tmp/{BIN} --json $OUT/gpu_bench.json`",
        tgz.display(),
        size as f64 / 1e6,
        out.display(),
        tgz.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_arguments() {
        let parse = |a: &[&str]| GpuArgs::parse(a.iter().map(OsString::from));
        assert_eq!(
            parse(&[]).unwrap(),
            GpuArgs {
                lab: false,
                out: "target-carry".into()
            }
        );
        assert_eq!(
            parse(&["--lab", "--out", "x"]).unwrap(),
            GpuArgs {
                lab: true,
                out: "x".into()
            }
        );
        assert!(parse(&["--nope"]).is_err());
        assert!(parse(&["--out"]).is_err());
    }

    #[test]
    fn finds_the_bench_executable() {
        let line = r#"{"reason":"compiler-artifact","target":{"name":"gpu","kind":["bench"]},"executable":"/t/release/deps/gpu-abc"}"#;
        assert_eq!(
            bench_executable(line),
            Some(PathBuf::from("/t/release/deps/gpu-abc"))
        );
        let other =
            r#"{"reason":"compiler-artifact","target":{"name":"kernels"},"executable":null}"#;
        assert_eq!(bench_executable(other), None);
        assert_eq!(bench_executable("not json"), None);
    }
}
