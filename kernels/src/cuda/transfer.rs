//! Weights that live in host memory and cross the link when a step needs them: page-locked copies of a weight's
//! device buffers ([`Gpu::stash`]), a second stream that copies them back into device buffers while kernels run on
//! the compute stream ([`CopyStream::fill`]), and the events that order the two ([`GpuEvent`]).
//!
//! The two streams share nothing implicitly: the device's own stream has cudarc's per-buffer events turned off
//! (see `Device::new`), so a caller that refills a buffer on the copy stream orders it against the kernels that
//! read it with [`Gpu::record`] / [`CopyStream::wait_for`] and [`CopyStream::record`] / [`Gpu::wait_for`]. Without
//! that the kernels read a half-copied weight: wrong numbers, never host memory unsafety (both sides are device
//! memory and the pinned source outlives every queued copy, see [`PinnedWeights`]).

#[cfg(feature = "cuda")]
use std::sync::Arc;

#[cfg(feature = "cuda")]
use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};

use super::{Gpu, GpuBuffer};
use crate::KernelError;

#[cfg(feature = "cuda")]
use super::device::cuda_err;

/// One device buffer of a weight, borrowed to copy it to the host.
pub enum WeightBuf<'a> {
    U8(&'a GpuBuffer<u8>),
    U16(&'a GpuBuffer<u16>),
    U32(&'a GpuBuffer<u32>),
    F32(&'a GpuBuffer<f32>),
}

/// One device buffer of a weight, borrowed to refill it.
pub enum WeightBufMut<'a> {
    U8(&'a mut GpuBuffer<u8>),
    U16(&'a mut GpuBuffer<u16>),
    U32(&'a mut GpuBuffer<u32>),
    F32(&'a mut GpuBuffer<f32>),
}

#[cfg(feature = "cuda")]
enum Blob {
    U8(PinnedHostSlice<u8>),
    U16(PinnedHostSlice<u16>),
    U32(PinnedHostSlice<u32>),
    F32(PinnedHostSlice<f32>),
}

#[cfg(feature = "cuda")]
impl Blob {
    fn bytes(&self) -> usize {
        match self {
            Blob::U8(b) => b.num_bytes(),
            Blob::U16(b) => b.num_bytes(),
            Blob::U32(b) => b.num_bytes(),
            Blob::F32(b) => b.num_bytes(),
        }
    }
}

/// A weight's device buffers copied to page-locked host memory, in the order the weight lists them, ready to be
/// copied back at the link's full rate. Dropping it waits for the copies still reading it (cudarc records an event
/// on the pinned memory at each use and its drop synchronizes on it), so the host memory outlives every copy.
pub struct PinnedWeights {
    #[cfg(feature = "cuda")]
    blobs: Vec<Blob>,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

impl PinnedWeights {
    /// Host bytes held (what one refill moves across the link).
    pub fn bytes(&self) -> usize {
        #[cfg(feature = "cuda")]
        {
            self.blobs.iter().map(Blob::bytes).sum()
        }
        no_cuda!(self)
    }
}

impl std::fmt::Debug for PinnedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedWeights")
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// A point in a stream's work: recorded on one stream, waited for by another, or timed against another event.
pub struct GpuEvent {
    #[cfg(feature = "cuda")]
    ev: CudaEvent,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

impl GpuEvent {
    /// Milliseconds from this event to `end`, once both have completed (waits for them); both must have been made
    /// with timing on.
    pub fn elapsed_ms(&self, end: &GpuEvent) -> Result<f32, KernelError> {
        #[cfg(feature = "cuda")]
        {
            self.ev.elapsed_ms(&end.ev).map_err(cuda_err("elapsed_ms"))
        }
        no_cuda!(self, end)
    }
}

/// A second stream on the same device for host-to-device copies that overlap the kernels of the compute stream.
pub struct CopyStream {
    #[cfg(feature = "cuda")]
    stream: Arc<CudaStream>,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(feature = "cuda")]
/// Page-locked host memory of `len` elements holding `src`'s contents, copied on `stream` (waited for).
macro_rules! stash_one {
    ($gpu:expr, $src:expr, $variant:ident) => {{
        let ctx = $gpu.inner.context();
        // SAFETY: the memory is uninitialised only until the copy below overwrites all of it, and nothing reads it
        // before the stream is synchronised.
        let mut host = unsafe { ctx.alloc_pinned_with_flags($src.len(), 0) }
            .map_err(cuda_err("allocating pinned host memory"))?;
        let stream = $gpu.inner.stream();
        stream
            .memcpy_dtoh(&$src.slice, &mut host)
            .map_err(cuda_err("stash"))?;
        Blob::$variant(host)
    }};
}

#[cfg(feature = "cuda")]
impl Gpu {
    /// Copies a weight's device buffers (`bufs`, as the weight's `buffers()` lists them) to new page-locked host
    /// memory, after every kernel queued before (it waits for the copies). The caller may then drop the device
    /// copy and refill a buffer of the same shape from it with [`CopyStream::fill`].
    pub fn stash(&self, bufs: &[WeightBuf<'_>]) -> Result<PinnedWeights, KernelError> {
        let mut blobs = Vec::with_capacity(bufs.len());
        for b in bufs {
            blobs.push(match b {
                WeightBuf::U8(s) => stash_one!(self, s, U8),
                WeightBuf::U16(s) => stash_one!(self, s, U16),
                WeightBuf::U32(s) => stash_one!(self, s, U32),
                WeightBuf::F32(s) => stash_one!(self, s, F32),
            });
        }
        self.synchronize()?;
        Ok(PinnedWeights { blobs })
    }

    /// A new stream for copies beside the compute stream (copies queued on it run while kernels run).
    pub fn copy_stream(&self) -> Result<CopyStream, KernelError> {
        let stream = self
            .inner
            .context()
            .new_stream()
            .map_err(cuda_err("creating the copy stream"))?;
        Ok(CopyStream { stream })
    }

    /// A new event; `timing` lets [`GpuEvent::elapsed_ms`] read it (ordering-only events are cheaper).
    pub fn new_event(&self, timing: bool) -> Result<GpuEvent, KernelError> {
        use cudarc::driver::sys::CUevent_flags as F;
        let flags = if timing {
            F::CU_EVENT_DEFAULT
        } else {
            F::CU_EVENT_DISABLE_TIMING
        };
        let ev = self
            .inner
            .context()
            .new_event(Some(flags))
            .map_err(cuda_err("creating an event"))?;
        Ok(GpuEvent { ev })
    }

    /// Marks the compute stream's work queued so far in `ev` (recording again moves the mark).
    pub fn record(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        ev.ev
            .record(self.inner.stream())
            .map_err(cuda_err("record"))
    }

    /// Makes the compute stream's later work wait until `ev`'s mark is reached (an event never recorded is no wait).
    pub fn wait_for(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        self.inner
            .stream()
            .wait(&ev.ev)
            .map_err(cuda_err("wait_for"))
    }

    /// Host-to-device bandwidth of page-locked memory, bytes per second: the best of five copies of `bytes` (the
    /// link rate a streamed weight crosses at, measured beside the step it explains).
    pub fn pinned_upload_bandwidth(&self, bytes: usize) -> Result<f64, KernelError> {
        crate::ensure_shape!(
            bytes > 0,
            "Gpu::pinned_upload_bandwidth",
            "bytes must be positive"
        );
        let mut dev = self.zeros::<u8>(bytes)?;
        let pinned = self.stash(&[WeightBuf::U8(&dev)])?;
        let copy = self.copy_stream()?;
        let mut best = 0.0f64;
        for _ in 0..5 {
            copy.synchronize()?;
            let t = std::time::Instant::now();
            copy.fill(&pinned, &mut [WeightBufMut::U8(&mut dev)])?;
            copy.synchronize()?;
            best = best.max(bytes as f64 / t.elapsed().as_secs_f64());
        }
        Ok(best)
    }
}

#[cfg(feature = "cuda")]
impl CopyStream {
    /// Queues copies of `src` into `dst` (the same weight's `buffers_mut()`: the same number of buffers, each of
    /// the same type and length) on this stream, and returns at once.
    pub fn fill(
        &self,
        src: &PinnedWeights,
        dst: &mut [WeightBufMut<'_>],
    ) -> Result<(), KernelError> {
        crate::ensure_shape!(
            src.blobs.len() == dst.len(),
            "CopyStream::fill",
            "{} host buffers for {} device buffers",
            src.blobs.len(),
            dst.len()
        );
        // Every shape first, so a mismatch queues nothing.
        for (i, (s, d)) in src.blobs.iter().zip(dst.iter()).enumerate() {
            let same = match (s, d) {
                (Blob::U8(s), WeightBufMut::U8(d)) => s.len() == d.len(),
                (Blob::U16(s), WeightBufMut::U16(d)) => s.len() == d.len(),
                (Blob::U32(s), WeightBufMut::U32(d)) => s.len() == d.len(),
                (Blob::F32(s), WeightBufMut::F32(d)) => s.len() == d.len(),
                _ => false,
            };
            crate::ensure_shape!(
                same,
                "CopyStream::fill",
                "buffer {i}: the host copy's type or length differs from the device buffer's"
            );
        }
        let e = cuda_err("fill");
        for (s, d) in src.blobs.iter().zip(dst.iter_mut()) {
            match (s, d) {
                (Blob::U8(s), WeightBufMut::U8(d)) => self.stream.memcpy_htod(s, &mut d.slice),
                (Blob::U16(s), WeightBufMut::U16(d)) => self.stream.memcpy_htod(s, &mut d.slice),
                (Blob::U32(s), WeightBufMut::U32(d)) => self.stream.memcpy_htod(s, &mut d.slice),
                (Blob::F32(s), WeightBufMut::F32(d)) => self.stream.memcpy_htod(s, &mut d.slice),
                _ => {
                    return Err(KernelError::shape(
                        "CopyStream::fill",
                        "buffer types changed while filling".to_string(),
                    ))
                }
            }
            .map_err(&e)?;
        }
        Ok(())
    }

    /// Marks this stream's copies queued so far in `ev`.
    pub fn record(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        ev.ev.record(&self.stream).map_err(cuda_err("record"))
    }

    /// Makes this stream's later copies wait until `ev`'s mark is reached.
    pub fn wait_for(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        self.stream.wait(&ev.ev).map_err(cuda_err("wait_for"))
    }

    /// Waits for every copy queued on this stream.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        self.stream
            .synchronize()
            .map_err(cuda_err("synchronize the copy stream"))
    }
}

/// Without the `cuda` feature no [`Gpu`] exists, so none of these can be reached; they keep call sites free of `cfg`.
#[cfg(not(feature = "cuda"))]
impl Gpu {
    pub fn stash(&self, bufs: &[WeightBuf<'_>]) -> Result<PinnedWeights, KernelError> {
        let _ = bufs;
        match self.never {}
    }
    pub fn copy_stream(&self) -> Result<CopyStream, KernelError> {
        match self.never {}
    }
    pub fn new_event(&self, timing: bool) -> Result<GpuEvent, KernelError> {
        let _ = timing;
        match self.never {}
    }
    pub fn record(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        let _ = ev;
        match self.never {}
    }
    pub fn wait_for(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        let _ = ev;
        match self.never {}
    }
    pub fn pinned_upload_bandwidth(&self, bytes: usize) -> Result<f64, KernelError> {
        let _ = bytes;
        match self.never {}
    }
}

#[cfg(not(feature = "cuda"))]
impl CopyStream {
    pub fn fill(
        &self,
        src: &PinnedWeights,
        dst: &mut [WeightBufMut<'_>],
    ) -> Result<(), KernelError> {
        let _ = (src, dst);
        match self.never {}
    }
    pub fn record(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        let _ = ev;
        match self.never {}
    }
    pub fn wait_for(&self, ev: &GpuEvent) -> Result<(), KernelError> {
        let _ = ev;
        match self.never {}
    }
    pub fn synchronize(&self) -> Result<(), KernelError> {
        match self.never {}
    }
}
