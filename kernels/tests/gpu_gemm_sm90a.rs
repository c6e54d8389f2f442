//! The wgmma (sm_90a) prefill GEMMs of `cuda/gemm_sm90a.cu` against the plain Rust references on the CPU, every
//! build (FP8: cp.async v1, TMA v2, persistent v3, ping-pong v4, the auto pick, and v4's bf16 epilogue; NVFP4:
//! synchronous v1, warp-specialised v2, byte-permute decode with 256-row tiles v3, the auto pick), and the public
//! dispatching entry points `Gpu::fp8_block_gemm` / `Gpu::nvfp4_gemm` on both of their paths (wgmma where the
//! device is sm_90 and the shape fits, mma.sync otherwise, and the explicit `*_mma_sync` methods), with fresh
//! random inputs (the seed is printed),
//! shapes that are not multiples of any tile (ragged M and N, K across more K tiles than the pipeline has
//! stages), NaN-poisoned outputs (an element the kernel did not write fails, and a pass proves the GPU path ran),
//! stated error bounds, and a report of the worst element (row, column, tile) when a bound is broken.
//!
//! Where there is no CUDA device, each test prints "skipped: no CUDA device" and returns; on a device of another
//! compute capability than 9.0 (the sm_90a cubin does not load there) it prints "skipped: not sm_90". Shapes are
//! small so the file runs under `compute-sanitizer --tool memcheck|racecheck` in seconds.

//!
//! The tests compare every wgmma build (`_with` forms), so the file builds with the `lab` feature only.
#![cfg(feature = "lab")]

use kernels::cuda::{Fp8Wgmma, Gpu, GpuBuffer, Nvfp4Wgmma};
use kernels::formats::{bf16_to_f32, f32_to_bf16};
use kernels::KernelError;

mod gpu_common;
use gpu_common::{fp8_gemm_case, gpu, nan_f32, nvfp4_case, prefill_activations, rel_err, rng};

/// `rel_err` with a bound; on failure names the worst element, its 128x128 output tile and its 64-row warpgroup
/// half, and how many elements are off by more than 1% of the largest reference value (one wrong K block or
/// swizzle chunk shows as a pattern of rows/columns there).
fn check(what: &str, got: &[f32], want: &[f32], n: usize, tol: f64) {
    let e = rel_err(what, got, want);
    println!("{what}: relative error {e:.2e}");
    if e < tol {
        return;
    }
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-30);
    let (mut worst, mut wi, mut bad) = (0f32, 0usize, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d > worst {
            worst = d;
            wi = i;
        }
        if d > 0.01 * scale {
            bad += 1;
        }
    }
    let (r, c) = (wi / n, wi % n);
    panic!(
        "{what}: relative error {e:e} >= {tol:e}; worst element ({r}, {c}) = {} expected {} (tile ({}, {}), rows \
         {}..{} of it, column {} of it); {bad} of {} elements off by > 1% of max |y| = {scale}",
        got[wi],
        want[wi],
        r / 128,
        c / 128,
        (r % 128) / 64 * 64,
        (r % 128) / 64 * 64 + 64,
        c % 128,
        got.len()
    );
}

/// Runs `call` once; `None` (after printing why) when this device cannot load the sm_90a module.
fn sm90a_available(r: Result<(), KernelError>) -> Option<()> {
    match r {
        Ok(()) => Some(()),
        Err(e) if e.to_string().contains("sm_90a") => {
            println!("skipped: not sm_90 ({e})");
            None
        }
        Err(e) => panic!("wgmma GEMM failed: {e}"),
    }
}

type Fp8Fn = fn(
    &Gpu,
    &GpuBuffer<u8>,
    &GpuBuffer<f32>,
    &GpuBuffer<u8>,
    &GpuBuffer<f32>,
    &mut GpuBuffer<f32>,
    usize,
    usize,
    usize,
) -> Result<(), KernelError>;

const FP8_BUILDS: [(&str, Fp8Fn); 5] = [
    ("v1 cp.async", |g, a, b, c, d, y, m, n, k| {
        g.fp8_block_gemm_wgmma_with(Fp8Wgmma::CpAsync, a, b, c, d, y, m, n, k)
    }),
    ("v2 tma", |g, a, b, c, d, y, m, n, k| {
        g.fp8_block_gemm_wgmma_with(Fp8Wgmma::Tma, a, b, c, d, y, m, n, k)
    }),
    ("v3 persistent", |g, a, b, c, d, y, m, n, k| {
        g.fp8_block_gemm_wgmma_with(Fp8Wgmma::Persistent, a, b, c, d, y, m, n, k)
    }),
    ("v4 ping-pong", |g, a, b, c, d, y, m, n, k| {
        g.fp8_block_gemm_wgmma_with(Fp8Wgmma::PingPong, a, b, c, d, y, m, n, k)
    }),
    ("auto", Gpu::fp8_block_gemm_wgmma),
];

// Products of two e4m3 values are exact in fp32; each 128 of K is summed by the tensor cores (FP8 accumulation
// keeps fewer bits than fp32, ~14, but only over 128 products) and promoted into fp32 with both scales: ~1e-4
// relative at most against the f64 reference; 2e-3 leaves room without hiding a wrong element (one wrong or
// missing scale block, K block or swizzle chunk moves the norm by > 5e-2 at these sizes). Against the mma.sync
// kernel of gemm.cu, which sums the same products in another order, the difference is of the same size.
const FP8_TOL: f64 = 2e-3;

#[test]
fn fp8_block_gemm_wgmma_matches_the_reference_on_every_build() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_block_gemm_wgmma");
    // Ragged M (1, 2, 5, 130, 131, 257: not multiples of 128, 64 or 16) and N (odd 201, 385, 8955, 19197,
    // 51199: the scalar store path), K = 128 (one K block) up to 14 K blocks (more than twice the 6 stages of
    // the TMA ring: both mbarrier phases are used twice), odd and even K block counts (v4 alternates two
    // partials), and 5 (more than v1's 4 stages). The last three shapes have more 128x128 tiles (150, 140, 400)
    // than the H200 has SMs (132), so every persistent block (v3, v4) walks two to four tiles and the ring's
    // stage and phase run on across tiles (with 5 and 7 K blocks per tile, a tile starts mid-ring).
    for &(m, n, k) in &[
        (1, 16, 128),
        (5, 130, 256),
        (64, 128, 128),
        (130, 201, 640),
        (257, 385, 1024),
        (129, 257, 1792),
        (2, 19197, 640),
        (131, 8955, 128),
        (1, 51199, 896),
        (385, 1000, 384),
        (300, 4500, 256),
    ] {
        let c = fp8_gemm_case(&gpu, &mut rng, m, n, k);
        let (dxq, dxs, dw, dws, want) = (&c.xq, &c.xs, &c.w, &c.ws, &c.want);
        for (name, f) in FP8_BUILDS {
            let mut dy = nan_f32(&gpu, m * n);
            if sm90a_available(f(&gpu, dxq, dxs, dw, dws, &mut dy, m, n, k)).is_none() {
                return;
            }
            let what = format!("fp8 wgmma {name} m={m} n={n} k={k}");
            check(&what, &gpu.download(&dy).unwrap(), want, n, FP8_TOL);
        }
        // The mma.sync kernel on the same device buffers: the wgmma builds are drop-in replacements for it.
        let mut dy = nan_f32(&gpu, m * n);
        gpu.fp8_block_gemm_mma_sync(dxq, dxs, dw, dws, &mut dy, m, n, k)
            .unwrap();
        check(
            &format!("fp8 mma.sync (gemm.cu) m={m} n={n} k={k}"),
            &gpu.download(&dy).unwrap(),
            want,
            n,
            FP8_TOL,
        );
    }
}

/// bf16 output: each element must be exactly the same build's fp32 element rounded to nearest even (the bf16
/// epilogue rounds the fp32 accumulator once at the store), and within the bf16 rounding bound of the reference.
/// The bound: FP8_TOL for the fp32 result plus one bf16 rounding, at most 2^-8 of each element's magnitude
/// (8 significant bits; ~1e-3 relative in norm on random data), so 2e-3 + 2^-8.
const FP8_BF16_TOL: f64 = FP8_TOL + 1.0 / 256.0;

#[test]
fn fp8_block_gemm_wgmma_bf16_is_the_fp32_result_rounded_to_nearest_even() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_block_gemm_wgmma_bf16");
    // The epilogue's paths: n % 4 == 0 (8-byte stores of 4 columns after a lane-pair exchange; 388 and 4500
    // with a partial last tile, 8956 with 140 tiles: blocks walk two tiles) and n % 4 != 0 (2-byte stores:
    // odd 201 and 19197, n % 4 == 2 for 130 and 1002), ragged M (rows past M run the exchange but do not
    // store), one K block up to 14, odd and even K block counts (v4's two partials).
    for &(m, n, k) in &[
        (1, 16, 128),
        (5, 130, 256),
        (130, 201, 640),
        (257, 388, 1024),
        (129, 1002, 1792),
        (131, 8956, 128),
        (2, 19197, 640),
        (300, 4500, 384),
    ] {
        let c = fp8_gemm_case(&gpu, &mut rng, m, n, k);
        let (dxq, dxs, dw, dws, want) = (&c.xq, &c.xs, &c.w, &c.ws, &c.want);
        // The bf16 entry point runs v4 (the only build with a bf16 epilogue): compare it with v4's fp32 output.
        {
            let name = "v4";
            let mut dy = nan_f32(&gpu, m * n);
            if sm90a_available(gpu.fp8_block_gemm_wgmma_with(
                Fp8Wgmma::PingPong,
                dxq,
                dxs,
                dw,
                dws,
                &mut dy,
                m,
                n,
                k,
            ))
            .is_none()
            {
                return;
            }
            let y32 = gpu.download(&dy).unwrap();
            // 0xFFFF is a bf16 NaN: an element the kernel did not write fails both checks below.
            let mut db = gpu.upload(&vec![0xFFFFu16; m * n]).unwrap();
            gpu.fp8_block_gemm_wgmma_bf16(dxq, dxs, dw, dws, &mut db, m, n, k)
                .unwrap();
            let yb = gpu.download(&db).unwrap();
            let what = format!("fp8 wgmma {name} bf16 out m={m} n={n} k={k}");
            let got: Vec<f32> = yb.iter().map(|&b| bf16_to_f32(b)).collect();
            check(&what, &got, want, n, FP8_BF16_TOL);
            if let Some((i, (&b, &f))) = yb
                .iter()
                .zip(&y32)
                .enumerate()
                .find(|(_, (&b, &f))| b != f32_to_bf16(f))
            {
                panic!(
                    "{what}: element ({}, {}) is bf16 {b:#06x} ({}) but the fp32 build gave {f} = bf16 \
                     {:#06x} rounded to nearest even",
                    i / n,
                    i % n,
                    bf16_to_f32(b),
                    f32_to_bf16(f)
                );
            }
        }
    }
}

/// Asserts that `got` is bit-for-bit `want` (the same kernel on the same inputs is deterministic: every build
/// sums in a fixed order), naming the first difference.
fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    if let Some((i, (g, w))) = got
        .iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits())
    {
        panic!(
            "{what}: element {i} is {g} but the expected path gave {w}: the dispatcher took another kernel than \
             the one it documents"
        );
    }
}

#[test]
fn fp8_block_gemm_dispatches_to_wgmma_where_it_fits_and_to_mma_sync_otherwise() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("fp8_block_gemm dispatch");
    // K % 128 == 0 takes the wgmma kernel on sm_90; K % 128 != 0 (400, 272: multiples of 16 only) always takes
    // mma.sync. Ragged M and N, odd N.
    for &(m, n, k) in &[
        (130, 201, 384),
        (5, 130, 272),
        (130, 201, 400),
        (257, 129, 1024),
    ] {
        let c = fp8_gemm_case(&gpu, &mut rng, m, n, k);
        let (dxq, dxs, dw, dws, want) = (&c.xq, &c.xs, &c.w, &c.ws, &c.want);
        let run = |f: Fp8Fn| {
            let mut dy = nan_f32(&gpu, m * n);
            f(&gpu, dxq, dxs, dw, dws, &mut dy, m, n, k).map(|()| gpu.download(&dy).unwrap())
        };
        let public = run(Gpu::fp8_block_gemm).unwrap();
        check(
            &format!("public fp8_block_gemm m={m} n={n} k={k}"),
            &public,
            want,
            n,
            FP8_TOL,
        );
        let mma = run(Gpu::fp8_block_gemm_mma_sync).unwrap();
        check(
            &format!("fp8_block_gemm_mma_sync m={m} n={n} k={k}"),
            &mma,
            want,
            n,
            FP8_TOL,
        );
        // Which path the public call took: bit-equal to the wgmma pick where the device runs sm_90a and
        // K % 128 == 0, to mma.sync everywhere else.
        let wgmma = if k.is_multiple_of(128) {
            match run(Gpu::fp8_block_gemm_wgmma) {
                Ok(y) => Some(y),
                Err(e) if e.to_string().contains("sm_90a") => None,
                Err(e) => panic!("fp8_block_gemm_wgmma m={m} n={n} k={k}: {e}"),
            }
        } else {
            None
        };
        let (path, expected) = match &wgmma {
            Some(y) => ("wgmma", y),
            None => ("mma.sync", &mma),
        };
        println!("public fp8_block_gemm m={m} n={n} k={k}: expected path {path}");
        assert_same_bits(
            &format!("public fp8_block_gemm m={m} n={n} k={k} (expected path {path})"),
            &public,
            expected,
        );
    }
}

#[test]
fn fp8_block_gemm_wgmma_refuses_bad_sizes() {
    let Some(gpu) = gpu() else { return };
    let xq = gpu.zeros::<u8>(3 * 256).unwrap();
    let xs = gpu.zeros::<f32>(3 * 2).unwrap();
    let w = gpu.zeros::<u8>(8 * 256).unwrap();
    let ws = gpu.zeros::<f32>(2).unwrap();
    let mut y = gpu.zeros::<f32>(3 * 8).unwrap();
    for (name, f) in FP8_BUILDS {
        // k a multiple of 16 (fine for gemm.cu) but not of the 128 K tile.
        let e = f(&gpu, &xq, &xs, &w, &ws, &mut y, 3, 8, 192).unwrap_err();
        assert!(e.to_string().contains("multiple of 128"), "{name}: {e}");
        let e = f(&gpu, &xq, &xs, &w, &ws, &mut y, 0, 8, 256).unwrap_err();
        assert!(e.to_string().contains("must be positive"), "{name}: {e}");
        let e = f(&gpu, &xq, &xs, &w, &ws, &mut y, 3, 8, 128).unwrap_err();
        assert!(
            e.to_string().contains("xq has 768 elements, expected 384"),
            "{name}: {e}"
        );
        let e = f(&gpu, &xq, &ws, &w, &ws, &mut y, 3, 8, 256).unwrap_err();
        assert!(
            e.to_string()
                .contains("x_scales has 2 elements, expected 6"),
            "{name}: {e}"
        );
        let e = f(&gpu, &xq, &xs, &w, &xs, &mut y, 3, 8, 256).unwrap_err();
        assert!(
            e.to_string()
                .contains("w_scales has 6 elements, expected 2"),
            "{name}: {e}"
        );
        let mut y2 = gpu.zeros::<f32>(3 * 9).unwrap();
        let e = f(&gpu, &xq, &xs, &w, &ws, &mut y2, 3, 8, 256).unwrap_err();
        assert!(
            e.to_string().contains("y has 27 elements, expected 24"),
            "{name}: {e}"
        );
    }
    // The bf16 entry point checks the same sizes, its bf16 output included.
    let mut yb = gpu.zeros::<u16>(3 * 9).unwrap();
    let e = gpu
        .fp8_block_gemm_wgmma_bf16(&xq, &xs, &w, &ws, &mut yb, 3, 8, 256)
        .unwrap_err();
    assert!(
        e.to_string().contains("y has 27 elements, expected 24"),
        "bf16: {e}"
    );
    let mut yb = gpu.zeros::<u16>(3 * 8).unwrap();
    let e = gpu
        .fp8_block_gemm_wgmma_bf16(&xq, &xs, &w, &ws, &mut yb, 3, 8, 192)
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 128"), "bf16: {e}");
}

// NVFP4: e2m1 x e4m3 group scale is exact in bf16 and the bf16 activations are exact, so every product is exact
// and the error is the fp32 accumulation of the tensor cores over K (~1e-6 relative); 1e-4 leaves room for the
// tensor cores' accumulation order without hiding a wrong element (one wrong group scale or swizzle chunk moves
// the norm by > 1e-2 at these sizes).
const NVFP4_TOL: f64 = 1e-4;

type Nvfp4Fn = fn(
    &Gpu,
    &GpuBuffer<u16>,
    &GpuBuffer<u8>,
    &GpuBuffer<u8>,
    f32,
    &mut GpuBuffer<f32>,
    usize,
    usize,
    usize,
) -> Result<(), KernelError>;

const NVFP4_BUILDS: [(&str, Nvfp4Fn); 4] = [
    ("v1 synchronous", |g, x, w, s, gs, y, m, n, k| {
        g.nvfp4_gemm_wgmma_with(Nvfp4Wgmma::Synchronous, x, w, s, gs, y, m, n, k)
    }),
    ("v2 warp-specialised", |g, x, w, s, gs, y, m, n, k| {
        g.nvfp4_gemm_wgmma_with(Nvfp4Wgmma::WarpSpecialized, x, w, s, gs, y, m, n, k)
    }),
    ("v3 prmt decode", |g, x, w, s, gs, y, m, n, k| {
        g.nvfp4_gemm_wgmma_with(Nvfp4Wgmma::PrmtDecode256, x, w, s, gs, y, m, n, k)
    }),
    ("auto", Gpu::nvfp4_gemm_wgmma),
];

#[test]
fn nvfp4_gemm_wgmma_matches_the_reference_on_every_build() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_gemm_wgmma");
    // Ragged M and N (odd N included), K = 64 (one K tile) up to 17 K tiles: past v1's 4 stages and two decoded
    // B buffers several times, past v2's 6-stage ring twice (both mbarrier phases reused), and K tile counts
    // of 1, 2, 4, 7, 8 and 17 against v2's producers, which hold 4 K tiles in registers (a whole number of
    // groups of 4, and 1 or 3 left over). For v3's 256-row tiles: M within the first 128-row half of a tile (1,
    // 3, 5, 64, 129 - 128 = 1 row, 257 - 256, 384 - 256 = 128 exactly: the second x box is skipped), both halves
    // partly (130, 300, 200 + 256) and whole tiles (512); its 4-stage ring wraps four times at K = 1088.
    for &(m, n, k) in &[
        (1, 8, 64),
        (5, 130, 128),
        (3, 131, 256),
        (130, 257, 448),
        (129, 200, 512),
        (257, 300, 1088),
        (64, 256, 64),
        (384, 136, 320),
        (300, 72, 192),
        (512, 129, 576),
        (456, 17, 128),
    ] {
        let x = prefill_activations(&mut rng, m, k);
        let (want, global, dx, dw, ds) = nvfp4_case(&gpu, &mut rng, (m, n, k), x);
        for (name, f) in NVFP4_BUILDS {
            let mut dy = nan_f32(&gpu, m * n);
            if sm90a_available(f(&gpu, &dx, &dw, &ds, global, &mut dy, m, n, k)).is_none() {
                return;
            }
            let what = format!("nvfp4 wgmma {name} m={m} n={n} k={k}");
            check(&what, &gpu.download(&dy).unwrap(), &want, n, NVFP4_TOL);
        }
    }
}

#[test]
fn nvfp4_gemm_dispatches_to_wgmma_on_sm90_and_to_mma_sync_otherwise() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("nvfp4_gemm dispatch");
    for &(m, n, k) in &[(130, 257, 448), (5, 300, 128)] {
        let x = prefill_activations(&mut rng, m, k);
        let (want, global, dx, dw, ds) = nvfp4_case(&gpu, &mut rng, (m, n, k), x);
        let run = |f: Nvfp4Fn| {
            let mut dy = nan_f32(&gpu, m * n);
            f(&gpu, &dx, &dw, &ds, global, &mut dy, m, n, k).map(|()| gpu.download(&dy).unwrap())
        };
        let public = run(Gpu::nvfp4_gemm).unwrap();
        check(
            &format!("public nvfp4_gemm m={m} n={n} k={k}"),
            &public,
            &want,
            n,
            NVFP4_TOL,
        );
        let mma = run(Gpu::nvfp4_gemm_mma_sync).unwrap();
        check(
            &format!("nvfp4_gemm_mma_sync m={m} n={n} k={k}"),
            &mma,
            &want,
            n,
            NVFP4_TOL,
        );
        let wgmma = match run(Gpu::nvfp4_gemm_wgmma) {
            Ok(y) => Some(y),
            Err(e) if e.to_string().contains("sm_90a") => None,
            Err(e) => panic!("nvfp4_gemm_wgmma m={m} n={n} k={k}: {e}"),
        };
        let (path, expected) = match &wgmma {
            Some(y) => ("wgmma", y),
            None => ("mma.sync", &mma),
        };
        println!("public nvfp4_gemm m={m} n={n} k={k}: expected path {path}");
        assert_same_bits(
            &format!("public nvfp4_gemm m={m} n={n} k={k} (expected path {path})"),
            &public,
            expected,
        );
    }
}

#[test]
fn nvfp4_gemm_wgmma_refuses_bad_sizes() {
    let Some(gpu) = gpu() else { return };
    for (name, f) in NVFP4_BUILDS {
        let x = gpu.zeros::<u16>(2 * 96).unwrap();
        let w = gpu.zeros::<u8>(8 * 48).unwrap();
        let s = gpu.zeros::<u8>(8 * 6).unwrap();
        let mut y = gpu.zeros::<f32>(2 * 8).unwrap();
        let e = f(&gpu, &x, &w, &s, 1.0, &mut y, 2, 8, 96).unwrap_err();
        assert!(e.to_string().contains("multiple of 64"), "{name}: {e}");
        let e = f(&gpu, &x, &w, &s, 1.0, &mut y, 2, 8, 64).unwrap_err();
        assert!(
            e.to_string().contains("x has 192 elements, expected 128"),
            "{name}: {e}"
        );
        let x = gpu.zeros::<u16>(2 * 64).unwrap();
        let w = gpu.zeros::<u8>(8 * 32).unwrap();
        let s = gpu.zeros::<u8>(8 * 4).unwrap();
        let e = f(&gpu, &x, &w, &s, f32::INFINITY, &mut y, 2, 8, 64).unwrap_err();
        assert!(
            e.to_string().contains("global_scale must be finite"),
            "{name}: {e}"
        );
    }
}
