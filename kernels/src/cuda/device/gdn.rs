//! Launch of `cuda/gdn.cu`: the fused gated DeltaNet decode step, every variant.

use super::*;
use crate::cuda::gdn::GdnDecodeKernel;

impl Device {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn gdn_decode_step(
        &self,
        kernel: GdnDecodeKernel,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seqs: usize,
        conv_in: &CudaSlice<f32>,
        conv_out: &mut CudaSlice<f32>,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let name = kernel.entry;
        let f = self.function(Module::Gdn, name)?;
        let (hk, hv, kconv) = (
            dims.key_heads as i32,
            dims.value_heads as i32,
            dims.conv_kernel as i32,
        );
        let cfg = LaunchConfig {
            // blocks_per_head blocks per (value head, sequence), consecutive in x so that each head's blocks form
            // one of the kernel's compile-time clusters (cuda/gdn.cu).
            grid_dim: (
                dims.value_heads as u32 * kernel.blocks_per_head,
                seqs as u32,
                1,
            ),
            block_dim: (kernel.threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.qkv.slice)
            .arg(&x.z.slice)
            .arg(&x.a.slice)
            .arg(&x.b.slice);
        b.arg(&w.conv_weight.slice)
            .arg(&w.a_log.slice)
            .arg(&w.dt_bias.slice)
            .arg(&w.norm_weight.slice);
        b.arg(&w.norm_eps)
            .arg(conv_in)
            .arg(conv_out)
            .arg(state)
            .arg(out);
        b.arg(&hk).arg(&hv).arg(&kconv);
        // SAFETY: every entry of cuda/gdn.cu takes these arguments in this order; the caller checked dk = dv =
        // 128 (the kernels' compile-time size), conv_kernel in 2..=4, seqs in 1..=65535 (grid y), value_heads
        // small enough for the 32-bit grid x, and every buffer's length against dims and seqs; conv_in and
        // conv_out are distinct allocations (one is borrowed shared, the other mutably). The block size and the
        // blocks per head come from the same table entry as the entry point, so they match the kernel's
        // __launch_bounds__ and __cluster_dims__.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }
}
