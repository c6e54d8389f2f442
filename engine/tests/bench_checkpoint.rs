//! The fast random-weight writer the GPU benchmarks use (`engine::bench_checkpoint`): what it writes goes through
//! the real loader (every tensor checked against the planner's inventory), in every stored format it supports,
//! and a step on it gives finite logits.

use std::path::Path;

use engine::checkpoint::Checkpoint;
use engine::{Engine, Model, WeightMode};

fn roundtrip(card: &str, small: u64) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(card);
    let out =
        std::env::temp_dir().join(format!("edgefit-bench-ckpt-{card}-{}", std::process::id()));
    let bytes = engine::bench_checkpoint::write_with(&src, &out, 7, small).unwrap();
    let on_disk = std::fs::metadata(out.join("model.safetensors"))
        .unwrap()
        .len();
    assert_eq!(bytes, on_disk, "{card}: the size it reports is the file's");
    let ck = Checkpoint::open(&out).unwrap();
    let model = Model::load(&ck, WeightMode::Exact, |_, _| {}).unwrap();
    let mut e = Engine::new(model, 1, 64).unwrap();
    let s = e.join().unwrap();
    let logits = e.step(&[(s, &[1, 2, 3, 4, 5])]).unwrap().remove(0);
    assert!(
        logits.iter().all(|x| x.is_finite()),
        "{card}: non-finite logits"
    );
    let spread = logits.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    assert!(spread > 0.0, "{card}: all-zero logits");
    // The same seed writes the same bytes.
    let again = out.with_extension("again");
    engine::bench_checkpoint::write_with(&src, &again, 7, small).unwrap();
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        std::fs::read(again.join("model.safetensors")).unwrap(),
        "{card}: not deterministic"
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&again);
}

#[test]
fn fp8_nvfp4_and_dense_cards_load_and_run() {
    for card in ["qwen3_5-fp8", "qwen3_5-nvfp4", "gemma3-bf16", "qwen3-f32"] {
        // The fixtures' values for small tensors, and random bits for every float tensor (the big-model path).
        roundtrip(card, 1 << 22);
        roundtrip(card, 0);
    }
}

#[test]
fn a_directory_without_config_is_an_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("edgefit-empty-card-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = engine::bench_checkpoint::write(&dir, &dir.join("out"), 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no config.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
