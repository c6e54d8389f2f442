//! `cargo xtask fixtures [DIR]`: writes the engine's parity fixtures (tiny random-weight checkpoints in every
//! format the engine runs) by running the engine's generator, then reminds how to refresh their goldens.

use std::process::Command;

use miette::{IntoDiagnostic, Result};

pub(crate) fn run(args: Vec<std::ffi::OsString>) -> Result<()> {
    let dir = args
        .first()
        .and_then(|a| a.to_str())
        .unwrap_or("engine/tests/fixtures")
        .to_string();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "engine",
            "--example",
            "fixtures",
            "--",
        ])
        .arg(&dir)
        .status()
        .into_diagnostic()?;
    if !status.success() {
        miette::bail!("the fixture generator failed ({status})");
    }
    println!(
        "goldens: python engine/tests/fixtures/make_golden.py {dir}  (needs torch + transformers 5.x; commit both)"
    );
    Ok(())
}
