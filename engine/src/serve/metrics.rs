//! State shared between the HTTP side and the step loop, and its rendering as Prometheus text (`GET /metrics`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Latency buckets in seconds: from a fast decode step on a small model to a slow prefill on a large one.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A cumulative histogram with fixed bounds, lock-free.
pub(crate) struct Histogram {
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: BUCKETS.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, secs: f64) {
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            if secs <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_ns
            .fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count {n}");
    }
}

/// Counters, each the total since start.
pub(crate) struct Metrics {
    pub received: AtomicU64,
    pub invalid: AtomicU64,
    pub rejected_queue_full: AtomicU64,
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub cancelled: AtomicU64,
    pub errors: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
}

/// What both sides see.
pub(crate) struct Shared {
    /// Requests accepted and not yet running.
    pub queued: AtomicUsize,
    pub running: AtomicUsize,
    pub cache_pages_used: AtomicUsize,
    pub cache_pages: usize,
    pub cache_bytes: u64,
    pub slots: usize,
    pub metrics: Metrics,
}

impl Shared {
    pub(crate) fn new(slots: usize, cache_pages: usize, cache_bytes: u64) -> Shared {
        let c = || AtomicU64::new(0);
        Shared {
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            cache_pages_used: AtomicUsize::new(0),
            cache_pages,
            cache_bytes,
            slots,
            metrics: Metrics {
                received: c(),
                invalid: c(),
                rejected_queue_full: c(),
                finished_stop: c(),
                finished_length: c(),
                cancelled: c(),
                errors: c(),
                prompt_tokens: c(),
                generation_tokens: c(),
                ttft: Histogram::new(),
                itl: Histogram::new(),
            },
        }
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let m = &self.metrics;
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        one(
            "edgefit_requests_total",
            "counter",
            "Requests by outcome: received, finished (stop/length), cancelled by the client, rejected, failed",
            &[
                ("{outcome=\"received\"}", ld(&m.received)),
                ("{outcome=\"stop\"}", ld(&m.finished_stop)),
                ("{outcome=\"length\"}", ld(&m.finished_length)),
                ("{outcome=\"cancelled\"}", ld(&m.cancelled)),
                ("{outcome=\"invalid\"}", ld(&m.invalid)),
                ("{outcome=\"queue_full\"}", ld(&m.rejected_queue_full)),
                ("{outcome=\"error\"}", ld(&m.errors)),
            ],
        );
        one(
            "edgefit_prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled",
            &[("", ld(&m.prompt_tokens))],
        );
        one(
            "edgefit_generation_tokens_total",
            "counter",
            "Tokens generated",
            &[("", ld(&m.generation_tokens))],
        );
        one(
            "edgefit_queue_depth",
            "gauge",
            "Requests waiting for a slot",
            &[("", self.queued.load(Ordering::SeqCst) as f64)],
        );
        one(
            "edgefit_running_sequences",
            "gauge",
            "Sequences in the running batch",
            &[("", self.running.load(Ordering::SeqCst) as f64)],
        );
        one(
            "edgefit_max_num_seqs",
            "gauge",
            "Slots in the running batch (the plan's max_num_seqs)",
            &[("", self.slots as f64)],
        );
        let used = self.cache_pages_used.load(Ordering::Relaxed);
        one(
            "edgefit_kv_cache_usage_ratio",
            "gauge",
            "Share of the full-attention KV pages in use",
            &[(
                "",
                if self.cache_pages > 0 {
                    used as f64 / self.cache_pages as f64
                } else {
                    0.0
                },
            )],
        );
        one(
            "edgefit_kv_cache_pages",
            "gauge",
            "KV cache pages (16 tokens each): used and total",
            &[
                ("{state=\"used\"}", used as f64),
                ("{state=\"total\"}", self.cache_pages as f64),
            ],
        );
        one(
            "edgefit_cache_bytes",
            "gauge",
            "Bytes allocated for every layer's cache and state",
            &[("", self.cache_bytes as f64)],
        );
        m.ttft.render(
            "edgefit_time_to_first_token_seconds",
            "From the request's arrival to its first token",
            &mut out,
        );
        m.itl.render(
            "edgefit_inter_token_latency_seconds",
            "Between two tokens of one sequence",
            &mut out,
        );
        out
    }
}
