//! The `cuda` build of [`super::Gpu`]: cudarc (driver API, loaded dynamically) over the PTX that `build.rs`
//! embedded. The safe wrappers in `super` have checked every length before anything here runs; this file only
//! picks the kernel instantiation, sizes the grid and launches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::{GdnGpuInputs, GdnGpuWeights, GpuScalar, PagedAttentionDims};
use crate::gdn::GdnDims;
use crate::KernelError;

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/cuda_modules.rs"));
}

// One file per kernel family beyond the first four: each adds an `impl Device` block with its launches.
mod attention_prefill;
mod gdn_prefill;
mod gemm_sm90a;
mod ops;

/// The embedded modules, each loaded at most once per context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(dead_code)] // placeholder modules until their kernels land (session 2)
enum Module {
    Gemv,
    Gdn,
    Attention,
    Gemm,
    /// `cuda/gdn_prefill.cu`: the chunked gated DeltaNet prefill.
    GdnPrefill,
    /// `cuda/attention_prefill.cu`: causal prefill attention.
    AttentionPrefill,
    /// `cuda/ops.cu`: norms, activations, embedding gather, argmax and sampling.
    Ops,
    /// `cuda/gemm_sm90a.cu`: wgmma/TMA GEMMs, an sm_90a cubin only (no PTX: the `a` features do not carry over).
    GemmSm90a,
}

impl Module {
    /// The PTX (`compute_90`), which any device of compute capability 9.0 or later can JIT; `None` for the
    /// sm_90a-only modules.
    fn ptx(self) -> Option<&'static str> {
        Some(match self {
            Module::Gemv => ptx::PTX_GEMV,
            Module::Gdn => ptx::PTX_GDN,
            Module::Attention => ptx::PTX_ATTENTION,
            Module::Gemm => ptx::PTX_GEMM,
            Module::GdnPrefill => ptx::PTX_GDN_PREFILL,
            Module::AttentionPrefill => ptx::PTX_ATTENTION_PREFILL,
            Module::Ops => ptx::PTX_OPS,
            Module::GemmSm90a => return None,
        })
    }

    /// The same module assembled for sm_90 by the build's ptxas (sm_90a for the `*_sm90a.cu` modules).
    fn cubin_sm90(self) -> &'static [u8] {
        match self {
            Module::Gemv => ptx::CUBIN_SM90_GEMV,
            Module::Gdn => ptx::CUBIN_SM90_GDN,
            Module::Attention => ptx::CUBIN_SM90_ATTENTION,
            Module::Gemm => ptx::CUBIN_SM90_GEMM,
            Module::GdnPrefill => ptx::CUBIN_SM90_GDN_PREFILL,
            Module::AttentionPrefill => ptx::CUBIN_SM90_ATTENTION_PREFILL,
            Module::Ops => ptx::CUBIN_SM90_OPS,
            Module::GemmSm90a => ptx::CUBIN_GEMM_SM90A,
        }
    }
}

fn cuda_err(op: &str) -> impl Fn(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| KernelError::Cuda(format!("{op}: {e:?}"))
}

pub(super) struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm_count: usize,
    /// Compute capability 9.0 exactly: load the embedded sm_90 cubins instead of JIT-compiling the PTX.
    is_sm90: bool,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    /// Split-K partials of the attention decode, grown on demand and reused across calls.
    attention_ws: Mutex<Option<CudaSlice<f32>>>,
}

impl Device {
    pub(super) fn probe() -> Result<Option<Device>, KernelError> {
        // SAFETY: only tries to dlopen the driver library by its usual names; no CUDA call is made through it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Ok(None);
        }
        match CudaContext::device_count() {
            Ok(n) if n > 0 => Ok(Some(Device::new(0)?)),
            // No device, or a driver that cannot initialise (CUDA_ERROR_NO_DEVICE and friends): nothing to run on.
            _ => Ok(None),
        }
    }

    pub(super) fn new(ordinal: usize) -> Result<Device, KernelError> {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("opening the device"))?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(cuda_err("reading the multiprocessor count"))? as usize;
        use cudarc::driver::sys::CUdevice_attribute as A;
        let cc = |a| {
            ctx.attribute(a)
                .map_err(cuda_err("reading the compute capability"))
        };
        let major = cc(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = cc(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        if major < 9 {
            return Err(KernelError::Cuda(format!(
                "the kernels are built for compute capability 9.0 or later (Hopper), device {ordinal} is {major}.{minor}"
            )));
        }
        let stream = ctx.default_stream();
        Ok(Device {
            ctx,
            stream,
            sm_count,
            is_sm90: (major, minor) == (9, 0),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            attention_ws: Mutex::new(None),
        })
    }

    pub(super) fn name(&self) -> Result<String, KernelError> {
        self.ctx.name().map_err(cuda_err("reading the device name"))
    }

    fn function(&self, module: Module, name: &'static str) -> Result<CudaFunction, KernelError> {
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(name) {
            return Ok(f.clone());
        }
        let m = {
            let mut modules = self.modules.lock().map_err(|_| poisoned())?;
            match modules.get(&module) {
                Some(m) => m.clone(),
                None => {
                    let image = match (self.is_sm90, module.ptx()) {
                        (true, _) => Ptx::from_binary(module.cubin_sm90().to_vec()),
                        (false, Some(ptx)) => Ptx::from_src(ptx),
                        (false, None) => {
                            return Err(KernelError::Cuda(format!(
                                "{name} is built for sm_90a (wgmma) only, which runs on compute capability 9.0 \
                                 exactly; this device is another"
                            )))
                        }
                    };
                    let m = self
                        .ctx
                        .load_module(image)
                        .map_err(cuda_err("loading the embedded kernels"))?;
                    modules.insert(module, m.clone());
                    m
                }
            }
        };
        let f = m.load_function(name).map_err(cuda_err(name))?;
        self.functions
            .lock()
            .map_err(|_| poisoned())?
            .insert(name, f.clone());
        Ok(f)
    }

    pub(super) fn upload<T: GpuScalar>(&self, host: &[T]) -> Result<CudaSlice<T>, KernelError> {
        self.stream.clone_htod(host).map_err(cuda_err("upload"))
    }

    pub(super) fn zeros<T: GpuScalar>(&self, len: usize) -> Result<CudaSlice<T>, KernelError> {
        self.stream.alloc_zeros(len).map_err(cuda_err("alloc"))
    }

    pub(super) fn write<T: GpuScalar>(
        &self,
        dst: &mut CudaSlice<T>,
        host: &[T],
    ) -> Result<(), KernelError> {
        self.stream
            .memcpy_htod(host, dst)
            .map_err(cuda_err("write"))
    }

    pub(super) fn download<T: GpuScalar>(&self, src: &CudaSlice<T>) -> Result<Vec<T>, KernelError> {
        self.stream.clone_dtoh(src).map_err(cuda_err("download"))
    }

    pub(super) fn synchronize(&self) -> Result<(), KernelError> {
        self.stream.synchronize().map_err(cuda_err("synchronize"))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn fp8_block_gemv(
        &self,
        tensor: bool,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        if tensor {
            let name = if m <= 8 {
                "fp8_block_gemv_mma_n8"
            } else {
                "fp8_block_gemv_mma_n16"
            };
            let f = self.function(Module::Gemv, name)?;
            let (mi, ni, ki) = (m as i32, n as i32, k as i32);
            let mut b = self.stream.launch_builder(&f);
            b.arg(x)
                .arg(w)
                .arg(scales)
                .arg(y)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki);
            // SAFETY: matches `fp8_block_gemv_mma_n*` in cuda/gemv.cu; the caller checked the buffers as for the
            // CUDA-core kernel below; each block reads 16 rows (guarded against n) in 16-byte loads guarded
            // against k, which k % 16 == 0 keeps inside the row.
            unsafe { b.launch(mma_config(n)) }.map_err(cuda_err(name))?;
            return Ok(());
        }
        // M = 1 uses two rows per warp and two 16-byte loads in flight per row: the best of the design sweep in
        // kernels/bench/h200 (3.54 TB/s on 5120x17408, 1.13x the one-row, four-load kernel, H200 2026-11-30).
        let (name, rows_per_warp) = match m {
            1 => ("fp8_block_gemv_m1_r2_u2", 2),
            2 => ("fp8_block_gemv_m2", 1),
            3..=4 => ("fp8_block_gemv_m4", 1),
            5..=8 => ("fp8_block_gemv_m8", 1),
            _ => ("fp8_block_gemv_m16", 1),
        };
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = gemv_config(n, rows_per_warp);
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(w)
            .arg(scales)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: the argument list matches `fp8_block_gemv_m*` in cuda/gemv.cu (three input pointers, one output,
        // three ints) and the caller checked x = [m, k], w = [n, k], scales = [ceil(n/128), ceil(k/128)],
        // y = [m, n], k % 16 == 0, so every thread's 16-byte loads stay inside its row; cudarc allocations are
        // 256-byte aligned.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn nvfp4_gemv(
        &self,
        tensor: bool,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        if tensor {
            let name = if m <= 8 {
                "nvfp4_gemv_mma_n8"
            } else {
                "nvfp4_gemv_mma_n16"
            };
            let f = self.function(Module::Gemv, name)?;
            let (mi, ni, ki) = (m as i32, n as i32, k as i32);
            let mut b = self.stream.launch_builder(&f);
            b.arg(x)
                .arg(w)
                .arg(scales)
                .arg(&global_scale)
                .arg(y)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki);
            // SAFETY: matches `nvfp4_gemv_mma_n*` in cuda/gemv.cu; buffers checked by the caller as for the
            // CUDA-core kernel below; rows are guarded against n and k % 32 == 0 keeps every lane's 16-byte load
            // and 2-byte scale load inside its row.
            unsafe { b.launch(mma_config(n)) }.map_err(cuda_err(name))?;
            return Ok(());
        }
        // M = 1 on tall matrices uses two rows per warp so the activations cross L1 once per two weight rows
        // (with one row per warp L1 was 88% busy in Nsight Compute and DRAM 34%); on short ones (n < 16384) that
        // leaves too few warps, and one row per warp is faster. Design sweep on the H200, 2026-11-30: 17408x5120
        // 25.1 us (r2) vs 27.9 (r1); 248320x5120 301 vs 358; 5120x17408 37.1 vs 32.1; 5120x10240 22.8 vs 21.7.
        let (name, rows_per_warp) = match m {
            1 if n >= 16384 => ("nvfp4_gemv_m1_r2_u4", 2),
            1 => ("nvfp4_gemv_m1", 1),
            2 => ("nvfp4_gemv_m2", 1),
            3..=4 => ("nvfp4_gemv_m4", 1),
            5..=8 => ("nvfp4_gemv_m8", 1),
            _ => ("nvfp4_gemv_m16", 1),
        };
        let f = self.function(Module::Gemv, name)?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = gemv_config(n, rows_per_warp);
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(w)
            .arg(scales)
            .arg(&global_scale)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `nvfp4_gemv_m*` in cuda/gemv.cu; the caller checked x = [m, k], w = [n, k/2],
        // scales = [n, k/16], y = [m, n] and k % 32 == 0, so each lane's 16-byte weight load and 2-byte scale load
        // stay inside the row.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn gdn_decode_step(
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

    /// Splits that fill exactly one wave of `per_sm` resident blocks per multiprocessor (CUDA cores: four, by
    /// their 48 KiB of pipeline stages; tensor cores: five, by 41 KiB of shared memory and 96 registers at
    /// head_dim 256), with at least 64 tokens (four pipeline stages) per split. A second, partial wave cost an
    /// earlier tensor-core version 1.35x at 32k context.
    fn auto_splits(&self, d: &PagedAttentionDims, per_sm: usize) -> usize {
        let blocks = d.seqs * d.kv_heads;
        let want = (per_sm * self.sm_count).div_ceil(blocks.max(1));
        let most = (d.max_pages_per_seq * d.page_size).div_ceil(64);
        want.min(most).clamp(1, 1024)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_decode_paged(
        &self,
        tensor: bool,
        d: &PagedAttentionDims,
        q: &CudaSlice<f32>,
        k_cache: &CudaSlice<u16>,
        v_cache: &CudaSlice<u16>,
        block_table: &CudaSlice<u32>,
        seq_lens: &CudaSlice<u32>,
        scale: f32,
        splits: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let splits = if splits == 0 {
            self.auto_splits(d, if tensor { 5 } else { 4 })
        } else {
            splits
        };
        let r = d.q_heads / d.kv_heads;
        let split_name = attention_split_name(d.head_dim, r).ok_or_else(|| {
            KernelError::shape(
                "cuda::attention_decode_paged",
                format!("q_heads / kv_heads must be 1, 2, 4, 6 or 8, got {r}"),
            )
        })?;
        let split_name = if tensor {
            match d.head_dim {
                64 => "attention_decode_tc_D64",
                128 => "attention_decode_tc_D128",
                _ => "attention_decode_tc_D256",
            }
        } else {
            split_name
        };
        let f = self.function(Module::Attention, split_name)?;
        let ws_len = d.seqs * d.q_heads * splits * (d.head_dim + 2);
        let mut ws_guard = self.attention_ws.lock().map_err(|_| poisoned())?;
        if ws_guard.as_ref().is_none_or(|w| w.len() < ws_len) {
            *ws_guard = Some(
                self.stream
                    .alloc_zeros::<f32>(ws_len.max(1))
                    .map_err(cuda_err("attention workspace"))?,
            );
        }
        let Some(ws) = ws_guard.as_mut() else {
            return Err(KernelError::Cuda(
                "attention workspace was not allocated".into(),
            ));
        };
        let (hq, hkv, ps, np, mp) = (
            d.q_heads as i32,
            d.kv_heads as i32,
            d.page_size as i32,
            d.num_pages as i32,
            d.max_pages_per_seq as i32,
        );
        // CUDA cores: one warp per two query heads (per head when the group size is odd), as cuda/attention.cu's
        // AttGeom; tensor cores: four warps, each a quarter of the head dim.
        let warps = if tensor {
            4
        } else if r.is_multiple_of(2) {
            r / 2
        } else {
            r
        };
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, d.kv_heads as u32, d.seqs as u32),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(block_table)
            .arg(seq_lens)
            .arg(&scale)
            .arg(&mut *out)
            .arg(&mut *ws);
        b.arg(&hq).arg(&hkv).arg(&ps).arg(&np).arg(&mp);
        // SAFETY: matches `attention_decode_split_D*_R*` and `attention_decode_tc_D*` in cuda/attention.cu; the caller checked every buffer
        // against dims; the kernel clamps each length to max_pages * page_size and skips page ids >= num_pages, so
        // device-side table contents cannot send it outside the cache; the workspace holds
        // seqs * q_heads * splits * (head_dim + 2) floats.
        unsafe { b.launch(cfg) }.map_err(cuda_err(split_name))?;
        if splits > 1 {
            let combine = match d.head_dim {
                64 => "attention_decode_combine_D64",
                128 => "attention_decode_combine_D128",
                _ => "attention_decode_combine_D256",
            };
            let f = self.function(Module::Attention, combine)?;
            let s = splits as i32;
            let cfg = LaunchConfig {
                grid_dim: (d.q_heads as u32, d.seqs as u32, 1),
                // head_dim x 4 threads: the 4 rows split the splits (cuda/attention.cu, COMB_Y).
                block_dim: (d.head_dim as u32, 4, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&f);
            b.arg(&*ws).arg(out).arg(&hq).arg(&s);
            // SAFETY: matches `attention_decode_combine_D*`; the split kernel queued before it on the same stream
            // filled seqs * q_heads * splits partials of head_dim + 2 floats, and out is [seqs, q_heads, head_dim].
            unsafe { b.launch(cfg) }.map_err(cuda_err(combine))?;
        }
        Ok(())
    }
}

impl Device {
    /// `fp8_quantize_act` in cuda/gemm.cu: one warp per (token, 128 of K).
    pub(super) fn fp8_quantize_activations(
        &self,
        x: &CudaSlice<u16>,
        xq: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        m: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "fp8_quantize_act";
        let f = self.function(Module::Gemm, NAME)?;
        let (mi, ki) = (m as i32, k as i32);
        let cfg = LaunchConfig {
            // 8 tokens (one per warp) x one 128-wide K block per block.
            grid_dim: (m.div_ceil(8) as u32, k.div_ceil(128) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(xq).arg(scales).arg(&mi).arg(&ki);
        // SAFETY: matches `fp8_quantize_act` in cuda/gemm.cu; the caller checked x = [m, k], xq = [m, k],
        // scales = [m, ceil(k/128)] and k % 16 == 0, so each lane's 8-byte load and 4-byte store of 4 values stay
        // inside its row (warps past m return before touching memory); grid.y = ceil(k/128) <= 65535 was checked.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }

    /// `fp8_block_gemm_128x128` in cuda/gemm.cu: one 128x128 output tile per block of 8 warps.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fp8_block_gemm(
        &self,
        xq: &CudaSlice<u8>,
        x_scales: &CudaSlice<f32>,
        w: &CudaSlice<u8>,
        w_scales: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "fp8_block_gemm_128x128";
        let f = self.function(Module::Gemm, NAME)?;
        // 4 stages of (two 16 KiB tiles + 128 scales): over the 48 KiB a launch gets without asking.
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            GEMM_SMEM_BYTES as i32,
        )
        .map_err(cuda_err("fp8_block_gemm shared memory size"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(128) as u32, n.div_ceil(128) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: GEMM_SMEM_BYTES,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(xq)
            .arg(x_scales)
            .arg(w)
            .arg(w_scales)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `fp8_block_gemm_128x128` in cuda/gemm.cu (GM_SMEM_BYTES there is GEMM_SMEM_BYTES here,
        // a static_assert keeps them equal); the caller checked xq = [m, k], x_scales = [m, ceil(k/128)],
        // w = [n, k], w_scales = [ceil(n/128), ceil(k/128)], y = [m, n], k % 16 == 0 (every 16-byte copy is wholly
        // inside a row or skipped) and ceil(n/128) <= 65535; rows past m or n and chunks past k are zero-filled
        // without reading, and the epilogue guards every store against m and n.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }
}

impl Device {
    /// `nvfp4_gemm_128x256` in cuda/gemm.cu: one 128x256 output tile per block of 8 warps.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nvfp4_gemm(
        &self,
        x: &CudaSlice<u16>,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), KernelError> {
        const NAME: &str = "nvfp4_gemm_128x256";
        let f = self.function(Module::Gemm, NAME)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            NVFP4_GEMM_SMEM_BYTES as i32,
        )
        .map_err(cuda_err("nvfp4_gemm shared memory size"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(128) as u32, n.div_ceil(256) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: NVFP4_GEMM_SMEM_BYTES,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(w)
            .arg(scales)
            .arg(&global_scale)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki);
        // SAFETY: matches `nvfp4_gemm_128x256` in cuda/gemm.cu (NG_SMEM_BYTES there is NVFP4_GEMM_SMEM_BYTES
        // here, kept equal by a static_assert); the caller checked x = [m, k], w = [n, k/2], scales = [n, k/16],
        // y = [m, n], k % 64 == 0 (every 16-byte copy of x and w and 4-byte copy of scales is whole and aligned)
        // and ceil(n/256) <= 65535; rows past m or n are zero-filled without reading and every store is guarded.
        unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        Ok(())
    }
}

/// Dynamic shared memory of `nvfp4_gemm_128x256` (cuda/gemm.cu `NG_SMEM_BYTES`).
const NVFP4_GEMM_SMEM_BYTES: u32 = 118_784;

/// Dynamic shared memory of `fp8_block_gemm_128x128` (cuda/gemm.cu `GM_SMEM_BYTES`).
const GEMM_SMEM_BYTES: u32 = 133_120;

fn attention_split_name(head_dim: usize, r: usize) -> Option<&'static str> {
    Some(match (head_dim, r) {
        (64, 1) => "attention_decode_split_D64_R1",
        (64, 2) => "attention_decode_split_D64_R2",
        (64, 4) => "attention_decode_split_D64_R4",
        (64, 6) => "attention_decode_split_D64_R6",
        (64, 8) => "attention_decode_split_D64_R8",
        (128, 1) => "attention_decode_split_D128_R1",
        (128, 2) => "attention_decode_split_D128_R2",
        (128, 4) => "attention_decode_split_D128_R4",
        (128, 6) => "attention_decode_split_D128_R6",
        (128, 8) => "attention_decode_split_D128_R8",
        (256, 1) => "attention_decode_split_D256_R1",
        (256, 2) => "attention_decode_split_D256_R2",
        (256, 4) => "attention_decode_split_D256_R4",
        (256, 6) => "attention_decode_split_D256_R6",
        (256, 8) => "attention_decode_split_D256_R8",
        _ => return None,
    })
}

fn gemv_config(n: usize, rows_per_warp: usize) -> LaunchConfig {
    // 8 warps per block, `rows_per_warp` output rows per warp (cuda/gemv.cu).
    LaunchConfig {
        grid_dim: (n.div_ceil(8 * rows_per_warp) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn mma_config(n: usize) -> LaunchConfig {
    // One 16-row tile of W per block, 8 warps sharing its K chunks (cuda/gemv.cu, blockq_gemv_mma).
    LaunchConfig {
        grid_dim: (n.div_ceil(16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn poisoned() -> KernelError {
    KernelError::Cuda("a previous kernel call panicked while holding the module cache".into())
}
