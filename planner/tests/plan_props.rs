//! Property tests over random but valid profiles (written out as TOML and parsed back, so the parser is exercised
//! too), every committed model card and random workloads: every plan validates against the committed schema, places
//! every tensor exactly once, keeps ledgers that add up and a verdict that agrees with them; offloading more never
//! predicts faster decode; and the profile parser never panics on arbitrary text.

// `PlanError` carries its file's text for miette (see the allow in planner/src/lib.rs).
#![allow(clippy::result_large_err)]

mod common;

use std::sync::OnceLock;

use planner::model::{ModelCard, ModelSpec, SourceFile};
use planner::profile::{
    Arch, ComputeKind, ComputeUnit, DeviceProfile, IsaFacts, KernelRate, Link, Measured,
    MemoryPool, PeakRates, WeightFormat,
};
use planner::weight_path::PrefillActivations;
use planner::workload::{Priority, TargetEngine};
use planner::{Plan, PlanError, Verdict, Workload};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

fn m<T>(value: T) -> Measured<T> {
    Measured {
        value,
        source: "proptest".into(),
    }
}

fn models() -> &'static [(ModelCard, ModelSpec)] {
    static M: OnceLock<Vec<(ModelCard, ModelSpec)>> = OnceLock::new();
    M.get_or_init(|| {
        common::models()
            .iter()
            .map(|id| {
                let card = common::card(id);
                let spec = planner::model::parse_model(&card).unwrap();
                (card, spec)
            })
            .collect()
    })
}

fn plan_schema() -> &'static jsonschema::JSONSchema {
    static S: OnceLock<jsonschema::JSONSchema> = OnceLock::new();
    S.get_or_init(|| {
        let text =
            std::fs::read_to_string(common::root().join("schemas/plan.schema.json")).unwrap();
        jsonschema::JSONSchema::compile(&serde_json::from_str(&text).unwrap()).unwrap()
    })
}

#[derive(Debug, Clone)]
struct ProfileParams {
    gpu: bool,
    vram_gib: u64,
    taken_frac: f64,
    vram_read: f64,
    overhead_gib: u64,
    dram_gib: u64,
    dram_read: f64,
    link_frac: f64,
    sm: u32,
    amx: bool,
    kernel: Option<(WeightFormat, f64, f64)>,
}

fn profile_params() -> impl Strategy<Value = ProfileParams> {
    (
        any::<bool>(),
        1u64..200,
        0.0f64..0.3,
        50e9f64..5e12,
        0u64..4,
        4u64..512,
        5e9f64..300e9,
        0.001f64..1.0,
        prop::sample::select(vec![80u32, 90, 100, 120]),
        any::<bool>(),
        prop::option::of((
            prop::sample::select(vec![
                WeightFormat::Nvfp4,
                WeightFormat::Fp8Block,
                WeightFormat::W4a8,
            ]),
            0.01f64..1.0,
            0.01f64..1.0,
        )),
    )
        .prop_map(
            |(
                gpu,
                vram_gib,
                taken_frac,
                vram_read,
                overhead_gib,
                dram_gib,
                dram_read,
                link_frac,
                sm,
                amx,
                kernel,
            )| {
                ProfileParams {
                    gpu,
                    vram_gib,
                    taken_frac,
                    vram_read,
                    overhead_gib,
                    dram_gib,
                    dram_read,
                    link_frac,
                    sm,
                    amx,
                    kernel,
                }
            },
        )
}

fn build_profile(p: &ProfileParams) -> DeviceProfile {
    let pool = |id: &str, gib: u64, read: f64| MemoryPool {
        id: id.into(),
        description: "random".into(),
        capacity_bytes: m(gib * GIB),
        taken_bytes: m((gib as f64 * GIB as f64 * p.taken_frac) as u64),
        read_bytes_per_s: m(read),
        runtime_overhead_bytes: Some(m(p.overhead_gib * GIB / 2)),
        reserve_bytes: m(GIB / 8),
    };
    let kernels = |unit_rate: f64| -> Vec<KernelRate> {
        p.kernel
            .iter()
            .map(|&(format, d, o)| KernelRate {
                format,
                decode_weight_bytes_per_s: m(unit_rate * d),
                offloaded_weight_bytes_per_s: Some(m(unit_rate * d * o)),
                prefill_flops_per_s: Some(m(1e12)),
                // The int8 prompt rate on some kernels, so a plan that chooses int8 prompts takes either rate.
                prefill_int8_flops_per_s: (o > 0.3).then(|| m(1.5e12)),
                // Half the generated kernels carry a measured cache rate, so the weights-then-caches term is tried.
                decode_cache_bytes_per_s: (o > 0.5).then(|| m(unit_rate * d / 4.0)),
                engine: None,
                extrapolated: false,
            })
            .collect()
    };
    let cpu = ComputeUnit {
        id: "cpu".into(),
        kind: ComputeKind::Cpu,
        description: "random".into(),
        pool: "dram".into(),
        runs_engine: true,
        isa: IsaFacts {
            arch: Arch::X86_64,
            sm: None,
            avx512: true,
            vnni: true,
            bf16: true,
            amx: p.amx,
            source: "proptest".into(),
        },
        peak: PeakRates {
            bf16_flops_per_s: Some(m(1e12)),
            ..PeakRates::default()
        },
        kernels: if p.gpu {
            Vec::new()
        } else {
            kernels(p.dram_read)
        },
        kernel_floor_s: None,
    };
    let mut profile = DeviceProfile {
        name: "random".into(),
        description: "random".into(),
        pools: vec![pool("dram", p.dram_gib, p.dram_read)],
        links: Vec::new(),
        compute: vec![cpu],
    };
    if p.gpu {
        profile
            .pools
            .insert(0, pool("vram", p.vram_gib, p.vram_read));
        let link = p.vram_read * p.link_frac;
        profile.links.push(Link {
            from: "dram".into(),
            to: "vram".into(),
            description: "random".into(),
            bulk_bytes_per_s: m(link),
            weight_read_bytes_per_s: m(link),
        });
        profile.compute.insert(
            0,
            ComputeUnit {
                id: "gpu".into(),
                kind: ComputeKind::Gpu,
                description: "random".into(),
                pool: "vram".into(),
                runs_engine: true,
                isa: IsaFacts {
                    arch: Arch::Cuda,
                    sm: Some(p.sm),
                    avx512: false,
                    vnni: false,
                    bf16: true,
                    amx: false,
                    source: "proptest".into(),
                },
                peak: PeakRates {
                    bf16_flops_per_s: Some(m(1e14)),
                    ..PeakRates::default()
                },
                kernels: kernels(p.vram_read),
                kernel_floor_s: p.gpu.then(|| m(2.5e-6)),
            },
        );
    }
    profile
}

fn workload() -> impl Strategy<Value = Workload> {
    (
        // Up to the smallest committed card's max_position_embeddings (gemma-3-1b: 32768); longer is an error.
        1u64..32769,
        1u64..8,
        1u64..4096,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(0u64..64),
        prop::option::of(1u64..200),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(len, seqs, prompt, images, speculative, fidelity, vllm, offload, cap, int8)| {
                Workload {
                    max_model_len: len,
                    max_num_seqs: seqs,
                    // A prompt longer than the context is an error (issue 23 §4), so keep it within.
                    prompt_len: prompt.min(len),
                    images,
                    speculative,
                    priority: if fidelity {
                        Priority::Fidelity
                    } else {
                        Priority::Speed
                    },
                    engine: if vllm {
                        TargetEngine::Vllm
                    } else {
                        TargetEngine::Edgefit
                    },
                    offload_bytes: offload.map(|g| g * GIB),
                    gpu_memory_cap: cap.map(|g| g * GIB),
                    prefill_activations: int8.map(|i| {
                        if i {
                            PrefillActivations::Int8
                        } else {
                            PrefillActivations::Int16
                        }
                    }),
                }
            },
        )
}

/// Plan, or the refusals a random valid workload may meet: a pinned offload the device or the model cannot take
/// (no pool linked to the decode pool, or more bytes than the decoder layers hold), or pinned prompt activations
/// the plan's path has no choice of. Anything else fails the property. A plan's prompt side honours the pin and
/// stays above every decode batch.
fn plan_or_refused(
    profile: &DeviceProfile,
    model: usize,
    w: &Workload,
) -> Result<Option<Plan>, TestCaseError> {
    match try_plan_for(profile, model, w) {
        Ok(plan) => {
            if let Some(p) = &plan.weight_path.prefill {
                prop_assert!(p.min_rows > w.max_num_seqs, "{p:?}");
                if let Some(pin) = w.prefill_activations {
                    prop_assert_eq!(p.activations, pin);
                }
            }
            Ok(Some(plan))
        }
        Err(PlanError::Workload(msg))
            if w.offload_bytes.is_some() && msg.contains("--offload-gib") =>
        {
            Ok(None)
        }
        Err(PlanError::Workload(msg))
            if w.prefill_activations.is_some() && msg.contains("prefill_activations") =>
        {
            Ok(None)
        }
        Err(e) => Err(TestCaseError::fail(format!("{e}"))),
    }
}

fn plan_for(profile: &DeviceProfile, model: usize, w: &Workload) -> Plan {
    try_plan_for(profile, model, w).unwrap_or_else(|e| panic!("{:?}", miette::Report::new(e)))
}

/// Write the profile out as TOML and plan through the public parser, as a user's file would go.
fn try_plan_for(profile: &DeviceProfile, model: usize, w: &Workload) -> Result<Plan, PlanError> {
    let text = toml::to_string(profile).unwrap();
    let file = SourceFile {
        path: "profiles/random.toml".into(),
        text,
    };
    let parsed = planner::parse_profile(&file)
        .unwrap_or_else(|e| panic!("{}\n{}", common::render(&e), file.text));
    let (card, spec) = &models()[model];
    planner::plan::plan_parsed(spec, card, &parsed, &file.text, w)
}

/// The plan's placement rule (`Plan::pool_for`) accounts for every tensor: per pool, the tensors it resolves to
/// have the count and the planned bytes the plan states.
fn check_pool_for(plan: &Plan, spec: &ModelSpec) -> Result<(), TestCaseError> {
    for pool in &plan.placement.pools {
        let mine: Vec<_> = spec
            .inventory
            .iter()
            .filter(|t| plan.pool_for(t) == pool.pool)
            .collect();
        prop_assert_eq!(mine.len() as u64, pool.tensors, "pool {}", pool.pool);
        let bytes: u64 = mine.iter().map(|t| plan.planned_bytes(t)).sum();
        prop_assert_eq!(bytes, pool.bytes, "pool {}", pool.pool);
    }
    Ok(())
}

/// `0-2,5` -> `[0, 1, 2, 5]`.
fn expand(ranges: &str) -> Vec<u32> {
    ranges
        .split(',')
        .filter(|r| !r.is_empty())
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap(),
            None => {
                let x = r.parse::<u32>().unwrap();
                x..=x
            }
        })
        .collect()
}

fn check_invariants(plan: &Plan) -> Result<(), TestCaseError> {
    // Schema.
    let text = plan.to_toml().unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    let json = serde_json::to_value(v).unwrap();
    let errs: Vec<String> = match plan_schema().validate(&json) {
        Ok(()) => Vec::new(),
        Err(e) => e.map(|x| format!("{x} at {}", x.instance_path)).collect(),
    };
    prop_assert!(errs.is_empty(), "{:?}", errs);
    // Every tensor exactly once.
    let placed: u64 = plan.placement.pools.iter().map(|p| p.tensors).sum();
    let grouped: u64 = plan
        .placement
        .pools
        .iter()
        .flat_map(|p| &p.groups)
        .map(|g| g.tensors)
        .sum();
    let bytes: u64 = plan.placement.pools.iter().map(|p| p.bytes).sum();
    prop_assert_eq!(placed, plan.inventory.tensors);
    prop_assert_eq!(grouped, plan.inventory.tensors);
    prop_assert_eq!(plan.placement.tensors_placed, plan.inventory.tensors);
    prop_assert_eq!(bytes, plan.inventory.planned_bytes);
    let ledger_tensors: u64 = plan.ledgers.iter().map(|l| l.weight_tensors).sum();
    prop_assert_eq!(ledger_tensors, plan.inventory.tensors);
    // Ledgers add up, and the verdict agrees with them.
    for l in &plan.ledgers {
        prop_assert!(l.adds_up(), "{:?}", l);
    }
    let short = plan.ledgers.iter().any(|l| l.shortfall_bytes > 0);
    prop_assert_eq!(
        plan.verdict == Verdict::DoesNotFit,
        short || plan.shortfall.is_some()
    );
    prop_assert_eq!(plan.verdict == Verdict::Fits, plan.shortfall.is_none());
    // A plan that fits has finite, positive rates; one that does not has none (issue 23 §4).
    prop_assert_eq!(plan.prediction.is_some(), plan.verdict == Verdict::Fits);
    if let Some(pr) = &plan.prediction {
        prop_assert!(pr.decode_tok_s.is_finite() && pr.decode_tok_s > 0.0);
        prop_assert!(pr.prefill_tok_s.is_finite() && pr.prefill_tok_s > 0.0);
    }
    // The placement's layer ranges are a partition of the whole layers; a split layer is listed as split in every
    // pool that holds part of it, never as whole in one.
    let mut whole = std::collections::BTreeSet::new();
    for pool in &plan.placement.pools {
        for l in expand(&pool.layers) {
            prop_assert!(whole.insert(l), "layer {} listed whole in two pools", l);
        }
    }
    for pool in &plan.placement.pools {
        for l in expand(&pool.split_layers) {
            prop_assert!(!whole.contains(&l), "layer {} both whole and split", l);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_plans_keep_their_invariants(p in profile_params(), model in 0usize..64, w in workload()) {
        let model = model % models().len();
        if let Some(plan) = plan_or_refused(&build_profile(&p), model, &w)? {
            check_invariants(&plan)?;
            check_pool_for(&plan, &models()[model].1)?;
        }
    }

    #[test]
    fn offloading_more_never_predicts_faster_decode(
        p in profile_params(), model in 0usize..64, w in workload(), a in 0u64..48, extra in 1u64..16,
    ) {
        let model = model % models().len();
        let mut p = p;
        p.gpu = true;
        let profile = build_profile(&p);
        let less = plan_or_refused(&profile, model, &Workload { offload_bytes: Some(a * GIB / 2), ..w.clone() })?;
        let more = plan_or_refused(&profile, model, &Workload { offload_bytes: Some((a + extra) * GIB / 2), ..w })?;
        // Only plans that fit have a speed to compare.
        if let (Some(less), Some(more)) = (
            less.and_then(|p| p.prediction),
            more.and_then(|p| p.prediction),
        ) {
            prop_assert!(
                more.decode_tok_s <= less.decode_tok_s * (1.0 + 1e-9),
                "{} GiB: {} tok/s, {} GiB: {} tok/s",
                a as f64 / 2.0, less.decode_tok_s, (a + extra) as f64 / 2.0, more.decode_tok_s
            );
        }
    }

    #[test]
    fn random_dense_configs_keep_the_invariants(
        p in profile_params(),
        w in workload(),
        kv in 1u64..9,
        group in 1u64..9,
        head_dim in prop::sample::select(vec![64u64, 128, 256]),
        layers in 1u64..64,
        ffn_mult in 1u64..6,
        vocab in 1000u64..300_000,
        tie in any::<bool>(),
    ) {
        let heads = kv * group;
        let mut cfg: serde_json::Value = serde_json::from_str(&common::card("qwen3-8b").config.text).unwrap();
        cfg["num_key_value_heads"] = kv.into();
        cfg["num_attention_heads"] = heads.into();
        cfg["head_dim"] = head_dim.into();
        cfg["hidden_size"] = (heads * head_dim).into();
        cfg["intermediate_size"] = (heads * head_dim * ffn_mult).into();
        cfg["num_hidden_layers"] = layers.into();
        cfg["max_window_layers"] = layers.into();
        cfg["vocab_size"] = vocab.into();
        cfg["tie_word_embeddings"] = tie.into();
        let card = ModelCard {
            id: "random-dense".into(),
            config: SourceFile { path: "models/random/config.json".into(), text: cfg.to_string() },
            quant_config: None,
        };
        let spec = planner::model::parse_model(&card).unwrap_or_else(|e| panic!("{}", common::render(&e)));
        let profile = build_profile(&p);
        let text = toml::to_string(&profile).unwrap();
        let plan = planner::plan::plan_parsed(&spec, &card, &profile, &text, &w);
        let plan = match plan {
            Ok(plan) => plan,
            Err(PlanError::Workload(msg)) if w.offload_bytes.is_some() && msg.contains("--offload-gib") => return Ok(()),
            Err(PlanError::Workload(msg))
                if w.prefill_activations.is_some() && msg.contains("prefill_activations") => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
        };
        check_invariants(&plan)?;
        check_pool_for(&plan, &spec)?;
        prop_assert_eq!(plan.inventory.total_params, spec.inventory.iter().map(|t| t.params).sum::<u64>());
    }

    #[test]
    fn the_profile_parser_never_panics(text in "\\PC{0,400}") {
        let _ = planner::parse_profile(&SourceFile { path: "p.toml".into(), text });
    }

    #[test]
    fn the_profile_parser_never_panics_on_mutated_profiles(cut in 0usize..4000, junk in "[ =\\[\\]{}\"a-z0-9.\\n-]{0,12}") {
        let mut text = common::profile("ryzen-5090").text;
        let at = (0..=cut.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.insert_str(at, &junk);
        let _ = planner::parse_profile(&SourceFile { path: "p.toml".into(), text });
    }
}

/// A pool that holds work but declares no runtime-overhead budget fails closed, whatever the arithmetic says.
#[test]
fn a_pool_without_a_budget_fails_closed() {
    let params = ProfileParams {
        gpu: true,
        vram_gib: 200,
        taken_frac: 0.0,
        vram_read: 1e12,
        overhead_gib: 1,
        dram_gib: 64,
        dram_read: 1e11,
        link_frac: 0.1,
        sm: 90,
        amx: false,
        kernel: None,
    };
    let mut profile = build_profile(&params);
    let fits = plan_for(&profile, 0, &Workload::default());
    assert_eq!(fits.verdict, Verdict::Fits);
    profile.pools[0].runtime_overhead_bytes = None;
    let refused = plan_for(&profile, 0, &Workload::default());
    assert_eq!(refused.verdict, Verdict::DoesNotFit);
    let sf = refused.shortfall.unwrap();
    assert_eq!(
        (sf.pool.as_str(), sf.component.as_str()),
        ("vram", "budget")
    );
    assert!(sf.reason.contains("fails closed"));
}
