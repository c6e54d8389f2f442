//! The `cuda` build of [`super::Gpu`]: cudarc (driver API, loaded dynamically) over the PTX that `build.rs`
//! embedded. This file owns the context, the stream, the lazily loaded modules and the launch helpers; each op
//! family's `cuda/<family>.rs` checks its sizes and launches through them in the same function, so an op's
//! argument list is written once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchArgs, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::GpuScalar;
use crate::KernelError;

// The generated `Module` enum: one variant per `cuda/*.cu`, with its embedded images and entry points.
mod modules {
    include!(concat!(env!("OUT_DIR"), "/cuda_modules.rs"));
}
pub(in crate::cuda) use modules::Module;

/// A driver error of `op`, running out of memory kept apart ([`KernelError::OutOfMemory`]).
pub(super) fn cuda_err(op: &str) -> impl Fn(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| {
        let what = format!("{op}: {e:?}");
        match e.0 {
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                KernelError::OutOfMemory(what)
            }
            _ => KernelError::Cuda(what),
        }
    }
}

pub(super) struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm_count: usize,
    /// Compute capability 9.0 exactly: load the embedded sm_90 cubins instead of JIT-compiling the PTX.
    is_sm90: bool,
    modules: Mutex<HashMap<Module, Arc<CudaModule>>>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    /// Split-K partials of the attention decode, grown on demand and reused across calls (`cuda/attention.rs`).
    pub(super) attention_ws: Mutex<Option<CudaSlice<f32>>>,
    /// Whether [`Device::launch_small`] launches as a programmatic dependent (on unless `EDGEFIT_SMALL_PDL=0`, see
    /// there).
    small_pdl: bool,
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
        // A stream of our own, not the legacy default stream: only such a stream can be captured into a CUDA graph
        // (an engine replays its decode step as one). Everything runs on this one stream, so cudarc's per-buffer
        // events, which order uses across streams, are never needed.
        // SAFETY: no buffer is ever used on a second stream (this device has one), the only case the events
        // order; it is called before any buffer of the context exists.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda_err("creating the stream"))?;
        Ok(Device {
            ctx,
            stream,
            sm_count,
            is_sm90: (major, minor) == (9, 0),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            attention_ws: Mutex::new(None),
            small_pdl: std::env::var("EDGEFIT_SMALL_PDL").map_or(true, |v| v != "0"),
        })
    }

    /// The context, for what lives beside the compute stream (a copy stream, pinned host memory, events).
    pub(super) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every kernel runs on.
    pub(super) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(super) fn name(&self) -> Result<String, KernelError> {
        self.ctx.name().map_err(cuda_err("reading the device name"))
    }

    /// Multiprocessors of the device.
    pub(super) fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Whether the sm_90a module can load here (compute capability 9.0 exactly): the public GEMMs of
    /// `cuda/gemm.rs` take their wgmma paths only then.
    pub(super) fn has_wgmma(&self) -> bool {
        self.is_sm90
    }

    /// The kernel `name` of `module`, loading the module on first use.
    pub(super) fn function(
        &self,
        module: Module,
        name: &'static str,
    ) -> Result<CudaFunction, KernelError> {
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
        // The generated list says whether this build has the kernel (a variant left out of a build without `lab`
        // shows up here with its name rather than as the driver's CUDA_ERROR_NOT_FOUND).
        if module.entries().binary_search(&name).is_err() {
            return Err(KernelError::Cuda(format!(
                "{name} is not in the embedded cuda/{}.cu of this build (variants need the `lab` feature)",
                module.stem()
            )));
        }
        let f = m.load_function(name).map_err(cuda_err(name))?;
        self.functions
            .lock()
            .map_err(|_| poisoned())?
            .insert(name, f.clone());
        Ok(f)
    }

    /// [`Device::function`] with `smem` bytes of dynamic shared memory allowed (over the 48 KiB a launch gets
    /// without asking), for the kernels whose tiles need more.
    pub(super) fn function_with_smem(
        &self,
        module: Module,
        name: &'static str,
        smem: u32,
    ) -> Result<CudaFunction, KernelError> {
        let f = self.function(module, name)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(cuda_err(name))?;
        Ok(f)
    }

    /// Launches `f` on the device's stream with programmatic dependent launch (PDL: the
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` attribute): its blocks may become resident while the
    /// kernel before it is still running, once every block of that kernel has executed
    /// `griddepcontrol.launch_dependents` (`pdl_launch_dependents` in cuda/common.cuh), and they wait in
    /// `griddepcontrol.wait` (`pdl_wait`) until it has finished and its writes are visible. A predecessor that
    /// never triggers is waited for as without the attribute; a kernel launched normally runs its `pdl_*` calls as
    /// no-ops. What it buys on the H200 (benchmarks/h200.md): the decode attention combine 39.2 vs 39.7 us
    /// at 32k, the NVFP4 tile GEMV 3-8% per call. cudarc's launch builder sets no attributes, hence the raw call.
    ///
    /// # Safety
    /// As `LaunchArgs::launch`: `args` holds the kernel's parameters in order with the kernel's types (device
    /// addresses from `device_ptr` of buffers that outlive the queued kernel, scalars); the kernel must not read
    /// anything an earlier kernel writes, nor write anything, before its `pdl_wait`.
    pub(super) unsafe fn launch_pdl(
        &self,
        name: &str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut PdlArgs,
    ) -> Result<(), KernelError> {
        // SAFETY: the caller's contract above.
        unsafe { self.launch_ex(name, f, cfg, args, true) }
    }

    /// A small kernel of the decode step (norms, casts, gates, activations, RoPE, copies, the slot attention, the
    /// DeltaNet step, the dense GEMVs): as a programmatic dependent ([`Device::launch_pdl`]; each such kernel starts
    /// with `pdl_start()`, cuda/common.cuh), so that its launch overlaps the tail of the kernel before it
    /// (`EDGEFIT_SMALL_PDL=0` launches plainly, the baseline arm). `pdl_start` must only wait: while it also
    /// triggered its dependents at once, the FP8 / NVFP4 tile path's decode went wrong on an H100 (a chain of such
    /// kernels got resident beside a tile GEMV several launches back); with the wait alone every GPU test passes
    /// with it on and off, and batch-1 FP8 decode gains about 2% (benchmarks/engine-h200.md).
    ///
    /// # Safety
    /// As [`Device::launch_pdl`].
    pub(super) unsafe fn launch_small(
        &self,
        name: &str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut PdlArgs,
    ) -> Result<(), KernelError> {
        // SAFETY: the caller's contract above.
        unsafe { self.launch_ex(name, f, cfg, args, self.small_pdl) }
    }

    /// [`Device::launch_pdl`] when `pdl`, else the same parameters launched plainly (for paths whose choice between
    /// the two is a measured table).
    ///
    /// # Safety
    /// As [`Device::launch_pdl`].
    pub(super) unsafe fn launch_ex(
        &self,
        name: &str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut PdlArgs,
        pdl: bool,
    ) -> Result<(), KernelError> {
        use cudarc::driver::sys;
        if args.len > PDL_MAX_ARGS {
            return Err(KernelError::Cuda(format!(
                "{name}: {} kernel parameters, the launch takes at most {PDL_MAX_ARGS}",
                args.len
            )));
        }
        // On the stack: this runs once per decode kernel, no allocation on that path.
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); PDL_MAX_ARGS];
        for (p, v) in params.iter_mut().zip(args.slots.iter_mut()) {
            *p = v as *mut u64 as *mut std::ffi::c_void;
        }
        self.ctx.bind_to_thread().map_err(cuda_err(name))?;
        // SAFETY: a plain C struct (id, padding, a union of plain values); all-zero is a valid value of each.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(pdl),
        };
        // SAFETY: config, attr and the parameter slots live across the call (the driver copies the values); f
        // belongs to a module this device keeps loaded; the parameters' types are the caller's contract above.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(cuda_err(name))
    }

    /// Queues `f` (the kernel `name`) on the stream through cudarc's launch builder, `push` adding the kernel's
    /// parameters in order (the builder keeps each buffer's use ordered on the stream); an error names the kernel.
    ///
    /// # Safety
    /// As `LaunchArgs::launch`: `push` adds exactly the kernel's parameters, in order, with the kernel's types, and
    /// `cfg` and the buffers' lengths are what the kernel's indexing relies on.
    pub(in crate::cuda) unsafe fn launch_args<'a>(
        &'a self,
        name: &str,
        f: &'a CudaFunction,
        cfg: LaunchConfig,
        push: impl FnOnce(&mut LaunchArgs<'a>),
    ) -> Result<(), KernelError> {
        let mut b = self.stream.launch_builder(f);
        push(&mut b);
        // SAFETY: the caller's contract above.
        unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        Ok(())
    }

    /// Launches a kernel whose parameters are `(x, w, scales, global_scale, y, m, n, k)` as 32-bit sizes: the NVFP4
    /// GEMVs and GEMMs over the checkpoint layout (`x` the bf16 activations, their f16 fragments or a tensor map
    /// of them; `w` `[n, k/2]` bytes, `scales` e4m3 `[n, k/16]`, `y` fp32 `[m, n]`).
    ///
    /// # Safety
    /// As [`Device::launch_args`] for that parameter list: the caller checked the lengths and the alignment the
    /// kernel `name` needs for these sizes, and `cfg` is its grid.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) unsafe fn launch_nvfp4<X>(
        &self,
        name: &str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        x: &X,
        w: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        global_scale: f32,
        y: &mut CudaSlice<f32>,
        [m, n, k]: [usize; 3],
    ) -> Result<(), KernelError>
    where
        X: ActivationArg,
    {
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        // SAFETY: the caller's contract above; the scalars live on this frame until the launch is queued.
        unsafe {
            self.launch_args(name, f, cfg, |b| {
                x.push_to(b);
                b.arg(w)
                    .arg(scales)
                    .arg(&global_scale)
                    .arg(y)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki);
            })
        }
    }

    /// Launches a kernel whose parameters are `(xq, x_scales, w, w_scales, y, m, n, k)` as 32-bit sizes: the FP8
    /// block-scaled GEMMs that read both operands from memory (`xq` e4m3 `[m, k]`, `x_scales` fp32
    /// `[m, ceil(k/128)]`, `w` e4m3 `[n, k]`, `w_scales` fp32 `[ceil(n/128), ceil(k/128)]`, `y` fp32 `[m, n]`).
    ///
    /// # Safety
    /// As [`Device::launch_nvfp4`], for this parameter list.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) unsafe fn launch_fp8_gemm(
        &self,
        name: &str,
        f: &CudaFunction,
        cfg: LaunchConfig,
        (xq, x_scales): (&CudaSlice<u8>, &CudaSlice<f32>),
        (w, w_scales): (&CudaSlice<u8>, &CudaSlice<f32>),
        y: &mut CudaSlice<f32>,
        [m, n, k]: [usize; 3],
    ) -> Result<(), KernelError> {
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        // SAFETY: the caller's contract above; the scalars live on this frame until the launch is queued.
        unsafe {
            self.launch_args(name, f, cfg, |b| {
                b.arg(xq)
                    .arg(x_scales)
                    .arg(w)
                    .arg(w_scales)
                    .arg(y)
                    .arg(&mi)
                    .arg(&ni)
                    .arg(&ki);
            })
        }
    }

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

    pub(super) fn copy<T: GpuScalar>(
        &self,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
    ) -> Result<(), KernelError> {
        self.stream.memcpy_dtod(src, dst).map_err(cuda_err("copy"))
    }

    pub(super) fn download<T: GpuScalar>(&self, src: &CudaSlice<T>) -> Result<Vec<T>, KernelError> {
        self.stream.clone_dtoh(src).map_err(cuda_err("download"))
    }

    /// Waits for the stream, then hands the memory pool's unused reservations back to the driver.
    pub(super) fn release_unused(&self) -> Result<(), KernelError> {
        let err = cuda_err("release_unused");
        self.stream.synchronize().map_err(&err)?;
        // Without pool support cudarc frees synchronously: nothing stays reserved.
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(&err)?;
        // SAFETY: `cu_device` is the device this context was created on, and its default pool lives as long as
        // the device; cudarc allocates from that pool (cuMemAllocAsync on a pool-capable device), and trimming
        // releases only memory no allocation holds, after the stream's frees have completed (synchronized above).
        unsafe {
            let pool = cudarc::driver::result::device::get_default_mem_pool(self.ctx.cu_device())
                .map_err(&err)?;
            cudarc::driver::result::mem_pool::trim_to(pool, 0).map_err(&err)
        }
    }

    pub(super) fn memory_info(&self) -> Result<(usize, usize), KernelError> {
        self.ctx.bind_to_thread().map_err(cuda_err("memory_info"))?;
        cudarc::driver::result::mem_get_info().map_err(cuda_err("memory_info"))
    }

    pub(super) fn begin_capture(&self) -> Result<(), KernelError> {
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(cuda_err("begin_capture"))
    }

    pub(super) fn end_capture(&self) -> Result<Option<cudarc::driver::CudaGraph>, KernelError> {
        self.stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(cuda_err("end_capture"))
    }

    pub(super) fn synchronize(&self) -> Result<(), KernelError> {
        self.stream.synchronize().map_err(cuda_err("synchronize"))
    }
}

/// The activations parameter of [`Device::launch_nvfp4`]: a device buffer, or a tensor map passed by value.
pub(in crate::cuda) trait ActivationArg {
    /// Pushes `self` as the next kernel parameter.
    fn push_to<'a>(&'a self, b: &mut LaunchArgs<'a>);
}

impl<T> ActivationArg for CudaSlice<T> {
    fn push_to<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(self);
    }
}

/// A launch of `grid` blocks of `block` threads with `smem` bytes of dynamic shared memory (cudarc's struct,
/// built in one line at each launch).
pub(super) fn launch_config(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: smem,
    }
}

/// Most parameters a [`Device::launch_pdl`] kernel takes (the DeltaNet step takes 21).
const PDL_MAX_ARGS: usize = 24;

/// The parameters of one [`Device::launch_pdl`], in order, each in its own 8-byte slot holding the value's bytes
/// at its start (the driver reads each parameter's size from there). Fixed-size, so building one allocates
/// nothing; `len` counts every push, so one past the capacity makes the launch fail instead of dropping it.
#[derive(Default)]
pub(super) struct PdlArgs {
    slots: [u64; PDL_MAX_ARGS],
    len: usize,
}

impl PdlArgs {
    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let mut slot = [0u8; 8];
        slot[..bytes.len()].copy_from_slice(bytes);
        if let Some(s) = self.slots.get_mut(self.len) {
            *s = u64::from_ne_bytes(slot);
        }
        self.len += 1;
        self
    }
    /// A device address (`CudaSlice::device_ptr`).
    pub(super) fn ptr(&mut self, p: cudarc::driver::sys::CUdeviceptr) -> &mut Self {
        self.push(&p.to_ne_bytes())
    }
    pub(super) fn i32(&mut self, v: i32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }
    pub(super) fn f32(&mut self, v: f32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }
    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }
    pub(super) fn f64(&mut self, v: f64) -> &mut Self {
        self.push(&v.to_ne_bytes())
    }
}

pub(super) fn poisoned() -> KernelError {
    KernelError::Cuda("a previous kernel call panicked while holding the module cache".into())
}

/// For the launch-constant tests of the `cuda/*.rs` files: the integer after `<key><sep>` in a kernel or bench
/// source (`sep` " == " for a static_assert's literal, " = " for a Python constant). Each family's launch code
/// restates sizes its kernel file pins with static_asserts, and the H200 benches restate them again; nothing at build time
/// ties those copies together, and a size changed in one place only is a launch asking for the wrong shared
/// memory. The tests run on CI, where no GPU runs the kernels.
#[cfg(test)]
pub(super) fn source_literal(text: &str, key: &str, sep: &str) -> u64 {
    let pat = format!("{key}{sep}");
    let at = text
        .find(&pat)
        .unwrap_or_else(|| panic!("`{pat}` not found"));
    let digits: String = text[at + pat.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no integer after `{pat}`"))
}

/// For the `every_*_kernel_is_embedded` tests: every kernel of `launched` (the names the launch code forms) is in
/// this build's `module`, and in a build without `lab`, which leaves the variants out, nothing else is.
#[cfg(test)]
pub(super) fn assert_embedded(module: Module, launched: impl IntoIterator<Item = &'static str>) {
    let entries = module.entries();
    let launched: std::collections::BTreeSet<&str> = launched.into_iter().collect();
    for k in &launched {
        assert!(
            entries.contains(k),
            "{k} is not embedded in cuda/{}.cu",
            module.stem()
        );
    }
    #[cfg(not(feature = "lab"))]
    assert_eq!(entries, launched.into_iter().collect::<Vec<_>>());
}

#[cfg(test)]
mod tests {
    use super::{source_literal, PdlArgs, PDL_MAX_ARGS};

    /// The launch constants of the families whose kernel files pin them with one literal each, in one table:
    /// (kernel source, the text before the literal, its separator, the Rust side's value).
    #[test]
    fn launch_constants_match_the_kernel_sources() {
        use crate::cuda::{attention_slots as slots, dense, moe, Gpu};
        const SLOTS: &str = include_str!("../../cuda/attention_slots.cu");
        const DENSE: &str = include_str!("../../cuda/dense.cu");
        const MOE: &str = include_str!("../../cuda/moe.cu");
        let pins: [(&str, &str, &str, u64); 11] = [
            (
                SLOTS,
                "constexpr int STORE_THREADS",
                " = ",
                slots::STORE_THREADS.into(),
            ),
            (
                SLOTS,
                "constexpr int ATTN_THREADS",
                " = ",
                slots::ATTN_THREADS.into(),
            ),
            (
                SLOTS,
                "ATTN_MAX_HEAD_DIM",
                " == ",
                Gpu::ATTENTION_SLOTS_MAX_HEAD_DIM as u64,
            ),
            (
                DENSE,
                "GEMV_ROWS_PER_BLOCK",
                " == ",
                dense::GEMV_ROWS_PER_BLOCK as u64,
            ),
            (
                DENSE,
                "constexpr int GEMV_THREADS",
                " = ",
                dense::GEMV_THREADS.into(),
            ),
            (
                DENSE,
                "constexpr int SPLITK_THREADS",
                " = ",
                dense::SPLITK_THREADS.into(),
            ),
            (DENSE, "GEMM_BM", " == ", dense::GEMM_TILE as u64),
            (DENSE, "GEMM_THREADS", " = ", dense::GEMM_THREADS.into()),
            (
                DENSE,
                "constexpr int GEMM_SPLITS",
                " = ",
                dense::GEMM_SPLITS as u64,
            ),
            (
                MOE,
                "constexpr int MOE_THREADS",
                " = ",
                moe::MOE_THREADS.into(),
            ),
            (MOE, "MOE_MAX_EXPERTS", " == ", Gpu::MOE_MAX_EXPERTS as u64),
        ];
        for (src, key, sep, want) in pins {
            assert_eq!(source_literal(src, key, sep), want, "`{key}`");
        }
    }

    /// Each parameter sits at the start of its own slot with the value's native bytes, as the driver reads it;
    /// pushes past the capacity are counted, not stored, so `launch_pdl` can refuse them.
    #[test]
    fn pdl_args_keep_each_value_at_its_slot_start() {
        let mut a = PdlArgs::default();
        a.ptr(0x1122_3344_5566_7788).i32(-2).f32(1.5).u64(u64::MAX);
        assert_eq!(a.len, 4);
        assert_eq!(a.slots[0], 0x1122_3344_5566_7788);
        assert_eq!(a.slots[1].to_ne_bytes()[..4], (-2i32).to_ne_bytes());
        assert_eq!(a.slots[1].to_ne_bytes()[4..], [0u8; 4]);
        assert_eq!(a.slots[2].to_ne_bytes()[..4], 1.5f32.to_ne_bytes());
        assert_eq!(a.slots[3], u64::MAX);
        for _ in 0..PDL_MAX_ARGS {
            a.i32(7);
        }
        assert_eq!(a.len, PDL_MAX_ARGS + 4);
        assert_eq!(
            a.slots[PDL_MAX_ARGS - 1].to_ne_bytes()[..4],
            7i32.to_ne_bytes()
        );
    }
}
