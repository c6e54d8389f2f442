//! The shape and parameter types every device shares: head geometries ([`AttnDims`], [`GdnDims`]), the RoPE setup,
//! the RMSNorm weight form and the sampling parameters. The CPU modules (`attention`, `gdn`, `ops`, `sampling`)
//! re-export them where callers have always found them; `cuda/` takes them from here, so the GPU side depends on
//! no CPU module's types.

use crate::error::{checked_product, checked_sum};
use crate::KernelError;

/// Head geometry of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    /// Query heads `Hq`, a multiple of `Hkv`.
    pub q_heads: usize,
    /// KV heads `Hkv`.
    pub kv_heads: usize,
    /// Head dim `D` of queries, keys and values.
    pub head_dim: usize,
}

impl AttnDims {
    /// Checks that every dimension is positive and `Hq` is a multiple of `Hkv`.
    pub fn validate(&self, op: &'static str) -> Result<(), KernelError> {
        crate::ensure_shape!(
            self.q_heads > 0 && self.kv_heads > 0 && self.head_dim > 0,
            op,
            "head counts and head_dim must be positive, got {self:?}"
        );
        crate::ensure_shape!(
            self.q_heads.is_multiple_of(self.kv_heads),
            op,
            "q_heads ({}) must be a multiple of kv_heads ({})",
            self.q_heads,
            self.kv_heads
        );
        Ok(())
    }
}

/// Rotary embedding of one layer type (neox style: pairs `(i, i + rotary_dim/2)` of the first `rotary_dim` dims).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// Head dim `D`.
    pub head_dim: usize,
    /// Rotated dims, `int(D * partial_rotary_factor)` as transformers computes it; the rest pass through.
    pub rotary_dim: usize,
    /// `rope_theta` of this layer type (Spark full 5e6, sliding 1e4; Qwen3.8 1e7).
    pub theta: f64,
}

impl Rope {
    /// The rotary setup of a layer: `rotary_dim = int(head_dim * partial_rotary_factor)`, which must be even.
    pub fn new(
        head_dim: usize,
        partial_rotary_factor: f64,
        theta: f64,
    ) -> Result<Rope, KernelError> {
        const OP: &str = "Rope::new";
        crate::ensure_shape!(
            partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0,
            OP,
            "partial_rotary_factor must be in (0, 1], got {partial_rotary_factor}"
        );
        let rope = Rope {
            head_dim,
            rotary_dim: (head_dim as f64 * partial_rotary_factor) as usize,
            theta,
        };
        rope.validate(OP)?;
        Ok(rope)
    }

    /// Checks `0 < rotary_dim <= head_dim`, `rotary_dim` even, `theta > 1` and finite.
    pub fn validate(&self, op: &'static str) -> Result<(), KernelError> {
        crate::ensure_shape!(
            self.rotary_dim > 0
                && self.rotary_dim <= self.head_dim
                && self.rotary_dim.is_multiple_of(2),
            op,
            "rotary_dim must be even and in 1..={}, got {}",
            self.head_dim,
            self.rotary_dim
        );
        crate::ensure_shape!(
            self.theta.is_finite() && self.theta > 1.0,
            op,
            "theta must be > 1, got {}",
            self.theta
        );
        Ok(())
    }

    /// Inverse frequency of pair `i`, rounded to f32 the way transformers computes it
    /// (`1 / theta^(2i/rotary_dim)` in float32); the angle of position `p` is then `f32(p) * inv_freq` in f32.
    pub fn inv_freq(&self, i: usize) -> f32 {
        (1.0 / self.theta.powf((2 * i) as f64 / self.rotary_dim as f64)) as f32
    }
}

/// Prefill chunk length: 64 tokens, the chunk size of fla's `chunk_gated_delta_rule` that the GPU kernels use too.
pub const CHUNK: usize = 64;

/// Head geometry of one gated DeltaNet layer.
///
/// Qwen3.8-27B: `GdnDims { key_heads: 16, value_heads: 48, key_dim: 128, value_dim: 128, conv_kernel: 4 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// Key (and query) heads `Hk`.
    pub key_heads: usize,
    /// Value heads `Hv`, a multiple of `Hk`.
    pub value_heads: usize,
    /// Key head dim `dk`.
    pub key_dim: usize,
    /// Value head dim `dv`.
    pub value_dim: usize,
    /// Depthwise conv kernel length `K` (4 in every released model).
    pub conv_kernel: usize,
}

impl GdnDims {
    /// Channels of the depthwise conv: `2*Hk*dk + Hv*dv` (saturating; the size checks use
    /// [`GdnDims::checked_sizes`], which refuses a geometry whose sizes overflow).
    pub fn conv_dim(&self) -> usize {
        self.key_heads
            .saturating_mul(2)
            .saturating_mul(self.key_dim)
            .saturating_add(self.value_heads.saturating_mul(self.value_dim))
    }
    /// Width of the output (and of `z`): `Hv*dv`.
    pub fn value_width(&self) -> usize {
        self.value_heads.saturating_mul(self.value_dim)
    }
    /// Floats of one sequence's recurrent state: `Hv*dk*dv`.
    pub fn state_len(&self) -> usize {
        self.value_heads
            .saturating_mul(self.key_dim)
            .saturating_mul(self.value_dim)
    }
    /// Floats of one sequence's conv state: `conv_dim*(K-1)`.
    pub fn conv_state_len(&self) -> usize {
        self.conv_dim()
            .saturating_mul(self.conv_kernel.saturating_sub(1))
    }

    /// `conv_dim`, `value_width`, `state_len` and `conv_state_len` computed with checked arithmetic, or a shape
    /// error naming `op` when one of them does not fit in `usize`.
    pub(crate) fn checked_sizes(&self, op: &'static str) -> Result<GdnSizes, KernelError> {
        let qk = checked_product(op, "2*Hk*dk", &[2, self.key_heads, self.key_dim])?;
        let value_width = checked_product(op, "Hv*dv", &[self.value_heads, self.value_dim])?;
        let conv_dim = checked_sum(op, "2*Hk*dk + Hv*dv", &[qk, value_width])?;
        Ok(GdnSizes {
            conv_dim,
            value_width,
            state_len: checked_product(op, "Hv*dk*dv", &[value_width, self.key_dim])?,
            conv_state_len: checked_product(
                op,
                "conv_dim*(K-1)",
                &[conv_dim, self.conv_kernel.saturating_sub(1)],
            )?,
            conv_weight_len: checked_product(op, "conv_dim*K", &[conv_dim, self.conv_kernel])?,
        })
    }

    /// Checks that the geometry is usable: every dimension positive, `Hv` a multiple of `Hk`.
    pub fn validate(&self, op: &'static str) -> Result<(), KernelError> {
        crate::ensure_shape!(
            self.key_heads > 0 && self.value_heads > 0 && self.key_dim > 0 && self.value_dim > 0,
            op,
            "every head count and head dim must be positive, got {self:?}"
        );
        crate::ensure_shape!(
            self.conv_kernel >= 1,
            op,
            "conv_kernel must be at least 1, got 0"
        );
        crate::ensure_shape!(
            self.value_heads.is_multiple_of(self.key_heads),
            op,
            "value_heads ({}) must be a multiple of key_heads ({})",
            self.value_heads,
            self.key_heads
        );
        Ok(())
    }
}

/// The sizes derived from a [`GdnDims`], each known to fit in `usize`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GdnSizes {
    pub(crate) conv_dim: usize,
    pub(crate) value_width: usize,
    pub(crate) state_len: usize,
    pub(crate) conv_state_len: usize,
    pub(crate) conv_weight_len: usize,
}

/// Which RMSNorm weight form a model uses: `x * rsqrt(mean(x^2) + eps) * w` (Llama, Spark) or `... * (1 + w)`
/// (Gemma, Qwen3.5 — the checkpoint stores `w` centred on 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormWeight {
    /// Multiply by `w`.
    Plain,
    /// Multiply by `1 + w`.
    OnePlus,
}

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` largest logits; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
}

impl SamplingParams {
    /// Greedy decoding.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };
}

/// The activation of a gated MLP (`act(gate) * up`): what a model's `hidden_act` names. One name for the op on
/// both devices: [`crate::ops::act_and_mul`] on the CPU, `Gpu::act_and_mul_f32` on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedAct {
    /// `silu` (Llama, Qwen): [`crate::ops::silu_and_mul`].
    Silu,
    /// `gelu`, the exact erf form (Spark): [`crate::ops::gelu_and_mul`].
    GeluErf,
    /// `gelu_pytorch_tanh` (Gemma): [`crate::ops::gelu_tanh_and_mul`].
    GeluTanh,
}
