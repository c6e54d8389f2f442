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
use kernels::gdn::GdnDims;

mod gpu_common;
use gpu_common::{check_gdn_decode_steps, gdn_dims as dims, gpu, rng};

#[test]
fn every_decode_variant_matches_the_reference_over_several_steps() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_decode_variants");
    // Qwen3.8-27B's group of 3 value heads per key head with K = 4, a group of 2 with K = 3, no grouping with
    // K = 2; batches of 3, 2 and 5 (a batch is a grid dimension, nothing rounds it; "auto" takes a different
    // kernel at each: split4_t128_1r, split8_t128_1r, split2_t256_1r).
    let cases = [
        (dims(2, 6, 4), 3, 3),
        (dims(1, 2, 3), 2, 3),
        (dims(3, 3, 2), 5, 2),
    ];
    let mut variants = vec!["auto"];
    variants.extend_from_slice(Gpu::GDN_DECODE_VARIANTS);
    for variant in variants {
        for (dims, seqs, steps) in cases {
            let what = format!(
                "variant {variant}, Hk={} Hv={} K={} seqs={seqs}",
                dims.key_heads, dims.value_heads, dims.conv_kernel
            );
            check_gdn_decode_steps(
                &gpu,
                &mut rng,
                &what,
                dims,
                seqs,
                steps,
                &mut |w, x, seqs, conv_in, conv_out, state, out| {
                    gpu.gdn_decode_step_variant(
                        variant, &dims, w, x, seqs, conv_in, conv_out, state, out,
                    )
                },
            );
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
