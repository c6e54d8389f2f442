//! Next-token sampling: temperature, top-k and top-p (nucleus) over one row of logits, driven by a small seeded
//! generator of our own ([`Pcg32`]) so that a seed gives the same tokens on every platform and every build.
//!
//! The order of operations follows vLLM / transformers: divide by the temperature, keep the `top_k` largest
//! logits, softmax over them, keep the smallest prefix (by descending probability) whose mass reaches `top_p`,
//! renormalise, draw. Ties rank the lower token id first. Temperature 0 is greedy ([`crate::ops::argmax`]).

use crate::KernelError;

/// PCG32 (O'Neill 2014, `pcg32_random_r`): a 64-bit LCG whose output is the high bits xor-shifted and rotated
/// (XSH-RR). Small, fast, statistically sound for sampling, and bit-reproducible: plain u64 wrapping arithmetic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

const PCG_MULT: u64 = 6_364_136_223_846_793_005;

impl Pcg32 {
    /// A generator for `seed` on stream `stream` (different streams give independent sequences for one seed,
    /// e.g. one per request), seeded as the reference `pcg32_srandom_r` does.
    pub fn new(seed: u64, stream: u64) -> Pcg32 {
        let mut g = Pcg32 {
            state: 0,
            inc: (stream << 1) | 1,
        };
        g.next_u32();
        g.state = g.state.wrapping_add(seed);
        g.next_u32();
        g
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        xorshifted.rotate_right((old >> 59) as u32)
    }

    /// The generator as the GPU sampler's four words (`[state lo, state hi, inc lo, inc hi]`, the layout of
    /// `Gpu::pcg32_words`), so a sequence's draws can move between the CPU and the device.
    pub fn to_words(&self) -> [u32; 4] {
        [
            self.state as u32,
            (self.state >> 32) as u32,
            self.inc as u32,
            (self.inc >> 32) as u32,
        ]
    }

    /// The generator from [`Pcg32::to_words`]' layout (as the GPU sampler leaves it after its draws).
    pub fn from_words(w: [u32; 4]) -> Pcg32 {
        Pcg32 {
            state: u64::from(w[0]) | (u64::from(w[1]) << 32),
            inc: u64::from(w[2]) | (u64::from(w[3]) << 32),
        }
    }

    /// A uniform draw from [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        let hi = (self.next_u32() as u64) << 21;
        let lo = (self.next_u32() >> 11) as u64;
        (hi | lo) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

pub use crate::shapes::SamplingParams;

/// The temperature and top-p checks of a sampling call, shared by the CPU and the GPU samplers so both refuse the
/// same parameters.
pub(crate) fn check_params(op: &'static str, params: &SamplingParams) -> Result<(), KernelError> {
    crate::ensure_shape!(
        params.temperature.is_finite() && params.temperature >= 0.0,
        op,
        "temperature must be finite and >= 0, got {}",
        params.temperature
    );
    crate::ensure_shape!(
        params.top_p > 0.0 && params.top_p <= 1.0,
        op,
        "top_p must be in (0, 1], got {}",
        params.top_p
    );
    Ok(())
}

/// How many of `vocab` tokens `params.top_k` keeps (0 keeps all).
pub(crate) fn top_k_of(params: &SamplingParams, vocab: usize) -> usize {
    if params.top_k == 0 {
        vocab
    } else {
        params.top_k.min(vocab)
    }
}

/// The candidates `sample` would draw from, as (token, probability) pairs by descending probability, probabilities
/// renormalised to sum to 1. Exposed so tests (and a UI showing alternatives) can see the distribution.
pub fn candidates(
    logits: &[f32],
    params: &SamplingParams,
) -> Result<Vec<(usize, f64)>, KernelError> {
    const OP: &str = "sampling";
    crate::ensure_shape!(!logits.is_empty(), OP, "empty logits");
    check_params(OP, params)?;
    if let Some(i) = logits.iter().position(|v| v.is_nan()) {
        return Err(KernelError::shape(OP, format!("logits[{i}] is NaN")));
    }
    // -inf is a masked token and fine; +inf would make every probability inf/inf.
    if let Some(i) = logits.iter().position(|&v| v == f32::INFINITY) {
        return Err(KernelError::shape(OP, format!("logits[{i}] is +inf")));
    }
    // With every logit masked there is no distribution to draw from (the probabilities would be 0/0).
    crate::ensure_shape!(
        logits.iter().any(|&v| v > f32::NEG_INFINITY),
        OP,
        "every logit is -inf"
    );
    if params.temperature == 0.0 {
        return Ok(vec![(crate::ops::argmax(logits)?, 1.0)]);
    }
    // Descending logit, lower id first on ties; a partial selection first when top_k is small, since a full sort
    // of a 248k vocabulary is the slow part of sampling.
    let order = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let k = top_k_of(params, logits.len());
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    let inv_t = 1.0 / params.temperature as f64;
    let top = logits[idx[0]] as f64 * inv_t;
    let mut probs: Vec<(usize, f64)> = idx
        .iter()
        .map(|&i| (i, (logits[i] as f64 * inv_t - top).exp()))
        .collect();
    let total: f64 = probs.iter().map(|p| p.1).sum();
    let mut mass = 0.0;
    let mut keep = None;
    for (n, p) in probs.iter_mut().enumerate() {
        p.1 /= total;
        mass += p.1;
        if keep.is_none() && mass >= params.top_p as f64 {
            keep = Some(n + 1);
        }
    }
    let keep = keep.unwrap_or(probs.len());
    probs.truncate(keep);
    let kept: f64 = probs.iter().map(|p| p.1).sum();
    for p in &mut probs {
        p.1 /= kept;
    }
    Ok(probs)
}

/// Draws the next token from `logits` under `params`, advancing `rng` by one f64 draw (none when greedy).
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut Pcg32,
) -> Result<usize, KernelError> {
    let c = candidates(logits, params)?;
    if c.len() == 1 {
        return Ok(c[0].0);
    }
    let u = rng.next_f64();
    let mut acc = 0.0;
    for &(tok, p) in &c {
        acc += p;
        if u < acc {
            return Ok(tok);
        }
    }
    // Rounding can leave the running sum a hair under 1; the draw then belongs to the last candidate.
    Ok(c[c.len() - 1].0)
}
