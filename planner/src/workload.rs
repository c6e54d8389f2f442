//! The workload a plan is made for: context length, concurrency, modalities, speculative decoding, the speed or
//! fidelity priority, and which engine will run the plan (it decides what can be offloaded). Defaults are what a
//! single-user edge deployment asks for; every field can be overridden from `cargo xtask plan`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::model::{CacheWorkload, Role, RopeTables, SlidingAccounting, TensorEntry};

/// Default context length: the seed's laptop sweep ran at 4096 tokens (seed 000 §5).
pub const DEFAULT_MAX_MODEL_LEN: u64 = 4096;
/// Prompt length the prefill prediction is made for: pp512, the prefill figure both seeds report (seed 002).
pub const DEFAULT_PROMPT_LEN: u64 = 512;
/// Headroom on the KV cache (not on fixed recurrent state): the seed's budget used 1.25 (seed 002, kv budget).
pub const KV_HEADROOM: f64 = 1.25;
/// Block size of a paged backend (vLLM's default, 16 tokens) when the target engine is vLLM.
pub const VLLM_BLOCK_TOKENS: u64 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// The fastest measured path.
    #[default]
    Speed,
    /// The more faithful path where two exist (W4A16 over W4A8 on CPUs: seed 002, 2/12 vs 1/12 greedy prompts).
    Fidelity,
}

/// The engine that will execute the plan: it decides what can be offloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TargetEngine {
    /// edgefit's own engine: any tensor can live in any pool it has a budget for.
    #[default]
    Edgefit,
    /// vLLM as the seed ran it: its offloader is only offered decoder layers (`make_layers`, seed 000 §6), so
    /// `embed_tokens`, `lm_head`, the vision tower and the MTP head stay on the device. Paged KV blocks.
    Vllm,
}

impl TargetEngine {
    /// The engine's name as profiles and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            TargetEngine::Edgefit => "edgefit",
            TargetEngine::Vllm => "vllm",
        }
    }

    pub fn can_offload_non_layer_tensors(self) -> bool {
        matches!(self, TargetEngine::Edgefit)
    }

    /// Whether this engine loads a tensor of `role` at all when speculative decoding is `speculative`.
    ///
    /// vLLM's main model never holds the MTP head: `Qwen3_5ForConditionalGeneration.load_weights` (and
    /// `Qwen3_5ForCausalLMBase`'s) build `AutoWeightsLoader(self, skip_prefixes=["mtp."])`, and `Qwen3NextForCausalLM`
    /// maps the `mtp.` prefix to `None` ("MTP weights are loaded by the draft model, not this one"); see
    /// `vllm/model_executor/models/qwen3_5.py` and `qwen3_next.py`. The head is built and loaded only by the
    /// speculative-decoding drafter (`Qwen3_5MTP` in `vllm/model_executor/models/qwen3_5_mtp.py`) when a speculative
    /// config asks for it. So without speculative decoding its bytes are never in memory, and with it they are on
    /// the device and read every step. edgefit's placement keeps every tensor (an unused MTP head is the first thing
    /// it moves off the device).
    pub fn loads(self, role: Role, speculative: bool) -> bool {
        match self {
            TargetEngine::Edgefit => true,
            TargetEngine::Vllm => role != Role::MtpHead || speculative,
        }
    }

    /// Why [`TargetEngine::loads`] leaves tensors out, for the plan.
    pub fn not_loaded_reason(self) -> &'static str {
        match self {
            TargetEngine::Edgefit => "",
            TargetEngine::Vllm => {
                "vLLM loads `mtp.*` only into the speculative-decoding drafter: its Qwen3.5 / Qwen3-Next models skip \
                 the prefix (vllm/model_executor/models/qwen3_5.py load_weights, skip_prefixes=[\"mtp.\"]; \
                 qwen3_next.py maps `mtp.` to None), so without --speculative the MTP head is never loaded"
            }
        }
    }

    /// How this engine holds RoPE's cos/sin values (see [`RopeTables`]).
    pub fn rope_tables(self) -> RopeTables {
        match self {
            TargetEngine::Edgefit => RopeTables::PerCall,
            TargetEngine::Vllm => RopeTables::CosSinCache,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Longest sequence (prompt + generated). Caches and RoPE tables are sized from it.
    pub max_model_len: u64,
    pub max_num_seqs: u64,
    /// Prompt length the prefill prediction is made for.
    pub prompt_len: u64,
    /// Whether prompts carry images (the vision tower runs at prefill).
    pub images: bool,
    /// Whether speculative decoding with the MTP head is on (the head is then read every token).
    pub speculative: bool,
    pub priority: Priority,
    pub engine: TargetEngine,
    /// Weight bytes pinned in host memory (`--offload-gib`), decoder layers only, like vLLM's `cpu_offload_gb`.
    /// Absent: the planner chooses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_bytes: Option<u64>,
    /// Device memory the plan may use on each GPU pool (`--cap-gpu-memory`): the pool is planned as a card of this
    /// many bytes, so a large GPU can stand in for a smaller one (the engine holds the rest back). Absent: the
    /// profile's capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_cap: Option<u64>,
    /// The activation precision of W4A16 prompt GEMMs, pinned (`--prefill-activations`). Absent: the planner
    /// chooses (int8 on x86 with AVX-512 VNNI at priority = speed, see `weight_path::prefill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_activations: Option<crate::weight_path::PrefillActivations>,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            max_model_len: DEFAULT_MAX_MODEL_LEN,
            max_num_seqs: 1,
            prompt_len: DEFAULT_PROMPT_LEN,
            images: false,
            speculative: false,
            priority: Priority::Speed,
            engine: TargetEngine::Edgefit,
            offload_bytes: None,
            gpu_memory_cap: None,
            prefill_activations: None,
        }
    }
}

impl Workload {
    /// Whether the target engine loads tensor `t` for this workload ([`TargetEngine::loads`]).
    pub fn loads(&self, t: &TensorEntry) -> bool {
        self.engine.loads(t.role, self.speculative)
    }

    /// Bytes per GiB, the unit of `--offload-gib`: vLLM's `cpu_offload_gb` is GiB (`cpu_offload_max_bytes =
    /// int(cpu_offload_gb * 1024**3)` in `vllm/model_executor/offloader/base.py`); seed 000 §5 measured 10 fitting the
    /// FP8 27B and 9 failing.
    pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    /// Pin the offloaded amount in GiB.
    pub fn with_offload_gib(mut self, gib: f64) -> Result<Self, PlanError> {
        if !gib.is_finite() || gib < 0.0 {
            return Err(PlanError::Workload(format!(
                "--offload-gib must be a finite amount >= 0, got {gib}"
            )));
        }
        let bytes = (gib * Self::GIB).round();
        // `as u64` would saturate silently; anything at or above 2^63 has no TOML integer to go in.
        if bytes >= crate::plan::MAX_PLAN_INT as f64 {
            return Err(PlanError::Unrepresentable(format!(
                "--offload-gib {gib} is {bytes:.0} bytes, beyond the largest amount a plan can hold ({} bytes)",
                crate::plan::MAX_PLAN_INT
            )));
        }
        self.offload_bytes = Some(bytes as u64);
        Ok(self)
    }

    /// `profile` with every GPU's pool capped at [`Workload::gpu_memory_cap`] (unchanged without a cap, or where
    /// the pool is smaller already); the capacity's source says so.
    pub fn capped(&self, profile: &crate::profile::DeviceProfile) -> crate::profile::DeviceProfile {
        let mut p = profile.clone();
        let Some(cap) = self.gpu_memory_cap else {
            return p;
        };
        let gpu_pools: Vec<String> = p
            .compute
            .iter()
            .filter(|c| c.kind == crate::profile::ComputeKind::Gpu)
            .map(|c| c.pool.clone())
            .collect();
        for pool in p.pools.iter_mut().filter(|m| gpu_pools.contains(&m.id)) {
            if pool.capacity_bytes.value > cap {
                pool.capacity_bytes.source = format!(
                    "--cap-gpu-memory {cap} (the profile's {} bytes: {})",
                    pool.capacity_bytes.value, pool.capacity_bytes.source
                );
                pool.capacity_bytes.value = cap;
                pool.taken_bytes.value = pool.taken_bytes.value.min(cap);
            }
        }
        p
    }

    /// A byte amount as a flag gives it: plain bytes (`24245000000`) or a number with a unit (`22.58GiB`, `24GB`,
    /// `512MiB`; binary and decimal units, case-insensitive).
    pub fn parse_bytes(flag: &str, s: &str) -> Result<u64, PlanError> {
        let t = s.trim();
        let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let scale: f64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => Self::GIB,
            "tib" => Self::GIB * 1024.0,
            _ => {
                return Err(PlanError::Workload(format!(
                    "{flag} {s}: unknown unit `{unit}` (expected bytes, or KB/MB/GB/TB, KiB/MiB/GiB/TiB)"
                )))
            }
        };
        let v: f64 = num.trim().parse().map_err(|_| {
            PlanError::Workload(format!(
                "{flag} expects an amount of memory such as 24245000000 or 22.58GiB, got `{s}`"
            ))
        })?;
        let bytes = (v * scale).round();
        if !bytes.is_finite() || bytes < 1.0 || bytes >= crate::plan::MAX_PLAN_INT as f64 {
            return Err(PlanError::Workload(format!(
                "{flag} {s} is {bytes:.0} bytes: expected at least 1 and below {}",
                crate::plan::MAX_PLAN_INT
            )));
        }
        Ok(bytes as u64)
    }

    /// Reject workloads no plan can serve.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.max_model_len == 0 {
            return Err(PlanError::Workload(
                "max_model_len must be at least 1".into(),
            ));
        }
        if self.max_num_seqs == 0 {
            return Err(PlanError::Workload(
                "max_num_seqs must be at least 1".into(),
            ));
        }
        if self.prompt_len == 0 {
            return Err(PlanError::Workload("prompt_len must be at least 1".into()));
        }
        if self.prompt_len > self.max_model_len {
            return Err(PlanError::Workload(format!(
                "prompt_len {} is above max_model_len {}: a prompt cannot be longer than the longest sequence \
                 (lower --prompt-len or raise --max-model-len)",
                self.prompt_len, self.max_model_len
            )));
        }
        if let Some(c) = self.gpu_memory_cap {
            if c == 0 || c > crate::plan::MAX_PLAN_INT {
                return Err(PlanError::Workload(format!(
                    "gpu_memory_cap {c} must be between 1 and {} bytes",
                    crate::plan::MAX_PLAN_INT
                )));
            }
        }
        if let Some(b) = self.offload_bytes {
            if b > crate::plan::MAX_PLAN_INT {
                return Err(PlanError::Unrepresentable(format!(
                    "offload_bytes {b} is beyond the largest amount a plan can hold ({} bytes)",
                    crate::plan::MAX_PLAN_INT
                )));
            }
        }
        Ok(())
    }

    /// Prompt length used for prefill. [`Workload::validate`] refuses a prompt longer than the context; the `min`
    /// only keeps callers that build a plan from an unvalidated workload (unit tests) in range.
    pub fn effective_prompt_len(&self) -> u64 {
        self.prompt_len.min(self.max_model_len)
    }

    /// What the cache budget is computed for. The sliding accounting follows the engine: edgefit keeps a ring of
    /// `window - 1` slots, vLLM a block-rounded window.
    pub fn cache_workload(&self) -> CacheWorkload {
        CacheWorkload {
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            kv_bytes_per_elem: 2,
            headroom: KV_HEADROOM,
            sliding_accounting: match self.engine {
                TargetEngine::Edgefit => SlidingAccounting::Ring,
                TargetEngine::Vllm => SlidingAccounting::Paged {
                    block_tokens: VLLM_BLOCK_TOKENS,
                },
            },
            rope_tables: self.engine.rope_tables(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_gib_is_binary() {
        let w = Workload::default().with_offload_gib(10.0).unwrap();
        assert_eq!(w.offload_bytes, Some(10 * 1024 * 1024 * 1024));
    }

    #[test]
    fn negative_or_nan_offload_is_an_error() {
        assert!(Workload::default().with_offload_gib(-1.0).is_err());
        assert!(Workload::default().with_offload_gib(f64::NAN).is_err());
    }

    #[test]
    fn zero_context_is_an_error() {
        let w = Workload {
            max_model_len: 0,
            ..Workload::default()
        };
        assert!(w.validate().is_err());
        assert!(Workload::default().validate().is_ok());
    }

    #[test]
    fn a_prompt_longer_than_the_context_is_an_error_not_a_clamp() {
        let w = Workload {
            max_model_len: 128,
            ..Workload::default()
        };
        let e = w.validate().unwrap_err().to_string();
        assert!(
            e.contains("prompt_len 512 is above max_model_len 128"),
            "{e}"
        );
        let w = Workload {
            max_model_len: 128,
            prompt_len: 128,
            ..Workload::default()
        };
        assert!(w.validate().is_ok());
    }

    #[test]
    fn an_offload_no_plan_can_hold_is_an_error_not_a_saturation() {
        // 2^33 GiB = 2^63 bytes: one past i64::MAX, which TOML cannot write (issue 23 §6 wrote a corrupt file).
        let e = Workload::default()
            .with_offload_gib(8589934592.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--offload-gib 8589934592"), "{e}");
        assert!(Workload::default().with_offload_gib(1e300).is_err());
        assert!(Workload::default().with_offload_gib(8589934591.0).is_ok());
    }

    #[test]
    fn vllm_loads_the_mtp_head_only_for_speculative_decoding() {
        assert!(!TargetEngine::Vllm.loads(Role::MtpHead, false));
        assert!(TargetEngine::Vllm.loads(Role::MtpHead, true));
        assert!(TargetEngine::Vllm.loads(Role::VisionTower, false));
        assert!(TargetEngine::Edgefit.loads(Role::MtpHead, false));
    }

    #[test]
    fn sliding_accounting_follows_the_engine() {
        let w = Workload {
            engine: TargetEngine::Vllm,
            ..Workload::default()
        };
        assert_eq!(
            w.cache_workload().sliding_accounting,
            SlidingAccounting::Paged { block_tokens: 16 }
        );
        assert_eq!(
            Workload::default().cache_workload().sliding_accounting,
            SlidingAccounting::Ring
        );
    }
}
