//! Shared pieces of the CPU benchmarks (`cpu_gemv`, `cpu_seq`): repeated-timing statistics, environment knobs, and
//! the memory read probe every GEMV and attention ratio is taken against.

#![allow(dead_code)]

use std::hint::black_box;
use std::time::Instant;

use kernels::cpu::parallel_ranges;

pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median, min and max of repeated timings, in seconds.
#[derive(Clone, Copy)]
pub(crate) struct Stats {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Stats {
    pub(crate) fn of(mut v: Vec<f64>) -> Stats {
        v.sort_by(f64::total_cmp);
        Stats {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        }
    }
    pub(crate) fn spread(&self) -> f64 {
        self.max / self.min - 1.0
    }
}

/// Sum of bytes read as u64 words with eight independent lanes: the portable probe.
fn read_sum_portable(v: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    for c in v.chunks_exact(64) {
        for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        }
    }
    acc.iter().fold(0, |a, &b| a.wrapping_add(b))
}

/// Distance of the probe's software prefetch, in bytes ahead of each stream: the kernels prefetch into L2 a few
/// KiB ahead (`csrc/linear_avx512.c`, `csrc/attn_avx512.c`), so the ceiling is measured the same way.
const PREFETCH_AHEAD: usize = 4096;

/// The probe: four interleaved streams (the four quarters of the range), 64-byte loads, and a software prefetch
/// into L2 of every line `PREFETCH_AHEAD` bytes ahead in each stream — the access pattern the fast kernels use.
///
/// Why not one plain stream: on this KVM guest a single stream without software prefetch read 12.2 GB/s on one
/// core, four prefetched streams 16.3-16.4 GB/s (h7's scratch probe, benchmarks/cpu-avx512-2core.md), and the
/// kernels themselves reached 14.5 GB/s; a probe below what the kernels reach is not a ceiling.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn read_sum_avx512(v: &[u8]) -> u64 {
    use std::arch::x86_64::{
        __m512i, _mm512_add_epi64, _mm512_loadu_si512, _mm512_reduce_add_epi64,
        _mm512_setzero_si512, _mm_prefetch, _MM_HINT_T1,
    };
    let quarter = v.len() / 4 / 64 * 64;
    let mut acc = [_mm512_setzero_si512(); 4];
    let base = v.as_ptr();
    let mut off = 0;
    while off < quarter {
        for (s, a) in acc.iter_mut().enumerate() {
            let at = s * quarter + off;
            if off + PREFETCH_AHEAD < quarter {
                // SAFETY: `at + PREFETCH_AHEAD` is inside stream `s` (checked above), so inside `v`; a prefetch
                // never faults anyway.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(base.add(at + PREFETCH_AHEAD).cast::<i8>()) };
            }
            // SAFETY: `at + 64 <= s * quarter + quarter <= v.len()`; loadu has no alignment requirement.
            let w = unsafe { _mm512_loadu_si512(base.add(at).cast::<__m512i>()) };
            *a = _mm512_add_epi64(*a, w);
        }
        off += 64;
    }
    let total = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    (_mm512_reduce_add_epi64(total) as u64).wrapping_add(read_sum_portable(&v[4 * quarter..]))
}

/// Reads every byte of `v` once (see [`read_sum_avx512`] for the access pattern) and returns a checksum.
pub(crate) fn read_sum(v: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above), the only requirement of the target feature.
        return unsafe { read_sum_avx512(v) };
    }
    read_sum_portable(v)
}

/// Seconds one pass of the read probe over `buf` takes on `threads` threads (each a contiguous share).
pub(crate) fn read_pass(buf: &[u8], threads: usize) -> f64 {
    let t = Instant::now();
    parallel_ranges(buf.len(), 1 << 16, threads, |s, e| {
        black_box(read_sum(&buf[s..e]));
    });
    t.elapsed().as_secs_f64()
}

/// The bytes of an f32 slice, for the probe.
pub(crate) fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any initialised f32 memory is valid as u8, the length covers exactly the same bytes, and u8 has
    // alignment 1; the borrow keeps `v` alive and unaliased-mutably for the result's lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
