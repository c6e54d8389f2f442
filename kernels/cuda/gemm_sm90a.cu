// Placeholder: the kernels of this module are being written (see kernels/src/cuda/gemm_sm90a.rs).
