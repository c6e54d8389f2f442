//! Prediction: decode and prefill rates from bytes, FLOPs and the profile's measured rates, and which term bound them.
//!
//! Decode at batch 1 reads every hot weight once per token, and pools are read one after the other on the critical
//! path, so the step is the sum of one term per pool (BRIEF §2; seed 000 §5 measured `resident/472 +
//! offloaded/10.6` within 5% over the FP8 offload sweep). On the decode unit's own pool the term is the largest of
//! the read time, the measured kernel time (seed 000 §6: NVFP4 on sm_120 is compute-bound, the byte model 4.7x
//! optimistic) and the arithmetic time; an offloaded pool's term is its bytes over the link's effective rate for
//! weight reads, or over the kernel's measured offload slope when that is slower. Prefill is the larger of the
//! arithmetic time and one pass over the resident weights, plus the offloaded bytes crossing the link once.
//!
//! Decode is predicted for one stream at the context where generation starts (`prompt_len` tokens), reading the
//! caches that context needs. With `max_num_seqs` above one, the plan also predicts a step that decodes that many
//! sequences at once ([`BatchedDecode`]): the weights are still read once per step, every sequence's cache and state
//! is read, and the arithmetic grows with the batch until it bounds the step. Two simplifications, both optimistic
//! for large batches: routed experts are charged at the one-sequence active fraction (a batch touches the union of
//! its tokens' experts), and gathered embedding rows once per step (a batch gathers one row per sequence, a few KiB).
//! No per-launch overhead is charged yet (issue 23 §3 asks for one; it needs a count of launches per step, which the
//! engine will own). With speculative decoding on, the MTP head's reads are charged to every step but the
//! accepted draft tokens are not credited: no acceptance rate has been measured on these models yet, so the
//! prediction is a floor, not an estimate of the speed-up.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::CacheBudget;
use crate::placement::Assignment;
use crate::profile::{ComputeUnit, DeviceProfile, WeightFormat};
use crate::weight_path::WeightPath;
use crate::workload::TargetEngine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    Bandwidth,
    Compute,
}

/// One term of a step: an amount of bytes or FLOPs over a rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Term {
    /// What the term is (`read pool vram`, `link dram->vram`, `measured nvfp4 kernel on rtx5090`, ...).
    pub name: String,
    pub kind: BoundKind,
    /// Bytes or FLOPs the term moves or computes.
    pub amount: f64,
    pub rate_per_s: f64,
    pub seconds: f64,
    /// False when another term of the same group is larger (they overlap; only the largest counts).
    pub counted: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    /// Single-stream decode rate at `decode_context` tokens of context.
    pub decode_tok_s: f64,
    pub prefill_tok_s: f64,
    /// The term that dominates decode, in words.
    pub bound: String,
    pub bound_kind: BoundKind,
    pub decode_step_s: f64,
    pub decode_context: u64,
    pub prefill_tokens: u64,
    pub prefill_bound: String,
    pub decode_terms: Vec<Term>,
    pub prefill_terms: Vec<Term>,
    /// The decode step at `max_num_seqs` sequences; absent when the workload decodes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batched: Option<BatchedDecode>,
}

/// A decode step over `batch` sequences at once, each at `decode_context` tokens of context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchedDecode {
    pub batch: u64,
    pub step_s: f64,
    /// Tokens per second each sequence sees (`1 / step_s`).
    pub per_sequence_tok_s: f64,
    /// Tokens per second over the batch (`batch / step_s`).
    pub aggregate_tok_s: f64,
    /// The term that dominates the batched step, in words.
    pub bound: String,
    pub bound_kind: BoundKind,
    /// The smallest batch at which the arithmetic term becomes the largest on the decode pool (compute takes over
    /// from the weight and cache reads); absent when it never does (each sequence adds more bytes than FLOPs' time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_bound_from_batch: Option<u64>,
    pub terms: Vec<Term>,
}

/// Inputs of the prediction besides the placement.
pub struct Work<'a> {
    pub cache: &'a CacheBudget,
    pub decode_flops_per_token: u64,
    pub prefill_flops: u64,
    pub prefill_tokens: u64,
    pub decode_context: u64,
    /// Sequences decoded together in the batched prediction (`max_num_seqs`).
    pub batch: u64,
    /// Kernels one decode step runs ([`crate::model::decode_kernels`]); each costs at least the unit's
    /// `kernel_floor_s`, whatever its work.
    pub decode_kernels: u64,
    /// The engine that runs the plan: its own measured kernel rates apply, never another engine's.
    pub engine: TargetEngine,
}

fn term(name: String, kind: BoundKind, amount: f64, rate: f64) -> Term {
    Term {
        name,
        kind,
        amount,
        rate_per_s: rate,
        seconds: amount / rate,
        counted: true,
    }
}

/// Keep only the largest term of a group counted; returns its index.
fn overlap(terms: &mut [Term]) -> usize {
    let mut best = 0;
    for i in 1..terms.len() {
        if terms[i].seconds > terms[best].seconds {
            best = i;
        }
    }
    for (i, t) in terms.iter_mut().enumerate() {
        t.counted = i == best;
    }
    best
}

/// How a kernel rate's terms are named: `measured`, or `extrapolated` when the profile carried it over from other
/// hardware.
fn measured_or_extrapolated(k: &crate::profile::KernelRate) -> &'static str {
    if k.extrapolated {
        "extrapolated"
    } else {
        "measured"
    }
}

/// The arithmetic rate the unit sustains on this path: a measured prefill rate if the profile has one, else the
/// peak of the dtype the path computes in, else the best declared peak.
fn arithmetic_rate(unit: &ComputeUnit, path: &WeightPath, engine: TargetEngine) -> (f64, String) {
    if let Some(k) = path.kernel_rate(unit, engine) {
        let int8 = path
            .prefill
            .as_ref()
            .is_some_and(|p| p.activations == crate::weight_path::PrefillActivations::Int8);
        if let (true, Some(r)) = (int8, &k.prefill_int8_flops_per_s) {
            return (
                r.value,
                format!(
                    "{} {:?} prefill rate with int8 activations on `{}`",
                    measured_or_extrapolated(k),
                    path.format,
                    unit.id
                ),
            );
        }
        if let Some(r) = &k.prefill_flops_per_s {
            return (
                r.value,
                format!(
                    "{} {:?} prefill rate on `{}`",
                    measured_or_extrapolated(k),
                    path.format,
                    unit.id
                ),
            );
        }
    }
    let p = &unit.peak;
    let by_format = match path.format {
        WeightFormat::Fp8Block | WeightFormat::Nvfp4 => {
            p.fp8_flops_per_s.as_ref().or(p.bf16_flops_per_s.as_ref())
        }
        WeightFormat::W4a8 | WeightFormat::W8a16 => {
            p.int8_ops_per_s.as_ref().or(p.bf16_flops_per_s.as_ref())
        }
        _ => p.bf16_flops_per_s.as_ref(),
    };
    let any = by_format
        .or(p.bf16_flops_per_s.as_ref())
        .or(p.fp32_flops_per_s.as_ref())
        .or(p.fp8_flops_per_s.as_ref())
        .or(p.int8_ops_per_s.as_ref());
    match any {
        Some(m) => (m.value, format!("peak arithmetic on `{}`", unit.id)),
        // `parse_profile` requires a peak on engine units; an export target without one gets a rate that never binds.
        None => (
            f64::INFINITY,
            format!("no arithmetic rate declared on `{}`", unit.id),
        ),
    }
}

pub fn predict(
    profile: &DeviceProfile,
    path: &WeightPath,
    a: &Assignment,
    work: &Work<'_>,
) -> Prediction {
    let unit = profile
        .compute
        .iter()
        .find(|c| c.id == path.unit)
        .unwrap_or_else(|| profile.decode_unit());
    let primary = &profile.pools[a.primary];
    let kernel = path.kernel_rate(unit, work.engine);
    let (flop_rate, flop_what) = arithmetic_rate(unit, path, work.engine);

    // Decode, decode unit's own pool: weights read once per step plus each sequence's caches at the decode context;
    // the arithmetic is per sequence. The measured kernel rate was taken at one sequence: it is charged on the
    // weights, once per step, at every batch, and, where the profile measured how the step grows with context, on
    // every sequence's caches at the measured cache rate.
    let cache_read = work.cache.bytes_per_token_hybrid as f64 * work.decode_context as f64
        + work.cache.state_bytes_per_seq as f64;
    let weights = a.per_token_in(a.primary) as f64;
    let kernel_cache_rate = kernel
        .and_then(|k| k.decode_cache_bytes_per_s.as_ref())
        .map(|r| r.value);
    // Seconds of the measured kernel term: the weights (once per step), then each sequence's caches.
    let kernel_s = |batch: f64| {
        kernel.map(|k| {
            weights / k.decode_weight_bytes_per_s.value
                + kernel_cache_rate.map_or(0.0, |r| batch * cache_read / r)
        })
    };
    let primary_group = |batch: f64| {
        let mut group = vec![term(
            format!("read pool `{}`", primary.id),
            BoundKind::Bandwidth,
            weights + batch * cache_read,
            primary.read_bytes_per_s.value,
        )];
        if let (Some(k), Some(seconds)) = (kernel, kernel_s(batch)) {
            let mut t = term(
                format!(
                    "{} {:?} kernel rate on `{}` (resident weights)",
                    measured_or_extrapolated(k),
                    path.format,
                    unit.id
                ),
                BoundKind::Compute,
                weights,
                k.decode_weight_bytes_per_s.value,
            );
            if let Some(r) = kernel_cache_rate {
                // One term, weights then caches: its rate is the effective rate over both.
                t.name = format!(
                    "{} {:?} kernel rate on `{}` (resident weights at {:.3e} B/s, then caches at {:.3e} B/s)",
                    measured_or_extrapolated(k),
                    path.format,
                    unit.id,
                    k.decode_weight_bytes_per_s.value,
                    r
                );
                t.amount = weights + batch * cache_read;
                t.seconds = seconds;
                t.rate_per_s = if seconds > 0.0 { t.amount / seconds } else { r };
            }
            group.push(t);
        }
        group.push(term(
            flop_what.clone(),
            BoundKind::Compute,
            batch * work.decode_flops_per_token as f64,
            flop_rate,
        ));
        if let Some(floor) = &unit.kernel_floor_s {
            // Kernels per step over kernels per second: the step of a model too small to fill its kernels.
            group.push(term(
                format!(
                    "kernel floor on `{}` ({} kernels per step x {:.2e} s)",
                    unit.id, work.decode_kernels, floor.value
                ),
                BoundKind::Compute,
                work.decode_kernels as f64,
                1.0 / floor.value,
            ));
        }
        overlap(&mut group);
        group
    };
    let mut decode_terms = primary_group(1.0);
    let mut offloaded_terms = Vec::new();
    if let Some(sec) = a.secondary {
        let bytes = a.per_token_in(sec) as f64;
        let from = &profile.pools[sec];
        let link = profile.link(&from.id, &primary.id);
        let link_rate = link.map_or(from.read_bytes_per_s.value, |l| {
            l.weight_read_bytes_per_s.value
        });
        let mut off = vec![term(
            format!(
                "link `{}`->`{}` (offloaded weight reads)",
                from.id, primary.id
            ),
            BoundKind::Bandwidth,
            bytes,
            link_rate,
        )];
        if let Some((k, r)) =
            kernel.and_then(|k| k.offloaded_weight_bytes_per_s.as_ref().map(|r| (k, r)))
        {
            off.push(term(
                format!(
                    "{} {:?} kernel rate on `{}` (offloaded weights)",
                    measured_or_extrapolated(k),
                    path.format,
                    unit.id
                ),
                BoundKind::Compute,
                bytes,
                r.value,
            ));
        }
        overlap(&mut off);
        offloaded_terms = off;
    }
    decode_terms.extend(offloaded_terms.iter().cloned());
    let (step, dominant) = step_and_dominant(&decode_terms);
    let bound = describe(&dominant);
    let batched = (work.batch > 1).then(|| {
        let mut terms = primary_group(work.batch as f64);
        terms.extend(offloaded_terms.iter().cloned());
        let (step_s, dominant) = step_and_dominant(&terms);
        // A term that costs `fixed + B * per_seq` is overtaken by the arithmetic's `B * F / r` from B >= fixed /
        // (F / r - per_seq), and never when each sequence adds at least as much to it as to the arithmetic: the reads
        // (W / bw, C / bw) and the measured kernel (W / kw, C / kc when the cache rate was measured, else 0).
        let bw = primary.read_bytes_per_s.value;
        let flop_s = work.decode_flops_per_token as f64 / flop_rate;
        let mut rivals = vec![(weights / bw, cache_read / bw)];
        if let (Some(k), Some(_)) = (kernel, kernel_s(1.0)) {
            rivals.push((
                weights / k.decode_weight_bytes_per_s.value,
                kernel_cache_rate.map_or(0.0, |r| cache_read / r),
            ));
        }
        let compute_bound_from_batch = rivals
            .iter()
            .try_fold(1.0f64, |b, &(fixed, per_seq)| {
                let over = flop_s - per_seq;
                (over > 0.0).then(|| b.max((fixed / over).ceil()))
            })
            .filter(|b| b.is_finite() && *b <= 9.0e15)
            .map(|b| b as u64);
        BatchedDecode {
            batch: work.batch,
            step_s,
            per_sequence_tok_s: if step_s > 0.0 { 1.0 / step_s } else { 0.0 },
            aggregate_tok_s: if step_s > 0.0 {
                work.batch as f64 / step_s
            } else {
                0.0
            },
            bound: describe(&dominant),
            bound_kind: dominant.kind,
            compute_bound_from_batch,
            terms,
        }
    });

    // Prefill: one pass over the weights for the whole prompt (the vision tower too when prompts carry images),
    // overlapped with the arithmetic; the offloaded bytes cross the link once.
    let pass_bytes = a.prefill_in(a.primary) as f64;
    let mut pre = vec![
        term(
            format!("read pool `{}`", primary.id),
            BoundKind::Bandwidth,
            pass_bytes,
            primary.read_bytes_per_s.value,
        ),
        term(
            flop_what.clone(),
            BoundKind::Compute,
            work.prefill_flops as f64,
            flop_rate,
        ),
    ];
    overlap(&mut pre);
    if let Some(sec) = a.secondary {
        let from = &profile.pools[sec];
        let rate = profile
            .link(&from.id, &primary.id)
            .map_or(from.read_bytes_per_s.value, |l| {
                l.weight_read_bytes_per_s.value
            });
        pre.push(term(
            format!(
                "link `{}`->`{}` (offloaded weight reads)",
                from.id, primary.id
            ),
            BoundKind::Bandwidth,
            a.prefill_in(sec) as f64,
            rate,
        ));
    }
    let pre_s: f64 = pre.iter().filter(|t| t.counted).map(|t| t.seconds).sum();
    let pre_dominant = pre
        .iter()
        .filter(|t| t.counted)
        .max_by(|x, y| x.seconds.total_cmp(&y.seconds))
        .cloned()
        .unwrap_or_else(|| pre[0].clone());

    Prediction {
        decode_tok_s: if step > 0.0 { 1.0 / step } else { 0.0 },
        prefill_tok_s: if pre_s > 0.0 {
            work.prefill_tokens as f64 / pre_s
        } else {
            0.0
        },
        bound,
        bound_kind: dominant.kind,
        decode_step_s: step,
        decode_context: work.decode_context,
        prefill_tokens: work.prefill_tokens,
        prefill_bound: describe(&pre_dominant),
        decode_terms,
        prefill_terms: pre,
        batched,
    }
}

/// A step's time (the counted terms, serial) and its dominant term.
fn step_and_dominant(terms: &[Term]) -> (f64, Term) {
    let step = terms.iter().filter(|t| t.counted).map(|t| t.seconds).sum();
    let dominant = terms
        .iter()
        .filter(|t| t.counted)
        .max_by(|x, y| x.seconds.total_cmp(&y.seconds))
        .or(terms.first())
        .cloned()
        .unwrap_or_else(|| term(String::new(), BoundKind::Bandwidth, 0.0, 1.0));
    (step, dominant)
}

fn describe(t: &Term) -> String {
    let share = match t.kind {
        BoundKind::Compute if t.name.starts_with("measured ") => {
            "compute-bound (measured kernel rate)"
        }
        BoundKind::Compute if t.name.starts_with("extrapolated ") => {
            "compute-bound (kernel rate carried over from other hardware, unverified)"
        }
        BoundKind::Compute if t.name.starts_with("kernel floor") => {
            "launch-bound (kernels too small to fill)"
        }
        BoundKind::Compute => "compute-bound (arithmetic)",
        BoundKind::Bandwidth => "bandwidth-bound",
    };
    format!("{share}: {}", t.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::{CacheBudget, SlidingAccounting};
    use crate::placement::place;
    use crate::testutil::{small_model, two_pools};
    use crate::weight_path::choose;
    use crate::workload::Workload;

    fn no_cache() -> CacheBudget {
        CacheBudget {
            bytes_per_token_flat: 0,
            bytes_per_token_hybrid: 0,
            state_bytes_per_seq: 0,
            flat_total_bytes: 0,
            total_bytes: 0,
            flat_over_hybrid: 1.0,
            headroom: 1.0,
            sliding_accounting: SlidingAccounting::Ring,
            rope_tables: crate::model::RopeTables::PerCall,
            rope_table_dtype: crate::model::DType::Bf16,
            rope_table_bytes: 0,
            rope_table_bytes_uncapped: 0,
            per_kind: vec![],
        }
    }

    fn predict_small(profile: &DeviceProfile, w: &Workload) -> Prediction {
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            w,
        );
        let a = place(&small_model(), &path, profile, w, 0);
        let cache = no_cache();
        let work = Work {
            cache: &cache,
            decode_flops_per_token: 100,
            prefill_flops: 1000,
            prefill_tokens: 10,
            decode_context: 10,
            batch: 1,
            decode_kernels: 0,
            engine: TargetEngine::Edgefit,
        };
        predict(profile, &path, &a, &work)
    }

    #[test]
    fn a_batch_reads_the_weights_once_and_every_sequences_cache() {
        let profile = two_pools(10_000, 10_000);
        let w = Workload::default();
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            &w,
        );
        let a = place(&small_model(), &path, &profile, &w, 0);
        // 5 bytes of state per sequence (0.05 s at 100 B/s) and 1e5 FLOP per token (0.1 s at 1e6 FLOP/s); 501 bytes
        // of weights (5.01 s) read once per step.
        let cache = CacheBudget {
            state_bytes_per_seq: 5,
            ..no_cache()
        };
        let at = |batch: u64| {
            predict(
                &profile,
                &path,
                &a,
                &Work {
                    cache: &cache,
                    decode_flops_per_token: 100_000,
                    prefill_flops: 1000,
                    prefill_tokens: 10,
                    decode_context: 10,
                    batch,
                    decode_kernels: 0,
                    engine: TargetEngine::Edgefit,
                },
            )
        };
        assert!(at(1).batched.is_none(), "one sequence: no batched figure");
        let p = at(8);
        let b = p.batched.unwrap();
        // (501 + 8 x 5) / 100 = 5.41 s against 8 x 0.1 = 0.8 s of arithmetic.
        assert!((b.step_s - 5.41).abs() < 1e-9, "{}", b.step_s);
        assert!((b.aggregate_tok_s - 8.0 / 5.41).abs() < 1e-9);
        assert!((b.per_sequence_tok_s - 1.0 / 5.41).abs() < 1e-9);
        assert_eq!(b.bound_kind, BoundKind::Bandwidth);
        // Arithmetic overtakes the reads at B >= 5.01 / (0.1 - 0.05) = 100.2.
        assert_eq!(b.compute_bound_from_batch, Some(101));
        let b = at(101).batched.unwrap();
        assert_eq!(b.bound_kind, BoundKind::Compute, "{}", b.bound);
        assert!((b.step_s - 10.1).abs() < 1e-9, "{}", b.step_s);
        let b = at(100).batched.unwrap();
        assert_eq!(b.bound_kind, BoundKind::Bandwidth, "{}", b.bound);
        // A sequence that adds more read time than arithmetic never turns compute-bound.
        let heavy = CacheBudget {
            state_bytes_per_seq: 50,
            ..no_cache()
        };
        let p = predict(
            &profile,
            &path,
            &a,
            &Work {
                cache: &heavy,
                decode_flops_per_token: 100_000,
                prefill_flops: 1000,
                prefill_tokens: 10,
                decode_context: 10,
                batch: 64,
                decode_kernels: 0,
                engine: TargetEngine::Edgefit,
            },
        );
        assert_eq!(p.batched.unwrap().compute_bound_from_batch, None);
    }

    #[test]
    fn resident_decode_is_hot_bytes_over_bandwidth() {
        // Everything fits: 500 hot bytes (4 layers + lm_head) + 1 gathered byte at 100 B/s = 5.01 s.
        let p = predict_small(&two_pools(10_000, 10_000), &Workload::default());
        assert!((p.decode_step_s - 5.01).abs() < 1e-9, "{}", p.decode_step_s);
        assert_eq!(p.bound_kind, BoundKind::Bandwidth);
        assert!(p.bound.contains("read pool `vram`"));
    }

    #[test]
    fn offloaded_bytes_pay_the_link_rate() {
        // 150 bytes pinned off (layers 0 and 1 = 200 bytes): 301 resident at 100 B/s + 200 over the link at 5 B/s.
        let w = Workload {
            offload_bytes: Some(150),
            ..Workload::default()
        };
        let p = predict_small(&two_pools(10_000, 10_000), &w);
        assert!(
            (p.decode_step_s - (3.01 + 40.0)).abs() < 1e-9,
            "{}",
            p.decode_step_s
        );
        assert!(p.bound.contains("link `host`->`vram`"), "{}", p.bound);
    }

    #[test]
    fn a_measured_kernel_rate_below_bandwidth_binds() {
        let mut profile = two_pools(10_000, 10_000);
        profile.compute[0].kernels.push(crate::profile::KernelRate {
            format: crate::profile::WeightFormat::Fp8Block,
            engine: None,
            extrapolated: false,
            decode_cache_bytes_per_s: None,
            decode_weight_bytes_per_s: crate::profile::Measured {
                value: 10.0,
                source: "t".into(),
            },
            offloaded_weight_bytes_per_s: None,
            prefill_flops_per_s: None,
            prefill_int8_flops_per_s: None,
        });
        let p = predict_small(&profile, &Workload::default());
        assert!((p.decode_step_s - 50.1).abs() < 1e-9, "{}", p.decode_step_s);
        assert!(
            p.bound.starts_with("compute-bound (measured kernel rate)"),
            "{}",
            p.bound
        );
    }

    #[test]
    fn prefill_is_arithmetic_or_one_weight_pass() {
        // 1000 FLOP at 1e6 FLOP/s = 1 ms; one pass over 501 bytes at 100 B/s = 5.01 s binds; 10 tokens.
        let p = predict_small(&two_pools(10_000, 10_000), &Workload::default());
        assert!(
            (p.prefill_tok_s - 10.0 / 5.01).abs() < 1e-9,
            "{}",
            p.prefill_tok_s
        );
    }

    #[test]
    fn images_add_the_vision_tower_to_prefill_only() {
        let plain = predict_small(&two_pools(10_000, 10_000), &Workload::default());
        let w = Workload {
            images: true,
            ..Workload::default()
        };
        let images = predict_small(&two_pools(10_000, 10_000), &w);
        assert_eq!(images.decode_step_s, plain.decode_step_s);
        // The 50-byte tower joins the 501-byte pass: 5.51 s for 10 tokens.
        assert!(
            (images.prefill_tok_s - 10.0 / 5.51).abs() < 1e-9,
            "{}",
            images.prefill_tok_s
        );
    }

    #[test]
    fn overlap_counts_only_the_largest() {
        let mut g = vec![
            term("a".into(), BoundKind::Bandwidth, 2.0, 1.0),
            term("b".into(), BoundKind::Compute, 3.0, 1.0),
        ];
        assert_eq!(overlap(&mut g), 1);
        assert!(!g[0].counted && g[1].counted);
    }

    #[test]
    fn a_small_model_on_a_big_gpu_is_bound_by_its_kernel_count() {
        // 26 layers x 12 + 4 kernels at 2.5 us: 0.79 ms, above the 0.48 ms of reading a 2 GB model at 4.2 TB/s.
        let reads = term(
            "read pool `hbm`".into(),
            BoundKind::Bandwidth,
            2.0e9,
            4.2e12,
        );
        let floor = term(
            "kernel floor on `h200` (316 kernels per step x 2.50e-6 s)".into(),
            BoundKind::Compute,
            316.0,
            1.0 / 2.5e-6,
        );
        let mut group = vec![reads, floor];
        overlap(&mut group);
        let (step, dominant) = step_and_dominant(&group);
        assert!((step - 316.0 * 2.5e-6).abs() < 1e-12, "{step}");
        assert!(
            describe(&dominant).starts_with("launch-bound"),
            "{}",
            describe(&dominant)
        );
    }

    #[test]
    fn describe_names_the_measured_kernel() {
        let t = term(
            "measured Nvfp4 kernel rate on `gpu` (resident weights)".into(),
            BoundKind::Compute,
            1.0,
            1.0,
        );
        assert!(describe(&t).starts_with("compute-bound (measured kernel rate)"));
    }
}
