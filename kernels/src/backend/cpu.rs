//! [`Backend`] on the CPU: buffers are `Vec`s, and each op is the crate's CPU function of that name on the
//! fastest path this CPU has ([`crate::cpu::Isa::detected`]).

use super::{
    check_gdn_inputs, Backend, Embedding, GdnIn, GdnLayer, GdnState, KvCache, Scalar, Weight,
};
use crate::attention::{self, KvSlice, PagedKv};
use crate::error::{checked_product, checked_sum, whole_rows};
use crate::formats::{bf16_to_f32, f32_to_bf16};
use crate::gdn::{self, GdnDims, GdnInputs, GdnWeights};
use crate::moe;
use crate::ops::{self, EmbeddingTable};
use crate::shapes::{GatedAct, NormWeight, Rope};
use crate::KernelError;

/// The CPU backend. It holds nothing: thread counts and the ISA path are decided per call by the functions it
/// wraps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

/// Tokens per paged-decode call of [`Cpu::attention`]: bounds the block table it builds (one page id per cached
/// position per token) to this many rows.
const DECODE_GROUP: usize = 64;

fn check_same(op: &'static str, what: &str, a: usize, b: usize) -> Result<(), KernelError> {
    crate::ensure_shape!(a == b, op, "{what}: {a} against {b} elements");
    Ok(())
}

/// `out[i] = f(x[i])` for two buffers of the same length (the casts).
fn cast<A: Copy, B>(
    op: &'static str,
    x: &[A],
    out: &mut [B],
    f: impl Fn(A) -> B,
) -> Result<(), KernelError> {
    check_same(op, "x and out", x.len(), out.len())?;
    out.iter_mut().zip(x).for_each(|(o, &v)| *o = f(v));
    Ok(())
}

/// Checks that every `(slot, pos)` of a call is inside the cache (the host can: the values are in host memory).
fn check_slots(
    op: &'static str,
    slots: &[u32],
    pos: &[u32],
    num_slots: usize,
    max_len: usize,
) -> Result<(), KernelError> {
    check_same(op, "slots and pos", slots.len(), pos.len())?;
    if let Some(i) =
        (0..slots.len()).find(|&i| slots[i] as usize >= num_slots || pos[i] as usize >= max_len)
    {
        return Err(KernelError::shape(
            op,
            format!(
                "token {i} is at slot {} position {}, past the cache's {num_slots} slots of {max_len} positions",
                slots[i], pos[i]
            ),
        ));
    }
    Ok(())
}

impl Backend for Cpu {
    type Buf<T: Scalar> = Vec<T>;
    type Linear = Weight;
    type Table = Embedding;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload<T: Scalar>(&self, host: &[T]) -> Result<Vec<T>, KernelError> {
        Ok(host.to_vec())
    }

    fn zeros<T: Scalar>(&self, len: usize) -> Result<Vec<T>, KernelError> {
        // `vec![0; len]` aborts on a size the allocator cannot give; a backend call must answer an error.
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|e| {
            KernelError::shape("cpu::zeros", format!("cannot allocate {len} elements: {e}"))
        })?;
        v.resize(len, T::default());
        Ok(v)
    }

    fn download<T: Scalar>(&self, buf: &Vec<T>) -> Result<Vec<T>, KernelError> {
        Ok(buf.clone())
    }

    fn len<T: Scalar>(&self, buf: &Vec<T>) -> usize {
        buf.len()
    }

    fn prepare(&self, w: Weight) -> Result<Weight, KernelError> {
        Ok(w)
    }

    fn prepare_table(&self, t: Embedding) -> Result<Embedding, KernelError> {
        Ok(t)
    }

    fn embedding_gather(
        &self,
        table: &Embedding,
        ids: &Vec<u32>,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        use half::slice::HalfBitsSliceExt;
        match table {
            Embedding::F32 { w, dim } => {
                ops::embedding_gather(EmbeddingTable::F32(w), *dim, ids, out)
            }
            Embedding::Bf16 { w, dim } => {
                ops::embedding_gather(EmbeddingTable::Bf16(w.reinterpret_cast()), *dim, ids, out)
            }
            Embedding::Int4(w) => w.gather_rows(ids, out),
        }
    }

    fn rmsnorm(
        &self,
        x: &Vec<f32>,
        weight: &Vec<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        ops::rmsnorm(x, weight, form, eps, out)
    }

    fn add_rmsnorm(
        &self,
        x: &Vec<f32>,
        residual: &mut Vec<f32>,
        weight: &Vec<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::add_rmsnorm";
        check_same(OP, "x and residual", x.len(), residual.len())?;
        // The norm's own checks first, so that a refused call leaves `residual` as it was.
        ops::check_rmsnorm(OP, residual, weight, eps, out)?;
        residual.iter_mut().zip(x).for_each(|(r, &v)| *r += v);
        ops::rmsnorm(residual, weight, form, eps, out)
    }

    fn rope_neox(
        &self,
        rope: &Rope,
        heads: usize,
        positions: &Vec<u32>,
        x: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        attention::rope_neox(rope, heads, positions, x)
    }

    fn kv_store(
        &self,
        cache: &mut KvCache<Self>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        slots: &Vec<u32>,
        pos: &Vec<u32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::kv_store";
        check_slots(OP, slots, pos, cache.slots, cache.max_len)?;
        let width = cache.dims.kv_heads * cache.dims.head_dim;
        let rows = checked_product(OP, "t*kv_heads*head_dim", &[slots.len(), width])?;
        check_same(OP, "k", k.len(), rows)?;
        check_same(OP, "v", v.len(), rows)?;
        for (i, (&s, &p)) in slots.iter().zip(pos.iter()).enumerate() {
            // In range: slot < slots and p < max_len were checked, and the cache holds slots*max_len rows.
            let at = (s as usize * cache.max_len + p as usize) * width;
            cache.k[at..at + width].copy_from_slice(&k[i * width..(i + 1) * width]);
            cache.v[at..at + width].copy_from_slice(&v[i * width..(i + 1) * width]);
        }
        Ok(())
    }

    fn attention(
        &self,
        cache: &KvCache<Self>,
        scale: f32,
        window: Option<usize>,
        q: &Vec<f32>,
        slots: &Vec<u32>,
        pos: &Vec<u32>,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::attention";
        let dims = cache.dims;
        check_slots(OP, slots, pos, cache.slots, cache.max_len)?;
        crate::attention::check_window(OP, window)?;
        let t = slots.len();
        let qw = dims.q_heads * dims.head_dim;
        let q_len = checked_product(OP, "t*q_heads*head_dim", &[t, qw])?;
        check_same(OP, "q", q.len(), q_len)?;
        check_same(OP, "out", out.len(), q_len)?;
        if t == 0 {
            return Ok(());
        }
        let width = dims.kv_heads * dims.head_dim;
        // A prompt from position 0 in one slot: its keys are the slot's first t rows, which is the layout of the
        // causal prefill kernel's k and v.
        let s0 = slots[0] as usize;
        if t > 1
            && slots.iter().all(|&s| s as usize == s0)
            && pos.iter().enumerate().all(|(i, &p)| p as usize == i)
        {
            let at = s0 * cache.max_len * width;
            let (k, v) = (&cache.k[at..at + t * width], &cache.v[at..at + t * width]);
            return attention::prefill(&dims, scale, window, t, q, k, v, out);
        }
        // Anything else: the paged decode over pages of one position, so that page `slot * max_len + p` is row
        // `(slot, p)` of the cache and a window is a block table that starts at its first position.
        let pages = checked_product(OP, "slots*max_len", &[cache.slots, cache.max_len])?;
        crate::ensure_shape!(
            pages <= u32::MAX as usize + 1,
            OP,
            "{pages} cached positions: the paged decode names each by a u32 page id"
        );
        for t0 in (0..t).step_by(DECODE_GROUP) {
            let t1 = (t0 + DECODE_GROUP).min(t);
            let span = |i: usize| {
                let p = pos[i] as usize;
                let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
                (slots[i] as usize * cache.max_len + lo, p + 1 - lo)
            };
            let max_pages = (t0..t1).map(|i| span(i).1).max().unwrap_or(1);
            let mut table = vec![0u32; (t1 - t0) * max_pages];
            let mut lens = Vec::with_capacity(t1 - t0);
            for (row, i) in table.chunks_exact_mut(max_pages).zip(t0..t1) {
                let (first, len) = span(i);
                for (j, id) in row[..len].iter_mut().enumerate() {
                    // first + j < slots * max_len <= u32::MAX + 1, checked above.
                    *id = (first + j) as u32;
                }
                lens.push(len as u32);
            }
            let kv = PagedKv {
                k_pages: KvSlice::F32(&cache.k),
                v_pages: KvSlice::F32(&cache.v),
                page_size: 1,
                block_table: &table,
                max_pages,
                lens: &lens,
            };
            attention::decode_paged(
                &dims,
                scale,
                t1 - t0,
                &q[t0 * qw..t1 * qw],
                &kv,
                &mut out[t0 * qw..t1 * qw],
            )?;
        }
        Ok(())
    }

    fn sigmoid_gate(&self, x: &mut Vec<f32>, gate: &Vec<f32>) -> Result<(), KernelError> {
        super::sigmoid_gate(x, gate)
    }

    fn sigmoid_head_gate(
        &self,
        x: &mut Vec<f32>,
        heads: usize,
        gate: &Vec<f32>,
    ) -> Result<(), KernelError> {
        super::sigmoid_head_gate(x, heads, gate)
    }

    fn gdn_decode(
        &self,
        dims: &GdnDims,
        w: &GdnLayer<Self>,
        x: &GdnIn<'_, Self>,
        state: &mut GdnState<Self>,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::gdn_decode";
        state.check(OP, dims)?;
        check_gdn_inputs(self, OP, dims, state.seqs, x, out)?;
        let cur = state.cur;
        gdn::decode_step(
            dims,
            &weights(w),
            state.seqs,
            &inputs(x),
            &mut state.conv[cur],
            &mut state.state,
            out,
        )
    }

    fn gdn_prefill(
        &self,
        dims: &GdnDims,
        w: &GdnLayer<Self>,
        x: &GdnIn<'_, Self>,
        seq_lens: &[usize],
        state: &mut GdnState<Self>,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::gdn_prefill";
        state.check(OP, dims)?;
        check_same(
            OP,
            "seq_lens and the state's sequences",
            seq_lens.len(),
            state.seqs,
        )?;
        let total = checked_sum(OP, "sum(seq_lens)", seq_lens)?;
        check_gdn_inputs(self, OP, dims, total, x, out)?;
        let s = dims.checked_sizes(OP)?;
        let (hv, cur) = (dims.value_heads, state.cur);
        let mut t0 = 0;
        // One sequence at a time: the CPU prefill takes one; every slice below is inside a length checked above.
        for (i, &t) in seq_lens.iter().enumerate() {
            let rows = |width: usize| t0 * width..(t0 + t) * width;
            let xi = GdnInputs {
                qkv: &x.qkv[rows(s.conv_dim)],
                z: &x.z[rows(s.value_width)],
                a: &x.a[rows(hv)],
                b: &x.b[rows(hv)],
            };
            gdn::prefill(
                dims,
                &weights(w),
                t,
                &xi,
                &mut state.conv[cur][i * s.conv_state_len..(i + 1) * s.conv_state_len],
                &mut state.state[i * s.state_len..(i + 1) * s.state_len],
                &mut out[rows(s.value_width)],
            )?;
            t0 += t;
        }
        Ok(())
    }

    fn act_and_mul(
        &self,
        act: GatedAct,
        gate_up: &Vec<f32>,
        inter: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        ops::act_and_mul(act, gate_up, inter, out)
    }

    fn linear(
        &self,
        w: &Weight,
        x: &Vec<f32>,
        m: usize,
        y: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        w.linear(x, m, y).map(|_| ())
    }

    fn moe_route(
        &self,
        logits: &Vec<f32>,
        experts: usize,
        top_k: usize,
        renormalize: bool,
        ids: &mut Vec<u32>,
        weights: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::moe_route";
        // The router checks experts, top_k and the logits; the outputs are checked against what it made, before
        // either is written.
        let r = moe::route(logits, experts, top_k, renormalize)?;
        check_same(OP, "ids", ids.len(), r.ids().len())?;
        check_same(OP, "weights", weights.len(), r.weights().len())?;
        ids.copy_from_slice(r.ids());
        weights.copy_from_slice(r.weights());
        Ok(())
    }

    fn moe_gather(
        &self,
        x: &Vec<f32>,
        hidden: usize,
        tokens: &Vec<u32>,
        start: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::moe_gather";
        let rows = whole_rows(OP, "out", out.len(), "hidden", hidden)?;
        let Some(part) = start
            .checked_add(rows)
            .and_then(|end| tokens.get(start..end))
        else {
            return Err(KernelError::shape(
                OP,
                format!(
                    "rows {start}..{start}+{rows} are past the {} tokens of the dispatch",
                    tokens.len()
                ),
            ));
        };
        moe::gather_rows(x, hidden, part, out)
    }

    fn moe_combine(
        &self,
        parts: &[&Vec<f32>],
        hidden: usize,
        top_k: usize,
        weights: &Vec<f32>,
        pair_rows: &Vec<u32>,
        out: &mut Vec<f32>,
    ) -> Result<(), KernelError> {
        // The expert outputs one after another, as the combine reads them (a copy only when there are several).
        let joined;
        let expert_out: &[f32] = match parts {
            [one] => one,
            _ => {
                joined = parts
                    .iter()
                    .flat_map(|p| p.iter().copied())
                    .collect::<Vec<f32>>();
                &joined
            }
        };
        moe::combine_rows(expert_out, hidden, weights, top_k, pair_rows, out)
    }

    fn softcap(&self, x: &mut Vec<f32>, cap: f32) -> Result<(), KernelError> {
        crate::ensure_shape!(
            cap.is_finite() && cap > 0.0,
            "cpu::softcap",
            "cap must be finite and positive, got {cap}"
        );
        super::softcap(x, cap);
        Ok(())
    }

    fn argmax(
        &self,
        logits: &Vec<f32>,
        vocab: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::argmax";
        check_logit_rows(OP, logits.len(), out.len(), vocab)?;
        for (o, row) in out.iter_mut().zip(logits.chunks_exact(vocab)) {
            // < vocab <= u32::MAX, checked above.
            *o = ops::argmax(row)? as u32;
        }
        Ok(())
    }

    fn sample(
        &self,
        logits: &Vec<f32>,
        vocab: usize,
        params: &crate::sampling::SamplingParams,
        rng: &mut Vec<u32>,
        out: &mut Vec<u32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cpu::sample";
        check_logit_rows(OP, logits.len(), out.len(), vocab)?;
        let words = checked_product(OP, "rows*4", &[out.len(), 4])?;
        check_same(OP, "rng", rng.len(), words)?;
        for ((o, row), w) in out
            .iter_mut()
            .zip(logits.chunks_exact(vocab))
            .zip(rng.chunks_exact_mut(4))
        {
            let mut g = crate::sampling::Pcg32::from_words([w[0], w[1], w[2], w[3]]);
            // < vocab <= u32::MAX, checked above.
            *o = crate::sampling::sample(row, params, &mut g)? as u32;
            w.copy_from_slice(&g.to_words());
        }
        Ok(())
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<(), KernelError> {
        check_same("cpu::add_assign", "x and y", x.len(), y.len())?;
        x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn add_bias_rows(&self, x: &mut Vec<f32>, bias: &Vec<f32>) -> Result<(), KernelError> {
        const OP: &str = "cpu::add_bias_rows";
        crate::ensure_shape!(!bias.is_empty(), OP, "bias must not be empty");
        whole_rows(OP, "x", x.len(), "bias", bias.len())?;
        for row in x.chunks_exact_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(a, &b)| *a += b);
        }
        Ok(())
    }

    fn scale_assign(&self, x: &mut Vec<f32>, s: f32) -> Result<(), KernelError> {
        x.iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn cast_f32_to_bf16(&self, x: &Vec<f32>, out: &mut Vec<u16>) -> Result<(), KernelError> {
        cast("cpu::cast_f32_to_bf16", x, out, f32_to_bf16)
    }

    fn cast_bf16_to_f32(&self, x: &Vec<u16>, out: &mut Vec<f32>) -> Result<(), KernelError> {
        cast("cpu::cast_bf16_to_f32", x, out, bf16_to_f32)
    }
}

fn weights(w: &GdnLayer<Cpu>) -> GdnWeights<'_> {
    GdnWeights {
        conv_weight: &w.conv_weight,
        a_log: &w.a_log,
        dt_bias: &w.dt_bias,
        norm_weight: &w.norm_weight,
        norm_eps: w.norm_eps,
    }
}

fn inputs<'a>(x: &GdnIn<'a, Cpu>) -> GdnInputs<'a> {
    GdnInputs {
        qkv: x.qkv,
        z: x.z,
        a: x.a,
        b: x.b,
    }
}

/// `logits` of `rows` rows of `vocab` (positive, and token ids fit u32): what argmax and sampling both read.
fn check_logit_rows(
    op: &'static str,
    logits: usize,
    rows: usize,
    vocab: usize,
) -> Result<(), KernelError> {
    crate::ensure_shape!(vocab > 0, op, "vocab must be positive");
    crate::ensure_shape!(
        vocab <= u32::MAX as usize,
        op,
        "vocab = {vocab}: tokens are u32"
    );
    let want = checked_product(op, "rows*vocab", &[rows, vocab])?;
    check_same(op, "logits", logits, want)
}
