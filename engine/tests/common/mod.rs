//! Helpers the engine's test binaries share (each `tests/*.rs` is its own crate and includes this module).

use std::path::PathBuf;

/// Whether this machine has a CUDA device the engine can use (says "skipped" when not).
pub(crate) fn cuda_here() -> bool {
    match kernels::cuda::Gpu::probe() {
        Ok(Some(_)) => true,
        Ok(None) => {
            println!("skipped: no CUDA device");
            false
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            false
        }
    }
}

/// The parity fixtures' directory: `EDGEFIT_FIXTURES` where a test binary built here runs on another machine (the
/// GPU runs), else the crate's own.
#[allow(dead_code)] // not every test binary reads fixtures by directory
pub(crate) fn fixtures_root() -> PathBuf {
    std::env::var_os("EDGEFIT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}
