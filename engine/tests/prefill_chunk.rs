//! The prompt chunk, from the plan (`Engine::with_planned_chunk`) or from `EDGEFIT_PREFILL_CHUNK`, which overrides
//! it: a prompt run in chunks of that many tokens gives the logits of the default chunk, and a value that is not a
//! positive whole number is refused when the engine is made. Its own binary, with one test, because it sets a
//! variable of the whole process that every engine made meanwhile would read.

mod common;
use common::{fixtures_root, rel_err};

use engine::checkpoint::Checkpoint;
use engine::{Engine, EngineError, Model, WeightMode};

fn engine(name: &str) -> Result<Engine, EngineError> {
    let ck = Checkpoint::open(&fixtures_root().join(name)).unwrap();
    let model = Model::load(&ck, WeightMode::Exact, |_, _| {}).unwrap();
    Engine::new(model, 1, 160)
}

/// The last token's logits of `prompt` on a fresh engine of `name`.
fn logits(name: &str, prompt: &[u32]) -> Vec<f32> {
    let mut e = engine(name).unwrap();
    let chunk = std::env::var("EDGEFIT_PREFILL_CHUNK")
        .map_or(engine::PREFILL_CHUNK, |v| v.parse().unwrap());
    assert_eq!(e.prefill_chunk(), chunk);
    let s = e.join().unwrap();
    e.step(&[(s, prompt)]).unwrap().remove(0)
}

#[test]
fn a_chunk_from_the_environment_runs_and_a_bad_one_is_refused() {
    // SAFETY (of the environment writes): this binary's only test, so no other thread reads the environment.
    let set = |v: &str| unsafe { std::env::set_var("EDGEFIT_PREFILL_CHUNK", v) };
    for bad in ["0", "-3", "many", ""] {
        set(bad);
        match engine("qwen3_5-f32") {
            Err(e) => assert!(
                e.to_string().contains("EDGEFIT_PREFILL_CHUNK")
                    && e.to_string().contains("at least 1"),
                "{bad:?}: {e}"
            ),
            Ok(_) => panic!("EDGEFIT_PREFILL_CHUNK={bad:?} was taken"),
        }
    }
    // 45 tokens: past the gemma3 fixture's sliding window and the qwen3_5 fixture's DeltaNet chunk boundaries in
    // pieces of 7, which line up with neither.
    let prompt: Vec<u32> = (0..45u32).map(|i| (i * 37 + 11) % 256).collect();
    for name in ["qwen3_5-f32", "gemma3-bf16"] {
        unsafe { std::env::remove_var("EDGEFIT_PREFILL_CHUNK") };
        let want = logits(name, &prompt);
        set("7");
        let got = logits(name, &prompt);
        let err = rel_err(&got, &want);
        assert!(
            err < 1e-4,
            "{name}: chunks of 7 differ by {err:.2e} of the largest logit"
        );
    }
    unsafe { std::env::remove_var("EDGEFIT_PREFILL_CHUNK") };
    // The plan's chunk is taken, and gives the default's logits; the environment overrides it; a plan's chunk of
    // zero tokens is refused.
    let want = logits("qwen3_5-f32", &prompt);
    let mut planned = engine("qwen3_5-f32")
        .unwrap()
        .with_planned_chunk(5)
        .unwrap();
    assert_eq!(planned.prefill_chunk(), 5);
    let s = planned.join().unwrap();
    let got = planned.step(&[(s, &prompt[..])]).unwrap().remove(0);
    let err = rel_err(&got, &want);
    assert!(err < 1e-4, "the plan's chunks of 5 differ by {err:.2e}");
    let e = engine("qwen3_5-f32").unwrap().with_planned_chunk(0).err();
    assert!(
        e.as_ref()
            .is_some_and(|e| e.to_string().contains("prompt_chunk.tokens = 0")),
        "{:?}",
        e.map(|e| e.to_string())
    );
    set("9");
    let over = engine("qwen3_5-f32")
        .unwrap()
        .with_planned_chunk(5)
        .unwrap();
    assert_eq!(
        over.prefill_chunk(),
        9,
        "the environment overrides the plan"
    );
    unsafe { std::env::remove_var("EDGEFIT_PREFILL_CHUNK") };
}
