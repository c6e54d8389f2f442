//! From the command line to a running [`crate::Engine`]: which profile describes this machine (a committed one by
//! name, a TOML path, or a probe of this machine with its rates marked provisional), which plan to apply (`--plan`,
//! or one the planner makes for this checkpoint on that profile), and the admission check against the memory the
//! OS reports free before anything big is allocated.

use std::path::Path;

use planner::model::SourceFile;
use planner::{Plan, Verdict, Workload};

use crate::checkpoint::Checkpoint;
use crate::EngineError;

/// The committed profiles, embedded so `--profile NAME` works from any directory.
const PROFILES: &[(&str, &str)] = &[
    (
        "avx512-2core",
        include_str!("../../profiles/avx512-2core.toml"),
    ),
    ("ryzen-5090", include_str!("../../profiles/ryzen-5090.toml")),
    ("xeon-8480c", include_str!("../../profiles/xeon-8480c.toml")),
    ("h200", include_str!("../../profiles/h200.toml")),
    ("galaxy-s25", include_str!("../../profiles/galaxy-s25.toml")),
];

fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Bytes the OS reports available right now (`MemAvailable`), if it says.
pub fn available_bytes() -> Option<u64> {
    meminfo("MemAvailable:")
}

/// A profile of this machine from a probe: ISA, cores and memory are read; rates are provisional placeholders that
/// only `calibrate` may replace (the planner's speed figures from it are an order of magnitude, not a measurement).
pub fn probe_profile() -> SourceFile {
    let total = meminfo("MemTotal:").unwrap_or(8 << 30);
    let avail = available_bytes().unwrap_or(total / 2);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    #[cfg(target_arch = "x86_64")]
    let isa = format!(
        "arch = \"x86_64\", avx512 = {}, vnni = {}, bf16 = {}, amx = false",
        std::arch::is_x86_feature_detected!("avx512f"),
        std::arch::is_x86_feature_detected!("avx512vnni"),
        std::arch::is_x86_feature_detected!("avx512bf16"),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let isa = "arch = \"aarch64\"".to_string();
    let text = format!(
        r#"# Probed by `edgefit` at start-up: sizes read from this machine, rates provisional (not measured).
name = "probed"
description = "this machine, probed: {cores} cores"

[[pool]]
id = "dram"
description = "system memory"
capacity_bytes = {{ value = {total}, source = "probe: /proc/meminfo MemTotal" }}
taken_bytes = {{ value = {taken}, source = "probe: MemTotal - MemAvailable at start-up" }}
read_bytes_per_s = {{ value = 10e9, source = "provisional: not measured" }}
runtime_overhead_bytes = {{ value = 536870912, source = "provisional: 512 MiB for activations and the runtime" }}
reserve_bytes = {{ value = 268435456, source = "provisional: 256 MiB" }}

[[compute]]
id = "cpu"
kind = "cpu"
description = "{cores} cores"
pool = "dram"
runs_engine = true
isa = {{ {isa}, source = "probe: cpuid; AMX is not used until calibrate proves the tiles usable" }}
peak = {{ bf16_flops_per_s = {{ value = {peak}e9, source = "provisional: {cores} cores x 50 GFLOP/s, not measured" }} }}
"#,
        taken = total.saturating_sub(avail),
        peak = cores * 50,
    );
    SourceFile {
        path: "(probed profile)".into(),
        text,
    }
}

/// `--profile NAME|PATH`, or the probe when absent.
pub fn profile(arg: Option<&str>) -> Result<SourceFile, EngineError> {
    let Some(arg) = arg else {
        return Ok(probe_profile());
    };
    if let Some((name, text)) = PROFILES.iter().find(|(n, _)| *n == arg) {
        return Ok(SourceFile {
            path: format!("profiles/{name}.toml"),
            text: text.to_string(),
        });
    }
    let path = Path::new(arg);
    if path.exists() {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::io(path, e))?;
        return Ok(SourceFile {
            path: arg.to_string(),
            text,
        });
    }
    let names: Vec<&str> = PROFILES.iter().map(|(n, _)| *n).collect();
    Err(EngineError::Plan(format!(
        "--profile {arg}: no such file, and not one of the committed profiles ({})",
        names.join(", ")
    )))
}

/// The plan to run: `--plan PATH` when given, else the planner's plan for this checkpoint on `profile`.
pub fn plan(
    ck: &Checkpoint,
    plan_path: Option<&Path>,
    profile: &SourceFile,
    workload: &Workload,
) -> Result<Plan, EngineError> {
    if let Some(p) = plan_path {
        let text = std::fs::read_to_string(p).map_err(|e| EngineError::io(p, e))?;
        return Plan::from_toml(&p.display().to_string(), &text)
            .map_err(|e| EngineError::Plan(format!("{:?}", miette::Report::new(e))));
    }
    planner::plan::plan(&ck.card, profile, workload)
        .map_err(|e| EngineError::Plan(format!("{:?}", miette::Report::new(e))))
}

/// Refuses a plan that does not fit, by its own ledgers or by the memory the OS has free now.
pub fn admit(plan: &Plan) -> Result<(), EngineError> {
    let ledgers = || {
        plan.ledgers
            .iter()
            .map(|l| {
                format!(
                    "  {}: capacity {} taken {} overhead {} reserve {} cache {} weights {} prompt {} free {} \
                     shortfall {}",
                    l.pool,
                    l.capacity_bytes,
                    l.taken_bytes,
                    l.runtime_overhead_bytes,
                    l.reserve_bytes,
                    l.cache_bytes,
                    l.weight_bytes,
                    l.prompt_scratch_bytes,
                    l.free_bytes,
                    l.shortfall_bytes
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if plan.verdict != Verdict::Fits {
        return Err(EngineError::Plan(format!(
            "the plan does not fit; its ledgers:\n{}",
            ledgers()
        )));
    }
    let need = plan
        .inventory
        .planned_bytes
        .saturating_add(plan.cache.total_bytes)
        .saturating_add(plan.cache.rope_table_bytes)
        .saturating_add(plan.prompt_chunk.extra_scratch_bytes);
    if let Some(avail) = available_bytes() {
        if need > avail {
            return Err(EngineError::Plan(format!(
                "the plan needs {need} bytes of weights, caches and prompt activations but the OS reports {avail} \
                 available; its ledgers:\n{}",
                ledgers()
            )));
        }
    }
    Ok(())
}

/// A linear module of a decoder layer, as the CUDA engine holds it: the unit a plan's offload moves to host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearRole {
    Q,
    K,
    V,
    /// q, k and v stored as one module (`q_k_v_proj`).
    Qkv,
    O,
    /// The per-head output gate's projection (`g_proj`).
    G,
    GdnQkv,
    GdnZ,
    GdnB,
    GdnA,
    GdnOut,
    Gate,
    Up,
    Down,
}

impl LinearRole {
    /// The role of a module named `<prefix>.layers.<i>.<suffix>`, by its suffix (every family's names).
    fn of(suffix: &str) -> Option<LinearRole> {
        Some(match suffix {
            "self_attn.q_proj" => LinearRole::Q,
            "self_attn.k_proj" => LinearRole::K,
            "self_attn.v_proj" => LinearRole::V,
            "self_attn.q_k_v_proj" => LinearRole::Qkv,
            "self_attn.o_proj" | "self_attn.out_proj" => LinearRole::O,
            "self_attn.g_proj" => LinearRole::G,
            "linear_attn.in_proj_qkv" => LinearRole::GdnQkv,
            "linear_attn.in_proj_z" => LinearRole::GdnZ,
            "linear_attn.in_proj_b" => LinearRole::GdnB,
            "linear_attn.in_proj_a" => LinearRole::GdnA,
            "linear_attn.out_proj" => LinearRole::GdnOut,
            "mlp.gate_proj" => LinearRole::Gate,
            "mlp.up_proj" => LinearRole::Up,
            "mlp.down_proj" => LinearRole::Down,
            _ => return None,
        })
    }
}

/// The decoder-layer linears a plan places in host memory, which the CUDA engine streams to the device a layer
/// ahead of the step that reads them.
pub type Streamed = std::collections::HashSet<(usize, LinearRole)>;

/// What the CUDA engine must stream for `plan`: every decoder-layer weight outside the decode pool, by layer and
/// role. The embedding stays on the host anyway (only gathered rows cross), and tensors the engine never loads (the
/// MTP head, the vision tower) need nothing; a layer's small vectors (norms, conv kernels, biases) stay on the
/// device, a few kilobytes per layer. Anything else placed off the device is refused by name.
pub fn streamed_linears(plan: &Plan, ck: &Checkpoint) -> Result<Streamed, EngineError> {
    use planner::model::Role;
    let mut set = Streamed::new();
    let mut refused = Vec::new();
    for t in &ck.spec.inventory {
        if plan.pool_for(t) == plan.device.decode_pool {
            continue;
        }
        match (t.role, t.layer) {
            (Role::Embedding | Role::MtpHead | Role::VisionTower | Role::Small, _) => {}
            (Role::LayerWeight | Role::Scale, Some(l)) => {
                let marker = format!("layers.{l}.");
                let role = t.name.find(&marker).and_then(|at| {
                    let rest = &t.name[at + marker.len()..];
                    LinearRole::of(rest.rsplit_once('.').map_or(rest, |(m, _)| m))
                });
                match role {
                    Some(r) => {
                        set.insert((l as usize, r));
                    }
                    None => refused.push(t.name.clone()),
                }
            }
            _ => refused.push(t.name.clone()),
        }
    }
    if !refused.is_empty() {
        return Err(EngineError::Plan(format!(
            "the plan places these tensors outside the GPU, which the CUDA engine cannot stream (it streams \
             decoder-layer linear weights): {}",
            refused.join(", ")
        )));
    }
    Ok(set)
}

/// The CUDA admission: refuses a plan that does not fit by its own ledgers, or whose device pool needs more than
/// `free` bytes (what the driver reports free now, or less under `--cap-gpu-memory`); answers the bytes it needs.
/// The caches count at `engine_cache_bytes` (what the CUDA engine will allocate, [`crate::Model::cuda_cache_sizes`])
/// where that is more than the plan's: its K/V are f32 at every position, the plan budgets bf16. Weights the plan
/// offloads are streamed ([`streamed_linears`]); the two layers of streaming buffers come out of the pool's runtime
/// overhead.
pub fn admit_cuda(plan: &Plan, free: u64, engine_cache_bytes: u64) -> Result<u64, EngineError> {
    if plan.verdict != Verdict::Fits {
        return Err(EngineError::Plan(
            "the plan does not fit this device (see `cargo xtask plan` for its ledgers)".into(),
        ));
    }
    let Some(l) = plan.decode_ledger() else {
        return Err(EngineError::Plan(
            "the plan has no device pool: plan it for a GPU profile (`--profile h200`)".into(),
        ));
    };
    if l.pool == "host" {
        return Err(EngineError::Plan(
            "the plan decodes on the host: plan it for a GPU profile (`--profile h200`)".into(),
        ));
    }
    let caches = l
        .cache_bytes
        .saturating_add(l.rope_table_bytes)
        .max(engine_cache_bytes);
    let need = l
        .weight_bytes
        .saturating_add(caches)
        .saturating_add(l.runtime_overhead_bytes)
        .saturating_add(l.prompt_scratch_bytes);
    if need > free {
        return Err(EngineError::Plan(format!(
            "the plan places {need} bytes in {} (weights {}, caches {caches} (the plan budgets {}; the engine \
             keeps f32 K/V), runtime {}, prompt chunk {}) but the driver reports {free} free",
            l.pool,
            l.weight_bytes,
            l.cache_bytes.saturating_add(l.rope_table_bytes),
            l.runtime_overhead_bytes,
            l.prompt_scratch_bytes
        )));
    }
    Ok(need)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_plan(offload: Option<u64>) -> Plan {
        fixture_plan_of(offload, 256)
    }

    fn fixture_plan_of(offload: Option<u64>, max_model_len: u64) -> Plan {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5-fp8");
        let ck = Checkpoint::open(&dir).unwrap();
        let w = Workload {
            max_model_len,
            max_num_seqs: 1,
            prompt_len: 64,
            offload_bytes: offload,
            ..Workload::default()
        };
        plan(&ck, None, &profile(Some("h200")).unwrap(), &w).unwrap()
    }

    /// A plan whose prompt chunk is longer than the default charges its activations, and the CUDA admission
    /// counts them: the same plan with one byte less free is refused, naming the chunk.
    #[test]
    fn cuda_admission_counts_the_planned_prompt_chunk() {
        let short = fixture_plan_of(None, 256);
        assert_eq!(short.prompt_chunk.tokens, 512);
        let long = fixture_plan_of(None, 1024);
        assert_eq!(long.prompt_chunk.tokens, 1024);
        let scratch = long.prompt_chunk.extra_scratch_bytes;
        assert!(scratch > 0);
        let need = admit_cuda(&long, u64::MAX, 0).unwrap();
        let l = long.decode_ledger().unwrap();
        assert_eq!(l.prompt_scratch_bytes, scratch);
        assert_eq!(
            need,
            l.weight_bytes
                + l.cache_bytes
                + l.rope_table_bytes
                + l.runtime_overhead_bytes
                + scratch
        );
        admit_cuda(&long, need, 0).unwrap();
        let e = admit_cuda(&long, need - 1, 0).unwrap_err().to_string();
        assert!(e.contains(&format!("prompt chunk {scratch}")), "{e}");
    }

    /// The CUDA engine's caches, sized on the CPU: its f32 K/V are twice the plan's bf16 ones (the planner's cache
    /// model and the engine's dims agree), and the admission counts them where they are more than the plan's.
    #[test]
    fn cuda_admission_counts_the_engines_own_caches() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5-fp8");
        let ck = Checkpoint::open(&dir).unwrap();
        let model = crate::Model::load(&ck, crate::WeightMode::Exact, |_, _| {}).unwrap();
        let p = fixture_plan(None);
        let (slots, len) = (
            p.workload.max_num_seqs as usize,
            p.workload.max_model_len as usize,
        );
        let sizes = model.cuda_cache_sizes(slots, len).unwrap();
        let attn = model
            .spec
            .layers
            .iter()
            .filter(|&&k| k != planner::model::LayerKind::LinearAttention)
            .count() as u64;
        assert_eq!(
            8 * sizes.kv_len as u64 * attn,
            2 * p.cache.bytes_per_token_hybrid * (slots * len) as u64
        );
        assert!(sizes.bytes > p.cache.total_bytes, "{sizes:?}");
        let plain = admit_cuda(&p, u64::MAX, 0).unwrap();
        let need = admit_cuda(&p, u64::MAX, sizes.bytes).unwrap();
        let l = p.decode_ledger().unwrap();
        assert_eq!(
            need - plain,
            sizes.bytes - l.cache_bytes - l.rope_table_bytes
        );
        let e = admit_cuda(&p, need - 1, sizes.bytes)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the engine keeps f32 K/V"), "{e}");
        // A cache too large to count is an error, not a panic.
        let e = model
            .cuda_cache_sizes(usize::MAX, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overflows"), "{e}");
    }

    /// The CUDA admission: a plan that fits the device's free memory is admitted, one that does not is refused
    /// naming the bytes, and one that offloads weights is admitted with the offloaded linears named for streaming.
    #[test]
    fn cuda_admission_checks_free_memory_and_streams_offloaded_linears() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5-fp8");
        let ck = Checkpoint::open(&dir).unwrap();
        let p = fixture_plan(None);
        admit_cuda(&p, u64::MAX, 0).unwrap();
        assert!(streamed_linears(&p, &ck).unwrap().is_empty());
        let e = admit_cuda(&p, 1, 0).unwrap_err().to_string();
        assert!(e.contains("the driver reports 1 free"), "{e}");
        let off = fixture_plan(Some(1 << 16));
        assert!(
            off.placement.offloaded_bytes > 0,
            "the workload asked for an offload"
        );
        admit_cuda(&off, u64::MAX, 0).unwrap();
        let s = streamed_linears(&off, &ck).unwrap();
        // Decoder layers move in checkpoint order: layer 0 first, and each module of a streamed layer is named.
        assert!(s.iter().any(|&(l, _)| l == 0), "{s:?}");
        let host_weights = ck
            .spec
            .inventory
            .iter()
            .filter(|t| {
                t.role == planner::model::Role::LayerWeight
                    && off.pool_for(t) != off.device.decode_pool
            })
            .count();
        assert_eq!(s.len(), host_weights, "{s:?}");
    }

    #[test]
    fn every_linear_module_of_every_fixture_has_a_role() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for d in std::fs::read_dir(root).unwrap() {
            let dir = d.unwrap().path();
            if !dir.join("config.json").exists() {
                continue;
            }
            let ck = Checkpoint::open(&dir).unwrap();
            let p = &ck.spec.runtime.prefix;
            for l in &ck.spec.runtime.linears {
                let Some(rest) = l.module.strip_prefix(&format!("{p}.layers.")) else {
                    continue;
                };
                let suffix = rest.split_once('.').unwrap().1;
                assert!(
                    LinearRole::of(suffix).is_some(),
                    "{}: {}",
                    dir.display(),
                    l.module
                );
            }
        }
    }
}
