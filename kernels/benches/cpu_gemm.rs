//! The int4 prefill GEMM (`m > 1`) on the Qwen3-1.7B layer shapes: the f32 tiled kernel (`Ext::Base`), the
//! integer GEMM with int16 activations (W4A16's default on a CPU with AVX512-VBMI) and with int8 activations
//! (`GemmActs::Int8`), interleaved in every repetition, on all threads; medians and spreads (max/min - 1).
//!
//! Run: `cargo bench -p kernels --bench cpu_gemm`. Knobs: `EDGEFIT_BENCH_REPS` (default 9), `EDGEFIT_GEMM_M`
//! (comma-separated row counts, default `16,64,512`). Prints the one-minute load average before and after, since
//! this machine is shared: a number taken under load is not a number. Never a timed assertion.

mod common;

use common::{env_usize, Stats};

use kernels::cpu::{default_threads, Isa};
use kernels::linear::{self, Ext, GemmActs, Int4Scheme, Int4Weights};
use std::hint::black_box;
use std::time::Instant;

/// (name, n, k) of the engine's fused projections for Qwen3-1.7B (hidden 2048, 16/8 heads of 128, MLP 6144).
const SHAPES: [(&str, usize, usize); 4] = [
    ("qkv", 4096, 2048),
    ("o", 2048, 2048),
    ("gate_up", 12288, 2048),
    ("down", 2048, 6144),
];
const GROUP: usize = 64;

fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().next().unwrap_or("?").to_string())
        .unwrap_or_else(|_| "?".into())
}

fn lcg(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s >> 33
    }
}

fn main() {
    let reps = env_usize("EDGEFIT_BENCH_REPS", 9);
    let ms: Vec<usize> = std::env::var("EDGEFIT_GEMM_M")
        .unwrap_or_else(|_| "16,64,512".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let threads = default_threads();
    println!(
        "cpu_gemm: {threads} threads, group {GROUP}, {reps} reps, avx512vbmi {}, load average (1 min) {}",
        kernels::cpu::has_avx512_vbmi(),
        load_avg()
    );
    let mut rnd = lcg(7);
    let weights: Vec<Int4Weights> = SHAPES
        .iter()
        .map(|&(_, n, k)| {
            let packed: Vec<u8> = (0..n / 64 * k * 32).map(|_| rnd() as u8).collect();
            let sz: Vec<u16> = (0..k / GROUP * n)
                .flat_map(|_| {
                    let s = 0.005 + (rnd() % 100) as f32 * 1e-4;
                    let z = ((rnd() % 200) as f32 - 100.0) * 1e-4;
                    [
                        kernels::formats::f32_to_bf16(s),
                        kernels::formats::f32_to_bf16(z),
                    ]
                })
                .collect();
            Int4Weights::from_raw(n, k, GROUP, Int4Scheme::Asymmetric, packed, sz).expect("sizes")
        })
        .collect();
    println!("| m | shape | f32 tiled GFLOP/s (spread) | int16 GEMM | int8 GEMM | int16 / f32 | int8 / f32 |");
    println!("|---|---|---|---|---|---|---|");
    for &m in &ms {
        for (s, &(name, n, k)) in SHAPES.iter().enumerate() {
            let w = &weights[s];
            let x: Vec<f32> = (0..m * k)
                .map(|_| (rnd() % 2000) as f32 / 500.0 - 2.0)
                .collect();
            let mut y = vec![0f32; m * n];
            let arms: [(&str, Ext, GemmActs); 3] = [
                ("f32", Ext::Base, GemmActs::Int16),
                ("int16", Ext::Auto, GemmActs::Int16),
                ("int8", Ext::Auto, GemmActs::Int8),
            ];
            let mut t = vec![Vec::new(); arms.len()];
            for rep in 0..=reps {
                for (a, &(_, ext, acts)) in arms.iter().enumerate() {
                    let t0 = Instant::now();
                    let ran =
                        linear::w4a16_gemm_ext(Isa::Avx512, ext, acts, threads, &x, m, w, &mut y)
                            .expect("sizes");
                    let dt = t0.elapsed().as_secs_f64();
                    black_box(&y);
                    assert_eq!(
                        ran.vbmi,
                        ext == Ext::Auto && kernels::cpu::has_avx512_vbmi()
                    );
                    // the first repetition warms caches and the thread pool
                    if rep > 0 {
                        t[a].push(dt);
                    }
                }
            }
            let flops = 2.0 * (m * n * k) as f64;
            let st: Vec<Stats> = t.into_iter().map(Stats::of).collect();
            let g = |s: &Stats| flops / s.median * 1e-9;
            println!(
                "| {m} | {name} {n}x{k} | {:.0} ({:.0}%) | {:.0} ({:.0}%) | {:.0} ({:.0}%) | {:.2}x | {:.2}x |",
                g(&st[0]),
                st[0].spread() * 100.0,
                g(&st[1]),
                st[1].spread() * 100.0,
                g(&st[2]),
                st[2].spread() * 100.0,
                st[0].median / st[1].median,
                st[0].median / st[2].median
            );
        }
    }
    println!("load average (1 min) after: {}", load_avg());
}
