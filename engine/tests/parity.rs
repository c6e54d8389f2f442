//! Parity with the reference implementations: every fixture under `tests/fixtures/` (made by `cargo xtask
//! fixtures`, goldens by `make_golden.py` on transformers) runs on the CPU with `--exact` semantics and must give
//! the golden greedy tokens, diverging only where the golden's top-2 margin is a near-tie, with the first steps'
//! logits inside the bound of its format. Plan-converted paths (W4A16, W4A8) are measured against the same goldens.

mod common;
use common::cuda_here;
use std::path::{Path, PathBuf};

use engine::checkpoint::Checkpoint;
use engine::generate::{generate, GenerateOptions};
use engine::{Device, Engine, Model, WeightMode};
use kernels::sampling::SamplingParams;

fn fixtures() -> Vec<PathBuf> {
    // EDGEFIT_FIXTURES: where a test binary built here finds the fixtures on another machine (the GPU runs).
    let root = common::fixtures_root();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("golden.json").exists())
        .collect();
    v.sort();
    assert!(
        v.len() >= 8,
        "expected the eight fixtures, found {}",
        v.len()
    );
    v
}

struct Golden {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    margins: Vec<f32>,
    logits: Vec<Vec<f32>>,
}

fn golden(dir: &Path) -> Golden {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let ids = |k: &str| {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect::<Vec<_>>()
    };
    Golden {
        prompt: ids("prompt"),
        tokens: ids("tokens"),
        margins: v["margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect(),
        logits: v["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect(),
    }
}

/// The engine on CUDA device 0 with one slot of 256 positions: `precise` for the f32 builds, `gemm` for the prompt
/// through the prefill GEMMs.
fn cuda_engine(model: Model, precise: bool, gemm: bool) -> Engine {
    let opts = engine::CudaOptions {
        slots: 1,
        max_len: 256,
        precise,
        gemm_copies: gemm,
        ..Default::default()
    };
    Engine::on_cuda(model, opts, |_, _| Ok(0)).unwrap()
}

struct Outcome {
    matched: usize,
    /// First step where the tokens differ, if any.
    diverged: Option<usize>,
    /// Max over the compared steps of max|engine - golden| / max|golden|.
    logit_err: f32,
}

fn run(dir: &Path, mode: WeightMode, device: Device) -> Outcome {
    let g = golden(dir);
    let ck = Checkpoint::open(dir).unwrap();
    let model = Model::load(&ck, mode, |_, _| {}).unwrap();
    let mut e = match device {
        Device::Cpu => Engine::new(model, 1, 256).unwrap(),
        Device::Cuda => cuda_engine(model, true, false),
    };
    let opts = GenerateOptions {
        max_new_tokens: g.tokens.len(),
        sampling: SamplingParams::GREEDY,
        seed: 0,
        repetition_penalty: 1.0,
        stop_tokens: vec![],
        keep_logits: true,
    };
    let out = generate(&mut e, &g.prompt, &opts, |_| {}).unwrap();
    let vocab = e.model.vocab();
    let diverged = out.tokens.iter().zip(&g.tokens).position(|(a, b)| a != b);
    let matched = diverged.unwrap_or(g.tokens.len());
    let mut logit_err = 0.0f32;
    // Logits are comparable up to and including the first divergence (same inputs until then).
    for (s, want) in g.logits.iter().enumerate().take(matched + 1) {
        let got = &out.logits[s * vocab..(s + 1) * vocab];
        let scale = want.iter().fold(0.0f32, |a, x| a.max(x.abs()));
        let err = got
            .iter()
            .zip(want)
            .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
        logit_err = logit_err.max(err / scale);
    }
    Outcome {
        matched,
        diverged,
        logit_err,
    }
}

/// The logit bound of each exact build, relative to the largest logit. f32 and bf16 weights are the reference's own
/// numbers (bf16 widened exactly), so only summation order and the kernels' f32 transcendentals differ: 1e-3, the
/// issue's bound. The CPU FP8 and NVFP4 kernels are weight-only (f32 activations, weights decoded exactly), so the
/// same bound holds for them. The int4 pack holds GPTQ's f16 group scales in bf16 (2^-9 relative per scale), which
/// the reference does not: 1e-2 (measured 5.8e-3).
/// On CUDA the exact path computes every format in f32 from its dequantized rows, so the same bounds hold there.
fn bound(name: &str, _device: Device) -> f32 {
    if name.ends_with("-gptq") {
        1e-2
    } else {
        1e-3
    }
}

/// A divergence is allowed only where the golden's top-2 margin is a near-tie: below the logit bound times the
/// largest logit of that step's golden (or of the first step's, past the logged steps).
fn near_tie(g: &Golden, step: usize, name: &str, device: Device) -> bool {
    let logits = g.logits.get(step).unwrap_or(&g.logits[0]);
    let scale = logits.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    g.margins[step] <= 2.0 * bound(name, device) * scale
}

#[test]
fn exact_path_reproduces_the_golden_tokens_and_logits() {
    exact_parity(Device::Cpu);
}

/// The same fixtures and rules on CUDA device 0 (the whole forward pass on the GPU's kernels).
#[test]
fn cuda_exact_path_reproduces_the_golden_tokens_and_logits() {
    if cuda_here() {
        exact_parity(Device::Cuda);
    }
}

fn exact_parity(device: Device) {
    let mut table = format!("{device:?}:\n| fixture | tokens matched | first divergence (margin) | max logit error |\n|---|---|---|---|\n");
    let mut failures = Vec::new();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let g = golden(&dir);
        let o = run(&dir, WeightMode::Exact, device);
        let div = match o.diverged {
            Some(s) => format!("step {s} ({:.4})", g.margins[s]),
            None => "none".into(),
        };
        table += &format!(
            "| {name} | {}/{} | {div} | {:.2e} |\n",
            o.matched,
            g.tokens.len(),
            o.logit_err
        );
        if o.logit_err > bound(&name, device) {
            failures.push(format!(
                "{name}: logit error {:.3e} above {:.0e}",
                o.logit_err,
                bound(&name, device)
            ));
        }
        if let Some(s) = o.diverged {
            if !near_tie(&g, s, &name, device) {
                failures.push(format!(
                    "{name}: diverged at step {s} where the golden margin is {}",
                    g.margins[s]
                ));
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}

/// Teacher-forced agreement of a converted path with the goldens: at every step the golden token is fed, so one
/// disagreement does not cascade. Returns (top-1 agreements, steps, step-0 logit error, step-0 logit correlation,
/// the kernels that ran). On CUDA the fast path (not `precise`): the tile GEMVs and the TF32 DeltaNet prefill, and
/// with `gemm` the prompt through the tensor-core prefill GEMMs.
fn teacher_forced_on(
    dir: &Path,
    mode: WeightMode,
    device: Device,
    gemm: bool,
) -> (usize, usize, f32, f64, String) {
    let g = golden(dir);
    let ck = Checkpoint::open(dir).unwrap();
    let model = Model::load(&ck, mode, |_, _| {}).unwrap();
    let mut e = match device {
        Device::Cpu => Engine::new(model, 1, 256).unwrap(),
        Device::Cuda => cuda_engine(model, false, gemm),
    };
    let paths = e.paths().join("+");
    let slot = e.join().unwrap();
    let mut logits = e.step(&[(slot, &g.prompt)]).unwrap().remove(0);
    let want = &g.logits[0];
    let scale = want.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    let err = logits
        .iter()
        .zip(want)
        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()))
        / scale;
    let n = want.len() as f64;
    let (ma, mb) = (
        logits.iter().map(|&x| x as f64).sum::<f64>() / n,
        want.iter().map(|&x| x as f64).sum::<f64>() / n,
    );
    let cov: f64 = logits
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - ma) * (b as f64 - mb))
        .sum();
    let va: f64 = logits.iter().map(|&a| (a as f64 - ma).powi(2)).sum();
    let vb: f64 = want.iter().map(|&b| (b as f64 - mb).powi(2)).sum();
    let corr = cov / (va * vb).sqrt();
    let mut agree = 0;
    for (s, &tok) in g.tokens.iter().enumerate() {
        if kernels::ops::argmax(&logits).unwrap() as u32 == tok {
            agree += 1;
        }
        if s + 1 < g.tokens.len() {
            logits = e
                .step(&[(slot, std::slice::from_ref(&tok))])
                .unwrap()
                .remove(0);
        }
    }
    (agree, g.tokens.len(), err, corr, paths)
}

#[test]
fn converted_paths_agree_with_the_goldens() {
    let mut table = String::from(
        "| fixture | path | kernels that ran | top-1 agreement (teacher-forced) | step-0 logit error | step-0 correlation |\n|---|---|---|---|---|---|\n",
    );
    let mut failures = Vec::new();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        if !(name.ends_with("-f32") || name.ends_with("-bf16")) {
            continue;
        }
        // On CUDA too where there is a device: the same converted packs on the int4 GEMV (W4A16 for both).
        let devices: &[(Device, &str)] = if cuda_here() {
            &[(Device::Cpu, "cpu"), (Device::Cuda, "cuda")]
        } else {
            &[(Device::Cpu, "cpu")]
        };
        for &(mode, label) in &[(WeightMode::W4a16, "w4a16"), (WeightMode::W4a8, "w4a8")] {
            for &(device, dev) in devices {
                let (agree, steps, err, corr, paths) = teacher_forced_on(&dir, mode, device, false);
                let label = format!("{label} ({dev})");
                table += &format!(
                    "| {name} | {label} | {paths} | {agree}/{steps} | {err:.2e} | {corr:.4} |\n"
                );
                // These tiny random models have one int4 group per row (hidden 64) and amplified output projections,
                // so 4-bit weights move their logits by tens of percent; a path that ran the wrong kernel or read the
                // wrong layout is uncorrelated with the reference instead (W4A8's group of 128 does not divide the
                // fixtures' 64 inputs, so most of their layers keep the dense kernel: the table says which ran).
                if corr < 0.8 {
                    failures.push(format!(
                        "{name} {label}: step-0 logits correlate {corr:.3} with the golden"
                    ));
                }
                if device == Device::Cuda && !paths.contains("int4") {
                    failures.push(format!("{name} {label}: no int4 kernel ran ({paths})"));
                }
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}

/// The GPU's fast paths for the quantized fixtures: the FP8 and NVFP4 tile GEMVs read bf16 activations (f16 in the
/// tensor cores), so their logits sit ~2e-2 of the largest from the f32 goldens (measured on the H100: 2.4e-2 FP8,
/// 1.4e-2 NVFP4, free-running); GPTQ runs the int4 GEMV. Teacher-forced, nearly every step must still pick the
/// golden token.
#[test]
fn cuda_tile_paths_agree_with_the_goldens() {
    if !cuda_here() {
        return;
    }
    let mut table = String::from(
        "| fixture | path | top-1 agreement (teacher-forced) | step-0 logit error | step-0 correlation |\n|---|---|---|---|---|\n",
    );
    let mut failures = Vec::new();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let gptq = name.ends_with("-gptq");
        if !(name.ends_with("-fp8") || name.ends_with("-nvfp4") || gptq) {
            continue;
        }
        // The prompt through the tile GEMVs, then through the prefill GEMMs (GPTQ: the int4 GEMV on the packed
        // bits with f32 activations, at every row count, which has no GEMM arm). The FP8 GEMM quantizes its activations
        // to e4m3 per 128 columns (as vLLM's block-FP8 path does), which moves these amplified random fixtures'
        // step-0 logits by ~1e-1 of the largest (measured on the H100: 1.50e-1 FP8, 9.3e-2 for the NVFP4 build,
        // whose GDN projections are FP8; correlation 0.993-0.994); a wrong layout or scale correlates near 0.
        let arms: &[(bool, f32, f64)] = if gptq {
            &[(false, 5e-2, 0.999)]
        } else {
            &[(false, 5e-2, 0.999), (true, 2.5e-1, 0.99)]
        };
        for &(gemm, max_err, min_corr) in arms {
            let (agree, steps, err, corr, paths) =
                teacher_forced_on(&dir, WeightMode::Exact, Device::Cuda, gemm);
            let arm = match (gptq, gemm) {
                (true, _) => "int4 GEMV",
                (false, true) => "prefill GEMM",
                (false, false) => "tile GEMV",
            };
            table += &format!(
                "| {name} | {paths} ({arm}) | {agree}/{steps} | {err:.2e} | {corr:.5} |\n"
            );
            if agree + 3 < steps || err > max_err || corr < min_corr {
                failures.push(format!(
                    "{name} ({arm}): {agree}/{steps}, error {err:.2e}, correlation {corr}"
                ));
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}

/// Greedy decoding with the argmax on the device (only the ids cross the link, what `generate` does when it needs
/// no logits) gives the same tokens as the argmax of the downloaded logits, on every fixture.
#[test]
fn cuda_greedy_ids_chosen_on_the_device_equal_the_host_argmax() {
    if !cuda_here() {
        return;
    }
    for dir in fixtures() {
        let g = golden(&dir);
        let run = |keep_logits: bool| {
            let ck = Checkpoint::open(&dir).unwrap();
            let model = Model::load(&ck, WeightMode::Exact, |_, _| {}).unwrap();
            let mut e = cuda_engine(model, true, false);
            let opts = GenerateOptions {
                max_new_tokens: g.tokens.len(),
                sampling: SamplingParams::GREEDY,
                seed: 0,
                repetition_penalty: 1.0,
                stop_tokens: vec![],
                keep_logits,
            };
            generate(&mut e, &g.prompt, &opts, |_| {}).unwrap().tokens
        };
        assert_eq!(run(false), run(true), "{}", dir.display());
    }
}
