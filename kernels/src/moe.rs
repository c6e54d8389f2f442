//! Mixture-of-experts routing on the CPU (Qwen3-Next, Qwen3-MoE): the router's softmax over experts and the top-k
//! per token ([`route`]), the dispatch that groups each expert's (token, slot) pairs so that the expert runs as one
//! batched linear over its rows ([`dispatch`]), and the weighted combine back into token order ([`combine`]).
//!
//! The arithmetic is transformers' `Qwen3NextSparseMoeBlock`: `softmax` in f32 over the router logits, `topk`
//! (the larger probability first, the lower expert id on ties), and with `norm_topk_prob` the k weights divided by
//! their sum. The shared expert and its sigmoid gate are ordinary linears and [`crate::backend::sigmoid_gate`].
//! There is no GPU build of these (no MoE model runs on the GPU yet).
//!
//! ```
//! use kernels::moe::{combine, dispatch, route};
//! // Two tokens, three experts, top-2, renormalised.
//! let logits = [2.0f32, 1.0, 0.0, 0.0, 0.0, 3.0];
//! let r = route(&logits, 3, 2, true)?;
//! assert_eq!(r.ids(), &[0, 1, 2, 0]);
//! let d = dispatch(&r);
//! assert_eq!(d.tokens(0), &[0, 1]); // expert 0 serves both tokens
//! // Each expert's output rows (hidden 1), in dispatch order: expert 0 then 1 then 2.
//! let rows = [10.0f32, 20.0, 30.0, 40.0];
//! let mut out = [0.0f32; 2];
//! combine(&r, &d, &rows, 1, &mut out)?;
//! let w = r.weights();
//! assert!((out[0] - (w[0] * 10.0 + w[1] * 30.0)).abs() < 1e-5);
//! # Ok::<(), kernels::KernelError>(())
//! ```

use crate::error::checked_product;
use crate::KernelError;

/// Each token's `top_k` experts and their weights, token-major (`[tokens, top_k]`), the larger weight first.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    experts: usize,
    top_k: usize,
    ids: Vec<u32>,
    weights: Vec<f32>,
}

impl Routing {
    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.ids.len() / self.top_k
    }
    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }
    /// Experts in the layer.
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// `[tokens, top_k]` expert ids.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
    /// `[tokens, top_k]` weights.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }
}

/// Routes `tokens = logits.len() / experts` tokens: softmax over each row of router logits (`[tokens, experts]`),
/// the `top_k` most probable experts (ties: the lower id), their probabilities as weights, divided by their sum
/// when `renormalize` (`norm_topk_prob`). A NaN or infinite logit is an error.
pub fn route(
    logits: &[f32],
    experts: usize,
    top_k: usize,
    renormalize: bool,
) -> Result<Routing, KernelError> {
    const OP: &str = "moe::route";
    crate::ensure_shape!(
        experts > 0 && experts <= u32::MAX as usize,
        OP,
        "experts must be 1..=u32::MAX, got {experts}"
    );
    crate::ensure_shape!(
        (1..=experts).contains(&top_k),
        OP,
        "top_k must be 1..={experts}, got {top_k}"
    );
    crate::ensure_shape!(
        logits.len().is_multiple_of(experts),
        OP,
        "{} logits are not whole rows of {experts} experts",
        logits.len()
    );
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(KernelError::shape(
            OP,
            format!("router logit {i} is {}", logits[i]),
        ));
    }
    let tokens = logits.len() / experts;
    let mut ids = Vec::with_capacity(checked_product(OP, "tokens*top_k", &[tokens, top_k])?);
    let mut weights = Vec::with_capacity(ids.capacity());
    let mut probs = vec![0.0f32; experts];
    let mut order: Vec<u32> = Vec::with_capacity(experts);
    for row in logits.chunks_exact(experts) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (p, &l) in probs.iter_mut().zip(row) {
            *p = (l - max).exp();
            sum += *p;
        }
        probs.iter_mut().for_each(|p| *p /= sum);
        order.clear();
        order.extend(0..experts as u32);
        // The larger probability first, the lower id on ties (a stable sort keeps ids ascending among equals).
        order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]));
        let chosen = &order[..top_k];
        let total: f32 = chosen.iter().map(|&e| probs[e as usize]).sum();
        for &e in chosen {
            ids.push(e);
            let p = probs[e as usize];
            weights.push(if renormalize { p / total } else { p });
        }
    }
    Ok(Routing {
        experts,
        top_k,
        ids,
        weights,
    })
}

/// Each expert's share of a [`Routing`]: the (token, slot) pairs it serves, grouped by expert, tokens ascending
/// within an expert, so that expert `e` runs once over the rows [`Dispatch::tokens`]`(e)` of the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// `offsets[e]..offsets[e + 1]`: expert `e`'s pairs.
    offsets: Vec<usize>,
    /// The token of each pair, in dispatch order.
    tokens: Vec<u32>,
    /// Each pair's index into the routing's `[tokens, top_k]` arrays.
    pairs: Vec<usize>,
}

impl Dispatch {
    /// The tokens expert `e` serves, ascending (empty for an expert no token chose, or past the layer's experts).
    pub fn tokens(&self, e: usize) -> &[u32] {
        match (self.offsets.get(e), self.offsets.get(e + 1)) {
            (Some(&a), Some(&b)) => &self.tokens[a..b],
            _ => &[],
        }
    }
    /// Expert `e`'s first row in the dispatch order of [`combine`]'s expert outputs.
    pub fn offset(&self, e: usize) -> usize {
        self.offsets.get(e).copied().unwrap_or(self.tokens.len())
    }
    /// Rows of the expert outputs: tokens x top_k.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }
}

/// Groups a routing's pairs by expert (a counting sort: stable, so tokens stay ascending within an expert).
pub fn dispatch(r: &Routing) -> Dispatch {
    let mut offsets = vec![0usize; r.experts + 1];
    for &e in &r.ids {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..r.experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let mut tokens = vec![0u32; r.ids.len()];
    let mut pairs = vec![0usize; r.ids.len()];
    for (p, &e) in r.ids.iter().enumerate() {
        let at = next[e as usize];
        next[e as usize] += 1;
        // Fewer than 2^32 tokens: `route` made ids.len() = tokens * top_k in memory.
        tokens[at] = (p / r.top_k) as u32;
        pairs[at] = p;
    }
    Dispatch {
        offsets,
        tokens,
        pairs,
    }
}

/// `out[t] = sum over t's k experts of weight * that expert's output row for t`, `out` `[tokens, hidden]`
/// overwritten, `expert_out` `[rows, hidden]` in dispatch order (expert by expert, [`Dispatch::offset`]). Each token
/// sums its experts in its routing order (the larger weight first), so the result does not depend on how the
/// experts were grouped.
pub fn combine(
    r: &Routing,
    d: &Dispatch,
    expert_out: &[f32],
    hidden: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "moe::combine";
    crate::ensure_shape!(hidden > 0, OP, "hidden must be positive");
    crate::ensure_shape!(
        d.pairs.len() == r.ids.len(),
        OP,
        "the dispatch has {} pairs, the routing {}",
        d.pairs.len(),
        r.ids.len()
    );
    let want_in = checked_product(OP, "rows*hidden", &[d.rows(), hidden])?;
    crate::ensure_shape!(
        expert_out.len() == want_in,
        OP,
        "expert_out has {} values, expected {} rows of {hidden}",
        expert_out.len(),
        d.rows()
    );
    let want_out = checked_product(OP, "tokens*hidden", &[r.tokens(), hidden])?;
    crate::ensure_shape!(
        out.len() == want_out,
        OP,
        "out has {} values, expected {} tokens of {hidden}",
        out.len(),
        r.tokens()
    );
    // Where each routing pair's output row sits in dispatch order.
    let mut row_of = vec![0usize; d.pairs.len()];
    for (at, &p) in d.pairs.iter().enumerate() {
        row_of[p] = at;
    }
    for (t, o) in out.chunks_exact_mut(hidden).enumerate() {
        o.fill(0.0);
        for k in 0..r.top_k {
            let p = t * r.top_k + k;
            let w = r.weights[p];
            let row = &expert_out[row_of[p] * hidden..(row_of[p] + 1) * hidden];
            o.iter_mut().zip(row).for_each(|(a, &v)| *a += w * v);
        }
    }
    Ok(())
}
