//! CPU weight-kernel benchmark: memory read bandwidth, then every GEMV of `kernels::linear` on weights far beyond
//! the last-level cache, then the GEMMs, then PyTorch's CPU int4 and bf16 paths on the same shapes.
//!
//! Run: `cargo xtask bench cpu` (or `cargo bench -p kernels --bench cpu_gemv`). Environment knobs:
//! `EDGEFIT_BENCH_MIB` (GEMV working set per format, default 1536 MiB: this machine's LLC is 480 MiB, so every
//! pass streams from DRAM), `EDGEFIT_BENCH_REPS` (default 7), `EDGEFIT_TORCH_PYTHON` (the interpreter with torch;
//! default `.venv/bin/python` at the workspace root; the torch arms are skipped with a note when it is missing),
//! `EDGEFIT_BENCH_FORMATS` (comma-separated subset of `w4a16,w4a8,fp8,nvfp4,bf16,gemm,threads` to run; default
//! all; `w4a16base`, `w4a8base` and `nvfp4base`, only when named, add the W4A16, W4A8 and NVFP4 GEMVs on the
//! AVX-512 base kernels, to compare with the VBMI kernels the default arms run on a CPU with AVX512-VBMI).
//!
//! `threads` is the threading overhead of `kernels::cpu::parallel_ranges` (the persistent worker pool) against
//! `parallel_ranges_scoped` (scoped threads spawned per call): an empty two-range call, and a small GEMV (bf16,
//! 2048 x 512, 2 MiB, cache resident) split the same way through either, in microseconds per call.
//!
//! A GEMV pass walks a list of distinct matrices of the Qwen3.8-27B MLP shape (17408 x 5120, the up/gate
//! projection) whose total is the working set, as one decode step walks its layers. Effective GB/s counts the
//! bytes of weights and scales the kernel must read. For each format, the read-bandwidth probe, our kernel and the
//! torch baseline (int4 for W4A16, bf16 for the others), each on 1 thread and on all threads, are interleaved
//! within every repetition (torch runs in a child process that times one call per request), so every ratio
//! compares numbers taken in the same minutes of a possibly shared machine. Medians and the spread (max/min - 1)
//! are printed. Never a timed assertion: the ratios are for people to read.

mod common;

use common::{env_usize, read_pass, Stats};

use kernels::cpu::{default_threads, parallel_ranges, parallel_ranges_scoped, Isa};
use kernels::linear::{self, Bf16Weights, Ext, Fp8Weights, Int4Scheme, Int4Weights, Nvfp4Weights};
use std::cell::RefCell;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const N: usize = 17408;
const K: usize = 5120;
const GROUP: usize = 128;
const GEMM_M: usize = 64;
const GEMM_N: usize = 4096;
/// Bytes of one int4 matrix: packed codes plus bf16 scale and zero pairs.
const INT4_BYTES: usize = N * K / 2 + K / GROUP * N * 4;

/// A fast xorshift fill; the content only has to defeat any compression or zero-page sharing.
fn random_u64(len: usize, seed: u64) -> Vec<u64> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
        .collect()
}

fn random_bytes(len: usize, seed: u64, map: impl Fn(u8) -> u8) -> Vec<u8> {
    random_u64(len.div_ceil(8), seed)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take(len)
        .map(map)
        .collect()
}

/// One matrix's GEMV: `(threads, x, y)`.
type GemvCall = Box<dyn Fn(usize, &[f32], &mut [f32])>;

/// One measured configuration. `run` returns the seconds it took when it times itself (the torch arms, timed
/// inside the child), `None` to be timed here.
struct Arm<'a> {
    name: String,
    threads: usize,
    run: Box<dyn Fn() -> Option<f64> + 'a>,
}

/// Runs every arm `reps` times, interleaved (the order rotates each repetition), after one warm-up call each.
fn measure(arms: &[Arm<'_>], reps: usize) -> Vec<Stats> {
    for a in arms {
        (a.run)();
    }
    let mut times = vec![Vec::new(); arms.len()];
    for r in 0..reps {
        for j in 0..arms.len() {
            let i = (j + r) % arms.len();
            let t = Instant::now();
            let own = (arms[i].run)();
            times[i].push(own.unwrap_or_else(|| t.elapsed().as_secs_f64()));
        }
    }
    times.into_iter().map(Stats::of).collect()
}

/// The torch baselines, served by `kernels/bench/torch_cpu_int4.py --serve` in a child process.
struct Torch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    int4_copies: usize,
    bf16_copies: usize,
}

impl Torch {
    fn start(mib: usize) -> Result<Torch, String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = std::env::var_os("EDGEFIT_TORCH_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".venv/bin/python"));
        if !python.exists() {
            return Err(format!(
                "no interpreter at {} (set EDGEFIT_TORCH_PYTHON to a Python with torch)",
                python.display()
            ));
        }
        let mut child = Command::new(&python)
            .arg(root.join("kernels/bench/torch_cpu_int4.py"))
            .args(["--n", &N.to_string(), "--k", &K.to_string()])
            .args(["--group", &GROUP.to_string(), "--mib", &mib.to_string()])
            .args([
                "--gemm-m",
                &GEMM_M.to_string(),
                "--gemm-n",
                &GEMM_N.to_string(),
            ])
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("the torch script exited before READY (see its error above)".into());
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.first() {
                Some(&"LAYOUT") => println!("  torch: {}", line.trim()),
                Some(&"READY") if f.len() == 3 => {
                    let int4_copies = f[1].parse().map_err(|_| "bad READY line")?;
                    let bf16_copies = f[2].parse().map_err(|_| "bad READY line")?;
                    return Ok(Torch {
                        child,
                        stdin,
                        stdout,
                        int4_copies,
                        bf16_copies,
                    });
                }
                _ => {}
            }
        }
    }

    /// Seconds one call of `arm` took on `threads` threads, timed in the child; NaN if the child failed.
    fn time(&mut self, arm: &str, threads: usize) -> f64 {
        let mut line = String::new();
        let ok = writeln!(self.stdin, "{arm} {threads}").is_ok()
            && self.stdin.flush().is_ok()
            && self.stdout.read_line(&mut line).is_ok();
        if ok {
            line.trim().parse().unwrap_or(f64::NAN)
        } else {
            f64::NAN
        }
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

/// One line of the final summary table.
struct Row {
    what: String,
    threads: usize,
    value: String,
    ratios: String,
}

fn gbs(bytes: usize, s: &Stats) -> f64 {
    bytes as f64 / s.median / 1e9
}

fn main() {
    let mib = env_usize("EDGEFIT_BENCH_MIB", 1536);
    let reps = env_usize("EDGEFIT_BENCH_REPS", 7).max(3);
    let all = default_threads();
    let isa = Isa::detected();
    let start = Instant::now();
    println!(
        "cpu_gemv: path {isa:?}, {all} threads, working set {mib} MiB per format, {reps} interleaved repetitions"
    );
    let torch = match Torch::start(mib) {
        Ok(t) => Some(RefCell::new(t)),
        Err(e) => {
            println!("  torch baselines skipped: {e}");
            None
        }
    };
    let mut rows: Vec<Row> = Vec::new();
    let buf = random_u64((mib << 20) / 8, 7);
    let read_bytes = buf.len() * 8;
    let threads = [1, all];

    // GEMVs, one format at a time (each holds its own working set, freed before the next).
    let x: Vec<f32> = random_u64(K, 3)
        .iter()
        .map(|&r| (r % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let formats = std::env::var("EDGEFIT_BENCH_FORMATS").ok();
    // `named`: listed in EDGEFIT_BENCH_FORMATS (the opt-in arms); `selected`: listed, or no list (every default arm).
    let named = |name: &str| {
        formats
            .as_deref()
            .is_some_and(|f| f.split(',').any(|s| s.trim() == name))
    };
    let selected = |name: &str| formats.is_none() || named(name);
    let mut gemv = |name: &str, bytes_each: usize, make: &dyn Fn(u64) -> GemvCall| {
        if !selected(name) {
            return;
        }
        let copies = ((mib << 20) / bytes_each).max(1);
        let mats: Vec<GemvCall> = (0..copies).map(|c| make(c as u64 + 11)).collect();
        let ys = RefCell::new(vec![vec![0.0f32; N]; copies]);
        let (base, base_copies, base_bytes) = match (&torch, name) {
            (Some(t), "w4a16") => (Some("torch_int4_gemv"), t.borrow().int4_copies, INT4_BYTES),
            (Some(t), _) => (Some("torch_bf16_gemv"), t.borrow().bf16_copies, N * K * 2),
            (None, _) => (None, 0, 0),
        };
        let mut arms: Vec<Arm<'_>> = Vec::new();
        for &t in &threads {
            let buf = &buf;
            arms.push(Arm {
                name: "stream read".into(),
                threads: t,
                run: Box::new(move || {
                    black_box(read_pass(u64_bytes(buf), t));
                    None
                }),
            });
        }
        for &t in &threads {
            let (mats, x, ys) = (&mats, &x, &ys);
            arms.push(Arm {
                name: format!("{name} gemv {N}x{K} x{copies}"),
                threads: t,
                run: Box::new(move || {
                    let mut ys = ys.borrow_mut();
                    for (m, y) in mats.iter().zip(ys.iter_mut()) {
                        m(t, x, y);
                    }
                    None
                }),
            });
        }
        if let (Some(b), Some(tc)) = (base, &torch) {
            for &t in &threads {
                arms.push(Arm {
                    name: format!("{b} x{base_copies}"),
                    threads: t,
                    run: Box::new(move || Some(tc.borrow_mut().time(b, t))),
                });
            }
        }
        let stats = measure(&arms, reps);
        for (a, s) in arms.iter().zip(&stats) {
            let bytes = if a.name.starts_with("stream") {
                read_bytes
            } else if a.name.starts_with("torch") {
                base_bytes * base_copies
            } else {
                bytes_each * copies
            };
            println!(
                "  {:<34} {:>2} thr  {:>7.2} GB/s  (median {:.4} s, spread {:.1}%)",
                a.name,
                a.threads,
                gbs(bytes, s),
                s.median,
                100.0 * s.spread()
            );
        }
        for (ti, &t) in threads.iter().enumerate() {
            let bw = gbs(read_bytes, &stats[ti]);
            let ours = gbs(bytes_each * copies, &stats[2 + ti]);
            let mut ratios = format!("{:.2} x read bw ({bw:.1} GB/s)", ours / bw);
            if stats.len() > 4 {
                // Time per matrix of the same shape, theirs over ours.
                let theirs = stats[4 + ti].median / base_copies as f64;
                let mine = stats[2 + ti].median / copies as f64;
                ratios += &format!(", {:.2} x {}", theirs / mine, base.unwrap_or(""));
            }
            rows.push(Row {
                what: format!("{name} gemv"),
                threads: t,
                value: format!("{ours:.2} GB/s"),
                ratios,
            });
        }
    };

    let int4_raw = |sym: bool, seed: u64| {
        let packed = random_bytes(N / 64 * K * 32, seed, |b| b);
        let sz: Vec<u16> = random_u64(K / GROUP * N * 2, seed + 1)
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                if i % 2 == 1 && sym {
                    0
                } else {
                    0x3B00 | (r as u16 & 0x80FF)
                }
            })
            .collect();
        let scheme = if sym {
            Int4Scheme::Symmetric
        } else {
            Int4Scheme::Asymmetric
        };
        Int4Weights::from_raw(N, K, GROUP, scheme, packed, sz).expect("benchmark int4 sizes")
    };
    // The `*base` arms run W4A16 on the AVX-512 f32 kernel and W4A8 on the AVX-512 base kernel (no VBMI), only
    // when named, to compare with the default arms (on a CPU with AVX512-VBMI the W4A16 integer-dot-product kernel
    // and the W4A8 VBMI kernel).
    for (name, sym, ext) in [
        ("w4a16", false, Ext::Auto),
        ("w4a8", true, Ext::Auto),
        ("w4a16base", false, Ext::Base),
        ("w4a8base", true, Ext::Base),
    ] {
        if ext == Ext::Base && !named(name) {
            continue;
        }
        gemv(name, INT4_BYTES, &|seed| {
            let w = int4_raw(sym, seed);
            Box::new(move |t, x, y| {
                let r = if sym {
                    linear::w4a8_ext(isa, ext, t, x, 1, &w, y)
                } else {
                    linear::w4a16_ext(isa, ext, t, x, 1, &w, y)
                };
                r.expect("benchmark call");
            })
        });
    }
    let fp8_bytes = N * K + N.div_ceil(128) * K.div_ceil(128) * 4;
    gemv("fp8", fp8_bytes, &|seed| {
        // Random codes over the whole range, subnormals included (the decode has no slow path for them).
        let w = random_bytes(N * K, seed, |b| if b & 0x7F == 0x7F { 0x7E } else { b });
        let s = vec![1e-3f32; N.div_ceil(128) * K.div_ceil(128)];
        Box::new(move |t, x, y| {
            let fw = Fp8Weights::new(&w, &s, N, K).expect("sizes");
            linear::fp8_with(isa, t, x, 1, &fw, y).expect("benchmark call");
        })
    });
    let nv_bytes = N * K / 2 + N * K / 16;
    gemv("nvfp4", nv_bytes, &|seed| {
        let w = random_bytes(N * K / 2, seed, |b| b);
        let sc = random_bytes(N * K / 16, seed + 1, |b| 0x30 | (b & 0x0F));
        Box::new(move |t, x, y| {
            let nw = Nvfp4Weights::new(&w, &sc, 1e-3, N, K).expect("sizes");
            linear::nvfp4_with(isa, t, x, 1, &nw, y).expect("benchmark call");
        })
    });
    // NVFP4 on the AVX-512 f32 kernel (no VBMI), only when named, to compare with the default arm (on a CPU with
    // AVX512-VBMI the integer-dot-product kernel).
    if named("nvfp4base") {
        gemv("nvfp4base", nv_bytes, &|seed| {
            let w = random_bytes(N * K / 2, seed, |b| b);
            let sc = random_bytes(N * K / 16, seed + 1, |b| 0x30 | (b & 0x0F));
            Box::new(move |t, x, y| {
                let nw = Nvfp4Weights::new(&w, &sc, 1e-3, N, K).expect("sizes");
                linear::nvfp4_ext(isa, Ext::Base, t, x, 1, &nw, y).expect("benchmark call");
            })
        });
    }
    gemv("bf16", N * K * 2, &|seed| {
        let w: Vec<u16> = random_u64(N * K / 4, seed)
            .iter()
            .flat_map(|r| (0..4).map(move |i| 0x3C00 | ((r >> (16 * i)) as u16 & 0x80FF)))
            .collect();
        Box::new(move |t, x, y| {
            let bw = Bf16Weights::new(&w, N, K).expect("sizes");
            linear::bf16_with(isa, t, x, 1, &bw, y).expect("benchmark call");
        })
    });
    drop(buf);
    if selected("threads") {
        threading_overhead(isa, reps, &mut rows);
    }

    // GEMMs (prefill): 64 rows against one 4096 x 5120 matrix per format, all threads, with torch's int4 and
    // bf16 GEMMs interleaved.
    let xg: Vec<f32> = random_u64(GEMM_M * K, 5)
        .iter()
        .map(|&r| (r % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let w4 = {
        let packed = random_bytes(GEMM_N / 64 * K * 32, 21, |b| b);
        // Scale 2^-9 (bf16 0x3B00), zero 0: the symmetric grid, so both W4A16 and W4A8 can run it.
        let sz: Vec<u16> = (0..K / GROUP * GEMM_N * 2)
            .map(|i| if i % 2 == 0 { 0x3B00 } else { 0 })
            .collect();
        Int4Weights::from_raw(GEMM_N, K, GROUP, Int4Scheme::Symmetric, packed, sz).expect("sizes")
    };
    let f8 = random_bytes(GEMM_N * K, 22, |b| if b & 0x7F == 0x7F { 0x7E } else { b });
    let f8s = vec![1e-3f32; GEMM_N.div_ceil(128) * K.div_ceil(128)];
    let nv = random_bytes(GEMM_N * K / 2, 23, |b| b);
    let nvs = random_bytes(GEMM_N * K / 16, 24, |b| 0x30 | (b & 0x0F));
    let bfw: Vec<u16> = random_bytes(GEMM_N * K * 2, 25, |b| b)
        .chunks_exact(2)
        .map(|c| 0x3C00 | (u16::from(c[0]) & 0x80FF))
        .collect();
    let flops = 2 * GEMM_M * GEMM_N * K;
    let names: Vec<&str> = if selected("gemm") {
        vec!["w4a16", "w4a8", "fp8", "nvfp4", "bf16"]
    } else {
        Vec::new()
    };
    let ygs: Vec<RefCell<Vec<f32>>> = names
        .iter()
        .map(|_| RefCell::new(vec![0.0; GEMM_M * GEMM_N]))
        .collect();
    let mut arms: Vec<Arm<'_>> = names
        .iter()
        .zip(&ygs)
        .map(|(&name, cell)| {
            let (w4, f8, f8s, nv, nvs, bfw, xg) = (&w4, &f8, &f8s, &nv, &nvs, &bfw, &xg);
            Arm {
                name: format!("{name} gemm {GEMM_M}x{GEMM_N}x{K}"),
                threads: all,
                run: Box::new(move || {
                    let mut guard = cell.borrow_mut();
                    let y: &mut [f32] = guard.as_mut_slice();
                    let r = match name {
                        "w4a16" => linear::w4a16_with(isa, all, xg, GEMM_M, w4, y),
                        "w4a8" => linear::w4a8_with(isa, all, xg, GEMM_M, w4, y),
                        "fp8" => {
                            let w = Fp8Weights::new(f8, f8s, GEMM_N, K).expect("sizes");
                            linear::fp8_with(isa, all, xg, GEMM_M, &w, y)
                        }
                        "nvfp4" => {
                            let w = Nvfp4Weights::new(nv, nvs, 1e-3, GEMM_N, K).expect("sizes");
                            linear::nvfp4_with(isa, all, xg, GEMM_M, &w, y)
                        }
                        _ => {
                            let w = Bf16Weights::new(bfw, GEMM_N, K).expect("sizes");
                            linear::bf16_with(isa, all, xg, GEMM_M, &w, y)
                        }
                    };
                    r.expect("benchmark call");
                    None
                }),
            }
        })
        .collect();
    if let (Some(tc), false) = (&torch, names.is_empty()) {
        for b in ["torch_int4_gemm", "torch_bf16_gemm"] {
            arms.push(Arm {
                name: format!("{b} {GEMM_M}x{GEMM_N}x{K}"),
                threads: all,
                run: Box::new(move || Some(tc.borrow_mut().time(b, all))),
            });
        }
    }
    let stats = measure(&arms, reps);
    let gflops: Vec<f64> = stats
        .iter()
        .map(|s| flops as f64 / s.median / 1e9)
        .collect();
    for ((a, s), gf) in arms.iter().zip(&stats).zip(&gflops) {
        println!(
            "  {:<34} {:>2} thr  {:>7.1} GFLOP/s  (median {:.4} s, spread {:.1}%)",
            a.name,
            a.threads,
            gf,
            s.median,
            100.0 * s.spread()
        );
    }
    for (i, name) in names.iter().enumerate() {
        let ratios = if gflops.len() > names.len() {
            let (b, theirs) = if *name == "w4a16" {
                ("torch_int4_gemm", gflops[names.len()])
            } else {
                ("torch_bf16_gemm", gflops[names.len() + 1])
            };
            format!("{:.2} x {b}", gflops[i] / theirs)
        } else {
            String::new()
        };
        rows.push(Row {
            what: format!("{name} gemm m{GEMM_M}"),
            threads: all,
            value: format!("{:.1} GFLOP/s", gflops[i]),
            ratios,
        });
    }
    drop(arms);
    drop(torch);

    println!(
        "\nsummary ({isa:?}, {:.0} s; medians of interleaved repetitions, ratios within the same repetitions):",
        start.elapsed().as_secs_f64()
    );
    println!("  {:<16} {:>3}  {:>14}  ratios", "arm", "thr", "value");
    for r in &rows {
        println!(
            "  {:<16} {:>3}  {:>14}  {}",
            r.what, r.threads, r.value, r.ratios
        );
    }
}

/// The bytes of a u64 slice, for the read probe.
fn u64_bytes(v: &[u64]) -> &[u8] {
    // SAFETY: initialised u64 memory is valid as u8, the length covers exactly the same bytes, u8 has alignment 1,
    // and the result borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A raw output pointer shared by the ranges of one call (each writes its own rows).
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: only used inside one parallel call whose ranges write disjoint rows, while the buffer is borrowed.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Per-call cost of the pool against scoped threads: an empty two-range call, and a small bf16 GEMV cut into the
/// same row ranges through either (each range runs the 1-thread kernel on its rows). Interleaved repetitions of
/// `CALLS` calls each; microseconds per call.
fn threading_overhead(isa: Isa, reps: usize, rows: &mut Vec<Row>) {
    const CALLS: usize = 2000;
    const SN: usize = 2048;
    const SK: usize = 512;
    let all = default_threads();
    let w: Vec<u16> = random_u64(SN * SK / 4, 41)
        .iter()
        .flat_map(|r| (0..4).map(move |i| 0x3C00 | ((r >> (16 * i)) as u16 & 0x80FF)))
        .collect();
    let x: Vec<f32> = random_u64(SK, 42)
        .iter()
        .map(|&r| (r % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let y = RefCell::new(vec![0.0f32; SN]);
    let gemv_range = |out: SharedOut, r0: usize, r1: usize| {
        let bw = Bf16Weights::new(&w[r0 * SK..r1 * SK], r1 - r0, SK).expect("sizes");
        // SAFETY: rows r0..r1 of the SN-element output, disjoint from the other ranges of the same call; the
        // RefCell borrow below keeps the buffer alive and unaliased for the whole call.
        let ys = unsafe { std::slice::from_raw_parts_mut(out.get().add(r0), r1 - r0) };
        linear::bf16_with(isa, 1, x.as_slice(), 1, &bw, ys).expect("benchmark call");
    };
    type Split = fn(usize, usize, usize, &(dyn Fn(usize, usize) + Sync));
    let pool: Split = |n, a, t, f| parallel_ranges(n, a, t, f);
    let scoped: Split = |n, a, t, f| parallel_ranges_scoped(n, a, t, f);
    let mut arms: Vec<Arm<'_>> = Vec::new();
    for (label, split) in [("pool", pool), ("scoped spawn", scoped)] {
        arms.push(Arm {
            name: format!("empty 2-range call, {label}"),
            threads: all,
            run: Box::new(move || {
                for _ in 0..CALLS {
                    split(2, 1, all, &|s, e| {
                        black_box((s, e));
                    });
                }
                None
            }),
        });
    }
    arms.push(Arm {
        name: format!("bf16 gemv {SN}x{SK}, 1 thread"),
        threads: 1,
        run: Box::new(|| {
            let mut g = y.borrow_mut();
            let out = SharedOut(g.as_mut_ptr());
            for _ in 0..CALLS {
                gemv_range(out, 0, SN);
            }
            None
        }),
    });
    for (label, split) in [("pool", pool), ("scoped spawn", scoped)] {
        let gemv_range = &gemv_range;
        let y = &y;
        arms.push(Arm {
            name: format!("bf16 gemv {SN}x{SK}, {label}"),
            threads: all,
            run: Box::new(move || {
                let mut g = y.borrow_mut();
                let out = SharedOut(g.as_mut_ptr());
                for _ in 0..CALLS {
                    split(SN, 64, all, &|r0, r1| gemv_range(out, r0, r1));
                }
                None
            }),
        });
    }
    let stats = measure(&arms, reps);
    println!("\nthreading overhead ({CALLS} calls per repetition; microseconds per call)");
    for (a, s) in arms.iter().zip(&stats) {
        let us = s.median / CALLS as f64 * 1e6;
        println!(
            "  {:<34} {:>2} thr  {:>8.2} us/call  (spread {:.1}%)",
            a.name,
            a.threads,
            us,
            100.0 * s.spread()
        );
    }
    let us = |i: usize| stats[i].median / CALLS as f64 * 1e6;
    rows.push(Row {
        what: "empty call".into(),
        threads: all,
        value: format!("{:.2} us", us(0)),
        ratios: format!(
            "pool; scoped spawn {:.2} us ({:.1} x)",
            us(1),
            us(1) / us(0)
        ),
    });
    rows.push(Row {
        what: format!("bf16 {SN}x{SK}"),
        threads: all,
        value: format!("{:.2} us", us(3)),
        ratios: format!(
            "pool; scoped spawn {:.2} us, 1 thread {:.2} us ({:.2} x / {:.2} x the pool's time)",
            us(4),
            us(2),
            us(4) / us(3),
            us(2) / us(3)
        ),
    });
}
