//! CPU benchmark `cpu_gemv` (see kernels/Cargo.toml).
fn main() {}
