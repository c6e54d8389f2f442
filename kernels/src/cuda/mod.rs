//! GPU kernels (CUDA, sm_90). Without the `cuda` feature every entry point returns
//! [`crate::KernelError::NotCompiledWithCuda`], so call sites carry no `cfg`.
