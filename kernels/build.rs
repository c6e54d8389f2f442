//! Compiles the C kernels in `csrc/` with `cc`, one static library per instruction set, and (with the `cuda`
//! feature) the CUDA kernels in `cuda/` with nvcc (see `build_cuda.rs`).
//!
//! File naming decides the flags, so adding a kernel never needs an edit here:
//! `csrc/*_avx512.c` get AVX-512 F/BW/VL/VNNI/BF16 + FMA, `csrc/*_avx2.c` get AVX2 + FMA + F16C, every other
//! `csrc/*.c` is portable C compiled for the baseline target. The Rust side picks the path at run time
//! (`kernels::cpu::Isa`), so a binary built here still runs on a CPU without AVX-512.

use std::path::{Path, PathBuf};

#[path = "build_cuda.rs"]
mod build_cuda;

fn main() {
    let csrc = Path::new("csrc");
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=CFLAGS");

    let mut portable = Vec::new();
    let mut avx2 = Vec::new();
    let mut avx512 = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(csrc)
        .expect("kernels/csrc must exist")
        .map(|e| e.expect("readable csrc entry").path())
        .collect();
    entries.sort();
    for path in entries {
        println!("cargo:rerun-if-changed={}", path.display());
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.ends_with(".c") {
            continue; // headers are tracked above through rerun-if-changed
        }
        if name.ends_with("_avx512.c") {
            avx512.push(path);
        } else if name.ends_with("_avx2.c") {
            avx2.push(path);
        } else {
            portable.push(path);
        }
    }

    let x86 = std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64");
    compile("edgefit_portable", &portable, &[]);
    if x86 {
        compile("edgefit_avx2", &avx2, &["-mavx2", "-mfma", "-mf16c"]);
        compile(
            "edgefit_avx512",
            &avx512,
            &[
                "-mavx2",
                "-mfma",
                "-mf16c",
                "-mavx512f",
                "-mavx512bw",
                "-mavx512vl",
                "-mavx512dq",
                "-mavx512vnni",
                "-mavx512bf16",
            ],
        );
        println!("cargo:rustc-cfg=edgefit_x86_kernels");
    }
    println!("cargo:rustc-check-cfg=cfg(edgefit_x86_kernels)");

    build_cuda::build();
}

fn compile(lib: &str, files: &[PathBuf], flags: &[&str]) {
    if files.is_empty() {
        return;
    }
    let mut b = cc::Build::new();
    b.include("csrc")
        .opt_level(3)
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true);
    b.flag_if_supported("-fno-math-errno");
    for f in flags {
        b.flag(f);
    }
    for f in files {
        b.file(f);
    }
    b.compile(lib);
}
