//! Mixture-of-experts routing on the GPU (`cuda/moe.cu`), the GPU forms of [`crate::moe`]: [`Gpu::moe_route`]
//! (softmax over the router logits, top-k, optional renormalisation), [`Gpu::moe_gather`] (an expert's rows of the
//! hidden states, by token id) and [`Gpu::moe_combine`] (each token's weighted sum of its experts' output rows).
//! Between route and gather the host groups the routed pairs by expert ([`crate::moe::dispatch_ids`] on the
//! downloaded ids), since it must know each expert's row count to launch that expert's linear.
//!
//! Deterministic: every reduction has a fixed order and the combine adds a token's k contributions in routing
//! order with no atomics (bit for bit the CPU's combine). **Device-side values** are flagged, never followed out of
//! range: a router row holding a NaN or infinite logit gets the ids [`Gpu::INVALID_TOKEN`] and NaN weights (the CPU
//! refuses it), a token id past `x` gathers a NaN row, a pair row past the expert outputs gives its token a NaN row.

#[cfg(feature = "cuda")]
use cudarc::driver::PushKernelArg;

#[cfg(feature = "cuda")]
use super::device::{launch_config, Module};
use super::{check_len_of, Gpu, GpuBuffer};
use crate::KernelError;

const I32_MAX: usize = i32::MAX as usize;

/// Threads of every block (`MOE_THREADS` in cuda/moe.cu).
#[cfg(feature = "cuda")]
pub(super) const MOE_THREADS: u32 = 256;

/// The kernels of this file, the names `every_moe_kernel_is_embedded` checks.
#[cfg(feature = "cuda")]
const ROUTE_KERNEL: &str = "moe_route";
#[cfg(feature = "cuda")]
const GATHER_KERNEL: &str = "moe_gather_rows";
#[cfg(feature = "cuda")]
const COMBINE_KERNEL: &str = "moe_combine";

/// `hidden` in `1..=i32::MAX` and `len` whole rows of it; returns the rows.
fn rows_of(op: &'static str, name: &str, len: usize, hidden: usize) -> Result<usize, KernelError> {
    crate::ensure_shape!(
        hidden > 0 && hidden <= I32_MAX,
        op,
        "hidden must be in 1..=i32::MAX, got {hidden}"
    );
    crate::ensure_shape!(
        len.is_multiple_of(hidden),
        op,
        "{name} has {len} elements, not a whole number of rows of {hidden}"
    );
    Ok(len / hidden)
}

impl Gpu {
    /// Most experts [`Gpu::moe_route`] takes: a router row is staged in shared memory.
    pub const MOE_MAX_EXPERTS: usize = 4096;

    /// Routes `tokens = logits.len() / experts` tokens as [`crate::moe::route`]: softmax over each row of
    /// `logits` (`[tokens, experts]`), the `top_k` most probable experts (the larger first, the lower id on ties)
    /// into `ids`, their probabilities into `weights` (both `[tokens, top_k]`), divided by their sum when
    /// `renormalize`. The experts are chosen on the logits (the order the probabilities have, without `expf`'s
    /// rounding), the softmax sums in a fixed tree. `1 <= top_k <= experts <= MOE_MAX_EXPERTS`. One block per
    /// token, each pick a block argmax.
    pub fn moe_route(
        &self,
        logits: &GpuBuffer<f32>,
        experts: usize,
        top_k: usize,
        renormalize: bool,
        ids: &mut GpuBuffer<u32>,
        weights: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::moe_route";
        crate::ensure_shape!(
            (1..=Self::MOE_MAX_EXPERTS).contains(&experts),
            OP,
            "experts must be 1..={}, got {experts}",
            Self::MOE_MAX_EXPERTS
        );
        crate::ensure_shape!(
            (1..=experts).contains(&top_k),
            OP,
            "top_k must be 1..={experts}, got {top_k}"
        );
        let tokens = rows_of(OP, "logits", logits.len(), experts)?;
        crate::ensure_shape!(
            tokens <= I32_MAX,
            OP,
            "{tokens} tokens: at most i32::MAX (one block per token)"
        );
        check_len_of(OP, "ids", ids.len(), &[tokens, top_k])?;
        check_len_of(OP, "weights", weights.len(), &[tokens, top_k])?;
        #[cfg(feature = "cuda")]
        {
            if tokens == 0 {
                return Ok(());
            }
            let f = self.inner.function(Module::Moe, ROUTE_KERNEL)?;
            let (e, k, renorm) = (experts as i32, top_k as i32, i32::from(renormalize));
            // SAFETY: matches `moe_route(logits, ids, weights, experts, top_k, renormalize)` in cuda/moe.cu; checked
            // above: logits = [tokens, experts] with 1 <= experts <= MOE_MAX_EXPERTS (its shared row), ids and
            // weights = [tokens, top_k] with 1 <= top_k <= experts, and 1 <= tokens <= i32::MAX blocks.
            unsafe {
                self.inner.launch_args(
                    ROUTE_KERNEL,
                    &f,
                    launch_config((tokens as u32, 1, 1), (MOE_THREADS, 1, 1), 0),
                    |b| {
                        b.arg(&logits.slice)
                            .arg(&mut ids.slice)
                            .arg(&mut weights.slice)
                            .arg(&e)
                            .arg(&k)
                            .arg(&renorm);
                    },
                )
            }
        }
        no_cuda!(self, renormalize)
    }

    /// `out[r, :] = x[tokens[start + r], :]` for every row `r` of `out` (`[rows, hidden]`), `x` `[x_rows, hidden]`:
    /// one expert's rows of the hidden states, `tokens` being a dispatch's token list
    /// ([`crate::moe::Dispatch::all_tokens`]) and `start` the expert's offset in it. Needs `start + rows <=
    /// tokens.len()`. A token id `>= x_rows` gathers a NaN row. One block per row.
    pub fn moe_gather(
        &self,
        x: &GpuBuffer<f32>,
        hidden: usize,
        tokens: &GpuBuffer<u32>,
        start: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::moe_gather";
        let x_rows = rows_of(OP, "x", x.len(), hidden)?;
        let rows = rows_of(OP, "out", out.len(), hidden)?;
        crate::ensure_shape!(
            start
                .checked_add(rows)
                .is_some_and(|end| end <= tokens.len()),
            OP,
            "rows {start}..{start}+{rows} are past the {} tokens of the dispatch",
            tokens.len()
        );
        crate::ensure_shape!(
            rows <= I32_MAX,
            OP,
            "{rows} rows: at most i32::MAX (one block per row)"
        );
        #[cfg(feature = "cuda")]
        {
            if rows == 0 {
                return Ok(());
            }
            let f = self.inner.function(Module::Moe, GATHER_KERNEL)?;
            let (st, xr, h) = (start as u64, x_rows as u64, hidden as i32);
            // SAFETY: matches `moe_gather_rows(x, tokens, out, start, x_rows, hidden)` in cuda/moe.cu; checked
            // above: x = [x_rows, hidden], out = [rows, hidden] with 1 <= rows <= i32::MAX blocks, 1 <= hidden <=
            // i32::MAX, and start + rows <= tokens.len(), so every block reads its own token id; the kernel reads x
            // only at a token < x_rows.
            unsafe {
                self.inner.launch_args(
                    GATHER_KERNEL,
                    &f,
                    launch_config((rows as u32, 1, 1), (MOE_THREADS, 1, 1), 0),
                    |b| {
                        b.arg(&x.slice)
                            .arg(&tokens.slice)
                            .arg(&mut out.slice)
                            .arg(&st)
                            .arg(&xr)
                            .arg(&h);
                    },
                )
            }
        }
        no_cuda!(self, x_rows)
    }

    /// `out[t, :] = sum_j weights[t, j] * expert_out[pair_rows[t, j], :]` over `j < top_k`, added in `j` order
    /// (bit for bit [`crate::moe::combine_rows`]): `out` `[tokens, hidden]` overwritten, `weights` and `pair_rows`
    /// `[tokens, top_k]` (a routing's weights and [`crate::moe::Dispatch::pair_rows`]), `expert_out`
    /// `[rows, hidden]` in dispatch order. A pair row `>= rows` gives its token a NaN row. One block per token.
    pub fn moe_combine(
        &self,
        expert_out: &GpuBuffer<f32>,
        hidden: usize,
        top_k: usize,
        weights: &GpuBuffer<f32>,
        pair_rows: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::moe_combine";
        crate::ensure_shape!(
            top_k > 0 && top_k <= I32_MAX,
            OP,
            "top_k must be in 1..=i32::MAX, got {top_k}"
        );
        let rows = rows_of(OP, "expert_out", expert_out.len(), hidden)?;
        let tokens = rows_of(OP, "out", out.len(), hidden)?;
        crate::ensure_shape!(
            tokens <= I32_MAX,
            OP,
            "{tokens} tokens: at most i32::MAX (one block per token)"
        );
        check_len_of(OP, "weights", weights.len(), &[tokens, top_k])?;
        check_len_of(OP, "pair_rows", pair_rows.len(), &[tokens, top_k])?;
        #[cfg(feature = "cuda")]
        {
            if tokens == 0 {
                return Ok(());
            }
            let f = self.inner.function(Module::Moe, COMBINE_KERNEL)?;
            let (r, k, h) = (rows as u64, top_k as i32, hidden as i32);
            // SAFETY: matches `moe_combine(expert_out, weights, pair_rows, out, rows, top_k, hidden)` in
            // cuda/moe.cu; checked above: expert_out = [rows, hidden], weights and pair_rows = [tokens, top_k],
            // out = [tokens, hidden] with 1 <= tokens <= i32::MAX blocks, 1 <= top_k, hidden <= i32::MAX; the kernel
            // reads expert_out only at a pair row < rows.
            unsafe {
                self.inner.launch_args(
                    COMBINE_KERNEL,
                    &f,
                    launch_config((tokens as u32, 1, 1), (MOE_THREADS, 1, 1), 0),
                    |b| {
                        b.arg(&expert_out.slice)
                            .arg(&weights.slice)
                            .arg(&pair_rows.slice)
                            .arg(&mut out.slice)
                            .arg(&r)
                            .arg(&k)
                            .arg(&h);
                    },
                )
            }
        }
        no_cuda!(self, rows)
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::super::device::{assert_embedded, Module};

    /// Every kernel a call here launches is embedded (the list comes from the PTX, `build_cuda.rs`), and nothing
    /// else is: no variant exists, with or without `lab`.
    #[test]
    fn every_moe_kernel_is_embedded() {
        let launched = [
            super::ROUTE_KERNEL,
            super::GATHER_KERNEL,
            super::COMBINE_KERNEL,
        ];
        assert_embedded(Module::Moe, launched);
        // No variants: a `lab` build embeds the same three.
        assert_eq!(Module::Moe.entries().len(), launched.len());
    }
}
