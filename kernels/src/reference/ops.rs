//! References for the small ops of [`crate::ops`]: RMSNorm (`w` and `1 + w`), SiLU-and-mul, GELU(erf)-and-mul, in
//! f64 element by element.

use crate::ops::{check_glu, check_rmsnorm, NormWeight};
use crate::KernelError;

/// `out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w'` over rows of `dim`, `w' = w` or `1 + w` as `form` says.
pub fn rmsnorm(
    x: &[f32],
    weight: &[f32],
    form: NormWeight,
    eps: f32,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_rmsnorm("reference::ops::rmsnorm", x, weight, eps, out)?;
    let dim = weight.len();
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let r = 1.0 / (ms + eps as f64).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            let w = match form {
                NormWeight::Plain => w as f64,
                NormWeight::OnePlus => 1.0 + w as f64,
            };
            *o = (v as f64 * r * w) as f32;
        }
    }
    Ok(())
}

fn glu(
    gate_up: &[f32],
    inter: usize,
    out: &mut [f32],
    op: &'static str,
    act: fn(f64) -> f64,
) -> Result<(), KernelError> {
    check_glu(op, gate_up, inter, out)?;
    for (gu, o) in gate_up
        .chunks_exact(2 * inter)
        .zip(out.chunks_exact_mut(inter))
    {
        for j in 0..inter {
            o[j] = (act(gu[j] as f64) * gu[inter + j] as f64) as f32;
        }
    }
    Ok(())
}

/// `out = silu(gate) * up` over rows of `gate_up` (`[rows, 2*inter]`, gate first).
pub fn silu_and_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) -> Result<(), KernelError> {
    glu(
        gate_up,
        inter,
        out,
        "reference::ops::silu_and_mul",
        crate::reference::gdn::silu,
    )
}

/// `out = gelu_erf(gate) * up` over rows of `gate_up` (`[rows, 2*inter]`, gate first).
pub fn gelu_and_mul(gate_up: &[f32], inter: usize, out: &mut [f32]) -> Result<(), KernelError> {
    glu(
        gate_up,
        inter,
        out,
        "reference::ops::gelu_and_mul",
        gelu_erf,
    )
}

/// `0.5 x (1 + erf(x / sqrt 2))`, with erf from its Taylor series (|x| < 3) or its asymptotic continued fraction,
/// both to better than 1e-12: std has no erf.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

fn erf(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 3.0 {
        // erf(x) = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, x2) = (ax, ax, ax * ax);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + 1/2/(x + 1/(x + 3/2/(x + ...)))), evaluated bottom-up.
        let mut f = ax;
        for k in (1..60).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / f
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun table 7.1.
        for (x, want) in [
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265_0),
            (3.5, 0.999_999_256_9),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-9,
                "erf({x}) = {} want {want}",
                erf(x)
            );
            assert!((erf(-x) + want).abs() < 1e-9);
        }
    }
}
