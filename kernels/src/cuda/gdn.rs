//! The fused gated DeltaNet decode step (`kernels/cuda/gdn.cu`).

use super::{check_len, GdnGpuInputs, GdnGpuWeights, Gpu, GpuBuffer};
use crate::gdn::GdnDims;
use crate::KernelError;

impl Gpu {
    /// `seqs` sequences, one token each, with the layouts of [`crate::gdn`].
    ///
    /// The conv state is read from `conv_in` and the advanced one written to `conv_out` (two buffers, swapped by
    /// the caller each step): the three value heads that share a key head run in different blocks and all read
    /// the key head's conv history, so updating it in place would race. The recurrent `state` is updated in place
    /// (each value head's `[dk, dv]` slice belongs to exactly one block). Built for `dk = dv = 128` and conv
    /// kernels 2..=4 (every released model), checked here.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_decode_step(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seqs: usize,
        conv_in: &GpuBuffer<f32>,
        conv_out: &mut GpuBuffer<f32>,
        state: &mut GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::gdn_decode_step";
        dims.validate(OP)?;
        crate::ensure_shape!(
            dims.key_dim == 128 && dims.value_dim == 128,
            OP,
            "the CUDA step is built for key_dim = value_dim = 128 (Qwen3.5 / Qwen3-Next), got {}x{}",
            dims.key_dim,
            dims.value_dim
        );
        crate::ensure_shape!(
            (2..=4).contains(&dims.conv_kernel),
            OP,
            "conv_kernel must be 2..=4, got {}",
            dims.conv_kernel
        );
        crate::ensure_shape!(
            (1..=65535).contains(&seqs),
            OP,
            "seqs must be 1..=65535, got {seqs}"
        );
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
        check_len(OP, "qkv", x.qkv.len(), seqs * cd)?;
        check_len(OP, "z", x.z.len(), seqs * dims.value_width())?;
        check_len(OP, "a", x.a.len(), seqs * dims.value_heads)?;
        check_len(OP, "b", x.b.len(), seqs * dims.value_heads)?;
        check_len(OP, "conv_in", conv_in.len(), seqs * dims.conv_state_len())?;
        check_len(OP, "conv_out", conv_out.len(), seqs * dims.conv_state_len())?;
        check_len(OP, "state", state.len(), seqs * dims.state_len())?;
        check_len(OP, "out", out.len(), seqs * dims.value_width())?;
        #[cfg(feature = "cuda")]
        {
            self.inner.gdn_decode_step(
                dims,
                w,
                x,
                seqs,
                &conv_in.slice,
                &mut conv_out.slice,
                &mut state.slice,
                &mut out.slice,
            )
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}
