//! The plan TOML is the one interface between the planner and the engine: a plan made by the planner, written to a
//! file and read back, is what the engine runs. For each fixture the plan's weight path decides the kernels that
//! ran, and a plan that does not fit is refused before anything is allocated.

use std::path::{Path, PathBuf};

use engine::checkpoint::Checkpoint;
use engine::generate::{generate, GenerateOptions};
use engine::{Engine, Model, WeightMode};
use kernels::sampling::SamplingParams;
use planner::{Plan, Verdict, Workload};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures")
        .join(name)
}

/// The planner's plan for `name` on the committed 2-core profile, through a TOML file and back.
fn plan_file(name: &str, workload: &Workload, tag: &str) -> (Checkpoint, Plan) {
    let ck = Checkpoint::open(&fixture(name)).unwrap();
    let profile = engine::setup::profile(Some("avx512-2core")).unwrap();
    let plan = engine::setup::plan(&ck, None, &profile, workload).unwrap();
    let path = std::env::temp_dir().join(format!("edgefit-e2e-{tag}-{}.toml", std::process::id()));
    std::fs::write(&path, plan.to_toml().unwrap()).unwrap();
    let back = engine::setup::plan(&ck, Some(&path), &profile, workload).unwrap();
    assert_eq!(back, plan, "a plan survives its TOML");
    (ck, back)
}

#[test]
fn the_engine_runs_what_the_plan_toml_says() {
    let w = Workload {
        max_model_len: 256,
        max_num_seqs: 2,
        prompt_len: 64,
        ..Workload::default()
    };
    for (name, want) in [
        ("llama-bf16", "w4a16"),
        ("qwen3_5-fp8", "fp8_block"),
        ("spark2_5-gptq", "w4a16"),
    ] {
        let (ck, plan) = plan_file(name, &w, name);
        assert_eq!(plan.verdict, Verdict::Fits);
        engine::setup::admit(&plan).unwrap();
        let mode = WeightMode::from_plan(plan.weight_path.format).unwrap();
        let model = Model::load(&ck, mode, |_, _| {}).unwrap();
        assert!(
            model.paths().contains(&want),
            "{name}: plan {:?} ran {:?}",
            plan.weight_path.format,
            model.paths()
        );
        // Loaded bytes are the plan's planned bytes (the tied head converted once, scales included).
        let planned = plan.inventory.planned_bytes as f64;
        let loaded = model.weight_bytes as f64;
        assert!(
            (loaded - planned).abs() / planned < 0.1,
            "{name}: loaded {loaded} vs planned {planned}"
        );
        let mut e = Engine::new(
            model,
            plan.workload.max_num_seqs as usize,
            plan.workload.max_model_len as usize,
        )
        .unwrap();
        let opts = GenerateOptions {
            max_new_tokens: 8,
            sampling: SamplingParams::GREEDY,
            seed: 0,
            repetition_penalty: 1.0,
            stop_tokens: vec![],
            keep_logits: false,
        };
        let g = generate(&mut e, &[1, 2, 3, 4, 5], &opts, |_| {}).unwrap();
        assert_eq!(g.tokens.len(), 8, "{name}");
    }
}

#[test]
fn a_plan_that_does_not_fit_is_refused_with_its_ledger() {
    // Far more sequences of a long context than the 2-core profile's memory holds.
    let w = Workload {
        max_model_len: 4096,
        max_num_seqs: 1 << 20,
        prompt_len: 64,
        ..Workload::default()
    };
    let (_, plan) = plan_file("qwen3-f32", &w, "nofit");
    assert_eq!(plan.verdict, Verdict::DoesNotFit);
    let err = engine::setup::admit(&plan).unwrap_err().to_string();
    assert!(
        err.contains("does not fit") && err.contains("dram"),
        "{err}"
    );
}
