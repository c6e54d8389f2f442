//! What the CPU and GPU test files (and the CPU sequence benchmark) share without a device: random inputs,
//! `AttnDims` / `GdnDims` in one line, the gated DeltaNet layer and tokens the GDN tests draw, the batched f64 decode
//! step they check against, and the scaled-error check.
//! A CPU test includes it with `mod common;`; `gpu_common` re-exports it.
#![allow(dead_code)] // each test file uses a different subset

use kernels::attention::AttnDims;
use kernels::gdn::{GdnDims, GdnInputs, GdnWeights};
use kernels::reference;
use kernels::KernelError;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// `n` values drawn uniformly from `lo..hi`.
pub(crate) fn uniform_in(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

/// `n` activations as a real layer's: mostly in `-typical..typical`, 1% outliers in `-outlier..outlier`.
pub(crate) fn with_outliers(
    rng: &mut ChaCha8Rng,
    n: usize,
    typical: f32,
    outlier: f32,
) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if rng.gen_bool(0.01) {
                rng.gen_range(-outlier..outlier)
            } else {
                rng.gen_range(-typical..typical)
            }
        })
        .collect()
}

/// Attention head counts and head dim.
pub(crate) fn attn(q_heads: usize, kv_heads: usize, head_dim: usize) -> AttnDims {
    AttnDims {
        q_heads,
        kv_heads,
        head_dim,
    }
}

/// A GDN layer's geometry: key heads, value heads, key dim, value dim, conv kernel.
pub(crate) const fn gdn_dims_of(
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    conv_kernel: usize,
) -> GdnDims {
    GdnDims {
        key_heads: hk,
        value_heads: hv,
        key_dim: dk,
        value_dim: dv,
        conv_kernel,
    }
}

/// A GDN layer with 128-wide key and value heads, the only width the CUDA kernels build.
pub(crate) const fn gdn_dims(key_heads: usize, value_heads: usize, conv_kernel: usize) -> GdnDims {
    gdn_dims_of(key_heads, value_heads, 128, 128, conv_kernel)
}

/// Random GDN layer weights: conv weights in (-conv_amp, conv_amp), `A_log` in `a_log`, dt bias in (-1, 1), norm
/// weights in (0.5, 1.5).
pub(crate) struct GdnLayer {
    pub(crate) conv_weight: Vec<f32>,
    pub(crate) a_log: Vec<f32>,
    pub(crate) dt_bias: Vec<f32>,
    pub(crate) norm_weight: Vec<f32>,
}

impl GdnLayer {
    pub(crate) fn new(
        dims: &GdnDims,
        rng: &mut ChaCha8Rng,
        conv_amp: f32,
        a_log: (f32, f32),
    ) -> GdnLayer {
        GdnLayer {
            conv_weight: uniform_in(rng, dims.conv_dim() * dims.conv_kernel, -conv_amp, conv_amp),
            a_log: uniform_in(rng, dims.value_heads, a_log.0, a_log.1),
            dt_bias: uniform_in(rng, dims.value_heads, -1.0, 1.0),
            norm_weight: uniform_in(rng, dims.value_dim, 0.5, 1.5),
        }
    }

    pub(crate) fn weights(&self) -> GdnWeights<'_> {
        GdnWeights {
            conv_weight: &self.conv_weight,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_weight,
            norm_eps: 1e-6,
        }
    }
}

/// The layer the prefill tests draw: conv weights in (-0.6, 0.6), `A_log` in `a_log`.
pub(crate) fn gdn_layer(dims: &GdnDims, rng: &mut ChaCha8Rng, a_log: (f32, f32)) -> GdnLayer {
    GdnLayer::new(dims, rng, 0.6, a_log)
}

/// Random GDN inputs of `n` tokens: qkv in (-qkv_amp, qkv_amp), z in (-2, 2), a in `a`, b in (-3, 3).
pub(crate) struct GdnTokens {
    pub(crate) qkv: Vec<f32>,
    pub(crate) z: Vec<f32>,
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
}

impl GdnTokens {
    pub(crate) fn new(
        dims: &GdnDims,
        n: usize,
        rng: &mut ChaCha8Rng,
        qkv_amp: f32,
        a: (f32, f32),
    ) -> GdnTokens {
        GdnTokens {
            qkv: uniform_in(rng, n * dims.conv_dim(), -qkv_amp, qkv_amp),
            z: uniform_in(rng, n * dims.value_width(), -2.0, 2.0),
            a: uniform_in(rng, n * dims.value_heads, a.0, a.1),
            b: uniform_in(rng, n * dims.value_heads, -3.0, 3.0),
        }
    }

    pub(crate) fn inputs(&self) -> GdnInputs<'_> {
        GdnInputs {
            qkv: &self.qkv,
            z: &self.z,
            a: &self.a,
            b: &self.b,
        }
    }

    /// Tokens `r0..r1`.
    pub(crate) fn rows(&self, dims: &GdnDims, r0: usize, r1: usize) -> GdnInputs<'_> {
        token_rows(dims, &self.inputs(), r0, r1)
    }
}

/// The tokens the prefill tests draw: qkv in (-1.5, 1.5), a in (-3, 2).
pub(crate) fn gdn_tokens(dims: &GdnDims, n: usize, rng: &mut ChaCha8Rng) -> GdnTokens {
    GdnTokens::new(dims, n, rng, 1.5, (-3.0, 2.0))
}

/// Tokens `r0..r1` of `x`.
pub(crate) fn token_rows<'a>(
    dims: &GdnDims,
    x: &GdnInputs<'a>,
    r0: usize,
    r1: usize,
) -> GdnInputs<'a> {
    let (cd, vw, hv) = (dims.conv_dim(), dims.value_width(), dims.value_heads);
    GdnInputs {
        qkv: &x.qkv[r0 * cd..r1 * cd],
        z: &x.z[r0 * vw..r1 * vw],
        a: &x.a[r0 * hv..r1 * hv],
        b: &x.b[r0 * hv..r1 * hv],
    }
}

/// One decode step of a batch of sequences (token `s` of `x` for sequence `s`, one token each) by the f64
/// reference, advancing each sequence's slice of `conv` and `state`; returns the outputs `[batch, value_width]`.
pub(crate) fn gdn_reference_steps(
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    x: &GdnInputs<'_>,
    conv: &mut [f32],
    state: &mut [f32],
) -> Vec<f32> {
    let (vw, cl, sl) = (dims.value_width(), dims.conv_state_len(), dims.state_len());
    let batch = x.a.len() / dims.value_heads;
    let mut want = vec![0.0f32; batch * vw];
    for s in 0..batch {
        let x = token_rows(dims, x, s, s + 1);
        let (c, st) = (
            &mut conv[s * cl..(s + 1) * cl],
            &mut state[s * sl..(s + 1) * sl],
        );
        reference::gdn::step(dims, w, &x, c, st, &mut want[s * vw..(s + 1) * vw]).unwrap();
    }
    want
}

/// Runs `run` (a prefill or the reference recurrence: length, tokens, conv history, state, output) on each
/// sequence of a batch of `lens` packed in `x`, each with its own slice of `conv` and `state`; returns the packed
/// outputs.
pub(crate) fn gdn_per_sequence(
    dims: &GdnDims,
    lens: &[usize],
    x: &GdnInputs<'_>,
    conv: &mut [f32],
    state: &mut [f32],
    mut run: impl FnMut(
        usize,
        &GdnInputs<'_>,
        &mut [f32],
        &mut [f32],
        &mut [f32],
    ) -> Result<(), KernelError>,
) -> Vec<f32> {
    let (cl, sl, vw) = (dims.conv_state_len(), dims.state_len(), dims.value_width());
    let mut out = vec![0.0f32; lens.iter().sum::<usize>() * vw];
    let mut r0 = 0;
    for (s, &l) in lens.iter().enumerate() {
        let (c, st) = (
            &mut conv[s * cl..(s + 1) * cl],
            &mut state[s * sl..(s + 1) * sl],
        );
        let o = &mut out[r0 * vw..(r0 + l) * vw];
        run(l, &token_rows(dims, x, r0, r0 + l), c, st, o).unwrap();
        r0 += l;
    }
    out
}

/// Asserts the scaled error `|got - want| / (1 + |want|)` is at most `tol` everywhere (a non-finite element fails),
/// naming the worst element and where `locate` says it is; prints and returns the worst error.
pub(crate) fn assert_scaled_close(
    what: &str,
    got: &[f32],
    want: &[f32],
    tol: f32,
    locate: impl Fn(usize) -> String,
) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0.0f32, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = if g.is_finite() {
            (g - w).abs() / (1.0 + w.abs())
        } else {
            f32::INFINITY
        };
        if err > worst.0 || err.is_nan() {
            worst = (err, i);
        }
    }
    let (err, i) = worst;
    println!("{what}: worst scaled error {err:e}");
    assert!(
        err <= tol,
        "{what}: element {i}{} is {} expected {} (scaled error {err:e} > {tol:e})",
        locate(i),
        got[i],
        want[i]
    );
    err
}
