//! The CUDA kernels against the plain Rust references on the CPU: fresh random inputs each run (the seed is
//! printed), shapes that are not multiples of the tiles, outputs poisoned with NaN before the launch (so an
//! element the kernel did not write fails, and a pass proves the GPU path ran), stated error bounds.
//!
//! Where there is no CUDA driver or device, or the crate was built without the `cuda` feature, each test prints
//! "skipped: no CUDA device" and returns. Shapes are small so the whole file also runs under
//! `compute-sanitizer --tool memcheck|racecheck` in seconds (kernels/bench/h200/run_session.sh).

use kernels::cuda::{GdnGpuInputs, GdnGpuWeights, Gpu};
use kernels::gdn::GdnDims;
use kernels::KernelError;

mod gpu_common;
use gpu_common::{
    assert_rel, check_gdn_decode_steps, fp8_gemm_case, gdn_dims, gpu, nvfp4_case,
    prefill_activations, quantize_act_cpu, rng, run_poisoned, Fp8GemmCase,
};

// What the tests of each kernel path (the lab's `_with` forms) use besides.
#[cfg(feature = "lab")]
use gpu_common::{attn, paged_decode_case, paged_dims};
#[cfg(feature = "lab")]
use kernels::attention::AttnDims;
#[cfg(feature = "lab")]
use kernels::cuda::{KernelPath, PagedKvCache};
#[cfg(feature = "lab")]
use rand_chacha::ChaCha8Rng;

#[test]
fn without_cuda_the_api_refuses_and_with_it_probing_succeeds() {
    match Gpu::probe() {
        Err(e) => {
            if cfg!(feature = "cuda") {
                panic!("probe failed in a cuda build: {e}");
            }
            assert_eq!(e, KernelError::NotCompiledWithCuda);
            assert!(e.to_string().contains("--features cuda"), "{e}");
            assert_eq!(Gpu::new(0).err(), Some(KernelError::NotCompiledWithCuda));
            println!("skipped: no CUDA device (built without the `cuda` feature)");
        }
        Ok(None) => println!("skipped: no CUDA device"),
        Ok(Some(g)) => println!("device: {}", g.name().expect("device name")),
    }
}

// fp32 accumulation of exact products (e4m3 x bf16 fits in 24 bits; on the tensor cores e4m3 and bf16 in
// [6e-5, 65504] are exact in f16) against the f64 reference: the error is the rounding of the partial sums, ~1e-7
// relative; 2e-5 leaves room without hiding a wrong element (one wrong scale block moves the norm by > 1e-2 at
// these sizes).
const GEMV_TOL: f64 = 2e-5;

/// Each `KernelPath` of the checkpoint-layout GEMVs; their `_with` forms are the lab's.
#[cfg(feature = "lab")]
mod gemv_paths {
    use super::*;
    use gpu_common::{bf16_activations, fp8_block_weights};
    use kernels::reference;

    const GEMV_PATHS: [KernelPath; 3] = [
        KernelPath::Auto,
        KernelPath::CudaCores,
        KernelPath::TensorCores,
    ];

    #[test]
    fn fp8_block_gemv_matches_the_reference_on_every_path() {
        let Some(gpu) = gpu() else { return };
        let mut rng = rng("fp8_block_gemv");
        // Ragged n (not a multiple of the 16-row tile or of 2 rows per warp), k a multiple of 16 but not of 32 or 128,
        // m across the 8-token tile boundary.
        for &(m, n, k) in &[
            (1, 300, 400),
            (2, 129, 528),
            (3, 257, 1040),
            (7, 64, 2048),
            (9, 33, 272),
            (16, 1000, 656),
            (11, 5, 16),
        ] {
            let (codes, scales) = fp8_block_weights(&mut rng, n, k);
            let (xb, xf) = bf16_activations(&mut rng, m * k);
            let want = reference::linear::fp8_block_linear(&xf, m, &codes, &scales, n, k);
            let (dx, dw, ds) = (
                gpu.upload(&xb).unwrap(),
                gpu.upload(&codes).unwrap(),
                gpu.upload(&scales).unwrap(),
            );
            for path in GEMV_PATHS {
                let got = run_poisoned(&gpu, m * n, |dy| {
                    gpu.fp8_block_gemv_with(path, &dx, &dw, &ds, dy, m, n, k)
                });
                assert_rel(
                    &format!("fp8 {path:?} m={m} n={n} k={k}"),
                    &got,
                    &want,
                    GEMV_TOL,
                );
            }
        }
    }

    #[test]
    fn nvfp4_gemv_matches_the_reference_on_every_path() {
        let Some(gpu) = gpu() else { return };
        let mut rng = rng("nvfp4_gemv");
        // n = 16400 takes the two-rows-per-warp CUDA-core kernel (n >= 16384) with a ragged last warp.
        for &(m, n, k) in &[
            (1, 300, 512),
            (2, 129, 544),
            (4, 257, 1056),
            (6, 64, 2048),
            (16, 1000, 640),
            (9, 3, 32),
            (1, 16400, 96),
        ] {
            let x = bf16_activations(&mut rng, m * k);
            let (want, global, dx, dw, ds) = nvfp4_case(&gpu, &mut rng, (m, n, k), x);
            for path in GEMV_PATHS {
                let got = run_poisoned(&gpu, m * n, |dy| {
                    gpu.nvfp4_gemv_with(path, &dx, &dw, &ds, global, dy, m, n, k)
                });
                let what = format!("nvfp4 {path:?} m={m} n={n} k={k}");
                assert_rel(&what, &got, &want, GEMV_TOL);
            }
        }
    }
}

#[test]
fn gemv_shape_errors_name_the_operand() {
    let Some(gpu) = gpu() else { return };
    let x = gpu.upload(&vec![0u16; 2 * 64]).unwrap();
    let w = gpu.upload(&vec![0u8; 8 * 64]).unwrap();
    let s = gpu.upload(&[1.0f32; 1]).unwrap();
    let mut y = gpu.zeros::<f32>(2 * 8).unwrap();
    let e = gpu
        .fp8_block_gemv(&x, &w, &s, &mut y, 2, 8, 48)
        .unwrap_err();
    assert!(
        e.to_string().contains("x has 128 elements, expected 96"),
        "{e}"
    );
    let e = gpu
        .fp8_block_gemv(&x, &w, &s, &mut y, 17, 8, 64)
        .unwrap_err();
    assert!(e.to_string().contains("m must be 1..=16"), "{e}");
    let e = gpu
        .nvfp4_gemv(&x, &w, &w, 1.0, &mut y, 2, 8, 48)
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
}

#[test]
fn gdn_decode_step_matches_the_reference_over_several_steps() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_decode_step");
    // Hv/Hk = 3 as in Qwen3.8-27B (48/16), with fewer heads; 3 sequences, 4 steps so the conv history and the
    // state carry over between launches.
    let dims = gdn_dims(2, 6, 4);
    check_gdn_decode_steps(
        &gpu,
        &mut rng,
        "gdn_decode_step",
        dims,
        3,
        4,
        &mut |w, x, seqs, conv_in, conv_out, state, out| {
            gpu.gdn_decode_step(&dims, w, x, seqs, conv_in, conv_out, state, out)
        },
    );
}

#[test]
fn gdn_decode_step_refuses_unbuilt_head_dims() {
    let Some(gpu) = gpu() else { return };
    let dims = GdnDims {
        key_dim: 64,
        value_dim: 64,
        ..gdn_dims(1, 1, 4)
    };
    let one = gpu.upload(&[0.0f32; 1]).unwrap();
    let w = GdnGpuWeights {
        conv_weight: &one,
        a_log: &one,
        dt_bias: &one,
        norm_weight: &one,
        norm_eps: 1e-6,
    };
    let x = GdnGpuInputs {
        qkv: &one,
        z: &one,
        a: &one,
        b: &one,
    };
    let (mut c, mut s, mut o) = (
        gpu.zeros(1).unwrap(),
        gpu.zeros(1).unwrap(),
        gpu.zeros(1).unwrap(),
    );
    let e = gpu
        .gdn_decode_step(&dims, &w, &x, 1, &one, &mut c, &mut s, &mut o)
        .unwrap_err();
    assert!(e.to_string().contains("key_dim = value_dim = 128"), "{e}");
}

/// One paged-attention case (`paged_decode_case`: random bf16 K/V for ragged lengths scattered over shuffled
/// pages) on every kernel path (the `_with` form is the lab's).
#[cfg(feature = "lab")]
fn check_attention(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    attn: AttnDims,
    lens: &[usize],
    page_size: usize,
    splits: usize,
) {
    let (hq, hkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
    let c = paged_decode_case(gpu, rng, attn, lens, page_size, false);
    let kv = PagedKvCache {
        k: &c.k,
        v: &c.v,
        block_table: &c.table,
        seq_lens: &c.lens,
    };
    // CUDA cores: fp32 scores and exp2 on exact bf16 inputs against f64, ~1e-6 relative, bound 1e-4. Tensor
    // cores (the tiled kernel, also what Auto runs): q and the probabilities rounded to bf16 (2^-9 relative
    // each), ~1e-3, bound 5e-3.
    for (path, tol) in [
        (KernelPath::CudaCores, 1e-4),
        (KernelPath::TensorCores, 5e-3),
        (KernelPath::Auto, 5e-3),
    ] {
        let got = run_poisoned(gpu, c.want.len(), |out| {
            gpu.attention_decode_paged_with(path, &c.dims, &c.q, kv, c.scale, splits, out)
        });
        let what = format!(
            "attention {path:?} hq={hq} hkv={hkv} d={d} lens={lens:?} page={page_size} splits={splits}"
        );
        assert_rel(&what, &got, &c.want, tol);
    }
}

#[cfg(feature = "lab")]
#[test]
fn attention_decode_paged_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("attention_decode_paged");
    // Qwen3.8-27B full attention: 24 query heads on 4 KV heads of 256.
    let qwen = attn(24, 4, 256);
    // 300 splits: more than the short sequences have tokens, so most partials are empty (-inf, 0) and the combine
    // kernel strides over more splits than it has threads at head_dim 64 below.
    for &splits in &[1usize, 3, 0, 300] {
        check_attention(&gpu, &mut rng, qwen, &[1, 37, 300, 1000], 16, splits);
    }
    // Spark-X2.5-4B: 16 on 4 (r = 4), page 64; and the other built head dims.
    let cases: [(AttnDims, &[usize], usize, usize); 5] = [
        (attn(16, 4, 256), &[513, 2], 64, 0),
        (attn(8, 1, 128), &[77, 129], 32, 2),
        (attn(4, 2, 64), &[5, 250], 16, 0),
        (attn(4, 2, 64), &[5, 250], 16, 100),
        (attn(3, 3, 128), &[33], 8, 0),
    ];
    for (dims, lens, page_size, splits) in cases {
        check_attention(&gpu, &mut rng, dims, lens, page_size, splits);
    }
}

#[cfg(feature = "lab")]
#[test]
fn attention_decode_refuses_unbuilt_group_sizes() {
    let Some(gpu) = gpu() else { return };
    let dims = paged_dims(&attn(12, 4, 256), 1, 16, 1, 1);
    let f = gpu.zeros::<f32>(1).unwrap();
    let h = gpu.zeros::<u16>(1).unwrap();
    let u = gpu.zeros::<u32>(1).unwrap();
    let mut o = gpu.zeros::<f32>(1).unwrap();
    let kv = PagedKvCache {
        k: &h,
        v: &h,
        block_table: &u,
        seq_lens: &u,
    };
    // Group size 3: built for the tensor cores (Auto), not for the CUDA cores.
    let e = gpu
        .attention_decode_paged_with(KernelPath::CudaCores, &dims, &f, kv, 1.0, 0, &mut o)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("must be 1, 2, 4, 6 or 8 times kv_heads"),
        "{e}"
    );
    // Group size 9: built for neither (the query group is the 8 rows of one mma tile).
    let dims = paged_dims(&attn(36, 4, 256), 1, 16, 1, 1);
    for path in [KernelPath::Auto, KernelPath::TensorCores] {
        let e = gpu
            .attention_decode_paged_with(path, &dims, &f, kv, 1.0, 0, &mut o)
            .unwrap_err();
        assert!(
            e.to_string().contains("1 to 8 times kv_heads"),
            "{path:?}: {e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// FP8 prefill GEMM (cuda/gemm.cu) and its activation quantiser.

#[test]
fn fp8_quantize_activations_matches_the_cpu_quantiser_exactly() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_quantize_activations");
    // k not a multiple of 128 (a short last block), m not a multiple of the 8 tokens per block.
    for &(m, k) in &[(1, 16), (7, 400), (33, 1040), (130, 272)] {
        let (xb, xf) = prefill_activations(&mut rng, m, k);
        let (want_codes, want_scales) = quantize_act_cpu(&xf, m, k);
        let dx = gpu.upload(&xb).unwrap();
        // Poisoned: 0x7f is an e4m3 NaN code, which the quantiser never writes (it saturates).
        let mut dq = gpu.upload(&vec![0x7fu8; m * k]).unwrap();
        let mut ds = gpu.upload(&vec![f32::NAN; m * k.div_ceil(128)]).unwrap();
        gpu.fp8_quantize_activations(&dx, &mut dq, &mut ds, m, k)
            .unwrap();
        let (codes, scales) = (gpu.download(&dq).unwrap(), gpu.download(&ds).unwrap());
        // Both sides divide in IEEE f32 and round to nearest even, so the results are identical.
        for (i, (g, w)) in scales.iter().zip(&want_scales).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "m={m} k={k}: scale {i}: {g} != {w}"
            );
        }
        for (i, (g, w)) in codes.iter().zip(&want_codes).enumerate() {
            assert_eq!(
                g,
                w,
                "m={m} k={k}: code {i} (token {}, column {})",
                i / k,
                i % k
            );
        }
    }
}

// Products of two e4m3 values are exact in fp32; each 128 of K is summed by the tensor cores (whose FP8
// accumulation keeps fewer bits than fp32, ~14 by DeepSeek-V3's measurement, but only over 128 products here)
// and folded into fp32 with both scales. Measured against the f64 reference the error is the rounding of those
// sums, ~1e-4 relative at most; 2e-3 leaves room without hiding a wrong element (one wrong or missing scale
// block moves the norm by > 5e-2 at these sizes).
const GEMM_TOL: f64 = 2e-3;

#[test]
fn fp8_block_gemm_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_block_gemm");
    // Ragged M and N (not multiples of the 128x128 tile, of the 16-row mma, or even: the odd-N store path),
    // K a multiple of 16 but not of 128 and spanning more K tiles than the 4 pipeline stages.
    for &(m, n, k) in &[
        (1usize, 16usize, 16usize),
        (5, 130, 272),
        (64, 128, 128),
        (130, 201, 400),
        (257, 385, 1040),
        (129, 257, 2064),
    ] {
        let kb = k.div_ceil(128);
        // What the GEMM computes, in exact values: the dequantised activations against the reference GEMM.
        let Fp8GemmCase {
            xb,
            want,
            xq: dxq,
            xs: dxs,
            w: dw,
            ws: dws,
        } = fp8_gemm_case(&gpu, &mut rng, m, n, k);
        let got = run_poisoned(&gpu, m * n, |dy| {
            gpu.fp8_block_gemm(&dxq, &dxs, &dw, &dws, dy, m, n, k)
        });
        let what = format!("fp8 gemm m={m} n={n} k={k}");
        let e = assert_rel(&what, &got, &want, GEMM_TOL);
        println!("{what}: relative error {e:.2e}");

        // The whole prefill path from bf16: the GPU quantiser, then the GEMM, against the same reference.
        let dx = gpu.upload(&xb).unwrap();
        let mut gq = gpu.upload(&vec![0x7fu8; m * k]).unwrap();
        let mut gs = gpu.upload(&vec![f32::NAN; m * kb]).unwrap();
        gpu.fp8_quantize_activations(&dx, &mut gq, &mut gs, m, k)
            .unwrap();
        let got = run_poisoned(&gpu, m * n, |dy| {
            gpu.fp8_block_gemm(&gq, &gs, &dw, &dws, dy, m, n, k)
        });
        let what = format!("bf16 -> quantise -> fp8 gemm m={m} n={n} k={k}");
        assert_rel(&what, &got, &want, GEMM_TOL);
    }
}

#[test]
fn fp8_block_gemm_shape_errors_name_the_operand() {
    let Some(gpu) = gpu() else { return };
    let xq = gpu.upload(&[0u8; 3 * 48]).unwrap();
    let xs = gpu.upload(&[1.0f32; 3]).unwrap();
    let w = gpu.upload(&[0u8; 8 * 48]).unwrap();
    let ws = gpu.upload(&[1.0f32; 1]).unwrap();
    let mut y = gpu.zeros::<f32>(3 * 8).unwrap();
    let e = gpu
        .fp8_block_gemm(&xq, &xs, &w, &ws, &mut y, 3, 8, 40)
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 16"), "{e}");
    let e = gpu
        .fp8_block_gemm(&xq, &xs, &w, &ws, &mut y, 3, 8, 32)
        .unwrap_err();
    assert!(
        e.to_string().contains("xq has 144 elements, expected 96"),
        "{e}"
    );
    let e = gpu
        .fp8_block_gemm(&xq, &ws, &w, &ws, &mut y, 3, 8, 48)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("x_scales has 1 elements, expected 3"),
        "{e}"
    );
    let mut s1 = gpu.zeros::<f32>(1).unwrap();
    let mut q1 = gpu.zeros::<u8>(3 * 48).unwrap();
    let e = gpu
        .fp8_quantize_activations(&gpu.zeros::<u16>(3 * 48).unwrap(), &mut q1, &mut s1, 3, 48)
        .unwrap_err();
    assert!(
        e.to_string().contains("scales has 1 elements, expected 3"),
        "{e}"
    );
}

// NVFP4 prefill GEMM (cuda/gemm.cu): e2m1 x e4m3 group scale is exact in bf16 and bf16 activations are exact, so
// the products are exact and the only error is fp32 accumulation (~1e-7 relative); the GEMV bound applies.
#[test]
fn nvfp4_gemm_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_gemm");
    // Ragged M and N (not multiples of the 128x256 tile or of 8; odd N), K a multiple of 64 across more K tiles
    // than the 4 pipeline stages.
    for &(m, n, k) in &[
        (1, 8, 64),
        (5, 130, 128),
        (130, 257, 448),
        (257, 300, 1088),
        (64, 256, 64),
    ] {
        let x = prefill_activations(&mut rng, m, k);
        let (want, global, dx, dw, ds) = nvfp4_case(&gpu, &mut rng, (m, n, k), x);
        let got = run_poisoned(&gpu, m * n, |dy| {
            gpu.nvfp4_gemm(&dx, &dw, &ds, global, dy, m, n, k)
        });
        let what = format!("nvfp4 gemm m={m} n={n} k={k}");
        let e = assert_rel(&what, &got, &want, GEMV_TOL);
        println!("{what}: relative error {e:.2e}");
    }
}

#[test]
fn nvfp4_gemm_refuses_k_off_the_tile() {
    let Some(gpu) = gpu() else { return };
    let x = gpu.zeros::<u16>(2 * 96).unwrap();
    let w = gpu.zeros::<u8>(8 * 48).unwrap();
    let s = gpu.zeros::<u8>(8 * 6).unwrap();
    let mut y = gpu.zeros::<f32>(2 * 8).unwrap();
    let e = gpu
        .nvfp4_gemm(&x, &w, &s, 1.0, &mut y, 2, 8, 96)
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 64"), "{e}");
    let e = gpu
        .nvfp4_gemm(&x, &w, &s, f32::NAN, &mut y, 2, 8, 64)
        .unwrap_err();
    assert!(
        e.to_string().contains("x has 192 elements, expected 128"),
        "{e}"
    );
}
