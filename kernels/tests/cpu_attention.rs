//! The C attention kernels against the dense f64 reference: paged and ring decode over the same random histories
//! (unused pages, slots and ring entries poisoned with NaN, so reading one fails the test), causal prefill with and
//! without a sliding window, RoPE with partial rotary factors, head dims 256 and ragged ones, every ISA path.

use half::bf16;
use kernels::attention::{self, paged_slot, ring_slot, AttnDims, KvSlice, PagedKv, RingKv, Rope};
use kernels::cpu::Isa;
use kernels::ops::seq_isa_calls;
use kernels::reference;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

mod common;
use common::uniform_in as uniform;

/// Scaled error bound |got - want| / (1 + |want|) against the f64 reference. Measured worst over these tests:
/// 3.2e-7 (every ISA path, histories up to 700 keys), so 2e-5 leaves a wide margin yet catches a wrong mask
/// (one extra or missing key moves the output by ~1e-3 or more).
const TOL: f32 = 2e-5;

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        assert!(
            err <= TOL,
            "{what}: element {i} is {g} expected {w} (scaled error {err:e})"
        );
    }
}

/// One sequence's history: `n` tokens of K and V, `[n, Hkv, D]`.
struct History {
    n: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// A random history; with `bf16` its values are rounded to bf16 first, so the f64 reference sees exactly what a
/// bf16 cache holds.
fn history(dims: &AttnDims, n: usize, bf16: bool, rng: &mut ChaCha8Rng) -> History {
    let len = n * dims.kv_heads * dims.head_dim;
    let round = |v: Vec<f32>| {
        if bf16 {
            v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect()
        } else {
            v
        }
    };
    History {
        n,
        k: round(uniform(rng, len, -1.0, 1.0)),
        v: round(uniform(rng, len, -1.0, 1.0)),
    }
}

/// The cache as the kernel sees it: the f32 buffer itself, or its bf16 copy (NaN poison survives conversion).
fn as_cache<'a>(f: &'a [f32], b: &'a mut Vec<bf16>, want_bf16: bool) -> KvSlice<'a> {
    if want_bf16 {
        *b = f.iter().map(|&x| bf16::from_f32(x)).collect();
        KvSlice::Bf16(b)
    } else {
        KvSlice::F32(f)
    }
}

/// Decodes the last token of every history through the paged cache, the ring (when `window` is set) and compares
/// both against the dense reference.
fn check_decode(
    isa: Isa,
    dims: &AttnDims,
    lens: &[usize],
    page_size: usize,
    window: usize,
    bf16: bool,
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let batch = lens.len();
    let hist: Vec<History> = lens
        .iter()
        .map(|&n| history(dims, n, bf16, &mut rng))
        .collect();
    let q = uniform(&mut rng, batch * hq * d, -2.0, 2.0);

    // Dense references, full and windowed.
    let mut want_full = vec![0.0f32; batch * hq * d];
    let mut want_win = vec![0.0f32; batch * hq * d];
    for (b, h) in hist.iter().enumerate() {
        let qb = &q[b * hq * d..(b + 1) * hq * d];
        reference::attention::decode_dense(
            dims,
            scale,
            None,
            h.n,
            qb,
            &h.k,
            &h.v,
            &mut want_full[b * hq * d..(b + 1) * hq * d],
        )
        .unwrap();
        reference::attention::decode_dense(
            dims,
            scale,
            Some(window),
            h.n,
            qb,
            &h.k,
            &h.v,
            &mut want_win[b * hq * d..(b + 1) * hq * d],
        )
        .unwrap();
    }

    // Paged: pages handed out in a random order, two spare pages, everything unwritten is NaN.
    let max_pages = lens.iter().map(|n| n.div_ceil(page_size)).max().unwrap();
    let num_pages = lens.iter().map(|n| n.div_ceil(page_size)).sum::<usize>() + 2;
    let mut ids: Vec<u32> = (0..num_pages as u32).collect();
    ids.shuffle(&mut rng);
    let mut block_table = vec![u32::MAX; batch * max_pages];
    let mut next = ids.into_iter();
    for (b, &n) in lens.iter().enumerate() {
        for i in 0..n.div_ceil(page_size) {
            block_table[b * max_pages + i] = next.next().unwrap();
        }
    }
    let page = hkv * page_size * d;
    let mut k_pages = vec![f32::NAN; num_pages * page];
    let mut v_pages = vec![f32::NAN; num_pages * page];
    for (b, h) in hist.iter().enumerate() {
        for p in 0..h.n {
            let (id, slot) = paged_slot(
                &block_table[b * max_pages..(b + 1) * max_pages],
                page_size,
                p,
            )
            .unwrap();
            for kvh in 0..hkv {
                let dst = id as usize * page + (kvh * page_size + slot) * d;
                let src = (p * hkv + kvh) * d;
                k_pages[dst..dst + d].copy_from_slice(&h.k[src..src + d]);
                v_pages[dst..dst + d].copy_from_slice(&h.v[src..src + d]);
            }
        }
    }
    let lens32: Vec<u32> = lens.iter().map(|&n| n as u32).collect();
    let (mut kb, mut vb) = (Vec::new(), Vec::new());
    let kv = PagedKv {
        k_pages: as_cache(&k_pages, &mut kb, bf16),
        v_pages: as_cache(&v_pages, &mut vb, bf16),
        page_size,
        block_table: &block_table,
        max_pages,
        lens: &lens32,
    };
    let mut out = vec![f32::NAN; batch * hq * d];
    let before = seq_isa_calls(isa);
    attention::decode_paged_with(isa, 2, dims, scale, batch, &q, &kv, &mut out).unwrap();
    assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
    assert_close(
        &format!("{isa:?} paged bf16={bf16} {dims:?} lens {lens:?} page {page_size}"),
        &out,
        &want_full,
    );

    // Ring of window-1 slots holding the tokens before the current one; unwritten slots are NaN.
    let slots = window - 1;
    let mut k_ring = vec![f32::NAN; batch * hkv * slots * d];
    let mut v_ring = vec![f32::NAN; batch * hkv * slots * d];
    let mut k_cur = vec![0.0f32; batch * hkv * d];
    let mut v_cur = vec![0.0f32; batch * hkv * d];
    for (b, h) in hist.iter().enumerate() {
        let cur = h.n - 1;
        for p in cur.saturating_sub(slots)..cur {
            let slot = ring_slot(window, p).unwrap();
            for kvh in 0..hkv {
                let dst = ((b * hkv + kvh) * slots + slot) * d;
                let src = (p * hkv + kvh) * d;
                k_ring[dst..dst + d].copy_from_slice(&h.k[src..src + d]);
                v_ring[dst..dst + d].copy_from_slice(&h.v[src..src + d]);
            }
        }
        let src = cur * hkv * d;
        k_cur[b * hkv * d..(b + 1) * hkv * d].copy_from_slice(&h.k[src..src + hkv * d]);
        v_cur[b * hkv * d..(b + 1) * hkv * d].copy_from_slice(&h.v[src..src + hkv * d]);
    }
    let pos: Vec<u32> = lens.iter().map(|&n| n as u32 - 1).collect();
    let (mut krb, mut vrb, mut kcb, mut vcb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let ring = RingKv {
        k_ring: as_cache(&k_ring, &mut krb, bf16),
        v_ring: as_cache(&v_ring, &mut vrb, bf16),
        window,
        k_cur: as_cache(&k_cur, &mut kcb, bf16),
        v_cur: as_cache(&v_cur, &mut vcb, bf16),
        pos: &pos,
    };
    let mut out = vec![f32::NAN; batch * hq * d];
    attention::decode_ring_with(isa, 2, dims, scale, batch, &q, &ring, &mut out).unwrap();
    assert_close(
        &format!("{isa:?} ring bf16={bf16} {dims:?} lens {lens:?} window {window}"),
        &out,
        &want_win,
    );
}

#[test]
fn paged_and_ring_decode_match_dense_on_every_isa() {
    let qwen = common::attn(6, 1, 256);
    let spark = common::attn(4, 2, 256);
    let ragged = common::attn(3, 3, 40);
    for isa in Isa::available() {
        // Spark's real window (512: the ring holds 511) with histories shorter and longer than it.
        for bf16 in [false, true] {
            check_decode(isa, &spark, &[1, 300, 700], 16, 512, bf16, 1);
            check_decode(isa, &qwen, &[33, 65], 7, 20, bf16, 2);
            check_decode(isa, &ragged, &[5, 1, 90], 3, 2, bf16, 3);
            check_decode(isa, &ragged, &[4], 1, 1, bf16, 4);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Random histories, page sizes, page orders and windows: paged == dense, ring == windowed dense.
    #[test]
    fn paged_and_ring_equal_dense(lens in proptest::collection::vec(1usize..200, 1..4), page_size in 1usize..20,
                                  window in 1usize..64, hkv in 1usize..3, group in 1usize..4, d in 1usize..70,
                                  bf16 in proptest::bool::ANY, seed in 0u64..10_000) {
        let dims = AttnDims { q_heads: hkv * group, kv_heads: hkv, head_dim: d };
        check_decode(Isa::detected(), &dims, &lens, page_size, window, bf16, seed);
    }
}

fn check_prefill(isa: Isa, dims: &AttnDims, t: usize, window: Option<usize>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let q = uniform(&mut rng, t * hq * d, -2.0, 2.0);
    let k = uniform(&mut rng, t * hkv * d, -1.0, 1.0);
    let v = uniform(&mut rng, t * hkv * d, -1.0, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![f32::NAN; t * hq * d];
    let mut want = vec![0.0f32; t * hq * d];
    let before = seq_isa_calls(isa);
    attention::prefill_with(isa, 2, dims, scale, window, t, &q, &k, &v, &mut out).unwrap();
    assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
    reference::attention::prefill(dims, scale, window, t, &q, &k, &v, &mut want).unwrap();
    assert_close(
        &format!("{isa:?} prefill {dims:?} t={t} window={window:?}"),
        &out,
        &want,
    );
}

#[test]
fn prefill_matches_reference_with_and_without_window() {
    let spark = common::attn(4, 2, 256);
    let ragged = common::attn(6, 2, 72);
    for isa in Isa::available() {
        check_prefill(isa, &spark, 77, None, 10);
        check_prefill(isa, &spark, 77, Some(16), 11);
        check_prefill(isa, &ragged, 45, Some(1), 12);
        check_prefill(isa, &ragged, 100, Some(33), 13);
        check_prefill(isa, &ragged, 1, None, 14);
        // A window wider than the prompt masks nothing (and must not wrap any index arithmetic).
        check_prefill(isa, &spark, 40, Some(usize::MAX), 16);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Random lengths, windows, groups (including above the blocked kernel's 16, which takes the per-query
    /// kernel) and ragged head dims: prefill == reference on the fastest path.
    #[test]
    fn prefill_equals_reference(t in 1usize..150, window in proptest::option::of(1usize..80), hkv in 1usize..3,
                                group in prop_oneof![1usize..9, Just(17usize)], d in 1usize..70, seed in 0u64..10_000) {
        let dims = AttnDims { q_heads: hkv * group, kv_heads: hkv, head_dim: d };
        check_prefill(Isa::detected(), &dims, t, window, seed);
    }
}

#[test]
fn prefill_in_qwen_geometry() {
    // 24 query / 4 KV heads of 256 (group 6), a length that is neither a multiple of the 16-token query block
    // nor of the 32-key tile.
    let qwen = common::attn(24, 4, 256);
    for isa in Isa::available() {
        check_prefill(isa, &qwen, 83, None, 15);
    }
}

#[test]
fn rope_matches_reference_for_partial_and_full_rotation() {
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    // Qwen3.8 (partial 0.25, theta 1e7), Spark sliding (full, 1e4), a ragged head; positions up to 1M.
    for (rope, heads) in [
        (Rope::new(256, 0.25, 1e7).unwrap(), 3),
        (Rope::new(256, 1.0, 1e4).unwrap(), 2),
        (Rope::new(40, 0.5, 5e6).unwrap(), 5),
    ] {
        let positions: Vec<u32> = vec![0, 1, 7, 511, 512, 4095, 65_537, 1_048_575];
        for isa in Isa::available() {
            let x = uniform(&mut rng, positions.len() * heads * rope.head_dim, -1.0, 1.0);
            let (mut got, mut want) = (x.clone(), x.clone());
            let before = seq_isa_calls(isa);
            attention::rope_neox_with(isa, 2, &rope, heads, &positions, &mut got).unwrap();
            assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
            reference::attention::rope_neox(&rope, heads, &positions, &mut want).unwrap();
            assert_close(&format!("{isa:?} rope {rope:?}"), &got, &want);
            // The unrotated tail passes through bit for bit.
            for r in 0..positions.len() * heads {
                let row = r * rope.head_dim;
                assert_eq!(
                    &got[row + rope.rotary_dim..row + rope.head_dim],
                    &x[row + rope.rotary_dim..row + rope.head_dim]
                );
            }
        }
    }
    assert!(Rope::new(256, 0.0, 1e4).is_err());
    assert!(Rope::new(10, 0.5, 1e4).is_err(), "rotary_dim 5 is odd");
}

#[test]
fn bad_caches_are_errors() {
    let dims = common::attn(2, 1, 8);
    let q = vec![0.0f32; 32];
    let mut out = vec![0.0f32; 32];
    let pages = vec![0.0f32; 3 * 4 * 8];
    let lens = [5u32, 4];
    let table = [0u32, 1, 7, 2];
    let kv = PagedKv {
        k_pages: KvSlice::F32(&pages),
        v_pages: KvSlice::F32(&pages),
        page_size: 4,
        block_table: &table,
        max_pages: 2,
        lens: &lens,
    };
    let e = attention::decode_paged(&dims, 1.0, 2, &q, &kv, &mut out).unwrap_err();
    assert!(
        e.to_string()
            .contains("block_table[1][0] = 7 but the cache has 3 pages"),
        "{e}"
    );
    let table = [0u32, 1, 2, 0];
    let lens = [9u32, 4];
    let kv = PagedKv {
        block_table: &table,
        lens: &lens,
        ..kv
    };
    let e = attention::decode_paged(&dims, 1.0, 2, &q, &kv, &mut out).unwrap_err();
    assert!(e.to_string().contains("lens[0] = 9 does not fit"), "{e}");
    let lens = [0u32, 4];
    let kv = PagedKv { lens: &lens, ..kv };
    let e = attention::decode_paged(&dims, 1.0, 2, &q, &kv, &mut out).unwrap_err();
    assert!(e.to_string().contains("lens[0] is 0"), "{e}");
    // Absurd counts are refused by the size checks' checked products, not by an arithmetic overflow.
    let e = attention::decode_paged(&dims, 1.0, usize::MAX, &q, &kv, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("rows x Hq x D overflows usize"),
        "{e}"
    );
    let e = attention::prefill(&dims, 1.0, None, usize::MAX, &q, &q, &q, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("rows x Hq x D overflows usize"),
        "{e}"
    );
    let e = attention::prefill(
        &dims,
        1.0,
        Some(0),
        1,
        &q[..16],
        &q[..8],
        &q[..8],
        &mut out[..16],
    )
    .unwrap_err();
    assert!(e.to_string().contains("at least 1 token"), "{e}");
    let ring = RingKv {
        k_ring: KvSlice::F32(&[]),
        v_ring: KvSlice::F32(&[]),
        window: 3,
        k_cur: KvSlice::F32(&[0.0; 8]),
        v_cur: KvSlice::F32(&[0.0; 8]),
        pos: &[0],
    };
    let e = attention::decode_ring(&dims, 1.0, 1, &q[..16], &ring, &mut out[..16]).unwrap_err();
    assert!(e.to_string().contains("k_ring and v_ring"), "{e}");
    // Mixed element types are refused rather than misread.
    let ring_half = vec![bf16::ZERO; 2 * 8];
    let ring = RingKv {
        k_ring: KvSlice::F32(&[0.0; 16]),
        v_ring: KvSlice::Bf16(&ring_half),
        ..ring
    };
    let e = attention::decode_ring(&dims, 1.0, 1, &q[..16], &ring, &mut out[..16]).unwrap_err();
    assert!(e.to_string().contains("must all be f32 or all bf16"), "{e}");
}

/// The engine's loop for two sequences token by token: store K/V through the helpers (paged: before the step;
/// ring: after it), decode, and compare every step with the dense reference, for f32 and bf16 caches.
#[test]
fn token_by_token_generation_through_the_store_helpers() {
    use kernels::attention::{paged_store, ring_store, KvSliceMut};
    let dims = common::attn(4, 2, 24);
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let (page_size, window, steps, batch) = (5usize, 7usize, 23usize, 2usize);
    let scale = 0.3;
    for bf16 in [false, true] {
        let mut rng = ChaCha8Rng::seed_from_u64(70);
        let hist: Vec<History> = (0..batch)
            .map(|_| history(&dims, steps, bf16, &mut rng))
            .collect();
        let max_pages = steps.div_ceil(page_size);
        // Sequence 0 takes the odd pages, sequence 1 the even ones, backwards.
        let block_table: Vec<u32> = (0..batch * max_pages)
            .map(|i| {
                if i < max_pages {
                    2 * i as u32 + 1
                } else {
                    2 * (2 * max_pages - 1 - i) as u32
                }
            })
            .collect();
        let page = hkv * page_size * d;
        let n = 2 * max_pages * page;
        let ring_len = batch * hkv * (window - 1) * d;
        let (mut kp32, mut vp32, mut kr32, mut vr32) = (
            vec![f32::NAN; n],
            vec![f32::NAN; n],
            vec![f32::NAN; ring_len],
            vec![f32::NAN; ring_len],
        );
        let nan16 = bf16::from_f32(f32::NAN);
        let (mut kp16, mut vp16, mut kr16, mut vr16) = (
            vec![nan16; n],
            vec![nan16; n],
            vec![nan16; ring_len],
            vec![nan16; ring_len],
        );
        fn pick<'a>(bf16: bool, f: &'a mut [f32], h: &'a mut [bf16]) -> KvSliceMut<'a> {
            if bf16 {
                KvSliceMut::Bf16(h)
            } else {
                KvSliceMut::F32(f)
            }
        }
        fn read<'a>(bf16: bool, f: &'a [f32], h: &'a [bf16]) -> KvSlice<'a> {
            if bf16 {
                KvSlice::Bf16(h)
            } else {
                KvSlice::F32(f)
            }
        }
        for p in 0..steps {
            let q = uniform(&mut rng, batch * hq * d, -2.0, 2.0);
            let row = |h: &History, kv: bool| -> Vec<f32> {
                let src = if kv { &h.k } else { &h.v };
                src[p * hkv * d..(p + 1) * hkv * d].to_vec()
            };
            for (b, h) in hist.iter().enumerate() {
                let bt = &block_table[b * max_pages..(b + 1) * max_pages];
                for (f, half, is_k) in [(&mut kp32, &mut kp16, true), (&mut vp32, &mut vp16, false)]
                {
                    paged_store(&dims, pick(bf16, f, half), page_size, bt, p, &row(h, is_k))
                        .unwrap();
                }
            }
            let lens = vec![p as u32 + 1; batch];
            let kv = PagedKv {
                k_pages: read(bf16, &kp32, &kp16),
                v_pages: read(bf16, &vp32, &vp16),
                page_size,
                block_table: &block_table,
                max_pages,
                lens: &lens,
            };
            let mut paged_out = vec![f32::NAN; batch * hq * d];
            attention::decode_paged(&dims, scale, batch, &q, &kv, &mut paged_out).unwrap();
            let cur_k: Vec<f32> = hist.iter().flat_map(|h| row(h, true)).collect();
            let cur_v: Vec<f32> = hist.iter().flat_map(|h| row(h, false)).collect();
            let (mut ck16, mut cv16) = (Vec::new(), Vec::new());
            let pos = vec![p as u32; batch];
            let mut ring_out = vec![f32::NAN; batch * hq * d];
            {
                let ring = RingKv {
                    k_ring: read(bf16, &kr32, &kr16),
                    v_ring: read(bf16, &vr32, &vr16),
                    window,
                    k_cur: as_cache(&cur_k, &mut ck16, bf16),
                    v_cur: as_cache(&cur_v, &mut cv16, bf16),
                    pos: &pos,
                };
                attention::decode_ring(&dims, scale, batch, &q, &ring, &mut ring_out).unwrap();
            }
            for (b, h) in hist.iter().enumerate() {
                for (f, half, is_k) in [(&mut kr32, &mut kr16, true), (&mut vr32, &mut vr16, false)]
                {
                    ring_store(&dims, pick(bf16, f, half), window, b, p, &row(h, is_k)).unwrap();
                }
                let (kk, vv) = (&h.k[..(p + 1) * hkv * d], &h.v[..(p + 1) * hkv * d]);
                let qb = &q[b * hq * d..(b + 1) * hq * d];
                // The paged cache holds the whole history, the ring the last `window` tokens.
                for (cache, win, out) in [
                    ("paged", None, &paged_out),
                    ("ring", Some(window), &ring_out),
                ] {
                    let mut want = vec![0.0f32; hq * d];
                    reference::attention::decode_dense(
                        &dims,
                        scale,
                        win,
                        p + 1,
                        qb,
                        kk,
                        vv,
                        &mut want,
                    )
                    .unwrap();
                    assert_close(
                        &format!("{cache} bf16={bf16} step {p} seq {b}"),
                        &out[b * hq * d..(b + 1) * hq * d],
                        &want,
                    );
                }
            }
        }
        let e = paged_store(
            &dims,
            KvSliceMut::F32(&mut kp32),
            page_size,
            &block_table[..max_pages],
            steps + page_size,
            &vec![0.0; hkv * d],
        )
        .unwrap_err();
        assert!(e.to_string().contains("past the block table"), "{e}");
    }
}
