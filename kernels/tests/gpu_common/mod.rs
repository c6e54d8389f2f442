//! What every GPU test file shares: opening the device (or saying "skipped: no CUDA device"), a seeded generator
//! whose seed is printed, random inputs (plain, and the FP8 / NVFP4 weights and activations of the GEMV and GEMM
//! tests), and the relative error that fails on an unwritten (NaN-poisoned) element.
//! Each `kernels/tests/gpu_*.rs` includes it with `mod gpu_common;`; it re-exports the device-free `common` module.
#![allow(dead_code)] // each test file uses a different subset

use kernels::attention::AttnDims;
use kernels::cuda::{GdnGpuInputs, GdnGpuWeights, Gpu, GpuBuffer, PagedAttentionDims};
use kernels::formats::{bf16_to_f32, e4m3_to_f32, f32_to_bf16, f32_to_e4m3};
use kernels::gdn::{GdnDims, GdnInputs};
use kernels::reference;
use kernels::KernelError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[path = "../common/mod.rs"]
mod common;
pub(crate) use common::*;

pub(crate) fn gpu() -> Option<Gpu> {
    match Gpu::probe() {
        Ok(Some(g)) => Some(g),
        Ok(None) => {
            println!("skipped: no CUDA device");
            None
        }
        Err(KernelError::NotCompiledWithCuda) => {
            if cfg!(feature = "cuda") {
                panic!("a cuda build must not answer NotCompiledWithCuda");
            }
            println!("skipped: no CUDA device (built without the `cuda` feature)");
            None
        }
        Err(e) => panic!("probing for a CUDA device failed: {e}"),
    }
}

pub(crate) fn rng(test: &str) -> ChaCha8Rng {
    let seed: u64 = rand::thread_rng().gen();
    println!("{test}: seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

pub(crate) fn uniform(rng: &mut ChaCha8Rng, n: usize, amp: f32) -> Vec<f32> {
    uniform_in(rng, n, -amp, amp)
}

/// `n` NaN on the device: an output buffer whose unwritten elements fail `rel_err`.
pub(crate) fn nan_f32(gpu: &Gpu, n: usize) -> GpuBuffer<f32> {
    gpu.upload(&vec![f32::NAN; n]).unwrap()
}

/// Runs `launch` on a NaN-poisoned output of `n` elements and returns what it left there.
pub(crate) fn run_poisoned(
    gpu: &Gpu,
    n: usize,
    launch: impl FnOnce(&mut GpuBuffer<f32>) -> Result<(), KernelError>,
) -> Vec<f32> {
    let mut out = nan_f32(gpu, n);
    launch(&mut out).unwrap();
    gpu.download(&out).unwrap()
}

/// Asserts `rel_err(what, got, want) < tol`; returns the error.
pub(crate) fn assert_rel(what: &str, got: &[f32], want: &[f32], tol: f64) -> f64 {
    let e = rel_err(what, got, want);
    assert!(e < tol, "{what}: relative error {e:e} >= {tol:e}");
    e
}

/// `||got - want|| / ||want||` in f64, failing on any non-finite element (an unwritten NaN-poisoned one).
pub(crate) fn rel_err(what: &str, got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite(),
            "{what}: element {i} is {g} (not written, or overflowed); expected {w}"
        );
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

// FP8 / NVFP4 GEMM and GEMV inputs (gpu_kernels.rs and gpu_gemm_sm90a.rs).

/// Random weights `[n, k]` in (-0.05, 0.05) quantised to e4m3 with 128x128 block scales (the checkpoint's FP8
/// layout): `(codes [n, k], weight_scale_inv [ceil(n/128), ceil(k/128)])`.
pub(crate) fn fp8_block_weights(rng: &mut ChaCha8Rng, n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let w = uniform(rng, n * k, 0.05);
    reference::linear::quantize_fp8_block(&w, n, k)
}

/// Random weights `[n, k]` in (-0.05, 0.05) quantised to NVFP4: `(packed e2m1 [n, k/2] (even element in the low
/// nibble), e4m3 group scales [n, k/16], global scale)`.
pub(crate) fn nvfp4_weights(rng: &mut ChaCha8Rng, n: usize, k: usize) -> (Vec<u8>, Vec<u8>, f32) {
    let w = uniform(rng, n * k, 0.05);
    reference::linear::quantize_nvfp4(&w, n, k)
}

/// bf16 activations `[len]` in (-2, 2), returned as bits for the GPU and as the exact f32 values for the
/// reference.
pub(crate) fn bf16_activations(rng: &mut ChaCha8Rng, len: usize) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = uniform(rng, len, 2.0)
        .into_iter()
        .map(f32_to_bf16)
        .collect();
    let vals = bits.iter().map(|&b| bf16_to_f32(b)).collect();
    (bits, vals)
}

/// bf16 activations `[m, k]` whose magnitude varies by token (2^-4 .. 2^3) so the per-token scales differ, with
/// the first 128-block of token 0 all zero (the scale-1.0 case): bits and exact f32 values.
pub(crate) fn prefill_activations(
    rng: &mut ChaCha8Rng,
    m: usize,
    k: usize,
) -> (Vec<u16>, Vec<f32>) {
    let mut v = Vec::with_capacity(m * k);
    for r in 0..m {
        let amp = 2f32.powi(rng.gen_range(-4..=3));
        for c in 0..k {
            v.push(if r == 0 && c < 128 {
                0.0
            } else {
                rng.gen_range(-amp..amp)
            });
        }
    }
    let bits: Vec<u16> = v.into_iter().map(f32_to_bf16).collect();
    let vals = bits.iter().map(|&b| bf16_to_f32(b)).collect();
    (bits, vals)
}

/// The activation quantisation `Gpu::fp8_quantize_activations` implements, on the CPU: per token, per 128 of K,
/// scale `amax / 448` (1.0 for an all-zero block), codes `f32_to_e4m3(x / scale)`. Returns `(codes [m, k],
/// scales [m, ceil(k/128)])`.
pub(crate) fn quantize_act_cpu(x: &[f32], m: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let kb = k.div_ceil(128);
    let mut codes = vec![0u8; m * k];
    let mut scales = vec![0f32; m * kb];
    for r in 0..m {
        for b in 0..kb {
            let cols = b * 128..((b + 1) * 128).min(k);
            let amax = x[r * k..][cols.clone()]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
            scales[r * kb + b] = s;
            for c in cols {
                codes[r * k + c] = f32_to_e4m3(x[r * k + c] / s);
            }
        }
    }
    (codes, scales)
}

/// What an FP8 block GEMM multiplies, in exact values: the codes of `quantize_act_cpu` times their scales.
pub(crate) fn dequantize_act(codes: &[u8], scales: &[f32], m: usize, k: usize) -> Vec<f32> {
    let kb = k.div_ceil(128);
    (0..m * k)
        .map(|i| e4m3_to_f32(codes[i]) * scales[(i / k) * kb + (i % k) / 128])
        .collect()
}

/// One FP8 block-scaled GEMM case, as the prefill GEMM tests draw it: random 128x128-block-scaled weights
/// (`fp8_block_weights`) and activations (`prefill_activations`, bf16 bits in `xb`) quantised per token per 128
/// of K (`quantize_act_cpu`), the reference product of the dequantised activations, and the four operands on the
/// device.
pub(crate) struct Fp8GemmCase {
    /// The bf16 activations before quantisation, `[m, k]`.
    pub xb: Vec<u16>,
    /// `fp8_block_linear` of the dequantised activations: what the GEMM computes in exact values.
    pub want: Vec<f32>,
    /// Activation codes `[m, k]` and scales `[m, ceil(k/128)]`, weight codes `[n, k]` and scales.
    pub xq: GpuBuffer<u8>,
    pub xs: GpuBuffer<f32>,
    pub w: GpuBuffer<u8>,
    pub ws: GpuBuffer<f32>,
}

pub(crate) fn fp8_gemm_case(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    m: usize,
    n: usize,
    k: usize,
) -> Fp8GemmCase {
    let (wq, ws) = fp8_block_weights(rng, n, k);
    let (xb, xf) = prefill_activations(rng, m, k);
    let (xq, xs) = quantize_act_cpu(&xf, m, k);
    let xd = dequantize_act(&xq, &xs, m, k);
    let want = reference::linear::fp8_block_linear(&xd, m, &wq, &ws, n, k);
    Fp8GemmCase {
        xb,
        want,
        xq: gpu.upload(&xq).unwrap(),
        xs: gpu.upload(&xs).unwrap(),
        w: gpu.upload(&wq).unwrap(),
        ws: gpu.upload(&ws).unwrap(),
    }
}

/// One NVFP4 GEMV or GEMM case: random NVFP4 weights `[n, k]` (`nvfp4_weights`) against the given bf16 activations
/// `[m, k]` (bits and exact values): the reference product, the global scale, and the activations, packed weights
/// and group scales on the device.
pub(crate) type Nvfp4Case = (Vec<f32>, f32, GpuBuffer<u16>, GpuBuffer<u8>, GpuBuffer<u8>);

pub(crate) fn nvfp4_case(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    (m, n, k): (usize, usize, usize),
    (xb, xf): (Vec<u16>, Vec<f32>),
) -> Nvfp4Case {
    let (packed, scales, global) = nvfp4_weights(rng, n, k);
    let want = reference::linear::nvfp4_linear(&xf, m, &packed, &scales, global, n, k);
    let up = |v: &[u8]| gpu.upload(v).unwrap();
    (
        want,
        global,
        gpu.upload(&xb).unwrap(),
        up(&packed),
        up(&scales),
    )
}

/// The paged-cache dims of `seqs` sequences with `attn`'s heads.
pub(crate) fn paged_dims(
    attn: &AttnDims,
    seqs: usize,
    page_size: usize,
    num_pages: usize,
    max_pages: usize,
) -> PagedAttentionDims {
    PagedAttentionDims {
        seqs,
        q_heads: attn.q_heads,
        kv_heads: attn.kv_heads,
        head_dim: attn.head_dim,
        page_size,
        num_pages,
        max_pages_per_seq: max_pages,
    }
}

/// Random bf16 bits in [-1, 1), every 7th scaled by 4 (peaky softmax: a wrong max or a lost rescale shows) and
/// every 5th negated.
pub(crate) fn kv_bits(rng: &mut ChaCha8Rng, n: usize) -> Vec<u16> {
    let mut v: Vec<u16> = uniform(rng, n, 1.0).into_iter().map(f32_to_bf16).collect();
    for x in v.iter_mut().step_by(7) {
        *x = f32_to_bf16(bf16_to_f32(*x) * 4.0);
    }
    for x in v.iter_mut().step_by(5) {
        *x = f32_to_bf16(-bf16_to_f32(*x));
    }
    v
}

/// `decode_dense` of sequence `s` of a batch (`q` and `out` `[seqs, q_heads, head_dim]`) over its `n` dense tokens.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_dense_seq(
    attn: &AttnDims,
    scale: f32,
    s: usize,
    n: usize,
    q: &[f32],
    kd: &[f32],
    vd: &[f32],
    out: &mut [f32],
) {
    let row = attn.q_heads * attn.head_dim;
    let (q, out) = (&q[s * row..(s + 1) * row], &mut out[s * row..(s + 1) * row]);
    reference::attention::decode_dense(attn, scale, None, n, q, kd, vd, out).unwrap();
}

/// One decode-attention case over a paged bf16 cache, as the decode tests draw it: ragged `lens` scattered over
/// shuffled pages of `page_size` tokens (unused table slots point past the pool, which the kernels must never
/// read; with `bad_page`, sequence 0's second page too, whose tokens must then be skipped), random `kv_bits` K/V
/// and fp32 queries, the f64 reference of every sequence over its tokens in the pool (0 for a sequence with none,
/// as the kernels write), and everything on the device.
pub(crate) struct PagedDecodeCase {
    pub dims: PagedAttentionDims,
    /// `1 / sqrt(head_dim)`.
    pub scale: f32,
    pub want: Vec<f32>,
    pub q: GpuBuffer<f32>,
    pub k: GpuBuffer<u16>,
    pub v: GpuBuffer<u16>,
    pub table: GpuBuffer<u32>,
    pub lens: GpuBuffer<u32>,
}

pub(crate) fn paged_decode_case(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    attn: AttnDims,
    lens: &[usize],
    page_size: usize,
    bad_page: bool,
) -> PagedDecodeCase {
    let (hq, hkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
    let seqs = lens.len();
    let max_pages = lens.iter().map(|l| l.div_ceil(page_size)).max().unwrap() + 1;
    let num_pages = seqs * max_pages + 3;
    let mut order: Vec<u32> = (0..num_pages as u32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    let page_elems = hkv * page_size * d;
    let kc = kv_bits(rng, num_pages * page_elems);
    let vc = kv_bits(rng, num_pages * page_elems);
    // Unused table slots point past the pool: the kernel must never read them.
    let mut table = vec![u32::MAX; seqs * max_pages];
    for s in 0..seqs {
        for p in 0..lens[s].div_ceil(page_size) {
            table[s * max_pages + p] = order[s * max_pages + p];
        }
    }
    if bad_page && lens[0] > page_size {
        table[1] = num_pages as u32 + 5;
    }
    let q = uniform(rng, seqs * hq * d, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    let mut want = vec![0.0f32; seqs * hq * d];
    for s in 0..seqs {
        // The dense history of the tokens whose page is in the pool (softmax does not care about order).
        let (mut kd, mut vd) = (Vec::new(), Vec::new());
        for t in 0..lens[s] {
            let page = table[s * max_pages + t / page_size] as usize;
            if page >= num_pages {
                continue;
            }
            for g in 0..hkv {
                let src = ((page * hkv + g) * page_size + t % page_size) * d;
                kd.extend(kc[src..src + d].iter().map(|&b| bf16_to_f32(b)));
                vd.extend(vc[src..src + d].iter().map(|&b| bf16_to_f32(b)));
            }
        }
        let n = kd.len() / (hkv * d);
        if n == 0 {
            // A sequence with no token in the cache writes 0 (attention.cu, the combine); the reference refuses
            // an empty history, so the expectation is written here (`want` starts at 0).
            continue;
        }
        decode_dense_seq(&attn, scale, s, n, &q, &kd, &vd, &mut want);
    }
    let dims = paged_dims(&attn, seqs, page_size, num_pages, max_pages);
    let lens32: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    let (dq, dk, dv) = (
        gpu.upload(&q).unwrap(),
        gpu.upload(&kc).unwrap(),
        gpu.upload(&vc).unwrap(),
    );
    let (dt, dl) = (gpu.upload(&table).unwrap(), gpu.upload(&lens32).unwrap());
    PagedDecodeCase {
        dims,
        scale,
        want,
        q: dq,
        k: dk,
        v: dv,
        table: dt,
        lens: dl,
    }
}

// Gated DeltaNet on the device.

/// A `GdnLayer`'s weights on the device: conv weight, `A_log`, dt bias, norm weight.
pub(crate) struct GdnGpuLayer([GpuBuffer<f32>; 4]);

impl GdnGpuLayer {
    pub(crate) fn new(gpu: &Gpu, l: &GdnLayer) -> GdnGpuLayer {
        let host = [&l.conv_weight, &l.a_log, &l.dt_bias, &l.norm_weight];
        GdnGpuLayer(host.map(|v| gpu.upload(v).unwrap()))
    }

    pub(crate) fn weights(&self) -> GdnGpuWeights<'_> {
        let [conv_weight, a_log, dt_bias, norm_weight] = &self.0;
        GdnGpuWeights {
            conv_weight,
            a_log,
            dt_bias,
            norm_weight,
            norm_eps: 1e-6,
        }
    }
}

/// GDN inputs on the device: qkv, z, a, b.
pub(crate) struct GdnGpuTokens([GpuBuffer<f32>; 4]);

impl GdnGpuTokens {
    pub(crate) fn new(gpu: &Gpu, x: &GdnInputs<'_>) -> GdnGpuTokens {
        GdnGpuTokens([x.qkv, x.z, x.a, x.b].map(|v| gpu.upload(v).unwrap()))
    }

    pub(crate) fn inputs(&self) -> GdnGpuInputs<'_> {
        let [qkv, z, a, b] = &self.0;
        GdnGpuInputs { qkv, z, a, b }
    }
}

/// The element of `got` farthest from `want`, as "index i (what it is): got g, want w".
pub(crate) fn worst(got: &[f32], want: &[f32], name: impl Fn(usize) -> String) -> String {
    let (mut at, mut d) = (0usize, -1.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = if g.is_finite() {
            (g as f64 - w as f64).abs()
        } else {
            f64::INFINITY
        };
        if e > d {
            (at, d) = (i, e);
        }
    }
    format!(
        "worst element {at} ({}): got {}, want {}",
        name(at),
        got[at],
        want[at]
    )
}

/// What one GDN decode launch gets: weights, inputs, batch, conv history in and out, state, output.
pub(crate) type GdnDecodeLaunch<'a> = dyn FnMut(
        &GdnGpuWeights<'_>,
        &GdnGpuInputs<'_>,
        usize,
        &GpuBuffer<f32>,
        &mut GpuBuffer<f32>,
        &mut GpuBuffer<f32>,
        &mut GpuBuffer<f32>,
    ) -> Result<(), KernelError>
    + 'a;

/// Runs a GDN decode step (`launch`) for `steps` steps of `seqs` sequences against the f64 reference, so the conv
/// history and the state carry over between launches; the output and the advanced conv history are NaN-poisoned
/// before each launch. Panics naming `what`, the step, the buffer and its worst element on a mismatch.
pub(crate) fn check_gdn_decode_steps(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    what: &str,
    dims: GdnDims,
    seqs: usize,
    steps: usize,
    launch: &mut GdnDecodeLaunch<'_>,
) {
    let (vw, d) = (dims.value_width(), dims.value_dim);
    let layer = GdnLayer::new(&dims, rng, 0.5, (-1.0, 1.0));
    let w = layer.weights();
    let dev_layer = GdnGpuLayer::new(gpu, &layer);
    let dw = dev_layer.weights();
    let mut conv_ref = uniform(rng, seqs * dims.conv_state_len(), 1.0);
    let mut state_ref = uniform(rng, seqs * dims.state_len(), 0.1);
    let mut conv_a = gpu.upload(&conv_ref).unwrap();
    let mut conv_b = nan_f32(gpu, conv_ref.len());
    let mut state = gpu.upload(&state_ref).unwrap();
    let hist = dims.conv_kernel - 1;
    let out_name = |i: usize| {
        format!(
            "seq {}, value head {}, column {}",
            i / vw,
            i % vw / d,
            i % d
        )
    };
    let state_name = |i: usize| {
        let per_head = dims.key_dim * d;
        format!(
            "seq {}, value head {}, row (key dim) {}, column (value dim) {}",
            i / dims.state_len(),
            i % dims.state_len() / per_head,
            i % per_head / d,
            i % d
        )
    };
    let conv_name = |i: usize| {
        let ch = i % dims.conv_state_len() / hist;
        let part = if ch < dims.key_heads * dims.key_dim {
            "q"
        } else if ch < 2 * dims.key_heads * dims.key_dim {
            "k"
        } else {
            "v"
        };
        format!(
            "seq {}, channel {ch} ({part}), tap {}",
            i / dims.conv_state_len(),
            i % hist
        )
    };
    for step in 0..steps {
        let tok = GdnTokens::new(&dims, seqs, rng, 2.0, (-2.0, 2.0));
        let want = gdn_reference_steps(&dims, &w, &tok.inputs(), &mut conv_ref, &mut state_ref);
        let dx = GdnGpuTokens::new(gpu, &tok.inputs());
        let mut out = nan_f32(gpu, seqs * vw);
        launch(
            &dw,
            &dx.inputs(),
            seqs,
            &conv_a,
            &mut conv_b,
            &mut state,
            &mut out,
        )
        .unwrap_or_else(|e| panic!("{what}, step {step}: {e}"));
        // fp32 through the conv, the norms and 128-long dots against f64: ~1e-6 relative; bounds 1e-4 (output,
        // after the RMSNorm's division) and 1e-5 (state). The conv history is a copy: exact.
        for (buf, got, want, tol, name) in [
            (
                "output",
                &out,
                &want,
                1e-4,
                &out_name as &dyn Fn(usize) -> String,
            ),
            ("state", &state, &state_ref, 1e-5, &state_name),
            ("conv state", &conv_b, &conv_ref, 0.0, &conv_name),
        ] {
            let got = gpu.download(got).unwrap();
            let e = rel_err(&format!("{what}, {buf} step {step}"), &got, want);
            assert!(
                e < tol || e == 0.0,
                "{what}, {buf} step {step}: relative error {e:e} (bound {tol:e}, 0 for a copy); {}",
                worst(&got, want, name)
            );
        }
        std::mem::swap(&mut conv_a, &mut conv_b);
        gpu.write(&mut conv_b, &vec![f32::NAN; conv_ref.len()])
            .unwrap();
    }
}
