//! The GPU ops of the engine's exact (f32) CUDA path against plain CPU references: [`Gpu::dense_linear`]
//! (`cuda/dense.cu`, f32 and bf16 weights, both the GEMV at m <= 16 and the tiled GEMM past it), the f32
//! elementwise ops of `cuda/ops.cu` (casts, [`Gpu::act_and_mul_f32`], the sigmoid gates, softcap, adds, scales,
//! bias rows, [`Gpu::copy_cols`]) and the per-slot f32 attention of `cuda/attention_slots.cu`
//! ([`Gpu::kv_store_slots`], [`Gpu::attention_slots`], [`Gpu::attention_slots_split`]), and the cast producers
//! that write a decode GEMV's fragments from f32 ([`Gpu::cast_nvfp4_gemv`], [`Gpu::cast_fp8_fragments`]).
//!
//! Fresh random inputs each run (the seed is printed), ragged shapes (odd n, k not a multiple of 8, m in 1..=17
//! and 70, lengths past the grid-stride limits), every output poisoned with NaN before the launch, a bound stated
//! per op, and every bad size refused with an error. Device-side slot / position values out of range are skipped
//! by the store and give zero rows in the attention: tested too.
//!
//! Where there is no CUDA device, or without the `cuda` feature, each test prints "skipped: no CUDA device".

use kernels::attention::AttnDims;
use kernels::backend;
use kernels::cuda::{DenseGpuWeights, Fp8Fragments, Gpu, GpuBuffer, Nvfp4Fragments};
use kernels::formats::{bf16_to_f32, f32_to_bf16};
use kernels::ops::{self, GatedAct};
use kernels::reference;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

mod gpu_common;
use gpu_common::{assert_rel, gpu, rel_err, rng, uniform};

fn nan_f32(gpu: &Gpu, n: usize) -> GpuBuffer<f32> {
    gpu.upload(&vec![f32::NAN; n]).expect("upload")
}

/// `|got - want| <= rel * |want| + abs(i)` element-wise, failing on a non-finite element (an unwritten one).
fn check_f32(what: &str, got: &[f32], want: &[f32], rel: f64, abs: &dyn Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {i} is {g} (not written?); expected {w}"
        );
        let bound = rel * (w as f64).abs() + abs(i);
        assert!(
            (g as f64 - w as f64).abs() <= bound,
            "{what}: element {i}: got {g}, want {w}, bound {bound:e}"
        );
    }
}

/// Bit-for-bit equality (the exact ops: adds, scales, copies, casts).
fn check_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

// ---- dense_linear ---------------------------------------------------------------------------------------------

/// Bound of the dense products: 2e-5 of `sum_i |x_i w_i|` per output. Both kernels sum k f32 products (the GEMV in
/// 32 lane partials and a tree, the GEMM in one sequential chain of up to k = 8200 terms); f32 summation error
/// grows like sqrt(k) * 2^-24 of that sum on random data (~5e-6 at k = 8200), while one lost or doubled term is
/// ~1/k of it (1.2e-4 at k = 8200): the bound lies between.
const DENSE_REL: f64 = 2e-5;

fn check_dense(
    gpu: &Gpu,
    r: &mut ChaCha8Rng,
    m: usize,
    n: usize,
    k: usize,
    w_f32: &[f32],
    w: &DenseGpuWeights,
) {
    let x = uniform(r, m * k, 1.0);
    let xd = gpu.upload(&x).unwrap();
    let mut yd = nan_f32(gpu, m * n);
    gpu.dense_linear(&xd, w, &mut yd, m).unwrap();
    let got = gpu.download(&yd).unwrap();
    let what = format!(
        "dense_linear {} m {m} n {n} k {k}",
        if matches!(w, DenseGpuWeights::F32 { .. }) {
            "f32"
        } else {
            "bf16"
        }
    );
    for row in 0..m {
        for c in 0..n {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for i in 0..k {
                let p = x[row * k + i] as f64 * w_f32[c * k + i] as f64;
                want += p;
                mag += p.abs();
            }
            let g = got[row * n + c] as f64;
            assert!(
                g.is_finite() && (g - want).abs() <= DENSE_REL * mag + 1e-30,
                "{what}: y[{row}, {c}] = {g}, want {want} (bound {:e})",
                DENSE_REL * mag
            );
        }
    }
}

#[test]
fn dense_linear_matches_the_f64_product_for_f32_and_bf16_weights() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("dense_linear");
    // (n, k): tiny, odd n with k not a multiple of 4 or 8 (the scalar paths), multiples of 8 (the 16-byte paths),
    // k past the GEMV's x chunk at m = 16 (512) and at m = 1 (8192), n past a 64-row GEMM tile; below 4096 rows the
    // split-K GEMV runs, from 4096 rows the whole-row one (both paths, both load widths).
    let shapes: [(usize, usize); 9] = [
        (4099, 520),
        (4096, 37),
        (1, 1),
        (33, 7),
        (67, 130),
        (129, 257),
        (17, 1032),
        (130, 96),
        (41, 8200),
    ];
    let ms: Vec<usize> = (1..=17).chain([70]).collect();
    for &(n, k) in &shapes {
        let wf = uniform(&mut r, n * k, 1.0);
        let wb: Vec<u16> = wf.iter().map(|&v| f32_to_bf16(v)).collect();
        let wb_vals: Vec<f32> = wb.iter().map(|&b| bf16_to_f32(b)).collect();
        let w32 = gpu.dense_weights_f32(&wf, n, k).unwrap();
        let w16 = gpu.dense_weights_bf16(&wb, n, k).unwrap();
        assert_eq!((w32.n(), w32.k(), w32.device_bytes()), (n, k, 4 * n * k));
        assert_eq!((w16.n(), w16.k(), w16.device_bytes()), (n, k, 2 * n * k));
        for &m in &ms {
            // The largest K only at the GEMV's edges and the GEMM, to keep the f64 reference quick.
            if k > 4096 && ![1, 2, 9, 16, 17, 70].contains(&m) {
                continue;
            }
            check_dense(&gpu, &mut r, m, n, k, &wf, &w32);
            check_dense(&gpu, &mut r, m, n, k, &wb_vals, &w16);
        }
    }
}

/// The GEMM with k split over a cluster (few output tiles, k >= 512): the DeltaNet gate shape at a prompt, k not
/// a multiple of 16 (the last slice ragged) or of 4 (the scalar loads), slices past k (k = 520: the eighth is
/// empty), m not a multiple of 64, and the same bits on a second run (the partials are added in a fixed order).
#[test]
fn dense_gemm_split_over_k_matches_and_repeats_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("dense_gemm_split");
    for (m, n, k) in [
        (200, 96, 5120),
        (130, 24, 1037),
        (65, 7, 600),
        (17, 130, 520),
        (300, 1, 512),
    ] {
        let wf = uniform(&mut r, n * k, 1.0);
        let wb: Vec<u16> = wf.iter().map(|&v| f32_to_bf16(v)).collect();
        let wb_vals: Vec<f32> = wb.iter().map(|&b| bf16_to_f32(b)).collect();
        let w32 = gpu.dense_weights_f32(&wf, n, k).unwrap();
        let w16 = gpu.dense_weights_bf16(&wb, n, k).unwrap();
        check_dense(&gpu, &mut r, m, n, k, &wf, &w32);
        check_dense(&gpu, &mut r, m, n, k, &wb_vals, &w16);
        let xd = gpu.upload(&uniform(&mut r, m * k, 1.0)).unwrap();
        for w in [&w32, &w16] {
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut yd = nan_f32(&gpu, m * n);
                gpu.dense_linear(&xd, w, &mut yd, m).unwrap();
                runs.push(gpu.download(&yd).unwrap());
            }
            check_bits(
                &format!("dense_linear m {m} n {n} k {k} twice"),
                &runs[1],
                &runs[0],
            );
        }
    }
}

// ---- elementwise ops ------------------------------------------------------------------------------------------

/// Flat lengths: tiny, around the float4 groups, and past one grid-stride sweep (4096 blocks x 256 threads x 4).
const LENS: [usize; 9] = [1, 2, 3, 4, 5, 255, 1027, 70_001, 4_194_311];

#[test]
fn casts_match_the_cpu_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("casts");
    // Every bf16 pattern widens exactly (NaN payloads included).
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let mut wide = nan_f32(&gpu, all.len());
    gpu.cast_bf16_to_f32(&gpu.upload(&all).unwrap(), &mut wide)
        .unwrap();
    let got = gpu.download(&wide).unwrap();
    let want: Vec<f32> = all.iter().map(|&b| bf16_to_f32(b)).collect();
    check_bits("cast_bf16_to_f32 of every pattern", &got, &want);
    // Narrowing: random values, the ties of the rounding, the edges of the range and the specials.
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001), // a signalling NaN: quieted
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),           // the smallest subnormal
        f32::from_bits(0x3f80_8000), // 1 + 2^-8: a tie, to even (down)
        f32::from_bits(0x3f81_8000), // a tie, to even (up)
        f32::from_bits(0x7f7f_8000), // rounds up to +inf
    ];
    for &len in &LENS {
        let mut x = uniform(&mut r, len, 1e3);
        for (v, &s) in x.iter_mut().zip(specials.iter().cycle()).step_by(3) {
            *v = s;
        }
        let mut out = gpu.upload(&vec![0x7fc1u16; len]).unwrap();
        gpu.cast_f32_to_bf16(&gpu.upload(&x).unwrap(), &mut out)
            .unwrap();
        let got = gpu.download(&out).unwrap();
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            assert_eq!(
                g,
                f32_to_bf16(v),
                "cast_f32_to_bf16 len {len}: element {i} ({v:e})"
            );
        }
    }
}

/// GELU (tanh form) in f64: the formula of `backend::gelu_tanh_and_mul`.
fn gelu_tanh_f64(g: f64) -> f64 {
    0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
}

#[test]
fn act_and_mul_f32_matches_the_cpu_for_every_activation() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("act_and_mul_f32");
    for inter in [1usize, 3, 4, 7, 64, 1000, 1029, 4100] {
        let rows = *[1usize, 3, 17].get(r.gen_range(0..3)).unwrap();
        let gu = uniform(&mut r, rows * 2 * inter, 5.0);
        let gd = gpu.upload(&gu).unwrap();
        for act in [GatedAct::Silu, GatedAct::GeluErf, GatedAct::GeluTanh] {
            let what = format!("act_and_mul_f32 {act:?} inter {inter} rows {rows}");
            let mut want = vec![0.0f32; rows * inter];
            match act {
                GatedAct::Silu => reference::ops::silu_and_mul(&gu, inter, &mut want).unwrap(),
                GatedAct::GeluErf => reference::ops::gelu_and_mul(&gu, inter, &mut want).unwrap(),
                GatedAct::GeluTanh => {
                    for (i, w) in want.iter_mut().enumerate() {
                        let (row, j) = (i / inter, i % inter);
                        let g = gu[row * 2 * inter + j] as f64;
                        *w = (gelu_tanh_f64(g) * gu[row * 2 * inter + inter + j] as f64) as f32;
                    }
                }
            }
            let mut cpu = vec![0.0f32; rows * inter];
            ops::act_and_mul(act, &gu, inter, &mut cpu).unwrap();
            let mut o = nan_f32(&gpu, rows * inter);
            gpu.act_and_mul_f32(act, &gd, inter, &mut o).unwrap();
            let got = gpu.download(&o).unwrap();
            // f32 expf / erff / tanhf (a few ulp each), plus the cancellation in 1 + erf(x) or 1 + tanh(x) for
            // x << 0 (a few ulp of 1, times |gate * up| / 2): the absolute term covers it.
            let slack = |i: usize| {
                let (row, j) = (i / inter, i % inter);
                let p = gu[row * 2 * inter + j] as f64 * gu[row * 2 * inter + inter + j] as f64;
                1e-6 * (1.0 + p.abs())
            };
            check_f32(&format!("{what} vs f64"), &got, &want, 2e-6, &slack);
            check_f32(&format!("{what} vs CPU"), &got, &cpu, 1e-5, &slack);
        }
    }
}

/// The sigmoid gates and the softcap: CUDA's expf / tanhf (2 ulp) against Rust's f32 exp / tanh, then a division
/// or a product: a few ulp. 4e-6 relative is ~30 ulp, far under a wrong formula.
const TRANSCENDENTAL_REL: f64 = 4e-6;

#[test]
fn sigmoid_gate_softcap_add_and_scale_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("elementwise");
    for &len in &LENS {
        let x = uniform(&mut r, len, 8.0);
        let y = uniform(&mut r, len, 8.0);
        let yd = gpu.upload(&y).unwrap();

        let mut want = x.clone();
        backend::sigmoid_gate(&mut want, &y).unwrap();
        let mut xd = gpu.upload(&x).unwrap();
        gpu.sigmoid_gate(&mut xd, &yd).unwrap();
        let got = gpu.download(&xd).unwrap();
        check_f32(
            &format!("sigmoid_gate len {len}"),
            &got,
            &want,
            TRANSCENDENTAL_REL,
            &|_| 1e-30,
        );

        for cap in [0.5f32, 30.0] {
            let mut want = x.clone();
            backend::softcap(&mut want, cap);
            let mut xd = gpu.upload(&x).unwrap();
            gpu.softcap(&mut xd, cap).unwrap();
            let got = gpu.download(&xd).unwrap();
            check_f32(
                &format!("softcap {cap} len {len}"),
                &got,
                &want,
                TRANSCENDENTAL_REL,
                &|_| 1e-30,
            );
        }

        let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let mut xd = gpu.upload(&x).unwrap();
        gpu.add_assign(&mut xd, &yd).unwrap();
        check_bits(
            &format!("add_assign len {len}"),
            &gpu.download(&xd).unwrap(),
            &want,
        );

        let s = r.gen_range(-3.0f32..3.0);
        let want: Vec<f32> = x.iter().map(|a| a * s).collect();
        let mut xd = gpu.upload(&x).unwrap();
        gpu.scale_assign(&mut xd, s).unwrap();
        check_bits(
            &format!("scale_assign {s} len {len}"),
            &gpu.download(&xd).unwrap(),
            &want,
        );
    }
    // An empty buffer is nothing to do.
    let mut e = gpu.zeros::<f32>(0).unwrap();
    gpu.add_assign(&mut e, &gpu.zeros::<f32>(0).unwrap())
        .unwrap();
    gpu.scale_assign(&mut e, 2.0).unwrap();
    gpu.softcap(&mut e, 2.0).unwrap();
}

/// The decode step's fused pairs give the unfused pairs' bits: `add_rmsnorm_dual` = `add_rmsnorm_f32` (f32 output,
/// residual) and `add_rmsnorm` (bf16 output), `sigmoid_gate_bf16` = `sigmoid_gate` then `cast_f32_to_bf16`. Ragged
/// rows and lengths (the scalar tails), both norm forms, outputs poisoned; bad sizes refused.
#[test]
fn fused_norm_and_gate_outputs_equal_the_unfused_pairs() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("fused-dual");
    for (rows, dim) in [(1, 5120), (3, 1000), (16, 4), (5, 37), (2, 9000)] {
        for form in [ops::NormWeight::Plain, ops::NormWeight::OnePlus] {
            let x = uniform(&mut r, rows * dim, 2.0);
            let res = uniform(&mut r, rows * dim, 2.0);
            let w = gpu.upload(&uniform(&mut r, dim, 1.0)).unwrap();
            let xd = gpu.upload(&x).unwrap();
            let (mut r1, mut r2) = (gpu.upload(&res).unwrap(), gpu.upload(&res).unwrap());
            let mut want_f = nan_f32(&gpu, rows * dim);
            let mut want_b = gpu.upload(&vec![0x7fc1u16; rows * dim]).unwrap();
            gpu.add_rmsnorm_f32(&xd, &mut r1, &w, form, 1e-6, &mut want_f)
                .unwrap();
            // The bf16 reference adds into its own copy of the residual.
            let mut r3 = gpu.upload(&res).unwrap();
            gpu.add_rmsnorm(&xd, &mut r3, &w, form, 1e-6, &mut want_b)
                .unwrap();
            let mut got_f = nan_f32(&gpu, rows * dim);
            let mut got_b = gpu.upload(&vec![0x7fc1u16; rows * dim]).unwrap();
            gpu.add_rmsnorm_dual(&xd, &mut r2, &w, form, 1e-6, &mut got_f, &mut got_b)
                .unwrap();
            let what = format!("add_rmsnorm_dual rows {rows} dim {dim} {form:?}");
            check_bits(
                &format!("{what}: f32"),
                &gpu.download(&got_f).unwrap(),
                &gpu.download(&want_f).unwrap(),
            );
            check_bits(
                &format!("{what}: residual"),
                &gpu.download(&r2).unwrap(),
                &gpu.download(&r1).unwrap(),
            );
            assert_eq!(
                gpu.download(&got_b).unwrap(),
                gpu.download(&want_b).unwrap(),
                "{what}: bf16"
            );
        }
    }
    for &len in &LENS {
        let x = uniform(&mut r, len, 8.0);
        let g = uniform(&mut r, len, 8.0);
        let (xd, gd) = (gpu.upload(&x).unwrap(), gpu.upload(&g).unwrap());
        let mut gated = gpu.upload(&x).unwrap();
        gpu.sigmoid_gate(&mut gated, &gd).unwrap();
        let mut want = gpu.upload(&vec![0x7fc1u16; len]).unwrap();
        gpu.cast_f32_to_bf16(&gated, &mut want).unwrap();
        let mut got = gpu.upload(&vec![0x7fc1u16; len]).unwrap();
        gpu.sigmoid_gate_bf16(&xd, &gd, &mut got).unwrap();
        assert_eq!(
            gpu.download(&got).unwrap(),
            gpu.download(&want).unwrap(),
            "sigmoid_gate_bf16 len {len}"
        );
    }
    // Mismatched lengths are refused before anything runs.
    let (a, b) = (gpu.zeros::<f32>(8).unwrap(), gpu.zeros::<f32>(7).unwrap());
    let mut o = gpu.zeros::<u16>(8).unwrap();
    assert!(gpu.sigmoid_gate_bf16(&a, &b, &mut o).is_err());
    let mut o7 = gpu.zeros::<u16>(7).unwrap();
    assert!(gpu.sigmoid_gate_bf16(&a, &a, &mut o7).is_err());
    let w = gpu.zeros::<f32>(4).unwrap();
    let (mut res, mut of) = (gpu.zeros::<f32>(8).unwrap(), gpu.zeros::<f32>(8).unwrap());
    assert!(gpu
        .add_rmsnorm_dual(
            &a,
            &mut res,
            &w,
            ops::NormWeight::Plain,
            1e-6,
            &mut of,
            &mut o7
        )
        .is_err());
}

#[test]
fn head_gate_and_bias_rows_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("rows");
    // (rows, heads, d): head dims 1, odd and real, and 70001 groups (past grid.y's 65535, strided).
    for (rows, heads, d) in [
        (1usize, 1usize, 1usize),
        (3, 8, 64),
        (5, 3, 7),
        (17, 2, 256),
        (2, 4, 300),
        (70_001, 1, 3),
    ] {
        let x = uniform(&mut r, rows * heads * d, 4.0);
        let g = uniform(&mut r, rows * heads, 6.0);
        let mut want = x.clone();
        backend::sigmoid_head_gate(&mut want, heads, &g).unwrap();
        let mut xd = gpu.upload(&x).unwrap();
        gpu.sigmoid_head_gate(&mut xd, heads, &gpu.upload(&g).unwrap())
            .unwrap();
        check_f32(
            &format!("sigmoid_head_gate rows {rows} heads {heads} d {d}"),
            &gpu.download(&xd).unwrap(),
            &want,
            TRANSCENDENTAL_REL,
            &|_| 1e-30,
        );
    }
    for (rows, n) in [
        (1usize, 1usize),
        (17, 5),
        (3, 128),
        (70, 1000),
        (2, 3001),
        (66_000, 2),
    ] {
        let x = uniform(&mut r, rows * n, 4.0);
        let b = uniform(&mut r, n, 4.0);
        let want: Vec<f32> = x.iter().enumerate().map(|(i, v)| v + b[i % n]).collect();
        let mut xd = gpu.upload(&x).unwrap();
        gpu.add_bias_rows(&mut xd, &gpu.upload(&b).unwrap())
            .unwrap();
        check_bits(
            &format!("add_bias_rows rows {rows} n {n}"),
            &gpu.download(&xd).unwrap(),
            &want,
        );
    }
}

#[test]
fn copy_cols_copies_exactly_the_block_and_nothing_else() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("copy_cols");
    // [src_cols, src_off, dst_cols, dst_off, rows, width, src len, dst len]: a fused projection's middle part, a run
    // of whole rows gathered from an offset, one slot's state block (rows = 1) wider than one grid-stride sweep
    // (4096 x 256), rows past grid.y, and the width equal to dst_cols; each buffer a little longer than the copy
    // needs where the case allows it.
    let cases: [[usize; 8]; 6] = [
        [37, 5, 20, 3, 9, 11, 9 * 37, 9 * 20],
        [3072, 2048, 512, 0, 3, 512, 3 * 3072, 3 * 512],
        [13, 2 * 13, 13, 0, 4, 13, 7 * 13, 4 * 13],
        [1, 7, 1, 3, 1, 1_100_000, 1_100_010, 1_100_005],
        [5, 1, 3, 0, 70_000, 3, 70_000 * 5, 70_000 * 3],
        [8, 0, 8, 0, 2, 8, 16, 16],
    ];
    for [sc, so, dc, doff, rows, width, slen, dlen] in cases {
        let what = format!("copy_cols {sc} {so} {dc} {doff} {rows} {width}");
        let src = uniform(&mut r, slen, 1.0);
        let mut want = vec![f32::NAN; dlen];
        for row in 0..rows {
            for c in 0..width {
                want[row * dc + doff + c] = src[row * sc + so + c];
            }
        }
        let mut dd = nan_f32(&gpu, dlen);
        gpu.copy_cols(
            &gpu.upload(&src).unwrap(),
            sc,
            so,
            &mut dd,
            dc,
            doff,
            rows,
            width,
        )
        .unwrap();
        let got = gpu.download(&dd).unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{what}: dst[{i}] = {g}, want {w} (NaN: must stay untouched)"
            );
        }
    }
}

/// Any [`Gpu::copy_cols`] call on small buffers: accepted exactly when every range is inside its buffer (the
/// extents computed in u128, so they cannot wrap) and destination rows cannot overlap, and then the same copy as on
/// the CPU, every other destination element untouched. Dimensions are zero, small or huge (products that overflow
/// `usize`).
#[test]
fn copy_cols_accepts_exactly_the_in_range_calls_and_copies_them() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let Some(gpu) = gpu() else { return };
    let dim = || {
        prop_oneof![
            Just(0usize),
            1usize..9,
            Just(usize::MAX / 2),
            Just(usize::MAX)
        ]
    };
    let strategy = (
        [dim(), dim(), dim(), dim(), dim(), dim()],
        1usize..64,
        1usize..64,
        any::<u64>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(
            &strategy,
            |([sc, so, dc, doff, rows, width], slen, dlen, seed)| {
                let extent = |cols: usize, off: usize| {
                    (rows as u128).saturating_sub(1) * cols as u128 + off as u128 + width as u128
                };
                let ok = rows > 0
                    && width > 0
                    && (rows == 1 || width <= dc)
                    && extent(sc, so) <= slen as u128
                    && extent(dc, doff) <= dlen as u128;
                let mut r = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
                let src = uniform(&mut r, slen, 1.0);
                let dst0 = uniform(&mut r, dlen, 1.0);
                let mut dd = gpu.upload(&dst0).unwrap();
                let res = gpu.copy_cols(
                    &gpu.upload(&src).unwrap(),
                    sc,
                    so,
                    &mut dd,
                    dc,
                    doff,
                    rows,
                    width,
                );
                prop_assert_eq!(res.is_ok(), ok, "{:?}", res);
                let mut want = dst0.clone();
                if ok {
                    for row in 0..rows {
                        for c in 0..width {
                            want[row * dc + doff + c] = src[row * sc + so + c];
                        }
                    }
                }
                let got = gpu.download(&dd).unwrap();
                prop_assert!(got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()));
                Ok(())
            },
        )
        .unwrap();
}

// ---- attention over per-slot f32 caches -----------------------------------------------------------------------

/// One attention case: random caches (the history), `t` new tokens at random (slot, pos) pairs with distinct
/// places, the first token's slot and the second's position out of range when `bad`, queries and new K/V rows.
struct SlotCase {
    dims: AttnDims,
    num_slots: usize,
    max_len: usize,
    slots: Vec<u32>,
    pos: Vec<u32>,
    q: Vec<f32>,
    k_new: Vec<f32>,
    v_new: Vec<f32>,
    cache_k: Vec<f32>,
    cache_v: Vec<f32>,
}

fn slot_case(
    r: &mut ChaCha8Rng,
    dims: AttnDims,
    num_slots: usize,
    max_len: usize,
    t: usize,
    bad: bool,
) -> SlotCase {
    let width = dims.kv_heads * dims.head_dim;
    let mut places = std::collections::HashSet::new();
    let (mut slots, mut pos) = (Vec::new(), Vec::new());
    while slots.len() < t {
        let (s, p) = (
            r.gen_range(0..num_slots as u32),
            r.gen_range(0..max_len as u32),
        );
        if places.insert((s, p)) {
            slots.push(s);
            pos.push(p);
        }
    }
    if bad && t >= 2 {
        slots[0] = num_slots as u32 + r.gen_range(0..3);
        pos[1] = if r.gen_bool(0.5) {
            max_len as u32
        } else {
            u32::MAX
        };
    }
    // Keys with a spread of scores (a peaky softmax shows a wrong max or a lost rescale).
    let mut cache_k = uniform(r, num_slots * max_len * width, 1.0);
    for v in cache_k.iter_mut().step_by(7) {
        *v *= 4.0;
    }
    SlotCase {
        dims,
        num_slots,
        max_len,
        q: uniform(r, t * dims.q_heads * dims.head_dim, 1.0),
        k_new: uniform(r, t * width, 2.0),
        v_new: uniform(r, t * width, 1.0),
        cache_v: uniform(r, num_slots * max_len * width, 1.0),
        cache_k,
        slots,
        pos,
    }
}

/// The store on the CPU: token i's rows at (slots[i], pos[i]) when both are in range.
fn store_cpu(c: &SlotCase) -> (Vec<f32>, Vec<f32>) {
    let width = c.dims.kv_heads * c.dims.head_dim;
    let (mut k, mut v) = (c.cache_k.clone(), c.cache_v.clone());
    for i in 0..c.slots.len() {
        let (s, p) = (c.slots[i] as usize, c.pos[i] as usize);
        if s >= c.num_slots || p >= c.max_len {
            continue;
        }
        let dst = (s * c.max_len + p) * width;
        k[dst..dst + width].copy_from_slice(&c.k_new[i * width..(i + 1) * width]);
        v[dst..dst + width].copy_from_slice(&c.v_new[i * width..(i + 1) * width]);
    }
    (k, v)
}

/// Bound of the f32 attention against the f64 reference, per token (all its heads, Frobenius): f32 scores and an
/// online softmax measure ~1e-7..1e-6; a wrong window edge, a wrong KV head or a lost rescale is O(1e-2) or more.
const ATTN_TOL: f64 = 2e-5;

#[test]
fn kv_store_and_attention_over_slots_match_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("attention_slots");
    // (q_heads, kv_heads, head_dim): GQA ratios 1, 2, 4; head dims 64, 128, 256 and two that are not powers of 2.
    let geoms = [
        (4usize, 4usize, 64usize),
        (8, 4, 128),
        (8, 2, 256),
        (4, 1, 128),
        (6, 3, 40),
        (2, 1, 200),
        (24, 4, 256),
    ];
    for (gi, &(hq, hkv, d)) in geoms.iter().enumerate() {
        let dims = AttnDims {
            q_heads: hq,
            kv_heads: hkv,
            head_dim: d,
        };
        // The last geometry (the 27B's attention) has a context long enough for many split chunks of 32.
        let (num_slots, max_len) = (
            3,
            if gi == geoms.len() - 1 {
                700
            } else {
                37 + 20 * gi
            },
        );
        let t = [1usize, 5, 11][gi % 3];
        let c = slot_case(&mut r, dims, num_slots, max_len, t, t >= 2);
        let (want_k, want_v) = store_cpu(&c);
        let (mut ck, mut cv) = (
            gpu.upload(&c.cache_k).unwrap(),
            gpu.upload(&c.cache_v).unwrap(),
        );
        let (sd, pd) = (gpu.upload(&c.slots).unwrap(), gpu.upload(&c.pos).unwrap());
        gpu.kv_store_slots(
            &dims,
            &gpu.upload(&c.k_new).unwrap(),
            &gpu.upload(&c.v_new).unwrap(),
            &sd,
            &pd,
            &mut ck,
            &mut cv,
            max_len,
        )
        .unwrap();
        check_bits(
            &format!("kv_store_slots {dims:?} k"),
            &gpu.download(&ck).unwrap(),
            &want_k,
        );
        check_bits(
            &format!("kv_store_slots {dims:?} v"),
            &gpu.download(&cv).unwrap(),
            &want_v,
        );

        let qd = gpu.upload(&c.q).unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        let width = hkv * d;
        let row = hq * d;
        // Windows: 1 (the token alone), smaller than most positions, larger than every position, and full.
        for window in [Some(1usize), Some(5), Some(max_len + 10), None] {
            // The one-block kernel, then the split one at 1, 3, the device's choice and the most splits, each on a
            // poisoned output and workspace.
            let auto = gpu.attention_slots_splits(&dims);
            for splits in [
                None,
                Some(1),
                Some(3),
                Some(auto),
                Some(Gpu::ATTENTION_SLOTS_MAX_SPLITS),
            ] {
                let what =
                    format!("attention_slots {dims:?} window {window:?} t {t} splits {splits:?}");
                let mut od = nan_f32(&gpu, t * row);
                match splits {
                    None => gpu.attention_slots(
                        &dims, scale, window, &qd, &ck, &cv, max_len, &sd, &pd, &mut od,
                    ),
                    Some(n) => {
                        let len = Gpu::attention_slots_workspace_len(&dims, t, n).unwrap();
                        // One more value than needed: a workspace may be larger.
                        let mut ws = nan_f32(&gpu, len + 1);
                        gpu.attention_slots_split(
                            &dims, scale, window, &qd, &ck, &cv, max_len, &sd, &pd, n, &mut ws,
                            &mut od,
                        )
                    }
                }
                .unwrap();
                let got = gpu.download(&od).unwrap();
                for i in 0..t {
                    let (s, p) = (c.slots[i] as usize, c.pos[i] as usize);
                    let got_i = &got[i * row..(i + 1) * row];
                    if s >= num_slots || p >= max_len {
                        assert!(
                        got_i.iter().all(|&v| v == 0.0),
                        "{what}: token {i} has slot {s} / pos {p} out of range and must be zeros"
                    );
                        continue;
                    }
                    let base = s * max_len * width;
                    let n = p + 1;
                    let hist_k = &want_k[base..base + n * width];
                    let hist_v = &want_v[base..base + n * width];
                    let mut want = vec![0.0f32; row];
                    reference::attention::decode_dense(
                        &dims,
                        scale,
                        window,
                        n,
                        &c.q[i * row..(i + 1) * row],
                        hist_k,
                        hist_v,
                        &mut want,
                    )
                    .unwrap();
                    let e = rel_err(&format!("{what} token {i}"), got_i, &want);
                    assert!(
                        e <= ATTN_TOL,
                        "{what}: token {i} (slot {s}, pos {p}): relative error {e:e}"
                    );
                }
            }
        }
    }
}

// ---- the cast producers ---------------------------------------------------------------------------------------

/// A fragment buffer of `len` words of f16 NaN pairs, so an entry the GEMV reads and the producer did not write
/// poisons the product.
fn poisoned_words(gpu: &Gpu, len: usize) -> GpuBuffer<u32> {
    gpu.upload(&vec![0x7e00_7e00u32; len]).unwrap()
}

/// Random activations in (-amp, amp) with, every 97th element, a value past f16's range (the fragments saturate
/// it) or a bf16 rounding tie (to even, down and up).
fn cast_inputs(r: &mut ChaCha8Rng, len: usize, amp: f32) -> Vec<f32> {
    let specials = [
        1e5f32,
        -7e4,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
    ];
    let mut x = uniform(r, len, amp);
    for (v, &s) in x.iter_mut().zip(specials.iter().cycle()).step_by(97) {
        *v = s;
    }
    x
}

/// `Gpu::cast_nvfp4_gemv` (the cast writing the NVFP4 GEMV's fragments, then the GEMV: two launches) gives the
/// bits of `Gpu::cast_f32_to_bf16` + `Gpu::nvfp4_gemv_tiles` (three): every m from 1 to 16 (one and two fragment
/// tiles), k a multiple of 128 and not (the cast zeroes the last chunk's tail), n up to 8192, where m <= 8 adds two
/// K splits into a y the cast zeroes, and past it; fragments and outputs poisoned, the step run twice into the same
/// y (an unzeroed y shows the second time).
#[test]
fn cast_nvfp4_gemv_equals_the_cast_and_the_gemv_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("cast_nvfp4_gemv");
    for (n, k) in [(300, 5120), (8192, 160), (8200, 160), (40, 4128)] {
        let w = uniform(&mut r, n * k, 0.05);
        let (packed, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
        let (dw, ds) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales).unwrap());
        let tiles = gpu.nvfp4_repack_tiles(&dw, &ds, n, k).unwrap();
        for m in 1..=16 {
            let what = format!("m={m} n={n} k={k}");
            let xd = gpu.upload(&cast_inputs(&mut r, m * k, 4.0)).unwrap();
            let mut xb = gpu.upload(&vec![0x7fc1u16; m * k]).unwrap();
            gpu.cast_f32_to_bf16(&xd, &mut xb).unwrap();
            let mut scratch = poisoned_words(&gpu, Gpu::gemv_scratch_len(m, k));
            let mut ya = nan_f32(&gpu, m * n);
            gpu.nvfp4_gemv_tiles(&xb, &tiles, global, &mut ya, &mut scratch, m)
                .unwrap();
            let want = gpu.download(&ya).unwrap();
            assert!(
                want.iter().all(|v| v.is_finite()),
                "{what}: the unfused path is not finite"
            );
            let mut frags = Nvfp4Fragments::new(poisoned_words(&gpu, Gpu::gemv_scratch_len(m, k)));
            let mut yb = nan_f32(&gpu, m * n);
            for run in 0..2 {
                gpu.cast_nvfp4_gemv(&xd, &mut frags, &tiles, global, &mut yb)
                    .unwrap();
                check_bits(
                    &format!("cast_nvfp4_gemv {what}, run {run}"),
                    &gpu.download(&yb).unwrap(),
                    &want,
                );
            }
            assert_eq!(frags.written(), Some((m, k)), "{what}: the record");
        }
    }
}

/// The FP8-order twin, `Gpu::cast_fp8_fragments` + `Gpu::fp8_gemv_tiles_fragments`, against the f64 reference on
/// the bf16-rounded input (exact in f16 over this range, so only the f32 sums round: 2e-5 relative, as the GEMV
/// tests): k a multiple of 16 and not of 32 (what NVFP4 cannot take) or 128, m on both sides of the tile of 8.
#[test]
fn cast_fp8_fragments_feed_the_fp8_gemv() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("cast_fp8_fragments");
    for (n, k) in [(40, 144), (300, 4112), (9000, 160)] {
        let w = uniform(&mut r, n * k, 0.05);
        let (codes, scale_inv) = reference::linear::quantize_fp8_block(&w, n, k);
        let dw = gpu.upload(&codes).unwrap();
        let ds = gpu.upload(&scale_inv).unwrap();
        let tiles = gpu.fp8_repack_tiles(&dw, n, k).unwrap();
        for m in [1, 3, 8, 9, 16] {
            let what = format!("cast_fp8_fragments m={m} n={n} k={k}");
            let x = uniform(&mut r, m * k, 2.0);
            let xs: Vec<f32> = x.iter().map(|&v| bf16_to_f32(f32_to_bf16(v))).collect();
            let want = reference::linear::fp8_block_linear(&xs, m, &codes, &scale_inv, n, k);
            let mut frags = Fp8Fragments::new(poisoned_words(&gpu, Gpu::gemv_scratch_len(m, k)));
            gpu.cast_fp8_fragments(&gpu.upload(&x).unwrap(), k, &mut frags)
                .unwrap();
            assert_eq!(frags.written(), Some((m, k)), "{what}: the record");
            let mut y = nan_f32(&gpu, m * n);
            gpu.fp8_gemv_tiles_fragments(&frags, &tiles, &ds, &mut y, m)
                .unwrap();
            assert_rel(&what, &gpu.download(&y).unwrap(), &want, 2e-5);
        }
    }
}

/// The cast producers and the step refuse, before any launch, a k that is not a positive multiple of 16, an x
/// that is not whole rows of k, more than 16 rows, a short fragment buffer and a y of the wrong length; a refused
/// call leaves y and the fragments' record as they were.
#[test]
fn cast_producers_refuse_bad_sizes() {
    let Some(gpu) = gpu() else { return };
    let msg = |e: Result<(), kernels::KernelError>| e.unwrap_err().to_string();
    let (n, k) = (8, 160);
    let tiles = gpu
        .nvfp4_repack_tiles(
            &gpu.zeros::<u8>(n * k / 2).unwrap(),
            &gpu.upload(&vec![0x38u8; n * k / 16]).unwrap(),
            n,
            k,
        )
        .unwrap();
    let mut f4 = Nvfp4Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(16, k)).unwrap());
    let mut f8 = Fp8Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(16, k)).unwrap());
    let x = |len| gpu.zeros::<f32>(len).unwrap();
    for (e, want) in [
        (
            msg(gpu.cast_nvfp4_fragments(&x(3 * 40), 40, &mut f4)),
            "k must be a positive multiple of 16 (the NVFP4 GEMV's fragments), got 40",
        ),
        (
            msg(gpu.cast_fp8_fragments(&x(3 * 40), 0, &mut f8)),
            "k must be a positive multiple of 16 (the FP8 GEMV's fragments), got 0",
        ),
        (
            msg(gpu.cast_nvfp4_fragments(&x(3 * k + 16), k, &mut f4)),
            "x has 496 elements, not a whole number of rows of k = 160",
        ),
        (
            msg(gpu.cast_fp8_fragments(&x(17 * k), k, &mut f8)),
            "1 to 16 token rows, x has 17 rows",
        ),
        (
            msg(gpu.cast_nvfp4_fragments(&x(0), k, &mut f4)),
            "x has 0 rows",
        ),
        (
            msg(gpu.cast_nvfp4_fragments(
                &x(9 * k),
                k,
                &mut Nvfp4Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(8, k)).unwrap()),
            )),
            "scratch has 1024 words, the activations of m = 9, k = 160 need 2048",
        ),
    ] {
        assert!(e.contains(want), "{e}");
    }
    assert_eq!(f4.written(), None, "a refused call recorded a shape");
    assert_eq!(f8.written(), None, "a refused call recorded a shape");
    gpu.cast_nvfp4_fragments(&x(2 * k), k, &mut f4).unwrap();
    let mut y = nan_f32(&gpu, 3 * n);
    let mut step = |xlen: usize, y: &mut GpuBuffer<f32>| {
        msg(gpu.cast_nvfp4_gemv(&x(xlen), &mut f4, &tiles, 1.0, y))
    };
    for (e, want) in [
        (
            step(3 * k + 16, &mut y),
            "x has 496 elements, not a whole number of rows of 160 (the GEMV's k = 160)",
        ),
        (step(2 * k, &mut y), "y has 24 elements, expected 16"),
        (step(17 * k, &mut nan_f32(&gpu, 17 * n)), "m must be 1..=16"),
    ] {
        assert!(e.contains(want), "{e}");
    }
    assert_eq!(
        f4.written(),
        Some((2, k)),
        "a refused step changed the record"
    );
    assert!(
        gpu.download(&y).unwrap().iter().all(|v| v.is_nan()),
        "a refused step wrote y"
    );
}

// ---- bad sizes ------------------------------------------------------------------------------------------------

#[test]
fn bad_sizes_are_refused_before_any_launch() {
    let Some(gpu) = gpu() else { return };
    let f = |n| gpu.zeros::<f32>(n).unwrap();
    let h = |n| gpu.zeros::<u16>(n).unwrap();
    let u = |n| gpu.zeros::<u32>(n).unwrap();
    let msg = |e: Result<(), kernels::KernelError>| e.unwrap_err().to_string();
    let msg_w = |e: Result<DenseGpuWeights, kernels::KernelError>| e.unwrap_err().to_string();

    // Dense: zero, overflowing and mismatched sizes.
    assert!(msg_w(gpu.dense_weights_f32(&[0.0; 6], 0, 6)).contains("positive"));
    assert!(msg_w(gpu.dense_weights_f32(&[0.0; 6], 2, 4)).contains("w has"));
    assert!(msg_w(gpu.dense_weights_bf16(&[0; 6], 1 << 33, 1 << 33)).contains("32-bit"));
    assert!(msg_w(gpu.dense_weights_bf16(&[0; 6], 3, 3)).contains("w has"));
    let w = gpu.dense_weights_f32(&[0.5; 6], 2, 3).unwrap();
    assert!(msg(gpu.dense_linear(&f(6), &w, &mut f(5), 2)).contains("y has"));
    assert!(msg(gpu.dense_linear(&f(5), &w, &mut f(4), 2)).contains("x has"));
    assert!(msg(gpu.dense_linear(&f(0), &w, &mut f(0), 0)).contains("m must be positive"));
    assert!(msg(gpu.dense_linear(&f(6), &w, &mut f(4), usize::MAX)).contains("grid"));
    // A weight enum built by hand with sizes its buffer does not hold.
    let lying = DenseGpuWeights::Bf16 {
        w: h(6),
        n: 4,
        k: 3,
    };
    assert!(msg(gpu.dense_linear(&f(3), &lying, &mut f(4), 1)).contains("w has"));
    let overflowing = DenseGpuWeights::F32 {
        w: f(6),
        n: usize::MAX,
        k: 2,
    };
    assert!(msg(gpu.dense_linear(&f(2), &overflowing, &mut f(2), 1)).contains("32-bit"));

    // Casts and flat ops: mismatched lengths, a bad cap.
    assert!(msg(gpu.cast_f32_to_bf16(&f(5), &mut h(4))).contains("out has"));
    assert!(msg(gpu.cast_bf16_to_f32(&h(5), &mut f(6))).contains("out has"));
    assert!(msg(gpu.sigmoid_gate(&mut f(5), &f(4))).contains("gate has"));
    assert!(msg(gpu.add_assign(&mut f(5), &f(6))).contains("y has"));
    assert!(msg(gpu.softcap(&mut f(5), 0.0)).contains("cap"));
    assert!(msg(gpu.softcap(&mut f(5), f32::INFINITY)).contains("cap"));

    // Gated activation: zero inter, not whole rows, out mismatched, inter past the grid.
    for act in [GatedAct::Silu, GatedAct::GeluErf, GatedAct::GeluTanh] {
        assert!(msg(gpu.act_and_mul_f32(act, &f(12), 0, &mut f(0))).contains("positive"));
        assert!(msg(gpu.act_and_mul_f32(act, &f(10), 3, &mut f(3))).contains("whole number"));
        assert!(msg(gpu.act_and_mul_f32(act, &f(12), 3, &mut f(5))).contains("out has"));
        assert!(msg(gpu.act_and_mul_f32(act, &f(12), usize::MAX, &mut f(6))).contains("grid"));
    }

    // Row-wise ops.
    assert!(msg(gpu.sigmoid_head_gate(&mut f(12), 0, &f(4))).contains("heads"));
    assert!(msg(gpu.sigmoid_head_gate(&mut f(12), 3, &f(4))).contains("heads"));
    assert!(msg(gpu.sigmoid_head_gate(&mut f(10), 2, &f(4))).contains("multiple"));
    assert!(msg(gpu.sigmoid_head_gate(&mut f(0), 2, &f(4))).contains("positive multiple"));
    assert!(msg(gpu.add_bias_rows(&mut f(10), &f(0))).contains("empty"));
    assert!(msg(gpu.add_bias_rows(&mut f(10), &f(4))).contains("whole number"));

    // copy_cols: zero sizes, ranges past either buffer, overflowing extents, overlapping destination rows.
    let src = f(20);
    assert!(msg(gpu.copy_cols(&src, 5, 0, &mut f(20), 5, 0, 0, 2)).contains("positive"));
    assert!(msg(gpu.copy_cols(&src, 5, 0, &mut f(20), 5, 0, 2, 0)).contains("positive"));
    assert!(msg(gpu.copy_cols(&src, 5, 4, &mut f(20), 5, 0, 4, 2)).contains("src has 20"));
    assert!(msg(gpu.copy_cols(&src, 5, 0, &mut f(19), 5, 3, 4, 2)).contains("dst has 19"));
    assert!(msg(gpu.copy_cols(&src, usize::MAX, 0, &mut f(20), 5, 0, 3, 1)).contains("overflows"));
    assert!(msg(gpu.copy_cols(&src, 5, 0, &mut f(20), 5, usize::MAX, 1, 1)).contains("overflows"));
    assert!(msg(gpu.copy_cols(&src, 5, 0, &mut f(20), 2, 0, 2, 3)).contains("overlap"));
    assert!(gpu.copy_cols(&src, 5, 0, &mut f(20), 5, 0, 4, 5).is_ok());

    // Attention: geometry, caches, tokens, window, scale.
    let dims = AttnDims {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 8,
    };
    let (ml, w) = (5usize, 16usize);
    let cache = |slots: usize| f(slots * ml * w);
    let (s2, p2) = (u(2), u(2));
    let store = |dims: &AttnDims,
                 kn: usize,
                 sl: &GpuBuffer<u32>,
                 ps: &GpuBuffer<u32>,
                 ck: usize,
                 cv: usize,
                 ml| {
        gpu.kv_store_slots(dims, &f(kn), &f(kn), sl, ps, &mut f(ck), &mut f(cv), ml)
    };
    assert!(store(&dims, 2 * w, &s2, &p2, 3 * ml * w, 3 * ml * w, ml).is_ok());
    assert!(msg(store(
        &dims,
        2 * w - 1,
        &s2,
        &p2,
        3 * ml * w,
        3 * ml * w,
        ml
    ))
    .contains("k_new"));
    assert!(msg(store(&dims, 2 * w, &s2, &u(3), 3 * ml * w, 3 * ml * w, ml)).contains("pos"));
    assert!(msg(store(&dims, 2 * w, &s2, &p2, 3 * ml * w, 2 * ml * w, ml)).contains("cache_v"));
    assert!(msg(store(
        &dims,
        2 * w,
        &s2,
        &p2,
        3 * ml * w + 1,
        3 * ml * w + 1,
        ml
    ))
    .contains("cache_k"));
    assert!(msg(store(&dims, 2 * w, &s2, &p2, 0, 0, ml)).contains("cache_k"));
    assert!(msg(store(&dims, 2 * w, &s2, &p2, 3 * ml * w, 3 * ml * w, 0)).contains("max_len"));
    assert!(msg(store(
        &dims,
        2 * w,
        &s2,
        &p2,
        3 * ml * w,
        3 * ml * w,
        usize::MAX
    ))
    .contains("overflows"));
    let bad_gqa = AttnDims { q_heads: 3, ..dims };
    assert!(msg(store(&bad_gqa, 2 * w, &s2, &p2, 3 * ml * w, 3 * ml * w, ml)).contains("multiple"));
    let zero_d = AttnDims {
        head_dim: 0,
        ..dims
    };
    assert!(msg(store(&zero_d, 0, &s2, &p2, 0, 0, ml)).contains("positive"));
    let huge_d = AttnDims {
        kv_heads: 1 << 40,
        q_heads: 1 << 40,
        head_dim: 1 << 30,
    };
    assert!(msg(store(&huge_d, 2 * w, &s2, &p2, 3 * ml * w, 3 * ml * w, ml)).contains("32-bit"));

    let (ck, cv) = (cache(3), cache(3));
    let qn = 2 * dims.q_heads * dims.head_dim;
    let attend = |dims: &AttnDims,
                  scale: f32,
                  window: Option<usize>,
                  q: usize,
                  out: usize,
                  ps: &GpuBuffer<u32>| {
        gpu.attention_slots(
            dims,
            scale,
            window,
            &f(q),
            &ck,
            &cv,
            ml,
            &s2,
            ps,
            &mut f(out),
        )
    };
    assert!(attend(&dims, 0.3, Some(2), qn, qn, &p2).is_ok());
    assert!(msg(attend(&dims, 0.3, Some(0), qn, qn, &p2)).contains("window"));
    assert!(msg(attend(&dims, f32::NAN, None, qn, qn, &p2)).contains("scale"));
    assert!(msg(attend(&dims, 0.3, None, qn - 1, qn, &p2)).contains("q has"));
    assert!(msg(attend(&dims, 0.3, None, qn, qn + 1, &p2)).contains("out has"));
    assert!(msg(attend(&dims, 0.3, None, qn, qn, &u(1))).contains("pos"));
    // The split form: its own checks, then the shared ones.
    let split = |splits: usize, ws: usize, q: usize| {
        gpu.attention_slots_split(
            &dims,
            0.3,
            None,
            &f(q),
            &ck,
            &cv,
            ml,
            &s2,
            &p2,
            splits,
            &mut f(ws),
            &mut f(qn),
        )
    };
    let need = Gpu::attention_slots_workspace_len(&dims, 2, 4).unwrap();
    assert_eq!(need, 2 * dims.q_heads * 4 * (dims.head_dim + 2));
    assert!(split(4, need, qn).is_ok());
    assert!(msg(split(4, need - 1, qn)).contains("workspace"));
    assert!(msg(split(0, need, qn)).contains("splits"));
    assert!(msg(split(Gpu::ATTENTION_SLOTS_MAX_SPLITS + 1, 1 << 20, qn)).contains("splits"));
    assert!(msg(split(4, need, qn - 1)).contains("q has"));
    assert!(Gpu::attention_slots_workspace_len(&dims, usize::MAX, 2).is_err());
    let wide = AttnDims {
        q_heads: 2,
        kv_heads: 1,
        head_dim: 264,
    };
    let wc = f(3 * ml * 264);
    assert!(msg(gpu.attention_slots(
        &wide,
        0.3,
        None,
        &f(2 * 2 * 264),
        &wc,
        &wc,
        ml,
        &s2,
        &p2,
        &mut f(2 * 2 * 264)
    ))
    .contains("at most 256"));
    gpu.synchronize().unwrap();
}
