//! Helpers the engine's test binaries share (each `tests/*.rs` is its own crate and includes this module).

use std::path::PathBuf;

/// Whether this machine has a CUDA device the engine can use (says "skipped" when not).
#[allow(dead_code)] // not every test binary has a CUDA arm
pub(crate) fn cuda_here() -> bool {
    match kernels::cuda::Gpu::probe() {
        Ok(Some(_)) => true,
        Ok(None) => {
            println!("skipped: no CUDA device");
            false
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            false
        }
    }
}

/// The parity fixtures' directory: `EDGEFIT_FIXTURES` where a test binary built here runs on another machine (the
/// GPU runs), else the crate's own.
#[allow(dead_code)] // not every test binary reads fixtures by directory
pub(crate) fn fixtures_root() -> PathBuf {
    std::env::var_os("EDGEFIT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// A random checkpoint (`engine::bench_checkpoint`, `seed`) of the fixture card `name`, its text config changed
/// by `edit` first, in a fresh temporary directory named by `tag`; the caller removes the path's parent after.
#[allow(dead_code)] // the CUDA comparison tests only
pub(crate) fn random_card(
    name: &str,
    tag: &str,
    seed: u64,
    edit: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let src = fixtures_root().join(name);
    let tmp = std::env::temp_dir().join(format!("edgefit-{tag}-{}", std::process::id()));
    let cfg_dir = tmp.join("card");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    match cfg.get_mut("text_config") {
        Some(text) => edit(text),
        None => edit(&mut cfg),
    }
    std::fs::write(cfg_dir.join("config.json"), cfg.to_string()).unwrap();
    if let Ok(q) = std::fs::read_to_string(src.join("hf_quant_config.json")) {
        std::fs::write(cfg_dir.join("hf_quant_config.json"), q).unwrap();
    }
    let out = tmp.join("model");
    engine::bench_checkpoint::write_with(&cfg_dir, &out, seed, 1 << 22).unwrap();
    out
}

/// The checkpoint in `dir` loaded through the real loader and placed on the GPU with `opts`, admitted whatever
/// the device has free.
#[allow(dead_code)]
pub(crate) fn cuda_engine(
    dir: &std::path::Path,
    opts: engine::CudaOptions,
) -> Result<engine::Engine, engine::EngineError> {
    let ck = engine::checkpoint::Checkpoint::open(dir)?;
    let model = engine::Model::load(&ck, engine::WeightMode::Exact, |_, _| {})?;
    engine::Engine::on_cuda(model, opts, |_, _| Ok(0))
}

/// `n` token ids below `vocab`, spread by a multiplicative hash salted with `salt`.
#[allow(dead_code)]
pub(crate) fn tokens(n: usize, salt: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) ^ salt) % vocab)
        .collect()
}

/// max |a - b| / max |b|: the largest difference over the reference's largest magnitude.
#[allow(dead_code)]
pub(crate) fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}
