//! A model's `config.json` (and, after a NUL byte, an `hf_quant_config.json`) as arbitrary bytes: parsing never
//! panics, and a config that parses plans on the 2-core profile without panicking, to a plan that renders as TOML or
//! an error naming the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use planner::model::{ModelCard, SourceFile};

const PROFILE: &str = include_str!("../../profiles/avx512-2core.toml");

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (config, quant) = match text.split_once('\0') {
        Some((c, q)) => (c.to_owned(), Some(q.to_owned())),
        None => (text.into_owned(), None),
    };
    let card = ModelCard {
        id: "fuzz".into(),
        config: SourceFile {
            path: "models/fuzz/config.json".into(),
            text: config,
        },
        quant_config: quant.map(|text| SourceFile {
            path: "models/fuzz/hf_quant_config.json".into(),
            text,
        }),
    };
    let profile = SourceFile {
        path: "profiles/avx512-2core.toml".into(),
        text: PROFILE.into(),
    };
    if let Ok(plan) = planner::plan::plan(&card, &profile, &planner::Workload::default()) {
        let _ = plan.to_toml();
    }
});
