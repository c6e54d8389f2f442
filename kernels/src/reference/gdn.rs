//! Gated DeltaNet reference: the token-by-token recurrence, written from the math in f64 with no blocking, no
//! chunking and no vector code. It is the oracle for the C decode step, the C chunked prefill and the CUDA kernels.
//! Layouts are those of [`crate::gdn`] (module docs); the states stay fp32 between tokens, as in the kernels.

use crate::gdn::{
    check_inputs, check_states, check_weights, GdnDims, GdnInputs, GdnWeights, L2NORM_EPS,
};
use crate::KernelError;

pub(crate) fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `log(1 + exp(x))` with torch's default `threshold = 20` (above it softplus returns `x`).
pub(crate) fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One token of one sequence: advances `conv_state` (`[conv_dim, K-1]`) and `state` (`[Hv, dk, dv]`) and writes
/// `out` (`[Hv*dv]`). `x` holds one token (`n = 1`).
pub fn step(
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    x: &GdnInputs<'_>,
    conv_state: &mut [f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "reference::gdn::step";
    check_weights(OP, dims, w)?;
    check_inputs(OP, dims, 1, x)?;
    check_states(OP, dims, 1, 1, conv_state, state, out)?;
    step_unchecked(dims, w, x, conv_state, state, out);
    Ok(())
}

/// `t` tokens of one sequence, one [`step`] after the other: what the chunked prefill must reproduce.
pub fn sequence(
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    t: usize,
    x: &GdnInputs<'_>,
    conv_state: &mut [f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "reference::gdn::sequence";
    check_weights(OP, dims, w)?;
    check_inputs(OP, dims, t, x)?;
    check_states(OP, dims, 1, t, conv_state, state, out)?;
    let (cd, vw, hv) = (dims.conv_dim(), dims.value_width(), dims.value_heads);
    for i in 0..t {
        let xi = GdnInputs {
            qkv: &x.qkv[i * cd..(i + 1) * cd],
            z: &x.z[i * vw..(i + 1) * vw],
            a: &x.a[i * hv..(i + 1) * hv],
            b: &x.b[i * hv..(i + 1) * hv],
        };
        step_unchecked(
            dims,
            w,
            &xi,
            conv_state,
            state,
            &mut out[i * vw..(i + 1) * vw],
        );
    }
    Ok(())
}

fn l2_normalised(x: &[f64], scale: f64) -> Vec<f64> {
    let ss: f64 = x.iter().map(|v| v * v).sum();
    let r = scale / (ss + L2NORM_EPS as f64).sqrt();
    x.iter().map(|v| v * r).collect()
}

fn step_unchecked(
    dims: &GdnDims,
    w: &GdnWeights<'_>,
    x: &GdnInputs<'_>,
    conv_state: &mut [f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let (hk, hv, dk, dv, kk) = (
        dims.key_heads,
        dims.value_heads,
        dims.key_dim,
        dims.value_dim,
        dims.conv_kernel,
    );
    let cd = dims.conv_dim();
    // Causal depthwise conv with SiLU; the window is the K-1 remembered inputs followed by the current one.
    let mut mixed = vec![0.0f64; cd];
    for c in 0..cd {
        let hist = &mut conv_state[c * (kk - 1)..(c + 1) * (kk - 1)];
        let wc = &w.conv_weight[c * kk..(c + 1) * kk];
        let mut acc = wc[kk - 1] as f64 * x.qkv[c] as f64;
        for j in 0..kk - 1 {
            acc += wc[j] as f64 * hist[j] as f64;
        }
        mixed[c] = silu(acc);
        if kk > 1 {
            hist.copy_within(1.., 0);
            hist[kk - 2] = x.qkv[c];
        }
    }
    let (q_all, rest) = mixed.split_at(hk * dk);
    let (k_all, v_all) = rest.split_at(hk * dk);
    let group = hv / hk;
    let q_scale = 1.0 / (dk as f64).sqrt();
    for h in 0..hv {
        let kh = h / group;
        let q = l2_normalised(&q_all[kh * dk..(kh + 1) * dk], q_scale);
        let k = l2_normalised(&k_all[kh * dk..(kh + 1) * dk], 1.0);
        let v = &v_all[h * dv..(h + 1) * dv];
        let g = -(w.a_log[h] as f64).exp() * softplus(x.a[h] as f64 + w.dt_bias[h] as f64);
        let beta = 1.0 / (1.0 + (-(x.b[h] as f64)).exp());
        let decay = g.exp();
        let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
        // kv = (exp(g) S)^T k
        let mut kv = vec![0.0f64; dv];
        for i in 0..dk {
            for j in 0..dv {
                kv[j] += decay * s[i * dv + j] as f64 * k[i];
            }
        }
        let delta: Vec<f64> = (0..dv).map(|j| beta * (v[j] - kv[j])).collect();
        let mut o = vec![0.0f64; dv];
        for i in 0..dk {
            for j in 0..dv {
                let sij = decay * s[i * dv + j] as f64 + k[i] * delta[j];
                s[i * dv + j] = sij as f32;
                o[j] += sij * q[i];
            }
        }
        // Gated RMSNorm over this head's dv outputs.
        let ms: f64 = o.iter().map(|v| v * v).sum::<f64>() / dv as f64;
        let r = 1.0 / (ms + w.norm_eps as f64).sqrt();
        for j in 0..dv {
            let zj = x.z[h * dv + j] as f64;
            out[h * dv + j] = (o[j] * r * w.norm_weight[j] as f64 * silu(zj)) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With beta = 1, no decay and a unit key, reading the state back with the key just written returns the value:
    /// the delta rule replaces what the key stored. This pins the sign conventions of the update.
    #[test]
    fn delta_rule_overwrites_the_value_of_a_unit_key() {
        let dims = GdnDims {
            key_heads: 1,
            value_heads: 1,
            key_dim: 4,
            value_dim: 3,
            conv_kernel: 1,
        };
        let cd = dims.conv_dim();
        // A conv of kernel 1 with weight w computes silu(w x); pick x so that silu gives exact known values is not
        // needed: we only compare S^T k against silu(v).
        let conv_weight = vec![1.0f32; cd];
        let (a_log, dt_bias, norm_weight) = (vec![-30.0f32], vec![0.0f32], vec![1.0f32; 3]);
        let w = GdnWeights {
            conv_weight: &conv_weight,
            a_log: &a_log,
            dt_bias: &dt_bias,
            norm_weight: &norm_weight,
            norm_eps: 1e-6,
        };
        let mut state: Vec<f32> = (0..12).map(|i| (i as f32 - 5.0) * 0.1).collect();
        let mut conv_state = vec![];
        let mut out = vec![0.0f32; 3];
        let qkv = [0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.5, -1.0, 2.0];
        let x = GdnInputs {
            qkv: &qkv,
            z: &[1.0; 3],
            a: &[0.0],
            b: &[40.0],
        };
        step(&dims, &w, &x, &mut conv_state, &mut state, &mut out).unwrap();
        // k = l2norm(silu([3,0,0,0])) = e0, so row 0 of S now holds silu(v).
        for (j, &v) in [0.5f64, -1.0, 2.0].iter().enumerate() {
            assert!(
                (state[j] as f64 - silu(v)).abs() < 1e-6,
                "S[0][{j}] = {} expected {}",
                state[j],
                silu(v)
            );
        }
        // Rows the key does not touch are only decayed (by exp(-exp(-30) * ln 2), i.e. not at all in f32).
        assert!((state[3] - (-0.2)).abs() < 1e-6);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let dims = GdnDims {
            key_heads: 2,
            value_heads: 3,
            key_dim: 4,
            value_dim: 4,
            conv_kernel: 4,
        };
        let e = dims.validate("t").unwrap_err();
        assert!(e.to_string().contains("multiple of key_heads"), "{e}");
    }
}
