//! The parameter inventory: every tensor of the real checkpoint, by its real name, with its storage bytes (scales
//! included), its role and how often decode reads it.
//!
//! Architecture files describe modules ("a linear 5120 -> 17408 here, a norm of 128 there"); the [`Inventory`]
//! builder turns each module into the tensors the checkpoint actually stores for it under the model's quantization
//! (an FP8 linear is a `weight` plus a `weight_scale_inv`, an NVFP4 one four tensors, a GPTQ one four others).
//! Totals are what the tests pin against the published checkpoint sizes.

use super::quant::{Format, QuantScheme};
use super::runtime::LinearModule;
use super::{Access, DType, ModelSpec, Role, TensorEntry};

/// Which part of the model a module belongs to; decides the role of each tensor and whether GPTQ quantizes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Part {
    /// Inside decoder layer `n` (attention, GDN, dense MLP, shared expert).
    Layer(u32),
    /// A routed expert of decoder layer `n`.
    Expert {
        layer: u32,
        active: u32,
        total: u32,
    },
    LmHead,
    /// Final norm and similar top-level small tensors read every token.
    Top,
    Vision,
    Mtp,
}

impl Part {
    fn layer(self) -> Option<u32> {
        match self {
            Part::Layer(n) | Part::Expert { layer: n, .. } => Some(n),
            _ => None,
        }
    }

    fn access(self) -> Access {
        match self {
            Part::Expert { active, total, .. } => Access::Routed { active, total },
            Part::Vision => Access::ConditionalImage,
            Part::Mtp => Access::ConditionalSpeculative,
            _ => Access::EveryToken,
        }
    }

    /// Role of a matmul weight / of its scales / of a small tensor (norm, bias, conv) in this part.
    fn roles(self) -> (Role, Role, Role) {
        match self {
            Part::Layer(_) => (Role::LayerWeight, Role::Scale, Role::Small),
            Part::Expert { .. } => (Role::ExpertWeight, Role::Scale, Role::Small),
            Part::LmHead => (Role::LmHead, Role::Scale, Role::Small),
            Part::Top => (Role::LayerWeight, Role::Scale, Role::Small),
            // Everything under the vision tower or the MTP head shares its role, so "offload `visual.*`" is one
            // decision over one role, scales and norms included.
            Part::Vision => (Role::VisionTower, Role::VisionTower, Role::VisionTower),
            Part::Mtp => (Role::MtpHead, Role::MtpHead, Role::MtpHead),
        }
    }
}

/// Bytes of one element of an unpacked dtype.
pub(crate) fn elem_bytes(d: DType) -> u64 {
    match d {
        DType::F32 | DType::I32 => 4,
        DType::Bf16 | DType::F16 => 2,
        DType::F8E4m3 => 1,
        // Packed types are sized by the code that emits them; one byte per stored element is their storage unit.
        DType::U8PackedE2m1 | DType::I32PackedInt4 => 1,
    }
}

fn product(shape: &[u64]) -> u64 {
    shape.iter().fold(1u64, |a, &b| a.saturating_mul(b))
}

/// Collects the inventory in checkpoint order.
#[derive(Debug)]
pub(crate) struct Inventory<'q> {
    q: &'q QuantScheme,
    pub(crate) entries: Vec<TensorEntry>,
    /// Every linear module with its stored format, for [`super::Runtime::linears`].
    pub(crate) linears: Vec<LinearModule>,
}

impl<'q> Inventory<'q> {
    pub(crate) fn new(q: &'q QuantScheme) -> Self {
        Inventory {
            q,
            entries: Vec::new(),
            linears: Vec::new(),
        }
    }

    /// Records one tensor; `size` is `(bytes, logical params)`.
    fn push(
        &mut self,
        name: String,
        shape: Vec<u64>,
        dtype: DType,
        size: (u64, u64),
        role: Role,
        part: Part,
    ) {
        let (bytes, params) = size;
        self.entries.push(TensorEntry {
            name,
            shape,
            dtype,
            bytes,
            params,
            role,
            access: part.access(),
            layer: part.layer(),
        });
    }

    /// A plain tensor in `dtype` (norm weights, conv kernels, A_log, biases, embeddings).
    fn plain(&mut self, name: String, shape: Vec<u64>, dtype: DType, role: Role, part: Part) {
        let params = product(&shape);
        let bytes = params.saturating_mul(elem_bytes(dtype));
        self.push(name, shape, dtype, (bytes, params), role, part);
    }

    /// A small tensor (norm, conv, gate vector) stored in the model dtype.
    pub(crate) fn small(&mut self, name: impl Into<String>, shape: &[u64], part: Part) {
        let role = part.roles().2;
        self.plain(name.into(), shape.to_vec(), self.q.base, role, part);
    }

    /// A token embedding table `[vocab, hidden]` in the model dtype. Untied, it is a gather (one row per token);
    /// tied, the same tensor is also the LM head and is read whole every token, so it is `EveryToken` with role
    /// `Embedding` (the placement must treat it as hot: it is the head).
    pub(crate) fn embedding(
        &mut self,
        name: impl Into<String>,
        vocab: u64,
        hidden: u64,
        tied: bool,
    ) {
        let dtype = self.q.base;
        let row_bytes = hidden.saturating_mul(elem_bytes(dtype));
        let shape = vec![vocab, hidden];
        let params = product(&shape);
        let bytes = params.saturating_mul(elem_bytes(dtype));
        let access = if tied {
            Access::EveryToken
        } else {
            Access::Gather { row_bytes }
        };
        self.entries.push(TensorEntry {
            name: name.into(),
            shape,
            dtype,
            bytes,
            params,
            role: Role::Embedding,
            access,
            layer: None,
        });
    }

    /// A linear module `module` (`<module>.weight`, optionally `<module>.bias`) mapping `inp` features to `out`,
    /// stored as the checkpoint's quantization says for that module.
    pub(crate) fn linear(&mut self, module: &str, out: u64, inp: u64, bias: bool, part: Part) {
        let in_layer = matches!(part, Part::Layer(_) | Part::Expert { .. });
        let fmt = self.q.format_of(module, in_layer);
        self.linears.push(LinearModule {
            module: module.to_string(),
            out_features: out,
            in_features: inp,
            bias,
            format: fmt.stored(),
        });
        let (w_role, s_role, small_role) = part.roles();
        let logical = out.saturating_mul(inp);
        match fmt {
            Format::Dense(d) => {
                self.plain(format!("{module}.weight"), vec![out, inp], d, w_role, part)
            }
            Format::Fp8Block { block: [b0, b1] } => {
                self.push(
                    format!("{module}.weight"),
                    vec![out, inp],
                    DType::F8E4m3,
                    (logical, logical),
                    w_role,
                    part,
                );
                let shape = vec![
                    out.div_ceil(u64::from(b0.max(1))),
                    inp.div_ceil(u64::from(b1.max(1))),
                ];
                self.plain(
                    format!("{module}.weight_scale_inv"),
                    shape,
                    DType::F32,
                    s_role,
                    part,
                );
            }
            Format::Fp8Tensor => {
                self.push(
                    format!("{module}.weight"),
                    vec![out, inp],
                    DType::F8E4m3,
                    (logical, logical),
                    w_role,
                    part,
                );
                self.plain(
                    format!("{module}.weight_scale"),
                    vec![],
                    DType::F32,
                    s_role,
                    part,
                );
                self.plain(
                    format!("{module}.input_scale"),
                    vec![],
                    DType::F32,
                    s_role,
                    part,
                );
            }
            Format::Nvfp4 { group } => {
                // Two e2m1 codes per byte, even element in the low nibble (BRIEF §3 "Formats").
                let packed = vec![out, inp.div_ceil(2)];
                let bytes = product(&packed);
                self.push(
                    format!("{module}.weight"),
                    packed,
                    DType::U8PackedE2m1,
                    (bytes, logical),
                    w_role,
                    part,
                );
                let scales = vec![out, inp.div_ceil(u64::from(group.max(1)))];
                self.plain(
                    format!("{module}.weight_scale"),
                    scales,
                    DType::F8E4m3,
                    s_role,
                    part,
                );
                self.plain(
                    format!("{module}.weight_scale_2"),
                    vec![],
                    DType::F32,
                    s_role,
                    part,
                );
                self.plain(
                    format!("{module}.input_scale"),
                    vec![],
                    DType::F32,
                    s_role,
                    part,
                );
            }
            Format::Gptq { bits, group } => {
                let per_word = u64::from(32 / bits.clamp(1, 32));
                let groups = inp.div_ceil(u64::from(group.max(1)));
                let qweight = vec![inp.div_ceil(per_word), out];
                let qbytes = product(&qweight).saturating_mul(4);
                self.push(
                    format!("{module}.qweight"),
                    qweight,
                    DType::I32PackedInt4,
                    (qbytes, logical),
                    w_role,
                    part,
                );
                let qzeros = vec![groups, out.div_ceil(per_word)];
                let zbytes = product(&qzeros).saturating_mul(4);
                let zparams = groups.saturating_mul(out);
                self.push(
                    format!("{module}.qzeros"),
                    qzeros,
                    DType::I32PackedInt4,
                    (zbytes, zparams),
                    s_role,
                    part,
                );
                self.plain(
                    format!("{module}.scales"),
                    vec![groups, out],
                    DType::F16,
                    s_role,
                    part,
                );
                self.plain(
                    format!("{module}.g_idx"),
                    vec![inp],
                    DType::I32,
                    s_role,
                    part,
                );
            }
        }
        if bias {
            let dtype = match fmt {
                Format::Gptq { .. } => DType::F16,
                _ => self.q.base,
            };
            self.plain(format!("{module}.bias"), vec![out], dtype, small_role, part);
        }
    }
}

impl ModelSpec {
    /// Bytes of every tensor of the checkpoint, scales included.
    pub fn total_bytes(&self) -> u64 {
        self.inventory
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.bytes))
    }

    /// Logical parameters of the checkpoint (packed 4-bit codes count per value; scales count as parameters).
    pub fn total_params(&self) -> u64 {
        self.inventory
            .iter()
            .fold(0u64, |a, t| a.saturating_add(t.params))
    }

    /// Bytes whose names start with `prefix` (e.g. `model.visual.`, `mtp.`): a convenience for reports and tests.
    pub fn bytes_under(&self, prefix: &str) -> u64 {
        self.inventory
            .iter()
            .filter(|t| t.name.starts_with(prefix))
            .fold(0u64, |a, t| a.saturating_add(t.bytes))
    }

    /// Weight bytes one decode step reads: every `EveryToken` tensor, one row of each gathered embedding, the
    /// active share of routed experts (`bytes * active / total`, rounded up), plus the MTP head when `speculative`
    /// and the vision tower when `image`. The vision tower runs once per image at prefill, so `image = true` prices
    /// the step that encodes one, not every decode step.
    pub fn bytes_read_per_token(&self, speculative: bool, image: bool) -> u64 {
        self.inventory.iter().fold(0u64, |a, t| {
            let b = match t.access {
                Access::EveryToken => t.bytes,
                Access::Gather { row_bytes } => row_bytes.min(t.bytes),
                Access::Routed { active, total } => routed_share(t.bytes, active, total),
                Access::ConditionalSpeculative if speculative => t.bytes,
                Access::ConditionalImage if image => t.bytes,
                Access::ConditionalSpeculative | Access::ConditionalImage => 0,
            };
            a.saturating_add(b)
        })
    }
}

/// `bytes * active / total`, rounded up, in 128-bit so the product cannot overflow.
pub(crate) fn routed_share(bytes: u64, active: u32, total: u32) -> u64 {
    if total == 0 {
        return bytes;
    }
    let v = (u128::from(bytes) * u128::from(active.min(total))).div_ceil(u128::from(total));
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routed_share_rounds_up_and_cannot_overflow() {
        assert_eq!(routed_share(512, 10, 512), 10);
        assert_eq!(routed_share(513, 10, 512), 11);
        assert_eq!(routed_share(u64::MAX, 10, 512), u64::MAX / 512 * 10 + 10);
        assert_eq!(routed_share(100, 5, 0), 100);
        assert_eq!(
            routed_share(100, 9, 4),
            100,
            "more active than total is read as all"
        );
    }
}
