//! Mixture-of-experts routing on the CPU (Qwen3-Next, Qwen3-MoE): the router's softmax over experts and the top-k
//! per token ([`route`]), the dispatch that groups each expert's (token, slot) pairs so that the expert runs as one
//! batched linear over its rows ([`dispatch`], or [`dispatch_ids`] from ids alone), the gather of an expert's rows
//! ([`gather_rows`]), and the weighted combine back into token order ([`combine`], [`combine_rows`]).
//!
//! The arithmetic is transformers' `Qwen3NextSparseMoeBlock`: `softmax` in f32 over the router logits, `topk`
//! (the larger probability first, the lower expert id on ties), and with `norm_topk_prob` the k weights divided by
//! their sum. The shared expert and its sigmoid gate are ordinary linears and [`crate::backend::sigmoid_gate`].
//! The engine-facing form of these, the same on the CPU and on CUDA, is [`crate::backend::Backend::moe_route`],
//! `moe_gather` and `moe_combine` (the GPU's kernels are `cuda/moe.cu`).
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

use crate::error::{checked_product, whole_rows};
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

/// The tokens that `logits` router logits hold, or an error unless `1 <= top_k <= experts` and they are whole rows
/// of `experts`: the shape [`route`] and its reference both check.
pub(crate) fn check_route_shape(
    op: &'static str,
    logits: usize,
    experts: usize,
    top_k: usize,
) -> Result<usize, KernelError> {
    crate::ensure_shape!(
        (1..=experts).contains(&top_k),
        op,
        "top_k must be 1..={experts}, got {top_k}"
    );
    crate::ensure_shape!(
        logits.is_multiple_of(experts),
        op,
        "{logits} logits are not whole rows of {experts} experts"
    );
    Ok(logits / experts)
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
    let tokens = check_route_shape(OP, logits.len(), experts, top_k)?;
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(KernelError::shape(
            OP,
            format!("router logit {i} is {}", logits[i]),
        ));
    }
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
    /// The token of every row in dispatch order (expert `e`'s are `offset(e)..offset(e + 1)`): what
    /// [`gather_rows`] and a backend's `moe_gather` read.
    pub fn all_tokens(&self) -> &[u32] {
        &self.tokens
    }
    /// Each routing pair's row in dispatch order, `[tokens, top_k]`: what [`combine_rows`] and a backend's
    /// `moe_combine` read. More than `u32::MAX` rows is an error.
    pub fn pair_rows(&self) -> Result<Vec<u32>, KernelError> {
        crate::ensure_shape!(
            self.pairs.len() <= u32::MAX as usize,
            "moe::Dispatch::pair_rows",
            "{} rows: the pair rows are u32",
            self.pairs.len()
        );
        let mut row_of = vec![0u32; self.pairs.len()];
        for (at, &p) in self.pairs.iter().enumerate() {
            // at < pairs.len() <= u32::MAX, checked above.
            row_of[p] = at as u32;
        }
        Ok(row_of)
    }
}

/// Groups a routing's pairs by expert (a counting sort: stable, so tokens stay ascending within an expert).
pub fn dispatch(r: &Routing) -> Dispatch {
    group_by_expert(&r.ids, vec![0; r.experts + 1], r.top_k)
}

/// [`dispatch`] from the `[tokens, top_k]` expert ids alone (what a backend's router wrote, downloaded): every id
/// must be below `experts`, `top_k` positive and `ids` whole tokens of it.
pub fn dispatch_ids(ids: &[u32], experts: usize, top_k: usize) -> Result<Dispatch, KernelError> {
    const OP: &str = "moe::dispatch_ids";
    crate::ensure_shape!(
        experts > 0 && experts <= u32::MAX as usize,
        OP,
        "experts must be 1..=u32::MAX, got {experts}"
    );
    crate::ensure_shape!(top_k > 0, OP, "top_k must be positive");
    crate::ensure_shape!(
        ids.len().is_multiple_of(top_k),
        OP,
        "{} ids are not whole tokens of top_k = {top_k}",
        ids.len()
    );
    check_below(OP, ids, experts, |p, e| {
        format!("id {p} is expert {e}, past the {experts} experts")
    })?;
    // An expert count the allocator refuses is an error, not an abort.
    let mut offsets = Vec::new();
    offsets.try_reserve_exact(experts + 1).map_err(|_| {
        KernelError::shape(
            OP,
            format!("cannot allocate the offsets of {experts} experts"),
        )
    })?;
    offsets.resize(experts + 1, 0);
    Ok(group_by_expert(ids, offsets, top_k))
}

/// Checks that every index in `ids` is below `limit`; the first one that is not becomes the error `message(i, id)`
/// names.
fn check_below(
    op: &'static str,
    ids: &[u32],
    limit: usize,
    message: impl FnOnce(usize, u32) -> String,
) -> Result<(), KernelError> {
    match ids.iter().position(|&id| id as usize >= limit) {
        Some(i) => Err(KernelError::shape(op, message(i, ids[i]))),
        None => Ok(()),
    }
}

/// The counting sort of [`dispatch`]: `offsets` is zeroed, one longer than the experts, and every id is below
/// the experts.
fn group_by_expert(ids: &[u32], mut offsets: Vec<usize>, top_k: usize) -> Dispatch {
    let experts = offsets.len() - 1;
    for &e in ids {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..experts {
        offsets[e + 1] += offsets[e];
    }
    let mut next = offsets.clone();
    let mut tokens = vec![0u32; ids.len()];
    let mut pairs = vec![0usize; ids.len()];
    for (p, &e) in ids.iter().enumerate() {
        let at = next[e as usize];
        next[e as usize] += 1;
        // Fewer than 2^32 tokens: `route` made ids.len() = tokens * top_k in memory, and a token id is a u32 on
        // both backends.
        tokens[at] = (p / top_k) as u32;
        pairs[at] = p;
    }
    Dispatch {
        offsets,
        tokens,
        pairs,
    }
}

/// `out[r] = x[tokens[r]]` for every row `r` of `out` (`[tokens.len(), hidden]`), `x` `[x_rows, hidden]`: an
/// expert's rows of the hidden states (`tokens` its part of [`Dispatch::all_tokens`]). Every id is checked first.
pub fn gather_rows(
    x: &[f32],
    hidden: usize,
    tokens: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "moe::gather_rows";
    let x_rows = whole_rows(OP, "x", x.len(), "hidden", hidden)?;
    check_hidden_rows(OP, "out", out.len(), tokens.len(), "rows", hidden)?;
    check_below(OP, tokens, x_rows, |i, t| {
        format!("token {i} is row {t}, past the {x_rows} rows of x")
    })?;
    for (o, &t) in out.chunks_exact_mut(hidden).zip(tokens) {
        let t = t as usize;
        o.copy_from_slice(&x[t * hidden..(t + 1) * hidden]);
    }
    Ok(())
}

/// Checks that `name` (`len` values) holds `rows` rows of `hidden` values; `unit` names the rows ("rows" or
/// "tokens") in the error. The size product is labelled by `name`, so the check formats nothing unless it fails.
fn check_hidden_rows(
    op: &'static str,
    name: &str,
    len: usize,
    rows: usize,
    unit: &str,
    hidden: usize,
) -> Result<(), KernelError> {
    let want = checked_product(op, name, &[rows, hidden])?;
    crate::ensure_shape!(
        len == want,
        op,
        "{name} has {len} values, expected {rows} {unit} of {hidden}"
    );
    Ok(())
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
    check_hidden_rows(OP, "expert_out", expert_out.len(), d.rows(), "rows", hidden)?;
    check_hidden_rows(OP, "out", out.len(), r.tokens(), "tokens", hidden)?;
    combine_rows(
        expert_out,
        hidden,
        &r.weights,
        r.top_k,
        &d.pair_rows()?,
        out,
    )
}

/// `out[t] = sum over j < top_k of weights[t, j] * expert_out[pair_rows[t, j]]`, added in `j` order (`out`
/// `[tokens, hidden]` overwritten; `weights`, `pair_rows` `[tokens, top_k]`; `expert_out` `[rows, hidden]` in
/// dispatch order, [`Dispatch::pair_rows`]): [`combine`] from the routing's arrays alone. Every pair row is checked
/// first.
pub fn combine_rows(
    expert_out: &[f32],
    hidden: usize,
    weights: &[f32],
    top_k: usize,
    pair_rows: &[u32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    const OP: &str = "moe::combine_rows";
    crate::ensure_shape!(
        hidden > 0 && top_k > 0,
        OP,
        "hidden and top_k must be positive, got {hidden} and {top_k}"
    );
    crate::ensure_shape!(
        expert_out.len().is_multiple_of(hidden) && out.len().is_multiple_of(hidden),
        OP,
        "expert_out ({}) and out ({}) must be whole rows of {hidden}",
        expert_out.len(),
        out.len()
    );
    let (rows, tokens) = (expert_out.len() / hidden, out.len() / hidden);
    let pairs = checked_product(OP, "tokens*top_k", &[tokens, top_k])?;
    crate::ensure_shape!(
        weights.len() == pairs && pair_rows.len() == pairs,
        OP,
        "weights ({}) and pair_rows ({}) must be {tokens} tokens x {top_k}",
        weights.len(),
        pair_rows.len()
    );
    check_below(OP, pair_rows, rows, |p, r| {
        format!("pair {p} is row {r}, past the {rows} expert rows")
    })?;
    for (t, o) in out.chunks_exact_mut(hidden).enumerate() {
        o.fill(0.0);
        for p in t * top_k..(t + 1) * top_k {
            let (w, at) = (weights[p], pair_rows[p] as usize);
            let row = &expert_out[at * hidden..(at + 1) * hidden];
            o.iter_mut().zip(row).for_each(|(a, &v)| *a += w * v);
        }
    }
    Ok(())
}
