//! Attention references: dense softmax attention in f64 over a plain `[n, Hkv, D]` history, causal prefill with an
//! optional sliding window, and neox RoPE. Layouts are those of [`crate::attention`] (module docs). These are the
//! oracle for the C kernels (paged and ring decode, tiled prefill) and the CUDA ones.

use crate::attention::check_window;
use crate::shapes::{AttnDims, Rope};
use crate::KernelError;

/// Applies neox RoPE in place to `x` (`[t, heads, head_dim]`), row `i` at position `positions[i]`.
pub fn rope_neox(
    rope: &Rope,
    heads: usize,
    positions: &[u32],
    x: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "reference::attention::rope_neox";
    rope.validate(OP)?;
    let row = heads * rope.head_dim;
    crate::ensure_shape!(
        x.len() == positions.len() * row,
        OP,
        "x has {} elements, expected positions ({}) x heads ({heads}) x head_dim ({})",
        x.len(),
        positions.len(),
        rope.head_dim
    );
    let half = rope.rotary_dim / 2;
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..heads {
            let v = &mut x[t * row + h * rope.head_dim..t * row + (h + 1) * rope.head_dim];
            for i in 0..half {
                let angle = (p as f32 * rope.inv_freq(i)) as f64;
                let (s, c) = angle.sin_cos();
                let (x1, x2) = (v[i] as f64, v[i + half] as f64);
                v[i] = (x1 * c - x2 * s) as f32;
                v[i + half] = (x2 * c + x1 * s) as f32;
            }
        }
    }
    Ok(())
}

/// Softmax attention of one query row (`[D]`) over keys `0..n` of KV head `kvh` in `k`, `v` (`[n, Hkv, D]`),
/// restricted to `keys`.
#[allow(clippy::too_many_arguments)]
fn attend(
    dims: &AttnDims,
    scale: f64,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    kvh: usize,
    keys: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let d = dims.head_dim;
    let stride = dims.kv_heads * d;
    let scores: Vec<f64> = keys
        .clone()
        .map(|j| {
            let kr = &k[j * stride + kvh * d..j * stride + (kvh + 1) * d];
            q.iter()
                .zip(kr)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = p.iter().sum();
    let mut acc = vec![0.0f64; d];
    for (pj, j) in p.iter().zip(keys) {
        let vr = &v[j * stride + kvh * d..j * stride + (kvh + 1) * d];
        for (a, &b) in acc.iter_mut().zip(vr) {
            *a += pj * b as f64;
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = (a / z) as f32;
    }
}

/// Decode for one sequence: query `q` (`[Hq, D]`) is the token at position `n - 1` and attends over the dense
/// history `k`, `v` (`[n, Hkv, D]`, which includes it); with `window = Some(W)` only the last `W` tokens.
#[allow(clippy::too_many_arguments)]
pub fn decode_dense(
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    n: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "reference::attention::decode_dense";
    dims.validate(OP)?;
    check_window(OP, window)?;
    let (d, hq, hkv) = (dims.head_dim, dims.q_heads, dims.kv_heads);
    crate::ensure_shape!(
        n > 0,
        OP,
        "the history must hold at least the current token"
    );
    crate::ensure_shape!(
        q.len() == hq * d && out.len() == hq * d,
        OP,
        "q and out must have Hq*D = {} elements",
        hq * d
    );
    crate::ensure_shape!(
        k.len() == n * hkv * d && v.len() == n * hkv * d,
        OP,
        "k and v must have n*Hkv*D = {} elements",
        n * hkv * d
    );
    let start = window.map_or(0, |w| n.saturating_sub(w));
    for h in 0..hq {
        let kvh = h / (hq / hkv);
        attend(
            dims,
            scale as f64,
            &q[h * d..(h + 1) * d],
            k,
            v,
            kvh,
            start..n,
            &mut out[h * d..(h + 1) * d],
        );
    }
    Ok(())
}

/// Causal prefill of `t` tokens: `q` `[t, Hq, D]`, `k`, `v` `[t, Hkv, D]`, `out` `[t, Hq, D]`; with
/// `window = Some(W)` query `i` sees keys `i+1-W ..= i`.
#[allow(clippy::too_many_arguments)]
pub fn prefill(
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    t: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "reference::attention::prefill";
    dims.validate(OP)?;
    check_window(OP, window)?;
    let (d, hq, hkv) = (dims.head_dim, dims.q_heads, dims.kv_heads);
    crate::ensure_shape!(
        q.len() == t * hq * d && out.len() == t * hq * d,
        OP,
        "q and out must have t*Hq*D = {} elements",
        t * hq * d
    );
    crate::ensure_shape!(
        k.len() == t * hkv * d && v.len() == t * hkv * d,
        OP,
        "k and v must have t*Hkv*D = {} elements",
        t * hkv * d
    );
    for i in 0..t {
        let start = window.map_or(0, |w| (i + 1).saturating_sub(w));
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let row = (i * hq + h) * d;
            attend(
                dims,
                scale as f64,
                &q[row..row + d],
                k,
                v,
                kvh,
                start..i + 1,
                &mut out[row..row + d],
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_the_first_pair_by_the_position() {
        let rope = Rope::new(8, 0.5, 10000.0).unwrap();
        assert_eq!(rope.rotary_dim, 4);
        // Pair 0 has inv_freq 1, so position 1 rotates (x0, x2) by one radian; dims 4.. pass through.
        let mut x = vec![1.0f32, 0.0, 0.0, 0.0, 7.0, 7.0, 7.0, 7.0];
        rope_neox(&rope, 1, &[1], &mut x).unwrap();
        assert!(
            (x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6,
            "{x:?}"
        );
        assert_eq!(&x[4..], &[7.0; 4]);
    }

    #[test]
    fn one_key_returns_its_value() {
        let dims = AttnDims {
            q_heads: 2,
            kv_heads: 1,
            head_dim: 2,
        };
        let mut out = vec![0.0; 4];
        decode_dense(
            &dims,
            1.0,
            None,
            1,
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0],
            &[-1.0, 0.5],
            &mut out,
        )
        .unwrap();
        assert_eq!(out, vec![-1.0, 0.5, -1.0, 0.5]);
    }

    #[test]
    fn zero_window_is_an_error() {
        let dims = AttnDims {
            q_heads: 1,
            kv_heads: 1,
            head_dim: 1,
        };
        let e = prefill(&dims, 1.0, Some(0), 1, &[0.0], &[0.0], &[0.0], &mut [0.0]).unwrap_err();
        assert!(e.to_string().contains("at least 1 token"), "{e}");
    }
}
