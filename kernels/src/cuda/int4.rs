//! Int4 linear layers on the GPU (`cuda/int4.cu`): W4A16 and W4A8 over the chunked tinygemm pack of
//! [`crate::linear::Int4Weights`], uploaded as it is (its `packed()` and `scales_zeros()`, the bytes
//! [`Gpu::embedding_gather_int4`] reads too). Upload a matrix once with [`Gpu::int4_weights`], then call
//! [`Gpu::int4_w4a16`] or [`Gpu::int4_w4a8`] per step: f32 activations in, f32 out.
//!
//! The numerics are the CPU's: W4A16 dequantises each weight as `Int4Weights::dequantize_row` does and accumulates
//! in f32 (it differs from the CPU's f32 kernel by the order of the sums); W4A8 quantises the activations itself,
//! per row, to the CPU's int8 grid (`scale = amax / 127`, ties away from zero: the same codes bit for bit), takes
//! int32 dot products per weight group and adds `scale * dot` per group in f32. One simple kernel serves every `m`
//! (a block per 64 output columns and 16 activation rows, the groups of `k` split over its 8 warps and added in warp
//! order): correct and deterministic, not tuned.

#[cfg(feature = "cuda")]
use cudarc::driver::PushKernelArg;

#[cfg(feature = "cuda")]
use super::device::{cuda_err, launch_config, Module};
use super::ops::check_int4_table;
use super::{check_len_of, Gpu, GpuBuffer};
use crate::KernelError;

const I32_MAX: usize = i32::MAX as usize;

/// Threads of a linear block (`INT4_THREADS` in cuda/int4.cu) and of the quantiser's (`QUANT_THREADS`).
#[cfg(feature = "cuda")]
const INT4_THREADS: u32 = 256;
#[cfg(feature = "cuda")]
const QUANT_THREADS: u32 = 256;
/// Activation rows per block (`INT4_ROWS`); grid.y takes at most 65535 tiles and the kernel strides past that.
#[cfg(feature = "cuda")]
const INT4_ROWS: usize = 16;
#[cfg(feature = "cuda")]
const MAX_GRID_Y: usize = 65535;

/// The kernels a call launches, by activation type: the names `every_int4_kernel_is_embedded` checks.
#[cfg(feature = "cuda")]
const W4A16_KERNEL: &str = "int4_w4a16";
#[cfg(feature = "cuda")]
const W4A8_KERNEL: &str = "int4_w4a8";
#[cfg(feature = "cuda")]
const QUANT_KERNEL: &str = "int4_quantize_rows_i8";

/// An int4 weight matrix on the device in the chunked tinygemm pack (`[n, k]` logical, `n` output features),
/// made by [`Gpu::int4_weights`], which checked the buffers against `n`, `k` and `group`.
pub struct Int4GpuWeights {
    packed: GpuBuffer<u8>,
    scales_zeros: GpuBuffer<u16>,
    n: usize,
    k: usize,
    group: usize,
    symmetric: bool,
}

impl std::fmt::Debug for Int4GpuWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Int4GpuWeights")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("group", &self.group)
            .field("symmetric", &self.symmetric)
            .field("device_bytes", &self.device_bytes())
            .finish()
    }
}

impl Int4GpuWeights {
    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Input features per scale.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Whether every zero is 0 (GPTQ's symmetric grid), which [`Gpu::int4_w4a8`] needs.
    pub fn symmetric(&self) -> bool {
        self.symmetric
    }

    /// Bytes of device memory the matrix takes.
    pub fn device_bytes(&self) -> usize {
        self.packed.len() + 2 * self.scales_zeros.len()
    }

    /// The device buffers, in a fixed order (what a pinned host copy holds and a refill writes).
    pub fn buffers(&self) -> Vec<super::WeightBuf<'_>> {
        vec![
            super::WeightBuf::U8(&self.packed),
            super::WeightBuf::U16(&self.scales_zeros),
        ]
    }

    /// [`Int4GpuWeights::buffers`], to refill.
    pub fn buffers_mut(&mut self) -> Vec<super::WeightBufMut<'_>> {
        vec![
            super::WeightBufMut::U8(&mut self.packed),
            super::WeightBufMut::U16(&mut self.scales_zeros),
        ]
    }
}

impl Gpu {
    /// Uploads an int4 matrix in the chunked pack of [`crate::linear::Int4Weights`]: `packed` uint8
    /// `[ceil(n/64)][k][32]`, `scales_zeros` bf16 bits `[ceil(k/group)][npad][2]`, `group` one of
    /// [`crate::formats::INT4_GROUPS`]. `symmetric` says the weights are on GPTQ's grid (zero point 8, every zero
    /// 0): it is checked here, since [`Gpu::int4_w4a8`] never reads the zeros.
    pub fn int4_weights(
        &self,
        packed: &[u8],
        scales_zeros: &[u16],
        n: usize,
        k: usize,
        group: usize,
        symmetric: bool,
    ) -> Result<Int4GpuWeights, KernelError> {
        const OP: &str = "cuda::int4_weights";
        check_int4_table(OP, packed.len(), scales_zeros.len(), n, k, group)?;
        crate::ensure_shape!(
            n <= I32_MAX,
            OP,
            "n = {n} must fit the kernel's 32-bit column index"
        );
        if symmetric {
            if let Some(i) = scales_zeros
                .iter()
                .skip(1)
                .step_by(2)
                .position(|&z| z & 0x7FFF != 0)
            {
                return Err(KernelError::shape(
                    OP,
                    format!("symmetric weights need every zero to be 0, zero {i} is not"),
                ));
            }
        }
        Ok(Int4GpuWeights {
            packed: self.upload(packed)?,
            scales_zeros: self.upload(scales_zeros)?,
            n,
            k,
            group,
            symmetric,
        })
    }

    /// W4A16: `y[m, n] = x[m, k] . W[n, k]^T` with f32 activations `x` (`m * k`) and f32 output `y` (`m * n`);
    /// each weight `(code - 8) * scale + zero` in f32 as the CPU dequantises it, products and sums in f32.
    /// `1 <= m <= i32::MAX`.
    pub fn int4_w4a16(
        &self,
        x: &GpuBuffer<f32>,
        w: &Int4GpuWeights,
        m: usize,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::int4_w4a16";
        let npad = check_call(OP, w, false, x.len(), m, y.len())?;
        #[cfg(feature = "cuda")]
        {
            let f = self.inner.function(Module::Int4, W4A16_KERNEL)?;
            let (mm, nn, kk, g, np) = (
                m as i32,
                w.n as i32,
                w.k as i32,
                w.group as i32,
                npad as u32,
            );
            let mut b = self.inner.stream().launch_builder(&f);
            b.arg(&x.slice)
                .arg(&w.packed.slice)
                .arg(&w.scales_zeros.slice)
                .arg(&mut y.slice)
                .arg(&mm)
                .arg(&nn)
                .arg(&kk)
                .arg(&g)
                .arg(&np);
            // SAFETY: matches `int4_w4a16(x, packed, scales_zeros, y, m, n, k, group, npad)` in cuda/int4.cu;
            // checked above (check_call): packed = [npad/64][k][32], scales_zeros = [ceil(k/group)][npad][2] with
            // group > 0, x = [m, k], y = [m, n], 1 <= m, n, k <= i32::MAX and npad <= u32::MAX; the grid has one
            // block per 64 columns, and the kernel stores only columns < n of rows < m.
            unsafe { b.launch(linear_config(npad, m)) }.map_err(cuda_err(W4A16_KERNEL))?;
            Ok(())
        }
        no_cuda!(self, npad)
    }

    /// W4A8: as [`Gpu::int4_w4a16`] with the activations quantised to int8 per row first, by a kernel of its own
    /// (the CPU's grid and rounding, the same codes), on symmetric weights only (refused otherwise). Allocates its
    /// `m * k` bytes and `m` scales of scratch per call: a caller that records the call in a CUDA graph, or makes
    /// it every step, keeps an [`Int4A8Scratch`] and calls [`Gpu::int4_w4a8_reusing`] instead.
    pub fn int4_w4a8(
        &self,
        x: &GpuBuffer<f32>,
        w: &Int4GpuWeights,
        m: usize,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        // The call's checks first, so that a bad call allocates nothing; x.len() = m * k is then known.
        check_call("cuda::int4_w4a8", w, true, x.len(), m, y.len())?;
        let mut scratch = self.int4_a8_scratch(m, w.k)?;
        self.int4_w4a8_reusing(x, w, m, &mut scratch, y)
    }

    /// The activation scratch of [`Gpu::int4_w4a8_reusing`] for up to `rows` rows of up to `k` features (any
    /// call of at most `rows` rows and `rows * k` activations fits, so one scratch serves every int4 linear of a
    /// model): `rows * k` int8 codes and `rows` scales, allocated once.
    pub fn int4_a8_scratch(&self, rows: usize, k: usize) -> Result<Int4A8Scratch, KernelError> {
        const OP: &str = "cuda::int4_a8_scratch";
        crate::ensure_shape!(
            rows > 0 && k > 0,
            OP,
            "rows and k must be positive, got {rows} x {k}"
        );
        let codes = rows
            .checked_mul(k)
            .ok_or_else(|| KernelError::shape(OP, format!("rows * k = {rows} * {k} overflows")))?;
        Ok(Int4A8Scratch {
            xq: self.zeros::<u8>(codes)?,
            xs: self.zeros::<f32>(rows)?,
        })
    }

    /// [`Gpu::int4_w4a8`] on scratch the caller keeps: no allocation, so the launches can be recorded in a CUDA
    /// graph and replayed. The scratch must hold at least `m` rows and `m * w.k()` codes.
    pub fn int4_w4a8_reusing(
        &self,
        x: &GpuBuffer<f32>,
        w: &Int4GpuWeights,
        m: usize,
        scratch: &mut Int4A8Scratch,
        y: &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "cuda::int4_w4a8";
        let npad = check_call(OP, w, true, x.len(), m, y.len())?;
        crate::ensure_shape!(
            scratch.xs.len() >= m && scratch.xq.len() >= x.len(),
            OP,
            "the scratch holds {} rows and {} codes; this call needs {m} rows of {} features",
            scratch.xs.len(),
            scratch.xq.len(),
            w.k
        );
        #[cfg(feature = "cuda")]
        {
            let kk = w.k as i32;
            let f = self.inner.function(Module::Int4, QUANT_KERNEL)?;
            let mut b = self.inner.stream().launch_builder(&f);
            b.arg(&x.slice)
                .arg(&mut scratch.xq.slice)
                .arg(&mut scratch.xs.slice)
                .arg(&kk);
            // SAFETY: matches `int4_quantize_rows_i8(x, xq, xs, k)` in cuda/int4.cu (xq's bytes are the kernel's
            // int8_t, the same size); x holds m * k elements (check_call) and the scratch at least m * k codes and
            // m scales (checked above), one block per row with 1 <= m <= i32::MAX and
            // 1 <= k <= i32::MAX.
            unsafe { b.launch(launch_config((m as u32, 1, 1), (QUANT_THREADS, 1, 1), 0)) }
                .map_err(cuda_err(QUANT_KERNEL))?;
            let f = self.inner.function(Module::Int4, W4A8_KERNEL)?;
            let (mm, nn, g, np) = (m as i32, w.n as i32, w.group as i32, npad as u32);
            let mut b = self.inner.stream().launch_builder(&f);
            b.arg(&scratch.xq.slice)
                .arg(&scratch.xs.slice)
                .arg(&w.packed.slice)
                .arg(&w.scales_zeros.slice)
                .arg(&mut y.slice)
                .arg(&mm)
                .arg(&nn)
                .arg(&kk)
                .arg(&g)
                .arg(&np);
            // SAFETY: matches `int4_w4a8(xq, xs, packed, scales_zeros, y, m, n, k, group, npad)` in cuda/int4.cu;
            // the first m rows of xq and m scales of xs were written by the launch before on the same stream, and
            // the rest is as for int4_w4a16 (check_call); group <= 128 keeps each int32 dot product below 2^17 in
            // magnitude.
            unsafe { b.launch(linear_config(npad, m)) }.map_err(cuda_err(W4A8_KERNEL))?;
            Ok(())
        }
        no_cuda!(self, npad, scratch)
    }
}

/// The int8 activations and per-row scales [`Gpu::int4_w4a8_reusing`] quantises into, made by
/// [`Gpu::int4_a8_scratch`].
pub struct Int4A8Scratch {
    xq: GpuBuffer<u8>,
    xs: GpuBuffer<f32>,
}

impl std::fmt::Debug for Int4A8Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Int4A8Scratch")
            .field("rows", &self.xs.len())
            .field("codes", &self.xq.len())
            .finish()
    }
}

/// Checks a linear call against its weights (again: the sizes are what the launch trusts) and returns `npad`;
/// `a8`: W4A8, which also needs the weights on the symmetric grid.
fn check_call(
    op: &'static str,
    w: &Int4GpuWeights,
    a8: bool,
    x: usize,
    m: usize,
    y: usize,
) -> Result<usize, KernelError> {
    let npad = check_int4_table(op, w.packed.len(), w.scales_zeros.len(), w.n, w.k, w.group)?;
    crate::ensure_shape!(
        w.n <= I32_MAX,
        op,
        "n = {} must fit the kernel's 32-bit column index",
        w.n
    );
    crate::ensure_shape!(
        m > 0 && m <= I32_MAX,
        op,
        "m must be in 1..=i32::MAX, got {m}"
    );
    check_len_of(op, "x", x, &[m, w.k])?;
    check_len_of(op, "y", y, &[m, w.n])?;
    crate::ensure_shape!(
        !a8 || w.symmetric,
        op,
        "W4A8 needs weights on the symmetric grid (zero point 8); these are asymmetric"
    );
    Ok(npad)
}

/// One block per 64-column block of the weights and per tile of 16 rows, the tiles past grid.y strided.
#[cfg(feature = "cuda")]
fn linear_config(npad: usize, m: usize) -> cudarc::driver::LaunchConfig {
    let tiles = m.div_ceil(INT4_ROWS).min(MAX_GRID_Y);
    launch_config(
        ((npad / 64) as u32, tiles as u32, 1),
        (INT4_THREADS, 1, 1),
        0,
    )
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::super::device::{source_literal, Module};

    /// Every kernel a call here launches is embedded (the list comes from the PTX, `build_cuda.rs`), and nothing
    /// else is: no variant exists, with or without `lab`.
    #[test]
    fn every_int4_kernel_is_embedded() {
        let mut launched = vec![super::W4A16_KERNEL, super::W4A8_KERNEL, super::QUANT_KERNEL];
        launched.sort_unstable();
        assert_eq!(Module::Int4.entries(), launched);
    }

    /// The launch constants restated here are those cuda/int4.cu pins.
    #[test]
    fn launch_constants_match_the_kernel_source() {
        let src = include_str!("../../cuda/int4.cu");
        let lit = |key: &str| source_literal(src, key, " = ");
        assert_eq!(
            lit("constexpr int INT4_THREADS") as u32,
            super::INT4_THREADS
        );
        assert_eq!(lit("constexpr int INT4_ROWS") as usize, super::INT4_ROWS);
        assert_eq!(
            lit("constexpr int QUANT_THREADS") as u32,
            super::QUANT_THREADS
        );
    }
}
