//! GPTQ 4-bit modules (`qweight`, `qzeros`, `scales`, `g_idx`) unpacked at load into the chunked int4 pack that
//! the W4A16 kernel reads. The stored zero is AutoGPTQ's v1 convention (`stored + 1` is the zero point; a
//! symmetric export stores 7 for 8); `w = (q - z) * s` becomes the pack's `(q - 8) * s + (8 - z) * s`.
//! The pack keeps scales and zeros in bf16, so the unpacked weights differ from the f16 scales by at most a bf16
//! rounding (2^-9 relative) of each group's scale.

use kernels::backend::Weight;
use kernels::linear::{Int4Scheme, Int4Weights};
use kernels::reference::linear::Int4Logical;

use crate::checkpoint::Checkpoint;
use crate::EngineError;

pub(crate) fn load(
    ck: &Checkpoint,
    module: &str,
    bits: u32,
    group: u32,
    n: usize,
    k: usize,
) -> Result<Weight, EngineError> {
    if bits != 4 {
        return Err(EngineError::Unsupported(format!(
            "{module}: GPTQ with {bits} bits; the engine reads 4"
        )));
    }
    let group = group as usize;
    if !kernels::linear::int4::GROUPS.contains(&group) {
        return Err(EngineError::Unsupported(format!(
            "{module}: GPTQ group {group}; the int4 pack takes {:?}",
            kernels::linear::int4::GROUPS
        )));
    }
    let qweight = ck.i32(&format!("{module}.qweight"))?;
    let qzeros = ck.i32(&format!("{module}.qzeros"))?;
    let scales = ck.f32(&format!("{module}.scales"))?;
    let g_idx = ck.i32(&format!("{module}.g_idx"))?;
    if g_idx
        .iter()
        .enumerate()
        .any(|(i, &g)| g as usize != i / group)
    {
        return Err(EngineError::Unsupported(format!(
            "{module}: g_idx reorders the input channels (act-order); the int4 pack needs groups in order"
        )));
    }
    let groups = k.div_ceil(group);
    let zpr = n.div_ceil(8);
    let mut codes = vec![0u8; n * k];
    for i in 0..k {
        for j in 0..n {
            let word = qweight[(i / 8) * n + j] as u32;
            codes[j * k + i] = ((word >> (4 * (i % 8))) & 0xF) as u8;
        }
    }
    let mut sc = vec![0.0f32; groups * n];
    let mut zs = vec![0.0f32; groups * n];
    for g in 0..groups {
        for j in 0..n {
            let z = ((qzeros[g * zpr + j / 8] as u32 >> (4 * (j % 8))) & 0xF) as f32 + 1.0;
            let s = scales[g * n + j];
            sc[g * n + j] = s;
            zs[g * n + j] = (8.0 - z) * s;
        }
    }
    let l = Int4Logical {
        n,
        k,
        group,
        codes,
        scales: sc,
        zeros: zs,
    };
    let w = Int4Weights::from_logical(&l, Int4Scheme::Asymmetric)
        .map_err(|e| EngineError::Kernel(format!("{module}: {e}")))?;
    Ok(Weight::Int4 { w, a8: false })
}
