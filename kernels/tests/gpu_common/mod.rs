//! What every GPU test file shares: opening the device (or saying "skipped: no CUDA device"), a seeded generator
//! whose seed is printed, random inputs, and the relative error that fails on an unwritten (NaN-poisoned) element.
//! Each `kernels/tests/gpu_*.rs` includes it with `mod gpu_common;`.
#![allow(dead_code)] // each test file uses a different subset

use kernels::cuda::Gpu;
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
