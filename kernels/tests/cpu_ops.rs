//! The C small ops against the f64 references on every ISA path (ragged widths, poisoned outputs, both RMSNorm
//! forms), the Rust gather and argmax, and their error cases.

use kernels::backend;
use kernels::cpu::Isa;
use kernels::ops::{
    self, argmax, embedding_gather, seq_isa_calls, EmbeddingTable, GatedAct, NormWeight,
};
use kernels::reference;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn uniform(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

/// Scaled error |got - want| / (1 + |want|). Measured worst on this machine (fixed seeds, every path): 2.3e-6
/// (GELU through libm's erff on the scalar path, products up to ~900), RMSNorm below 1e-6, the AVX-512 erfc fit
/// 3.3e-7; the bound leaves ~4x over the worst and is still 100x under a wrong formula (tanh GELU is off by 1e-3).
const TOL: f32 = 1e-5;

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        assert!(
            err <= TOL,
            "{what}: element {i} is {g} expected {w} (scaled error {err:e})"
        );
    }
}

#[test]
fn rmsnorm_matches_reference_in_both_forms() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for isa in Isa::available() {
        for &(rows, dim) in &[(1usize, 5120usize), (37, 2048), (3, 33), (40, 1)] {
            let x = uniform(&mut rng, rows * dim, -4.0, 4.0);
            let w = uniform(&mut rng, dim, -0.5, 1.5);
            for form in [NormWeight::Plain, NormWeight::OnePlus] {
                let mut got = vec![f32::NAN; rows * dim];
                let mut want = vec![0.0; rows * dim];
                let before = seq_isa_calls(isa);
                ops::rmsnorm_with(isa, 2, &x, &w, form, 1e-6, &mut got).unwrap();
                assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
                reference::ops::rmsnorm(&x, &w, form, 1e-6, &mut want).unwrap();
                assert_close(
                    &format!("{isa:?} rmsnorm {form:?} {rows}x{dim}"),
                    &got,
                    &want,
                );
            }
        }
    }
}

#[test]
fn gated_activations_match_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for isa in Isa::available() {
        for &(rows, inter) in &[(1usize, 6656usize), (20, 100), (3, 7)] {
            // Wide range: the tails of exp and erf matter (gelu(-9) ~ -1e-18, silu(-30) ~ -3e-12).
            let gu = uniform(&mut rng, rows * 2 * inter, -30.0, 30.0);
            for gelu in [false, true] {
                let mut got = vec![f32::NAN; rows * inter];
                let mut want = vec![0.0; rows * inter];
                let before = seq_isa_calls(isa);
                if gelu {
                    ops::gelu_and_mul_with(isa, 2, &gu, inter, &mut got).unwrap();
                    reference::ops::gelu_and_mul(&gu, inter, &mut want).unwrap();
                } else {
                    ops::silu_and_mul_with(isa, 2, &gu, inter, &mut got).unwrap();
                    reference::ops::silu_and_mul(&gu, inter, &mut want).unwrap();
                }
                assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
                assert_close(&format!("{isa:?} gelu={gelu} {rows}x{inter}"), &got, &want);
            }
        }
    }
}

#[test]
fn gather_reads_the_named_rows() {
    let dim = 6;
    let f: Vec<f32> = (0..5 * dim).map(|i| i as f32 * 0.5).collect();
    let b: Vec<half::bf16> = f.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let ids = [4u32, 0, 4, 2];
    for table in [EmbeddingTable::F32(&f), EmbeddingTable::Bf16(&b)] {
        let mut out = vec![f32::NAN; ids.len() * dim];
        embedding_gather(table, dim, &ids, &mut out).unwrap();
        for (r, &id) in ids.iter().enumerate() {
            // Values are multiples of 0.5 below 15: exact in bf16.
            assert_eq!(
                &out[r * dim..(r + 1) * dim],
                &f[id as usize * dim..(id as usize + 1) * dim]
            );
        }
        let e = embedding_gather(table, dim, &[1, 5], &mut out[..2 * dim]).unwrap_err();
        assert!(
            e.to_string()
                .contains("ids[1] = 5 is past the vocabulary of 5 rows"),
            "{e}"
        );
    }
}

#[test]
fn argmax_takes_the_first_maximum_and_refuses_nan() {
    assert_eq!(argmax(&[1.0, 3.0, -2.0, 3.0]).unwrap(), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30]).unwrap(), 1);
    assert!(argmax(&[]).is_err());
    assert!(argmax(&[0.0, f32::NAN])
        .unwrap_err()
        .to_string()
        .contains("x[1] is NaN"));
}

/// `act_and_mul` is the named op of its activation, bit for bit (one name for the op on both devices).
#[test]
fn act_and_mul_dispatches_to_the_named_ops() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let (rows, inter) = (3, 37);
    let gu = uniform(&mut rng, rows * 2 * inter, -4.0, 4.0);
    for act in [GatedAct::Silu, GatedAct::GeluErf, GatedAct::GeluTanh] {
        let mut got = vec![f32::NAN; rows * inter];
        let mut want = vec![f32::NAN; rows * inter];
        ops::act_and_mul(act, &gu, inter, &mut got).unwrap();
        match act {
            GatedAct::Silu => ops::silu_and_mul(&gu, inter, &mut want),
            GatedAct::GeluErf => ops::gelu_and_mul(&gu, inter, &mut want),
            GatedAct::GeluTanh => backend::gelu_tanh_and_mul(&gu, inter, &mut want),
        }
        .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{act:?}");
        assert!(
            ops::act_and_mul(act, &gu, inter, &mut got[1..]).is_err(),
            "{act:?}"
        );
    }
}

#[test]
fn bad_sizes_are_errors() {
    let mut out = vec![0.0; 10];
    let e = ops::rmsnorm(&[0.0; 10], &[1.0; 3], NormWeight::Plain, 1e-6, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("not a whole number of rows of 3"),
        "{e}"
    );
    let e = ops::silu_and_mul(&[0.0; 12], 3, &mut out).unwrap_err();
    assert!(e.to_string().contains("expected rows*inter = 6"), "{e}");
    let e = ops::gelu_and_mul(&[0.0; 12], 0, &mut out).unwrap_err();
    assert!(e.to_string().contains("inter must be positive"), "{e}");
}

#[test]
fn fma_probe_counts_its_work_on_every_path() {
    for isa in Isa::available() {
        let before = seq_isa_calls(isa);
        let flops = ops::fma_probe(isa, 1000).unwrap();
        assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
        // 64 multiply-adds per round on the generic paths, 12 chains of 16 lanes on AVX-512.
        let per_round = if isa == Isa::Avx512 {
            12.0 * 16.0 * 2.0
        } else {
            64.0 * 2.0
        };
        assert_eq!(flops, 1000.0 * per_round, "{isa:?}");
    }
}
