//! `cargo xtask bench cpu`: the CPU kernel benchmarks, in one command.
//!
//! Runs `cargo bench -p kernels --bench cpu_gemv --bench cpu_seq` (weight GEMV/GEMM against the machine's read
//! bandwidth and PyTorch's CPU int4/bf16 paths; the DeltaNet and attention sequences), streaming their output.
//! Each bench prints a short summary table last. Knobs are environment variables read by the benches themselves
//! (`EDGEFIT_BENCH_MIB`, `EDGEFIT_BENCH_REPS`, `EDGEFIT_TORCH_PYTHON`; see `kernels/benches/cpu_gemv.rs`).

use miette::{miette, IntoDiagnostic, Result};
use std::ffi::OsString;
use std::process::Command;

pub(crate) fn run(args: Vec<OsString>) -> Result<()> {
    let mut args = args.into_iter();
    let target = args.next();
    match target.as_ref().and_then(|t| t.to_str()) {
        Some("cpu") => {}
        Some(other) => return Err(miette!("unknown bench target `{other}`; expected `cpu`")),
        None => return Err(miette!("usage: cargo xtask bench cpu")),
    }
    if let Some(extra) = args.next() {
        return Err(miette!("unexpected argument {extra:?} after `cpu`"));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let status = Command::new(cargo)
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
