//! Placeholder: the launches of `kernels/cuda/ops.cu` go here (an `impl Device` block).
