//! Launches of the small ops in `cuda/ops.cu` (norms, gated activations, embedding gathers, argmax, sampling,
//! RoPE). The safe wrappers in `cuda/ops.rs` have checked every length, count and parameter before anything here
//! runs; each launch below states what its kernel relies on.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{cuda_err, Device, Module, PdlArgs};
use crate::KernelError;

/// Threads of the norm blocks (`NORM_THREADS` in cuda/ops.cu).
const NORM_THREADS: u32 = 256;
/// Threads of the gated-activation blocks, each doing four outputs (`GLU_THREADS`).
const GLU_THREADS: u32 = 256;
/// Threads of the gather blocks (`GATHER_THREADS`).
const GATHER_THREADS: u32 = 128;
/// Threads of the argmax and sampling blocks (`ARGMAX_THREADS`, `SAMPLE_THREADS`).
const ROW_THREADS: u32 = 1024;
/// Blocks of one argmax cluster (`ARGMAX_CLUSTER`, the kernel's `__cluster_dims__`).
const ARGMAX_CLUSTER: u32 = 8;
/// Blocks of one sampling cluster (`SAMPLE_CLUSTER`, the kernel's `__cluster_dims__`).
const SAMPLE_CLUSTER: u32 = 8;
/// Threads of the f32 elementwise blocks (`EW_THREADS`).
const EW_THREADS: u32 = 256;
/// Most blocks of a grid-stride elementwise launch (flat ops, and `copy_cols`' columns).
const EW_MAX_BLOCKS: usize = 4096;
/// Most blocks along grid.y of the row-wise ops (the hardware's limit); more rows are strided.
const EW_MAX_ROWS: usize = 65535;

/// The flat elementwise ops' grid over `n` elements: one thread per float4 of the vector part (at least one block,
/// which also covers a tail of up to 3), at most EW_MAX_BLOCKS blocks (the kernels stride).
fn flat_config(n: usize) -> LaunchConfig {
    let blocks = (n / 4)
        .div_ceil(EW_THREADS as usize)
        .clamp(1, EW_MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (EW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The gated activations' grid: a block of GLU_THREADS threads per row and 4 * GLU_THREADS of its `width` outputs.
fn glu_config(rows: usize, width: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            rows as u32,
            width.div_ceil(4 * GLU_THREADS as usize) as u32,
            1,
        ),
        block_dim: (GLU_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Device {
    /// `name`: `rmsnorm_frag_{fp8,nvfp4}` (`residual` `None`) or `add_rmsnorm_frag_*`: one block per token row,
    /// writing a decode GEMV's activation fragments, and zeroing `zero` whole if given.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn rmsnorm_fragments(
        &self,
        name: &'static str,
        x: &CudaSlice<f32>,
        residual: Option<&mut CudaSlice<f32>>,
        w: &CudaSlice<f32>,
        add: f32,
        eps: f32,
        xf: &mut CudaSlice<u32>,
        zero: Option<&mut CudaSlice<f32>>,
        rows: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (fp, _gf) = xf.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp);
        let _gr = residual.map(|r| {
            let (rp, g) = r.device_ptr_mut(&self.stream);
            args.ptr(rp);
            g
        });
        args.ptr(wp).f32(add).f32(eps).ptr(fp).i32(dim as i32);
        let _gz = self.zero_args(&mut args, zero);
        // SAFETY: matches `rmsnorm_frag_{fp8,nvfp4}(x, w, add, eps, xf, dim, y, ylen)` / `add_rmsnorm_frag_*(x,
        // residual, w, add, eps, xf, dim, y, ylen)` in cuda/ops.cu (the caller picks the name by the residual's
        // presence); the caller checked x and residual = [rows, dim], w = [dim], 1 <= rows <= 16 (one block per
        // token; the kernel takes 8 tokens per fragment tile from gridDim.x), dim % 16 == 0 and dim <= 8192 (the
        // kernel's float4 path, the only one that writes fragments), and xf of at least ceil(dim/128) * nt * 512
        // words (Gpu::gemv_scratch_len), every entry the kernel writes; (y, ylen) is a whole allocation and its
        // length (zero_args) or (null, 0); as a programmatic dependent it touches memory only after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, per_row(rows, NORM_THREADS), &mut args) }?;
        Ok(())
    }

    /// The producers' last two arguments: `zero`'s pointer and length (a whole allocation, so 256-byte aligned as
    /// `zero_f32` in cuda/common.cuh needs), or (null, 0). Returns the pointer's guard, to hold until the launch.
    fn zero_args<'a>(
        &'a self,
        args: &mut PdlArgs,
        zero: Option<&'a mut CudaSlice<f32>>,
    ) -> Option<cudarc::driver::SyncOnDrop<'a>> {
        match zero {
            Some(z) => {
                let len = z.len() as u64;
                let (zp, g) = z.device_ptr_mut(&self.stream);
                args.ptr(zp).u64(len);
                Some(g)
            }
            None => {
                args.ptr(0).u64(0);
                None
            }
        }
    }

    /// `rmsnorm_bf16` / `rmsnorm_f32` (`residual` `None`) or `add_rmsnorm_*` (`Some`): one block per row.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn rmsnorm<T: super::GpuScalar>(
        &self,
        name: &'static str,
        x: &CudaSlice<f32>,
        residual: Option<&mut CudaSlice<f32>>,
        w: &CudaSlice<f32>,
        add: f32,
        eps: f32,
        out: &mut CudaSlice<T>,
        rows: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp);
        let _gr = residual.map(|r| {
            let (rp, g) = r.device_ptr_mut(&self.stream);
            args.ptr(rp);
            g
        });
        args.ptr(wp).f32(add).f32(eps).ptr(op).i32(dim as i32);
        // SAFETY: matches `rmsnorm_*` / `add_rmsnorm_*` in cuda/ops.cu (the caller picks the name from the output
        // type and the residual's presence); the caller checked x, residual and out = [rows, dim], w = [dim],
        // 1 <= rows <= i32::MAX (one block per row) and dim <= i32::MAX; the kernels' float4 path is taken only when
        // dim % 4 == 0, which keeps every row 16-byte aligned in these 256-byte-aligned allocations; a programmatic
        // dependent (rmsnorm_row_to's pdl_start first).
        unsafe { self.launch_pdl(name, &f, per_row(rows, NORM_THREADS), &mut args) }?;
        Ok(())
    }

    /// `add_rmsnorm_dual`: one block per row, writing the f32 output and its bf16 copy.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn rmsnorm_dual(
        &self,
        x: &CudaSlice<f32>,
        residual: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        add: f32,
        eps: f32,
        out: &mut CudaSlice<f32>,
        out_b: &mut CudaSlice<u16>,
        rows: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "add_rmsnorm_dual";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (rp, _gr) = residual.device_ptr_mut(&self.stream);
        let (wp, _gw) = w.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let (bp, _gb) = out_b.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(rp)
            .ptr(wp)
            .f32(add)
            .f32(eps)
            .ptr(op)
            .ptr(bp)
            .i32(dim as i32);
        // SAFETY: matches `add_rmsnorm_dual(x, residual, w, add, eps, out, out_b, dim)` in cuda/ops.cu; the caller
        // checked x, residual, out and out_b = [rows, dim], w = [dim], 1 <= rows <= i32::MAX (one block per row) and
        // dim <= i32::MAX; the float4 path is taken only when dim % 4 == 0, which keeps every row of both outputs
        // aligned in these 256-byte-aligned allocations; a programmatic dependent (pdl_start first).
        unsafe { self.launch_pdl(NAME, &f, per_row(rows, NORM_THREADS), &mut args) }?;
        Ok(())
    }

    /// `sigmoid_gate_bf16`: the flat grid over x.len().
    pub(in crate::cuda) fn sigmoid_gate_bf16(
        &self,
        x: &CudaSlice<f32>,
        gate: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
    ) -> Result<(), KernelError> {
        const NAME: &str = "sigmoid_gate_bf16";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (gp, _gg) = gate.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(gp).ptr(op).u64(x.len() as u64);
        // SAFETY: matches `sigmoid_gate_bf16(x, gate, out, n)` in cuda/ops.cu; the caller checked gate.len() ==
        // out.len() == x.len() = n >= 1; indices < n only, the vector accesses below 4 * (n / 4) from 256-byte-aligned
        // starts; a programmatic dependent (ew_walk's pdl_start first).
        unsafe { self.launch_pdl(NAME, &f, flat_config(x.len()), &mut args) }?;
        Ok(())
    }

    /// `name`: `silu_and_mul_frag_{fp8,nvfp4}` / `gelu_and_mul_frag_*`: the gated activation of `rows` token rows
    /// written as a decode GEMV's activation fragments, as a programmatic dependent.
    pub(in crate::cuda) fn glu_fragments(
        &self,
        name: &'static str,
        gate_up: &CudaSlice<f32>,
        xf: &mut CudaSlice<u32>,
        zero: Option<&mut CudaSlice<f32>>,
        rows: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        // The grid covers inter rounded up to whole 128-value chunks: the padding's fragments are written too.
        let cfg = glu_config(rows, inter.div_ceil(128) * 128);
        let (gp, _gg) = gate_up.device_ptr(&self.stream);
        let (fp, _gf) = xf.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(gp).ptr(fp).i32(inter as i32);
        let _gz = self.zero_args(&mut args, zero);
        // SAFETY: matches `*_and_mul_frag_{fp8,nvfp4}(gate_up, xf, inter, y, ylen)` in cuda/ops.cu; the caller
        // checked gate_up = [rows, 2*inter] with 1 <= rows <= 16, inter % 16 == 0 (so the float4 loads are aligned)
        // and inter <= 65535 * 1024 (a multiple of 128, so the padded grid's y stays <= 65535), and xf of at least
        // ceil(inter/128) * nt * 512 words (Gpu::gemv_scratch_len), every entry the grid writes (threads past the
        // last 128-chunk return); (y, ylen) as zero_args says; as a programmatic dependent it touches memory only
        // after its pdl_wait.
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }

    /// `silu_and_mul_bf16` / `gelu_and_mul_bf16`: grid (rows, ceil(inter / 1024)).
    pub(in crate::cuda) fn glu(
        &self,
        gelu: bool,
        gate_up: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
        rows: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        let name = if gelu {
            "gelu_and_mul_bf16"
        } else {
            "silu_and_mul_bf16"
        };
        let f = self.function(Module::Ops, name)?;
        let i = inter as i32;
        let cfg = glu_config(rows, inter);
        let (gp, _gg) = gate_up.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(gp).ptr(op).i32(i);
        // SAFETY: matches `*_and_mul_bf16` in cuda/ops.cu; the caller checked gate_up = [rows, 2*inter],
        // out = [rows, inter], rows <= i32::MAX and ceil(inter/1024) <= 65535; threads past inter return, and the
        // float4 path runs only when inter % 4 == 0 (aligned halves); a programmatic dependent (pdl_start first).
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }

    /// `embedding_gather_bf16`: one block per id.
    pub(in crate::cuda) fn embedding_gather_bf16(
        &self,
        table: &CudaSlice<u16>,
        ids: &CudaSlice<u32>,
        out: &mut CudaSlice<f32>,
        vocab: usize,
        dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "embedding_gather_bf16";
        let f = self.function(Module::Ops, NAME)?;
        let (v, d) = (vocab as u32, dim as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(table).arg(ids).arg(out).arg(&v).arg(&d);
        // SAFETY: matches `embedding_gather_bf16` in cuda/ops.cu; the caller checked table = [vocab, dim],
        // out = [ids, dim], 1 <= ids <= i32::MAX, vocab < 2^32 and dim <= i32::MAX; the kernel reads a row only for
        // an id < vocab (others become NaN rows), and its 16-byte loads only when dim % 8 == 0.
        unsafe { b.launch(per_row(ids.len(), GATHER_THREADS)) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `embedding_gather_int4`: one block per id.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn embedding_gather_int4(
        &self,
        packed: &CudaSlice<u8>,
        scales_zeros: &CudaSlice<u16>,
        ids: &CudaSlice<u32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        k: usize,
        group: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "embedding_gather_int4";
        let f = self.function(Module::Ops, NAME)?;
        let npad = n.div_ceil(64) as u32 * 64;
        let (nn, kk, g) = (n as u32, k as i32, group as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(packed)
            .arg(scales_zeros)
            .arg(ids)
            .arg(out)
            .arg(&nn)
            .arg(&kk)
            .arg(&g)
            .arg(&npad);
        // SAFETY: matches `embedding_gather_int4` in cuda/ops.cu; the caller checked packed = [npad/64][k][32],
        // scales_zeros = [ceil(k/group)][npad][2], out = [ids, k], group > 0, npad < 2^32 and k <= i32::MAX;
        // ids >= n read nothing (NaN rows).
        unsafe { b.launch(per_row(ids.len(), GATHER_THREADS)) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `argmax_cluster8` (grid (8, rows), clusters of 8 along x) or `argmax_block` (grid (1, rows)).
    pub(in crate::cuda) fn argmax(
        &self,
        cluster: bool,
        logits: &CudaSlice<f32>,
        out: &mut CudaSlice<u32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), KernelError> {
        let (name, gx) = if cluster {
            ("argmax_cluster8", ARGMAX_CLUSTER)
        } else {
            ("argmax_block", 1)
        };
        let f = self.function(Module::Ops, name)?;
        let v = vocab as u32;
        let cfg = LaunchConfig {
            grid_dim: (gx, rows as u32, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits).arg(out).arg(&v);
        // SAFETY: matches `argmax_*` in cuda/ops.cu; the caller checked logits = [rows, vocab], out = [rows],
        // 1 <= rows <= 65535 (grid.y) and vocab <= i32::MAX; the cluster kernel's compile-time cluster of 8 divides
        // grid.x = 8; float4 loads only when vocab % 4 == 0.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    /// `sample_topk_topp_cluster8` (grid (8, rows), clusters of 8 along x) or `sample_topk_topp` (grid (rows)).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn sample(
        &self,
        cluster: bool,
        logits: &CudaSlice<f32>,
        rng: &mut CudaSlice<u32>,
        out: &mut CudaSlice<u32>,
        rows: usize,
        vocab: usize,
        k: usize,
        temperature: f32,
        top_p: f32,
    ) -> Result<(), KernelError> {
        let (name, grid_dim) = if cluster {
            (
                "sample_topk_topp_cluster8",
                (SAMPLE_CLUSTER, rows as u32, 1),
            )
        } else {
            ("sample_topk_topp", (rows as u32, 1, 1))
        };
        let f = self.function(Module::Ops, name)?;
        let (v, kk) = (vocab as u32, k as u32);
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits)
            .arg(rng)
            .arg(out)
            .arg(&v)
            .arg(&kk)
            .arg(&temperature)
            .arg(&top_p);
        // SAFETY: matches `sample_topk_topp*` in cuda/ops.cu; the caller checked logits = [rows, vocab],
        // rng = [rows, 4], out = [rows], 1 <= rows <= i32::MAX (one block per row) and <= 65535 for the cluster
        // kernel (grid.y), whose compile-time cluster of 8 divides grid.x = 8; 1 <= k <= min(vocab, 1024) (the
        // shared candidate array), vocab <= i32::MAX, temperature finite and > 0 unless k == 1, top_p in (0, 1].
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    /// `silu_and_mul_f32` / `gelu_and_mul_f32` / `gelu_tanh_and_mul_f32`: grid (rows, ceil(inter / 1024)).
    pub(in crate::cuda) fn act_and_mul_f32(
        &self,
        act: crate::shapes::GatedAct,
        gate_up: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: usize,
        inter: usize,
    ) -> Result<(), KernelError> {
        use crate::shapes::GatedAct;
        let name = match act {
            GatedAct::Silu => "silu_and_mul_f32",
            GatedAct::GeluErf => "gelu_and_mul_f32",
            GatedAct::GeluTanh => "gelu_tanh_and_mul_f32",
        };
        let f = self.function(Module::Ops, name)?;
        let (gp, _gg) = gate_up.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(gp).ptr(op).i32(inter as i32);
        // SAFETY: matches `*_and_mul_f32(gate_up, out, inter)` in cuda/ops.cu; the caller checked
        // gate_up = [rows, 2*inter], out = [rows, inter], 1 <= rows <= i32::MAX and 1 <= inter <= 65535 * 1024 (so
        // grid.y = ceil(inter/1024) <= 65535); threads past inter return, and the float4 path runs only when
        // inter % 4 == 0 (aligned rows and halves); a programmatic dependent (pdl_start first).
        unsafe { self.launch_pdl(name, &f, glu_config(rows, inter), &mut args) }?;
        Ok(())
    }

    /// `cast_f32_to_bf16`: the flat grid over x.len().
    pub(in crate::cuda) fn cast_f32_to_bf16(
        &self,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
    ) -> Result<(), KernelError> {
        const NAME: &str = "cast_f32_to_bf16";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(op).u64(x.len() as u64);
        // SAFETY: matches `cast_f32_to_bf16(x, out, n)` in cuda/ops.cu; the caller checked out.len() == x.len() = n
        // >= 1; the kernel touches indices < n only, its 16-byte / 8-byte vector accesses cover whole groups of 4
        // below 4 * (n / 4) from the starts of these 256-byte-aligned allocations; a programmatic dependent
        // (ew_walk's pdl_start first).
        unsafe { self.launch_pdl(NAME, &f, flat_config(x.len()), &mut args) }?;
        Ok(())
    }

    /// `cast_bf16_to_f32`: the flat grid over x.len().
    pub(in crate::cuda) fn cast_bf16_to_f32(
        &self,
        x: &CudaSlice<u16>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        const NAME: &str = "cast_bf16_to_f32";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = x.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(op).u64(x.len() as u64);
        // SAFETY: matches `cast_bf16_to_f32(x, out, n)` in cuda/ops.cu; as cast_f32_to_bf16 above.
        unsafe { self.launch_pdl(NAME, &f, flat_config(x.len()), &mut args) }?;
        Ok(())
    }

    /// `sigmoid_gate_f32` / `add_assign_f32` (`x op= y`): the flat grid over x.len().
    pub(in crate::cuda) fn ew_binary(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let len = x.len();
        let (xp, _gx) = x.device_ptr_mut(&self.stream);
        let (yp, _gy) = y.device_ptr(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(yp).u64(len as u64);
        // SAFETY: matches `sigmoid_gate_f32(x, gate, n)` / `add_assign_f32(x, y, n)` in cuda/ops.cu; the caller
        // checked y.len() == x.len() = n >= 1 (two distinct allocations: one is borrowed mutably); the kernel
        // touches indices < n only, float4 accesses only below 4 * (n / 4) from 256-byte-aligned starts; a
        // programmatic dependent (ew_walk's pdl_start first).
        unsafe { self.launch_pdl(name, &f, flat_config(len), &mut args) }?;
        Ok(())
    }

    /// `softcap_f32` / `scale_assign_f32` (`x = op(x, s)`): the flat grid over x.len().
    pub(in crate::cuda) fn ew_scalar(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        s: f32,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let len = x.len();
        let (xp, _gx) = x.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).f32(s).u64(len as u64);
        // SAFETY: matches `softcap_f32(x, cap, n)` / `scale_assign_f32(x, s, n)` in cuda/ops.cu; n = x.len() >= 1
        // (the caller returns before an empty buffer); indices < n only, float4 accesses as in ew_binary; a
        // programmatic dependent (ew_walk's pdl_start first).
        unsafe { self.launch_pdl(name, &f, flat_config(len), &mut args) }?;
        Ok(())
    }

    /// `sigmoid_head_gate_f32` (`v` the gate, one per group of `cols`) / `add_bias_rows_f32` (`v` the bias, one
    /// per column): grid (ceil(cols / 256), min(rows, 65535)).
    pub(in crate::cuda) fn ew_rows(
        &self,
        name: &'static str,
        x: &mut CudaSlice<f32>,
        v: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        let f = self.function(Module::Ops, name)?;
        let cfg = LaunchConfig {
            grid_dim: (
                cols.div_ceil(EW_THREADS as usize) as u32,
                rows.min(EW_MAX_ROWS) as u32,
                1,
            ),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, _gx) = x.device_ptr_mut(&self.stream);
        let (vp, _gv) = v.device_ptr(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp).ptr(vp).u64(rows as u64).i32(cols as i32);
        // SAFETY: matches `sigmoid_head_gate_f32(x, gate, groups, d)` / `add_bias_rows_f32(x, bias, rows, n)` in
        // cuda/ops.cu; the caller checked x = [rows, cols] with rows, cols >= 1 and cols <= i32::MAX, and v of
        // rows elements (the gate) or cols (the bias), the only ones each kernel reads; threads past cols return
        // and grid.y strides the rows; a programmatic dependent (pdl_start before any return).
        unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        Ok(())
    }

    /// `copy_cols_f32`: grid (min(ceil(width / 256), 4096), min(rows, 65535)), both strided.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn copy_cols(
        &self,
        src: &CudaSlice<f32>,
        src_cols: usize,
        src_off: usize,
        dst: &mut CudaSlice<f32>,
        dst_cols: usize,
        dst_off: usize,
        rows: usize,
        width: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "copy_cols_f32";
        let f = self.function(Module::Ops, NAME)?;
        let a = [src_cols, src_off, dst_cols, dst_off, rows, width].map(|v| v as u64);
        let cfg = LaunchConfig {
            grid_dim: (
                width.div_ceil(EW_THREADS as usize).min(EW_MAX_BLOCKS) as u32,
                rows.min(EW_MAX_ROWS) as u32,
                1,
            ),
            block_dim: (EW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (sp, _gs) = src.device_ptr(&self.stream);
        let (dp, _gd) = dst.device_ptr_mut(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(sp)
            .u64(a[0])
            .u64(a[1])
            .ptr(dp)
            .u64(a[2])
            .u64(a[3])
            .u64(a[4])
            .u64(a[5]);
        // SAFETY: matches `copy_cols_f32(src, src_cols, src_off, dst, dst_cols, dst_off, rows, width)` in
        // cuda/ops.cu; the caller checked rows, width >= 1 and (rows - 1) * cols + off + width <= len on both sides
        // without overflow, so every index the kernel forms (r < rows, c < width) is inside its buffer; src and dst
        // are distinct allocations (dst is borrowed mutably); a programmatic dependent (pdl_start first).
        unsafe { self.launch_pdl(NAME, &f, cfg, &mut args) }?;
        Ok(())
    }

    /// `rope_neox`: one block of 256 threads per token.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn rope_neox(
        &self,
        x: &mut CudaSlice<f32>,
        positions: &CudaSlice<u32>,
        theta: f64,
        tokens: usize,
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "rope_neox";
        let f = self.function(Module::Ops, NAME)?;
        let (xp, _gx) = x.device_ptr_mut(&self.stream);
        let (pp, _gp) = positions.device_ptr(&self.stream);
        let mut args = PdlArgs::default();
        args.ptr(xp)
            .ptr(pp)
            .f64(theta)
            .i32(heads as i32)
            .i32(head_dim as i32)
            .i32(rotary_dim as i32);
        // SAFETY: matches `rope_neox` in cuda/ops.cu; the caller checked x = [tokens, heads, head_dim],
        // positions = [tokens], 1 <= tokens <= i32::MAX, heads * head_dim <= i32::MAX, rotary_dim even,
        // 2 <= rotary_dim <= min(head_dim, 1024) (the kernel's 512-entry angle tables); a programmatic dependent
        // (pdl_start first).
        unsafe { self.launch_pdl(NAME, &f, per_row(tokens, 256), &mut args) }?;
        Ok(())
    }
}
