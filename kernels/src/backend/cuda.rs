//! [`Backend`] on a CUDA device: buffers are [`GpuBuffer`]s, and each op is the public [`Gpu`] method of the same
//! job (the f32 forms of the engine's exact path: `rmsnorm_f32`, `act_and_mul_f32`, `attention_slots`, ...).
//! Without the `cuda` feature this compiles against the crate's stubs, and no [`Gpu`] can exist to call it.

use super::{
    check_gdn_inputs, Backend, Embedding, GdnIn, GdnLayer, GdnState, KvCache, Scalar, Weight,
};
use crate::cuda::{
    DenseGpuWeights, Fp8TileWeights, GdnGpuInputs, GdnGpuWeights, GdnPrefillIo, Gpu, GpuBuffer,
    Int4GpuWeights, Nvfp4TileWeights,
};
use crate::error::{checked_product, checked_sum};
use crate::gdn::GdnDims;
use crate::linear::Int4Scheme;
use crate::shapes::{GatedAct, NormWeight, Rope};
use crate::KernelError;

/// Rows the tile GEMVs take per call; more rows run the GEMMs, or the GEMVs in pieces of this many.
const GEMV_ROWS: usize = 16;

/// A linear layer prepared for the GPU by [`Backend::prepare`].
pub enum GpuLinear {
    /// f32 or bf16 weights for the dense f32 kernels.
    Dense(DenseGpuWeights),
    /// FP8 e4m3 with 128x128 block scales: the tile layout of the decode GEMV, and the checkpoint layout for the
    /// prefill GEMM.
    Fp8 {
        tiles: Fp8TileWeights,
        scales: GpuBuffer<f32>,
        raw: GpuBuffer<u8>,
    },
    /// NVFP4: the tile layout of the decode GEMV, and the checkpoint layout for the prefill GEMM where its
    /// `k % 64 == 0` allows one.
    Nvfp4 {
        tiles: Nvfp4TileWeights,
        global: f32,
        raw: Option<(GpuBuffer<u8>, GpuBuffer<u8>)>,
    },
    /// The chunked int4 pack as [`crate::linear::Int4Weights`] holds it, run as W4A8 (`a8`, symmetric weights) or
    /// W4A16.
    Int4 { w: Int4GpuWeights, a8: bool },
}

impl std::fmt::Debug for GpuLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self {
            GpuLinear::Dense(d) => return d.fmt(f),
            GpuLinear::Fp8 { .. } => "fp8_block",
            GpuLinear::Nvfp4 { .. } => "nvfp4",
            GpuLinear::Int4 { a8: true, .. } => "w4a8",
            GpuLinear::Int4 { a8: false, .. } => "w4a16",
        };
        f.debug_struct("GpuLinear")
            .field("format", &format)
            .field("n", &self.n())
            .field("k", &self.k())
            .finish()
    }
}

impl GpuLinear {
    /// Output features.
    pub fn n(&self) -> usize {
        match self {
            GpuLinear::Dense(d) => d.n(),
            GpuLinear::Fp8 { tiles, .. } => tiles.n(),
            GpuLinear::Nvfp4 { tiles, .. } => tiles.n(),
            GpuLinear::Int4 { w, .. } => w.n(),
        }
    }

    /// Input features.
    pub fn k(&self) -> usize {
        match self {
            GpuLinear::Dense(d) => d.k(),
            GpuLinear::Fp8 { tiles, .. } => tiles.k(),
            GpuLinear::Nvfp4 { tiles, .. } => tiles.k(),
            GpuLinear::Int4 { w, .. } => w.k(),
        }
    }
}

/// An embedding table prepared for the GPU by [`Backend::prepare_table`].
pub enum GpuTable {
    /// f32 rows `[vocab, dim]` (gathered one row copy per id).
    F32 { w: GpuBuffer<f32>, dim: usize },
    /// bf16 rows `[vocab, dim]`.
    Bf16 { w: GpuBuffer<u16>, dim: usize },
    /// The int4 pack as [`crate::linear::Int4Weights`] holds it.
    Int4 {
        packed: GpuBuffer<u8>,
        scales_zeros: GpuBuffer<u16>,
        n: usize,
        k: usize,
        group: usize,
    },
}

impl Backend for Gpu {
    type Buf<T: Scalar> = GpuBuffer<T>;
    type Linear = GpuLinear;
    type Table = GpuTable;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload<T: Scalar>(&self, host: &[T]) -> Result<GpuBuffer<T>, KernelError> {
        Gpu::upload(self, host)
    }

    fn zeros<T: Scalar>(&self, len: usize) -> Result<GpuBuffer<T>, KernelError> {
        Gpu::zeros(self, len)
    }

    fn download<T: Scalar>(&self, buf: &GpuBuffer<T>) -> Result<Vec<T>, KernelError> {
        Gpu::download(self, buf)
    }

    fn len<T: Scalar>(&self, buf: &GpuBuffer<T>) -> usize {
        buf.len()
    }

    fn prepare(&self, w: Weight) -> Result<GpuLinear, KernelError> {
        Ok(match w {
            Weight::F32 { w, n, k } => GpuLinear::Dense(self.dense_weights_f32(&w, n, k)?),
            Weight::Bf16 { w, n, k } => GpuLinear::Dense(self.dense_weights_bf16(&w, n, k)?),
            Weight::Fp8Block { w, scale_inv, n, k } => {
                let raw = Gpu::upload(self, &w)?;
                GpuLinear::Fp8 {
                    tiles: self.fp8_repack_tiles(&raw, n, k)?,
                    scales: Gpu::upload(self, &scale_inv)?,
                    raw,
                }
            }
            Weight::Nvfp4 {
                w,
                scales,
                global,
                n,
                k,
            } => {
                let raw = Gpu::upload(self, &w)?;
                let sc = Gpu::upload(self, &scales)?;
                GpuLinear::Nvfp4 {
                    tiles: self.nvfp4_repack_tiles(&raw, &sc, n, k)?,
                    global,
                    // The GEMM takes k in whole 64-column tiles; other shapes run the GEMV in pieces.
                    raw: k.is_multiple_of(64).then_some((raw, sc)),
                }
            }
            Weight::Int4 { w, a8 } => {
                let symmetric = w.scheme() == Int4Scheme::Symmetric;
                crate::ensure_shape!(
                    symmetric || !a8,
                    "cuda::backend::prepare",
                    "W4A8 needs int4 weights on the symmetric grid (zero point 8); these are asymmetric"
                );
                GpuLinear::Int4 {
                    w: self.int4_weights(
                        w.packed(),
                        w.scales_zeros(),
                        w.n(),
                        w.k(),
                        w.group(),
                        symmetric,
                    )?,
                    a8,
                }
            }
        })
    }

    fn prepare_table(&self, t: Embedding) -> Result<GpuTable, KernelError> {
        Ok(match t {
            Embedding::F32 { w, dim } => GpuTable::F32 {
                w: Gpu::upload(self, &w)?,
                dim,
            },
            Embedding::Bf16 { w, dim } => GpuTable::Bf16 {
                w: Gpu::upload(self, &w)?,
                dim,
            },
            Embedding::Int4(w) => GpuTable::Int4 {
                packed: Gpu::upload(self, w.packed())?,
                scales_zeros: Gpu::upload(self, w.scales_zeros())?,
                n: w.n(),
                k: w.k(),
                group: w.group(),
            },
        })
    }

    fn embedding_gather(
        &self,
        table: &GpuTable,
        ids: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        match table {
            GpuTable::Bf16 { w, dim } => Gpu::embedding_gather(self, w, *dim, ids, out),
            GpuTable::Int4 {
                packed,
                scales_zeros,
                n,
                k,
                group,
            } => self.embedding_gather_int4(packed, scales_zeros, *n, *k, *group, ids, out),
            GpuTable::F32 { w, dim } => {
                // No f32 gather kernel: the ids come back to the host and each row is one device copy.
                const OP: &str = "cuda::backend::embedding_gather";
                let dim = *dim;
                crate::ops::check_gather_out(OP, ids.len(), dim, out.len())?;
                let vocab = w.len() / dim;
                for (i, id) in Gpu::download(self, ids)?.into_iter().enumerate() {
                    crate::ensure_shape!(
                        (id as usize) < vocab,
                        OP,
                        "ids[{i}] = {id} is past the vocabulary of {vocab} rows"
                    );
                    // id < vocab and i < ids.len(): both offsets are rows inside their buffers (lengths checked).
                    self.copy_cols(w, dim, id as usize * dim, out, dim, i * dim, 1, dim)?;
                }
                Ok(())
            }
        }
    }

    fn rmsnorm(
        &self,
        x: &GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.rmsnorm_f32(x, weight, form, eps, out)
    }

    fn add_rmsnorm(
        &self,
        x: &GpuBuffer<f32>,
        residual: &mut GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        form: NormWeight,
        eps: f32,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.add_rmsnorm_f32(x, residual, weight, form, eps, out)
    }

    fn rope_neox(
        &self,
        rope: &Rope,
        heads: usize,
        positions: &GpuBuffer<u32>,
        x: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::rope_neox(self, rope, heads, positions, x)
    }

    fn kv_store(
        &self,
        cache: &mut KvCache<Self>,
        k: &GpuBuffer<f32>,
        v: &GpuBuffer<f32>,
        slots: &GpuBuffer<u32>,
        pos: &GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        let dims = cache.dims;
        self.kv_store_slots(
            &dims,
            k,
            v,
            slots,
            pos,
            &mut cache.k,
            &mut cache.v,
            cache.max_len,
        )
    }

    fn attention(
        &self,
        cache: &KvCache<Self>,
        scale: f32,
        window: Option<usize>,
        q: &GpuBuffer<f32>,
        slots: &GpuBuffer<u32>,
        pos: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        // A decode batch (few tokens) shares each (token, head)'s positions among several blocks, as the engine's
        // step does: one block per (token, head) leaves most of the card idle there. A prompt fills it already.
        let t = slots.len();
        if (1..=16).contains(&t) {
            let splits = self.attention_slots_splits(&cache.dims);
            let need = Gpu::attention_slots_workspace_len(&cache.dims, t, splits)?;
            let mut workspace = Gpu::zeros::<f32>(self, need)?;
            return self.attention_slots_split(
                &cache.dims,
                scale,
                window,
                q,
                &cache.k,
                &cache.v,
                cache.max_len,
                slots,
                pos,
                splits,
                &mut workspace,
                out,
            );
        }
        self.attention_slots(
            &cache.dims,
            scale,
            window,
            q,
            &cache.k,
            &cache.v,
            cache.max_len,
            slots,
            pos,
            out,
        )
    }

    fn sigmoid_gate(
        &self,
        x: &mut GpuBuffer<f32>,
        gate: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::sigmoid_gate(self, x, gate)
    }

    fn sigmoid_head_gate(
        &self,
        x: &mut GpuBuffer<f32>,
        heads: usize,
        gate: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::sigmoid_head_gate(self, x, heads, gate)
    }

    fn gdn_decode(
        &self,
        dims: &GdnDims,
        w: &GdnLayer<Self>,
        x: &GdnIn<'_, Self>,
        state: &mut GdnState<Self>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::backend::gdn_decode";
        state.check(OP, dims)?;
        check_gdn_inputs(self, OP, dims, state.seqs, x, out)?;
        let seqs = state.seqs;
        let (conv_in, conv_out, st) = conv_pair(state);
        self.gdn_decode_step(
            dims,
            &weights(w),
            &inputs(x),
            seqs,
            conv_in,
            conv_out,
            st,
            out,
        )?;
        state.cur = 1 - state.cur;
        Ok(())
    }

    fn gdn_prefill(
        &self,
        dims: &GdnDims,
        w: &GdnLayer<Self>,
        x: &GdnIn<'_, Self>,
        seq_lens: &[usize],
        state: &mut GdnState<Self>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::backend::gdn_prefill";
        state.check(OP, dims)?;
        crate::ensure_shape!(
            seq_lens.len() == state.seqs,
            OP,
            "{} sequence lengths for a state of {} sequences",
            seq_lens.len(),
            state.seqs
        );
        let mut workspace = Gpu::zeros(self, Gpu::gdn_prefill_workspace_len(dims, seq_lens)?)?;
        let (conv_in, conv_out, st) = conv_pair(state);
        let io = GdnPrefillIo {
            conv_in,
            conv_out,
            state: st,
            out,
            workspace: &mut workspace,
        };
        Gpu::gdn_prefill(self, dims, &weights(w), &inputs(x), seq_lens, io)?;
        state.cur = 1 - state.cur;
        Ok(())
    }

    fn act_and_mul(
        &self,
        act: GatedAct,
        gate_up: &GpuBuffer<f32>,
        inter: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.act_and_mul_f32(act, gate_up, inter, out)
    }

    fn linear(
        &self,
        w: &GpuLinear,
        x: &GpuBuffer<f32>,
        m: usize,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::backend::linear";
        match w {
            GpuLinear::Dense(d) => return self.dense_linear(x, d, y, m),
            GpuLinear::Int4 { w, a8: false } => return self.int4_w4a16(x, w, m, y),
            GpuLinear::Int4 { w, a8: true } => return self.int4_w4a8(x, w, m, y),
            _ => {}
        }
        let (n, k) = (w.n(), w.k());
        crate::ensure_shape!(m > 0, OP, "m must be positive");
        let (mk, mn) = (
            checked_product(OP, "m*k", &[m, k])?,
            checked_product(OP, "m*n", &[m, n])?,
        );
        crate::ensure_shape!(
            x.len() == mk && y.len() == mn,
            OP,
            "x has {} and y {} elements, expected m*k = {mk} and m*n = {mn}",
            x.len(),
            y.len()
        );
        if m <= GEMV_ROWS {
            let mut xb = Gpu::zeros::<u16>(self, mk)?;
            self.cast_f32_to_bf16(x, &mut xb)?;
            return tile_gemv(self, w, &xb, y, m);
        }
        match w {
            // The FP8 GEMM reads e4m3 activations with one scale per row per 128 columns.
            GpuLinear::Fp8 { raw, scales, .. } if k.is_multiple_of(16) => {
                let mut xb = Gpu::zeros::<u16>(self, mk)?;
                self.cast_f32_to_bf16(x, &mut xb)?;
                let mut xq = Gpu::zeros::<u8>(self, mk)?;
                let mut xs = Gpu::zeros::<f32>(
                    self,
                    checked_product(OP, "m*ceil(k/128)", &[m, k.div_ceil(128)])?,
                )?;
                self.fp8_quantize_activations(&xb, &mut xq, &mut xs, m, k)?;
                return self.fp8_block_gemm(&xq, &xs, raw, scales, y, m, n, k);
            }
            GpuLinear::Nvfp4 {
                raw: Some((wr, sc)),
                global,
                ..
            } => {
                let mut xb = Gpu::zeros::<u16>(self, mk)?;
                self.cast_f32_to_bf16(x, &mut xb)?;
                return self.nvfp4_gemm(&xb, wr, sc, *global, y, m, n, k);
            }
            _ => {}
        }
        // No GEMM for this shape: the tile GEMV over pieces of at most 16 rows.
        let mut r0 = 0;
        while r0 < m {
            let c = (m - r0).min(GEMV_ROWS);
            let mut xs = Gpu::zeros::<f32>(self, c * k)?;
            self.copy_cols(x, mk, r0 * k, &mut xs, c * k, 0, 1, c * k)?;
            let mut xb = Gpu::zeros::<u16>(self, c * k)?;
            self.cast_f32_to_bf16(&xs, &mut xb)?;
            let mut ys = Gpu::zeros::<f32>(self, c * n)?;
            tile_gemv(self, w, &xb, &mut ys, c)?;
            self.copy_cols(&ys, c * n, 0, y, mn, r0 * n, 1, c * n)?;
            r0 += c;
        }
        Ok(())
    }

    fn moe_route(
        &self,
        logits: &GpuBuffer<f32>,
        experts: usize,
        top_k: usize,
        renormalize: bool,
        ids: &mut GpuBuffer<u32>,
        weights: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::moe_route(self, logits, experts, top_k, renormalize, ids, weights)
    }

    fn moe_gather(
        &self,
        x: &GpuBuffer<f32>,
        hidden: usize,
        tokens: &GpuBuffer<u32>,
        start: usize,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::moe_gather(self, x, hidden, tokens, start, out)
    }

    fn moe_combine(
        &self,
        parts: &[&GpuBuffer<f32>],
        hidden: usize,
        top_k: usize,
        weights: &GpuBuffer<f32>,
        pair_rows: &GpuBuffer<u32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::backend::moe_combine";
        if let [one] = parts {
            return Gpu::moe_combine(self, one, hidden, top_k, weights, pair_rows, out);
        }
        // The expert outputs one after another in a scratch buffer: one device copy per non-empty part.
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let total = checked_sum(OP, "sum(parts)", &lens)?;
        if total == 0 {
            // No expert rows: every token's pair rows are past them, which the host can see (and a device
            // buffer cannot be empty).
            crate::ensure_shape!(
                out.is_empty(),
                OP,
                "the parts hold no expert rows for a combine of {} outputs",
                out.len()
            );
            return Ok(());
        }
        let mut joined = Gpu::zeros::<f32>(self, total)?;
        let mut at = 0;
        for (p, &len) in parts.iter().zip(&lens) {
            if len > 0 {
                // at + len <= total: the parts' lengths add up to it (checked above).
                self.copy_cols(p, len, 0, &mut joined, total, at, 1, len)?;
            }
            at += len;
        }
        Gpu::moe_combine(self, &joined, hidden, top_k, weights, pair_rows, out)
    }

    fn softcap(&self, x: &mut GpuBuffer<f32>, cap: f32) -> Result<(), KernelError> {
        Gpu::softcap(self, x, cap)
    }

    fn argmax(
        &self,
        logits: &GpuBuffer<f32>,
        vocab: usize,
        out: &mut GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        Gpu::argmax(self, logits, vocab, out)
    }

    fn sample(
        &self,
        logits: &GpuBuffer<f32>,
        vocab: usize,
        params: &crate::sampling::SamplingParams,
        rng: &mut GpuBuffer<u32>,
        out: &mut GpuBuffer<u32>,
    ) -> Result<(), KernelError> {
        Gpu::sample(self, logits, vocab, params, rng, out)
    }

    fn add_assign(&self, x: &mut GpuBuffer<f32>, y: &GpuBuffer<f32>) -> Result<(), KernelError> {
        Gpu::add_assign(self, x, y)
    }

    fn add_bias_rows(
        &self,
        x: &mut GpuBuffer<f32>,
        bias: &GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::add_bias_rows(self, x, bias)
    }

    fn scale_assign(&self, x: &mut GpuBuffer<f32>, s: f32) -> Result<(), KernelError> {
        Gpu::scale_assign(self, x, s)
    }

    fn cast_f32_to_bf16(
        &self,
        x: &GpuBuffer<f32>,
        out: &mut GpuBuffer<u16>,
    ) -> Result<(), KernelError> {
        Gpu::cast_f32_to_bf16(self, x, out)
    }

    fn cast_bf16_to_f32(
        &self,
        x: &GpuBuffer<u16>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        Gpu::cast_bf16_to_f32(self, x, out)
    }
}

/// One tile GEMV of at most 16 rows of bf16 activations `xb` into `y`, with its scratch.
fn tile_gemv(
    gpu: &Gpu,
    w: &GpuLinear,
    xb: &GpuBuffer<u16>,
    y: &mut GpuBuffer<f32>,
    m: usize,
) -> Result<(), KernelError> {
    let mut scratch = Gpu::zeros::<u32>(gpu, Gpu::gemv_scratch_len(m, w.k()))?;
    match w {
        GpuLinear::Fp8 { tiles, scales, .. } => {
            gpu.fp8_gemv_tiles(xb, tiles, scales, y, &mut scratch, m)
        }
        GpuLinear::Nvfp4 { tiles, global, .. } => {
            gpu.nvfp4_gemv_tiles(xb, tiles, *global, y, &mut scratch, m)
        }
        GpuLinear::Dense(_) | GpuLinear::Int4 { .. } => Err(KernelError::shape(
            "cuda::backend::linear",
            "a dense or int4 weight has no tile GEMV",
        )),
    }
}

/// The current conv history (read), the other copy (written) and the recurrent state of a state.
fn conv_pair(
    state: &mut GdnState<Gpu>,
) -> (&GpuBuffer<f32>, &mut GpuBuffer<f32>, &mut GpuBuffer<f32>) {
    let [c0, c1] = &mut state.conv;
    let (conv_in, conv_out) = if state.cur == 0 { (c0, c1) } else { (c1, c0) };
    (conv_in, conv_out, &mut state.state)
}

fn weights(w: &GdnLayer<Gpu>) -> GdnGpuWeights<'_> {
    GdnGpuWeights {
        conv_weight: &w.conv_weight,
        a_log: &w.a_log,
        dt_bias: &w.dt_bias,
        norm_weight: &w.norm_weight,
        norm_eps: w.norm_eps,
    }
}

fn inputs<'a>(x: &GdnIn<'a, Gpu>) -> GdnGpuInputs<'a> {
    GdnGpuInputs {
        qkv: x.qkv,
        z: x.z,
        a: x.a,
        b: x.b,
    }
}
