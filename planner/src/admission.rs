//! Admission: one ledger per memory pool that must add up, and a verdict. Each ledger charges, in order, what other
//! software already holds, the engine's runtime overhead, the reserve, the weights placed there, and the RoPE tables
//! and caches (on the decode pool only); what is left is free, and what is missing is the shortfall. The first
//! component that crosses the pool's capacity is the one the verdict names: the weights are the model's and come
//! first, so when the weights alone fit and the tables and caches (which grow with `max_model_len x max_num_seqs`)
//! push the pool over, the verdict says the cache grew, not the weights. The shortfall carries both figures.
//!
//! A pool that holds anything but declares no runtime-overhead budget fails closed: the verdict is `does-not-fit`
//! whatever the arithmetic says (BRIEF §2: a stage that declares no budget is refused). Which ledger applies is
//! decided by where the work is placed, never by where the planner runs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::placement::Assignment;
use crate::profile::DeviceProfile;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Fits,
    DoesNotFit,
}

/// One pool's accounts: `taken + runtime_overhead + reserve + cache + rope_tables + weights + prompt_scratch + free
/// == capacity + shortfall`, with at most one of `free` and `shortfall` above zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ledger {
    pub pool: String,
    pub capacity_bytes: u64,
    pub taken_bytes: u64,
    pub runtime_overhead_bytes: u64,
    pub reserve_bytes: u64,
    pub cache_bytes: u64,
    pub rope_table_bytes: u64,
    pub weight_bytes: u64,
    pub weight_tensors: u64,
    /// Prompt activations beyond what the runtime overhead holds (a chunk longer than the default, see
    /// [`crate::prompt_chunk`]); charged last, out of what was free.
    #[serde(default)]
    pub prompt_scratch_bytes: u64,
    pub free_bytes: u64,
    pub shortfall_bytes: u64,
    /// False when the pool declares no runtime-overhead budget.
    pub budget_declared: bool,
}

impl Ledger {
    /// Whether the accounts add up (the invariant every plan must keep).
    pub fn adds_up(&self) -> bool {
        let charged = u128::from(self.taken_bytes)
            + u128::from(self.runtime_overhead_bytes)
            + u128::from(self.reserve_bytes)
            + u128::from(self.cache_bytes)
            + u128::from(self.rope_table_bytes)
            + u128::from(self.weight_bytes)
            + u128::from(self.prompt_scratch_bytes)
            + u128::from(self.free_bytes);
        charged == u128::from(self.capacity_bytes) + u128::from(self.shortfall_bytes)
            && (self.free_bytes == 0 || self.shortfall_bytes == 0)
    }

    fn is_used(&self) -> bool {
        self.weight_bytes > 0 || self.cache_bytes > 0 || self.rope_table_bytes > 0
    }
}

/// Why a plan does not fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Shortfall {
    pub pool: String,
    /// The component that crossed the pool's capacity (`weights`, `cache`, ...), or `budget` when the pool declares
    /// none.
    pub component: String,
    pub shortfall_bytes: u64,
    pub reason: String,
    /// Weight bytes charged to the pool.
    #[serde(default)]
    pub weight_bytes: u64,
    /// Cache and RoPE-table bytes charged to the pool (they grow with `max_model_len x max_num_seqs`).
    #[serde(default)]
    pub cache_bytes: u64,
}

/// A piece of work and where it runs: which unit, reading which pool, and so charged to which ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// `decode` (every token) or `vision` (once per image, at prefill).
    pub name: String,
    /// The compute unit that runs it; absent when no unit that runs the engine reads the pool (the stage is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The pool whose ledger the stage's weights are charged to.
    pub pool: String,
    pub budget_declared: bool,
}

/// The stages of a plan: decode on the decode unit, and the vision tower (when prompts carry images) on the unit
/// that reads the pool the tower was placed in. BRIEF §2: the ledger that applies is decided by where the work is
/// placed. Returns the stages and, if one cannot run, why.
pub fn stages(
    profile: &DeviceProfile,
    a: &Assignment,
    decode_unit: &str,
    vision_tensors: &[usize],
) -> (Vec<Stage>, Option<Shortfall>) {
    let budget = |pool: usize| profile.pools[pool].runtime_overhead_bytes.is_some();
    let mut out = vec![Stage {
        name: "decode".into(),
        unit: Some(decode_unit.to_owned()),
        pool: profile.pools[a.primary].id.clone(),
        budget_declared: budget(a.primary),
    }];
    let mut refused = None;
    if !vision_tensors.is_empty() {
        // The pool holding most of the tower's bytes; ties go to the lower pool index (the profile's order).
        let mut bytes = vec![0u64; profile.pools.len()];
        for &i in vision_tensors {
            bytes[a.pool_of[i]] = bytes[a.pool_of[i]].saturating_add(a.planned[i]);
        }
        let pool = (0..bytes.len())
            .max_by_key(|&p| (bytes[p], std::cmp::Reverse(p)))
            .unwrap_or(a.primary);
        let id = &profile.pools[pool].id;
        let unit = if pool == a.primary {
            Some(decode_unit.to_owned())
        } else {
            profile
                .compute
                .iter()
                .filter(|c| c.runs_engine && c.pool == *id)
                .max_by(|x, y| peak(x).total_cmp(&peak(y)))
                .map(|c| c.id.clone())
        };
        if unit.is_none() {
            refused = Some(Shortfall {
                pool: id.clone(),
                component: "vision stage".into(),
                shortfall_bytes: 0,
                reason: format!(
                    "the vision tower is placed in `{id}` but no compute unit that runs the engine reads that pool: \
                     the stage has nowhere to run (fails closed)"
                ),
                weight_bytes: bytes[pool],
                cache_bytes: 0,
            });
        }
        out.push(Stage {
            name: "vision".into(),
            unit,
            pool: id.clone(),
            budget_declared: budget(pool),
        });
    }
    (out, refused)
}

fn gib(b: u64) -> f64 {
    b as f64 / crate::workload::Workload::GIB
}

fn peak(c: &crate::profile::ComputeUnit) -> f64 {
    let p = &c.peak;
    [
        &p.bf16_flops_per_s,
        &p.fp32_flops_per_s,
        &p.fp8_flops_per_s,
        &p.int8_ops_per_s,
    ]
    .into_iter()
    .flatten()
    .map(|m| m.value)
    .fold(0.0, f64::max)
}

/// Build the ledgers and the verdict.
pub fn admit(
    profile: &DeviceProfile,
    a: &Assignment,
    cache_bytes: u64,
    rope_table_bytes: u64,
) -> (Vec<Ledger>, Verdict, Option<Shortfall>) {
    let mut ledgers = Vec::with_capacity(profile.pools.len());
    let mut first: Option<Shortfall> = None;
    for (i, pool) in profile.pools.iter().enumerate() {
        let on_primary = i == a.primary;
        let overhead = pool.runtime_overhead_bytes.as_ref().map_or(0, |m| m.value);
        let weight_tensors = a.pool_of.iter().filter(|&&p| p == i).count() as u64;
        let components: [(&str, u64); 6] = [
            ("already taken", pool.taken_bytes.value),
            ("runtime overhead", overhead),
            ("reserve", pool.reserve_bytes.value),
            ("weights", a.bytes_in(i)),
            ("rope tables", if on_primary { rope_table_bytes } else { 0 }),
            ("cache", if on_primary { cache_bytes } else { 0 }),
        ];
        let capacity = pool.capacity_bytes.value;
        let mut running: u128 = 0;
        let mut crossing = None;
        for (name, bytes) in components {
            running += u128::from(bytes);
            if crossing.is_none() && running > u128::from(capacity) {
                crossing = Some(name);
            }
        }
        let (free, shortfall) = if running >= u128::from(capacity) {
            (
                0,
                u64::try_from(running - u128::from(capacity)).unwrap_or(u64::MAX),
            )
        } else {
            (capacity - running as u64, 0)
        };
        let ledger = Ledger {
            pool: pool.id.clone(),
            capacity_bytes: capacity,
            taken_bytes: components[0].1,
            runtime_overhead_bytes: overhead,
            reserve_bytes: components[2].1,
            weight_bytes: components[3].1,
            rope_table_bytes: components[4].1,
            cache_bytes: components[5].1,
            weight_tensors,
            prompt_scratch_bytes: 0,
            free_bytes: free,
            shortfall_bytes: shortfall,
            budget_declared: pool.runtime_overhead_bytes.is_some(),
        };
        if first.is_none() {
            if ledger.is_used() && !ledger.budget_declared {
                first = Some(Shortfall {
                    pool: pool.id.clone(),
                    component: "budget".into(),
                    shortfall_bytes: 0,
                    reason: format!(
                        "pool `{}` holds work but declares no runtime_overhead_bytes: admission fails closed",
                        pool.id
                    ),
                    weight_bytes: ledger.weight_bytes,
                    cache_bytes: ledger.cache_bytes.saturating_add(ledger.rope_table_bytes),
                });
            } else if let Some(name) = crossing {
                first = Some(Shortfall {
                    pool: pool.id.clone(),
                    component: name.replace(' ', "_"),
                    shortfall_bytes: shortfall,
                    reason: format!(
                        "{name} cross the capacity of `{}`: {shortfall} bytes ({:.2} GiB) short; charged: weights \
                         {:.2} GiB, cache and RoPE tables {:.2} GiB, already taken + overhead + reserve {:.2} GiB of \
                         {:.2} GiB",
                        pool.id,
                        gib(shortfall),
                        gib(ledger.weight_bytes),
                        gib(ledger.cache_bytes.saturating_add(ledger.rope_table_bytes)),
                        gib(ledger
                            .taken_bytes
                            .saturating_add(ledger.runtime_overhead_bytes)
                            .saturating_add(ledger.reserve_bytes)),
                        gib(capacity),
                    ),
                    weight_bytes: ledger.weight_bytes,
                    cache_bytes: ledger.cache_bytes.saturating_add(ledger.rope_table_bytes),
                });
            }
        }
        ledgers.push(ledger);
    }
    let verdict = if first.is_some() {
        Verdict::DoesNotFit
    } else {
        Verdict::Fits
    };
    (ledgers, verdict, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(free: u64, shortfall: u64) -> Ledger {
        Ledger {
            pool: "p".into(),
            capacity_bytes: 100,
            taken_bytes: 10,
            runtime_overhead_bytes: 10,
            reserve_bytes: 5,
            cache_bytes: 5,
            rope_table_bytes: 0,
            weight_bytes: 70 - free + shortfall,
            weight_tensors: 1,
            prompt_scratch_bytes: 0,
            free_bytes: free,
            shortfall_bytes: shortfall,
            budget_declared: true,
        }
    }

    use crate::placement::place;
    use crate::testutil::{small_model, two_pools};
    use crate::weight_path::choose;
    use crate::workload::Workload;

    fn admit_small(
        vram: u64,
        cache: u64,
        w: &Workload,
    ) -> (Vec<Ledger>, Verdict, Option<Shortfall>) {
        let profile = two_pools(vram, 1000);
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            w,
        );
        let a = place(&small_model(), &path, &profile, w, cache);
        admit(&profile, &a, cache, 0)
    }

    #[test]
    fn a_fitting_plan_has_balanced_ledgers_and_no_shortfall() {
        let (ledgers, verdict, sf) = admit_small(1000, 20, &Workload::default());
        assert_eq!(verdict, Verdict::Fits);
        assert!(sf.is_none());
        assert_eq!(ledgers[0].free_bytes, 1000 - 10 - 20 - 680);
        assert!(ledgers.iter().all(Ledger::adds_up));
    }

    #[test]
    fn the_first_component_that_crosses_capacity_is_named() {
        // Pinned zero offload: all 680 bytes on a 500-byte pool after 10 overhead and 20 cache.
        let w = Workload {
            offload_bytes: Some(0),
            ..Workload::default()
        };
        let (ledgers, verdict, sf) = admit_small(500, 20, &w);
        assert_eq!(verdict, Verdict::DoesNotFit);
        let sf = sf.unwrap();
        assert_eq!(
            (sf.pool.as_str(), sf.component.as_str(), sf.shortfall_bytes),
            ("vram", "weights", 210)
        );
        assert!(ledgers[0].adds_up());
        assert_eq!((sf.weight_bytes, sf.cache_bytes), (680, 20));
        // Weights that fit alone and a cache that pushes the pool over: the cache is what grew, and is named (issue 23 §4).
        let (_, _, sf) = admit_small(1000, 600, &w);
        let sf = sf.unwrap();
        assert_eq!((sf.component.as_str(), sf.shortfall_bytes), ("cache", 290));
        assert!(sf.reason.contains("charged: weights"), "{}", sf.reason);
        // Both too large: the weights cross first.
        let (_, _, sf) = admit_small(500, 600, &w);
        assert_eq!(sf.unwrap().component, "weights");
    }

    #[test]
    fn the_host_pool_can_be_the_one_that_does_not_fit() {
        // 680 bytes cannot fit in 100 + 1000 - 20 of usable memory: the host overflows.
        let profile = two_pools(100, 300);
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            &crate::workload::Workload::default(),
        );
        let a = place(&small_model(), &path, &profile, &Workload::default(), 0);
        let (_, verdict, sf) = admit(&profile, &a, 0, 0);
        assert_eq!(verdict, Verdict::DoesNotFit);
        assert_eq!(sf.unwrap().pool, "host");
    }

    #[test]
    fn a_vision_stage_runs_where_the_tower_is_placed_or_is_refused() {
        // Budget 600 - 10 = 590 for 680 bytes: the tower moves to the host, which the CPU below reads.
        let mut profile = two_pools(600, 10_000);
        let w = Workload {
            images: true,
            ..Workload::default()
        };
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            &w,
        );
        let a = place(&small_model(), &path, &profile, &w, 0);
        let (st, refused) = stages(&profile, &a, "gpu", &[1]);
        assert_eq!(st[1].pool, "host");
        assert_eq!(st[1].unit, None);
        assert!(refused.unwrap().reason.contains("nowhere to run"));
        let mut cpu = profile.compute[0].clone();
        cpu.id = "cpu".into();
        cpu.pool = "host".into();
        profile.compute.push(cpu);
        let (st, refused) = stages(&profile, &a, "gpu", &[1]);
        assert_eq!(st[1].unit.as_deref(), Some("cpu"));
        assert!(refused.is_none());
        // A tower that fits on the decode pool runs on the decode unit.
        let a = place(&small_model(), &path, &two_pools(10_000, 10_000), &w, 0);
        let (st, _) = stages(&profile, &a, "gpu", &[1]);
        assert_eq!(
            (st[1].pool.as_str(), st[1].unit.as_deref()),
            ("vram", Some("gpu"))
        );
    }

    #[test]
    fn adds_up_checks_both_sides() {
        assert!(ledger(10, 0).adds_up());
        assert!(ledger(0, 7).adds_up());
        let mut bad = ledger(10, 0);
        bad.cache_bytes += 1;
        assert!(!bad.adds_up());
        let mut both = ledger(0, 0);
        both.free_bytes = 1;
        both.shortfall_bytes = 1;
        assert!(
            !both.adds_up(),
            "free and shortfall cannot both be positive"
        );
    }
}
