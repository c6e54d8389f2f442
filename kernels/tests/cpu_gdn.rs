//! The C gated DeltaNet kernels against the f64 token-by-token reference: the decode step on every ISA path, the
//! chunked prefill over lengths that are not multiples of the chunk (1, 63, 64, 65, 130) from zero and non-zero
//! starting states, ragged head dims, poisoned outputs, and proof (the ISA tag counters) that each path ran.

use kernels::cpu::Isa;
use kernels::gdn::{self, GdnDims, GdnWeights};
use kernels::ops::seq_isa_calls;
use kernels::reference;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::{
    assert_scaled_close, gdn_dims_of, gdn_layer as layer, gdn_reference_steps,
    gdn_tokens as tokens, uniform_in as uniform, GdnLayer, GdnTokens,
};
use kernels::KernelError;

/// Asserts |got - want| <= tol * (1 + |want|) everywhere, naming the worst offender.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_scaled_close(what, got, want, tol, |_| String::new());
}

/// Scaled error bounds (|got - want| / (1 + |want|)) against the f64 reference. Measured on this machine over
/// every case below: outputs at most 1.5e-5, states at most 4.6e-7 (all ISA paths), so the bounds leave ~7-9x.
const OUT_TOL: f32 = 1e-4;
const STATE_TOL: f32 = 4e-6;

const SMALL: GdnDims = gdn_dims_of(2, 6, 32, 32, 4);
const RAGGED: GdnDims = gdn_dims_of(1, 3, 20, 24, 4);
const QWEN_HEAD: GdnDims = gdn_dims_of(1, 3, 128, 128, 4);

fn check_decode(isa: Isa, dims: &GdnDims, batch: usize, steps: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let layer = layer(dims, &mut rng, (-1.0, 1.0));
    let w = layer.weights();
    let mut conv = uniform(&mut rng, batch * dims.conv_state_len(), -1.0, 1.0);
    let mut state = uniform(&mut rng, batch * dims.state_len(), -0.5, 0.5);
    let (mut conv_ref, mut state_ref) = (conv.clone(), state.clone());
    for step in 0..steps {
        let tok = tokens(dims, batch, &mut rng);
        let mut out = vec![f32::NAN; batch * dims.value_width()];
        let (x, c, s) = (tok.inputs(), &mut conv, &mut state);
        ran_on(isa, || {
            gdn::decode_step_with(isa, 2, dims, &w, batch, &x, c, s, &mut out)
        });
        let want = gdn_reference_steps(dims, &w, &tok.inputs(), &mut conv_ref, &mut state_ref);
        let ctx = format!("{isa:?} {dims:?} step {step}");
        assert_all(
            &ctx,
            "state",
            [&out, &want],
            OUT_TOL,
            [&state, &state_ref],
            [&conv, &conv_ref],
        );
    }
}

#[test]
fn decode_step_matches_reference_on_every_isa() {
    for isa in Isa::available() {
        check_decode(isa, &SMALL, 3, 4, 1);
        check_decode(isa, &RAGGED, 2, 3, 2);
        check_decode(isa, &QWEN_HEAD, 1, 2, 3);
    }
}

/// Runs `f` and asserts that the `isa` path ran.
fn ran_on(isa: Isa, f: impl FnOnce() -> Result<(), KernelError>) {
    let before = seq_isa_calls(isa);
    f().unwrap();
    assert!(seq_isa_calls(isa) > before, "{isa:?} path did not run");
}

/// The output within `out_tol`, the recurrent state within STATE_TOL and the conv history exactly, each pair
/// `[got, want]`.
fn assert_all(
    ctx: &str,
    state_name: &str,
    out: [&[f32]; 2],
    out_tol: f32,
    state: [&[f32]; 2],
    conv: [&[f32]; 2],
) {
    assert_close(&format!("{ctx} out"), out[0], out[1], out_tol);
    assert_close(
        &format!("{ctx} {state_name}"),
        state[0],
        state[1],
        STATE_TOL,
    );
    assert_eq!(conv[0], conv[1], "{ctx} conv state");
}

fn check_prefill(isa: Isa, dims: &GdnDims, t: usize, warm: bool, a_log: (f32, f32), seed: u64) {
    check_prefill_within(isa, dims, t, warm, a_log, seed, OUT_TOL);
}

/// [`check_prefill`] with a given bound on the outputs' scaled error.
fn check_prefill_within(
    isa: Isa,
    dims: &GdnDims,
    t: usize,
    warm: bool,
    a_log_range: (f32, f32),
    seed: u64,
    out_tol: f32,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let layer = layer(dims, &mut rng, a_log_range);
    let w = layer.weights();
    let (mut conv, mut state) = if warm {
        (
            uniform(&mut rng, dims.conv_state_len(), -1.0, 1.0),
            uniform(&mut rng, dims.state_len(), -0.5, 0.5),
        )
    } else {
        (
            vec![0.0; dims.conv_state_len()],
            vec![0.0; dims.state_len()],
        )
    };
    let (mut conv_ref, mut state_ref) = (conv.clone(), state.clone());
    let tok = tokens(dims, t, &mut rng);
    let mut out = vec![f32::NAN; t * dims.value_width()];
    let mut want = vec![0.0f32; t * dims.value_width()];
    let (x, c, s) = (tok.inputs(), &mut conv, &mut state);
    ran_on(isa, || {
        gdn::prefill_with(isa, 2, dims, &w, t, &x, c, s, &mut out)
    });
    reference::gdn::sequence(dims, &w, t, &x, &mut conv_ref, &mut state_ref, &mut want).unwrap();
    let ctx = format!("{isa:?} {dims:?} t={t} warm={warm}");
    assert_all(
        &ctx,
        "final state",
        [&out, &want],
        out_tol,
        [&state, &state_ref],
        [&conv, &conv_ref],
    );
}

#[test]
fn chunked_prefill_matches_the_recurrence_on_every_isa() {
    for isa in Isa::available() {
        for (i, &t) in [1usize, 63, 64, 65, 130].iter().enumerate() {
            check_prefill(isa, &SMALL, t, i % 2 == 1, (-1.0, 1.0), 10 + i as u64);
        }
        check_prefill(isa, &RAGGED, 70, true, (-1.0, 1.0), 20);
        check_prefill(isa, &QWEN_HEAD, 65, true, (-1.0, 1.0), 21);
    }
}

/// Strong decay (A up to e^3 = 20): inside a 64-token chunk the cumulative decay underflows f32 (e^-1000), which
/// breaks chunk forms that divide by e^G; ours only exponentiates differences G_t - G_s with s <= t.
#[test]
fn chunked_prefill_survives_decay_that_underflows_a_chunk() {
    for isa in Isa::available() {
        check_prefill(isa, &SMALL, 130, true, (2.0, 3.0), 30);
    }
}

/// The SMALL layer and `n` tokens drawn from `seed`.
fn small_layer_and_tokens(seed: u64, n: usize) -> (GdnLayer, GdnTokens) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let layer = layer(&SMALL, &mut rng, (-1.0, 1.0));
    (layer, tokens(&SMALL, n, &mut rng))
}

/// Prefill then decode is the same as decoding every token: the states prefill leaves are usable by the step.
#[test]
fn decode_continues_a_prefill() {
    let dims = SMALL;
    let t = 67;
    let (layer, tok) = small_layer_and_tokens(40, t + 1);
    let w = layer.weights();
    let vw = dims.value_width();
    let (mut conv, mut state) = (
        vec![0.0; dims.conv_state_len()],
        vec![0.0; dims.state_len()],
    );
    let mut out = vec![0.0; t * vw];
    let x = tok.rows(&dims, 0, t);
    gdn::prefill(&dims, &w, t, &x, &mut conv, &mut state, &mut out).unwrap();
    let last = tok.rows(&dims, t, t + 1);
    let mut step_out = vec![f32::NAN; vw];
    gdn::decode_step(&dims, &w, 1, &last, &mut conv, &mut state, &mut step_out).unwrap();
    let (mut conv_ref, mut state_ref) = (
        vec![0.0; dims.conv_state_len()],
        vec![0.0; dims.state_len()],
    );
    let mut want = vec![0.0; (t + 1) * vw];
    let x = tok.inputs();
    reference::gdn::sequence(
        &dims,
        &w,
        t + 1,
        &x,
        &mut conv_ref,
        &mut state_ref,
        &mut want,
    )
    .unwrap();
    assert_close("step after prefill", &step_out, &want[t * vw..], OUT_TOL);
    assert_close("state after prefill + step", &state, &state_ref, STATE_TOL);
}

#[test]
fn bad_sizes_are_errors_not_ub() {
    let dims = SMALL;
    let (layer, tok) = small_layer_and_tokens(50, 2);
    let w = layer.weights();
    let mut conv = vec![0.0; 2 * dims.conv_state_len()];
    let mut state = vec![0.0; 2 * dims.state_len()];
    let mut out = vec![0.0; 2 * dims.value_width()];
    // One float short of the recurrent state of two sequences.
    let e = gdn::decode_step(
        &dims,
        &w,
        2,
        &tok.inputs(),
        &mut conv,
        &mut state[1..],
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("state has"), "{e}");
    // Three sequences claimed, two given.
    let e =
        gdn::decode_step(&dims, &w, 3, &tok.inputs(), &mut conv, &mut state, &mut out).unwrap_err();
    assert!(e.to_string().contains("qkv has"), "{e}");
    let short_norm = &layer.norm_weight[1..];
    let bad = GdnWeights {
        norm_weight: short_norm,
        ..w
    };
    let e = gdn::prefill(
        &dims,
        &bad,
        2,
        &tok.inputs(),
        &mut conv[..dims.conv_state_len()],
        &mut state[..dims.state_len()],
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("norm_weight"), "{e}");
    // Absurd counts are refused by the size checks' checked products, not by an arithmetic overflow.
    let e = gdn::decode_step(
        &dims,
        &w,
        usize::MAX,
        &tok.inputs(),
        &mut conv,
        &mut state,
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("n*conv_dim overflows usize"), "{e}");
    let wide = GdnDims {
        key_heads: usize::MAX / 2,
        value_heads: usize::MAX / 2,
        ..dims
    };
    assert!(gdn::prefill(&wide, &w, 2, &tok.inputs(), &mut conv, &mut state, &mut out).is_err());
    let huge = GdnDims {
        key_dim: 2048,
        ..dims
    };
    let e =
        gdn::decode_step(&huge, &w, 2, &tok.inputs(), &mut conv, &mut state, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("not supported") || e.to_string().contains("conv_weight"),
        "{e}"
    );
}

/// key_dim = 1: every l2-normalised key is +-1, so all keys of a chunk are collinear and the chunk's (I + A) is a
/// triangle of +-beta_i * gamma_i / gamma_j whose inverse amplifies fp32 rounding far more than real keys do (no
/// model has key_dim below 64). Over 3000 random geometries on this machine the outputs' scaled error reached
/// 5.4e-4 (key_dim >= 2: never above 1e-4), which is why the property test starts at 2 and this fixed set of cases
/// keeps the path exercised under a bound of 2e-3 (the states' bound is unchanged).
#[test]
fn collinear_keys_one_dimensional() {
    for seed in 0..24u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let hk = rng.gen_range(1..3usize);
        let hv = hk * rng.gen_range(1..4usize);
        let dv = rng.gen_range(1..40usize);
        let dims = gdn_dims_of(hk, hv, 1, dv, rng.gen_range(1..5usize));
        let t = rng.gen_range(1..140usize);
        check_prefill_within(
            Isa::detected(),
            &dims,
            t,
            seed % 2 == 0,
            (-1.0, 1.0),
            seed,
            2e-3,
        );
    }
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
        /// Any geometry (Hv a multiple of Hk, ragged dims, kernel 1..4) and any length: chunked prefill == recurrence.
        /// key_dim >= 2: key_dim = 1 has its own test and bound (`collinear_keys_one_dimensional`).
        #[test]
        fn chunked_prefill_equals_recurrence(hk in 1usize..3, group in 1usize..4, dk in 2usize..40, dv in 1usize..40,
                                             kk in 1usize..5, t in 1usize..140, seed in 0u64..1000) {
            let dims = GdnDims { key_heads: hk, value_heads: hk * group, key_dim: dk, value_dim: dv, conv_kernel: kk };
            check_prefill(Isa::detected(), &dims, t, seed % 2 == 0, (-1.0, 1.0), seed);
        }
    }
}

/// The prefill flushes subnormals for its own duration (see `csrc/gdn_impl.h`); the caller's floating-point mode
/// must come back unchanged, or every later float op on this thread would silently change behaviour.
#[cfg(target_arch = "x86_64")]
#[test]
fn prefill_restores_the_callers_float_mode() {
    fn mxcsr() -> u32 {
        let mut v = 0u32;
        // SAFETY: stmxcsr stores the 4-byte MXCSR register to the address given, a live local.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack)) };
        v
    }
    // Bits 0-5 are sticky exception flags that any inexact float op sets; the mode lives in bits 6-15.
    const CONTROL: u32 = !0x3f;
    let before = mxcsr() & CONTROL;
    assert_eq!(before & 0x8040, 0, "test threads start without FTZ/DAZ");
    for isa in Isa::available() {
        check_prefill(isa, &SMALL, 70, true, (2.0, 3.0), 60);
        assert_eq!(
            mxcsr() & CONTROL,
            before,
            "{isa:?} prefill left the MXCSR mode changed"
        );
    }
}
