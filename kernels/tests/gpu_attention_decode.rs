//! The tiled tensor-core decode kernels (`attention_decode_tiled_*` over a paged cache and
//! `attention_decode_ring_*` over a sliding-window ring, cuda/attention.cu) against the references on the CPU:
//! `kernels::reference::attention::decode_dense` (f64) for both, and the crate's CPU `attention::decode_ring` for
//! the ring. Fresh random bf16 K/V each run (the seed is printed), ragged lengths that are not multiples of the
//! 16/32-token tiles or of the pages, shuffled pages, table slots past the pool, outputs poisoned with NaN before
//! each launch, every built tiling and the public Auto entry point, head dims 64/128/256, group sizes 1-8, splits
//! 1/3/auto/300/1024, and a batch that fills the GPU without splitting. Every case runs both combine kernels
//! (`attention_decode_combine_D*` and `attention_decode_combine_sliced_D*`) against the references and against each
//! other (the same partials weighed in another order: fp32 rounding apart, the same numbers).
//!
//! Error bound 5e-3 relative (Frobenius over the whole output): the kernels round the scaled query and the
//! probabilities to bf16 (2^-9 relative each), which measures ~1e-3 against f64 (benchmarks/h200.md); a wrong
//! mask, a lost rescale or a misplaced fragment gives errors of order 1.
//!
//! Small enough for `compute-sanitizer --tool memcheck|racecheck` in seconds.

//!
//! The tests compare the tilings and combines (`DecodeKernels`, the `_with` / `_tiled` forms), so the file builds
//! with the `lab` feature only.
#![cfg(feature = "lab")]

use kernels::attention::{AttnDims, KvSlice, RingKv};
use kernels::cuda::{DecodeKernels, Gpu, PagedAttentionDims, PagedKvCache, RingKvCache};
use kernels::formats::bf16_to_f32;
use rand_chacha::ChaCha8Rng;

mod gpu_common;
use gpu_common::{
    assert_rel, attn, decode_dense_seq, gpu, kv_bits, paged_decode_case, paged_dims, rel_err, rng,
    run_poisoned, uniform,
};

const TOL: f64 = 5e-3;

/// Sliced against block combine: the same partials weighed in another order in fp32 (~1e-7 relative).
const COMB_TOL: f64 = 1e-5;

/// One paged case on every tiling. `bad_page`: also point the second table entry of sequence 0 past the pool,
/// so that page's tokens must be skipped (the reference leaves them out).
#[allow(clippy::too_many_arguments)]
fn check_paged(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    attn: AttnDims,
    lens: &[usize],
    page_size: usize,
    splits: usize,
    bad_page: bool,
) {
    let (hq, hkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
    let c = paged_decode_case(gpu, rng, attn, lens, page_size, bad_page);
    let (dims, scale, want) = (c.dims, c.scale, &c.want);
    let kv = PagedKvCache {
        k: &c.k,
        v: &c.v,
        block_table: &c.table,
        seq_lens: &c.lens,
    };
    let run = |kernels| {
        run_poisoned(gpu, want.len(), |out| {
            gpu.attention_decode_paged_tiled(kernels, &dims, &c.q, kv, scale, splits, out)
        })
    };
    for tiling in Gpu::DECODE_TILINGS {
        let got = run(DecodeKernels::with_tiling(tiling));
        let what = format!(
            "paged tiled {tiling:?} hq={hq} hkv={hkv} d={d} lens={lens:?} page={page_size} splits={splits} \
             bad_page={bad_page}"
        );
        assert_rel(&what, &got, want, TOL);
        // Each combine kernel explicitly, poisoned each time: the same bf16 split kernel, so the two must agree to
        // fp32 rounding (and the one Auto picks with the call above).
        let by_combine = each_combine(&what, tiling, want, &run);
        let auto = &by_combine[usize::from(Gpu::DECODE_AUTO_SLICED_COMBINE)];
        let e = rel_err(&format!("{what} vs its Auto combine"), &got, auto);
        assert!(e < COMB_TOL, "{what}: {e:e} from the combine Auto picks");
    }
    // The public entry point (KernelPath::Auto: the tiled kernel on DECODE_AUTO_TILING).
    let got = run_poisoned(gpu, want.len(), |out| {
        gpu.attention_decode_paged(&dims, &c.q, kv, scale, splits, out)
    });
    let what = format!(
        "paged Auto hq={hq} hkv={hkv} d={d} lens={lens:?} page={page_size} splits={splits} bad_page={bad_page}"
    );
    assert_rel(&what, &got, want, TOL);
}

#[test]
fn tiled_paged_decode_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("tiled_paged_decode");
    // Qwen3.8-27B full attention: 24 query heads on 4 KV heads of 256; 300 splits leave most partials empty.
    let qwen = attn(24, 4, 256);
    for &splits in &[1usize, 3, 0, 300] {
        check_paged(&gpu, &mut rng, qwen, &[1, 37, 300, 1000], 16, splits, false);
    }
    check_paged(&gpu, &mut rng, qwen, &[203, 64, 65], 64, 0, true);
    // Every group size 1-8 over the three head dims, odd page sizes (a tile spans pages), ragged lengths.
    let mut case = 0;
    for r in 1..=8usize {
        for &d in &[64usize, 128, 256] {
            case += 1;
            let hkv = 1 + case % 3;
            let page = [13usize, 32, 7, 64][case % 4];
            let lens = [1 + (case * 37) % 200, 31 + case, 97 + 5 * case];
            let splits = [0usize, 2, 5][case % 3];
            let dims = attn(r * hkv, hkv, d);
            check_paged(&gpu, &mut rng, dims, &lens, page, splits, case % 2 == 0);
        }
    }
}

/// A batch whose (sequence, KV head) pairs alone fill every resident slot: `splits = 0` must pick one split (no
/// partials, no combine) on every tiling, and the kernels write the output directly for 4 x (SMs + 1) pairs.
#[test]
fn tiled_paged_decode_at_a_batch_that_fills_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("tiled_paged_decode_batch");
    let sms = gpu.sm_count();
    let (hkv, d) = (4usize, 64usize);
    let seqs = sms + 1;
    for tiling in Gpu::DECODE_TILINGS {
        let s = Gpu::decode_auto_splits(tiling, d, sms, seqs * hkv, 200);
        assert_eq!(s, 1, "tiling {tiling:?}: {} pairs on {sms} SMs", seqs * hkv);
    }
    let lens: Vec<usize> = (0..seqs).map(|i| 1 + ((i + 3) * 29) % 97).collect();
    check_paged(&gpu, &mut rng, attn(2 * hkv, hkv, d), &lens, 16, 0, true);
}

/// The combine kernels over ragged batches and split counts that exercise the sliced one's block shapes: 1 warp
/// (2 splits), 2-3 (5, 9), 16 warps with one chunk of loads (64, 65, 300: most of them empty) and with eight
/// (1024 splits, 64 per warp), where the first 188-512 splits hold tokens (a tile each: 6000 or 8192 tokens), so
/// later chunks meet both real and empty partials; sequences of 0 and 1 tokens. (Lengths kept small for
/// racecheck, which took 120 s on this file .)
#[test]
fn combines_agree_over_ragged_batches() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("decode_combines");
    let qwen = attn(24, 4, 256);
    let lens = [0usize, 1, 2, 31, 64, 65, 500, 1999];
    for &splits in &[2usize, 5, 9, 64, 65, 300, 0] {
        check_paged(&gpu, &mut rng, qwen, &lens, 16, splits, false);
    }
    // One sequence of one token over many splits (all but the first empty), and one of length 0 alone.
    check_paged(&gpu, &mut rng, qwen, &[1], 64, 40, false);
    check_paged(&gpu, &mut rng, qwen, &[0], 64, 12, false);
    // 1024 splits at head dims 64 and 128 (64 splits per warp, 8 chunks), group sizes 4 and 3.
    check_paged(&gpu, &mut rng, attn(4, 1, 64), &[8192, 5], 64, 1024, true);
    check_paged(&gpu, &mut rng, attn(6, 2, 128), &[6000], 256, 1024, false);
}

/// The split heuristic on the H200's 132 SMs at Qwen's shape (24q/4kv x 256): one wave, never more.
#[test]
fn auto_splits_fill_exactly_one_wave() {
    // (16, 4) at head_dim 256: 68 KiB of shared memory, 3 blocks fit per SM, 2 are used: 264 slots; (32, 2), the
    // ring's: 72 KiB, the same slots, one split per 64 tokens at most instead of 32.
    assert_eq!(Gpu::DECODE_AUTO_TILING, (16, 4));
    assert_eq!(Gpu::DECODE_RING_TILING, (32, 2));
    let cases = [
        // (pairs, max tokens, splits (16, 4), splits (32, 2)): B=1 at 32k, B=8 at 8k, B=32 at 4k, a batch past
        // the slots, a short context.
        (4, 32768, 66, 66),
        (32, 8192, 8, 8),
        (128, 4096, 2, 2),
        (400, 4096, 1, 1),
        (4, 100, 4, 2),
    ];
    for (pairs, max_tokens, paged, ring) in cases {
        let got = Gpu::decode_auto_splits(Gpu::DECODE_AUTO_TILING, 256, 132, pairs, max_tokens);
        assert_eq!(got, paged, "paged: pairs {pairs}, max tokens {max_tokens}");
        let got = Gpu::decode_auto_splits(Gpu::DECODE_RING_TILING, 256, 132, pairs, max_tokens);
        assert_eq!(got, ring, "ring: pairs {pairs}, max tokens {max_tokens}");
    }
    // Nonsense arguments give a count, never a panic.
    for (tiling, d, sms, pairs, max_tokens) in [
        ((0, 0), 0, 0, 0, 0),
        (
            (usize::MAX, usize::MAX),
            usize::MAX,
            usize::MAX,
            usize::MAX,
            usize::MAX,
        ),
        ((32, 2), 256, 132, 0, 1),
    ] {
        let s = Gpu::decode_auto_splits(tiling, d, sms, pairs, max_tokens);
        assert!(
            (1..=1024).contains(&s),
            "{tiling:?} {d} {sms} {pairs} {max_tokens}: {s}"
        );
    }
    for tiling in Gpu::DECODE_TILINGS {
        for d in [64, 128, 256] {
            // The same shared memory as the launches use (kernels/src/cuda/attention.rs tiled_smem).
            let smem = 4 * tiling.1 * tiling.0 * d + 256 * tiling.0 + 16 * tiling.1;
            let per_sm = (228 * 1024 / (smem + 1024)).clamp(1, 2);
            assert_eq!(
                Gpu::decode_auto_splits(tiling, d, 100, 1, 1 << 20),
                per_sm * 100,
                "{tiling:?} d={d}: one pair fills every slot"
            );
            for pairs in 1..=1200 {
                let s = Gpu::decode_auto_splits(tiling, d, 132, pairs, 1 << 20);
                assert!(
                    (1..=1024).contains(&s),
                    "{tiling:?} d={d} pairs={pairs}: {s}"
                );
                // One wave: 2 blocks per SM at most, so 264 slots; a single split past them.
                assert!(
                    s == 1 || s * pairs <= 2 * 132,
                    "{tiling:?} d={d} pairs={pairs}: {s} splits overshoot one wave"
                );
            }
        }
    }
}

/// The inputs of one ring case and its two oracles.
struct RingCase {
    kr: Vec<u16>,
    vr: Vec<u16>,
    kcur: Vec<u16>,
    vcur: Vec<u16>,
    q: Vec<f32>,
    /// `decode_dense` in f64 over the valid slots and the current token.
    want: Vec<f32>,
    /// The CPU `attention::decode_ring` on the same bf16 ring.
    cpu: Vec<f32>,
}

/// Random ring inputs (`window - 1` slots per (sequence, KV head)) and both oracles, checking them against each
/// other (< 1e-4: both see the same bf16 values in f32/f64).
fn ring_case(rng: &mut ChaCha8Rng, attn: AttnDims, window: usize, pos: &[u32]) -> RingCase {
    let (hq, hkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
    let (seqs, slots) = (pos.len(), window - 1);
    let kr = kv_bits(rng, seqs * hkv * slots * d);
    let vr = kv_bits(rng, seqs * hkv * slots * d);
    let kcur = kv_bits(rng, seqs * hkv * d);
    let vcur = kv_bits(rng, seqs * hkv * d);
    let q = uniform(rng, seqs * hq * d, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    // Dense reference: the valid slots in slot order, then the current token.
    let mut want = vec![0.0f32; seqs * hq * d];
    for (s, &p) in pos.iter().enumerate() {
        let valid = (p as usize).min(slots);
        let n = valid + 1;
        let (mut kd, mut vd) = (vec![0.0f32; n * hkv * d], vec![0.0f32; n * hkv * d]);
        for t in 0..n {
            for g in 0..hkv {
                let (ksrc, vsrc) = if t < valid {
                    let o = ((s * hkv + g) * slots + t) * d;
                    (&kr[o..o + d], &vr[o..o + d])
                } else {
                    let o = (s * hkv + g) * d;
                    (&kcur[o..o + d], &vcur[o..o + d])
                };
                for e in 0..d {
                    kd[(t * hkv + g) * d + e] = bf16_to_f32(ksrc[e]);
                    vd[(t * hkv + g) * d + e] = bf16_to_f32(vsrc[e]);
                }
            }
        }
        decode_dense_seq(&attn, scale, s, n, &q, &kd, &vd, &mut want);
    }
    // The CPU ring decode on the same bf16 ring (the kernel the GPU one replaces).
    let hb =
        |v: &[u16]| -> Vec<half::bf16> { v.iter().map(|&b| half::bf16::from_bits(b)).collect() };
    let (krh, vrh, kch, vch) = (hb(&kr), hb(&vr), hb(&kcur), hb(&vcur));
    let ring = RingKv {
        k_ring: KvSlice::Bf16(&krh),
        v_ring: KvSlice::Bf16(&vrh),
        window,
        k_cur: KvSlice::Bf16(&kch),
        v_cur: KvSlice::Bf16(&vch),
        pos,
    };
    let mut cpu = vec![f32::NAN; seqs * hq * d];
    kernels::attention::decode_ring(&attn, scale, seqs, &q, &ring, &mut cpu).unwrap();
    let what = format!("cpu decode_ring hq={hq} hkv={hkv} d={d} window={window} pos={pos:?}");
    let e = rel_err(&what, &cpu, &want);
    assert!(
        e < 1e-4,
        "{what}: relative error {e:e} against the f64 reference"
    );
    RingCase {
        kr,
        vr,
        kcur,
        vcur,
        q,
        want,
        cpu,
    }
}

/// One ring case on every tiling, against the CPU ring decode and the dense reference.
fn check_ring(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    attn: AttnDims,
    window: usize,
    pos: &[u32],
    splits: usize,
) {
    let (hq, hkv, d) = (attn.q_heads, attn.kv_heads, attn.head_dim);
    let seqs = pos.len();
    let scale = 1.0 / (d as f32).sqrt();
    let c = ring_case(rng, attn, window, pos);
    let up = |v: &[u16]| gpu.upload(v).unwrap();
    let (dq, dkr, dvr, dkc, dvc) = (
        gpu.upload(&c.q).unwrap(),
        up(&c.kr),
        up(&c.vr),
        up(&c.kcur),
        up(&c.vcur),
    );
    let dp = gpu.upload(pos).unwrap();
    let kv = RingKvCache {
        window,
        k_ring: &dkr,
        v_ring: &dvr,
        k_cur: &dkc,
        v_cur: &dvc,
        pos: &dp,
    };
    let run = |kernels| {
        run_poisoned(gpu, c.want.len(), |out| {
            gpu.attention_decode_ring_with(kernels, &attn, seqs, &dq, kv, scale, splits, out)
        })
    };
    for tiling in Gpu::DECODE_TILINGS {
        let got = run(DecodeKernels::with_tiling(tiling));
        let what = format!(
            "ring {tiling:?} hq={hq} hkv={hkv} d={d} window={window} pos={pos:?} splits={splits}"
        );
        for (oracle, want) in [
            ("the f64 reference", &c.want),
            ("the CPU decode_ring", &c.cpu),
        ] {
            let e = rel_err(&format!("{what} vs {oracle}"), &got, want);
            assert!(
                e < TOL,
                "{what}: relative error {e:e} >= {TOL:e} against {oracle}"
            );
        }
        // Each combine kernel explicitly, as in check_paged.
        each_combine(&what, tiling, &c.want, &run);
    }
}

/// Runs `run` with `tiling` and each combine kernel (NaN-poisoned output each time), checks each result against
/// `want` within TOL and the sliced one against the block one within COMB_TOL (the same bf16 split kernel, so the
/// two must agree to fp32 rounding); returns `[block, sliced]`.
fn each_combine(
    what: &str,
    tiling: (usize, usize),
    want: &[f32],
    mut run: impl FnMut(DecodeKernels) -> Vec<f32>,
) -> [Vec<f32>; 2] {
    let by_combine = [false, true].map(|sliced| {
        let got = run(DecodeKernels {
            tiling,
            sliced_combine: sliced,
        });
        let whatc = format!("{what} sliced={sliced}");
        let e = rel_err(&whatc, &got, want);
        assert!(e < TOL, "{whatc}: relative error {e:e} >= {TOL:e}");
        got
    });
    let e = rel_err(
        &format!("{what} sliced vs block"),
        &by_combine[1],
        &by_combine[0],
    );
    assert!(
        e < COMB_TOL,
        "{what}: sliced combine {e:e} from the block combine (>= {COMB_TOL:e})"
    );
    by_combine
}

#[test]
fn ring_decode_matches_the_cpu_ring_and_the_reference() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("ring_decode");
    // Gemma-3-like sliding layer at a small window: 8 query heads on 4 KV heads of 256 (r = 2); positions before
    // the ring fills (0: only the current token; 5; exactly the slot count), after it wrapped (once, many times).
    let gemma = attn(8, 4, 256);
    for &splits in &[1usize, 0, 3, 300] {
        check_ring(&gpu, &mut rng, gemma, 100, &[0, 5, 99, 250, 10_000], splits);
    }
    // Every group size on the three head dims; windows whose slot counts are not multiples of a tile.
    let mut case = 0;
    for r in 1..=8usize {
        for &d in &[64usize, 128, 256] {
            case += 1;
            let hkv = 1 + case % 2;
            let window = [2usize, 17, 65, 130][case % 4];
            let pos = [(case * 13) as u32 % 150, 1, 4 * window as u32 + 3];
            let splits = [0usize, 1, 4][case % 3];
            check_ring(&gpu, &mut rng, attn(r * hkv, hkv, d), window, &pos, splits);
        }
    }
}

/// Without a GPU too: the ring layout the GPU test builds its dense reference from (valid slots, then the current
/// token) is the one the CPU `decode_ring` reads, at the shapes the GPU test uses.
#[test]
fn the_ring_reference_agrees_with_the_cpu_ring() {
    let mut rng = rng("ring_reference");
    for (r, d, window, pos) in [
        (2usize, 256usize, 100usize, [0u32, 99, 10_000]),
        (7, 64, 2, [0, 1, 9]),
        (3, 128, 17, [16, 17, 40]),
    ] {
        ring_case(&mut rng, attn(2 * r, 2, d), window, &pos);
    }
}

#[test]
fn tiled_decode_refuses_what_is_not_built() {
    let Some(gpu) = gpu() else { return };
    let dims = paged_dims(&attn(8, 1, 64), 1, 4, 2, 2);
    let q = gpu.upload(&vec![0.0f32; 8 * 64]).unwrap();
    let kv = gpu.upload(&vec![0u16; 2 * 4 * 64]).unwrap();
    let bt = gpu.upload(&[0u32, 1]).unwrap();
    let lens = gpu.upload(&[5u32]).unwrap();
    let mut out = gpu.upload(&vec![0.0f32; 8 * 64]).unwrap();
    let t = Gpu::DECODE_TILINGS[0];
    let err = |r: Result<(), kernels::KernelError>| r.unwrap_err().to_string();
    // A tiling that is not built.
    let cache = PagedKvCache {
        k: &kv,
        v: &kv,
        block_table: &bt,
        seq_lens: &lens,
    };
    let e = err(gpu.attention_decode_paged_tiled(
        DecodeKernels::with_tiling((64, 2)),
        &dims,
        &q,
        cache,
        1.0,
        0,
        &mut out,
    ));
    assert!(e.contains("tiling"), "{e}");
    // Group size 9, head dim 96, too many splits, a non-finite scale, a short cache.
    let bad = [
        (
            PagedAttentionDims { q_heads: 9, ..dims },
            1.0,
            0,
            "1 to 8 times",
        ),
        (
            PagedAttentionDims {
                head_dim: 96,
                ..dims
            },
            1.0,
            0,
            "head_dim",
        ),
        (dims, 1.0, 1025, "splits"),
        (dims, f32::NAN, 0, "scale"),
        (
            PagedAttentionDims {
                num_pages: 3,
                ..dims
            },
            1.0,
            0,
            "k_cache",
        ),
    ];
    for (d, scale, splits, needle) in bad {
        let e = err(gpu.attention_decode_paged_tiled(
            DecodeKernels::with_tiling(t),
            &d,
            &q,
            cache,
            scale,
            splits,
            &mut out,
        ));
        assert!(e.contains(needle), "{d:?}: expected '{needle}' in: {e}");
    }
    // Ring: window 0, and a ring of the wrong size.
    let attn = attn(8, 1, 64);
    let cur = gpu.upload(&[0u16; 64]).unwrap();
    let pos = gpu.upload(&[3u32]).unwrap();
    let ring = |window| RingKvCache {
        window,
        k_ring: &kv,
        v_ring: &kv,
        k_cur: &cur,
        v_cur: &cur,
        pos: &pos,
    };
    let e = err(gpu.attention_decode_ring(&attn, 1, &q, ring(0), 1.0, 0, &mut out));
    assert!(e.contains("at least 1 token"), "{e}");
    let e = err(gpu.attention_decode_ring(&attn, 1, &q, ring(5), 1.0, 0, &mut out));
    assert!(e.contains("k_ring"), "{e}");
}
