//! The row-major GEMVs (one activation row) on every path, over a sweep of `k` that walks every branch of the
//! AVX-512 inner loops: NVFP4 reads 128-element chunks in pairs, then a single chunk, then a masked last chunk,
//! then 16-element tail groups; FP8 reads 64-element steps inside 128-element scale blocks, then 16-element
//! (masked) steps. Raw random codes (every e4m3 and e2m1 code, subnormals included) rather than quantised weights,
//! so the sums mix magnitudes the way real checkpoints rarely do.

use kernels::cpu::Isa;
use kernels::formats::{e2m1_to_f32, e4m3_to_f32};
use kernels::linear::{self, Activations, Ext, Fp8Weights, Nvfp4Weights, Ran};
use kernels::reference::linear as reference;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Relative to the sum of |x w| terms, as in `cpu_linear.rs`: f32 accumulation over at most a few thousand terms.
const F32_REL: f64 = 1e-5;

fn check(what: &str, got: &[f32], want: &[f32], mag: &[f64]) {
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(
            g.is_finite() && err <= F32_REL * s + 1e-30,
            "{what}: row {i}: got {g}, want {w}, error {err:e} > {F32_REL:e} * {s:e}"
        );
    }
}

fn activations(r: &mut ChaCha8Rng, k: usize) -> Vec<f32> {
    (0..k).map(|_| r.gen_range(-2.0f32..2.0)).collect()
}

/// Within 1e-4 of `want` (relative above 1): for the f32 kernel on inputs the integer form cannot hold, where
/// only the path is in question.
fn check_loose(what: &str, got: &[f32], want: &[f32]) {
    for (i, (&g, &e)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - e).abs() <= 1e-4 * e.abs().max(1.0),
            "{what}: output {i}: {g} vs {e}"
        );
    }
}

/// `x` with every 7th element (from the 4th on) 1000 times larger: groups with outliers.
fn with_outliers(x: &[f32]) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| if i % 7 == 3 { v * 1000.0 } else { v })
        .collect()
}

/// The max |x| of every `group` consecutive elements (the last group may be short).
fn group_max(x: &[f32], group: usize) -> Vec<f64> {
    x.chunks(group)
        .map(|g| g.iter().fold(0f64, |a, &v| a.max(f64::from(v.abs()))))
        .collect()
}

/// False (the test is skipped, with a note) where this CPU has no AVX-512; otherwise notes whether it has
/// AVX512-VBMI, which decides whether the VBMI kernels run.
fn has_avx512_or_skip() -> bool {
    if !Isa::available().contains(&Isa::Avx512) {
        eprintln!("skipped: no AVX-512 on this CPU");
        return false;
    }
    eprintln!(
        "avx512vbmi on this CPU: {}",
        kernels::cpu::has_avx512_vbmi()
    );
    true
}

/// One activation row through a GEMV that has an integer (VBMI) kernel, `run(ext, y)` on [`Isa::Avx512`], with
/// [`Ext::Base`] and then [`Ext::Auto`]: each call must report AVX-512, and the integer kernel exactly for Auto on
/// a CPU with VBMI (proving it ran); every output must be within `F32_REL * mag + rep_weight(vbmi) * rep` of
/// `want`, where `mag` is the sum of the |x w| terms and `rep` the integer form's bound for the representation of
/// x, weighted by what the kernel that ran (`vbmi`) needs.
fn check_base_and_auto(
    what: &str,
    want: &[f32],
    mag: &[f64],
    rep: &[f64],
    rep_weight: impl Fn(bool) -> f64,
    run: impl Fn(Ext, &mut [f32]) -> Ran,
) {
    let vbmi = kernels::cpu::has_avx512_vbmi();
    for ext in [Ext::Base, Ext::Auto] {
        let mut y = vec![f32::NAN; want.len()];
        let ran = run(ext, &mut y);
        assert_eq!(ran.isa, Isa::Avx512, "{what} {ext:?}");
        assert_eq!(
            ran.vbmi,
            ext == Ext::Auto && vbmi,
            "{what} {ext:?}: the integer kernel runs exactly for Auto on a VBMI CPU"
        );
        for (i, &g) in y.iter().enumerate() {
            let err = (f64::from(g) - f64::from(want[i])).abs();
            let bound = F32_REL * mag[i] + rep_weight(ran.vbmi) * rep[i] + 1e-30;
            assert!(
                g.is_finite() && err <= bound,
                "{what} {ext:?} (vbmi={}): output {i}: got {g}, want {}, error {err:e} > {bound:e} \
                 (|terms| {:e}, x representation {:e})",
                ran.vbmi,
                want[i],
                mag[i],
                rep[i]
            );
        }
    }
}

/// A random e4m3 code that is not NaN (0x7F / 0xFF).
fn e4m3_code(r: &mut ChaCha8Rng) -> u8 {
    let c: u8 = r.gen();
    if c & 0x7F == 0x7F {
        c & 0xF0
    } else {
        c
    }
}

#[test]
fn nvfp4_gemv_over_every_chunk_count_and_tail() {
    // k = 16 .. 1040: 0 to 8 full chunks (odd and even), with and without tail groups.
    let n: usize = 70;
    for k in (16usize..=1040).step_by(16) {
        let mut r = ChaCha8Rng::seed_from_u64(k as u64);
        let packed: Vec<u8> = (0..n * k / 2).map(|_| r.gen()).collect();
        // Scales of moderate size (no subnormal group scale here; every code is covered in cpu_linear.rs).
        let scales: Vec<u8> = (0..n * k / 16)
            .map(|_| 0x30 | r.gen_range(0u8..16))
            .collect();
        let global = 0.37f32;
        let x = activations(&mut r, k);
        let want = reference::nvfp4_linear(&x, 1, &packed, &scales, global, n, k);
        let mag: Vec<f64> = (0..n)
            .map(|row| {
                (0..k)
                    .map(|c| {
                        let b = packed[row * k / 2 + c / 2];
                        let code = if c % 2 == 0 { b & 15 } else { b >> 4 };
                        f64::from(x[c].abs())
                            * f64::from(e2m1_to_f32(code).abs())
                            * f64::from(e4m3_to_f32(scales[row * k / 16 + c / 16]))
                            * f64::from(global)
                    })
                    .sum()
            })
            .collect();
        let w = Nvfp4Weights::new(&packed, &scales, global, n, k).unwrap();
        for isa in Isa::available() {
            for threads in [1, 2] {
                let mut y = vec![f32::NAN; n];
                assert_eq!(
                    linear::nvfp4_with(isa, threads, &x, 1, &w, &mut y).unwrap(),
                    isa
                );
                check(&format!("nvfp4 {isa:?} t{threads} k{k}"), &y, &want, &mag);
            }
        }
    }
}

#[test]
fn fp8_gemv_over_every_block_shape_with_subnormal_codes() {
    // k = 1 .. 400: partial 64-element steps, partial 16-element steps and partial scale blocks; a quarter of the
    // codes are subnormal (exponent field 0).
    let n: usize = 67;
    for k in 1usize..=400 {
        let mut r = ChaCha8Rng::seed_from_u64(1000 + k as u64);
        let codes: Vec<u8> = (0..n * k)
            .map(|_| {
                let c = e4m3_code(&mut r);
                if r.gen_bool(0.25) {
                    c & 0x87
                } else {
                    c
                }
            })
            .collect();
        let kb = k.div_ceil(128);
        let sinv: Vec<f32> = (0..n.div_ceil(128) * kb)
            .map(|_| r.gen_range(1e-3f32..1e-1))
            .collect();
        let x = activations(&mut r, k);
        let want = reference::fp8_block_linear(&x, 1, &codes, &sinv, n, k);
        let mag: Vec<f64> = (0..n)
            .map(|row| {
                (0..k)
                    .map(|c| {
                        f64::from(x[c].abs())
                            * f64::from(e4m3_to_f32(codes[row * k + c]).abs())
                            * f64::from(sinv[(row / 128) * kb + c / 128])
                    })
                    .sum()
            })
            .collect();
        let w = Fp8Weights::new(&codes, &sinv, n, k).unwrap();
        for isa in Isa::available() {
            let mut y = vec![f32::NAN; n];
            assert_eq!(linear::fp8_with(isa, 2, &x, 1, &w, &mut y).unwrap(), isa);
            check(&format!("fp8 {isa:?} k{k}"), &y, &want, &mag);
        }
    }
}

/// W4A8 on AVX-512 with and without the VBMI variant (vpermt2b operands, four blocks side by side), over block
/// counts that leave every remainder of the four-block loop (1..=9 blocks, the last one ragged) and k that ends a
/// group early and a quad short (k % 4 = 1, 2, 3). The two kernels add the same integers in the same order, so
/// they must agree bit for bit; both must match the reference. On a CPU with VBMI the Auto call must report the
/// VBMI kernel, proving the fast path ran.
#[test]
fn w4a8_vbmi_variant_matches_the_base_kernel_bit_for_bit() {
    use kernels::linear::{Int4Scheme, Int4Weights};
    if !has_avx512_or_skip() {
        return;
    }
    for (case, &(n, k, group)) in [
        (40usize, 256usize, 32usize),
        (130, 333, 64),
        (250, 129, 128),
        (300, 130, 32),
        (513, 131, 64),
        (576, 520, 128),
    ]
    .iter()
    .enumerate()
    {
        let mut r = ChaCha8Rng::seed_from_u64(0x5eed_0000 + case as u64);
        let w: Vec<f32> = (0..n * k).map(|_| r.gen_range(-1.0f32..1.0)).collect();
        let packed = Int4Weights::quantize(&w, n, k, group, Int4Scheme::Symmetric).unwrap();
        let logical = packed.to_logical();
        for m in [1usize, 3] {
            let x: Vec<f32> = (0..m * k).map(|_| r.gen_range(-2.0f32..2.0)).collect();
            let want = reference::w4a8_linear(&x, m, &logical);
            let mag: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (row, col) = (i / n, i % n);
                    (0..k)
                        .map(|c| {
                            f64::from(x[row * k + c].abs())
                                * 8.0
                                * f64::from(logical.scales[(c / group) * n + col])
                        })
                        .sum()
                })
                .collect();
            for threads in [1usize, 2] {
                let what = format!("w4a8 n{n} k{k} g{group} m{m} t{threads}");
                let mut base = vec![f32::NAN; m * n];
                let ran =
                    linear::w4a8_ext(Isa::Avx512, Ext::Base, threads, &x, m, &packed, &mut base)
                        .unwrap();
                assert_eq!(
                    (ran.isa, ran.vbmi),
                    (Isa::Avx512, false),
                    "{what}: base path"
                );
                check(&format!("{what} base"), &base, &want, &mag);
                let mut auto = vec![f32::NAN; m * n];
                let ran =
                    linear::w4a8_ext(Isa::Avx512, Ext::Auto, threads, &x, m, &packed, &mut auto)
                        .unwrap();
                assert_eq!(ran.isa, Isa::Avx512, "{what}");
                assert_eq!(
                    ran.vbmi,
                    kernels::cpu::has_avx512_vbmi(),
                    "{what}: the VBMI kernel runs exactly where the CPU has VBMI"
                );
                for (i, (a, b)) in auto.iter().zip(&base).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{what}: output {i}: vbmi={} gives {a}, base gives {b}",
                        ran.vbmi
                    );
                }
            }
        }
    }
}

/// The NVFP4 GEMV on integer dot products (AVX512-VBMI: `vpermb` decode, x as three int8 limbs per 16-element
/// group, `vpdpbusd`). On a CPU with VBMI the Auto call must report it (proving it ran) for one row with k >= 128
/// and finite activations, and [`Ext::Base`] must report the f32 kernel; both must match the reference. The
/// integer form holds each x to 2^-23 of its group's max |x|, so its bound adds that representation error
/// (`sum 2^-23 max_g |x| * |w s global|`) to the f32 one: it matters only for groups with outliers, which one
/// activation set here has (every 7th element 1000 x larger). Activations come as f32 and as bf16 bits. Inputs
/// the integer form cannot hold (NaN, a group below ~1e-31), `k < 128` and `m > 1` must take the f32 kernel.
#[test]
fn nvfp4_vbmi_integer_gemv_matches_the_reference() {
    use kernels::formats::{bf16_to_f32, f32_to_bf16};
    if !has_avx512_or_skip() {
        return;
    }
    for (case, &(n, k)) in [(70usize, 128usize), (33, 272), (101, 1040), (67, 5120)]
        .iter()
        .enumerate()
    {
        let mut r = ChaCha8Rng::seed_from_u64(0xf4_0000 + case as u64);
        let packed: Vec<u8> = (0..n * k / 2).map(|_| r.gen()).collect();
        let scales: Vec<u8> = (0..n * k / 16).map(|_| e4m3_code(&mut r)).collect();
        let global = 0.61f32;
        let w = Nvfp4Weights::new(&packed, &scales, global, n, k).unwrap();
        let plain = activations(&mut r, k);
        let outliers = with_outliers(&plain);
        // one all-zero group and one group of magnitudes around 1e-20 (both representable)
        let mut mixed = plain.clone();
        mixed[16..32].iter_mut().for_each(|v| *v = 0.0);
        if k >= 64 {
            mixed[48..64].iter_mut().for_each(|v| *v *= 1e-20);
        }
        let bf16: Vec<u16> = plain.iter().map(|&v| f32_to_bf16(v * 3.0)).collect();
        let bf16_f32: Vec<f32> = bf16.iter().map(|&b| bf16_to_f32(b)).collect();
        for (name, xf, xb) in [
            ("uniform", &plain, None),
            ("outliers", &outliers, None),
            ("zero and tiny groups", &mixed, None),
            ("bf16", &bf16_f32, Some(&bf16)),
        ] {
            let want = reference::nvfp4_linear(xf, 1, &packed, &scales, global, n, k);
            // |terms| and the integer form's representation error bound, per row
            let gmax = group_max(xf, 16);
            let (mag, rep): (Vec<f64>, Vec<f64>) = (0..n)
                .map(|row| {
                    (0..k).fold((0.0, 0.0), |(m, e), c| {
                        let b = packed[row * k / 2 + c / 2];
                        let code = if c % 2 == 0 { b & 15 } else { b >> 4 };
                        let ws = f64::from(e2m1_to_f32(code).abs())
                            * f64::from(e4m3_to_f32(scales[row * k / 16 + c / 16]).abs())
                            * f64::from(global);
                        (
                            m + f64::from(xf[c].abs()) * ws,
                            e + gmax[c / 16] * 2f64.powi(-23) * ws,
                        )
                    })
                })
                .unzip();
            let x = xb.map_or(Activations::from(xf), Activations::from);
            for threads in [1usize, 2] {
                // Twice the representation bound, for either kernel.
                check_base_and_auto(
                    &format!("nvfp4 {name} n{n} k{k} t{threads}"),
                    &want,
                    &mag,
                    &rep,
                    |_| 2.0,
                    |ext, y| linear::nvfp4_ext(Isa::Avx512, ext, threads, x, 1, &w, y).unwrap(),
                );
            }
        }
    }
    // Inputs that must take the f32 kernel even on Auto.
    let (n, k) = (37usize, 256usize);
    let mut r = ChaCha8Rng::seed_from_u64(0xf4_ffff);
    let packed: Vec<u8> = (0..n * k / 2).map(|_| r.gen()).collect();
    let scales: Vec<u8> = (0..n * k / 16).map(|_| 0x38).collect();
    let w = Nvfp4Weights::new(&packed, &scales, 1.0, n, k).unwrap();
    let mut nan = activations(&mut r, k);
    nan[200] = f32::NAN;
    let mut y = vec![0f32; n];
    let ran = linear::nvfp4_ext(Isa::Avx512, Ext::Auto, 2, &nan, 1, &w, &mut y).unwrap();
    assert!(!ran.vbmi, "NaN activations must take the f32 kernel");
    assert!(
        y.iter().all(|v| v.is_nan()),
        "a NaN activation reaches every row"
    );
    let mut tiny = activations(&mut r, k);
    tiny[128..144].iter_mut().for_each(|v| *v *= 1e-33);
    let want = reference::nvfp4_linear(&tiny, 1, &packed, &scales, 1.0, n, k);
    let ran = linear::nvfp4_ext(Isa::Avx512, Ext::Auto, 2, &tiny, 1, &w, &mut y).unwrap();
    assert!(!ran.vbmi, "a group below ~1e-31 must take the f32 kernel");
    check_loose("tiny group", &y, &want);
    let short = Nvfp4Weights::new(&packed[..n * 56], &scales[..n * 7], 1.0, n, 112).unwrap();
    let ran =
        linear::nvfp4_ext(Isa::Avx512, Ext::Auto, 1, &tiny[..112], 1, &short, &mut y).unwrap();
    assert!(!ran.vbmi, "k < 128 takes the f32 kernel");
    let mut y3 = vec![0f32; 3 * n];
    let x3: Vec<f32> = (0..3 * k).map(|_| r.gen_range(-1.0f32..1.0)).collect();
    let ran = linear::nvfp4_ext(Isa::Avx512, Ext::Auto, 1, &x3, 3, &w, &mut y3).unwrap();
    assert!(!ran.vbmi, "m > 1 takes the tiled f32 kernel");
}

/// The W4A16 GEMV on integer dot products (AVX-512 + VBMI: int16 activations per group, `vpermb` + `vpdpwssd`)
/// against the f64 reference, next to the f32 kernel (`Ext::Base`) on the same inputs. Shapes walk the kernel's
/// branches: four blocks side by side and the single-block rest (n = 67, 130, 301, 64), ragged last blocks, odd
/// `k` (a last pair of k-rows with one row) and short tail groups, groups 32 / 64 / 128, asymmetric (nonzero zero
/// points) and symmetric weights, 1, 2 and 5 threads. Bound: the f32 one (`F32_REL` of the |x w| terms) plus the
/// representation of x, `sum_c max_g |x| / 32767 * |w_c|` (each x is held to half of its group's power-of-two
/// scale, at most max_g |x| / 32767). bf16 activations whose groups span less than 2^6 are held exactly, so there
/// the f32 bound alone must hold. Inputs the integer form cannot hold (NaN, infinity, a group below ~3.9e-34) and
/// `m > 1` must take the f32 kernels.
#[test]
fn w4a16_vbmi_integer_gemv_matches_the_reference() {
    use kernels::formats::{bf16_to_f32, f32_to_bf16};
    use kernels::linear::{Int4Scheme, Int4Weights};
    if !has_avx512_or_skip() {
        return;
    }
    let cases = [
        (67usize, 333usize, 32usize),
        (130, 320, 64),
        (301, 1001, 128),
        (64, 2, 32),
        (257, 5120, 128),
    ];
    for (case, &(n, k, group)) in cases.iter().enumerate() {
        let mut r = ChaCha8Rng::seed_from_u64(0x4a16_0000 + case as u64);
        let wf: Vec<f32> = (0..n * k).map(|_| r.gen_range(-0.3f32..0.3)).collect();
        let plain = activations(&mut r, k);
        let outliers = with_outliers(&plain);
        // an all-zero group and a group of magnitudes around 1e-20 (both representable)
        let mut mixed = plain.clone();
        mixed[..group.min(k)].iter_mut().for_each(|v| *v = 0.0);
        if k >= 2 * group {
            mixed[group..2 * group].iter_mut().for_each(|v| *v *= 1e-20);
        }
        // bf16 of magnitudes in [2^-5, 2) and zeros: every group spans less than 2^6, so held exactly
        let narrow: Vec<u16> = (0..k)
            .map(|_| {
                let v = if r.gen_bool(0.1) {
                    0.0
                } else {
                    r.gen_range(0.03125f32..2.0) * if r.gen() { 1.0 } else { -1.0 }
                };
                f32_to_bf16(v)
            })
            .collect();
        let wide: Vec<u16> = outliers.iter().map(|&v| f32_to_bf16(v)).collect();
        let narrow_f: Vec<f32> = narrow.iter().map(|&b| bf16_to_f32(b)).collect();
        let wide_f: Vec<f32> = wide.iter().map(|&b| bf16_to_f32(b)).collect();
        for scheme in [Int4Scheme::Asymmetric, Int4Scheme::Symmetric] {
            let w = Int4Weights::quantize(&wf, n, k, group, scheme).unwrap();
            let l = w.to_logical();
            for (name, xf, xb, exact) in [
                ("uniform", &plain, None, false),
                ("outliers", &outliers, None, false),
                ("zero and tiny groups", &mixed, None, false),
                ("bf16 narrow", &narrow_f, Some(&narrow), true),
                ("bf16 outliers", &wide_f, Some(&wide), false),
            ] {
                let want = reference::int4_linear(xf, 1, &l);
                let gmax = group_max(xf, group);
                let (mag, rep): (Vec<f64>, Vec<f64>) = (0..n)
                    .map(|row| {
                        (0..k).fold((0.0, 0.0), |(m, e), c| {
                            let wa = l.at(row, c).abs();
                            (
                                m + f64::from(xf[c].abs()) * wa,
                                e + gmax[c / group] / 32767.0 * wa,
                            )
                        })
                    })
                    .unzip();
                let x = xb.map_or(Activations::from(xf), Activations::from);
                for threads in [1usize, 2, 5] {
                    // The representation bound only where the integer kernel ran on x it cannot hold exactly.
                    check_base_and_auto(
                        &format!("w4a16 {name} n{n} k{k} g{group} {scheme:?} t{threads}"),
                        &want,
                        &mag,
                        &rep,
                        |vbmi| if vbmi && !exact { 1.0 } else { 0.0 },
                        |ext, y| linear::w4a16_ext(Isa::Avx512, ext, threads, x, 1, &w, y).unwrap(),
                    );
                }
            }
        }
    }
    // Inputs that must take the f32 kernel even on Auto.
    let (n, k, group) = (70usize, 384usize, 128usize);
    let mut r = ChaCha8Rng::seed_from_u64(0x4a16_ffff);
    let wf: Vec<f32> = (0..n * k).map(|_| r.gen_range(-0.3f32..0.3)).collect();
    let w = Int4Weights::quantize(&wf, n, k, group, Int4Scheme::Asymmetric).unwrap();
    let l = w.to_logical();
    let mut y = vec![0f32; n];
    for (bad, v) in [("NaN", f32::NAN), ("infinity", f32::INFINITY)] {
        let mut x = activations(&mut r, k);
        x[200] = v;
        let ran = linear::w4a16_ext(Isa::Avx512, Ext::Auto, 2, &x, 1, &w, &mut y).unwrap();
        assert!(!ran.vbmi, "{bad} activations must take the f32 kernel");
        assert!(
            y.iter().all(|v| !v.is_finite()),
            "a {bad} activation reaches every column"
        );
    }
    let mut tiny = activations(&mut r, k);
    tiny[128..256].iter_mut().for_each(|v| *v *= 1e-35);
    let want = reference::int4_linear(&tiny, 1, &l);
    let ran = linear::w4a16_ext(Isa::Avx512, Ext::Auto, 2, &tiny, 1, &w, &mut y).unwrap();
    assert!(!ran.vbmi, "a group below ~3.9e-34 must take the f32 kernel");
    check_loose("tiny group", &y, &want);
    let mut y3 = vec![0f32; 3 * n];
    let x3: Vec<f32> = (0..3 * k).map(|_| r.gen_range(-1.0f32..1.0)).collect();
    let ran = linear::w4a16_ext(Isa::Avx512, Ext::Auto, 1, &x3, 3, &w, &mut y3).unwrap();
    assert_eq!(
        ran.vbmi,
        kernels::cpu::has_avx512_vbmi(),
        "m > 1 takes the integer GEMM where the CPU has VBMI (cpu_linear_gemm.rs checks its results)"
    );
}
