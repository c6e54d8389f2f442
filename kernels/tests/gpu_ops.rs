//! The small GPU ops (`kernels/cuda/ops.cu`) against the CPU ops of the crate: fresh random inputs each run (the
//! seed is printed), ragged sizes (rows of 1..5121, odd vocabularies), outputs poisoned with NaN (or a sentinel
//! token) before the launch, stated bounds, and every bad size refused. Device-side bad values (ids past the
//! table, NaN logits) are flagged, not read out of bounds: tested here too.
//!
//! Where there is no CUDA device, or without the `cuda` feature, each test prints "skipped: no CUDA device". The
//! sizes keep the file to seconds under `compute-sanitizer --tool memcheck|racecheck`.

use kernels::attention::{rope_neox, Rope};
use kernels::cuda::{Gpu, GpuBuffer};
use kernels::formats::{bf16_to_f32, f32_to_bf16};
use kernels::linear::{Int4Scheme, Int4Weights};
use kernels::ops::{self, EmbeddingTable, NormWeight};
use kernels::reference;
use kernels::sampling::SamplingParams;
#[cfg(feature = "lab")]
use kernels::sampling::{self, Pcg32};
use rand::Rng;

mod gpu_common;
use gpu_common::{gpu, rng, uniform};

const BF16_NAN: u16 = 0x7fc0;
#[cfg(feature = "lab")]
const POISON_TOKEN: u32 = 0xdead_beef;

/// Row lengths for the row-wise ops: tiny, odd, the vector path's multiples of 4 and 8, the register-cached limit
/// (8192) and just past it, and the engine's 5120 / 5121.
const DIMS: [usize; 14] = [
    1, 2, 3, 4, 7, 8, 63, 257, 1000, 1028, 5120, 5121, 8192, 8196,
];

fn nan_f32(gpu: &Gpu, n: usize) -> GpuBuffer<f32> {
    gpu.upload(&vec![f32::NAN; n]).expect("upload")
}

fn nan_bf16(gpu: &Gpu, n: usize) -> GpuBuffer<u16> {
    gpu.upload(&vec![BF16_NAN; n]).expect("upload")
}

/// Bound on a bf16 output `got` of a value the CPU computed as `want` in f32, up to `f32_err` of arithmetic
/// difference before the rounding: half a bf16 ulp (2^-8 relative) plus that difference.
fn check_bf16(what: &str, got: &[u16], want: &[f32], f32_rel: f64, f32_abs: &dyn Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = bf16_to_f32(g);
        assert!(
            g.is_finite(),
            "{what}: element {i} is {g} (not written?); expected {w}"
        );
        let bound = (2f64.powi(-8) + f32_rel) * (w as f64).abs() + f32_abs(i);
        assert!(
            (g as f64 - w as f64).abs() <= bound,
            "{what}: element {i}: got {g}, CPU {w}, bound {bound:e}"
        );
    }
}

fn check_f32(what: &str, got: &[f32], want: &[f32], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {i} is {g} (not written?); expected {w}"
        );
        let bound = rel * (w as f64).abs() + abs;
        assert!(
            (g as f64 - w as f64).abs() <= bound,
            "{what}: element {i}: got {g}, CPU {w}, bound {bound:e}"
        );
    }
}

// The norm's f32 arithmetic differs from the CPU only in the order of the sum of squares (a tree against a
// sequential loop, or the CPU's AVX lanes): a few ulp of the scale, 1e-5 relative leaves a wide margin while a wrong
// element (a missed weight, a wrong row) is off by O(1).
const NORM_REL: f64 = 1e-5;

#[test]
fn rmsnorm_matches_the_cpu_in_both_forms_and_outputs() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("rmsnorm");
    for &dim in &DIMS {
        let rows = r.gen_range(1..=4);
        for form in [NormWeight::Plain, NormWeight::OnePlus] {
            let what = format!("rmsnorm dim {dim} rows {rows} {form:?}");
            let x = uniform(&mut r, rows * dim, 3.0);
            let w = uniform(&mut r, dim, 1.0);
            let eps = 1e-6;
            let mut want = vec![0.0f32; rows * dim];
            ops::rmsnorm(&x, &w, form, eps, &mut want).unwrap();
            let (xd, wd) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
            let mut o16 = nan_bf16(&gpu, rows * dim);
            gpu.rmsnorm(&xd, &wd, form, eps, &mut o16).unwrap();
            check_bf16(
                &format!("{what} bf16"),
                &gpu.download(&o16).unwrap(),
                &want,
                NORM_REL,
                &|_| 1e-30,
            );
            let mut o32 = nan_f32(&gpu, rows * dim);
            gpu.rmsnorm_f32(&xd, &wd, form, eps, &mut o32).unwrap();
            check_f32(
                &format!("{what} f32"),
                &gpu.download(&o32).unwrap(),
                &want,
                NORM_REL,
                1e-30,
            );
        }
    }
}

#[test]
fn fused_add_rmsnorm_matches_the_cpu_composition() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("add_rmsnorm");
    for &dim in &DIMS {
        let rows = r.gen_range(1..=4);
        let form = if r.gen() {
            NormWeight::Plain
        } else {
            NormWeight::OnePlus
        };
        let what = format!("add_rmsnorm dim {dim} rows {rows} {form:?}");
        let x = uniform(&mut r, rows * dim, 2.0);
        let res = uniform(&mut r, rows * dim, 2.0);
        let w = uniform(&mut r, dim, 1.0);
        // The CPU composition: residual += x (f32, exact same rounding), then the norm of the sum.
        let sum: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
        let mut want = vec![0.0f32; rows * dim];
        ops::rmsnorm(&sum, &w, form, 1e-5, &mut want).unwrap();
        let (xd, wd) = (gpu.upload(&x).unwrap(), gpu.upload(&w).unwrap());
        for out_f32 in [false, true] {
            let mut rd = gpu.upload(&res).unwrap();
            if out_f32 {
                let mut o = nan_f32(&gpu, rows * dim);
                gpu.add_rmsnorm_f32(&xd, &mut rd, &wd, form, 1e-5, &mut o)
                    .unwrap();
                check_f32(
                    &format!("{what} f32"),
                    &gpu.download(&o).unwrap(),
                    &want,
                    NORM_REL,
                    1e-30,
                );
            } else {
                let mut o = nan_bf16(&gpu, rows * dim);
                gpu.add_rmsnorm(&xd, &mut rd, &wd, form, 1e-5, &mut o)
                    .unwrap();
                check_bf16(
                    &format!("{what} bf16"),
                    &gpu.download(&o).unwrap(),
                    &want,
                    NORM_REL,
                    &|_| 1e-30,
                );
            }
            let got_res = gpu.download(&rd).unwrap();
            for (i, (&g, &s)) in got_res.iter().zip(&sum).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    s.to_bits(),
                    "{what}: residual[{i}] = {g}, expected x + residual = {s}"
                );
            }
        }
    }
}

#[test]
fn gated_activations_match_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("glu");
    for inter in [1usize, 2, 3, 4, 5, 17, 1023, 1024, 1025, 4097, 5121] {
        let rows = r.gen_range(1..=3);
        let gu = uniform(&mut r, rows * 2 * inter, 5.0);
        let gd = gpu.upload(&gu).unwrap();
        for gelu in [false, true] {
            let what = format!(
                "{} inter {inter} rows {rows}",
                if gelu { "gelu_and_mul" } else { "silu_and_mul" }
            );
            // Oracle: the f64 reference. The GPU's f32 expf/erff and the CPU's share the formula's cancellation in
            // 1 + erf(x) for x << 0 (a few ulp of 1, times |gate * up| / 2): the absolute term covers it.
            let mut want = vec![0.0f32; rows * inter];
            let mut cpu = vec![0.0f32; rows * inter];
            if gelu {
                reference::ops::gelu_and_mul(&gu, inter, &mut want).unwrap();
                ops::gelu_and_mul(&gu, inter, &mut cpu).unwrap();
            } else {
                reference::ops::silu_and_mul(&gu, inter, &mut want).unwrap();
                ops::silu_and_mul(&gu, inter, &mut cpu).unwrap();
            }
            let mut o = nan_bf16(&gpu, rows * inter);
            if gelu {
                gpu.gelu_and_mul(&gd, inter, &mut o).unwrap();
            } else {
                gpu.silu_and_mul(&gd, inter, &mut o).unwrap();
            }
            let got = gpu.download(&o).unwrap();
            let slack = |i: usize| {
                let (row, j) = (i / inter, i % inter);
                let (g, u) = (
                    gu[row * 2 * inter + j] as f64,
                    gu[row * 2 * inter + inter + j] as f64,
                );
                1e-6 * (1.0 + (g * u).abs())
            };
            check_bf16(&format!("{what} vs reference"), &got, &want, 1e-6, &slack);
            check_bf16(&format!("{what} vs CPU"), &got, &cpu, 1e-5, &slack);
        }
    }
}

/// Ids: random valid ones plus, when `bad`, the first id past the table and u32::MAX at random places.
fn ids_with_bad(
    r: &mut rand_chacha::ChaCha8Rng,
    n: usize,
    vocab: usize,
    bad: bool,
) -> (Vec<u32>, Vec<bool>) {
    let mut ids: Vec<u32> = (0..n).map(|_| r.gen_range(0..vocab as u32)).collect();
    ids[0] = (vocab - 1) as u32; // the last row
    let mut ok = vec![true; n];
    if bad && n >= 3 {
        let a = r.gen_range(1..n);
        ids[a] = vocab as u32;
        ok[a] = false;
        let b = r.gen_range(1..n);
        ids[b] = u32::MAX;
        ok[b] = false;
    }
    (ids, ok)
}

/// Rows of `got` (`[ids, dim]`): bit-equal to `want_rows` where the id is valid, all NaN where it is not.
fn check_gather(what: &str, got: &[f32], ok: &[bool], ids: &[u32], dim: usize, want_rows: &[f32]) {
    let mut w = 0;
    for (i, row) in got.chunks_exact(dim).enumerate() {
        if ok[i] {
            let want = &want_rows[w * dim..(w + 1) * dim];
            for (c, (&g, &e)) in row.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{what}: row {i} (id {}) col {c}: got {g}, CPU {e}",
                    ids[i]
                );
            }
            w += 1;
        } else {
            assert!(
                row.iter().all(|v| v.is_nan()),
                "{what}: row {i} has the bad id {} but is not all NaN",
                ids[i]
            );
        }
    }
}

#[test]
fn embedding_gather_bf16_matches_the_cpu_and_flags_bad_ids() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("embedding_gather");
    for &(vocab, dim) in &[
        (1usize, 1usize),
        (3, 7),
        (1001, 8),
        (517, 64),
        (97, 5120),
        (61, 5121),
        (10, 13),
        (7, 8200), // past the 8 x 128 vectors of one round of loads: the kernel's second round
    ] {
        let n = r.gen_range(3..=9);
        let what = format!("embedding_gather vocab {vocab} dim {dim} ids {n}");
        let table: Vec<u16> = uniform(&mut r, vocab * dim, 4.0)
            .into_iter()
            .map(f32_to_bf16)
            .collect();
        let (ids, ok) = ids_with_bad(&mut r, n, vocab, vocab > 1);
        let good: Vec<u32> = ids.iter().zip(&ok).filter(|p| *p.1).map(|p| *p.0).collect();
        let tb: Vec<half::bf16> = table.iter().map(|&b| half::bf16::from_bits(b)).collect();
        let mut want = vec![0.0f32; good.len() * dim];
        ops::embedding_gather(EmbeddingTable::Bf16(&tb), dim, &good, &mut want).unwrap();
        let (td, idd) = (gpu.upload(&table).unwrap(), gpu.upload(&ids).unwrap());
        let mut o = nan_f32(&gpu, n * dim);
        // Poison with a finite value so a bad row's NaN is the kernel's doing.
        gpu.write(&mut o, &vec![1234.5; n * dim]).unwrap();
        gpu.embedding_gather(&td, dim, &idd, &mut o).unwrap();
        check_gather(&what, &gpu.download(&o).unwrap(), &ok, &ids, dim, &want);
    }
}

#[test]
fn embedding_gather_int4_matches_the_cpu_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("embedding_gather_int4");
    for &(n, k, group, scheme) in &[
        (1usize, 32usize, 32usize, Int4Scheme::Asymmetric),
        (100, 70, 32, Int4Scheme::Asymmetric),
        (130, 257, 64, Int4Scheme::Symmetric),
        (64, 128, 128, Int4Scheme::Asymmetric),
        (333, 1000, 128, Int4Scheme::Asymmetric),
    ] {
        let m = r.gen_range(3..=8);
        let what = format!("embedding_gather_int4 n {n} k {k} group {group} {scheme:?} ids {m}");
        let w = uniform(&mut r, n * k, 1.0);
        let q = Int4Weights::quantize(&w, n, k, group, scheme).unwrap();
        let (ids, ok) = ids_with_bad(&mut r, m, n, n > 1);
        let good: Vec<u32> = ids.iter().zip(&ok).filter(|p| *p.1).map(|p| *p.0).collect();
        let mut want = vec![0.0f32; good.len() * k];
        q.gather_rows(&good, &mut want).unwrap();
        let pd = gpu.upload(q.packed()).unwrap();
        let sd = gpu.upload(q.scales_zeros()).unwrap();
        let idd = gpu.upload(&ids).unwrap();
        let mut o = gpu.upload(&vec![1234.5f32; m * k]).unwrap();
        gpu.embedding_gather_int4(&pd, &sd, n, k, group, &idd, &mut o)
            .unwrap();
        check_gather(&what, &gpu.download(&o).unwrap(), &ok, &ids, k, &want);
    }
}

/// W4A8 on scratch the caller keeps (what a recorded decode step needs): one scratch for 20 rows serves calls of
/// 1 to 20 rows in turn, each output poisoned first, and each agrees with the CPU reference (the same int8 codes,
/// so only the order of the f32 group sums differs) and bit for bit with the allocating call. Scratch too small in
/// rows or in codes, and asymmetric weights, are refused.
#[test]
fn int4_w4a8_on_reused_scratch_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("int4_w4a8_reusing");
    for &(n, k, group) in &[(70usize, 96usize, 32usize), (130, 257, 64), (64, 1000, 128)] {
        let w = uniform(&mut r, n * k, 1.0);
        let q = Int4Weights::quantize(&w, n, k, group, Int4Scheme::Symmetric).unwrap();
        let wd = gpu
            .int4_weights(q.packed(), q.scales_zeros(), n, k, group, true)
            .unwrap();
        let mut scratch = gpu.int4_a8_scratch(20, k).unwrap();
        for m in [20usize, 1, 7, 16, 17, 3] {
            let what = format!("int4_w4a8_reusing n {n} k {k} group {group} m {m}");
            let x = uniform(&mut r, m * k, 2.0);
            let want = reference::linear::w4a8_linear(&x, m, &q.to_logical());
            let xd = gpu.upload(&x).unwrap();
            let mut y = nan_f32(&gpu, m * n);
            gpu.int4_w4a8_reusing(&xd, &wd, m, &mut scratch, &mut y)
                .unwrap();
            let got = gpu.download(&y).unwrap();
            // The int32 group dots are exact; the f32 sum of k / group scaled terms differs by its order only.
            let mag = want.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            check_f32(&what, &got, &want, 1e-5, 1e-5 * mag + 1e-6);
            let mut y2 = nan_f32(&gpu, m * n);
            gpu.int4_w4a8(&xd, &wd, m, &mut y2).unwrap();
            let again = gpu.download(&y2).unwrap();
            assert!(
                got.iter()
                    .zip(&again)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the reused scratch and a fresh one disagree"
            );
        }
        let xd = gpu.upload(&vec![0.5f32; 21 * k]).unwrap();
        let mut y = nan_f32(&gpu, 21 * n);
        let err = gpu
            .int4_w4a8_reusing(&xd, &wd, 21, &mut scratch, &mut y)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("scratch"),
            "21 rows on 20 rows of scratch: {err}"
        );
        // Rows enough, codes not: 20 rows of k - 1 features.
        let mut narrow = gpu.int4_a8_scratch(20, k - 1).unwrap();
        let xd = gpu.upload(&vec![0.5f32; 20 * k]).unwrap();
        let mut y = nan_f32(&gpu, 20 * n);
        let err = gpu
            .int4_w4a8_reusing(&xd, &wd, 20, &mut narrow, &mut y)
            .unwrap_err()
            .to_string();
        assert!(err.contains("scratch"), "scratch for k - 1 features: {err}");
    }
    let w = uniform(&mut r, 64 * 64, 1.0);
    let q = Int4Weights::quantize(&w, 64, 64, 32, Int4Scheme::Asymmetric).unwrap();
    let wd = gpu
        .int4_weights(q.packed(), q.scales_zeros(), 64, 64, 32, false)
        .unwrap();
    let mut scratch = gpu.int4_a8_scratch(1, 64).unwrap();
    let xd = gpu.upload(&vec![0.5f32; 64]).unwrap();
    let mut y = nan_f32(&gpu, 64);
    assert!(gpu
        .int4_w4a8_reusing(&xd, &wd, 1, &mut scratch, &mut y)
        .is_err());
    assert!(gpu.int4_a8_scratch(usize::MAX, 2).is_err());
    assert!(gpu.int4_a8_scratch(0, 2).is_err());
}

// Drives each kernel through the lab's `_with` form.
#[cfg(feature = "lab")]
#[test]
fn argmax_matches_the_cpu_on_both_kernels() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("argmax");
    for &vocab in &[1usize, 2, 3, 7, 8, 1000, 4097, 33_331, 248_320] {
        // Three rows at the engine's vocabulary (tie, all -inf, NaN) keep the file quick under the sanitizers.
        let rows = if vocab > 100_000 {
            3
        } else {
            r.gen_range(2..=5)
        };
        let mut logits = uniform(&mut r, rows * vocab, 10.0);
        // Row 0: a planted tie at two random places (the first must win); row 1: all -inf (answers 0), when
        // there are rows for it; the last row of a wide vocabulary gets a NaN (flagged).
        if vocab > 1 {
            let (a, b) = (r.gen_range(0..vocab), r.gen_range(0..vocab));
            logits[a] = 20.0;
            logits[b] = 20.0;
        }
        for v in &mut logits[vocab..2 * vocab] {
            *v = f32::NEG_INFINITY;
        }
        let nan_row = if vocab > 2 { Some(rows - 1) } else { None };
        if let Some(nr) = nan_row {
            logits[nr * vocab + r.gen_range(0..vocab)] = f32::NAN;
        }
        let ld = gpu.upload(&logits).unwrap();
        for cluster in [true, false] {
            let what = format!("argmax vocab {vocab} rows {rows} cluster {cluster}");
            let mut o = gpu.upload(&vec![POISON_TOKEN; rows]).unwrap();
            gpu.argmax_with(cluster, &ld, vocab, &mut o).unwrap();
            let got = gpu.download(&o).unwrap();
            for (row, &g) in got.iter().enumerate() {
                if Some(row) == nan_row {
                    assert_eq!(
                        g,
                        Gpu::INVALID_TOKEN,
                        "{what}: row {row} holds a NaN, got {g}"
                    );
                    assert!(ops::argmax(&logits[row * vocab..(row + 1) * vocab]).is_err());
                } else {
                    let want = ops::argmax(&logits[row * vocab..(row + 1) * vocab]).unwrap();
                    assert_eq!(g as usize, want, "{what}: row {row}: GPU {g}, CPU {want}");
                }
            }
        }
    }
    // The automatic choice (Gpu::argmax: the cluster kernel up to ARGMAX_CLUSTER_MAX_ROWS rows, one block per row
    // beyond) on both sides of the cut.
    let vocab = 3001;
    for rows in [
        Gpu::ARGMAX_CLUSTER_MAX_ROWS,
        Gpu::ARGMAX_CLUSTER_MAX_ROWS + 1,
    ] {
        let logits = uniform(&mut r, rows * vocab, 10.0);
        let ld = gpu.upload(&logits).unwrap();
        let mut o = gpu.upload(&vec![POISON_TOKEN; rows]).unwrap();
        gpu.argmax(&ld, vocab, &mut o).unwrap();
        for (row, &g) in gpu.download(&o).unwrap().iter().enumerate() {
            let want = ops::argmax(&logits[row * vocab..(row + 1) * vocab]).unwrap();
            assert_eq!(g as usize, want, "argmax (auto) rows {rows}: row {row}");
        }
    }
}

/// Logits for the sampler: continuous, or quantised to steps of 0.25 (many exact ties, so the k-th value is tied
/// and the kernel's ordered tie pass runs).
#[cfg(feature = "lab")]
fn sample_logits(r: &mut rand_chacha::ChaCha8Rng, n: usize, ties: bool) -> Vec<f32> {
    uniform(r, n, 4.0)
        .into_iter()
        .map(|v| if ties { (v * 4.0).round() / 4.0 } else { v })
        .collect()
}

// Drives each kernel through the lab's `_with` form.
#[cfg(feature = "lab")]
#[test]
fn sampling_draws_the_cpus_tokens_for_the_same_seed() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("sample");
    let p = |temperature, top_k, top_p| SamplingParams {
        temperature,
        top_k,
        top_p,
    };
    let cases = [
        (50usize, p(1.0, 0, 1.0), false),
        (1000, p(0.7, 20, 0.9), false),
        (1000, p(1.0, 0, 1.0), true),
        (4099, p(1.3, 1000, 0.95), false),
        (4099, p(0.8, 50, 0.8), true),
        (33_331, p(0.6, 1024, 1.0), true),
        (248_320, p(0.7, 20, 0.95), false),
        (248_320, p(1.0, 64, 1.0), true),
        (1001, p(0.5, 5, 0.05), false), // keep = 1 mostly: no draw
        (1001, p(0.9, 1, 1.0), false),  // one candidate: no draw
        (1001, p(0.0, 0, 1.0), true),   // greedy
        (3, p(1.0, 2, 1.0), false),
        (1, p(1.0, 0, 1.0), false),
    ];
    for (case, &(vocab, params, ties)) in cases.iter().enumerate() {
        // Both kernels on the same logits, each with its own generators tracked by their own CPU copies. Fewer
        // rows at the engine's vocabulary keep the file quick under the sanitizers.
        let rows = if vocab > 100_000 {
            r.gen_range(1..=2)
        } else {
            r.gen_range(1..=3)
        };
        let seed: u64 = r.gen();
        let words: Vec<u32> = (0..rows as u64)
            .flat_map(|s| Gpu::pcg32_words(seed, s))
            .collect();
        // [cluster, block]
        let mut cpu_rngs: [Vec<Pcg32>; 2] =
            std::array::from_fn(|_| (0..rows as u64).map(|s| Pcg32::new(seed, s)).collect());
        let mut rngd = [gpu.upload(&words).unwrap(), gpu.upload(&words).unwrap()];
        for step in 0..6 {
            let mut logits = sample_logits(&mut r, rows * vocab, ties);
            // Step 3 poisons the last row with a NaN and step 4 with +inf (vocab > 1): flagged, and the row's
            // generator must not advance (the following steps still match the CPU, which refused the row).
            let bad_row = if vocab > 1 && (step == 3 || step == 4) {
                Some(rows - 1)
            } else {
                None
            };
            if let Some(br) = bad_row {
                logits[br * vocab + r.gen_range(0..vocab)] =
                    if step == 3 { f32::NAN } else { f32::INFINITY };
            }
            let ld = gpu.upload(&logits).unwrap();
            for (kernel, cluster) in [true, false].into_iter().enumerate() {
                let what = format!(
                    "sample case {case} vocab {vocab} {params:?} ties {ties} rows {rows} step {step} \
                     cluster {cluster}"
                );
                let mut o = gpu.upload(&vec![POISON_TOKEN; rows]).unwrap();
                gpu.sample_with(cluster, &ld, vocab, &params, &mut rngd[kernel], &mut o)
                    .unwrap();
                let got = gpu.download(&o).unwrap();
                for row in 0..rows {
                    let lr = &logits[row * vocab..(row + 1) * vocab];
                    if Some(row) == bad_row {
                        assert_eq!(
                            got[row],
                            Gpu::INVALID_TOKEN,
                            "{what}: row {row} is invalid, got {}",
                            got[row]
                        );
                        assert!(
                            sampling::sample(lr, &params, &mut cpu_rngs[kernel][row].clone())
                                .is_err()
                        );
                        continue;
                    }
                    let want = sampling::sample(lr, &params, &mut cpu_rngs[kernel][row]).unwrap();
                    if got[row] as usize != want {
                        let c = sampling::candidates(lr, &params).unwrap();
                        let pr = |t: usize| c.iter().position(|x| x.0 == t).map(|i| (i, c[i].1));
                        panic!(
                            "{what}: row {row}: GPU drew {} (rank, prob {:?}), CPU {want} ({:?}); {} \
                             candidates",
                            got[row],
                            pr(got[row] as usize),
                            pr(want),
                            c.len()
                        );
                    }
                }
            }
        }
        // The generators advanced exactly as the CPU's: the next raw draw agrees.
        for (kernel, cluster) in [true, false].into_iter().enumerate() {
            let after = gpu.download(&rngd[kernel]).unwrap();
            for (row, cpu) in cpu_rngs[kernel].iter_mut().enumerate() {
                let old = u64::from(after[4 * row]) | (u64::from(after[4 * row + 1]) << 32);
                let x = (((old >> 18) ^ old) >> 27) as u32;
                assert_eq!(
                    x.rotate_right((old >> 59) as u32),
                    cpu.next_u32(),
                    "case {case} cluster {cluster}: row {row}'s generator drifted"
                );
            }
        }
    }
    // The automatic choice (Gpu::sample: the cluster kernel up to SAMPLE_CLUSTER_MAX_ROWS rows, one block per row
    // beyond) draws the CPU's tokens on both sides of the cut.
    let params = p(0.9, 40, 0.9);
    let vocab = 3001;
    for rows in [
        Gpu::SAMPLE_CLUSTER_MAX_ROWS,
        Gpu::SAMPLE_CLUSTER_MAX_ROWS + 1,
    ] {
        let seed: u64 = r.gen();
        let logits = sample_logits(&mut r, rows * vocab, false);
        let words: Vec<u32> = (0..rows as u64)
            .flat_map(|s| Gpu::pcg32_words(seed, s))
            .collect();
        let (ld, mut rngd) = (gpu.upload(&logits).unwrap(), gpu.upload(&words).unwrap());
        let mut o = gpu.upload(&vec![POISON_TOKEN; rows]).unwrap();
        gpu.sample(&ld, vocab, &params, &mut rngd, &mut o).unwrap();
        let got = gpu.download(&o).unwrap();
        for (row, &g) in got.iter().enumerate() {
            let mut cpu = Pcg32::new(seed, row as u64);
            let want = sampling::sample(&logits[row * vocab..(row + 1) * vocab], &params, &mut cpu)
                .unwrap();
            assert_eq!(g as usize, want, "sample (auto) rows {rows}: row {row}");
        }
    }
}

#[test]
fn rope_neox_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut r = rng("rope_neox");
    for &(head_dim, factor, theta) in &[
        (64usize, 1.0f64, 1e4f64),
        (256, 0.25, 1e7),
        (80, 0.5, 5e6),
        (10, 0.4, 1e4),
        (128, 1.0, 1e6),
        (2048, 0.5, 1e4),
    ] {
        let rope = Rope::new(head_dim, factor, theta).unwrap();
        let heads = r.gen_range(1..=5);
        let t = r.gen_range(1..=7);
        let what = format!(
            "rope_neox head_dim {head_dim} rot {} heads {heads} tokens {t}",
            rope.rotary_dim
        );
        let positions: Vec<u32> = (0..t).map(|_| r.gen_range(0..200_000)).collect();
        let x = uniform(&mut r, t * heads * head_dim, 2.0);
        let mut want = x.clone();
        rope_neox(&rope, heads, &positions, &mut want).unwrap();
        let mut xd = gpu.upload(&x).unwrap();
        let pd = gpu.upload(&positions).unwrap();
        gpu.rope_neox(&rope, heads, &pd, &mut xd).unwrap();
        let got = gpu.download(&xd).unwrap();
        let half = rope.rotary_dim / 2;
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let d = i % head_dim;
            if d >= rope.rotary_dim {
                assert_eq!(
                    g.to_bits(),
                    x[i].to_bits(),
                    "{what}: pass-through element {i} (dim {d}) changed"
                );
                continue;
            }
            // Same f32 angles and f64 cos/sin rounded to f32 (to an ulp); the CPU's compiler may contract the
            // rotation into an FMA: a few ulp of the pair's magnitude.
            let partner = if d < half { i + half } else { i - half };
            let bound = 5e-7 * (x[i].abs() + x[partner].abs()) as f64;
            assert!(g.is_finite(), "{what}: element {i} is {g}");
            assert!(
                (g - w).abs() as f64 <= bound,
                "{what}: element {i} (dim {d}): got {g}, CPU {w}, bound {bound:e}"
            );
        }
    }
}

#[test]
fn bad_sizes_are_refused_before_any_launch() {
    let Some(gpu) = gpu() else { return };
    let f = |n| gpu.zeros::<f32>(n).unwrap();
    let h = |n| gpu.zeros::<u16>(n).unwrap();
    let u = |n| gpu.zeros::<u32>(n).unwrap();
    let msg = |e: Result<(), kernels::KernelError>| e.unwrap_err().to_string();
    // Norms: x not whole rows, out of the wrong length, empty weight, bad eps, residual of the wrong length.
    assert!(
        msg(gpu.rmsnorm(&f(10), &f(3), NormWeight::Plain, 1e-6, &mut h(10)))
            .contains("whole number")
    );
    assert!(msg(gpu.rmsnorm(&f(9), &f(3), NormWeight::Plain, 1e-6, &mut h(8))).contains("out has"));
    assert!(
        msg(gpu.rmsnorm_f32(&f(9), &f(0), NormWeight::Plain, 1e-6, &mut f(9))).contains("empty")
    );
    assert!(
        msg(gpu.rmsnorm_f32(&f(9), &f(3), NormWeight::OnePlus, f32::NAN, &mut f(9)))
            .contains("eps")
    );
    assert!(
        msg(gpu.add_rmsnorm(&f(9), &mut f(6), &f(3), NormWeight::Plain, 1e-6, &mut h(9)))
            .contains("residual")
    );
    // Gated activations.
    assert!(msg(gpu.silu_and_mul(&f(10), 3, &mut h(3))).contains("whole number"));
    assert!(msg(gpu.gelu_and_mul(&f(12), 3, &mut h(3))).contains("out has"));
    assert!(msg(gpu.silu_and_mul(&f(12), 0, &mut h(0))).contains("positive"));
    // Gathers.
    assert!(msg(gpu.embedding_gather(&h(10), 3, &u(2), &mut f(6))).contains("whole number"));
    assert!(msg(gpu.embedding_gather(&h(9), 3, &u(2), &mut f(5))).contains("out has"));
    assert!(msg(gpu.embedding_gather(&h(9), 0, &u(2), &mut f(6))).contains("dim"));
    let (pk, sz) = (gpu.zeros::<u8>(2 * 70 * 32).unwrap(), h(3 * 128 * 2));
    assert!(
        msg(gpu.embedding_gather_int4(&pk, &sz, 100, 70, 48, &u(2), &mut f(140))).contains("group")
    );
    assert!(
        msg(gpu.embedding_gather_int4(&pk, &sz, 100, 71, 32, &u(2), &mut f(142)))
            .contains("packed")
    );
    assert!(
        msg(gpu.embedding_gather_int4(&pk, &sz, 100, 70, 32, &u(2), &mut f(139)))
            .contains("out has")
    );
    assert!(gpu
        .embedding_gather_int4(&pk, &sz, 100, 70, 32, &u(2), &mut f(140))
        .is_ok());
    // Argmax and sampling.
    assert!(msg(gpu.argmax(&f(10), 3, &mut u(3))).contains("logits"));
    assert!(msg(gpu.argmax(&f(0), 3, &mut u(0))).contains("rows"));
    assert!(msg(gpu.argmax(&f(10), 0, &mut u(1))).contains("vocab"));
    assert!(msg(gpu.argmax(&f(65536), 1, &mut u(65536))).contains("rows"));
    let p = SamplingParams {
        temperature: 0.7,
        top_k: 0,
        top_p: 0.9,
    };
    let mut rng_words = u(4);
    assert!(
        msg(gpu.sample(&f(2000), 2000, &p, &mut rng_words, &mut u(1))).contains("at most 1024")
    );
    let p = SamplingParams {
        temperature: 0.7,
        top_k: 10,
        top_p: 0.0,
    };
    assert!(msg(gpu.sample(&f(2000), 2000, &p, &mut rng_words, &mut u(1))).contains("top_p"));
    let p = SamplingParams {
        temperature: -1.0,
        top_k: 10,
        top_p: 0.5,
    };
    assert!(msg(gpu.sample(&f(2000), 2000, &p, &mut rng_words, &mut u(1))).contains("temperature"));
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 10,
        top_p: 0.5,
    };
    assert!(msg(gpu.sample(&f(2000), 2000, &p, &mut u(3), &mut u(1))).contains("rng"));
    // The cluster kernel's grid.y holds at most 65535 rows; one block per row takes more.
    #[cfg(feature = "lab")]
    {
        let mut many = u(4 * 65536);
        assert!(
            msg(gpu.sample_with(true, &f(65536), 1, &p, &mut many, &mut u(65536))).contains("rows")
        );
    }
    // RoPE.
    let rope = Rope::new(64, 0.5, 1e4).unwrap();
    assert!(msg(gpu.rope_neox(&rope, 2, &u(3), &mut f(3 * 2 * 64 - 1))).contains("x has"));
    let bad = Rope {
        head_dim: 64,
        rotary_dim: 63,
        theta: 1e4,
    };
    assert!(msg(gpu.rope_neox(&bad, 2, &u(3), &mut f(3 * 2 * 64))).contains("rotary_dim"));
    let wide = Rope {
        head_dim: 4096,
        rotary_dim: 2048,
        theta: 1e4,
    };
    assert!(msg(gpu.rope_neox(&wide, 1, &u(1), &mut f(4096))).contains("at most 1024"));
    gpu.synchronize().unwrap();
}
