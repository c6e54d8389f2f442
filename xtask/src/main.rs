//! `cargo xtask` — the front door. Each subcommand lives in its own module:
//! `plan` (plan.rs), `codegen` (codegen.rs), `bench` (bench.rs), `fixtures` (fixtures.rs).

use std::process::ExitCode;

use miette::Result;

mod bench;
mod checkpoint;
mod codegen;
mod fixtures;
mod plan;

fn main() -> Result<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    let Some(cmd) = args.next() else {
        print_usage();
        return Ok(ExitCode::SUCCESS);
    };
    let rest: Vec<std::ffi::OsString> = args.collect();
    match cmd.to_str() {
        Some("plan") => plan::run(rest),
        Some("codegen") => codegen::run(rest).map(|()| ExitCode::SUCCESS),
        Some("bench") => bench::run(rest).map(|()| ExitCode::SUCCESS),
        Some("fixtures") => fixtures::run(rest).map(|()| ExitCode::SUCCESS),
        Some("help" | "--help" | "-h") => {
            print_usage();
            Ok(ExitCode::SUCCESS)
        }
        other => Err(miette::miette!(
            "unknown subcommand `{}`; expected one of: plan, codegen, bench, fixtures",
            other.unwrap_or("<non-utf8>")
        )),
    }
}

fn print_usage() {
    println!(
        "usage: cargo xtask <command> [options]\n\n\
         commands:\n  \
         plan      plan a model on a device profile (cargo xtask plan --device ryzen-5090)\n  \
         codegen   regenerate the committed JSON Schemas (--check to verify only)\n  \
         bench     run the CPU benchmarks (bench cpu); build the GPU one to carry (bench gpu)\n  \
         fixtures  write the engine's parity fixtures (engine/tests/fixtures)"
    );
}
