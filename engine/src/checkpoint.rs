//! A Hugging Face checkpoint directory, memory-mapped: `config.json` (parsed by the planner, the one parser),
//! `hf_quant_config.json` when present, and `model.safetensors` or the shards a `model.safetensors.index.json`
//! names. Every tensor is checked against the planner's inventory before any is used, and every problem is reported
//! at once, by name.
//!
//! Headers are parsed by the `safetensors` crate, which bounds the header size, checks the JSON, the dtypes, that
//! every tensor's byte range matches its shape and that the ranges tile the data section exactly; the mapping
//! is only read through the ranges it validated.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use planner::model::{
    check_inventory, parse_model, ModelCard, ModelSpec, ObservedTensor, SourceFile,
};
use safetensors::{Dtype, SafeTensors};

use crate::EngineError;

/// One tensor of the checkpoint: where its bytes are and what the header says they are.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub file: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range inside the file's mapping, validated by the safetensors header parser.
    pub range: std::ops::Range<usize>,
}

/// A mapped checkpoint whose tensors all match the planner's inventory of its config.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub spec: ModelSpec,
    /// The `config.json` (and `hf_quant_config.json`) the spec was parsed from, for the planner.
    pub card: ModelCard,
    files: Vec<(PathBuf, Mmap)>,
    tensors: HashMap<String, TensorInfo>,
}

fn read_text(path: &Path) -> Result<String, EngineError> {
    std::fs::read_to_string(path).map_err(|e| EngineError::io(path, e))
}

/// Resolves a shard name from the index, refusing anything that leaves the checkpoint directory (an absolute path,
/// `..`, or a symlink whose target is outside).
fn shard_path(dir: &Path, index: &Path, name: &str) -> Result<PathBuf, EngineError> {
    let rel = Path::new(name);
    let plain = rel
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain {
        return Err(EngineError::Checkpoint(format!(
            "{}: weight_map names `{name}`, which is not a file inside the checkpoint directory",
            index.display()
        )));
    }
    let path = dir.join(rel);
    let canon_dir = dir.canonicalize().map_err(|e| EngineError::io(dir, e))?;
    let canon = path.canonicalize().map_err(|e| EngineError::io(&path, e))?;
    if !canon.starts_with(&canon_dir) {
        return Err(EngineError::Checkpoint(format!(
            "{}: `{name}` resolves to {}, outside the checkpoint directory",
            index.display(),
            canon.display()
        )));
    }
    Ok(path)
}

/// Widens little-endian f32 / f16 / bf16 bytes into `out` (one element per `out` entry; any other dtype is read as
/// bf16, so callers check the dtype first).
pub(crate) fn widen(dtype: Dtype, src: &[u8], out: &mut [f32]) {
    let width = if dtype == Dtype::F32 { 4 } else { 2 };
    for (d, c) in out.iter_mut().zip(src.chunks_exact(width)) {
        *d = match dtype {
            Dtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            Dtype::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
            _ => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
        };
    }
}

impl Checkpoint {
    /// Opens and validates `dir`; the directory's name is the model's id in plans and messages.
    pub fn open(dir: &Path) -> Result<Checkpoint, EngineError> {
        let config_path = dir.join("config.json");
        let config_text = read_text(&config_path)?;
        let quant_path = dir.join("hf_quant_config.json");
        let quant_config = if quant_path.exists() {
            Some(SourceFile {
                path: quant_path.display().to_string(),
                text: read_text(&quant_path)?,
            })
        } else {
            None
        };
        let id = dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let card = ModelCard {
            id,
            config: SourceFile {
                path: config_path.display().to_string(),
                text: config_text,
            },
            quant_config,
        };
        let spec = parse_model(&card).map_err(|e| EngineError::Model(Box::new(e)))?;

        // The shard list: the index's weight_map, or the single file.
        let index_path = dir.join("model.safetensors.index.json");
        let (file_names, expected_file): (Vec<PathBuf>, Option<HashMap<String, usize>>) =
            if index_path.exists() {
                let text = read_text(&index_path)?;
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                    EngineError::Checkpoint(format!(
                        "{}:{}:{}: {e}",
                        index_path.display(),
                        e.line(),
                        e.column()
                    ))
                })?;
                let Some(map) = v.get("weight_map").and_then(|m| m.as_object()) else {
                    return Err(EngineError::Checkpoint(format!(
                        "{}: expected an object `weight_map` naming the shard of every tensor",
                        index_path.display()
                    )));
                };
                let mut files: Vec<PathBuf> = Vec::new();
                let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
                let mut expected = HashMap::new();
                for (tensor, shard) in map {
                    let Some(shard) = shard.as_str() else {
                        return Err(EngineError::Checkpoint(format!(
                            "{}: weight_map[{tensor:?}] must be a file name",
                            index_path.display()
                        )));
                    };
                    let next = by_name.len();
                    let idx = *by_name.entry(shard.to_string()).or_insert(next);
                    if idx == files.len() {
                        files.push(shard_path(dir, &index_path, shard)?);
                    }
                    expected.insert(tensor.clone(), idx);
                }
                (files, Some(expected))
            } else {
                (vec![dir.join("model.safetensors")], None)
            };

        let mut files = Vec::new();
        let mut tensors: HashMap<String, TensorInfo> = HashMap::new();
        let mut problems = Vec::new();
        for (fi, path) in file_names.iter().enumerate() {
            let file = File::open(path).map_err(|e| EngineError::io(path, e))?;
            // SAFETY: the mapping is read-only and private to this process; the checkpoint files must not be
            // truncated or rewritten while the engine runs (the same contract every mmap-based loader has). All
            // reads go through byte ranges the safetensors parser validated against the mapping's length.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| EngineError::io(path, e))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| {
                EngineError::Checkpoint(format!(
                    "{}: not a valid safetensors file: {e}",
                    path.display()
                ))
            })?;
            let base = map.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - base;
                let info = TensorInfo {
                    file: fi,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    range: start..start + view.data().len(),
                };
                if let Some(exp) = &expected_file {
                    match exp.get(&name) {
                        Some(&f) if f == fi => {}
                        Some(&f) => problems.push(format!(
                            "{name}: the index puts it in {} but it is in {}",
                            file_names[f].display(),
                            path.display()
                        )),
                        None => problems.push(format!(
                            "{name}: in {} but not in the index's weight_map",
                            path.display()
                        )),
                    }
                }
                if tensors.insert(name.clone(), info).is_some() {
                    problems.push(format!("{name}: stored in more than one shard"));
                }
            }
            drop(st);
            files.push((path.clone(), map));
        }
        if let Some(exp) = &expected_file {
            for (name, &f) in exp {
                if !tensors.contains_key(name) {
                    problems.push(format!(
                        "{name}: the index names {} but the tensor is not there",
                        file_names[f].display()
                    ));
                }
            }
        }

        // Against the planner's inventory: what the architecture says must be there.
        let observed: Vec<ObservedTensor> = tensors
            .iter()
            .map(|(name, t)| ObservedTensor {
                name: name.clone(),
                dtype: format!("{:?}", t.dtype),
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                file: file_names[t.file]
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            })
            .collect();
        problems.extend(check_inventory(&spec, &observed));
        if !problems.is_empty() {
            problems.sort();
            return Err(EngineError::Checkpoint(format!(
                "{} does not match its config ({} problems):\n  {}",
                dir.display(),
                problems.len(),
                problems.join("\n  ")
            )));
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            spec,
            card,
            files,
            tensors,
        })
    }

    /// The header entry of `name`.
    pub fn info(&self, name: &str) -> Result<&TensorInfo, EngineError> {
        self.tensors.get(name).ok_or_else(|| {
            EngineError::Checkpoint(format!("{}: tensor {name} is missing", self.dir.display()))
        })
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The raw bytes of `name`.
    pub fn bytes(&self, name: &str) -> Result<&[u8], EngineError> {
        let t = self.info(name)?;
        Ok(&self.files[t.file].1[t.range.clone()])
    }

    /// `name` widened to f32 (f32, bf16 or f16 storage).
    pub fn f32(&self, name: &str) -> Result<Vec<f32>, EngineError> {
        let t = self.info(name)?;
        let width = match t.dtype {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
            d => {
                return Err(EngineError::Checkpoint(format!(
                    "{name}: dtype {d:?} is not a float dtype the engine widens"
                )))
            }
        };
        let b = self.bytes(name)?;
        let mut out = vec![0.0; b.len() / width];
        widen(t.dtype, b, &mut out);
        Ok(out)
    }

    /// `name` as bf16 bits (bf16 storage only).
    pub fn bf16_bits(&self, name: &str) -> Result<Vec<u16>, EngineError> {
        let b = self.bytes(name)?;
        Ok(b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect())
    }

    /// `name` as i32 (GPTQ packed words, g_idx).
    pub fn i32(&self, name: &str) -> Result<Vec<i32>, EngineError> {
        let b = self.bytes(name)?;
        Ok(b.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// A scalar f32 stored as `[]` or `[1]`.
    pub fn scalar(&self, name: &str) -> Result<f32, EngineError> {
        let v = self.f32(name)?;
        v.first()
            .copied()
            .ok_or_else(|| EngineError::Checkpoint(format!("{name}: empty scalar")))
    }

    /// Tells the OS that `name`'s pages will not be read again (it has been converted or copied), so the mapping's
    /// resident pages do not add up across the load: peak memory stays near the converted weights plus one tensor.
    /// Best effort: an OS that ignores the advice only keeps more clean file pages resident.
    pub fn release(&self, name: &str) {
        let Ok(t) = self.info(name) else { return };
        const PAGE: usize = 4096;
        let map = &self.files[t.file].1;
        let start = t.range.start.next_multiple_of(PAGE);
        let end = t.range.end / PAGE * PAGE;
        if end > start {
            #[cfg(unix)]
            // SAFETY: the mapping is a private read-only file mapping; MADV_DONTNEED drops clean pages, which the
            // kernel re-reads from the file if they are touched again, so no reader can observe a change. The range
            // lies inside the mapping (validated tensor range, aligned inward).
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }

    /// Bytes of every mapped file.
    pub fn mapped_bytes(&self) -> u64 {
        self.files.iter().map(|(_, m)| m.len() as u64).sum()
    }
}
