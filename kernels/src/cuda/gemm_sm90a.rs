//! Placeholder: the safe entry points of `kernels/cuda/gemm_sm90a.cu` go here (an `impl Gpu` block).
