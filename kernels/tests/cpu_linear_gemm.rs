//! The integer int4 GEMM (`m > 1`, `csrc/int4_gemm_avx512.c`) against the plain f64 reference, with both
//! activation encodings ([`GemmActs`]): ragged shapes that walk every branch of its loop nest (row tiles of 6 plus
//! every remainder 1..5, 32-column halves with a partial or absent second half, K chunks of 256 (int8) / 128
//! (int16) k-rows with a short last chunk and a short last group, k not a multiple of 4), both int4 grids, every
//! group size, 1, 2 and 5 threads, poisoned outputs. Every call must report the integer kernel where the CPU has
//! AVX512-VBMI (proving it ran), and the f32 kernels where it must not run.

use kernels::cpu::Isa;
use kernels::formats::{bf16_to_f32, f32_to_bf16};
use kernels::linear::{self, Activations, Ext, GemmActs, Int4Scheme, Int4Weights};
use kernels::reference::linear as reference;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

/// Relative to the sum of |x w| terms, as in `cpu_linear.rs`: f32 rescaling and accumulation of per-group sums.
const F32_REL: f64 = 1e-5;

/// False (the test is skipped, with a note) where this CPU has no AVX-512 and VBMI, which the integer GEMM needs.
fn has_vbmi_or_skip() -> bool {
    if !Isa::available().contains(&Isa::Avx512) || !kernels::cpu::has_avx512_vbmi() {
        eprintln!("skipped: no AVX-512 + AVX512-VBMI on this CPU (the integer GEMM needs both)");
        return false;
    }
    true
}

/// Random weights `[n, k]` in +-0.3, quantised on `scheme`'s grid.
fn int4_weights(
    r: &mut ChaCha8Rng,
    n: usize,
    k: usize,
    group: usize,
    scheme: Int4Scheme,
) -> Int4Weights {
    let wf: Vec<f32> = (0..n * k).map(|_| r.gen_range(-0.3f32..0.3)).collect();
    Int4Weights::quantize(&wf, n, k, group, scheme).unwrap()
}

/// Activations as a real layer's: mostly in +-2, 1% outliers up to +-40, one all-zero group in row 0, one row of
/// values around 1e-20 (representable by both encodings).
fn activations(r: &mut ChaCha8Rng, m: usize, k: usize, group: usize) -> Vec<f32> {
    let mut x = common::with_outliers(r, m * k, 2.0, 40.0);
    x[..group.min(k)].iter_mut().for_each(|v| *v = 0.0);
    if m > 2 {
        x[k..2 * k].iter_mut().for_each(|v| *v *= 1e-20);
    }
    x
}

/// Per output: the sum of |x w| terms and the bound on what the encoding's representation of x moves it by,
/// `sum_c step(g(c)) * |w(r, c)|`, with `step` the largest representation error of one x in its row and group.
fn bounds(x: &[f32], m: usize, l: &reference::Int4Logical, acts: GemmActs) -> (Vec<f64>, Vec<f64>) {
    let (n, k, group) = (l.n, l.k, l.group);
    let mut mag = vec![0.0; m * n];
    let mut rep = vec![0.0; m * n];
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        let step: Vec<f64> = row
            .chunks(group)
            .map(|g| {
                let gmax = g.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs())));
                match acts {
                    // int16: s <= 2 max / 32767 (a power of two), error <= s / 2
                    GemmActs::Int16 => gmax / 32767.0,
                    // int8: s = max / 127, error <= s / 2, plus the f32 rounding of x / s and of s
                    GemmActs::Int8 => gmax / 254.0 * (1.0 + 1e-5),
                }
            })
            .collect();
        for r in 0..n {
            let (mut a, mut e) = (0.0, 0.0);
            for (c, &xv) in row.iter().enumerate() {
                let wa = l.at(r, c).abs();
                a += f64::from(xv.abs()) * wa;
                e += step[c / group] * wa;
            }
            mag[i * n + r] = a;
            rep[i * n + r] = e;
        }
    }
    (mag, rep)
}

fn check(what: &str, got: &[f32], want: &[f32], mag: &[f64], rep: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - f64::from(w)).abs();
        let bound = F32_REL * mag[i] + rep[i] + 1e-30;
        assert!(
            g.is_finite() && err <= bound,
            "{what}: output {i}: got {g}, want {w}, error {err:e} > {bound:e} (|terms| {:e}, x repr {:e})",
            mag[i],
            rep[i]
        );
    }
}

/// (m, n, k): m over every row-tile remainder (and m = 64, 67 for several tiles); n odd, with a last block of 3,
/// 8 or 36 columns (the second 32-column half partial or absent); k crossing the 128- and 256-row chunks, with
/// short last groups and k % 4 in 1..3.
const CASES: [(usize, usize, usize); 10] = [
    (2, 67, 333),
    (3, 131, 64),
    (5, 200, 320),
    (6, 67, 3),
    (7, 72, 700),
    (8, 100, 1001),
    (11, 257, 258),
    (13, 64, 130),
    (64, 131, 520),
    (67, 67, 129),
];

#[test]
fn int4_gemm_matches_the_reference_with_both_encodings() {
    if !has_vbmi_or_skip() {
        return;
    }
    for (case, &(m, n, k)) in CASES.iter().enumerate() {
        for &group in &[32usize, 64, 128] {
            for scheme in [Int4Scheme::Asymmetric, Int4Scheme::Symmetric] {
                let mut r = ChaCha8Rng::seed_from_u64(
                    0x6e33 + (case * 16 + group) as u64 * 2 + scheme as u64,
                );
                let w = int4_weights(&mut r, n, k, group, scheme);
                let x = activations(&mut r, m, k, group);
                let l = w.to_logical();
                let want = reference::int4_linear(&x, m, &l);
                for acts in [GemmActs::Int16, GemmActs::Int8] {
                    let (mag, rep) = bounds(&x, m, &l, acts);
                    for threads in [1usize, 2, 5] {
                        let what =
                            format!("m{m} n{n} k{k} g{group} {scheme:?} {acts:?} t{threads}");
                        let mut y = vec![f32::NAN; m * n];
                        let ran = linear::w4a16_gemm_ext(
                            Isa::Avx512,
                            Ext::Auto,
                            acts,
                            threads,
                            &x,
                            m,
                            &w,
                            &mut y,
                        )
                        .unwrap();
                        assert!(
                            ran.isa == Isa::Avx512 && ran.vbmi,
                            "{what}: the integer GEMM ran"
                        );
                        check(&what, &y, &want, &mag, &rep);
                    }
                }
            }
        }
    }
}

#[test]
fn w4a16_takes_the_int16_gemm_for_several_rows_and_base_takes_the_f32_gemm() {
    if !has_vbmi_or_skip() {
        return;
    }
    let (m, n, k, group) = (9usize, 130usize, 400usize, 64usize);
    let mut r = ChaCha8Rng::seed_from_u64(0x6e34);
    let w = int4_weights(&mut r, n, k, group, Int4Scheme::Asymmetric);
    let l = w.to_logical();
    // bf16 activations of magnitudes in [2^-5, 2): every group spans less than 2^6, which int16 holds exactly,
    // so the integer GEMM stays within the f32 bound alone.
    let xb: Vec<u16> = (0..m * k)
        .map(|_| f32_to_bf16(r.gen_range(0.03125f32..2.0) * if r.gen() { 1.0 } else { -1.0 }))
        .collect();
    let xf: Vec<f32> = xb.iter().map(|&b| bf16_to_f32(b)).collect();
    let want = reference::int4_linear(&xf, m, &l);
    let (mag, _) = bounds(&xf, m, &l, GemmActs::Int16);
    let none = vec![0.0; m * n];
    for (ext, int) in [(Ext::Auto, true), (Ext::Base, false)] {
        for x in [Activations::from(&xb), Activations::from(&xf)] {
            let mut y = vec![f32::NAN; m * n];
            let ran = linear::w4a16_ext(Isa::Avx512, ext, 2, x, m, &w, &mut y).unwrap();
            assert_eq!((ran.isa, ran.vbmi), (Isa::Avx512, int), "{ext:?}");
            check(&format!("bf16 exact {ext:?}"), &y, &want, &mag, &none);
        }
    }
}

#[test]
fn activations_the_encodings_cannot_hold_take_the_f32_gemm() {
    if !has_vbmi_or_skip() {
        return;
    }
    let (m, n, k, group) = (4usize, 70usize, 384usize, 128usize);
    let mut r = ChaCha8Rng::seed_from_u64(0x6e35);
    let w = int4_weights(&mut r, n, k, group, Int4Scheme::Asymmetric);
    for acts in [GemmActs::Int16, GemmActs::Int8] {
        for (bad, v) in [("NaN", f32::NAN), ("infinity", f32::INFINITY)] {
            let mut x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-1.0f32..1.0)).collect();
            x[2 * k + 200] = v;
            let mut y = vec![0f32; m * n];
            let ran =
                linear::w4a16_gemm_ext(Isa::Avx512, Ext::Auto, acts, 2, &x, m, &w, &mut y).unwrap();
            assert!(
                !ran.vbmi,
                "{acts:?}: {bad} activations must take the f32 GEMM"
            );
            assert!(
                y[2 * n..3 * n].iter().all(|v| !v.is_finite()),
                "{acts:?}: a {bad} activation reaches every column of its row"
            );
        }
    }
    // A group below ~3.9e-34: int16 cannot scale it (its power-of-two scale would be subnormal); int8 can.
    let mut x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-1.0f32..1.0)).collect();
    x[k + 128..k + 256].iter_mut().for_each(|v| *v *= 1e-35);
    let mut y = vec![0f32; m * n];
    let ran = linear::w4a16_ext(Isa::Avx512, Ext::Auto, 2, &x, m, &w, &mut y).unwrap();
    assert!(
        !ran.vbmi,
        "int16: a group below ~3.9e-34 must take the f32 GEMM"
    );
}
