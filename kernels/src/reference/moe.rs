//! The MoE router's reference ([`crate::moe::route`]): an f64 softmax per token, the experts ordered by probability
//! (ties: the lower id), the top `k` kept.

use crate::moe::check_route_shape;
use crate::KernelError;

/// Per token (rows of `experts` logits), the `top_k` chosen experts in order and their probabilities in f64,
/// divided by the chosen ones' sum when `renorm`. Both `[tokens, top_k]`. Needs `1 <= top_k <= experts` and
/// whole rows.
pub fn route(
    logits: &[f32],
    experts: usize,
    top_k: usize,
    renorm: bool,
) -> Result<(Vec<u32>, Vec<f64>), KernelError> {
    const OP: &str = "reference::moe::route";
    check_route_shape(OP, logits.len(), experts, top_k)?;
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in logits.chunks_exact(experts) {
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let e: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
        let chosen = &order[..top_k];
        let total: f64 = chosen.iter().map(|&i| e[i] / sum).sum();
        for &i in chosen {
            ids.push(i as u32);
            weights.push(e[i] / sum / if renorm { total } else { 1.0 });
        }
    }
    Ok((ids, weights))
}
