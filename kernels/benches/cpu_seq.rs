//! CPU benchmark `cpu_seq` (see kernels/Cargo.toml).
fn main() {}
