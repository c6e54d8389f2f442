//! Random-weight checkpoints with a real model's geometry and stored formats, written fast enough for a borrowed
//! GPU's time budget: a 27B FP8 model is ~30 GB, so the writer streams every tensor to disk in pieces (nothing is
//! held whole in memory) and fills the large tensors with random bits of a bounded exponent, on every core, instead
//! of quantizing normal samples one by one as the parity fixtures do ([`crate::fixtures`]).
//!
//! The values are only meant to be finite and of a sensible scale (activations stay bounded through the layers):
//! what a speed benchmark needs. Small tensors (norms, DeltaNet decay and conv weights) take the fixtures' careful
//! values, so the layers behave like a model's.

use std::io::Write;
use std::path::Path;

use planner::model::{parse_model, DType, ModelCard, SourceFile, TensorEntry};

use crate::EngineError;

/// Tensors of at most this many elements take the fixtures' generator (normal values, family-aware norms).
const SMALL: u64 = 1 << 22;

/// Bytes generated per piece (and per thread's share of a piece).
const PIECE: usize = 64 << 20;

/// A SplitMix64 stream: fast, and each piece of a tensor seeds its own, so threads need not share one.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// How the bytes of one large tensor are drawn.
#[derive(Clone, Copy)]
enum Fill {
    /// e4m3 codes below 2 in magnitude (the top exponent bit clear: never NaN).
    Fp8,
    /// Any e2m1 pair (every code is finite).
    Nibbles,
    /// bf16 of magnitude 2^-10 .. 2^-6 with a random sign and mantissa.
    Bf16,
    /// f16 of magnitude 2^-10 .. 2^-6.
    F16,
    /// f32 of magnitude 2^-10 .. 2^-6.
    F32,
}

fn fill(kind: Fill, seed: u64, out: &mut [u8]) {
    let mut r = Mix(seed);
    match kind {
        Fill::Fp8 | Fill::Nibbles => {
            let mask = if matches!(kind, Fill::Fp8) {
                0xbf
            } else {
                0xff
            };
            for c in out.chunks_mut(8) {
                let v = r.next().to_le_bytes();
                for (d, s) in c.iter_mut().zip(v) {
                    *d = s & mask;
                }
            }
        }
        Fill::Bf16 | Fill::F16 => {
            // Exponent field: bf16 bias 127 (8 bits, 7 mantissa), f16 bias 15 (5 bits, 10 mantissa).
            let (bias, shift, mant) = if matches!(kind, Fill::Bf16) {
                (127u64, 7, 0x7f)
            } else {
                (15u64, 10, 0x3ff)
            };
            for c in out.chunks_mut(8) {
                let v = r.next();
                for (i, d) in c.chunks_mut(2).enumerate() {
                    let b = v >> (16 * i);
                    let exp = bias - 10 + (b & 3);
                    let bits = ((b >> 15) & 1) << 15 | exp << shift | (b >> 2) & mant;
                    d.copy_from_slice(&(bits as u16).to_le_bytes()[..d.len()]);
                }
            }
        }
        Fill::F32 => {
            for c in out.chunks_mut(4) {
                let b = r.next();
                let exp = 127 - 10 + (b & 3);
                let bits = ((b >> 40) & 1) << 31 | exp << 23 | (b >> 2) & 0x7f_ffff;
                c.copy_from_slice(&(bits as u32).to_le_bytes()[..c.len()]);
            }
        }
    }
}

fn st_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::Bf16 => "BF16",
        DType::F16 => "F16",
        DType::F8E4m3 => "F8_E4M3",
        DType::U8PackedE2m1 => "U8",
        DType::I32PackedInt4 | DType::I32 => "I32",
    }
}

/// Bytes of one scale tensor of a quantized linear: chosen so the dequantized weights have the scale of
/// `1/sqrt(k)`.
fn scale_bytes(e: &TensorEntry, k: u64) -> Option<Vec<u8>> {
    let leaf = e.name.rsplit('.').next().unwrap_or("");
    let inv = 1.0 / (k.max(1) as f32).sqrt();
    let n: usize = e.shape.iter().product::<u64>() as usize;
    match (leaf, e.dtype) {
        // FP8 block scales multiply codes of magnitude ~0.5.
        ("weight_scale_inv", DType::F32) => Some(
            std::iter::repeat_n((2.0 * inv).to_le_bytes(), n)
                .flatten()
                .collect(),
        ),
        // FP8 per-tensor scale.
        ("weight_scale", DType::F32) => Some(
            std::iter::repeat_n((2.0 * inv).to_le_bytes(), n.max(1))
                .flatten()
                .collect(),
        ),
        // NVFP4 group scales (e4m3 1.0) times a global scale (e2m1 codes average ~2).
        ("weight_scale", DType::F8E4m3) => Some(vec![kernels::formats::f32_to_e4m3(1.0); n]),
        ("weight_scale_2", _) => Some((0.5 * inv).to_le_bytes().to_vec()),
        ("input_scale", _) => Some(1.0f32.to_le_bytes().to_vec()),
        _ => None,
    }
}

/// Writes a random checkpoint of the card in `card_dir` (its `config.json` and, when present,
/// `hf_quant_config.json`) into `out`: `model.safetensors`, the two configs, and a byte-level tokenizer padded to
/// the vocabulary. Returns the bytes of `model.safetensors`.
pub fn write(card_dir: &Path, out: &Path, seed: u64) -> Result<u64, EngineError> {
    write_with(card_dir, out, seed, SMALL)
}

/// [`write`] with the size (in elements) up to which a tensor takes the fixtures' careful values instead of random
/// bits: 0 makes every float tensor random bits (what the tests use to reach that path on a tiny card).
pub fn write_with(card_dir: &Path, out: &Path, seed: u64, small: u64) -> Result<u64, EngineError> {
    let read = |name: &str| -> Result<Option<String>, EngineError> {
        let p = card_dir.join(name);
        match std::fs::read_to_string(&p) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(EngineError::io(&p, e)),
        }
    };
    let config = read("config.json")?.ok_or_else(|| {
        EngineError::Checkpoint(format!("{}: no config.json", card_dir.display()))
    })?;
    let quant = read("hf_quant_config.json")?;
    let card = ModelCard {
        id: "random".into(),
        config: SourceFile {
            path: card_dir.join("config.json").display().to_string(),
            text: config.clone(),
        },
        quant_config: quant.as_ref().map(|q| SourceFile {
            path: card_dir.join("hf_quant_config.json").display().to_string(),
            text: q.clone(),
        }),
    };
    let spec = parse_model(&card).map_err(|e| EngineError::Model(Box::new(e)))?;
    std::fs::create_dir_all(out).map_err(|e| EngineError::io(out, e))?;

    // The header: every tensor's dtype, shape and byte range, in inventory order.
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for e in &spec.inventory {
        let end = offset + e.bytes;
        header.insert(
            e.name.clone(),
            serde_json::json!({"dtype": st_dtype(e.dtype), "shape": e.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut text = serde_json::to_string(&header)
        .map_err(|e| EngineError::Checkpoint(format!("header: {e}")))?;
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(' ');
    }
    let path = out.join("model.safetensors");
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).map_err(|e| EngineError::io(&tmp, e))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
    let io = |e| EngineError::io(&tmp, e);
    w.write_all(&(text.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(text.as_bytes()).map_err(io)?;
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let k_of: std::collections::HashMap<&str, u64> = spec
        .runtime
        .linears
        .iter()
        .map(|l| (l.module.as_str(), l.in_features))
        .collect();
    let mut buf = vec![0u8; PIECE];
    for (ti, e) in spec.inventory.iter().enumerate() {
        let module = e.name.rsplit_once('.').map_or("", |(m, _)| m);
        let tseed = seed ^ (ti as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
        if let Some(b) = k_of.get(module).and_then(|&k| scale_bytes(e, k)) {
            w.write_all(&b[..e.bytes as usize]).map_err(io)?;
            continue;
        }
        let elems: u64 = e.shape.iter().product();
        let kind = match e.dtype {
            DType::F8E4m3 => Some(Fill::Fp8),
            DType::U8PackedE2m1 => Some(Fill::Nibbles),
            _ if elems <= small => None,
            DType::Bf16 => Some(Fill::Bf16),
            DType::F16 => Some(Fill::F16),
            DType::F32 => Some(Fill::F32),
            DType::I32PackedInt4 | DType::I32 => {
                return Err(EngineError::Unsupported(format!(
                    "{}: GPTQ tensors are not generated here (use the fixtures' writer)",
                    e.name
                )))
            }
        };
        let Some(kind) = kind else {
            w.write_all(&crate::fixtures::small_tensor_bytes(&spec, e, tseed))
                .map_err(io)?;
            continue;
        };
        let mut left = e.bytes as usize;
        let mut piece = 0u64;
        while left > 0 {
            let len = left.min(PIECE);
            let part = len.div_ceil(threads).next_multiple_of(8);
            std::thread::scope(|s| {
                for (j, c) in buf[..len].chunks_mut(part).enumerate() {
                    let sd = tseed ^ (piece * 4096 + j as u64).wrapping_mul(0x9e37_79b9);
                    s.spawn(move || fill(kind, sd, c));
                }
            });
            w.write_all(&buf[..len]).map_err(io)?;
            left -= len;
            piece += 1;
        }
    }
    w.flush().map_err(io)?;
    drop(w);
    std::fs::rename(&tmp, &path).map_err(|e| EngineError::io(&path, e))?;
    for (name, text) in [
        ("config.json", Some(config)),
        ("hf_quant_config.json", quant),
    ] {
        if let Some(t) = text {
            std::fs::write(out.join(name), t).map_err(|e| EngineError::io(&out.join(name), e))?;
        }
    }
    crate::fixtures::write_tokenizer(out, spec.vocab_size)?;
    Ok(8 + text.len() as u64 + offset)
}
