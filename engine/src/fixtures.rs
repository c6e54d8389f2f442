//! Tiny checkpoints with random weights, real tensor names and real storage formats, one per architecture and
//! format the engine runs: what the parity tests load (`engine/tests/fixtures/`, made by `cargo xtask fixtures`;
//! the golden outputs beside them come from `engine/tests/fixtures/make_golden.py` on transformers).
//!
//! Every tensor is generated from the planner's inventory of the fixture's own `config.json`, so a fixture has
//! exactly the tensors a real checkpoint of that architecture has. Generation is seeded: the same build writes the
//! same bytes.

use std::path::Path;

use planner::model::{parse_model, DType, ModelCard, NormForm, Role, SourceFile, StoredFormat};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::EngineError;

/// Storage of a fixture's linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    F32,
    Bf16,
    /// FP8 e4m3 with 128x128 block scales; everything else bf16.
    Fp8Block,
    /// modelopt mixed: the GDN q|k|v and z projections FP8 per tensor, every other layer linear NVFP4, lm_head bf16.
    Nvfp4,
    /// GPTQ 4-bit symmetric, group 32, inside the decoder layers; embedding bf16.
    Gptq,
}

/// One fixture: a directory name, a config and a build.
pub struct Fixture {
    pub name: &'static str,
    pub config: Value,
    pub build: Build,
}

/// Vocabulary of every fixture: 256 byte tokens, 3 special tokens, padded to a multiple of 16.
pub const VOCAB: u64 = 272;
/// Prompt length of the golden runs: longer than the sliding windows (8) and than one DeltaNet chunk (64).
pub const PROMPT_LEN: usize = 80;

fn dtype_name(b: Build) -> &'static str {
    match b {
        Build::F32 => "float32",
        _ => "bfloat16",
    }
}

/// Qwen3.5's DeltaNet heads are 128 wide, as in every released model: the CUDA DeltaNet kernels are built for
/// that size only, so the fixture runs the same kernels on the GPU as the real model does.
fn qwen3_5(build: Build) -> Value {
    let mut c = json!({
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "linear_num_key_heads": 1, "linear_num_value_heads": 2,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "full_attention_interval": 4,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "tie_word_embeddings": false,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 1, 1], "mrope_interleaved": true},
        "attention_bias": false, "bos_token_id": 256, "eos_token_id": 258,
        "dtype": dtype_name(build),
    });
    match build {
        Build::Fp8Block => {
            c["quantization_config"] = json!({
                "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]
            });
        }
        Build::Nvfp4 => {
            c["quantization_config"] = json!({
                "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "ignore": ["lm_head"]
            });
        }
        _ => {}
    }
    c
}

fn nvfp4_quant_config(layers: &[&str]) -> Value {
    let mut q = serde_json::Map::new();
    for (i, kind) in layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let mods: Vec<(String, &str)> = if *kind == "linear_attention" {
            vec![
                (format!("{p}.linear_attn.in_proj_qkv"), "FP8"),
                (format!("{p}.linear_attn.in_proj_z"), "FP8"),
                (format!("{p}.linear_attn.in_proj_b"), "NVFP4"),
                (format!("{p}.linear_attn.in_proj_a"), "NVFP4"),
                (format!("{p}.linear_attn.out_proj"), "NVFP4"),
            ]
        } else {
            ["q_proj", "k_proj", "v_proj", "o_proj"]
                .iter()
                .map(|m| (format!("{p}.self_attn.{m}"), "NVFP4"))
                .collect()
        };
        for (m, algo) in mods.into_iter().chain(
            ["gate_proj", "up_proj", "down_proj"]
                .iter()
                .map(|m| (format!("{p}.mlp.{m}"), "NVFP4")),
        ) {
            let v = if algo == "NVFP4" {
                json!({"quant_algo": "NVFP4", "group_size": 16})
            } else {
                json!({"quant_algo": "FP8"})
            };
            q.insert(m, v);
        }
    }
    json!({
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": null,
                         "exclude_modules": ["lm_head"], "quantized_layers": q}
    })
}

fn spark(build: Build) -> Value {
    let mut c = json!({
        "architectures": ["Spark2_5ForCausalLM"], "model_type": "spark2_5",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "sliding_window": 8, "hidden_act": "gelu", "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "max_position_embeddings": 1048576, "tie_word_embeddings": true,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
        },
        "bos_token_id": 256, "eos_token_id": 258, "torch_dtype": dtype_name(build),
    });
    if build == Build::Gptq {
        c["quantization_config"] = json!({
            "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": true, "desc_act": false,
            "checkpoint_format": "gptq"
        });
    }
    c
}

fn gemma3() -> Value {
    json!({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "sliding_window": 8, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "max_position_embeddings": 32768, "tie_word_embeddings": true,
        "query_pre_attn_scalar": 24, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "attn_logit_softcapping": null, "final_logit_softcapping": null,
        "bos_token_id": 256, "eos_token_id": 258, "torch_dtype": "bfloat16",
    })
}

fn dense(model_type: &str, arch: &str, build: Build) -> Value {
    json!({
        "architectures": [arch], "model_type": model_type,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "tie_word_embeddings": model_type == "llama",
        "rope_theta": 1000000.0, "attention_bias": false,
        "bos_token_id": 256, "eos_token_id": 258, "torch_dtype": dtype_name(build),
    })
}

/// Every fixture the parity tests run.
pub fn all() -> Vec<Fixture> {
    vec![
        Fixture {
            name: "qwen3-f32",
            config: dense("qwen3", "Qwen3ForCausalLM", Build::F32),
            build: Build::F32,
        },
        Fixture {
            name: "llama-bf16",
            config: dense("llama", "LlamaForCausalLM", Build::Bf16),
            build: Build::Bf16,
        },
        Fixture {
            name: "gemma3-bf16",
            config: gemma3(),
            build: Build::Bf16,
        },
        Fixture {
            name: "spark2_5-bf16",
            config: spark(Build::Bf16),
            build: Build::Bf16,
        },
        Fixture {
            name: "spark2_5-gptq",
            config: spark(Build::Gptq),
            build: Build::Gptq,
        },
        Fixture {
            name: "qwen3_5-f32",
            config: qwen3_5(Build::F32),
            build: Build::F32,
        },
        Fixture {
            name: "qwen3_5-fp8",
            config: qwen3_5(Build::Fp8Block),
            build: Build::Fp8Block,
        },
        Fixture {
            name: "qwen3_5-nvfp4",
            config: qwen3_5(Build::Nvfp4),
            build: Build::Nvfp4,
        },
    ]
}

/// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest move past 255.
fn byte_char(b: u8) -> char {
    let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable {
        return char::from(b);
    }
    let mut n = 0u32;
    for x in 0..b {
        let p = (33..=126).contains(&x) || (161..=172).contains(&x) || x >= 174;
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap_or('?')
}

/// A byte-level BPE tokenizer without merges: one token per byte, plus the three special tokens.
pub fn tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    let special = |id: u32, s: &str| {
        json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(256, "<|endoftext|>"), special(257, "<|im_start|>"), special(258, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

/// A small ChatML template (Qwen's turn markers, without tools or thinking) over the tokenizer's special tokens.
pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// `tokenizer_config.json`: the special tokens and the chat template, as transformers writes them.
pub fn tokenizer_config_json() -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    })
}

/// The golden prompt: `PROMPT_LEN` byte tokens from a fixed seed.
pub fn prompt() -> Vec<u32> {
    let mut r = ChaCha8Rng::seed_from_u64(7);
    (0..PROMPT_LEN).map(|_| r.gen_range(0..256)).collect()
}

struct Tensors {
    list: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>,
}

impl Tensors {
    /// A scalar f32 (modelopt's per-tensor scales).
    fn scalar(&mut self, name: String, v: f32) {
        self.push(name, safetensors::Dtype::F32, &[], v.to_le_bytes().to_vec());
    }

    /// Views of every tensor, for `safetensors::serialize`.
    fn views(&self) -> Result<Vec<(String, safetensors::tensor::TensorView<'_>)>, EngineError> {
        self.list
            .iter()
            .map(|(n, d, s, b)| {
                safetensors::tensor::TensorView::new(*d, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| EngineError::Checkpoint(format!("{n}: {e}")))
            })
            .collect()
    }

    fn push(&mut self, name: String, dtype: safetensors::Dtype, shape: &[u64], data: Vec<u8>) {
        self.list.push((
            name,
            dtype,
            shape.iter().map(|&d| d as usize).collect(),
            data,
        ));
    }
}

fn normal(r: &mut ChaCha8Rng, std: f32) -> f32 {
    // Box-Muller: enough for test weights.
    let u1: f32 = r.gen_range(1e-7..1.0);
    let u2: f32 = r.gen_range(0.0..1.0);
    std * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
}

fn float_bytes(v: &[f32], dtype: DType) -> (safetensors::Dtype, Vec<u8>) {
    match dtype {
        DType::F32 => (
            safetensors::Dtype::F32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        DType::F16 => (
            safetensors::Dtype::F16,
            v.iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
        ),
        _ => (
            safetensors::Dtype::BF16,
            v.iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
        ),
    }
}

/// Writes one linear module's tensors in `format`.
fn linear(
    t: &mut Tensors,
    r: &mut ChaCha8Rng,
    module: &str,
    n: usize,
    k: usize,
    format: StoredFormat,
) {
    // Output projections three times larger, so that the layers and not the token's own embedding dominate the
    // residual stream: with tied embeddings a random model would otherwise just repeat its last input token.
    let out_proj = ["o_proj", "out_proj", "down_proj"]
        .iter()
        .any(|m| module.ends_with(m));
    let std = if out_proj { 3.0 } else { 1.0 } / (k as f32).sqrt();
    let w: Vec<f32> = (0..n * k).map(|_| normal(r, std)).collect();
    let shape = [n as u64, k as u64];
    match format {
        StoredFormat::Dense { dtype } => {
            let (d, b) = float_bytes(&w, dtype);
            t.push(format!("{module}.weight"), d, &shape, b);
        }
        StoredFormat::Fp8Block { block: [b0, b1] } => {
            let (b0, b1) = (b0 as usize, b1 as usize);
            let (rn, rk) = (n.div_ceil(b0), k.div_ceil(b1));
            let mut scale = vec![0.0f32; rn * rk];
            for i in 0..n {
                for j in 0..k {
                    let s = &mut scale[(i / b0) * rk + j / b1];
                    *s = s.max(w[i * k + j].abs() / 448.0);
                }
            }
            let codes: Vec<u8> = (0..n * k)
                .map(|x| {
                    let s = scale[(x / k / b0) * rk + (x % k) / b1];
                    kernels::formats::f32_to_e4m3(if s > 0.0 { w[x] / s } else { 0.0 })
                })
                .collect();
            t.push(
                format!("{module}.weight"),
                safetensors::Dtype::F8_E4M3,
                &shape,
                codes,
            );
            let (d, b) = float_bytes(&scale, DType::F32);
            t.push(
                format!("{module}.weight_scale_inv"),
                d,
                &[rn as u64, rk as u64],
                b,
            );
        }
        StoredFormat::Fp8Tensor => {
            let s = w.iter().fold(0.0f32, |a, x| a.max(x.abs())) / 448.0;
            let codes: Vec<u8> = w
                .iter()
                .map(|x| kernels::formats::f32_to_e4m3(x / s))
                .collect();
            t.push(
                format!("{module}.weight"),
                safetensors::Dtype::F8_E4M3,
                &shape,
                codes,
            );
            t.scalar(format!("{module}.weight_scale"), s);
            t.scalar(format!("{module}.input_scale"), 1.0);
        }
        StoredFormat::Nvfp4 { group } => {
            let g = group as usize;
            let amax = w.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            let global = amax / (448.0 * 6.0);
            let mut scales = vec![0u8; n * k / g];
            let mut packed = vec![0u8; n * k / 2];
            for row in 0..n {
                for grp in 0..k / g {
                    let vals = &w[row * k + grp * g..row * k + (grp + 1) * g];
                    let gmax = vals.iter().fold(0.0f32, |a, x| a.max(x.abs()));
                    let sc = kernels::formats::f32_to_e4m3(gmax / 6.0 / global);
                    scales[row * (k / g) + grp] = sc;
                    let eff = kernels::formats::e4m3_to_f32(sc) * global;
                    for (j, &v) in vals.iter().enumerate() {
                        let code =
                            kernels::formats::f32_to_e2m1(if eff > 0.0 { v / eff } else { 0.0 });
                        let idx = row * k + grp * g + j;
                        packed[idx / 2] |= if idx.is_multiple_of(2) {
                            code
                        } else {
                            code << 4
                        };
                    }
                }
            }
            t.push(
                format!("{module}.weight"),
                safetensors::Dtype::U8,
                &[n as u64, (k / 2) as u64],
                packed,
            );
            t.push(
                format!("{module}.weight_scale"),
                safetensors::Dtype::F8_E4M3,
                &[n as u64, (k / g) as u64],
                scales,
            );
            t.scalar(format!("{module}.weight_scale_2"), global);
            t.scalar(format!("{module}.input_scale"), 1.0);
        }
        StoredFormat::Gptq { bits: _, group } => {
            let g = group as usize;
            let groups = k.div_ceil(g);
            let mut scales = vec![0.0f32; groups * n];
            let mut qweight = vec![0u32; k.div_ceil(8) * n];
            for j in 0..n {
                for grp in 0..groups {
                    let gmax = (grp * g..((grp + 1) * g).min(k))
                        .fold(0.0f32, |a, i| a.max(w[j * k + i].abs()));
                    // Round the scale to f16 first, as the checkpoint stores it.
                    let s = half::f16::from_f32(gmax / 7.0).to_f32();
                    scales[grp * n + j] = s;
                    for i in grp * g..((grp + 1) * g).min(k) {
                        let q = if s > 0.0 {
                            (w[j * k + i] / s).round().clamp(-8.0, 7.0) + 8.0
                        } else {
                            8.0
                        };
                        qweight[(i / 8) * n + j] |= (q as u32) << (4 * (i % 8));
                    }
                }
            }
            // AutoGPTQ v1 stores the zero point minus one: 7 for the symmetric 8.
            let qzeros = vec![0x7777_7777u32; groups * n.div_ceil(8)];
            let g_idx: Vec<i32> = (0..k).map(|i| (i / g) as i32).collect();
            let le = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            t.push(
                format!("{module}.qweight"),
                safetensors::Dtype::I32,
                &[k.div_ceil(8) as u64, n as u64],
                le(&qweight),
            );
            t.push(
                format!("{module}.qzeros"),
                safetensors::Dtype::I32,
                &[groups as u64, n.div_ceil(8) as u64],
                le(&qzeros),
            );
            let (d, b) = float_bytes(&scales, DType::F16);
            t.push(format!("{module}.scales"), d, &[groups as u64, n as u64], b);
            t.push(
                format!("{module}.g_idx"),
                safetensors::Dtype::I32,
                &[k as u64],
                g_idx.iter().flat_map(|x| x.to_le_bytes()).collect(),
            );
        }
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| EngineError::io(path, e))
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s.into_bytes()
}

/// Random tensors for every entry of `spec`'s inventory, in the stored format of each linear module.
fn random_tensors(spec: &planner::model::ModelSpec, seed: u64) -> Tensors {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let mut t = Tensors { list: Vec::new() };
    let linear_names: std::collections::HashSet<String> = spec
        .runtime
        .linears
        .iter()
        .map(|l| l.module.clone())
        .collect();
    for l in &spec.runtime.linears {
        linear(
            &mut t,
            &mut r,
            &l.module,
            l.out_features as usize,
            l.in_features as usize,
            l.format,
        );
    }
    for e in &spec.inventory {
        let module = e.name.rsplit_once('.').map(|(m, _)| m).unwrap_or("");
        if linear_names.contains(module) {
            continue;
        }
        let vals = small_values(spec, e, &mut r);
        let (d, b) = float_bytes(&vals, e.dtype);
        t.push(e.name.clone(), d, &e.shape, b);
    }
    t
}

/// Writes a random-weight checkpoint with the geometry of `config_text` (a model card's `config.json`, e.g. a real
/// model's) into `out`, with a byte-level tokenizer padded to the card's vocabulary: what the speed benchmarks load.
/// Never committed: a 1.7B model is 3.4 GB.
pub fn write_random_checkpoint(
    config_text: &str,
    out: &Path,
    seed: u64,
) -> Result<u64, EngineError> {
    std::fs::create_dir_all(out).map_err(|e| EngineError::io(out, e))?;
    let card = ModelCard {
        id: "random".into(),
        config: SourceFile {
            path: "config.json".into(),
            text: config_text.to_string(),
        },
        quant_config: None,
    };
    let spec = parse_model(&card).map_err(|e| EngineError::Model(Box::new(e)))?;
    let t = random_tensors(&spec, seed);
    let views = t.views()?;
    let path = out.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| EngineError::Checkpoint(format!("{}: {e}", path.display())))?;
    write_file(&out.join("config.json"), config_text.as_bytes())?;
    write_tokenizer(out, spec.vocab_size)?;
    Ok(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0))
}

/// Writes a byte-level tokenizer padded to `vocab` into `out/tokenizer.json`.
pub(crate) fn write_tokenizer(out: &Path, vocab: u64) -> Result<(), EngineError> {
    let mut tok = tokenizer_json();
    if let Some(v) = tok["model"]["vocab"].as_object_mut() {
        // Filler entries up to the card's vocabulary, so converters that check the size accept it, and one merge
        // (llama.cpp refuses a BPE vocabulary without merges).
        v.insert("ab".into(), json!(259));
        for id in 260..vocab {
            v.insert(format!("<filler_{id}>"), json!(id));
        }
    }
    tok["model"]["merges"] = json!(["a b"]);
    write_file(&out.join("tokenizer.json"), &pretty(&tok))
}

/// Writes `fx` into `dir/<name>/`: config(s), tokenizer, generation config and `model.safetensors`.
pub fn write(fx: &Fixture, dir: &Path) -> Result<(), EngineError> {
    let out = dir.join(fx.name);
    std::fs::create_dir_all(&out).map_err(|e| EngineError::io(&out, e))?;
    let config_text = String::from_utf8(pretty(&fx.config)).unwrap_or_default();
    let quant = (fx.build == Build::Nvfp4).then(|| {
        let kinds: Vec<&str> = fx.config["layer_types"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        nvfp4_quant_config(&kinds)
    });
    let card = ModelCard {
        id: fx.name.into(),
        config: SourceFile {
            path: format!("{}/config.json", fx.name),
            text: config_text.clone(),
        },
        quant_config: quant.as_ref().map(|q| SourceFile {
            path: format!("{}/hf_quant_config.json", fx.name),
            text: String::from_utf8(pretty(q)).unwrap_or_default(),
        }),
    };
    let spec = parse_model(&card).map_err(|e| EngineError::Model(Box::new(e)))?;
    let seed = fx
        .name
        .bytes()
        .fold(0u64, |a, b| a.wrapping_mul(131).wrapping_add(u64::from(b)));
    let t = random_tensors(&spec, seed);
    let views = t.views()?;
    let bytes = safetensors::serialize(views, None)
        .map_err(|e| EngineError::Checkpoint(format!("serializing {}: {e}", fx.name)))?;
    write_file(&out.join("model.safetensors"), &bytes)?;
    write_file(&out.join("config.json"), config_text.as_bytes())?;
    if let Some(q) = &quant {
        write_file(&out.join("hf_quant_config.json"), &pretty(q))?;
    }
    write_file(&out.join("tokenizer.json"), &pretty(&tokenizer_json()))?;
    write_file(
        &out.join("tokenizer_config.json"),
        &pretty(&tokenizer_config_json()),
    )?;
    write_file(&out.join("prompt.json"), &pretty(&json!({"ids": prompt()})))?;
    write_file(
        &out.join("generation_config.json"),
        &pretty(&json!({"bos_token_id": 256, "eos_token_id": [258], "do_sample": false})),
    )?;
    Ok(())
}

/// Values of a tensor that is not a linear module's: the embedding, norms, DeltaNet decay, bias and conv weights.
fn small_values(
    spec: &planner::model::ModelSpec,
    e: &planner::model::TensorEntry,
    r: &mut ChaCha8Rng,
) -> Vec<f32> {
    let n: usize = e.shape.iter().product::<u64>() as usize;
    let leaf = e.name.rsplit('.').next().unwrap_or("");
    if e.role == Role::Embedding {
        // Gemma scales the embedding by sqrt(hidden); its table is that much smaller.
        let std = spec.runtime.embedding_scale.map_or(1.0, |s| 1.0 / s as f32);
        (0..n).map(|_| normal(r, std)).collect()
    } else if e.name.ends_with("A_log") {
        (0..n).map(|_| r.gen_range(1.0f32..16.0).ln()).collect()
    } else if e.name.ends_with("dt_bias") {
        (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
    } else if e.name.contains("conv1d") {
        (0..n).map(|_| normal(r, 0.5)).collect()
    } else if leaf == "weight" && e.name.contains("norm") {
        // The GDN gated norm is always `w`; the layer norms follow the family's form.
        let centred =
            spec.runtime.norm == NormForm::OnePlusWeight && !e.name.contains("linear_attn.norm");
        // Gemma's norms after the attention and the MLP set their outputs' scale: 3x, as above.
        let post = spec.runtime.sandwich_norms
            && (e.name.contains("post_attention_layernorm")
                || e.name.contains("post_feedforward_layernorm"));
        let centre = match (centred, post) {
            (true, true) => 2.0,
            (true, false) => 0.0,
            (false, _) => 1.0,
        };
        (0..n).map(|_| centre + normal(r, 0.1)).collect()
    } else {
        (0..n).map(|_| normal(r, 0.1)).collect()
    }
}

/// [`small_values`] of `e` as its stored little-endian bytes (what [`crate::bench_checkpoint`] writes for the small
/// tensors; a small linear weight gets the fixtures' `1/sqrt(k)` scale).
pub(crate) fn small_tensor_bytes(
    spec: &planner::model::ModelSpec,
    e: &planner::model::TensorEntry,
    seed: u64,
) -> Vec<u8> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let vals = if matches!(e.role, Role::LayerWeight | Role::LmHead) {
        let k = e.shape.last().copied().unwrap_or(1).max(1) as f32;
        let n: usize = e.shape.iter().product::<u64>() as usize;
        (0..n).map(|_| normal(&mut r, 1.0 / k.sqrt())).collect()
    } else {
        small_values(spec, e, &mut r)
    };
    float_bytes(&vals, e.dtype).1
}
