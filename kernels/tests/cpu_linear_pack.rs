//! Property tests of the chunked int4 packer: it round-trips bit-exactly, produces the same bytes as packing the
//! whole matrix at once, never holds more than one 64-row block, and the embedding gather reads rows straight from
//! the packed layout.

use kernels::linear::int4::BLOCK_N;
use kernels::linear::{Int4Scheme, Int4Weights};
use kernels::reference::linear as reference;
use proptest::prelude::*;

fn scheme(sym: bool) -> Int4Scheme {
    if sym {
        Int4Scheme::Symmetric
    } else {
        Int4Scheme::Asymmetric
    }
}

/// The reference quantiser of the scheme `sym` picks.
fn reference_quantized(
    w: &[f32],
    n: usize,
    k: usize,
    group: usize,
    sym: bool,
) -> reference::Int4Logical {
    if sym {
        reference::quantize_int4_sym(w, n, k, group)
    } else {
        reference::quantize_int4_asym(w, n, k, group)
    }
}

/// (n, k, group, weights): n and k deliberately range over values that are not multiples of 64 or the group.
fn matrix() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>)> {
    (
        1usize..200,
        1usize..300,
        prop::sample::select(vec![32usize, 64, 128]),
    )
        .prop_flat_map(|(n, k, g)| {
            (
                Just(n),
                Just(k),
                Just(g),
                prop::collection::vec(-4.0f32..4.0, n * k),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn pack_unpack_round_trips_bit_exactly((n, k, group, w) in matrix(), sym in any::<bool>()) {
        let logical = reference_quantized(&w, n, k, group, sym);
        let packed = Int4Weights::from_logical(&logical, scheme(sym)).unwrap();
        prop_assert_eq!(packed.to_logical(), logical);
    }

    #[test]
    fn chunked_pack_is_byte_identical_to_whole_matrix_pack((n, k, group, w) in matrix(), sym in any::<bool>()) {
        let whole = reference_quantized(&w, n, k, group, sym);
        let whole = Int4Weights::from_logical(&whole, scheme(sym)).unwrap();
        let chunked = Int4Weights::quantize(&w, n, k, group, scheme(sym)).unwrap();
        prop_assert_eq!(chunked.packed(), whole.packed());
        prop_assert_eq!(chunked.scales_zeros(), whole.scales_zeros());
    }

    #[test]
    fn gather_from_packed_equals_dequantised_rows((n, k, group, w) in matrix(), picks in prop::collection::vec(any::<u32>(), 1..8)) {
        let packed = Int4Weights::quantize(&w, n, k, group, Int4Scheme::Asymmetric).unwrap();
        let logical = packed.to_logical();
        let ids: Vec<u32> = picks.iter().map(|p| p % n as u32).collect();
        let mut out = vec![f32::NAN; ids.len() * k];
        packed.gather_rows(&ids, &mut out).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            for c in 0..k {
                prop_assert_eq!(f64::from(out[i * k + c]), logical.at(id as usize, c) as f32 as f64);
            }
        }
    }
}

#[test]
fn packer_holds_one_block_of_rows_at_a_time() {
    // A 1000 x 320 matrix: the packer must ask for rows 0..64, 64..128, ... 960..1000, in order, each once, in a
    // buffer of at most 64 * k floats (80 KiB here; 4.25 MiB for k = 17408 whatever n is).
    let (n, k) = (1000, 320);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut calls = Vec::new();
    let mut max_buf = 0;
    let packed = Int4Weights::quantize_with(n, k, 64, Int4Scheme::Asymmetric, |row0, buf| {
        calls.push((row0, buf.len() / k));
        max_buf = max_buf.max(buf.len());
        buf.copy_from_slice(&w[row0 * k..row0 * k + buf.len()]);
        Ok(())
    })
    .unwrap();
    assert!(
        max_buf <= BLOCK_N * k,
        "transient of {max_buf} floats exceeds one block ({})",
        BLOCK_N * k
    );
    let want: Vec<(usize, usize)> = (0..n.div_ceil(BLOCK_N))
        .map(|b| (b * BLOCK_N, BLOCK_N.min(n - b * BLOCK_N)))
        .collect();
    assert_eq!(calls, want);
    assert_eq!(
        packed,
        Int4Weights::quantize(&w, n, k, 64, Int4Scheme::Asymmetric).unwrap()
    );
}

#[test]
fn packed_layout_is_the_tinygemm_one() {
    // Pin the layout itself: column c of a block sits in byte c % 32 of its k-row, low nibble for c < 32. Build
    // codes from an index pattern and read the bytes directly.
    let (n, k, group) = (130, 4, 32);
    let codes: Vec<u8> = (0..n * k).map(|i| ((i / k) % 16) as u8).collect(); // code = row % 16
    let logical = reference::Int4Logical {
        n,
        k,
        group,
        codes,
        scales: vec![1.0; n],
        zeros: vec![0.5; n],
    };
    let p = Int4Weights::from_logical(&logical, Int4Scheme::Asymmetric).unwrap();
    assert_eq!(p.npad(), 192);
    assert_eq!(p.packed().len(), 3 * k * 32);
    for b in 0..3 {
        for kk in 0..k {
            for d in 0..32 {
                let byte = p.packed()[(b * k + kk) * 32 + d];
                let (lo_col, hi_col) = (b * 64 + d, b * 64 + d + 32);
                let code = |col: usize| if col < n { (col % 16) as u8 } else { 8 };
                assert_eq!(byte & 15, code(lo_col), "block {b} k {kk} byte {d} low");
                assert_eq!(byte >> 4, code(hi_col), "block {b} k {kk} byte {d} high");
            }
        }
    }
    // Padding columns decode to exactly zero (scale and zero 0), so a kernel that computes them reads nothing wrong.
    assert_eq!(p.scales_zeros()[2 * 131], 0);
    assert_eq!(p.scales_zeros()[2 * 131 + 1], 0);
}

#[test]
fn bf16_source_packs_like_its_f32_value() {
    // A bf16 checkpoint is converted one block at a time inside the packer; the result must be the packing of the
    // exactly converted f32 matrix.
    let (n, k) = (130, 200);
    let bits: Vec<u16> = (0..n * k)
        .map(|i| 0x3C00 | ((i * 2654435761usize) >> 7) as u16 & 0x80FF)
        .collect();
    let f: Vec<f32> = bits
        .iter()
        .map(|&b| kernels::formats::bf16_to_f32(b))
        .collect();
    for scheme in [Int4Scheme::Asymmetric, Int4Scheme::Symmetric] {
        let a = Int4Weights::quantize_bf16(&bits, n, k, 64, scheme).unwrap();
        assert_eq!(a, Int4Weights::quantize(&f, n, k, 64, scheme).unwrap());
    }
    assert!(Int4Weights::quantize_bf16(&bits[1..], n, k, 64, Int4Scheme::Asymmetric).is_err());
}

#[test]
fn from_raw_checks_sizes_and_the_symmetric_grid() {
    let (n, k, g) = (70, 96, 32);
    let packed = vec![0x88u8; 2 * k * 32];
    let sz = vec![0u16; 3 * 128 * 2];
    assert!(
        Int4Weights::from_raw(n, k, g, Int4Scheme::Symmetric, packed.clone(), sz.clone()).is_ok()
    );
    assert!(Int4Weights::from_raw(
        n,
        k,
        g,
        Int4Scheme::Asymmetric,
        packed[1..].to_vec(),
        sz.clone()
    )
    .is_err());
    assert!(Int4Weights::from_raw(
        n,
        k,
        g,
        Int4Scheme::Asymmetric,
        packed.clone(),
        sz[1..].to_vec()
    )
    .is_err());
    assert!(
        Int4Weights::from_raw(n, k, 48, Int4Scheme::Asymmetric, packed.clone(), sz.clone())
            .is_err()
    );
    let mut nonzero = sz.clone();
    nonzero[1] = 0x3F80; // zero = 1.0
    assert!(Int4Weights::from_raw(
        n,
        k,
        g,
        Int4Scheme::Asymmetric,
        packed.clone(),
        nonzero.clone()
    )
    .is_ok());
    let err = Int4Weights::from_raw(n, k, g, Int4Scheme::Symmetric, packed, nonzero).unwrap_err();
    assert!(err.to_string().contains("symmetric"), "{err}");
}
