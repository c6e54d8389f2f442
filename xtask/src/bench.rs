//! `cargo xtask bench`.

use std::ffi::OsString;

pub(crate) fn run(_args: Vec<OsString>) -> miette::Result<()> {
    Err(miette::miette!("`cargo xtask bench` is not implemented yet"))
}
