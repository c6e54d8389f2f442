//! The GPU benchmark's half that needs no GPU: its arguments, the plan of cases (names and shapes), the timing
//! statistics, the JSON it writes and the table it prints. `benches/gpu.rs` runs the plan on a device;
//! `tests/gpu_bench_report.rs` checks this half on any machine, so a run on the lent GPU cannot fail on a typo here.

#![allow(dead_code)]

use std::fmt::Write as _;

use serde_json::{json, Value};

/// Command-line options of the benchmark binary.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Opts {
    /// Fewer shapes and rounds (about a quarter of the full run's time).
    pub(crate) quick: bool,
    /// Where to write the JSON results.
    pub(crate) json: Option<String>,
    /// Only the rows whose name contains one of these (any of them), as `cargo bench` passes a filter.
    pub(crate) filters: Vec<String>,
    /// Print the plan's row names and exit (no device needed).
    pub(crate) list: bool,
    /// Timed rounds per row (median and spread over them).
    pub(crate) rounds: usize,
    /// Target milliseconds of one timed round (the launches per round follow from it).
    pub(crate) round_ms: f64,
}

pub(crate) const USAGE: &str = "usage: gpu [--quick] [--json PATH] [--filter SUBSTR]... [--rounds N] [--round-ms MS] \
[--list] [SUBSTR]...\n  Times the public kernels::cuda::Gpu calls the engine makes; prints a table last.\n  \
A bare SUBSTR is a name filter, as `cargo bench -- SUBSTR` passes it; `--bench` (cargo's) is ignored.";

impl Opts {
    /// Parses the arguments after the program name. `Ok(None)` means `--help`.
    pub(crate) fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            quick: false,
            json: None,
            filters: Vec::new(),
            list: false,
            rounds: 0,
            round_ms: 0.0,
        };
        let mut rounds = None;
        let mut round_ms = None;
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
            match a.as_str() {
                "--quick" => o.quick = true,
                "--list" => o.list = true,
                "--bench" => {}
                "-h" | "--help" => return Ok(None),
                "--json" => o.json = Some(value("--json")?),
                "--filter" => o.filters.push(value("--filter")?),
                "--rounds" => {
                    let v = value("--rounds")?;
                    let n: usize = v
                        .parse()
                        .map_err(|_| format!("--rounds: `{v}` is not a count"))?;
                    if !(1..=1000).contains(&n) {
                        return Err(format!("--rounds: {n} is outside 1..=1000"));
                    }
                    rounds = Some(n);
                }
                "--round-ms" => {
                    let v = value("--round-ms")?;
                    let ms: f64 = v
                        .parse()
                        .map_err(|_| format!("--round-ms: `{v}` is not a number"))?;
                    if !(ms > 0.0 && ms <= 1000.0) {
                        return Err(format!("--round-ms: {v} is outside (0, 1000]"));
                    }
                    round_ms = Some(ms);
                }
                s if s.starts_with('-') => return Err(format!("unknown option `{s}`\n{USAGE}")),
                s => o.filters.push(s.to_string()),
            }
        }
        // The Python benchmarks took 11 rounds (5 with --quick); the same here, so spreads compare.
        o.rounds = rounds.unwrap_or(if o.quick { 5 } else { 11 });
        o.round_ms = round_ms.unwrap_or(if o.quick { 1.5 } else { 3.0 });
        Ok(Some(o))
    }

    /// Whether a row of this name is selected.
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }
}

/// One group of rows that share their setup (weights uploaded once, then one row per token count).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Group {
    /// The family: which runner of `benches/gpu.rs` runs it and which baseline Python pairs with it.
    pub(crate) family: &'static str,
    /// The shape parameters shared by the group's rows, in order.
    pub(crate) shape: Vec<(&'static str, usize)>,
    /// The varying parameter (`m` tokens, `b` sequences, ...) and its values, one row each; empty for one row.
    pub(crate) sweep: (&'static str, Vec<usize>),
}

impl Group {
    fn new(
        family: &'static str,
        shape: &[(&'static str, usize)],
        sweep: (&'static str, &[usize]),
    ) -> Group {
        Group {
            family,
            shape: shape.to_vec(),
            sweep: (sweep.0, sweep.1.to_vec()),
        }
    }

    /// A shape parameter by name (every runner reads the ones its family has; a missing one is a plan bug).
    pub(crate) fn get(&self, key: &str) -> usize {
        self.shape
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("plan: group {} has no `{key}`", self.family))
    }

    /// The row names and the sweep value of each: `family/k1=v1,k2=v2/m=4`.
    pub(crate) fn rows(&self) -> Vec<(String, usize)> {
        let shape: Vec<String> = self.shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let base = format!("{}/{}", self.family, shape.join(","));
        if self.sweep.1.is_empty() {
            return vec![(base, 0)];
        }
        self.sweep
            .1
            .iter()
            .map(|&v| (format!("{base}/{}={v}", self.sweep.0), v))
            .collect()
    }
}

/// The decode GEMV shapes of Qwen3.8-27B (n x k): down projection, gate/up (one of the two), the attention / GDN
/// projections' class and the lm_head, the four rows of `benchmarks/h200.md`.
pub(crate) const GEMV_SHAPES: [(usize, usize); 4] =
    [(5120, 17408), (17408, 5120), (5120, 10240), (248320, 5120)];

/// Every row the benchmark can run, in run order. `quick` keeps the shapes the table's targets name and fewer
/// token counts.
pub(crate) fn plan(quick: bool) -> Vec<Group> {
    let pick = |full: &'static [usize], q: &'static [usize]| if quick { q } else { full };
    let ms = pick(&[1, 2, 4, 8, 16], &[1, 4, 16]);
    let mut g = vec![Group::new("copy", &[("mib", 256)], ("", &[]))];
    for &(n, k) in &GEMV_SHAPES {
        g.push(Group::new("fp8_gemv", &[("n", n), ("k", k)], ("m", ms)));
    }
    for &(n, k) in &GEMV_SHAPES {
        g.push(Group::new("nvfp4_gemv", &[("n", n), ("k", k)], ("m", ms)));
    }
    // The GEMV alone on fragments a producer wrote, and the producer + GEMV decode step, both through the public
    // producer calls (`rmsnorm_*_fragments` for a 5120-wide input, `silu_and_mul_*_fragments` for the MLP's).
    for &(n, k) in &GEMV_SHAPES {
        g.push(Group::new(
            "fp8_gemv_frag",
            &[("n", n), ("k", k)],
            ("m", &[1, 4, 16]),
        ));
        g.push(Group::new(
            "fp8_step",
            &[("n", n), ("k", k)],
            ("m", &[1, 4, 16]),
        ));
        g.push(Group::new(
            "nvfp4_gemv_frag",
            &[("n", n), ("k", k)],
            ("m", &[1, 4, 16]),
        ));
    }
    // The NVFP4 decode steps in one call against the unfused producer + GEMV (h200.md's step table). The norm
    // step reads the hidden state (k = 5120, the fused norm's limit is 8192) into gate/up and the GDN input
    // projection; the SiLU step feeds the down projection.
    for (fams, shapes) in [
        (
            ["nvfp4_step_norm", "nvfp4_unfused_norm"],
            [(17408, 5120), (10240, 5120)],
        ),
        (
            ["nvfp4_step_silu", "nvfp4_unfused_silu"],
            [(5120, 17408), (5120, 10240)],
        ),
    ] {
        for &(n, k) in &shapes {
            for fam in fams {
                g.push(Group::new(fam, &[("n", n), ("k", k)], ("m", &[1, 4])));
            }
        }
    }
    // The bf16 lm_head of the FP8 27B build and a bf16 model's MLP-sized matrix.
    for &(n, k) in &[(248320, 5120), (17408, 5120)] {
        g.push(Group::new(
            "bf16_gemv",
            &[("n", n), ("k", k)],
            ("m", pick(&[1, 4, 16], &[1])),
        ));
    }
    // Prefill GEMMs (rows: tokens).
    let gemm_ms = pick(&[4096, 2048, 512], &[4096]);
    for &(n, k) in &[(5120, 17408), (17408, 5120)] {
        g.push(Group::new("fp8_quant", &[("k", k)], ("m", gemm_ms)));
        g.push(Group::new(
            "fp8_gemm",
            &[("n", n), ("k", k)],
            ("m", gemm_ms),
        ));
        if cfg!(feature = "lab") {
            g.push(Group::new(
                "fp8_gemm_bf16",
                &[("n", n), ("k", k)],
                ("m", gemm_ms),
            ));
        }
        g.push(Group::new(
            "nvfp4_gemm",
            &[("n", n), ("k", k)],
            ("m", gemm_ms),
        ));
    }
    // Gated DeltaNet at the 27B's geometry (16 key heads, 48 value heads, 128 x 128, conv 4).
    g.push(Group::new(
        "gdn_decode",
        &[("hk", 16), ("hv", 48)],
        ("b", pick(&[1, 2, 3, 4, 8, 16, 32], &[1, 8, 32])),
    ));
    for &t in pick(&[1024, 4096, 16384], &[4096]) {
        g.push(Group::new(
            "gdn_prefill",
            &[("hk", 16), ("hv", 48), ("t", t)],
            ("seqs", &[1]),
        ));
    }
    g.push(Group::new(
        "gdn_prefill",
        &[("hk", 16), ("hv", 48), ("t", 9216)],
        ("seqs", &[4]),
    ));
    // The f16 split build (fla's precision class, not `Auto`'s), a lab variant.
    if cfg!(feature = "lab") {
        for &t in pick(&[1024, 4096, 16384], &[4096]) {
            g.push(Group::new(
                "gdn_prefill_f16",
                &[("hk", 16), ("hv", 48), ("t", t)],
                ("seqs", &[1]),
            ));
        }
        g.push(Group::new(
            "gdn_prefill_f16",
            &[("hk", 16), ("hv", 48), ("t", 9216)],
            ("seqs", &[4]),
        ));
    }
    // Attention: the 27B's full layers (24 q / 4 kv heads x 256), pages of 64 tokens.
    let ctxs = pick(&[4096, 8192, 32768, 65536, 131072], &[4096, 32768]);
    g.push(Group::new(
        "attn_decode",
        &[("b", 1), ("hq", 24), ("hkv", 4), ("d", 256), ("page", 64)],
        ("ctx", ctxs),
    ));
    g.push(Group::new(
        "attn_decode",
        &[("b", 8), ("hq", 24), ("hkv", 4), ("d", 256), ("page", 64)],
        ("ctx", &[8192]),
    ));
    g.push(Group::new(
        "attn_decode",
        &[("b", 32), ("hq", 24), ("hkv", 4), ("d", 256), ("page", 64)],
        ("ctx", &[4096]),
    ));
    let ts = pick(&[1024, 4096, 16384], &[4096]);
    for &(hq, hkv, d) in &[(24, 4, 256), (32, 8, 128), (32, 8, 64)] {
        g.push(Group::new(
            "attn_prefill",
            &[("hq", hq), ("hkv", hkv), ("d", d), ("window", 0)],
            ("t", ts),
        ));
    }
    g.push(Group::new(
        "attn_prefill",
        &[("hq", 24), ("hkv", 4), ("d", 256), ("window", 1024)],
        ("t", &[16384]),
    ));
    g.push(Group::new(
        "attn_prefill_paged",
        &[
            ("hq", 24),
            ("hkv", 4),
            ("d", 256),
            ("page", 64),
            ("prefix", 8192),
        ],
        ("t", &[2048]),
    ));
    // The small ops at one token and at a 4096-token prefill chunk (hidden 5120, MLP 17408, vocab 248320).
    let rows: &[usize] = &[1, 4096];
    for fam in ["rmsnorm", "add_rmsnorm", "rmsnorm_f32", "add_rmsnorm_f32"] {
        g.push(Group::new(fam, &[("dim", 5120)], ("rows", rows)));
    }
    for fam in ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul_f32"] {
        g.push(Group::new(fam, &[("inter", 17408)], ("rows", rows)));
    }
    for fam in ["cast_f32_to_bf16", "cast_bf16_to_f32"] {
        g.push(Group::new(fam, &[("dim", 5120)], ("rows", rows)));
    }
    g.push(Group::new("sigmoid_gate", &[("dim", 6144)], ("rows", rows)));
    g.push(Group::new(
        "sigmoid_head_gate",
        &[("heads", 8), ("d", 256)],
        ("rows", rows),
    ));
    g.push(Group::new(
        "rope_neox",
        &[("heads", 24), ("d", 256), ("rot", 64)],
        ("rows", rows),
    ));
    g.push(Group::new(
        "embedding_gather",
        &[("vocab", 248320), ("dim", 5120)],
        ("rows", rows),
    ));
    g.push(Group::new(
        "argmax",
        &[("vocab", 248320)],
        ("rows", &[1, 16]),
    ));
    g.push(Group::new(
        "sample",
        &[("vocab", 248320), ("top_k", 20)],
        ("rows", &[1, 16]),
    ));
    g
}

/// Median and spread ((max - min) / median, as the Python benchmarks report it) of per-call seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Stats {
    pub(crate) median: f64,
    pub(crate) spread: f64,
}

impl Stats {
    pub(crate) fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        };
        let spread = if median > 0.0 {
            (v[n - 1] - v[0]) / median
        } else {
            f64::NAN
        };
        Some(Stats { median, spread })
    }
}

/// One measured (or failed) row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) family: &'static str,
    /// The public `Gpu` call(s) timed.
    pub(crate) call: &'static str,
    /// Shape parameters, the sweep's last.
    pub(crate) params: Vec<(&'static str, usize)>,
    /// "graph" (the calls captured in a CUDA graph and replayed, as the engine's decode runs) or "eager".
    pub(crate) timing: &'static str,
    /// Calls per timed round and rounds.
    pub(crate) reps: usize,
    pub(crate) rounds: usize,
    /// Input sets rotated over (to read weights from HBM, not the 50-60 MB L2).
    pub(crate) sets: usize,
    pub(crate) stats: Option<Stats>,
    /// Bytes the call must move (weights and scales once, activations, outputs) and FLOPs, where they mean
    /// something for the row.
    pub(crate) bytes: Option<f64>,
    pub(crate) flops: Option<f64>,
    pub(crate) error: Option<String>,
}

impl Row {
    pub(crate) fn us(&self) -> Option<f64> {
        self.stats.map(|s| s.median * 1e6)
    }
    pub(crate) fn gbps(&self) -> Option<f64> {
        Some(self.bytes? / self.stats?.median / 1e9)
    }
    pub(crate) fn tflops(&self) -> Option<f64> {
        Some(self.flops? / self.stats?.median / 1e12)
    }
    /// The row's bytes per second over the copy bandwidth measured in the same run.
    pub(crate) fn of_copy(&self, copy_gbps: Option<f64>) -> Option<f64> {
        Some(self.gbps()? / copy_gbps?)
    }
}

/// The whole run, as written to JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    pub(crate) device: Option<String>,
    pub(crate) skipped: Option<String>,
    pub(crate) quick: bool,
    /// Device-to-device copy bandwidth (read + write) through `Gpu::copy`, the memory-bound rows' floor.
    pub(crate) copy_gbps: Option<f64>,
    pub(crate) rows: Vec<Row>,
}

impl Report {
    /// The JSON `kernels/bench/h200/baselines.py` reads (schema `edgefit-gpu-bench/1`): one object per row with
    /// its name, family, call, params, median microseconds and spread, bytes/s and FLOP/s, and the fraction of the
    /// run's copy bandwidth; `null` where a figure does not apply or the row failed (`error` says why).
    pub(crate) fn to_json(&self) -> String {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let params: serde_json::Map<String, Value> =
                    r.params.iter().map(|&(k, v)| (k.to_string(), json!(v))).collect();
                json!({
                    "name": r.name, "family": r.family, "call": r.call, "params": params,
                    "timing": r.timing, "reps": r.reps, "rounds": r.rounds, "sets": r.sets,
                    "us": r.us(), "spread": r.stats.map(|s| s.spread), "bytes": r.bytes, "flops": r.flops,
                    "GBps": r.gbps(), "TFLOPs": r.tflops(), "of_copy": r.of_copy(self.copy_gbps),
                    "error": r.error,
                })
            })
            .collect();
        let v = json!({
            "schema": "edgefit-gpu-bench/1",
            "device": self.device,
            "skipped": self.skipped,
            "quick": self.quick,
            "copy_GBps": self.copy_gbps,
            "rows": rows,
        });
        // serde_json writes a non-finite f64 as null, which is what a figure that does not exist should read as.
        serde_json::to_string_pretty(&v).expect("a JSON value always serialises") + "\n"
    }

    /// The short table printed last: one line per row, microseconds with spread, bytes/s and the fraction of
    /// copy, FLOP/s.
    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "GPU benchmark through kernels::cuda::Gpu on {}; copy {} GB/s (read + write, Gpu::copy)",
            self.device.as_deref().unwrap_or("no device"),
            self.copy_gbps.map_or("-".to_string(), |c| format!("{c:.0}"))
        );
        let w = self
            .rows
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            s,
            "{:w$} | {:>10} | {:>6} | {:>7} | {:>7} | {:>8} | timing",
            "row", "us", "spread", "GB/s", "of copy", "TFLOP/s"
        );
        for r in &self.rows {
            let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |x| format!("{x:.p$}"));
            if let Some(e) = &r.error {
                let _ = writeln!(
                    s,
                    "{:w$} | FAILED: {}",
                    r.name,
                    e.lines().next().unwrap_or("")
                );
                continue;
            }
            let _ = writeln!(
                s,
                "{:w$} | {:>10} | {:>5}% | {:>7} | {:>6}% | {:>8} | {} x{}",
                r.name,
                f(r.us(), 2),
                f(r.stats.map(|s| s.spread * 100.0), 1),
                f(r.gbps(), 0),
                f(r.of_copy(self.copy_gbps).map(|x| x * 100.0), 1),
                f(r.tflops(), 1),
                r.timing,
                r.reps
            );
        }
        s
    }
}
