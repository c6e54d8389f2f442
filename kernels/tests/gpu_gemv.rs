//! The decode GEMVs beyond `KernelPath` (issue 4: the NVFP4 decode path `Gpu::nvfp4_repack_tiles` +
//! `Gpu::nvfp4_gemv_tiles` and its variants `Gpu::nvfp4_gemv_tiles_variant`, `Gpu::nvfp4_gemv_tiles_split` and
//! `Gpu::nvfp4_gemv_tiles_m1`,
//! `Gpu::fp8_block_gemv_with_scratch`, the fused decode steps `Gpu::rmsnorm_fp8_fragments` /
//! `Gpu::silu_and_mul_fp8_fragments` / `gelu_and_mul_fp8_fragments` + `Gpu::fp8_gemv_tiles_fragments` and their
//! NVFP4 twins (`Gpu::rmsnorm_nvfp4_fragments`, ... + `Gpu::nvfp4_gemv_tiles_fragments`; the one-call steps
//! `Gpu::rmsnorm_nvfp4_gemv`, `Gpu::silu_and_mul_nvfp4_gemv`, `gelu_and_mul_nvfp4_gemv`), and the variants
//! `Gpu::fp8_block_gemv_preconverted`,
//! `Gpu::fp8_block_gemv_split` and `Gpu::nvfp4_gemv_preconverted`) against
//! `kernels::reference::linear`: fresh random inputs each run (the seed is
//! printed), every m from 1 to 16, n not a multiple of the 16-row tile or of two rows per warp, k at the constraint
//! (FP8: k % 16 == 0, not a multiple of 32 or 128; NVFP4: k % 32 == 0, not a multiple of 128), outputs and scratch
//! poisoned before the launch (NaN outputs fail as unwritten), stated error bounds. The messages name the variant,
//! the shape and, on a wrong element, its index.
//!
//! Without a CUDA device (or without the `cuda` feature) each test prints "skipped: no CUDA device". Small enough
//! for `compute-sanitizer --tool memcheck|racecheck` in seconds.

//!
//! Most tests here compare the `Auto` calls against the lab variants (or drive a variant), so the file builds with
//! the `lab` feature only; `.ci/run` runs it with `--features cuda,lab`.
#![cfg(feature = "lab")]

use kernels::cuda::{Fp8Fragments, Gpu, GpuBuffer, MmaSplit, Nvfp4Fragments};
use kernels::ops::NormWeight;
use kernels::reference;

mod gpu_common;
use gpu_common::{bf16_activations, gpu, rel_err, rng, uniform};

/// fp32 accumulation of exact products (e4m3 or e2m1 x e4m3 scale, and bf16 activations, are exact in f16 over the
/// test's ranges) against the f64 reference: the error is the rounding of fp32 partial sums, ~1e-7 relative; 2e-5
/// leaves room without hiding a wrong element (one wrong 16-value group moves the norm by > 1e-3 at these sizes).
const TOL: f64 = 2e-5;

/// Checks `got` against `want` and, on failure, names the worst element (token, row).
fn check(what: &str, got: &[f32], want: &[f32], n: usize) {
    let e = rel_err(what, got, want);
    if e >= TOL {
        let (i, d) = got
            .iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs())
            .enumerate()
            .fold((0, 0.0f32), |a, (i, d)| if d > a.1 { (i, d) } else { a });
        panic!(
            "{what}: relative error {e:e} >= {TOL:e}; worst element token {} row {}: got {}, expected {} (|diff| {d})",
            i / n,
            i % n,
            got[i],
            want[i]
        );
    }
}

/// A scratch buffer of `len` words filled with garbage (f16 NaN pairs), so a fragment the pre-kernel does not
/// write poisons the product.
fn poisoned_scratch(gpu: &Gpu, len: usize) -> kernels::cuda::GpuBuffer<u32> {
    gpu.upload(&vec![0x7e00_7e00u32; len]).unwrap()
}

#[test]
fn fp8_preconverted_activations_match_the_reference_for_every_m() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_block_gemv_preconverted");
    for &(n, k) in &[(300, 400), (33, 1040), (129, 16), (17, 2064)] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (codes, scales) = reference::linear::quantize_fp8_block(&w, n, k);
        let (dw, ds) = (gpu.upload(&codes).unwrap(), gpu.upload(&scales).unwrap());
        for m in 1..=16 {
            let (xb, xf) = bf16_activations(&mut rng, m * k);
            let want = reference::linear::fp8_block_linear(&xf, m, &codes, &scales, n, k);
            let dx = gpu.upload(&xb).unwrap();
            // One word more than needed: the length check is ">=".
            let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k) + 1);
            let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_block_gemv_preconverted(&dx, &dw, &ds, &mut dy, &mut scratch, m, n, k)
                .unwrap();
            let got = gpu.download(&dy).unwrap();
            check(
                &format!("fp8 preconverted m={m} n={n} k={k}"),
                &got,
                &want,
                n,
            );
        }
    }
}

#[test]
fn nvfp4_preconverted_and_tile_layout_match_the_reference_for_every_m() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_gemv_variants");
    for &(n, k) in &[(300, 544), (33, 32), (129, 1056), (17, 2080)] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (packed, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
        let (dw, ds) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales).unwrap());
        let tiles = gpu.nvfp4_repack_tiles(&dw, &ds, n, k).unwrap();
        assert_eq!((tiles.n(), tiles.k()), (n, k));
        let chunks = n.div_ceil(16) * k.div_ceil(128);
        assert_eq!(tiles.device_bytes(), chunks * (1024 + 128), "n={n} k={k}");
        for m in 1..=16 {
            let (xb, xf) = bf16_activations(&mut rng, m * k);
            let want = reference::linear::nvfp4_linear(&xf, m, &packed, &scales, global, n, k);
            let dx = gpu.upload(&xb).unwrap();
            let len = Gpu::gemv_scratch_len(m, k);
            let what = |v: &str| format!("nvfp4 {v} m={m} n={n} k={k}");

            let mut scratch = poisoned_scratch(&gpu, len);
            let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.nvfp4_gemv_preconverted(&dx, &dw, &ds, global, &mut dy, &mut scratch, m, n, k)
                .unwrap();
            check(&what("preconverted"), &gpu.download(&dy).unwrap(), &want, n);

            let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.nvfp4_gemv_tiles_variant(&dx, &tiles, global, &mut dy, None, m, 1)
                .unwrap();
            check(
                &what("tiles, activations converted in the GEMV"),
                &gpu.download(&dy).unwrap(),
                &want,
                n,
            );

            // Auto (the decode path).
            let mut scratch = poisoned_scratch(&gpu, len);
            let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.nvfp4_gemv_tiles(&dx, &tiles, global, &mut dy, &mut scratch, m)
                .unwrap();
            check(&what("tiles, Auto"), &gpu.download(&dy).unwrap(), &want, n);

            // K splits; 16 splits of k = 32 or 544 (1 or 5 chunks) leave most ranges empty.
            for splits in [1, 2, 3, 16] {
                let mut scratch = poisoned_scratch(&gpu, len);
                let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
                gpu.nvfp4_gemv_tiles_variant(
                    &dx,
                    &tiles,
                    global,
                    &mut dy,
                    Some(&mut scratch),
                    m,
                    splits,
                )
                .unwrap();
                check(
                    &what(&format!("tiles + preconverted, {splits} K split(s)")),
                    &gpu.download(&dy).unwrap(),
                    &want,
                    n,
                );
            }
        }
    }
}

/// The repacked weights reproduce the checkpoint-layout kernel bit for bit: same decode, same order of the
/// additions, so any difference is a misplaced byte or scale. The variant with one split runs
/// `nvfp4_gemv_tiles_n{8,16}_u1`, `Auto` at m > 8 `nvfp4_gemv_mma_tile_pre_n16` (both compared here; `Auto`'s
/// `_pre_n8` in the tall-matrix test below). Larger n with a ragged last tile. Two K splits give the same bits on
/// every run (0 + a + b in either order).
#[test]
fn nvfp4_tile_layout_matches_the_checkpoint_layout_exactly() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_tiles_exact");
    let (n, k) = (1000, 1184);
    let w = uniform(&mut rng, n * k, 0.05);
    let (packed, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
    let (dw, ds) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales).unwrap());
    let tiles = gpu.nvfp4_repack_tiles(&dw, &ds, n, k).unwrap();
    for m in [1, 8, 9, 16] {
        let (xb, _) = bf16_activations(&mut rng, m * k);
        let dx = gpu.upload(&xb).unwrap();
        let mut s1 = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
        let mut s2 = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
        let mut y1 = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
        gpu.nvfp4_gemv_preconverted(&dx, &dw, &ds, global, &mut y1, &mut s1, m, n, k)
            .unwrap();
        let a = gpu.download(&y1).unwrap();
        let mut y2 = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
        gpu.nvfp4_gemv_tiles_variant(&dx, &tiles, global, &mut y2, Some(&mut s2), m, 1)
            .unwrap();
        let b = gpu.download(&y2).unwrap();
        assert_same_bits(&format!("m={m} n={n} k={k}, tile layout"), &a, &b, n);
        if m > 8 {
            let mut s3 = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
            let mut y3 = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.nvfp4_gemv_tiles(&dx, &tiles, global, &mut y3, &mut s3, m)
                .unwrap();
            let c = gpu.download(&y3).unwrap();
            assert_same_bits(&format!("m={m} n={n} k={k}, tile layout, Auto"), &a, &c, n);
        }
        let mut runs = Vec::new();
        for _ in 0..3 {
            let mut y3 = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.nvfp4_gemv_tiles_variant(&dx, &tiles, global, &mut y3, Some(&mut s2), m, 2)
                .unwrap();
            runs.push(gpu.download(&y3).unwrap());
        }
        for r in &runs[1..] {
            for (i, (p, q)) in runs[0].iter().zip(r).enumerate() {
                assert!(
                    p.to_bits() == q.to_bits(),
                    "m={m} n={n} k={k}, 2 K splits: token {} row {} differs between runs: {p} vs {q}",
                    i / n,
                    i % n
                );
            }
        }
    }
}

/// The m = 1 kernel (`Gpu::nvfp4_gemv_tiles_m1`, `nvfp4_gemv_tiles_m1_w{4,8}`; `Auto` at m = 1 on up to 8192 rows
/// , so the small shapes' `Auto` checks above run it too)
/// applies the group scales after the mma, with the chunk's 8 groups as the mma's columns: a misplaced group,
/// scale byte or activation lane shows against the reference. Every cut (4 and 8 warps per tile, 1, 2, 3 and 16 K
/// splits, most of the 16 empty at these k), ragged n and k (one partial chunk, k = 32 a quarter chunk), outputs
/// and scratch poisoned; two K splits repeat bit for bit.
#[test]
fn nvfp4_m1_kernel_matches_the_reference_for_every_cut() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_gemv_tiles_m1");
    for &(n, k) in &[(300, 544), (33, 32), (129, 1056), (17, 2080), (1000, 1184)] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (packed, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
        let (dw, ds) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales).unwrap());
        let tiles = gpu.nvfp4_repack_tiles(&dw, &ds, n, k).unwrap();
        let (xb, xf) = bf16_activations(&mut rng, k);
        let want = reference::linear::nvfp4_linear(&xf, 1, &packed, &scales, global, n, k);
        let dx = gpu.upload(&xb).unwrap();
        for warps in [4, 8] {
            for splits in [1, 2, 3, 16] {
                let what =
                    format!("nvfp4 m = 1 kernel, {warps} warps, {splits} K split(s), n={n} k={k}");
                let mut runs = Vec::new();
                for _ in 0..if splits == 2 { 3 } else { 1 } {
                    let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(1, k));
                    let mut dy = gpu.upload(&vec![f32::NAN; n]).unwrap();
                    gpu.nvfp4_gemv_tiles_m1(
                        &dx,
                        &tiles,
                        global,
                        &mut dy,
                        &mut scratch,
                        warps,
                        splits,
                    )
                    .unwrap();
                    runs.push(gpu.download(&dy).unwrap());
                }
                check(&what, &runs[0], &want, n);
                for r in &runs[1..] {
                    assert_same_bits(&format!("{what}, repeated"), &runs[0], r, n);
                }
            }
        }
    }
}

/// Panics at the first element whose bits differ between the checkpoint-layout kernel's output (`want`) and `got`.
fn assert_same_bits(what: &str, want: &[f32], got: &[f32], n: usize) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    for (i, (p, q)) in want.iter().zip(got).enumerate() {
        assert!(
            p.to_bits() == q.to_bits(),
            "{what}: token {} row {}: checkpoint layout {p}, got {q}",
            i / n,
            i % n
        );
    }
}

/// `Auto` on more than 8192 rows: one K split at every m, so the 8-warp `nvfp4_gemv_mma_tile_pre_n*_w8c1` runs on
/// 8200 rows (every m) and at m <= 8 the 4-warp `nvfp4_gemv_mma_tile_pre_n8_w4c1` on 65552 (the
/// 5120-row tests above take two splits there). Both leave a half tile, k = 160 one full and one partial
/// 128-value chunk. Against the reference, and bit for bit against the checkpoint layout where the same 8 warps
/// add the chunks.
#[test]
fn nvfp4_tiles_auto_on_tall_matrices_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_tiles_auto_tall");
    for (n, k) in [(8200, 160), (65552, 160)] {
        nvfp4_tiles_auto_case(&gpu, &mut rng, n, k);
    }
}

fn nvfp4_tiles_auto_case(gpu: &Gpu, rng: &mut rand_chacha::ChaCha8Rng, n: usize, k: usize) {
    let w = uniform(rng, n * k, 0.05);
    let (packed, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
    let (dw, ds) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales).unwrap());
    let tiles = gpu.nvfp4_repack_tiles(&dw, &ds, n, k).unwrap();
    for m in [1, 3, 8, 9, 16] {
        let (xb, xf) = bf16_activations(rng, m * k);
        let want = reference::linear::nvfp4_linear(&xf, m, &packed, &scales, global, n, k);
        let dx = gpu.upload(&xb).unwrap();
        let mut scratch = poisoned_scratch(gpu, Gpu::gemv_scratch_len(m, k));
        let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
        gpu.nvfp4_gemv_tiles(&dx, &tiles, global, &mut dy, &mut scratch, m)
            .unwrap();
        let got = gpu.download(&dy).unwrap();
        check(
            &format!("nvfp4 tiles, Auto, m={m} n={n} k={k}"),
            &got,
            &want,
            n,
        );
        if m <= 8 && n >= 65536 {
            continue; // 4 warps per tile: the same products, added in another order
        }
        let mut scratch = poisoned_scratch(gpu, Gpu::gemv_scratch_len(m, k));
        let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
        gpu.nvfp4_gemv_preconverted(&dx, &dw, &ds, global, &mut dy, &mut scratch, m, n, k)
            .unwrap();
        let ckpt = gpu.download(&dy).unwrap();
        assert_same_bits(&format!("m={m} n={n} k={k}, tiles Auto"), &ckpt, &got, n);
    }
}

#[test]
fn fp8_with_scratch_and_tiles_match_the_reference_for_every_m() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_block_gemv_with_scratch");
    let all: Vec<usize> = (1..=16).collect();
    // Every cut fp8_split_auto picks: n <= 8192 runs w8c2 (m <= 8) and w4c3 (m >= 9); 65540 rows (a ragged tile
    // and scale block) w4c1, and m = 1 the unsplit CUDA-core kernel there. The tile layout's Auto
    // (fp8_tiles_auto): the m = 1 CUDA-core kernel (w8c2 up to 8192 rows, w8c1 above); w8c2 up to 8192 rows, the
    // converting w8c1 on 8200 at m = 2..=8, w4c1 at m >= 9, the preconverted w8c1 on 65540 at m = 2..=8.
    for (n, k, ms) in [
        (300, 400, all.clone()),
        (17, 2064, all),
        (8200, 160, vec![1, 4, 8, 9, 16]),
        (65540, 48, vec![1, 2, 5, 8, 9]),
    ] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (codes, scales) = reference::linear::quantize_fp8_block(&w, n, k);
        let (dw, ds) = (gpu.upload(&codes).unwrap(), gpu.upload(&scales).unwrap());
        let tiles = gpu.fp8_repack_tiles(&dw, n, k).unwrap();
        for m in ms {
            let (xb, xf) = bf16_activations(&mut rng, m * k);
            let want = reference::linear::fp8_block_linear(&xf, m, &codes, &scales, n, k);
            let dx = gpu.upload(&xb).unwrap();
            let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
            let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_block_gemv_with_scratch(&dx, &dw, &ds, &mut dy, &mut scratch, m, n, k)
                .unwrap();
            check(
                &format!("fp8 with scratch (Auto) m={m} n={n} k={k}"),
                &gpu.download(&dy).unwrap(),
                &want,
                n,
            );
            let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
            let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_gemv_tiles(&dx, &tiles, &ds, &mut dy, &mut scratch, m)
                .unwrap();
            check(
                &format!("fp8 tiles (Auto) m={m} n={n} k={k}"),
                &gpu.download(&dy).unwrap(),
                &want,
                n,
            );
        }
    }
}

/// The m = 1 CUDA-core FP8 GEMV with K split over 1, 2 and 4 warps per row pair, against the reference: k = 400
/// (one partial 512-byte part: the other warps of a pair get nothing), 2064 (parts of 1536 + 528 at split 2, the
/// last 16-byte chunk alone in its scale block), 9216; n = 300 and 17 leave partial blocks and row pairs, 16400
/// a taller grid. `Auto` runs the two-way split as a programmatic dependent on all of them. NaN-poisoned outputs.
#[test]
fn fp8_m1_k_splits_match_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_m1_ksplit");
    for (n, k) in [
        (300, 400),
        (17, 2064),
        (300, 9216),
        (8200, 2064),
        (16400, 528),
    ] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (codes, scales) = reference::linear::quantize_fp8_block(&w, n, k);
        let (dw, ds) = (gpu.upload(&codes).unwrap(), gpu.upload(&scales).unwrap());
        let (xb, xf) = bf16_activations(&mut rng, k);
        let want = reference::linear::fp8_block_linear(&xf, 1, &codes, &scales, n, k);
        let dx = gpu.upload(&xb).unwrap();
        for ksplit in [1, 2, 4] {
            let mut dy = gpu.upload(&vec![f32::NAN; n]).unwrap();
            gpu.fp8_block_gemv_m1_ksplit(&dx, &dw, &ds, &mut dy, n, k, ksplit)
                .unwrap();
            check(
                &format!("fp8 m=1 n={n} k={k} ksplit={ksplit}"),
                &gpu.download(&dy).unwrap(),
                &want,
                n,
            );
        }
        let mut dy = gpu.upload(&vec![f32::NAN; n]).unwrap();
        gpu.fp8_block_gemv(&dx, &dw, &ds, &mut dy, 1, n, k).unwrap();
        check(
            &format!("fp8 m=1 n={n} k={k} Auto"),
            &gpu.download(&dy).unwrap(),
            &want,
            n,
        );
    }
    let (n, k) = (17, 2064);
    let dx = gpu.upload(&vec![0u16; k]).unwrap();
    let dw = gpu.upload(&vec![0u8; n * k]).unwrap();
    let ds = gpu.upload(&[1.0f32; 17]).unwrap();
    let mut dy = gpu.zeros::<f32>(n).unwrap();
    let e = gpu
        .fp8_block_gemv_m1_ksplit(&dx, &dw, &ds, &mut dy, n, k, 3)
        .unwrap_err();
    assert!(e.to_string().contains("ksplit must be 1, 2 or 4"), "{e}");
}

/// Every cut of the tensor-core GEMVs over preconverted activations (`Gpu::fp8_block_gemv_split`, its tile layout
/// `Gpu::fp8_gemv_tiles_split` and, where built, `Gpu::fp8_gemv_tiles_converting` (bit for bit the same), at
/// m = 1 the CUDA-core `Gpu::fp8_gemv_tiles_m1`, `Gpu::nvfp4_gemv_tiles_split`: every built (warps, blocks of a cluster per tile), plain or programmatic
/// launches) against the reference, and the same bits on a second run. The shapes give every split an uneven
/// share of the 128-wide chunks, and some blocks none (k = 160: 2 chunks for 3 splits).
#[test]
fn mma_splits_match_the_reference_and_repeat_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("mma_splits");
    // Every built cut, plain and as programmatic dependents.
    let splits: Vec<MmaSplit> = MmaSplit::BUILT
        .iter()
        .flat_map(|&(warps, splits)| [false, true].map(|pdl| MmaSplit { warps, splits, pdl }))
        .collect();
    for &(n, k) in &[(300, 416), (33, 1056), (17, 2080), (129, 160)] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (codes, scales8) = reference::linear::quantize_fp8_block(&w, n, k);
        let (dw8, ds8) = (gpu.upload(&codes).unwrap(), gpu.upload(&scales8).unwrap());
        let (packed, scales4, global) = reference::linear::quantize_nvfp4(&w, n, k);
        let (dw4, ds4) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales4).unwrap());
        let tiles = gpu.nvfp4_repack_tiles(&dw4, &ds4, n, k).unwrap();
        let tiles8 = gpu.fp8_repack_tiles(&dw8, n, k).unwrap();
        for m in [1, 3, 8, 9, 16] {
            let (xb, xf) = bf16_activations(&mut rng, m * k);
            let want8 = reference::linear::fp8_block_linear(&xf, m, &codes, &scales8, n, k);
            let want4 = reference::linear::nvfp4_linear(&xf, m, &packed, &scales4, global, n, k);
            let dx = gpu.upload(&xb).unwrap();
            for &split in &splits {
                let what = format!("m={m} n={n} k={k} {split:?}");
                let mut runs = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
                for run in 0..2 {
                    let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
                    let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
                    gpu.fp8_block_gemv_split(
                        &dx,
                        &dw8,
                        &ds8,
                        &mut dy,
                        &mut scratch,
                        m,
                        n,
                        k,
                        split,
                    )
                    .unwrap();
                    runs[run] = gpu.download(&dy).unwrap();
                    let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
                    let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
                    gpu.nvfp4_gemv_tiles_split(
                        &dx,
                        &tiles,
                        global,
                        &mut dy,
                        &mut scratch,
                        m,
                        split,
                    )
                    .unwrap();
                    runs[2 + run] = gpu.download(&dy).unwrap();
                }
                let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
                let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
                gpu.fp8_gemv_tiles_split(&dx, &tiles8, &ds8, &mut dy, &mut scratch, m, split)
                    .unwrap();
                let tiled = gpu.download(&dy).unwrap();
                assert_same_bits(&format!("fp8 tile layout {what}"), &runs[0], &tiled, n);
                if MmaSplit::BUILT_CONVERTING.contains(&(split.warps, split.splits)) {
                    let mut dy = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
                    gpu.fp8_gemv_tiles_converting(&dx, &tiles8, &ds8, &mut dy, m, split)
                        .unwrap();
                    let conv = gpu.download(&dy).unwrap();
                    assert_same_bits(&format!("fp8 tiles converting {what}"), &runs[0], &conv, n);
                }
                check(&format!("fp8 split {what}"), &runs[0], &want8, n);
                if m == 1 {
                    let mut dy = gpu.upload(&vec![f32::NAN; n]).unwrap();
                    gpu.fp8_gemv_tiles_m1(&dx, &tiles8, &ds8, &mut dy, split)
                        .unwrap();
                    let once = gpu.download(&dy).unwrap();
                    check(&format!("fp8 tiles m = 1 {what}"), &once, &want8, n);
                    gpu.fp8_gemv_tiles_m1(&dx, &tiles8, &ds8, &mut dy, split)
                        .unwrap();
                    let twice = gpu.download(&dy).unwrap();
                    assert_same_bits(
                        &format!("fp8 tiles m = 1 {what}, second run"),
                        &once,
                        &twice,
                        n,
                    );
                }
                check(&format!("nvfp4 split {what}"), &runs[2], &want4, n);
                assert_same_bits(
                    &format!("fp8 split {what}, second run"),
                    &runs[0],
                    &runs[1],
                    n,
                );
                assert_same_bits(
                    &format!("nvfp4 split {what}, second run"),
                    &runs[2],
                    &runs[3],
                    n,
                );
            }
        }
    }
}

/// `Gpu::rmsnorm_fp8_fragments` + `Gpu::fp8_gemv_tiles_fragments` (the decode step without the fragment kernel)
/// against `Gpu::rmsnorm` / `Gpu::add_rmsnorm` + `Gpu::fp8_gemv_tiles_split` with the same cut, bit for bit: the
/// fragments are the bf16 norm output converted exactly as the GEMV's own fragment kernel converts it, so any
/// difference is a misplaced value. Both weight forms, with and without the residual add (whose written-back
/// residual must match too), m from 1 to 16 (one and two fragment tiles), k not a multiple of 128 (the last
/// chunk's values past k zeroed by the norm), n on both sides of the 8192-row cut switch; the fragment buffer is
/// poisoned first, so an entry the GEMV reads and the norm does not write shows as NaN.
#[test]
fn rmsnorm_fragments_feed_the_fp8_gemv_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("rmsnorm_fp8_fragments");
    for &(n, k) in &[(300, 416), (9000, 160), (33, 2080)] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (codes, scales8) = reference::linear::quantize_fp8_block(&w, n, k);
        let (dw8, ds8) = (gpu.upload(&codes).unwrap(), gpu.upload(&scales8).unwrap());
        let tiles8 = gpu.fp8_repack_tiles(&dw8, n, k).unwrap();
        let norm_w = gpu.upload(&uniform(&mut rng, k, 0.5)).unwrap();
        for (m, form, with_residual) in [
            (1, NormWeight::Plain, false),
            (2, NormWeight::OnePlus, true),
            (7, NormWeight::Plain, true),
            (8, NormWeight::OnePlus, false),
            (9, NormWeight::Plain, false),
            (16, NormWeight::OnePlus, true),
        ] {
            let what = format!("m={m} n={n} k={k} {form:?} residual={with_residual}");
            let x = gpu.upload(&uniform(&mut rng, m * k, 2.0)).unwrap();
            let res0 = uniform(&mut rng, m * k, 1.0);
            // Reference path: the bf16 norm, then the GEMV that converts it, cut as fp8_gemv_tiles_fragments cuts.
            let mut xb = gpu.zeros::<u16>(m * k).unwrap();
            let mut res_a = gpu.upload(&res0).unwrap();
            if with_residual {
                gpu.add_rmsnorm(&x, &mut res_a, &norm_w, form, 1e-6, &mut xb)
                    .unwrap();
            } else {
                gpu.rmsnorm(&x, &norm_w, form, 1e-6, &mut xb).unwrap();
            }
            let split = MmaSplit::fp8_fragments(m, n);
            let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
            let mut ya = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_gemv_tiles_split(&xb, &tiles8, &ds8, &mut ya, &mut scratch, m, split)
                .unwrap();
            let want = gpu.download(&ya).unwrap();
            assert!(
                want.iter().all(|v| v.is_finite()),
                "{what}: reference path not finite"
            );
            // The fused path.
            let mut frags = Fp8Fragments::new(poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k)));
            let mut res_b = gpu.upload(&res0).unwrap();
            gpu.rmsnorm_fp8_fragments(
                &x,
                with_residual.then_some(&mut res_b),
                &norm_w,
                form,
                1e-6,
                &mut frags,
            )
            .unwrap();
            let mut yb = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_gemv_tiles_fragments(&frags, &tiles8, &ds8, &mut yb, m)
                .unwrap();
            assert_same_bits(
                &format!("fused norm + fragments GEMV {what}"),
                &want,
                &gpu.download(&yb).unwrap(),
                n,
            );
            if with_residual {
                assert_same_bits(
                    &format!("written-back residual {what}"),
                    &gpu.download(&res_a).unwrap(),
                    &gpu.download(&res_b).unwrap(),
                    k,
                );
            }
        }
    }
}

/// `Gpu::silu_and_mul_fp8_fragments` / `gelu_and_mul_fp8_fragments` + `Gpu::fp8_gemv_tiles_fragments` against `Gpu::silu_and_mul` / `Gpu::gelu_and_mul` +
/// `Gpu::fp8_gemv_tiles_split` with the same cut, bit for bit (as the norm test above): m from 1 to 16, `inter`
/// not a multiple of 128 (the last chunk's padding zeroed by the activation kernel) and the down projection's
/// 17408 (17 grid columns of 1024), poisoned fragments.
#[test]
fn glu_fragments_feed_the_fp8_gemv_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("glu_fp8_fragments");
    for &(n, inter) in &[(40, 160), (24, 17408), (300, 2080)] {
        let w = uniform(&mut rng, n * inter, 0.05);
        let (codes, scales8) = reference::linear::quantize_fp8_block(&w, n, inter);
        let (dw8, ds8) = (gpu.upload(&codes).unwrap(), gpu.upload(&scales8).unwrap());
        let tiles8 = gpu.fp8_repack_tiles(&dw8, n, inter).unwrap();
        for (m, gelu) in [(1, false), (4, true), (8, false), (9, true), (16, false)] {
            let what = format!("m={m} n={n} inter={inter} gelu={gelu}");
            let gate_up = gpu.upload(&uniform(&mut rng, m * 2 * inter, 3.0)).unwrap();
            let mut act = gpu.zeros::<u16>(m * inter).unwrap();
            if gelu {
                gpu.gelu_and_mul(&gate_up, inter, &mut act).unwrap();
            } else {
                gpu.silu_and_mul(&gate_up, inter, &mut act).unwrap();
            }
            let split = MmaSplit::fp8_fragments(m, n);
            let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, inter));
            let mut ya = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_gemv_tiles_split(&act, &tiles8, &ds8, &mut ya, &mut scratch, m, split)
                .unwrap();
            let want = gpu.download(&ya).unwrap();
            assert!(
                want.iter().all(|v| v.is_finite()),
                "{what}: reference path not finite"
            );
            let mut frags =
                Fp8Fragments::new(poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, inter)));
            if gelu {
                gpu.gelu_and_mul_fp8_fragments(&gate_up, inter, &mut frags)
                    .unwrap();
            } else {
                gpu.silu_and_mul_fp8_fragments(&gate_up, inter, &mut frags)
                    .unwrap();
            }
            let mut yb = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.fp8_gemv_tiles_fragments(&frags, &tiles8, &ds8, &mut yb, m)
                .unwrap();
            assert_same_bits(
                &format!("fused activation + fragments GEMV {what}"),
                &want,
                &gpu.download(&yb).unwrap(),
                n,
            );
        }
    }
}

/// The NVFP4 fused decode steps: `Gpu::rmsnorm_nvfp4_fragments` (with and without the residual add, both weight
/// forms), `Gpu::silu_and_mul_nvfp4_fragments` and `gelu_and_mul_nvfp4_fragments`, each followed by
/// `Gpu::nvfp4_gemv_tiles_fragments`, against the CPU reference on the bf16 output of the unfused producer
/// (`Gpu::rmsnorm`, `Gpu::add_rmsnorm`, `Gpu::silu_and_mul`, `Gpu::gelu_and_mul`, downloaded) and against the unfused
/// step (that output + `Gpu::nvfp4_gemv_tiles`): the same products, only the cluster cuts (m <= 8 on up to 8192
/// rows, the m = 1 cluster kernel) add the K halves in another order, so the two agree to a few ulps (1e-6
/// relative) and a misplaced fragment value shows at once. m from 1 to 16, k not a multiple of 128 (the norm
/// zeroes the last chunk's tail), n on both sides of the 8192-row cut; poisoned fragments and outputs; a second
/// fused run bit for bit (the cluster sums are deterministic). The written-back residual matches the unfused one.
/// And the one-call steps (`Gpu::rmsnorm_nvfp4_gemv`, `silu_and_mul_nvfp4_gemv`, `gelu_and_mul_nvfp4_gemv`: the
/// producer zeroes y where `Auto`'s kernel adds K splits into it): bit for bit the unfused step, twice, the first
/// time into a NaN-poisoned y, the second into the y the first wrote (an unzeroed y would show either way).
#[test]
fn producer_fragments_feed_the_nvfp4_gemv() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_fragments");
    let bf16_to_f32 = |v: &[u16]| -> Vec<f32> {
        v.iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect()
    };
    for &(n, k) in &[(300, 416), (9000, 160), (33, 2080)] {
        let w = uniform(&mut rng, n * k, 0.05);
        let (packed, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
        let (dw, ds) = (gpu.upload(&packed).unwrap(), gpu.upload(&scales).unwrap());
        let tiles = gpu.nvfp4_repack_tiles(&dw, &ds, n, k).unwrap();
        let norm_w = gpu.upload(&uniform(&mut rng, k, 0.5)).unwrap();
        for (m, producer) in [
            (1, "norm"),
            (1, "silu"),
            (2, "add_norm_oneplus"),
            (7, "gelu"),
            (8, "norm"),
            (9, "add_norm_oneplus"),
            (16, "silu"),
        ] {
            let what = format!("{producer} m={m} n={n} k={k}");
            let form = if producer.ends_with("oneplus") {
                NormWeight::OnePlus
            } else {
                NormWeight::Plain
            };
            let x = gpu.upload(&uniform(&mut rng, m * k, 2.0)).unwrap();
            let gate_up = gpu.upload(&uniform(&mut rng, m * 2 * k, 3.0)).unwrap();
            let res0 = uniform(&mut rng, m * k, 1.0);
            // The unfused producer's bf16 output, then the GEMV that converts it.
            let mut xb = gpu.zeros::<u16>(m * k).unwrap();
            let mut res_a = gpu.upload(&res0).unwrap();
            match producer {
                "silu" => gpu.silu_and_mul(&gate_up, k, &mut xb).unwrap(),
                "gelu" => gpu.gelu_and_mul(&gate_up, k, &mut xb).unwrap(),
                "norm" => gpu.rmsnorm(&x, &norm_w, form, 1e-6, &mut xb).unwrap(),
                _ => gpu
                    .add_rmsnorm(&x, &mut res_a, &norm_w, form, 1e-6, &mut xb)
                    .unwrap(),
            }
            let xs = bf16_to_f32(&gpu.download(&xb).unwrap());
            let want = reference::linear::nvfp4_linear(&xs, m, &packed, &scales, global, n, k);
            let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
            let mut ya = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            gpu.nvfp4_gemv_tiles(&xb, &tiles, global, &mut ya, &mut scratch, m)
                .unwrap();
            let unfused = gpu.download(&ya).unwrap();
            // The fused step, twice.
            let mut runs = Vec::new();
            let mut res_b = gpu.upload(&res0).unwrap();
            for _ in 0..2 {
                // Each run from the same residual.
                res_b = gpu.upload(&res0).unwrap();
                let mut frags =
                    Nvfp4Fragments::new(poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k)));
                match producer {
                    "silu" => gpu
                        .silu_and_mul_nvfp4_fragments(&gate_up, k, &mut frags)
                        .unwrap(),
                    "gelu" => gpu
                        .gelu_and_mul_nvfp4_fragments(&gate_up, k, &mut frags)
                        .unwrap(),
                    "norm" => gpu
                        .rmsnorm_nvfp4_fragments(&x, None, &norm_w, form, 1e-6, &mut frags)
                        .unwrap(),
                    _ => gpu
                        .rmsnorm_nvfp4_fragments(
                            &x,
                            Some(&mut res_b),
                            &norm_w,
                            form,
                            1e-6,
                            &mut frags,
                        )
                        .unwrap(),
                }
                assert_eq!(frags.written(), Some((m, k)), "{what}: the record");
                let mut yb = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
                gpu.nvfp4_gemv_tiles_fragments(&frags, &tiles, global, &mut yb, m)
                    .unwrap();
                runs.push(gpu.download(&yb).unwrap());
            }
            // The step (producer zeroing y where the GEMV adds K splits, then Auto's own kernel): bit for bit the
            // unfused path, into a poisoned y and again into the y it wrote (so the zeroing is real), the
            // fragments left for the next GEMV.
            let mut yc = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
            let mut frags =
                Nvfp4Fragments::new(poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k)));
            for run in 0..2 {
                let mut res_c = gpu.upload(&res0).unwrap();
                match producer {
                    "silu" => {
                        gpu.silu_and_mul_nvfp4_gemv(&gate_up, &mut frags, &tiles, global, &mut yc)
                    }
                    "gelu" => {
                        gpu.gelu_and_mul_nvfp4_gemv(&gate_up, &mut frags, &tiles, global, &mut yc)
                    }
                    "norm" => gpu.rmsnorm_nvfp4_gemv(
                        &x, None, &norm_w, form, 1e-6, &mut frags, &tiles, global, &mut yc,
                    ),
                    _ => gpu.rmsnorm_nvfp4_gemv(
                        &x,
                        Some(&mut res_c),
                        &norm_w,
                        form,
                        1e-6,
                        &mut frags,
                        &tiles,
                        global,
                        &mut yc,
                    ),
                }
                .unwrap();
                let step = gpu.download(&yc).unwrap();
                assert_same_bits(&format!("step {what}, run {run}"), &step, &unfused, n);
                if producer.starts_with("add") {
                    assert_same_bits(
                        &format!("step's written-back residual {what}"),
                        &gpu.download(&res_a).unwrap(),
                        &gpu.download(&res_c).unwrap(),
                        k,
                    );
                }
            }
            assert_eq!(frags.written(), Some((m, k)), "{what}: the step's record");
            check(&format!("fused {what}"), &runs[0], &want, n);
            let e = rel_err(&what, &runs[0], &unfused);
            assert!(
                e < 1e-6,
                "{what}: fused against unfused relative difference {e:e} >= 1e-6"
            );
            assert_same_bits(&format!("fused {what}, second run"), &runs[0], &runs[1], n);
            if producer.starts_with("add") {
                assert_same_bits(
                    &format!("written-back residual {what}"),
                    &gpu.download(&res_a).unwrap(),
                    &gpu.download(&res_b).unwrap(),
                    k,
                );
            }
        }
    }
}

#[test]
fn gemv_variant_errors_name_the_operand() {
    let Some(gpu) = gpu() else { return };
    let (m, n, k) = (9, 8, 160);
    let x = gpu.upload(&vec![0u16; m * k]).unwrap();
    let w8 = gpu.upload(&vec![0u8; n * k]).unwrap();
    let s8 = gpu.upload(&[1.0f32; 2]).unwrap();
    let w4 = gpu.upload(&vec![0u8; n * k / 2]).unwrap();
    let s4 = gpu.upload(&vec![0x38u8; n * k / 16]).unwrap();
    let mut y = gpu.zeros::<f32>(m * n).unwrap();
    // m = 9 needs two token tiles: 2 chunks x 2 x 512 words.
    assert_eq!(Gpu::gemv_scratch_len(m, k), 2048);
    let mut small = gpu.zeros::<u32>(Gpu::gemv_scratch_len(m, k) - 1).unwrap();
    let e = gpu
        .fp8_block_gemv_preconverted(&x, &w8, &s8, &mut y, &mut small, m, n, k)
        .unwrap_err();
    assert!(e.to_string().contains("scratch has 2047 words"), "{e}");
    let e = gpu
        .nvfp4_gemv_preconverted(&x, &w4, &s4, 1.0, &mut y, &mut small, m, n, k)
        .unwrap_err();
    assert!(e.to_string().contains("scratch"), "{e}");
    let e = gpu.nvfp4_repack_tiles(&w4, &s4, n, 144).unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    let e = gpu.nvfp4_repack_tiles(&w4, &s4, n + 1, k).unwrap_err();
    assert!(e.to_string().contains("w has"), "{e}");
    let tiles = gpu.nvfp4_repack_tiles(&w4, &s4, n, k).unwrap();
    let x17 = gpu.upload(&vec![0u16; 17 * k]).unwrap();
    let mut y17 = gpu.zeros::<f32>(17 * n).unwrap();
    let mut big = gpu.zeros::<u32>(Gpu::gemv_scratch_len(16, k)).unwrap();
    let e = gpu
        .nvfp4_gemv_tiles(&x17, &tiles, 1.0, &mut y17, &mut big, 17)
        .unwrap_err();
    assert!(e.to_string().contains("m must be 1..=16"), "{e}");
    let e = gpu
        .nvfp4_gemv_tiles(&x, &tiles, f32::NAN, &mut y, &mut big, m)
        .unwrap_err();
    assert!(e.to_string().contains("global_scale must be finite"), "{e}");
    let e = gpu
        .nvfp4_gemv_tiles(&x, &tiles, 1.0, &mut y, &mut small, m)
        .unwrap_err();
    assert!(e.to_string().contains("scratch has 2047 words"), "{e}");
    for bad in [0, 17] {
        let e = gpu
            .nvfp4_gemv_tiles_variant(&x, &tiles, 1.0, &mut y, Some(&mut big), m, bad)
            .unwrap_err();
        assert!(e.to_string().contains("k_splits must be 1..=16"), "{e}");
    }
    let e = gpu
        .nvfp4_gemv_tiles_variant(&x, &tiles, 1.0, &mut y, None, m, 2)
        .unwrap_err();
    assert!(e.to_string().contains("without a scratch buffer"), "{e}");
    let x1 = gpu.upload(&vec![0u16; k]).unwrap();
    let mut y1 = gpu.zeros::<f32>(n).unwrap();
    let e = gpu
        .nvfp4_gemv_tiles_m1(&x1, &tiles, 1.0, &mut y1, &mut big, 6, 1)
        .unwrap_err();
    assert!(e.to_string().contains("warps must be 4 or 8"), "{e}");
    let e = gpu
        .nvfp4_gemv_tiles_m1(&x1, &tiles, 1.0, &mut y1, &mut big, 8, 0)
        .unwrap_err();
    assert!(e.to_string().contains("k_splits must be 1..=16"), "{e}");
    let e = gpu
        .nvfp4_gemv_tiles_m1(&x, &tiles, 1.0, &mut y1, &mut big, 8, 1)
        .unwrap_err();
    assert!(e.to_string().contains("x has"), "{e}");
    let e = gpu.fp8_repack_tiles(&w8, n, 40).unwrap_err();
    assert!(e.to_string().contains("multiple of 16"), "{e}");
    let e = gpu.fp8_repack_tiles(&w8, n + 1, k).unwrap_err();
    assert!(e.to_string().contains("w has"), "{e}");
    let tiles8 = gpu.fp8_repack_tiles(&w8, n, k).unwrap();
    let e = gpu
        .fp8_gemv_tiles_split(&x, &tiles8, &s8, &mut y, &mut small, m, MmaSplit::ONE_TILE)
        .unwrap_err();
    assert!(e.to_string().contains("scratch has 2047 words"), "{e}");
    let e = gpu
        .fp8_gemv_tiles_converting(
            &x,
            &tiles8,
            &s8,
            &mut y,
            m,
            MmaSplit {
                warps: 4,
                splits: 2,
                pdl: true,
            },
        )
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("converting FP8 tile GEMV is built for"),
        "{e}"
    );
    let e = gpu
        .fp8_gemv_tiles(&x17, &tiles8, &s8, &mut y17, &mut big, 17)
        .unwrap_err();
    assert!(e.to_string().contains("m must be 1..=16"), "{e}");
    let two = gpu.upload(&[1.0f32; 3]).unwrap();
    let e = gpu
        .fp8_gemv_tiles_split(&x, &tiles8, &two, &mut y, &mut big, m, MmaSplit::ONE_TILE)
        .unwrap_err();
    assert!(e.to_string().contains("scales has 3"), "{e}");
    for (warps, splits) in [(2, 1), (8, 3), (16, 2), (4, 0), (4, 4)] {
        let split = MmaSplit {
            warps,
            splits,
            pdl: false,
        };
        const BAD_SPLIT: &str = "a tensor-core GEMV split is one of (warps, splits)";
        let x1 = gpu.upload(&vec![0u16; k]).unwrap();
        let mut y1 = gpu.zeros::<f32>(n).unwrap();
        let errors = [
            gpu.fp8_gemv_tiles_m1(&x1, &tiles8, &s8, &mut y1, split),
            gpu.fp8_block_gemv_split(&x, &w8, &s8, &mut y, &mut big, m, n, k, split),
            gpu.fp8_gemv_tiles_split(&x, &tiles8, &s8, &mut y, &mut big, m, split),
            gpu.nvfp4_gemv_tiles_split(&x, &tiles, 1.0, &mut y, &mut big, m, split),
        ];
        for e in errors {
            let e = e.unwrap_err();
            assert!(e.to_string().contains(BAD_SPLIT), "{e}");
        }
    }
    let e = gpu
        .fp8_block_gemv_with_scratch(&x, &w8, &s8, &mut y, &mut small, m, n, k)
        .unwrap_err();
    assert!(e.to_string().contains("scratch has 2047 words"), "{e}");
    // The fused producers' limits (up to 16 rows; dim % 16 == 0 and <= 8192 for the norm, inter % 16 == 0 for the
    // gated activation; a fragment buffer for m x k), and the fragments GEMV's check that the fragments were
    // written for its m and k. A refused producer call records nothing.
    let mut fbig = Fp8Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(16, k)).unwrap());
    let mut fsmall = Fp8Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(m, k) - 1).unwrap());
    let e = gpu
        .fp8_gemv_tiles_fragments(&fbig, &tiles8, &s8, &mut y, m)
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "the fragments hold nothing yet (no producer call), the GEMV needs m = 9, k = 160"
        ),
        "{e}"
    );
    let nw = gpu.upload(&vec![1.0f32; k]).unwrap();
    let xn17 = gpu.upload(&vec![1.0f32; 17 * k]).unwrap();
    let e = gpu
        .rmsnorm_fp8_fragments(&xn17, None, &nw, NormWeight::Plain, 1e-6, &mut fbig)
        .unwrap_err();
    assert!(
        e.to_string().contains("1 to 16 token rows, x has 17 rows"),
        "{e}"
    );
    assert_eq!(fbig.written(), None, "a refused call recorded a shape");
    for dim in [40, 8208] {
        let w1 = gpu.upload(&vec![1.0f32; dim]).unwrap();
        let x1 = gpu.upload(&vec![1.0f32; dim]).unwrap();
        let mut f1 = Fp8Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(1, dim)).unwrap());
        let e = gpu
            .rmsnorm_fp8_fragments(&x1, None, &w1, NormWeight::Plain, 1e-6, &mut f1)
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "at most 8192 (the kernel's vector path), got {dim}"
            )),
            "{e}"
        );
    }
    let xm = gpu.upload(&vec![1.0f32; m * k]).unwrap();
    let e = gpu
        .rmsnorm_fp8_fragments(&xm, None, &nw, NormWeight::Plain, 1e-6, &mut fsmall)
        .unwrap_err();
    assert!(e.to_string().contains("scratch has 2047 words"), "{e}");
    // Written for m = 9, k = 160: a GEMV for m = 8 is refused.
    gpu.rmsnorm_fp8_fragments(&xm, None, &nw, NormWeight::Plain, 1e-6, &mut fbig)
        .unwrap();
    assert_eq!(fbig.written(), Some((m, k)));
    let mut y8 = gpu.zeros::<f32>(8 * n).unwrap();
    let e = gpu
        .fp8_gemv_tiles_fragments(&fbig, &tiles8, &s8, &mut y8, 8)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("the fragments hold m = 9, k = 160, the GEMV needs m = 8, k = 160"),
        "{e}"
    );
    let gu17 = gpu.upload(&vec![1.0f32; 17 * 2 * k]).unwrap();
    let e = gpu
        .silu_and_mul_fp8_fragments(&gu17, k, &mut fbig)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("1 to 16 token rows, gate_up has 17 rows"),
        "{e}"
    );
    let gu40 = gpu.upload(&vec![1.0f32; 2 * 40]).unwrap();
    let e = gpu
        .gelu_and_mul_fp8_fragments(&gu40, 40, &mut fbig)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("inter must be a multiple of 16 (the FP8 GEMV's k), got 40"),
        "{e}"
    );
    assert_eq!(
        fbig.written(),
        Some((m, k)),
        "a refused call changed the record"
    );
    let gum = gpu.upload(&vec![1.0f32; m * 2 * k]).unwrap();
    let e = gpu
        .silu_and_mul_fp8_fragments(&gum, k, &mut fsmall)
        .unwrap_err();
    assert!(e.to_string().contains("scratch has 2047 words"), "{e}");
    // The NVFP4 twins: the GEMV refuses fragments not written for its m and k and a non-finite global scale; a
    // refused producer call records nothing; on zero weights the fused step writes exact zeros.
    let mut f4 = Nvfp4Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(16, k)).unwrap());
    let e = gpu
        .nvfp4_gemv_tiles_fragments(&f4, &tiles, 1.0, &mut y, m)
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "the fragments hold nothing yet (no producer call), the GEMV needs m = 9, k = 160"
        ),
        "{e}"
    );
    let e = gpu
        .gelu_and_mul_nvfp4_fragments(&gu40, 40, &mut f4)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("inter must be a multiple of 16 (the NVFP4 GEMV's k), got 40"),
        "{e}"
    );
    assert_eq!(f4.written(), None, "a refused call recorded a shape");
    gpu.rmsnorm_nvfp4_fragments(&xm, None, &nw, NormWeight::Plain, 1e-6, &mut f4)
        .unwrap();
    let e = gpu
        .nvfp4_gemv_tiles_fragments(&f4, &tiles, 1.0, &mut y8, 8)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("the fragments hold m = 9, k = 160, the GEMV needs m = 8, k = 160"),
        "{e}"
    );
    let e = gpu
        .nvfp4_gemv_tiles_fragments(&f4, &tiles, f32::NAN, &mut y, m)
        .unwrap_err();
    assert!(e.to_string().contains("global_scale must be finite"), "{e}");
    let mut yz = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
    gpu.nvfp4_gemv_tiles_fragments(&f4, &tiles, 1.0, &mut yz, m)
        .unwrap();
    assert!(
        gpu.download(&yz).unwrap().iter().all(|&v| v == 0.0),
        "zero weights through the fused step gave a nonzero or unwritten output"
    );
    // The producer + GEMV steps check every operand before their first launch: a refused one leaves y and the
    // fragments' record as they were.
    let before = f4.written();
    let mut ys = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
    let w_short = gpu.upload(&vec![1.0f32; k - 16]).unwrap();
    let mut norm_step = |x: &GpuBuffer<f32>, w: &GpuBuffer<f32>, y: &mut GpuBuffer<f32>| {
        let e =
            gpu.rmsnorm_nvfp4_gemv(x, None, w, NormWeight::Plain, 1e-6, &mut f4, &tiles, 1.0, y);
        e.unwrap_err().to_string()
    };
    for (e, want) in [
        (
            norm_step(&xm, &w_short, &mut ys),
            "the norm's weight has 144 elements, the GEMV's k is 160",
        ),
        (
            norm_step(&xm, &nw, &mut y8),
            "y has 64 elements, expected 72",
        ),
        (norm_step(&xn17, &nw, &mut ys), "m must be 1..=16"),
    ] {
        assert!(e.contains(want), "{e}");
    }
    let gu_ragged = gpu.upload(&vec![1.0f32; m * 2 * k + 3]).unwrap();
    let e = gpu
        .gelu_and_mul_nvfp4_gemv(&gu_ragged, &mut f4, &tiles, 1.0, &mut ys)
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "gate_up has 2883 elements, not a whole number of rows of 320 (the GEMV's k = 160)"
        ),
        "{e}"
    );
    let e = gpu
        .silu_and_mul_nvfp4_gemv(&gum, &mut f4, &tiles, f32::INFINITY, &mut ys)
        .unwrap_err();
    assert!(e.to_string().contains("global_scale must be finite"), "{e}");
    assert_eq!(f4.written(), before, "a refused step changed the record");
    assert!(
        gpu.download(&ys).unwrap().iter().all(|v| v.is_nan()),
        "a refused step wrote y"
    );
    // Zero weights (e2m1 code 0) times random activations: every output written, and exactly zero.
    let mut r = rng("gemv_variant_errors");
    let xr = gpu.upload(&bf16_activations(&mut r, m * k).0).unwrap();
    let mut scratch = poisoned_scratch(&gpu, Gpu::gemv_scratch_len(m, k));
    let mut yn = gpu.upload(&vec![f32::NAN; m * n]).unwrap();
    gpu.nvfp4_gemv_tiles(&xr, &tiles, 1.0, &mut yn, &mut scratch, m)
        .unwrap();
    let got = gpu.download(&yn).unwrap();
    assert!(
        got.iter().all(|&v| v == 0.0),
        "zero weights gave {:?}",
        got.iter().find(|v| **v != 0.0)
    );
}
