//! Every public CPU entry point refuses sizes it cannot honour with a [`KernelError`], never a panic and never a
//! call into C with lengths that do not match the buffers.
//!
//! The dimensions come from [`dim`]: zero, small, and huge values whose products overflow `usize` (or reach far
//! beyond any buffer). The buffers are small and non-empty, so a call with at least one huge or zero dimension
//! cannot be consistent: each property expects `Err`. A panic fails the property (proptest catches it), and an
//! out-of-bounds write by a kernel would take the test binary down. The case count is modest so the file runs in
//! a few seconds.

use kernels::attention::{self, AttnDims, KvSlice, KvSliceMut, PagedKv, RingKv, Rope};
use kernels::cpu::Isa;
use kernels::gdn::{self, GdnDims, GdnInputs, GdnWeights};
use kernels::linear::{self, Bf16Weights, Ext, Fp8Weights, Int4Scheme, Int4Weights, Nvfp4Weights};
use kernels::ops::{self, EmbeddingTable, NormWeight};
use kernels::reference::linear::Int4Logical;
use kernels::sampling::{self, Pcg32, SamplingParams};
use kernels::KernelError;
use proptest::prelude::*;

/// Values whose products with anything but zero overflow `usize` or exceed every buffer here.
const HUGE: [usize; 6] = [
    1 << 32,
    (1 << 32) + 1,
    1 << 40,
    1 << 62,
    usize::MAX / 2 + 1,
    usize::MAX,
];

/// A huge dimension.
fn huge() -> impl Strategy<Value = usize> {
    proptest::sample::select(HUGE.to_vec())
}

/// Any dimension: zero, small, or huge.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 1usize..4, huge()]
}

/// A small non-empty f32 buffer.
fn buf() -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-2.0f32..2.0, 1..17)
}

/// Which of a call's dimensions is forced huge; the others come from [`dim`].
fn which(n: usize) -> impl Strategy<Value = usize> {
    0..n
}

/// The paths a call may ask for: scalar always, plus the detected one (AVX-512 here).
fn isa() -> impl Strategy<Value = Isa> {
    proptest::sample::select(Isa::available())
}

/// `dims` with entry `at` replaced by `big`.
fn force<const N: usize>(mut dims: [usize; N], at: usize, big: usize) -> [usize; N] {
    dims[at] = big;
    dims
}

fn is_shape(r: &Result<impl std::fmt::Debug, KernelError>) -> bool {
    matches!(r, Err(KernelError::Shape { .. }))
}

/// Runs both GDN entry points on `n` sequences / tokens, inputs `bufs[4..8]`, fresh state and output buffers
/// (copies of `bufs[8]`); each must refuse with a shape error.
fn gdn_refuses(
    isa: Isa,
    threads: usize,
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    n: usize,
    bufs: &[Vec<f32>],
) -> Result<(), TestCaseError> {
    let x = &GdnInputs {
        qkv: &bufs[4],
        z: &bufs[5],
        a: &bufs[6],
        b: &bufs[7],
    };
    let (mut conv, mut state, mut out) = (bufs[8].clone(), bufs[8].clone(), bufs[8].clone());
    let r = gdn::decode_step_with(isa, threads, dims, w, n, x, &mut conv, &mut state, &mut out);
    prop_assert!(is_shape(&r), "{:?}", r);
    let r = gdn::prefill_with(isa, threads, dims, w, n, x, &mut conv, &mut state, &mut out);
    prop_assert!(is_shape(&r), "{:?}", r);
    Ok(())
}

/// The crash this file was written for: weights of 2^32 x 2^32 bf16 elements with an empty buffer passed the
/// size check (the product wrapped to 0) and the scalar GEMV then read and wrote far past the buffers.
#[test]
fn bf16_with_wrapping_sizes_is_refused() {
    let w = Bf16Weights::new(&[], 1 << 32, 1 << 32);
    assert!(is_shape(&w), "{w:?}");
    let w = Bf16Weights::new(&[0; 4], 2, 2).unwrap();
    let r = linear::bf16_with(Isa::Scalar, 1, &[][..] as &[f32], 1 << 32, &w, &mut []);
    assert!(is_shape(&r), "{r:?}");
    let r = linear::bf16_with(Isa::Scalar, 1, &[][..] as &[f32], usize::MAX, &w, &mut []);
    assert!(is_shape(&r), "{r:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn weight_constructors_refuse_bad_sizes(d in [dim(), dim()], at in which(2), big in huge(),
                                            len in 0usize..17, global in -1.0f32..1.0) {
        let [n, k] = force(d, at, big);
        let (bytes, floats, bits) = (vec![0u8; len], vec![1.0f32; len], vec![0u16; len]);
        prop_assert!(is_shape(&Bf16Weights::new(&bits, n, k)));
        prop_assert!(is_shape(&Fp8Weights::new(&bytes, &floats, n, k)));
        prop_assert!(is_shape(&Nvfp4Weights::new(&bytes, &bytes, global, n, k)));
    }

    #[test]
    fn linear_calls_refuse_bad_m_and_buffers(m in dim(), x in buf(), y_len in 0usize..17, threads in 0usize..4,
                                              isa in isa(), huge_m in huge(), bf16_x in proptest::bool::ANY) {
        // Valid 2 x 32 weights of every format; m or the buffers are wrong.
        let (n, k) = (2, 32);
        let bf = Bf16Weights::new(&[0; 64], n, k).unwrap();
        let fp = Fp8Weights::new(&[0; 64], &[1.0], n, k).unwrap();
        let nv = Nvfp4Weights::new(&[0; 32], &[0; 4], 1.0, n, k).unwrap();
        let w4 = Int4Weights::quantize(&[0.5; 64], n, k, 32, Int4Scheme::Symmetric).unwrap();
        for m in [m, huge_m] {
            // The only consistent case is x = m*k and y = m*n, which these lengths (at most 16) never are for
            // k = 32 unless m = 0, which is refused on its own.
            let mut y = vec![0.0f32; y_len];
            let xb: Vec<u16> = x.iter().map(|&v| kernels::formats::f32_to_bf16(v)).collect();
            // The same call with f32 and with bf16 activations.
            macro_rules! call {
                ($x:ident => $e:expr) => {{
                    let r = if bf16_x {
                        let $x = &xb[..];
                        $e
                    } else {
                        let $x = &x[..];
                        $e
                    };
                    prop_assert!(is_shape(&r), "m = {}: {:?}", m, r);
                }};
            }
            call!(xs => linear::bf16_with(isa, threads, xs, m, &bf, &mut y));
            call!(xs => linear::fp8_with(isa, threads, xs, m, &fp, &mut y));
            call!(xs => linear::nvfp4_ext(isa, Ext::Auto, threads, xs, m, &nv, &mut y).map(|r| r.isa));
            call!(xs => linear::w4a16_ext(isa, Ext::Auto, threads, xs, m, &w4, &mut y).map(|r| r.isa));
            call!(xs => linear::w4a8_ext(isa, Ext::Auto, threads, xs, m, &w4, &mut y).map(|r| r.isa));
        }
    }

    #[test]
    fn int4_constructors_refuse_bad_sizes(d in [dim(), dim()], at in which(2), big in huge(), both_huge in [huge(), huge()],
                                          group in proptest::sample::select(vec![0usize, 1, 32, 64, 128, usize::MAX]),
                                          len in 0usize..17, sym in proptest::bool::ANY) {
        let [n, k] = force(d, at, big);
        let scheme = if sym { Int4Scheme::Symmetric } else { Int4Scheme::Asymmetric };
        prop_assert!(is_shape(&Int4Weights::quantize(&vec![0.5; len], n, k, group, scheme)));
        prop_assert!(is_shape(&Int4Weights::quantize_bf16(&vec![0; len], n, k, group, scheme)));
        prop_assert!(is_shape(&Int4Weights::from_raw(n, k, group, scheme, vec![0x88; len], vec![0; len])));
        let logical = Int4Logical { n, k, group, codes: vec![8; len], scales: vec![0.0; len], zeros: vec![0.0; len] };
        prop_assert!(is_shape(&Int4Weights::from_logical(&logical, scheme)));
        // The chunked packer allocates from (n, k) alone, so it gets sizes that cannot be allocated at all.
        let [n, k] = both_huge;
        let r = Int4Weights::quantize_with(n, k, group, scheme, |_, _| Ok(()));
        prop_assert!(is_shape(&r));
    }

    #[test]
    fn int4_row_reads_refuse_bad_sizes(ids in proptest::collection::vec(0u32..4, 0..5), out_len in 0usize..17,
                                       row in 0usize..4) {
        // 2 x 8 weights: ids 2 and 3 and rows 2 and 3 are past the matrix; out must be ids * 8 and 8.
        let w = Int4Weights::quantize(&[0.25; 16], 2, 8, 32, Int4Scheme::Asymmetric).unwrap();
        let mut out = vec![0.0f32; out_len];
        let consistent = out_len == ids.len() * 8 && ids.iter().all(|&i| i < 2);
        prop_assert_eq!(w.gather_rows(&ids, &mut out).is_ok(), consistent);
        prop_assert_eq!(w.dequantize_row(row, &mut out).is_ok(), row < 2 && out_len == 8);
    }

    #[test]
    fn small_ops_refuse_bad_sizes(inter in dim(), dim_ in dim(), x in buf(), w in proptest::collection::vec(0.5f32..1.0, 0..5),
                                  out_len in 0usize..17, ids in proptest::collection::vec(0u32..8, 1..4),
                                  threads in 0usize..4, isa in isa(), big in huge()) {
        let mut out = vec![0.0f32; out_len];
        for inter in [inter, big] {
            // gate_up of at most 16 floats is a whole number of rows only for inter <= 8; out must be half of it.
            let ok = inter > 0 && x.len() % (2 * inter.min(1 << 20)) == 0 && out_len * 2 == x.len();
            let r = ops::silu_and_mul_with(isa, threads, &x, inter, &mut out);
            prop_assert_eq!(r.is_ok(), ok, "inter = {}: {:?}", inter, r);
            let r = ops::gelu_and_mul_with(isa, threads, &x, inter, &mut out);
            prop_assert_eq!(r.is_ok(), ok, "inter = {}: {:?}", inter, r);
            for act in [ops::GatedAct::Silu, ops::GatedAct::GeluErf, ops::GatedAct::GeluTanh] {
                let r = ops::act_and_mul(act, &x, inter, &mut out);
                prop_assert_eq!(r.is_ok(), ok, "{:?} inter = {}: {:?}", act, inter, r);
            }
        }
        let ok = !w.is_empty() && x.len() % w.len().max(1) == 0 && out_len == x.len();
        let r = ops::rmsnorm_with(isa, threads, &x, &w, NormWeight::OnePlus, 1e-6, &mut out);
        prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        for d in [dim_, big] {
            let table: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let vocab = x.len().checked_div(d).unwrap_or(0);
            let ok = d > 0 && x.len() % d == 0 && ids.iter().all(|&i| (i as usize) < vocab)
                && Some(out_len) == ids.len().checked_mul(d);
            let r = ops::embedding_gather(EmbeddingTable::F32(&x), d, &ids, &mut out);
            prop_assert_eq!(r.is_ok(), ok, "dim = {}: {:?}", d, r);
            let r = ops::embedding_gather(EmbeddingTable::Bf16(&table), d, &ids, &mut out);
            prop_assert_eq!(r.is_ok(), ok, "dim = {}: {:?}", d, r);
        }
    }

    #[test]
    fn attention_refuses_bad_sizes(d in [dim(), dim(), dim()], at in which(3), big in huge(), rows in dim(),
                                   extra in [dim(), dim()], q in buf(), kv in buf(), table in proptest::collection::vec(0u32..4, 1..5),
                                   threads in 0usize..4, isa in isa(), window in proptest::option::of(dim())) {
        let [q_heads, kv_heads, head_dim] = force(d, at, big);
        let dims = AttnDims { q_heads, kv_heads, head_dim };
        let [page_size, max_pages] = extra;
        let mut out = vec![0.0f32; q.len()];
        let lens = vec![1u32; table.len()];
        let paged = PagedKv {
            k_pages: KvSlice::F32(&kv), v_pages: KvSlice::F32(&kv), page_size, block_table: &table,
            max_pages, lens: &lens,
        };
        let r = attention::decode_paged_with(isa, threads, &dims, 1.0, rows, &q, &paged, &mut out);
        prop_assert!(is_shape(&r), "{:?}", r);
        let pos = vec![3u32; table.len()];
        let ring = RingKv {
            k_ring: KvSlice::F32(&kv), v_ring: KvSlice::F32(&kv), window: page_size, k_cur: KvSlice::F32(&kv),
            v_cur: KvSlice::F32(&kv), pos: &pos,
        };
        let r = attention::decode_ring_with(isa, threads, &dims, 1.0, rows, &q, &ring, &mut out);
        prop_assert!(is_shape(&r), "{:?}", r);
        let r = attention::prefill_with(isa, threads, &dims, 1.0, window, rows, &q, &kv, &kv, &mut out);
        prop_assert!(is_shape(&r), "{:?}", r);
        // The stores read only Hkv and D (a huge Hq alone is a valid geometry for them).
        let mut cache = kv.clone();
        let r = attention::paged_store(&dims, KvSliceMut::F32(&mut cache), page_size, &table, rows, &q);
        prop_assert!(at == 0 || is_shape(&r), "{:?}", r);
        let r = attention::ring_store(&dims, KvSliceMut::F32(&mut cache), max_pages, rows, rows, &q);
        prop_assert!(at == 0 || is_shape(&r), "{:?}", r);
    }

    #[test]
    fn attention_with_valid_heads_refuses_huge_counts(big in huge(), pick in which(4), x in buf(), threads in 0usize..4,
                                                      isa in isa()) {
        // Valid geometry (2 query heads on 1 KV head of 4); one count is huge and the buffers are small.
        let dims = AttnDims { q_heads: 2, kv_heads: 1, head_dim: 4 };
        let [rows, page_size, max_pages, window] = force([1, 1, 1, 2], pick, big);
        let mut out = vec![0.0f32; x.len()];
        let table = vec![0u32; 1];
        let lens = vec![1u32; 1];
        let paged = PagedKv {
            k_pages: KvSlice::F32(&x), v_pages: KvSlice::F32(&x), page_size, block_table: &table, max_pages,
            lens: &lens,
        };
        let pos = vec![1u32; 1];
        let ring = RingKv {
            k_ring: KvSlice::F32(&x), v_ring: KvSlice::F32(&x), window, k_cur: KvSlice::F32(&x),
            v_cur: KvSlice::F32(&x), pos: &pos,
        };
        // Each call is expected to fail when a count it reads is the huge one (pick: 0 rows, 1 page_size,
        // 2 max_pages, 3 window); a count it does not read may leave it valid.
        let r = attention::decode_paged_with(isa, threads, &dims, 1.0, rows, &x, &paged, &mut out);
        prop_assert!(pick == 3 || is_shape(&r), "{:?}", r);
        let r = attention::decode_ring_with(isa, threads, &dims, 1.0, rows, &x, &ring, &mut out);
        prop_assert!(pick == 1 || pick == 2 || is_shape(&r), "{:?}", r);
        // q needs 8 floats per token and k, v 4: one buffer is never both.
        let r = attention::prefill_with(isa, threads, &dims, 1.0, Some(window), rows, &x, &x, &x, &mut out);
        prop_assert!(is_shape(&r), "{:?}", r);
        let mut cache = x.clone();
        let r = attention::paged_store(&dims, KvSliceMut::F32(&mut cache), page_size, &table, rows, &x);
        prop_assert!(pick >= 2 || is_shape(&r), "{:?}", r);
        let r = attention::ring_store(&dims, KvSliceMut::F32(&mut cache), window, rows, rows, &x);
        prop_assert!(pick == 1 || pick == 2 || is_shape(&r), "{:?}", r);
    }

    #[test]
    fn rope_refuses_bad_sizes(heads in dim(), big in huge(), head_dim in prop_oneof![Just(0usize), 2usize..8, huge()],
                              rotary_dim in prop_oneof![Just(0usize), 2usize..8, huge()], theta in 0.5f64..1e6,
                              positions in proptest::collection::vec(0u32..100, 0..4), mut x in buf(),
                              threads in 0usize..4, isa in isa()) {
        let rope = Rope { head_dim, rotary_dim, theta };
        for heads in [heads, big] {
            let r = attention::rope_neox_with(isa, threads, &rope, heads, &positions, &mut x);
            let ok = rope.validate("test").is_ok() && heads > 0
                && Some(x.len()) == positions.len().checked_mul(heads).and_then(|v| v.checked_mul(head_dim));
            prop_assert_eq!(r.is_ok(), ok, "{:?}", r);
        }
    }

    #[test]
    fn gdn_refuses_bad_sizes(d in [dim(), dim(), dim(), dim(), dim()], at in which(5), big in huge(), n in dim(),
                             bufs in proptest::collection::vec(buf(), 9), threads in 0usize..4, isa in isa()) {
        let [key_heads, value_heads, key_dim, value_dim, conv_kernel] = force(d, at, big);
        let dims = GdnDims { key_heads, value_heads, key_dim, value_dim, conv_kernel };
        // Never panics on its own, whatever the geometry.
        let _ = (dims.conv_dim(), dims.value_width(), dims.state_len(), dims.conv_state_len());
        let w = GdnWeights { conv_weight: &bufs[0], a_log: &bufs[1], dt_bias: &bufs[2], norm_weight: &bufs[3], norm_eps: 1e-6 };
        gdn_refuses(isa, threads, &dims, &w, n, &bufs)?;
    }

    #[test]
    fn gdn_with_valid_geometry_refuses_huge_counts(big in huge(), bufs in proptest::collection::vec(buf(), 9),
                                                   threads in 0usize..4, isa in isa()) {
        // Valid geometry and weights (conv_dim 8, kernel 4); the token or sequence count is huge.
        let dims = GdnDims { key_heads: 1, value_heads: 2, key_dim: 2, value_dim: 2, conv_kernel: 4 };
        let (conv_weight, heads) = (vec![0.1f32; 32], vec![0.5f32; 2]);
        let w = GdnWeights { conv_weight: &conv_weight, a_log: &heads, dt_bias: &heads, norm_weight: &heads, norm_eps: 1e-6 };
        gdn_refuses(isa, threads, &dims, &w, big, &bufs)?;
    }

    #[test]
    fn sampling_never_panics(logits in proptest::collection::vec(prop_oneof![
                                 -50.0f32..50.0, Just(f32::NEG_INFINITY), Just(f32::INFINITY), Just(f32::NAN),
                                 Just(f32::MAX), Just(f32::MIN)], 0..6),
                             temperature in prop_oneof![Just(0.0f32), 1e-30f32..10.0, Just(f32::NAN), Just(-1.0)],
                             top_k in prop_oneof![0usize..8, huge()],
                             top_p in prop_oneof![0.0f32..1.5, Just(f32::NAN)], seed in 0u64..100) {
        let params = SamplingParams { temperature, top_k, top_p };
        let mut rng = Pcg32::new(seed, 1);
        match sampling::sample(&logits, &params, &mut rng) {
            Ok(tok) => prop_assert!(tok < logits.len()),
            Err(e) => {
                let shape = matches!(e, KernelError::Shape { .. });
                prop_assert!(shape, "{:?}", e);
            }
        }
        if let Ok(c) = sampling::candidates(&logits, &params) {
            prop_assert!(!c.is_empty());
            prop_assert!(c.iter().all(|&(t, p)| t < logits.len() && p.is_finite()), "{:?}", c);
        }
        let a = ops::argmax(&logits);
        prop_assert_eq!(a.is_ok(), !logits.is_empty() && logits.iter().all(|v| !v.is_nan()));
    }
}
