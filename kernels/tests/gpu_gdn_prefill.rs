//! The CUDA chunked gated DeltaNet prefill (`Gpu::gdn_prefill`, kernels/cuda/gdn_prefill.cu) against the f64
//! token-by-token recurrence (`kernels::reference::gdn::sequence`) and the CPU chunked prefill
//! (`kernels::gdn::prefill`): single sequences across the chunk boundaries, ragged batches, every state-kernel
//! variant, strong decay, continuing from non-zero conv and recurrent states, prefill followed by the GPU decode
//! step, and the refused shapes. Outputs, conv history and workspace are NaN-poisoned before each call, so an
//! unwritten element or a read of unwritten scratch fails. Small enough for compute-sanitizer.
//!
//! Most tests drive named state-kernel variants, which a build without the `lab` feature refuses, so the file
//! builds with `lab` only.
#![cfg(feature = "lab")]

mod gpu_common;

use gpu_common::{
    assert_scaled_close, gdn_dims, gdn_layer, gdn_per_sequence, gdn_reference_steps, gdn_tokens,
    gpu, nan_f32, rel_err, rng, uniform, GdnGpuLayer, GdnGpuTokens,
};
use kernels::cuda::{GdnGpuInputs, GdnPrefillIo, Gpu, GpuBuffer};
use kernels::gdn::{self, GdnDims};
use kernels::reference;
use rand_chacha::ChaCha8Rng;

/// Scaled error bounds, `|got - want| / (1 + |want|)` per element, against the f64 recurrence, for the fp32
/// state kernels (the accuracy reference): fp32 throughout (no tensor cores, no bf16), so the bounds are those of the CPU
/// chunked prefill's tests (`cpu_gdn.rs`: 1e-4 and 4e-6, measured there at 1.5e-5 and 4.6e-7) widened 2x and 5x
/// for the GPU's different summation order and `expf`; every check prints the worst error it saw so the H200 run
/// can tighten them.
const OUT_TOL: f32 = 2e-4;
const STATE_TOL: f32 = 2e-5;

/// The bounds of a variant (`Gpu::gdn_prefill_with`), by the least precise of its two tensor-core-capable
/// launches (the WY kernel, named by an optional `wy<math>_` prefix, and the state kernel): fp32 throughout as
/// above; `tf32x3` (tensor cores, each operand split into two TF32 terms, only the 2^-22-relative lo*lo product
/// dropped) in either launch twice the fp32 bounds; plain `tf32` in either (operands rounded to 10 mantissa bits,
/// ~2.4e-4 relative each, errors carried through the chunk-to-chunk state) 1e-2 on the normalised output and 2e-3
/// on the state: the order of fla's bf16 kernels (~7e-3 relative against this crate's fp32 kernels on the H200),
/// still far below a wrong index or a missed term. The plain-TF32 WY rounds K K^T, Q K^T and the T products and
/// carries those errors through the triangular solve: with it the worst normalised-output error over fresh draws
/// reached 1.35e-2 (`wytf32_tf32_cs64`, 63 tokens) and 1.04e-2 (`wytf32_tf32_cs32`, a ragged
/// batch), most draws 3e-3..7e-3, so its builds get 2e-2 on the output (the state bound unchanged). The default
/// runs the 3xTF32 WY (worst 2.2e-3 over 24 draws) and keeps the 1e-2 class of its plain-TF32 state walk.
/// `"auto"` and `""` take the bounds of the build they run, `Gpu::GDN_PREFILL_DEFAULT`.
/// The bf16 split (`<wy>bf16_cs64`: bf16 operands in the walk's and the output's products) is fla's precision
/// class: an earlier CPU simulation of its rounding (benchmarks/h200.md point 8) gave at worst 1.8e-2
/// on the normalised output and 1.0e-3 on the state with the 3xTF32 WY, 3.5e-2 / 1.3e-3 with every operand bf16.
/// On the H200 (27 checks of `wytf32x3_bf16_cs64` per run, fresh draws) the worst were 2.9e-2 and
/// 2.6e-3; its bounds are 5e-2 and 6e-3 (still far below a wrong index, which gives O(1)).
fn tolerances(variant: &str) -> (f32, f32) {
    let variant = if variant.is_empty() || variant == "auto" {
        Gpu::GDN_PREFILL_DEFAULT
    } else {
        variant
    };
    let (wy, state) = match variant.strip_prefix("wy") {
        Some(rest) => rest.split_once('_').expect("wy<math>_<state variant>"),
        None => ("fp32", variant),
    };
    let plain = |m: &str| m == "tf32" || m.starts_with("tf32_");
    if state.starts_with("bf16_") {
        (5e-2, 6e-3)
    } else if plain(wy) {
        (2e-2, 2e-3)
    } else if plain(state) {
        (1e-2, 2e-3)
    } else if wy == "tf32x3" || state.starts_with("tf32x3") {
        (2.0 * OUT_TOL, 2.0 * STATE_TOL)
    } else {
        (OUT_TOL, STATE_TOL)
    }
}

/// Qwen3.8-27B's group of 3 value heads per key head, with 2 key heads.
const GROUP3: GdnDims = gdn_dims(2, 6, 4);
const ONE_HEAD: GdnDims = gdn_dims(1, 1, 4);
const GROUP1_K3: GdnDims = gdn_dims(3, 3, 3);

/// Asserts the scaled error `|got - want| / (1 + |want|)` is at most `tol` everywhere, naming the worst element
/// as (row, head, column) of a `[rows, heads, 128]` or `[seqs, heads, 128, 128]` layout; returns the worst error.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32, row_len: usize) -> f32 {
    assert_scaled_close(what, got, want, tol, |i| {
        format!(
            " (row {}, head {}, column {})",
            i / row_len,
            (i % row_len) / 128,
            i % 128
        )
    })
}

/// What one prefill call advances and writes: the conv history out, the state (starting from `state0`), the
/// output and the scratch, all but the state NaN-poisoned.
struct Outputs {
    conv_out: GpuBuffer<f32>,
    state: GpuBuffer<f32>,
    out: GpuBuffer<f32>,
    ws: GpuBuffer<f32>,
}

impl Outputs {
    fn new(gpu: &Gpu, conv_len: usize, state0: &[f32], out_len: usize, ws_len: usize) -> Self {
        Outputs {
            conv_out: nan_f32(gpu, conv_len),
            state: gpu.upload(state0).unwrap(),
            out: nan_f32(gpu, out_len),
            ws: nan_f32(gpu, ws_len),
        }
    }

    fn io<'a>(&'a mut self, conv_in: &'a GpuBuffer<f32>) -> GdnPrefillIo<'a> {
        GdnPrefillIo {
            conv_in,
            conv_out: &mut self.conv_out,
            state: &mut self.state,
            out: &mut self.out,
            workspace: &mut self.ws,
        }
    }

    /// (output, state, conv history) on the host.
    fn download(&self, gpu: &Gpu) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (
            gpu.download(&self.out).unwrap(),
            gpu.download(&self.state).unwrap(),
            gpu.download(&self.conv_out).unwrap(),
        )
    }
}

/// One batch of `lens` sequences through the GPU prefill (state kernel `variant`), against the recurrence and
/// the CPU chunked prefill, each sequence from its own random conv history and state.
fn check_batch(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    dims: GdnDims,
    lens: &[usize],
    variant: &str,
    a_log: (f32, f32),
) {
    let ctx = format!(
        "Hk={} Hv={} K={} lens={lens:?} variant={variant} a_log={a_log:?}",
        dims.key_heads, dims.value_heads, dims.conv_kernel
    );
    let (out_tol, state_tol) = tolerances(variant);
    let layer = gdn_layer(&dims, rng, a_log);
    let w = layer.weights();
    let n: usize = lens.iter().sum();
    let seqs = lens.len();
    let tok = gdn_tokens(&dims, n, rng);
    let (csl, sl, vw) = (dims.conv_state_len(), dims.state_len(), dims.value_width());
    let conv0 = uniform(rng, seqs * csl, 1.0);
    let state0 = uniform(rng, seqs * sl, 0.5);

    let (mut conv_ref, mut state_ref) = (conv0.clone(), state0.clone());
    let out_ref = gdn_per_sequence(
        &dims,
        lens,
        &tok.inputs(),
        &mut conv_ref,
        &mut state_ref,
        |l, x, c, s, o| reference::gdn::sequence(&dims, &w, l, x, c, s, o),
    );
    let (mut conv_cpu, mut state_cpu) = (conv0.clone(), state0.clone());
    let out_cpu = gdn_per_sequence(
        &dims,
        lens,
        &tok.inputs(),
        &mut conv_cpu,
        &mut state_cpu,
        |l, x, c, s, o| gdn::prefill(&dims, &w, l, x, c, s, o),
    );

    let dl = GdnGpuLayer::new(gpu, &layer);
    let dx = GdnGpuTokens::new(gpu, &tok.rows(&dims, 0, n));
    let conv_in = gpu.upload(&conv0).unwrap();
    let ws_len = Gpu::gdn_prefill_workspace_len_with(variant, &dims, lens).unwrap();
    let mut bufs = Outputs::new(gpu, conv0.len(), &state0, n * vw, ws_len);
    gpu.gdn_prefill_with(
        variant,
        &dims,
        &dl.weights(),
        &dx.inputs(),
        lens,
        bufs.io(&conv_in),
    )
    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let (out, state, conv) = bufs.download(gpu);
    assert_close(
        &format!("{ctx}: output vs recurrence"),
        &out,
        &out_ref,
        out_tol,
        vw,
    );
    assert_close(
        &format!("{ctx}: output vs CPU prefill"),
        &out,
        &out_cpu,
        out_tol,
        vw,
    );
    assert_close(
        &format!("{ctx}: final state vs recurrence"),
        &state,
        &state_ref,
        state_tol,
        dims.value_heads * 128 * 128,
    );
    assert_close(
        &format!("{ctx}: final state vs CPU prefill"),
        &state,
        &state_cpu,
        state_tol,
        dims.value_heads * 128 * 128,
    );
    for (i, (&g, &w)) in conv.iter().zip(&conv_ref).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{ctx}: conv history element {i} (sequence {}, channel {}, tap {}) is {g}, expected {w} (a copy)",
            i / csl,
            (i % csl) / (dims.conv_kernel - 1),
            i % (dims.conv_kernel - 1)
        );
    }
    println!("{ctx}: output rel err {:e}", rel_err(&ctx, &out, &out_ref));
}

#[test]
fn single_sequences_across_chunk_boundaries_match_the_recurrence() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill single");
    for t in [1usize, 63, 64, 65, 130, 200] {
        check_batch(&gpu, &mut rng, GROUP3, &[t], "auto", (-1.0, 1.0));
    }
}

/// The plain-TF32 bounds (`tolerances`) were an assumption until the H200 printed worst errors drew a
/// 63-token sequence on which the then default (`wytf32_tf32_cs64`) missed the 1e-2 output bound (1.35e-2). This
/// checks the default, that build and the fp32-WY one over many fresh draws of the shapes most exposed (one
/// partial chunk, one full chunk, a chunk boundary), and reports every miss before failing. On the H200 (24 draws
/// each): worst 2.2e-3 (3xTF32 WY, now the default), 6.3e-3 (plain-TF32 WY), 2.6e-3 (fp32 WY).
#[test]
fn tf32_builds_hold_their_bounds_over_many_draws() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill tf32 draws");
    let mut misses = Vec::new();
    for variant in [
        Gpu::GDN_PREFILL_DEFAULT,
        "wytf32_tf32_cs64",
        "tf32_cs64",
        "wytf32x3_bf16_cs64",
    ] {
        for draw in 0..8 {
            for lens in [&[63usize][..], &[64], &[130]] {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    check_batch(&gpu, &mut rng, GROUP3, lens, variant, (-1.0, 1.0))
                }));
                if let Err(e) = r {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .unwrap_or_else(|| "non-string panic".into());
                    misses.push(format!("{variant} draw {draw} lens {lens:?}: {msg}"));
                }
            }
        }
    }
    for m in &misses {
        println!("MISS {m}");
    }
    assert!(
        misses.is_empty(),
        "{} of 96 checks missed their bounds (listed above)",
        misses.len()
    );
}

#[test]
fn every_state_kernel_variant_matches() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill variants");
    // Every state-kernel build and tensor-core WY build the parser accepts, from its own list.
    for variant in Gpu::GDN_PREFILL_VARIANTS {
        check_batch(&gpu, &mut rng, GROUP3, &[130], variant, (-1.0, 1.0));
    }
}

#[test]
fn ragged_batches_match_sequence_by_sequence() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill batch");
    let cases: [(GdnDims, &[usize], &str); 19] = [
        (GROUP3, &[65, 0, 1, 130, 63], "auto"),
        (ONE_HEAD, &[2, 64, 129], "fp32_cs16"),
        (GROUP1_K3, &[0, 77, 3], "fp32_cs64"),
        // The tensor-core state kernels on ragged batches: partial last chunks (k-steps cut at the chunk's end),
        // empty sequences, a group of 1.
        (GROUP3, &[65, 0, 1, 130, 63], "tf32x3_cs32"),
        (ONE_HEAD, &[2, 64, 129], "tf32x3_cs64"),
        (GROUP1_K3, &[0, 77, 3], "tf32_cs16"),
        // The tensor-core WY kernel on the same ragged batches: partial chunks (zero rows past the chunk, T's identity
        // rows there), chunks of 1 and 2 tokens, empty sequences, a group of 1; the 3xTF32 build against the
        // fp32-class bounds (a wrong fragment index fails those by orders of magnitude), the plain build against
        // the TF32 ones.
        (GROUP3, &[65, 0, 1, 130, 63], "wytf32x3_fp32_cs32"),
        (ONE_HEAD, &[2, 64, 129], "wytf32x3_tf32x3_cs64"),
        (GROUP1_K3, &[0, 77, 3], "wytf32_tf32_cs64"),
        (GROUP3, &[200, 1, 64, 127], "wytf32_tf32_cs32"),
        (GROUP3, &[65, 0, 1, 130, 63], "fp32_cs32"),
        // The default (double-buffered walk) with an empty last sequence: its walk blocks must not prefetch a chunk
        // 0 it does not have (that slot lies past the workspace regions for the last head; memcheck would see it).
        (GROUP3, &[130, 5, 0], "auto"),
        // The bf16 split: its walk (a ring prefetching two chunks ahead, an empty last sequence) and its output
        // launch (partial chunks, chunks of 1 and 2 tokens, the fused norm) on ragged batches, groups of 3 and 1.
        (GROUP3, &[130, 5, 0], "wytf32x3_bf16_cs64"),
        (GROUP3, &[65, 0, 1, 130, 63], "wytf32x3_bf16_cs64"),
        (ONE_HEAD, &[2, 64, 129, 200], "wytf32_bf16_cs64"),
        // The f16 split (f16 prep outputs, the f16 WY's balanced step 6) on the same ragged batches.
        (GROUP3, &[65, 0, 1, 130, 63], "wyf16_bf16_cs64"),
        (ONE_HEAD, &[2, 64, 129, 200], "wyf16_bf16_cs64"),
        (GROUP1_K3, &[0, 77, 3], "wyf16_bf16_cs64"),
        // The previous default (CUDA-core WY, plain-TF32 state walk on 64 columns) on a ragged batch.
        (GROUP3, &[65, 0, 1, 130, 63], "tf32_cs64"),
    ];
    for (dims, lens, variant) in cases {
        check_batch(&gpu, &mut rng, dims, lens, variant, (-1.0, 1.0));
    }
}

/// The bf16 splits with more (sequence, head) states than half the SMs run the one-block walk
/// (`gdn_prefill_walk1_bf16`, all 128 state columns per block; the device layer's `walk_one_block`): 26 ragged
/// sequences of 6 value heads (156 states) with empty sequences, chunks of 1 and 2 tokens, whole and partial chunks.
#[test]
fn ragged_batches_of_many_states_take_the_one_block_walk() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill many states");
    let lens: [usize; 26] = [
        65, 0, 1, 130, 63, 2, 64, 129, 200, 7, 0, 128, 191, 33, 64, 1, 96, 150, 17, 70, 0, 5, 192,
        63, 129, 40,
    ];
    assert!(
        2 * lens.len() * GROUP3.value_heads > gpu.sm_count(),
        "{} SMs: the batch must exceed one wave of two-block walk blocks",
        gpu.sm_count()
    );
    for variant in ["wyf16_bf16_cs64", "wytf32_bf16_cs64"] {
        check_batch(&gpu, &mut rng, GROUP3, &lens, variant, (-1.0, 1.0));
    }
}

/// The warp prep (launch 1, `gdn_prefill_prep`: a warp per 128-channel segment and 8 tokens, the conv window a
/// register template per conv kernel) on the batches that once compared it with the block-per-token prep it
/// replaced (bit-identical there and on the H200), now against the f64 recurrence and the CPU prefill
/// through the fp32 build: conv kernels 4, 3 and 2, ragged batches with empty sequences, sequences shorter than
/// the conv history and than an 8-token tile, lengths around multiples of 8, and segment counts (2Hk+Hv = 10, 9
/// and 4) that leave warps of the last block idle or not. The conv history must be a bit-for-bit copy
/// (`check_batch`).
#[test]
fn warp_prep_tiles_and_conv_kernels_match_the_recurrence() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill warp prep");
    let k2 = gdn_dims(1, 2, 2);
    let cases: [(GdnDims, &[usize]); 3] = [
        (GROUP3, &[65, 0, 1, 130, 7, 8, 9]),
        (GROUP1_K3, &[0, 77, 2, 16]),
        (k2, &[1, 3, 200]),
    ];
    for (dims, lens) in cases {
        check_batch(&gpu, &mut rng, dims, lens, "fp32_cs32", (-1.0, 1.0));
    }
}

/// A_log up to 3 (decay rates up to e^3 per token): the in-chunk cumulative decay underflows fp32; the kernels only
/// exponentiate differences G_t - G_s (s <= t) or G_t itself, never divide by them.
#[test]
fn strong_decay_that_underflows_a_chunk() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill strong decay");
    for variant in [
        "auto",
        "tf32x3_cs32",
        "wytf32x3_fp32_cs32",
        "wytf32_tf32_cs64",
        "tf32_cs64",
    ] {
        check_batch(&gpu, &mut rng, GROUP3, &[130, 70], variant, (2.0, 3.0));
    }
}

/// A batch of two sequences is prefilled, then decoded for three steps by `Gpu::gdn_decode_step` on the same conv
/// and state buffers (the conv histories swapping as the decode step's contract says); every step's output and
/// the states match the recurrence over all tokens.
#[test]
fn decode_continues_a_gpu_prefill() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill then decode");
    let dims = GROUP3;
    let lens = [70usize, 5];
    let steps = 3;
    let layer = gdn_layer(&dims, &mut rng, (-1.0, 1.0));
    let w = layer.weights();
    let (csl, sl, vw, hv) = (
        dims.conv_state_len(),
        dims.state_len(),
        dims.value_width(),
        dims.value_heads,
    );
    let n: usize = lens.iter().sum();
    let pre = gdn_tokens(&dims, n, &mut rng);
    let dec: Vec<_> = (0..steps)
        .map(|_| gdn_tokens(&dims, lens.len(), &mut rng))
        .collect();
    let conv0 = uniform(&mut rng, lens.len() * csl, 1.0);
    let state0 = uniform(&mut rng, lens.len() * sl, 0.5);

    let dl = GdnGpuLayer::new(&gpu, &layer);
    let dx = GdnGpuTokens::new(&gpu, &pre.rows(&dims, 0, n));
    let mut conv_a = gpu.upload(&conv0).unwrap();
    let mut conv_b = nan_f32(&gpu, conv0.len());
    let mut state = gpu.upload(&state0).unwrap();
    let mut out = nan_f32(&gpu, n * vw);
    let mut ws = gpu
        .zeros(Gpu::gdn_prefill_workspace_len(&dims, &lens).unwrap())
        .unwrap();
    gpu.gdn_prefill(
        &dims,
        &dl.weights(),
        &dx.inputs(),
        &lens,
        GdnPrefillIo {
            conv_in: &conv_a,
            conv_out: &mut conv_b,
            state: &mut state,
            out: &mut out,
            workspace: &mut ws,
        },
    )
    .unwrap();
    std::mem::swap(&mut conv_a, &mut conv_b);

    let (mut conv_ref, mut state_ref) = (conv0.clone(), state0.clone());
    let pre_ref = gdn_per_sequence(
        &dims,
        &lens,
        &pre.inputs(),
        &mut conv_ref,
        &mut state_ref,
        |l, x, c, s, o| reference::gdn::sequence(&dims, &w, l, x, c, s, o),
    );
    assert_close(
        "prefill output",
        &gpu.download(&out).unwrap(),
        &pre_ref,
        tolerances("auto").0,
        vw,
    );
    for (step, x) in dec.iter().enumerate() {
        let want = gdn_reference_steps(&dims, &w, &x.inputs(), &mut conv_ref, &mut state_ref);
        let dx = GdnGpuTokens::new(&gpu, &x.rows(&dims, 0, lens.len()));
        let mut o = nan_f32(&gpu, lens.len() * vw);
        gpu.write(&mut conv_b, &vec![f32::NAN; conv0.len()])
            .unwrap();
        gpu.gdn_decode_step(
            &dims,
            &dl.weights(),
            &dx.inputs(),
            lens.len(),
            &conv_a,
            &mut conv_b,
            &mut state,
            &mut o,
        )
        .unwrap();
        std::mem::swap(&mut conv_a, &mut conv_b);
        assert_close(
            &format!("decode step {step} after prefill: output"),
            &gpu.download(&o).unwrap(),
            &want,
            tolerances("auto").0,
            vw,
        );
        assert_close(
            &format!("decode step {step} after prefill: state"),
            &gpu.download(&state).unwrap(),
            &state_ref,
            tolerances("auto").1,
            hv * 128 * 128,
        );
        assert_eq!(
            gpu.download(&conv_a).unwrap(),
            conv_ref,
            "decode step {step} after prefill: conv history"
        );
    }
}

/// `Gpu::gdn_prefill_varlen` (offsets on the device; the meta table built and clamped there) against
/// `Gpu::gdn_prefill_with` on the lengths the table means: bit for bit (the same kernels in the same order of
/// arithmetic; only the stride of the W / U / Aqk slots differs), for the default (tensor-core WY) and the CUDA-core WY.
/// The second and third tables are wrong in the ways the clamp handles (an entry below its predecessor, an entry
/// past `total`, a sequence longer than `max_seqlen`), so they also pin the clamp's meaning. Outputs, conv
/// history and both workspaces are NaN-poisoned, so every row must be written (the lengths cover `total`).
#[test]
fn device_table_matches_the_host_table() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill varlen");
    let dims = GROUP3;
    // (the table as given, max_seqlen, the lengths it means after the clamp)
    let cases: [(&[u32], usize, &[usize]); 3] = [
        (&[0, 65, 65, 66, 196, 259], 130, &[65, 0, 1, 130, 63]),
        (&[0, 70, 40, 75], 70, &[70, 0, 5]),
        (&[0, 30, 1000], 45, &[30, 45]),
    ];
    for (table, max_len, lens) in cases {
        for variant in ["auto", "tf32_cs64", "wytf32x3_bf16_cs64"] {
            let ctx = format!("table {table:?} max_seqlen {max_len} variant {variant}");
            let n: usize = lens.iter().sum();
            let seqs = lens.len();
            let layer = gdn_layer(&dims, &mut rng, (-1.0, 1.0));
            let tok = gdn_tokens(&dims, n, &mut rng);
            let (csl, sl, vw) = (dims.conv_state_len(), dims.state_len(), dims.value_width());
            let conv0 = uniform(&mut rng, seqs * csl, 1.0);
            let state0 = uniform(&mut rng, seqs * sl, 0.5);
            let dl = GdnGpuLayer::new(&gpu, &layer);
            let dx = GdnGpuTokens::new(&gpu, &tok.rows(&dims, 0, n));
            let conv_in = gpu.upload(&conv0).unwrap();
            let cu = gpu.upload(table).unwrap();
            let mut got = Vec::new();
            for device_table in [false, true] {
                let r = if device_table {
                    let ws_len = Gpu::gdn_prefill_varlen_workspace_len_with(
                        variant, &dims, seqs, n, max_len,
                    )
                    .unwrap();
                    let mut bufs = Outputs::new(&gpu, conv0.len(), &state0, n * vw, ws_len);
                    gpu.gdn_prefill_varlen_with(
                        variant,
                        &dims,
                        &dl.weights(),
                        &dx.inputs(),
                        &cu,
                        seqs,
                        n,
                        max_len,
                        bufs.io(&conv_in),
                    )
                    .map(|()| bufs)
                } else {
                    let ws_len = Gpu::gdn_prefill_workspace_len_with(variant, &dims, lens).unwrap();
                    let mut bufs = Outputs::new(&gpu, conv0.len(), &state0, n * vw, ws_len);
                    gpu.gdn_prefill_with(
                        variant,
                        &dims,
                        &dl.weights(),
                        &dx.inputs(),
                        lens,
                        bufs.io(&conv_in),
                    )
                    .map(|()| bufs)
                };
                got.push(r.unwrap_or_else(|e| panic!("{ctx}: {e}")).download(&gpu));
            }
            let (host, dev) = (&got[0], &got[1]);
            assert!(
                host.0.iter().all(|x| x.is_finite()),
                "{ctx}: host-table output has unwritten rows"
            );
            for (what, a, b) in [
                ("output", &host.0, &dev.0),
                ("state", &host.1, &dev.1),
                ("conv history", &host.2, &dev.2),
            ] {
                assert_eq!(a.len(), b.len(), "{ctx}: {what} lengths");
                if let Some(i) = a
                    .iter()
                    .zip(b)
                    .position(|(x, y)| x.to_bits() != y.to_bits())
                {
                    panic!(
                        "{ctx}: {what} element {i}: device table {} vs host table {}",
                        b[i], a[i]
                    );
                }
            }
            println!("{ctx}: bit-identical to the host table on lengths {lens:?}");
        }
    }
}

/// The device-table entry point's own refusals (the host never reads the table, so only its length, the
/// geometry and the workspace are checked).
#[test]
fn device_table_bad_sizes_are_errors() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill varlen bad sizes");
    let dims = ONE_HEAD;
    let (seqs, n) = (2usize, 5usize);
    let layer = gdn_layer(&dims, &mut rng, (-1.0, 1.0));
    let tok = gdn_tokens(&dims, n, &mut rng);
    let dl = GdnGpuLayer::new(&gpu, &layer);
    let dx = GdnGpuTokens::new(&gpu, &tok.rows(&dims, 0, n));
    let conv_in = gpu.zeros(seqs * dims.conv_state_len()).unwrap();
    let mut conv_out = gpu.zeros(seqs * dims.conv_state_len()).unwrap();
    let mut state = gpu.zeros(seqs * dims.state_len()).unwrap();
    let mut out = gpu.zeros(n * dims.value_width()).unwrap();
    let ws_len = Gpu::gdn_prefill_varlen_workspace_len(&dims, seqs, n, 3).unwrap();
    let mut ws = gpu.zeros(ws_len).unwrap();
    let cu = gpu.upload(&[0u32, 3, 5]).unwrap();
    let short_cu = gpu.upload(&[0u32, 3]).unwrap();
    let w = dl.weights();
    let x = dx.inputs();
    let mut run = |cu: &GpuBuffer<u32>, max_len: usize, ws: &mut GpuBuffer<f32>| {
        gpu.gdn_prefill_varlen(
            &dims,
            &w,
            &x,
            cu,
            seqs,
            n,
            max_len,
            GdnPrefillIo {
                conv_in: &conv_in,
                conv_out: &mut conv_out,
                state: &mut state,
                out: &mut out,
                workspace: ws,
            },
        )
    };
    // The valid call works, so each failure below is the one change.
    run(&cu, 3, &mut ws).unwrap();
    let e = run(&short_cu, 3, &mut ws).unwrap_err();
    assert!(e.to_string().contains("cu_seqlens has"), "{e}");
    let e = run(&cu, 0, &mut ws).unwrap_err();
    assert!(
        e.to_string().contains("max_seqlen must be 1..=total"),
        "{e}"
    );
    let e = run(&cu, n + 1, &mut ws).unwrap_err();
    assert!(
        e.to_string().contains("max_seqlen must be 1..=total"),
        "{e}"
    );
    let mut small = gpu.zeros(ws_len - 1).unwrap();
    let e = run(&cu, 3, &mut small).unwrap_err();
    assert!(
        e.to_string().contains("gdn_prefill_varlen_workspace_len"),
        "{e}"
    );
}

/// The workspace size is a pure function of the shapes (no device needed) and refuses what the prefill refuses.
#[test]
fn workspace_len_refuses_bad_shapes() {
    let n = Gpu::gdn_prefill_workspace_len(&GROUP3, &[65, 3]).unwrap();
    // 2 + 1 chunks: qn/kn 68*2*128 each, v 68*6*128, three gate arrays padded to 64, W/U 6*3*64*128 each, Aqk
    // 6*3*64*64.
    let pad = |x: usize| x.div_ceil(64) * 64;
    let want =
        2 * pad(68 * 256) + pad(68 * 768) + 3 * pad(68 * 6) + 2 * 6 * 3 * 8192 + 6 * 3 * 4096;
    assert_eq!(n, want);
    // The device-table form: W / U / Aqk for the most chunks 2 sequences of at most 65 of 68 tokens can have
    // (min(2 * 2, 2 + 2) = 4), plus the meta table (2 * 3 int32, padded to 64).
    let n = Gpu::gdn_prefill_varlen_workspace_len(&GROUP3, 2, 68, 65).unwrap();
    let want =
        2 * pad(68 * 256) + pad(68 * 768) + 3 * pad(68 * 6) + 2 * 6 * 4 * 8192 + 6 * 4 * 4096 + 64;
    assert_eq!(n, want);
    let e = Gpu::gdn_prefill_varlen_workspace_len(&GROUP3, 2, 68, 69).unwrap_err();
    assert!(e.to_string().contains("max_seqlen"), "{e}");
    // The bf16 split adds a slot of 128 * 128 + 64 * 128 bf16 per (head, chunk) and bf16 copies of q and k
    // (68 * 2 * 128 each), in either form; every other name has the default's size; an unknown name is an error.
    let slots = |chunks: usize| pad(6 * chunks * (128 * 128 + 64 * 128) / 2) + pad(68 * 256);
    let base = Gpu::gdn_prefill_workspace_len(&GROUP3, &[65, 3]).unwrap();
    for v in ["wytf32x3_bf16_cs64", "wytf32_bf16_cs64", "wyf16_bf16_cs64"] {
        let split = Gpu::gdn_prefill_workspace_len_with(v, &GROUP3, &[65, 3]).unwrap();
        assert_eq!(split, base + slots(3), "{v}");
        let split = Gpu::gdn_prefill_varlen_workspace_len_with(v, &GROUP3, 2, 68, 65).unwrap();
        assert_eq!(split, want + slots(4), "{v}");
    }
    for v in ["auto", "", "fp32_cs32", "wytf32_tf32_cs64"] {
        let same = Gpu::gdn_prefill_workspace_len_with(v, &GROUP3, &[65, 3]).unwrap();
        assert_eq!(same, base, "{v}");
    }
    let e = Gpu::gdn_prefill_workspace_len_with("bf16_cs32", &GROUP3, &[65, 3]).unwrap_err();
    assert!(
        e.to_string().contains("unknown state-kernel variant"),
        "{e}"
    );
    let e = Gpu::gdn_prefill_varlen_workspace_len_with("nope", &GROUP3, 2, 68, 65).unwrap_err();
    assert!(
        e.to_string().contains("unknown state-kernel variant"),
        "{e}"
    );
    let e = Gpu::gdn_prefill_workspace_len(
        &GdnDims {
            key_dim: 64,
            ..GROUP3
        },
        &[4],
    )
    .unwrap_err();
    assert!(e.to_string().contains("key_dim = value_dim = 128"), "{e}");
    let e = Gpu::gdn_prefill_workspace_len(&GROUP3, &[]).unwrap_err();
    assert!(e.to_string().contains("sequences"), "{e}");
    let e = Gpu::gdn_prefill_workspace_len(
        &GdnDims {
            value_heads: 5,
            ..GROUP3
        },
        &[4],
    )
    .unwrap_err();
    assert!(e.to_string().contains("multiple of key_heads"), "{e}");
}

#[test]
fn bad_sizes_are_errors() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_prefill bad sizes");
    let dims = ONE_HEAD;
    let lens = [3usize, 2];
    let n = 5;
    let layer = gdn_layer(&dims, &mut rng, (-1.0, 1.0));
    let tok = gdn_tokens(&dims, n, &mut rng);
    let dl = GdnGpuLayer::new(&gpu, &layer);
    let dx = GdnGpuTokens::new(&gpu, &tok.rows(&dims, 0, n));
    let conv_in = gpu.zeros(2 * dims.conv_state_len()).unwrap();
    let mut conv_out = gpu.zeros(2 * dims.conv_state_len()).unwrap();
    let mut state = gpu.zeros(2 * dims.state_len()).unwrap();
    let mut out = gpu.zeros(n * dims.value_width()).unwrap();
    let ws_len = Gpu::gdn_prefill_workspace_len(&dims, &lens).unwrap();
    let mut ws = gpu.zeros(ws_len).unwrap();
    let w = dl.weights();
    let x = dx.inputs();
    let mut run = |variant: &str,
                   dims: &GdnDims,
                   x: &GdnGpuInputs<'_>,
                   lens: &[usize],
                   ws: &mut GpuBuffer<f32>| {
        gpu.gdn_prefill_with(
            variant,
            dims,
            &w,
            x,
            lens,
            GdnPrefillIo {
                conv_in: &conv_in,
                conv_out: &mut conv_out,
                state: &mut state,
                out: &mut out,
                workspace: ws,
            },
        )
    };
    // The valid call works, so each failure below is the one change.
    run("auto", &dims, &x, &lens, &mut ws).unwrap();
    let e = run("auto", &dims, &x, &[3, 3], &mut ws).unwrap_err();
    assert!(e.to_string().contains("qkv has"), "{e}");
    let e = run("auto", &dims, &x, &[5], &mut ws).unwrap_err();
    assert!(e.to_string().contains("conv_in has"), "{e}");
    let e = run("fp32_cs48", &dims, &x, &lens, &mut ws).unwrap_err();
    assert!(
        e.to_string().contains("unknown state-kernel variant"),
        "{e}"
    );
    let e = run("wybf16_tf32_cs32", &dims, &x, &lens, &mut ws).unwrap_err();
    assert!(
        e.to_string().contains("unknown state-kernel variant"),
        "{e}"
    );
    let e = run("bf16_cs32", &dims, &x, &lens, &mut ws).unwrap_err();
    assert!(
        e.to_string().contains("unknown state-kernel variant"),
        "{e}"
    );
    let e = run(
        "auto",
        &GdnDims {
            value_dim: 64,
            ..dims
        },
        &x,
        &lens,
        &mut ws,
    )
    .unwrap_err();
    assert!(e.to_string().contains("key_dim = value_dim = 128"), "{e}");
    let e = run("auto", &dims, &x, &[], &mut ws).unwrap_err();
    assert!(e.to_string().contains("sequences"), "{e}");
    let mut small = gpu.zeros(ws_len - 1).unwrap();
    let e = run("auto", &dims, &x, &lens, &mut small).unwrap_err();
    assert!(e.to_string().contains("workspace has"), "{e}");
    // The default's workspace is too small for the bf16 split (its chunk-state slots), and the error names the
    // function that sizes it.
    let e = run("wytf32x3_bf16_cs64", &dims, &x, &lens, &mut ws).unwrap_err();
    assert!(
        e.to_string().contains("workspace has")
            && e.to_string().contains("gdn_prefill_workspace_len_with"),
        "{e}"
    );
    let short_z = gpu.zeros(n * dims.value_width() - 1).unwrap();
    let bad_x = GdnGpuInputs {
        z: &short_z,
        ..dx.inputs()
    };
    let e = run("auto", &dims, &bad_x, &lens, &mut ws).unwrap_err();
    assert!(e.to_string().contains("z has"), "{e}");
    let e = run(
        "auto",
        &GdnDims {
            conv_kernel: 5,
            ..dims
        },
        &x,
        &lens,
        &mut ws,
    )
    .unwrap_err();
    assert!(e.to_string().contains("conv_kernel"), "{e}");
}
