//! The classification losses a scoring graph computes over a model's logits:
//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (the latter is the former on the
//! log-softmax over the class axis). Computed in f64 and rounded once.

use super::{float_tensor, int_values, require_float, Ctx, Res};
use crate::tensor::Tensor;

/// Input `[N, C, d1..dk]` (log-probabilities, or scores for the cross entropy), target
/// `[N, d1..dk]` of class indices. Each sample's weight is `weight[target]` (1 without a weight
/// input), 0 where the target is `ignore_index`; its loss is `-weight · input[n, target, d..]`.
/// `reduction` "none" keeps the per-sample losses, "sum" adds them, "mean" (the default) divides
/// that sum by the sum of the weights.
pub(super) fn negative_log_likelihood(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    require_float(x, "input")?;
    let loss = weighted_loss(cx, x, &x.to_f64_vec())?;
    Ok(vec![loss])
}

/// SoftmaxCrossEntropyLoss: the loss of [`negative_log_likelihood`] on `log_softmax(scores)`
/// over axis 1, and optionally those log-probabilities.
pub(super) fn softmax_cross_entropy(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "scores")?;
    require_float(x, "scores")?;
    if x.rank() < 2 {
        bail!("scores must be [N, C, ...], got {:?}", x.shape);
    }
    let (classes, inner) = (x.shape[1], x.shape[2..].iter().product::<usize>());
    let mut log_prob = x.to_f64_vec();
    for block in log_prob.chunks_mut((classes * inner).max(1)) {
        for i in 0..inner {
            let at = |c: usize| c * inner + i;
            let max = (0..classes).map(|c| block[at(c)]).fold(f64::NEG_INFINITY, f64::max);
            let log_sum = (0..classes).map(|c| (block[at(c)] - max).exp()).sum::<f64>().ln();
            (0..classes).for_each(|c| block[at(c)] -= max + log_sum);
        }
    }
    let loss = weighted_loss(cx, x, &log_prob)?;
    Ok(vec![loss, float_tensor(x.dtype, x.shape.clone(), log_prob)])
}

/// The (reduced) weighted loss of log-probabilities `log_prob` laid out as `x`; the target and
/// weight are inputs 1 and 2.
fn weighted_loss(cx: &Ctx, x: &Tensor, log_prob: &[f64]) -> Res<Tensor> {
    let target = cx.input(1, "target")?;
    let labels = int_values(target, "target")?;
    if x.rank() < 2 || target.shape.first() != x.shape.first() || target.shape[1..] != x.shape[2..] {
        bail!("input {:?} and target {:?} must be [N, C, d..] and [N, d..]", x.shape, target.shape);
    }
    let (classes, inner) = (x.shape[1], x.shape[2..].iter().product::<usize>());
    let weights = match cx.opt(2) {
        Some(w) if w.shape != [classes] || w.dtype != x.dtype => {
            bail!("weight must be [{classes}] of {}, got {} {:?}", x.dtype, w.dtype, w.shape)
        }
        Some(w) => Some(w.to_f64_vec()),
        None => None,
    };
    let ignore = cx.attrs().int("ignore_index")?;
    let (mut losses, mut weight_sum) = (Vec::with_capacity(labels.len()), 0.0);
    for (s, &t) in labels.iter().enumerate() {
        if ignore == Some(t) {
            losses.push(0.0);
            continue;
        }
        if !(0..classes as i64).contains(&t) {
            bail!("target {t} is not a class in 0..{classes} (nor ignore_index)");
        }
        let w = weights.as_ref().map_or(1.0, |w| w[t as usize]);
        let (n, i) = (s / inner.max(1), s % inner.max(1));
        losses.push(-w * log_prob[(n * classes + t as usize) * inner + i]);
        weight_sum += w;
    }
    Ok(match cx.attrs().str("reduction")?.unwrap_or("mean") {
        "none" => float_tensor(x.dtype, target.shape.clone(), losses),
        "sum" => float_tensor(x.dtype, vec![], vec![losses.iter().sum()]),
        "mean" => float_tensor(x.dtype, vec![], vec![losses.iter().sum::<f64>() / weight_sum]),
        other => bail!("unknown reduction `{other}`"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;

    #[test]
    fn weighted_mean_divides_by_the_weights_of_the_samples_not_ignored() {
        // N=2, C=3, no extra dims; targets 2 and 0 (the second ignored below).
        let x = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (target, weight) = (i64t(&[2], &[2, 0]), f32t(&[3], &[0.5, 1.0, 2.0]));
        let nll = |a: &[(&str, Attr)], w: Option<&crate::Tensor>| {
            f32s(&run("NegativeLogLikelihoodLoss", a, &[Some(&x), Some(&target), w], 1).unwrap()[0])
        };
        let none = [("reduction", Attr::Str("none".into()))];
        assert_eq!(nll(&none, None), vec![-3.0, -4.0]);
        // (-3·2 - 4·0.5) / (2 + 0.5)
        assert_eq!(nll(&[], Some(&weight)), vec![-3.2]);
        // Ignoring class 0 leaves only the first sample: -3·2 / 2.
        assert_eq!(nll(&[("ignore_index", Attr::Int(0))], Some(&weight)), vec![-3.0]);
        let bad = i64t(&[2], &[3, 0]);
        let e = err_msg(run("NegativeLogLikelihoodLoss", &[], &[Some(&x), Some(&bad)], 1));
        assert!(e.contains("target 3"), "{e}");
    }

    #[test]
    fn cross_entropy_is_the_loss_of_the_log_softmax_over_classes() {
        // Two equal scores: log-probabilities ln(1/2) each.
        let x = f32t(&[1, 2], &[7.0, 7.0]);
        let y = run("SoftmaxCrossEntropyLoss", &[], &[Some(&x), Some(&i64t(&[1], &[1]))], 2).unwrap();
        assert_close(&f32s(&y[0]), &[std::f32::consts::LN_2], 1e-6);
        assert_close(&f32s(&y[1]), &[-std::f32::consts::LN_2; 2], 1e-6);
    }
}
