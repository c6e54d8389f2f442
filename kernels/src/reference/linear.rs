//! Plain references for the weight kernels of `kernels::linear`: each decodes the stored format element by
//! element with [`crate::formats`] and accumulates in f64, so a kernel's error against them is the kernel's own.
//!
//! Conventions shared by every function here: `x` is row-major `[m, k]`, weights are stored as the checkpoint
//! stores them (`[n, k]`, output features first), and the result is row-major `[m, n]` = `x W^T`. The quantisers
//! make test data in the same layouts the checkpoints use; the CUDA tests use these as their oracle too, so the
//! signatures are stable.

use crate::formats::{
    bf16_to_f32, e2m1_to_f32, e4m3_to_f32, f32_to_bf16, f32_to_e2m1, f32_to_e4m3,
};
// The formats' constants and the logical int4 layout live in `formats` (the kernels use them too); re-exported
// here where the references and their callers have always found them.
pub use crate::formats::{Int4Logical, FP8_BLOCK, NVFP4_GROUP};

/// Largest finite e4m3 magnitude.
const E4M3_MAX: f32 = 448.0;
/// Largest e2m1 magnitude.
const E2M1_MAX: f32 = 6.0;

/// `y = x W^T` with `W` decoded element by element by `w_at(row, col)`; f64 accumulation.
fn linear_by(
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    w_at: impl Fn(usize, usize) -> f64,
) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    let mut y = vec![0.0f32; m * n];
    for r in 0..n {
        let w: Vec<f64> = (0..k).map(|c| w_at(r, c)).collect();
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let acc: f64 = xr.iter().zip(&w).map(|(&a, &b)| f64::from(a) * b).sum();
            y[i * n + r] = acc as f32;
        }
    }
    y
}

/// FP8 block linear: `w` is e4m3 `[n, k]`, `scale_inv` is f32 `[ceil(n/128), ceil(k/128)]` and multiplies the
/// decoded weight (the checkpoint's `weight_scale_inv`).
pub fn fp8_block_linear(
    x: &[f32],
    m: usize,
    w: &[u8],
    scale_inv: &[f32],
    n: usize,
    k: usize,
) -> Vec<f32> {
    let kb = k.div_ceil(FP8_BLOCK);
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    assert_eq!(
        scale_inv.len(),
        n.div_ceil(FP8_BLOCK) * kb,
        "scale_inv must be [ceil(n/128), ceil(k/128)]"
    );
    linear_by(x, m, n, k, |r, c| {
        f64::from(e4m3_to_f32(w[r * k + c]))
            * f64::from(scale_inv[(r / FP8_BLOCK) * kb + c / FP8_BLOCK])
    })
}

/// Quantises f32 `[n, k]` weights to e4m3 with one scale per 128x128 block (`amax / 448`, 1.0 for an all-zero
/// block), the way FP8 block checkpoints are made. Returns `(codes [n, k], scale_inv)`.
pub fn quantize_fp8_block(w: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    let (nb, kb) = (n.div_ceil(FP8_BLOCK), k.div_ceil(FP8_BLOCK));
    let mut scale = vec![0.0f32; nb * kb];
    for r in 0..n {
        for c in 0..k {
            let amax = &mut scale[(r / FP8_BLOCK) * kb + c / FP8_BLOCK];
            *amax = amax.max(w[r * k + c].abs());
        }
    }
    for s in &mut scale {
        *s = if *s > 0.0 { *s / E4M3_MAX } else { 1.0 };
    }
    let codes = (0..n * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            f32_to_e4m3(w[i] / scale[(r / FP8_BLOCK) * kb + c / FP8_BLOCK])
        })
        .collect();
    (codes, scale)
}

/// NVFP4 linear: `w` is `[n, k/2]` bytes of e2m1 codes (even element in the low nibble), `scales` e4m3
/// `[n, k/16]`, and every weight is `e2m1 * e4m3(scale) * global_scale`. `k` must be a multiple of 16.
pub fn nvfp4_linear(
    x: &[f32],
    m: usize,
    w: &[u8],
    scales: &[u8],
    global_scale: f32,
    n: usize,
    k: usize,
) -> Vec<f32> {
    assert_eq!(k % NVFP4_GROUP, 0, "NVFP4 needs k to be a multiple of 16");
    assert_eq!(w.len(), n * k / 2, "w must be [n, k/2]");
    assert_eq!(
        scales.len(),
        n * k / NVFP4_GROUP,
        "scales must be [n, k/16]"
    );
    linear_by(x, m, n, k, |r, c| {
        let byte = w[r * (k / 2) + c / 2];
        let code = if c.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        };
        f64::from(e2m1_to_f32(code))
            * f64::from(e4m3_to_f32(scales[r * (k / NVFP4_GROUP) + c / NVFP4_GROUP]))
            * f64::from(global_scale)
    })
}

/// Quantises f32 `[n, k]` weights to NVFP4 the way modelopt does: a global scale `amax / (448 * 6)`, an e4m3
/// scale per 16 elements (`amax16 / 6 / global`), e2m1 codes rounded to nearest even against the decoded scale.
/// Returns `(packed [n, k/2], scales [n, k/16], global_scale)`.
pub fn quantize_nvfp4(w: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<u8>, f32) {
    assert_eq!(k % NVFP4_GROUP, 0, "NVFP4 needs k to be a multiple of 16");
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let global = if amax > 0.0 {
        amax / (E4M3_MAX * E2M1_MAX)
    } else {
        1.0
    };
    let mut packed = vec![0u8; n * k / 2];
    let mut scales = vec![0u8; n * k / NVFP4_GROUP];
    for r in 0..n {
        for g in 0..k / NVFP4_GROUP {
            let vals = &w[r * k + g * NVFP4_GROUP..r * k + (g + 1) * NVFP4_GROUP];
            let gmax = vals.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let code = f32_to_e4m3(gmax / E2M1_MAX / global);
            scales[r * (k / NVFP4_GROUP) + g] = code;
            let step = e4m3_to_f32(code) * global;
            for (j, &v) in vals.iter().enumerate() {
                let q = if step > 0.0 { f32_to_e2m1(v / step) } else { 0 };
                let c = g * NVFP4_GROUP + j;
                packed[r * (k / 2) + c / 2] |= if c.is_multiple_of(2) { q } else { q << 4 };
            }
        }
    }
    (packed, scales, global)
}

/// bf16 linear: `w` is bf16 bits `[n, k]`.
pub fn bf16_linear(x: &[f32], m: usize, w: &[u16], n: usize, k: usize) -> Vec<f32> {
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    linear_by(x, m, n, k, |r, c| f64::from(bf16_to_f32(w[r * k + c])))
}

/// Rounds f32 weights to bf16 bits (RNE), for test data.
pub fn to_bf16(w: &[f32]) -> Vec<u16> {
    w.iter().map(|&v| f32_to_bf16(v)).collect()
}

/// Asymmetric group quantisation of f32 `[n, k]` weights to int4 (tinygemm convention, scales and zeros rounded
/// to bf16 because that is how the packed layout stores them).
pub fn quantize_int4_asym(w: &[f32], n: usize, k: usize, group: usize) -> Int4Logical {
    quantize_int4(w, n, k, group, false)
}

/// Symmetric (GPTQ, zero point 8) group quantisation: `scale = 2 * amax / 15`, `zero = 0`.
pub fn quantize_int4_sym(w: &[f32], n: usize, k: usize, group: usize) -> Int4Logical {
    quantize_int4(w, n, k, group, true)
}

fn quantize_int4(w: &[f32], n: usize, k: usize, group: usize, symmetric: bool) -> Int4Logical {
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    assert!(group > 0);
    let groups = k.div_ceil(group);
    let mut codes = vec![0u8; n * k];
    let mut scales = vec![0.0f32; groups * n];
    let mut zeros = vec![0.0f32; groups * n];
    for r in 0..n {
        for g in 0..groups {
            let (c0, c1) = (g * group, ((g + 1) * group).min(k));
            let (s, z) = crate::formats::group_params(&w[r * k + c0..r * k + c1], symmetric);
            scales[g * n + r] = s;
            zeros[g * n + r] = z;
            for c in c0..c1 {
                codes[r * k + c] = crate::formats::quantize_code(w[r * k + c], s, z);
            }
        }
    }
    Int4Logical {
        n,
        k,
        group,
        codes,
        scales,
        zeros,
    }
}

/// W4A16 reference: `x W^T` with the int4 weights dequantised exactly (f64).
pub fn int4_linear(x: &[f32], m: usize, w: &Int4Logical) -> Vec<f32> {
    linear_by(x, m, w.n, w.k, |r, c| w.at(r, c))
}

/// Per-row symmetric int8 quantisation of activations: `scale = amax / 127`, `q = round(x / scale)` (ties away
/// from zero, as `roundf` in the kernels). Returns `(q [m, k], scales [m])`.
pub fn quantize_rows_int8(x: &[f32], m: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    assert_eq!(x.len(), m * k);
    let mut q = vec![0i8; m * k];
    let mut s = vec![0.0f32; m];
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        let amax = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        s[i] = if amax > 0.0 { amax / 127.0 } else { 0.0 };
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        for (dst, &v) in q[i * k..(i + 1) * k].iter_mut().zip(row) {
            *dst = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
    }
    (q, s)
}

/// W4A8 reference: activations quantised per row with [`quantize_rows_int8`], weights on the symmetric grid
/// (`zeros` must be 0), the integer dot products scaled back in f64. This is what the VNNI kernel computes, so a
/// kernel matches it to f32 rounding; the error against the unquantised [`int4_linear`] is the format's own.
pub fn w4a8_linear(x: &[f32], m: usize, w: &Int4Logical) -> Vec<f32> {
    assert!(
        w.zeros.iter().all(|&z| z == 0.0),
        "W4A8 needs the symmetric grid (zero point 8)"
    );
    let (q, s) = quantize_rows_int8(x, m, w.k);
    let mut y = vec![0.0f32; m * w.n];
    for i in 0..m {
        for r in 0..w.n {
            let mut acc = 0.0f64;
            for g in 0..w.groups() {
                let (c0, c1) = (g * w.group, ((g + 1) * w.group).min(w.k));
                let dot: i64 = (c0..c1)
                    .map(|c| i64::from(q[i * w.k + c]) * (i64::from(w.codes[r * w.k + c]) - 8))
                    .sum();
                acc += dot as f64 * f64::from(w.scales[g * w.n + r]);
            }
            y[i * w.n + r] = (acc * f64::from(s[i])) as f32;
        }
    }
    y
}
