//! The host side of the op set: a linear layer's weights as the checkpoint gives them, in the layout their CPU
//! kernel reads ([`Weight`], one variant per format, each accepted only by its own kernel), one `linear` call that
//! picks the kernel for the caller, and the small CPU ops the per-op modules do not have (GELU in its tanh form,
//! the sigmoid output gates, the f32 linear of the exact path, logit softcaps).
//!
//! A [`Weight`] is also what every [`super::Backend`] prepares its own linear layer from
//! ([`super::Backend::prepare`]); the functions here stay callable on their own for the engine's CPU forward pass.
//!
//! ```
//! use kernels::backend::Weight;
//! // A 3x4 f32 linear layer applied to two rows.
//! let w = Weight::f32(vec![1.0; 12], 3, 4).unwrap();
//! let x = [1.0f32, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5];
//! let mut y = [f32::NAN; 6];
//! w.linear(&x, 2, &mut y).unwrap();
//! assert_eq!(y, [10.0, 10.0, 10.0, 2.0, 2.0, 2.0]);
//! ```

use crate::cpu::{default_threads, parallel_ranges, Isa, SharedMut};
use crate::linear::{self, Bf16Weights, Fp8Weights, Int4Scheme, Int4Weights, Nvfp4Weights};
pub use crate::ops::gelu_tanh_and_mul;
use crate::KernelError;

/// A GPTQ module's tensors as the checkpoint stores them, for [`Weight::gptq`]: `qweight` `[k / 8, n]` (eight
/// 4-bit codes per word, input channel `i` in bits `4 * (i % 8)` of row `i / 8`), `qzeros` `[groups, n / 8]`
/// (likewise by output feature), `scales` `[groups, n]`, `g_idx` `[k]` (each input channel's group).
#[derive(Debug, Clone, Copy)]
pub struct GptqTensors<'a> {
    pub qweight: &'a [i32],
    pub qzeros: &'a [i32],
    pub scales: &'a [f32],
    pub g_idx: &'a [i32],
}

/// A linear layer's weights `[n, k]` (output features first) in the layout its kernel reads.
#[derive(Debug, Clone)]
pub enum Weight {
    /// f32, computed in f32 (the exact path for f32 / f16 checkpoints).
    F32 { w: Vec<f32>, n: usize, k: usize },
    /// bf16 bits, computed with f32 accumulation (the exact path for bf16 checkpoints).
    Bf16 { w: Vec<u16>, n: usize, k: usize },
    /// FP8 e4m3 with 128x128 block scales (`weight_scale_inv`, multiply).
    Fp8Block {
        w: Vec<u8>,
        scale_inv: Vec<f32>,
        n: usize,
        k: usize,
    },
    /// NVFP4: e2m1 pairs (even element in the low nibble), e4m3 scales per 16, a global f32 scale.
    Nvfp4 {
        w: Vec<u8>,
        scales: Vec<u8>,
        global: f32,
        n: usize,
        k: usize,
    },
    /// The chunked int4 pack, read by W4A16 ([`Int4Scheme::Asymmetric`]) or W4A8 ([`Int4Scheme::Symmetric`]).
    Int4 { w: Int4Weights, a8: bool },
}

fn checked_len(op: &'static str, n: usize, k: usize) -> Result<usize, KernelError> {
    linear::check_nk(op, n, k)?;
    n.checked_mul(k)
        .ok_or_else(|| KernelError::shape(op, format!("n*k overflows ({n} x {k})")))
}

/// Checks an unquantised `[n, k]` weight of `len` elements.
fn check_dense(op: &'static str, n: usize, k: usize, len: usize) -> Result<(), KernelError> {
    let want = checked_len(op, n, k)?;
    crate::ensure_shape!(len == want, op, "{len} elements, expected {n}x{k}");
    Ok(())
}

impl Weight {
    /// f32 weights `[n, k]`.
    pub fn f32(w: Vec<f32>, n: usize, k: usize) -> Result<Weight, KernelError> {
        check_dense("Weight::f32", n, k, w.len())?;
        Ok(Weight::F32 { w, n, k })
    }

    /// bf16 weights `[n, k]` (bits).
    pub fn bf16(w: Vec<u16>, n: usize, k: usize) -> Result<Weight, KernelError> {
        check_dense("Weight::bf16", n, k, w.len())?;
        Ok(Weight::Bf16 { w, n, k })
    }

    /// FP8 block weights; the sizes are checked by the kernel's own constructor.
    pub fn fp8_block(
        w: Vec<u8>,
        scale_inv: Vec<f32>,
        n: usize,
        k: usize,
    ) -> Result<Weight, KernelError> {
        checked_len("Weight::fp8_block", n, k)?;
        Fp8Weights::new(&w, &scale_inv, n, k)?;
        Ok(Weight::Fp8Block { w, scale_inv, n, k })
    }

    /// FP8 with one scale for the whole tensor (modelopt's per-tensor FP8): the block kernel with every block's
    /// scale equal, so it runs on the same tested code.
    pub fn fp8_tensor(w: Vec<u8>, scale: f32, n: usize, k: usize) -> Result<Weight, KernelError> {
        checked_len("Weight::fp8_tensor", n, k)?;
        let blocks = n.div_ceil(128) * k.div_ceil(128);
        Self::fp8_block(w, vec![scale; blocks], n, k)
    }

    /// NVFP4 weights; the sizes are checked by the kernel's own constructor.
    pub fn nvfp4(
        w: Vec<u8>,
        scales: Vec<u8>,
        global: f32,
        n: usize,
        k: usize,
    ) -> Result<Weight, KernelError> {
        checked_len("Weight::nvfp4", n, k)?;
        Nvfp4Weights::new(&w, &scales, global, n, k)?;
        Ok(Weight::Nvfp4 {
            w,
            scales,
            global,
            n,
            k,
        })
    }

    /// Quantises f32 rows into the chunked int4 pack, one 64-row block at a time (`rows(row0, buf)` fills the
    /// block), for W4A16 (`a8 = false`, asymmetric grid) or W4A8 (`a8 = true`, GPTQ's symmetric grid).
    pub fn int4_from_rows(
        n: usize,
        k: usize,
        group: usize,
        a8: bool,
        rows: impl FnMut(usize, &mut [f32]) -> Result<(), KernelError>,
    ) -> Result<Weight, KernelError> {
        checked_len("Weight::int4_from_rows", n, k)?;
        let scheme = if a8 {
            Int4Scheme::Symmetric
        } else {
            Int4Scheme::Asymmetric
        };
        Ok(Weight::Int4 {
            w: Int4Weights::quantize_with(n, k, group, scheme, rows)?,
            a8,
        })
    }

    /// A GPTQ 4-bit module (`qweight`, `qzeros`, `scales`, `g_idx` as AutoGPTQ stores them, `[n, k]` logical,
    /// groups of `group` input channels in order) unpacked into the chunked int4 pack the W4A16 kernel reads. The
    /// stored zero is AutoGPTQ's v1 convention (`stored + 1` is the zero point; a symmetric export stores 7 for
    /// 8), so `w = (q - z) * s` becomes the pack's `(q - 8) * s + (8 - z) * s`. The pack keeps scales and zeros in
    /// bf16: the unpacked weights differ from the f16 scales by at most a bf16 rounding (2^-9 relative) of each
    /// group's scale. Every tensor's length is checked against `n`, `k` and `group`, and a `g_idx` that reorders
    /// the input channels (act-order) is refused.
    pub fn gptq(
        t: &GptqTensors<'_>,
        n: usize,
        k: usize,
        group: usize,
    ) -> Result<Weight, KernelError> {
        const OP: &str = "Weight::gptq";
        checked_len(OP, n, k)?;
        crate::ensure_shape!(
            crate::linear::int4::GROUPS.contains(&group),
            OP,
            "group {group}; the int4 pack takes {:?}",
            crate::linear::int4::GROUPS
        );
        let groups = k.div_ceil(group);
        let packed_rows = k.div_ceil(8);
        let zero_cols = n.div_ceil(8);
        let expect = |name: &str, got: usize, want: Option<usize>| -> Result<(), KernelError> {
            let want = want.ok_or_else(|| {
                KernelError::shape(OP, format!("the size of {name} overflows usize"))
            })?;
            crate::ensure_shape!(
                got == want,
                OP,
                "{name} has {got} elements, expected {want} (n = {n}, k = {k}, group = {group})"
            );
            Ok(())
        };
        expect("qweight", t.qweight.len(), packed_rows.checked_mul(n))?;
        expect("qzeros", t.qzeros.len(), groups.checked_mul(zero_cols))?;
        expect("scales", t.scales.len(), groups.checked_mul(n))?;
        expect("g_idx", t.g_idx.len(), Some(k))?;
        if let Some(i) = (0..k).find(|&i| usize::try_from(t.g_idx[i]).ok() != Some(i / group)) {
            return Err(KernelError::shape(
                OP,
                format!(
                    "g_idx[{i}] = {} reorders the input channels (act-order); the int4 pack needs groups in order",
                    t.g_idx[i]
                ),
            ));
        }
        let mut codes = vec![0u8; n * k];
        for i in 0..k {
            for j in 0..n {
                let word = t.qweight[(i / 8) * n + j] as u32;
                codes[j * k + i] = ((word >> (4 * (i % 8))) & 0xF) as u8;
            }
        }
        let mut scales = vec![0.0f32; groups * n];
        let mut zeros = vec![0.0f32; groups * n];
        for g in 0..groups {
            for j in 0..n {
                let z =
                    ((t.qzeros[g * zero_cols + j / 8] as u32 >> (4 * (j % 8))) & 0xF) as f32 + 1.0;
                let s = t.scales[g * n + j];
                scales[g * n + j] = s;
                zeros[g * n + j] = (8.0 - z) * s;
            }
        }
        let logical = crate::reference::linear::Int4Logical {
            n,
            k,
            group,
            codes,
            scales,
            zeros,
        };
        Ok(Weight::Int4 {
            w: Int4Weights::from_logical(&logical, Int4Scheme::Asymmetric)?,
            a8: false,
        })
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.shape().0
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.shape().1
    }

    /// `(n, k)`.
    fn shape(&self) -> (usize, usize) {
        match self {
            Weight::F32 { n, k, .. }
            | Weight::Bf16 { n, k, .. }
            | Weight::Fp8Block { n, k, .. }
            | Weight::Nvfp4 { n, k, .. } => (*n, *k),
            Weight::Int4 { w, .. } => (w.n(), w.k()),
        }
    }

    /// Bytes a forward call reads (weights plus scales).
    pub fn bytes(&self) -> usize {
        match self {
            Weight::F32 { w, .. } => w.len() * 4,
            Weight::Bf16 { w, .. } => w.len() * 2,
            Weight::Fp8Block { w, scale_inv, .. } => w.len() + scale_inv.len() * 4,
            Weight::Nvfp4 { w, scales, .. } => w.len() + scales.len(),
            Weight::Int4 { w, .. } => w.bytes(),
        }
    }

    /// The weight path's name as plans and reports print it.
    pub fn path_name(&self) -> &'static str {
        match self {
            Weight::F32 { .. } => "f32",
            Weight::Bf16 { .. } => "bf16",
            Weight::Fp8Block { .. } => "fp8_block",
            Weight::Nvfp4 { .. } => "nvfp4",
            Weight::Int4 { a8: false, .. } => "w4a16",
            Weight::Int4 { a8: true, .. } => "w4a8",
        }
    }

    /// `y[m, n] = x[m, k] @ W^T` with the kernel of this format on the fastest path this CPU has; returns the
    /// path that ran (the f32 linear is plain Rust and reports [`Isa::Scalar`]).
    pub fn linear(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<Isa, KernelError> {
        match self {
            Weight::F32 { w, n, k } => f32_linear(x, m, w, *n, *k, y).map(|()| Isa::Scalar),
            Weight::Bf16 { w, n, k } => linear::bf16(x, m, &Bf16Weights::new(w, *n, *k)?, y),
            Weight::Fp8Block { w, scale_inv, n, k } => {
                linear::fp8(x, m, &Fp8Weights::new(w, scale_inv, *n, *k)?, y)
            }
            Weight::Nvfp4 {
                w,
                scales,
                global,
                n,
                k,
            } => linear::nvfp4(x, m, &Nvfp4Weights::new(w, scales, *global, *n, *k)?, y),
            Weight::Int4 { w, a8: false } => linear::w4a16(x, m, w, y),
            Weight::Int4 { w, a8: true } => linear::w4a8(x, m, w, y),
        }
    }

    /// [`Weight::linear`] with the W4A16 integer GEMM's activation encoding chosen by the caller (`acts`, a plan's
    /// prompt precision); other formats ignore it. Returns the encoding the integer GEMM ran with, `None` when no
    /// integer GEMM ran (another format, one row, a CPU without AVX512-VBMI, or activations it cannot hold, which
    /// take the f32 kernels): the caller's proof of which numerics it got.
    pub fn linear_acts(
        &self,
        x: &[f32],
        m: usize,
        acts: linear::GemmActs,
        y: &mut [f32],
    ) -> Result<Option<linear::GemmActs>, KernelError> {
        match self {
            Weight::Int4 { w, a8: false } => {
                let ran = linear::w4a16_gemm_ext(
                    Isa::detected(),
                    linear::Ext::Auto,
                    acts,
                    default_threads(),
                    x,
                    m,
                    w,
                    y,
                )?;
                // With m > 1 the VBMI variant is only ever the integer GEMM (`w4a16_gemm_ext`).
                Ok((m > 1 && ran.vbmi).then_some(acts))
            }
            _ => self.linear(x, m, y).map(|_| None),
        }
    }

    /// Row `row` of the weight as f32 (an embedding lookup through a tied head).
    pub fn row(&self, row: usize, out: &mut [f32]) -> Result<(), KernelError> {
        const OP: &str = "Weight::row";
        let (n, k) = (self.n(), self.k());
        crate::ensure_shape!(row < n, OP, "row {row} is past the {n} rows");
        crate::ensure_shape!(
            out.len() == k,
            OP,
            "out has {} elements, expected {k}",
            out.len()
        );
        match self {
            Weight::F32 { w, .. } => out.copy_from_slice(&w[row * k..(row + 1) * k]),
            Weight::Bf16 { w, .. } => {
                for (o, &b) in out.iter_mut().zip(&w[row * k..(row + 1) * k]) {
                    *o = crate::formats::bf16_to_f32(b);
                }
            }
            Weight::Int4 { w, .. } => w.dequantize_row(row, out)?,
            Weight::Fp8Block { w, scale_inv, .. } => {
                // 128x128 blocks: the row's scales are one row of the block grid.
                let scales = &scale_inv[(row / 128) * k.div_ceil(128)..];
                for (j, (o, &c)) in out.iter_mut().zip(&w[row * k..(row + 1) * k]).enumerate() {
                    *o = crate::formats::e4m3_to_f32(c) * scales[j / 128];
                }
            }
            Weight::Nvfp4 {
                w, scales, global, ..
            } => {
                // e2m1 pairs, the even element in the low nibble; one e4m3 scale per 16 values.
                let (bytes, sc) = (&w[row * k / 2..], &scales[row * (k / 16)..]);
                for (j, o) in out.iter_mut().enumerate() {
                    let code = (bytes[j / 2] >> (4 * (j % 2))) & 0xf;
                    *o = crate::formats::e2m1_to_f32(code)
                        * crate::formats::e4m3_to_f32(sc[j / 16])
                        * global;
                }
            }
        }
        Ok(())
    }
}

/// f32 linear `y[m, n] = x[m, k] @ w[n, k]^T`, threads splitting the output features. Plain Rust: it runs the
/// exact path of small f32 checkpoints (parity tests), not a decode hot path, so the compiler's vectorisation of
/// four independent dot products is enough.
pub fn f32_linear(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    y: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "f32_linear";
    let nk = checked_len(OP, n, k)?;
    crate::ensure_shape!(m > 0, OP, "m must be positive");
    let mk = m
        .checked_mul(k)
        .ok_or_else(|| KernelError::shape(OP, "m*k overflows"))?;
    let mn = m
        .checked_mul(n)
        .ok_or_else(|| KernelError::shape(OP, "m*n overflows"))?;
    crate::ensure_shape!(
        w.len() == nk,
        OP,
        "w has {} elements, expected {n}x{k}",
        w.len()
    );
    crate::ensure_shape!(
        x.len() == mk,
        OP,
        "x has {} elements, expected {m}x{k}",
        x.len()
    );
    crate::ensure_shape!(
        y.len() == mn,
        OP,
        "y has {} elements, expected {m}x{n}",
        y.len()
    );
    let out = SharedMut(y.as_mut_ptr());
    parallel_ranges(n, 8, default_threads(), |c0, c1| {
        for r in 0..m {
            let xr = &x[r * k..(r + 1) * k];
            for c in c0..c1 {
                let wr = &w[c * k..(c + 1) * k];
                let mut acc = [0.0f32; 4];
                let mut i = 0;
                while i + 4 <= k {
                    for l in 0..4 {
                        acc[l] += xr[i + l] * wr[i + l];
                    }
                    i += 4;
                }
                let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                while i < k {
                    s += xr[i] * wr[i];
                    i += 1;
                }
                // SAFETY: r < m and c0 <= c < c1 <= n, so the index is inside y (m*n elements, checked); this
                // thread owns columns c0..c1 of every row.
                unsafe { *out.get().add(r * n + c) = s };
            }
        }
    });
    Ok(())
}

/// `x = x * sigmoid(gate)` element-wise (Qwen3.5's per-element attention output gate).
pub fn sigmoid_gate(x: &mut [f32], gate: &[f32]) -> Result<(), KernelError> {
    crate::ensure_shape!(
        x.len() == gate.len(),
        "sigmoid_gate",
        "x has {} elements and gate {}",
        x.len(),
        gate.len()
    );
    for (x, &g) in x.iter_mut().zip(gate) {
        *x *= 1.0 / (1.0 + (-g).exp());
    }
    Ok(())
}

/// `x[t, h, :] *= sigmoid(gate[t, h])` (Spark's per-head output gate); `x` is `[rows, heads, head_dim]`.
pub fn sigmoid_head_gate(x: &mut [f32], heads: usize, gate: &[f32]) -> Result<(), KernelError> {
    const OP: &str = "sigmoid_head_gate";
    crate::ensure_shape!(
        heads > 0
            && !gate.is_empty()
            && gate.len().is_multiple_of(heads)
            && x.len().is_multiple_of(gate.len()),
        OP,
        "x has {} elements, gate {} for {heads} heads",
        x.len(),
        gate.len()
    );
    let d = x.len() / gate.len();
    for (xh, &g) in x.chunks_exact_mut(d).zip(gate) {
        let s = 1.0 / (1.0 + (-g).exp());
        xh.iter_mut().for_each(|v| *v *= s);
    }
    Ok(())
}

/// `x = cap * tanh(x / cap)` (Gemma 2's logit softcap).
pub fn softcap(x: &mut [f32], cap: f32) {
    x.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.gen_range(-1.0..1.0)).collect()
    }

    #[test]
    fn f32_linear_matches_f64_reference_on_ragged_shapes_with_a_poisoned_output() {
        for &(m, n, k) in &[(1, 1, 1), (3, 17, 29), (5, 67, 130), (1, 200, 7)] {
            let (x, w) = (rnd(m * k, 1), rnd(n * k, 2));
            let mut y = vec![f32::NAN; m * n];
            f32_linear(&x, m, &w, n, k, &mut y).unwrap();
            for r in 0..m {
                for c in 0..n {
                    let want: f64 = (0..k)
                        .map(|i| x[r * k + i] as f64 * w[c * k + i] as f64)
                        .sum();
                    assert!(
                        (y[r * n + c] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{m}x{n}x{k}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_sizes_are_errors_not_crashes() {
        assert!(f32_linear(&[], 1, &[], 1 << 40, 1 << 40, &mut []).is_err());
        assert!(Weight::f32(vec![], usize::MAX, 2).is_err());
        assert!(Weight::bf16(vec![0; 3], 2, 2).is_err());
        assert!(gelu_tanh_and_mul(&[0.0; 3], 2, &mut [0.0; 2]).is_err());
        assert!(sigmoid_head_gate(&mut [0.0; 4], 3, &[0.0; 3]).is_err());
    }

    #[test]
    fn gelu_tanh_matches_its_formula_in_f64() {
        let gu = rnd(2 * 2 * 33, 3);
        let mut out = vec![f32::NAN; 2 * 33];
        gelu_tanh_and_mul(&gu, 33, &mut out).unwrap();
        for r in 0..2 {
            for i in 0..33 {
                let g = gu[r * 66 + i] as f64;
                let u = gu[r * 66 + 33 + i] as f64;
                let want = 0.5
                    * g
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g))
                            .tanh())
                    * u;
                assert!((out[r * 33 + i] as f64 - want).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn gates_scale_by_the_sigmoid() {
        let mut x = vec![2.0f32; 6];
        sigmoid_head_gate(&mut x, 2, &[0.0, 100.0]).unwrap();
        assert_eq!(x, [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
        let mut y = vec![4.0f32, 4.0];
        sigmoid_gate(&mut y, &[0.0, -100.0]).unwrap();
        assert_eq!(y[0], 2.0);
        assert!(y[1] < 1e-30);
    }

    #[test]
    fn every_format_computes_the_same_layer_within_its_rounding() {
        let (n, k, m) = (70, 256, 3);
        let w = rnd(n * k, 4);
        let x = rnd(m * k, 5);
        let bf: Vec<u16> = w.iter().map(|&v| crate::formats::f32_to_bf16(v)).collect();
        let int4 = Weight::int4_from_rows(n, k, 64, false, |r0, buf| {
            buf.copy_from_slice(&w[r0 * k..r0 * k + buf.len()]);
            Ok(())
        })
        .unwrap();
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(6);
        // FP8 codes below 2 in magnitude (never NaN) with 128x128 block scales; NVFP4 pairs with e4m3 group scales.
        let fp8 = Weight::fp8_block(
            (0..n * k).map(|_| r.gen::<u8>() & 0xbf).collect(),
            (0..n.div_ceil(128) * k.div_ceil(128))
                .map(|_| r.gen_range(0.01..0.1))
                .collect(),
            n,
            k,
        )
        .unwrap();
        let nvfp4 = Weight::nvfp4(
            (0..n * k / 2).map(|_| r.gen()).collect(),
            (0..n * k / 16)
                .map(|_| crate::formats::f32_to_e4m3(r.gen_range(0.25..2.0)))
                .collect(),
            0.03,
            n,
            k,
        )
        .unwrap();
        // Each format against the f32 linear of its own dequantised rows: only accumulation order may differ.
        for weight in [Weight::bf16(bf, n, k).unwrap(), int4, fp8, nvfp4] {
            let mut deq = vec![0.0f32; n * k];
            for (r, row) in deq.chunks_exact_mut(k).enumerate() {
                weight.row(r, row).unwrap();
            }
            let mut want = vec![0.0; m * n];
            f32_linear(&x, m, &deq, n, k, &mut want).unwrap();
            let mut y = vec![f32::NAN; m * n];
            // The fast path ran: the detected ISA's kernel, not a silent fallback.
            assert_eq!(
                weight.linear(&x, m, &mut y).unwrap(),
                Isa::detected(),
                "{}",
                weight.path_name()
            );
            let err = y
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-3, "{}: max error {err}", weight.path_name());
        }
    }
}
