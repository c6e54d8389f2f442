//! How each linear module of a checkpoint is stored, read from its quantization metadata.
//!
//! Three layouts are modelled, each as the real exporters write it (BRIEF §3 "Formats"):
//! - FP8 block (`quant_method: "fp8"`, Hugging Face fine-grained FP8): `weight` e4m3 `[out, in]` plus
//!   `weight_scale_inv` f32 `[ceil(out/b0), ceil(in/b1)]`; modules named in `modules_to_not_convert` stay in the
//!   model dtype.
//! - modelopt (`quant_method: "modelopt"` and/or `hf_quant_config.json`): NVFP4 `weight` u8 `[out, in/2]`,
//!   `weight_scale` e4m3 `[out, in/16]`, `weight_scale_2` and `input_scale` f32 scalars; FP8 modules carry per-tensor
//!   `weight_scale` and `input_scale`. A `MIXED_PRECISION` export lists every quantized module with its algorithm in
//!   `quantized_layers`; anything unlisted, or matched by `exclude_modules`/`ignore`, stays in the model dtype.
//! - GPTQ (`quant_method: "gptq"`): `qweight` int32 `[in*bits/32, out]`, `qzeros` int32 `[in/g, out*bits/32]`,
//!   `scales` f16 `[in/g, out]`, `g_idx` int32 `[in]`, on decoder-layer linears only (the head and embeddings stay
//!   unquantized, as GPTQ exporters leave them).

use std::collections::HashMap;

use super::config::{Doc, Field, Obj};
use super::error::ModelError;
use super::json::Kind;
use super::runtime::StoredFormat;
use super::{DType, Quantization};

/// Storage of one linear module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Dense(DType),
    Fp8Block { block: [u32; 2] },
    Fp8Tensor,
    Nvfp4 { group: u32 },
    Gptq { bits: u32, group: u32 },
}

impl Format {
    /// The public form of this storage, as [`super::Runtime::linears`] carries it.
    pub(crate) fn stored(self) -> StoredFormat {
        match self {
            Format::Dense(dtype) => StoredFormat::Dense { dtype },
            Format::Fp8Block { block } => StoredFormat::Fp8Block { block },
            Format::Fp8Tensor => StoredFormat::Fp8Tensor,
            Format::Nvfp4 { group } => StoredFormat::Nvfp4 { group },
            Format::Gptq { bits, group } => StoredFormat::Gptq { bits, group },
        }
    }
}

#[derive(Debug, Clone)]
enum Rule {
    None,
    Fp8Block {
        block: [u32; 2],
        keep: Vec<String>,
    },
    Modelopt {
        default: Option<Format>,
        exclude: Vec<String>,
        /// `quantized_layers`: exact module names (modelopt writes one entry per module, ~500 for a 64-layer
        /// model, so they are looked up in a map rather than scanned per module).
        listed: HashMap<String, Format>,
        /// Any `quantized_layers` keys written as globs, matched in order.
        listed_globs: Vec<(String, Format)>,
    },
    Gptq {
        bits: u32,
        group: u32,
        only: Option<Vec<String>>,
        keep: Vec<String>,
    },
}

/// The checkpoint's quantization: the public summary plus the per-module rule.
#[derive(Debug, Clone)]
pub(crate) struct QuantScheme {
    pub(crate) public: Quantization,
    /// The unquantized dtype (`torch_dtype`): norms, embeddings and excluded modules are stored in it.
    pub(crate) base: DType,
    rule: Rule,
}

impl QuantScheme {
    /// The storage format of linear module `module` (its name without `.weight`). `in_layer` is true for modules
    /// inside a decoder layer, the only ones GPTQ exporters quantize.
    pub(crate) fn format_of(&self, module: &str, in_layer: bool) -> Format {
        let dense = Format::Dense(self.base);
        match &self.rule {
            Rule::None => dense,
            Rule::Fp8Block { block, keep } => {
                if matches_any(keep, module) {
                    dense
                } else {
                    Format::Fp8Block { block: *block }
                }
            }
            Rule::Modelopt {
                default,
                exclude,
                listed,
                listed_globs,
            } => {
                if matches_any(exclude, module) {
                    return dense;
                }
                if let Some(f) = listed.get(module) {
                    return *f;
                }
                if let Some((_, f)) = listed_globs
                    .iter()
                    .find(|(p, _)| pattern_matches(p, module))
                {
                    return *f;
                }
                default.unwrap_or(dense)
            }
            Rule::Gptq {
                bits,
                group,
                only,
                keep,
            } => {
                let chosen = match only {
                    Some(list) => matches_any(list, module),
                    None => true,
                };
                if in_layer && chosen && !matches_any(keep, module) {
                    Format::Gptq {
                        bits: *bits,
                        group: *group,
                    }
                } else {
                    dense
                }
            }
        }
    }
}

/// Reads the model dtype and the quantization metadata. `text` is where the geometry lives (the nested
/// `text_config` for multimodal configs); dtype is looked up there first, then at the top level.
pub(crate) fn parse_quant(
    root: &Obj<'_>,
    text: &Obj<'_>,
    hf_quant: Option<&Doc<'_>>,
) -> Result<QuantScheme, ModelError> {
    let has_dtype = |o: &Obj<'_>| o.has("dtype") || o.has("torch_dtype");
    let base = if has_dtype(text) || !has_dtype(root) {
        base_dtype(text)?
    } else {
        base_dtype(root)?
    };
    let qc = root.opt_obj("quantization_config")?;
    let rule = match &qc {
        None => match hf_quant {
            Some(_) => modelopt(None, hf_quant)?,
            None => Rule::None,
        },
        Some(q) => {
            let method_f = q.require("quant_method")?;
            let method = method_f.str()?.to_ascii_lowercase();
            match method.as_str() {
                "modelopt" => modelopt(Some(q), hf_quant)?,
                "fp8" => Rule::Fp8Block {
                    block: block_size(q)?,
                    keep: opt_strings(q, "modules_to_not_convert")?,
                },
                "gptq" => gptq(q)?,
                _ => {
                    return Err(root.doc.quantization(
                        method_f.span(),
                        format!("quant_method `{method}` is not one of fp8, modelopt, gptq"),
                    ))
                }
            }
        }
    };
    let public = match &rule {
        Rule::None => Quantization::None { dtype: base },
        Rule::Fp8Block { block, .. } => Quantization::Fp8Block { block: *block },
        Rule::Modelopt {
            exclude,
            default,
            listed,
            listed_globs,
        } => {
            let group_size = default
                .iter()
                .chain(listed.values())
                .chain(listed_globs.iter().map(|(_, f)| f))
                .find_map(|f| match f {
                    Format::Nvfp4 { group } => Some(*group),
                    _ => None,
                })
                .unwrap_or(16);
            Quantization::Nvfp4 {
                group_size,
                exclude_modules: exclude.clone(),
            }
        }
        Rule::Gptq { bits, group, .. } => {
            let sym = match &qc {
                Some(q) => q.bool_or("sym", true)?,
                None => true,
            };
            Quantization::Gptq {
                bits: *bits,
                group_size: *group,
                sym,
            }
        }
    };
    Ok(QuantScheme { public, base, rule })
}

fn gptq(q: &Obj<'_>) -> Result<Rule, ModelError> {
    let bits_f = q.require("bits")?;
    let bits = bits_f.count()?;
    if bits != 4 {
        return Err(bits_f.invalid("4 (only 4-bit GPTQ is modelled)"));
    }
    let group_f = q.require("group_size")?;
    // GPTQ writes -1 for "one group per column"; the planner needs a finite group to size the scales.
    let group = match &group_f.node.kind {
        Kind::Number(raw) if raw.starts_with('-') => {
            return Err(group_f.invalid("a positive group size (per-channel -1 is not modelled)"))
        }
        _ => group_f.count()?,
    };
    // `modules_in_block_to_quantize` is a list of lists of module suffixes (optimum's layout); a flat list is read
    // the same way.
    let only = match q.field("modules_in_block_to_quantize") {
        Some(f) => {
            let mut names = Vec::new();
            for group in f.items()? {
                match &group.node.kind {
                    Kind::Array(_) => names.extend(group.strings()?),
                    _ => names.push(group.str()?.to_string()),
                }
            }
            Some(names)
        }
        None => None,
    };
    Ok(Rule::Gptq {
        bits: to_u32(bits),
        group: to_u32(group),
        only,
        keep: opt_strings(q, "modules_to_not_convert")?,
    })
}

fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn base_dtype(o: &Obj<'_>) -> Result<DType, ModelError> {
    // transformers 5 writes `dtype`; earlier versions `torch_dtype`.
    let f = match o.field("dtype") {
        Some(f) => f,
        None => o.require("torch_dtype")?,
    };
    match f.str()? {
        "bfloat16" => Ok(DType::Bf16),
        "float16" => Ok(DType::F16),
        "float32" => Ok(DType::F32),
        _ => Err(f.invalid("one of bfloat16, float16, float32")),
    }
}

fn block_size(q: &Obj<'_>) -> Result<[u32; 2], ModelError> {
    let f = q.require("weight_block_size")?;
    let items = f.items()?;
    if items.len() != 2 {
        return Err(f.invalid("two block dimensions, e.g. [128, 128]"));
    }
    let a = to_u32(items[0].count()?);
    let b = to_u32(items[1].count()?);
    Ok([a, b])
}

fn opt_strings(q: &Obj<'_>, key: &str) -> Result<Vec<String>, ModelError> {
    q.field(key).map_or(Ok(Vec::new()), |f| f.strings())
}

/// modelopt metadata: `hf_quant_config.json`'s `quantization` object is authoritative when present (vLLM reads it
/// the same way); otherwise the fields inside `config.json`'s `quantization_config`.
fn modelopt(qc: Option<&Obj<'_>>, hf_quant: Option<&Doc<'_>>) -> Result<Rule, ModelError> {
    let hq_root;
    let q: Obj<'_> = match hf_quant {
        Some(doc) => {
            hq_root = doc.root();
            hq_root.require("quantization")?.obj()?
        }
        None => match qc {
            Some(q) => q.clone(),
            None => return Ok(Rule::None),
        },
    };
    let algo_f = q.require("quant_algo")?;
    let group = match q.field("group_size") {
        Some(f) => to_u32(f.count()?),
        None => 16,
    };
    let algo = |name: &str, f: &Field<'_>| -> Result<Format, ModelError> {
        match name.to_ascii_uppercase().as_str() {
            "NVFP4" => Ok(Format::Nvfp4 { group }),
            "FP8" => Ok(Format::Fp8Tensor),
            other => Err(f.doc.quantization(
                f.span(),
                format!("modelopt quant_algo `{other}` is not NVFP4, FP8 or MIXED_PRECISION"),
            )),
        }
    };
    let mut exclude = Vec::new();
    for key in ["exclude_modules", "ignore"] {
        exclude.extend(opt_strings(&q, key)?);
    }
    // A config.json `ignore` list beside an hf_quant_config.json is honoured too.
    if hf_quant.is_some() {
        if let Some(c) = qc {
            for key in ["exclude_modules", "ignore"] {
                for s in opt_strings(c, key)? {
                    if !exclude.contains(&s) {
                        exclude.push(s);
                    }
                }
            }
        }
    }
    let algo_name = algo_f.str()?;
    if algo_name.eq_ignore_ascii_case("MIXED_PRECISION") {
        if hf_quant.is_none() && !q.has("quantized_layers") {
            return Err(q.doc.quantization(
                algo_f.span(),
                "MIXED_PRECISION lists its modules in hf_quant_config.json, which the card does not include".into(),
            ));
        }
        let layers = q.require("quantized_layers")?;
        let layers_obj = layers.obj()?;
        let Kind::Object(members) = &layers_obj.node.kind else {
            return Err(layers.invalid("an object of module -> {quant_algo}"));
        };
        let mut listed = HashMap::with_capacity(members.len());
        let mut listed_globs = Vec::new();
        for m in members {
            let entry = layers_obj.require(&m.key)?.obj()?;
            let a = entry.require("quant_algo")?;
            let g = match entry.field("group_size") {
                Some(f) => to_u32(f.count()?),
                None => group,
            };
            let fmt = match algo(a.str()?, &a)? {
                Format::Nvfp4 { .. } => Format::Nvfp4 { group: g },
                other => other,
            };
            if m.key.contains('*') || m.key.contains('?') {
                listed_globs.push((m.key.clone(), fmt));
            } else {
                listed.insert(m.key.clone(), fmt);
            }
        }
        require_nvfp4(
            &algo_f,
            listed.values().chain(listed_globs.iter().map(|(_, f)| f)),
        )?;
        Ok(Rule::Modelopt {
            default: None,
            exclude,
            listed,
            listed_globs,
        })
    } else {
        let default = algo(algo_name, &algo_f)?;
        require_nvfp4(&algo_f, std::iter::once(&default))?;
        Ok(Rule::Modelopt {
            default: Some(default),
            exclude,
            listed: HashMap::new(),
            listed_globs: Vec::new(),
        })
    }
}

/// The public [`Quantization`] summary has no per-tensor-FP8-only modelopt variant (plans key the weight path on
/// NVFP4 for modelopt checkpoints), so a modelopt export without a single NVFP4 module is refused rather than
/// mislabelled.
fn require_nvfp4<'f>(
    algo_f: &Field<'_>,
    mut formats: impl Iterator<Item = &'f Format>,
) -> Result<(), ModelError> {
    if formats.any(|f| matches!(f, Format::Nvfp4 { .. })) {
        Ok(())
    } else {
        Err(algo_f.doc.quantization(
            algo_f.span(),
            "modelopt checkpoints without NVFP4 modules (FP8 only) are not modelled".into(),
        ))
    }
}

fn matches_any(patterns: &[String], module: &str) -> bool {
    patterns.iter().any(|p| pattern_matches(p, module))
}

/// Module-name matching as the exporters mean it: a pattern with `*`/`?` is a glob over the whole name (modelopt's
/// fnmatch); a plain pattern matches a whole name or a run of whole dotted segments (`lm_head`,
/// `model.visual`, `linear_attn.in_proj_b` — but `in_proj_b` does not match `in_proj_ba`).
pub(crate) fn pattern_matches(pattern: &str, module: &str) -> bool {
    if pattern.contains('*') || pattern.contains('?') {
        return glob(pattern.as_bytes(), module.as_bytes());
    }
    if pattern.is_empty() {
        return false;
    }
    let mut from = 0;
    while let Some(i) = module.get(from..).and_then(|s| s.find(pattern)) {
        let start = from + i;
        let end = start + pattern.len();
        let left_ok = start == 0 || module.as_bytes().get(start - 1) == Some(&b'.');
        let right_ok = end == module.len() || module.as_bytes().get(end) == Some(&b'.');
        if left_ok && right_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

/// Iterative glob with `*` (any run) and `?` (one byte); linear backtracking, no recursion.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some(pi);
                mark = si;
                pi += 1;
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some(st) => {
                    pi = st + 1;
                    mark += 1;
                    si = mark;
                }
                None => return false,
            },
        }
    }
    while p.get(pi) == Some(&b'*') {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_patterns_match_whole_segments() {
        assert!(pattern_matches("lm_head", "lm_head"));
        assert!(pattern_matches(
            "model.visual",
            "model.visual.blocks.0.attn.qkv"
        ));
        assert!(pattern_matches(
            "in_proj_b",
            "model.language_model.layers.3.linear_attn.in_proj_b"
        ));
        assert!(!pattern_matches(
            "in_proj_b",
            "model.layers.3.linear_attn.in_proj_ba"
        ));
        assert!(!pattern_matches("visual", "model.visualizer.x"));
        assert!(!pattern_matches("", "x"));
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(pattern_matches(
            "*visual*",
            "model.visual.merger.linear_fc1"
        ));
        assert!(pattern_matches(
            "model.layers.*.mlp.gate",
            "model.layers.12.mlp.gate"
        ));
        assert!(!pattern_matches(
            "model.layers.*.mlp.gate",
            "model.layers.12.mlp.gate_proj"
        ));
        assert!(pattern_matches(
            "mtp.layers.?.*",
            "mtp.layers.0.mlp.up_proj"
        ));
        assert!(!pattern_matches("a*b", "acbx"));
    }
}
