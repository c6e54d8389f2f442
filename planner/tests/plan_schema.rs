//! The committed JSON Schemas: they match the types (drift fails with "run `cargo xtask codegen`"), every committed
//! profile validates against the profile schema, and plans (as TOML text, parsed back) validate against the plan
//! schema and round-trip through the plan types.

mod common;

use planner::{Plan, Workload};

fn committed(rel: &str) -> serde_json::Value {
    let text =
        std::fs::read_to_string(common::root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn validator(rel: &str) -> jsonschema::JSONSchema {
    jsonschema::JSONSchema::compile(&committed(rel))
        .unwrap_or_else(|e| panic!("{rel} does not compile: {e}"))
}

fn errors(schema: &jsonschema::JSONSchema, instance: &serde_json::Value) -> Vec<String> {
    match schema.validate(instance) {
        Ok(()) => Vec::new(),
        Err(errs) => errs
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect(),
    }
}

fn toml_to_json(text: &str) -> serde_json::Value {
    let v: toml::Value = toml::from_str(text).unwrap();
    serde_json::to_value(v).unwrap()
}

#[test]
fn committed_schemas_match_the_types() {
    for (rel, text) in planner::plan::schema_files() {
        let on_disk = std::fs::read_to_string(common::root().join(rel)).unwrap_or_default();
        assert!(
            on_disk == text,
            "{rel} is out of date: run `cargo xtask codegen`"
        );
    }
}

#[test]
fn committed_profiles_validate_against_the_schema() {
    let schema = validator("schemas/profile.schema.json");
    for name in common::profiles() {
        let file = common::profile(&name);
        let errs = errors(&schema, &toml_to_json(&file.text));
        assert!(errs.is_empty(), "profiles/{name}.toml: {errs:?}");
        let parsed =
            planner::parse_profile(&file).unwrap_or_else(|e| panic!("{}", common::render(&e)));
        assert_eq!(parsed.name, name, "a profile's name is its file stem");
    }
}

#[test]
fn the_schema_rejects_what_the_parser_rejects() {
    let schema = validator("schemas/profile.schema.json");
    let mut v = toml_to_json(&common::profile("ryzen-5090").text);
    v["pool"][0]["turbo"] = serde_json::json!(1);
    assert!(
        !errors(&schema, &v).is_empty(),
        "unknown keys are schema errors too"
    );
}

#[test]
fn plans_validate_and_round_trip() {
    let schema = validator("schemas/plan.schema.json");
    let workloads = [
        Workload::default(),
        Workload {
            images: true,
            speculative: true,
            max_num_seqs: 4,
            ..Workload::default()
        }
        .with_offload_gib(0.5)
        .unwrap(),
    ];
    for device in common::profiles() {
        for model in common::models() {
            let spec = planner::model::parse_model(&common::card(&model)).unwrap();
            for w in &workloads {
                let plan = match planner::plan::plan(
                    &common::card(&model),
                    &common::profile(&device),
                    w,
                ) {
                    Ok(plan) => plan,
                    // A pinned offload on a device with one pool is refused (issue 23 §4), not ignored.
                    Err(e)
                        if w.offload_bytes.is_some()
                            && e.to_string().contains("nowhere to offload") =>
                    {
                        assert!(
                            ["avx512-2core", "galaxy-s25", "xeon-8480c"].contains(&device.as_str())
                        );
                        continue;
                    }
                    Err(e) => panic!("{model} on {device}: {e}"),
                };
                let text = plan.to_toml().unwrap();
                let errs = errors(&schema, &toml_to_json(&text));
                assert!(errs.is_empty(), "{model} on {device}: {errs:?}");
                for pool in &plan.placement.pools {
                    let n = spec
                        .inventory
                        .iter()
                        .filter(|t| plan.pool_for(t) == pool.pool)
                        .count();
                    assert_eq!(
                        n as u64, pool.tensors,
                        "{model} on {device}: pool_for disagrees on {}",
                        pool.pool
                    );
                }
                let back = Plan::from_toml("plan.toml", &text)
                    .unwrap_or_else(|e| panic!("{}", common::render(&e)));
                assert_eq!(back, plan, "{model} on {device} does not round-trip");
            }
        }
    }
}

#[test]
fn plan_carries_version_and_input_hashes() {
    let p = common::plan("qwen3.8-27b-nvfp4", "ryzen-5090", &Workload::default());
    assert_eq!(p.planner_version, planner::PLANNER_VERSION);
    let card = common::card("qwen3.8-27b-nvfp4");
    assert_eq!(
        p.inputs.config_sha256,
        planner::plan::sha256_hex(&card.config.text)
    );
    assert_eq!(
        p.inputs.quant_config_sha256,
        Some(planner::plan::sha256_hex(&card.quant_config.unwrap().text))
    );
    assert_eq!(
        p.inputs.profile_sha256,
        planner::plan::sha256_hex(&common::profile("ryzen-5090").text)
    );
}

#[test]
fn scripts_find_the_stable_fields() {
    let p = common::plan("spark-x2.5-4b", "ryzen-5090", &Workload::default());
    let v: toml::Value = toml::from_str(&p.to_toml().unwrap()).unwrap();
    assert_eq!(v["verdict"].as_str(), Some("fits"));
    for key in ["decode_tok_s", "prefill_tok_s", "bound"] {
        assert!(v["prediction"].get(key).is_some(), "[prediction].{key}");
    }
    for key in [
        "bytes_per_token_flat",
        "bytes_per_token_hybrid",
        "state_bytes_per_seq",
        "total_bytes",
    ] {
        assert!(v["cache"].get(key).is_some(), "[cache].{key}");
    }
    for key in ["total_bytes", "total_params"] {
        assert!(v["inventory"].get(key).is_some(), "[inventory].{key}");
    }
}

#[test]
fn a_plan_with_an_unknown_key_is_rejected_with_its_line() {
    let p = common::plan("gemma-3-1b", "avx512-2core", &Workload::default());
    let text =
        p.to_toml()
            .unwrap()
            .replacen("verdict = \"fits\"", "verdict = \"fits\"\nturbo = true", 1);
    let e = Plan::from_toml("plans/x.toml", &text).unwrap_err();
    let line = text.lines().position(|l| l == "turbo = true").unwrap() + 1;
    assert_eq!(e.line(), Some(line));
    assert!(common::render(&e).contains("plans/x.toml"));
}
