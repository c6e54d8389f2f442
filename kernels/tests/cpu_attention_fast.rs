//! The AVX-512 streaming paged decode (`csrc/attn_avx512.c`: head dims that are a multiple of 32 up to 512, groups
//! of 2, 3, 4, 6 or 8 query heads) against the dense f64 reference, on the shapes around its edges: every group it
//! specialises and ones it does not (which take the generic walker), head dims 32-512 and just past its limit,
//! histories that end inside a 16-key score block, on an odd key and exactly on a tile, page sizes that split the
//! 32-key tile, f32 and bf16 caches. Unused pages are NaN and outputs start as NaN, so a stray read or a missed
//! write fails the test. On a CPU without AVX-512 the same checks run on the detected path.

use half::bf16;
use kernels::attention::{self, AttnDims, KvSlice, PagedKv};
use kernels::cpu::Isa;
use kernels::ops::seq_isa_calls;
use kernels::reference;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The bound of `cpu_attention.rs` (scaled error against the f64 reference); the streaming kernel sums scores in
/// a different order but in f32 all the same.
const TOL: f32 = 2e-5;

fn isa() -> Isa {
    if Isa::available().contains(&Isa::Avx512) {
        Isa::Avx512
    } else {
        eprintln!("skipped the AVX-512 kernel: this CPU lacks AVX-512; checking the detected path instead");
        Isa::detected()
    }
}

/// Decodes one token for each history length through a paged cache (pages in a random order) and compares it to
/// the dense reference.
fn check(dims: &AttnDims, lens: &[usize], page_size: usize, bf16: bool, seed: u64) {
    let isa = isa();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let batch = lens.len();
    let round = |x: f32| if bf16 { bf16::from_f32(x).to_f32() } else { x };
    let hist: Vec<(Vec<f32>, Vec<f32>)> = lens
        .iter()
        .map(|&n| {
            let mut draw = || -> Vec<f32> {
                (0..n * hkv * d)
                    .map(|_| round(rng.gen_range(-1.0f32..1.0)))
                    .collect()
            };
            (draw(), draw())
        })
        .collect();
    let q: Vec<f32> = (0..batch * hq * d)
        .map(|_| rng.gen_range(-2.0f32..2.0))
        .collect();
    let mut want = vec![0.0f32; batch * hq * d];
    for (b, (k, v)) in hist.iter().enumerate() {
        let rows = b * hq * d..(b + 1) * hq * d;
        reference::attention::decode_dense(
            dims,
            scale,
            None,
            lens[b],
            &q[rows.clone()],
            k,
            v,
            &mut want[rows],
        )
        .unwrap();
    }

    let max_pages = lens.iter().map(|n| n.div_ceil(page_size)).max().unwrap();
    let num_pages = lens.iter().map(|n| n.div_ceil(page_size)).sum::<usize>() + 1;
    let mut ids: Vec<u32> = (0..num_pages as u32).collect();
    ids.shuffle(&mut rng);
    let mut ids = ids.into_iter();
    let page = hkv * page_size * d;
    let mut block_table = vec![u32::MAX; batch * max_pages];
    let mut k_pages = vec![f32::NAN; num_pages * page];
    let mut v_pages = vec![f32::NAN; num_pages * page];
    for (b, (k, v)) in hist.iter().enumerate() {
        for i in 0..lens[b].div_ceil(page_size) {
            let id = ids.next().unwrap() as usize;
            block_table[b * max_pages + i] = id as u32;
            for t in i * page_size..lens[b].min((i + 1) * page_size) {
                for kvh in 0..hkv {
                    let dst = id * page + (kvh * page_size + t - i * page_size) * d;
                    let src = (t * hkv + kvh) * d;
                    k_pages[dst..dst + d].copy_from_slice(&k[src..src + d]);
                    v_pages[dst..dst + d].copy_from_slice(&v[src..src + d]);
                }
            }
        }
    }
    let to_bf16 = |f: &[f32]| f.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (kb, vb) = (to_bf16(&k_pages), to_bf16(&v_pages));
    let (k_cache, v_cache) = if bf16 {
        (KvSlice::Bf16(&kb), KvSlice::Bf16(&vb))
    } else {
        (KvSlice::F32(&k_pages), KvSlice::F32(&v_pages))
    };
    let lens32: Vec<u32> = lens.iter().map(|&n| n as u32).collect();
    let kv = PagedKv {
        k_pages: k_cache,
        v_pages: v_cache,
        page_size,
        block_table: &block_table,
        max_pages,
        lens: &lens32,
    };
    for threads in [1, 2] {
        let mut out = vec![f32::NAN; batch * hq * d];
        let before = seq_isa_calls(isa);
        attention::decode_paged_with(isa, threads, dims, scale, batch, &q, &kv, &mut out).unwrap();
        assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
        for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
            let err = (g - w).abs() / (1.0 + w.abs());
            assert!(
                err <= TOL,
                "{dims:?} lens {lens:?} page {page_size} bf16={bf16} threads {threads}: element {i} is {g} \
                 expected {w} (scaled error {err:e})"
            );
        }
    }
}

#[test]
fn every_specialised_group_and_the_fallbacks() {
    // Groups 2, 3, 4, 6, 8 are specialised; 1, 5 and 16 take the generic walker.
    for (seed, group) in [1usize, 2, 3, 4, 5, 6, 8, 16].into_iter().enumerate() {
        for bf16 in [false, true] {
            let dims = AttnDims {
                q_heads: 2 * group,
                kv_heads: 2,
                head_dim: 64,
            };
            check(&dims, &[1, 2, 15, 16, 17, 33, 70], 64, bf16, seed as u64);
        }
    }
}

#[test]
fn head_dims_up_to_the_limit_and_past_it() {
    // 544 and 48 are outside the streaming kernel (above 512, not a multiple of 32) and take the generic walker.
    for (seed, d) in [32usize, 96, 256, 512, 544, 48].into_iter().enumerate() {
        for bf16 in [false, true] {
            let dims = AttnDims {
                q_heads: 6,
                kv_heads: 1,
                head_dim: d,
            };
            check(&dims, &[31, 97], 16, bf16, 10 + seed as u64);
        }
    }
}

#[test]
fn pages_that_split_the_tile() {
    // Page sizes below, across and above the 32-key tile, so segments end inside score blocks and the next-page
    // prefetch crosses pages of every length; Qwen3.8's geometry (24 / 4 heads of 256).
    let qwen = AttnDims {
        q_heads: 24,
        kv_heads: 4,
        head_dim: 256,
    };
    for (seed, page) in [1usize, 5, 31, 33, 64].into_iter().enumerate() {
        for bf16 in [false, true] {
            check(&qwen, &[1, 40, 129], page, bf16, 20 + seed as u64);
        }
    }
}
