//! The GPU kernels timed through the library: every row calls the public `kernels::cuda::Gpu` methods the engine
//! calls (`engine/src/model/cuda.rs`): the `Auto` decode GEMVs on prepared tile weights, the decode steps in one
//! call, the dense bf16 GEMV, the prefill GEMMs, the gated DeltaNet step and chunked prefill, paged attention
//! decode and causal / windowed / paged prefill, the norms, activations, casts, gates, RoPE, gather, argmax and
//! sampling. So what it times is the engine's launch path (its checks, its `Auto` choice, its launch attributes),
//! not a hand launch of the PTX.
//!
//! Method (as `kernels/bench/h200/bench.py` had it): each row warms up, then captures `reps` calls rotating over
//! enough input sets to exceed the L2 in a CUDA graph (`Gpu::begin_capture`, what the engine's decode replays)
//! and replays it for `--rounds` rounds; a call that takes longer than 200 us (launch overhead is noise there) or
//! cannot be captured (one that copies from the host) is launched eagerly instead. Median and spread ((max - min)
//! / median) per row. Memory-bound rows report bytes/s and the fraction of the copy bandwidth `Gpu::copy`
//! measured first in the same run; compute-bound rows report FLOP/s. Library baselines (cuBLAS, SDPA, fla, torch)
//! are measured by `kernels/bench/h200/baselines.py` from this run's JSON.
//!
//! Run: `cargo bench -p kernels --features cuda --bench gpu -- [--quick] [--json PATH] [FILTER]`, or build it to
//! carry with `cargo xtask bench gpu`. Without a device it prints "skipped: no CUDA device" and exits 0.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Instant;

use kernels::attention::{AttnDims, Rope};
use kernels::cuda::{
    Fp8Fragments, GdnGpuInputs, GdnGpuWeights, GdnPrefillIo, Gpu, GpuBuffer, GpuScalar,
    Nvfp4Fragments, PagedAttentionDims, PagedKvCache, PrefillChunk,
};
use kernels::gdn::GdnDims;
use kernels::ops::{GatedAct, NormWeight};
use kernels::sampling::SamplingParams;
use kernels::KernelError;

#[path = "gpu_report/mod.rs"]
mod gpu_report;
use gpu_report::{plan, Group, Opts, Report, Row, Stats, USAGE};

type KResult = Result<(), KernelError>;

/// Bytes of input a row rotates over per round: past the H200's 60 MB L2 (and the H100's 50 MB) four times.
const ROTATE_BYTES: f64 = 240e6;
/// Calls slower than this are launched eagerly: a graph saves launch overhead, which is noise at this length.
const GRAPH_MAX_CALL_S: f64 = 200e-6;
/// Launches per captured graph at most (a 1-2 us op reaches its round time well before).
const MAX_REPS: usize = 4000;
const EPS: f32 = 1e-6;
/// The gated DeltaNet prefill's f16 split build (`Gpu::gdn_prefill_with`), timed in lab builds.
#[cfg(feature = "lab")]
const GDN_F16: &str = "wyf16_bf16_cs64";

fn main() -> ExitCode {
    let opts = match Opts::parse(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gpu bench: {e}");
            return ExitCode::from(2);
        }
    };
    let groups = plan(opts.quick);
    if opts.list {
        for g in &groups {
            for (name, _) in g.rows() {
                if opts.wants(&name) {
                    println!("{name}");
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let gpu = match Gpu::probe() {
        Ok(Some(gpu)) => gpu,
        Ok(None) => return skipped(&opts, "no CUDA device".into()),
        Err(e) => return skipped(&opts, format!("no CUDA device ({e})")),
    };
    let device = gpu.name().unwrap_or_else(|e| format!("unknown ({e})"));
    println!(
        "device: {device}; {} rounds of ~{} ms per row",
        opts.rounds, opts.round_ms
    );
    let mut report = Report {
        device: Some(device),
        skipped: None,
        quick: opts.quick,
        copy_gbps: None,
        rows: Vec::new(),
    };
    let t0 = Instant::now();
    for g in &groups {
        let wanted: Vec<(String, usize)> = g
            .rows()
            .into_iter()
            .filter(|(n, _)| opts.wants(n))
            .collect();
        // The copy floor runs whatever the filter: every memory-bound row is a fraction of it.
        if wanted.is_empty() && g.family != "copy" {
            continue;
        }
        let wanted = if wanted.is_empty() { g.rows() } else { wanted };
        let mut out = Vec::new();
        let ctx = Ctx {
            gpu: &gpu,
            o: &opts,
        };
        let res = catch_unwind(AssertUnwindSafe(|| ctx.run_group(g, &wanted, &mut out)));
        let err = match res {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(p) => Some(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or(p.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            )),
        };
        // A group whose setup failed reports every row it did not measure, with the reason.
        if let Some(e) = err {
            for (name, v) in &wanted {
                if !out.iter().any(|r: &Row| &r.name == name) {
                    out.push(failed_row(g, name, *v, &e));
                }
            }
        }
        for r in &out {
            if r.family == "copy" && r.error.is_none() {
                report.copy_gbps = r.gbps();
            }
            print_row(r, report.copy_gbps);
        }
        report.rows.extend(out);
    }
    println!("[all rows in {:.0} s]\n", t0.elapsed().as_secs_f64());
    print!("{}", report.table());
    if let Some(path) = &opts.json {
        if let Err(e) = std::fs::write(path, report.to_json()) {
            eprintln!("gpu bench: cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
        println!("json: {path}");
    }
    if report.rows.iter().any(|r| r.error.is_some()) {
        println!("some rows FAILED (see the table)");
    }
    ExitCode::SUCCESS
}

fn skipped(opts: &Opts, why: String) -> ExitCode {
    println!("skipped: {why}");
    if let Some(path) = &opts.json {
        let r = Report {
            device: None,
            skipped: Some(why),
            quick: opts.quick,
            copy_gbps: None,
            rows: Vec::new(),
        };
        if let Err(e) = std::fs::write(path, r.to_json()) {
            eprintln!("gpu bench: cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn print_row(r: &Row, copy: Option<f64>) {
    match (&r.error, r.stats) {
        (Some(e), _) => println!("{:60} FAILED: {e}", r.name),
        (None, Some(s)) => println!(
            "{:60} {:10.2} us (±{:4.1}%){}{}  [{} x{}, {} sets]",
            r.name,
            s.median * 1e6,
            s.spread * 100.0,
            r.gbps().map_or(String::new(), |g| format!(
                "  {g:7.0} GB/s = {:5.1}% copy",
                r.of_copy(copy).unwrap_or(f64::NAN) * 100.0
            )),
            r.tflops()
                .map_or(String::new(), |t| format!("  {t:7.1} TFLOP/s")),
            r.timing,
            r.reps,
            r.sets
        ),
        (None, None) => println!("{:60} (no timing)", r.name),
    }
}

fn failed_row(g: &Group, name: &str, v: usize, e: &str) -> Row {
    Row {
        name: name.to_string(),
        family: g.family,
        call: "",
        params: params(g, v),
        timing: "none",
        reps: 0,
        rounds: 0,
        sets: 0,
        stats: None,
        bytes: None,
        flops: None,
        error: Some(e.to_string()),
    }
}

fn params(g: &Group, v: usize) -> Vec<(&'static str, usize)> {
    let mut p = g.shape.clone();
    if !g.sweep.1.is_empty() {
        p.push((g.sweep.0, v));
    }
    p
}

/// Input sets to rotate over so that one round reads `bytes_per_set * sets >= ROTATE_BYTES` (2..=64).
fn n_sets(bytes_per_set: usize) -> usize {
    ((ROTATE_BYTES / bytes_per_set.max(1) as f64).ceil() as usize).clamp(2, 64)
}

/// Deterministic fast host data (splitmix64): the weights' values do not change a kernel's speed, but NaN-free,
/// finite inputs keep every path the one a model takes.
struct Fill(u64);

impl Fill {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Bytes with `mask` applied (FP8 e4m3 weights: `0xBF` clears the top exponent bit, so no NaN).
    fn bytes(&mut self, n: usize, and: u8, or: u8) -> Vec<u8> {
        let mut v = vec![0u8; n];
        for c in v.chunks_mut(8) {
            let w = self.next().to_le_bytes();
            for (d, s) in c.iter_mut().zip(w) {
                *d = (s & and) | or;
            }
        }
        v
    }
    /// `0..n` shuffled (Fisher-Yates): a block table's pages in a random order, as a long-running server's pool
    /// hands them out.
    fn permutation(&mut self, n: usize) -> Vec<u32> {
        let mut v: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
        v
    }
    /// Uniform in [-scale, scale).
    fn f32s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
            .collect()
    }
    /// bf16 bits of magnitude in [2^-7, 2^-3), either sign: attention and activation inputs of a sane range.
    fn bf16s(&mut self, n: usize) -> Vec<u16> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let w = self.next();
            for i in 0..4 {
                if v.len() < n {
                    let r = (w >> (16 * i)) as u16;
                    v.push((r & 0x8000) | 0x3C00 | (r & 0x01FF));
                }
            }
        }
        v
    }
}

fn upload_sets<T: GpuScalar>(
    gpu: &Gpu,
    host: &[T],
    sets: usize,
) -> Result<Vec<GpuBuffer<T>>, KernelError> {
    (0..sets).map(|_| gpu.upload(host)).collect()
}

/// A gated DeltaNet layer's weights (conv, gate parameters, the gated norm's weight), random.
struct GdnLayer {
    conv_w: GpuBuffer<f32>,
    a_log: GpuBuffer<f32>,
    dt_bias: GpuBuffer<f32>,
    norm_w: GpuBuffer<f32>,
}

impl GdnLayer {
    fn new(
        gpu: &Gpu,
        conv_dim: usize,
        hv: usize,
        fill: &mut Fill,
    ) -> Result<GdnLayer, KernelError> {
        Ok(GdnLayer {
            conv_w: gpu.upload(&fill.f32s(conv_dim * 4, 0.5))?,
            a_log: gpu.upload(&fill.f32s(hv, 0.5))?,
            dt_bias: gpu.upload(&fill.f32s(hv, 0.5))?,
            norm_w: gpu.upload(&fill.f32s(128, 1.0))?,
        })
    }

    fn weights(&self) -> GdnGpuWeights<'_> {
        GdnGpuWeights {
            conv_weight: &self.conv_w,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_w,
            norm_eps: EPS,
        }
    }
}

struct Ctx<'a> {
    gpu: &'a Gpu,
    o: &'a Opts,
}

/// What a runner says about one row besides its timing.
struct Spec {
    call: &'static str,
    sets: usize,
    bytes: Option<f64>,
    flops: Option<f64>,
}

impl Spec {
    /// A row rated by the bytes it moves.
    fn moving(call: &'static str, sets: usize, bytes: f64) -> Spec {
        Spec {
            call,
            sets,
            bytes: Some(bytes),
            flops: None,
        }
    }

    /// A row rated by the arithmetic it does.
    fn computing(call: &'static str, sets: usize, flops: f64) -> Spec {
        Spec {
            call,
            sets,
            bytes: None,
            flops: Some(flops),
        }
    }
}

impl Ctx<'_> {
    /// Times `call(set)` as the module docs say; `Err` is the reason the row failed.
    fn measure(
        &self,
        sets: usize,
        call: &mut dyn FnMut(usize) -> KResult,
    ) -> Result<(Stats, &'static str, usize), String> {
        let gpu = self.gpu;
        let e = |e: KernelError| e.to_string();
        // Warm-up: modules load on first use, and every set is touched once.
        for i in 0..sets {
            call(i).map_err(e)?;
        }
        gpu.synchronize().map_err(e)?;
        let probe = sets.max(3);
        let t = Instant::now();
        for r in 0..probe {
            call(r % sets).map_err(e)?;
        }
        gpu.synchronize().map_err(e)?;
        let per_call = t.elapsed().as_secs_f64() / probe as f64;
        let reps = ((self.o.round_ms * 1e-3 / per_call).ceil() as usize).clamp(1, MAX_REPS);
        let graph = if per_call < GRAPH_MAX_CALL_S {
            self.capture(reps, sets, call)
        } else {
            None
        };
        let mut samples = Vec::with_capacity(self.o.rounds);
        for _ in 0..self.o.rounds {
            let t = Instant::now();
            match &graph {
                Some(g) => gpu.launch_graph(g).map_err(e)?,
                None => {
                    for r in 0..reps {
                        call(r % sets).map_err(e)?;
                    }
                }
            }
            gpu.synchronize().map_err(e)?;
            samples.push(t.elapsed().as_secs_f64() / reps as f64);
        }
        let stats = Stats::of(&samples).ok_or("no finite timing")?;
        Ok((stats, if graph.is_some() { "graph" } else { "eager" }, reps))
    }

    /// `reps` calls recorded in one graph and replayed once, or `None` where the driver refused the capture (the
    /// row is then timed eagerly, and says so).
    fn capture(
        &self,
        reps: usize,
        sets: usize,
        call: &mut dyn FnMut(usize) -> KResult,
    ) -> Option<kernels::cuda::GpuGraph> {
        let gpu = self.gpu;
        gpu.begin_capture().ok()?;
        let mut ok = true;
        for r in 0..reps {
            if call(r % sets).is_err() {
                ok = false;
                break;
            }
        }
        let graph = gpu.end_capture();
        let _ = gpu.synchronize();
        let graph = graph.ok().filter(|_| ok)?;
        gpu.launch_graph(&graph).ok()?;
        gpu.synchronize().ok()?;
        Some(graph)
    }

    fn row(
        &self,
        g: &Group,
        name: &str,
        v: usize,
        spec: Spec,
        call: &mut dyn FnMut(usize) -> KResult,
    ) -> Row {
        let (stats, timing, reps, error) = match self.measure(spec.sets, call) {
            Ok((s, t, r)) => (Some(s), t, r, None),
            Err(e) => (None, "none", 0, Some(e)),
        };
        Row {
            name: name.to_string(),
            family: g.family,
            call: spec.call,
            params: params(g, v),
            timing,
            reps,
            rounds: if stats.is_some() { self.o.rounds } else { 0 },
            sets: spec.sets,
            stats,
            bytes: spec.bytes,
            flops: spec.flops,
            error,
        }
    }

    fn run_group(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        match g.family {
            "copy" => self.copy(g, rows, out),
            "fp8_gemv" | "fp8_gemv_frag" | "fp8_step" => self.fp8_gemv(g, rows, out),
            "nvfp4_gemv" | "nvfp4_gemv_frag" | "nvfp4_step_norm" | "nvfp4_unfused_norm"
            | "nvfp4_step_silu" | "nvfp4_unfused_silu" => self.nvfp4_gemv(g, rows, out),
            "bf16_gemv" => self.bf16_gemv(g, rows, out),
            "fp8_quant" | "fp8_gemm" | "fp8_gemm_bf16" => self.fp8_gemm(g, rows, out),
            "nvfp4_gemm" => self.nvfp4_gemm(g, rows, out),
            "gdn_decode" => self.gdn_decode(g, rows, out),
            "gdn_prefill" | "gdn_prefill_f16" => self.gdn_prefill(g, rows, out),
            "attn_decode" => self.attn_decode(g, rows, out),
            "attn_prefill" => self.attn_prefill(g, rows, out),
            "attn_prefill_paged" => self.attn_prefill_paged(g, rows, out),
            _ => self.small_op(g, rows, out),
        }
    }

    fn copy(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let n = g.get("mib") << 18; // f32 elements
        let a = self.gpu.zeros::<f32>(n)?;
        let mut b = self.gpu.zeros::<f32>(n)?;
        let spec = Spec::moving("Gpu::copy", 1, 8.0 * n as f64);
        out.push(self.row(g, &rows[0].0, 0, spec, &mut |_| self.gpu.copy(&a, &mut b)));
        Ok(())
    }

    fn fp8_gemv(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let (n, k) = (g.get("n"), g.get("k"));
        let (nb, kb) = (n.div_ceil(128), k.div_ceil(128));
        let sets = n_sets(n * k + nb * kb * 4);
        let mut fill = Fill(1);
        let host = fill.bytes(n * k, 0xBF, 0);
        let mut tiles = Vec::with_capacity(sets);
        for _ in 0..sets {
            let w = gpu.upload(&host)?;
            tiles.push(gpu.fp8_repack_tiles(&w, n, k)?);
        }
        drop(host);
        let scales = upload_sets(gpu, &fill.f32s(nb * kb, 1e-2), sets)?;
        let norm_w = gpu.upload(&fill.f32s(k, 0.1))?;
        for (name, m) in rows {
            let m = *m;
            let bytes = (n * k + nb * kb * 4 + m * k * 2 + m * n * 4) as f64;
            let mut y = gpu.zeros::<f32>(m * n)?;
            match g.family {
                "fp8_gemv" => {
                    let xs = upload_sets(gpu, &fill.bf16s(m * k), sets)?;
                    let mut scratch = gpu.zeros::<u32>(Gpu::gemv_scratch_len(m, k))?;
                    let spec = Spec::moving("Gpu::fp8_gemv_tiles", sets, bytes);
                    out.push(self.row(g, name, m, spec, &mut |i| {
                        gpu.fp8_gemv_tiles(&xs[i], &tiles[i], &scales[i], &mut y, &mut scratch, m)
                    }));
                }
                fam => {
                    // The producer the model runs before this GEMV: the norm before the 5120-wide projections,
                    // silu(gate) * up before the down projection.
                    let norm = k <= 8192;
                    let x = gpu.upload(&fill.f32s(if norm { m * k } else { 2 * m * k }, 1.0))?;
                    let mut frags =
                        Fp8Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(m, k))?);
                    let produce = |frags: &mut Fp8Fragments| {
                        if norm {
                            gpu.rmsnorm_fp8_fragments(
                                &x,
                                None,
                                &norm_w,
                                NormWeight::OnePlus,
                                EPS,
                                frags,
                            )
                        } else {
                            gpu.silu_and_mul_fp8_fragments(&x, k, frags)
                        }
                    };
                    produce(&mut frags)?;
                    if fam == "fp8_gemv_frag" {
                        let spec = Spec::moving("Gpu::fp8_gemv_tiles_fragments", sets, bytes);
                        out.push(self.row(g, name, m, spec, &mut |i| {
                            gpu.fp8_gemv_tiles_fragments(&frags, &tiles[i], &scales[i], &mut y, m)
                        }));
                    } else {
                        let call = if norm {
                            "Gpu::rmsnorm_fp8_fragments + Gpu::fp8_gemv_tiles_fragments"
                        } else {
                            "Gpu::silu_and_mul_fp8_fragments + Gpu::fp8_gemv_tiles_fragments"
                        };
                        let spec = Spec::moving(call, sets, bytes);
                        out.push(self.row(g, name, m, spec, &mut |i| {
                            produce(&mut frags)?;
                            gpu.fp8_gemv_tiles_fragments(&frags, &tiles[i], &scales[i], &mut y, m)
                        }));
                    }
                }
            }
        }
        Ok(())
    }

    fn nvfp4_gemv(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let (n, k) = (g.get("n"), g.get("k"));
        let sets = n_sets(n * k / 2 + n * k / 16);
        let mut fill = Fill(2);
        let (hw, hs) = (
            fill.bytes(n * k / 2, 0xFF, 0),
            fill.bytes(n * k / 16, 0x0F, 0x30),
        );
        let mut tiles = Vec::with_capacity(sets);
        for _ in 0..sets {
            let (w, s) = (gpu.upload(&hw)?, gpu.upload(&hs)?);
            tiles.push(gpu.nvfp4_repack_tiles(&w, &s, n, k)?);
        }
        drop((hw, hs));
        let gs = 1e-2f32;
        let norm_w = gpu.upload(&fill.f32s(k, 0.1))?;
        for (name, m) in rows {
            let m = *m;
            let bytes = (n * k / 2 + n * k / 16 + m * k * 2 + m * n * 4) as f64;
            let mut y = gpu.zeros::<f32>(m * n)?;
            let mut scratch = gpu.zeros::<u32>(Gpu::gemv_scratch_len(m, k))?;
            let mut frags = Nvfp4Fragments::new(gpu.zeros::<u32>(Gpu::gemv_scratch_len(m, k))?);
            let mut xb = gpu.zeros::<u16>(m * k)?;
            let fam = g.family;
            let silu = fam.ends_with("_silu") || (fam == "nvfp4_gemv_frag" && k > 8192);
            let x = gpu.upload(&fill.f32s(if silu { 2 * m * k } else { m * k }, 1.0))?;
            let spec = |call| Spec::moving(call, sets, bytes);
            let row = match fam {
                "nvfp4_gemv" => {
                    let xs = upload_sets(gpu, &fill.bf16s(m * k), sets)?;
                    self.row(g, name, m, spec("Gpu::nvfp4_gemv_tiles"), &mut |i| {
                        gpu.nvfp4_gemv_tiles(&xs[i], &tiles[i], gs, &mut y, &mut scratch, m)
                    })
                }
                "nvfp4_gemv_frag" => {
                    if silu {
                        gpu.silu_and_mul_nvfp4_fragments(&x, k, &mut frags)?;
                    } else {
                        gpu.rmsnorm_nvfp4_fragments(
                            &x,
                            None,
                            &norm_w,
                            NormWeight::OnePlus,
                            EPS,
                            &mut frags,
                        )?;
                    }
                    self.row(
                        g,
                        name,
                        m,
                        spec("Gpu::nvfp4_gemv_tiles_fragments"),
                        &mut |i| gpu.nvfp4_gemv_tiles_fragments(&frags, &tiles[i], gs, &mut y, m),
                    )
                }
                "nvfp4_step_norm" => {
                    self.row(g, name, m, spec("Gpu::rmsnorm_nvfp4_gemv"), &mut |i| {
                        gpu.rmsnorm_nvfp4_gemv(
                            &x,
                            None,
                            &norm_w,
                            NormWeight::OnePlus,
                            EPS,
                            &mut frags,
                            &tiles[i],
                            gs,
                            &mut y,
                        )
                    })
                }
                "nvfp4_unfused_norm" => self.row(
                    g,
                    name,
                    m,
                    spec("Gpu::rmsnorm + Gpu::nvfp4_gemv_tiles"),
                    &mut |i| {
                        gpu.rmsnorm(&x, &norm_w, NormWeight::OnePlus, EPS, &mut xb)?;
                        gpu.nvfp4_gemv_tiles(&xb, &tiles[i], gs, &mut y, &mut scratch, m)
                    },
                ),
                "nvfp4_step_silu" => {
                    self.row(g, name, m, spec("Gpu::silu_and_mul_nvfp4_gemv"), &mut |i| {
                        gpu.silu_and_mul_nvfp4_gemv(&x, &mut frags, &tiles[i], gs, &mut y)
                    })
                }
                _ => self.row(
                    g,
                    name,
                    m,
                    spec("Gpu::silu_and_mul + Gpu::nvfp4_gemv_tiles"),
                    &mut |i| {
                        gpu.silu_and_mul(&x, k, &mut xb)?;
                        gpu.nvfp4_gemv_tiles(&xb, &tiles[i], gs, &mut y, &mut scratch, m)
                    },
                ),
            };
            out.push(row);
        }
        Ok(())
    }

    fn bf16_gemv(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let (n, k) = (g.get("n"), g.get("k"));
        let sets = n_sets(2 * n * k);
        let mut fill = Fill(3);
        let host = fill.bf16s(n * k);
        let ws = (0..sets)
            .map(|_| gpu.dense_weights_bf16(&host, n, k))
            .collect::<Result<Vec<_>, _>>()?;
        drop(host);
        for (name, m) in rows {
            let m = *m;
            let xs = upload_sets(gpu, &fill.f32s(m * k, 1.0), sets)?;
            let mut y = gpu.zeros::<f32>(m * n)?;
            let bytes = (2 * n * k + m * k * 4 + m * n * 4) as f64;
            let spec = Spec::moving("Gpu::dense_linear (bf16 weights)", sets, bytes);
            out.push(self.row(g, name, m, spec, &mut |i| {
                gpu.dense_linear(&xs[i], &ws[i], &mut y, m)
            }));
        }
        Ok(())
    }

    fn fp8_gemm(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let k = g.get("k");
        let kb = k.div_ceil(128);
        let mut fill = Fill(4);
        for (name, m) in rows {
            let m = *m;
            if g.family == "fp8_quant" {
                let sets = n_sets(m * k * 2);
                let xs = upload_sets(gpu, &fill.bf16s(m * k), sets)?;
                let mut xq = gpu.zeros::<u8>(m * k)?;
                let mut sc = gpu.zeros::<f32>(m * kb)?;
                let bytes = (m * k * 3 + m * kb * 4) as f64;
                let spec = Spec::moving("Gpu::fp8_quantize_activations", sets, bytes);
                out.push(self.row(g, name, m, spec, &mut |i| {
                    gpu.fp8_quantize_activations(&xs[i], &mut xq, &mut sc, m, k)
                }));
                continue;
            }
            let n = g.get("n");
            let nb = n.div_ceil(128);
            let sets = n_sets(n * k + m * k);
            let ws = upload_sets(gpu, &fill.bytes(n * k, 0xBF, 0), sets)?;
            let wsc = gpu.upload(&fill.f32s(nb * kb, 1e-2))?;
            let xqs = upload_sets(gpu, &fill.bytes(m * k, 0xBF, 0), sets)?;
            let xsc = gpu.upload(&fill.f32s(m * kb, 1e-2))?;
            let flops = 2.0 * (m * n) as f64 * k as f64;
            if g.family == "fp8_gemm_bf16" {
                // bf16 output (what cuBLAS writes, half the output bytes): h200.md's like-for-like row against
                // `_scaled_mm`. A specific kernel, not `Auto`'s entry, so only in a `lab` build.
                #[cfg(feature = "lab")]
                {
                    let mut y = gpu.zeros::<u16>(m * n)?;
                    let spec = Spec::computing("Gpu::fp8_block_gemm_wgmma_bf16", sets, flops);
                    out.push(self.row(g, name, m, spec, &mut |i| {
                        gpu.fp8_block_gemm_wgmma_bf16(&xqs[i], &xsc, &ws[i], &wsc, &mut y, m, n, k)
                    }));
                }
                continue;
            }
            let mut y = gpu.zeros::<f32>(m * n)?;
            let spec = Spec::computing("Gpu::fp8_block_gemm", sets, flops);
            out.push(self.row(g, name, m, spec, &mut |i| {
                gpu.fp8_block_gemm(&xqs[i], &xsc, &ws[i], &wsc, &mut y, m, n, k)
            }));
        }
        Ok(())
    }

    fn nvfp4_gemm(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let (n, k) = (g.get("n"), g.get("k"));
        let mut fill = Fill(5);
        let hw = fill.bytes(n * k / 2, 0xFF, 0);
        let hs = fill.bytes(n * k / 16, 0x0F, 0x30);
        for (name, m) in rows {
            let m = *m;
            let sets = n_sets(n * k / 2 + m * k * 2);
            let ws = upload_sets(gpu, &hw, sets)?;
            let ss = upload_sets(gpu, &hs, sets)?;
            let xs = upload_sets(gpu, &fill.bf16s(m * k), sets)?;
            let mut y = gpu.zeros::<f32>(m * n)?;
            let flops = 2.0 * (m * n) as f64 * k as f64;
            let spec = Spec::computing("Gpu::nvfp4_gemm", sets, flops);
            out.push(self.row(g, name, m, spec, &mut |i| {
                gpu.nvfp4_gemm(&xs[i], &ws[i], &ss[i], 1e-2, &mut y, m, n, k)
            }));
        }
        Ok(())
    }

    fn gdn_dims(g: &Group) -> GdnDims {
        GdnDims {
            key_heads: g.get("hk"),
            value_heads: g.get("hv"),
            key_dim: 128,
            value_dim: 128,
            conv_kernel: 4,
        }
    }

    fn gdn_decode(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let dims = Self::gdn_dims(g);
        let (hv, cd) = (
            dims.value_heads,
            (2 * dims.key_heads + dims.value_heads) * 128,
        );
        let mut fill = Fill(6);
        let layer = GdnLayer::new(gpu, cd, hv, &mut fill)?;
        let w = layer.weights();
        for (name, b) in rows {
            let b = *b;
            let state_len = b * hv * 128 * 128;
            let sets = n_sets(state_len * 4);
            let qkv = upload_sets(gpu, &fill.f32s(b * cd, 1.0), sets)?;
            let z = upload_sets(gpu, &fill.f32s(b * hv * 128, 1.0), sets)?;
            let a = upload_sets(gpu, &fill.f32s(b * hv, 1.0), sets)?;
            let bb = upload_sets(gpu, &fill.f32s(b * hv, 1.0), sets)?;
            let conv_in = upload_sets(gpu, &fill.f32s(b * cd * 3, 1.0), sets)?;
            let mut conv_out = (0..sets)
                .map(|_| gpu.zeros::<f32>(b * cd * 3))
                .collect::<Result<Vec<_>, _>>()?;
            let mut state = upload_sets(gpu, &fill.f32s(state_len, 0.01), sets)?;
            let mut o = gpu.zeros::<f32>(b * hv * 128)?;
            // The state read and written once, the conv history read and written, the inputs, the output and the
            // conv weights: what the step must move.
            let bytes = 4
                * (2 * state_len
                    + 2 * b * cd * 3
                    + b * cd
                    + 2 * b * hv * 128
                    + 2 * b * hv
                    + cd * 4
                    + b * hv * 128);
            let spec = Spec::moving("Gpu::gdn_decode_step", sets, bytes as f64);
            out.push(self.row(g, name, b, spec, &mut |i| {
                let x = GdnGpuInputs {
                    qkv: &qkv[i],
                    z: &z[i],
                    a: &a[i],
                    b: &bb[i],
                };
                gpu.gdn_decode_step(
                    &dims,
                    &w,
                    &x,
                    b,
                    &conv_in[i],
                    &mut conv_out[i],
                    &mut state[i],
                    &mut o,
                )
            }));
        }
        Ok(())
    }

    fn gdn_prefill(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let dims = Self::gdn_dims(g);
        let (hv, cd, t) = (
            dims.value_heads,
            (2 * dims.key_heads + dims.value_heads) * 128,
            g.get("t"),
        );
        let mut fill = Fill(7);
        let layer = GdnLayer::new(gpu, cd, hv, &mut fill)?;
        let w = layer.weights();
        for (name, seqs) in rows {
            let seqs = *seqs;
            let lens = vec![t; seqs];
            let nt = t * seqs;
            let qkv = gpu.upload(&fill.f32s(nt * cd, 1.0))?;
            let z = gpu.upload(&fill.f32s(nt * hv * 128, 1.0))?;
            let a = gpu.upload(&fill.f32s(nt * hv, 1.0))?;
            let b = gpu.upload(&fill.f32s(nt * hv, 1.0))?;
            let conv_in = gpu.upload(&fill.f32s(seqs * cd * 3, 1.0))?;
            let mut conv_out = gpu.zeros::<f32>(seqs * cd * 3)?;
            let mut state = gpu.upload(&fill.f32s(seqs * hv * 128 * 128, 0.01))?;
            let mut o = gpu.zeros::<f32>(nt * hv * 128)?;
            // The nominal FLOPs of the chunked form, as the Python benchmark counted them: Hv * chunks *
            // (10 C^2 d + 6 C d^2), C = 64, d = 128.
            let chunks = seqs * t.div_ceil(64);
            let flops =
                (hv * chunks) as f64 * (10.0 * 64.0 * 64.0 * 128.0 + 6.0 * 64.0 * 128.0 * 128.0);
            let x = GdnGpuInputs {
                qkv: &qkv,
                z: &z,
                a: &a,
                b: &b,
            };
            // `gdn_prefill_f16` rows (lab builds only): the fastest build, at fla's precision class, not `Auto`'s
            // (h200.md's "met by the f16 variant" row); its workspace is larger.
            let f16 = g.family == "gdn_prefill_f16";
            #[cfg(feature = "lab")]
            let ws_len = if f16 {
                Gpu::gdn_prefill_workspace_len_with(GDN_F16, &dims, &lens)?
            } else {
                Gpu::gdn_prefill_workspace_len(&dims, &lens)?
            };
            #[cfg(not(feature = "lab"))]
            let ws_len = Gpu::gdn_prefill_workspace_len(&dims, &lens)?;
            let mut ws = gpu.zeros::<f32>(ws_len)?;
            let spec = Spec::computing(
                if f16 {
                    "Gpu::gdn_prefill_with(\"wyf16_bf16_cs64\")"
                } else {
                    "Gpu::gdn_prefill"
                },
                1,
                flops,
            );
            let row = self.row(g, name, seqs, spec, &mut |_| {
                let io = GdnPrefillIo {
                    conv_in: &conv_in,
                    conv_out: &mut conv_out,
                    state: &mut state,
                    out: &mut o,
                    workspace: &mut ws,
                };
                #[cfg(feature = "lab")]
                if f16 {
                    return gpu.gdn_prefill_with(GDN_F16, &dims, &w, &x, &lens, io);
                }
                gpu.gdn_prefill(&dims, &w, &x, &lens, io)
            });
            out.push(row);
        }
        Ok(())
    }

    fn attn_decode(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let b = g.get("b");
        let (hq, hkv, d, page) = paged_geometry(g);
        let mut fill = Fill(8);
        for (name, ctx) in rows {
            let ctx = *ctx;
            let pages_per = ctx.div_ceil(page);
            let pages = b * pages_per;
            let kv_len = pages * hkv * page * d;
            let sets = n_sets(2 * kv_len * 2);
            let host = fill.bf16s(kv_len);
            let ks = upload_sets(gpu, &host, sets)?;
            let vs = upload_sets(gpu, &host, sets)?;
            drop(host);
            let bt = gpu.upload(&fill.permutation(pages))?;
            let sl = gpu.upload(&vec![ctx as u32; b])?;
            let q = gpu.upload(&fill.f32s(b * hq * d, 1.0))?;
            let mut o = gpu.zeros::<f32>(b * hq * d)?;
            let dims = paged_dims(g, b, pages, pages_per);
            let bytes = (2 * b * ctx * hkv * d * 2) as f64;
            let spec = Spec::moving("Gpu::attention_decode_paged", sets, bytes);
            let scale = 1.0 / (d as f32).sqrt();
            out.push(self.row(g, name, ctx, spec, &mut |i| {
                let kv = PagedKvCache {
                    k: &ks[i],
                    v: &vs[i],
                    block_table: &bt,
                    seq_lens: &sl,
                };
                gpu.attention_decode_paged(&dims, &q, kv, scale, 0, &mut o)
            }));
        }
        Ok(())
    }

    fn attn_prefill(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let (hq, hkv, d) = (g.get("hq"), g.get("hkv"), g.get("d"));
        let window = Some(g.get("window")).filter(|&w| w > 0);
        let mut fill = Fill(9);
        let dims = AttnDims {
            q_heads: hq,
            kv_heads: hkv,
            head_dim: d,
        };
        for (name, t) in rows {
            let t = *t;
            let sets = n_sets(2 * t * d * (hq + 2 * hkv));
            let qs = upload_sets(gpu, &fill.bf16s(t * hq * d), sets)?;
            let ks = upload_sets(gpu, &fill.bf16s(t * hkv * d), sets)?;
            let vs = upload_sets(gpu, &fill.bf16s(t * hkv * d), sets)?;
            let mut o = gpu.zeros::<u16>(t * hq * d)?;
            let flops = 4.0 * (d * hq) as f64 * pairs(t, window) as f64;
            let spec = Spec::computing("Gpu::attention_prefill", sets, flops);
            let scale = 1.0 / (d as f32).sqrt();
            out.push(self.row(g, name, t, spec, &mut |i| {
                gpu.attention_prefill(&dims, scale, window, t, &qs[i], &ks[i], &vs[i], &mut o)
            }));
        }
        Ok(())
    }

    fn attn_prefill_paged(
        &self,
        g: &Group,
        rows: &[(String, usize)],
        out: &mut Vec<Row>,
    ) -> KResult {
        let gpu = self.gpu;
        let prefix = g.get("prefix");
        let (hq, hkv, d, page) = paged_geometry(g);
        let mut fill = Fill(10);
        for (name, t) in rows {
            let t = *t;
            let pages = (prefix + t).div_ceil(page);
            let kv_len = pages * hkv * page * d;
            let kc = gpu.upload(&fill.bf16s(kv_len))?;
            let vc = gpu.upload(&fill.bf16s(kv_len))?;
            let bt = gpu.upload(&fill.permutation(pages))?;
            let q = gpu.upload(&fill.bf16s(t * hq * d))?;
            let k = gpu.upload(&fill.bf16s(t * hkv * d))?;
            let v = gpu.upload(&fill.bf16s(t * hkv * d))?;
            let cu = gpu.upload(&[0u32, t as u32])?;
            let pl = gpu.upload(&[prefix as u32])?;
            let mut o = gpu.zeros::<u16>(t * hq * d)?;
            let dims = paged_dims(g, 1, pages, pages);
            let flops = 4.0 * (d * hq) as f64 * (t * prefix + t * (t + 1) / 2) as f64;
            let spec = Spec::computing("Gpu::attention_prefill_paged", 1, flops);
            let scale = 1.0 / (d as f32).sqrt();
            out.push(self.row(g, name, t, spec, &mut |_| {
                let chunk = PrefillChunk {
                    q: &q,
                    k: &k,
                    v: &v,
                    cu_seqlens: &cu,
                    prefix_lens: &pl,
                    total: t,
                    max_seqlen: t,
                };
                gpu.attention_prefill_paged(&dims, scale, None, &kc, &vc, &bt, chunk, &mut o)
            }));
        }
        Ok(())
    }

    /// The norms, activations, casts, gates, RoPE, gather, argmax and sampling: one row per row count.
    fn small_op(&self, g: &Group, rows: &[(String, usize)], out: &mut Vec<Row>) -> KResult {
        let gpu = self.gpu;
        let mut fill = Fill(11);
        for (name, r) in rows {
            let r = *r;
            let spec = |call, sets, bytes: usize| Spec::moving(call, sets, bytes as f64);
            let time = |call, sets, bytes, f: &mut dyn FnMut(usize) -> KResult| {
                self.row(g, name, r, spec(call, sets, bytes), f)
            };
            let row = match g.family {
                fam @ ("rmsnorm" | "add_rmsnorm" | "rmsnorm_f32" | "add_rmsnorm_f32") => {
                    let dim = g.get("dim");
                    let n = r * dim;
                    let add = fam.starts_with("add_");
                    let f32_out = fam.ends_with("_f32");
                    let per_set = n * 4 * if add { 2 } else { 1 };
                    let sets = n_sets(per_set);
                    let xs = upload_sets(gpu, &fill.f32s(n, 1.0), sets)?;
                    // The residual only where the op adds one (no zero-length allocations).
                    let mut res = if add {
                        upload_sets(gpu, &fill.f32s(n, 1.0), sets)?
                    } else {
                        Vec::new()
                    };
                    let w = gpu.upload(&fill.f32s(dim, 0.1))?;
                    let mut ob = gpu.zeros::<u16>(n)?;
                    let mut of = gpu.zeros::<f32>(n)?;
                    let bytes =
                        n * (4 + if add { 8 } else { 0 } + if f32_out { 4 } else { 2 }) + dim * 4;
                    let call = match fam {
                        "rmsnorm" => "Gpu::rmsnorm",
                        "add_rmsnorm" => "Gpu::add_rmsnorm",
                        "rmsnorm_f32" => "Gpu::rmsnorm_f32",
                        _ => "Gpu::add_rmsnorm_f32",
                    };
                    let form = NormWeight::OnePlus;
                    time(call, sets, bytes, &mut |i| match (add, f32_out) {
                        (false, false) => gpu.rmsnorm(&xs[i], &w, form, EPS, &mut ob),
                        (false, true) => gpu.rmsnorm_f32(&xs[i], &w, form, EPS, &mut of),
                        (true, false) => {
                            gpu.add_rmsnorm(&xs[i], &mut res[i], &w, form, EPS, &mut ob)
                        }
                        (true, true) => {
                            gpu.add_rmsnorm_f32(&xs[i], &mut res[i], &w, form, EPS, &mut of)
                        }
                    })
                }
                fam @ ("silu_and_mul" | "gelu_and_mul" | "gelu_tanh_and_mul_f32") => {
                    let inter = g.get("inter");
                    let n = r * inter;
                    let sets = n_sets(n * 8);
                    let gu = upload_sets(gpu, &fill.f32s(2 * n, 2.0), sets)?;
                    let mut ob = gpu.zeros::<u16>(n)?;
                    let mut of = gpu.zeros::<f32>(n)?;
                    match fam {
                        "silu_and_mul" => time("Gpu::silu_and_mul", sets, n * 10, &mut |i| {
                            gpu.silu_and_mul(&gu[i], inter, &mut ob)
                        }),
                        "gelu_and_mul" => time("Gpu::gelu_and_mul", sets, n * 10, &mut |i| {
                            gpu.gelu_and_mul(&gu[i], inter, &mut ob)
                        }),
                        _ => time("Gpu::act_and_mul_f32 (GeluTanh)", sets, n * 12, &mut |i| {
                            gpu.act_and_mul_f32(GatedAct::GeluTanh, &gu[i], inter, &mut of)
                        }),
                    }
                }
                "cast_f32_to_bf16" => {
                    let n = r * g.get("dim");
                    let sets = n_sets(n * 4);
                    let xs = upload_sets(gpu, &fill.f32s(n, 1.0), sets)?;
                    let mut ob = gpu.zeros::<u16>(n)?;
                    time("Gpu::cast_f32_to_bf16", sets, n * 6, &mut |i| {
                        gpu.cast_f32_to_bf16(&xs[i], &mut ob)
                    })
                }
                "cast_bf16_to_f32" => {
                    let n = r * g.get("dim");
                    let sets = n_sets(n * 2);
                    let xs = upload_sets(gpu, &fill.bf16s(n), sets)?;
                    let mut of = gpu.zeros::<f32>(n)?;
                    time("Gpu::cast_bf16_to_f32", sets, n * 6, &mut |i| {
                        gpu.cast_bf16_to_f32(&xs[i], &mut of)
                    })
                }
                "sigmoid_gate" => {
                    let n = r * g.get("dim");
                    let sets = n_sets(n * 8);
                    let mut xs = upload_sets(gpu, &fill.f32s(n, 1.0), sets)?;
                    let gs = upload_sets(gpu, &fill.f32s(n, 4.0), sets)?;
                    time("Gpu::sigmoid_gate", sets, n * 12, &mut |i| {
                        gpu.sigmoid_gate(&mut xs[i], &gs[i])
                    })
                }
                "sigmoid_head_gate" => {
                    let (heads, d) = (g.get("heads"), g.get("d"));
                    let n = r * heads * d;
                    let sets = n_sets(n * 4);
                    let mut xs = upload_sets(gpu, &fill.f32s(n, 1.0), sets)?;
                    let gs = upload_sets(gpu, &fill.f32s(r * heads, 4.0), sets)?;
                    let bytes = n * 8 + r * heads * 4;
                    time("Gpu::sigmoid_head_gate", sets, bytes, &mut |i| {
                        gpu.sigmoid_head_gate(&mut xs[i], heads, &gs[i])
                    })
                }
                "rope_neox" => {
                    let (heads, d, rot) = (g.get("heads"), g.get("d"), g.get("rot"));
                    let rope = Rope {
                        head_dim: d,
                        rotary_dim: rot,
                        theta: 1e7,
                    };
                    let n = r * heads * d;
                    let sets = n_sets(n * 4);
                    let mut xs = upload_sets(gpu, &fill.f32s(n, 1.0), sets)?;
                    let pos = gpu.upload(&(0..r as u32).collect::<Vec<_>>())?;
                    // Only the rotated dims are read and written.
                    let bytes = r * heads * rot * 8 + r * 4;
                    time("Gpu::rope_neox", sets, bytes, &mut |i| {
                        gpu.rope_neox(&rope, heads, &pos, &mut xs[i])
                    })
                }
                "embedding_gather" => {
                    let (vocab, dim) = (g.get("vocab"), g.get("dim"));
                    // A gather's speed does not depend on the table's values, so the table is left zero (2.5 GB
                    // not generated on the host).
                    let table = gpu.zeros::<u16>(vocab * dim)?;
                    let ids: Vec<u32> = (0..r)
                        .map(|_| (fill.next() % vocab as u64) as u32)
                        .collect();
                    let ids = gpu.upload(&ids)?;
                    let mut of = gpu.zeros::<f32>(r * dim)?;
                    time("Gpu::embedding_gather", 1, r * dim * 6, &mut |_| {
                        gpu.embedding_gather(&table, dim, &ids, &mut of)
                    })
                }
                "argmax" => {
                    let vocab = g.get("vocab");
                    let sets = n_sets(r * vocab * 4);
                    let ls = upload_sets(gpu, &fill.f32s(r * vocab, 10.0), sets)?;
                    let mut o = gpu.zeros::<u32>(r)?;
                    time("Gpu::argmax", sets, r * vocab * 4, &mut |i| {
                        gpu.argmax(&ls[i], vocab, &mut o)
                    })
                }
                "sample" => {
                    let (vocab, top_k) = (g.get("vocab"), g.get("top_k"));
                    let sets = n_sets(r * vocab * 4);
                    let ls = upload_sets(gpu, &fill.f32s(r * vocab, 10.0), sets)?;
                    let words: Vec<u32> =
                        (0..r as u64).flat_map(|s| Gpu::pcg32_words(7, s)).collect();
                    let mut rng = gpu.upload(&words)?;
                    let mut o = gpu.zeros::<u32>(r)?;
                    // Qwen3's recommended sampling.
                    let p = SamplingParams {
                        temperature: 0.7,
                        top_k,
                        top_p: 0.95,
                    };
                    time("Gpu::sample", sets, r * vocab * 4, &mut |i| {
                        gpu.sample(&ls[i], vocab, &p, &mut rng, &mut o)
                    })
                }
                other => {
                    return Err(KernelError::Cuda(format!(
                        "gpu bench: no runner for family `{other}`"
                    )))
                }
            };
            out.push(row);
        }
        Ok(())
    }
}

/// A paged-attention group's query heads, KV heads, head dim and page size.
fn paged_geometry(g: &Group) -> (usize, usize, usize, usize) {
    (g.get("hq"), g.get("hkv"), g.get("d"), g.get("page"))
}

/// The paged-attention shape of `seqs` sequences of `g`'s geometry over `num_pages` pages.
fn paged_dims(
    g: &Group,
    seqs: usize,
    num_pages: usize,
    max_pages_per_seq: usize,
) -> PagedAttentionDims {
    let (q_heads, kv_heads, head_dim, page_size) = paged_geometry(g);
    PagedAttentionDims {
        seqs,
        q_heads,
        kv_heads,
        head_dim,
        page_size,
        num_pages,
        max_pages_per_seq,
    }
}

/// Query-key pairs a causal (optionally windowed) prefill of `t` tokens computes.
fn pairs(t: usize, window: Option<usize>) -> usize {
    match window {
        Some(w) if w < t => w * (w + 1) / 2 + (t - w) * w,
        _ => t * (t + 1) / 2,
    }
}
