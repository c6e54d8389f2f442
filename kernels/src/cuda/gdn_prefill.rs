//! Placeholder: the safe entry points of `kernels/cuda/gdn_prefill.cu` go here (an `impl Gpu` block).
