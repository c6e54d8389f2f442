//! `cargo xtask plan`.

use std::ffi::OsString;

pub(crate) fn run(_args: Vec<OsString>) -> miette::Result<()> {
    Err(miette::miette!("`cargo xtask plan` is not implemented yet"))
}
