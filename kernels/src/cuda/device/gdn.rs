//! Launch of `cuda/gdn.cu`: the fused gated DeltaNet decode step, every variant.

use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::*;
use crate::cuda::gdn::{GdnDecodeKernel, GdnStepArgs};

impl Device {
    /// A device buffer's address for a launch argument, with the guard that keeps the stream ordered for it.
    pub(in crate::cuda) fn addr<'a, T>(
        &'a self,
        s: &'a CudaSlice<T>,
    ) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        s.device_ptr(&self.stream)
    }

    /// As [`Device::addr`] for a buffer the kernel writes.
    pub(in crate::cuda) fn addr_mut<'a, T>(
        &'a self,
        s: &'a mut CudaSlice<T>,
    ) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        s.device_ptr_mut(&self.stream)
    }

    pub(in crate::cuda) fn gdn_decode_step(
        &self,
        kernel: GdnDecodeKernel,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnStepArgs,
        seqs: usize,
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
        let (cw, _g0) = self.addr(&w.conv_weight.slice);
        let (al, _g1) = self.addr(&w.a_log.slice);
        let (dt, _g2) = self.addr(&w.dt_bias.slice);
        let (nw, _g3) = self.addr(&w.norm_weight.slice);
        let mut args = PdlArgs::default();
        args.u64(x.qkv).u64(x.z).u64(x.a).u64(x.b);
        args.ptr(cw).ptr(al).ptr(dt).ptr(nw);
        args.f32(w.norm_eps)
            .u64(x.conv_in)
            .u64(x.conv_out)
            .u64(x.state)
            .u64(x.out);
        args.i32(hk).i32(hv).i32(kconv);
        args.u64(x.slots)
            .u64(x.pos)
            .u32(x.n_slots)
            .i32(x.qkv_ld)
            .i32(x.z_ld)
            .i32(x.ab_ld);
        // SAFETY: every entry of cuda/gdn.cu takes these arguments in this order; the caller checked dk = dv =
        // 128 (the kernels' compile-time size), conv_kernel in 2..=4, seqs in 1..=65535 (grid y), value_heads
        // small enough for the 32-bit grid x, every buffer's length against dims, seqs, the row strides and (with
        // slots) n_slots, and holds the guards of every address until this returns; a slot past n_slots is
        // refused inside the kernel before any cache access; conv_in and conv_out are distinct allocations, or
        // (with slots) one allocation whose halves the kernel reads and writes apart. The block size and the
        // blocks per head come from the same table entry as the entry point, so they match the kernel's
        // __launch_bounds__ and __cluster_dims__.
        // A programmatic dependent: the kernel's pdl_start comes before any memory access.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }
}
