//! `--model DIR`: a Hugging Face checkpoint directory as the model. Reads `config.json` (and `hf_quant_config.json`)
//! and, when safetensors files are present, only their headers, with a bounded reader: the 8-byte length must be at
//! most [`MAX_HEADER`], the header valid JSON, every tensor's byte range inside the file and the size its dtype and
//! shape say, and every shard the index names a plain file inside the directory. Nothing past the headers is read.
//! The inventory they describe is checked against the architecture's by the planner (`check_inventory`), every
//! problem at once.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use miette::{miette, IntoDiagnostic, Result, WrapErr};
use planner::model::{check_inventory, parse_model, ModelCard, ObservedTensor, SourceFile};

/// The safetensors format's own bound on a header (the `safetensors` crate refuses larger ones too).
pub(crate) const MAX_HEADER: u64 = 100_000_000;

fn elem_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// The tensors a safetensors file's header describes, checked against the file's length.
pub(crate) fn read_header(path: &Path) -> Result<Vec<ObservedTensor>> {
    let shown = path.display().to_string();
    let f = std::fs::File::open(path)
        .into_diagnostic()
        .wrap_err_with(|| format!("opening {shown}"))?;
    let len = f.metadata().into_diagnostic()?.len();
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    header_from(&shown, &file, len, f)
}

/// [`read_header`] over any reader of a `len`-byte file (`shown` names it in errors, `file` goes into each tensor):
/// reads the 8-byte length and at most [`MAX_HEADER`] bytes after it, nothing else. The fuzz target
/// (`fuzz/fuzz_targets/safetensors_header.rs`) drives it with arbitrary bytes.
pub(crate) fn header_from(
    shown: &str,
    file: &str,
    len: u64,
    mut f: impl Read,
) -> Result<Vec<ObservedTensor>> {
    let mut n8 = [0u8; 8];
    f.read_exact(&mut n8).map_err(|_| {
        miette!("{shown}: shorter than the 8-byte header length of a safetensors file")
    })?;
    let n = u64::from_le_bytes(n8);
    if n > MAX_HEADER {
        return Err(miette!(
            "{shown}: header length {n} is above the {MAX_HEADER}-byte limit"
        ));
    }
    if n > len.saturating_sub(8) {
        return Err(miette!(
            "{shown}: header length {n} runs past the end of the {len}-byte file"
        ));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).into_diagnostic()?;
    let v: serde_json::Value = serde_json::from_slice(&header).map_err(|e| {
        miette!(
            "{shown}: header is not valid JSON (line {}, column {}): {e}",
            e.line(),
            e.column()
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| miette!("{shown}: header is not a JSON object"))?;
    let data_len = len.saturating_sub(8).saturating_sub(n);
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| miette!("{shown}: tensor `{name}`: {what}");
        let dtype = t
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("no dtype string"))?;
        let elem = elem_bytes(dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype}")))?;
        let shape: Vec<u64> = t
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape array"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| bad("a shape entry is not a non-negative integer"))
            })
            .collect::<Result<_>>()?;
        let offs: Vec<u64> = t
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("data_offsets must be [begin, end]"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| bad("a data offset is not a non-negative integer"))
            })
            .collect::<Result<_>>()?;
        let (b, e) = (offs[0], offs[1]);
        if b > e || e > data_len {
            return Err(bad(&format!(
                "data_offsets [{b}, {e}] are outside the {data_len}-byte data section"
            )));
        }
        let want = shape
            .iter()
            .try_fold(elem, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("the shape's byte size overflows"))?;
        if e - b != want {
            return Err(bad(&format!(
                "holds {} bytes but {dtype} {shape:?} needs {want}",
                e - b
            )));
        }
        ranges.push((b, e, name.clone()));
        out.push(ObservedTensor {
            name: name.clone(),
            dtype: dtype.to_string(),
            shape,
            file: file.to_owned(),
        });
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(miette!(
                "{shown}: tensors `{}` and `{}` overlap",
                w[0].2,
                w[1].2
            ));
        }
    }
    Ok(out)
}

/// The shard files of `dir`: the index's weight map (each a plain file name inside `dir`), or `model.safetensors`,
/// or none when the directory holds only a config.
fn shards(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).into_diagnostic()?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| miette!("{}:{}:{}: {e}", index.display(), e.line(), e.column()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| miette!("{}: expected an object `weight_map`", index.display()))?;
        let canon_dir = dir.canonicalize().into_diagnostic()?;
        let mut files: Vec<PathBuf> = Vec::new();
        for (tensor, f) in map {
            let f = f.as_str().ok_or_else(|| {
                miette!(
                    "{}: weight_map[{tensor:?}] is not a file name",
                    index.display()
                )
            })?;
            let rel = Path::new(f);
            if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(miette!(
                    "{}: `{f}` is not a file inside the checkpoint directory",
                    index.display()
                ));
            }
            let p = dir.join(rel);
            let canon = p
                .canonicalize()
                .into_diagnostic()
                .wrap_err_with(|| format!("shard {f}"))?;
            if !canon.starts_with(&canon_dir) {
                return Err(miette!(
                    "{}: `{f}` resolves outside the checkpoint directory",
                    index.display()
                ));
            }
            if !files.contains(&p) {
                files.push(p);
            }
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    Ok(if single.is_file() {
        vec![single]
    } else {
        Vec::new()
    })
}

/// A checkpoint directory as a model card, its safetensors headers checked against its config's inventory.
pub(crate) fn load_dir(dir: &Path) -> Result<ModelCard> {
    let read = |p: PathBuf| -> Result<SourceFile> {
        let text = std::fs::read_to_string(&p)
            .into_diagnostic()
            .wrap_err_with(|| format!("reading {}", p.display()))?;
        Ok(SourceFile {
            path: p.display().to_string(),
            text,
        })
    };
    let quant = dir.join("hf_quant_config.json");
    let card = ModelCard {
        id: dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "model".into()),
        config: read(dir.join("config.json"))?,
        quant_config: if quant.is_file() {
            Some(read(quant)?)
        } else {
            None
        },
    };
    let files = shards(dir)?;
    if files.is_empty() {
        return Ok(card);
    }
    let spec = parse_model(&card).map_err(miette::Report::new)?;
    let mut observed = Vec::new();
    for f in &files {
        observed.extend(read_header(f)?);
    }
    let problems = check_inventory(&spec, &observed);
    if !problems.is_empty() {
        return Err(miette!(
            "{} does not match its config ({} problems):\n  {}",
            dir.display(),
            problems.len(),
            problems.join("\n  ")
        ));
    }
    Ok(card)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../engine/tests/fixtures")
            .join(name)
    }

    #[test]
    fn a_fixture_directory_plans_and_its_headers_match() {
        for name in ["qwen3_5-nvfp4", "spark2_5-gptq", "gemma3-bf16"] {
            let card = load_dir(&fixture(name)).unwrap();
            assert_eq!(card.id, name);
        }
    }

    /// A fresh directory holding the llama fixture's config only.
    fn config_only(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("edgefit-xtask-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            fixture("llama-bf16").join("config.json"),
            dir.join("config.json"),
        )
        .unwrap();
        dir
    }

    fn corrupt(tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
        let dir = config_only(tag);
        let mut bytes = std::fs::read(fixture("llama-bf16").join("model.safetensors")).unwrap();
        edit(&mut bytes);
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        format!("{:?}", load_dir(&dir).unwrap_err())
    }

    #[test]
    fn bad_headers_are_errors_naming_the_file() {
        assert!(
            corrupt("huge", |b| b[..8].copy_from_slice(&u64::MAX.to_le_bytes()))
                .contains("above the")
        );
        assert!(corrupt("past", |b| b[..8]
            .copy_from_slice(&(1u64 << 40).to_le_bytes()))
        .contains("above the"));
        assert!(corrupt("beyond", |b| b[..8]
            .copy_from_slice(&50_000_000u64.to_le_bytes()))
        .contains("runs past the end"));
        assert!(corrupt("short", |b| b.truncate(4)).contains("shorter than"));
        assert!(corrupt("trunc", |b| {
            let n = b.len();
            b.truncate(n - 64)
        })
        .contains("outside the"));
        assert!(corrupt("json", |b| b[8] = b'!').contains("not valid JSON"));
    }

    #[test]
    fn a_shard_outside_the_directory_is_refused() {
        let dir = config_only("escape");
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map": {"model.norm.weight": "../../etc/passwd"}}"#,
        )
        .unwrap();
        assert!(format!("{:?}", load_dir(&dir).unwrap_err()).contains("not a file inside"));
    }

    #[test]
    fn header_reader_never_panics_on_random_bytes() {
        use std::io::Write;
        let p = std::env::temp_dir().join(format!(
            "edgefit-xtask-rand-{}.safetensors",
            std::process::id()
        ));
        let mut state = 0x9e3779b97f4a7c15u64;
        for i in 0..2000 {
            let mut bytes = Vec::new();
            let n = (i % 64) as u64;
            bytes.extend_from_slice(&n.to_le_bytes());
            for _ in 0..(i % 97) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(b"{}[]\":,0123456789ABFUdtypeshapedata_offsets "[(state % 44) as usize]);
            }
            std::fs::File::create(&p)
                .unwrap()
                .write_all(&bytes)
                .unwrap();
            let _ = read_header(&p);
        }
    }

    /// The real fixture's file mutated in memory through the same reader (`header_from`, which the fuzz target
    /// `safetensors_header` drives): bytes of the header overwritten, the length prefix rewritten, the file cut
    /// short. Each input is an error or a set of tensors whose every range lies in the data section; never a panic.
    /// Inputs tried: 6000 (deterministic xorshift, so a failure reproduces).
    #[test]
    fn header_reader_never_panics_on_mutated_real_headers() {
        let real = std::fs::read(fixture("llama-bf16").join("model.safetensors")).unwrap();
        let n = u64::from_le_bytes(real[..8].try_into().unwrap()) as usize;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut tried, mut ok) = (0, 0);
        for i in 0..6000 {
            let mut bytes = real.clone();
            match i % 3 {
                // One to four bytes of the header overwritten with JSON-significant or arbitrary bytes.
                0 => {
                    for _ in 0..=(next() % 4) {
                        let at = 8 + (next() as usize) % n;
                        const JSON: &[u8] = b"{}[]\":,-0123456789e";
                        bytes[at] = if next() % 2 == 0 {
                            JSON[(next() as usize) % JSON.len()]
                        } else {
                            next() as u8
                        };
                    }
                }
                // The length prefix rewritten: near the true length, or anything.
                1 => {
                    let len = if next() % 2 == 0 {
                        (n as u64).wrapping_add(next() % 17).wrapping_sub(8)
                    } else {
                        next() >> (next() % 64)
                    };
                    bytes[..8].copy_from_slice(&len.to_le_bytes());
                }
                // The file cut anywhere.
                _ => bytes.truncate((next() as usize) % (real.len() + 1)),
            }
            tried += 1;
            let len = bytes.len() as u64;
            if let Ok(tensors) = header_from("m.safetensors", "m.safetensors", len, &bytes[..]) {
                ok += 1;
                assert!(tensors.len() <= 10_000, "input {i}");
            }
        }
        assert_eq!(tried, 6000);
        // Some mutations leave a valid header (a digit of an unused field, the cut after the data): both outcomes
        // are exercised.
        assert!(ok > 0 && ok < tried, "{ok} of {tried} parsed");
    }
}
