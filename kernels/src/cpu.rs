//! Run-time CPU dispatch and the small threading helper the CPU kernels share.
//!
//! The instruction set is probed once ([`Isa::detected`]). The safe entry points of each kernel module take an
//! explicit [`Isa`] in their `_with` form so tests can run every path this machine has ([`Isa::available`]).

use std::sync::OnceLock;

/// Instruction-set paths of the C kernels, from slowest to fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable C, compiled for the baseline target. Always available.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ + VNNI + BF16.
    Avx512,
}

impl Isa {
    /// The fastest path this CPU supports, probed once per process.
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| *Isa::available().last().unwrap_or(&Isa::Scalar))
    }

    /// Every path this CPU can run, slowest first.
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        if Isa::Avx2.is_supported() {
            v.push(Isa::Avx2);
        }
        if Isa::Avx512.is_supported() {
            v.push(Isa::Avx512);
        }
        v
    }

    /// Whether this CPU (and this build) can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
                    && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(not(all(target_arch = "x86_64", edgefit_x86_kernels)))]
            _ => false,
        }
    }
}

/// Number of worker threads the kernels use by default: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Splits `0..n` into at most `threads` contiguous ranges, each a multiple of `align` long (except the last), and
/// runs `f(start, end)` on each, the first range on the calling thread. With one thread (or one range) no thread is
/// spawned.
pub fn parallel_ranges<F>(n: usize, align: usize, threads: usize, f: F)
where
    F: Fn(usize, usize) + Sync,
{
    let align = align.max(1);
    let units = n.div_ceil(align);
    let threads = threads.clamp(1, units.max(1));
    if threads <= 1 {
        if n > 0 {
            f(0, n);
        }
        return;
    }
    let per = units.div_ceil(threads);
    let ranges: Vec<(usize, usize)> = (0..threads)
        .map(|t| ((t * per * align).min(n), ((t + 1) * per * align).min(n)))
        .filter(|(s, e)| s < e)
        .collect();
    std::thread::scope(|s| {
        for &(start, end) in &ranges[1..] {
            let f = &f;
            s.spawn(move || f(start, end));
        }
        f(ranges[0].0, ranges[0].1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn parallel_ranges_cover_exactly_once() {
        for &(n, align, threads) in &[
            (0, 1, 4),
            (1, 64, 4),
            (1000, 64, 3),
            (130, 64, 8),
            (7, 1, 2),
        ] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            parallel_ranges(n, align, threads, |s, e| {
                assert!(s % align == 0, "range start {s} not aligned to {align}");
                for h in &hits[s..e] {
                    h.fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "n={n} align={align} threads={threads}"
            );
        }
    }

    #[test]
    fn detected_is_the_fastest_available() {
        assert_eq!(Some(&Isa::detected()), Isa::available().last());
    }
}
