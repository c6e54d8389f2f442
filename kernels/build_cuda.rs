//! CUDA half of the build script. With the `cuda` feature, every `cuda/*.cu` is compiled by nvcc to PTX for
//! `compute_90` and assembled by `ptxas` to an `sm_90` cubin, so a PTX that would not assemble fails here rather
//! than at load time on a borrowed GPU. Both are embedded: an sm_90 device (the H200) loads the cubin, with no JIT
//! at start-up; any other device of compute capability 9.0 or later loads the PTX, which its driver compiles.
//! Files named `*_sm90a.cu` (kernels that use `wgmma`/`setmaxnreg`) go to `compute_90a` PTX and an `sm_90a`
//! cubin, and only the cubin is embedded (the `a` features run on compute capability 9.0 exactly).
//!
//! The outputs land in `OUT_DIR` with a generated `cuda_modules.rs` that embeds them (`include_str!` /
//! `include_bytes!`) and lists each module's entry points (read from the PTX's `.entry` lines), so the crate
//! carries its kernels and needs no toolkit at run time, only the driver, and no Rust file keeps a list of them.
//!
//! With the `lab` feature the .cu files are compiled with `EDGEFIT_LAB=1`, which adds the entry points only
//! variant calls launch (tests and benchmarks of losing builds); without it they are not compiled at all.
//!
//! nvcc is looked up in this order: `$NVCC`, `$CUDA_HOME/bin/nvcc`, `nvcc` on `PATH`, then the pip install that
//! `.ci/run` makes under `.venv-cuda/`. It must be 13.0: the lent GPU's driver (580) rejects PTX of newer toolkits.

use std::path::{Path, PathBuf};
use std::process::Command;

const INSTALL_HINT: &str = "install the pinned nvcc 13.0 from PyPI, e.g.\n  python3 -m venv .venv-cuda && \
.venv-cuda/bin/pip install nvidia-cuda-nvcc==13.0.88 'nvidia-nvvm==13.0.*' 'nvidia-cuda-runtime==13.0.*' \
'nvidia-cuda-crt==13.0.*' 'nvidia-cuda-cccl==13.0.*'\n(run from the workspace root), or point NVCC at an nvcc 13.0";

pub(crate) fn build() {
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let nvcc = find_nvcc(&manifest).unwrap_or_else(|tried| {
        panic!("the `cuda` feature needs nvcc 13.0, not found (tried {tried}); {INSTALL_HINT}")
    });
    check_version(&nvcc);

    // Entry points that exist only so tests and benchmarks can drive a variant sit in `#if EDGEFIT_LAB` blocks of
    // the .cu files: the default build embeds only what an `Auto` choice can launch.
    let lab = std::env::var_os("CARGO_FEATURE_LAB").is_some();
    let lab_define = if lab {
        "-DEDGEFIT_LAB=1"
    } else {
        "-DEDGEFIT_LAB=0"
    };

    let cuda_dir = manifest.join("cuda");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&cuda_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", cuda_dir.display()))
        .map(|e| e.expect("readable cuda/ entry").path())
        .collect();
    sources.sort();
    let ptxas = nvcc.with_file_name("ptxas");
    let mut modules = Vec::new();
    for path in &sources {
        println!("cargo:rerun-if-changed={}", path.display());
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix(".cu") else {
            continue;
        };
        // `*_sm90a.cu` use wgmma/setmaxnreg: their PTX targets compute_90a, which only sm_90a runs, so only the
        // cubin is embedded; the PTX is still written to read the entry points from.
        let sm90a = stem.ends_with("_sm90a");
        let (virt, real) = if sm90a {
            ("compute_90a", "sm_90a")
        } else {
            ("compute_90", "sm_90")
        };
        let ptx = out_dir.join(format!("{stem}.ptx"));
        run(
            Command::new(&nvcc)
                .arg("-ptx")
                .arg(format!("-arch={virt}"))
                .args(common_flags())
                .arg(lab_define)
                .arg("-o")
                .arg(&ptx)
                .arg(path),
            path,
        );
        // Assemble the PTX here so that register spills and ptxas errors show up in the build, not at load time on
        // a borrowed GPU; the resource report goes to OUT_DIR for reading (`-v`).
        // `<stem>.sm_90.cubin` beside the PTX; an sm_90a-only module's cubin is `<stem>.cubin` (the H200 bench
        // scripts load both by these names).
        let cubin = if sm90a {
            out_dir.join(format!("{stem}.cubin"))
        } else {
            out_dir.join(format!("{stem}.{real}.cubin"))
        };
        let report = out_dir.join(format!("{stem}.ptxas.txt"));
        let output = Command::new(&ptxas)
            .arg(format!("-arch={real}"))
            .args(["-O3", "--generate-line-info", "-v", "-o"])
            .arg(&cubin)
            .arg(&ptx)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
        std::fs::write(&report, [&output.stdout[..], &output.stderr[..]].concat())
            .unwrap_or_else(|e| panic!("{}: {e}", report.display()));
        if !output.status.success() {
            panic!(
                "ptxas rejected {}:\n{}",
                ptx.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let text =
            std::fs::read_to_string(&ptx).unwrap_or_else(|e| panic!("{}: {e}", ptx.display()));
        modules.push(CudaModule {
            stem: stem.to_string(),
            ptx: (!sm90a).then_some(ptx),
            cubin,
            entries: ptx_entries(&text),
        });
    }
    let generated = module_table(&modules);
    let gen_path = out_dir.join("cuda_modules.rs");
    std::fs::write(&gen_path, generated).unwrap_or_else(|e| panic!("{}: {e}", gen_path.display()));
}

/// One compiled `cuda/<stem>.cu`.
struct CudaModule {
    stem: String,
    /// The PTX to embed (`None` for the sm_90a-only modules).
    ptx: Option<PathBuf>,
    cubin: PathBuf,
    /// The kernels' names, from the PTX's `.entry` lines.
    entries: Vec<String>,
}

/// The names of the kernels a PTX module defines: the `.entry` directives (`.visible .entry name(`). Read from
/// the compiler's output rather than the .cu text, where most entry points are stamped out by macros.
fn ptx_entries(ptx: &str) -> Vec<String> {
    let mut names: Vec<String> = ptx
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix(".visible ")?.trim_start();
            let rest = rest.strip_prefix(".entry ")?.trim_start();
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            Some(rest[..end].to_string())
        })
        .collect();
    names.sort();
    names
}

/// `cuda_modules.rs`: the `Module` enum (one variant per .cu file), its embedded images and its entry points, so
/// that adding a .cu file or a kernel needs no hand-kept list on the Rust side.
fn module_table(modules: &[CudaModule]) -> String {
    let camel = |stem: &str| -> String {
        stem.split('_')
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or_default()
            })
            .collect()
    };
    let lit = |p: &Path| format!("{:?}", p.display().to_string());
    let mut g = String::from(
        "// Generated by kernels/build_cuda.rs: the embedded CUDA modules, one per kernels/cuda/*.cu.\n\n\
         /// An embedded module (`kernels/cuda/<file>.cu`), loaded at most once per context.\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\n\
         pub(crate) enum Module {\n",
    );
    for m in modules {
        g.push_str(&format!(
            "    /// `cuda/{}.cu`.\n    {},\n",
            m.stem,
            camel(&m.stem)
        ));
    }
    g.push_str(
        "}\n\nimpl Module {\n    /// Every module, in file order.\n    #[allow(dead_code)]\n",
    );
    g.push_str("    pub(crate) const ALL: &'static [Module] = &[");
    for m in modules {
        g.push_str(&format!("Module::{}, ", camel(&m.stem)));
    }
    g.push_str("];\n");
    // One `match self` method per property, an arm per module.
    let mut method = |doc: &str, sig: &str, arm: &dyn Fn(&CudaModule) -> String| {
        g.push_str(&format!("\n    /// {doc}\n    #[allow(dead_code)]\n    pub(crate) fn {sig} {{\n        match self {{\n"));
        for m in modules {
            g.push_str(&format!(
                "            Module::{} => {},\n",
                camel(&m.stem),
                arm(m)
            ));
        }
        g.push_str("        }\n    }\n");
    };
    method(
        "The source file's stem.",
        "stem(self) -> &'static str",
        &|m| format!("{:?}", m.stem),
    );
    method(
        "The PTX (`compute_90`), which any device of compute capability 9.0 or later can JIT; `None` for the\n    /// sm_90a-only modules.",
        "ptx(self) -> Option<&'static str>",
        &|m| match &m.ptx {
            Some(p) => format!("Some(include_str!({}))", lit(p)),
            None => "None".into(),
        },
    );
    method(
        "The module assembled by the build's ptxas for sm_90 (sm_90a for the `*_sm90a.cu` modules).",
        "cubin_sm90(self) -> &'static [u8]",
        &|m| format!("include_bytes!({})", lit(&m.cubin)),
    );
    method(
        "The kernels this build of the module defines, sorted (the PTX's `.entry` names).",
        "entries(self) -> &'static [&'static str]",
        &|m| format!("&{:?}", m.entries),
    );
    g.push_str("}\n");
    g
}

fn common_flags() -> [&'static str; 6] {
    // -lineinfo lets compute-sanitizer name source lines; warnings are errors so CI catches them without a GPU.
    [
        "-O3",
        "-std=c++17",
        "-lineinfo",
        "--Werror",
        "all-warnings",
        "-Icuda",
    ]
}

fn run(cmd: &mut Command, source: &Path) {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("running nvcc on {}: {e}", source.display()));
    if !output.status.success() {
        panic!(
            "nvcc failed on {}:\n{}{}",
            source.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Returns the nvcc to use, or the list of places tried.
fn find_nvcc(manifest: &Path) -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("NVCC") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(format!("NVCC={}", p.display()));
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = PathBuf::from(home).join("bin").join("nvcc");
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
        tried.push("nvcc on PATH".into());
    }
    let venv_lib = manifest.join("..").join(".venv-cuda").join("lib");
    if let Ok(entries) = std::fs::read_dir(&venv_lib) {
        for e in entries.flatten() {
            let p = e.path().join("site-packages/nvidia/cu13/bin/nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    tried.push(format!(
        "{}/python3.*/site-packages/nvidia/cu13/bin/nvcc",
        venv_lib.display()
    ));
    Err(tried.join(", "))
}

fn check_version(nvcc: &Path) {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("running {} --version: {e}; {INSTALL_HINT}", nvcc.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("release 13.0") {
        panic!(
            "{} is not nvcc 13.0 (the H200's driver 580 rejects newer PTX):\n{text}\n{INSTALL_HINT}",
            nvcc.display()
        );
    }
}
