//! GPTQ 4-bit modules (`qweight`, `qzeros`, `scales`, `g_idx`) read from the checkpoint and unpacked at load by
//! [`Weight::gptq`] into the chunked int4 pack that the W4A16 kernel reads (the conventions and the checks live
//! there, beside the pack).

use kernels::backend::{GptqTensors, Weight};

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
    let qweight = ck.i32(&format!("{module}.qweight"))?;
    let qzeros = ck.i32(&format!("{module}.qzeros"))?;
    let scales = ck.f32(&format!("{module}.scales"))?;
    let g_idx = ck.i32(&format!("{module}.g_idx"))?;
    let tensors = GptqTensors {
        qweight: &qweight,
        qzeros: &qzeros,
        scales: &scales,
        g_idx: &g_idx,
    };
    Weight::gptq(&tensors, n, k, group as usize)
        .map_err(|e| EngineError::Unsupported(format!("{module}: {e}")))
}
