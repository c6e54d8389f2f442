//! Launches of `cuda/gdn_prefill.cu`: the chunked gated DeltaNet prefill for a batch of sequences (four kernels on
//! the device's stream: prep, WY, the state walk, the gated norm; the kernel file's header explains each).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{cuda_err, Device, Module, PdlArgs};
use crate::cuda::gdn_prefill::{GdnMeta, GdnPrefillLayout, GdnPrefillVariant, StateMath, WyMath};
use crate::cuda::{GdnGpuInputs, GdnGpuWeights};
use crate::shapes::GdnDims;
use crate::KernelError;

/// Tokens per warp of `gdn_prefill_prep` (`PREP_TT` in cuda/gdn_prefill.cu, kept equal by a static_assert
/// there).
const PREP_TOKENS: usize = 8;

/// Dynamic shared memory of `gdn_prefill_wy` (`WY_SMEM_BYTES` in cuda/gdn_prefill.cu, kept equal by a
/// static_assert there).
const WY_SMEM_BYTES: u32 = 101_376;

/// Dynamic shared memory of `gdn_prefill_wy_tc{1,3}` (`wy_tc_smem_bytes()` in cuda/gdn_prefill.cu, kept equal by a
/// static_assert there).
const WY_TC_SMEM_BYTES: u32 = 102_912;
/// Dynamic shared memory of `gdn_prefill_wy_h_b` (cuda/gdn_prefill.cu `wy_h_smem_bytes()`): K, Q, V f16 tiles
/// (A and then T over Q), T fp32, g and beta.
const WY_H_SMEM_BYTES: u32 = 70_144;

/// Dynamic shared memory of `gdn_prefill_state_cs<CS>` (`state_smem_bytes(CS)` in cuda/gdn_prefill.cu).
fn state_smem_bytes(cs: u32) -> u32 {
    (2 * 64 * 132 + 64 * 65 + 64 * cs + 128 * cs + 64) * 4
}

/// Dynamic shared memory of `gdn_prefill_state_tc*_cs<CS>` (`state_tc_smem_bytes(CS)` in cuda/gdn_prefill.cu):
/// one chunk buffer (two [64][132] tiles and a [64][68] one) per block at 16 and 32 columns, two at 64 (the next
/// chunk streams in while this one is multiplied), plus the state and D tiles.
fn state_tc_smem_bytes(cs: u32) -> u32 {
    let buffers = if cs == 64 { 2 } else { 1 };
    ((2 * 64 * 132 + 64 * 68) * buffers + 128 * (cs + 8) + 64 * (cs + 8)) * 4
}

/// Dynamic shared memory of `gdn_prefill_walk_bf16`, `gdn_prefill_walk1_bf16` and `gdn_prefill_out_bf16`
/// (`walk_bf16_smem_bytes()`, `walk1_bf16_smem_bytes()`, `out_bf16_smem_bytes()` in cuda/gdn_prefill.cu, kept
/// equal by a static_assert there). Either walk block leaves room for one output block on its SM.
const WALK_BF16_SMEM_BYTES: u32 = 125_440;
const WALK1_BF16_SMEM_BYTES: u32 = 137_728;
const OUT_BF16_SMEM_BYTES: u32 = 75_008;

/// Which walk the bf16 split runs for `pairs` (sequence, value head) states on `sms` SMs: the two-block walk
/// (`gdn_prefill_walk_bf16`, 64 state columns per block) while its `2 * pairs` blocks are all resident at once
/// (one per SM), else the one-block walk (`gdn_prefill_walk1_bf16`, all 128 columns per block, ~1.6x the
/// two-block walk's time per chunk for twice its columns). Beyond one wave the two-block walk's last blocks start
/// late, and the output launch (its programmatic dependent) can start only once every walk block has. H200,
/// On the H200, the whole f16 split step with this rule's walk against the other: T = 4096 (48 pairs) 412.3 us
/// two-block against 426.1 one-block; B = 4 x 9216 (192 pairs) 902.0 one-block against 929.7 two-block (fla
/// 413.6 / 916.5), B = 2 x 4096 (96 pairs, an earlier and slower one-block walk): 816.1 against 814.6.
fn walk_one_block(pairs: usize, sms: usize) -> bool {
    2 * pairs > sms
}

/// `floats` floats of the workspace from float `at`, as the kernels' bf16 (u16 here: the same bits; cudarc has no
/// bf16 device type without its half feature): `2 * floats` elements. An empty region gives an empty view.
fn bf16_view(
    workspace: &CudaSlice<f32>,
    at: usize,
    floats: usize,
) -> Result<cudarc::driver::CudaView<'_, u16>, KernelError> {
    let v = workspace
        .try_slice(at..at + floats)
        .ok_or_else(|| KernelError::shape("cuda::gdn_prefill", "workspace region out of range"))?;
    // SAFETY: `floats` f32 are 2 * floats 2-byte elements of the same allocation; f32's alignment covers u16's.
    unsafe { v.transmute::<u16>(2 * floats) }
        .ok_or_else(|| KernelError::shape("cuda::gdn_prefill", "workspace region too small"))
}

/// The split's bf16 copies of q and k: the qkb region's two halves ([N, Hk, 128] bf16 each, q then k).
type Bf16View<'a> = cudarc::driver::CudaView<'a, u16>;
fn qk_bf16_views<'a>(
    workspace: &'a CudaSlice<f32>,
    lay: &GdnPrefillLayout,
) -> Result<(Bf16View<'a>, Bf16View<'a>), KernelError> {
    let half = lay.qkb_len / 2;
    Ok((
        bf16_view(workspace, lay.qkb, half)?,
        bf16_view(workspace, lay.qkb + half, half)?,
    ))
}

/// Asks for the whole 228 KiB shared-memory carveout (two blocks of ~100-115 KiB per SM need it).
fn max_carveout(f: &cudarc::driver::CudaFunction, name: &str) -> Result<(), KernelError> {
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        100,
    )
    .map_err(cuda_err(name))
}

fn set_smem(f: &cudarc::driver::CudaFunction, bytes: u32, name: &str) -> Result<(), KernelError> {
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(cuda_err(name))
}

impl Device {
    /// Queues the four prefill kernels. `meta` is either the host table `cu_seqlens[seqs+1]` followed by the chunk
    /// offsets `[seqs+1]` (built and checked by the caller; uploaded here), or the caller's device `cu_seqlens`,
    /// from which `gdn_prefill_meta` builds the clamped table in the workspace's meta region first. `lay` is the
    /// workspace split.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cuda) fn gdn_prefill(
        &self,
        variant: GdnPrefillVariant,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        meta: GdnMeta<'_>,
        lay: &GdnPrefillLayout,
        conv_in: &CudaSlice<f32>,
        conv_out: &mut CudaSlice<f32>,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        workspace: &mut CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let seqs = lay.seqs;
        let (seqs_i, nc_i) = (seqs as i32, lay.chunks as i32);
        let mut uploaded: Option<CudaSlice<i32>> = None;
        let meta_dev = match meta {
            GdnMeta::Host(table) => {
                let up: &CudaSlice<i32> = uploaded.insert(
                    self.stream
                        .clone_htod(table)
                        .map_err(cuda_err("gdn_prefill: uploading cu_seqlens"))?,
                );
                up.as_view()
            }
            GdnMeta::Device(cu) => {
                const NAME: &str = "gdn_prefill_meta";
                let f = self.function(Module::GdnPrefill, NAME)?;
                let (total_i, max_len_i) = (lay.tokens as i32, lay.max_len as i32);
                {
                    let mut table = workspace.slice_mut(lay.meta..lay.meta + lay.meta_len);
                    let cfg = LaunchConfig {
                        grid_dim: (1, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    let mut b = self.stream.launch_builder(&f);
                    b.arg(&cu.slice).arg(&mut table);
                    b.arg(&seqs_i).arg(&total_i).arg(&max_len_i);
                    // SAFETY: matches `gdn_prefill_meta`; cu = [seqs + 1] u32 (checked by the caller), the table
                    // view is the workspace's meta region of 2 * (seqs + 1) floats, written as int32 bits.
                    unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
                }
                let table = workspace.slice(lay.meta..lay.meta + lay.meta_len);
                // SAFETY: the region holds 2 * (seqs + 1) 4-byte elements that `gdn_prefill_meta` wrote as int32
                // (queued before every reader on this stream); f32 and i32 have the same size and alignment.
                unsafe { table.transmute::<i32>(lay.meta_len) }.ok_or_else(|| {
                    KernelError::shape("cuda::gdn_prefill_varlen", "meta region too small")
                })?
            }
        };
        let (hk, hv, kconv) = (
            dims.key_heads as i32,
            dims.value_heads as i32,
            dims.conv_kernel as i32,
        );
        let ws = |off: usize, len: usize| workspace.slice(off..off + len);

        // 1. conv + norms + gates (`gdn_prefill_prep`: a warp per (8 tokens, segment), four segments per block).
        {
            let name = variant.prep_kernel();
            let f = self.function(Module::GdnPrefill, name)?;
            let segs = 2 * dims.key_heads + dims.value_heads;
            let cfg = LaunchConfig {
                grid_dim: (
                    lay.max_len.div_ceil(PREP_TOKENS) as u32,
                    segs.div_ceil(4) as u32,
                    seqs as u32,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let (qn, kn, vv, gg, bb) = (
                ws(lay.qn, lay.qk_len),
                ws(lay.kn, lay.qk_len),
                ws(lay.v, lay.v_len),
                ws(lay.g, lay.gate_len),
                ws(lay.beta, lay.gate_len),
            );
            // The bf16 split's copies of q and k (null pointers for every other variant and where the WY launch
            // writes them: the kernel skips them).
            let null = 0u64;
            let (qb, kb) = qk_bf16_views(workspace, lay)?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&x.qkv.slice).arg(&x.a.slice).arg(&x.b.slice);
            b.arg(&w.conv_weight.slice)
                .arg(&w.a_log.slice)
                .arg(&w.dt_bias.slice);
            b.arg(conv_in).arg(&mut *conv_out).arg(&meta_dev);
            b.arg(&qn).arg(&kn).arg(&vv).arg(&gg).arg(&bb);
            if variant.split() && !variant.wy_writes_qk_bf16() {
                b.arg(&qb).arg(&kb);
            } else {
                b.arg(&null).arg(&null);
            }
            b.arg(&hk).arg(&hv).arg(&kconv);
            // SAFETY: matches `gdn_prefill_prep` / `gdn_prefill_prep_h` (same parameters; `_h` writes qn, kn, v
            // as f16 into the first half of the same regions); the caller checked qkv = [N, conv_dim], a, b = [N, Hv],
            // conv_weight = [conv_dim, K], a_log, dt_bias = [Hv], conv_in/conv_out = [seqs, conv_dim, K-1]
            // (distinct allocations), dk = dv = 128 and meta's offsets (non-decreasing, last = N); the workspace
            // views are disjoint ranges of `workspace` sized by `lay` (qb / kb: [N, Hk, 128] bf16 each in the
            // split's qkb region, or null); kconv is 2..=4 (checked by `layout`).
            // Warps past a sequence's length or the last segment return.
            unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        }
        // 2. chunk-local WY (CUDA cores or tensor cores; same parameters and outputs).
        {
            let name = variant.wy_kernel();
            let f = self.function(Module::GdnPrefill, name)?;
            let smem = match variant.wy {
                WyMath::Fp32 => WY_SMEM_BYTES,
                WyMath::F16 => WY_H_SMEM_BYTES,
                WyMath::Tf32x3 | WyMath::Tf32 => WY_TC_SMEM_BYTES,
            };
            set_smem(&f, smem, name)?;
            if variant.wy != WyMath::Fp32 {
                // Two blocks of 100.5 KiB (68.5 KiB for the f16 build) per SM need more than the default
                // carveout; ask for all of it (cuda/gdn_prefill.cu).
                max_carveout(&f, name)?;
            }
            let cfg = LaunchConfig {
                grid_dim: (lay.max_chunks as u32, dims.value_heads as u32, seqs as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem,
            };
            let (qn, kn, vv, gg, bb) = (
                ws(lay.qn, lay.qk_len),
                ws(lay.kn, lay.qk_len),
                ws(lay.v, lay.v_len),
                ws(lay.g, lay.gate_len),
                ws(lay.beta, lay.gate_len),
            );
            let (gc, wo, uo, ao) = (
                ws(lay.gcum, lay.gate_len),
                ws(lay.w, lay.wu_len),
                ws(lay.u, lay.wu_len),
                ws(lay.aqk, lay.aqk_len),
            );
            // Launched as the prep's programmatic dependent (Device::launch_pdl): every WY build starts with
            // `pdl_wait`, so only its blocks' start overlaps the prep's last blocks. The guards order the raw
            // addresses after pending work on other streams.
            let (qp, _g1) = qn.device_ptr(&self.stream);
            let (kp, _g2) = kn.device_ptr(&self.stream);
            let (vp, _g3) = vv.device_ptr(&self.stream);
            let (gp, _g4) = gg.device_ptr(&self.stream);
            let (bp, _g5) = bb.device_ptr(&self.stream);
            let (mp, _g6) = meta_dev.device_ptr(&self.stream);
            let (cp, _g7) = gc.device_ptr(&self.stream);
            let (wp, _g8) = wo.device_ptr(&self.stream);
            let (up, _g9) = uo.device_ptr(&self.stream);
            let (ap, _g10) = ao.device_ptr(&self.stream);
            let mut args = PdlArgs::default();
            args.ptr(qp).ptr(kp).ptr(vp).ptr(gp).ptr(bp).ptr(mp);
            args.ptr(cp).ptr(wp).ptr(up).ptr(ap);
            args.i32(hk).i32(hv).i32(seqs_i).i32(nc_i);
            // The f16 WY also writes the split's bf16 q / k copies (the qkb region), which its prep skips.
            let qkb = if variant.wy_writes_qk_bf16() {
                Some(qk_bf16_views(workspace, lay)?)
            } else {
                None
            };
            let _qkb_guards = qkb.as_ref().map(|(qb, kb)| {
                let (qbp, g11) = qb.device_ptr(&self.stream);
                let (kbp, g12) = kb.device_ptr(&self.stream);
                args.ptr(qbp).ptr(kbp);
                (g11, g12)
            });
            // SAFETY: matches `gdn_prefill_wy`, `gdn_prefill_wy_tc{1,3}[_b]` and `gdn_prefill_wy_h_b` (same
            // parameters; the `_b` forms write W, U, Aqk as bf16 into the first half of the same regions, `_h_b`
            // reads the f16 qn, kn, v `gdn_prefill_prep_h` wrote there); each reads and writes nothing before its
            // `pdl_wait` (the prep's end), then reads what launch 1 wrote and writes gcum [N, Hv],
            // W, U [Hv, NC, 64, 128] and Aqk [Hv, NC, 64, 64], each block only its own chunk's rows (chunk offsets
            // in meta sum to NC); blocks past a sequence's chunks return. `_h_b` also takes the qkb region's
            // q / k halves ([N, Hk, 128] bf16 each) and writes its chunk's rows of its key head there (one value
            // head per key head).
            unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        }
        // 3. sequential state walk + unnormalised output (the bf16 split: launches 3' and 4' instead of 3 and 4).
        {
            let (name, cs) = (variant.kernel(), variant.cols);
            let smem = match variant.math {
                StateMath::Fp32 => state_smem_bytes(cs),
                StateMath::Tf32x3 | StateMath::Tf32 => state_tc_smem_bytes(cs),
                // (The meta upload, if any, is freed in stream order after these launches, when this returns.)
                StateMath::Bf16 => {
                    return self
                        .gdn_prefill_split(dims, w, x, &meta_dev, lay, state, out, workspace)
                }
            };
            let f = self.function(Module::GdnPrefill, name)?;
            set_smem(&f, smem, name)?;
            if variant.math != StateMath::Fp32 {
                // Two blocks of 113 KiB per SM (16 and 32 columns) or one of 220 KiB (64) need the whole
                // 228 KiB carveout (cuda/gdn_prefill.cu).
                max_carveout(&f, name)?;
            }
            let cfg = LaunchConfig {
                grid_dim: (128 / cs, dims.value_heads as u32, seqs as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem,
            };
            let (qn, kn, gc, wi, ui, ai) = (
                ws(lay.qn, lay.qk_len),
                ws(lay.kn, lay.qk_len),
                ws(lay.gcum, lay.gate_len),
                ws(lay.w, lay.wu_len),
                ws(lay.u, lay.wu_len),
                ws(lay.aqk, lay.aqk_len),
            );
            let mut b = self.stream.launch_builder(&f);
            b.arg(&qn).arg(&kn).arg(&gc).arg(&wi).arg(&ui).arg(&ai);
            b.arg(&meta_dev).arg(&mut *state).arg(&mut *out);
            b.arg(&hk).arg(&hv).arg(&seqs_i).arg(&nc_i);
            // SAFETY: matches `gdn_prefill_state_cs*` and `gdn_prefill_state_tc*_cs*` (same parameters); state =
            // [seqs, Hv, 128, 128] and out = [N, Hv*128] were checked; each block owns `cs` columns of one
            // (sequence, head) state and writes only those columns of that head's output rows of its sequence. A
            // plain launch: it reads what the WY wrote, and the state kernels have no `pdl_wait`.
            unsafe { b.launch(cfg) }.map_err(cuda_err(name))?;
        }
        // 4. gated RMSNorm in place.
        {
            const NAME: &str = "gdn_prefill_gated_norm";
            let f = self.function(Module::GdnPrefill, NAME)?;
            let rows = lay.tokens * dims.value_heads;
            let rows_i = rows as i32;
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(8) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(&f);
            b.arg(&mut *out)
                .arg(&x.z.slice)
                .arg(&w.norm_weight.slice)
                .arg(&w.norm_eps)
                .arg(&rows_i);
            // SAFETY: matches `gdn_prefill_gated_norm`; out and z are [N, Hv*128], norm_weight [128]; warps past
            // `rows` return.
            unsafe { b.launch(cfg) }.map_err(cuda_err(NAME))?;
        }
        // The meta upload must outlive the kernels that read it: dropping a cudarc slice frees it in stream order
        // (cuMemFreeAsync on this stream), after the launches queued above (`meta_dev` borrows it until here).
        let _ = meta_dev;
        drop(uploaded);
        Ok(())
    }

    /// Launches 3' and 4' of the bf16 split (cuda/gdn_prefill.cu): the walk carrying only the state, storing each
    /// chunk's incoming state and D (bf16) in the workspace's `hs` region, then the output parallel over chunks
    /// with the gated norm fused.
    #[allow(clippy::too_many_arguments)]
    fn gdn_prefill_split(
        &self,
        dims: &GdnDims,
        w: &GdnGpuWeights<'_>,
        x: &GdnGpuInputs<'_>,
        meta_dev: &cudarc::driver::CudaView<'_, i32>,
        lay: &GdnPrefillLayout,
        state: &mut CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        workspace: &CudaSlice<f32>,
    ) -> Result<(), KernelError> {
        let (hk, hv) = (dims.key_heads as i32, dims.value_heads as i32);
        let (seqs_i, nc_i) = (lay.seqs as i32, lay.chunks as i32);
        let gc = workspace.slice(lay.gcum..lay.gcum + lay.gate_len);
        // What the `_b` WY wrote: bf16 W, U, Aqk in the first half of each region; q and k in bf16 (prep).
        let wi = bf16_view(workspace, lay.w, lay.wu_len / 2)?;
        let ui = bf16_view(workspace, lay.u, lay.wu_len / 2)?;
        let ai = bf16_view(workspace, lay.aqk, lay.aqk_len / 2)?;
        let (qb, kb) = qk_bf16_views(workspace, lay)?;
        let hs = bf16_view(workspace, lay.hs, lay.hs_len)?;
        // The walk's per-(head, chunk) ready counters (cuda/gdn_prefill.cu `split_ready`): one int per slot in the
        // Aqk region's second half, which the bf16 Aqk leaves free; zeroed by the `_b` WY launch.
        let slots = dims.value_heads * lay.chunks;
        let ready_at = lay.aqk + lay.aqk_len / 2;
        let ready_f = workspace
            .try_slice(ready_at..ready_at + slots)
            .ok_or_else(|| {
                KernelError::shape("cuda::gdn_prefill", "workspace region out of range")
            })?;
        // SAFETY: `slots` f32 of the same allocation read as i32 (same size and alignment); only the kernels write
        // them, as int32.
        let ready = unsafe { ready_f.transmute::<i32>(slots) }
            .ok_or_else(|| KernelError::shape("cuda::gdn_prefill", "workspace region too small"))?;
        {
            let one_block = walk_one_block(lay.seqs * dims.value_heads, self.sm_count);
            let (name, smem, blocks_x) = if one_block {
                ("gdn_prefill_walk1_bf16", WALK1_BF16_SMEM_BYTES, 1)
            } else {
                ("gdn_prefill_walk_bf16", WALK_BF16_SMEM_BYTES, 2)
            };
            let f = self.function(Module::GdnPrefill, name)?;
            set_smem(&f, smem, name)?;
            max_carveout(&f, name)?; // one walk block and one output block per SM
            let cfg = LaunchConfig {
                grid_dim: (blocks_x, dims.value_heads as u32, lay.seqs as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem,
            };
            // Launched as the WY's programmatic dependent (Device::launch_pdl): each block loads its state (the
            // caller's), then waits in `pdl_wait` for the WY's end.
            let (kp, _g1) = kb.device_ptr(&self.stream);
            let (gp, _g2) = gc.device_ptr(&self.stream);
            let (wp, _g3) = wi.device_ptr(&self.stream);
            let (up, _g4) = ui.device_ptr(&self.stream);
            let (mp, _g5) = meta_dev.device_ptr(&self.stream);
            let (sp, _g6) = state.device_ptr_mut(&self.stream);
            let (hp, _g7) = hs.device_ptr(&self.stream);
            let (rp, _g8) = ready.device_ptr(&self.stream);
            let mut args = PdlArgs::default();
            args.ptr(kp)
                .ptr(gp)
                .ptr(wp)
                .ptr(up)
                .ptr(mp)
                .ptr(sp)
                .ptr(hp)
                .ptr(rp);
            args.i32(hk).i32(hv).i32(seqs_i).i32(nc_i);
            // SAFETY: matches `gdn_prefill_walk_bf16` and `gdn_prefill_walk1_bf16` (the same parameters); before
            // their `pdl_wait` they read only the state (the caller's) and meta (written before the prep, a plain
            // launch), after it what launches 1 and 2 wrote; state = [seqs, Hv, 128, 128] was checked; each block
            // owns 64 (two-block walk) or all 128 columns of one (sequence, head) state and writes only those
            // columns of its own chunks' hs slots (hs holds Hv * NC slots, `layout`), then adds 1 per 64 columns
            // to each chunk's ready counter (Hv * NC int32 past the bf16 Aqk, inside the Aqk region).
            unsafe { self.launch_pdl(name, &f, cfg, &mut args) }?;
        }
        {
            const NAME: &str = "gdn_prefill_out_bf16";
            let f = self.function(Module::GdnPrefill, NAME)?;
            set_smem(&f, OUT_BF16_SMEM_BYTES, NAME)?;
            max_carveout(&f, NAME)?;
            let cfg = LaunchConfig {
                // Heads fastest, chunks slowest: the order in which the walk finishes the slots (`layout`
                // checked max_chunks <= 65535).
                grid_dim: (
                    dims.value_heads as u32,
                    lay.seqs as u32,
                    lay.max_chunks as u32,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: OUT_BF16_SMEM_BYTES,
            };
            // Launched as the walk's programmatic dependent (Device::launch_pdl): its blocks become resident beside
            // the walk's (one per walk block's SM, three on the SMs the walk leaves idle) and each waits for its
            // chunk's ready counter, not for the walk's end. The guards order the raw addresses after pending work
            // on other streams.
            let (qp, _g1) = qb.device_ptr(&self.stream);
            let (gp, _g2) = gc.device_ptr(&self.stream);
            let (ap, _g3) = ai.device_ptr(&self.stream);
            let (hp, _g4) = hs.device_ptr(&self.stream);
            let (mp, _g5) = meta_dev.device_ptr(&self.stream);
            let (zp, _g6) = x.z.slice.device_ptr(&self.stream);
            let (wp, _g7) = w.norm_weight.slice.device_ptr(&self.stream);
            let (op, _g8) = out.device_ptr_mut(&self.stream);
            let (rp, _g9) = ready.device_ptr(&self.stream);
            let mut args = PdlArgs::default();
            args.ptr(qp)
                .ptr(gp)
                .ptr(ap)
                .ptr(hp)
                .ptr(mp)
                .ptr(zp)
                .ptr(wp)
                .f32(w.norm_eps)
                .ptr(op)
                .ptr(rp);
            args.i32(hk).i32(hv).i32(seqs_i).i32(nc_i);
            // SAFETY: matches `gdn_prefill_out_bf16`; reads launch 2's Aqk and the prep's q (finished: the walk's
            // blocks trigger this launch only after their `pdl_wait`, the WY's end, itself after the prep's) and
            // each chunk's hs slot only after that chunk's ready counter reached 2 (all 128 columns written; the
            // walk's blocks are all resident before this grid starts, so the counters do get there); z and out are
            // [N, Hv*128], norm_weight [128] (checked); each block writes only its chunk's rows of its head; blocks
            // past a sequence's chunks return.
            unsafe { self.launch_pdl(NAME, &f, cfg, &mut args) }?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The constants above against `cuda/gdn_prefill.cu`'s static_assert literals and the bench's copies
    //! (`super::super::source_literal` says why). One change altered three of these sizes in three places by hand.
    use super::super::source_literal;
    use super::*;

    const CU: &str = include_str!("../../../cuda/gdn_prefill.cu");
    const BENCH: &str = include_str!("../../../bench/h200/bench_gdn_prefill.py");

    #[test]
    fn launch_constants_match_the_kernel_file_and_the_bench() {
        let cu = |key: &str| source_literal(CU, key, " == ");
        let py = |key: &str| source_literal(BENCH, key, " = ");
        assert_eq!(cu("static_assert(PREP_TT") as usize, PREP_TOKENS);
        assert_eq!(py("\nPREP_TT") as usize, PREP_TOKENS);
        assert_eq!(cu("static_assert(WY_SMEM_BYTES") as u32, WY_SMEM_BYTES);
        assert_eq!(py("\nWY_SMEM") as u32, WY_SMEM_BYTES);
        assert_eq!(cu("wy_tc_smem_bytes()") as u32, WY_TC_SMEM_BYTES);
        assert_eq!(py("\nWY_TC_SMEM") as u32, WY_TC_SMEM_BYTES);
        assert_eq!(cu("wy_h_smem_bytes()") as u32, WY_H_SMEM_BYTES);
        assert_eq!(py("\nWY_H_SMEM") as u32, WY_H_SMEM_BYTES);
        for cs in [16, 32, 64] {
            assert_eq!(
                cu(&format!("state_smem_bytes({cs})")) as u32,
                state_smem_bytes(cs),
                "cs {cs}"
            );
            assert_eq!(
                cu(&format!("state_tc_smem_bytes({cs})")) as u32,
                state_tc_smem_bytes(cs),
                "cs {cs}"
            );
        }
        assert_eq!(cu("walk_bf16_smem_bytes()") as u32, WALK_BF16_SMEM_BYTES);
        assert_eq!(py("\nWALK_BF16_SMEM") as u32, WALK_BF16_SMEM_BYTES);
        assert_eq!(cu("walk1_bf16_smem_bytes()") as u32, WALK1_BF16_SMEM_BYTES);
        assert_eq!(py("\nWALK1_BF16_SMEM") as u32, WALK1_BF16_SMEM_BYTES);
        assert_eq!(cu("out_bf16_smem_bytes()") as u32, OUT_BF16_SMEM_BYTES);
        assert_eq!(py("\nOUT_BF16_SMEM") as u32, OUT_BF16_SMEM_BYTES);
    }

    #[test]
    fn the_walk_takes_one_block_per_state_beyond_one_wave_of_two() {
        // H200 (132 SMs): one 4096-token sequence of 48 heads runs the two-block walk (96 blocks), four run the
        // one-block walk (384 two-block blocks would be three waves); the bench mirrors this rule.
        assert!(!walk_one_block(48, 132));
        assert!(!walk_one_block(66, 132));
        assert!(walk_one_block(67, 132));
        assert!(walk_one_block(4 * 48, 132));
        assert!(walk_one_block(1, 0));
        assert!(!walk_one_block(0, 132));
        assert!(
            BENCH.contains("def walk_one_block(pairs, sms):\n    return 2 * pairs > sms\n"),
            "the bench's copy of the rule"
        );
    }
}
