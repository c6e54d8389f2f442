//! The CUDA causal prefill attention (`Gpu::attention_prefill*`, cuda/attention_prefill.cu) against the CPU
//! prefill of the crate (`kernels::attention::prefill`, f32, itself checked against the f64 reference in
//! tests/cpu_attention.rs) on the same bf16-exact inputs: ragged lengths (1, 17, 63, 64, 65, 200, 333: below,
//! at and across every tile size), every head dim (64, 128, 256) on every built tiling, group sizes 1..8,
//! with no window and windows smaller and larger than the prompt, one sequence and a varlen batch; outputs
//! poisoned with NaN before each launch. Each failure names the shape, the tiling, the window and the element.
//!
//! Chunked prefill (`attention_prefill_paged*`, `attention_prefill_ring*`) and the K/V stores
//! (`attention_kv_store_*`): ragged prefixes (0, 5, 37, 130, 200: not page or tile multiples) before ragged chunks,
//! shuffled pages of 5, 7, 16 tokens, windows that cut into the prefix, rings of 1 to 299 slots, every tiling; the
//! oracle is the CPU prefill over the whole history (prefix + chunk), and the caches are compared bit for bit with
//! the CPU's `paged_store` / `ring_store`. Unwritten cache rows hold NaN, so a read of one fails the test.
//!
//! Error bound: the kernel rounds the probabilities to bf16 for `P V` (2^-9 relative each) and the output to
//! bf16 (2^-9 relative); scores and the softmax are fp32. With inputs in [-1, 1] (q in [-2, 2]) every output is in
//! [-1, 1]; measured errors are ~3e-3 relative. Bounds: 1e-2 relative over the whole output and 1.5e-2 absolute
//! per element.
//!
//! Prints "skipped: no CUDA device" and returns where there is none. Small enough for compute-sanitizer.

//!
//! The tests compare every built tiling (`_with` calls, `attention_prefill_variants`), so the file builds with the
//! `lab` feature only.
#![cfg(feature = "lab")]

use kernels::attention::{self, AttnDims};
use kernels::cuda::{Gpu, GpuBuffer, PrefillChunk};
use kernels::formats::{bf16_to_f32, f32_to_bf16};
use rand_chacha::ChaCha8Rng;

mod gpu_common;
use gpu_common::{attn, gpu, paged_dims, rel_err, rng, uniform};

const NAN_BF16: u16 = 0x7fc0;
const REL_BOUND: f64 = 1e-2;
const ABS_BOUND: f32 = 1.5e-2;

/// Random values rounded to bf16: the bits for the GPU and their exact f32 values for the CPU.
fn bf16_vals(rng: &mut ChaCha8Rng, n: usize, amp: f32) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = uniform(rng, n, amp).into_iter().map(f32_to_bf16).collect();
    let vals = bits.iter().map(|&b| bf16_to_f32(b)).collect();
    (bits, vals)
}

struct Inputs {
    q: (Vec<u16>, Vec<f32>),
    k: (Vec<u16>, Vec<f32>),
    v: (Vec<u16>, Vec<f32>),
}

fn inputs(rng: &mut ChaCha8Rng, dims: &AttnDims, t: usize) -> Inputs {
    Inputs {
        q: bf16_vals(rng, t * dims.q_heads * dims.head_dim, 2.0),
        k: bf16_vals(rng, t * dims.kv_heads * dims.head_dim, 1.0),
        v: bf16_vals(rng, t * dims.kv_heads * dims.head_dim, 1.0),
    }
}

/// The CPU oracle for one sequence.
fn cpu_prefill(
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    t: usize,
    x: &Inputs,
) -> Vec<f32> {
    let mut want = vec![0.0f32; t * dims.q_heads * dims.head_dim];
    attention::prefill(dims, scale, window, t, &x.q.1, &x.k.1, &x.v.1, &mut want).unwrap();
    want
}

/// Compares `got` (bf16 bits, `[t, q_heads, head_dim]`) with `want`; panics naming the first bad element.
fn compare(what: &str, dims: &AttnDims, got: &[u16], want: &[f32]) -> f64 {
    let got: Vec<f32> = got.iter().map(|&b| bf16_to_f32(b)).collect();
    let (hq, d) = (dims.q_heads, dims.head_dim);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (tok, h, e) = (i / (hq * d), i / d % hq, i % d);
        assert!(
            g.is_finite() && (g - w).abs() <= ABS_BOUND,
            "{what}: out[token {tok}][head {h}][{e}] = {g}, expected {w} (NaN: never written)"
        );
    }
    let err = rel_err(what, &got, want);
    assert!(
        err < REL_BOUND,
        "{what}: relative error {err:.2e} >= {REL_BOUND:.0e}"
    );
    err
}

#[allow(clippy::too_many_arguments)]
fn run_single(
    gpu: &Gpu,
    variant: Option<&str>,
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    t: usize,
    x: &Inputs,
) -> Vec<u16> {
    let q = gpu.upload(&x.q.0).unwrap();
    let k = gpu.upload(&x.k.0).unwrap();
    let v = gpu.upload(&x.v.0).unwrap();
    let mut out = gpu.upload(&vec![NAN_BF16; x.q.0.len()]).unwrap();
    match variant {
        // The single-sequence entry point (no cu_seqlens: a null pointer in the kernel).
        None => gpu
            .attention_prefill(dims, scale, window, t, &q, &k, &v, &mut out)
            .unwrap(),
        Some(_) => {
            let cu = gpu.upload(&[0u32, t as u32]).unwrap();
            gpu.attention_prefill_varlen_with(
                variant, dims, scale, window, &cu, 1, t, t, &q, &k, &v, &mut out,
            )
            .unwrap()
        }
    }
    gpu.download(&out).unwrap()
}

/// Windows for a prompt of `t` tokens, cycling with `i`: none, 1 token, smaller than t, exactly t, larger.
fn window_for(i: usize, t: usize) -> Option<usize> {
    match i % 5 {
        0 => None,
        1 => Some(1),
        2 => Some((t / 3).max(1)),
        3 => Some(t.max(1)),
        _ => Some(t + 37),
    }
}

#[test]
fn prefill_matches_the_cpu_on_ragged_lengths_every_head_dim_and_tiling() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("prefill_matches_the_cpu_on_ragged_lengths_every_head_dim_and_tiling");
    let mut case = 0usize;
    let mut worst = 0.0f64;
    for d in [64usize, 128, 256] {
        let variants = tilings(d);
        for t in [1usize, 17, 63, 64, 65, 200, 333] {
            // Group sizes 1..8 in turn, over 1 or 2 KV heads.
            let group = 1 + case % 8;
            let kv_heads = 1 + case % 2;
            let dims = attn(group * kv_heads, kv_heads, d);
            let scale = 1.0 / (d as f32).sqrt();
            let x = inputs(&mut rng, &dims, t);
            // Two windows per shape (no window every other case), each on every tiling.
            for w in [window_for(case, t), window_for(case + 2, t)] {
                let want = cpu_prefill(&dims, scale, w, t, &x);
                for &variant in &variants {
                    let what = format!(
                        "t={t} d={d} q_heads={} kv_heads={kv_heads} window={w:?} tiling={}",
                        dims.q_heads,
                        variant.unwrap_or("default (single-sequence entry)")
                    );
                    let got = run_single(&gpu, variant, &dims, scale, w, t, &x);
                    worst = worst.max(compare(&what, &dims, &got, &want));
                }
            }
            case += 1;
        }
    }
    println!("worst relative error {worst:.2e} (bound {REL_BOUND:.0e})");
}

#[test]
fn prefill_covers_group_sizes_one_to_eight() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("prefill_covers_group_sizes_one_to_eight");
    for group in 1..=8usize {
        for (d, t, w) in [
            (128usize, 65usize, None),
            (256, 33, Some(20)),
            (64, 90, Some(7)),
        ] {
            let dims = attn(group * 2, 2, d);
            let scale = 0.7 / (d as f32).sqrt();
            let x = inputs(&mut rng, &dims, t);
            let want = cpu_prefill(&dims, scale, w, t, &x);
            let got = run_single(&gpu, None, &dims, scale, w, t, &x);
            compare(
                &format!("group {group} t={t} d={d} window={w:?}"),
                &dims,
                &got,
                &want,
            );
        }
    }
}

#[test]
fn varlen_batch_matches_each_sequence_alone() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("varlen_batch_matches_each_sequence_alone");
    // An empty sequence in the middle, lengths across the tile sizes.
    let lens = [17usize, 200, 0, 1, 64, 65, 130];
    let total: usize = lens.iter().sum();
    let max_len = *lens.iter().max().unwrap();
    let mut cu = vec![0u32];
    for l in lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    for (d, group, kv_heads, w) in [
        (128usize, 4usize, 2usize, None),
        (256, 6, 1, Some(48)),
        (64, 3, 2, Some(1)),
    ] {
        let dims = attn(group * kv_heads, kv_heads, d);
        let scale = 1.0 / (d as f32).sqrt();
        let x = inputs(&mut rng, &dims, total);
        let (hq, hkv) = (dims.q_heads, dims.kv_heads);
        let q = gpu.upload(&x.q.0).unwrap();
        let k = gpu.upload(&x.k.0).unwrap();
        let v = gpu.upload(&x.v.0).unwrap();
        let cu_dev = gpu.upload(&cu).unwrap();
        for variant in Gpu::attention_prefill_variants(d) {
            let mut out = gpu.upload(&vec![NAN_BF16; total * hq * d]).unwrap();
            gpu.attention_prefill_varlen_with(
                Some(variant),
                &dims,
                scale,
                w,
                &cu_dev,
                lens.len(),
                total,
                max_len,
                &q,
                &k,
                &v,
                &mut out,
            )
            .unwrap();
            let got = gpu.download(&out).unwrap();
            for (b, &l) in lens.iter().enumerate() {
                if l == 0 {
                    continue;
                }
                let s = cu[b] as usize;
                let sl = |v: &[f32], h: usize| v[s * h * d..(s + l) * h * d].to_vec();
                let one = Inputs {
                    q: (Vec::new(), sl(&x.q.1, hq)),
                    k: (Vec::new(), sl(&x.k.1, hkv)),
                    v: (Vec::new(), sl(&x.v.1, hkv)),
                };
                let want = cpu_prefill(&dims, scale, w, l, &one);
                compare(
                    &format!("varlen sequence {b} (tokens {s}..{}) d={d} q_heads={hq} kv_heads={hkv} window={w:?} tiling={variant}", s + l),
                    &dims,
                    &got[s * hq * d..(s + l) * hq * d],
                    &want,
                );
            }
        }
    }
}

#[test]
fn bad_sizes_are_errors() {
    let Some(gpu) = gpu() else { return };
    let dims = attn(8, 2, 128);
    let t = 10;
    let buf = |n: usize| -> GpuBuffer<u16> { gpu.zeros(n).unwrap() };
    let (q, k, v) = (buf(t * 8 * 128), buf(t * 2 * 128), buf(t * 2 * 128));
    let mut out = buf(t * 8 * 128);
    let msg = |r: Result<(), kernels::KernelError>| r.expect_err("accepted").to_string();
    let mut short = buf(t * 8 * 128 - 1);
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &q, &k, &v, &mut short)).contains("out")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &out_like(&gpu, 5), &k, &v, &mut out))
            .contains("q has")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &q, &q, &v, &mut out)).contains("k has")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, None, t, &q, &k, &q, &mut out)).contains("v has")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, 0.1, Some(0), t, &q, &k, &v, &mut out))
            .contains("at least 1")
    );
    assert!(
        msg(gpu.attention_prefill(&dims, f32::INFINITY, None, t, &q, &k, &v, &mut out))
            .contains("finite")
    );
    let d96 = AttnDims {
        head_dim: 96,
        ..dims
    };
    assert!(
        msg(gpu.attention_prefill(&d96, 0.1, None, t, &q, &k, &v, &mut out))
            .contains("64, 128 or 256")
    );
    let d3 = AttnDims {
        kv_heads: 3,
        ..dims
    };
    assert!(
        msg(gpu.attention_prefill(&d3, 0.1, None, t, &q, &k, &v, &mut out)).contains("multiple")
    );
    let cu = gpu.upload(&[0u32, 4, 10]).unwrap();
    assert!(
        msg(gpu.attention_prefill_varlen(&dims, 0.1, None, &cu, 3, t, 6, &q, &k, &v, &mut out))
            .contains("cu_seqlens")
    );
    assert!(msg(
        gpu.attention_prefill_varlen(&dims, 0.1, None, &cu, 2, t, 11, &q, &k, &v, &mut out)
    )
    .contains("max_seqlen"));
    assert!(msg(gpu.attention_prefill_varlen_with(
        Some("M7_W7_N7_S7"),
        &dims,
        0.1,
        None,
        &cu,
        2,
        t,
        6,
        &q,
        &k,
        &v,
        &mut out
    ))
    .contains("no prefill tiling"));
    // The same call with the right sizes is accepted and writes every element.
    gpu.write(&mut out, &vec![NAN_BF16; t * 8 * 128]).unwrap();
    gpu.attention_prefill_varlen(&dims, 0.1, None, &cu, 2, t, 6, &q, &k, &v, &mut out)
        .unwrap();
    assert!(
        gpu.download(&out).unwrap().iter().all(|&b| b == 0),
        "zero inputs give zero outputs"
    );
}

fn out_like(gpu: &Gpu, n: usize) -> GpuBuffer<u16> {
    gpu.zeros(n).unwrap()
}

// ---------------------------------------------------------------------------------------------------------------
// Chunked prefill over a KV cache (`attention_prefill_paged*`, `attention_prefill_ring*`) and the K/V stores.
// Oracle: the CPU prefill over the whole history (prefix + new tokens, the prefix's query rows random and
// discarded), rows of the new tokens; the caches are built and checked with the CPU's `paged_store` and
// `ring_store`. Every unwritten cache row (pages past a prefix, spare pages, ring slots not yet filled) holds NaN,
// so a read of one shows up as a NaN output; block-table columns past a sequence's pages hold u32::MAX.

use half::bf16;
use kernels::attention::KvSliceMut;

/// One sequence's history: `prefix` cached tokens then `new` tokens; q rows for all of them (the prefix's are
/// only there for the CPU oracle, which computes every row).
struct History {
    prefix: usize,
    new: usize,
    x: Inputs,
}

fn history(rng: &mut ChaCha8Rng, dims: &AttnDims, prefix: usize, new: usize) -> History {
    History {
        prefix,
        new,
        x: inputs(rng, dims, prefix + new),
    }
}

/// The CPU rows of the new tokens: prefill over the whole history, rows `prefix..prefix + new`.
fn cpu_new_rows(dims: &AttnDims, scale: f32, window: Option<usize>, h: &History) -> Vec<f32> {
    let all = cpu_prefill(dims, scale, window, h.prefix + h.new, &h.x);
    let row = dims.q_heads * dims.head_dim;
    all[h.prefix * row..].to_vec()
}

/// The new tokens of every sequence packed one after another (`[total, heads, d]` bf16 bits) and cu_seqlens.
fn pack_new(dims: &AttnDims, hs: &[History]) -> (Vec<u16>, Vec<u16>, Vec<u16>, Vec<u32>) {
    let (rq, rkv) = (dims.q_heads * dims.head_dim, dims.kv_heads * dims.head_dim);
    let (mut q, mut k, mut v, mut cu) = (Vec::new(), Vec::new(), Vec::new(), vec![0u32]);
    for h in hs {
        q.extend_from_slice(&h.x.q.0[h.prefix * rq..]);
        k.extend_from_slice(&h.x.k.0[h.prefix * rkv..]);
        v.extend_from_slice(&h.x.v.0[h.prefix * rkv..]);
        cu.push(cu.last().unwrap() + h.new as u32);
    }
    (q, k, v, cu)
}

/// A paged pool for `hs`: each sequence gets `ceil((prefix + new) / page_size)` pages, ids shuffled over a pool
/// with 3 spare pages; the block table's unused columns hold u32::MAX. Returns (block table, max pages, pages).
fn paged_layout(
    rng: &mut ChaCha8Rng,
    hs: &[History],
    page_size: usize,
) -> (Vec<u32>, usize, usize) {
    use rand::seq::SliceRandom;
    let need: Vec<usize> = hs
        .iter()
        .map(|h| (h.prefix + h.new).div_ceil(page_size))
        .collect();
    let max_pages = need.iter().max().unwrap() + 1;
    let num_pages = need.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..num_pages as u32).collect();
    ids.shuffle(rng);
    let mut table = vec![u32::MAX; hs.len() * max_pages];
    let mut next = 0;
    for (b, &n) in need.iter().enumerate() {
        table[b * max_pages..b * max_pages + n].copy_from_slice(&ids[next..next + n]);
        next += n;
    }
    (table, max_pages, num_pages)
}

fn to_bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Stores positions `from..to` of history `h` (sequence `b`) with the CPU's `paged_store` / `ring_store`.
#[allow(clippy::too_many_arguments)]
fn cpu_store(
    dims: &AttnDims,
    h: &History,
    b: usize,
    from: usize,
    to: usize,
    paged: Option<(&[u32], usize)>,
    window: usize,
    kc: &mut [bf16],
    vc: &mut [bf16],
) {
    let rkv = dims.kv_heads * dims.head_dim;
    for p in from..to {
        for (cache, vals) in [(&mut *kc, &h.x.k.1), (&mut *vc, &h.x.v.1)] {
            let row = &vals[p * rkv..(p + 1) * rkv];
            match paged {
                Some((table, page_size)) => {
                    attention::paged_store(dims, KvSliceMut::Bf16(cache), page_size, table, p, row)
                        .unwrap()
                }
                None => {
                    attention::ring_store(dims, KvSliceMut::Bf16(cache), window, b, p, row).unwrap()
                }
            }
        }
    }
}

/// The default entry point (`None`) and every built tiling for `head_dim`.
fn tilings(head_dim: usize) -> Vec<Option<&'static str>> {
    let mut v = vec![None];
    v.extend(
        Gpu::attention_prefill_variants(head_dim)
            .into_iter()
            .map(Some),
    );
    v
}

/// Histories of `prefixes[i]` cached and `news[i]` new tokens.
fn histories(
    rng: &mut ChaCha8Rng,
    dims: &AttnDims,
    prefixes: &[usize],
    news: &[usize],
) -> Vec<History> {
    let pairs = prefixes.iter().zip(news);
    pairs.map(|(&p, &n)| history(rng, dims, p, n)).collect()
}

/// The new tokens of `hs` packed on the device, with their prefix lengths and cu_seqlens.
struct DevChunk {
    q: GpuBuffer<u16>,
    k: GpuBuffer<u16>,
    v: GpuBuffer<u16>,
    cu: GpuBuffer<u32>,
    prefix: GpuBuffer<u32>,
    total: usize,
    max_len: usize,
}

impl DevChunk {
    fn new(gpu: &Gpu, dims: &AttnDims, hs: &[History]) -> DevChunk {
        let (q, k, v, cu) = pack_new(dims, hs);
        let pre: Vec<u32> = hs.iter().map(|h| h.prefix as u32).collect();
        let up = |x: &[u16]| gpu.upload(x).unwrap();
        DevChunk {
            q: up(&q),
            k: up(&k),
            v: up(&v),
            cu: gpu.upload(&cu).unwrap(),
            prefix: gpu.upload(&pre).unwrap(),
            total: hs.iter().map(|h| h.new).sum(),
            max_len: hs.iter().map(|h| h.new).max().unwrap(),
        }
    }

    fn chunk(&self) -> PrefillChunk<'_> {
        PrefillChunk {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            cu_seqlens: &self.cu,
            prefix_lens: &self.prefix,
            total: self.total,
            max_seqlen: self.max_len,
        }
    }

    /// A NaN-poisoned output for the chunk.
    fn out(&self, gpu: &Gpu, dims: &AttnDims) -> GpuBuffer<u16> {
        gpu.upload(&vec![NAN_BF16; self.total * dims.q_heads * dims.head_dim])
            .unwrap()
    }
}

/// Compares the packed output of a batch with each sequence's CPU rows.
fn compare_batch(
    what: &str,
    dims: &AttnDims,
    scale: f32,
    window: Option<usize>,
    hs: &[History],
    got: &[u16],
) {
    let row = dims.q_heads * dims.head_dim;
    let mut at = 0;
    for (b, h) in hs.iter().enumerate() {
        let want = cpu_new_rows(dims, scale, window, h);
        compare(
            &format!("{what} sequence {b} (prefix {}, new {})", h.prefix, h.new),
            dims,
            &got[at * row..(at + h.new) * row],
            &want,
        );
        at += h.new;
    }
}

#[test]
fn paged_prefill_continues_a_paged_prefix_on_every_tiling() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("paged_prefill_continues_a_paged_prefix_on_every_tiling");
    // Ragged prefixes (not page or tile multiples, one empty) and chunks; page sizes 7, 16, 5 (a 32/64-key tile
    // spans up to 14 pages, each key's page looked up once per tile and shuffled to the copying threads), 64
    // (a tile within one page, or across two) and 1 (the engine's `FlashChunk` reads its slot's prefix as one
    // token per page: `[P, kv_heads, head_dim]`, the f32 slot cache's row layout).
    let prefixes = [0usize, 37, 130, 5];
    let news = [17usize, 65, 1, 40];
    for (d, group, kv_heads, page_size) in [
        (64usize, 3usize, 2usize, 7usize),
        (128, 4, 1, 16),
        (256, 6, 1, 5),
        (128, 2, 2, 64),
        (256, 6, 2, 1),
    ] {
        let dims = attn(group * kv_heads, kv_heads, d);
        let scale = 1.0 / (d as f32).sqrt();
        let hs = histories(&mut rng, &dims, &prefixes, &news);
        let (table, max_pages, num_pages) = paged_layout(&mut rng, &hs, page_size);
        let cache_len = num_pages * kv_heads * page_size * d;
        let (mut kc, mut vc) = (vec![bf16::NAN; cache_len], vec![bf16::NAN; cache_len]);
        for (b, h) in hs.iter().enumerate() {
            let t = &table[b * max_pages..(b + 1) * max_pages];
            cpu_store(
                &dims,
                h,
                b,
                0,
                h.prefix,
                Some((t, page_size)),
                0,
                &mut kc,
                &mut vc,
            );
        }
        let dc = DevChunk::new(&gpu, &dims, &hs);
        let pd = paged_dims(&dims, hs.len(), page_size, num_pages, max_pages);
        let up = |x: &[u16]| gpu.upload(x).unwrap();
        let (kcd, vcd) = (up(&to_bits(&kc)), up(&to_bits(&vc)));
        let table_d = gpu.upload(&table).unwrap();
        let variants = tilings(d);
        // No window; one that cuts into the longer prefixes; one token; longer than any history.
        for w in [None, Some(20), Some(1), Some(1000)] {
            for &variant in &variants {
                let mut out = dc.out(&gpu, &dims);
                gpu.attention_prefill_paged_with(
                    variant,
                    &pd,
                    scale,
                    w,
                    &kcd,
                    &vcd,
                    &table_d,
                    dc.chunk(),
                    &mut out,
                )
                .unwrap();
                let what = format!(
                    "paged prefill d={d} q_heads={} kv_heads={kv_heads} page_size={page_size} window={w:?} tiling={}",
                    dims.q_heads,
                    variant.unwrap_or("default")
                );
                compare_batch(&what, &dims, scale, w, &hs, &gpu.download(&out).unwrap());
            }
        }
    }
}

#[test]
fn ring_prefill_continues_a_ring_prefix_on_every_tiling() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("ring_prefill_continues_a_ring_prefix_on_every_tiling");
    let prefixes = [0usize, 3, 50, 200];
    let news = [17usize, 65, 1, 40];
    for (d, group, kv_heads) in [(64usize, 2usize, 2usize), (128, 8, 1), (256, 6, 1)] {
        let dims = attn(group * kv_heads, kv_heads, d);
        let scale = 1.0 / (d as f32).sqrt();
        let hs = histories(&mut rng, &dims, &prefixes, &news);
        let dc = DevChunk::new(&gpu, &dims, &hs);
        let up = |x: &[u16]| gpu.upload(x).unwrap();
        let variants = tilings(d);
        // Windows of 2 (one ring slot), shorter than some prefixes and chunks, longer than every history.
        for w in [2usize, 16, 33, 300] {
            let ring_len = hs.len() * kv_heads * (w - 1) * d;
            let (mut kr, mut vr) = (vec![bf16::NAN; ring_len], vec![bf16::NAN; ring_len]);
            for (b, h) in hs.iter().enumerate() {
                cpu_store(&dims, h, b, 0, h.prefix, None, w, &mut kr, &mut vr);
            }
            let (krd, vrd) = (up(&to_bits(&kr)), up(&to_bits(&vr)));
            for &variant in &variants {
                let mut out = dc.out(&gpu, &dims);
                gpu.attention_prefill_ring_with(
                    variant,
                    &dims,
                    hs.len(),
                    scale,
                    w,
                    &krd,
                    &vrd,
                    dc.chunk(),
                    &mut out,
                )
                .unwrap();
                let what = format!(
                    "ring prefill d={d} q_heads={} kv_heads={kv_heads} window={w} tiling={}",
                    dims.q_heads,
                    variant.unwrap_or("default")
                );
                compare_batch(
                    &what,
                    &dims,
                    scale,
                    Some(w),
                    &hs,
                    &gpu.download(&out).unwrap(),
                );
            }
        }
    }
}

/// Chunked prefill as the engine runs it: each round attends over the cache and then stores its chunk (paged
/// cache with no window and with a window; ring for a sliding window). Every round's rows are checked against the
/// CPU over the whole history, and after the last round the caches must equal, bit for bit, the CPU stores of
/// every token (including the NaN of the rows never written).
#[test]
fn chunked_prefill_with_stores_matches_one_prefill_of_the_whole_history() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng("chunked_prefill_with_stores_matches_one_prefill_of_the_whole_history");
    // Two sequences, three rounds of ragged chunks (a 1-token and a 0-token chunk among them).
    let chunks = [[40usize, 5], [1, 64], [77, 0]];
    let lens: Vec<usize> = (0..2).map(|b| chunks.iter().map(|c| c[b]).sum()).collect();
    for (d, group, kv_heads, page_size, window) in [
        (128usize, 4usize, 2usize, 16usize, None),
        (256, 6, 1, 9, Some(30usize)),
        (64, 2, 2, 8, Some(50)),
    ] {
        let dims = attn(group * kv_heads, kv_heads, d);
        let scale = 1.0 / (d as f32).sqrt();
        let whole: Vec<History> = lens
            .iter()
            .map(|&l| history(&mut rng, &dims, 0, l))
            .collect();
        let (table, max_pages, num_pages) = paged_layout(&mut rng, &whole, page_size);
        let cache_len = num_pages * kv_heads * page_size * d;
        let (mut kc, mut vc) = (vec![bf16::NAN; cache_len], vec![bf16::NAN; cache_len]);
        let mut kcd = gpu.upload(&to_bits(&kc)).unwrap();
        let mut vcd = gpu.upload(&to_bits(&vc)).unwrap();
        let table_d = gpu.upload(&table).unwrap();
        let pd = paged_dims(&dims, 2, page_size, num_pages, max_pages);
        let ring_w = window.unwrap_or(1);
        let ring_len = 2 * kv_heads * (ring_w - 1) * d;
        let (mut kr, mut vr) = (vec![bf16::NAN; ring_len], vec![bf16::NAN; ring_len]);
        let mut krd = gpu.upload(&to_bits(&kr)).unwrap();
        let mut vrd = gpu.upload(&to_bits(&vr)).unwrap();
        let (rq, rkv) = (dims.q_heads * d, kv_heads * d);
        let mut done = [0usize; 2];
        for (round, c) in chunks.iter().enumerate() {
            // This round's chunk of each sequence, with the rows before it as its prefix.
            let hs: Vec<History> = (0..2)
                .map(|b| {
                    let end = done[b] + c[b];
                    let cut = |x: &(Vec<u16>, Vec<f32>), r: usize| {
                        (x.0[..end * r].to_vec(), x.1[..end * r].to_vec())
                    };
                    History {
                        prefix: done[b],
                        new: c[b],
                        x: Inputs {
                            q: cut(&whole[b].x.q, rq),
                            k: cut(&whole[b].x.k, rkv),
                            v: cut(&whole[b].x.v, rkv),
                        },
                    }
                })
                .collect();
            let dc = DevChunk::new(&gpu, &dims, &hs);
            let what = format!("chunked d={d} window={window:?} round {round}");
            // Paged: attend over the prefix, then store the chunk.
            let chunk = dc.chunk();
            let mut out = dc.out(&gpu, &dims);
            gpu.attention_prefill_paged(&pd, scale, window, &kcd, &vcd, &table_d, chunk, &mut out)
                .unwrap();
            compare_batch(
                &format!("{what} paged"),
                &dims,
                scale,
                window,
                &hs,
                &gpu.download(&out).unwrap(),
            );
            gpu.attention_kv_store_paged(&pd, chunk, &table_d, &mut kcd, &mut vcd)
                .unwrap();
            // Ring (sliding layers): attend first (the store overwrites prefix slots), then store.
            if let Some(w) = window {
                let mut out = dc.out(&gpu, &dims);
                gpu.attention_prefill_ring(&dims, 2, scale, w, &krd, &vrd, chunk, &mut out)
                    .unwrap();
                compare_batch(
                    &format!("{what} ring"),
                    &dims,
                    scale,
                    window,
                    &hs,
                    &gpu.download(&out).unwrap(),
                );
                gpu.attention_kv_store_ring(&dims, 2, w, chunk, &mut krd, &mut vrd)
                    .unwrap();
            }
            for b in 0..2 {
                let t = &table[b * max_pages..(b + 1) * max_pages];
                cpu_store(
                    &dims,
                    &hs[b],
                    b,
                    done[b],
                    done[b] + c[b],
                    Some((t, page_size)),
                    0,
                    &mut kc,
                    &mut vc,
                );
                if window.is_some() {
                    cpu_store(
                        &dims,
                        &hs[b],
                        b,
                        done[b],
                        done[b] + c[b],
                        None,
                        ring_w,
                        &mut kr,
                        &mut vr,
                    );
                }
                done[b] += c[b];
            }
        }
        let check = |what: &str, got: Vec<u16>, want: &[bf16], row: usize| {
            for (i, (&g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    g == w.to_bits(),
                    "{what} d={d}: element {i} (row {}, element {}) is {g:#06x}, the CPU store gives {:#06x}",
                    i / row,
                    i % row,
                    w.to_bits()
                );
            }
        };
        check("paged k_cache", gpu.download(&kcd).unwrap(), &kc, d);
        check("paged v_cache", gpu.download(&vcd).unwrap(), &vc, d);
        if window.is_some() {
            check("k_ring", gpu.download(&krd).unwrap(), &kr, d);
            check("v_ring", gpu.download(&vrd).unwrap(), &vr, d);
        }
    }
}

#[test]
fn bad_cache_sizes_are_errors() {
    let Some(gpu) = gpu() else { return };
    let dims = attn(8, 2, 128);
    let (t, ps, pages, maxp) = (10usize, 16usize, 4usize, 2usize);
    let pd = paged_dims(&dims, 2, ps, pages, maxp);
    let buf = |n: usize| -> GpuBuffer<u16> { gpu.zeros(n).unwrap() };
    let (q, k, v) = (buf(t * 8 * 128), buf(t * 2 * 128), buf(t * 2 * 128));
    let mut out = buf(t * 8 * 128);
    let cache = pages * 2 * ps * 128;
    let (mut kc, mut vc) = (buf(cache), buf(cache));
    let table = gpu.upload(&[0u32, 1, 2, 3]).unwrap();
    let pre = gpu.upload(&[3u32, 20]).unwrap();
    let cu = gpu.upload(&[0u32, 4, 10]).unwrap();
    let msg = |r: Result<(), kernels::KernelError>| r.expect_err("accepted").to_string();
    let chunk_of = |q, k, v, pre| PrefillChunk {
        q,
        k,
        v,
        cu_seqlens: &cu,
        prefix_lens: pre,
        total: t,
        max_seqlen: 6,
    };
    let chunk = chunk_of(&q, &k, &v, &pre);
    let short = buf(cache - 1);
    assert!(
        msg(gpu.attention_prefill_paged(&pd, 0.1, None, &short, &vc, &table, chunk, &mut out))
            .contains("k_cache")
    );
    let table3 = gpu.upload(&[0u32, 1, 2]).unwrap();
    assert!(
        msg(gpu.attention_prefill_paged(&pd, 0.1, None, &kc, &vc, &table3, chunk, &mut out))
            .contains("block_table")
    );
    let pre1 = gpu.upload(&[3u32]).unwrap();
    let chunk1 = chunk_of(&q, &k, &v, &pre1);
    assert!(
        msg(gpu.attention_prefill_paged(&pd, 0.1, None, &kc, &vc, &table, chunk1, &mut out))
            .contains("prefix_lens")
    );
    let huge = paged_dims(&dims, 2, 1 << 20, pages, 1 << 11);
    assert!(
        msg(gpu.attention_prefill_paged(&huge, 0.1, None, &kc, &vc, &table, chunk, &mut out))
            .contains("2^30")
    );
    // A pool of more than 2^31 rows (2^27 pages x 2 heads x 16 slots): past the kernels' 32-bit row codes.
    let deep = paged_dims(&dims, 2, ps, 1 << 27, maxp);
    assert!(
        msg(gpu.attention_prefill_paged(&deep, 0.1, None, &kc, &vc, &table, chunk, &mut out))
            .contains("2^31 rows")
    );
    let zero = paged_dims(&dims, 2, 0, pages, maxp);
    assert!(
        msg(gpu.attention_prefill_paged(&zero, 0.1, None, &kc, &vc, &table, chunk, &mut out))
            .contains("positive")
    );
    assert!(
        msg(gpu.attention_prefill_paged(&pd, 0.1, Some(0), &kc, &vc, &table, chunk, &mut out))
            .contains("at least 1")
    );
    // Rings: [seqs, kv_heads, window - 1, d].
    let ring = buf(2 * 2 * 7 * 128);
    assert!(
        msg(gpu.attention_prefill_ring(&dims, 2, 0.1, 9, &ring, &ring, chunk, &mut out))
            .contains("k_ring")
    );
    assert!(
        msg(gpu.attention_prefill_ring(&dims, 2, 0.1, 0, &ring, &ring, chunk, &mut out))
            .contains("window")
    );
    let (mut r1, mut r2) = (buf(2 * 2 * 7 * 128), buf(2 * 2 * 7 * 128));
    assert!(
        msg(gpu.attention_kv_store_ring(&dims, 2, 9, chunk, &mut r1, &mut r2)).contains("k_ring")
    );
    // v the size of q.
    let chunk_qv = chunk_of(&q, &k, &q, &pre);
    assert!(
        msg(gpu.attention_kv_store_paged(&pd, chunk_qv, &table, &mut kc, &mut vc))
            .contains("v has")
    );
    let d12 = AttnDims {
        head_dim: 12,
        ..dims
    };
    assert!(
        msg(gpu.attention_kv_store_ring(&d12, 2, 8, chunk, &mut r1, &mut r2))
            .contains("multiple of 8")
    );
    // The right sizes are accepted; zero inputs give zero outputs (the cache is zero too).
    gpu.write(&mut out, &vec![NAN_BF16; t * 8 * 128]).unwrap();
    gpu.attention_prefill_paged(&pd, 0.1, Some(4), &kc, &vc, &table, chunk, &mut out)
        .unwrap();
    gpu.attention_prefill_ring(&dims, 2, 0.1, 8, &ring, &ring, chunk, &mut out)
        .unwrap();
    gpu.attention_kv_store_paged(&pd, chunk, &table, &mut kc, &mut vc)
        .unwrap();
    gpu.attention_kv_store_ring(&dims, 2, 8, chunk, &mut r1, &mut r2)
        .unwrap();
    assert!(
        gpu.download(&out).unwrap().iter().all(|&b| b == 0),
        "zero inputs give zero outputs"
    );
}
