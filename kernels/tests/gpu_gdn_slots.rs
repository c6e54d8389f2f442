//! The gated DeltaNet decode step on slot-indexed caches (`Gpu::gdn_decode_step_slots`, what the engine runs)
//! against the same step on caches in batch order (`Gpu::gdn_decode_step`, itself checked against the f64 reference
//! in `gpu_gdn_decode.rs`): the same kernel arithmetic, so outputs, states and conv histories must agree bit for
//! bit. Fresh random inputs each run (the seed is printed), sequences on scattered slots of a larger cache, positions
//! of both parities (which half of a slot's conv pair is read), several steps so the ping-pong carries over,
//! outputs poisoned with NaN, and slots no step touches checked unchanged. Then a slot past the cache: its output
//! row is NaN and no cache byte moves; and the refusals of bad sizes.
//!
//! Where there is no CUDA device (or no `cuda` feature) each test prints "skipped: no CUDA device".

use kernels::cuda::{GdnGpuInputs, GdnStackedInputs, Gpu, GpuBuffer};
use kernels::gdn::GdnDims;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

mod gpu_common;
use gpu_common::{gdn_dims as dims, gpu, nan_f32, rng, uniform, GdnGpuLayer, GdnLayer};

/// Random layer weights (conv in (-0.5, 0.5), `A_log` in (-1, 1)) on the device.
fn weights(gpu: &Gpu, rng: &mut ChaCha8Rng, d: &GdnDims) -> GdnGpuLayer {
    GdnGpuLayer::new(gpu, &GdnLayer::new(d, rng, 0.5, (-1.0, 1.0)))
}

/// Bit patterns, so that NaN == NaN and -0 != 0 where it matters.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The first index where `got` and `want` differ in bits, named.
fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} differs: got {} want {}",
            got[i], want[i]
        );
    }
}

fn check_case(gpu: &Gpu, d: GdnDims, seqs: usize, n_slots: usize, steps: usize, seed_name: &str) {
    let mut rng = rng(seed_name);
    let (cd, vw, hv) = (d.conv_dim(), d.value_width(), d.value_heads);
    let (cl, sl) = (d.conv_state_len(), d.state_len());
    let w = weights(gpu, &mut rng, &d);
    let what = format!(
        "Hk={} Hv={hv} K={} seqs={seqs} slots={n_slots}",
        d.key_heads, d.conv_kernel
    );
    // The slot caches: random contents everywhere, so a wrong row or half shows.
    let mut conv_h = uniform(&mut rng, n_slots * 2 * cl, 1.0);
    let mut state_h = uniform(&mut rng, n_slots * sl, 0.1);
    let mut conv = gpu.upload(&conv_h).unwrap();
    let mut state = gpu.upload(&state_h).unwrap();
    // Scattered, distinct slots in a shuffled order; each sequence's starting position of either parity.
    let mut all: Vec<usize> = (0..n_slots).collect();
    all.shuffle(&mut rng);
    let slots: Vec<usize> = all[..seqs].to_vec();
    let mut pos: Vec<usize> = (0..seqs).map(|_| rng.gen_range(0..50)).collect();
    for step in 0..steps {
        let qkvz = uniform(&mut rng, seqs * (cd + vw), 2.0);
        let a = uniform(&mut rng, seqs * hv, 2.0);
        let b = uniform(&mut rng, seqs * hv, 3.0);
        let mut ba = vec![0.0f32; seqs * 2 * hv];
        for s in 0..seqs {
            ba[s * 2 * hv..s * 2 * hv + hv].copy_from_slice(&b[s * hv..(s + 1) * hv]);
            ba[s * 2 * hv + hv..(s + 1) * 2 * hv].copy_from_slice(&a[s * hv..(s + 1) * hv]);
        }
        // The batch-order arm: the same sequences' rows gathered on the host.
        let mut qkv = Vec::with_capacity(seqs * cd);
        let mut z = Vec::with_capacity(seqs * vw);
        let mut cin = Vec::with_capacity(seqs * cl);
        let mut st = Vec::with_capacity(seqs * sl);
        for s in 0..seqs {
            let row = &qkvz[s * (cd + vw)..(s + 1) * (cd + vw)];
            qkv.extend_from_slice(&row[..cd]);
            z.extend_from_slice(&row[cd..]);
            let half = 2 * slots[s] + pos[s] % 2;
            cin.extend_from_slice(&conv_h[half * cl..(half + 1) * cl]);
            st.extend_from_slice(&state_h[slots[s] * sl..(slots[s] + 1) * sl]);
        }
        let (gq, gz, ga, gb) = (
            gpu.upload(&qkv).unwrap(),
            gpu.upload(&z).unwrap(),
            gpu.upload(&a).unwrap(),
            gpu.upload(&b).unwrap(),
        );
        let cin_d = gpu.upload(&cin).unwrap();
        let mut cout_d = nan_f32(gpu, seqs * cl);
        let mut st_d = gpu.upload(&st).unwrap();
        let mut out_rows = nan_f32(gpu, seqs * vw);
        gpu.gdn_decode_step(
            &d,
            &w.weights(),
            &GdnGpuInputs {
                qkv: &gq,
                z: &gz,
                a: &ga,
                b: &gb,
            },
            seqs,
            &cin_d,
            &mut cout_d,
            &mut st_d,
            &mut out_rows,
        )
        .unwrap();
        // The slot arm.
        let slots_d = gpu
            .upload(&slots.iter().map(|&s| s as u32).collect::<Vec<_>>())
            .unwrap();
        let pos_d = gpu
            .upload(&pos.iter().map(|&p| p as u32).collect::<Vec<_>>())
            .unwrap();
        let mut out = nan_f32(gpu, seqs * vw);
        gpu.gdn_decode_step_slots(
            &d,
            &w.weights(),
            &GdnStackedInputs {
                qkvz: &gpu.upload(&qkvz).unwrap(),
                ba: &gpu.upload(&ba).unwrap(),
            },
            seqs,
            &slots_d,
            &pos_d,
            &mut conv,
            &mut state,
            &mut out,
        )
        .unwrap();
        let here = format!("{what}, step {step}");
        let want_out = gpu.download(&out_rows).unwrap();
        assert!(
            want_out.iter().all(|v| v.is_finite()),
            "{here}: the batch-order arm left NaN"
        );
        same_bits(
            &format!("{here}: out"),
            &gpu.download(&out).unwrap(),
            &want_out,
        );
        // Expected caches: each sequence's state row and the other half of its conv pair advanced; the rest as
        // before.
        let new_cout = gpu.download(&cout_d).unwrap();
        let new_st = gpu.download(&st_d).unwrap();
        for s in 0..seqs {
            let other = 2 * slots[s] + (pos[s] + 1) % 2;
            conv_h[other * cl..(other + 1) * cl].copy_from_slice(&new_cout[s * cl..(s + 1) * cl]);
            state_h[slots[s] * sl..(slots[s] + 1) * sl]
                .copy_from_slice(&new_st[s * sl..(s + 1) * sl]);
        }
        same_bits(
            &format!("{here}: conv cache"),
            &gpu.download(&conv).unwrap(),
            &conv_h,
        );
        same_bits(
            &format!("{here}: state cache"),
            &gpu.download(&state).unwrap(),
            &state_h,
        );
        for p in &mut pos {
            *p += 1;
        }
    }
    eprintln!("{what}: {steps} steps bit for bit");
}

#[test]
fn slot_caches_match_batch_order_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    // Qwen3.8-27B's group of 3 value heads per key head with K = 4 at the batches where `auto` changes kernel
    // (1, 2, 3, 5, 9), a group of 2 with K = 3, no grouping with K = 2.
    for (i, (d, seqs, n_slots)) in [
        (dims(2, 6, 4), 1, 4),
        (dims(2, 6, 4), 2, 5),
        (dims(2, 6, 4), 3, 7),
        (dims(2, 6, 4), 5, 5),
        (dims(2, 6, 4), 9, 13),
        (dims(1, 2, 3), 3, 6),
        (dims(3, 3, 2), 2, 3),
    ]
    .into_iter()
    .enumerate()
    {
        check_case(&gpu, d, seqs, n_slots, 3, &format!("gdn_slots_{i}"));
    }
}

#[test]
fn a_slot_past_the_cache_gets_nan_and_touches_nothing() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_slots_refused");
    let d = dims(1, 3, 4);
    let w = weights(&gpu, &mut rng, &d);
    let (cd, vw, hv) = (d.conv_dim(), d.value_width(), d.value_heads);
    let n_slots = 2;
    let conv_h = uniform(&mut rng, n_slots * 2 * d.conv_state_len(), 1.0);
    let state_h = uniform(&mut rng, n_slots * d.state_len(), 0.1);
    let mut conv = gpu.upload(&conv_h).unwrap();
    let mut state = gpu.upload(&state_h).unwrap();
    let mut out = gpu.upload(&vec![0.0f32; 2 * vw]).unwrap();
    // Sequence 0 on slot 7 (past the two), sequence 1 on slot 1.
    let slots = gpu.upload(&[7u32, 1]).unwrap();
    let pos = gpu.upload(&[3u32, 4]).unwrap();
    gpu.gdn_decode_step_slots(
        &d,
        &w.weights(),
        &GdnStackedInputs {
            qkvz: &gpu.upload(&uniform(&mut rng, 2 * (cd + vw), 2.0)).unwrap(),
            ba: &gpu.upload(&uniform(&mut rng, 2 * 2 * hv, 2.0)).unwrap(),
        },
        2,
        &slots,
        &pos,
        &mut conv,
        &mut state,
        &mut out,
    )
    .unwrap();
    let o = gpu.download(&out).unwrap();
    assert!(
        o[..vw].iter().all(|v| v.is_nan()),
        "the refused row is not all NaN"
    );
    assert!(
        o[vw..].iter().all(|v| v.is_finite()),
        "the valid row is not finite"
    );
    // Slot 0 untouched; slot 1's state moved (the valid sequence ran).
    let st = gpu.download(&state).unwrap();
    let sl = d.state_len();
    assert_eq!(
        bits(&st[..sl]),
        bits(&state_h[..sl]),
        "slot 0's state moved"
    );
    assert_ne!(
        bits(&st[sl..]),
        bits(&state_h[sl..]),
        "slot 1's state did not move"
    );
    let cv = gpu.download(&conv).unwrap();
    let cl = d.conv_state_len();
    assert_eq!(
        bits(&cv[..2 * cl]),
        bits(&conv_h[..2 * cl]),
        "slot 0's conv moved"
    );
}

#[test]
fn slot_step_refuses_bad_sizes_with_a_reason() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("gdn_slots_sizes");
    let d = dims(1, 2, 4);
    let w = weights(&gpu, &mut rng, &d);
    let (cd, vw, hv) = (d.conv_dim(), d.value_width(), d.value_heads);
    let z = |n: usize| gpu.zeros::<f32>(n).unwrap();
    let zu = |n: usize| gpu.zeros::<u32>(n).unwrap();
    let run = |seqs: usize,
               qkvz: &GpuBuffer<f32>,
               ba: &GpuBuffer<f32>,
               slots: &GpuBuffer<u32>,
               conv: &mut GpuBuffer<f32>,
               state: &mut GpuBuffer<f32>|
     -> String {
        let mut out = z(seqs.max(1) * vw);
        match gpu.gdn_decode_step_slots(
            &d,
            &w.weights(),
            &GdnStackedInputs { qkvz, ba },
            seqs,
            slots,
            &zu(seqs.max(1)),
            conv,
            state,
            &mut out,
        ) {
            Ok(()) => "ok".into(),
            Err(e) => e.to_string(),
        }
    };
    let (qkvz, ba, slots) = (z(2 * (cd + vw)), z(2 * 2 * hv), zu(2));
    let mut conv = z(3 * 2 * d.conv_state_len());
    let mut state = z(3 * d.state_len());
    assert_eq!(run(2, &qkvz, &ba, &slots, &mut conv, &mut state), "ok");
    let e = run(2, &z(2 * cd), &ba, &slots, &mut conv, &mut state);
    assert!(e.contains("qkvz"), "{e}");
    let e = run(2, &qkvz, &z(2 * hv), &slots, &mut conv, &mut state);
    assert!(e.contains("ba"), "{e}");
    let e = run(2, &qkvz, &ba, &zu(1), &mut conv, &mut state);
    assert!(e.contains("slots"), "{e}");
    let e = run(
        2,
        &qkvz,
        &ba,
        &slots,
        &mut z(3 * d.conv_state_len()),
        &mut state,
    );
    assert!(e.contains("conv"), "{e}");
    let e = run(
        2,
        &qkvz,
        &ba,
        &slots,
        &mut conv,
        &mut z(3 * d.state_len() - 1),
    );
    assert!(e.contains("whole number of slots"), "{e}");
    let e = run(0, &qkvz, &ba, &slots, &mut conv, &mut state);
    assert!(e.contains("seqs must be 1..=65535"), "{e}");
}
