//! The chunked gated DeltaNet prefill on the GPU ([`Gpu::gdn_prefill`]): a batch of sequences of any lengths
//! (cu_seqlens style), each continuing from its conv history and recurrent state, with exactly the semantics of
//! the CPU [`crate::gdn::prefill`] and the layouts of [`crate::gdn`] and [`Gpu::gdn_decode_step`], so an engine
//! prefills and then decodes on the same buffers. Kernels, chunk algebra and precision: `cuda/gdn_prefill.cu`.

use super::{check_len, GdnGpuInputs, GdnGpuWeights, Gpu, GpuBuffer};
use crate::gdn::{GdnDims, CHUNK};
use crate::KernelError;

/// How the sequential state kernel (launch 3) multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum StateMath {
    /// fp32 FMAs on the CUDA cores (`gdn_prefill_state_cs<CS>`): the accuracy reference.
    Fp32,
    /// `mma.sync` TF32 with the 3xTF32 split (`gdn_prefill_state_tc3_cs<CS>`): about fp32 accuracy.
    Tf32x3,
    /// `mma.sync` plain TF32 (`gdn_prefill_state_tc1_cs<CS>`): operands rounded to 10 mantissa bits.
    Tf32,
}

/// Which build of the sequential state kernel runs: its arithmetic and `cols`, the state columns each block owns
/// (16, 32 or 64: 8, 4 or 2 blocks per (sequence, head)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct GdnPrefillVariant {
    pub(crate) math: StateMath,
    pub(crate) cols: u32,
}

/// The variant names [`Gpu::gdn_prefill_with`] accepts (besides "" and "auto").
pub(crate) const GDN_PREFILL_VARIANTS: [&str; 9] = [
    "fp32_cs16",
    "fp32_cs32",
    "fp32_cs64",
    "tf32x3_cs16",
    "tf32x3_cs32",
    "tf32x3_cs64",
    "tf32_cs16",
    "tf32_cs32",
    "tf32_cs64",
];

impl GdnPrefillVariant {
    /// The default, [`Gpu::GDN_PREFILL_DEFAULT`]: plain TF32 tensor cores, 64 columns per block. On the H200
    /// (benchmarks/h200-runs/s2-run4, Qwen3.8-27B's layer, T = 16384) its state walk took 2292 us against 5429 us
    /// for fp32 on the CUDA cores and 3661 us for the 3xTF32 split; the whole step with tf32 (cs32) took 7063 us,
    /// 1.24x torch's conv + fla's chunk kernel + torch's gated norm (8779 us), against 9943 us (0.88x) in fp32.
    /// Its error (1e-2 bound on the normalised output against the f64 recurrence, measured 7e-3 class) is that of
    /// fla's bf16 kernels; `fp32_cs32` stays the accuracy reference.
    const DEFAULT: GdnPrefillVariant = GdnPrefillVariant {
        math: StateMath::Tf32,
        cols: 64,
    };

    fn parse(name: &str) -> Option<GdnPrefillVariant> {
        if name.is_empty() || name == "auto" {
            return Some(Self::DEFAULT);
        }
        let (math, cols) = name.split_once("_cs")?;
        let math = match math {
            "fp32" => StateMath::Fp32,
            "tf32x3" => StateMath::Tf32x3,
            "tf32" => StateMath::Tf32,
            _ => return None,
        };
        let cols = match cols {
            "16" => 16,
            "32" => 32,
            "64" => 64,
            _ => return None,
        };
        Some(GdnPrefillVariant { math, cols })
    }

    /// The kernel's name in `cuda/gdn_prefill.cu`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn kernel(&self) -> &'static str {
        match (self.math, self.cols) {
            (StateMath::Fp32, 16) => "gdn_prefill_state_cs16",
            (StateMath::Fp32, 64) => "gdn_prefill_state_cs64",
            (StateMath::Fp32, _) => "gdn_prefill_state_cs32",
            (StateMath::Tf32x3, 16) => "gdn_prefill_state_tc3_cs16",
            (StateMath::Tf32x3, 64) => "gdn_prefill_state_tc3_cs64",
            (StateMath::Tf32x3, _) => "gdn_prefill_state_tc3_cs32",
            (StateMath::Tf32, 16) => "gdn_prefill_state_tc1_cs16",
            (StateMath::Tf32, 64) => "gdn_prefill_state_tc1_cs64",
            (StateMath::Tf32, _) => "gdn_prefill_state_tc1_cs32",
        }
    }
}

/// Float offsets and lengths of the prefill workspace regions (each region starts at a multiple of 64 floats, so
/// every float4 access of the kernels is aligned), plus the batch geometry the launches need.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct GdnPrefillLayout {
    pub(crate) seqs: usize,
    pub(crate) tokens: usize,
    pub(crate) chunks: usize,
    pub(crate) max_len: usize,
    pub(crate) max_chunks: usize,
    pub(crate) qk_len: usize,
    pub(crate) v_len: usize,
    pub(crate) gate_len: usize,
    pub(crate) wu_len: usize,
    pub(crate) aqk_len: usize,
    pub(crate) qn: usize,
    pub(crate) kn: usize,
    pub(crate) v: usize,
    pub(crate) g: usize,
    pub(crate) beta: usize,
    pub(crate) gcum: usize,
    pub(crate) w: usize,
    pub(crate) u: usize,
    pub(crate) aqk: usize,
    /// Floats the workspace needs.
    pub(crate) total: usize,
}

/// The prefill's limits: head dims 128 (the kernels' compile-time size), conv kernel 2..=4, 1..=65535 sequences,
/// at least one token in total and every token / row count within the kernels' 32-bit indices. Returns the layout.
fn layout(
    op: &'static str,
    dims: &GdnDims,
    seq_lens: &[usize],
) -> Result<GdnPrefillLayout, KernelError> {
    dims.validate(op)?;
    crate::ensure_shape!(
        dims.key_dim == 128 && dims.value_dim == 128,
        op,
        "the CUDA prefill is built for key_dim = value_dim = 128 (Qwen3.5 / Qwen3-Next), got {}x{}",
        dims.key_dim,
        dims.value_dim
    );
    crate::ensure_shape!(
        (2..=4).contains(&dims.conv_kernel),
        op,
        "conv_kernel must be 2..=4, got {}",
        dims.conv_kernel
    );
    let seqs = seq_lens.len();
    crate::ensure_shape!(
        (1..=65535).contains(&seqs),
        op,
        "seq_lens must name 1..=65535 sequences, got {seqs}"
    );
    crate::ensure_shape!(
        2 * dims.key_heads + dims.value_heads <= 65535,
        op,
        "2 * key_heads + value_heads must be at most 65535 (grid limit), got {}",
        2 * dims.key_heads + dims.value_heads
    );
    let tokens = seq_lens.iter().try_fold(0usize, |a, &l| a.checked_add(l));
    let chunks = seq_lens
        .iter()
        .try_fold(0usize, |a, &l| a.checked_add(l.div_ceil(CHUNK)));
    let (Some(tokens), Some(chunks)) = (tokens, chunks) else {
        return Err(KernelError::shape(op, "the sequence lengths overflow"));
    };
    crate::ensure_shape!(
        tokens > 0,
        op,
        "seq_lens must hold at least one token in total"
    );
    let lim = i32::MAX as usize;
    crate::ensure_shape!(
        tokens.saturating_mul(dims.value_heads) <= lim,
        op,
        "{tokens} tokens exceed the kernels' 32-bit token and row indices"
    );
    let max_len = seq_lens.iter().copied().max().unwrap_or(0);
    let pad = |n: usize| n.div_ceil(64) * 64;
    let qk_len = tokens * dims.key_heads * 128;
    let v_len = tokens * dims.value_heads * 128;
    let gate_len = tokens * dims.value_heads;
    let wu_len = dims.value_heads * chunks * CHUNK * 128;
    let aqk_len = dims.value_heads * chunks * CHUNK * CHUNK;
    let mut at = 0usize;
    let mut region = |len: usize| {
        let o = at;
        at = at.saturating_add(pad(len));
        o
    };
    let (qn, kn, v) = (region(qk_len), region(qk_len), region(v_len));
    let (g, beta, gcum) = (region(gate_len), region(gate_len), region(gate_len));
    let (w, u, aqk) = (region(wu_len), region(wu_len), region(aqk_len));
    Ok(GdnPrefillLayout {
        seqs,
        tokens,
        chunks,
        max_len,
        max_chunks: max_len.div_ceil(CHUNK),
        qk_len,
        v_len,
        gate_len,
        wu_len,
        aqk_len,
        qn,
        kn,
        v,
        g,
        beta,
        gcum,
        w,
        u,
        aqk,
        total: at,
    })
}

impl Gpu {
    /// The state-walk build [`Gpu::gdn_prefill`] runs (and `"auto"` names): plain TF32 tensor cores, 64 columns
    /// per block (measured fastest on the H200; the numbers are beside the constant it names).
    pub const GDN_PREFILL_DEFAULT: &'static str = "tf32_cs64";

    /// Floats of the workspace [`Gpu::gdn_prefill`] needs for this batch: about
    /// `4 * N * (2*Hk + Hv) * 128` bytes for the normalised q/k/v, `4 * Hv * NC * 64 * (2*128 + 64)` for the
    /// chunk-local W, U and Aqk (`N` tokens, `NC = sum ceil(len / 64)` chunks) and three `[N, Hv]` gate arrays;
    /// 3.1 GiB at Qwen3.8-27B dims and 16384 tokens. Fails on the shapes [`Gpu::gdn_prefill`] refuses.
    pub fn gdn_prefill_workspace_len(
        dims: &GdnDims,
        seq_lens: &[usize],
    ) -> Result<usize, KernelError> {
        Ok(layout("cuda::gdn_prefill_workspace_len", dims, seq_lens)?.total)
    }

    /// Chunked gated DeltaNet prefill of a batch of sequences: sequence `i` has `seq_lens[i]` tokens (0 allowed),
    /// stored consecutively in the inputs (cu_seqlens style: rows `sum(seq_lens[..i]) ..` of `qkv`, `z`, `a`, `b`
    /// and `out`), and continues from its conv history (`conv_in[i]`) and recurrent state (`state[i]`).
    ///
    /// Layouts are those of [`crate::gdn`] and [`Gpu::gdn_decode_step`] (all fp32): `qkv` `[N, conv_dim]`, `z`
    /// `[N, Hv*128]`, `a`, `b` `[N, Hv]`, `conv_in` / `conv_out` `[seqs, conv_dim, K-1]`, `state`
    /// `[seqs, Hv, 128, 128]` (updated in place), `out` `[N, Hv*128]` (the input of `out_proj`), with
    /// `N = sum(seq_lens)`. As in the decode step, the conv history is read from `conv_in` and the advanced one
    /// written to `conv_out`, so a following decode step reads `conv_out`. The result is the token-by-token
    /// recurrence's within TF32 rounding: chunks of 64 in the WY form, the sequential state walk on TF32 tensor
    /// cores ([`Gpu::GDN_PREFILL_DEFAULT`]; [`Gpu::gdn_prefill_with`] `"fp32_cs32"` for fp32 throughout).
    ///
    /// `workspace` must hold at least [`Gpu::gdn_prefill_workspace_len`] floats; its contents are scratch. Built
    /// for `dk = dv = 128` and conv kernels 2..=4, checked here with every length. `seq_lens` is read on the host
    /// (the grid is sized from it) and uploaded for the kernels, so a call costs one small host-to-device copy.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_prefill(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seq_lens: &[usize],
        conv_in: &GpuBuffer<f32>,
        conv_out: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        workspace: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.gdn_prefill_with(
            "auto", dims, w, x, seq_lens, conv_in, conv_out, state, out, workspace,
        )
    }

    /// [`Gpu::gdn_prefill`] with the build of the sequential state kernel named: `"auto"` (or `""`) for the
    /// default, else `<math>_cs<cols>` with `math` `fp32` (CUDA-core FMAs, the
    /// accuracy reference), `tf32x3` (tensor cores, 3xTF32 split: fp32-level accuracy) or `tf32` (tensor cores,
    /// plain TF32: products rounded to ~5e-4 relative), and `cols` 16, 32 or 64 state columns per block. The other
    /// three launches are the same for every variant. Tests and the benchmark drive each.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_prefill_with(
        &self,
        variant: &str,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seq_lens: &[usize],
        conv_in: &GpuBuffer<f32>,
        conv_out: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        workspace: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_prefill";
        let Some(variant) = GdnPrefillVariant::parse(variant) else {
            return Err(KernelError::shape(
                OP,
                format!(
                    "unknown state-kernel variant {variant:?}: expected \"auto\" or one of {GDN_PREFILL_VARIANTS:?}"
                ),
            ));
        };
        let lay = layout(OP, dims, seq_lens)?;
        let n = lay.tokens;
        let cd = dims.conv_dim();
        check_len(
            OP,
            "conv_weight",
            w.conv_weight.len(),
            cd * dims.conv_kernel,
        )?;
        check_len(OP, "a_log", w.a_log.len(), dims.value_heads)?;
        check_len(OP, "dt_bias", w.dt_bias.len(), dims.value_heads)?;
        check_len(OP, "norm_weight", w.norm_weight.len(), dims.value_dim)?;
        crate::ensure_shape!(
            w.norm_eps.is_finite() && w.norm_eps >= 0.0,
            OP,
            "norm_eps must be finite and non-negative, got {}",
            w.norm_eps
        );
        check_len(OP, "qkv", x.qkv.len(), n * cd)?;
        check_len(OP, "z", x.z.len(), n * dims.value_width())?;
        check_len(OP, "a", x.a.len(), n * dims.value_heads)?;
        check_len(OP, "b", x.b.len(), n * dims.value_heads)?;
        check_len(
            OP,
            "conv_in",
            conv_in.len(),
            lay.seqs * dims.conv_state_len(),
        )?;
        check_len(
            OP,
            "conv_out",
            conv_out.len(),
            lay.seqs * dims.conv_state_len(),
        )?;
        check_len(OP, "state", state.len(), lay.seqs * dims.state_len())?;
        check_len(OP, "out", out.len(), n * dims.value_width())?;
        crate::ensure_shape!(
            workspace.len() >= lay.total,
            OP,
            "workspace has {} floats, the batch needs {} (Gpu::gdn_prefill_workspace_len)",
            workspace.len(),
            lay.total
        );
        // cu_seqlens then the chunk offsets, both [seqs + 1]; every value fits i32 (checked by `layout`).
        let mut meta = Vec::with_capacity(2 * (lay.seqs + 1));
        let mut acc = 0usize;
        meta.push(0i32);
        for &l in seq_lens {
            acc += l;
            meta.push(acc as i32);
        }
        acc = 0;
        meta.push(0i32);
        for &l in seq_lens {
            acc += l.div_ceil(CHUNK);
            meta.push(acc as i32);
        }
        #[cfg(feature = "cuda")]
        {
            self.inner.gdn_prefill(
                variant,
                dims,
                w,
                x,
                &meta,
                &lay,
                &conv_in.slice,
                &mut conv_out.slice,
                &mut state.slice,
                &mut out.slice,
                &mut workspace.slice,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (variant, meta, conv_in, conv_out, state, out);
            match self.never {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> GdnDims {
        GdnDims {
            key_heads: 16,
            value_heads: 48,
            key_dim: 128,
            value_dim: 128,
            conv_kernel: 4,
        }
    }

    #[test]
    fn layout_regions_are_aligned_and_disjoint() {
        let l = layout("t", &qwen(), &[65, 0, 3]).unwrap();
        assert_eq!(
            (l.tokens, l.chunks, l.max_len, l.max_chunks),
            (68, 3, 65, 2)
        );
        let regions = [
            (l.qn, l.qk_len),
            (l.kn, l.qk_len),
            (l.v, l.v_len),
            (l.g, l.gate_len),
            (l.beta, l.gate_len),
            (l.gcum, l.gate_len),
            (l.w, l.wu_len),
            (l.u, l.wu_len),
            (l.aqk, l.aqk_len),
        ];
        for (i, &(o, n)) in regions.iter().enumerate() {
            assert_eq!(o % 64, 0, "region {i} at {o}");
            assert!(o + n <= l.total);
            if i + 1 < regions.len() {
                assert!(o + n <= regions[i + 1].0, "region {i} overlaps the next");
            }
        }
        assert_eq!(l.gate_len, 68 * 48);
        assert_eq!(l.wu_len, 48 * 3 * 64 * 128);
    }

    #[test]
    fn every_variant_name_parses_to_its_kernel() {
        for name in GDN_PREFILL_VARIANTS {
            let v = GdnPrefillVariant::parse(name).unwrap();
            let (math, cols) = name.split_once("_cs").unwrap();
            assert!(v.kernel().ends_with(&format!("_cs{cols}")), "{name}");
            assert_eq!(v.cols.to_string(), cols, "{name}");
            let tag = match math {
                "fp32" => "state_cs",
                "tf32x3" => "state_tc3_cs",
                _ => "state_tc1_cs",
            };
            assert!(v.kernel().contains(tag), "{name} -> {}", v.kernel());
        }
        assert_eq!(
            GdnPrefillVariant::parse(""),
            Some(GdnPrefillVariant::DEFAULT)
        );
        // The public name of the default is the default.
        let named = Gpu::GDN_PREFILL_DEFAULT;
        assert_ne!(named, "auto");
        assert!(GDN_PREFILL_VARIANTS.contains(&named));
        let (math, cols) = named.split_once("_cs").unwrap();
        assert_eq!(GdnPrefillVariant::DEFAULT.cols.to_string(), cols);
        assert_eq!(
            GdnPrefillVariant::DEFAULT.math,
            match math {
                "fp32" => StateMath::Fp32,
                "tf32x3" => StateMath::Tf32x3,
                _ => StateMath::Tf32,
            }
        );
        assert_eq!(
            GdnPrefillVariant::parse("auto"),
            Some(GdnPrefillVariant::DEFAULT)
        );
        for bad in ["fp32", "fp32_cs48", "bf16_cs32", "tf32x3_cs", "32"] {
            assert_eq!(GdnPrefillVariant::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn layout_refuses_bad_shapes() {
        let e = layout("t", &qwen(), &[]).unwrap_err();
        assert!(e.to_string().contains("1..=65535 sequences"), "{e}");
        let e = layout("t", &qwen(), &[0, 0]).unwrap_err();
        assert!(e.to_string().contains("at least one token"), "{e}");
        let e = layout(
            "t",
            &GdnDims {
                key_dim: 64,
                ..qwen()
            },
            &[4],
        )
        .unwrap_err();
        assert!(e.to_string().contains("key_dim = value_dim = 128"), "{e}");
        let e = layout(
            "t",
            &GdnDims {
                conv_kernel: 5,
                ..qwen()
            },
            &[4],
        )
        .unwrap_err();
        assert!(e.to_string().contains("conv_kernel must be 2..=4"), "{e}");
        let e = layout("t", &qwen(), &[usize::MAX, 2]).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
        let e = layout("t", &qwen(), &[1 << 27]).unwrap_err();
        assert!(e.to_string().contains("32-bit"), "{e}");
    }
}
