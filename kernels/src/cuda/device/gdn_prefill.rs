//! Placeholder: the launches of `kernels/cuda/gdn_prefill.cu` go here (an `impl Device` block).
