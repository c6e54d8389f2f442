//! Plain Rust references (f32/f64 arithmetic, no tricks) for every kernel. Tests compare the C and CUDA kernels
//! against these on fresh random inputs; the CUDA tests use them as their oracle too.

pub mod attention;
pub mod gdn;
pub mod linear;
pub mod moe;
pub mod ops;
