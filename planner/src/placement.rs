//! Placement: which memory pool holds each tensor of the inventory. Every tensor is placed exactly once (the
//! assignment is one pool index per inventory entry).
//!
//! Fitting comes first (seed 000 §5: a gigabyte that does not fit costs ~44x one that fits on the laptop). When the
//! weights do not fit the decode unit's pool, the cheapest bytes move first: a tensor's cost is the bytes it adds to
//! each decode step per byte moved, so the vision tower and an unused MTP head (never read during decode) go before
//! `embed_tokens` (one row per token), which goes before routed experts (`active / total` of them per token), which go
//! before the hot layers. Only what the target engine can offload is a candidate (vLLM: decoder layers only). With
//! `offload_bytes` pinned (`--offload-gib`), decoder-layer tensors move in checkpoint order until the amount is
//! reached, the way vLLM's `cpu_offload_gb` does.

use std::collections::BTreeMap;

use crate::model::{Access, Role, TensorEntry};
use crate::profile::DeviceProfile;
use crate::weight_path::WeightPath;
use crate::workload::Workload;

/// Bytes of `t` (as planned, after any conversion) read in one decode step.
pub fn per_token_bytes(t: &TensorEntry, planned: u64, workload: &Workload) -> u64 {
    match t.access {
        Access::EveryToken => planned,
        Access::Gather { row_bytes } => {
            // A converted embedding has smaller rows in proportion.
            let scaled = if t.bytes == 0 {
                0
            } else {
                (row_bytes as u128 * planned as u128 / t.bytes as u128) as u64
            };
            scaled.min(planned)
        }
        Access::ConditionalImage => 0,
        Access::ConditionalSpeculative => {
            if workload.speculative {
                planned
            } else {
                0
            }
        }
        Access::Routed { active, total } => {
            if total == 0 {
                planned
            } else {
                (planned as u128 * u128::from(active.min(total)) / u128::from(total)) as u64
            }
        }
    }
}

/// Whether a tensor belongs to a decoder layer (the only unit vLLM's offloader is offered).
pub fn is_decoder_layer_tensor(t: &TensorEntry) -> bool {
    t.layer.is_some()
        && !matches!(
            t.role,
            Role::VisionTower | Role::MtpHead | Role::Embedding | Role::LmHead
        )
}

/// Planned bytes a pinned offload (`--offload-gib`) can move: the decoder-layer tensors, the only ones it takes.
pub fn pinned_offloadable_bytes(inventory: &[TensorEntry], path: &WeightPath) -> u64 {
    inventory
        .iter()
        .filter(|t| is_decoder_layer_tensor(t))
        .fold(0u64, |acc, t| acc.saturating_add(path.planned_bytes(t)))
}

/// The result of placement, before admission.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// Index into `profile.pools` of the pool holding each inventory tensor, in inventory order.
    pub pool_of: Vec<usize>,
    /// Planned bytes of each tensor (after conversion).
    pub planned: Vec<u64>,
    /// Per-token read bytes of each tensor.
    pub per_token: Vec<u64>,
    /// Bytes each tensor adds to a prefill pass beyond its decode reads: the vision tower when prompts carry images
    /// (it runs once per image, never per generated token).
    pub prefill_only: Vec<u64>,
    /// Index of the decode unit's pool.
    pub primary: usize,
    /// The pool offloaded tensors went to, if any moved.
    pub secondary: Option<usize>,
    /// How the offload was decided, for the plan.
    pub policy: String,
}

impl Assignment {
    pub fn bytes_in(&self, pool: usize) -> u64 {
        self.pool_of
            .iter()
            .zip(&self.planned)
            .filter(|(p, _)| **p == pool)
            .fold(0u64, |acc, (_, b)| acc.saturating_add(*b))
    }

    /// Bytes one prefill pass reads from `pool`: the decode reads plus what only prefill needs.
    pub fn prefill_in(&self, pool: usize) -> u64 {
        (0..self.pool_of.len())
            .filter(|&i| self.pool_of[i] == pool)
            .fold(0u64, |acc, i| {
                acc.saturating_add(self.per_token[i])
                    .saturating_add(self.prefill_only[i])
            })
    }

    pub fn per_token_in(&self, pool: usize) -> u64 {
        self.pool_of
            .iter()
            .zip(&self.per_token)
            .filter(|(p, _)| **p == pool)
            .fold(0u64, |acc, (_, b)| acc.saturating_add(*b))
    }
}

/// Bytes the decode pool can give to weights once the fixed charges are taken. Negative when even the fixed
/// charges do not fit. Zero when the pool declares no runtime-overhead budget (admission then fails closed).
pub fn weight_budget(profile: &DeviceProfile, pool: usize, fixed_bytes: u64) -> i128 {
    let p = &profile.pools[pool];
    let Some(overhead) = &p.runtime_overhead_bytes else {
        return 0;
    };
    i128::from(p.capacity_bytes.value)
        - i128::from(p.taken_bytes.value)
        - i128::from(overhead.value)
        - i128::from(p.reserve_bytes.value)
        - i128::from(fixed_bytes)
}

/// The pool reachable from `primary` with the fastest link for weight reads, if any.
pub fn offload_pool(profile: &DeviceProfile, primary: usize) -> Option<usize> {
    let to = &profile.pools[primary].id;
    profile
        .links
        .iter()
        .filter(|l| &l.to == to && l.from != *to)
        .max_by(|a, b| {
            a.weight_read_bytes_per_s
                .value
                .total_cmp(&b.weight_read_bytes_per_s.value)
        })
        .and_then(|l| profile.pools.iter().position(|p| p.id == l.from))
}

/// Place every tensor. `fixed_primary_bytes` is what the decode pool must hold besides weights (caches, RoPE
/// tables); the runtime overhead and reserve come from the profile.
pub fn place(
    inventory: &[TensorEntry],
    path: &WeightPath,
    profile: &DeviceProfile,
    workload: &Workload,
    fixed_primary_bytes: u64,
) -> Assignment {
    let unit = profile
        .compute
        .iter()
        .find(|c| c.id == path.unit)
        .unwrap_or_else(|| profile.decode_unit());
    let primary = profile
        .pools
        .iter()
        .position(|p| p.id == unit.pool)
        .unwrap_or(0);
    // A tensor the target engine does not load for this workload (vLLM's MTP head without speculative decoding)
    // takes no memory anywhere: it is placed, at zero bytes, so every tensor is still placed exactly once.
    let planned: Vec<u64> = inventory
        .iter()
        .map(|t| {
            if workload.loads(t) {
                path.planned_bytes(t)
            } else {
                0
            }
        })
        .collect();
    let per_token: Vec<u64> = inventory
        .iter()
        .zip(&planned)
        .map(|(t, &b)| per_token_bytes(t, b, workload))
        .collect();
    let prefill_only: Vec<u64> = inventory
        .iter()
        .zip(&planned)
        .map(|(t, &b)| match t.access {
            Access::ConditionalImage if workload.images => b,
            _ => 0,
        })
        .collect();
    let mut a = Assignment {
        pool_of: vec![primary; inventory.len()],
        planned,
        per_token,
        prefill_only,
        primary,
        secondary: None,
        policy: String::new(),
    };
    let secondary = offload_pool(profile, primary);

    if let Some(target) = workload.offload_bytes {
        a.policy = format!(
            "pinned: {target} bytes of decoder-layer weights in host memory, in checkpoint order (like vLLM's \
             cpu_offload_gb)"
        );
        let Some(sec) = secondary else {
            a.policy
                .push_str("; no pool is linked to the decode pool, so nothing moved");
            return a;
        };
        let mut moved = 0u64;
        for (i, t) in inventory.iter().enumerate() {
            if moved >= target {
                break;
            }
            if is_decoder_layer_tensor(t) {
                a.pool_of[i] = sec;
                moved = moved.saturating_add(a.planned[i]);
            }
        }
        if moved > 0 {
            a.secondary = Some(sec);
        }
        return a;
    }

    let budget = weight_budget(profile, primary, fixed_primary_bytes);
    let total: u128 = a.planned.iter().map(|&b| u128::from(b)).sum();
    let total = i128::try_from(total).unwrap_or(i128::MAX);
    if total <= budget {
        a.policy = "fit: every weight on the decode unit's pool (one device for decode)".into();
        return a;
    }
    let Some(sec) = secondary else {
        a.policy =
            "does not fit and no pool is linked to the decode pool: nothing to offload to".into();
        return a;
    };
    let movable = |t: &TensorEntry| {
        workload.engine.can_offload_non_layer_tensors() || is_decoder_layer_tensor(t)
    };
    // Units that move together: a layer's routed experts of one role move as one unit (moving a few thousand
    // expert tensors one by one would buy at most a layer's worth of VRAM, at ~active/total of its bytes per token,
    // and would make the plan list every one of them); every other tensor is its own unit.
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut expert_unit: BTreeMap<(Option<u32>, String), usize> = BTreeMap::new();
    for i in (0..inventory.len()).filter(|&i| movable(&inventory[i]) && a.planned[i] > 0) {
        let t = &inventory[i];
        if matches!(t.access, Access::Routed { .. }) {
            let key = (t.layer, format!("{:?}", t.role));
            match expert_unit.get(&key) {
                Some(&u) => units[u].push(i),
                None => {
                    expert_unit.insert(key, units.len());
                    units.push(vec![i]);
                }
            }
        } else {
            units.push(vec![i]);
        }
    }
    let sum = |u: &[usize], v: &[u64]| u.iter().map(|&i| u128::from(v[i])).sum::<u128>();
    // Cheapest first: per-token bytes per byte moved. Integer cross-multiplication keeps the order exact; ties keep
    // checkpoint order (the sort is stable).
    units.sort_by(|x, y| {
        let lhs = sum(x, &a.per_token) * sum(y, &a.planned);
        let rhs = sum(y, &a.per_token) * sum(x, &a.planned);
        lhs.cmp(&rhs)
    });
    let mut resident = total;
    for unit in units {
        if resident <= budget {
            break;
        }
        for i in unit {
            a.pool_of[i] = sec;
            resident -= i128::from(a.planned[i]);
        }
    }
    a.secondary = Some(sec);
    a.policy = if workload.engine.can_offload_non_layer_tensors() {
        "fit first, then offload the cheapest bytes: cold (never read in decode) before gathered rows before routed \
         experts before hot layers"
            .into()
    } else {
        "fit first, then offload decoder layers only (the target engine cannot offload other tensors), cheapest \
         first"
            .into()
    };
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DType;

    fn t(name: &str, bytes: u64, access: Access, role: Role, layer: Option<u32>) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            shape: vec![bytes],
            dtype: DType::F8E4m3,
            bytes,
            params: bytes,
            role,
            access,
            layer,
        }
    }

    #[test]
    fn per_token_bytes_by_access_class() {
        let w = Workload::default();
        assert_eq!(
            per_token_bytes(
                &t("a", 100, Access::EveryToken, Role::LayerWeight, Some(0)),
                100,
                &w
            ),
            100
        );
        let gather = t(
            "e",
            1000,
            Access::Gather { row_bytes: 10 },
            Role::Embedding,
            None,
        );
        assert_eq!(per_token_bytes(&gather, 1000, &w), 10);
        assert_eq!(
            per_token_bytes(&gather, 500, &w),
            5,
            "a converted table has proportionally smaller rows"
        );
        let mtp = t(
            "m",
            100,
            Access::ConditionalSpeculative,
            Role::MtpHead,
            None,
        );
        assert_eq!(per_token_bytes(&mtp, 100, &w), 0);
        let spec = Workload {
            speculative: true,
            ..Workload::default()
        };
        assert_eq!(per_token_bytes(&mtp, 100, &spec), 100);
        let vis = t("v", 100, Access::ConditionalImage, Role::VisionTower, None);
        assert_eq!(
            per_token_bytes(
                &vis,
                100,
                &Workload {
                    images: true,
                    ..Workload::default()
                }
            ),
            0
        );
        let ex = t(
            "x",
            512,
            Access::Routed {
                active: 10,
                total: 512,
            },
            Role::ExpertWeight,
            Some(0),
        );
        assert_eq!(per_token_bytes(&ex, 512, &w), 10);
    }

    use crate::testutil::{small_model, two_pools};
    use crate::weight_path::choose;
    use crate::workload::TargetEngine;

    fn names_in(a: &Assignment, inv: &[TensorEntry], pool: usize) -> Vec<String> {
        inv.iter()
            .zip(&a.pool_of)
            .filter(|(_, &p)| p == pool)
            .map(|(t, _)| t.name.clone())
            .collect()
    }

    fn plan_place(vram: u64, w: &Workload, fixed: u64) -> (Assignment, Vec<TensorEntry>) {
        let profile = two_pools(vram, 10_000);
        let inv = small_model();
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            w,
        );
        (place(&inv, &path, &profile, w, fixed), inv)
    }

    #[test]
    fn everything_stays_on_one_pool_when_it_fits() {
        // 680 bytes of weights + 10 overhead + 5 fixed = 695.
        let (a, _) = plan_place(695, &Workload::default(), 5);
        assert!(a.pool_of.iter().all(|&p| p == 0));
        assert_eq!(a.secondary, None);
        let (a, _) = plan_place(694, &Workload::default(), 5);
        assert_eq!(a.secondary, Some(1), "one byte short moves something");
    }

    #[test]
    fn cold_bytes_move_before_hot_ones() {
        // Budget 600 - 10 = 590 for 680 bytes: 90 must move. Vision (50) and MTP (30) cost nothing per token, then
        // the embedding (1 B/token for 100 B) goes; no hot layer and not lm_head.
        let (a, inv) = plan_place(600, &Workload::default(), 0);
        assert_eq!(names_in(&a, &inv, 1), ["embed", "visual", "mtp"]);
        // 300 bytes short: the three cold tensors (180) and two hot layers (checkpoint order).
        let (a, inv) = plan_place(400, &Workload::default(), 0);
        assert_eq!(
            names_in(&a, &inv, 1),
            ["embed", "visual", "mtp", "layers.0", "layers.1"]
        );
        assert!(a.bytes_in(0) <= 390);
    }

    #[test]
    fn speculative_decoding_makes_the_mtp_head_hot() {
        let w = Workload {
            speculative: true,
            ..Workload::default()
        };
        let (a, inv) = plan_place(600, &w, 0);
        assert_eq!(names_in(&a, &inv, 1), ["embed", "visual"]);
    }

    #[test]
    fn vllm_can_only_offload_decoder_layers() {
        let w = Workload {
            engine: TargetEngine::Vllm,
            ..Workload::default()
        };
        let (a, inv) = plan_place(600, &w, 0);
        assert_eq!(names_in(&a, &inv, 1), ["layers.0"]);
    }

    #[test]
    fn pinned_offload_takes_decoder_layers_in_order_until_reached() {
        let w = Workload {
            offload_bytes: Some(150),
            ..Workload::default()
        };
        let (a, inv) = plan_place(10_000, &w, 0);
        assert_eq!(
            names_in(&a, &inv, 1),
            ["layers.0", "layers.1"],
            "the last tensor may overshoot the target"
        );
        let w = Workload {
            offload_bytes: Some(0),
            ..Workload::default()
        };
        let (a, _) = plan_place(100, &w, 0);
        assert_eq!(
            a.secondary, None,
            "a pinned zero offload moves nothing even when it does not fit"
        );
    }

    #[test]
    fn a_layers_routed_experts_move_together() {
        let profile = two_pools(300, 10_000);
        let mut inv = Vec::new();
        for l in 0..2 {
            inv.push(t(
                &format!("layers.{l}.attn"),
                50,
                Access::EveryToken,
                Role::LayerWeight,
                Some(l),
            ));
            for e in 0..4 {
                let access = Access::Routed {
                    active: 1,
                    total: 4,
                };
                inv.push(t(
                    &format!("layers.{l}.experts.{e}"),
                    40,
                    access,
                    Role::ExpertWeight,
                    Some(l),
                ));
            }
        }
        // 420 bytes, budget 290: 130 must move; the first layer's four experts (160) move together.
        let w = Workload::default();
        let path = choose(
            &crate::model::Quantization::Fp8Block { block: [128, 128] },
            &profile.compute[0],
            &w,
        );
        let a = place(&inv, &path, &profile, &w, 0);
        let moved: Vec<&str> = inv
            .iter()
            .zip(&a.pool_of)
            .filter(|(_, &p)| p == 1)
            .map(|(t, _)| t.name.as_str())
            .collect();
        assert_eq!(
            moved,
            [
                "layers.0.experts.0",
                "layers.0.experts.1",
                "layers.0.experts.2",
                "layers.0.experts.3"
            ]
        );
    }

    #[test]
    fn decoder_layer_tensors_exclude_heads_and_towers() {
        assert!(is_decoder_layer_tensor(&t(
            "a",
            1,
            Access::EveryToken,
            Role::LayerWeight,
            Some(3)
        )));
        assert!(!is_decoder_layer_tensor(&t(
            "a",
            1,
            Access::EveryToken,
            Role::LmHead,
            None
        )));
        assert!(!is_decoder_layer_tensor(&t(
            "a",
            1,
            Access::ConditionalSpeculative,
            Role::MtpHead,
            Some(0)
        )));
    }
}
