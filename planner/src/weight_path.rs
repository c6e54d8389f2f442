//! The weight path: which in-memory format and kernel the decode unit runs a checkpoint with, decided from the
//! unit's ISA facts (a probe's output, never a flag) and the workload's priority, with the reason written into the
//! plan. The rules are BRIEF §2's, measured in the seeds:
//!
//! * x86 with AMX -> W4A8 (symmetric, zero point pinned at 8): 84.5 tok/s on a Xeon 8480C (seed 002).
//! * x86 without AMX, or `priority = "fidelity"` -> W4A16 in the tinygemm layout (bf16 activations, more faithful).
//! * ARM -> W4A16, flagged unverified (a different PyTorch kernel than the AVX-512 one measured).
//! * phone NPU -> not run by the engine; the deliverable is an exported graph with w8a16.
//! * Hopper (sm_90) -> FP8; NVFP4 runs weight-only with in-register decode (no native FP4).
//! * Blackwell (sm_100/sm_120) -> FP8 or NVFP4 by measurement.
//!
//! A quantized checkpoint keeps its format: the planner never switches format on an estimate (seed 000 §6: the one
//! estimate made without measuring was wrong by 30x). Only an unquantized checkpoint on a CPU is converted to 4 bits,
//! the path the seed measured.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::model::{DType, Quantization, Role, TensorEntry};
use crate::profile::{Arch, ComputeKind, ComputeUnit, KernelRate, WeightFormat};
use crate::workload::{Priority, TargetEngine, Workload};

/// Group size of the W4A16 tinygemm path (seed 002: W4A16 g64).
pub const W4A16_GROUP: u32 = 64;
/// Group size of the W4A8 AMX path (seed 002: W4A8 g128).
pub const W4A8_GROUP: u32 = 128;

/// A load-time conversion of the matmul weights a checkpoint stores in a float dtype: all of them for an unquantized
/// checkpoint; for a GPTQ checkpoint on the int4 CPU paths, the ones its exporter left in float (the tied
/// embedding, which is also the head, an untied `lm_head`, Spark's `g_proj`), quantized to the path's own groups as
/// the engine does at load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conversion {
    pub bits: u32,
    pub group_size: u32,
    pub symmetric: bool,
    /// Bytes per parameter after conversion, scales (and zeros) included.
    pub bytes_per_param: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WeightPath {
    /// The compute unit the path is for (the decode unit).
    pub unit: String,
    pub checkpoint_format: WeightFormat,
    pub format: WeightFormat,
    pub kernel: String,
    pub activations: String,
    /// True only where edgefit's engine runs this path on this unit today ([`ENGINE_CPU_PATHS`] on a CPU): false
    /// for export targets (a phone NPU: the plan describes the exported graph) and for GPU paths until the engine
    /// runs on CUDA.
    pub runs_in_engine: bool,
    /// False where the path was not measured on this kind of hardware (ARM int4).
    pub verified: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<Conversion>,
    /// Why this path, in words (`kernel` above is the path's kernel family in words; `group` below is what the engine
    /// dispatches on).
    pub reason: String,
    /// How a prompt's activations enter the W4A16 integer GEMM, TOML `[weight_path.prefill]`: present on x86 W4A16
    /// paths the engine runs, absent everywhere else (W4A8 is int8 per token already; other paths have no such
    /// choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<Prefill>,
    /// The kernel each tensor group of the decode step runs, by stored format, TOML `[[weight_path.group]]`: what an
    /// engine dispatches on. Empty only on a path built without a model (unit tests of the choice).
    #[serde(rename = "group", default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupKernel>,
}

/// The activation precision of the W4A16 int4 GEMM for prompt (prefill) calls. Decode steps always keep int16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PrefillActivations {
    /// int16 per row and weight group with a power-of-two scale: the decode GEMV's encoding, so prompt and decode
    /// compute the same function (W4A16's own numerics).
    Int16,
    /// int8 per row and weight group, `s = max |x_g| / 127`: llama.cpp's Q8_0 class, the activation precision of
    /// llama.cpp's own Q4_0 prefill. Twice the integer dot products per instruction of int16 (`vpdpbusd`).
    Int8,
}

impl PrefillActivations {
    /// The name plans and the command lines spell it with.
    pub fn name(self) -> &'static str {
        match self {
            PrefillActivations::Int16 => "int16",
            PrefillActivations::Int8 => "int8",
        }
    }

    /// Parses a command line's `int16` / `int8`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "int16" => Ok(PrefillActivations::Int16),
            "int8" => Ok(PrefillActivations::Int8),
            other => Err(format!("expected `int16` or `int8`, got `{other}`")),
        }
    }
}

/// The prompt (prefill) side of a W4A16 path: which activation precision its GEMM calls take, from how many rows on,
/// and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Prefill {
    pub activations: PrefillActivations,
    /// A linear call with at least this many activation rows (a prompt's tokens) takes `activations`; fewer rows
    /// run int16. Always above the workload's `max_num_seqs`, so a decode step (one row per sequence) never
    /// reaches it.
    pub min_rows: u64,
    pub reason: String,
}

/// The fewest rows of a prompt call that take int8 activations: the smallest m at which the kernel benchmark
/// measured the int8 GEMM (m = 16: 1.5-1.8x the int16 GEMM on every Qwen3-1.7B shape, `benchmarks/engine-cpu.md`).
/// Shorter prompts cost little to prefill and keep the decode's int16 numerics.
pub const PREFILL_INT8_MIN_ROWS: u64 = 16;

/// The tensor groups of a decode step, in the order a layer runs them.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TensorGroup {
    /// The token embedding (a gather of one row per token).
    Embedding,
    /// Attention projections: q/k/v (fused or not), the output projection, an output gate's projection.
    Attention,
    /// Gated DeltaNet projections (`in_proj_*`, `out_proj`).
    Gdn,
    /// Dense MLP projections, a shared expert and the router.
    Mlp,
    /// Routed experts.
    Experts,
    /// The LM head (the tied embedding when tied).
    LmHead,
}

/// A kernel family the engine (and `kernels`) runs: what a plan's tensor group dispatches to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KernelChoice {
    /// f32 weights, f32 GEMV / GEMM.
    DenseF32,
    /// bf16 (or f16) weights as stored, f32 accumulation: GEMV at decode, GEMM for prompts.
    DenseBf16,
    /// FP8 e4m3 with 128x128 block scales: the tiled block GEMV at decode, the block GEMM for prompts.
    Fp8BlockTiles,
    /// FP8 e4m3 decoded to bf16 in registers where the GPU has no FP8 tensor cores (before sm_89).
    Fp8WeightOnly,
    /// FP8 e4m3 with one per-tensor scale (modelopt's FP8 modules).
    Fp8Tensor,
    /// NVFP4 (e2m1, e4m3 per-16 scales, fp32 global) repacked into tiles: the tiles GEMV at decode, weight-only
    /// (e2m1 decoded in registers) where there are no FP4 tensor cores.
    Nvfp4Tiles,
    /// The chunked int4 pack `[N/64][K][32]` with bf16 activations (tinygemm layout, asymmetric groups).
    Int4W4a16,
    /// The int4 pack, symmetric (zero point 8), int8 activations per token.
    Int4W4a8,
    /// GPTQ codes dequantized in registers (a GPU with no int4 kernel of ours).
    GptqWeightOnly,
    /// One row per token gathered from the table as stored.
    Gather,
    /// Rows gathered from the int4 head a tied table was converted into (dequantized per row).
    GatherFromHead,
    /// Not run by the engine: the vendor compiler's kernels in an exported graph.
    ExportedGraph,
}

/// The kernel of one tensor group's modules that share a stored format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupKernel {
    pub group: TensorGroup,
    /// How the checkpoint stores these modules.
    pub stored: crate::model::StoredFormat,
    pub kernel: KernelChoice,
    /// Linear modules (or tables) of this group in this stored format.
    pub modules: u64,
}

impl WeightPath {
    /// Bytes a tensor occupies once loaded on this path.
    pub fn planned_bytes(&self, t: &TensorEntry) -> u64 {
        match &self.conversion {
            Some(c) if converts(t) => (t.params as f64 * c.bytes_per_param).ceil() as u64,
            _ => t.bytes,
        }
    }

    /// The measured rate of this path's kernel on `unit` under `engine`, if the profile has one.
    pub fn kernel_rate<'a>(
        &self,
        unit: &'a ComputeUnit,
        engine: TargetEngine,
    ) -> Option<&'a KernelRate> {
        unit.kernel_rate(self.format, engine)
    }
}

/// The group a linear module belongs to, from its name; `None` for modules off the decode path (the vision tower, the
/// MTP head).
fn group_of(module: &str) -> Option<TensorGroup> {
    // Prefix checks first and the routed experts (all but a few hundred of a MoE model's modules) with one scan.
    if module.starts_with("mtp.")
        || module.starts_with("model.visual.")
        || module.starts_with("visual.")
    {
        return None;
    }
    Some(if module.contains(".experts.") {
        TensorGroup::Experts
    } else if module == "lm_head" || module.ends_with(".lm_head") {
        TensorGroup::LmHead
    } else if module.contains(".linear_attn.") {
        TensorGroup::Gdn
    } else if module.contains(".self_attn.") {
        TensorGroup::Attention
    } else {
        TensorGroup::Mlp
    })
}

impl WeightPath {
    /// The kernel a module stored as `stored` with `in_features` inputs runs on this path, on `unit`.
    pub fn kernel_for(
        &self,
        stored: crate::model::StoredFormat,
        in_features: u64,
        unit: &ComputeUnit,
    ) -> KernelChoice {
        use crate::model::StoredFormat as S;
        if !self.runs_in_engine && self.format == WeightFormat::W8a16 {
            return KernelChoice::ExportedGraph;
        }
        let int4 = match self.format {
            WeightFormat::W4a16 => Some(KernelChoice::Int4W4a16),
            WeightFormat::W4a8 => Some(KernelChoice::Int4W4a8),
            _ => None,
        };
        match stored {
            S::Dense { dtype } => {
                // The engine packs whole groups only: a ragged input dimension keeps its dense format.
                let packs = self.conversion.as_ref().is_some_and(|c| {
                    c.group_size > 0 && in_features.is_multiple_of(u64::from(c.group_size))
                });
                match (int4, packs) {
                    (Some(k), true) => k,
                    _ if dtype == DType::F32 => KernelChoice::DenseF32,
                    _ => KernelChoice::DenseBf16,
                }
            }
            S::Fp8Block { .. }
                if unit.kind == ComputeKind::Gpu && unit.isa.sm.unwrap_or(0) < 89 =>
            {
                KernelChoice::Fp8WeightOnly
            }
            S::Fp8Block { .. } => KernelChoice::Fp8BlockTiles,
            S::Fp8Tensor => KernelChoice::Fp8Tensor,
            S::Nvfp4 { .. } => KernelChoice::Nvfp4Tiles,
            S::Gptq { .. } => int4.unwrap_or(KernelChoice::GptqWeightOnly),
        }
    }
}

/// The kernel of every tensor group of `spec`'s decode step on `path`: each linear module by its stored format, the
/// embedding, and a tied head (the embedding table read as the head).
pub fn group_kernels(
    spec: &crate::model::ModelSpec,
    path: &WeightPath,
    unit: &ComputeUnit,
) -> Vec<GroupKernel> {
    use crate::model::StoredFormat as S;
    let stored_key = |f: S| -> (u8, u32, u32) {
        match f {
            S::Dense { dtype } => (0, dtype as u32, 0),
            S::Fp8Block { block } => (1, block[0], block[1]),
            S::Fp8Tensor => (2, 0, 0),
            S::Nvfp4 { group } => (3, group, 0),
            S::Gptq { bits, group } => (4, bits, group),
        }
    };
    let group_size = path
        .conversion
        .as_ref()
        .map_or(0, |c| u64::from(c.group_size));
    // A MoE model has tens of thousands of expert modules and `--all` plans every pair, so modules are counted under
    // a small key (a handful of distinct ones per model, searched linearly) and each key's kernel is chosen once.
    type Key = (TensorGroup, (u8, u32, u32), bool);
    let mut seen: Vec<(Key, GroupKernel)> = Vec::new();
    let mut add = |group, stored: S, in_features: u64| {
        let whole = group_size > 0 && in_features.is_multiple_of(group_size);
        let key = (group, stored_key(stored), whole);
        match seen.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.modules += 1,
            None => seen.push((
                key,
                GroupKernel {
                    group,
                    stored,
                    kernel: path.kernel_for(stored, in_features, unit),
                    modules: 1,
                },
            )),
        }
    };
    for l in &spec.runtime.linears {
        if let Some(g) = group_of(&l.module) {
            add(g, l.format, l.in_features);
        }
    }
    let mut out: Vec<GroupKernel> = Vec::new();
    let mut merge = |g: GroupKernel| match out
        .iter_mut()
        .find(|o| o.group == g.group && o.kernel == g.kernel && o.stored == g.stored)
    {
        Some(o) => o.modules += g.modules,
        None => out.push(g),
    };
    for (_, g) in seen {
        merge(g);
    }
    if let Some(e) = spec
        .inventory
        .iter()
        .find(|t| t.name == spec.runtime.embedding)
    {
        let stored = S::Dense { dtype: e.dtype };
        let head = path.kernel_for(stored, spec.hidden_size, unit);
        let gather = match head {
            KernelChoice::ExportedGraph => KernelChoice::ExportedGraph,
            // The tied table is the head: the embedding gathers rows of whatever the head became.
            KernelChoice::Int4W4a16 | KernelChoice::Int4W4a8 if spec.tie_word_embeddings => {
                KernelChoice::GatherFromHead
            }
            _ => KernelChoice::Gather,
        };
        if spec.tie_word_embeddings {
            merge(GroupKernel {
                group: TensorGroup::LmHead,
                stored,
                kernel: head,
                modules: 1,
            });
        }
        merge(GroupKernel {
            group: TensorGroup::Embedding,
            stored,
            kernel: gather,
            modules: 1,
        });
    }
    out.sort_by_key(|g| (g.group, g.kernel));
    out
}

/// Whether a conversion applies to this tensor: 2-D matmul weights stored in a float dtype. An untied embedding is
/// not a matmul weight (a decode step gathers one row of it) and stays as stored, as the engine keeps it; a tied one
/// is the head, read whole every token, and converts with the other matmul weights.
fn converts(t: &TensorEntry) -> bool {
    let matmul = match t.role {
        Role::LayerWeight | Role::ExpertWeight | Role::LmHead => true,
        Role::Embedding => !matches!(t.access, crate::model::Access::Gather { .. }),
        _ => false,
    };
    matmul && t.shape.len() == 2 && matches!(t.dtype, DType::Bf16 | DType::F16 | DType::F32)
}

pub fn checkpoint_format(q: &Quantization) -> WeightFormat {
    match q {
        Quantization::None { dtype: DType::F16 } => WeightFormat::F16,
        Quantization::None { dtype: DType::F32 } => WeightFormat::F32,
        Quantization::None { .. } => WeightFormat::Bf16,
        Quantization::Fp8Block { .. } => WeightFormat::Fp8Block,
        Quantization::Nvfp4 { .. } => WeightFormat::Nvfp4,
        Quantization::Gptq { .. } => WeightFormat::Gptq,
    }
}

fn int4(bits: u32, group: u32, symmetric: bool) -> Conversion {
    // Scales (bf16) per group, plus a bf16 zero per group when asymmetric (tinygemm's [K/group][N][2]).
    let meta = if symmetric { 2.0 } else { 4.0 };
    Conversion {
        bits,
        group_size: group,
        symmetric,
        bytes_per_param: bits as f64 / 8.0 + meta / group as f64,
    }
}

/// The weight paths the engine runs on CPU units. The engine crate owns the real list
/// (`engine::model::CPU_WEIGHT_PATHS`); a test there keeps this copy equal to it, so a plan says
/// `runs_in_engine = true` only for a path the engine really runs.
pub const ENGINE_CPU_PATHS: &[WeightFormat] = &[
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::Bf16,
    WeightFormat::Fp8Block,
    WeightFormat::Nvfp4,
    WeightFormat::Gptq,
    WeightFormat::W4a16,
    WeightFormat::W4a8,
];

/// The weight paths the engine runs on CUDA GPU units (`--device cuda`): dense f32 / f16 / bf16, FP8 block and
/// NVFP4 through the tile GEMVs. Int4 has no GPU kernel. Kept equal to `engine::model::CUDA_WEIGHT_PATHS` by the
/// same test.
pub const ENGINE_CUDA_PATHS: &[WeightFormat] = &[
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::Bf16,
    WeightFormat::Fp8Block,
    WeightFormat::Nvfp4,
];

/// Choose the weight path for `quant` on `unit` under workload `w` (its priority, and its engine, whose measured
/// kernel rates decide Blackwell's NVFP4 verdict).
pub fn choose(quant: &Quantization, unit: &ComputeUnit, w: &Workload) -> WeightPath {
    let mut p = choose_path(quant, unit, w.priority, w.engine);
    let engine_runs = match unit.kind {
        ComputeKind::Cpu => ENGINE_CPU_PATHS.contains(&p.format),
        ComputeKind::Gpu => ENGINE_CUDA_PATHS.contains(&p.format),
        ComputeKind::Npu | ComputeKind::Igpu => false,
    };
    p.runs_in_engine = p.runs_in_engine && engine_runs;
    p
}

/// The prompt side of `path` on `unit` under workload `w`: `Some` on the x86 W4A16 path the engine runs (int8
/// activations for prompts where the CPU has AVX-512 VNNI and the priority is speed, unless the workload pins
/// `prefill_activations`), `None` elsewhere. A pinned choice the path cannot honour is an error naming it.
pub fn prefill(
    path: &WeightPath,
    unit: &ComputeUnit,
    w: &Workload,
) -> Result<Option<Prefill>, PlanError> {
    let x86_w4a16 = path.format == WeightFormat::W4a16
        && path.runs_in_engine
        && unit.kind == ComputeKind::Cpu
        && unit.isa.arch == Arch::X86_64;
    if !x86_w4a16 {
        return match w.prefill_activations {
            Some(a) => Err(PlanError::Workload(format!(
                "prefill_activations = {} applies to the W4A16 path on an x86 CPU the engine runs; this plan's path \
                 is {:?} on `{}`{}",
                a.name(),
                path.format,
                unit.id,
                if path.format == WeightFormat::W4a8 {
                    " (int8 activations per token already; --priority fidelity plans W4A16)"
                } else {
                    ""
                }
            ))),
            None => Ok(None),
        };
    }
    // Above every decode batch: a decode step is one row per sequence, and decode keeps int16.
    let min_rows = PREFILL_INT8_MIN_ROWS.max(w.max_num_seqs.saturating_add(1));
    let vnni = unit.isa.avx512 && unit.isa.vnni;
    let int8_reason = format!(
        "prompts of {min_rows} or more tokens run the int4 GEMM with int8 activations per row and weight group \
         (s = max|x|/127, llama.cpp's Q8_0 class: the precision llama.cpp's own Q4_0 prefill uses; pp512 on the \
         Qwen3-1.7B geometry 1.93x llama.cpp Q4_0 against 1.20-1.25x with int16, benchmarks/engine-cpu.md); decode \
         keeps int16 (the GEMV's encoding); prefill_activations = \"int16\" keeps W4A16's own numerics"
    );
    let (activations, reason) = match (w.prefill_activations, w.priority) {
        (Some(PrefillActivations::Int8), _) if !vnni => {
            return Err(PlanError::Workload(format!(
                "prefill_activations = int8 needs AVX-512 VNNI (the int8 GEMM's vpdpbusd); `{}` has avx512 = {}, \
                 vnni = {}",
                unit.id, unit.isa.avx512, unit.isa.vnni
            )))
        }
        (Some(PrefillActivations::Int8), _) => (
            PrefillActivations::Int8,
            format!("the workload pins prefill_activations = int8: {int8_reason}"),
        ),
        (Some(PrefillActivations::Int16), _) => (
            PrefillActivations::Int16,
            "the workload pins prefill_activations = int16: prompts keep W4A16's 16-bit activations (the decode \
             GEMV's encoding)"
                .to_owned(),
        ),
        (None, Priority::Fidelity) => (
            PrefillActivations::Int16,
            "priority = fidelity: prompts keep W4A16's 16-bit activations (int8 would add activation rounding \
             of up to max|x|/254 per group)"
                .to_owned(),
        ),
        (None, Priority::Speed) if !vnni => (
            PrefillActivations::Int16,
            "no AVX-512 VNNI: the int8 GEMM (vpdpbusd) is not there, so prompts keep W4A16's 16-bit activations"
                .to_owned(),
        ),
        (None, Priority::Speed) => (
            PrefillActivations::Int8,
            format!("x86 with AVX-512 VNNI, priority = speed: {int8_reason}"),
        ),
    };
    Ok(Some(Prefill {
        activations,
        min_rows,
        reason,
    }))
}

fn choose_path(
    quant: &Quantization,
    unit: &ComputeUnit,
    priority: Priority,
    engine: TargetEngine,
) -> WeightPath {
    let ckpt = checkpoint_format(quant);
    let base = |format, kernel: &str, activations: &str, reason: String| WeightPath {
        unit: unit.id.clone(),
        checkpoint_format: ckpt,
        format,
        kernel: kernel.to_owned(),
        activations: activations.to_owned(),
        runs_in_engine: unit.runs_engine,
        verified: true,
        conversion: None,
        reason,
        prefill: None,
        groups: Vec::new(),
    };
    if !unit.runs_engine {
        let mut p = base(
            WeightFormat::W8a16,
            "exported graph (vendor NPU compiler)",
            "int16",
            format!(
                "`{}` is an export target, not run by the engine: the deliverable is an exported graph with calibrated \
                 w8a16 (BRIEF §2; the NPU wants 16-bit activations with 8-bit weights, seed 000 §1)",
                unit.id
            ),
        );
        p.conversion = Some(Conversion {
            bits: 8,
            group_size: 0,
            symmetric: true,
            bytes_per_param: 1.0,
        });
        p.verified = false;
        return p;
    }
    match (unit.kind, unit.isa.arch) {
        (ComputeKind::Gpu, Arch::Cuda) => gpu_path(quant, unit, engine, base),
        (_, Arch::X86_64) | (_, Arch::Aarch64) => cpu_path(quant, unit, priority, base),
        _ => base(
            ckpt,
            "reference (dequantize to f32)",
            "f32",
            format!(
                "no fast path is known for a {:?} unit; the checkpoint format is kept",
                unit.kind
            ),
        ),
    }
}

fn gpu_path(
    quant: &Quantization,
    unit: &ComputeUnit,
    engine: TargetEngine,
    base: impl Fn(WeightFormat, &str, &str, String) -> WeightPath,
) -> WeightPath {
    let sm = unit.isa.sm.unwrap_or(0);
    let measured = |f: WeightFormat| unit.kernel_rate(f, engine);
    match quant {
        Quantization::Fp8Block { .. } if sm >= 89 => {
            let mut reason = format!(
                "FP8 checkpoint on sm_{sm}: native FP8 GEMV with 128x128 block scales, activations quantized per \
                 token per 128; the checkpoint's format is kept (never switched on an estimate)"
            );
            if let Some(k) = measured(WeightFormat::Nvfp4) {
                reason.push_str(&format!(
                    "; the measured NVFP4 kernel rate here ({:.3e} B/s, {}) is below the VRAM read rate, so an NVFP4 \
                     build would be compute-bound",
                    k.decode_weight_bytes_per_s.value, k.decode_weight_bytes_per_s.source
                ));
            }
            base(WeightFormat::Fp8Block, "fp8 block GEMV (e4m3, 128x128 scales)", "fp8 e4m3 per token per 128", reason)
        }
        Quantization::Fp8Block { .. } => base(
            WeightFormat::Fp8Block,
            "fp8 weight-only (in-register decode to bf16)",
            "bf16",
            format!("sm_{sm} has no FP8 tensor cores: FP8 weights are decoded in registers"),
        ),
        Quantization::Nvfp4 { .. } if sm >= 100 => {
            let why = match measured(WeightFormat::Nvfp4) {
                Some(k) if k.extrapolated => format!(
                    "the profile's NVFP4 decode rate for {} ({:.3e} B/s, {}) is the compute term; it is carried over \
                     from another device's measurement, not measured on sm_{sm}, so the path is unverified",
                    engine.name(),
                    k.decode_weight_bytes_per_s.value,
                    k.decode_weight_bytes_per_s.source
                ),
                Some(k) => format!(
                    "the profile's measured NVFP4 decode rate ({:.3e} B/s, {}) is the compute term: the byte model alone \
                     was 4.7x optimistic on this stack (seed 000 §6)",
                    k.decode_weight_bytes_per_s.value, k.decode_weight_bytes_per_s.source
                ),
                None => "no NVFP4 kernel rate is measured on this unit: the prediction is the byte model only and is \
                         unverified (seed 000 §6 found it 4.7x optimistic on sm_120)"
                    .to_owned(),
            };
            let mut p = base(
                WeightFormat::Nvfp4,
                "nvfp4 GEMV (e2m1, e4m3 per-16 scales, fp32 global)",
                "nvfp4 per 16",
                format!("NVFP4 checkpoint on Blackwell sm_{sm}: FP8 or NVFP4 by measurement; {why}"),
            );
            p.verified = measured(WeightFormat::Nvfp4).is_some_and(|k| !k.extrapolated);
            p
        }
        Quantization::Nvfp4 { .. } => base(
            WeightFormat::Nvfp4,
            "nvfp4 weight-only (in-register e2m1 decode to bf16)",
            "bf16",
            format!("sm_{sm} has no native FP4: NVFP4 runs weight-only with in-register decode (BRIEF §2)"),
        ),
        Quantization::Gptq { bits, group_size, .. } => {
            let mut p = base(
                WeightFormat::Gptq,
                "gptq weight-only (in-register int4 decode to bf16)",
                "bf16",
                format!(
                    "GPTQ {bits}-bit g{group_size} checkpoint on a GPU: weight-only dequant; no GPU int4 kernel rate is \
                     measured, so the path is unverified"
                ),
            );
            p.verified = false;
            p
        }
        Quantization::None { dtype } => base(
            checkpoint_format(quant),
            "bf16 GEMV",
            "bf16",
            format!("unquantized {dtype:?} checkpoint on a GPU: kept as is (never switched on an estimate)"),
        ),
    }
}

/// What happens to the float matmul weights of a GPTQ checkpoint on the int4 CPU paths.
const GPTQ_FLOATS: &str = "the matmul weights the GPTQ export left in float (the tied embedding, which is also the \
    head and read whole every token; g_proj) are quantized at load to the path's int4 groups, so a decode step reads \
    the head at 4 bits (seed 002 measured 84.5 tok/s on an artifact whose tied embedding was quantized: 'the \
    quantized tied embedding [is] faithful')";

fn cpu_path(
    quant: &Quantization,
    unit: &ComputeUnit,
    priority: Priority,
    base: impl Fn(WeightFormat, &str, &str, String) -> WeightPath,
) -> WeightPath {
    let isa = &unit.isa;
    let arm = isa.arch == Arch::Aarch64;
    let w4a8_ok = !arm && isa.amx && priority == Priority::Speed;
    let why_not_w4a8 = if arm {
        "ARM: W4A16, flagged unverified (PyTorch dispatches a different 4-bit CPU kernel there than the AVX-512 one \
         measured, seed 002)"
    } else if priority == Priority::Fidelity {
        "priority = fidelity: W4A16 with bf16 activations is the more faithful 4-bit path (seed 002: 2/12 vs 1/12 \
         greedy prompts against bf16)"
    } else {
        "x86 without AMX: W4A16 tinygemm (the W4A8 kernel is an AMX GEMM)"
    };
    let w4a8 = |reason: String, conversion| {
        let mut p = base(
            WeightFormat::W4a8,
            "int4 W4A8 AMX GEMM (zero point 8)",
            "int8 per token",
            reason,
        );
        p.conversion = conversion;
        p
    };
    let w4a16 = |reason: String, conversion| {
        let mut p = base(
            WeightFormat::W4a16,
            "int4 W4A16 tinygemm GEMV ([N/64][K][32] packed)",
            "bf16",
            reason,
        );
        p.conversion = conversion;
        p.verified = !arm;
        p
    };
    match quant {
        Quantization::None { .. } if w4a8_ok => w4a8(
            format!(
                "x86 with AMX, priority = speed: W4A8 symmetric g{W4A8_GROUP} (seed 002: 84.5 tok/s vs 69.1 for W4A16 \
                 on a Xeon 8480C); weights quantized at load"
            ),
            Some(int4(4, W4A8_GROUP, true)),
        ),
        Quantization::None { .. } => {
            w4a16(format!("{why_not_w4a8}; weights quantized at load, g{W4A16_GROUP}"), Some(int4(4, W4A16_GROUP, false)))
        }
        Quantization::Gptq { bits: 4, sym: true, .. } if w4a8_ok => w4a8(
            format!(
                "GPTQ symmetric 4-bit checkpoint on x86 with AMX: W4A8 with the zero point pinned at 8; {GPTQ_FLOATS}"
            ),
            Some(int4(4, W4A8_GROUP, true)),
        ),
        Quantization::Gptq { bits: 4, sym, .. } => {
            let asym = if !sym && !arm && isa.amx {
                "an asymmetric GPTQ grid cannot use the W4A8 kernel (zero point pinned at 8); "
            } else {
                ""
            };
            w4a16(
                format!("{asym}{why_not_w4a8}; GPTQ codes repacked to the tinygemm layout; {GPTQ_FLOATS}"),
                Some(int4(4, W4A16_GROUP, false)),
            )
        }
        _ => {
            let mut p = base(
                checkpoint_format(quant),
                "weight-only reference (dequantize to f32 in-register)",
                "f32",
                "quantized GPU checkpoint on a CPU: the format is kept (never switched on an estimate); no fast CPU \
                 kernel is measured for it"
                    .to_owned(),
            );
            p.verified = false;
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{IsaFacts, PeakRates};

    fn unit(kind: ComputeKind, arch: Arch, sm: Option<u32>, amx: bool) -> ComputeUnit {
        ComputeUnit {
            id: "u".into(),
            kind,
            description: String::new(),
            pool: "p".into(),
            runs_engine: true,
            isa: IsaFacts {
                arch,
                sm,
                avx512: true,
                vnni: true,
                bf16: true,
                amx,
                source: "t".into(),
            },
            peak: PeakRates::default(),
            kernels: vec![],
            kernel_floor_s: None,
        }
    }
    const BF16: Quantization = Quantization::None { dtype: DType::Bf16 };

    fn fidelity() -> Workload {
        Workload {
            priority: Priority::Fidelity,
            ..Workload::default()
        }
    }

    #[test]
    fn amx_speed_is_w4a8_and_fidelity_is_w4a16() {
        let u = unit(ComputeKind::Cpu, Arch::X86_64, None, true);
        let p = choose(&BF16, &u, &Workload::default());
        assert_eq!(p.format, WeightFormat::W4a8);
        assert!(p.conversion.as_ref().unwrap().symmetric);
        let p = choose(&BF16, &u, &fidelity());
        assert_eq!(p.format, WeightFormat::W4a16);
        assert!(p.reason.contains("fidelity"));
    }

    /// The prompt side of a plan: int8 on x86 W4A16 with VNNI at priority speed, int16 where VNNI is missing, at
    /// priority fidelity or when pinned, nothing on W4A8 (AMX) or ARM; a pin the path cannot honour is an error.
    #[test]
    fn prefill_activations_follow_vnni_priority_and_the_pin() {
        let plan = |u: &ComputeUnit, w: &Workload| prefill(&choose(&BF16, u, w), u, w);
        let vnni = unit(ComputeKind::Cpu, Arch::X86_64, None, false);
        let p = plan(&vnni, &Workload::default()).unwrap().unwrap();
        assert_eq!(
            (p.activations, p.min_rows),
            (PrefillActivations::Int8, PREFILL_INT8_MIN_ROWS)
        );
        assert!(p.reason.contains("VNNI, priority = speed"), "{}", p.reason);
        // A decode step of max_num_seqs rows never reaches the threshold.
        let batch = Workload {
            max_num_seqs: 32,
            ..Workload::default()
        };
        assert_eq!(plan(&vnni, &batch).unwrap().unwrap().min_rows, 33);

        let mut no_vnni = vnni.clone();
        no_vnni.isa.vnni = false;
        let p = plan(&no_vnni, &Workload::default()).unwrap().unwrap();
        assert_eq!(p.activations, PrefillActivations::Int16);
        assert!(p.reason.contains("no AVX-512 VNNI"), "{}", p.reason);
        let pin8 = Workload {
            prefill_activations: Some(PrefillActivations::Int8),
            ..Workload::default()
        };
        let e = plan(&no_vnni, &pin8).unwrap_err().to_string();
        assert!(e.contains("needs AVX-512 VNNI"), "{e}");

        let p = plan(&vnni, &fidelity()).unwrap().unwrap();
        assert_eq!(p.activations, PrefillActivations::Int16);
        assert!(p.reason.contains("fidelity"), "{}", p.reason);
        let pin16 = Workload {
            prefill_activations: Some(PrefillActivations::Int16),
            ..Workload::default()
        };
        let p = plan(&vnni, &pin16).unwrap().unwrap();
        assert_eq!(p.activations, PrefillActivations::Int16);
        assert!(p.reason.contains("pins prefill_activations = int16"));

        // AMX at priority speed is W4A8, whose activations are int8 per token already: no prompt choice to make.
        let amx = unit(ComputeKind::Cpu, Arch::X86_64, None, true);
        assert_eq!(plan(&amx, &Workload::default()).unwrap(), None);
        let e = plan(&amx, &pin16).unwrap_err().to_string();
        assert!(e.contains("W4a8") && e.contains("fidelity"), "{e}");
        // ARM's W4A16 has no integer GEMM.
        let arm = unit(ComputeKind::Cpu, Arch::Aarch64, None, false);
        assert_eq!(plan(&arm, &Workload::default()).unwrap(), None);
    }

    #[test]
    fn x86_without_amx_is_w4a16() {
        let p = choose(
            &BF16,
            &unit(ComputeKind::Cpu, Arch::X86_64, None, false),
            &Workload::default(),
        );
        assert_eq!(p.format, WeightFormat::W4a16);
        assert!(p.verified);
        assert!(p.reason.contains("without AMX"));
    }

    #[test]
    fn arm_is_w4a16_unverified() {
        let p = choose(
            &BF16,
            &unit(ComputeKind::Cpu, Arch::Aarch64, None, false),
            &Workload::default(),
        );
        assert_eq!(p.format, WeightFormat::W4a16);
        assert!(!p.verified);
    }

    #[test]
    fn asymmetric_gptq_never_takes_the_zero_point_8_kernel() {
        let q = Quantization::Gptq {
            bits: 4,
            group_size: 128,
            sym: false,
        };
        let p = choose(
            &q,
            &unit(ComputeKind::Cpu, Arch::X86_64, None, true),
            &Workload::default(),
        );
        assert_eq!(p.format, WeightFormat::W4a16);
        assert!(p.reason.contains("zero point pinned at 8"));
        let q = Quantization::Gptq {
            bits: 4,
            group_size: 128,
            sym: true,
        };
        let p = choose(
            &q,
            &unit(ComputeKind::Cpu, Arch::X86_64, None, true),
            &Workload::default(),
        );
        assert_eq!(p.format, WeightFormat::W4a8);
        // The codes stay GPTQ's; only the float matmul weights (the tied head) are quantized, to W4A8's groups.
        let c = p.conversion.as_ref().unwrap();
        assert_eq!((c.group_size, c.symmetric), (W4A8_GROUP, true));
    }

    #[test]
    fn hopper_runs_nvfp4_weight_only_and_fp8_natively() {
        let u = unit(ComputeKind::Gpu, Arch::Cuda, Some(90), false);
        let q = Quantization::Nvfp4 {
            group_size: 16,
            exclude_modules: vec![],
        };
        let p = choose(&q, &u, &Workload::default());
        assert_eq!(p.format, WeightFormat::Nvfp4);
        assert!(p.kernel.contains("weight-only"));
        let p = choose(
            &Quantization::Fp8Block { block: [128, 128] },
            &u,
            &Workload::default(),
        );
        assert_eq!(p.format, WeightFormat::Fp8Block);
        assert!(p.kernel.contains("block GEMV"));
    }

    #[test]
    fn blackwell_nvfp4_is_verified_only_with_a_measured_rate() {
        let mut u = unit(ComputeKind::Gpu, Arch::Cuda, Some(120), false);
        let q = Quantization::Nvfp4 {
            group_size: 16,
            exclude_modules: vec![],
        };
        assert!(!choose(&q, &u, &Workload::default()).verified);
        u.kernels.push(KernelRate {
            format: WeightFormat::Nvfp4,
            engine: None,
            extrapolated: false,
            decode_cache_bytes_per_s: None,
            decode_weight_bytes_per_s: crate::profile::Measured {
                value: 2e10,
                source: "seed".into(),
            },
            offloaded_weight_bytes_per_s: None,
            prefill_flops_per_s: None,
            prefill_int8_flops_per_s: None,
        });
        let p = choose(&q, &u, &Workload::default());
        assert!(p.verified);
        assert!(p.reason.contains("measured NVFP4 decode rate"));
    }

    #[test]
    fn export_targets_are_not_run() {
        let mut u = unit(ComputeKind::Npu, Arch::Hexagon, None, false);
        u.runs_engine = false;
        let p = choose(&BF16, &u, &Workload::default());
        assert_eq!(p.format, WeightFormat::W8a16);
        assert!(!p.runs_in_engine);
    }

    #[test]
    fn conversion_touches_only_float_matmul_weights() {
        let p = choose(
            &BF16,
            &unit(ComputeKind::Cpu, Arch::X86_64, None, false),
            &Workload::default(),
        );
        let w = TensorEntry {
            name: "w".into(),
            shape: vec![64, 64],
            dtype: DType::Bf16,
            bytes: 8192,
            params: 4096,
            role: Role::LayerWeight,
            access: crate::model::Access::EveryToken,
            layer: Some(0),
        };
        assert_eq!(p.planned_bytes(&w), 4096 * 9 / 16);
        let norm = TensorEntry {
            shape: vec![64],
            role: Role::Small,
            bytes: 128,
            params: 64,
            ..w.clone()
        };
        assert_eq!(p.planned_bytes(&norm), 128);
        // An untied embedding is gathered, not multiplied: it stays as stored. A tied one is the head.
        let untied = TensorEntry {
            role: Role::Embedding,
            access: crate::model::Access::Gather { row_bytes: 128 },
            ..w.clone()
        };
        assert_eq!(p.planned_bytes(&untied), 8192);
        let tied = TensorEntry {
            role: Role::Embedding,
            ..w.clone()
        };
        assert_eq!(p.planned_bytes(&tied), 4096 * 9 / 16);
    }
}
