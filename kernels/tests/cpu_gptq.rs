//! GPTQ unpacking (`Weight::gptq`): random modules packed the way AutoGPTQ stores them unpack into weights whose
//! rows are `(q - z) * s` (up to the pack's bf16 scales and zeros), on ragged shapes; and every malformed module is
//! refused with a reason instead of indexing past a tensor.

use kernels::backend::{GptqTensors, Weight};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A module's tensors in the checkpoint layout, from logical codes `[n, k]`, stored zeros (v1: point - 1) and
/// scales `[groups, n]`.
struct Module {
    qweight: Vec<i32>,
    qzeros: Vec<i32>,
    scales: Vec<f32>,
    g_idx: Vec<i32>,
    /// The logical weights, `(q - (stored + 1)) * s`.
    want: Vec<f64>,
}

fn module(rng: &mut ChaCha8Rng, n: usize, k: usize, group: usize) -> Module {
    let groups = k.div_ceil(group);
    let codes: Vec<u32> = (0..n * k).map(|_| rng.gen_range(0..16)).collect();
    let stored: Vec<u32> = (0..groups * n).map(|_| rng.gen_range(0..15)).collect();
    let scales: Vec<f32> = (0..groups * n).map(|_| rng.gen_range(0.01..0.2)).collect();
    let mut qweight = vec![0i32; k.div_ceil(8) * n];
    for i in 0..k {
        for j in 0..n {
            let w = &mut qweight[(i / 8) * n + j];
            *w = (*w as u32 | (codes[j * k + i] << (4 * (i % 8)))) as i32;
        }
    }
    let zc = n.div_ceil(8);
    let mut qzeros = vec![0i32; groups * zc];
    for g in 0..groups {
        for j in 0..n {
            let w = &mut qzeros[g * zc + j / 8];
            *w = (*w as u32 | (stored[g * n + j] << (4 * (j % 8)))) as i32;
        }
    }
    let want = (0..n * k)
        .map(|e| {
            let (j, i) = (e / k, e % k);
            let g = i / group;
            (f64::from(codes[e]) - f64::from(stored[g * n + j] + 1)) * f64::from(scales[g * n + j])
        })
        .collect();
    Module {
        qweight,
        qzeros,
        scales,
        g_idx: (0..k).map(|i| (i / group) as i32).collect(),
        want,
    }
}

fn tensors(m: &Module) -> GptqTensors<'_> {
    GptqTensors {
        qweight: &m.qweight,
        qzeros: &m.qzeros,
        scales: &m.scales,
        g_idx: &m.g_idx,
    }
}

#[test]
fn unpacked_rows_are_the_modules_weights() {
    let seed: u64 = rand::thread_rng().gen();
    eprintln!("gptq: seed {seed}");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // n not a multiple of 8 (the zeros' last word half full), k not a multiple of the group or of 8.
    for (n, k, group) in [(13, 256, 128), (64, 200, 32), (8, 96, 64)] {
        let m = module(&mut rng, n, k, group);
        let w = Weight::gptq(&tensors(&m), n, k, group).unwrap();
        assert_eq!((w.n(), w.k()), (n, k));
        let mut row = vec![f32::NAN; k];
        for j in 0..n {
            w.row(j, &mut row).unwrap();
            for (i, &got) in row.iter().enumerate() {
                let want = m.want[j * k + i];
                // bf16 scales and zeros: each term within 2^-8 of itself (the code times the scale, and the zero).
                let s = f64::from(m.scales[(i / group) * n + j]);
                let bound = 2f64.powi(-8) * (16.0 * s) + 1e-6;
                let got = f64::from(got);
                assert!(
                    (got - want).abs() <= bound,
                    "n {n} k {k} group {group}: row {j} col {i}: got {got}, want {want}"
                );
            }
        }
    }
}

#[test]
fn malformed_modules_are_refused_with_a_reason() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (n, k, group) = (16, 128, 64);
    let m = module(&mut rng, n, k, group);
    let err = |t: &GptqTensors<'_>, n: usize, k: usize, group: usize| match Weight::gptq(
        t, n, k, group,
    ) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let t = tensors(&m);
    assert!(err(&t, n, k, 48).contains("group 48"));
    // One element short in any tensor is refused, naming that tensor.
    let mut short = [t; 4];
    short[0].qweight = &m.qweight[1..];
    short[1].qzeros = &m.qzeros[1..];
    short[2].scales = &m.scales[1..];
    short[3].g_idx = &m.g_idx[1..];
    for (bad, name) in short.iter().zip(["qweight", "qzeros", "scales", "g_idx"]) {
        assert!(err(bad, n, k, group).contains(name), "{name}");
    }
    // More features than the tensors hold, and sizes whose product overflows.
    assert!(err(&t, n + 8, k, group).contains("elements"));
    assert!(!err(&t, usize::MAX, 2, group).is_empty());
    // act-order: a g_idx that is not i / group.
    let mut g_idx = m.g_idx.clone();
    g_idx.swap(0, 100);
    let e = err(&GptqTensors { g_idx: &g_idx, ..t }, n, k, group);
    assert!(e.contains("act-order"), "{e}");
}
