//! Placeholder: the safe entry points of `kernels/cuda/attention_prefill.cu` go here (an `impl Gpu` block).
