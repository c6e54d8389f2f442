//! Every op of the engine-facing [`Backend`] against the plain references, written once and generic over the
//! backend: fresh random inputs (the seed is printed; `EDGEFIT_SEED` replays one), ragged shapes (odd row counts,
//! widths off every tile, `k` off the 16-column blocks where the format allows it, sequences of 0 and more than
//! one chunk), and every output buffer poisoned with NaN first, so an element a kernel forgets fails the check.
//!
//! Each test runs for [`Cpu`] always (`cpu_*`) and for [`Gpu`] where a device exists (`cuda_*`); without one it
//! prints `skipped: no CUDA device`. The bounds are stated where they are checked and the numerics that differ
//! between the devices (the activations the GPU GEMVs read, the TF32 DeltaNet prefill) are in [`Numerics`]. The int4
//! linear and the MoE ops run on both devices: `int4_linear` sweeps the int4 group sizes and schemes, `moe` runs a
//! whole sparse layer (route, dispatch on the host, gather, one linear per expert, combine).
//! `the_checks_catch_wrong_answers` shows that the same checks reject a plausible wrong result.

use kernels::attention::Rope;
use kernels::backend::{Backend, Cpu, Embedding, GdnIn, GdnLayer, GdnState, KvCache, Weight};
use kernels::cuda::Gpu;
use kernels::formats::{bf16_to_f32, e4m3_to_f32, f32_to_bf16, f32_to_e4m3};
use kernels::gdn::{GdnDims, GdnInputs, GdnWeights};
use kernels::linear::{Int4Scheme, Int4Weights};
use kernels::moe::dispatch_ids;
use kernels::ops::{GatedAct, NormWeight};
use kernels::reference;
use kernels::KernelError;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

// ---------------------------------------------------------------------------------------------------------------
// What differs between the devices.

/// The activations a linear kernel reads, which bound its distance from the f64 reference on f32 inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Acts {
    /// f32 (only the order of the sums differs).
    F32,
    /// Rounded to bf16 (the GPU tile GEMVs, the NVFP4 GEMM): each moves by at most 2^-8 of itself.
    Bf16,
    /// int16 codes with one scale per row per int4 group (the CPU's integer W4A16 kernels where AVX512-VBMI
    /// exists): each moves by at most one step, `amax / 32767`.
    Int16,
    /// e4m3 with one scale `s = amax / 448` per row per 128 columns (the GPU FP8 GEMM): at most 2^-4 of itself, or
    /// half the subnormal step `2^-10 s`.
    E4m3,
}

/// The numerics of one backend that its docs state.
trait Numerics: Backend {
    /// What the linear of `path` (a [`Weight::path_name`]) reads at `m` rows of `k`.
    fn acts(path: &str, m: usize, k: usize) -> Acts;
    /// Scaled error bounds `|got - want| / (1 + |want|)` of the DeltaNet prefill (outputs, state).
    const GDN_PREFILL: (f32, f32);
    /// The same for the decode step.
    const GDN_DECODE: (f32, f32);
}

impl Numerics for Cpu {
    fn acts(path: &str, _: usize, _: usize) -> Acts {
        match path {
            "w4a16" => Acts::Int16,
            _ => Acts::F32,
        }
    }
    // The CPU kernels' measured worst cases (`cpu_gdn.rs`) with room: outputs 1.5e-5, states 4.6e-7.
    const GDN_PREFILL: (f32, f32) = (1e-4, 4e-6);
    const GDN_DECODE: (f32, f32) = (1e-4, 4e-6);
}

impl Numerics for Gpu {
    fn acts(path: &str, m: usize, k: usize) -> Acts {
        match path {
            // The int4 kernel reads f32 activations (W4A8 quantises them to the reference's int8 codes itself).
            "f32" | "bf16" | "w4a16" | "w4a8" => Acts::F32,
            // FP8 per tensor is FP8 block with one scale repeated, so it takes the same GEMM.
            "fp8_block" | "fp8_tensor" if m > 16 && k.is_multiple_of(16) => Acts::E4m3,
            _ => Acts::Bf16,
        }
    }
    // The default TF32 (3xTF32 WY) prefill's bounds in `gpu_gdn_prefill.rs`; the decode step is f32.
    const GDN_PREFILL: (f32, f32) = (1e-2, 2e-3);
    const GDN_DECODE: (f32, f32) = (1e-4, 1e-5);
}

// ---------------------------------------------------------------------------------------------------------------
// Inputs and checks.

fn rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("EDGEFIT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("{test}: seed {seed} (EDGEFIT_SEED={seed} replays it)");
    ChaCha8Rng::seed_from_u64(seed)
}

fn uniform(r: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

/// An f32 output buffer filled with NaN.
fn poisoned<B: Backend>(b: &B, len: usize) -> B::Buf<f32> {
    b.upload(&vec![f32::NAN; len]).unwrap()
}

fn up<B: Backend, T: kernels::backend::Scalar>(b: &B, host: &[T]) -> B::Buf<T> {
    b.upload(host).unwrap()
}

fn down<B: Backend>(b: &B, buf: &B::Buf<f32>) -> Vec<f32> {
    b.download(buf).unwrap()
}

/// `|got - want| <= bound[i]` everywhere and every element finite, or the first offender.
fn within(
    what: &str,
    got: &[f32],
    want: &[f64],
    bound: impl Fn(usize) -> f64,
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        if !g.is_finite() || err > bound(i) {
            return Err(format!(
                "{what}: element {i} is {g}, expected {w} (error {err:e} > bound {:e})",
                bound(i)
            ));
        }
    }
    Ok(())
}

/// `|got - want| <= atol + rtol |want|`.
fn close(what: &str, got: &[f32], want: &[f32], atol: f64, rtol: f64) -> Result<(), String> {
    let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
    within(what, got, &want, |i| atol + rtol * want[i].abs())
}

/// `close` on what `out` holds, failing the test with the backend's name and `what`.
fn expect_close<B: Backend>(
    b: &B,
    what: &str,
    out: &B::Buf<f32>,
    want: &[f32],
    atol: f64,
    rtol: f64,
) {
    let what = format!("{} {what}", b.name());
    close(&what, &down(b, out), want, atol, rtol).unwrap();
}

/// The scaled error `|got - want| / (1 + |want|) <= tol` of the DeltaNet tests.
fn scaled(what: &str, got: &[f32], want: &[f32], tol: f32) -> Result<(), String> {
    close(what, got, want, f64::from(tol), f64::from(tol))
}

/// Tolerances of the f32 elementwise ops: a few roundings of f32 (2^-24 each) and the device's `expf` / `tanhf`.
const OP_RTOL: f64 = 1e-5;
const OP_ATOL: f64 = 1e-6;

// ---------------------------------------------------------------------------------------------------------------
// The ops, one function per family.

fn embedding<B: Backend>(b: &B) {
    let mut r = rng("embedding");
    let (vocab, dim) = (37, 19);
    let ids: Vec<u32> = (0..5)
        .map(|_| r.gen_range(0..vocab as u32))
        .chain([vocab as u32 - 1])
        .collect();
    let w = uniform(&mut r, vocab * dim, -1.0, 1.0);
    let bits: Vec<u16> = w.iter().map(|&v| f32_to_bf16(v)).collect();
    let (k4, n4) = (96, 70);
    let w4 = Int4Weights::quantize(
        &uniform(&mut r, n4 * k4, -1.0, 1.0),
        n4,
        k4,
        32,
        Int4Scheme::Asymmetric,
    )
    .unwrap();
    let logical = w4.to_logical();
    let ids4: Vec<u32> = vec![0, 69, 3, 64, 17];
    let cases: Vec<(&str, Embedding, &[u32], Vec<f32>)> = vec![
        (
            "f32",
            Embedding::f32(w.clone(), dim).unwrap(),
            &ids,
            ids.iter()
                .flat_map(|&i| w[i as usize * dim..][..dim].to_vec())
                .collect(),
        ),
        (
            "bf16",
            Embedding::bf16(bits.clone(), dim).unwrap(),
            &ids,
            ids.iter()
                .flat_map(|&i| {
                    bits[i as usize * dim..][..dim]
                        .iter()
                        .map(|&v| bf16_to_f32(v))
                })
                .collect(),
        ),
        (
            "int4",
            Embedding::Int4(w4.clone()),
            &ids4,
            ids4.iter()
                .flat_map(|&i| (0..k4).map(move |c| (i, c)))
                .map(|(i, c)| logical.at(i as usize, c) as f32)
                .collect(),
        ),
    ];
    for (what, table, ids, want) in cases {
        let dim = table.dim();
        let t = b.prepare_table(table).unwrap();
        let mut out = poisoned(b, ids.len() * dim);
        b.embedding_gather(&t, &up(b, ids), &mut out).unwrap();
        expect_close(b, &format!("gather {what}"), &out, &want, 1e-6, 1e-6);
    }
}

fn norms<B: Backend>(b: &B) {
    let mut r = rng("norms");
    // Odd rows, a dim off every vector width; then a per-head q/k norm (15 rows of a [18] weight).
    for (rows, dim) in [(7, 37), (15, 18)] {
        let x = uniform(&mut r, rows * dim, -3.0, 3.0);
        let res = uniform(&mut r, rows * dim, -3.0, 3.0);
        let w = uniform(&mut r, dim, -1.0, 1.0);
        for form in [NormWeight::Plain, NormWeight::OnePlus] {
            let what = format!("rmsnorm {rows}x{dim} {form:?}");
            let mut want = vec![0.0; rows * dim];
            reference::ops::rmsnorm(&x, &w, form, 1e-6, &mut want).unwrap();
            let mut out = poisoned(b, rows * dim);
            b.rmsnorm(&up(b, &x), &up(b, &w), form, 1e-6, &mut out)
                .unwrap();
            expect_close(b, &what, &out, &want, OP_ATOL, OP_RTOL);

            let sum: Vec<f32> = res.iter().zip(&x).map(|(a, b)| a + b).collect();
            reference::ops::rmsnorm(&sum, &w, form, 1e-6, &mut want).unwrap();
            let (mut residual, mut out) = (up(b, &res), poisoned(b, rows * dim));
            b.add_rmsnorm(&up(b, &x), &mut residual, &up(b, &w), form, 1e-6, &mut out)
                .unwrap();
            assert_eq!(
                down(b, &residual),
                sum,
                "{} {what}: residual += x",
                b.name()
            );
            expect_close(b, &format!("{what} add"), &out, &want, OP_ATOL, OP_RTOL);
        }
    }
}

fn rope<B: Backend>(b: &B) {
    let mut r = rng("rope");
    // Full and partial rotary dims, a theta per layer type, positions far from 0.
    for (head_dim, partial, theta, heads) in
        [(40, 0.6, 1e6, 3), (64, 1.0, 1e4, 1), (18, 0.25, 5e6, 5)]
    {
        let rope = Rope::new(head_dim, partial, theta).unwrap();
        let positions: Vec<u32> = (0..5).map(|_| r.gen_range(0..8192)).collect();
        let x = uniform(&mut r, positions.len() * heads * head_dim, -1.0, 1.0);
        let mut want = x.clone();
        reference::attention::rope_neox(&rope, heads, &positions, &mut want).unwrap();
        let mut got = up(b, &x);
        b.rope_neox(&rope, heads, &up(b, &positions), &mut got)
            .unwrap();
        let what = format!("rope D{head_dim} rot{} theta{theta}", rope.rotary_dim);
        expect_close(b, &what, &got, &want, 1e-5, 1e-5);
    }
}

/// The host's copy of a slot cache, `[slots, max_len, kv_heads * head_dim]`.
struct Histories {
    k: Vec<f32>,
    v: Vec<f32>,
    width: usize,
    max_len: usize,
}

impl Histories {
    /// Keys and values `[0..=p]` of `slot`, `[p + 1, Hkv, D]`.
    fn upto(&self, slot: usize, p: usize) -> (&[f32], &[f32]) {
        let at = slot * self.max_len * self.width;
        let end = at + (p + 1) * self.width;
        (&self.k[at..end], &self.v[at..end])
    }
}

fn attention<B: Backend>(b: &B) {
    let mut r = rng("attention");
    let dims = common::attn(6, 2, 40);
    let (slots, max_len, width, qw) = (3usize, 50usize, 2 * 40, 6 * 40);
    let lens = [11usize, 29, 23];
    let scale = 1.0 / (40f32).sqrt();
    // Every token of every slot in one store call, the slots interleaved.
    let mut tok: Vec<(u32, u32)> = Vec::new();
    for p in 0..29 {
        for (s, &l) in lens.iter().enumerate() {
            if p < l {
                tok.push((s as u32, p as u32));
            }
        }
    }
    let k = uniform(&mut r, tok.len() * width, -1.0, 1.0);
    let v = uniform(&mut r, tok.len() * width, -1.0, 1.0);
    let mut hist = Histories {
        k: vec![0.0; slots * max_len * width],
        v: vec![0.0; slots * max_len * width],
        width,
        max_len,
    };
    for (i, &(s, p)) in tok.iter().enumerate() {
        let at = (s as usize * max_len + p as usize) * width;
        hist.k[at..at + width].copy_from_slice(&k[i * width..(i + 1) * width]);
        hist.v[at..at + width].copy_from_slice(&v[i * width..(i + 1) * width]);
    }
    let mut cache = KvCache::new(b, dims, slots, max_len).unwrap();
    let (ts, tp): (Vec<u32>, Vec<u32>) = tok.iter().copied().unzip();
    b.kv_store(&mut cache, &up(b, &k), &up(b, &v), &up(b, &ts), &up(b, &tp))
        .unwrap();
    assert_eq!(
        b.download(cache.k()).unwrap(),
        hist.k,
        "{} kv_store: keys",
        b.name()
    );
    assert_eq!(
        b.download(cache.v()).unwrap(),
        hist.v,
        "{} kv_store: values",
        b.name()
    );

    // A prompt (slot 1 from position 0), a decode batch over three slots, a chunk after a cached prefix.
    let calls: [(&str, Vec<(u32, u32)>); 3] = [
        ("prompt", (0..29).map(|p| (1, p)).collect()),
        ("decode", vec![(0, 10), (2, 22), (1, 17)]),
        ("chunk", (3..23).map(|p| (2, p)).collect()),
    ];
    for (what, toks) in &calls {
        for window in [None, Some(7)] {
            let t = toks.len();
            let q = uniform(&mut r, t * qw, -1.0, 1.0);
            let mut want = vec![0.0f32; t * qw];
            if *what == "prompt" {
                let (kh, vh) = hist.upto(1, t - 1);
                reference::attention::prefill(&dims, scale, window, t, &q, kh, vh, &mut want)
                    .unwrap();
            } else {
                for (i, &(s, p)) in toks.iter().enumerate() {
                    let (kh, vh) = hist.upto(s as usize, p as usize);
                    let o = &mut want[i * qw..(i + 1) * qw];
                    reference::attention::decode_dense(
                        &dims,
                        scale,
                        window,
                        p as usize + 1,
                        &q[i * qw..(i + 1) * qw],
                        kh,
                        vh,
                        o,
                    )
                    .unwrap();
                }
            }
            let (ss, pp): (Vec<u32>, Vec<u32>) = toks.iter().copied().unzip();
            let mut out = poisoned(b, t * qw);
            b.attention(
                &cache,
                scale,
                window,
                &up(b, &q),
                &up(b, &ss),
                &up(b, &pp),
                &mut out,
            )
            .unwrap();
            expect_close(
                b,
                &format!("attention {what} window {window:?}"),
                &out,
                &want,
                2e-5,
                1e-4,
            );
        }
    }
}

fn gates<B: Backend>(b: &B) {
    let mut r = rng("gates");
    let (rows, heads, d) = (5, 3, 7);
    let x = uniform(&mut r, rows * heads * d, -2.0, 2.0);
    let g = uniform(&mut r, rows * heads * d, -6.0, 6.0);
    let gh = uniform(&mut r, rows * heads, -6.0, 6.0);
    let sig = |v: f32| 1.0 / (1.0 + (-f64::from(v)).exp());
    let want: Vec<f32> = x
        .iter()
        .zip(&g)
        .map(|(&x, &g)| (f64::from(x) * sig(g)) as f32)
        .collect();
    let mut got = up(b, &x);
    b.sigmoid_gate(&mut got, &up(b, &g)).unwrap();
    expect_close(b, "sigmoid_gate", &got, &want, OP_ATOL, OP_RTOL);
    let want: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, &x)| (f64::from(x) * sig(gh[i / d])) as f32)
        .collect();
    let mut got = up(b, &x);
    b.sigmoid_head_gate(&mut got, heads, &up(b, &gh)).unwrap();
    expect_close(b, "sigmoid_head_gate", &got, &want, OP_ATOL, OP_RTOL);
}

fn activations<B: Backend>(b: &B) {
    let mut r = rng("activations");
    let (rows, inter) = (5, 37);
    let gu = uniform(&mut r, rows * 2 * inter, -6.0, 6.0);
    for act in [GatedAct::Silu, GatedAct::GeluErf, GatedAct::GeluTanh] {
        let mut want = vec![0.0f32; rows * inter];
        match act {
            GatedAct::Silu => reference::ops::silu_and_mul(&gu, inter, &mut want).unwrap(),
            GatedAct::GeluErf => reference::ops::gelu_and_mul(&gu, inter, &mut want).unwrap(),
            GatedAct::GeluTanh => {
                // `gelu_pytorch_tanh` in f64.
                for (i, o) in want.iter_mut().enumerate() {
                    let (g, u) = (
                        f64::from(gu[(i / inter) * 2 * inter + i % inter]),
                        f64::from(gu[(i / inter) * 2 * inter + inter + i % inter]),
                    );
                    let t =
                        ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh();
                    *o = (0.5 * g * (1.0 + t) * u) as f32;
                }
            }
        }
        let mut out = poisoned(b, rows * inter);
        b.act_and_mul(act, &up(b, &gu), inter, &mut out).unwrap();
        expect_close(
            b,
            &format!("act_and_mul {act:?}"),
            &out,
            &want,
            OP_ATOL,
            OP_RTOL,
        );
    }
}

/// One linear case: a host weight, its dequantised rows (f64) and the reference output on `x`.
struct LinearCase {
    weight: Weight,
    deq: Vec<f64>,
    /// The reference on the same activations the kernel is documented to take (W4A8: its int8 rounding).
    want: Vec<f64>,
}

fn dot_rows(x: &[f32], m: usize, deq: &[f64], n: usize, k: usize, cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..cols)
                .map(|c| f64::from(x[i * k + c]) * deq[j * k + c])
                .sum();
        }
    }
    y
}

fn linear_case(
    path: &str,
    r: &mut ChaCha8Rng,
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> LinearCase {
    let row_scale: Vec<f32> = (0..n).map(|_| r.gen_range(0.05..0.5)).collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| r.gen_range(-1.0f32..1.0) * row_scale[i / k])
        .collect();
    let (weight, deq): (Weight, Vec<f64>) = match path {
        "f32" => (
            Weight::f32(w.clone(), n, k).unwrap(),
            w.iter().map(|&v| f64::from(v)).collect(),
        ),
        "bf16" => {
            let bits = reference::linear::to_bf16(&w);
            let deq = bits.iter().map(|&v| f64::from(bf16_to_f32(v))).collect();
            (Weight::bf16(bits, n, k).unwrap(), deq)
        }
        "fp8_block" => {
            let (codes, scales) = reference::linear::quantize_fp8_block(&w, n, k);
            let kb = k.div_ceil(128);
            let deq = (0..n * k)
                .map(|i| {
                    f64::from(e4m3_to_f32(codes[i]))
                        * f64::from(scales[(i / k / 128) * kb + (i % k) / 128])
                })
                .collect();
            (Weight::fp8_block(codes, scales, n, k).unwrap(), deq)
        }
        "fp8_tensor" => {
            let amax = w.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let scale = amax / 448.0;
            let codes: Vec<u8> = w.iter().map(|&v| f32_to_e4m3(v / scale)).collect();
            let deq = codes
                .iter()
                .map(|&c| f64::from(e4m3_to_f32(c)) * f64::from(scale))
                .collect();
            (Weight::fp8_tensor(codes, scale, n, k).unwrap(), deq)
        }
        "nvfp4" => {
            let (codes, scales, global) = reference::linear::quantize_nvfp4(&w, n, k);
            let deq = (0..n * k)
                .map(|i| {
                    let c = (codes[i / 2] >> (4 * (i % 2))) & 0xf;
                    f64::from(kernels::formats::e2m1_to_f32(c))
                        * f64::from(e4m3_to_f32(scales[i / 16]))
                        * f64::from(global)
                })
                .collect();
            (Weight::nvfp4(codes, scales, global, n, k).unwrap(), deq)
        }
        "w4a16" | "w4a8" => {
            let a8 = path == "w4a8";
            let scheme = if a8 {
                Int4Scheme::Symmetric
            } else {
                Int4Scheme::Asymmetric
            };
            let w4 = Int4Weights::quantize(&w, n, k, 32, scheme).unwrap();
            let l = w4.to_logical();
            let deq = (0..n * k).map(|i| l.at(i / k, i % k)).collect();
            (Weight::Int4 { w: w4, a8 }, deq)
        }
        _ => unreachable!("no such path {path}"),
    };
    let want = match &weight {
        Weight::Int4 { w, a8: true } => reference::linear::w4a8_linear(x, m, &w.to_logical())
            .into_iter()
            .map(f64::from)
            .collect(),
        _ => dot_rows(x, m, &deq, n, k, k),
    };
    LinearCase { weight, deq, want }
}

/// The bound of one output element: f32 accumulation (1e-5 of the sum of |terms|), plus what rounding the
/// activations `acts` can move it by.
fn linear_bound(acts: Acts, x: &[f32], deq: &[f64], i: usize, j: usize, k: usize) -> f64 {
    let xr = &x[i * k..(i + 1) * k];
    let wr = &deq[j * k..(j + 1) * k];
    let mag: f64 = xr
        .iter()
        .zip(wr)
        .map(|(&x, &w)| f64::from(x).abs() * w.abs())
        .sum();
    let wsum: f64 = wr.iter().map(|w| w.abs()).sum();
    let amax = xr.iter().fold(0f64, |a, &v| a.max(f64::from(v).abs()));
    1e-5 * mag
        + match acts {
            Acts::F32 => 0.0,
            Acts::Bf16 => mag / 256.0,
            Acts::Int16 => amax / 32767.0 * wsum,
            Acts::E4m3 => mag / 16.0 + amax / 448.0 / 1024.0 * wsum,
        }
        + 1e-30
}

fn linear<B: Numerics>(b: &B) {
    let mut r = rng("linear");
    // n past one 128-row scale block; k off the 16-column blocks for the dense formats, off 128 for FP8, off 64
    // (no GPU GEMM) and on it for NVFP4; m: one token, a ragged few, more than the GPU GEMVs' 16.
    let cases: [(&str, usize); 9] = [
        ("f32", 37),
        ("bf16", 91),
        ("fp8_block", 144),
        ("fp8_tensor", 272),
        ("nvfp4", 96),
        ("nvfp4", 192),
        ("w4a16", 136),
        ("w4a8", 136),
        ("w4a16", 333),
    ];
    let n = 133;
    for (path, k) in cases {
        for m in [1usize, 3, 5, 17, 19] {
            let x = common::with_outliers(&mut r, m * k, 2.0, 20.0);
            let case = linear_case(path, &mut r, &x, m, n, k);
            let what = format!("{} linear {path} m{m} n{n} k{k}", b.name());
            let lin = b
                .prepare(case.weight)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut y = poisoned(b, m * n);
            b.linear(&lin, &up(b, &x), m, &mut y).unwrap();
            let acts = B::acts(path, m, k);
            within(
                &format!("{what} ({acts:?} activations)"),
                &down(b, &y),
                &case.want,
                |e| linear_bound(acts, &x, &case.deq, e / n, e % n, k),
            )
            .unwrap();
        }
    }
}

/// The int4 linear over its formats' corners: every group size, both schemes (W4A16 asymmetric, W4A8 symmetric),
/// `n` of one column, of a whole 64-column block and off it, `k` shorter than a group, off it and on it, and
/// `m` of 1, 3 and 17 rows (the GPU's 16-row tile and one more) with a zero row (W4A8's zero scale).
fn int4_linear<B: Numerics>(b: &B) {
    let mut r = rng("int4_linear");
    for (n, k, group) in [(1, 33, 32), (70, 200, 64), (129, 96, 128), (64, 256, 32)] {
        for a8 in [false, true] {
            let path = if a8 { "w4a8" } else { "w4a16" };
            let scheme = if a8 {
                Int4Scheme::Symmetric
            } else {
                Int4Scheme::Asymmetric
            };
            let w = uniform(&mut r, n * k, -0.5, 0.5);
            let w4 = Int4Weights::quantize(&w, n, k, group, scheme).unwrap();
            let l = w4.to_logical();
            let deq: Vec<f64> = (0..n * k).map(|i| l.at(i / k, i % k)).collect();
            let lin = b.prepare(Weight::Int4 { w: w4, a8 }).unwrap();
            for m in [1usize, 3, 17] {
                let mut x = uniform(&mut r, m * k, -2.0, 2.0);
                if m > 1 {
                    x[k..2 * k].fill(0.0);
                }
                let want: Vec<f64> = if a8 {
                    reference::linear::w4a8_linear(&x, m, &l)
                        .into_iter()
                        .map(f64::from)
                        .collect()
                } else {
                    dot_rows(&x, m, &deq, n, k, k)
                };
                let mut y = poisoned(b, m * n);
                b.linear(&lin, &up(b, &x), m, &mut y).unwrap();
                let acts = B::acts(path, m, k);
                within(
                    &format!(
                        "{} {path} m{m} n{n} k{k} group{group} ({acts:?} activations)",
                        b.name()
                    ),
                    &down(b, &y),
                    &want,
                    |e| linear_bound(acts, &x, &deq, e / n, e % n, k),
                )
                .unwrap();
            }
        }
    }
}

/// The router's reference with f32 weights (what both backends write).
fn route_reference(
    logits: &[f32],
    experts: usize,
    top_k: usize,
    renorm: bool,
) -> (Vec<u32>, Vec<f32>) {
    let (ids, w) = reference::moe::route(logits, experts, top_k, renorm).unwrap();
    (ids, w.into_iter().map(|v| v as f32).collect())
}

/// A whole sparse MoE layer: the route against [`route_reference`] (rows of distinct logits 0.1 apart, so f32 and
/// f64 cannot order a near-tie differently, and one row of equal logits, which picks the lowest ids), the dispatch
/// on the host from the downloaded ids, each expert's rows gathered (exactly) and run through its own linear, the
/// combine against the per-token f64 sum of the experts it chose, twice with the same bits. Then a non-finite
/// router logit: refused on the CPU, flagged on the GPU.
fn moe<B: Backend>(b: &B) {
    let mut r = rng("moe");
    for (tokens, experts, top_k, renorm, hidden, out_dim) in [
        (1, 8, 2, true, 19, 7),
        (3, 64, 8, false, 40, 33),
        (17, 10, 3, true, 13, 9),
        (5, 160, 10, true, 24, 5),
    ] {
        let what = format!("{} moe t{tokens} e{experts} k{top_k}", b.name());
        let mut logits: Vec<f32> = Vec::new();
        for _ in 0..tokens {
            let mut row: Vec<f32> = (0..experts).map(|i| i as f32 * 0.1 - 3.0).collect();
            row.shuffle(&mut r);
            logits.extend(row);
        }
        if tokens > 1 {
            logits[experts..2 * experts].fill(0.5);
        }
        let (want_ids, want_w) = route_reference(&logits, experts, top_k, renorm);
        let mut ids = up(b, &vec![u32::MAX - 1; tokens * top_k]);
        let mut weights = poisoned(b, tokens * top_k);
        b.moe_route(
            &up(b, &logits),
            experts,
            top_k,
            renorm,
            &mut ids,
            &mut weights,
        )
        .unwrap();
        let ids = b.download(&ids).unwrap();
        assert_eq!(ids, want_ids, "{what}: ids");
        // expf and f32 sums: a few roundings of each weight.
        close(
            &format!("{what}: weights"),
            &down(b, &weights),
            &want_w,
            1e-9,
            2e-6,
        )
        .unwrap();

        let d = dispatch_ids(&ids, experts, top_k).unwrap();
        let (tok, pair_rows) = (up(b, d.all_tokens()), up(b, &d.pair_rows().unwrap()));
        let x = uniform(&mut r, tokens * hidden, -2.0, 2.0);
        let xb = up(b, &x);
        let ws: Vec<Vec<f32>> = (0..experts)
            .map(|_| uniform(&mut r, out_dim * hidden, -0.5, 0.5))
            .collect();
        let mut outs = Vec::new();
        for (e, we) in ws.iter().enumerate() {
            let rows = d.tokens(e).len();
            if rows == 0 {
                continue;
            }
            let mut xe = poisoned(b, rows * hidden);
            b.moe_gather(&xb, hidden, &tok, d.offset(e), &mut xe)
                .unwrap();
            let want_xe: Vec<f32> = d
                .tokens(e)
                .iter()
                .flat_map(|&t| x[t as usize * hidden..][..hidden].to_vec())
                .collect();
            assert_eq!(down(b, &xe), want_xe, "{what}: expert {e}'s gathered rows");
            let lin = b
                .prepare(Weight::f32(we.clone(), out_dim, hidden).unwrap())
                .unwrap();
            let mut ye = poisoned(b, rows * out_dim);
            b.linear(&lin, &xe, rows, &mut ye).unwrap();
            outs.push(ye);
        }
        let parts: Vec<&B::Buf<f32>> = outs.iter().collect();
        let mut out = poisoned(b, tokens * out_dim);
        b.moe_combine(&parts, out_dim, top_k, &weights, &pair_rows, &mut out)
            .unwrap();
        // The reference takes the backend's own weights, so the combine is checked apart from the router.
        let w = down(b, &weights);
        let (mut want, mut mag) = (
            vec![0.0f64; tokens * out_dim],
            vec![0.0f64; tokens * out_dim],
        );
        for t in 0..tokens {
            for j in 0..top_k {
                let (e, wj) = (ids[t * top_k + j] as usize, f64::from(w[t * top_k + j]));
                for o in 0..out_dim {
                    let terms = (0..hidden)
                        .map(|c| f64::from(ws[e][o * hidden + c]) * f64::from(x[t * hidden + c]));
                    let (dot, abs) = terms.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
                    want[t * out_dim + o] += wj * dot;
                    mag[t * out_dim + o] += wj.abs() * abs;
                }
            }
        }
        let got = down(b, &out);
        within(&format!("{what}: combine"), &got, &want, |i| {
            1e-5 * mag[i] + 1e-30
        })
        .unwrap();
        let mut again = poisoned(b, tokens * out_dim);
        b.moe_combine(&parts, out_dim, top_k, &weights, &pair_rows, &mut again)
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&down(b, &again)),
            bits(&got),
            "{what}: the combine is deterministic"
        );
    }

    // A NaN router logit in token 1 of 2: the CPU refuses the call, the GPU flags the token and routes the other.
    let mut logits = uniform(&mut r, 2 * 6, -1.0, 1.0);
    logits[8] = f32::NAN;
    let (mut ids, mut weights) = (up(b, &[0u32; 4]), poisoned(b, 4));
    let routed = b.moe_route(&up(b, &logits), 6, 2, true, &mut ids, &mut weights);
    if b.name() == "cpu" {
        assert!(routed.is_err(), "cpu: a NaN router logit is refused");
    } else {
        routed.unwrap();
        let (ids, w) = (b.download(&ids).unwrap(), down(b, &weights));
        assert_eq!(
            ids[2..],
            [Gpu::INVALID_TOKEN; 2],
            "cuda: the NaN token is flagged"
        );
        assert!(
            w[2..].iter().all(|v| v.is_nan()),
            "cuda: NaN weights for it"
        );
        assert_eq!(ids[..2], route_reference(&logits[..6], 6, 2, true).0[..]);
    }
}

/// A gated DeltaNet layer's parameters and one batch of inputs, on the host.
struct GdnCase {
    dims: GdnDims,
    conv_weight: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
}

impl GdnCase {
    /// Conv weights in (-0.6, 0.6), `A_log` and dt bias in (-1, 1), norm weights in (0.5, 1.5).
    fn new(r: &mut ChaCha8Rng, dims: GdnDims) -> GdnCase {
        GdnCase {
            dims,
            conv_weight: uniform(r, dims.conv_dim() * dims.conv_kernel, -0.6, 0.6),
            a_log: uniform(r, dims.value_heads, -1.0, 1.0),
            dt_bias: uniform(r, dims.value_heads, -1.0, 1.0),
            norm: uniform(r, dims.value_dim, 0.5, 1.5),
        }
    }

    fn weights(&self) -> GdnWeights<'_> {
        GdnWeights {
            conv_weight: &self.conv_weight,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm,
            norm_eps: 1e-6,
        }
    }
}

/// `(qkv, z, a, b)` of `n` tokens.
fn gdn_tokens(r: &mut ChaCha8Rng, d: &GdnDims, n: usize) -> [Vec<f32>; 4] {
    [
        uniform(r, n * d.conv_dim(), -1.5, 1.5),
        uniform(r, n * d.value_width(), -2.0, 2.0),
        uniform(r, n * d.value_heads, -3.0, 2.0),
        uniform(r, n * d.value_heads, -3.0, 3.0),
    ]
}

/// The four token buffers `(qkv, z, a, b)` as one DeltaNet input.
fn gdn_in<B: Backend>(x: &[B::Buf<f32>]) -> GdnIn<'_, B> {
    GdnIn {
        qkv: &x[0],
        z: &x[1],
        a: &x[2],
        b: &x[3],
    }
}

/// The reference: each sequence through [`reference::gdn::sequence`] from the given history and state.
fn gdn_reference(
    c: &GdnCase,
    x: &[Vec<f32>; 4],
    seq_lens: &[usize],
    conv: &mut [f32],
    state: &mut [f32],
) -> Vec<f32> {
    let d = &c.dims;
    let (cd, vw, hv, cl, sl) = (
        d.conv_dim(),
        d.value_width(),
        d.value_heads,
        d.conv_state_len(),
        d.state_len(),
    );
    let mut out = vec![0.0; seq_lens.iter().sum::<usize>() * vw];
    let mut t0 = 0;
    for (i, &t) in seq_lens.iter().enumerate() {
        let xi = GdnInputs {
            qkv: &x[0][t0 * cd..(t0 + t) * cd],
            z: &x[1][t0 * vw..(t0 + t) * vw],
            a: &x[2][t0 * hv..(t0 + t) * hv],
            b: &x[3][t0 * hv..(t0 + t) * hv],
        };
        if t > 0 {
            reference::gdn::sequence(
                d,
                &c.weights(),
                t,
                &xi,
                &mut conv[i * cl..(i + 1) * cl],
                &mut state[i * sl..(i + 1) * sl],
                &mut out[t0 * vw..(t0 + t) * vw],
            )
            .unwrap();
        }
        t0 += t;
    }
    out
}

/// A DeltaNet call's output, state and conv history against the reference's, within `(out, state)` bounds.
fn check_gdn<B: Backend>(
    b: &B,
    what: &str,
    (out_tol, state_tol): (f32, f32),
    (out, want): (&B::Buf<f32>, &[f32]),
    st: &GdnState<B>,
    state: &[f32],
    conv: &[f32],
) {
    scaled(&format!("{what} out"), &down(b, out), want, out_tol).unwrap();
    scaled(
        &format!("{what} state"),
        &down(b, st.state()),
        state,
        state_tol,
    )
    .unwrap();
    // The history is the last K-1 inputs, copied as they are.
    scaled(&format!("{what} conv"), &down(b, st.conv()), conv, 1e-6).unwrap();
}

fn gdn<B: Numerics>(b: &B) {
    let mut r = rng("gdn");
    // dk = dv = 128 (what the GPU kernels are built for), two value heads per key head, a sequence shorter than a
    // chunk, an empty one, and one of more than a chunk with a ragged end; a history and state that are not zero.
    let dims = common::gdn_dims_of(1, 2, 128, 128, 4);
    let c = GdnCase::new(&mut r, dims);
    let seq_lens = [37usize, 0, 70];
    let seqs = seq_lens.len();
    let mut conv = uniform(&mut r, seqs * dims.conv_state_len(), -1.0, 1.0);
    let mut state = uniform(&mut r, seqs * dims.state_len(), -0.1, 0.1);
    let layer = GdnLayer::upload(b, &c.weights()).unwrap();
    let mut st = GdnState::from_host(b, dims, seqs, &conv, &state).unwrap();

    let x = gdn_tokens(&mut r, &dims, 107);
    let want = gdn_reference(&c, &x, &seq_lens, &mut conv, &mut state);
    let xb: Vec<B::Buf<f32>> = x.iter().map(|v| up(b, v)).collect();
    let mut out = poisoned(b, 107 * dims.value_width());
    b.gdn_prefill(
        &dims,
        &layer,
        &gdn_in::<B>(&xb),
        &seq_lens,
        &mut st,
        &mut out,
    )
    .unwrap();
    let what = format!("{} gdn_prefill {seq_lens:?}", b.name());
    check_gdn(b, &what, B::GDN_PREFILL, (&out, &want), &st, &state, &conv);

    // One decode step for every sequence, each device starting from the reference's history and state after
    // the prefill, so that the step's bound is not the prefill's.
    let mut st = GdnState::from_host(b, dims, seqs, &conv, &state).unwrap();
    let x = gdn_tokens(&mut r, &dims, seqs);
    let want = gdn_reference(&c, &x, &[1; 3], &mut conv, &mut state);
    let xb: Vec<B::Buf<f32>> = x.iter().map(|v| up(b, v)).collect();
    let mut out = poisoned(b, seqs * dims.value_width());
    b.gdn_decode(&dims, &layer, &gdn_in::<B>(&xb), &mut st, &mut out)
        .unwrap();
    let what = format!("{} gdn_decode", b.name());
    check_gdn(b, &what, B::GDN_DECODE, (&out, &want), &st, &state, &conv);
}

fn logits<B: Backend>(b: &B) {
    let mut r = rng("logits");
    let vocab = 1001;
    // 3 rows and 20 (the GPU argmax changes kernels past 16 rows); a tie between two maxima answers the first.
    for rows in [3usize, 20] {
        let mut x = uniform(&mut r, rows * vocab, -50.0, 50.0);
        x[vocab + 17] = 60.0;
        x[vocab + 500] = 60.0;
        let want: Vec<f32> = x
            .iter()
            .map(|&v| (30.0 * (f64::from(v) / 30.0).tanh()) as f32)
            .collect();
        let mut got = up(b, &x);
        b.softcap(&mut got, 30.0).unwrap();
        expect_close(b, "softcap", &got, &want, 1e-5, OP_RTOL);
        let best: Vec<u32> = x
            .chunks_exact(vocab)
            .map(|row| {
                row.iter()
                    .enumerate()
                    .fold(0, |bi, (i, &v)| if v > row[bi] { i } else { bi }) as u32
            })
            .collect();
        assert_eq!(best[1], 17, "the first of two equal maxima");
        let mut out = b.upload(&vec![u32::MAX - 1; rows]).unwrap();
        b.argmax(&up(b, &x), vocab, &mut out).unwrap();
        assert_eq!(
            b.download(&out).unwrap(),
            best,
            "{} argmax rows {rows}",
            b.name()
        );
    }
    // The small elementwise ops are single f32 operations: the same bits as the host's.
    let (rows, n) = (7, 13);
    let x = uniform(&mut r, rows * n, -4.0, 4.0);
    let y = uniform(&mut r, rows * n, -4.0, 4.0);
    let bias = uniform(&mut r, n, -4.0, 4.0);
    let mut got = up(b, &x);
    b.add_assign(&mut got, &up(b, &y)).unwrap();
    b.add_bias_rows(&mut got, &up(b, &bias)).unwrap();
    b.scale_assign(&mut got, 0.37).unwrap();
    let want: Vec<f32> = (0..rows * n)
        .map(|i| (x[i] + y[i] + bias[i % n]) * 0.37)
        .collect();
    assert_eq!(
        down(b, &got),
        want,
        "{} add_assign, add_bias_rows, scale_assign",
        b.name()
    );
}

/// Draws per row against the host's `sampling::sample` with the same generators: the tokens and the generators'
/// words after the draw, for sampled and greedy parameters over ragged row counts.
fn sampling<B: Backend>(b: &B) {
    use kernels::sampling::{sample, Pcg32, SamplingParams};
    let mut r = rng("sampling");
    let vocab = 301;
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.9,
    };
    for (rows, params) in [
        (5usize, sampled),
        (3, SamplingParams::GREEDY),
        (17, sampled),
    ] {
        let x = uniform(&mut r, rows * vocab, -4.0, 4.0);
        let gens: Vec<Pcg32> = (0..rows).map(|i| Pcg32::new(r.gen(), i as u64)).collect();
        let mut want_gens = gens.clone();
        let want: Vec<u32> = x
            .chunks_exact(vocab)
            .zip(&mut want_gens)
            .map(|(row, g)| sample(row, &params, g).unwrap() as u32)
            .collect();
        let words: Vec<u32> = gens.iter().flat_map(|g| g.to_words()).collect();
        let mut rng_buf = b.upload(&words).unwrap();
        let mut out = b.upload(&vec![u32::MAX - 1; rows]).unwrap();
        b.sample(&up(b, &x), vocab, &params, &mut rng_buf, &mut out)
            .unwrap();
        let what = format!("{} sample rows {rows} {params:?}", b.name());
        assert_eq!(b.download(&out).unwrap(), want, "{what}: tokens");
        let want_words: Vec<u32> = want_gens.iter().flat_map(|g| g.to_words()).collect();
        assert_eq!(
            b.download(&rng_buf).unwrap(),
            want_words,
            "{what}: generators"
        );
    }
    // The generator words must match the rows.
    let mut short = b.upload(&[0u32; 7]).unwrap();
    let mut out = b.upload(&[0u32; 2]).unwrap();
    assert!(b
        .sample(
            &up(b, &vec![0.0; 2 * vocab]),
            vocab,
            &sampled,
            &mut short,
            &mut out
        )
        .is_err());
}

fn casts<B: Backend>(b: &B) {
    let mut r = rng("casts");
    // Random values, exact ties of the bf16 rounding, infinities, signed zeros, subnormals, the f32 extremes.
    let mut x = uniform(&mut r, 37, -1e3, 1e3);
    x.extend([
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        1e-40,
        -1e-41,
        f32::MAX,
        f32::MIN_POSITIVE,
    ]);
    let want: Vec<u16> = x.iter().map(|&v| f32_to_bf16(v)).collect();
    let mut bits = b.upload(&vec![0x7fc1u16; x.len()]).unwrap();
    b.cast_f32_to_bf16(&up(b, &x), &mut bits).unwrap();
    assert_eq!(
        b.download(&bits).unwrap(),
        want,
        "{} cast_f32_to_bf16",
        b.name()
    );
    let mut back = poisoned(b, x.len());
    b.cast_bf16_to_f32(&bits, &mut back).unwrap();
    let got = down(b, &back);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            bf16_to_f32(w).to_bits(),
            "{} cast_bf16_to_f32 element {i}",
            b.name()
        );
    }
}

/// Bad sizes are errors that name the op, never a crash, and a refused call leaves its buffers as they were.
fn bad_sizes<B: Backend>(b: &B) {
    let name = b.name();
    let is_shape = |e: KernelError| matches!(e, KernelError::Shape { .. });
    let dims = common::attn(2, 1, 8);
    assert!(
        KvCache::new(b, dims, usize::MAX / 4, 8).is_err(),
        "{name}: a cache whose size overflows"
    );
    let gd = common::gdn_dims_of(1, 1, 128, 128, 4);
    assert!(
        GdnState::new(b, gd, usize::MAX / 8).is_err(),
        "{name}: a state whose size overflows"
    );
    let mut out = poisoned(b, 5);
    assert!(is_shape(
        b.rmsnorm(
            &up(b, &[1.0; 6]),
            &up(b, &[1.0; 3]),
            NormWeight::Plain,
            1e-6,
            &mut out
        )
        .unwrap_err()
    ));
    let (mut residual, mut out6) = (up(b, &[1.0f32; 6]), poisoned(b, 5));
    assert!(b
        .add_rmsnorm(
            &up(b, &[1.0; 6]),
            &mut residual,
            &up(b, &[1.0; 3]),
            NormWeight::Plain,
            1e-6,
            &mut out6
        )
        .is_err());
    assert_eq!(
        down(b, &residual),
        [1.0; 6],
        "{name}: a refused add_rmsnorm leaves the residual"
    );
    let w = b
        .prepare(Weight::f32(vec![1.0; 12], 3, 4).unwrap())
        .unwrap();
    let mut y = poisoned(b, 5);
    assert!(
        is_shape(b.linear(&w, &up(b, &[1.0; 8]), 2, &mut y).unwrap_err()),
        "{name}: linear y length"
    );
    assert!(
        b.linear(&w, &up(b, &[1.0; 8]), usize::MAX, &mut y).is_err(),
        "{name}: linear m overflows"
    );
    let mut cache = KvCache::new(b, dims, 2, 4).unwrap();
    assert!(b
        .kv_store(
            &mut cache,
            &up(b, &[0.0; 7]),
            &up(b, &[0.0; 8]),
            &up(b, &[0u32]),
            &up(b, &[0u32])
        )
        .is_err());
    let mut logits_out = b.zeros::<u32>(2).unwrap();
    assert!(
        b.argmax(&up(b, &[0.0; 7]), 3, &mut logits_out).is_err(),
        "{name}: argmax rows"
    );
    assert!(
        b.softcap(&mut up(b, &[1.0f32]), f32::NAN).is_err(),
        "{name}: softcap cap"
    );
    let mut gate_x = up(b, &[1.0f32; 4]);
    assert!(b
        .sigmoid_head_gate(&mut gate_x, 3, &up(b, &[0.0; 3]))
        .is_err());
    assert!(b
        .act_and_mul(GatedAct::Silu, &up(b, &[0.0; 7]), 2, &mut poisoned(b, 2))
        .is_err());
    assert!(Embedding::f32(vec![0.0; 7], 2).is_err() && Embedding::bf16(vec![], 2).is_err());

    // int4: a wrong output length, an overflowing m, and W4A8 on asymmetric weights (the GPU refuses them when
    // preparing, the CPU when called).
    let w4 = |scheme| Int4Weights::quantize(&[0.25; 3 * 40], 3, 40, 32, scheme).unwrap();
    let lin = b
        .prepare(Weight::Int4 {
            w: w4(Int4Scheme::Asymmetric),
            a8: false,
        })
        .unwrap();
    let x40 = up(b, &[1.0f32; 40]);
    assert!(
        is_shape(b.linear(&lin, &x40, 1, &mut poisoned(b, 4)).unwrap_err()),
        "{name}: int4 linear y length"
    );
    assert!(
        is_shape(
            b.linear(&lin, &x40, usize::MAX, &mut poisoned(b, 3))
                .unwrap_err()
        ),
        "{name}: int4 linear m overflows"
    );
    let asym_a8 = b
        .prepare(Weight::Int4 {
            w: w4(Int4Scheme::Asymmetric),
            a8: true,
        })
        .and_then(|l| b.linear(&l, &x40, 1, &mut poisoned(b, 3)));
    assert!(
        is_shape(asym_a8.unwrap_err()),
        "{name}: W4A8 on asymmetric weights"
    );

    // MoE: top_k outside 1..=experts, logits off whole rows, outputs of the wrong length (left as they were),
    // gathers past the dispatch or off whole rows, a combine whose pair rows do not match its tokens.
    let logits = up(b, &[0.0f32; 12]);
    let (mut ids, mut weights) = (up(b, &[7u32; 6]), poisoned(b, 6));
    for (experts, top_k) in [(4, 0), (4, 5), (5, 2)] {
        assert!(
            is_shape(
                b.moe_route(&logits, experts, top_k, true, &mut ids, &mut weights)
                    .unwrap_err()
            ),
            "{name}: moe_route experts {experts} top_k {top_k}"
        );
    }
    let mut short_ids = up(b, &[7u32; 5]);
    assert!(is_shape(
        b.moe_route(&logits, 4, 2, true, &mut short_ids, &mut weights)
            .unwrap_err()
    ));
    assert_eq!(
        b.download(&short_ids).unwrap(),
        [7; 5],
        "{name}: a refused moe_route leaves ids"
    );
    assert!(
        down(b, &weights).iter().all(|v| v.is_nan()),
        "{name}: a refused moe_route leaves weights"
    );
    let (x, tokens) = (up(b, &[1.0f32; 12]), up(b, &[0u32, 2, 1]));
    for (hidden, start, out_len) in [(4, 2, 8), (4, usize::MAX, 4), (4, 0, 6), (0, 0, 4)] {
        assert!(
            is_shape(
                b.moe_gather(&x, hidden, &tokens, start, &mut poisoned(b, out_len))
                    .unwrap_err()
            ),
            "{name}: moe_gather hidden {hidden} start {start} out {out_len}"
        );
    }
    let part = up(b, &[1.0f32; 8]);
    let (w2, rows2) = (up(b, &[0.5f32; 4]), up(b, &[0u32, 1, 1, 0]));
    assert!(
        is_shape(
            b.moe_combine(&[&part], 4, 2, &w2, &rows2, &mut poisoned(b, 12))
                .unwrap_err()
        ),
        "{name}: moe_combine pair rows for 2 tokens, out for 3"
    );
    assert!(
        is_shape(
            b.moe_combine(&[&part], 3, 2, &w2, &rows2, &mut poisoned(b, 6))
                .unwrap_err()
        ),
        "{name}: moe_combine parts off whole rows"
    );
}

/// The checks above reject plausible wrong answers: the norm's other weight form, attention without its window,
/// a linear that drops the ragged tail of k, a DeltaNet prefill from a zero state, an unwritten element.
#[test]
fn the_checks_catch_wrong_answers() {
    let mut r = rng("wrong_answers");
    let cpu = Cpu;
    let (x, w) = (
        uniform(&mut r, 7 * 37, -3.0, 3.0),
        uniform(&mut r, 37, -1.0, 1.0),
    );
    let mut want = vec![0.0; x.len()];
    reference::ops::rmsnorm(&x, &w, NormWeight::OnePlus, 1e-6, &mut want).unwrap();
    let mut got = vec![f32::NAN; x.len()];
    cpu.rmsnorm(&x, &w, NormWeight::Plain, 1e-6, &mut got)
        .unwrap();
    assert!(close("rmsnorm form", &got, &want, OP_ATOL, OP_RTOL).is_err());

    let dims = common::attn(2, 1, 16);
    let t = 20;
    let (q, k, v) = (
        uniform(&mut r, t * 32, -1.0, 1.0),
        uniform(&mut r, t * 16, -1.0, 1.0),
        uniform(&mut r, t * 16, -1.0, 1.0),
    );
    let mut want = vec![0.0; t * 32];
    reference::attention::prefill(&dims, 0.25, Some(7), t, &q, &k, &v, &mut want).unwrap();
    let mut cache = KvCache::new(&cpu, dims, 1, t).unwrap();
    let pos: Vec<u32> = (0..t as u32).collect();
    cpu.kv_store(&mut cache, &k, &v, &vec![0; t], &pos).unwrap();
    let mut got = vec![f32::NAN; t * 32];
    cpu.attention(&cache, 0.25, None, &q, &vec![0; t], &pos, &mut got)
        .unwrap();
    assert!(close("attention window", &got, &want, 2e-5, 1e-4).is_err());

    // The linear bound with bf16 activations (the loosest but the FP8 GEMM's) still sees 16 missing columns.
    let (m, n, k) = (5, 133, 144);
    let x: Vec<f32> = uniform(&mut r, m * k, -2.0, 2.0);
    let case = linear_case("fp8_block", &mut r, &x, m, n, k);
    let short = dot_rows(&x, m, &case.deq, n, k, 128);
    let lin = cpu.prepare(case.weight).unwrap();
    let mut y = vec![f32::NAN; m * n];
    cpu.linear(&lin, &x, m, &mut y).unwrap();
    assert!(within("linear", &y, &case.want, |e| linear_bound(
        Acts::Bf16,
        &x,
        &case.deq,
        e / n,
        e % n,
        k
    ))
    .is_ok());
    assert!(within("linear tail", &y, &short, |e| linear_bound(
        Acts::Bf16,
        &x,
        &case.deq,
        e / n,
        e % n,
        k
    ))
    .is_err());
    y[m * n - 1] = f32::NAN;
    assert!(within("linear unwritten", &y, &case.want, |_| f64::INFINITY).is_err());

    // W4A8 against W4A16's reference (the activations unrounded) under the f32 bound both devices claim: the
    // int8 rounding shows, so a W4A8 that skipped its own quantisation would fail `int4_linear`.
    let (m, n, k) = (3, 70, 200);
    let x = uniform(&mut r, m * k, -2.0, 2.0);
    let case = linear_case("w4a8", &mut r, &x, m, n, k);
    let lin = cpu.prepare(case.weight).unwrap();
    let mut y = vec![f32::NAN; m * n];
    cpu.linear(&lin, &x, m, &mut y).unwrap();
    let bound = |e: usize| linear_bound(Acts::F32, &x, &case.deq, e / n, e % n, k);
    assert!(within("w4a8", &y, &case.want, bound).is_ok());
    let unrounded = dot_rows(&x, m, &case.deq, n, k, k);
    assert!(within("w4a8 unrounded", &y, &unrounded, bound).is_err());

    // The router's weights without the renormalisation the reference applies.
    let logits = uniform(&mut r, 4 * 10, -3.0, 3.0);
    let (ids, mut weights) = (vec![0u32; 12], vec![f32::NAN; 12]);
    let mut ids = ids;
    cpu.moe_route(&logits, 10, 3, false, &mut ids, &mut weights)
        .unwrap();
    let (want_ids, want_w) = route_reference(&logits, 10, 3, true);
    assert_eq!(ids, want_ids);
    assert!(close("moe weights", &weights, &want_w, 1e-9, 2e-6).is_err());

    let dims = common::gdn_dims_of(1, 2, 16, 16, 4);
    let c = GdnCase::new(&mut r, dims);
    let x = gdn_tokens(&mut r, &dims, 40);
    let (conv0, state0) = (
        uniform(&mut r, dims.conv_state_len(), -1.0, 1.0),
        uniform(&mut r, dims.state_len(), -0.5, 0.5),
    );
    let want = gdn_reference(&c, &x, &[40], &mut conv0.clone(), &mut state0.clone());
    let layer = GdnLayer::upload(&cpu, &c.weights()).unwrap();
    let mut st = GdnState::new(&cpu, dims, 1).unwrap();
    let mut out = vec![f32::NAN; 40 * 32];
    cpu.gdn_prefill(&dims, &layer, &gdn_in::<Cpu>(&x), &[40], &mut st, &mut out)
        .unwrap();
    assert!(scaled("gdn from zero", &out, &want, Gpu::GDN_PREFILL.0).is_err());
}

/// The GPU, or `None` after printing why the GPU half of a test does not run.
fn gpu() -> Option<Gpu> {
    match Gpu::probe() {
        Ok(Some(g)) => Some(g),
        Ok(None) | Err(KernelError::NotCompiledWithCuda) => {
            println!("skipped: no CUDA device");
            None
        }
        Err(e) => panic!("probing for a CUDA device failed: {e}"),
    }
}

/// `cpu_<op>` and `cuda_<op>` for each op family above.
macro_rules! on_every_backend {
    ($($op:ident),* $(,)?) => {
        mod cpu {
            $(#[test] fn $op() { super::$op(&kernels::backend::Cpu) })*
        }
        mod cuda {
            $(#[test] fn $op() { if let Some(g) = super::gpu() { super::$op(&g) } })*
        }
    };
}

on_every_backend!(
    embedding,
    norms,
    rope,
    attention,
    gates,
    activations,
    linear,
    int4_linear,
    moe,
    gdn,
    logits,
    sampling,
    casts,
    bad_sizes
);
