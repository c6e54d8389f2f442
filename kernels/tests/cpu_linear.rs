//! The weight kernels against their f64 references, on every dispatch path this CPU has, with ragged shapes,
//! poisoned outputs, several thread counts, and the error bounds of each format stated where they are checked.

use kernels::cpu::Isa;
use kernels::formats::{e4m3_to_f32, f32_to_bf16};
use kernels::linear::{self, Bf16Weights, Ext, Fp8Weights, Int4Scheme, Int4Weights, Nvfp4Weights};
use kernels::reference::linear as reference;
use kernels::KernelError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A generator seeded from the test's name and the case, so every case gets fresh data and failures replay.
fn rng(test: &str, case: &[usize]) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in test
        .bytes()
        .chain(case.iter().flat_map(|c| c.to_le_bytes()))
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    ChaCha8Rng::seed_from_u64(h)
}

/// Weights with rows of different magnitude (as real layers have) and activations with a few outliers.
fn weights(r: &mut ChaCha8Rng, n: usize, k: usize) -> Vec<f32> {
    let row_scale: Vec<f32> = (0..n).map(|_| r.gen_range(0.01f32..0.5)).collect();
    (0..n * k)
        .map(|i| r.gen_range(-1.0f32..1.0) * row_scale[i / k])
        .collect()
}

fn activations(r: &mut ChaCha8Rng, m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|_| {
            if r.gen_bool(0.01) {
                r.gen_range(-20.0f32..20.0)
            } else {
                r.gen_range(-2.0f32..2.0)
            }
        })
        .collect()
}

/// The shapes every format runs: m = 1 is the GEMV, m > 1 the GEMM (4-row blocks plus a remainder); n and k are
/// off every tile (64-column int4 blocks in groups of 4 or 2, 64-row panels, 4-row GEMV groups, 128 scale blocks,
/// the 256-column K chunk of the GEMMs, W4A8's 4-row quads: k = 333 ends on a short quad).
const SHAPES: [(usize, usize, usize); 8] = [
    (1, 67, 320),
    (1, 130, 333),
    (2, 67, 333),
    (1, 200, 136),
    (3, 130, 320),
    (5, 67, 136),
    (6, 37, 608),
    (1, 64, 608),
];

/// Thread counts: one, the machine's two cores, and more threads than blocks for the small shapes.
const THREADS: [usize; 3] = [1, 2, 5];

/// `|got - want| <= rel * mag + 1e-30` elementwise, where `mag[i]` bounds the sum of |x w| terms of element i,
/// so the bound is relative to the size of the dot product's terms, not to its (possibly cancelled) value.
fn assert_close(what: &str, got: &[f32], want: &[f32], mag: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len());
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(mag).enumerate() {
        assert!(g.is_finite(), "{what}: element {i} is {g} (not written?)");
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(
            err <= rel * s + 1e-30,
            "{what}: element {i}: got {g}, want {w}, error {err:e} > {rel:e} * {s:e}"
        );
    }
}

/// `mag[i, r] = sum_k |x[i, k]| * wabs(r, k)`.
fn magnitude(
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    wabs: impl Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let mut mag = vec![0.0; m * n];
    for r in 0..n {
        for i in 0..m {
            mag[i * n + r] = (0..k)
                .map(|c| f64::from(x[i * k + c].abs()) * wabs(r, c))
                .sum();
        }
    }
    mag
}

/// What each f32 kernel may differ from the f64 reference by, relative to the sum of |terms|: f32 accumulation
/// over at most a few hundred terms per partial sum, each addition off by at most 2^-24 relative, so the worst
/// case is a few 1e-5 and a typical (random-walk) case near 1e-6. Format error is not in this bound: the
/// references decode the same stored codes.
const F32_REL: f64 = 1e-5;

fn poisoned(len: usize) -> Vec<f32> {
    vec![f32::NAN; len]
}

#[test]
fn every_path_of_this_cpu_is_exercised() {
    // The CI and development machines have AVX-512; if this ever runs elsewhere the tests below still cover what
    // exists, and this line says which paths were covered.
    eprintln!("paths exercised: {:?}", Isa::available());
    assert!(Isa::available().contains(&Isa::Scalar));
}

/// The W4A16 integer GEMV (AVX-512 + VBMI, `m == 1`, [`Ext::Auto`]) holds each x to within max |x| / 32767 of
/// its group, so beyond the f32 bound it may differ by `sum_c max_g |x| / 32767 * |w_c|` (`int4_rep`).
fn int4_rep(x: &[f32], m: usize, l: &reference::Int4Logical) -> Vec<f64> {
    let (n, k, group) = (l.n, l.k, l.group);
    let mut rep = vec![0.0; m * n];
    for i in 0..m {
        let gmax: Vec<f64> = x[i * k..(i + 1) * k]
            .chunks(group)
            .map(|g| g.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs()))))
            .collect();
        for r in 0..n {
            rep[i * n + r] = (0..k)
                .map(|c| gmax[c / group] / 32767.0 * l.at(r, c).abs())
                .sum();
        }
    }
    rep
}

#[test]
fn w4a16_matches_reference_on_every_path_shape_group_and_thread_count() {
    for (case, &(m, n, k)) in SHAPES.iter().enumerate() {
        for &group in &[32usize, 64, 128] {
            for scheme in [Int4Scheme::Asymmetric, Int4Scheme::Symmetric] {
                let mut r = rng("w4a16", &[case, group, scheme as usize]);
                let w = weights(&mut r, n, k);
                let x = activations(&mut r, m, k);
                let packed = Int4Weights::quantize(&w, n, k, group, scheme).unwrap();
                let logical = packed.to_logical();
                let want = reference::int4_linear(&x, m, &logical);
                let mag = magnitude(&x, m, n, k, |row, col| {
                    let g = (col / group) * n + row;
                    8.0 * f64::from(logical.scales[g].abs()) + f64::from(logical.zeros[g].abs())
                });
                let rep = int4_rep(&x, m, &logical);
                for isa in Isa::available() {
                    for &threads in &THREADS {
                        for ext in [Ext::Base, Ext::Auto] {
                            let mut y = poisoned(m * n);
                            let ran = linear::w4a16_ext(isa, ext, threads, &x, m, &packed, &mut y)
                                .unwrap();
                            assert_eq!(ran.isa, isa, "w4a16 has its own code on every path");
                            // The integer kernels (the GEMV at m = 1, the int16 GEMM above) share the
                            // activation encoding, so the same representation bound.
                            let int = isa == Isa::Avx512
                                && ext == Ext::Auto
                                && kernels::cpu::has_avx512_vbmi();
                            assert_eq!(
                                ran.vbmi, int,
                                "the integer kernels run exactly where they can"
                            );
                            let what = format!(
                                "w4a16 {isa:?} {ext:?} t{threads} m{m} n{n} k{k} g{group} {scheme:?}"
                            );
                            let bound: Vec<f64> = mag
                                .iter()
                                .zip(&rep)
                                .map(|(&a, &e)| F32_REL * a + if int { e } else { 0.0 })
                                .collect();
                            assert_close(&what, &y, &want, &bound, 1.0);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn w4a16_takes_bf16_activations() {
    let (m, n, k) = (2, 67, 320);
    let mut r = rng("w4a16_bf16", &[]);
    let w = weights(&mut r, n, k);
    let x = activations(&mut r, m, k);
    let xb: Vec<u16> = x.iter().map(|&v| f32_to_bf16(v)).collect();
    let xr: Vec<f32> = xb
        .iter()
        .map(|&b| kernels::formats::bf16_to_f32(b))
        .collect();
    let packed = Int4Weights::quantize(&w, n, k, 64, Int4Scheme::Asymmetric).unwrap();
    let want = reference::int4_linear(&xr, m, &packed.to_logical());
    let mag = magnitude(&xr, m, n, k, |_, _| 1.0);
    for isa in Isa::available() {
        let mut y = poisoned(m * n);
        linear::w4a16_with(isa, 2, &xb, m, &packed, &mut y).unwrap();
        assert_close("w4a16 bf16 activations", &y, &want, &mag, F32_REL);
    }
}

#[test]
fn w4a8_matches_its_reference_and_stays_within_the_activation_quantisation_bound() {
    for (case, &(m, n, k)) in SHAPES.iter().enumerate() {
        for &group in &[32usize, 64, 128] {
            let mut r = rng("w4a8", &[case, group]);
            let w = weights(&mut r, n, k);
            let x = activations(&mut r, m, k);
            let packed = Int4Weights::quantize(&w, n, k, group, Int4Scheme::Symmetric).unwrap();
            let logical = packed.to_logical();
            let want = reference::w4a8_linear(&x, m, &logical);
            let exact = reference::int4_linear(&x, m, &logical);
            let wabs = |row: usize, col: usize| logical.at(row, col).abs();
            let mag = magnitude(&x, m, n, k, |row, col| {
                8.0 * f64::from(logical.scales[(col / group) * n + row])
            });
            // Rounding x to int8 moves each element by at most half a step (amax/127/2), so the result moves by at
            // most that times sum |w| of the row.
            let (_, xs) = reference::quantize_rows_int8(&x, m, k);
            let wsum: Vec<f64> = (0..n)
                .map(|row| (0..k).map(|c| wabs(row, c)).sum())
                .collect();
            for isa in Isa::available() {
                for &threads in &THREADS[..2] {
                    let mut y = poisoned(m * n);
                    let ran = linear::w4a8_with(isa, threads, &x, m, &packed, &mut y).unwrap();
                    assert_eq!(ran, isa, "W4A8 has its own code on every path");
                    let what = format!("w4a8 {isa:?} t{threads} m{m} n{n} k{k} g{group}");
                    assert_close(&what, &y, &want, &mag, F32_REL);
                    for i in 0..m {
                        for row in 0..n {
                            let bound = 0.5 * f64::from(xs[i]) * wsum[row] * 1.0001 + 1e-6;
                            let err =
                                (f64::from(y[i * n + row]) - f64::from(exact[i * n + row])).abs();
                            assert!(
                                err <= bound,
                                "{what}: ({i},{row}) error {err:e} beyond int8 bound {bound:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fp8_matches_reference_and_the_e4m3_bound() {
    for (case, &(m, n, k)) in SHAPES.iter().enumerate() {
        let mut r = rng("fp8", &[case]);
        let w = weights(&mut r, n, k);
        let x = activations(&mut r, m, k);
        let (codes, sinv) = reference::quantize_fp8_block(&w, n, k);
        let want = reference::fp8_block_linear(&x, m, &codes, &sinv, n, k);
        let kb = k.div_ceil(128);
        let mag = magnitude(&x, m, n, k, |row, col| {
            f64::from(e4m3_to_f32(codes[row * k + col]).abs() * sinv[(row / 128) * kb + col / 128])
        });
        let fw = Fp8Weights::new(&codes, &sinv, n, k).unwrap();
        // e4m3 keeps 3 mantissa bits: a normal weight is within 2^-4 of itself relative, a subnormal within half
        // the 2^-9 quantum of the block scale. Against the unquantised weights, the result is within that.
        let fmag = magnitude(&x, m, n, k, |row, col| {
            f64::from(w[row * k + col].abs()) / 16.0
                + f64::from(sinv[(row / 128) * kb + col / 128]) * 2f64.powi(-10)
        });
        let unq = float_linear(&x, m, &w, n, k);
        for isa in Isa::available() {
            for &threads in &THREADS {
                let mut y = poisoned(m * n);
                let ran = linear::fp8_with(isa, threads, &x, m, &fw, &mut y).unwrap();
                assert_eq!(ran, isa);
                let what = format!("fp8 {isa:?} t{threads} m{m} n{n} k{k}");
                assert_close(&what, &y, &want, &mag, F32_REL);
                assert_close(&format!("{what} vs unquantised"), &y, &unq, &fmag, 1.0001);
            }
        }
    }
}

/// `x W^T` in f64 with plain f32 weights.
fn float_linear(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for r in 0..n {
            y[i * n + r] = (0..k)
                .map(|c| f64::from(x[i * k + c]) * f64::from(w[r * k + c]))
                .sum::<f64>() as f32;
        }
    }
    y
}

#[test]
fn nvfp4_matches_reference() {
    // NVFP4 needs k to be a multiple of 16: 144 and 336 are off the 128-element chunk of the AVX-512 GEMV, 608 is
    // off the GEMM's 512 chunk.
    let shapes = [
        (1, 67, 336),
        (1, 200, 144),
        (3, 130, 336),
        (5, 67, 144),
        (6, 37, 608),
        (1, 64, 608),
        (1, 33, 128),
    ];
    for (case, &(m, n, k)) in shapes.iter().enumerate() {
        let mut r = rng("nvfp4", &[case]);
        let w = weights(&mut r, n, k);
        let x = activations(&mut r, m, k);
        let (packed, scales, global) = reference::quantize_nvfp4(&w, n, k);
        let want = reference::nvfp4_linear(&x, m, &packed, &scales, global, n, k);
        let dec = |row: usize, col: usize| {
            let b = packed[row * (k / 2) + col / 2];
            let c = if col.is_multiple_of(2) {
                b & 15
            } else {
                b >> 4
            };
            f64::from(
                kernels::formats::e2m1_to_f32(c).abs()
                    * e4m3_to_f32(scales[row * (k / 16) + col / 16])
                    * global,
            )
        };
        let mag = magnitude(&x, m, n, k, dec);
        let nw = Nvfp4Weights::new(&packed, &scales, global, n, k).unwrap();
        for isa in Isa::available() {
            for &threads in &THREADS {
                let mut y = poisoned(m * n);
                let ran = linear::nvfp4_with(isa, threads, &x, m, &nw, &mut y).unwrap();
                assert_eq!(ran, isa, "NVFP4 has its own code on every path");
                assert_close(
                    &format!("nvfp4 {isa:?} t{threads} m{m} n{n} k{k}"),
                    &y,
                    &want,
                    &mag,
                    F32_REL,
                );
            }
        }
    }
}

#[test]
fn bf16_matches_reference_with_f32_and_bf16_activations() {
    for (case, &(m, n, k)) in SHAPES.iter().enumerate() {
        let mut r = rng("bf16", &[case]);
        let w = reference::to_bf16(&weights(&mut r, n, k));
        let x = activations(&mut r, m, k);
        let xb = reference::to_bf16(&x);
        let xr: Vec<f32> = xb
            .iter()
            .map(|&b| kernels::formats::bf16_to_f32(b))
            .collect();
        let want = reference::bf16_linear(&x, m, &w, n, k);
        let want_b = reference::bf16_linear(&xr, m, &w, n, k);
        let mag = magnitude(&x, m, n, k, |row, col| {
            f64::from(kernels::formats::bf16_to_f32(w[row * k + col]).abs())
        });
        let bw = Bf16Weights::new(&w, n, k).unwrap();
        for isa in Isa::available() {
            for &threads in &THREADS {
                let mut y = poisoned(m * n);
                assert_eq!(
                    linear::bf16_with(isa, threads, &x, m, &bw, &mut y).unwrap(),
                    isa
                );
                assert_close(
                    &format!("bf16 {isa:?} t{threads} m{m} n{n} k{k}"),
                    &y,
                    &want,
                    &mag,
                    F32_REL,
                );
                let mut y = poisoned(m * n);
                linear::bf16_with(isa, threads, &xb, m, &bw, &mut y).unwrap();
                assert_close(
                    &format!("bf16 x-bf16 {isa:?} m{m} n{n} k{k}"),
                    &y,
                    &want_b,
                    &mag,
                    2e-5,
                );
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Threads split output columns, so every element is computed by the same code in the same order: bit-identical.
    // m = 1 is the GEMV (on a VBMI CPU the integer kernel, whose int16 activations are built once per call and
    // shared by every thread), m = 3 the tiled GEMM.
    for m in [1, 3] {
        // 10 blocks: two threads take 8 and 2 (units of 4), more threads fewer blocks each.
        let (n, k) = (600, 320);
        let mut r = rng("threads", &[m]);
        let w = weights(&mut r, n, k);
        let x = activations(&mut r, m, k);
        let packed = Int4Weights::quantize(&w, n, k, 64, Int4Scheme::Asymmetric).unwrap();
        let mut one = vec![0.0; m * n];
        linear::w4a16_with(Isa::detected(), 1, &x, m, &packed, &mut one).unwrap();
        for threads in [2, 3, 7] {
            let mut y = poisoned(m * n);
            linear::w4a16_with(Isa::detected(), threads, &x, m, &packed, &mut y).unwrap();
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn bad_sizes_are_errors() {
    let (n, k) = (67, 136);
    let w = vec![0.1f32; n * k];
    let asym = Int4Weights::quantize(&w, n, k, 32, Int4Scheme::Asymmetric).unwrap();
    let x = vec![0.5f32; k];
    let mut y = vec![0.0f32; n];
    let is_shape = |e: Result<Isa, KernelError>| matches!(e, Err(KernelError::Shape { .. }));

    assert!(
        is_shape(linear::w4a16(&x[..k - 1], 1, &asym, &mut y)),
        "short x"
    );
    assert!(
        is_shape(linear::w4a16(&x, 1, &asym, &mut y[..n - 1])),
        "short y"
    );
    assert!(
        is_shape(linear::w4a16(&x, 2, &asym, &mut y)),
        "m does not match x"
    );
    assert!(
        is_shape(linear::w4a16(&x[..0], 0, &asym, &mut y[..0])),
        "m = 0"
    );
    let err = linear::w4a8(&x, 1, &asym, &mut y).unwrap_err();
    assert!(
        err.to_string().contains("symmetric"),
        "W4A8 on asymmetric weights: {err}"
    );

    assert!(
        Int4Weights::quantize(&w, n, k, 48, Int4Scheme::Asymmetric).is_err(),
        "group 48"
    );
    assert!(
        Int4Weights::quantize(&w[1..], n, k, 32, Int4Scheme::Asymmetric).is_err(),
        "short weights"
    );
    assert!(
        Int4Weights::quantize(&[], 0, k, 32, Int4Scheme::Asymmetric).is_err(),
        "n = 0"
    );

    let codes = vec![0u8; n * k];
    let sinv = vec![1.0f32; 2];
    assert!(Fp8Weights::new(&codes, &sinv, n, k).is_ok());
    assert!(
        Fp8Weights::new(&codes, &sinv[..1], n, k).is_err(),
        "short scale_inv"
    );
    assert!(
        Fp8Weights::new(&codes[1..], &sinv, n, k).is_err(),
        "short weight"
    );
    let fw = Fp8Weights::new(&codes, &sinv, n, k).unwrap();
    assert!(is_shape(linear::fp8(&x[1..], 1, &fw, &mut y)));

    let nk = 144;
    let p = vec![0u8; n * nk / 2];
    let s = vec![0u8; n * nk / 16];
    assert!(Nvfp4Weights::new(&p, &s, 1.0, n, nk).is_ok());
    let err = Nvfp4Weights::new(&p, &s, 1.0, n, 136).unwrap_err();
    assert!(err.to_string().contains("multiple of the 16"), "{err}");
    assert!(
        Nvfp4Weights::new(&p, &s[1..], 1.0, n, nk).is_err(),
        "short scales"
    );
    assert!(
        Nvfp4Weights::new(&p, &s, f32::NAN, n, nk).is_err(),
        "NaN global scale"
    );

    let b = vec![0u16; n * k];
    assert!(Bf16Weights::new(&b[1..], n, k).is_err());
    let bw = Bf16Weights::new(&b, n, k).unwrap();
    assert!(is_shape(linear::bf16(&x, 1, &bw, &mut y[1..])));

    let mut row = vec![0.0f32; k];
    assert!(
        asym.dequantize_row(n, &mut row).is_err(),
        "row out of range"
    );
    assert!(
        asym.gather_rows(&[0, n as u32], &mut vec![0.0; 2 * k])
            .is_err(),
        "id out of range"
    );
    assert!(asym.gather_rows(&[0], &mut row[1..]).is_err(), "short out");
}

/// `x` = the identity on `k` rows, so row i of `y` is column i of `W` as the kernel decoded it.
fn identity(k: usize) -> Vec<f32> {
    (0..k * k)
        .map(|i| if i / k == i % k { 1.0 } else { 0.0 })
        .collect()
}

#[test]
fn every_e4m3_and_e2m1_code_decodes_exactly_on_every_path() {
    // In-register decodes (bit tricks, fp16 conversion, lookup tables) against `formats`, code by code, through
    // the GEMV (one basis row at a time) and the GEMM (the identity as x). The NaN codes are left out: kernels
    // decode them as +-480 by design (see linear_common.h), checkpoints never hold them. Comparison is `==`, exact
    // for every finite value; it equates -0 with +0, which a dot product with a basis row cannot tell apart.
    let k = 256;
    let codes: Vec<u8> = (0..=255u8)
        .map(|c| if c & 0x7F == 0x7F { 0 } else { c })
        .collect();
    let w: Vec<u8> = (0..3)
        .flat_map(|r| codes.iter().map(move |&c| c.rotate_left(r)))
        .map(|c| if c & 0x7F == 0x7F { 0 } else { c })
        .collect();
    let sinv = vec![1.0f32; 2];
    let fw = Fp8Weights::new(&w, &sinv, 3, k).unwrap();
    let want = |r: usize, i: usize| e4m3_to_f32(w[r * k + i]);
    // NVFP4: 16 rows x 256 columns, so the 256 scales (16 per row) are every e4m3 code; codes cycle all 16 values.
    let (nn, scales) = (16, codes.clone());
    let packed: Vec<u8> = (0..nn * k / 2)
        .map(|i| ((i % 16) as u8) | ((((i * 7) % 16) as u8) << 4))
        .collect();
    let nw = Nvfp4Weights::new(&packed, &scales, 1.0, nn, k).unwrap();
    let want_nv = |r: usize, i: usize| {
        let b = packed[r * k / 2 + i / 2];
        kernels::formats::e2m1_to_f32(if i.is_multiple_of(2) { b & 15 } else { b >> 4 })
            * e4m3_to_f32(scales[r * 16 + i / 16])
    };
    let eye = identity(k);
    for isa in Isa::available() {
        let mut y = poisoned(k * 3);
        linear::fp8_with(isa, 1, &eye, k, &fw, &mut y).unwrap();
        let mut y1 = poisoned(3);
        let mut ynv = poisoned(k * nn);
        linear::nvfp4_with(isa, 1, &eye, k, &nw, &mut ynv).unwrap();
        let mut ynv1 = poisoned(nn);
        for i in 0..k {
            linear::fp8_with(isa, 1, &eye[i * k..(i + 1) * k], 1, &fw, &mut y1).unwrap();
            linear::nvfp4_with(isa, 1, &eye[i * k..(i + 1) * k], 1, &nw, &mut ynv1).unwrap();
            for r in 0..3 {
                assert_eq!(
                    y1[r],
                    want(r, i),
                    "fp8 gemv {isa:?} code {:#04x}",
                    w[r * k + i]
                );
                assert_eq!(
                    y[i * 3 + r],
                    want(r, i),
                    "fp8 gemm {isa:?} code {:#04x}",
                    w[r * k + i]
                );
            }
            for r in 0..nn {
                assert_eq!(ynv1[r], want_nv(r, i), "nvfp4 gemv {isa:?} row {r} col {i}");
                assert_eq!(
                    ynv[i * nn + r],
                    want_nv(r, i),
                    "nvfp4 gemm {isa:?} row {r} col {i}"
                );
            }
        }
    }
}
