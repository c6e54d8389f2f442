//! A device profile as arbitrary text: parsing never panics, and a profile that parses plans a real model card
//! without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;
use planner::model::{ModelCard, SourceFile};

const CONFIG: &str = include_str!("../../models/spark-x2.5-1.7b/config.json");

fuzz_target!(|data: &[u8]| {
    let profile = SourceFile {
        path: "profiles/fuzz.toml".into(),
        text: String::from_utf8_lossy(data).into_owned(),
    };
    let Ok(_) = planner::parse_profile(&profile) else {
        return;
    };
    let card = ModelCard {
        id: "spark-x2.5-1.7b".into(),
        config: SourceFile {
            path: "models/spark-x2.5-1.7b/config.json".into(),
            text: CONFIG.into(),
        },
        quant_config: None,
    };
    if let Ok(plan) = planner::plan::plan(&card, &profile, &planner::Workload::default()) {
        let _ = plan.to_toml();
    }
});
