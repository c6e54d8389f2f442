//! Malformed checkpoints get a clear error naming the file and the tensor, every problem at once, and never a
//! panic or a read outside the files. Each test corrupts a copy of a fixture in a fresh temporary directory.

use std::path::{Path, PathBuf};

use engine::checkpoint::Checkpoint;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-bf16")
}

/// A fresh copy of the llama fixture.
fn copy(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edgefit-ck-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    dir
}

fn err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened although it is corrupt", dir.display()),
        // The plain message plus miette's help (where the known architectures are listed), without the fancy
        // renderer's line wrapping.
        Err(e) => {
            let help = miette::Diagnostic::help(&e)
                .map(|h| h.to_string())
                .unwrap_or_default();
            format!("{e}\n{help}")
        }
    }
}

/// Rewrites `model.safetensors` after `edit` changed its (name, dtype, shape, bytes) list.
fn rewrite(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut list: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut list);
    let views: Vec<(String, TensorView<'_>)> = list
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
}

#[test]
fn the_fixture_itself_opens() {
    let ck = Checkpoint::open(&fixture()).unwrap();
    assert_eq!(ck.spec.model_type, "llama");
}

#[test]
fn a_truncated_file_names_the_file() {
    let dir = copy("trunc");
    let p = dir.join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 100).unwrap();
    let e = err(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors file"),
        "{e}"
    );
}

#[test]
fn an_oversized_or_malformed_header_is_refused() {
    let dir = copy("header");
    let p = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert!(err(&dir).contains("not a valid safetensors file"));
    bytes[..8].copy_from_slice(&16u64.to_le_bytes());
    bytes[8..24].copy_from_slice(b"{not json at all");
    std::fs::write(&p, &bytes).unwrap();
    assert!(err(&dir).contains("not a valid safetensors file"));
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert!(err(&dir).contains("not a valid safetensors file"));
}

#[test]
fn missing_unexpected_and_mismatched_tensors_are_reported_together() {
    let dir = copy("inventory");
    rewrite(&dir, |list| {
        list.retain(|t| t.0 != "model.layers.0.mlp.up_proj.weight");
        for t in list.iter_mut() {
            if t.0 == "model.layers.1.self_attn.k_proj.weight" {
                // Same bytes, wrong shape.
                t.2 = vec![t.2[1], t.2[0]];
            }
            if t.0 == "model.norm.weight" {
                // f16 for a norm is widened at load; I32 is not a float at all.
                t.1 = Dtype::I16;
            }
        }
        list.push((
            "model.layers.9.extra.weight".into(),
            Dtype::F32,
            vec![2],
            vec![0; 8],
        ));
    });
    let e = err(&dir);
    for want in [
        "model.layers.0.mlp.up_proj.weight: missing",
        "model.layers.1.self_attn.k_proj.weight: shape",
        "model.norm.weight: dtype I16",
        "model.layers.9.extra.weight: unexpected",
        "4 problems",
    ] {
        assert!(e.contains(want), "`{want}` not in:\n{e}");
    }
}

#[test]
fn a_linear_in_the_wrong_dtype_is_refused_but_a_widened_norm_is_read() {
    let dir = copy("dtype");
    rewrite(&dir, |list| {
        for t in list.iter_mut() {
            if t.0 == "model.layers.0.input_layernorm.weight" {
                t.1 = Dtype::F16; // same byte width as bf16: read and widened
            }
            if t.0 == "model.layers.0.mlp.down_proj.weight" {
                t.1 = Dtype::F16;
            }
        }
    });
    let e = err(&dir);
    assert!(
        e.contains(
            "model.layers.0.mlp.down_proj.weight: dtype F16 in model.safetensors, expected Bf16"
        ),
        "{e}"
    );
    assert!(!e.contains("input_layernorm"), "{e}");
}

fn write_index(dir: &Path, entries: &[(&str, &str)]) {
    let map: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(t, f)| (t.to_string(), serde_json::json!(f)))
        .collect();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
}

#[test]
fn an_index_entry_outside_the_directory_is_refused() {
    for (tag, target) in [("dotdot", "../model.safetensors"), ("abs", "/etc/passwd")] {
        let dir = copy(tag);
        write_index(&dir, &[("model.norm.weight", target)]);
        let e = err(&dir);
        assert!(
            e.contains("not a file inside the checkpoint directory"),
            "{tag}: {e}"
        );
    }
    #[cfg(unix)]
    {
        let dir = copy("symlink");
        let outside = std::env::temp_dir().join(format!(
            "edgefit-outside-{}.safetensors",
            std::process::id()
        ));
        std::fs::copy(dir.join("model.safetensors"), &outside).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link.safetensors")).unwrap();
        write_index(&dir, &[("model.norm.weight", "link.safetensors")]);
        let e = err(&dir);
        assert!(e.contains("outside the checkpoint directory"), "{e}");
    }
}

#[test]
fn an_index_that_disagrees_with_its_shards_is_refused() {
    let dir = copy("shards");
    // Split the single file into two shards, then let the index misplace one tensor and name a ghost.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    let (a, b): (Vec<_>, Vec<_>) = names.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    for (file, part) in [("a.safetensors", &a), ("b.safetensors", &b)] {
        let views: Vec<(String, TensorView<'_>)> = part
            .iter()
            .map(|(_, n)| ((*n).clone(), st.tensor(n).unwrap()))
            .collect();
        std::fs::write(dir.join(file), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let mut entries: Vec<(&str, &str)> = a
        .iter()
        .map(|(_, n)| (n.as_str(), "a.safetensors"))
        .collect();
    entries.extend(b.iter().map(|(_, n)| (n.as_str(), "b.safetensors")));
    write_index(&dir, &entries);
    Checkpoint::open(&dir).expect("a correct two-shard split opens");
    let moved = a[0].1.as_str();
    entries[0] = (moved, "b.safetensors");
    entries.push(("model.ghost.weight", "a.safetensors"));
    write_index(&dir, &entries);
    let e = err(&dir);
    assert!(e.contains(&format!("{moved}: the index puts it in")), "{e}");
    assert!(e.contains("model.ghost.weight: the index names"), "{e}");
}

#[test]
fn an_unknown_architecture_lists_the_known_ones() {
    let dir = copy("arch");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let cfg = cfg
        .replace("LlamaForCausalLM", "MambaForCausalLM")
        .replace("\"llama\"", "\"mamba\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = err(&dir);
    assert!(
        e.contains("Qwen3_5ForConditionalGeneration") && e.contains("Gemma3ForCausalLM"),
        "{e}"
    );
}

#[test]
fn a_missing_directory_names_the_path() {
    let e = err(Path::new("/nonexistent/edgefit-model"));
    assert!(e.contains("/nonexistent/edgefit-model/config.json"), "{e}");
}

#[test]
fn the_planner_claims_runs_in_engine_only_for_paths_the_engine_runs() {
    assert_eq!(
        planner::weight_path::ENGINE_CPU_PATHS,
        engine::model::CPU_WEIGHT_PATHS
    );
    assert_eq!(
        planner::weight_path::ENGINE_CUDA_PATHS,
        engine::model::CUDA_WEIGHT_PATHS
    );
    for f in engine::model::CPU_WEIGHT_PATHS {
        engine::WeightMode::from_plan(*f).expect("every listed path maps to a weight mode");
    }
}
