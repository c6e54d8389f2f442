//! What a checkpoint's safetensors headers say it holds, checked against what the architecture expects
//! ([`ModelSpec::inventory`]). Pure: the caller (the xtask, the engine) reads the headers; every problem is
//! reported at once, by tensor name.

use super::{DType, ModelSpec, Role};

/// One tensor as a safetensors header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedTensor {
    pub name: String,
    /// The header's dtype string (`BF16`, `F8_E4M3`, `U8`, `I32`, ...).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// The file it is stored in, for messages.
    pub file: String,
}

/// The planner's dtype for a header dtype, given the dtype the inventory expects (packed types are stored as plain
/// `U8` / `I32`).
fn header_dtype(d: &str, expected: DType) -> Option<DType> {
    Some(match d {
        "F32" => DType::F32,
        "BF16" => DType::Bf16,
        "F16" => DType::F16,
        "F8_E4M3" => DType::F8E4m3,
        "U8" if expected == DType::U8PackedE2m1 => DType::U8PackedE2m1,
        "I32" if expected == DType::I32PackedInt4 => DType::I32PackedInt4,
        "I32" => DType::I32,
        _ => return None,
    })
}

/// Every way `observed` differs from `spec`'s inventory: missing tensors (vision and MTP tensors are optional: text
/// decoding never reads them), unexpected ones, wrong shapes and wrong dtypes. Small tensors (norms, `A_log`, conv)
/// may be stored in any float dtype: exporters widen or narrow them (Qwen3.8 stores `A_log` in bf16 where Qwen3.5
/// used f32) and they are widened at load. Sorted by tensor name; empty when the checkpoint matches.
pub fn check_inventory(spec: &ModelSpec, observed: &[ObservedTensor]) -> Vec<String> {
    let by_name: std::collections::HashMap<&str, &ObservedTensor> =
        observed.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut problems = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let float = |d: Option<DType>| matches!(d, Some(DType::F32 | DType::Bf16 | DType::F16));
    for e in &spec.inventory {
        seen.insert(e.name.as_str());
        let optional = matches!(e.role, Role::VisionTower | Role::MtpHead);
        let Some(t) = by_name.get(e.name.as_str()) else {
            if !optional {
                problems.push(format!(
                    "{}: missing (expected {:?} {:?})",
                    e.name, e.dtype, e.shape
                ));
            }
            continue;
        };
        // Scalars may be stored as [] or [1].
        if !(t.shape == e.shape || (e.shape.is_empty() && t.shape == [1])) {
            problems.push(format!(
                "{}: shape {:?} in {}, expected {:?}",
                e.name, t.shape, t.file, e.shape
            ));
        }
        let got = header_dtype(&t.dtype, e.dtype);
        if !(got == Some(e.dtype) || (e.role == Role::Small && float(got) && float(Some(e.dtype))))
        {
            problems.push(format!(
                "{}: dtype {} in {}, expected {:?}",
                e.name, t.dtype, t.file, e.dtype
            ));
        }
    }
    for t in observed {
        if !seen.contains(t.name.as_str()) {
            problems.push(format!(
                "{}: unexpected in {} (not in the inventory of {})",
                t.name, t.file, spec.architecture
            ));
        }
    }
    problems.sort();
    problems
}
