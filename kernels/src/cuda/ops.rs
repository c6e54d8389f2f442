//! Placeholder: the safe entry points of `kernels/cuda/ops.cu` go here (an `impl Gpu` block).
