//! insta snapshots of each model card's inventory, summarised by role, dtype and access class, plus its layer mix,
//! RoPE and quantization. A change to an architecture file or a card that moves any byte shows up here as a
//! reviewable diff (`cargo insta review`; CI runs `INSTA_UPDATE=no`). The plan snapshots show the consequences;
//! these show the cause.

mod common;

use planner::model::{parse_model, Access, ModelSpec};
use std::collections::BTreeMap;
use std::fmt::Write;

fn spec(id: &str) -> ModelSpec {
    parse_model(&common::card(id)).unwrap()
}

fn access_name(a: &Access) -> String {
    match a {
        Access::EveryToken => "every_token".into(),
        Access::Gather { row_bytes } => format!("gather(row {row_bytes} B)"),
        Access::ConditionalImage => "conditional_image".into(),
        Access::ConditionalSpeculative => "conditional_speculative".into(),
        Access::Routed { active, total } => format!("routed({active}/{total})"),
    }
}

/// A plain-text summary: integers only, sorted keys, so the snapshot is stable and readable.
fn summary(s: &ModelSpec) -> String {
    let mut by: [BTreeMap<String, (u64, u64, u64)>; 3] = Default::default();
    for t in &s.inventory {
        let keys = [
            format!("{:?}", t.role),
            format!("{:?}", t.dtype),
            access_name(&t.access),
        ];
        for (map, key) in by.iter_mut().zip(keys) {
            let e = map.entry(key).or_default();
            e.0 += 1;
            e.1 += t.bytes;
            e.2 += t.params;
        }
    }
    let mut out = String::new();
    let w = &mut out;
    writeln!(w, "architecture: {} ({})", s.architecture, s.model_type).unwrap();
    writeln!(w, "quantization: {:?}", s.quantization).unwrap();
    writeln!(
        w,
        "tensors: {}  bytes: {}  params: {}",
        s.inventory.len(),
        s.total_bytes(),
        s.total_params()
    )
    .unwrap();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for k in &s.layers {
        *kinds.entry(format!("{k:?}")).or_default() += 1;
    }
    writeln!(w, "layers: {kinds:?}").unwrap();
    writeln!(
        w,
        "attention: hidden {} heads {}/{} head_dim {} window {:?} max_pos {}",
        s.hidden_size,
        s.num_q_heads,
        s.num_kv_heads,
        s.head_dim,
        s.sliding_window,
        s.max_position_embeddings
    )
    .unwrap();
    for r in &s.rope {
        writeln!(
            w,
            "rope: {:?} theta {} rotary_dims {}",
            r.layer_kind, r.theta, r.rotary_dims
        )
        .unwrap();
    }
    writeln!(w, "gdn: {:?}", s.gdn).unwrap();
    writeln!(w, "moe: {:?}", s.moe).unwrap();
    writeln!(
        w,
        "vision: {}  mtp_layers: {}  tied: {}",
        s.has_vision, s.mtp_layers, s.tie_word_embeddings
    )
    .unwrap();
    for (title, map) in ["by role", "by dtype", "by access"].iter().zip(&by) {
        writeln!(w, "{title}:").unwrap();
        for (k, (n, bytes, params)) in map {
            writeln!(
                w,
                "  {k:<32} tensors {n:>6}  bytes {bytes:>14}  params {params:>14}"
            )
            .unwrap();
        }
    }
    out
}

#[test]
fn every_card_inventory_summary() {
    let ids = common::models();
    // A folder of their own, apart from the plan snapshots, so either set can be regenerated without the other.
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("snapshots/model");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for id in ids {
            insta::assert_snapshot!(id.clone(), summary(&spec(&id)));
        }
    });
}
