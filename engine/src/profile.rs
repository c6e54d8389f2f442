//! The engine's own profile of a step: wall time per op family, summed over calls while enabled
//! (`edgefit bench` enables it and prints the table). It is what decides whether a kernel bounds a real model's
//! step (the rule for tuning a kernel again), so it times the calls the engine makes, with nothing in between.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Op families a step spends its time in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Every linear layer (projections, MLP, the head).
    Linear = 0,
    /// Attention kernels (prefill, paged and ring decode) and the K/V stores.
    Attention = 1,
    /// Gated DeltaNet kernels (chunked prefill, decode step).
    Gdn = 2,
    /// RMSNorms, RoPE, activations, gates, residual adds and copies.
    Small = 3,
    /// Embedding gather.
    Embed = 4,
    /// Waiting for a device to finish a step (a GPU step's kernels run asynchronously; their time shows here).
    Wait = 5,
}

const NAMES: [&str; 6] = [
    "linear",
    "attention",
    "gdn",
    "norms/rope/act/copies",
    "embed",
    "wait for device",
];
static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Starts counting (and clears what was counted).
pub fn enable() {
    for n in &NANOS {
        n.store(0, Ordering::Relaxed);
    }
    ON.store(true, Ordering::Relaxed);
}

/// Times the rest of the enclosing scope as `op` when profiling is on.
pub struct Span(Option<(Op, Instant)>);

pub fn span(op: Op) -> Span {
    Span(ON.load(Ordering::Relaxed).then(|| (op, Instant::now())))
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((op, t)) = self.0 {
            NANOS[op as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// Seconds per op family since [`enable`], with its name.
pub fn totals() -> Vec<(&'static str, f64)> {
    NAMES
        .iter()
        .zip(&NANOS)
        .map(|(n, v)| (*n, v.load(Ordering::Relaxed) as f64 * 1e-9))
        .collect()
}
