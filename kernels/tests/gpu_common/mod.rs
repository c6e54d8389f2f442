//! What every GPU test file shares: opening the device (or saying "skipped: no CUDA device"), a seeded generator
//! whose seed is printed, random inputs (plain, and the FP8 / NVFP4 weights and activations of the GEMV and GEMM
//! tests), and the relative error that fails on an unwritten (NaN-poisoned) element.
//! Each `kernels/tests/gpu_*.rs` includes it with `mod gpu_common;`.
#![allow(dead_code)] // each test file uses a different subset

use kernels::cuda::Gpu;
use kernels::formats::{bf16_to_f32, e4m3_to_f32, f32_to_bf16, f32_to_e4m3};
use kernels::reference;
use kernels::KernelError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub(crate) fn gpu() -> Option<Gpu> {
    match Gpu::probe() {
        Ok(Some(g)) => Some(g),
        Ok(None) => {
            println!("skipped: no CUDA device");
            None
        }
        Err(KernelError::NotCompiledWithCuda) => {
            if cfg!(feature = "cuda") {
                panic!("a cuda build must not answer NotCompiledWithCuda");
            }
            println!("skipped: no CUDA device (built without the `cuda` feature)");
            None
        }
        Err(e) => panic!("probing for a CUDA device failed: {e}"),
    }
}

pub(crate) fn rng(test: &str) -> ChaCha8Rng {
    let seed: u64 = rand::thread_rng().gen();
    println!("{test}: seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

pub(crate) fn uniform(rng: &mut ChaCha8Rng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-amp..amp)).collect()
}

/// `||got - want|| / ||want||` in f64, failing on any non-finite element (an unwritten NaN-poisoned one).
pub(crate) fn rel_err(what: &str, got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {i} is {g} (not written, or overflowed); expected {w}"
        );
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

// FP8 / NVFP4 GEMM and GEMV inputs (gpu_kernels.rs and gpu_gemm_sm90a.rs).

/// Random weights `[n, k]` in (-0.05, 0.05) quantised to e4m3 with 128x128 block scales (the checkpoint's FP8
/// layout): `(codes [n, k], weight_scale_inv [ceil(n/128), ceil(k/128)])`.
pub(crate) fn fp8_block_weights(rng: &mut ChaCha8Rng, n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let w = uniform(rng, n * k, 0.05);
    reference::linear::quantize_fp8_block(&w, n, k)
}

/// Random weights `[n, k]` in (-0.05, 0.05) quantised to NVFP4: `(packed e2m1 [n, k/2] (even element in the low
/// nibble), e4m3 group scales [n, k/16], global scale)`.
pub(crate) fn nvfp4_weights(rng: &mut ChaCha8Rng, n: usize, k: usize) -> (Vec<u8>, Vec<u8>, f32) {
    let w = uniform(rng, n * k, 0.05);
    reference::linear::quantize_nvfp4(&w, n, k)
}

/// bf16 activations `[len]` in (-2, 2), returned as bits for the GPU and as the exact f32 values for the
/// reference.
pub(crate) fn bf16_activations(rng: &mut ChaCha8Rng, len: usize) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = uniform(rng, len, 2.0)
        .into_iter()
        .map(f32_to_bf16)
        .collect();
    let vals = bits.iter().map(|&b| bf16_to_f32(b)).collect();
    (bits, vals)
}

/// bf16 activations `[m, k]` whose magnitude varies by token (2^-4 .. 2^3) so the per-token scales differ, with
/// the first 128-block of token 0 all zero (the scale-1.0 case): bits and exact f32 values.
pub(crate) fn prefill_activations(
    rng: &mut ChaCha8Rng,
    m: usize,
    k: usize,
) -> (Vec<u16>, Vec<f32>) {
    let mut v = Vec::with_capacity(m * k);
    for r in 0..m {
        let amp = 2f32.powi(rng.gen_range(-4..=3));
        for c in 0..k {
            v.push(if r == 0 && c < 128 {
                0.0
            } else {
                rng.gen_range(-amp..amp)
            });
        }
    }
    let bits: Vec<u16> = v.into_iter().map(f32_to_bf16).collect();
    let vals = bits.iter().map(|&b| bf16_to_f32(b)).collect();
    (bits, vals)
}

/// The activation quantisation `Gpu::fp8_quantize_activations` implements, on the CPU: per token, per 128 of K,
/// scale `amax / 448` (1.0 for an all-zero block), codes `f32_to_e4m3(x / scale)`. Returns `(codes [m, k],
/// scales [m, ceil(k/128)])`.
pub(crate) fn quantize_act_cpu(x: &[f32], m: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let kb = k.div_ceil(128);
    let mut codes = vec![0u8; m * k];
    let mut scales = vec![0f32; m * kb];
    for r in 0..m {
        for b in 0..kb {
            let cols = b * 128..((b + 1) * 128).min(k);
            let amax = x[r * k..][cols.clone()]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
            scales[r * kb + b] = s;
            for c in cols {
                codes[r * k + c] = f32_to_e4m3(x[r * k + c] / s);
            }
        }
    }
    (codes, scales)
}

/// What an FP8 block GEMM multiplies, in exact values: the codes of `quantize_act_cpu` times their scales.
pub(crate) fn dequantize_act(codes: &[u8], scales: &[f32], m: usize, k: usize) -> Vec<f32> {
    let kb = k.div_ceil(128);
    (0..m * k)
        .map(|i| e4m3_to_f32(codes[i]) * scales[(i / k) * kb + (i % k) / 128])
        .collect()
}
