//! The CUDA decode step's load-time and launch-time shortcuts against the plain way, on random checkpoints of the
//! FP8 and NVFP4 fixture cards (`bench_checkpoint`, which gives the projections of one input one NVFP4 global scale,
//! as modelopt exports those it expects fused): stacked q/k/v and gate/up projections against the parts apart
//! (fewer linears, the same logits up to the order of the sums), and decode attention split over the context
//! against one block per (token, head), over a 300-token context (ten chunks of the split kernel). Skips where there
//! is no CUDA device.

mod common;
use common::{cuda_engine, cuda_here, tokens};
use std::path::{Path, PathBuf};

use engine::{CudaOptions, Engine, EngineError};

/// A random checkpoint of a fixture's card.
fn card(name: &str) -> PathBuf {
    common::random_card(name, &format!("fast-{name}"), 5, |_| {})
}

fn engine_on(dir: &Path, precise: bool, stack: bool, split: bool) -> Result<Engine, EngineError> {
    let opts = CudaOptions {
        slots: 2,
        max_len: 512,
        precise,
        stack_projections: stack,
        split_decode_attention: split,
        ..Default::default()
    };
    cuda_engine(dir, opts)
}

/// The linears loaded, and the logits of every step: a 300-token prompt on slot 0, a 9-token one on slot 1, then
/// four decode steps of both together.
fn run(
    dir: &Path,
    precise: bool,
    stack: bool,
    split: bool,
) -> Result<(usize, Vec<Vec<f32>>), EngineError> {
    let mut e = engine_on(dir, precise, stack, split)?;
    let linears = e.cuda().map_or(0, |c| c.linear_count());
    let vocab = e.model.vocab() as u32;
    let (a, b) = (e.join().unwrap(), e.join().unwrap());
    let mut out = Vec::new();
    out.extend(e.step(&[(a, &tokens(300, 1, vocab))])?);
    out.extend(e.step(&[(b, &tokens(9, 2, vocab))])?);
    for s in 0..4u32 {
        let (ta, tb) = ([(s * 7 + 1) % vocab], [(s * 11 + 3) % vocab]);
        out.extend(e.step(&[(a, &ta[..]), (b, &tb[..])])?);
    }
    Ok((linears, out))
}

/// max |a - b| / max |b| over every step's logits.
fn rel_err(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "step counts differ");
    assert!(
        a.iter().zip(b).all(|(x, y)| x.len() == y.len()),
        "logit rows differ in length"
    );
    common::rel_err(&a.concat(), &b.concat())
}

#[test]
fn stacked_projections_and_split_attention_agree_with_the_plain_step() {
    if !cuda_here() {
        return;
    }
    for name in ["qwen3_5-fp8", "qwen3_5-nvfp4"] {
        let dir = card(name);
        let (n_fast, fast) = run(&dir, false, true, true).unwrap();
        let (n_apart, apart) = run(&dir, false, false, true).unwrap();
        let (_, one_block) = run(&dir, false, true, false).unwrap();
        // The precise path keeps f32 activations, so the attention's different order of sums shows in the logits
        // (on the fast path the bf16 inputs of the next GEMV mostly round it away).
        let (_, precise_split) = run(&dir, true, true, true).unwrap();
        let (_, precise_one) = run(&dir, true, true, false).unwrap();
        let e_stack = rel_err(&fast, &apart);
        let e_split = rel_err(&fast, &one_block);
        let e_precise = rel_err(&precise_split, &precise_one);
        println!(
            "{name}: {n_fast} linears stacked, {n_apart} apart; logits max|diff| / max|logit|: stacked vs apart \
             {e_stack:.2e}, split vs one-block attention {e_split:.2e} (precise path {e_precise:.2e})"
        );
        // The fixture card's one attention layer stacks q/k/v and every layer its gate/up.
        assert!(
            n_fast < n_apart,
            "{name}: stacking loaded {n_fast} linears, apart {n_apart}"
        );
        // Only the order of f32 sums differs (the GEMV's cut for a taller matrix, the softmax's merge); a wrong
        // row offset, scale or chunk edge is O(1).
        assert!(e_stack < 2e-3, "{name}: stacked vs apart {e_stack:e}");
        assert!(e_split < 2e-3, "{name}: split vs one-block {e_split:e}");
        assert!(
            e_precise < 1e-4,
            "{name}: split vs one-block on the precise path {e_precise:e}"
        );
        std::fs::remove_dir_all(dir.parent().unwrap()).ok();
    }
}

/// Short NVFP4 matrices (the DeltaNet's stacked in_proj_b/a on the 27B; on the fixture card every NVFP4 matrix is
/// that short) keep exact f32 rows beside the GEMM copies, and steps of at most 16 rows read them instead of the
/// tiles. The prompt is the same (both run the GEMMs). In decode the rows take f32 activations where the tiles take
/// bf16 ones (2^-9 of each input), so the two stay close (measured on the H100: 9.9e-3 of the largest logit; an
/// o_proj that read its ungated f32 input moved them 8.5e-2), and against the precise path (f32 activations
/// throughout) the rows come out no further than the tiles; a wrong row, scale or dispatch is O(1).
#[test]
fn short_nvfp4_matrices_decode_on_their_exact_f32_rows() {
    if !cuda_here() {
        return;
    }
    let dir = card("qwen3_5-nvfp4");
    let run_rows = |rows: bool, precise: bool| -> (usize, usize, Vec<Vec<f32>>) {
        let opts = CudaOptions {
            slots: 2,
            max_len: 512,
            gemm_copies: true,
            nvfp4_f32_rows: rows,
            precise,
            ..Default::default()
        };
        let mut e = cuda_engine(&dir, opts).unwrap();
        let c = e.cuda().unwrap();
        let (with_rows, gemm_bytes) = (c.f32_row_linears(), c.gemm_bytes as usize);
        let vocab = e.model.vocab() as u32;
        let a = e.join().unwrap();
        let mut out = e.step(&[(a, &tokens(40, 5, vocab))]).unwrap();
        for s in 0..6u32 {
            let t = [(s * 13 + 2) % vocab];
            out.extend(e.step(&[(a, &t[..])]).unwrap());
        }
        (with_rows, gemm_bytes, out)
    };
    let (n_rows, bytes_rows, rows) = run_rows(true, false);
    let (n_tiles, bytes_tiles, tiles) = run_rows(false, false);
    let (_, _, precise) = run_rows(true, true);
    let e_prompt = rel_err(&rows[..1], &tiles[..1]);
    let e_decode = rel_err(&rows[1..], &tiles[1..]);
    let e_rows = rel_err(&rows[1..], &precise[1..]);
    let e_tiles = rel_err(&tiles[1..], &precise[1..]);
    println!(
        "qwen3_5-nvfp4: {n_rows} linears on f32 rows; decode logits max|diff| / max|logit|: rows vs tiles \
         {e_decode:.2e}, rows vs precise {e_rows:.2e}, tiles vs precise {e_tiles:.2e} (prompt: rows vs tiles \
         {e_prompt:.2e})"
    );
    assert!(
        n_rows > 0 && n_tiles == 0,
        "{n_rows} / {n_tiles} linears kept f32 rows"
    );
    // The copy decode no longer reads (the tiles) is counted with the GEMM copies.
    assert!(
        bytes_rows > bytes_tiles,
        "GEMM-copy bytes {bytes_rows} vs {bytes_tiles}"
    );
    assert_eq!(e_prompt, 0.0, "the prompt runs the same kernels either way");
    assert!(e_decode < 2e-2, "f32 rows vs tiles in decode: {e_decode:e}");
    assert!(
        e_rows <= e_tiles,
        "f32 rows are further from the precise path than the tiles: {e_rows:e} vs {e_tiles:e}"
    );
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}
