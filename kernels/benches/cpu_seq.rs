//! CPU sequence-kernel benchmark: gated DeltaNet decode step against the byte floor of its state, chunked prefill
//! against a FLOP floor and against running the recurrent step token by token, attention prefill GFLOP/s, and
//! attention decode GB/s over a paged KV cache at 4k-32k context. Every floor is measured in the same run: streaming read and read+write bandwidth
//! over a working set beyond the last-level cache, and an FMA probe for the compute roof.
//!
//! Run: `cargo bench -p kernels --bench cpu_seq` (or `cargo xtask bench cpu`). Knobs: `EDGEFIT_BENCH_REPS`
//! (default 7), `EDGEFIT_SEQ_MIB` (working set of the bandwidth arms, the GDN state pool and the KV pool; default
//! 768 MiB: this machine reports a 480 MiB LLC, so every pass streams from DRAM), `EDGEFIT_SEQ_ONLY`
//! (comma-separated sections to run: `decode`, `prefill`, `attention` or one half of it, `attention-prefill` /
//! `attention-decode`; the floors always run),
//! `EDGEFIT_SEQ_ATTN_CTX` (attention contexts, default `4096,8192,16384,32768`) and `EDGEFIT_SEQ_ATTN_BEST=1`
//! (attention on the fastest path only).
//!
//! Geometry is Qwen3.8-27B's: GDN 16 key / 48 value heads of 128 x 128 (3 MiB of fp32 state per layer), full
//! attention 24 query / 4 KV heads of 256 with an f32 cache (8 KiB per token per layer) and a bf16 cache (4 KiB,
//! the budget the planner charges) in pages of 64 tokens. Arms are interleaved within each repetition; medians and spreads (max/min - 1) are printed, never
//! asserted. A difference smaller than the spread is noise; this machine is shared, so spreads can be large.

mod common;

use common::{env_usize, f32_bytes, read_pass, Stats};
// The GDN layer and token holders (and row slicing) the GDN tests use.
#[path = "../tests/common/mod.rs"]
mod gdn_common;
use gdn_common::{token_rows, GdnLayer, GdnTokens};

use kernels::attention::{self, AttnDims, KvSlice, PagedKv};
use kernels::cpu::{default_threads, parallel_ranges, Isa};
use kernels::gdn::{self, GdnDims};
use kernels::ops;
use std::time::Instant;

const QWEN_GDN: GdnDims = GdnDims {
    key_heads: 16,
    value_heads: 48,
    key_dim: 128,
    value_dim: 128,
    conv_kernel: 4,
};
const QWEN_ATTN: AttnDims = AttnDims {
    q_heads: 24,
    kv_heads: 4,
    head_dim: 256,
};
const PAGE: usize = 64;
const MIB: usize = 1 << 20;

/// Deterministic pseudo-random floats in [-1, 1) (xorshift); content only has to be non-trivial.
/// A GDN layer's weights, each array `fill`ed from its own seed: `seed`, `seed + 1`, ...
fn gdn_layer(dims: &GdnDims, seed: u64) -> GdnLayer {
    GdnLayer {
        conv_weight: fill(dims.conv_dim() * dims.conv_kernel, seed),
        a_log: fill(dims.value_heads, seed + 1),
        dt_bias: fill(dims.value_heads, seed + 2),
        norm_weight: fill(dims.value_dim, seed + 3),
    }
}

/// `n` GDN tokens, each array `fill`ed from its own seed: `seed`, `seed + 1`, ...
fn gdn_tokens(dims: &GdnDims, n: usize, seed: u64) -> GdnTokens {
    GdnTokens {
        qkv: fill(n * dims.conv_dim(), seed),
        z: fill(n * dims.value_width(), seed + 1),
        a: fill(n * dims.value_heads, seed + 2),
        b: fill(n * dims.value_heads, seed + 3),
    }
}

fn fill(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Named timing arms run round-robin `reps` times.
struct Arms<'a> {
    names: Vec<String>,
    runs: Vec<Box<dyn FnMut() -> f64 + 'a>>,
}

impl<'a> Arms<'a> {
    fn new() -> Self {
        Arms {
            names: Vec::new(),
            runs: Vec::new(),
        }
    }
    /// `f` returns the seconds it measured (so it can exclude setup).
    fn add(&mut self, name: impl Into<String>, f: impl FnMut() -> f64 + 'a) {
        self.names.push(name.into());
        self.runs.push(Box::new(f));
    }
    fn run(mut self, reps: usize) -> Vec<(String, Stats)> {
        let mut times = vec![Vec::new(); self.runs.len()];
        for r in &mut self.runs {
            r(); // warm-up: page faults, caches, thread start
        }
        for _ in 0..reps {
            for (i, r) in self.runs.iter_mut().enumerate() {
                times[i].push(r());
            }
        }
        self.names
            .into_iter()
            .zip(times.into_iter().map(Stats::of))
            .collect()
    }
}

/// Whether `EDGEFIT_SEQ_ONLY` (unset: everything) selects `section`.
fn want(section: &str) -> bool {
    std::env::var("EDGEFIT_SEQ_ONLY").map_or(true, |v| v.split(',').any(|s| s.trim() == section))
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// What the arm `name` is held to: `one` where it ran on one thread, `all` where it ran on all of them.
fn by_threads(name: &str, one: f64, all: f64) -> f64 {
    if name.ends_with(" 1 thread(s)") {
        one
    } else {
        all
    }
}

fn row(name: &str, s: &Stats, extra: &str) {
    println!(
        "  {name:<44} {:>10.3} ms  spread {:>5.1}%  {extra}",
        s.median * 1e3,
        s.spread() * 100.0
    );
}

fn main() {
    let reps = env_usize("EDGEFIT_BENCH_REPS", 7).max(1);
    let pool_mib = env_usize("EDGEFIT_SEQ_MIB", 768).max(16);
    let threads = default_threads();
    let isas = Isa::available();
    let best = Isa::detected();
    println!("cpu_seq: {threads} threads, paths {isas:?}, {reps} interleaved repetitions, working sets {pool_mib} MiB");

    // ---- Floors: streaming bandwidth and FMA roof -------------------------------------------------------------
    let words = pool_mib * MIB / 4;
    let mut buf = fill(words, 1);
    let bw = {
        let mut arms = Arms::new();
        let b = std::cell::RefCell::new(&mut buf);
        for &t in &[1, threads] {
            let b1 = &b;
            arms.add(format!("read, {t} thread(s)"), move || {
                let g = b1.borrow();
                let v: &[f32] = &g;
                read_pass(f32_bytes(v), t)
            });
            let b2 = &b;
            arms.add(format!("read+write in place, {t} thread(s)"), move || {
                let mut v = b2.borrow_mut();
                let p = SendPtr(v.as_mut_ptr());
                let n = v.len();
                timed(|| {
                    parallel_ranges(n, 4096, t, |s, e| {
                        // SAFETY: ranges are disjoint and within the buffer.
                        let sl = unsafe { std::slice::from_raw_parts_mut(p.get().add(s), e - s) };
                        for x in sl {
                            *x = *x * 0.999_999 + 1e-9;
                        }
                    })
                })
            });
        }
        let res = arms.run(reps);
        println!("\nmemory bandwidth over {pool_mib} MiB (bytes moved / median time)");
        let bytes = (words * 4) as f64;
        let mut out = Vec::new();
        for (name, s) in &res {
            let moved = if name.starts_with("read+write") {
                2.0 * bytes
            } else {
                bytes
            };
            row(name, s, &format!("{:7.2} GB/s", moved / s.median / 1e9));
            out.push(moved / s.median);
        }
        // [read 1t, rw 1t, read all, rw all]
        out
    };
    drop(buf);
    let rw_all = bw[3];
    let rw_one = bw[1];

    let probe = |isa: Isa, t: usize| {
        let iters = 20_000_000u32;
        let start = Instant::now();
        let total = std::sync::Mutex::new(0.0f64);
        parallel_ranges(t, 1, t, |_, _| {
            let f = ops::fma_probe(isa, iters).expect("probe path is available");
            *total.lock().unwrap() += f;
        });
        let secs = start.elapsed().as_secs_f64();
        total.into_inner().unwrap() / secs
    };
    let mut roof = Vec::new();
    for _ in 0..3 {
        roof.push(probe(best, threads));
    }
    roof.sort_by(f64::total_cmp);
    let roof_all = roof[1];
    let roof_one = probe(best, 1);
    println!(
        "\nFMA roof ({best:?} probe): {:.1} GFLOP/s on 1 thread, {:.1} GFLOP/s on {threads}",
        roof_one / 1e9,
        roof_all / 1e9
    );

    // ---- GDN decode step ---------------------------------------------------------------------------------------
    let dims = QWEN_GDN;
    let state_bytes = dims.state_len() * 4;
    let layers = (pool_mib * MIB / state_bytes).max(1);
    let layer = gdn_layer(&dims, 2);
    let w = layer.weights();
    let mut states: Vec<Vec<f32>> = (0..layers)
        .map(|l| {
            fill(dims.state_len(), 100 + l as u64)
                .iter()
                .map(|x| x * 0.1)
                .collect()
        })
        .collect();
    let mut convs: Vec<Vec<f32>> = (0..layers)
        .map(|l| fill(dims.conv_state_len(), 1000 + l as u64))
        .collect();
    let tokens1 = gdn_tokens(&dims, 1, 6);
    let x1 = tokens1.inputs();
    let mut out1 = vec![0.0f32; dims.value_width()];
    if want("decode") {
        let st = std::cell::RefCell::new((&mut states, &mut convs, &mut out1));
        let mut arms = Arms::new();
        let mut configs: Vec<(Isa, usize)> = isas.iter().map(|&i| (i, threads)).collect();
        configs.push((best, 1));
        for (isa, t) in configs {
            let st = &st;
            let w = &w;
            let x1 = &x1;
            arms.add(format!("{isa:?}, {t} thread(s)"), move || {
                let mut g = st.borrow_mut();
                let (s, c, o) = &mut *g;
                timed(|| {
                    for (sl, cl) in s.iter_mut().zip(c.iter_mut()) {
                        gdn::decode_step_with(isa, t, &dims, w, 1, x1, cl, sl, o)
                            .expect("valid shapes");
                    }
                }) / layers as f64
            });
        }
        let res = arms.run(reps);
        let floor_all = 2.0 * state_bytes as f64 / rw_all;
        let floor_one = 2.0 * state_bytes as f64 / rw_one;
        println!(
            "\nGDN decode step per layer (Qwen3.8: 48 x 128 x 128 fp32 state = {} MiB, batch 1, cycling {layers} layers' states)",
            state_bytes / MIB
        );
        println!("  byte floor (read + write the state at the measured read+write bandwidth): {:.3} ms on all threads, {:.3} ms on 1", floor_all * 1e3, floor_one * 1e3);
        let base = res[0].1.median;
        for (name, s) in &res {
            let floor = by_threads(name, floor_one, floor_all);
            row(
                name,
                s,
                &format!(
                    "floor/time {:4.2}  {:5.1}x scalar",
                    floor / s.median,
                    base / s.median
                ),
            );
        }
    }
    drop(states);
    drop(convs);

    // ---- GDN chunked prefill -----------------------------------------------------------------------------------
    let t_pre = 512;
    let tokens_t = gdn_tokens(&dims, t_pre, 10);
    let xt = tokens_t.inputs();
    if want("prefill") {
        let mut arms = Arms::new();
        let (w, xt) = (&w, &xt);
        // The generic C paths (scalar, AVX2) run the same chunk code; scalar is kept as the baseline, AVX2 is left
        // out to keep the whole benchmark under 90 s (it measured within 25% of scalar).
        let mut configs: Vec<(Isa, usize)> = vec![(Isa::Scalar, threads), (best, threads)];
        configs.push((best, 1));
        for (isa, t) in configs {
            arms.add(format!("chunked, {isa:?}, {t} thread(s)"), move || {
                let mut conv = vec![0.0f32; dims.conv_state_len()];
                let mut state = vec![0.0f32; dims.state_len()];
                let mut out = vec![0.0f32; t_pre * dims.value_width()];
                timed(|| {
                    gdn::prefill_with(isa, t, &dims, w, t_pre, xt, &mut conv, &mut state, &mut out)
                        .expect("valid shapes")
                })
            });
        }
        arms.add(
            format!("recurrent step x {t_pre}, {best:?}, {threads} thread(s)"),
            move || {
                let mut conv = vec![0.0f32; dims.conv_state_len()];
                let mut state = vec![0.0f32; dims.state_len()];
                let mut out = vec![0.0f32; dims.value_width()];
                timed(|| {
                    for i in 0..t_pre {
                        let xi = token_rows(&dims, xt, i, i + 1);
                        gdn::decode_step_with(
                            best, threads, &dims, w, 1, &xi, &mut conv, &mut state, &mut out,
                        )
                        .expect("valid shapes");
                    }
                })
            },
        );
        let res = arms.run(reps);
        // FLOPs of the chunked algorithm per head and chunk of C: the C x C products K K^T and Q K^T, the forward
        // substitution, U -= Wk S0 and Q S0, P U, and the state update K^T U.
        let (c, dk, dv) = (64.0f64, dims.key_dim as f64, dims.value_dim as f64);
        let per_chunk = 2.0 * c * (c + 1.0) * dk
            + c * (c - 1.0) * (dk + dv)
            + 4.0 * c * dk * dv
            + c * (c + 1.0) * dv
            + 2.0 * c * dk * dv;
        let flops = per_chunk * (t_pre as f64 / 64.0) * dims.value_heads as f64;
        println!(
            "\nGDN prefill of {t_pre} tokens, one layer (chunked: {:.2} GFLOP of matrix work)",
            flops / 1e9
        );
        println!(
            "  FLOP floor at the measured roof: {:.3} ms on all threads, {:.3} ms on 1",
            flops / roof_all * 1e3,
            flops / roof_one * 1e3
        );
        let recurrent = res[res.len() - 1].1.median;
        for (name, s) in &res {
            let roof = by_threads(name, roof_one, roof_all);
            row(
                name,
                s,
                &format!(
                    "floor/time {:4.2}  {:5.2}x the recurrence  {:6.0} tok/s",
                    flops / roof / s.median,
                    recurrent / s.median,
                    t_pre as f64 / s.median
                ),
            );
        }
    }

    // ---- Attention prefill ---------------------------------------------------------------------------------------
    if want("attention") || want("attention-prefill") {
        // Spark-X2.5-1.7B layers: 8 query / 2 KV heads of 256; full layers and sliding ones (window 512).
        let sd = AttnDims {
            q_heads: 8,
            kv_heads: 2,
            head_dim: 256,
        };
        let t = 1024;
        let q = fill(t * sd.q_heads * sd.head_dim, 30);
        let k = fill(t * sd.kv_heads * sd.head_dim, 31);
        let v = fill(t * sd.kv_heads * sd.head_dim, 32);
        let scale = 1.0 / (sd.head_dim as f32).sqrt();
        let mut arms = Arms::new();
        let (mut flops, mut flops_of) = (Vec::new(), Vec::new());
        for window in [None, Some(512usize)] {
            // Visible keys summed over queries, times 4 FLOP per key and head dim (score and value multiply-adds).
            let keys: usize = (0..t)
                .map(|i| window.map_or(i + 1, |w| (i + 1).min(w)))
                .sum();
            flops.push(keys as f64 * sd.q_heads as f64 * sd.head_dim as f64 * 4.0);
            // The generic C (scalar here) is the per-query kernel; AVX-512 is the blocked one.
            let isas_here: Vec<Isa> = if window.is_none() {
                vec![Isa::Scalar, best]
            } else {
                vec![best]
            };
            for isa in isas_here {
                let (q, k, v) = (&q, &k, &v);
                flops_of.push(*flops.last().expect("pushed above"));
                arms.add(
                    format!("{t} tokens, window {window:?}, {isa:?}, {threads} thread(s)"),
                    move || {
                        let mut out = vec![0.0f32; q.len()];
                        timed(|| {
                            attention::prefill_with(
                                isa, threads, &sd, scale, window, t, q, k, v, &mut out,
                            )
                            .expect("valid shapes")
                        })
                    },
                );
            }
        }
        let res = arms.run(reps);
        println!(
            "\nattention prefill (Spark: 8 q / 2 KV heads x 256), GFLOP/s against the FMA roof"
        );
        for ((name, s), f) in res.iter().zip(flops_of) {
            row(
                name,
                s,
                &format!(
                    "{:6.1} GFLOP/s  {:4.2} of roof",
                    f / s.median / 1e9,
                    f / s.median / roof_all
                ),
            );
        }
    }

    // ---- Attention decode over a paged cache -------------------------------------------------------------------
    if !want("attention") && !want("attention-decode") {
        return;
    }
    let ad = QWEN_ATTN;
    let page_floats = ad.kv_heads * PAGE * ad.head_dim;
    let scale = 1.0 / (ad.head_dim as f32).sqrt();
    // One pool per element type, each `pool_mib` of K+V, so both stream from DRAM.
    let f32_pages = (pool_mib * MIB / (2 * page_floats * 4)).max(1);
    let bf16_pages = (pool_mib * MIB / (2 * page_floats * 2)).max(1);
    let (k32, v32) = (
        fill(f32_pages * page_floats, 20),
        fill(f32_pages * page_floats, 21),
    );
    let to_bf16 = |v: Vec<f32>| v.into_iter().map(half::bf16::from_f32).collect::<Vec<_>>();
    let (k16, v16) = (
        to_bf16(fill(bf16_pages * page_floats, 22)),
        to_bf16(fill(bf16_pages * page_floats, 23)),
    );
    // `EDGEFIT_SEQ_ATTN_CTX` (comma-separated contexts) and `EDGEFIT_SEQ_ATTN_BEST=1` (skip the slower paths)
    // keep an attention-only run short.
    let contexts: Vec<usize> = std::env::var("EDGEFIT_SEQ_ATTN_CTX").map_or_else(
        |_| vec![4096, 8192, 16384, 32768],
        |v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
    );
    let attn_best_only = std::env::var("EDGEFIT_SEQ_ATTN_BEST").is_ok_and(|v| v == "1");
    let mut arms = Arms::new();
    let mut bytes_of = Vec::new();
    for bf16 in [false, true] {
        let (pool_pages, elem) = if bf16 {
            (bf16_pages, 2)
        } else {
            (f32_pages, 4)
        };
        let token_bytes = 2 * ad.kv_heads * ad.head_dim * elem;
        for &ctx in &contexts {
            let pages_per_seq = ctx / PAGE;
            // As many sequences as the pool holds (at least one), so every context streams the whole pool.
            let batch = (pool_pages / pages_per_seq).max(1);
            let avail = pool_pages.min(batch * pages_per_seq);
            let block_table: Vec<u32> = (0..batch * pages_per_seq)
                .map(|i| (i % avail) as u32)
                .collect();
            let lens = vec![ctx.min(avail * PAGE) as u32; batch];
            let q = fill(batch * ad.q_heads * ad.head_dim, 24);
            let bytes = batch as f64 * lens[0] as f64 * token_bytes as f64;
            // Every path at 8k f32; the fastest path on all threads and on one thread from 8k up (issue 3's
            // target is stated for both).
            let mut configs: Vec<(Isa, usize)> = if ctx == 8192 && !bf16 && !attn_best_only {
                isas.iter().map(|&i| (i, threads)).collect()
            } else {
                vec![(best, threads)]
            };
            if ctx >= 8192 && threads > 1 {
                configs.push((best, 1));
            }
            for (isa, t) in configs {
                let (k32, v32, k16, v16) = (&k32, &v32, &k16, &v16);
                let (bt, ln, q) = (block_table.clone(), lens.clone(), q.clone());
                bytes_of.push((bytes, t, (batch * lens[0] as usize) as f64));
                let dtype = if bf16 { "bf16" } else { "f32" };
                arms.add(
                    format!("{dtype} ctx {ctx:>5} x batch {batch}, {isa:?}, {t} thread(s)"),
                    move || {
                        let (k_pages, v_pages) = if bf16 {
                            (KvSlice::Bf16(k16), KvSlice::Bf16(v16))
                        } else {
                            (KvSlice::F32(k32), KvSlice::F32(v32))
                        };
                        let kv = PagedKv {
                            k_pages,
                            v_pages,
                            page_size: PAGE,
                            block_table: &bt,
                            max_pages: pages_per_seq,
                            lens: &ln,
                        };
                        let mut out = vec![0.0f32; q.len()];
                        timed(|| {
                            attention::decode_paged_with(
                                isa, t, &ad, scale, batch, &q, &kv, &mut out,
                            )
                            .expect("valid shapes")
                        })
                    },
                );
            }
        }
    }
    let res = arms.run(reps);
    println!("\nattention decode, paged cache (24 q / 4 KV heads x 256, pages of {PAGE}; f32 8 KiB, bf16 4 KiB per token)");
    for ((name, s), (bytes, t, tokens)) in res.iter().zip(bytes_of) {
        let read = if t == 1 { bw[0] } else { bw[2] };
        row(
            name,
            s,
            &format!(
                "{:6.2} GB/s  {:4.2} of read bandwidth  {:5.2} us per cached token",
                bytes / s.median / 1e9,
                bytes / s.median / read,
                s.median / tokens * 1e6
            ),
        );
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: the benchmark writes disjoint ranges through it from scoped threads.
unsafe impl Sync for SendPtr {}
// SAFETY: as above.
unsafe impl Send for SendPtr {}
