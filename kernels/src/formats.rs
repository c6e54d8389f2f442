//! Bit-exact conversions between f32 and the narrow number formats the weight kernels read: FP8 `e4m3fn`
//! (the FP8 block checkpoints and the NVFP4 per-16 scales), FP4 `e2m1` (the NVFP4 codes) and `bf16`.
//!
//! These are the definitions every kernel, reference and test in the crate agrees on, and the CUDA tests use them
//! as their oracle, so they are written for clarity and tested exhaustively over every code (256 for e4m3, 16 for
//! e2m1, 65536 for bf16) rather than tuned for speed. The C kernels decode the same codes with bit tricks in
//! registers; their tests compare against these functions.

/// Decodes one FP8 `e4m3fn` code: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities,
/// `S.1111.111` is NaN, largest finite magnitude 448, smallest subnormal 2^-9.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0x0F);
    let man = f32::from(code & 0x07);
    if exp == 0x0F && code & 0x07 == 0x07 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        // Subnormal: 0.mmm x 2^(1 - 7).
        man / 8.0 * pow2(-6)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    sign * mag
}

/// Encodes an f32 as FP8 `e4m3fn`, rounding to nearest with ties to even and saturating to +-448 (the behaviour
/// of `torch.float8_e4m3fn` casts after a clamp, which is how FP8 checkpoints are made). Infinities saturate too;
/// NaN maps to the NaN code with the input's sign.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    // The unbiased binary exponent of `a`, clamped to the smallest normal exponent so that subnormals share the
    // same quantum (2^-9) as the bottom binade.
    let bits = a.to_bits();
    let exp = (((bits >> 23) & 0xFF) as i32 - 127).max(-6);
    // `a / quantum` is exact (a power-of-two scaling that stays normal), so this is a single correct rounding.
    let q = (a / pow2(exp - 3)).round_ties_even() as i32;
    // q is in 8..=16 for normals (0..=8 for the subnormal binade); 16 carries into the next binade by itself.
    let code = ((exp + 7) << 3) + q - 8;
    sign | code as u8
}

/// The eight non-negative values of FP4 `e2m1`, indexed by the low three bits of a code.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decodes one FP4 `e2m1` code (the low four bits of `code`; bit 3 is the sign).
pub fn e2m1_to_f32(code: u8) -> f32 {
    let v = E2M1_VALUES[usize::from(code & 0x07)];
    if code & 0x08 != 0 {
        -v
    } else {
        v
    }
}

/// Encodes an f32 as FP4 `e2m1` (a code in the low four bits), rounding to nearest with ties to the even code and
/// saturating to +-6. NaN has no e2m1 code and maps to +0; callers quantise finite weights only.
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let sign: u8 = if x.is_sign_negative() { 0x08 } else { 0 };
    let a = x.abs();
    // Decision points are the midpoints between neighbouring values; `<=` sends a tie down to the even code
    // (codes 0, 2, 4, 6), `<` sends it up to the even code above.
    let code = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

/// Decodes a `bf16` (the top 16 bits of an f32); exact.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Encodes an f32 as `bf16`, rounding to nearest with ties to even; NaN stays a (quiet) NaN with its sign.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// 2^e for the small exponents these formats use, built from the bit pattern so it is exact.
fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// The int4 group sizes the tinygemm kernels are built for (`linear::int4::GROUPS`).
pub const INT4_GROUPS: [usize; 3] = [32, 64, 128];

/// Edge of the square FP8 scale block (`weight_block_size = [128, 128]`).
pub const FP8_BLOCK: usize = 128;
/// Elements per NVFP4 scale (modelopt's group 16).
pub const NVFP4_GROUP: usize = 16;

/// Logical (unpacked) group-quantised int4 weights in the tinygemm convention: `codes[n][k]` in `0..16`,
/// per-group `scales` and `zeros` `[ceil(k/group)][n]`, and `w = (code - 8) * scale + zero`. The asymmetric
/// quantiser puts the group minimum at code 0; the symmetric (GPTQ) one has `zero = 0`, i.e. zero point 8.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Logical {
    pub n: usize,
    pub k: usize,
    pub group: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub zeros: Vec<f32>,
}

impl Int4Logical {
    /// Number of scale rows: the last group may be short when `k` is not a multiple of `group`.
    pub fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }

    /// The dequantised weight at (`row`, `col`), in f64.
    pub fn at(&self, row: usize, col: usize) -> f64 {
        let g = (col / self.group) * self.n + row;
        (f64::from(self.codes[row * self.k + col]) - 8.0) * f64::from(self.scales[g])
            + f64::from(self.zeros[g])
    }
}

// The int4 grid: how a group of weights maps to codes, shared by the packer and the reference it is tested against.

/// Scale and zero of one group, both rounded to bf16 (the stored precision) before any code is chosen, so codes
/// are the nearest ones under the weights the kernels will actually decode.
pub(crate) fn group_params(vals: &[f32], symmetric: bool) -> (f32, f32) {
    let bf = |v: f32| bf16_to_f32(f32_to_bf16(v));
    if symmetric {
        let amax = vals.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        (bf(2.0 * amax / 15.0), 0.0)
    } else {
        let lo = vals.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let hi = vals.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let scale = bf((hi - lo) / 15.0);
        (scale, bf(lo + 8.0 * scale))
    }
}

/// The code in `0..16` nearest to `v` under `(code - 8) * scale + zero`; 8 for a zero scale (constant group).
pub(crate) fn quantize_code(v: f32, scale: f32, zero: f32) -> u8 {
    if scale == 0.0 {
        return 8;
    }
    ((v - zero) / scale + 8.0).round().clamp(0.0, 15.0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent e4m3 decode in f64 from the format's definition, to check the f32 one against.
    fn e4m3_f64(code: u8) -> Option<f64> {
        let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((code >> 3) & 15);
        let m = f64::from(code & 7);
        if e == 15 && m == 7.0 {
            return None;
        }
        Some(if e == 0 {
            s * m / 8.0 * 2f64.powi(-6)
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        })
    }

    #[test]
    fn e4m3_decode_matches_definition_for_all_256_codes() {
        for c in 0..=255u8 {
            let got = e4m3_to_f32(c);
            match e4m3_f64(c) {
                None => assert!(got.is_nan(), "code {c:#04x} must be NaN"),
                Some(v) => assert_eq!(f64::from(got), v, "code {c:#04x}"),
            }
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e4m3_round_trips_every_finite_code() {
        for c in 0..=255u8 {
            let v = e4m3_to_f32(c);
            if v.is_nan() {
                assert_eq!(f32_to_e4m3(v) & 0x7F, 0x7F);
                continue;
            }
            assert_eq!(f32_to_e4m3(v), c, "code {c:#04x} value {v}");
        }
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_between_every_pair_of_neighbours() {
        // Neighbouring positive codes c and c+1: the midpoint goes to the even code, anything off the midpoint
        // goes to the nearer one.
        for c in 0..0x7Eu8 {
            let lo = e4m3_to_f32(c);
            let hi = e4m3_to_f32(c + 1);
            let mid = (lo + hi) / 2.0;
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(
                f32_to_e4m3(mid),
                even,
                "midpoint of {c:#04x}/{:#04x}",
                c + 1
            );
            assert_eq!(f32_to_e4m3(-mid), 0x80 | even);
            let step = (hi - lo) / 8.0;
            assert_eq!(f32_to_e4m3(mid - step), c);
            assert_eq!(f32_to_e4m3(mid + step), c + 1);
        }
    }

    #[test]
    fn e4m3_saturates_and_keeps_nan() {
        assert_eq!(f32_to_e4m3(449.0), 0x7E);
        assert_eq!(f32_to_e4m3(1e30), 0x7E);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NAN) & 0x7F, 0x7F);
        assert_eq!(f32_to_e4m3(1e-30), 0);
        assert_eq!(f32_to_e4m3(-0.0), 0x80);
    }

    #[test]
    fn e2m1_round_trips_and_rounds_ties_to_even_for_all_16_codes() {
        for c in 0..16u8 {
            let v = e2m1_to_f32(c);
            assert_eq!(f32_to_e2m1(v), c, "code {c}");
        }
        for c in 0..7u8 {
            let (lo, hi) = (e2m1_to_f32(c), e2m1_to_f32(c + 1));
            let mid = (lo + hi) / 2.0;
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(f32_to_e2m1(mid), even, "midpoint {mid}");
            assert_eq!(f32_to_e2m1(-mid), 0x08 | even);
            assert_eq!(f32_to_e2m1(mid - 0.01), c);
            assert_eq!(f32_to_e2m1(mid + 0.01), c + 1);
        }
        assert_eq!(f32_to_e2m1(100.0), 7);
        assert_eq!(f32_to_e2m1(-100.0), 15);
    }

    #[test]
    fn bf16_round_trips_all_65536_codes_and_matches_half() {
        for b in 0..=u16::MAX {
            let v = bf16_to_f32(b);
            assert_eq!(
                v.to_bits(),
                u32::from(b) << 16,
                "decode keeps every bit, NaN payloads included"
            );
            if v.is_nan() {
                // `half` quiets signalling NaNs on the way out, so only NaN-ness is compared there.
                assert!(half::bf16::from_bits(b).to_f32().is_nan());
            } else {
                assert_eq!(v.to_bits(), half::bf16::from_bits(b).to_f32().to_bits());
                assert_eq!(f32_to_bf16(v), b);
            }
        }
        // Rounding of values between codes, against the `half` crate as an independent oracle.
        let mut s = 0x9E37_79B9u32;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            let want = half::bf16::from_f32(x);
            if x.is_nan() {
                assert!(bf16_to_f32(f32_to_bf16(x)).is_nan());
            } else {
                assert_eq!(f32_to_bf16(x), want.to_bits(), "x = {x:e} ({s:#010x})");
            }
        }
    }
}
