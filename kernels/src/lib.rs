//! Kernels for the operations edgefit plans choose: hand-written C (AVX-512 / AVX2 / portable scalar) for the CPU
//! and CUDA for the GPU, each behind a safe Rust API that checks every size and stride before the call, and each
//! with a plain Rust reference in [`mod@reference`] that the tests compare against.
//!
//! CPU dispatch is decided once at run time ([`cpu::Isa::detected`]); every entry point also has a `_with(isa, ..)`
//! form so tests can drive each path this machine has. The GPU API ([`cuda`]) exists in every build and returns
//! [`KernelError::NotCompiledWithCuda`] when the crate was built without the `cuda` feature.

pub mod attention;
pub mod backend;
pub mod cpu;
pub mod cuda;
mod error;
pub mod formats;
pub mod gdn;
pub mod isa;
pub mod linear;
pub mod moe;
pub mod ops;
pub mod reference;
pub mod sampling;
pub mod shapes;

pub use error::KernelError;
