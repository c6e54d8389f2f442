//! Shared helpers of the planner's integration tests: the committed model cards and profiles, read from the
//! repository (tests may do IO; the planner may not).

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use planner::model::{ModelCard, SourceFile};
use planner::{Plan, Workload};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> SourceFile {
    let text =
        std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"));
    SourceFile {
        path: rel.to_owned(),
        text,
    }
}

fn names(dir: &str, keep: impl Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .filter_map(|e| keep(&e.unwrap().path()))
        .collect();
    v.sort();
    v
}

pub fn profiles() -> Vec<String> {
    names("profiles", |p| {
        (p.extension()? == "toml").then(|| p.file_stem()?.to_str().map(str::to_owned))?
    })
}

pub fn models() -> Vec<String> {
    names("models", |p| {
        p.join("config.json")
            .is_file()
            .then(|| p.file_name()?.to_str().map(str::to_owned))?
    })
}

pub fn profile(name: &str) -> SourceFile {
    read(&format!("profiles/{name}.toml"))
}

pub fn card(id: &str) -> ModelCard {
    let quant = format!("models/{id}/hf_quant_config.json");
    ModelCard {
        id: id.to_owned(),
        config: read(&format!("models/{id}/config.json")),
        quant_config: root().join(&quant).is_file().then(|| read(&quant)),
    }
}

pub fn plan(model: &str, device: &str, w: &Workload) -> Plan {
    planner::plan::plan(&card(model), &profile(device), w)
        .unwrap_or_else(|e| panic!("planning {model} on {device}: {:?}", miette::Report::new(e)))
}

/// Render a diagnostic without colours, as a user would read it in a log.
pub fn render(d: &dyn miette::Diagnostic) -> String {
    let mut out = String::new();
    miette::NarratableReportHandler::new()
        .render_report(&mut out, d)
        .unwrap();
    out
}
