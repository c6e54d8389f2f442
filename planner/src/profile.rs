//! Device profiles: the measured facts about one machine that the planner plans against (`profiles/<name>.toml`).
//!
//! A profile lists memory pools (capacity, what is already taken, read bandwidth, the engine's runtime overhead and
//! a reserve), links between pools (bulk rate and the rate offloaded weight reads actually see), and compute units
//! (kind, ISA facts, peak rates, measured kernel rates per weight format). Every number is a [`Measured`] value that
//! carries its `source`, so a reviewer can tell a seed measurement from a provisional guess. Byte quantities are
//! integers of bytes; rates are `f64` bytes (or FLOPs) per second, always with the unit in the field name.
//!
//! [`parse_profile`] rejects unknown keys, non-finite, zero or negative rates, zero-size pools and dangling pool
//! references with an error that points at the offending key in the file.

use std::ops::Range;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::InputError;
use crate::model::SourceFile;

/// A number with the measurement (or document) it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Measured<T> {
    pub value: T,
    /// Where the number comes from: a seed section, a BRIEF table, a calibration run, or "provisional: ..." with why.
    pub source: String,
}

impl<T: Copy> Measured<T> {
    pub fn get(&self) -> T {
        self.value
    }
}

/// One machine, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Short id, equal to the file stem (`ryzen-5090`).
    pub name: String,
    pub description: String,
    /// Memory pools, TOML `[[pool]]`.
    #[serde(rename = "pool")]
    pub pools: Vec<MemoryPool>,
    /// Links between pools, TOML `[[link]]`.
    #[serde(rename = "link", default)]
    pub links: Vec<Link>,
    /// Compute units, TOML `[[compute]]`.
    #[serde(rename = "compute")]
    pub compute: Vec<ComputeUnit>,
}

/// One memory pool (a GPU's VRAM, the host's DRAM, a phone's shared LPDDR).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryPool {
    pub id: String,
    pub description: String,
    pub capacity_bytes: Measured<u64>,
    /// Bytes other software already holds when the engine starts (a desktop compositor, the OS).
    pub taken_bytes: Measured<u64>,
    /// Sustained read bandwidth of the pool as seen by the compute unit attached to it.
    pub read_bytes_per_s: Measured<f64>,
    /// The engine's runtime overhead on this pool (non-tensor allocations, activation peak). A pool without one has
    /// no declared budget: admission refuses to place anything there (it fails closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_overhead_bytes: Option<Measured<u64>>,
    /// Bytes kept free on purpose (allocator slack, what the serving stack holds beyond the measured overhead).
    pub reserve_bytes: Measured<u64>,
}

/// A link that lets a compute unit on pool `to` read weights that live in pool `from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub from: String,
    pub to: String,
    pub description: String,
    /// Pinned bulk copy rate.
    pub bulk_bytes_per_s: Measured<f64>,
    /// The rate offloaded weight reads achieve in a decode step (lower than bulk: per-layer transfers, sync).
    pub weight_read_bytes_per_s: Measured<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ComputeKind {
    Gpu,
    Cpu,
    Npu,
    Igpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    X86_64,
    Aarch64,
    Cuda,
    /// A phone NPU reached through a vendor compiler (QNN HTP).
    Hexagon,
    /// A GPU or NPU reached through a translation layer (DirectML, VitisAI).
    Other,
}

/// ISA facts of a compute unit, as a probe reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IsaFacts {
    pub arch: Arch,
    /// CUDA compute capability as an integer (`120` for sm_120, `90` for sm_90).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm: Option<u32>,
    #[serde(default)]
    pub avx512: bool,
    #[serde(default)]
    pub vnni: bool,
    #[serde(default)]
    pub bf16: bool,
    #[serde(default)]
    pub amx: bool,
    pub source: String,
}

/// Peak arithmetic rates per dtype (FLOP/s or OP/s); absent where unknown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeakRates {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_flops_per_s: Option<Measured<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp32_flops_per_s: Option<Measured<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_flops_per_s: Option<Measured<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8_ops_per_s: Option<Measured<f64>>,
}

/// In-memory weight formats a kernel consumes (see `weight_path`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    Bf16,
    F16,
    F32,
    /// FP8 e4m3 with 128x128 block scales.
    Fp8Block,
    /// modelopt NVFP4 (e2m1, e4m3 per-16 scale, fp32 global).
    Nvfp4,
    /// 4-bit weights, bf16 activations, tinygemm `[N/64][K][32]` layout, asymmetric groups of 64.
    W4a16,
    /// 4-bit symmetric weights (zero point 8), int8 activations, AMX; groups of 128.
    W4a8,
    /// GPTQ int4 as the checkpoint stores it, dequantized in-register.
    Gptq,
    /// 8-bit weights, 16-bit activations: the phone NPU export format.
    W8a16,
}

/// A measured rate of one kernel on one compute unit. When present it bounds the step: decode of bytes held in this
/// unit's pool cannot run faster than `decode_weight_bytes_per_s`, however fast the memory is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelRate {
    pub format: WeightFormat,
    /// The engine whose kernel this rate is (`vllm` for a figure measured through vLLM, `edgefit` for edgefit's own
    /// kernels); absent when it stands for any engine. A plan for one engine uses that engine's entry, else an
    /// entry without an engine, never another engine's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<crate::workload::TargetEngine>,
    /// True when the figure was carried over from a measurement on other hardware (an efficiency measured there
    /// times this unit's bandwidth) rather than measured on this unit: a path that relies on it is unverified.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub extrapolated: bool,
    /// Resident weight bytes the decode step consumes per second with this kernel (a compute term when it is below
    /// the pool's read bandwidth).
    pub decode_weight_bytes_per_s: Measured<f64>,
    /// Marginal rate of weight bytes offloaded to another pool under this kernel, when it was measured (an offload
    /// sweep's slope); the link's own rate applies otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloaded_weight_bytes_per_s: Option<Measured<f64>>,
    /// Sustained FLOP/s of this kernel on prompt processing, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_flops_per_s: Option<Measured<f64>>,
    /// Sustained FLOP/s on prompt processing when the plan gives the prompt's activations int8
    /// (`weight_path.prefill`, the W4A16 integer GEMM on VNNI), when measured; `prefill_flops_per_s` is then the
    /// int16 figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_int8_flops_per_s: Option<Measured<f64>>,
    /// KV-cache bytes a decode step's attention consumes per second on this path, when measured (the step's growth
    /// with context over the cache bytes added). When present, the measured decode term is the weights at
    /// `decode_weight_bytes_per_s` plus every sequence's caches at this rate, one after the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_cache_bytes_per_s: Option<Measured<f64>>,
}

impl ComputeUnit {
    /// The unit's kernel rate for `format` under `engine`: that engine's entry, else an entry for any engine.
    pub fn kernel_rate(
        &self,
        format: WeightFormat,
        engine: crate::workload::TargetEngine,
    ) -> Option<&KernelRate> {
        let of = |e: Option<crate::workload::TargetEngine>| {
            self.kernels
                .iter()
                .find(|k| k.format == format && k.engine == e)
        };
        of(Some(engine)).or_else(|| of(None))
    }
}

/// One compute unit (GPU, CPU, NPU, iGPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ComputeUnit {
    pub id: String,
    pub kind: ComputeKind,
    pub description: String,
    /// The pool this unit reads at the pool's full rate.
    pub pool: String,
    /// Whether edgefit's engine executes on this unit. A phone NPU is an export target: the deliverable is a graph.
    pub runs_engine: bool,
    pub isa: IsaFacts,
    #[serde(default)]
    pub peak: PeakRates,
    /// Measured kernel rates, TOML `[[compute.kernel]]`.
    #[serde(rename = "kernel", default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelRate>,
    /// Seconds a kernel costs beyond its work (launch, ramp, tail): the floor under every kernel of a step. A
    /// decode step cannot be faster than its kernel count times this, which is what bounds small models on big
    /// GPUs. Absent: no floor is charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_floor_s: Option<Measured<f64>>,
}

impl DeviceProfile {
    pub fn pool(&self, id: &str) -> Option<&MemoryPool> {
        self.pools.iter().find(|p| p.id == id)
    }

    /// The link from pool `from` to pool `to`, if the profile declares one.
    pub fn link(&self, from: &str, to: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.from == from && l.to == to)
    }

    /// The unit decode runs on: the engine-capable unit with the fastest pool (BRIEF §2: for decode, one device, the
    /// one with the bandwidth). Falls back to the fastest unit of any kind when none runs the engine (a phone, whose
    /// plan is an export).
    pub fn decode_unit(&self) -> &ComputeUnit {
        let rate = |c: &ComputeUnit| self.pool(&c.pool).map_or(0.0, |p| p.read_bytes_per_s.value);
        let best = |engine_only: bool| {
            self.compute
                .iter()
                .filter(|c| !engine_only || c.runs_engine)
                .max_by(|a, b| rate(a).total_cmp(&rate(b)))
        };
        // `parse_profile` guarantees at least one compute unit.
        best(true)
            .or_else(|| best(false))
            .unwrap_or(&self.compute[0])
    }
}

/// Parse and validate a profile. The error names the file and points at the key.
pub fn parse_profile(file: &SourceFile) -> Result<DeviceProfile, InputError> {
    let profile: DeviceProfile = toml::from_str(&file.text).map_err(|e| {
        InputError::new(
            &file.path,
            &file.text,
            format!("invalid device profile: {}", e.message().trim()),
        )
        .at(e.span(), "here")
    })?;
    validate(&profile)
        .and_then(|()| check_name(&profile, &file.path))
        .map_err(|v| {
            let span = span_of(&file.text, &v.path);
            InputError::new(&file.path, &file.text, v.message).at(span, v.expected)
        })?;
    Ok(profile)
}

/// One element of a path into the TOML document.
#[derive(Debug, Clone)]
pub(crate) enum Seg {
    Key(&'static str),
    Index(usize),
}

pub(crate) struct Violation {
    pub(crate) path: Vec<Seg>,
    pub(crate) message: String,
    pub(crate) expected: String,
}

fn violation(path: Vec<Seg>, message: impl Into<String>, expected: impl Into<String>) -> Violation {
    Violation {
        path,
        message: message.into(),
        expected: expected.into(),
    }
}

/// The span of the value at `path`, falling back to the nearest ancestor that has one.
pub(crate) fn span_of(text: &str, path: &[Seg]) -> Option<Range<usize>> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut item = doc.as_item();
    let mut best = None;
    for seg in path {
        let next = match seg {
            Seg::Key(k) => item.get(k),
            Seg::Index(i) => item.get(i),
        };
        match next {
            Some(n) => {
                item = n;
                if let Some(s) = n.span() {
                    best = Some(s);
                }
            }
            None => break,
        }
    }
    best
}

fn check_rate(path: Vec<Seg>, what: &str, m: &Measured<f64>) -> Result<(), Violation> {
    let mut p = path;
    if !m.value.is_finite() || m.value <= 0.0 {
        p.push(Seg::Key("value"));
        return Err(violation(
            p,
            format!("{what} must be a finite rate above zero, got {}", m.value),
            "a positive, finite number",
        ));
    }
    check_source(p, m)
}

fn check_source<T>(mut path: Vec<Seg>, m: &Measured<T>) -> Result<(), Violation> {
    if m.source.trim().is_empty() {
        path.push(Seg::Key("source"));
        return Err(violation(
            path,
            "every measured number needs a source",
            "which seed table, calibration run, or 'provisional: why'",
        ));
    }
    Ok(())
}

fn validate(p: &DeviceProfile) -> Result<(), Violation> {
    if p.pools.is_empty() {
        return Err(violation(
            vec![Seg::Key("pool")],
            "a profile needs at least one [[pool]]",
            "a [[pool]] table",
        ));
    }
    if p.compute.is_empty() {
        return Err(violation(
            vec![Seg::Key("compute")],
            "a profile needs at least one [[compute]] unit",
            "a [[compute]] table",
        ));
    }
    for (i, pool) in p.pools.iter().enumerate() {
        let at = |k: &'static str| vec![Seg::Key("pool"), Seg::Index(i), Seg::Key(k)];
        if p.pools[..i].iter().any(|q| q.id == pool.id) {
            return Err(violation(
                at("id"),
                format!("duplicate pool id `{}`", pool.id),
                "a unique id",
            ));
        }
        if pool.capacity_bytes.value == 0 {
            let mut path = at("capacity_bytes");
            path.push(Seg::Key("value"));
            return Err(violation(
                path,
                format!("pool `{}` has zero capacity", pool.id),
                "a size in bytes above zero",
            ));
        }
        check_source(at("capacity_bytes"), &pool.capacity_bytes)?;
        if pool.taken_bytes.value > pool.capacity_bytes.value {
            let mut path = at("taken_bytes");
            path.push(Seg::Key("value"));
            return Err(violation(
                path,
                format!(
                    "pool `{}` has more bytes taken ({}) than it holds ({})",
                    pool.id, pool.taken_bytes.value, pool.capacity_bytes.value
                ),
                "at most capacity_bytes",
            ));
        }
        check_source(at("taken_bytes"), &pool.taken_bytes)?;
        check_source(at("reserve_bytes"), &pool.reserve_bytes)?;
        if let Some(o) = &pool.runtime_overhead_bytes {
            check_source(at("runtime_overhead_bytes"), o)?;
        }
        check_rate(
            at("read_bytes_per_s"),
            "read_bytes_per_s",
            &pool.read_bytes_per_s,
        )?;
    }
    for (i, link) in p.links.iter().enumerate() {
        let at = |k: &'static str| vec![Seg::Key("link"), Seg::Index(i), Seg::Key(k)];
        for (key, id) in [("from", &link.from), ("to", &link.to)] {
            if p.pool(id).is_none() {
                return Err(unknown_pool(p, at(key), id));
            }
        }
        check_rate(
            at("bulk_bytes_per_s"),
            "bulk_bytes_per_s",
            &link.bulk_bytes_per_s,
        )?;
        check_rate(
            at("weight_read_bytes_per_s"),
            "weight_read_bytes_per_s",
            &link.weight_read_bytes_per_s,
        )?;
        let effective = link.weight_read_bytes_per_s.value;
        if effective > link.bulk_bytes_per_s.value {
            let mut path = at("weight_read_bytes_per_s");
            path.push(Seg::Key("value"));
            return Err(violation(
                path,
                format!(
                    "link `{}`->`{}` reads weights faster than its bulk rate",
                    link.from, link.to
                ),
                format!(
                    "at most bulk_bytes_per_s ({:e})",
                    link.bulk_bytes_per_s.value
                ),
            ));
        }
        let to_rate = p
            .pool(&link.to)
            .map_or(f64::INFINITY, |q| q.read_bytes_per_s.value);
        if effective > to_rate {
            let mut path = at("weight_read_bytes_per_s");
            path.push(Seg::Key("value"));
            return Err(violation(
                path,
                format!(
                    "link `{}`->`{}` reads weights faster than pool `{}` itself: offloading would look faster than \
                     residency",
                    link.from, link.to, link.to
                ),
                format!("at most the read rate of `{}` ({to_rate:e})", link.to),
            ));
        }
    }
    for (i, unit) in p.compute.iter().enumerate() {
        let at = |k: &'static str| vec![Seg::Key("compute"), Seg::Index(i), Seg::Key(k)];
        if p.compute[..i].iter().any(|c| c.id == unit.id) {
            return Err(violation(
                at("id"),
                format!("duplicate compute id `{}`", unit.id),
                "a unique id",
            ));
        }
        if p.pool(&unit.pool).is_none() {
            return Err(unknown_pool(p, at("pool"), &unit.pool));
        }
        if let Some(f) = &unit.kernel_floor_s {
            check_rate(at("kernel_floor_s"), "kernel_floor_s", f)?;
            check_source(at("kernel_floor_s"), f)?;
        }
        if unit.isa.source.trim().is_empty() {
            let mut path = at("isa");
            path.push(Seg::Key("source"));
            return Err(violation(
                path,
                "ISA facts need a source",
                "the probe or document they come from",
            ));
        }
        let p_ = &unit.peak;
        let any_peak = p_.bf16_flops_per_s.is_some()
            || p_.fp32_flops_per_s.is_some()
            || p_.fp8_flops_per_s.is_some()
            || p_.int8_ops_per_s.is_some();
        if unit.runs_engine && !any_peak {
            return Err(violation(
                at("runs_engine"),
                format!("compute unit `{}` runs the engine but declares no peak rate", unit.id),
                "a [compute.peak] rate (bf16_flops_per_s, fp32_flops_per_s, fp8_flops_per_s or int8_ops_per_s)",
            ));
        }
        let peaks = [
            ("bf16_flops_per_s", &unit.peak.bf16_flops_per_s),
            ("fp32_flops_per_s", &unit.peak.fp32_flops_per_s),
            ("fp8_flops_per_s", &unit.peak.fp8_flops_per_s),
            ("int8_ops_per_s", &unit.peak.int8_ops_per_s),
        ];
        for (key, rate) in peaks {
            if let Some(r) = rate {
                let mut path = at("peak");
                path.push(Seg::Key(key));
                check_rate(path, key, r)?;
            }
        }
        for (k, kernel) in unit.kernels.iter().enumerate() {
            let base = |key: &'static str| {
                vec![
                    Seg::Key("compute"),
                    Seg::Index(i),
                    Seg::Key("kernel"),
                    Seg::Index(k),
                    Seg::Key(key),
                ]
            };
            check_rate(
                base("decode_weight_bytes_per_s"),
                "decode_weight_bytes_per_s",
                &kernel.decode_weight_bytes_per_s,
            )?;
            if let Some(r) = &kernel.offloaded_weight_bytes_per_s {
                check_rate(
                    base("offloaded_weight_bytes_per_s"),
                    "offloaded_weight_bytes_per_s",
                    r,
                )?;
                if r.value > kernel.decode_weight_bytes_per_s.value {
                    let mut path = base("offloaded_weight_bytes_per_s");
                    path.push(Seg::Key("value"));
                    return Err(violation(
                        path,
                        "a kernel cannot consume offloaded weights faster than resident ones",
                        "at most decode_weight_bytes_per_s",
                    ));
                }
            }
            if let Some(r) = &kernel.prefill_flops_per_s {
                check_rate(base("prefill_flops_per_s"), "prefill_flops_per_s", r)?;
            }
            if let Some(r) = &kernel.prefill_int8_flops_per_s {
                check_rate(
                    base("prefill_int8_flops_per_s"),
                    "prefill_int8_flops_per_s",
                    r,
                )?;
            }
            if let Some(r) = &kernel.decode_cache_bytes_per_s {
                check_rate(
                    base("decode_cache_bytes_per_s"),
                    "decode_cache_bytes_per_s",
                    r,
                )?;
            }
        }
    }
    Ok(())
}

/// A profile's `name` is the id users type (`--device ryzen-5090`) and plans record, so it must match the file's
/// stem; a copied profile that kept the old name would otherwise plan under the wrong id.
fn check_name(p: &DeviceProfile, path: &str) -> Result<(), Violation> {
    let stem = path
        .rsplit(['/', '\\'])
        .next()
        .and_then(|f| f.strip_suffix(".toml"));
    match stem {
        Some(stem) if stem != p.name => Err(violation(
            vec![Seg::Key("name")],
            format!(
                "profile name `{}` does not match its file name `{stem}.toml`",
                p.name
            ),
            format!("name = \"{stem}\""),
        )),
        _ => Ok(()),
    }
}

fn unknown_pool(p: &DeviceProfile, path: Vec<Seg>, id: &str) -> Violation {
    let known: Vec<&str> = p.pools.iter().map(|q| q.id.as_str()).collect();
    violation(
        path,
        format!("unknown pool `{id}`"),
        format!("one of: {}", known.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const MINIMAL: &str = r#"
name = "t"
description = "test"

[[pool]]
id = "vram"
description = "d"
capacity_bytes = { value = 1000, source = "s" }
taken_bytes = { value = 0, source = "s" }
read_bytes_per_s = { value = 1e9, source = "s" }
runtime_overhead_bytes = { value = 10, source = "s" }
reserve_bytes = { value = 0, source = "s" }

[[compute]]
id = "gpu"
kind = "gpu"
description = "d"
pool = "vram"
runs_engine = true
isa = { arch = "cuda", sm = 90, source = "s" }
peak = { bf16_flops_per_s = { value = 1e12, source = "s" } }
"#;

    fn parse(text: &str) -> Result<DeviceProfile, InputError> {
        parse_profile(&SourceFile {
            path: "profiles/t.toml".into(),
            text: text.into(),
        })
    }

    fn line_of(text: &str, needle: &str) -> usize {
        text.lines()
            .position(|l| l.contains(needle))
            .map(|i| i + 1)
            .unwrap_or(0)
    }

    #[test]
    fn minimal_profile_parses() {
        let p = parse(MINIMAL).unwrap();
        assert_eq!(p.pools[0].read_bytes_per_s.value, 1e9);
        assert_eq!(p.decode_unit().id, "gpu");
    }

    #[test]
    fn negative_rate_points_at_its_line() {
        let text = MINIMAL.replace("value = 1e9,", "value = -1e9,");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("read_bytes_per_s"), "{}", e.message);
        assert_eq!(e.line(), Some(line_of(&text, "read_bytes_per_s")));
    }

    #[test]
    fn nan_rate_is_rejected() {
        let text = MINIMAL.replace("value = 1e9,", "value = nan,");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("finite"), "{}", e.message);
        assert_eq!(e.line(), Some(line_of(&text, "read_bytes_per_s")));
    }

    #[test]
    fn zero_pool_is_rejected() {
        let text = MINIMAL.replace("value = 1000", "value = 0");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("zero capacity"), "{}", e.message);
        assert_eq!(e.line(), Some(line_of(&text, "capacity_bytes")));
    }

    #[test]
    fn unknown_key_is_rejected_with_its_line() {
        let text = MINIMAL.replace("runs_engine = true", "runs_engine = true\nturbo = 1");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("unknown field `turbo`"), "{}", e.message);
        assert_eq!(e.line(), Some(line_of(&text, "turbo")));
    }

    #[test]
    fn dangling_pool_reference_lists_the_known_pools() {
        let text = MINIMAL.replace("pool = \"vram\"", "pool = \"hbm\"");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("unknown pool `hbm`"), "{}", e.message);
        assert!(e.label.contains("vram"), "{}", e.label);
        assert_eq!(e.line(), Some(line_of(&text, "pool = \"hbm\"")));
    }

    #[test]
    fn taken_above_capacity_is_rejected() {
        let text = MINIMAL.replace("taken_bytes = { value = 0", "taken_bytes = { value = 5000");
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("more bytes taken"), "{}", e.message);
    }

    #[test]
    fn empty_source_is_rejected() {
        let text = MINIMAL.replace(
            "read_bytes_per_s = { value = 1e9, source = \"s\" }",
            "read_bytes_per_s = { value = 1e9, source = \" \" }",
        );
        let e = parse(&text).unwrap_err();
        assert!(e.message.contains("source"), "{}", e.message);
        assert_eq!(e.line(), Some(line_of(&text, "read_bytes_per_s")));
    }

    #[test]
    fn malformed_toml_is_a_syntax_error_with_a_line() {
        let text = MINIMAL.replace("kind = \"gpu\"", "kind = \"gpu");
        let e = parse(&text).unwrap_err();
        assert!(
            e.message.starts_with("invalid device profile"),
            "{}",
            e.message
        );
        assert!(e.line().is_some());
    }

    #[test]
    fn a_link_faster_than_its_bulk_rate_is_rejected() {
        let text = format!(
            "{MINIMAL}\n[[pool]]\nid = \"dram\"\ndescription = \"d\"\ncapacity_bytes = {{ value = 10, source = \"s\" }}\n\
             taken_bytes = {{ value = 0, source = \"s\" }}\nread_bytes_per_s = {{ value = 1e8, source = \"s\" }}\n\
             reserve_bytes = {{ value = 0, source = \"s\" }}\n\n[[link]]\nfrom = \"dram\"\nto = \"vram\"\n\
             description = \"d\"\nbulk_bytes_per_s = {{ value = 1e7, source = \"s\" }}\n\
             weight_read_bytes_per_s = {{ value = 2e7, source = \"s\" }}\n"
        );
        let e = parse(&text).unwrap_err();
        assert!(
            e.message.contains("faster than its bulk rate"),
            "{}",
            e.message
        );
        assert_eq!(e.line(), Some(line_of(&text, "weight_read_bytes_per_s")));
        let ok = text.replace("value = 2e7", "value = 1e7");
        assert!(parse(&ok).is_ok());
        let too_fast = ok.replace("value = 1e7", "value = 5e9");
        let e = parse(&too_fast).unwrap_err();
        assert!(
            e.message.contains("faster than pool `vram`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn name_must_match_the_file_stem() {
        let e = parse_profile(&SourceFile {
            path: "profiles/other.toml".into(),
            text: MINIMAL.into(),
        })
        .unwrap_err();
        assert!(
            e.message
                .contains("does not match its file name `other.toml`"),
            "{}",
            e.message
        );
        assert_eq!(e.line(), Some(line_of(MINIMAL, "name = \"t\"")));
        let ok = SourceFile {
            path: "somewhere/t.toml".into(),
            text: MINIMAL.into(),
        };
        assert!(parse_profile(&ok).is_ok());
    }

    #[test]
    fn decode_unit_prefers_the_engine_unit_with_the_fastest_pool() {
        let mut p = parse(MINIMAL).unwrap();
        let mut host = p.pools[0].clone();
        host.id = "dram".into();
        host.read_bytes_per_s.value = 5e10;
        p.pools.push(host);
        let mut cpu = p.compute[0].clone();
        cpu.id = "cpu".into();
        cpu.pool = "dram".into();
        p.compute.push(cpu);
        assert_eq!(p.decode_unit().id, "cpu");
        p.compute[1].runs_engine = false;
        assert_eq!(p.decode_unit().id, "gpu");
    }
}
