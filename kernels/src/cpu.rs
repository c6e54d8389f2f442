//! Run-time CPU dispatch and the threading helper the CPU kernels share ([`parallel_ranges`], over a persistent
//! worker pool).
//!
//! The instruction set is probed once ([`Isa::detected`]). The safe entry points of each kernel module take an
//! explicit [`Isa`] in their `_with` form so tests can run every path this machine has ([`Isa::available`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::KernelError;

pub use crate::isa::Isa;

/// Whether this CPU (and this build) can run the AVX-512 kernels' VBMI variants (`vpermb`, `vpermt2b`,
/// `vpmultishiftqb`): Ice Lake and later, Zen 4 and later; not Skylake-X / Cascade Lake. Those variants are
/// reported as [`Isa::Avx512`] plus a flag (see `kernels::linear::Ran`), not as an `Isa` of their own, so every
/// `match` on `Isa` stays as it is. Probed once per process.
pub fn has_avx512_vbmi() -> bool {
    static VBMI: OnceLock<bool> = OnceLock::new();
    *VBMI.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", edgefit_x86_kernels))]
        {
            Isa::Avx512.is_supported() && std::arch::is_x86_feature_detected!("avx512vbmi")
        }
        #[cfg(not(all(target_arch = "x86_64", edgefit_x86_kernels)))]
        {
            false
        }
    })
}

/// Number of worker threads the kernels use by default: the machine's available parallelism, read once.
/// `available_parallelism` reads the cgroup quota files on Linux on every call (~25 us, measured by the engine's
/// step profile), which every kernel call paid before this was cached: 5-6 ms of a 40 ms decode step.
pub fn default_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// The ranges `parallel_ranges` cuts `0..n` into: at most `threads` contiguous, non-empty ranges, each a multiple
/// of `align` long (except the last). Empty for `n = 0`.
fn split_ranges(n: usize, align: usize, threads: usize) -> Vec<(usize, usize)> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let threads = threads.clamp(1, units.max(1));
    let per = units.div_ceil(threads);
    (0..threads)
        // Saturating: for `n` near `usize::MAX` the last range's nominal end passes it and is clamped to `n`.
        .map(|t| {
            let at = |t: usize| t.saturating_mul(per).saturating_mul(align).min(n);
            (at(t), at(t + 1))
        })
        .filter(|(s, e)| s < e)
        .collect()
}

/// Splits `0..n` into at most `threads` contiguous ranges, each a multiple of `align` long (except the last), and
/// runs `f(start, end)` once on each: the calling thread takes ranges too, the others go to the process-wide
/// worker pool ([`pool_workers`] threads, started on first use and parked between calls). With one thread (or
/// one range) everything runs on the calling thread and the pool is not touched.
///
/// Every range runs exactly once, and the call returns only after all of them finished. Ranges are claimed one
/// at a time from a shared counter, by the caller and by whichever workers are free, so the call completes even
/// when no worker is (nested calls from inside `f`, several threads calling at once, more ranges than workers):
/// the caller then runs the remaining ranges itself. If `f` panics on any range, the other ranges still run to
/// completion and the first panic is then resumed on the calling thread (as `std::thread::scope` does); the
/// workers survive it.
///
/// Why a pool: the decode loop calls this for every projection, and spawning scoped threads costs tens of
/// microseconds per call (measured in `benches/cpu_gemv.rs`, "threading overhead"), which is the whole run time
/// of a small projection. [`parallel_ranges_scoped`] keeps the spawning version for that comparison.
pub fn parallel_ranges<F>(n: usize, align: usize, threads: usize, f: F)
where
    F: Fn(usize, usize) + Sync,
{
    let ranges = split_ranges(n, align, threads);
    match ranges.len() {
        0 => {}
        1 => f(ranges[0].0, ranges[0].1),
        _ => pool::run(&ranges, &f),
    }
}

/// The same contract as [`parallel_ranges`], with one scoped thread spawned per range beyond the first on every
/// call (the implementation before the pool). Kept for the overhead comparison in the benchmark and as a fallback
/// that never shares threads with other callers.
pub fn parallel_ranges_scoped<F>(n: usize, align: usize, threads: usize, f: F)
where
    F: Fn(usize, usize) + Sync,
{
    let ranges = split_ranges(n, align, threads);
    if ranges.len() <= 1 {
        if let Some(&(s, e)) = ranges.first() {
            f(s, e);
        }
        return;
    }
    std::thread::scope(|sc| {
        for &(start, end) in &ranges[1..] {
            let f = &f;
            sc.spawn(move || f(start, end));
        }
        f(ranges[0].0, ranges[0].1);
    });
}

/// Number of worker threads of the pool behind [`parallel_ranges`]: [`default_threads`] - 1 (the caller is the
/// other one), at least 1.
pub fn pool_workers() -> usize {
    default_threads().saturating_sub(1).max(1)
}

mod pool {
    //! The worker pool of `parallel_ranges`: std only (Mutex, Condvar, atomics).
    //!
    //! A call publishes one `Job` (its ranges, a claim counter, a completion counter) on a shared queue and wakes
    //! as many workers as it has ranges beyond its own. Workers and the caller claim range indices with a
    //! `fetch_add`; whoever claims index `i < len` runs range `i`, so each range runs exactly once. A worker that
    //! finds the claims exhausted drops the job from the queue and waits for the next. Workers spin briefly before
    //! sleeping on the condition variable, and so does the caller before sleeping on the job's, because the decode
    //! loop issues calls back to back and a futex wake-up costs more than a small projection.
    //!
    //! Lifetimes: the job holds `f` as a lifetime-erased pointer. It is dereferenced only by the holder of a
    //! successful claim, and the caller does not return before every claimed range has finished (the completion
    //! counter reaches `len`), so `f` outlives every use. Late workers still holding the `Arc<Job>` only read its
    //! counters, which the `Arc` keeps alive.

    use std::any::Any;
    use std::collections::VecDeque;
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex, OnceLock};
    use std::time::{Duration, Instant};

    type Task = dyn Fn(usize, usize) + Sync;

    /// How long a worker (for the next job) or a waiting caller (for the other ranges) spins before it blocks.
    /// Long enough to cover the gap between the projections of one layer, short enough not to take a shared core
    /// for long when the engine goes idle.
    const SPIN: Duration = Duration::from_micros(50);

    /// Spins (with the CPU's pause hint) until `ready()` or `SPIN` has passed; returns `ready()`.
    fn spin_until(ready: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                if ready() {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= SPIN {
                return ready();
            }
        }
    }

    struct Job {
        /// `&Task` with its lifetime erased; see the module comment for why every dereference is in bounds.
        f: *const Task,
        ranges: Vec<(usize, usize)>,
        next: AtomicUsize,
        done: AtomicUsize,
        /// The first panic payload of a range, resumed by the caller.
        panic: Mutex<Option<Box<dyn Any + Send>>>,
        /// Wakes the caller when `done` reaches `ranges.len()` (paired with `finished`).
        finished: Mutex<bool>,
        wake: Condvar,
    }

    // SAFETY: `f` points to a `Sync` closure (shareable across threads by definition) that outlives every
    // dereference (module comment); every other field is Send + Sync.
    unsafe impl Send for Job {}
    // SAFETY: as above.
    unsafe impl Sync for Job {}

    impl Job {
        /// Claims and runs ranges until none is left; returns how many this thread ran.
        fn work(&self) -> usize {
            let mut ran = 0;
            loop {
                let i = self.next.fetch_add(1, Ordering::AcqRel);
                let Some(&(s, e)) = self.ranges.get(i) else {
                    return ran;
                };
                // SAFETY: claim `i` is valid, so the caller is still inside `run`, waiting for `done` to count this
                // range, and the closure behind `f` is alive.
                let f = unsafe { &*self.f };
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(s, e))) {
                    let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                    if slot.is_none() {
                        *slot = Some(p);
                    }
                }
                ran += 1;
                if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.ranges.len() {
                    let mut fin = self.finished.lock().unwrap_or_else(|e| e.into_inner());
                    *fin = true;
                    self.wake.notify_all();
                }
            }
        }

        fn exhausted(&self) -> bool {
            self.next.load(Ordering::Acquire) >= self.ranges.len()
        }
    }

    struct Pool {
        queue: Mutex<VecDeque<Arc<Job>>>,
        available: Condvar,
        /// Jobs published so far; spinning workers watch it instead of taking the lock.
        posted: AtomicUsize,
        workers: usize,
    }

    fn pool() -> &'static Pool {
        static POOL: OnceLock<&'static Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let workers = super::pool_workers();
            let p: &'static Pool = Box::leak(Box::new(Pool {
                queue: Mutex::new(VecDeque::new()),
                available: Condvar::new(),
                posted: AtomicUsize::new(0),
                workers,
            }));
            for i in 0..workers {
                // A worker that cannot be started only means less parallelism: callers run unclaimed ranges.
                let _ = std::thread::Builder::new()
                    .name(format!("edgefit-cpu-{i}"))
                    .spawn(move || worker(p));
            }
            p
        })
    }

    fn worker(p: &'static Pool) {
        let mut seen = p.posted.load(Ordering::Acquire);
        loop {
            // Spin a while for the next job before sleeping.
            spin_until(|| p.posted.load(Ordering::Acquire) != seen);
            let job = {
                let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    while q.front().is_some_and(|j| j.exhausted()) {
                        q.pop_front();
                    }
                    if let Some(j) = q.front() {
                        // Read under the lock (posts increment it under the lock too), so any job published
                        // after this one ends the next spin at once.
                        seen = p.posted.load(Ordering::Acquire);
                        break Arc::clone(j);
                    }
                    q = p.available.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            job.work();
        }
    }

    /// Runs every range of `ranges` (at least two) through the pool and the calling thread; see
    /// `parallel_ranges`.
    pub(super) fn run(ranges: &[(usize, usize)], f: &(dyn Fn(usize, usize) + Sync)) {
        let p = pool();
        // SAFETY: only the lifetime is erased (same fat-pointer layout); `run` waits below until every claimed
        // range has finished, so no dereference outlives `f` (module comment).
        let f: *const Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static Task>(f) };
        let job = Arc::new(Job {
            f,
            ranges: ranges.to_vec(),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            finished: Mutex::new(false),
            wake: Condvar::new(),
        });
        let helpers = (ranges.len() - 1).min(p.workers);
        {
            let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(Arc::clone(&job));
            p.posted.fetch_add(1, Ordering::AcqRel);
        }
        if helpers >= p.workers {
            p.available.notify_all();
        } else {
            for _ in 0..helpers {
                p.available.notify_one();
            }
        }
        job.work();
        // Every range is claimed now; wait for the ones other threads are running.
        let len = ranges.len();
        if !spin_until(|| job.done.load(Ordering::Acquire) >= len) {
            let mut fin = job.finished.lock().unwrap_or_else(|e| e.into_inner());
            while !*fin {
                fin = job.wake.wait(fin).unwrap_or_else(|e| e.into_inner());
            }
        }
        {
            // Drop the exhausted job from the queue if no worker has yet.
            let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.retain(|j| !Arc::ptr_eq(j, &job));
        }
        let payload = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(payload) = payload {
            resume_unwind(payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Runs `parallel_ranges` (or the scoped version) and checks every index of `0..n` was visited exactly once,
    /// every range start aligned.
    fn check_cover(n: usize, align: usize, threads: usize, scoped: bool) {
        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let body = |s: usize, e: usize| {
            assert!(
                s.is_multiple_of(align),
                "range start {s} not aligned to {align}"
            );
            for h in &hits[s..e] {
                h.fetch_add(1, Ordering::Relaxed);
            }
        };
        if scoped {
            parallel_ranges_scoped(n, align, threads, body);
        } else {
            parallel_ranges(n, align, threads, body);
        }
        for (i, h) in hits.iter().enumerate() {
            let c = h.load(Ordering::Relaxed);
            assert!(
                c == 1,
                "index {i} visited {c} times (n={n} align={align} threads={threads} scoped={scoped})"
            );
        }
    }

    const COVER_CASES: [(usize, usize, usize); 8] = [
        (0, 1, 4),
        (1, 64, 4),
        (1000, 64, 3),
        (130, 64, 8),
        (7, 1, 2),
        (7, 1, 7),
        (4096, 1, 16),
        (100_000, 4, 2),
    ];

    #[test]
    fn parallel_ranges_cover_exactly_once() {
        for &(n, align, threads) in &COVER_CASES {
            check_cover(n, align, threads, false);
            check_cover(n, align, threads, true);
        }
    }

    #[test]
    fn pool_runs_ranges_on_other_threads() {
        // With two ranges that each wait (bounded) for the other to start, both must run at the same time: the
        // pool really runs work beside the caller (on a one-worker pool too).
        for _ in 0..20 {
            let started = AtomicUsize::new(0);
            let together = AtomicUsize::new(0);
            let ids = std::sync::Mutex::new(Vec::new());
            parallel_ranges(2, 1, 2, |_, _| {
                ids.lock().unwrap().push(std::thread::current().id());
                started.fetch_add(1, Ordering::SeqCst);
                let t = std::time::Instant::now();
                while started.load(Ordering::SeqCst) < 2 && t.elapsed().as_secs() < 5 {
                    std::hint::spin_loop();
                }
                if started.load(Ordering::SeqCst) == 2 {
                    together.fetch_add(1, Ordering::SeqCst);
                }
            });
            let ids = ids.into_inner().unwrap();
            assert_eq!(ids.len(), 2);
            if ids[0] != ids[1] {
                assert_eq!(together.load(Ordering::SeqCst), 2);
                return;
            }
        }
        panic!("20 two-range calls never ran a range on a pool worker");
    }

    #[test]
    fn nested_calls_complete_and_cover_exactly_once() {
        let outer = 6;
        let inner = 1000;
        let hits: Vec<AtomicUsize> = (0..outer * inner).map(|_| AtomicUsize::new(0)).collect();
        parallel_ranges(outer, 1, 3, |o0, o1| {
            for o in o0..o1 {
                parallel_ranges(inner, 16, 4, |s, e| {
                    for h in &hits[o * inner + s..o * inner + e] {
                        h.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn concurrent_callers_from_several_threads() {
        std::thread::scope(|sc| {
            for t in 0..4usize {
                sc.spawn(move || {
                    for i in 0..300usize {
                        let n = 1 + (i * 37 + t * 101) % 3000;
                        let threads = 1 + (i + t) % 5;
                        check_cover(n, 1 + i % 3, threads, false);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panic_in_a_range_reaches_the_caller_after_every_range_ran() {
        for &bad in &[0usize, 3, 7] {
            let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                parallel_ranges(8, 1, 8, |s, e| {
                    for (i, h) in hits.iter().enumerate().take(e).skip(s) {
                        h.fetch_add(1, Ordering::Relaxed);
                        if i == bad {
                            panic!("range task {i} fails on purpose");
                        }
                    }
                });
            }));
            let payload = r.expect_err("the panic must reach the caller");
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            assert!(msg.contains("fails on purpose"), "payload: {msg:?}");
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "every other range still ran once"
            );
        }
        // The pool keeps working afterwards.
        check_cover(10_000, 8, 2, false);
    }

    #[test]
    fn detected_is_the_fastest_available() {
        assert_eq!(Some(&Isa::detected()), Isa::available().last());
    }
}

/// A raw mutable pointer that the scoped worker threads of one call share, each writing a disjoint range through
/// it (the rows or columns [`parallel_ranges`] hands it).
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T>(pub(crate) *mut T);

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper rather than its raw field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: every user writes through it only inside `parallel_ranges`, whose ranges are disjoint and which returns
// after every range finished, so no element is written twice and the borrow behind the pointer outlives each use.
unsafe impl<T> Sync for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T> Send for SharedMut<T> {}

static ISA_CALLS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// How many sequence-kernel calls (GDN, attention, RoPE, small ops) ran code compiled for `isa`, counted from the
/// ISA tag each C entry point returns. Tests read it before and after a call to prove the fast path ran.
pub fn seq_isa_calls(isa: Isa) -> u64 {
    ISA_CALLS[isa as usize].load(Ordering::Relaxed)
}

/// Records the tag a C entry point returned (0 scalar, 1 AVX2, 2 AVX-512) and checks it is the path asked for.
pub(crate) fn record_isa(op: &'static str, asked: Isa, tag: i32) -> Result<(), KernelError> {
    let ran = match tag {
        0 => Isa::Scalar,
        1 => Isa::Avx2,
        2 => Isa::Avx512,
        _ => {
            return Err(KernelError::shape(
                op,
                format!("C kernel returned an unknown ISA tag {tag}"),
            ))
        }
    };
    ISA_CALLS[ran as usize].fetch_add(1, Ordering::Relaxed);
    crate::ensure_shape!(
        ran == asked,
        op,
        "asked for the {asked:?} path but code compiled for {ran:?} ran"
    );
    Ok(())
}
