// Placeholder: the kernels of this module are being written (see kernels/src/cuda/ops.rs).
