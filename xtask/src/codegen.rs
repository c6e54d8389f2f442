//! `cargo xtask codegen`.

use std::ffi::OsString;

pub(crate) fn run(_args: Vec<OsString>) -> miette::Result<()> {
    Err(miette::miette!("`cargo xtask codegen` is not implemented yet"))
}
