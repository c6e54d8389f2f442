//! The forward pass of every supported family, built only from the planner's [`ModelSpec`] (its `runtime` facts
//! say which norm, activation, gate and RoPE a layer uses) and the checkpoint's tensors, converted once at load into
//! the weight path the plan chose.
//!
//! One decoder layer is: `h = norm(x)`; a mixer (softmax attention, full or sliding, or a gated DeltaNet) on `h`;
//! Gemma's sandwich norm on its output; the residual add; `norm` again; the gated MLP; the sandwich norm; the
//! residual add. The families differ only in the facts `runtime` carries.

use kernels::attention::{self, AttnDims, KvSlice, PagedKv, RingKv, Rope};
use kernels::backend::{self, Weight};
use kernels::gdn::{self, GdnDims, GdnInputs, GdnWeights};
use kernels::ops::{self, EmbeddingTable, NormWeight};
use planner::model::{Activation, LayerKind, ModelSpec, NormForm, OutputGate, StoredFormat};
use planner::profile::WeightFormat;

use std::sync::atomic::{AtomicU64, Ordering};

use kernels::linear::GemmActs;
use planner::weight_path::{Prefill, PrefillActivations};

use crate::cache::Caches;
use crate::checkpoint::{widen, Checkpoint};
use crate::profile::{self, Op};
use crate::EngineError;

mod cuda;
pub use cuda::{CudaModel, CudaOptions, Span};

/// Which weight path the loaded linears take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightMode {
    /// The checkpoint's own formats, f32 or bf16 computed with f32 accumulation: the parity path.
    Exact,
    /// Dense weights converted at load into the chunked int4 pack for W4A16 (group 64, asymmetric).
    W4a16,
    /// Dense weights converted into the symmetric int4 pack for W4A8 (group 128, zero point 8).
    W4a8,
}

impl WeightMode {
    /// Whether this mode's int4 pack is W4A8's (symmetric) and its group size: the plan's own constants.
    fn int4(self) -> (bool, usize) {
        let a8 = self == WeightMode::W4a8;
        let group = if a8 {
            planner::weight_path::W4A8_GROUP
        } else {
            planner::weight_path::W4A16_GROUP
        };
        (a8, group as usize)
    }

    /// The mode a plan's weight path asks for; quantized checkpoints keep their format whatever the plan says.
    pub fn from_plan(format: WeightFormat) -> Result<WeightMode, EngineError> {
        match format {
            WeightFormat::Bf16
            | WeightFormat::F16
            | WeightFormat::F32
            | WeightFormat::Fp8Block
            | WeightFormat::Nvfp4
            | WeightFormat::Gptq => Ok(WeightMode::Exact),
            WeightFormat::W4a16 => Ok(WeightMode::W4a16),
            WeightFormat::W4a8 => Ok(WeightMode::W4a8),
            WeightFormat::W8a16 => Err(EngineError::Unsupported(
                "the plan's weight path is w8a16, an export format for a phone NPU; the engine does not run it"
                    .into(),
            )),
        }
    }
}

/// The weight paths the engine runs on the CPU: the list the planner's `runs_in_engine` is checked against.
pub const CPU_WEIGHT_PATHS: &[WeightFormat] = &[
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::Bf16,
    WeightFormat::Fp8Block,
    WeightFormat::Nvfp4,
    WeightFormat::Gptq,
    WeightFormat::W4a16,
    WeightFormat::W4a8,
];

/// The weight paths the engine runs on a CUDA GPU ([`CudaModel`]): the list the planner's `runs_in_engine` is
/// checked against for GPU units.
pub const CUDA_WEIGHT_PATHS: &[WeightFormat] = &[
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::Bf16,
    WeightFormat::Fp8Block,
    WeightFormat::Nvfp4,
];

/// Every architecture the engine runs (the planner knows more: `qwen3_next` is planned, not run yet).
pub const ENGINE_MODEL_TYPES: &[&str] = &[
    "qwen3_5",
    "qwen3_5_text",
    "spark2_5",
    "gemma3_text",
    "qwen3",
    "qwen2",
    "llama",
];

/// A dense embedding table as the checkpoint stores it.
enum Table {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
}

enum Embedding {
    /// An untied table, kept dense: a gather reads one row per token.
    Table(Table),
    /// A tied table held once, as the head: rows are gathered from it (dequantized when converted).
    Head,
}

enum Qkv {
    Split {
        q: Weight,
        k: Weight,
        v: Weight,
    },
    /// One weight whose rows are q (`q_rows`, twice as wide with a per-head gate), then k, then v: Spark's stored
    /// `q_k_v_proj`, or the three projections fused at load so a decode step makes one call instead of three.
    Fused {
        w: Weight,
        q_rows: usize,
    },
}

struct AttnLayer {
    qkv: Qkv,
    o: Weight,
    biases: [Option<Vec<f32>>; 4],
    /// Spark's per-head gate projection.
    g_proj: Option<Weight>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    rope: Rope,
    window: Option<usize>,
}

struct GdnLayer {
    in_qkv: Weight,
    in_z: Weight,
    in_b: Weight,
    in_a: Weight,
    out: Weight,
    conv: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
}

enum GateUp {
    Fused(Weight),
    Split { gate: Weight, up: Weight },
}

enum Mixer {
    Attn(Box<AttnLayer>),
    Gdn(Box<GdnLayer>),
}

struct Layer {
    input_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    /// Gemma's extra norms: before the MLP and after it (`post_attn_norm` then norms the attention output).
    pre_ff_norm: Option<Vec<f32>>,
    post_ff_norm: Option<Vec<f32>>,
    mixer: Mixer,
    /// Gate and up projections, fused at load into one weight (gate rows first: the `[rows, 2*inter]` layout the
    /// activation kernels read) where their formats allow, else apart.
    gate_up: GateUp,
    down: Weight,
}

/// The caches the CUDA engine allocates (`CudaModel`'s per-layer state), in elements, and their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaCacheSizes {
    /// f32 K (and as many V) values per attention layer: every slot, every position, `kv_heads * head_dim` wide.
    pub kv_len: usize,
    /// f32 conv-state values per DeltaNet layer: a pair per slot (read from one half, written to the other).
    pub conv_len: usize,
    /// f32 recurrent-state values per DeltaNet layer.
    pub state_len: usize,
    pub bytes: u64,
}

/// A loaded model: weights in their planned format, ready for [`Model::forward`].
pub struct Model {
    pub spec: ModelSpec,
    pub mode: WeightMode,
    embed: Embedding,
    embed_scale: Option<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Weight,
    pub attn_dims: AttnDims,
    pub gdn_dims: Option<GdnDims>,
    norm_form: NormWeight,
    eps: f32,
    inter: usize,
    /// Bytes of every loaded weight, as held in memory.
    pub weight_bytes: u64,
    /// Bytes a decode step reads per token (every linear plus one embedding row): the roofline's numerator.
    pub decode_read_bytes: u64,
    /// The weight path names in use, each once.
    paths: Vec<&'static str>,
    /// Whether the weights were moved to a device ([`CudaModel::upload`]): the CPU forward then refuses.
    on_device: bool,
    /// Linear calls with at least this many rows (a prompt's tokens) run the W4A16 GEMM with int8 activations: the
    /// plan's `weight_path.prefill` ([`Model::set_prefill`]). `None`: every call keeps int16, W4A16's own numerics.
    prefill_int8_from: Option<usize>,
    /// Linear calls that ran the int8 GEMM, so a caller (and every test of the path) can see that it ran.
    int8_calls: AtomicU64,
}

fn usize_of(v: u64, what: &str) -> Result<usize, EngineError> {
    usize::try_from(v)
        .map_err(|_| EngineError::Unsupported(format!("{what} = {v} does not fit this machine")))
}

/// Loads one linear module in the weight path `mode` asks for, then releases its mapped pages.
fn load_linear(ck: &Checkpoint, module: &str, mode: WeightMode) -> Result<Weight, EngineError> {
    let w = convert_linear(ck, module, mode)?;
    for t in [
        "weight",
        "weight_scale_inv",
        "weight_scale",
        "qweight",
        "qzeros",
        "scales",
    ] {
        ck.release(&format!("{module}.{t}"));
    }
    Ok(w)
}

/// Several dense linear modules with the same input, fused at load into one weight (rows of each in order), with
/// each part's row count; `None` when they cannot be (a quantized or mixed-dtype part, or int4 groups that do not
/// divide the input). One call reads every part's weights in one pass: a decode step makes 4 calls per attention
/// layer instead of 7, each over a larger matrix.
fn load_fused(
    ck: &Checkpoint,
    modules: &[String],
    mode: WeightMode,
) -> Result<Option<(Weight, Vec<usize>)>, EngineError> {
    let mut parts = Vec::new();
    for m in modules {
        let Some(l) = ck.spec.runtime.linears.iter().find(|l| &l.module == m) else {
            return Ok(None);
        };
        let StoredFormat::Dense { .. } = l.format else {
            return Ok(None);
        };
        if l.bias || ck.has(&format!("{m}.bias")) {
            return Ok(None);
        }
        parts.push((
            format!("{m}.weight"),
            usize_of(l.out_features, "out_features")?,
            usize_of(l.in_features, "in_features")?,
        ));
    }
    let k = parts[0].2;
    let dtype = ck.info(&parts[0].0)?.dtype;
    for (name, _, pk) in &parts {
        if *pk != k || ck.info(name)?.dtype != dtype {
            return Ok(None);
        }
    }
    let rows: Vec<usize> = parts.iter().map(|p| p.1).collect();
    let n: usize = rows.iter().sum();
    let err = |e: kernels::KernelError| EngineError::Kernel(format!("{}: {e}", modules.join("+")));
    let w = match mode {
        WeightMode::Exact if dtype == safetensors::Dtype::BF16 => {
            let mut all = Vec::with_capacity(n * k);
            for (name, _, _) in &parts {
                all.extend(ck.bf16_bits(name)?);
            }
            Weight::bf16(all, n, k).map_err(err)?
        }
        WeightMode::Exact => {
            let mut all = Vec::with_capacity(n * k);
            for (name, _, _) in &parts {
                all.extend(ck.f32(name)?);
            }
            Weight::f32(all, n, k).map_err(err)?
        }
        WeightMode::W4a16 | WeightMode::W4a8 => {
            let (a8, group) = mode.int4();
            if k % group != 0 {
                return Ok(None);
            }
            let width = if dtype == safetensors::Dtype::F32 {
                4
            } else {
                2
            };
            let sources: Vec<&[u8]> = parts
                .iter()
                .map(|(name, _, _)| ck.bytes(name))
                .collect::<Result<_, _>>()?;
            Weight::int4_from_rows(n, k, group, a8, |row0, buf| {
                for (r, out) in buf.chunks_exact_mut(k).enumerate() {
                    // Global row -> (part, row in part).
                    let (mut p, mut row) = (0, row0 + r);
                    while row >= rows[p] {
                        row -= rows[p];
                        p += 1;
                    }
                    widen(
                        dtype,
                        &sources[p][row * k * width..(row + 1) * k * width],
                        out,
                    );
                }
                Ok(())
            })
            .map_err(err)?
        }
    };
    for (name, _, _) in &parts {
        ck.release(name);
    }
    Ok(Some((w, rows)))
}

fn convert_linear(ck: &Checkpoint, module: &str, mode: WeightMode) -> Result<Weight, EngineError> {
    let lin = ck
        .spec
        .runtime
        .linears
        .iter()
        .find(|l| l.module == module)
        .ok_or_else(|| {
            EngineError::Checkpoint(format!(
                "{module}: not a linear module of this architecture"
            ))
        })?;
    let (n, k) = (
        usize_of(lin.out_features, "out_features")?,
        usize_of(lin.in_features, "in_features")?,
    );
    let wname = format!("{module}.weight");
    let err = |e: kernels::KernelError| EngineError::Kernel(format!("{module}: {e}"));
    match lin.format {
        StoredFormat::Dense { .. } => {
            let dtype = ck.info(&wname)?.dtype;
            match mode {
                WeightMode::Exact if dtype == safetensors::Dtype::BF16 => {
                    Weight::bf16(ck.bf16_bits(&wname)?, n, k).map_err(err)
                }
                WeightMode::Exact => Weight::f32(ck.f32(&wname)?, n, k).map_err(err),
                WeightMode::W4a16 | WeightMode::W4a8 => {
                    let (a8, group) = mode.int4();
                    if k % group != 0 {
                        // The int4 pack needs whole groups; a ragged layer keeps its dense format.
                        return convert_linear(ck, module, WeightMode::Exact);
                    }
                    // Streams one 64-row block at a time from the mapping: the packer's only transient.
                    let bytes = ck.bytes(&wname)?;
                    let width = match dtype {
                        safetensors::Dtype::F32 => 4,
                        _ => 2,
                    };
                    Weight::int4_from_rows(n, k, group, a8, |row0, buf| {
                        widen(
                            dtype,
                            &bytes[row0 * k * width..(row0 * k + buf.len()) * width],
                            buf,
                        );
                        Ok(())
                    })
                    .map_err(err)
                }
            }
        }
        StoredFormat::Fp8Block { block } => {
            if block != [128, 128] {
                return Err(EngineError::Unsupported(format!(
                    "{module}: FP8 block {block:?}; the kernels read 128x128 blocks"
                )));
            }
            let scale = ck.f32(&format!("{module}.weight_scale_inv"))?;
            Weight::fp8_block(ck.bytes(&wname)?.to_vec(), scale, n, k).map_err(err)
        }
        StoredFormat::Fp8Tensor => {
            let scale = ck.scalar(&format!("{module}.weight_scale"))?;
            Weight::fp8_tensor(ck.bytes(&wname)?.to_vec(), scale, n, k).map_err(err)
        }
        StoredFormat::Nvfp4 { group } => {
            if group != 16 {
                return Err(EngineError::Unsupported(format!(
                    "{module}: NVFP4 group {group}; the kernels read 16"
                )));
            }
            let scales = ck.bytes(&format!("{module}.weight_scale"))?.to_vec();
            let global = ck.scalar(&format!("{module}.weight_scale_2"))?;
            Weight::nvfp4(ck.bytes(&wname)?.to_vec(), scales, global, n, k).map_err(err)
        }
        StoredFormat::Gptq { bits, group } => crate::gptq::load(ck, module, bits, group, n, k),
    }
}

fn norm_vec(ck: &Checkpoint, name: &str) -> Result<Vec<f32>, EngineError> {
    ck.f32(name)
}

impl Model {
    /// The caches the CUDA engine allocates for `slots` sequences of `max_len` tokens. They are larger than the
    /// plan's: K/V stay f32 at every position of every attention layer (sliding ones too) for the slot kernels,
    /// where the plan budgets bf16 and a ring of `window - 1` for sliding layers, so the CUDA admission counts this
    /// figure, not the plan's (`setup::admit_cuda`).
    pub fn cuda_cache_sizes(
        &self,
        slots: usize,
        max_len: usize,
    ) -> Result<CudaCacheSizes, EngineError> {
        let overflow = |what: &str| {
            EngineError::Unsupported(format!(
                "the {what} cache for {slots} sequences of {max_len} tokens overflows"
            ))
        };
        let d = self.attn_dims;
        let kv_len = [slots, max_len, d.kv_heads, d.head_dim]
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .ok_or_else(|| overflow("KV"))?;
        let (conv_len, state_len) = match self.gdn_dims {
            Some(g) => (
                g.conv_state_len()
                    .checked_mul(2 * slots)
                    .ok_or_else(|| overflow("DeltaNet"))?,
                g.state_len()
                    .checked_mul(slots)
                    .ok_or_else(|| overflow("DeltaNet"))?,
            ),
            None => (0, 0),
        };
        let mut bytes = 0u128;
        for &k in &self.spec.layers {
            bytes += match k {
                LayerKind::LinearAttention => 4 * (conv_len as u128 + state_len as u128),
                LayerKind::FullAttention | LayerKind::SlidingAttention => 8 * kv_len as u128,
            };
        }
        let bytes = u64::try_from(bytes).map_err(|_| overflow("whole"))?;
        Ok(CudaCacheSizes {
            kv_len,
            conv_len,
            state_len,
            bytes,
        })
    }

    /// Converts every tensor the forward pass reads into `mode`'s weight path. `progress(done, total)` is called
    /// after each layer.
    pub fn load(
        ck: &Checkpoint,
        mode: WeightMode,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Model, EngineError> {
        let spec = ck.spec.clone();
        let rt = &spec.runtime;
        if !ENGINE_MODEL_TYPES.contains(&spec.model_type.as_str()) {
            return Err(EngineError::Unsupported(format!(
                "model_type {} is planned but not run by the engine yet (it runs: {})",
                spec.model_type,
                ENGINE_MODEL_TYPES.join(", ")
            )));
        }
        if rt.attn_logit_softcap.is_some() {
            return Err(EngineError::Unsupported(
                "attention logit softcapping (Gemma 2) is not implemented by the attention kernels"
                    .into(),
            ));
        }
        let p = &rt.prefix;
        let hidden = usize_of(spec.hidden_size, "hidden_size")?;
        let attn_dims = AttnDims {
            q_heads: usize_of(spec.num_q_heads, "num_attention_heads")?,
            kv_heads: usize_of(spec.num_kv_heads, "num_key_value_heads")?,
            head_dim: usize_of(spec.head_dim, "head_dim")?,
        };
        let gdn_dims = spec.gdn.map(|g| GdnDims {
            key_heads: g.num_key_heads as usize,
            value_heads: g.num_value_heads as usize,
            key_dim: g.key_head_dim as usize,
            value_dim: g.value_head_dim as usize,
            conv_kernel: g.conv_kernel as usize,
        });
        let embed_info = ck.info(&rt.embedding)?;
        let table = match embed_info.dtype {
            safetensors::Dtype::BF16 => Table::Bf16(
                ck.bf16_bits(&rt.embedding)?
                    .into_iter()
                    .map(half::bf16::from_bits)
                    .collect(),
            ),
            _ => Table::F32(ck.f32(&rt.embedding)?),
        };
        ck.release(&rt.embedding);
        // Gemma multiplies by sqrt(hidden) rounded to the model dtype.
        let embed_scale = rt.embedding_scale.map(|s| match embed_info.dtype {
            safetensors::Dtype::BF16 => half::bf16::from_f64(s).to_f32(),
            safetensors::Dtype::F16 => half::f16::from_f64(s).to_f32(),
            _ => s as f32,
        });
        let rope_of = |kind: LayerKind| -> Result<Rope, EngineError> {
            let r = spec
                .rope
                .iter()
                .find(|r| r.layer_kind == kind)
                .ok_or_else(|| EngineError::Unsupported(format!("no RoPE for {kind:?} layers")))?;
            let rope = Rope {
                head_dim: attn_dims.head_dim,
                rotary_dim: r.rotary_dims as usize,
                theta: r.theta,
            };
            rope.validate("rope")
                .map_err(|e| EngineError::Kernel(e.to_string()))?;
            Ok(rope)
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        let mut inter = 0;
        for (i, &kind) in spec.layers.iter().enumerate() {
            let lp = format!("{p}.layers.{i}");
            let mixer = match kind {
                LayerKind::LinearAttention => {
                    let la = format!("{lp}.linear_attn");
                    let conv = ck.f32(&format!("{la}.conv1d.weight"))?;
                    Mixer::Gdn(Box::new(GdnLayer {
                        in_qkv: load_linear(ck, &format!("{la}.in_proj_qkv"), mode)?,
                        in_z: load_linear(ck, &format!("{la}.in_proj_z"), mode)?,
                        in_b: load_linear(ck, &format!("{la}.in_proj_b"), mode)?,
                        in_a: load_linear(ck, &format!("{la}.in_proj_a"), mode)?,
                        out: load_linear(ck, &format!("{la}.out_proj"), mode)?,
                        conv,
                        a_log: ck.f32(&format!("{la}.A_log"))?,
                        dt_bias: ck.f32(&format!("{la}.dt_bias"))?,
                        norm: ck.f32(&format!("{la}.norm.weight"))?,
                    }))
                }
                LayerKind::FullAttention | LayerKind::SlidingAttention => {
                    let sa = format!("{lp}.self_attn");
                    let opt = |n: String| -> Result<Option<Vec<f32>>, EngineError> {
                        if ck.has(&n) {
                            Ok(Some(ck.f32(&n)?))
                        } else {
                            Ok(None)
                        }
                    };
                    let (qkv, o) = if rt.output_gate == OutputGate::SigmoidPerHead {
                        (
                            Qkv::Fused {
                                w: load_linear(ck, &format!("{sa}.q_k_v_proj"), mode)?,
                                q_rows: attn_dims.q_heads * attn_dims.head_dim,
                            },
                            load_linear(ck, &format!("{sa}.out_proj"), mode)?,
                        )
                    } else {
                        (
                            {
                                let names =
                                    ["q_proj", "k_proj", "v_proj"].map(|m| format!("{sa}.{m}"));
                                match load_fused(ck, &names, mode)? {
                                    Some((w, rows)) => Qkv::Fused { w, q_rows: rows[0] },
                                    None => Qkv::Split {
                                        q: load_linear(ck, &names[0], mode)?,
                                        k: load_linear(ck, &names[1], mode)?,
                                        v: load_linear(ck, &names[2], mode)?,
                                    },
                                }
                            },
                            load_linear(ck, &format!("{sa}.o_proj"), mode)?,
                        )
                    };
                    let g_proj = if rt.output_gate == OutputGate::SigmoidPerHead {
                        Some(load_linear(ck, &format!("{sa}.g_proj"), mode)?)
                    } else {
                        None
                    };
                    let window = match kind {
                        LayerKind::SlidingAttention => Some(usize_of(
                            spec.sliding_window.unwrap_or(0),
                            "sliding_window",
                        )?),
                        _ => None,
                    };
                    Mixer::Attn(Box::new(AttnLayer {
                        qkv,
                        o,
                        biases: [
                            opt(format!("{sa}.q_proj.bias"))?,
                            opt(format!("{sa}.k_proj.bias"))?,
                            opt(format!("{sa}.v_proj.bias"))?,
                            opt(format!("{sa}.o_proj.bias"))?,
                        ],
                        g_proj,
                        q_norm: if rt.qk_norm {
                            Some(ck.f32(&format!("{sa}.q_norm.weight"))?)
                        } else {
                            None
                        },
                        k_norm: if rt.qk_norm {
                            Some(ck.f32(&format!("{sa}.k_norm.weight"))?)
                        } else {
                            None
                        },
                        rope: rope_of(kind)?,
                        window,
                    }))
                }
            };
            let names = ["gate_proj", "up_proj"].map(|m| format!("{lp}.mlp.{m}"));
            let gate_up = match load_fused(ck, &names, mode)? {
                Some((w, rows)) => {
                    inter = rows[0];
                    GateUp::Fused(w)
                }
                None => {
                    let gate = load_linear(ck, &names[0], mode)?;
                    inter = gate.n();
                    GateUp::Split {
                        gate,
                        up: load_linear(ck, &names[1], mode)?,
                    }
                }
            };
            layers.push(Layer {
                input_norm: norm_vec(ck, &format!("{lp}.input_layernorm.weight"))?,
                post_attn_norm: norm_vec(ck, &format!("{lp}.post_attention_layernorm.weight"))?,
                pre_ff_norm: if rt.sandwich_norms {
                    Some(norm_vec(
                        ck,
                        &format!("{lp}.pre_feedforward_layernorm.weight"),
                    )?)
                } else {
                    None
                },
                post_ff_norm: if rt.sandwich_norms {
                    Some(norm_vec(
                        ck,
                        &format!("{lp}.post_feedforward_layernorm.weight"),
                    )?)
                } else {
                    None
                },
                mixer,
                gate_up,
                down: load_linear(ck, &format!("{lp}.mlp.down_proj"), mode)?,
            });
            progress(i + 1, spec.layers.len());
        }
        let vocab = usize_of(spec.vocab_size, "vocab_size")?;
        let (embed, lm_head) = if spec.tie_word_embeddings {
            // The tied head reads the whole table every token, so it takes the plan's weight path; the table is
            // held once, as the head, and rows are gathered from it (dequantized when converted, as llama.cpp's
            // Q4_0 does). An untied embedding stays dense (the seed's opposite decision).
            let head = match (mode, table) {
                (WeightMode::Exact, Table::F32(w)) => Weight::f32(w, vocab, hidden),
                (WeightMode::Exact, Table::Bf16(w)) => {
                    Weight::bf16(w.into_iter().map(|b| b.to_bits()).collect(), vocab, hidden)
                }
                (_, table) => {
                    let (a8, group) = mode.int4();
                    Weight::int4_from_rows(vocab, hidden, group, a8, |row0, buf| {
                        let src_row = row0 * hidden;
                        match &table {
                            Table::F32(w) => buf.copy_from_slice(&w[src_row..src_row + buf.len()]),
                            Table::Bf16(w) => {
                                for (d, s) in buf.iter_mut().zip(&w[src_row..]) {
                                    *d = s.to_f32();
                                }
                            }
                        }
                        Ok(())
                    })
                }
            }
            .map_err(|e| EngineError::Kernel(format!("tied lm_head: {e}")))?;
            (Embedding::Head, head)
        } else {
            (Embedding::Table(table), load_linear(ck, "lm_head", mode)?)
        };
        let mut model = Model {
            final_norm: norm_vec(ck, &format!("{p}.norm.weight"))?,
            norm_form: match rt.norm {
                NormForm::Weight => NormWeight::Plain,
                NormForm::OnePlusWeight => NormWeight::OnePlus,
            },
            eps: rt.norm_eps as f32,
            spec,
            mode,
            embed,
            embed_scale,
            layers,
            lm_head,
            attn_dims,
            gdn_dims,
            inter,
            weight_bytes: 0,
            decode_read_bytes: 0,
            paths: Vec::new(),
            on_device: false,
            prefill_int8_from: None,
            int8_calls: AtomicU64::new(0),
        };
        let (held, read) = model.count_bytes();
        let mut paths: Vec<&'static str> = model.linears().iter().map(|w| w.path_name()).collect();
        paths.sort_unstable();
        paths.dedup();
        model.paths = paths;
        model.weight_bytes = held;
        model.decode_read_bytes = read;
        Ok(model)
    }

    fn linears(&self) -> Vec<&Weight> {
        let mut v = vec![&self.lm_head];
        for l in &self.layers {
            match &l.gate_up {
                GateUp::Fused(w) => v.push(w),
                GateUp::Split { gate, up } => v.extend([gate, up]),
            }
            v.push(&l.down);
            match &l.mixer {
                Mixer::Attn(a) => {
                    match &a.qkv {
                        Qkv::Split { q, k, v: vv } => v.extend([q, k, vv]),
                        Qkv::Fused { w, .. } => v.push(w),
                    }
                    v.push(&a.o);
                    if let Some(g) = &a.g_proj {
                        v.push(g);
                    }
                }
                Mixer::Gdn(g) => v.extend([&g.in_qkv, &g.in_z, &g.in_b, &g.in_a, &g.out]),
            }
        }
        v
    }

    fn count_bytes(&self) -> (u64, u64) {
        let lin: u64 = self.linears().iter().map(|w| w.bytes() as u64).sum();
        let (embed, row) = match &self.embed {
            Embedding::Table(Table::F32(w)) => (w.len() as u64 * 4, self.spec.hidden_size * 4),
            Embedding::Table(Table::Bf16(w)) => (w.len() as u64 * 2, self.spec.hidden_size * 2),
            // Held once, as the head (already counted); a gathered row is a row of it.
            Embedding::Head => (0, (self.lm_head.bytes() / self.lm_head.n().max(1)) as u64),
        };
        (lin + embed, lin + row)
    }

    /// Bytes of the FP8 and NVFP4 linears (what a second, checkpoint-layout copy on a GPU costs), plus the f32
    /// rows a GPU keeps beside the short NVFP4 ones ([`cuda::NVFP4_F32_ROWS_MAX_N`]).
    pub fn quantized_bytes(&self) -> u64 {
        self.linears()
            .iter()
            .map(|w| match w {
                Weight::Fp8Block { .. } => w.bytes() as u64,
                Weight::Nvfp4 { n, k, .. } if *n <= cuda::NVFP4_F32_ROWS_MAX_N => {
                    (w.bytes() + n * k * 4) as u64
                }
                Weight::Nvfp4 { .. } => w.bytes() as u64,
                _ => 0,
            })
            .sum()
    }

    /// Applies a plan's prompt precision (`weight_path.prefill`) for an engine of `slots` concurrent sequences: with
    /// int8, linear calls of `min_rows` or more rows take int8 activations in the W4A16 GEMM. Refused where it
    /// cannot mean what the plan says: on a model not loaded as W4A16 (`--exact` keeps the checkpoint's numerics),
    /// or with a threshold a decode step of `slots` sequences (one row each) would reach, since decode keeps int16.
    pub fn set_prefill(&mut self, p: Option<&Prefill>, slots: usize) -> Result<(), EngineError> {
        let Some(p) = p.filter(|p| p.activations == PrefillActivations::Int8) else {
            self.prefill_int8_from = None;
            return Ok(());
        };
        if self.mode != WeightMode::W4a16 {
            return Err(EngineError::Plan(format!(
                "the plan's weight_path.prefill asks for int8 prompt activations, which only the W4A16 path has; \
                 this model is loaded as {:?}{}",
                self.mode,
                if self.mode == WeightMode::Exact {
                    " (--exact computes the checkpoint's own numerics)"
                } else {
                    ""
                }
            )));
        }
        let from = usize::try_from(p.min_rows).unwrap_or(usize::MAX);
        if from <= slots {
            return Err(EngineError::Plan(format!(
                "weight_path.prefill.min_rows = {} is not above the engine's {slots} sequences: a decode step of \
                 {slots} rows would take int8 activations (decode keeps int16); plan it above max_num_seqs",
                p.min_rows
            )));
        }
        self.prefill_int8_from = Some(from);
        Ok(())
    }

    /// Linear calls so far that ran the W4A16 GEMM with int8 activations.
    pub fn int8_prefill_calls(&self) -> u64 {
        self.int8_calls.load(Ordering::Relaxed)
    }

    /// `y[m, n] = x[m, k] W^T` on the loaded weight path, with int8 activations where the plan's prompt
    /// precision says so (`m` at or above [`Model::set_prefill`]'s threshold).
    fn lin(&self, w: &Weight, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), EngineError> {
        let _t = profile::span(Op::Linear);
        let acts = match self.prefill_int8_from {
            Some(from) if m >= from => GemmActs::Int8,
            _ => GemmActs::Int16,
        };
        if w.linear_acts(x, m, acts, y).map_err(kerr)? == Some(GemmActs::Int8) {
            self.int8_calls.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The weight path names in use (`bf16`, `w4a16`, ...), each once.
    pub fn paths(&self) -> Vec<&'static str> {
        self.paths.clone()
    }

    pub fn vocab(&self) -> usize {
        self.spec.vocab_size as usize
    }

    fn hidden(&self) -> usize {
        self.spec.hidden_size as usize
    }

    fn norm(&self, x: &[f32], w: &[f32], out: &mut [f32]) -> Result<(), EngineError> {
        let _t = profile::span(Op::Small);
        ops::rmsnorm(x, w, self.norm_form, self.eps, out).map_err(kerr)
    }

    /// Runs `tokens` of the sequences in `batch` through the model and returns the logits of each sequence's last
    /// token (`[batch.len(), vocab]`). Each entry is `(cache slot, first position, tokens)`: one sequence's prompt
    /// from position 0 (a prefill: causal attention and the chunked DeltaNet over the tokens), one sequence's next
    /// chunk of a prompt after its cached prefix (the DeltaNet continues its state; attention runs each token over
    /// the cache, in order), or any number of sequences with one token each (a decode step).
    pub fn forward(
        &self,
        caches: &mut Caches,
        batch: &[Step<'_>],
    ) -> Result<Vec<f32>, EngineError> {
        if self.on_device {
            return Err(EngineError::Unsupported(
                "this model's weights were moved to a CUDA device; run it there".into(),
            ));
        }
        let prefill = batch.len() == 1 && batch[0].pos == 0 && batch[0].tokens.len() > 1;
        let chunk = batch.len() == 1 && batch[0].pos > 0 && batch[0].tokens.len() > 1;
        if !prefill && !chunk && batch.iter().any(|s| s.tokens.len() != 1) {
            return Err(EngineError::Unsupported(
                "a step is one sequence's prompt or chunk, or one token per sequence".into(),
            ));
        }
        // A chunk's attention is its tokens as consecutive decode steps of one sequence.
        let per_token: Vec<Step<'_>> = if chunk {
            let s = batch[0];
            (0..s.tokens.len())
                .map(|i| Step {
                    slot: s.slot,
                    pos: s.pos + i,
                    tokens: &s.tokens[i..i + 1],
                })
                .collect()
        } else {
            Vec::new()
        };
        let attn_batch: &[Step<'_>] = if chunk { &per_token } else { batch };
        let ids: Vec<u32> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let t = ids.len();
        let h = self.hidden();
        let mut x = vec![0.0f32; t * h];
        let t_embed = profile::span(Op::Embed);
        match &self.embed {
            Embedding::Table(Table::F32(w)) => {
                ops::embedding_gather(EmbeddingTable::F32(w), h, &ids, &mut x)
            }
            Embedding::Table(Table::Bf16(w)) => {
                ops::embedding_gather(EmbeddingTable::Bf16(w), h, &ids, &mut x)
            }
            Embedding::Head => ids
                .iter()
                .zip(x.chunks_exact_mut(h))
                .try_for_each(|(&id, row)| self.lm_head.row(id as usize, row)),
        }
        .map_err(kerr)?;
        if let Some(s) = self.embed_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        drop(t_embed);
        let positions: Vec<u32> = if prefill {
            (0..t as u32).collect()
        } else {
            attn_batch.iter().map(|s| s.pos as u32).collect()
        };
        let mut hbuf = vec![0.0f32; t * h];
        for (li, layer) in self.layers.iter().enumerate() {
            self.norm(&x, &layer.input_norm, &mut hbuf)?;
            let mut o = match &layer.mixer {
                Mixer::Attn(a) => {
                    self.attention(li, a, caches, attn_batch, prefill, &positions, &hbuf)?
                }
                Mixer::Gdn(g) => self.gdn(li, g, caches, batch, prefill || chunk, &hbuf)?,
            };
            if layer.pre_ff_norm.is_some() {
                let mut n = vec![0.0; o.len()];
                self.norm(&o, &layer.post_attn_norm, &mut n)?;
                o = n;
            }
            let t_add = profile::span(Op::Small);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            drop(t_add);
            let ff_norm = layer.pre_ff_norm.as_ref().unwrap_or(&layer.post_attn_norm);
            self.norm(&x, ff_norm, &mut hbuf)?;
            let mut m = self.mlp(layer, &hbuf, t)?;
            if let Some(w) = &layer.post_ff_norm {
                let mut n = vec![0.0; m.len()];
                self.norm(&m, w, &mut n)?;
                m = n;
            }
            let _t = profile::span(Op::Small);
            x.iter_mut().zip(&m).for_each(|(a, b)| *a += b);
        }
        // Logits of each sequence's last token only.
        let rows: Vec<usize> = if prefill || chunk {
            vec![t - 1]
        } else {
            (0..t).collect()
        };
        let mut last = Vec::with_capacity(rows.len() * h);
        for &r in &rows {
            last.extend_from_slice(&x[r * h..(r + 1) * h]);
        }
        let mut normed = vec![0.0; last.len()];
        self.norm(&last, &self.final_norm, &mut normed)?;
        let mut logits = vec![0.0f32; rows.len() * self.vocab()];
        self.lin(&self.lm_head, &normed, rows.len(), &mut logits)?;
        if let Some(cap) = self.spec.runtime.final_logit_softcap {
            backend::softcap(&mut logits, cap as f32);
        }
        Ok(logits)
    }

    fn mlp(&self, layer: &Layer, x: &[f32], t: usize) -> Result<Vec<f32>, EngineError> {
        let inter = self.inter;
        let gu = match &layer.gate_up {
            GateUp::Fused(w) => {
                let mut gu = vec![0.0; t * 2 * inter];
                self.lin(w, x, t, &mut gu)?;
                gu
            }
            GateUp::Split { gate, up } => {
                let mut g = vec![0.0; t * inter];
                let mut u = vec![0.0; t * inter];
                self.lin(gate, x, t, &mut g)?;
                self.lin(up, x, t, &mut u)?;
                let mut gu = Vec::with_capacity(2 * t * inter);
                for r in 0..t {
                    gu.extend_from_slice(&g[r * inter..(r + 1) * inter]);
                    gu.extend_from_slice(&u[r * inter..(r + 1) * inter]);
                }
                gu
            }
        };
        let mut act = vec![0.0; t * inter];
        let t_act = profile::span(Op::Small);
        match self.spec.runtime.activation {
            Activation::Silu => ops::silu_and_mul(&gu, inter, &mut act),
            Activation::GeluErf => ops::gelu_and_mul(&gu, inter, &mut act),
            Activation::GeluTanh => backend::gelu_tanh_and_mul(&gu, inter, &mut act),
        }
        .map_err(kerr)?;
        drop(t_act);
        let mut out = vec![0.0; t * self.hidden()];
        self.lin(&layer.down, &act, t, &mut out)?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        li: usize,
        a: &AttnLayer,
        caches: &mut Caches,
        batch: &[Step<'_>],
        prefill: bool,
        positions: &[u32],
        x: &[f32],
    ) -> Result<Vec<f32>, EngineError> {
        let d = self.attn_dims;
        let t = positions.len();
        let (qw, kvw) = (d.q_heads * d.head_dim, d.kv_heads * d.head_dim);
        let gated = self.spec.runtime.output_gate == OutputGate::SigmoidPerElement;
        let (mut q, mut k, mut v, gate) = match &a.qkv {
            Qkv::Split {
                q: wq,
                k: wk,
                v: wv,
            } => {
                let mut qg = vec![0.0; t * wq.n()];
                self.lin(wq, x, t, &mut qg)?;
                let mut k = vec![0.0; t * kvw];
                let mut v = vec![0.0; t * kvw];
                self.lin(wk, x, t, &mut k)?;
                self.lin(wv, x, t, &mut v)?;
                if gated {
                    let (q, g) = split_gate(&qg, d.head_dim);
                    (q, k, v, Some(g))
                } else {
                    (qg, k, v, None)
                }
            }
            Qkv::Fused { w, q_rows } => {
                let n = w.n();
                let mut all = vec![0.0; t * n];
                self.lin(w, x, t, &mut all)?;
                let (mut q, mut k, mut v) = (
                    Vec::with_capacity(t * qw),
                    Vec::with_capacity(t * kvw),
                    Vec::with_capacity(t * kvw),
                );
                for row in all.chunks_exact(n) {
                    let (qpart, kv) = row.split_at(*q_rows);
                    q.extend_from_slice(qpart);
                    k.extend_from_slice(&kv[..kvw]);
                    v.extend_from_slice(&kv[kvw..]);
                }
                if gated {
                    let (q, g) = split_gate(&q, d.head_dim);
                    (q, k, v, Some(g))
                } else {
                    (q, k, v, None)
                }
            }
        };
        for (buf, bias) in [
            (&mut q, &a.biases[0]),
            (&mut k, &a.biases[1]),
            (&mut v, &a.biases[2]),
        ] {
            if let Some(b) = bias {
                for row in buf.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                }
            }
        }
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            let mut tmp = vec![0.0; q.len()];
            self.norm(&q, qn, &mut tmp)?;
            q = tmp;
            let mut tmp = vec![0.0; k.len()];
            self.norm(&k, kn, &mut tmp)?;
            k = tmp;
        }
        let t_rope = profile::span(Op::Small);
        attention::rope_neox(&a.rope, d.q_heads, positions, &mut q).map_err(kerr)?;
        attention::rope_neox(&a.rope, d.kv_heads, positions, &mut k).map_err(kerr)?;
        drop(t_rope);
        let t_attn = profile::span(Op::Attention);
        let scale = self.spec.runtime.attn_scale as f32;
        let mut out = vec![0.0f32; t * qw];
        let mut c = caches.layer_mut(li)?;
        if prefill {
            attention::prefill(&d, scale, a.window, t, &q, &k, &v, &mut out).map_err(kerr)?;
            let slot = batch[0].slot;
            for p in 0..t {
                c.store(
                    &d,
                    slot,
                    p,
                    &k[p * kvw..(p + 1) * kvw],
                    &v[p * kvw..(p + 1) * kvw],
                    a.window,
                )?;
            }
        } else {
            for (b, s) in batch.iter().enumerate() {
                let (kr, vr) = (&k[b * kvw..(b + 1) * kvw], &v[b * kvw..(b + 1) * kvw]);
                let (qr, or) = (&q[b * qw..(b + 1) * qw], &mut out[b * qw..(b + 1) * qw]);
                match a.window {
                    None => {
                        c.store(&d, s.slot, s.pos, kr, vr, None)?;
                        let (kp, vp, page, table) = c.paged(s.slot)?;
                        let lens = [s.pos as u32 + 1];
                        let kv = PagedKv {
                            k_pages: kp,
                            v_pages: vp,
                            page_size: page,
                            block_table: table,
                            max_pages: table.len(),
                            lens: &lens,
                        };
                        attention::decode_paged(&d, scale, 1, qr, &kv, or).map_err(kerr)?;
                    }
                    Some(w) => {
                        let (kring, vring) = c.ring(s.slot)?;
                        let pos = [s.pos as u32];
                        // The current token's K/V in the ring's element type (the kernel reads one type per call).
                        let (kb, vb): (Vec<half::bf16>, Vec<half::bf16>) = match kring {
                            KvSlice::Bf16(_) => (
                                kr.iter().map(|&x| half::bf16::from_f32(x)).collect(),
                                vr.iter().map(|&x| half::bf16::from_f32(x)).collect(),
                            ),
                            KvSlice::F32(_) => (Vec::new(), Vec::new()),
                        };
                        let (k_cur, v_cur) = match kring {
                            KvSlice::Bf16(_) => (KvSlice::Bf16(&kb), KvSlice::Bf16(&vb)),
                            KvSlice::F32(_) => (KvSlice::F32(kr), KvSlice::F32(vr)),
                        };
                        let kv = RingKv {
                            k_ring: kring,
                            v_ring: vring,
                            window: w,
                            k_cur,
                            v_cur,
                            pos: &pos,
                        };
                        attention::decode_ring(&d, scale, 1, qr, &kv, or).map_err(kerr)?;
                        c.store(&d, s.slot, s.pos, kr, vr, Some(w))?;
                    }
                }
            }
        }
        drop(t_attn);
        if let Some(g) = gate {
            let _t = profile::span(Op::Small);
            backend::sigmoid_gate(&mut out, &g).map_err(kerr)?;
        }
        if let Some(gp) = &a.g_proj {
            let mut g = vec![0.0; t * d.q_heads];
            self.lin(gp, x, t, &mut g)?;
            backend::sigmoid_head_gate(&mut out, d.q_heads, &g).map_err(kerr)?;
        }
        let mut o = vec![0.0; t * self.hidden()];
        self.lin(&a.o, &out, t, &mut o)?;
        if let Some(b) = &a.biases[3] {
            for row in o.chunks_exact_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(x, y)| *x += y);
            }
        }
        Ok(o)
    }

    fn gdn(
        &self,
        li: usize,
        g: &GdnLayer,
        caches: &mut Caches,
        batch: &[Step<'_>],
        prefill: bool,
        x: &[f32],
    ) -> Result<Vec<f32>, EngineError> {
        let dims = self
            .gdn_dims
            .ok_or_else(|| EngineError::Unsupported("GDN layer without geometry".into()))?;
        let t = x.len() / self.hidden();
        let (cd, vw, hv) = (dims.conv_dim(), dims.value_width(), dims.value_heads);
        let mut qkv = vec![0.0; t * cd];
        let mut z = vec![0.0; t * vw];
        let mut b = vec![0.0; t * hv];
        let mut a = vec![0.0; t * hv];
        self.lin(&g.in_qkv, x, t, &mut qkv)?;
        self.lin(&g.in_z, x, t, &mut z)?;
        self.lin(&g.in_b, x, t, &mut b)?;
        self.lin(&g.in_a, x, t, &mut a)?;
        let w = GdnWeights {
            conv_weight: &g.conv,
            a_log: &g.a_log,
            dt_bias: &g.dt_bias,
            norm_weight: &g.norm,
            norm_eps: self.eps,
        };
        let mut out = vec![0.0; t * vw];
        let t_gdn = profile::span(Op::Gdn);
        let mut c = caches.layer_mut(li)?;
        if prefill {
            let (conv, state) = c.gdn(batch[0].slot)?;
            let inp = GdnInputs {
                qkv: &qkv,
                z: &z,
                a: &a,
                b: &b,
            };
            gdn::prefill(&dims, &w, t, &inp, conv, state, &mut out).map_err(kerr)?;
        } else {
            for (i, s) in batch.iter().enumerate() {
                let (conv, state) = c.gdn(s.slot)?;
                let inp = GdnInputs {
                    qkv: &qkv[i * cd..(i + 1) * cd],
                    z: &z[i * vw..(i + 1) * vw],
                    a: &a[i * hv..(i + 1) * hv],
                    b: &b[i * hv..(i + 1) * hv],
                };
                gdn::decode_step(
                    &dims,
                    &w,
                    1,
                    &inp,
                    conv,
                    state,
                    &mut out[i * vw..(i + 1) * vw],
                )
                .map_err(kerr)?;
            }
        }
        drop(t_gdn);
        let mut o = vec![0.0; t * self.hidden()];
        self.lin(&g.out, &out, t, &mut o)?;
        Ok(o)
    }
}

/// One sequence's part of a [`Model::forward`] call.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// The sequence's cache slot.
    pub slot: usize,
    /// Position of `tokens[0]` (tokens already in the cache).
    pub pos: usize,
    pub tokens: &'a [u32],
}

/// Splits a gated q projection's output (per head: `head_dim` query values, then `head_dim` gate values) into the
/// queries and the gates, each `[rows, heads, head_dim]`.
fn split_gate(qg: &[f32], head_dim: usize) -> (Vec<f32>, Vec<f32>) {
    let mut q = Vec::with_capacity(qg.len() / 2);
    let mut g = Vec::with_capacity(qg.len() / 2);
    for head in qg.chunks_exact(2 * head_dim) {
        q.extend_from_slice(&head[..head_dim]);
        g.extend_from_slice(&head[head_dim..]);
    }
    (q, g)
}

/// A linear call, timed as [`Op::Linear`] when profiling.
pub(crate) fn kerr(e: kernels::KernelError) -> EngineError {
    match e {
        kernels::KernelError::OutOfMemory(_) => EngineError::OutOfMemory(e.to_string()),
        _ => EngineError::Kernel(e.to_string()),
    }
}
