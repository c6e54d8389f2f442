//! `cargo xtask codegen [--check]`: regenerate the committed JSON Schemas (`schemas/plan.schema.json`,
//! `schemas/profile.schema.json`) from the planner's serde/schemars types. `--check` only compares and fails on
//! drift; the planner's test suite makes the same comparison so CI catches a forgotten regeneration.

use std::ffi::OsString;

use miette::{miette, IntoDiagnostic, Result, WrapErr};

use crate::plan::{workspace_root, write_atomic};

pub(crate) fn run(args: Vec<OsString>) -> Result<()> {
    let mut check = false;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| miette!("{e}"))? {
        match arg {
            lexopt::Arg::Long("check") => check = true,
            other => {
                return Err(miette!(
                    "{}\nusage: cargo xtask codegen [--check]",
                    other.unexpected()
                ))
            }
        }
    }
    let root = workspace_root();
    let mut stale = Vec::new();
    for (rel, text) in planner::plan::schema_files() {
        let path = root.join(rel);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == text {
            continue;
        }
        if check {
            stale.push(rel);
        } else {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .into_diagnostic()
                    .wrap_err_with(|| format!("creating {}", dir.display()))?;
            }
            write_atomic(&path, &text)?;
            println!("wrote {rel}");
        }
    }
    if !stale.is_empty() {
        return Err(miette!(
            "{} out of date; run `cargo xtask codegen`",
            stale.join(", ")
        ));
    }
    if check {
        println!("schemas are up to date");
    }
    Ok(())
}
