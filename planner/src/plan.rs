//! The plan: the one stable serialized interface between the planner and the engine (and the scripts around them).
//! Its types are serde + schemars with `deny_unknown_fields`; `schemas/plan.schema.json` is generated from them.
//! Fields scripts rely on: top-level `verdict`, `[shortfall]` (when it does not fit), `[prediction]` (`decode_tok_s`,
//! `prefill_tok_s`, `bound`; absent when the plan does not fit: a plan that cannot run has no speed),
//! `[cache]` (`bytes_per_token_flat`, `bytes_per_token_hybrid`, `state_bytes_per_seq`, `total_bytes`) and
//! `[inventory]` (`total_bytes`, `total_params`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::admission::{admit, stages, Ledger, Shortfall, Stage, Verdict};
use crate::model::{Access, CacheBudget, LayerKind, ModelSpec, Quantization, Role};
use crate::placement::{is_decoder_layer_tensor, place, Assignment};
use crate::predict::{predict, Prediction, Work};
use crate::profile::DeviceProfile;
use crate::prompt_chunk::PromptChunk;
use crate::weight_path::{choose, WeightPath};
use crate::workload::Workload;

pub const PLANNER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The largest byte or element count a plan holds: TOML integers are signed 64-bit, so `i64::MAX`. Inputs that imply
/// a larger figure (a `vocab_size` of 2^63, `--max-model-len` of 2^64 - 1) are errors naming the input, never a
/// saturated or wrapped number (issue 23 §6).
pub const MAX_PLAN_INT: u64 = i64::MAX as u64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub planner_version: String,
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shortfall: Option<Shortfall>,
    /// Decode and prefill rates; absent when the plan does not fit (a plan that cannot run has no speed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
    pub model: ModelInfo,
    pub device: DeviceInfo,
    pub inputs: InputHashes,
    pub workload: Workload,
    pub weight_path: WeightPath,
    pub inventory: InventorySummary,
    pub cache: CacheBudget,
    pub placement: Placement,
    /// How many prompt tokens a step runs, and the memory that costs (absent in plans written before it was planned:
    /// the engine's default chunk then).
    #[serde(default)]
    pub prompt_chunk: PromptChunk,
    /// One ledger per memory pool, TOML `[[ledger]]`.
    #[serde(rename = "ledger")]
    pub ledgers: Vec<Ledger>,
    /// Where each piece of work runs, TOML `[[stage]]`.
    #[serde(rename = "stage")]
    pub stages: Vec<Stage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    pub id: String,
    pub architecture: String,
    pub model_type: String,
    pub layers: u64,
    pub full_attention_layers: u64,
    pub sliding_attention_layers: u64,
    pub linear_attention_layers: u64,
    pub quantization: Quantization,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    pub profile: String,
    pub decode_unit: String,
    pub decode_pool: String,
}

/// sha256 (hex) of the exact input texts, so a plan can be traced to what produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputHashes {
    pub config_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant_config_sha256: Option<String>,
    pub profile_sha256: String,
}

impl InputHashes {
    pub fn of(config: &str, quant_config: Option<&str>, profile: &str) -> Self {
        Self {
            config_sha256: sha256_hex(config),
            quant_config_sha256: quant_config.map(sha256_hex),
            profile_sha256: sha256_hex(profile),
        }
    }
}

pub fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut s = String::with_capacity(64);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InventorySummary {
    pub tensors: u64,
    /// Checkpoint bytes (scales included), as the files hold them.
    pub total_bytes: u64,
    /// Model parameters: packed 4-bit codes count one per value; quantization scales, zero points and `g_idx` do not
    /// count (they are in `total_bytes`).
    pub total_params: u64,
    /// Bytes once loaded on the weight path (differs from `total_bytes` when the path converts).
    pub planned_bytes: u64,
    /// Planned bytes one decode step reads (hot weights, gathered rows, active experts).
    pub decode_bytes_per_token: u64,
    pub by_access: Vec<AccessClass>,
    /// Checkpoint tensors the target engine does not load for this workload (placed at zero bytes); absent when it
    /// loads every tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_loaded: Option<NotLoaded>,
}

/// Tensors of the checkpoint that the target engine leaves on disk for this workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotLoaded {
    pub tensors: u64,
    /// Their bytes in the checkpoint (counted in `total_bytes`, not in `planned_bytes`).
    pub checkpoint_bytes: u64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessClass {
    /// `every_token`, `gather`, `conditional_image`, `conditional_speculative`, `routed`.
    pub class: String,
    pub tensors: u64,
    pub planned_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub policy: String,
    /// Tensors placed, summed over pools; equals `inventory.tensors` (every tensor placed exactly once).
    pub tensors_placed: u64,
    pub offloaded_bytes: u64,
    #[serde(rename = "pool")]
    pub pools: Vec<PoolPlacement>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolPlacement {
    pub pool: String,
    pub tensors: u64,
    pub bytes: u64,
    pub decode_bytes_per_token: u64,
    /// Decoder layers whose every decoder-layer tensor is here, as ranges (`0-15,20`); empty when none. A layer split
    /// between pools is not listed here but in `split_layers`, so the `layers` of all pools never overlap.
    pub layers: String,
    /// Decoder layers with some of their tensors here and the rest in another pool, as ranges; absent when none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub split_layers: String,
    /// The decode unit's pool holds every tensor no other pool claims (see [`Plan::pool_for`]).
    pub is_default: bool,
    /// Decoder layers (inclusive `[first, last]` ranges) whose every decoder-layer tensor is here. Empty on the
    /// default pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whole_layers: Vec<[u32; 2]>,
    /// Per role, decoder layers whose every tensor of that role is here while the rest of the layer is not (the
    /// routed experts of a layer moved before its attention). Empty on the default pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whole_layer_roles: Vec<LayerRoleClaim>,
    /// Roles whose every tensor outside the decoder layers (vision tower, MTP head, embedding, ...) is here. Empty
    /// on the default pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whole_roles: Vec<Role>,
    /// Tensors here that `whole_layers` and `whole_roles` do not cover (a layer split by a pinned offload). Empty
    /// on the default pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors_listed: Vec<String>,
    #[serde(rename = "group")]
    pub groups: Vec<PlacementGroup>,
}

/// Decoder layers (inclusive ranges) whose every tensor of `role` lives in the pool that makes the claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayerRoleClaim {
    pub role: Role,
    pub layers: Vec<[u32; 2]>,
}

/// Tensors of one role and access class in one pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementGroup {
    pub role: Role,
    pub access: String,
    pub tensors: u64,
    pub bytes: u64,
    /// The tensors' names when the group is small (at most [`NAMES_LISTED`]), so a reviewer sees exactly what moved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// Groups up to this many tensors list their names in the plan.
pub const NAMES_LISTED: usize = 4;

pub fn access_class(a: &Access) -> &'static str {
    match a {
        Access::EveryToken => "every_token",
        Access::Gather { .. } => "gather",
        Access::ConditionalImage => "conditional_image",
        Access::ConditionalSpeculative => "conditional_speculative",
        Access::Routed { .. } => "routed",
    }
}

/// Everything the core planner needs, already parsed. The model-side figures (cache budget, FLOPs) come from
/// `model`; this keeps the device side testable with hand-built specs.
pub struct Inputs<'a> {
    pub spec: &'a ModelSpec,
    pub cache: CacheBudget,
    pub decode_flops_per_token: u64,
    pub prefill_flops: u64,
    pub profile: &'a DeviceProfile,
    pub workload: &'a Workload,
    pub hashes: InputHashes,
}

/// Plan a model card on a device profile: parse both (errors name the file and the span), then [`build`].
pub fn plan(
    card: &crate::model::ModelCard,
    profile_file: &crate::model::SourceFile,
    workload: &Workload,
) -> Result<Plan, crate::error::PlanError> {
    workload.validate()?;
    let profile = crate::profile::parse_profile(profile_file)?;
    let spec = crate::model::parse_model(card)?;
    plan_parsed(&spec, card, &profile, &profile_file.text, workload)
}

/// Plan already-parsed inputs (so `--all` parses each file once). The model-side figures come from [`crate::model`].
/// Errors: a workload the model cannot serve (longer than its `max_position_embeddings`), and any input whose sizes
/// cannot be represented (see [`MAX_PLAN_INT`]).
pub fn plan_parsed(
    spec: &ModelSpec,
    card: &crate::model::ModelCard,
    profile: &DeviceProfile,
    profile_text: &str,
    workload: &Workload,
) -> Result<Plan, crate::error::PlanError> {
    workload.validate()?;
    if spec.max_position_embeddings > 0 && workload.max_model_len > spec.max_position_embeddings {
        return Err(crate::error::PlanError::Workload(format!(
            "max_model_len {} is above `{}`'s max_position_embeddings {} ({}): the model was not trained for \
             longer sequences (lower --max-model-len)",
            workload.max_model_len, spec.id, spec.max_position_embeddings, card.config.path
        )));
    }
    check_inventory(spec, &card.config.path)?;
    let prompt = workload.effective_prompt_len();
    let capped = workload.capped(profile);
    let profile = &capped;
    build(Inputs {
        spec,
        cache: crate::model::cache_budget(spec, &workload.cache_workload()),
        decode_flops_per_token: crate::model::decode_flops_per_token(spec, prompt),
        prefill_flops: crate::model::prefill_flops(spec, prompt),
        profile,
        workload,
        hashes: InputHashes::of(
            &card.config.text,
            card.quant_config.as_ref().map(|q| q.text.as_str()),
            profile_text,
        ),
    })
}

/// Every tensor's bytes and parameters, and their totals, fit in a plan; the error names the first tensor that does
/// not, with its shape, so the config key behind it can be found.
fn check_inventory(spec: &ModelSpec, config_path: &str) -> Result<(), crate::error::PlanError> {
    let (mut bytes, mut params) = (0u128, 0u128);
    for t in &spec.inventory {
        bytes += u128::from(t.bytes);
        params += u128::from(t.params);
        if t.bytes > MAX_PLAN_INT || t.params > MAX_PLAN_INT || bytes > u128::from(MAX_PLAN_INT) {
            return Err(crate::error::PlanError::Unrepresentable(format!(
                "tensor `{}` of shape {:?} ({config_path}) makes the checkpoint larger than {MAX_PLAN_INT} bytes; \
                 check the sizes in the config (vocab_size, hidden_size, intermediate_size, layer and head counts)",
                t.name, t.shape
            )));
        }
    }
    if params > u128::from(MAX_PLAN_INT) {
        return Err(crate::error::PlanError::Unrepresentable(format!(
            "`{}` has more than {MAX_PLAN_INT} parameters ({config_path})",
            spec.id
        )));
    }
    Ok(())
}

/// The caches and RoPE tables the workload asks for fit in a plan; the error names the workload numbers behind them.
fn check_cache(cache: &CacheBudget, w: &Workload) -> Result<(), crate::error::PlanError> {
    let reserved = u128::from(cache.total_bytes) + u128::from(cache.rope_table_bytes);
    let figures = [
        ("the cache", u128::from(cache.total_bytes)),
        (
            "the flat (layer-blind) cache",
            u128::from(cache.flat_total_bytes),
        ),
        ("the RoPE tables", u128::from(cache.rope_table_bytes)),
        (
            "the RoPE tables sized from max_position_embeddings",
            u128::from(cache.rope_table_bytes_uncapped),
        ),
        ("the cache plus the RoPE tables", reserved),
    ];
    for (what, v) in figures {
        // The model side saturates at u64::MAX: any figure at or above the limit may be a saturated one.
        if v >= u128::from(MAX_PLAN_INT) {
            return Err(crate::error::PlanError::Unrepresentable(format!(
                "{what} for max_model_len {} x max_num_seqs {} is more than {MAX_PLAN_INT} bytes (lower \
                 --max-model-len or --max-num-seqs)",
                w.max_model_len, w.max_num_seqs
            )));
        }
    }
    Ok(())
}

/// A pinned offload (`--offload-gib`) must be something the placement can do: there must be a pool linked to the
/// decode pool to put the bytes in, and the decoder layers must hold at least that many bytes. Either failure used to
/// be silent (nothing moved, or everything did).
fn check_pinned_offload(
    spec: &ModelSpec,
    path: &WeightPath,
    profile: &DeviceProfile,
    w: &Workload,
) -> Result<(), crate::error::PlanError> {
    let Some(target) = w.offload_bytes else {
        return Ok(());
    };
    let unit = profile.decode_unit();
    let primary = profile
        .pools
        .iter()
        .position(|p| p.id == unit.pool)
        .unwrap_or(0);
    if crate::placement::offload_pool(profile, primary).is_none() {
        return Err(crate::error::PlanError::Workload(format!(
            "--offload-gib is given, but on `{}` the decode unit `{}` reads its weights from `{}` and no other pool is \
             linked to it: there is nowhere to offload to (drop --offload-gib)",
            profile.name, unit.id, unit.pool
        )));
    }
    let offloadable = crate::placement::pinned_offloadable_bytes(&spec.inventory, path);
    if target > offloadable {
        return Err(crate::error::PlanError::Workload(format!(
            "--offload-gib asks for {target} bytes ({:.2} GiB) but `{}` has only {offloadable} bytes ({:.2} GiB) of \
             decoder-layer weights on the {:?} path, the only tensors a pinned offload moves",
            gib(target),
            spec.id,
            gib(offloadable),
            path.format
        )));
    }
    Ok(())
}

/// A prediction is a finite, positive step time. A rate the profile parser accepts (positive, finite) can still be
/// absurd enough to make a step infinite (1e-300 B/s) or zero; that is an error naming the term and its rate, never a
/// plan that "fits" at 0 tok/s.
fn check_prediction(p: &Prediction) -> Result<(), crate::error::PlanError> {
    let bad = p
        .decode_terms
        .iter()
        .chain(&p.prefill_terms)
        .chain(p.batched.iter().flat_map(|b| &b.terms))
        .find(|t| !t.seconds.is_finite() || !t.rate_per_s.is_finite() || t.rate_per_s <= 0.0);
    if let Some(t) = bad {
        return Err(crate::error::PlanError::Unrepresentable(format!(
            "the term `{}` takes {} s ({} at {} per second): check that rate in the profile",
            t.name, t.seconds, t.amount, t.rate_per_s
        )));
    }
    let mut rates = vec![p.decode_step_s, p.decode_tok_s, p.prefill_tok_s];
    if let Some(b) = &p.batched {
        rates.extend([b.step_s, b.per_sequence_tok_s, b.aggregate_tok_s]);
    }
    if rates.iter().any(|x| !x.is_finite() || *x <= 0.0) {
        return Err(crate::error::PlanError::Unrepresentable(format!(
            "the prediction is not a finite positive rate (decode step {} s, {} tok/s; prefill {} tok/s): check the \
             profile's rates",
            p.decode_step_s, p.decode_tok_s, p.prefill_tok_s
        )));
    }
    Ok(())
}

/// Backstop: every integer of the plan fits a TOML integer. The checks above make this hold for the inputs they
/// name; this one names the field when an arithmetic path they do not foresee produces a larger figure.
fn check_plan_ints(plan: &Plan) -> Result<(), crate::error::PlanError> {
    fn walk(v: &serde_json::Value, at: &mut String) -> Option<(String, u64)> {
        match v {
            serde_json::Value::Number(n) => n
                .as_u64()
                .filter(|&x| x > MAX_PLAN_INT)
                .map(|x| (at.clone(), x)),
            serde_json::Value::Array(items) => items.iter().enumerate().find_map(|(i, x)| {
                let len = at.len();
                let _ = write!(at, "[{i}]");
                let r = walk(x, at);
                at.truncate(len);
                r
            }),
            serde_json::Value::Object(m) => m.iter().find_map(|(k, x)| {
                let len = at.len();
                if !at.is_empty() {
                    at.push('.');
                }
                at.push_str(k);
                let r = walk(x, at);
                at.truncate(len);
                r
            }),
            _ => None,
        }
    }
    let v = serde_json::to_value(plan)
        .map_err(|e| crate::error::PlanError::Serialize(e.to_string()))?;
    match walk(&v, &mut String::new()) {
        Some((field, x)) => Err(crate::error::PlanError::Unrepresentable(format!(
            "the plan's `{field}` would be {x}, more than {MAX_PLAN_INT}: check the profile's and the model's sizes"
        ))),
        None => Ok(()),
    }
}

/// Compile parsed inputs into a plan. Pure and total: any inputs that parsed give a plan (possibly `does-not-fit`)
/// or an error naming the input that cannot be served or represented.
pub fn build(inputs: Inputs<'_>) -> Result<Plan, crate::error::PlanError> {
    let Inputs {
        spec,
        cache,
        decode_flops_per_token,
        prefill_flops,
        profile,
        workload,
        hashes,
    } = inputs;
    check_cache(&cache, workload)?;
    let unit = profile.decode_unit();
    let mut path = choose(&spec.quantization, unit, workload);
    path.groups = crate::weight_path::group_kernels(spec, &path, unit);
    path.prefill = crate::weight_path::prefill(&path, unit, workload)?;
    check_pinned_offload(spec, &path, profile, workload)?;
    let fixed = cache.total_bytes.saturating_add(cache.rope_table_bytes);
    let a = place(&spec.inventory, &path, profile, workload, fixed);
    let (mut ledgers, mut verdict, mut shortfall) =
        admit(profile, &a, cache.total_bytes, cache.rope_table_bytes);
    let vision: Vec<usize> = if workload.images {
        (0..spec.inventory.len())
            .filter(|&i| matches!(spec.inventory[i].access, Access::ConditionalImage))
            .collect()
    } else {
        Vec::new()
    };
    if let (Some(sf), Some(pinned)) = (shortfall.as_mut(), workload.offload_bytes) {
        // Weights or the caches on top of them: either way, pinning more weights off the pool is what would make room.
        if (sf.component == "weights" || sf.component == "cache")
            && sf.pool == profile.pools[a.primary].id
        {
            // Whole tensors move, so this is a floor: the plan at that figure may still need a little more.
            let _ = write!(
                sf.reason,
                "; the pinned offload of {:.2} GiB would have to be at least {:.2} GiB",
                gib(pinned),
                gib(pinned.saturating_add(sf.shortfall_bytes))
            );
        }
    }
    let (stages, refused) = stages(profile, &a, &unit.id, &vision);
    if shortfall.is_none() && refused.is_some() {
        verdict = Verdict::DoesNotFit;
        shortfall = refused;
    }
    // The chunk takes what the plan left free, so it is chosen after everything else and never makes a plan not fit.
    let decode = ledgers
        .iter()
        .position(|l| l.pool == profile.pools[a.primary].id);
    let prompt_chunk = crate::prompt_chunk::choose(
        spec,
        unit,
        workload.max_model_len,
        decode.map(|i| &ledgers[i]),
        verdict == Verdict::Fits,
    );
    if let Some(i) = decode {
        crate::prompt_chunk::charge(&mut ledgers[i], &prompt_chunk);
    }
    let prefill_tokens = workload.effective_prompt_len();
    let prediction = predict(
        profile,
        &path,
        &a,
        &Work {
            cache: &cache,
            decode_flops_per_token,
            prefill_flops,
            prefill_tokens,
            decode_context: prefill_tokens,
            batch: workload.max_num_seqs,
            decode_kernels: crate::model::decode_kernels(spec),
            engine: workload.engine,
        },
    );
    check_prediction(&prediction)?;
    let count = |k: LayerKind| spec.layers.iter().filter(|&&l| l == k).count() as u64;
    let plan = Plan {
        planner_version: PLANNER_VERSION.to_owned(),
        verdict,
        shortfall,
        model: ModelInfo {
            id: spec.id.clone(),
            architecture: spec.architecture.clone(),
            model_type: spec.model_type.clone(),
            layers: spec.layers.len() as u64,
            full_attention_layers: count(LayerKind::FullAttention),
            sliding_attention_layers: count(LayerKind::SlidingAttention),
            linear_attention_layers: count(LayerKind::LinearAttention),
            quantization: spec.quantization.clone(),
        },
        device: DeviceInfo {
            profile: profile.name.clone(),
            decode_unit: unit.id.clone(),
            decode_pool: profile.pools[a.primary].id.clone(),
        },
        inputs: hashes,
        workload: workload.clone(),
        inventory: inventory_summary(spec, &a, workload),
        placement: placement_summary(spec, profile, &a),
        weight_path: path,
        cache,
        prompt_chunk,
        ledgers,
        stages,
        // A plan that does not fit has no speed: the rates of a placement that cannot be admitted would only mislead
        // (issue 23 §4: a pinned 4 GiB offload that does not fit was predicted faster than the 10 GiB one that does).
        prediction: (verdict == Verdict::Fits).then_some(prediction),
    };
    check_plan_ints(&plan)?;
    Ok(plan)
}

fn inventory_summary(spec: &ModelSpec, a: &Assignment, workload: &Workload) -> InventorySummary {
    let skipped: Vec<&crate::model::TensorEntry> = spec
        .inventory
        .iter()
        .filter(|t| !workload.loads(t))
        .collect();
    let not_loaded = (!skipped.is_empty()).then(|| NotLoaded {
        tensors: skipped.len() as u64,
        checkpoint_bytes: skipped
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.bytes)),
        reason: workload.engine.not_loaded_reason().to_owned(),
    });
    let mut by: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    for (i, t) in spec.inventory.iter().enumerate() {
        let e = by.entry(access_class(&t.access)).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(a.planned[i]);
    }
    let sum = |v: &mut dyn Iterator<Item = u64>| v.fold(0u64, u64::saturating_add);
    InventorySummary {
        tensors: spec.inventory.len() as u64,
        total_bytes: sum(&mut spec.inventory.iter().map(|t| t.bytes)),
        total_params: sum(&mut spec
            .inventory
            .iter()
            .filter(|t| !is_quantization_aux(t))
            .map(|t| t.params)),
        planned_bytes: sum(&mut a.planned.iter().copied()),
        decode_bytes_per_token: sum(&mut a.per_token.iter().copied()),
        by_access: by
            .into_iter()
            .map(|(class, (tensors, planned_bytes))| AccessClass {
                class: class.to_owned(),
                tensors,
                planned_bytes,
            })
            .collect(),
        not_loaded,
    }
}

/// Whether a tensor is quantization metadata rather than model parameters: block and tensor scales, NVFP4's global
/// and input scales, GPTQ's zero points, scales and `g_idx`. Scales inside the vision tower and the MTP head carry
/// those parts' roles, so the name decides there.
pub fn is_quantization_aux(t: &crate::model::TensorEntry) -> bool {
    const SUFFIXES: [&str; 7] = [
        ".weight_scale_inv",
        ".weight_scale",
        ".weight_scale_2",
        ".input_scale",
        ".qzeros",
        ".scales",
        ".g_idx",
    ];
    t.role == Role::Scale || SUFFIXES.iter().any(|s| t.name.ends_with(s))
}

/// Inclusive ranges of a sorted, deduplicated list.
fn range_pairs(sorted: &[u32]) -> Vec<[u32; 2]> {
    let mut out: Vec<[u32; 2]> = Vec::new();
    for &l in sorted {
        match out.last_mut() {
            Some(r) if r[1] + 1 == l => r[1] = l,
            _ => out.push([l, l]),
        }
    }
    out
}

/// What a non-default pool claims.
#[derive(Default)]
struct Claims {
    whole_layers: Vec<[u32; 2]>,
    whole_layer_roles: Vec<LayerRoleClaim>,
    whole_roles: Vec<Role>,
    listed: Vec<String>,
}

/// The claims of a non-default pool: whole decoder layers, whole roles within other decoder layers, whole roles
/// outside the decoder layers, and the names of the tensors none of these covers (at most the one unit a byte budget
/// split). Together with "the decode pool holds the rest" they reproduce the assignment exactly, which the tests
/// check tensor by tensor.
fn claims(spec: &ModelSpec, a: &Assignment, pool: usize) -> Claims {
    let inv = &spec.inventory;
    let mut layer_all: BTreeMap<u32, bool> = BTreeMap::new();
    let mut layer_role_all: BTreeMap<(String, u32), (Role, bool)> = BTreeMap::new();
    let mut role_all: BTreeMap<String, (Role, bool)> = BTreeMap::new();
    for (i, t) in inv.iter().enumerate() {
        let here = a.pool_of[i] == pool;
        match t.layer.filter(|_| is_decoder_layer_tensor(t)) {
            Some(l) => {
                *layer_all.entry(l).or_insert(true) &= here;
                layer_role_all
                    .entry((format!("{:?}", t.role), l))
                    .or_insert((t.role, true))
                    .1 &= here;
            }
            None => {
                role_all
                    .entry(format!("{:?}", t.role))
                    .or_insert((t.role, true))
                    .1 &= here
            }
        }
    }
    let whole_layers: Vec<u32> = layer_all
        .iter()
        .filter(|(_, &all)| all)
        .map(|(&l, _)| l)
        .collect();
    let mut by_role: BTreeMap<String, (Role, Vec<u32>)> = BTreeMap::new();
    for ((key, l), (role, all)) in &layer_role_all {
        if *all && whole_layers.binary_search(l).is_err() {
            by_role
                .entry(key.clone())
                .or_insert((*role, Vec::new()))
                .1
                .push(*l);
        }
    }
    let whole_roles: Vec<Role> = role_all
        .values()
        .filter(|(_, all)| *all)
        .map(|(r, _)| *r)
        .collect();
    let covered =
        |t: &crate::model::TensorEntry| match t.layer.filter(|_| is_decoder_layer_tensor(t)) {
            Some(l) => {
                whole_layers.binary_search(&l).is_ok()
                    || by_role
                        .get(&format!("{:?}", t.role))
                        .is_some_and(|(_, ls)| ls.binary_search(&l).is_ok())
            }
            None => whole_roles.contains(&t.role),
        };
    let listed = inv
        .iter()
        .enumerate()
        .filter(|&(i, t)| a.pool_of[i] == pool && !covered(t))
        .map(|(_, t)| t.name.clone())
        .collect();
    Claims {
        whole_layers: range_pairs(&whole_layers),
        whole_layer_roles: by_role
            .into_values()
            .map(|(role, ls)| LayerRoleClaim {
                role,
                layers: range_pairs(&ls),
            })
            .collect(),
        whole_roles,
        listed,
    }
}

fn placement_summary(spec: &ModelSpec, profile: &DeviceProfile, a: &Assignment) -> Placement {
    let mut pools = Vec::new();
    for (p, pool) in profile.pools.iter().enumerate() {
        let members: Vec<usize> = (0..spec.inventory.len())
            .filter(|&i| a.pool_of[i] == p)
            .collect();
        if members.is_empty() {
            continue;
        }
        let mut groups: BTreeMap<(String, &'static str), (Role, Vec<usize>)> = BTreeMap::new();
        for &i in &members {
            let t = &spec.inventory[i];
            let key = (format!("{:?}", t.role), access_class(&t.access));
            groups
                .entry(key)
                .or_insert_with(|| (t.role, Vec::new()))
                .1
                .push(i);
        }
        // Per decoder layer: does this pool hold all of its decoder-layer tensors, or only some?
        let mut layer_here: BTreeMap<u32, (bool, bool)> = BTreeMap::new();
        for (i, t) in spec.inventory.iter().enumerate() {
            if let Some(l) = t.layer.filter(|_| is_decoder_layer_tensor(t)) {
                let e = layer_here.entry(l).or_insert((false, true));
                let here = a.pool_of[i] == p;
                e.0 |= here;
                e.1 &= here;
            }
        }
        let whole: Vec<u32> = layer_here
            .iter()
            .filter(|(_, &(any, all))| any && all)
            .map(|(&l, _)| l)
            .collect();
        let split: Vec<u32> = layer_here
            .iter()
            .filter(|(_, &(any, all))| any && !all)
            .map(|(&l, _)| l)
            .collect();
        let is_default = p == a.primary;
        let c = if is_default {
            Claims::default()
        } else {
            claims(spec, a, p)
        };
        pools.push(PoolPlacement {
            pool: pool.id.clone(),
            tensors: members.len() as u64,
            bytes: members
                .iter()
                .fold(0u64, |acc, &i| acc.saturating_add(a.planned[i])),
            decode_bytes_per_token: members
                .iter()
                .fold(0u64, |acc, &i| acc.saturating_add(a.per_token[i])),
            layers: ranges(&whole),
            split_layers: ranges(&split),
            is_default,
            whole_layers: c.whole_layers,
            whole_layer_roles: c.whole_layer_roles,
            whole_roles: c.whole_roles,
            tensors_listed: c.listed,
            groups: groups
                .into_iter()
                .map(|((_, access), (role, idx))| PlacementGroup {
                    role,
                    access: access.to_owned(),
                    tensors: idx.len() as u64,
                    bytes: idx
                        .iter()
                        .fold(0u64, |acc, &i| acc.saturating_add(a.planned[i])),
                    names: if idx.len() <= NAMES_LISTED {
                        idx.iter()
                            .map(|&i| spec.inventory[i].name.clone())
                            .collect()
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
        });
    }
    Placement {
        policy: a.policy.clone(),
        tensors_placed: pools.iter().map(|p| p.tensors).sum(),
        offloaded_bytes: profile
            .pools
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != a.primary)
            .fold(0u64, |acc, (i, _)| acc.saturating_add(a.bytes_in(i))),
        pools,
    }
}

/// `[0,1,2,5,7,8]` -> `0-2,5,7-8`.
pub fn ranges(sorted: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

fn gib(b: u64) -> f64 {
    b as f64 / Workload::GIB
}

impl Plan {
    /// Bytes tensor `t` of the model takes once loaded under this plan: none when the target engine does not load it
    /// for this workload ([`Workload::loads`]), else its size on the weight path.
    pub fn planned_bytes(&self, t: &crate::model::TensorEntry) -> u64 {
        if self.workload.loads(t) {
            self.weight_path.planned_bytes(t)
        } else {
            0
        }
    }

    /// The pool a tensor of the model is placed in: the first non-default pool that lists it by name, holds its
    /// whole decoder layer, or holds its whole role (outside the decoder layers); else the decode unit's pool. This is
    /// how the engine reads a placement.
    pub fn pool_for(&self, t: &crate::model::TensorEntry) -> &str {
        let decoder_layer = t.layer.filter(|_| is_decoder_layer_tensor(t));
        for p in self.placement.pools.iter().filter(|p| !p.is_default) {
            let claimed = p.tensors_listed.contains(&t.name)
                || match decoder_layer {
                    Some(l) => {
                        let within = |rs: &[[u32; 2]]| rs.iter().any(|r| r[0] <= l && l <= r[1]);
                        within(&p.whole_layers)
                            || p.whole_layer_roles
                                .iter()
                                .any(|c| c.role == t.role && within(&c.layers))
                    }
                    None => p.whole_roles.contains(&t.role),
                };
            if claimed {
                return &p.pool;
            }
        }
        &self.device.decode_pool
    }

    /// The plan as TOML text (the stable format). The plan's types serialize to TOML by construction (string map
    /// keys, finite rates, tables after values, integers checked against [`MAX_PLAN_INT`] when the plan was built);
    /// a plan edited by hand afterwards can still fail, and then this is an error, never a corrupt file.
    pub fn to_toml(&self) -> Result<String, crate::error::PlanError> {
        toml::to_string_pretty(self).map_err(|e| crate::error::PlanError::Serialize(e.to_string()))
    }

    /// Read a plan back (round-trip, or a plan handed to the engine).
    pub fn from_toml(path: &str, text: &str) -> Result<Self, crate::error::InputError> {
        let plan: Plan = toml::from_str(text).map_err(|e| {
            crate::error::InputError::new(
                path,
                text,
                format!("invalid plan: {}", e.message().trim()),
            )
            .at(e.span(), "here")
        })?;
        plan.check_accounts(path, text)?;
        Ok(plan)
    }

    /// The ledger of the pool decode reads (every plan has one: admission writes a ledger per pool).
    pub fn decode_ledger(&self) -> Option<&Ledger> {
        self.ledgers
            .iter()
            .find(|l| l.pool == self.device.decode_pool)
    }

    /// A plan read back must keep the accounts the planner wrote: the engine sizes its prompt chunk and its
    /// admission from them, so a hand edit that runs a longer chunk than the ledger charges, or a ledger that no
    /// longer adds up, is refused here, pointing at the table to re-plan.
    fn check_accounts(&self, path: &str, text: &str) -> Result<(), crate::error::InputError> {
        use crate::profile::{span_of, Seg};
        let err = |msg: String, at: &[Seg]| {
            crate::error::InputError::new(path, text, msg)
                .at(span_of(text, at), "re-plan rather than edit this")
        };
        let chunk = [Seg::Key("prompt_chunk")];
        let c = &self.prompt_chunk;
        let needed = c
            .tokens
            .saturating_sub(crate::prompt_chunk::BASE_TOKENS)
            .checked_mul(c.scratch_bytes_per_token);
        if c.tokens == 0 || needed.is_none_or(|n| n > c.extra_scratch_bytes) {
            return Err(err(
                format!(
                    "invalid plan: [prompt_chunk] runs {} tokens of {} bytes each beyond the first {} but charges {} \
                     bytes: a chunk is at least 1 token, and its extra_scratch_bytes cover \
                     (tokens - {}) x scratch_bytes_per_token",
                    c.tokens,
                    c.scratch_bytes_per_token,
                    crate::prompt_chunk::BASE_TOKENS,
                    c.extra_scratch_bytes,
                    crate::prompt_chunk::BASE_TOKENS
                ),
                &chunk,
            ));
        }
        let charged = self.decode_ledger().map_or(0, |l| l.prompt_scratch_bytes);
        if charged < c.extra_scratch_bytes {
            return Err(err(
                format!(
                    "invalid plan: [prompt_chunk] needs {} bytes beyond the runtime overhead but the `{}` ledger \
                     charges {charged} (prompt_scratch_bytes)",
                    c.extra_scratch_bytes, self.device.decode_pool
                ),
                &chunk,
            ));
        }
        if let Some((i, l)) = self.ledgers.iter().enumerate().find(|(_, l)| !l.adds_up()) {
            return Err(err(
                format!(
                    "invalid plan: the `{}` ledger does not add up (taken + overhead + reserve + cache + RoPE \
                     tables + weights + prompt scratch + free must equal capacity + shortfall)",
                    l.pool
                ),
                &[Seg::Key("ledger"), Seg::Index(i)],
            ));
        }
        Ok(())
    }

    /// A readable summary: verdict, the memory map per pool, the bottleneck, the prediction.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} on {} ({}): {}",
            self.model.id,
            self.device.profile,
            self.device.decode_unit,
            match self.verdict {
                Verdict::Fits => "fits".to_owned(),
                Verdict::DoesNotFit => "DOES NOT FIT".to_owned(),
            }
        );
        if let Some(sf) = &self.shortfall {
            let _ = writeln!(
                s,
                "  shortfall: {} on `{}`: {}",
                sf.component, sf.pool, sf.reason
            );
        }
        let _ = writeln!(
            s,
            "  weight path: {:?} via {}{}\n    {}",
            self.weight_path.format,
            self.weight_path.kernel,
            if self.weight_path.verified {
                ""
            } else {
                " (unverified)"
            },
            self.weight_path.reason
        );
        if let Some(p) = &self.weight_path.prefill {
            let _ = writeln!(
                s,
                "    prefill: {} activations from {} rows\n      {}",
                p.activations.name(),
                p.min_rows,
                p.reason
            );
        }
        if !self.weight_path.groups.is_empty() {
            let groups: Vec<String> = self
                .weight_path
                .groups
                .iter()
                .map(|g| {
                    let name = |v: &dyn erased::Name| v.snake();
                    format!("{} {} ({})", name(&g.group), name(&g.kernel), g.modules)
                })
                .collect();
            let _ = writeln!(s, "    kernels: {}", groups.join(", "));
        }
        let _ = writeln!(
            s,
            "  weights: {:.2} GiB checkpoint, {:.2} GiB planned, {:.2} GiB read per token; cache {:.1} MiB \
             (hybrid {} B/token, flat {} B/token, state {:.1} MiB/seq)",
            gib(self.inventory.total_bytes),
            gib(self.inventory.planned_bytes),
            gib(self.inventory.decode_bytes_per_token),
            self.cache.total_bytes as f64 / 1048576.0,
            self.cache.bytes_per_token_hybrid,
            self.cache.bytes_per_token_flat,
            self.cache.state_bytes_per_seq as f64 / 1048576.0,
        );
        let _ = writeln!(s, "  memory map (GiB):");
        let _ = writeln!(
            s,
            "    {:<10} {:>9} {:>8} {:>9} {:>8} {:>8} {:>9} {:>7} {:>8} {:>9}",
            "pool",
            "capacity",
            "taken",
            "overhead",
            "reserve",
            "cache",
            "weights",
            "prompt",
            "free",
            "short"
        );
        for l in &self.ledgers {
            let _ = writeln!(
                s,
                "    {:<10} {:>9.2} {:>8.2} {:>9.2} {:>8.2} {:>8.2} {:>9.2} {:>7.2} {:>8.2} {:>9.2}{}",
                l.pool,
                gib(l.capacity_bytes),
                gib(l.taken_bytes),
                gib(l.runtime_overhead_bytes),
                gib(l.reserve_bytes),
                gib(l.cache_bytes.saturating_add(l.rope_table_bytes)),
                gib(l.weight_bytes),
                gib(l.prompt_scratch_bytes),
                gib(l.free_bytes),
                gib(l.shortfall_bytes),
                if l.budget_declared {
                    ""
                } else {
                    "  (no budget declared)"
                }
            );
        }
        let stages: Vec<String> = self
            .stages
            .iter()
            .map(|st| {
                format!(
                    "{} on {} (`{}`)",
                    st.name,
                    st.unit.as_deref().unwrap_or("NOTHING"),
                    st.pool
                )
            })
            .collect();
        let _ = writeln!(s, "  stages: {}", stages.join("; "));
        let _ = writeln!(
            s,
            "  prompt chunk: {} tokens ({:.2} MiB of activations a token): {}",
            self.prompt_chunk.tokens,
            self.prompt_chunk.scratch_bytes_per_token as f64 / 1048576.0,
            self.prompt_chunk.reason
        );
        let _ = writeln!(s, "  placement: {}", self.placement.policy);
        for p in &self.placement.pools {
            let _ = writeln!(
                s,
                "    {:<10} {:>6} tensors {:>8.2} GiB, {:>8.3} GiB/token, layers [{}]{}",
                p.pool,
                p.tensors,
                gib(p.bytes),
                gib(p.decode_bytes_per_token),
                p.layers,
                if p.split_layers.is_empty() {
                    String::new()
                } else {
                    format!(", split [{}]", p.split_layers)
                }
            );
        }
        let Some(pr) = &self.prediction else {
            let _ = writeln!(
                s,
                "  prediction: none, the plan does not fit (see the shortfall above)"
            );
            return s;
        };
        let _ = writeln!(
            s,
            "  prediction: decode {:.3} tok/s ({:.1} ms/token), prefill {:.0} tok/s (pp{})",
            pr.decode_tok_s,
            pr.decode_step_s * 1e3,
            pr.prefill_tok_s,
            pr.prefill_tokens
        );
        let _ = writeln!(s, "  bottleneck: {}", pr.bound);
        if let Some(b) = &pr.batched {
            let _ = writeln!(
                s,
                "  batched decode at {} sequences: {:.3} tok/s each, {:.3} tok/s together ({:.1} ms/step), {}; \
                 compute takes over {}",
                b.batch,
                b.per_sequence_tok_s,
                b.aggregate_tok_s,
                b.step_s * 1e3,
                b.bound,
                b.compute_bound_from_batch
                    .map_or_else(|| "at no batch".to_owned(), |n| format!("from {n} sequences"))
            );
        }
        for t in &pr.decode_terms {
            let _ = writeln!(
                s,
                "    {} {:<60} {:>9.2} ms",
                if t.counted { "*" } else { " " },
                t.name,
                t.seconds * 1e3
            );
        }
        s
    }
}

/// The snake_case name serde gives a unit enum variant (how the plan's TOML spells it).
mod erased {
    pub(super) trait Name {
        fn snake(&self) -> String;
    }
    impl<T: serde::Serialize> Name for T {
        fn snake(&self) -> String {
            serde_json::to_value(self)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        }
    }
}

pub fn plan_schema() -> schemars::schema::RootSchema {
    schemars::schema_for!(Plan)
}

pub fn profile_schema() -> schemars::schema::RootSchema {
    schemars::schema_for!(crate::profile::DeviceProfile)
}

/// The committed schema texts, exactly as `cargo xtask codegen` writes them.
pub fn schema_files() -> Vec<(&'static str, String)> {
    let render = |s: schemars::schema::RootSchema| {
        let mut text = serde_json::to_string_pretty(&s).unwrap_or_default();
        text.push('\n');
        text
    };
    vec![
        ("schemas/plan.schema.json", render(plan_schema())),
        ("schemas/profile.schema.json", render(profile_schema())),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::{Access, ModelSpec, Quantization, Role};
    use crate::testutil::{small_model, tensor, two_pools};

    fn spec(inventory: Vec<crate::model::TensorEntry>) -> ModelSpec {
        ModelSpec {
            id: "unit".into(),
            architecture: "Unit".into(),
            model_type: "unit".into(),
            hidden_size: 8,
            vocab_size: 8,
            layers: vec![LayerKind::FullAttention; 4],
            num_q_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
            sliding_window: None,
            max_position_embeddings: 64,
            tie_word_embeddings: false,
            quantization: Quantization::Fp8Block { block: [128, 128] },
            inventory,
            gdn: None,
            moe: None,
            has_vision: true,
            mtp_layers: 1,
            rope: vec![],
            runtime: crate::testutil::unit_runtime(),
        }
    }

    /// The small model with a second tensor per layer (a norm after its weight), so a pinned offload can split a
    /// layer.
    fn spec_with_norms() -> ModelSpec {
        let mut inv = small_model();
        for l in 0..4 {
            inv.push(tensor(
                &format!("layers.{l}.norm"),
                2,
                Access::EveryToken,
                Role::Small,
                Some(l),
            ));
        }
        spec(inv)
    }

    fn unit_plan(spec: &ModelSpec, vram: u64, w: &Workload) -> (Plan, Assignment) {
        let profile = two_pools(vram, 100_000);
        let cache = crate::model::cache_budget(spec, &w.cache_workload());
        let path = choose(&spec.quantization, profile.decode_unit(), w);
        let a = place(
            &spec.inventory,
            &path,
            &profile,
            w,
            cache.total_bytes + cache.rope_table_bytes,
        );
        let plan = build(Inputs {
            spec,
            cache,
            decode_flops_per_token: 1,
            prefill_flops: 1,
            profile: &profile,
            workload: w,
            hashes: InputHashes::of("", None, ""),
        })
        .unwrap();
        (plan, a)
    }

    #[test]
    fn pool_for_reproduces_the_assignment_tensor_by_tensor() {
        let s = spec_with_norms();
        for (vram, offload) in [
            (100_000, None),
            (600, None),
            (450, None),
            (100_000, Some(150)),
            (100_000, Some(0)),
        ] {
            let w = Workload {
                offload_bytes: offload,
                max_model_len: 4,
                ..Workload::default()
            };
            let (plan, a) = unit_plan(&s, vram, &w);
            for (i, t) in s.inventory.iter().enumerate() {
                let want = &two_pools(1, 1).pools[a.pool_of[i]].id;
                assert_eq!(
                    plan.pool_for(t),
                    want,
                    "{} at vram {vram}, offload {offload:?}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn a_split_layer_lists_its_offloaded_tensors_by_name() {
        let s = spec(small_model());
        let w = Workload {
            offload_bytes: Some(150),
            max_model_len: 4,
            ..Workload::default()
        };
        let (plan, _) = unit_plan(&s, 100_000, &w);
        let host = plan
            .placement
            .pools
            .iter()
            .find(|p| p.pool == "host")
            .unwrap();
        assert_eq!(host.whole_layers, vec![[0, 1]]);
        assert!(host.tensors_listed.is_empty());
        assert!(host.whole_roles.is_empty());
    }

    #[test]
    fn summary_shows_the_memory_map_the_bottleneck_and_the_shortfall() {
        let s = spec(small_model());
        let w = Workload {
            offload_bytes: Some(0),
            max_model_len: 4,
            ..Workload::default()
        };
        // 10 overhead + 680 bytes of weights fit in 1000; the 640 of cache and RoPE tables on top do not, so the
        // cache is what grew.
        let (plan, _) = unit_plan(&s, 1000, &w);
        let text = plan.summary();
        assert!(text.contains("DOES NOT FIT"), "{text}");
        assert!(text.contains("shortfall: cache on `vram`"), "{text}");
        assert!(
            text.contains("memory map") && text.contains("vram") && text.contains("host"),
            "{text}"
        );
        // A plan that does not fit prints no speed (issue 23 §4) and its file carries none.
        assert!(plan.prediction.is_none());
        assert!(
            !text.contains("tok/s") && !text.contains("bottleneck"),
            "{text}"
        );
        assert!(
            text.contains("prediction: none, the plan does not fit"),
            "{text}"
        );
        // One that fits does.
        let (plan, _) = unit_plan(&s, 100_000, &w);
        let text = plan.summary();
        assert!(
            text.contains("bottleneck: bandwidth-bound: read pool `vram`"),
            "{text}"
        );
        assert!(plan.prediction.is_some());
    }

    #[test]
    fn a_split_layer_shows_as_split_in_both_pools() {
        let s = spec_with_norms();
        // 150 bytes pinned in checkpoint order: layers.0 (100) and layers.1 (100) move; each layer's norm comes after
        // all the layers in this inventory, so layers 0 and 1 are split between the pools.
        let w = Workload {
            offload_bytes: Some(150),
            max_model_len: 4,
            ..Workload::default()
        };
        let (plan, _) = unit_plan(&s, 100_000, &w);
        let pool = |id: &str| plan.placement.pools.iter().find(|p| p.pool == id).unwrap();
        assert_eq!(
            (
                pool("host").layers.as_str(),
                pool("host").split_layers.as_str()
            ),
            ("", "0-1")
        );
        assert_eq!(
            (
                pool("vram").layers.as_str(),
                pool("vram").split_layers.as_str()
            ),
            ("2-3", "0-1")
        );
        let text = plan.summary();
        assert!(text.contains("layers [], split [0-1]"), "{text}");
        assert!(text.contains("layers [2-3], split [0-1]"), "{text}");
    }

    #[test]
    fn total_params_leaves_out_scales_and_zero_points() {
        let mut inv = small_model();
        let n = inv.len();
        inv.push(tensor(
            "layers.0.weight_scale_inv",
            7,
            Access::EveryToken,
            Role::Scale,
            Some(0),
        ));
        inv.push(tensor(
            "mtp.fc.weight_scale_inv",
            5,
            Access::ConditionalSpeculative,
            Role::MtpHead,
            None,
        ));
        inv.push(tensor(
            "visual.blocks.0.qzeros",
            3,
            Access::ConditionalImage,
            Role::VisionTower,
            None,
        ));
        let s = spec(inv);
        let w = Workload {
            max_model_len: 4,
            ..Workload::default()
        };
        let (plan, _) = unit_plan(&s, 100_000, &w);
        let params: u64 = s.inventory[..n].iter().map(|t| t.params).sum();
        assert_eq!(plan.inventory.total_params, params);
        assert_eq!(plan.inventory.tensors, n as u64 + 3);
    }

    #[test]
    fn ranges_compress_runs() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[3]), "3");
    }

    #[test]
    fn sha256_of_empty_text_is_the_known_digest() {
        assert_eq!(
            sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
