//! CUDA half of the build script: with the `cuda` feature, compile `cuda/*.cu` with nvcc into PTX/cubins in
//! `OUT_DIR` for embedding. Owned by the CUDA kernels work; until then it does nothing.

pub(crate) fn build() {
    println!("cargo:rerun-if-changed=cuda");
}
