//! Hand-built inputs for the device side's unit tests: a two-pool profile (a GPU's memory and a host pool joined by
//! a link) and tensors of each access class, small enough that every expected number can be worked out by hand.

use crate::model::{Access, DType, Role, SourceFile, TensorEntry};
use crate::profile::{parse_profile, DeviceProfile};

/// A GPU pool of `vram` bytes read at 100 B/s, a host pool of `host` bytes read at 10 B/s, a link at 5 B/s; no
/// bytes taken, overhead 10 and reserve 0 on each pool.
pub(crate) fn two_pools(vram: u64, host: u64) -> DeviceProfile {
    let text = format!(
        r#"
name = "unit"
description = "hand-built"

[[pool]]
id = "vram"
description = "d"
capacity_bytes = {{ value = {vram}, source = "s" }}
taken_bytes = {{ value = 0, source = "s" }}
read_bytes_per_s = {{ value = 100.0, source = "s" }}
runtime_overhead_bytes = {{ value = 10, source = "s" }}
reserve_bytes = {{ value = 0, source = "s" }}

[[pool]]
id = "host"
description = "d"
capacity_bytes = {{ value = {host}, source = "s" }}
taken_bytes = {{ value = 0, source = "s" }}
read_bytes_per_s = {{ value = 10.0, source = "s" }}
runtime_overhead_bytes = {{ value = 10, source = "s" }}
reserve_bytes = {{ value = 0, source = "s" }}

[[link]]
from = "host"
to = "vram"
description = "d"
bulk_bytes_per_s = {{ value = 5.0, source = "s" }}
weight_read_bytes_per_s = {{ value = 5.0, source = "s" }}

[[compute]]
id = "gpu"
kind = "gpu"
description = "d"
pool = "vram"
runs_engine = true
isa = {{ arch = "cuda", sm = 90, source = "s" }}
peak = {{ bf16_flops_per_s = {{ value = 1e6, source = "s" }} }}
"#
    );
    match parse_profile(&SourceFile {
        path: "unit.toml".into(),
        text,
    }) {
        Ok(p) => p,
        Err(e) => panic!("test profile: {e}"),
    }
}

pub(crate) fn tensor(
    name: &str,
    bytes: u64,
    access: Access,
    role: Role,
    layer: Option<u32>,
) -> TensorEntry {
    TensorEntry {
        name: name.into(),
        shape: vec![bytes],
        dtype: DType::F8E4m3,
        bytes,
        params: bytes,
        role,
        access,
        layer,
    }
}

/// embed (gather, 100 B, 1 B rows), vision (50), mtp (30), four hot layers of 100, lm_head (100): 680 bytes.
pub(crate) fn small_model() -> Vec<TensorEntry> {
    let mut v = vec![
        tensor(
            "embed",
            100,
            Access::Gather { row_bytes: 1 },
            Role::Embedding,
            None,
        ),
        tensor(
            "visual",
            50,
            Access::ConditionalImage,
            Role::VisionTower,
            None,
        ),
        tensor(
            "mtp",
            30,
            Access::ConditionalSpeculative,
            Role::MtpHead,
            None,
        ),
    ];
    for l in 0..4 {
        v.push(tensor(
            &format!("layers.{l}"),
            100,
            Access::EveryToken,
            Role::LayerWeight,
            Some(l),
        ));
    }
    v.push(tensor(
        "lm_head",
        100,
        Access::EveryToken,
        Role::LmHead,
        None,
    ));
    v
}

/// Runtime facts of a unit-test model (a plain Llama-style decoder); plans never read them.
pub(crate) fn unit_runtime() -> crate::model::Runtime {
    use crate::model::{Activation, NormForm, OutputGate, RopeStyle, Runtime};
    Runtime {
        prefix: "model".into(),
        embedding: "model.embed_tokens.weight".into(),
        activation: Activation::Silu,
        mlp_gated: true,
        norm: NormForm::Weight,
        norm_eps: 1e-6,
        qk_norm: false,
        output_gate: OutputGate::None,
        sandwich_norms: false,
        rope_style: RopeStyle::Neox,
        mrope: None,
        embedding_scale: None,
        attn_scale: 1.0,
        attn_logit_softcap: None,
        final_logit_softcap: None,
        moe: None,
        linears: Vec::new(),
        bos_token_id: None,
        eos_token_ids: Vec::new(),
    }
}
