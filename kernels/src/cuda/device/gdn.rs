//! Launch of `cuda/gdn.cu`: the fused gated DeltaNet decode step.

use super::*;

impl Device {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn gdn_decode_step(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        seqs: usize,
        conv_in: &CudaSlice<f32>,
        conv_out: &mut CudaSlice<f32>,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        const NAME: &str = "gdn_decode_step";
        let f = self.function(Module::Gdn, NAME)?;
        let (hk, hv, kconv) = (
            dims.key_heads as i32,
            dims.value_heads as i32,
            dims.conv_kernel as i32,
        );
        let cfg = LaunchConfig {
            // One 256-thread block per (value head, sequence) (cuda/gdn.cu).
            grid_dim: (dims.value_heads as u32, seqs as u32, 1),
            block_dim: (256, 1, 1),
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
        // SAFETY: matches `gdn_decode_step` in cuda/gdn.cu; the caller checked dk = dv = 128 (the kernel's
        // compile-time size), conv_kernel in 2..=4 and every buffer's length against dims and seqs, and conv_in
        // and conv_out are distinct allocations (one is borrowed shared, the other mutably).
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }
}
