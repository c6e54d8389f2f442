//! MoE routing (`kernels::moe`): the router against an f64 softmax and top-k on fresh random logits (the seed is
//! printed), ties to the lower expert id, the dispatch's grouping, and a whole sparse layer (route, dispatch, one
//! batched linear per expert, combine) against the per-token sum it stands for, on ragged sizes. Then the refusals.

use kernels::backend::Weight;
use kernels::moe::{combine, combine_rows, dispatch, dispatch_ids, gather_rows, route};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn rng(what: &str) -> ChaCha8Rng {
    let seed: u64 = rand::thread_rng().gen();
    eprintln!("{what}: seed {seed}");
    ChaCha8Rng::seed_from_u64(seed)
}

#[test]
fn routing_is_softmax_then_top_k() {
    let mut r = rng("moe route");
    for (tokens, experts, top_k, renorm) in [(7, 10, 3, true), (5, 64, 8, false), (1, 2, 2, true)] {
        // Each row a shuffle of distinct values 0.1 apart, so the f32 and f64 orders cannot differ by a near-tie.
        let logits: Vec<f32> = (0..tokens)
            .flat_map(|_| {
                let mut v: Vec<f32> = (0..experts).map(|i| i as f32 * 0.1 - 3.0).collect();
                v.shuffle(&mut r);
                v
            })
            .collect();
        let got = route(&logits, experts, top_k, renorm).unwrap();
        assert_eq!(
            (got.tokens(), got.top_k(), got.experts()),
            (tokens, top_k, experts)
        );
        let (want_ids, want_w) =
            kernels::reference::moe::route(&logits, experts, top_k, renorm).unwrap();
        for (p, (&want, &w)) in want_ids.iter().zip(&want_w).enumerate() {
            let (t, k) = (p / top_k, p % top_k);
            assert_eq!(got.ids()[p], want, "token {t} slot {k}");
            assert!(
                (f64::from(got.weights()[p]) - w).abs() <= 1e-6 * (1.0 + w),
                "token {t} slot {k}: weight {} want {w}",
                got.weights()[p]
            );
        }
        assert_eq!(want_ids.len(), tokens * top_k);
    }
    // Equal logits: the lower ids, in order.
    let even = route(&[1.0; 6], 6, 3, true).unwrap();
    assert_eq!(even.ids(), &[0, 1, 2]);
    // The reference refuses what it cannot route, rather than panicking.
    for (len, experts, top_k) in [(6, 0, 1), (6, 6, 0), (6, 6, 7), (7, 6, 2)] {
        assert!(
            kernels::reference::moe::route(&vec![0.0; len], experts, top_k, true).is_err(),
            "reference route of {len} logits, {experts} experts, top {top_k}"
        );
    }
}

#[test]
fn a_sparse_layer_equals_its_per_token_sum() {
    let mut r = rng("moe layer");
    let (tokens, experts, top_k, hidden, out_dim) = (11, 6, 2, 13, 9);
    let x: Vec<f32> = (0..tokens * hidden)
        .map(|_| r.gen_range(-1.0..1.0))
        .collect();
    let logits: Vec<f32> = (0..tokens * experts)
        .map(|_| r.gen_range(-3.0..3.0))
        .collect();
    let ws: Vec<Vec<f32>> = (0..experts)
        .map(|_| {
            (0..out_dim * hidden)
                .map(|_| r.gen_range(-0.5..0.5))
                .collect()
        })
        .collect();
    let routing = route(&logits, experts, top_k, true).unwrap();
    let d = dispatch(&routing);
    assert_eq!(d.rows(), tokens * top_k);
    // Every (token, expert) pair appears once, tokens ascending within an expert.
    for e in 0..experts {
        let ts = d.tokens(e);
        assert!(ts.windows(2).all(|w| w[0] < w[1]), "expert {e}: {ts:?}");
        for &t in ts {
            let t = t as usize;
            assert!(routing.ids()[t * top_k..(t + 1) * top_k].contains(&(e as u32)));
        }
    }
    assert!(d.tokens(experts).is_empty());
    // The same grouping from the ids alone (what a backend's router gives back), and its token list and pair rows
    // say the same as the per-expert view.
    let from_ids = dispatch_ids(routing.ids(), experts, top_k).unwrap();
    assert_eq!(from_ids, d);
    let pair_rows = d.pair_rows().unwrap();
    for (p, &row) in pair_rows.iter().enumerate() {
        assert_eq!(d.all_tokens()[row as usize] as usize, p / top_k, "pair {p}");
    }
    // Each expert once over its rows.
    let mut expert_out = vec![f32::NAN; d.rows() * out_dim];
    for (e, w) in ws.iter().enumerate() {
        let ts = d.tokens(e);
        if ts.is_empty() {
            continue;
        }
        let rows: Vec<f32> = ts
            .iter()
            .flat_map(|&t| x[t as usize * hidden..(t as usize + 1) * hidden].to_vec())
            .collect();
        let lin = Weight::f32(w.clone(), out_dim, hidden).unwrap();
        let at = d.offset(e) * out_dim;
        lin.linear(
            &rows,
            ts.len(),
            &mut expert_out[at..at + ts.len() * out_dim],
        )
        .unwrap();
    }
    let mut got = vec![f32::NAN; tokens * out_dim];
    combine(&routing, &d, &expert_out, out_dim, &mut got).unwrap();
    for t in 0..tokens {
        for o in 0..out_dim {
            let want: f64 = (0..top_k)
                .map(|k| {
                    let p = t * top_k + k;
                    let w = &ws[routing.ids()[p] as usize][o * hidden..(o + 1) * hidden];
                    let dot: f64 = w
                        .iter()
                        .zip(&x[t * hidden..(t + 1) * hidden])
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    f64::from(routing.weights()[p]) * dot
                })
                .sum();
            let g = f64::from(got[t * out_dim + o]);
            assert!(
                (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "token {t} out {o}: {g} want {want}"
            );
        }
    }
}

#[test]
fn bad_routing_inputs_are_refused() {
    let msg = |r: Result<kernels::moe::Routing, kernels::KernelError>| r.unwrap_err().to_string();
    assert!(msg(route(&[0.0; 6], 0, 1, true)).contains("experts"));
    assert!(msg(route(&[0.0; 6], 3, 0, true)).contains("top_k"));
    assert!(msg(route(&[0.0; 6], 3, 4, true)).contains("top_k"));
    assert!(msg(route(&[0.0; 7], 3, 1, true)).contains("whole rows"));
    assert!(msg(route(&[0.0, f32::NAN, 0.0], 3, 1, true)).contains("logit 1"));
    let r = route(&[1.0, 0.0, 0.0, 1.0], 2, 1, true).unwrap();
    let d = dispatch(&r);
    let mut out = vec![0.0; 2 * 3];
    assert!(combine(&r, &d, &[0.0; 5], 3, &mut out).is_err());
    assert!(combine(&r, &d, &[0.0; 6], 3, &mut out[..5]).is_err());
    assert!(combine(&r, &d, &[0.0; 6], 0, &mut out).is_err());

    let err = |r: Result<(), kernels::KernelError>| r.unwrap_err().to_string();
    let derr = |r: Result<kernels::moe::Dispatch, kernels::KernelError>| r.unwrap_err().to_string();
    assert!(derr(dispatch_ids(&[0, 3], 3, 1)).contains("past the 3 experts"));
    assert!(derr(dispatch_ids(&[0, 1, 2], 3, 2)).contains("whole tokens"));
    assert!(derr(dispatch_ids(&[0], 0, 1)).contains("experts"));
    assert!(derr(dispatch_ids(&[0], 3, 0)).contains("top_k"));
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let mut two = [f32::NAN; 2];
    assert!(err(gather_rows(&x, 2, &[2], &mut two)).contains("past the 2 rows"));
    assert!(err(gather_rows(&x, 2, &[0, 1], &mut two)).contains("out has 2"));
    gather_rows(&x, 2, &[1], &mut two).unwrap();
    assert_eq!(two, [3.0, 4.0]);
    let mut out2 = [f32::NAN; 2];
    assert!(err(combine_rows(&x, 2, &[1.0], 1, &[2], &mut out2)).contains("past the 2 expert rows"));
    assert!(err(combine_rows(&x, 2, &[1.0, 1.0], 1, &[0], &mut out2)).contains("weights"));
    assert_eq!(
        out2[0].to_bits(),
        f32::NAN.to_bits(),
        "a refused combine writes nothing"
    );
}
