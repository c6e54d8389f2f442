//! insta snapshots of the plan of every model x profile pair, at the default workload. A planner or profile change
//! that moves a plan shows up as a snapshot diff for review (`cargo insta review`; CI runs `INSTA_UPDATE=no`).
//! Floats are rounded to 4 significant digits so a last-bit change in arithmetic does not churn the snapshots.

mod common;

use planner::Workload;

fn round_floats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(0.0);
            let r: f64 = format!("{x:.3e}").parse().unwrap_or(x);
            if let Some(num) = serde_json::Number::from_f64(r) {
                *n = num;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(round_floats),
        serde_json::Value::Object(o) => {
            // TOML has no null: absent options are left out, as the plan's own TOML leaves them out.
            o.retain(|_, x| !x.is_null());
            o.values_mut().for_each(round_floats);
        }
        _ => {}
    }
}

/// `insta::glob!` over the committed profiles (a failing profile does not hide the others), every model inside.
#[test]
fn every_model_on_every_profile() {
    let models = common::models();
    assert!(models.len() >= 7, "{models:?}");
    assert!(common::profiles().len() >= 5);
    insta::glob!("../../profiles", "*.toml", |path| {
        let device = path.file_stem().and_then(|s| s.to_str()).unwrap();
        for model in &models {
            let plan = common::plan(model, device, &Workload::default());
            let mut v = serde_json::to_value(&plan).unwrap();
            round_floats(&mut v);
            let text = toml::to_string_pretty(&v).unwrap();
            insta::assert_snapshot!(model.as_str(), text);
        }
    });
}
