//! Every variant of the fused gated DeltaNet decode step (`cuda/gdn.cu`, `Gpu::gdn_decode_step_variant`) against
//! the f64 reference `kernels::reference::gdn::step`, over several steps so that the conv history and the state
//! carry over between launches: fresh random inputs each run (the seed is printed), ragged batches, value-head
//! groups of 1, 2 and 3 and conv kernels 2, 3 and 4, outputs and the advanced conv state poisoned with NaN before
//! each launch (an element no block wrote fails and names itself), stated error bounds. Then the refusals: an
//! unknown variant, unbuilt head dims and conv kernels, a batch out of range, a buffer of the wrong length.
//!
//! Where there is no CUDA device (or no `cuda` feature) each test prints "skipped: no CUDA device". Small enough
//! for `compute-sanitizer --tool memcheck|racecheck` in seconds.

//!
//! The tests drive named variants (`gdn_decode_step_variant`), so the file builds with the `lab` feature only.
#![cfg(feature = "lab")]

use kernels::cuda::{GdnGpuInputs, GdnGpuWeights, Gpu, GpuBuffer};
use kernels::gdn::{GdnDims, GdnInputs, GdnWeights};
use kernels::reference;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

mod gpu_common;
use gpu_common::{gpu, rel_err, rng, uniform};

/// The element of `got` farthest from `want`, as "index i (what it is): got g, want w".
fn worst(got: &[f32], want: &[f32], name: impl Fn(usize) -> String) -> String {
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

struct Case {
    dims: GdnDims,
    seqs: usize,
    steps: usize,
}

/// Runs `variant` for `case.steps` steps against the reference; panics with the variant, case, step, buffer and
/// worst element on a mismatch.
fn check_variant(gpu: &Gpu, rng: &mut ChaCha8Rng, variant: &str, case: &Case) {
    let Case { dims, seqs, steps } = *case;
    let cd = dims.conv_dim();
    let vw = dims.value_width();
    let (hv, d) = (dims.value_heads, dims.value_dim);
    let what = format!(
        "variant {variant}, Hk={} Hv={} K={} seqs={seqs}",
        dims.key_heads, hv, dims.conv_kernel
    );
    let conv_weight = uniform(rng, cd * dims.conv_kernel, 0.5);
    let a_log = uniform(rng, hv, 1.0);
    let dt_bias = uniform(rng, hv, 1.0);
    let norm_weight: Vec<f32> = (0..d).map(|_| rng.gen_range(0.5..1.5)).collect();
    let w = GdnWeights {
        conv_weight: &conv_weight,
        a_log: &a_log,
        dt_bias: &dt_bias,
        norm_weight: &norm_weight,
        norm_eps: 1e-6,
    };
    let dw = GdnGpuWeights {
        conv_weight: &gpu.upload(&conv_weight).unwrap(),
        a_log: &gpu.upload(&a_log).unwrap(),
        dt_bias: &gpu.upload(&dt_bias).unwrap(),
        norm_weight: &gpu.upload(&norm_weight).unwrap(),
        norm_eps: 1e-6,
    };
    let mut conv_ref = uniform(rng, seqs * dims.conv_state_len(), 1.0);
    let mut state_ref = uniform(rng, seqs * dims.state_len(), 0.1);
    let mut conv_a = gpu.upload(&conv_ref).unwrap();
    let mut conv_b = gpu.upload(&vec![f32::NAN; conv_ref.len()]).unwrap();
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
        let qkv = uniform(rng, seqs * cd, 2.0);
        let z = uniform(rng, seqs * vw, 2.0);
        let a = uniform(rng, seqs * hv, 2.0);
        let b = uniform(rng, seqs * hv, 3.0);
        let mut want = vec![0.0f32; seqs * vw];
        for s in 0..seqs {
            let x = GdnInputs {
                qkv: &qkv[s * cd..(s + 1) * cd],
                z: &z[s * vw..(s + 1) * vw],
                a: &a[s * hv..(s + 1) * hv],
                b: &b[s * hv..(s + 1) * hv],
            };
            reference::gdn::step(
                &dims,
                &w,
                &x,
                &mut conv_ref[s * dims.conv_state_len()..(s + 1) * dims.conv_state_len()],
                &mut state_ref[s * dims.state_len()..(s + 1) * dims.state_len()],
                &mut want[s * vw..(s + 1) * vw],
            )
            .unwrap();
        }
        let (dq, dz, da, db) = (
            gpu.upload(&qkv).unwrap(),
            gpu.upload(&z).unwrap(),
            gpu.upload(&a).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        let x = GdnGpuInputs {
            qkv: &dq,
            z: &dz,
            a: &da,
            b: &db,
        };
        let mut out = gpu.upload(&vec![f32::NAN; seqs * vw]).unwrap();
        gpu.gdn_decode_step_variant(
            variant,
            &dims,
            &dw,
            &x,
            seqs,
            &conv_a,
            &mut conv_b,
            &mut state,
            &mut out,
        )
        .unwrap_or_else(|e| panic!("{what}, step {step}: {e}"));
        // fp32 through the conv, the norms and 128-long dots against f64: ~1e-6 relative; bounds 1e-4 (output,
        // after the RMSNorm's division) and 1e-5 (state). The conv history is a copy: exact.
        let got = gpu.download(&out).unwrap();
        let e = rel_err(&format!("{what}, output step {step}"), &got, &want);
        assert!(
            e < 1e-4,
            "{what}, output step {step}: relative error {e:e}; {}",
            worst(&got, &want, out_name)
        );
        let got = gpu.download(&state).unwrap();
        let e = rel_err(&format!("{what}, state step {step}"), &got, &state_ref);
        assert!(
            e < 1e-5,
            "{what}, state step {step}: relative error {e:e}; {}",
            worst(&got, &state_ref, state_name)
        );
        let got = gpu.download(&conv_b).unwrap();
        let e = rel_err(&format!("{what}, conv state step {step}"), &got, &conv_ref);
        assert!(
            e == 0.0,
            "{what}, conv state step {step}: a copy, yet relative error {e:e}; {}",
            worst(&got, &conv_ref, conv_name)
        );
        std::mem::swap(&mut conv_a, &mut conv_b);
        gpu.write(&mut conv_b, &vec![f32::NAN; conv_ref.len()])
            .unwrap();
    }
}

fn dims(key_heads: usize, value_heads: usize, conv_kernel: usize) -> GdnDims {
    GdnDims {
        key_heads,
        value_heads,
        key_dim: 128,
        value_dim: 128,
        conv_kernel,
    }
}

#[test]
fn every_decode_variant_matches_the_reference_over_several_steps() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_decode_variants");
    // Qwen3.8-27B's group of 3 value heads per key head with K = 4, a group of 2 with K = 3, no grouping with
    // K = 2; batches of 3, 2 and 5 (a batch is a grid dimension, nothing rounds it; "auto" takes a different
    // kernel at each: split4_t128_1r, split8_t128_1r, split2_t256_1r).
    let cases = [
        Case {
            dims: dims(2, 6, 4),
            seqs: 3,
            steps: 3,
        },
        Case {
            dims: dims(1, 2, 3),
            seqs: 2,
            steps: 3,
        },
        Case {
            dims: dims(3, 3, 2),
            seqs: 5,
            steps: 2,
        },
    ];
    let mut variants = vec!["auto"];
    variants.extend_from_slice(Gpu::GDN_DECODE_VARIANTS);
    for variant in variants {
        for case in &cases {
            check_variant(&gpu, &mut rng, variant, case);
        }
    }
}

/// Buffers sized for `dims` and `seqs`, zero-filled.
struct Bufs {
    one_w: [GpuBuffer<f32>; 4],
    x: [GpuBuffer<f32>; 4],
    conv_in: GpuBuffer<f32>,
    conv_out: GpuBuffer<f32>,
    state: GpuBuffer<f32>,
    out: GpuBuffer<f32>,
}

fn bufs(gpu: &Gpu, d: &GdnDims, seqs: usize) -> Bufs {
    let z = |n: usize| gpu.zeros::<f32>(n.max(1)).unwrap();
    Bufs {
        one_w: [
            z(d.conv_dim() * d.conv_kernel),
            z(d.value_heads),
            z(d.value_heads),
            z(d.value_dim),
        ],
        x: [
            z(seqs * d.conv_dim()),
            z(seqs * d.value_width()),
            z(seqs * d.value_heads),
            z(seqs * d.value_heads),
        ],
        conv_in: z(seqs * d.conv_state_len()),
        conv_out: z(seqs * d.conv_state_len()),
        state: z(seqs * d.state_len()),
        out: z(seqs * d.value_width()),
    }
}

fn run(gpu: &Gpu, variant: &str, d: &GdnDims, seqs: usize, b: &mut Bufs) -> String {
    let w = GdnGpuWeights {
        conv_weight: &b.one_w[0],
        a_log: &b.one_w[1],
        dt_bias: &b.one_w[2],
        norm_weight: &b.one_w[3],
        norm_eps: 1e-6,
    };
    let x = GdnGpuInputs {
        qkv: &b.x[0],
        z: &b.x[1],
        a: &b.x[2],
        b: &b.x[3],
    };
    match gpu.gdn_decode_step_variant(
        variant,
        d,
        &w,
        &x,
        seqs,
        &b.conv_in,
        &mut b.conv_out,
        &mut b.state,
        &mut b.out,
    ) {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn decode_variants_refuse_bad_calls_with_a_reason() {
    let Some(gpu) = gpu() else { return };
    let good = dims(1, 2, 4);
    let mut b = bufs(&gpu, &good, 2);
    // The buffers are right: every variant runs (zeros in, zeros out).
    for v in Gpu::GDN_DECODE_VARIANTS {
        assert_eq!(run(&gpu, v, &good, 2, &mut b), "ok", "variant {v}");
    }
    let e = run(&gpu, "split3_t96", &good, 2, &mut b);
    assert!(
        e.contains("unknown variant")
            && e.contains("block_per_head")
            && e.contains("split8_t128_1r"),
        "{e}"
    );
    for v in ["auto", "split8_t128_1r", "split2_t256_1r", "block_per_head"] {
        let e = run(&gpu, v, &good, 0, &mut b);
        assert!(e.contains("seqs must be 1..=65535"), "{v}: {e}");
        let e = run(&gpu, v, &good, 65536, &mut b);
        assert!(e.contains("seqs must be 1..=65535"), "{v}: {e}");
        // One sequence more than the buffers hold: named by the first buffer checked.
        let e = run(&gpu, v, &good, 3, &mut b);
        assert!(e.contains("qkv"), "{v}: {e}");
        let mut small = dims(1, 2, 4);
        small.key_dim = 64;
        let e = run(&gpu, v, &small, 2, &mut b);
        assert!(e.contains("key_dim = value_dim = 128"), "{v}: {e}");
        let e = run(&gpu, v, &dims(1, 2, 5), 2, &mut b);
        assert!(e.contains("conv_kernel must be 2..=4"), "{v}: {e}");
        let e = run(&gpu, v, &dims(2, 3, 4), 2, &mut b);
        assert!(e.contains("multiple of key_heads"), "{v}: {e}");
    }
    // A state buffer one float short.
    let mut short = bufs(&gpu, &good, 2);
    short.state = gpu.zeros(2 * good.state_len() - 1).unwrap();
    let e = run(&gpu, "split4_t128_1r", &good, 2, &mut short);
    assert!(e.contains("state"), "{e}");
}
