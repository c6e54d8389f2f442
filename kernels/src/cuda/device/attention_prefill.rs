//! Placeholder: the launches of `kernels/cuda/attention_prefill.cu` go here (an `impl Device` block).
