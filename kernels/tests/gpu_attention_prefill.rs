//! The CUDA causal prefill attention (`Gpu::attention_prefill*`, cuda/attention_prefill.cu) against the CPU
//! prefill of the crate (`kernels::attention::prefill`, f32, itself checked against the f64 reference in
//! tests/cpu_attention.rs) on the same bf16-exact inputs: ragged lengths (1, 17, 63, 64, 65, 200, 333: below,
//! at and across every tile size), every head dim (64, 128, 256) on every built tiling, group sizes 1..8,
//! with no window and windows smaller and larger than the prompt, one sequence and a varlen batch; outputs
//! poisoned with NaN before each launch. Each failure names the shape, the tiling, the window and the element.
//!
//! Error bound: the kernel rounds the probabilities to bf16 for `P V` (2^-9 relative each) and the output to
//! bf16 (2^-9 relative); scores and the softmax are fp32. With inputs in [-1, 1] (q in [-2, 2]) every output is in
//! [-1, 1]; measured errors are ~3e-3 relative. Bounds: 1e-2 relative over the whole output and 1.5e-2 absolute
//! per element.
//!
//! Prints "skipped: no CUDA device" and returns where there is none. Small enough for compute-sanitizer.

use kernels::attention::{self, AttnDims};
use kernels::cuda::{Gpu, GpuBuffer};
use kernels::formats::{bf16_to_f32, f32_to_bf16};
use rand_chacha::ChaCha8Rng;

mod gpu_common;
use gpu_common::{gpu, rel_err, rng, uniform};

const NAN_BF16: u16 = 0x7fc0;
const REL_BOUND: f64 = 1e-2;
const ABS_BOUND: f32 = 1.5e-2;

/// Random values rounded to bf16: the bits for the GPU and their exact f32 values for the CPU.
fn bf16_vals(rng: &mut ChaCha8Rng, n: usize, amp: f32) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = uniform(rng, n, amp).into_iter().map(f32_to_bf16).collect();
    let vals = bits.iter().map(|&b| bf16_to_f32(b)).collect();
    (bits, vals)
}

struct Inputs {
    q: (Vec<u16>, Vec<f32>),
    k: (Vec<u16>, Vec<f32>),
    v: (Vec<u16>, Vec<f32>),
}

fn inputs(rng: &mut ChaCha8Rng, dims: &AttnDims, t: usize) -> Inputs {
    Inputs {
        q: bf16_vals(rng, t * dims.q_heads * dims.head_dim, 2.0),
        k: bf16_vals(rng, t * dims.kv_heads * dims.head_dim, 1.0),
        v: bf16_vals(rng, t * dims.kv_heads * dims.head_dim, 1.0),
    }
}

/// The CPU oracle for one sequence.
fn cpu_prefill(
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    t: usize,
    x: &Inputs,
) -> Vec<f32> {
    let mut want = vec![0.0f32; t * dims.q_heads * dims.head_dim];
    attention::prefill(dims, scale, window, t, &x.q.1, &x.k.1, &x.v.1, &mut want).unwrap();
    want
}

/// Compares `got` (bf16 bits, `[t, q_heads, head_dim]`) with `want`; panics naming the first bad element.
fn compare(what: &str, dims: &AttnDims, got: &[u16], want: &[f32]) -> f64 {
    let got: Vec<f32> = got.iter().map(|&b| bf16_to_f32(b)).collect();
    let (hq, d) = (dims.q_heads, dims.head_dim);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (tok, h, e) = (i / (hq * d), i / d % hq, i % d);
        assert!(
            g.is_finite() && (g - w).abs() <= ABS_BOUND,
            "{what}: out[token {tok}][head {h}][{e}] = {g}, expected {w} (NaN: never written)"
        );
    }
    let err = rel_err(what, &got, want);
    assert!(
        err < REL_BOUND,
        "{what}: relative error {err:.2e} >= {REL_BOUND:.0e}"
    );
    err
}

#[allow(clippy::too_many_arguments)]
fn run_single(
    gpu: &Gpu,
    variant: Option<&str>,
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    t: usize,
    x: &Inputs,
) -> Vec<u16> {
    let q = gpu.upload(&x.q.0).unwrap();
    let k = gpu.upload(&x.k.0).unwrap();
    let v = gpu.upload(&x.v.0).unwrap();
    let mut out = gpu.upload(&vec![NAN_BF16; x.q.0.len()]).unwrap();
    match variant {
        // The single-sequence entry point (no cu_seqlens: a null pointer in the kernel).
        None => gpu
            .attention_prefill(dims, scale, window, t, &q, &k, &v, &mut out)
            .unwrap(),
        Some(_) => {
            let cu = gpu.upload(&[0u32, t as u32]).unwrap();
            gpu.attention_prefill_varlen_with(
                variant, dims, scale, window, &cu, 1, t, t, &q, &k, &v, &mut out,
            )
            .unwrap()
        }
    }
    gpu.download(&out).unwrap()
}

/// Windows for a prompt of `t` tokens, cycling with `i`: none, 1 token, smaller than t, exactly t, larger.
fn window_for(i: usize, t: usize) -> Option<usize> {
    match i % 5 {
        0 => None,
        1 => Some(1),
        2 => Some((t / 3).max(1)),
        3 => Some(t.max(1)),
        _ => Some(t + 37),
    }
}

#[test]
fn prefill_matches_the_cpu_on_ragged_lengths_every_head_dim_and_tiling() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("prefill_matches_the_cpu_on_ragged_lengths_every_head_dim_and_tiling");
    let mut case = 0usize;
    let mut worst = 0.0f64;
    for d in [64usize, 128, 256] {
        let mut variants: Vec<Option<&str>> = vec![None];
        variants.extend(Gpu::attention_prefill_variants(d).into_iter().map(Some));
        for t in [1usize, 17, 63, 64, 65, 200, 333] {
            // Group sizes 1..8 in turn, over 1 or 2 KV heads.
            let group = 1 + case % 8;
            let kv_heads = 1 + case % 2;
            let dims = AttnDims {
                q_heads: group * kv_heads,
                kv_heads,
                head_dim: d,
            };
            let scale = 1.0 / (d as f32).sqrt();
            let x = inputs(&mut rng, &dims, t);
            // Two windows per shape (no window every other case), each on every tiling.
            for w in [window_for(case, t), window_for(case + 2, t)] {
                let want = cpu_prefill(&dims, scale, w, t, &x);
                for &variant in &variants {
                    let what = format!(
                        "t={t} d={d} q_heads={} kv_heads={kv_heads} window={w:?} tiling={}",
                        dims.q_heads,
                        variant.unwrap_or("default (single-sequence entry)")
                    );
                    let got = run_single(&gpu, variant, &dims, scale, w, t, &x);
                    worst = worst.max(compare(&what, &dims, &got, &want));
                }
            }
            case += 1;
        }
    }
    println!("worst relative error {worst:.2e} (bound {REL_BOUND:.0e})");
}

#[test]
fn prefill_covers_group_sizes_one_to_eight() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("prefill_covers_group_sizes_one_to_eight");
    for group in 1..=8usize {
        for (d, t, w) in [
            (128usize, 65usize, None),
            (256, 33, Some(20)),
            (64, 90, Some(7)),
        ] {
            let dims = AttnDims {
                q_heads: group * 2,
                kv_heads: 2,
                head_dim: d,
            };
            let scale = 0.7 / (d as f32).sqrt();
            let x = inputs(&mut rng, &dims, t);
            let want = cpu_prefill(&dims, scale, w, t, &x);
            let got = run_single(&gpu, None, &dims, scale, w, t, &x);
            compare(
                &format!("group {group} t={t} d={d} window={w:?}"),
                &dims,
                &got,
                &want,
            );
        }
    }
}

#[test]
fn varlen_batch_matches_each_sequence_alone() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("varlen_batch_matches_each_sequence_alone");
    // An empty sequence in the middle, lengths across the tile sizes.
    let lens = [17usize, 200, 0, 1, 64, 65, 130];
    let total: usize = lens.iter().sum();
    let max_len = *lens.iter().max().unwrap();
    let mut cu = vec![0u32];
    for l in lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    for (d, group, kv_heads, w) in [
        (128usize, 4usize, 2usize, None),
        (256, 6, 1, Some(48)),
        (64, 3, 2, Some(1)),
    ] {
        let dims = AttnDims {
            q_heads: group * kv_heads,
            kv_heads,
            head_dim: d,
        };
        let scale = 1.0 / (d as f32).sqrt();
        let x = inputs(&mut rng, &dims, total);
        let (hq, hkv) = (dims.q_heads, dims.kv_heads);
        let q = gpu.upload(&x.q.0).unwrap();
        let k = gpu.upload(&x.k.0).unwrap();
        let v = gpu.upload(&x.v.0).unwrap();
        let cu_dev = gpu.upload(&cu).unwrap();
        for variant in Gpu::attention_prefill_variants(d) {
            let mut out = gpu.upload(&vec![NAN_BF16; total * hq * d]).unwrap();
            gpu.attention_prefill_varlen_with(
                Some(variant),
                &dims,
                scale,
                w,
                &cu_dev,
                lens.len(),
                total,
                max_len,
                &q,
                &k,
                &v,
                &mut out,
            )
            .unwrap();
            let got = gpu.download(&out).unwrap();
            for (b, &l) in lens.iter().enumerate() {
                if l == 0 {
                    continue;
                }
                let s = cu[b] as usize;
                let sl = |v: &[f32], h: usize| v[s * h * d..(s + l) * h * d].to_vec();
                let one = Inputs {
                    q: (Vec::new(), sl(&x.q.1, hq)),
                    k: (Vec::new(), sl(&x.k.1, hkv)),
                    v: (Vec::new(), sl(&x.v.1, hkv)),
                };
                let want = cpu_prefill(&dims, scale, w, l, &one);
                compare(
                    &format!("varlen sequence {b} (tokens {s}..{}) d={d} q_heads={hq} kv_heads={hkv} window={w:?} tiling={variant}", s + l),
                    &dims,
                    &got[s * hq * d..(s + l) * hq * d],
                    &want,
                );
            }
        }
    }
}

#[test]
fn bad_sizes_are_errors() {
    let Some(gpu) = gpu() else { return };
    let dims = AttnDims {
        q_heads: 8,
        kv_heads: 2,
        head_dim: 128,
    };
    let t = 10;
    let buf = |n: usize| -> GpuBuffer<u16> { gpu.zeros(n).unwrap() };
    let (q, k, v) = (buf(t * 8 * 128), buf(t * 2 * 128), buf(t * 2 * 128));
    let mut out = buf(t * 8 * 128);
    let msg = |r: Result<(), kernels::KernelError>| r.expect_err("accepted").to_string();
    let mut short = buf(t * 8 * 128 - 1);
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &q, &k, &v, &mut short)).contains("out")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &out_like(&gpu, 5), &k, &v, &mut out))
            .contains("q has")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &q, &q, &v, &mut out)).contains("k has")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &q, &k, &q, &mut out)).contains("v has")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, Some(0), t, &q, &k, &v, &mut out))
            .contains("at least 1")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, f32::INFINITY, None, t, &q, &k, &v, &mut out))
            .contains("finite")
    );
    let d96 = AttnDims {
        head_dim: 96,
        ..dims
    };
    assert!(
        msg(gpu.attention_prefill(&d96, 0.1, None, t, &q, &k, &v, &mut out))
            .contains("64, 128 or 256")
    );
    let d3 = AttnDims {
        kv_heads: 3,
        ..dims
    };
    assert!(
        msg(gpu.attention_prefill(&d3, 0.1, None, t, &q, &k, &v, &mut out)).contains("multiple")
    );
    let cu = gpu.upload(&[0u32, 4, 10]).unwrap();
    assert!(
        msg(gpu.attention_prefill_varlen(&dims, 0.1, None, &cu, 3, t, 6, &q, &k, &v, &mut out))
            .contains("cu_seqlens")
    );
    assert!(msg(
        gpu.attention_prefill_varlen(&dims, 0.1, None, &cu, 2, t, 11, &q, &k, &v, &mut out)
    )
    .contains("max_seqlen"));
    assert!(msg(gpu.attention_prefill_varlen_with(
        Some("M7_W7_N7_S7"),
        &dims,
        0.1,
        None,
        &cu,
        2,
        t,
        6,
        &q,
        &k,
        &v,
        &mut out
    ))
    .contains("no prefill tiling"));
    // The same call with the right sizes is accepted and writes every element.
    gpu.write(&mut out, &vec![NAN_BF16; t * 8 * 128]).unwrap();
    gpu.attention_prefill_varlen(&dims, 0.1, None, &cu, 2, t, 6, &q, &k, &v, &mut out)
        .unwrap();
    assert!(
        gpu.download(&out).unwrap().iter().all(|&b| b == 0),
        "zero inputs give zero outputs"
    );
}

fn out_like(gpu: &Gpu, n: usize) -> GpuBuffer<u16> {
    gpu.zeros(n).unwrap()
}
