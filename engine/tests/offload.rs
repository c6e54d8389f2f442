//! Weights the plan places in host memory, streamed on CUDA: the same fixture, planned with decoder layers pinned
//! in host memory (`offload_bytes`), must give exactly the tokens and logits of the all-resident run (the same
//! kernels read the same bytes, only from staging buffers), through a prompt, greedy decode, and a second sequence
//! joining (two streamed layers in flight across steps). Skips where there is no CUDA device.

mod common;
use common::cuda_here;
use std::path::{Path, PathBuf};

use engine::checkpoint::Checkpoint;
use engine::setup::{plan, profile, streamed_linears};
use engine::{CudaOptions, Engine, Model, WeightMode};
use planner::Workload;

fn fixture(name: &str) -> PathBuf {
    common::fixtures_root().join(name)
}

/// Bytes of the fixture's decoder layers (what a pinned offload moves, in checkpoint order).
fn layer_bytes(dir: &Path) -> u64 {
    let ck = Checkpoint::open(dir).unwrap();
    ck.spec
        .inventory
        .iter()
        .filter(|t| t.layer.is_some())
        .map(|t| t.bytes)
        .sum()
}

/// Every step's logits of two sequences: a prompt each (the second joins after the first has decoded a few
/// tokens), then greedy decode of both together.
fn run(dir: &Path, offload: Option<u64>) -> (Vec<Vec<f32>>, usize) {
    let ck = Checkpoint::open(dir).unwrap();
    let w = Workload {
        max_model_len: 128,
        max_num_seqs: 2,
        prompt_len: 16,
        offload_bytes: offload,
        ..Workload::default()
    };
    let p = plan(&ck, None, &profile(Some("h200")).unwrap(), &w).unwrap();
    let streamed = streamed_linears(&p, &ck).unwrap();
    let n_streamed = streamed.len();
    let model = Model::load(&ck, WeightMode::Exact, |_, _| {}).unwrap();
    let opts = CudaOptions {
        slots: 2,
        max_len: 128,
        precise: false,
        streamed,
        cap: None,
        // The tile GEMVs at every row count, in both runs, so the two compare bit for bit.
        gemm_copies: false,
        batch_invariant: false,
        flash_prefill_attention: false,
        ..Default::default()
    };
    let mut e = Engine::on_cuda(model, opts, |_, _| Ok(0)).unwrap();
    let vocab = e.model.vocab() as u32;
    let prompt: Vec<u32> = (0..19u32).map(|i| (i * 37 + 5) % vocab).collect();
    let mut out = Vec::new();
    let a = e.join().unwrap();
    let mut la = e.step(&[(a, &prompt)]).unwrap().remove(0);
    out.push(la.clone());
    let next = |l: &[f32]| kernels::ops::argmax(l).unwrap() as u32;
    for _ in 0..4 {
        la = e.step(&[(a, &[next(&la)])]).unwrap().remove(0);
        out.push(la.clone());
    }
    let b = e.join().unwrap();
    let mut lb = e.step(&[(b, &prompt[3..])]).unwrap().remove(0);
    out.push(lb.clone());
    for _ in 0..6 {
        let (ta, tb) = ([next(&la)], [next(&lb)]);
        let mut both = e.step(&[(a, &ta), (b, &tb)]).unwrap().into_iter();
        la = both.next().unwrap();
        lb = both.next().unwrap();
        out.push(la.clone());
        out.push(lb.clone());
    }
    (out, n_streamed)
}

#[test]
fn streamed_weights_give_the_resident_runs_logits_exactly() {
    if !cuda_here() {
        return;
    }
    for name in ["qwen3_5-fp8", "qwen3_5-nvfp4", "llama-bf16", "gemma3-bf16"] {
        let dir = fixture(name);
        let (resident, none) = run(&dir, None);
        assert_eq!(none, 0, "{name}: nothing is offloaded without the pin");
        // Half the layers (one of them split between the pools, so some of its linears stream and some do not),
        // then all of them.
        let total = layer_bytes(&dir);
        for offload in [total / 2, total] {
            let (streamed, n) = run(&dir, Some(offload));
            assert!(n > 0, "{name}: the pinned offload streams some linears");
            assert_eq!(resident.len(), streamed.len());
            for (i, (r, s)) in resident.iter().zip(&streamed).enumerate() {
                let worst = r
                    .iter()
                    .zip(s)
                    .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    worst == 0.0,
                    "{name}: step {i} differs by {worst} ({offload} bytes offloaded)"
                );
            }
            println!(
                "{name}: {offload} of {total} layer bytes offloaded, {n} streamed linears, {} steps identical",
                resident.len()
            );
        }
    }
}
